/* SPDX-License-Identifier: MIT */
/*
 * The agent's public API on a virtual clock: key resolution (known
 * callers, endpoint weights, the shared default bucket), decisions and
 * their fields, shadow mode, cost above the burst, settlements, the
 * bounded unknown-identity table with pinning and idle eviction, and
 * counters. Then real threads: N threads x M acquires admit exactly
 * burst + rate x elapsed, allowance swaps race with acquires, and token
 * leases on one hot key: returned on a swap, when idle and at thread
 * exit, renewed in one CAS, never admitting a token the bucket did not
 * have; and lookups by identity racing config swaps.
 */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>

#include "agent_int.h"
#include "runner.h"

#define MS 1000000ull
#define S 1000000000ull

static const char *CFG = "quotas:\n"
                         "  default:\n"
                         "    tokens_per_second: 10\n"
                         "    burst: 20\n"
                         "    shared: true\n"
                         "    priority: low\n"
                         "  callers:\n"
                         "    - identity: \"spiffe://t/checkout\"\n"
                         "      tokens_per_second: 500\n"
                         "      burst: 1000\n"
                         "      priority: critical\n"
                         "    - identity: \"spiffe://t/reporting\"\n"
                         "      tokens_per_second: 100\n"
                         "      burst: 200\n"
                         "      priority: batch\n"
                         "    - identity: \"spiffe://t/shadowed\"\n"
                         "      tokens_per_second: 1\n"
                         "      burst: 20\n"
                         "      priority: standard\n"
                         "      shadow: true\n"
                         "  endpoint_weights:\n"
                         "    default: 1\n"
                         "    \"/lookup\": 1\n"
                         "    \"/export\": 20\n"
                         "  global_ceiling:\n"
                         "    tokens_per_second: 800\n"
                         "    shed_order: [low, batch, standard, critical]\n";

static _Atomic uint64_t vnow;

static uint64_t
vclock(void *ctx)
{
	(void) ctx;
	return atomic_load(&vnow);
}

static allot_agent *
mkagent(const char *yaml, uint32_t max_unknown, uint32_t idle_ms)
{
	char err[512];
	allot_config *cfg;
	int rc = allot_config_parse(
	    "test.yaml", yaml, strlen(yaml), err, sizeof err, &cfg);
	ck_assert_msg(rc == ALLOT_OK, "config: %s", err);
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.clock = vclock;
	o.max_unknown_keys = max_unknown;
	o.idle_evict_ms = idle_ms;
	allot_agent *a;
	ck_assert_int_eq(allot_agent_create(cfg, &o, &a), ALLOT_OK);
	allot_config_free(cfg);
	return a;
}

static int
admit_n(allot_agent *a, allot_key *k, int n, uint32_t cost)
{
	int ok = 0;
	allot_decision d;
	for (int i = 0; i < n; i++) {
		ck_assert_int_eq(allot_acquire(a, k, cost, &d), ALLOT_OK);
		ok += d.allowed;
	}
	return ok;
}

START_TEST(known_caller_and_weights)
{
	atomic_store(&vnow, 100 * S);
	allot_agent *a = mkagent(CFG, 64, 0);
	allot_key *exp, *look;
	ck_assert_int_eq(
	    allot_key_resolve(a, "spiffe://t/reporting", "/export", &exp),
	    ALLOT_OK);
	ck_assert_int_eq(
	    allot_key_resolve(a, "spiffe://t/reporting", "/lookup", &look),
	    ALLOT_OK);
	ck_assert_uint_eq(allot_key_cost(exp), 20);
	ck_assert_uint_eq(allot_key_cost(look), 1);
	/* burst 200 = ten exports; lookups share the same bucket. */
	ck_assert_int_eq(admit_n(a, exp, 11, ALLOT_COST_DEFAULT), 10);
	ck_assert_int_eq(admit_n(a, look, 1, ALLOT_COST_DEFAULT), 0);
	allot_decision d;
	ck_assert_int_eq(
	    allot_acquire(a, exp, ALLOT_COST_DEFAULT, &d), ALLOT_OK);
	ck_assert(!d.allowed);
	ck_assert_uint_eq(d.cost, 20);
	/* 20 tokens at 100/s. */
	ck_assert_uint_eq(d.retry_after_ns, 200 * MS);
	ck_assert_double_eq_tol(d.limit, 200, 1e-9);
	ck_assert_double_eq_tol(d.rate, 100, 1e-9);
	ck_assert_double_eq_tol(d.remaining, 0, 1e-9);
	ck_assert_uint_eq(d.reset_ns, 2 * S);
	atomic_fetch_add(&vnow, 200 * MS);
	ck_assert_int_eq(
	    allot_acquire(a, exp, ALLOT_COST_DEFAULT, &d), ALLOT_OK);
	ck_assert(d.allowed);
	/* An endpoint absent from endpoint_weights costs `default`. */
	allot_key *other;
	ck_assert_int_eq(
	    allot_key_resolve(a, "spiffe://t/checkout", "/unlisted", &other),
	    ALLOT_OK);
	ck_assert_uint_eq(allot_key_cost(other), 1);
	allot_agent_destroy(a);
}
END_TEST

START_TEST(unknown_share_default_bucket)
{
	atomic_store(&vnow, 100 * S);
	allot_agent *a = mkagent(CFG, 64, 0);
	allot_decision d;
	int ok = 0;
	/* Three unknown identities and an anonymous caller share the
	 * default bucket of 20. */
	const char *ids[] = { "spiffe://x/a", "spiffe://x/b", "", NULL };
	for (int i = 0; i < 40; i++) {
		ck_assert_int_eq(allot_acquire_id(a, ids[i % 4], "/lookup",
		                     ALLOT_COST_DEFAULT, &d),
		    ALLOT_OK);
		ok += d.allowed;
	}
	ck_assert_int_eq(ok, 20);
	/* A known caller is unaffected. */
	ck_assert_int_eq(allot_acquire_id(a, "spiffe://t/checkout", "/lookup",
	                     ALLOT_COST_DEFAULT, &d),
	    ALLOT_OK);
	ck_assert(d.allowed);
	/* Per-identity counters exist for the unknown ones. */
	allot_key_stats st[16];
	size_t n;
	ck_assert_int_eq(allot_stats(a, st, 16, &n), ALLOT_OK);
	bool saw_a = false;
	for (size_t i = 0; i < n && i < 16; i++)
		if (strcmp(st[i].identity, "spiffe://x/a") == 0) {
			saw_a = true;
			ck_assert_str_eq(st[i].quota, "default");
			ck_assert(!st[i].known);
			ck_assert_uint_eq(st[i].allowed + st[i].denied, 10);
		}
	ck_assert(saw_a);
	/* Too long an identity is refused, not truncated. */
	char longid[400];
	memset(longid, 'a', sizeof longid - 1);
	longid[sizeof longid - 1] = '\0';
	ck_assert_int_eq(
	    allot_acquire_id(a, longid, "/lookup", 1, &d), ALLOT_EINVAL);
	allot_agent_destroy(a);
}
END_TEST

START_TEST(shadow_mode)
{
	atomic_store(&vnow, 100 * S);
	allot_agent *a = mkagent(CFG, 64, 0);
	allot_key *k;
	ck_assert_int_eq(
	    allot_key_resolve(a, "spiffe://t/shadowed", "/lookup", &k),
	    ALLOT_OK);
	allot_decision d;
	int shadow = 0;
	for (int i = 0; i < 50; i++) {
		ck_assert_int_eq(allot_acquire(a, k, 1, &d), ALLOT_OK);
		ck_assert(d.allowed);
		shadow += d.shadow_denied;
	}
	/* burst 20: 20 would pass, 30 would have been denied. */
	ck_assert_int_eq(shadow, 30);
	allot_key_stats st;
	ck_assert_int_eq(allot_key_stats_get(a, k, &st), ALLOT_OK);
	ck_assert(st.shadow);
	/* Shadow would-be denials are admitted requests (consumption),
	 * counted apart, never as denials. */
	ck_assert_uint_eq(st.allowed, 50);
	ck_assert_uint_eq(st.shadow_denied, 30);
	ck_assert_uint_eq(st.denied, 0);
	ck_assert_uint_eq(st.tokens_spent, 50);
	ck_assert_uint_eq(st.tokens_shadow, 30);
	ck_assert_uint_eq(st.tokens_denied, 0);
	/* The would-be denials took no tokens: one second refills one. */
	atomic_fetch_add(&vnow, 1 * S);
	ck_assert_int_eq(allot_acquire(a, k, 1, &d), ALLOT_OK);
	ck_assert(d.allowed && !d.shadow_denied);
	allot_agent_destroy(a);
}
END_TEST

START_TEST(cost_above_burst)
{
	atomic_store(&vnow, 100 * S);
	allot_agent *a = mkagent(CFG, 64, 0);
	allot_key *k;
	ck_assert_int_eq(allot_key_resolve(a, NULL, "/lookup", &k), ALLOT_OK);
	allot_decision d;
	ck_assert_int_eq(allot_acquire(a, k, 21, &d), ALLOT_ETOOBIG);
	ck_assert(!d.allowed);
	ck_assert_uint_eq(d.retry_after_ns, 0);
	ck_assert_str_eq(allot_strerror(ALLOT_ETOOBIG),
	    "cost exceeds the burst: the request can never pass");
	/* The bucket was not touched. */
	ck_assert_int_eq(admit_n(a, k, 20, 1), 20);
	ck_assert_int_eq(allot_acquire(a, NULL, 1, &d), ALLOT_EINVAL);
	allot_agent_destroy(a);
}
END_TEST

START_TEST(settle_reconciles)
{
	atomic_store(&vnow, 100 * S);
	allot_agent *a = mkagent(CFG, 64, 0);
	allot_key *k;
	ck_assert_int_eq(
	    allot_key_resolve(a, "spiffe://t/reporting", "/export", &k),
	    ALLOT_OK);
	allot_decision d;
	ck_assert_int_eq(
	    allot_acquire(a, k, ALLOT_COST_DEFAULT, &d), ALLOT_OK);
	ck_assert(d.allowed);
	/* The export really cost 300: 100 tokens of debt beyond the
	 * 200 burst after the 20 estimated. */
	ck_assert_int_eq(allot_settle(a, k, 20, 300), ALLOT_OK);
	ck_assert_int_eq(admit_n(a, k, 1, 1), 0);
	atomic_fetch_add(&vnow, 1 * S); /* +100 tokens: level 0 */
	ck_assert_int_eq(admit_n(a, k, 1, 1), 0);
	atomic_fetch_add(&vnow, 200 * MS);
	ck_assert_int_eq(admit_n(a, k, 20, 1), 20);
	allot_key_stats st;
	allot_key_stats_get(a, k, &st);
	ck_assert_uint_eq(st.tokens_spent, 320);
	/* An overestimate is refunded, never above the burst. */
	atomic_fetch_add(&vnow, 10 * S);
	ck_assert_int_eq(allot_acquire(a, k, 200, &d), ALLOT_OK);
	ck_assert(d.allowed);
	ck_assert_int_eq(allot_settle(a, k, 200, 50), ALLOT_OK);
	ck_assert_int_eq(admit_n(a, k, 151, 1), 150);
	allot_key_stats_get(a, k, &st);
	ck_assert_uint_eq(st.tokens_spent, 320 + 50 + 150);
	allot_agent_destroy(a);
}
END_TEST

/* Issue 27: a refund never exceeds what was charged and not yet
 * settled. A caller that claims every request of one token was charged
 * 100 gets no more requests than its bucket holds (before, 1,000 of
 * 1,000); a settlement with no admitted request left refunds nothing;
 * an honest one is refunded in full. */
START_TEST(settle_refund_bounded)
{
	atomic_store(&vnow, 100 * S);
	allot_agent *a = mkagent(CFG, 64, 0);
	allot_key *k;
	ck_assert_int_eq(
	    allot_key_resolve(a, "spiffe://t/reporting", "/export", &k),
	    ALLOT_OK);
	/* Burst 200, rate 100/s, the clock stopped. */
	int admitted = 0, partial = 0;
	for (int i = 0; i < 1000; i++) {
		admitted += admit_n(a, k, 1, 1);
		partial += allot_settle(a, k, 100, 1) == ALLOT_ERANGE;
	}
	ck_assert_int_eq(admitted, 200);
	ck_assert_int_eq(partial, 1000);
	allot_key_stats st;
	allot_key_stats_get(a, k, &st);
	ck_assert_uint_eq(st.tokens_spent, 200);
	/* An honest caller of the same quota on another key: charged 40,
	 * cost 10, 30 back. */
	allot_key *h;
	ck_assert_int_eq(
	    allot_key_resolve(a, "spiffe://t/reporting", "/lookup", &h),
	    ALLOT_OK);
	atomic_fetch_add(&vnow, 1 * S); /* +100 tokens */
	allot_decision d;
	ck_assert_int_eq(allot_acquire(a, h, 40, &d), ALLOT_OK);
	ck_assert(d.allowed);
	ck_assert_int_eq(allot_settle(a, h, 40, 10), ALLOT_OK);
	allot_key_stats_get(a, h, &st);
	ck_assert_uint_eq(st.tokens_spent, 10);
	/* Its one request is settled: a refund for one that never was gets
	 * nothing; debt is always taken. */
	ck_assert_int_eq(allot_settle(a, h, 40, 0), ALLOT_ERANGE);
	allot_key_stats_get(a, h, &st);
	ck_assert_uint_eq(st.tokens_spent, 10);
	ck_assert_int_eq(allot_settle(a, h, 1, 30), ALLOT_OK);
	allot_key_stats_get(a, h, &st);
	ck_assert_uint_eq(st.tokens_spent, 39);
	ck_assert_int_eq(allot_settle(a, NULL, 1, 0), ALLOT_EINVAL);
	allot_agent_destroy(a);
}
END_TEST

START_TEST(unknown_table_bounded)
{
	atomic_store(&vnow, 100 * S);
	allot_agent *a = mkagent(CFG, 4, 1000);
	allot_key *k[5];
	char id[64];
	for (int i = 0; i < 4; i++) {
		snprintf(id, sizeof id, "spiffe://x/%d", i);
		ck_assert_int_eq(
		    allot_key_resolve(a, id, "/lookup", &k[i]), ALLOT_OK);
		ck_assert(k[i]->dynamic);
	}
	/* Full and all pinned: the fifth identity shares the overflow key
	 * (still the default bucket, still counted). */
	ck_assert_int_eq(
	    allot_key_resolve(a, "spiffe://x/new", "/lookup", &k[4]),
	    ALLOT_OK);
	ck_assert(!k[4]->dynamic);
	ck_assert_str_eq(k[4]->identity, "(overflow)");
	ck_assert_uint_eq(atomic_load(&a->overflowed), 1);
	/* Resolving again returns the same key. */
	allot_key *again;
	ck_assert_int_eq(
	    allot_key_resolve(a, "spiffe://x/2", "/lookup", &again), ALLOT_OK);
	ck_assert_ptr_eq(again, k[2]);
	allot_key_release(a, again);
	/* Unpinned and idle past idle_evict: evicted to make room. */
	for (int i = 0; i < 4; i++)
		allot_key_release(a, k[i]);
	atomic_fetch_add(&vnow, 2 * S);
	allot__agent_sweep(a, atomic_load(&vnow));
	atomic_fetch_add(&vnow, 2 * S);
	allot_key *fresh;
	ck_assert_int_eq(
	    allot_key_resolve(a, "spiffe://x/new", "/lookup", &fresh),
	    ALLOT_OK);
	ck_assert(fresh->dynamic);
	ck_assert_str_eq(fresh->identity, "spiffe://x/new");
	ck_assert_uint_ge(atomic_load(&a->evictions), 1);
	/* Counters of evicted keys are not lost from the quota total. */
	allot_decision d;
	for (int i = 0; i < 6; i++) {
		snprintf(id, sizeof id, "spiffe://y/%d", i);
		allot_acquire_id(a, id, "/lookup", 1, &d);
	}
	allot__ktotals t;
	allot__quota_totals(a, &a->quotas[a->nquotas - 1], &t);
	ck_assert_uint_eq(t.allowed + t.denied, 6);
	allot_key_release(a, fresh);
	allot_agent_destroy(a);
}
END_TEST

/* ---- threads ---- */

struct nm_arg {
	allot_agent *a;
	allot_key *k;
	int m;
	uint64_t admitted;
};

static _Atomic uint64_t tick_clock;

static uint64_t
ticking(void *ctx)
{
	(void) ctx;
	/* Every read advances time by 1 us: deterministic elapsed time
	 * however the threads interleave. */
	return atomic_fetch_add(&tick_clock, 1000) + 1000;
}

static void *
nm_thread(void *p)
{
	struct nm_arg *x = p;
	allot_decision d;
	for (int i = 0; i < x->m; i++) {
		allot_acquire(x->a, x->k, 1, &d);
		x->admitted += d.allowed;
	}
	return NULL;
}

START_TEST(n_threads_m_acquires)
{
	const char *yaml =
	    "quotas:\n"
	    "  default: {tokens_per_second: 10, burst: 20}\n"
	    "  callers:\n"
	    "    - {identity: a, tokens_per_second: 50000, burst: 100}\n";
	char err[256];
	allot_config *cfg;
	ck_assert_int_eq(
	    allot_config_parse("t", yaml, strlen(yaml), err, sizeof err, &cfg),
	    ALLOT_OK);
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.clock = ticking;
	atomic_store(&tick_clock, 10 * S);
	allot_agent *a;
	ck_assert_int_eq(allot_agent_create(cfg, &o, &a), ALLOT_OK);
	allot_config_free(cfg);
	allot_key *k;
	allot_key_resolve(a, "a", "/x", &k);
	enum { N = 4, M = 200000 };
	uint64_t t0 = atomic_load(&tick_clock);
	pthread_t th[N];
	struct nm_arg arg[N];
	for (int i = 0; i < N; i++) {
		arg[i] = (struct nm_arg) { a, k, M, 0 };
		pthread_create(&th[i], NULL, nm_thread, &arg[i]);
	}
	uint64_t admitted = 0;
	for (int i = 0; i < N; i++) {
		pthread_join(th[i], NULL);
		admitted += arg[i].admitted;
	}
	double elapsed = (double) (atomic_load(&tick_clock) - t0) / 1e9;
	/* 800,000 calls over 0.8 virtual seconds at 50,000/s: one in
	 * twenty passes. */
	double expected = 100 + 50000 * elapsed;
	ck_assert_msg((double) admitted <= expected + 1 &&
	        (double) admitted >= expected - 1,
	    "admitted %llu, expected %.1f", (unsigned long long) admitted,
	    expected);
	allot_key_stats st;
	allot_key_stats_get(a, k, &st);
	ck_assert_uint_eq(st.allowed, admitted);
	ck_assert_uint_eq(st.allowed + st.denied, (uint64_t) N * M);
	allot_agent_destroy(a);
}
END_TEST

static void *
churn_thread(void *p)
{
	struct nm_arg *x = p;
	allot_decision d;
	for (int i = 0; i < x->m; i++) {
		allot_acquire(x->a, x->k, 1, &d);
		x->admitted += d.allowed;
	}
	return NULL;
}

START_TEST(thread_blocks_bounded)
{
	/* Counting stays exact when more threads run than have blocks of
	 * their own (the rest share one, atomically), and thread churn
	 * reuses the blocks of threads that exited. */
	const char *yaml =
	    "quotas:\n"
	    "  default: {tokens_per_second: 10, burst: 20}\n"
	    "  callers:\n"
	    "    - {identity: a, tokens_per_second: 1000000000, "
	    "burst: 1000000000}\n";
	char err[256];
	allot_config *cfg;
	ck_assert_int_eq(
	    allot_config_parse("t", yaml, strlen(yaml), err, sizeof err, &cfg),
	    ALLOT_OK);
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.max_threads = 2;
	allot_agent *a;
	ck_assert_int_eq(allot_agent_create(cfg, &o, &a), ALLOT_OK);
	allot_config_free(cfg);
	allot_key *k;
	allot_key_resolve(a, "a", "/x", &k);
	enum { N = 8, M = 50000 };
	pthread_t th[N];
	struct nm_arg arg[N];
	for (int i = 0; i < N; i++) {
		arg[i] = (struct nm_arg) { a, k, M, 0 };
		pthread_create(&th[i], NULL, churn_thread, &arg[i]);
	}
	for (int i = 0; i < N; i++)
		pthread_join(th[i], NULL);
	allot_key_stats st;
	allot_key_stats_get(a, k, &st);
	ck_assert_uint_eq(st.allowed, (uint64_t) N * M);
	ck_assert_uint_eq(st.tokens_spent, (uint64_t) N * M);
	ck_assert_uint_le(atomic_load(&a->nblocks), 2);
	/* Twenty short-lived threads, one after another: no new blocks. */
	for (int i = 0; i < 20; i++) {
		struct nm_arg x = { a, k, 1000, 0 };
		pthread_create(&th[0], NULL, churn_thread, &x);
		pthread_join(th[0], NULL);
		ck_assert_uint_eq(x.admitted, 1000);
	}
	ck_assert_uint_le(atomic_load(&a->nblocks), 2);
	allot_key_stats_get(a, k, &st);
	ck_assert_uint_eq(st.allowed, (uint64_t) N * M + 20000);
	allot_agent_destroy(a);
}
END_TEST

static const char *LEASE_CFG =
    "quotas:\n"
    "  default: {tokens_per_second: 10, burst: 20}\n"
    "  callers:\n"
    "    - {identity: hot, tokens_per_second: 1, burst: 100000}\n";

static allot_agent *
lease_agent(allot_key **ret_k)
{
	char err[256];
	allot_config *cfg;
	ck_assert_int_eq(allot_config_parse("t", LEASE_CFG, strlen(LEASE_CFG),
	                     err, sizeof err, &cfg),
	    ALLOT_OK);
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.clock = vclock;
	o.max_threads = 4; /* batches of min(64, 100000 / (16 * threads)) */
	atomic_store(&vnow, 10 * S);
	allot_agent *a;
	ck_assert_int_eq(allot_agent_create(cfg, &o, &a), ALLOT_OK);
	allot_config_free(cfg);
	ck_assert_int_eq(allot_key_resolve(a, "hot", "/x", ret_k), ALLOT_OK);
	return a;
}

START_TEST(lease_returned_on_swap_and_idle)
{
	allot_key *k;
	allot_agent *a = lease_agent(&k);
	allot__bucket *bk = atomic_load(&k->bucket);
	ck_assert_int_eq(admit_n(a, k, 1, 1), 1);
	/* As if a CAS had lost to another thread: lease from now on. */
	allot__kcount *c = &allot__thread_block(a)->c[k->id];
	c->lease.on = 1;
	c->lease.stamp = (atomic_load(&vnow) >> ALLOT__LEASE_TICK_SHIFT) &
	    0xffffu;
	ck_assert_int_eq(admit_n(a, k, 1, 1), 1);
	ck_assert_uint_eq(atomic_load(&bk->leased), 64);
	ck_assert_uint_eq(c->lease.held, 63);
	/* Spent from the lease: the shared word is not written. */
	uint64_t s0 = atomic_load(&bk->state);
	ck_assert_int_eq(admit_n(a, k, 5, 1), 5);
	ck_assert_uint_eq(atomic_load(&bk->state), s0);
	ck_assert_uint_eq(c->lease.held, 58);
	/* A swap: the lease is given back (58 refunded) and a new one
	 * taken under the new allowance. */
	allot__allowance al = {
		.rate = 0.001, .burst = 100000, .mode = ALLOT__MODE_LIMIT
	};
	allot__quota_set(a, atomic_load(&k->quota), &al);
	ck_assert_int_eq(admit_n(a, k, 1, 1), 1);
	ck_assert_uint_eq(atomic_load(&bk->leased), 64);
	ck_assert_uint_eq(c->lease.held, 63);
	ck_assert_uint_eq(c->lease.ver, atomic_load(&bk->cur) & 0xffffu);
	/* Spent to the last token, the lease renews in place: the same
	 * reservation, one CAS taking the next 64 from the bucket. */
	ck_assert_int_eq(admit_n(a, k, 63, 1), 63);
	ck_assert_uint_eq(c->lease.held, 0);
	double before = allot__bucket_level(bk, atomic_load(&vnow));
	ck_assert_int_eq(admit_n(a, k, 1, 1), 1);
	ck_assert_uint_eq(atomic_load(&bk->leased), 64);
	ck_assert_uint_eq(c->lease.held, 63);
	ck_assert_double_eq_tol(
	    before - allot__bucket_level(bk, atomic_load(&vnow)), 64, 1e-3);
	/* Idle for 2 ms: returned on the next call, which decides through
	 * the bucket again. */
	atomic_fetch_add(&vnow, 2 * MS);
	ck_assert_int_eq(admit_n(a, k, 1, 1), 1);
	ck_assert_uint_eq(atomic_load(&bk->leased), 0);
	ck_assert(!c->lease.on);
	/* Every token not spent came back and none was created. */
	allot_key_stats st;
	allot_key_stats_get(a, k, &st);
	ck_assert_uint_eq(st.allowed, 73);
	ck_assert_double_eq_tol(
	    allot__bucket_level(bk, atomic_load(&vnow)), 100000 - 73, 1e-3);
	allot_agent_destroy(a);
}
END_TEST

START_TEST(lease_sized_by_threads_deciding)
{
	/* Default max_threads (64) and a burst of 1,000: the batch is a
	 * 16th of the burst over the threads that decide (one here), not
	 * over max_threads (which would make it 0: never a lease). */
	static const char *cfg =
	    "quotas:\n"
	    "  default: {tokens_per_second: 10, burst: 20}\n"
	    "  callers:\n"
	    "    - {identity: hot, tokens_per_second: 1, "
	    "burst: 1000}\n";
	allot_agent *a = mkagent(cfg, 16, 0);
	allot_key *k;
	ck_assert_int_eq(allot_key_resolve(a, "hot", NULL, &k), ALLOT_OK);
	allot__bucket *bk = atomic_load(&k->bucket);
	ck_assert_int_eq(admit_n(a, k, 1, 1), 1);
	allot__kcount *c = &allot__thread_block(a)->c[k->id];
	c->lease.on = 1;
	c->lease.stamp = (atomic_load(&vnow) >> ALLOT__LEASE_TICK_SHIFT) &
	    0xffffu;
	ck_assert_int_eq(admit_n(a, k, 1, 1), 1);
	ck_assert_uint_eq(atomic_load(&bk->leased), 1000 / 16);
	ck_assert_uint_eq(c->lease.held, 1000 / 16 - 1);
	allot_agent_destroy(a);
}
END_TEST

struct hammer_arg {
	allot_agent *a;
	allot_key *k;
	uint64_t admitted, calls;
};

static void *
hammer_thread(void *p)
{
	struct hammer_arg *x = p;
	allot_decision d;
	/* Lease from the start, as after a lost CAS (on two cores four
	 * threads may not overlap enough to lose one). */
	ck_assert_int_eq(allot_acquire(x->a, x->k, 1, &d), ALLOT_OK);
	x->admitted += d.allowed;
	x->calls++;
	allot__kcount *c = &allot__thread_block(x->a)->c[x->k->id];
	c->lease.on = 1;
	c->lease.stamp = (atomic_load(&vnow) >> ALLOT__LEASE_TICK_SHIFT) &
	    0xffffu;
	/* Until this thread is denied twice in a row: the bucket and its
	 * own lease are both empty. */
	for (int denied = 0; denied < 2; x->calls++) {
		ck_assert_int_eq(allot_acquire(x->a, x->k, 1, &d), ALLOT_OK);
		x->admitted += d.allowed;
		denied = d.allowed ? 0 : denied + 1;
	}
	return NULL;
}

START_TEST(lease_bound_n_threads_one_key)
{
	/* Four threads drain one key of burst 100,000 on a frozen clock:
	 * leases never admit a token the bucket did not have, and the
	 * ones left when the threads exit go back to the bucket. */
	allot_key *k;
	allot_agent *a = lease_agent(&k);
	enum { N = 4 };
	pthread_t th[N];
	struct hammer_arg arg[N];
	for (int i = 0; i < N; i++) {
		arg[i] = (struct hammer_arg) { a, k, 0, 0 };
		pthread_create(&th[i], NULL, hammer_thread, &arg[i]);
	}
	uint64_t admitted = 0, calls = 0;
	for (int i = 0; i < N; i++) {
		pthread_join(th[i], NULL);
		admitted += arg[i].admitted;
		calls += arg[i].calls;
	}
	/* Not one token more than the burst, and not one less: a thread
	 * stops only once its own lease is empty, and the reservations of
	 * spent leases never hold back tokens the bucket has. */
	ck_assert_uint_eq(admitted, 100000);
	ck_assert_uint_eq(atomic_load(&k->bucket->leased), 0);
	double level = allot__bucket_level(k->bucket, atomic_load(&vnow));
	ck_assert_double_eq_tol(level + (double) admitted, 100000, 1e-3);
	allot_key_stats st;
	allot_key_stats_get(a, k, &st);
	ck_assert_uint_eq(st.allowed, admitted);
	ck_assert_uint_eq(st.allowed + st.denied, calls);
	allot_agent_destroy(a);
}
END_TEST

/* Lookups racing config swaps: every swap adds identities (new slots
 * in the caller index while readers probe it) and changes the rates of
 * the ones being looked up. */
enum { SWAP_IDS = 48, SWAP_READERS = 3, SWAPS = 60, SWAP_NEW = 4 };

static const char *
swap_id(int i, char *buf, size_t len)
{
	snprintf(
	    buf, len, "spiffe://prod.example.internal/ns/t/sa/id-%03d", i);
	return buf;
}

static allot_config *
swap_cfg(int swap)
{
	size_t cap = 64 * 1024, n = 0;
	char *y = malloc(cap);
	ck_assert_ptr_nonnull(y);
	n += (size_t) snprintf(y + n, cap - n,
	    "quotas:\n  default: {tokens_per_second: 10, burst: 20}\n"
	    "  callers:\n");
	char id[96];
	for (int i = 0; i < SWAP_IDS; i++)
		n += (size_t) snprintf(y + n, cap - n,
		    "    - {identity: \"%s\", tokens_per_second: %d, "
		    "burst: 1000000000}\n",
		    swap_id(i, id, sizeof id), 1000 + swap % 2);
	for (int s = 1; s <= swap; s++)
		for (int k = 0; k < SWAP_NEW; k++)
			n += (size_t) snprintf(y + n, cap - n,
			    "    - {identity: \"spiffe://t/new-%d-%d\", "
			    "tokens_per_second: 1, burst: 1}\n",
			    s, k);
	ck_assert_uint_lt(n, cap);
	char err[512];
	allot_config *cfg;
	int rc = allot_config_parse("swap.yaml", y, n, err, sizeof err, &cfg);
	ck_assert_msg(rc == ALLOT_OK, "config: %s", err);
	free(y);
	return cfg;
}

struct lookup_arg {
	allot_agent *a;
	_Atomic bool *stop;
	int idx;
	uint64_t calls[SWAP_IDS];
};

static void *
lookup_thread(void *p)
{
	struct lookup_arg *x = p;
	char ids[SWAP_IDS][96];
	for (int i = 0; i < SWAP_IDS; i++)
		swap_id(i, ids[i], sizeof ids[i]);
	allot_decision d;
	for (uint64_t n = 0; !atomic_load(x->stop); n++) {
		int i = (int) ((n * 7 + (uint64_t) x->idx) % SWAP_IDS);
		ck_assert_int_eq(
		    allot_acquire_id(x->a, ids[i], "/x", 1, &d), ALLOT_OK);
		ck_assert(d.allowed);
		x->calls[i]++;
	}
	return NULL;
}

START_TEST(lookup_across_swaps)
{
	/* Every lookup lands on its own identity's key while configs are
	 * swapped under it: the key's count is exactly the calls made with
	 * its identity (a lookup that found another key, or missed and
	 * went to the unknown-identity pool, would show). */
	allot_config *c0 = swap_cfg(0);
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.clock = vclock;
	o.max_callers = 1024;
	o.log_level = ALLOT_LOG_WARNING;
	allot_agent *a;
	ck_assert_int_eq(allot_agent_create(c0, &o, &a), ALLOT_OK);
	allot_config_free(c0);
	_Atomic bool stop = false;
	pthread_t th[SWAP_READERS];
	static struct lookup_arg arg[SWAP_READERS];
	for (int i = 0; i < SWAP_READERS; i++) {
		memset(&arg[i], 0, sizeof arg[i]);
		arg[i].a = a;
		arg[i].stop = &stop;
		arg[i].idx = i;
		pthread_create(&th[i], NULL, lookup_thread, &arg[i]);
	}
	struct timespec ms = { 0, 1000000 };
	for (int s = 1; s <= SWAPS; s++) {
		allot_config *c = swap_cfg(s);
		ck_assert_int_eq(allot_agent_set_config(a, c), ALLOT_OK);
		allot_config_free(c);
		nanosleep(&ms, NULL);
	}
	atomic_store(&stop, true);
	for (int i = 0; i < SWAP_READERS; i++)
		pthread_join(th[i], NULL);
	char id[96];
	uint64_t total = 0;
	for (int i = 0; i < SWAP_IDS; i++) {
		uint64_t calls = 0;
		for (int r = 0; r < SWAP_READERS; r++)
			calls += arg[r].calls[i];
		allot_key *k;
		ck_assert_int_eq(
		    allot_key_resolve(a, swap_id(i, id, sizeof id), "/x", &k),
		    ALLOT_OK);
		ck_assert(!k->dynamic);
		allot_key_stats st;
		ck_assert_int_eq(allot_key_stats_get(a, k, &st), ALLOT_OK);
		ck_assert_uint_eq(st.allowed + st.denied, calls);
		total += calls;
	}
	ck_assert_uint_gt(total, 0);
	/* The identities the swaps added are found too, as configured. */
	for (int s = 1; s <= SWAPS; s++)
		for (int k = 0; k < SWAP_NEW; k++) {
			snprintf(id, sizeof id, "spiffe://t/new-%d-%d", s, k);
			allot_key *key;
			ck_assert_int_eq(
			    allot_key_resolve(a, id, NULL, &key), ALLOT_OK);
			ck_assert(!key->dynamic);
			ck_assert(atomic_load(&key->known));
		}
	allot_agent_destroy(a);
}
END_TEST

/* Configured identities of every length around the name line's room
 * (ALLOT__CALLER_INLINE bytes inline, longer ones through the key):
 * each is found as itself, never as a name it is a prefix of or that
 * differs from it in its last byte, and the names that are not
 * configured (a prefix, one byte more) go to the unknown pool. */
enum { NAME_LENS = 8 };
static const size_t name_len[NAME_LENS] = { 1, 61, 62, 63, 64, 65, 128,
	ALLOT_IDENTITY_MAX };

#define NAME_BUF (ALLOT_IDENTITY_MAX + 2)

static void
long_name(size_t len, char last, char buf[NAME_BUF])
{
	ck_assert(len >= 1 && len < NAME_BUF - 1);
	for (size_t i = 0; i < len; i++)
		buf[i] = (char) ('a' + i % 26);
	buf[len - 1] = last;
	buf[len] = '\0';
}

START_TEST(lookup_inline_and_long_names)
{
	size_t cap = 16 * 1024, n = 0;
	char *y = malloc(cap);
	ck_assert_ptr_nonnull(y);
	n += (size_t) snprintf(y + n, cap - n,
	    "quotas:\n  default: {tokens_per_second: 10, burst: 20}\n"
	    "  callers:\n");
	char id[NAME_BUF];
	/* Two names of each length, apart only in their last byte. */
	for (int i = 0; i < NAME_LENS; i++)
		for (char last = 'X'; last <= 'Y'; last++) {
			long_name(name_len[i], last, id);
			n += (size_t) snprintf(y + n, cap - n,
			    "    - {identity: \"%s\", tokens_per_second: "
			    "1000, "
			    "burst: 1000000}\n",
			    id);
		}
	ck_assert_uint_lt(n, cap);
	allot_agent *a = mkagent(y, 64, 0);
	free(y);
	allot_key *seen[NAME_LENS][2];
	allot_decision d;
	for (int i = 0; i < NAME_LENS; i++)
		for (int j = 0; j < 2; j++) {
			long_name(name_len[i], (char) ('X' + j), id);
			/* i + 1 calls by name: its key's count says which
			 * key the lookups found. */
			for (int c = 0; c <= i; c++) {
				ck_assert_int_eq(
				    allot_acquire_id(a, id, "/lookup", 1, &d),
				    ALLOT_OK);
				ck_assert(d.allowed);
			}
			allot_key *k;
			ck_assert_int_eq(
			    allot_key_resolve(a, id, "/lookup", &k), ALLOT_OK);
			ck_assert_msg(!k->dynamic,
			    "%zu-byte name %c not found", name_len[i],
			    'X' + j);
			ck_assert_str_eq(k->identity, id);
			allot_key_stats st;
			ck_assert_int_eq(
			    allot_key_stats_get(a, k, &st), ALLOT_OK);
			ck_assert_uint_eq(st.allowed, (uint64_t) i + 1);
			seen[i][j] = k;
		}
	for (int i = 0; i < NAME_LENS; i++) {
		ck_assert_ptr_ne(seen[i][0], seen[i][1]);
		if (i > 0)
			ck_assert_ptr_ne(seen[i][0], seen[i - 1][0]);
	}
	/* Not configured: a configured name's prefix (its last byte
	 * dropped), one byte longer, and another last byte. */
	for (int i = 1; i < NAME_LENS; i++) {
		allot_key *k;
		long_name(name_len[i], 'X', id);
		id[name_len[i] - 1] = '\0';
		if (name_len[i] - 1 != name_len[i - 1]) {
			ck_assert_int_eq(
			    allot_key_resolve(a, id, "/lookup", &k), ALLOT_OK);
			ck_assert_msg(k->dynamic, "prefix of %zu bytes found",
			    name_len[i] - 1);
			allot_key_release(a, k);
		}
		long_name(name_len[i], 'Z', id);
		ck_assert_int_eq(
		    allot_key_resolve(a, id, "/lookup", &k), ALLOT_OK);
		ck_assert(k->dynamic);
		allot_key_release(a, k);
		if (name_len[i] < NAME_BUF - 2) {
			long_name(name_len[i], 'X', id);
			id[name_len[i]] = 'q';
			id[name_len[i] + 1] = '\0';
			ck_assert_int_eq(
			    allot_key_resolve(a, id, "/lookup", &k), ALLOT_OK);
			ck_assert(k->dynamic);
			allot_key_release(a, k);
		}
	}
	allot_agent_destroy(a);
}
END_TEST

/* Structs that grow (allot.h): a program built against older headers
 * passes smaller structs. The options past its size are the defaults,
 * not what lies beyond; statistics are written up to its size only,
 * and an array of them at its stride. */
START_TEST(structs_that_grow)
{
	char err[256];
	allot_config *cfg;
	const char *y =
	    "quotas:\n"
	    "  default: {tokens_per_second: 10, burst: 20}\n"
	    "  callers:\n"
	    "    - {identity: a, tokens_per_second: 5, burst: 5}\n";
	ck_assert_int_eq(allot_config_parse(
	                     "grow.yaml", y, strlen(y), err, sizeof err, &cfg),
	    ALLOT_OK);
	/* Options that end before `coordinator`: garbage after them. */
	union {
		allot_agent_options o;
		unsigned char b[sizeof(allot_agent_options)];
	} old;
	memset(old.b, 0xab, sizeof old.b);
	allot_agent_options o;
	allot_agent_options_init(&o);
	size_t osz = offsetof(allot_agent_options, coordinator);
	memcpy(old.b, &o, osz);
	allot_agent *a;
	ck_assert_int_eq(
	    allot_agent_create_sized(cfg, &old.o, osz, &a), ALLOT_OK);
	allot_config_free(cfg);
	/* Sync statistics up to `ended`, a canary after. */
	size_t ssz = offsetof(allot_sync_stats, connected);
	union {
		allot_sync_stats s;
		unsigned char b[sizeof(allot_sync_stats)];
	} ss;
	memset(ss.b, 0xcd, sizeof ss.b);
	ck_assert_int_eq(allot_sync_stats_get_sized(a, &ss.s, ssz), ALLOT_OK);
	ck_assert(!ss.s.enabled); /* local-only: no coordinator read */
	for (size_t i = ssz; i < sizeof ss.b; i++)
		ck_assert_uint_eq(ss.b[i], 0xcd);
	/* Two keys' statistics at a stride of `ksz`. */
	allot_decision d;
	ck_assert_int_eq(allot_acquire_id(a, "a", NULL, 1, &d), ALLOT_OK);
	ck_assert_int_eq(allot_acquire_id(a, "zz", NULL, 1, &d), ALLOT_OK);
	size_t ksz = offsetof(allot_key_stats, allowed) + sizeof(uint64_t);
	unsigned char arr[3 * sizeof(allot_key_stats)];
	memset(arr, 0xee, sizeof arr);
	size_t n = 0;
	ck_assert_int_eq(
	    allot_stats_sized(a, (allot_key_stats *) (void *) arr, 2, ksz, &n),
	    ALLOT_OK);
	ck_assert_uint_eq(n, 2);
	for (size_t i = 0; i < 2; i++) {
		allot_key_stats k;
		memset(&k, 0, sizeof k);
		memcpy(&k, arr + i * ksz, ksz);
		ck_assert(strcmp(k.identity, "a") == 0 ||
		    strcmp(k.identity, "zz") == 0);
		ck_assert_uint_eq(k.allowed, 1);
	}
	for (size_t i = 2 * ksz; i < sizeof arr; i++)
		ck_assert_uint_eq(arr[i], 0xee);
	allot_key *k;
	ck_assert_int_eq(allot_key_resolve(a, "a", NULL, &k), ALLOT_OK);
	memset(arr, 0xee, sizeof arr);
	ck_assert_int_eq(allot_key_stats_get_sized(
	                     a, k, (allot_key_stats *) (void *) arr, ksz),
	    ALLOT_OK);
	ck_assert_str_eq((const char *) arr, "a");
	for (size_t i = ksz; i < sizeof arr; i++)
		ck_assert_uint_eq(arr[i], 0xee);
	allot_key_release(a, k);
	allot_agent_destroy(a);
}
END_TEST

static Suite *
agent_suite(void)
{
	Suite *s = suite_create("agent");
	TCase *tc = tcase_create("api");
	tcase_add_test(tc, known_caller_and_weights);
	tcase_add_test(tc, unknown_share_default_bucket);
	tcase_add_test(tc, shadow_mode);
	tcase_add_test(tc, cost_above_burst);
	tcase_add_test(tc, settle_reconciles);
	tcase_add_test(tc, settle_refund_bounded);
	tcase_add_test(tc, unknown_table_bounded);
	tcase_add_test(tc, lease_returned_on_swap_and_idle);
	tcase_add_test(tc, lease_sized_by_threads_deciding);
	tcase_add_test(tc, lookup_inline_and_long_names);
	tcase_add_test(tc, structs_that_grow);
	suite_add_tcase(s, tc);
	tc = tcase_create("threads");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, n_threads_m_acquires);
	tcase_add_test(tc, thread_blocks_bounded);
	tcase_add_test(tc, lease_bound_n_threads_one_key);
	tcase_add_test(tc, lookup_across_swaps);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(agent_suite)
