/* SPDX-License-Identifier: MIT */
/*
 * TSC calibration for the fast monotonic clock (clock.h). Calibrated once
 * per process: two (TSC, CLOCK_MONOTONIC) pairs taken about 20 ms apart,
 * each bracketed tightly so the pair is read within a few hundred
 * nanoseconds of each other. The resulting rate error is below 1e-5, i.e.
 * under 10 microseconds of drift per second of bucket time and far below
 * any rate a quota is configured with; docs/configuration.md ("Time")
 * states the effect on accuracy.
 */
#include "clock.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static allot__tsc tsc;
static pthread_once_t tsc_once = PTHREAD_ONCE_INIT;
static _Atomic int tsc_forced_off;

#if defined(__x86_64__)
static bool
kernel_trusts_tsc(void)
{
	char buf[64] = { 0 };
	FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/"
	                "current_clocksource",
	    "r");
	if (f == NULL)
		return false;
	bool ok = fgets(buf, sizeof buf, f) != NULL &&
	    strncmp(buf, "tsc", 3) == 0;
	fclose(f);
	if (!ok)
		return false;
	/* The kernel only keeps "tsc" as clocksource when it is invariant
	 * and synchronised; check the flags anyway. */
	f = fopen("/proc/cpuinfo", "r");
	if (f == NULL)
		return false;
	char line[4096];
	bool constant = false, nonstop = false;
	while (fgets(line, sizeof line, f) != NULL) {
		if (strncmp(line, "flags", 5) != 0)
			continue;
		constant = strstr(line, " constant_tsc") != NULL;
		nonstop = strstr(line, " nonstop_tsc") != NULL;
		break;
	}
	fclose(f);
	return constant && nonstop;
}

/* One tightly bracketed (tsc, mono) pair: the read with the smallest
 * TSC bracket out of a few tries. */
static void
sample(uint64_t *ret_tsc, uint64_t *ret_mono)
{
	uint64_t best = UINT64_MAX;
	for (int i = 0; i < 16; i++) {
		unsigned aux;
		uint64_t a = __rdtscp(&aux);
		uint64_t m = allot__mono_ns();
		uint64_t b = __rdtscp(&aux);
		if (b - a < best) {
			best = b - a;
			*ret_tsc = a + (b - a) / 2;
			*ret_mono = m;
		}
	}
}
#endif

static void
calibrate(void)
{
	memset(&tsc, 0, sizeof tsc);
	const char *env = getenv("ALLOT_CLOCK");
	if (tsc_forced_off || (env != NULL && strcmp(env, "monotonic") == 0))
		return;
#if defined(__x86_64__)
	if (!kernel_trusts_tsc())
		return;
	uint64_t t0 = 0, m0 = 0, t1 = 0, m1 = 0;
	sample(&t0, &m0);
	struct timespec ts = { 0, 20 * 1000 * 1000 };
	nanosleep(&ts, NULL);
	sample(&t1, &m1);
	if (t1 <= t0 || m1 <= m0)
		return;
	/* mult = ns per tick in 32.32 fixed point. */
	double ns_per_tick = (double) (m1 - m0) / (double) (t1 - t0);
	tsc.mult = (uint64_t) (ns_per_tick * 4294967296.0 + 0.5);
	tsc.tsc0 = t1;
	tsc.mono0 = m1;
	tsc.ghz = 1.0 / ns_per_tick;
	tsc.usable = tsc.mult != 0;
#endif
}

const allot__tsc *
allot__tsc_get(void)
{
	pthread_once(&tsc_once, calibrate);
	return &tsc;
}

void
allot__tsc_disable(void)
{
	tsc_forced_off = 1;
	tsc.usable = false;
}
