/* SPDX-License-Identifier: MIT */
/*
 * Counter snapshots: per-key totals summed over the thread blocks, per-quota
 * totals for the sync loop, and the public allot_stats() view. Readers
 * only load counters; they never stop the hot path.
 */
#include "agent_int.h"

#include <stdio.h>
#include <string.h>

/* Counter `id` (a key's, or a quota's as a stacked level) summed over
 * every thread block. */
static void
counter_totals(const allot_agent *a, uint32_t id, allot__ktotals *t)
{
	memset(t, 0, sizeof *t);
	uint32_t n = atomic_load_explicit(&a->nblocks, memory_order_acquire);
	for (uint32_t i = 0; i <= n; i++) {
		const allot__tblock *b = i < n ? a->blocks[i] :
		                                 a->shared_block;
		const allot__kcount *c = &b->c[id];
		t->allowed += atomic_load_explicit(
		    &c->allowed, memory_order_relaxed);
		t->denied += atomic_load_explicit(
		    &c->denied, memory_order_relaxed);
		t->shadow_denied += atomic_load_explicit(
		    &c->shadow_denied, memory_order_relaxed);
		t->spent += atomic_load_explicit(
		    &c->spent, memory_order_relaxed);
		t->denied_tokens += atomic_load_explicit(
		    &c->denied_tokens, memory_order_relaxed);
		t->shadow_tokens += atomic_load_explicit(
		    &c->shadow_tokens, memory_order_relaxed);
	}
}

void
allot__key_totals(const allot_agent *a, const allot_key *k, allot__ktotals *t)
{
	counter_totals(a, k->id, t);
	allot__ktotals_sub(t, &allot__kc(a, k)->base);
}

/* What key `k` counted since it started charging its quota. */
static void
since_join(allot_agent *a, const allot_key *k, allot__ktotals *ret)
{
	allot__key_totals(a, k, ret);
	const allot__ktotals *qb = &a->qbase[k->id];
	ret->allowed -= qb->allowed;
	ret->denied -= qb->denied;
	ret->shadow_denied -= qb->shadow_denied;
	ret->spent -= qb->spent;
	ret->denied_tokens -= qb->denied_tokens;
	ret->shadow_tokens -= qb->shadow_tokens;
}

/* A quota's totals: what keys that left it counted while they charged
 * it, plus what the keys charging it now counted since they joined
 * (reconfig.c), and what it counted as a stacked level. The default
 * quota also has the anonymous, overflow and unknown-identity keys, and
 * what evicted ones had counted. */
void
allot__quota_totals(allot_agent *a, const allot__qrt *q, allot__ktotals *ret)
{
	allot__ktotals t;
	/* What it counted as a stacked level: requests of keys charging
	 * other quotas first (agent_int.h, allot__stack). */
	counter_totals(a, a->level_base + q->index, ret);
	pthread_mutex_lock(&a->cfg_lock);
	if (!q->is_default)
		allot__ktotals_add(ret, &q->retired);
	for (uint32_t i = 0; i < q->nkeys; i++) {
		since_join(a, q->keys[i], &t);
		allot__ktotals_add(ret, &t);
	}
	pthread_mutex_unlock(&a->cfg_lock);
	if (!q->is_default)
		return;
	pthread_mutex_lock(&a->dyn_lock);
	allot__ktotals_add(ret, &q->retired);
	/* Free keys too: a decision that resolved an identity just before
	 * its key was recycled counts there after the recycle read it
	 * (agent.c, dyn_recycle()), until the key's next identity. */
	for (uint32_t i = 0; i < a->dyn_cap; i++) {
		allot__key_totals(a, &a->dyn_keys[i], &t);
		allot__ktotals_add(ret, &t);
	}
	pthread_mutex_unlock(&a->dyn_lock);
	uint32_t nep = atomic_load_explicit(&a->nep, memory_order_acquire);
	for (uint32_t i = 0; i <= nep; i++) {
		uint32_t j = allot__class_at(a, i, nep);
		allot__key_totals(a, &a->anon_keys[j], &t);
		allot__ktotals_add(ret, &t);
		allot__key_totals(a, &a->overflow_keys[j], &t);
		allot__ktotals_add(ret, &t);
	}
}

static void
fill_stats(allot_agent *a, const allot_key *k, const allot__ktotals *t,
    allot_key_stats *out)
{
	memset(out, 0, sizeof *out);
	snprintf(out->identity, sizeof out->identity, "%s", k->identity);
	snprintf(
	    out->endpoint, sizeof out->endpoint, "%s", a->class_names[k->cls]);
	allot__qrt *q = atomic_load_explicit(&k->quota, memory_order_relaxed);
	/* The key's own bucket: a value's (values.h), or its quota's. */
	allot__bucket *b = atomic_load_explicit(
	    &k->bucket, memory_order_relaxed);
	out->quota = q->name;
	out->known = atomic_load_explicit(&k->known, memory_order_relaxed);
	out->shadow = atomic_load(&b->shadow);
	out->allowed = t->allowed;
	out->denied = t->denied;
	out->shadow_denied = t->shadow_denied;
	out->tokens_spent = t->spent;
	out->tokens_denied = t->denied_tokens;
	out->tokens_shadow = t->shadow_tokens;
	allot__allowance al;
	allot__bucket_get(b, &al);
	out->rate = al.mode == ALLOT__MODE_CLOSED ? 0.0 : al.rate;
	out->limit = al.burst;
	double level = allot__bucket_level(b, allot__agent_now(a));
	double u = al.burst > 0 ? 1.0 - level / al.burst : 0.0;
	out->utilization = u < 0 ? 0 : u;
	allot__sync_key_state(a, q->index, out);
}

/* Key `k`'s statistics into the caller's struct of `size` bytes: the
 * fields it knows (allot.h, "Structs that grow"). */
static void
stats_out(allot_agent *a, const allot_key *k, const allot__ktotals *t,
    void *out, size_t size)
{
	allot_key_stats ks;
	fill_stats(a, k, t, &ks);
	memcpy(out, &ks, size < sizeof ks ? size : sizeof ks);
}

int
allot_key_stats_get_sized(
    allot_agent *a, const allot_key *k, allot_key_stats *ret, size_t size)
{
	if (a == NULL || k == NULL || ret == NULL)
		return ALLOT_EINVAL;
	allot__ktotals t;
	allot__key_totals(a, k, &t);
	stats_out(a, k, &t, ret, size);
	return ALLOT_OK;
}

/* Programs built before the _sized calls: the struct of this release. */
int(allot_key_stats_get)(
    allot_agent *a, const allot_key *k, allot_key_stats *ret)
{
	return allot_key_stats_get_sized(a, k, ret, sizeof *ret);
}

/* Visit one key: count it if active, copy it if there is room (the
 * caller's array has a stride of `size`). */
static void
visit(allot_agent *a, const allot_key *k, allot_key_stats *out, size_t cap,
    size_t size, size_t *n)
{
	allot__ktotals t;
	allot__key_totals(a, k, &t);
	if (t.allowed + t.denied + t.shadow_denied == 0)
		return;
	if (*n < cap)
		stats_out(a, k, &t, (char *) out + *n * size, size);
	(*n)++;
}

int(allot_stats)(
    allot_agent *a, allot_key_stats *out, size_t cap, size_t *ret_n)
{
	return allot_stats_sized(a, out, cap, sizeof *out, ret_n);
}

int
allot_stats_sized(allot_agent *a, allot_key_stats *out, size_t cap,
    size_t size, size_t *ret_n)
{
	if (a == NULL || ret_n == NULL || (out == NULL && cap > 0) ||
	    size == 0)
		return ALLOT_EINVAL;
	size_t n = 0;
	size_t ng = atomic_load_explicit(&a->ngroups, memory_order_acquire);
	uint32_t nep = atomic_load_explicit(&a->nep, memory_order_acquire);
	for (uint32_t i = 0; i <= nep; i++)
		for (size_t g = 0; g < ng; g++)
			visit(a,
			    allot__known_key(
			        a, (uint32_t) g, allot__class_at(a, i, nep)),
			    out, cap, size, &n);
	for (uint32_t i = 0; i <= nep; i++) {
		uint32_t j = allot__class_at(a, i, nep);
		visit(a, &a->anon_keys[j], out, cap, size, &n);
		visit(a, &a->overflow_keys[j], out, cap, size, &n);
	}
	pthread_mutex_lock(&a->dyn_lock);
	for (uint32_t i = 0; i < a->dyn_cap; i++)
		if (allot__kc(a, &a->dyn_keys[i])->slot != UINT32_MAX)
			visit(a, &a->dyn_keys[i], out, cap, size, &n);
	pthread_mutex_unlock(&a->dyn_lock);
	*ret_n = n;
	return ALLOT_OK;
}
