/* SPDX-License-Identifier: MIT */
/*
 * The allocation driver and the grants. The allocator (alloc.h) sets each
 * key's target share; what a replica is actually sent (its grant) moves
 * toward the target under one rule that keeps the sum of grants of a
 * quota at or below R (and of bursts at or below B) at every instant,
 * not only once all replicas have synced: a decrease is granted at once,
 * an increase only out of the headroom R - sum(grants). When a replica
 * joins, the others shrink on their next sync and the newcomer grows on
 * the sync after that, so a change settles within two intervals.
 * Replicas restored after a restart are assumed to hold their equal share
 * until they return or expire. Store rows for changed grants are
 * recorded from here. Loans, tokens moved at once to a replica that
 * starts denying, are at the end of the file.
 */
#include "registry_int.h"

#include <math.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>

/* Differences below this are rounding, not a change worth a message. */
static double
tolerance(double total)
{
	return 1e-9 * (total > 1 ? total : 1);
}

/* The sums of grants of each quota of `svc`, from scratch (the running
 * sums are kept incrementally; this removes any rounding drift). */
void
allot__rebuild_granted(allot__state *st, service *svc)
{
	for (size_t q = 0; q < st->cur->nq; q++) {
		svc->q[q].granted_rate = 0;
		svc->q[q].granted_burst = 0;
		svc->q[q].own_extra_rate = 0;
		svc->q[q].own_extra_burst = 0;
	}
	svc->held_total = 0;
	FOR_EACH_KEY (svc, i, s, key) {
		svc->held_total += key_hold(key);
		if (isnan(key->grant_rate))
			continue;
		svc->q[key->q].granted_rate += key->grant_rate;
		svc->q[key->q].granted_burst += key->grant_burst;
		svc->q[key->q].own_extra_rate += own_extra_rate(key);
		svc->q[key->q].own_extra_burst += own_extra_burst(key);
	}
}

/* ---- start-up (docs/allocation.md, "Start-up") ----
 *
 * A deployment's replicas start within moments of each other. Without a
 * hint the first to register is alone and is granted all of R, and the
 * next ones get nothing until it has given its part back at its next
 * Sync: up to an interval and a half in which traffic reaching them is
 * refused. With the replica count N the agents announce
 * (Register.expected_replicas, their initial_replicas), the first n
 * replicas are allotted n / N of every quota while the others are on
 * their way, so the headroom keeps their parts and each newcomer's
 * Welcome carries its own at once. The period ends when N are live or
 * after ALLOT__STATE_FORM_MS, whichever comes first: a hint too large
 * (or a hostile one, capped at max_replicas_per_service) costs at most
 * that long at a service's birth. Grants only ever shrink by it, so the
 * bound is unchanged. */

bool
allot__forming_start(
    allot__state *st, service *svc, uint32_t expected, uint64_t now)
{
	/* Only a service nobody runs on: not one with expired replicas
	 * still held, or placeholders of a restart or of a take-over
	 * (their replicas hold the previous grants). */
	if (svc->nsess != 0 || svc->nzs != 0 || expected < 2)
		return false;
	uint32_t cap = st->o.max_replicas_per_service;
	svc->form_expect = cap > 0 && expected > cap ? cap : expected;
	svc->form_until_ns = now + (uint64_t) ALLOT__STATE_FORM_MS * 1000000u;
	return true;
}

double
allot__forming(service *svc, uint64_t now)
{
	if (svc->form_expect == 0)
		return 1.0;
	if (svc->nsess >= svc->form_expect || now >= svc->form_until_ns) {
		svc->form_expect = 0;
		svc->dirty = true;
		return 1.0;
	}
	return (double) svc->nsess / (double) svc->form_expect;
}

/* The allocator's input per quota of `svc` (st->aq), the global buckets
 * brought up to `now`. False when out of memory. */
static bool
alloc_quotas(allot__state *st, service *svc, uint64_t now)
{
	const cfgv *v = st->cur;
	size_t nq = v->nq;
	if (!allot__grow((void **) &st->aq, &st->aq_cap, nq, sizeof *st->aq))
		return false;
	allot__alloc_quota *aq = st->aq;
	double part = allot__forming(svc, now);
	for (size_t q = 0; q < nq; q++) {
		allot__level_bring(&svc->q[q], v->rate[q], v->burst[q], now);
		aq[q] = (allot__alloc_quota) {
			.rate = v->rate[q] * part,
			.burst = v->burst[q] * part,
			.priority = v->q[q]->priority,
			.min_burst = (double) v->cfg->max_weight,
			.central = allot__central_on(st, q),
			.reserve = v->q[q]->reserve,
		};
		svc->q[q].demand_sum = 0;
	}
	return true;
}

/* Whether a replica of `svc` is still in its first Syncs, learning its
 * part of the load after a join. */
static bool
learning(const service *svc)
{
	for (uint32_t i = 0; i < svc->nsess; i++)
		if (!svc->sess[i]->placeholder && svc->sess[i]->last_seq < 4)
			return true;
	return false;
}

/* The allocator's input per key of `svc` (st->slots, grouped by quota),
 * and for each slot the session and key it stands for (st->owner_*).
 * False when out of memory. */
static bool
alloc_slots(allot__state *st, service *svc, uint64_t now)
{
	/* While a newcomer learns its part of the load, demand moves
	 * between replicas by design (demand.c conserve_*): no onset
	 * holds targets then. */
	uint64_t episode = learning(svc) ?
	    0 :
	    2 * (uint64_t) st->o.interval_ms * 1000000u;
	size_t nq = st->cur->nq;
	allot__alloc_quota *aq = st->aq;
	size_t total = 0;
	FOR_EACH_KEY (svc, i, s, key) {
		aq[key->q].nslots++;
		total++;
	}
	size_t ocap = st->owner_cap;
	if (!allot__grow((void **) &st->slots, &st->slot_cap, total + 1,
	        sizeof *st->slots) ||
	    !allot__grow((void **) &st->owner_sess, &ocap, total + 1,
	        sizeof *st->owner_sess) ||
	    !allot__grow((void **) &st->owner_key, &st->owner_cap, total + 1,
	        sizeof *st->owner_key))
		return false;
	size_t off = 0;
	for (size_t q = 0; q < nq; q++) {
		aq[q].slots = st->slots + off;
		off += aq[q].nslots;
		aq[q].nslots = 0;
	}
	FOR_EACH_KEY (svc, i, s, key) {
		int32_t q = key->q;
		allot__alloc_slot *sl = &aq[q].slots[aq[q].nslots];
		size_t idx = (size_t) (sl - st->slots);
		/* Until its second Sync a replica's demand is unknown (a
		 * placeholder's too) and it claims the others' average;
		 * after it, a key it does not report is idle. One that never
		 * synced claims nothing: a burst of fakes that register and
		 * never sync takes nothing from the others, and an honest
		 * newcomer claims from its first Sync, half an interval
		 * after its Welcome. */
		bool fresh = s->placeholder || s->last_seq == 1;
		double d = fresh ? 0 : allot__est_read(s, key);
		double dv = fresh ? 0 : allot__est_var(s, key);
		svc->q[q].demand_sum += d;
		uint64_t onset = svc->q[q].onset_ns;
		/* A key adopted from the leader before us keeps that target
		 * while we learn (learning.c): our estimates of it are a
		 * report or two old, and noisy. */
		bool adopted = quota_learning(st, &svc->q[q], now) &&
		    key->targeted && !isnan(key->grant_rate);
		*sl = (allot__alloc_slot) {
			.served = key->est_ns != 0,
			.stale = adopted ||
			    (!fresh && key->targeted && episode > 0 &&
			        onset != 0 && s->last_sync_ns < onset &&
			        since(now, s->last_sync_ns) <=
			            episode * 3 / 4 &&
			        since(now, onset) <= episode),
			.replica = i,
			.consumed = key->consumed,
			/* Denials while its grant lagged its target (waiting
			 * for headroom) say nothing about the target. */
			.denied = key->was_short ? 0 : key->denied,
			.demand = d,
			.demand_var = dv,
			.demand_slow = fresh ? 0 : allot__est_slow(s, key),
			.demand_body = fresh ? 0 : allot__est_body(s, key),
			.tail = key->tail,
			.fresh = fresh,
			.held = key->held,
			.has_prev = key->targeted,
			.prev_rate = key->rate,
			.prev_burst = key->burst,
		};
		st->owner_sess[idx] = i;
		st->owner_key[idx] = (uint32_t) (key - s->keys);
		aq[q].nslots++;
	}
	return true;
}

/* Take the allocator's output into the quotas and keys of `svc`, and
 * start the keys' next window. Returns true when some target changed. */
static bool
alloc_apply(allot__state *st, service *svc)
{
	const cfgv *v = st->cur;
	allot__alloc_quota *aq = st->aq;
	bool changed = false;
	for (size_t q = 0; q < v->nq; q++) {
		svc->q[q].target_sum_rate = aq[q].sum_rate;
		svc->q[q].target_sum_burst = aq[q].sum_burst;
		svc->q[q].allowance = aq[q].allowance;
		svc->q[q].burst_budget = aq[q].burst_budget;
		svc->q[q].own = aq[q].own;
		svc->q[q].nslots = (uint32_t) aq[q].nslots;
		for (size_t j = 0; j < aq[q].nslots; j++) {
			size_t idx = (size_t) (&aq[q].slots[j] - st->slots);
			session *s = svc->sess[st->owner_sess[idx]];
			skey *key = &s->keys[st->owner_key[idx]];
			if (!key->targeted ||
			    key->rate != aq[q].slots[j].rate ||
			    key->burst != aq[q].slots[j].burst) {
				key->rate = aq[q].slots[j].rate;
				key->burst = aq[q].slots[j].burst;
				key->targeted = true;
				changed = true;
			}
			key->own_target_rate = aq[q].slots[j].own_rate;
			key->own_target_burst = aq[q].slots[j].own_burst;
			key->consumed = 0;
			key->denied = 0;
			key->was_short = isnan(key->grant_rate) ||
			    key->rate - key->grant_rate >
			        0.01 * key->rate + tolerance(v->rate[q]);
		}
	}
	return changed;
}

/* Recompute every target share of `svc` with the allocator. Under the
 * lock. Grants follow on each replica's next sync (allot__grant()). */
bool
allot__recompute(allot__state *st, service *svc, uint64_t now)
{
	const cfgv *v = st->cur;
	if (!alloc_quotas(st, svc, now) || !alloc_slots(st, svc, now))
		return false;
	double window_s = svc->last_alloc_ns != 0 ?
	    (double) since(now, svc->last_alloc_ns) / 1e9 :
	    0;
	allot__alloc_service as = {
		.ceiling_rate = allot__cfgv_ceiling(v, svc->name),
		.window_s = window_s,
		.interval_s = (double) st->o.interval_ms / 1e3,
		.nreplicas = svc->nsess,
		.quotas = st->aq,
		.nquotas = v->nq,
	};
	allot__alloc_compute(&st->o.policy, &as);
	if (alloc_apply(st, svc))
		svc->gen++;
	allot__rebuild_granted(st, svc);
	svc->dirty = false;
	svc->last_alloc_ns = now;
	/* The reserves hold what the new grants leave, from now on: a
	 * Welcome's, or an early round's, does not wait for the tick. */
	allot__central_caps(st, svc, now);
	return true;
}

/* An early Sync (an agent short of a key, docs/allocation.md): run the
 * service's allocation round now rather than at the next tick, at most
 * once per quarter interval, so that its grant can move in this very
 * Reply. Returns whether it ran. Under the lock. */
bool
allot__early_round(allot__state *st, service *svc, uint64_t now)
{
	uint64_t gap = (uint64_t) st->o.interval_ms * 250000u;
	/* After a join the headroom rule is already moving the shares
	 * (the newcomer asks again after half an interval): a round
	 * would only move the targets under it. */
	if (st->o.policy.kind == ALLOT__ALLOC_STATIC || learning(svc) ||
	    (svc->last_alloc_ns != 0 && since(now, svc->last_alloc_ns) < gap))
		return false;
	return allot__recompute(st, svc, now);
}

/* ---- own allowances (Share.own_rate; docs/allocation.md, "The
 * ceiling's level") ----
 *
 * While the ceiling cuts a quota without a central reserve on the
 * configuration but not on demand, each replica is also sent its own
 * allowance, its grant's target uncut (allot__alloc_slot.own_rate), which
 * its agent runs the quota's bucket on while the ceiling's level there
 * holds the cut grants of all such quotas together (agent/ceiling.c).
 * Own allowances move under the grants' rule: a decrease at once, an
 * increase only out of R (and B) less what the other replicas may run
 * on, counting each key at the larger of its own and its grant. A grant
 * rises within the same room. */

/* The room a grant of `key` may rise into under R: R less what the
 * others run on (their own, or grant). */
static double
own_room_r(const squota *sq, const skey *key, double R)
{
	return R - sq->granted_rate - sq->own_extra_rate + own_extra_rate(key);
}

static double
own_room_b(const squota *sq, const skey *key, double B)
{
	return B - sq->granted_burst - sq->own_extra_burst +
	    own_extra_burst(key);
}

/* Key `key`'s own allowance with its new grant (gr, gb) and its target
 * (key->own_target_*), into ret[2] (NaN: none, the grant). True when
 * it moved from key->own_* (the key belongs in the Reply). Under the
 * lock. */
static bool
grant_own(const allot__state *st, const squota *sq, const skey *key, double gr,
    double gb, double R, double B, double ret[2])
{
	bool fresh = isnan(key->grant_rate);
	double held_r = fresh ? 0 : key->grant_rate;
	double held_b = fresh ? 0 : key->grant_burst;
	double x_r = own_extra_rate(key), x_b = own_extra_burst(key);
	double r0 = held_r + x_r, b0 = held_b + x_b;
	double tr = gr, tb = gb;
	if (sq->own > 1) {
		tr = fmax(gr, key->own_target_rate);
		tb = fmax(gb, key->own_target_burst);
	}
	/* What the others run on, the room it leaves. */
	double cap_r = own_room_r(sq, key, R) + held_r - sq->reserved_rate;
	double cap_b = own_room_b(sq, key, B) + held_b - sq->reserved_burst;
	if (st->hold)
		cap_r = cap_b = 0;
	double r = tr <= r0 ? tr : fmin(tr, fmax(r0, cap_r));
	double b = tb <= b0 ? tb : fmin(tb, fmax(b0, cap_b));
	r = fmax(r, gr);
	b = fmax(b, gb);
	bool none = r - gr <= tolerance(R) && b - gb <= tolerance(B);
	ret[0] = none ? NAN : r;
	ret[1] = none ? NAN : b;
	return isnan(ret[0]) != isnan(key->own_rate) ||
	    (!none &&
	        (fabs(ret[0] - key->own_rate) > tolerance(R) ||
	            fabs(ret[1] - key->own_burst) > tolerance(B)));
}

/* Move the grant of one key toward its target: a decrease at once, an
 * increase only as far as the quota's headroom allows, so the grants of
 * the quota never sum above R (rate) or B (burst); with st->hold (a
 * newcomer's Welcome) no increase at all. A key being learnt after a
 * take-over is not moved at all (answer.c, allot__build_shares()). Returns
 * true when the grant changed (the key belongs in the Reply); *ret_short
 * is set when the grant is still below the target. Under the lock. */
bool
allot__grant(
    allot__state *st, service *svc, session *s, skey *key, bool *ret_short)
{
	squota *sq = &svc->q[key->q];
	double R = st->cur->rate[key->q], B = st->cur->burst[key->q];
	double C = allot__cfgv_ceiling(st->cur, svc->name);
	bool fresh = isnan(key->grant_rate);
	double held_r = fresh ? 0 : key->grant_rate;
	double held_b = fresh ? 0 : key->grant_burst;
	double room_r = R - sq->granted_rate;
	/* Bursts only out of what the global bucket has (the allocator's
	 * budget), and rates also within the ceiling across quotas. The
	 * ceiling counts what the agents may hold, decreases they have not
	 * acknowledged included: it moves capacity between callers, where
	 * a lost Reply would otherwise let two of them use it at once. */
	double room_b = fmin(B, sq->burst_budget) - sq->granted_burst;
	if (C > 0 && C - svc->held_total < room_r)
		room_r = C - svc->held_total;
	/* The agents' own allowances stay within R and B too: a grant
	 * rises only as far as the others' leave room. */
	room_r = fmin(room_r, own_room_r(sq, key, R));
	room_b = fmin(room_b, own_room_b(sq, key, B));
	room_r -= sq->reserved_rate;
	room_b -= sq->reserved_burst;
	if (st->hold)
		room_r = room_b = 0;
	double gr = key->rate <= held_r ?
	    key->rate :
	    fmin(key->rate, held_r + (room_r > 0 ? room_r : 0));
	double gb = key->burst <= held_b ?
	    key->burst :
	    fmin(key->burst, held_b + (room_b > 0 ? room_b : 0));
	*ret_short = key->rate - gr > tolerance(R) ||
	    key->burst - gb > tolerance(B);
	if (key->rate - gr > 0.01 * key->rate + tolerance(R))
		key->was_short = true;
	key->reply_target = key->rate;
	double own[2];
	bool own_moved = grant_own(st, sq, key, gr, gb, R, B, own);
	if (!fresh && !own_moved && fabs(gr - held_r) <= tolerance(R) &&
	    fabs(gb - held_b) <= tolerance(B))
		return false;
	sq->granted_rate += gr - held_r;
	sq->granted_burst += gb - held_b;
	double h0 = key_hold(key);
	bool held_none = isnan(key->hold_burst);
	double hb0 = held_none ? held_b : fmax(key->hold_burst, held_b);
	sq->own_extra_rate -= own_extra_rate(key);
	sq->own_extra_burst -= own_extra_burst(key);
	/* Back on its grant, its agent's bucket keeps only its part of the
	 * ceiling's level (agent/ceiling.c): it may be empty, whatever it
	 * consumed. The denials' plausibility bound starts from there. */
	if (!isnan(key->own_rate) && isnan(own[0]))
		key->low = fmin(key->low, 0);
	key->grant_rate = gr;
	key->grant_burst = gb;
	key->own_rate = own[0];
	key->own_burst = own[1];
	/* Until acknowledged it may run on a larger one sent before. */
	if (!isnan(own[0])) {
		key->own_hold_rate = isnan(key->own_hold_rate) ?
		    own[0] :
		    fmax(key->own_hold_rate, own[0]);
		key->own_hold_burst = isnan(key->own_hold_burst) ?
		    own[1] :
		    fmax(key->own_hold_burst, own[1]);
	}
	if (!isnan(key->own_hold_rate) &&
	    (key->own_hold_rate != key->own_rate ||
	        key->own_hold_burst != key->own_burst))
		s->unacked = true;
	sq->own_extra_rate += own_extra_rate(key);
	sq->own_extra_burst += own_extra_burst(key);
	key->low_rate = fmin(key->low_rate, gr);
	key->low_burst = fmin(key->low_burst, gb);
	/* Until the agent acknowledges, it may still run on the larger of
	 * this grant and any earlier one it has not confirmed. */
	key->hold_rate = isnan(key->hold_rate) ? gr : fmax(key->hold_rate, gr);
	key->hold_burst = isnan(key->hold_burst) ? gb :
	                                           fmax(key->hold_burst, gb);
	/* What the replica may hold rose: the central reserve gives it up
	 * first (central.c), so the two never hold the same capacity. */
	double moved = allot__central_shrink(st, svc, (size_t) key->q,
	    key_hold(key) - h0, key->hold_burst - hb0, now_ns(st));
	if (moved > 0)
		key->loan_prefill += moved;
	/* What its bucket may drop now, and give back (central.c). */
	double was = !fresh ?
	    held_b :
	    !held_none ?
	    hb0 :
	    B / (double) (s->boot_replicas > 0 ? s->boot_replicas : 1);
	if (gb < was)
		key->returnable = fmin(B, key->returnable + (was - gb));
	if (key->hold_rate != gr || key->hold_burst != gb)
		s->unacked = true;
	svc->held_total += key_hold(key) - h0;
	key->rec_pending = true;
	svc->rec_pending = true;
	return true;
}

/* Store rows for the grants that changed. Under the lock (memory only). */
void
allot__record_shares(allot__state *st, service *svc)
{
	if (!svc->rec_pending)
		return;
	svc->rec_pending = false;
	int64_t until = allot__wall_ms() + st->o.lease_ms;
	FOR_EACH_SESSION_KEY (svc, i, s, key) {
		if (!key->rec_pending)
			continue;
		key->rec_pending = false;
		if (st->o.store != NULL && key->q >= 0 && !s->placeholder &&
		    !isnan(key->grant_rate))
			allot__store_share(st->o.store, s->id, svc->name,
			    st->cur->names[key->q], key->grant_rate,
			    key->grant_burst, until);
	}
}

/* A replica registering again keeps its local buckets and the
 * allowances it ran on (docs/protocol.md) until our Welcome reaches it,
 * so its new session may hold those until it acknowledges the Welcome.
 * `old` is its previous session, or NULL: a live one, or the
 * placeholder a restore made for it, whose part of the live bound
 * covered it until now (without it, the reserve refilled into what
 * the agent still held while the Welcome was on its way). Under the
 * lock. */
void
allot__carry_allowances(allot__state *st, service *svc, session *s,
    const session *old, uint64_t now)
{
	const expired_rep *z = NULL;
	for (uint32_t i = 0; i < svc->nzs; i++)
		if (strcmp(svc->zs[i].replica_id, s->replica_id) == 0)
			z = &svc->zs[i];
	for (uint32_t k = 0; k < s->nkeys; k++) {
		skey *key = &s->keys[k];
		if (key->q < 0)
			continue;
		double r = -1, b = -1, x, y;
		if (z != NULL &&
		    allot__expired_value(
		        st, z, (size_t) key->q, now, &x, &y)) {
			r = x;
			b = y;
		}
		for (uint32_t j = 0; old != NULL && j < old->nkeys; j++) {
			if (old->keys[j].q != key->q)
				continue;
			allot__key_bound(st, old, &old->keys[j], now, &x, &y);
			r = fmax(r, x);
			b = fmax(b, y);
		}
		if (r >= 0) {
			key->hold_rate = r;
			key->hold_burst = b;
			s->unacked = true;
		}
	}
}

/* ---- loans (docs/allocation.md, "Loans") ----
 *
 * A burst that lands on one replica faster than a round trip can use
 * only the tokens that replica's bucket holds. A loan moves tokens
 * while the burst lasts: the replica that asks early because it is
 * denying gets `prefill` tokens added to its bucket at once, its burst
 * raised by as much for the loan's life, and the other replicas of the
 * quota give the same tokens up, out of the levels they last reported,
 * at their next Reply (`debit`, taken into debt if they spent them:
 * tokens are moved, never created). The raised bursts not yet
 * acknowledged back down (sq->loan_out) and the debits not yet sent
 * (sq->debit_due) of a quota share one budget, loan_frac * R *
 * min(T, LOAN_SPAN_S): until the lenders are debited the tokens exist
 * twice, so that is what loans may add to the over-admission bound.
 * Loans are kept apart from the grants (and from granted_burst): the
 * allocator places bursts as before, a loan only ever adds to what a
 * key was granted, and the live bound (bounds.c) adds loan_hold. */

/* What one lender may still give up: a part of the level it last
 * reported (it may have spent some since: a debit it no longer holds
 * leaves its bucket in debt), less what it was already asked for. Only
 * a replica whose demand estimate is at most LOAN_IDLE of its rate
 * lends: where a burst is spread over every replica (`onoff`, `fanout`
 * in allot-sim) the others are about to need their tokens, and a loan
 * would only move the denials to them. */
#define LOAN_LEND_PART 0.5
#define LOAN_IDLE 0.5
#define LOAN_LENDERS 8
/* A loan's span, seconds: the budget is loan_frac * R * min(T, span)
 * and a loan lasts 2 min(T, span). A loan serves a burst shorter than a
 * round trip; at T = 1 s a budget of R * T, debited for two seconds,
 * moved the denials of bursts spread over every replica to the lenders
 * (`onoff`: 2.9 -> 6.8 % worst under-admission). */
#define LOAN_SPAN_S 0.1

static double
lendable(const session *s, const skey *key, uint64_t now)
{
	if (s->placeholder || isnan(key->grant_rate) || key->loan_hold > 0 ||
	    allot__est_read(s, key) > LOAN_IDLE * key->grant_rate)
		return 0;
	/* An agent reports a key only when it was used: since its last
	 * report the bucket has refilled at its rate (a key never reported
	 * is full). */
	double level = key->grant_burst;
	if (key->held_ns != 0 && now > key->held_ns)
		level = fmin(level,
		    key->held +
		        key->grant_rate * (double) (now - key->held_ns) / 1e9);
	double x = LOAN_LEND_PART * level - key->loan_debit;
	return x > 0 ? x : 0;
}

double
allot__loan(allot__state *st, service *svc, session *s, skey *key,
    double denied, uint64_t now)
{
	double frac = st->o.policy.loan_frac;
	/* A replica that waits for its quota's central reserve is served a
	 * burst from there: a loan would move the same tokens more slowly. */
	if (!(frac > 0) || !(denied > 0) || key->q < 0 ||
	    isnan(key->grant_rate) || key->loan_hold > 0 || st->hold ||
	    (key->tail && allot__central_on(st, (size_t) key->q)))
		return 0;
	squota *sq = &svc->q[key->q];
	double R = st->cur->rate[key->q];
	double T = fmin((double) st->o.interval_ms / 1e3, LOAN_SPAN_S);
	double room = frac * R * T - sq->loan_out - sq->debit_due;
	/* Only what the global bucket still has: when every replica is
	 * bursting (its level drained), lent tokens would be spent twice
	 * before the lenders are debited. */
	allot__level_bring(sq, R, st->cur->burst[key->q], now);
	if (sq->level - sq->loan_out < room)
		room = sq->level - sq->loan_out;
	if (room < 1)
		return 0;
	/* From the lenders holding the most, largest first, in whole
	 * tokens (an agent takes whole tokens), at most LOAN_LENDERS of
	 * them: few Replies carry a debit, and each debit is worth one. */
	double amount = 0;
	for (int n = 0; n < LOAN_LENDERS && room - amount >= 1; n++) {
		skey *best = NULL;
		session *best_s = NULL;
		double bx = 0;
		FOR_EACH_KEY (svc, i, o, ok) {
			if (o == s || ok->q != key->q)
				continue;
			double x = lendable(o, ok, now);
			if (x > bx) {
				bx = x;
				best = ok;
				best_s = o;
			}
		}
		double d = floor(fmin(bx, room - amount));
		if (best == NULL || d < 1)
			break;
		best->loan_debit += d;
		best->force_share = true;
		best_s->loan_due = true;
		sq->debit_due += d;
		amount += d;
	}
	if (amount < 1)
		return 0;
	key->loan_burst = amount;
	key->loan_hold = amount;
	key->loan_prefill = amount;
	key->loan_until_ns = now + (uint64_t) (2e9 * T);
	key->force_share = true;
	s->loan_due = true;
	sq->loan_out += amount;
	return amount;
}

bool
allot__loan_end(skey *key, uint64_t now)
{
	if (!(key->loan_burst > 0) || key->q < 0 || now < key->loan_until_ns)
		return false;
	/* The budget is lent again once the agent acknowledges. */
	key->loan_burst = 0;
	key->loan_prefill = 0;
	return true;
}

void
allot__loan_acked(service *svc, skey *key)
{
	if (key->q < 0 || !(key->loan_hold > key->loan_burst))
		return;
	squota *sq = &svc->q[key->q];
	sq->loan_out -= key->loan_hold - key->loan_burst;
	if (sq->loan_out < 0.5)
		sq->loan_out = 0;
	key->loan_hold = key->loan_burst;
}

void
allot__loan_sent(service *svc, skey *key)
{
	squota *sq = &svc->q[key->q];
	key->low -= key->loan_debit; /* taken from its bucket */
	sq->debit_due -= key->loan_debit;
	if (sq->debit_due < 0.5)
		sq->debit_due = 0;
	key->loan_prefill = 0;
	key->loan_debit = 0;
}
