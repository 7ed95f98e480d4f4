/* SPDX-License-Identifier: MIT */
/*
 * Token bucket arithmetic (common/bucket.h) on a virtual clock: refill,
 * cap, fractional tokens, exact retry-after, costs above one, allowance
 * swaps that preserve the level, saturation at absurd parameters,
 * after-the-fact adjustments, and token leases held inside the burst.
 * Then the same bucket under real threads: the 30-thread burst from
 * rate-limiting-between-services.txt, and allowance swaps racing against
 * acquirers.
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>

#include "bucket.h"
#include "clock.h"
#include "runner.h"

#define MS 1000000ull
#define S 1000000000ull

static allot__bucket b;

static void
mk(double rate, double burst)
{
	allot__allowance a = {
		.rate = rate, .burst = burst, .mode = ALLOT__MODE_LIMIT
	};
	allot__bucket_init(&b, &a);
}

static bool
take(uint64_t now, uint64_t cost, allot__take *t)
{
	allot__bucket_take(&b, now, cost, t);
	return t->allowed;
}

START_TEST(burst_then_refill)
{
	allot__take t;
	mk(5, 10);
	uint64_t now = 10 * S;
	for (int i = 0; i < 10; i++)
		ck_assert_msg(take(now, 1, &t), "token %d of the burst", i);
	ck_assert(!take(now, 1, &t));
	/* One token every 200 ms. */
	ck_assert_uint_eq(t.wait_ns, 200 * MS);
	ck_assert(!take(now + 199 * MS, 1, &t));
	ck_assert(take(now + 200 * MS, 1, &t));
	ck_assert(!take(now + 200 * MS, 1, &t));
}
END_TEST

START_TEST(cap_at_burst)
{
	allot__take t;
	mk(5, 10);
	uint64_t now = 10 * S;
	ck_assert(take(now, 10, &t));
	/* An hour idle refills to the burst and not one token more. */
	now += 3600 * S;
	ck_assert_double_eq_tol(allot__bucket_level(&b, now), 10.0, 1e-9);
	ck_assert(take(now, 10, &t));
	ck_assert(!take(now, 1, &t));
}
END_TEST

START_TEST(fractional_tokens)
{
	allot__take t;
	mk(3, 1); /* one token per 333.33 ms */
	uint64_t now = 5 * S;
	ck_assert(take(now, 1, &t));
	ck_assert(!take(now + 333 * MS, 1, &t));
	ck_assert_double_eq_tol(
	    allot__bucket_level(&b, now + 166666667), 0.5, 1e-6);
	ck_assert(take(now + 333333334, 1, &t));
}
END_TEST

START_TEST(retry_after_exact)
{
	allot__take t;
	mk(2, 8);
	uint64_t now = 5 * S;
	ck_assert(take(now, 7, &t)); /* 1 token left */
	ck_assert(!take(now, 4, &t));
	/* 3 more tokens at 2/s: exactly 1.5 s. */
	ck_assert_uint_eq(t.wait_ns, 1500 * MS);
	ck_assert(!take(now + t.wait_ns - 1, 4, &t));
	ck_assert(take(now + 1500 * MS, 4, &t));
	/* Time until full after that: 8 tokens missing at 2/s = 4 s. */
	ck_assert_uint_eq(t.debt_ns, 4 * S);
}
END_TEST

START_TEST(cost_weighted)
{
	allot__take t;
	mk(100, 200);
	uint64_t now = 5 * S;
	for (int i = 0; i < 10; i++)
		ck_assert(take(now, 20, &t));
	ck_assert(!take(now, 20, &t));
	ck_assert_uint_eq(t.wait_ns, 200 * MS);
	/* A cheap request still fits after an expensive one is denied:
	 * the denial took nothing. */
	ck_assert(!take(now, 1, &t));
	ck_assert(take(now + 10 * MS, 1, &t));
}
END_TEST

START_TEST(swap_preserves_level)
{
	allot__take t;
	mk(10, 100);
	uint64_t now = 5 * S;
	ck_assert(take(now, 60, &t)); /* level 40 */
	allot__allowance a = {
		.rate = 1000, .burst = 100, .mode = ALLOT__MODE_LIMIT
	};
	allot__bucket_set(&b, &a, now);
	ck_assert_double_eq_tol(allot__bucket_level(&b, now), 40.0, 1e-6);
	/* The new rate applies from now on: 10 ms later, 10 more tokens. */
	ck_assert_double_eq_tol(
	    allot__bucket_level(&b, now + 10 * MS), 50.0, 1e-6);
	/* A smaller burst caps the level. */
	a.burst = 30;
	allot__bucket_set(&b, &a, now + 10 * MS);
	ck_assert_double_eq_tol(
	    allot__bucket_level(&b, now + 10 * MS), 30.0, 1e-6);
	ck_assert(take(now + 10 * MS, 30, &t));
	ck_assert(!take(now + 10 * MS, 1, &t));
	/* Many swaps in a row (versions wrap) keep the state consistent. */
	for (int i = 0; i < 100; i++) {
		a.rate = 100 + i;
		a.burst = 30;
		allot__bucket_set(&b, &a, now + 10 * MS);
	}
	/* Each conversion rounds z up to the next nanosecond: the level
	 * may only lose, by at most one nanosecond of refill per swap. */
	double lv = allot__bucket_level(&b, now + 10 * MS);
	ck_assert(lv <= 0.0 && lv > -100 * 199 * 1e-9);
	ck_assert_double_eq_tol(
	    allot__bucket_level(&b, now + 110 * MS), 19.9, 1e-4);
}
END_TEST

START_TEST(open_and_closed)
{
	allot__take t;
	mk(1, 1);
	uint64_t now = 5 * S;
	ck_assert(take(now, 1, &t));
	allot__allowance a = {
		.rate = 1, .burst = 1, .mode = ALLOT__MODE_OPEN
	};
	allot__bucket_set(&b, &a, now);
	for (int i = 0; i < 1000; i++)
		ck_assert(take(now, 1, &t));
	ck_assert(t.open);
	a.mode = ALLOT__MODE_CLOSED;
	a.hint_ns = 3 * S;
	allot__bucket_set(&b, &a, now + 10 * S);
	ck_assert(!take(now + 10 * S, 1, &t));
	ck_assert_uint_eq(t.wait_ns, 3 * S);
	ck_assert(allot__bucket_level(&b, now + 10 * S) == 0);
	/* Back to a bucket: the level survived (it was refilled while
	 * closed, and nothing was taken while open). */
	a.mode = ALLOT__MODE_LIMIT;
	allot__bucket_set(&b, &a, now + 10 * S);
	ck_assert(take(now + 10 * S, 1, &t));
	ck_assert(!take(now + 10 * S, 1, &t));
	/* Closed and emptied, it opens empty and refills at its rate. */
	a.mode = ALLOT__MODE_CLOSED;
	allot__bucket_set(&b, &a, now + 20 * S);
	allot__bucket_empty(&b, now + 20 * S);
	a.mode = ALLOT__MODE_LIMIT;
	allot__bucket_set(&b, &a, now + 20 * S);
	ck_assert(!take(now + 20 * S, 1, &t));
	ck_assert(take(now + 21 * S, 1, &t));
	ck_assert(!take(now + 21 * S, 1, &t));
}
END_TEST

/* A rate so small that the interval per token saturates: the bucket
 * still holds no more than its burst. */
START_TEST(tiny_rate)
{
	allot__take t;
	mk(1e-12, 1);
	uint64_t now = 5 * S;
	ck_assert(take(now, 1, &t));
	for (int i = 0; i < 8; i++)
		ck_assert(!take(now + (uint64_t) i * S, 1, &t));
}
END_TEST

START_TEST(saturation)
{
	allot__take t;
	/* The slowest rate with the largest burst: tau saturates, nothing
	 * overflows, and a request passes. */
	mk(0.001, 1e9);
	uint64_t now = 5 * S;
	ck_assert(take(now, 1, &t));
	ck_assert(take(now, 1000, &t));
	ck_assert(t.debt_ns <= ALLOT__TAU_MAX);
	/* The fastest rate: one token per ns. */
	mk(1e9, 1e9);
	ck_assert(take(now, 1000000, &t));
	ck_assert(t.debt_ns == 1000000);
	/* Absurd costs never wrap the state. */
	mk(1, 1);
	ck_assert(!take(now, UINT32_MAX, &t));
	ck_assert(t.wait_ns <= ALLOT__NEED_MAX);
	ck_assert(take(now, 1, &t));
}
END_TEST

START_TEST(adjust_debt_and_refund)
{
	allot__take t;
	mk(10, 20);
	uint64_t now = 5 * S;
	ck_assert(take(now, 5, &t)); /* level 15 */
	allot__bucket_adjust(&b, 25, now); /* measured 30: debt */
	ck_assert_double_eq_tol(allot__bucket_level(&b, now), -10.0, 1e-6);
	ck_assert(!take(now + 1 * S, 1, &t)); /* level 0 after 1 s */
	ck_assert(take(now + 1100 * MS, 1, &t));
	/* A refund never lifts the level above the burst. */
	allot__bucket_adjust(&b, -1000, now + 1100 * MS);
	ck_assert_double_eq_tol(
	    allot__bucket_level(&b, now + 1100 * MS), 20.0, 1e-6);
}
END_TEST

/* Parts of a token move in and out exactly (the tail path's part,
 * agent/tail.c): a take may run into debt, a deposit never lifts the
 * level above the burst. */
START_TEST(parts_of_a_token)
{
	allot__take t;
	mk(10, 20);
	uint64_t now = 5 * S;
	ck_assert(take(now, 20, &t)); /* empty */
	uint64_t at = now + 65 * MS; /* 0.65 refilled */
	ck_assert_double_eq_tol(allot__bucket_level(&b, at), 0.65, 1e-6);
	allot__bucket_take_part(&b, 0.65, at);
	ck_assert_double_eq_tol(allot__bucket_level(&b, at), 0, 1e-6);
	allot__bucket_deposit(&b, 1.0, at);
	ck_assert(take(at, 1, &t));
	allot__bucket_take_part(&b, 0.25, at);
	ck_assert_double_eq_tol(allot__bucket_level(&b, at), -0.25, 1e-6);
	allot__bucket_deposit(&b, 0.75, at);
	ck_assert_double_eq_tol(allot__bucket_level(&b, at), 0.5, 1e-6);
	ck_assert(!take(at, 1, &t));
	allot__bucket_deposit(&b, 100.5, at);
	ck_assert_double_eq_tol(allot__bucket_level(&b, at), 20, 1e-6);
	/* Nonsense moves nothing. */
	allot__bucket_take_part(&b, NAN, at);
	allot__bucket_deposit(&b, -3, at);
	ck_assert_double_eq_tol(allot__bucket_level(&b, at), 20, 1e-6);
}
END_TEST

/* ---- threads ---- */

struct burst_arg {
	pthread_barrier_t *bar;
	_Atomic int *admitted;
};

static void *
burst_thread(void *p)
{
	struct burst_arg *a = p;
	pthread_barrier_wait(a->bar);
	allot__take t;
	allot__bucket_take(&b, allot__tsc_ns(allot__tsc_get()), 1, &t);
	if (t.allowed)
		atomic_fetch_add(a->admitted, 1);
	return NULL;
}

START_TEST(lease_inside_the_burst)
{
	/* Leased tokens leave the bucket and never refill into it while
	 * held: level + leased stays within the burst. */
	allot__take t;
	mk(1, 100);
	uint64_t now = 10 * S;
	ck_assert(allot__bucket_lease(&b, now, 16, &t));
	ck_assert_uint_eq(atomic_load(&b.leased), 16);
	ck_assert(take(now, 84, &t));
	ck_assert(!take(now, 1, &t));
	/* An hour later the bucket holds burst - leased, not the burst. */
	now += 3600 * S;
	ck_assert(!take(now, 85, &t));
	ck_assert(take(now, 84, &t));
	ck_assert(!take(now, 1, &t));
	/* A lease that cannot be had writes nothing. */
	uint64_t s0 = atomic_load(&b.state);
	ck_assert(!allot__bucket_lease(&b, now, 16, &t));
	ck_assert_uint_eq(atomic_load(&b.state), s0);
	ck_assert_uint_eq(atomic_load(&b.leased), 16);
	/* Closing it with 10 unspent: those 10 come back, no more. */
	allot__bucket_unlease(&b, 16, 10, now);
	ck_assert_uint_eq(atomic_load(&b.leased), 0);
	ck_assert(take(now, 10, &t));
	ck_assert(!take(now, 1, &t));
	/* And a swap retires the slot the lease was taken under. */
	ck_assert(take(now + 3600 * S, 50, &t));
	ck_assert(allot__bucket_lease(&b, now + 3600 * S, 4, &t));
	uint32_t ver = t.ver;
	ck_assert(allot__bucket_lease_live(&b, ver));
	allot__allowance a2 = {
		.rate = 2, .burst = 100, .mode = ALLOT__MODE_LIMIT
	};
	allot__bucket_set(&b, &a2, now + 3600 * S);
	ck_assert(!allot__bucket_lease_live(&b, ver));
	allot__bucket_unlease(&b, 4, 4, now + 3600 * S);
	ck_assert_double_eq_tol(
	    allot__bucket_level(&b, now + 3600 * S), 50.0, 1e-6);
}
END_TEST

START_TEST(relet_keeps_the_reservation)
{
	/* A spent lease takes its next batch in one CAS, its reservation
	 * left in place: level + leased stays within the burst, another
	 * lease's reservation still holds the bucket down, and a batch the
	 * bucket has not got writes nothing. */
	allot__take t;
	mk(1, 40);
	uint64_t now = 10 * S;
	ck_assert(allot__bucket_lease(&b, now, 16, &t)); /* A */
	ck_assert(allot__bucket_lease(&b, now, 16, &t)); /* B */
	ck_assert_uint_eq(atomic_load(&b.leased), 32);
	ck_assert(take(now, 8, &t));
	ck_assert(!take(now, 1, &t));
	/* A has spent its 16 and the bucket is empty: no next batch, and
	 * nothing written. */
	uint64_t s0 = atomic_load(&b.state);
	ck_assert(!allot__bucket_relet(&b, now, 16, &t));
	ck_assert_uint_eq(atomic_load(&b.state), s0);
	ck_assert_uint_eq(atomic_load(&b.leased), 32);
	/* An hour later the bucket has refilled to burst - leased = 8: B's
	 * 16 and A's spent 16 are still reserved. A's relet counts its own
	 * reservation as its own, so it gets 16, and the 8 stay: A 16 + B
	 * 16 + 8 in the bucket = the burst. */
	now += 3600 * S;
	ck_assert(allot__bucket_relet(&b, now, 16, &t));
	ck_assert(t.allowed);
	ck_assert_uint_eq(atomic_load(&b.leased), 32);
	ck_assert(take(now, 8, &t));
	ck_assert(!take(now, 1, &t));
	/* Both closed, nothing unspent: the bucket refills to the burst
	 * and never above it. */
	allot__bucket_unlease(&b, 16, 0, now);
	allot__bucket_unlease(&b, 16, 0, now);
	ck_assert_uint_eq(atomic_load(&b.leased), 0);
	now += 3600 * S;
	ck_assert(take(now, 40, &t));
	ck_assert(!take(now, 1, &t));
	/* Not a bucket in MODE_LIMIT: no relet, nothing written. */
	allot__allowance open = { .mode = ALLOT__MODE_OPEN };
	allot__bucket_set(&b, &open, now);
	s0 = atomic_load(&b.state);
	ck_assert(!allot__bucket_relet(&b, now, 4, &t));
	ck_assert_uint_eq(atomic_load(&b.state), s0);
}
END_TEST

START_TEST(thirty_simultaneous)
{
	/* rate-limiting-between-services.txt: capacity 10, refill 5/s,
	 * 30 simultaneous requests from 30 threads: exactly 10 pass. */
	mk(5, 10);
	pthread_barrier_t bar;
	pthread_barrier_init(&bar, NULL, 30);
	_Atomic int admitted = 0;
	pthread_t th[30];
	struct burst_arg arg = { &bar, &admitted };
	for (int i = 0; i < 30; i++)
		pthread_create(&th[i], NULL, burst_thread, &arg);
	for (int i = 0; i < 30; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&bar);
	/* A refill of one more token would need the 30 threads to take
	 * 200 ms to start; they take well under 1 ms. */
	ck_assert_int_eq(atomic_load(&admitted), 10);
}
END_TEST

static _Atomic uint64_t vclock;
static _Atomic int stop_flag;
static _Atomic uint64_t swap_admitted;

static void *
hammer(void *p)
{
	(void) p;
	uint64_t n = 0;
	allot__take t;
	while (!atomic_load(&stop_flag)) {
		allot__bucket_take(&b, atomic_load(&vclock), 1, &t);
		n += t.allowed;
	}
	atomic_fetch_add(&swap_admitted, n);
	return NULL;
}

START_TEST(swap_under_concurrent_acquires)
{
	/* Acquirers hammer one bucket while this thread advances a virtual
	 * clock and swaps the rate every step. Demand is unbounded, so the
	 * admitted total must equal burst + the integral of the rate over
	 * time, within a token per swap of rounding. */
	const double burst = 50;
	mk(1000, burst);
	atomic_store(&vclock, 1 * S);
	atomic_store(&stop_flag, 0);
	atomic_store(&swap_admitted, 0);
	pthread_t th[3];
	for (int i = 0; i < 3; i++)
		pthread_create(&th[i], NULL, hammer, NULL);
	double expected = burst;
	double rate = 1000;
	const int steps = 400;
	for (int i = 0; i < steps; i++) {
		/* Let the acquirers drain the bucket at this time (bounded:
		 * a starved machine fails loudly rather than hanging). */
		struct timespec ts = { 0, 50000 };
		int waited = 0;
		while (allot__bucket_level(&b, atomic_load(&vclock)) >= 1.0) {
			nanosleep(&ts, NULL);
			ck_assert_msg(++waited < 100000,
			    "acquirers did not drain the bucket");
		}
		atomic_fetch_add(&vclock, 1 * MS);
		expected += rate * 0.001;
		rate = (i % 2) ? 1000 : 5000;
		allot__allowance a = {
			.rate = rate, .burst = burst, .mode = ALLOT__MODE_LIMIT
		};
		allot__bucket_set(&b, &a, atomic_load(&vclock));
	}
	struct timespec ts = { 0, 50000 };
	for (int w = 0; w < 100000 &&
	     allot__bucket_level(&b, atomic_load(&vclock)) >= 1.0;
	     w++)
		nanosleep(&ts, NULL);
	atomic_store(&stop_flag, 1);
	for (int i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
	double got = (double) atomic_load(&swap_admitted);
	ck_assert_msg(
	    got <= expected + 1.0, "admitted %.0f > %.1f", got, expected);
	ck_assert_msg(got >= expected - 0.01 * expected,
	    "admitted %.0f < %.1f", got, expected);
}
END_TEST

static Suite *
bucket_suite(void)
{
	Suite *s = suite_create("bucket");
	TCase *tc = tcase_create("math");
	tcase_add_test(tc, burst_then_refill);
	tcase_add_test(tc, cap_at_burst);
	tcase_add_test(tc, fractional_tokens);
	tcase_add_test(tc, retry_after_exact);
	tcase_add_test(tc, cost_weighted);
	tcase_add_test(tc, swap_preserves_level);
	tcase_add_test(tc, open_and_closed);
	tcase_add_test(tc, tiny_rate);
	tcase_add_test(tc, saturation);
	tcase_add_test(tc, adjust_debt_and_refund);
	tcase_add_test(tc, parts_of_a_token);
	tcase_add_test(tc, lease_inside_the_burst);
	tcase_add_test(tc, relet_keeps_the_reservation);
	suite_add_tcase(s, tc);
	tc = tcase_create("threads");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, thirty_simultaneous);
	tcase_add_test(tc, swap_under_concurrent_acquires);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(bucket_suite)
