/* SPDX-License-Identifier: MIT */
/*
 * Who was throttled: the denial log (agent_int.h, allot__denylog()).
 * Once a second the sync thread looks at every key's counters (as
 * allot_stats() does: loads only, the hot path never waits), takes the
 * denials since its last look, and logs the keys that denied the most,
 * one line each: the caller (an identity the quota file does not name
 * too, so that an unregistered noisy caller has a name), the endpoint
 * class, the quota charged, requests and tokens denied, and the wait
 * the bucket gives one more request now. At most ALLOT__DENYLOG_LINES
 * lines and one for the rest: the log is bounded whatever the traffic.
 * Nothing is allocated: the few lines are kept on the stack.
 */
#include "agent_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct hit {
	uint64_t denied, tokens;
	char identity[ALLOT_IDENTITY_MAX + 1]; /* "" for none */
	char endpoint[64];
	char quota[2 * ALLOT_IDENTITY_MAX + 2];
	bool known;
	double retry_ms; /* one more request, at the rate in force */
} hit;

typedef struct tally {
	hit top[ALLOT__DENYLOG_LINES]; /* the most denied, first */
	size_t n;
	uint64_t rest_keys, rest_denied, rest_tokens;
} tally;

/* The denials of `k` since the last look; the look moves on. */
static uint64_t
since_last(allot_agent *a, const allot_key *k, uint64_t *ret_tokens)
{
	uint32_t gen = atomic_load_explicit(&k->gen, memory_order_acquire);
	allot__ktotals t;
	uint64_t d;

	allot__key_totals(a, k, &t);
	allot__look_since(&allot__kc(a, k)->logged, gen, t.denied,
	    t.denied_tokens, &d, ret_tokens);
	return d;
}

static void
describe(
    allot_agent *a, const allot_key *k, uint64_t d, uint64_t tokens, hit *h)
{
	allot__qrt *q = atomic_load_explicit(&k->quota, memory_order_relaxed);
	allot__allowance al;

	h->denied = d;
	h->tokens = tokens;
	snprintf(h->identity, sizeof h->identity, "%s",
	    k->identity != NULL ? k->identity : "");
	snprintf(
	    h->endpoint, sizeof h->endpoint, "%s", a->class_names[k->cls]);
	snprintf(h->quota, sizeof h->quota, "%s", q->name);
	h->known = atomic_load_explicit(&k->known, memory_order_relaxed);
	/* The key's own bucket: a value's (values.h), or its quota's. */
	allot__bucket_get(
	    atomic_load_explicit(&k->bucket, memory_order_relaxed), &al);
	uint32_t w = atomic_load_explicit(&k->weight, memory_order_relaxed);
	h->retry_ms = al.mode == ALLOT__MODE_LIMIT && al.rate > 0 ?
	    ceil((double) (w > 0 ? w : 1) / al.rate * 1e3) :
	    -1;
}

/* One key into the tally: among the top, or counted in the rest. */
static void
consider(allot_agent *a, const allot_key *k, tally *t)
{
	uint64_t tokens, d = since_last(a, k, &tokens);
	size_t at;

	if (d == 0)
		return;
	for (at = t->n; at > 0 && t->top[at - 1].denied < d; at--)
		;
	if (at == ALLOT__DENYLOG_LINES) {
		t->rest_keys++;
		t->rest_denied += d;
		t->rest_tokens += tokens;
		return;
	}
	if (t->n == ALLOT__DENYLOG_LINES) {
		const hit *out = &t->top[ALLOT__DENYLOG_LINES - 1];
		t->rest_keys++;
		t->rest_denied += out->denied;
		t->rest_tokens += out->tokens;
		t->n--;
	}
	memmove(&t->top[at + 1], &t->top[at], (t->n - at) * sizeof t->top[0]);
	describe(a, k, d, tokens, &t->top[at]);
	t->n++;
}

static void
emit(allot_agent *a, const tally *t, double span_s)
{
	for (size_t i = 0; i < t->n; i++) {
		const hit *h = &t->top[i];
		char retry[48] = "";

		if (h->retry_ms >= 0)
			snprintf(retry, sizeof retry, "; retry after %.0f ms",
			    h->retry_ms);
		allot__log(&a->log, ALLOT_LOG_INFO, "ALLOT-DENIED",
		    "caller %s%s, endpoint %s, quota %s: %" PRIu64
		    " requests (%" PRIu64 " tokens) denied in %.1f s%s",
		    h->identity[0] != '\0' ? h->identity : "(none)",
		    h->identity[0] != '\0' && !h->known ?
		        " (not in the quota file)" :
		        "",
		    h->endpoint[0] != '\0' ? h->endpoint : "(default)",
		    h->quota, h->denied, h->tokens, span_s, retry);
	}
	if (t->rest_keys > 0)
		allot__log(&a->log, ALLOT_LOG_INFO, "ALLOT-DENIED",
		    "and %" PRIu64 " more keys: %" PRIu64 " requests (%" PRIu64
		    " tokens) denied in %.1f s",
		    t->rest_keys, t->rest_denied, t->rest_tokens, span_s);
}

void
allot__denylog(allot_agent *a, uint64_t span_ns)
{
	tally t;

	if (a->log.fn == NULL || a->log.level < ALLOT_LOG_INFO)
		return;
	memset(&t, 0, sizeof t);
	size_t ng = atomic_load_explicit(&a->ngroups, memory_order_acquire);
	uint32_t nep = atomic_load_explicit(&a->nep, memory_order_acquire);
	for (uint32_t i = 0; i <= nep; i++) {
		uint32_t c = allot__class_at(a, i, nep);
		for (size_t g = 0; g < ng; g++)
			consider(a, allot__known_key(a, (uint32_t) g, c), &t);
		consider(a, &a->anon_keys[c], &t);
		consider(a, &a->overflow_keys[c], &t);
	}
	/* The unknown identities' keys: their names stay theirs while the
	 * lock is held (a key is recycled under it). */
	pthread_mutex_lock(&a->dyn_lock);
	for (uint32_t i = 0; i < a->dyn_cap; i++)
		if (allot__kc(a, &a->dyn_keys[i])->slot != UINT32_MAX)
			consider(a, &a->dyn_keys[i], &t);
	pthread_mutex_unlock(&a->dyn_lock);
	emit(a, &t, (double) span_ns / 1e9);
}
