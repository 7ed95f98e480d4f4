/* SPDX-License-Identifier: MIT */
/*
 * Per-value buckets across replicas (docs/allocation.md, "Per-value
 * buckets"). With `shared: false` on a default quota, each unknown
 * caller (each value) has a bucket of its own in every agent
 * (agent/values.h), with the quota's rate R and burst B. A value active
 * on one replica runs on the whole quota there; one active on several
 * would get R from each. So each Sync reports the values that moved
 * (Sync.values), and its Reply gives back, for each of them, this
 * replica's part (Reply.values): R and B split over the replicas the
 * value was reported by within the last ALLOT__VALUE_IDLE_NS, max-min
 * fair by their traffic there (admitted plus denied tokens a second,
 * at most R each, smoothed over two reports; vpart()). The parts sum to
 * at most R and B, so a value is held to its quota globally within one
 * sync interval of its spreading to a new replica, and no replica gets
 * less than min(its traffic, R / n), whatever the others report.
 *
 * Bounded: a service's table holds at most ALLOT__VALUES_SVC_MAX values
 * (past it, new values are not split: they run on the whole quota
 * where they are, counted in allotd_values_unsplit_total), a session a
 * part of at most ALLOT__VALUES_SESSION_MAX (so one peer cannot fill the
 * table; its values past that are unsplit too), a value
 * follows at most ALLOT__VALUE_REPLICAS replicas (more share the
 * smallest part's slot), a Sync's reports past ALLOT__VALUES_SYNC_MAX
 * are dropped, and a value nobody reported for ALLOT__VALUE_IDLE_NS
 * leaves the table at the next second. Under the state's lock.
 */
#include "registry_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"
#include "idmap.h"

/* Values one service's table holds. */
#define ALLOT__VALUES_SVC_MAX 65536u
/* Replicas a value's split follows. */
#define ALLOT__VALUE_REPLICAS 8u
/* A replica's part counts this long after its last report of it. */
#define ALLOT__VALUE_IDLE_NS 3000000000u
/* A replica's claim on a value: its traffic there with this much
 * headroom (at most R), so that a replica served its claim exactly is
 * not refused by the jitter of its own traffic. */
#define ALLOT__VALUE_HEADROOM 1.5
/* Values one session may hold a part of: one peer cannot fill its
 * service's table (the agent's default pool is half this). */
#define ALLOT__VALUES_SESSION_MAX 8192u
/* Value reports read from one Sync (the agent sends 256 at most). */
#define ALLOT__VALUES_SYNC_MAX 256u

typedef struct vrep {
	uint64_t session; /* 0: free */
	double rate; /* its traffic there, tokens/s, smoothed */
	uint64_t seen_ns;
} vrep;

typedef struct vent {
	char *value;
	uint64_t hash;
	int32_t q;
	vrep r[ALLOT__VALUE_REPLICAS];
} vent;

struct allot__vtab {
	vent *e;
	uint32_t n, cap;
	allot__idmap index;
};

static uint64_t
vhash(int32_t q, const char *value, size_t len)
{
	return allot__hash(value, len, (uint64_t) q * 0x9e3779b97f4a7c15u);
}

static allot__vtab *
vtab_get(service *svc)
{
	if (svc->vals != NULL)
		return svc->vals;
	allot__vtab *t = calloc(1, sizeof *t);
	if (t == NULL)
		return NULL;
	if (allot__idmap_init(&t->index, ALLOT__VALUES_SVC_MAX) != ALLOT_OK) {
		allot__idmap_fini(&t->index);
		free(t);
		return NULL;
	}
	svc->vals = t;
	return t;
}

void
allot__values_free(service *svc)
{
	allot__vtab *t = svc->vals;
	if (t == NULL)
		return;
	for (uint32_t i = 0; i < t->n; i++)
		free(t->e[i].value);
	free(t->e);
	allot__idmap_fini(&t->index);
	free(t);
	svc->vals = NULL;
}

static vent *
vfind(allot__vtab *t, int32_t q, const char *value, uint64_t h)
{
	uint32_t pos = allot__idmap_start(&t->index, h), i;
	while (
	    (i = allot__idmap_next(&t->index, h, &pos)) != ALLOT__IDMAP_NONE)
		if (t->e[i].q == q && strcmp(t->e[i].value, value) == 0)
			return &t->e[i];
	return NULL;
}

/* A new entry, or NULL when the table is full (or out of memory). */
static vent *
vadd(allot__vtab *t, int32_t q, const char *value, size_t len, uint64_t h)
{
	if (t->n >= ALLOT__VALUES_SVC_MAX)
		return NULL;
	if (t->n == t->cap) {
		uint32_t cap = t->cap > 0 ? 2 * t->cap : 64;
		vent *e = realloc(t->e, (size_t) cap * sizeof *e);
		if (e == NULL)
			return NULL;
		t->e = e;
		t->cap = cap;
	}
	vent *e = &t->e[t->n];
	memset(e, 0, sizeof *e);
	if ((e->value = malloc(len + 1)) == NULL)
		return NULL;
	memcpy(e->value, value, len + 1);
	e->hash = h;
	e->q = q;
	allot__idmap_add(&t->index, h, t->n);
	t->n++;
	return e;
}

/* Entry i leaves; the last takes its place. */
static void
vdel(allot__vtab *t, uint32_t i)
{
	allot__idmap_remove(&t->index, t->e[i].hash, i);
	free(t->e[i].value);
	uint32_t last = --t->n;
	if (i == last)
		return;
	allot__idmap_remove(&t->index, t->e[last].hash, last);
	t->e[i] = t->e[last];
	allot__idmap_add(&t->index, t->e[i].hash, i);
}

/* Whether slot `r` counts at `now`: a session reported the value within
 * ALLOT__VALUE_IDLE_NS. */
static bool
vlive(const vrep *r, uint64_t now)
{
	return r->session != 0 &&
	    since(now, r->seen_ns) < ALLOT__VALUE_IDLE_NS;
}

/* Slot `r` of a value is let go: its session holds one part less. */
static void
vdrop(const allot__state *st, vrep *r)
{
	if (r->session != 0) {
		session *o = allot__session_find(st, r->session);
		if (o != NULL && o->nvalues > 0)
			o->nvalues--;
	}
	memset(r, 0, sizeof *r);
}

/* Session `s`'s slot of `e`: its own, else (within its
 * ALLOT__VALUES_SESSION_MAX) a free or stale one, else the one with the
 * least traffic; NULL when it holds as many as it may. */
static vrep *
vslot(const allot__state *st, vent *e, session *s, uint64_t now)
{
	vrep *least = &e->r[0], *r = NULL;
	for (uint32_t j = 0; j < ALLOT__VALUE_REPLICAS; j++)
		if (e->r[j].session == s->id)
			return &e->r[j];
	if (s->nvalues >= ALLOT__VALUES_SESSION_MAX)
		return NULL;
	for (uint32_t j = 0; j < ALLOT__VALUE_REPLICAS && r == NULL; j++) {
		vrep *x = &e->r[j];
		if (!vlive(x, now))
			r = x;
		else if (x->rate < least->rate)
			least = x;
	}
	if (r == NULL)
		r = least;
	vdrop(st, r);
	s->nvalues++;
	return r;
}

bool
allot__quota_per_value(const cfgv *v, int32_t q)
{
	return q >= 0 && (size_t) q < v->nq && !v->q[q]->shared &&
	    strcmp(v->q[q]->identity, "default") == 0;
}

/* This replica's part of value `e` (its slot `me`) at `now`: rate and
 * burst, and the replicas it is active on. Max-min fair over their
 * claims c_i (traffic with headroom, at most R): while the c_i sum to
 * at most R, parts in proportion to them (all of R handed out); beyond
 * it, each gets min(c_i, L), the level L where those sum to R. So a
 * replica gets at least min(c_i, R / n): never less than the equal
 * split would give its traffic, however much the others claim. The
 * burst in the same proportion. */
static void
vpart(const cfgv *v, const vent *e, const vrep *me, uint64_t now,
    Allot__V1__ValueShare *ret)
{
	double x[ALLOT__VALUE_REPLICAS], sum = 0;
	uint32_t n = 0;
	for (uint32_t j = 0; j < ALLOT__VALUE_REPLICAS; j++) {
		const vrep *r = &e->r[j];
		if (!vlive(r, now))
			continue;
		x[n] = fmin(v->rate[e->q], ALLOT__VALUE_HEADROOM * r->rate);
		sum += x[n++];
	}
	double R = v->rate[e->q], f;
	double mine = fmin(R, ALLOT__VALUE_HEADROOM * me->rate);
	if (n <= 1) {
		f = 1.0;
	} else if (!(sum > 0)) {
		f = 1.0 / n;
	} else if (sum <= R) {
		f = mine / sum;
	} else {
		/* The level: the fewest-traffic replicas served in full,
		 * the rest sharing what is left equally. */
		for (uint32_t i = 1; i < n; i++)
			for (uint32_t j = i; j > 0 && x[j - 1] > x[j]; j--) {
				double t = x[j];
				x[j] = x[j - 1];
				x[j - 1] = t;
			}
		double left = R, level = R / n;
		for (uint32_t i = 0; i < n; i++) {
			level = left / (double) (n - i);
			if (x[i] >= level)
				break;
			left -= x[i];
		}
		f = fmin(mine, level) / R;
	}
	ret->rate = R * f;
	ret->burst = v->burst[e->q] * f;
	ret->replicas = n > 0 ? n : 1;
}

void
allot__values_sync(allot__state *st, service *svc, session *s,
    const Allot__V1__Sync *req, uint64_t now, ProtobufCAllocator *pa,
    Allot__V1__Reply *ret)
{
	const cfgv *v = st->cur;
	size_t n = req->n_values < ALLOT__VALUES_SYNC_MAX ?
	    req->n_values :
	    ALLOT__VALUES_SYNC_MAX;
	if (n == 0)
		return;
	allot__vtab *t = vtab_get(svc);
	Allot__V1__ValueShare *arr = allot__pa_alloc(pa, n * sizeof *arr);
	Allot__V1__ValueShare **ptrs = allot__pa_alloc(pa, n * sizeof *ptrs);
	if (t == NULL || arr == NULL || ptrs == NULL)
		return;
	double dt = s->interval_s > 0 ? s->interval_s : 0.1;
	if (req->elapsed_ms > 0)
		dt = (double) req->elapsed_ms / 1e3;
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		const Allot__V1__ValueReport *r = req->values[i];
		skey *key = session_key(s, r->key);
		if (key == NULL || !allot__quota_per_value(v, key->q) ||
		    r->value == NULL)
			continue;
		size_t len = strnlen(r->value, ALLOT__STATE_NAME_MAX + 1);
		if (len == 0 || len > ALLOT__STATE_NAME_MAX)
			continue;
		uint64_t h = vhash(key->q, r->value, len);
		vent *e = vfind(t, key->q, r->value, h);
		if (e == NULL &&
		    (s->nvalues >= ALLOT__VALUES_SESSION_MAX ||
		        (e = vadd(t, key->q, r->value, len, h)) == NULL)) {
			svc->values_unsplit++;
			continue;
		}
		/* Its traffic here: admitted and denied tokens a second,
		 * at most the quota's rate (no replica may claim more of a
		 * value than the whole of it), smoothed over two reports. */
		double R = v->rate[key->q];
		double x = ((double) r->admitted + (double) r->denied) / dt;
		if (x > R)
			x = R;
		vrep *me = vslot(st, e, s, now);
		if (me == NULL) {
			svc->values_unsplit++;
			continue;
		}
		me->rate = me->session == s->id ? 0.5 * me->rate + 0.5 * x : x;
		me->session = s->id;
		me->seen_ns = now;
		Allot__V1__ValueShare *vs = &arr[k];
		allot__v1__value_share__init(vs);
		vs->key = r->key;
		/* A copy: the Reply is packed after the lock is released,
		 * when the entry may have gone. */
		if ((vs->value = allot__pa_alloc(pa, len + 1)) == NULL)
			break;
		memcpy(vs->value, e->value, len + 1);
		vpart(v, e, me, now, vs);
		ptrs[k++] = vs;
	}
	ret->values = k > 0 ? ptrs : NULL;
	ret->n_values = k;
}

void
allot__values_second(const allot__state *st, service *svc, uint64_t now)
{
	allot__vtab *t = svc->vals;
	if (t == NULL)
		return;
	for (uint32_t i = t->n; i-- > 0;) {
		vent *e = &t->e[i];
		bool live = false;
		for (uint32_t j = 0; j < ALLOT__VALUE_REPLICAS; j++) {
			vrep *r = &e->r[j];
			if (vlive(r, now))
				live = true;
			else if (r->session != 0)
				vdrop(st, r);
		}
		if (!live)
			vdel(t, i);
	}
	/* A table that emptied goes: a service that once had values costs
	 * nothing once they are idle. */
	if (t->n == 0)
		allot__values_free(svc);
}

uint32_t
allot__values_count(const service *svc)
{
	return svc->vals != NULL ? svc->vals->n : 0;
}
