/* SPDX-License-Identifier: MIT */
/*
 * The demand-aware allocator (coordinator/state/alloc.c) on exact inputs
 * (the registry driving it is tests/test_registry.c): water-filling
 * levels computed by hand, the floor of idle
 * replicas, the leftover spread, newcomers claiming the average, the
 * dead band (and targets it no longer holds below their mark, and the
 * burst budget it never leaves unallotted), a quota short on its
 * bodies cut in proportion, the body's window of short intervals, sums
 * that never exceed R, B, the burst budget or the ceiling over
 * thousands of random rounds, bursts split with no replica
 * weighed below its equal part, the long-run part of the traffic
 * claimed by a replica whose last windows were quiet, replicas not heard since
 * demand appeared keeping their targets, the ceiling served in reverse shed
 * order and max-min fair within a class.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>

#include "state/alloc.h"
#include "runner.h"

#define EPS 1e-9

/* A policy with the margins off, so that levels are exact numbers. */
static allot__alloc_policy
exact_policy(void)
{
	allot__alloc_policy p;
	allot__alloc_policy_init(&p);
	p.headroom = 0;
	p.floor_fraction = 0;
	p.replica_floor = 0;
	p.deadband = 0;
	return p;
}

/* One quota over `n` slots with the given demands. */
static void
one_quota(allot__alloc_quota *q, allot__alloc_slot *sl, size_t n,
    const double *demand, double R, double B)
{
	for (size_t i = 0; i < n; i++)
		sl[i] = (allot__alloc_slot) { .replica = (uint32_t) i,
			.demand = demand[i] };
	*q = (allot__alloc_quota) {
		.rate = R, .burst = B, .min_burst = 1, .slots = sl, .nslots = n
	};
}

static void
run(const allot__alloc_policy *p, allot__alloc_quota *q, size_t nq,
    double ceiling)
{
	allot__alloc_service svc = {
		.ceiling_rate = ceiling, .quotas = q, .nquotas = nq
	};
	ck_assert_int_eq(allot__alloc_compute(p, &svc), ALLOT_OK);
}

START_TEST(waterfill_contended)
{
	/* Claims 160 > R = 100: 10 and 20 are served in full, the two
	 * larger share the remaining 70 equally. */
	allot__alloc_policy p = exact_policy();
	allot__alloc_slot sl[4];
	allot__alloc_quota q;
	one_quota(&q, sl, 4, (double[]) { 10, 20, 50, 80 }, 100, 200);
	run(&p, &q, 1, 0);
	ck_assert_double_eq_tol(sl[0].rate, 10, EPS);
	ck_assert_double_eq_tol(sl[1].rate, 20, EPS);
	ck_assert_double_eq_tol(sl[2].rate, 35, EPS);
	ck_assert_double_eq_tol(sl[3].rate, 35, EPS);
	ck_assert(q.sum_rate <= 100);
	ck_assert_double_eq_tol(q.claim, 160, EPS);
	ck_assert_double_eq_tol(q.allowance, 100, EPS);
	/* Max-min fair: nobody above the level, nobody below its claim
	 * unless at the level. */
	for (int i = 0; i < 4; i++)
		ck_assert(sl[i].rate <= 35 + EPS);
}
END_TEST

START_TEST(waterfill_leftover)
{
	/* Claims 90 < R: everyone is raised to the common level, the big
	 * one keeps its claim: 2x + 60 = 100, x = 20. */
	allot__alloc_policy p = exact_policy();
	allot__alloc_slot sl[3];
	allot__alloc_quota q;
	one_quota(&q, sl, 3, (double[]) { 10, 20, 60 }, 100, 200);
	run(&p, &q, 1, 0);
	ck_assert_double_eq_tol(sl[0].rate, 20, EPS);
	ck_assert_double_eq_tol(sl[1].rate, 20, EPS);
	ck_assert_double_eq_tol(sl[2].rate, 60, EPS);
	/* Low and equal demands: exactly the equal split, whatever the
	 * noise below it. */
	one_quota(&q, sl, 3, (double[]) { 3, 17, 31 }, 100, 200);
	run(&p, &q, 1, 0);
	for (int i = 0; i < 3; i++)
		ck_assert_double_eq_tol(sl[i].rate, 100.0 / 3, EPS);
	/* With the default headroom the claims are demand * 1.25. */
	allot__alloc_policy d;
	allot__alloc_policy_init(&d);
	d.deadband = 0;
	one_quota(&q, sl, 3, (double[]) { 0, 0, 64 }, 100, 200);
	run(&d, &q, 1, 0);
	ck_assert_double_eq_tol(sl[2].rate, 80, EPS);
	ck_assert_double_eq_tol(sl[0].rate, 10, EPS);
}
END_TEST

START_TEST(waterfill_floor)
{
	/* An idle replica keeps replica_floor of the equal share even
	 * when the others want everything. */
	allot__alloc_policy p = exact_policy();
	p.replica_floor = 0.3;
	allot__alloc_slot sl[3];
	allot__alloc_quota q;
	one_quota(&q, sl, 3, (double[]) { 0, 200, 200 }, 100, 200);
	for (size_t i = 0; i < 3; i++)
		sl[i].served = true;
	run(&p, &q, 1, 0);
	ck_assert_double_eq_tol(sl[0].rate, 10, EPS);
	ck_assert_double_eq_tol(sl[1].rate, 45, EPS);
	ck_assert_double_eq_tol(sl[2].rate, 45, EPS);
	/* One that never served the quota keeps floor_fraction. */
	p.floor_fraction = 0.15;
	sl[0].served = false;
	run(&p, &q, 1, 0);
	ck_assert_double_eq_tol(sl[0].rate, 5, EPS);
	ck_assert_double_eq_tol(sl[1].rate, 47.5, EPS);
}
END_TEST

START_TEST(newcomer_claims_average)
{
	/* Three replicas each claim 80 of R = 100 (an old estimate from
	 * before a scale-up); the newcomer has no estimate. It claims the
	 * average, so the split lands on R/4 at once rather than leaving it
	 * the crumbs. */
	allot__alloc_policy p = exact_policy();
	allot__alloc_slot sl[4];
	allot__alloc_quota q;
	one_quota(&q, sl, 4, (double[]) { 80, 80, 80, 0 }, 100, 200);
	sl[3].fresh = true;
	run(&p, &q, 1, 0);
	for (int i = 0; i < 4; i++)
		ck_assert_double_eq_tol(sl[i].rate, 25, EPS);
	/* Nobody known: the newcomers claim nothing and get the split. */
	for (int i = 0; i < 4; i++)
		sl[i].fresh = true;
	run(&p, &q, 1, 0);
	for (int i = 0; i < 4; i++)
		ck_assert_double_eq_tol(sl[i].rate, 25, EPS);
}
END_TEST

START_TEST(deadband)
{
	allot__alloc_policy p = exact_policy();
	p.deadband = 0.05;
	allot__alloc_slot sl[2];
	allot__alloc_quota q;
	one_quota(&q, sl, 2, (double[]) { 30, 70 }, 100, 200);
	run(&p, &q, 1, 0);
	ck_assert_double_eq_tol(sl[0].rate, 30, EPS);
	/* A 3 % move is ignored when the sum allows it... */
	for (int i = 0; i < 2; i++) {
		sl[i].has_prev = true;
		sl[i].prev_rate = sl[i].rate;
		sl[i].prev_burst = sl[i].burst;
	}
	sl[0].demand = 31;
	sl[1].demand = 69;
	run(&p, &q, 1, 0);
	ck_assert_double_eq_tol(sl[0].rate, 30, EPS);
	ck_assert_double_eq_tol(sl[1].rate, 70, EPS);
	/* ...and a 20 % one is not; the sum never exceeds R. */
	sl[0].demand = 40;
	sl[1].demand = 60;
	run(&p, &q, 1, 0);
	ck_assert_double_eq_tol(sl[0].rate, 40, EPS);
	ck_assert_double_eq_tol(sl[1].rate, 60, EPS);
	/* A noisy estimate (a replica seeing a few requests per interval)
	 * widens the band to 2 standard deviations: a 33 % rise on an
	 * estimate of 40 +- 20 stays put... */
	p.noise_z = 2;
	sl[0].prev_rate = 30;
	sl[1].prev_rate = 70;
	sl[0].demand = 40;
	sl[0].demand_var = 400;
	sl[1].demand = 60;
	sl[1].demand_var = 400;
	run(&p, &q, 1, 0);
	ck_assert_double_eq_tol(sl[0].rate, 30, EPS);
	ck_assert_double_eq_tol(sl[1].rate, 70, EPS);
	/* ...unless the replica was denied: it is short, the rise passes
	 * (and the other gives way for the sum). */
	sl[0].denied = 5;
	run(&p, &q, 1, 0);
	ck_assert_double_eq_tol(sl[0].rate, 40, EPS);
	ck_assert_double_eq_tol(sl[1].rate, 60, EPS);
	sl[0].denied = 0;
	sl[0].demand_var = sl[1].demand_var = 0;
	/* A kept target that no longer fits gives way. */
	sl[0].prev_rate = 40;
	sl[1].prev_rate = 60;
	sl[0].demand = 41.5; /* within 5 % of 40, but 60 -> 58.5 also */
	sl[1].demand = 58.5;
	run(&p, &q, 1, 0);
	ck_assert(sl[0].rate + sl[1].rate <= 100);
}
END_TEST

/* The dead band holds a burst against small moves, but never leaves
 * burst capacity unallotted: bursts it held below their new value rise
 * until the budget is spent (held 4 % low on every replica, the
 * `swarm` family's small quotas were refused more than under the equal
 * split). */
START_TEST(deadband_spends_the_burst_budget)
{
	allot__alloc_policy p = exact_policy();
	p.deadband = 0.05;
	allot__alloc_slot sl[4];
	allot__alloc_quota q;
	one_quota(&q, sl, 4, (double[]) { 10, 10, 10, 10 }, 100, 100);
	run(&p, &q, 1, 0);
	for (int i = 0; i < 4; i++) {
		ck_assert_double_eq_tol(sl[i].burst, 25, EPS);
		sl[i].has_prev = true;
		sl[i].prev_rate = sl[i].rate;
		sl[i].prev_burst = 24; /* within 5 % of 25 */
	}
	run(&p, &q, 1, 0);
	double sum = 0;
	for (int i = 0; i < 4; i++) {
		ck_assert_msg(sl[i].burst >= 25 - EPS, "slot %d held at %.2f",
		    i, sl[i].burst);
		sum += sl[i].burst;
	}
	ck_assert_double_eq_tol(sum, 100, EPS);
	/* Held above (a small fall): kept, the sum within B. */
	for (int i = 0; i < 4; i++)
		sl[i].prev_burst = 25.5;
	sl[3].prev_burst = 24;
	run(&p, &q, 1, 0);
	sum = 0;
	for (int i = 0; i < 4; i++)
		sum += sl[i].burst;
	ck_assert(sum <= 100 + EPS);
}
END_TEST

/* A quota short on the bodies of its traffic (every replica waits for
 * the central reserve): each body is cut in the same proportion, so
 * every bucket refills below what its own traffic spends and none fills
 * with tokens the others' requests cannot reach; max-min gave the small
 * ones all they claimed. Below the allowance, the water-fill as ever. */
static void
all_wait(allot__alloc_quota *q, allot__alloc_slot *sl, size_t n)
{
	q->central = true;
	q->reserve = 1;
	for (size_t i = 0; i < n; i++) {
		sl[i].tail = true;
		sl[i].demand_body = sl[i].demand;
	}
}

START_TEST(short_bodies_cut_in_proportion)
{
	allot__alloc_policy p = exact_policy();
	p.central_pool = 0.1;
	allot__alloc_slot sl[7];
	allot__alloc_quota q;
	/* The `sizing` family at a burst: 80 % of 420/s on one replica,
	 * 14/s on each of six others, R = 140. */
	double d[7] = { 336, 14, 14, 14, 14, 14, 14 };
	one_quota(&q, sl, 7, d, 140, 280);
	all_wait(&q, sl, 7);
	run(&p, &q, 1, 0);
	double k = 0.9 * 140 / 420;
	for (int i = 0; i < 7; i++)
		ck_assert_msg(sl[i].rate < d[i],
		    "slot %d at %.2f/s for a body of %.0f/s", i, sl[i].rate,
		    d[i]);
	for (int i = 0; i < 7; i++)
		ck_assert_double_eq_tol(sl[i].rate, d[i] * k, 1e-6);
	ck_assert(q.sum_rate <= 0.9 * 140 + EPS);
	/* Bodies below the allowance (claims above the pooled part only
	 * with the headroom): max-min, the small ones served in full. */
	p.headroom = 0.5;
	double e[3] = { 80, 10, 10 };
	one_quota(&q, sl, 3, e, 140, 280);
	all_wait(&q, sl, 3);
	run(&p, &q, 1, 0);
	ck_assert_double_eq_tol(sl[1].rate, 15, 1e-6);
	ck_assert_double_eq_tol(sl[2].rate, 15, 1e-6);
	ck_assert_double_eq_tol(sl[0].rate, 0.9 * 140 - 30, 1e-6);
	/* A replica that does not wait is split as without a reserve. */
	one_quota(&q, sl, 7, d, 140, 280);
	all_wait(&q, sl, 7);
	sl[6].tail = false;
	p.headroom = 0;
	run(&p, &q, 1, 0);
	ck_assert_double_eq_tol(sl[1].rate, 14, 1e-6);
}
END_TEST

/* A replica that waits for the reserve holds the body of its traffic:
 * four intervals of its rate, intervals of at most 100 ms. At T = 1 s
 * four intervals held 4 s of every replica's rate out of the reserve's
 * reach, and the tail path refused more than local only. */
START_TEST(body_window_counts_short_intervals)
{
	allot__alloc_policy p = exact_policy();
	allot__alloc_slot sl[2];
	allot__alloc_quota q;
	const double T[3] = { 0.05, 0.1, 1.0 }, want[3] = { 20, 40, 40 };
	for (int t = 0; t < 3; t++) {
		one_quota(&q, sl, 2, (double[]) { 100, 100 }, 1000, 1000);
		all_wait(&q, sl, 2);
		allot__alloc_service svc = {
			.quotas = &q, .nquotas = 1, .interval_s = T[t]
		};
		ck_assert_int_eq(allot__alloc_compute(&p, &svc), ALLOT_OK);
		for (int i = 0; i < 2; i++) {
			ck_assert_double_eq_tol(sl[i].rate, 100, 1e-9);
			ck_assert_msg(fabs(sl[i].burst - want[t]) < 1e-9,
			    "T = %.2f s: a burst of %.1f for a body of 100/s",
			    T[t], sl[i].burst);
		}
	}
}
END_TEST

/* A target that the dead band held below where its replica belongs
 * (the `ramp` family: a few heavy requests make each estimate so noisy
 * that the band's noise term covers any move) rises to its mark, the
 * smaller of its long-run part of the allowance and the equal share;
 * a replica the callers never reach keeps its low target. */
/* Give each of the `n` slots a history: its slow estimate, the variance
 * of its estimate and the target of the previous round (burst 100). */
static void
with_history(allot__alloc_slot *sl, size_t n, const double *slow, double var,
    const double *prev)
{
	for (size_t i = 0; i < n; i++) {
		sl[i].demand_slow = slow[i];
		sl[i].demand_var = var;
		sl[i].has_prev = true;
		sl[i].prev_rate = prev[i];
		sl[i].prev_burst = 100;
	}
}

START_TEST(deadband_lifts_to_mark)
{
	allot__alloc_policy p = exact_policy();
	p.deadband = 0.05;
	p.noise_z = 2;
	allot__alloc_slot sl[4];
	allot__alloc_quota q;
	/* Every replica serves a quarter of the traffic in the long run;
	 * replica 0's last windows held no heavy request (10 +- 20), and
	 * its target is still the 10 of a round like that. */
	one_quota(&q, sl, 4, (double[]) { 10, 30, 30, 30 }, 100, 400);
	with_history(sl, 4, (double[]) { 25, 25, 25, 25 }, 400,
	    (double[]) { 10, 30, 30, 30 });
	run(&p, &q, 1, 0);
	/* Replica 0 claims its long-run part, 25; the others 30 each:
	 * max-min at 25. Its rise 10 -> 25 is within the band (2 x 20),
	 * but 10 is below its mark (25): it passes, and the others give
	 * way for the sum. Without the mark replica 0 stayed at 10. */
	ck_assert_double_eq_tol(sl[0].rate, 25, 1e-9);
	double sum = 0;
	for (size_t i = 0; i < 4; i++)
		sum += sl[i].rate;
	ck_assert(sum <= 100);
	for (size_t i = 1; i < 4; i++)
		ck_assert_double_eq_tol(sl[i].rate, 25, 1e-9);
	/* Sticky callers that never reach replica 0 (a long-run part of
	 * 0): its mark is 0 and the band keeps its target. */
	one_quota(&q, sl, 4, (double[]) { 10, 30, 30, 30 }, 100, 400);
	with_history(sl, 4, (double[]) { 0, 30, 30, 30 }, 400,
	    (double[]) { 5, 30, 30, 30 });
	run(&p, &q, 1, 0);
	ck_assert_double_eq_tol(sl[0].rate, 5, 1e-9);
	/* The mark is at most the equal share: a replica whose long-run
	 * part is above it (skewed callers) is lifted to the equal share
	 * only, and rises further by its claim as before. */
	one_quota(&q, sl, 4, (double[]) { 20, 10, 10, 10 }, 100, 400);
	with_history(sl, 4, (double[]) { 60, 10, 10, 10 }, 900,
	    (double[]) { 10, 20, 20, 20 });
	run(&p, &q, 1, 0);
	/* Replica 0 claims its long-run part, 50 x 60 / 90 = 33.3, the
	 * others 10 each, and the leftover raises them to 22.2. Replica
	 * 0's rise from 10 is within the band (2 x 30) and stops at the
	 * equal share, 25; the others' rise to 22.2 is within it too. */
	ck_assert_double_eq_tol(sl[0].rate, 25, 1e-9);
}
END_TEST

/* xorshift64* for the property test. */
static uint64_t rng = 88172645463325252ull;
static double
urand(void)
{
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return (double) ((rng * 0x2545f4914f6cdd1dull) >> 11) /
	    9007199254740992.0;
}

START_TEST(sums_never_exceed)
{
	enum { NQ = 6, NS = 40 };
	static allot__alloc_slot sl[NQ][NS];
	allot__alloc_quota q[NQ];
	allot__alloc_policy p;
	allot__alloc_policy_init(&p);
	for (int round = 0; round < 4000; round++) {
		double ceiling = urand() < 0.5 ? 0 : 1 + urand() * 3000;
		for (int k = 0; k < NQ; k++) {
			size_t n = (size_t) (urand() * NS);
			double R = pow(10, urand() * 6 - 2);
			double B = R * (0.01 + urand() * 10);
			for (size_t i = 0; i < n; i++) {
				double u = urand();
				sl[k][i] = (allot__alloc_slot) {
					.demand = u < 0.2 ? 0 :
					    u < 0.3       ? NAN :
					                    R * urand() * 3,
					.demand_var = urand() < 0.5 ?
					    0 :
					    R * R * urand(),
					.demand_slow = urand() < 0.3 ?
					    0 :
					    R * urand() * 2,
					.fresh = urand() < 0.1,
					.has_prev = urand() < 0.7,
					.prev_rate = R * urand(),
					.prev_burst = B * urand(),
				};
			}
			q[k] = (allot__alloc_quota) { .rate = R,
				.burst = B,
				.priority = (uint32_t) (urand() * 4),
				.min_burst = urand() * 20,
				.slots = sl[k],
				.nslots = n };
		}
		run(&p, q, NQ, ceiling);
		double total = 0;
		for (int k = 0; k < NQ; k++) {
			double sr = 0, sb = 0;
			for (size_t i = 0; i < q[k].nslots; i++) {
				INVARIANT(
				    sl[k][i].rate >= 0 && sl[k][i].burst >= 0,
				    "round %d quota %d slot %zu: rate %.17g "
				    "burst %.17g",
				    round, k, i, sl[k][i].rate,
				    sl[k][i].burst);
				sr += sl[k][i].rate;
				sb += sl[k][i].burst;
			}
			INVARIANT(sr <= q[k].allowance,
			    "round %d quota %d: %.17g > %.17g", round, k, sr,
			    q[k].allowance);
			INVARIANT(q[k].allowance <= q[k].rate,
			    "round %d quota %d: allowance %.17g > rate %.17g",
			    round, k, q[k].allowance, q[k].rate);
			INVARIANT(sb <= q[k].burst_budget &&
			        q[k].burst_budget <= q[k].burst,
			    "round %d quota %d: bursts %.17g, budget %.17g, "
			    "burst %.17g",
			    round, k, sb, q[k].burst_budget, q[k].burst);
			INVARIANT(q[k].sum_rate == sr,
			    "round %d quota %d: sum_rate %.17g, slots %.17g",
			    round, k, q[k].sum_rate, sr);
			total += q[k].allowance;
		}
		if (ceiling > 0)
			INVARIANT(total <= ceiling,
			    "round %d: %.17g > "
			    "ceiling %.17g",
			    round, total, ceiling);
	}
}
END_TEST

START_TEST(burst_split)
{
	allot__alloc_policy p = exact_policy();
	allot__alloc_slot sl[4];
	allot__alloc_quota q;
	/* B split in proportion to the rates, none below the equal
	 * share's (100 / 4 = 25), so the weights are 25, 25, 25 and 70,
	 * each at least the largest weight (5). Split by the rates alone,
	 * the replicas at 10 would get 5 + 38. */
	one_quota(&q, sl, 4, (double[]) { 10, 10, 10, 70 }, 100, 400);
	q.min_burst = 5;
	run(&p, &q, 1, 0);
	ck_assert_double_eq_tol(q.burst_budget, 400, EPS);
	ck_assert_double_eq_tol(sl[3].burst, 5 + 380 * 70 / 145.0, 1e-6);
	ck_assert_double_eq_tol(sl[0].burst, 5 + 380 * 25 / 145.0, 1e-6);
	ck_assert(sl[0].burst > 5 + 380 * 0.1 + 1);
	ck_assert(q.sum_burst <= 400);
	/* A ceiling that cuts the allowance to 20 % of R cuts the budget
	 * with it: 80 tokens, each replica's share by the same weights
	 * (the equal share is now 5). */
	run(&p, &q, 1, 20);
	ck_assert_double_eq_tol(q.allowance, 20, 1e-9);
	ck_assert_double_eq_tol(q.burst_budget, 80, EPS);
	ck_assert(q.sum_burst <= 80);
	/* The same rates, but in the long run every replica carries a
	 * quarter (replica 3 just served a burst that the next one will
	 * not repeat there): no weight above the long-run part (25), so
	 * the bursts are equal. */
	one_quota(&q, sl, 4, (double[]) { 10, 10, 10, 70 }, 100, 400);
	for (size_t i = 0; i < 4; i++)
		sl[i].demand_slow = 20;
	run(&p, &q, 1, 0);
	for (size_t i = 0; i < 4; i++)
		ck_assert_double_eq_tol(sl[i].burst, 100, 1e-6);
	/* Below the weights of all: no minimum, by the weights. */
	one_quota(&q, sl, 4, (double[]) { 10, 10, 10, 70 }, 100, 10);
	q.min_burst = 5;
	run(&p, &q, 1, 0);
	ck_assert_double_eq_tol(sl[3].burst, 10 * 70 / 145.0, 1e-9);
}
END_TEST

/* Random traffic: the replicas' last windows differ by chance (one saw a
 * burst, the others were quiet), but in the long run each carries a
 * quarter. A quiet replica claims at least its long-run part of the
 * quota's demand now, so it keeps about the equal share instead of the
 * floor; a replica the callers never reach (long-run 0) claims nothing
 * more. */
START_TEST(slow_share_claimed)
{
	allot__alloc_policy p = exact_policy();
	allot__alloc_slot sl[4];
	allot__alloc_quota q;
	/* Demand 110 of R = 100 in all; replica 0's last windows saw most
	 * of it, replicas 1-3 read low by chance (10 each: above a quarter
	 * of their long-run part). */
	one_quota(&q, sl, 4, (double[]) { 80, 10, 10, 10 }, 100, 400);
	for (size_t i = 0; i < 4; i++)
		sl[i].demand_slow = 20;
	run(&p, &q, 1, 0);
	/* exact_policy has no headroom: replicas 1-3 claim 110 / 4 = 27.5
	 * each, replica 0 its 80; 162.5 > 100, max-min: the level is 25
	 * (without the long-run part: 70 for replica 0, 10 for the
	 * others). */
	for (size_t i = 0; i < 4; i++)
		ck_assert_double_eq_tol(sl[i].rate, 25, 1e-9);
	/* The callers moved: replica 0 carried them in the long run but
	 * reads 0 now, replica 1 carries them now. Below a quarter of its
	 * long-run part, replica 0 claims nothing more, and replica 1 gets
	 * what it needs (with the part claimed, the level would be 50). */
	one_quota(&q, sl, 4, (double[]) { 0, 80, 0, 0 }, 100, 400);
	for (size_t i = 0; i < 4; i++)
		sl[i].demand_slow = i == 0 ? 80 : 0;
	run(&p, &q, 1, 0);
	ck_assert(sl[1].rate >= 80 - 1e-9);
	ck_assert(sl[0].rate < 20);
	/* Sticky traffic: replica 0 carries it all in the long run too;
	 * the others keep the floor (0 in exact_policy) plus the
	 * leftover. */
	one_quota(&q, sl, 4, (double[]) { 80, 0, 0, 0 }, 100, 400);
	for (size_t i = 0; i < 4; i++)
		sl[i].demand_slow = i == 0 ? 80 : 0;
	run(&p, &q, 1, 0);
	ck_assert_double_eq_tol(sl[0].rate, 80, 1e-9);
	for (size_t i = 1; i < 4; i++)
		ck_assert(sl[i].rate < 7 + 1e-9);
}
END_TEST

/* Demand appeared on replica 0 (its report says 300 tokens/s); replicas
 * 1-3 have not reported since, so their estimates (0) predate it. They
 * keep their targets, rate and burst, instead of dropping to the floor
 * and losing the tokens their buckets hold; replica 0 gets the rest.
 * Once they are not stale the water-fill moves the capacity. */
START_TEST(stale_keep_targets)
{
	allot__alloc_policy p = exact_policy();
	allot__alloc_slot sl[4];
	allot__alloc_quota q;
	one_quota(&q, sl, 4, (double[]) { 300, 0, 0, 0 }, 100, 200);
	for (size_t i = 0; i < 4; i++) {
		sl[i].has_prev = true;
		sl[i].prev_rate = 25;
		sl[i].prev_burst = 50;
		sl[i].stale = i > 0;
	}
	run(&p, &q, 1, 0);
	for (size_t i = 1; i < 4; i++) {
		ck_assert_double_eq_tol(sl[i].rate, 25, 1e-9);
		ck_assert_double_eq_tol(sl[i].burst, 50, 1e-9);
	}
	ck_assert_double_eq_tol(sl[0].rate, 25, 1e-9);
	/* The budget (B) less what the others keep. */
	ck_assert_double_eq_tol(sl[0].burst, 200 - 150, 1e-9);
	ck_assert(q.sum_rate <= 100 && q.sum_burst <= q.burst_budget);
	/* Kept bursts above the budget are scaled down to it: a ceiling
	 * of 35 cuts the allowance to 35 and the budget to 70. */
	run(&p, &q, 1, 35);
	ck_assert(q.sum_burst <= q.burst_budget + 1e-9);
	ck_assert_double_eq_tol(sl[1].burst, 70.0 / 3, 1e-9);
	/* Not stale: replica 0 takes what the idle ones do not claim. */
	for (size_t i = 1; i < 4; i++)
		sl[i].stale = false;
	run(&p, &q, 1, 0);
	ck_assert_double_eq_tol(sl[0].rate, 100, 1e-9);
}
END_TEST

START_TEST(ceiling_shed_order)
{
	/* Four classes (0 low .. 3 critical), R = 100 each and demand
	 * 300 each: a ceiling of 250 goes to critical, standard, then half
	 * of batch; low gets nothing. */
	allot__alloc_policy p = exact_policy();
	allot__alloc_slot sl[4][2];
	allot__alloc_quota q[4];
	for (int k = 0; k < 4; k++) {
		one_quota(&q[k], sl[k], 2, (double[]) { 150, 150 }, 100, 100);
		q[k].priority = (uint32_t) k;
	}
	run(&p, q, 4, 250);
	ck_assert_double_eq_tol(q[3].allowance, 100, EPS);
	ck_assert_double_eq_tol(q[2].allowance, 100, EPS);
	ck_assert_double_eq_tol(q[1].allowance, 50, EPS);
	ck_assert_double_eq_tol(q[0].allowance, 0, EPS);
	ck_assert_double_eq_tol(sl[1][0].rate, 25, EPS);
	ck_assert_double_eq_tol(sl[0][0].rate, 0, EPS);
	ck_assert_double_eq_tol(sl[0][0].burst, 0, EPS);
	/* Bursts shrink with the allowance. */
	ck_assert(q[1].burst_budget <= 50 + EPS);

	/* Within a class, max-min fair across callers in tokens/s: wants
	 * 30 and 200 (capped at R = 100) share 80 as 30 and 50. */
	one_quota(&q[0], sl[0], 1, (double[]) { 30 }, 100, 100);
	one_quota(&q[1], sl[1], 1, (double[]) { 200 }, 100, 100);
	q[0].priority = q[1].priority = 1;
	run(&p, q, 2, 80);
	ck_assert_double_eq_tol(q[0].allowance, 30, EPS);
	ck_assert_double_eq_tol(q[1].allowance, 50, EPS);

	/* Not binding: everyone gets its want and the rest of the ceiling
	 * in proportion to R (quota 1 has R = 300). */
	one_quota(&q[0], sl[0], 1, (double[]) { 10 }, 100, 100);
	one_quota(&q[1], sl[1], 1, (double[]) { 10 }, 300, 100);
	run(&p, q, 2, 200);
	ck_assert_double_eq_tol(q[0].allowance, 50, EPS);
	ck_assert_double_eq_tol(q[1].allowance, 150, EPS);
	/* No ceiling, or one above the sum of R: the quotas as they are. */
	run(&p, q, 2, 1000);
	ck_assert_double_eq_tol(q[1].allowance, 300, EPS);
}
END_TEST

START_TEST(static_and_names)
{
	allot__alloc_policy p = { .kind = ALLOT__ALLOC_STATIC };
	ck_assert_str_eq(allot__alloc_name(&p), "static_split");
	allot__alloc_policy_init(&p);
	ck_assert_str_eq(allot__alloc_name(&p), "demand");
	p.kind = (allot__alloc_kind) 77;
	ck_assert_str_eq(allot__alloc_name(&p), "unknown");
	allot__alloc_slot sl[2];
	allot__alloc_quota q;
	one_quota(&q, sl, 2, (double[]) { 1, 1 }, 10, 10);
	allot__alloc_service svc = { .quotas = &q, .nquotas = 1 };
	ck_assert_int_eq(allot__alloc_compute(&p, &svc), ALLOT_EINVAL);
	ck_assert(sl[0].rate == 0 && q.sum_rate == 0);
}
END_TEST

static Suite *
alloc_suite(void)
{
	Suite *s = suite_create("alloc");
	TCase *tc = tcase_create("allocator");
	tcase_add_test(tc, waterfill_contended);
	tcase_add_test(tc, waterfill_leftover);
	tcase_add_test(tc, waterfill_floor);
	tcase_add_test(tc, newcomer_claims_average);
	tcase_add_test(tc, deadband);
	tcase_add_test(tc, deadband_spends_the_burst_budget);
	tcase_add_test(tc, deadband_lifts_to_mark);
	tcase_add_test(tc, short_bodies_cut_in_proportion);
	tcase_add_test(tc, body_window_counts_short_intervals);
	tcase_add_test(tc, sums_never_exceed);
	tcase_add_test(tc, burst_split);
	tcase_add_test(tc, slow_share_claimed);
	tcase_add_test(tc, stale_keep_targets);
	tcase_add_test(tc, ceiling_shed_order);
	tcase_add_test(tc, static_and_names);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(alloc_suite)
