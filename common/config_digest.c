/* SPDX-License-Identifier: MIT */
/*
 * The digest of a loaded quota configuration (config_parse.h), the
 * loader's last step: 64 bits that agents and the coordinator compare
 * to know they enforce the same quotas. It covers everything the file
 * keeps, review metadata and candidates included: a change of owner or
 * reason is a change to review and audit like a change of rate.
 */
#include <stdlib.h>
#include <string.h>

#include "config_parse.h"
#include "hash.h"

/* FNV-1a over a canonical serialisation of the loaded values (not the
 * text): fixed-width little-endian integers, IEEE-754 bit patterns for
 * rates, length-prefixed strings, endpoints and callers sorted by name.
 * Two files that load to the same quotas have the same digest whatever
 * their comments, layout, quoting, key order or number spelling.
 *
 * What came after the first format (endpoint quotas, units, candidates,
 * metadata, overcommit, services) is added only where present, behind a
 * marker no string length can take, so that every file of the first
 * format keeps the digest it always had (agents and stored rows compare
 * it across upgrades). */
#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

static void
dg_bytes(uint64_t *h, const void *data, size_t len)
{
	const unsigned char *p = data;
	for (size_t i = 0; i < len; i++) {
		*h ^= p[i];
		*h *= FNV_PRIME;
	}
}

static void
dg_u64(uint64_t *h, uint64_t v)
{
	unsigned char b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char) (v >> (8 * i));
	dg_bytes(h, b, sizeof b);
}

static void
dg_str(uint64_t *h, const char *s)
{
	size_t len = strlen(s);
	dg_u64(h, len);
	dg_bytes(h, s, len);
}

static void
dg_double(uint64_t *h, double d)
{
	uint64_t u;
	memcpy(&u, &d, sizeof u);
	dg_u64(h, u);
}

#define MARK_QUOTA UINT64_MAX /* a quota's later fields follow */
#define MARK_FILE (UINT64_MAX - 1) /* the file's later sections follow */

static bool
quota_has_ext(const allot__quota *q)
{
	return q->endpoint != NULL || q->unit_s > 1 || q->cand_rate > 0 ||
	    q->owner != NULL || q->reason != NULL || q->expected_peak > 0 ||
	    q->nlabels > 0;
}

static void
dg_opt_str(uint64_t *h, const char *s)
{
	dg_u64(h, s != NULL);
	if (s != NULL)
		dg_str(h, s);
}

static void
dg_quota(uint64_t *h, const allot_config *cfg, const allot__quota *q)
{
	dg_str(h, q->identity);
	dg_double(h, q->rate);
	dg_double(h, q->burst);
	dg_str(h, cfg->classes[q->priority]);
	dg_u64(h, q->shadow);
	dg_u64(h, q->shared);
	dg_u64(h, (uint64_t) q->fallback);
	if (!quota_has_ext(q))
		return;
	dg_u64(h, MARK_QUOTA);
	dg_opt_str(h, q->endpoint);
	dg_u64(h, q->unit_s);
	dg_double(h, q->cand_rate);
	dg_double(h, q->cand_burst);
	dg_opt_str(h, q->owner);
	dg_opt_str(h, q->reason);
	dg_double(h, q->expected_peak);
	/* Labels as written: their order is part of how they read. */
	dg_u64(h, q->nlabels);
	for (size_t i = 0; i < q->nlabels; i++)
		dg_str(h, q->labels[i]);
}

static int
cmp_endpoint(const void *a, const void *b)
{
	const allot__endpoint *x = *(const allot__endpoint *const *) a;
	const allot__endpoint *y = *(const allot__endpoint *const *) b;
	return strcmp(x->name, y->name);
}

/* Endpoints by name. */
static void
dg_endpoints(uint64_t *h, const allot__endpoint *e, size_t n)
{
	const allot__endpoint *eps[ALLOT__MAX_ENDPOINTS];
	for (size_t i = 0; i < n; i++)
		eps[i] = &e[i];
	qsort(eps, n, sizeof eps[0], cmp_endpoint);
	dg_u64(h, n);
	for (size_t i = 0; i < n; i++) {
		dg_str(h, eps[i]->name);
		dg_u64(h, eps[i]->weight);
	}
}

static void
dg_service(uint64_t *h, const allot_config *cfg, const allot__service *s,
    const allot__quota *const *byid)
{
	dg_str(h, s->name);
	dg_u64(h, s->def != NULL);
	if (s->def != NULL)
		dg_quota(h, cfg, s->def);
	dg_u64(h, s->default_weight);
	dg_endpoints(h, s->endpoints, s->nendpoints);
	dg_double(h, s->ceiling_rate);
	dg_u64(h, s->overcommit);
	dg_u64(h, s->ncallers);
	for (size_t i = 0; i < s->ncallers; i++)
		dg_quota(h, cfg, byid[i]);
}

uint64_t
allot__cfg_digest(const allot__cfg_ctx *c)
{
	const allot_config *cfg = c->cfg;
	uint64_t h = FNV_OFFSET;
	dg_str(&h, "allot-quotas-v1");
	dg_u64(&h, cfg->nclasses);
	for (size_t i = 0; i < cfg->nclasses; i++)
		dg_str(&h, cfg->classes[i]);
	dg_u64(&h, cfg->default_weight);
	dg_endpoints(&h, cfg->endpoints, cfg->nendpoints);
	dg_double(&h, cfg->ceiling_rate);
	dg_quota(&h, cfg, &cfg->def);
	dg_u64(&h, cfg->ncallers);
	for (size_t i = 0; i < cfg->ncallers; i++)
		dg_quota(&h, cfg, c->top.byid[i]);
	if (!cfg->overcommit && cfg->nservices == 0)
		return allot__mix64(h);
	dg_u64(&h, MARK_FILE);
	dg_u64(&h, cfg->overcommit);
	/* Services by name (sorted by the checks); each one's callers by
	 * wire key. */
	dg_u64(&h, cfg->nservices);
	for (size_t i = 0; i < cfg->nservices; i++) {
		size_t k = (size_t) (c->svc_sorted[i] - cfg->services);
		dg_service(&h, cfg, c->svc_sorted[i], c->svc[k].byid);
	}
	return allot__mix64(h);
}
