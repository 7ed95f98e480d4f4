/* SPDX-License-Identifier: MIT */
/*
 * The registry: the services and their replica sessions. Creating and
 * destroying the state, the session hash by id, finding or adding a
 * service, linking a session into its service and unlinking it (its
 * grants go back to the headroom), the expiry time of a session, the
 * silence of the whole coordinator (allot__heard()), freeing a service
 * left empty, and the expired replicas:
 * expired replicas that may still be running on their lease or their
 * fallback, remembered so that the live bound (bounds.c) and, with
 * hold_expired, the headroom (grants.c) still count them.
 */
#include "registry_int.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "hash.h"

void
allot__session_free(session *s)
{
	if (s == NULL)
		return;
	free(s->replica_id);
	free(s->host);
	free(s->agent_version);
	free(s->keys);
	free(s->kid);
	free(s->names);
	free(s->names_blob);
	free(s);
}

session *
allot__session_find(const allot__state *st, uint64_t id)
{
	session *s = st->htab[allot__mix64(id) & st->hmask];
	while (s != NULL && s->id != id)
		s = s->hnext;
	return s;
}

void
allot__session_hash_add(allot__state *st, session *s)
{
	size_t b = allot__mix64(s->id) & st->hmask;
	s->hnext = st->htab[b];
	st->htab[b] = s;
}

void
allot__session_hash_del(allot__state *st, session *s)
{
	session **pp = &st->htab[allot__mix64(s->id) & st->hmask];
	while (*pp != NULL && *pp != s)
		pp = &(*pp)->hnext;
	if (*pp == s)
		*pp = s->hnext;
	s->hnext = NULL;
}

service *
allot__service_find(const allot__state *st, const char *name)
{
	for (size_t i = 0; i < st->nsvcs; i++)
		if (strcmp(st->svcs[i]->name, name) == 0)
			return st->svcs[i];
	return NULL;
}

void
allot__squota_init(squota *sq, const cfgv *v, size_t q)
{
	memset(sq, 0, sizeof *sq);
	sq->level = v->burst[q];
	sq->level_recorded = NAN;
}

/* NULL when out of memory or the table is full (*full set). A new
 * service owns every quota: allot__service_open() settles its cluster
 * ownership. */
service *
allot__service_get(allot__state *st, const char *name, bool *full)
{
	*full = false;
	service *svc = allot__service_find(st, name);
	if (svc != NULL)
		return svc;
	if (st->nsvcs >= st->o.max_services) {
		*full = true;
		return NULL;
	}
	service **arr = realloc(st->svcs, (st->nsvcs + 1) * sizeof *arr);
	if (arr == NULL)
		return NULL;
	st->svcs = arr;
	svc = calloc(1, sizeof *svc);
	if (svc == NULL)
		return NULL;
	svc->name = strdup(name);
	svc->q = calloc(st->cur->nq, sizeof *svc->q);
	if (svc->name == NULL || svc->q == NULL) {
		free(svc->name);
		free(svc->q);
		free(svc);
		return NULL;
	}
	for (size_t q = 0; q < st->cur->nq; q++)
		allot__squota_init(&svc->q[q], st->cur, q);
	st->svcs[st->nsvcs++] = svc;
	return svc;
}

static void
service_free(service *svc)
{
	for (uint32_t j = 0; j < svc->nsess; j++)
		allot__session_free(svc->sess[j]);
	allot__expired_clear(svc);
	allot__values_free(svc);
	free(svc->sess);
	free(svc->q);
	free(svc->name);
	free(svc);
}

/* Whether `svc` has had no replica, live, restored or expired, for
 * service_idle_ms: its counters and global buckets then describe nothing
 * that runs, and it is freed (a later Register starts it afresh), so
 * that Register+Leave pairs under new names cannot fill the table. */
bool
allot__service_idle(allot__state *st, service *svc, uint64_t now)
{
	if (svc->nsess > 0 || svc->nzs > 0 || st->o.service_idle_ms == 0) {
		svc->empty_ns = 0;
		return false;
	}
	if (svc->empty_ns == 0) {
		svc->empty_ns = now ? now : 1;
		return false;
	}
	return since(now, svc->empty_ns) >=
	    (uint64_t) st->o.service_idle_ms * 1000000u;
}

/* Free the service at index i of st->svcs; the others keep their order. */
void
allot__service_remove(allot__state *st, size_t i)
{
	service_free(st->svcs[i]);
	memmove(&st->svcs[i], &st->svcs[i + 1],
	    (st->nsvcs - i - 1) * sizeof *st->svcs);
	st->nsvcs--;
}

bool
allot__service_add(service *svc, session *s)
{
	if (svc->nsess == svc->cap) {
		uint32_t cap = svc->cap ? svc->cap * 2 : 8;
		session **arr = realloc(svc->sess, cap * sizeof *arr);
		if (arr == NULL)
			return false;
		svc->sess = arr;
		svc->cap = cap;
	}
	s->svc = svc;
	s->slot = svc->nsess;
	svc->sess[svc->nsess++] = s;
	svc->dirty = true;
	return true;
}

/* Take `s` out of the registry (its memory stays for the caller). */
void
allot__session_unlink(allot__state *st, session *s)
{
	service *svc = s->svc;
	if (!s->placeholder)
		allot__session_hash_del(st, s);
	for (uint32_t k = 0; k < s->nkeys; k++) {
		const skey *key = &s->keys[k];
		if (key->q < 0)
			continue;
		squota *sq = &svc->q[key->q];
		/* Its grant goes back to the headroom. */
		svc->held_total -= key_hold(key);
		if (!isnan(key->grant_rate)) {
			sq->granted_rate -= key->grant_rate;
			sq->granted_burst -= key->grant_burst;
			sq->own_extra_rate -= own_extra_rate(key);
			sq->own_extra_burst -= own_extra_burst(key);
		}
	}
	uint32_t last = svc->nsess - 1;
	if (s->slot != last) {
		svc->sess[s->slot] = svc->sess[last];
		svc->sess[s->slot]->slot = s->slot;
	}
	svc->nsess--;
	svc->dirty = true;
	st->nsessions--;
}

uint64_t
allot__expiry_ns(const allot__state *st, uint32_t agent_interval_ms)
{
	uint32_t iv = st->o.interval_ms;
	if (agent_interval_ms > ALLOT__STATE_AGENT_INTERVAL_MAX)
		agent_interval_ms = ALLOT__STATE_AGENT_INTERVAL_MAX;
	if (agent_interval_ms > iv)
		iv = agent_interval_ms;
	/* An agent gives an exchange up after max(2T, 250 ms) and retries
	 * after a backoff: one lost reply must never expire a replica, so
	 * the silence tolerated covers two such timeouts plus an interval. */
	uint64_t timeout = 2u * (uint64_t) iv > 250u ? 2u * (uint64_t) iv :
	                                               250u;
	uint64_t floor_ms = 2u * timeout + iv;
	uint64_t k_ms = (uint64_t) iv * st->o.expiry_intervals;
	return (k_ms > floor_ms ? k_ms : floor_ms) * 1000000u;
}

/* A request from a replica: the coordinator is not cut off. When nobody
 * had been heard for K intervals, that silence was more likely the
 * coordinator's own network than every replica dying at once: the
 * silent replicas of services that had two or more get learn_ms to come
 * back before they expire, so the first to return is not handed the
 * shares of the others, which are running on their lease or fallback.
 * Under the lock. */
void
allot__heard(allot__state *st, uint64_t now)
{
	uint64_t win = allot__expiry_ns(st, 0);
	if (st->last_heard_ns != 0 && since(now, st->last_heard_ns) > win &&
	    st->o.learn_ms > 0) {
		st->grace_until_ns = now +
		    (uint64_t) st->o.learn_ms * 1000000u;
		for (size_t i = 0; i < st->nsvcs; i++)
			st->svcs[i]->nsess_silenced = st->svcs[i]->nsess;
	}
	st->last_heard_ns = now;
}

bool
allot__grow(void **p, size_t *cap, size_t need, size_t elem)
{
	if (need <= *cap)
		return true;
	size_t c = *cap ? *cap : 64;
	while (c < need)
		c *= 2;
	void *np = realloc(*p, c * elem);
	if (np == NULL)
		return false;
	*p = np;
	*cap = c;
	return true;
}

static void
expired_free(expired_rep *z)
{
	free(z->replica_id);
	free(z->rate);
	free(z->burst);
}

void
allot__expired_clear(service *svc)
{
	for (uint32_t i = 0; i < svc->nzs; i++)
		expired_free(&svc->zs[i]);
	free(svc->zs);
	svc->zs = NULL;
	svc->nzs = 0;
}

static void
expired_remove(service *svc, uint32_t i)
{
	expired_free(&svc->zs[i]);
	svc->zs[i] = svc->zs[--svc->nzs];
}

/* The replica registered again: its new session is what it holds. */
void
allot__expired_forget(service *svc, const char *replica_id)
{
	for (uint32_t i = 0; i < svc->nzs; i++) {
		if (strcmp(svc->zs[i].replica_id, replica_id) == 0) {
			expired_remove(svc, i);
			return;
		}
	}
}

/* Remember what the expiring session `s` may still hold. Without memory
 * it is simply not counted (the bound then under-reports). */
void
allot__expired_add(
    allot__state *st, service *svc, const session *s, uint64_t now)
{
	allot__expired_forget(svc, s->replica_id);
	const cfgv *v = st->cur;
	expired_rep *arr = realloc(svc->zs, (svc->nzs + 1) * sizeof *arr);
	if (arr == NULL)
		return;
	svc->zs = arr;
	expired_rep z = {
		.replica_id = strdup(s->replica_id),
		.reply_ns = s->last_reply_ns,
		.acked_ns = s->acked_reply_ns,
		.drop_ns = now + (uint64_t) st->o.counted_ms * 1000000u,
		.n_last = fewest(s),
		.interval_s = s->interval_s,
		.epoch = v->epoch,
		.rate = malloc(v->nq * sizeof(double)),
		.burst = malloc(v->nq * sizeof(double)),
	};
	if (z.replica_id == NULL || z.rate == NULL || z.burst == NULL) {
		expired_free(&z);
		return;
	}
	for (size_t q = 0; q < v->nq; q++)
		z.rate[q] = z.burst[q] = NAN; /* no key for it */
	for (uint32_t k = 0; k < s->nkeys; k++) {
		const skey *key = &s->keys[k];
		if (key->q < 0)
			continue;
		z.rate[key->q] = isnan(key->grant_rate) ?
		    0 :
		    fmax(key->grant_rate, key->hold_rate);
		z.burst[key->q] = isnan(key->grant_burst) ?
		    0 :
		    fmax(key->grant_burst, key->hold_burst);
	}
	svc->zs[svc->nzs++] = z;
}

void
allot__expired_drop(service *svc, uint64_t now)
{
	for (uint32_t i = svc->nzs; i-- > 0;)
		if (now >= svc->zs[i].drop_ns)
			expired_remove(svc, i);
}

int
allot__state_create(const allot__state_opts *opts, allot_config *cfg,
    const char *path, const char *text, allot__state **ret)
{
	if (opts == NULL || cfg == NULL || ret == NULL ||
	    opts->interval_ms == 0 || opts->expiry_intervals == 0 ||
	    opts->max_replicas == 0 || opts->full_every == 0)
		return ALLOT_EINVAL;
	allot__state *st = calloc(1, sizeof *st);
	if (st == NULL)
		return ALLOT_ENOMEM;
	st->o = *opts;
	if (opts->lg != NULL)
		st->lgv = *opts->lg;
	st->o.lg = &st->lgv;
	st->rl_unknown = (allot__logrl) ALLOT__LOGRL_INIT(5, 10000);
	st->rl_absurd = (allot__logrl) ALLOT__LOGRL_INIT(5, 10000);
	st->rl_register = (allot__logrl) ALLOT__LOGRL_INIT(20, 10000);
	st->rl_clip = (allot__logrl) ALLOT__LOGRL_INIT(5, 10000);
	st->rl_push = (allot__logrl) ALLOT__LOGRL_INIT(20, 10000);
	size_t buckets = 64;
	while (buckets < 2 * (size_t) opts->max_replicas)
		buckets *= 2;
	st->hmask = buckets - 1;
	st->htab = calloc(buckets, sizeof *st->htab);
	st->next_session = 1;
	if (st->htab == NULL || pthread_mutex_init(&st->mu, NULL) != 0) {
		free(st->htab);
		free(st);
		return ALLOT_ENOMEM;
	}
	st->cur = allot__cfgv_new(
	    cfg, path, opts->epoch != 0 ? opts->epoch : 1);
	if (st->cur == NULL) {
		pthread_mutex_destroy(&st->mu);
		free(st->htab);
		free(st);
		return ALLOT_ENOMEM;
	}
	allot__cfgv_record(st->o.store, st->cur, text);
	if (st->cur->text_len > ALLOT__STATE_CONFIG_PUSH_MAX)
		allot__log(st->o.lg, ALLOT_LOG_WARNING,
		    "ALLOTD-CONFIG-TOO-BIG",
		    "%s is %zu bytes, above the %u bytes sent to agents: "
		    "agents keep their own config files",
		    path != NULL ? path : "the quota file", st->cur->text_len,
		    ALLOT__STATE_CONFIG_PUSH_MAX);
	st->last_second_ns = now_ns(st);
	*ret = st;
	return ALLOT_OK;
}

void
allot__state_destroy(allot__state *st)
{
	if (st == NULL)
		return;
	for (size_t i = 0; i < st->nsvcs; i++)
		service_free(st->svcs[i]);
	free(st->svcs);
	free(st->htab);
	free(st->stamp);
	free(st->aq);
	free(st->slots);
	free(st->owner_sess);
	free(st->owner_key);
	allot__cfgv_free(st->cur);
	pthread_mutex_destroy(&st->mu);
	free(st);
}

/* A fresh generation of the per-quota stamps that find a quota named
 * twice; false when out of memory. Under the lock. */
bool
allot__stamp_next(allot__state *st)
{
	size_t stamp_was = st->stamp_cap;
	if (!allot__grow((void **) &st->stamp, &st->stamp_cap, st->cur->nq,
	        sizeof *st->stamp))
		return false;
	/* realloc leaves the new stamps undefined: one equal to stamp_gen
	 * would call a key listed once "listed twice". */
	memset(st->stamp + stamp_was, 0,
	    (st->stamp_cap - stamp_was) * sizeof *st->stamp);
	if (++st->stamp_gen == 0) {
		memset(st->stamp, 0, st->stamp_cap * sizeof *st->stamp);
		st->stamp_gen = 1;
	}
	return true;
}
