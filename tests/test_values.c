/* SPDX-License-Identifier: MIT */
/*
 * Per-value buckets (docs/configuration.md, "A bucket per value"): with
 * `shared: false` on the default quota, each unknown caller (each value
 * of the identity passed: a user id, an API key) has a bucket of its own
 * with the default's rate and burst, one bucket whatever endpoints it
 * calls; bounded by the unknown-identity pool, an idle value evicted and
 * costing nothing after; and a value active on several replicas held to
 * its quota across them by allotd.
 *
 * The first cases run local agents on a virtual clock; the last runs
 * two replicas against a real allotd.
 */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <allot/allot.h>

#include "agent_int.h"
#include "allotd.h"
#include "keymodel.h"
#include "proc.h"
#include "proto_client.h"
#include "runner.h"
#include "values.h"

#define HEAD                                               \
	"quotas:\n"                                        \
	"  endpoint_weights: {default: 1, /a: 1, /b: 1}\n" \
	"  callers:\n"                                     \
	"    - {identity: known, tokens_per_second: 1, burst: 2}\n"

#define PER_VALUE \
	HEAD "  default: {tokens_per_second: 1, burst: 3, shared: false}\n"
#define SHARED HEAD "  default: {tokens_per_second: 1, burst: 3}\n"

START_TEST(a_bucket_per_value)
{
	allot_agent *a = km_local_agent(PER_VALUE);
	allot_decision d;
	/* Each value its own burst of 3; the configured caller its own. */
	ck_assert_int_eq(km_admitted(a, "user-1", "/a", 5), 3);
	ck_assert_int_eq(km_admitted(a, "user-2", "/a", 5), 3);
	ck_assert_int_eq(km_admitted(a, "known", "/a", 5), 2);
	/* One bucket per value, whatever endpoint it calls. */
	ck_assert_int_eq(km_admitted(a, "user-1", "/b", 2), 0);
	ck_assert_int_eq(km_admitted(a, "user-1", NULL, 2), 0);
	/* Refilled at the default's rate, each apart. */
	km_advance_ms(1000);
	ck_assert(km_ask(a, "user-1", "/b", &d));
	ck_assert(!km_ask(a, "user-1", "/a", &d));
	ck_assert(d.retry_after_ns > 0);
	ck_assert(fabs(d.limit - 3) < 1e-9 && fabs(d.rate - 1) < 1e-9);
	ck_assert_str_eq(km_bound_by(a, "user-1", "/a", &d), "default");
	ck_assert(km_ask(a, "user-2", "/a", NULL));
	/* The default quota counts every value's decisions. */
	allot__ktotals t = km_totals(a, "default");
	ck_assert_uint_eq(t.allowed, 3 + 3 + 1 + 1);
	ck_assert_uint_eq(t.denied, 2 + 2 + 2 + 2 + 1);
	ck_assert_uint_eq(allot__values_held(a), 2);
	/* A value's statistics are its own bucket's: user-2 spent, a new
	 * value full. */
	allot_key *k;
	allot_key_stats ks;
	ck_assert_int_eq(allot_key_resolve(a, "user-2", "/a", &k), ALLOT_OK);
	ck_assert_int_eq(allot_key_stats_get(a, k, &ks), ALLOT_OK);
	ck_assert(fabs(ks.limit - 3) < 1e-9 && ks.utilization > 0.9);
	ck_assert_str_eq(ks.quota, "default");
	allot_key_release(a, k);
	ck_assert_int_eq(allot_key_resolve(a, "user-9", "/a", &k), ALLOT_OK);
	ck_assert_int_eq(allot_key_stats_get(a, k, &ks), ALLOT_OK);
	ck_assert(ks.utilization < 1e-9);
	allot_key_release(a, k);
	allot_agent_destroy(a);

	/* shared: true, as before: one bucket for every unknown caller. */
	a = km_local_agent(SHARED);
	ck_assert_int_eq(km_admitted(a, "user-1", "/a", 5), 3);
	ck_assert_int_eq(km_admitted(a, "user-2", "/a", 5), 0);
	ck_assert_uint_eq(allot__values_held(a), 0);
	allot_agent_destroy(a);
}
END_TEST

/* A caller "*" stacked over the values caps them together: a value's
 * own bucket and the level, all or none. */
START_TEST(star_caps_values)
{
	allot_agent *a = km_local_agent(
	    "quotas:\n"
	    "  default: {tokens_per_second: 1, burst: 3, shared: false}\n"
	    "  callers:\n"
	    "    - {identity: \"*\", tokens_per_second: 1, burst: 5}\n");
	allot_decision d;
	ck_assert_int_eq(km_admitted(a, "user-1", NULL, 4), 3);
	ck_assert_int_eq(km_admitted(a, "user-2", NULL, 4), 2);
	ck_assert(!km_ask(a, "user-3", NULL, &d));
	ck_assert_str_eq(km_bound_by(a, "user-3", NULL, &d), "*");
	/* The level's refusal gave user-3's own token back. */
	km_advance_ms(1000);
	ck_assert(km_ask(a, "user-3", NULL, &d));
	ck_assert(fabs(d.limit - 3) < 1e-9 || fabs(d.limit - 5) < 1e-9);
	ck_assert_int_eq(km_admitted(a, "user-3", NULL, 3), 0);
	allot_agent_destroy(a);
}
END_TEST

/* A reload switches the default between shared and per value, live. */
START_TEST(reload_switches)
{
	allot_agent *a = km_local_agent(SHARED);
	ck_assert_int_eq(km_admitted(a, "user-1", "/a", 3), 3);
	ck_assert_int_eq(km_admitted(a, "user-2", "/a", 1), 0);
	allot_config *cfg = km_parse(PER_VALUE);
	ck_assert_int_eq(allot_agent_set_config(a, cfg), ALLOT_OK);
	allot_config_free(cfg);
	/* Held keys now charge buckets of their own, full. */
	ck_assert_uint_eq(allot__values_held(a), 2);
	ck_assert_int_eq(km_admitted(a, "user-1", "/a", 4), 3);
	ck_assert_int_eq(km_admitted(a, "user-2", "/a", 4), 3);
	ck_assert_int_eq(km_admitted(a, "user-3", "/a", 4), 3);
	/* A lower rate and burst reach every value's bucket. */
	cfg = km_parse(HEAD "  default: {tokens_per_second: 1, burst: 1, "
	                    "shared: false}\n");
	ck_assert_int_eq(allot_agent_set_config(a, cfg), ALLOT_OK);
	allot_config_free(cfg);
	km_advance_ms(5000);
	ck_assert_int_eq(km_admitted(a, "user-1", "/a", 3), 1);
	/* And back to one shared bucket. */
	cfg = km_parse(SHARED);
	ck_assert_int_eq(allot_agent_set_config(a, cfg), ALLOT_OK);
	allot_config_free(cfg);
	ck_assert_uint_eq(allot__values_held(a), 0);
	km_advance_ms(5000);
	ck_assert_int_eq(km_admitted(a, "user-1", "/a", 2), 2);
	ck_assert_int_eq(km_admitted(a, "user-2", "/a", 2), 1);
	allot_agent_destroy(a);
}
END_TEST

/* A local agent of `y` on the virtual clock, its pool `cap` keys
 * evicted after `idle_ms`. */
static allot_agent *
pool_agent(const char *y, uint32_t cap, uint32_t idle_ms)
{
	allot_config *cfg = km_parse(y);
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.clock = km_clock;
	o.max_unknown_keys = cap;
	o.idle_evict_ms = idle_ms;
	allot_agent *a;
	ck_assert_int_eq(allot_agent_create(cfg, &o, &a), ALLOT_OK);
	allot_config_free(cfg);
	return a;
}

/* Two sweeps an idle period apart: the first notes, the second evicts
 * (what inserts do once the pool is 3/4 full). */
static void
sweep_twice(allot_agent *a, uint64_t gap_ms)
{
	for (int i = 0; i < 2; i++) {
		km_advance_ms(gap_ms);
		allot__agent_sweep(a, allot__agent_now(a));
	}
}

/* A value leaves the pool only with a full bucket: one idle past the
 * pool's idle period whose bucket has not refilled (a per-minute
 * quota's) stays, and its next request is still refused; refilled, it
 * goes, and costs nothing. */
START_TEST(spent_values_stay)
{
	allot_agent *a = pool_agent(
	    "quotas:\n"
	    "  default: {tokens_per_minute: 6, burst: 3, shared: false}\n",
	    64, 200);
	ck_assert_int_eq(km_admitted(a, "user-1", NULL, 4), 3);
	sweep_twice(a, 300);
	ck_assert_uint_eq(allot__values_held(a), 1);
	ck_assert(!km_ask(a, "user-1", NULL, NULL));
	/* 3 tokens at 0.1/s: 30 s to refill. */
	sweep_twice(a, 31000);
	ck_assert_uint_eq(allot__values_held(a), 0);
	ck_assert_int_eq(km_admitted(a, "user-1", NULL, 4), 3);
	allot_agent_destroy(a);
}
END_TEST

/* Resident memory of the process, bytes. */
static size_t
rss_bytes(void)
{
	FILE *f = fopen("/proc/self/statm", "r");
	unsigned long size = 0, res = 0;
	ck_assert_ptr_nonnull(f);
	ck_assert_int_eq(fscanf(f, "%lu %lu", &size, &res), 2);
	fclose(f);
	return (size_t) res * (size_t) sysconf(_SC_PAGESIZE);
}

/* 100,000 distinct values, a new one every 2 ms, through an agent that
 * holds 1,024: never more than 1,024 held, each admitted its first
 * request (idle ones make room), memory within the documented bound per
 * pool slot (docs/configuration.md, "Memory"), and no more after a
 * second 100,000; idle, they cost nothing: the pool empties. */
START_TEST(values_bounded)
{
	enum { CAP = 1024, N = 100000 };
	allot_agent *a = pool_agent(PER_VALUE, CAP, 200);
	size_t rss0 = rss_bytes();
	char id[64];
	size_t rss1 = 0;
	uint32_t most = 0;
	for (int round = 0; round < 2; round++) {
		int admitted = 0;
		for (int i = 0; i < N; i++) {
			snprintf(id, sizeof id, "user-%d-%d", round, i);
			admitted += km_ask(a, id, (i & 1) ? "/a" : "/b", NULL);
			uint32_t held = allot__values_held(a);
			most = held > most ? held : most;
			km_advance_ms(2);
		}
		/* The pool made room for each in time: a value idle 200 ms
		 * is evicted by the first sweep once the previous one saw
		 * it (sweeps run when the pool is full, at most every
		 * 50 ms): at most about 250 values live at a time. */
		ck_assert_int_eq(admitted, N);
		if (round == 0)
			rss1 = rss_bytes();
	}
	size_t rss2 = rss_bytes();
	ck_assert_uint_le(most, CAP);
	/* Idle and refilled: one sweep notes them, the next evicts. */
	sweep_twice(a, 5000);
	ck_assert_uint_eq(allot__values_held(a), 0);
	double per_slot = (double) (rss1 > rss0 ? rss1 - rss0 : 0) / CAP;
	fprintf(stderr,
	    "values: %d distinct values through a pool of %d: at most %u "
	    "held; resident memory +%.0f bytes per pool slot, +%zu KB after "
	    "another %d; sizeof(allot__vbucket) = %zu\n",
	    2 * N, CAP, most, per_slot, (rss2 > rss1 ? rss2 - rss1 : 0) / 1024,
	    N, sizeof(allot__vbucket));
	/* docs/configuration.md, "Memory": a pool slot is about 540 bytes
	 * and its value's bucket 536 more; nothing grows past the pool.
	 * (Under AddressSanitizer resident memory says nothing of ours.) */
#if !defined(__SANITIZE_ADDRESS__)
	ck_assert(per_slot < 2048);
	ck_assert_uint_le(rss2, rss1 + 256 * 1024);
#endif
	allot_agent_destroy(a);
}
END_TEST

START_TEST(config_rules)
{
	/* A bucket per caller has no sum a ceiling could hold. */
	km_refused(PER_VALUE "  global_ceiling: {tokens_per_second: 100}\n",
	    "shared: false (a bucket of its own for each unknown caller)");
	/* shared is the default's alone. */
	km_refused("quotas:\n"
	           "  default: {tokens_per_second: 1, burst: 3}\n"
	           "  callers:\n"
	           "    - {identity: x, tokens_per_second: 1, burst: 2, "
	           "shared: false}\n",
	    "unknown key \"shared\" in quotas.callers[0]");
}
END_TEST

/* Requests of `id` on replica `a` for `ms`, paced: admitted. */
static int
paced(allot_agent *a, const char *id, int pace_ms, uint64_t until_ms)
{
	int ok = 0;
	while (pc_now_ms() < until_ms) {
		ok += km_ask(a, id, "/a", NULL);
		pc_sleep_ms((unsigned) pace_ms);
	}
	return ok;
}

typedef struct load {
	allot_agent *a;
	const char *id;
	uint64_t until;
	int ok;
} load;

static void *
load_run(void *arg)
{
	load *l = arg;
	l->ok = paced(l->a, l->id, 2, l->until);
	return NULL;
}

/* Against allotd, two replicas: a value active on both is held to its
 * quota across them (each gets its part, Reply.values), a value active
 * on one replica alone runs on the whole quota there, and allotd books
 * both in the default quota's audit. */
START_TEST(global_across_replicas)
{
	static const char *cfg =
	    "quotas:\n"
	    "  endpoint_weights: {default: 1, /a: 1}\n"
	    "  default: {tokens_per_second: 40, burst: 10, shared: false}\n";
	pc_coord c;
	pc_coord_init(&c, "/tmp/allot-values", cfg);
	const char *args[] = { "--interval-ms", "50", NULL };
	pc_coord_spawn(&c, args, NULL);
	allot_agent *as[2] = { km_remote_agent(&c, "r0", cfg),
		km_remote_agent(&c, "r1", cfg) };
	km_synced(as, 2);
	uint64_t t0 = pc_now_ms(), until = t0 + 3000;
	/* "both" on the two replicas, "solo" on r0 only: each asked about
	 * 500 times a second per thread, far above its 40/s. */
	load ls[3] = { { as[0], "both", until, 0 },
		{ as[1], "both", until, 0 }, { as[0], "solo", until, 0 } };
	pthread_t th[3];
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(
		    pthread_create(&th[i], NULL, load_run, &ls[i]), 0);
	for (int i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
	double secs = (double) (pc_now_ms() - t0) / 1e3;
	int both = ls[0].ok + ls[1].ok, solo = ls[2].ok;
	/* allotd splits the two values (reported in the last 3 s). */
	ck_assert(
	    pc_metric_get(c.http, "allotd_values{service=\"svc\"}") == 2);
	/* The bound: R t + B, plus what the second replica's own full
	 * bucket and one interval of its rate could add before its first
	 * part arrived (docs/allocation.md, "Per-value buckets"). */
	double bound = 40 * secs + 10 + 10 + 40 * 0.1;
	fprintf(stderr,
	    "values: \"both\" on two replicas admitted %d (%d + %d) in "
	    "%.2f s, bound %.0f (R = 40/s, B = 10); \"solo\" on one "
	    "replica %d (the whole quota: %.0f)\n",
	    both, ls[0].ok, ls[1].ok, secs, bound, solo, 40 * secs + 10);
	ck_assert_int_le(both, (int) bound);
	ck_assert_int_ge(both, (int) (40 * secs * 0.8));
	/* Each replica served its part, not one starved. */
	ck_assert_int_ge(ls[0].ok, (int) (40 * secs * 0.25));
	ck_assert_int_ge(ls[1].ok, (int) (40 * secs * 0.25));
	/* Alone on r0, "solo" got the whole quota, not a split. */
	ck_assert_int_ge(solo, (int) (40 * secs * 0.85));
	ck_assert_int_le(solo, (int) (40 * secs + 10 + 2));
	/* Each replica holds "both" at its part, told by allotd. */
	for (int i = 0; i < 2; i++) {
		pthread_mutex_lock(&as[i]->dyn_lock);
		uint32_t reps = 0;
		for (uint32_t j = 0; j < as[i]->dyn_cap; j++)
			if (as[i]->vals[j].refs > 0 &&
			    strcmp(as[i]->vals[j].value, "both") == 0)
				reps = as[i]->vals[j].replicas;
		pthread_mutex_unlock(&as[i]->dyn_lock);
		ck_assert_uint_eq(reps, 2);
	}
	for (int i = 0; i < 2; i++)
		allot_agent_destroy(as[i]);
	pc_coord_done(&c, 5000);
}
END_TEST

/* The hostile cases' quota file: R = 100/s, B = 10 per value. */
#define HOSTILE_CFG \
	"quotas:\n" \
	"  default: {tokens_per_second: 100, burst: 10, shared: false}\n"

typedef struct fakes {
	const char *url;
	_Atomic bool stop;
	int syncs;
} fakes;

/* Three replicas that register for the service and claim, every 50 ms,
 * a million denied tokens of value "victim" (Sync.values), and nothing
 * else. */
static void *
fakes_run(void *arg)
{
	fakes *f = arg;
	pc_replica r[3];
	memset(r, 0, sizeof r);
	const char *keys[] = { "default" };
	for (int i = 0; i < 3; i++) {
		char id[32];
		snprintf(id, sizeof id, "fake-%d", i);
		ck_assert_int_eq(
		    pc_replica_join(&r[i], f->url, id, "svc", keys, 1), 0);
	}
	while (!atomic_load(&f->stop)) {
		for (int i = 0; i < 3; i++) {
			Allot__V1__ValueReport vr;
			allot__v1__value_report__init(&vr);
			vr.key = 0;
			vr.value = "victim";
			vr.denied = 1000000;
			Allot__V1__ValueReport *vp = &vr;
			Allot__V1__Sync sy = ALLOT__V1__SYNC__INIT;
			sy.n_values = 1;
			sy.values = &vp;
			Allot__V1__Envelope *e = pc_replica_send(
			    &r[i], &sy, 50);
			if (e != NULL && pc_error_code(e) < 0)
				f->syncs++;
			pc_free(e);
		}
		pc_sleep_ms(50);
	}
	for (int i = 0; i < 3; i++)
		pc_replica_close(&r[i]);
	return NULL;
}

/* Three fake replicas of the service claim a value far above its rate:
 * the honest replica that serves it at a quarter of R still gets its
 * traffic admitted (its part is max-min fair: at least min(its
 * traffic, R / n)), where a split in proportion to the claims left it
 * 9 % of R and 22 of its 60 requests. */
START_TEST(claims_cannot_starve_a_value)
{
	pc_coord c;
	pc_coord_init(&c, "/tmp/allot-values-fake", HOSTILE_CFG);
	const char *args[] = { "--interval-ms", "50", NULL };
	pc_coord_spawn(&c, args, NULL);
	allot_agent *a = km_remote_agent(&c, "honest", HOSTILE_CFG);
	km_synced(&a, 1);
	fakes f = { .url = c.url };
	pthread_t th;
	ck_assert_int_eq(pthread_create(&th, NULL, fakes_run, &f), 0);
	pc_sleep_ms(500); /* the claims are in */
	/* 20 requests a second for 3 s: a fifth of R, below R / 4. */
	int ok = 0, asked = 0;
	uint64_t t0 = pc_now_ms();
	while (pc_now_ms() - t0 < 3000) {
		ok += km_ask(a, "victim", NULL, NULL);
		asked++;
		pc_sleep_ms(50);
	}
	atomic_store(&f.stop, true);
	pthread_join(th, NULL);
	pthread_mutex_lock(&a->dyn_lock);
	uint32_t reps = 0;
	double rate = 0;
	for (uint32_t j = 0; j < a->dyn_cap; j++)
		if (a->vals[j].refs > 0 &&
		    strcmp(a->vals[j].value, "victim") == 0) {
			reps = a->vals[j].replicas;
			rate = a->vals[j].share_rate;
		}
	pthread_mutex_unlock(&a->dyn_lock);
	fprintf(stderr,
	    "values: three fakes claiming \"victim\" (%d Syncs): the "
	    "honest replica admitted %d of %d at 20/s, its part %.1f/s of "
	    "100 over %u replicas\n",
	    f.syncs, ok, asked, rate, reps);
	ck_assert_int_gt(f.syncs, 30);
	ck_assert_uint_eq(reps, 4);
	/* Its claim (20/s with headroom) is above R / 4: the equal part. */
	ck_assert(rate > 20 && rate <= 25.01);
	ck_assert_int_ge(ok, asked - 2);
	allot_agent_destroy(a);
	pc_coord_done(&c, 5000);
}
END_TEST

/* One replica reporting 10,240 distinct values: allotd splits at most
 * 8,192 of them for it (one peer cannot fill the service's table), the
 * rest counted unsplit. */
START_TEST(one_session_cannot_fill_the_table)
{
	pc_coord c;
	pc_coord_init(&c, "/tmp/allot-values-flood", HOSTILE_CFG);
	pc_coord_spawn(&c, NULL, NULL);
	pc_replica r;
	memset(&r, 0, sizeof r);
	const char *keys[] = { "default" };
	ck_assert_int_eq(
	    pc_replica_join(&r, c.url, "flood", "svc", keys, 1), 0);
	static char names[256][32];
	Allot__V1__ValueReport vr[256], *vp[256];
	uint32_t answered = 0;
	for (int m = 0; m < 40; m++) {
		for (int i = 0; i < 256; i++) {
			snprintf(names[i], sizeof names[i], "v-%d-%d", m, i);
			allot__v1__value_report__init(&vr[i]);
			vr[i].value = names[i];
			vr[i].admitted = 1;
			vp[i] = &vr[i];
		}
		Allot__V1__Sync sy = ALLOT__V1__SYNC__INIT;
		sy.n_values = 256;
		sy.values = vp;
		Allot__V1__Envelope *e = pc_replica_send(&r, &sy, 100);
		ck_assert_ptr_nonnull(e);
		ck_assert_int_eq(
		    e->body_case, ALLOT__V1__ENVELOPE__BODY_REPLY);
		answered += (uint32_t) e->reply->n_values;
		pc_free(e);
	}
	double held = pc_metric_get(c.http, "allotd_values{service=\"svc\"}");
	double unsplit = pc_metric_get(
	    c.http, "allotd_values_unsplit_total{service=\"svc\"}");
	fprintf(stderr,
	    "values: one replica reported 10,240 values: %u answered, %.0f "
	    "held, %.0f unsplit\n",
	    answered, held, unsplit);
	ck_assert_uint_eq(answered, 8192);
	ck_assert(held == 8192 && unsplit == 2048);
	pc_replica_close(&r);
	pc_coord_done(&c, 5000);
}
END_TEST

static Suite *
values_suite(void)
{
	Suite *s = suite_create("values");
	TCase *tc = tcase_create("local");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, a_bucket_per_value);
	tcase_add_test(tc, star_caps_values);
	tcase_add_test(tc, reload_switches);
	tcase_add_test(tc, values_bounded);
	tcase_add_test(tc, spent_values_stay);
	tcase_add_test(tc, config_rules);
	suite_add_tcase(s, tc);
	tc = tcase_create("allotd");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, global_across_replicas);
	tcase_add_test(tc, claims_cannot_starve_a_value);
	tcase_add_test(tc, one_session_cannot_fill_the_table);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(values_suite)
