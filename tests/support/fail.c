/* SPDX-License-Identifier: MIT */
/*
 * The support library's failure path (fail.h): one function pointer,
 * the default printing the message and exiting.
 */
#include "fail.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static pc_fail_fn fail_fn;

void
pc_set_fail(pc_fail_fn fn)
{
	fail_fn = fn;
}

_Noreturn void
pc_fail_at(const char *file, int line, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (fail_fn != NULL)
		fail_fn(file, line, msg);
	fprintf(stderr, "%s:%d: FAIL: %s\n", file, line, msg);
	exit(1);
}
