/* SPDX-License-Identifier: MIT */
/*
 * What the quota file loader's suites share (test_config.c,
 * test_config_format.c): loading that must succeed, parsing that must
 * fail at a given LINE:COL with a given message, and text edits.
 */
#ifndef ALLOT_TESTS_CONFIG_UTIL_H
#define ALLOT_TESTS_CONFIG_UTIL_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

#define DATA(f) ALLOT_TEST_DATA "/" f

#define CHECKOUT "spiffe://prod.example.internal/ns/payments/sa/checkout"
#define SEARCH "spiffe://prod.example.internal/ns/search/sa/search"
#define REPORTING "spiffe://prod.example.internal/ns/analytics/sa/reporting"

/* A valid head: lines 1-2. On line 2 the rate is at column 32 and the
 * burst at column 43. */
#define HEAD "quotas:\n  default: {tokens_per_second: 10, burst: 20}\n"
/* One block-style caller, lines 3-6: `-` at 4:5, identity value at 4:17,
 * rate value at 5:26, burst value at 6:14. */
#define CALLER(id, rate, burst)               \
	"  callers:\n"                        \
	"    - identity: " id "\n"            \
	"      tokens_per_second: " rate "\n" \
	"      burst: " burst "\n"

static inline allot_config *
load_ok(const char *path)
{
	char err[512] = "";
	allot_config *cfg = NULL;
	int rc = allot_config_load(path, err, sizeof err, &cfg);
	ck_assert_msg(rc == ALLOT_OK, "%s: rc %d: %s", path, rc, err);
	ck_assert_ptr_nonnull(cfg);
	return cfg;
}

static inline allot_config *
parse_ok(const char *text)
{
	char err[512] = "";
	allot_config *cfg = NULL;
	int rc = allot_config_parse(
	    "t.yaml", text, strlen(text), err, sizeof err, &cfg);
	ck_assert_msg(rc == ALLOT_OK, "rc %d: %s\n--\n%s", rc, err, text);
	ck_assert_ptr_nonnull(cfg);
	return cfg;
}

/* Parse `text` (as "t.yaml") and require ALLOT_ECONFIG, a message at
 * line:col containing `want` and of the form "what, expected what", and
 * the output pointer left alone. */
static inline void
expect_bad_len(
    const char *text, size_t len, int line, int col, const char *want)
{
	char err[1024], prefix[64];
	allot_config sentinel;
	allot_config *cfg = &sentinel;
	memset(err, 'x', sizeof err);
	int rc = allot_config_parse(
	    "t.yaml", text, len, err, sizeof err, &cfg);
	ck_assert_msg(rc == ALLOT_ECONFIG, "rc %d (%s) for:\n%s", rc,
	    rc == ALLOT_OK ? "loaded" : err, text);
	ck_assert_ptr_eq(cfg, &sentinel);
	snprintf(prefix, sizeof prefix, "t.yaml:%d:%d: ", line, col);
	ck_assert_msg(strncmp(err, prefix, strlen(prefix)) == 0,
	    "want position %s, got: %s", prefix, err);
	ck_assert_msg(
	    strstr(err, want) != NULL, "want \"%s\" in: %s", want, err);
	ck_assert_msg(strstr(err, ", expected ") != NULL,
	    "no \", expected\" in: %s", err);
}

static inline void
expect_bad(const char *text, int line, int col, const char *want)
{
	expect_bad_len(text, strlen(text), line, col, want);
}

static inline char *
slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	ck_assert_ptr_nonnull(f);
	char *buf = malloc(1 << 16);
	ck_assert_ptr_nonnull(buf);
	size_t n = fread(buf, 1, (1 << 16) - 1, f);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

/* Replace the one occurrence of `from` in `text` by `to` (new string). */
static inline char *
edit(const char *text, const char *from, const char *to)
{
	const char *at = strstr(text, from);
	ck_assert_msg(at != NULL, "\"%s\" not in text", from);
	ck_assert_ptr_null(strstr(at + 1, from));
	size_t head = (size_t) (at - text);
	char *out = malloc(strlen(text) + strlen(to) + 1);
	ck_assert_ptr_nonnull(out);
	memcpy(out, text, head);
	strcpy(out + head, to);
	strcat(out, at + strlen(from));
	return out;
}

static inline uint64_t
digest_of(const char *text)
{
	allot_config *cfg = parse_ok(text);
	uint64_t d = cfg->digest;
	allot_config_free(cfg);
	return d;
}

static inline const char *
class_of(const allot_config *cfg, const allot__quota *q)
{
	ck_assert_uint_lt(q->priority, cfg->nclasses);
	return cfg->classes[q->priority];
}

/* ------------------------------------------------------------------ */

#endif
