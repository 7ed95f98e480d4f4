/* SPDX-License-Identifier: MIT */
/*
 * allot-sim: run a scenario (built-in, or an arrival trace with its quota
 * file and replica schedule) through the ideal global bucket, allot and
 * the equal split, and print the accuracy figures of docs/allocation.md
 * as a table or JSON. `--scenario all` runs the ten built-in scenarios,
 * `--scenario families` the seeded families of issue 13 (sim/families.c);
 * `--sweep` repeats the run for T = 50, 100, 250 and 1000 ms. Runs are
 * independent and deterministic, so `--jobs` spreads them over threads
 * and prints them in order, the same output as one thread gives; the
 * table ends with the speed, in simulated seconds per real second.
 */
#include <stddef.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "opts.h"
#include "sim.h"

typedef struct opts {
	const char *scenario;
	const char *trace;
	const char *config;
	const char *schedule;
	double duration;
	bool json;
	bool keys;
	bool sweep;
	unsigned jobs; /* threads; 0: the CPUs */
	sim_params p;
} opts;

static double
mono_s(void)
{
	return (double) allot__mono_ns() / 1e9;
}

/* One run (two for the noisy neighbour); prints it on `out`, errors on
 * `err`. Its wall_s is the whole of it: building the arrivals, the
 * three modes and the reference run. */
static int
run_one(const opts *o, const char *name, const sim_params *p, bool summary,
    FILE *out, FILE *err_out, double *ret_sim_s)
{
	double t0 = mono_s();
	char err[512] = "";
	sim_scenario s;
	int rc = name != NULL ?
	    sim_scenario_builtin(
	        name, p, o->duration, false, &s, err, sizeof err) :
	    sim_scenario_trace(o->trace, o->config, o->schedule, o->duration,
	        &s, err, sizeof err);
	if (rc != ALLOT_OK) {
		fprintf(err_out, "allot-sim: %s\n", err);
		return rc == ALLOT_ENOENT ? 2 : 1;
	}
	sim_result r;
	rc = sim_run(&s, p, &r);
	if (rc == ALLOT_OK && s.noisy_caller >= 0) {
		sim_scenario q;
		sim_result rq;
		if (sim_scenario_builtin(name, p, o->duration, true, &q, err,
		        sizeof err) == ALLOT_OK) {
			if (sim_run(&q, p, &rq) == ALLOT_OK)
				sim_neighbour(&r, &rq, s.noisy_caller);
			sim_scenario_free(&q);
		}
	}
	if (rc != ALLOT_OK) {
		fprintf(err_out, "allot-sim: %s: %s\n", s.name,
		    allot_strerror(rc));
		sim_scenario_free(&s);
		return 1;
	}
	r.wall_s = mono_s() - t0;
	*ret_sim_s = r.duration_s;
	if (o->json) {
		sim_print_json(out, &r);
	} else if (summary) {
		sim_print_summary_row(out, &r);
	} else {
		fprintf(
		    out, "%s\n", s.description != NULL ? s.description : "");
		sim_print_table(out, &r, o->keys);
		fputc('\n', out);
	}
	sim_scenario_free(&s);
	return 0;
}

/* A run to make, and what it printed. */
typedef struct job {
	const char *name; /* built-in scenario; NULL: the trace */
	sim_params p;
	char *out, *err;
	size_t out_len, err_len;
	int status;
	double sim_s;
	bool done;
} job;

typedef struct pool {
	const opts *o;
	bool summary;
	job *jobs;
	size_t n;
	atomic_size_t next;
	atomic_bool stop;
	pthread_mutex_t mu;
	pthread_cond_t cv;
} pool;

static void
job_run(pool *pl, job *j)
{
	FILE *out = open_memstream(&j->out, &j->out_len);
	FILE *err = open_memstream(&j->err, &j->err_len);
	if (out != NULL && err != NULL)
		j->status = run_one(
		    pl->o, j->name, &j->p, pl->summary, out, err, &j->sim_s);
	else
		j->status = 1;
	if (out != NULL)
		fclose(out);
	if (err != NULL)
		fclose(err);
	if (out == NULL || err == NULL)
		fprintf(stderr, "allot-sim: out of memory\n");
}

static void *
worker(void *arg)
{
	pool *pl = arg;
	for (;;) {
		size_t i = atomic_fetch_add(&pl->next, 1);
		if (i >= pl->n || atomic_load(&pl->stop))
			break;
		job_run(pl, &pl->jobs[i]);
		pthread_mutex_lock(&pl->mu);
		pl->jobs[i].done = true;
		pthread_cond_broadcast(&pl->cv);
		pthread_mutex_unlock(&pl->mu);
	}
	return NULL;
}

/* Run the jobs on `nthreads` threads and print them in order. Returns
 * the exit status; *ret_sim_s: the simulated seconds printed. */
static int
run_jobs(const opts *o, bool summary, job *jobs, size_t n, unsigned nthreads,
    double *ret_sim_s)
{
	pool pl = { .o = o, .summary = summary, .jobs = jobs, .n = n };
	atomic_init(&pl.next, 0);
	atomic_init(&pl.stop, false);
	pthread_mutex_init(&pl.mu, NULL);
	pthread_cond_init(&pl.cv, NULL);
	pthread_t *th = calloc(nthreads, sizeof *th);
	unsigned started = 0;
	for (; th != NULL && started < nthreads; started++)
		if (pthread_create(&th[started], NULL, worker, &pl) != 0)
			break;
	if (started == 0) /* no thread: run them here */
		worker(&pl);
	int status = 0;
	double sim_s = 0;
	for (size_t i = 0; i < n; i++) {
		pthread_mutex_lock(&pl.mu);
		while (!jobs[i].done)
			pthread_cond_wait(&pl.cv, &pl.mu);
		pthread_mutex_unlock(&pl.mu);
		if (jobs[i].err_len > 0)
			fwrite(jobs[i].err, 1, jobs[i].err_len, stderr);
		if (jobs[i].out_len > 0)
			fwrite(jobs[i].out, 1, jobs[i].out_len, stdout);
		fflush(stdout);
		if (jobs[i].status == 2) {
			status = 2;
			atomic_store(&pl.stop, true);
			break;
		}
		status |= jobs[i].status;
		sim_s += jobs[i].sim_s;
	}
	atomic_store(&pl.stop, true);
	for (unsigned t = 0; t < started; t++)
		pthread_join(th[t], NULL);
	free(th);
	pthread_mutex_destroy(&pl.mu);
	pthread_cond_destroy(&pl.cv);
	*ret_sim_s = sim_s;
	return status;
}

#define AT(field) offsetof(opts, field)

/* The options, in the order --help lists them. A new one is a row: its
 * value goes to a field of `opts` by kind, or through a handler. */
static const allot__opt rows[] = {
	{ "scenario", 's', ALLOT__OPT_STR, "NAME",
	    "built-in scenario, or \"all\" (default uniform):\n"
	    "uniform sticky skewed burst scaleup scaledown crash\n"
	    "noisy overload outage;\n"
	    "or a seeded family, or \"families\" for all of them:\n"
	    "onoff fanout pareto ramp restart sizing\n"
	    "ceiling pinned swarm costs\n",
	    .off = AT(scenario) },
	{ "trace", 0, ALLOT__OPT_STR, "FILE",
	    "arrival trace, CSV time_s,replica,caller,endpoint\n",
	    .off = AT(trace) },
	{ "config", 0, ALLOT__OPT_STR, "FILE", "quota file of the trace\n",
	    .off = AT(config) },
	{ "schedule", 0, ALLOT__OPT_STR, "SPEC",
	    "replica changes of the trace: TIME:+N (start N),\n"
	    "TIME:-N (N leave), TIME:xN (N crash), comma separated\n",
	    .off = AT(schedule) },
	{ "interval-ms", 'T', ALLOT__OPT_U32, "T",
	    "sync interval, agents and coordinator", .off = AT(p.interval_ms),
	    .min = 1, .max = 60000, .dflt = "100" },
	{ "sweep", 0, ALLOT__OPT_TRUE, NULL,
	    "run for T = 50, 100, 250 and 1000 ms\n", .off = AT(sweep) },
	{ "seed", 0, ALLOT__OPT_U64, "N", "random seed", .off = AT(p.seed),
	    .max = UINT64_C(1000000000000000000), .dflt = "1" },
	{ "duration", 0, ALLOT__OPT_DOUBLE, "S", "simulated seconds",
	    .off = AT(duration), .lo = 0.1, .hi = 1e6,
	    .dflt = "the scenario's" },
	{ "latency-ms", 0, ALLOT__OPT_DOUBLE, "L", "one-way latency",
	    .off = AT(p.latency_ms), .lo = 0, .hi = 10000, .dflt = "1" },
	{ "jitter-ms", 0, ALLOT__OPT_DOUBLE, "J",
	    "extra one-way latency, uniform", .off = AT(p.latency_jitter_ms),
	    .lo = 0, .hi = 10000, .dflt = "0.5" },
	{ "loss", 0, ALLOT__OPT_DOUBLE, "P", "probability a message is lost",
	    .off = AT(p.loss), .lo = 0, .hi = 1, .dflt = "0" },
	{ "loan-frac", 0, ALLOT__OPT_DOUBLE, "F", "allotd's --loan-frac",
	    .off = AT(p.loan_frac), .lo = 0, .hi = 1, .dflt = "allotd's" },
	{ "no-pool", 0, ALLOT__OPT_FALSE, NULL,
	    "agents do not offer the reserve the parts of a token\n"
	    "their buckets hold (AskKey.pool)\n",
	    .off = AT(p.pool) },
	{ "jobs", 'j', ALLOT__OPT_UINT, "N",
	    "runs at once (default: the CPUs, at most the runs);\n"
	    "the output is the same for any N\n",
	    .off = AT(jobs), .min = 1, .max = 1024 },
	{ "json", 0, ALLOT__OPT_TRUE, NULL, "one JSON object per run\n",
	    .off = AT(json) },
	{ "no-keys", 0, ALLOT__OPT_FALSE, NULL,
	    "no per-quota rows in the table\n", .off = AT(keys) },
	{ "help", 'h', ALLOT__OPT_HELP, NULL, "this text\n",
	    .cli_only = true },
};

static const allot__opts table = {
	.prog = "allot-sim",
	.rows = rows,
	.n = sizeof rows / sizeof rows[0],
	.style = ALLOT__OPTS_COLUMNS,
	.col = 24,
	.head = "usage: allot-sim [OPTION]...\n"
	        "Simulate allot against the ideal global token bucket and the "
	        "equal split.\n\n",
	.tail = "docs/allocation.md defines every figure.\n",
};

/* Fill `o` from the command line. False when the program should stop at
 * once, with exit status *ret_status (0 after --help, 2 after a bad
 * command line, its message printed). */
static bool
parse_args(int argc, char **argv, opts *o, int *ret_status)
{
	*o = (opts) { .scenario = NULL, .keys = true };
	sim_params_init(&o->p);
	int rc = allot__opts_parse(&table, NULL, argc, argv, o);
	if (rc == ALLOT__OPTS_OK && o->trace != NULL && o->config == NULL)
		rc = allot__opts_error(&table, "--trace needs --config");
	if (rc != ALLOT__OPTS_OK) {
		*ret_status = rc == ALLOT__OPTS_DONE ? 0 : 2;
		return false;
	}
	if (o->trace == NULL && o->scenario == NULL)
		o->scenario = "uniform";
	return true;
}

static const uint32_t sweep_ms[] = { 50, 100, 250, 1000 };

/* The runs to make, in the order they print: for each interval of the
 * sweep (or the one T), each scenario (or the trace). NULL if out of
 * memory. */
static job *
plan_jobs(const opts *o, const char *const *all, size_t *ret_n)
{
	size_t nt = o->sweep ? sizeof sweep_ms / sizeof sweep_ms[0] : 1;
	size_t nsc = 1;
	if (all != NULL)
		for (nsc = 0; all[nsc] != NULL; nsc++)
			;
	size_t n = o->trace != NULL ? nt : nt * nsc;
	job *jobs = calloc(n, sizeof *jobs);
	if (jobs == NULL)
		return NULL;
	for (size_t ti = 0, k = 0; ti < nt; ti++) {
		for (size_t i = 0; i < (o->trace != NULL ? 1 : nsc);
		     i++, k++) {
			jobs[k].p = o->p;
			if (o->sweep)
				jobs[k].p.interval_ms = sweep_ms[ti];
			jobs[k].name = o->trace != NULL ? NULL :
			    all != NULL                 ? all[i] :
			                                  o->scenario;
		}
	}
	*ret_n = n;
	return jobs;
}

int
main(int argc, char **argv)
{
	/* Every clock here is the simulator's: spare the agents' TSC
	 * calibration, a 20 ms sleep on the first agent. */
	allot__tsc_disable();
	opts o;
	int status;
	if (!parse_args(argc, argv, &o, &status))
		return status;
	const char *const *all = NULL;
	if (o.trace == NULL && strcmp(o.scenario, "all") == 0)
		all = sim_scenario_names;
	else if (o.trace == NULL && strcmp(o.scenario, "families") == 0)
		all = sim_family_names;
	bool summary = all != NULL || o.sweep;
	if (summary && !o.json)
		sim_print_summary_header(stdout);
	size_t n = 0;
	job *jobs = plan_jobs(&o, all, &n);
	if (jobs == NULL) {
		fprintf(stderr, "allot-sim: out of memory\n");
		return 1;
	}
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned nthreads = o.jobs > 0 ? o.jobs :
	    cpus > 0                   ? (unsigned) cpus :
	                                 1;
	if (nthreads > n)
		nthreads = (unsigned) n;
	double w0 = mono_s(), c0 = sim_cpu_s(), sim_s;
	status = run_jobs(&o, summary, jobs, n, nthreads, &sim_s);
	double wall = mono_s() - w0, cpu = sim_cpu_s() - c0;
	/* The speed, a scenario's three modes counted once (and the noisy
	 * neighbour's reference run not at all). */
	if (summary && !o.json && status != 2)
		printf("speed: %.0f simulated s in %.2f s on %u thread%s: "
		       "%.0f simulated s per s (%.0f per CPU s)\n",
		    sim_s, wall, nthreads, nthreads == 1 ? "" : "s",
		    wall > 0 ? sim_s / wall : 0, cpu > 0 ? sim_s / cpu : 0);
	for (size_t i = 0; i < n; i++) {
		free(jobs[i].out);
		free(jobs[i].err);
	}
	free(jobs);
	return status;
}
