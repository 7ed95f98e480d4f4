/* SPDX-License-Identifier: MIT */
/*
 * Suite `accuracy`: the simulator's figures (sim/, docs/allocation.md)
 * for every built-in scenario and every seeded family of issue 13
 * (sim/families.c) and mode, named accuracy.<scenario>.<mode>.<metric>
 * with modes ideal, allot, split and local (allot without the central
 * reserve, issue 25) and metrics over (units of R*T),
 * under (%), util (%) and converge (intervals), each the worst seed
 * (over, under and converge the highest, util the lowest). With them,
 * issue 13's targets, PASS or MISS in the table: allot's under-admission
 * at most 5 % and at most 1 point above the split's in the same seed
 * (accuracy.<scenario>.allot.under_vs_split, the worst seed), and the
 * coordinator's Syncs per second (accuracy.<scenario>.allot.syncs, the
 * worst seed) at most twice what they were before it. Also the noisy
 * neighbour (accuracy.noisy.<mode>.neighbour, %), the share of its quota
 * each priority class gets in overload (accuracy.overload.allot.class_
 * <name>, %), the bootstrap term, what agents held above the
 * coordinator's live bound through a restart
 * (accuracy.restart.allot.held_over_bound), a sweep of T
 * (accuracy.sweep.t<ms>.allot.<metric>, with the coordinator's syncs/s)
 * and the families' sweep (accuracy.sweep.t<ms>.<family>.<mode>.<metric>).
 * Every scenario runs once per seed, seeds 1..N with N = --rounds but at
 * least 20, 60 simulated s each. Simulated time, so the figures do not
 * depend on the machine, except two: the simulator's speed over the ten
 * built-in scenarios' runs at T = 100 ms, in simulated seconds per real
 * second with the seeds run as many at a time as there are CPUs
 * (accuracy.sim_seconds_per_s), and per CPU second
 * (accuracy.sim_seconds_per_cpu_s). The suite takes about a minute on
 * two CPUs.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench.h"
#include "clock.h"
#include "sim.h"

#define MAX_FIGURES 1024
#define SIM_SECONDS 60.0
/* The fewest seeds a figure is the worst of. */
#define MIN_SEEDS 20u
/* Targets for callers below their quota: issue 25's at most 1 % with
 * the tail path (issue 13's was 5 %), and issue 13's at most 1 point
 * above the split; without the tail path at most half a point above
 * it; and issue 25's share of decisions that go central in the steady
 * scenarios. */
#define UNDER_MAX_PCT 1.0
#define LOCAL_VS_SPLIT_MAX_POINTS 0.5
#define CENTRAL_STEADY_MAX 0.02
#define UNDER_VS_SPLIT_MAX_POINTS 1.0
#define SYNCS_BUDGET 2.0

static bench_figure figs[MAX_FIGURES];
static char names[MAX_FIGURES][112]; /* "accuracy." and a name of up to 95 */
static size_t nfigs;

static void
add(const char *name, const char *unit, int dec, const char *what,
    bench_cmp cmp, double target, double value)
{
	if (nfigs == MAX_FIGURES)
		bench_fail("too many figures");
	snprintf(names[nfigs], sizeof names[nfigs], "accuracy.%s", name);
	figs[nfigs] = (bench_figure) { .name = names[nfigs],
		.unit = unit,
		.decimals = dec,
		.what = what,
		.cmp = cmp,
		.target = target,
		.value = value };
	nfigs++;
}

/* One scenario over `rounds` seeds. */
typedef struct agg {
	sim_result r[BENCH_MAX_ROUNDS];
	unsigned n;
} agg;

/* The speed over the built-in scenarios' runs at T = 100 ms: simulated
 * seconds (a scenario's three modes counted once, a reference run not at
 * all), and the real and CPU time of the runs, building the arrivals
 * included. The families, with up to 24 replicas and bursts of
 * thousands of calls, are slower per simulated second; they stay out so
 * that the figure keeps measuring what it always did. */
static double speed_sim_s, speed_wall_s, speed_cpu_s;

/* Seeds run this many at a time: the CPUs, as allot-sim does. */
static unsigned nthreads = 1;

/* One seed of a scenario (and its noisy neighbour's reference run). */
static void
run_seed(const char *name, uint32_t interval_ms, unsigned seed, sim_result *r)
{
	uint64_t t0 = bench_now_ns();
	sim_params p;
	sim_params_init(&p);
	p.seed = seed;
	p.interval_ms = interval_ms;
	char err[256] = "";
	sim_scenario s;
	if (sim_scenario_builtin(
	        name, &p, SIM_SECONDS, false, &s, err, sizeof err) != ALLOT_OK)
		bench_fail("%s: %s", name, err);
	if (sim_run(&s, &p, r) != ALLOT_OK)
		bench_fail("%s: the simulation failed", name);
	if (s.noisy_caller >= 0) {
		sim_scenario q;
		sim_result rq;
		if (sim_scenario_builtin(name, &p, SIM_SECONDS, true, &q, err,
		        sizeof err) != ALLOT_OK ||
		    sim_run(&q, &p, &rq) != ALLOT_OK)
			bench_fail("%s: the reference run failed", name);
		sim_neighbour(r, &rq, s.noisy_caller);
		sim_scenario_free(&q);
	}
	sim_scenario_free(&s);
	r->wall_s = (double) (bench_now_ns() - t0) / 1e9;
}

typedef struct seeds {
	const char *name;
	uint32_t interval_ms;
	agg *a;
	atomic_uint next;
} seeds;

static void *
seed_worker(void *arg)
{
	seeds *j = arg;
	for (;;) {
		unsigned i = atomic_fetch_add(&j->next, 1);
		if (i >= j->a->n)
			return NULL;
		run_seed(j->name, j->interval_ms, i + 1, &j->a->r[i]);
	}
}

/* Seeds 1 .. rounds of a scenario, nthreads at a time (the runs share
 * nothing, and each is deterministic). */
static bool
is_family(const char *name)
{
	for (size_t i = 0; sim_family_names[i] != NULL; i++)
		if (strcmp(sim_family_names[i], name) == 0)
			return true;
	return false;
}

static void
run_seeds(const bench_opts *o, const char *name, uint32_t interval_ms, agg *a)
{
	a->n = o->rounds;
	seeds j = { .name = name, .interval_ms = interval_ms, .a = a };
	atomic_init(&j.next, 0);
	uint64_t w0 = bench_now_ns();
	double c0 = sim_cpu_s();
	pthread_t th[BENCH_MAX_ROUNDS];
	unsigned nt = 0;
	while (nt + 1 < nthreads && nt + 1 < a->n &&
	    pthread_create(&th[nt], NULL, seed_worker, &j) == 0)
		nt++;
	seed_worker(&j);
	for (unsigned t = 0; t < nt; t++)
		pthread_join(th[t], NULL);
	if (interval_ms == 100 && !is_family(name)) {
		for (unsigned i = 0; i < a->n; i++)
			speed_sim_s += a->r[i].duration_s;
		speed_wall_s += (double) (bench_now_ns() - w0) / 1e9;
		speed_cpu_s += sim_cpu_s() - c0;
	}
	for (unsigned i = 0; i < a->n; i++)
		bench_progress(o, "accuracy: %s T=%u ms seed %u: %.2f s", name,
		    interval_ms, i + 1, a->r[i].wall_s);
}

typedef enum pick { MEDIAN, WORST_HIGH, WORST_LOW } pick;

/* The median (NaN entries are skipped; all NaN gives NaN), or the
 * largest or the smallest value. */
static double
over_seeds(const agg *a, size_t off, int mode, pick how)
{
	double v[BENCH_MAX_ROUNDS];
	size_t n = 0;
	for (unsigned i = 0; i < a->n; i++) {
		const double *arr =
		    (const double *) (const void *) ((const char *) &a->r[i] +
		        off);
		double x = arr[mode];
		if (!isnan(x))
			v[n++] = x;
	}
	if (n == 0)
		return NAN;
	if (how != MEDIAN) {
		double m = v[0];
		for (size_t i = 1; i < n; i++)
			m = (how == WORST_HIGH ? v[i] > m : v[i] < m) ? v[i] :
			                                                m;
		return m;
	}
	return bench_median(v, n);
}

#define OFF(field) offsetof(sim_result, field)

/* Syncs per second of the worst of seeds 1..20 at T = 100 ms before
 * issue 13 (main at 31f9f78, this suite's first run with the families):
 * the 2x budget of its coordinator messages. The families draw their
 * replica counts from the seed, so these hold for seeds 1..20 only; with
 * more seeds the worst may have more replicas. */
static const struct {
	const char *scenario;
	double syncs;
} syncs_before[] = {
	{ "uniform", 79 },
	{ "sticky", 79 },
	{ "skewed", 79 },
	{ "burst", 79 },
	{ "scaleup", 98 },
	{ "scaledown", 98 },
	{ "crash", 98 },
	{ "noisy", 79 },
	{ "overload", 79 },
	{ "outage", 71 },
	{ "onoff", 157 },
	{ "fanout", 235 },
	{ "pareto", 157 },
	{ "ramp", 118 },
	{ "restart", 154 },
	{ "sizing", 98 },
};

static double
syncs_budget(const char *sc)
{
	for (size_t i = 0; i < sizeof syncs_before / sizeof syncs_before[0];
	     i++)
		if (strcmp(syncs_before[i].scenario, sc) == 0)
			return SYNCS_BUDGET * syncs_before[i].syncs;
	return NAN;
}

/* The four figures of every mode, worst seed. */
static void
mode_figures(const char *sc, const agg *a)
{
	bool graceful = strcmp(sc, "scaleup") == 0 ||
	    strcmp(sc, "scaledown") == 0;
	for (int m = 0; m < SIM_NMODES; m++) {
		const char *mn = sim_mode_names[m];
		bool al = m == SIM_ALLOT;
		char n[96];
		snprintf(n, sizeof n, "%s.%s.over", sc, mn);
		add(n, "R*T", 3,
		    "max over windows T, 1 s, 10 s of admitted - "
		    "(B + R W), worst seed",
		    al ? BENCH_AT_MOST : BENCH_NO_TARGET, 1.0,
		    over_seeds(a, OFF(over), m, WORST_HIGH));
		snprintf(n, sizeof n, "%s.%s.under", sc, mn);
		add(n, "%", 3,
		    "(ideal - admitted) / ideal after 3 T of the "
		    "callers below their quota, worst seed",
		    al ? BENCH_AT_MOST : BENCH_NO_TARGET, UNDER_MAX_PCT,
		    100 * over_seeds(a, OFF(under), m, WORST_HIGH));
		snprintf(n, sizeof n, "%s.%s.util", sc, mn);
		add(n, "%", 2, "admitted / (R * duration + B), worst seed",
		    al && strcmp(sc, "overload") == 0 ? BENCH_AT_LEAST :
		                                        BENCH_NO_TARGET,
		    98.0, 100 * over_seeds(a, OFF(util), m, WORST_LOW));
		snprintf(n, sizeof n, "%s.%s.converge", sc, mn);
		add(n, "T", 2,
		    "intervals from the change until every share "
		    "is at its target, worst seed",
		    al && graceful ? BENCH_AT_MOST : BENCH_NO_TARGET, 2.0,
		    over_seeds(a, OFF(converge), m, WORST_HIGH));
	}
}

/* issue 13's budget figures: allot's under-admission against the
 * split's in the same seed, and the coordinator's messages. */
static void
budget_figures(const char *sc, const agg *a)
{
	double vs = -INFINITY, syncs = 0;
	for (unsigned i = 0; i < a->n; i++) {
		const sim_result *r = &a->r[i];
		double d = 100 * (r->under[SIM_ALLOT] - r->under[SIM_SPLIT]);
		vs = d > vs ? d : vs;
		syncs = r->syncs_per_s > syncs ? r->syncs_per_s : syncs;
	}
	char n[96];
	snprintf(n, sizeof n, "%s.allot.under_vs_split", sc);
	add(n, "pt", 2,
	    "allot's under-admission minus the split's, same seed, "
	    "worst seed",
	    BENCH_AT_MOST, UNDER_VS_SPLIT_MAX_POINTS, vs);
	double budget = syncs_budget(sc);
	snprintf(n, sizeof n, "%s.allot.syncs", sc);
	add(n, "/s", 0,
	    "Syncs the coordinator answers, worst seed; target: twice "
	    "those before issue 13",
	    isnan(budget) ? BENCH_NO_TARGET : BENCH_AT_MOST, budget, syncs);
	/* Issue 25's tail path: how much of the traffic waited for the
	 * central reserve (0-1; at most 2 % in the steady scenarios, the
	 * hot path stays local) and for how long (at most two round trips
	 * of the simulated 1 ms), and that the reserve made no tokens (the
	 * buckets and the reserve never hold more than B together). */
	bool steady = strcmp(sc, "uniform") == 0 ||
	    strcmp(sc, "sticky") == 0 || strcmp(sc, "skewed") == 0;
	snprintf(n, sizeof n, "%s.central_fraction", sc);
	add(n, "", 4,
	    "fraction of the decisions that waited for the central "
	    "reserve, worst seed",
	    steady ? BENCH_AT_MOST : BENCH_NO_TARGET, CENTRAL_STEADY_MAX,
	    over_seeds(a, OFF(central_fraction), 0, WORST_HIGH));
	snprintf(n, sizeof n, "%s.central_p99_ms", sc);
	add(n, "ms", 2,
	    "99th percentile of those waits, worst seed (round trip "
	    "1 ms)",
	    BENCH_AT_MOST, 2.0,
	    over_seeds(a, OFF(central_p99_ms), 0, WORST_HIGH));
	snprintf(n, sizeof n, "%s.allot.tokens_over_burst", sc);
	add(n, "B", 3,
	    "tokens in the buckets and the central reserve above B, "
	    "worst seed and check",
	    BENCH_AT_MOST, 1e-9,
	    over_seeds(a, OFF(max_tokens_over_burst), 0, WORST_HIGH));
	/* Without the tail path (allot local only): never worse than the
	 * split for any caller. */
	double lvs = -INFINITY;
	for (unsigned i = 0; i < a->n; i++) {
		const sim_result *r = &a->r[i];
		double d = 100 * (r->under[SIM_LOCAL] - r->under[SIM_SPLIT]);
		lvs = d > lvs ? d : lvs;
	}
	snprintf(n, sizeof n, "%s.local.under_vs_split", sc);
	add(n, "pt", 2,
	    "allot local only: under-admission minus the split's, same "
	    "seed, worst seed",
	    BENCH_AT_MOST, LOCAL_VS_SPLIT_MAX_POINTS, lvs);
	if (strcmp(sc, "restart") == 0) {
		add("restart.allot.held_over_bound", "R", 3,
		    "what agents held above the coordinator's live bound, "
		    "worst seed and tick",
		    BENCH_NO_TARGET, 0,
		    over_seeds(a, OFF(max_held_over_bound), 0, WORST_HIGH));
	}
}

static void
scenario_figures(const bench_opts *o, const char *sc)
{
	agg *a = calloc(1, sizeof *a);
	if (a == NULL)
		bench_fail("out of memory");
	run_seeds(o, sc, 100, a);
	bool graceful = strcmp(sc, "scaleup") == 0 ||
	    strcmp(sc, "scaledown") == 0;
	double boot = 0;
	for (unsigned i = 0; i < a->n; i++)
		boot = a->r[i].bootstrap > boot ? a->r[i].bootstrap : boot;
	mode_figures(sc, a);
	budget_figures(sc, a);
	if (graceful) {
		char n[96];
		snprintf(n, sizeof n, "%s.allot.converge_worst", sc);
		add(n, "T", 2, "the slowest seed: at most 2 sync rounds",
		    BENCH_NO_TARGET, 0,
		    over_seeds(a, OFF(converge), SIM_ALLOT, WORST_HIGH));
	}
	char n[96];
	snprintf(n, sizeof n, "%s.allot.bootstrap", sc);
	add(n, "R*T", 3,
	    "admitted by agents before their first Welcome, "
	    "worst seed",
	    BENCH_NO_TARGET, 0, boot);
	if (strcmp(sc, "noisy") == 0) {
		for (int m = 0; m < SIM_NMODES; m++) {
			snprintf(n, sizeof n, "noisy.%s.neighbour",
			    sim_mode_names[m]);
			add(n, "%", 3,
			    "others' admitted cost against a run "
			    "without the noisy caller, median seed",
			    m == SIM_ALLOT ? BENCH_AT_MOST : BENCH_NO_TARGET,
			    1.0,
			    100 * over_seeds(a, OFF(neighbour), m, MEDIAN));
		}
	}
	if (strcmp(sc, "overload") == 0) {
		/* callers 0..3: critical, standard, batch, low */
		for (size_t k = 0; k < 4; k++) {
			double v[BENCH_MAX_ROUNDS];
			for (unsigned i = 0; i < a->n; i++) {
				const sim_key *key = &a->r[i].keys[k];
				v[i] = 100 * key->f[SIM_ALLOT].admitted /
				    (key->rate * a->r[i].duration_s);
			}
			snprintf(n, sizeof n, "overload.allot.class_%s",
			    a->r[0].keys[k].priority);
			add(n, "%", 1,
			    "admitted / (R * duration) of the "
			    "class's caller, median seed",
			    BENCH_NO_TARGET, 0, bench_median(v, a->n));
		}
	}
	free(a);
}

static void
sweep_figures(const bench_opts *o)
{
	static const uint32_t ts[] = { 50, 100, 250, 1000 };
	agg *a = calloc(1, sizeof *a);
	if (a == NULL)
		bench_fail("out of memory");
	for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
		char n[96];
		uint32_t t = ts[i];
		run_seeds(o, "sticky", t, a);
		snprintf(n, sizeof n, "sweep.t%u.allot.sticky_under", t);
		add(n, "%", 3, "sticky: under-admission, median seed",
		    BENCH_NO_TARGET, 0,
		    100 * over_seeds(a, OFF(under), SIM_ALLOT, MEDIAN));
		double v[BENCH_MAX_ROUNDS];
		for (unsigned k = 0; k < a->n; k++)
			v[k] = a->r[k].syncs_per_s;
		snprintf(n, sizeof n, "sweep.t%u.allot.syncs", t);
		add(n, "/s", 0,
		    "sticky: Syncs the coordinator answers (8 "
		    "replicas)",
		    BENCH_NO_TARGET, 0, bench_median(v, a->n));
		for (unsigned k = 0; k < a->n; k++)
			v[k] = a->r[k].bytes_per_s / 1024;
		snprintf(n, sizeof n, "sweep.t%u.allot.kib", t);
		add(n, "KiB/s", 1, "sticky: protocol bytes, both ways",
		    BENCH_NO_TARGET, 0, bench_median(v, a->n));
		run_seeds(o, "scaleup", t, a);
		snprintf(n, sizeof n, "sweep.t%u.allot.converge_ms", t);
		add(n, "ms", 0, "scaleup: time to converge, median seed",
		    BENCH_NO_TARGET, 0,
		    t * over_seeds(a, OFF(converge), SIM_ALLOT, MEDIAN));
		snprintf(n, sizeof n, "sweep.t%u.allot.scaleup_under", t);
		add(n, "%", 3, "scaleup: under-admission, median seed",
		    BENCH_NO_TARGET, 0,
		    100 * over_seeds(a, OFF(under), SIM_ALLOT, MEDIAN));
		run_seeds(o, "overload", t, a);
		snprintf(n, sizeof n, "sweep.t%u.allot.overload_over", t);
		add(n, "R*T", 3,
		    "overload: over-admission (its unit R * T "
		    "grows with T), worst seed",
		    BENCH_NO_TARGET, 0,
		    over_seeds(a, OFF(over), SIM_ALLOT, WORST_HIGH));
		snprintf(n, sizeof n, "sweep.t%u.allot.overload_util", t);
		add(n, "%", 2,
		    "overload: utilization of the ceiling, median "
		    "seed",
		    BENCH_NO_TARGET, 0,
		    100 * over_seeds(a, OFF(util), SIM_ALLOT, MEDIAN));
	}
	free(a);
}

/* The T sweep of the families: under-admission of allot and the split
 * and allot's over-admission, worst seed. */
static void
family_sweep_figures(const bench_opts *o)
{
	static const uint32_t ts[] = { 50, 100, 250, 1000 };
	agg *a = calloc(1, sizeof *a);
	if (a == NULL)
		bench_fail("out of memory");
	for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
		for (size_t f = 0; sim_family_names[f] != NULL; f++) {
			const char *sc = sim_family_names[f];
			char n[96];
			run_seeds(o, sc, ts[i], a);
			for (int m = SIM_ALLOT; m <= SIM_SPLIT; m++) {
				snprintf(n, sizeof n, "sweep.t%u.%s.%s.under",
				    ts[i], sc, sim_mode_names[m]);
				add(n, "%", 3,
				    "under-admission of the callers below "
				    "their quota, worst seed",
				    BENCH_NO_TARGET, 0,
				    100 *
				        over_seeds(
				            a, OFF(under), m, WORST_HIGH));
			}
			snprintf(
			    n, sizeof n, "sweep.t%u.%s.allot.over", ts[i], sc);
			add(n, "R*T", 3, "over-admission, worst seed",
			    BENCH_NO_TARGET, 0,
			    over_seeds(a, OFF(over), SIM_ALLOT, WORST_HIGH));
		}
	}
	free(a);
}

int
main(int argc, char **argv)
{
	bench_opts o;
	bench_parse_args(argc, argv, "accuracy", 0, &o);
	/* Every clock here is the simulator's: no TSC calibration. */
	allot__tsc_disable();
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	nthreads = cpus > 0 ? (unsigned) cpus : 1;
	if (o.rounds < MIN_SEEDS)
		o.rounds = MIN_SEEDS;
	for (size_t i = 0; sim_scenario_names[i] != NULL; i++)
		if (bench_selected(&o, sim_scenario_names[i]))
			scenario_figures(&o, sim_scenario_names[i]);
	for (size_t i = 0; sim_family_names[i] != NULL; i++)
		if (bench_selected(&o, sim_family_names[i]))
			scenario_figures(&o, sim_family_names[i]);
	if (bench_selected(&o, "sweep"))
		sweep_figures(&o);
	if (bench_selected(&o, "family_sweep"))
		family_sweep_figures(&o);
	add("sim_seconds_per_s", "sim s/s", 0,
	    "simulator speed: simulated s per real s, the T = 100 ms runs, "
	    "as many at a time as CPUs",
	    BENCH_AT_LEAST, 2000,
	    speed_wall_s > 0 ? speed_sim_s / speed_wall_s : NAN);
	add("sim_seconds_per_cpu_s", "sim s/s", 0,
	    "the same per CPU second: the speed of one run at a time",
	    BENCH_NO_TARGET, 0,
	    speed_cpu_s > 0 ? speed_sim_s / speed_cpu_s : NAN);
	char header[200];
	snprintf(header, sizeof header,
	    "accuracy: allot against the ideal "
	    "global bucket and the equal split, %.0f simulated s per "
	    "scenario, worst of seeds 1..%u, %u at a time "
	    "(docs/allocation.md)",
	    SIM_SECONDS, o.rounds, nthreads);
	bench_report(&o, header, figs, nfigs);
	return 0;
}
