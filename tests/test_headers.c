/* SPDX-License-Identifier: MIT */
/*
 * Response header helpers: Retry-After rounding, the IETF RateLimit and
 * RateLimit-Policy fields, and the X-RateLimit-* triple, from decisions
 * built by hand and from a real agent.
 */
#include <check.h>
#include <string.h>

#include <allot/allot.h>

#include "runner.h"

static allot_decision
denied(uint64_t retry_ns)
{
	allot_decision d = { 0 };
	d.allowed = false;
	d.cost = 20;
	d.retry_after_ns = retry_ns;
	d.reset_ns = 2000000000ull;
	d.limit = 200;
	d.rate = 100;
	d.remaining = 3.7;
	return d;
}

START_TEST(retry_after_rounds_up)
{
	char buf[32];
	allot_decision d = denied(1);
	ck_assert_int_eq(allot_fmt_retry_after(&d, buf, sizeof buf), 1);
	ck_assert_str_eq(buf, "1");
	d = denied(1000000000ull);
	allot_fmt_retry_after(&d, buf, sizeof buf);
	ck_assert_str_eq(buf, "1");
	d = denied(1000000001ull);
	allot_fmt_retry_after(&d, buf, sizeof buf);
	ck_assert_str_eq(buf, "2");
	/* A denial never says 0: the client would retry at once. */
	d = denied(0);
	allot_fmt_retry_after(&d, buf, sizeof buf);
	ck_assert_str_eq(buf, "1");
	/* snprintf contract: the length needed when the buffer is short. */
	d = denied(123000000000ull);
	ck_assert_int_eq(allot_fmt_retry_after(&d, buf, 2), 3);
	ck_assert_str_eq(buf, "1");
}
END_TEST

START_TEST(ietf_fields)
{
	char buf[128];
	allot_decision d = denied(200000000ull);
	allot_fmt_ratelimit_policy(&d, "reporting", buf, sizeof buf);
	ck_assert_str_eq(buf, "\"reporting\";q=200;w=2");
	allot_fmt_ratelimit(&d, "reporting", buf, sizeof buf);
	ck_assert_str_eq(buf, "\"reporting\";r=3;t=1");
	d.allowed = true;
	d.retry_after_ns = 0;
	allot_fmt_ratelimit(&d, NULL, buf, sizeof buf);
	ck_assert_str_eq(buf, "\"default\";r=3;t=2");
}
END_TEST

/* A policy name is a structured-field string: quotes and backslashes
 * escaped, what an sf-string cannot hold written as '?'; the length is
 * the whole field's even when the buffer is short (issue 29). */
START_TEST(policy_names_escaped)
{
	char buf[128];
	allot_decision d = denied(200000000ull);
	int n = allot_fmt_ratelimit_policy(
	    &d, "team \"a\"\\x", buf, sizeof buf);
	ck_assert_str_eq(buf, "\"team \\\"a\\\"\\\\x\";q=200;w=2");
	ck_assert_int_eq(n, (int) strlen(buf));
	allot_fmt_ratelimit(&d, "caf\xc3\xa9\n", buf, sizeof buf);
	ck_assert_str_eq(buf, "\"caf???\";r=3;t=1");
	/* Short: snprintf's length, the part that fits, NUL-terminated. */
	char small[8];
	n = allot_fmt_ratelimit_policy(&d, "reporting", small, sizeof small);
	ck_assert_int_eq(n, (int) strlen("\"reporting\";q=200;w=2"));
	ck_assert_str_eq(small, "\"report");
	n = allot_fmt_ratelimit_policy(&d, "ab", small, sizeof small);
	ck_assert_int_eq(n, (int) strlen("\"ab\";q=200;w=2"));
	ck_assert_str_eq(small, "\"ab\";q=");
	ck_assert_int_eq(allot_fmt_ratelimit_policy(&d, "ab", NULL, 0), n);
}
END_TEST

START_TEST(x_ratelimit)
{
	allot_xheaders x;
	allot_decision d = denied(1500000000ull);
	allot_fmt_xratelimit(&d, 1700000000, &x);
	ck_assert_str_eq(x.limit, "200");
	ck_assert_str_eq(x.remaining, "3");
	ck_assert_str_eq(x.reset, "1700000002");
	allot_fmt_xratelimit(&d, 0, &x);
	ck_assert_str_eq(x.reset, "2");
}
END_TEST

START_TEST(from_real_agent)
{
	const char *yaml = "quotas:\n"
	                   "  default: {tokens_per_second: 5, burst: 10}\n";
	char err[256];
	allot_config *cfg;
	ck_assert_int_eq(
	    allot_config_parse("t", yaml, strlen(yaml), err, sizeof err, &cfg),
	    ALLOT_OK);
	allot_agent *a;
	ck_assert_int_eq(allot_agent_create(cfg, NULL, &a), ALLOT_OK);
	allot_config_free(cfg);
	allot_decision d;
	for (int i = 0; i < 10; i++)
		allot_acquire_id(a, NULL, "/x", 1, &d);
	ck_assert(d.allowed);
	allot_acquire_id(a, NULL, "/x", 1, &d);
	ck_assert(!d.allowed);
	char buf[64];
	/* One token at 5/s: 200 ms, advertised as 1 s. */
	ck_assert(d.retry_after_ns > 150000000ull &&
	    d.retry_after_ns <= 200000000ull);
	allot_fmt_retry_after(&d, buf, sizeof buf);
	ck_assert_str_eq(buf, "1");
	allot_fmt_ratelimit_policy(&d, "default", buf, sizeof buf);
	ck_assert_str_eq(buf, "\"default\";q=10;w=2");
	allot_agent_destroy(a);
}
END_TEST

static Suite *
headers_suite(void)
{
	Suite *s = suite_create("headers");
	TCase *tc = tcase_create("fmt");
	tcase_add_test(tc, retry_after_rounds_up);
	tcase_add_test(tc, ietf_fields);
	tcase_add_test(tc, policy_names_escaped);
	tcase_add_test(tc, x_ratelimit);
	tcase_add_test(tc, from_real_agent);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(headers_suite)
