/* SPDX-License-Identifier: MIT */
/*
 * The quota file loader's schema walk (config_parse.h): every key and
 * value of the tree is checked against docs/configuration.md and fills
 * the allot_config, section by section in file order so that the first
 * bad value in the file is the one reported. Unknown, duplicate and
 * missing keys are errors. What spans sections is left to
 * config_check.c, because YAML mappings are unordered.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_parse.h"
#include "name.h"

static bool
key_is(const allot__cfg_node *k, const char *name)
{
	size_t len = strlen(name);
	return k->len == len && memcmp(k->str, name, len) == 0;
}

static size_t
key_index(const allot__cfg_node *k, const char *const *keys, size_t nkeys)
{
	size_t i;
	for (i = 0; i < nkeys; i++)
		if (key_is(k, keys[i]))
			break;
	return i;
}

/* Check that `map` is a mapping whose keys are all in `keys`, each at
 * most once, and fill vals[i] with the value of keys[i] (NULL if absent).
 */
static int
walk_map(allot__cfg_ctx *c, const allot__cfg_node *map, const char *what,
    const char *const *keys, size_t nkeys, const allot__cfg_node **vals)
{
	const allot__cfg_node *seen[8] = { NULL };
	char d[DBUF], q[QBUF], list[256];
	for (size_t i = 0; i < nkeys; i++)
		vals[i] = NULL;
	if (map->type != NODE_MAP)
		return FAIL(c, map, "%s is %s, expected a mapping", what,
		    allot__cfg_describe(map, d, sizeof d));
	for (size_t i = 0; i + 1 < map->nkids; i += 2) {
		const allot__cfg_node *k = map->kids[i];
		size_t j = key_index(k, keys, nkeys);
		if (j == nkeys) {
			allot__cfg_join(list, sizeof list, keys, nkeys);
			return FAIL(c, k,
			    "unknown key %s in %s, expected one of: %s",
			    QN(q, k), what, list);
		}
		if (seen[j] != NULL)
			return FAIL(c, k,
			    "duplicate key %s in %s (first at line %" PRIu32
			    "), expected each key once",
			    QN(q, k), what, seen[j]->line);
		seen[j] = k;
		vals[j] = map->kids[i + 1];
	}
	return ALLOT_OK;
}

/* The first required key missing from vals, reported at the mapping. */
static int
need(allot__cfg_ctx *c, const allot__cfg_node *map, const char *what,
    const char *const *keys, const allot__cfg_node **vals, size_t nreq)
{
	char list[128];
	for (size_t i = 0; i < nreq; i++) {
		if (vals[i] != NULL)
			continue;
		allot__cfg_join(list, sizeof list, keys, nreq);
		return FAIL(c, map,
		    "missing required key \"%s\" in %s, expected all of: %s",
		    keys[i], what, list);
	}
	return ALLOT_OK;
}

/* Keys of a quota; the required ones come first. */
enum {
	QK_RATE,
	QK_BURST,
	QK_PRIORITY,
	QK_SHADOW,
	QK_FALLBACK,
	QK_SHARED, /* quotas.default only */
	QK_IDENTITY, /* quotas.callers only */
};
static const char *const default_keys[] = { "tokens_per_second", "burst",
	"priority", "shadow", "fallback", "shared" };
/* Same indices as above except identity, which is listed first. */
static const char *const caller_keys[] = { "identity", "tokens_per_second",
	"burst", "priority", "shadow", "fallback" };

static int
parse_fallback(allot__cfg_ctx *c, const allot__cfg_node *n, const char *what,
    allot_fallback *ret)
{
	char q[QBUF];
	const char *s = NULL;
	int rc = allot__cfg_get_string(
	    c, n, what, 32, "one of: static_share, open, closed", &s);
	if (rc != ALLOT_OK)
		return rc;
	if (strcmp(s, "static_share") == 0)
		*ret = ALLOT_FALLBACK_STATIC_SHARE;
	else if (strcmp(s, "open") == 0)
		*ret = ALLOT_FALLBACK_OPEN;
	else if (strcmp(s, "closed") == 0)
		*ret = ALLOT_FALLBACK_CLOSED;
	else
		return FAIL(c, n,
		    "%s is %s, expected one of: static_share, open, closed",
		    what, QN(q, n));
	return ALLOT_OK;
}

/* One quota mapping: quotas.default (`path` "quotas.default") or an entry
 * of quotas.callers. */
static int
parse_quota(allot__cfg_ctx *c, const allot__cfg_node *map, const char *path,
    bool is_default, allot__quota *q, allot__cfg_meta *m)
{
	const char *const *keys = is_default ? default_keys : caller_keys;
	const allot__cfg_node *vals[6];
	char what[96];
	int rc = walk_map(c, map, path, keys, 6, vals);
	if (rc == ALLOT_OK)
		rc = need(c, map, path, keys, vals, is_default ? 2 : 3);
	if (rc != ALLOT_OK)
		return rc;
	q->line = map->line;
	q->shared = is_default;
	q->fallback = ALLOT_FALLBACK_STATIC_SHARE;
	for (size_t i = 0; i + 1 < map->nkids && rc == ALLOT_OK; i += 2) {
		const allot__cfg_node *k = map->kids[i], *v = map->kids[i + 1];
		size_t j = key_index(k, keys, 6);
		int field = is_default ? (int) j :
		    j == 0             ? QK_IDENTITY :
		                         (int) j - 1;
		const char *s = NULL;
		snprintf(what, sizeof what, "%s.%s", path, keys[j]);
		switch (field) {
		case QK_IDENTITY:
			rc = allot__cfg_get_string(c, v, what,
			    ALLOT_IDENTITY_MAX,
			    "a verified caller identity such as a SPIFFE ID",
			    &s);
			m->ident = v;
			if (rc != ALLOT_OK)
				break;
			/* "default" names the default quota in statistics
			 * and in the keys an agent registers. */
			if (!allot__name_valid(s, ALLOT__NAME_MAX, true))
				rc = FAIL(c, v,
				    "%s must be 1-%u " ALLOT__NAME_RULE
				    ", the same rule allotd applies to the "
				    "keys of a Register",
				    what, ALLOT__NAME_MAX);
			else if (strcmp(s, "default") == 0)
				rc = FAIL(c, v,
				    "%s \"default\" is reserved for "
				    "quotas.default, expected a caller's own "
				    "identity",
				    what);
			else if ((q->identity = strdup(s)) == NULL)
				rc = allot__cfg_nomem(c);
			break;
		case QK_RATE:
			rc = allot__cfg_get_rate(c, v, what, &q->rate);
			break;
		case QK_BURST:
			rc = allot__cfg_get_burst(c, v, what, &q->burst);
			m->burst = v;
			break;
		case QK_PRIORITY:
			rc = allot__cfg_get_string(c, v, what,
			    ALLOT__CLASS_MAX,
			    "a priority class named in shed_order", &s);
			m->prio = v;
			break;
		case QK_SHADOW:
			rc = allot__cfg_get_bool(c, v, what, &q->shadow);
			break;
		case QK_FALLBACK:
			rc = parse_fallback(c, v, what, &q->fallback);
			break;
		case QK_SHARED:
			rc = allot__cfg_get_bool(c, v, what, &q->shared);
			break;
		default: break;
		}
	}
	return rc;
}

static int
parse_callers(allot__cfg_ctx *c, const allot__cfg_node *seq)
{
	allot_config *cfg = c->cfg;
	char d[DBUF], path[48];
	if (seq->type != NODE_SEQ)
		return FAIL(c, seq,
		    "quotas.callers is %s, expected a sequence of callers "
		    "(\"- identity: ...\"; [] for none)",
		    allot__cfg_describe(seq, d, sizeof d));
	if (seq->nkids > ALLOT__MAX_CALLERS)
		return FAIL(c, seq->kids[ALLOT__MAX_CALLERS],
		    "too many callers (%zu), expected at most %d", seq->nkids,
		    ALLOT__MAX_CALLERS);
	if (seq->nkids == 0)
		return ALLOT_OK;
	cfg->callers = calloc(seq->nkids, sizeof *cfg->callers);
	c->meta = calloc(seq->nkids, sizeof *c->meta);
	if (cfg->callers == NULL || c->meta == NULL)
		return allot__cfg_nomem(c);
	cfg->ncallers = seq->nkids;
	for (size_t i = 0; i < seq->nkids; i++) {
		snprintf(path, sizeof path, "quotas.callers[%zu]", i);
		int rc = parse_quota(c, seq->kids[i], path, false,
		    &cfg->callers[i], &c->meta[i]);
		if (rc != ALLOT_OK)
			return rc;
	}
	return ALLOT_OK;
}

static int
parse_weights(allot__cfg_ctx *c, const allot__cfg_node *map)
{
	allot_config *cfg = c->cfg;
	char d[DBUF], q[QBUF], what[ALLOT__ENDPOINT_MAX + 64];
	if (map->type != NODE_MAP)
		return FAIL(c, map,
		    "quotas.endpoint_weights is %s, expected a mapping of "
		    "endpoint: weight",
		    allot__cfg_describe(map, d, sizeof d));
	size_t pairs = map->nkids / 2;
	size_t cap = pairs < ALLOT__MAX_ENDPOINTS ? pairs :
	                                            ALLOT__MAX_ENDPOINTS;
	if (cap > 0) {
		cfg->endpoints = calloc(cap, sizeof *cfg->endpoints);
		if (cfg->endpoints == NULL)
			return allot__cfg_nomem(c);
	}
	for (size_t i = 0; i < map->nkids; i += 2) {
		const allot__cfg_node *k = map->kids[i], *v = map->kids[i + 1];
		const char *name = NULL;
		int rc = allot__cfg_get_string(c, k, "endpoint name",
		    ALLOT__ENDPOINT_MAX,
		    "an endpoint name such as \"/export\"", &name);
		if (rc != ALLOT_OK)
			return rc;
		for (size_t j = 0; j < i; j += 2) {
			const allot__cfg_node *o = map->kids[j];
			if (o->len == k->len &&
			    memcmp(o->str, k->str, k->len) == 0)
				return FAIL(c, k,
				    "duplicate key %s in "
				    "quotas.endpoint_weights (first at line "
				    "%" PRIu32
				    "), expected each endpoint once",
				    QN(q, k), o->line);
		}
		snprintf(what, sizeof what, "the weight of %s", QN(q, k));
		if (strcmp(name, "default") == 0) {
			rc = allot__cfg_get_weight(
			    c, v, what, &cfg->default_weight);
			if (rc != ALLOT_OK)
				return rc;
			continue;
		}
		if (cfg->nendpoints == ALLOT__MAX_ENDPOINTS)
			return FAIL(c, k,
			    "too many endpoints in quotas.endpoint_weights, "
			    "expected at most %d besides default",
			    ALLOT__MAX_ENDPOINTS);
		allot__endpoint *ep = &cfg->endpoints[cfg->nendpoints];
		rc = allot__cfg_get_weight(c, v, what, &ep->weight);
		if (rc != ALLOT_OK)
			return rc;
		if ((ep->name = strdup(name)) == NULL)
			return allot__cfg_nomem(c);
		cfg->nendpoints++;
	}
	return ALLOT_OK;
}

static int
parse_shed_order(allot__cfg_ctx *c, const allot__cfg_node *seq)
{
	allot_config *cfg = c->cfg;
	char d[DBUF], q[QBUF];
	if (seq->type != NODE_SEQ)
		return FAIL(c, seq,
		    "quotas.global_ceiling.shed_order is %s, expected a "
		    "sequence of class names, shed first to last",
		    allot__cfg_describe(seq, d, sizeof d));
	if (seq->nkids == 0)
		return FAIL(c, seq,
		    "quotas.global_ceiling.shed_order is empty, expected at "
		    "least one class name");
	if (seq->nkids > ALLOT__MAX_CLASSES)
		return FAIL(c, seq->kids[ALLOT__MAX_CLASSES],
		    "too many classes in shed_order (%zu), expected at most "
		    "%d",
		    seq->nkids, ALLOT__MAX_CLASSES);
	for (size_t i = 0; i < seq->nkids; i++) {
		const allot__cfg_node *n = seq->kids[i];
		const char *s = NULL;
		int rc = allot__cfg_get_string(c, n, "shed_order entry",
		    ALLOT__CLASS_MAX, "a priority class name", &s);
		if (rc != ALLOT_OK)
			return rc;
		for (size_t j = 0; j < i; j++)
			if (strcmp(cfg->classes[j], s) == 0)
				return FAIL(c, n,
				    "duplicate class %s in shed_order (first "
				    "at line %" PRIu32 ", column %" PRIu32
				    "), expected each class once",
				    QN(q, n), seq->kids[j]->line,
				    seq->kids[j]->col);
		if ((cfg->classes[i] = strdup(s)) == NULL)
			return allot__cfg_nomem(c);
		cfg->nclasses++;
	}
	return ALLOT_OK;
}

static int
parse_ceiling(allot__cfg_ctx *c, const allot__cfg_node *map)
{
	static const char *const keys[] = { "tokens_per_second",
		"shed_order" };
	const char *path = "quotas.global_ceiling";
	const allot__cfg_node *vals[2];
	int rc = walk_map(c, map, path, keys, 2, vals);
	if (rc == ALLOT_OK)
		rc = need(c, map, path, keys, vals, 1);
	if (rc != ALLOT_OK)
		return rc;
	/* Fields in file order, so the first bad one is reported. */
	for (size_t i = 0; i + 1 < map->nkids && rc == ALLOT_OK; i += 2) {
		const allot__cfg_node *v = map->kids[i + 1];
		if (key_is(map->kids[i], "tokens_per_second"))
			rc = allot__cfg_get_rate(c, v,
			    "quotas.global_ceiling.tokens_per_second",
			    &c->cfg->ceiling_rate);
		else
			rc = parse_shed_order(c, v);
	}
	return rc;
}

int
allot__cfg_parse_root(allot__cfg_ctx *c, const allot__cfg_node *root)
{
	static const char *const top_keys[] = { "quotas" };
	enum { K_DEFAULT, K_CALLERS, K_WEIGHTS, K_CEILING };
	static const char *const keys[] = { "default", "callers",
		"endpoint_weights", "global_ceiling" };
	const allot__cfg_node *top[1], *vals[4];
	char d[DBUF];
	if (root == NULL || allot__cfg_is_null(root))
		return FAIL_AT(c, root ? root->line : 1, root ? root->col : 1,
		    "the file is empty, expected a top-level \"quotas\" "
		    "mapping");
	if (root->type != NODE_MAP)
		return FAIL(c, root,
		    "the document is %s, expected a mapping with a top-level "
		    "\"quotas\" key",
		    allot__cfg_describe(root, d, sizeof d));
	int rc = walk_map(c, root, "the top level", top_keys, 1, top);
	if (rc != ALLOT_OK)
		return rc;
	if (top[0] == NULL)
		return FAIL(c, root,
		    "missing required key \"quotas\" at the top level, "
		    "expected a top-level \"quotas\" mapping");
	const allot__cfg_node *quotas = top[0];
	rc = walk_map(c, quotas, "quotas", keys, 4, vals);
	if (rc == ALLOT_OK)
		rc = need(c, quotas, "quotas", keys, vals, 1);
	/* Sections in file order, so the first bad one is reported. */
	for (size_t i = 0; i + 1 < quotas->nkids && rc == ALLOT_OK; i += 2) {
		const allot__cfg_node *v = quotas->kids[i + 1];
		switch (key_index(quotas->kids[i], keys, 4)) {
		case K_DEFAULT:
			rc = parse_quota(c, v, "quotas.default", true,
			    &c->cfg->def, &c->def);
			break;
		case K_CALLERS: rc = parse_callers(c, v); break;
		case K_WEIGHTS: rc = parse_weights(c, v); break;
		case K_CEILING: rc = parse_ceiling(c, v); break;
		default: break;
		}
	}
	return rc;
}
