/* SPDX-License-Identifier: MIT */
/*
 * allot-sim: run a scenario (built-in, or an arrival trace with its quota
 * file and replica schedule) through the ideal global bucket, allot and
 * the equal split, and print the accuracy figures of docs/allocation.md
 * as a table or JSON. `--scenario all` runs every built-in scenario;
 * `--sweep` repeats the run for T = 50, 100, 250 and 1000 ms. Runs are
 * independent and deterministic, so `--jobs` spreads them over threads
 * and prints them in order, the same output as one thread gives; the
 * table ends with the speed, in simulated seconds per real second.
 */
#include <errno.h>
#include <getopt.h>
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
#include "sim.h"

static void
usage(FILE *f)
{
	fputs(
	    "usage: allot-sim [OPTION]...\n"
	    "Simulate allot against the ideal global token bucket and the "
	    "equal split.\n\n"
	    "  -s, --scenario NAME   built-in scenario, or \"all\" (default "
	    "uniform):\n"
	    "                        uniform sticky skewed burst scaleup "
	    "scaledown crash\n"
	    "                        noisy overload outage\n"
	    "      --trace FILE      arrival trace, CSV time_s,replica,caller,"
	    "endpoint\n"
	    "      --config FILE     quota file of the trace\n"
	    "      --schedule SPEC   replica changes of the trace: TIME:+N "
	    "(start N),\n"
	    "                        TIME:-N (N leave), TIME:xN (N crash), "
	    "comma separated\n"
	    "  -T, --interval-ms T   sync interval, agents and coordinator "
	    "(default 100)\n"
	    "      --sweep           run for T = 50, 100, 250 and 1000 ms\n"
	    "      --seed N          random seed (default 1)\n"
	    "      --duration S      simulated seconds (default: the "
	    "scenario's)\n"
	    "      --latency-ms L    one-way latency (default 1)\n"
	    "      --jitter-ms J     extra one-way latency, uniform (default "
	    "0.5)\n"
	    "      --loss P          probability a message is lost (default "
	    "0)\n"
	    "  -j, --jobs N          runs at once (default: the CPUs, at most "
	    "the runs);\n"
	    "                        the output is the same for any N\n"
	    "      --json            one JSON object per run\n"
	    "      --no-keys         no per-quota rows in the table\n"
	    "  -h, --help            this text\n"
	    "docs/allocation.md defines every figure.\n",
	    f);
}

static bool
num_arg(const char *s, double lo, double hi, double *ret)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno != 0 || end == s || *end != '\0' || !(v >= lo && v <= hi))
		return false;
	*ret = v;
	return true;
}

typedef struct opts {
	const char *scenario;
	const char *trace;
	const char *config;
	const char *schedule;
	double duration;
	bool json;
	bool keys;
	bool sweep;
	sim_params p;
} opts;

static double
mono_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double) t.tv_sec + (double) t.tv_nsec / 1e9;
}

/* User and system time of the process, every thread. */
static double
cpu_s(void)
{
	struct rusage u;
	if (getrusage(RUSAGE_SELF, &u) != 0)
		return NAN;
	return (double) (u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
	    (double) (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
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

int
main(int argc, char **argv)
{
	enum {
		O_TRACE = 256,
		O_CONFIG,
		O_SCHEDULE,
		O_SWEEP,
		O_SEED,
		O_DURATION,
		O_LATENCY,
		O_JITTER,
		O_LOSS,
		O_JSON,
		O_NOKEYS
	};
	static const struct option lo[] = {
		{ "scenario", required_argument, NULL, 's' },
		{ "trace", required_argument, NULL, O_TRACE },
		{ "config", required_argument, NULL, O_CONFIG },
		{ "schedule", required_argument, NULL, O_SCHEDULE },
		{ "interval-ms", required_argument, NULL, 'T' },
		{ "sweep", no_argument, NULL, O_SWEEP },
		{ "seed", required_argument, NULL, O_SEED },
		{ "duration", required_argument, NULL, O_DURATION },
		{ "latency-ms", required_argument, NULL, O_LATENCY },
		{ "jitter-ms", required_argument, NULL, O_JITTER },
		{ "loss", required_argument, NULL, O_LOSS },
		{ "jobs", required_argument, NULL, 'j' },
		{ "json", no_argument, NULL, O_JSON },
		{ "no-keys", no_argument, NULL, O_NOKEYS },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	/* Every clock here is the simulator's: spare the agents' TSC
	 * calibration, a 20 ms sleep on the first agent. */
	allot__tsc_disable();
	opts o = { .scenario = NULL, .keys = true };
	sim_params_init(&o.p);
	int c;
	double v;
	unsigned jobs_arg = 0; /* 0: the CPUs */
	while ((c = getopt_long(argc, argv, "s:T:j:h", lo, NULL)) != -1) {
		switch (c) {
		case 's': o.scenario = optarg; break;
		case O_TRACE: o.trace = optarg; break;
		case O_CONFIG: o.config = optarg; break;
		case O_SCHEDULE: o.schedule = optarg; break;
		case 'T':
			if (!num_arg(optarg, 1, 60000, &v))
				goto bad;
			o.p.interval_ms = (uint32_t) v;
			break;
		case O_SWEEP: o.sweep = true; break;
		case O_SEED:
			if (!num_arg(optarg, 0, 1e18, &v))
				goto bad;
			o.p.seed = (uint64_t) v;
			break;
		case O_DURATION:
			if (!num_arg(optarg, 0.1, 1e6, &o.duration))
				goto bad;
			break;
		case O_LATENCY:
			if (!num_arg(optarg, 0, 10000, &o.p.latency_ms))
				goto bad;
			break;
		case O_JITTER:
			if (!num_arg(optarg, 0, 10000, &o.p.latency_jitter_ms))
				goto bad;
			break;
		case O_LOSS:
			if (!num_arg(optarg, 0, 1, &o.p.loss))
				goto bad;
			break;
		case 'j':
			if (!num_arg(optarg, 1, 1024, &v))
				goto bad;
			jobs_arg = (unsigned) v;
			break;
		case O_JSON: o.json = true; break;
		case O_NOKEYS: o.keys = false; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind != argc)
		goto bad;
	if (o.trace != NULL && o.config == NULL) {
		fprintf(stderr, "allot-sim: --trace needs --config\n");
		return 2;
	}
	if (o.trace == NULL && o.scenario == NULL)
		o.scenario = "uniform";
	static const uint32_t sweep[] = { 50, 100, 250, 1000 };
	size_t nt = o.sweep ? sizeof sweep / sizeof sweep[0] : 1;
	bool all = o.trace == NULL && strcmp(o.scenario, "all") == 0;
	bool summary = all || o.sweep;
	if (summary && !o.json)
		sim_print_summary_header(stdout);
	size_t nsc = 1;
	if (all)
		for (nsc = 0; sim_scenario_names[nsc] != NULL; nsc++)
			;
	size_t n = o.trace != NULL ? nt : nt * nsc;
	job *jobs = calloc(n, sizeof *jobs);
	if (jobs == NULL) {
		fprintf(stderr, "allot-sim: out of memory\n");
		return 1;
	}
	for (size_t ti = 0, k = 0; ti < nt; ti++) {
		for (size_t i = 0; i < (o.trace != NULL ? 1 : nsc); i++, k++) {
			jobs[k].p = o.p;
			if (o.sweep)
				jobs[k].p.interval_ms = sweep[ti];
			jobs[k].name = o.trace != NULL ? NULL :
			    all ? sim_scenario_names[i] :
			          o.scenario;
		}
	}
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned nthreads = jobs_arg > 0 ? jobs_arg :
	    cpus > 0                     ? (unsigned) cpus :
	                                   1;
	if (nthreads > n)
		nthreads = (unsigned) n;
	double w0 = mono_s(), c0 = cpu_s(), sim_s;
	int status = run_jobs(&o, summary, jobs, n, nthreads, &sim_s);
	double wall = mono_s() - w0, cpu = cpu_s() - c0;
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
bad:
	fprintf(stderr, "allot-sim: bad argument (see --help)\n");
	return 2;
}
