/* SPDX-License-Identifier: MIT */
/*
 * allot-loadgen: drives a protected service (examples/) with many callers,
 * each with its own client certificate, open-loop target rate, endpoint mix
 * and stickiness to one replica, and reports per-caller and per-replica
 * outcomes and latency percentiles once a second (JSON lines) and at the
 * end (a table, or JSON). It is built on the caller-side code of liballot
 * (allot/client.h): 429s are retried through allot_retry_next(), which
 * honours Retry-After as a floor, caps attempts and enforces the retry
 * budget; allot_throttle optionally rejects locally when the service is
 * saturated. One thread per caller (loadgen_worker.c) runs a libcurl multi
 * handle whose connection pool keeps TLS connections alive across
 * requests. This file is the main thread: the command line (one option
 * table, common/opts.h, drives the parse and --help), starting the
 * callers, the once-a-second tick that re-reads the targets file and
 * writes statistics, SIGINT/SIGTERM, and the summary. Only loopback
 * targets are accepted.
 * docs/loadgen.md is the manual.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>

#include <allot/allot.h>

#include "loadgen.h"
#include "loadgen_engine.h"
#include "opts.h"

/* ------------------------------------------------------------------ */
/* Command line                                                        */
/* ------------------------------------------------------------------ */

/* The callers as parsed, before lg.callers exists. */
static lg_caller_spec specs[LG_MAX_CALLERS];
static size_t nspecs;

static int
arg_path(const allot__opt_use *u, char *dst)
{
	if (strlen(u->arg) > LG_FILE_MAX || u->arg[0] == '\0')
		return allot__opts_fail(u, "%s: empty or too long", u->as);
	strcpy(dst, u->arg);
	return ALLOT__OPTS_OK;
}

static void
check_readable(const char *what, const char *path)
{
	FILE *f = fopen(path, "r");

	if (f == NULL)
		lg_fatal("%s %s: %s", what, path, strerror(errno));
	fclose(f);
}

static int
opt_target(const allot__opt_use *u, void *dst)
{
	char norm[LG_URL_MAX + 1];
	char err[512];

	if (lg_target_check(u->arg, norm, sizeof norm, err, sizeof err) != 0)
		return allot__opts_fail(u, "--target: %s", err);
	if (lg_target_add_locked(norm, true) < 0)
		return allot__opts_fail(
		    u, "--target: more than %d targets", LG_MAX_TARGETS);
	return ALLOT__OPTS_OK;
}

static int
opt_targets_file(const allot__opt_use *u, void *dst)
{
	return arg_path(u, ((options *) dst)->targets_file);
}

static int
opt_ca(const allot__opt_use *u, void *dst)
{
	return arg_path(u, ((options *) dst)->ca);
}

static int
opt_stats_file(const allot__opt_use *u, void *dst)
{
	return arg_path(u, ((options *) dst)->stats_file);
}

static int
opt_caller(const allot__opt_use *u, void *dst)
{
	char err[512];

	if (nspecs == LG_MAX_CALLERS)
		return allot__opts_fail(
		    u, "--caller: at most %d callers", LG_MAX_CALLERS);
	if (lg_caller_spec_parse(u->arg, &specs[nspecs], err, sizeof err) != 0)
		return allot__opts_fail(u, "--caller '%s': %s", u->arg, err);
	for (size_t i = 0; i < nspecs; i++)
		if (strcmp(specs[i].name, specs[nspecs].name) == 0)
			return allot__opts_fail(u,
			    "--caller: name '%s' used twice", specs[i].name);
	nspecs++;
	return ALLOT__OPTS_OK;
}

static int
opt_seed(const allot__opt_use *u, void *dst)
{
	options *o = dst;

	if (!allot__opts_uint(u->arg, 0, UINT64_MAX, &o->seed))
		return allot__opts_fail(
		    u, "--seed expects an integer, not \"%s\"", u->arg);
	o->seeded = true;
	return ALLOT__OPTS_OK;
}

static int
opt_version(const allot__opt_use *u, void *dst)
{
	printf("%s %s (libcurl %s)\n", PROG, ALLOT_VERSION_STRING,
	    curl_version_info(CURLVERSION_NOW)->version);
	return ALLOT__OPTS_DONE;
}

#define AT(f) offsetof(options, f)

/* The options, in the sections --help lists them under. */
static const allot__opt option_table[] = {
	{ "target", 't', ALLOT__OPT_CALL, "URL",
	    "a replica, e.g. https://127.0.0.1:9001\n"
	    "(repeatable)\n",
	    .set = opt_target, .section = "Targets" },
	{ "targets-file", 0, ALLOT__OPT_CALL, "FILE",
	    "one URL per line, '#' comments; re-read\n"
	    "every second (replace it with rename)\n",
	    .set = opt_targets_file, .section = "Targets" },
	{ "ca", 0, ALLOT__OPT_CALL, "FILE",
	    "CA certificate(s) to verify the service\n", .set = opt_ca,
	    .section = "Targets" },
	{ "no-verify-hostname", 0, ALLOT__OPT_FALSE, NULL,
	    "verify the chain but not the name\n", .off = AT(verify_host),
	    .section = "Targets" },
	{ "caller", 'c', ALLOT__OPT_CALL, "SPEC",
	    "key=value,... (repeatable), keys:\n", .set = opt_caller,
	    .section = "Callers",
	    .more =
	        "        name=NAME          required, [A-Za-z0-9._-]\n"
	        "        rate=R             required, requests/s (open loop)\n"
	        "        cert=FILE,key=FILE\n"
	        "                           client certificate (none: no "
	        "cert)\n"
	        "        mix=P:W;P:W        endpoint mix (default /lookup:1)\n"
	        "        sticky=P           probability of the home replica "
	        "(0)\n"
	        "        concurrency=N      attempts in flight (and requests\n"
	        "                           waiting to retry); arrivals over\n"
	        "                           it are skipped, not queued (16)\n"
	        "        retry=on|off       retry 429 and 503+Retry-After "
	        "(on)\n"
	        "        attempts=N         attempts per request, first one\n"
	        "                           included (4)\n"
	        "        budget=F           retries <= F of requests (0.1)\n"
	        "        max_wait=MS        longest retry wait accepted "
	        "(10000)\n"
	        "        throttle=on|off    client-side adaptive throttling "
	        "(off)\n"
	        "        throttle_k=K       its multiplier (2)\n"
	        "        header=NAME:VALUE  extra request header\n"
	        "        start=S,end=S      active between these offsets\n" },
	{ "duration", 'd', ALLOT__OPT_DOUBLE, "S", "how long",
	    .off = AT(duration_s), .lo = 0.001, .hi = 86400, .section = "Run",
	    .dflt = "10" },
	{ "max-requests", 'n', ALLOT__OPT_U64, "N",
	    "bound on attempts sent, all callers", .off = AT(max_requests),
	    .min = 1, .max = UINT64_C(1) << 48, .section = "Run" },
	{ "timeout", 0, ALLOT__OPT_U32, "MS", "per attempt",
	    .off = AT(timeout_ms), .min = 1, .max = 600000, .section = "Run",
	    .dflt = "5000" },
	{ "drain", 0, ALLOT__OPT_U32, "MS", "grace for in-flight at the end",
	    .off = AT(drain_ms), .max = 600000, .section = "Run",
	    .dflt = "2000" },
	{ "seed", 0, ALLOT__OPT_CALL, "N", "reproducible draws",
	    .set = opt_seed, .section = "Run" },
	{ "stats-file", 's', ALLOT__OPT_CALL, "FILE",
	    "append one JSON line per second", .set = opt_stats_file,
	    .section = "Output" },
	{ "json", 0, ALLOT__OPT_TRUE, NULL, "final summary as JSON on stdout",
	    .off = AT(json), .section = "Output" },
	{ "quiet", 'q', ALLOT__OPT_TRUE, NULL, "no progress notes on stderr",
	    .off = AT(quiet), .section = "Output" },
	{ "help", 'h', ALLOT__OPT_HELP, NULL, "this text",
	    .section = "Output" },
	{ "version", 'V', ALLOT__OPT_CALL, NULL, "the version",
	    .set = opt_version, .section = "Output" },
};

static const allot__opts table = {
	.prog = PROG,
	.rows = option_table,
	.n = sizeof option_table / sizeof option_table[0],
	.style = ALLOT__OPTS_COLUMNS,
	.col = 27,
	.head =
	    "Usage: " PROG " --target URL... --caller SPEC... [options]\n"
	    "\n"
	    "Drive the allot example service with many callers, each with\n"
	    "its own client certificate, open-loop rate, endpoint mix and\n"
	    "stickiness to one replica; report outcomes and latency.\n"
	    "Retries follow liballot's retry helper (Retry-After, backoff,\n"
	    "attempt cap, retry budget). Only loopback targets are "
	    "allowed.\n",
	.tail = "\n"
	        "SIGINT or SIGTERM ends the run early, with the summary; a "
	        "second\n"
	        "one abandons in-flight requests. See docs/loadgen.md.\n",
};

/* Check what the options said together, and give every caller a slot in
 * lg.callers. */
static void
check_args(void)
{
	if (nspecs == 0)
		lg_fatal("no --caller given (see --help)");
	if (lg.ntargets == 0 && lg.o.targets_file[0] == '\0')
		lg_fatal("no --target or --targets-file given (see --help)");
	if (lg.o.ca[0] != '\0')
		check_readable("--ca", lg.o.ca);
	for (size_t i = 0; i < nspecs; i++) {
		if (specs[i].cert[0] != '\0') {
			check_readable("cert", specs[i].cert);
			check_readable("key", specs[i].key);
		}
	}
	lg.callers = calloc(nspecs, sizeof *lg.callers);
	if (lg.callers == NULL)
		lg_fatal("out of memory");
	for (size_t i = 0; i < nspecs; i++)
		lg.callers[i].spec = specs[i];
	lg.ncallers = nspecs;
}

static void
parse_args(int argc, char **argv)
{
	lg.o.duration_s = 10;
	lg.o.verify_host = true;
	lg.o.timeout_ms = 5000;
	lg.o.drain_ms = 2000;
	int rc = allot__opts_parse(&table, NULL, argc, argv, &lg.o);
	if (rc != ALLOT__OPTS_OK)
		exit(rc == ALLOT__OPTS_DONE ? 0 : 2);
	check_args();
}

/* ------------------------------------------------------------------ */
/* Main                                                                */
/* ------------------------------------------------------------------ */

static void
on_signal(int sig)
{
	(void) sig;
	lg.signals = lg.signals + 1;
	if (lg.signals > 1)
		atomic_store(&lg.stop, 2);
}

static bool
all_done(void)
{
	for (size_t i = 0; i < lg.ncallers; i++)
		if (!atomic_load(&lg.callers[i].done))
			return false;
	return true;
}

static void
sleep_until(uint64_t until)
{
	uint64_t now = lg_now_ns();
	struct timespec ts;
	uint64_t d;

	if (until <= now)
		return;
	d = until - now;
	if (d > WORKER_TICK_MS * NS_PER_MS)
		d = WORKER_TICK_MS * NS_PER_MS;
	ts.tv_sec = (time_t) (d / NS_PER_S);
	ts.tv_nsec = (long) (d % NS_PER_S);
	nanosleep(&ts, NULL); /* EINTR on a signal: that is the point */
}

/* Set up every caller and start its thread, with every signal blocked
 * (the main thread takes SIGINT and SIGTERM). NULL, or "error" when a
 * thread could not be started. */
static const char *
start_callers(uint64_t end)
{
	sigset_t all, old;
	const char *stopped_by = NULL;

	for (size_t i = 0; i < lg.ncallers; i++) {
		caller *c = &lg.callers[i];
		lg_caller_setup(c, i);
		lg_pacer_init(&c->pacer,
		    lg.t0_ns + (uint64_t) (c->spec.start_s * 1e9),
		    c->spec.rate);
		c->end_ns = c->spec.end_s > 0 ?
		    lg.t0_ns + (uint64_t) (c->spec.end_s * 1e9) :
		    end;
		if (c->end_ns > end)
			c->end_ns = end;
	}
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	for (size_t i = 0; i < lg.ncallers; i++) {
		int rc = pthread_create(
		    &lg.callers[i].thread, NULL, lg_worker, &lg.callers[i]);
		if (rc != 0) {
			fprintf(stderr, PROG ": pthread_create: %s\n",
			    strerror(rc));
			atomic_store(&lg.stop, 2);
			stopped_by = "error";
			break;
		}
		lg.callers[i].started = true;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return stopped_by;
}

/* Once a second until the run ends: re-read the targets file and write
 * a statistics line. Returns why the run ended; `last_tick` is when the
 * last line was written. */
static const char *
tick_until_done(snap *snaps, uint64_t end, uint64_t *last_tick)
{
	uint64_t next_tick = lg.t0_ns + NS_PER_S;
	const char *stopped_by = NULL;

	*last_tick = lg.t0_ns;
	while (stopped_by == NULL) {
		uint64_t now;

		sleep_until(next_tick < end ? next_tick : end);
		now = lg_now_ns();
		if (lg.signals > 0)
			stopped_by = "signal";
		else if (atomic_load(&lg.exhausted))
			stopped_by = "max_requests";
		else if (now >= end)
			stopped_by = "duration";
		else if (all_done())
			stopped_by = "callers_done";
		if (stopped_by == NULL && now >= next_tick) {
			lg_targets_reload(false);
			for (size_t i = 0; i < lg.ncallers; i++)
				lg_take_snapshot(&lg.callers[i], &snaps[i]);
			lg_stats_line(snaps, lg_since_start_s(now),
			    (double) (now - *last_tick) / 1e9, false, NULL);
			*last_tick = now;
			/* Ticks stay on whole seconds from the start,
			 * skipping any that a stall made us miss. */
			while (next_tick <= now)
				next_tick += NS_PER_S;
		}
	}
	return stopped_by;
}

/* Stop the workers, wait for them, and write the final report. */
static void
finish(snap *snaps, uint64_t last_tick, const char *stopped_by)
{
	uint64_t now;
	double elapsed;

	if (atomic_load(&lg.stop) == 0)
		atomic_store(&lg.stop, 1);
	for (size_t i = 0; i < lg.ncallers; i++)
		curl_multi_wakeup(lg.callers[i].multi);
	for (size_t i = 0; i < lg.ncallers; i++)
		if (lg.callers[i].started)
			pthread_join(lg.callers[i].thread, NULL);

	now = lg_now_ns();
	elapsed = lg_since_start_s(now);
	for (size_t i = 0; i < lg.ncallers; i++)
		lg_take_snapshot(&lg.callers[i], &snaps[i]);
	lg_stats_line(snaps, elapsed, (double) (now - last_tick) / 1e9, true,
	    stopped_by);
	if (lg.o.json) {
		lg_json_report(stdout, snaps, elapsed,
		    (double) (now - last_tick) / 1e9, true, stopped_by);
		fputc('\n', stdout);
	} else {
		lg_print_table(snaps, elapsed, stopped_by);
	}
	fflush(stdout);
}

int
main(int argc, char **argv)
{
	struct sigaction sa;
	snap *snaps;
	uint64_t end, last_tick = 0;
	const char *stopped_by;

	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
		lg_fatal("curl_global_init failed");
	parse_args(argc, argv);
	if (!lg_targets_reload(true))
		exit(2);
	if (lg_targets_active() == 0)
		lg_note("no active target yet: requests fail until %s lists "
		        "one",
		    lg.o.targets_file);
	if (lg.o.stats_file[0] != '\0') {
		lg.stats = fopen(lg.o.stats_file, "a");
		if (lg.stats == NULL)
			lg_fatal("--stats-file %s: %s", lg.o.stats_file,
			    strerror(errno));
	}
	snaps = calloc(lg.ncallers, sizeof *snaps);
	if (snaps == NULL)
		lg_fatal("out of memory");

	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	lg.t0_ns = lg_now_ns() + 10 * NS_PER_MS;
	end = lg.t0_ns + (uint64_t) (lg.o.duration_s * 1e9);
	stopped_by = start_callers(end);
	if (stopped_by == NULL)
		stopped_by = tick_until_done(snaps, end, &last_tick);
	else
		last_tick = lg.t0_ns;
	finish(snaps, last_tick, stopped_by);

	for (size_t i = 0; i < lg.ncallers; i++)
		lg_caller_teardown(&lg.callers[i]);
	free(lg.callers);
	free(snaps);
	if (lg.stats != NULL)
		fclose(lg.stats);
	curl_global_cleanup();
	return strcmp(stopped_by, "error") == 0 ? 2 : 0;
}
