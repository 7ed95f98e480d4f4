/* SPDX-License-Identifier: MIT */
/*
 * Start-up after a restart (allot__state_restore()): the replicas the
 * store says were live become placeholders that hold their equal share
 * until they register again or expire, and the global bucket levels are
 * taken back.
 */
#include "registry_int.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct restore_ctx {
	allot__state *st;
	uint64_t now;
	uint64_t max_id;
	uint32_t restored;
	uint32_t dropped;
	uint32_t superseded;
} restore_ctx;

/* Two live rows for one replica of `svc`: only the newer session can be
 * it (rows come in session order). The older lost its leave: a leader
 * that stopped before the flush that carried it, or a file an older
 * allotd left with its own leadership's rows. It is closed as replaced,
 * so that it neither holds a phantom share nor keeps a take-over
 * learning. */
static void
supersede(restore_ctx *rc, service *svc, const char *replica_id)
{
	allot__state *st = rc->st;
	for (uint32_t i = 0; i < svc->nsess; i++) {
		session *o = svc->sess[i];
		if (!o->placeholder || strcmp(o->replica_id, replica_id) != 0)
			continue;
		if (st->o.store != NULL)
			allot__store_replica_left(
			    st->o.store, o->id, "replaced");
		allot__session_unlink(st, o);
		allot__session_free(o);
		rc->restored--;
		rc->superseded++;
		return;
	}
}

/* How long a placeholder waits for its replica. Its agent keeps running
 * on its grants (then its fallback) and comes back within its longest
 * reconnect backoff: until then the placeholder holds its share, or the
 * first agent back would be handed the others'. learn_ms covers that
 * backoff, as after a silence of the coordinator's own. */
static uint64_t
placeholder_expiry_ns(const allot__state *st)
{
	uint64_t e = allot__expiry_ns(st, 0);
	uint64_t learn = (uint64_t) st->o.learn_ms * 1000000u;
	return learn > e ? learn : e;
}

static void
on_restored_replica(void *arg, const allot__store_replica *r)
{
	restore_ctx *rc = arg;
	allot__state *st = rc->st;
	if (r->session > rc->max_id)
		rc->max_id = r->session;
	bool full = false;
	service *svc = NULL;
	session *s = calloc(1, sizeof *s);
	if (s == NULL || r->replica_id == NULL || r->service == NULL ||
	    st->nsessions >= st->o.max_replicas)
		goto drop;
	svc = allot__service_open(st, r->service, &full);
	s->replica_id = strdup(r->replica_id);
	if (svc == NULL || s->replica_id == NULL)
		goto drop;
	supersede(rc, svc, r->replica_id);
	/* A placeholder holds one key per quota of its service's view
	 * (names kept for reloads). */
	const cfgv *v = st->cur;
	size_t nv = allot__cfgv_count(v, r->service), blob = 0;
	for (size_t i = 0; i < nv; i++)
		blob += strlen(v->names[allot__cfgv_at(v, r->service, i)]) + 1;
	s->keys = calloc(nv, sizeof *s->keys);
	s->names = calloc(nv, sizeof *s->names);
	s->names_blob = malloc(blob);
	if (s->keys == NULL || s->names == NULL || s->names_blob == NULL)
		goto drop;
	char *p = s->names_blob;
	for (size_t i = 0; i < nv; i++) {
		int32_t q = allot__cfgv_at(v, r->service, i);
		size_t len = strlen(v->names[q]);
		memcpy(p, v->names[q], len + 1);
		s->names[i] = p;
		p += len + 1;
		s->keys[i].q = q;
		s->keys[i].grant_rate = NAN;
		s->keys[i].grant_burst = NAN;
		s->keys[i].own_rate = NAN;
		s->keys[i].own_burst = NAN;
		s->keys[i].own_hold_rate = NAN;
		s->keys[i].own_hold_burst = NAN;
	}
	s->nwire = s->nkeys = s->nknown = (uint32_t) nv;
	s->id = r->session;
	s->placeholder = true;
	s->interval_s = (double) st->o.interval_ms / 1e3;
	s->last_seen_ns = rc->now;
	s->expiry_ns = placeholder_expiry_ns(st);
	s->joined_wall_ms = allot__wall_ms();
	s->seen_wall_ms = r->last_seen_ms;
	if (!allot__service_add(svc, s))
		goto drop;
	st->nsessions++;
	rc->restored++;
	return;
drop:
	/* Without a placeholder the row would stay "live" forever. */
	allot__session_free(s);
	rc->dropped++;
	if (st->o.store != NULL)
		allot__store_replica_left(st->o.store, r->session, "expired");
}

static void
on_restored_level(void *arg, const allot__store_level *l)
{
	restore_ctx *rc = arg;
	allot__state *st = rc->st;
	if (l->service == NULL || l->quota == NULL)
		return;
	int32_t q = allot__cfgv_find_svc(
	    st->cur, l->service, l->quota, strlen(l->quota));
	if (q < 0 || !isfinite(l->level))
		return;
	bool full;
	service *svc = allot__service_open(st, l->service, &full);
	if (svc == NULL)
		return;
	double b = st->cur->burst[q];
	svc->q[q].level = l->level < 0 ? 0 : l->level > b ? b : l->level;
	svc->q[q].level_ns = rc->now;
	svc->q[q].level_recorded = svc->q[q].level;
}

int
allot__state_restore(allot__state *st)
{
	if (st == NULL)
		return ALLOT_EINVAL;
	restore_ctx rc = { .st = st, .now = now_ns(st) };
	int rv = ALLOT_OK;
	pthread_mutex_lock(&st->mu);
	if (st->o.store != NULL) {
		rv = allot__store_restore(
		    st->o.store, on_restored_replica, on_restored_level, &rc);
		uint64_t mx = allot__store_max_session(st->o.store);
		if (mx > rc.max_id)
			rc.max_id = mx;
	}
	if (rc.max_id >= st->next_session)
		st->next_session = rc.max_id + 1;
	uint64_t now = now_ns(st);
	for (size_t i = 0; i < st->nsvcs; i++) {
		service *svc = st->svcs[i];
		if (!svc->dirty)
			continue;
		allot__recompute(st, svc, now);
		/* What they held before the restart is unknown; assume their
		 * equal share, which is what the last run handed out. */
		FOR_EACH_SESSION_KEY (svc, j, s, key) {
			if (!s->placeholder)
				break;
			key->grant_rate = key->rate;
			key->grant_burst = key->burst;
		}
		allot__rebuild_granted(st, svc);
	}
	pthread_mutex_unlock(&st->mu);
	if (rc.restored > 0 || rc.dropped > 0 || rc.superseded > 0) {
		allot__log(st->o.lg, ALLOT_LOG_NOTICE, "ALLOTD-RESTORE",
		    "%u replicas were live at the last stop: they count "
		    "until they re-register or expire in %" PRIu64
		    " ms%s (%u older rows of the same replicas closed as "
		    "replaced)",
		    rc.restored, placeholder_expiry_ns(st) / 1000000u,
		    rc.dropped ? " (some could not be restored and were "
		                 "marked expired)" :
		                 "",
		    rc.superseded);
		if (st->o.store != NULL) {
			char detail[96];
			snprintf(detail, sizeof detail,
			    "restored=%u dropped=%u superseded=%u",
			    rc.restored, rc.dropped, rc.superseded);
			allot__store_event(
			    st->o.store, "restore", NULL, detail);
		}
	}
	return rv;
}

void
allot__state_forget(allot__state *st, bool take_over)
{
	if (st == NULL)
		return;
	pthread_mutex_lock(&st->mu);
	while (st->nsvcs > 0)
		allot__service_remove(st, st->nsvcs - 1);
	if (st->htab != NULL)
		memset(st->htab, 0, (st->hmask + 1) * sizeof *st->htab);
	st->nsessions = 0;
	pthread_mutex_unlock(&st->mu);
	if (!take_over)
		return;
	/* The agents still run on what the old leader granted. */
	allot__state_learn(st);
	allot__state_restore(st);
}
