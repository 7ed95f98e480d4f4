/* SPDX-License-Identifier: MIT */
/*
 * fault-agent: one agent with one quota and a fixed acquire schedule, run
 * as a child of the clock test (test_fault_clock.c) so that it can live
 * under libfaketime. It sets up (and, with --coordinator, waits until it
 * has synced), prints "ready", waits for a line on stdin, then acquires
 * one token every --tick-us microseconds for --duration-ms on an absolute
 * CLOCK_MONOTONIC schedule and prints what was admitted, how long the
 * schedule really took, and how many wall-clock jumps it saw (the offset
 * between CLOCK_REALTIME and CLOCK_MONOTONIC moving by more than an
 * hour). --wallclock injects CLOCK_REALTIME as the agent's clock: the
 * control run that shows the test would catch an agent reading the wall
 * clock. Exit status 0, or 2 for a bad command line or a setup failure.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <allot/allot.h>

static int64_t
ns(clockid_t c)
{
	struct timespec ts;
	clock_gettime(c, &ts);
	return (int64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The wall clock as an agent clock: CLOCK_REALTIME from an origin 30
 * days before the start (bucket times are 60-bit nanoseconds, see
 * common/bucket.h, and must not go below 0 when the clock goes back). */
static int64_t wall_origin;

static uint64_t
wall_clock(void *ctx)
{
	(void) ctx;
	return (uint64_t) (ns(CLOCK_REALTIME) - wall_origin);
}

static int
usage(void)
{
	fprintf(stderr,
	    "usage: fault-agent [--coordinator URL] "
	    "[--wallclock] --rate R --burst B --duration-ms D "
	    "--tick-us U\n");
	return 2;
}

int
main(int argc, char **argv)
{
	const char *coord = NULL;
	double rate = 0, burst = 0;
	long duration_ms = 0, tick_us = 0;
	int wall = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "--wallclock") == 0) {
			wall = 1;
			continue;
		}
		if (v == NULL)
			return usage();
		i++;
		if (strcmp(a, "--coordinator") == 0)
			coord = v;
		else if (strcmp(a, "--rate") == 0)
			rate = atof(v);
		else if (strcmp(a, "--burst") == 0)
			burst = atof(v);
		else if (strcmp(a, "--duration-ms") == 0)
			duration_ms = atol(v);
		else if (strcmp(a, "--tick-us") == 0)
			tick_us = atol(v);
		else
			return usage();
	}
	if (!(rate > 0) || !(burst > 0) || duration_ms <= 0 || tick_us <= 0)
		return usage();

	char yaml[256], err[256];
	snprintf(yaml, sizeof yaml,
	    "quotas:\n"
	    "  default: {tokens_per_second: 1, burst: 1}\n"
	    "  callers:\n"
	    "    - {identity: c, tokens_per_second: %g, burst: %g}\n",
	    rate, burst);
	allot_config *cfg;
	if (allot_config_parse("clock.yaml", yaml, strlen(yaml), err,
	        sizeof err, &cfg) != ALLOT_OK) {
		fprintf(stderr, "fault-agent: %s\n", err);
		return 2;
	}
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.coordinator = coord;
	o.service = "clock";
	o.replica_id = "clock-agent";
	o.sync_interval_ms = 50;
	o.reconnect_min_ms = 50;
	o.reconnect_max_ms = 200;
	if (wall) {
		wall_origin = ns(CLOCK_REALTIME) - 30 * 86400 * 1000000000LL;
		o.clock = wall_clock;
	}
	allot_agent *a;
	if (allot_agent_create(cfg, &o, &a) != ALLOT_OK)
		return 2;
	allot_config_free(cfg);
	allot_key *k;
	if (allot_key_resolve(a, "c", "/x", &k) != ALLOT_OK)
		return 2;
	if (coord != NULL) {
		int64_t t0 = ns(CLOCK_MONOTONIC);
		for (;;) {
			allot_sync_stats ss;
			allot_sync_stats_get(a, &ss);
			if (ss.connected && ss.syncs_ok > 0)
				break;
			if (ns(CLOCK_MONOTONIC) - t0 > 10000000000LL) {
				fprintf(stderr, "fault-agent: no sync\n");
				return 2;
			}
			struct timespec d = { 0, 10000000 };
			nanosleep(&d, NULL);
		}
	}
	printf("ready\n");
	fflush(stdout);
	char line[16];
	if (fgets(line, sizeof line, stdin) == NULL)
		return 2;

	uint64_t admitted = 0, denied = 0, errors = 0;
	int forward = 0, backward = 0;
	int64_t offset = ns(CLOCK_REALTIME) - ns(CLOCK_MONOTONIC);
	int64_t start = ns(CLOCK_MONOTONIC);
	long ticks = duration_ms * 1000 / tick_us;
	for (long t = 0; t < ticks; t++) {
		allot_decision d;
		if (allot_acquire(a, k, 1, &d) != ALLOT_OK)
			errors++;
		else if (d.allowed)
			admitted++;
		else
			denied++;
		int64_t off = ns(CLOCK_REALTIME) - ns(CLOCK_MONOTONIC);
		if (off - offset > 3600000000000LL)
			forward++;
		else if (offset - off > 3600000000000LL)
			backward++;
		offset = off;
		/* Relative sleeps to absolute deadlines: libfaketime
		 * mistranslates TIMER_ABSTIME sleeps on CLOCK_MONOTONIC. */
		int64_t due = start + (int64_t) (t + 1) * tick_us * 1000;
		int64_t left = due - ns(CLOCK_MONOTONIC);
		if (left > 0) {
			struct timespec nap = { (time_t) (left / 1000000000),
				(long) (left % 1000000000) };
			while (nanosleep(&nap, &nap) != 0 && errno == EINTR)
				;
		}
	}
	double elapsed = (double) (ns(CLOCK_MONOTONIC) - start) / 1e6;
	allot_sync_stats ss;
	allot_sync_stats_get(a, &ss);
	printf("admitted=%llu denied=%llu errors=%llu elapsed_ms=%.3f "
	       "forward=%d backward=%d fallbacks=%llu registers=%llu\n",
	    (unsigned long long) admitted, (unsigned long long) denied,
	    (unsigned long long) errors, elapsed, forward, backward,
	    (unsigned long long) ss.fallback_enters,
	    (unsigned long long) ss.registers);
	fflush(stdout);
	allot_agent_destroy(a);
	return 0;
}
