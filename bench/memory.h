/* SPDX-License-Identifier: MIT */
/*
 * Bytes per key on the agent and on the coordinator (bench/memory.c),
 * reported by suite `coordinator`.
 */
#ifndef ALLOT_BENCH_MEMORY_H
#define ALLOT_BENCH_MEMORY_H

#include "bench.h"

typedef struct bench_memory_figures {
	double agent_bytes_per_identity; /* one pool slot, one thread */
	double agent_bytes_per_value; /* the same, shared: false */
	double agent_pool_bytes; /* 100,000-slot agent, pool full */
	double agent_growth_bytes; /* then 900,000 more identities */
	double agent_overflowed; /* decisions on the overflow key */
	double coord_bytes_per_key; /* per interned key of a session */
	double coord_bytes_per_replica; /* per session, keys aside */
} bench_memory_figures;

/* Single-threaded: run before the suite starts threads. */
void bench_memory(const bench_opts *o, bench_memory_figures *ret);

#endif
