/* SPDX-License-Identifier: MIT */
/*
 * Access (docs/configuration.md, "Closed and unlimited quotas"): a quota
 * with `access: closed` admits nobody, and says so apart from a rate
 * limit (ALLOT_EFORBIDDEN: 403, never retried); one with `access:
 * unlimited` admits every request at any cost, counted, with no amounts
 * and no RateLimit fields. Both are each agent's alone to decide: allotd
 * keeps no key of them, neither unknown nor allocated.
 *
 * The first cases run local agents on a virtual clock; the last runs
 * two replicas against a real allotd.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>
#include <allot/grpc.h>

#include "agent_int.h"
#include "allotd.h"
#include "keymodel.h"
#include "proc.h"
#include "proto_client.h"
#include "runner.h"

#define HEAD                                                            \
	"quotas:\n"                                                     \
	"  endpoint_weights: {default: 1, /x: 1, /premium: 1, /admin: " \
	"1}\n"

/* Unknown callers refused; a limited with its premium endpoint closed;
 * b unlimited; c closed but in shadow. */
#define PLANS                                           \
	HEAD "  default: {access: closed}\n"            \
	     "  callers:\n"                             \
	     "    - identity: a\n"                      \
	     "      tokens_per_second: 1\n"             \
	     "      burst: 2\n"                         \
	     "      endpoints:\n"                       \
	     "        /premium: {access: closed}\n"     \
	     "    - {identity: b, access: unlimited}\n" \
	     "    - {identity: c, access: closed, shadow: true}\n"

/* A closed quota's refusal: ALLOT_EFORBIDDEN, denied, no retry, named. */
static void
forbidden(allot_agent *a, const char *id, const char *ep, const char *quota)
{
	allot_decision d;
	ck_assert_int_eq(km_ask_rc(a, id, ep, &d), ALLOT_EFORBIDDEN);
	ck_assert(!d.allowed);
	ck_assert_uint_eq(d.retry_after_ns, 0);
	ck_assert_str_eq(km_bound_by(a, id, ep, &d), quota);
}

START_TEST(closed_and_unlimited)
{
	allot_agent *a = km_local_agent(PLANS);
	allot_decision d;
	/* Unknown callers: the closed default. */
	forbidden(a, "stranger", "/x", "default");
	forbidden(a, NULL, "/x", "default");
	/* a: its rate limit (not forbidden), and no premium at all. */
	ck_assert_int_eq(km_admitted(a, "a", "/x", 3), 2);
	ck_assert_int_eq(km_ask_rc(a, "a", "/x", &d), ALLOT_OK);
	ck_assert(!d.allowed && d.retry_after_ns > 0);
	forbidden(a, "a", "/premium", "a /premium");
	km_advance_ms(1000);
	ck_assert(km_ask(a, "a", "/x", NULL));
	/* b: everything, at any cost, with no amounts and no fields. */
	ck_assert_int_eq(km_admitted(a, "b", "/x", 10000), 10000);
	allot_key *k;
	ck_assert_int_eq(allot_key_resolve(a, "b", "/premium", &k), ALLOT_OK);
	ck_assert_int_eq(allot_acquire(a, k, 4000000000u, &d), ALLOT_OK);
	ck_assert(d.allowed && !d.shadow_denied);
	ck_assert(isinf(d.limit) && isinf(d.rate) && isinf(d.remaining));
	allot_key_release(a, k);
	char buf[ALLOT_RATELIMIT_FIELD_MAX] = "x";
	ck_assert_int_eq(
	    allot_fmt_ratelimit_policy(&d, "b", buf, sizeof buf), 0);
	ck_assert_str_eq(buf, "");
	ck_assert_int_eq(allot_fmt_ratelimit(&d, "b", buf, sizeof buf), 0);
	allot_xheaders xh;
	allot_fmt_xratelimit(&d, 0, &xh);
	ck_assert_str_eq(xh.limit, "");
	/* c: closed in shadow, so admitted and marked. */
	ck_assert_int_eq(km_ask_rc(a, "c", "/x", &d), ALLOT_OK);
	ck_assert(d.allowed && d.shadow_denied);
	/* Each counted where it was decided. */
	allot__ktotals t = km_totals(a, "b");
	ck_assert_uint_eq(t.spent, 10000 + 4000000000ull);
	t = km_totals(a, "default");
	ck_assert_uint_eq(t.denied_tokens, 2);
	t = km_totals(a, "a /premium");
	ck_assert_uint_eq(t.denied_tokens, 1);
	ck_assert_uint_eq(km_totals(a, "a").spent, 3);
	/* The gRPC mapping: PERMISSION_DENIED, never retried. */
	allot_grpc_status g;
	ck_assert_int_eq(km_ask_rc(a, "a", "/premium", &d), ALLOT_EFORBIDDEN);
	ck_assert_int_eq(
	    allot_grpc_from_decision(&d, ALLOT_EFORBIDDEN, &g), ALLOT_OK);
	ck_assert_int_eq(g.code, ALLOT_GRPC_PERMISSION_DENIED);
	ck_assert_str_eq(g.pushback_ms, "-1");
	allot_agent_destroy(a);
}
END_TEST

/* A closed level of a stack refuses every request of its endpoint, the
 * levels before it given back; an unlimited level never binds. */
START_TEST(stacked_levels)
{
	allot_agent *a = km_local_agent(
	    HEAD "  default: {tokens_per_second: 1, burst: 5}\n"
	         "  callers:\n"
	         "    - identity: \"*\"\n"
	         "      access: unlimited\n"
	         "      endpoints:\n"
	         "        /admin: {access: closed, stacked: true}\n");
	allot_decision d;
	ck_assert_int_eq(km_ask_rc(a, "x", "/admin", &d), ALLOT_EFORBIDDEN);
	ck_assert_str_eq(km_bound_by(a, "x", "/admin", &d), "* /admin");
	ck_assert_uint_gt(d.level, 0);
	/* The default's token came back: 5 still there. */
	ck_assert_int_eq(km_admitted(a, "x", "/x", 6), 5);
	ck_assert(!km_ask(a, "x", "/x", &d));
	ck_assert_str_eq(km_bound_by(a, "x", "/x", &d), "default");
	ck_assert(isfinite(d.limit));
	allot_agent_destroy(a);
}
END_TEST

/* A reconfig closes a quota and opens it again: its rate comes back. */
START_TEST(reconfig_closes_and_opens)
{
	const char *limited = HEAD
	    "  default: {tokens_per_second: 1, burst: 3}\n";
	const char *closed = HEAD "  default: {access: closed}\n";
	allot_agent *a = km_local_agent(limited);
	ck_assert_int_eq(km_admitted(a, "x", "/x", 1), 1);
	allot_config *cfg = km_parse(closed);
	ck_assert_int_eq(allot_agent_set_config(a, cfg), ALLOT_OK);
	allot_config_free(cfg);
	forbidden(a, "x", "/x", "default");
	cfg = km_parse(limited);
	ck_assert_int_eq(allot_agent_set_config(a, cfg), ALLOT_OK);
	allot_config_free(cfg);
	km_advance_ms(5000);
	ck_assert_int_eq(km_admitted(a, "x", "/x", 5), 3);
	allot_agent_destroy(a);
}
END_TEST

/* What the loader takes and refuses. */
START_TEST(config_rules)
{
	km_refused(HEAD "  default: {access: closed, tokens_per_second: 1}\n",
	    "quotas.default.tokens_per_second: a quota with access: closed "
	    "has no rate, burst or candidate (it admits nobody)");
	km_refused(HEAD "  default: {access: unlimited, burst: 3}\n",
	    "it admits everybody");
	km_refused(HEAD "  default: {access: open, tokens_per_second: 1, "
	                "burst: 1}\n",
	    "quotas.default.access is \"open\", expected one of: limited, "
	    "closed, unlimited");
	km_refused(HEAD "  default: {access: limited}\n",
	    "missing required key \"tokens_per_second\"");
	/* A plan's amounts are not taken by a quota closed by its own
	 * word, and a plan may close (an endpoint says for itself). */
	allot_agent *a = km_local_agent(
	    HEAD "  plans:\n"
	         "    free: {tokens_per_second: 5, burst: 5}\n"
	         "    banned: {access: closed}\n"
	         "  default: {plan: free, access: unlimited}\n"
	         "  callers:\n"
	         "    - identity: a\n"
	         "      plan: banned\n"
	         "      endpoints:\n"
	         "        /x: {tokens_per_second: 2, burst: 2}\n");
	ck_assert_int_eq(km_admitted(a, "z", "/premium", 50), 50);
	forbidden(a, "a", "/premium", "a");
	ck_assert_int_eq(km_admitted(a, "a", "/x", 3), 2);
	allot_agent_destroy(a);
}
END_TEST

/* Against allotd, two replicas: closed and unlimited quotas decided on
 * each replica alone (allotd counts none of their keys unknown and keeps
 * none), the limited quota beside them still allocated and held. */
START_TEST(two_replicas_and_allotd)
{
	static const char *cfg = HEAD
	    "  default: {access: closed}\n"
	    "  callers:\n"
	    "    - {identity: a, tokens_per_second: "
	    "20, burst: 20}\n"
	    "    - {identity: b, access: unlimited}\n";
	pc_coord c;
	pc_coord_init(&c, "/tmp/allot-access", cfg);
	const char *args[] = { "--interval-ms", "50", NULL };
	pc_coord_spawn(&c, args, NULL);
	allot_agent *as[2] = { km_remote_agent(&c, "r0", cfg),
		km_remote_agent(&c, "r1", cfg) };
	km_synced(as, 2);
	int b_ok = 0, a_ok = 0;
	uint64_t t0 = pc_now_ms();
	for (int i = 0; i < 2; i++) {
		b_ok += km_admitted(as[i], "b", "/x", 5000);
		forbidden(as[i], "nobody", "/x", "default");
	}
	/* a for about 2 s: 20/s in all, bursts of 20 at most. */
	while (pc_now_ms() - t0 < 2000) {
		for (int i = 0; i < 2; i++)
			a_ok += km_ask(as[i], "a", "/x", NULL);
		pc_sleep_ms(2);
	}
	double secs = (double) (pc_now_ms() - t0) / 1e3;
	for (int i = 0; i < 2; i++) {
		allot_sync_stats ss;
		allot_sync_stats_get(as[i], &ss);
		ck_assert_uint_eq(ss.unknown_keys, 0);
	}
	double rejected = pc_metric_get(
	    c.http, "allotd_rejected_messages_total{reason=\"unknown_key\"}");
	fprintf(stderr,
	    "access: b admitted %d of 10000 on two replicas; a %d in %.1f s "
	    "(20/s, burst 20: at most %.0f)\n",
	    b_ok, a_ok, secs, 20 * secs + 20 + 2);
	ck_assert_int_eq(b_ok, 10000);
	ck_assert(!(rejected > 0));
	ck_assert_int_le(a_ok, (int) (20 * secs + 20 + 2));
	ck_assert_int_ge(a_ok, (int) (20 * secs * 0.7));
	for (int i = 0; i < 2; i++)
		allot_agent_destroy(as[i]);
	pc_coord_done(&c, 5000);
}
END_TEST

static Suite *
access_suite(void)
{
	Suite *s = suite_create("access");
	TCase *tc = tcase_create("local");
	tcase_add_test(tc, closed_and_unlimited);
	tcase_add_test(tc, stacked_levels);
	tcase_add_test(tc, reconfig_closes_and_opens);
	tcase_add_test(tc, config_rules);
	suite_add_tcase(s, tc);
	tc = tcase_create("allotd");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, two_replicas_and_allotd);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(access_suite)
