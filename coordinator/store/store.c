/* SPDX-License-Identifier: MIT */
/*
 * The coordinator's SQLite store (see store.h for the contract): opening,
 * checking and migrating the file, the statements every other part
 * runs, and closing. The parts: store_batch.c (the in-memory batch),
 * store_record.c (record calls from any thread), store_commit.c (group
 * commit and retention), store_restore.c (reads at start-up); they share
 * the handle through store_int.h.
 *
 * Opening never resets a file it does not recognise: an empty, truncated,
 * corrupt or foreign file, or one of a newer schema, is an error that
 * names the file and what to do.
 */
#include "store_int.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The generated header's opening comment names the schema files with a
 * glob (a slash then a star), and its migrations are string literals
 * longer than the 4095 bytes ISO C guarantees (GCC and Clang take any
 * length). */
#include "schema_sql.h"

/* PRAGMA application_id of an allot database ("ALOT"): tells our files
 * from other SQLite databases a path might point at by mistake. */
#define APP_ID 0x414c4f54

#define DEFAULT_RETENTION_S (7u * 24u * 3600u)
#define DEFAULT_MAX_PENDING ((size_t) 1000000)
#define DEFAULT_BUSY_MS 50u
#define DEFAULT_RETENTION_CHUNK 10000u
#define DEFAULT_SHARE_REFRESH_MS 10000u
/* Opening waits longer for a lock than a flush does: an auditor's brief
 * write lock should not make allotd fail to start. */
#define OPEN_BUSY_MS 5000

static const char *const stmt_sql[S_COUNT] = {
	[S_BEGIN] = "BEGIN IMMEDIATE",
	[S_COMMIT] = "COMMIT",
	[S_ROLLBACK] = "ROLLBACK",
	[S_JOIN] =
	    "INSERT INTO replicas (session, replica_id, service, host,"
	    " pid, agent_version, config_digest, joined_at, last_seen)"
	    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8)"
	    " ON CONFLICT (session) DO UPDATE SET"
	    " replica_id = excluded.replica_id, service = excluded.service,"
	    " host = excluded.host, pid = excluded.pid,"
	    " agent_version = excluded.agent_version,"
	    " config_digest = excluded.config_digest,"
	    " last_seen = excluded.last_seen, left_at = NULL, left_why = NULL",
	[S_LEFT] = "UPDATE replicas SET left_at = ?2, left_why = ?3"
	           " WHERE session = ?1 AND left_at IS NULL",
	[S_LEFT_SHARES] = "DELETE FROM shares WHERE session = ?1",
	[S_CONFIG] = "INSERT INTO configs (epoch, digest, path, content,"
	             " loaded_at) VALUES (?1, ?2, ?3, ?4, ?5)",
	[S_EVENT] = "INSERT INTO events (at, kind, subject, detail)"
	            " VALUES (?1, ?2, ?3, ?4)",
	[S_SEEN] = "UPDATE replicas SET last_seen = max(last_seen, ?2)"
	           " WHERE session = ?1",
	[S_SHARE] =
	    "INSERT INTO shares (session, service, quota, rate, burst,"
	    " lease_until, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
	    " ON CONFLICT (session, service, quota) DO UPDATE SET"
	    " rate = excluded.rate, burst = excluded.burst,"
	    " lease_until = excluded.lease_until,"
	    " updated_at = excluded.updated_at",
	[S_USAGE] =
	    "INSERT INTO usage (service, quota, at, admitted, denied,"
	    " demand, live_replicas, shadow_denied, candidate_denied,"
	    " candidate_rate)"
	    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
	    " ON CONFLICT (at, service, quota) DO UPDATE SET"
	    " admitted = admitted + excluded.admitted,"
	    " denied = denied + excluded.denied,"
	    " demand = demand + excluded.demand,"
	    " live_replicas = max(live_replicas, excluded.live_replicas),"
	    " shadow_denied = shadow_denied + excluded.shadow_denied,"
	    " candidate_denied = candidate_denied"
	    " + excluded.candidate_denied,"
	    " candidate_rate = coalesce(excluded.candidate_rate,"
	    " candidate_rate)",
	[S_LEVEL] =
	    "INSERT INTO levels (service, quota, level, at)"
	    " VALUES (?1, ?2, ?3, ?4) ON CONFLICT (service, quota) DO UPDATE"
	    " SET level = excluded.level, at = excluded.at"
	    " WHERE excluded.at >= levels.at",
	[S_RESTORE_REPLICAS] =
	    "SELECT session, replica_id, service, last_seen"
	    " FROM replicas WHERE left_at IS NULL ORDER BY session",
	[S_RESTORE_LEVELS] = "SELECT service, quota, level, at FROM levels"
	                     " ORDER BY service, quota",
	[S_RET_USAGE] = "DELETE FROM usage WHERE (at, service, quota) IN"
	                " (SELECT at, service, quota FROM usage WHERE at < ?1"
	                " ORDER BY at LIMIT ?2)",
	[S_RET_EVENTS] = "DELETE FROM events WHERE id IN (SELECT id"
	                 " FROM events WHERE at < ?1 ORDER BY at LIMIT ?2)",
	[S_RET_HISTORY] =
	    "DELETE FROM share_history WHERE id IN (SELECT id"
	    " FROM share_history WHERE at < ?1 ORDER BY at LIMIT ?2)",
	[S_CHANGE] = "INSERT INTO config_changes (at, epoch, digest, who,"
	             " claimed_as, reason, source)"
	             " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
	/* Written right after its config_changes row, in the same
	 * transaction, by the store's one writer: the newest row is its. */
	[S_QUOTA_CHANGE] =
	    "INSERT INTO quota_changes (change, service, quota, action,"
	    " before, after, fields, owner) VALUES ((SELECT max(id) FROM"
	    " config_changes), ?1, ?2, ?3, ?4, ?5, ?6, ?7)",
	[S_LAST_CONFIG] = "SELECT epoch, digest, content FROM configs"
	                  " ORDER BY id DESC LIMIT 1",
	[S_ACCOUNT] =
	    "INSERT INTO accounts (incarnation, last_id, last_second)"
	    " VALUES (?1, ?2, ?3) ON CONFLICT (incarnation) DO UPDATE"
	    " SET last_id = excluded.last_id,"
	    " last_second = excluded.last_second"
	    " WHERE excluded.last_id > accounts.last_id",
	[S_LINK] = "UPDATE replicas SET incarnation = ?2 WHERE session = ?1",
	[S_LOAD_ACCOUNTS] = "SELECT incarnation, last_id, last_second"
	                    " FROM accounts",
};

struct sqlite3 *
allot__store_db(allot__store *st)
{
	return st != NULL ? st->db : NULL;
}

/* ---- open and close ---- */

void
allot__store_opts_default(allot__store_opts *ret)
{
	memset(ret, 0, sizeof *ret);
	ret->retention_s = DEFAULT_RETENTION_S;
	ret->max_pending = DEFAULT_MAX_PENDING;
	ret->busy_timeout_ms = DEFAULT_BUSY_MS;
	ret->retention_chunk = DEFAULT_RETENTION_CHUNK;
	ret->share_refresh_ms = DEFAULT_SHARE_REFRESH_MS;
}

static void seterr(char *errbuf, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void
seterr(char *errbuf, size_t errlen, const char *fmt, ...)
{
	if (errbuf == NULL || errlen == 0)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(errbuf, errlen, fmt, ap);
	va_end(ap);
}

/* A single-value query (a PRAGMA or an aggregate) as an integer. */
static int
query_int(sqlite3 *db, const char *sql, int64_t *ret)
{
	sqlite3_stmt *s;
	int rc = sqlite3_prepare_v2(db, sql, -1, &s, NULL);
	if (rc != SQLITE_OK)
		return rc;
	rc = sqlite3_step(s);
	if (rc == SQLITE_ROW) {
		*ret = sqlite3_column_int64(s, 0);
		rc = SQLITE_OK;
	}
	sqlite3_finalize(s);
	return rc;
}

static bool
is_corruption(int rc)
{
	return (rc & 0xff) == SQLITE_NOTADB || (rc & 0xff) == SQLITE_CORRUPT;
}

#define NOT_VALID_FMT                                                      \
	"%s is not a valid allot database (%s); move it aside or restore " \
	"from backup; allotd will not overwrite it"

/* PRAGMA quick_check: the whole file is read once, so truncation and
 * damaged pages are found before anything is written. */
static int
check_file(allot__store *st, char *errbuf, size_t errlen)
{
	sqlite3_stmt *s = NULL;
	int rc = sqlite3_prepare_v2(
	    st->db, "PRAGMA quick_check", -1, &s, NULL);
	char first[256] = "";
	bool ok = true;
	if (rc == SQLITE_OK) {
		while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
			const char *t = (const char *) sqlite3_column_text(
			    s, 0);
			if (t != NULL && strcmp(t, "ok") != 0 && ok) {
				ok = false;
				/* A finding may span lines ("*** in database
				 * main ***\nPage 2: ..."): keep the log line
				 * one line. */
				size_t n = 0;
				for (; *t != '\0' && n + 3 < sizeof first;
				     t++) {
					bool nl = *t == '\n' || *t == '\r';
					first[n++] = nl ? ';' : *t;
					if (nl)
						first[n++] = ' ';
				}
				first[n] = '\0';
			}
		}
		if (rc == SQLITE_DONE)
			rc = SQLITE_OK;
	}
	sqlite3_finalize(s);
	if (rc == SQLITE_OK && ok)
		return 0;
	if (rc == SQLITE_OK)
		seterr(errbuf, errlen, NOT_VALID_FMT, st->path, first);
	else if (is_corruption(rc))
		seterr(errbuf, errlen, NOT_VALID_FMT, st->path,
		    sqlite3_errstr(rc));
	else
		seterr(errbuf, errlen, "cannot read store %s: %s", st->path,
		    sqlite3_errmsg(st->db));
	return -1;
}

static int
migrate(allot__store *st, int64_t from, char *errbuf, size_t errlen)
{
	size_t n = sizeof allot__migrations / sizeof allot__migrations[0];
	for (size_t i = 0; i < n; i++) {
		int v = allot__migrations[i].version;
		if (v <= from)
			continue;
		char pragma[96];
		snprintf(pragma, sizeof pragma,
		    "PRAGMA user_version = %d; PRAGMA application_id = %d;", v,
		    APP_ID);
		char *msg = NULL;
		int rc = sqlite3_exec(
		    st->db, "BEGIN IMMEDIATE", NULL, NULL, &msg);
		if (rc == SQLITE_OK)
			rc = sqlite3_exec(st->db, allot__migrations[i].sql,
			    NULL, NULL, &msg);
		if (rc == SQLITE_OK)
			rc = sqlite3_exec(st->db, pragma, NULL, NULL, &msg);
		if (rc == SQLITE_OK)
			rc = sqlite3_exec(st->db, "COMMIT", NULL, NULL, &msg);
		if (rc != SQLITE_OK) {
			seterr(errbuf, errlen,
			    "cannot apply schema migration %s to %s: %s",
			    allot__migrations[i].name, st->path,
			    msg != NULL ? msg : sqlite3_errstr(rc));
			sqlite3_free(msg);
			if (!sqlite3_get_autocommit(st->db))
				sqlite3_exec(
				    st->db, "ROLLBACK", NULL, NULL, NULL);
			return -1;
		}
		allot__log(&st->lg, ALLOT_LOG_INFO, "ALLOT-STORE-MIGRATE",
		    "store %s: applied schema migration %s", st->path,
		    allot__migrations[i].name);
	}
	return 0;
}

/* The newest schema version this allotd knows (the last migration). */
static int64_t
known_version(void)
{
	size_t n = sizeof allot__migrations / sizeof allot__migrations[0];
	return allot__migrations[n - 1].version;
}

static void
store_free(allot__store *st)
{
	for (int i = 0; i < S_COUNT; i++)
		sqlite3_finalize(st->stmt[i]);
	if (st->db != NULL) {
		int rc = sqlite3_close(st->db);
		if (rc != SQLITE_OK)
			allot__log(&st->lg, ALLOT_LOG_ERR, "ALLOT-STORE-CLOSE",
			    "store %s: close failed: %s", st->path,
			    sqlite3_errstr(rc));
	}
	for (int i = 0; i < 3; i++)
		allot__batch_free(&st->b[i]);
	allot__store_written_free(st);
	allot__store_keys_free(&st->keys);
	allot__marks_fini(&st->committed);
	allot__marks_fini(&st->booked);
	allot__marks_fini(&st->scratch);
	pthread_mutex_destroy(&st->mu);
	free(st->path);
	free(st);
}

/* A handle with empty batches and the options in force, no file yet;
 * NULL when out of memory. */
static allot__store *
store_new(
    const char *path, const allot__store_opts *opts, const allot__logger *lg)
{
	allot__store *st = calloc(1, sizeof *st);
	if (st == NULL || (st->path = strdup(path)) == NULL) {
		free(st);
		return NULL;
	}
	pthread_mutex_init(&st->mu, NULL);
	for (int i = 0; i < 3; i++)
		allot__batch_init(&st->b[i]);
	st->cur = &st->b[0];
	st->retry = &st->b[1];
	st->spare = &st->b[2];
	allot__store_keys_init(&st->keys);
	allot__store_written_init(st);
	if (lg != NULL)
		st->lg = *lg;
	allot__store_opts_default(&st->opts);
	if (opts != NULL) {
		st->opts.retention_s = opts->retention_s;
		if (opts->max_pending != 0)
			st->opts.max_pending = opts->max_pending;
		if (opts->busy_timeout_ms != 0)
			st->opts.busy_timeout_ms = opts->busy_timeout_ms;
		if (opts->retention_chunk != 0)
			st->opts.retention_chunk = opts->retention_chunk;
		if (opts->share_refresh_ms != 0)
			st->opts.share_refresh_ms = opts->share_refresh_ms;
	}
	st->rl_fail = (allot__logrl) ALLOT__LOGRL_INIT(3, 60000);
	st->rl_drop = (allot__logrl) ALLOT__LOGRL_INIT(3, 60000);
	st->rl_retention = (allot__logrl) ALLOT__LOGRL_INIT(3, 60000);
	return st;
}

/* Open the file (creating it), after refusing one of zero bytes: that is
 * a store truncated to nothing, which SQLite would take for a new, empty
 * database; refuse it rather than reset the audit trail silently. */
static int
open_db(allot__store *st, char *errbuf, size_t errlen)
{
	const char *path = st->path;
	struct stat sb;
	if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size == 0) {
		seterr(errbuf, errlen,
		    "%s exists but is empty (0 bytes): it is not a valid "
		    "allot database; if it was truncated, restore it from a "
		    "backup; to start a new store remove the file. allotd "
		    "will not overwrite it",
		    path);
		return -1;
	}
	int rc = sqlite3_open_v2(path, &st->db,
	    SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
	    NULL);
	if (rc != SQLITE_OK) {
		seterr(errbuf, errlen, "cannot open store %s: %s", path,
		    st->db != NULL ? sqlite3_errmsg(st->db) :
		                     sqlite3_errstr(rc));
		return -1;
	}
	sqlite3_extended_result_codes(st->db, 1);
	sqlite3_busy_timeout(st->db, OPEN_BUSY_MS);
	return 0;
}

/* Whose file is it, and which schema version does it hold: a new empty
 * database, or ours at a version this allotd knows. `*ret_version` is
 * the version found. */
static int
check_identity(
    allot__store *st, int64_t *ret_version, char *errbuf, size_t errlen)
{
	const char *path = st->path;
	int64_t version = 0, app_id = 0, objects = 0;
	int rc = query_int(st->db, "PRAGMA user_version", &version);
	if (rc == SQLITE_OK)
		rc = query_int(st->db, "PRAGMA application_id", &app_id);
	if (rc == SQLITE_OK)
		rc = query_int(
		    st->db, "SELECT count(*) FROM sqlite_master", &objects);
	if (rc != SQLITE_OK) {
		seterr(errbuf, errlen,
		    is_corruption(rc) ? NOT_VALID_FMT :
		                        "cannot read store %s: %s",
		    path, sqlite3_errmsg(st->db));
		return -1;
	}
	if (app_id != APP_ID &&
	    (app_id != 0 || version != 0 || objects != 0)) {
		seterr(errbuf, errlen, NOT_VALID_FMT, path,
		    "an SQLite database of another application");
		return -1;
	}
	int64_t known = known_version();
	if (version > known) {
		seterr(errbuf, errlen,
		    "store %s has schema version %" PRId64 " but this allotd "
		    "knows versions up to %" PRId64 ": it was written by a "
		    "newer allotd; run that version, or move the file aside "
		    "(allotd will not downgrade it)",
		    path, version, known);
		return -1;
	}
	*ret_version = version;
	return 0;
}

/* WAL lets auditors read while allotd writes; NORMAL durability loses at
 * most the last commits on power loss, never integrity. */
static int
configure(allot__store *st, char *errbuf, size_t errlen)
{
	char mode[16] = "";
	sqlite3_stmt *s = NULL;
	int rc = sqlite3_prepare_v2(
	    st->db, "PRAGMA journal_mode = WAL", -1, &s, NULL);
	if (rc == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW)
		snprintf(mode, sizeof mode, "%s", sqlite3_column_text(s, 0));
	sqlite3_finalize(s);
	if (strcmp(mode, "wal") != 0) {
		seterr(errbuf, errlen,
		    "cannot put store %s in WAL mode (%s); "
		    "is it on a file system without shared memory, or locked?",
		    st->path, mode[0] != '\0' ? mode : sqlite3_errmsg(st->db));
		return -1;
	}
	rc = sqlite3_exec(st->db,
	    "PRAGMA synchronous = NORMAL;"
	    "PRAGMA journal_size_limit = 67108864;"
	    "PRAGMA cache_size = -65536;",
	    NULL, NULL, NULL);
	if (rc != SQLITE_OK) {
		seterr(errbuf, errlen, "cannot configure store %s: %s",
		    st->path, sqlite3_errmsg(st->db));
		return -1;
	}
	return 0;
}

/* Prepare every statement (persistent: they live until close), and read
 * the largest session ever issued. */
static int
prepare(allot__store *st, char *errbuf, size_t errlen)
{
	for (int i = 0; i < S_COUNT; i++) {
		int rc = sqlite3_prepare_v3(st->db, stmt_sql[i], -1,
		    SQLITE_PREPARE_PERSISTENT, &st->stmt[i], NULL);
		if (rc != SQLITE_OK) {
			seterr(errbuf, errlen,
			    "store %s: cannot prepare "
			    "statement %d: %s",
			    st->path, i, sqlite3_errmsg(st->db));
			return -1;
		}
	}
	int64_t max_session = 0;
	int rc = query_int(st->db,
	    "SELECT coalesce(max(session), 0) FROM replicas", &max_session);
	if (rc != SQLITE_OK) {
		seterr(errbuf, errlen, "cannot read store %s: %s", st->path,
		    sqlite3_errmsg(st->db));
		return -1;
	}
	st->max_session = (uint64_t) max_session;
	return 0;
}

int
allot__store_open(const char *path, const allot__store_opts *opts,
    const allot__logger *lg, char *errbuf, size_t errlen, allot__store **ret)
{
	if (path == NULL || ret == NULL) {
		seterr(errbuf, errlen, "store: no path given");
		return ALLOT_EINVAL;
	}
	allot__store *st = store_new(path, opts, lg);
	if (st == NULL) {
		seterr(errbuf, errlen, "store %s: out of memory", path);
		return ALLOT_ENOMEM;
	}
	int64_t version = 0;
	if (open_db(st, errbuf, errlen) != 0 ||
	    check_file(st, errbuf, errlen) != 0 ||
	    check_identity(st, &version, errbuf, errlen) != 0 ||
	    configure(st, errbuf, errlen) != 0 ||
	    migrate(st, version, errbuf, errlen) != 0 ||
	    prepare(st, errbuf, errlen) != 0) {
		store_free(st);
		return ALLOT_EIO;
	}
	int lrc = allot__store_load_marks(st);
	if (lrc != ALLOT_OK) {
		seterr(errbuf, errlen,
		    "store %s: cannot read its accounts: %s", path,
		    sqlite3_errmsg(st->db));
		store_free(st);
		return lrc;
	}
	sqlite3_busy_timeout(st->db, (int) st->opts.busy_timeout_ms);
	st->next_retention_ms = INT64_MIN;
	st->next_forget_ms = INT64_MIN;

	allot__log(&st->lg, ALLOT_LOG_INFO, "ALLOT-STORE-OPEN",
	    "store %s: schema version %" PRId64 " (was %" PRId64 "), "
	    "retention %" PRIu32 " s",
	    path, known_version(), version, st->opts.retention_s);
	*ret = st;
	return ALLOT_OK;
}

void
allot__store_close(allot__store *st)
{
	if (st == NULL)
		return;
	if (allot__store_flush(st) != ALLOT_OK) {
		allot__store_stats s;
		allot__store_stats_get(st, &s);
		allot__log(&st->lg, ALLOT_LOG_ERR, "ALLOT-STORE-LOST",
		    "store %s: closing with %" PRIu64 " rows that could not "
		    "be written (%s)",
		    st->path, s.pending, sqlite3_errstr(s.last_error));
	}
	(void) sqlite3_exec(st->db, "PRAGMA optimize", NULL, NULL, NULL);
	store_free(st);
}
