/* SPDX-License-Identifier: MIT */
/*
 * The load generator's run: the one state the main thread and the
 * workers share (loadgen_engine.h says which lock guards what), the
 * monotonic clock every part reads, and the two kinds of message: notes
 * that --quiet silences and fatal errors that end the program.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "loadgen.h"
#include "loadgen_engine.h"

lg_run lg = { .tmu = PTHREAD_MUTEX_INITIALIZER };

uint64_t
lg_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * NS_PER_S + (uint64_t) ts.tv_nsec;
}

double
lg_since_start_s(uint64_t now)
{
	return now > lg.t0_ns ? (double) (now - lg.t0_ns) / 1e9 : 0;
}

void
lg_note(const char *fmt, ...)
{
	va_list ap;

	if (lg.o.quiet)
		return;
	fprintf(stderr, PROG ": ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

void
lg_fatal(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, PROG ": ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(2);
}
