/* SPDX-License-Identifier: MIT */
/*
 * liballot agents against a Raft cluster of three real allotd members on
 * loopback (docs/operations.md, "Agents in a cluster"), under load:
 *
 * - each agent is given ONE member as its seed, a different one each,
 *   and finds the leader from it (NOT_LEADER), learning every member;
 * - the leader is SIGKILLed: the agents follow the new leader (a higher
 *   epoch), and a caller well under its quota sees no denial through the
 *   failover;
 * - the killed member restarts, as a follower on its own log;
 * - the new leader is SIGSTOPped until another is elected, then
 *   continued: the agents follow the third leader, and nothing the
 *   stopped one might still say is applied (every agent's epoch only
 *   increases, sampled; a Reply of a lower epoch would be counted in
 *   stale_epoch and dropped: tests/test_follow.c takes that path on cue);
 * - all along, a sampler logs every agent's (time, key, epoch, allowance)
 *   to a file in the test directory every 10 ms, and the allowances of
 *   the loaded quota summed over the agents never exceed R at any sample
 *   (the documented bound: a new leader grants within what the agents
 *   hold while the old grants run out, docs/operations.md "Taking over").
 *
 * And membership at run time, under the same load and sampler, with no
 * agent restarted (`members_change_under_load`): a fourth member joins
 * (allotctl member add, `--join`) and becomes a voter, the agents learn
 * it; a follower is removed and stopped; then the leader itself is
 * removed with ONE `allotctl member remove` on its own admin socket (it
 * hands leadership over and the new leader removes it; the call exits 0
 * once done, and the survivors' member lists lack it) and stopped. Each
 * allotctl call runs in the background while the sampler goes on. The
 * calm caller sees no denial and Σ stays within R throughout.
 *
 * Every wait is bounded in time and every loop in count.
 */
#include <check.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <allot/allot.h>

#include "allotd.h"
#include "proc.h"
#include "runner.h"

#define NM 3 /* members at the start */
#define MAXM 5 /* member slots (ids 1..MAXM) */
#define NA 3 /* agents */
#define ELECTION_MS 500
#define R_HOT 300.0

static const char *const CFG = "quotas:\n"
                               "  default: {tokens_per_second: 50, burst: "
                               "50}\n"
                               "  callers:\n"
                               "    - identity: hot\n"
                               "      tokens_per_second: 300\n"
                               "      burst: 300\n"
                               "    - identity: calm\n"
                               "      tokens_per_second: 600\n"
                               "      burst: 600\n";

static char dir[64];
/* Member i's allotd (tests/support/allotd.h), Raft id i + 1. */
static pc_member ms[MAXM];

static void
member_init(int i)
{
	pc_member_init(&ms[i], dir, (uint64_t) i + 1, CFG);
}

/* Start member i: one of the NM the cluster started with (seeded with
 * them), or a later one that waits to be added (`--join`). */
static void
member_start(int i)
{
	const char *extra[] = { "--interval-ms", "100", NULL };
	pc_member_start(&ms[i], ms, i < NM ? NM : 0, ELECTION_MS, extra);
}

/* The one serving member among those up, within `timeout_ms`; -1: none. */
static int
wait_leader(int timeout_ms)
{
	return pc_member_serving(ms, MAXM, timeout_ms);
}

/* ---- agents under load ---- */

typedef struct agent {
	allot_agent *a;
	allot_key *hot, *calm;
	pthread_t th;
	_Atomic uint64_t calm_denied;
	_Atomic uint64_t calm_allowed;
	_Atomic uint64_t hot_allowed;
	uint64_t last_epoch; /* sampler only */
} agent;

static agent as[NA];
static _Atomic bool load_stop;

/* About 500/s on "hot" (over its share: the allocation is contended) and
 * 25/s on "calm" (a twentieth of its share: never denied). */
static void *
load_main(void *arg)
{
	agent *g = arg;
	for (uint64_t i = 0; i < 1000000 && !atomic_load(&load_stop); i++) {
		allot_decision d;
		allot_acquire(g->a, g->hot, 1, &d);
		if (d.allowed)
			atomic_fetch_add(&g->hot_allowed, 1);
		if (i % 20 == 0) {
			allot_acquire(g->a, g->calm, 1, &d);
			atomic_fetch_add(
			    d.allowed ? &g->calm_allowed : &g->calm_denied, 1);
		}
		pc_sleep_ms(2);
	}
	return NULL;
}

static void
agent_start(agent *g, const char *seed, const char *replica)
{
	char err[256];
	allot_config *cfg;
	ck_assert_int_eq(
	    allot_config_parse("q", CFG, strlen(CFG), err, sizeof err, &cfg),
	    ALLOT_OK);
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.coordinator = seed;
	o.service = "svc";
	o.replica_id = replica;
	o.sync_interval_ms = 100;
	o.initial_replicas = NA;
	o.reconnect_min_ms = 50;
	o.reconnect_max_ms = 500;
	ck_assert_int_eq(allot_agent_create(cfg, &o, &g->a), ALLOT_OK);
	allot_config_free(cfg);
	ck_assert_int_eq(
	    allot_key_resolve(g->a, "hot", "/x", &g->hot), ALLOT_OK);
	ck_assert_int_eq(
	    allot_key_resolve(g->a, "calm", "/x", &g->calm), ALLOT_OK);
}

static FILE *samples;
static uint64_t t0;
/* The largest sum of "hot" allowances sampled, and when: asserted within
 * R at the end, after the rest (so that a failure reports everything). */
static double worst_sum;
static uint64_t worst_at;

/* One sample: every agent's (time, key, epoch, allowance) logged; the
 * allowances of "hot" summed over agents within R; each agent's epoch
 * never lower than before. Returns the lowest epoch among the agents. */
static uint64_t
sample(void)
{
	double sum = 0;
	uint64_t low = UINT64_MAX;
	uint64_t t = pc_now_ms() - t0;
	for (int i = 0; i < NA; i++) {
		allot_key_stats ks, kc;
		allot_sync_stats ss;
		allot_key_stats_get(as[i].a, as[i].hot, &ks);
		allot_key_stats_get(as[i].a, as[i].calm, &kc);
		allot_sync_stats_get(as[i].a, &ss);
		fprintf(samples,
		    "%" PRIu64 " agent%d hot %" PRIu64 " %.3f\n"
		    "%" PRIu64 " agent%d calm %" PRIu64 " %.3f %.3f\n",
		    t, i, ss.leader_epoch, ks.rate, t, i, ss.leader_epoch,
		    kc.rate, kc.limit);
		ck_assert_msg(ss.leader_epoch >= as[i].last_epoch,
		    "agent %d: epoch %" PRIu64 " after %" PRIu64, i,
		    ss.leader_epoch, as[i].last_epoch);
		as[i].last_epoch = ss.leader_epoch;
		sum += ks.rate;
		if (ss.leader_epoch < low)
			low = ss.leader_epoch;
	}
	if (sum > worst_sum) {
		worst_sum = sum;
		worst_at = t;
	}
	return low;
}

/* Sample every 10 ms for `ms` milliseconds. */
static void
sample_for(int ms_)
{
	uint64_t end = pc_now_ms() + (uint64_t) ms_;
	for (int i = 0; i < 100000 && pc_now_ms() < end; i++) {
		sample();
		pc_sleep_ms(10);
	}
}

/* Sample until every agent synced with a leader of epoch above `above`
 * and that leader answered for each of its keys; returns that epoch. */
static uint64_t
sample_until_followed(uint64_t above, int timeout_ms)
{
	uint64_t end = pc_now_ms() + (uint64_t) timeout_ms;
	for (int i = 0; i < 100000; i++) {
		uint64_t low = sample();
		bool all = low > above;
		for (int k = 0; k < NA && all; k++) {
			allot_sync_stats ss;
			allot_sync_stats_get(as[k].a, &ss);
			all = ss.connected && ss.keys_unconfirmed == 0 &&
			    ss.syncs_ok > 0;
		}
		if (all)
			return low;
		ck_assert_msg(pc_now_ms() < end,
		    "agents not all on a leader above epoch %" PRIu64
		    " after %d ms",
		    above, timeout_ms);
		pc_sleep_ms(10);
	}
	ck_abort_msg("sampling did not end");
	return 0;
}

/* A new cluster of NM members, the sampler's file, and NA agents under
 * load, agent i seeded with member i only. Returns the leader's index. */
static int
start_all(void)
{
	pc_mkdtemp(dir, sizeof dir, "/tmp/allot-cluster");
	memset(ms, 0, sizeof ms);
	for (int i = 0; i < NM; i++)
		member_init(i);
	for (int i = 0; i < NM; i++)
		member_start(i);
	int l1 = wait_leader(15000);
	ck_assert_int_ge(l1, 0);
	char path[128];
	snprintf(path, sizeof path, "%s/samples.txt", dir);
	samples = fopen(path, "w");
	ck_assert_ptr_nonnull(samples);
	setvbuf(samples, NULL, _IOLBF, 0); /* whole rows even on a failure */
	t0 = pc_now_ms();
	worst_sum = 0;
	memset(as, 0, sizeof as);
	atomic_store(&load_stop, false);
	const char *names[NA] = { "r1", "r2", "r3" };
	for (int i = 0; i < NA; i++)
		agent_start(&as[i], ms[i].c.url, names[i]);
	for (int i = 0; i < NA; i++)
		ck_assert_int_eq(
		    pthread_create(&as[i].th, NULL, load_main, &as[i]), 0);
	return l1;
}

/* Stops the load and the agents, then asserts what held all along: the
 * calm caller never denied, the hot caller's allowances within R at
 * every sample. Stops the members and removes the directory. */
static void
finish_all(const char *what)
{
	atomic_store(&load_stop, true);
	uint64_t calm_denied = 0, calm_allowed = 0, hot_allowed = 0;
	for (int i = 0; i < NA; i++) {
		pthread_join(as[i].th, NULL);
		allot_sync_stats ss;
		allot_sync_stats_get(as[i].a, &ss);
		calm_denied += atomic_load(&as[i].calm_denied);
		calm_allowed += atomic_load(&as[i].calm_allowed);
		hot_allowed += atomic_load(&as[i].hot_allowed);
		fprintf(stderr,
		    "%s: agent %d switches %" PRIu64 " not_leader %" PRIu64
		    " stale_epoch %" PRIu64 " fallback_enters %" PRIu64
		    " members %" PRIu32 "\n",
		    what, i, ss.leader_switches, ss.not_leader, ss.stale_epoch,
		    ss.fallback_enters, ss.members);
		allot_agent_destroy(as[i].a);
	}
	fclose(samples);
	ck_assert_uint_gt(calm_allowed, 100);
	ck_assert_uint_gt(hot_allowed, 100);
	/* Under quota through every change: not one denial. */
	ck_assert_uint_eq(calm_denied, 0);
	fprintf(stderr,
	    "%s: at most %.1f of R = %.0f held (t = %" PRIu64 " ms)\n", what,
	    worst_sum, R_HOT, worst_at);
	ck_assert_msg(worst_sum <= R_HOT * (1 + 1e-9),
	    "t=%" PRIu64 " ms: agents held %.3f tokens/s of a %.0f quota (%s)",
	    worst_at, worst_sum, R_HOT, dir);
	for (int i = 0; i < MAXM; i++)
		if (ms[i].c.dir[0] != '\0')
			pc_coord_done(&ms[i].c, 5000);
	pc_rm_rf(dir);
}

/* `allotctl member ARGS` on `admin`, in a child, sampling all the while;
 * its exit status (its output goes to the test log). */
static int
ctl_sampled(const char *admin, const char *args)
{
	char cmd[1024];
	snprintf(cmd, sizeof cmd, "'%s' member %s --admin %s",
	    pc_program("tools/allotctl"), args, admin);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		execl("/bin/sh", "sh", "-c", cmd, (char *) NULL);
		_exit(127);
	}
	int st = 0;
	uint64_t until = pc_now_ms() + 30000;
	while (waitpid(pid, &st, WNOHANG) == 0) {
		if (pc_now_ms() > until) {
			kill(pid, SIGKILL);
			(void) waitpid(pid, &st, 0);
			ck_abort_msg(
			    "allotctl member %s: still running", args);
		}
		sample_for(10);
	}
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Member i leaves the cluster: ONE allotctl member remove on the
 * leader's admin socket, which exits 0 once the removal is done, the
 * leader's own included. Returns how long the call took. */
static uint64_t
member_remove(int i)
{
	char args[64];
	snprintf(args, sizeof args, "remove %d", i + 1);
	int l = wait_leader(5000);
	ck_assert_int_ge(l, 0);
	uint64_t start = pc_now_ms();
	int rc = ctl_sampled(ms[l].c.sock, args);
	ck_assert_msg(rc == 0, "allotctl member %s on member %d: exit %d",
	    args, l + 1, rc);
	return pc_now_ms() - start;
}

/* Sample until no live member but `i` lists member `i` (`i` itself
 * never hears of its removal: libraft sends a removed member nothing). */
static void
sample_until_gone(int i, int timeout_ms)
{
	uint64_t until = pc_now_ms() + (uint64_t) timeout_ms;
	for (;;) {
		bool gone = true;
		for (int k = 0; k < MAXM && gone; k++)
			if (k != i && ms[k].c.pid > 0 && ms[k].up)
				gone = !pc_member_listed(
				    ms[k].c.sock, (uint64_t) i + 1);
		if (gone)
			return;
		ck_assert_msg(pc_now_ms() < until,
		    "member %d is still listed after %d ms", i + 1,
		    timeout_ms);
		sample_for(20);
	}
}

START_TEST(agents_follow_the_leader)
{
	int l1 = start_all();
	/* Each agent knows one member: two of them a follower. */
	uint64_t e1 = sample_until_followed(0, 10000);
	for (int i = 0; i < NA; i++) {
		allot_sync_stats ss;
		allot_sync_stats_get(as[i].a, &ss);
		ck_assert_uint_eq(ss.members, NM);
		if (i != l1)
			ck_assert_uint_ge(ss.not_leader, 1);
	}
	sample_for(1000);

	/* SIGKILL the leader: the agents follow the new one. */
	uint64_t killed_at = pc_now_ms();
	kill(ms[l1].c.pid, SIGKILL);
	pc_allotd_stop(ms[l1].c.pid, 5000);
	ms[l1].c.pid = 0;
	ms[l1].up = false;
	uint64_t e2 = sample_until_followed(e1, 15000);
	fprintf(stderr,
	    "cluster: leader killed, agents on epoch %" PRIu64
	    " after %" PRIu64 " ms\n",
	    e2, pc_now_ms() - killed_at);
	int l2 = wait_leader(5000);
	ck_assert_int_ge(l2, 0);
	ck_assert_int_ne(l2, l1);
	/* The killed member comes back, as a follower, on its own log. */
	member_start(l1);
	sample_for(1500);
	ck_assert_int_eq(wait_leader(1000), l2);

	/* SIGSTOP the new leader until the third member leads, then let
	 * it run again: nothing from it is applied any more. */
	kill(ms[l2].c.pid, SIGSTOP);
	ms[l2].up = false;
	uint64_t e3 = sample_until_followed(e2, 15000);
	kill(ms[l2].c.pid, SIGCONT);
	ms[l2].up = true;
	sample_for(2000);
	int l3 = wait_leader(5000);
	ck_assert_int_ge(l3, 0);
	ck_assert_int_ne(l3, l2);
	for (int i = 0; i < NA; i++) {
		allot_sync_stats ss;
		allot_sync_stats_get(as[i].a, &ss);
		ck_assert_uint_ge(ss.leader_epoch, e3);
		ck_assert_uint_ge(ss.leader_switches, 2);
	}
	finish_all("cluster");
}
END_TEST

START_TEST(members_change_under_load)
{
	int l = start_all();
	uint64_t e1 = sample_until_followed(0, 10000);
	sample_for(500);

	/* A fourth member joins and becomes a voter; every agent learns it
	 * from the leader's answers. */
	member_init(NM);
	member_start(NM);
	char args[256];
	snprintf(args, sizeof args, "add %d %s %s", NM + 1, ms[NM].raftaddr,
	    ms[NM].c.url);
	ck_assert_int_eq(pc_ctl_member(ms[l].c.sock, args), 0);
	uint64_t until = pc_now_ms() + 15000;
	while (
	    !pc_member_is_voter(ms[NM].c.sock, NM + 1) && pc_now_ms() < until)
		sample_for(100);
	ck_assert(pc_member_is_voter(ms[NM].c.sock, NM + 1));
	bool learnt = false;
	until = pc_now_ms() + 5000;
	while (!learnt && pc_now_ms() < until) {
		learnt = true;
		for (int i = 0; i < NA; i++) {
			allot_sync_stats ss;
			allot_sync_stats_get(as[i].a, &ss);
			learnt &= ss.members == NM + 1;
		}
		sample_for(50);
	}
	ck_assert_msg(learnt, "the agents did not learn the new member");

	/* A follower leaves, then stops. */
	int f = (l + 1) % NM;
	(void) member_remove(f);
	sample_until_gone(f, 5000);
	sample_for(1000);
	pc_allotd_stop(ms[f].c.pid, 5000);
	ms[f].c.pid = 0;
	ms[f].up = false;
	sample_for(1000);
	ck_assert_int_eq(wait_leader(1000), l);

	/* The leader leaves with one call: it hands leadership over, the
	 * new leader removes it, the agents follow a higher epoch, then it
	 * stops. */
	uint64_t t_call = pc_now_ms();
	uint64_t call_ms = member_remove(l);
	sample_until_gone(l, 5000);
	uint64_t gone_ms = pc_now_ms() - t_call;
	uint64_t e2 = sample_until_followed(e1, 15000);
	int l2 = wait_leader(5000);
	ck_assert_int_ge(l2, 0);
	ck_assert_int_ne(l2, l);
	pc_allotd_stop(ms[l].c.pid, 5000);
	ms[l].c.pid = 0;
	ms[l].up = false;
	sample_for(2000);
	ck_assert_int_eq(wait_leader(1000), l2);
	fprintf(stderr,
	    "members: 4th added, member %d and leader %d removed; agents on "
	    "epoch %" PRIu64 "; the leader's removal: one call of %" PRIu64
	    " ms, gone from every survivor's list %" PRIu64 " ms after it "
	    "started\n",
	    f + 1, l + 1, e2, call_ms, gone_ms);
	finish_all("members");
}
END_TEST

static Suite *
cluster_suite(void)
{
	Suite *s = suite_create("cluster");
	TCase *tc = tcase_create("raft");
	tcase_set_timeout(tc, 150);
	tcase_add_test(tc, agents_follow_the_leader);
	tcase_add_test(tc, members_change_under_load);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(cluster_suite)
