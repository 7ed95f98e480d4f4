/* SPDX-License-Identifier: MIT */
/*
 * The quota file loader (common/config.c): the reference example loads
 * unchanged with every value as documented; the digest ignores layout and
 * follows content; every class of bad file is refused with ALLOT_ECONFIG,
 * a message naming what was wrong and what was expected, and the line and
 * column of the offending node; nothing is returned from a bad file; and
 * the lookup and copy helpers agree with the loaded data.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "config_util.h"
#include "runner.h"

START_TEST(reference_loads_with_exact_values)
{
	allot_config *cfg = load_ok(DATA("reference.yaml"));

	ck_assert_str_eq(cfg->source, DATA("reference.yaml"));
	ck_assert_str_eq(cfg->def.identity, "default");
	ck_assert_double_eq(cfg->def.rate, 10);
	ck_assert_double_eq(cfg->def.burst, 20);
	ck_assert(cfg->def.shared);
	ck_assert(!cfg->def.shadow);
	ck_assert_str_eq(class_of(cfg, &cfg->def), "low");
	ck_assert_int_eq(cfg->def.fallback, ALLOT_FALLBACK_STATIC_SHARE);
	ck_assert_uint_eq(cfg->def.line, 4);

	ck_assert_uint_eq(cfg->ncallers, 3);
	static const struct {
		const char *id;
		double rate, burst;
		const char *cls;
		uint32_t line;
	} want[] = {
		{ CHECKOUT, 500, 1000, "critical", 10 },
		{ SEARCH, 300, 600, "standard", 14 },
		{ REPORTING, 100, 200, "batch", 18 },
	};
	for (size_t i = 0; i < 3; i++) {
		const allot__quota *q = &cfg->callers[i];
		ck_assert_str_eq(q->identity, want[i].id);
		ck_assert_double_eq(q->rate, want[i].rate);
		ck_assert_double_eq(q->burst, want[i].burst);
		ck_assert_str_eq(class_of(cfg, q), want[i].cls);
		ck_assert(!q->shadow);
		ck_assert(!q->shared);
		ck_assert_int_eq(q->fallback, ALLOT_FALLBACK_STATIC_SHARE);
		ck_assert_uint_eq(q->line, want[i].line);
	}

	ck_assert_uint_eq(cfg->nendpoints, 2);
	ck_assert_str_eq(cfg->endpoints[0].name, "/lookup");
	ck_assert_uint_eq(cfg->endpoints[0].weight, 1);
	ck_assert_str_eq(cfg->endpoints[1].name, "/export");
	ck_assert_uint_eq(cfg->endpoints[1].weight, 20);
	ck_assert_uint_eq(cfg->default_weight, 1);
	ck_assert_uint_eq(cfg->max_weight, 20);

	ck_assert_double_eq(cfg->ceiling_rate, 800);
	ck_assert_uint_eq(cfg->nclasses, 4);
	ck_assert_str_eq(cfg->classes[0], "low");
	ck_assert_str_eq(cfg->classes[1], "batch");
	ck_assert_str_eq(cfg->classes[2], "standard");
	ck_assert_str_eq(cfg->classes[3], "critical");
	/* Shedding order: a higher index is served longer. */
	ck_assert_uint_gt(cfg->callers[0].priority, cfg->callers[1].priority);
	ck_assert_uint_gt(cfg->callers[1].priority, cfg->callers[2].priority);
	ck_assert_uint_gt(cfg->callers[2].priority, cfg->def.priority);
	ck_assert_uint_ne(cfg->digest, 0);
	allot_config_free(cfg);
}
END_TEST

START_TEST(load_and_parse_agree)
{
	char *text = slurp(DATA("reference.yaml"));
	allot_config *a = load_ok(DATA("reference.yaml"));
	allot_config *b = parse_ok(text);
	ck_assert_uint_eq(a->digest, b->digest);
	ck_assert_str_eq(b->source, "t.yaml");
	allot_config_free(a);
	allot_config_free(b);
	free(text);
}
END_TEST

START_TEST(digest_ignores_layout)
{
	allot_config *a = load_ok(DATA("reference.yaml"));
	allot_config *b = load_ok(DATA("reference-reformatted.yaml"));
	ck_assert_uint_eq(a->digest, b->digest);
	/* The reformatted file lists callers in another order. */
	ck_assert_str_ne(a->callers[0].identity, b->callers[0].identity);

	/* Comments and blank lines, in memory. */
	char *text = slurp(DATA("reference.yaml"));
	char *t1 = edit(text, "      priority: standard\n",
	    "\n      # a new comment\n      priority: standard   # here\n");
	ck_assert_uint_eq(digest_of(t1), a->digest);
	free(t1);
	t1 = edit(text, "burst: 600", "burst: 6.0e2");
	ck_assert_uint_eq(digest_of(t1), a->digest);
	free(t1);
	allot_config_free(a);
	allot_config_free(b);
	free(text);
}
END_TEST

START_TEST(digest_follows_content)
{
	char *text = slurp(DATA("reference.yaml"));
	uint64_t base = digest_of(text);
	static const char *const edits[][2] = {
		{ "\"/export\": 20", "\"/export\": 19" },
		{ "tokens_per_second: 300", "tokens_per_second: 301" },
		{ "burst: 600", "burst: 601" },
		{ "priority: standard", "priority: batch" },
		{ "tokens_per_second: 800", "tokens_per_second: 801" },
		{ "      priority: batch ",
		    "      owner: team-analytics\n      priority: batch " },
		{ "      priority: batch ",
		    "      reason: nightly reports\n      priority: batch " },
		{ "      priority: batch ",
		    "      expected_peak: 80\n      priority: batch " },
		{ "      priority: batch ",
		    "      labels: {ticket: OPS-1}\n      priority: batch " },
		{ "      priority: batch ",
		    "      candidate: {tokens_per_second: 90, burst: 200}\n"
		    "      priority: batch " },
		{ "tokens_per_second: 300", "tokens_per_minute: 18000" },
		{ "    tokens_per_second: 800\n",
		    "    tokens_per_second: 800\n    overcommit: true\n" },
		{ "default: 1\n", "default: 2\n" },
		{ "sa/search\"", "sa/search2\"" },
		{ "[low, batch, standard, critical]",
		    "[batch, low, standard, critical]" },
		{ "      priority: batch ",
		    "      shadow: true\n      priority: batch " },
		{ "      priority: batch ",
		    "      fallback: open\n      priority: batch " },
	};
	for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
		char *t = edit(text, edits[i][0], edits[i][1]);
		ck_assert_msg(
		    digest_of(t) != base, "edit %zu: %s", i, edits[i][1]);
		free(t);
	}
	free(text);
}
END_TEST

START_TEST(shadow_fallback_and_custom_classes)
{
	allot_config *cfg = load_ok(DATA("rollout.yaml"));
	ck_assert_uint_eq(cfg->nclasses, 3);
	ck_assert_str_eq(cfg->classes[0], "bulk");
	ck_assert_str_eq(cfg->classes[1], "silver");
	ck_assert_str_eq(cfg->classes[2], "gold");

	ck_assert(cfg->def.shared);
	ck_assert(!cfg->def.shadow);
	ck_assert_int_eq(cfg->def.fallback, ALLOT_FALLBACK_CLOSED);
	ck_assert_str_eq(class_of(cfg, &cfg->def), "bulk");

	ck_assert_uint_eq(cfg->ncallers, 3);
	const allot__quota *billing = &cfg->callers[0];
	const allot__quota *trainer = &cfg->callers[1];
	const allot__quota *backfill = &cfg->callers[2];
	ck_assert(!billing->shadow);
	ck_assert_int_eq(billing->fallback, ALLOT_FALLBACK_OPEN);
	ck_assert_str_eq(class_of(cfg, billing), "gold");
	ck_assert(trainer->shadow);
	ck_assert_int_eq(trainer->fallback, ALLOT_FALLBACK_STATIC_SHARE);
	ck_assert_double_eq(trainer->rate, 50.5);
	ck_assert_double_eq(trainer->burst, 101);
	/* No priority: the class shed first. */
	ck_assert_uint_eq(backfill->priority, 0);
	ck_assert_double_eq(backfill->rate, 0.5);

	ck_assert_uint_eq(cfg->default_weight, 2);
	ck_assert_uint_eq(cfg->max_weight, 50);
	ck_assert_double_eq(cfg->ceiling_rate, 250);
	allot_config_free(cfg);
}
END_TEST

START_TEST(defaults_when_absent)
{
	allot_config *cfg = parse_ok(
	    "quotas:\n"
	    "  default: {tokens_per_second: 1, burst: 1}\n");
	ck_assert_uint_eq(cfg->ncallers, 0);
	ck_assert_ptr_null(allot__config_find(cfg, "x"));
	ck_assert_uint_eq(cfg->nendpoints, 0);
	ck_assert_uint_eq(cfg->default_weight, 1);
	ck_assert_uint_eq(cfg->max_weight, 1);
	ck_assert_double_eq(cfg->ceiling_rate, 0);
	ck_assert_uint_eq(cfg->nclasses, 4);
	ck_assert_str_eq(cfg->classes[0], "low");
	ck_assert_str_eq(cfg->classes[3], "critical");
	ck_assert(cfg->def.shared);
	ck_assert(!cfg->def.shadow);
	ck_assert_int_eq(cfg->def.fallback, ALLOT_FALLBACK_STATIC_SHARE);
	ck_assert_uint_eq(cfg->def.priority, 0);
	allot_config_free(cfg);

	cfg = parse_ok("quotas:\n"
	               "  default: {tokens_per_second: 1, burst: 1}\n"
	               "  callers: []\n  endpoint_weights: {}\n");
	ck_assert_uint_eq(cfg->ncallers, 0);
	ck_assert_uint_eq(cfg->nendpoints, 0);
	allot_config_free(cfg);
}
END_TEST

START_TEST(scalar_spellings)
{
	allot_config *cfg = parse_ok(
	    "quotas:\n"
	    "  default: {tokens_per_second: .5, burst: 1e3, shadow: Yes}\n"
	    "  callers:\n"
	    "    - {identity: a, tokens_per_second: +2.5, burst: 30.,"
	    " shadow: NO, fallback: \"closed\"}\n"
	    "    - {identity: \"007\", tokens_per_second: 1E1, burst: 30,"
	    " shadow: TRUE}\n"
	    "    - {identity: 'b c', tokens_per_second: 0.000001,"
	    " burst: 1000000000}\n"
	    "    - {identity: d, tokens_per_second: 1000000000, burst: 30}\n"
	    "  endpoint_weights: {\"/a\": +3, /b: 30, default: 1}\n"
	    "  global_ceiling: {tokens_per_second: 0.000001, overcommit: "
	    "yes}\n");
	ck_assert_double_eq(cfg->def.rate, 0.5);
	ck_assert_double_eq(cfg->def.burst, 1000);
	ck_assert(cfg->def.shadow);
	ck_assert_double_eq(cfg->callers[0].rate, 2.5);
	ck_assert_double_eq(cfg->callers[0].burst, 30);
	ck_assert(!cfg->callers[0].shadow);
	ck_assert_int_eq(cfg->callers[0].fallback, ALLOT_FALLBACK_CLOSED);
	ck_assert_str_eq(cfg->callers[1].identity, "007");
	ck_assert_double_eq(cfg->callers[1].rate, 10);
	ck_assert(cfg->callers[1].shadow);
	ck_assert_str_eq(cfg->callers[2].identity, "b c");
	ck_assert_double_eq(cfg->callers[2].rate, ALLOT__RATE_MIN);
	ck_assert_double_eq(cfg->callers[2].burst, ALLOT__BURST_MAX);
	ck_assert_double_eq(cfg->callers[3].rate, ALLOT__RATE_MAX);
	ck_assert_uint_eq(cfg->endpoints[0].weight, 3);
	ck_assert_uint_eq(cfg->endpoints[1].weight, 30);
	ck_assert_uint_eq(cfg->max_weight, 30);
	ck_assert_double_eq(cfg->ceiling_rate, ALLOT__RATE_MIN);
	allot_config_free(cfg);

	/* The largest weight, and a burst exactly equal to it. */
	cfg = parse_ok("quotas:\n"
	               "  default: {tokens_per_second: 1, burst: 1000000.0}\n"
	               "  endpoint_weights: {/big: 1000000}\n");
	ck_assert_uint_eq(cfg->endpoints[0].weight, ALLOT__WEIGHT_MAX);
	ck_assert_uint_eq(cfg->max_weight, ALLOT__WEIGHT_MAX);
	allot_config_free(cfg);
}
END_TEST

START_TEST(config_weight)
{
	allot_config *cfg = load_ok(DATA("reference.yaml"));
	ck_assert_uint_eq(allot__config_weight(cfg, "/export"), 20);
	ck_assert_uint_eq(allot__config_weight(cfg, "/lookup"), 1);
	ck_assert_uint_eq(allot__config_weight(cfg, "/unlisted"), 1);
	ck_assert_uint_eq(allot__config_weight(cfg, NULL), 1);
	ck_assert_uint_eq(allot__config_weight(cfg, "/EXPORT"), 1);
	allot_config_free(cfg);

	cfg = load_ok(DATA("rollout.yaml"));
	ck_assert_uint_eq(allot__config_weight(cfg, "/report"), 50);
	ck_assert_uint_eq(allot__config_weight(cfg, "/other"), 2);
	ck_assert_uint_eq(allot__config_weight(cfg, "default"), 2);
	allot_config_free(cfg);
}
END_TEST

START_TEST(config_find)
{
	allot_config *cfg = load_ok(DATA("reference.yaml"));
	const allot__quota *q = allot__config_find(cfg, SEARCH);
	ck_assert_ptr_eq(q, &cfg->callers[1]);
	ck_assert_double_eq(q->rate, 300);
	ck_assert_ptr_null(allot__config_find(cfg, "default"));
	ck_assert_ptr_null(allot__config_find(cfg, SEARCH "/x"));
	ck_assert_ptr_null(allot__config_find(cfg, ""));
	ck_assert_ptr_null(allot__config_find(cfg, NULL));
	allot_config_free(cfg);
}
END_TEST

static void
assert_quota_eq(const allot__quota *a, const allot__quota *b)
{
	ck_assert_ptr_ne(a->identity, b->identity);
	ck_assert_str_eq(a->identity, b->identity);
	ck_assert_double_eq(a->rate, b->rate);
	ck_assert_double_eq(a->burst, b->burst);
	ck_assert_uint_eq(a->priority, b->priority);
	ck_assert_int_eq(a->shadow, b->shadow);
	ck_assert_int_eq(a->shared, b->shared);
	ck_assert_int_eq(a->fallback, b->fallback);
	ck_assert_uint_eq(a->line, b->line);
}

START_TEST(config_dup_is_deep_and_equal)
{
	static const char *const files[] = { DATA("reference.yaml"),
		DATA("rollout.yaml") };
	for (size_t f = 0; f < 2; f++) {
		allot_config *a = load_ok(files[f]);
		allot_config *b = allot__config_dup(a);
		ck_assert_ptr_nonnull(b);
		ck_assert_ptr_ne(b->source, a->source);
		ck_assert_str_eq(b->source, a->source);
		assert_quota_eq(&b->def, &a->def);
		ck_assert_uint_eq(b->ncallers, a->ncallers);
		ck_assert_ptr_ne(b->callers, a->callers);
		for (size_t i = 0; i < a->ncallers; i++)
			assert_quota_eq(&b->callers[i], &a->callers[i]);
		ck_assert_uint_eq(b->nendpoints, a->nendpoints);
		for (size_t i = 0; i < a->nendpoints; i++) {
			ck_assert_ptr_ne(
			    b->endpoints[i].name, a->endpoints[i].name);
			ck_assert_str_eq(
			    b->endpoints[i].name, a->endpoints[i].name);
			ck_assert_uint_eq(
			    b->endpoints[i].weight, a->endpoints[i].weight);
		}
		ck_assert_uint_eq(b->default_weight, a->default_weight);
		ck_assert_uint_eq(b->max_weight, a->max_weight);
		ck_assert_double_eq(b->ceiling_rate, a->ceiling_rate);
		ck_assert_uint_eq(b->nclasses, a->nclasses);
		for (size_t i = 0; i < a->nclasses; i++) {
			ck_assert_ptr_ne(b->classes[i], a->classes[i]);
			ck_assert_str_eq(b->classes[i], a->classes[i]);
		}
		ck_assert_uint_eq(b->digest, a->digest);
		/* The copy outlives the original. */
		allot_config_free(a);
		ck_assert_ptr_nonnull(
		    allot__config_find(b, b->callers[0].identity));
		allot_config_free(b);
	}
	/* No callers, no endpoints. */
	allot_config *a = parse_ok("quotas: {default: {tokens_per_second: 1,"
	                           " burst: 1}}");
	allot_config *b = allot__config_dup(a);
	ck_assert_ptr_nonnull(b);
	ck_assert_uint_eq(b->ncallers, 0);
	ck_assert_uint_eq(b->digest, a->digest);
	allot_config_free(a);
	allot_config_free(b);
}
END_TEST

START_TEST(load_errors)
{
	char err[256];
	allot_config sentinel, *cfg = &sentinel;
	int rc = allot_config_load(
	    DATA("no-such-file.yaml"), err, sizeof err, &cfg);
	ck_assert_int_eq(rc, ALLOT_ENOENT);
	ck_assert_ptr_eq(cfg, &sentinel);
	ck_assert_ptr_nonnull(strstr(err, "no-such-file.yaml"));
	/* A directory opens but cannot be read. */
	rc = allot_config_load(ALLOT_TEST_DATA, err, sizeof err, &cfg);
	ck_assert_int_eq(rc, ALLOT_EIO);
	ck_assert_ptr_eq(cfg, &sentinel);
	/* errbuf may be NULL. */
	rc = allot_config_load(DATA("no-such-file.yaml"), NULL, 0, &cfg);
	ck_assert_int_eq(rc, ALLOT_ENOENT);
	rc = allot_config_load(DATA("bad-burst.yaml"), NULL, 0, &cfg);
	ck_assert_int_eq(rc, ALLOT_ECONFIG);
	ck_assert_ptr_eq(cfg, &sentinel);
	/* A bad file names itself, the line and the column. */
	rc = allot_config_load(DATA("bad-burst.yaml"), err, sizeof err, &cfg);
	ck_assert_int_eq(rc, ALLOT_ECONFIG);
	const char *want = DATA("bad-burst.yaml") ":10:14: caller \"" REPORTING
	                                          "\" has burst 10, below the "
	                                          "weight 20 of endpoint";
	ck_assert_msg(strncmp(err, want, strlen(want)) == 0, "%s", err);
	ck_assert_ptr_nonnull(strstr(err, "\"/export\""));
	ck_assert_ptr_nonnull(strstr(err, "expected burst >= 20"));
	/* API misuse. */
	ck_assert_int_eq(allot_config_load(NULL, NULL, 0, &cfg), ALLOT_EINVAL);
	ck_assert_int_eq(
	    allot_config_load(DATA("reference.yaml"), NULL, 0, NULL),
	    ALLOT_EINVAL);
	ck_assert_int_eq(
	    allot_config_parse("x", NULL, 3, NULL, 0, &cfg), ALLOT_EINVAL);
	ck_assert_int_eq(
	    allot_config_parse("x", "", 0, NULL, 0, NULL), ALLOT_EINVAL);
	ck_assert_ptr_eq(cfg, &sentinel);
	allot_config_free(NULL);
}
END_TEST

START_TEST(errbuf_truncated_safely)
{
	const char *bad = "quotas:\n  default: {tokens_per_second: -1,"
	                  " burst: 1}\n";
	char err[16];
	allot_config *cfg = NULL;
	for (size_t len = 1; len <= sizeof err; len++) {
		memset(err, 'x', sizeof err);
		int rc = allot_config_parse("a-rather-long-name.yaml", bad,
		    strlen(bad), err, len, &cfg);
		ck_assert_int_eq(rc, ALLOT_ECONFIG);
		ck_assert_uint_eq(strlen(err), len - 1);
		for (size_t i = len; i < sizeof err; i++)
			ck_assert_int_eq(err[i], 'x');
	}
	ck_assert_ptr_null(cfg);
	ck_assert_int_eq(
	    allot_config_parse("n", bad, strlen(bad), err, 0, &cfg),
	    ALLOT_ECONFIG);
	ck_assert_int_eq(
	    allot_config_parse("n", bad, strlen(bad), NULL, 99, &cfg),
	    ALLOT_ECONFIG);
	ck_assert_ptr_null(cfg);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Bad files                                                          */
/* ------------------------------------------------------------------ */

/* A table: kept as written, one case per entry. */
/* clang-format off */
static const struct bad {
	const char *text;
	int line, col;
	const char *want;
} bad_cases[] = {
	/* unknown keys, named, with the allowed ones listed */
	{ "quotas:\n  default:\n    tokens_per_second: 10\n    burts: 20\n",
	  4, 5, "unknown key \"burts\" in quotas.default, expected one of: "
	  "tokens_per_second, tokens_per_minute, tokens_per_hour, "
	  "tokens_per_day, burst, priority, shadow, fallback, shared, owner, "
	  "reason, expected_peak, labels, reserve, access, candidate" },
	{ "verbose: true\n" HEAD, 1, 1,
	  "unknown key \"verbose\" in the top level, expected one of: "
	  "quotas" },
	{ HEAD "  caller: []\n", 3, 3, "unknown key \"caller\" in quotas, "
	  "expected one of: default, callers, endpoint_weights, "
	  "global_ceiling" },
	{ HEAD CALLER("a", "5", "30") "      shared: true\n", 7, 7,
	  "unknown key \"shared\" in quotas.callers[0], expected one of: "
	  "identity, tokens_per_second, tokens_per_minute, tokens_per_hour, "
	  "tokens_per_day, burst, priority, shadow, fallback, owner, reason, "
	  "expected_peak, labels, reserve, access, candidate, endpoints" },
	{ HEAD "  global_ceiling: {tokens_per_second: 5, order: [a]}\n", 3, 42,
	  "unknown key \"order\" in quotas.global_ceiling, expected one of: "
	  "tokens_per_second, shed_order" },
	/* wrong types */
	{ "quotas:\n  default: {tokens_per_second: fast, burst: 20}\n", 2, 32,
	  "quotas.default.tokens_per_second is the string \"fast\", "
	  "expected a number" },
	{ "quotas:\n  default: {tokens_per_second: 10, burst: \"20\"}\n", 2,
	  43, "quotas.default.burst is the string \"20\", expected a number" },
	{ "quotas:\n  default: {tokens_per_second: 10, burst: [20]}\n", 2, 43,
	  "quotas.default.burst is a sequence, expected a number" },
	{ "quotas:\n  default: {tokens_per_second: 10, burst: }\n", 2, 43,
	  "quotas.default.burst is empty, expected a number" },
	{ "quotas:\n  default: {tokens_per_second: true, burst: 2}\n", 2, 32,
	  "is the boolean true, expected a number" },
	{ HEAD "  callers: {a: 1}\n", 3, 12,
	  "quotas.callers is a mapping, expected a sequence of callers" },
	{ HEAD "  callers:\n", 3, 11,
	  "quotas.callers is empty, expected a sequence of callers" },
	{ HEAD "  callers: [a]\n", 3, 13,
	  "quotas.callers[0] is the string \"a\", expected a mapping" },
	{ "quotas:\n  default: [10, 20]\n", 2, 12,
	  "quotas.default is a sequence, expected a mapping" },
	{ "quotas: 1\n", 1, 9, "quotas is 1, expected a mapping" },
	{ "- quotas\n", 1, 1, "the document is a sequence, expected a "
	  "mapping with a top-level \"quotas\" key" },
	{ HEAD "  endpoint_weights: [/a, /b]\n", 3, 21,
	  "quotas.endpoint_weights is a sequence, expected a mapping" },
	{ HEAD "  global_ceiling: 800\n", 3, 19,
	  "quotas.global_ceiling is 800, expected a mapping" },
	{ HEAD "  global_ceiling: {tokens_per_second: 9, shed_order: low}\n",
	  3, 54, "shed_order is the string \"low\", expected a sequence" },
	{ HEAD CALLER("a", "5", "30") "      shadow: maybe\n", 7, 15,
	  "quotas.callers[0].shadow is the string \"maybe\", expected true "
	  "or false" },
	{ HEAD CALLER("a", "5", "30") "      shadow: 1\n", 7, 15,
	  "shadow is 1, expected true or false" },
	{ HEAD CALLER("a", "5", "30") "      fallback: fail_open\n", 7, 17,
	  "quotas.callers[0].fallback is \"fail_open\", expected one of: "
	  "static_share, open, closed" },
	{ HEAD CALLER("{x: 1}", "5", "30"), 4, 17,
	  "quotas.callers[0].identity is a mapping, expected a verified "
	  "caller identity" },
	/* rates: sign, NaN/inf, range */
	{ HEAD CALLER("a", "-5", "30"), 5, 26,
	  "quotas.callers[0].tokens_per_second is -5, expected a rate > 0 "
	  "tokens/s" },
	{ "quotas:\n  default: {tokens_per_second: 0, burst: 20}\n", 2, 32,
	  "tokens_per_second is 0, expected a rate > 0 tokens/s" },
	{ "quotas:\n  default: {tokens_per_second: -0.0, burst: 20}\n", 2, 32,
	  "tokens_per_second is -0.0, expected a rate > 0 tokens/s" },
	{ "quotas:\n  default: {tokens_per_second: .nan, burst: 20}\n", 2, 32,
	  "tokens_per_second is NaN, expected a finite number" },
	{ "quotas:\n  default: {tokens_per_second: NaN, burst: 20}\n", 2, 32,
	  "tokens_per_second is NaN, expected a finite number" },
	{ "quotas:\n  default: {tokens_per_second: .inf, burst: 20}\n", 2, 32,
	  "is .inf, which is infinite, expected a finite number" },
	{ "quotas:\n  default: {tokens_per_second: 10, burst: -.Inf}\n", 2, 43,
	  "burst is -.Inf, which is infinite, expected a finite number" },
	{ "quotas:\n  default: {tokens_per_second: 1e999, burst: 20}\n", 2, 32,
	  "is 1e999, which overflows, expected a finite number" },
	{ "quotas:\n  default: {tokens_per_second: 0.0000009, burst: 20}\n",
	  2, 32,
	  "tokens_per_second is 0.0000009, out of range, expected a rate in "
	  "[1e-6, 1e9] tokens/s" },
	{ "quotas:\n  default: {tokens_per_second: 1.5e9, burst: 20}\n", 2, 32,
	  "tokens_per_second is 1.5e9, out of range, expected a rate in "
	  "[1e-6, 1e9] tokens/s" },
	{ "quotas:\n  default: {tokens_per_second: 010, burst: 20}\n", 2, 32,
	  "leading zero (octal in YAML 1.1), expected a decimal number" },
	{ "quotas:\n  default: {tokens_per_second: 0x10, burst: 20}\n", 2, 32,
	  "is the string \"0x10\", expected a number" },
	{ "quotas:\n  default: {tokens_per_second: 1_000, burst: 20}\n", 2, 32,
	  "is the string \"1_000\", expected a number" },
	/* bursts */
	{ "quotas:\n  default: {tokens_per_second: 10, burst: 0}\n", 2, 43,
	  "quotas.default.burst is 0, expected a burst > 0 tokens" },
	{ HEAD CALLER("a", "5", "-30"), 6, 14,
	  "quotas.callers[0].burst is -30, expected a burst > 0 tokens" },
	{ "quotas:\n  default: {tokens_per_second: 10, burst: 1.1e9}\n", 2, 43,
	  "burst is 1.1e9, out of range, expected a burst of at most 1e9 "
	  "tokens" },
	/* burst below the largest weight; endpoint_weights comes later */
	{ HEAD CALLER("\"spiffe://x/sa/r\"", "5", "10")
	  "  endpoint_weights:\n    \"/export\": 20\n    /lookup: 1\n", 6, 14,
	  "caller \"spiffe://x/sa/r\" has burst 10, below the weight 20 of "
	  "endpoint \"/export\", expected burst >= 20" },
	{ HEAD "  endpoint_weights: {default: 30, /a: 5}\n", 2, 43,
	  "quotas.default has burst 20, below the weight 30 of endpoint "
	  "\"default\", expected burst >= 30" },
	{ HEAD CALLER("a", "5", "19.5") "  endpoint_weights: {/x: 20}\n", 6,
	  14, "has burst 19.5, below the weight 20 of endpoint \"/x\"" },
	/* duplicate identities, pointing at the first */
	{ HEAD "  callers:\n"
	  "    - {identity: a, tokens_per_second: 5, burst: 30}\n"
	  "    - {identity: b, tokens_per_second: 5, burst: 30}\n"
	  "    - {identity: \"a\", tokens_per_second: 5, burst: 30}\n"
	  "    - {identity: b, tokens_per_second: 5, burst: 30}\n", 6, 18,
	  "duplicate identity \"a\" (first defined at line 4), expected "
	  "each caller identity once" },
	/* priority classes */
	{ HEAD CALLER("a", "5", "30") "      priority: urgent\n", 7, 17,
	  "unknown priority class \"urgent\", expected one of: low, batch, "
	  "standard, critical" },
	{ HEAD CALLER("a", "5", "30") "      priority: standard\n"
	  "  global_ceiling:\n    tokens_per_second: 50\n"
	  "    shed_order: [bulk, gold]\n", 7, 17,
	  "unknown priority class \"standard\", expected one of: bulk, "
	  "gold" },
	{ "quotas:\n  default: {tokens_per_second: 1, burst: 1, priority: "
	  "Low}\n", 2, 55, "unknown priority class \"Low\"" },
	{ HEAD CALLER("a", "5", "30") "      priority: [low]\n", 7, 17,
	  "quotas.callers[0].priority is a sequence, expected a priority "
	  "class" },
	/* duplicate keys */
	{ "quotas:\n  default:\n    tokens_per_second: 10\n    burst: 20\n"
	  "    burst: 30\n", 5, 5, "duplicate key \"burst\" in quotas.default "
	  "(first at line 4), expected each key once" },
	{ HEAD "quotas: {}\n", 3, 1, "duplicate key \"quotas\" in the top "
	  "level (first at line 1)" },
	{ HEAD "  callers: []\n  callers: []\n", 4, 3,
	  "duplicate key \"callers\" in quotas (first at line 3)" },
	{ HEAD "  endpoint_weights:\n    \"/a\": 1\n    /b: 2\n    /a: 3\n",
	  6, 5, "duplicate key \"/a\" in quotas.endpoint_weights (first at "
	  "line 4), expected each endpoint once" },
	/* missing fields and sections */
	{ HEAD "  callers:\n    - identity: a\n      burst: 30\n", 4, 7,
	  "missing required key \"tokens_per_second\" in quotas.callers[0], "
	  "expected all of: identity, tokens_per_second, burst" },
	{ HEAD "  callers:\n    - {tokens_per_second: 5, burst: 30}\n", 4, 7,
	  "missing required key \"identity\" in quotas.callers[0]" },
	{ "quotas:\n  default:\n    tokens_per_second: 10\n", 3, 5,
	  "missing required key \"burst\" in quotas.default, expected all "
	  "of: tokens_per_second, burst" },
	{ "{}\n", 1, 1, "missing required key \"quotas\" at the top level, "
	  "expected a top-level \"quotas\" mapping" },
	{ "quotas:\n  callers: []\n", 2, 3, "missing required key "
	  "\"default\" in quotas" },
	{ "quotas:\n", 1, 8, "quotas is empty, expected a mapping" },
	{ "", 1, 1, "the file is empty, expected a top-level \"quotas\" "
	  "mapping" },
	{ "# only a comment\n\n", 1, 1, "the file is empty" },
	{ HEAD "  global_ceiling: {shed_order: [low]}\n", 3, 19,
	  "missing required key \"tokens_per_second\" in "
	  "quotas.global_ceiling" },
	/* identities and endpoint names */
	{ HEAD CALLER("\"\"", "5", "30"), 4, 17,
	  "quotas.callers[0].identity is empty, expected a verified caller "
	  "identity" },
	{ HEAD CALLER("", "5", "30"), 4, 16,
	  "quotas.callers[0].identity is empty" },
	{ HEAD CALLER("\"a\\0b\"", "5", "30"), 4, 17,
	  "identity \"a?b\" contains a NUL byte" },
	{ HEAD CALLER("default", "5", "30"), 4, 17,
	  "quotas.callers[0].identity \"default\" is reserved for "
	  "quotas.default, expected a caller's own identity" },
	{ HEAD "  endpoint_weights: {\"\": 2}\n", 3, 22,
	  "endpoint name is empty, expected an endpoint name" },
	/* weights */
	{ HEAD "  endpoint_weights: {/x: 0}\n", 3, 26,
	  "the weight of \"/x\" is 0, expected a whole number of tokens in "
	  "[1, 1000000]" },
	{ HEAD "  endpoint_weights: {/x: 1000001}\n", 3, 26,
	  "the weight of \"/x\" is 1000001, expected a whole number of "
	  "tokens in [1, 1000000]" },
	{ HEAD "  endpoint_weights: {/x: 99999999999999999999999}\n", 3, 26,
	  "expected a whole number of tokens in [1, 1000000]" },
	{ HEAD "  endpoint_weights: {/x: -2}\n", 3, 26,
	  "the weight of \"/x\" is -2, expected a whole number" },
	{ HEAD "  endpoint_weights: {/x: 1.5}\n", 3, 26,
	  "the weight of \"/x\" is 1.5, expected a whole number" },
	{ HEAD "  endpoint_weights: {default: 0}\n", 3, 31,
	  "the weight of \"default\" is 0, expected a whole number" },
	{ HEAD "  endpoint_weights: {/x: \"3\"}\n", 3, 26,
	  "the weight of \"/x\" is the string \"3\", expected a whole "
	  "number" },
	/* classes */
	{ HEAD "  global_ceiling:\n    tokens_per_second: 50\n"
	  "    shed_order: [low, batch, low]\n", 5, 30,
	  "duplicate class \"low\" in shed_order (first at line 5, column "
	  "18), expected each class once" },
	{ HEAD "  global_ceiling:\n    tokens_per_second: 50\n"
	  "    shed_order: [a, b, c, d, e, f, g, h, i]\n", 5, 42,
	  "too many classes in shed_order (9), expected at most 8" },
	{ HEAD "  global_ceiling:\n    tokens_per_second: 50\n"
	  "    shed_order: []\n", 5, 17,
	  "shed_order is empty, expected at least one class name" },
	{ HEAD "  global_ceiling:\n    tokens_per_second: 50\n"
	  "    shed_order: [abcdefghijabcdefghijabcdefghijab]\n", 5, 18,
	  "is 32 bytes long, expected a priority class name of at most 31 "
	  "bytes" },
	/* the ceiling */
	{ HEAD "  global_ceiling: {tokens_per_second: 0}\n", 3, 39,
	  "quotas.global_ceiling.tokens_per_second is 0, expected a rate > 0 "
	  "tokens/s" },
	{ HEAD "  global_ceiling: {tokens_per_second: -800}\n", 3, 39,
	  "quotas.global_ceiling.tokens_per_second is -800, expected a rate "
	  "> 0" },
	/* YAML syntax, at libyaml's problem mark */
	{ "quotas:\n  default:\n    tokens_per_second: 1\n   burst: 3\n", 4,
	  4, "invalid YAML: did not find expected key (while parsing a block "
	  "mapping at line 2, column 3), expected valid YAML" },
	{ "quotas:\n  default: {tokens_per_second: 1, burst: [3\n", 3, 1,
	  "invalid YAML: did not find expected ',' or ']'" },
	{ "quotas:\n\tdefault: {}\n", 2, 1, "invalid YAML: found character "
	  "that cannot start any token" },
	{ "quotas:\n  default: {tokens_per_second: \"1, burst: 2}\n", 3, 1,
	  "invalid YAML: found unexpected end of stream" },
	{ "quotas:\n  default: {tokens_per_second: 1, burst: \xff}\n", 2, 42,
	  "invalid YAML: invalid leading UTF-8 octet (byte 0xff), expected "
	  "UTF-8 text" },
	/* anchors, aliases, tags, documents, keys, nesting */
	{ "quotas:\n  default: &d {tokens_per_second: 1, burst: 2}\n", 2, 12,
	  "anchor \"d\": anchors and aliases are not supported, expected "
	  "plain values" },
	{ "x: &r 5\nquotas:\n  default: {tokens_per_second: *r, burst: 2}\n",
	  1, 4, "anchor \"r\": anchors and aliases are not supported" },
	{ "quotas:\n  default: {tokens_per_second: 1, burst: 2}\n"
	  "  callers: *x\n", 3, 12, "alias \"x\": anchors and aliases are not "
	  "supported, expected plain values" },
	{ "quotas:\n  default: !!map {tokens_per_second: 1, burst: 2}\n", 2,
	  12, "tags are not supported, expected an untagged value" },
	{ "quotas:\n  default: {tokens_per_second: !rate 1, burst: 2}\n", 2,
	  32, "tag \"!rate\": tags are not supported" },
	{ HEAD "---\n" HEAD, 3, 1, "a second YAML document, expected exactly "
	  "one document per quota file" },
	{ HEAD "...\n---\nquotas: {}\n", 4, 1, "a second YAML document" },
	{ "quotas:\n  ? [default]\n  : {}\n", 2, 5, "a sequence used as a "
	  "mapping key, expected a plain key" },
	{ "quotas: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
	  "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n", 1, 40,
	  "nesting deeper than 32 levels" },
};
/* clang-format on */

START_TEST(bad_case)
{
	const struct bad *b = &bad_cases[_i];
	expect_bad(b->text, b->line, b->col, b->want);
}
END_TEST

/* Cases built at run time: lengths and counts at and past the limits. */

static char *
with_identity(size_t len)
{
	char *id = malloc(len + 1);
	ck_assert_ptr_nonnull(id);
	memset(id, 'i', len);
	id[len] = '\0';
	size_t size = len + 256;
	char *text = malloc(size);
	ck_assert_ptr_nonnull(text);
	snprintf(text, size,
	    HEAD "  callers:\n"
	         "    - {identity: \"%s\", tokens_per_second: 1, burst: 20}\n",
	    id);
	free(id);
	return text;
}

START_TEST(identity_length_limit)
{
	char *text = with_identity(ALLOT_IDENTITY_MAX);
	allot_config *cfg = parse_ok(text);
	ck_assert_uint_eq(
	    strlen(cfg->callers[0].identity), ALLOT_IDENTITY_MAX);
	allot_config_free(cfg);
	free(text);
	text = with_identity(ALLOT_IDENTITY_MAX + 1);
	expect_bad(text, 4, 18, "quotas.callers[0].identity \"iiii");
	expect_bad(text, 4, 18,
	    "...\" is 256 bytes long, expected a "
	    "verified caller identity such as a SPIFFE ID of at most 255 "
	    "bytes");
	free(text);
}
END_TEST

static char *
with_endpoint(size_t len)
{
	char *text = malloc(len + 256);
	ck_assert_ptr_nonnull(text);
	int n = sprintf(text, HEAD "  endpoint_weights:\n    /");
	memset(text + n, 'e', len - 1);
	strcpy(text + n + len - 1, ": 3\n");
	return text;
}

START_TEST(endpoint_length_limit)
{
	char *text = with_endpoint(ALLOT__ENDPOINT_MAX);
	allot_config *cfg = parse_ok(text);
	ck_assert_uint_eq(strlen(cfg->endpoints[0].name), ALLOT__ENDPOINT_MAX);
	ck_assert_uint_eq(
	    allot__config_weight(cfg, cfg->endpoints[0].name), 3);
	allot_config_free(cfg);
	free(text);
	text = with_endpoint(ALLOT__ENDPOINT_MAX + 1);
	expect_bad(text, 4, 5,
	    "is 64 bytes long, expected an endpoint name "
	    "such as \"/export\" of at most 63 bytes");
	free(text);
}
END_TEST

static char *
with_endpoints(size_t n)
{
	size_t size = 128 + n * 32;
	char *text = malloc(size);
	ck_assert_ptr_nonnull(text);
	size_t o = (size_t) snprintf(text, size,
	    HEAD "  endpoint_weights:\n"
	         "    default: 1\n");
	for (size_t i = 0; i < n; i++)
		o += (size_t) snprintf(
		    text + o, size - o, "    /e%zu: %zu\n", i, i % 7 + 1);
	return text;
}

START_TEST(endpoint_count_limit)
{
	char *text = with_endpoints(ALLOT__MAX_ENDPOINTS);
	allot_config *cfg = parse_ok(text);
	ck_assert_uint_eq(cfg->nendpoints, ALLOT__MAX_ENDPOINTS);
	ck_assert_uint_eq(cfg->max_weight, 7);
	ck_assert_uint_eq(allot__config_weight(cfg, "/e255"), 255 % 7 + 1);
	allot_config_free(cfg);
	free(text);
	/* the 257th endpoint, on line 4 + 257 (after "default" on line 4) */
	text = with_endpoints(ALLOT__MAX_ENDPOINTS + 1);
	expect_bad(text, 4 + ALLOT__MAX_ENDPOINTS + 1, 5,
	    "too many endpoints in quotas.endpoint_weights, expected at most "
	    "256 besides default");
	free(text);
}
END_TEST

static char *
with_callers(size_t n, size_t dup_of_first_at)
{
	size_t size = 128 + n * 64;
	char *text = malloc(size);
	ck_assert_ptr_nonnull(text);
	size_t o = (size_t) snprintf(text, size, HEAD "  callers:\n");
	for (size_t i = 0; i < n; i++)
		o += (size_t) snprintf(text + o, size - o,
		    "    - {identity: "
		    "c%zu, tokens_per_second: 1, burst: 20}\n",
		    i == dup_of_first_at ? 0 : i);
	return text;
}

START_TEST(caller_count_limit)
{
	char *text = with_callers(ALLOT__MAX_CALLERS, SIZE_MAX);
	allot_config *cfg = parse_ok(text);
	ck_assert_uint_eq(cfg->ncallers, ALLOT__MAX_CALLERS);
	const allot__quota *q = allot__config_find(cfg, "c65535");
	ck_assert_ptr_eq(q, &cfg->callers[65535]);
	ck_assert_uint_eq(q->line, 4 + 65535);
	allot_config_free(cfg);
	free(text);

	/* A duplicate among many: found and pointed back at line 4. */
	text = with_callers(1000, 777);
	expect_bad(text, 4 + 777, 18,
	    "duplicate identity \"c0\" (first "
	    "defined at line 4)");
	free(text);

	text = with_callers(ALLOT__MAX_CALLERS + 1, SIZE_MAX);
	expect_bad(text, 4 + ALLOT__MAX_CALLERS, 7,
	    "too many callers (65537), expected at most 65536");
	free(text);
	/* A service's view counts the top level's callers and its own:
	 * overriding one adds nothing, adding one more is too many. */
	char *base = with_callers(ALLOT__MAX_CALLERS, SIZE_MAX);
	size_t len = strlen(base) + 256;
	text = malloc(len);
	ck_assert_ptr_nonnull(text);
	snprintf(text, len,
	    "%sservices:\n  s: {callers: [{identity: c7, "
	    "tokens_per_second: 2, burst: 20}]}\n",
	    base);
	cfg = parse_ok(text);
	allot_config *view = NULL;
	ck_assert_int_eq(allot__config_select(cfg, "s", &view), ALLOT_OK);
	ck_assert_uint_eq(view->ncallers, ALLOT__MAX_CALLERS);
	ck_assert_double_eq(view->callers[7].rate, 2);
	allot_config_free(view);
	allot_config_free(cfg);
	snprintf(text, len,
	    "%sservices:\n  s: {callers: [{identity: more, "
	    "tokens_per_second: 2, burst: 20}]}\n",
	    base);
	expect_bad(text, 4 + ALLOT__MAX_CALLERS + 1, 3,
	    "service \"s\" has 65537 quotas in its view (the top level's "
	    "and its own), expected at most 65536");
	free(text);
	free(base);
}
END_TEST

START_TEST(nul_in_text)
{
	static const char text[] = "quotas:\n  default: {tokens_per_second:"
	                           " 1, burst: 2}\0\n";
	expect_bad_len(text, sizeof text - 1, 2, 44,
	    "invalid YAML: control "
	    "characters are not allowed");
}
END_TEST

START_TEST(errors_in_file_order)
{
	/* Two bad sections: the first one in the file is reported. */
	expect_bad("quotas:\n"
	           "  endpoint_weights: {/x: 0}\n"
	           "  default: {tokens_per_second: -1, burst: 20}\n",
	    2, 26, "the weight of \"/x\" is 0");
	expect_bad("quotas:\n"
	           "  default: {burst: -3, tokens_per_second: -1}\n",
	    2, 20, "quotas.default.burst is -3");
}
END_TEST

static Suite *
config_suite(void)
{
	Suite *s = suite_create("config");
	TCase *tc = tcase_create("load");
	tcase_add_test(tc, reference_loads_with_exact_values);
	tcase_add_test(tc, load_and_parse_agree);
	tcase_add_test(tc, shadow_fallback_and_custom_classes);
	tcase_add_test(tc, defaults_when_absent);
	tcase_add_test(tc, scalar_spellings);
	tcase_add_test(tc, load_errors);
	tcase_add_test(tc, errbuf_truncated_safely);
	suite_add_tcase(s, tc);

	tc = tcase_create("digest");
	tcase_add_test(tc, digest_ignores_layout);
	tcase_add_test(tc, digest_follows_content);
	suite_add_tcase(s, tc);

	tc = tcase_create("helpers");
	tcase_add_test(tc, config_weight);
	tcase_add_test(tc, config_find);
	tcase_add_test(tc, config_dup_is_deep_and_equal);
	suite_add_tcase(s, tc);

	/* Tagged: tests/meson.build runs these two as meson tests of their
	 * own (config-reject, config-limits), the rest as `config`. */
	tc = tcase_create("reject");
	tcase_set_tags(tc, "reject");
	tcase_add_loop_test(
	    tc, bad_case, 0, (int) (sizeof bad_cases / sizeof bad_cases[0]));
	tcase_add_test(tc, nul_in_text);
	tcase_add_test(tc, errors_in_file_order);
	suite_add_tcase(s, tc);

	/* Files at the loader's limits: tens of thousands of callers. */
	tc = tcase_create("limits");
	tcase_set_tags(tc, "limits");
	tcase_add_test(tc, identity_length_limit);
	tcase_add_test(tc, endpoint_length_limit);
	tcase_add_test(tc, endpoint_count_limit);
	tcase_add_test(tc, caller_count_limit);
	tcase_set_timeout(tc, 60);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(config_suite)
