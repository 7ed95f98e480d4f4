/* SPDX-License-Identifier: MIT */
/*
 * Fault: allotd killed with SIGKILL and restarted on the same database,
 * five times, while three agents run under load. Asserts that no request
 * fails because of the limiter (the steady caller, offered half its
 * share, is never denied and no acquire returns an error), that agents
 * keep their allowance while the lease runs (fail-static) and then run
 * their fallback (static share R / n), that a short outage never reaches
 * the fallback, that over-admission stays within the design's bound
 * B + R(W + T), that the agents' rates, sampled every 10 ms through
 * each restart, never sum above R (the restored placeholders hold the
 * share of the agents not back yet), and that every row a reader saw
 * committed before a kill is still there after the restart.
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "proc.h"
#include "runner.h"

#define AGENTS 3
#define CYCLES 5

/* What a reader sees committed: row counts and high-water marks. */
typedef struct rows {
	long long replicas, max_session, events, max_event, configs,
	    max_config, usage, max_at, admitted;
} rows;

/* Samples the sum of the agents' greedy rates every 10 ms, on its own
 * thread while the test waits for the agents to come back. */
typedef struct sampler {
	allot_agent **as;
	int n;
	_Atomic bool stop;
	double worst;
	pthread_t th;
} sampler;

static void *
sample_main(void *arg)
{
	sampler *sp = arg;
	while (!atomic_load(&sp->stop)) {
		double sum = 0;
		for (int i = 0; i < sp->n; i++)
			sum += fault_rate(sp->as[i], "greedy");
		if (sum > sp->worst)
			sp->worst = sum;
		pc_sleep_ms(10);
	}
	return NULL;
}

static void
sampler_start(sampler *sp, allot_agent **as, int n)
{
	sp->as = as;
	sp->n = n;
	sp->worst = 0;
	atomic_store(&sp->stop, false);
	ck_assert_int_eq(pthread_create(&sp->th, NULL, sample_main, sp), 0);
}

static double
sampler_stop(sampler *sp)
{
	atomic_store(&sp->stop, true);
	pthread_join(sp->th, NULL);
	return sp->worst;
}

static void
rows_before(const char *db, rows *r)
{
	char *out = fault_sql(db,
	    "SELECT (SELECT count(*) FROM replicas), "
	    "(SELECT coalesce(max(session), 0) FROM replicas), "
	    "(SELECT count(*) FROM events), "
	    "(SELECT coalesce(max(id), 0) FROM events), "
	    "(SELECT count(*) FROM configs), "
	    "(SELECT coalesce(max(id), 0) FROM configs), "
	    "(SELECT count(*) FROM usage), "
	    "(SELECT coalesce(max(at), 0) FROM usage), "
	    "(SELECT coalesce(sum(admitted), 0) FROM usage)");
	ck_assert_ptr_nonnull(out);
	int n = sscanf(out, "%lld|%lld|%lld|%lld|%lld|%lld|%lld|%lld|%lld",
	    &r->replicas, &r->max_session, &r->events, &r->max_event,
	    &r->configs, &r->max_config, &r->usage, &r->max_at, &r->admitted);
	ck_assert_msg(n == 9, "unexpected sqlite3 output: %s", out);
	free(out);
}

/* The rows of `b` that are still there: the same rows, by key. */
static void
rows_after(const char *db, const rows *b, rows *r)
{
	char sql[640];
	snprintf(sql, sizeof sql,
	    "SELECT (SELECT count(*) FROM replicas WHERE session <= %lld), "
	    "(SELECT count(*) FROM events WHERE id <= %lld), "
	    "(SELECT count(*) FROM configs WHERE id <= %lld), "
	    "(SELECT count(*) FROM usage WHERE at <= %lld), "
	    "(SELECT coalesce(sum(admitted), 0) FROM usage WHERE at <= %lld)",
	    b->max_session, b->max_event, b->max_config, b->max_at, b->max_at);
	char *out = fault_sql(db, sql);
	ck_assert_ptr_nonnull(out);
	memset(r, 0, sizeof *r);
	ck_assert_msg(
	    sscanf(out, "%lld|%lld|%lld|%lld|%lld", &r->replicas, &r->events,
	        &r->configs, &r->usage, &r->admitted) == 5,
	    "unexpected sqlite3 output: %s", out);
	free(out);
}

START_TEST(sigkill_restart_under_load)
{
	fault_env e;
	fault_env_init(&e, "restart", NULL);
	fault_allotd_start(&e);
	allot_agent *as[AGENTS];
	fault_load ld[AGENTS];
	for (int i = 0; i < AGENTS; i++) {
		char id[16];
		snprintf(id, sizeof id, "r%d", i);
		as[i] = fault_agent(e.c.url, id);
	}
	fault_await_synced(as, AGENTS, 1, 10000);
	for (int i = 0; i < AGENTS; i++)
		fault_load_start(&ld[i], as[i], 90000);
	pc_sleep_ms(500);

	fault_counts c0, c1;
	fault_counts_get(ld, AGENTS, &c0);
	uint64_t w0 = pc_now_ms();
	uint64_t worst_recovery = 0, total_recovery = 0;
	uint64_t first_fallback_ms = UINT64_MAX, rows_checked = 0;
	int fallbacks_seen = 0;
	double worst_sum = 0;
	for (int cycle = 0; cycle < CYCLES; cycle++) {
		/* Odd cycles stay down past the lease, even ones do not. */
		bool long_outage = cycle % 2 == 1;
		uint64_t down_ms = long_outage ? FAULT_LEASE_MS + 500 : 300;
		/* At least one group commit (every second) since the last
		 * start, then what a reader sees. */
		pc_sleep_ms(1200);
		rows b, a;
		rows_before(e.c.db, &b);
		ck_assert_int_gt(b.replicas, 0);
		uint64_t enters[AGENTS];
		for (int i = 0; i < AGENTS; i++) {
			allot_sync_stats ss;
			allot_sync_stats_get(as[i], &ss);
			enters[i] = ss.fallback_enters;
		}

		uint64_t killed = pc_now_ms();
		ck_assert_int_eq(
		    fault_allotd_stop(&e, SIGKILL), 128 + SIGKILL);
		/* Replies already on the wire have landed by now; from here
		 * on the allowance in force is the last one. */
		pc_sleep_ms(20);
		double last[AGENTS];
		uint32_t replicas[AGENTS];
		for (int i = 0; i < AGENTS; i++) {
			allot_sync_stats ss;
			allot_sync_stats_get(as[i], &ss);
			last[i] = fault_rate(as[i], "greedy");
			replicas[i] = ss.replicas;
			ck_assert(!ss.in_fallback);
		}
		while (pc_now_ms() - killed < down_ms) {
			for (int i = 0; i < AGENTS; i++) {
				allot_sync_stats ss;
				allot_sync_stats_get(as[i], &ss);
				double g = fault_rate(as[i], "greedy");
				if (!ss.in_fallback) {
					/* Fail-static: the last allowance. */
					ck_assert_msg(fabs(g - last[i]) <=
					        1e-9 * last[i],
					    "agent %d: %.3f/s, last allowance "
					    "%.3f/s",
					    i, g, last[i]);
					continue;
				}
				/* Fallback: static share, never before the
				 * lease can have run out. */
				uint64_t at = pc_now_ms() - killed;
				if (at < first_fallback_ms)
					first_fallback_ms = at;
				ck_assert_uint_ge(
				    at, FAULT_LEASE_MS - 2 * FAULT_T_MS);
				ck_assert_msg(
				    fabs(g - FAULT_R / replicas[i]) < 1e-6,
				    "agent %d falls back to %.3f/s", i, g);
			}
			pc_sleep_ms(5);
		}
		for (int i = 0; i < AGENTS; i++) {
			allot_sync_stats ss;
			allot_sync_stats_get(as[i], &ss);
			ck_assert_uint_eq(ss.fallback_enters,
			    enters[i] + (long_outage ? 1 : 0));
			fallbacks_seen += long_outage;
		}

		uint64_t restarted = pc_now_ms();
		sampler sp;
		sampler_start(&sp, as, AGENTS);
		fault_allotd_start(&e);
		rows_after(e.c.db, &b, &a);
		ck_assert_int_eq(a.replicas, b.replicas);
		ck_assert_int_eq(a.events, b.events);
		ck_assert_int_eq(a.configs, b.configs);
		ck_assert_int_ge(a.usage, b.usage);
		ck_assert_int_ge(a.admitted, b.admitted);
		rows_checked += (uint64_t) (b.replicas + b.events + b.configs +
		    b.usage);
		fault_await_synced(as, AGENTS, (uint64_t) cycle + 2, 10000);
		uint64_t rec = pc_now_ms() - restarted;
		/* Through the agents' return (their backoff is at most 4 T
		 * here) and well after. */
		while (pc_now_ms() - restarted < 1500)
			pc_sleep_ms(10);
		double sum = sampler_stop(&sp);
		if (sum > worst_sum)
			worst_sum = sum;
		ck_assert_msg(sum <= FAULT_R * (1 + 1e-9),
		    "cycle %d: the agents' rates sum to %.3f/s, R %.0f/s",
		    cycle, sum, FAULT_R);
		/* Where failed requests come from, for the log. */
		for (int i = 0; i < AGENTS; i++) {
			unsigned long long den = atomic_load(
			    &ld[i].steady_denied);
			printf("cycle %d (%s outage): agent %d: %llu steady "
			       "denials so far\n",
			    cycle, long_outage ? "long" : "short", i, den);
		}
		fflush(stdout);
		total_recovery += rec;
		if (rec > worst_recovery)
			worst_recovery = rec;
	}
	uint64_t w1 = pc_now_ms();
	fault_counts_get(ld, AGENTS, &c1);
	for (int i = 0; i < AGENTS; i++)
		fault_load_stop(&ld[i]);

	char *integrity = fault_sql(e.c.db, "PRAGMA integrity_check");
	ck_assert_str_eq(integrity, "ok");
	free(integrity);

	uint64_t requests = c1.steady_ok + c1.steady_failed;
	uint64_t failed = c1.steady_failed + c1.greedy_err;
	uint64_t window = w1 - w0;
	double over = fault_over_rt(c1.greedy_ok - c0.greedy_ok, window);
	uint64_t unreported = 0;
	for (int i = 0; i < AGENTS; i++) {
		allot_sync_stats ss;
		allot_sync_stats_get(as[i], &ss);
		unreported += ss.unreported_tokens;
	}

	fault_figures f = {
		.id = "1-restart",
		.fault = "allotd killed (SIGKILL) and restarted, 5 times, "
		         "under load",
		.promised = "no request fails; last allowance for the lease, "
		            "then fallback; no committed row lost",
		.requests = requests,
		.failed = failed,
		.over_rt = over,
		.recovery_ms = (double) worst_recovery,
	};
	snprintf(f.measured, sizeof f.measured,
	    "window %.1f s; fallback entered %.0f ms after the kill "
	    "(lease %u ms); recovery mean %.0f ms; %llu committed rows "
	    "checked, 0 missing; %llu tokens unreported across sessions; "
	    "sum of rates after a restart at most %.3f R",
	    (double) window / 1000.0, (double) first_fallback_ms,
	    FAULT_LEASE_MS, (double) total_recovery / CYCLES,
	    (unsigned long long) rows_checked, (unsigned long long) unreported,
	    worst_sum / FAULT_R);
	fault_report(&f);

	ck_assert_int_gt(fallbacks_seen, 0);
	ck_assert_msg(failed == 0,
	    "%llu of %llu requests below their share "
	    "failed",
	    (unsigned long long) failed, (unsigned long long) requests);
	/* Over any window: at most B + R(W + T). */
	ck_assert_msg(over <= (FAULT_B_GREEDY + FAULT_R * FAULT_T_MS / 1e3) /
	            (FAULT_R * FAULT_T_MS / 1e3),
	    "over-admission %.2f R.T", over);

	for (int i = 0; i < AGENTS; i++)
		allot_agent_destroy(as[i]);
	fault_env_fini(&e);
}
END_TEST

static Suite *
restart_suite(void)
{
	Suite *s = suite_create("fault-restart");
	TCase *tc = tcase_create("sigkill");
	tcase_set_timeout(tc, 110);
	tcase_add_test(tc, sigkill_restart_under_load);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(restart_suite)
