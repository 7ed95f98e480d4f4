/* SPDX-License-Identifier: MIT */
/*
 * The coordinator's SQLite store (coordinator/store/store.c) against real files
 * in a fresh temporary directory per test (store_fixture.c). This file
 * has the suite and its first part: migrations set user_version and WAL;
 * recorded usage is summed per second and a second flushed twice adds
 * up; shadow and candidate would-denies land in their own columns (never
 * in denied), add up per second and across flushes, and a file of schema
 * 2 is migrated with its rows kept; shares keep a history of changes
 * only; every audit view answers its question (one of them through the
 * real sqlite3 shell); and a NULL store is harmless. The other parts:
 * restart and bad files (store_files.c), config changes
 * (store_config.c), failures while running, retention, the bound,
 * concurrent recorders and the flush throughput (store_running.c).
 */
#include <check.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "clock.h"
#include "runner.h"
#include "store/store.h"
#include "store_fixture.h"

static double
q_double(const char *sql)
{
	sqlite3 *db = sf_aux_open();
	sqlite3_stmt *s = NULL;
	ck_assert_int_eq(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
	ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
	double v = sqlite3_column_double(s, 0);
	sqlite3_finalize(s);
	sqlite3_close(db);
	return v;
}

/* ---- schema ---- */

START_TEST(migrations_apply)
{
	allot__store *st = sf_open_store();
	allot__store_close(st);
	ck_assert_int_eq(sf_q_int("PRAGMA user_version"), sf_schema_version());
	ck_assert_int_eq(sf_q_int("PRAGMA application_id"), 0x414c4f54);
	ck_assert_str_eq(sf_q_text("PRAGMA journal_mode"), "wal");
	const char *objects[] = { "replicas", "configs", "shares",
		"share_history", "usage", "events", "levels",
		"v_consumption_per_minute", "v_denied", "v_share_history",
		"v_replica_churn", "v_replica_lifetime", "v_live_replicas",
		"v_events", "v_configs", "v_levels", "config_changes",
		"quota_changes", "v_quota_changes", "v_shadow" };
	for (size_t i = 0; i < sizeof objects / sizeof objects[0]; i++) {
		char sql[200];
		snprintf(sql, sizeof sql,
		    "SELECT count(*) FROM sqlite_master "
		    "WHERE name = '%s'",
		    objects[i]);
		ck_assert_msg(sf_q_int(sql) == 1, "%s missing", objects[i]);
		snprintf(
		    sql, sizeof sql, "SELECT count(*) FROM %s", objects[i]);
		ck_assert_int_eq(sf_q_int(sql), 0);
	}
	ck_assert_ptr_nonnull(strstr(sf_logbuf, "ALLOT-STORE-MIGRATE"));
	ck_assert_ptr_nonnull(strstr(sf_logbuf, "002_audit_views.sql"));

	/* Reopening applies nothing again. */
	sf_loglen = 0;
	sf_logbuf[0] = '\0';
	st = sf_open_store();
	allot__store_close(st);
	ck_assert_ptr_null(strstr(sf_logbuf, "ALLOT-STORE-MIGRATE"));
	ck_assert_int_eq(sf_q_int("PRAGMA user_version"), sf_schema_version());
}
END_TEST

/* ---- records, aggregation and views ---- */

START_TEST(usage_aggregates_per_second)
{
	allot__store *st = sf_open_store();
	/* Three reports in one second, from replicas seeing 2 then 3. */
	allot__store_usage(st, "orders", "checkout", 10, 1, 11.0, 2);
	allot__store_usage(st, "orders", "checkout", 5, 0, 5.0, 3);
	atomic_store(&sf_fake_now, T0 + 999);
	allot__store_usage(st, "orders", "checkout", 1, 2, 3.0, 2);
	/* Another quota, and the same quota in the next second. */
	allot__store_usage(st, "orders", "search", 7, 0, 7.0, 1);
	atomic_store(&sf_fake_now, T0 + 1000);
	allot__store_usage(st, "orders", "checkout", 100, 50, 150.5, 3);
	ck_assert_uint_eq(sf_stats(st).pending, 3);
	sf_flush_ok(st);

	allot__store_stats s = sf_stats(st);
	ck_assert_uint_eq(s.commits, 1);
	ck_assert_uint_eq(s.rows_written, 3);
	ck_assert_uint_eq(s.pending, 0);
	ck_assert_uint_eq(s.commit_failures, 0);
	ck_assert(s.last_commit_ms > 0);

	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM usage"), 3);
	ck_assert_int_eq(sf_q_int("SELECT admitted FROM usage WHERE "
	                          "quota = 'checkout' AND at = 1700000000000"),
	    16);
	ck_assert_int_eq(sf_q_int("SELECT denied FROM usage WHERE "
	                          "quota = 'checkout' AND at = 1700000000000"),
	    3);
	ck_assert_double_eq_tol(
	    q_double("SELECT demand FROM usage WHERE "
	             "quota = 'checkout' AND at = 1700000000000"),
	    19.0, 1e-9);
	ck_assert_int_eq(sf_q_int("SELECT live_replicas FROM usage WHERE "
	                          "quota = 'checkout' AND at = 1700000000000"),
	    3);
	ck_assert_int_eq(sf_q_int("SELECT admitted FROM usage WHERE "
	                          "quota = 'checkout' AND at = 1700000001000"),
	    100);

	/* Both seconds fall in minute 22:13. */
	ck_assert_str_eq(
	    sf_q_text("SELECT minute FROM v_consumption_per_minute "
	              "WHERE quota = 'checkout'"),
	    "2023-11-14 22:13:00");
	ck_assert_int_eq(
	    sf_q_int("SELECT admitted FROM v_consumption_per_minute "
	             "WHERE quota = 'checkout'"),
	    116);
	ck_assert_int_eq(
	    sf_q_int("SELECT denied FROM v_consumption_per_minute "
	             "WHERE quota = 'checkout'"),
	    53);
	ck_assert_int_eq(
	    sf_q_int("SELECT count(*) FROM v_consumption_per_minute"), 2);
	/* v_denied lists only quotas with denials. */
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM v_denied"), 1);
	ck_assert_int_eq(sf_q_int("SELECT denied FROM v_denied"), 53);
	ck_assert_double_eq_tol(
	    q_double("SELECT denied_pct FROM v_denied"), 31.36, 1e-9);
	ck_assert_double_eq_tol(
	    q_double("SELECT denied_per_s FROM v_denied"), 26.5, 1e-9);
	ck_assert_str_eq(sf_q_text("SELECT last_denied FROM v_denied"),
	    "2023-11-14 22:13:21");
	allot__store_close(st);
}
END_TEST

START_TEST(same_second_flushed_twice_adds)
{
	allot__store *st = sf_open_store();
	allot__store_usage(st, "svc", "q", 10, 1, 11, 4);
	sf_flush_ok(st);
	allot__store_usage(st, "svc", "q", 5, 2, 7, 2);
	sf_flush_ok(st);
	allot__store_usage(st, "svc", "q", 1, 0, 1, 6);
	sf_flush_ok(st);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM usage"), 1);
	ck_assert_int_eq(sf_q_int("SELECT admitted FROM usage"), 16);
	ck_assert_int_eq(sf_q_int("SELECT denied FROM usage"), 3);
	ck_assert_double_eq_tol(
	    q_double("SELECT demand FROM usage"), 19, 1e-9);
	ck_assert_int_eq(sf_q_int("SELECT live_replicas FROM usage"), 6);
	ck_assert_uint_eq(sf_stats(st).commits, 3);
	allot__store_close(st);
}
END_TEST

/* ---- shadow and candidate columns (schema/004_shadow.sql) ---- */

START_TEST(usage_shadow_columns)
{
	allot__store *st = sf_open_store();
	/* A shadow quota: 100 admitted of which 30 shadow would-denies,
	 * and nothing denied; two reports in one second add up. */
	allot__store_usage_add(st, "orders", "batch",
	    &(allot__store_usage_row) { .admitted = 60,
	        .shadow_denied = 20,
	        .demand = 60,
	        .live_replicas = 2 });
	allot__store_usage_add(st, "orders", "batch",
	    &(allot__store_usage_row) { .admitted = 40,
	        .shadow_denied = 10,
	        .demand = 40,
	        .live_replicas = 2 });
	/* A quota with a candidate of 50/s: 5 + 3 would-denies, the newest
	 * candidate kept. */
	allot__store_usage_add(st, "orders", "checkout",
	    &(allot__store_usage_row) { .admitted = 90,
	        .denied = 10,
	        .candidate_denied = 5,
	        .candidate_rate = 40,
	        .live_replicas = 1 });
	allot__store_usage_add(st, "orders", "checkout",
	    &(allot__store_usage_row) { .candidate_denied = 3,
	        .candidate_rate = 50,
	        .live_replicas = 1 });
	/* The old call writes zeros and no candidate. */
	allot__store_usage(st, "orders", "search", 7, 1, 8, 1);
	sf_flush_ok(st);
	/* The same second flushed again adds up (the upsert). */
	allot__store_usage_add(st, "orders", "batch",
	    &(allot__store_usage_row) {
	        .admitted = 10, .shadow_denied = 10, .live_replicas = 1 });
	allot__store_usage_add(st, "orders", "checkout",
	    &(allot__store_usage_row) {
	        .admitted = 10, .candidate_denied = 2, .candidate_rate = 0 });
	sf_flush_ok(st);

	ck_assert_int_eq(sf_q_int("SELECT admitted FROM usage "
	                          "WHERE quota = 'batch'"),
	    110);
	ck_assert_int_eq(sf_q_int("SELECT shadow_denied FROM usage "
	                          "WHERE quota = 'batch'"),
	    40);
	ck_assert_int_eq(sf_q_int("SELECT denied FROM usage "
	                          "WHERE quota = 'batch'"),
	    0);
	ck_assert_int_eq(sf_q_int("SELECT candidate_denied FROM usage "
	                          "WHERE quota = 'checkout'"),
	    10);
	ck_assert_double_eq_tol(q_double("SELECT candidate_rate FROM usage "
	                                 "WHERE quota = 'checkout'"),
	    50, 1e-9);
	ck_assert_int_eq(sf_q_int("SELECT shadow_denied + candidate_denied "
	                          "FROM usage WHERE quota = 'search'"),
	    0);
	ck_assert_int_eq(
	    sf_q_int("SELECT count(*) FROM usage WHERE "
	             "quota = 'search' AND candidate_rate IS NULL"),
	    1);
	/* Shadow is not a denial: v_denied lists checkout and search
	 * only. */
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM v_denied"), 2);
	ck_assert_int_eq(
	    sf_q_int("SELECT count(*) FROM v_denied WHERE quota = 'batch'"),
	    0);
	/* v_shadow: one row per quota with shadow or a candidate. */
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM v_shadow"), 2);
	ck_assert_double_eq_tol(q_double("SELECT shadow_denied_pct FROM "
	                                 "v_shadow WHERE quota = 'batch'"),
	    36.36, 1e-9);
	ck_assert_double_eq_tol(
	    q_double("SELECT candidate_denied_pct FROM v_shadow "
	             "WHERE quota = 'checkout'"),
	    9.09, 1e-9);
	allot__store_close(st);
}
END_TEST

/* The text of schema/NAME. */
static char *
schema_text(const char *name)
{
	char path[512];
	snprintf(
	    path, sizeof path, "%s/../../schema/%s", ALLOT_TEST_DATA, name);
	static char buf[65536];
	size_t n = sf_read_file(path, buf, sizeof buf - 1);
	ck_assert_msg(n > 0, "cannot read %s", path);
	buf[n] = '\0';
	return buf;
}

START_TEST(schema2_file_migrated)
{
	/* A file written by an allotd of schema 2, with a usage row. */
	sqlite3 *db = sf_aux_open();
	sf_aux_exec(db, schema_text("001_initial.sql"));
	sf_aux_exec(db, schema_text("002_audit_views.sql"));
	sf_aux_exec(db,
	    "PRAGMA user_version = 2; "
	    "PRAGMA application_id = 1095520084;");
	sf_aux_exec(db,
	    "INSERT INTO usage (at, service, quota, admitted, "
	    "denied) VALUES (1700000000000, 'svc', 'q', 7, 3)");
	sqlite3_close(db);
	allot__store *st = sf_open_store();
	ck_assert_ptr_nonnull(strstr(sf_logbuf, "004_shadow.sql"));
	allot__store_usage_add(st, "svc", "q",
	    &(allot__store_usage_row) { .admitted = 1,
	        .shadow_denied = 1,
	        .candidate_denied = 4,
	        .candidate_rate = 9 });
	sf_flush_ok(st);
	allot__store_close(st);
	ck_assert_int_eq(sf_q_int("PRAGMA user_version"), sf_schema_version());
	ck_assert_int_eq(sf_q_int("SELECT admitted FROM usage"), 8);
	ck_assert_int_eq(sf_q_int("SELECT denied FROM usage"), 3);
	ck_assert_int_eq(sf_q_int("SELECT shadow_denied FROM usage"), 1);
	ck_assert_int_eq(sf_q_int("SELECT candidate_denied FROM usage"), 4);
}
END_TEST

START_TEST(replicas_configs_events_levels)
{
	allot__store *st = sf_open_store();
	allot__store_replica_joined(st, 1, "orders-7f9c", "orders", "node-a",
	    4242, "0.1.0", 0xdeadbeefcafef00dull);
	allot__store_replica_joined(st, 2, "orders-2b1d", "orders", "node-b",
	    77, "0.1.0", 0xdeadbeefcafef00dull);
	allot__store_config_loaded(st, 3, 0x0123456789abcdefull,
	    "/etc/allot/quotas.yaml", "quotas: {}\n");
	allot__store_event(st, "start", "allotd", "pid 1");
	allot__store_level(st, "orders", "checkout", 250.5);
	sf_flush_ok(st);

	atomic_store(&sf_fake_now, T0 + 65000);
	allot__store_replica_seen(st, 1);
	allot__store_replica_seen(st, 2);
	atomic_store(&sf_fake_now, T0 + 66000);
	allot__store_replica_seen(st, 2);
	allot__store_replica_left(st, 2, "expired");
	allot__store_level(st, "orders", "checkout", 10);
	allot__store_level(st, "orders", "checkout", 12.25);
	sf_flush_ok(st);

	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM replicas"), 2);
	ck_assert_str_eq(sf_q_text("SELECT config_digest FROM replicas "
	                           "WHERE session = 1"),
	    "deadbeefcafef00d");
	ck_assert_int_eq(
	    sf_q_int("SELECT pid FROM replicas WHERE session = 1"), 4242);
	ck_assert_int_eq(sf_q_int("SELECT last_seen FROM replicas "
	                          "WHERE session = 1"),
	    T0 + 65000);
	ck_assert_int_eq(sf_q_int("SELECT last_seen FROM replicas "
	                          "WHERE session = 2"),
	    T0 + 66000);
	ck_assert_int_eq(sf_q_int("SELECT left_at FROM replicas "
	                          "WHERE session = 2"),
	    T0 + 66000);
	ck_assert_str_eq(sf_q_text("SELECT left_why FROM replicas "
	                           "WHERE session = 2"),
	    "expired");
	ck_assert_str_eq(
	    sf_q_text("SELECT digest || ' ' || epoch || ' ' || path "
	              "|| ' ' || bytes FROM v_configs"),
	    "0123456789abcdef 3 /etc/allot/quotas.yaml 11");
	ck_assert_str_eq(
	    sf_q_text("SELECT content FROM configs"), "quotas: {}\n");
	ck_assert_str_eq(
	    sf_q_text("SELECT at || ' ' || kind || ' ' || subject "
	              "FROM v_events"),
	    "2023-11-14 22:13:20.000 start allotd");
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM levels"), 1);
	ck_assert_double_eq_tol(
	    q_double("SELECT level FROM levels"), 12.25, 1e-9);

	/* Live replicas and churn. */
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM v_live_replicas"), 1);
	ck_assert_str_eq(sf_q_text("SELECT replica_id FROM v_live_replicas"),
	    "orders-7f9c");
	ck_assert_int_eq(sf_q_int("SELECT joins FROM v_replica_churn "
	                          "WHERE minute = '2023-11-14 22:13:00'"),
	    2);
	ck_assert_int_eq(sf_q_int("SELECT expiries FROM v_replica_churn "
	                          "WHERE minute = '2023-11-14 22:14:00'"),
	    1);
	ck_assert_int_eq(sf_q_int("SELECT joins FROM v_replica_churn "
	                          "WHERE minute = '2023-11-14 22:14:00'"),
	    0);
	ck_assert_double_eq_tol(
	    q_double("SELECT lifetime_s FROM "
	             "v_replica_lifetime WHERE session = 2"),
	    66.0, 1e-9);

	/* A reason outside the schema's four is recorded as a leave (it
	 * would otherwise poison every later commit of its batch). */
	allot__store_replica_left(st, 1, "crashed");
	sf_flush_ok(st);
	ck_assert_str_eq(sf_q_text("SELECT left_why FROM replicas "
	                           "WHERE session = 1"),
	    "leave");
	allot__store_close(st);
}
END_TEST

START_TEST(share_history_on_change_only)
{
	allot__store *st = sf_open_store();
	allot__store_replica_joined(st, 5, "r5", "orders", "h", 1, "v", 0);
	allot__store_share(st, 5, "orders", "checkout", 50, 100, T0 + 5000);
	allot__store_share(st, 5, "orders", "search", 10, 10, T0 + 5000);
	sf_flush_ok(st);
	/* Same share, lease extended: not rewritten within the refresh
	 * period (10 s by default), then rewritten, never history. */
	atomic_store(&sf_fake_now, T0 + 1000);
	allot__store_share(st, 5, "orders", "checkout", 50, 100, T0 + 6000);
	sf_flush_ok(st);
	ck_assert_uint_eq(sf_stats(st).shares_unchanged, 1);
	ck_assert_int_eq(sf_q_int("SELECT lease_until FROM shares "
	                          "WHERE quota = 'checkout'"),
	    T0 + 5000);
	atomic_store(&sf_fake_now, T0 + 10000);
	allot__store_share(
	    st, 5, "orders", "checkout", 50.00000001, 100, T0 + 15000);
	sf_flush_ok(st);
	ck_assert_uint_eq(sf_stats(st).shares_unchanged, 1);
	ck_assert_int_eq(sf_q_int("SELECT lease_until FROM shares "
	                          "WHERE quota = 'checkout'"),
	    T0 + 15000);
	ck_assert_int_eq(sf_q_int("SELECT updated_at FROM shares "
	                          "WHERE quota = 'checkout'"),
	    T0 + 10000);
	/* Rate changes twice within one flush: the last value counts. */
	atomic_store(&sf_fake_now, T0 + 12000);
	allot__store_share(st, 5, "orders", "checkout", 70, 100, T0 + 17000);
	allot__store_share(st, 5, "orders", "checkout", 75, 100, T0 + 17000);
	sf_flush_ok(st);

	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM shares"), 2);
	ck_assert_double_eq_tol(q_double("SELECT rate FROM shares "
	                                 "WHERE quota = 'checkout'"),
	    75, 1e-9);
	ck_assert_int_eq(sf_q_int("SELECT lease_until FROM shares "
	                          "WHERE quota = 'checkout'"),
	    T0 + 17000);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM share_history "
	                          "WHERE quota = 'checkout'"),
	    2);
	ck_assert_int_eq(
	    sf_q_int("SELECT count(*) FROM v_share_history "
	             "WHERE quota = 'checkout' AND replica_id = 'r5'"),
	    2);
	ck_assert_str_eq(
	    sf_q_text(
	        "SELECT group_concat(rate, ',') FROM "
	        "(SELECT rate FROM v_share_history WHERE quota = 'checkout' "
	        "ORDER BY at_ms)"),
	    "50.0,75.0");
	ck_assert_str_eq(sf_q_text("SELECT at FROM v_share_history "
	                           "WHERE rate = 75"),
	    "2023-11-14 22:13:32");

	/* A leave removes the current shares, keeps the history; the same
	 * session joining again (as after a restart) gets its rows back,
	 * even with unchanged values. */
	allot__store_replica_left(st, 5, "leave");
	sf_flush_ok(st);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM shares"), 0);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM share_history"), 3);
	allot__store_replica_joined(st, 5, "r5", "orders", "h", 1, "v", 0);
	allot__store_share(st, 5, "orders", "checkout", 75, 100, T0 + 17000);
	sf_flush_ok(st);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM shares"), 1);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM share_history"), 4);
	allot__store_close(st);
}
END_TEST

/* The view as an operator would see it, through the sqlite3 shell. */
START_TEST(views_through_sqlite3_shell)
{
	allot__store *st = sf_open_store();
	allot__store_usage(st, "orders", "checkout", 30, 4, 34, 2);
	allot__store_usage(st, "orders", "export", 3, 9, 12, 2);
	atomic_store(&sf_fake_now, T0 + 60000);
	allot__store_usage(st, "orders", "checkout", 20, 0, 20, 2);
	sf_flush_ok(st);
	/* The store stays open: WAL lets the shell read alongside it. */
	ck_assert_int_eq(system("command -v sqlite3 >/dev/null 2>&1"), 0);
	char cmd[1024];
	snprintf(cmd, sizeof cmd,
	    "sqlite3 -separator '|' '%s' "
	    "\"SELECT service, quota, minute, admitted, denied FROM "
	    "v_consumption_per_minute ORDER BY minute, quota; "
	    "SELECT quota, denied, denied_pct FROM v_denied;\"",
	    sf_dbpath);
	FILE *p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	char out[2048];
	size_t n = fread(out, 1, sizeof out - 1, p);
	out[n] = '\0';
	ck_assert_int_eq(pclose(p), 0);
	ck_assert_str_eq(out,
	    "orders|checkout|2023-11-14 22:13:00|30|4\n"
	    "orders|export|2023-11-14 22:13:00|3|9\n"
	    "orders|checkout|2023-11-14 22:14:00|20|0\n"
	    "export|9|75.0\n"
	    "checkout|4|7.41\n");
	allot__store_close(st);
}
END_TEST

START_TEST(null_store_is_harmless)
{
	allot__store_close(NULL);
	allot__store_usage(NULL, "a", "b", 1, 1, 1, 1);
	allot__store_event(NULL, "a", NULL, NULL);
	allot__store_replica_seen(NULL, 1);
	ck_assert_int_eq(allot__store_flush(NULL), ALLOT_EINVAL);
	ck_assert_uint_eq(allot__store_max_session(NULL), 0);
	char err[64];
	ck_assert_int_eq(
	    allot__store_open(NULL, NULL, NULL, err, sizeof err, NULL),
	    ALLOT_EINVAL);
	int64_t w = allot__wall_ms();
	ck_assert_int_gt(w, T0);
}
END_TEST

static Suite *
store_suite(void)
{
	Suite *s = suite_create("store");
	store_tcases tc;
	struct {
		const char *name;
		TCase **tc;
	} rows[] = {
		{ "schema", &tc.schema },
		{ "records", &tc.records },
		{ "restart", &tc.restart },
		{ "bad files", &tc.bad_files },
		{ "failures", &tc.failures },
		{ "retention and bound", &tc.retention },
		{ "load", &tc.load },
	};
	for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
		*rows[i].tc = tcase_create(rows[i].name);
		tcase_add_checked_fixture(*rows[i].tc, sf_setup, sf_teardown);
		suite_add_tcase(s, *rows[i].tc);
	}
	tcase_set_timeout(tc.load, 600);

	tcase_add_test(tc.schema, migrations_apply);
	tcase_add_test(tc.records, usage_aggregates_per_second);
	tcase_add_test(tc.records, same_second_flushed_twice_adds);
	tcase_add_test(tc.records, usage_shadow_columns);
	tcase_add_test(tc.records, schema2_file_migrated);
	tcase_add_test(tc.records, replicas_configs_events_levels);
	tcase_add_test(tc.records, share_history_on_change_only);
	tcase_add_test(tc.records, views_through_sqlite3_shell);
	tcase_add_test(tc.records, null_store_is_harmless);
	/* After this file's: each TCase keeps the order it had. */
	store_files_tests(&tc);
	store_config_tests(&tc);
	store_running_tests(&tc);
	return s;
}

ALLOT_TEST_MAIN(store_suite)
