/* SPDX-License-Identifier: MIT */
/*
 * Plans (docs/configuration.md, "Plans"): named quota templates under
 * quotas.plans that the default quota and callers, top level or in a
 * service's section, inherit from with `plan: NAME`. A quota with a plan
 * is read as the mapping of the plan's keys and its own, its own winning
 * (one rate key in all: a quota that writes a rate in any unit drops the
 * plan's), so that every field is checked, defaulted and digested as if
 * it were written out: two files, one with plans and one with the same
 * values written in each quota, load to the same config and digest. A
 * value that came from the plan is reported at the plan's line.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "config_parse.h"

/* A plan's name in a message: at most 128 bytes of it. */
#define NAME(n) (int) ((n)->len < 128 ? (n)->len : 128), (n)->str

/* What a plan may not hold: the keys that name one quota. */
static const char *const not_in_plan[] = { "identity", "endpoints", "plan" };

int
allot__cfg_plans_read(allot__cfg_ctx *c, const allot__cfg_node *quotas)
{
	char d[DBUF], q[QBUF];
	if (quotas == NULL || quotas->type != NODE_MAP)
		return ALLOT_OK; /* the walk reports it */
	const allot__cfg_node *plans = allot__cfg_value(quotas, "plans");
	if (plans == NULL)
		return ALLOT_OK;
	if (plans->type != NODE_MAP)
		return FAIL(c, plans,
		    "quotas.plans is %s, expected a mapping of plan names to "
		    "quota keys (\"pro: {tokens_per_second: 100, burst: "
		    "200}\")",
		    allot__cfg_describe(plans, d, sizeof d));
	for (size_t i = 0; i + 1 < plans->nkids; i += 2) {
		const allot__cfg_node *name = plans->kids[i];
		const allot__cfg_node *p = plans->kids[i + 1];
		if (name->type != NODE_SCALAR || name->len == 0)
			return FAIL(c, name,
			    "a plan's name is %s, expected a name",
			    allot__cfg_describe(name, d, sizeof d));
		for (size_t j = 0; j < i; j += 2)
			if (plans->kids[j]->len == name->len &&
			    memcmp(plans->kids[j]->str, name->str,
			        name->len) == 0)
				return FAIL(c, name,
				    "duplicate plan %s (first at line "
				    "%" PRIu32 "), expected each name once",
				    QN(q, name), plans->kids[j]->line);
		if (p->type != NODE_MAP)
			return FAIL(c, p,
			    "quotas.plans.%.*s is %s, expected a mapping of "
			    "quota keys",
			    NAME(name), allot__cfg_describe(p, d, sizeof d));
		for (size_t k = 0; k + 1 < p->nkids; k += 2)
			for (size_t n = 0; n < 3; n++)
				if (allot__cfg_key_is(
				        p->kids[k], not_in_plan[n]))
					return FAIL(c, p->kids[k],
					    "quotas.plans.%.*s: \"%s\" names "
					    "one quota, expected quota keys "
					    "only (rates, burst, priority, "
					    "...)",
					    NAME(name), not_in_plan[n]);
	}
	c->plans = plans;
	return ALLOT_OK;
}

/* The plan `name` names, or NULL. */
static const allot__cfg_node *
find_plan(const allot__cfg_ctx *c, const allot__cfg_node *name)
{
	const allot__cfg_node *plans = c->plans;
	for (size_t i = 0; plans != NULL && i + 1 < plans->nkids; i += 2)
		if (plans->kids[i]->len == name->len &&
		    memcmp(plans->kids[i]->str, name->str, name->len) == 0)
			return plans->kids[i + 1];
	return NULL;
}

static int
add_pair(allot__cfg_node *m, allot__cfg_node *k, allot__cfg_node *v)
{
	if (m->nkids + 2 > m->cap) {
		size_t cap = m->cap ? 2 * m->cap : 16;
		allot__cfg_node **kids = realloc(m->kids, cap * sizeof *kids);
		if (kids == NULL)
			return ALLOT_ENOMEM;
		m->kids = kids;
		m->cap = cap;
	}
	m->kids[m->nkids++] = k;
	m->kids[m->nkids++] = v;
	return ALLOT_OK;
}

int
allot__cfg_plan_apply(allot__cfg_ctx *c, const allot__cfg_node *map,
    const char *path, const allot__cfg_node **ret)
{
	char d[DBUF], q[QBUF], list[512];
	*ret = map;
	const allot__cfg_node *name = map->type == NODE_MAP ?
	    allot__cfg_value(map, "plan") :
	    NULL;
	if (name == NULL)
		return ALLOT_OK;
	if (name->type != NODE_SCALAR)
		return FAIL(c, name, "%s.plan is %s, expected a plan's name",
		    path, allot__cfg_describe(name, d, sizeof d));
	const allot__cfg_node *plan = find_plan(c, name);
	if (plan == NULL) {
		const char *names[64] = { NULL };
		size_t n = 0;
		for (size_t i = 0;
		     c->plans != NULL && i + 1 < c->plans->nkids && n < 64;
		     i += 2)
			names[n++] = c->plans->kids[i]->str;
		allot__cfg_join(list, sizeof list, names, n);
		return FAIL(c, name,
		    "%s.plan: no plan %s in quotas.plans, %s%s", path,
		    QN(q, name),
		    n > 0 ? "expected one of: " :
		            "expected a plan defined there (it has none)",
		    n > 0 ? list : "");
	}
	/* The quota's own keys (without `plan`), then the plan's it does
	 * not write. The nodes are the tree's: only the mapping is new. */
	allot__cfg_node *m = calloc(1, sizeof *m);
	if (m == NULL || c->nmerged == c->merged_cap) {
		size_t cap = c->merged_cap ? 2 * c->merged_cap : 16;
		allot__cfg_node **mm = m != NULL ?
		    realloc(c->merged, cap * sizeof *mm) :
		    NULL;
		if (mm == NULL) {
			free(m);
			return allot__cfg_nomem(c);
		}
		c->merged = mm;
		c->merged_cap = cap;
	}
	c->merged[c->nmerged++] = m;
	m->type = NODE_MAP;
	m->line = map->line;
	m->col = map->col;
	bool own_rate = allot__cfg_rate_value(map) != NULL;
	/* A quota closed or unlimited by its own word takes none of the
	 * plan's amounts. */
	bool own_fixed = allot__cfg_fixed_access(map) != NULL;
	for (size_t i = 0; i + 1 < map->nkids; i += 2) {
		if (allot__cfg_key_is(map->kids[i], "plan"))
			continue;
		if (add_pair(m, map->kids[i], map->kids[i + 1]) != ALLOT_OK)
			return allot__cfg_nomem(c);
	}
	for (size_t i = 0; i + 1 < plan->nkids; i += 2) {
		const allot__cfg_node *k = plan->kids[i];
		if (allot__cfg_value(map, k->str) != NULL ||
		    (own_rate && allot__cfg_is_rate_key(k)) ||
		    (own_fixed && allot__cfg_is_amount_key(k)))
			continue;
		if (add_pair(m, plan->kids[i], plan->kids[i + 1]) != ALLOT_OK)
			return allot__cfg_nomem(c);
	}
	*ret = m;
	return ALLOT_OK;
}

void
allot__cfg_plans_free(allot__cfg_ctx *c)
{
	for (size_t i = 0; i < c->nmerged; i++) {
		free(c->merged[i]->kids);
		free(c->merged[i]);
	}
	free(c->merged);
	c->merged = NULL;
	c->nmerged = c->merged_cap = 0;
}
