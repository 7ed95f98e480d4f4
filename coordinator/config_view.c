/* SPDX-License-Identifier: MIT */
/*
 * The config in force as the hot paths see it (a cfgv): the quotas by
 * index (0 is the default, i is caller i-1), their rates and bursts in
 * contiguous arrays, and the identity index (common/config_index.h, the
 * one the agent uses too) so that interning a key is one probe. A view is
 * built outside the lock and installed by allot__state_create() or
 * allot__state_reload(); once installed it never changes, and it is freed only
 * when the next one replaces it.
 */
#include "registry_int.h"

#include <stdlib.h>
#include <string.h>

#include "config_index.h"
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
	allot__config_index_free(&v->index);
	free(v);
}

int32_t
allot__cfgv_find(const cfgv *v, const char *identity, size_t len)
{
	return (int32_t) allot__config_index_find(&v->index, identity, len);
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
	v->q = calloc(v->nq, sizeof *v->q);
	v->rate = calloc(v->nq, sizeof *v->rate);
	v->burst = calloc(v->nq, sizeof *v->burst);
	v->path = strdup(path != NULL ? path : "");
	if (v->q == NULL || v->rate == NULL || v->burst == NULL ||
	    v->path == NULL ||
	    allot__config_index_build(
	        &v->index, cfg, true, allot__hash_seed()) != ALLOT_OK)
		goto fail;
	for (size_t i = 0; i < v->nq; i++) {
		const allot__quota *q = i == 0 ? &cfg->def :
		                                 &cfg->callers[i - 1];
		v->q[i] = q;
		v->rate[i] = q->rate;
		v->burst[i] = q->burst;
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
