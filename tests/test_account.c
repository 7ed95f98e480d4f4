/* SPDX-License-Identifier: MIT */
/*
 * The pieces of the accounting guarantee without a process
 * (docs/operations.md, "The accounting guarantee"): the agent's account
 * (agent/account.h) closes one record per second, keeps it until the
 * coordinator confirms it, folds minutes when full and never loses a
 * token silently; the coordinator's marks (coordinator/store/marks.h)
 * keep a record once however often it comes, the same way on every
 * member.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>

#include "account.h"
#include "allot.pb-c.h"
#include "runner.h"
#include "store/marks.h"

/* Take `adm` more admitted and `den` more denied tokens of quota `q`
 * at `second` (the counters are cumulative). */
static uint64_t spent[4], denied[4];

static void
decide(
    allot__account *ac, uint32_t q, int64_t second, uint64_t adm, uint64_t den)
{
	ck_assert(allot__acct_second(ac, second));
	spent[q] += adm;
	denied[q] += den;
	allot__acct_take(ac, q, spent[q], denied[q], 0);
}

static uint64_t
waiting_tokens(const allot__account *ac)
{
	uint64_t t = 0;
	for (size_t i = 0; i < ac->n; i++) {
		const allot__acct_rec *r = allot__acct_at(ac, i);
		for (uint32_t k = 0; k < r->n; k++)
			t += r->c[k].admitted + r->c[k].denied;
	}
	return t;
}

START_TEST(one_record_per_second_until_durable)
{
	memset(spent, 0, sizeof spent);
	memset(denied, 0, sizeof denied);
	allot__account ac;
	ck_assert_int_eq(allot__acct_init(&ac, 4, 7), ALLOT_OK);
	ck_assert_uint_ne(ac.incarnation, 0);
	decide(&ac, 0, 100, 5, 1);
	decide(&ac, 1, 100, 2, 0);
	ck_assert_uint_eq(ac.n, 0); /* second 100 is still open */
	decide(&ac, 0, 101, 3, 0);
	ck_assert_uint_eq(ac.n, 1);
	const allot__acct_rec *r = allot__acct_at(&ac, 0);
	ck_assert_uint_eq(r->id, 1);
	ck_assert_int_eq(r->second, 100);
	ck_assert_uint_eq(r->n, 2);
	ck_assert_uint_eq(r->c[0].key, 0);
	ck_assert_uint_eq(r->c[0].admitted, 5);
	ck_assert_uint_eq(r->c[0].denied, 1);
	ck_assert_uint_eq(r->c[1].admitted, 2);
	/* An idle second closes the open one too. */
	ck_assert(allot__acct_second(&ac, 103));
	ck_assert_uint_eq(ac.n, 2);
	ck_assert_uint_eq(allot__acct_at(&ac, 1)->id, 2);
	/* The wire: the oldest first, at most what was asked. */
	Allot__V1__Usage **u;
	size_t n;
	void *mem;
	ck_assert_int_eq(allot__acct_wire(&ac, 1, &u, &n, &mem), ALLOT_OK);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(u[0]->id, 1);
	ck_assert_uint_eq(u[0]->n_counts, 2);
	ck_assert_uint_eq(u[0]->counts[1]->key, 1);
	free(mem);
	/* Confirmed: dropped; an id it never sent is ignored. */
	allot__acct_durable(&ac, 99);
	ck_assert_uint_eq(ac.n, 2);
	allot__acct_durable(&ac, 1);
	ck_assert_uint_eq(ac.n, 1);
	ck_assert_uint_eq(allot__acct_at(&ac, 0)->id, 2);
	/* A refund below what was booked waits for consumption. */
	spent[0] -= 2;
	ck_assert(allot__acct_second(&ac, 104));
	allot__acct_take(&ac, 0, spent[0], denied[0], 0);
	ck_assert(!ac.open_used);
	decide(&ac, 0, 104, 3, 0);
	ck_assert_uint_eq(ac.open[0].admitted, 1);
	allot__acct_fini(&ac);
}
END_TEST

START_TEST(full_folds_minutes_and_counts_what_it_drops)
{
	memset(spent, 0, sizeof spent);
	memset(denied, 0, sizeof denied);
	allot__account ac;
	ck_assert_int_eq(allot__acct_init(&ac, 2, 9), ALLOT_OK);
	uint64_t total = 0;
	/* ALLOT__ACCT_RECORDS seconds, then more: the oldest minute holds
	 * 60 records and folds into one. */
	for (int64_t s = 0; s <= (int64_t) ALLOT__ACCT_RECORDS + 5; s++) {
		decide(&ac, (uint32_t) (s % 2), 6000 + s, 2, 1);
		total += 3;
	}
	ck_assert_uint_le(ac.n, ALLOT__ACCT_RECORDS);
	ck_assert_uint_gt(ac.folded, 0);
	ck_assert_uint_eq(ac.dropped, 0);
	const allot__acct_rec *f = allot__acct_at(&ac, 0);
	ck_assert_uint_eq(f->span, 60);
	ck_assert_int_eq(f->second % 60, 0);
	ck_assert_uint_eq(f->first, 1);
	ck_assert_uint_eq(f->id, 60);
	/* Nothing lost: what waits plus the open second is all of it. */
	ck_assert_uint_eq(waiting_tokens(&ac) + ac.open[0].admitted +
	        ac.open[0].denied + ac.open[1].admitted + ac.open[1].denied,
	    total);
	/* Ids keep rising past the fold. */
	for (size_t i = 1; i < ac.n; i++)
		ck_assert_uint_gt(allot__acct_at(&ac, i)->id,
		    allot__acct_at(&ac, i - 1)->id);
	allot__acct_fini(&ac);

	/* One record a minute: nothing to fold, the oldest is dropped and
	 * counted. */
	ck_assert_int_eq(allot__acct_init(&ac, 1, 9), ALLOT_OK);
	memset(spent, 0, sizeof spent);
	memset(denied, 0, sizeof denied);
	for (int64_t m = 0; m <= (int64_t) ALLOT__ACCT_RECORDS + 1; m++)
		decide(&ac, 0, m * 60, 4, 0);
	ck_assert_uint_eq(ac.n, ALLOT__ACCT_RECORDS);
	ck_assert_uint_eq(ac.dropped, 1);
	ck_assert_uint_eq(ac.dropped_tokens, 4);
	allot__acct_fini(&ac);
}
END_TEST

static allot__row_count
row(uint64_t inc, uint64_t first, uint64_t id, const char *q, uint64_t adm)
{
	return (allot__row_count) { .incarnation = inc,
		.first = first,
		.id = id,
		.second = (int64_t) id,
		.admitted = adm,
		.service = "svc",
		.quota = q };
}

START_TEST(marks_keep_a_record_once)
{
	allot__marks m;
	allot__marks_init(&m);
	uint64_t overlaps = 0;
	/* Record 1 of account 7 (two quotas), record 1 of account 8, then
	 * record 1 of 7 again (a re-send) and record 2 of 7. */
	allot__row_count r[] = { row(7, 1, 1, "a", 5), row(7, 1, 1, "b", 1),
		row(8, 1, 1, "a", 2), row(7, 1, 1, "a", 5),
		row(7, 1, 1, "b", 1), row(7, 2, 2, "a", 3) };
	size_t n = allot__marks_filter(&m, r, 6, &overlaps);
	ck_assert_uint_eq(n, 4);
	ck_assert_uint_eq(r[3].id, 2);
	ck_assert_uint_eq(allot__marks_get(&m, 7), 2);
	ck_assert_uint_eq(allot__marks_get(&m, 8), 1);
	/* All of it again (a failover re-sent it): nothing kept. */
	allot__row_count again[] = { row(7, 1, 1, "a", 5),
		row(8, 1, 1, "a", 2), row(7, 2, 2, "a", 3) };
	ck_assert_uint_eq(allot__marks_filter(&m, again, 3, &overlaps), 0);
	/* A link (id 0) always passes and marks nothing. */
	allot__row_count link = { .incarnation = 9, .session = 4 };
	ck_assert_uint_eq(allot__marks_filter(&m, &link, 1, &overlaps), 1);
	ck_assert_uint_eq(allot__marks_get(&m, 9), 0);
	/* A folded record over ids already kept is kept once more, and
	 * counted. */
	allot__row_count fold = row(7, 1, 60, "a", 100);
	ck_assert_uint_eq(allot__marks_filter(&m, &fold, 1, &overlaps), 1);
	ck_assert_uint_eq(overlaps, 1);
	/* Copies are equal; the bound forgets the account whose newest
	 * record is oldest. */
	allot__marks c;
	allot__marks_init(&c);
	ck_assert_int_eq(allot__marks_copy(&c, &m), ALLOT_OK);
	ck_assert_uint_eq(allot__marks_get(&c, 7), 60);
	ck_assert_uint_eq(allot__marks_get(&c, 8), 1);
	allot__marks_fini(&c);
	for (uint64_t i = 0; i + 1 < ALLOT__MARKS_MAX; i++)
		ck_assert_int_eq(
		    allot__marks_set(&m, 1000 + i, 1, 1000 + (int64_t) i),
		    ALLOT_OK);
	ck_assert_uint_eq(m.n, ALLOT__MARKS_MAX);
	ck_assert_uint_eq(allot__marks_get(&m, 8), 0); /* second 1 */
	ck_assert_uint_eq(allot__marks_get(&m, 7), 60);
	allot__marks_fini(&m);
}
END_TEST

static Suite *
suite(void)
{
	Suite *s = suite_create("account");
	TCase *tc = tcase_create("account");
	tcase_add_test(tc, one_record_per_second_until_durable);
	tcase_add_test(tc, full_folds_minutes_and_counts_what_it_drops);
	tcase_add_test(tc, marks_keep_a_record_once);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(suite)
