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
