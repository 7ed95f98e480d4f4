/* SPDX-License-Identifier: MIT */
/*
 * Per-value buckets (values.h): a bucket per value of the default
 * quota, shared by the value's pool keys (one per endpoint class it
 * calls), reported to the coordinator and split by it across the
 * replicas a value is active on.
 */
#include "values.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "allot.pb-c.h"

#define NONE UINT32_MAX

static allot__qrt *
def_quota(allot_agent *a)
{
	return &a->quotas[a->default_quota];
}

static uint32_t
vb_index(const allot_agent *a, const allot__vbucket *vb)
{
	return (uint32_t) (vb - a->vals);
}

/* The value bucket key `k` charges, or NULL: the shared default. */
static allot__vbucket *
vb_of(allot_agent *a, const allot_key *k)
{
	allot__bucket *b = atomic_load_explicit(
	    &k->bucket, memory_order_relaxed);
	if (a->vals == NULL || b == &def_quota(a)->bucket)
		return NULL;
	return (allot__vbucket *) (void *) b;
}

/* What value bucket `vb` runs on: the default quota's rate and burst
 * (its static ones, as the last reconfig left them: shared: false has
 * no ceiling to cut them), or the
 * coordinator's part of them while the value is active on several
 * replicas; a burst never below the heaviest endpoint (as any bucket's,
 * allot__quota_set()), and a closed or unlimited default's fixed mode. */
static void
vb_allowance(allot_agent *a, const allot__vbucket *vb, allot__allowance *al)
{
	allot__qrt *q = def_quota(a);
	double r = a->val_rate, b = a->val_burst;
	if (vb->replicas > 1) {
		r = fmin(r, vb->share_rate);
		b = fmin(b, vb->share_burst);
	}
	double w = (double) atomic_load_explicit(
	    &q->wmax, memory_order_relaxed);
	*al = (allot__allowance) {
		.rate = r > 0 ? r : 1e-6,
		.burst = b > w ? b : w,
		.mode = ALLOT__MODE_LIMIT,
	};
	allot__quota_fix(q, al);
}

static void
vb_install(allot_agent *a, allot__vbucket *vb, uint64_t now)
{
	allot__allowance al;
	vb_allowance(a, vb, &al);
	allot__bucket_set(&vb->bucket, &al, now);
	bool shadow = a->val_shadow;
	if (atomic_load_explicit(&vb->bucket.shadow, memory_order_relaxed) !=
	    shadow)
		atomic_store_explicit(
		    &vb->bucket.shadow, shadow, memory_order_relaxed);
}

int
allot__values_reserve(allot_agent *a, const allot_config *cfg)
{
	if (a->vals != NULL || cfg->def.shared || a->dyn_cap == 0)
		return ALLOT_OK;
	allot__vbucket *v = allot__zalloc((size_t) a->dyn_cap * sizeof *v);
	if (v == NULL)
		return ALLOT_ENOMEM;
	if (allot__idmap_init(&a->val_index, a->dyn_cap) != ALLOT_OK) {
		allot__idmap_fini(&a->val_index);
		allot__zfree(v);
		return ALLOT_ENOMEM;
	}
	/* Initialised once, before any key can point at one: reused
	 * buckets are refilled, never initialised again under a racing
	 * decision (a stale one takes from the next value, once). */
	allot__allowance al = { .rate = 1, .burst = 1 };
	for (uint32_t i = 0; i < a->dyn_cap; i++) {
		allot__bucket_init(&v[i].bucket, &al);
		v[i].next_free = i + 1 < a->dyn_cap ? i + 1 : NONE;
	}
	pthread_mutex_lock(&a->dyn_lock);
	a->vals = v;
	a->val_free = 0;
	pthread_mutex_unlock(&a->dyn_lock);
	return ALLOT_OK;
}

void
allot__values_fini(allot_agent *a)
{
	if (a->vals == NULL)
		return;
	allot__idmap_fini(&a->val_index);
	allot__zfree(a->vals);
	a->vals = NULL;
}

static allot__vbucket *
vb_find(allot_agent *a, const char *value, uint64_t h)
{
	uint32_t pos = allot__idmap_start(&a->val_index, h), v;
	while ((v = allot__idmap_next(&a->val_index, h, &pos)) !=
	    ALLOT__IDMAP_NONE)
		if (strcmp(a->vals[v].value, value) == 0)
			return &a->vals[v];
	return NULL;
}

void
allot__value_attach(allot_agent *a, allot_key *k)
{
	if (!a->per_value || a->vals == NULL || vb_of(a, k) != NULL)
		return;
	size_t len = strlen(k->identity);
	uint64_t h = allot__hash(k->identity, len, a->seed);
	allot__vbucket *vb = vb_find(a, k->identity, h);
	if (vb == NULL) {
		/* At most one value per pool key: never short. */
		if (a->val_free == NONE)
			return;
		vb = &a->vals[a->val_free];
		a->val_free = vb->next_free;
		memcpy(vb->value, k->identity, len + 1);
		vb->hash = h;
		vb->replicas = 0;
		vb->admitted = vb->denied = 0;
		uint64_t now = allot__agent_now(a);
		vb_install(a, vb, now);
		/* A new value starts full, as a bucket of its own would (a
		 * refund never lifts a bucket above its burst). */
		allot__allowance al;
		allot__bucket_get(&vb->bucket, &al);
		double level = allot__bucket_level(&vb->bucket, now);
		double lift = al.burst + (level < 0 ? -level : 0) + 1;
		allot__bucket_adjust(&vb->bucket, -(int64_t) ceil(lift), now);
		allot__idmap_add(&a->val_index, h, vb_index(a, vb));
		atomic_fetch_add_explicit(&a->nvals, 1, memory_order_relaxed);
	}
	vb->refs++;
	atomic_store_explicit(&k->bucket, &vb->bucket, memory_order_relaxed);
}

void
allot__value_detach(allot_agent *a, allot_key *k)
{
	allot__vbucket *vb = vb_of(a, k);
	if (vb == NULL)
		return;
	atomic_store_explicit(
	    &k->bucket, &def_quota(a)->bucket, memory_order_relaxed);
	if (--vb->refs > 0)
		return;
	allot__idmap_remove(&a->val_index, vb->hash, vb_index(a, vb));
	vb->value[0] = '\0';
	vb->next_free = a->val_free;
	a->val_free = vb_index(a, vb);
	atomic_fetch_sub_explicit(&a->nvals, 1, memory_order_relaxed);
}

bool
allot__value_evictable(allot_agent *a, const allot_key *k, uint64_t now)
{
	allot__vbucket *vb = vb_of(a, k);
	if (vb == NULL || vb->refs > 1)
		return true;
	allot__allowance al;
	allot__bucket_get(&vb->bucket, &al);
	return al.mode != ALLOT__MODE_LIMIT ||
	    allot__bucket_level(&vb->bucket, now) >= al.burst - 1e-9;
}

void
allot__values_apply(allot_agent *a)
{
	a->per_value = !a->cfg->def.shared && a->vals != NULL;
	/* What a value's bucket runs on, copied while the reconfig holds
	 * cfg_lock too: inserts read it under dyn_lock alone. */
	allot__qrt *q = def_quota(a);
	a->val_rate = q->static_rate;
	a->val_burst = q->static_burst;
	a->val_shadow = q->q->shadow;
	for (uint32_t i = 0; i < a->dyn_cap; i++) {
		allot_key *k = &a->dyn_keys[i];
		if (allot__kc(a, k)->slot == NONE)
			continue;
		if (a->per_value)
			allot__value_attach(a, k);
		else
			allot__value_detach(a, k);
	}
	if (!a->per_value)
		return;
	uint64_t now = allot__agent_now(a);
	for (uint32_t i = 0; i < a->dyn_cap; i++)
		if (a->vals[i].refs > 0)
			vb_install(a, &a->vals[i], now);
}

/* Whether (admitted + denied) of `x` is more than of `y`. */
static bool
busier(uint64_t admitted, uint64_t denied, const allot__value_report *y)
{
	return admitted + denied > y->admitted + y->denied;
}

size_t
allot__values_take(
    allot_agent *a, allot__value_report *out, size_t max, uint32_t *ret_key)
{
	size_t n = 0;
	*ret_key = def_quota(a)->index;
	pthread_mutex_lock(&a->dyn_lock);
	if (!a->per_value) {
		pthread_mutex_unlock(&a->dyn_lock);
		return 0;
	}
	/* The keys' tokens since the last look, into their values. */
	for (uint32_t i = 0; i < a->dyn_cap; i++) {
		allot_key *k = &a->dyn_keys[i];
		allot__vbucket *vb = vb_of(a, k);
		if (allot__kc(a, k)->slot == NONE || vb == NULL)
			continue;
		allot__ktotals t;
		allot__key_totals(a, k, &t);
		uint64_t dx, dy;
		allot__look_since(&allot__kc(a, k)->valued,
		    atomic_load_explicit(&k->gen, memory_order_acquire),
		    t.spent, t.denied_tokens, &dx, &dy);
		vb->admitted += dx;
		vb->denied += dy;
	}
	/* The busiest `max`, by insertion into a sorted list. */
	for (uint32_t i = 0; i < a->dyn_cap; i++) {
		allot__vbucket *vb = &a->vals[i];
		if (vb->refs == 0 || vb->admitted + vb->denied == 0)
			continue;
		size_t at = n;
		while (
		    at > 0 && busier(vb->admitted, vb->denied, &out[at - 1]))
			at--;
		if (at >= max)
			continue;
		if (n < max)
			n++;
		memmove(&out[at + 1], &out[at], (n - 1 - at) * sizeof *out);
		memcpy(out[at].value, vb->value, strlen(vb->value) + 1);
		out[at].admitted = vb->admitted;
		out[at].denied = vb->denied;
		out[at].vb = i;
	}
	/* Those reported start over; the others wait for a later Sync. */
	for (size_t j = 0; j < n; j++)
		a->vals[out[j].vb].admitted = a->vals[out[j].vb].denied = 0;
	pthread_mutex_unlock(&a->dyn_lock);
	return n;
}

size_t
allot__values_wire(const allot__value_report *v, size_t n, uint32_t key,
    Allot__V1__ValueReport *msgs, Allot__V1__ValueReport **ptrs)
{
	for (size_t i = 0; i < n; i++) {
		allot__v1__value_report__init(&msgs[i]);
		msgs[i].key = key;
		msgs[i].value = (char *) v[i].value;
		msgs[i].admitted = v[i].admitted;
		msgs[i].denied = v[i].denied;
		ptrs[i] = &msgs[i];
	}
	return n;
}

void
allot__values_install(
    allot_agent *a, Allot__V1__ValueShare *const *v, size_t n)
{
	if (n == 0)
		return;
	uint64_t now = allot__agent_now(a);
	uint32_t key = def_quota(a)->index;
	pthread_mutex_lock(&a->dyn_lock);
	for (size_t i = 0; i < n && a->per_value; i++) {
		const Allot__V1__ValueShare *s = v[i];
		if (s->key != key || s->value == NULL || !(s->rate >= 0) ||
		    !(s->burst >= 0))
			continue;
		allot__vbucket *vb = vb_find(a, s->value,
		    allot__hash(s->value, strlen(s->value), a->seed));
		if (vb == NULL)
			continue; /* evicted since */
		if (vb->replicas == s->replicas && vb->share_rate == s->rate &&
		    vb->share_burst == s->burst)
			continue;
		vb->replicas = s->replicas;
		vb->share_rate = s->rate;
		vb->share_burst = s->burst;
		vb_install(a, vb, now);
	}
	pthread_mutex_unlock(&a->dyn_lock);
}

uint32_t
allot__values_held(const allot_agent *a)
{
	return atomic_load_explicit(&a->nvals, memory_order_relaxed);
}
