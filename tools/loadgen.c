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
 * table drives getopt_long and --help), starting the callers, the
 * once-a-second tick that re-reads the targets file and writes
 * statistics, SIGINT/SIGTERM, and the summary. Only loopback targets are
 * accepted. docs/loadgen.md is the manual.
 */
#include <errno.h>
#include <getopt.h>
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

/* ------------------------------------------------------------------ */
/* Command line                                                        */
/* ------------------------------------------------------------------ */

/* The callers as parsed, before lg.callers exists. */
static lg_caller_spec specs[LG_MAX_CALLERS];
static size_t nspecs;

static double
arg_double(const char *opt, const char *v, double lo, double hi)
{
	char *end;
	double d;

	errno = 0;
	d = strtod(v, &end);
	if (errno != 0 || end == v || *end != '\0' || !isfinite(d) || d < lo ||
	    d > hi)
		lg_fatal(
		    "%s: want a number in [%g, %g], got '%s'", opt, lo, hi, v);
	return d;
}

static uint64_t
arg_u64(const char *opt, const char *v, uint64_t lo, uint64_t hi)
{
	char *end;
	unsigned long long u;

	errno = 0;
	u = strtoull(v, &end, 10);
	if (errno != 0 || end == v || *end != '\0' || v[0] == '-' || u < lo ||
	    u > hi)
		lg_fatal("%s: want an integer in [%" PRIu64 ", %" PRIu64
		         "], got '%s'",
		    opt, lo, hi, v);
	return u;
}

static void
arg_path(char *dst, const char *opt, const char *v)
{
	if (strlen(v) > LG_FILE_MAX || v[0] == '\0')
		lg_fatal("%s: empty or too long", opt);
	strcpy(dst, v);
}

static void
check_readable(const char *what, const char *path)
{
	FILE *f = fopen(path, "r");

	if (f == NULL)
		lg_fatal("%s %s: %s", what, path, strerror(errno));
	fclose(f);
}

static void
opt_target(const char *v)
{
	char norm[LG_URL_MAX + 1];
	char err[512];

	if (lg_target_check(v, norm, sizeof norm, err, sizeof err) != 0)
		lg_fatal("--target: %s", err);
	if (lg_target_add_locked(norm, true) < 0)
		lg_fatal("--target: more than %d targets", LG_MAX_TARGETS);
}

static void
opt_targets_file(const char *v)
{
	arg_path(lg.o.targets_file, "--targets-file", v);
}

static void
opt_ca(const char *v)
{
	arg_path(lg.o.ca, "--ca", v);
}

static void
opt_no_verify_hostname(const char *v)
{
	lg.o.verify_host = false;
}

static void
opt_caller(const char *v)
{
	char err[512];

	if (nspecs == LG_MAX_CALLERS)
		lg_fatal("--caller: at most %d callers", LG_MAX_CALLERS);
	if (lg_caller_spec_parse(v, &specs[nspecs], err, sizeof err) != 0)
		lg_fatal("--caller '%s': %s", v, err);
	for (size_t i = 0; i < nspecs; i++)
		if (strcmp(specs[i].name, specs[nspecs].name) == 0)
			lg_fatal(
			    "--caller: name '%s' used twice", specs[i].name);
	nspecs++;
}

static void
opt_duration(const char *v)
{
	lg.o.duration_s = arg_double("--duration", v, 0.001, 86400);
}

static void
opt_max_requests(const char *v)
{
	lg.o.max_requests = arg_u64("--max-requests", v, 1, UINT64_C(1) << 48);
}

static void
opt_timeout(const char *v)
{
	lg.o.timeout_ms = (uint32_t) arg_u64("--timeout", v, 1, 600000);
}

static void
opt_drain(const char *v)
{
	lg.o.drain_ms = (uint32_t) arg_u64("--drain", v, 0, 600000);
}

static void
opt_seed(const char *v)
{
	lg.o.seed = arg_u64("--seed", v, 0, UINT64_MAX);
	lg.o.seeded = true;
}

static void
opt_stats_file(const char *v)
{
	arg_path(lg.o.stats_file, "--stats-file", v);
}

static void
opt_json(const char *v)
{
	lg.o.json = true;
}

static void
opt_quiet(const char *v)
{
	lg.o.quiet = true;
}

static void usage(FILE *f);

static void
opt_help(const char *v)
{
	usage(stdout);
	exit(0);
}

static void
opt_version(const char *v)
{
	printf("%s %s (libcurl %s)\n", PROG, ALLOT_VERSION_STRING,
	    curl_version_info(CURLVERSION_NOW)->version);
	exit(0);
}

/* One option: its names, its value's name (NULL: none), the section of
 * --help it is listed under, its help (lines ending in '\n'; `more` is
 * printed after it as it is) and what it sets. */
static const struct lg_option {
	const char *name;
	int short_name;
	const char *arg;
	const char *section;
	const char *help;
	const char *more;
	void (*set)(const char *v);
} option_table[] = {
	{ "target", 't', "URL", "Targets",
	    "a replica, e.g. https://127.0.0.1:9001\n(repeatable)\n", NULL,
	    opt_target },
	{ "targets-file", 0, "FILE", "Targets",
	    "one URL per line, '#' comments; re-read\nevery second (replace "
	    "it with rename)\n",
	    NULL, opt_targets_file },
	{ "ca", 0, "FILE", "Targets",
	    "CA certificate(s) to verify the service\n", NULL, opt_ca },
	{ "no-verify-hostname", 0, NULL, "Targets",
	    "verify the chain but not the name\n", NULL,
	    opt_no_verify_hostname },
	{ "caller", 'c', "SPEC", "Callers",
	    "key=value,... (repeatable), keys:\n",
	    "        name=NAME          required, [A-Za-z0-9._-]\n"
	    "        rate=R             required, requests/s (open loop)\n"
	    "        cert=FILE,key=FILE client certificate (none: no cert)\n"
	    "        mix=P:W;P:W        endpoint mix (default /lookup:1)\n"
	    "        sticky=P           probability of the home replica (0)\n"
	    "        concurrency=N      attempts in flight (and requests\n"
	    "                           waiting to retry); arrivals over\n"
	    "                           it are skipped, not queued (16)\n"
	    "        retry=on|off       retry 429 and 503+Retry-After (on)\n"
	    "        attempts=N         attempts per request, first one\n"
	    "                           included (4)\n"
	    "        budget=F           retries <= F of requests (0.1)\n"
	    "        max_wait=MS        longest retry wait accepted (10000)\n"
	    "        throttle=on|off    client-side adaptive throttling "
	    "(off)\n"
	    "        throttle_k=K       its multiplier (2)\n"
	    "        header=NAME:VALUE  extra request header\n"
	    "        start=S,end=S      active between these offsets\n",
	    opt_caller },
	{ "duration", 'd', "S", "Run", "how long (default 10)\n", NULL,
	    opt_duration },
	{ "max-requests", 'n', "N", "Run",
	    "bound on attempts sent, all callers\n", NULL, opt_max_requests },
	{ "timeout", 0, "MS", "Run", "per attempt (default 5000)\n", NULL,
	    opt_timeout },
	{ "drain", 0, "MS", "Run", "grace for in-flight at the end (2000)\n",
	    NULL, opt_drain },
	{ "seed", 0, "N", "Run", "reproducible draws\n", NULL, opt_seed },
	{ "stats-file", 's', "FILE", "Output",
	    "append one JSON line per second\n", NULL, opt_stats_file },
	{ "json", 0, NULL, "Output", "final summary as JSON on stdout\n", NULL,
	    opt_json },
	{ "quiet", 'q', NULL, "Output", "no progress notes on stderr\n", NULL,
	    opt_quiet },
	{ "help", 'h', NULL, "Output", "this text\n", NULL, opt_help },
	{ "version", 'V', NULL, "Output", "the version\n", NULL, opt_version },
};

#define NOPTIONS (sizeof option_table / sizeof option_table[0])

static void
usage(FILE *f)
{
	const char *section = NULL;

	fputs("Usage: " PROG " --target URL... --caller SPEC... [options]\n"
	      "\n"
	      "Drive the allot example service with many callers, each with\n"
	      "its own client certificate, open-loop rate, endpoint mix and\n"
	      "stickiness to one replica; report outcomes and latency.\n"
	      "Retries follow liballot's retry helper (Retry-After, backoff,\n"
	      "attempt cap, retry budget). Only loopback targets are "
	      "allowed.\n",
	    f);
	for (size_t i = 0; i < NOPTIONS; i++) {
		const struct lg_option *o = &option_table[i];
		char left[64];

		if (section == NULL || strcmp(section, o->section) != 0)
			fprintf(f, "\n%s:\n", o->section);
		section = o->section;
		snprintf(left, sizeof left, "%c%c%c --%s%s%s",
		    o->short_name ? '-' : ' ',
		    o->short_name ? o->short_name : ' ',
		    o->short_name ? ',' : ' ', o->name, o->arg ? " " : "",
		    o->arg ? o->arg : "");
		/* The help's first line beside the option, the others
		 * under it. */
		for (const char *l = o->help; *l != '\0';) {
			size_t n = strcspn(l, "\n");
			fprintf(f, "  %-24s %.*s\n", l == o->help ? left : "",
			    (int) n, l);
			l += n + (l[n] == '\n');
		}
		if (o->more != NULL)
			fputs(o->more, f);
	}
	fputs("\n"
	      "SIGINT or SIGTERM ends the run early, with the summary; a "
	      "second\n"
	      "one abandons in-flight requests. See docs/loadgen.md.\n",
	    f);
}

/* getopt_long's tables from `options`: a short form answers to its
 * letter, a long-only option to 256 + its row. */
static void
build_getopt(struct option *lo, char *shorts)
{
	for (size_t i = 0; i < NOPTIONS; i++) {
		const struct lg_option *o = &option_table[i];

		lo[i] = (struct option) { o->name,
			o->arg ? required_argument : no_argument, NULL,
			o->short_name ? o->short_name : 256 + (int) i };
		if (o->short_name) {
			*shorts++ = (char) o->short_name;
			if (o->arg)
				*shorts++ = ':';
		}
	}
	lo[NOPTIONS] = (struct option) { NULL, 0, NULL, 0 };
	*shorts = '\0';
}

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
	struct option lo[NOPTIONS + 1];
	char shorts[2 * NOPTIONS + 1];
	int ch;

	build_getopt(lo, shorts);
	lg.o.duration_s = 10;
	lg.o.verify_host = true;
	lg.o.timeout_ms = 5000;
	lg.o.drain_ms = 2000;
	while ((ch = getopt_long(argc, argv, shorts, lo, NULL)) != -1) {
		const struct lg_option *o = NULL;

		for (size_t i = 0; i < NOPTIONS && o == NULL; i++)
			if (ch == lo[i].val)
				o = &option_table[i];
		if (o == NULL) {
			usage(stderr);
			exit(1);
		}
		o->set(optarg);
	}
	if (optind < argc)
		lg_fatal(
		    "unexpected argument '%s' (see --help)", argv[optind]);
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
