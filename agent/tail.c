/* SPDX-License-Identifier: MIT */
/*
 * The tail path's engine (tail.h): the waiters' queues, the Ask built
 * from them, the Grant that completes them, their deadlines. What a
 * waiter is admitted with is counted on its key like any admission (it
 * is consumption the next Sync reports); tokens of a Grant the waiters
 * do not use go into the quota's local bucket, which keeps at most its
 * burst: nothing the reserve handed out is ever held twice.
 */
#include "tail.h"

#include <linux/futex.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "allot.pb-c.h"
#include "protocol.h"
#include "sync_int.h"

/* The Ask exchange may take this long at least (a round trip on a
 * loaded host) and at most the Sync's timeout. */
#define ASK_TIMEOUT_MIN_MS 5u

int
allot__tail_init(
    allot__tail *t, allot_agent *a, void (*wake)(void *ctx), void *wake_ctx)
{
	memset(t, 0, sizeof *t);
	t->a = a;
	t->wake = wake;
	t->wake_ctx = wake_ctx;
	t->pending_end = &t->pending;
	for (uint32_t f = 0; f < ALLOT__TAIL_FLIGHTS; f++)
		t->fl[f].end = &t->fl[f].head;
	size_t n = a->quota_cap;
	t->dry_until = calloc(n, sizeof *t->dry_until);
	t->dry_left = calloc(n, sizeof *t->dry_left);
	t->want = calloc(n, sizeof *t->want);
	t->min = calloc(n, sizeof *t->min);
	t->held = calloc(n, sizeof *t->held);
	t->got = calloc(n, sizeof *t->got);
	t->held_by = calloc(n, sizeof *t->held_by);
	if (t->dry_until == NULL || t->dry_left == NULL || t->want == NULL ||
	    t->min == NULL || t->held == NULL || t->got == NULL ||
	    t->held_by == NULL) {
		allot__tail_fini(t, 0);
		return ALLOT_ENOMEM;
	}
	return ALLOT_OK;
}

static void
futex_wake(_Atomic uint32_t *p)
{
	syscall(
	    SYS_futex, (uint32_t *) p, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* The waiter's decision: hand it over and never touch it again. */
static void
complete(allot__tail *t, allot__waiter *wt, bool central, uint64_t now)
{
	allot_decision d;
	allot__qrt *q = &t->a->quotas[wt->quota];
	if (!central && allot__tail_standby_ok(t, now) &&
	    atomic_load(&q->central) &&
	    allot__bucket_level(&q->bucket, now) < (double) wt->cost &&
	    allot__standby_take(t->a, q, wt->cost, now)) {
		/* Its Ask found no coordinator to serve it: the standby. */
		atomic_fetch_add(&t->standby, 1);
		if (allot__decide_central(t->a, wt->key, wt->cost, now, &d))
			atomic_fetch_add(&t->allowed, 1);
		else
			atomic_fetch_sub(&q->standby_used, wt->cost);
	} else if (central) {
		/* A stacked level may still deny it: the reserve's tokens
		 * are then the bucket's. */
		if (allot__decide_central(t->a, wt->key, wt->cost, now, &d)) {
			atomic_fetch_add(&t->allowed, 1);
			atomic_fetch_add(&q->central_spent, wt->cost);
		} else {
			atomic_fetch_add(&q->deposited,
			    (uint64_t) wt->cost * ALLOT__DEPOSIT_ONE);
		}
	} else {
		allot__decide_final(t->a, wt->key, wt->cost, now, &d);
		atomic_fetch_add(&t->denied, !d.allowed);
	}
	uint64_t waited = now > wt->since_ns ? now - wt->since_ns : 0;
	atomic_fetch_add(&t->wait_ns, waited);
	if (waited > atomic_load(&t->wait_max_ns))
		atomic_store(&t->wait_max_ns, waited);
	if (wt->cb != NULL) {
		allot_wait_cb cb = wt->cb;
		allot_wait *w = wt->w;
		atomic_store(&wt->state, ALLOT__WAIT_DONE);
		cb(w, &d);
		return;
	}
	*wt->out = d;
	_Atomic uint32_t *state = &wt->state;
	atomic_store_explicit(state, ALLOT__WAIT_DONE, memory_order_release);
	/* The caller may have returned already: waking an address that is
	 * no longer a waiter is harmless (its waits loop on the state). */
	futex_wake(state);
}

static void
complete_all(allot__tail *t, allot__waiter *list, uint64_t now)
{
	while (list != NULL) {
		allot__waiter *next = list->next;
		complete(t, list, false, now);
		list = next;
	}
}

/* The inbox, oldest first, onto the pending queue. */
static void
collect(allot__tail *t)
{
	allot__waiter *w = atomic_exchange(&t->inbox, NULL), *rev = NULL;
	while (w != NULL) {
		allot__waiter *next = w->next;
		w->next = rev;
		rev = w;
		w = next;
	}
	*t->pending_end = rev;
	while (*t->pending_end != NULL)
		t->pending_end = &(*t->pending_end)->next;
}

void
allot__tail_fini(allot__tail *t, uint64_t now)
{
	if (t->a != NULL) {
		collect(t);
		for (uint32_t f = 0; f < ALLOT__TAIL_FLIGHTS; f++) {
			complete_all(t, t->fl[f].head, now);
			t->fl[f] = (allot__flight) { .end = &t->fl[f].head };
		}
		complete_all(t, t->pending, now);
	}
	t->pending = NULL;
	t->pending_end = &t->pending;
	free(t->dry_until);
	free(t->dry_left);
	free(t->want);
	free(t->min);
	free(t->held);
	free(t->got);
	free(t->held_by);
	t->dry_until = NULL;
	t->dry_left = NULL;
	t->want = t->min = NULL;
	t->held = t->got = NULL;
	t->held_by = NULL;
}

bool
allot__tail_usable(allot__tail *t, uint32_t q, uint32_t cost, uint64_t now)
{
	return t != NULL &&
	    atomic_load_explicit(&t->usable, memory_order_relaxed) &&
	    now >=
	    atomic_load_explicit(&t->quiet_until, memory_order_relaxed) &&
	    q < t->a->quota_cap &&
	    atomic_load_explicit(
	        &t->a->quotas[q].central, memory_order_relaxed) &&
	    (now >= atomic_load_explicit(
	                &t->dry_until[q], memory_order_relaxed) ||
	        cost <= atomic_load_explicit(
	                    &t->dry_left[q], memory_order_relaxed));
}

void
allot__tail_enter(allot__tail *t, allot__waiter *wt)
{
	allot__waiter *head = atomic_load(&t->inbox);
	do
		wt->next = head;
	while (!atomic_compare_exchange_weak(&t->inbox, &head, wt));
	if (head == NULL && t->wake != NULL)
		t->wake(t->wake_ctx);
}

/* A coordinator answers again: the quotas' standby is theirs once more,
 * at most once every ALLOT__TAIL_STANDBY_RENEW_NS and not within a
 * take-over window (which draws on what the outage before it left). */
static void
standby_renew(allot__tail *t)
{
	allot_agent *a = t->a;
	uint64_t now = allot__agent_now(a);
	if (t->standby_reset_ns != 0 &&
	    (now - t->standby_reset_ns < ALLOT__TAIL_STANDBY_RENEW_NS ||
	        now < atomic_load(&t->takeover_until)))
		return;
	uint32_t nq = atomic_load(&a->nquotas);
	bool any = false;
	for (uint32_t q = 0; q < nq; q++)
		any |= atomic_exchange(&a->quotas[q].standby_used, 0) != 0;
	if (any || t->standby_reset_ns == 0)
		t->standby_reset_ns = now;
	atomic_store(&t->outage_from, 0);
	atomic_store(&t->outage_to, 0);
}

/* The outage's bounds as the session `c` stands (driver): it starts
 * when no coordinator can be asked although the lease runs, counted from
 * allot__standby_after_ns() after the last answer, with every quota's standby
 * rate as it was then; it ends when one can be asked again. */
static void
outage_track(allot__tail *t, const allot__syncc *c, bool ok, bool lost)
{
	allot_agent *a = t->a;
	uint64_t now = allot__agent_now(a);
	uint64_t from = atomic_load(&t->outage_from);
	if (lost && from == 0 && c->answered_ns != 0) {
		uint32_t nq = atomic_load(&a->nquotas);
		for (uint32_t q = 0; q < nq; q++)
			atomic_store(&a->quotas[q].standby_outage,
			    atomic_load(&a->quotas[q].standby_rate));
		uint64_t start = c->answered_ns +
		    allot__standby_after_ns(a->opts.sync_interval_ms);
		atomic_store(&t->outage_to, 0);
		atomic_store(&t->outage_from, start > now ? start : now);
	} else if (ok && from != 0 && atomic_load(&t->outage_to) == 0) {
		atomic_store(&t->outage_to, now > from ? now : from);
	}
}

double
allot__tail_outage_s(allot__tail *t, uint64_t now)
{
	if (t == NULL)
		return 0;
	uint64_t from = atomic_load_explicit(
	    &t->outage_from, memory_order_relaxed);
	uint64_t to = atomic_load_explicit(
	    &t->outage_to, memory_order_relaxed);
	uint64_t end = to != 0 ? to : now;
	return from != 0 && end > from ? (double) (end - from) / 1e9 : 0;
}

void
allot__tail_publish(allot__tail *t, const allot__syncc *c)
{
	bool unsupported = t->unsupported &&
	    t->unsupported_session == c->session;
	bool fallback = atomic_load(&c->in_fallback);
	bool ok = c->session != 0 && atomic_load(&c->connected) && !fallback &&
	    !unsupported;
	bool lost = !ok && !fallback && !unsupported;
	atomic_store(&t->usable, ok);
	atomic_store(&t->unreachable, lost);
	outage_track(t, c, ok, lost);
	if (ok)
		standby_renew(t);
}

/* Whether no coordinator can be asked for the reserve now although the
 * agent runs on its lease (not in fallback): no session, or the last
 * Asks went unanswered. */
static bool
unreachable(allot__tail *t, uint64_t now)
{
	return t != NULL &&
	    (atomic_load_explicit(&t->unreachable, memory_order_relaxed) ||
	        now < atomic_load_explicit(
	                  &t->quiet_until, memory_order_relaxed));
}

bool
allot__tail_standby_ok(allot__tail *t, uint64_t now)
{
	return unreachable(t, now) ||
	    (t != NULL &&
	        now < atomic_load_explicit(
	                  &t->takeover_until, memory_order_relaxed));
}

void
allot__tail_welcomed(allot__tail *t, uint64_t session, uint64_t epoch,
    uint64_t lease_ns, uint64_t now)
{
	if (epoch > t->last_epoch && t->last_epoch != 0)
		atomic_store(&t->takeover_until, now + 2 * lease_ns);
	/* A new session can be asked at once, whatever the last one's
	 * errors said. */
	atomic_store(&t->quiet_until, 0);
	t->lost_streak = 0;
	if (epoch > t->last_epoch)
		t->last_epoch = epoch;
	if (!(t->unsupported && t->unsupported_session == session))
		atomic_store(&t->usable, true);
}

bool
allot__tail_has_pending(allot__tail *t)
{
	return t->pending != NULL || atomic_load(&t->inbox) != NULL;
}

/* Whether waiter `wt` can be asked for in session `c` now. */
static bool
askable(allot__tail *t, const allot__syncc *c, const allot__waiter *wt,
    uint64_t now)
{
	return atomic_load(&t->usable) && wt->quota < c->nwire &&
	    wt->quota < atomic_load(&t->a->nquotas) && wt->deadline_ns > now &&
	    allot__tail_usable(t, wt->quota, wt->cost, now);
}

/* A free flight, or ALLOT__TAIL_FLIGHTS with `*ret_at_ns` set to when
 * the next Ask may go: no sooner than half a round trip after the last,
 * so that two flights split the waiters of a round trip between them. */
static uint32_t
free_flight(const allot__tail *t, uint64_t now, uint64_t *ret_at_ns)
{
	uint32_t busy = 0, f_free = ALLOT__TAIL_FLIGHTS;
	for (uint32_t f = 0; f < ALLOT__TAIL_FLIGHTS; f++) {
		if (t->fl[f].busy)
			busy++;
		else if (f_free == ALLOT__TAIL_FLIGHTS)
			f_free = f;
	}
	*ret_at_ns = UINT64_MAX;
	if (busy == 0 || f_free == ALLOT__TAIL_FLIGHTS)
		return f_free;
	uint64_t at = t->last_sent_ns + t->rtt_ns / 2;
	if (t->rtt_ns == 0 || now >= at)
		return t->rtt_ns == 0 ? ALLOT__TAIL_FLIGHTS : f_free;
	*ret_at_ns = at;
	return ALLOT__TAIL_FLIGHTS;
}

/* Tokens of quota q's bucket the tail path took out (< 0) or put in,
 * a part of one included, counted for its ledger (ledger.h). */
static void
bucket_move(allot__tail *t, uint32_t q, double tokens, uint64_t now)
{
	allot__qrt *qr = &t->a->quotas[q];
	if (tokens > 0)
		allot__bucket_deposit(&qr->bucket, tokens, now);
	else if (tokens < 0)
		allot__bucket_take_part(&qr->bucket, -tokens, now);
	atomic_fetch_add(&qr->deposited,
	    (uint64_t) (int64_t) llround(tokens * ALLOT__DEPOSIT_ONE));
}

/* The part of `min` each quota asked for into flight `flight` (1 + its
 * index) has refilled, taken out of its bucket (t->held): the reserve
 * completes it (AskKey.held) when it runs dry, rather than leave it
 * there until the bucket refills a whole token, maybe after the burst.
 * Only a limiting bucket holds part of a token. */
static void
held_take(allot__tail *t, uint8_t flight, uint64_t now)
{
	uint32_t nq = atomic_load(&t->a->nquotas);
	uint64_t interval = (uint64_t) t->a->opts.sync_interval_ms * 1000000u;
	for (uint32_t q = 0; q < nq; q++) {
		if (t->want[q] == 0 || t->held_by[q] != 0)
			continue;
		/* While its reserve has plenty it gives whole tokens and
		 * the part is spent here: only from its first dry answer to
		 * an interval after the last. */
		if (now >= atomic_load(&t->dry_until[q]) + interval)
			continue;
		allot__bucket *b = &t->a->quotas[q].bucket;
		allot__allowance al;
		allot__bucket_get(b, &al);
		if (al.mode != ALLOT__MODE_LIMIT || !(al.rate > 0))
			continue;
		double h = fmin(allot__bucket_level(b, now),
		    nextafter((double) t->min[q], 0));
		if (!(h > 0))
			continue;
		bucket_move(t, q, -h, now);
		t->held[q] = h;
		t->held_by[q] = flight;
		t->nheld++;
	}
}

/* Whether quota `q`'s part `held` is offered to the reserve
 * (AskKey.pool): only when its own bucket would take longer to complete
 * a token from it than the reserve said it needs to hold one again
 * (dry_until). A bucket that refills sooner spends its part itself, and
 * its next request finds the token here instead of waiting on the
 * reserve. */
static bool
pool_worth(const allot__tail *t, uint32_t q, double held, uint64_t now)
{
	allot__allowance al;
	allot__bucket_get(&t->a->quotas[q].bucket, &al);
	uint64_t dry = atomic_load(&t->dry_until[q]);
	double wait_s = dry > now ? (double) (dry - now) / 1e9 : 0;
	return !(al.rate > 0) ||
	    ((double) t->min[q] - held) / al.rate > wait_s;
}

/* What becomes of the parts a flight held (t->held) when it lands:
 * answered, they count with its Grant, less what the reserve kept
 * (GrantKey.kept); never sent, they go back into the buckets; maybe
 * served but the answer lost, they are gone, since the reserve may have
 * kept them (AskKey.pool) and a part is lost rather than counted
 * twice. */
typedef enum held_fate { HELD_GOT, HELD_BACK, HELD_GONE } held_fate;

/* Flight `flight` (1 + its index) landed: what it held meets `fate`. */
static void
held_release(allot__tail *t, uint8_t flight, held_fate fate, uint64_t now)
{
	/* Every slot: a config swap may have dropped the quota since. */
	uint32_t nq = atomic_load(&t->a->nquotas);
	for (uint32_t q = 0; t->nheld > 0 && q < t->a->quota_cap; q++) {
		if (t->held_by[q] != flight)
			continue;
		if (fate == HELD_GOT && q < nq)
			t->got[q] += t->held[q];
		else if (fate == HELD_BACK || fate == HELD_GOT)
			bucket_move(t, q, t->held[q], now);
		t->held[q] = 0;
		t->held_by[q] = 0;
		t->nheld--;
	}
}

/* The pending waiters that can be asked for into flight `fl` (with
 * their sums per quota in t->want and t->min), the others decided on
 * their local bucket now: nothing would change by their deadline. The
 * number of quotas asked for and the latest deadline. */
static size_t
board(allot__tail *t, const allot__syncc *c, allot__flight *fl, uint64_t now,
    uint64_t *ret_last)
{
	size_t nkeys = 0;
	uint64_t last = now;
	allot__waiter *w = t->pending;
	t->pending = NULL;
	t->pending_end = &t->pending;
	while (w != NULL) {
		allot__waiter *next = w->next;
		w->next = NULL;
		if (!askable(t, c, w, now)) {
			complete(t, w, false, now);
		} else {
			if (t->want[w->quota] == 0) {
				nkeys++;
				t->min[w->quota] = w->cost;
			}
			t->want[w->quota] += w->cost;
			if (w->cost < t->min[w->quota])
				t->min[w->quota] = w->cost;
			if (w->deadline_ns > last)
				last = w->deadline_ns;
			*fl->end = w;
			fl->end = &w->next;
		}
		w = next;
	}
	*ret_last = last;
	held_take(t, (uint8_t) (1 + (fl - t->fl)), now);
	return nkeys;
}

/* The Ask for what t->want and t->min hold, packed (malloc). */
static int
pack_ask(allot__tail *t, allot__syncc *c, uint32_t f, size_t nkeys,
    uint64_t now, void **ret_buf, size_t *ret_len)
{
	uint32_t nq = atomic_load(&t->a->nquotas);
	Allot__V1__AskKey *ks = calloc(nkeys, sizeof *ks);
	Allot__V1__AskKey **kp = calloc(nkeys, sizeof *kp);
	int rc = ALLOT_ENOMEM;
	if (ks == NULL || kp == NULL)
		goto out;
	size_t j = 0;
	for (uint32_t q = 0; q < nq && j < nkeys; q++) {
		if (t->want[q] == 0)
			continue;
		allot__v1__ask_key__init(&ks[j]);
		ks[j].key = q;
		ks[j].tokens = t->want[q];
		ks[j].min = t->min[q];
		ks[j].held = t->held_by[q] == 1 + f ? t->held[q] : 0;
		ks[j].pool = ks[j].held > 0 && !t->no_pool &&
		    pool_worth(t, q, ks[j].held, now);
		/* What the bucket gave up goes with the Ask (and is lost
		 * with it: never reported twice). */
		ks[j].returned = c->q[q].returned;
		c->q[q].returned = 0;
		kp[j] = &ks[j];
		j++;
	}
	Allot__V1__Ask ask = ALLOT__V1__ASK__INIT;
	ask.session = c->session;
	ask.applied_seq = c->applied_seq;
	ask.n_keys = j;
	ask.keys = kp;
	Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
	env.version = ALLOT__PROTOCOL_VERSION;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_ASK;
	env.ask = &ask;
	size_t len = allot__v1__envelope__get_packed_size(&env);
	uint8_t *buf = malloc(len > 0 ? len : 1);
	if (buf == NULL)
		goto out;
	allot__v1__envelope__pack(&env, buf);
	*ret_buf = buf;
	*ret_len = len;
	rc = ALLOT_OK;
out:
	for (uint32_t q = 0; q < nq; q++)
		t->want[q] = t->min[q] = 0;
	free(ks);
	free(kp);
	return rc;
}

int
allot__tail_request(allot__tail *t, allot__syncc *c, uint64_t now,
    void **ret_buf, size_t *ret_len, uint32_t *ret_timeout_ms,
    uint32_t *ret_flight, uint64_t *ret_at_ns)
{
	collect(t);
	*ret_at_ns = UINT64_MAX;
	if (t->pending == NULL)
		return ALLOT_ENOENT;
	uint32_t f = free_flight(t, now, ret_at_ns);
	if (f == ALLOT__TAIL_FLIGHTS)
		return ALLOT_EBUSY;
	allot__flight *fl = &t->fl[f];
	uint64_t last;
	size_t nkeys = board(t, c, fl, now, &last);
	if (nkeys == 0)
		return ALLOT_ENOENT;
	int rc = pack_ask(t, c, f, nkeys, now, ret_buf, ret_len);
	if (rc != ALLOT_OK) {
		held_release(t, (uint8_t) (1 + f), HELD_BACK, now);
		complete_all(t, fl->head, now);
		*fl = (allot__flight) { .end = &fl->head };
		return rc;
	}
	/* Until the last deadline, but once the round trips so far say
	 * the answer is lost, no longer than four of them: the waiters go
	 * back to be asked for again (allot__tail_lost()). */
	uint64_t span_ms = (last - now) / 1000000u + 1;
	uint64_t lost_ms = t->rtt_ns * 4 / 1000000u + 1;
	if (t->rtt_ns > 0 && lost_ms < span_ms)
		span_ms = lost_ms;
	uint32_t to = allot__exchange_timeout_ms(t->a->opts.sync_interval_ms);
	*ret_timeout_ms = span_ms < ASK_TIMEOUT_MIN_MS ? ASK_TIMEOUT_MIN_MS :
	    span_ms > to                               ? to :
	                                                 (uint32_t) span_ms;
	*ret_flight = f;
	fl->busy = true;
	fl->sent_ns = now;
	fl->session = c->session;
	t->last_sent_ns = now;
	return ALLOT_OK;
}

/* Complete flight `fl`: each waiter from its quota's grant (with the
 * part its bucket held, whole tokens), oldest first, as long as what
 * is left covers its cost (a costly request at the head does not hold
 * back cheaper ones behind it); what is left goes into the local
 * bucket, on which the others are decided then. `got` is all zero on a
 * failure. */
static void
settle_flight(allot__tail *t, allot__flight *fl, held_fate fate, uint64_t now)
{
	held_release(t, (uint8_t) (1 + (fl - t->fl)), fate, now);
	uint32_t nq = atomic_load(&t->a->nquotas);
	for (uint32_t q = 0; q < nq; q++) {
		/* The part and the held part make whole tokens, up to the
		 * rounding of their sum. */
		double whole = round(t->got[q]);
		if (fabs(t->got[q] - whole) < 1e-6)
			t->got[q] = whole;
	}
	allot__waiter *w = fl->head, *rest = NULL, **rest_end = &rest;
	*fl = (allot__flight) { .end = &fl->head };
	while (w != NULL) {
		allot__waiter *next = w->next;
		double *got = &t->got[w->quota];
		if (*got >= (double) w->cost) {
			*got -= (double) w->cost;
			complete(t, w, true, now);
		} else {
			w->next = NULL;
			*rest_end = w;
			rest_end = &w->next;
		}
		w = next;
	}
	for (uint32_t q = 0; q < nq; q++) {
		if (t->got[q] > 0)
			bucket_move(t, q, t->got[q], now);
		t->got[q] = 0;
	}
	for (w = rest; w != NULL;) {
		allot__waiter *next = w->next;
		atomic_fetch_add(&t->short_, 1);
		complete(t, w, false, now);
		w = next;
	}
}

void
allot__tail_reply(allot__tail *t, allot__syncc *c, uint32_t f, uint64_t now,
    const void *buf, size_t len)
{
	if (f >= ALLOT__TAIL_FLIGHTS || !t->fl[f].busy)
		return;
	allot__flight *fl = &t->fl[f];
	uint64_t rtt = now > fl->sent_ns ? now - fl->sent_ns : 0;
	t->lost_streak = 0;
	t->rtt_ns = t->rtt_ns == 0 ? rtt : (7 * t->rtt_ns + rtt) / 8;
	Allot__V1__Envelope *env = allot__v1__envelope__unpack(
	    NULL, len, (const uint8_t *) buf);
	uint32_t nq = atomic_load(&t->a->nquotas);
	if (env != NULL && env->version == ALLOT__PROTOCOL_VERSION &&
	    env->body_case == ALLOT__V1__ENVELOPE__BODY_GRANT &&
	    env->grant->epoch >= c->epoch_seen) {
		const Allot__V1__Grant *g = env->grant;
		atomic_fetch_add(&t->asks, 1);
		for (size_t i = 0; i < g->n_keys; i++) {
			const Allot__V1__GrantKey *k = g->keys[i];
			if (k->key >= nq ||
			    (double) k->tokens > ALLOT__BURST_MAX ||
			    !(k->part >= 0 && k->part < 1))
				continue;
			/* The part it held that the reserve kept (pooled):
			 * what the flight held at most. */
			double held = t->held_by[k->key] == 1 + f ?
			    t->held[k->key] :
			    0;
			double kept = k->kept > 0 ? fmin(k->kept, held) : 0;
			t->got[k->key] += (double) k->tokens + k->part - kept;
			atomic_fetch_add(&t->tokens, k->tokens);
			if (k->dry_us > 0) {
				atomic_store(&t->dry_until[k->key],
				    now + (uint64_t) k->dry_us * 1000u);
				atomic_store(&t->dry_left[k->key], k->left);
			}
		}
	} else if (env != NULL && env->version == ALLOT__PROTOCOL_VERSION &&
	    env->body_case == ALLOT__V1__ENVELOPE__BODY_ERROR &&
	    env->error->code != ALLOT__V1__ERROR__CODE__MALFORMED &&
	    env->error->code != ALLOT__V1__ERROR__CODE__RATE_LIMITED &&
	    fl->session == c->session) {
		/* No leader here, or no session: nobody serves the reserve
		 * until the session is back (a failover, a restart). Ask no
		 * more for an interval; the waiters go on the standby. */
		uint64_t quiet = (uint64_t) t->a->opts.sync_interval_ms *
		    1000000u;
		atomic_store(&t->quiet_until, now + quiet);
	} else if (env != NULL && env->version == ALLOT__PROTOCOL_VERSION &&
	    env->body_case == ALLOT__V1__ENVELOPE__BODY_ERROR &&
	    env->error->code == ALLOT__V1__ERROR__CODE__MALFORMED) {
		/* An allotd from before the tail path: decide locally for
		 * the rest of this session. */
		t->unsupported = true;
		t->unsupported_session = c->session;
		allot__tail_publish(t, c);
	}
	if (env != NULL)
		allot__v1__envelope__free_unpacked(env, NULL);
	settle_flight(t, fl, HELD_GOT, now);
}

void
allot__tail_failed(allot__tail *t, uint32_t f, bool sent, uint64_t now)
{
	if (f < ALLOT__TAIL_FLIGHTS && t->fl[f].busy)
		settle_flight(t, &t->fl[f], sent ? HELD_GONE : HELD_BACK, now);
}

void
allot__tail_lost(allot__tail *t, uint32_t f, uint64_t now)
{
	if (f >= ALLOT__TAIL_FLIGHTS || !t->fl[f].busy)
		return;
	allot__flight *fl = &t->fl[f];
	atomic_fetch_add(&t->lost, 1);
	if (++t->lost_streak >= ALLOT__TAIL_LOST_QUIET) {
		uint64_t quiet = (uint64_t) t->a->opts.sync_interval_ms *
		    1000000u;
		atomic_store(&t->quiet_until, now + quiet);
		settle_flight(t, fl, HELD_GONE, now);
		return;
	}
	held_release(t, (uint8_t) (1 + f), HELD_GONE, now);
	if (fl->head == NULL) {
		*fl = (allot__flight) { .end = &fl->head };
		return;
	}
	/* Ahead of everything pending: they came first. */
	*fl->end = t->pending;
	if (t->pending == NULL)
		t->pending_end = fl->end;
	t->pending = fl->head;
	*fl = (allot__flight) { .end = &fl->head };
}

uint64_t
allot__tail_expire(allot__tail *t, uint64_t now)
{
	collect(t);
	uint64_t next = UINT64_MAX;
	allot__waiter **lists[1 + ALLOT__TAIL_FLIGHTS] = { &t->pending };
	allot__waiter ***ends[1 + ALLOT__TAIL_FLIGHTS] = { &t->pending_end };
	for (uint32_t f = 0; f < ALLOT__TAIL_FLIGHTS; f++) {
		lists[1 + f] = &t->fl[f].head;
		ends[1 + f] = &t->fl[f].end;
	}
	for (uint32_t i = 0; i < 1 + ALLOT__TAIL_FLIGHTS; i++) {
		allot__waiter **pp = lists[i];
		while (*pp != NULL) {
			allot__waiter *w = *pp;
			if (w->deadline_ns > now) {
				if (w->deadline_ns < next)
					next = w->deadline_ns;
				pp = &w->next;
				continue;
			}
			*pp = w->next;
			atomic_fetch_add(&t->late, 1);
			complete(t, w, false, now);
		}
		*ends[i] = pp;
	}
	return next;
}

void
allot__tail_stats(allot__tail *t, allot_sync_stats *ret)
{
	ret->central_asks = atomic_load(&t->asks);
	ret->central_allowed = atomic_load(&t->allowed);
	ret->central_denied = atomic_load(&t->denied);
	ret->central_tokens = atomic_load(&t->tokens);
	ret->central_wait_ns = atomic_load(&t->wait_ns);
	ret->central_wait_max_ns = atomic_load(&t->wait_max_ns);
	ret->central_late = atomic_load(&t->late);
	ret->central_short = atomic_load(&t->short_);
	ret->central_dry = atomic_load(&t->dry);
	ret->central_lost = atomic_load(&t->lost);
	ret->central_standby = atomic_load(&t->standby);
}
