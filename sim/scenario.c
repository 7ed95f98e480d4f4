/* SPDX-License-Identifier: MIT */
/*
 * The simulator's scenarios (sim.h): the ten built-in ones and arrival
 * traces (the seeded families of issue 13 are sim/families.c's, built
 * through the same sim_scenario_builtin). A built-in scenario writes its quota
 * file, its replica schedule and its arrivals: every caller is a Poisson
 * stream of requests (5 % of them exports of weight 10, the rest lookups of
 * weight 1) with its own random generator, so dropping one caller leaves the
 * others' arrivals unchanged, and a load-balancing rule sends each request to
 * a replica live at that instant (uniform, sticky or Zipf). docs/allocation.md
 * describes each scenario and the trace format.
 */
#include "sim.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "scenario_int.h"

const char *const sim_scenario_names[] = {
	"uniform",
	"sticky",
	"skewed",
	"burst",
	"scaleup",
	"scaledown",
	"crash",
	"noisy",
	"overload",
	"outage",
	NULL,
};

void
sim_params_init(sim_params *p)
{
	memset(p, 0, sizeof *p);
	p->interval_ms = 100;
	p->seed = 1;
	p->latency_ms = 1.0;
	p->latency_jitter_ms = 0.5;
	p->loss = 0;
	p->sync_jitter = 0.1;
	p->lease_ms = 3000;
	p->loan_frac = -1;
	p->expiry_intervals = 5;
	p->central_rtt_ms = 1.0;
	p->central_serve_ms = 0.05;
	p->wait_ms = (double) ALLOT_WAIT_DEFAULT_NS / 1e6;
	p->pool = true;
	p->run_local = true;
}

/* ---- building blocks ---- */

static void set_err(char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void
set_err(char *err, size_t len, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, len, fmt, ap);
	va_end(ap);
}

int
sim_arr_push(sim_arrvec *v, sim_arrival x)
{
	if (v->n == v->cap) {
		size_t cap = v->cap ? v->cap * 2 : 4096;
		sim_arrival *na = realloc(v->a, cap * sizeof *na);
		if (na == NULL)
			return ALLOT_ENOMEM;
		v->a = na;
		v->cap = cap;
	}
	v->a[v->n++] = x;
	return ALLOT_OK;
}

static int
cmp_arrival(const void *pa, const void *pb)
{
	const sim_arrival *a = pa, *b = pb;
	if (a->t != b->t)
		return a->t < b->t ? -1 : 1;
	if (a->caller != b->caller)
		return a->caller < b->caller ? -1 : 1;
	if (a->replica != b->replica)
		return a->replica < b->replica ? -1 : 1;
	return (int) a->endpoint - (int) b->endpoint;
}

/* Sort arrivals into cmp_arrival's order: a bottom-up merge of the
 * ascending runs already there. Every caller's Poisson stream comes out
 * of gen_caller in order, so four callers are sorted in two passes
 * (qsort took a fifth of `allot-sim -s all`). cmp_arrival orders by every
 * field of a sim_arrival (which has no padding), so arrivals that compare
 * equal are identical and the result is exactly qsort's. */
static bool
arr_le(const sim_arrival *a, const sim_arrival *b)
{
	return cmp_arrival(a, b) <= 0;
}

/* The end of the ascending run that starts at i. */
static size_t
run_end(const sim_arrival *a, size_t i, size_t n)
{
	while (i + 1 < n && arr_le(&a[i], &a[i + 1]))
		i++;
	return i + 1;
}

/* cmp_arrival's order as one 128-bit key. */
__extension__ typedef unsigned __int128 arr_key;

static arr_key
key_of(const sim_arrival *a)
{
	return (arr_key) a->t << 64 | (arr_key) a->caller << 48 |
	    (arr_key) a->replica << 16 | a->endpoint;
}

/* Merge up to four runs (b[r] .. b[r + 1]) of src into dst in one pass,
 * without a branch on the choice: each step takes the least of the four
 * heads (an exhausted run's head is the largest key). */
#define MERGE_WAYS 4

static void
merge_ways(const sim_arrival *src, sim_arrival *dst, const size_t *b, int nr,
    size_t n)
{
	const arr_key done = ~(arr_key) 0;
	size_t x[MERGE_WAYS], end[MERGE_WAYS];
	arr_key k[MERGE_WAYS];
	for (int r = 0; r < MERGE_WAYS; r++) {
		x[r] = r < nr ? b[r] : 0;
		end[r] = r < nr ? b[r + 1] : 0;
		k[r] = x[r] < end[r] ? key_of(&src[x[r]]) : done;
	}
	for (size_t o = 0; o < n; o++) {
		int m01 = k[1] < k[0], m23 = 2 + (k[3] < k[2]);
		int m = k[m23] < k[m01] ? m23 : m01;
		dst[o] = src[x[m]];
		x[m]++;
		k[m] = x[m] < end[m] ? key_of(&src[x[m]]) : done;
	}
}

void
sim_sort_arrivals(sim_arrival *a, size_t n)
{
	if (n < 2 || run_end(a, 0, n) == n)
		return;
	sim_arrival *tmp = malloc(n * sizeof *tmp);
	if (tmp == NULL) {
		qsort(a, n, sizeof *a, cmp_arrival);
		return;
	}
	/* A scenario's callers: a few runs, merged in one pass. */
	size_t b[MERGE_WAYS + 1];
	int nr = 0;
	for (size_t i = 0; i < n && nr <= MERGE_WAYS; nr++) {
		if (nr < MERGE_WAYS)
			b[nr] = i;
		i = run_end(a, i, n);
		if (nr < MERGE_WAYS)
			b[nr + 1] = i;
	}
	if (nr <= MERGE_WAYS) {
		merge_ways(a, tmp, b, nr, n);
		memcpy(a, tmp, n * sizeof *a);
		free(tmp);
		return;
	}
	sim_arrival *src = a, *dst = tmp;
	for (;;) {
		size_t i = 0, runs = 0;
		while (i < n) {
			size_t j = run_end(src, i, n);
			size_t k = j < n ? run_end(src, j, n) : n;
			size_t x = i, y = j, o = i;
			while (x < j && y < k)
				dst[o++] = arr_le(&src[x], &src[y]) ?
				    src[x++] :
				    src[y++];
			memcpy(&dst[o], &src[x], (j - x) * sizeof *dst);
			o += j - x;
			memcpy(&dst[o], &src[y], (k - y) * sizeof *dst);
			i = k;
			runs++;
		}
		sim_arrival *t = src;
		src = dst;
		dst = t;
		if (runs == 1)
			break;
	}
	if (src != a)
		memcpy(a, src, n * sizeof *a);
	free(tmp);
}

static int
cmp_change(const void *pa, const void *pb)
{
	const sim_change *a = pa, *b = pb;
	if (a->t != b->t)
		return a->t < b->t ? -1 : 1;
	if (a->kind != b->kind)
		return (int) a->kind - (int) b->kind;
	return a->replica < b->replica ? -1 : a->replica > b->replica;
}

/* The live replicas between consecutive changes. */
typedef struct epochs {
	size_t n;
	uint64_t *from; /* epoch i covers [from[i], from[i + 1]) */
	uint32_t **live; /* replica ids, in id order */
	uint32_t *nlive;
} epochs;

static void
epochs_free(epochs *e)
{
	for (size_t i = 0; i < e->n; i++)
		free(e->live[i]);
	free(e->from);
	free(e->live);
	free(e->nlive);
	memset(e, 0, sizeof *e);
}

static int
epochs_build(const sim_scenario *s, epochs *e)
{
	memset(e, 0, sizeof *e);
	size_t cap = s->nchanges + 1;
	e->from = calloc(cap, sizeof *e->from);
	e->live = calloc(cap, sizeof *e->live);
	e->nlive = calloc(cap, sizeof *e->nlive);
	bool *on = calloc(s->nreplicas + 1, sizeof *on);
	if (e->from == NULL || e->live == NULL || e->nlive == NULL ||
	    on == NULL) {
		free(on);
		epochs_free(e);
		return ALLOT_ENOMEM;
	}
	size_t i = 0;
	while (i < s->nchanges) {
		uint64_t t = s->changes[i].t;
		for (; i < s->nchanges && s->changes[i].t == t; i++)
			on[s->changes[i].replica] = s->changes[i].kind ==
			    SIM_START;
		uint32_t *l = malloc((s->nreplicas + 1) * sizeof *l);
		if (l == NULL) {
			free(on);
			epochs_free(e);
			return ALLOT_ENOMEM;
		}
		uint32_t n = 0;
		for (uint32_t r = 0; r < s->nreplicas; r++)
			if (on[r])
				l[n++] = r;
		e->from[e->n] = t;
		e->live[e->n] = l;
		e->nlive[e->n] = n;
		e->n++;
	}
	free(on);
	return ALLOT_OK;
}

/* How a caller's requests are spread over the live replicas. */
typedef enum lb_kind {
	LB_UNIFORM,
	LB_STICKY, /* `frac` on replica `hot`, rest uniform */
	LB_ZIPF, /* weight 1 / rank^s, per-caller ranks */
} lb_kind;

typedef struct caller_spec {
	double rate; /* quota R */
	double burst; /* quota B */
	const char *priority;
	double demand; /* tokens/s of Poisson arrivals */
	lb_kind lb;
	double frac; /* LB_STICKY */
	uint32_t hot;
	double zipf_s; /* LB_ZIPF */
	/* Correlated bursts: every `burst_every` s from `burst_at`, this
	 * many tokens within `burst_len` s (0: none). */
	double burst_tokens;
	double burst_at;
	double burst_every;
	double burst_len;
} caller_spec;

#define P_EXPORT 0.05
#define W_EXPORT 10u
#define MEAN_COST (1.0 + (W_EXPORT - 1.0) * P_EXPORT)

static uint32_t
pick_replica(const caller_spec *c, sim_rng *r, const uint32_t *live,
    uint32_t n, const double *zw)
{
	switch (c->lb) {
	case LB_STICKY: {
		bool hot_live = false;
		for (uint32_t i = 0; i < n; i++)
			hot_live |= live[i] == c->hot;
		if (hot_live && (sim_rng_unit(r) < c->frac || n == 1))
			return c->hot;
		uint32_t others = n - (hot_live ? 1 : 0);
		uint32_t k = (uint32_t) (sim_rng_unit(r) * others);
		for (uint32_t i = 0; i < n; i++) {
			if (hot_live && live[i] == c->hot)
				continue;
			if (k-- == 0)
				return live[i];
		}
		return live[n - 1];
	}
	case LB_ZIPF: {
		double tot = 0;
		for (uint32_t i = 0; i < n; i++)
			tot += zw[live[i]];
		double u = sim_rng_unit(r) * tot;
		for (uint32_t i = 0; i < n; i++) {
			u -= zw[live[i]];
			if (u <= 0)
				return live[i];
		}
		return live[n - 1];
	}
	case LB_UNIFORM: break;
	}
	uint32_t k = (uint32_t) (sim_rng_unit(r) * n);
	return live[k < n ? k : n - 1];
}

static uint16_t
pick_endpoint(sim_rng *r)
{
	/* cfg endpoints: 0 "/lookup" (1), 1 "/export" (10). */
	return sim_rng_unit(r) < P_EXPORT ? 1 : 0;
}

/* The epoch live at t (epochs are sorted; `hint` walks forward). */
static size_t
epoch_at(const epochs *e, uint64_t t, size_t hint)
{
	while (hint + 1 < e->n && e->from[hint + 1] <= t)
		hint++;
	return hint;
}

static int
gen_caller(const sim_scenario *s, const epochs *e, const caller_spec *c,
    uint16_t ci, uint64_t seed, sim_arrvec *out)
{
	sim_rng r = sim_rng_stream(seed, ci + 1, 1);
	sim_rng rr = sim_rng_stream(seed, ci + 1, 2);
	uint32_t perm[SIM_MAX_REPLICAS];
	for (uint32_t i = 0; i < s->nreplicas; i++)
		perm[i] = i;
	/* A different ranking of the replicas for every caller. */
	for (uint32_t i = s->nreplicas; i > 1; i--) {
		uint32_t j = (uint32_t) (sim_rng_unit(&rr) * i);
		uint32_t x = perm[i - 1];
		perm[i - 1] = perm[j < i ? j : i - 1];
		perm[j < i ? j : i - 1] = x;
	}
	/* Zipf weights 1 / rank^s, once per caller rather than per
	 * request. */
	double zw[SIM_MAX_REPLICAS];
	if (c->lb == LB_ZIPF)
		for (uint32_t i = 0; i < s->nreplicas; i++)
			zw[i] = 1.0 / pow((double) (perm[i] + 1), c->zipf_s);
	size_t h = 0;
	double req_rate = c->demand / MEAN_COST;
	if (req_rate > 0) {
		double t = 0;
		double end = (double) s->duration / SIM_NS;
		for (;;) {
			t += -log(1.0 - sim_rng_unit(&r)) / req_rate;
			if (t >= end)
				break;
			uint64_t tn = (uint64_t) (t * SIM_NS);
			h = epoch_at(e, tn, h);
			if (e->n == 0 || tn < e->from[0] || e->nlive[h] == 0)
				continue;
			sim_arrival a = { .t = tn,
				.caller = ci,
				.endpoint = pick_endpoint(&r) };
			a.replica = pick_replica(
			    c, &rr, e->live[h], e->nlive[h], zw);
			if (sim_arr_push(out, a) != ALLOT_OK)
				return ALLOT_ENOMEM;
		}
	}
	if (c->burst_tokens > 0 && c->burst_every > 0) {
		sim_rng rb = sim_rng_stream(seed, ci + 1, 3);
		double end = (double) s->duration / SIM_NS;
		for (double at = c->burst_at; at < end; at += c->burst_every) {
			double tokens = 0;
			while (tokens < c->burst_tokens) {
				double t = at +
				    sim_rng_unit(&rb) * c->burst_len;
				uint64_t tn = (uint64_t) (t * SIM_NS);
				size_t hh = epoch_at(e, tn, 0);
				if (e->nlive[hh] == 0)
					break;
				sim_arrival a = { .t = tn,
					.caller = ci,
					.endpoint = pick_endpoint(&rb) };
				a.replica =
				    e->live[hh][(uint32_t) (sim_rng_unit(&rb) *
				                    e->nlive[hh]) %
				        e->nlive[hh]];
				tokens += a.endpoint == 1 ? W_EXPORT : 1;
				if (sim_arr_push(out, a) != ALLOT_OK)
					return ALLOT_ENOMEM;
			}
		}
	}
	return ALLOT_OK;
}

char *
sim_quota_file(
    const sim_quota_spec *q, size_t n, const char *weights, double ceiling)
{
	size_t cap = 1024 + n * 256 + (weights != NULL ? strlen(weights) : 0);
	char *t = malloc(cap);
	if (t == NULL)
		return NULL;
	size_t len = (size_t) snprintf(t, cap,
	    "# generated by allot-sim\n"
	    "quotas:\n"
	    "  default: {tokens_per_second: 10, burst: 200, priority: low}\n"
	    "  callers:\n");
	for (size_t i = 0; i < n; i++)
		len += (size_t) snprintf(t + len, cap - len,
		    "    - identity: \"spiffe://sim/caller-%zu\"\n"
		    "      tokens_per_second: %.17g\n"
		    "      burst: %.17g\n"
		    "      priority: %s\n",
		    i, q[i].rate, q[i].burst,
		    q[i].priority != NULL ? q[i].priority : "standard");
	len += (size_t) snprintf(t + len, cap - len,
	    "  endpoint_weights:\n    default: 1\n    \"/lookup\": 1\n%s",
	    weights != NULL ? weights : "");
	if (ceiling > 0)
		snprintf(t + len, cap - len,
		    "  global_ceiling:\n"
		    "    tokens_per_second: %.17g\n"
		    "    shed_order: [low, batch, standard, critical]\n",
		    ceiling);
	return t;
}

/* The quota file of a built-in scenario: its callers, "/export" at
 * W_EXPORT, and its ceiling. */
static char *
make_config(const caller_spec *cs, size_t n, double ceiling)
{
	sim_quota_spec *q = calloc(n > 0 ? n : 1, sizeof *q);
	if (q == NULL)
		return NULL;
	for (size_t i = 0; i < n; i++)
		q[i] = (sim_quota_spec) { cs[i].rate, cs[i].burst,
			cs[i].priority };
	char weights[64];
	snprintf(weights, sizeof weights, "    \"/export\": %u\n", W_EXPORT);
	char *t = sim_quota_file(q, n, weights, ceiling);
	free(q);
	return t;
}

static int
add_change(
    sim_scenario *s, size_t *cap, double t, uint32_t r, sim_change_kind k)
{
	if (s->nchanges == *cap) {
		size_t nc = *cap ? *cap * 2 : 32;
		sim_change *a = realloc(s->changes, nc * sizeof *a);
		if (a == NULL)
			return ALLOT_ENOMEM;
		s->changes = a;
		*cap = nc;
	}
	s->changes[s->nchanges++] = (sim_change) {
		.t = (uint64_t) (t * SIM_NS), .replica = r, .kind = k
	};
	return ALLOT_OK;
}

/* Parse the config, build the epochs and generate every caller. */
static int
finish(sim_scenario *s, const caller_spec *cs, size_t ncallers, double ceiling,
    uint64_t seed, int skip_caller, char *err, size_t errlen)
{
	qsort(s->changes, s->nchanges, sizeof *s->changes, cmp_change);
	s->config_text = make_config(cs, ncallers, ceiling);
	if (s->config_text == NULL)
		return ALLOT_ENOMEM;
	int rc = allot_config_parse(s->name, s->config_text,
	    strlen(s->config_text), err, errlen, &s->cfg);
	if (rc != ALLOT_OK)
		return rc;
	epochs e;
	if ((rc = epochs_build(s, &e)) != ALLOT_OK)
		return rc;
	sim_arrvec v = { 0 };
	for (size_t i = 0; i < ncallers && rc == ALLOT_OK; i++)
		if ((int) i != skip_caller)
			rc = gen_caller(s, &e, &cs[i], (uint16_t) i, seed, &v);
	epochs_free(&e);
	if (rc != ALLOT_OK) {
		free(v.a);
		return rc;
	}
	sim_sort_arrivals(v.a, v.n);
	s->arr = v.a;
	s->narr = v.n;
	s->demand_below_r = true;
	for (size_t i = 0; i < ncallers; i++)
		if ((int) i != skip_caller && cs[i].demand >= cs[i].rate)
			s->demand_below_r = false;
	if (ceiling > 0) {
		double d = 0;
		for (size_t i = 0; i < ncallers; i++)
			if ((int) i != skip_caller)
				d += cs[i].demand;
		if (d >= ceiling)
			s->demand_below_r = false;
	}
	return ALLOT_OK;
}

/* What sets a built-in scenario apart from the others, besides its
 * callers. */
typedef struct shape {
	const char *desc;
	double ceiling; /* global ceiling; 0: none */
	uint32_t n0, n1; /* replicas before / after the change; n1 0: none */
	double change_at; /* s */
	sim_change_kind ck; /* how replicas go when n1 < n0 */
	double dur; /* s */
} shape;

enum { NC = 4 }; /* callers of a built-in scenario */

/* The shape and callers of built-in scenario `name`, from the defaults
 * of "uniform"; false if there is no such scenario. Sets the scenario's
 * own fields: graceful, noisy_caller, the outage. */
static bool
builtin_shape(const char *name, sim_scenario *s, caller_spec *cs, shape *sh)
{
	for (size_t i = 0; i < NC; i++)
		cs[i] = (caller_spec) { .rate = 1000,
			.burst = 1000,
			.priority = "standard",
			.demand = 700,
			.lb = LB_UNIFORM };
	*sh = (shape) { .desc = NULL,
		.ceiling = 0,
		.n0 = 8,
		.n1 = 0,
		.change_at = 30,
		.ck = SIM_START,
		.dur = 60 };
	if (strcmp(name, "uniform") == 0) {
		sh->desc = "8 replicas, 4 callers at 70 % of R, requests "
		           "spread evenly";
	} else if (strcmp(name, "sticky") == 0) {
		sh->desc = "8 replicas; 80 % of caller-0's traffic on replica "
		           "0 (sticky streams); demand 70 % of R";
		cs[0].lb = LB_STICKY;
		cs[0].frac = 0.8;
		cs[0].hot = 0;
	} else if (strcmp(name, "skewed") == 0) {
		sh->desc = "8 replicas; each caller's traffic Zipf(1.2) over "
		           "the replicas (its own ranking); demand 70 % of R";
		for (size_t i = 0; i < NC; i++) {
			cs[i].lb = LB_ZIPF;
			cs[i].zipf_s = 1.2;
		}
	} else if (strcmp(name, "burst") == 0) {
		sh->desc = "8 replicas, callers at 30 % of R; every 10 s all "
		           "callers burst B tokens together within 50 ms";
		for (size_t i = 0; i < NC; i++) {
			cs[i].demand = 300;
			cs[i].burst_tokens = cs[i].burst;
			cs[i].burst_at = 5;
			cs[i].burst_every = 10;
			cs[i].burst_len = 0.05;
		}
	} else if (strcmp(name, "scaleup") == 0) {
		sh->desc = "4 -> 16 replicas at 30 s (graceful: the newcomers "
		           "register), demand 70 % of R spread evenly";
		sh->n0 = 4;
		sh->n1 = 16;
	} else if (strcmp(name, "scaledown") == 0) {
		sh->desc = "16 -> 4 replicas at 30 s (graceful: Leave), "
		           "demand 70 % of R spread evenly";
		sh->n0 = 16;
		sh->n1 = 4;
		sh->ck = SIM_LEAVE;
	} else if (strcmp(name, "crash") == 0) {
		sh->desc = "16 -> 4 replicas at 30 s by crash (no Leave: "
		           "expiry after K intervals), demand 70 % of R";
		sh->n0 = 16;
		sh->n1 = 4;
		sh->ck = SIM_CRASH;
		s->graceful = false;
	} else if (strcmp(name, "noisy") == 0) {
		sh->desc = "8 replicas, ceiling 3000 over 4 quotas of 1000; "
		           "caller-3 at 10x its quota, the others at 60 %";
		sh->ceiling = 3000;
		for (size_t i = 0; i < NC; i++)
			cs[i].demand = 600;
		cs[3].demand = 10000;
		s->noisy_caller = 3;
	} else if (strcmp(name, "overload") == 0) {
		sh->desc = "8 replicas, ceiling 2500 over quotas of 1000 in "
		           "classes critical, standard, batch, low; demand 3x "
		           "the ceiling";
		sh->ceiling = 2500;
		static const char *const cls[NC] = { "critical", "standard",
			"batch", "low" };
		for (size_t i = 0; i < NC; i++) {
			cs[i].priority = cls[i];
			cs[i].demand = 3 * sh->ceiling / NC;
		}
	} else if (strcmp(name, "outage") == 0) {
		sh->desc = "8 replicas, demand 70 % of R; the coordinator is "
		           "unreachable from 20 s to 25 s (lease 3 s, then "
		           "fallback)";
		s->outage_from = 20 * SIM_NS;
		s->outage_to = 25 * SIM_NS;
	} else {
		return false;
	}
	return true;
}

/* The replica changes of a shape: n0 start at 0, then at change_at the
 * newcomers start, or the last ones go as `ck` says. */
static int
builtin_changes(sim_scenario *s, const shape *sh)
{
	size_t ccap = 0;
	int rc = ALLOT_OK;
	for (uint32_t r = 0; r < sh->n0 && rc == ALLOT_OK; r++)
		rc = add_change(s, &ccap, 0, r, SIM_START);
	if (sh->n1 > sh->n0)
		for (uint32_t r = sh->n0; r < sh->n1 && rc == ALLOT_OK; r++)
			rc = add_change(s, &ccap, sh->change_at, r, SIM_START);
	else if (sh->n1 != 0 && sh->n1 < sh->n0)
		for (uint32_t r = sh->n1; r < sh->n0 && rc == ALLOT_OK; r++)
			rc = add_change(s, &ccap, sh->change_at, r, sh->ck);
	return rc;
}

int
sim_scenario_builtin(const char *name, const sim_params *p, double duration_s,
    bool without_noisy, sim_scenario *s, char *err, size_t errlen)
{
	memset(s, 0, sizeof *s);
	s->noisy_caller = -1;
	s->graceful = true;
	caller_spec cs[NC];
	shape sh;
	int frc = sim_family_build(name, p, duration_s, s, err, errlen);
	if (frc != ALLOT_ENOENT) {
		if (frc != ALLOT_OK)
			sim_scenario_free(s);
		return frc;
	}
	if (!builtin_shape(name, s, cs, &sh)) {
		set_err(err, errlen, "unknown scenario \"%s\"", name);
		return ALLOT_ENOENT;
	}
	/* A shorter run keeps its change and its outage inside it. */
	if (duration_s > 0)
		sh.dur = duration_s;
	if (sh.change_at >= sh.dur)
		sh.change_at = sh.dur / 2;
	if (s->outage_to > (uint64_t) (sh.dur * SIM_NS)) {
		s->outage_from = (uint64_t) (sh.dur * 0.4 * SIM_NS);
		s->outage_to = (uint64_t) (sh.dur * 0.4 * SIM_NS) +
		    (uint64_t) (fmin(5.0, sh.dur * 0.2) * SIM_NS);
	}
	snprintf(s->name, sizeof s->name, "%s", name);
	s->description = strdup(sh.desc);
	s->duration = (uint64_t) (sh.dur * SIM_NS);
	s->nreplicas = sh.n0 > sh.n1 ? sh.n0 : sh.n1;
	int rc = builtin_changes(s, &sh);
	if (rc == ALLOT_OK)
		rc = finish(s, cs, NC, sh.ceiling, p->seed,
		    without_noisy ? s->noisy_caller : -1, err, errlen);
	if (rc != ALLOT_OK) {
		if (err[0] == '\0')
			set_err(err, errlen, "%s", allot_strerror(rc));
		sim_scenario_free(s);
	}
	return rc;
}

/* ---- traces ---- */

static char *
read_file(const char *path, char *err, size_t errlen)
{
	FILE *f = fopen(path, "rb");
	if (f == NULL) {
		set_err(err, errlen, "%s: %s", path, strerror(errno));
		return NULL;
	}
	size_t cap = 1 << 16, n = 0;
	char *b = malloc(cap);
	while (b != NULL) {
		size_t got = fread(b + n, 1, cap - n - 1, f);
		n += got;
		if (got == 0)
			break;
		if (n + 1 == cap) {
			char *nb = realloc(b, cap * 2);
			if (nb == NULL) {
				free(b);
				b = NULL;
				break;
			}
			b = nb;
			cap *= 2;
		}
	}
	fclose(f);
	if (b == NULL)
		set_err(err, errlen, "%s: out of memory", path);
	else
		b[n] = '\0';
	return b;
}

/* Split one CSV line in place into at most `max` trimmed fields. */
static size_t
split_csv(char *line, char **f, size_t max)
{
	size_t n = 0;
	char *p = line;
	while (n < max) {
		while (*p == ' ' || *p == '\t')
			p++;
		f[n++] = p;
		char *c = strchr(p, ',');
		char *end = c != NULL ? c : p + strlen(p);
		while (end > p && isspace((unsigned char) end[-1]))
			end--;
		if (c == NULL) {
			*end = '\0';
			break;
		}
		*end = '\0';
		p = c + 1;
	}
	return n;
}

/* The replicas a trace names, in order of first appearance: a replica's
 * id is its index here. */
typedef struct trace_names {
	char name[SIM_MAX_REPLICAS][64];
	uint32_t n;
} trace_names;

/* The id of replica `name`, a new one if it was not seen before. */
static int
replica_id(trace_names *rn, const char *name, const char *csv_path,
    size_t lineno, uint32_t *ret, char *err, size_t errlen)
{
	uint32_t r = 0;
	while (r < rn->n && strcmp(rn->name[r], name) != 0)
		r++;
	if (r == rn->n) {
		if (rn->n == SIM_MAX_REPLICAS || strlen(name) >= 64) {
			set_err(err, errlen,
			    "%s:%zu: at most %u "
			    "replicas, names below 64 bytes",
			    csv_path, lineno, SIM_MAX_REPLICAS);
			return ALLOT_EINVAL;
		}
		snprintf(rn->name[rn->n++], 64, "%s", name);
	}
	*ret = r;
	return ALLOT_OK;
}

/* One line of a trace (cut up in place) into *ret. Blank lines, comments
 * and a header on the first line set *ret_skip instead. Callers and
 * endpoints the quota file does not name get the index one past its
 * last, as the coordinator's default quota and weight would. */
static int
parse_trace_line(char *line, size_t lineno, const char *csv_path,
    const allot_config *cfg, trace_names *rn, sim_arrival *ret, bool *ret_skip,
    char *err, size_t errlen)
{
	char *f[4];
	char *hash = strchr(line, '#');
	if (hash != NULL)
		*hash = '\0';
	size_t nf = split_csv(line, f, 4);
	*ret_skip = false;
	if (nf == 1 && f[0][0] == '\0') {
		*ret_skip = true;
		return ALLOT_OK;
	}
	char *end;
	double t = strtod(f[0], &end);
	if (end == f[0] && lineno == 1) {
		*ret_skip = true; /* header */
		return ALLOT_OK;
	}
	if (nf != 4 || *end != '\0' || !(t >= 0) || !isfinite(t)) {
		set_err(err, errlen,
		    "%s:%zu: want time_s,replica,"
		    "caller,endpoint with time_s >= 0",
		    csv_path, lineno);
		return ALLOT_EINVAL;
	}
	uint32_t r;
	int rc = replica_id(rn, f[1], csv_path, lineno, &r, err, errlen);
	if (rc != ALLOT_OK)
		return rc;
	uint16_t c = (uint16_t) cfg->ncallers;
	for (size_t i = 0; i < cfg->ncallers; i++)
		if (strcmp(cfg->callers[i].identity, f[2]) == 0)
			c = (uint16_t) i;
	uint16_t ep = (uint16_t) cfg->nendpoints;
	for (size_t i = 0; i < cfg->nendpoints; i++)
		if (strcmp(cfg->endpoints[i].name, f[3]) == 0)
			ep = (uint16_t) i;
	*ret = (sim_arrival) { .t = (uint64_t) (t * SIM_NS),
		.replica = r,
		.caller = c,
		.endpoint = ep };
	return ALLOT_OK;
}

/* Every arrival of the trace text `csv`, which is cut up in place; the
 * latest time in *ret_tmax. strtok_r, not strtok: `allot-sim --jobs`
 * reads the same trace on several threads at once, and strtok's hidden
 * position made them read each other's lines. Empty lines are skipped
 * without being counted, so line numbers in messages count the others. */
static int
parse_trace(char *csv, const char *csv_path, const allot_config *cfg,
    trace_names *rn, sim_arrvec *v, uint64_t *ret_tmax, char *err,
    size_t errlen)
{
	size_t lineno = 0;
	uint64_t tmax = 0;
	char *save = NULL;
	for (char *line = strtok_r(csv, "\n", &save); line != NULL;
	     line = strtok_r(NULL, "\n", &save)) {
		lineno++;
		sim_arrival a;
		bool skip;
		int rc = parse_trace_line(
		    line, lineno, csv_path, cfg, rn, &a, &skip, err, errlen);
		if (rc != ALLOT_OK)
			return rc;
		if (skip)
			continue;
		if (a.t > tmax)
			tmax = a.t;
		if ((rc = sim_arr_push(v, a)) != ALLOT_OK)
			return rc;
	}
	*ret_tmax = tmax;
	return ALLOT_OK;
}

/* Replica changes from a schedule, "TIME:+N", "TIME:-N", "TIME:xN"
 * comma separated: start the next N replicas, or stop the last N
 * started (by Leave, or by crash). Without a schedule, every replica of
 * the trace starts at 0. */
static int
trace_schedule(sim_scenario *s, const char *schedule, char *err, size_t errlen)
{
	size_t ccap = 0;
	int rc = ALLOT_OK;
	if (schedule == NULL) {
		for (uint32_t r = 0; r < s->nreplicas && rc == ALLOT_OK; r++)
			rc = add_change(s, &ccap, 0, r, SIM_START);
		return rc;
	}
	uint32_t started = 0, stopped = 0;
	char *sc = strdup(schedule), *save = NULL;
	if (sc == NULL)
		return ALLOT_ENOMEM;
	for (char *tok = strtok_r(sc, ",", &save); tok != NULL;
	     tok = strtok_r(NULL, ",", &save)) {
		double t;
		char op;
		unsigned cnt;
		if (sscanf(tok, "%lf:%c%u", &t, &op, &cnt) != 3 || !(t >= 0) ||
		    (op != '+' && op != '-' && op != 'x')) {
			set_err(err, errlen,
			    "schedule item \"%s\": "
			    "want TIME:+N, TIME:-N or TIME:xN",
			    tok);
			free(sc);
			return ALLOT_EINVAL;
		}
		for (unsigned k = 0; k < cnt; k++) {
			if (op == '+') {
				if (started == SIM_MAX_REPLICAS)
					break;
				rc = add_change(
				    s, &ccap, t, started++, SIM_START);
			} else if (started > stopped) {
				rc = add_change(s, &ccap, t,
				    started - 1 - stopped++,
				    op == '-' ? SIM_LEAVE : SIM_CRASH);
				if (op == 'x')
					s->graceful = false;
			}
			if (rc != ALLOT_OK) {
				free(sc);
				return rc;
			}
		}
	}
	free(sc);
	if (started > s->nreplicas)
		s->nreplicas = started;
	qsort(s->changes, s->nchanges, sizeof *s->changes, cmp_change);
	return ALLOT_OK;
}

/* Keep, in order, the arrivals at replicas live at their time and
 * before the end; *ret_kept: how many. */
static int
keep_live(const sim_scenario *s, sim_arrival *a, size_t n, size_t *ret_kept)
{
	epochs e;
	int rc = epochs_build(s, &e);
	if (rc != ALLOT_OK)
		return rc;
	size_t h = 0, kept = 0;
	for (size_t i = 0; i < n; i++) {
		h = epoch_at(&e, a[i].t, h);
		bool live = false;
		for (uint32_t j = 0;
		     e.n > 0 && a[i].t >= e.from[0] && j < e.nlive[h]; j++)
			live |= e.live[h][j] == a[i].replica;
		if (live && a[i].t < s->duration)
			a[kept++] = a[i];
	}
	epochs_free(&e);
	*ret_kept = kept;
	return ALLOT_OK;
}

int
sim_scenario_trace(const char *csv_path, const char *config_path,
    const char *schedule, double duration_s, sim_scenario *s, char *err,
    size_t errlen)
{
	memset(s, 0, sizeof *s);
	s->noisy_caller = -1;
	s->graceful = true;
	err[0] = '\0';
	int rc = ALLOT_EINVAL;
	char *csv = NULL;
	trace_names rn = { .n = 0 };
	sim_arrvec v = { 0 };
	uint64_t tmax = 0;
	size_t kept = 0;
	snprintf(s->name, sizeof s->name, "trace");
	if ((s->config_text = read_file(config_path, err, errlen)) == NULL)
		goto fail;
	if ((rc = allot_config_parse(config_path, s->config_text,
	         strlen(s->config_text), err, errlen, &s->cfg)) != ALLOT_OK)
		goto fail;
	if ((csv = read_file(csv_path, err, errlen)) == NULL) {
		rc = ALLOT_EIO;
		goto fail;
	}
	rc = parse_trace(csv, csv_path, s->cfg, &rn, &v, &tmax, err, errlen);
	if (rc != ALLOT_OK)
		goto fail;
	if (v.n == 0) {
		set_err(err, errlen, "%s: no arrivals", csv_path);
		rc = ALLOT_EINVAL;
		goto fail;
	}
	sim_sort_arrivals(v.a, v.n);
	s->duration = duration_s > 0 ? (uint64_t) (duration_s * SIM_NS) :
	                               tmax + SIM_NS;
	s->nreplicas = rn.n;
	if ((rc = trace_schedule(s, schedule, err, errlen)) != ALLOT_OK ||
	    (rc = keep_live(s, v.a, v.n, &kept)) != ALLOT_OK)
		goto fail;
	s->arr = v.a;
	s->narr = kept;
	char d[160];
	snprintf(d, sizeof d,
	    "trace %s: %zu arrivals kept of %zu, %u "
	    "replicas",
	    csv_path, kept, v.n, s->nreplicas);
	s->description = strdup(d);
	s->demand_below_r = false;
	free(csv);
	return ALLOT_OK;
fail:
	free(csv);
	free(v.a);
	if (err[0] == '\0')
		set_err(err, errlen, "%s", allot_strerror(rc));
	sim_scenario_free(s);
	return rc != ALLOT_OK ? rc : ALLOT_EINVAL;
}

void
sim_scenario_free(sim_scenario *s)
{
	if (s == NULL)
		return;
	free(s->description);
	free(s->config_text);
	allot_config_free(s->cfg);
	free(s->changes);
	free(s->arr);
	memset(s, 0, sizeof *s);
}
