/* SPDX-License-Identifier: MIT */
/*
 * The store's record side (store.h, "records"): every call takes the
 * audit time first, then, under the store's one short mutex, adds to or
 * coalesces into the current batch (store_batch.h) and enforces the
 * queue bound on it. No I/O, and in the steady state no malloc, so the
 * registry may call these from any thread. Also what other threads read
 * under the same mutex: the counters, the largest session, and the
 * clock setting.
 */
#include "store_int.h"

#include <string.h>
#include <time.h>

/* Take the store's lock and return the interned (service, quota), or
 * NULL when it is refused (out of memory or over the bound on keys); the
 * lock is held either way. The hash is computed before the lock is
 * taken (the seed never changes). */
static const struct key *
lock_key(allot__store *st, const char *service, const char *quota)
{
	size_t sl = strlen(service), ql = strlen(quota);
	uint64_t h = allot__store_keys_hash(&st->keys, service, sl, quota, ql);
	pthread_mutex_lock(&st->mu);
	return allot__store_keys_intern(&st->keys, h, service, sl, quota, ql);
}

/* After a row was added to the current batch: enforce max_pending on it
 * (the flush enforces it again on what a failed commit left behind). */
static void
bound_cur(allot__store *st)
{
	if (allot__batch_rows(st->cur) > st->opts.max_pending) {
		st->rows_dropped += allot__batch_trim(
		    st->cur, st->opts.max_pending);
		allot__store_counts_trimmed(st, st->cur);
	}
}

static struct op *
op_new(allot__store *st, enum op_kind kind, int64_t at)
{
	struct op *o = allot__batch_op_new(st->cur, kind, at);
	if (o == NULL)
		st->rows_rejected++;
	return o;
}

/* Copies the strings of `o`; on failure the op is not queued. */
static void
op_push(allot__store *st, struct op *o, const char *s0, const char *s1,
    const char *s2, const char *s3)
{
	if (!allot__batch_op_push(st->cur, o, s0, s1, s2, s3)) {
		st->rows_rejected++;
		return;
	}
	bound_cur(st);
}

void
allot__store_replica_joined(allot__store *st, uint64_t session,
    const char *replica_id, const char *service, const char *host,
    uint32_t pid, const char *agent_version, uint64_t config_digest)
{
	if (st == NULL)
		return;
	int64_t at = allot__store_now_ms(st);
	pthread_mutex_lock(&st->mu);
	if (session > st->max_session)
		st->max_session = session;
	struct op *o = op_new(st, OP_JOIN, at);
	if (o != NULL) {
		o->session = session;
		o->pid = pid;
		o->u = config_digest;
		op_push(st, o, replica_id != NULL ? replica_id : "",
		    service != NULL ? service : "", host, agent_version);
	}
	pthread_mutex_unlock(&st->mu);
}

void
allot__store_replica_left(allot__store *st, uint64_t session, const char *why)
{
	if (st == NULL)
		return;
	/* The schema's CHECK accepts these four only, and a row that breaks
	 * a constraint would fail every later commit of its batch: other
	 * reasons are recorded as a plain leave. */
	static const char *const whys[] = { "leave", "expired", "replaced",
		"shutdown" };
	const char *w = whys[0];
	for (size_t i = 0; why != NULL && i < 4; i++)
		if (strcmp(why, whys[i]) == 0)
			w = whys[i];
	int64_t at = allot__store_now_ms(st);
	pthread_mutex_lock(&st->mu);
	struct op *o = op_new(st, OP_LEFT, at);
	if (o != NULL) {
		o->session = session;
		/* A static string: no copy needed. */
		o->s[0] = w;
		op_push(st, o, NULL, NULL, NULL, NULL);
	}
	pthread_mutex_unlock(&st->mu);
}

void
allot__store_replica_seen(allot__store *st, uint64_t session)
{
	if (st == NULL)
		return;
	int64_t at = allot__store_now_ms(st);
	pthread_mutex_lock(&st->mu);
	struct seen_ent *e = allot__batch_seen(st->cur, session);
	if (e == NULL) {
		st->rows_rejected++;
	} else {
		if (at > e->at)
			e->at = at;
		bound_cur(st);
	}
	pthread_mutex_unlock(&st->mu);
}

void
allot__store_config_loaded(allot__store *st, uint64_t epoch, uint64_t digest,
    const char *path, const char *content)
{
	if (st == NULL)
		return;
	int64_t at = allot__store_now_ms(st);
	pthread_mutex_lock(&st->mu);
	struct op *o = op_new(st, OP_CONFIG, at);
	if (o != NULL) {
		o->u = epoch;
		o->u2 = digest;
		op_push(st, o, path, content, NULL, NULL);
	}
	pthread_mutex_unlock(&st->mu);
}

void
allot__store_config_change(allot__store *st, const allot__store_change *c,
    const allot__config_diff *d)
{
	if (st == NULL || c == NULL)
		return;
	int64_t at = allot__store_now_ms(st);
	pthread_mutex_lock(&st->mu);
	struct op *o = op_new(st, OP_CHANGE, at);
	if (o != NULL) {
		o->u = c->epoch;
		o->u2 = c->digest;
		op_push(st, o, c->who != NULL ? c->who : "?", c->claimed_as,
		    c->reason != NULL ? c->reason : "", c->source);
	}
	for (size_t i = 0; o != NULL && d != NULL && i < d->n; i++) {
		const allot__quota_change *q = &d->v[i];
		struct op *r = op_new(st, OP_QUOTA, at);
		if (r == NULL)
			continue;
		r->pid = (uint32_t) q->kind;
		const char *s[OP_STRINGS] = { q->service, q->quota, q->before,
			q->after, q->fields, q->owner };
		if (allot__batch_op_push_v(st->cur, r, s, OP_STRINGS))
			bound_cur(st);
		else
			st->rows_rejected++;
	}
	pthread_mutex_unlock(&st->mu);
}

void
allot__store_event(allot__store *st, const char *kind, const char *subject,
    const char *detail)
{
	if (st == NULL)
		return;
	int64_t at = allot__store_now_ms(st);
	pthread_mutex_lock(&st->mu);
	struct op *o = op_new(st, OP_EVENT, at);
	if (o != NULL)
		op_push(
		    st, o, kind != NULL ? kind : "", subject, detail, NULL);
	pthread_mutex_unlock(&st->mu);
}

void
allot__store_share(allot__store *st, uint64_t session, const char *service,
    const char *quota, double rate, double burst, int64_t lease_until_ms)
{
	if (st == NULL || service == NULL || quota == NULL)
		return;
	int64_t at = allot__store_now_ms(st);
	const struct key *k = lock_key(st, service, quota);
	struct share_ent *e = k != NULL ?
	    allot__batch_share(st->cur, session, k) :
	    NULL;
	if (e == NULL) {
		st->rows_rejected++;
	} else {
		e->rate = rate;
		e->burst = burst;
		e->lease_until = lease_until_ms;
		e->at = at;
		bound_cur(st);
	}
	pthread_mutex_unlock(&st->mu);
}

void
allot__store_usage(allot__store *st, const char *service, const char *quota,
    uint64_t admitted, uint64_t denied, double demand, uint32_t live_replicas)
{
	allot__store_usage_row row = {
		.admitted = admitted,
		.denied = denied,
		.demand = demand,
		.live_replicas = live_replicas,
	};
	allot__store_usage_add(st, service, quota, &row);
}

void
allot__store_usage_add(allot__store *st, const char *service,
    const char *quota, const allot__store_usage_row *row)
{
	if (st == NULL || service == NULL || quota == NULL || row == NULL)
		return;
	int64_t at = allot__store_now_ms(st);
	int64_t sec = at >= 0 ? at / 1000 : -((999 - at) / 1000);
	const struct key *k = lock_key(st, service, quota);
	struct usage_ent *e = k != NULL ? allot__batch_usage(st->cur, sec, k) :
	                                  NULL;
	if (e == NULL) {
		st->rows_rejected++;
	} else {
		e->admitted += row->admitted;
		e->denied += row->denied;
		e->shadow_denied += row->shadow_denied;
		e->candidate_denied += row->candidate_denied;
		if (row->candidate_rate > 0)
			e->candidate_rate = row->candidate_rate;
		e->demand += row->demand;
		if (row->live_replicas > e->live_replicas)
			e->live_replicas = row->live_replicas;
		bound_cur(st);
	}
	pthread_mutex_unlock(&st->mu);
}

void
allot__store_level_set(
    allot__store *st, const char *service, const char *quota, double level)
{
	if (st == NULL || service == NULL || quota == NULL)
		return;
	int64_t at = allot__store_now_ms(st);
	const struct key *k = lock_key(st, service, quota);
	struct level_ent *e = k != NULL ? allot__batch_level(st->cur, k) :
	                                  NULL;
	if (e == NULL) {
		st->rows_rejected++;
	} else {
		e->level = level;
		e->at = at;
		bound_cur(st);
	}
	pthread_mutex_unlock(&st->mu);
}

uint64_t
allot__store_max_session(allot__store *st)
{
	if (st == NULL)
		return 0;
	pthread_mutex_lock(&st->mu);
	uint64_t m = st->max_session;
	pthread_mutex_unlock(&st->mu);
	return m;
}

void
allot__store_set_clock(allot__store *st, int64_t (*now)(void *ctx), void *ctx)
{
	if (st == NULL)
		return;
	st->clock = now;
	st->clock_ctx = ctx;
}

void
allot__store_stats_get(allot__store *st, allot__store_stats *ret)
{
	if (st == NULL || ret == NULL)
		return;
	allot__store_stats s;
	memset(&s, 0, sizeof s);
	pthread_mutex_lock(&st->mu);
	s.commits = st->commits;
	s.commit_failures = st->commit_failures;
	s.rows_written = st->rows_written;
	s.rows_dropped = st->rows_dropped;
	s.pending = allot__batch_rows(st->cur) + st->retry_rows;
	s.last_commit_ms = st->last_commit_ms;
	s.last_error = st->last_error;
	s.rows_rejected = st->rows_rejected;
	s.retention_deleted = st->retention_deleted;
	s.retention_failures = st->retention_failures;
	s.shares_unchanged = st->shares_unchanged;
	pthread_mutex_unlock(&st->mu);
	*ret = s;
}
