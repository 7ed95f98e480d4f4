/* SPDX-License-Identifier: MIT */
/*
 * The floor bucket (floor.h): one CLOCK_MONOTONIC read and one CAS per
 * admitted decision, one clock read and one load per denied one. Its
 * arithmetic is integer nanoseconds, the cheapest honest choice; anything
 * allot does beyond this (a full decision record, counters, a key handle)
 * shows up as its distance from this floor.
 */
#include "floor.h"

#include <math.h>
#include <time.h>

static inline uint64_t
mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

void
floor_init(floor_bucket *b, double rate, double burst)
{
	double iv = rate >= 1e9 ? 1.0 : ceil(1e9 / rate);
	b->interval_ns = (uint64_t) iv;
	b->tolerance_ns = (uint64_t) (burst * iv);
	b->origin = mono_ns();
	atomic_init(&b->tat, 0);
}

bool
floor_acquire(floor_bucket *b, uint32_t cost)
{
	uint64_t now = mono_ns() - b->origin;
	uint64_t inc = (uint64_t) cost * b->interval_ns;
	uint64_t tat = atomic_load_explicit(&b->tat, memory_order_relaxed);
	for (;;) {
		uint64_t next = (tat > now ? tat : now) + inc;
		if (next - now > b->tolerance_ns)
			return false;
		if (atomic_compare_exchange_weak_explicit(&b->tat, &tat, next,
		        memory_order_relaxed, memory_order_relaxed))
			return true;
	}
}
