/* SPDX-License-Identifier: MIT */
/*
 * The strangers (agent_int.h, allot__strangers_take()): callers the
 * quota file does not name all charge the default quota, so allotd and
 * its audit see them as "default" only. About once a second the sync
 * thread looks at the keys of the unknown-identity pool (under
 * dyn_lock, as the denial log does: the hot path never waits), takes
 * each one's requests admitted and denied since its last look, and
 * keeps the ALLOT__STRANGERS_MAX that asked the most, the most denied
 * first. The next Sync carries their names (Sync.strangers), and allotd
 * names them in the audit (docs/operations.md, "Who was throttled").
 * Sampled, bounded, allocation-free.
 */
#include "agent_int.h"

#include <stdio.h>
#include <string.h>

#include "allot.pb-c.h"

/* Requests `k` admitted and denied since the last look; the look moves
 * on (a recycled key, a new identity, counts from 0). */
static void
since_named(allot_agent *a, const allot_key *k, uint64_t *ret_admitted,
    uint64_t *ret_denied)
{
	uint32_t gen = atomic_load_explicit(&k->gen, memory_order_acquire);
	allot__ktotals t;

	allot__key_totals(a, k, &t);
	allot__look_since(&allot__kc(a, k)->named, gen, t.allowed, t.denied,
	    ret_admitted, ret_denied);
}

/* Whether (denied, admitted) asked more than `s`: more denied, then
 * more admitted. */
static bool
more(uint64_t denied, uint64_t admitted, const allot__stranger *s)
{
	return denied != s->denied ? denied > s->denied :
	                             admitted > s->admitted;
}

size_t
allot__strangers_take(allot_agent *a, allot__stranger *out)
{
	size_t n = 0;
	pthread_mutex_lock(&a->dyn_lock);
	for (uint32_t i = 0; i < a->dyn_cap; i++) {
		const allot_key *k = &a->dyn_keys[i];
		if (allot__kc(a, k)->slot == UINT32_MAX || k->identity == NULL)
			continue;
		uint64_t admitted, denied;
		since_named(a, k, &admitted, &denied);
		if (admitted == 0 && denied == 0)
			continue;
		size_t at = n;
		while (at > 0 && more(denied, admitted, &out[at - 1]))
			at--;
		if (at >= ALLOT__STRANGERS_MAX)
			continue;
		if (n < ALLOT__STRANGERS_MAX)
			n++;
		memmove(&out[at + 1], &out[at], (n - 1 - at) * sizeof *out);
		allot__stranger *s = &out[at];
		snprintf(s->identity, sizeof s->identity, "%s", k->identity);
		snprintf(s->endpoint, sizeof s->endpoint, "%s",
		    a->class_names[k->cls]);
		s->admitted = admitted;
		s->denied = denied;
	}
	pthread_mutex_unlock(&a->dyn_lock);
	return n;
}

size_t
allot__strangers_wire(const allot__stranger *v, size_t n,
    Allot__V1__Stranger *msgs, Allot__V1__Stranger **ptrs)
{
	for (size_t i = 0; i < n; i++) {
		allot__v1__stranger__init(&msgs[i]);
		msgs[i].identity = (char *) v[i].identity;
		msgs[i].endpoint = (char *) v[i].endpoint;
		msgs[i].admitted = v[i].admitted;
		msgs[i].denied = v[i].denied;
		ptrs[i] = &msgs[i];
	}
	return n;
}
