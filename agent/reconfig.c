/* SPDX-License-Identifier: MIT */
/*
 * Installing a quota config into a running agent, while threads acquire:
 * the first one at create, then the coordinator's (through the installer
 * the sync engine holds) or a local one (allot_agent_set_config()).
 *
 * Everything a decision or a lookup reads stays valid and consistent
 * without a lock, because nothing it can reach is ever freed or reused
 * before destroy:
 * - capacity is reserved at create (max_callers identities and quotas,
 *   16 spare endpoint classes); a config beyond it is refused whole;
 * - the identity index, the endpoint index and the names are
 *   insert-only: an entry is written, then published with a release
 *   store that lookups read with an acquire load (a plain move on x86);
 * - a quota's id never changes: a quota still in the config keeps its
 *   slot, a new one takes the next free slot, a removed one keeps its
 *   slot unused (and gets it back if a later config names it again);
 * - an identity's keys are its own for the agent's life: a reconfig only
 *   repoints them (bucket, quota, weight, max_cost, known: relaxed atomic
 *   stores) at the quota that the new config gives them, the default
 *   quota if none.
 * A decision racing a reconfig sees the key's old quota or its new one.
 * Counts are never lost: a key that moves hands what it counted so far
 * to the quota it leaves (`retired`) and counts for the new one from
 * there (`qbase`), so allot__quota_totals() splits consumption at the
 * swap. Reconfigs are serialised by cfg_lock; the repointing runs under
 * dyn_lock too, as the unknown-identity pool takes its weights from the
 * same tables.
 */
#include "agent_int.h"
#include "values.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fallback.h"

#define NONE UINT32_MAX

/* ---- names: insert-only, freed at destroy ---- */

/* Room for names, in chunks. Each name starts a 64-byte line and every
 * chunk keeps ALLOT_IDENTITY_MAX + 1 zero bytes past its last name, so
 * that comparing any identity a caller may pass with a stored one reads
 * inside the chunk (agent.c, find_caller). */
struct allot__arena {
	struct allot__arena *next;
	size_t used, cap;
	_Alignas(64) char data[];
};

#define ARENA_CHUNK ((size_t) 64 * 1024)
#define ARENA_PAD ((size_t) ALLOT_IDENTITY_MAX + 1)

static const char *
arena_put(allot_agent *a, const char *s, size_t len)
{
	size_t need = (len + 64) & ~(size_t) 63;
	struct allot__arena *c = a->names;
	if (c == NULL || c->used + need + ARENA_PAD > c->cap) {
		size_t cap = need + ARENA_PAD > ARENA_CHUNK ?
		    need + ARENA_PAD :
		    ARENA_CHUNK;
		cap = (cap + 63) & ~(size_t) 63;
		c = aligned_alloc(64, sizeof *c + cap);
		if (c == NULL)
			return NULL;
		memset(c, 0, sizeof *c + cap);
		c->cap = cap;
		c->next = a->names;
		a->names = c;
	}
	char *p = c->data + c->used;
	memcpy(p, s, len);
	p[len] = '\0';
	c->used += need;
	return p;
}

void
allot__reconfig_fini(allot_agent *a)
{
	for (struct allot__arena *c = a->names, *n; c != NULL; c = n) {
		n = c->next;
		free(c);
	}
	a->names = NULL;
	if (a->quotas != NULL)
		for (uint32_t i = 0; i < a->quota_cap; i++)
			free(a->quotas[i].keys);
}

/* ---- endpoint classes ---- */

/* A new endpoint class: its name and weight first, then the index slot,
 * then the count the linear scan reads, each published with release. */
static void
ep_add(allot_agent *a, const char *name, uint32_t weight)
{
	uint32_t j = atomic_load_explicit(&a->nep, memory_order_relaxed);
	size_t len = strlen(name);
	char *dst = &a->ep_names[j * ALLOT__EP_NAME_SZ];
	memcpy(dst, name, len + 1);
	a->ep_len[j] = len;
	a->class_names[j] = dst;
	atomic_store_explicit(
	    &a->class_weight[j], weight, memory_order_relaxed);
	uint64_t h = allot__hash(name, len, a->seed);
	uint32_t p = (uint32_t) h & a->ep_mask;
	while (
	    atomic_load_explicit(&a->ep_tab[p].cls, memory_order_relaxed) != 0)
		p = (p + 1) & a->ep_mask;
	a->ep_tab[p].hash = h;
	atomic_store_explicit(&a->ep_tab[p].cls, j + 1, memory_order_release);
	atomic_store_explicit(&a->nep, j + 1, memory_order_release);
}

/* ---- identities ---- */

static allot_key *
group_find(const allot_agent *a, const char *id, size_t len, uint64_t h)
{
	for (uint32_t p = (uint32_t) h & a->caller_mask;;
	     p = (p + 1) & a->caller_mask) {
		uint64_t e = atomic_load_explicit(
		    &a->caller_tab[p], memory_order_acquire);
		if (e == 0)
			return NULL;
		if (!allot__caller_tag_is(e, h))
			continue;
		allot_key *keys = allot__known_key(
		    a, allot__caller_group(e), 0);
		if (strncmp(keys->identity, id, len) == 0 &&
		    keys->identity[len] == '\0')
			return keys;
	}
}

static uint32_t
group_of(const allot_agent *a, const allot_key *keys)
{
	return (uint32_t) (keys - a->known_keys); /* its key of class 0 */
}

/* The index entry of group `g`, hash `h`: its quota hint is the quota
 * the group's key of the default class charges. */
static uint64_t
group_entry(const allot_agent *a, uint32_t g, uint64_t h)
{
	const allot__qrt *q = atomic_load_explicit(
	    &allot__known_key(a, g, a->nclasses - 1)->quota,
	    memory_order_relaxed);
	return allot__caller_entry(h, g, q->index);
}

/* Publish identity group `g` (the next one) for `identity`, an arena
 * copy. Its keys charge the default quota until repointed. */
static void
group_add(allot_agent *a, uint32_t g, const char *identity, uint64_t h)
{
	allot__qrt *def = &a->quotas[a->default_quota];
	for (uint32_t c = 0; c < a->nclasses; c++) {
		allot_key *k = allot__known_key(a, g, c);
		allot__key_init(
		    a, k, def, c, identity, (uint32_t) (k - a->known_keys));
	}
	/* The name line: inline when it fits, else left zero (agent.c,
	 * find_caller, compares through the key). */
	size_t len = strlen(identity);
	if (len <= ALLOT__CALLER_INLINE)
		memcpy(a->caller_names[g].s, identity, len);
	uint32_t p = (uint32_t) h & a->caller_mask;
	while (
	    atomic_load_explicit(&a->caller_tab[p], memory_order_relaxed) != 0)
		p = (p + 1) & a->caller_mask;
	atomic_store_explicit(
	    &a->caller_tab[p], group_entry(a, g, h), memory_order_release);
	atomic_store_explicit(&a->ngroups, g + 1, memory_order_release);
}

/* ---- keys ---- */

/* Point key `k` (a configured identity's) at quota `q` with endpoint
 * weight `weight`, keeping every count it made before with the quota it
 * leaves (cfg_lock held, or at create); `fresh`: nothing counted on it
 * yet (create). */
static void
charge(
    allot_agent *a, allot_key *k, allot__qrt *q, uint32_t weight, bool fresh)
{
	allot__qrt *old = atomic_load_explicit(
	    &k->quota, memory_order_relaxed);
	if (old != q && fresh) {
		atomic_store_explicit(&k->quota, q, memory_order_relaxed);
		atomic_store_explicit(
		    &k->bucket, &q->bucket, memory_order_relaxed);
	} else if (old != q) {
		/* What it counted until now stays with the quota it leaves;
		 * a decision racing this store is counted with the new. */
		allot__ktotals t, d;
		allot__key_totals(a, k, &t);
		d = t;
		allot__ktotals_sub(&d, &a->qbase[k->id]);
		allot__ktotals_add(&old->retired, &d);
		a->qbase[k->id] = t;
		atomic_store_explicit(&k->quota, q, memory_order_relaxed);
		atomic_store_explicit(
		    &k->bucket, &q->bucket, memory_order_relaxed);
	}
	/* Written only when it changes: a store would take the key's
	 * line from the cores deciding on it. Its largest cost follows
	 * from its quotas' (allot__stack_set()). */
	if (atomic_load_explicit(&k->weight, memory_order_relaxed) != weight)
		atomic_store_explicit(
		    &k->weight, weight, memory_order_relaxed);
}

/* ---- quotas ---- */

/* The largest cost a request charging config quota `cq` may have: its
 * burst, whole. */
static uint32_t
max_cost_of(const allot__quota *cq)
{
	/* Closed or unlimited: no burst; a request of any cost is the
	 * quota's to refuse or admit. */
	if (cq->access != ALLOT__ACCESS_LIMITED)
		return UINT32_MAX;
	double b = floor(cq->burst);
	return b >= 4294967295.0 ? UINT32_MAX : (uint32_t) b;
}

static void
static_of(const allot_agent *a, const allot__qrt *q, uint32_t n, bool fb,
    allot__allowance *ret)
{
	(void) a;
	uint32_t w = atomic_load_explicit(&q->wmax, memory_order_relaxed);
	if (fb)
		allot__fallback_allowance(q->q->fallback, q->static_rate,
		    q->static_burst, n, w, ret);
	else
		allot__static_share(
		    q->static_rate, q->static_burst, n, w, ret);
}

/* Open quota slot `i` for config quota `cq` under wire key `name`,
 * before it is published (nquotas). */
static void
quota_open(allot_agent *a, uint32_t i, const allot__quota *cq,
    const char *name, allot_key **keys)
{
	allot__qrt *q = &a->quotas[i];
	q->q = cq;
	q->name = name;
	q->index = i;
	q->is_default = i == a->default_quota;
	atomic_init(&q->removed, false);
	q->static_rate = cq->rate;
	q->static_burst = cq->burst;
	q->keys = keys;
	q->nkeys = 0;
	q->keys_cap = q->is_default ? a->group_cap * a->nclasses : a->nclasses;
	/* Its bucket is initialised once the ceiling's cut is known
	 * (apply_quotas), before the quota is published. */
}

int
allot__reconfig_prepare(allot_agent *a, const allot_config *cfg)
{
	atomic_store(&a->max_weight, cfg->max_weight);
	for (uint32_t c = 0; c < a->nclasses; c++)
		atomic_init(&a->class_weight[c], cfg->default_weight);
	a->class_names[a->nclasses - 1] = "default";
	allot_key **keys = calloc(
	    (size_t) a->group_cap * a->nclasses + 1, sizeof *keys);
	const char *name = arena_put(a, "default", 7);
	if (keys == NULL || name == NULL) {
		free(keys);
		return ALLOT_ENOMEM;
	}
	quota_open(a, a->default_quota, &cfg->def, name, keys);
	return ALLOT_OK;
}

/* ---- the plan: everything checked and allocated before any change ---- */

typedef struct plan {
	bool initial; /* the first config, at create */
	size_t n; /* cfg->ncallers */
	uint32_t *slot; /* n: quota id of each config quota, NONE: a dup */
	uint32_t *grp; /* n: identity group */
	uint32_t *cls; /* n: endpoint class of an endpoint quota, or NONE */
	uint32_t *ep_next; /* n: next endpoint quota of the same group */
	uint32_t *gq; /* group_cap: caller-wide quota, NONE: default */
	uint32_t *ep_head; /* group_cap: first endpoint quota, or NONE */
	uint32_t *epcls; /* nendpoints: class of each listed endpoint */
	/* The pattern callers ("PREFIX*", "*"): the table the keys'
	 * stacked levels come from (stack.c), installed with the config. */
	allot__patterns *pats;
	double *rate, *cut; /* n + 1: for the ceiling */
	uint32_t *prio;
	double *prev; /* 2 per quota: static rate and burst before */
	uint8_t *live; /* per quota: in the new config */
	/* New things, in the order they are published. */
	const char **new_qname; /* quota names, ids nquotas.. */
	const allot__quota **new_q;
	allot_key ***new_keys;
	uint32_t nnew_q;
	const char **new_id; /* identities, groups ngroups.. */
	uint64_t *new_idh;
	uint32_t nnew_g;
	const char **new_ep; /* endpoint names, classes nep.. */
	uint32_t nnew_ep;
	allot__idmap qmap, gmap, emap; /* scratch lookups */
} plan;

static void
plan_free(plan *p, bool keep_keys)
{
	if (!keep_keys && p->new_keys != NULL)
		for (uint32_t i = 0; i < p->nnew_q; i++)
			free(p->new_keys[i]);
	free(p->slot);
	free(p->grp);
	free(p->cls);
	free(p->ep_next);
	free(p->gq);
	free(p->ep_head);
	free(p->epcls);
	allot__patterns_free(p->pats);
	free(p->rate);
	free(p->cut);
	free(p->prio);
	free(p->prev);
	free(p->live);
	free(p->new_qname);
	free(p->new_q);
	free(p->new_keys);
	free(p->new_id);
	free(p->new_idh);
	free(p->new_ep);
	allot__idmap_fini(&p->qmap);
	allot__idmap_fini(&p->gmap);
	allot__idmap_fini(&p->emap);
}

static int
plan_alloc(allot_agent *a, const allot_config *cfg, plan *p)
{
	size_t n = cfg->ncallers, n1 = n + 1;
	uint32_t nq = atomic_load(&a->nquotas);
	p->n = n;
	p->slot = malloc(sizeof *p->slot * n1);
	p->grp = malloc(sizeof *p->grp * n1);
	p->cls = malloc(sizeof *p->cls * n1);
	p->ep_next = malloc(sizeof *p->ep_next * n1);
	p->gq = malloc(sizeof *p->gq * a->group_cap);
	p->ep_head = malloc(sizeof *p->ep_head * a->group_cap);
	p->epcls = malloc(sizeof *p->epcls * (cfg->nendpoints + 1));
	p->rate = malloc(sizeof *p->rate * n1);
	p->cut = malloc(sizeof *p->cut * n1);
	p->prio = malloc(sizeof *p->prio * n1);
	p->prev = malloc(sizeof *p->prev * 2 * (nq + n1));
	p->live = malloc(nq + n1);
	p->new_qname = calloc(n1, sizeof *p->new_qname);
	p->new_q = calloc(n1, sizeof *p->new_q);
	p->new_keys = calloc(n1, sizeof *p->new_keys);
	p->new_id = calloc(n1, sizeof *p->new_id);
	p->new_idh = calloc(n1, sizeof *p->new_idh);
	p->new_ep = calloc(n1 + cfg->nendpoints, sizeof *p->new_ep);
	if (p->slot == NULL || p->grp == NULL || p->cls == NULL ||
	    p->ep_next == NULL || p->gq == NULL || p->ep_head == NULL ||
	    p->epcls == NULL || p->rate == NULL || p->cut == NULL ||
	    p->prio == NULL || p->prev == NULL || p->live == NULL ||
	    p->new_qname == NULL || p->new_q == NULL || p->new_keys == NULL ||
	    p->new_id == NULL || p->new_idh == NULL || p->new_ep == NULL ||
	    allot__idmap_init(&p->qmap, nq + (uint32_t) n1) != ALLOT_OK ||
	    allot__idmap_init(&p->gmap, (uint32_t) n1) != ALLOT_OK ||
	    allot__idmap_init(&p->emap, (uint32_t) (n1 + cfg->nendpoints)) !=
	        ALLOT_OK)
		return ALLOT_ENOMEM;
	return ALLOT_OK;
}

/* The class of endpoint `name`: in force, or new in this plan (then a
 * class to come, NONE past the room left). */
static uint32_t
plan_endpoint(allot_agent *a, plan *p, const char *name, bool *full)
{
	size_t len = strlen(name);
	uint64_t h = allot__hash(name, len, a->seed);
	uint32_t c = allot__ep_find(a, name, len, h);
	if (c != NONE)
		return c;
	uint32_t pos = allot__idmap_start(&p->emap, h), v;
	while ((v = allot__idmap_next(&p->emap, h, &pos)) != ALLOT__IDMAP_NONE)
		if (strcmp(p->new_ep[v], name) == 0)
			return atomic_load(&a->nep) + v;
	uint32_t nep = atomic_load(&a->nep);
	if (len >= ALLOT__EP_NAME_SZ || nep + p->nnew_ep + 1 >= a->nclasses) {
		*full = true;
		return NONE;
	}
	allot__idmap_add(&p->emap, h, p->nnew_ep);
	p->new_ep[p->nnew_ep++] = name;
	return nep + p->nnew_ep - 1;
}

/* The group of identity `id`: in force or new in this plan. */
static int
plan_identity(allot_agent *a, plan *p, const char *id, uint32_t *ret,
    const char **ret_name)
{
	size_t len = strlen(id);
	uint64_t h = allot__hash(id, len, a->seed);
	allot_key *keys = group_find(a, id, len, h);
	if (keys != NULL) {
		*ret = group_of(a, keys);
		*ret_name = keys->identity;
		return ALLOT_OK;
	}
	uint32_t ng = atomic_load(&a->ngroups);
	uint32_t pos = allot__idmap_start(&p->gmap, h), v;
	while ((v = allot__idmap_next(&p->gmap, h, &pos)) != ALLOT__IDMAP_NONE)
		if (strcmp(p->new_id[v], id) == 0) {
			*ret = ng + v;
			*ret_name = p->new_id[v];
			return ALLOT_OK;
		}
	if (ng + p->nnew_g >= a->group_cap)
		return ALLOT_EFULL;
	/* A copy in the agent's names now: harmless if the plan fails. */
	const char *copy = arena_put(a, id, len);
	if (copy == NULL)
		return ALLOT_ENOMEM;
	allot__idmap_add(&p->gmap, h, p->nnew_g);
	p->new_idh[p->nnew_g] = h;
	p->new_id[p->nnew_g++] = copy;
	*ret = ng + p->nnew_g - 1;
	*ret_name = copy;
	return ALLOT_OK;
}

/* The id of config quota `cq` (wire key `key`): in force, removed (it
 * comes back to its slot), or new. */
static int
plan_quota(allot_agent *a, plan *p, const allot__quota *cq, const char *key,
    const char *stable, bool initial, size_t i, uint32_t *ret)
{
	size_t len = strlen(key);
	uint64_t h = allot__hash(key, len, a->seed);
	uint32_t nq = atomic_load(&a->nquotas);
	uint32_t pos = allot__idmap_start(&p->qmap, h), v;
	while (
	    (v = allot__idmap_next(&p->qmap, h, &pos)) != ALLOT__IDMAP_NONE) {
		const char *nm = v < a->quota_cap ?
		    a->quotas[v].name :
		    p->new_qname[v - a->quota_cap];
		if (strcmp(nm, key) != 0)
			continue;
		/* Twice in one config, or named as the default: the loader
		 * refuses both. */
		if (v >= a->quota_cap || a->quotas[v].is_default || p->live[v])
			return ALLOT_ECONFIG;
		p->live[v] = 1;
		*ret = v;
		return ALLOT_OK;
	}
	uint32_t id = initial ? (uint32_t) i : nq + p->nnew_q;
	if (!initial && id >= a->quota_cap)
		return ALLOT_EFULL;
	/* A caller-wide quota is named by its identity: the same copy. */
	const char *copy = stable != NULL ? stable : arena_put(a, key, len);
	allot_key **keys = calloc(a->nclasses, sizeof *keys);
	if (copy == NULL || keys == NULL) {
		free(keys);
		return ALLOT_ENOMEM;
	}
	allot__idmap_add(&p->qmap, h, a->quota_cap + p->nnew_q);
	p->new_qname[p->nnew_q] = copy;
	p->new_q[p->nnew_q] = cq;
	p->new_keys[p->nnew_q++] = keys;
	*ret = id;
	return ALLOT_OK;
}

static int
plan_make(allot_agent *a, const allot_config *cfg, bool initial, plan *p)
{
	p->initial = initial;
	int rc = plan_alloc(a, cfg, p);
	if (rc != ALLOT_OK)
		return rc;
	uint32_t nq = atomic_load(&a->nquotas);
	/* `live` marks the quotas in force that this config names. */
	memset(p->live, 0, nq + p->n + 1);
	for (uint32_t i = 0; i < nq; i++)
		allot__idmap_add(&p->qmap,
		    allot__hash(
		        a->quotas[i].name, strlen(a->quotas[i].name), a->seed),
		    i);
	if (initial)
		allot__idmap_add(&p->qmap, allot__hash("default", 7, a->seed),
		    a->default_quota);
	bool full = false;
	for (size_t j = 0; j < cfg->nendpoints; j++)
		p->epcls[j] = plan_endpoint(
		    a, p, cfg->endpoints[j].name, &full);
	char key[ALLOT_IDENTITY_MAX + ALLOT__EP_NAME_SZ + 2];
	for (size_t i = 0; i < p->n && !full; i++) {
		const allot__quota *cq = &cfg->callers[i];
		/* The wire key: the identity itself, or "IDENTITY ENDPOINT".
		 */
		const char *kname = cq->identity;
		if (cq->endpoint != NULL) {
			if (allot__quota_key(cq, key, sizeof key) >=
			    sizeof key)
				return ALLOT_ECONFIG;
			kname = key;
		}
		p->cls[i] = cq->endpoint == NULL ?
		    NONE :
		    plan_endpoint(a, p, cq->endpoint, &full);
		/* A pattern is a group of callers, not one: no identity
		 * of its own. */
		const char *idname = NULL;
		p->grp[i] = NONE;
		if ((!allot__identity_is_pattern(cq->identity) &&
		        (rc = plan_identity(a, p, cq->identity, &p->grp[i],
		             &idname)) != ALLOT_OK) ||
		    (rc = plan_quota(a, p, cq, kname,
		         cq->endpoint == NULL ? idname : NULL, initial, i,
		         &p->slot[i])) != ALLOT_OK)
			return rc;
	}
	if (full)
		return ALLOT_EFULL;
	return allot__patterns_build(cfg, p->slot, p->cls, &p->pats);
}

/* ---- applying a plan ---- */

/* The ceiling's cut of every quota in the new config (fallback.h). */
static void
apply_ceiling(allot_agent *a, const allot_config *cfg, plan *p)
{
	size_t m = 0;
	uint32_t *idx = p->ep_next; /* scratch until apply_keys fills it */
	for (size_t i = 0; i <= p->n; i++) {
		uint32_t s = i < p->n ? p->slot[i] : a->default_quota;
		if (s == NONE)
			continue;
		const allot__quota *cq = i < p->n ? &cfg->callers[i] :
		                                    &cfg->def;
		p->rate[m] = cq->rate;
		p->prio[m] = cq->priority;
		idx[m++] = s;
	}
	allot__ceiling_fit(cfg->ceiling_rate, m, p->rate, p->prio, p->cut);
	bool cuts = false;
	for (size_t j = 0; j < m; j++) {
		allot__qrt *q = &a->quotas[idx[j]];
		q->static_rate = p->cut[j];
		q->static_burst = q->q->burst * (p->cut[j] / q->q->rate);
		cuts |= p->cut[j] < q->q->rate;
	}
	/* The ceiling's level (ceiling.c): only where it may cut. */
	atomic_store(&a->ceil_on, cuts);
}

/* Quotas: the new ones opened and published, the others pointed at the
 * new config, the removed ones marked. Local-only, a changed static
 * share is installed at once; with a coordinator the sync engine
 * installs from the shares of the reply that carried the config. */
static void
apply_quotas(allot_agent *a, const allot_config *cfg, plan *p, bool initial)
{
	uint32_t nq = initial ? 0 : atomic_load(&a->nquotas);
	uint32_t nq_new = initial ? (uint32_t) p->n + 1 : nq + p->nnew_q;
	/* The new quotas, in the order they were planned. */
	uint32_t k = 0;
	for (size_t i = 0; i < p->n; i++) {
		uint32_t s = p->slot[i];
		if (s == NONE || (s < nq && s != a->default_quota))
			continue;
		quota_open(
		    a, s, &cfg->callers[i], p->new_qname[k], p->new_keys[k]);
		k++;
	}
	/* What each static share was, to install only the changed ones;
	 * then every quota pointed at the new config or marked removed. */
	for (uint32_t i = 0; i < nq_new; i++) {
		allot__qrt *q = &a->quotas[i];
		p->prev[2 * i] = q->static_rate;
		p->prev[2 * i + 1] = atomic_load(&q->removed) ?
		    -1.0 :
		    q->static_burst;
		p->live[i] = i == a->default_quota;
	}
	for (size_t i = 0; i < p->n; i++)
		if (p->slot[i] != NONE) {
			p->live[p->slot[i]] = 1;
			a->quotas[p->slot[i]].q = &cfg->callers[i];
		}
	a->quotas[a->default_quota].q = &cfg->def;
	for (uint32_t i = 0; i < nq_new; i++) {
		atomic_store(&a->quotas[i].removed, !p->live[i]);
		if (!p->live[i])
			a->quotas[i].q = &cfg->def;
	}
	atomic_store(&a->max_weight, cfg->max_weight);
	for (uint32_t i = 0; i < nq_new; i++) {
		const allot__quota *cq = a->quotas[i].q;
		atomic_store(&a->quotas[i].wmax,
		    cq->endpoint != NULL ?
		        allot__config_weight(cfg, cq->endpoint) :
		        cfg->max_weight);
		atomic_store(&a->quotas[i].max_cost, max_cost_of(cq));
	}
	apply_ceiling(a, cfg, p);
	for (uint32_t i = 0; i < nq_new; i++) {
		allot__qrt *q = &a->quotas[i];
		if (!p->live[i])
			continue;
		allot__allowance al;
		static_of(a, q, a->opts.initial_replicas, false, &al);
		uint8_t access = (uint8_t) q->q->access;
		bool access_moved = atomic_load(&q->access) != access;
		if (access_moved)
			atomic_store(&q->access, access);
		if (initial || i >= nq) {
			allot__quota_fix(q, &al);
			allot__bucket_init(&q->bucket, &al);
			q->cut = al; /* the ceiling's level: see below */
		} else if (access_moved ||
		    (a->coordinator == NULL &&
		        (p->prev[2 * i] != q->static_rate ||
		            p->prev[2 * i + 1] != q->static_burst))) {
			/* Closed or unlimited from now on, or limited again:
			 * at its static share until a coordinator's grant. */
			allot__quota_set(a, q, &al);
		}
		/* In the line every decision reads: stored on a change only.
		 */
		if (atomic_load(&q->bucket.shadow) != q->q->shadow)
			atomic_store(&q->bucket.shadow, q->q->shadow);
	}
	atomic_store_explicit(&a->nquotas, nq_new, memory_order_release);
}

/* Every configured identity's keys pointed at the quota the new config
 * gives them (dyn_lock held): its endpoint quota for that class, else
 * its caller-wide quota, else the default. */
static void
apply_keys(allot_agent *a, plan *p)
{
	uint32_t ng = atomic_load(&a->ngroups);
	uint32_t nq = atomic_load(&a->nquotas);
	for (uint32_t g = 0; g < ng; g++)
		p->gq[g] = p->ep_head[g] = NONE;
	for (size_t i = 0; i < p->n; i++) {
		uint32_t g = p->grp[i];
		if (p->slot[i] == NONE || g == NONE) /* a pattern: stack.c */
			continue;
		if (p->cls[i] == NONE) {
			p->gq[g] = p->slot[i];
		} else {
			p->ep_next[i] = p->ep_head[g];
			p->ep_head[g] = (uint32_t) i;
		}
	}
	for (uint32_t i = 0; i < nq; i++)
		a->quotas[i].nkeys = 0;
	allot__qrt *def = &a->quotas[a->default_quota];
	uint32_t nep = atomic_load(&a->nep);
	for (uint32_t g = 0; g < ng; g++) {
		bool known = p->gq[g] != NONE || p->ep_head[g] != NONE;
		for (uint32_t i = 0; i <= nep; i++) {
			uint32_t c = allot__class_at(a, i, nep);
			allot__qrt *q = p->gq[g] != NONE ?
			    &a->quotas[p->gq[g]] :
			    def;
			for (uint32_t e = p->ep_head[g]; e != NONE;
			     e = p->ep_next[e])
				if (p->cls[e] == c)
					q = &a->quotas[p->slot[e]];
			allot_key *k = allot__known_key(a, g, c);
			charge(a, k, q,
			    atomic_load_explicit(
			        &a->class_weight[c], memory_order_relaxed),
			    p->initial);
			allot__stack_set(a, k, k->identity,
			    q->q->stacked && p->gq[g] != NONE ? p->gq[g] :
			                                        NONE);
			if (atomic_load_explicit(
			        &k->known, memory_order_relaxed) != known)
				atomic_store_explicit(
				    &k->known, known, memory_order_relaxed);
			if (q->nkeys < q->keys_cap)
				q->keys[q->nkeys++] = k;
		}
	}
	/* The unknown identities' pool, anonymous and overflow keys: the
	 * default quota, new weights, their stacked levels (every caller's;
	 * an unknown identity's group's too). */
	allot_key *sets[] = { a->anon_keys, a->overflow_keys };
	for (size_t s = 0; s < 2; s++)
		for (uint32_t c = 0; c < a->nclasses; c++) {
			atomic_store_explicit(&sets[s][c].weight,
			    atomic_load(&a->class_weight[c]),
			    memory_order_relaxed);
			allot__stack_set(a, &sets[s][c], NULL, NONE);
		}
	for (uint32_t i = 0; i < a->dyn_cap; i++) {
		allot_key *k = &a->dyn_keys[i];
		atomic_store_explicit(&k->weight,
		    atomic_load(&a->class_weight[k->cls]),
		    memory_order_relaxed);
		allot__stack_set(a, k, k->identity, NONE);
	}
}

/* The index entries' quota hints follow their identity's keys. */
static void
apply_hints(allot_agent *a)
{
	for (uint32_t p = 0; p <= a->caller_mask; p++) {
		uint64_t e = atomic_load_explicit(
		    &a->caller_tab[p], memory_order_relaxed);
		if (e == 0)
			continue;
		uint64_t n = group_entry(a, allot__caller_group(e), e);
		if (n != e)
			atomic_store_explicit(
			    &a->caller_tab[p], n, memory_order_relaxed);
	}
}

static void
apply(allot_agent *a, allot_config *cfg, plan *p, bool initial)
{
	/* Endpoint weights: every class that the config does not list
	 * (the default, endpoints it dropped) weighs default_weight. */
	uint32_t w[ALLOT__MAX_ENDPOINTS + 1];
	for (uint32_t c = 0; c < a->nclasses; c++)
		w[c] = cfg->default_weight;
	for (size_t j = 0; j < cfg->nendpoints; j++)
		w[p->epcls[j]] = cfg->endpoints[j].weight;
	uint32_t nep = atomic_load(&a->nep);
	for (uint32_t j = 0; j < p->nnew_ep; j++)
		ep_add(a, p->new_ep[j], w[nep + j]);
	for (uint32_t c = 0; c < a->nclasses; c++)
		atomic_store_explicit(
		    &a->class_weight[c], w[c], memory_order_relaxed);

	/* The ceiling's level follows who is a member, which the quotas'
	 * access and shadow decide, before the keys take their levels. */
	apply_quotas(a, cfg, p, initial);
	allot__ceiling_update(a);
	uint32_t ng = atomic_load(&a->ngroups);
	for (uint32_t g = 0; g < p->nnew_g; g++)
		group_add(a, ng + g, p->new_id[g], p->new_idh[g]);

	pthread_mutex_lock(&a->dyn_lock);
	allot__patterns *pats = a->pats;
	a->pats = p->pats; /* its prefixes are cfg's */
	p->pats = pats; /* freed with the plan */
	apply_keys(a, p);
	allot_config *old = a->cfg;
	a->cfg = cfg;
	allot__values_apply(a);
	pthread_mutex_unlock(&a->dyn_lock);
	apply_hints(a);
	allot_config_free(old);
}

int
allot__reconfig(allot_agent *a, allot_config *cfg, bool initial)
{
	plan p;
	memset(&p, 0, sizeof p);
	pthread_mutex_lock(&a->cfg_lock);
	int rc = allot__values_reserve(a, cfg);
	if (rc == ALLOT_OK)
		rc = plan_make(a, cfg, initial, &p);
	if (rc == ALLOT_OK) {
		apply(a, cfg, &p, initial);
		allot__log(&a->log, ALLOT_LOG_INFO, "ALLOT-CONFIG-INSTALL",
		    "config %016llx installed: %zu quotas (%u new), %u "
		    "identities, %u endpoint classes, ceiling %g/s",
		    (unsigned long long) cfg->digest, cfg->ncallers + 1,
		    p.nnew_q, atomic_load(&a->ngroups),
		    atomic_load(&a->nep) + 1, cfg->ceiling_rate);
	} else if (rc == ALLOT_EFULL) {
		allot__log(&a->log, ALLOT_LOG_ERR, "ALLOT-CONFIG-FULL",
		    "config %016llx refused, nothing changed: it needs more "
		    "than the room reserved at start (%u callers, %u endpoint "
		    "classes); restart the agent with a larger max_callers",
		    (unsigned long long) cfg->digest, a->group_cap,
		    a->nclasses - 1);
	}
	plan_free(&p, rc == ALLOT_OK);
	pthread_mutex_unlock(&a->cfg_lock);
	return rc;
}

/* ---- the installer and the public call ---- */

static void
install(void *ctx, uint32_t quota, const allot__allowance *al,
    const allot__allowance *own)
{
	allot_agent *a = ctx;
	allot__quota_set_own(a, &a->quotas[quota], al, own);
}

static int
reconfig(void *ctx, allot_config *cfg)
{
	return allot__reconfig(ctx, cfg, false);
}

static void
static_allowance(void *ctx, uint32_t quota, uint32_t replicas, bool fallback,
    allot__allowance *ret)
{
	allot_agent *a = ctx;
	static_of(a, &a->quotas[quota], replicas, fallback, ret);
}

void
allot__agent_installer(allot_agent *a, allot__installer *ret)
{
	*ret = (allot__installer) { .install = install,
		.ctx = a,
		.reconfig = reconfig,
		.static_allowance = static_allowance };
}

int
allot_agent_set_config(allot_agent *a, const allot_config *cfg)
{
	if (a == NULL || cfg == NULL)
		return ALLOT_EINVAL;
	if (a->coordinator != NULL)
		return ALLOT_ESTATE;
	allot_config *view;
	int rc = allot__config_select(cfg, a->service, &view);
	if (rc != ALLOT_OK)
		return rc;
	rc = allot__reconfig(a, view, false);
	if (rc != ALLOT_OK)
		allot_config_free(view);
	return rc;
}
