/* SPDX-License-Identifier: MIT */
/*
 * Rendezvous hashing of keys to cluster members (common/rendezvous.h):
 * owners are spread evenly, a member's loss moves only the keys it
 * owned and its return moves exactly those back, the owner depends on
 * nothing but the key and the member names (fixed seed, list order
 * irrelevant), and member lists are parsed strictly.
 */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "rendezvous.h"
#include "runner.h"

#define NKEYS 1000

static uint64_t keys[NKEYS];

static void
mk_keys(void)
{
	char q[128];
	for (int i = 0; i < NKEYS; i++) {
		snprintf(q, sizeof q, "spiffe://prod/ns/team%d/sa/caller-%d",
		    i % 17, i);
		keys[i] = allot__rendezvous_key(
		    i % 2 ? "billing" : "search", q);
	}
}

static void
mk_members(uint64_t *m, size_t n)
{
	char name[32];
	for (size_t i = 0; i < n; i++) {
		snprintf(name, sizeof name, "allotd-%zu", i + 1);
		m[i] = allot__rendezvous_member(name);
	}
}

static double
max_over_mean(const uint64_t *m, size_t n, const bool *live)
{
	int owned[ALLOT__CLUSTER_MAX_MEMBERS] = { 0 };
	size_t nlive = 0;
	for (size_t i = 0; i < n; i++)
		nlive += live == NULL || live[i];
	for (int k = 0; k < NKEYS; k++) {
		int o = allot__rendezvous_owner(keys[k], m, live, n);
		ck_assert_int_ge(o, 0);
		ck_assert(live == NULL || live[o]);
		owned[o]++;
	}
	int max = 0;
	for (size_t i = 0; i < n; i++)
		max = owned[i] > max ? owned[i] : max;
	return max / ((double) NKEYS / (double) nlive);
}

START_TEST(spread_even)
{
	mk_keys();
	uint64_t m[5];
	mk_members(m, 3);
	double r = max_over_mean(m, 3, NULL);
	ck_assert_msg(r <= 1.2, "3 members: max/mean %.3f", r);
	mk_members(m, 5);
	r = max_over_mean(m, 5, NULL);
	ck_assert_msg(r <= 1.2, "5 members: max/mean %.3f", r);
	bool live[5] = { true, true, false, true, true };
	r = max_over_mean(m, 5, live);
	ck_assert_msg(r <= 1.2, "4 of 5 live: max/mean %.3f", r);
}
END_TEST

START_TEST(loss_moves_only_own_keys)
{
	mk_keys();
	uint64_t m[3];
	mk_members(m, 3);
	for (int lost = 0; lost < 3; lost++) {
		bool live[3] = { true, true, true };
		live[lost] = false;
		int moved = 0;
		for (int k = 0; k < NKEYS; k++) {
			int before = allot__rendezvous_owner(
			    keys[k], m, NULL, 3);
			int during = allot__rendezvous_owner(
			    keys[k], m, live, 3);
			int after = allot__rendezvous_owner(
			    keys[k], m, NULL, 3);
			if (before != lost)
				ck_assert_int_eq(during, before);
			else
				moved++;
			ck_assert_int_ne(during, lost);
			ck_assert_int_eq(after, before);
		}
		/* Its keys went to both survivors, not all to one. */
		ck_assert_int_gt(moved, 0);
	}
	bool none[3] = { false, false, false };
	ck_assert_int_eq(allot__rendezvous_owner(keys[0], m, none, 3), -1);
}
END_TEST

START_TEST(order_and_seed_independent)
{
	/* The owner is a property of names, not of list order or of the
	 * process: reversing the list names the same member. */
	mk_keys();
	uint64_t m[3], r[3];
	mk_members(m, 3);
	r[0] = m[2];
	r[1] = m[1];
	r[2] = m[0];
	for (int k = 0; k < NKEYS; k++) {
		int a = allot__rendezvous_owner(keys[k], m, NULL, 3);
		int b = allot__rendezvous_owner(keys[k], r, NULL, 3);
		ck_assert_int_eq(a, 2 - b);
	}
	/* Pinned values: a change of hash or seed reshuffles clusters. */
	ck_assert_uint_eq(
	    allot__rendezvous_key("s", "q"), allot__rendezvous_key("s", "q"));
	ck_assert_uint_ne(
	    allot__rendezvous_key("s", "q"), allot__rendezvous_key("q", "s"));
}
END_TEST

START_TEST(parse_members)
{
	allot__member m[4];
	char err[128];
	int n = allot__member_parse_list("a=tcp://127.0.0.1:1,"
	                                 "b=ipc:///tmp/x",
	    false, m, 4, err, sizeof err);
	ck_assert_int_eq(n, 2);
	ck_assert_str_eq(m[0].name, "a");
	ck_assert_str_eq(m[0].url, "tcp://127.0.0.1:1");
	ck_assert_str_eq(m[1].url, "ipc:///tmp/x");
	ck_assert_uint_eq(m[1].hash, allot__rendezvous_member("b"));
	/* Bare URLs are named by themselves only where allowed. */
	n = allot__member_parse_list(
	    "tcp://127.0.0.1:1", true, m, 4, err, sizeof err);
	ck_assert_int_eq(n, 1);
	ck_assert_str_eq(m[0].name, "tcp://127.0.0.1:1");
	ck_assert_int_eq(allot__member_parse_list("tcp://127.0.0.1:1", false,
	                     m, 4, err, sizeof err),
	    -1);
	ck_assert_int_eq(
	    allot__member_parse_list("a=x,a=y", false, m, 4, err, sizeof err),
	    -1);
	ck_assert(strstr(err, "twice") != NULL);
	ck_assert_int_eq(
	    allot__member_parse_list("=x", false, m, 4, err, sizeof err), -1);
	ck_assert_int_eq(
	    allot__member_parse_list("a=", false, m, 4, err, sizeof err), -1);
	ck_assert_int_eq(
	    allot__member_parse_list("", false, m, 4, err, sizeof err), -1);
	ck_assert_int_eq(allot__member_parse_list(
	                     "a=1,b=2,c=3", false, m, 2, err, sizeof err),
	    -1);
}
END_TEST

static Suite *
rendezvous_suite(void)
{
	Suite *s = suite_create("rendezvous");
	TCase *tc = tcase_create("hrw");
	tcase_add_test(tc, spread_even);
	tcase_add_test(tc, loss_moves_only_own_keys);
	tcase_add_test(tc, order_and_seed_independent);
	tcase_add_test(tc, parse_members);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(rendezvous_suite)
