/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the caller's side of liballot (allot/client.h): Retry-After
 * parsing in every RFC 9110 format and the malformed values around them,
 * the retry decision (backoff window and full-jitter distribution, hint as
 * a floor, attempt cap, refusal of waits over the cap, which statuses are
 * retried), the retry budget under a sustained 429 storm, and adaptive
 * throttling against a simulated saturated backend, including recovery.
 * Time is an injected clock and every generator has a fixed seed, so the
 * numbers are the same on every run.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <allot/client.h>

#include "runner.h"

/* ------------------------------------------------------------------ */
/* Helpers                                                             */
/* ------------------------------------------------------------------ */

static _Atomic uint64_t fake_ns;

static uint64_t
fake_clock(void *ctx)
{
	(void) ctx;
	return atomic_load(&fake_ns);
}

static void
advance_ms(uint64_t ms)
{
	atomic_fetch_add(&fake_ns, ms * 1000000u);
}

/* A policy with a fixed seed and the fake clock; the budget is made
 * effectively unlimited unless a test sets it. */
static allot_retry *
retry_new(uint32_t max_attempts, bool unlimited_budget)
{
	allot_retry_policy p;
	allot_retry *r = NULL;

	allot_retry_policy_init(&p);
	p.max_attempts = max_attempts;
	p.seed = 42;
	p.clock = fake_clock;
	if (unlimited_budget) {
		p.budget_ratio = 1.0;
		p.budget_min_retries = UINT32_MAX;
	}
	ck_assert_int_eq(allot_retry_create(&p, &r), ALLOT_OK);
	return r;
}

/* Sun, 06 Nov 1994 08:49:37 GMT, the example date of RFC 9110. */
#define RFC_EXAMPLE_UNIX 784111777

static uint64_t
parse_ok(const char *v, int64_t now)
{
	uint64_t ms = 0;
	int rc = allot_retry_parse_after(v, now, &ms);
	ck_assert_msg(rc == ALLOT_OK, "\"%s\": %s", v, allot_strerror(rc));
	return ms;
}

static void
parse_bad(const char *v)
{
	uint64_t ms = 12345;
	int rc = allot_retry_parse_after(v, RFC_EXAMPLE_UNIX, &ms);
	ck_assert_msg(rc == ALLOT_EINVAL, "\"%s\" accepted (%s, %llu ms)", v,
	    allot_strerror(rc), (unsigned long long) ms);
	/* Output parameters are written only on success. */
	ck_assert_uint_eq(ms, 12345);
}

/* ------------------------------------------------------------------ */
/* Retry-After parsing                                                 */
/* ------------------------------------------------------------------ */

START_TEST(parse_delta_seconds)
{
	ck_assert_uint_eq(parse_ok("120", 0), 120000);
	ck_assert_uint_eq(parse_ok("0", 0), 0);
	ck_assert_uint_eq(parse_ok("007", 0), 7000);
	ck_assert_uint_eq(parse_ok(" \t5 \t", 0), 5000);
	/* Delta-seconds do not depend on the clock. */
	ck_assert_uint_eq(parse_ok("3", 1700000000), 3000);
}
END_TEST

START_TEST(parse_imf_fixdate)
{
	ck_assert_uint_eq(
	    parse_ok("Sun, 06 Nov 1994 08:49:37 GMT", RFC_EXAMPLE_UNIX - 30),
	    30000);
	ck_assert_uint_eq(
	    parse_ok("  Sun, 06 Nov 1994 08:49:37 GMT ", RFC_EXAMPLE_UNIX - 1),
	    1000);
	/* A date in the past means "now". */
	ck_assert_uint_eq(
	    parse_ok("Sun, 06 Nov 1994 08:49:37 GMT", RFC_EXAMPLE_UNIX + 3600),
	    0);
	ck_assert_uint_eq(
	    parse_ok("Thu, 01 Jan 1970 00:00:00 GMT", RFC_EXAMPLE_UNIX), 0);
	/* Far future: a very large but exact wait. */
	ck_assert_uint_eq(parse_ok("Sat, 01 Jan 2050 00:00:00 GMT", 946684800),
	    (2524608000ull - 946684800ull) * 1000u);
}
END_TEST

START_TEST(parse_rfc850)
{
	ck_assert_uint_eq(
	    parse_ok("Sunday, 06-Nov-94 08:49:37 GMT", RFC_EXAMPLE_UNIX - 30),
	    30000);
	/* Two-digit years (RFC 9110 5.6.7): from 2000-01-01, "70" is 1970
	 * (2070 would be more than 50 years ahead) and "50" is 2050. */
	ck_assert_uint_eq(
	    parse_ok("Thursday, 01-Jan-70 00:00:00 GMT", 946684800), 0);
	ck_assert_uint_eq(
	    parse_ok("Saturday, 01-Jan-50 00:00:00 GMT", 946684800),
	    (2524608000ull - 946684800ull) * 1000u);
	/* From 2060, "70" is 2070, not 1970 as strptime's %y alone says. */
	ck_assert_uint_eq(
	    parse_ok("Wednesday, 01-Jan-70 00:00:00 GMT", 2840140800),
	    (3155760000ull - 2840140800ull) * 1000u);
}
END_TEST

START_TEST(parse_asctime)
{
	ck_assert_uint_eq(
	    parse_ok("Sun Nov  6 08:49:37 1994", RFC_EXAMPLE_UNIX - 30),
	    30000);
	ck_assert_uint_eq(
	    parse_ok("Wed Nov 16 08:49:37 1994", RFC_EXAMPLE_UNIX),
	    10u * 86400u * 1000u);
}
END_TEST

START_TEST(parse_garbage)
{
	static const char *const bad[] = {
		"",
		"   ",
		"\t",
		"soon",
		"12abc",
		"1.5",
		"1e3",
		"0x10",
		"+5",
		"5 5",
		"Sun, 06 Nov 1994 08:49:37",
		"Sun, 06 Nov 1994 08:49:37 GMT junk",
		"Sun, 06 Nov 1994 25:49:37 GMT",
		"Sun, 31 Feb 1994 08:49:37 GMT",
		"Sun, 06 Foo 1994 08:49:37 GMT",
		"Sunday, 06-Nov-94 08:49:37",
		"Sun Nov  6 08:49:37",
		"06 Nov 1994 08:49:37 GMT",
		"Sun, 06 Nov 1994 08:49:37 GMT Sun, 06 Nov 1994 08:49:37 GMT",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		parse_bad(bad[i]);
	uint64_t ms;
	ck_assert_int_eq(allot_retry_parse_after(NULL, 0, &ms), ALLOT_EINVAL);
	ck_assert_int_eq(allot_retry_parse_after("5", 0, NULL), ALLOT_EINVAL);
}
END_TEST

START_TEST(parse_negative)
{
	parse_bad("-1");
	parse_bad("-0");
	parse_bad(" -120 ");
}
END_TEST

START_TEST(parse_huge)
{
	/* RFC 9110: too large to represent reads as 2^31 seconds. */
	ck_assert_uint_eq(parse_ok("2147483647", 0), 2147483647ull * 1000u);
	ck_assert_uint_eq(parse_ok("2147483649", 0), 2147483648ull * 1000u);
	ck_assert_uint_eq(parse_ok("99999999999999999999999999999999", 0),
	    2147483648ull * 1000u);
	/* Far future date: large, and never an overflow. */
	uint64_t ms = parse_ok("Fri, 31 Dec 9999 23:59:59 GMT", 0);
	ck_assert_uint_eq(ms, 2147483648ull * 1000u);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Retry decisions                                                     */
/* ------------------------------------------------------------------ */

START_TEST(backoff_full_jitter)
{
	enum { SAMPLES = 4000 };
	allot_retry *r = retry_new(64, true);

	for (uint32_t attempt = 0; attempt < 10; attempt++) {
		uint64_t window = 200ull << attempt;
		if (window > 10000)
			window = 10000;
		uint64_t lo = UINT64_MAX, hi = 0, quarter[4] = { 0 };
		double sum = 0;
		for (int i = 0; i < SAMPLES; i++) {
			uint64_t d = UINT64_MAX;
			ck_assert_int_eq(
			    allot_retry_next(r, attempt, NULL, 429, &d),
			    ALLOT_OK);
			ck_assert_uint_le(d, window);
			lo = d < lo ? d : lo;
			hi = d > hi ? d : hi;
			sum += (double) d;
			uint64_t qi = d * 4 / (window + 1);
			quarter[qi]++;
		}
		/* Full jitter spans the whole window: not a fixed delay and
		 * not "half plus jitter". */
		ck_assert_uint_le(lo, window / 50);
		ck_assert_uint_ge(hi, window - window / 50);
		double mean = sum / SAMPLES;
		ck_assert_msg(mean > 0.45 * (double) window &&
		        mean < 0.55 * (double) window,
		    "attempt %u: mean %.1f of %llu", attempt, mean,
		    (unsigned long long) window);
		for (int q = 0; q < 4; q++)
			ck_assert_msg(quarter[q] > SAMPLES / 4 * 8 / 10 &&
			        quarter[q] < SAMPLES / 4 * 12 / 10,
			    "attempt %u quarter %d: %llu", attempt, q,
			    (unsigned long long) quarter[q]);
	}
	/* Shift counts past the width of the window stay capped. */
	for (uint32_t attempt = 30; attempt < 63; attempt++) {
		uint64_t d;
		ck_assert_int_eq(
		    allot_retry_next(r, attempt, NULL, 429, &d), ALLOT_OK);
		ck_assert_uint_le(d, 10000);
	}
	allot_retry_destroy(r);
}
END_TEST

START_TEST(backoff_seed_reproducible)
{
	allot_retry *a = retry_new(8, true), *b = retry_new(8, true);
	int differ = 0;
	uint64_t prev = 0;
	for (int i = 0; i < 100; i++) {
		uint64_t da, db;
		ck_assert_int_eq(
		    allot_retry_next(a, 5, NULL, 429, &da), ALLOT_OK);
		ck_assert_int_eq(
		    allot_retry_next(b, 5, NULL, 429, &db), ALLOT_OK);
		ck_assert_uint_eq(da, db);
		differ += da != prev;
		prev = da;
	}
	ck_assert_int_gt(differ, 90);
	allot_retry_destroy(a);
	allot_retry_destroy(b);
}
END_TEST

START_TEST(hint_is_a_floor)
{
	allot_retry *r = retry_new(8, true);
	uint64_t lo = UINT64_MAX, hi = 0;

	for (int i = 0; i < 1000; i++) {
		uint64_t d;
		/* Attempt 0's backoff window (200 ms) is far below the hint:
		 * the hint, not the backoff, sets the delay. */
		ck_assert_int_eq(
		    allot_retry_next(r, 0, "3", 429, &d), ALLOT_OK);
		lo = d < lo ? d : lo;
		hi = d > hi ? d : hi;
	}
	ck_assert_uint_ge(lo, 3000);
	ck_assert_uint_le(hi, 3200);
	/* Jitter is there: replicas do not retry in lockstep. */
	ck_assert_uint_gt(hi - lo, 150);

	/* A hint equal to the cap is accepted and never exceeded. */
	uint64_t d;
	ck_assert_int_eq(allot_retry_next(r, 1, "10", 429, &d), ALLOT_OK);
	ck_assert_uint_eq(d, 10000);

	/* An HTTP-date hint, measured against the wall clock. */
	char date[64];
	time_t t = time(NULL) + 5;
	struct tm tm;
	gmtime_r(&t, &tm);
	strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", &tm);
	ck_assert_int_eq(allot_retry_next(r, 0, date, 429, &d), ALLOT_OK);
	ck_assert_uint_ge(d, 3000);
	ck_assert_uint_le(d, 5200);

	/* An unparseable hint on a 429 falls back to backoff. */
	for (int i = 0; i < 100; i++) {
		ck_assert_int_eq(
		    allot_retry_next(r, 0, "later", 429, &d), ALLOT_OK);
		ck_assert_uint_le(d, 200);
	}
	allot_retry_destroy(r);
}
END_TEST

START_TEST(hint_over_cap_gives_up)
{
	allot_retry *r = retry_new(8, true);
	allot_retry_stats st;
	uint64_t d = 777;

	ck_assert_int_eq(
	    allot_retry_next(r, 0, "11", 429, &d), ALLOT_ETIMEDOUT);
	ck_assert_int_eq(
	    allot_retry_next(r, 0, "99999999999", 429, &d), ALLOT_ETIMEDOUT);
	ck_assert_int_eq(
	    allot_retry_next(r, 0, "Fri, 31 Dec 9999 23:59:59 GMT", 503, &d),
	    ALLOT_ETIMEDOUT);
	ck_assert_uint_eq(d, 777);
	ck_assert_int_eq(allot_retry_stats_get(r, &st), ALLOT_OK);
	ck_assert_uint_eq(st.hint_too_long, 3);
	ck_assert_uint_eq(st.gave_up, 3);
	ck_assert_uint_eq(st.retries, 0);
	allot_retry_destroy(r);

	/* The cap is the policy's, not a constant. */
	allot_retry_policy p;
	allot_retry_policy_init(&p);
	p.max_delay_ms = 30000;
	p.seed = 1;
	ck_assert_int_eq(allot_retry_create(&p, &r), ALLOT_OK);
	ck_assert_int_eq(allot_retry_next(r, 0, "11", 429, &d), ALLOT_OK);
	ck_assert_uint_ge(d, 11000);
	allot_retry_destroy(r);
}
END_TEST

START_TEST(attempt_cap)
{
	allot_retry *r = retry_new(4, true);
	allot_retry_stats st;
	uint64_t d;

	/* Four attempts: the first try and three retries. */
	for (uint32_t a = 0; a < 3; a++)
		ck_assert_int_eq(
		    allot_retry_next(r, a, NULL, 429, &d), ALLOT_OK);
	ck_assert_int_eq(allot_retry_next(r, 3, NULL, 429, &d), ALLOT_ERANGE);
	ck_assert_int_eq(allot_retry_next(r, 3, "1", 429, &d), ALLOT_ERANGE);
	ck_assert_int_eq(
	    allot_retry_next(r, UINT32_MAX, NULL, 429, &d), ALLOT_ERANGE);
	ck_assert_int_eq(allot_retry_stats_get(r, &st), ALLOT_OK);
	ck_assert_uint_eq(st.retries, 3);
	ck_assert_uint_eq(st.attempts_exhausted, 3);
	allot_retry_destroy(r);

	/* max_attempts 1: never retry. */
	r = retry_new(1, true);
	ck_assert_int_eq(allot_retry_next(r, 0, "1", 429, &d), ALLOT_ERANGE);
	allot_retry_destroy(r);
}
END_TEST

START_TEST(retryable_statuses)
{
	allot_retry *r = retry_new(8, true);
	allot_retry_stats st;
	uint64_t d;

	ck_assert_int_eq(allot_retry_next(r, 0, NULL, 429, &d), ALLOT_OK);
	ck_assert_int_eq(allot_retry_next(r, 0, "2", 503, &d), ALLOT_OK);
	ck_assert_uint_ge(d, 2000);
	/* A bare 503, or one with a hint that does not parse, is a fault,
	 * not an instruction to come back. */
	ck_assert_int_eq(allot_retry_next(r, 0, NULL, 503, &d), ALLOT_EPROTO);
	ck_assert_int_eq(
	    allot_retry_next(r, 0, "soon", 503, &d), ALLOT_EPROTO);
	static const uint32_t never[] = { 200, 400, 401, 403, 404, 500, 502,
		504, 0 };
	for (size_t i = 0; i < sizeof(never) / sizeof(never[0]); i++) {
		ck_assert_int_eq(
		    allot_retry_next(r, 0, NULL, never[i], &d), ALLOT_EPROTO);
		ck_assert_int_eq(
		    allot_retry_next(r, 0, "1", never[i], &d), ALLOT_EPROTO);
	}
	ck_assert_int_eq(allot_retry_stats_get(r, &st), ALLOT_OK);
	ck_assert_uint_eq(st.retries, 2);
	ck_assert_uint_eq(st.not_retryable, 2 + 2 * 9);
	ck_assert_uint_eq(st.gave_up, st.not_retryable);
	/* NULL arguments are misuse, not a give-up. */
	ck_assert_int_eq(
	    allot_retry_next(NULL, 0, NULL, 429, &d), ALLOT_EINVAL);
	ck_assert_int_eq(
	    allot_retry_next(r, 0, NULL, 429, NULL), ALLOT_EINVAL);
	allot_retry_destroy(r);
}
END_TEST

START_TEST(policy_validation)
{
	allot_retry_policy p;
	allot_retry *r = (allot_retry *) &p;

	allot_retry_policy_init(&p);
	ck_assert_uint_eq(p.max_attempts, 4);
	ck_assert_uint_eq(p.base_delay_ms, 200);
	ck_assert_uint_eq(p.max_delay_ms, 10000);
	ck_assert(p.budget_ratio == 0.1);
	p.budget_ratio = 0;
	ck_assert_int_eq(allot_retry_create(&p, &r), ALLOT_EINVAL);
	p.budget_ratio = 1.5;
	ck_assert_int_eq(allot_retry_create(&p, &r), ALLOT_EINVAL);
	allot_retry_policy_init(&p);
	p.max_attempts = 0;
	ck_assert_int_eq(allot_retry_create(&p, &r), ALLOT_EINVAL);
	ck_assert_ptr_eq(r, (allot_retry *) &p);
	ck_assert_int_eq(allot_retry_create(NULL, &r), ALLOT_OK);
	allot_retry_destroy(r);
	allot_retry_destroy(NULL);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Retry budget                                                        */
/* ------------------------------------------------------------------ */

/* 10,000 requests at 100 per second, every attempt answered 429, each
 * retried as long as the helper allows. */
static void
storm(allot_retry *r, uint64_t *ret_requests, uint64_t *ret_retries)
{
	uint64_t retries = 0;
	for (int i = 0; i < 10000; i++) {
		allot_retry_record_request(r);
		for (uint32_t attempt = 0;; attempt++) {
			uint64_t d;
			if (allot_retry_next(r, attempt, "0", 429, &d) !=
			    ALLOT_OK)
				break;
			retries++;
		}
		advance_ms(10);
	}
	*ret_requests = 10000;
	*ret_retries = retries;
}

START_TEST(budget_holds_in_429_storm)
{
	allot_retry_policy p;
	allot_retry *r;
	allot_retry_stats st;
	uint64_t req, ret;

	/* Strict ratio. */
	allot_retry_policy_init(&p);
	p.seed = 7;
	p.clock = fake_clock;
	p.budget_min_retries = 0;
	ck_assert_int_eq(allot_retry_create(&p, &r), ALLOT_OK);
	storm(r, &req, &ret);
	double frac = (double) ret / (double) req;
	ck_assert_msg(frac <= 0.1 + 0.002, "retry fraction %.4f", frac);
	/* ... and the budget is actually spent, not refused outright. */
	ck_assert_msg(frac >= 0.09, "retry fraction %.4f", frac);
	ck_assert_int_eq(allot_retry_stats_get(r, &st), ALLOT_OK);
	ck_assert_uint_eq(st.requests, 10000);
	ck_assert_uint_eq(st.retries, ret);
	ck_assert_uint_gt(st.budget_denied, 9000);
	ck_assert_uint_eq(
	    st.gave_up, st.budget_denied + st.attempts_exhausted);
	allot_retry_destroy(r);

	/* Defaults: the per-window allowance (3 per 10 s, ten windows in
	 * the 100 s storm) is the only slack over the ratio. */
	allot_retry_policy_init(&p);
	p.seed = 7;
	p.clock = fake_clock;
	ck_assert_int_eq(allot_retry_create(&p, &r), ALLOT_OK);
	storm(r, &req, &ret);
	frac = (double) ret / (double) req;
	ck_assert_msg(
	    frac <= 0.1 + 30.0 / 10000 + 0.002, "retry fraction %.4f", frac);
	ck_assert_msg(frac >= 0.09, "retry fraction %.4f", frac);
	allot_retry_destroy(r);
}
END_TEST

START_TEST(budget_window_slides)
{
	allot_retry_policy p;
	allot_retry *r;
	uint64_t d;

	allot_retry_policy_init(&p);
	p.seed = 3;
	p.clock = fake_clock;
	p.budget_min_retries = 0;
	p.max_attempts = 100;
	ck_assert_int_eq(allot_retry_create(&p, &r), ALLOT_OK);

	/* Ten requests earn exactly one retry. */
	for (int i = 0; i < 10; i++)
		allot_retry_record_request(r);
	ck_assert_int_eq(allot_retry_next(r, 0, NULL, 429, &d), ALLOT_OK);
	ck_assert_int_eq(allot_retry_next(r, 1, NULL, 429, &d), ALLOT_EBUSY);
	/* Refusals for other reasons spend nothing: after the budget is
	 * refilled, the give-ups below leave the one retry available. */
	for (int i = 0; i < 10; i++)
		allot_retry_record_request(r);
	ck_assert_int_eq(allot_retry_next(r, 0, NULL, 500, &d), ALLOT_EPROTO);
	ck_assert_int_eq(allot_retry_next(r, 99, NULL, 429, &d), ALLOT_ERANGE);
	ck_assert_int_eq(
	    allot_retry_next(r, 0, "60", 429, &d), ALLOT_ETIMEDOUT);
	ck_assert_int_eq(allot_retry_next(r, 0, NULL, 429, &d), ALLOT_OK);
	ck_assert_int_eq(allot_retry_next(r, 0, NULL, 429, &d), ALLOT_EBUSY);

	/* Once the window has passed, old requests no longer pay for
	 * retries. */
	advance_ms(11000);
	ck_assert_int_eq(allot_retry_next(r, 0, NULL, 429, &d), ALLOT_EBUSY);
	for (int i = 0; i < 20; i++)
		allot_retry_record_request(r);
	ck_assert_int_eq(allot_retry_next(r, 0, NULL, 429, &d), ALLOT_OK);
	ck_assert_int_eq(allot_retry_next(r, 0, NULL, 429, &d), ALLOT_OK);
	ck_assert_int_eq(allot_retry_next(r, 0, NULL, 429, &d), ALLOT_EBUSY);
	allot_retry_destroy(r);

	/* The per-window allowance lets a quiet client retry. */
	allot_retry_policy_init(&p);
	p.clock = fake_clock;
	p.seed = 3;
	ck_assert_int_eq(allot_retry_create(&p, &r), ALLOT_OK);
	allot_retry_record_request(r);
	for (uint32_t a = 0; a < 3; a++)
		ck_assert_int_eq(
		    allot_retry_next(r, a, NULL, 429, &d), ALLOT_OK);
	allot_retry_record_request(r);
	ck_assert_int_eq(allot_retry_next(r, 0, NULL, 429, &d), ALLOT_EBUSY);
	allot_retry_destroy(r);
}
END_TEST

struct storm_arg {
	allot_retry *r;
	_Atomic uint64_t *retries;
};

static void *
storm_thread(void *p)
{
	struct storm_arg *a = p;
	for (int i = 0; i < 5000; i++) {
		allot_retry_record_request(a->r);
		for (uint32_t attempt = 0;; attempt++) {
			uint64_t d;
			if (allot_retry_next(a->r, attempt, NULL, 429, &d) !=
			    ALLOT_OK)
				break;
			atomic_fetch_add(a->retries, 1);
		}
	}
	return NULL;
}

START_TEST(budget_threads)
{
	allot_retry_policy p;
	allot_retry *r;
	allot_retry_stats st;
	_Atomic uint64_t retries = 0;
	pthread_t th[4];

	/* One window for the whole run: the clock stands still. */
	allot_retry_policy_init(&p);
	p.clock = fake_clock;
	p.budget_min_retries = 0;
	ck_assert_int_eq(allot_retry_create(&p, &r), ALLOT_OK);
	struct storm_arg a = { r, &retries };
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(
		    pthread_create(&th[i], NULL, storm_thread, &a), 0);
	for (int i = 0; i < 4; i++)
		pthread_join(th[i], NULL);
	ck_assert_int_eq(allot_retry_stats_get(r, &st), ALLOT_OK);
	ck_assert_uint_eq(st.requests, 20000);
	ck_assert_uint_eq(st.retries, atomic_load(&retries));
	ck_assert_uint_le(st.retries, 2000);
	ck_assert_uint_ge(st.retries, 1900);
	allot_retry_destroy(r);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Adaptive throttling                                                 */
/* ------------------------------------------------------------------ */

static allot_throttle *
throttle_new(double k)
{
	allot_throttle_options o;
	allot_throttle *t = NULL;

	allot_throttle_options_init(&o);
	o.k = k;
	o.seed = 99;
	o.clock = fake_clock;
	ck_assert_int_eq(allot_throttle_create(&o, &t), ALLOT_OK);
	return t;
}

static double
throttle_p(allot_throttle *t)
{
	allot_throttle_stats st;
	ck_assert_int_eq(allot_throttle_stats_get(t, &st), ALLOT_OK);
	return st.reject_probability;
}

START_TEST(throttle_formula)
{
	allot_throttle *t = throttle_new(2.0);
	allot_throttle_stats st;

	ck_assert(throttle_p(t) == 0.0);
	/* An attempt that was sent counts when its answer is recorded: an
	 * admit alone (a reply still in flight) changes nothing. */
	for (int i = 0; i < 50; i++)
		ck_assert(allot_throttle_admit(t));
	ck_assert(throttle_p(t) == 0.0);
	/* 100 answers: 30 accepted, 70 rejected. */
	for (int i = 0; i < 30; i++)
		allot_throttle_record(t, true);
	for (int i = 0; i < 70; i++)
		allot_throttle_record(t, false);
	ck_assert_int_eq(allot_throttle_stats_get(t, &st), ALLOT_OK);
	ck_assert_uint_eq(st.window_requests, 100);
	ck_assert_uint_eq(st.window_accepts, 30);
	ck_assert_uint_eq(st.accepts, 30);
	ck_assert_uint_eq(st.rejects, 70);
	ck_assert_double_eq_tol(
	    st.reject_probability, (100.0 - 60.0) / 101.0, 1e-12);
	/* 40 more accepted: 140 requests <= K * 70 accepts, nothing is
	 * rejected; one fewer is not enough. */
	for (int i = 0; i < 39; i++)
		allot_throttle_record(t, true);
	ck_assert(throttle_p(t) > 0.0);
	allot_throttle_record(t, true);
	ck_assert(throttle_p(t) == 0.0);
	allot_throttle_destroy(t);

	/* K is honoured. */
	t = throttle_new(1.5);
	for (int i = 0; i < 40; i++)
		allot_throttle_record(t, true);
	for (int i = 0; i < 60; i++)
		allot_throttle_record(t, false);
	ck_assert_double_eq_tol(throttle_p(t), (100.0 - 60.0) / 101.0, 1e-12);
	allot_throttle_destroy(t);
}
END_TEST

START_TEST(throttle_draws_match_probability)
{
	allot_throttle *t = throttle_new(2.0);

	/* 1000 answers, 250 accepted: p = 500 / 1001. Each local refusal
	 * counts as a request and moves p slowly; count the draws over the
	 * next 2000 admits. */
	for (int i = 0; i < 250; i++)
		allot_throttle_record(t, true);
	for (int i = 0; i < 750; i++)
		allot_throttle_record(t, false);
	double p0 = throttle_p(t);
	int rejected = 0;
	for (int i = 0; i < 2000; i++)
		rejected += !allot_throttle_admit(t);
	double p1 = throttle_p(t);
	double expect = 2000 * (p0 + p1) / 2;
	ck_assert_msg(rejected > expect * 0.9 && rejected < expect * 1.1,
	    "rejected %d, expected about %.0f", rejected, expect);
	allot_throttle_destroy(t);
	/* No throttle: everything goes. */
	ck_assert(allot_throttle_admit(NULL));
	allot_throttle_record(NULL, true);
}
END_TEST

START_TEST(throttle_window_slides)
{
	allot_throttle *t = throttle_new(2.0);
	allot_throttle_stats st;

	/* 10 requests at t = 0, 10 more at t = 30 s. */
	for (int i = 0; i < 10; i++)
		allot_throttle_record(t, false);
	advance_ms(30000);
	for (int i = 0; i < 10; i++)
		allot_throttle_record(t, false);
	advance_ms(29500); /* t = 59.5 s: both batches in the window */
	ck_assert_int_eq(allot_throttle_stats_get(t, &st), ALLOT_OK);
	ck_assert_uint_eq(st.window_requests, 20);
	advance_ms(1000); /* t = 60.5 s: the first has left it */
	ck_assert_int_eq(allot_throttle_stats_get(t, &st), ALLOT_OK);
	ck_assert_uint_eq(st.window_requests, 10);
	advance_ms(30000); /* t = 90.5 s: empty */
	ck_assert_int_eq(allot_throttle_stats_get(t, &st), ALLOT_OK);
	ck_assert_uint_eq(st.window_requests, 0);
	ck_assert(st.reject_probability == 0.0);
	ck_assert_uint_eq(st.rejects, 20);
	/* A long silence clears the whole ring at once. */
	for (int i = 0; i < 10; i++)
		allot_throttle_record(t, false);
	advance_ms(1000000);
	ck_assert_int_eq(allot_throttle_stats_get(t, &st), ALLOT_OK);
	ck_assert_uint_eq(st.window_requests, 0);
	allot_throttle_destroy(t);
}
END_TEST

/* A backend with capacity `cap` accepts per second; demand is 100
 * attempts per second. Returns the fraction of attempts actually sent
 * over `seconds`, and the backend's accepts through `*ret_accepts`. */
static double
simulate(allot_throttle *t, int seconds, int cap, uint64_t *ret_accepts)
{
	uint64_t sent = 0, attempts = 0, accepts = 0;
	for (int s = 0; s < seconds; s++) {
		int used = 0;
		for (int i = 0; i < 100; i++) {
			attempts++;
			if (allot_throttle_admit(t)) {
				sent++;
				bool ok = cap < 0 || used < cap;
				used += ok;
				accepts += ok;
				allot_throttle_record(t, ok);
			}
			advance_ms(10);
		}
	}
	if (ret_accepts != NULL)
		*ret_accepts = accepts;
	return (double) sent / (double) attempts;
}

START_TEST(throttle_saturated_backend)
{
	allot_throttle *t = throttle_new(2.0);
	uint64_t acc;

	/* Without throttling every attempt reaches the backend. */
	ck_assert(simulate(NULL, 60, 10, NULL) == 1.0);

	/* Healthy backend: nothing throttled. */
	double f = simulate(t, 60, -1, NULL);
	ck_assert_msg(f == 1.0, "healthy: sent %.3f", f);

	/* Backend saturated at 10 % of demand. Throttling starts once the
	 * window's memory of healthy accepts fades (requests > K * accepts,
	 * about 30 s here); once the window holds only saturated seconds the
	 * client sends about K times what is accepted (20 % of demand)
	 * instead of all of it. */
	f = simulate(t, 60, 10, NULL);
	ck_assert_msg(f < 0.9, "throttling never started: sent %.3f", f);
	f = simulate(t, 120, 10, &acc);
	ck_assert_msg(f < 0.25, "saturated: sent %.3f", f);
	ck_assert_msg(f > 0.12, "saturated: sent %.3f (starved)", f);
	/* ... and the backend still gets all the work it can take. */
	ck_assert_uint_ge(acc, 120 * 10 * 95 / 100);

	/* Recovery: accepts resume and the sent fraction climbs back; after
	 * a window it is whole again. */
	double early = simulate(t, 10, -1, NULL);
	ck_assert_msg(
	    early > f + 0.05, "recovering: %.3f after %.3f", early, f);
	(void) simulate(t, 60, -1, NULL);
	double late = simulate(t, 20, -1, NULL);
	ck_assert_msg(late > 0.99, "recovered: sent %.3f", late);
	allot_throttle_destroy(t);
}
END_TEST

START_TEST(throttle_validation)
{
	allot_throttle_options o;
	allot_throttle *t = NULL;

	allot_throttle_options_init(&o);
	ck_assert(o.k == 2.0);
	ck_assert_uint_eq(o.window_ms, 60000);
	o.k = 0.5;
	ck_assert_int_eq(allot_throttle_create(&o, &t), ALLOT_EINVAL);
	allot_throttle_options_init(&o);
	o.bucket_ms = 0;
	ck_assert_int_eq(allot_throttle_create(&o, &t), ALLOT_EINVAL);
	allot_throttle_options_init(&o);
	o.bucket_ms = 10; /* 6000 buckets */
	ck_assert_int_eq(allot_throttle_create(&o, &t), ALLOT_EINVAL);
	ck_assert_ptr_null(t);
	ck_assert_int_eq(allot_throttle_create(NULL, &t), ALLOT_OK);
	ck_assert(allot_throttle_admit(t));
	allot_throttle_destroy(t);
	allot_throttle_destroy(NULL);
}
END_TEST

static Suite *
client_suite(void)
{
	Suite *s = suite_create("client");
	TCase *tc = tcase_create("retry_after");
	tcase_add_test(tc, parse_delta_seconds);
	tcase_add_test(tc, parse_imf_fixdate);
	tcase_add_test(tc, parse_rfc850);
	tcase_add_test(tc, parse_asctime);
	tcase_add_test(tc, parse_garbage);
	tcase_add_test(tc, parse_negative);
	tcase_add_test(tc, parse_huge);
	suite_add_tcase(s, tc);

	tc = tcase_create("retry");
	tcase_add_test(tc, backoff_full_jitter);
	tcase_add_test(tc, backoff_seed_reproducible);
	tcase_add_test(tc, hint_is_a_floor);
	tcase_add_test(tc, hint_over_cap_gives_up);
	tcase_add_test(tc, attempt_cap);
	tcase_add_test(tc, retryable_statuses);
	tcase_add_test(tc, policy_validation);
	suite_add_tcase(s, tc);

	tc = tcase_create("budget");
	tcase_add_test(tc, budget_holds_in_429_storm);
	tcase_add_test(tc, budget_window_slides);
	tcase_add_test(tc, budget_threads);
	suite_add_tcase(s, tc);

	tc = tcase_create("throttle");
	tcase_add_test(tc, throttle_formula);
	tcase_add_test(tc, throttle_draws_match_probability);
	tcase_add_test(tc, throttle_window_slides);
	tcase_add_test(tc, throttle_saturated_backend);
	tcase_add_test(tc, throttle_validation);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(client_suite)
