/* SPDX-License-Identifier: MIT */
/*
 * What a quota file loads to, pinned: the digest of every file under
 * tests/data and of inline files that set every per-quota key (units,
 * candidates, review metadata, shadow, fallback, priority, endpoint
 * quotas, services, overcommit), and the text each quota has in a diff
 * and an audit row. The values are those the loader computed before
 * the quota fields became one table (common/config_fields.c): agents
 * and stored SQLite rows compare digests across upgrades, and audit
 * rows keep their text, so neither may change for a file that loads
 * today.
 */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "config_diff.h"
#include "config_util.h"
#include "runner.h"

/* ---- Inline files: every per-quota key in every scope ---- */

/* Only the keys of the first format: no extension in any quota. */
static const char first_format[] =
    "quotas:\n"
    "  default: {tokens_per_second: 10, burst: 20, shared: true,\n"
    "    priority: batch, shadow: true, fallback: closed}\n"
    "  callers:\n"
    "    - {identity: \"spiffe://t/a\", tokens_per_second: 500,\n"
    "       burst: 1000, priority: critical, fallback: open}\n"
    "    - {identity: \"spiffe://t/b\", tokens_per_second: 0.5, burst: 50}\n"
    "  endpoint_weights: {default: 2, \"/export\": 20}\n"
    "  global_ceiling: {tokens_per_second: 800,\n"
    "    shed_order: [bulk, batch, silver, critical]}\n";

static const char units[] =
    "quotas:\n"
    "  default: {tokens_per_minute: 600, burst: 20}\n"
    "  callers:\n"
    "    - {identity: \"spiffe://t/a\", tokens_per_hour: 36000, burst: 40}\n"
    "    - {identity: \"spiffe://t/b\", tokens_per_day: 86400, burst: 50}\n"
    "    - {identity: \"spiffe://t/c\", tokens_per_second: 3, burst: 6}\n";

static const char candidate[] =
    "quotas:\n"
    "  default: {tokens_per_second: 10, burst: 20,\n"
    "    candidate: {tokens_per_second: 8, burst: 16}}\n"
    "  callers:\n"
    "    - identity: \"spiffe://t/a\"\n"
    "      tokens_per_minute: 6000\n"
    "      burst: 200\n"
    "      candidate: {tokens_per_minute: 4800, burst: 100}\n"
    "    - identity: \"spiffe://t/b\"\n"
    "      tokens_per_second: 5\n"
    "      burst: 10\n"
    "      candidate: {tokens_per_day: 86400, burst: 10}\n";

static const char metadata[] =
    "quotas:\n"
    "  default:\n"
    "    tokens_per_second: 10\n"
    "    burst: 20\n"
    "    owner: platform\n"
    "    reason: \"unknown callers, kept small\"\n"
    "  callers:\n"
    "    - identity: \"spiffe://t/a\"\n"
    "      tokens_per_second: 500\n"
    "      burst: 1000\n"
    "      owner: team-payments\n"
    "      reason: \"Black Friday peak, measured 2026-11-27 \\\"by ops\\\"\"\n"
    "      expected_peak: 420\n"
    "      labels: {ticket: OPS-1234, tier: \"1\", note: \"caf\xc3\xa9 au "
    "lait\"}\n"
    "    - identity: \"spiffe://t/b\"\n"
    "      tokens_per_hour: 3600\n"
    "      burst: 10\n"
    "      expected_peak: 1800\n"
    "    - identity: \"spiffe://t/c\"\n"
    "      tokens_per_second: 1\n"
    "      burst: 2\n"
    "      labels: {z: last, a: first}\n"
    "    - identity: \"spiffe://t/d\"\n"
    "      tokens_per_second: 1\n"
    "      burst: 2\n"
    "      owner: \"a b\"\n";

/* Endpoint quotas: inherited priority, shadow and fallback, and their
 * own values and keys. */
static const char endpoints[] =
    "quotas:\n"
    "  default: {tokens_per_second: 10, burst: 20}\n"
    "  callers:\n"
    "    - identity: \"spiffe://t/a\"\n"
    "      tokens_per_second: 100\n"
    "      burst: 200\n"
    "      priority: critical\n"
    "      shadow: true\n"
    "      fallback: open\n"
    "      endpoints:\n"
    "        \"/export\": {tokens_per_day: 1000, burst: 50}\n"
    "        \"/report\": {tokens_per_second: 2, burst: 40, priority: low,\n"
    "          shadow: false, fallback: closed, owner: analytics}\n"
    "    - identity: \"spiffe://t/b\"\n"
    "      tokens_per_second: 100\n"
    "      burst: 200\n"
    "      endpoints:\n"
    "        \"/export\":\n"
    "          tokens_per_second: 1\n"
    "          burst: 20\n"
    "          candidate: {tokens_per_second: 0.5, burst: 20}\n"
    "          labels: {kind: export}\n"
    "  endpoint_weights: {\"/export\": 20, \"/report\": 5}\n";

static const char services[] =
    "quotas:\n"
    "  default: {tokens_per_second: 10, burst: 20, priority: low}\n"
    "  callers:\n"
    "    - {identity: \"spiffe://t/a\", tokens_per_second: 500,\n"
    "       burst: 1000, priority: critical}\n"
    "  global_ceiling: {tokens_per_second: 800, overcommit: true}\n"
    "services:\n"
    "  search:\n"
    "    callers:\n"
    "      - {identity: \"spiffe://t/s\", tokens_per_hour: 36000,\n"
    "         burst: 40, priority: standard, shadow: true}\n"
    "  billing:\n"
    "    default: {tokens_per_second: 2, burst: 30, shadow: true,\n"
    "      fallback: closed, owner: billing, reason: \"tight\",\n"
    "      expected_peak: 1, labels: {a: b},\n"
    "      candidate: {tokens_per_second: 1, burst: 30}}\n"
    "    callers:\n"
    "      - identity: \"spiffe://t/a\"\n"
    "        tokens_per_second: 20\n"
    "        burst: 60\n"
    "        endpoints:\n"
    "          \"/invoice\": {tokens_per_minute: 60, burst: 30,\n"
    "            fallback: open}\n"
    "    endpoint_weights: {default: 2, \"/invoice\": 30}\n"
    "    global_ceiling: {tokens_per_second: 600}\n"
    "  empty: {}\n";

static const char overcommit[] =
    "quotas:\n"
    "  default: {tokens_per_second: 10, burst: 20}\n"
    "  callers:\n"
    "    - {identity: \"spiffe://t/a\", tokens_per_second: 900, burst: "
    "1000}\n"
    "  global_ceiling: {tokens_per_second: 800, overcommit: true,\n"
    "    shed_order: [low, high]}\n";

/* ---- Digests ---- */

/* A file (text NULL: `name` under tests/data) and its digest. */
static const struct pin {
	const char *name;
	const char *text;
	uint64_t digest;
} pins[] = {
	{ "reference.yaml", NULL, 0xfabf929e7e095835ull },
	{ "reference-reformatted.yaml", NULL, 0xfabf929e7e095835ull },
	{ "rollout.yaml", NULL, 0x118d826f7cc7f349ull },
	{ "services.yaml", NULL, 0x167b55f67d74e5d0ull },
	{ "first_format", first_format, 0x6f21fb03bf57b382ull },
	{ "units", units, 0x965b1b2ece101760ull },
	{ "candidate", candidate, 0xde5376ef402324c5ull },
	{ "metadata", metadata, 0x735c68c7566aabdfull },
	{ "endpoints", endpoints, 0x010f74fefd4eb43eull },
	{ "services", services, 0xe2b576ce8bc0333cull },
	{ "overcommit", overcommit, 0x26e35d0df3e6e66bull },
};

static allot_config *
load_pin(const struct pin *p)
{
	char path[512];
	if (p->text != NULL)
		return parse_ok(p->text);
	snprintf(path, sizeof path, "%s/%s", ALLOT_TEST_DATA, p->name);
	return load_ok(path);
}

START_TEST(digests_pinned)
{
	const struct pin *p = &pins[_i];
	allot_config *cfg = load_pin(p);
	ck_assert_msg(cfg->digest == p->digest,
	    "%s: digest %016" PRIx64 ", pinned %016" PRIx64, p->name,
	    cfg->digest, p->digest);
	allot_config_free(cfg);
}
END_TEST

/* The one file under tests/data that does not load, as it is refused. */
START_TEST(bad_burst_refused)
{
	char path[512], err[512] = "", want[768];
	allot_config *cfg = NULL;
	snprintf(path, sizeof path, "%s/bad-burst.yaml", ALLOT_TEST_DATA);
	ck_assert_int_eq(
	    allot_config_load(path, err, sizeof err, &cfg), ALLOT_ECONFIG);
	snprintf(want, sizeof want,
	    "%s:10:14: caller \"" REPORTING "\" has burst 10, below the "
	    "weight 20 of endpoint \"/export\", expected burst >= 20 (a "
	    "request there could never pass)",
	    path);
	ck_assert_str_eq(err, want);
}
END_TEST

/* ---- Texts (diffs, audit rows) ---- */

/* A quota of a pinned file (in the view of `service`, NULL: the top
 * level) by wire key, and its text. */
static const struct text_pin {
	const char *file, *service, *key, *text;
} texts[] = {
	{ "rollout.yaml", NULL, "default",
	    "5/s burst 50 bulk fallback closed" },
	{ "rollout.yaml", NULL,
	    "spiffe://prod.example.internal/ns/ml/sa/trainer",
	    "50.5/s burst 101 bulk shadow" },
	{ "services.yaml", NULL, CHECKOUT,
	    "500/s burst 1000 critical owner team-payments reason \"Black "
	    "Friday peak, measured 2026-11-27\" peak 420/s labels "
	    "ticket=OPS-1234,tier=1" },
	{ "services.yaml", NULL, REPORTING,
	    "6000/min burst 200 batch candidate 4800/min burst 100" },
	{ "services.yaml", NULL, REPORTING " /export",
	    "1000/day burst 50 batch owner team-analytics" },
	{ "services.yaml", "search",
	    "spiffe://prod.example.internal/ns/search/sa/indexer",
	    "36000/h burst 40 standard" },
	{ "services.yaml", "billing", "default", "2/s burst 30 low shadow" },
	{ "first_format", NULL, "default",
	    "10/s burst 20 batch shadow fallback closed" },
	{ "first_format", NULL, "spiffe://t/a",
	    "500/s burst 1000 critical fallback open" },
	{ "units", NULL, "default", "600/min burst 20 low" },
	{ "units", NULL, "spiffe://t/a", "36000/h burst 40 low" },
	{ "units", NULL, "spiffe://t/b", "86400/day burst 50 low" },
	{ "candidate", NULL, "default",
	    "10/s burst 20 low candidate 8/s burst 16" },
	{ "candidate", NULL, "spiffe://t/b",
	    "5/s burst 10 low candidate 1/s burst 10" },
	{ "metadata", NULL, "default",
	    "10/s burst 20 low owner platform reason \"unknown callers, kept "
	    "small\"" },
	{ "metadata", NULL, "spiffe://t/a",
	    "500/s burst 1000 low owner team-payments reason \"Black Friday "
	    "peak, measured 2026-11-27 \\\"by ops\\\"\" peak 420/s labels "
	    "ticket=OPS-1234,tier=1,\"note=caf\xc3\xa9 au lait\"" },
	{ "metadata", NULL, "spiffe://t/b", "3600/h burst 10 low peak 0.5/s" },
	{ "metadata", NULL, "spiffe://t/c",
	    "1/s burst 2 low labels z=last,a=first" },
	{ "metadata", NULL, "spiffe://t/d", "1/s burst 2 low owner \"a b\"" },
	{ "endpoints", NULL, "spiffe://t/a",
	    "100/s burst 200 critical shadow fallback open" },
	{ "endpoints", NULL, "spiffe://t/a /export",
	    "1000/day burst 50 critical shadow fallback open" },
	{ "endpoints", NULL, "spiffe://t/a /report",
	    "2/s burst 40 low fallback closed owner analytics" },
	{ "endpoints", NULL, "spiffe://t/b /export",
	    "1/s burst 20 low candidate 0.5/s burst 20 labels kind=export" },
	{ "services", "billing", "default",
	    "2/s burst 30 low shadow candidate 1/s burst 30 fallback closed "
	    "owner billing reason tight peak 1/s labels a=b" },
	{ "services", "billing", "spiffe://t/a /invoice",
	    "60/min burst 30 low fallback open" },
	{ "services", "search", "spiffe://t/s",
	    "36000/h burst 40 standard shadow" },
};

static const struct pin *
pin_named(const char *name)
{
	for (size_t i = 0; i < sizeof pins / sizeof pins[0]; i++)
		if (strcmp(pins[i].name, name) == 0)
			return &pins[i];
	ck_abort_msg("no pinned file %s", name);
	return NULL;
}

START_TEST(texts_pinned)
{
	const struct text_pin *t = &texts[_i];
	allot_config *cfg = load_pin(pin_named(t->file)), *view = NULL;
	ck_assert_int_eq(
	    allot__config_select(cfg, t->service, &view), ALLOT_OK);
	const allot__quota *q = NULL;
	char key[512];
	for (size_t i = 0; i <= view->ncallers && q == NULL; i++) {
		const allot__quota *c = i == 0 ? &view->def :
		                                 &view->callers[i - 1];
		allot__quota_key(c, key, sizeof key);
		if (strcmp(key, t->key) == 0)
			q = c;
	}
	ck_assert_msg(q != NULL, "%s: no quota %s", t->file, t->key);
	char *text = allot__quota_text(view, q);
	ck_assert_str_eq(text, t->text);
	free(text);
	allot_config_free(view);
	allot_config_free(cfg);
}
END_TEST

static Suite *
config_fields_suite(void)
{
	Suite *s = suite_create("config-fields");
	TCase *tc = tcase_create("pinned");
	tcase_add_loop_test(
	    tc, digests_pinned, 0, (int) (sizeof pins / sizeof pins[0]));
	tcase_add_test(tc, bad_burst_refused);
	tcase_add_loop_test(
	    tc, texts_pinned, 0, (int) (sizeof texts / sizeof texts[0]));
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(config_fields_suite)
