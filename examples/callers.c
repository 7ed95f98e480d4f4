/* SPDX-License-Identifier: MIT */
/*
 * The example service's caller table: one record of counters per verified
 * identity (and record 0 for callers without one), found by an open-
 * addressing index under a mutex. It is consulted once per connection,
 * never per request, and bounded: once --max-callers records exist, new
 * identities are counted in record 0 and in `overflowed`, so that a flood
 * of certificates cannot grow the service's memory. Records are never
 * freed before shutdown, so connection threads keep plain pointers.
 */
#include <stdlib.h>
#include <string.h>

#include "service.h"

static uint64_t
fnv1a(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (; *s != '\0'; s++) {
		h ^= (unsigned char) *s;
		h *= 0x100000001b3ull;
	}
	return h;
}

int
svc_callers_init(struct svc_callers *t, uint32_t cap)
{
	memset(t, 0, sizeof *t);
	if (cap < 1 || cap > (1u << 20))
		return ALLOT_EINVAL;
	t->cap = cap;
	t->index_cap = 4;
	while (t->index_cap < 2 * cap)
		t->index_cap *= 2;
	t->rec = calloc(cap, sizeof *t->rec);
	t->index = calloc(t->index_cap, sizeof *t->index);
	if (t->rec == NULL || t->index == NULL ||
	    pthread_mutex_init(&t->mu, NULL) != 0) {
		free(t->rec);
		free(t->index);
		return ALLOT_ENOMEM;
	}
	t->rec[0].conc_slot = ALLOT_CONC_DEFAULT_CALLER;
	t->rec[0].quota = "default";
	atomic_store(&t->n, 1);
	return ALLOT_OK;
}

void
svc_callers_fini(struct svc_callers *t)
{
	if (t->rec == NULL)
		return;
	pthread_mutex_destroy(&t->mu);
	free(t->rec);
	free(t->index);
	t->rec = NULL;
	t->index = NULL;
}

struct svc_caller *
svc_callers_get(struct svc *s, const char *identity)
{
	struct svc_callers *t = &s->callers;
	if (identity == NULL || identity[0] == '\0')
		return &t->rec[0];
	uint32_t mask = t->index_cap - 1;
	uint32_t i = (uint32_t) fnv1a(identity) & mask;
	struct svc_caller *c = &t->rec[0];
	pthread_mutex_lock(&t->mu);
	for (;; i = (i + 1) & mask) {
		uint32_t r = t->index[i];
		if (r == 0)
			break;
		if (strcmp(t->rec[r].identity, identity) == 0) {
			c = &t->rec[r];
			goto out;
		}
	}
	uint32_t n = atomic_load_explicit(&t->n, memory_order_relaxed);
	if (n >= t->cap) {
		atomic_fetch_add_explicit(
		    &t->overflowed, 1, memory_order_relaxed);
		goto out;
	}
	c = &t->rec[n];
	size_t len = strnlen(identity, sizeof c->identity - 1);
	memcpy(c->identity, identity, len);
	c->identity[len] = '\0';
	c->has_identity = true;
	/* The limiter folds callers it has no slot for into the default
	 * slot by itself; an error leaves the record on that slot too. */
	if (allot_conc_caller(s->conc, c->identity, &c->conc_slot) != ALLOT_OK)
		c->conc_slot = ALLOT_CONC_DEFAULT_CALLER;
	/* The quota charged is a property of the identity, the same for
	 * every endpoint: ask the agent once, here. */
	c->quota = "default";
	allot_key *k;
	if (allot_key_resolve(
	        s->agent, c->identity, svc_endpoint_path[0], &k) == ALLOT_OK) {
		allot_key_stats ks;
		if (allot_key_stats_get(s->agent, k, &ks) == ALLOT_OK)
			c->quota = ks.quota;
		allot_key_release(s->agent, k);
	}
	t->index[i] = n;
	/* Release: /stats reads records below n without the mutex. */
	atomic_store_explicit(&t->n, n + 1, memory_order_release);
out:
	pthread_mutex_unlock(&t->mu);
	return c;
}
