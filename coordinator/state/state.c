/* SPDX-License-Identifier: MIT */
/*
 * The coordinator state (state.h) as a whole: its options, the periodic
 * work of the loop thread (tick: expiry and the allocation round; second:
 * usage rows and rates), a config reload and its audit rows (who, why,
 * and per quota before and after), and the small read-only
 * queries. The parts live beside it; registry_int.h says which file owns
 * what and in which direction they call.
 */
#include "registry_int.h"

#include "config_diff.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Work to finish after unlocking: log lines and store rows. */
typedef struct gone {
	session *s;
	const char *why; /* "expired", "replaced", "leave" */
	uint64_t silent_ms;
	uint32_t remaining;
} gone;

void
allot__state_opts_init(allot__state_opts *o)
{
	memset(o, 0, sizeof *o);
	o->lease_ms = ALLOT__STATE_LEASE_MS;
	o->interval_ms = ALLOT__STATE_INTERVAL_MS;
	o->expiry_intervals = ALLOT__STATE_EXPIRY_INTERVALS;
	o->max_replicas = ALLOT__STATE_MAX_REPLICAS;
	o->max_services = ALLOT__STATE_MAX_SERVICES;
	o->max_replicas_per_service = ALLOT__STATE_MAX_REPLICAS_PER_SERVICE;
	o->max_replicas_per_peer = ALLOT__STATE_MAX_REPLICAS_PER_PEER;
	o->service_idle_ms = ALLOT__STATE_SERVICE_IDLE_MS;
	o->full_every = ALLOT__STATE_FULL_EVERY;
	o->absurd_factor = ALLOT__STATE_ABSURD_FACTOR;
	allot__alloc_policy_init(&o->policy);
	o->learn_ms = 2 * ALLOT__STATE_LEASE_MS;
	o->counted_ms = ALLOT__STATE_COUNTED_MS;
}

/* Whether expiring session `s`'s connection is known to have closed:
 * the replica exited (the kernel closed its socket) and holds nothing. */
static bool
conn_closed(const allot__state *st, const session *s)
{
	return st->o.conn_open != NULL && s->pipe != 0 &&
	    !st->o.conn_open(st->o.conn_ctx, s->pipe);
}

bool
allot__session_live_elsewhere(
    const allot__state *st, const session *s, uint32_t pipe, uint64_t now)
{
	return !s->placeholder && s->pipe != 0 && s->pipe != pipe &&
	    st->o.conn_open != NULL &&
	    st->o.conn_open(st->o.conn_ctx, s->pipe) &&
	    now - s->last_seen_ns < s->expiry_ns;
}

void
allot__state_tick(allot__state *st)
{
	gone *list = NULL;
	size_t n = 0, cap = 0;

	pthread_mutex_lock(&st->mu);
	uint64_t now = now_ns(st);
	uint64_t win = allot__expiry_ns(st, 0);
	/* Nobody heard for K intervals: the coordinator is probably the one
	 * cut off (see allot__heard()), so it expires no one for now. */
	bool quiet = st->last_heard_ns == 0 ||
	    since(now, st->last_heard_ns) > win;
	bool grace = now < st->grace_until_ns;
	for (size_t i = 0; i < st->nsvcs; i++) {
		/* One service at a time: the lock is let go between them,
		 * so a request of another service never waits for a walk
		 * over every session. Only this thread removes services. */
		if (i > 0) {
			pthread_mutex_unlock(&st->mu);
			pthread_mutex_lock(&st->mu);
		}
		service *svc = st->svcs[i];
		if (allot__service_idle(st, svc, now)) {
			allot__service_remove(st, i--);
			continue;
		}
		allot__expired_drop(svc, now);
		for (uint32_t j = svc->nsess; j-- > 0;) {
			session *s = svc->sess[j];
			uint64_t silent = since(now, s->last_seen_ns);
			/* One whose connection closed has exited (the kernel
			 * closed its socket): it goes two of its intervals
			 * after it was last heard, not after the whole expiry
			 * wait, so its share reaches the replicas its callers
			 * moved to that much sooner. A live agent that lost
			 * its connection registers again on a new one within
			 * those two intervals and replaces the session. (Asked
			 * of nng only until the expiry wait is over: past it
			 * the session goes anyway, and thousands of sessions
			 * silent while allotd is the one cut off would cost a
			 * pipe lookup each on every tick.) */
			bool closed = !s->placeholder &&
			    silent > (uint64_t) (2e9 * s->interval_s) &&
			    silent <= s->expiry_ns && conn_closed(st, s);
			if (silent <= s->expiry_ns && !closed)
				continue;
			if (!s->placeholder &&
			    (quiet || (grace && svc->nsess_silenced >= 2)))
				continue;
			if (!allot__grow(
			        (void **) &list, &cap, n + 1, sizeof *list))
				break; /* retried on the next tick */
			allot__conserve_leave(svc, s);
			allot__session_unlink(st, s);
			if (!s->placeholder && !conn_closed(st, s))
				allot__expired_add(st, svc, s, now);
			list[n++] = (gone) {
				.s = s,
				.why = "expired",
				.silent_ms = since(now, s->last_seen_ns) /
				    1000000u,
			};
			if (st->o.store != NULL)
				allot__store_replica_left(
				    st->o.store, s->id, "expired");
		}
		allot__reserve_expired(st, svc, now);
		allot__learned(st, svc, now);
		allot__forming(svc, now);
		/* The demand-aware allocator follows demand every interval;
		 * the static split only changes with the replica set. */
		if (svc->dirty || st->o.policy.kind != ALLOT__ALLOC_STATIC)
			allot__recompute(st, svc, now); /* and the reserves */
		else
			allot__central_caps(st, svc, now);
		allot__record_shares(st, svc);
	}
	for (size_t i = 0; i < n; i++)
		list[i].remaining = list[i].s->svc->nsess;
	pthread_mutex_unlock(&st->mu);

	for (size_t i = 0; i < n; i++) {
		session *s = list[i].s;
		if (st->o.metrics != NULL)
			allot__metrics_add(&st->o.metrics->expiries, 1);
		allot__log(st->o.lg, ALLOT_LOG_WARNING, "ALLOTD-EXPIRE",
		    "%sreplica %s of %s expired: session %" PRIu64 " silent "
		    "for %" PRIu64 " ms; %u replicas now",
		    s->placeholder ? "restored " : "", s->replica_id,
		    s->svc->name, s->id, list[i].silent_ms, list[i].remaining);
		if (st->o.store != NULL) {
			char detail[160];
			snprintf(detail, sizeof detail,
			    "service=%.64s "
			    "session=%" PRIu64 " silent_ms=%" PRIu64
			    " replicas=%u%s",
			    s->svc->name, s->id, list[i].silent_ms,
			    list[i].remaining,
			    s->placeholder ? " restored" : "");
			allot__store_event(
			    st->o.store, "expiry", s->replica_id, detail);
		}
		allot__session_free(s);
	}
	free(list);
}

void
allot__state_second(allot__state *st)
{
	pthread_mutex_lock(&st->mu);
	uint64_t now = now_ns(st);
	double dt = (double) since(now, st->last_second_ns) / 1e9;
	st->last_second_ns = now;
	if (dt <= 0)
		dt = 1e-3;
	const cfgv *v = st->cur;
	allot__store *store = st->o.store;
	for (size_t i = 0; i < st->nsvcs; i++) {
		service *svc = st->svcs[i];
		allot__values_second(st, svc, now);
		for (size_t q = 0; q < v->nq; q++) {
			squota *sq = &svc->q[q];
			double R = v->rate[q], B = v->burst[q];
			sq->admitted_rate = (double) sq->win_allowed / dt;
			sq->denied_rate = (double) sq->win_denied / dt;
			sq->shadow_rate = (double) sq->win_shadow / dt;
			/* R = 0: a closed or unlimited quota. */
			sq->utilization = R > 0 ? sq->admitted_rate / R : 0;
			/* Consumption was taken off as it was reported. */
			allot__level_bring(sq, R, B, now);
			allot__cand_check(sq, v->q[q], now);
			allot__store_usage_row row = {
				.admitted = sq->aud_allowed,
				.denied = sq->aud_denied,
				.shadow_denied = sq->aud_shadow,
				.candidate_denied = allot__cand_second(sq, dt),
				.candidate_rate = sq->cand_rate,
				.demand = sq->demand_sum,
				.live_replicas = svc->nsess,
			};
			/* A second anyone reported in: its demand and
			 * replicas even when usage.c books its tokens. */
			if (store != NULL &&
			    (sq->win_allowed > 0 || sq->win_denied > 0 ||
			        row.candidate_denied > 0))
				allot__store_usage_add(
				    store, svc->name, v->names[q], &row);
			if (store != NULL &&
			    !(fabs(sq->level - sq->level_recorded) < 1e-6)) {
				allot__store_level(
				    store, svc->name, v->names[q], sq->level);
				sq->level_recorded = sq->level;
			}
			sq->win_allowed = 0;
			sq->win_denied = 0;
			sq->win_shadow = 0;
			sq->aud_allowed = 0;
			sq->aud_denied = 0;
			sq->aud_shadow = 0;
		}
		for (uint32_t j = 0; j < svc->nsess; j++) {
			session *s = svc->sess[j];
			if (!s->seen_dirty)
				continue;
			s->seen_dirty = false;
			s->seen_wall_ms = allot__wall_ms();
			if (store != NULL)
				allot__store_replica_seen(store, s->id);
		}
	}
	allot__strangers_second(st);
	pthread_mutex_unlock(&st->mu);
}

/* Move `svc` from config view `ov` to `nv`: its quotas by identity into
 * `nq` (which it then owns; a global bucket no deeper than the new
 * burst), its sessions' keys re-interned, a full Reply for each; a
 * session that listed keys without a quota is asked to register again
 * when the new config adds quotas. Under the lock; cannot fail. */
static void
remap(service *svc, const cfgv *ov, const cfgv *nv, squota *nq)
{
	bool added = false;
	for (size_t q = 0; q < nv->nq; q++) {
		/* Only the quotas of this service's view carry its state. */
		const char *id = nv->names[q];
		bool in_view = allot__cfgv_find_svc(nv, svc->name, id,
		                   strlen(id)) == (int32_t) q;
		int32_t oq = in_view ?
		    allot__cfgv_find_svc(ov, svc->name, id, strlen(id)) :
		    -1;
		if (oq >= 0) {
			nq[q] = svc->q[oq];
			if (nq[q].level > nv->burst[q])
				nq[q].level = nv->burst[q];
		} else {
			allot__squota_init(&nq[q], nv, q);
			added |= in_view;
		}
	}
	free(svc->q);
	svc->q = nq;
	for (uint32_t j = 0; j < svc->nsess; j++) {
		session *s = svc->sess[j];
		s->nknown = 0;
		for (uint32_t k = 0; k < s->nkeys; k++) {
			skey *key = &s->keys[k];
			key->q = allot__cfgv_find_svc(
			    nv, svc->name, s->names[k], strlen(s->names[k]));
			if (key->q >= 0)
				s->nknown++;
		}
		s->force_full = true;
		/* Its keys without a quota were not kept: one may have a
		 * quota now, which only a new Register can tell. */
		if (added && s->nwire > s->nkeys && !s->placeholder)
			s->reregister = true;
	}
	/* Expired replicas were counted per quota index of the old config;
	 * a reload forgets them (docs/allocation.md). */
	allot__expired_clear(svc);
	svc->dirty = true;
}

/* The audit rows of a change from `before` to `after` (epoch `epoch`):
 * `pre`, when it is that diff, else the diff computed. */
static int
audit(allot__state *st, const allot_config *before, const allot_config *after,
    uint64_t epoch, const allot__state_who *w, const allot__config_diff *pre)
{
	if (st->o.store == NULL)
		return ALLOT_OK;
	allot__config_diff d = { 0 };
	int rc = pre != NULL ? ALLOT_OK :
	                       allot__config_diff_compute(before, after, &d);
	if (rc != ALLOT_OK)
		return rc;
	allot__store_change c = {
		.epoch = epoch,
		.digest = after->digest,
		.who = w->who,
		.claimed_as = w->claimed_as,
		.reason = w->reason,
		.source = w->source,
	};
	allot__store_config_change(st->o.store, &c, pre != NULL ? pre : &d);
	allot__config_diff_free(&d);
	return ALLOT_OK;
}

int
allot__state_audit_start(
    allot__state *st, const allot_config *before, const allot__state_who *w)
{
	if (st == NULL || w == NULL)
		return ALLOT_EINVAL;
	/* Start-up: no request runs yet, the view in force stays. */
	return audit(st, before, st->cur->cfg, st->cur->epoch, w, NULL);
}

int
allot__state_reload(allot__state *st, allot_config *cfg, const char *path,
    const char *text, bool *ret_changed)
{
	static const allot__state_who sighup = {
		.who = "signal",
		.reason = "reload",
	};
	return allot__state_apply(st, cfg, path, text, &sighup, ret_changed);
}

int
allot__state_apply(allot__state *st, allot_config *cfg, const char *path,
    const char *text, const allot__state_who *w, bool *ret_changed)
{
	return allot__state_apply_at(st, cfg, path, text, w, 0, ret_changed);
}

int
allot__state_apply_at(allot__state *st, allot_config *cfg, const char *path,
    const char *text, const allot__state_who *w, uint64_t at,
    bool *ret_changed)
{
	return allot__state_apply_diffed(
	    st, cfg, path, text, w, at, 0, NULL, ret_changed);
}

int
allot__state_apply_diffed(allot__state *st, allot_config *cfg,
    const char *path, const char *text, const allot__state_who *w, uint64_t at,
    uint64_t from, const allot__config_diff *diff, bool *ret_changed)
{
	if (st == NULL || cfg == NULL)
		return ALLOT_EINVAL;
	pthread_mutex_lock(&st->mu);
	uint64_t digest = st->cur->cfg->digest;
	uint64_t epoch = st->cur->epoch;
	/* The cluster's epoch for the config in force: taken as it is. */
	if (at != 0 && cfg->digest == digest)
		st->cur->epoch = at;
	pthread_mutex_unlock(&st->mu);
	if (cfg->digest == digest) {
		allot_config_free(cfg);
		if (ret_changed != NULL)
			*ret_changed = false;
		return ALLOT_OK;
	}
	if (at != 0)
		epoch = at - 1;
	/* Only the loop thread reloads, so the epoch read above stays the
	 * latest while the new view is built outside the lock. */
	cfgv *nv = allot__cfgv_new(cfg, path, epoch + 1);
	if (nv == NULL)
		return ALLOT_ENOMEM;
	squota **nq = NULL;
	size_t nsvcs = 0;
	int rv = ALLOT_OK;
	uint64_t now = now_ns(st);

	pthread_mutex_lock(&st->mu);
	cfgv *ov = st->cur;
	nsvcs = st->nsvcs;
	nq = calloc(nsvcs ? nsvcs : 1, sizeof *nq);
	if (nq == NULL) {
		rv = ALLOT_ENOMEM;
		goto unlock;
	}
	for (size_t i = 0; i < nsvcs; i++) {
		nq[i] = calloc(nv->nq, sizeof **nq);
		if (nq[i] == NULL) {
			rv = ALLOT_ENOMEM;
			goto unlock;
		}
	}
	/* Nothing can fail from here on. */
	for (size_t i = 0; i < st->nsvcs; i++) {
		remap(st->svcs[i], ov, nv, nq[i]);
		nq[i] = NULL;
	}
	st->cur = nv;
	for (size_t i = 0; i < st->nsvcs; i++) {
		allot__own_quotas(st, st->svcs[i], now);
		allot__recompute(st, st->svcs[i], now);
		st->svcs[i]->gen++;
	}
	allot__cfgv_record(st->o.store, nv, text);
	nv = NULL;
unlock:
	pthread_mutex_unlock(&st->mu);
	if (nq != NULL) {
		for (size_t i = 0; i < nsvcs; i++)
			free(nq[i]);
		free(nq);
	}
	if (rv != ALLOT_OK) {
		/* The caller keeps cfg; detach it from the unused view. */
		nv->cfg = NULL;
		allot__cfgv_free(nv);
		return rv;
	}
	/* The old view is still ours (only this thread reloads), and the
	 * new config cannot go before the next reload on this thread. An
	 * audit that cannot be computed (out of memory) is logged: the
	 * config is in force either way. */
	if (w != NULL &&
	    audit(st, ov->cfg, cfg, epoch + 1, w,
	        diff != NULL && ov->cfg->digest == from ? diff : NULL) !=
	        ALLOT_OK)
		allot__log(st->o.lg, ALLOT_LOG_ERR, "ALLOTD-AUDIT-FAIL",
		    "out of memory: the quota changes of epoch %" PRIu64
		    " are not in the audit table",
		    epoch + 1);
	allot__cfgv_free(ov);
	if (ret_changed != NULL)
		*ret_changed = true;
	return ALLOT_OK;
}

uint64_t
allot__state_epoch(allot__state *st)
{
	pthread_mutex_lock(&st->mu);
	uint64_t e = st->cur->epoch;
	pthread_mutex_unlock(&st->mu);
	return e;
}

uint64_t
allot__state_digest(allot__state *st)
{
	pthread_mutex_lock(&st->mu);
	uint64_t d = st->cur->cfg->digest;
	pthread_mutex_unlock(&st->mu);
	return d;
}

size_t
allot__state_replicas(allot__state *st)
{
	pthread_mutex_lock(&st->mu);
	size_t n = st->nsessions;
	pthread_mutex_unlock(&st->mu);
	return n;
}

uint32_t
allot__state_service_replicas(allot__state *st, const char *name)
{
	pthread_mutex_lock(&st->mu);
	const struct service *svc = allot__service_find(st, name);
	uint32_t n = svc != NULL ? svc->nsess : 0;
	pthread_mutex_unlock(&st->mu);
	return n;
}

size_t
allot__state_foreach_share(
    allot__state *st, const char *name, allot__state_share_fn fn, void *ctx)
{
	size_t n = 0;
	pthread_mutex_lock(&st->mu);
	const cfgv *v = st->cur;
	const struct service *svc = allot__service_find(st, name);
	uint64_t now = now_ns(st);
	if (svc != NULL) {
		FOR_EACH_KEY (svc, i, s, key) {
			allot__state_share sh = {
				.replica_id = s->replica_id,
				.session = s->id,
				.quota = key->q,
				.identity = v->names[key->q],
				.restored = s->placeholder,
				.fresh = s->placeholder || s->last_seq < 2,
				.demand = s->placeholder ?
				    0 :
				    allot__est_read(s, key),
				.target_rate = key->rate,
				.target_burst = key->burst,
				.reply_target_rate = key->reply_target,
				.rate = isnan(key->grant_rate) ?
				    0 :
				    key->grant_rate,
				.burst = isnan(key->grant_burst) ?
				    0 :
				    key->grant_burst,
			};
			allot__key_bound(
			    st, s, key, now, &sh.bound_rate, &sh.bound_burst);
			if (fn != NULL)
				fn(ctx, &sh);
			n++;
		}
	}
	pthread_mutex_unlock(&st->mu);
	return n;
}

int
allot__state_quota_get(
    allot__state *st, const char *name, size_t q, allot__state_quota *ret)
{
	int rc = ALLOT_ENOENT;
	pthread_mutex_lock(&st->mu);
	const cfgv *v = st->cur;
	struct service *svc = allot__service_find(st, name);
	if (svc != NULL && q < v->nq) {
		uint64_t now = now_ns(st);
		allot__compute_bounds(st, svc, now);
		squota *sq = &svc->q[q];
		allot__level_bring(sq, v->rate[q], v->burst[q], now);
		*ret = (allot__state_quota) {
			.identity = v->names[q],
			.rate = v->rate[q],
			.burst = v->burst[q],
			.allowance = sq->allowance,
			.burst_budget = sq->burst_budget,
			.level = sq->level,
			.demand = sq->demand_sum,
			.target_rate = sq->target_sum_rate,
			.granted_rate = sq->granted_rate,
			.granted_burst = sq->granted_burst,
			.bound_rate = sq->bound_rate,
			.bound_burst = sq->bound_burst,
			.bound_ratio = allot__bound_ratio(
			    sq, v->rate[q], v->burst[q]),
			.holders = sq->nslots,
			.expired_counted = sq->counted_expired,
		};
		allot__central_peek(st, svc, q, now, &ret->reserve_rate,
		    &ret->reserve_burst, &ret->reserve_level);
		rc = ALLOT_OK;
	}
	pthread_mutex_unlock(&st->mu);
	return rc;
}
