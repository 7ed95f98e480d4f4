/* SPDX-License-Identifier: MIT */
/*
 * The store suite's files across opens (tests/test_store.c has the
 * suite): a restart restores live replicas, levels and the largest
 * session; garbage, truncated, foreign, newer, empty and unopenable files
 * are refused with a message naming the file, and nothing is written to
 * them.
 */
#include <check.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#include "store/store.h"
#include "store_fixture.h"

static void
write_file(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(data, 1, len, f), len);
	fclose(f);
}

static bool
exists(const char *path)
{
	struct stat sb;
	return stat(path, &sb) == 0;
}

/* ---- restart ---- */

struct restored {
	uint64_t sessions[8];
	char ids[8][32];
	int64_t seen[8];
	int nrep;
	char levels[8][64];
	double level[8];
	int nlev;
};

static void
on_replica(void *ctx, const allot__store_replica *r)
{
	struct restored *x = ctx;
	ck_assert_int_lt(x->nrep, 8);
	x->sessions[x->nrep] = r->session;
	snprintf(x->ids[x->nrep], sizeof x->ids[0], "%s", r->replica_id);
	x->seen[x->nrep] = r->last_seen_ms;
	x->nrep++;
}

static void
on_level(void *ctx, const allot__store_level *l)
{
	struct restored *x = ctx;
	ck_assert_int_lt(x->nlev, 8);
	snprintf(x->levels[x->nlev], sizeof x->levels[0], "%s/%s", l->service,
	    l->quota);
	x->level[x->nlev] = l->level;
	x->nlev++;
}

START_TEST(restart_restores_live_replicas)
{
	allot__store *st = sf_open_store();
	ck_assert_uint_eq(allot__store_max_session(st), 0);
	allot__store_replica_joined(st, 5, "a", "orders", "h", 1, "v", 1);
	allot__store_replica_joined(st, 9, "b", "orders", "h", 2, "v", 1);
	allot__store_replica_joined(st, 7, "c", "search", "h", 3, "v", 1);
	/* Counted as soon as recorded, before any flush. */
	ck_assert_uint_eq(allot__store_max_session(st), 9);
	sf_flush_ok(st);
	atomic_store(&sf_fake_now, T0 + 3000);
	allot__store_replica_seen(st, 7);
	allot__store_replica_left(st, 9, "replaced");
	allot__store_level(st, "orders", "checkout", 42.5);
	allot__store_level(st, "search", "query", 7);
	/* Not flushed explicitly: close flushes. */
	allot__store_close(st);

	st = sf_open_store();
	ck_assert_uint_eq(allot__store_max_session(st), 9);
	struct restored x;
	memset(&x, 0, sizeof x);
	ck_assert_int_eq(
	    allot__store_restore(st, on_replica, on_level, &x), ALLOT_OK);
	ck_assert_int_eq(x.nrep, 2);
	ck_assert_uint_eq(x.sessions[0], 5);
	ck_assert_str_eq(x.ids[0], "a");
	ck_assert_int_eq(x.seen[0], T0);
	ck_assert_uint_eq(x.sessions[1], 7);
	ck_assert_str_eq(x.ids[1], "c");
	ck_assert_int_eq(x.seen[1], T0 + 3000);
	ck_assert_int_eq(x.nlev, 2);
	ck_assert_str_eq(x.levels[0], "orders/checkout");
	ck_assert_double_eq_tol(x.level[0], 42.5, 1e-9);
	ck_assert_str_eq(x.levels[1], "search/query");
	/* NULL callbacks are allowed. */
	ck_assert_int_eq(allot__store_restore(st, NULL, NULL, NULL), ALLOT_OK);
	/* A session re-registering after the restart is live again. */
	allot__store_replica_left(st, 5, "shutdown");
	allot__store_replica_joined(st, 5, "a", "orders", "h", 1, "v", 1);
	sf_flush_ok(st);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM replicas "
	                          "WHERE session = 5 AND left_at IS NULL"),
	    1);
	allot__store_close(st);
	/* Clean close: the WAL was checkpointed and removed. */
	char wal[320];
	snprintf(wal, sizeof wal, "%s-wal", sf_dbpath);
	ck_assert(!exists(wal));
}
END_TEST

/* ---- bad files ---- */

static void
expect_open_fails(const char *want)
{
	char err[512] = "";
	allot__store *st = (allot__store *) &err; /* must stay untouched */
	int rc = allot__store_open(
	    sf_dbpath, NULL, &sf_log, err, sizeof err, &st);
	ck_assert_int_eq(rc, ALLOT_EIO);
	ck_assert_ptr_eq(st, (allot__store *) &err);
	ck_assert_msg(strstr(err, sf_dbpath) != NULL, "no path in: %s", err);
	ck_assert_msg(strstr(err, want) != NULL, "no '%s' in: %s", want, err);
}

START_TEST(garbage_file_refused)
{
	char junk[8192];
	for (size_t i = 0; i < sizeof junk; i++)
		junk[i] = (char) ("allot garbage\n"[i % 14]);
	write_file(sf_dbpath, junk, sizeof junk);
	expect_open_fails(
	    "is not a valid allot database (file is not a "
	    "database); move it aside or restore from backup; allotd will "
	    "not overwrite it");
	char back[sizeof junk + 1];
	ck_assert_uint_eq(
	    sf_read_file(sf_dbpath, back, sizeof back), sizeof junk);
	ck_assert_int_eq(memcmp(back, junk, sizeof junk), 0);
}
END_TEST

START_TEST(truncated_file_refused)
{
	allot__store *st = sf_open_store();
	char q[32];
	for (int i = 0; i < 3000; i++) {
		snprintf(q, sizeof q, "quota-%d", i);
		allot__store_usage(st, "svc", q, 1, 1, 1, 1);
		allot__store_event(
		    st, "reject", q, "some detail to fill pages");
	}
	sf_flush_ok(st);
	allot__store_close(st);
	struct stat sb;
	ck_assert_int_eq(stat(sf_dbpath, &sb), 0);
	ck_assert_int_gt(sb.st_size, 64 * 1024);
	off_t cut = sb.st_size / 2;
	ck_assert_int_eq(truncate(sf_dbpath, cut), 0);
	expect_open_fails("is not a valid allot database");
	expect_open_fails("move it aside or restore from backup");
	ck_assert_int_eq(stat(sf_dbpath, &sb), 0);
	ck_assert_int_eq(sb.st_size, cut);
}
END_TEST

START_TEST(foreign_database_refused)
{
	sqlite3 *db = sf_aux_open();
	sf_aux_exec(db,
	    "CREATE TABLE accounts (id INTEGER PRIMARY KEY, name);"
	    "INSERT INTO accounts (name) VALUES ('keep me')");
	sqlite3_close(db);
	expect_open_fails("an SQLite database of another application");
	ck_assert_str_eq(sf_q_text("SELECT name FROM accounts"), "keep me");
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM sqlite_master"), 1);
}
END_TEST

START_TEST(newer_schema_refused)
{
	allot__store *st = sf_open_store();
	allot__store_close(st);
	sqlite3 *db = sf_aux_open();
	sf_aux_exec(db, "PRAGMA user_version = 99");
	sqlite3_close(db);
	char want[96];
	snprintf(want, sizeof want,
	    "has schema version 99 but this allotd knows versions up to %d",
	    sf_schema_version());
	expect_open_fails(want);
	ck_assert_int_eq(sf_q_int("PRAGMA user_version"), 99);
}
END_TEST

START_TEST(unopenable_path_refused)
{
	snprintf(
	    sf_dbpath, sizeof sf_dbpath, "%s/no/such/dir/allot.db", sf_dir);
	expect_open_fails("cannot open store");
}
END_TEST

START_TEST(empty_file_refused)
{
	/* A store truncated to nothing is not silently started afresh. */
	write_file(sf_dbpath, "", 0);
	char err[512] = "";
	allot__store *st = NULL;
	int rc = allot__store_open(
	    sf_dbpath, NULL, &sf_log, err, sizeof err, &st);
	ck_assert_int_ne(rc, ALLOT_OK);
	ck_assert_ptr_null(st);
	ck_assert_msg(strstr(err, sf_dbpath) != NULL &&
	        strstr(err, "empty") != NULL &&
	        strstr(err, "remove the file") != NULL,
	    "message: %s", err);
	struct stat sb;
	ck_assert_int_eq(stat(sf_dbpath, &sb), 0);
	ck_assert_int_eq(sb.st_size, 0);
	/* Once removed, a new store is created. */
	unlink(sf_dbpath);
	st = sf_open_store();
	allot__store_close(st);
	ck_assert_int_eq(sf_q_int("PRAGMA user_version"), sf_schema_version());
}
END_TEST

void
store_files_tests(const store_tcases *tc)
{
	tcase_add_test(tc->schema, empty_file_refused);
	tcase_add_test(tc->restart, restart_restores_live_replicas);
	tcase_add_test(tc->bad_files, garbage_file_refused);
	tcase_add_test(tc->bad_files, truncated_file_refused);
	tcase_add_test(tc->bad_files, foreign_database_refused);
	tcase_add_test(tc->bad_files, newer_schema_refused);
	tcase_add_test(tc->bad_files, unopenable_path_refused);
}
