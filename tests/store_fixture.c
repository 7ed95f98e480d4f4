/* SPDX-License-Identifier: MIT */
/*
 * The store suite's fixture (store_fixture.h): a fresh temporary
 * directory per test, the fake clock and kept log every store of the
 * suite opens with, and queries through an independent connection.
 */
#include <check.h>
#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "store/store.h"
#include "store_fixture.h"

/* The migrations allotd carries: the version a new store ends at. */
#include "schema_sql.h"

int
sf_schema_version(void)
{
	size_t n = sizeof allot__migrations / sizeof allot__migrations[0];
	return allot__migrations[n - 1].version;
}

char sf_dir[256];
char sf_dbpath[300];
_Atomic int64_t sf_fake_now;

static int64_t
fake_clock(void *ctx)
{
	(void) ctx;
	return atomic_load(&sf_fake_now);
}

char sf_logbuf[16384];
size_t sf_loglen;
static pthread_mutex_t logmu = PTHREAD_MUTEX_INITIALIZER;

static void
capture_log(void *ctx, int level, const char *id, const char *msg)
{
	(void) ctx;
	pthread_mutex_lock(&logmu);
	int n = snprintf(sf_logbuf + sf_loglen, sizeof sf_logbuf - sf_loglen,
	    "%d %s %s\n", level, id, msg);
	if (n > 0 && (size_t) n < sizeof sf_logbuf - sf_loglen)
		sf_loglen += (size_t) n;
	pthread_mutex_unlock(&logmu);
}

const allot__logger sf_log = { capture_log, NULL, ALLOT_LOG_DEBUG };

void
sf_setup(void)
{
	snprintf(sf_dir, sizeof sf_dir, "%s/allot-store-XXXXXX",
	    getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp");
	ck_assert_ptr_nonnull(mkdtemp(sf_dir));
	snprintf(sf_dbpath, sizeof sf_dbpath, "%s/allot.db", sf_dir);
	atomic_store(&sf_fake_now, T0);
	sf_loglen = 0;
	sf_logbuf[0] = '\0';
}

void
sf_teardown(void)
{
	DIR *d = opendir(sf_dir);
	if (d == NULL)
		return;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 ||
		    strcmp(e->d_name, "..") == 0)
			continue;
		char p[600];
		snprintf(p, sizeof p, "%s/%s", sf_dir, e->d_name);
		unlink(p);
	}
	closedir(d);
	rmdir(sf_dir);
}

allot__store *
sf_open_with(const allot__store_opts *opts)
{
	char err[512] = "";
	allot__store *st = NULL;
	int rc = allot__store_open(
	    sf_dbpath, opts, &sf_log, err, sizeof err, &st);
	ck_assert_msg(rc == ALLOT_OK, "open: rc %d: %s", rc, err);
	ck_assert_ptr_nonnull(st);
	allot__store_set_clock(st, fake_clock, NULL);
	return st;
}

allot__store *
sf_open_store(void)
{
	return sf_open_with(NULL);
}

sqlite3 *
sf_aux_open(void)
{
	sqlite3 *db = NULL;
	ck_assert_int_eq(sqlite3_open(sf_dbpath, &db), SQLITE_OK);
	sqlite3_busy_timeout(db, 2000);
	return db;
}

void
sf_aux_exec(sqlite3 *db, const char *sql)
{
	char *msg = NULL;
	int rc = sqlite3_exec(db, sql, NULL, NULL, &msg);
	ck_assert_msg(rc == SQLITE_OK, "%s: %s", sql, msg ? msg : "?");
	sqlite3_free(msg);
}

int64_t
sf_q_int(const char *sql)
{
	sqlite3 *db = sf_aux_open();
	sqlite3_stmt *s = NULL;
	int rc = sqlite3_prepare_v2(db, sql, -1, &s, NULL);
	ck_assert_msg(rc == SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(db));
	rc = sqlite3_step(s);
	ck_assert_msg(rc == SQLITE_ROW, "%s: no row (%d)", sql, rc);
	int64_t v = sqlite3_column_int64(s, 0);
	sqlite3_finalize(s);
	sqlite3_close(db);
	return v;
}

char *
sf_q_text(const char *sql)
{
	static char out[512];
	sqlite3 *db = sf_aux_open();
	sqlite3_stmt *s = NULL;
	int rc = sqlite3_prepare_v2(db, sql, -1, &s, NULL);
	ck_assert_msg(rc == SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(db));
	ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
	const unsigned char *t = sqlite3_column_text(s, 0);
	snprintf(
	    out, sizeof out, "%s", t != NULL ? (const char *) t : "(null)");
	sqlite3_finalize(s);
	sqlite3_close(db);
	return out;
}

void
sf_flush_ok(allot__store *st)
{
	int rc = allot__store_flush(st);
	ck_assert_msg(rc == ALLOT_OK, "flush rc %d; log:\n%s", rc, sf_logbuf);
}

allot__store_stats
sf_stats(allot__store *st)
{
	allot__store_stats s;
	allot__store_stats_get(st, &s);
	return s;
}

size_t
sf_read_file(const char *path, char *buf, size_t cap)
{
	FILE *f = fopen(path, "rb");
	ck_assert_ptr_nonnull(f);
	size_t n = fread(buf, 1, cap, f);
	fclose(f);
	return n;
}
