/* SPDX-License-Identifier: MIT */
/*
 * The central reserve (docs/allocation.md, "The central reserve"): per
 * quota, a token bucket held by the coordinator whose rate is the part
 * of the quota's allowance no replica holds and whose capacity is the
 * part of its burst budget no replica holds; per service with a ceiling,
 * the same for the ceiling. A request whose local bucket is short asks
 * for tokens (ask.c) and is served from here in one round trip: the body
 * of the traffic is decided locally, the tail centrally.
 *
 * Why it adds nothing to the over-admission bound: what the replicas may
 * hold is their live bound (bounds.c, the larger of each grant and any
 * grant not yet acknowledged, fallbacks, expired replicas), and the
 * reserve's rate and capacity are the allowance and the burst budget
 * less that bound. So at every instant the rates of the local buckets
 * and of the reserve sum to at most R, their capacities to at most B,
 * and the tokens in them to at most B: over any window W they admit at
 * most B + R W together, the bound a single bucket gives. The caps are
 * set from the bound at each tick (allot__central_caps()); between
 * ticks every grant that rises takes its rise out of them first
 * (allot__central_shrink()), while a grant that falls gives its part
 * back only once the agent has acknowledged it (a Sync or an Ask,
 * allot__session_acked() and allot__central_grow()): until then the
 * bound still counts the old grant. A token served
 * leaves the reserve for good: it is spent by the requests that waited
 * for it, or goes into the asking replica's local bucket, which never
 * holds more than its burst.
 */
#include "registry_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether quota q of the config in force keeps a central reserve. A
 * stacked level keeps none: agents decide it locally, never asking its
 * reserve (docs/configuration.md, "Stacked limits"); nor does a quota
 * with a bucket per value, whose values are split apart (values.c). */
bool
allot__central_on(const allot__state *st, size_t q)
{
	const cfgv *v = st->cur;
	return st->o.policy.central && q < v->nq && v->q[q]->reserve > 0 &&
	    !allot__quota_per_value(v, (int32_t) q) &&
	    !allot__quota_is_level(v->q[q]);
}

/* The ceiling of `svc` into svc->c_*: C; its burst B_C, C times the
 * largest B/R of the callers' quotas it covers (the default quota of
 * unknown callers aside), as the ideal bucket of the ceiling has it
 * (allot-sim), C when there is none; and whether it can bind: when the
 * quotas it covers sum to at most C and their bursts to at most B_C,
 * no admission within them can exceed it, and its reserve would only
 * hold back what theirs may serve. */
static void
ceiling_of(const cfgv *v, service *svc)
{
	double C = allot__cfgv_ceiling(v, svc->name);
	svc->c_rate = C > 0 ? C : 0;
	svc->c_burst = 0;
	svc->c_binds = false;
	if (!(C > 0))
		return;
	double k = 0, sum_r = 0, sum_b = 0;
	for (size_t q = 0; q < v->nq; q++) {
		if (v->qsvc[q] != NULL && strcmp(v->qsvc[q], svc->name) != 0)
			continue;
		sum_r += v->rate[q];
		sum_b += v->burst[q];
		if (strcmp(v->q[q]->identity, "default") == 0)
			continue;
		if (v->rate[q] > 0 && v->burst[q] / v->rate[q] > k)
			k = v->burst[q] / v->rate[q];
	}
	svc->c_burst = C * (k > 0 ? k : 1.0);
	svc->c_binds = sum_r > C || sum_b > svc->c_burst;
}

/* A reserve's rate and capacity go below zero when grants rose by more
 * than it had since the tick (central_shrink()): the deficit stays
 * owed, so that a grant that falls back (central_grow()) does not
 * return what was never taken. A reserve in deficit mints and holds
 * nothing. */
static void
bring(double *level, uint64_t *at, double rate, double cap, uint64_t now)
{
	rate = rate > 0 ? rate : 0;
	cap = cap > 0 ? cap : 0;
	if (*at != 0 && now > *at)
		*level += rate * (double) (now - *at) / 1e9;
	if (*level > cap)
		*level = cap;
	if (*level < 0)
		*level = 0;
	if (now > *at)
		*at = now;
}

static double
nonneg(double x)
{
	return x > 0 && isfinite(x) ? x : 0;
}

/* `returned` tokens given back into a reserve at `*level`: they raise it
 * at most to `estimate`, the global bucket's as the reports drain it,
 * which no report of a replica can raise. A reserve already above the
 * estimate keeps what it holds: its refill is its own (its rate and
 * capacity are what no replica may hold), and the estimate lags behind
 * it, refilling only once the burst's reports are in (capped at B
 * meanwhile). Clipping the reserve to it destroyed up to a report
 * interval of the quota's rate after every burst that drained it
 * (`pinned` seed 17 refused 2.25 % of what the ideal admits, 0.22 %
 * since). */
static void
add_returns(double *level, double returned, double estimate)
{
	if (*level + returned <= estimate)
		*level += returned;
	else if (*level < estimate)
		*level = estimate;
}

/* The tokens the replicas of quota q gave back since (rsv_returned)
 * into its reserve: never more in all than the global bucket estimate
 * holds, nor than its capacity (add_returns()). What it kept of them,
 * for the ceiling's reserve. Its level brought up to `now` first. */
static double
take_returns(allot__state *st, service *svc, size_t q, uint64_t now)
{
	const cfgv *v = st->cur;
	squota *sq = &svc->q[q];
	double was = sq->rsv_level;
	allot__level_bring(sq, v->rate[q], v->burst[q], now);
	add_returns(&sq->rsv_level, sq->rsv_returned, sq->level);
	sq->rsv_returned = 0;
	if (sq->rsv_level > nonneg(sq->rsv_burst))
		sq->rsv_level = nonneg(sq->rsv_burst);
	return nonneg(sq->rsv_level - was);
}

/* `kept` tokens given back into the ceiling's reserve (its level brought
 * up to `now`): as a quota's, never more than the ceiling's own bucket
 * holds, which tokens given back while the agents start (their
 * bootstrap buckets hold each quota's B, together more than B_C) would
 * otherwise exceed. */
static void
ceiling_returns(allot__state *st, service *svc, double kept, uint64_t now)
{
	allot__central_admitted(st, svc, 0, now);
	add_returns(&svc->crsv_level, kept, svc->clevel);
	if (svc->crsv_level > nonneg(svc->crsv_burst))
		svc->crsv_level = nonneg(svc->crsv_burst);
}

void
allot__central_give_back(
    allot__state *st, service *svc, skey *key, uint64_t tokens)
{
	if (tokens == 0 || key->q < 0 ||
	    !allot__central_on(st, (size_t) key->q))
		return;
	/* An agent gives back whole tokens, the last one rounded up (the
	 * rest of it from below its new burst, agent/sync_core.c). */
	double back = fmin((double) tokens, ceil(key->returnable - 1e-6));
	key->returnable = nonneg(key->returnable - back);
	svc->q[key->q].rsv_returned += back;
}

void
allot__central_returned(allot__state *st, service *svc, size_t q, uint64_t now)
{
	squota *sq = &svc->q[q];
	if (!allot__central_on(st, q) || !(sq->rsv_returned > 0))
		return;
	bring(&sq->rsv_level, &sq->rsv_ns, sq->rsv_rate, sq->rsv_burst, now);
	double kept = take_returns(st, svc, q, now);
	if (!svc->c_binds)
		return;
	bring(&svc->crsv_level, &svc->crsv_ns, svc->crsv_rate, svc->crsv_burst,
	    now);
	ceiling_returns(st, svc, kept, now);
}

/* What the reserve served each quota's waiting keys lately, and how
 * many there are (allot__standby_due()). */
static void standby_totals(allot__state *st, service *svc, uint64_t now);

void
allot__central_caps(allot__state *st, service *svc, uint64_t now)
{
	const cfgv *v = st->cur;
	if (!st->o.policy.central)
		return;
	allot__compute_bounds(st, svc, now);
	double held_r = 0, held_b = 0, returned = 0;
	for (size_t q = 0; q < v->nq; q++) {
		squota *sq = &svc->q[q];
		held_r += sq->bound_rate;
		held_b += sq->bound_burst;
		bring(&sq->rsv_level, &sq->rsv_ns, sq->rsv_rate, sq->rsv_burst,
		    now);
		if (!allot__central_on(st, q) || sq->nslots == 0) {
			sq->rsv_rate = sq->rsv_burst = sq->rsv_level = 0;
			continue;
		}
		/* The allowance and the budget, less what the replicas may
		 * hold: expired replicas' reserved part is in the bound. */
		sq->rsv_rate = nonneg(sq->allowance - sq->bound_rate);
		sq->rsv_burst = nonneg(sq->burst_budget - sq->bound_burst);
		returned += take_returns(st, svc, q, now);
	}
	standby_totals(st, svc, now);
	ceiling_of(v, svc);
	bring(&svc->crsv_level, &svc->crsv_ns, svc->crsv_rate, svc->crsv_burst,
	    now);
	if (!svc->c_binds) {
		svc->crsv_rate = svc->crsv_burst = svc->crsv_level = 0;
		return;
	}
	svc->crsv_rate = nonneg(svc->c_rate - held_r);
	svc->crsv_burst = nonneg(svc->c_burst - held_b);
	ceiling_returns(st, svc, returned, now);
}

void
allot__central_admitted(
    allot__state *st, service *svc, double admitted, uint64_t now)
{
	(void) st;
	if (!svc->c_binds)
		return;
	if (svc->clevel_ns == 0)
		svc->clevel = svc->c_burst;
	bring(&svc->clevel, &svc->clevel_ns, svc->c_rate, svc->c_burst, now);
	svc->clevel -= admitted;
	if (svc->clevel < 0)
		svc->clevel = 0;
}

double
allot__central_shrink(allot__state *st, service *svc, size_t q, double dr,
    double db, uint64_t now)
{
	if (!st->o.policy.central || !(dr > 0 || db > 0))
		return 0;
	squota *sq = &svc->q[q];
	bool ceiling = svc->c_binds;
	bring(&sq->rsv_level, &sq->rsv_ns, sq->rsv_rate, sq->rsv_burst, now);
	if (ceiling)
		bring(&svc->crsv_level, &svc->crsv_ns, svc->crsv_rate,
		    svc->crsv_burst, now);
	sq->rsv_rate -= nonneg(dr);
	sq->rsv_burst -= nonneg(db);
	/* The tokens the smaller capacity cannot keep go with it, to the
	 * replica whose burst grew (Share.prefill): capacity moves, and
	 * its tokens with it, parts of a token included (the agent adds
	 * them as they are). Those the ceiling's reserve does not hold
	 * too are not there to move. Moved in whole tokens, the parts
	 * were lost at every move: up to a token per replica whose body
	 * opened (4 tokens of `onoff` seed 18's start-up). */
	double moved = nonneg(sq->rsv_level - nonneg(sq->rsv_burst));
	if (ceiling)
		moved = fmin(moved, svc->crsv_level);
	moved = fmin(moved, nonneg(db));
	sq->rsv_level -= moved;
	if (sq->rsv_level > nonneg(sq->rsv_burst))
		sq->rsv_level = nonneg(sq->rsv_burst);
	if (!ceiling)
		return moved;
	svc->crsv_level -= moved;
	svc->crsv_rate -= nonneg(dr);
	svc->crsv_burst -= nonneg(db);
	if (svc->crsv_level > nonneg(svc->crsv_burst))
		svc->crsv_level = nonneg(svc->crsv_burst);
	return moved;
}

void
allot__central_grow(allot__state *st, service *svc, size_t q, double dr,
    double b_was, double b_now, bool key_tail, uint64_t now)
{
	if (!allot__central_on(st, q) || isnan(b_was) || isnan(b_now))
		return;
	/* As the bound counts a burst: raised to the largest weight, but
	 * for an agent that waits for the reserve (bounds.c). */
	double w = key_tail ? 1 : (double) st->cur->cfg->max_weight;
	double db = fmax(b_was, w) - fmax(b_now, w);
	squota *sq = &svc->q[q];
	bring(&sq->rsv_level, &sq->rsv_ns, sq->rsv_rate, sq->rsv_burst, now);
	sq->rsv_rate = fmin(sq->allowance, sq->rsv_rate + nonneg(dr));
	sq->rsv_burst = fmin(sq->burst_budget, sq->rsv_burst + nonneg(db));
	if (!svc->c_binds)
		return;
	bring(&svc->crsv_level, &svc->crsv_ns, svc->crsv_rate, svc->crsv_burst,
	    now);
	svc->crsv_rate = fmin(svc->c_rate, svc->crsv_rate + nonneg(dr));
	svc->crsv_burst = fmin(svc->c_burst, svc->crsv_burst + nonneg(db));
}

void
allot__central_peek(allot__state *st, service *svc, size_t q, uint64_t now,
    double *ret_rate, double *ret_burst, double *ret_level)
{
	squota *sq = &svc->q[q];
	*ret_rate = *ret_burst = *ret_level = 0;
	if (!allot__central_on(st, q))
		return;
	bring(&sq->rsv_level, &sq->rsv_ns, sq->rsv_rate, sq->rsv_burst, now);
	*ret_rate = nonneg(sq->rsv_rate);
	*ret_burst = nonneg(sq->rsv_burst);
	*ret_level = sq->rsv_level;
}

/* How long until `level` holds `need` at `rate`, in whole us, and at
 * most a quarter interval: the reserve's rate and capacity are set
 * again at every tick, and the agents' grants that rise or fall at
 * every Sync move them. */
static uint32_t
dry_us(const allot__state *st, double level, double need, double rate)
{
	double cap = st->o.interval_ms * 250.0;
	double us = rate > 0 ? ceil((need - level) / rate * 1e6) : cap;
	return us < 1 ? 1 : us > cap ? (uint32_t) cap : (uint32_t) us;
}

/* An asker's part of a token that the reserve cannot complete, kept
 * into it (and the ceiling's), as far as their capacities have room:
 * the parts the buckets of the replicas it runs dry on hold make whole
 * tokens here. Tokens moved, not made: the asker's bucket gave them up
 * when it asked (agent/tail.c). What it kept. */
static double
pool_held(service *svc, squota *sq, double part)
{
	double room = nonneg(sq->rsv_burst) - sq->rsv_level;
	if (svc->c_binds)
		room = fmin(room, nonneg(svc->crsv_burst) - svc->crsv_level);
	double kept = fmin(part, room);
	if (!(kept > 0))
		return 0;
	sq->rsv_level += kept;
	if (svc->c_binds)
		svc->crsv_level += kept;
	return kept;
}

allot__central_given
allot__central_take(allot__state *st, service *svc, size_t q, double min,
    double want, double held, double pool, uint64_t now)
{
	allot__central_given g = { 0 };
	if (!allot__central_on(st, q) || !(want >= min) || !(min > 0))
		return g;
	held = held > 0 && held < min ? held : 0;
	squota *sq = &svc->q[q];
	bring(&sq->rsv_level, &sq->rsv_ns, sq->rsv_rate, sq->rsv_burst, now);
	double have = sq->rsv_level, rate = nonneg(sq->rsv_rate);
	bool ceiling = svc->c_binds;
	if (ceiling) {
		bring(&svc->crsv_level, &svc->crsv_ns, svc->crsv_rate,
		    svc->crsv_burst, now);
		if (svc->crsv_level < have) {
			have = svc->crsv_level;
			rate = nonneg(svc->crsv_rate);
		}
	}
	/* Whole tokens: an agent spends whole tokens. When the reserve
	 * cannot give all that was asked, the part the asker's bucket
	 * held makes one more with the reserve's: tokens that would stay
	 * in parts, here and there, while the reserve runs dry. */
	if (have >= want) {
		g.whole = g.got = want;
	} else {
		g.whole = floor(fmin(want, have + held) + 1e-9);
		g.got = fmin(g.whole - held, have);
	}
	if (g.whole < min || !(g.got > 0)) {
		g = (allot__central_given) { 0 };
		/* Pooled, the part is the reserve's: the asker needs `min`
		 * whole from it next time. */
		if (pool > 0 && held > 0)
			g.kept = pool_held(svc, sq, fmin(held, pool));
		have += g.kept;
		g.dry_us = dry_us(st, have, min - (held - g.kept), rate);
		g.left = have >= 1 ? (uint64_t) have : 0;
		return g;
	}
	sq->rsv_level -= g.got;
	if (ceiling)
		svc->crsv_level -= g.got;
	if (want > g.whole) {
		/* Drained: the asker waits for the refill before asking
		 * again, rather than every request of a caller above its
		 * quota waiting a round trip to be denied. */
		g.dry_us = dry_us(st, have - g.got, min, rate);
		g.left = have - g.got >= 1 ? (uint64_t) (have - g.got) : 0;
	}
	return g;
}

/* ---- the standby ---- */

/* The time constant of what the reserve served a key (skey.srv_sum). */
#define STANDBY_TAU_S 2.0

/* skey.srv_sum decayed to `now`. */
static double
served_at(const skey *key, uint64_t now)
{
	if (key->srv_sum == 0 || key->srv_ns == 0 || now <= key->srv_ns)
		return key->srv_sum;
	double dt = (double) (now - key->srv_ns) / 1e9;
	return key->srv_sum * exp(-dt / STANDBY_TAU_S);
}

static void
standby_totals(allot__state *st, service *svc, uint64_t now)
{
	const cfgv *v = st->cur;
	for (size_t q = 0; q < v->nq; q++) {
		svc->q[q].srv_total = 0;
		svc->q[q].srv_keys = 0;
	}
	FOR_EACH_KEY (svc, i, s, key) {
		if (s->placeholder || !key->tail)
			continue;
		svc->q[key->q].srv_total += served_at(key, now);
		svc->q[key->q].srv_keys++;
	}
}

void
allot__standby_served(skey *key, double tokens, uint64_t now)
{
	if (!(tokens > 0))
		return;
	key->srv_sum = served_at(key, now) + tokens;
	key->srv_ns = now;
}

bool
allot__standby_due(
    const allot__state *st, service *svc, skey *key, uint64_t now)
{
	if (key->q < 0)
		return false;
	const squota *sq = &svc->q[key->q];
	double r = 0;
	/* The reserve's rate, shared among the keys that wait for it: half
	 * by what it served each lately, half evenly (a key's need over a
	 * second is noisy), so that the parts sum to the rate. */
	if (allot__central_on(st, (size_t) key->q) && key->tail &&
	    sq->srv_keys > 0) {
		double n = sq->srv_keys, tot = sq->srv_total;
		double w = tot > 0 ?
		    (served_at(key, now) + tot / n) / (2 * tot) :
		    1 / n;
		r = nonneg(sq->rsv_rate) * fmin(w, 1.0);
	}
	/* A quarter of a token per second is none. */
	r = r >= 0.25 ? r : 0;
	double was = key->standby;
	if (fabs(r - was) < fmax(1.0, 0.25 * was) && !(r == 0 && was > 0))
		return false;
	key->standby = r;
	key->standby_hold = fmax(key->standby_hold, r);
	return true;
}

double
allot__standby_held(const session *s, const skey *key, uint64_t now)
{
	if (!(key->standby_hold > 0) || s->last_sync_ns == 0)
		return 0;
	uint32_t iv = (uint32_t) lround(s->interval_s * 1e3);
	return now >= s->last_sync_ns + allot__standby_after_ns(iv) ?
	    key->standby_hold :
	    0;
}
