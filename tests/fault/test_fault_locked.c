/* SPDX-License-Identifier: MIT */
/*
 * Fault: an auditor's connection to the store. First a long read (a read
 * transaction held open for seconds): WAL readers never block allotd, so
 * no commit may fail. Then a write lock (BEGIN EXCLUSIVE held for
 * seconds, as a sqlite3 shell left in a transaction would): allotd must
 * keep allocating (every agent keeps getting replies), count and log the
 * failed commits ("database is locked"), and once the lock is released
 * write everything it queued.
 */
#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "fault.h"
#include "proc.h"
#include "runner.h"

typedef struct auditor {
	const char *db;
	const char *begin; /* "BEGIN" (then a read) or "BEGIN EXCLUSIVE" */
	sqlite3 *conn;
} auditor;

static void
hold(void *ctx)
{
	auditor *au = ctx;
	ck_assert_int_eq(
	    sqlite3_open_v2(au->db, &au->conn, SQLITE_OPEN_READWRITE, NULL),
	    SQLITE_OK);
	/* allotd holds the write lock for a few ms per commit. */
	sqlite3_busy_timeout(au->conn, 5000);
	char *err = NULL;
	ck_assert_msg(
	    sqlite3_exec(au->conn, au->begin, NULL, NULL, &err) == SQLITE_OK,
	    "%s: %s", au->begin, err);
	/* A read makes the transaction hold its snapshot. */
	ck_assert_msg(
	    sqlite3_exec(au->conn, "SELECT count(*), sum(admitted) FROM usage",
	        NULL, NULL, &err) == SQLITE_OK,
	    "read: %s", err);
}

static void
release(void *ctx)
{
	auditor *au = ctx;
	ck_assert_int_eq(
	    sqlite3_exec(au->conn, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
	ck_assert_int_eq(sqlite3_close(au->conn), SQLITE_OK);
	au->conn = NULL;
}

START_TEST(long_read_does_not_block)
{
	fault_env e;
	fault_env_init(&e, "read", NULL);
	fault_allotd_start(&e);
	allot_agent *as[2] = { fault_agent(e.c.url, "r0"),
		fault_agent(e.c.url, "r1") };
	fault_await_synced(as, 2, 1, 10000);
	fault_load ld[2];
	for (int i = 0; i < 2; i++)
		fault_load_start(&ld[i], as[i], 30000);
	pc_sleep_ms(1200);
	double fail0 = fault_metric(&e, "allotd_store_commit_failures_total");
	double w0 = fault_metric(&e, "allotd_store_rows_written_total");
	auditor au = { .db = e.c.db, .begin = "BEGIN" };
	hold(&au);
	uint64_t t0 = pc_now_ms();
	pc_sleep_ms(3000);
	double fail1 = fault_metric(&e, "allotd_store_commit_failures_total");
	double w1 = fault_metric(&e, "allotd_store_rows_written_total");
	release(&au);
	for (int i = 0; i < 2; i++)
		fault_load_stop(&ld[i]);
	fault_counts c;
	fault_counts_get(ld, 2, &c);

	fault_figures f = {
		.id = "3a-read",
		.fault = "auditor holds a read transaction for 3 s",
		.promised = "never blocks allotd (WAL): no commit fails",
		.requests = c.steady_ok + c.steady_failed,
		.failed = c.steady_failed + c.greedy_err,
		.over_rt = NAN,
		.recovery_ms = NAN,
	};
	snprintf(f.measured, sizeof f.measured,
	    "%.0f commits failed, %.0f rows written during the read "
	    "(%.1f s)",
	    fail1 - fail0, w1 - w0, (double) (pc_now_ms() - t0) / 1000.0);
	fault_report(&f);
	ck_assert(fail1 == fail0);
	ck_assert(w1 > w0);
	ck_assert_uint_eq(f.failed, 0);
	for (int i = 0; i < 2; i++)
		allot_agent_destroy(as[i]);
	ck_assert_int_eq(fault_allotd_stop(&e, SIGTERM), 0);
	fault_env_fini(&e);
}
END_TEST

START_TEST(write_lock)
{
	fault_env e;
	fault_env_init(&e, "locked", NULL);
	auditor au = { .db = e.c.db, .begin = "BEGIN EXCLUSIVE" };
	fault_outage o = {
		.begin = hold,
		.end = release,
		.ctx = &au,
		.outage_ms = 3000,
		.log_text = "database is locked",
	};
	fault_figures f = {
		.id = "3b-locked",
		.fault = "auditor holds a write lock (BEGIN EXCLUSIVE) for "
		         "3 s",
		.promised = "allocation goes on; failures counted and logged; "
		            "queued rows written when the lock is released",
	};
	fault_store_outage(&e, &o, &f);
	fault_env_fini(&e);
}
END_TEST

static Suite *
locked_suite(void)
{
	Suite *s = suite_create("fault-locked");
	TCase *tc = tcase_create("auditor");
	tcase_set_timeout(tc, 80);
	tcase_add_test(tc, long_read_does_not_block);
	tcase_add_test(tc, write_lock);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(locked_suite)
