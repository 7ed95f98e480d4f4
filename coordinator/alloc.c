/* SPDX-License-Identifier: MIT */
/*
 * Allocation policies behind allot__alloc_compute() (alloc.h). For now the
 * static split: every replica that enforces a quota gets R/n of its rate
 * and B/n of its burst, n being the number of those replicas, so the sums
 * are R and B exactly (up to rounding, which is taken off the shares so
 * the sums never exceed the quota). Consumption inputs are ignored here;
 * they are what the demand-aware allocator will water-fill on.
 */
#include "alloc.h"

#include <allot/allot.h>

/* Divide `total` in n equal parts whose sum, added in double precision,
 * does not exceed `total`: rounding may make n * (total / n) a hair
 * larger than total, which would break the Σ <= R invariant the tests
 * and auditors check. */
static double
equal_part(double total, size_t n)
{
	double part = total / (double) n;
	double sum = 0;
	for (size_t i = 0; i < n; i++)
		sum += part;
	while (sum > total && part > 0) {
		part = part * (1.0 - 1e-15);
		sum = 0;
		for (size_t i = 0; i < n; i++)
			sum += part;
	}
	return part;
}

static void
zero_outputs(allot__alloc_service *svc)
{
	for (size_t q = 0; q < svc->nquotas; q++) {
		allot__alloc_quota *aq = &svc->quotas[q];
		for (size_t i = 0; i < aq->nslots; i++) {
			aq->slots[i].rate = 0;
			aq->slots[i].burst = 0;
		}
		aq->sum_rate = 0;
		aq->sum_burst = 0;
	}
}

static void
static_split(allot__alloc_service *svc)
{
	for (size_t q = 0; q < svc->nquotas; q++) {
		allot__alloc_quota *aq = &svc->quotas[q];
		aq->sum_rate = 0;
		aq->sum_burst = 0;
		if (aq->nslots == 0)
			continue;
		double r = equal_part(aq->rate, aq->nslots);
		double b = equal_part(aq->burst, aq->nslots);
		for (size_t i = 0; i < aq->nslots; i++) {
			aq->slots[i].rate = r;
			aq->slots[i].burst = b;
			aq->sum_rate += r;
			aq->sum_burst += b;
		}
	}
}

int
allot__alloc_compute(const allot__alloc_policy *pol,
    allot__alloc_service *svc)
{
	if (svc == NULL)
		return ALLOT_EINVAL;
	if (pol == NULL) {
		zero_outputs(svc);
		return ALLOT_EINVAL;
	}
	switch (pol->kind) {
	case ALLOT__ALLOC_STATIC:
		static_split(svc);
		return ALLOT_OK;
	}
	zero_outputs(svc);
	return ALLOT_EINVAL;
}

const char *
allot__alloc_name(const allot__alloc_policy *pol)
{
	if (pol != NULL && pol->kind == ALLOT__ALLOC_STATIC)
		return "static_split";
	return "unknown";
}
