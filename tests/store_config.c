/* SPDX-License-Identifier: MIT */
/*
 * The store suite's config changes (v_quota_changes; tests/test_store.c
 * has the suite): a change and its quota rows are linked, survive a
 * failed commit and read back through the view; the text of every field
 * a quota can carry; a service's own quota is a row of its own.
 */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "config.h"
#include "config_diff.h"
#include "store/store.h"
#include "store_fixture.h"

/* ---- config changes (v_quota_changes) ---- */

static allot_config *
parse(const char *text)
{
	char err[256] = "";
	allot_config *cfg = NULL;
	ck_assert_msg(allot_config_parse("t.yaml", text, strlen(text), err,
	                  sizeof err, &cfg) == ALLOT_OK,
	    "%s", err);
	return cfg;
}

#define Q_HEAD                                                            \
	"quotas:\n  default:\n    tokens_per_second: 10\n    burst: 20\n" \
	"  callers:\n"

/* A change and its quota rows are linked, survive a failed commit (the
 * retry merges them with what came after) and read back through the
 * view; the last config is what a restart reads for its epoch. */
START_TEST(config_changes_recorded)
{
	allot__store *st = sf_open_store();
	uint64_t e = 0, dg = 0;
	char *text = NULL;
	ck_assert_int_eq(
	    allot__store_last_config(st, &e, &dg, &text), ALLOT_ENOENT);
	allot_config *a = parse(Q_HEAD "    - identity: spiffe://t/a\n"
	                               "      tokens_per_second: 500\n"
	                               "      burst: 1000\n"
	                               "    - identity: spiffe://t/gone\n"
	                               "      tokens_per_second: 5\n"
	                               "      burst: 5\n");
	allot_config *b = parse(Q_HEAD "    - identity: spiffe://t/a\n"
	                               "      tokens_per_second: 400\n"
	                               "      burst: 1000\n"
	                               "      priority: critical\n"
	                               "    - identity: spiffe://t/new\n"
	                               "      tokens_per_second: 1\n"
	                               "      burst: 2\n");
	allot__config_diff d1, d2;
	ck_assert_int_eq(allot__config_diff_compute(NULL, a, &d1), ALLOT_OK);
	ck_assert_int_eq(allot__config_diff_compute(a, b, &d2), ALLOT_OK);
	/* default, a, gone, and the three whole-file settings. */
	ck_assert_uint_eq(d1.n, 6);
	/* a changed, new added, gone removed. */
	ck_assert_uint_eq(d2.n, 3);

	allot__store_change c1 = { .epoch = 1,
		.digest = a->digest,
		.who = "start",
		.reason = "the first config of an empty store" };
	allot__store_config_loaded(st, 1, a->digest, "q.yaml", "first");
	allot__store_config_change(st, &c1, &d1);
	sf_flush_ok(st);

	/* The second change waits behind an auditor's write lock. */
	sqlite3 *aux = sf_aux_open();
	sf_aux_exec(aux, "BEGIN EXCLUSIVE");
	allot__store_change c2 = { .epoch = 2,
		.digest = b->digest,
		.who = "alice",
		.claimed_as = "bob",
		.reason = "Q3 launch",
		.source = "new.yaml" };
	allot__store_config_loaded(st, 2, b->digest, "q.yaml", "second");
	allot__store_config_change(st, &c2, &d2);
	ck_assert_int_eq(allot__store_flush(st), ALLOT_EIO);
	allot__store_event(st, "config", "q.yaml", NULL);
	ck_assert_int_eq(allot__store_flush(st), ALLOT_EIO);
	sf_aux_exec(aux, "ROLLBACK");
	sqlite3_close(aux);
	sf_flush_ok(st);

	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM config_changes"), 2);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM v_quota_changes"), 9);
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM v_quota_changes"
	                          " WHERE epoch = 2 AND who ="
	                          " 'alice (as bob, claimed)'"
	                          " AND reason = 'Q3 launch'"),
	    3);
	ck_assert_str_eq(sf_q_text("SELECT before || ' => ' || after || ' | ' "
	                           "|| fields FROM v_quota_changes "
	                           "WHERE epoch = 2 AND action = 'changed'"),
	    "500/s burst 1000 low => 400/s burst 1000 critical | "
	    "rate 500/s -> 400/s; priority low -> critical");
	ck_assert_str_eq(sf_q_text("SELECT action || ' ' || before FROM "
	                           "v_quota_changes WHERE quota = "
	                           "'spiffe://t/gone' AND epoch = 2"),
	    "removed 5/s burst 5 low");
	ck_assert_str_eq(sf_q_text("SELECT action || ' ' || after FROM "
	                           "v_quota_changes WHERE quota = "
	                           "'spiffe://t/new'"),
	    "added 1/s burst 2 low");
	ck_assert_int_eq(sf_q_int("SELECT count(*) FROM v_quota_changes "
	                          "WHERE epoch = 1 AND who = 'start' "
	                          "AND before IS NULL"),
	    6);

	ck_assert_int_eq(
	    allot__store_last_config(st, &e, &dg, &text), ALLOT_OK);
	ck_assert_uint_eq(e, 2);
	ck_assert_uint_eq(dg, b->digest);
	ck_assert_str_eq(text, "second");
	free(text);
	allot__config_diff_free(&d1);
	allot__config_diff_free(&d2);
	allot_config_free(a);
	allot_config_free(b);
	allot__store_close(st);
}
END_TEST

/* The text of every field a quota can carry (those the loader of this
 * version may not fill yet are set by hand), and the whole-file
 * settings. */
START_TEST(config_diff_text)
{
	allot_config *a = parse(Q_HEAD "    - identity: spiffe://t/a\n"
	                               "      tokens_per_second: 500\n"
	                               "      burst: 1000\n"
	                               "      priority: critical\n");
	allot_config *b = allot__config_dup(a);
	ck_assert_ptr_nonnull(b);
	allot__quota *q = &b->callers[0];
	q->unit_s = 86400;
	q->rate = 1000.0 / 86400;
	q->shadow = true;
	q->cand_rate = 500.0 / 86400;
	q->cand_burst = 10;
	q->fallback = ALLOT_FALLBACK_CLOSED;
	q->owner = strdup("payments");
	q->reason = strdup("Q3 launch");
	q->expected_peak = 450;
	q->labels = calloc(1, sizeof *q->labels);
	q->labels[0] = strdup("team=pay");
	q->nlabels = 1;
	b->def.shared = false;
	b->ceiling_rate = 300;
	char *t = allot__quota_text(b, q);
	ck_assert_str_eq(t,
	    "1000/day burst 1000 critical shadow candidate 500/day burst 10 "
	    "fallback closed owner payments reason \"Q3 launch\" peak 450/s "
	    "labels team=pay");
	free(t);
	allot__config_diff d;
	ck_assert_int_eq(allot__config_diff_compute(a, b, &d), ALLOT_OK);
	ck_assert_uint_eq(d.n, 3); /* default, a, (global_ceiling) */
	bool seen[3] = { false };
	for (size_t i = 0; i < d.n; i++) {
		const allot__quota_change *c = &d.v[i];
		ck_assert_int_eq(c->kind, ALLOT__QUOTA_CHANGED);
		if (strcmp(c->quota, "spiffe://t/a") == 0) {
			seen[0] = true;
			ck_assert_str_eq(c->owner, "payments");
			ck_assert_ptr_nonnull(strstr(c->fields,
			    "rate 500/s -> 1000/day; shadow (none) -> "
			    "shadow"));
			ck_assert_ptr_nonnull(
			    strstr(c->fields, "owner (none) -> payments"));
		} else if (strcmp(c->quota, "default") == 0) {
			seen[1] = true;
			ck_assert_str_eq(
			    c->fields, "shared (none) -> per value");
		} else {
			seen[2] = true;
			ck_assert_str_eq(c->quota, "(global_ceiling)");
			ck_assert_str_eq(c->before, "none");
			ck_assert_str_eq(c->after, "300/s");
			ck_assert_str_eq(c->fields, "none -> 300/s");
		}
	}
	ck_assert(seen[0] && seen[1] && seen[2]);
	allot__config_diff_free(&d);
	allot_config_free(a);
	allot_config_free(b);
}
END_TEST

/* A service's own quota is a row of its own, named by the service; a
 * top-level change it inherits is not repeated for it. */
START_TEST(config_diff_services)
{
	allot_config *a = parse(Q_HEAD "    - identity: spiffe://t/a\n"
	                               "      tokens_per_second: 500\n"
	                               "      burst: 1000\n"
	                               "services:\n"
	                               "  billing:\n"
	                               "    callers:\n"
	                               "      - identity: spiffe://t/x\n"
	                               "        tokens_per_second: 20\n"
	                               "        burst: 60\n"
	                               "  search:\n"
	                               "    callers:\n"
	                               "      - identity: spiffe://t/y\n"
	                               "        tokens_per_second: 5\n"
	                               "        burst: 5\n");
	allot_config *b = parse(Q_HEAD "    - identity: spiffe://t/a\n"
	                               "      tokens_per_second: 400\n"
	                               "      burst: 1000\n"
	                               "services:\n"
	                               "  billing:\n"
	                               "    callers:\n"
	                               "      - identity: spiffe://t/x\n"
	                               "        tokens_per_second: 30\n"
	                               "        burst: 60\n");
	allot__config_diff d;
	ck_assert_int_eq(allot__config_diff_compute(a, b, &d), ALLOT_OK);
	ck_assert_uint_eq(d.n, 3);
	ck_assert_ptr_null(d.v[0].service);
	ck_assert_str_eq(d.v[0].quota, "spiffe://t/a");
	ck_assert_str_eq(d.v[1].service, "billing");
	ck_assert_str_eq(d.v[1].quota, "spiffe://t/x");
	ck_assert_str_eq(d.v[1].fields, "rate 20/s -> 30/s");
	ck_assert_str_eq(d.v[2].service, "search");
	ck_assert_int_eq(d.v[2].kind, ALLOT__QUOTA_REMOVED);
	allot__config_diff_free(&d);
	allot_config_free(a);
	allot_config_free(b);
}
END_TEST

void
store_config_tests(const store_tcases *tc)
{
	tcase_add_test(tc->records, config_changes_recorded);
	tcase_add_test(tc->records, config_diff_text);
	tcase_add_test(tc->records, config_diff_services);
}
