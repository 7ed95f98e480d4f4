/* SPDX-License-Identifier: MIT */
/*
 * Allocation policies behind allot__alloc_compute() (alloc.h): the static
 * split and the demand-aware allocator. docs/allocation.md states the
 * algorithm and the bound it guarantees; in short, per round and service:
 * every slot claims its demand estimate plus a headroom (a newcomer
 * without an estimate claims the average of the others); under a global
 * ceiling the quotas' allowances are served in reverse shed order,
 * max-min fair by claim within a class, and otherwise the ceiling's
 * leftover is spread in proportion to R; each quota's allowance is
 * water-filled across its slots (max-min fair by claim when the claims
 * exceed it, everyone raised to a common level when they do not, never
 * below a small floor); a target moves only by more than a dead band
 * that also covers the noise of the slot's estimate, except a rise for a
 * replica that was denied or whose target is below its mark (the
 * smaller of its long-run part of the allowance and the equal share);
 * a replica claims at least its long-run part
 * of the quota's demand; and the burst budget B (scaled with the
 * allowance) is split in proportion to the rates, none below the equal
 * share's part, with at least the largest endpoint weight each when it
 * allows. All sums are shaved so that,
 * added in double precision, they never exceed their bound.
 */
#include "alloc.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <allot/allot.h>

/* A double at byte offset i * stride from base. */
#define AT(base, stride, i) \
	(*(double *) (void *) ((char *) (base) + (i) * (stride)))

void
allot__alloc_policy_init(allot__alloc_policy *pol)
{
	pol->kind = ALLOT__ALLOC_DEMAND;
	pol->floor_fraction = ALLOT__ALLOC_FLOOR_FRACTION;
	pol->replica_floor = ALLOT__ALLOC_REPLICA_FLOOR;
	pol->headroom = ALLOT__ALLOC_HEADROOM;
	pol->deadband = ALLOT__ALLOC_DEADBAND;
	pol->noise_z = ALLOT__ALLOC_NOISE_Z;
	pol->loan_frac = ALLOT__ALLOC_LOAN_FRAC;
	pol->central = true;
	pol->body_intervals = ALLOT__ALLOC_BODY_INTERVALS;
	pol->central_pool = ALLOT__ALLOC_CENTRAL_POOL;
}

/* Divide `total` in n equal parts whose sum, added in double precision,
 * does not exceed `total`: rounding may make n * (total / n) a hair
 * larger than total, which would break the Σ <= R invariant the tests
 * and auditors check. */
static double
equal_part(double total, size_t n)
{
	double part = total / (double) n;
	double sum = 0;
	for (size_t i = 0; i < n; i++)
		sum += part;
	while (sum > total && part > 0) {
		part = part * (1.0 - 1e-15);
		sum = 0;
		for (size_t i = 0; i < n; i++)
			sum += part;
	}
	return part;
}

/* Scale n non-negative values down until their sum, added in order,
 * is at most `total`; returns that sum. The values are already within a
 * few ulps of fitting, so this is one or two passes. */
static double
fit_sum(double *base, size_t stride, size_t n, double total)
{
	double sum = 0;
	for (size_t i = 0; i < n; i++)
		sum += AT(base, stride, i);
	for (int pass = 0; sum > total; pass++) {
		double f = pass < 60 && total > 0 ?
		    total / sum * (1.0 - 4e-16 * (double) (pass + 1)) :
		    0;
		sum = 0;
		for (size_t i = 0; i < n; i++) {
			AT(base, stride, i) *= f;
			sum += AT(base, stride, i);
		}
	}
	return sum;
}

/* The water level x with sum_i min(c_i, w_i x) = total, for
 * sum_i c_i >= total (`cap`, max-min fair: everyone below the level keeps
 * its claim, the others get the level), or with sum_i max(c_i, w_i x) =
 * total, for sum_i c_i <= total (!`cap`: everyone is raised to the level,
 * those above keep their own). w == NULL means w_i = 1; an item with
 * c_i = w_i = 0 takes no part. Each pass pins the claims on the fixed
 * side of the current level. The level moves one way only (up from
 * total / sum w under `cap`, down otherwise), so at most n + 1 passes (a
 * handful in practice). */
static double
level(const double *c, size_t cs, const double *w, size_t ws, size_t n,
    double total, bool cap)
{
	double sw = 0;
	for (size_t i = 0; i < n; i++)
		sw += w != NULL ? AT(w, ws, i) : 1.0;
	if (!(sw > 0))
		return 0;
	double x = total / sw;
	for (size_t pass = 0; pass <= n; pass++) {
		double fixed = 0, free_w = 0;
		for (size_t i = 0; i < n; i++) {
			double wi = w != NULL ? AT(w, ws, i) : 1.0;
			double ci = AT(c, cs, i);
			if (cap ? ci <= wi * x : ci >= wi * x)
				fixed += ci;
			else
				free_w += wi;
		}
		if (!(free_w > 0))
			return cap ? x : 0;
		double nx = (total - fixed) / free_w;
		if (cap ? !(nx > x) : !(nx < x))
			return x;
		x = !cap && nx < 0 ? 0 : nx;
	}
	return x;
}

static double
level_cap(const double *c, size_t cs, const double *w, size_t ws, size_t n,
    double total)
{
	return level(c, cs, w, ws, n, total, true);
}

static double
level_floor(const double *m, size_t ms, const double *w, size_t ws, size_t n,
    double total)
{
	return level(m, ms, w, ws, n, total, false);
}

static void
zero_outputs(allot__alloc_service *svc)
{
	for (size_t q = 0; q < svc->nquotas; q++) {
		allot__alloc_quota *aq = &svc->quotas[q];
		for (size_t i = 0; i < aq->nslots; i++) {
			aq->slots[i].rate = 0;
			aq->slots[i].burst = 0;
		}
		aq->allowance = 0;
		aq->burst_budget = 0;
		aq->claim = 0;
		aq->sum_rate = 0;
		aq->sum_burst = 0;
	}
}

static void
static_split(allot__alloc_service *svc)
{
	for (size_t q = 0; q < svc->nquotas; q++) {
		allot__alloc_quota *aq = &svc->quotas[q];
		aq->sum_rate = 0;
		aq->sum_burst = 0;
		aq->claim = 0;
		aq->allowance = aq->rate;
		aq->burst_budget = aq->burst;
		if (aq->nslots == 0)
			continue;
		double r = equal_part(aq->rate, aq->nslots);
		double b = equal_part(aq->burst, aq->nslots);
		for (size_t i = 0; i < aq->nslots; i++) {
			aq->slots[i].rate = r;
			aq->slots[i].burst = b;
			aq->sum_rate += r;
			aq->sum_burst += b;
		}
	}
}

/* ---- demand-aware ---- */

/* A replica whose estimate reads below this fraction of its long-run
 * part has lost its callers rather than read low by chance (claims()). */
#define LONG_RUN_GONE 0.25

/* How far the dead band's noise term holds the target of a replica that
 * waits for the reserve against a fall: at most this fraction of it
 * (fill_quota()). Its demand's variance is its bursts', which the
 * reserve serves, and a body the traffic left (a burst that has moved
 * on, the equal share it was given at the service's birth) was held
 * there for good while the reserve ran dry. */
#define BODY_FALL_HELD 0.7

static double
nonneg(double x)
{
	return x > 0 && isfinite(x) ? x : 0;
}

/* The sum of the slots' slow estimates (a fresh slot has none yet). */
static double
slow_sum(const allot__alloc_quota *aq)
{
	double slow = 0;
	for (size_t i = 0; i < aq->nslots; i++)
		if (!aq->slots[i].fresh)
			slow += nonneg(aq->slots[i].demand_slow);
	return slow;
}

/* A slot's long-run part of `total`: its slow estimate over their sum
 * `slow`; 0 when unknown (a fresh slot, or no slow estimate at all). */
static double
long_run(const allot__alloc_slot *x, double total, double slow)
{
	if (x->fresh || !(slow > 0))
		return 0;
	return total * nonneg(x->demand_slow) / slow;
}

/* Whether a slot's agent waits for its quota's central reserve when its
 * bucket is short (allot__alloc_slot.tail): its bucket is then for the
 * body of its traffic and the rest of its part is pooled. A slot whose
 * callers never wait is split as without a reserve: they would be
 * refused what the reserve holds. */
static bool
waits(const allot__alloc_quota *aq, const allot__alloc_slot *x)
{
	return aq->central && x->tail;
}

/* Whether quota `aq` is short on the bodies of its traffic alone: every
 * slot waits for the reserve and their bodies (`bodies`, the sum of
 * their estimates, no headroom) are more than the allowance. Claims
 * pass the pooled part of a quota below its allowance on the headroom
 * and on noise; cut in proportion then, every replica would lean on
 * the reserve for a part of its body, which it lacks while allotd is
 * unreachable (`outage`: 0.93 -> 1.11 % with the cut from the pooled
 * part). */
static bool
short_on_bodies(const allot__alloc_quota *aq, double bodies)
{
	if (!aq->pooled || !(bodies > aq->allowance))
		return false;
	for (size_t i = 0; i < aq->nslots; i++)
		if (!waits(aq, &aq->slots[i]))
			return false;
	return true;
}

/* Every slot's demand estimate into slot->rate (scratch until
 * fill_quota) and the quota's claim, its demand plus headroom, into
 * aq->claim. */
static void
claims(const allot__alloc_policy *pol, allot__alloc_quota *aq)
{
	double known = 0;
	size_t nknown = 0;
	aq->pooled = false;
	for (size_t i = 0; i < aq->nslots; i++)
		aq->pooled |= waits(aq, &aq->slots[i]);
	for (size_t i = 0; i < aq->nslots; i++) {
		allot__alloc_slot *s = &aq->slots[i];
		if (s->fresh)
			continue;
		s->rate = nonneg(s->demand);
		/* With a central reserve the local bucket is for the body of
		 * the traffic: what the replica has seen both lately and in
		 * the long run. A burst lifts the fast estimate for a few
		 * intervals, but the next one lands anywhere and is served
		 * by the reserve; a rate kept for it here would refill a
		 * bucket nobody draws from while the reserve runs dry. */
		if (waits(aq, s))
			s->rate = nonneg(s->demand_body);
		known += s->rate;
		nknown++;
	}
	/* A newcomer has reported nothing yet: assume it takes its part of
	 * the load, the average of the others. That is what a load
	 * balancer spreading evenly gives it, and it makes a scale-up land
	 * on the equal split at once instead of starving the newcomers
	 * until the old replicas' estimates decay. */
	double avg = nknown > 0 ? known / (double) nknown : 0;
	/* At a service's birth (or a coordinator's, all placeholders)
	 * nobody's demand is known, and a replica whose callers wait has no
	 * floor: each claims the equal share, what the split would give it.
	 * Claiming nothing kept every such bucket closed for the first
	 * three rounds and sent every request central: half the steady
	 * scenarios' central decisions (docs/allocation.md, "Start-up"). */
	if (nknown == 0 && aq->pooled && aq->nslots > 0)
		avg = aq->rate / (double) aq->nslots;
	aq->demand = known + (double) (aq->nslots - nknown) * avg;
	/* A replica's estimate follows its last few windows; where the
	 * next ones land, when the load balancer spreads the callers at
	 * random, is its long-run part of the traffic. So every replica
	 * claims at least that part (its slow estimate over the slow
	 * estimates' sum) of the quota's demand now, the headroom already
	 * counted in: a replica whose last windows were quiet by chance
	 * (no heavy request, the burst landed elsewhere) is not cut below
	 * what it will see next, while a replica that the callers never
	 * reach (a slow estimate of 0) claims nothing more. */
	double slow = slow_sum(aq);
	/* Not for a replica whose traffic has gone, though: below a
	 * quarter of its long-run part it is not chance (a window without
	 * the heavy requests still reads about half) but sticky callers
	 * that moved to another replica (a redeploy, new connections),
	 * and the part they left must go where they went now, not after
	 * the slow estimate has decayed. */
	double hk = known / (1.0 + nonneg(pol->headroom));
	for (size_t i = 0; slow > 0 && i < aq->nslots; i++) {
		allot__alloc_slot *s = &aq->slots[i];
		double part = long_run(s, hk, slow);
		if (!s->fresh && !waits(aq, s) &&
		    s->rate >= LONG_RUN_GONE * part)
			s->rate = fmax(s->rate, part);
	}
	double total = 0;
	for (size_t i = 0; i < aq->nslots; i++) {
		allot__alloc_slot *s = &aq->slots[i];
		if (s->fresh)
			s->rate = avg;
		/* What the quota claims against the ceiling also covers the
		 * noise of each replica's estimate: the allowance is split
		 * by those estimates, and one that reads low must not leave
		 * its replica short when the ceiling binds. */
		total += s->rate +
		    (s->fresh ? 0 :
		                nonneg(pol->noise_z) *
		                sqrt(nonneg(s->demand_var)));
	}
	aq->claim = total * (1.0 + nonneg(pol->headroom));
}

/* The max-min fair level of class p sharing `left` (the level_cap of
 * the quotas of that class, by their wants in sum_rate). */
static double
class_level(const allot__alloc_quota *qs, size_t nq, uint32_t p, double left)
{
	double members = 0;
	for (size_t q = 0; q < nq; q++)
		if (qs[q].sum_burst > 0 && qs[q].priority == p)
			members += 1;
	if (!(members > 0))
		return 0;
	double x = left / members;
	for (size_t pass = 0; pass <= nq; pass++) {
		double fixed = 0, nfree = 0;
		for (size_t q = 0; q < nq; q++) {
			if (!(qs[q].sum_burst > 0) || qs[q].priority != p)
				continue;
			if (qs[q].sum_rate <= x)
				fixed += qs[q].sum_rate;
			else
				nfree += 1;
		}
		if (!(nfree > 0))
			return x;
		double nx = (left - fixed) / nfree;
		if (!(nx > x))
			return x;
		x = nx;
	}
	return x;
}

/* Add to every quota's allowance what it asks for in sum_rate, classes
 * in reverse shed order, out of `left`. */
static void
serve(allot__alloc_quota *qs, size_t nq, uint32_t top, double left)
{
	for (int64_t p = top; p >= 0 && left > 0; p--) {
		double want = 0;
		for (size_t q = 0; q < nq; q++)
			if (qs[q].sum_burst > 0 &&
			    qs[q].priority == (uint32_t) p)
				want += qs[q].sum_rate;
		if (!(want > 0))
			continue;
		if (want <= left) {
			for (size_t q = 0; q < nq; q++)
				if (qs[q].sum_burst > 0 &&
				    qs[q].priority == (uint32_t) p)
					qs[q].allowance += qs[q].sum_rate;
			left -= want;
			continue;
		}
		double x = class_level(qs, nq, (uint32_t) p, left);
		for (size_t q = 0; q < nq; q++)
			if (qs[q].sum_burst > 0 &&
			    qs[q].priority == (uint32_t) p)
				qs[q].allowance += fmin(qs[q].sum_rate, x);
		return;
	}
}

/* A quota the ceiling cut keeps its own allowance on the replicas
 * (Share.own_rate) while the demand does not bind: the ceiling's level
 * there holds it to the cut one together with the others' (agent/
 * ceiling.c). Not one with a central reserve, which the ceiling's
 * reserve serves instead. */
static void
own_factors(allot__alloc_quota *qs, size_t nq)
{
	for (size_t q = 0; q < nq; q++)
		if (!qs[q].central && qs[q].allowance > 0 &&
		    qs[q].allowance < qs[q].rate)
			qs[q].own = qs[q].rate / qs[q].allowance;
}

/* The allowance of every quota under the ceiling. sum_rate and
 * sum_burst serve as scratch (claim and weight) until fill_quota. */
static void
ceiling_split(const allot__alloc_policy *pol, allot__alloc_service *svc)
{
	size_t nq = svc->nquotas;
	allot__alloc_quota *qs = svc->quotas;
	double C = svc->ceiling_rate;
	double ff = pol->floor_fraction > 0 ? fmin(pol->floor_fraction, 1) : 0;
	double total_r = 0, total_want = 0;
	uint32_t top = 0;
	for (size_t q = 0; q < nq; q++) {
		allot__alloc_quota *aq = &qs[q];
		aq->allowance = 0;
		if (aq->nslots == 0 || !(aq->rate > 0)) {
			aq->sum_rate = 0; /* want */
			aq->sum_burst = 0; /* weight: takes no part */
			continue;
		}
		/* A quota wants what its replicas claim, at most R, and at
		 * least a small part of R so that a quota that just went
		 * quiet can admit again before the next round. */
		double want = fmin(aq->rate, fmax(aq->claim, ff * aq->rate));
		aq->sum_rate = want;
		aq->sum_burst = aq->rate;
		total_r += aq->rate;
		total_want += want;
		if (aq->priority > top)
			top = aq->priority;
	}
	const size_t st = sizeof *qs;
	if (!(C > 0) || total_r <= C) {
		for (size_t q = 0; q < nq; q++)
			qs[q].allowance = qs[q].sum_burst > 0 ? qs[q].rate : 0;
		return;
	}
	if (total_want <= C) {
		/* The ceiling does not bind on demand. A quota with a central
		 * reserve keeps all of R: its replicas' rates are their
		 * claims, and the rest waits in its reserve, which the
		 * ceiling's own reserve holds to C together with every other
		 * quota's (central.c); so an idle caller's burst at rest is
		 * not cut because others could use their quotas. The others
		 * get what they want and the rest of C is spread in
		 * proportion to R (capped at R), so a quota whose demand
		 * rises has room before the next round. */
		double central_want = 0, other = 0;
		for (size_t q = 0; q < nq; q++) {
			if (!(qs[q].sum_burst > 0) || !qs[q].pooled)
				continue;
			central_want += qs[q].sum_rate;
			qs[q].sum_burst = 0; /* not spread over below */
			qs[q].allowance = qs[q].rate;
		}
		double mu = level_floor(
		    &qs[0].sum_rate, st, &qs[0].sum_burst, st, nq, C);
		for (size_t q = 0; q < nq; q++) {
			allot__alloc_quota *aq = &qs[q];
			if (aq->sum_burst > 0) {
				aq->allowance = fmin(aq->rate,
				    fmax(aq->sum_rate, mu * aq->rate));
				other += aq->allowance;
			}
		}
		double room = C - central_want;
		for (size_t q = 0; other > room && q < nq; q++)
			if (qs[q].sum_burst > 0)
				qs[q].allowance *= room > 0 ? room / other : 0;
		for (size_t q = 0; q < nq; q++)
			if (qs[q].pooled && qs[q].allowance > 0)
				qs[q].sum_burst = qs[q].rate; /* its weight */
		own_factors(qs, nq);
		return;
	}
	/* It binds: the classes kept longest are served first, each in
	 * full while the ceiling lasts; the class where it runs out shares
	 * the rest max-min fairly by claim (in tokens/s: cost-weighted, and
	 * a claim includes the headroom, so a caller far above its demand
	 * cannot crowd the margin of the others out) and the classes below
	 * get nothing. */
	serve(qs, nq, top, C);
	fit_sum(&qs[0].allowance, st, nq, C);
	/* The claims bind, with their headroom and noise; the demand does
	 * not yet: the shed order is kept in the allowances, and what the
	 * quotas do not use of them is anyone's on each replica. */
	double demand = 0;
	for (size_t q = 0; q < nq; q++)
		if (qs[q].nslots > 0 && qs[q].rate > 0)
			demand += qs[q].demand;
	if (demand < C)
		own_factors(qs, nq);
}

/* The burst a slot of burst weight r (burst_weight) gets: at least the
 * largest endpoint weight w when the budget has that for every one of
 * the `nw` slots with a rate that need it (`floor`: whose agent raises
 * a smaller burst to w, allot__alloc_slot.tail), the rest in proportion
 * to the weights, which sum to sum_r. */
static double
burst_of(
    double r, double sum_r, double budget, double w, size_t nw, bool floor)
{
	if (!(r > 0) || !(sum_r > 0))
		return 0;
	double base = budget >= (double) nw * w ? w : 0;
	double rest = budget - (double) nw * base;
	return (floor ? base : 0) + (rest > 0 ? rest : 0) * (r / sum_r);
}

/* What a slot's burst is in proportion to: its rate, but no more than
 * its long-run part of the allowance A (A slow_i / `slow`, the sum of
 * the slow estimates, when that is known) and never less than the equal
 * share `eq` (A / n). A rate
 * follows where demand was over the last intervals; a burst is for
 * demand that has not arrived yet, and a burst after a quiet spell
 * lands wherever the load balancer sends it. Split by the rates alone,
 * a replica that just served a burst would hold most of the burst
 * budget and the one the next burst lands on a quarter of the equal
 * share: worse than the equal split whenever bursts land on random
 * replicas (the `pareto` family). A replica with steady demand above
 * the equal share (a high rate and a high long-run part) still gets the
 * larger burst. */
static double
burst_weight(
    const allot__alloc_quota *aq, const allot__alloc_slot *x, double slow)
{
	if (!(x->rate > 0))
		return 0;
	/* With a central reserve a burst at rest is the reserve's: the
	 * bucket of a replica that waits for it is for its own traffic. */
	if (waits(aq, x))
		return x->rate;
	double A = aq->allowance, eq = A / (double) aq->nslots;
	double r = x->rate;
	if (slow > 0 && !x->fresh)
		r = fmin(r, long_run(x, A, slow));
	return fmax(r, eq);
}

/* The burst of slot `x` before the dead band: burst_of() with its
 * weight among the `npos` slots' (weights summing to sum_r). */
static double
new_burst(const allot__alloc_quota *aq, const allot__alloc_slot *x,
    double slow, double sum_r, double budget, double w, size_t npos)
{
	return burst_of(
	    burst_weight(aq, x, slow), sum_r, budget, w, npos, !waits(aq, x));
}

/* A stale slot with a target to keep (see allot__alloc_slot). */
static bool
kept(const allot__alloc_slot *x)
{
	return x->stale && x->has_prev && x->prev_rate >= 0 &&
	    isfinite(x->prev_rate) && x->prev_burst >= 0 &&
	    isfinite(x->prev_burst);
}

/* The own allowances' targets (allot__alloc_slot.own_rate) of a quota
 * the ceiling cut, from the slots' rates. */
static void
own_targets(allot__alloc_quota *aq, double slow)
{
	size_t n = aq->nslots;
	allot__alloc_slot *sl = aq->slots;
	double sum_r = 0;
	size_t npos = 0;
	for (size_t i = 0; i < n; i++) {
		sl[i].own_rate = sl[i].own_burst = 0;
		if (aq->own > 1 && sl[i].rate > 0) {
			npos++;
			sum_r += burst_weight(aq, &sl[i], slow);
		}
	}
	if (!(aq->own > 1))
		return;
	double B = aq->burst, w = nonneg(aq->min_burst);
	for (size_t i = 0; i < n; i++) {
		sl[i].own_rate = sl[i].rate * aq->own;
		sl[i].own_burst = burst_of(
		    burst_weight(aq, &sl[i], slow), sum_r, B, w, npos, true);
	}
}

/* The slots' bursts from their rates (fill_quota), the dead band `db`
 * applied. */
static void
fill_bursts(allot__alloc_quota *aq, double db, double body_s)
{
	size_t n = aq->nslots;
	double A = aq->allowance;
	allot__alloc_slot *sl = aq->slots;
	const size_t st = sizeof *sl;
	/* Bursts: B, scaled down with the allowance when the ceiling cut
	 * it. Not the global bucket's level: the local levels never sum
	 * above the bursts (a burst that grows does not fill its bucket,
	 * one that shrinks caps it), so B + R W holds without it, and
	 * cutting every replica's burst to what the global bucket holds
	 * after one replica's burst destroys the tokens of the replicas
	 * the next burst lands on (docs/allocation.md). */
	double R = aq->rate, B = aq->burst;
	double budget = nonneg(B * fmin(1.0, A / R));
	double w = nonneg(aq->min_burst);
	/* Stale replicas keep their bursts (within the budget): their
	 * buckets hold those tokens, and shrinking a burst destroys what
	 * it held above the new one while growing another's creates
	 * capacity, not tokens. The others share the rest. */
	double keep = 0;
	for (size_t i = 0; i < n; i++)
		if (kept(&sl[i]))
			keep += sl[i].prev_burst;
	double total = budget;
	double kf = keep > budget ? budget / keep : 1.0;
	budget = keep > 0 ? nonneg(budget - keep * kf) : budget;
	size_t npos = 0;
	double sum_r = 0, slow = slow_sum(aq);
	for (size_t i = 0; i < n; i++) {
		if (sl[i].rate > 0 && !kept(&sl[i])) {
			npos += !waits(aq, &sl[i]);
			sum_r += burst_weight(aq, &sl[i], slow);
		}
	}
	double sum = 0;
	for (size_t i = 0; i < n; i++) {
		allot__alloc_slot *x = &sl[i];
		if (kept(x)) {
			x->burst = 0; /* set below */
			continue;
		}
		x->burst = new_burst(aq, x, slow, sum_r, budget, w, npos);
		double p = x->prev_burst;
		if (db > 0 && x->has_prev && x->rate > 0 && p >= 0 &&
		    isfinite(p) &&
		    fabs(x->burst - p) <= db * fmax(x->burst, p))
			x->burst = p;
		sum += x->burst;
	}
	/* Whatever the band holds away from the new bursts moves back
	 * toward them, in proportion, until the sum is the budget: it never
	 * takes the bursts above it, nor leaves any of it unallotted (held a
	 * few percent low on every replica, the swarm's small quotas were
	 * refused more than under the equal split, `swarm` local only). */
	if (sum != budget) {
		double dir = sum > budget ? -1.0 : 1.0, away = 0;
		for (size_t i = 0; i < n; i++)
			if (!kept(&sl[i]))
				away += fmax(0,
				    dir *
				        (new_burst(aq, &sl[i], slow, sum_r,
				             budget, w, npos) -
				            sl[i].burst));
		double f = away > 0 ? fmin(1.0, fabs(sum - budget) / away) : 0;
		for (size_t i = 0; i < n; i++) {
			if (kept(&sl[i]))
				continue;
			double nb = new_burst(
			    aq, &sl[i], slow, sum_r, budget, w, npos);
			if (dir * (nb - sl[i].burst) > 0)
				sl[i].burst += (nb - sl[i].burst) * f;
		}
	}
	for (size_t i = 0; keep > 0 && i < n; i++)
		if (kept(&sl[i]))
			sl[i].burst = sl[i].prev_burst * kf;
	/* With a central reserve the bucket of a replica that waits for it
	 * holds what the body of its traffic needs, body_s of its rate (at
	 * least one token, and the part of its burst the quota's `reserve`
	 * keeps local; a costlier request goes to the reserve); the rest of
	 * its part of the budget is the reserve's, where a burst reaches it
	 * from whichever replica it lands on. */
	double keep_local = 1.0 - fmin(1.0, nonneg(aq->reserve));
	for (size_t i = 0; i < n; i++)
		if (waits(aq, &sl[i]))
			sl[i].burst = fmin(sl[i].burst,
			    fmax(fmax(1, body_s * sl[i].rate),
			        keep_local * sl[i].burst));
	aq->burst_budget = total;
	aq->sum_burst = fit_sum(&sl[0].burst, st, n, total);
	own_targets(aq, slow);
}

/* Where a replica belongs in the long run: its long-run part of the
 * allowance A (A slow_i / `slow`, the sum of the slow estimates), but
 * no more than the equal share A / n; 0 when its long-run part is
 * unknown. The dead band keeps a target that differs from the new
 * value by less than the noise of the replica's estimate, and when a
 * few requests weigh much more than the others (5 % of weight 20: half
 * the tokens in a twentieth of the requests), that noise is larger
 * than the estimate itself: a target set low in a round whose windows
 * held no heavy request stayed low for seconds while the replica's
 * traffic was that of the others, and rose only once its bucket had
 * run dry and denied a request. Measured on the `ramp` family, the
 * replicas' targets at the peak spread from half the equal share to
 * above it, and allot was 1.6 points worse than the equal split in
 * its worst seed. A target below the mark is not noise held off but
 * noise kept, so a rise towards the mark passes the band (up to the
 * new value, never above the mark); a replica the callers do not
 * reach has a mark of 0, and one whose traffic is above the equal
 * share rises by its claim as before. */
static double
fair_mark(const allot__alloc_slot *x, double A, size_t n, double slow)
{
	if (x->fresh || !(slow > 0))
		return 0;
	return fmin(long_run(x, A, slow), A / (double) n);
}

static void
fill_quota(
    const allot__alloc_policy *pol, allot__alloc_quota *aq, double interval_s)
{
	size_t n = aq->nslots;
	double A = aq->allowance;
	aq->sum_rate = 0;
	aq->sum_burst = 0;
	aq->burst_budget = 0;
	if (n == 0)
		return;
	allot__alloc_slot *sl = aq->slots;
	const size_t st = sizeof *sl;
	if (!(A > 0)) {
		for (size_t i = 0; i < n; i++)
			sl[i].rate = sl[i].burst = 0;
		return;
	}
	double db = pol->deadband > 0 ? fmin(pol->deadband, 0.5) : 0;
	double ff = pol->replica_floor > 0 ? fmin(pol->replica_floor, 1) : 0;
	double f0 = pol->floor_fraction > 0 ? fmin(pol->floor_fraction, 1) : 0;
	double f = ff * A / (double) n, fnew = f0 * A / (double) n;
	/* A slot claims its demand plus the headroom that absorbs its
	 * fluctuations until the next round. */
	double h = nonneg(pol->headroom);
	/* Water-fill A: claims (with the floor) above A are served
	 * max-min fairly; below A everyone is raised to a common level,
	 * which spreads the leftover over idle and busy replicas alike. */
	double s = 0, bodies = 0;
	for (size_t i = 0; i < n; i++) {
		bodies += sl[i].rate;
		/* An agent that waits for the reserve sends its first
		 * requests there: it needs no floor of its own. */
		double fl = waits(aq, &sl[i]) ? 0 : sl[i].served ? f : fnew;
		sl[i].rate = fmax(sl[i].rate * (1.0 + h), fl);
		/* A replica that has not reported since demand appeared
		 * claims at least its target: its estimate predates the
		 * change, and it may be about to see the same burst. */
		if (kept(&sl[i]) && sl[i].prev_rate > sl[i].rate)
			sl[i].rate = sl[i].prev_rate;
		s += sl[i].rate;
	}
	/* With a central reserve the replicas' claims are served out of
	 * (1 - central_pool) A when they exceed it: when the quota is short
	 * everywhere, a part of it stays pooled at the coordinator, where
	 * a replica whose traffic outruns its share finds it, instead of
	 * all of it sitting in the buckets of replicas that may not need
	 * it this very interval. */
	double Aloc = aq->pooled ?
	    A * (1.0 - fmin(1.0, nonneg(pol->central_pool))) :
	    A;
	if (s > Aloc && short_on_bodies(aq, bodies)) {
		/* Cut in proportion: every bucket refills below what its own
		 * traffic spends, so none fills while the quota is short.
		 * Max-min gave the replicas below the cap all they claimed;
		 * their buckets, refilling about as fast as their traffic
		 * drained them, held tokens (about half their capacity each)
		 * that the replicas where the burst was could not reach, and
		 * the reserve ran dry first (`sizing`: 2.09 % refused of what
		 * the ideal bucket admits, worst of 20 seeds; 0.89 % so). */
		double k = Aloc / s;
		for (size_t i = 0; i < n; i++)
			sl[i].rate *= k;
	} else if (s > Aloc) {
		double x = level_cap(&sl[0].rate, st, NULL, 0, n, Aloc);
		for (size_t i = 0; i < n; i++)
			sl[i].rate = fmin(sl[i].rate, x);
	} else {
		/* The leftover is spread over the slots whose callers do not
		 * wait for the reserve, each its 1/n of it; the parts of
		 * those that wait stay with the reserve and refill it. */
		double nl = 0;
		for (size_t i = 0; i < n; i++) {
			sl[i].burst = waits(aq, &sl[i]) ? 0 : 1; /* scratch */
			nl += sl[i].burst;
		}
		double x = level_floor(&sl[0].rate, st, &sl[0].burst, st, n,
		    s + (A - s) * nl / (double) n);
		for (size_t i = 0; i < n; i++)
			sl[i].rate = fmax(sl[i].rate, sl[i].burst * x);
	}
	/* Dead band: a target moves only when the new one differs by more
	 * than the band, the larger of `deadband` (relative) and noise_z
	 * standard deviations of the demand estimate; a rise passes at once
	 * when the replica was short (denied something). Then whatever
	 * takes the sum above A is taken back from the targets kept above
	 * their new value, in proportion to that excess. */
	double z = nonneg(pol->noise_z);
	if (db > 0 || z > 0) {
		double sum = 0, slack = 0, slow = slow_sum(aq);
		for (size_t i = 0; i < n; i++) {
			allot__alloc_slot *x = &sl[i];
			x->burst = x->rate; /* scratch: the new rate */
			double p = x->prev_rate;
			if (x->has_prev && p >= 0 && isfinite(p)) {
				double nw = x->rate;
				double band = fmax(db * fmax(nw, p),
				    z * sqrt(nonneg(x->demand_var)) * (1 + h));
				double fall = waits(aq, x) ?
				    fmin(band,
				        fmax(db * p, BODY_FALL_HELD * p)) :
				    band;
				bool keep = nw > p ?
				    !(x->denied > 0) && nw - p <= band :
				    p - nw <= fall;
				if (keep)
					x->rate = p;
				/* The band holds a target against noise, not
				 * below where the replica belongs: a rise
				 * towards its mark passes (see fair_mark). */
				double m = waits(aq, x) ?
				    0 :
				    fair_mark(x, A, n, slow);
				if (keep && nw > p && p < (1.0 - db) * m)
					x->rate = fmin(nw, m);
			}
			sum += x->rate;
			if (x->rate > x->burst)
				slack += x->rate - x->burst;
		}
		if (sum > A && slack > 0) {
			double cut = fmin(1.0, (sum - A) / slack);
			for (size_t i = 0; i < n; i++)
				if (sl[i].rate > sl[i].burst)
					sl[i].rate -= (sl[i].rate -
					                  sl[i].burst) *
					    cut;
		}
	}
	/* The body's window: body_intervals intervals, each of at most
	 * 100 ms. What a bucket holds above its traffic's fluctuations over
	 * a few hundred ms is out of the reserve's reach while a burst
	 * lands elsewhere, and the reserve serves any shortfall in a round
	 * trip, whatever T is: at T = 1 s four intervals held 4 s of every
	 * replica's rate, and the tail path refused more than local only
	 * (`onoff` 11.1 % against 2.2, `swarm` 26.3 against 12.6, worst of
	 * seeds 1-5; 0.00 and 0.20 so). */
	double body = pol->body_intervals > 0 ? pol->body_intervals : 0;
	double body_s = body *
	    fmin(interval_s > 0 ? interval_s : 0.1,
	        ALLOT__ALLOC_BODY_INTERVAL_MAX_S);
	/* A replica that waits for the reserve and whose rate would not
	 * fill a token over its body window holds nothing: its few requests
	 * go to the reserve, which keeps the capacity its bucket would have
	 * held and never filled. */
	for (size_t i = 0; i < n; i++)
		if (waits(aq, &sl[i]) && !(sl[i].rate * body_s >= 1))
			sl[i].rate = 0;
	aq->sum_rate = fit_sum(&sl[0].rate, st, n, Aloc);
	fill_bursts(aq, db, body_s);
}

static void
demand_alloc(const allot__alloc_policy *pol, allot__alloc_service *svc)
{
	for (size_t q = 0; q < svc->nquotas; q++)
		claims(pol, &svc->quotas[q]);
	ceiling_split(pol, svc);
	for (size_t q = 0; q < svc->nquotas; q++)
		fill_quota(pol, &svc->quotas[q], svc->interval_s);
}

int
allot__alloc_compute(const allot__alloc_policy *pol, allot__alloc_service *svc)
{
	if (svc == NULL)
		return ALLOT_EINVAL;
	if (pol == NULL) {
		zero_outputs(svc);
		return ALLOT_EINVAL;
	}
	switch (pol->kind) {
	case ALLOT__ALLOC_STATIC: static_split(svc); return ALLOT_OK;
	case ALLOT__ALLOC_DEMAND: demand_alloc(pol, svc); return ALLOT_OK;
	}
	zero_outputs(svc);
	return ALLOT_EINVAL;
}

const char *
allot__alloc_name(const allot__alloc_policy *pol)
{
	if (pol == NULL)
		return "unknown";
	switch (pol->kind) {
	case ALLOT__ALLOC_STATIC: return "static_split";
	case ALLOT__ALLOC_DEMAND: return "demand";
	}
	return "unknown";
}
