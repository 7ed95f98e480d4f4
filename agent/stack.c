/* SPDX-License-Identifier: MIT */
/*
 * Which stacked limits a key charges (docs/configuration.md, "Stacked
 * limits"; the decision itself is agent.c's): after its own quota, its
 * caller's own quota when that is a stacked endpoint quota, then the
 * quotas of the group its identity belongs to (a pattern caller
 * "PREFIX*": the tenant, its endpoint quota first), then every caller's
 * ("*", the empty prefix). The patterns of the config in force are a
 * table sorted by prefix, built with the plan of a reconfig (reconfig.c)
 * and swapped in under dyn_lock, which every reader holds: a reconfig
 * setting every key's levels, and an unknown identity's key taking its
 * own at insert (agent.c).
 *
 * Patterns never nest (the loader refuses one prefix of another, but
 * the empty one), so an identity is in at most one group besides every
 * caller's, and the last prefix not above it (a binary search) is the
 * only one that can be its own.
 */
#include "agent_int.h"

#include <stdlib.h>
#include <string.h>

#define NONE UINT32_MAX

/* One pattern caller: its prefix (in the config of the plan that built
 * the table, in force with it), its own quota and its endpoint quotas,
 * eps[ep0 .. ep0 + nep) of the table (class, quota), by class. */
typedef struct pattern {
	const char *prefix;
	size_t len;
	uint32_t q;
	uint32_t ep0, nep;
} pattern;

struct allot__patterns {
	pattern every; /* "*": len 0, q NONE and nep 0 when absent */
	pattern *p; /* the others, sorted by prefix */
	uint32_t n;
	uint32_t (*eps)[2];
};

/* An entry of the build: a pattern quota and where it is. */
typedef struct entry {
	const char *identity; /* "PREFIX*" */
	uint32_t cls; /* NONE: the pattern's own quota */
	uint32_t q;
} entry;

static int
cmp_entry(const void *x, const void *y)
{
	const entry *a = x, *b = y;
	int r = strcmp(a->identity, b->identity);
	if (r != 0)
		return r;
	return a->cls < b->cls ? -1 : a->cls > b->cls;
}

int
allot__patterns_build(const allot_config *cfg, const uint32_t *slot,
    const uint32_t *cls, allot__patterns **ret)
{
	*ret = NULL;
	size_t n = 0;
	for (size_t i = 0; i < cfg->ncallers; i++)
		n += slot[i] != NONE &&
		    allot__identity_is_pattern(cfg->callers[i].identity);
	allot__patterns *t = calloc(1, sizeof *t);
	entry *e = calloc(n + 1, sizeof *e);
	if (t != NULL) {
		t->p = calloc(n + 1, sizeof *t->p);
		t->eps = calloc(n + 1, sizeof *t->eps);
	}
	if (t == NULL || e == NULL || t->p == NULL || t->eps == NULL) {
		free(e);
		allot__patterns_free(t);
		return ALLOT_ENOMEM;
	}
	n = 0;
	for (size_t i = 0; i < cfg->ncallers; i++)
		if (slot[i] != NONE &&
		    allot__identity_is_pattern(cfg->callers[i].identity))
			e[n++] = (entry) { cfg->callers[i].identity, cls[i],
				slot[i] };
	qsort(e, n, sizeof *e, cmp_entry);
	t->every = (pattern) { "", 0, NONE, 0, 0 };
	uint32_t neps = 0;
	for (size_t i = 0; i < n;) {
		pattern *pt;
		size_t len = strlen(e[i].identity) - 1;
		if (len == 0) {
			pt = &t->every;
		} else {
			pt = &t->p[t->n++];
			*pt = (pattern) { e[i].identity, len, NONE, 0, 0 };
		}
		pt->ep0 = neps;
		const char *id = e[i].identity;
		for (; i < n && strcmp(e[i].identity, id) == 0; i++) {
			if (e[i].cls == NONE) {
				pt->q = e[i].q;
			} else {
				t->eps[neps][0] = e[i].cls;
				t->eps[neps++][1] = e[i].q;
				pt->nep++;
			}
		}
	}
	free(e);
	*ret = t;
	return ALLOT_OK;
}

void
allot__patterns_free(allot__patterns *t)
{
	if (t == NULL)
		return;
	free(t->p);
	free(t->eps);
	free(t);
}

/* The group of `identity` (NULL: none), or NULL. */
static const pattern *
group_of(const allot__patterns *t, const char *identity)
{
	if (identity == NULL || t->n == 0)
		return NULL;
	/* The last prefix not above the identity. */
	uint32_t lo = 0, hi = t->n;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (strncmp(t->p[mid].prefix, identity, t->p[mid].len) <= 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0)
		return NULL;
	const pattern *p = &t->p[lo - 1];
	return strncmp(p->prefix, identity, p->len) == 0 ? p : NULL;
}

/* Pattern `p`'s endpoint quota of class `c`, or NONE. */
static uint32_t
pattern_ep(const allot__patterns *t, const pattern *p, uint32_t c)
{
	for (uint32_t i = 0; i < p->nep; i++)
		if (t->eps[p->ep0 + i][0] == c)
			return t->eps[p->ep0 + i][1];
	return NONE;
}

void
allot__stack_set(
    allot_agent *a, allot_key *k, const char *identity, uint32_t own)
{
	const allot__patterns *t = a->pats;
	uint32_t up[ALLOT__STACK_MAX], n = 0;
	uint32_t mc = atomic_load_explicit(
	    &atomic_load_explicit(&k->quota, memory_order_relaxed)->max_cost,
	    memory_order_relaxed);
	const pattern *g = t != NULL ? group_of(t, identity) : NULL;
	uint32_t cand[] = { own, g != NULL ? pattern_ep(t, g, k->cls) : NONE,
		g != NULL ? g->q : NONE,
		t != NULL ? pattern_ep(t, &t->every, k->cls) : NONE,
		t != NULL ? t->every.q : NONE,
		allot__ceiling_member(
		    a, atomic_load_explicit(&k->quota, memory_order_relaxed)) ?
		    a->ceil_q :
		    NONE };
	_Static_assert(sizeof cand / sizeof cand[0] == ALLOT__STACK_MAX,
	    "a key's levels: its caller's, its group's two, every caller's "
	    "two, the ceiling's");
	for (size_t i = 0; i < sizeof cand / sizeof cand[0]; i++) {
		if (cand[i] == NONE)
			continue;
		up[n++] = cand[i];
		/* A level in shadow never denies. Read from the quota's
		 * atomics, not its config: an unknown identity's key comes
		 * here under dyn_lock alone, while a reconfig may repoint
		 * the quota at another config (cfg_lock). */
		const allot__qrt *q = &a->quotas[cand[i]];
		uint32_t m = atomic_load_explicit(
		    &q->max_cost, memory_order_relaxed);
		if (!atomic_load_explicit(
		        &q->bucket.shadow, memory_order_relaxed) &&
		    m < mc)
			mc = m;
	}
	for (uint32_t i = 0; i < n; i++)
		atomic_store_explicit(
		    &a->stacks[k->id].q[i], up[i], memory_order_relaxed);
	atomic_store_explicit(
	    &a->stacks[k->id].own, own, memory_order_relaxed);
	if (atomic_load_explicit(&k->max_cost, memory_order_relaxed) != mc)
		atomic_store_explicit(&k->max_cost, mc, memory_order_relaxed);
	if (atomic_load_explicit(&k->nup, memory_order_relaxed) != n)
		atomic_store_explicit(
		    &k->nup, (uint8_t) n, memory_order_relaxed);
}

static void
refresh_keys(allot_agent *a, allot_key *keys, size_t n, bool named)
{
	for (size_t i = 0; i < n; i++)
		allot__stack_set(a, &keys[i], named ? keys[i].identity : NULL,
		    atomic_load_explicit(
		        &a->stacks[keys[i].id].own, memory_order_relaxed));
}

void
allot__stack_refresh(allot_agent *a)
{
	pthread_mutex_lock(&a->dyn_lock);
	uint32_t ng = atomic_load(&a->ngroups);
	uint32_t nep = atomic_load(&a->nep);
	for (uint32_t i = 0; i <= nep; i++)
		refresh_keys(a,
		    allot__known_key(a, 0, allot__class_at(a, i, nep)), ng,
		    true);
	refresh_keys(a, a->anon_keys, a->nclasses, false);
	refresh_keys(a, a->overflow_keys, a->nclasses, false);
	refresh_keys(a, a->dyn_keys, a->dyn_cap, true);
	pthread_mutex_unlock(&a->dyn_lock);
}
