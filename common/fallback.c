/* SPDX-License-Identifier: MIT */
/* The fallback rule (fallback.h). */
#include "fallback.h"

#include <math.h>

void
allot__static_share(double rate, double burst, uint32_t n, uint32_t max_weight,
    allot__allowance *ret)
{
	double nn = n > 0 ? (double) n : 1.0;
	*ret = (allot__allowance) {
		.rate = rate / nn,
		.burst = fmax(burst / nn, (double) max_weight),
		.mode = ALLOT__MODE_LIMIT,
	};
}

void
allot__fallback_allowance(allot_fallback kind, double rate, double burst,
    uint32_t n, uint32_t max_weight, allot__allowance *ret)
{
	if (kind != ALLOT_FALLBACK_OPEN && kind != ALLOT_FALLBACK_CLOSED) {
		allot__static_share(rate, burst, n, max_weight, ret);
		return;
	}
	double nn = n > 0 ? (double) n : 1.0;
	*ret = (allot__allowance) {
		.rate = rate / nn,
		.burst = burst / nn,
		.mode = kind == ALLOT_FALLBACK_OPEN ? ALLOT__MODE_OPEN :
		                                      ALLOT__MODE_CLOSED,
	};
}

void
allot__fallback_rate_burst(allot_fallback kind, double rate, double burst,
    uint32_t n, uint32_t max_weight, double *ret_rate, double *ret_burst)
{
	allot__allowance al;
	allot__fallback_allowance(kind, rate, burst, n, max_weight, &al);
	if (al.mode == ALLOT__MODE_OPEN)
		*ret_rate = *ret_burst = INFINITY;
	else if (al.mode == ALLOT__MODE_CLOSED)
		*ret_rate = *ret_burst = 0;
	else {
		*ret_rate = al.rate;
		*ret_burst = al.burst;
	}
}

/* The level λ at which Σ min(w_i, λ) over the quotas of class `cls`
 * equals `left` (less than their sum): a bisection, as the wants are
 * few and this runs once per config. */
static double
water_level(size_t n, const double *rate, const uint32_t *prio, uint32_t cls,
    double left)
{
#define want(i) ((1 - ALLOT__CEILING_FLOOR) * rate[i])
	double lo = 0, hi = 0;
	for (size_t i = 0; i < n; i++)
		if (prio[i] == cls && want(i) > hi)
			hi = want(i);
	for (int it = 0; it < 100; it++) {
		double mid = (lo + hi) / 2, sum = 0;
		for (size_t i = 0; i < n; i++)
			if (prio[i] == cls)
				sum += fmin(want(i), mid);
		if (sum > left)
			hi = mid;
		else
			lo = mid;
	}
	return lo;
}

void
allot__ceiling_fit(double ceiling, size_t n, const double *rate,
    const uint32_t *prio, double *ret_rate)
{
	double total = 0, top = 0;
	for (size_t i = 0; i < n; i++) {
		total += rate[i];
		top = fmax(top, (double) prio[i]);
	}
	if (!(ceiling > 0) || total <= ceiling) {
		for (size_t i = 0; i < n; i++)
			ret_rate[i] = rate[i];
		return;
	}
	double floors = ALLOT__CEILING_FLOOR * total;
	if (floors >= ceiling) {
		for (size_t i = 0; i < n; i++)
			ret_rate[i] = rate[i] * (ceiling / total);
		return;
	}
	/* Floors first; then what each wants above its floor, want(i). */
	double left = ceiling - floors;
	for (size_t i = 0; i < n; i++)
		ret_rate[i] = ALLOT__CEILING_FLOOR * rate[i];
	for (int64_t cls = (int64_t) top; cls >= 0; cls--) {
		double sum = 0;
		for (size_t i = 0; i < n; i++)
			if (prio[i] == (uint32_t) cls)
				sum += want(i);
		if (sum <= left) {
			for (size_t i = 0; i < n; i++)
				if (prio[i] == (uint32_t) cls)
					ret_rate[i] += want(i);
			left -= sum;
			continue;
		}
		double lambda = water_level(
		    n, rate, prio, (uint32_t) cls, left);
		for (size_t i = 0; i < n; i++)
			if (prio[i] == (uint32_t) cls)
				ret_rate[i] += fmin(want(i), lambda);
		break;
	}
}
#undef want
