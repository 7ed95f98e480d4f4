/* SPDX-License-Identifier: MIT */
/*
 * The requests of the protocol (docs/protocol.md) from the nng worker
 * threads: Register and Leave here, Sync in sync.c, what their
 * answers carry in answer.c. Each validates what it can before locking,
 * does its memory work under the lock, and logs and counts after
 * unlocking. Session ids, key interning and a newcomer's first grants
 * are decided here.
 */
#include "registry_int.h"

#include "hash.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* One Register on its way through: what its steps share. */
typedef struct reg {
	allot__state *st;
	const Allot__V1__Register *req;
	session *s; /* the new session (ours until it is linked) */
	service *svc;
	session *old; /* the session it replaces, or NULL */
	bool returning; /* replaces a session, or expired not long ago */
	bool forming; /* its service waits for it (allot__forming()) */
	uint32_t *unknown; /* key ids without a quota */
	size_t nunknown;
	int32_t *q; /* per key id its quota index, or -1 */
	uint32_t replicas;
	uint64_t peer; /* its sender (state.h), 0: unknown */
	uint32_t of_peer; /* the service's other replicas from that peer */
	allot__push push; /* the config text in the Welcome */
	uint64_t digest; /* the config in force, and its length */
	size_t text_len;
	allot__reject why; /* when refused */
	char *err;
	size_t errlen;
} reg;

/* The audit's name for an agent's account: its incarnation mixed with
 * its service and replica id, so that another peer claiming the same
 * incarnation (from another service, or as another replica, which it
 * cannot register as while that one lives) books into an account of its
 * own and never shadows the victim's records (usage.c). 0: none. */
static uint64_t
account_of(const Allot__V1__Register *req)
{
	if (req->incarnation == 0)
		return 0;
	const char *sv = req->service != NULL ? req->service : "";
	const char *id = req->replica_id != NULL ? req->replica_id : "";
	uint64_t h = allot__hash(id, strlen(id),
	    allot__hash(sv, strlen(sv), 0x616c6c6f74616363ull));
	uint64_t a = allot__mix64(req->incarnation ^ h);
	return a != 0 ? a : 1;
}

static Allot__V1__Error__Code
reg_no_memory(reg *r)
{
	r->why = ALLOT__REJ_CAPACITY;
	snprintf(r->err, r->errlen, "out of memory, try again later");
	return ALLOT__V1__ERROR__CODE__RATE_LIMITED;
}

/* Map every key of the new session to its quota index; a key listed
 * twice is refused. Under the lock. */
static Allot__V1__Error__Code
reg_intern_keys(reg *r)
{
	allot__state *st = r->st;
	session *s = r->s;
	const cfgv *v = st->cur;
	if (!allot__stamp_next(st))
		return reg_no_memory(r);
	uint32_t nknown = 0;
	char *const *wire = r->req->keys;
	for (uint32_t k = 0; k < s->nwire; k++) {
		int32_t q = allot__cfgv_find_svc(
		    v, r->req->service, wire[k], strlen(wire[k]));
		r->q[k] = q;
		if (q == ALLOT__CFGV_FIXED)
			continue; /* decided by the agents alone */
		if (q < 0) {
			r->unknown[r->nunknown++] = k;
			continue;
		}
		if (st->stamp[q] == st->stamp_gen) {
			r->why = ALLOT__REJ_MALFORMED;
			snprintf(r->err, r->errlen,
			    "key %u (%.64s) is listed twice", k, wire[k]);
			return ALLOT__V1__ERROR__CODE__MALFORMED;
		}
		st->stamp[q] = st->stamp_gen;
		nknown++;
	}
	/* Keys without a quota are counted (Welcome.unknown_keys, the
	 * metrics), not kept: a Register listing 65,537 of them costs the
	 * state what one listing only its known keys does. */
	if (!allot__session_keep(s, wire, r->q, nknown))
		return reg_no_memory(r);
	return ALLOT__V1__ERROR__CODE__UNSPECIFIED;
}

/* Find or create the service, and the session of the same replica the
 * new one replaces; refuse when a table is full. Under the lock. */
static Allot__V1__Error__Code
reg_find(reg *r)
{
	allot__state *st = r->st;
	bool full = false;
	r->svc = allot__service_open(st, r->req->service, &full);
	if (r->svc == NULL) {
		r->why = ALLOT__REJ_CAPACITY;
		snprintf(r->err, r->errlen,
		    full ? "too many services (at most %u)" :
		           "out of memory, try again later",
		    st->o.max_services);
		return ALLOT__V1__ERROR__CODE__RATE_LIMITED;
	}
	service *svc = r->svc;
	for (uint32_t i = 0; i < svc->nsess; i++) {
		const session *o = svc->sess[i];
		if (r->old == NULL &&
		    strcmp(o->replica_id, r->s->replica_id) == 0) {
			r->old = svc->sess[i];
			continue;
		}
		r->of_peer += r->peer != 0 && o->peer == r->peer &&
		    !o->placeholder;
	}
	if (r->old == NULL && st->nsessions >= st->o.max_replicas) {
		r->why = ALLOT__REJ_CAPACITY;
		snprintf(r->err, r->errlen, "too many replicas (at most %u)",
		    st->o.max_replicas);
		return ALLOT__V1__ERROR__CODE__RATE_LIMITED;
	}
	if (r->old == NULL && svc->nsess >= st->o.max_replicas_per_service) {
		r->why = ALLOT__REJ_CAPACITY;
		snprintf(r->err, r->errlen,
		    "too many replicas of service %.64s (at most %u)",
		    svc->name, st->o.max_replicas_per_service);
		return ALLOT__V1__ERROR__CODE__RATE_LIMITED;
	}
	if (r->old == NULL && st->o.max_replicas_per_peer > 0 &&
	    r->of_peer >= st->o.max_replicas_per_peer) {
		r->why = ALLOT__REJ_PEER_REPLICAS;
		snprintf(r->err, r->errlen,
		    "too many replicas of service %.64s from this peer (at "
		    "most %u)",
		    svc->name, st->o.max_replicas_per_peer);
		return ALLOT__V1__ERROR__CODE__RATE_LIMITED;
	}
	r->returning = r->old != NULL;
	for (uint32_t i = 0; i < svc->nzs && !r->returning; i++)
		r->returning = strcmp(svc->zs[i].replica_id,
		                   r->s->replica_id) == 0;
	return ALLOT__V1__ERROR__CODE__UNSPECIFIED;
}

/* Put the new session in its service in place of the old one (whose
 * estimates it inherits) or beside the others (who give up part of
 * theirs), holding what the replica may still run on. Under the lock. */
static Allot__V1__Error__Code
reg_link(reg *r, uint32_t pipe, uint64_t now)
{
	allot__state *st = r->st;
	service *svc = r->svc;
	session *s = r->s;
	/* A newcomer its service's start-up waits for takes its part at
	 * its Welcome (grants.c, "start-up"). */
	r->forming = allot__forming_start(
	                 st, svc, r->req->expected_replicas, now) ||
	    allot__forming(svc, now) < 1.0;
	allot__carry_allowances(st, svc, s, r->old, now);
	if (r->old != NULL) {
		allot__est_inherit(s, r->old);
		/* Still waiting for its first Sync to move demand. */
		s->join_pending = r->old->join_pending;
		allot__session_unlink(st, r->old);
	} else if (r->of_peer > 0) {
		/* Its address already has a replica here: it moves demand
		 * when it syncs, so that fakes registered from one address
		 * cannot shrink the others' shares (state.h). */
		s->join_pending = true;
	} else {
		allot__conserve_join(svc, NULL);
	}
	allot__expired_forget(svc, s->replica_id);
	/* What its expired record kept out of the headroom is now held by
	 * this session (allot__carry_allowances): release it before the
	 * Welcome's grants, not at the next tick, or a replica coming back
	 * from a partition gets nothing and denies for an interval. */
	allot__reserve_expired(st, svc, now);
	if (!allot__service_add(svc, s)) {
		if (r->old != NULL && allot__service_add(svc, r->old)) {
			if (!r->old->placeholder)
				allot__session_hash_add(st, r->old);
			st->nsessions++;
			r->old = NULL;
		}
		return reg_no_memory(r);
	}
	uint32_t iv = r->req->sync_interval_ms;
	s->boot_replicas = r->req->expected_replicas > 0 ?
	    r->req->expected_replicas :
	    1;
	/* Its callers wait for the reserve (Register.waits): so do its
	 * keys from their first grant (and those it adds later). */
	s->waits = r->req->waits;
	s->incarnation = account_of(r->req);
	for (uint32_t k = 0; k < s->nkeys; k++)
		s->keys[k].tail = s->waits;
	s->id = st->next_session++;
	s->pipe = pipe;
	s->peer = r->peer;
	s->last_seen_ns = now;
	s->last_sync_ns = now;
	s->expiry_ns = allot__expiry_ns(st, iv);
	s->interval_s = (double) (iv > 0 &&
	                            iv <= ALLOT__STATE_AGENT_INTERVAL_MAX ?
	                        iv :
	                        st->o.interval_ms) /
	    1e3;
	s->joined_wall_ms = allot__wall_ms();
	s->seen_wall_ms = s->joined_wall_ms;
	allot__session_hash_add(st, s);
	st->nsessions++;
	return ALLOT__V1__ERROR__CODE__UNSPECIFIED;
}

/* The shares recomputed, the Welcome with the new session's first
 * grants, and the store rows. Under the lock. */
static void
reg_welcome(
    reg *r, ProtobufCAllocator *pa, uint64_t now, Allot__V1__Welcome *ret)
{
	allot__state *st = r->st;
	service *svc = r->svc;
	session *s = r->s;
	const cfgv *v = st->cur;
	allot__recompute(st, svc, now);
	r->replicas = svc->nsess;
	ret->session = s->id;
	ret->replicas = r->replicas;
	ret->config_epoch = v->epoch;
	ret->config_digest = v->cfg->digest;
	ret->lease_ms = st->o.lease_ms;
	ret->durable = allot__usage_durable(st, s);
	r->digest = v->cfg->digest;
	r->text_len = v->text_len;
	r->push = allot__config_push(
	    st, s, pa, r->req->config_digest, now, &ret->config);
	/* A newcomer takes headroom at its Welcome only when it is alone
	 * (placeholders of a restart aside); otherwise it gets its first
	 * grant in its first Reply. In a wave of joins this keeps an early
	 * newcomer from taking a share sized for the smaller replica set,
	 * which it would only give back at its next Sync while the later
	 * ones wait for it: the wave settles in one round, not two. A
	 * replica coming back (replacing its session, or after it expired)
	 * is no newcomer: it gets what the headroom has at once, and
	 * neither is one a forming service kept its part for. */
	for (uint32_t i = 0;
	     i < svc->nsess && !st->hold && !r->returning && !r->forming; i++)
		st->hold = svc->sess[i] != s && !svc->sess[i]->placeholder;
	bool built = allot__build_shares(
	    st, s, pa, true, &ret->shares, &ret->n_shares);
	st->hold = false;
	if (!built) {
		/* Welcome without shares: the agent keeps its static split;
		 * the first Reply is full. */
		s->force_full = true;
	}
	s->last_reply_ns = s->welcomed_ns = now;
	s->last_replicas = r->replicas;
	s->sent_gen = svc->gen;
	ret->unknown_keys = r->unknown;
	ret->n_unknown_keys = r->nunknown;
	if (st->o.store != NULL) {
		if (r->old != NULL)
			allot__store_replica_left(
			    st->o.store, r->old->id, "replaced");
		allot__store_replica_joined(st->o.store, s->id, s->replica_id,
		    svc->name, s->host, s->pid, s->agent_version, s->digest);
		allot__store_usage_link(st->o.store, s->id, s->incarnation);
	}
}

/* After unlocking: the counters, log lines and events of a join. */
static void
reg_report(reg *r)
{
	allot__state *st = r->st;
	allot__metrics *m = st->o.metrics;
	const Allot__V1__Register *req = r->req;
	session *s = r->s, *old = r->old;
	if (m != NULL) {
		allot__metrics_add(&m->registers, 1);
		allot__metrics_add(&m->joins, 1);
		allot__metrics_add(&m->register_unknown_keys, r->nunknown);
		if (old != NULL)
			allot__metrics_add(&m->replaced, 1);
	}
	char detail[160];
	if (old != NULL) {
		allot__log(st->o.lg, ALLOT_LOG_INFO, "ALLOTD-REPLACE",
		    "replica %s of %s registered again: session %" PRIu64
		    " replaces %s session %" PRIu64,
		    s->replica_id, req->service, s->id,
		    old->placeholder ? "restored" : "live", old->id);
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
	    s->id, s->nwire, r->nunknown, r->replicas);
	if (r->nunknown > 0)
		allot__log_ratelimited(st->o.lg, &st->rl_unknown,
		    ALLOT_LOG_WARNING, "ALLOTD-UNKNOWN-KEY",
		    "replica %s of %s named %zu identities without a quota "
		    "(first: %.128s); they stay at the agent's own config",
		    s->replica_id, req->service, r->nunknown,
		    req->keys[r->unknown[0]]);
	if (st->o.store != NULL) {
		snprintf(detail, sizeof detail,
		    "service=%.64s session=%" PRIu64
		    " keys=%u unknown=%zu replicas=%u",
		    req->service, s->id, s->nwire, r->nunknown, r->replicas);
		allot__store_event(st->o.store, "join", s->replica_id, detail);
	}
}

Allot__V1__Error__Code
allot__state_register_on(allot__state *st, const Allot__V1__Register *req,
    uint32_t pipe, ProtobufCAllocator *pa, Allot__V1__Welcome *ret, char *err,
    size_t errlen)
{
	return allot__state_register_from(
	    st, req, pipe, 0, pa, ret, err, errlen);
}

Allot__V1__Error__Code
allot__state_register_from(allot__state *st, const Allot__V1__Register *req,
    uint32_t pipe, uint64_t peer, ProtobufCAllocator *pa,
    Allot__V1__Welcome *ret, char *err, size_t errlen)
{
	allot__metrics *m = st->o.metrics;
	Allot__V1__Error__Code code = allot__register_check(req, err, errlen);
	if (code != ALLOT__V1__ERROR__CODE__UNSPECIFIED) {
		allot__metrics_reject(m, ALLOT__REJ_MALFORMED, 1);
		return code;
	}
	uint32_t *unknown = allot__pa_alloc(
	    pa, (req->n_keys + 1) * sizeof *unknown);
	int32_t *qs = allot__pa_alloc(pa, (req->n_keys + 1) * sizeof *qs);
	session *s = allot__session_new(req);
	reg r = {
		.st = st,
		.req = req,
		.s = s,
		.unknown = unknown,
		.q = qs,
		.peer = peer,
		.why = ALLOT__REJ_COUNT,
		.err = err,
		.errlen = errlen,
	};
	if (r.s == NULL || r.unknown == NULL || r.q == NULL) {
		allot__session_free(r.s);
		snprintf(err, errlen, "out of memory, try again later");
		allot__metrics_reject(m, ALLOT__REJ_CAPACITY, 1);
		return ALLOT__V1__ERROR__CODE__RATE_LIMITED;
	}

	pthread_mutex_lock(&st->mu);
	uint64_t now = now_ns(st);
	allot__heard(st, now);
	code = reg_intern_keys(&r);
	if (code == ALLOT__V1__ERROR__CODE__UNSPECIFIED)
		code = reg_find(&r);
	if (code == ALLOT__V1__ERROR__CODE__UNSPECIFIED && r.old != NULL &&
	    allot__session_live_elsewhere(st, r.old, pipe, now)) {
		/* Another connection's live replica: a restart closes the
		 * old connection (or the session expires), a stranger with
		 * its id waits for that (issue 27). */
		r.why = ALLOT__REJ_REPLICA_IN_USE;
		snprintf(err, errlen,
		    "replica %.128s of %.64s is live on another connection: "
		    "retry once it has closed or expired",
		    req->replica_id, req->service);
		code = ALLOT__V1__ERROR__CODE__RATE_LIMITED;
	}
	if (code == ALLOT__V1__ERROR__CODE__UNSPECIFIED)
		code = reg_link(&r, pipe, now);
	if (code == ALLOT__V1__ERROR__CODE__UNSPECIFIED)
		reg_welcome(&r, pa, now, ret);
	pthread_mutex_unlock(&st->mu);

	if (code != ALLOT__V1__ERROR__CODE__UNSPECIFIED) {
		allot__metrics_reject(m, r.why, 1);
		allot__log_ratelimited(st->o.lg, &st->rl_register,
		    ALLOT_LOG_WARNING, "ALLOTD-REGISTER-FAIL",
		    "replica %s of %s not registered: %s", req->replica_id,
		    req->service, err);
		allot__session_free(r.s);
		return code;
	}
	reg_report(&r);
	allot__config_push_report(
	    st, r.push, req->replica_id, req->service, r.digest, r.text_len);
	return ALLOT__V1__ERROR__CODE__UNSPECIFIED;
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
	if (!allot__pipe_ok(s, pipe)) {
		pthread_mutex_unlock(&st->mu);
		return allot__pipe_mismatch(m, req->session, err, errlen);
	}
	service *svc = s->svc;
	/* Its last decisions, before the session is gone. */
	allot__usage_book(st, s, req->usage, req->n_usage);
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
	allot__sanitize(reason, sizeof reason, req->reason);
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
allot__state_leave(allot__state *st, const Allot__V1__Leave *req,
    Allot__V1__Reply *ret, char *err, size_t errlen)
{
	return allot__state_leave_on(st, req, 0, ret, err, errlen);
}
