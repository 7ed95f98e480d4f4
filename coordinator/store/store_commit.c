/* SPDX-License-Identifier: MIT */
/*
 * The store's group commit (store.h: allot__store_flush) and retention,
 * on the loop thread. A flush swaps the current batch for an empty one,
 * merges it into the batch that a failed commit left behind (if any),
 * trims that to max_pending by dropping the oldest usage rows, and writes
 * it in one transaction with the statements prepared at open. A failed
 * commit (disk full, database locked by an auditor) keeps the batch for
 * the next flush; the failure is counted and logged, rate-limited. The
 * commit also remembers which shares the database holds, so a share
 * recorded again unchanged is only rewritten every share_refresh_ms.
 * Retention runs after a successful commit, once a minute, one bounded
 * chunk per table.
 */
#include "store_int.h"

#include <inttypes.h>
#include <stdio.h>

#include "clock.h"
#include "config_diff.h"

#define NIL ALLOT__TAB_NIL
#define RETENTION_EVERY_MS 60000
/* Known-written shares not recorded for this long are forgotten (their
 * session or quota is gone); if one returns it is simply written again. */
#define WRITTEN_FORGET_MS 60000

/* What the database holds for a share, as far as the flush knows: lets
 * it skip shares recorded again unchanged (the common case) and only
 * refresh their lease_until every share_refresh_ms. */
struct written_ent {
	allot__tab_hdr hdr;
	uint64_t session;
	const struct key *k;
	double rate;
	double burst;
	int64_t written_at; /* record time of the value last written */
	int64_t seen_at; /* record time of the last share recorded */
};

void
allot__store_written_init(allot__store *st)
{
	allot__tab_init(&st->written, sizeof(struct written_ent));
	allot__tab_init(&st->left, sizeof(struct seen_ent));
}

void
allot__store_written_free(allot__store *st)
{
	allot__tab_free(&st->written);
	allot__tab_free(&st->left);
}

int
allot__store_step(sqlite3_stmt *s)
{
	int rc = sqlite3_step(s);
	sqlite3_reset(s);
	return rc == SQLITE_DONE || rc == SQLITE_ROW ? SQLITE_OK : rc;
}

static int
step_done(allot__store *st, int id)
{
	return allot__store_step(st->stmt[id]);
}

static void
bind_text(sqlite3_stmt *s, int i, const char *v)
{
	if (v == NULL)
		sqlite3_bind_null(s, i);
	else
		sqlite3_bind_text(s, i, v, -1, SQLITE_STATIC);
}

void
allot__store_bind_hex(sqlite3_stmt *s, int i, uint64_t v)
{
	char hex[17];
	snprintf(hex, sizeof hex, "%016" PRIx64, v);
	sqlite3_bind_text(s, i, hex, 16, SQLITE_TRANSIENT);
}
/* The same test as the shares_history_update trigger: a share changed
 * when its rate or burst moved by more than one part in a million. */
static bool
same_value(double old, double now)
{
	double d = now - old, m = old < 0 ? -old : old;
	if (d < 0)
		d = -d;
	return d <= 1e-6 * (m > 1.0 ? m : 1.0);
}

static struct written_ent *
written_find(const allot__tab *t, uint64_t session, const struct key *k)
{
	uint64_t h = allot__share_hash(session, k);
	for (uint32_t i = allot__tab_head(t, h); i != NIL;) {
		struct written_ent *w = (struct written_ent *) allot__tab_at(
		    t, i);
		if (w->hdr.h == h && w->session == session && w->k == k)
			return w;
		i = w->hdr.next;
	}
	return NULL;
}

/* After a commit: remember what the database now holds. Out of memory
 * only means the share is written again next time. */
static void
written_update(allot__store *st, const struct batch *b)
{
	for (uint32_t i = 0; i < b->shares.n; i++) {
		const struct share_ent *e = (const struct share_ent *)
		    allot__tab_at(&b->shares, i);
		struct written_ent *w = written_find(
		    &st->written, e->session, e->k);
		if (w == NULL) {
			if (!e->write)
				continue;
			uint32_t j = allot__tab_add(
			    &st->written, allot__share_hash(e->session, e->k));
			if (j == NIL)
				continue;
			w = (struct written_ent *) allot__tab_at(
			    &st->written, j);
			w->session = e->session;
			w->k = e->k;
		}
		w->seen_at = e->at;
		if (e->write) {
			w->rate = e->rate;
			w->burst = e->burst;
			w->written_at = e->at;
		}
	}
}

/* Forget the shares of sessions that left in `b` (their rows were
 * deleted), and, once a minute, shares no longer recorded. */
static void
written_sweep(allot__store *st, const struct batch *b)
{
	allot__tab_clear(&st->left);
	for (const struct op *o = b->ops; o != NULL; o = o->next) {
		if (o->kind != OP_LEFT)
			continue;
		uint32_t j = allot__tab_add(
		    &st->left, allot__mix64(o->session));
		if (j == NIL)
			break;
		struct seen_ent *l = (struct seen_ent *) allot__tab_at(
		    &st->left, j);
		l->session = o->session;
	}
	int64_t now = allot__store_now_ms(st);
	bool forget = now >= st->next_forget_ms;
	if (st->left.n == 0 && !forget)
		return;
	if (forget)
		st->next_forget_ms = now + WRITTEN_FORGET_MS;
	uint32_t gone = 0;
	for (uint32_t i = 0; i < st->written.n; i++) {
		struct written_ent *w = (struct written_ent *) allot__tab_at(
		    &st->written, i);
		if (!w->hdr.live)
			continue;
		bool drop = forget && w->seen_at < now - WRITTEN_FORGET_MS;
		uint64_t h = allot__mix64(w->session);
		for (uint32_t j = allot__tab_head(&st->left, h);
		     j != NIL && !drop;) {
			const struct seen_ent *l = (const struct seen_ent *)
			    allot__tab_at(&st->left, j);
			drop = l->session == w->session;
			j = l->hdr.next;
		}
		if (drop) {
			allot__tab_unlink(&st->written, i);
			gone++;
		}
	}
	if (gone > 0)
		allot__tab_compact(&st->written);
	if (st->left.n > 0 && st->left.cap > 4096)
		allot__tab_free(&st->left);
}

bool
allot__store_share_due(const allot__store *st, const struct share_ent *e)
{
	const struct written_ent *w = written_find(
	    &st->written, e->session, e->k);
	return w == NULL || !same_value(w->rate, e->rate) ||
	    !same_value(w->burst, e->burst) ||
	    e->at - w->written_at >= (int64_t) st->opts.share_refresh_ms;
}

void
allot__store_written_note(allot__store *st, const struct batch *b)
{
	written_update(st, b);
	written_sweep(st, b);
}

void
allot__store_usage_rows(const struct usage_ent *e, allot__row_usage *ret_row,
    allot__row_shadow *ret_x)
{
	uint64_t sec = e->sec > 0 ? (uint64_t) e->sec : 0;
	*ret_row = (allot__row_usage) {
		.service = e->k->service,
		.key = e->k->quota,
		.second = sec,
		.consumed = e->admitted,
		.denied = e->denied,
		.demand = e->demand,
		.live_replicas = e->live_replicas,
	};
	*ret_x = (allot__row_shadow) {
		.second = sec,
		.shadow_denied = e->shadow_denied,
		.candidate_denied = e->candidate_denied,
		.candidate_rate = e->candidate_rate,
		.service = e->k->service,
		.quota = e->k->quota,
	};
}

/* ---- one row of each kind: the local commit and the log's apply
 * (store_raft.c) write through these, so a member's rows are the ones
 * a single allotd writes ---- */

int
allot__store_put_join(allot__store *st, const allot__row_join *j)
{
	sqlite3_stmt *s = st->stmt[S_JOIN];
	sqlite3_bind_int64(s, 1, (sqlite3_int64) j->session);
	bind_text(s, 2, j->replica_id);
	bind_text(s, 3, j->service);
	bind_text(s, 4, j->host);
	sqlite3_bind_int64(s, 5, j->pid);
	bind_text(s, 6, j->version);
	allot__store_bind_hex(s, 7, j->digest);
	sqlite3_bind_int64(s, 8, j->at);
	return step_done(st, S_JOIN);
}

int
allot__store_put_left(allot__store *st, const allot__row_left *l)
{
	sqlite3_stmt *s = st->stmt[S_LEFT];
	sqlite3_bind_int64(s, 1, (sqlite3_int64) l->session);
	sqlite3_bind_int64(s, 2, l->at);
	bind_text(s, 3, l->why);
	int rc = step_done(st, S_LEFT);
	if (rc != SQLITE_OK)
		return rc;
	s = st->stmt[S_LEFT_SHARES];
	sqlite3_bind_int64(s, 1, (sqlite3_int64) l->session);
	return step_done(st, S_LEFT_SHARES);
}

int
allot__store_put_event(allot__store *st, const allot__row_event *e)
{
	sqlite3_stmt *s = st->stmt[S_EVENT];
	sqlite3_bind_int64(s, 1, e->at);
	bind_text(s, 2, e->kind);
	bind_text(s, 3, e->subject);
	bind_text(s, 4, e->detail);
	return step_done(st, S_EVENT);
}

int
allot__store_put_seen(allot__store *st, const allot__row_seen *x)
{
	sqlite3_stmt *s = st->stmt[S_SEEN];
	sqlite3_bind_int64(s, 1, (sqlite3_int64) x->session);
	sqlite3_bind_int64(s, 2, x->at);
	return step_done(st, S_SEEN);
}

int
allot__store_put_share(allot__store *st, const allot__row_share *x)
{
	sqlite3_stmt *s = st->stmt[S_SHARE];
	sqlite3_bind_int64(s, 1, (sqlite3_int64) x->session);
	bind_text(s, 2, x->service);
	bind_text(s, 3, x->quota);
	sqlite3_bind_double(s, 4, x->rate);
	sqlite3_bind_double(s, 5, x->burst);
	sqlite3_bind_int64(s, 6, x->lease_until);
	sqlite3_bind_int64(s, 7, x->at);
	return step_done(st, S_SHARE);
}

int
allot__store_put_level(allot__store *st, const allot__row_level *x)
{
	sqlite3_stmt *s = st->stmt[S_LEVEL];
	bind_text(s, 1, x->service);
	bind_text(s, 2, x->quota);
	sqlite3_bind_double(s, 3, x->level);
	sqlite3_bind_int64(s, 4, x->at);
	return step_done(st, S_LEVEL);
}

int
allot__store_put_usage(
    allot__store *st, const allot__row_usage *r, const allot__row_shadow *x)
{
	sqlite3_stmt *s = st->stmt[S_USAGE];
	bind_text(s, 1, r != NULL ? r->service : x->service);
	bind_text(s, 2, r != NULL ? r->key : x->quota);
	sqlite3_bind_int64(
	    s, 3, (sqlite3_int64) (r != NULL ? r->second : x->second) * 1000);
	sqlite3_bind_int64(s, 4, r != NULL ? (sqlite3_int64) r->consumed : 0);
	sqlite3_bind_int64(s, 5, r != NULL ? (sqlite3_int64) r->denied : 0);
	sqlite3_bind_double(s, 6, r != NULL ? r->demand : 0);
	sqlite3_bind_int64(s, 7, r != NULL ? r->live_replicas : 0);
	sqlite3_bind_int64(
	    s, 8, x != NULL ? (sqlite3_int64) x->shadow_denied : 0);
	sqlite3_bind_int64(
	    s, 9, x != NULL ? (sqlite3_int64) x->candidate_denied : 0);
	if (x != NULL && x->candidate_rate > 0)
		sqlite3_bind_double(s, 10, x->candidate_rate);
	else
		sqlite3_bind_null(s, 10);
	return step_done(st, S_USAGE);
}

static int
write_op(allot__store *st, const struct op *o)
{
	sqlite3_stmt *s;
	switch (o->kind) {
	case OP_JOIN: {
		allot__row_join j = allot__store_join_row(o);
		return allot__store_put_join(st, &j);
	}
	case OP_LEFT: {
		allot__row_left l = allot__store_left_row(o);
		return allot__store_put_left(st, &l);
	}
	case OP_CONFIG:
		s = st->stmt[S_CONFIG];
		sqlite3_bind_int64(s, 1, (sqlite3_int64) o->u);
		allot__store_bind_hex(s, 2, o->u2);
		bind_text(s, 3, o->s[0]);
		bind_text(s, 4, o->s[1]);
		sqlite3_bind_int64(s, 5, o->at);
		return step_done(st, S_CONFIG);
	case OP_EVENT: {
		allot__row_event e = allot__store_event_row(o);
		return allot__store_put_event(st, &e);
	}
	case OP_CHANGE:
		s = st->stmt[S_CHANGE];
		sqlite3_bind_int64(s, 1, o->at);
		sqlite3_bind_int64(s, 2, (sqlite3_int64) o->u);
		allot__store_bind_hex(s, 3, o->u2);
		for (int i = 0; i < 4; i++)
			bind_text(s, 4 + i, o->s[i]);
		return step_done(st, S_CHANGE);
	case OP_QUOTA:
		s = st->stmt[S_QUOTA_CHANGE];
		bind_text(s, 1, o->s[0]);
		bind_text(s, 2, o->s[1]);
		bind_text(s, 3,
		    allot__change_kind_name((allot__change_kind) o->pid));
		for (int i = 2; i < 6; i++)
			bind_text(s, 2 + i, o->s[i]);
		return step_done(st, S_QUOTA_CHANGE);
	}
	return SQLITE_MISUSE;
}

/* Writes `b` in one transaction; on any failure the transaction is
 * rolled back and the SQLite result code returned (b is untouched). */
static int
write_batch(allot__store *st, struct batch *b, size_t *ret_skipped)
{
	int rc = step_done(st, S_BEGIN);
	if (rc != SQLITE_OK) {
		snprintf(st->errmsg, sizeof st->errmsg, "%s",
		    sqlite3_errmsg(st->db));
		return rc;
	}
	/* Shares before ops: a leave in this batch then deletes the shares
	 * of its session, whatever order the daemon recorded them in. */
	size_t skipped = 0;
	for (uint32_t i = 0; i < b->shares.n && rc == SQLITE_OK; i++) {
		struct share_ent *e = (struct share_ent *) allot__tab_at(
		    &b->shares, i);
		e->write = allot__store_share_due(st, e);
		if (!e->write) {
			skipped++;
			continue;
		}
		allot__row_share x = allot__store_share_row(e);
		rc = allot__store_put_share(st, &x);
	}
	for (const struct op *o = b->ops; o != NULL && rc == SQLITE_OK;
	     o = o->next)
		rc = write_op(st, o);
	for (uint32_t i = 0; i < b->seen.n && rc == SQLITE_OK; i++) {
		const struct seen_ent *e = (const struct seen_ent *)
		    allot__tab_at(&b->seen, i);
		allot__row_seen x = allot__store_seen_row(e);
		rc = allot__store_put_seen(st, &x);
	}
	for (uint32_t i = 0; i < b->usage.n && rc == SQLITE_OK; i++) {
		const struct usage_ent *e = (const struct usage_ent *)
		    allot__tab_at(&b->usage, i);
		if (!e->hdr.live)
			continue;
		allot__row_usage r;
		allot__row_shadow x;
		allot__store_usage_rows(e, &r, &x);
		rc = allot__store_put_usage(st, &r, &x);
	}
	for (uint32_t i = 0; i < b->levels.n && rc == SQLITE_OK; i++) {
		const struct level_ent *e = (const struct level_ent *)
		    allot__tab_at(&b->levels, i);
		allot__row_level x = allot__store_level_row(e);
		rc = allot__store_put_level(st, &x);
	}
	/* After the joins (ops): a link names its session's row. */
	if (rc == SQLITE_OK)
		rc = allot__store_write_counts(st, b);
	if (rc == SQLITE_OK)
		rc = step_done(st, S_COMMIT);
	allot__store_counts_written(st, rc == SQLITE_OK);
	if (rc != SQLITE_OK) {
		/* Kept before the rollback, which resets the message. */
		snprintf(st->errmsg, sizeof st->errmsg, "%s",
		    sqlite3_errmsg(st->db));
		if (!sqlite3_get_autocommit(st->db))
			(void) step_done(st, S_ROLLBACK);
	}
	*ret_skipped = skipped;
	return rc;
}

/* One bounded chunk of deletions per table, at most once a minute unless
 * the previous chunk was full (then again at the next flush). */
static void
retention(allot__store *st)
{
	if (st->opts.retention_s == 0)
		return;
	int64_t now = allot__store_now_ms(st);
	if (now < st->next_retention_ms)
		return;
	int64_t cutoff = now - (int64_t) st->opts.retention_s * 1000;
	static const int ids[] = { S_RET_USAGE, S_RET_EVENTS, S_RET_HISTORY };
	uint64_t deleted = 0;
	bool more = false;
	int rc = step_done(st, S_BEGIN);
	for (size_t i = 0; i < 3 && rc == SQLITE_OK; i++) {
		sqlite3_stmt *s = st->stmt[ids[i]];
		sqlite3_bind_int64(s, 1, cutoff);
		sqlite3_bind_int64(s, 2, st->opts.retention_chunk);
		rc = step_done(st, ids[i]);
		if (rc == SQLITE_OK) {
			int n = sqlite3_changes(st->db);
			deleted += (uint64_t) n;
			if ((uint32_t) n >= st->opts.retention_chunk)
				more = true;
		}
	}
	if (rc == SQLITE_OK)
		rc = step_done(st, S_COMMIT);
	if (rc != SQLITE_OK) {
		if (!sqlite3_get_autocommit(st->db))
			(void) step_done(st, S_ROLLBACK);
		pthread_mutex_lock(&st->mu);
		st->retention_failures++;
		pthread_mutex_unlock(&st->mu);
		allot__log_ratelimited(&st->lg, &st->rl_retention,
		    ALLOT_LOG_WARNING, "ALLOT-STORE-RETENTION-FAIL",
		    "store %s: deleting rows older than %" PRIu32 " s failed: "
		    "%s; retrying in a minute",
		    st->path, st->opts.retention_s, sqlite3_errstr(rc));
		st->next_retention_ms = now + RETENTION_EVERY_MS;
		return;
	}
	pthread_mutex_lock(&st->mu);
	st->retention_deleted += deleted;
	pthread_mutex_unlock(&st->mu);
	st->next_retention_ms = more ? now : now + RETENTION_EVERY_MS;
	if (deleted > 0)
		allot__log(&st->lg, ALLOT_LOG_DEBUG, "ALLOT-STORE-RETENTION",
		    "store %s: deleted %" PRIu64 " rows older than %" PRIu32
		    " s",
		    st->path, deleted, st->opts.retention_s);
}

int
allot__store_flush(allot__store *st)
{
	if (st == NULL)
		return ALLOT_EINVAL;

	pthread_mutex_lock(&st->mu);
	struct batch *b = st->cur;
	st->cur = st->spare;
	pthread_mutex_unlock(&st->mu);
	allot__store_tap(st, b);

	/* Normally nothing is left from a failure and the batches swap. */
	uint64_t lost = 0;
	if (allot__batch_rows(st->retry) == 0) {
		allot__batch_clear(st->retry);
		st->spare = st->retry;
		st->retry = b;
	} else {
		lost = allot__batch_merge(st->retry, b);
		st->spare = b;
	}
	uint64_t dropped = allot__batch_trim(st->retry, st->opts.max_pending);
	if (st->retry->counts_trimmed) {
		pthread_mutex_lock(&st->mu);
		allot__store_counts_trimmed(st, st->retry);
		pthread_mutex_unlock(&st->mu);
	}
	size_t rows = allot__batch_rows(st->retry);

	int rc = SQLITE_OK;
	double ms = 0;
	size_t skipped = 0;
	if (rows > 0) {
		uint64_t t0 = allot__mono_ns();
		rc = write_batch(st, st->retry, &skipped);
		ms = (double) (allot__mono_ns() - t0) / 1e6;
	}
	if (rc == SQLITE_OK)
		allot__store_written_note(st, st->retry);

	pthread_mutex_lock(&st->mu);
	st->rows_dropped += dropped;
	st->rows_rejected += lost;
	if (rows > 0 && rc == SQLITE_OK) {
		st->commits++;
		st->rows_written += rows - skipped;
		st->shares_unchanged += skipped;
		st->last_commit_ms = ms;
		st->retry_rows = 0;
	} else if (rc != SQLITE_OK) {
		st->commit_failures++;
		st->last_error = rc;
		st->retry_rows = rows;
	}
	uint64_t failures = st->commit_failures;
	uint64_t total_dropped = st->rows_dropped;
	uint64_t total_rejected = st->rows_rejected;
	pthread_mutex_unlock(&st->mu);

	if (total_dropped != st->dropped_logged ||
	    total_rejected != st->rejected_logged) {
		allot__log_ratelimited(&st->lg, &st->rl_drop,
		    ALLOT_LOG_WARNING, "ALLOT-STORE-DROP",
		    "store %s: %" PRIu64 " usage rows dropped (more than "
		    "max_pending = %zu rows queued), %" PRIu64
		    " records refused (out of memory or too many quotas)",
		    st->path, total_dropped - st->dropped_logged,
		    st->opts.max_pending,
		    total_rejected - st->rejected_logged);
		st->dropped_logged = total_dropped;
		st->rejected_logged = total_rejected;
	}

	if (rc != SQLITE_OK) {
		st->failing = true;
		allot__log_ratelimited(&st->lg, &st->rl_fail, ALLOT_LOG_ERR,
		    "ALLOT-STORE-FAIL",
		    "store %s: commit of %zu rows failed: %s (%s); rows kept "
		    "for the next flush (%" PRIu64 " failures so far)",
		    st->path, rows, sqlite3_errstr(rc), st->errmsg, failures);
		return ALLOT_EIO;
	}
	if (st->failing && rows > 0) {
		st->failing = false;
		allot__log(&st->lg, ALLOT_LOG_NOTICE, "ALLOT-STORE-OK",
		    "store %s: commits succeed again (%zu rows written)",
		    st->path, rows);
	}
	allot__batch_clear(st->retry);
	retention(st);
	return ALLOT_OK;
}
