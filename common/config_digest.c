/* SPDX-License-Identifier: MIT */
/*
 * The digest of a loaded quota configuration (config_parse.h), the
 * loader's last step: 64 bits that agents and the coordinator compare
 * to know they enforce the same quotas.
 */
#include <stdlib.h>
#include <string.h>

#include "config_parse.h"
#include "hash.h"

/* FNV-1a over a canonical serialisation of the loaded values (not the
 * text): fixed-width little-endian integers, IEEE-754 bit patterns for
 * rates, length-prefixed strings, endpoints and callers sorted by name.
 * Two files that load to the same quotas have the same digest whatever
 * their comments, layout, quoting, key order or number spelling. */
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
}

static int
cmp_endpoint(const void *a, const void *b)
{
	const allot__endpoint *x = *(const allot__endpoint *const *) a;
	const allot__endpoint *y = *(const allot__endpoint *const *) b;
	return strcmp(x->name, y->name);
}

uint64_t
allot__cfg_digest(const allot_config *cfg, const allot__quota *const *byid)
{
	const allot__endpoint *eps[ALLOT__MAX_ENDPOINTS];
	uint64_t h = FNV_OFFSET;
	dg_str(&h, "allot-quotas-v1");
	dg_u64(&h, cfg->nclasses);
	for (size_t i = 0; i < cfg->nclasses; i++)
		dg_str(&h, cfg->classes[i]);
	dg_u64(&h, cfg->default_weight);
	for (size_t i = 0; i < cfg->nendpoints; i++)
		eps[i] = &cfg->endpoints[i];
	qsort(eps, cfg->nendpoints, sizeof eps[0], cmp_endpoint);
	dg_u64(&h, cfg->nendpoints);
	for (size_t i = 0; i < cfg->nendpoints; i++) {
		dg_str(&h, eps[i]->name);
		dg_u64(&h, eps[i]->weight);
	}
	dg_double(&h, cfg->ceiling_rate);
	dg_quota(&h, cfg, &cfg->def);
	dg_u64(&h, cfg->ncallers);
	for (size_t i = 0; i < cfg->ncallers; i++)
		dg_quota(&h, cfg, byid[i]);
	return allot__mix64(h);
}
