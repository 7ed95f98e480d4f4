/* SPDX-License-Identifier: MIT */
/*
 * The simulator's seeded scenario families (issue 13): traffic shapes
 * where capacity has to move when it is needed, not on the next tick.
 * Unlike the ten built-in scenarios (scenario.c), which keep their shape
 * and draw only their arrivals from the seed, a family draws its
 * parameters too (replica count, quotas, burst sizes, idle times) from
 * ranges, so that the worst of many seeds speaks for the shape rather
 * than for one hand-picked trace. Every caller (but restart's flooder)
 * stays below its quota on average: the under-admission these measure
 * is the one allot promises to keep within one interval. All replicas
 * run for the whole run; the quota file has endpoint "/lookup"
 * (weight 1), and "/heavy" (20) in ramp.
 *
 * - onoff: each caller idle for a random time, then a burst of several
 *   times B spread over all replicas, again and again;
 * - fanout: a "top of the minute" fan-out at 20x R for 0.5 s over every
 *   replica, idle in between (the minute shortened to 12-20 s);
 * - pareto: Pareto-sized bursts, each on one random replica;
 * - ramp: a slow diurnal ramp up to 95 % of R, 5 % of the requests of
 *   weight 20;
 * - restart: steady load; the coordinator is killed and restarted from
 *   its store mid-run (sim.h `restart`). One caller floods at 2-3x its
 *   quota, the one caller that is not below it anywhere: without
 *   demand above R, handing out more than R could not show as
 *   over-admission;
 * - sizing: the illustrative estimate of the service-to-service
 *   reference: 10 callers of R 140 and B 280, sticky, all bursting to
 *   3x R together.
 *
 * The tail path's families (issue 25): shapes a central reserve must
 * serve from wherever the burst lands.
 * - ceiling: a low-priority caller idle for most of a run that fans out
 *   a burst well within its quota, in a service whose quotas sum to
 *   about 1.5 times its ceiling while the traffic stays far below it;
 * - pinned: bursts on long-lived connections pinned to one or two
 *   replicas (gRPC, HTTP/2 clients);
 * - swarm: many small callers bursting together over every replica;
 * - costs: bursts whose requests weigh 1 to 100, heavy-tailed.
 */
#include "scenario_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

const char *const sim_family_names[] = {
	"onoff",
	"fanout",
	"pareto",
	"ramp",
	"restart",
	"sizing",
	"ceiling",
	"pinned",
	"swarm",
	"costs",
	NULL,
};

#define FAM_MAX_CALLERS 16u
#define EP_LOOKUP 0u
#define EP_HEAVY 1u
#define W_HEAVY 20u
/* The endpoints of the heavy-tailed cost mix (costs), after /heavy. */
#define EP_FIVE 2u
#define EP_HUNDRED 3u
#define FAM_MAX_EP 4u

/* A family scenario being built. */
typedef struct fam {
	sim_scenario *s;
	sim_arrvec v;
	uint64_t seed;
	double dur; /* s */
	uint32_t n; /* replicas, all live from 0 to the end */
	size_t nc; /* callers */
	bool heavy; /* the quota file has "/heavy" (ramp) */
	bool costs; /* and "/five" and "/hundred" (costs) */
	double ceiling; /* global_ceiling; 0: none */
	double rate[FAM_MAX_CALLERS];
	double burst[FAM_MAX_CALLERS];
	const char *prio[FAM_MAX_CALLERS]; /* NULL: standard */
	int err;
} fam;

/* What a request to endpoint `ep` costs. */
static const uint32_t ep_weight[FAM_MAX_EP] = { 1, W_HEAVY, 5, 100 };

/* Uniform in [lo, hi). */
static double
between(sim_rng *r, double lo, double hi)
{
	return lo + (hi - lo) * sim_rng_unit(r);
}

/* The seed's parameter stream `k`, apart from every arrival stream. */
static sim_rng
param_rng(const fam *f, uint64_t k)
{
	return sim_rng_stream(f->seed, 0xfa00u + k, 7);
}

static uint32_t
any_replica(const fam *f, sim_rng *r)
{
	return (uint32_t) (sim_rng_unit(r) * f->n) % f->n;
}

static void
emit(fam *f, double t, uint32_t replica, size_t caller, unsigned ep)
{
	if (f->err != ALLOT_OK || !(t >= 0) || t >= f->dur)
		return;
	sim_arrival a = { .t = (uint64_t) (t * SIM_NS),
		.replica = replica,
		.caller = (uint16_t) caller,
		.endpoint = (uint16_t) ep };
	f->err = sim_arr_push(&f->v, a);
}

/* Poisson requests of `caller` at `rps` requests/s over [t0, t1), each
 * of weight 20 with probability p_heavy; `hot` < n takes `frac` of them,
 * the rest go to any replica. */
static void
poisson(fam *f, sim_rng *r, size_t caller, double rps, double t0, double t1,
    double p_heavy, uint32_t hot, double frac)
{
	if (!(rps > 0))
		return;
	for (double t = t0;;) {
		t += -log(1.0 - sim_rng_unit(r)) / rps;
		if (t >= t1 || t >= f->dur || f->err != ALLOT_OK)
			return;
		unsigned ep = sim_rng_unit(r) < p_heavy ? EP_HEAVY : EP_LOOKUP;
		uint32_t rep = hot < f->n && sim_rng_unit(r) < frac ?
		    hot :
		    any_replica(f, r);
		emit(f, t, rep, caller, ep);
	}
}

/* `tokens` lookups at uniform times in [t0, t0 + len), on `replica`
 * (or any replica when it is n or more). */
static void
spread(fam *f, sim_rng *r, size_t caller, double tokens, double t0, double len,
    uint32_t replica)
{
	for (double k = 0; k < tokens && f->err == ALLOT_OK; k++) {
		double t = t0 + len * sim_rng_unit(r);
		emit(f, t, replica < f->n ? replica : any_replica(f, r),
		    caller, EP_LOOKUP);
	}
}

/* Quotas (R, B) for every caller: R in [lo, hi), B = R x [blo, bhi). */
static void
draw_quotas(fam *f, size_t nc, double lo, double hi, double blo, double bhi)
{
	sim_rng r = param_rng(f, 1);
	f->nc = nc;
	for (size_t i = 0; i < nc; i++) {
		f->rate[i] = round(between(&r, lo, hi));
		f->burst[i] = round(f->rate[i] * between(&r, blo, bhi));
	}
}

/* ---- the families ---- */

static void
gen_onoff(fam *f, char *d, size_t dl)
{
	sim_rng pr = param_rng(f, 2);
	f->n = 4 + (uint32_t) (sim_rng_unit(&pr) * 13);
	draw_quotas(f, 4, 500, 2000, 0.5, 2);
	double k = between(&pr, 2, 5); /* burst = k x B */
	double len = between(&pr, 0.1, 1.0);
	double spread_idle = between(&pr, 1.5, 3);
	snprintf(d, dl,
	    "onoff: %u replicas, 4 callers idle for 2 k B / R to %.1f times "
	    "that, then k B = %.1f x B within %.2f s over all replicas",
	    f->n, spread_idle, k, len);
	for (size_t c = 0; c < f->nc; c++) {
		sim_rng r = sim_rng_stream(f->seed, c + 1, 11);
		/* Idle long enough that the average stays at most R / 2. */
		double idle_lo = fmax(
		    2.0, 2 * k * f->burst[c] / f->rate[c] - len);
		double idle_hi = idle_lo * spread_idle;
		double t = between(&r, 0, idle_hi);
		while (t < f->dur && f->err == ALLOT_OK) {
			spread(f, &r, c, k * f->burst[c], t, len, f->n);
			t += len + between(&r, idle_lo, idle_hi);
		}
	}
}

static void
gen_fanout(fam *f, char *d, size_t dl)
{
	sim_rng pr = param_rng(f, 2);
	f->n = 4 + (uint32_t) (sim_rng_unit(&pr) * 21);
	draw_quotas(f, 4, 200, 1000, 0.5, 2);
	double minute = between(&pr, 12, 20);
	double first = between(&pr, 2, minute);
	double steady = between(&pr, 0.3, 0.7);
	snprintf(d, dl,
	    "fanout: %u replicas; every %.1f s from %.1f s callers 0-2 fan "
	    "out at 20 x R for 0.5 s over all replicas, idle between; "
	    "caller-3 steady at %.0f %% of R",
	    f->n, minute, first, 100 * steady);
	for (size_t c = 0; c < 3; c++) {
		sim_rng r = sim_rng_stream(f->seed, c + 1, 12);
		for (double t = first; t < f->dur && f->err == ALLOT_OK;
		     t += minute) {
			/* The cron fires within a few ms of the minute. */
			double at = t + between(&r, 0, 0.02);
			poisson(f, &r, c, 20 * f->rate[c], at, at + 0.5, 0,
			    f->n, 0);
		}
	}
	sim_rng r = sim_rng_stream(f->seed, 4, 12);
	poisson(f, &r, 3, steady * f->rate[3], 0, f->dur, 0, f->n, 0);
}

/* A Pareto(alpha, xm) size, capped at `cap`. */
static double
pareto_size(sim_rng *r, double alpha, double xm, double cap)
{
	double x = xm / pow(1.0 - sim_rng_unit(r), 1.0 / alpha);
	return x < cap ? x : cap;
}

static void
gen_pareto(fam *f, char *d, size_t dl)
{
	sim_rng pr = param_rng(f, 2);
	f->n = 4 + (uint32_t) (sim_rng_unit(&pr) * 13);
	draw_quotas(f, 4, 500, 2000, 0.5, 2);
	double alpha = between(&pr, 1.2, 2.0);
	double xm = between(&pr, 0.02, 0.1); /* of B */
	double u = between(&pr, 0.3, 0.6); /* mean demand, of R */
	double blen = between(&pr, 0.01, 0.1);
	snprintf(d, dl,
	    "pareto: %u replicas, 4 callers; bursts of Pareto(%.2f, %.3f B) "
	    "tokens (at most 10 B) within %.0f ms, each on one random "
	    "replica; mean demand %.0f %% of R",
	    f->n, alpha, xm, 1000 * blen, 100 * u);
	/* The uncapped mean: the capped one is lower, so the demand is
	 * below u R. */
	double mean = alpha * xm / (alpha - 1);
	for (size_t c = 0; c < f->nc; c++) {
		sim_rng r = sim_rng_stream(f->seed, c + 1, 13);
		double per_s = u * f->rate[c] / (mean * f->burst[c]);
		for (double t = 0; f->err == ALLOT_OK;) {
			t += -log(1.0 - sim_rng_unit(&r)) / per_s;
			if (t >= f->dur)
				break;
			double size = ceil(pareto_size(
			    &r, alpha, xm * f->burst[c], 10 * f->burst[c]));
			spread(f, &r, c, size, t, blen, any_replica(f, &r));
		}
	}
}

static void
gen_ramp(fam *f, char *d, size_t dl)
{
	sim_rng pr = param_rng(f, 2);
	/* At most 12 replicas: B / n stays above the weight 20. */
	f->n = 4 + (uint32_t) (sim_rng_unit(&pr) * 9);
	f->heavy = true;
	draw_quotas(f, 4, 500, 2000, 0.5, 2);
	double lo = between(&pr, 0.2, 0.5);
	snprintf(d, dl,
	    "ramp: %u replicas, 4 callers on a diurnal ramp from %.0f %% to "
	    "95 %% of R and back over the run; 5 %% of requests weigh 20",
	    f->n, 100 * lo);
	const double p_heavy = 0.05;
	const double mean_cost = 1 - p_heavy + p_heavy * W_HEAVY;
	for (size_t c = 0; c < f->nc; c++) {
		sim_rng r = sim_rng_stream(f->seed, c + 1, 14);
		double phase = between(&pr, -0.1, 0.1);
		/* Thinning: candidates at the peak rate, kept with the ramp's
		 * rate over the peak. */
		double peak = 0.95 * f->rate[c] / mean_cost;
		for (double t = 0; f->err == ALLOT_OK;) {
			t += -log(1.0 - sim_rng_unit(&r)) / peak;
			if (t >= f->dur)
				break;
			double day = 0.5 -
			    0.5 * cos(2 * M_PI * (t / f->dur + phase));
			double keep = (lo + (0.95 - lo) * day) / 0.95;
			bool heavy = sim_rng_unit(&r) < p_heavy;
			uint32_t rep = any_replica(f, &r);
			if (sim_rng_unit(&r) < keep)
				emit(f, t, rep, c,
				    heavy ? EP_HEAVY : EP_LOOKUP);
		}
	}
}

static void
gen_restart(fam *f, char *d, size_t dl)
{
	sim_rng pr = param_rng(f, 2);
	f->n = 4 + (uint32_t) (sim_rng_unit(&pr) * 13);
	draw_quotas(f, 5, 500, 2000, 0.5, 2);
	double kill = f->dur * between(&pr, 0.3, 0.5);
	/* Down for up to the agents' longest reconnect backoff (5 s) and
	 * beyond. */
	double down = between(&pr, 1, 6);
	if (kill + down > f->dur * 0.8)
		down = f->dur * 0.8 - kill;
	f->s->restart = true;
	f->s->outage_from = (uint64_t) (kill * SIM_NS);
	f->s->outage_to = (uint64_t) ((kill + down) * SIM_NS);
	double u[5];
	for (size_t c = 0; c < 4; c++)
		u[c] = between(&pr, 0.5, 0.8);
	u[4] = between(&pr, 2, 3);
	snprintf(d, dl,
	    "restart: %u replicas, 4 callers at 50-80 %% of R and caller-4 "
	    "at %.1f x R (so that over-allocation shows); the coordinator "
	    "killed at %.1f s and restarted from its store %.1f s later",
	    f->n, u[4], kill, down);
	for (size_t c = 0; c < f->nc; c++) {
		sim_rng r = sim_rng_stream(f->seed, c + 1, 15);
		poisson(f, &r, c, u[c] * f->rate[c], 0, f->dur, 0, f->n, 0);
	}
}

static void
gen_sizing(fam *f, char *d, size_t dl)
{
	sim_rng pr = param_rng(f, 2);
	f->n = 4 + (uint32_t) (sim_rng_unit(&pr) * 7);
	f->nc = 10;
	for (size_t c = 0; c < f->nc; c++) {
		f->rate[c] = 140;
		f->burst[c] = 280;
	}
	double every = between(&pr, 8, 15);
	double first = between(&pr, 2, every);
	double bg = between(&pr, 0.3, 0.6);
	snprintf(d, dl,
	    "sizing: %u replicas, 10 callers of R 140, B 280 at %.0f %% of "
	    "R, 80 %% on their own replica; every %.1f s all burst to 420 "
	    "rps for 1 s together",
	    f->n, 100 * bg, every);
	for (size_t c = 0; c < f->nc; c++) {
		sim_rng r = sim_rng_stream(f->seed, c + 1, 16);
		uint32_t hot = (uint32_t) (c % f->n);
		poisson(f, &r, c, bg * 140, 0, f->dur, 0, hot, 0.8);
		for (double t = first; t < f->dur && f->err == ALLOT_OK;
		     t += every) {
			double at = t + between(&r, 0, 0.05);
			poisson(
			    f, &r, c, 420 - bg * 140, at, at + 1, 0, hot, 0.8);
		}
	}
}

/* ceiling: an overcommitted ceiling (the quotas sum to about 1.5 C) over
 * traffic far below it, and a low-priority caller idle for most of the
 * run that fans out a burst of half to all of its B over every replica,
 * now and then. The ceiling binds on configured sums only: allot must
 * not cut that burst because the others could use their quotas. */
static void
gen_ceiling(fam *f, char *d, size_t dl)
{
	sim_rng pr = param_rng(f, 2);
	f->n = 4 + (uint32_t) (sim_rng_unit(&pr) * 9);
	draw_quotas(f, 5, 200, 600, 1, 2);
	double sum = 0;
	for (size_t c = 0; c < f->nc; c++)
		sum += f->rate[c];
	f->ceiling = round(sum / between(&pr, 1.4, 1.6));
	f->prio[0] = "critical";
	f->prio[4] = "low";
	double bg = between(&pr, 0.1, 0.3);
	double k = between(&pr, 0.5, 1.0);
	double len = between(&pr, 0.2, 1.0);
	double every = between(&pr, 15, 30);
	snprintf(d, dl,
	    "ceiling: %u replicas, ceiling %.0f under quotas summing to "
	    "%.0f; callers 0-3 at %.0f %% of R; caller-4 (low) idle, every "
	    "%.0f s a fan-out of %.2f x B within %.2f s over all replicas",
	    f->n, f->ceiling, sum, 100 * bg, every, k, len);
	for (size_t c = 0; c < 4; c++) {
		sim_rng r = sim_rng_stream(f->seed, c + 1, 17);
		poisson(f, &r, c, bg * f->rate[c], 0, f->dur, 0, f->n, 0);
	}
	sim_rng r = sim_rng_stream(f->seed, 5, 17);
	for (double t = between(&r, 3, every); t < f->dur; t += every)
		spread(f, &r, 4, round(k * f->burst[4]), t, len, f->n);
}

/* pinned: each caller's connections pinned to one or two replicas; its
 * bursts of 0.5-2 B land there within 20-200 ms. */
static void
gen_pinned(fam *f, char *d, size_t dl)
{
	sim_rng pr = param_rng(f, 2);
	f->n = 4 + (uint32_t) (sim_rng_unit(&pr) * 13);
	draw_quotas(f, 4, 500, 2000, 0.5, 2);
	double u = between(&pr, 0.3, 0.6);
	double blen = between(&pr, 0.02, 0.2);
	snprintf(d, dl,
	    "pinned: %u replicas, 4 callers pinned to one or two replicas "
	    "each; bursts of 0.5-2 B within %.0f ms there; mean demand "
	    "%.0f %% of R",
	    f->n, 1000 * blen, 100 * u);
	for (size_t c = 0; c < f->nc; c++) {
		sim_rng r = sim_rng_stream(f->seed, c + 1, 18);
		uint32_t pin[2] = { any_replica(f, &r), any_replica(f, &r) };
		uint32_t npin = sim_rng_unit(&r) < 0.5 ? 1 : 2;
		double per_s = u * f->rate[c] / (1.25 * f->burst[c]);
		for (double t = 0; f->err == ALLOT_OK;) {
			t += -log(1.0 - sim_rng_unit(&r)) / per_s;
			if (t >= f->dur)
				break;
			double size = round(between(&r, 0.5, 2) * f->burst[c]);
			uint32_t rep =
			    pin[(uint32_t) (sim_rng_unit(&r) * npin) % npin];
			spread(f, &r, c, size, t, blen, rep);
		}
	}
}

/* swarm: 12-16 small callers (R 20-100) at a tenth to a third of their
 * quotas, all bursting half to all of their B together over every
 * replica, every 5-15 s. */
static void
gen_swarm(fam *f, char *d, size_t dl)
{
	sim_rng pr = param_rng(f, 2);
	f->n = 4 + (uint32_t) (sim_rng_unit(&pr) * 9);
	size_t nc = 12 + (size_t) (sim_rng_unit(&pr) * 5);
	draw_quotas(
	    f, nc < FAM_MAX_CALLERS ? nc : FAM_MAX_CALLERS, 20, 100, 1, 3);
	double bg = between(&pr, 0.1, 0.3);
	double every = between(&pr, 5, 15);
	double len = between(&pr, 0.1, 0.5);
	snprintf(d, dl,
	    "swarm: %u replicas, %zu callers of R 20-100 at %.0f %% of R; "
	    "every %.1f s all burst 0.5-1 B within %.2f s over all replicas",
	    f->n, f->nc, 100 * bg, every, len);
	double first = between(&pr, 1, every);
	for (size_t c = 0; c < f->nc; c++) {
		sim_rng r = sim_rng_stream(f->seed, c + 1, 19);
		poisson(f, &r, c, bg * f->rate[c], 0, f->dur, 0, f->n, 0);
		for (double t = first; t < f->dur && f->err == ALLOT_OK;
		     t += every)
			spread(f, &r, c,
			    round(between(&r, 0.5, 1) * f->burst[c]),
			    t + between(&r, 0, 0.05), len, f->n);
	}
}

/* costs: bursts on one random replica whose requests weigh 1 (80 %), 5
 * (15 %), 20 (4 %) or 100 (1 %), over a background of light requests. */
static void
gen_costs(fam *f, char *d, size_t dl)
{
	sim_rng pr = param_rng(f, 2);
	f->n = 4 + (uint32_t) (sim_rng_unit(&pr) * 9);
	f->heavy = f->costs = true;
	draw_quotas(f, 4, 1000, 3000, 1, 2);
	double u = between(&pr, 0.3, 0.6);
	double blen = between(&pr, 0.02, 0.1);
	snprintf(d, dl,
	    "costs: %u replicas, 4 callers; bursts of 0.2-1 B within %.0f "
	    "ms on one random replica, requests of weight 1, 5, 20 or 100 "
	    "(80/15/4/1 %%); mean demand %.0f %% of R",
	    f->n, 1000 * blen, 100 * u);
	/* The mean weight: 0.8 + 0.75 + 0.8 + 1. */
	const double mean_w = 3.35;
	for (size_t c = 0; c < f->nc; c++) {
		sim_rng r = sim_rng_stream(f->seed, c + 1, 20);
		double per_s = u * f->rate[c] / (0.6 * f->burst[c]);
		for (double t = 0; f->err == ALLOT_OK;) {
			t += -log(1.0 - sim_rng_unit(&r)) / per_s;
			if (t >= f->dur)
				break;
			double tokens = between(&r, 0.2, 1) * f->burst[c];
			uint32_t rep = any_replica(f, &r);
			for (double k = 0; k < tokens / mean_w; k++) {
				double x = sim_rng_unit(&r);
				unsigned ep = x < 0.8 ? EP_LOOKUP :
				    x < 0.95          ? EP_FIVE :
				    x < 0.99          ? EP_HEAVY :
				                        EP_HUNDRED;
				emit(f, t + blen * sim_rng_unit(&r), rep, c,
				    ep);
			}
		}
	}
}

/* ---- assembly ---- */

/* The quota file: callers spiffe://sim/caller-<i>, endpoint "/lookup"
 * (1), and "/heavy" (20) in ramp only: an agent's and the split's
 * buckets hold at least the largest weight, so that a request of it can
 * pass at all, and with small B / n that floor alone would add up to
 * more than B. */
static char *
fam_config(const fam *f)
{
	sim_quota_spec *q = calloc(f->nc > 0 ? f->nc : 1, sizeof *q);
	if (q == NULL)
		return NULL;
	for (size_t i = 0; i < f->nc; i++)
		q[i] = (sim_quota_spec) { f->rate[i], f->burst[i],
			f->prio[i] };
	char weights[128] = "";
	if (f->heavy)
		snprintf(weights, sizeof weights, "    \"/heavy\": %u\n%s",
		    W_HEAVY,
		    f->costs ? "    \"/five\": 5\n    \"/hundred\": 100\n" :
		               "");
	char *t = sim_quota_file(q, f->nc, weights, f->ceiling);
	free(q);
	return t;
}

typedef void (*fam_gen)(fam *f, char *d, size_t dl);

static fam_gen
gen_of(const char *name)
{
	static const struct {
		const char *name;
		fam_gen gen;
	} gens[] = {
		{ "onoff", gen_onoff },
		{ "fanout", gen_fanout },
		{ "pareto", gen_pareto },
		{ "ramp", gen_ramp },
		{ "restart", gen_restart },
		{ "sizing", gen_sizing },
		{ "ceiling", gen_ceiling },
		{ "pinned", gen_pinned },
		{ "swarm", gen_swarm },
		{ "costs", gen_costs },
	};
	for (size_t i = 0; i < sizeof gens / sizeof gens[0]; i++)
		if (strcmp(gens[i].name, name) == 0)
			return gens[i].gen;
	return NULL;
}

/* Whether every caller's offered tokens stay below R x duration. */
static bool
below_quota(const fam *f)
{
	double offered[FAM_MAX_CALLERS] = { 0 };
	for (size_t i = 0; i < f->v.n; i++)
		offered[f->v.a[i].caller] += ep_weight[f->v.a[i].endpoint];
	for (size_t c = 0; c < f->nc; c++)
		if (offered[c] >= f->rate[c] * f->dur)
			return false;
	return true;
}

int
sim_family_build(const char *name, const sim_params *p, double duration_s,
    sim_scenario *s, char *err, size_t errlen)
{
	fam_gen gen = gen_of(name);
	if (gen == NULL)
		return ALLOT_ENOENT;
	fam f = { .s = s,
		.seed = p->seed,
		.dur = duration_s > 0 ? duration_s : 60,
		.err = ALLOT_OK };
	char d[256];
	gen(&f, d, sizeof d);
	snprintf(s->name, sizeof s->name, "%s", name);
	s->description = strdup(d);
	s->duration = (uint64_t) (f.dur * SIM_NS);
	s->nreplicas = f.n;
	s->changes = calloc(f.n, sizeof *s->changes);
	s->config_text = fam_config(&f);
	if (f.err != ALLOT_OK || s->description == NULL ||
	    s->changes == NULL || s->config_text == NULL) {
		free(f.v.a);
		snprintf(err, errlen, "out of memory");
		return ALLOT_ENOMEM;
	}
	for (uint32_t r = 0; r < f.n; r++)
		s->changes[r] = (sim_change) {
			.t = 0, .replica = r, .kind = SIM_START
		};
	s->nchanges = f.n;
	sim_sort_arrivals(f.v.a, f.v.n);
	s->arr = f.v.a;
	s->narr = f.v.n;
	s->demand_below_r = below_quota(&f);
	return allot_config_parse(s->name, s->config_text,
	    strlen(s->config_text), err, errlen, &s->cfg);
}
