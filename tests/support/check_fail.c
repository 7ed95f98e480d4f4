/* SPDX-License-Identifier: MIT */
/*
 * The support library's failures as check failures: linked whole into
 * every test program (testsupport_dep in tests/support/meson.build), it
 * installs, before main, a pc_fail_fn that fails the running test with
 * the message and the place in the library that gave up.
 */
#include <check.h>

#include "fail.h"

static void
check_fail(const char *file, int line, const char *msg)
{
	ck_abort_msg("%s:%d: %s", file, line, msg);
}

__attribute__((constructor)) static void
install_check_fail(void)
{
	pc_set_fail(check_fail);
}
