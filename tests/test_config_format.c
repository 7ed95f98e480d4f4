/* SPDX-License-Identifier: MIT */
/*
 * The quota file format for many services (docs/configuration.md):
 * tests/data/services.yaml loads with its units, endpoint quota, review
 * metadata, candidate and two services; allot__config_select() gives each
 * service its view (and a service the file does not name the top level);
 * a single quota above the ceiling loads only with overcommit; the digest
 * follows every new key and ignores the order of services; and every new
 * kind of bad file is refused at its LINE:COL with nothing loaded.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "config_util.h"
#include "runner.h"

#define INDEXER "spiffe://prod.example.internal/ns/search/sa/indexer"

/* services.yaml: units, an endpoint quota, review metadata and a
 * candidate at the top level, and two services. */
START_TEST(services_file_loads)
{
	allot_config *cfg = load_ok(DATA("services.yaml"));
	ck_assert_uint_eq(cfg->ncallers, 3);
	const allot__quota *co = &cfg->callers[0], *rp = &cfg->callers[1];
	const allot__quota *ex = &cfg->callers[2];
	ck_assert_str_eq(co->identity, CHECKOUT);
	ck_assert_uint_eq(co->unit_s, 1);
	ck_assert_str_eq(co->owner, "team-payments");
	ck_assert_str_eq(co->reason, "Black Friday peak, measured 2026-11-27");
	ck_assert_double_eq(co->expected_peak, 420);
	ck_assert_uint_eq(co->nlabels, 2);
	ck_assert_str_eq(co->labels[0], "ticket=OPS-1234");
	ck_assert_str_eq(co->labels[1], "tier=1");
	ck_assert_double_eq(co->cand_rate, 0);

	ck_assert_str_eq(rp->identity, REPORTING);
	ck_assert_ptr_null(rp->endpoint);
	ck_assert_uint_eq(rp->unit_s, 60);
	ck_assert_double_eq(rp->rate, 100);
	ck_assert_double_eq(rp->cand_rate, 80);
	ck_assert_double_eq(rp->cand_burst, 100);
	ck_assert_ptr_null(rp->owner);

	/* The endpoint quota: after its caller, its priority inherited. */
	ck_assert_str_eq(ex->identity, REPORTING);
	ck_assert_str_eq(ex->endpoint, "/export");
	ck_assert_uint_eq(ex->unit_s, 86400);
	ck_assert_double_eq_tol(ex->rate, 1000.0 / 86400, 1e-15);
	ck_assert_double_eq(ex->burst, 50);
	ck_assert_str_eq(class_of(cfg, ex), "batch");
	ck_assert_str_eq(ex->owner, "team-analytics");
	char key[512];
	ck_assert_uint_eq(allot__quota_key(ex, key, sizeof key),
	    strlen(REPORTING " /export"));
	ck_assert_str_eq(key, REPORTING " /export");
	/* find() is for caller-wide quotas only. */
	ck_assert_ptr_eq(allot__config_find(cfg, REPORTING), rp);

	ck_assert_uint_eq(cfg->nservices, 2);
	ck_assert_str_eq(cfg->services[0].name, "search");
	ck_assert_str_eq(cfg->services[1].name, "billing");
	const allot__service *b = allot__config_service(cfg, "billing");
	ck_assert_ptr_eq(b, &cfg->services[1]);
	ck_assert_ptr_nonnull(b->def);
	ck_assert_double_eq(b->ceiling_rate, 600);
	ck_assert_ptr_null(allot__config_service(cfg, "checkout"));

	/* Deep copies keep everything, services included. */
	allot_config *d = allot__config_dup(cfg);
	ck_assert_ptr_nonnull(d);
	ck_assert_uint_eq(d->digest, cfg->digest);
	ck_assert_uint_eq(d->nservices, 2);
	ck_assert_ptr_ne(d->services[1].def, b->def);
	ck_assert_str_eq(d->callers[0].labels[1], "tier=1");
	allot_config_free(d);
	allot_config_free(cfg);
}
END_TEST

/* select(): each service's view, as a config of its own. */
START_TEST(select_views)
{
	allot_config *cfg = load_ok(DATA("services.yaml"));
	allot_config *search = NULL, *billing = NULL, *other = NULL;
	ck_assert_int_eq(
	    allot__config_select(cfg, "search", &search), ALLOT_OK);
	ck_assert_int_eq(
	    allot__config_select(cfg, "billing", &billing), ALLOT_OK);
	ck_assert_int_eq(
	    allot__config_select(cfg, "checkout", &other), ALLOT_OK);
	/* The whole file's digest, in every view. */
	ck_assert_uint_eq(search->digest, cfg->digest);
	ck_assert_uint_eq(billing->digest, cfg->digest);
	ck_assert_uint_eq(search->nservices, 0);

	/* search: the top level plus its own caller, appended. */
	ck_assert_uint_eq(search->ncallers, 4);
	ck_assert_str_eq(search->callers[3].identity, INDEXER);
	ck_assert_uint_eq(search->callers[3].unit_s, 3600);
	ck_assert_double_eq(search->callers[3].rate, 10);
	ck_assert_double_eq(search->def.rate, 10);
	ck_assert_double_eq(search->ceiling_rate, 800);
	ck_assert_uint_eq(search->max_weight, 20);

	/* billing: its own default, reporting replaced in place, its own
	 * weight and ceiling; search's caller does not exist here. */
	ck_assert_uint_eq(billing->ncallers, 3);
	ck_assert_ptr_null(allot__config_find(billing, INDEXER));
	ck_assert_str_eq(billing->callers[1].identity, REPORTING);
	ck_assert_double_eq(billing->callers[1].rate, 20);
	ck_assert_double_eq(billing->callers[1].cand_rate, 0);
	ck_assert_str_eq(billing->callers[2].endpoint, "/export");
	ck_assert_double_eq(billing->def.rate, 2);
	ck_assert(billing->def.shadow);
	ck_assert_double_eq(billing->ceiling_rate, 600);
	ck_assert_uint_eq(allot__config_weight(billing, "/invoice"), 30);
	ck_assert_uint_eq(allot__config_weight(billing, "/export"), 20);
	ck_assert_uint_eq(billing->max_weight, 30);
	ck_assert_uint_eq(allot__config_weight(search, "/invoice"), 1);

	/* A service the file does not name: the top level alone. */
	ck_assert_uint_eq(other->ncallers, 3);
	ck_assert_ptr_null(allot__config_find(other, INDEXER));
	ck_assert_double_eq(other->def.rate, 10);
	allot_config_free(search);
	allot_config_free(billing);
	allot_config_free(other);
	allot_config_free(cfg);
}
END_TEST

START_TEST(overcommit_and_units)
{
	/* One quota above the ceiling loads when the ceiling says so; the
	 * reference (only the sum above it) loads as is. */
	allot_config *cfg = parse_ok(
	    "quotas:\n"
	    "  default: {tokens_per_day: 1, burst: 1}\n"
	    "  callers:\n"
	    "    - {identity: a, tokens_per_second: "
	    "900, burst: 30}\n"
	    "  global_ceiling: {tokens_per_second: "
	    "800, overcommit: true}\n");
	ck_assert(cfg->overcommit);
	ck_assert_double_eq_tol(cfg->def.rate, 1.0 / 86400, 1e-18);
	ck_assert_uint_eq(cfg->def.unit_s, 86400);
	ck_assert(cfg->def.shared);
	allot_config_free(cfg);
	cfg = load_ok(DATA("reference.yaml"));
	ck_assert(!cfg->overcommit);
	ck_assert_uint_eq(cfg->def.unit_s, 1);
	allot_config_free(cfg);
	/* The same rate in another unit: the same enforcement, another
	 * digest (the unit is kept for display and review). */
	uint64_t a = digest_of("quotas:\n  default: {tokens_per_second: 1, "
	                       "burst: 2}\n");
	uint64_t b = digest_of("quotas:\n  default: {tokens_per_minute: 60, "
	                       "burst: 2}\n");
	ck_assert_uint_ne(a, b);
}
END_TEST

/* Plans: a quota with `plan: NAME` loads as if the plan's keys were
 * written in it, its own winning (one rate in all), in the top level and
 * in services, to the same config and digest as the file written out. */
START_TEST(plans_inherit)
{
	const char *with =
	    "services:\n"
	    "  s: {callers: [{identity: d, plan: free}]}\n"
	    "quotas:\n"
	    "  default: {plan: free}\n"
	    "  callers:\n"
	    "    - {identity: a, plan: pro}\n"
	    "    - {identity: b, plan: pro, tokens_per_second: 50}\n"
	    "    - {identity: c, burst: 40, plan: free}\n"
	    "  plans:\n"
	    "    free: {tokens_per_minute: 600, burst: 20, priority: low}\n"
	    "    pro: {tokens_per_second: 100, burst: 200, priority: "
	    "standard, owner: billing}\n"
	    "    unused: {burst: 1}\n";
	const char *without =
	    "services:\n"
	    "  s: {callers: [{identity: d, tokens_per_minute: 600, burst: 20, "
	    "priority: low}]}\n"
	    "quotas:\n"
	    "  default: {tokens_per_minute: 600, burst: 20, priority: low}\n"
	    "  callers:\n"
	    "    - {identity: a, tokens_per_second: 100, burst: 200, "
	    "priority: standard, owner: billing}\n"
	    "    - {identity: b, tokens_per_second: 50, burst: 200, "
	    "priority: standard, owner: billing}\n"
	    "    - {identity: c, burst: 40, tokens_per_minute: 600, priority: "
	    "low}\n";
	allot_config *cfg = parse_ok(with);
	ck_assert_uint_eq(cfg->ncallers, 3);
	ck_assert_double_eq(cfg->callers[0].rate, 100);
	ck_assert_str_eq(cfg->callers[0].owner, "billing");
	ck_assert_double_eq(cfg->callers[1].rate, 50);
	ck_assert_uint_eq(cfg->callers[1].unit_s, 1);
	ck_assert_double_eq(cfg->callers[2].burst, 40);
	ck_assert_double_eq_tol(cfg->callers[2].rate, 10, 1e-12);
	ck_assert_uint_eq(cfg->def.unit_s, 60);
	ck_assert_str_eq(class_of(cfg, &cfg->callers[2]), "low");
	ck_assert_uint_eq(cfg->digest, digest_of(without));
	allot_config_free(cfg);
	/* A plan's change changes every quota that uses it. */
	char *bumped = edit(with, "burst: 200", "burst: 300");
	ck_assert_uint_ne(digest_of(bumped), digest_of(with));
	free(bumped);
}
END_TEST

/* The digest covers services and their metadata, whatever their order. */
START_TEST(digest_follows_services)
{
	char *text = slurp(DATA("services.yaml"));
	uint64_t base = digest_of(text);
	static const char *const edits[][2] = {
		{ "owner: team-analytics", "owner: team-data" },
		{ "tier: \"1\"", "tier: \"2\"" },
		{ "tokens_per_hour: 36000", "tokens_per_hour: 36001" },
		{ "\"/invoice\": 30", "\"/invoice\": 29" },
		{ "tokens_per_second: 600}", "tokens_per_second: 601}" },
		{ "  search:\n", "  searchd:\n" },
		{ "shadow: true}", "shadow: false}" },
		{ "{tokens_per_minute: 4800, burst: 100}",
		    "{tokens_per_minute: 4800, burst: 101}" },
	};
	for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
		char *t = edit(text, edits[i][0], edits[i][1]);
		ck_assert_msg(
		    digest_of(t) != base, "edit %zu: %s", i, edits[i][1]);
		free(t);
	}
	/* Services in another order: the same digest. */
	char *search = strstr(text, "  search:\n");
	char *billing = strstr(text, "  billing:\n");
	ck_assert_ptr_nonnull(search);
	ck_assert_ptr_nonnull(billing);
	char *swapped = malloc(strlen(text) + 1);
	size_t head = (size_t) (search - text);
	memcpy(swapped, text, head);
	strcpy(swapped + head, billing);
	strncat(swapped, search, (size_t) (billing - search));
	ck_assert_uint_eq(strlen(swapped), strlen(text));
	ck_assert_uint_eq(digest_of(swapped), base);
	free(swapped);
	free(text);
}
END_TEST

/* clang-format off */
static const struct bad {
	const char *text;
	int line, col;
	const char *want;
} bad_cases[] = {
	/* units */
	{ HEAD CALLER("a", "5", "30") "      tokens_per_week: 3\n", 7, 7,
	  "unknown unit \"tokens_per_week\" in quotas.callers[0], expected "
	  "one of: tokens_per_second, tokens_per_minute, tokens_per_hour, "
	  "tokens_per_day" },
	{ HEAD CALLER("a", "5", "30") "      tokens_per_day: 3\n", 7, 7,
	  "quotas.callers[0] has both \"tokens_per_second\" (line 5) and "
	  "\"tokens_per_day\", expected exactly one rate key" },
	{ "quotas:\n  default: {tokens_per_day: 0.01, burst: 20}\n", 2, 29,
	  "quotas.default.tokens_per_day is 0.01, which is 1.16e-07 "
	  "tokens/s, out of range, expected a rate in [1e-6, 1e9] tokens/s" },
	{ "quotas:\n  default: {tokens_per_hour: 0, burst: 20}\n", 2, 30,
	  "quotas.default.tokens_per_hour is 0, expected a rate > 0 "
	  "tokens/hour" },
	/* a bucket per unknown caller cannot be held to a ceiling */
	{ "quotas:\n  default: {tokens_per_second: 10, burst: 20, shared: "
	  "false}\n  global_ceiling: {tokens_per_second: 500}\n", 2, 12,
	  "quotas.default has shared: false (a bucket of its own for each "
	  "unknown caller), which a global ceiling cannot hold, expected no "
	  "global_ceiling (line 3)" },
	/* a single quota above the ceiling without overcommit */
	{ HEAD CALLER("a", "900", "30")
	  "  global_ceiling: {tokens_per_second: 800}\n", 5, 26,
	  "caller \"a\" has a rate of 900 tokens/s, above the global ceiling "
	  "of 800 tokens/s, expected at most the ceiling (or overcommit: "
	  "true in the global_ceiling at line 7)" },
	{ HEAD "  global_ceiling: {tokens_per_second: 5, overcommit: maybe}\n",
	  3, 54, "quotas.global_ceiling.overcommit is the string \"maybe\", "
	  "expected true or false" },
	/* candidates */
	{ HEAD CALLER("a", "5", "30")
	  "      candidate: {tokens_per_second: 4, burst: 10}\n"
	  "  endpoint_weights: {/x: 20}\n", 7, 48,
	  "caller \"a\" has a candidate burst of 10, below the weight 20 of "
	  "endpoint \"/x\", expected a candidate burst >= 20" },
	{ HEAD CALLER("a", "5", "30")
	  "      candidate: {tokens_per_second: 4}\n", 7, 18,
	  "missing required key \"burst\" in quotas.callers[0].candidate" },
	{ HEAD CALLER("a", "5", "30")
	  "      candidate: {tokens_per_second: 900, burst: 30}\n"
	  "  global_ceiling: {tokens_per_second: 800}\n", 7, 38,
	  "caller \"a\" has a candidate rate of 900 tokens/s, above the "
	  "global ceiling of 800 tokens/s" },
	/* endpoint quotas */
	{ HEAD CALLER("a", "5", "30") "      endpoints:\n"
	  "        /y: {tokens_per_day: 100, burst: 5}\n"
	  "  endpoint_weights: {/x: 2}\n", 8, 9,
	  "endpoint quota \"a /y\": endpoint \"/y\" has no weight in "
	  "endpoint_weights, expected an endpoint listed there (/x)" },
	{ HEAD CALLER("a", "5", "30") "      endpoints:\n"
	  "        /x: {tokens_per_day: 100, burst: 5}\n"
	  "  endpoint_weights: {/x: 20}\n", 8, 42,
	  "endpoint quota \"a /x\" has burst 5, below the weight 20 of "
	  "endpoint \"/x\", expected burst >= 20" },
	{ HEAD "  callers:\n"
	  "    - {identity: a, tokens_per_second: 5, burst: 30, endpoints: "
	  "{/x: {tokens_per_second: 1, burst: 5}}}\n"
	  "    - {identity: \"a /x\", tokens_per_second: 5, burst: 30}\n"
	  "  endpoint_weights: {/x: 2}\n", 5, 18,
	  "duplicate identity \"a /x\" (first defined at line 4)" },
	{ HEAD CALLER("a", "5", "30") "      endpoints: [/x]\n", 7, 18,
	  "quotas.callers[0].endpoints is a sequence, expected a mapping of "
	  "endpoint: quota" },
	/* review metadata */
	{ HEAD CALLER("a", "5", "30") "      labels: {\"a=b\": c}\n", 7, 16,
	  "label name \"a=b\" has a character that is not allowed" },
	{ HEAD CALLER("a", "5", "30") "      owner: \"a\\tb\"\n", 7, 14,
	  "quotas.callers[0].owner contains a control character" },
	{ HEAD CALLER("a", "5", "30") "      expected_peak: -1\n", 7, 22,
	  "quotas.callers[0].expected_peak is -1, out of range, expected a "
	  "number of tokens >= 0" },
	/* services */
	{ HEAD "services:\n  \"caf\\u00e9\": {}\n", 4, 3,
	  "must be 1-255 printable ASCII characters (0x20-0x7e), expected "
	  "the name agents register with" },
	{ HEAD "services:\n  a: {}\n  a: {}\n", 5, 3,
	  "duplicate service \"a\" (first at line 4), expected each service "
	  "once" },
	{ HEAD "services:\n  a: {global_ceiling: {tokens_per_second: 5, "
	  "shed_order: [low]}}\n", 4, 46,
	  "shed_order in services.a.global_ceiling: the priority classes are "
	  "the file's" },
	{ HEAD "services:\n  s:\n    callers: [{identity: b, "
	  "tokens_per_second: 50, burst: 30}]\n"
	  "    global_ceiling: {tokens_per_second: 40}\n", 5, 48,
	  "caller \"b\" has a rate of 50 tokens/s, above the global ceiling "
	  "of 40 tokens/s in service \"s\"" },
	{ HEAD "services:\n  s: {endpoint_weights: {/big: 40}}\n", 2, 43,
	  "quotas.default has burst 20, below the weight 40 of endpoint "
	  "\"/big\" in service \"s\", expected burst >= 40" },
	{ HEAD "services:\n  s: {callers: {a: 1}}\n", 4, 16,
	  "services.s.callers is a mapping, expected a sequence of callers" },
	{ HEAD "services:\n  s: {quotas: {}}\n", 4, 7,
	  "unknown key \"quotas\" in services.s, expected one of: default, "
	  "callers, endpoint_weights, global_ceiling" },
	/* plans */
	{ HEAD "  callers: [{identity: a, plan: pro}]\n"
	  "  plans: {free: {burst: 5}}\n", 3, 33,
	  "quotas.callers[0].plan: no plan \"pro\" in quotas.plans, "
	  "expected one of: free" },
	{ HEAD "  callers: [{identity: a, plan: pro}]\n", 3, 33,
	  "no plan \"pro\" in quotas.plans, expected a plan defined there "
	  "(it has none)" },
	{ HEAD "  plans: {pro: {bogus: 1}}\n", 3, 17,
	  "unknown key \"bogus\" in quotas.plans.pro, expected one of: "
	  "tokens_per_second" },
	{ HEAD "  plans: {pro: {identity: x}}\n", 3, 17,
	  "quotas.plans.pro: \"identity\" names one quota" },
	{ HEAD "  plans: [pro]\n", 3, 10,
	  "quotas.plans is a sequence, expected a mapping of plan names" },
	{ HEAD "  plans: {pro: {burst: fast}}\n"
	  "  callers: [{identity: a, tokens_per_second: 1, plan: pro}]\n",
	  3, 24, "quotas.callers[0].burst is the string \"fast\"" },
	{ HEAD "services:\n  s: {plans: {}}\n", 4, 7,
	  "unknown key \"plans\" in services.s" },
};
/* clang-format on */

START_TEST(bad_case)
{
	const struct bad *b = &bad_cases[_i];
	expect_bad(b->text, b->line, b->col, b->want);
}
END_TEST

static Suite *
config_format_suite(void)
{
	Suite *s = suite_create("config-format");
	TCase *tc = tcase_create("services");
	tcase_add_test(tc, services_file_loads);
	tcase_add_test(tc, select_views);
	tcase_add_test(tc, overcommit_and_units);
	tcase_add_test(tc, digest_follows_services);
	tcase_add_test(tc, plans_inherit);
	suite_add_tcase(s, tc);

	tc = tcase_create("reject");
	tcase_add_loop_test(
	    tc, bad_case, 0, (int) (sizeof bad_cases / sizeof bad_cases[0]));
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(config_format_suite)
