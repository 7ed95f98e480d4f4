/* SPDX-License-Identifier: MIT */
/*
 * The quota file loader's schema walk (config_parse.h): every key and
 * value of the tree is checked against docs/configuration.md and fills
 * the allot_config, section by section in file order so that the first
 * bad value in the file is the one reported. Unknown, duplicate and
 * missing keys are errors. The file has two scopes: `quotas`, for every
 * service, and `services`, what each named service overrides of it; both
 * are walked by the same functions. A caller's endpoint quotas become
 * entries of its scope's callers, right after their caller. A quota's
 * keys, and how each is read, come from the field table
 * (config_fields.h): the rows that take its kind of quota, each read as
 * its type says. What spans sections is left to config_check.c,
 * because YAML mappings are unordered.
 */
#include <assert.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_fields.h"
#include "config_parse.h"
#include "name.h"

/* Bytes of a path in messages ("services.NAME.callers[N].endpoints.E"). */
#define PATH_MAX_ 512

bool
allot__cfg_key_is(const allot__cfg_node *k, const char *name)
{
	size_t len = strlen(name);
	return k->len == len && memcmp(k->str, name, len) == 0;
}

static size_t
key_index(const allot__cfg_node *k, const char *const *keys, size_t nkeys)
{
	size_t i;
	for (i = 0; i < nkeys; i++)
		if (allot__cfg_key_is(k, keys[i]))
			break;
	return i;
}

/* The rate keys; a quota has exactly one of them. */
#define NUNITS 4
static const char *const units[NUNITS] = { "tokens_per_second",
	"tokens_per_minute", "tokens_per_hour", "tokens_per_day" };
static const uint32_t unit_secs[NUNITS] = { 1, 60, 3600, 86400 };
#define RATE_KEYS                                                    \
	"tokens_per_second", "tokens_per_minute", "tokens_per_hour", \
	    "tokens_per_day"
#define UNIT_LIST                                                 \
	"tokens_per_second, tokens_per_minute, tokens_per_hour, " \
	"tokens_per_day"

static size_t
unit_index(const allot__cfg_node *k)
{
	return key_index(k, units, NUNITS);
}

bool
allot__cfg_is_rate_key(const allot__cfg_node *k)
{
	return unit_index(k) < NUNITS;
}

const allot__cfg_node *
allot__cfg_value(const allot__cfg_node *map, const char *key)
{
	for (size_t i = 0; map != NULL && i + 1 < map->nkids; i += 2)
		if (allot__cfg_key_is(map->kids[i], key))
			return map->kids[i + 1];
	return NULL;
}

const allot__cfg_node *
allot__cfg_rate_value(const allot__cfg_node *map)
{
	for (size_t i = 0; map != NULL && i + 1 < map->nkids; i += 2)
		if (unit_index(map->kids[i]) < NUNITS)
			return map->kids[i + 1];
	return NULL;
}

const char *
allot__cfg_fixed_access(const allot__cfg_node *map)
{
	const allot__cfg_node *v = allot__cfg_value(map, "access");
	if (v == NULL || v->type != NODE_SCALAR)
		return NULL;
	if (v->len == 6 && memcmp(v->str, "closed", 6) == 0)
		return "closed";
	if (v->len == 9 && memcmp(v->str, "unlimited", 9) == 0)
		return "unlimited";
	return NULL;
}

bool
allot__cfg_is_amount_key(const allot__cfg_node *k)
{
	return allot__cfg_is_rate_key(k) || allot__cfg_key_is(k, "burst") ||
	    allot__cfg_key_is(k, "candidate");
}

/* Check that `map` is a mapping whose keys are all in `keys`, each at
 * most once, and fill vals[i] with the value of keys[i] (NULL if absent).
 * An unknown "tokens_per_..." key where rates are allowed is an unknown
 * unit, and its message names the known ones. */
static int
walk_map(allot__cfg_ctx *c, const allot__cfg_node *map, const char *what,
    const char *const *keys, size_t nkeys, const allot__cfg_node **vals)
{
	const allot__cfg_node *seen[ALLOT__QKEYS_MAX] = { NULL };
	char d[DBUF], q[QBUF], list[512];
	/* Where every unit is allowed (not in global_ceiling). */
	bool rates = false;
	assert(nkeys <= ALLOT__QKEYS_MAX);
	for (size_t i = 0; i < nkeys; i++)
		rates |= strcmp(keys[i], units[NUNITS - 1]) == 0;
	for (size_t i = 0; i < nkeys; i++)
		vals[i] = NULL;
	if (map->type != NODE_MAP)
		return FAIL(c, map, "%s is %s, expected a mapping", what,
		    allot__cfg_describe(map, d, sizeof d));
	for (size_t i = 0; i + 1 < map->nkids; i += 2) {
		const allot__cfg_node *k = map->kids[i];
		size_t j = key_index(k, keys, nkeys);
		if (j == nkeys && rates && k->len > 11 &&
		    memcmp(k->str, "tokens_per_", 11) == 0)
			return FAIL(c, k,
			    "unknown unit %s in %s, expected one "
			    "of: " UNIT_LIST,
			    QN(q, k), what);
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

/* The one rate key of a mapping whose keys walk_map() accepted: its
 * value into *ret_v and its unit's seconds into *ret_unit (NULL and 1
 * when there is none); two of them are an error at the second. */
static int
find_unit(allot__cfg_ctx *c, const allot__cfg_node *map, const char *what,
    const allot__cfg_node **ret_v, uint32_t *ret_unit)
{
	const allot__cfg_node *first = NULL;
	char q1[QBUF], q2[QBUF];
	*ret_v = NULL;
	*ret_unit = 1;
	for (size_t i = 0; i + 1 < map->nkids; i += 2) {
		const allot__cfg_node *k = map->kids[i];
		size_t u = unit_index(k);
		if (u == NUNITS)
			continue;
		if (first != NULL)
			return FAIL(c, k,
			    "%s has both %s (line %" PRIu32 ") and %s, "
			    "expected exactly one rate key of: " UNIT_LIST,
			    what, QN(q1, first), first->line, QN(q2, k));
		first = k;
		*ret_v = map->kids[i + 1];
		*ret_unit = unit_secs[u];
	}
	return ALLOT_OK;
}

/* The keys of a quota mapping of `scope` (ALLOT__QS_*) in the order
 * the messages list them: a caller's identity, the fields of the table
 * that take it (a rate as its units) with those listed last after the
 * others, a caller's endpoints. rows[i] is the field of keys[i], NULL
 * for the identity and the endpoints. Returns the count. */
static size_t
quota_keys(unsigned scope, const char **keys, const allot__qfield **rows)
{
	size_t n = 0;
	if (scope == ALLOT__QS_CALLER) {
		rows[n] = NULL;
		keys[n++] = "identity";
	}
	for (int pass = 0; pass < 2; pass++) {
		bool last = pass == 1;
		for (size_t i = 0; i < allot__nqfields; i++) {
			const allot__qfield *f = &allot__qfields[i];
			bool listed_last = f->flags & ALLOT__QF_LISTED_LAST;
			if ((f->scopes & scope) == 0 || listed_last != last)
				continue;
			size_t nk = f->type == ALLOT__QT_RATE ? NUNITS : 1;
			for (size_t u = 0; u < nk; u++) {
				/* Room for a caller's endpoints; the
				 * config-fields test counts the keys. */
				assert(n < ALLOT__QKEYS_MAX - 1);
				if (n >= ALLOT__QKEYS_MAX - 1)
					break;
				rows[n] = f;
				keys[n++] = f->type == ALLOT__QT_RATE ?
				    units[u] :
				    f->key;
			}
		}
	}
	if (scope == ALLOT__QS_CALLER) {
		rows[n] = NULL;
		keys[n++] = "endpoints";
	}
	return n;
}

/* A word of field `f` (f->words): its index into *ret. */
static int
parse_word(allot__cfg_ctx *c, const allot__qfield *f, const allot__cfg_node *n,
    const char *what, int *ret)
{
	char q[QBUF], list[128], expect[160];
	size_t nw = 0;
	while (f->words[nw] != NULL)
		nw++;
	allot__cfg_join(list, sizeof list, f->words, nw);
	snprintf(expect, sizeof expect, "one of: %s", list);
	const char *s = NULL;
	int rc = allot__cfg_get_string(c, n, what, 32, expect, &s);
	if (rc != ALLOT_OK)
		return rc;
	for (size_t i = 0; i < nw; i++)
		if (strcmp(s, f->words[i]) == 0) {
			*ret = (int) i;
			return ALLOT_OK;
		}
	return FAIL(c, n, "%s is %s, expected %s", what, QN(q, n), expect);
}

/* Free text kept for review (owner, reason, a label's value): any UTF-8
 * but no control characters, which would break the log lines, tables
 * and audit rows it ends up in. A copy into *ret. */
static int
get_text(allot__cfg_ctx *c, const allot__cfg_node *n, const char *what,
    size_t max, const char *expect, char **ret)
{
	const char *s = NULL;
	int rc = allot__cfg_get_string(c, n, what, max, expect, &s);
	if (rc != ALLOT_OK)
		return rc;
	for (const unsigned char *p = (const unsigned char *) s; *p; p++)
		if (*p < 0x20 || *p == 0x7f)
			return FAIL(c, n,
			    "%s contains a control character, expected %s "
			    "on one line",
			    what, expect);
	free(*ret);
	if ((*ret = strdup(s)) == NULL)
		return allot__cfg_nomem(c);
	return ALLOT_OK;
}

/* labels: a mapping of name to value, kept as "name=value" in file
 * order. */
static int
parse_labels(allot__cfg_ctx *c, const allot__cfg_node *map, const char *what,
    const allot__qfield *f, allot__quota *q)
{
	char ***labels = &ALLOT__QF(char **, q, f->off);
	size_t *nlabels = &ALLOT__QF(size_t, q, f->off2);
	char d[DBUF], qb[QBUF], vwhat[PATH_MAX_ + 80];
	if (map->type != NODE_MAP)
		return FAIL(c, map,
		    "%s is %s, expected a mapping of label name: value", what,
		    allot__cfg_describe(map, d, sizeof d));
	size_t n = map->nkids / 2;
	if (n > ALLOT__MAX_LABELS)
		return FAIL(c, map->kids[2 * ALLOT__MAX_LABELS],
		    "too many labels in %s (%zu), expected at most %d", what,
		    n, ALLOT__MAX_LABELS);
	if (n == 0)
		return ALLOT_OK;
	*labels = calloc(n, sizeof **labels);
	if (*labels == NULL)
		return allot__cfg_nomem(c);
	for (size_t i = 0; i + 1 < map->nkids; i += 2) {
		const allot__cfg_node *k = map->kids[i], *v = map->kids[i + 1];
		const char *name = NULL;
		char *val = NULL;
		int rc = allot__cfg_get_string(c, k, "label name",
		    ALLOT__LABEL_MAX / 2, "a label name such as \"team\"",
		    &name);
		if (rc != ALLOT_OK)
			return rc;
		if (!allot__name_valid(name, ALLOT__LABEL_MAX / 2, true) ||
		    strchr(name, '=') != NULL)
			return FAIL(c, k,
			    "label name %s has a character that is not "
			    "allowed, expected " ALLOT__NAME_RULE " other "
			    "than '='",
			    QN(qb, k));
		for (size_t j = 0; j < i; j += 2) {
			const allot__cfg_node *o = map->kids[j];
			if (o->len == k->len &&
			    memcmp(o->str, k->str, k->len) == 0)
				return FAIL(c, k,
				    "duplicate label %s in %s (first at line "
				    "%" PRIu32 "), expected each label once",
				    QN(qb, k), what, o->line);
		}
		snprintf(vwhat, sizeof vwhat, "%s.%s", what, name);
		rc = get_text(c, v, vwhat, ALLOT__LABEL_MAX - k->len - 1,
		    "a label value", &val);
		if (rc != ALLOT_OK)
			return rc;
		size_t len = k->len + 1 + strlen(val) + 1;
		char *s = malloc(len);
		if (s == NULL) {
			free(val);
			return allot__cfg_nomem(c);
		}
		snprintf(s, len, "%s=%s", name, val);
		free(val);
		(*labels)[(*nlabels)++] = s;
	}
	return ALLOT_OK;
}

/* candidate: a rate (any unit) and a burst evaluated in shadow. */
static int
parse_candidate(allot__cfg_ctx *c, const allot__cfg_node *map,
    const char *path, const allot__qfield *f, allot__quota *q)
{
	static const char *const keys[] = { RATE_KEYS, "burst" };
	const allot__cfg_node *vals[NUNITS + 1], *rv = NULL;
	char what[PATH_MAX_ + 32];
	uint32_t unit = 1;
	int rc = walk_map(c, map, path, keys, NUNITS + 1, vals);
	if (rc == ALLOT_OK)
		rc = find_unit(c, map, path, &rv, &unit);
	if (rc != ALLOT_OK)
		return rc;
	if (rv == NULL || vals[NUNITS] == NULL)
		return FAIL(c, map,
		    "missing required key \"%s\" in %s, expected a rate "
		    "(one of: " UNIT_LIST ") and a burst",
		    rv == NULL ? units[0] : "burst", path);
	for (size_t u = 0; u < NUNITS; u++)
		if (vals[u] != NULL)
			snprintf(
			    what, sizeof what, "%.400s.%s", path, units[u]);
	/* In file order, so the first bad value is the one reported. */
	for (size_t i = 0; i + 1 < map->nkids && rc == ALLOT_OK; i += 2) {
		const allot__cfg_node *v = map->kids[i + 1];
		if (v == rv) {
			rc = allot__cfg_get_rate_per(
			    c, v, what, unit, &ALLOT__QF(double, q, f->off));
		} else {
			char bw[PATH_MAX_ + 8];
			snprintf(bw, sizeof bw, "%.400s.burst", path);
			rc = allot__cfg_get_burst(
			    c, v, bw, &ALLOT__QF(double, q, f->off2));
		}
	}
	return rc;
}

/* The required keys of a quota mapping whose keys walk_map() accepted
 * into vals (keys and rows from quota_keys()): a caller's identity and
 * the required fields, reported as before units existed (a missing rate
 * is a missing "tokens_per_second"). `rate`: the value of its rate key,
 * whichever unit. */
static int
need_quota(allot__cfg_ctx *c, const allot__cfg_node *map, const char *path,
    const char *const *keys, const allot__qfield *const *rows, size_t nkeys,
    const allot__cfg_node *const *vals, const allot__cfg_node *rate)
{
	const char *req[ALLOT__QKEYS_MAX];
	const allot__cfg_node *rv[ALLOT__QKEYS_MAX];
	size_t n = 0;
	/* A quota that admits nobody or everybody has no amounts. */
	const char *fixed = allot__cfg_fixed_access(map);
	for (size_t i = 0; fixed != NULL && i + 1 < map->nkids; i += 2)
		if (allot__cfg_is_amount_key(map->kids[i]))
			return FAIL(c, map->kids[i],
			    "%s.%.*s: a quota with access: %s has no rate, "
			    "burst or candidate (it admits %s), expected "
			    "none, or access: limited",
			    path, (int) map->kids[i]->len, map->kids[i]->str,
			    fixed,
			    strcmp(fixed, "closed") == 0 ? "nobody" :
			                                   "everybody");
	for (size_t i = 0; fixed == NULL && i < nkeys; i++) {
		const allot__qfield *f = rows[i];
		bool required;
		if (f == NULL)
			required = strcmp(keys[i], "identity") == 0;
		else /* a rate once, by its first unit */
			required = (f->flags & ALLOT__QF_REQUIRED) &&
			    strcmp(keys[i], f->key) == 0;
		if (!required)
			continue;
		req[n] = keys[i];
		rv[n++] = f != NULL && f->type == ALLOT__QT_RATE ? rate :
		                                                   vals[i];
	}
	return need(c, map, path, req, rv, n);
}

/* A caller's identity: the name rule, and not "default". */
static int
parse_identity(allot__cfg_ctx *c, const allot__cfg_node *v, const char *what,
    allot__quota *q)
{
	const char *s = NULL;
	int rc = allot__cfg_get_string(c, v, what, ALLOT_IDENTITY_MAX,
	    "a verified caller identity such as a SPIFFE ID", &s);
	if (rc != ALLOT_OK)
		return rc;
	/* "default" names the default quota in statistics and in the keys
	 * an agent registers. */
	if (!allot__name_valid(s, ALLOT__NAME_MAX, true))
		return FAIL(c, v,
		    "%s must be 1-%u " ALLOT__NAME_RULE
		    ", the same rule allotd applies to the keys of a Register",
		    what, ALLOT__NAME_MAX);
	if (strcmp(s, "default") == 0)
		return FAIL(c, v,
		    "%s \"default\" is reserved for quotas.default, expected "
		    "a caller's own identity",
		    what);
	if ((q->identity = strdup(s)) == NULL)
		return allot__cfg_nomem(c);
	return ALLOT_OK;
}

/* Field `f` of `q` from its value `v` at `what`; `unit`: the seconds of
 * the quota's rate unit, in which its other rates are written. */
static int
parse_field(allot__cfg_ctx *c, const allot__qfield *f,
    const allot__cfg_node *v, const char *what, uint32_t unit, allot__quota *q)
{
	const char *s = NULL;
	int rc;
	switch (f->type) {
	case ALLOT__QT_RATE:
		q->unit_s = unit;
		return allot__cfg_get_rate_per(
		    c, v, what, unit, &ALLOT__QF(double, q, f->off));
	case ALLOT__QT_BURST:
		return allot__cfg_get_burst(
		    c, v, what, &ALLOT__QF(double, q, f->off));
	case ALLOT__QT_CLASS:
		/* Resolved once the classes are known (config_check.c):
		 * shed_order may come later in the file. */
		return allot__cfg_get_string(
		    c, v, what, f->max, f->expect, &s);
	case ALLOT__QT_BOOL:
		return allot__cfg_get_bool(
		    c, v, what, &ALLOT__QF(bool, q, f->off));
	case ALLOT__QT_WORD:
		return parse_word(c, f, v, what, &ALLOT__QF(int, q, f->off));
	case ALLOT__QT_TEXT:
		return get_text(c, v, what, f->max, f->expect,
		    &ALLOT__QF(char *, q, f->off));
	case ALLOT__QT_PER_UNIT: {
		double x = 0;
		rc = allot__cfg_get_amount(c, v, what, &x);
		if (rc == ALLOT_OK)
			ALLOT__QF(double, q, f->off) = x / unit;
		return rc;
	}
	case ALLOT__QT_LABELS: return parse_labels(c, v, what, f, q);
	case ALLOT__QT_CANDIDATE: return parse_candidate(c, v, what, f, q);
	case ALLOT__QT_FRACTION:
		return allot__cfg_get_fraction(
		    c, v, what, &ALLOT__QF(double, q, f->off));
	}
	return ALLOT_OK;
}

/* What a quota of `scope` has for each field it does not set: its
 * default, or for an endpoint quota (`parent`, its caller) the caller's
 * value where the field is inherited. A class is inherited once it is
 * resolved (config_check.c). */
static int
field_defaults(allot__cfg_ctx *c, unsigned scope, const allot__quota *parent,
    allot__quota *q)
{
	for (size_t i = 0; i < allot__nqfields; i++) {
		const allot__qfield *f = &allot__qfields[i];
		void *at = (char *) q + f->off;
		if ((f->scopes & scope) == 0)
			continue;
		switch (f->type) {
		case ALLOT__QT_BOOL: *(bool *) at = f->dflt; break;
		case ALLOT__QT_FRACTION: *(double *) at = f->num; break;
		case ALLOT__QT_WORD: *(int *) at = 0; break;
		case ALLOT__QT_RATE:
		case ALLOT__QT_BURST:
		case ALLOT__QT_CLASS:
		case ALLOT__QT_TEXT:
		case ALLOT__QT_PER_UNIT:
		case ALLOT__QT_LABELS:
		case ALLOT__QT_CANDIDATE: break; /* 0 or NULL: none */
		}
		if (parent != NULL && (f->flags & ALLOT__QF_INHERIT) &&
		    allot__qfield_copy(q, parent, f) != ALLOT_OK)
			return allot__cfg_nomem(c);
	}
	return ALLOT_OK;
}

/* One quota mapping at `path` of `scope`: quotas.default, an entry of
 * callers, or an endpoint quota of caller `parent`. Its keys come from
 * the field table (config_fields.c), each read as its type says, in
 * file order so that the first bad value is the one reported. */
static int
parse_quota(allot__cfg_ctx *c, const allot__cfg_node *map, const char *path,
    unsigned scope, const allot__quota *parent, allot__quota *q,
    allot__cfg_meta *m)
{
	const char *keys[ALLOT__QKEYS_MAX];
	const allot__qfield *rows[ALLOT__QKEYS_MAX];
	const allot__cfg_node *vals[ALLOT__QKEYS_MAX], *rate = NULL;
	char what[PATH_MAX_ + 32], q1[QBUF];
	uint32_t unit = 1;
	size_t nkeys = quota_keys(scope, keys, rows);
	int rc = walk_map(c, map, path, keys, nkeys, vals);
	if (rc == ALLOT_OK)
		rc = find_unit(c, map, path, &rate, &unit);
	if (rc == ALLOT_OK)
		rc = need_quota(c, map, path, keys, rows, nkeys, vals, rate);
	if (rc == ALLOT_OK)
		rc = field_defaults(c, scope, parent, q);
	if (rc != ALLOT_OK)
		return rc;
	m->map = map;
	q->line = map->line;
	for (size_t i = 0; i + 1 < map->nkids && rc == ALLOT_OK; i += 2) {
		const allot__cfg_node *k = map->kids[i], *v = map->kids[i + 1];
		size_t j = key_index(k, keys, nkeys);
		snprintf(
		    what, sizeof what, "%s.%.*s", path, (int) k->len, k->str);
		if (j < nkeys && rows[j] != NULL) {
			rc = parse_field(c, rows[j], v, what, unit, q);
		} else if (allot__cfg_key_is(k, "identity")) {
			m->ident = v;
			rc = parse_identity(c, v, what, q);
		} else if (allot__cfg_key_is(k, "endpoints")) {
			m->eps = v;
		} else {
			rc = FAIL(c, k,
			    "unexpected key %s, expected a quota key",
			    QN(q1, k));
		}
	}
	return rc;
}

/* Room for one more entry in a scope's callers (and its meta). */
static int
grow(allot__cfg_ctx *c, allot__cfg_scope *sc, allot__quota **arr, size_t n,
    const allot__cfg_node *at, const char *prefix)
{
	if (n >= ALLOT__MAX_CALLERS)
		return FAIL(c, at,
		    "too many quotas in %s.callers (callers and their "
		    "endpoint quotas), expected at most %d",
		    prefix, ALLOT__MAX_CALLERS);
	if (n < sc->cap)
		return ALLOT_OK;
	size_t cap = sc->cap ? sc->cap * 2 : 8;
	allot__quota *q = realloc(*arr, cap * sizeof *q);
	if (q != NULL)
		*arr = q;
	allot__cfg_meta *m = realloc(sc->meta, cap * sizeof *m);
	if (m != NULL)
		sc->meta = m;
	if (q == NULL || m == NULL)
		return allot__cfg_nomem(c);
	memset(q + sc->cap, 0, (cap - sc->cap) * sizeof *q);
	memset(m + sc->cap, 0, (cap - sc->cap) * sizeof *m);
	sc->cap = cap;
	return ALLOT_OK;
}

static int
set_key(allot__cfg_ctx *c, const allot__quota *q, allot__cfg_meta *m)
{
	size_t len = allot__quota_key(q, NULL, 0);
	if ((m->key = malloc(len + 1)) == NULL)
		return allot__cfg_nomem(c);
	allot__quota_key(q, m->key, len + 1);
	return ALLOT_OK;
}

/* The endpoint quotas of caller `ci` (its `endpoints` mapping), appended
 * after it. */
static int
parse_endpoint_quotas(allot__cfg_ctx *c, allot__cfg_scope *sc,
    allot__quota **arr, size_t *n, size_t ci, const char *cpath,
    const char *prefix)
{
	const allot__cfg_node *map = sc->meta[ci].eps;
	char d[DBUF], qb[QBUF], path[PATH_MAX_ + 96];
	snprintf(path, sizeof path, "%s.endpoints", cpath);
	if (map->type != NODE_MAP)
		return FAIL(c, map,
		    "%s is %s, expected a mapping of endpoint: quota", path,
		    allot__cfg_describe(map, d, sizeof d));
	for (size_t i = 0; i + 1 < map->nkids; i += 2) {
		const allot__cfg_node *k = map->kids[i], *v = map->kids[i + 1];
		const char *name = NULL;
		int rc = allot__cfg_get_string(c, k, "endpoint name",
		    ALLOT__ENDPOINT_MAX,
		    "an endpoint name such as \"/export\"", &name);
		if (rc != ALLOT_OK)
			return rc;
		if (strcmp(name, "default") == 0)
			return FAIL(c, k,
			    "endpoint \"default\" in %s is the weight of "
			    "unlisted endpoints, expected an endpoint named "
			    "in endpoint_weights",
			    path);
		for (size_t j = 0; j < i; j += 2) {
			const allot__cfg_node *o = map->kids[j];
			if (o->len == k->len &&
			    memcmp(o->str, k->str, k->len) == 0)
				return FAIL(c, k,
				    "duplicate key %s in %s (first at line "
				    "%" PRIu32
				    "), expected each endpoint once",
				    QN(qb, k), path, o->line);
		}
		if ((rc = grow(c, sc, arr, *n, k, prefix)) != ALLOT_OK)
			return rc;
		allot__quota *q = &(*arr)[*n];
		allot__cfg_meta *m = &sc->meta[*n];
		const allot__quota *parent = &(*arr)[ci];
		(*n)++;
		m->parent = ci;
		m->endpoint = k;
		if ((q->identity = strdup(parent->identity)) == NULL ||
		    (q->endpoint = strdup(name)) == NULL)
			return allot__cfg_nomem(c);
		if ((rc = set_key(c, q, m)) != ALLOT_OK)
			return rc;
		/* Its wire key is a key name of a Register. */
		if (!allot__name_valid(m->key, ALLOT__NAME_MAX, true))
			return FAIL(c, k,
			    "endpoint quota %s: the key \"IDENTITY ENDPOINT\" "
			    "must be 1-%u " ALLOT__NAME_RULE
			    ", expected a shorter identity or endpoint name",
			    QN(qb, k), ALLOT__NAME_MAX);
		char qpath[PATH_MAX_ + 192];
		snprintf(qpath, sizeof qpath, "%s.%s", path, QN(qb, k));
		rc = parse_quota(
		    c, v, qpath, ALLOT__QS_ENDPOINT, parent, q, m);
		if (rc != ALLOT_OK)
			return rc;
	}
	return ALLOT_OK;
}

/* PREFIX.callers: a sequence of callers, each followed by its endpoint
 * quotas, into *arr and *n. */
static int
parse_callers(allot__cfg_ctx *c, const allot__cfg_node *seq,
    const char *prefix, allot__cfg_scope *sc, allot__quota **arr, size_t *n)
{
	char d[DBUF], path[PATH_MAX_];
	if (seq->type != NODE_SEQ)
		return FAIL(c, seq,
		    "%s.callers is %s, expected a sequence of callers "
		    "(\"- identity: ...\"; [] for none)",
		    prefix, allot__cfg_describe(seq, d, sizeof d));
	if (seq->nkids > ALLOT__MAX_CALLERS)
		return FAIL(c, seq->kids[ALLOT__MAX_CALLERS],
		    "too many callers (%zu), expected at most %d", seq->nkids,
		    ALLOT__MAX_CALLERS);
	for (size_t i = 0; i < seq->nkids; i++) {
		int rc = grow(c, sc, arr, *n, seq->kids[i], prefix);
		if (rc != ALLOT_OK)
			return rc;
		size_t ci = (*n)++;
		snprintf(path, sizeof path, "%s.callers[%zu]", prefix, i);
		const allot__cfg_node *map;
		rc = allot__cfg_plan_apply(c, seq->kids[i], path, &map);
		if (rc == ALLOT_OK)
			rc = parse_quota(c, map, path, ALLOT__QS_CALLER, NULL,
			    &(*arr)[ci], &sc->meta[ci]);
		if (rc == ALLOT_OK)
			rc = set_key(c, &(*arr)[ci], &sc->meta[ci]);
		if (rc == ALLOT_OK && sc->meta[ci].eps != NULL)
			rc = parse_endpoint_quotas(
			    c, sc, arr, n, ci, path, prefix);
		if (rc != ALLOT_OK)
			return rc;
	}
	return ALLOT_OK;
}

/* PREFIX.endpoint_weights into eps[0..*neps) and *defw. */
static int
parse_weights(allot__cfg_ctx *c, const allot__cfg_node *map,
    const char *prefix, allot__endpoint **eps, size_t *neps, uint32_t *defw)
{
	char d[DBUF], q[QBUF], what[ALLOT__ENDPOINT_MAX + 64];
	if (map->type != NODE_MAP)
		return FAIL(c, map,
		    "%s.endpoint_weights is %s, expected a mapping of "
		    "endpoint: weight",
		    prefix, allot__cfg_describe(map, d, sizeof d));
	size_t pairs = map->nkids / 2;
	size_t cap = pairs < ALLOT__MAX_ENDPOINTS ? pairs :
	                                            ALLOT__MAX_ENDPOINTS;
	if (cap > 0) {
		*eps = calloc(cap, sizeof **eps);
		if (*eps == NULL)
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
				    "%s.endpoint_weights (first at line "
				    "%" PRIu32
				    "), expected each endpoint once",
				    QN(q, k), prefix, o->line);
		}
		snprintf(what, sizeof what, "the weight of %s", QN(q, k));
		if (strcmp(name, "default") == 0) {
			rc = allot__cfg_get_weight(c, v, what, defw);
			if (rc != ALLOT_OK)
				return rc;
			continue;
		}
		if (*neps == ALLOT__MAX_ENDPOINTS)
			return FAIL(c, k,
			    "too many endpoints in %s.endpoint_weights, "
			    "expected at most %d besides default",
			    prefix, ALLOT__MAX_ENDPOINTS);
		allot__endpoint *ep = &(*eps)[*neps];
		rc = allot__cfg_get_weight(c, v, what, &ep->weight);
		if (rc != ALLOT_OK)
			return rc;
		if ((ep->name = strdup(name)) == NULL)
			return allot__cfg_nomem(c);
		(*neps)++;
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

/* PREFIX.global_ceiling. The priority classes are the file's: only the
 * top-level ceiling names them. */
static int
parse_ceiling(allot__cfg_ctx *c, const allot__cfg_node *map,
    const char *prefix, bool top, double *rate, bool *overcommit,
    allot__cfg_scope *sc)
{
	static const char *const tkeys[] = { "tokens_per_second", "shed_order",
		"overcommit" };
	static const char *const skeys[] = { "tokens_per_second",
		"overcommit" };
	char path[PATH_MAX_], what[PATH_MAX_ + 32];
	const allot__cfg_node *vals[3];
	snprintf(path, sizeof path, "%s.global_ceiling", prefix);
	if (!top && map->type == NODE_MAP)
		for (size_t i = 0; i + 1 < map->nkids; i += 2)
			if (allot__cfg_key_is(map->kids[i], "shed_order"))
				return FAIL(c, map->kids[i],
				    "shed_order in %s: the priority classes "
				    "are the file's, expected them under "
				    "quotas.global_ceiling",
				    path);
	int rc = walk_map(
	    c, map, path, top ? tkeys : skeys, top ? 3 : 2, vals);
	if (rc == ALLOT_OK)
		rc = need(c, map, path, tkeys, vals, 1);
	if (rc != ALLOT_OK)
		return rc;
	/* Fields in file order, so the first bad one is reported. */
	for (size_t i = 0; i + 1 < map->nkids && rc == ALLOT_OK; i += 2) {
		const allot__cfg_node *k = map->kids[i], *v = map->kids[i + 1];
		snprintf(
		    what, sizeof what, "%s.%.*s", path, (int) k->len, k->str);
		if (allot__cfg_key_is(k, "tokens_per_second")) {
			rc = allot__cfg_get_rate(c, v, what, rate);
			sc->ceiling = v;
		} else if (allot__cfg_key_is(k, "overcommit")) {
			rc = allot__cfg_get_bool(c, v, what, overcommit);
		} else {
			rc = parse_shed_order(c, v);
		}
	}
	return rc;
}

/* The sections of a scope: `quotas`, or one service's mapping. */
static int
parse_scope(allot__cfg_ctx *c, const allot__cfg_node *map, const char *prefix,
    allot__cfg_scope *sc, allot__service *svc)
{
	enum { K_DEFAULT, K_CALLERS, K_WEIGHTS, K_CEILING, K_PLANS };
	static const char *const keys[] = { "default", "callers",
		"endpoint_weights", "global_ceiling", "plans" };
	allot_config *cfg = c->cfg;
	const allot__cfg_node *vals[5];
	char path[PATH_MAX_];
	/* Plans are the top level's (read before any section), for every
	 * service. */
	int rc = walk_map(c, map, prefix, keys, svc != NULL ? 4 : 5, vals);
	if (rc == ALLOT_OK && svc == NULL)
		rc = need(c, map, prefix, keys, vals, 1);
	/* Sections in file order, so the first bad one is reported. */
	for (size_t i = 0; i + 1 < map->nkids && rc == ALLOT_OK; i += 2) {
		const allot__cfg_node *v = map->kids[i + 1];
		switch (key_index(map->kids[i], keys, 4)) {
		case K_DEFAULT:
			snprintf(path, sizeof path, "%s.default", prefix);
			if (svc != NULL &&
			    (svc->def = calloc(1, sizeof *svc->def)) == NULL)
				return allot__cfg_nomem(c);
			allot__quota *d = svc != NULL ? svc->def : &cfg->def;
			if (svc != NULL &&
			    (d->identity = strdup("default")) == NULL)
				return allot__cfg_nomem(c);
			rc = allot__cfg_plan_apply(c, v, path, &v);
			if (rc == ALLOT_OK)
				rc = parse_quota(c, v, path, ALLOT__QS_DEFAULT,
				    NULL, d, &sc->def);
			break;
		case K_CALLERS:
			rc = svc != NULL ? parse_callers(c, v, prefix, sc,
			                       &svc->callers, &svc->ncallers) :
			                   parse_callers(c, v, prefix, sc,
			                       &cfg->callers, &cfg->ncallers);
			break;
		case K_WEIGHTS:
			rc = svc != NULL ?
			    parse_weights(c, v, prefix, &svc->endpoints,
			        &svc->nendpoints, &svc->default_weight) :
			    parse_weights(c, v, prefix, &cfg->endpoints,
			        &cfg->nendpoints, &cfg->default_weight);
			break;
		case K_CEILING:
			rc = svc != NULL ?
			    parse_ceiling(c, v, prefix, false,
			        &svc->ceiling_rate, &svc->overcommit, sc) :
			    parse_ceiling(c, v, prefix, true,
			        &cfg->ceiling_rate, &cfg->overcommit, sc);
			break;
		default: break;
		}
	}
	return rc;
}

/* services: a mapping of service name to the sections it overrides. */
static int
parse_services(allot__cfg_ctx *c, const allot__cfg_node *map)
{
	allot_config *cfg = c->cfg;
	char d[DBUF], q[QBUF], prefix[PATH_MAX_];
	if (map->type != NODE_MAP)
		return FAIL(c, map,
		    "services is %s, expected a mapping of service name: "
		    "quotas",
		    allot__cfg_describe(map, d, sizeof d));
	size_t n = map->nkids / 2;
	if (n > ALLOT__MAX_SERVICES)
		return FAIL(c, map->kids[2 * ALLOT__MAX_SERVICES],
		    "too many services (%zu), expected at most %d", n,
		    ALLOT__MAX_SERVICES);
	if (n == 0)
		return ALLOT_OK;
	cfg->services = calloc(n, sizeof *cfg->services);
	c->svc = calloc(n, sizeof *c->svc);
	if (cfg->services == NULL || c->svc == NULL)
		return allot__cfg_nomem(c);
	c->nsvc = n;
	for (size_t i = 0; i + 1 < map->nkids; i += 2) {
		const allot__cfg_node *k = map->kids[i], *v = map->kids[i + 1];
		const char *name = NULL;
		int rc = allot__cfg_get_string(c, k, "service name",
		    ALLOT__NAME_MAX, "a service name as agents register it",
		    &name);
		if (rc != ALLOT_OK)
			return rc;
		if (!allot__name_valid(name, ALLOT__NAME_MAX, true))
			return FAIL(c, k,
			    "service name %s must be 1-%u " ALLOT__NAME_RULE
			    ", expected the name agents register with",
			    QN(q, k), ALLOT__NAME_MAX);
		for (size_t j = 0; j < i; j += 2) {
			const allot__cfg_node *o = map->kids[j];
			if (o->len == k->len &&
			    memcmp(o->str, k->str, k->len) == 0)
				return FAIL(c, k,
				    "duplicate service %s (first at line "
				    "%" PRIu32 "), expected each service once",
				    QN(q, k), o->line);
		}
		allot__service *svc = &cfg->services[cfg->nservices];
		allot__cfg_scope *sc = &c->svc[cfg->nservices];
		cfg->nservices++;
		if ((svc->name = strdup(name)) == NULL)
			return allot__cfg_nomem(c);
		svc->line = k->line;
		sc->service = svc->name;
		sc->name = k;
		snprintf(prefix, sizeof prefix, "services.%s", name);
		if ((rc = parse_scope(c, v, prefix, sc, svc)) != ALLOT_OK)
			return rc;
	}
	return ALLOT_OK;
}

/* Every plan's keys are a caller's (less identity and endpoints, which
 * allot__cfg_plans_read() refused): checked where the plan is written,
 * used or not; its values where a quota uses it. */
static int
check_plans(allot__cfg_ctx *c)
{
	const char *keys[ALLOT__QKEYS_MAX];
	const allot__qfield *rows[ALLOT__QKEYS_MAX];
	const allot__cfg_node *vals[ALLOT__QKEYS_MAX];
	char what[PATH_MAX_];
	size_t all = quota_keys(ALLOT__QS_CALLER, keys, rows), nkeys = 0;
	for (size_t i = 0; i < all; i++)
		if (rows[i] != NULL) /* a field: not identity, endpoints */
			keys[nkeys++] = keys[i];
	const allot__cfg_node *plans = c->plans;
	int rc = ALLOT_OK;
	for (size_t i = 0;
	     plans != NULL && i + 1 < plans->nkids && rc == ALLOT_OK; i += 2) {
		snprintf(what, sizeof what, "quotas.plans.%.*s",
		    (int) (plans->kids[i]->len < 128 ? plans->kids[i]->len :
		                                       128),
		    plans->kids[i]->str);
		rc = walk_map(c, plans->kids[i + 1], what, keys, nkeys, vals);
	}
	return rc;
}

int
allot__cfg_parse_root(allot__cfg_ctx *c, const allot__cfg_node *root)
{
	static const char *const top_keys[] = { "quotas", "services" };
	const allot__cfg_node *top[2];
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
	int rc = walk_map(c, root, "the top level", top_keys, 2, top);
	if (rc != ALLOT_OK)
		return rc;
	if (top[0] == NULL)
		return FAIL(c, root,
		    "missing required key \"quotas\" at the top level, "
		    "expected a top-level \"quotas\" mapping");
	/* Plans first: a service's callers may come before them. */
	rc = allot__cfg_plans_read(c, top[0]);
	if (rc == ALLOT_OK)
		rc = check_plans(c);
	if (rc != ALLOT_OK)
		return rc;
	/* Sections in file order, so the first bad one is reported. */
	for (size_t i = 0; i + 1 < root->nkids && rc == ALLOT_OK; i += 2) {
		const allot__cfg_node *v = root->kids[i + 1];
		if (v == top[0])
			rc = parse_scope(c, v, "quotas", &c->top, NULL);
		else
			rc = parse_services(c, v);
	}
	return rc;
}
