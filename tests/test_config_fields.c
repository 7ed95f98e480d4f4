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
 * today. And the table itself: every row complete, the digest's frozen
 * places untouched, and every field, in every kind of quota that takes
 * it, moving the digest and named alone by the diff when it changes
 * alone (a row added to the table is tried as it is).
 */
#include <check.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "config_diff.h"
#include "config_fields.h"
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

/* ---- The field table ---- */

/* Every row can be loaded, digested and written: a key, a type, the
 * quotas that take it, and one digest form (the frozen first format and
 * extension, or only where it is set, which any new row gets). */
START_TEST(table_rows_complete)
{
	static const char *const ext[] = { "tokens_per_second", "candidate",
		"owner", "reason", "expected_peak", "labels" };
	unsigned places = 0;
	/* Keys per scope: a caller's identity and endpoints, the fields'. */
	size_t next = 0, keys[3] = { 0, 2, 0 };
	for (size_t i = 0; i < allot__nqfields; i++) {
		const allot__qfield *f = &allot__qfields[i];
		ck_assert_msg(
		    f->key != NULL && f->key[0] != '\0', "row %zu", i);
		ck_assert_msg(
		    f->scopes != 0 && (f->scopes & ~ALLOT__QS_ALL) == 0,
		    "%s: scopes", f->key);
		ck_assert_msg(allot__qfield_label(f)[0] != '\0', "%s", f->key);
		ck_assert_msg((strcmp(f->key, "identity") != 0 &&
		                  strcmp(f->key, "endpoints") != 0 &&
		                  strncmp(f->key, "tokens_per_", 11) != 0) ||
		        f->type == ALLOT__QT_RATE,
		    "%s: a quota's name or a unit", f->key);
		for (size_t j = 0; j < i; j++)
			ck_assert_msg(
			    strcmp(allot__qfields[j].key, f->key) != 0,
			    "%s twice", f->key);
		/* The first format and its extension are frozen. */
		ck_assert_msg(f->first <= ALLOT__QFIRST_N, "%s", f->key);
		if (f->first != 0) {
			ck_assert_msg((places & (1u << f->first)) == 0,
			    "%s: place %u twice", f->key, f->first);
			places |= 1u << f->first;
		}
		if (f->flags & ALLOT__QF_DIGEST_EXT) {
			ck_assert_msg(next < sizeof ext / sizeof ext[0] &&
			        strcmp(f->key, ext[next]) == 0,
			    "%s: not in the frozen extension", f->key);
			next++;
		}
		if (f->flags & ALLOT__QF_INHERIT)
			ck_assert_msg(f->scopes & ALLOT__QS_ENDPOINT,
			    "%s inherited but not taken by endpoint quotas",
			    f->key);
		/* What each type needs from its row. */
		switch (f->type) {
		case ALLOT__QT_WORD:
			ck_assert_msg(f->words != NULL && f->words[0] &&
			        f->words[1] && f->words[2],
			    "%s: fewer than three words", f->key);
			break;
		case ALLOT__QT_RATE:
		case ALLOT__QT_BURST:
		case ALLOT__QT_PER_UNIT:
		case ALLOT__QT_LABELS:
		case ALLOT__QT_CANDIDATE:
		case ALLOT__QT_FRACTION: break;
		case ALLOT__QT_BOOL:
			ck_assert_msg(f->word != NULL, "%s: no word", f->key);
			break;
		case ALLOT__QT_CLASS:
		case ALLOT__QT_TEXT:
			ck_assert_msg(f->max > 0 && f->expect != NULL,
			    "%s: no bound or expectation", f->key);
			break;
		}
		for (unsigned s = 0; s < 3; s++)
			if (f->scopes & (1u << s))
				keys[s] += f->type == ALLOT__QT_RATE ? 4 : 1;
	}
	ck_assert_uint_eq(places, ((1u << ALLOT__QFIRST_N) - 1) << 1);
	ck_assert_uint_eq(next, sizeof ext / sizeof ext[0]);
	for (unsigned s = 0; s < 3; s++)
		ck_assert_uint_le(keys[s], ALLOT__QKEYS_MAX);
}
END_TEST

/* A value of a field in the first config of a pair (NULL: absent) and
 * in the second. A rate's values carry their key (the unit). */
typedef struct change {
	const char *from, *to;
} change;

/* `access`: closed or unlimited, a quota has no rate or burst. */
static bool
is_access(const allot__qfield *f)
{
	return f != NULL && strcmp(f->key, "access") == 0;
}

/* The changes tried for field `f`, into ret[0..n); n. Each changes the
 * field alone; with a second case where a part of it can change alone
 * (a rate's unit or value, a candidate's burst, labels' order). */
static size_t
changes_of(const allot__qfield *f, change *ret)
{
	switch (f->type) {
	case ALLOT__QT_RATE:
		ret[0] = (change) { "tokens_per_second: 10",
			"tokens_per_minute: 600" };
		ret[1] = (change) { "tokens_per_second: 10",
			"tokens_per_second: 11" };
		return 2;
	case ALLOT__QT_BURST: ret[0] = (change) { "20", "21" }; return 1;
	case ALLOT__QT_CLASS:
		ret[0] = (change) { NULL, "critical" };
		ret[1] = (change) { "batch", "standard" };
		return 2;
	case ALLOT__QT_BOOL:
		ret[0] = (change) { NULL, f->dflt ? "false" : "true" };
		return 1;
	case ALLOT__QT_WORD:
		ret[0] = (change) { f->words[1], f->words[2] };
		/* Access away from limited drops the rate and burst, a
		 * change of more than itself (quota_map()). */
		if (is_access(f))
			return 1;
		ret[1] = (change) { NULL, f->words[1] };
		return 2;
	case ALLOT__QT_TEXT:
		ret[0] = (change) { NULL, "\"a b\"" };
		ret[1] = (change) { "a", "b" };
		return 2;
	case ALLOT__QT_PER_UNIT:
		ret[0] = (change) { NULL, "7" };
		ret[1] = (change) { "7", "8" };
		return 2;
	case ALLOT__QT_LABELS:
		ret[0] = (change) { NULL, "{a: b}" };
		ret[1] = (change) { "{a: b, c: d}", "{c: d, a: b}" };
		return 2;
	case ALLOT__QT_CANDIDATE:
		ret[0] = (change) { NULL,
			"{tokens_per_second: 5, burst: 10}" };
		ret[1] = (change) { "{tokens_per_second: 5, burst: 10}",
			"{tokens_per_second: 5, burst: 11}" };
		ret[2] = (change) { "{tokens_per_second: 5, burst: 10}",
			"{tokens_per_second: 6, burst: 10}" };
		return 3;
	case ALLOT__QT_FRACTION:
		ret[0] = (change) { NULL, "0" };
		ret[1] = (change) { "0.25", "0.5" };
		return 2;
	}
	return 0;
}

/* Where the changed quota sits: its scope, and whether it is a
 * service's own. */
static const struct place {
	unsigned scope;
	const char *service, *key;
} places[] = {
	{ ALLOT__QS_DEFAULT, NULL, "default" },
	{ ALLOT__QS_CALLER, NULL, "spiffe://t/a" },
	{ ALLOT__QS_ENDPOINT, NULL, "spiffe://t/a /x" },
	{ ALLOT__QS_DEFAULT, "s1", "default" },
	{ ALLOT__QS_CALLER, "s1", "spiffe://t/s" },
};
#define NPLACES (sizeof places / sizeof places[0])

/* The flow mapping of a quota of `scope`: every required field at its
 * first value, and field `f` at `v` (NULL: absent). */
static void
quota_map(char *buf, size_t size, unsigned scope, const allot__qfield *f,
    const char *v)
{
	size_t n = (size_t) snprintf(buf, size, "{");
	for (size_t i = 0; i < allot__nqfields; i++) {
		const allot__qfield *g = &allot__qfields[i];
		change ch[4];
		const char *val = g == f ? v : NULL;
		if (g != f && (g->flags & ALLOT__QF_REQUIRED) &&
		    (g->scopes & scope) && !(is_access(f) && v != NULL) &&
		    changes_of(g, ch) > 0)
			val = ch[0].from;
		if (val == NULL)
			continue;
		n += (size_t) snprintf(
		    buf + n, size - n, "%s", n > 1 ? ", " : "");
		if (g->type == ALLOT__QT_RATE)
			n += (size_t) snprintf(buf + n, size - n, "%s", val);
		else
			n += (size_t) snprintf(
			    buf + n, size - n, "%s: %s", g->key, val);
	}
	snprintf(buf + n, size - n, "}");
	ck_assert_uint_lt(n + 1, size);
}

#define TEXT_MAX 8192

/* A file whose quota at `p` has field `f` at `v`, every other quota
 * only its required fields. */
static char *
file_with(const struct place *p, const allot__qfield *f, const char *v)
{
	char q[5][512], *text = malloc(TEXT_MAX);
	static const unsigned scope[5] = { ALLOT__QS_DEFAULT, ALLOT__QS_CALLER,
		ALLOT__QS_ENDPOINT, ALLOT__QS_DEFAULT, ALLOT__QS_CALLER };
	ck_assert_ptr_nonnull(text);
	for (size_t i = 0; i < 5; i++)
		quota_map(q[i], sizeof q[i], scope[i],
		    &places[i] == p ? f : NULL, &places[i] == p ? v : NULL);
	snprintf(text, TEXT_MAX,
	    "quotas:\n"
	    "  default: %s\n"
	    "  callers:\n"
	    "    - {identity: \"spiffe://t/a\", endpoints: {\"/x\": %s},\n"
	    "       %s\n"
	    "  endpoint_weights: {\"/x\": 1}\n"
	    "services:\n"
	    "  s1:\n"
	    "    default: %s\n"
	    "    callers:\n"
	    "      - {identity: \"spiffe://t/s\", %s\n",
	    q[0], q[2], q[1] + 1, q[3], q[4] + 1);
	return text;
}

/* The change of quota `key` (of service `svc`) in d; NULL if none. */
static const allot__quota_change *
change_of(const allot__config_diff *d, const char *svc, const char *key)
{
	for (size_t i = 0; i < d->n; i++) {
		const allot__quota_change *c = &d->v[i];
		if (strcmp(c->quota, key) == 0 &&
		    (svc == NULL ? c->service == NULL :
		                   c->service && strcmp(c->service, svc) == 0))
			return c;
	}
	return NULL;
}

/* A diff from `a` to `b` whose change of the quota at `p` moved field
 * `f` alone, and which changed nothing else but (`inherited`) the
 * endpoint quota of that caller. */
static void
assert_diff_names(const allot_config *a, const allot_config *b,
    const struct place *p, const allot__qfield *f, bool inherited)
{
	allot__config_diff d;
	char want[128];
	ck_assert_int_eq(allot__config_diff_compute(a, b, &d), ALLOT_OK);
	const allot__quota_change *c = change_of(&d, p->service, p->key);
	ck_assert_msg(c != NULL, "%s: no change of %s", f->key, p->key);
	ck_assert_int_eq(c->kind, ALLOT__QUOTA_CHANGED);
	snprintf(want, sizeof want, "%s ", allot__qfield_label(f));
	ck_assert_msg(strncmp(c->fields, want, strlen(want)) == 0 &&
	        strstr(c->fields, "; ") == NULL,
	    "%s at %s: fields \"%s\"", f->key, p->key, c->fields);
	ck_assert_str_ne(c->before, c->after);
	const allot__quota_change *e = NULL;
	if (inherited) {
		e = change_of(&d, NULL, "spiffe://t/a /x");
		ck_assert_msg(
		    e != NULL && strncmp(e->fields, want, strlen(want)) == 0,
		    "%s: not inherited", f->key);
	}
	ck_assert_msg(d.n == (inherited ? 2u : 1u), "%s at %s: %zu changes",
	    f->key, p->key, d.n);
	allot__config_diff_free(&d);
}

/* For every row of the table, in every kind of quota that takes it:
 * two files that differ in that field alone have different digests,
 * and their diff names the field and nothing else. A row added to the
 * table is covered here as it is. An inherited field set on a caller
 * moves its endpoint quota too. */
START_TEST(every_field_digested_and_diffed)
{
	const allot__qfield *f = &allot__qfields[_i];
	change ch[4];
	size_t nch = changes_of(f, ch);
	ck_assert_uint_gt(nch, 0);
	for (size_t pi = 0; pi < NPLACES; pi++) {
		const struct place *p = &places[pi];
		if ((f->scopes & p->scope) == 0)
			continue;
		for (size_t k = 0; k < nch; k++) {
			char *ta = file_with(p, f, ch[k].from);
			char *tb = file_with(p, f, ch[k].to);
			allot_config *a = parse_ok(ta);
			allot_config *b = parse_ok(tb);
			ck_assert_msg(a->digest != b->digest,
			    "%s at %s: %s -> %s, the same digest", f->key,
			    p->key, ch[k].from, ch[k].to);
			assert_diff_names(a, b, p, f,
			    (f->flags & ALLOT__QF_INHERIT) &&
			        p->scope == ALLOT__QS_CALLER &&
			        p->service == NULL);
			allot_config_free(b);
			allot_config_free(a);
			free(ta);
			free(tb);
		}
	}
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

	tc = tcase_create("table");
	tcase_add_test(tc, table_rows_complete);
	tcase_add_loop_test(
	    tc, every_field_digested_and_diffed, 0, (int) allot__nqfields);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(config_fields_suite)
