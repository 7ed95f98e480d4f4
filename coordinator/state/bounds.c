/* SPDX-License-Identifier: MIT */
/*
 * Leases and the live bound (docs/allocation.md, "The live bound"). What
 * an agent may really hold can exceed its grant: a decrease counts from
 * its Reply but the agent applies it only on receipt, so a key remembers
 * the largest grant not acknowledged yet (the next Sync without a
 * sequence gap acknowledges); and a replica whose lease may have ended
 * runs on its quota's fallback, and so may an expired replica, for a
 * while. The sums of those per quota are the live bound in /metrics, and
 * what the expired replicas may still hold is kept out of the headroom
 * (allot__reserve_expired()).
 */
#include "registry_int.h"

#include "fallback.h"

#include <math.h>

/* What an agent runs on when its lease ran out: the quota's fallback
 * (agent/sync_core.c), with the agent's minimum burst applied. */
static void
fallback_allowance(
    const cfgv *v, size_t q, uint32_t n, double *ret_r, double *ret_b)
{
	allot__fallback_rate_burst(v->q[q]->fallback, v->rate[q], v->burst[q],
	    n, v->cfg->max_weight, ret_r, ret_b);
}

/* Where a replica stands with its lease at `now`, as far as the
 * coordinator can tell (see lease_at()). */
typedef enum lease_phase {
	LEASE_HELD,
	LEASE_EITHER,
	LEASE_LAPSED,
} lease_phase;

static lease_phase
lease_at(const allot__state *st, uint64_t sent_ns, uint64_t acked_ns,
    double interval_s, uint64_t now)
{
	/* Its lease started with the last answer it received: no earlier
	 * than the last it acknowledged (its Welcome counts: without it,
	 * it runs on its bootstrap allowance, a term of its own), no later
	 * than the last we sent plus its travel. And an agent notices the
	 * end of its lease between exchanges only, up to one request
	 * timeout late (allot__exchange_timeout_ms: 2 T, 250 ms to 2 s). */
	uint64_t lease = (uint64_t) st->o.lease_ms * 1000000u;
	double to = allot__exchange_timeout_ms(
	                (uint32_t) lround(interval_s * 1e3)) /
	    1e3;
	if (acked_ns == 0)
		acked_ns = sent_ns;
	if (sent_ns == 0 || now < acked_ns + lease)
		return LEASE_HELD;
	if (now < sent_ns + lease + (uint64_t) ((to + interval_s) * 1e9))
		return LEASE_EITHER;
	return LEASE_LAPSED;
}

/* The local burst an agent really runs with: it raises any burst of a
 * limiting allowance to the largest endpoint weight (agent.c), unless
 * it said it waits for the quota's central reserve (`raw`: then to one
 * token, what a bucket holds at least), and a zero rate closes the
 * bucket. */
static double
eff_burst(const cfgv *v, double r, double b, bool raw)
{
	if (!(r > 0))
		return 0;
	return fmax(b, raw ? 1.0 : (double) v->cfg->max_weight);
}

/* The lease/fallback blend: what a replica that holds `r`, `b` on quota
 * `q` (fallback R/n, B/n) may run on in lease phase `ph`. While its
 * lease surely runs, what it holds; while it may have ended, the larger
 * of that and the fallback; once it surely ended, the fallback. */
static void
lease_blend(const cfgv *v, size_t q, lease_phase ph, uint32_t n, double r,
    double b, bool raw, double *ret_r, double *ret_b)
{
	b = eff_burst(v, r, b, raw);
	if (ph != LEASE_HELD) {
		double fr, fb;
		fallback_allowance(v, q, n, &fr, &fb);
		r = ph == LEASE_LAPSED ? fr : fmax(r, fr);
		b = ph == LEASE_LAPSED ? fb : fmax(b, fb);
	}
	*ret_r = r;
	*ret_b = b;
}

/* What one key of a session may run on now (live bound terms). */
void
allot__key_bound(const allot__state *st, const session *s, const skey *key,
    uint64_t now, double *ret_r, double *ret_b)
{
	const cfgv *v = st->cur;
	double r = isnan(key->grant_rate) ? 0 : key->grant_rate;
	double b = isnan(key->grant_burst) ? 0 : key->grant_burst;
	if (!s->placeholder && !isnan(key->hold_rate)) {
		r = fmax(r, key->hold_rate);
		b = fmax(b, key->hold_burst);
	}
	/* Its own allowance (grants.c), held alone by its quota's bucket:
	 * the ceiling's level bounds the quotas together, not each. */
	if (!s->placeholder && !isnan(key->own_hold_rate)) {
		r = fmax(r, key->own_hold_rate);
		b = fmax(b, key->own_hold_burst);
	}
	lease_phase ph = s->placeholder ?
	    LEASE_HELD :
	    lease_at(
	        st, s->last_reply_ns, s->acked_reply_ns, s->interval_s, now);
	bool raw = key->tail && allot__central_on(st, (size_t) key->q);
	lease_blend(
	    v, (size_t) key->q, ph, fewest(s), r, b, raw, ret_r, ret_b);
	/* Silent, it may be running on its standby while its lease does. */
	if (!s->placeholder && ph != LEASE_LAPSED)
		*ret_r += allot__standby_held(s, key, now);
}

/* What expired replica `z` may run quota q on at `now`; false when it had
 * no key for it. */
bool
allot__expired_value(const allot__state *st, const expired_rep *z, size_t q,
    uint64_t now, double *ret_r, double *ret_b)
{
	const cfgv *v = st->cur;
	if (z->epoch != v->epoch || q >= v->nq || isnan(z->rate[q]))
		return false;
	lease_phase ph = lease_at(
	    st, z->reply_ns, z->acked_ns, z->interval_s, now);
	/* Whether it waited for the reserve is not kept: as if it raised. */
	lease_blend(
	    v, q, ph, z->n_last, z->rate[q], z->burst[q], false, ret_r, ret_b);
	return true;
}

/* What the expired replicas of `svc` may still be running on, kept out
 * of the headroom (allot__grant()): their grants while their lease may run,
 * and with ALLOT__HOLD_FALLBACK their fallback afterwards. Under the
 * lock, every tick. */
void
allot__reserve_expired(allot__state *st, service *svc, uint64_t now)
{
	const cfgv *v = st->cur;
	if (st->o.hold_expired == ALLOT__HOLD_NONE)
		return;
	for (size_t q = 0; q < v->nq; q++) {
		squota *sq = &svc->q[q];
		sq->reserved_rate = sq->reserved_burst = 0;
		for (uint32_t i = 0; i < svc->nzs; i++) {
			const expired_rep *z = &svc->zs[i];
			double r, b;
			if (!allot__expired_value(st, z, q, now, &r, &b))
				continue;
			if (st->o.hold_expired == ALLOT__HOLD_LEASE) {
				if (lease_at(st, z->reply_ns, z->acked_ns,
				        z->interval_s, now) == LEASE_LAPSED)
					continue;
				r = z->rate[q];
				b = z->burst[q];
			}
			sq->reserved_rate += r;
			sq->reserved_burst += b;
		}
	}
}

/* The live bound of every quota of `svc` (squota.bound_*): per replica
 * the larger of its grant and any earlier grant it has not acknowledged,
 * its fallback once its lease ran out, a placeholder's assumed share,
 * and the expired replicas still counted. Under the lock. */
void
allot__compute_bounds(allot__state *st, service *svc, uint64_t now)
{
	const cfgv *v = st->cur;
	for (size_t q = 0; q < v->nq; q++) {
		svc->q[q].bound_rate = 0;
		svc->q[q].bound_burst = 0;
		svc->q[q].counted_expired = 0;
	}
	FOR_EACH_KEY (svc, i, s, key) {
		double r, b;
		allot__key_bound(st, s, key, now, &r, &b);
		svc->q[key->q].bound_rate += r;
		/* A loan's raised burst (grants.c), until acknowledged. */
		svc->q[key->q].bound_burst += b + key->loan_hold;
	}
	for (uint32_t i = 0; i < svc->nzs; i++) {
		const expired_rep *z = &svc->zs[i];
		if (z->epoch != v->epoch)
			continue;
		for (size_t q = 0; q < v->nq; q++) {
			double r, b;
			if (!allot__expired_value(st, z, q, now, &r, &b))
				continue;
			svc->q[q].bound_rate += r;
			svc->q[q].bound_burst += b;
			svc->q[q].counted_expired++;
		}
	}
}

double
allot__bound_ratio(const squota *sq, double R, double B)
{
	/* R = B = 0: a closed or unlimited quota, which allotd bounds not. */
	double a = R > 0 ? sq->bound_rate / R : 0;
	double b = B > 0 ? sq->bound_burst / B : 0;
	return a > b ? a : b;
}
