/* SPDX-License-Identifier: MIT */
/*
 * How the test support library (tests/support/) fails whoever called it
 * when a fixture cannot do its job: a port, a process, a file that will
 * not come. In a check suite that is the running test's failure, with
 * the message (tests link check_fail.c, which installs ck_abort_msg);
 * elsewhere (the benchmarks) the message on stderr and exit(1), as
 * bench_fail does. The library itself never includes check.h, so that
 * bench/ links it too.
 */
#ifndef ALLOT_TESTS_SUPPORT_FAIL_H
#define ALLOT_TESTS_SUPPORT_FAIL_H

/* Report `msg` (made at `file`:`line`) and do not return. */
typedef void (*pc_fail_fn)(const char *file, int line, const char *msg);

/* Install `fn` as the way to fail (NULL: the default, stderr and
 * exit(1)). */
void pc_set_fail(pc_fail_fn fn);

/* Format the message and fail with it; never returns (if the installed
 * function returns, the process exits with status 1). */
_Noreturn void pc_fail_at(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define PC_FAIL(...) pc_fail_at(__FILE__, __LINE__, __VA_ARGS__)
/* Fail with the message unless `cond` holds. */
#define PC_CHECK(cond, ...)                   \
	do {                                  \
		if (!(cond))                  \
			PC_FAIL(__VA_ARGS__); \
	} while (0)

#endif
