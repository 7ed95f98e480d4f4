/* SPDX-License-Identifier: MIT */
/*
 * A three-member allotd cluster on loopback with real allotd processes
 * and in-process agents syncing with all three: every key is reported
 * to its rendezvous owner, a member killed with SIGKILL under load is
 * detected after consecutive missed exchanges and its keys are served
 * by their next owners (with `fallback: closed` quotas, so a key left
 * behind would deny everything once its lease ran out), and a restarted
 * member takes its keys back. An agent cut off from one member only
 * (through the fault suite's TCP relay, blackholed: whole messages
 * vanish and the connection stays open) moves that member's keys
 * alone, while the other agents keep syncing with it. Timings and the
 * allowance sums seen on the way are printed for docs/operations.md.
 */
#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <allot/allot.h>

#include "fault/relay.h"
#include "proto_client.h"
#include "rendezvous.h"
#include "runner.h"

#define NMEM 3
#define NAG 3
#define NKEY 9
#define RATE 300.0
#define INTERVAL_MS 100

typedef struct member {
	const char *cfg; /* NULL: the cluster's */
	const char *cert, *ca; /* tls+tcp:// members: --tls-cert, --tls-ca */
	char name[8];
	char url[64];
	char db[128];
	char log[128];
	int http;
	pid_t pid;
} member;

typedef struct cluster {
	char dir[64];
	char cfg[128];
	char list[512];
	member m[NMEM];
	uint64_t hashes[NMEM];
	int owner[NKEY]; /* with every member up */
} cluster;

static void
start_member(cluster *c, int i)
{
	member *m = &c->m[i];
	char http[32], mem[NMEM][96];
	snprintf(http, sizeof http, "127.0.0.1:%d", m->http);
	for (int j = 0; j < NMEM; j++)
		snprintf(
		    mem[j], sizeof mem[j], "%s=%s", c->m[j].name, c->m[j].url);
	const char *args[] = { "--config", m->cfg ? m->cfg : c->cfg, "--db",
		m->db, "--http", http, "--interval-ms", "100",
		"--expiry-intervals", "5", "--lease-ms", "1000", "--member",
		mem[0], "--member", mem[1], "--member", mem[2], "--self",
		m->name, m->cert != NULL ? "--tls-cert" : NULL, m->cert,
		"--tls-ca", m->ca, NULL };
	m->pid = pc_allotd_start(args, m->http, m->log);
}

static void
cluster_init(cluster *c)
{
	memset(c, 0, sizeof *c);
	snprintf(c->dir, sizeof c->dir, "/tmp/allot-cluster-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(c->dir));
	snprintf(c->cfg, sizeof c->cfg, "%s/quotas.yaml", c->dir);
	FILE *f = fopen(c->cfg, "w");
	ck_assert_ptr_nonnull(f);
	fputs("quotas:\n  default: {tokens_per_second: 10, burst: 20}\n"
	      "  callers:\n",
	    f);
	for (int k = 0; k < NKEY; k++)
		fprintf(f,
		    "    - identity: c%d\n      tokens_per_second: %.0f"
		    "\n      burst: %.0f\n      fallback: closed\n",
		    k, RATE, RATE);
	fclose(f);
	for (int i = 0; i < NMEM; i++) {
		member *m = &c->m[i];
		snprintf(m->name, sizeof m->name, "m%d", i + 1);
		snprintf(m->url, sizeof m->url, "tcp://127.0.0.1:%d",
		    pc_free_port());
		snprintf(m->db, sizeof m->db, "%s/%s.db", c->dir, m->name);
		snprintf(m->log, sizeof m->log, "%s/%s.log", c->dir, m->name);
		m->http = pc_free_port();
		c->hashes[i] = allot__rendezvous_member(m->name);
		size_t l = strlen(c->list);
		snprintf(c->list + l, sizeof c->list - l, "%s%s=%s",
		    i ? "," : "", m->name, m->url);
	}
	for (int k = 0; k < NKEY; k++) {
		char id[8];
		snprintf(id, sizeof id, "c%d", k);
		c->owner[k] = allot__rendezvous_owner(
		    allot__rendezvous_key("svc", id), c->hashes, NULL, NMEM);
	}
}

static void
cluster_fini(cluster *c)
{
	for (int i = 0; i < NMEM; i++)
		pc_allotd_stop(c->m[i].pid, 5000);
	char cmd[160];
	snprintf(cmd, sizeof cmd, "rm -rf %s", c->dir);
	free(pc_shell(cmd));
}

static allot_agent *
mkagent(const cluster *c, const char *replica)
{
	char err[256];
	allot_config *cfg;
	ck_assert_int_eq(
	    allot_config_load(c->cfg, err, sizeof err, &cfg), ALLOT_OK);
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.coordinator = c->list;
	o.service = "svc";
	o.replica_id = replica;
	o.sync_interval_ms = INTERVAL_MS;
	o.reconnect_min_ms = 50;
	o.reconnect_max_ms = 200;
	o.initial_replicas = NAG;
	allot_agent *a;
	ck_assert_int_eq(allot_agent_create(cfg, &o, &a), ALLOT_OK);
	allot_config_free(cfg);
	return a;
}

static double
rate_of(allot_agent *a, int k)
{
	char id[16];
	snprintf(id, sizeof id, "c%d", k);
	allot_key *key;
	ck_assert_int_eq(allot_key_resolve(a, id, "/x", &key), ALLOT_OK);
	allot_key_stats st;
	allot_key_stats_get(a, key, &st);
	return st.rate;
}

/* Offered load: 20 tokens/s per key per agent (60 of 300 per key), far
 * below every share, so a denial is the limiter's fault. */
typedef struct load {
	uint64_t offered, denied;
	uint64_t denied_at[NAG][NKEY];
	double max_sum_ratio; /* max over keys and samples of sum/R */
} load;

static void
run_load(allot_agent **as, load *l, unsigned ms)
{
	uint64_t end = pc_now_ms() + ms;
	while (pc_now_ms() < end) {
		for (int k = 0; k < NKEY; k++) {
			char id[8];
			snprintf(id, sizeof id, "c%d", k);
			double sum = 0;
			for (int i = 0; i < NAG; i++) {
				allot_decision d;
				allot_acquire_id(as[i], id, "/x", 1, &d);
				l->offered++;
				l->denied += !d.allowed;
				l->denied_at[i][k] += !d.allowed;
				sum += rate_of(as[i], k);
			}
			if (sum / RATE > l->max_sum_ratio)
				l->max_sum_ratio = sum / RATE;
		}
		pc_sleep_ms(50);
	}
}

/* Until no agent runs a key on an allowance its owner has not answered
 * for (allot_sync_stats.keys_unconfirmed). */
static void
await_confirmed(allot_agent **as, int timeout_ms, load *l)
{
	uint64_t t0 = pc_now_ms();
	for (;;) {
		int at = 0;
		for (int i = 0; i < NAG; i++) {
			allot_sync_stats ss;
			allot_sync_stats_get(as[i], &ss);
			at += ss.keys_unconfirmed == 0;
		}
		if (at == NAG)
			return;
		ck_assert_msg(pc_now_ms() - t0 < (uint64_t) timeout_ms,
		    "keys not confirmed by their owners");
		run_load(as, l, 10);
	}
}

static void
await_members_down(allot_agent **as, uint32_t want, int timeout_ms,
    allot_agent **busy, load *l)
{
	uint64_t t0 = pc_now_ms();
	for (;;) {
		int at = 0;
		for (int i = 0; i < NAG; i++) {
			allot_sync_stats ss;
			allot_sync_stats_get(as[i], &ss);
			at += ss.members_down == want;
		}
		if (at == NAG)
			return;
		ck_assert_msg(pc_now_ms() - t0 < (uint64_t) timeout_ms,
		    "agents did not see %u members down", want);
		run_load(busy, l, 10);
	}
}

START_TEST(failover_and_return)
{
	cluster c;
	cluster_init(&c);
	int owned[NMEM] = { 0 };
	for (int k = 0; k < NKEY; k++)
		owned[c.owner[k]]++;
	/* The member that owns most keys is the one to kill. */
	int victim = 0;
	for (int i = 1; i < NMEM; i++)
		if (owned[i] > owned[victim])
			victim = i;
	ck_assert_int_gt(owned[victim], 0);
	for (int i = 0; i < NMEM; i++)
		start_member(&c, i);
	allot_agent *as[NAG];
	for (int i = 0; i < NAG; i++) {
		char id[8];
		snprintf(id, sizeof id, "r%d", i);
		as[i] = mkagent(&c, id);
	}
	/* Every agent registers with every member. */
	uint64_t t0 = pc_now_ms();
	for (;;) {
		int ready = 0;
		for (int i = 0; i < NAG; i++) {
			allot_sync_stats ss;
			allot_sync_stats_get(as[i], &ss);
			ck_assert_uint_eq(ss.members, NMEM);
			ready += ss.registers >= NMEM && ss.connected;
		}
		if (ready == NAG)
			break;
		ck_assert_msg(pc_now_ms() - t0 < 10000, "agents not ready");
		pc_sleep_ms(10);
	}
	/* Warm-up: a newcomer's first grants come from headroom the
	 * others give back (docs/allocation.md), so early denials are the
	 * allocator's bootstrap, not the cluster's. */
	load warm = { 0 };
	run_load(as, &warm, 1500);
	load steady = { 0 };
	run_load(as, &steady, 1000);
	ck_assert_uint_eq(steady.denied, 0);
	ck_assert_msg(steady.max_sum_ratio <= 1.0 + 1e-9,
	    "steady state: agents hold %.3f x R", steady.max_sum_ratio);

	/* Kill the victim under load. */
	kill(c.m[victim].pid, SIGKILL);
	pc_wait_exit(c.m[victim].pid, 5000);
	c.m[victim].pid = 0;
	uint64_t killed = pc_now_ms();
	load fo = { 0 };
	await_members_down(as, 1, 5000, as, &fo);
	uint64_t detected = pc_now_ms() - killed;
	/* Served by the new owners: every moved key has had its share
	 * from its new owner (learnt from what the agents hold). */
	await_confirmed(as, 5000, &fo);
	uint64_t served = pc_now_ms() - killed;
	/* Past the victim's lease (1 s): its keys, with closed fallback,
	 * would deny everything had they not moved. */
	run_load(as, &fo, 2000);
	for (int i = 0; i < NAG; i++) {
		allot_sync_stats ss;
		allot_sync_stats_get(as[i], &ss);
		ck_assert_uint_ge(ss.reroutes, (uint64_t) owned[victim]);
		ck_assert(!ss.in_fallback);
		for (int k = 0; k < NKEY; k++)
			ck_assert_msg(rate_of(as[i], k) > 0,
			    "agent %d key c%d has no allowance", i, k);
	}
	fprintf(stderr,
	    "cluster: victim m%d owned %d of %d keys; down "
	    "detected after %llu ms, keys served by their new owners after "
	    "%llu ms (T = %d ms); failover: %llu of %llu "
	    "requests denied, max sum of allowances %.3f x R\n",
	    victim + 1, owned[victim], NKEY, (unsigned long long) detected,
	    (unsigned long long) served, INTERVAL_MS,
	    (unsigned long long) fo.denied, (unsigned long long) fo.offered,
	    fo.max_sum_ratio);
	/* The issue's target is 3 intervals; the bound asserted here has
	 * room for a loaded 2-core CI machine, and bench/run cluster
	 * prints the figure. */
	ck_assert_uint_le(served, 10 * INTERVAL_MS);
	ck_assert_uint_eq(fo.denied, 0);
	/* One interval of the offered traffic (60 tokens/s per key). */
	ck_assert_double_le(
	    fo.max_sum_ratio, 1.0 + 60.0 * INTERVAL_MS / 1000.0 / RATE);

	/* Restart it on its database: its keys move back. */
	start_member(&c, victim);
	uint64_t restarted = pc_now_ms();
	load back = { 0 };
	await_members_down(as, 0, 5000, as, &back);
	await_confirmed(as, 5000, &back);
	uint64_t returned = pc_now_ms() - restarted;
	run_load(as, &back, 1500);
	for (int i = 0; i < NAG; i++)
		for (int k = 0; k < NKEY; k++)
			ck_assert(rate_of(as[i], k) > 0);
	fprintf(stderr,
	    "cluster: m%d back after %llu ms; return: %llu of "
	    "%llu requests denied, max sum of allowances %.3f x R\n",
	    victim + 1, (unsigned long long) returned,
	    (unsigned long long) back.denied,
	    (unsigned long long) back.offered, back.max_sum_ratio);
	ck_assert_uint_eq(back.denied, 0);
	ck_assert_double_le(
	    back.max_sum_ratio, 1.0 + 60.0 * INTERVAL_MS / 1000.0 / RATE);
	for (int i = 0; i < NAG; i++)
		allot_agent_destroy(as[i]);

	/* A cluster-wide audit over the members' stores: each member's
	 * file holds the consumption of the keys it owned, and the view
	 * changes are event rows. */
	for (int i = 0; i < NMEM; i++) {
		kill(c.m[i].pid, SIGTERM);
		ck_assert_int_eq(pc_wait_exit(c.m[i].pid, 5000), 0);
		c.m[i].pid = 0;
	}
	char cmd[1024];
	snprintf(cmd, sizeof cmd, "%s/tools/allotctl audit %s %s %s 2>&1",
	    getenv("ALLOT_BUILD_DIR"), c.m[0].db, c.m[1].db, c.m[2].db);
	char *out = pc_shell(cmd);
	ck_assert_ptr_nonnull(out);
	const char *cons = strstr(out, "== Consumption");
	const char *ev = strstr(out, "== Events");
	ck_assert_msg(cons != NULL && ev != NULL, "audit:\n%s", out);
	for (int i = 0; i < NMEM; i++)
		ck_assert_msg(strstr(cons, c.m[i].db) != NULL &&
		        strstr(cons, c.m[i].db) < ev,
		    "no consumption from %s:\n%s", c.m[i].db, out);
	ck_assert_msg(
	    strstr(ev, "cluster_view") != NULL, "no view events:\n%s", out);
	free(out);
	cluster_fini(&c);
}
END_TEST

static uint32_t
down_of(allot_agent *a)
{
	allot_sync_stats ss;
	allot_sync_stats_get(a, &ss);
	return ss.members_down;
}

START_TEST(agent_cut_off_from_one_member)
{
	cluster c;
	cluster_init(&c);
	for (int i = 0; i < NMEM; i++)
		start_member(&c, i);
	/* Agent r0 reaches m2 through the relay; r1 and r2 directly. The
	 * name, not the address, decides ownership. */
	int cut = 1;
	int port = atoi(strrchr(c.m[cut].url, ':') + 1);
	fault_relay *r;
	ck_assert_int_eq(fault_relay_start(port, 7, &r), 0);
	char direct[sizeof c.list];
	memcpy(direct, c.list, sizeof direct);
	c.list[0] = '\0';
	for (int i = 0; i < NMEM; i++) {
		size_t l = strlen(c.list);
		if (i == cut)
			snprintf(c.list + l, sizeof c.list - l,
			    "%s%s=tcp://127.0.0.1:%d", i ? "," : "",
			    c.m[i].name, fault_relay_port(r));
		else
			snprintf(c.list + l, sizeof c.list - l, "%s%s=%s",
			    i ? "," : "", c.m[i].name, c.m[i].url);
	}
	allot_agent *as[NAG];
	as[0] = mkagent(&c, "r0");
	memcpy(c.list, direct, sizeof direct);
	as[1] = mkagent(&c, "r1");
	as[2] = mkagent(&c, "r2");
	load warm = { 0 };
	run_load(as, &warm, 2500);
	load steady = { 0 };
	run_load(as, &steady, 500);
	ck_assert_uint_eq(steady.denied, 0);
	for (int i = 0; i < NAG; i++)
		ck_assert_uint_eq(down_of(as[i]), 0);

	fault_relay_set_blackhole(r, true);
	load cutl = { 0 };
	uint64_t t0 = pc_now_ms();
	while (down_of(as[0]) != 1) {
		ck_assert_msg(pc_now_ms() - t0 < 5000,
		    "r0 did not see m2 "
		    "down");
		run_load(as, &cutl, 10);
	}
	/* Past m2's lease (1 s). m2 is alive for the other members, so
	 * they do not own its keys and refuse r0's reports of them
	 * (Reply.not_owner): r0's m2 keys run out their lease and fall
	 * back (closed here: they deny), and nothing else changes. */
	run_load(as, &cutl, 2000);
	ck_assert_uint_eq(down_of(as[0]), 1);
	ck_assert_uint_eq(down_of(as[1]), 0);
	ck_assert_uint_eq(down_of(as[2]), 0);
	allot_sync_stats ss;
	allot_sync_stats_get(as[1], &ss);
	ck_assert_uint_eq(ss.reroutes, 0);
	ck_assert(!ss.in_fallback);
	allot_sync_stats_get(as[0], &ss);
	ck_assert_uint_gt(ss.not_owner, 0);
	ck_assert(ss.in_fallback);
	int cut_keys = 0;
	for (int k = 0; k < NKEY; k++) {
		bool of_cut = c.owner[k] == cut;
		cut_keys += of_cut;
		for (int i = 1; i < NAG; i++)
			ck_assert_uint_eq(cutl.denied_at[i][k], 0);
		if (of_cut) {
			ck_assert_msg(rate_of(as[0], k) == 0,
			    "r0's key c%d (m2's) should be on its closed "
			    "fallback",
			    k);
			ck_assert_uint_gt(cutl.denied_at[0][k], 0);
		} else {
			ck_assert(rate_of(as[0], k) > 0);
			ck_assert_uint_eq(cutl.denied_at[0][k], 0);
		}
	}
	ck_assert_int_gt(cut_keys, 0);

	/* The path heals: m2's keys go back to it for r0. m2 expired r0
	 * meanwhile, so r0 registers again as a newcomer there, and a
	 * newcomer's first grant comes only from headroom the others give
	 * back (docs/allocation.md): its m2 keys, on their closed
	 * fallback, deny until that grant, for about one interval. */
	fault_relay_set_blackhole(r, false);
	load heal = { 0 };
	t0 = pc_now_ms();
	while (down_of(as[0]) != 0) {
		ck_assert_msg(pc_now_ms() - t0 < 10000,
		    "r0 did not see m2 "
		    "again");
		run_load(as, &heal, 10);
	}
	uint64_t healed = pc_now_ms() - t0;
	run_load(as, &heal, 1000);
	fprintf(stderr,
	    "cluster: cut-off agent saw m2 again after %llu ms; "
	    "%llu of %llu requests denied while it re-joined\n",
	    (unsigned long long) healed, (unsigned long long) heal.denied,
	    (unsigned long long) heal.offered);
	ck_assert_uint_le(heal.denied * 50, heal.offered);
	load after = { 0 };
	run_load(as, &after, 500);
	ck_assert_uint_eq(after.denied, 0);
	for (int i = 0; i < NAG; i++)
		allot_agent_destroy(as[i]);
	fault_relay_stop(r);
	cluster_fini(&c);
}
END_TEST

static double
metric_of(const member *m, const char *series)
{
	return pc_metric_get(m->http, series);
}

static uint32_t
unconfirmed_of(allot_agent *a)
{
	allot_sync_stats ss;
	allot_sync_stats_get(a, &ss);
	return ss.keys_unconfirmed;
}

/* m3 runs another quota file: every member reports the mismatch on
 * /metrics, /status and as an event row. Then m2 and m3 die: m1, cut off
 * from the majority, keeps the static ownership (the others' keys are
 * refused) and grants no increase (a newcomer gets nothing from it);
 * m2's return restores the majority. */
START_TEST(config_mismatch_and_cut_off)
{
	cluster c;
	cluster_init(&c);
	char cfg3[160];
	snprintf(cfg3, sizeof cfg3, "%s/other.yaml", c.dir);
	FILE *f = fopen(cfg3, "w");
	ck_assert_ptr_nonnull(f);
	fputs("quotas:\n  default: {tokens_per_second: 11, burst: 20}\n", f);
	fclose(f);
	c.m[2].cfg = cfg3;
	for (int i = 0; i < NMEM; i++)
		start_member(&c, i);
	uint64_t t0 = pc_now_ms();
	while (metric_of(&c.m[0],
	           "allotd_cluster_config_mismatch{member=\"m3\"}") != 1) {
		ck_assert_msg(pc_now_ms() - t0 < 5000,
		    "m1 did not see m3's "
		    "config differ");
		pc_sleep_ms(20);
	}
	ck_assert_double_eq(
	    metric_of(
	        &c.m[0], "allotd_cluster_config_mismatch{member=\"m2\"}"),
	    0);
	while (metric_of(&c.m[2],
	           "allotd_cluster_config_mismatch{member=\"m1\"}") != 1) {
		ck_assert_msg(pc_now_ms() - t0 < 5000,
		    "m3 did not see m1's "
		    "config differ");
		pc_sleep_ms(20);
	}
	int st = 0;
	char *status = pc_http_get(c.m[0].http, "/status", &st);
	ck_assert_int_eq(st, 200);
	ck_assert_ptr_nonnull(strstr(status, "\"cluster\":{\"self\":\"m1\""));
	ck_assert_ptr_nonnull(strstr(status, "\"config_match\":false"));
	free(status);
	/* The event row, committed within a second or two. */
	char cmd[512];
	snprintf(cmd, sizeof cmd,
	    "sqlite3 %s \"SELECT count(*) FROM events WHERE "
	    "kind = 'config_mismatch' AND subject = 'm3'\"",
	    c.m[0].db);
	for (;;) {
		char *out = pc_shell(cmd);
		int n = out != NULL ? atoi(out) : 0;
		free(out);
		if (n == 1)
			break;
		ck_assert_msg(pc_now_ms() - t0 < 8000,
		    "no config_mismatch "
		    "event row in m1's store");
		pc_sleep_ms(100);
	}

	/* Cut m1 off: kill m2 and m3. */
	allot_agent *a0 = mkagent(&c, "r0");
	load warm = { 0 };
	allot_agent *one[NAG] = { a0, a0, a0 };
	run_load(one, &warm, 1500);
	ck_assert_double_eq(metric_of(&c.m[0], "allotd_cluster_cut_off"), 0);
	for (int i = 1; i < NMEM; i++) {
		kill(c.m[i].pid, SIGKILL);
		pc_wait_exit(c.m[i].pid, 5000);
		c.m[i].pid = 0;
	}
	t0 = pc_now_ms();
	while (metric_of(&c.m[0], "allotd_cluster_cut_off") != 1) {
		ck_assert_msg(pc_now_ms() - t0 < 3000, "m1 not cut off");
		pc_sleep_ms(20);
	}
	/* r0 now reports every key to m1, which refuses the keys it does
	 * not own statically; a newcomer gets no grant from it. */
	allot_agent *a1 = mkagent(&c, "r1");
	pc_sleep_ms(1000);
	allot_sync_stats ss;
	allot_sync_stats_get(a0, &ss);
	ck_assert_uint_gt(ss.not_owner, 0);
	int mine = 0;
	for (int k = 0; k < NKEY; k++)
		mine += c.owner[k] == 0;
	ck_assert_int_gt(mine, 0);
	ck_assert_double_eq(
	    metric_of(&c.m[0], "allotd_cluster_quotas{state=\"owned\"}"),
	    mine +
	        (allot__rendezvous_owner(
	             allot__rendezvous_key("svc", "default"), c.hashes, NULL,
	             NMEM) == 0));
	ck_assert_uint_ge(unconfirmed_of(a1), (uint32_t) mine);

	/* m2 returns: a majority again. */
	start_member(&c, 1);
	t0 = pc_now_ms();
	while (metric_of(&c.m[0], "allotd_cluster_cut_off") != 0) {
		ck_assert_msg(pc_now_ms() - t0 < 3000, "m1 still cut off");
		pc_sleep_ms(20);
	}
	allot_agent_destroy(a0);
	allot_agent_destroy(a1);
	cluster_fini(&c);
}
END_TEST

/* Members over mutual TLS: m1 and m2 hold certificates of the cluster's
 * CA and probe each other; m3's come from another CA, so neither side
 * accepts the other: m3 stays down for m1 and m2, and m3, reaching
 * nobody, is cut off. */
START_TEST(members_over_mutual_tls)
{
	cluster c;
	cluster_init(&c);
	char cmd[2048];
	const char *src = getenv("ALLOT_SOURCE_DIR");
	snprintf(cmd, sizeof cmd,
	    "%s/scripts/mkcerts %s/ca1 >/dev/null 2>&1 && "
	    "%s/scripts/mkcerts %s/ca2 >/dev/null 2>&1 && "
	    "cat %s/ca1/server.pem %s/ca1/server.key > %s/good.pem && "
	    "cat %s/ca2/server.pem %s/ca2/server.key > %s/bad.pem && echo ok",
	    src, c.dir, src, c.dir, c.dir, c.dir, c.dir, c.dir, c.dir, c.dir);
	char *out = pc_shell(cmd);
	ck_assert_msg(out != NULL && strcmp(out, "ok") == 0,
	    "certificates: %s", out != NULL ? out : "(failed)");
	free(out);
	char good[160], bad[160], ca1[160], ca2[160];
	snprintf(good, sizeof good, "%s/good.pem", c.dir);
	snprintf(bad, sizeof bad, "%s/bad.pem", c.dir);
	snprintf(ca1, sizeof ca1, "%s/ca1/ca.pem", c.dir);
	snprintf(ca2, sizeof ca2, "%s/ca2/ca.pem", c.dir);
	for (int i = 0; i < NMEM; i++) {
		memmove(c.m[i].url + 4, c.m[i].url, strlen(c.m[i].url) + 1);
		memcpy(c.m[i].url, "tls+", 4);
		c.m[i].cert = i < 2 ? good : bad;
		c.m[i].ca = i < 2 ? ca1 : ca2;
	}
	for (int i = 0; i < NMEM; i++)
		start_member(&c, i);
	uint64_t t0 = pc_now_ms();
	while (metric_of(&c.m[0], "allotd_cluster_member_up{member=\"m2\"}") !=
	        1 ||
	    metric_of(&c.m[2], "allotd_cluster_cut_off") != 1) {
		ck_assert_msg(pc_now_ms() - t0 < 5000,
		    "m1 should see m2 up and m3 be cut off");
		pc_sleep_ms(50);
	}
	/* Long enough for many probes to have been refused. */
	pc_sleep_ms(1000);
	ck_assert_double_eq(
	    metric_of(&c.m[0], "allotd_cluster_member_up{member=\"m3\"}"), 0);
	ck_assert_double_eq(
	    metric_of(&c.m[1], "allotd_cluster_member_up{member=\"m3\"}"), 0);
	ck_assert_double_eq(
	    metric_of(&c.m[1], "allotd_cluster_member_up{member=\"m1\"}"), 1);
	ck_assert_double_eq(metric_of(&c.m[0], "allotd_cluster_cut_off"), 0);
	ck_assert_double_eq(
	    metric_of(&c.m[2], "allotd_cluster_member_up{member=\"m1\"}"), 0);
	cluster_fini(&c);
}
END_TEST

static Suite *
cluster_suite(void)
{
	Suite *s = suite_create("cluster");
	TCase *tc = tcase_create("allotd");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, failover_and_return);
	tcase_add_test(tc, agent_cut_off_from_one_member);
	tcase_add_test(tc, config_mismatch_and_cut_off);
	tcase_add_test(tc, members_over_mutual_tls);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(cluster_suite)
