/* SPDX-License-Identifier: MIT */
/*
 * The digest of a loaded quota configuration (config_parse.h), the
 * loader's last step: 64 bits that agents and the coordinator compare
 * to know they enforce the same quotas. It covers everything the file
 * keeps, review metadata and candidates included: a change of owner or
 * reason is a change to review and audit like a change of rate. A
 * quota's fields are digested by their rows in the field table
 * (config_fields.h), each as its type says.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "config_fields.h"
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
 * it across upgrades). A quota field added since (a row of the field
 * table in neither the first format nor its extension) is written only
 * in a quota that sets it, behind its own marker and its key: a file
 * that does not use it keeps its digest too. */
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
#define MARK_FIELD (UINT64_MAX - 2) /* a field's key and value follow */

static void
dg_opt_str(uint64_t *h, const char *s)
{
	dg_u64(h, s != NULL);
	if (s != NULL)
		dg_str(h, s);
}

/* Field `f` of quota `q`: its value, or in the extension (`ext`) a
 * rate's unit, the part of it that came after the first format. */
static void
dg_field(uint64_t *h, const allot_config *cfg, const allot__quota *q,
    const allot__qfield *f, bool ext)
{
	switch (f->type) {
	case ALLOT__QT_RATE:
		if (ext)
			dg_u64(h, q->unit_s);
		else
			dg_double(h, ALLOT__QFC(double, q, f->off));
		break;
	case ALLOT__QT_BURST:
	case ALLOT__QT_PER_UNIT:
	case ALLOT__QT_FRACTION:
		dg_double(h, ALLOT__QFC(double, q, f->off));
		break;
	case ALLOT__QT_CLASS:
		dg_str(h, cfg->classes[ALLOT__QFC(uint32_t, q, f->off)]);
		break;
	case ALLOT__QT_BOOL: dg_u64(h, ALLOT__QFC(bool, q, f->off)); break;
	case ALLOT__QT_WORD:
		dg_u64(h, (uint64_t) ALLOT__QFC(int, q, f->off));
		break;
	case ALLOT__QT_TEXT:
		dg_opt_str(h, ALLOT__QFC(char *, q, f->off));
		break;
	case ALLOT__QT_LABELS: {
		/* As written: their order is part of how they read. */
		char *const *v = ALLOT__QFC(char **, q, f->off);
		size_t n = ALLOT__QFC(size_t, q, f->off2);
		dg_u64(h, n);
		for (size_t i = 0; i < n; i++)
			dg_str(h, v[i]);
		break;
	}
	case ALLOT__QT_CANDIDATE:
		dg_double(h, ALLOT__QFC(double, q, f->off));
		dg_double(h, ALLOT__QFC(double, q, f->off2));
		break;
	}
}

/* Whether field `f` of `q` has what the extension holds of it: a rate
 * written in another unit than per second, any other field away from
 * its default (absent). */
static bool
ext_set(const allot__quota *q, const allot__qfield *f)
{
	switch (f->type) {
	case ALLOT__QT_RATE: return q->unit_s > 1;
	case ALLOT__QT_BURST:
	case ALLOT__QT_PER_UNIT:
	case ALLOT__QT_CANDIDATE: return ALLOT__QFC(double, q, f->off) > 0;
	case ALLOT__QT_CLASS: return ALLOT__QFC(uint32_t, q, f->off) != 0;
	case ALLOT__QT_BOOL: return ALLOT__QFC(bool, q, f->off) != f->dflt;
	case ALLOT__QT_WORD: return ALLOT__QFC(int, q, f->off) != 0;
	case ALLOT__QT_TEXT: return ALLOT__QFC(char *, q, f->off) != NULL;
	case ALLOT__QT_LABELS: return ALLOT__QFC(size_t, q, f->off2) > 0;
	case ALLOT__QT_FRACTION:
		return ALLOT__QFC(double, q, f->off) != f->num;
	}
	return false;
}

/* A field of the first format without a part in the extension. */
static bool
first_only(const allot__qfield *f)
{
	return f->first != 0 && (f->flags & ALLOT__QF_DIGEST_EXT) == 0;
}

static bool
quota_has_ext(const allot__quota *q)
{
	if (q->endpoint != NULL)
		return true;
	for (size_t i = 0; i < allot__nqfields; i++)
		if (!first_only(&allot__qfields[i]) &&
		    ext_set(q, &allot__qfields[i]))
			return true;
	return false;
}

/* The fields of the first format, by place (first[0] unused). */
typedef struct dg_plan {
	const allot__qfield *first[ALLOT__QFIRST_N + 1];
} dg_plan;

static void
dg_plan_init(dg_plan *p)
{
	memset(p, 0, sizeof *p);
	for (size_t i = 0; i < allot__nqfields; i++) {
		unsigned at = allot__qfields[i].first;
		assert(at <= ALLOT__QFIRST_N);
		if (at != 0 && at <= ALLOT__QFIRST_N)
			p->first[at] = &allot__qfields[i];
	}
}

/* A quota: its identity and the fields of the first format in their
 * places; then, only in a quota that has any of them, the extension:
 * its endpoint and the fields flagged ALLOT__QF_DIGEST_EXT in table
 * order, all of them, and then each later field that it sets, behind a
 * marker and the field's key. Both the places and the extension are
 * frozen: a new field is digested only where it is set, so that every
 * file without it keeps its digest. */
static void
dg_quota(uint64_t *h, const dg_plan *p, const allot_config *cfg,
    const allot__quota *q)
{
	dg_str(h, q->identity);
	for (unsigned i = 1; i <= ALLOT__QFIRST_N; i++)
		if (p->first[i] != NULL)
			dg_field(h, cfg, q, p->first[i], false);
	if (!quota_has_ext(q))
		return;
	dg_u64(h, MARK_QUOTA);
	dg_opt_str(h, q->endpoint);
	for (size_t i = 0; i < allot__nqfields; i++)
		if (allot__qfields[i].flags & ALLOT__QF_DIGEST_EXT)
			dg_field(h, cfg, q, &allot__qfields[i], true);
	for (size_t i = 0; i < allot__nqfields; i++) {
		const allot__qfield *f = &allot__qfields[i];
		if (f->first != 0 || (f->flags & ALLOT__QF_DIGEST_EXT) ||
		    !ext_set(q, f))
			continue;
		dg_u64(h, MARK_FIELD);
		dg_str(h, f->key);
		dg_field(h, cfg, q, f, true);
	}
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
dg_service(uint64_t *h, const dg_plan *p, const allot_config *cfg,
    const allot__service *s, const allot__quota *const *byid)
{
	dg_str(h, s->name);
	dg_u64(h, s->def != NULL);
	if (s->def != NULL)
		dg_quota(h, p, cfg, s->def);
	dg_u64(h, s->default_weight);
	dg_endpoints(h, s->endpoints, s->nendpoints);
	dg_double(h, s->ceiling_rate);
	dg_u64(h, s->overcommit);
	dg_u64(h, s->ncallers);
	for (size_t i = 0; i < s->ncallers; i++)
		dg_quota(h, p, cfg, byid[i]);
}

uint64_t
allot__cfg_digest(const allot__cfg_ctx *c)
{
	const allot_config *cfg = c->cfg;
	uint64_t h = FNV_OFFSET;
	dg_plan p;
	dg_plan_init(&p);
	dg_str(&h, "allot-quotas-v1");
	dg_u64(&h, cfg->nclasses);
	for (size_t i = 0; i < cfg->nclasses; i++)
		dg_str(&h, cfg->classes[i]);
	dg_u64(&h, cfg->default_weight);
	dg_endpoints(&h, cfg->endpoints, cfg->nendpoints);
	dg_double(&h, cfg->ceiling_rate);
	dg_quota(&h, &p, cfg, &cfg->def);
	dg_u64(&h, cfg->ncallers);
	for (size_t i = 0; i < cfg->ncallers; i++)
		dg_quota(&h, &p, cfg, c->top.byid[i]);
	if (!cfg->overcommit && cfg->nservices == 0)
		return allot__mix64(h);
	dg_u64(&h, MARK_FILE);
	dg_u64(&h, cfg->overcommit);
	/* Services by name (sorted by the checks); each one's callers by
	 * wire key. */
	dg_u64(&h, cfg->nservices);
	for (size_t i = 0; i < cfg->nservices; i++) {
		size_t k = (size_t) (c->svc_sorted[i] - cfg->services);
		dg_service(&h, &p, cfg, c->svc_sorted[i], c->svc[k].byid);
	}
	return allot__mix64(h);
}
