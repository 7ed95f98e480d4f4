/* SPDX-License-Identifier: MIT */
/*
 * The requests of the protocol (docs/protocol.md): Register, Sync and
 * Leave from the nng worker threads. Each validates what it can before
 * locking, does its memory work under the lock, and logs and counts after
 * unlocking. Session ids, sequence numbers, key interning, the bounds
 * that make a report "absurd" and which shares a Reply carries are
 * decided here.
 */
#include "registry_int.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Printable ASCII, 1..max bytes (0 allowed when !required). Names end up
 * in label values, JSON and log lines; restricting them keeps all three
 * trivially safe. */
static bool
name_ok(const char *s, size_t max, bool required)
{
	if (s == NULL)
		return !required;
	size_t n = 0;
	for (; s[n] != '\0'; n++) {
		unsigned char c = (unsigned char) s[n];
		if (c < 0x20 || c > 0x7e || n >= max)
			return false;
	}
	return n > 0 || !required;
}

static void *
pa_alloc(ProtobufCAllocator *pa, size_t size)
{
	return pa->alloc(pa->allocator_data, size);
}

/* Bring every grant of `s` toward its target (allot__grant()) and fill
 * `shares` with the keys whose grant changed, or with every key that has
 * a quota when `all` is set. Returns false when `pa` is out of memory;
 * nothing is granted then. */
static bool
build_shares(allot__state *st, session *s, ProtobufCAllocator *pa, bool all,
    Allot__V1__Share ***ret, size_t *ret_n)
{
	*ret = NULL;
	*ret_n = 0;
	s->pending = 0;
	if (s->nknown == 0)
		return true;
	/* Room for every key up front: once a grant is made it must reach
	 * the agent. The arena makes this a pointer bump. */
	Allot__V1__Share *arr = pa_alloc(pa, s->nknown * sizeof *arr);
	Allot__V1__Share **ptrs = pa_alloc(pa, s->nknown * sizeof *ptrs);
	if (arr == NULL || ptrs == NULL)
		return false;
	size_t j = 0;
	uint64_t now = st->cl_n > 0 ? now_ns(st) : 0;
	for (uint32_t k = 0; k < s->nkeys; k++) {
		skey *key = &s->keys[k];
		if (key->q < 0)
			continue;
		/* Cluster: nothing for another member's keys; and while a
		 * key is learnt (taken over) or we are cut off, no grant
		 * for a replica that has not said what it runs on: it keeps
		 * that allowance, and its next report tells us. */
		const squota *sq = &s->svc->q[key->q];
		if (sq->disowned)
			continue;
		bool hold = st->cl_n > 0 &&
		    (st->cl_cut_off || now < sq->learn_until_ns);
		if (hold && isnan(key->sent_rate))
			continue;
		bool is_short;
		bool changed = allot__grant(
		    st, s->svc, s, key, hold, &is_short);
		s->pending += is_short;
		if (!changed && !all && !key->force_share)
			continue;
		key->force_share = false;
		allot__v1__share__init(&arr[j]);
		arr[j].key = k;
		arr[j].rate = key->sent_rate;
		arr[j].burst = key->sent_burst;
		ptrs[j] = &arr[j];
		j++;
	}
	*ret = j > 0 ? ptrs : NULL;
	*ret_n = j;
	return true;
}

/* A session for `req` with everything copied, built before locking. */
static session *
session_new(const Allot__V1__Register *req)
{
	session *s = calloc(1, sizeof *s);
	if (s == NULL)
		return NULL;
	s->nkeys = (uint32_t) req->n_keys;
	s->replica_id = strdup(req->replica_id);
	s->host = strdup(req->host != NULL ? req->host : "");
	s->agent_version = strdup(
	    req->agent_version != NULL ? req->agent_version : "");
	s->pid = req->pid;
	s->digest = req->config_digest;
	size_t blob = 0;
	for (size_t k = 0; k < req->n_keys; k++)
		blob += strlen(req->keys[k]) + 1;
	s->keys = calloc(req->n_keys ? req->n_keys : 1, sizeof *s->keys);
	s->names = calloc(req->n_keys ? req->n_keys : 1, sizeof *s->names);
	s->names_blob = malloc(blob ? blob : 1);
	if (s->replica_id == NULL || s->host == NULL ||
	    s->agent_version == NULL || s->keys == NULL || s->names == NULL ||
	    s->names_blob == NULL) {
		allot__session_free(s);
		return NULL;
	}
	char *p = s->names_blob;
	for (size_t k = 0; k < req->n_keys; k++) {
		size_t len = strlen(req->keys[k]);
		memcpy(p, req->keys[k], len + 1);
		s->names[k] = p;
		p += len + 1;
		s->keys[k].q = -1;
		s->keys[k].sent_rate = NAN;
		s->keys[k].sent_burst = NAN;
		s->keys[k].may_rate = NAN;
		s->keys[k].may_burst = NAN;
	}
	return s;
}

/* A session registered over one connection is driven over that one
 * only: a Sync or Leave for it arriving on another connection (another
 * peer guessing the sequential id, or the same agent after a reconnect)
 * is answered UNKNOWN_SESSION, which makes a genuine agent register
 * again, and counted apart. Pipe 0 (the simulator, tests) binds nothing. */
static bool
pipe_ok(const session *s, uint32_t pipe)
{
	return s->pipe == 0 || s->pipe == pipe;
}

static Allot__V1__Error__Code
pipe_mismatch(allot__metrics *m, uint64_t id, char *err, size_t errlen)
{
	snprintf(err, errlen,
	    "session %" PRIu64 " belongs to another connection: register "
	    "again",
	    id);
	allot__metrics_reject(m, ALLOT__REJ_SESSION_PIPE, 1);
	return ALLOT__V1__ERROR__CODE__UNKNOWN_SESSION;
}

Allot__V1__Error__Code
allot__state_register_on(allot__state *st, const Allot__V1__Register *req,
    uint32_t pipe, ProtobufCAllocator *pa, Allot__V1__Welcome *ret, char *err,
    size_t errlen)
{
	allot__metrics *m = st->o.metrics;
	if (!name_ok(req->replica_id, ALLOT__STATE_NAME_MAX, true) ||
	    !name_ok(req->service, ALLOT__STATE_NAME_MAX, true) ||
	    !name_ok(req->host, ALLOT__STATE_NAME_MAX, false) ||
	    !name_ok(req->agent_version, ALLOT__STATE_VERSION_MAX, false)) {
		snprintf(err, errlen,
		    "replica_id and service must be 1-%u "
		    "printable ASCII characters (host too, agent_version "
		    "at most %u)",
		    ALLOT__STATE_NAME_MAX, ALLOT__STATE_VERSION_MAX);
		allot__metrics_reject(m, ALLOT__REJ_MALFORMED, 1);
		return ALLOT__V1__ERROR__CODE__MALFORMED;
	}
	for (size_t k = 0; k < req->n_keys; k++) {
		if (!name_ok(req->keys[k], ALLOT__STATE_NAME_MAX, true)) {
			snprintf(err, errlen,
			    "key %zu: a key must be 1-%u "
			    "printable ASCII characters",
			    k, ALLOT__STATE_NAME_MAX);
			allot__metrics_reject(m, ALLOT__REJ_MALFORMED, 1);
			return ALLOT__V1__ERROR__CODE__MALFORMED;
		}
	}
	uint32_t *unknown = pa_alloc(pa, (req->n_keys + 1) * sizeof *unknown);
	session *s = session_new(req);
	if (s == NULL || unknown == NULL) {
		allot__session_free(s);
		snprintf(err, errlen, "out of memory, try again later");
		allot__metrics_reject(m, ALLOT__REJ_CAPACITY, 1);
		return ALLOT__V1__ERROR__CODE__RATE_LIMITED;
	}
	size_t nunknown = 0;
	uint64_t now;
	session *old = NULL;
	Allot__V1__Error__Code code = ALLOT__V1__ERROR__CODE__UNSPECIFIED;
	allot__reject why = ALLOT__REJ_COUNT;
	uint32_t replicas = 0;

	pthread_mutex_lock(&st->mu);
	now = now_ns(st);
	allot__heard(st, now);
	const cfgv *v = st->cur;
	size_t stamp_was = st->stamp_cap;
	if (!allot__grow((void **) &st->stamp, &st->stamp_cap, v->nq,
	        sizeof *st->stamp)) {
		code = ALLOT__V1__ERROR__CODE__RATE_LIMITED;
		why = ALLOT__REJ_CAPACITY;
		snprintf(err, errlen, "out of memory, try again later");
		goto unlock;
	}
	/* realloc leaves the new stamps undefined: one equal to stamp_gen
	 * would call a key listed once "listed twice". */
	memset(st->stamp + stamp_was, 0,
	    (st->stamp_cap - stamp_was) * sizeof *st->stamp);
	if (++st->stamp_gen == 0) {
		memset(st->stamp, 0, st->stamp_cap * sizeof *st->stamp);
		st->stamp_gen = 1;
	}
	for (uint32_t k = 0; k < s->nkeys; k++) {
		int32_t q = allot__cfgv_find(
		    v, s->names[k], strlen(s->names[k]));
		if (q < 0) {
			unknown[nunknown++] = k;
			continue;
		}
		if (st->stamp[q] == st->stamp_gen) {
			code = ALLOT__V1__ERROR__CODE__MALFORMED;
			why = ALLOT__REJ_MALFORMED;
			snprintf(err, errlen, "key %u (%.64s) is listed twice",
			    k, s->names[k]);
			goto unlock;
		}
		st->stamp[q] = st->stamp_gen;
		s->keys[k].q = q;
		s->nknown++;
	}
	bool full = false;
	service *svc = allot__service_open(st, req->service, &full);
	if (svc == NULL) {
		code = ALLOT__V1__ERROR__CODE__RATE_LIMITED;
		why = ALLOT__REJ_CAPACITY;
		snprintf(err, errlen,
		    full ? "too many services (at most %u)" :
		           "out of memory, try again later",
		    st->o.max_services);
		goto unlock;
	}
	for (uint32_t i = 0; i < svc->nsess; i++) {
		if (strcmp(svc->sess[i]->replica_id, s->replica_id) == 0) {
			old = svc->sess[i];
			break;
		}
	}
	if (old == NULL && st->nsessions >= st->o.max_replicas) {
		code = ALLOT__V1__ERROR__CODE__RATE_LIMITED;
		why = ALLOT__REJ_CAPACITY;
		snprintf(err, errlen, "too many replicas (at most %u)",
		    st->o.max_replicas);
		goto unlock;
	}
	bool returning = old != NULL;
	for (uint32_t i = 0; i < svc->nzs && !returning; i++)
		returning = strcmp(svc->zs[i].replica_id, s->replica_id) == 0;
	allot__carry_allowances(st, svc, s, old, now);
	if (old != NULL) {
		allot__est_inherit(s, old);
		allot__session_unlink(st, old);
	} else {
		allot__conserve_join(svc);
	}
	allot__zombie_forget(svc, s->replica_id);
	if (!allot__service_add(svc, s)) {
		code = ALLOT__V1__ERROR__CODE__RATE_LIMITED;
		why = ALLOT__REJ_CAPACITY;
		snprintf(err, errlen, "out of memory, try again later");
		if (old != NULL && allot__service_add(svc, old)) {
			if (!old->ghost)
				allot__session_hash_add(st, old);
			st->nsessions++;
			old = NULL;
		}
		goto unlock;
	}
	s->id = st->next_session++;
	s->pipe = pipe;
	s->last_seen_ns = now;
	s->last_sync_ns = now;
	s->expiry_ns = allot__expiry_ns(st, req->sync_interval_ms);
	s->interval_s = (double) (req->sync_interval_ms > 0 &&
	                            req->sync_interval_ms <=
	                                ALLOT__STATE_AGENT_INTERVAL_MAX ?
	                        req->sync_interval_ms :
	                        st->o.interval_ms) /
	    1e3;
	s->joined_wall_ms = allot__wall_ms();
	s->seen_wall_ms = s->joined_wall_ms;
	allot__session_hash_add(st, s);
	st->nsessions++;
	allot__recompute(st, svc, now);
	replicas = svc->nsess;
	ret->session = s->id;
	ret->replicas = replicas;
	ret->config_epoch = v->epoch;
	ret->config_digest = v->cfg->digest;
	ret->lease_ms = st->o.lease_ms;
	/* A newcomer takes headroom at its Welcome only when it is alone
	 * (placeholders of a restart aside); otherwise it gets its first
	 * grant in its first Reply. In a wave of joins this keeps an early
	 * newcomer from taking a share sized for the smaller replica set,
	 * which it would only give back at its next Sync while the later
	 * ones wait for it: the wave settles in one round, not two. A
	 * replica coming back (replacing its session, or after it expired)
	 * is no newcomer: it gets what the headroom has at once. */
	for (uint32_t i = 0; i < svc->nsess && !st->hold && !returning; i++)
		st->hold = svc->sess[i] != s && !svc->sess[i]->ghost;
	bool built = build_shares(
	    st, s, pa, true, &ret->shares, &ret->n_shares);
	st->hold = false;
	if (!built) {
		/* Welcome without shares: the agent keeps its static split;
		 * the first Reply is full. */
		s->force_full = true;
	}
	s->last_reply_ns = now;
	s->last_replicas = replicas;
	s->sent_gen = svc->gen;
	ret->unknown_keys = unknown;
	ret->n_unknown_keys = nunknown;
	if (st->o.store != NULL) {
		if (old != NULL)
			allot__store_replica_left(
			    st->o.store, old->id, "replaced");
		allot__store_replica_joined(st->o.store, s->id, s->replica_id,
		    svc->name, s->host, s->pid, s->agent_version, s->digest);
	}
unlock:
	pthread_mutex_unlock(&st->mu);
	if (code != ALLOT__V1__ERROR__CODE__UNSPECIFIED) {
		allot__metrics_reject(m, why, 1);
		allot__log_ratelimited(st->o.lg, &st->rl_register,
		    ALLOT_LOG_WARNING, "ALLOTD-REGISTER-FAIL",
		    "replica %s of %s not registered: %s", req->replica_id,
		    req->service, err);
		allot__session_free(s);
		return code;
	}
	if (m != NULL) {
		allot__metrics_add(&m->registers, 1);
		allot__metrics_add(&m->joins, 1);
		allot__metrics_add(&m->register_unknown_keys, nunknown);
		if (old != NULL)
			allot__metrics_add(&m->replaced, 1);
	}
	char detail[160];
	if (old != NULL) {
		allot__log(st->o.lg, ALLOT_LOG_INFO, "ALLOTD-REPLACE",
		    "replica %s of %s registered again: session %" PRIu64
		    " replaces %s session %" PRIu64,
		    s->replica_id, req->service, s->id,
		    old->ghost ? "restored" : "live", old->id);
		if (st->o.store != NULL) {
			snprintf(detail, sizeof detail,
			    "service=%.64s "
			    "session=%" PRIu64 " by=%" PRIu64,
			    req->service, old->id, s->id);
			allot__store_event(
			    st->o.store, "replaced", s->replica_id, detail);
		}
		allot__session_free(old);
	}
	allot__log(st->o.lg, ALLOT_LOG_INFO, "ALLOTD-JOIN",
	    "replica %s of %s joined (host %s pid %u, agent %s): session "
	    "%" PRIu64 ", %u keys, %zu unknown; %u replicas now",
	    s->replica_id, req->service, s->host, s->pid, s->agent_version,
	    s->id, s->nkeys, nunknown, replicas);
	if (nunknown > 0)
		allot__log_ratelimited(st->o.lg, &st->rl_unknown,
		    ALLOT_LOG_WARNING, "ALLOTD-UNKNOWN-KEY",
		    "replica %s of %s named %zu identities without a quota "
		    "(first: %.128s); they stay at the agent's own config",
		    s->replica_id, req->service, nunknown,
		    req->keys[unknown[0]]);
	if (st->o.store != NULL) {
		snprintf(detail, sizeof detail,
		    "service=%.64s session=%" PRIu64
		    " keys=%u unknown=%zu replicas=%u",
		    req->service, s->id, s->nkeys, nunknown, replicas);
		allot__store_event(st->o.store, "join", s->replica_id, detail);
	}
	return ALLOT__V1__ERROR__CODE__UNSPECIFIED;
}

Allot__V1__Error__Code
allot__state_sync_on(allot__state *st, const Allot__V1__Sync *req,
    uint32_t pipe, ProtobufCAllocator *pa, Allot__V1__Reply *ret, char *err,
    size_t errlen)
{
	allot__metrics *m = st->o.metrics;
	uint32_t unknown = 0, absurd = 0;
	uint32_t bad_key = 0;
	const Allot__V1__KeyReport *bad = NULL;
	uint64_t last_seq = 0;

	pthread_mutex_lock(&st->mu);
	uint64_t now = now_ns(st);
	allot__heard(st, now);
	session *s = allot__session_find(st, req->session);
	if (s == NULL) {
		pthread_mutex_unlock(&st->mu);
		snprintf(err, errlen,
		    "unknown session %" PRIu64 ": register again",
		    req->session);
		allot__metrics_reject(m, ALLOT__REJ_UNKNOWN_SESSION, 1);
		return ALLOT__V1__ERROR__CODE__UNKNOWN_SESSION;
	}
	if (!pipe_ok(s, pipe)) {
		pthread_mutex_unlock(&st->mu);
		return pipe_mismatch(m, req->session, err, errlen);
	}
	if (req->seq <= s->last_seq) {
		last_seq = s->last_seq;
		pthread_mutex_unlock(&st->mu);
		snprintf(err, errlen,
		    "seq %" PRIu64 " is not above the last "
		    "accepted seq %" PRIu64 " of session %" PRIu64,
		    req->seq, last_seq, req->session);
		allot__metrics_reject(m, ALLOT__REJ_STALE_SEQ, 1);
		return ALLOT__V1__ERROR__CODE__STALE_SEQ;
	}
	service *svc = s->svc;
	const cfgv *v = st->cur;
	double n = svc->nsess;
	double window_s = (double) since(now, s->last_sync_ns) / 1e9 + 1.0;
	double f = st->o.absurd_factor;
	/* The window the reports cover, for the demand estimates: the
	 * agent's own measure (no network jitter in it) unless it is
	 * missing or beyond what the coordinator saw. */
	double w = (double) req->elapsed_ms / 1e3;
	double wseen = window_s - 1.0;
	if (!(w > 0) || w > wseen + 1.0)
		w = wseen;
	if (w < 1e-3)
		w = 1e-3;
	uint32_t *not_owner = NULL;
	size_t n_not_owner = 0;
	bool forced = false;
	for (size_t i = 0; i < req->n_reports; i++) {
		const Allot__V1__KeyReport *r = req->reports[i];
		if (r->key >= s->nkeys || s->keys[r->key].q < 0) {
			unknown++;
			continue;
		}
		skey *key = &s->keys[r->key];
		int32_t q = key->q;
		if (svc->q[q].disowned) {
			/* Another member's key in our view: no allocation
			 * and no lease for it (Reply.not_owner), but what was
			 * consumed is recorded, so that the members' files
			 * add up to everything the agents report. */
			squota *dq = &svc->q[q];
			double dlim = f * v->rate[q] * n * window_s +
			    v->burst[q];
			if ((double) r->consumed <= dlim &&
			    (double) r->denied <=
			        ALLOT__STATE_FLOOD_FACTOR * dlim) {
				dq->allowed_total += r->consumed;
				dq->denied_total += r->denied;
				dq->win_allowed += r->consumed;
				dq->win_denied += r->denied;
			}
			if (not_owner == NULL)
				not_owner = pa_alloc(
				    pa, req->n_reports * sizeof *not_owner);
			if (not_owner != NULL)
				not_owner[n_not_owner++] = r->key;
			continue;
		}
		if (r->foreign) {
			key->force_share = true;
			forced = true;
			if (isnan(key->sent_rate) &&
			    now < svc->q[q].learn_until_ns)
				allot__adopt(st, svc, s, key, r);
		}
		double rate = v->rate[q], burst = v->burst[q];
		double lim = f * rate * n * window_s + burst;
		if ((double) r->consumed > lim ||
		    (double) r->denied > ALLOT__STATE_FLOOD_FACTOR * lim ||
		    (double) r->demand >
		        ALLOT__STATE_FLOOD_FACTOR * f * rate * n ||
		    (double) r->held > f * burst + 1) {
			if (absurd++ == 0) {
				bad = r;
				bad_key = r->key;
			}
			continue;
		}
		squota *sq = &svc->q[q];
		sq->allowed_total += r->consumed;
		sq->denied_total += r->denied;
		sq->win_allowed += r->consumed;
		sq->win_denied += r->denied;
		allot__level_bring(sq, rate, burst, now);
		sq->level -= (double) r->consumed;
		if (sq->level < 0)
			sq->level = 0;
		allot__est_update(
		    s, key, (double) r->consumed + (double) r->denied, w, now);
		key->consumed += (double) r->consumed;
		key->denied += (double) r->denied;
		key->demand = (double) r->demand;
		key->held = (double) r->held;
	}
	bool gap = req->seq != s->last_seq + 1;
	/* No gap: the agent applied our previous answer, so what it holds
	 * is its grant again, and its lease runs from that answer. */
	if (!gap) {
		s->acked_reply_ns = s->last_reply_ns;
		s->acked_replicas = s->last_replicas;
	}
	if (!gap && s->unacked) {
		for (uint32_t k = 0; k < s->nkeys; k++) {
			skey *key = &s->keys[k];
			double h0 = key->q >= 0 ? key_hold(key) : 0;
			key->may_rate = key->sent_rate;
			key->may_burst = key->sent_burst;
			if (key->q >= 0)
				svc->held_total += key_hold(key) - h0;
		}
		s->unacked = false;
	}
	s->last_seq = req->seq;
	s->last_seen_ns = now;
	s->last_sync_ns = now;
	s->seen_dirty = true;

	ret->seq = req->seq;
	ret->replicas = svc->nsess;
	ret->config_epoch = v->epoch;
	ret->lease_ms = st->o.lease_ms;
	ret->rejected_reports = unknown + absurd;
	ret->not_owner = not_owner;
	ret->n_not_owner = n_not_owner;
	bool full = s->force_full || gap ||
	    ++s->replies_since_full >= st->o.full_every;
	if (full || forced || s->sent_gen != svc->gen || s->pending > 0) {
		if (build_shares(
		        st, s, pa, full, &ret->shares, &ret->n_shares)) {
			ret->full = full;
			if (full) {
				s->replies_since_full = 0;
				s->force_full = false;
			}
			s->sent_gen = svc->gen;
		} else {
			s->force_full = true;
		}
	}
	s->last_reply_ns = now;
	s->last_replicas = svc->nsess;
	pthread_mutex_unlock(&st->mu);

	if (m != NULL) {
		allot__metrics_add(&m->syncs, 1);
		allot__metrics_add(
		    &m->key_reports, req->n_reports - unknown - absurd);
	}
	if (n_not_owner > 0)
		allot__metrics_reject(m, ALLOT__REJ_NOT_OWNER, n_not_owner);
	if (unknown > 0) {
		allot__metrics_reject(m, ALLOT__REJ_UNKNOWN_KEY, unknown);
		allot__log_ratelimited(st->o.lg, &st->rl_unknown,
		    ALLOT_LOG_WARNING, "ALLOTD-UNKNOWN-KEY",
		    "session %" PRIu64 " seq %" PRIu64 ": %u reports for keys "
		    "that are out of range or have no quota were dropped",
		    req->session, req->seq, unknown);
	}
	if (absurd > 0) {
		allot__metrics_reject(m, ALLOT__REJ_ABSURD, absurd);
		allot__log_ratelimited(st->o.lg, &st->rl_absurd,
		    ALLOT_LOG_WARNING, "ALLOTD-ABSURD",
		    "session %" PRIu64 " seq %" PRIu64 ": %u reports with "
		    "impossible numbers dropped (first: key %u consumed "
		    "%" PRIu64 " denied %" PRIu64 " held %" PRIu64
		    " demand %" PRIu64 ")",
		    req->session, req->seq, absurd, bad_key, bad->consumed,
		    bad->denied, bad->held, bad->demand);
	}
	return ALLOT__V1__ERROR__CODE__UNSPECIFIED;
}

/* Agent-supplied free text for a store row: printable, bounded. */
static void
sanitize(char *dst, size_t cap, const char *src)
{
	size_t j = 0;
	for (size_t i = 0; src != NULL && src[i] != '\0' && j + 1 < cap; i++) {
		unsigned char c = (unsigned char) src[i];
		dst[j++] = c >= 0x20 && c < 0x7f ? (char) c : '?';
	}
	dst[j] = '\0';
}

Allot__V1__Error__Code
allot__state_leave_on(allot__state *st, const Allot__V1__Leave *req,
    uint32_t pipe, Allot__V1__Reply *ret, char *err, size_t errlen)
{
	allot__metrics *m = st->o.metrics;
	pthread_mutex_lock(&st->mu);
	uint64_t now = now_ns(st);
	allot__heard(st, now);
	session *s = allot__session_find(st, req->session);
	if (s == NULL) {
		pthread_mutex_unlock(&st->mu);
		snprintf(
		    err, errlen, "unknown session %" PRIu64, req->session);
		allot__metrics_reject(m, ALLOT__REJ_UNKNOWN_SESSION, 1);
		return ALLOT__V1__ERROR__CODE__UNKNOWN_SESSION;
	}
	if (!pipe_ok(s, pipe)) {
		pthread_mutex_unlock(&st->mu);
		return pipe_mismatch(m, req->session, err, errlen);
	}
	service *svc = s->svc;
	allot__conserve_leave(svc, s);
	allot__session_unlink(st, s);
	allot__recompute(st, svc, now);
	uint32_t remaining = svc->nsess;
	ret->seq = 0;
	ret->replicas = remaining;
	ret->config_epoch = st->cur->epoch;
	ret->lease_ms = 0;
	ret->full = true;
	if (st->o.store != NULL)
		allot__store_replica_left(st->o.store, s->id, "leave");
	pthread_mutex_unlock(&st->mu);

	char reason[129];
	sanitize(reason, sizeof reason, req->reason);
	if (m != NULL)
		allot__metrics_add(&m->leaves, 1);
	allot__log(st->o.lg, ALLOT_LOG_INFO, "ALLOTD-LEAVE",
	    "replica %s of %s left (session %" PRIu64 ", reason \"%s\"); %u "
	    "replicas now",
	    s->replica_id, svc->name, s->id, reason, remaining);
	if (st->o.store != NULL) {
		char detail[256];
		snprintf(detail, sizeof detail,
		    "service=%.64s session=%" PRIu64 " replicas=%u reason=%s",
		    svc->name, s->id, remaining, reason);
		allot__store_event(
		    st->o.store, "leave", s->replica_id, detail);
	}
	allot__session_free(s);
	return ALLOT__V1__ERROR__CODE__UNSPECIFIED;
}

Allot__V1__Error__Code
allot__state_register(allot__state *st, const Allot__V1__Register *req,
    ProtobufCAllocator *pa, Allot__V1__Welcome *ret, char *err, size_t errlen)
{
	return allot__state_register_on(st, req, 0, pa, ret, err, errlen);
}

Allot__V1__Error__Code
allot__state_sync(allot__state *st, const Allot__V1__Sync *req,
    ProtobufCAllocator *pa, Allot__V1__Reply *ret, char *err, size_t errlen)
{
	return allot__state_sync_on(st, req, 0, pa, ret, err, errlen);
}

Allot__V1__Error__Code
allot__state_leave(allot__state *st, const Allot__V1__Leave *req,
    Allot__V1__Reply *ret, char *err, size_t errlen)
{
	return allot__state_leave_on(st, req, 0, ret, err, errlen);
}
