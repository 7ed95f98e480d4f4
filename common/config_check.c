/* SPDX-License-Identifier: MIT */
/*
 * The quota file loader's checks across sections (config_parse.h), run
 * after the schema walk because YAML mappings are unordered (priority
 * classes may follow the callers that name them, endpoint_weights may
 * follow callers): each quota's priority resolved against shed_order,
 * duplicate wire keys within a scope, and then, in the view of the top
 * level and of every service (allot__config_select()): every burst and
 * candidate burst against the heaviest endpoint weight (an endpoint
 * quota: its endpoint's weight), every endpoint quota against
 * endpoint_weights, and every rate against the ceiling unless it says
 * overcommit. A top-level quota is checked again in a service's view
 * only when the service changes weights or the ceiling. Which fields
 * are classes, bursts and rates is their type in the field table
 * (config_fields.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_fields.h"
#include "config_parse.h"
#include "name.h"

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

/* Every class field of `q` (its priority) resolved against the
 * classes. Without one, an endpoint quota has its caller's (`parent`,
 * resolved by then) where the field is inherited, and any other quota
 * classes[0], the class shed first: protection from shedding is opted
 * into, never granted by omission. */
static int
resolve_classes(allot__cfg_ctx *c, allot__quota *q, const allot__cfg_meta *m,
    const allot__quota *parent)
{
	allot_config *cfg = c->cfg;
	char q1[QBUF], list[ALLOT__MAX_CLASSES * (ALLOT__CLASS_MAX + 2)];
	for (size_t i = 0; i < allot__nqfields; i++) {
		const allot__qfield *f = &allot__qfields[i];
		if (f->type != ALLOT__QT_CLASS)
			continue;
		const allot__cfg_node *n = allot__cfg_value(m->map, f->key);
		uint32_t v = parent != NULL && (f->flags & ALLOT__QF_INHERIT) ?
		    ALLOT__QFC(uint32_t, parent, f->off) :
		    0;
		if (n != NULL) {
			size_t k = 0;
			while (k < cfg->nclasses &&
			    strcmp(cfg->classes[k], n->str) != 0)
				k++;
			if (k == cfg->nclasses) {
				allot__cfg_join(list, sizeof list,
				    (const char *const *) cfg->classes,
				    cfg->nclasses);
				return FAIL(c, n,
				    "unknown priority class %s, expected one "
				    "of: %s",
				    QN(q1, n), list);
			}
			v = (uint32_t) k;
		}
		ALLOT__QF(uint32_t, q, f->off) = v;
	}
	return ALLOT_OK;
}

static int
resolve_all(allot__cfg_ctx *c, allot__quota *def, allot__quota *qs, size_t n,
    allot__cfg_scope *sc)
{
	int rc = def != NULL ? resolve_classes(c, def, &sc->def, NULL) :
	                       ALLOT_OK;
	/* An endpoint quota follows its caller, resolved by then. */
	for (size_t i = 0; i < n && rc == ALLOT_OK; i++) {
		const allot__cfg_meta *m = &sc->meta[i];
		rc = resolve_classes(
		    c, &qs[i], m, m->endpoint != NULL ? &qs[m->parent] : NULL);
	}
	return rc;
}

/* The scope being sorted: qsort has no context argument. Loading runs
 * on one thread per ctx, but several threads may load at once. */
static _Thread_local const allot__cfg_scope *sort_scope;
static _Thread_local const allot__quota *sort_base;

static const char *
key_of(const allot__quota *q)
{
	return sort_scope->meta[q - sort_base].key;
}

static int
cmp_key(const void *a, const void *b)
{
	const allot__quota *x = *(const allot__quota *const *) a;
	const allot__quota *y = *(const allot__quota *const *) b;
	int r = strcmp(key_of(x), key_of(y));
	if (r != 0)
		return r;
	return x < y ? -1 : x > y; /* file order among equals */
}

/* Sort a scope's quotas by wire key (kept for the digest and for the
 * views) and report the earliest repeated key, pointing back at its
 * first definition. Without endpoint quotas the wire key is the
 * identity, and the order is the one digests always used. */
static int
check_keys(
    allot__cfg_ctx *c, allot__cfg_scope *sc, const allot__quota *qs, size_t n)
{
	char q[QBUF];
	if (n == 0)
		return ALLOT_OK;
	sc->byid = malloc(n * sizeof *sc->byid);
	if (sc->byid == NULL)
		return allot__cfg_nomem(c);
	for (size_t i = 0; i < n; i++)
		sc->byid[i] = &qs[i];
	sort_scope = sc;
	sort_base = qs;
	qsort(sc->byid, n, sizeof *sc->byid, cmp_key);
	/* Each run of equal keys is in file order: its first entry is the
	 * definition, its second the earliest repeat. */
	const allot__quota *dup = NULL, *first = NULL;
	for (size_t i = 0, j; i < n; i = j) {
		for (j = i + 1; j < n; j++)
			if (strcmp(key_of(sc->byid[i]), key_of(sc->byid[j])) !=
			    0)
				break;
		if (j - i > 1 && (dup == NULL || sc->byid[i + 1] < dup)) {
			dup = sc->byid[i + 1];
			first = sc->byid[i];
		}
	}
	if (dup == NULL)
		return ALLOT_OK;
	const allot__cfg_meta *m = &sc->meta[dup - qs];
	if (m->endpoint == NULL)
		return FAIL(c, m->ident,
		    "duplicate identity %s (first defined at line %" PRIu32
		    "), expected each caller identity once",
		    Q(q, dup->identity), first->line);
	return FAIL(c, m->endpoint,
	    "duplicate key %s (first defined at line %" PRIu32
	    "), expected each caller identity and endpoint quota once",
	    Q(q, m->key), first->line);
}

/* The weights, ceiling and name of one view: the top level (svc NULL)
 * or a service's. */
typedef struct view {
	const allot_config *cfg;
	const allot__service *svc;
	uint32_t max_weight;
	const char *heaviest; /* an endpoint of that weight */
	double ceiling;
	bool overcommit;
	const allot__cfg_node *ceiling_node;
} view;

/* The weight of `endpoint` in view `v`; 0 when it has none. */
static uint32_t
view_weight(const view *v, const char *endpoint)
{
	if (v->svc != NULL)
		for (size_t i = 0; i < v->svc->nendpoints; i++)
			if (strcmp(v->svc->endpoints[i].name, endpoint) == 0)
				return v->svc->endpoints[i].weight;
	for (size_t i = 0; i < v->cfg->nendpoints; i++)
		if (strcmp(v->cfg->endpoints[i].name, endpoint) == 0)
			return v->cfg->endpoints[i].weight;
	return 0;
}

static void
view_init(view *v, allot__cfg_ctx *c, const allot__service *svc,
    const allot__cfg_scope *sc)
{
	const allot_config *cfg = c->cfg;
	*v = (view) { .cfg = cfg, .svc = svc };
	v->max_weight = svc != NULL && svc->default_weight > 0 ?
	    svc->default_weight :
	    cfg->default_weight;
	v->heaviest = "default";
	for (int pass = 0; pass < 2; pass++) {
		const allot__endpoint *e = pass == 0 ? cfg->endpoints :
		    svc != NULL                      ? svc->endpoints :
		                                       NULL;
		size_t n = pass == 0 ? cfg->nendpoints :
		    svc != NULL      ? svc->nendpoints :
		                       0;
		for (size_t i = 0; i < n; i++) {
			uint32_t w = view_weight(v, e[i].name);
			if (w > v->max_weight) {
				v->max_weight = w;
				v->heaviest = e[i].name;
			}
		}
	}
	if (svc != NULL && svc->ceiling_rate > 0) {
		v->ceiling = svc->ceiling_rate;
		v->overcommit = svc->overcommit;
		v->ceiling_node = sc->ceiling;
	} else {
		v->ceiling = cfg->ceiling_rate;
		v->overcommit = cfg->overcommit;
		v->ceiling_node = c->top.ceiling;
	}
}

/* The node of a value in quota mapping `map` for a message: `at`, or
 * the mapping itself should a value have come from elsewhere. */
static const allot__cfg_node *
node_or_map(const allot__cfg_node *at, const allot__cfg_node *map)
{
	return at != NULL ? at : map;
}

/* What a message says of a quota: who it is, " in service NAME" when
 * checked in a service's view, and the weight `need` of endpoint `ep`
 * that each of its bursts must hold (the heaviest, or an endpoint
 * quota's own). */
typedef struct subject {
	char who[ALLOT__NAME_MAX + QBUF + 32];
	char in[QBUF + 16];
	uint32_t need;
	const char *ep;
} subject;

/* Field `f` of `q` against the weight s->need: a burst (the quota's,
 * its candidate's) that cannot hold one request there is refused. */
static int
check_weight(allot__cfg_ctx *c, const subject *s, const allot__quota *q,
    const allot__cfg_meta *m, const allot__qfield *f)
{
	char q2[QBUF], q3[QBUF];
	const allot__cfg_node *at;
	switch (f->type) {
	case ALLOT__QT_BURST:
		if (!(ALLOT__QFC(double, q, f->off) < s->need))
			return ALLOT_OK;
		at = node_or_map(allot__cfg_value(m->map, f->key), m->map);
		return FAIL(c, at,
		    "%s has %s %s, below the weight %" PRIu32
		    " of endpoint %s%s, expected %s >= %" PRIu32
		    " (a request there could never pass)",
		    s->who, f->key, NUM(q3, at), s->need, Q(q2, s->ep), s->in,
		    f->key, s->need);
	case ALLOT__QT_CANDIDATE: {
		double b = ALLOT__QFC(double, q, f->off2);
		if (!(b > 0 && b < s->need))
			return ALLOT_OK;
		at = node_or_map(
		    allot__cfg_value(
		        allot__cfg_value(m->map, f->key), "burst"),
		    m->map);
		return FAIL(c, at,
		    "%s has a candidate burst of %s, below the weight %" PRIu32
		    " of endpoint %s%s, expected a candidate burst >= "
		    "%" PRIu32,
		    s->who, NUM(q3, at), s->need, Q(q2, s->ep), s->in,
		    s->need);
	}
	case ALLOT__QT_RATE:
	case ALLOT__QT_CLASS:
	case ALLOT__QT_BOOL:
	case ALLOT__QT_WORD:
	case ALLOT__QT_TEXT:
	case ALLOT__QT_PER_UNIT:
	case ALLOT__QT_LABELS:
	case ALLOT__QT_FRACTION: break;
	}
	return ALLOT_OK;
}

/* The rate field `f` of `q` holds (the quota's, its candidate's) when
 * it is above `ceiling`, with its node and what a message calls it
 * ("", "candidate "); 0 otherwise. */
static double
over_ceiling(const allot__quota *q, const allot__cfg_meta *m,
    const allot__qfield *f, double ceiling, const allot__cfg_node **ret_at,
    const char **ret_what)
{
	double r = 0;
	switch (f->type) {
	case ALLOT__QT_RATE:
		r = ALLOT__QFC(double, q, f->off);
		*ret_at = allot__cfg_rate_value(m->map);
		*ret_what = "";
		break;
	case ALLOT__QT_CANDIDATE:
		r = ALLOT__QFC(double, q, f->off);
		*ret_at = allot__cfg_rate_value(
		    allot__cfg_value(m->map, f->key));
		*ret_what = "candidate ";
		break;
	case ALLOT__QT_BURST:
	case ALLOT__QT_CLASS:
	case ALLOT__QT_BOOL:
	case ALLOT__QT_WORD:
	case ALLOT__QT_TEXT:
	case ALLOT__QT_PER_UNIT:
	case ALLOT__QT_LABELS:
	case ALLOT__QT_FRACTION: break;
	}
	*ret_at = node_or_map(*ret_at, m->map);
	return r > ceiling ? r : 0;
}

/* The weight an endpoint quota's bursts must hold: its endpoint's in
 * view `v`; an endpoint without one is refused. */
static int
endpoint_need(allot__cfg_ctx *c, const view *v, const allot__quota *q,
    const allot__cfg_meta *m, subject *s)
{
	char q2[QBUF], list[512];
	s->need = view_weight(v, q->endpoint);
	s->ep = q->endpoint;
	if (s->need > 0)
		return ALLOT_OK;
	const char *names[ALLOT__MAX_ENDPOINTS * 2];
	size_t n = 0;
	for (size_t i = 0; i < v->cfg->nendpoints; i++)
		names[n++] = v->cfg->endpoints[i].name;
	for (size_t i = 0; v->svc && i < v->svc->nendpoints; i++)
		names[n++] = v->svc->endpoints[i].name;
	allot__cfg_join(list, sizeof list, names, n);
	return FAIL(c, m->endpoint,
	    "%s: endpoint %s has no weight in endpoint_weights%s, expected "
	    "an endpoint listed there (%s)",
	    s->who, Q(q2, q->endpoint), s->in, n > 0 ? list : "none is");
}

/* A quota against the weights and the ceiling of view `v`: each field
 * against the weights (the bursts), then against the ceiling (the
 * rates), in table order. */
static int
check_quota(allot__cfg_ctx *c, const view *v, const allot__quota *q,
    const allot__cfg_meta *m, bool is_default)
{
	char q1[QBUF];
	subject s = { .need = v->max_weight, .ep = v->heaviest };
	if (v->svc != NULL)
		snprintf(
		    s.in, sizeof s.in, " in service %s", Q(q1, v->svc->name));
	if (is_default && v->svc != NULL && v->svc->def == q)
		snprintf(
		    s.who, sizeof s.who, "services.%s.default", v->svc->name);
	else if (is_default)
		snprintf(s.who, sizeof s.who, "quotas.default");
	else if (q->endpoint != NULL)
		snprintf(
		    s.who, sizeof s.who, "endpoint quota %s", Q(q1, m->key));
	else
		snprintf(s.who, sizeof s.who, "caller %s", Q(q1, q->identity));
	int rc = q->endpoint != NULL ? endpoint_need(c, v, q, m, &s) :
	                               ALLOT_OK;
	/* A stacked level's demand is also its callers' own quotas': the
	 * ceiling would count it twice. */
	if (rc == ALLOT_OK && v->ceiling > 0 && !is_default &&
	    allot__quota_is_level(q))
		return FAIL(c, m->map,
		    "%s is a stacked limit (charged on top of each request's "
		    "own quota)%s, which a global ceiling cannot hold: "
		    "expected no global_ceiling (line %" PRIu32 ") beside "
		    "stacked limits (a caller \"*\" caps the whole service)",
		    s.who, s.in,
		    v->ceiling_node != NULL ? v->ceiling_node->line : 0);
	/* A bucket per value: as many rates as there are callers. */
	if (rc == ALLOT_OK && v->ceiling > 0 && is_default && !q->shared)
		return FAIL(c, m->map,
		    "%s has shared: false (a bucket of its own for each "
		    "unknown caller)%s, which a global ceiling cannot hold, "
		    "expected no global_ceiling (line %" PRIu32 ") beside "
		    "it, or shared: true (a caller \"*\" caps the whole "
		    "service)",
		    s.who, s.in,
		    v->ceiling_node != NULL ? v->ceiling_node->line : 0);
	/* Closed or unlimited: no burst to hold a weight, no rate. */
	if (q->access != ALLOT__ACCESS_LIMITED)
		return rc;
	for (size_t i = 0; i < allot__nqfields && rc == ALLOT_OK; i++)
		rc = check_weight(c, &s, q, m, &allot__qfields[i]);
	if (rc != ALLOT_OK || !(v->ceiling > 0) || v->overcommit)
		return rc;
	for (size_t i = 0; i < allot__nqfields; i++) {
		const allot__cfg_node *at = NULL;
		const char *what = "";
		double r = over_ceiling(
		    q, m, &allot__qfields[i], v->ceiling, &at, &what);
		if (r > 0)
			return FAIL(c, at,
			    "%s has a %srate of %.6g tokens/s, above the "
			    "global ceiling of %.6g tokens/s%s, expected at "
			    "most the ceiling (or overcommit: true in the "
			    "global_ceiling at line %" PRIu32 ")",
			    s.who, what, r, v->ceiling, s.in,
			    v->ceiling_node != NULL ? v->ceiling_node->line :
			                              0);
	}
	return ALLOT_OK;
}

/* Whether a scope whose quotas are qs[0..n) (sorted in sc->byid) has
 * one of wire key `key`. */
static bool
has_key(const allot__cfg_scope *sc, const allot__quota *qs, size_t n,
    const char *key)
{
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const allot__quota *q = sc->byid[mid];
		int r = strcmp(sc->meta[q - qs].key, key);
		if (r == 0)
			return true;
		if (r < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return false;
}

static bool
overridden(
    const allot__cfg_scope *sc, const allot__service *svc, const char *key)
{
	return has_key(sc, svc->callers, svc->ncallers, key);
}

/* A view holds at most ALLOT__MAX_CALLERS quotas besides its default,
 * like one scope: the agents of the service hold them all. */
static int
check_size(
    allot__cfg_ctx *c, const allot__service *svc, const allot__cfg_scope *sc)
{
	const allot_config *cfg = c->cfg;
	size_t n = cfg->ncallers;
	for (size_t i = 0; i < svc->ncallers; i++)
		if (!has_key(
		        &c->top, cfg->callers, cfg->ncallers, sc->meta[i].key))
			n++;
	if (n <= ALLOT__MAX_CALLERS)
		return ALLOT_OK;
	char q[QBUF];
	return FAIL(c, sc->name,
	    "service %s has %zu quotas in its view (the top level's and its "
	    "own), expected at most %d",
	    Q(q, svc->name), n, ALLOT__MAX_CALLERS);
}

/* A pattern caller of a view and where it was written. */
typedef struct pat_ref {
	const char *id;
	const allot__cfg_node *at;
} pat_ref;

/* By prefix (the identity less its '*'): a prefix sorts right before
 * every string it starts, whatever their next byte. */
static int
cmp_pat(const void *x, const void *y)
{
	const char *a = ((const pat_ref *) x)->id,
	           *b = ((const pat_ref *) y)->id;
	size_t la = strlen(a) - 1, lb = strlen(b) - 1;
	int r = memcmp(a, b, la < lb ? la : lb);
	if (r != 0)
		return r;
	return la < lb ? -1 : la > lb;
}

/* The pattern callers ("PREFIX*") of view `v` never nest, but in "*":
 * an identity is in at most one group besides every caller's, so that
 * it charges at most five levels (the agents find its group by one
 * search). Sorted, a pattern inside another follows it at once. */
static int
check_patterns(
    allot__cfg_ctx *c, const allot__service *svc, const allot__cfg_scope *sc)
{
	const allot_config *cfg = c->cfg;
	size_t n = cfg->ncallers + (svc != NULL ? svc->ncallers : 0), m = 0;
	pat_ref *r = malloc((n + 1) * sizeof *r);
	if (r == NULL)
		return allot__cfg_nomem(c);
	for (size_t i = 0; i < n; i++) {
		bool top = i < cfg->ncallers;
		const allot__quota *q = top ? &cfg->callers[i] :
		                              &svc->callers[i - cfg->ncallers];
		const allot__cfg_meta *mt = top ? &c->top.meta[i] :
		                                  &sc->meta[i - cfg->ncallers];
		if (q->endpoint == NULL &&
		    allot__identity_is_pattern(q->identity))
			r[m++] = (pat_ref) { q->identity,
				mt->ident != NULL ? mt->ident : mt->map };
	}
	qsort(r, m, sizeof *r, cmp_pat);
	int rc = ALLOT_OK;
	char q1[QBUF], q2[QBUF];
	for (size_t i = 1; i < m && rc == ALLOT_OK; i++) {
		size_t len = strlen(r[i - 1].id) - 1;
		if (len > 0 && strncmp(r[i - 1].id, r[i].id, len) == 0 &&
		    strcmp(r[i - 1].id, r[i].id) != 0)
			rc = FAIL(c, r[i].at,
			    "caller %s is inside the group of caller %s%s%s, "
			    "expected groups that do not nest (an identity "
			    "belongs to at most one besides \"*\")",
			    Q(q1, r[i].id), Q(q2, r[i - 1].id),
			    svc != NULL ? " in service " : "",
			    svc != NULL ? svc->name : "");
	}
	free(r);
	return rc;
}

/* Every quota of the view of service `si` (SIZE_MAX: the top level). */
static int
check_view(allot__cfg_ctx *c, size_t si)
{
	const allot_config *cfg = c->cfg;
	const allot__service *svc = si != SIZE_MAX ? &cfg->services[si] : NULL;
	const allot__cfg_scope *sc = svc != NULL ? &c->svc[si] : &c->top;
	view v;
	view_init(&v, c, svc, sc);
	/* The top-level quotas, unless the service changes nothing they
	 * were checked against. */
	bool top = svc == NULL || svc->nendpoints > 0 ||
	    svc->default_weight > 0 || svc->ceiling_rate > 0;
	int rc = svc != NULL ? check_size(c, svc, sc) : ALLOT_OK;
	if (rc != ALLOT_OK)
		return rc;
	if (svc != NULL && svc->def != NULL)
		rc = check_quota(c, &v, svc->def, &sc->def, true);
	else if (top)
		rc = check_quota(c, &v, &cfg->def, &c->top.def, true);
	for (size_t i = 0; top && i < cfg->ncallers && rc == ALLOT_OK; i++) {
		const allot__cfg_meta *m = &c->top.meta[i];
		if (svc == NULL || !overridden(sc, svc, m->key))
			rc = check_quota(c, &v, &cfg->callers[i], m, false);
	}
	for (size_t i = 0; svc && i < svc->ncallers && rc == ALLOT_OK; i++)
		rc = check_quota(c, &v, &svc->callers[i], &sc->meta[i], false);
	if (rc == ALLOT_OK)
		rc = check_patterns(c, svc, sc);
	return rc;
}

static int
cmp_service(const void *a, const void *b)
{
	const allot__service *x = *(const allot__service *const *) a;
	const allot__service *y = *(const allot__service *const *) b;
	return strcmp(x->name, y->name);
}

int
allot__cfg_check_all(allot__cfg_ctx *c)
{
	allot_config *cfg = c->cfg;
	int rc = ALLOT_OK;
	if (cfg->nclasses == 0 && (rc = set_default_classes(c)) != ALLOT_OK)
		return rc;
	rc = resolve_all(c, &cfg->def, cfg->callers, cfg->ncallers, &c->top);
	for (size_t i = 0; i < cfg->nservices && rc == ALLOT_OK; i++) {
		allot__service *s = &cfg->services[i];
		rc = resolve_all(
		    c, s->def, s->callers, s->ncallers, &c->svc[i]);
	}
	if (rc == ALLOT_OK)
		rc = check_keys(c, &c->top, cfg->callers, cfg->ncallers);
	for (size_t i = 0; i < cfg->nservices && rc == ALLOT_OK; i++)
		rc = check_keys(c, &c->svc[i], cfg->services[i].callers,
		    cfg->services[i].ncallers);
	cfg->max_weight = cfg->default_weight;
	for (size_t i = 0; i < cfg->nendpoints; i++)
		if (cfg->endpoints[i].weight > cfg->max_weight)
			cfg->max_weight = cfg->endpoints[i].weight;
	if (rc == ALLOT_OK && cfg->nservices > 0) {
		c->svc_sorted = malloc(cfg->nservices * sizeof *c->svc_sorted);
		if (c->svc_sorted == NULL)
			return allot__cfg_nomem(c);
		for (size_t i = 0; i < cfg->nservices; i++)
			c->svc_sorted[i] = &cfg->services[i];
		qsort(c->svc_sorted, cfg->nservices, sizeof *c->svc_sorted,
		    cmp_service);
	}
	if (rc == ALLOT_OK)
		rc = check_view(c, SIZE_MAX);
	for (size_t i = 0; i < cfg->nservices && rc == ALLOT_OK; i++)
		rc = check_view(c, i);
	return rc;
}
