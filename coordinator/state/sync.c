/* SPDX-License-Identifier: MIT */
/*
 * The Sync request (docs/protocol.md) from the nng worker threads: the
 * session and sequence checks, keys added by a reload, the reports booked
 * into the counters, estimates and global buckets (the bounds that make a
 * report "absurd" or clipped are decided here), the loans of an early
 * Sync, the acknowledgement of the last Reply, and the Reply itself;
 * allot__state_alive() for the Pings. Validates what it can before
 * locking, does its memory work under the lock, logs and counts after
 * unlocking.
 */
#include "registry_int.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One Sync on its way through: what its steps share. */
typedef struct syn {
	allot__state *st;
	const Allot__V1__Sync *req;
	session *s;
	service *svc;
	uint64_t now;
	/* The bounds of a sane report: the replicas, the time since the
	 * last Sync plus a second, and the slack (absurd_factor). */
	double n;
	double window_s;
	double f;
	double w; /* seconds the reports cover (demand estimates) */
	uint32_t unknown; /* reports for no key or a key without quota */
	uint32_t absurd; /* reports with impossible numbers */
	const Allot__V1__KeyReport *bad; /* the first absurd one */
	uint32_t clipped; /* reports above what could be admitted */
	double clipped_tokens; /* and by how much, in all */
	uint32_t refuted; /* reports of denials none could have had */
	double refuted_tokens; /* and those denials, in all */
	const Allot__V1__KeyReport *clip; /* the first clipped one */
	bool audit; /* write its event row (st->clip_event_ns) */
	bool forced; /* some key reported an allowance from elsewhere */
	bool early_round; /* an early Sync ran the allocation round */
	uint32_t loans; /* loans made to this Sync's keys */
	double lent; /* tokens they lent */
	uint32_t added; /* add_keys appended, of them with a quota */
	uint32_t added_known;
	allot__push push; /* the config text in the Reply */
	uint64_t digest; /* the config in force, and its length */
	size_t text_len;
} syn;

/* Why a Sync has no session to go to. */
typedef enum sync_refusal {
	SYNC_OK,
	SYNC_UNKNOWN, /* no such session */
	SYNC_PIPE, /* on another connection than its Register */
	SYNC_STALE, /* seq not above the last accepted */
	SYNC_REREGISTER, /* a reload may have given its keys a quota */
} sync_refusal;

/* The live session of the Sync (y->s), or why not. Under the lock. */
static sync_refusal
sync_session(syn *y, uint32_t pipe, uint64_t *ret_last_seq)
{
	y->s = allot__session_find(y->st, y->req->session);
	if (y->s == NULL)
		return SYNC_UNKNOWN;
	if (!allot__pipe_ok(y->s, pipe))
		return SYNC_PIPE;
	if (y->s->reregister) {
		/* It stays registered (and keeps its grants) until its new
		 * Register replaces it. */
		y->s->last_seen_ns = y->now;
		return SYNC_REREGISTER;
	}
	if (y->req->seq <= y->s->last_seq) {
		*ret_last_seq = y->s->last_seq;
		return SYNC_STALE;
	}
	return SYNC_OK;
}

/* The rejection reason of a refused add_keys. */
static allot__reject
reason_of_add(Allot__V1__Error__Code c)
{
	return c == ALLOT__V1__ERROR__CODE__TOO_LARGE ? ALLOT__REJ_TOO_LARGE :
	    c == ALLOT__V1__ERROR__CODE__RATE_LIMITED ? ALLOT__REJ_CAPACITY :
	                                                ALLOT__REJ_MALFORMED;
}

/* Append the Sync's add_keys to its session (their names were checked
 * before locking): key ids continue from the session's last, a quota
 * named twice is refused as in a Register, and keys with a quota get a
 * share in this Reply (the round runs at once). Under the lock. */
static Allot__V1__Error__Code
sync_add_keys(syn *y, ProtobufCAllocator *pa, char *err, size_t errlen)
{
	allot__state *st = y->st;
	session *s = y->s;
	const Allot__V1__Sync *req = y->req;
	uint32_t n = (uint32_t) req->n_add_keys;
	uint32_t max = st->o.max_keys ? st->o.max_keys : ALLOT__STATE_MAX_KEYS;
	if ((uint64_t) s->nwire + n > max) {
		snprintf(err, errlen,
		    "add_keys: %u keys more than the %u of session %" PRIu64
		    " is above the limit of %u keys",
		    n, s->nwire, req->session, max);
		return ALLOT__V1__ERROR__CODE__TOO_LARGE;
	}
	int32_t *q = allot__pa_alloc(pa, n * sizeof *q);
	if (q == NULL || !allot__stamp_next(st)) {
		snprintf(err, errlen, "out of memory, try again later");
		return ALLOT__V1__ERROR__CODE__RATE_LIMITED;
	}
	for (uint32_t k = 0; k < s->nkeys; k++)
		if (s->keys[k].q >= 0)
			st->stamp[s->keys[k].q] = st->stamp_gen;
	uint32_t nknown = 0;
	for (uint32_t k = 0; k < n; k++) {
		const char *name = req->add_keys[k];
		q[k] = allot__cfgv_find_svc(
		    st->cur, s->svc->name, name, strlen(name));
		if (q[k] < 0)
			continue;
		if (st->stamp[q[k]] == st->stamp_gen) {
			snprintf(err, errlen,
			    "add_keys %u (%.64s): session %" PRIu64
			    " has a key for that quota already",
			    k, name, req->session);
			return ALLOT__V1__ERROR__CODE__MALFORMED;
		}
		st->stamp[q[k]] = st->stamp_gen;
		nknown++;
	}
	if (!allot__session_append(s, req->add_keys, n, q, nknown)) {
		snprintf(err, errlen, "out of memory, try again later");
		return ALLOT__V1__ERROR__CODE__RATE_LIMITED;
	}
	y->added = n;
	y->added_known = nknown;
	if (nknown > 0) {
		y->svc->dirty = true;
		allot__recompute(st, y->svc, y->now);
	}
	return ALLOT__V1__ERROR__CODE__UNSPECIFIED;
}

/* The answer to a refused Sync, after unlocking. */
static Allot__V1__Error__Code
sync_refuse(allot__metrics *m, const Allot__V1__Sync *req, sync_refusal why,
    uint64_t last_seq, char *err, size_t errlen)
{
	if (why == SYNC_PIPE)
		return allot__pipe_mismatch(m, req->session, err, errlen);
	if (why == SYNC_REREGISTER) {
		snprintf(err, errlen,
		    "session %" PRIu64 ": the configuration was reloaded "
		    "with new quotas; register again",
		    req->session);
		allot__metrics_reject(m, ALLOT__REJ_UNKNOWN_SESSION, 1);
		return ALLOT__V1__ERROR__CODE__UNKNOWN_SESSION;
	}
	if (why == SYNC_UNKNOWN) {
		snprintf(err, errlen,
		    "unknown session %" PRIu64 ": register again",
		    req->session);
		allot__metrics_reject(m, ALLOT__REJ_UNKNOWN_SESSION, 1);
		return ALLOT__V1__ERROR__CODE__UNKNOWN_SESSION;
	}
	snprintf(err, errlen,
	    "seq %" PRIu64 " is not above the last "
	    "accepted seq %" PRIu64 " of session %" PRIu64,
	    req->seq, last_seq, req->session);
	allot__metrics_reject(m, ALLOT__REJ_STALE_SEQ, 1);
	return ALLOT__V1__ERROR__CODE__STALE_SEQ;
}

/* The shadow would-denies of a report that are booked beside the
 * allowance: tokens its replica admitted in shadow (they are in
 * `consumed`) beyond what enforcing would have admitted, so neither the
 * plausible consumption nor the global bucket may count them, and they
 * are bounded as denials are. That holds when the quota is in shadow in
 * the config in force, or when the agent says it still enforces another
 * config (Sync.config_digest): after a reload that ends shadow it may
 * run the old setting for up to two intervals. Otherwise shadow tokens
 * are consumption like any other. Never more than `consumed` (a refund
 * may have lowered what the agent reports consumed). Under the lock. */
static uint64_t
shadow_part(const syn *y, int32_t q, const Allot__V1__KeyReport *r)
{
	const cfgv *v = y->st->cur;
	bool other_cfg = y->req->config_digest != 0 &&
	    y->req->config_digest != v->cfg->digest;
	if (!v->q[q]->shadow && !other_cfg)
		return 0;
	return r->shadow_denied < r->consumed ? r->shadow_denied : r->consumed;
}

/* The consumption `key` may plausibly report now: what its replica could
 * have admitted since its last report with the allowance it may hold
 * (its grant, a larger one not acknowledged yet, or its fallback R/n;
 * before its first grant or on an allowance from elsewhere, the whole R)
 * plus its burst. A token bucket per key, refilled at that allowance and
 * never deeper than the allowance over the time since the last report
 * plus a second of network jitter plus the burst: unlike a bound per
 * Sync, frequent Syncs do not add up to more than the allowance over
 * time. Under the lock. */
static double
plausible(syn *y, skey *key, bool foreign, double R, double B)
{
	double rate = R;
	uint32_t n = fewest(y->s);
	if (!isnan(key->grant_rate) && !foreign)
		rate = fmax(key_hold(key), R / (n > 0 ? n : 1));
	double dt = key->credit_ns != 0 ?
	    (double) since(y->now, key->credit_ns) / 1e9 :
	    0;
	double cap = rate * (dt + 1.0) + B;
	key->credit = key->credit_ns != 0 ? key->credit + rate * dt : cap;
	if (key->credit > cap)
		key->credit = cap;
	key->credit_ns = y->now;
	return key->credit;
}

/* How many times in a row the bound of denials() may start over, and
 * the seconds that earn one more. */
#define DENIAL_RESETS 3.0
#define DENIAL_RESET_S 5.0

/* The denials `key` may plausibly report (issue 27): none when its
 * agent's bucket held the largest endpoint weight W throughout the
 * window, which a lower bound of its level proves. key->low is that
 * bound: refilled at the smallest grant the agent may have run since
 * the answer it last acknowledged (key->low_rate, or the equal split
 * once its lease may have run out) and capped at the smallest burst,
 * less what it took (`taken`: what it admitted; loans it paid back are
 * taken when sent, allot__loan_sent()), and never below a level it
 * reported itself (KeyReport.held when above 0, exact for an honest
 * agent; a liar only raises its own bound; 0 may be debt). Starting,
 * after a lost Sync (its counts are gone with it) and after a gap of
 * more than three of its intervals (an outage, where an agent may run
 * into debt), the bound is the most that debt can be, one interval of
 * its grant and W; those restarts are rationed (key->resets). If the bound
 * before the window, less what the window took, is at least W + 1 plus a
 * margin of one interval of its rate and half its burst (what its threads'
 * leases and timing may hold apart), no request of the window can have been
 * denied: its denials are not booked from this report (counted in
 * y->refuted; an agent with an account is audited from its Usage records,
 * usage.c). A replica that reports denials without consuming (issue 27: 49
 * such fakes took 98 % of a quota) is refuted once its bound has climbed from
 * the debt to that margin at its grant's rate; one that drained its bucket,
 * as a denied one has, never is. Under the lock. */
static uint64_t
denials(syn *y, skey *key, const Allot__V1__KeyReport *r, double taken)
{
	double W = (double) y->st->cur->cfg->max_weight;
	double h = key->low_rate >= 0 ? key->low_rate : 0;
	double b = key->low_burst >= 0 ? key->low_burst : 0;
	double iv = y->s->interval_s > 0 ? y->s->interval_s : 0.1;
	/* Past its lease with no answer acknowledged since (or since its
	 * Welcome), it runs on the equal split: an agent whose answers were
	 * all lost, or one that never acknowledges. */
	uint64_t base = y->s->acked_reply_ns != 0 ? y->s->acked_reply_ns :
	                                            y->s->welcomed_ns;
	if (base != 0 &&
	    since(y->now, base) > (uint64_t) y->st->o.lease_ms * 1000000u) {
		double n = y->s->acked_replicas > 0 ? y->s->acked_replicas : 1;
		h = y->st->cur->rate[key->q] / n;
		b = y->st->cur->burst[key->q] / n;
	} else if (y->s->acked_reply_ns == 0) {
		h = b = 0; /* on its Welcome's grant, or its bootstrap */
	}
	uint64_t denied = r->denied;
	key->denials_refuted = false;
	if (isnan(key->grant_rate)) {
		key->low_ns = 0;
		return denied;
	}
	/* A lost Sync (a gap in its seq) took its counts with it, and a
	 * long silence may have run its bucket into debt: the bound starts
	 * over, at most DENIAL_RESETS times in a row and once every
	 * DENIAL_RESET_S seconds in the long run (a liar skipping seqs
	 * gains a window or two each time). */
	bool lost = y->req->seq != y->s->last_seq + 1;
	double gap_s = (double) since(y->now, key->low_ns) / 1e9;
	if (key->low_ns != 0)
		key->resets = fmin(
		    DENIAL_RESETS, key->resets + gap_s / DENIAL_RESET_S);
	/* A key idle for a while is simply not reported; a silence is the
	 * session's. */
	bool silent = (double) since(y->now, y->s->last_sync_ns) / 1e9 >
	    3 * iv + 0.5;
	if (key->low_ns == 0 || ((lost || silent) && key->resets >= 1)) {
		key->resets = key->low_ns == 0 ? DENIAL_RESETS :
		                                 key->resets - 1;
		key->low = -(key->grant_rate * iv + W);
	} else {
		/* Its level when the window began: at most the smallest
		 * burst it may have run since (a lowered burst clips it). */
		key->low = fmin(b, key->low);
		if (denied > 0 && key->low - taken >= W + 1 + h * iv + b / 2) {
			y->refuted_tokens += (double) denied;
			y->refuted++;
			key->denials_refuted = true;
			denied = 0;
		}
		double dt = (double) since(y->now, key->low_ns) / 1e9;
		key->low = fmin(b, key->low + h * dt) - taken;
	}
	/* A held of 0 says only "at most 0": a bucket in debt reports 0. */
	if (r->held > 0)
		key->low = fmax(key->low, (double) r->held);
	key->low = fmin(b, key->low);
	key->low_ns = y->now;
	return denied;
}

/* A report's booked counts into its quota's totals, the second's
 * window and, for an agent without an account, the second's audit rows
 * (an agent with one is audited from its Usage records, usage.c). Under
 * the lock. */
static void
count_booked(const syn *y, squota *sq, uint64_t consumed, uint64_t denied,
    uint64_t shadow)
{
	sq->allowed_total += consumed;
	sq->denied_total += denied;
	sq->shadow_total += shadow;
	sq->win_allowed += consumed;
	sq->win_denied += denied;
	sq->win_shadow += shadow;
	if (y->s->incarnation == 0) {
		sq->aud_allowed += consumed;
		sq->aud_denied += denied;
		sq->aud_shadow += shadow;
	}
}

/* A report of a quota with a bucket per value (values.c): what its
 * agent's value buckets decided together, each within its own part of
 * the quota, so no allowance of the quota bounds the sum; the absurd
 * check allows the quota for every value the service splits, and the
 * counts are booked as reported. The quota's own allowance, its global
 * bucket, reserve and candidate describe only the overflow key that
 * values past the agent's pool share. Under the lock. */
static void
book_per_value(syn *y, skey *key, const Allot__V1__KeyReport *r)
{
	const cfgv *v = y->st->cur;
	int32_t q = key->q;
	double values = (double) allot__values_count(y->svc) + 1;
	double lim = y->f * values * (v->rate[q] * y->window_s + v->burst[q]);
	if ((double) r->consumed > lim || (double) r->denied > lim ||
	    r->shadow_denied > r->consumed) {
		if (y->absurd++ == 0)
			y->bad = r;
		return;
	}
	count_booked(
	    y, &y->svc->q[q], r->consumed, r->denied, r->shadow_denied);
	key->consumed += (double) r->consumed;
	key->denied += (double) r->denied;
	key->demand = (double) r->demand;
	key->held = (double) r->held;
	key->held_ns = y->now;
}

/* Book one report of a key we own: the quota's counters, global bucket
 * and candidate (candidate.c), the key's demand estimate and allocator
 * window. A report with numbers no agent can produce is dropped (counted
 * absurd). Shadow would-denies (shadow_part()) were admitted: they are
 * consumption in the counters, the demand estimate and the candidate's
 * bucket, counted apart from denials, and left out of the plausible
 * consumption and the global bucket, which stand for what enforcing
 * would have admitted. They are not denials either: a replica admitting
 * in shadow is not short, so they never push its target up past the
 * dead band as a denial does (docs/allocation.md, "Shadow quotas").
 * Under the lock. */
static void
book_report(syn *y, skey *key, const Allot__V1__KeyReport *r)
{
	const cfgv *v = y->st->cur;
	int32_t q = key->q;
	if (allot__quota_per_value(v, q)) {
		book_per_value(y, key, r);
		return;
	}
	if (r->foreign) {
		key->force_share = true;
		y->forced = true;
		if (isnan(key->grant_rate) &&
		    quota_learning(y->st, &y->svc->q[q], y->now))
			allot__adopt(y->st, y->svc, y->s, key, r);
	}
	double f = y->f, n = y->n;
	double rate = v->rate[q], burst = v->burst[q];
	double lim = f * rate * n * y->window_s + burst + key->central;
	double flood = ALLOT__STATE_FLOOD_FACTOR * lim;
	uint64_t shadow = shadow_part(y, q, r);
	if ((double) (r->consumed - shadow) > lim ||
	    (double) r->denied > flood || (double) shadow > flood ||
	    (double) r->demand > ALLOT__STATE_FLOOD_FACTOR * f * rate * n ||
	    (double) r->held > f * burst + 1) {
		if (y->absurd++ == 0)
			y->bad = r;
		return;
	}
	/* More than it could have admitted is clipped: counted and
	 * audited, never booked as consumption. What the central reserve
	 * granted it (ask.c) it could admit on top of its allowance, and
	 * is claimed first. */
	uint64_t admitted = r->consumed - shadow;
	double credit = plausible(y, key, r->foreign, rate, burst);
	if ((double) admitted > credit + key->central) {
		uint64_t keep = (uint64_t) (credit + key->central);
		y->clipped_tokens += (double) (admitted - keep);
		if (y->clipped++ == 0)
			y->clip = r;
		admitted = keep;
	}
	double from_central = fmin(key->central, (double) admitted);
	key->central -= from_central;
	key->credit -= (double) admitted - from_central;
	/* What a lowered burst dropped goes back to the reserve: at most
	 * what its grants fell by since (grants.c). */
	/* Its agent starts to run its burst as sent (KeyReport.tail): what
	 * the raise to the largest weight held above it may come back. */
	if (r->tail && !key->tail && !isnan(key->grant_burst))
		key->returnable = fmin(burst,
		    key->returnable +
		        fmax(0,
		            (double) v->cfg->max_weight - key->grant_burst));
	allot__central_give_back(y->st, y->svc, key, r->returned);
	/* What its full bucket discarded goes to the reserve: at most its
	 * refill over the reports' window (agent/ledger.h). */
	if (r->overflow > 0 && allot__central_on(y->st, (size_t) q))
		y->svc->q[q].rsv_returned += fmin(
		    (double) r->overflow, key_hold(key) * (y->w + 0.1) + 1);
	uint64_t consumed = admitted + shadow;
	uint64_t denied = denials(y, key, r, (double) consumed);
	uint64_t sd = r->shadow_denied < consumed ? r->shadow_denied :
	                                            consumed;
	squota *sq = &y->svc->q[q];
	count_booked(y, sq, consumed, denied, sd);
	allot__level_bring(sq, rate, burst, y->now);
	sq->level -= (double) admitted;
	if (sq->level < 0)
		sq->level = 0;
	allot__central_admitted(y->st, y->svc, (double) admitted, y->now);
	if (key->denials_refuted)
		allot__est_refute(key, (double) consumed / y->w);
	/* Denials tell the allocator that demand exceeds the grant; beyond
	 * R a second they say nothing more (no replica may get more), so a
	 * window's denials count for at most that: what a liar's accepted
	 * window can add to its estimate is bounded too. */
	double offered = (double) consumed +
	    fmin((double) denied, rate * y->w + burst);
	allot__cand_book(sq, v->q[q], offered, y->now);
	allot__est_onset(sq, y->s, key, offered, y->w, y->now,
	    2 * (uint64_t) y->st->o.interval_ms * 1000000u);
	allot__est_update(
	    y->s, key, offered, y->w, 0.25 * rate / (n > 0 ? n : 1), y->now);
	key->consumed += (double) consumed;
	key->denied += (double) denied;
	key->demand = (double) r->demand;
	key->tail = r->tail;
	key->held = (double) r->held;
	key->held_ns = y->now;
}

/* Every report of the Sync. Under the lock. */
static void
book_reports(syn *y, ProtobufCAllocator *pa)
{
	const Allot__V1__Sync *req = y->req;
	session *s = y->s;
	y->n = y->svc->nsess;
	y->window_s = (double) since(y->now, s->last_sync_ns) / 1e9 + 1.0;
	y->f = y->st->o.absurd_factor;
	/* The window the reports cover, for the demand estimates: the
	 * agent's own measure (no network jitter in it) unless it is
	 * missing or beyond what the coordinator saw. */
	double w = (double) req->elapsed_ms / 1e3;
	double wseen = y->window_s - 1.0;
	if (!(w > 0) || w > wseen + 1.0)
		w = wseen;
	if (w < 1e-3)
		w = 1e-3;
	y->w = w;
	for (size_t i = 0; i < req->n_reports; i++) {
		const Allot__V1__KeyReport *r = req->reports[i];
		skey *key = session_key(s, r->key);
		if (key == NULL || key->q < 0) {
			y->unknown++;
			continue;
		}
		book_report(y, key, r);
	}
}

/* An early Sync: a loan for each key that reports denials (grants.c,
 * docs/allocation.md "Loans"), in the Reply being built. Under the
 * lock. */
static void
sync_loans(syn *y)
{
	const Allot__V1__Sync *req = y->req;
	for (size_t i = 0; i < req->n_reports; i++) {
		const Allot__V1__KeyReport *r = req->reports[i];
		skey *key = session_key(y->s, r->key);
		if (key == NULL || key->q < 0 || r->denied == 0 ||
		    key->denials_refuted)
			continue;
		double lent = allot__loan(
		    y->st, y->svc, y->s, key, (double) r->denied, y->now);
		if (lent > 0) {
			y->loans++;
			y->lent += lent;
		}
	}
}

void
allot__session_acked(allot__state *st, session *s, uint64_t now)
{
	if (!s->unacked)
		return;
	for (uint32_t k = 0; k < s->nkeys; k++) {
		skey *key = &s->keys[k];
		double h0 = key->q >= 0 ? key_hold(key) : 0;
		double hb0 = key->hold_burst;
		key->hold_rate = key->grant_rate;
		key->hold_burst = key->grant_burst;
		key->own_hold_rate = key->own_rate;
		key->own_hold_burst = key->own_burst;
		key->standby_hold = key->standby;
		if (key->q < 0)
			continue;
		s->svc->held_total += key_hold(key) - h0;
		/* What it gave up is the reserve's now, not at the next
		 * tick (central.c). */
		allot__central_grow(st, s->svc, (size_t) key->q,
		    h0 - key_hold(key), hb0, key->hold_burst, key->tail, now);
	}
	s->unacked = false;
}

/* The sequence number of the Sync: without a gap, the agent applied our
 * previous answer, so what it holds is its grant again, and its lease
 * runs from that answer. Returns whether there was a gap. Under the
 * lock. */
static bool
sync_ack(syn *y)
{
	session *s = y->s;
	bool gap = y->req->seq != s->last_seq + 1;
	if (!gap) {
		s->acked_reply_ns = s->last_reply_ns;
		s->acked_replicas = s->last_replicas;
	}
	if (!gap)
		for (uint32_t k = 0; k < s->nkeys; k++)
			allot__loan_acked(y->svc, &s->keys[k]);
	if (!gap)
		allot__session_acked(y->st, s, y->now);
	/* It runs the grants of the answer it acknowledged, or of any sent
	 * after (grants.c lowers these with each): denials(). */
	if (!gap)
		for (uint32_t k = 0; k < s->nkeys; k++) {
			s->keys[k].low_rate = s->keys[k].grant_rate;
			s->keys[k].low_burst = s->keys[k].grant_burst;
		}
	s->last_seq = y->req->seq;
	s->last_seen_ns = y->now;
	s->last_sync_ns = y->now;
	s->seen_dirty = true;
	return gap;
}

/* The Reply: full after a gap or every full_every answers, otherwise the
 * grants that changed. Under the lock. */
static void
sync_reply(syn *y, ProtobufCAllocator *pa, bool gap, Allot__V1__Reply *ret)
{
	allot__state *st = y->st;
	session *s = y->s;
	service *svc = y->svc;
	ret->seq = y->req->seq;
	ret->replicas = svc->nsess;
	ret->config_epoch = st->cur->epoch;
	ret->config_digest = st->cur->cfg->digest;
	ret->lease_ms = st->o.lease_ms;
	ret->rejected_reports = y->unknown + y->absurd;
	/* Digest 0: an agent that does not speak the config plane. */
	y->digest = st->cur->cfg->digest;
	y->text_len = st->cur->text_len;
	if (y->req->config_digest != 0)
		y->push = allot__config_push(
		    st, s, pa, y->req->config_digest, y->now, &ret->config);
	bool full = s->force_full || gap ||
	    ++s->replies_since_full >= st->o.full_every;
	if (full || y->forced || s->sent_gen != svc->gen || s->pending > 0 ||
	    s->loan_due) {
		if (allot__build_shares(
		        st, s, pa, full, &ret->shares, &ret->n_shares)) {
			ret->full = full;
			if (full) {
				s->replies_since_full = 0;
				s->force_full = false;
			}
			s->sent_gen = svc->gen;
		} else {
			s->force_full = true;
		}
	}
	s->last_reply_ns = y->now;
	s->last_replicas = svc->nsess;
	ret->durable = allot__usage_durable(st, s);
}

/* After unlocking: clipped reports, and refuted denials (denials()),
 * counted, logged and audited (at most one event row a second, so a
 * liar cannot flood the store). */
static void
sync_report_clipped(const syn *y)
{
	allot__state *st = y->st;
	allot__metrics *m = st->o.metrics;
	const Allot__V1__KeyReport *c = y->clip;
	if (m != NULL) {
		allot__metrics_add(&m->reports_clipped, y->clipped);
		allot__metrics_add(
		    &m->tokens_clipped, (uint64_t) y->clipped_tokens);
		allot__metrics_add(&m->denial_reports_refuted, y->refuted);
		allot__metrics_add(
		    &m->denials_refuted, (uint64_t) y->refuted_tokens);
	}
	if (y->clipped > 0)
		allot__log_ratelimited(st->o.lg, &st->rl_clip,
		    ALLOT_LOG_WARNING, "ALLOTD-IMPLAUSIBLE",
		    "session %" PRIu64 " seq %" PRIu64 ": %u reports "
		    "claimed more than the replica could have admitted "
		    "since its last report; %.0f tokens not booked (first: "
		    "key %u consumed %" PRIu64 ")",
		    y->req->session, y->req->seq, y->clipped,
		    y->clipped_tokens, c->key, c->consumed);
	if (y->refuted > 0)
		allot__log_ratelimited(st->o.lg, &st->rl_clip,
		    ALLOT_LOG_WARNING, "ALLOTD-IMPLAUSIBLE",
		    "session %" PRIu64 " seq %" PRIu64 ": %u reports "
		    "claimed denials while the replica's bucket held the "
		    "largest weight throughout; %.0f denials not booked",
		    y->req->session, y->req->seq, y->refuted,
		    y->refuted_tokens);
	if (st->o.store != NULL && y->audit) {
		char detail[200];
		snprintf(detail, sizeof detail,
		    "service=%.64s session=%" PRIu64
		    " reports=%u tokens=%.0f denial_reports=%u denials=%.0f",
		    y->svc->name, y->req->session, y->clipped,
		    y->clipped_tokens, y->refuted, y->refuted_tokens);
		allot__store_event(
		    st->o.store, "implausible", y->s->replica_id, detail);
	}
}

/* After unlocking: the counters and log lines of a Sync. */
static void
sync_report(const syn *y)
{
	allot__state *st = y->st;
	allot__metrics *m = st->o.metrics;
	const Allot__V1__Sync *req = y->req;
	uint32_t unknown = y->unknown, absurd = y->absurd;
	if (m != NULL) {
		allot__metrics_add(&m->syncs, 1);
		if (req->early)
			allot__metrics_add(&m->early_syncs, 1);
		if (y->early_round)
			allot__metrics_add(&m->early_rounds, 1);
		allot__metrics_add(&m->loans, y->loans);
		allot__metrics_add(&m->loan_tokens, (uint64_t) y->lent);
		allot__metrics_add(
		    &m->key_reports, req->n_reports - unknown - absurd);
	}
	if (unknown > 0) {
		allot__metrics_reject(m, ALLOT__REJ_UNKNOWN_KEY, unknown);
		allot__log_ratelimited(st->o.lg, &st->rl_unknown,
		    ALLOT_LOG_WARNING, "ALLOTD-UNKNOWN-KEY",
		    "session %" PRIu64 " seq %" PRIu64 ": %u reports for keys "
		    "that are out of range or have no quota were dropped",
		    req->session, req->seq, unknown);
	}
	if (y->clipped > 0 || y->refuted > 0)
		sync_report_clipped(y);
	if (absurd > 0) {
		const Allot__V1__KeyReport *bad = y->bad;
		allot__metrics_reject(m, ALLOT__REJ_ABSURD, absurd);
		allot__log_ratelimited(st->o.lg, &st->rl_absurd,
		    ALLOT_LOG_WARNING, "ALLOTD-ABSURD",
		    "session %" PRIu64 " seq %" PRIu64 ": %u reports with "
		    "impossible numbers dropped (first: key %u consumed "
		    "%" PRIu64 " denied %" PRIu64 " held %" PRIu64
		    " demand %" PRIu64 ")",
		    req->session, req->seq, absurd, bad->key, bad->consumed,
		    bad->denied, bad->held, bad->demand);
	}
}

Allot__V1__Error__Code
allot__state_sync_on(allot__state *st, const Allot__V1__Sync *req,
    uint32_t pipe, ProtobufCAllocator *pa, Allot__V1__Reply *ret, char *err,
    size_t errlen)
{
	syn y = { .st = st, .req = req };
	uint64_t last_seq = 0;
	if (req->n_add_keys > 0) {
		uint32_t max = st->o.max_keys ? st->o.max_keys :
		                                ALLOT__STATE_MAX_KEYS;
		Allot__V1__Error__Code c = allot__add_keys_check(
		    req, 0, max, err, errlen);
		if (c != ALLOT__V1__ERROR__CODE__UNSPECIFIED) {
			allot__metrics_reject(
			    st->o.metrics, reason_of_add(c), 1);
			return c;
		}
	}

	pthread_mutex_lock(&st->mu);
	y.now = now_ns(st);
	allot__heard(st, y.now);
	sync_refusal why = sync_session(&y, pipe, &last_seq);
	if (why != SYNC_OK) {
		pthread_mutex_unlock(&st->mu);
		return sync_refuse(
		    st->o.metrics, req, why, last_seq, err, errlen);
	}
	y.svc = y.s->svc;
	if (req->n_add_keys > 0) {
		Allot__V1__Error__Code c = sync_add_keys(&y, pa, err, errlen);
		if (c != ALLOT__V1__ERROR__CODE__UNSPECIFIED) {
			pthread_mutex_unlock(&st->mu);
			allot__metrics_reject(
			    st->o.metrics, reason_of_add(c), 1);
			return c;
		}
	}
	if (y.s->join_pending) {
		allot__conserve_join(y.svc, y.s);
		y.s->join_pending = false;
	}
	book_reports(&y, pa);
	allot__usage_book(st, y.s, req->usage, req->n_usage);
	allot__strangers_note(
	    st, y.svc->name, req->strangers, req->n_strangers);
	if ((y.clipped > 0 || y.refuted > 0) &&
	    (st->clip_event_ns == 0 ||
	        since(y.now, st->clip_event_ns) >= 1000000000u)) {
		st->clip_event_ns = y.now;
		y.audit = true;
	}
	bool gap = sync_ack(&y);
	/* What its buckets gave back is the reserve's at once: the ack
	 * above made room for it (central.c). */
	for (uint32_t k = 0; k < y.s->nkeys; k++)
		if (y.s->keys[k].q >= 0)
			allot__central_returned(
			    st, y.svc, (size_t) y.s->keys[k].q, y.now);
	if (req->early) {
		y.early_round = allot__early_round(st, y.svc, y.now);
		sync_loans(&y);
	}
	sync_reply(&y, pa, gap, ret);
	allot__values_sync(st, y.svc, y.s, req, y.now, pa, ret);
	pthread_mutex_unlock(&st->mu);

	sync_report(&y);
	allot__config_push_report(
	    st, y.push, y.s->replica_id, y.svc->name, y.digest, y.text_len);
	return ALLOT__V1__ERROR__CODE__UNSPECIFIED;
}

bool
allot__state_alive(allot__state *st, uint64_t session_id, uint32_t pipe)
{
	pthread_mutex_lock(&st->mu);
	session *s = allot__session_find(st, session_id);
	bool ok = s != NULL && allot__pipe_ok(s, pipe);
	if (ok)
		s->last_seen_ns = now_ns(st);
	pthread_mutex_unlock(&st->mu);
	return ok;
}

Allot__V1__Error__Code
allot__state_sync(allot__state *st, const Allot__V1__Sync *req,
    ProtobufCAllocator *pa, Allot__V1__Reply *ret, char *err, size_t errlen)
{
	return allot__state_sync_on(st, req, 0, pa, ret, err, errlen);
}
