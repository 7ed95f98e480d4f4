/* SPDX-License-Identifier: MIT */
/*
 * The coordinator's durable store: one SQLite file in WAL mode, schema and
 * numbered migrations from schema/ (PRAGMA user_version), audit views for
 * the operators' sqlite3 shell.
 *
 * Writes never touch the disk on the request path. The record functions
 * append to an in-memory batch under a short mutex (any thread); the
 * daemon's loop calls allot__store_flush() once per interval, which writes
 * the batch in one transaction (group commit). When the commit fails (disk
 * full, database locked by an auditor) the batch stays queued, the failure
 * is counted and logged, and the next flush retries: nothing that was
 * recorded is lost while the queue stays under its bound (max_pending
 * rows; beyond it the oldest usage rows are dropped and counted, never
 * replica/event rows). Committed rows are never rewritten except by
 * retention, which deletes usage, event and share-history rows older than
 * the setting.
 */
#ifndef ALLOT_COORDINATOR_STORE_H
#define ALLOT_COORDINATOR_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "clock.h"
#include "config_diff.h"
#include "rows.h"
#include "log.h"

typedef struct allot__store allot__store;

typedef struct allot__store_opts {
	uint32_t retention_s; /* usage, events and share_history rows
	                         older than this are deleted (default 7
	                         days; 0 keeps everything) */
	size_t max_pending; /* queued rows bound (default 1,000,000) */
	uint32_t busy_timeout_ms; /* sqlite3_busy_timeout on flush
	                             (default 50) */
	uint32_t retention_chunk; /* rows deleted per table per flush by
	                             retention (default 10,000) */
	uint32_t share_refresh_ms; /* a share recorded again unchanged is
	                              rewritten (lease_until, updated_at) at
	                              most this often (default 10,000) */
} allot__store_opts;

/* Fill `ret` with the defaults (what a NULL `opts` means). In a struct
 * given to allot__store_open, a zero max_pending, busy_timeout_ms,
 * retention_chunk or share_refresh_ms also means the default; a zero
 * retention_s keeps everything. */
void allot__store_opts_default(allot__store_opts *ret);

typedef struct allot__store_stats {
	uint64_t commits;
	uint64_t commit_failures;
	uint64_t rows_written;
	uint64_t rows_dropped; /* usage rows dropped past max_pending */
	uint64_t pending; /* rows waiting for the next flush */
	double last_commit_ms; /* duration of the last successful commit */
	int last_error; /* SQLite result code of the last failure */
	uint64_t rows_rejected; /* records refused: out of memory, or more
	                           than 2^20 distinct (service, quota) */
	uint64_t retention_deleted; /* rows deleted by retention */
	uint64_t retention_failures; /* retention transactions that failed */
	uint64_t shares_unchanged; /* shares recorded again unchanged and
	                              not rewritten (not in rows_written) */
} allot__store_stats;

/* Open (creating if needed) and migrate. A corrupt, truncated or foreign
 * file is an error naming the file and what to do, never a silent reset.
 * `errbuf` receives the message. `opts` may be NULL (defaults); `lg` may
 * be NULL (silent) and is copied. Runs PRAGMA quick_check, which reads
 * the whole file. Returns ALLOT_OK, ALLOT_EINVAL, ALLOT_ENOMEM or
 * ALLOT_EIO (cannot open, corrupt, foreign, newer schema, migration
 * failed). */
int allot__store_open(const char *path, const allot__store_opts *opts,
    const allot__logger *lg, char *errbuf, size_t errlen, allot__store **ret);

/* Flush what is queued (best effort: rows that cannot be written are
 * logged as ALLOT-STORE-LOST) and close; accepts NULL. Loop thread, with
 * no record call running or to come. */
void allot__store_close(allot__store *st);

/* Group commit of everything queued. Returns ALLOT_OK, or ALLOT_EIO with
 * the batch kept for the next call. Loop thread only. May block up to
 * busy_timeout_ms when another connection holds the write lock. After a
 * successful commit it also runs retention when due. */
int allot__store_flush(allot__store *st);

/* Any thread. */
void allot__store_stats_get(allot__store *st, allot__store_stats *ret);

/* Replace the wall clock used for every audit time (tests and the
 * simulator). Call before any record function; `now` must be
 * thread-safe. NULL restores allot__wall_ms(). */
void allot__store_set_clock(
    allot__store *st, int64_t (*now)(void *ctx), void *ctx);

/* The SQLite connection, for tests and diagnostics on the loop thread
 * only; the store owns it (do not close it). */
struct sqlite3 *allot__store_db(allot__store *st);

/* ---- records (any thread; never blocks on I/O) ---- */

void allot__store_replica_joined(allot__store *st, uint64_t session,
    const char *replica_id, const char *service, const char *host,
    uint32_t pid, const char *agent_version, uint64_t config_digest);
/* why: "leave", "expired", "replaced", "shutdown" (anything else, or
 * NULL, is recorded as "leave"). */
void allot__store_replica_left(
    allot__store *st, uint64_t session, const char *why);
void allot__store_replica_seen(allot__store *st, uint64_t session);

void allot__store_config_loaded(allot__store *st, uint64_t epoch,
    uint64_t digest, const char *path, const char *content);

/* Who installed a config change, and why (config_changes). */
typedef struct allot__store_change {
	uint64_t epoch; /* the epoch installed */
	uint64_t digest; /* of the new config */
	const char *who; /* kernel-verified user, "signal" or "start" */
	const char *claimed_as; /* NULL: nothing claimed */
	const char *reason;
	const char *source; /* the client's file name; NULL: none */
} allot__store_change;

/* A config change and one row per quota of `d` that changed. All of it
 * goes into the same batch, so one commit writes all of it or none: a
 * crash loses a change whole, never half of it. */
void allot__store_config_change(allot__store *st, const allot__store_change *c,
    const allot__config_diff *d);

/* The allowance handed to one replica for one quota. */
void allot__store_share(allot__store *st, uint64_t session,
    const char *service, const char *quota, double rate, double burst,
    int64_t lease_until_ms);

/* Consumption reported for one quota (aggregated per second in memory
 * before it is written: one row per service, quota and second).
 * admitted, denied and demand are summed over the reports of a second
 * (so pass demand in tokens for this report, not a rate), live_replicas
 * keeps the largest value. */
void allot__store_usage(allot__store *st, const char *service,
    const char *quota, uint64_t admitted, uint64_t denied, double demand,
    uint32_t live_replicas);

/* The same with the shadow figures (schema/004_shadow.sql):
 * shadow_denied are tokens admitted in shadow that enforcing would have
 * denied (part of admitted, never of denied), candidate_denied what the
 * quota's candidate value would have denied, candidate_rate that
 * candidate (0: none; a row keeps the newest). */
typedef struct allot__store_usage_row {
	uint64_t admitted;
	uint64_t denied;
	uint64_t shadow_denied;
	uint64_t candidate_denied;
	double candidate_rate;
	double demand;
	uint32_t live_replicas;
} allot__store_usage_row;
void allot__store_usage_add(allot__store *st, const char *service,
    const char *quota, const allot__store_usage_row *row);

/* ---- Usage records (docs/operations.md, "The accounting guarantee") ----
 *
 * An agent's account sends numbered Usage records until they are
 * durable; each is booked once per (account, id), at its own second. */

/* One record's counts (`n` rows of one account and id, consecutive; a
 * row with quota NULL only marks the record), queued unless the store
 * has it already (queued, written, or proposed through the log). True
 * when queued; false for a repeat, or when it could not be queued (its
 * agent sends it again). Any thread. */
bool allot__store_usage_record(
    allot__store *st, const allot__row_count *rows, size_t n);

/* Session `session`'s agent keeps account `incarnation` (replicas);
 * nothing for 0. Any thread. */
void allot__store_usage_link(
    allot__store *st, uint64_t session, uint64_t incarnation);

/* The highest Usage id of account `incarnation` that is durable in this
 * store: committed by a single allotd, or applied from the log by a
 * cluster member; 0 when none. Any thread. */
uint64_t allot__store_durable(allot__store *st, uint64_t incarnation);

/* What was booked but is not durable is forgotten, so that its agents'
 * next Syncs book it again: a cluster leader that starts or stops
 * serving (what it proposed may never commit). Any thread. */
void allot__store_marks_rebase(allot__store *st);

/* kind: "join", "leave", "expiry", "config", "fallback_enter",
 * "fallback_leave", "reject", "start", "stop", ... */
void allot__store_event(allot__store *st, const char *kind,
    const char *subject, const char *detail);

/* ---- restore at start-up ---- */

typedef struct allot__store_replica {
	uint64_t session;
	const char *replica_id;
	const char *service;
	int64_t last_seen_ms;
} allot__store_replica;

typedef struct allot__store_level {
	const char *service;
	const char *quota;
	double level; /* global bucket level (tokens) */
	int64_t at_ms;
} allot__store_level;

/* Replicas that were live at the last shutdown or crash, and the last
 * recorded global bucket level per quota. Callbacks run synchronously
 * (either may be NULL); the strings they see are valid only during the
 * call. Reads only what is committed: call at start-up, before
 * recording. Loop thread. Returns ALLOT_OK or ALLOT_EIO. */
int allot__store_restore(allot__store *st,
    void (*on_replica)(void *ctx, const allot__store_replica *r),
    void (*on_level)(void *ctx, const allot__store_level *l), void *ctx);

/* Record the global bucket level of a quota (kept one row per quota).
 * The function is allot__store_level_set(); allot__store_level(...) is a
 * function-like macro for it, so that the same name can also be the
 * restore row type above (a macro only expands before a parenthesis). */
void allot__store_level_set(
    allot__store *st, const char *service, const char *quota, double level);
#define allot__store_level(st, service, quota, level) \
	allot__store_level_set((st), (service), (quota), (level))

/* The config recorded last (configs): its epoch, digest and content (the
 * caller frees it). ALLOT_OK, ALLOT_ENOENT when none was ever recorded,
 * ALLOT_ENOMEM or ALLOT_EIO. Start-up, loop thread: a restart keeps the
 * epoch of an unchanged file and moves past it for a changed one. */
int allot__store_last_config(allot__store *st, uint64_t *ret_epoch,
    uint64_t *ret_digest, char **ret_content);

/* Largest session id ever issued (so a restart never reuses one). */
uint64_t allot__store_max_session(allot__store *st);

/* ---- the Raft cluster (cluster.h) ---- */

/* The leader's rows are the store's row types (rows.h), which the log
 * carries: a usage row (allot__row_usage, `key` is the quota's wire key,
 * `consumed` what was admitted), an event (allot__row_event), and the
 * replica, share and level rows of one flush (allot__row_audit). */

/* What one flush hands the tap. Strings point into the store's batch:
 * valid during the call only. */
typedef struct allot__store_tap_rows {
	const allot__row_usage *rows;
	size_t n;
	const allot__row_count *counts; /* Usage records, links */
	size_t ncounts;
	const allot__row_event *ev;
	size_t nev;
	allot__row_audit audit;
} allot__store_tap_rows;

/* Where the leader's audit rows go instead of the file: at each flush
 * the batch's usage rows, events, replica joins, leaves and last-seen
 * times, the shares the commit would write (changed, or due a refresh)
 * and the levels are handed to `fn` (loop thread) and not written; the
 * cluster proposes them through the log and every member writes them
 * back with allot__store_apply and allot__store_apply_audit. Config
 * loads and their changes stay local (the CONFIG entry carries them).
 * NULL: written as usual. */
typedef void (*allot__store_usage_tap)(
    void *ctx, const allot__store_tap_rows *rows);
void allot__store_set_usage_tap(
    allot__store *st, allot__store_usage_tap fn, void *ctx);

/* Writes a committed log entry at `index`: its usage rows and events,
 * in one transaction with the applied index (raft_applied), so that an
 * index at or below the last applied is skipped (replay is idempotent).
 * Loop thread; synchronous. ALLOT_OK (written or skipped) or ALLOT_EIO. */
int allot__store_apply(allot__store *st, uint64_t index,
    const allot__row_usage *rows, size_t n, const allot__row_event *ev,
    size_t nev);

/* The same for one flush's audit rows, in their order (rows.h);
 * session ids it names raise the store's largest (allot__store_max_session),
 * so a member that becomes leader never issues one again. */
int allot__store_apply_audit(
    allot__store *st, uint64_t index, const allot__row_audit *a);

/* The same for a committed ACCOUNT entry's Usage counts (rows.h), as
 * the state machine kept them (consensus_fsm.h): usage rows, account
 * marks and links; its records are durable once it returns ALLOT_OK. */
int allot__store_apply_counts(
    allot__store *st, uint64_t index, const allot__row_count *rows, size_t n);

/* The last log index applied (0: none). */
uint64_t allot__store_applied(allot__store *st);

#endif
