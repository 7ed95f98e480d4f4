/* SPDX-License-Identifier: MIT */
/*
 * Suite `hotpath`: what one allow/deny decision costs. In one run and
 * side by side it times liballot's allot_acquire() through a resolved key
 * and allot_acquire_id() through identity+endpoint lookup (one thread and
 * two and four, one key and 10,000, allow path and deny path, and while
 * another thread installs a new config every millisecond), the floor
 * (a bare token bucket, floor.h) and the usual alternative (a central
 * Redis token bucket, redis.h). Every measurement runs once per round, rounds
 * are interleaved, and the median over rounds is reported. Each loop counts
 * its admissions and the run fails loudly if an allow-path loop saw a
 * denial or a deny-path loop an admission, so a figure always measures
 * the path it names. docs/benchmarks.md explains every figure.
 */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <allot/allot.h>

#include "bench.h"
#include "floor.h"
#include "redis.h"

#define ID_CHECKOUT "spiffe://prod.example.internal/ns/payments/sa/checkout"
#define ID_SEARCH "spiffe://prod.example.internal/ns/search/sa/search"
#define ID_UNKNOWN "spiffe://prod.example.internal/ns/growth/sa/experiment"
#define ENDPOINT "/lookup"

/* Allow-path quotas can never run dry: the loader's maxima (1e9 tokens/s
 * and 1e9 tokens) against at most a few million decisions per second.
 * Deny-path quotas hold one token, spent before measuring, and refill one
 * token every 1000 s: the suite runs for under a minute. */
#define ALLOW_RATE "1000000000"
#define ALLOW_BURST "1000000000"
#define DENY_RATE "0.001"
#define DENY_BURST "1"

#define NCALLERS_10K 10000u
#define ORDER_LEN 65536u /* random access pattern, cycled */
#define STREAM_REC 64u /* a request of lookup_10k_stream: its identity */
#define REDIS_CALLS_DEFAULT 20000u /* EVALSHA round trips, all rounds */
#define REDIS_KEY "allot-bench:checkout"

typedef enum job_kind {
	JOB_CLOCK, /* clock_gettime(CLOCK_MONOTONIC) alone */
	JOB_FLOOR, /* floor_acquire() */
	JOB_RESOLVED, /* allot_acquire() on one key */
	JOB_RESOLVED_MANY, /* allot_acquire() on keys[order[i]] */
	JOB_LOOKUP, /* allot_acquire_id() for one identity */
	JOB_LOOKUP_MANY, /* allot_acquire_id() for ids[order[i]] */
	JOB_LOOKUP_STREAM, /* allot_acquire_id() for stream[i] */
} job_kind;

typedef enum expect {
	EXPECT_ANY,
	EXPECT_ALLOW,
	EXPECT_DENY,
} expect;

/* One timed batch of `n` decisions, run by one thread. */
typedef struct job {
	const char *name;
	job_kind kind;
	expect expect;
	floor_bucket *floor;
	allot_agent *agent;
	allot_key *key;
	allot_key *const *keys;
	const char *identity;
	const char *const *ids;
	const char (*stream)[STREAM_REC];
	const uint32_t *order;
	uint64_t n;
	/* Results. */
	uint64_t allowed;
	uint64_t errors;
	int last_err;
	uint64_t t0, t1;
} job;

static void
run_job(job *j)
{
	const uint64_t n = j->n;
	uint64_t allowed = 0, errors = 0;
	int last_err = ALLOT_OK;
	allot_decision d;
	int rc;

#define TALLY()                               \
	do {                                  \
		if (rc != ALLOT_OK) {         \
			errors++;             \
			last_err = rc;        \
		} else {                      \
			allowed += d.allowed; \
		}                             \
	} while (0)

	j->t0 = bench_now_ns();
	switch (j->kind) {
	case JOB_CLOCK: {
		uint64_t acc = 0;
		for (uint64_t i = 0; i < n; i++) {
			struct timespec ts;
			clock_gettime(CLOCK_MONOTONIC, &ts);
			acc += (uint64_t) ts.tv_nsec;
		}
		bench_sink += acc;
		break;
	}
	case JOB_FLOOR:
		for (uint64_t i = 0; i < n; i++)
			allowed += floor_acquire(j->floor, 1);
		break;
	case JOB_RESOLVED:
		for (uint64_t i = 0; i < n; i++) {
			rc = allot_acquire(
			    j->agent, j->key, ALLOT_COST_DEFAULT, &d);
			TALLY();
		}
		break;
	case JOB_RESOLVED_MANY:
		for (uint64_t i = 0; i < n; i++) {
			rc = allot_acquire(j->agent,
			    j->keys[j->order[i & (ORDER_LEN - 1)]],
			    ALLOT_COST_DEFAULT, &d);
			TALLY();
		}
		break;
	case JOB_LOOKUP:
		for (uint64_t i = 0; i < n; i++) {
			rc = allot_acquire_id(j->agent, j->identity, ENDPOINT,
			    ALLOT_COST_DEFAULT, &d);
			TALLY();
		}
		break;
	case JOB_LOOKUP_MANY:
		for (uint64_t i = 0; i < n; i++) {
			rc = allot_acquire_id(j->agent,
			    j->ids[j->order[i & (ORDER_LEN - 1)]], ENDPOINT,
			    ALLOT_COST_DEFAULT, &d);
			TALLY();
		}
		break;
	case JOB_LOOKUP_STREAM:
		for (uint64_t i = 0; i < n; i++) {
			rc = allot_acquire_id(j->agent,
			    j->stream[i & (ORDER_LEN - 1)], ENDPOINT,
			    ALLOT_COST_DEFAULT, &d);
			TALLY();
		}
		break;
	}
	j->t1 = bench_now_ns();
#undef TALLY
	j->allowed = allowed;
	j->errors = errors;
	j->last_err = last_err;
	bench_sink += allowed;
}

/* Fail the run if the batch did not take the path it is named after. */
static void
check(const job *j)
{
	if (j->errors != 0)
		bench_fail("%s: %" PRIu64 " of %" PRIu64 " calls returned "
		           "an error (%s)",
		    j->name, j->errors, j->n, allot_strerror(j->last_err));
	if (j->expect == EXPECT_ALLOW && j->allowed != j->n)
		bench_fail("%s: meant to measure the allow path, but %" PRIu64
		           " of %" PRIu64
		           " decisions were denials (the quota is "
		           "%s tokens/s, burst %s, and must never run dry)",
		    j->name, j->n - j->allowed, j->n, ALLOW_RATE, ALLOW_BURST);
	if (j->expect == EXPECT_DENY && j->allowed != 0)
		bench_fail(
		    "%s: meant to measure the deny path, but %" PRIu64
		    " of %" PRIu64 " decisions were admissions (the quota "
		    "is %s tokens/s, burst %s, emptied before measuring)",
		    j->name, j->allowed, j->n, DENY_RATE, DENY_BURST);
}

/* The options, for --only. */
static const bench_opts *opts;

/* ns per decision of one thread; NaN when not selected by --only. */
static double
measure1(job *j, uint64_t n)
{
	if (!bench_selected(opts, j->name))
		return NAN;
	j->n = n;
	run_job(j);
	check(j);
	return (double) (j->t1 - j->t0) / (double) n;
}

typedef struct thread_start {
	pthread_barrier_t *barrier;
	job *job;
} thread_start;

static void *
thread_main(void *arg)
{
	thread_start *t = arg;
	pthread_barrier_wait(t->barrier);
	run_job(t->job);
	return NULL;
}

typedef struct result2 {
	double per_thread_ns; /* mean over the threads of ns per decision */
	double wall_ns; /* first start to last finish */
} result2;

#define MAX_THREADS 4

/* `nt` threads released together by a barrier, `n` decisions each. */
static result2
measure_n(job *const *jobs, int nt, uint64_t n)
{
	pthread_barrier_t bar;
	pthread_t th[MAX_THREADS];
	thread_start ts[MAX_THREADS];

	if (!bench_selected(opts, jobs[0]->name))
		return (result2) { NAN, NAN };
	if (pthread_barrier_init(&bar, NULL, (unsigned) nt) != 0)
		bench_fail("pthread_barrier_init failed");
	for (int i = 0; i < nt; i++) {
		jobs[i]->n = n;
		ts[i] = (thread_start) { &bar, jobs[i] };
		if (pthread_create(&th[i], NULL, thread_main, &ts[i]) != 0)
			bench_fail("pthread_create failed");
	}
	for (int i = 0; i < nt; i++)
		pthread_join(th[i], NULL);
	pthread_barrier_destroy(&bar);
	uint64_t start = UINT64_MAX, end = 0;
	double sum = 0;
	for (int i = 0; i < nt; i++) {
		check(jobs[i]);
		start = jobs[i]->t0 < start ? jobs[i]->t0 : start;
		end = jobs[i]->t1 > end ? jobs[i]->t1 : end;
		sum += (double) (jobs[i]->t1 - jobs[i]->t0);
	}
	return (result2) {
		.per_thread_ns = sum / ((double) nt * (double) n),
		.wall_ns = (double) (end - start),
	};
}

/* Two threads released together by a barrier, `n` decisions each. */
static result2
measure2(job *a, job *b, uint64_t n)
{
	job *jobs[2] = { a, b };
	return measure_n(jobs, 2, n);
}

/* `nt` threads all running copies of `proto`. */
static result2
measure_same(const job *proto, int nt, uint64_t n)
{
	job j[MAX_THREADS], *jobs[MAX_THREADS];
	for (int i = 0; i < nt; i++) {
		j[i] = *proto;
		jobs[i] = &j[i];
	}
	return measure_n(jobs, nt, n);
}

/* ------------------------------------------------------------------ */
/* Configs and agents                                                  */
/* ------------------------------------------------------------------ */

static void
yaml_head(bench_buf *b, const char *def_rate, const char *def_burst)
{
	bench_buf_printf(b,
	    "quotas:\n"
	    "  default:\n"
	    "    tokens_per_second: %s\n"
	    "    burst: %s\n"
	    "    shared: true\n"
	    "    priority: low\n"
	    "  callers:\n",
	    def_rate, def_burst);
}

static void
yaml_caller(bench_buf *b, const char *identity, const char *rate,
    const char *burst, const char *priority)
{
	bench_buf_printf(b,
	    "    - identity: \"%s\"\n"
	    "      tokens_per_second: %s\n"
	    "      burst: %s\n"
	    "      priority: %s\n",
	    identity, rate, burst, priority);
}

static void
yaml_tail(bench_buf *b)
{
	bench_buf_printf(b,
	    "  endpoint_weights:\n"
	    "    default: 1\n"
	    "    \"" ENDPOINT "\": 1\n");
}

static allot_agent *
make_agent(const char *name, bench_buf *yaml)
{
	char err[512];
	allot_config *cfg;
	allot_agent *agent;
	int rc = allot_config_parse(
	    name, yaml->p, yaml->len, err, sizeof err, &cfg);
	if (rc != ALLOT_OK)
		bench_fail("config %s: %s: %s", name, allot_strerror(rc), err);
	rc = allot_agent_create(cfg, NULL, &agent);
	allot_config_free(cfg);
	if (rc != ALLOT_OK)
		bench_fail("agent for %s: %s", name, allot_strerror(rc));
	bench_buf_free(yaml);
	return agent;
}

static allot_key *
resolve(allot_agent *agent, const char *identity)
{
	allot_key *key;
	int rc = allot_key_resolve(agent, identity, ENDPOINT, &key);
	if (rc != ALLOT_OK)
		bench_fail(
		    "allot_key_resolve(%s): %s", identity, allot_strerror(rc));
	return key;
}

/* Spend the deny quota's only token and prove the next call is denied. */
static void
exhaust(allot_agent *agent, allot_key *key)
{
	allot_decision d;
	int rc = allot_acquire(agent, key, ALLOT_COST_DEFAULT, &d);
	if (rc != ALLOT_OK || !d.allowed)
		bench_fail("deny setup: the first acquire on a full bucket of "
		           "burst %s was not admitted (%s)",
		    DENY_BURST, allot_strerror(rc));
	rc = allot_acquire(agent, key, ALLOT_COST_DEFAULT, &d);
	if (rc != ALLOT_OK || d.allowed)
		bench_fail("deny setup: the bucket is not empty after %s "
		           "token(s)",
		    DENY_BURST);
}

/* ------------------------------------------------------------------ */
/* Figures                                                             */
/* ------------------------------------------------------------------ */

enum fig {
	F_CLOCK,
	F_FLOOR,
	F_FLOOR_DENY,
	F_FLOOR_SCALE,
	F_RESOLVED,
	F_RESOLVED_DENY,
	F_RESOLVED_10K,
	F_RESOLVED_SWAPPING,
	F_RESOLVED_STACK3,
	F_RESOLVED_CEILING,
	F_RESOLVED_2T_SAME,
	F_RESOLVED_2T_DISTINCT,
	F_SCALE,
	F_DENY_2T_SAME,
	F_FLOOR_2T_SAME,
	F_FLOOR_4T_SAME,
	F_RESOLVED_4T_SAME,
	F_DENY_4T_SAME,
	F_LOOKUP,
	F_LOOKUP_DENY,
	F_LOOKUP_UNKNOWN,
	F_LOOKUP_10K,
	F_LOOKUP_10K_STREAM,
	F_LOOKUP_2T_DISTINCT,
	F_LOOKUP_SCALE,
	F_REDIS,
	F_RATIO_RESOLVED_FLOOR,
	F_RATIO_LOOKUP_FLOOR,
	F_RATIO_REDIS_RESOLVED,
	F_RATIO_10K_FLOOR,
	F_RATIO_LOOKUP10K_RESOLVED10K,
	F_RATIO_2T_SAME_FLOOR,
	F_RATIO_4T_SAME_FLOOR,
	F_RATIO_DENY_FLOOR,
	F_RATIO_SWAPPING_FLOOR,
	F_RATIO_STACK3_RESOLVED,
	F_SETUP_10K,
	F_NOISE,
	NFIG
};

static bench_figure figs[NFIG] = {
	[F_CLOCK] = { "hotpath.clock_ns", "ns", 1,
	    "one clock_gettime(CLOCK_MONOTONIC)" },
	[F_FLOOR] = { "hotpath.floor_ns", "ns", 1,
	    "floor: bare bucket, clock_gettime + one CAS, allow" },
	[F_FLOOR_DENY] = { "hotpath.floor_deny_ns", "ns", 1,
	    "floor, deny path (clock + load, no write)" },
	[F_FLOOR_SCALE] = { "hotpath.floor_scale_2t_distinct", "x", 2,
	    "floor, 2 threads on 2 buckets / 1 thread (machine's ceiling)" },
	[F_RESOLVED] = { "hotpath.resolved_ns", "ns", 1,
	    "allot_acquire, resolved key, 1 thread, allow" },
	[F_RESOLVED_DENY] = { "hotpath.resolved_deny_ns", "ns", 1,
	    "allot_acquire, resolved key, 1 thread, deny" },
	[F_RESOLVED_10K] = { "hotpath.resolved_10k_ns", "ns", 1,
	    "allot_acquire, 10,000 resolved keys in random order" },
	[F_RESOLVED_2T_SAME] = { "hotpath.resolved_2t_same_key_ns", "ns", 1,
	    "allot_acquire, 2 threads, same key, allow (per thread)" },
	[F_RESOLVED_2T_DISTINCT] = { "hotpath.resolved_2t_distinct_ns", "ns",
	    1, "allot_acquire, 2 threads, distinct keys (per thread)" },
	[F_SCALE] = { "hotpath.scale_2t_distinct", "x", 2,
	    "throughput 2 threads distinct keys / 1 thread", BENCH_AT_LEAST,
	    1.7 },
	[F_DENY_2T_SAME] = { "hotpath.deny_2t_same_key_ns", "ns", 1,
	    "allot_acquire, 2 threads, one empty key, deny (per thread)" },
	[F_FLOOR_2T_SAME] = { "hotpath.floor_2t_same_key_ns", "ns", 1,
	    "floor, 2 threads, one bucket, allow (per thread)" },
	[F_FLOOR_4T_SAME] = { "hotpath.floor_4t_same_key_ns", "ns", 1,
	    "floor, 4 threads on 2 cores, one bucket (per thread)" },
	[F_RESOLVED_4T_SAME] = { "hotpath.resolved_4t_same_key_ns", "ns", 1,
	    "allot_acquire, 4 threads on 2 cores, same key (per thread)" },
	[F_DENY_4T_SAME] = { "hotpath.deny_4t_same_key_ns", "ns", 1,
	    "allot_acquire, 4 threads, one empty key, deny (per thread)" },
	[F_LOOKUP] = { "hotpath.lookup_ns", "ns", 1,
	    "allot_acquire_id, 1 caller configured, allow" },
	[F_LOOKUP_DENY] = { "hotpath.lookup_deny_ns", "ns", 1,
	    "allot_acquire_id, 1 caller configured, deny" },
	[F_LOOKUP_UNKNOWN] = { "hotpath.lookup_unknown_ns", "ns", 1,
	    "allot_acquire_id, unknown identity -> default bucket" },
	[F_LOOKUP_10K] = { "hotpath.lookup_10k_ns", "ns", 1,
	    "allot_acquire_id, 10,000 callers in random order" },
	[F_LOOKUP_10K_STREAM] = { "hotpath.lookup_10k_stream_ns", "ns", 1,
	    "lookup_10k with each identity read from a request stream "
	    "(in arrival order), not from 10,000 scattered strings" },
	[F_LOOKUP_2T_DISTINCT] = { "hotpath.lookup_2t_distinct_ns", "ns", 1,
	    "allot_acquire_id, 2 threads, distinct callers (per thread)" },
	[F_LOOKUP_SCALE] = { "hotpath.lookup_scale_2t_distinct", "x", 2,
	    "lookup throughput 2 threads distinct / 1 thread" },
	[F_REDIS] = { "hotpath.redis_ns", "ns", 0,
	    "Redis+Lua bucket, EVALSHA round trip on loopback" },
	[F_RATIO_RESOLVED_FLOOR] = { "hotpath.ratio_resolved_floor", "x", 3,
	    "resolved_ns / floor_ns", BENCH_AT_MOST, 1.0 },
	[F_RATIO_LOOKUP_FLOOR] = { "hotpath.ratio_lookup_floor", "x", 3,
	    "lookup_ns / floor_ns", BENCH_AT_MOST, 2.0 },
	[F_RATIO_REDIS_RESOLVED] = { "hotpath.ratio_redis_resolved", "x", 0,
	    "redis_ns / resolved_ns", BENCH_AT_LEAST, 1000 },
	[F_RATIO_10K_FLOOR] = { "hotpath.ratio_resolved_10k_floor", "x", 3,
	    "resolved_10k_ns / floor_ns", BENCH_AT_MOST, 2.0 },
	[F_RATIO_LOOKUP10K_RESOLVED10K] = { "hotpath.ratio_lookup_10k_"
	                                    "resolved_10k",
	    "x", 3, "lookup_10k_ns / resolved_10k_ns", BENCH_AT_MOST, 1.5 },
	[F_RATIO_2T_SAME_FLOOR] = { "hotpath.ratio_2t_same_key_floor", "x", 3,
	    "resolved_2t_same_key_ns / floor_ns", BENCH_AT_MOST, 1.5 },
	[F_RATIO_4T_SAME_FLOOR] = { "hotpath.ratio_4t_same_key_floor", "x", 3,
	    "resolved_4t_same_key_ns / floor_4t_same_key_ns (both "
	    "oversubscribed)" },
	[F_RATIO_DENY_FLOOR] = { "hotpath.ratio_deny_floor", "x", 3,
	    "resolved_deny_ns / floor_deny_ns", BENCH_AT_MOST, 1.0 },
	[F_SETUP_10K] = { "hotpath.setup_10k_ms", "ms", 1,
	    "parse 10,000-caller YAML + create agent + resolve keys" },
	[F_RESOLVED_SWAPPING] = { "hotpath.resolved_swapping_ns", "ns", 1,
	    "resolved, allow, while another thread installs a config every "
	    "ms (rate and weight alternate)" },
	[F_RATIO_SWAPPING_FLOOR] = { "hotpath.ratio_swapping_floor", "x", 3,
	    "resolved_swapping_ns / floor_ns", BENCH_AT_MOST, 1.1 },
	[F_RESOLVED_STACK3] = { "hotpath.resolved_stacked3_ns", "ns", 1,
	    "allot_acquire, resolved key charging three stacked limits "
	    "(its endpoint's, its caller's, every caller's), allow" },
	[F_RESOLVED_CEILING] = { "hotpath.resolved_ceiling_ns", "ns", 1,
	    "allot_acquire, resolved key of a quota a global ceiling cuts "
	    "(local only: the ceiling's level stacked, not in use), allow" },
	[F_RATIO_STACK3_RESOLVED] = { "hotpath.ratio_stacked3_resolved", "x",
	    3, "resolved_stacked3_ns / resolved_ns", BENCH_AT_MOST, 3.0 },
	[F_NOISE] = { "hotpath.noise_cpu_pct", "%", 1,
	    "CPU used by other processes during the run (% of machine)" },
};

static double samples[NFIG][BENCH_MAX_ROUNDS];

/* The world the jobs run in. */
typedef struct world {
	allot_agent *one; /* 1 caller (checkout), allow; default allow */
	allot_agent *deny; /* 1 caller (checkout), empty, deny */
	allot_agent *two; /* 2 callers (checkout, search), allow */
	allot_agent *tenk; /* 10,000 callers, allow */
	allot_agent *swap; /* 1 caller, allow, reconfigured every ms */
	allot_agent *stack; /* 1 caller, 3 stacked levels, allow */
	allot_key *k_stack;
	allot_agent *ceil; /* checkout and search under a ceiling */
	allot_key *k_ceil;
	allot_config *swap_cfg[2]; /* its two configs */
	allot_key *k_swap;
	allot_key *k_one, *k_deny, *k_two_a, *k_two_b;
	allot_key **keys10k;
	char **ids10k;
	char (*stream)[STREAM_REC]; /* ids10k[order[i]], one per line */
	uint32_t *order;
	floor_bucket f_allow, f_allow2, f_deny;
	bench_redis redis;
	bool redis_up;
} world;

static void
setup(world *w, const bench_opts *o)
{
	bench_buf y = { 0 };

	yaml_head(&y, ALLOW_RATE, ALLOW_BURST);
	yaml_caller(&y, ID_CHECKOUT, ALLOW_RATE, ALLOW_BURST, "critical");
	yaml_tail(&y);
	w->one = make_agent("bench-one.yaml", &y);

	yaml_head(&y, "10", "20");
	yaml_caller(&y, ID_CHECKOUT, DENY_RATE, DENY_BURST, "critical");
	yaml_tail(&y);
	w->deny = make_agent("bench-deny.yaml", &y);

	yaml_head(&y, "10", "20");
	yaml_caller(&y, ID_CHECKOUT, ALLOW_RATE, ALLOW_BURST, "critical");
	yaml_caller(&y, ID_SEARCH, ALLOW_RATE, ALLOW_BURST, "standard");
	yaml_tail(&y);
	w->two = make_agent("bench-two.yaml", &y);

	/* Two configs that differ in the caller's rate and the endpoint's
	 * weight, both allow-path. */
	for (int i = 0; i < 2; i++) {
		char err[512];
		yaml_head(&y, "10", "20");
		yaml_caller(&y, ID_CHECKOUT, i == 0 ? ALLOW_RATE : "500000000",
		    ALLOW_BURST, "critical");
		bench_buf_printf(&y,
		    "  endpoint_weights:\n"
		    "    default: 1\n"
		    "    \"" ENDPOINT "\": %d\n",
		    i + 1);
		if (allot_config_parse("bench-swap.yaml", y.p, y.len, err,
		        sizeof err, &w->swap_cfg[i]) != ALLOT_OK)
			bench_fail("config bench-swap.yaml: %s", err);
		bench_buf_free(&y);
	}
	if (allot_agent_create(w->swap_cfg[0], NULL, &w->swap) != ALLOT_OK)
		bench_fail("agent for bench-swap.yaml");
	w->k_swap = resolve(w->swap, ID_CHECKOUT);

	/* Stacked limits: the caller's endpoint quota on top of its own,
	 * and every caller's on top of both. */
	yaml_head(&y, "10", "20");
	yaml_caller(&y, ID_CHECKOUT, ALLOW_RATE, ALLOW_BURST, "critical");
	bench_buf_printf(&y,
	    "      endpoints:\n"
	    "        \"" ENDPOINT "\": {tokens_per_second: " ALLOW_RATE
	    ", burst: " ALLOW_BURST ", stacked: true}\n");
	yaml_caller(&y, "*", ALLOW_RATE, ALLOW_BURST, "critical");
	yaml_tail(&y);
	w->stack = make_agent("bench-stack.yaml", &y);
	w->k_stack = resolve(w->stack, ID_CHECKOUT);

	/* A global ceiling the callers' quotas sum above (its level,
	 * agent/ceiling.c, is stacked on their keys). */
	yaml_head(&y, "10", "20");
	yaml_caller(&y, ID_CHECKOUT, ALLOW_RATE, ALLOW_BURST, "critical");
	yaml_caller(&y, ID_SEARCH, ALLOW_RATE, ALLOW_BURST, "standard");
	yaml_tail(&y);
	bench_buf_printf(&y,
	    "  global_ceiling: {tokens_per_second: " ALLOW_RATE
	    ", overcommit: true}\n");
	w->ceil = make_agent("bench-ceiling.yaml", &y);
	w->k_ceil = resolve(w->ceil, ID_CHECKOUT);

	w->k_one = resolve(w->one, ID_CHECKOUT);
	w->k_deny = resolve(w->deny, ID_CHECKOUT);
	w->k_two_a = resolve(w->two, ID_CHECKOUT);
	w->k_two_b = resolve(w->two, ID_SEARCH);
	exhaust(w->deny, w->k_deny);

	/* 10,000 callers: 1,000 namespaces of 10 service accounts. */
	static const char *prio[] = { "low", "batch", "standard", "critical" };
	w->ids10k = calloc(NCALLERS_10K, sizeof *w->ids10k);
	w->keys10k = calloc(NCALLERS_10K, sizeof *w->keys10k);
	w->order = calloc(ORDER_LEN, sizeof *w->order);
	if (w->ids10k == NULL || w->keys10k == NULL || w->order == NULL)
		bench_fail("out of memory");
	for (uint32_t i = 0; i < NCALLERS_10K; i++) {
		char id[128];
		snprintf(id, sizeof id,
		    "spiffe://prod.example.internal/ns/"
		    "team-%04u/sa/workload-%05u",
		    i / 10, i);
		if ((w->ids10k[i] = strdup(id)) == NULL)
			bench_fail("out of memory");
	}
	yaml_head(&y, "10", "20");
	for (uint32_t i = 0; i < NCALLERS_10K; i++)
		yaml_caller(
		    &y, w->ids10k[i], ALLOW_RATE, ALLOW_BURST, prio[i % 4]);
	yaml_tail(&y);
	uint64_t t0 = bench_now_ns();
	w->tenk = make_agent("bench-10k.yaml", &y);
	for (uint32_t i = 0; i < NCALLERS_10K; i++)
		w->keys10k[i] = resolve(w->tenk, w->ids10k[i]);
	figs[F_SETUP_10K].value = (double) (bench_now_ns() - t0) / 1e6;
	bench_progress(o,
	    "10,000-caller config parsed, agent created and "
	    "keys resolved in %.1f ms",
	    figs[F_SETUP_10K].value);

	bench_rng rng;
	bench_rng_seed(&rng, 20240601);
	for (uint32_t i = 0; i < ORDER_LEN; i++)
		w->order[i] = bench_rng_below(&rng, NCALLERS_10K);
	/* The same identities in the same order, as a server reads them
	 * out of the requests it receives: one after the other, each
	 * within its request (here a line of its own). */
	w->stream = aligned_alloc(64, (size_t) ORDER_LEN * STREAM_REC);
	if (w->stream == NULL)
		bench_fail("out of memory");
	for (uint32_t i = 0; i < ORDER_LEN; i++) {
		const char *id = w->ids10k[w->order[i]];
		if (strlen(id) >= STREAM_REC)
			bench_fail("identity longer than a stream record");
		memset(w->stream[i], 0, STREAM_REC);
		memcpy(w->stream[i], id, strlen(id));
	}

	floor_init(&w->f_allow, 1e9, 1e9);
	floor_init(&w->f_allow2, 1e9, 1e9);
	floor_init(&w->f_deny, 0.001, 1);
	if (!floor_acquire(&w->f_deny, 1) || floor_acquire(&w->f_deny, 1))
		bench_fail("floor deny setup: bucket of burst 1 misbehaves");

	char err[1024];
	if (!bench_selected(o, "redis"))
		return;
	if (!bench_redis_start(&w->redis, err, sizeof err))
		bench_fail("redis: %s", err);
	w->redis_up = true;
	bench_progress(o, "redis-server pid %d on 127.0.0.1:%d, script %s",
	    (int) w->redis.pid, w->redis.port, w->redis.sha);
}

static void
teardown(world *w)
{
	if (w->redis_up)
		bench_redis_stop(&w->redis);
	allot_key_release(w->one, w->k_one);
	allot_key_release(w->deny, w->k_deny);
	allot_key_release(w->two, w->k_two_a);
	allot_key_release(w->two, w->k_two_b);
	for (uint32_t i = 0; i < NCALLERS_10K; i++) {
		allot_key_release(w->tenk, w->keys10k[i]);
		free(w->ids10k[i]);
	}
	free(w->keys10k);
	free(w->ids10k);
	free(w->stream);
	free(w->order);
	allot_agent_destroy(w->one);
	allot_agent_destroy(w->deny);
	allot_agent_destroy(w->two);
	allot_agent_destroy(w->tenk);
	allot_key_release(w->swap, w->k_swap);
	allot_agent_destroy(w->swap);
	allot_key_release(w->stack, w->k_stack);
	allot_agent_destroy(w->stack);
	allot_key_release(w->ceil, w->k_ceil);
	allot_agent_destroy(w->ceil);
	allot_config_free(w->swap_cfg[0]);
	allot_config_free(w->swap_cfg[1]);
}

/* ns per EVALSHA round trip over `calls` sequential decisions. */
static double
measure_redis(world *w, uint64_t calls)
{
	char err[512];
	uint64_t allowed = 0;
	if (!w->redis_up)
		return NAN;
	uint64_t t0 = bench_now_ns();
	for (uint64_t i = 0; i < calls; i++) {
		int rc = bench_redis_acquire(&w->redis, REDIS_KEY, ALLOW_BURST,
		    ALLOW_RATE, "1", err, sizeof err);
		if (rc < 0)
			bench_fail("redis: %s", err);
		allowed += (uint64_t) rc;
	}
	uint64_t t1 = bench_now_ns();
	if (allowed != calls)
		bench_fail("redis: meant to measure the allow path, but "
		           "%" PRIu64 " of %" PRIu64 " decisions were denials",
		    calls - allowed, calls);
	return (double) (t1 - t0) / (double) calls;
}

static job
floor_job(const char *name, floor_bucket *fb, expect e)
{
	return (
	    job) { .name = name, .kind = JOB_FLOOR, .expect = e, .floor = fb };
}

static job
key_job(const char *name, allot_agent *agent, allot_key *key, expect e)
{
	return (job) { .name = name,
		.kind = JOB_RESOLVED,
		.expect = e,
		.agent = agent,
		.key = key };
}

static job
id_job(const char *name, allot_agent *agent, const char *identity, expect e)
{
	return (job) { .name = name,
		.kind = JOB_LOOKUP,
		.expect = e,
		.agent = agent,
		.identity = identity };
}

/* The other thread of resolved_swapping: a new config every ms. */
typedef struct swapper {
	world *w;
	_Atomic bool stop;
	_Atomic int started; /* its first config is in */
	uint64_t swaps;
	int last_err;
} swapper;

static void *
swapper_main(void *arg)
{
	swapper *s = arg;
	struct timespec ms = { 0, 1000000 };
	while (!atomic_load_explicit(&s->stop, memory_order_relaxed)) {
		if (s->swaps > 0)
			nanosleep(&ms, NULL);
		int rc = allot_agent_set_config(
		    s->w->swap, s->w->swap_cfg[(s->swaps + 1) % 2]);
		if (rc != ALLOT_OK)
			s->last_err = rc;
		s->swaps++;
		atomic_store_explicit(&s->started, 1, memory_order_release);
	}
	return NULL;
}

/* Resolved acquires while configs are installed: ns per decision. */
static double
measure_swapping(world *w, uint64_t n)
{
	if (!bench_selected(opts, "resolved_swapping"))
		return NAN;
	swapper s = { .w = w };
	pthread_t th;
	if (pthread_create(&th, NULL, swapper_main, &s) != 0)
		bench_fail("pthread_create failed");
	/* Measure once the swapper runs: on a loaded machine its first
	 * wake-up could otherwise come after the loop. */
	while (atomic_load_explicit(&s.started, memory_order_acquire) == 0)
		sched_yield();
	job j = key_job("resolved_swapping", w->swap, w->k_swap, EXPECT_ALLOW);
	double ns = measure1(&j, n);
	atomic_store(&s.stop, true);
	pthread_join(th, NULL);
	if (s.last_err != ALLOT_OK)
		bench_fail("resolved_swapping: allot_agent_set_config: %s",
		    allot_strerror(s.last_err));
	bench_progress(
	    opts, "resolved_swapping: %" PRIu64 " configs installed", s.swaps);
	return ns;
}

/* One round: every measurement once, in a fixed order. */
static void
round_once(world *w, uint64_t n, uint64_t redis_calls, unsigned r)
{
	job j, a, b;
	result2 r2;
	double base;

	j = (job) { .name = "clock", .kind = JOB_CLOCK };
	samples[F_CLOCK][r] = measure1(&j, n);

	/* The floor, and the machine's own two-thread ceiling. */
	j = floor_job("floor", &w->f_allow, EXPECT_ALLOW);
	samples[F_FLOOR][r] = base = measure1(&j, n);
	j = floor_job("floor_deny", &w->f_deny, EXPECT_DENY);
	samples[F_FLOOR_DENY][r] = measure1(&j, n);
	a = floor_job("floor_scale_2t_distinct", &w->f_allow, EXPECT_ALLOW);
	b = floor_job("floor_scale_2t_distinct", &w->f_allow2, EXPECT_ALLOW);
	r2 = measure2(&a, &b, n);
	samples[F_FLOOR_SCALE][r] = 2.0 * base * (double) n / r2.wall_ns;

	/* Resolved keys, one thread. */
	j = key_job("resolved", w->one, w->k_one, EXPECT_ALLOW);
	samples[F_RESOLVED][r] = measure1(&j, n);
	j = key_job("resolved_deny", w->deny, w->k_deny, EXPECT_DENY);
	samples[F_RESOLVED_DENY][r] = measure1(&j, n);
	j = key_job("resolved_10k", w->tenk, NULL, EXPECT_ALLOW);
	j.kind = JOB_RESOLVED_MANY;
	j.keys = w->keys10k;
	j.order = w->order;
	samples[F_RESOLVED_10K][r] = measure1(&j, n);
	samples[F_RESOLVED_SWAPPING][r] = measure_swapping(w, n);
	j = key_job("resolved_stacked3", w->stack, w->k_stack, EXPECT_ALLOW);
	samples[F_RESOLVED_STACK3][r] = measure1(&j, n);
	j = key_job("resolved_ceiling", w->ceil, w->k_ceil, EXPECT_ALLOW);
	samples[F_RESOLVED_CEILING][r] = measure1(&j, n);

	/* Identity + endpoint lookup, one thread. */
	j = id_job("lookup", w->one, ID_CHECKOUT, EXPECT_ALLOW);
	samples[F_LOOKUP][r] = measure1(&j, n);
	j = id_job("lookup_deny", w->deny, ID_CHECKOUT, EXPECT_DENY);
	samples[F_LOOKUP_DENY][r] = measure1(&j, n);
	j = id_job("lookup_unknown", w->one, ID_UNKNOWN, EXPECT_ALLOW);
	samples[F_LOOKUP_UNKNOWN][r] = measure1(&j, n);
	j = id_job("lookup_10k", w->tenk, NULL, EXPECT_ALLOW);
	j.kind = JOB_LOOKUP_MANY;
	j.ids = (const char *const *) w->ids10k;
	j.order = w->order;
	samples[F_LOOKUP_10K][r] = measure1(&j, n);
	j.kind = JOB_LOOKUP_STREAM;
	j.name = "lookup_10k_stream";
	j.stream = (const char(*)[STREAM_REC]) w->stream;
	samples[F_LOOKUP_10K_STREAM][r] = measure1(&j, n);

	/* Scaling on distinct keys: each pair is preceded by its
	 * single-thread baseline on the same agent and key. */
	const char *sc = "scale_2t_distinct";
	j = key_job(sc, w->two, w->k_two_a, EXPECT_ALLOW);
	base = measure1(&j, n);
	a = key_job(sc, w->two, w->k_two_a, EXPECT_ALLOW);
	b = key_job(sc, w->two, w->k_two_b, EXPECT_ALLOW);
	r2 = measure2(&a, &b, n);
	samples[F_RESOLVED_2T_DISTINCT][r] = r2.per_thread_ns;
	samples[F_SCALE][r] = 2.0 * base * (double) n / r2.wall_ns;

	sc = "lookup_scale_2t_distinct";
	j = id_job(sc, w->two, ID_CHECKOUT, EXPECT_ALLOW);
	base = measure1(&j, n);
	a = id_job(sc, w->two, ID_CHECKOUT, EXPECT_ALLOW);
	b = id_job(sc, w->two, ID_SEARCH, EXPECT_ALLOW);
	r2 = measure2(&a, &b, n);
	samples[F_LOOKUP_2T_DISTINCT][r] = r2.per_thread_ns;
	samples[F_LOOKUP_SCALE][r] = 2.0 * base * (double) n / r2.wall_ns;

	/* One hot key shared by two threads: allow (CAS contention) and
	 * deny (read-only, should scale). */
	a = b = key_job(
	    "resolved_2t_same_key", w->one, w->k_one, EXPECT_ALLOW);
	samples[F_RESOLVED_2T_SAME][r] = measure2(&a, &b, n).per_thread_ns;
	a = b = key_job("deny_2t_same_key", w->deny, w->k_deny, EXPECT_DENY);
	samples[F_DENY_2T_SAME][r] = measure2(&a, &b, n).per_thread_ns;

	/* The same beyond the machine's two cores: four threads share
	 * them, so a thread's figure includes the time it waits for a
	 * core (about half): compare with the floor run the same way. */
	j = floor_job("floor_2t_same_key", &w->f_allow, EXPECT_ALLOW);
	samples[F_FLOOR_2T_SAME][r] = measure_same(&j, 2, n).per_thread_ns;
	j = floor_job("floor_4t_same_key", &w->f_allow, EXPECT_ALLOW);
	samples[F_FLOOR_4T_SAME][r] = measure_same(&j, 4, n).per_thread_ns;
	j = key_job("resolved_4t_same_key", w->one, w->k_one, EXPECT_ALLOW);
	samples[F_RESOLVED_4T_SAME][r] = measure_same(&j, 4, n).per_thread_ns;
	j = key_job("deny_4t_same_key", w->deny, w->k_deny, EXPECT_DENY);
	samples[F_DENY_4T_SAME][r] = measure_same(&j, 4, n).per_thread_ns;

	samples[F_REDIS][r] = measure_redis(w, redis_calls);
}

int
main(int argc, char **argv)
{
	bench_opts o;
	world w = { 0 };

	bench_parse_args(argc, argv, "hotpath", 2000000, &o);
	opts = &o;
	uint64_t redis_calls = REDIS_CALLS_DEFAULT / o.rounds;
	if (redis_calls < 100)
		redis_calls = 100;

	uint64_t t_start = bench_now_ns();
	bench_cpu cpu0, cpu1;
	bench_cpu_mark(&cpu0);
	setup(&w, &o);

	/* Warm-up: touch every path (and check it) before timing. */
	bench_progress(&o, "warm-up");
	round_once(&w, o.iters / 10 ? o.iters / 10 : 1, 200, 0);

	for (unsigned r = 0; r < o.rounds; r++) {
		bench_progress(&o,
		    "round %u/%u (%" PRIu64 " decisions per "
		    "loop, %" PRIu64 " EVALSHA)",
		    r + 1, o.rounds, o.iters, redis_calls);
		round_once(&w, o.iters, redis_calls, r);
	}

	/* Every figure up to the ratios is a median of per-round samples. */
	for (int f = 0; f < F_RATIO_RESOLVED_FLOOR; f++)
		figs[f].value = bench_median(samples[f], o.rounds);
	/* Each ratio is of two medians of the same run. */
	static const int ratio[][3] = {
		{ F_RATIO_RESOLVED_FLOOR, F_RESOLVED, F_FLOOR },
		{ F_RATIO_LOOKUP_FLOOR, F_LOOKUP, F_FLOOR },
		{ F_RATIO_REDIS_RESOLVED, F_REDIS, F_RESOLVED },
		{ F_RATIO_10K_FLOOR, F_RESOLVED_10K, F_FLOOR },
		{ F_RATIO_LOOKUP10K_RESOLVED10K, F_LOOKUP_10K,
		    F_RESOLVED_10K },
		{ F_RATIO_2T_SAME_FLOOR, F_RESOLVED_2T_SAME, F_FLOOR },
		{ F_RATIO_4T_SAME_FLOOR, F_RESOLVED_4T_SAME, F_FLOOR_4T_SAME },
		{ F_RATIO_DENY_FLOOR, F_RESOLVED_DENY, F_FLOOR_DENY },
		{ F_RATIO_SWAPPING_FLOOR, F_RESOLVED_SWAPPING, F_FLOOR },
		{ F_RATIO_STACK3_RESOLVED, F_RESOLVED_STACK3, F_RESOLVED },
	};
	for (size_t i = 0; i < sizeof ratio / sizeof ratio[0]; i++)
		figs[ratio[i][0]].value = figs[ratio[i][1]].value /
		    figs[ratio[i][2]].value;

	teardown(&w);
	bench_cpu_mark(&cpu1);
	figs[F_NOISE].value = bench_cpu_others_pct(&cpu0, &cpu1);
	if (figs[F_NOISE].value > 5.0)
		bench_progress(&o,
		    "warning: other processes used %.0f%% of "
		    "the machine's CPU during the run; two-thread figures "
		    "(and Redis) are unreliable",
		    figs[F_NOISE].value);

	char header[256];
	snprintf(header, sizeof header,
	    "hotpath: median of %u rounds, "
	    "%" PRIu64 " decisions per loop and thread, %" PRIu64
	    " EVALSHA per round; %.1f s",
	    o.rounds, o.iters, redis_calls,
	    (double) (bench_now_ns() - t_start) / 1e9);
	bench_report(&o, header, figs, NFIG);
	return 0;
}
