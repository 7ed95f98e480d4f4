/* SPDX-License-Identifier: MIT */
/*
 * agent-probe: one liballot agent under load, as a process of its own,
 * for tests and benchmarks that place agents in other network namespaces
 * (tests/test_partition.c, bench/cluster.c). It uses the public API only
 * (include/allot/).
 *
 *   agent-probe --config FILE --seed URLS --replica ID --out FILE
 *               [--hot ID] [--calm ID] [--interval-ms T] [--replicas N]
 *
 * Load: an acquire on the hot caller every 2 ms (about 450/s: over its
 * share, so the allocation is contended) and on the calm caller every
 * 40 ms (well under its quota: it should never be denied).
 *
 * Log (--out), one sample every 10 ms, taken at the same instants in
 * every probe (multiples of 10 ms of CLOCK_MONOTONIC, which all
 * namespaces share), so that a reader can sum the allowances of several
 * probes slot by slot:
 *
 *   S <t_ms> <epoch> <connected> <leader_switches> <stale_epoch>
 *     <not_leader> <fallback_enters>
 *   K <t_ms> <caller> <allowance> <allowed> <denied> <in_fallback>
 *     <granted>
 *
 * t_ms is the slot's monotonic time in ms; allowance is the key's local
 * rate (tokens/s); granted the coordinator's last explicit allowance (0
 * before the first: the agent runs on its bootstrap share); allowed and denied
 * count since the start. The agent's own log lines go to stderr. SIGTERM or
 * SIGINT ends it: the last sample is written and the agent destroyed; exit 0,
 * or 2 on a usage error.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <allot/allot.h>

static volatile sig_atomic_t stop;
static atomic_bool load_stop;

typedef struct probe_key {
	const char *caller;
	allot_key *k;
	unsigned every; /* acquire on every n-th tick of 2 ms */
	_Atomic uint64_t allowed, denied;
} probe_key;

static allot_agent *agent;
static probe_key keys[2];
static int nkeys;

static void
on_signal(int sig)
{
	(void) sig;
	stop = 1;
}

static void
log_line(void *ctx, int level, const char *id, const char *msg)
{
	(void) ctx;
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	fprintf(stderr, "%" PRIu64 " %d %s %s\n",
	    (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000,
	    level, id, msg);
}

static void *
load_main(void *arg)
{
	(void) arg;
	struct timespec tick = { 0, 2 * 1000 * 1000 };
	for (uint64_t i = 0; !atomic_load(&load_stop); i++) {
		for (int k = 0; k < nkeys; k++) {
			if (i % keys[k].every != 0)
				continue;
			allot_decision d;
			allot_acquire(agent, keys[k].k, 1, &d);
			atomic_fetch_add(
			    d.allowed ? &keys[k].allowed : &keys[k].denied, 1);
		}
		nanosleep(&tick, NULL);
	}
	return NULL;
}

static void
sample(FILE *out, uint64_t t)
{
	allot_sync_stats ss;
	allot_sync_stats_get(agent, &ss);
	fprintf(out,
	    "S %" PRIu64 " %" PRIu64 " %d %" PRIu64 " %" PRIu64 " %" PRIu64
	    " %" PRIu64 "\n",
	    t, ss.leader_epoch, ss.connected ? 1 : 0, ss.leader_switches,
	    ss.stale_epoch, ss.not_leader, ss.fallback_enters);
	for (int k = 0; k < nkeys; k++) {
		allot_key_stats ks;
		allot_key_stats_get(agent, keys[k].k, &ks);
		fprintf(out,
		    "K %" PRIu64 " %s %.3f %" PRIu64 " %" PRIu64 " %d %.3f\n",
		    t, keys[k].caller, ks.rate, atomic_load(&keys[k].allowed),
		    atomic_load(&keys[k].denied), ks.in_fallback ? 1 : 0,
		    ks.granted_rate);
	}
}

static int
usage(const char *why)
{
	fprintf(stderr,
	    "agent-probe: %s\nusage: agent-probe --config FILE --seed URLS "
	    "--replica ID --out FILE [--hot ID] [--calm ID] "
	    "[--interval-ms T] [--replicas N]\n",
	    why);
	return 2;
}

int
main(int argc, char **argv)
{
	const char *config = NULL, *seed = NULL, *replica = NULL, *outp = NULL;
	const char *hot = "hot", *calm = "calm";
	unsigned interval = 100, replicas = 3;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (i + 1 >= argc)
			return usage("an option without its value");
		const char *v = argv[++i];
		if (strcmp(a, "--config") == 0)
			config = v;
		else if (strcmp(a, "--seed") == 0)
			seed = v;
		else if (strcmp(a, "--replica") == 0)
			replica = v;
		else if (strcmp(a, "--out") == 0)
			outp = v;
		else if (strcmp(a, "--hot") == 0)
			hot = v;
		else if (strcmp(a, "--calm") == 0)
			calm = v;
		else if (strcmp(a, "--interval-ms") == 0)
			interval = (unsigned) strtoul(v, NULL, 10);
		else if (strcmp(a, "--replicas") == 0)
			replicas = (unsigned) strtoul(v, NULL, 10);
		else
			return usage("unknown option");
	}
	if (config == NULL || seed == NULL || replica == NULL || outp == NULL)
		return usage("--config, --seed, --replica and --out are "
		             "required");
	FILE *out = fopen(outp, "w");
	if (out == NULL) {
		fprintf(
		    stderr, "agent-probe: %s: %s\n", outp, strerror(errno));
		return 1;
	}
	setvbuf(out, NULL, _IOLBF, 0); /* whole rows, even when killed */

	char err[512];
	allot_config *cfg;
	if (allot_config_load(config, err, sizeof err, &cfg) != ALLOT_OK) {
		fprintf(stderr, "agent-probe: %s\n", err);
		return 1;
	}
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.coordinator = seed;
	o.service = "svc";
	o.replica_id = replica;
	o.sync_interval_ms = interval;
	o.initial_replicas = replicas;
	o.reconnect_min_ms = 50;
	o.reconnect_max_ms = 500;
	o.log = log_line;
	o.log_level = 6;
	if (allot_agent_create(cfg, &o, &agent) != ALLOT_OK) {
		fprintf(stderr, "agent-probe: cannot create the agent\n");
		return 1;
	}
	allot_config_free(cfg);
	keys[0] = (probe_key) { .caller = hot, .every = 1 };
	keys[1] = (probe_key) { .caller = calm, .every = 20 };
	nkeys = 2;
	for (int k = 0; k < nkeys; k++)
		if (allot_key_resolve(
		        agent, keys[k].caller, "/x", &keys[k].k) != ALLOT_OK) {
			fprintf(stderr, "agent-probe: cannot resolve %s\n",
			    keys[k].caller);
			return 1;
		}

	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	pthread_t th;
	if (pthread_create(&th, NULL, load_main, NULL) != 0)
		return 1;

	/* Sample on 10 ms boundaries of the shared monotonic clock. */
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	uint64_t slot = ((uint64_t) now.tv_sec * 1000 +
	                    (uint64_t) now.tv_nsec / 1000000) /
	        10 +
	    1;
	while (!stop) {
		struct timespec at = { (time_t) (slot * 10 / 1000),
			(long) (slot * 10 % 1000) * 1000000L };
		int rc = clock_nanosleep(
		    CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL);
		if (rc == EINTR)
			continue;
		sample(out, slot * 10);
		/* A late wake-up skips the slots it missed rather than
		 * writing several at once with the same readings. */
		clock_gettime(CLOCK_MONOTONIC, &now);
		uint64_t cur = ((uint64_t) now.tv_sec * 1000 +
		                   (uint64_t) now.tv_nsec / 1000000) /
		    10;
		slot = cur + 1;
	}
	atomic_store(&load_stop, true);
	pthread_join(th, NULL);
	clock_gettime(CLOCK_MONOTONIC, &now);
	sample(out,
	    ((uint64_t) now.tv_sec * 1000 + (uint64_t) now.tv_nsec / 1000000) /
	        10 * 10);
	allot_agent_destroy(agent);
	fclose(out);
	return 0;
}
