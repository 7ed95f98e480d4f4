/* SPDX-License-Identifier: MIT */
/*
 * The config in force as the hot paths see it (a cfgv): the quotas by
 * index (0 is the default, i is caller i-1), their rates and bursts in
 * contiguous arrays, and an identity hash table so that interning a key
 * is one probe. A view is built outside the lock and installed by
 * allot__state_create() or allot__state_reload(); once installed it never
 * changes, and it is freed only when the next one replaces it.
 */
#include "registry_int.h"

#include <stdlib.h>
#include <string.h>

#include "hash.h"

void
allot__cfgv_free(cfgv *v)
{
	if (v == NULL)
		return;
	allot_config_free(v->cfg);
	free(v->path);
	free(v->q);
	free(v->rate);
	free(v->burst);
	free(v->index);
	free(v);
}

int32_t
allot__cfgv_find(const cfgv *v, const char *identity, size_t len)
{
	uint64_t h = allot__hash(identity, len, v->seed);
	for (size_t i = (size_t) h & v->index_mask;;
	     i = (i + 1) & v->index_mask) {
		uint32_t e = v->index[i];
		if (e == 0)
			return -1;
		const char *id = v->q[e - 1]->identity;
		if (strncmp(id, identity, len) == 0 && id[len] == '\0')
			return (int32_t) (e - 1);
	}
}

/* Takes ownership of cfg only on success. */
cfgv *
allot__cfgv_new(allot_config *cfg, const char *path, uint64_t epoch)
{
	cfgv *v = calloc(1, sizeof *v);
	if (v == NULL)
		return NULL;
	v->nq = 1 + cfg->ncallers;
	v->epoch = epoch;
	v->loaded_wall_ms = allot__wall_ms();
	v->seed = allot__hash_seed();
	size_t cap = 8;
	while (cap < 2 * v->nq)
		cap *= 2;
	v->index_mask = cap - 1;
	v->q = calloc(v->nq, sizeof *v->q);
	v->rate = calloc(v->nq, sizeof *v->rate);
	v->burst = calloc(v->nq, sizeof *v->burst);
	v->index = calloc(cap, sizeof *v->index);
	v->path = strdup(path != NULL ? path : "");
	if (v->q == NULL || v->rate == NULL || v->burst == NULL ||
	    v->index == NULL || v->path == NULL)
		goto fail;
	for (size_t i = 0; i < v->nq; i++) {
		const allot__quota *q = i == 0 ? &cfg->def :
		                                 &cfg->callers[i - 1];
		v->q[i] = q;
		v->rate[i] = q->rate;
		v->burst[i] = q->burst;
		size_t len = strlen(q->identity);
		if (allot__cfgv_find(v, q->identity, len) >= 0)
			continue; /* the loader rejects duplicates; be safe */
		uint64_t h = allot__hash(q->identity, len, v->seed);
		size_t j = (size_t) h & v->index_mask;
		while (v->index[j] != 0)
			j = (j + 1) & v->index_mask;
		v->index[j] = (uint32_t) i + 1;
	}
	v->cfg = cfg;
	return v;
fail:
	allot__cfgv_free(v);
	return NULL;
}

const char *
allot__cfgv_priority_name(const cfgv *v, uint32_t p)
{
	return p < v->cfg->nclasses ? v->cfg->classes[p] : "?";
}

/* The config row of view `v` (`store` may be NULL). */
void
allot__cfgv_record(allot__store *store, const cfgv *v, const char *text)
{
	if (store != NULL)
		allot__store_config_loaded(store, v->epoch, v->cfg->digest,
		    v->path, text != NULL ? text : "");
}
