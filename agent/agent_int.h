/* SPDX-License-Identifier: MIT */
/*
 * liballot's private structures: the agent, its quotas (one token bucket
 * each), the key tables and the per-key counters. Shared by agent.c (the
 * hot path and key tables), stats.c (snapshots) and sync.c (the
 * coordinator loop). Nothing here is part of the public interface.
 *
 * Memory per key: sizeof(allot_key) plus 64 bytes of counters and lease
 * in each thread block (one block per thread that has called acquire, at most
 * max_threads); unknown-identity keys add ALLOT_IDENTITY_MAX + 1 bytes
 * for the name.
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
#include "idmap.h"
#include "log.h"

/*
 * A thread's token lease on one key (bucket.h, "Token leases"): tokens
 * taken from the shared bucket in one batch and spent by this thread
 * alone, so that a key hot on several cores does not bounce its bucket's
 * line on every decision. Only the owning thread reads or writes it.
 * A thread leases on a key only after its CAS on that bucket lost to
 * another thread (`on`); a single-threaded caller never leases.
 */
typedef struct allot__lease {
	uint64_t stamp_ns; /* last use: idle for LEASE_IDLE_NS, returned */
	uint64_t z_ns; /* the bucket's z after the batch: for decisions */
	uint32_t ver; /* allowance version it was taken under */
	uint16_t n; /* tokens reserved in the bucket's `leased`, 0: none */
	uint8_t held; /* of them, not yet spent */
	bool on; /* contention seen: lease on this key */
} allot__lease;

/* Spent-from-lease tokens are returned after this long unused. */
#define ALLOT__LEASE_IDLE_NS 1000000u
/* A batch is at most this many tokens, and at most the burst /
 * (LEASE_SHARE * max_threads): all the leases of one key together never
 * hold more than 1/LEASE_SHARE of its burst out of the bucket. */
#define ALLOT__LEASE_MAX 16u
#define ALLOT__LEASE_SHARE 16u

/* Counters of one key in one thread's block, and its lease: one cache
 * line, one line touched per decision. */
typedef struct allot__kcount {
	_Alignas(64) _Atomic uint64_t allowed;
	_Atomic uint64_t denied;
	_Atomic uint64_t shadow_denied;
	_Atomic uint64_t spent; /* may be lowered by refunds */
	_Atomic uint64_t denied_tokens;
	allot__lease lease;
} allot__kcount;

/*
 * A thread's counters for every key of the agent. A block has a single
 * writer, the thread that owns it, so counting is a plain load, add and
 * store (relaxed atomics, no lock prefix): no cache line is shared
 * between threads and no locked instruction is spent on counting. A
 * thread gets its block on its first acquire (the only allocation it
 * causes) and gives it back when it exits, for the next thread to adopt.
 * Past max_threads live threads, the rest share one block and count with
 * atomic read-modify-writes. Readers sum all blocks with relaxed loads.
 */
typedef struct allot__tblock {
	_Atomic int owned; /* a live thread writes it */
	bool shared; /* the overflow block: atomic RMW, never leases */
	struct allot_agent *agent; /* its leases go back here at exit */
	_Alignas(64) allot__kcount c[]; /* indexed by allot_key.id */
} allot__tblock;

/* Totals of a set of counters. */
typedef struct allot__ktotals {
	uint64_t allowed, denied, shadow_denied, spent, denied_tokens;
} allot__ktotals;

struct allot__sync;

/* Up to this many endpoints are found by a linear scan. */
#define ALLOT__EP_LINEAR 8u

/* Runtime state of one quota: its bucket and what the sync loop needs. */
typedef struct allot__qrt {
	allot__bucket bucket; /* first: 64-byte aligned */
	const allot__quota *q; /* in the agent's own config copy */
	uint32_t index; /* wire key id */
	bool is_default;
	/* Totals folded in from evicted unknown-identity keys (dyn_lock). */
	allot__ktotals retired;
} allot__qrt;

/* The fields a decision reads come first, in the key's first line. */
struct allot_key {
	_Alignas(64) allot__bucket *bucket;
	allot__qrt *quota;
	uint32_t id; /* index into every thread block */
	uint32_t weight;
	uint32_t max_cost; /* floor(quota burst) */
	uint32_t cls; /* endpoint class index */
	bool known; /* a configured caller */
	bool dynamic; /* in the unknown-identity pool */
	_Atomic uint32_t pins;
	/* Even when stable; odd while a dynamic key is being recycled. */
	_Atomic uint32_t gen;
	uint64_t hash;
	const char *identity;
	/* Counts before the key's current identity (dyn_lock): a recycled
	 * key starts from these instead of zeroing other threads' blocks. */
	allot__ktotals base;
	/* Eviction bookkeeping (dyn_lock). */
	uint64_t sweep_sum;
	uint64_t sweep_ns;
	uint32_t next_free;
	uint32_t slot; /* index in dyn_index, or UINT32_MAX */
};

struct allot_agent {
	allot_config *cfg; /* owned copy */
	allot__logger log;
	allot_clock_fn clock_fn;
	void *clock_ctx;
	const allot__tsc *tsc;
	uint64_t seed;
	uint64_t gen; /* unique per agent, keys TLS caches */

	allot__qrt *quotas; /* ncallers + 1; the last is default */
	uint32_t nquotas;
	uint32_t nclasses; /* nendpoints + 1; last is "default" */
	const char **class_names;

	/* Read-only indexes built at create: configured identities to
	 * their keys (one line per probe, agent.c), endpoint names to
	 * class (idmap.h). */
	struct allot__caller_slot *caller_tab;
	char *caller_names; /* the identities, each from a line start */
	uint32_t caller_mask;
	allot__idmap ep_map;
	size_t *ep_len; /* per endpoint class */

	allot_key *known_keys; /* ncallers * nclasses */
	allot_key *anon_keys; /* nclasses: no identity */
	allot_key *overflow_keys; /* nclasses: pool exhausted */

	/* Unknown identities. Lookups are lock-free; inserts, evictions
	 * and recycling take dyn_lock. */
	pthread_mutex_t dyn_lock;
	allot_key *dyn_keys;
	char *dyn_names; /* dyn_cap * (ALLOT_IDENTITY_MAX + 1) */
	uint32_t dyn_cap;
	uint32_t dyn_free; /* free list head, UINT32_MAX = none */
	uint32_t dyn_used;
	_Atomic(allot_key *) *dyn_index;
	uint32_t dyn_mask;
	uint64_t idle_evict_ns;
	uint64_t last_sweep_ns;
	_Atomic uint64_t evictions;
	_Atomic uint64_t overflowed;

	/* Per-thread counter blocks (thread.c). */
	uint32_t nkeys; /* keys of every kind: block size */
	uint32_t max_blocks;
	_Atomic uint32_t nblocks;
	allot__tblock **blocks; /* max_blocks slots */
	allot__tblock *shared_block;
	pthread_mutex_t blk_lock;
	pthread_key_t tkey;
	bool tkey_ok;

	pthread_mutex_t set_lock; /* serialises allowance writers */
	allot_agent_options opts;
	char *coordinator;
	char *tls_ca;
	char *tls_cert;
	char *tls_name;
	char *service;
	char *replica_id;
	struct allot__sync *sync;
};

static inline uint64_t
allot__agent_now(const allot_agent *a)
{
	if (allot__unlikely(a->clock_fn != NULL))
		return a->clock_fn(a->clock_ctx);
	return allot__tsc_ns(a->tsc);
}

/* This thread's counter block (thread.c). The fast path is one
 * initial-exec TLS load and a compare. */
typedef struct allot__tlcache {
	uint64_t gen;
	allot__tblock *b;
} allot__tlcache;
extern _Thread_local allot__tlcache allot__tl
    __attribute__((tls_model("initial-exec")));
allot__tblock *allot__thread_block_slow(allot_agent *a);

static inline allot__tblock *
allot__thread_block(allot_agent *a)
{
	if (allot__likely(allot__tl.gen == a->gen))
		return allot__tl.b;
	return allot__thread_block_slow(a);
}

/* Add to a counter of a block: its owner alone writes an owned block. */
static inline void
allot__bump(const allot__tblock *b, _Atomic uint64_t *c, uint64_t v)
{
	if (allot__likely(!b->shared))
		atomic_store_explicit(c,
		    atomic_load_explicit(c, memory_order_relaxed) + v,
		    memory_order_relaxed);
	else
		atomic_fetch_add_explicit(c, v, memory_order_relaxed);
}

int allot__blocks_init(allot_agent *a);
void allot__blocks_fini(allot_agent *a);

/* Give back every lease open in block `b` (its owner, at thread exit). */
void allot__leases_return(allot_agent *a, allot__tblock *b);

/* Sum a key's counters over every thread block, minus its base. */
void allot__key_totals(
    const allot_agent *a, const allot_key *k, allot__ktotals *ret);

/* Sum of every key charging quota `q`, evicted keys included. */
void allot__quota_totals(
    allot_agent *a, const allot__qrt *q, allot__ktotals *ret);

/* Install an allowance on a quota's bucket (any thread). */
void allot__quota_set(
    allot_agent *a, allot__qrt *q, const allot__allowance *al);

/* How the sync engine installs allowances: given to it at creation, so
 * that it calls nothing in agent.c (agent.c starts sync.c, which drives
 * sync_core.c; no call goes back up). `quota` indexes a->quotas. */
typedef struct allot__installer {
	void (*install)(void *ctx, uint32_t quota, const allot__allowance *al);
	void *ctx;
} allot__installer;

/* Evict idle unknown-identity keys now (any thread; takes dyn_lock). */
void allot__agent_sweep(allot_agent *a, uint64_t now);

/* The coordinator loop (sync.c), installing through `in`. */
int allot__sync_start(allot_agent *a, const allot__installer *in);
void allot__sync_stop(allot_agent *a);

/* The coordinator's view of quota `quota` (a->quotas index) into the
 * fields of `ret` that say so (sync.c); untouched when local-only. */
void allot__sync_key_state(
    allot_agent *a, uint32_t quota, allot_key_stats *ret);

#endif
