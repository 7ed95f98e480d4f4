/* SPDX-License-Identifier: MIT */
/*
 * The store's handle, shared by its parts and by nothing else:
 * store.c (open, migrate, close, the prepared statements),
 * store_record.c (record calls from any thread into the current batch),
 * store_commit.c (group commit and retention on the loop thread) and
 * store_restore.c (reads at start-up). Which thread may touch which
 * field is said next to it.
 */
#ifndef ALLOT_COORDINATOR_STORE_INT_H
#define ALLOT_COORDINATOR_STORE_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <sqlite3.h>

#include "log.h"
#include "store.h"
#include "marks.h"
#include "store_batch.h"

/* The prepared statements, one per kind of row and query (store.c holds
 * their SQL). */
enum {
	S_BEGIN,
	S_COMMIT,
	S_ROLLBACK,
	S_JOIN,
	S_LEFT,
	S_LEFT_SHARES,
	S_CONFIG,
	S_EVENT,
	S_SEEN,
	S_SHARE,
	S_USAGE,
	S_LEVEL,
	S_RESTORE_REPLICAS,
	S_RESTORE_LEVELS,
	S_RET_USAGE,
	S_RET_EVENTS,
	S_RET_HISTORY,
	S_CHANGE,
	S_QUOTA_CHANGE,
	S_LAST_CONFIG,
	S_ACCOUNT,
	S_LINK,
	S_LOAD_ACCOUNTS,
	S_COUNT
};

struct allot__store {
	char *path;
	sqlite3 *db;
	sqlite3_stmt *stmt[S_COUNT];
	allot__logger lg;
	allot__store_opts opts;
	int64_t (*clock)(void *ctx);
	void *clock_ctx;

	pthread_mutex_t mu;
	/* Under mu: the batch records go to, the interned keys, counters. */
	struct batch *cur;
	allot__store_keys keys;
	uint64_t max_session;
	uint64_t rows_dropped;
	uint64_t rows_rejected;
	uint64_t commits;
	uint64_t commit_failures;
	uint64_t rows_written;
	uint64_t retention_deleted;
	uint64_t retention_failures;
	uint64_t shares_unchanged;
	size_t retry_rows;
	double last_commit_ms;
	int last_error;
	/* The accounting guarantee (store_account.c). */
	allot__marks committed; /* what the file holds */
	allot__marks booked; /* that, queued and proposed */
	uint64_t count_overlaps; /* folded records partly booked before */

	/* Loop thread only. */
	allot__store_usage_tap usage_tap; /* store_raft.c */
	void *usage_tap_ctx;
	struct batch *retry; /* what the last failed commit left */
	struct batch *spare; /* empty, swapped in at the next flush */
	struct batch b[3];
	allot__marks scratch; /* a commit's marks until it is done */
	bool scratch_ready;
	allot__tab written; /* struct written_ent (store_commit.c) */
	allot__tab left; /* struct seen_ent: sessions that left, scratch */
	int64_t next_forget_ms;
	int64_t next_retention_ms;
	char errmsg[256]; /* sqlite3_errmsg() of the last failure */
	bool failing;
	uint64_t dropped_logged;
	uint64_t rejected_logged;
	allot__logrl rl_fail;
	allot__logrl rl_drop;
	allot__logrl rl_retention;
};

/* The time of an audit row: the store's clock (allot__store_set_clock)
 * or the wall clock. Any thread. */
static inline int64_t
allot__store_now_ms(const allot__store *st)
{
	return st->clock != NULL ? st->clock(st->clock_ctx) : allot__wall_ms();
}

/* Step a prepared statement once and reset it: SQLITE_OK for a row or
 * done, else the error (store_commit.c; the apply of a log entry,
 * store_raft.c, steps the same statements). */
int allot__store_step(sqlite3_stmt *s);
/* Bind a 64-bit digest as the 16 hex digits the tables keep. */
void allot__store_bind_hex(sqlite3_stmt *s, int i, uint64_t v);

/* store_commit.c: one row of each kind, with the prepared statements,
 * inside the caller's transaction; SQLITE_OK or the error. The local
 * commit and the apply of a log entry (store_raft.c) both write through
 * these. A usage row adds to its second; `r` or `x` (its shadow
 * columns) may be NULL, for zeros. */
int allot__store_put_join(allot__store *st, const allot__row_join *j);
int allot__store_put_left(allot__store *st, const allot__row_left *l);
int allot__store_put_event(allot__store *st, const allot__row_event *e);
int allot__store_put_seen(allot__store *st, const allot__row_seen *x);
int allot__store_put_share(allot__store *st, const allot__row_share *x);
int allot__store_put_level(allot__store *st, const allot__row_level *x);
int allot__store_put_usage(
    allot__store *st, const allot__row_usage *r, const allot__row_shadow *x);
/* A batch's usage entry as the log's rows: its usage and its shadow
 * columns. */
void allot__store_usage_rows(const struct usage_ent *e,
    allot__row_usage *ret_row, allot__row_shadow *ret_x);

/* A batch's records as the rows the writers above take, and the log's
 * AUDIT and EVENTS entries carry (the local commit, store_commit.c, and
 * the tap, store_raft.c): op strings as store_batch.h lays them out. */
static inline allot__row_join
allot__store_join_row(const struct op *o)
{
	return (allot__row_join) {
		.session = o->session,
		.at = o->at,
		.digest = o->u,
		.pid = o->pid,
		.replica_id = o->s[0],
		.service = o->s[1],
		.host = o->s[2],
		.version = o->s[3],
	};
}

static inline allot__row_left
allot__store_left_row(const struct op *o)
{
	return (allot__row_left) {
		.session = o->session,
		.at = o->at,
		.why = o->s[0],
	};
}

static inline allot__row_event
allot__store_event_row(const struct op *o)
{
	return (allot__row_event) {
		.at = o->at,
		.kind = o->s[0],
		.subject = o->s[1],
		.detail = o->s[2],
	};
}

static inline allot__row_share
allot__store_share_row(const struct share_ent *e)
{
	return (allot__row_share) {
		.session = e->session,
		.rate = e->rate,
		.burst = e->burst,
		.lease_until = e->lease_until,
		.at = e->at,
		.service = e->k->service,
		.quota = e->k->quota,
	};
}

static inline allot__row_seen
allot__store_seen_row(const struct seen_ent *e)
{
	return (allot__row_seen) { .session = e->session, .at = e->at };
}

static inline allot__row_level
allot__store_level_row(const struct level_ent *e)
{
	return (allot__row_level) {
		.level = e->level,
		.at = e->at,
		.service = e->k->service,
		.quota = e->k->quota,
	};
}

/* Set up the tables of written shares (store_commit.c) for a new store
 * and release them at close. */
void allot__store_written_init(allot__store *st);
void allot__store_written_free(allot__store *st);

struct batch;
/* store_raft.c: the leader's audit rows out of `b` to the tap. */
void allot__store_tap(allot__store *st, struct batch *b);

/* store_commit.c: whether a commit would write share `e` (its value
 * changed since the one written, or it is due a refresh); and, once the
 * rows of `b` are on their way to the file by another road (the log),
 * remember its shares as written and forget those of its leaves. */
bool allot__store_share_due(const allot__store *st, const struct share_ent *e);
void allot__store_written_note(allot__store *st, const struct batch *b);

/* store_account.c: agents' Usage records. */
/* A trim of `b` dropped counts: the booked marks go back to the
 * committed ones (under the mutex). */
void allot__store_counts_trimmed(allot__store *st, struct batch *b);
/* Inside a commit's transaction: the counts of `b` not in the file yet
 * (the others are taken out of `b`), with their marks. SQLITE_OK or the
 * error. */
int allot__store_write_counts(allot__store *st, struct batch *b);
/* After that commit: `ok` when it was committed. */
void allot__store_counts_written(allot__store *st, bool ok);
/* Write rows as they are (an applied log entry's, filtered by the state
 * machine already), inside the caller's transaction. */
int allot__store_put_counts(
    allot__store *st, const allot__row_count *rows, size_t n);
/* After such an entry was written: its records are durable. */
void allot__store_counts_applied(
    allot__store *st, const allot__row_count *rows, size_t n);
/* At open: the marks from the accounts table. ALLOT_OK, ALLOT_ENOMEM or
 * ALLOT_EIO. */
int allot__store_load_marks(allot__store *st);

#endif
