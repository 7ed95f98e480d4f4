/* SPDX-License-Identifier: MIT */
/*
 * The load generator's arithmetic: the seeded generator (splitmix64),
 * string hashing and rendezvous choice of a caller's home replica, the
 * open-loop pacer, and the log-linear latency histogram with its
 * percentiles. Pure functions over caller-owned memory, so the unit tests
 * check exactly what the engine runs.
 */
#include <math.h>
#include <string.h>

#include "loadgen.h"
#include "prng.h"

/* ------------------------------------------------------------------ */
/* Random numbers and hashing                                          */
/* ------------------------------------------------------------------ */

void
lg_rng_seed(lg_rng *r, uint64_t seed)
{
	r->s = seed;
}

uint64_t
lg_rng_next(lg_rng *r)
{
	return allot__splitmix64(&r->s);
}

double
lg_rng_double(lg_rng *r)
{
	return allot__unit53(lg_rng_next(r));
}

uint32_t
lg_rng_below(lg_rng *r, uint32_t n)
{
	/* Lemire's multiply-shift; the bias (n / 2^32) is irrelevant at
	 * the sizes used here (a few dozen targets). */
	return (uint32_t) (((lg_rng_next(r) >> 32) * (uint64_t) n) >> 32);
}

uint64_t
lg_hash_str(const char *s)
{
	uint64_t h = UINT64_C(0xcbf29ce484222325);

	for (; *s != '\0'; s++) {
		h ^= (unsigned char) *s;
		h *= UINT64_C(0x100000001b3);
	}
	return allot__splitmix64_mix(h);
}

int
lg_rendezvous(uint64_t caller_hash, const uint64_t *target_hash,
    const bool *active, size_t n)
{
	int best = -1;
	uint64_t best_score = 0;

	for (size_t i = 0; i < n; i++) {
		uint64_t score;

		if (active != NULL && !active[i])
			continue;
		score = allot__splitmix64_mix(
		    caller_hash ^ allot__splitmix64_mix(target_hash[i]));
		if (best < 0 || score > best_score) {
			best = (int) i;
			best_score = score;
		}
	}
	return best;
}

int
lg_pick_target(lg_rng *r, double sticky, uint64_t caller_hash,
    const uint64_t *target_hash, const bool *active, size_t n)
{
	uint32_t live = 0, k;

	if (sticky > 0 && lg_rng_double(r) < sticky)
		return lg_rendezvous(caller_hash, target_hash, active, n);
	for (size_t i = 0; i < n; i++)
		live += active == NULL || active[i];
	if (live == 0)
		return -1;
	k = lg_rng_below(r, live);
	for (size_t i = 0; i < n; i++) {
		if (active != NULL && !active[i])
			continue;
		if (k-- == 0)
			return (int) i;
	}
	return -1; /* not reached */
}

/* ------------------------------------------------------------------ */
/* Pacing                                                              */
/* ------------------------------------------------------------------ */

void
lg_pacer_init(lg_pacer *p, uint64_t start_ns, double rate)
{
	p->start_ns = start_ns;
	p->rate = rate;
	p->next = 0;
}

uint64_t
lg_pacer_due(const lg_pacer *p, uint64_t k)
{
	return p->start_ns + (uint64_t) ceil((double) k * 1e9 / p->rate);
}

uint64_t
lg_pacer_next_due(const lg_pacer *p)
{
	return lg_pacer_due(p, p->next);
}

uint64_t
lg_pacer_take(lg_pacer *p, uint64_t now_ns)
{
	uint64_t total;

	if (now_ns < p->start_ns)
		return 0;
	/* Slots 0 .. total-1 are due: the estimate from the rate, then
	 * corrected against lg_pacer_due() itself so that "due" means one
	 * thing whatever the floating-point rounding. Each loop moves by
	 * at most a slot or two. */
	total = (uint64_t) floor(
	            (double) (now_ns - p->start_ns) * p->rate / 1e9) +
	    1;
	for (int i = 0;
	     i < 4 && total > 0 && lg_pacer_due(p, total - 1) > now_ns; i++)
		total--;
	for (int i = 0; i < 4 && lg_pacer_due(p, total) <= now_ns; i++)
		total++;
	if (total <= p->next)
		return 0;
	total -= p->next;
	p->next += total;
	return total;
}

/* ------------------------------------------------------------------ */
/* Latency histogram                                                   */
/* ------------------------------------------------------------------ */

#define SUB (1u << LG_HIST_SUB_BITS)
#define LINEAR (2u << LG_HIST_SUB_BITS)

void
lg_hist_reset(lg_hist *h)
{
	memset(h, 0, sizeof *h);
}

uint32_t
lg_hist_index(uint64_t us)
{
	uint32_t e, shift;

	if (us > LG_HIST_MAX_US)
		us = LG_HIST_MAX_US;
	if (us < LINEAR)
		return (uint32_t) us;
	e = 63u - (uint32_t) __builtin_clzll(us);
	shift = e - LG_HIST_SUB_BITS;
	return LINEAR + (e - LG_HIST_SUB_BITS - 1) * SUB +
	    (uint32_t) ((us >> shift) - SUB);
}

uint64_t
lg_hist_upper(uint32_t idx)
{
	uint32_t j, e, shift;
	uint64_t top;

	if (idx < LINEAR)
		return idx;
	j = idx - LINEAR;
	e = j / SUB + LG_HIST_SUB_BITS + 1;
	top = j % SUB + SUB;
	shift = e - LG_HIST_SUB_BITS;
	return (top << shift) + ((UINT64_C(1) << shift) - 1);
}

void
lg_hist_add(lg_hist *h, uint64_t us)
{
	if (us > LG_HIST_MAX_US)
		us = LG_HIST_MAX_US;
	if (h->count == 0 || us < h->min_us)
		h->min_us = us;
	if (us > h->max_us)
		h->max_us = us;
	h->count++;
	h->sum_us += us;
	h->buckets[lg_hist_index(us)]++;
}

void
lg_hist_merge(lg_hist *dst, const lg_hist *src)
{
	if (src->count == 0)
		return;
	if (dst->count == 0 || src->min_us < dst->min_us)
		dst->min_us = src->min_us;
	if (src->max_us > dst->max_us)
		dst->max_us = src->max_us;
	dst->count += src->count;
	dst->sum_us += src->sum_us;
	for (uint32_t i = 0; i < LG_HIST_BUCKETS; i++)
		dst->buckets[i] += src->buckets[i];
}

uint64_t
lg_hist_percentile(const lg_hist *h, double p)
{
	uint64_t rank, acc = 0;

	if (h->count == 0)
		return 0;
	if (p > 100)
		p = 100;
	/* The rank of the sample sought, 1-based: ceil(p% of count), at
	 * least 1; the epsilon keeps 99 % of 100 samples at rank 99. */
	rank = (uint64_t) ceil(p * (double) h->count / 100.0 - 1e-9);
	if (rank < 1)
		rank = 1;
	if (rank > h->count)
		rank = h->count;
	for (uint32_t i = 0; i < LG_HIST_BUCKETS; i++) {
		acc += h->buckets[i];
		if (acc >= rank) {
			uint64_t v = lg_hist_upper(i);
			if (v > h->max_us)
				v = h->max_us;
			if (v < h->min_us)
				v = h->min_us;
			return v;
		}
	}
	return h->max_us;
}
