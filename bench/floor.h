/* SPDX-License-Identifier: MIT */
/*
 * The floor: the least a correct, thread-safe, in-process token bucket can
 * cost per decision. One clock_gettime(CLOCK_MONOTONIC) and one C11
 * compare-and-swap on a single 64-bit word, no table, no counters, no
 * decision details beyond allow/deny. The bucket is kept in its
 * theoretical-arrival-time form (GCRA), which is the token bucket with
 * rate R and burst B written as one timestamp: a request of cost c is
 * admitted when max(tat, now) + c/R - now <= B/R. It lives in its own
 * translation unit so that, like allot_acquire() in the shared library, it
 * is a real call and cannot be folded into the benchmark loop.
 */
#ifndef ALLOT_BENCH_FLOOR_H
#define ALLOT_BENCH_FLOOR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct floor_bucket {
	_Alignas(64) _Atomic uint64_t tat; /* theoretical arrival time, ns
	                                      since `origin` */
	uint64_t interval_ns; /* ns per token, >= 1 */
	uint64_t tolerance_ns; /* burst * interval_ns */
	uint64_t origin; /* CLOCK_MONOTONIC ns at creation */
} floor_bucket;

/* A full bucket of `burst` tokens refilling at `rate` tokens/s. Time has
 * 1 ns resolution: rates above 1e9 tokens/s are clamped to 1e9. */
void floor_init(floor_bucket *b, double rate, double burst);

/* Charge `cost` tokens. Thread-safe; a denial writes nothing. */
bool floor_acquire(floor_bucket *b, uint32_t cost);

#endif
