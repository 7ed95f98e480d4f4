/* SPDX-License-Identifier: MIT */
/*
 * Shared main() for check suites: each tests/test_*.c defines its Suite
 * and ends with ALLOT_TEST_MAIN(its_suite). CK_FORK is honoured as usual;
 * the exit status is non-zero if any test failed.
 */
#ifndef ALLOT_TESTS_RUNNER_H
#define ALLOT_TESTS_RUNNER_H

#include <check.h>
#include <stdlib.h>

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
