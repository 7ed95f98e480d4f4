/* SPDX-License-Identifier: MIT */
/*
 * Integration tests of allotd: each test starts the real daemon (built
 * next to this test) on free loopback ports with a temporary quota file
 * and database, and drives it with the raw protocol client over nng req0.
 * This file has the suite and allotd's life: the command line, SIGHUP
 * reloads (bad file kept out, good file a new epoch), leaving and the
 * ipc:// listener, SIGTERM drains with exit 0 and a "stop" event
 * readable with the sqlite3 shell, and restart with restored
 * placeholders. The other cases are in coord_shares.c (shares that follow
 * the replica count, shadow would-denies counted apart, the allocator's
 * static split in-process), coord_wire.c (hostile and malformed input,
 * Reply semantics, a throughput measurement) and coord_config.c (the
 * config plane), on the harness of coord_harness.c. Every wait is
 * bounded.
 */
#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "allotd.h"
#include "coord_harness.h"
#include "proc.h"
#include "proto_client.h"
#include "runner.h"

static const char cfg_bad[] = "quotas:\n"
                              "  default:\n"
                              "    tokens_per_second: -5\n"
                              "    burst: 20\n";

START_TEST(test_cli)
{
	coord c;
	coord_init(&c, cfg_bad);
	char cmd[600];
	snprintf(cmd, sizeof cmd, "'%s' --help", pc_allotd_path());
	char *out = pc_shell(cmd);
	ck_assert_ptr_nonnull(out);
	ck_assert_ptr_nonnull(strstr(out, "SYNOPSIS"));
	ck_assert_ptr_nonnull(strstr(out, "--expiry-intervals"));
	free(out);

	/* Missing --db: usage error 2. */
	char *const argv1[] = { (char *) pc_allotd_path(), "--config", c.cfg,
		NULL };
	pid_t p = pc_spawn(argv1, c.log);
	ck_assert_int_eq(pc_wait_exit(p, 5000), 2);

	/* A bad quota file: 2, and the loader's FILE:LINE message. */
	char *const argv2[] = { (char *) pc_allotd_path(), "--config", c.cfg,
		"--db", c.db, "--listen", "tcp://127.0.0.1:1", "--http", "off",
		NULL };
	p = pc_spawn(argv2, c.log);
	ck_assert_int_eq(pc_wait_exit(p, 5000), 2);
	ck_assert(coord_log_contains(&c, "ALLOTD-CONFIG-FAIL"));
	char where[256];
	snprintf(where, sizeof where, "%s:3:", c.cfg);
	ck_assert_msg(
	    coord_log_contains(&c, where), "no %s in the log", where);

	/* A bad option value. */
	char *const argv3[] = { (char *) pc_allotd_path(), "--config", c.cfg,
		"--db", c.db, "--workers", "0", NULL };
	p = pc_spawn(argv3, c.log);
	ck_assert_int_eq(pc_wait_exit(p, 5000), 2);
	coord_done(&c);
}
END_TEST

START_TEST(test_reload)
{
	coord c;
	coord_init(&c, coord_cfg_good);
	coord_start(&c, NULL);
	pc_replica r;
	coord_join(&r, &c, "solo");
	ck_assert_double_eq_tol(r.rate[1], RA, EPS);

	/* A bad file: the loader's precise error, the old config kept. */
	pc_write_file(c.cfg, cfg_bad);
	kill(c.pid, SIGHUP);
	uint64_t t0 = pc_now_ms();
	while (!coord_log_contains(&c, "ALLOTD-RELOAD-FAIL")) {
		ck_assert_msg(pc_now_ms() - t0 < 3000, "no reload failure");
		pc_sleep_ms(20);
	}
	char where[256];
	snprintf(where, sizeof where, "%s:3:", c.cfg);
	ck_assert_msg(
	    coord_log_contains(&c, where), "no %s in the log", where);
	coord_sync_ok(&r);
	ck_assert_uint_eq(r.epoch, 1);
	ck_assert_double_eq_tol(r.rate[1], RA, EPS);
	ck_assert_double_eq(coord_metric(&c, "allotd_config_epoch"), 1);
	ck_assert_double_eq(
	    coord_metric(&c, "allotd_config_reloads_total{result=\"fail\"}"),
	    1);

	/* A good file: new epoch, new shares on the next sync. */
	pc_write_file(c.cfg, coord_cfg_halved);
	kill(c.pid, SIGHUP);
	t0 = pc_now_ms();
	for (;;) {
		coord_sync_ok(&r);
		if (r.epoch == 2)
			break;
		ck_assert_msg(pc_now_ms() - t0 < 3000, "epoch did not change");
		pc_sleep_ms(20);
	}
	ck_assert_double_eq_tol(r.rate[1], 200.0, EPS);
	ck_assert_double_eq_tol(r.burst[1], 400.0, EPS);
	ck_assert_double_eq_tol(r.rate[2], 120.0, EPS);
	ck_assert_double_eq(coord_metric(&c, "allotd_config_epoch"), 2);
	ck_assert_double_eq(
	    coord_metric(
	        &c, "allotd_quota_tokens_per_second{quota=\"" QA "\"}"),
	    200);
	/* Reloading the same file is not a change. */
	kill(c.pid, SIGHUP);
	t0 = pc_now_ms();
	while (!coord_log_contains(&c, "ALLOTD-RELOAD-SAME")) {
		ck_assert_msg(pc_now_ms() - t0 < 3000, "no reload");
		pc_sleep_ms(20);
	}
	coord_sync_ok(&r);
	ck_assert_uint_eq(r.epoch, 2);

	pc_replica_close(&r);
	ck_assert_int_eq(pc_coord_stop(&c, SIGTERM, 5000), 0);
	coord_assert_sql(&c,
	    "SELECT group_concat(epoch) FROM "
	    "(SELECT epoch FROM configs ORDER BY id)",
	    "1,2");
	coord_assert_sql(&c,
	    "SELECT count(*) FROM events WHERE kind = "
	    "'config_rejected'",
	    "1");
	coord_done(&c);
}
END_TEST

START_TEST(test_leave_and_ipc)
{
	coord c;
	coord_init(&c, coord_cfg_good);
	const char *extra[] = { "--listen", NULL, NULL };
	/* coord_init set the ipc path; listen on it as well. */
	extra[1] = c.ipc;
	coord_start(&c, extra);
	pc_replica a, b;
	coord_join(&a, &c, "a");
	memset(&b, 0, sizeof b);
	ck_assert_int_eq(
	    pc_replica_join(&b, c.ipc, "b", SVC, coord_keys, NKEYS), 0);
	ck_assert_uint_eq(b.replicas, 2);
	coord_sync_ok(&a);
	ck_assert_double_eq_tol(a.rate[1], RA / 2, EPS);

	Allot__V1__Envelope *e = pc_leave(&b.c, b.session, "shutting down");
	ck_assert_ptr_nonnull(e);
	ck_assert_int_eq(e->body_case, ALLOT__V1__ENVELOPE__BODY_REPLY);
	ck_assert_uint_eq(e->reply->replicas, 1);
	ck_assert_uint_eq(e->reply->lease_ms, 0);
	ck_assert(e->reply->full);
	ck_assert_uint_eq(e->reply->n_shares, 0);
	pc_free(e);
	coord_sync_ok(&a);
	ck_assert_uint_eq(a.replicas, 1);
	ck_assert_double_eq_tol(a.rate[1], RA, EPS);
	ck_assert_int_eq(pc_replica_sync(&b, NULL, 0, NULL),
	    ALLOT__V1__ERROR__CODE__UNKNOWN_SESSION);
	coord_expect_error(pc_leave(&b.c, b.session, "again"),
	    ALLOT__V1__ERROR__CODE__UNKNOWN_SESSION);
	ck_assert_double_eq(coord_metric(&c, "allotd_leaves_total"), 1);

	pc_replica_close(&a);
	pc_replica_close(&b);
	ck_assert_int_eq(pc_coord_stop(&c, SIGTERM, 5000), 0);
	coord_assert_sql(&c,
	    "SELECT left_why FROM replicas WHERE replica_id = 'b'", "leave");
	coord_assert_sql(&c,
	    "SELECT count(*) FROM events WHERE kind = 'leave' AND "
	    "detail LIKE '%reason=shutting down%'",
	    "1");
	coord_done(&c);
}
END_TEST

START_TEST(test_sigterm_and_audit)
{
	coord c;
	coord_init(&c, coord_cfg_good);
	coord_start(&c, NULL);
	pc_replica a, b;
	coord_join(&a, &c, "a");
	coord_join(&b, &c, "b");
	for (int i = 0; i < 3; i++) {
		pc_report ra = {
			.key = 1, .consumed = 30, .held = 100, .demand = 300
		};
		pc_report rb[2] = { { .key = 1, .consumed = 10, .denied = 5 },
			{ .key = 0, .consumed = 2 } };
		ck_assert_int_eq(pc_replica_sync(&a, &ra, 1, NULL), 0);
		ck_assert_int_eq(pc_replica_sync(&b, rb, 2, NULL), 0);
	}
	/* Stay alive through a per-second pass (usage rows, levels, one
	 * group commit) with empty syncs. */
	uint64_t t0 = pc_now_ms();
	while (pc_now_ms() - t0 < 1200) {
		ck_assert_int_eq(pc_replica_sync(&a, NULL, 0, NULL), 0);
		ck_assert_int_eq(pc_replica_sync(&b, NULL, 0, NULL), 0);
		pc_sleep_ms(100);
	}
	ck_assert(coord_metric(&c, "allotd_store_commit_seconds_count") >= 1);
	ck_assert_double_eq(
	    coord_metric(&c, "allotd_store_commit_failures_total"), 0);
	ck_assert(coord_metric(&c, "allotd_syncs_total") >= 6 + 2 * 10);
	ck_assert(coord_metric(&c, "allotd_sync_latency_seconds_count") >= 8);

	ck_assert_int_eq(pc_coord_stop(&c, SIGTERM, 5000), 0);
	ck_assert(coord_log_contains(&c, "ALLOTD-DRAIN"));
	ck_assert(coord_log_contains(&c, "ALLOTD-STOP"));

	coord_assert_sql(
	    &c, "SELECT count(*) FROM events WHERE kind = 'stop'", "1");
	coord_assert_sql(
	    &c, "SELECT count(*) FROM events WHERE kind = 'start'", "1");
	coord_assert_sql(
	    &c, "SELECT count(*) FROM events WHERE kind = 'join'", "2");
	coord_assert_sql(&c,
	    "SELECT sum(admitted) || '/' || sum(denied) FROM usage "
	    "WHERE service = '" SVC "' AND quota = '" QA "'",
	    "120/15");
	coord_assert_sql(&c,
	    "SELECT sum(admitted) FROM usage WHERE quota = "
	    "'default'",
	    "6");
	coord_assert_sql(&c,
	    "SELECT sum(admitted) FROM v_consumption_per_minute "
	    "WHERE quota = '" QA "'",
	    "120");
	coord_assert_sql(
	    &c, "SELECT denied FROM v_denied WHERE quota = '" QA "'", "15");
	/* Sessions stay open across a stop; the shares table holds R/2. */
	coord_assert_sql(
	    &c, "SELECT count(*) FROM replicas WHERE left_at IS NULL", "2");
	coord_assert_sql(&c,
	    "SELECT round(sum(rate), 6) FROM shares WHERE quota = '" QA "'",
	    "400.0");
	coord_assert_sql(&c, "SELECT count(*) FROM configs", "1");
	coord_assert_sql(&c, "SELECT count(*) > 0 FROM levels", "1");
	pc_replica_close(&a);
	pc_replica_close(&b);
	coord_done(&c);
}
END_TEST

START_TEST(test_restart_restores_replicas)
{
	coord c;
	coord_init(&c, coord_cfg_good);
	coord_start(&c, NULL);
	pc_replica r[3];
	static const char *const ids[3] = { "x", "y", "z" };
	for (int i = 0; i < 3; i++)
		coord_join(&r[i], &c, ids[i]);
	uint64_t old_session = r[0].session;
	uint64_t max_session = r[2].session;
	ck_assert_int_eq(pc_coord_stop(&c, SIGTERM, 5000), 0);
	for (int i = 0; i < 3; i++)
		pc_replica_close(&r[i]);

	coord_start(&c, NULL);
	/* The old session is unknown to the new process. */
	pc_replica x;
	memset(&x, 0, sizeof x);
	ck_assert_int_eq(pc_open(&x.c, c.url, 5000), 0);
	x.session = old_session;
	x.seq = 10;
	ck_assert_int_eq(pc_replica_sync(&x, NULL, 0, NULL),
	    ALLOT__V1__ERROR__CODE__UNKNOWN_SESSION);
	/* Re-registering: y and z still count until they expire, so x is
	 * not handed the whole quota while they may hold theirs. */
	ck_assert_int_eq(
	    pc_replica_join(&x, c.url, "x", SVC, coord_keys, NKEYS), 0);
	ck_assert_uint_gt(x.session, max_session);
	ck_assert_uint_eq(x.replicas, 3);
	ck_assert_double_eq_tol(x.rate[1], RA / 3, EPS);
	uint64_t t0 = pc_now_ms();
	for (;;) {
		coord_sync_ok(&x);
		if (x.replicas == 1)
			break;
		/* They wait learn_ms (2 leases, 6 s): the longest an agent
		 * backs off before it comes back. */
		ck_assert_msg(pc_now_ms() - t0 < 9000, "placeholders stayed");
		pc_sleep_ms(50);
	}
	ck_assert_double_eq_tol(x.rate[1], RA, EPS);
	pc_replica_close(&x);
	ck_assert_int_eq(pc_coord_stop(&c, SIGTERM, 5000), 0);
	coord_assert_sql(&c,
	    "SELECT group_concat(replica_id || ':' || "
	    "coalesce(left_why, 'live')) FROM (SELECT * FROM replicas "
	    "ORDER BY session)",
	    "x:replaced,y:expired,z:expired,x:live");
	coord_assert_sql(
	    &c, "SELECT count(*) FROM events WHERE kind = 'expiry'", "2");
	coord_assert_sql(
	    &c, "SELECT count(*) FROM events WHERE kind = 'restore'", "1");
	coord_done(&c);
}
END_TEST

static Suite *
coordinator_suite(void)
{
	Suite *s = suite_create("coordinator");
	TCase *tc = tcase_create("allotd");
	tcase_set_timeout(tc, 60);
	tcase_add_unchecked_fixture(
	    tc, coord_suite_setup, coord_suite_teardown);
	tcase_add_test(tc, test_cli);
	tcase_add_test(tc, test_reload);
	tcase_add_test(tc, test_leave_and_ipc);
	tcase_add_test(tc, test_sigterm_and_audit);
	tcase_add_test(tc, test_restart_restores_replicas);
	coord_share_cases(tc); /* coord_shares.c */
	coord_wire_cases(tc); /* coord_wire.c */
	coord_config_cases(tc); /* coord_config.c */
	suite_add_tcase(s, tc);
	TCase *unit = tcase_create("alloc");
	coord_alloc_cases(unit); /* coord_shares.c */
	suite_add_tcase(s, unit);
	return s;
}

ALLOT_TEST_MAIN(coordinator_suite)
