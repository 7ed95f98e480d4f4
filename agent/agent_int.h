/* SPDX-License-Identifier: MIT */
/*
 * liballot's private structures: the agent, its quotas (one token bucket
 * each), the key tables and the per-key counters. Shared by agent.c (the
 * hot path and key tables), stats.c (snapshots) and sync.c (the
 * coordinator loop). Nothing here is part of the public interface.
 *
 * Memory per key: sizeof(allot_key) plus nstripes * 64 bytes of counters
 * (nstripes = the CPU count rounded up to a power of two, at most 16);
 * unknown-identity keys add ALLOT_IDENTITY_MAX + 1 bytes for the name.
 * docs/configuration.md ("Memory") gives the figures for common sizes.
 */
#ifndef ALLOT_AGENT_INT_H
#define ALLOT_AGENT_INT_H

#include <pthread.h>
#include <stdatomic.h>

#include <allot/allot.h>

#include "bucket.h"
#include "clock.h"
#include "config.h"
#include "hash.h"
#include "log.h"

#define ALLOT__MAX_STRIPES 16u

/* Counters of one key on one stripe (one cache line). Threads pick the
 * stripe of the CPU they run on, so two threads rarely share a line. */
typedef struct allot__kstripe {
	_Alignas(64) _Atomic uint64_t allowed;
	_Atomic uint64_t denied;
	_Atomic uint64_t shadow_denied;
	_Atomic uint64_t spent;        /* may be lowered by refunds */
	_Atomic uint64_t denied_tokens;
} allot__kstripe;

/* Totals of a set of stripes. */
typedef struct allot__ktotals {
	uint64_t allowed, denied, shadow_denied, spent, denied_tokens;
} allot__ktotals;

struct allot__sync;

/* Runtime state of one quota: its bucket and what the sync loop needs. */
typedef struct allot__qrt {
	allot__bucket bucket;          /* first: 64-byte aligned */
	const allot__quota *q;         /* in the agent's own config copy */
	uint32_t index;                /* wire key id */
	bool is_default;
	/* Totals folded in from evicted unknown-identity keys (dyn_lock). */
	allot__ktotals retired;
} allot__qrt;

struct allot_key {
	allot__bucket *bucket;
	allot__qrt *quota;
	allot__kstripe *stripes;
	uint32_t weight;
	uint32_t max_cost;             /* floor(quota burst) */
	uint32_t cls;                  /* endpoint class index */
	bool known;                    /* a configured caller */
	bool dynamic;                  /* in the unknown-identity pool */
	_Atomic uint32_t pins;
	/* Even when stable; odd while a dynamic key is being recycled. */
	_Atomic uint32_t gen;
	uint64_t hash;
	const char *identity;
	/* Eviction bookkeeping (dyn_lock). */
	uint64_t sweep_sum;
	uint64_t sweep_ns;
	uint32_t next_free;
	uint32_t slot;                 /* index in dyn_index, or UINT32_MAX */
};

struct allot_agent {
	allot_config *cfg;             /* owned copy */
	allot__logger log;
	allot_clock_fn clock_fn;
	void *clock_ctx;
	const allot__tsc *tsc;
	uint32_t stripe_mask;
	uint32_t nstripes;
	uint64_t seed;

	allot__qrt *quotas;            /* ncallers + 1; the last is default */
	uint32_t nquotas;
	uint32_t nclasses;             /* nendpoints + 1; last is "default" */
	const char **class_names;

	/* Read-only open-addressing indexes built at create: value is
	 * index + 1, 0 marks an empty slot. */
	uint32_t *id_index;
	uint64_t *id_hash;
	uint32_t id_mask;
	uint32_t *ep_index;
	uint64_t *ep_hash;
	uint32_t ep_mask;

	allot_key *known_keys;         /* ncallers * nclasses */
	allot_key *anon_keys;          /* nclasses: no identity */
	allot_key *overflow_keys;      /* nclasses: pool exhausted */

	/* Unknown identities. Lookups are lock-free; inserts, evictions
	 * and recycling take dyn_lock. */
	pthread_mutex_t dyn_lock;
	allot_key *dyn_keys;
	char *dyn_names;               /* dyn_cap * (ALLOT_IDENTITY_MAX + 1) */
	uint32_t dyn_cap;
	uint32_t dyn_free;             /* free list head, UINT32_MAX = none */
	uint32_t dyn_used;
	_Atomic(allot_key *) *dyn_index;
	uint32_t dyn_mask;
	uint64_t idle_evict_ns;
	uint64_t last_sweep_ns;
	_Atomic uint64_t evictions;
	_Atomic uint64_t overflowed;

	allot__kstripe *stripe_pool;

	pthread_mutex_t set_lock;      /* serialises allowance writers */
	allot_agent_options opts;
	char *coordinator;
	char *service;
	char *replica_id;
	struct allot__sync *sync;
};

static inline uint64_t
allot__agent_now(const allot_agent *a, unsigned *cpu)
{
	if (allot__unlikely(a->clock_fn != NULL)) {
		*cpu = 0;
		return a->clock_fn(a->clock_ctx);
	}
	return allot__tsc_ns(a->tsc, cpu);
}

/* Sum a key's stripes. */
void allot__key_totals(const allot_agent *a, const allot_key *k,
    allot__ktotals *ret);

/* Sum of every key charging quota `q`, evicted keys included. */
void allot__quota_totals(allot_agent *a, const allot__qrt *q,
    allot__ktotals *ret);

/* Install an allowance on a quota's bucket (any thread). */
void allot__quota_set(allot_agent *a, allot__qrt *q,
    const allot__allowance *al);

/* Evict idle unknown-identity keys now (any thread; takes dyn_lock). */
void allot__agent_sweep(allot_agent *a, uint64_t now);

/* The coordinator loop (sync.c). */
int allot__sync_start(allot_agent *a);
void allot__sync_stop(allot_agent *a);

#endif
