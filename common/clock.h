/* SPDX-License-Identifier: MIT */
/*
 * Monotonic time for bucket arithmetic. The fast source reads the CPU's
 * invariant time-stamp counter with RDTSC and scales it to nanoseconds with a
 * multiplier calibrated once per process against CLOCK_MONOTONIC. It is
 * used only where the kernel itself trusts the TSC (its clocksource is
 * "tsc" and the CPU reports constant_tsc and nonstop_tsc); otherwise the
 * source is clock_gettime(CLOCK_MONOTONIC). The wall clock is never used
 * for bucket arithmetic: allot__wall_ms() is for audit rows, log lines
 * and signatures only.
 */
#ifndef ALLOT_COMMON_CLOCK_H
#define ALLOT_COMMON_CLOCK_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

typedef struct allot__tsc {
	bool usable; /* TSC trusted and calibrated */
	uint64_t tsc0; /* counter value at the origin */
	uint64_t mono0; /* CLOCK_MONOTONIC ns at the origin */
	uint64_t mult; /* ns = ((tsc - tsc0) * mult) >> 32 */
	double ghz; /* calibrated frequency, for reports */
} allot__tsc;

/* Process-wide calibration, done once (about 10 ms) on first use. */
const allot__tsc *allot__tsc_get(void);

/* Force the CLOCK_MONOTONIC source (ALLOT_CLOCK=monotonic does too). */
void allot__tsc_disable(void);

static inline uint64_t
allot__mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

/* Milliseconds since the Unix epoch (CLOCK_REALTIME): for the times
 * audit rows, log lines and identity proofs carry, never for a decision. */
static inline int64_t
allot__wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Nanoseconds on the CLOCK_MONOTONIC time line, from the TSC when
 * usable. RDTSC is not serialising, which is fine: a read that executes
 * a few cycles early only makes a decision more conservative. */
static inline uint64_t
allot__tsc_ns(const allot__tsc *t)
{
#if defined(__x86_64__)
	if (t->usable) {
		uint64_t c = __rdtsc();
		__extension__ typedef unsigned __int128 u128;
		return t->mono0 +
		    (uint64_t) (((u128) (c - t->tsc0) * t->mult) >> 32);
	}
#endif
	return allot__mono_ns();
}

#endif
