/* SPDX-License-Identifier: MIT */
/*
 * Reserve, then reconcile (allot_settle(), docs/integrating.md, "Admit,
 * execute, settle"): the measured cost of an admitted request, as debt
 * or a refund, and the bound on refunds (issue 27): a refund never
 * exceeds what the key was charged and has not had settled.
 */
#include "agent_int.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

/* Settle one request of key `k` that cost `measured` and say how much
 * of a refund of `want` tokens it may have: none when every request the
 * key admitted is settled already; else as much as leaves it its
 * measured cost, the key's settled requests what they kept and each of
 * its other unsettled requests one token (the bucket itself never takes back
 * more than its burst). Under settle_lock: refunds and the count of
 * settlements are the only things that lower the margin, so two settlements
 * never spend the same one. */
static uint64_t
settle_one(allot_agent *a, allot_key *k, uint64_t charged, uint64_t measured)
{
	allot__kcold *kc = allot__kc(a, k);
	allot__ktotals t;
	allot__key_totals(a, k, &t);
	if (kc->settled >= t.allowed)
		return 0;
	uint64_t want = charged > measured ? charged - measured : 0;
	uint64_t keep = kc->settled_tokens + (t.allowed - kc->settled - 1) +
	    measured;
	uint64_t margin = t.spent > keep ? t.spent - keep : 0;
	uint64_t ok = want < margin ? want : margin;
	kc->settled++;
	kc->settled_tokens += (charged > measured ? charged : measured) - ok;
	return ok;
}

int
allot_settle(allot_agent *a, allot_key *k, uint32_t charged, uint32_t measured)
{
	if (a == NULL || k == NULL)
		return ALLOT_EINVAL;
	uint64_t now = allot__agent_now(a);
	allot__tblock *b = allot__thread_block(a);
	uint64_t want = charged > measured ? (uint64_t) charged - measured : 0;
	pthread_mutex_lock(&a->settle_lock);
	uint64_t ok = settle_one(a, k, charged, measured);
	const allot__qrt *q = atomic_load_explicit(
	    &k->quota, memory_order_relaxed);
	if (ok > 0) {
		allot__bucket_adjust(
		    atomic_load_explicit(&k->bucket, memory_order_relaxed),
		    -(int64_t) ok, now);
		allot__ceiling_adjust(a, q, -(int64_t) ok, now);
		/* Unsigned wrap-around subtracts a refund. */
		allot__bump(b, &b->c[k->id].spent, (uint64_t) - (int64_t) ok);
	}
	if (measured > charged) {
		uint64_t debt = (uint64_t) measured - charged;
		allot__bucket_adjust(
		    atomic_load_explicit(&k->bucket, memory_order_relaxed),
		    (int64_t) debt, now);
		allot__ceiling_adjust(a, q, (int64_t) debt, now);
		allot__bump(b, &b->c[k->id].spent, debt);
	}
	pthread_mutex_unlock(&a->settle_lock);
	/* A refund never exceeds what was charged and not yet settled
	 * (docs/integrating.md, "Admit, execute, settle"). */
	return ok == want ? ALLOT_OK : ALLOT_ERANGE;
}
