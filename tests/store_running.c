/* SPDX-License-Identifier: MIT */
/*
 * The store suite's running store (tests/test_store.c has the suite): a
 * write lock held by another connection or a full disk fails the flush
 * with ALLOT_EIO, is counted, keeps the rows, and the next flush writes
 * every one of them; a long read transaction does not block the flush;
 * retention deletes old rows in bounded chunks at most once a minute;
 * max_pending drops the oldest usage rows and never events; concurrent
 * recorders lose nothing; and the flush throughput is measured.
 */
#include <check.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sqlite3.h>

#include "clock.h"
#include "runner.h"
#include "store/store.h"
#include "store_fixture.h"

/* Under valgrind (its preload library is in LD_PRELOAD) and in sanitizer
 * builds the load tests shrink, so the suite stays inside half its
 * timeout: the same rows and checks, fewer of them (the throughput
 * round's flush of 205,000 rows took 6 s under ASan). */
static int
load_scale(void)
{
	const char *p = getenv("LD_PRELOAD");
	if (p != NULL && strstr(p, "vgpreload") != NULL)
		return 20;
	return ALLOT_TEST_SANITIZED ? 4 : 1;
}

/* ---- failures while running ---- */

static void
record_rows(allot__store *st, int first, int n)
{
	char q[32];
	for (int i = first; i < first + n; i++) {
		snprintf(q, sizeof q, "q%d", i);
		allot__store_usage(st, "svc", q, (uint64_t) i, 1, 1, 1);
	}
}

START_TEST(locked_database_keeps_rows)
{
	allot__store_opts o;
	allot__store_opts_default(&o);
	o.busy_timeout_ms = 20;
	allot__store *st = sf_open_with(&o);
	record_rows(st, 0, 100);
	allot__store_replica_joined(st, 1, "r1", "svc", "h", 1, "v", 0);
	allot__store_event(st, "start", NULL, NULL);
	sf_flush_ok(st);

	/* An auditor takes the write lock (BEGIN EXCLUSIVE). */
	sqlite3 *aux = sf_aux_open();
	sf_aux_exec(aux, "BEGIN EXCLUSIVE");
	atomic_store(&sf_fake_now, T0 + 1000);
	record_rows(st, 0, 100);
	allot__store_event(st, "config", "x", NULL);
	allot__store_replica_left(st, 1, "leave");
	uint64_t t0 = allot__mono_ns();
	ck_assert_int_eq(allot__store_flush(st), ALLOT_EIO);
	/* It waited for the lock about busy_timeout_ms, no longer. */
	ck_assert_uint_lt(allot__mono_ns() - t0, 2000000000u);
	allot__store_stats s = sf_stats(st);
	ck_assert_uint_eq(s.commit_failures, 1);
	ck_assert_uint_eq(s.commits, 1);
	ck_assert_uint_eq(s.pending, 102);
	ck_assert_int_eq(s.last_error & 0xff, SQLITE_BUSY);
	ck_assert_ptr_nonnull(strstr(sf_logbuf, "ALLOT-STORE-FAIL"));
	ck_assert_msg(
	    strstr(sf_logbuf, "database is locked") != NULL, "%s", sf_logbuf);
	ck_assert_ptr_nonnull(strstr(sf_logbuf, sf_dbpath));

	/* More arrives while locked; a second attempt fails too, merging. */
	record_rows(st, 0, 50); /* same second: adds to kept rows */
	atomic_store(&sf_fake_now, T0 + 2000);
	record_rows(st, 100, 10); /* new rows */
	ck_assert_int_eq(allot__store_flush(st), ALLOT_EIO);
	s = sf_stats(st);
	ck_assert_uint_eq(s.commit_failures, 2);
	ck_assert_uint_eq(s.pending, 112);

	sf_aux_exec(aux, "ROLLBACK");
	sqlite3_close(aux);
	sf_flush_ok(st);
	s = sf_stats(st);
	ck_assert_uint_eq(s.pending, 0);
	ck_assert_uint_eq(s.commits, 2);
	ck_assert_uint_eq(s.rows_written, 102 + 112);
	ck_assert_uint_eq(s.rows_dropped, 0);
	ck_assert_ptr_nonnull(strstr(sf_logbuf, "ALLOT-STORE-OK"));
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM usage"), 210);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM usage WHERE at = "
	                          "1700000001000"),
	    100);
	/* Second T0+1: q0..q49 reported twice, q50..q99 once. */
	ck_assert_int_eq(sf_q_int("SELECT sum(admitted) FROM usage WHERE at = "
	                          "1700000001000"),
	    2 * (49 * 50 / 2) + (99 * 100 / 2 - 49 * 50 / 2));
	ck_assert_int_eq(sf_q_int("SELECT sum(denied) FROM usage"), 260);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM events"), 2);
	ck_assert_str_eq(sf_q_text("SELECT left_why FROM replicas"), "leave");
	allot__store_close(st);
}
END_TEST

START_TEST(reader_does_not_block_flush)
{
	allot__store *st = sf_open_store();
	record_rows(st, 0, 10);
	sf_flush_ok(st);
	sqlite3 *aux = sf_aux_open();
	sf_aux_exec(aux, "BEGIN");
	sqlite3_stmt *s = NULL;
	ck_assert_int_eq(sqlite3_prepare_v2(
	                     aux, "SELECT count(*) FROM usage", -1, &s, NULL),
	    SQLITE_OK);
	ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
	ck_assert_int_eq(sqlite3_column_int(s, 0), 10);
	sqlite3_reset(s);
	atomic_store(&sf_fake_now, T0 + 1000);
	record_rows(st, 0, 10);
	sf_flush_ok(st);
	/* The reader's snapshot is stable; a new one sees the new rows. */
	ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
	ck_assert_int_eq(sqlite3_column_int(s, 0), 10);
	sqlite3_finalize(s);
	sf_aux_exec(aux, "COMMIT");
	sqlite3_close(aux);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM usage"), 20);
	ck_assert_uint_eq(sf_stats(st).commit_failures, 0);
	allot__store_close(st);
}
END_TEST

START_TEST(disk_full_keeps_rows)
{
	allot__store *st = sf_open_store();
	record_rows(st, 0, 10);
	sf_flush_ok(st);
	/* The store's own connection may not grow the file: SQLITE_FULL. */
	sqlite3 *db = allot__store_db(st);
	ck_assert_int_eq(
	    sqlite3_exec(db, "PRAGMA max_page_count = 1", NULL, NULL, NULL),
	    SQLITE_OK);
	atomic_store(&sf_fake_now, T0 + 1000);
	char q[32];
	for (int i = 0; i < 2000; i++) {
		snprintf(q, sizeof q, "quota-with-a-long-name-%d", i);
		allot__store_usage(st, "svc", q, 1, 0, 1, 1);
		allot__store_event(st, "reject", q, "x");
	}
	ck_assert_int_eq(allot__store_flush(st), ALLOT_EIO);
	allot__store_stats s = sf_stats(st);
	ck_assert_int_eq(s.last_error & 0xff, SQLITE_FULL);
	ck_assert_uint_eq(s.pending, 4000);
	ck_assert_msg(strstr(sf_logbuf, "database or disk is full") != NULL,
	    "%s", sf_logbuf);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM usage"), 10);
	ck_assert_int_eq(sqlite3_exec(db, "PRAGMA max_page_count = 1073741823",
	                     NULL, NULL, NULL),
	    SQLITE_OK);
	sf_flush_ok(st);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM usage"), 2010);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM events"), 2000);
	allot__store_close(st);
}
END_TEST

/* ---- retention ---- */

START_TEST(retention_deletes_old_rows_in_chunks)
{
	allot__store_opts o;
	allot__store_opts_default(&o);
	o.retention_s = 3600;
	o.retention_chunk = 7;
	allot__store *st = sf_open_with(&o);
	allot__store_replica_joined(st, 1, "r", "svc", "h", 1, "v", 0);
	for (int i = 0; i < 20; i++) {
		atomic_store(&sf_fake_now, T0 + i * 1000);
		allot__store_usage(st, "svc", "q", 1, 0, 1, 1);
		allot__store_event(st, "reject", "x", NULL);
		allot__store_share(st, 1, "svc", "q", i + 1, 10, T0);
		sf_flush_ok(st);
	}
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM usage"), 20);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM share_history"), 20);

	/* Two hours later everything above is past retention. */
	int64_t later = T0 + 2 * 3600 * 1000;
	atomic_store(&sf_fake_now, later);
	allot__store_usage(st, "svc", "q", 5, 0, 5, 1);
	allot__store_event(st, "stop", NULL, NULL);
	sf_flush_ok(st);
	/* One chunk per table per flush. */
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM usage"), 21 - 7);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM events"), 21 - 7);
	ck_assert_int_eq(
	    sf_q_int("SELECT count(*) FROM share_history"), 20 - 7);
	/* A full chunk means more is due: the next flushes continue. */
	for (int i = 0; i < 5; i++)
		sf_flush_ok(st);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM usage"), 1);
	ck_assert_int_eq(sf_q_int("SELECT admitted FROM usage"), 5);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM events"), 1);
	ck_assert_str_eq(sf_q_text("SELECT kind FROM events"), "stop");
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM share_history"), 0);
	/* Current state is not history: replicas and shares stay. */
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM replicas"), 1);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM shares"), 1);
	ck_assert_uint_eq(sf_stats(st).retention_deleted, 60);

	/* Old rows that appear now wait for the next pass, a minute on. */
	sqlite3 *aux = sf_aux_open();
	sf_aux_exec(aux, "INSERT INTO events (at, kind) VALUES (1, 'old')");
	sqlite3_close(aux);
	atomic_store(&sf_fake_now, later + 30000);
	sf_flush_ok(st);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM events"), 2);
	atomic_store(&sf_fake_now, later + 61000);
	sf_flush_ok(st);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM events"), 1);
	ck_assert_uint_eq(sf_stats(st).retention_deleted, 61);
	allot__store_close(st);
}
END_TEST

START_TEST(retention_zero_keeps_everything)
{
	allot__store_opts o;
	allot__store_opts_default(&o);
	o.retention_s = 0;
	allot__store *st = sf_open_with(&o);
	allot__store_usage(st, "svc", "q", 1, 0, 1, 1);
	sf_flush_ok(st);
	atomic_store(&sf_fake_now, T0 + INT64_C(400) * 24 * 3600 * 1000);
	allot__store_usage(st, "svc", "q", 1, 0, 1, 1);
	sf_flush_ok(st);
	sf_flush_ok(st);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM usage"), 2);
	allot__store_close(st);
}
END_TEST

/* ---- bound ---- */

START_TEST(max_pending_drops_oldest_usage)
{
	allot__store_opts o;
	allot__store_opts_default(&o);
	o.max_pending = 10;
	o.busy_timeout_ms = 10;
	allot__store *st = sf_open_with(&o);
	allot__store_event(st, "start", NULL, NULL);
	allot__store_replica_joined(st, 1, "r", "svc", "h", 1, "v", 0);
	allot__store_event(st, "x", NULL, NULL);
	for (int i = 0; i < 15; i++) {
		atomic_store(&sf_fake_now, T0 + i * 1000);
		allot__store_usage(st, "svc", "q", (uint64_t) i, 0, 0, 1);
	}
	allot__store_stats s = sf_stats(st);
	ck_assert_uint_eq(s.rows_dropped, 8);
	ck_assert_uint_eq(s.pending, 10);
	sf_flush_ok(st);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM usage"), 7);
	ck_assert_int_eq(sf_q_int("SELECT min(admitted) FROM usage"), 8);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM events"), 2);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM replicas"), 1);
	ck_assert_ptr_nonnull(strstr(sf_logbuf, "ALLOT-STORE-DROP"));

	/* While commits fail, what is kept is trimmed at each flush; the
	 * newest usage survives and events are never dropped, even past
	 * the bound. */
	sqlite3 *aux = sf_aux_open();
	sf_aux_exec(aux, "BEGIN IMMEDIATE");
	for (int i = 0; i < 8; i++) {
		atomic_store(&sf_fake_now, T0 + 100000 + i * 1000);
		allot__store_usage(
		    st, "svc", "q", 100 + (uint64_t) i, 0, 0, 1);
		ck_assert_int_eq(allot__store_flush(st), ALLOT_EIO);
	}
	s = sf_stats(st);
	ck_assert_uint_eq(s.pending, 8);
	ck_assert_uint_eq(s.rows_dropped, 8);
	for (int i = 0; i < 6; i++) {
		atomic_store(&sf_fake_now, T0 + 200000 + i * 1000);
		allot__store_usage(
		    st, "svc", "q", 200 + (uint64_t) i, 0, 0, 1);
		allot__store_event(st, "e", NULL, NULL);
		ck_assert_int_eq(allot__store_flush(st), ALLOT_EIO);
	}
	s = sf_stats(st);
	/* 6 events + 4 newest usage rows = 10; 8 + 6 - 4 = 10 dropped. */
	ck_assert_uint_eq(s.pending, 10);
	ck_assert_uint_eq(s.rows_dropped, 8 + 10);
	for (int i = 0; i < 6; i++)
		allot__store_event(st, "e", NULL, NULL);
	ck_assert_int_eq(allot__store_flush(st), ALLOT_EIO);
	s = sf_stats(st);
	ck_assert_uint_eq(s.pending, 12);
	ck_assert_uint_eq(s.rows_dropped, 8 + 14);
	sf_aux_exec(aux, "ROLLBACK");
	sqlite3_close(aux);
	sf_flush_ok(st);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM events"), 2 + 12);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM usage"), 7);
	allot__store_close(st);
}
END_TEST

/* A large bound with many holes exercises compaction. */
START_TEST(max_pending_compacts)
{
	allot__store_opts o;
	allot__store_opts_default(&o);
	o.max_pending = 2000;
	allot__store *st = sf_open_with(&o);
	for (int i = 0; i < 50000; i++) {
		atomic_store(&sf_fake_now, T0 + (int64_t) i * 1000);
		/* (Fast even under valgrind: no SQL until the flush.) */
		allot__store_usage(st, "svc", (i & 1) ? "a" : "b", 1, 0, 0, 1);
	}
	allot__store_stats s = sf_stats(st);
	ck_assert_uint_eq(s.pending, 2000);
	ck_assert_uint_eq(s.rows_dropped, 48000);
	sf_flush_ok(st);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM usage"), 2000);
	ck_assert_int_eq(
	    sf_q_int("SELECT min(at) FROM usage"), T0 + INT64_C(48000) * 1000);
	allot__store_close(st);
}
END_TEST

/* ---- threads ---- */

#define THREADS 4
#define PER_THREAD (50000 / load_scale())

static void *
recorder(void *arg)
{
	allot__store *st = arg;
	char q[16];
	for (int i = 0; i < PER_THREAD; i++) {
		snprintf(q, sizeof q, "q%d", i % 50);
		allot__store_usage(st, "svc", q, 1, (uint64_t) (i & 1), 1, 1);
		if (i % 1000 == 0)
			allot__store_event(st, "tick", q, NULL);
	}
	return NULL;
}

START_TEST(concurrent_recorders_lose_nothing)
{
	allot__store *st = sf_open_with(NULL);
	/* The real clock: reports spread over whatever seconds pass. */
	allot__store_set_clock(st, NULL, NULL);
	pthread_t t[THREADS];
	for (int i = 0; i < THREADS; i++)
		ck_assert_int_eq(pthread_create(&t[i], NULL, recorder, st), 0);
	for (int i = 0; i < 20; i++) {
		sf_flush_ok(st);
		struct timespec ts = { 0, 2000000 };
		nanosleep(&ts, NULL);
	}
	for (int i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	sf_flush_ok(st);
	ck_assert_int_eq(
	    sf_q_int("SELECT sum(admitted) FROM usage"), THREADS * PER_THREAD);
	ck_assert_int_eq(sf_q_int("SELECT sum(denied) FROM usage"),
	    THREADS * PER_THREAD / 2);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM events"),
	    THREADS * ((PER_THREAD + 999) / 1000));
	allot__store_stats s = sf_stats(st);
	ck_assert_uint_eq(s.pending, 0);
	ck_assert_uint_eq(s.rows_dropped, 0);
	ck_assert_uint_eq(s.rows_rejected, 0);
	allot__store_close(st);
}
END_TEST

/* ---- throughput ---- */

START_TEST(throughput)
{
	/* Seconds of a busy coordinator: 200,000 key-reports over 5,000
	 * quotas from 40 replicas, each given a share back. The shares all
	 * change in rounds 0 and 1 (the worst case: each is an upsert plus
	 * a history row) and are re-issued unchanged in rounds 2 and 3 (the
	 * steady state: skipped). */
	allot__store *st = sf_open_store();
	enum { QUOTAS_MAX = 5000 };
	const int QUOTAS = QUOTAS_MAX / load_scale();
	const int REPORTS = 40 * QUOTAS;
	static char names[QUOTAS_MAX][24];
	for (int i = 0; i < QUOTAS; i++)
		snprintf(names[i], sizeof names[i], "caller-%d:api", i);
	for (int round = 0; round < 4; round++) {
		atomic_store(&sf_fake_now, T0 + round * 1000);
		double rate = round < 2 ? 2.5 + round : 3.5;
		uint64_t t0 = allot__mono_ns();
		for (int i = 0; i < REPORTS; i++) {
			const char *q = names[i % QUOTAS];
			allot__store_usage(st, "orders", q, 3, 1, 4, 40);
			allot__store_share(st, (uint64_t) (i / QUOTAS) + 1,
			    "orders", q, rate, 5, T0 + 5000);
		}
		uint64_t t1 = allot__mono_ns();
		allot__store_stats before = sf_stats(st);
		sf_flush_ok(st);
		uint64_t t2 = allot__mono_ns();
		allot__store_stats s = sf_stats(st);
		uint64_t rows = s.rows_written - before.rows_written;
		uint64_t same = s.shares_unchanged - before.shares_unchanged;
		ck_assert_uint_eq(rows + same, (uint64_t) (QUOTAS + REPORTS));
		ck_assert_uint_eq(same, round < 2 ? 0 : (uint64_t) REPORTS);
		fprintf(stderr,
		    "store throughput round %d: record %.0f "
		    "ns/call (usage + share); flush of %d key-reports: "
		    "%" PRIu64 " rows written, %" PRIu64 " unchanged shares "
		    "skipped, %.1f ms = %.0f key-reports/s\n",
		    round, (double) (t1 - t0) / (2.0 * REPORTS), REPORTS, rows,
		    same, (double) (t2 - t1) / 1e6,
		    (double) REPORTS * 1e9 / (double) (t2 - t1));
		/* Generous, for slow CI machines (valgrind is slower still
		 * and exempt): this only catches a flush gone quadratic. */
		if (load_scale() < 20)
			ck_assert_uint_lt(t2 - t1, 30000000000u);
	}
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM usage"), 4 * QUOTAS);
	ck_assert_int_eq(
	    sf_q_int("SELECT sum(admitted) FROM usage"), 4 * 3 * REPORTS);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM shares"), REPORTS);
	ck_assert_int_eq(
	    sf_q_int("SELECT count(*) FROM share_history"), 2 * REPORTS);
	allot__store_close(st);
}
END_TEST

void
store_running_tests(const store_tcases *tc)
{
	tcase_add_test(tc->failures, locked_database_keeps_rows);
	tcase_add_test(tc->failures, reader_does_not_block_flush);
	tcase_add_test(tc->failures, disk_full_keeps_rows);
	tcase_add_test(tc->retention, retention_deletes_old_rows_in_chunks);
	tcase_add_test(tc->retention, retention_zero_keeps_everything);
	tcase_add_test(tc->retention, max_pending_drops_oldest_usage);
	tcase_add_test(tc->retention, max_pending_compacts);
	tcase_add_test(tc->load, concurrent_recorders_lose_nothing);
	tcase_add_test(tc->load, throughput);
}
