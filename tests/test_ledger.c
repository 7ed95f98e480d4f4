/* SPDX-License-Identifier: MIT */
/*
 * A quota bucket's ledger between two reports (agent/ledger.h): what a
 * full bucket discarded, reported to the central reserve in whole
 * tokens (KeyReport.overflow), the part of a token carried to the next
 * report rather than dropped, never more than the refill produced, and
 * nothing where the bucket's callers spent the refill.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>

#include "ledger.h"
#include "runner.h"

#define MS 1000000ull
#define S 1000000000ull

/* A quota whose bucket refills 5 tokens/s up to 10, and its ledger,
 * started at `now` with the bucket at `level`. */
static allot__qrt *
start(allot__ledger *l, double level, uint64_t now)
{
	allot__qrt *q = aligned_alloc(64, sizeof *q);
	ck_assert_ptr_nonnull(q);
	memset(q, 0, sizeof *q);
	allot__allowance a = {
		.rate = 5, .burst = 10, .mode = ALLOT__MODE_LIMIT
	};
	allot__bucket_init(&q->bucket, &a);
	memset(l, 0, sizeof *l);
	allot__ledger_rate(l, 5, now);
	ck_assert_uint_eq(allot__ledger_close(l, q, level, 0, now), 0);
	return q;
}

/* A full bucket refilling 5 tokens/s discards half a token per report
 * of 100 ms: a whole token every second report, all of it in a second,
 * not none. */
START_TEST(parts_of_a_discard_add_up)
{
	allot__ledger l;
	uint64_t now = 10 * S;
	allot__qrt *q = start(&l, 10, now);
	uint64_t sum = 0;
	for (int i = 1; i <= 10; i++) {
		now += 100 * MS;
		uint64_t o = allot__ledger_close(&l, q, 10, 0, now);
		ck_assert_uint_eq(o, i % 2 == 0 ? 1 : 0);
		sum += o;
	}
	ck_assert_uint_eq(sum, 5);
	free(q);
}
END_TEST

/* What the callers spent is no discard, nor a refill that raised the
 * level: a bucket draining at its rate, or refilling below its burst,
 * reports nothing, and leaves no part over. */
START_TEST(spent_refill_is_no_discard)
{
	allot__ledger l;
	uint64_t now = 10 * S;
	allot__qrt *q = start(&l, 2, now);
	uint64_t spent = 0;
	for (int i = 0; i < 10; i++) {
		now += 100 * MS;
		spent += i % 2; /* 0.5 a report on average */
		double level = 2 + 0.5 * (i + 1) - (double) spent;
		ck_assert_uint_eq(
		    allot__ledger_close(&l, q, level, spent, now), 0);
		ck_assert(l.part < 1e-9);
	}
	free(q);
}
END_TEST

static Suite *
ledger_suite(void)
{
	Suite *s = suite_create("ledger");
	TCase *tc = tcase_create("ledger");
	tcase_add_test(tc, parts_of_a_discard_add_up);
	tcase_add_test(tc, spent_refill_is_no_discard);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(ledger_suite)
