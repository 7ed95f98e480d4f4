/* SPDX-License-Identifier: MIT */
/*
 * What the scenario builders share (sim/scenario.c, the ten built-in
 * scenarios and traces; sim/families.c, the seeded families of issue 13):
 * the splitmix64 random streams every arrival is drawn from, a growing
 * vector of arrivals and the sort into the engine's order. Private to
 * sim/.
 */
#ifndef ALLOT_SIM_SCENARIO_INT_H
#define ALLOT_SIM_SCENARIO_INT_H

#include <stddef.h>
#include <stdint.h>

#include "prng.h"
#include "sim.h"

/* One random stream: splitmix64 (common/prng.h). */
typedef struct sim_rng {
	uint64_t s;
} sim_rng;

/* Uniform in [0, 1). */
static inline double
sim_rng_unit(sim_rng *r)
{
	return allot__splitmix64_unit(&r->s);
}

/* The stream (a, b) of `seed`: independent streams per caller and use,
 * so that changing one leaves the others' draws as they were. */
static inline sim_rng
sim_rng_stream(uint64_t seed, uint64_t a, uint64_t b)
{
	sim_rng r = { seed * ALLOT__GOLDEN64 ^ (a << 32) ^ b };
	allot__splitmix64(&r.s);
	return r;
}

typedef struct sim_arrvec {
	sim_arrival *a;
	size_t n, cap;
} sim_arrvec;

/* Append; ALLOT_OK or ALLOT_ENOMEM. */
int sim_arr_push(sim_arrvec *v, sim_arrival x);

/* Sort into the engine's order: time, caller, replica, endpoint. */
void sim_sort_arrivals(sim_arrival *a, size_t n);

/* One caller of a generated quota file. */
typedef struct sim_quota_spec {
	double rate;
	double burst;
	const char *priority; /* NULL: standard */
} sim_quota_spec;

/* The quota file (malloc'd YAML) of callers spiffe://sim/caller-<i> with
 * `q[i]`, the endpoint weights "default" and "/lookup" at 1 followed by
 * the lines `weights` (may be NULL), and a global ceiling when
 * `ceiling` > 0. NULL when out of memory. */
char *sim_quota_file(
    const sim_quota_spec *q, size_t n, const char *weights, double ceiling);

/* Build family scenario `name` (sim/families.c) into `s` (zeroed by the
 * caller, noisy_caller -1, graceful true). ALLOT_ENOENT: not a family. */
int sim_family_build(const char *name, const sim_params *p, double duration_s,
    sim_scenario *s, char *err, size_t errlen);

#endif
