/* SPDX-License-Identifier: MIT */
/*
 * The store suite's shared parts (tests/test_store.c has the suite): a
 * fresh temporary directory and store file per test, a fake clock, the
 * store's log kept in a buffer, queries through a second, independent
 * SQLite connection, and each file's builder adding its tests to the
 * suite's TCases (test_store.c: schema, records and views;
 * store_files.c: restart and bad files; store_config.c: config changes;
 * store_running.c: failures, retention, the bound and load).
 */
#ifndef ALLOT_TESTS_STORE_FIXTURE_H
#define ALLOT_TESTS_STORE_FIXTURE_H

#include <check.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <sqlite3.h>

#include "store/store.h"

/* 2023-11-14 22:13:20 UTC, a whole minute plus 20 s. */
#define T0 INT64_C(1700000000000)

/* The test's directory and its store file, made by sf_setup. */
extern char sf_dir[256];
extern char sf_dbpath[300];
/* The time the stores opened by sf_open_with see, ms since the epoch. */
extern _Atomic int64_t sf_fake_now;

/* Log lines are kept so tests can look for the stable ids. */
extern char sf_logbuf[16384];
extern size_t sf_loglen;
extern const allot__logger sf_log;

/* The version a new store ends at: the last migration allotd carries. */
int sf_schema_version(void);

/* The checked fixture of every TCase: a fresh directory, the clock at
 * T0 and an empty log; then the directory removed. */
void sf_setup(void);
void sf_teardown(void);

/* A store on sf_dbpath with `opts` (NULL: the defaults), the fake
 * clock and the kept log; fails the test if it does not open. */
allot__store *sf_open_with(const allot__store_opts *opts);
allot__store *sf_open_store(void);

/* A second, independent connection, as an auditor's shell would have. */
sqlite3 *sf_aux_open(void);
void sf_aux_exec(sqlite3 *db, const char *sql);
/* The single integer value of `sql`, through a connection of its own. */
int64_t sf_q_int(const char *sql);
/* The single text value of `sql`, "(null)" for NULL. */
char *sf_q_text(const char *sql);

/* A flush that must succeed (the log in the message if not). */
void sf_flush_ok(allot__store *st);
allot__store_stats sf_stats(allot__store *st);
size_t sf_read_file(const char *path, char *buf, size_t cap);

/* The suite's TCases, made by test_store.c in the suite's order; each
 * file adds its own tests to them. */
typedef struct store_tcases {
	TCase *schema;
	TCase *records;
	TCase *restart;
	TCase *bad_files;
	TCase *failures;
	TCase *retention;
	TCase *load;
} store_tcases;

void store_files_tests(const store_tcases *tc);
void store_config_tests(const store_tcases *tc);
void store_running_tests(const store_tcases *tc);

#endif
