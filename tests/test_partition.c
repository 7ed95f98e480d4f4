/* SPDX-License-Identifier: MIT */
/*
 * Partitions between real allotd members and real liballot agents, each
 * in a network namespace of its own (tests/netlab.h: one bridge, a veth
 * per node; a link is cut with `prohibit` routes on both ends). Members
 * m1..m3 are nodes 0..2; three agent processes (tests/agent_probe.c) are
 * nodes 3..5, each given every member as its seed. Every agent logs its
 * (time, caller, epoch, allowance) every 10 ms on shared slots; at the
 * end the logs are merged (tests/probe_log.h) and the test asserts, over
 * the whole run:
 *
 * - the hot caller's allowances summed over agents never exceed R at
 *   any slot (the bound of docs/operations.md "Agents in a cluster":
 *   Σ ≤ R at every instant; allotd's default --hold-expired lease keeps
 *   a cut-off agent's grants out of the others' headroom, as its
 *   connection to the leader stays open);
 * - no agent's epoch ever goes down;
 * - the calm caller (a twentieth of its quota) is never denied;
 * - at every poll of the members' /status, at most one is serving.
 *
 * Case `partitions_and_failovers`, one cluster, in turn:
 *   1. the two-owner topology of issue 15: the link between the leader
 *      and another member is cut while the third reaches both, and the
 *      agents are split the same way (one with the leader's side, one
 *      with the other's, one reaching all) for 2.5 s, within the agents'
 *      grant lease; then healed;
 *   2. leader isolation: the leader cut from both other members (the
 *      agents still reach it) until another member serves and every
 *      agent follows it; healed, the new leader stays (pre-vote);
 *   3. SIGKILL of the leader, the agents follow, it restarts;
 *   4. SIGSTOP of the leader until the agents follow another, SIGCONT.
 *
 * Case `clock_skew`: the same invariants through leader changes (SIGSTOP
 * of the leader, up to five rounds) with m1's clock running 1 % slow and
 * m2's and m3's 1 % fast under libfaketime (the documented drift bound d
 * = 1 %, coordinator/consensus/consensus_node.h): once m1 leads, its successor
 * has the fast clock, the worst pair for the lease (the old lease looks long
 * in real time, the new wait short). Skips (passes, saying so) when
 * libfaketime is not installed; the test first checks that the faked
 * clock really runs at the rate asked for in an allotd.
 *
 * Case `dead_peer_dropped`: three members over mutual TLS; the leader's
 * link to a follower is cut (packets go nowhere, nothing closes): its
 * connection is dropped once TCP_USER_TIMEOUT runs out (coordinator/
 * raft_tls.c), not after the kernel's retransmissions give up, and the
 * follower catches up once healed.
 *
 * Namespaces, processes and the temporary directory belong to main()
 * (the parent of check's forked test processes) and are removed there,
 * also after a failed assert, a check timeout or SIGTERM. Exit 77 (skip)
 * when not root. Every wait is bounded.
 */
#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "allotd.h"
#include "netlab.h"
#include "probe_log.h"
#include "proc.h"
#include "proto_client.h"

#define NM 3 /* members, nodes 0..2 */
#define NA 3 /* agents, nodes 3..5 */
#define ELECTION_MS 500
#define R_HOT 300.0
#define FAKETIME_LIB "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"

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

static netlab lab;
static char dir[64];
static pid_t main_pid;

typedef struct member {
	int port; /* agents' port; raft port + 1, HTTP port + 2 */
	char url[64], raftaddr[64], db[160], log[160], cfg[160], admin[160];
	const char *faketime; /* NULL: the real clock */
	const char *cert, *ca; /* TLS between members; NULL: plain TCP */
	double rate; /* the clock rate asked for (1: real) */
	uint64_t hup_ms[2]; /* real monotonic times of two SIGHUPs */
	uint64_t seen_ms[2]; /* and of their log lines seen here */
	pid_t pid;
	bool up;
} member;

static member ms[NM];
static pid_t agents[NA];
static char agent_out[NA][160];
static char seeds[256];

/* ---- members ---- */

static void
member_init(int i, const char *tag, int base)
{
	member *m = &ms[i];
	memset(m, 0, sizeof *m);
	m->port = base;
	snprintf(m->url, sizeof m->url, "tcp://%s:%d", netlab_ip(i), base);
	snprintf(
	    m->raftaddr, sizeof m->raftaddr, "%s:%d", netlab_ip(i), base + 1);
	snprintf(m->db, sizeof m->db, "%s/%s-m%d.db", dir, tag, i + 1);
	snprintf(m->log, sizeof m->log, "%s/%s-m%d.log", dir, tag, i + 1);
	snprintf(m->cfg, sizeof m->cfg, "%s/%s-q%d.yaml", dir, tag, i + 1);
	snprintf(m->admin, sizeof m->admin, "%s/%s-a%d.sock", dir, tag, i + 1);
	pc_write_file(m->cfg, CFG);
}

/* GET http://127.0.0.1:<member's HTTP port><path> inside its namespace. */
static char *
member_get(int i, const char *path, int *ret_status)
{
	*ret_status = 0;
	ck_assert_int_eq(netlab_enter(&lab, i), 0);
	char *body = pc_http_get(ms[i].port + 2, path, ret_status);
	ck_assert_int_eq(netlab_leave(&lab), 0);
	return body;
}

static void
member_start(int i)
{
	member *m = &ms[i];
	char *bin = (char *) pc_allotd_path();
	char id[16], http[32], el[16], seed[NM][160];
	snprintf(id, sizeof id, "%d", i + 1);
	snprintf(http, sizeof http, "127.0.0.1:%d", m->port + 2);
	snprintf(el, sizeof el, "%d", ELECTION_MS);
	char *argv[40] = { bin, "--config", m->cfg, "--db", m->db, "--listen",
		m->url, "--http", http, "--admin-socket", m->admin,
		"--interval-ms", "100", "--raft-id", id, "--raft-addr",
		m->raftaddr, "--election-ms", el, NULL };
	int n = 19;
	for (int j = 0; j < NM; j++) {
		snprintf(seed[j], sizeof seed[j], "%d=%s=%s", j + 1,
		    ms[j].raftaddr, ms[j].url);
		argv[n++] = "--seed";
		argv[n++] = seed[j];
	}
	if (m->cert != NULL) {
		argv[n++] = "--tls-cert";
		argv[n++] = (char *) m->cert;
		argv[n++] = "--tls-ca";
		argv[n++] = (char *) m->ca;
	}
	argv[n] = NULL;
	/* libfaketime for a skewed clock: its own environment. */
	extern char **environ;
	char *envp[256];
	char pre[160], ft[64], asan[512];
	const char *asan0 = getenv("ASAN_OPTIONS");
	int ne = 0;
	for (char **e = environ; *e != NULL && ne < 250; e++)
		if (strncmp(*e, "LD_PRELOAD=", 11) != 0 &&
		    strncmp(*e, "FAKETIME", 8) != 0 &&
		    (m->faketime == NULL ||
		        strncmp(*e, "ASAN_OPTIONS=", 13) != 0))
			envp[ne++] = *e;
	if (m->faketime != NULL) {
		snprintf(pre, sizeof pre, "LD_PRELOAD=%s", FAKETIME_LIB);
		snprintf(ft, sizeof ft, "FAKETIME=%s", m->faketime);
		/* Under ASan its runtime must come first, and libfaketime is
		 * preloaded before it: allowed, not checked. */
		snprintf(asan, sizeof asan,
		    "ASAN_OPTIONS=%s%sverify_asan_link_order=0",
		    asan0 ? asan0 : "", asan0 && *asan0 ? ":" : "");
		envp[ne++] = pre;
		envp[ne++] = ft;
		envp[ne++] = "FAKETIME_NO_CACHE=1";
		envp[ne++] = asan;
	}
	envp[ne] = NULL;
	m->pid = netlab_spawn(&lab, i, argv, envp, m->log);
	ck_assert_int_gt(m->pid, 0);
	uint64_t end = pc_now_ms() + 10000;
	for (;;) {
		int st;
		free(member_get(i, "/healthz", &st));
		if (st == 200)
			break;
		int ex = pc_wait_exit(m->pid, 0);
		ck_assert_msg(ex == -1, "allotd exited early with %d (see %s)",
		    ex, m->log);
		ck_assert_msg(pc_now_ms() < end,
		    "allotd did not come up (see %s)", m->log);
		pc_sleep_ms(20);
	}
	m->up = true;
}

static bool
serving(int i)
{
	int st;
	char *body = member_get(i, "/status", &st);
	bool yes = body != NULL && st == 200 &&
	    strstr(body, "\"serving\":true") != NULL;
	free(body);
	return yes;
}

/* The serving member among those up (at most one, asserted), or -1. */
static int
poll_leader(void)
{
	int who = -1, count = 0;
	for (int i = 0; i < NM; i++)
		if (ms[i].up && serving(i)) {
			who = i;
			count++;
		}
	ck_assert_msg(count <= 1, "%d members serving at once", count);
	return who;
}

/* Wait until a member other than `not` serves; its index. */
static int
wait_leader(int not, int timeout_ms)
{
	uint64_t end = pc_now_ms() + (uint64_t) timeout_ms;
	for (int i = 0; i < 10000; i++) {
		int who = poll_leader();
		if (who >= 0 && who != not )
			return who;
		ck_assert_msg(pc_now_ms() < end,
		    "no leader (other than m%d) "
		    "within %d ms",
		    not +1, timeout_ms);
		pc_sleep_ms(20);
	}
	return -1;
}

/* Poll the members for `ms_` ms, asserting at most one serves. */
static void
watch(int ms_)
{
	uint64_t end = pc_now_ms() + (uint64_t) ms_;
	for (int i = 0; i < 10000 && pc_now_ms() < end; i++) {
		poll_leader();
		pc_sleep_ms(20);
	}
}

/* Say on stderr when a phase starts, on the probes' clock (monotonic
 * ms), so that a failure's time can be placed. */
static void
mark(const char *what)
{
	fprintf(stderr, "at %" PRIu64 " ms: %s\n", pc_now_ms(), what);
}

/* ---- agents ---- */

static void
agents_start(const char *tag)
{
	char *bin = (char *) pc_program("tests/support/agent-probe");
	char cfg[160], rep[16], log[160];
	snprintf(cfg, sizeof cfg, "%s/%s-agent.yaml", dir, tag);
	pc_write_file(cfg, CFG);
	snprintf(
	    seeds, sizeof seeds, "%s,%s,%s", ms[0].url, ms[1].url, ms[2].url);
	for (int k = 0; k < NA; k++) {
		snprintf(rep, sizeof rep, "r%d", k + 1);
		snprintf(agent_out[k], sizeof agent_out[k], "%s/%s-r%d.txt",
		    dir, tag, k + 1);
		snprintf(log, sizeof log, "%s/%s-r%d.log", dir, tag, k + 1);
		char *argv[] = { bin, "--config", cfg, "--seed", seeds,
			"--replica", rep, "--out", agent_out[k], "--replicas",
			"3", NULL };
		agents[k] = netlab_spawn(&lab, NM + k, argv, NULL, log);
		ck_assert_int_gt(agents[k], 0);
	}
}

/* Wait until every agent is connected to a leader of epoch above
 * `above` (and, with `granted`, runs on explicit grants for every caller:
 * the leader has learnt), watching the members meanwhile; returns the
 * lowest epoch. */
static uint64_t
agents_follow(uint64_t above, bool granted, int timeout_ms)
{
	uint64_t end = pc_now_ms() + (uint64_t) timeout_ms;
	for (int i = 0; i < 10000; i++) {
		uint64_t low = UINT64_MAX;
		bool all = true;
		for (int k = 0; k < NA; k++) {
			uint64_t e = 0;
			bool c = false, g = false;
			if (!probe_last(agent_out[k], &e, &c, &g) || !c ||
			    (granted && !g))
				all = false;
			low = e < low ? e : low;
		}
		if (all && low > above)
			return low;
		ck_assert_msg(pc_now_ms() < end,
		    "agents not all on a leader above epoch %" PRIu64
		    " after %d ms (see %s)",
		    above, timeout_ms, dir);
		poll_leader();
		pc_sleep_ms(20);
	}
	return 0;
}

static void
agents_stop(void)
{
	for (int k = 0; k < NA; k++)
		if (agents[k] > 0)
			kill(agents[k], SIGTERM);
	for (int k = 0; k < NA; k++)
		if (agents[k] > 0) {
			int ex = pc_wait_exit(agents[k], 5000);
			ck_assert_msg(
			    ex == 0, "agent %d exited with %d", k, ex);
			agents[k] = 0;
		}
}

static void
members_stop(void)
{
	for (int i = 0; i < NM; i++) {
		if (ms[i].pid > 0) {
			kill(ms[i].pid, SIGCONT);
			pc_allotd_stop(ms[i].pid, 5000);
		}
		ms[i].pid = 0;
		ms[i].up = false;
		ck_assert(!pc_log_has_sanitizer_report(ms[i].log));
	}
}

/* The invariants over the merged logs of the whole run. */
static void
check_logs(const char *what)
{
	probe_run r;
	const char *paths[NA];
	for (int k = 0; k < NA; k++)
		paths[k] = agent_out[k];
	ck_assert_int_eq(probe_load(&r, paths, NA, "hot", "calm"), 0);
	uint64_t at;
	double worst = probe_max_sum(&r, 0, UINT64_MAX, &at);
	uint64_t denied = probe_calm_denied(&r, 0, UINT64_MAX);
	uint64_t allowed = probe_calm_allowed(&r, 0, UINT64_MAX);
	double over = probe_over(&r, 0, UINT64_MAX, R_HOT, R_HOT, 1000);
	fprintf(stderr,
	    "%s: %zu slots from %" PRIu64
	    " ms; Σ hot allowances at most %.1f of R = %.0f (at "
	    "%" PRIu64 " ms); calm %" PRIu64 " allowed, %" PRIu64
	    " denied; hot over R·1s + B: %.1f tokens\n",
	    what, r.nslots, r.t0, worst, R_HOT, at, allowed, denied, over);
	for (int k = 0; k < NA; k++) {
		fprintf(stderr,
		    "%s: agent r%d: %" PRIu64 " leader switches, %" PRIu64
		    " stale epochs dropped\n",
		    what, k + 1, r.a[k].switches, r.a[k].stale_epoch);
		ck_assert_msg(r.a[k].epoch_drops == 0,
		    "agent r%d: its epoch went down at t = %" PRIu64 " (%s)",
		    k + 1, r.a[k].first_drop_at, agent_out[k]);
	}
	ck_assert_uint_gt(allowed, 100);
	ck_assert_msg(denied == 0, "calm denied %" PRIu64 " times", denied);
	ck_assert_msg(worst <= R_HOT * (1 + 1e-9),
	    "t = %" PRIu64 " ms: agents held %.3f tokens/s of R = %.0f (%s)",
	    at - r.t0, worst, R_HOT, dir);
	probe_free(&r);
}

/* ---- the cases ---- */

START_TEST(partitions_and_failovers)
{
	for (int i = 0; i < NM; i++)
		member_init(i, "pf", 7400);
	for (int i = 0; i < NM; i++)
		member_start(i);
	int L = wait_leader(-1, 15000);
	agents_start("pf");
	uint64_t e = agents_follow(0, true, 10000);
	watch(1000);

	/* 1. The two-owner topology: the leader's link to X cut, Y
	 * reaching both; agent r1 with the leader's side, r2 with X's. */
	L = wait_leader(-1, 1000);
	int X = (L + 1) % NM, Y = (L + 2) % NM;
	fprintf(stderr, "partition: cut m%d-m%d (m%d reaches both)\n", L + 1,
	    X + 1, Y + 1);
	mark("two-owner partition");
	ck_assert_int_eq(netlab_cut(&lab, L, X), 0);
	ck_assert_int_eq(netlab_cut(&lab, NM + 0, X), 0);
	ck_assert_int_eq(netlab_cut(&lab, NM + 1, L), 0);
	watch(2500);
	ck_assert_int_eq(netlab_heal(&lab, L, X), 0);
	ck_assert_int_eq(netlab_heal(&lab, NM + 0, X), 0);
	ck_assert_int_eq(netlab_heal(&lab, NM + 1, L), 0);
	mark("healed");
	watch(1500);
	/* One owner all along: Y still heard the leader, so refused X's
	 * pre-votes, and the leader kept its place. */
	ck_assert_int_eq(wait_leader(-1, 1000), L);

	/* 2. Leader isolation: cut from both members, not from agents. */
	L = wait_leader(-1, 5000);
	mark("leader isolation");
	uint64_t t_iso = pc_now_ms();
	for (int i = 0; i < NM; i++)
		if (i != L)
			ck_assert_int_eq(netlab_cut(&lab, L, i), 0);
	int L2 = wait_leader(L, 10000);
	e = agents_follow(e, false, 10000);
	fprintf(stderr,
	    "isolation: m%d cut off; m%d serves, agents on epoch %" PRIu64
	    " after %" PRIu64 " ms\n",
	    L + 1, L2 + 1, e, pc_now_ms() - t_iso);
	watch(500);
	for (int i = 0; i < NM; i++)
		if (i != L)
			ck_assert_int_eq(netlab_heal(&lab, L, i), 0);
	watch(2000);
	ck_assert_int_eq(wait_leader(-1, 1000), L2);

	/* 3. SIGKILL of the leader; it comes back as a follower. */
	mark("SIGKILL");
	uint64_t t_kill = pc_now_ms();
	kill(ms[L2].pid, SIGKILL);
	pc_wait_exit(ms[L2].pid, 5000);
	ms[L2].pid = 0;
	ms[L2].up = false;
	e = agents_follow(e, false, 10000);
	int L3 = wait_leader(L2, 5000);
	fprintf(stderr,
	    "kill: m%d killed; m%d serves, agents on epoch %" PRIu64
	    " after %" PRIu64 " ms\n",
	    L2 + 1, L3 + 1, e, pc_now_ms() - t_kill);
	member_start(L2);
	watch(1500);

	/* 4. SIGSTOP of the leader until the agents follow another. */
	mark("SIGSTOP");
	uint64_t t_stop = pc_now_ms();
	kill(ms[L3].pid, SIGSTOP);
	ms[L3].up = false;
	e = agents_follow(e, false, 10000);
	int L4 = wait_leader(L3, 5000);
	fprintf(stderr,
	    "stop: m%d stopped; m%d serves, agents on epoch %" PRIu64
	    " after %" PRIu64 " ms\n",
	    L3 + 1, L4 + 1, e, pc_now_ms() - t_stop);
	mark("SIGCONT");
	kill(ms[L3].pid, SIGCONT);
	ms[L3].up = true;
	watch(2000);

	agents_stop();
	members_stop();
	check_logs("partition");
}
END_TEST

/* Milliseconds of the day in a log line's timestamp ("2026-12-01T20:
 * 23:07.271Z ..."), or -1. */
static double
log_ms(const char *line)
{
	int h, m, sec, ms_;
	if (sscanf(line, "%*4d-%*2d-%*2dT%2d:%2d:%2d.%3dZ", &h, &m, &sec,
	        &ms_) != 4)
		return -1;
	return ((h * 60.0 + m) * 60 + sec) * 1000 + ms_;
}

/* The log time (ms of the day) of the n-th line (from 0) of member i's
 * log naming `id`; -1 while there is none. */
static double
log_line_ms(int i, const char *id, int n)
{
	char *text = pc_read_file(ms[i].log);
	double t = -1;
	for (char *p = text ? strstr(text, id) : NULL; p != NULL;
	     p = strstr(p + 1, id)) {
		if (n-- > 0)
			continue;
		while (p > text && p[-1] != '\n')
			p--;
		t = log_ms(p);
		break;
	}
	free(text);
	return t;
}

/* Mark member i's clock: a SIGHUP with its config file unchanged makes
 * it log ALLOTD-RELOAD-SAME with its (faked) time; the real times it was
 * sent and its line was seen are kept: it logged in between. The n-th
 * mark (0 or 1). */
static void
clock_mark(int i, int n)
{
	ms[i].hup_ms[n] = pc_now_ms();
	kill(ms[i].pid, SIGHUP);
	uint64_t end = pc_now_ms() + 2000;
	while (log_line_ms(i, "ALLOTD-RELOAD-SAME", n) < 0) {
		ck_assert_msg(
		    pc_now_ms() < end, "m%d did not log its reload", i + 1);
		pc_sleep_ms(5);
	}
	ms[i].seen_ms[n] = pc_now_ms();
}

/* The rates member i's clock may have run at between its two marks: its
 * log's time over the real time, which lies between the shortest and
 * the longest the marks allow (a loaded machine can take a hundred ms
 * to deliver a signal and write the line). Into lo and hi. */
static void
clock_rate(int i, double *lo, double *hi)
{
	double a = log_line_ms(i, "ALLOTD-RELOAD-SAME", 0);
	double b = log_line_ms(i, "ALLOTD-RELOAD-SAME", 1);
	double shortest = (double) ms[i].hup_ms[1] - (double) ms[i].seen_ms[0];
	double longest = (double) ms[i].seen_ms[1] - (double) ms[i].hup_ms[0];
	*lo = (b - a) / longest;
	*hi = shortest > 0 ? (b - a) / shortest : INFINITY;
}

static bool
faketime_present(void)
{
	return access(FAKETIME_LIB, R_OK) == 0;
}

/* Leader changes clock_skew makes at most; at even odds, the chance that
 * the slow member never leads is 2^-SKEW_ROUNDS. */
#define SKEW_ROUNDS 20

START_TEST(clock_skew)
{
	if (!faketime_present()) {
		fprintf(stderr,
		    "clock_skew: SKIPPED: %s not installed "
		    "(apt-get install libfaketime)\n",
		    FAKETIME_LIB);
		return;
	}
	for (int i = 0; i < NM; i++)
		member_init(i, "sk", 7500);
	ms[0].faketime = "+0 x0.99";
	ms[1].faketime = "+0 x1.01";
	ms[2].faketime = "+0 x1.01";
	ms[0].rate = 0.99;
	ms[1].rate = ms[2].rate = 1.01;
	for (int i = 0; i < NM; i++)
		member_start(i);
	int L = wait_leader(-1, 15000);
	for (int i = 0; i < NM; i++)
		clock_mark(i, 0);
	agents_start("sk");
	uint64_t e = agents_follow(0, true, 10000);
	watch(500);
	bool slow_led = L == 0, worst_pair = false;
	/* Who wins an election is up to the randomised timeouts: about
	 * even between m1 and a fast member, so rounds go on (bounded in
	 * count and time) until the slow member has led and was stopped. */
	uint64_t rounds_end = pc_now_ms() + 60000;
	int round = 0;
	for (; round < SKEW_ROUNDS && !worst_pair && pc_now_ms() < rounds_end;
	     round++) {
		L = wait_leader(-1, 5000);
		kill(ms[L].pid, SIGSTOP);
		ms[L].up = false;
		e = agents_follow(e, false, 10000);
		int N = wait_leader(L, 5000);
		fprintf(stderr, "skew: m%d (%s) stopped; m%d (%s) serves\n",
		    L + 1, ms[L].faketime, N + 1, ms[N].faketime);
		worst_pair |= L == 0;
		slow_led |= N == 0;
		kill(ms[L].pid, SIGCONT);
		ms[L].up = true;
		watch(1000);
	}
	fprintf(stderr,
	    "skew: the slow member %s, handed over to a fast "
	    "one: %s\n",
	    slow_led ? "led" : "never led", worst_pair ? "yes" : "no");
	for (int i = 0; i < NM; i++)
		clock_mark(i, 1);
	agents_stop();
	members_stop();
	check_logs("skew");
	/* The faked clocks ran at the rates asked for, in allotd: the
	 * rate asked for within what the marks allow (and the log's ms
	 * resolution), and a clock at the real rate outside it. */
	for (int i = 0; i < NM; i++) {
		double lo, hi;
		clock_rate(i, &lo, &hi);
		fprintf(stderr,
		    "skew: m%d's clock ran at %.4f to %.4f (asked %.2f)\n",
		    i + 1, lo, hi, ms[i].rate);
		ck_assert_msg(lo - 0.001 < ms[i].rate &&
		        ms[i].rate < hi + 0.001 && (lo > 1 || hi < 1),
		    "m%d's clock ran at %.4f to %.4f, not %.2f: libfaketime "
		    "did not take (see %s)",
		    i + 1, lo, hi, ms[i].rate, ms[i].log);
	}
	/* The case this is for: the slow leader's lease handed over to a
	 * fast successor (bounded rounds: m1 most often leads first, and
	 * wins about half of the elections it stands in). */
	ck_assert_msg(worst_pair, "m1 (slow) never led in %d rounds", round);
}
END_TEST

/* coordinator/consensus/raft_tls.c sets TCP_USER_TIMEOUT (4 election timeouts)
 * on member connections: the leader's connection to a member whose link was
 * cut (no FIN, no RST: packets go nowhere) is dropped within seconds,
 * logged, and dialled again; healed, the member catches up. Without it
 * the connection would stay "up" until the kernel's retransmissions give
 * up, about 15 minutes. */
START_TEST(dead_peer_dropped)
{
	char cmd[1024], cert[160], ca[160];
	snprintf(cmd, sizeof cmd,
	    "set -e; d=%s/pki; %s/scripts/mkcerts -s "
	    "URI:spiffe://test.example/allot/member $d >$d.log 2>&1; "
	    "cat $d/server.pem $d/server.key > %s/member.pem",
	    dir, getenv("ALLOT_SOURCE_DIR"), dir);
	ck_assert_int_eq(system(cmd), 0);
	snprintf(cert, sizeof cert, "%s/member.pem", dir);
	snprintf(ca, sizeof ca, "%s/pki/ca.pem", dir);
	for (int i = 0; i < NM; i++) {
		member_init(i, "tu", 7700);
		ms[i].cert = cert;
		ms[i].ca = ca;
	}
	for (int i = 0; i < NM; i++)
		member_start(i);
	int L = wait_leader(-1, 15000);
	watch(500);
	int F = (L + 1) % NM;
	uint64_t cut = pc_now_ms();
	ck_assert_int_eq(netlab_cut(&lab, L, F), 0);
	/* 4 x 500 ms of unacknowledged heartbeats, then the next
	 * retransmission timer (backing off from 200 ms): about 2.3 s.
	 * Either end of the cut link may be the one that times out: the
	 * leader's heartbeats to F go unacknowledged, and so do F's
	 * pre-votes to the leader; on a loaded machine (CI runs two suites
	 * at a time) the leader once stopped sending before its timer ran
	 * out, so both logs are read. */
	uint64_t dropped = 0;
	int by = -1;
	while (dropped == 0 && pc_now_ms() < cut + 12000) {
		for (int k = 0; k < 2 && dropped == 0; k++) {
			int m = k == 0 ? L : F;
			char *text = pc_read_file(ms[m].log);
			if (text != NULL &&
			    strstr(text,
			        "connection dropped: "
			        "connection timed out")) {
				dropped = pc_now_ms();
				by = m;
			}
			free(text);
		}
		pc_sleep_ms(50);
	}
	fprintf(stderr,
	    "tcp-user-timeout: the link m%d-m%d dropped by m%d %" PRIu64
	    " ms after the cut\n",
	    L + 1, F + 1, by + 1, dropped ? dropped - cut : 0);
	ck_assert_msg(dropped != 0,
	    "neither m%d nor m%d dropped the cut link within 12 s "
	    "(see %s and %s)",
	    L + 1, F + 1, ms[L].log, ms[F].log);
	ck_assert_int_eq(netlab_heal(&lab, L, F), 0);
	/* Dialled again: F applies what it missed. */
	uint64_t end = pc_now_ms() + 8000;
	for (;;) {
		int st;
		char *a = member_get(L, "/status", &st);
		char *b = member_get(F, "/status", &st);
		char *pa = a ? strstr(a, "\"applied_index\":") : NULL;
		char *pb = b ? strstr(b, "\"applied_index\":") : NULL;
		bool same = pa != NULL && pb != NULL &&
		    strtoull(pa + 16, NULL, 10) == strtoull(pb + 16, NULL, 10);
		free(a);
		free(b);
		if (same)
			break;
		ck_assert_msg(pc_now_ms() < end,
		    "m%d did not catch up after the heal", F + 1);
		pc_sleep_ms(50);
	}
	members_stop();
}
END_TEST

/* ---- the lab around check's forked test processes ---- */

static void
teardown(void)
{
	netlab_destroy(&lab);
	if (getenv("ALLOT_KEEP_TEST_DIR") == NULL)
		pc_rm_rf(dir);
	else
		fprintf(stderr, "partition: kept %s\n", dir);
}

static void
on_signal(int sig)
{
	if (getpid() == main_pid)
		teardown(); /* not async-signal-safe; we exit right after */
	signal(sig, SIG_DFL);
	raise(sig);
}

static Suite *
partition_suite(void)
{
	Suite *s = suite_create("partition");
	TCase *tc = tcase_create("netns");
	tcase_set_timeout(tc, 90);
	tcase_add_test(tc, partitions_and_failovers);
	tcase_add_test(tc, clock_skew);
	tcase_add_test(tc, dead_peer_dropped);
	suite_add_tcase(s, tc);
	return s;
}

int
main(void)
{
	char why[160];
	if (netlab_available(why, sizeof why) != 0) {
		fprintf(stderr, "partition: SKIP: %s\n", why);
		return 77;
	}
	snprintf(dir, sizeof dir, "/tmp/allot-partition-XXXXXX");
	if (mkdtemp(dir) == NULL) {
		perror("mkdtemp");
		return 1;
	}
	main_pid = getpid();
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	if (netlab_create(&lab, dir, NM + NA) != 0) {
		pc_rm_rf(dir);
		return 1;
	}
	SRunner *sr = srunner_create(partition_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	teardown();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
