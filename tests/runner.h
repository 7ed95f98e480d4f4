/* SPDX-License-Identifier: MIT */
/*
 * Shared main() for check suites: each tests/test_*.c defines its Suite
 * and ends with ALLOT_TEST_MAIN(its_suite). CK_FORK is honoured as usual;
 * the exit status is non-zero if any test failed. Also INVARIANT, the
 * assertion for loops that check something thousands of times, and
 * ALLOT_TEST_SANITIZED, set in AddressSanitizer and ThreadSanitizer
 * builds.
 */
#ifndef ALLOT_TESTS_RUNNER_H
#define ALLOT_TESTS_RUNNER_H

#include <check.h>
#include <stdlib.h>

/* check's ck_assert_* records the place of every assertion that passes,
 * with a write to the runner's pipe each time: in a loop that checks an
 * invariant a million times, that is most of the case's time (seconds,
 * more under ASan). INVARIANT fails the test the same way, through
 * ck_abort_msg with the message, and costs nothing while `cond` holds.
 * The message is a format and its arguments, as ck_assert_msg takes. */
#define INVARIANT(cond, ...)                       \
	do {                                       \
		if (!(cond))                       \
			ck_abort_msg(__VA_ARGS__); \
	} while (0)

/* 1 in an ASan or TSan build (gcc defines __SANITIZE_*__, clang answers
 * __has_feature): where a load test may shrink to fit its timeout, and
 * where a sanitizer's runtime rules out a preload. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define ALLOT_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define ALLOT_TEST_SANITIZED 1
#endif
#endif
#ifndef ALLOT_TEST_SANITIZED
#define ALLOT_TEST_SANITIZED 0
#endif

#define ALLOT_TEST_MAIN(suite_fn)                                 \
	int main(void)                                            \
	{                                                         \
		SRunner *sr = srunner_create(suite_fn());         \
		srunner_run_all(sr, CK_NORMAL);                   \
		int failed = srunner_ntests_failed(sr);           \
		srunner_free(sr);                                 \
		return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE; \
	}

#endif
