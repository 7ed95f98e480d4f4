/* SPDX-License-Identifier: MIT */
/*
 * The accuracy targets of docs/allocation.md, asserted on short,
 * deterministic runs of the simulator (sim/): the real agents and the
 * real coordinator registry on a virtual clock against the ideal global
 * bucket and the equal split, fed the same arrivals. Every scenario:
 * over-admission within one interval of traffic plus the bootstrap term,
 * grants within R and agents within the live bound at every tick. Then
 * the scenario-specific targets: under-admission in sticky and skewed
 * (and the split's failure there), utilization and priority order in
 * overload, convergence after graceful changes, the noisy neighbour, the
 * coordinator outage, message loss, determinism, the T sweep and traces,
 * and allot-sim's output on a trace being the same for any --jobs. The
 * seeded families of issue 13 (sim/families.c) are checked for what
 * holds before its mechanism: they run, draw their parameters from the
 * seed, keep their callers below quota, stay within one interval of
 * over-admission (all but restart, which does not yet) and print the
 * same for any --jobs; their under-admission targets are bench-accuracy's
 * (PASS or MISS there), not asserted here, but for the ceiling's level:
 * local only, the `ceiling` family no worse than the split, and a trace
 * of every caller bursting at once within the ceiling's bound.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "allotd.h"
#include "runner.h"
#include "sim.h"

#define DURATION 30.0

/* Under a sanitizer (about seven times slower) the cases that run many
 * seeds run fewer, to keep the suite within half its timeout there. */
#define SEEDS(plain) (ALLOT_TEST_SANITIZED ? ((plain) + 1) / 2 : (plain))

static void
run(const char *name, const sim_params *p, double dur, bool without_noisy,
    sim_result *r)
{
	char err[256] = "";
	sim_scenario s;
	ck_assert_msg(sim_scenario_builtin(name, p, dur, without_noisy, &s,
	                  err, sizeof err) == ALLOT_OK,
	    "%s: %s", name, err);
	ck_assert_int_eq(sim_run(&s, p, r), ALLOT_OK);
	sim_scenario_free(&s);
}

/* What holds in every run of allot. */
static void
assert_invariants(const sim_result *r)
{
	ck_assert_msg(r->over[SIM_ALLOT] <= 1.0 + r->bootstrap,
	    "%s T=%u: over-admission %.3f R*T (bootstrap %.3f)", r->scenario,
	    r->interval_ms, r->over[SIM_ALLOT], r->bootstrap);
	ck_assert_msg(r->max_granted_ratio <= 1 + 1e-9, "%s: grants %.12f R",
	    r->scenario, r->max_granted_ratio);
	ck_assert_msg(r->max_held_over_bound <= 1e-9,
	    "%s: agents hold %.3g R "
	    "above the live bound",
	    r->scenario, r->max_held_over_bound);
	ck_assert_uint_gt(r->invariant_checks, 0);
	/* The agents are honest: allotd refutes none of their denials. */
	ck_assert_msg(r->denials_refuted == 0,
	    "%s T=%u: %llu denial reports refuted", r->scenario,
	    r->interval_ms, (unsigned long long) r->denials_refuted);
	/* The ideal bucket never admits above B + R W: the figures are
	 * computed right. */
	ck_assert(r->over[SIM_IDEAL] <= 1e-9);
}

START_TEST(every_scenario_bounded)
{
	sim_params p;
	sim_params_init(&p);
	p.run_local = false; /* allot as shipped: what this checks */
	for (size_t i = 0; sim_scenario_names[i] != NULL; i++) {
		sim_result r;
		run(sim_scenario_names[i], &p, DURATION, false, &r);
		assert_invariants(&r);
		/* Bounded bootstrap: what agents admit before their first
		 * Welcome is a fraction of one interval of traffic here. */
		ck_assert_msg(r.bootstrap < 0.5, "%s: bootstrap %.3f",
		    r.scenario, r.bootstrap);
	}
}
END_TEST

START_TEST(sticky_and_skewed)
{
	sim_params p;
	sim_params_init(&p);
	static const char *const names[] = { "sticky", "skewed" };
	for (int i = 0; i < 2; i++) {
		sim_result r;
		run(names[i], &p, DURATION, false, &r);
		ck_assert_msg(r.under[SIM_ALLOT] <= 0.01,
		    "%s: allot under "
		    "%.3f %%",
		    names[i], 100 * r.under[SIM_ALLOT]);
		/* What allot is for: the split refuses a good part. */
		ck_assert_msg(r.under[SIM_SPLIT] >= 0.10,
		    "%s: split under "
		    "%.3f %%",
		    names[i], 100 * r.under[SIM_SPLIT]);
		ck_assert(r.under[SIM_IDEAL] == 0);
	}
}
END_TEST

START_TEST(overload_priorities)
{
	sim_params p;
	sim_params_init(&p);
	sim_result r;
	run("overload", &p, DURATION, false, &r);
	ck_assert_msg(
	    r.util[SIM_ALLOT] >= 0.98, "utilization %.4f", r.util[SIM_ALLOT]);
	/* callers 0..3 are critical, standard, batch, low; the ceiling of
	 * 2500 covers the first two in full and half of the third. */
	double got[4];
	for (int i = 0; i < 4; i++) {
		const sim_key *k = &r.keys[i];
		got[i] = k->f[SIM_ALLOT].admitted / (k->rate * r.duration_s);
	}
	ck_assert_msg(got[0] >= 0.99 && got[1] >= 0.99,
	    "critical %.3f "
	    "standard %.3f of their quota",
	    got[0], got[1]);
	ck_assert(got[1] > got[2] && got[2] > got[3]);
	ck_assert(got[2] > 0.45 && got[2] < 0.55);
	ck_assert(got[3] < 0.01);
	ck_assert(r.keys[4].ceiling);
	ck_assert(r.keys[4].f[SIM_ALLOT].over <= 1.0 + r.bootstrap);
}
END_TEST

START_TEST(convergence)
{
	sim_params p;
	sim_params_init(&p);
	/* A graceful change settles in two sync rounds at most: the old
	 * replicas give back on their next Sync, the others take on theirs;
	 * with the agents' 10 % jitter and the transport's latency a round
	 * lasts up to 1.1 T, so 2 rounds are within 2.25 T. Seeds 1..3 (1
	 * and 2 under a sanitizer). */
	static const char *const names[] = { "scaleup", "scaledown" };
	p.run_local = false;
	for (int i = 0; i < 2; i++) {
		for (uint64_t seed = 1; seed <= SEEDS(3); seed++) {
			p.seed = seed;
			sim_result r;
			run(names[i], &p, DURATION, false, &r);
			ck_assert_msg(r.converge[SIM_ALLOT] <= 2.25,
			    "%s seed %llu: %.3f intervals", names[i],
			    (unsigned long long) seed, r.converge[SIM_ALLOT]);
			assert_invariants(&r);
		}
	}
	/* A crash is noticed after K = 5 silent intervals. */
	p.seed = 1;
	sim_result r;
	run("crash", &p, DURATION, false, &r);
	ck_assert(r.converge[SIM_ALLOT] >= 4 && r.converge[SIM_ALLOT] <= 8);
}
END_TEST

START_TEST(noisy_neighbour)
{
	sim_params p;
	sim_params_init(&p);
	sim_result with, without;
	run("noisy", &p, DURATION, false, &with);
	run("noisy", &p, DURATION, true, &without);
	sim_neighbour(&with, &without, 3);
	ck_assert_msg(with.neighbour[SIM_ALLOT] <= 0.01,
	    "others moved "
	    "%.3f %%",
	    100 * with.neighbour[SIM_ALLOT]);
	/* The noisy caller itself never gets more than its quota. */
	const sim_key *k = &with.keys[3];
	ck_assert(
	    k->f[SIM_ALLOT].admitted <= k->rate * with.duration_s + k->burst);
}
END_TEST

START_TEST(outage_and_loss)
{
	sim_params p;
	sim_params_init(&p);
	sim_result r;
	run("outage", &p, DURATION, false, &r);
	assert_invariants(&r);
	/* Local only, the replicas' shares carry them through the lease;
	 * with the tail path a quota runs its bodies' shares until the
	 * lease ends, then its fallback: the reserve is out of reach
	 * (docs/allocation.md, "The central reserve", failures). */
	ck_assert(r.under[SIM_LOCAL] <= 0.01);
	ck_assert(r.under[SIM_ALLOT] <= 0.02);
	/* 5 % of the messages lost: decreases not acknowledged are in the
	 * bound, nothing goes above it. */
	p.loss = 0.05;
	run("skewed", &p, DURATION, false, &r);
	assert_invariants(&r);
	ck_assert(r.under[SIM_ALLOT] <= 0.02);
	ck_assert(r.max_bound_ratio > 1.0); /* the lost replies showed */
}
END_TEST

START_TEST(deterministic)
{
	sim_params p;
	sim_params_init(&p);
	sim_result a, b, c;
	run("sticky", &p, 10, false, &a);
	run("sticky", &p, 10, false, &b);
	a.wall_s = b.wall_s = 0;
	char *ja = NULL, *jb = NULL;
	size_t la = 0, lb = 0;
	FILE *fa = open_memstream(&ja, &la);
	FILE *fb = open_memstream(&jb, &lb);
	ck_assert(fa != NULL && fb != NULL);
	sim_print_json(fa, &a);
	sim_print_json(fb, &b);
	fclose(fa);
	fclose(fb);
	ck_assert_uint_gt(la, 100);
	ck_assert(la == lb && strcmp(ja, jb) == 0);
	free(ja);
	free(jb);
	p.seed = 2;
	run("sticky", &p, 10, false, &c);
	ck_assert(c.keys[0].offered != a.keys[0].offered);
}
END_TEST

START_TEST(interval_sweep)
{
	static const uint32_t ts[] = { 50, 100, 250, 1000 };
	sim_params p;
	sim_params_init(&p);
	double syncs = INFINITY;
	for (int i = 0; i < 4; i++) {
		p.interval_ms = ts[i];
		sim_result r;
		run("sticky", &p, 60, false, &r);
		assert_invariants(&r);
		/* At T = 1 s a replica's body window is 4 s: a sticky
		 * caller that moves is served by the reserve, at what the
		 * other replicas' bodies leave it, for a few seconds
		 * (1.09 % measured, against 0 for the local-only run). */
		double most = ts[i] < 1000 ? 0.01 : 0.02;
		ck_assert_msg(r.under[SIM_ALLOT] <= most,
		    "T=%u: under "
		    "%.3f %%",
		    ts[i], 100 * r.under[SIM_ALLOT]);
		/* The coordinator's load falls with T. */
		ck_assert(r.syncs_per_s < syncs);
		syncs = r.syncs_per_s;
	}
}
END_TEST

/* The files of a trace test in a new directory `dir` (a mkdtemp
 * template): the quota file `cfg` (caller a at 100 tokens/s, /export of
 * weight 5), and the trace `csv`, returned open for writing after its
 * header line. `csv` and `cfg` are `len` bytes. */
static FILE *
trace_files(char *dir, char *csv, char *cfg, size_t len)
{
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(csv, len, "%s/t.csv", dir);
	snprintf(cfg, len, "%s/q.yaml", dir);
	FILE *f = fopen(cfg, "w");
	ck_assert_ptr_nonnull(f);
	fputs("quotas:\n  default: {tokens_per_second: 10, burst: 20}\n"
	      "  callers:\n    - identity: a\n      tokens_per_second: 100\n"
	      "      burst: 100\n  endpoint_weights:\n    default: 1\n"
	      "    /export: 5\n",
	    f);
	fclose(f);
	f = fopen(csv, "w");
	ck_assert_ptr_nonnull(f);
	fputs("time_s,replica,caller,endpoint\n", f);
	return f;
}

/* The scenario of trace `csv` with the quota file `cfg`, loaded. */
static void
load_trace(const char *csv, const char *cfg, sim_scenario *s)
{
	char err[256] = "";
	ck_assert_msg(sim_scenario_trace(
	                  csv, cfg, NULL, 0, s, err, sizeof err) == ALLOT_OK,
	    "%s", err);
}

START_TEST(trace_file)
{
	char dir[] = "/tmp/allot-sim-XXXXXX";
	char csv[64], cfg[64];
	FILE *f = trace_files(dir, csv, cfg, sizeof csv);
	/* 300/s of caller a for 10 s on two replicas, one in twenty an
	 * export; plus a few unknown callers. */
	double offered = 0;
	for (int i = 0; i < 3000; i++) {
		bool exp = i % 20 == 0;
		fprintf(f, "%.6f,%s,%s,%s\n", i / 300.0,
		    i % 3 ? "pod-a" : "pod-b", i % 100 == 7 ? "mallory" : "a",
		    exp ? "/export" : "/list");
		if (i % 100 != 7)
			offered += exp ? 5 : 1;
	}
	fclose(f);
	char err[256] = "";
	sim_scenario s;
	load_trace(csv, cfg, &s);
	ck_assert_uint_eq(s.nreplicas, 2);
	ck_assert_uint_eq(s.narr, 3000);
	sim_params p;
	sim_params_init(&p);
	sim_result r;
	ck_assert_int_eq(sim_run(&s, &p, &r), ALLOT_OK);
	sim_scenario_free(&s);
	ck_assert_str_eq(r.keys[0].identity, "a");
	ck_assert_double_eq_tol(r.keys[0].offered, offered, 1e-9);
	/* Demand 3x R: everyone admits about R for 10 s plus B. */
	for (int m = 0; m < SIM_NMODES; m++)
		ck_assert(r.keys[0].f[m].admitted < 100 * 11 + 100 + 1);
	ck_assert(r.keys[0].f[SIM_ALLOT].admitted > 900);
	assert_invariants(&r);
	/* A schedule: the second replica crashes at 5 s; its arrivals
	 * after that are dropped. */
	ck_assert_int_eq(
	    sim_scenario_trace(csv, cfg, "0:+2,5:x1", 0, &s, err, sizeof err),
	    ALLOT_OK);
	ck_assert_uint_lt(s.narr, 3000);
	sim_scenario_free(&s);
	/* Bad input is refused with a message. */
	ck_assert_int_ne(
	    sim_scenario_trace(csv, cfg, "5:y1", 0, &s, err, sizeof err),
	    ALLOT_OK);
	ck_assert_ptr_nonnull(strstr(err, "schedule"));
	f = fopen(csv, "w");
	fputs("1.0,pod-a,a\n", f);
	fclose(f);
	ck_assert_int_ne(
	    sim_scenario_trace(csv, cfg, NULL, 0, &s, err, sizeof err),
	    ALLOT_OK);
	ck_assert_ptr_nonnull(strstr(err, ":1:"));
	unlink(csv);
	unlink(cfg);
	rmdir(dir);
	ck_assert_int_eq(
	    sim_scenario_builtin("nope", &p, 0, false, &s, err, sizeof err),
	    ALLOT_ENOENT);
}
END_TEST

/* What `allot-sim ARGS` printed on stdout and stderr, without the
 * speed: line (the one figure that depends on the machine); the exit
 * status in *ret_status (-1 if it did not exit). The caller frees. */
static char *
sim_cli(const char *args, int *ret_status)
{
	char cmd[1536], line[1024];
	snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", pc_program("sim/allot-sim"),
	    args);
	FILE *p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	char *out = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&out, &len);
	ck_assert_ptr_nonnull(m);
	while (fgets(line, sizeof line, p) != NULL)
		if (strncmp(line, "speed:", 6) != 0)
			fputs(line, m);
	fclose(m);
	int st = pclose(p);
	*ret_status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
	return out;
}

/* `--trace FILE --sweep` runs the trace once per interval; with -j 2 two
 * threads read the file at once. Their parsing once shared strtok's
 * hidden position: lines read by the other thread came out as parse
 * errors, or it crashed. The trace is long enough (100000 arrivals,
 * tens of milliseconds to parse) that the two readers overlap, and the
 * -j 2 run is repeated to catch a race that needs that overlap. */
START_TEST(trace_sweep_jobs)
{
	char dir[] = "/tmp/allot-sim-XXXXXX";
	char csv[64], cfg[64], args[256];
	FILE *f = trace_files(dir, csv, cfg, sizeof csv);
	for (int i = 0; i < 100000; i++)
		fprintf(f, "%.6f,%s,%s,%s\n", i / 5000.0,
		    i % 3 ? "pod-a" : "pod-b", i % 100 == 7 ? "mallory" : "a",
		    i % 20 == 0 ? "/export" : "/list");
	fclose(f);
	int st1, st2;
	snprintf(args, sizeof args, "--trace %s --config %s --sweep -j 1", csv,
	    cfg);
	char *one = sim_cli(args, &st1);
	ck_assert_msg(st1 == 0, "-j 1: status %d: %s", st1, one);
	/* Four rows, one per interval, after the header. */
	ck_assert_ptr_nonnull(strstr(one, "trace       1000 |"));
	snprintf(args, sizeof args, "--trace %s --config %s --sweep -j 2", csv,
	    cfg);
	for (int k = 0; k < 3; k++) {
		char *two = sim_cli(args, &st2);
		ck_assert_msg(st2 == 0, "-j 2: status %d: %s", st2, two);
		ck_assert_str_eq(two, one);
		free(two);
	}
	free(one);
	unlink(csv);
	unlink(cfg);
	rmdir(dir);
}
END_TEST

/* A family's run at `seed`, 20 simulated s; the scenario is kept in `s`
 * for the caller to free. */
static void
run_family(const char *name, uint64_t seed, sim_scenario *s, sim_result *r)
{
	sim_params p;
	sim_params_init(&p);
	p.seed = seed;
	char err[256] = "";
	ck_assert_msg(sim_scenario_builtin(
	                  name, &p, 20, false, s, err, sizeof err) == ALLOT_OK,
	    "%s: %s", name, err);
	ck_assert_uint_gt(s->narr, 0);
	ck_assert_int_eq(sim_run(s, &p, r), ALLOT_OK);
}

/* Every family, seeds 1..3: parameters that change with the seed,
 * callers below their quota (restart's flooder, caller-4, apart), the
 * ideal bucket within B + R W and grants within R. All but restart also
 * keep allot within one interval of over-admission and the agents
 * within the live bound today. Under a sanitizer seeds 1 and 2. */
START_TEST(families_bounded)
{
	const uint64_t nseeds = SEEDS(3);
	for (size_t i = 0; sim_family_names[i] != NULL; i++) {
		const char *name = sim_family_names[i];
		bool restart = strcmp(name, "restart") == 0;
		uint32_t nrep[3];
		for (uint64_t seed = 1; seed <= nseeds; seed++) {
			sim_scenario s;
			sim_result r;
			run_family(name, seed, &s, &r);
			ck_assert(s.restart == restart);
			nrep[seed - 1] = s.nreplicas;
			for (size_t k = 0; k < r.nkeys; k++)
				ck_assert_msg((restart && k == 4) ||
				        r.keys[k].offered <
				            r.keys[k].rate * r.duration_s,
				    "%s seed %llu: %s above its quota", name,
				    (unsigned long long) seed,
				    r.keys[k].identity);
			ck_assert(r.over[SIM_IDEAL] <= 1e-9);
			ck_assert(r.max_granted_ratio <= 1 + 1e-9);
			ck_assert_msg(r.denials_refuted == 0,
			    "%s seed %llu: %llu honest denial reports refuted",
			    name, (unsigned long long) seed,
			    (unsigned long long) r.denials_refuted);
			/* Tokens move between the reserve and the buckets
			 * (a part of one included), never made. */
			ck_assert_msg(r.max_tokens_over_burst <= 1e-9,
			    "%s seed %llu: the buckets and the reserve held "
			    "%.3g B above B",
			    name, (unsigned long long) seed,
			    r.max_tokens_over_burst);
			if (!restart)
				assert_invariants(&r);
			sim_scenario_free(&s);
		}
		ck_assert_msg(
		    nseeds < 3 || nrep[0] != nrep[1] || nrep[1] != nrep[2],
		    "%s: the same replica count for every seed", name);
	}
}
END_TEST

/* The ceiling's level (docs/allocation.md): local only, an idle caller's
 * fan-out under an overcommitted ceiling is admitted as the equal split
 * admits it (seeds 5 and 18 refused 23.4 and 12.3 % of it before, the
 * split none), and the ceiling stays within its bound. Under a
 * sanitizer seed 5 alone, to keep the suite within half its timeout. */
START_TEST(ceiling_local_never_below_split)
{
	const uint64_t seeds[] = { 5, 18 };
	size_t nseeds = SEEDS(2);
	for (size_t i = 0; i < nseeds; i++) {
		sim_params p;
		sim_params_init(&p);
		p.seed = seeds[i];
		char err[256] = "";
		sim_scenario s;
		sim_result r;
		ck_assert_int_eq(sim_scenario_builtin("ceiling", &p, 0, false,
		                     &s, err, sizeof err),
		    ALLOT_OK);
		ck_assert_int_eq(sim_run(&s, &p, &r), ALLOT_OK);
		sim_scenario_free(&s);
		ck_assert_msg(r.under[SIM_LOCAL] <= r.under[SIM_SPLIT] + 0.005,
		    "seed %llu: local only refused %.2f %%, the split %.2f %%",
		    (unsigned long long) seeds[i], 100 * r.under[SIM_LOCAL],
		    100 * r.under[SIM_SPLIT]);
		ck_assert(r.over[SIM_LOCAL] <= 1.0 + r.bootstrap);
	}
}
END_TEST

/* Every caller idle, then all of them fanning out their whole burst at
 * once over every replica, under a ceiling their quotas sum to twice
 * of: what the ceiling's level lets the quotas spend beyond their cut
 * parts is within the ceiling's bound, B_C + C W, in every window. */
START_TEST(ceiling_level_bound)
{
	char dir[] = "/tmp/allot-sim-XXXXXX";
	char csv[64], cfg[64];
	FILE *f = trace_files(dir, csv, cfg, sizeof csv);
	fclose(f);
	f = fopen(cfg, "w");
	ck_assert_ptr_nonnull(f);
	fputs("quotas:\n  default: {tokens_per_second: 10, burst: 20}\n"
	      "  callers:\n",
	    f);
	for (int c = 0; c < 4; c++)
		fprintf(f,
		    "    - {identity: c%d, tokens_per_second: 100, "
		    "burst: 200}\n",
		    c);
	fputs("  global_ceiling: {tokens_per_second: 200, overcommit: "
	      "true}\n",
	    f);
	fclose(f);
	f = fopen(csv, "w");
	ck_assert_ptr_nonnull(f);
	fputs("time_s,replica,caller,endpoint\n", f);
	/* A trickle of c0 for 12 s; at 6 s every caller sends 200 within
	 * 0.2 s round the four replicas, and again at 9 s. */
	for (int i = 0; i < 120; i++)
		fprintf(f, "%.3f,r%d,c0,/x\n", i / 10.0, i % 4);
	for (int at = 6; at <= 9; at += 3)
		for (int c = 0; c < 4; c++)
			for (int i = 0; i < 200; i++)
				fprintf(f, "%.6f,r%d,c%d,/x\n",
				    at + (i * 4 + c) * 0.2 / 800, i % 4, c);
	fclose(f);
	sim_scenario s;
	load_trace(csv, cfg, &s);
	sim_params p;
	sim_params_init(&p);
	sim_result r;
	ck_assert_int_eq(sim_run(&s, &p, &r), ALLOT_OK);
	sim_scenario_free(&s);
	const sim_key *ceil = NULL;
	for (size_t k = 0; k < r.nkeys; k++)
		if (r.keys[k].ceiling)
			ceil = &r.keys[k];
	ck_assert_ptr_nonnull(ceil);
	for (int m = 0; m < SIM_NMODES; m++)
		ck_assert_msg(ceil->f[m].over <= 1.0 + r.bootstrap,
		    "mode %d: the ceiling over-admitted %.3f C*T", m,
		    ceil->f[m].over);
	/* The bursts were admitted in part (B_C is 400 here). */
	ck_assert(ceil->f[SIM_LOCAL].admitted > 400);
	unlink(csv);
	unlink(cfg);
	rmdir(dir);
}
END_TEST

/* restart kills the coordinator for real: the same arrivals without the
 * kill keep every invariant, and with it the coordinator misses ticks
 * (its invariants are checked only while it runs). Seeds 1..3 (1 and 2
 * under a sanitizer). */
START_TEST(family_restart)
{
	for (uint64_t seed = 1; seed <= SEEDS(3); seed++) {
		sim_scenario s;
		sim_result killed, kept;
		run_family("restart", seed, &s, &killed);
		ck_assert(s.outage_to > s.outage_from);
		uint64_t down_ticks = (s.outage_to - s.outage_from) /
		    100000000u;
		s.restart = false;
		s.outage_from = s.outage_to = 0;
		sim_params p;
		sim_params_init(&p);
		p.seed = seed;
		ck_assert_int_eq(sim_run(&s, &p, &kept), ALLOT_OK);
		assert_invariants(&kept);
		/* Every quota is checked at every tick it runs. */
		ck_assert_uint_le(
		    killed.invariant_checks + (down_ticks - 1) * kept.nkeys,
		    kept.invariant_checks);
		/* The flooder is held to its quota until the kill. */
		ck_assert(killed.max_granted_ratio <= 1 + 1e-9);
		sim_scenario_free(&s);
	}
}
END_TEST

/* One member of family `name` with `p` (its seed and T), 60 s. */
static void
run_family_p(const char *name, const sim_params *p, sim_result *r)
{
	sim_scenario s;
	char err[256] = "";
	ck_assert_msg(sim_scenario_builtin(
	                  name, p, 0, false, &s, err, sizeof err) == ALLOT_OK,
	    "%s: %s", name, err);
	ck_assert_int_eq(sim_run(&s, p, r), ALLOT_OK);
	sim_scenario_free(&s);
}

/* Loans (docs/allocation.md, "Loans"): a Pareto burst on one replica
 * gets tokens from the idle others, so `pareto` under-admits less with
 * them than without over seeds 1..6 (1..3 under a sanitizer), and loans
 * keep allot within one interval of over-admission and the agents within the
 * live bound. And a loan's debit is paid even when the lender spent its
 * tokens: in `restart` at T = 50 ms, seed 3 (caller-4 floods at 2.3 R),
 * lenders that could not pay created 4.6 R*T of over-admission. */
START_TEST(loans_move_tokens)
{
	double with = 0, without = 0;
	const uint64_t nseeds = SEEDS(6);
	for (uint64_t seed = 1; seed <= nseeds; seed++) {
		sim_params p;
		sim_params_init(&p);
		p.seed = seed;
		sim_result on, off;
		run_family_p("pareto", &p, &on);
		assert_invariants(&on);
		p.loan_frac = 0;
		run_family_p("pareto", &p, &off);
		/* Loans are for quotas without a central reserve: local
		 * only. */
		with += on.under[SIM_LOCAL];
		without += off.under[SIM_LOCAL];
	}
	ck_assert_msg(with < without - (double) nseeds * 0.01,
	    "pareto: mean under-admission %.2f %% with loans, %.2f %% "
	    "without",
	    100 * with / (double) nseeds, 100 * without / (double) nseeds);
	sim_params p;
	sim_params_init(&p);
	p.seed = 3;
	p.interval_ms = 50;
	sim_result r;
	run_family_p("restart", &p, &r);
	ck_assert_msg(r.over[SIM_ALLOT] <= 1.0,
	    "restart T=50 seed 3: over-admission %.2f R*T", r.over[SIM_ALLOT]);
}
END_TEST

/* Pooled parts (docs/allocation.md, "Pooled parts"): when a fan-out
 * over every replica runs the reserve dry, each replica's bucket holds
 * part of a token that no request there can spend; the reserve keeps
 * the parts it is offered and makes whole tokens of them for the next
 * asker. `fanout` seeds 15 and 18 (its worst without) refused 2.84 and
 * 2.62 % without, 0.71 and 0.57 % with; tokens are moved, never made.
 * Under a sanitizer seed 18 alone. */
START_TEST(pooled_parts_make_tokens)
{
	const uint64_t seeds[] = { 18, 15 };
	size_t nseeds = SEEDS(2);
	for (size_t i = 0; i < nseeds; i++) {
		sim_params p;
		sim_params_init(&p);
		p.seed = seeds[i];
		p.run_local = false;
		sim_result on, off;
		run_family_p("fanout", &p, &on);
		assert_invariants(&on);
		ck_assert(on.max_tokens_over_burst <= 1e-9);
		p.pool = false;
		run_family_p("fanout", &p, &off);
		ck_assert_msg(on.under[SIM_ALLOT] < off.under[SIM_ALLOT] / 2,
		    "fanout seed %llu: %.2f %% refused with the parts pooled, "
		    "%.2f %% without",
		    (unsigned long long) seeds[i], 100 * on.under[SIM_ALLOT],
		    100 * off.under[SIM_ALLOT]);
	}
}
END_TEST

/* The families print the same for any --jobs, one T or the sweep (10
 * simulated s each, 5 under a sanitizer). */
START_TEST(families_jobs)
{
	int st1, st2;
	const char *one_args = ALLOT_TEST_SANITIZED ?
	    "-s families --duration 5 --sweep -j 1" :
	    "-s families --duration 10 --sweep -j 1";
	const char *two_args = ALLOT_TEST_SANITIZED ?
	    "-s families --duration 5 --sweep -j 2" :
	    "-s families --duration 10 --sweep -j 2";
	char *one = sim_cli(one_args, &st1);
	ck_assert_msg(st1 == 0, "-j 1: status %d: %s", st1, one);
	for (size_t i = 0; sim_family_names[i] != NULL; i++)
		ck_assert_ptr_nonnull(strstr(one, sim_family_names[i]));
	char *two = sim_cli(two_args, &st2);
	ck_assert_msg(st2 == 0, "-j 2: status %d: %s", st2, two);
	ck_assert_str_eq(two, one);
	free(one);
	free(two);
}
END_TEST

static Suite *
sim_suite(void)
{
	Suite *s = suite_create("sim");
	TCase *tc = tcase_create("targets");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, every_scenario_bounded);
	tcase_add_test(tc, loans_move_tokens);
	tcase_add_test(tc, sticky_and_skewed);
	tcase_add_test(tc, overload_priorities);
	tcase_add_test(tc, convergence);
	tcase_add_test(tc, noisy_neighbour);
	tcase_add_test(tc, outage_and_loss);
	tcase_add_test(tc, deterministic);
	tcase_add_test(tc, interval_sweep);
	tcase_add_test(tc, trace_file);
	tcase_add_test(tc, trace_sweep_jobs);
	tcase_add_test(tc, families_bounded);
	tcase_add_test(tc, family_restart);
	tcase_add_test(tc, families_jobs);
	tcase_add_test(tc, ceiling_local_never_below_split);
	tcase_add_test(tc, ceiling_level_bound);
	tcase_add_test(tc, pooled_parts_make_tokens);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(sim_suite)
