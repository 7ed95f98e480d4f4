/* SPDX-License-Identifier: MIT */
/*
 * The config plane end to end (docs/protocol.md, "The config plane"): a
 * real allotd process and four liballot agents over real nng sockets,
 * each under load from a thread of its own. allotd's quota file changes
 * (a caller added, an endpoint weight changed, a caller flipped from
 * shadow to enforced, a quota lowered) through `allotctl apply`; every
 * agent must enforce the new file within 2 T, as its own decisions show, with
 * no restart and no denial for the caller the change did not touch. Then
 * the cache: with allotd down, a fresh agent given a stale bootstrap file
 * runs the config it last received, and picks up a newer one within 2 T
 * of allotd coming back. Then one file for two services, each agent
 * enforcing its own service's view. (The config of a Raft cluster is
 * committed through its log: tests/test_raft.c; agents that follow its
 * leader are tested with the agent side of the cluster.)
 */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <allot/allot.h>

#include "allotd.h"
#include "proc.h"
#include "proto_client.h"
#include "runner.h"

#define NAGENTS 4
#define T_MS 250u /* the sync interval of allotd and the agents */
/* Load loops stop after this many rounds or this long, whichever first. */
#define MAX_ROUNDS 200000u
#define MAX_LOOP_MS 20000u

/* v1: what allotd and every agent start with. `steady` is the caller no
 * change touches; `sh` is in shadow; `lower` is high; the unknown
 * identity `new` charges the default quota (1/s, burst 8). */
static const char *CFG_V1 = "quotas:\n"
                            "  default: {tokens_per_second: 1, burst: 8}\n"
                            "  callers:\n"
                            "    - identity: steady\n"
                            "      tokens_per_second: 100000\n"
                            "      burst: 100000\n"
                            "    - identity: sh\n"
                            "      tokens_per_second: 2\n"
                            "      burst: 8\n"
                            "      shadow: true\n"
                            "    - identity: lower\n"
                            "      tokens_per_second: 5000\n"
                            "      burst: 5000\n"
                            "  endpoint_weights:\n"
                            "    default: 1\n"
                            "    \"/heavy\": 1\n";

/* v2: `new` added, /heavy weighs 5, `sh` enforced, `lower` lowered. */
static const char *CFG_V2 = "quotas:\n"
                            "  default: {tokens_per_second: 1, burst: 8}\n"
                            "  callers:\n"
                            "    - identity: steady\n"
                            "      tokens_per_second: 100000\n"
                            "      burst: 100000\n"
                            "    - identity: sh\n"
                            "      tokens_per_second: 2\n"
                            "      burst: 8\n"
                            "    - identity: lower\n"
                            "      tokens_per_second: 20\n"
                            "      burst: 20\n"
                            "    - identity: new\n"
                            "      tokens_per_second: 100000\n"
                            "      burst: 100000\n"
                            "  endpoint_weights:\n"
                            "    default: 1\n"
                            "    \"/heavy\": 5\n";

/* v3: v2 with /heavy at 7 (the file allotd comes back with). */
static const char *CFG_V3 = "quotas:\n"
                            "  default: {tokens_per_second: 1, burst: 8}\n"
                            "  callers:\n"
                            "    - identity: steady\n"
                            "      tokens_per_second: 100000\n"
                            "      burst: 100000\n"
                            "    - identity: sh\n"
                            "      tokens_per_second: 2\n"
                            "      burst: 8\n"
                            "    - identity: lower\n"
                            "      tokens_per_second: 20\n"
                            "      burst: 20\n"
                            "    - identity: new\n"
                            "      tokens_per_second: 100000\n"
                            "      burst: 100000\n"
                            "  endpoint_weights:\n"
                            "    default: 1\n"
                            "    \"/heavy\": 7\n";

/* The test's allotd (tests/support/allotd.h), its admin socket at
 * c.sock, and the agents' bootstrap file (always v1). */
typedef struct env {
	pc_coord c;
	char boot[200];
} env;

static void
start_allotd(env *e)
{
	char iv[16];
	snprintf(iv, sizeof iv, "%u", T_MS);
	const char *args[] = { "--interval-ms", iv, "--admin-socket",
		e->c.sock, NULL };
	pc_coord_spawn(&e->c, args, NULL);
}

static void
env_init(env *e)
{
	memset(e, 0, sizeof *e);
	pc_coord_init(&e->c, "/tmp/allot-push", CFG_V1);
	snprintf(e->boot, sizeof e->boot, "%s/bootstrap.yaml", e->c.dir);
	pc_write_file(e->boot, CFG_V1);
}

static void
env_fini(env *e)
{
	pc_coord_done(&e->c, 5000);
}

/* Change allotd's config to `text` with `allotctl apply` over the admin
 * socket, which writes the file and installs it before it answers. */
static void
change_config(const env *e, const char *text)
{
	char next[240];
	const char *ctl = pc_program("tools/allotctl");
	snprintf(next, sizeof next, "%s/next.yaml", e->c.dir);
	pc_write_file(next, text);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		setenv("ALLOT_ADMIN_SOCKET", e->c.sock, 1);
		int fd = open("/dev/null", O_WRONLY);
		dup2(fd, STDOUT_FILENO);
		execl(ctl, ctl, "apply", next, "--reason", "config_push test",
		    (char *) NULL);
		_exit(127);
	}
	ck_assert_int_eq(pc_wait_exit(pid, 10000), 0);
}

/* An agent of service "svc" started from the bootstrap file (v1). */
static allot_agent *
mkagent(const env *e, const char *replica, const char *cache)
{
	char err[256];
	allot_config *cfg;
	ck_assert_int_eq(
	    allot_config_load(e->boot, err, sizeof err, &cfg), ALLOT_OK);
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.coordinator = e->c.url;
	o.service = "svc";
	o.replica_id = replica;
	o.sync_interval_ms = T_MS;
	o.reconnect_min_ms = 50;
	o.reconnect_max_ms = 100;
	o.config_cache_file = cache;
	allot_agent *a;
	ck_assert_int_eq(allot_agent_create(cfg, &o, &a), ALLOT_OK);
	allot_config_free(cfg);
	return a;
}

/* One agent's load thread and what its decisions showed: the first time
 * each change was seen (monotonic ms, 0: not yet), and the denials of
 * the caller no change touches. */
typedef struct load {
	allot_agent *a;
	pthread_t th;
	_Atomic bool stop;
	_Atomic uint64_t t_weight; /* steady on /heavy costs 5 */
	_Atomic uint64_t t_shadow; /* sh denied for real */
	_Atomic uint64_t t_lower; /* lower's bucket holds at most 20 */
	_Atomic uint64_t t_new; /* new has a bucket of its own */
	_Atomic uint64_t steady_denied;
	_Atomic uint64_t rounds;
	_Atomic int errors;
} load;

static void
seen(_Atomic uint64_t *t, bool cond, uint64_t now)
{
	if (cond && atomic_load(t) == 0)
		atomic_store(t, now);
}

static void *
load_main(void *arg)
{
	load *l = arg;
	uint64_t end = pc_now_ms() + MAX_LOOP_MS;
	for (uint32_t i = 0;
	     i < MAX_ROUNDS && !atomic_load(&l->stop) && pc_now_ms() < end;
	     i++) {
		allot_decision d;
		uint64_t now = pc_now_ms();
		int rc = allot_acquire_id(l->a, "steady", "/heavy", 0, &d);
		if (rc != ALLOT_OK)
			atomic_fetch_add(&l->errors, 1);
		atomic_fetch_add(&l->steady_denied, !d.allowed);
		seen(&l->t_weight, d.cost == 5, now);
		rc = allot_acquire_id(l->a, "steady", "/light", 0, &d);
		atomic_fetch_add(&l->steady_denied, !d.allowed);
		if (allot_acquire_id(l->a, "sh", "/light", 0, &d) == ALLOT_OK)
			seen(
			    &l->t_shadow, !d.allowed && !d.shadow_denied, now);
		if (allot_acquire_id(l->a, "lower", "/light", 0, &d) ==
		    ALLOT_OK)
			seen(&l->t_lower, d.limit <= 20.5, now);
		if (allot_acquire_id(l->a, "new", "/light", 0, &d) == ALLOT_OK)
			seen(&l->t_new, d.limit > 10, now);
		atomic_fetch_add(&l->rounds, 1);
		pc_sleep_ms(2);
	}
	return NULL;
}

/* Wait (bounded) until every agent has synced at least twice. */
static void
wait_synced(allot_agent **as, int n)
{
	uint64_t end = pc_now_ms() + 10000;
	for (;;) {
		int ok = 0;
		for (int i = 0; i < n; i++) {
			allot_sync_stats st;
			allot_sync_stats_get(as[i], &st);
			ok += st.connected && st.syncs_ok >= 2;
		}
		if (ok == n)
			return;
		ck_assert_msg(pc_now_ms() < end, "agents did not sync");
		pc_sleep_ms(20);
	}
}

START_TEST(reload_reaches_every_agent_within_2t)
{
	env e;
	env_init(&e);
	pc_write_file(e.c.cfg, CFG_V1);
	start_allotd(&e);
	allot_agent *as[NAGENTS];
	load ls[NAGENTS];
	memset(ls, 0, sizeof ls);
	for (int i = 0; i < NAGENTS; i++) {
		char id[16];
		snprintf(id, sizeof id, "r%d", i);
		as[i] = mkagent(&e, id, NULL);
	}
	wait_synced(as, NAGENTS);
	for (int i = 0; i < NAGENTS; i++) {
		ls[i].a = as[i];
		ck_assert_int_eq(
		    pthread_create(&ls[i].th, NULL, load_main, &ls[i]), 0);
	}
	pc_sleep_ms(4 * T_MS);
	/* Nothing of v2 shows before the change: the signals tell the two
	 * configs apart. */
	for (int i = 0; i < NAGENTS; i++) {
		ck_assert_uint_gt(atomic_load(&ls[i].rounds), 10);
		ck_assert_uint_eq(atomic_load(&ls[i].t_weight), 0);
		ck_assert_uint_eq(atomic_load(&ls[i].t_shadow), 0);
		ck_assert_uint_eq(atomic_load(&ls[i].t_lower), 0);
		ck_assert_uint_eq(atomic_load(&ls[i].t_new), 0);
	}

	/* Measured from when allotd has the change in force: allotctl
	 * apply answers once it is installed. */
	uint64_t t_cmd = pc_now_ms();
	change_config(&e, CFG_V2);
	uint64_t t0 = pc_now_ms();
	fprintf(stderr, "allotctl apply took %llu ms\n",
	    (unsigned long long) (t0 - t_cmd));
	/* Until every agent showed every change, or 10 T. */
	uint64_t end = t0 + 10 * T_MS;
	for (;;) {
		int done = 0;
		for (int i = 0; i < NAGENTS; i++)
			done += atomic_load(&ls[i].t_weight) != 0 &&
			    atomic_load(&ls[i].t_shadow) != 0 &&
			    atomic_load(&ls[i].t_lower) != 0 &&
			    atomic_load(&ls[i].t_new) != 0;
		if (done == NAGENTS || pc_now_ms() > end)
			break;
		pc_sleep_ms(5);
	}
	pc_sleep_ms(2 * T_MS); /* more load on the new config */
	for (int i = 0; i < NAGENTS; i++) {
		atomic_store(&ls[i].stop, true);
		pthread_join(ls[i].th, NULL);
	}
	uint64_t worst = 0;
	uint64_t want = pc_config_digest(CFG_V2);
	for (int i = 0; i < NAGENTS; i++) {
		load *l = &ls[i];
		uint64_t t[4] = { l->t_weight, l->t_shadow, l->t_lower,
			l->t_new };
		long long dt[4];
		for (int k = 0; k < 4; k++) {
			ck_assert_msg(t[k] != 0,
			    "agent %d never showed change %d", i, k);
			/* Not before the change was asked for. */
			ck_assert_uint_ge(t[k], t_cmd);
			dt[k] = (long long) t[k] - (long long) t0;
			if (dt[k] > 0 && (uint64_t) dt[k] > worst)
				worst = (uint64_t) dt[k];
		}
		fprintf(stderr,
		    "agent %d: weight %lld ms, shadow %lld ms, lower %lld ms, "
		    "new %lld ms after the change; %llu rounds\n",
		    i, dt[0], dt[1], dt[2], dt[3],
		    (unsigned long long) l->rounds);
		ck_assert_uint_eq(atomic_load(&l->steady_denied), 0);
		ck_assert_int_eq(atomic_load(&l->errors), 0);
		allot_sync_stats st;
		allot_sync_stats_get(as[i], &st);
		ck_assert_uint_eq(st.enforced_digest, want);
		ck_assert_uint_eq(st.config_digest, want);
		ck_assert_uint_eq(st.config_installs, 1);
		ck_assert_uint_eq(st.config_rejects, 0);
		ck_assert_uint_eq(st.registers, 1); /* no restart */
	}
	fprintf(stderr,
	    "every agent enforced v2 %llu ms after the change "
	    "(2 T = %u ms)\n",
	    (unsigned long long) worst, 2 * T_MS);
	ck_assert_uint_le(worst, 2 * T_MS);
	/* allotctl apply went through the admin socket: audited. */
	char q[400];
	snprintf(q, sizeof q,
	    "sqlite3 -readonly '%s' \"SELECT count(*) FROM "
	    "v_quota_changes WHERE reason = 'config_push test'\"",
	    e.c.db);
	/* Rows land with the group commit, once a second. */
	int rows = 0;
	uint64_t until = pc_now_ms() + 5000;
	while (rows == 0 && pc_now_ms() < until) {
		char *n = pc_shell(q);
		rows = n != NULL ? atoi(n) : 0;
		free(n);
		if (rows == 0)
			pc_sleep_ms(100);
	}
	ck_assert_int_gt(rows, 0);
	/* The new caller's key reached allotd (add_keys): none of its
	 * reports was refused as a key without a quota. */
	ck_assert_double_eq(
	    pc_metric_get(e.c.http,
	        "allotd_rejected_messages_total{reason=\"unknown_key\"}"),
	    0);
	/* One text per agent: none sent again once installed. */
	ck_assert_double_eq(
	    pc_metric_get(e.c.http, "allotd_config_pushes_total"), NAGENTS);
	for (int i = 0; i < NAGENTS; i++)
		allot_agent_destroy(as[i]);
	env_fini(&e);
}
END_TEST

/* The cost steady pays on /heavy now. */
static uint32_t
heavy_cost(allot_agent *a)
{
	allot_decision d;
	ck_assert_int_eq(
	    allot_acquire_id(a, "steady", "/heavy", 0, &d), ALLOT_OK);
	return d.cost;
}

START_TEST(cache_runs_while_allotd_is_down)
{
	env e;
	env_init(&e);
	char cache[160];
	snprintf(cache, sizeof cache, "%s/agent.cache", e.c.dir);
	pc_write_file(e.c.cfg, CFG_V2);
	start_allotd(&e);
	/* A first agent receives v2 and caches it. */
	allot_agent *a = mkagent(&e, "first", cache);
	uint64_t end = pc_now_ms() + 10 * T_MS;
	while (heavy_cost(a) != 5 && pc_now_ms() < end)
		pc_sleep_ms(10);
	ck_assert_uint_eq(heavy_cost(a), 5);
	/* The sync thread writes the cache right after the install that
	 * the cost above already shows. */
	struct stat sb;
	while (stat(cache, &sb) != 0 && pc_now_ms() < end)
		pc_sleep_ms(5);
	ck_assert_int_eq(stat(cache, &sb), 0);
	ck_assert_int_eq(sb.st_mode & 0777, 0600);
	allot_agent_destroy(a);

	/* allotd goes away; a fresh agent with the stale bootstrap (v1)
	 * runs the cached v2 from its first decision. */
	kill(e.c.pid, SIGKILL);
	ck_assert_int_ge(pc_wait_exit(e.c.pid, 5000), 0);
	e.c.pid = 0;
	allot_agent *b = mkagent(&e, "second", cache);
	ck_assert_uint_eq(heavy_cost(b), 5);
	allot_decision d;
	for (int i = 0; i < 20; i++)
		ck_assert_int_eq(
		    allot_acquire_id(b, "sh", "/light", 0, &d), ALLOT_OK);
	ck_assert(!d.allowed && !d.shadow_denied); /* enforced, as in v2 */
	allot_sync_stats st;
	allot_sync_stats_get(b, &st);
	ck_assert_uint_eq(st.enforced_digest, pc_config_digest(CFG_V2));
	ck_assert(!st.connected);

	/* allotd comes back with v3: the agent takes it within 2 T. */
	pc_write_file(e.c.cfg, CFG_V3);
	start_allotd(&e);
	uint64_t t0 = pc_now_ms();
	end = t0 + 20 * T_MS;
	while (heavy_cost(b) != 7 && pc_now_ms() < end)
		pc_sleep_ms(5);
	uint64_t took = pc_now_ms() - t0;
	fprintf(stderr,
	    "the cached agent took v3 %llu ms after allotd "
	    "answered (2 T = %u ms)\n",
	    (unsigned long long) took, 2 * T_MS);
	ck_assert_uint_eq(heavy_cost(b), 7);
	ck_assert_uint_le(took, 2 * T_MS);
	/* The stats follow the install that the cost above shows. */
	end = pc_now_ms() + 10 * T_MS;
	do {
		allot_sync_stats_get(b, &st);
		if (st.enforced_digest == pc_config_digest(CFG_V3))
			break;
		pc_sleep_ms(5);
	} while (pc_now_ms() < end);
	ck_assert_uint_eq(st.enforced_digest, pc_config_digest(CFG_V3));
	ck_assert_uint_eq(st.config_installs, 1);
	allot_agent_destroy(b);

	/* The cache now holds v3, and a cache for another coordinator is
	 * not used: its agent runs its bootstrap file. */
	char *text = pc_read_file(cache);
	ck_assert_ptr_nonnull(text);
	ck_assert_ptr_nonnull(strstr(text, "\"/heavy\": 7"));
	free(text);
	char other[80];
	snprintf(other, sizeof other, "tcp://127.0.0.1:%d", pc_free_port());
	char err[256];
	allot_config *cfg;
	ck_assert_int_eq(
	    allot_config_load(e.boot, err, sizeof err, &cfg), ALLOT_OK);
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.coordinator = other;
	o.service = "svc";
	o.config_cache_file = cache;
	allot_agent *c;
	ck_assert_int_eq(allot_agent_create(cfg, &o, &c), ALLOT_OK);
	allot_config_free(cfg);
	ck_assert_uint_eq(heavy_cost(c), 1);
	allot_agent_destroy(c);
	env_fini(&e);
}
END_TEST

/* One file for many services: the whole file goes to every agent, whose
 * digest is the file's, and each enforces its own service's view. */
START_TEST(each_service_takes_its_view)
{
	env e;
	env_init(&e);
	pc_write_file(e.c.cfg, CFG_V1);
	start_allotd(&e);
	char err[256];
	allot_agent *as[2];
	const char *svc[2] = { "svc", "other" };
	for (int i = 0; i < 2; i++) {
		allot_config *cfg;
		ck_assert_int_eq(
		    allot_config_load(e.boot, err, sizeof err, &cfg),
		    ALLOT_OK);
		allot_agent_options o;
		allot_agent_options_init(&o);
		o.coordinator = e.c.url;
		o.service = svc[i];
		o.sync_interval_ms = T_MS;
		ck_assert_int_eq(
		    allot_agent_create(cfg, &o, &as[i]), ALLOT_OK);
		allot_config_free(cfg);
	}
	wait_synced(as, 2);
	size_t n = strlen(CFG_V1) + 200;
	char *v = malloc(n);
	ck_assert_ptr_nonnull(v);
	snprintf(v, n,
	    "%sservices:\n  svc:\n    callers:\n      - identity: scoped\n"
	    "        tokens_per_second: 50\n        burst: 50\n",
	    CFG_V1);
	change_config(&e, v);
	uint64_t want = pc_config_digest(v);
	uint64_t end = pc_now_ms() + 10 * T_MS;
	allot_sync_stats st[2];
	for (;;) {
		allot_sync_stats_get(as[0], &st[0]);
		allot_sync_stats_get(as[1], &st[1]);
		if ((st[0].enforced_digest == want &&
		        st[1].enforced_digest == want) ||
		    pc_now_ms() > end)
			break;
		pc_sleep_ms(5);
	}
	for (int i = 0; i < 2; i++) {
		ck_assert_uint_eq(st[i].enforced_digest, want);
		ck_assert_uint_eq(st[i].config_installs, 1);
		allot_key *k;
		ck_assert_int_eq(
		    allot_key_resolve(as[i], "scoped", "/light", &k),
		    ALLOT_OK);
		allot_key_stats ks;
		allot_key_stats_get(as[i], k, &ks);
		allot_key_release(as[i], k);
		/* Known in svc's view only; "other" charges its default. */
		ck_assert_int_eq(ks.known, i == 0);
		allot_decision d;
		ck_assert_int_eq(
		    allot_acquire_id(as[i], "scoped", "/light", 0, &d),
		    ALLOT_OK);
		if (i == 0)
			ck_assert(d.limit > 8 && d.limit <= 50);
		else
			ck_assert(d.limit <= 8);
	}
	free(v);
	for (int i = 0; i < 2; i++)
		allot_agent_destroy(as[i]);
	env_fini(&e);
}
END_TEST

static Suite *
push_suite(void)
{
	Suite *s = suite_create("config_push");
	TCase *tc = tcase_create("allotd");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, reload_reaches_every_agent_within_2t);
	tcase_add_test(tc, cache_runs_while_allotd_is_down);
	tcase_add_test(tc, each_service_takes_its_view);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(push_suite)
