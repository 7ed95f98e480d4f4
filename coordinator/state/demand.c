/* SPDX-License-Identifier: MIT */
/*
 * Demand (docs/allocation.md). Each key keeps a demand estimate, admitted
 * plus denied cost per second smoothed over the session's own sync
 * windows, from which the allocator water-fills every interval, and the
 * same averaged twenty times longer (slow: where the callers' traffic
 * lands in the long run); and each quota keeps the global bucket's
 * level, refilled at R and drained by reported consumption, which
 * /status, /metrics and the store show (the bursts are no longer cut to
 * it: docs/allocation.md). Demand is the
 * callers', not the replicas': when the replica set changes the estimates
 * are moved between replicas (conserve_*), and a replica registering
 * again keeps its own. A quota in shadow mode reports what enforcing
 * would have denied inside what it admitted (KeyReport.shadow_denied):
 * the estimates take it once, as consumption, never as unmet demand
 * (sync.c books it; docs/allocation.md, "Shadow quotas"), and the
 * global bucket here is drained only by what enforcing would have
 * admitted.
 */
#include "registry_int.h"

#include <math.h>

/* How many standard deviations of a replica's per-window rate a jump
 * must exceed to mark an onset. */
#define ALLOT__ONSET_Z 3.0

/* Refill the quota's global bucket estimate up to `now`. */
void
allot__level_bring(squota *sq, double rate, double burst, uint64_t now)
{
	if (sq->level_ns != 0 && now > sq->level_ns) {
		sq->level += rate * (double) (now - sq->level_ns) / 1e9;
		if (sq->level > burst)
			sq->level = burst;
	}
	if (now > sq->level_ns)
		sq->level_ns = now;
}

/* The time constant of a session's demand estimates, seconds: a few
 * intervals, and never so short that a fast-syncing replica's estimate
 * rests on a handful of requests. */
static double
est_tau(const session *s)
{
	double tau = ALLOT__STATE_TAU * s->interval_s;
	return tau > ALLOT__STATE_TAU_MIN_S ? tau : ALLOT__STATE_TAU_MIN_S;
}

/* The decay of the demand estimates over `idle` seconds. */
static double
est_decay(const session *s, double idle)
{
	return idle > 0 ? exp(-idle / est_tau(s)) : 1;
}

/* The demand estimate of a key as of its session's last Sync: a key not
 * reported since was idle in between, so the estimate decays over that
 * time (lazily: an unreported key costs nothing per Sync). */
double
allot__est_read(const session *s, const skey *key)
{
	if (key->est_ns == 0)
		return 0;
	return key->est *
	    est_decay(s, (double) since(s->last_sync_ns, key->est_ns) / 1e9);
}

/* The slow estimate, decayed like the fast one over the idle time since
 * it was last updated, but with its own time constant. */
double
allot__est_slow(const session *s, const skey *key)
{
	if (key->est_ns == 0)
		return 0;
	double idle = (double) since(s->last_sync_ns, key->est_ns) / 1e9;
	return key->slow *
	    (idle > 0 ? exp(-idle / (ALLOT__SLOW_TAUS * est_tau(s))) : 1);
}

/* The body of the demand, decayed like the fast estimate. */
double
allot__est_body(const session *s, const skey *key)
{
	if (key->est_ns == 0)
		return 0;
	return key->body *
	    est_decay(s, (double) since(s->last_sync_ns, key->est_ns) / 1e9);
}

/* The variance of that estimate: the variance of the per-window rates
 * (from the second moment kept beside the mean) times what an
 * exponential average of weight a keeps of it, a / (2 - a). */
double
allot__est_var(const session *s, const skey *key)
{
	if (key->est_ns == 0)
		return 0;
	double d = est_decay(
	    s, (double) since(s->last_sync_ns, key->est_ns) / 1e9);
	double m1 = key->est * d, m2 = key->est2 * d;
	double var = m2 - m1 * m1;
	double a = 1.0 - exp(-s->interval_s / est_tau(s));
	return var > 0 ? var * a / (2.0 - a) : 0;
}

/* A key whose reported denials were refuted (sync.c, denials()) lied
 * about them: what its estimates took from its earlier denials, before
 * its bound could refute them, goes at once rather than over many time
 * constants; each is held to `rate`, what it consumed. An honest agent
 * is never refuted. Under the lock. */
void
allot__est_refute(skey *key, double rate)
{
	rate = rate > 0 ? rate : 0;
	key->est = fmin(key->est, rate);
	key->est2 = fmin(key->est2, 2 * rate * rate);
	key->slow = fmin(key->slow, rate);
	key->body = fmin(key->body, rate);
}

/* Fold `amount` tokens (admitted + denied) over the `w` seconds ending at
 * `now` into the estimate: first the decay over the idle time before
 * the window (zeros, in effect), then an exponential average of the
 * window's rate and of its square with the time constant
 * ALLOT__STATE_TAU intervals. A first window is taken as it is, with
 * the variance of a single noisy measure (its own square). */
void
allot__est_update(const session *s, skey *key, double amount, double w,
    double step, uint64_t now)
{
	double inst = amount / w;
	/* The body: each window clipped to four times the body so far plus a
	 * step (a quarter of the equal share), so that a steady demand is
	 * reached in a handful of windows from nothing while a burst of a
	 * window or two lifts it by at most that (docs/allocation.md, "The
	 * central reserve"). */
	step = step > 0 ? step : 0;
	if (key->est_ns == 0) {
		key->est = inst;
		key->est2 = 2 * inst * inst;
		key->slow = inst;
		key->body = fmin(inst, step);
		key->est_ns = now;
		return;
	}
	uint64_t wns = (uint64_t) (w * 1e9);
	uint64_t start = now > wns ? now - wns : 0;
	double d = est_decay(s, (double) since(start, key->est_ns) / 1e9);
	key->est *= d;
	key->est2 *= d;
	/* The slow estimate the same way, ALLOT__SLOW_TAUS times slower. */
	double ts = ALLOT__SLOW_TAUS * est_tau(s);
	double gap = (double) since(start, key->est_ns) / 1e9;
	key->slow *= gap > 0 ? exp(-gap / ts) : 1;
	key->slow += (1.0 - exp(-w / ts)) * (inst - key->slow);
	double a = 1.0 - exp(-w / est_tau(s));
	key->body *= d;
	key->body += a * (fmin(inst, 4 * key->body + step) - key->body);
	key->est += a * (inst - key->est);
	key->est2 += a * (inst * inst - key->est2);
	key->est_ns = now;
}

/* Called with a report of `amount` tokens over `w` seconds before it is
 * folded into the estimate: a replica running above both its target and
 * twice its estimate says demand just appeared (a cron job's fan-out, a
 * burst after an idle spell). The other replicas' estimates predate it
 * until they report, so the allocator must not read them as idle and
 * take their shares (and the tokens their buckets hold) for the first
 * reporter: the quota's onset marks the episode, and replicas that have
 * not reported since keep their targets (alloc.c, `stale`). The first
 * jump of an episode sets it; a new episode starts `episode_ns` later.
 * Under the lock. */
void
allot__est_onset(squota *sq, const session *s, const skey *key, double amount,
    double w, uint64_t now, uint64_t episode_ns)
{
	/* The first reports of a newcomer are it learning its part of
	 * the load (claimed for it at the join), not a jump. */
	if (!key->targeted || s->last_seq < 2 || !(w > 0))
		return;
	double inst = amount / w;
	double m1 = allot__est_read(s, key);
	if (!(inst > key->rate) || !(inst > 2 * m1))
		return;
	/* Nor is a window that the replica's own noise explains (a few
	 * heavy requests on a quiet replica): the jump must exceed
	 * ALLOT__ONSET_Z standard deviations of its per-window rate. */
	double m2 = m1 > 0 ? key->est2 * (m1 / key->est) : 0;
	double var = m2 - m1 * m1;
	double z = ALLOT__ONSET_Z;
	if (var > 0 && (inst - m1) * (inst - m1) <= z * z * var)
		return;
	if (sq->onset_ns == 0 || since(now, sq->onset_ns) > episode_ns)
		sq->onset_ns = now;
}

/* Demand is the callers', not the replicas': when the replica set
 * changes, the load balancer moves it, it does not appear or vanish. A
 * newcomer claims the average of the others (alloc.c), so the others'
 * estimates give up the same part (n / (n + 1) each); a replica that
 * leaves hands its estimate to the survivors in equal parts. The
 * estimates then correct themselves from the next reports; without
 * this they would lag a change by a few intervals, and the shares with
 * them. `newcomer` is NULL at a Register (before it is added), or the
 * session whose join waited for its first Sync (join_pending); sessions
 * still waiting hold no demand and give none. Under the lock. */
void
allot__conserve_join(service *svc, const session *newcomer)
{
	double n = 0;
	for (uint32_t i = 0; i < svc->nsess; i++) {
		const session *o = svc->sess[i];
		n += o != newcomer && !o->placeholder && !o->join_pending;
	}
	if (n < 1)
		return;
	double f = n / (n + 1);
	FOR_EACH_SESSION_KEY (svc, i, s, key) {
		if (s->placeholder || s == newcomer || s->join_pending)
			break;
		key->est *= f;
		key->est2 *= f * f;
		key->slow *= f;
		key->body *= f;
	}
}

void
allot__conserve_leave(service *svc, const session *gone_s)
{
	/* Its loans end with it (grants.c): the budget is lent again. */
	for (uint32_t k = 0; k < gone_s->nkeys; k++) {
		const skey *gk = &gone_s->keys[k];
		if (gk->q < 0)
			continue;
		squota *sq = &svc->q[gk->q];
		sq->loan_out = fmax(0, sq->loan_out - gk->loan_hold);
		sq->debit_due = fmax(0, sq->debit_due - gk->loan_debit);
	}
	if (gone_s->placeholder || gone_s->last_seq == 0)
		return;
	double n = 0;
	for (uint32_t i = 0; i < svc->nsess; i++)
		n += svc->sess[i] != gone_s && !svc->sess[i]->placeholder;
	if (n < 1)
		return;
	for (uint32_t k = 0; k < gone_s->nkeys; k++) {
		const skey *gk = &gone_s->keys[k];
		if (gk->q < 0 || gk->est_ns == 0)
			continue;
		double add = allot__est_read(gone_s, gk) / n;
		double add_slow = allot__est_slow(gone_s, gk) / n;
		double add_body = allot__est_body(gone_s, gk) / n;
		/* To the same quota's key of every other live session. */
		FOR_EACH_KEY (svc, i, s, key) {
			if (s == gone_s || s->placeholder)
				break;
			if (key->q != gk->q)
				continue;
			if (key->est_ns == 0) {
				key->est = key->est2 = key->slow = 0;
				key->body = 0;
				key->est_ns = s->last_sync_ns;
			}
			/* Shift the mean, keep the variance. */
			key->est2 += add * (2 * key->est + add);
			key->est += add;
			key->slow += add_slow;
			key->body += add_body;
			break;
		}
	}
}

/* A replica registering again keeps its estimates. */
void
allot__est_inherit(session *s, const session *old)
{
	for (uint32_t k = 0; k < s->nkeys; k++) {
		skey *key = &s->keys[k];
		for (uint32_t j = 0; key->q >= 0 && j < old->nkeys; j++) {
			const skey *ok = &old->keys[j];
			if (ok->q == key->q && ok->est_ns != 0 &&
			    !old->placeholder) {
				double d = est_decay(old,
				    (double) since(
				        old->last_sync_ns, ok->est_ns) /
				        1e9);
				key->est = ok->est * d;
				key->est2 = ok->est2 * d;
				key->slow = allot__est_slow(old, ok);
				key->body = ok->body * d;
				key->est_ns = old->last_sync_ns;
				break;
			}
		}
	}
}
