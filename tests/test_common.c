/* SPDX-License-Identifier: MIT */
/*
 * The shared infrastructure of common/: the hash index (idmap.h) against
 * a plain array under adds and removals with colliding and wrapping
 * probe runs; the key hash (hash.h) over identities that differ in one
 * byte anywhere; the JSON escaper (buf.h); the generators' pinned
 * streams (prng.h); the fallback rule (fallback.h).
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "fallback.h"
#include "hash.h"
#include "idmap.h"
#include "prng.h"
#include "runner.h"

#define N 200

/* Hashes that collide a lot and wrap around the table's end. */
static uint64_t
weak_hash(uint32_t v)
{
	return (uint64_t) (v % 7) * 0x100000001ull + 505 + (v % 3) * 2;
}

static uint32_t
find(const allot__idmap *m, uint32_t key)
{
	uint64_t h = weak_hash(key);
	uint32_t pos = allot__idmap_start(m, h), v;
	while ((v = allot__idmap_next(m, h, &pos)) != ALLOT__IDMAP_NONE)
		if (v == key)
			return v;
	return ALLOT__IDMAP_NONE;
}

START_TEST(idmap_matches_a_set)
{
	allot__idmap m;
	ck_assert_int_eq(allot__idmap_init(&m, N), ALLOT_OK);
	bool in[N] = { false };
	uint64_t rng = 42;
	for (int step = 0; step < 20000; step++) {
		uint32_t k = (uint32_t) (allot__splitmix64(&rng) % N);
		if (in[k])
			allot__idmap_remove(&m, weak_hash(k), k);
		else
			allot__idmap_add(&m, weak_hash(k), k);
		in[k] = !in[k];
		if (step % 97 == 0)
			for (uint32_t j = 0; j < N; j++)
				ck_assert_uint_eq(
				    find(&m, j) != ALLOT__IDMAP_NONE, in[j]);
	}
	allot__idmap_remove(&m, weak_hash(N + 1), N + 1); /* absent */
	for (uint32_t j = 0; j < N; j++)
		ck_assert_uint_eq(find(&m, j) != ALLOT__IDMAP_NONE, in[j]);
	allot__idmap_fini(&m);
}
END_TEST

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
	return (x > y) - (x < y);
}

/* What the agent's caller index needs of the hash (agent_int.h): 10,000
 * SPIFFE IDs that differ only in a few digits, or in one byte at any
 * position, get distinct hashes, distinct 30-bit tags, and slots spread
 * over a table two thirds full; the seed changes every hash. */
START_TEST(hash_spreads_identities)
{
	enum { NID = 10000, SLOTS = 16384 };
	static uint64_t h[NID];
	static uint16_t load[SLOTS];
	const uint64_t seed = allot__hash_seed();
	char id[128];

	for (uint32_t i = 0; i < NID; i++) {
		int n = snprintf(id, sizeof id,
		    "spiffe://prod.example.internal/ns/team-%04u/sa/"
		    "workload-%05u",
		    i / 10, i);
		h[i] = allot__hash(id, (size_t) n, seed);
		ck_assert_uint_ne(h[i], allot__hash(id, (size_t) n, seed ^ 2));
		load[h[i] & (SLOTS - 1)]++;
	}
	unsigned tags_equal = 0, max_load = 0;
	qsort(h, NID, sizeof h[0], cmp_u64);
	for (uint32_t i = 1; i < NID; i++) {
		ck_assert_uint_ne(h[i - 1], h[i]);
		/* Sorted by value, equal tags (the top 30 bits) are adjacent.
		 */
		tags_equal += h[i - 1] >> 34 == h[i] >> 34;
	}
	for (uint32_t s = 0; s < SLOTS; s++)
		max_load = load[s] > max_load ? load[s] : max_load;
	/* 50 million pairs over 2^30 tags: 0.05 expected. */
	ck_assert_uint_le(tags_equal, 3);
	/* Balls in bins at 0.61 per slot: a load over 8 is about 1e-6. */
	ck_assert_uint_le(max_load, 8);

	/* One byte changed, at every position of every length up to 120:
	 * never the hash of the original. */
	memset(id, 'a', sizeof id);
	for (size_t len = 1; len <= 120; len++) {
		uint64_t base = allot__hash(id, len, seed);
		ck_assert_uint_ne(base, allot__hash(id, len - 1, seed));
		for (size_t at = 0; at < len; at++) {
			id[at] = 'b';
			ck_assert_uint_ne(base, allot__hash(id, len, seed));
			id[at] = 'a';
		}
	}
}
END_TEST

START_TEST(json_escaping)
{
	allot__buf b = { 0 };
	allot__buf_json(&b,
	    "a\"b\\c\n\x01\x7f"
	    "d");
	ck_assert_str_eq(b.p, "\"a\\\"b\\\\c\\u000a\\u0001\\u007fd\"");
	allot__buf_free(&b);
	allot__buf_json(&b, NULL);
	ck_assert_str_eq(b.p, "\"\"");
	allot__buf_free(&b);
}
END_TEST

START_TEST(prng_streams)
{
	/* splitmix64's published first output from seed 0. */
	uint64_t s = 0;
	ck_assert_uint_eq(allot__splitmix64(&s), 0xe220a8397b1dcdafull);
	uint64_t x = 1;
	ck_assert_uint_eq(allot__xorshift64s(&x), 0x47e4ce4b896cdd1dull);
	double u = allot__splitmix64_unit(&s);
	ck_assert(u >= 0 && u < 1);
}
END_TEST

START_TEST(fallback_rule)
{
	allot__allowance al;
	allot__fallback_allowance(
	    ALLOT_FALLBACK_STATIC_SHARE, 100, 10, 4, 5, &al);
	ck_assert_int_eq(al.mode, ALLOT__MODE_LIMIT);
	ck_assert(al.rate == 25 && al.burst == 5); /* 10/4 raised to 5 */
	allot__fallback_allowance(ALLOT_FALLBACK_OPEN, 100, 10, 4, 5, &al);
	ck_assert_int_eq(al.mode, ALLOT__MODE_OPEN);
	ck_assert(al.rate == 25 && al.burst == 2.5);
	double r, b;
	allot__fallback_rate_burst(ALLOT_FALLBACK_OPEN, 100, 10, 4, 5, &r, &b);
	ck_assert(isinf(r) && isinf(b));
	allot__fallback_rate_burst(
	    ALLOT_FALLBACK_CLOSED, 100, 10, 4, 5, &r, &b);
	ck_assert(r == 0 && b == 0);
	allot__fallback_rate_burst(
	    ALLOT_FALLBACK_STATIC_SHARE, 100, 40, 0, 5, &r, &b);
	ck_assert(r == 100 && b == 40); /* 0 replicas count as 1 */
}
END_TEST

static Suite *
common_suite(void)
{
	Suite *s = suite_create("common");
	TCase *tc = tcase_create("infra");
	tcase_add_test(tc, idmap_matches_a_set);
	tcase_add_test(tc, hash_spreads_identities);
	tcase_add_test(tc, json_escaping);
	tcase_add_test(tc, prng_streams);
	tcase_add_test(tc, fallback_rule);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(common_suite)
