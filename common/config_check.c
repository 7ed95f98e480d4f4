/* SPDX-License-Identifier: MIT */
/*
 * The quota file loader's checks across sections (config_parse.h), run
 * after the schema walk because YAML mappings are unordered (priority
 * classes may follow the callers that name them, endpoint_weights may
 * follow callers): each quota's priority resolved against shed_order,
 * duplicate caller identities, and every burst against the heaviest
 * endpoint weight.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_parse.h"

static int
set_default_classes(allot__cfg_ctx *c)
{
	static const char *const names[] = { "low", "batch", "standard",
		"critical" };
	allot_config *cfg = c->cfg;
	for (size_t i = 0; i < 4; i++) {
		if ((cfg->classes[i] = strdup(names[i])) == NULL)
			return allot__cfg_nomem(c);
		cfg->nclasses++;
	}
	return ALLOT_OK;
}

/* A quota without `priority` gets classes[0], the class shed first:
 * protection from shedding is opted into, never granted by omission. */
static int
resolve_priority(allot__cfg_ctx *c, allot__quota *q, const allot__cfg_meta *m)
{
	allot_config *cfg = c->cfg;
	char q1[QBUF], list[ALLOT__MAX_CLASSES * (ALLOT__CLASS_MAX + 2)];
	q->priority = 0;
	if (m->prio == NULL)
		return ALLOT_OK;
	for (size_t i = 0; i < cfg->nclasses; i++) {
		if (strcmp(cfg->classes[i], m->prio->str) == 0) {
			q->priority = (uint32_t) i;
			return ALLOT_OK;
		}
	}
	allot__cfg_join(list, sizeof list, (const char *const *) cfg->classes,
	    cfg->nclasses);
	return FAIL(c, m->prio,
	    "unknown priority class %s, expected one of: %s", QN(q1, m->prio),
	    list);
}

static int
cmp_identity(const void *a, const void *b)
{
	const allot__quota *x = *(const allot__quota *const *) a;
	const allot__quota *y = *(const allot__quota *const *) b;
	int r = strcmp(x->identity, y->identity);
	if (r != 0)
		return r;
	return x < y ? -1 : x > y; /* file order among equals */
}

/* Sort callers by identity (kept for the digest) and report the earliest
 * repeated identity, pointing back at its first definition. */
static int
check_identities(allot__cfg_ctx *c)
{
	allot_config *cfg = c->cfg;
	char q[QBUF];
	if (cfg->ncallers == 0)
		return ALLOT_OK;
	c->byid = malloc(cfg->ncallers * sizeof *c->byid);
	if (c->byid == NULL)
		return allot__cfg_nomem(c);
	for (size_t i = 0; i < cfg->ncallers; i++)
		c->byid[i] = &cfg->callers[i];
	qsort(c->byid, cfg->ncallers, sizeof *c->byid, cmp_identity);
	/* Each run of equal identities is in file order: its first entry
	 * is the definition, its second the earliest repeat. */
	const allot__quota *dup = NULL, *first = NULL;
	for (size_t i = 0, j; i < cfg->ncallers; i = j) {
		for (j = i + 1; j < cfg->ncallers; j++)
			if (strcmp(c->byid[i]->identity,
			        c->byid[j]->identity) != 0)
				break;
		if (j - i > 1 && (dup == NULL || c->byid[i + 1] < dup)) {
			dup = c->byid[i + 1];
			first = c->byid[i];
		}
	}
	if (dup == NULL)
		return ALLOT_OK;
	const allot__cfg_node *n = c->meta[dup - cfg->callers].ident;
	return FAIL(c, n,
	    "duplicate identity %s (first defined at line %" PRIu32
	    "), expected each caller identity once",
	    Q(q, dup->identity), first->line);
}

/* Every request to any endpoint must be able to pass a full bucket. */
static int
check_burst(allot__cfg_ctx *c, const allot__quota *q, const allot__cfg_meta *m,
    bool is_default)
{
	allot_config *cfg = c->cfg;
	char q1[QBUF], q2[QBUF], q3[QBUF], who[QBUF + 16];
	if (q->burst >= cfg->max_weight)
		return ALLOT_OK;
	const char *ep = "default";
	for (size_t i = 0; i < cfg->nendpoints; i++) {
		if (cfg->endpoints[i].weight == cfg->max_weight) {
			ep = cfg->endpoints[i].name;
			break;
		}
	}
	if (is_default)
		snprintf(who, sizeof who, "quotas.default");
	else
		snprintf(who, sizeof who, "caller %s", Q(q1, q->identity));
	return FAIL(c, m->burst,
	    "%s has burst %s, below the weight %" PRIu32
	    " of endpoint %s, expected burst >= %" PRIu32
	    " (a request there could never pass)",
	    who, NUM(q3, m->burst), cfg->max_weight, Q(q2, ep),
	    cfg->max_weight);
}

int
allot__cfg_check_all(allot__cfg_ctx *c)
{
	allot_config *cfg = c->cfg;
	int rc = ALLOT_OK;
	if (cfg->nclasses == 0 && (rc = set_default_classes(c)) != ALLOT_OK)
		return rc;
	rc = resolve_priority(c, &cfg->def, &c->def);
	for (size_t i = 0; i < cfg->ncallers && rc == ALLOT_OK; i++)
		rc = resolve_priority(c, &cfg->callers[i], &c->meta[i]);
	if (rc == ALLOT_OK)
		rc = check_identities(c);
	cfg->max_weight = cfg->default_weight;
	for (size_t i = 0; i < cfg->nendpoints; i++)
		if (cfg->endpoints[i].weight > cfg->max_weight)
			cfg->max_weight = cfg->endpoints[i].weight;
	if (rc == ALLOT_OK)
		rc = check_burst(c, &cfg->def, &c->def, true);
	for (size_t i = 0; i < cfg->ncallers && rc == ALLOT_OK; i++)
		rc = check_burst(c, &cfg->callers[i], &c->meta[i], false);
	return rc;
}
