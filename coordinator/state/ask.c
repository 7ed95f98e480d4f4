/* SPDX-License-Identifier: MIT */
/*
 * The Ask request (docs/protocol.md), the tail path's one round trip:
 * requests an agent could not admit from its local buckets, batched per
 * key, served from each quota's central reserve (central.c). Tokens
 * granted to a session are added to what its next reports may claim as
 * consumed (skey.central), so the plausibility bound of sync.c never
 * clips what the reserve handed out. Validates what it can before
 * locking, works in memory under the lock, counts after unlocking.
 */
#include "registry_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>

/* What the reserve may keep of the part an asker's bucket holds
 * (AskKey.pool): tokens it did not spend, so never more than it could
 * have spent, its reports' plausible consumption and what the reserve
 * served it (sync.c, plausible(); before its first report, the burst).
 * Under the lock. */
static double
poolable(const allot__state *st, const skey *key)
{
	double credit = key->credit_ns != 0 ? fmax(0, key->credit) :
	                                      st->cur->burst[key->q];
	return credit + fmax(0, key->central);
}

/* `kept` of it pooled: it may report that much less, the reserve's
 * tokens first. Under the lock. */
static void
pooled(skey *key, double kept)
{
	if (!(kept > 0))
		return;
	double from_central = fmin(fmax(0, key->central), kept);
	key->central -= from_central;
	key->credit -= kept - from_central;
}

Allot__V1__Error__Code
allot__state_ask_on(allot__state *st, const Allot__V1__Ask *req, uint32_t pipe,
    ProtobufCAllocator *pa, Allot__V1__Grant *ret, char *err, size_t errlen)
{
	Allot__V1__GrantKey **keys = NULL;
	Allot__V1__GrantKey *gk = NULL;
	if (req->n_keys > 0) {
		keys = pa->alloc(
		    pa->allocator_data, req->n_keys * sizeof *keys);
		gk = pa->alloc(pa->allocator_data, req->n_keys * sizeof *gk);
		if (keys == NULL || gk == NULL) {
			snprintf(err, errlen, "out of memory");
			return ALLOT__V1__ERROR__CODE__MALFORMED;
		}
	}
	for (size_t i = 0; i < req->n_keys; i++) {
		const Allot__V1__AskKey *k = req->keys[i];
		if (k->min == 0 || k->min > k->tokens ||
		    (double) k->tokens > ALLOT__BURST_MAX ||
		    (double) k->returned > ALLOT__BURST_MAX ||
		    !(k->held >= 0 && k->held < (double) k->min)) {
			snprintf(err, errlen,
			    "Ask key %" PRIu32 " asks for %" PRIu64
			    " tokens, at least %" PRIu64 ", returns %" PRIu64
			    ", holds %g: expected 1 <= min <= tokens <= %g, "
			    "returned <= %g and 0 <= held < min",
			    k->key, k->tokens, k->min, k->returned, k->held,
			    ALLOT__BURST_MAX, ALLOT__BURST_MAX);
			allot__metrics_reject(
			    st->o.metrics, ALLOT__REJ_MALFORMED, 1);
			return ALLOT__V1__ERROR__CODE__MALFORMED;
		}
	}
	uint64_t granted = 0, refused = 0;
	pthread_mutex_lock(&st->mu);
	uint64_t now = now_ns(st);
	session *s = allot__session_find(st, req->session);
	if (s == NULL || !allot__pipe_ok(s, pipe)) {
		pthread_mutex_unlock(&st->mu);
		snprintf(err, errlen,
		    "session %" PRIu64 " is not registered on this connection",
		    req->session);
		allot__metrics_reject(
		    st->o.metrics, ALLOT__REJ_UNKNOWN_SESSION, 1);
		return ALLOT__V1__ERROR__CODE__UNKNOWN_SESSION;
	}
	s->last_seen_ns = now;
	service *svc = s->svc;
	/* It applied the Reply to its last Sync (or, 0, its Welcome, before
	 * any Sync): an acknowledgement, as its next Sync would make (the
	 * lease is still the Sync's to renew). */
	if (req->applied_seq == s->last_seq)
		allot__session_acked(st, s, now);
	size_t n = 0;
	for (size_t i = 0; i < req->n_keys; i++) {
		const Allot__V1__AskKey *k = req->keys[i];
		skey *key = session_key(s, k->key);
		/* What its bucket gave up first: the ack above made room for
		 * it in the reserve. */
		if (key != NULL && key->q >= 0 && k->returned > 0) {
			allot__central_give_back(st, svc, key, k->returned);
			allot__central_returned(st, svc, (size_t) key->q, now);
		}
		allot__central_given g = { 0 };
		/* A leader that took over serves it while it learns, too:
		 * its reserve starts empty and holds what neither the grants
		 * the agents report nor those of the replicas still to
		 * report (placeholders) hold (central.c). */
		if (key != NULL && key->q >= 0 && !s->placeholder) {
			g = allot__central_take(st, svc, (size_t) key->q,
			    (double) k->min, (double) k->tokens, k->held,
			    k->pool ? poolable(st, key) : 0, now);
			pooled(key, g.kept);
		} else
			g.dry_us = st->o.interval_ms * 250u;
		/* What its reports may claim on top of its allowance; at
		 * most B, however often it asks (a grant is spent or put in
		 * its bucket at once). */
		if (key != NULL && key->q >= 0) {
			key->central = fmin(
			    key->central + g.got, st->cur->burst[key->q]);
			allot__standby_served(key, g.got, now);
		}
		/* In whole tokens, the part its bucket held counted in. */
		granted += (uint64_t) g.whole;
		refused += k->tokens - (uint64_t) g.whole;
		gk[n] = (Allot__V1__GrantKey) ALLOT__V1__GRANT_KEY__INIT;
		gk[n].key = k->key;
		gk[n].tokens = (uint64_t) floor(g.got);
		gk[n].part = g.got - floor(g.got);
		gk[n].dry_us = g.dry_us;
		gk[n].left = g.left;
		gk[n].kept = g.kept;
		keys[n] = &gk[n];
		n++;
	}
	pthread_mutex_unlock(&st->mu);
	*ret = (Allot__V1__Grant) ALLOT__V1__GRANT__INIT;
	ret->n_keys = n;
	ret->keys = keys;
	allot__metrics *m = st->o.metrics;
	if (m != NULL) {
		allot__metrics_add(&m->asks, 1);
		allot__metrics_add(&m->ask_tokens_granted, granted);
		allot__metrics_add(&m->ask_tokens_refused, refused);
	}
	return ALLOT__V1__ERROR__CODE__UNSPECIFIED;
}
