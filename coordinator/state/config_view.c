/* SPDX-License-Identifier: MIT */
/*
 * The config in force as the hot paths see it (a cfgv): the quotas by
 * index, their rates and bursts in contiguous arrays, and the wire key
 * indexes (common/config_index.h, the one the agent uses too) so that
 * interning a key is one probe. A view is built outside the lock and
 * installed by allot__state_create() or allot__state_reload(); once
 * installed it never changes, and it is freed only when the next one
 * replaces it.
 *
 * One file serves many services. Each service is allocated from its own
 * view of the file (allot__config_select()): the top-level quotas with
 * its section merged in. The quota indexes are shared by every service:
 * 0 is the top-level default and i is top-level caller i-1, as with one
 * scope; then each service section's own quotas (its default, its
 * callers and endpoint quotas) get indexes of their own. A service
 * resolves a wire key through its view's index to one of those, so a
 * quota scoped to service A has no index that service B can reach; a
 * service the file does not name sees the top level only. Quotas of
 * other services never hold a key of this one, so they take no part in
 * its allocation.
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
	for (size_t i = 0; v->svc != NULL && i < v->nsvc; i++) {
		allot__config_index_free(&v->svc[i].index);
		allot_config_free(v->svc[i].view);
		free(v->svc[i].gq);
	}
	free(v->svc);
	allot_config_free(v->cfg);
	free(v->path);
	free(v->text);
	free(v->q);
	free(v->names);
	free(v->qsvc);
	free(v->rate);
	free(v->burst);
	allot__config_index_free(&v->index);
	free(v);
}

static const cfgv_svc *
find_svc(const cfgv *v, const char *sname)
{
	if (sname == NULL)
		return NULL;
	size_t lo = 0, hi = v->nsvc;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int r = strcmp(v->svc[mid].name, sname);
		if (r == 0)
			return &v->svc[mid];
		if (r < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

int32_t
allot__cfgv_find(const cfgv *v, const char *key, size_t len)
{
	return (int32_t) allot__config_index_find(&v->index, key, len);
}

int32_t
allot__cfgv_find_svc(
    const cfgv *v, const char *sname, const char *key, size_t len)
{
	const cfgv_svc *sv = find_svc(v, sname);
	int32_t q;
	if (sv == NULL) {
		q = (int32_t) allot__config_index_find(&v->index, key, len);
	} else {
		int64_t i = allot__config_index_find(&sv->index, key, len);
		q = i < 0 ? -1 : sv->gq[i];
	}
	if (q >= 0 && v->q[q]->access != ALLOT__ACCESS_LIMITED)
		return ALLOT__CFGV_FIXED;
	return q;
}

size_t
allot__cfgv_count(const cfgv *v, const char *sname)
{
	const cfgv_svc *sv = find_svc(v, sname);
	return sv != NULL ? sv->index.n : v->ntop;
}

int32_t
allot__cfgv_at(const cfgv *v, const char *sname, size_t i)
{
	const cfgv_svc *sv = find_svc(v, sname);
	return sv != NULL ? sv->gq[i] : (int32_t) i;
}

void
allot__cfgv_mask(const cfgv *v, const char *sname, bool *in)
{
	memset(in, 0, v->nq * sizeof *in);
	size_t n = allot__cfgv_count(v, sname);
	for (size_t i = 0; i < n; i++) {
		int32_t q = allot__cfgv_at(v, sname, i);
		if (q >= 0)
			in[q] = true;
	}
}

double
allot__cfgv_ceiling(const cfgv *v, const char *sname)
{
	const cfgv_svc *sv = find_svc(v, sname);
	return sv != NULL ? sv->view->ceiling_rate : v->cfg->ceiling_rate;
}

static int
cmp_svc(const void *a, const void *b)
{
	return strcmp(
	    ((const cfgv_svc *) a)->name, ((const cfgv_svc *) b)->name);
}

/* Each service's view, its index and its quotas' shared indexes; the
 * own quotas are appended to v->q from *nq on. */
static int
build_services(cfgv *v, allot_config *cfg, uint64_t seed, size_t *nq)
{
	v->nsvc = cfg->nservices;
	if (v->nsvc == 0)
		return ALLOT_OK;
	v->svc = calloc(v->nsvc, sizeof *v->svc);
	if (v->svc == NULL)
		return ALLOT_ENOMEM;
	for (size_t k = 0; k < v->nsvc; k++) {
		const allot__service *s = &cfg->services[k];
		cfgv_svc *sv = &v->svc[k];
		sv->name = s->name;
		if (allot__config_select(cfg, s->name, &sv->view) !=
		        ALLOT_OK ||
		    allot__config_index_build(
		        &sv->index, sv->view, true, seed) != ALLOT_OK ||
		    (sv->gq = calloc(sv->index.n, sizeof *sv->gq)) == NULL)
			return ALLOT_ENOMEM;
		/* The service's own quotas, by wire key. */
		allot_config section = { .callers = s->callers,
			.ncallers = s->ncallers };
		allot__config_index own;
		if (allot__config_index_build(&own, &section, false, seed) !=
		    ALLOT_OK)
			return ALLOT_ENOMEM;
		for (uint32_t i = 0; i < sv->index.n; i++) {
			const allot__quota *q = i == 0 ?
			    &sv->view->def :
			    &sv->view->callers[i - 1];
			const char *key = sv->index.ids[i];
			bool mine = i == 0 ? s->def != NULL :
			                     allot__config_index_find(
			                         &own, key, strlen(key)) >= 0;
			if (!mine) {
				sv->gq[i] = (int32_t) allot__config_index_find(
				    &v->index, key, strlen(key));
				continue;
			}
			sv->gq[i] = (int32_t) *nq;
			v->q[*nq] = q;
			v->names[*nq] = key;
			v->qsvc[*nq] = s->name;
			(*nq)++;
		}
		allot__config_index_free(&own);
	}
	qsort(v->svc, v->nsvc, sizeof *v->svc, cmp_svc);
	return ALLOT_OK;
}

/* Takes ownership of cfg only on success. */
cfgv *
allot__cfgv_new(allot_config *cfg, const char *path, uint64_t epoch)
{
	cfgv *v = calloc(1, sizeof *v);
	if (v == NULL)
		return NULL;
	uint64_t seed = allot__hash_seed();
	/* Room for every quota of every scope. */
	size_t cap = 1 + cfg->ncallers;
	for (size_t k = 0; k < cfg->nservices; k++)
		cap += 1 + cfg->services[k].ncallers;
	v->ntop = 1 + cfg->ncallers;
	v->epoch = epoch;
	v->loaded_wall_ms = allot__wall_ms();
	v->q = calloc(cap, sizeof *v->q);
	v->names = calloc(cap, sizeof *v->names);
	v->qsvc = calloc(cap, sizeof *v->qsvc);
	v->path = strdup(path != NULL ? path : "");
	if (v->q == NULL || v->names == NULL || v->qsvc == NULL ||
	    v->path == NULL ||
	    allot__config_index_build(&v->index, cfg, true, seed) != ALLOT_OK)
		goto fail;
	for (size_t i = 0; i < v->ntop; i++) {
		v->q[i] = i == 0 ? &cfg->def : &cfg->callers[i - 1];
		v->names[i] = v->index.ids[i];
	}
	size_t nq = v->ntop;
	if (build_services(v, cfg, seed, &nq) != ALLOT_OK)
		goto fail;
	v->nq = nq;
	v->rate = calloc(v->nq, sizeof *v->rate);
	v->burst = calloc(v->nq, sizeof *v->burst);
	if (v->rate == NULL || v->burst == NULL)
		goto fail;
	for (size_t i = 0; i < v->nq; i++) {
		v->rate[i] = v->q[i]->rate;
		v->burst[i] = v->q[i]->burst;
	}
	v->cfg = cfg;
	return v;
fail:
	/* cfg stays the caller's: the views made from it are ours. */
	allot__cfgv_free(v);
	return NULL;
}

const char *
allot__cfgv_priority_name(const cfgv *v, uint32_t p)
{
	return p < v->cfg->nclasses ? v->cfg->classes[p] : "?";
}

/* The config row of view `v` (`store` may be NULL), and the text kept
 * for the agents (a copy; none above ALLOT__STATE_CONFIG_PUSH_MAX, or when
 * out of memory: agents then keep their own config). */
void
allot__cfgv_record(allot__store *store, cfgv *v, const char *text)
{
	v->text_len = text != NULL ? strlen(text) : 0;
	if (text != NULL && v->text_len <= ALLOT__STATE_CONFIG_PUSH_MAX)
		v->text = strdup(text);
	if (store != NULL)
		allot__store_config_loaded(store, v->epoch, v->cfg->digest,
		    v->path, text != NULL ? text : "");
}
