/* SPDX-License-Identifier: MIT */
/*
 * Who was throttled (docs/operations.md): identities the quota file does
 * not name all charge the default quota, and allotd's audit names them
 * anyway. An agent's Syncs carry the unknown identities that asked the
 * most (Sync.strangers, agent/strangers.c); allotd writes the most
 * denied of each second as `unknown_caller` events, summed per minute by
 * v_unknown_callers (coordinator/state/strangers.c). Against a real
 * allotd and its SQLite file: the noisy stranger is named with what its
 * agent decided; a hostile Sync naming more strangers than allowed, or
 * names a Register would refuse, is held to its bound.
 */
#include <check.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>

#include "allotd.h"
#include "keymodel.h"
#include "proc.h"
#include "proto_client.h"
#include "runner.h"

static const char *CFG =
    "quotas:\n"
    "  default: {tokens_per_second: 1, burst: 2}\n"
    "  endpoint_weights: {default: 1, /x: 1}\n"
    "  callers:\n"
    "    - {identity: a, tokens_per_second: 100, burst: 100}\n";

/* allotd's file, read-only, waiting out its writer. */
static sqlite3 *
open_ro(const pc_coord *c)
{
	sqlite3 *db;
	ck_assert_int_eq(
	    sqlite3_open_v2(c->db, &db, SQLITE_OPEN_READONLY, NULL),
	    SQLITE_OK);
	sqlite3_busy_timeout(db, 5000);
	return db;
}

/* v_unknown_callers' sums for `identity` (-1, -1 when it has no row). */
static void
named(const pc_coord *c, const char *identity, long *ret_admitted,
    long *ret_denied)
{
	sqlite3 *db = open_ro(c);
	sqlite3_stmt *st;
	*ret_admitted = *ret_denied = -1;
	ck_assert_int_eq(sqlite3_prepare_v2(db,
	                     "SELECT sum(admitted), sum(denied), count(*) "
	                     "FROM v_unknown_callers WHERE identity = ?1",
	                     -1, &st, NULL),
	    SQLITE_OK);
	sqlite3_bind_text(st, 1, identity, -1, SQLITE_STATIC);
	if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_int(st, 2) > 0) {
		*ret_admitted = (long) sqlite3_column_int64(st, 0);
		*ret_denied = (long) sqlite3_column_int64(st, 1);
	}
	sqlite3_finalize(st);
	sqlite3_close(db);
}

/* How many unknown_caller events name a stranger of `service`. */
static long
rows_of(const pc_coord *c, const char *service)
{
	sqlite3 *db = open_ro(c);
	sqlite3_stmt *st;
	ck_assert_int_eq(sqlite3_prepare_v2(db,
	                     "SELECT count(*) FROM events WHERE kind = "
	                     "'unknown_caller' AND json_extract(detail, "
	                     "'$.service') = ?1",
	                     -1, &st, NULL),
	    SQLITE_OK);
	sqlite3_bind_text(st, 1, service, -1, SQLITE_STATIC);
	long n = sqlite3_step(st) == SQLITE_ROW ?
	    (long) sqlite3_column_int64(st, 0) :
	    -1;
	sqlite3_finalize(st);
	sqlite3_close(db);
	return n;
}

/* A noisy unregistered caller and a quiet one on a replica: both named,
 * with what the agent decided for them. */
START_TEST(strangers_named)
{
	pc_coord c;
	pc_coord_init(&c, "/tmp/allot-strangers", CFG);
	const char *args[] = { "--interval-ms", "50", NULL };
	pc_coord_spawn(&c, args, NULL);
	allot_agent *a = km_remote_agent(&c, "r0", CFG);
	km_synced(&a, 1);
	/* Both charge the default quota (burst 2): the quiet one's single
	 * request first, then at most one of the noisy one's 50 pass. */
	ck_assert(km_ask(a, "spiffe://quiet/one", NULL, NULL));
	int ok = km_admitted(a, "spiffe://noisy/backfill", "/x", 50);
	long adm = -1, den = -1;
	uint64_t end = pc_now_ms() + 10000;
	while ((adm < 0 || adm + den < 50) && pc_now_ms() < end) {
		pc_sleep_ms(200);
		named(&c, "spiffe://noisy/backfill", &adm, &den);
	}
	fprintf(stderr,
	    "strangers: the noisy caller admitted %d of 50 on the agent; "
	    "the audit names it with %ld admitted, %ld denied\n",
	    ok, adm, den);
	ck_assert_int_eq(adm, ok);
	ck_assert_int_eq(den, 50 - ok);
	end = pc_now_ms() + 5000;
	for (;;) {
		named(&c, "spiffe://quiet/one", &adm, &den);
		if (adm >= 1 || pc_now_ms() >= end)
			break;
		pc_sleep_ms(100);
	}
	ck_assert_int_eq(adm, 1);
	ck_assert_int_eq(den, 0);
	/* A configured caller is never a stranger. */
	ck_assert_int_eq(km_admitted(a, "a", "/x", 10), 10);
	pc_sleep_ms(1500);
	named(&c, "a", &adm, &den);
	ck_assert_int_eq(adm, -1);
	allot_agent_destroy(a);
	pc_coord_done(&c, 5000);
}
END_TEST

/* A hostile Sync: 40 strangers, some with names a Register would refuse
 * (a control character, 300 bytes). allotd notes the first 8 and skips
 * the bad names; each second it writes at most 16 rows. */
START_TEST(hostile_strangers_bounded)
{
	pc_coord c;
	pc_coord_init(&c, "/tmp/allot-strangers", CFG);
	const char *args[] = { "--interval-ms", "50", NULL };
	pc_coord_spawn(&c, args, NULL);
	static const char *const keys[] = { "default" };
	pc_replica r;
	memset(&r, 0, sizeof r);
	ck_assert_int_eq(
	    pc_replica_join(&r, c.url, "liar", "svc2", keys, 1), 0);
	char names[40][320];
	Allot__V1__Stranger m[40], *p[40];
	for (int round = 0; round < 3; round++) {
		for (int i = 0; i < 40; i++) {
			allot__v1__stranger__init(&m[i]);
			if (i == 1)
				snprintf(
				    names[i], sizeof names[i], "bad\tname");
			else if (i == 2) {
				memset(names[i], 'x', 300);
				names[i][300] = '\0';
			} else
				snprintf(names[i], sizeof names[i],
				    "spiffe://fake/%d-%d", round, i);
			m[i].identity = names[i];
			m[i].endpoint = (char *) "";
			m[i].denied = 1000000;
			p[i] = &m[i];
		}
		Allot__V1__Sync sy = ALLOT__V1__SYNC__INIT;
		sy.n_strangers = 40;
		sy.strangers = p;
		Allot__V1__Envelope *e = pc_replica_send(&r, &sy, 50);
		ck_assert_ptr_nonnull(e);
		ck_assert_int_eq(
		    e->body_case, ALLOT__V1__ENVELOPE__BODY_REPLY);
		pc_free(e);
		pc_sleep_ms(1100);
	}
	long n = -1, bad = 0;
	uint64_t end = pc_now_ms() + 5000;
	while (n < 3 * 6 && pc_now_ms() < end) {
		pc_sleep_ms(200);
		n = rows_of(&c, "svc2");
	}
	long a1, d1, a2, d2;
	named(&c, "bad\tname", &a1, &d1);
	memset(names[0], 'x', 300);
	names[0][300] = '\0';
	named(&c, names[0], &a2, &d2);
	bad = (a1 >= 0) + (a2 >= 0);
	fprintf(stderr,
	    "strangers: 3 Syncs naming 40 each (2 bad names): %ld rows, %ld "
	    "with a bad name\n",
	    n, bad);
	/* The first 8 of each, less the 2 bad names: 6 a Sync. */
	ck_assert_int_eq(n, 3 * 6);
	ck_assert_int_eq(bad, 0);
	pc_replica_close(&r);
	pc_coord_done(&c, 5000);
}
END_TEST

static Suite *
strangers_suite(void)
{
	Suite *s = suite_create("strangers");
	TCase *tc = tcase_create("allotd");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, strangers_named);
	tcase_add_test(tc, hostile_strangers_bounded);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(strangers_suite)
