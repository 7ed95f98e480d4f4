/* SPDX-License-Identifier: MIT */
/*
 * liballot's private structures: the agent, its quotas (one token bucket
 * each), the key tables and the per-key counters. Shared by agent.c (the
 * hot path and key tables), stats.c (snapshots) and sync.c (the
 * coordinator loop). Nothing here is part of the public interface.
 *
 * Memory per key: sizeof(allot_key) (one line) and sizeof(allot__kcold)
 * (what decisions never read), plus 64 bytes of counters and lease
 * in each thread block (one block per thread that has called acquire, at most
 * max_threads); unknown-identity keys add ALLOT_IDENTITY_MAX + 1 bytes
 * for the name, and each configured identity reserved 64 bytes for its
 * name line and 12 to 24 bytes of index.
 * docs/configuration.md ("Memory") gives the figures for common sizes.
 */
#ifndef ALLOT_AGENT_INT_H
#define ALLOT_AGENT_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

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
	uint64_t z_ns; /* the bucket's z after the batch: for decisions */
	/* Last use, in ticks of 2^LEASE_TICK_SHIFT ns modulo 2^16 (about a
	 * second): only tells idle from busy, and a lease mistaken for
	 * busy after a wrap is still spent under its own version. */
	unsigned stamp : 16;
	unsigned ver : 16; /* low bits of the allowance version */
	/* The quota (a->quotas index) whose bucket it was taken from: a
	 * reconfig may move the key to another bucket, and the lease goes
	 * back to the one it came from. */
	unsigned quota : 17;
	unsigned n : 7; /* tokens reserved in the bucket's `leased`, 0: none */
	unsigned held : 7; /* of them, not yet spent */
	unsigned on : 1; /* contention seen: lease on this key */
} allot__lease;
_Static_assert(sizeof(allot__lease) == 16, "a lease is 16 bytes");

/* Spent-from-lease tokens are returned after this long unused. */
#define ALLOT__LEASE_IDLE_NS 1000000u
#define ALLOT__LEASE_TICK_SHIFT 14u /* 16.4 us */
#define ALLOT__LEASE_IDLE_TICKS \
	((ALLOT__LEASE_IDLE_NS >> ALLOT__LEASE_TICK_SHIFT) + 1u)
/* A batch is at most this many tokens, and at most the burst /
 * (LEASE_SHARE * the threads deciding, i.e. owned blocks): all the
 * leases of one key together hold about 1/LEASE_SHARE of its burst out
 * of the bucket (more only briefly, after new threads start and until
 * the older leases renew at the smaller size). */
#define ALLOT__LEASE_MAX 64u
#define ALLOT__LEASE_SHARE 16u

/* Counters of one key in one thread's block, and its lease: one cache
 * line, one line touched per decision. */
typedef struct allot__kcount {
	_Alignas(64) _Atomic uint64_t allowed;
	_Atomic uint64_t denied;
	_Atomic uint64_t shadow_denied;
	_Atomic uint64_t spent; /* may be lowered by refunds */
	_Atomic uint64_t denied_tokens;
	/* Tokens of requests admitted in shadow that the bucket would have
	 * denied: in `allowed` and `spent` too, never in denied_tokens. */
	_Atomic uint64_t shadow_tokens;
	allot__lease lease;
} allot__kcount;
_Static_assert(sizeof(allot__kcount) == 64, "a key's counters: one line");

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
	uint64_t shadow_tokens;
} allot__ktotals;

/* acc += t and acc -= t, field by field. */
static inline void
allot__ktotals_add(allot__ktotals *acc, const allot__ktotals *t)
{
	acc->allowed += t->allowed;
	acc->denied += t->denied;
	acc->shadow_denied += t->shadow_denied;
	acc->spent += t->spent;
	acc->denied_tokens += t->denied_tokens;
	acc->shadow_tokens += t->shadow_tokens;
}

static inline void
allot__ktotals_sub(allot__ktotals *acc, const allot__ktotals *t)
{
	acc->allowed -= t->allowed;
	acc->denied -= t->denied;
	acc->shadow_denied -= t->shadow_denied;
	acc->spent -= t->spent;
	acc->denied_tokens -= t->denied_tokens;
	acc->shadow_tokens -= t->shadow_tokens;
}

struct allot__sync;

/* The index of configured identities (agent.c reads it, reconfig.c
 * writes it): open addressing, at most two thirds full (agent.c,
 * caller_slots), insert-only, one 64-bit word per slot
 * (allot__caller_entry): the hash's top 30 bits, the identity's group
 * and the quota its default-class key charges. The table is 8 bytes a
 * slot (128 KB for 10,000 callers, which stay in the core's L2), and
 * everything a decision reads next is at an address
 * computed from the word alone: the group's key of the endpoint class,
 * the thread's counters for it, the bucket (a prefetch hint: a reconfig
 * may move the key) and the identity's name line (allot__caller_name),
 * all asked for at once on a tag match. A slot is written once with
 * release (0 -> entry); a reconfig may later rewrite its quota hint,
 * never its tag or group. */
#define ALLOT__CALLER_GROUP_BITS 17u /* group + 1; 0: empty slot */
#define ALLOT__CALLER_QUOTA_BITS 17u
#define ALLOT__CALLER_TAG_SHIFT \
	(ALLOT__CALLER_GROUP_BITS + ALLOT__CALLER_QUOTA_BITS)
_Static_assert(ALLOT__MAX_CALLERS < (1u << ALLOT__CALLER_GROUP_BITS),
    "group + 1 fits the caller entry");
_Static_assert(ALLOT__MAX_CALLERS + 1 < (1u << ALLOT__CALLER_QUOTA_BITS),
    "a quota index fits the caller entry");

static inline uint64_t
allot__caller_entry(uint64_t h, uint32_t g, uint32_t quota)
{
	return (h >> ALLOT__CALLER_TAG_SHIFT << ALLOT__CALLER_TAG_SHIFT) |
	    (uint64_t) quota << ALLOT__CALLER_GROUP_BITS | (uint64_t) (g + 1);
}

static inline bool
allot__caller_tag_is(uint64_t entry, uint64_t h)
{
	return (entry ^ h) >> ALLOT__CALLER_TAG_SHIFT == 0;
}

static inline uint32_t
allot__caller_group(uint64_t entry)
{
	return (uint32_t) (entry & ((1u << ALLOT__CALLER_GROUP_BITS) - 1)) - 1;
}

static inline uint32_t
allot__caller_quota(uint64_t entry)
{
	return (uint32_t) (entry >> ALLOT__CALLER_GROUP_BITS) &
	    ((1u << ALLOT__CALLER_QUOTA_BITS) - 1);
}

/* A configured identity's name, by group, on a line of its own: the
 * identity zero padded when it is at most ALLOT__CALLER_INLINE bytes
 * (SPIFFE IDs are about 55-62), all zero otherwise (then the name is
 * compared through the key's `identity`, one more line). A lookup
 * compares len + 1 bytes, the terminator included. */
#define ALLOT__CALLER_INLINE 63u
typedef struct allot__caller_name {
	_Alignas(64) char s[ALLOT__CALLER_INLINE + 1];
} allot__caller_name;
_Static_assert(sizeof(allot__caller_name) == 64, "a name is one line");

/* The endpoint index past ALLOT__EP_LINEAR endpoints: insert-only, the
 * class published last with release. */
struct allot__ep_slot {
	uint64_t hash;
	_Atomic uint32_t cls; /* class + 1; 0: empty */
};

/* Up to this many endpoints are found by a linear scan. */
#define ALLOT__EP_LINEAR 8u
/* Endpoint classes reserved beyond the first config's: 16, fewer with
 * many callers (agent.c, capacity()), at least one. */
#define ALLOT__SPARE_CLASSES 16u
#define ALLOT__KEYS_RESERVED 65536u
/* An endpoint name's room in a->ep_names. */
#define ALLOT__EP_NAME_SZ 64u
_Static_assert(ALLOT__ENDPOINT_MAX < ALLOT__EP_NAME_SZ, "endpoint names");

/* allot__qrt.deposited counts tokens in these units: the reserve may
 * complete a part of a token (tail.c). */
#define ALLOT__DEPOSIT_ONE 1048576.0

/*
 * Runtime state of one quota: its bucket and what the sync loop needs.
 * A quota's index (its wire key id) never changes once given: a quota
 * removed by a reconfig keeps its slot (`removed`), unused, and comes
 * back to it if a later config names it again.
 */
typedef struct allot__qrt {
	allot__bucket bucket; /* first: 64-byte aligned */
	/* In the config in force (a->cfg); a removed quota points at the
	 * default quota's. Read by the thread that reconfigures (the sync
	 * thread when a coordinator is set) or under cfg_lock. */
	const allot__quota *q;
	const char *name; /* wire key: identity or "IDENTITY ENDPOINT";
	                     owned by the agent, stable until destroy */
	uint32_t index; /* wire key id */
	bool is_default;
	_Atomic bool removed; /* not in the config in force */
	/* The rate and burst a static share splits (fallback.h): the
	 * quota's own, cut to fit the global ceiling (allot__ceiling_fit). */
	double static_rate, static_burst;
	/* The heaviest weight it is charged: its endpoint's for an endpoint
	 * quota, the config's largest otherwise. Its burst on a replica is
	 * never set below it (docs/allocation.md). */
	_Atomic uint32_t wmax;
	/* Its burst, whole: the most a request charging it may cost. Set
	 * with `q` by a reconfig; read without a lock where `q` may not be
	 * (an unknown identity's key taking its stacked levels). */
	_Atomic uint32_t max_cost;
	/* Totals folded in from keys that left it: evicted unknown
	 * identities (dyn_lock) and keys a reconfig moved (cfg_lock). */
	allot__ktotals retired;
	/* The configured callers' keys charging it now (cfg_lock). */
	struct allot_key **keys;
	uint32_t nkeys, keys_cap;
	/* The coordinator keeps a central reserve for it (Share.central):
	 * a request its bucket denies may wait for it (tail.h). */
	_Atomic bool central;
	/* Of its callers' spent tokens, those the reserve granted, and the
	 * reserve's leftovers put into the bucket (tail.c), in
	 * ALLOT__DEPOSIT_ONE units of a token (a grant may complete a part
	 * of one), for its ledger (ledger.h). */
	_Atomic uint64_t central_spent;
	_Atomic uint64_t deposited;
	/* Tokens run into debt while no coordinator could be asked
	 * (allot__standby_take(), tail.h): at most one sync interval of
	 * the bucket's rate per outage, and the standby rate over the
	 * outage. The standby rate the coordinator last sent
	 * (Share.standby), and the one the outage in course runs on (the
	 * driver's copy when it began, tail.c). */
	_Atomic uint64_t standby_used;
	_Atomic double standby_rate;
	_Atomic double standby_outage;
	/* Its config's `access` (allot__access): closed or unlimited fix
	 * its bucket's mode whatever allowance is installed
	 * (allot__quota_set), and a closed one's denials are
	 * ALLOT_EFORBIDDEN. Set by a reconfig, read by decisions. */
	_Atomic uint8_t access;
	/* Its allowance as the global ceiling cut it (the last one
	 * installed, its own aside), and what that adds to the ceiling's
	 * level (ceiling.c) in thousandths of a token (per second): all of
	 * it while the quota runs on its own allowance in the level, else
	 * 0. Under set_lock. */
	allot__allowance cut;
	int64_t ceil_rate_m, ceil_burst_m;
	/* It runs on its own allowance, above the cut one: its requests
	 * are charged to the ceiling's level (ceiling.c). */
	_Atomic bool owned;
} allot__qrt;

/* The fields a decision reads come first, in the key's first line.
 * A reconfig rewrites bucket, quota, weight, max_cost and known while
 * threads decide: relaxed atomics (plain moves on x86). A decision may
 * see one field new and another old once, never a torn one. */
struct allot_key {
	_Alignas(64) _Atomic(allot__bucket *) bucket;
	_Atomic(allot__qrt *) quota;
	uint32_t id; /* index into every thread block */
	_Atomic uint32_t weight;
	_Atomic uint32_t max_cost; /* floor(quota burst) */
	uint32_t cls; /* endpoint class index */
	_Atomic bool known; /* charges a configured caller's quota */
	bool dynamic; /* in the unknown-identity pool */
	/* Stacked levels it charges on top of `quota` (a->stacks[id]), 0:
	 * none, the one-level decision. */
	_Atomic uint8_t nup;
	_Atomic uint32_t pins;
	/* Even when stable; odd while a dynamic key is being recycled. */
	_Atomic uint32_t gen;
	uint64_t hash;
	const char *identity;
};
_Static_assert(sizeof(struct allot_key) == 64,
    "a key is one line: 10,000 keys of a class lie in 640 KB");

/*
 * Stacked limits (docs/configuration.md): the quotas a key charges on
 * top of its own, all or none, in order: its caller's own quota (for a
 * stacked endpoint quota), then its group's ("PREFIX* ENDPOINT", then
 * "PREFIX*"), then "* ENDPOINT", then "*" (stack.c), then the global
 * ceiling's level when its own quota is one of the level's (ceiling.c).
 * Written by a reconfig (cfg_lock and dyn_lock), read by decisions with
 * relaxed loads: one racing a reconfig may charge a stack half old, half new,
 * once; every index names a quota slot that lives until destroy.
 */
#define ALLOT__STACK_MAX 6u
typedef struct allot__stack {
	_Atomic uint32_t q[ALLOT__STACK_MAX]; /* a->quotas indexes */
	/* The caller's own quota it was set with (allot__stack_set's
	 * `own`), for allot__stack_refresh(). */
	_Atomic uint32_t own;
	uint32_t pad_;
} allot__stack;
_Static_assert(sizeof(allot__stack) == 32, "a key's levels: 32 bytes");

/* The pattern callers of the config in force, for the levels of each
 * key (stack.c). */
typedef struct allot__patterns allot__patterns;

/* The counters a stacked level keeps in each thread block, apart from
 * any key's: quota i's are at c[a->level_base + i]. A request admitted
 * counts there for each level above the key's own quota; one denied by
 * a level counts its denial there, and takes it back from the key's own
 * quota's (whose bucket did not deny it: allotd would refute it), so
 * that allot__quota_totals() gives each quota what its bucket decided.
 * The counts wrap as unsigned: only their sums are read. */

/* One reader's last look at two of a key's counters (the denial log's,
 * the strangers'; sync thread only) and its generation: a recycled
 * dynamic key counts again from 0. */
typedef struct allot__look {
	uint64_t x, y;
	uint32_t gen;
} allot__look;

/* How far counters x and y of a key of generation `gen` moved since
 * look `l`; the look moves on. */
static inline void
allot__look_since(allot__look *l, uint32_t gen, uint64_t x, uint64_t y,
    uint64_t *ret_dx, uint64_t *ret_dy)
{
	if (gen != l->gen || x < l->x || y < l->y) {
		l->gen = gen; /* a new identity, or counters reset */
		l->x = l->y = 0;
	}
	*ret_dx = x - l->x;
	*ret_dy = y - l->y;
	l->x = x;
	l->y = y;
}

/* What the decision path never reads of a key, apart (a->kcold, by key
 * id), so that keys stay one line each. */
typedef struct allot__kcold {
	/* Counts before the key's current identity (dyn_lock): a recycled
	 * key starts from these instead of zeroing other threads' blocks. */
	allot__ktotals base;
	/* Eviction bookkeeping (dyn_lock). */
	uint64_t sweep_sum;
	uint64_t sweep_ns;
	uint32_t next_free;
	uint32_t slot; /* index in dyn_index, or UINT32_MAX */
	/* Settlements made for the key's current identity (settle_lock):
	 * each settles one admitted request, at most once; and the tokens
	 * those requests kept. */
	uint64_t settled;
	uint64_t settled_tokens;
	/* The denial log's last look at the key (denylog.c): its denials
	 * and denied tokens; the strangers' (strangers.c): its requests
	 * admitted and denied. */
	allot__look logged;
	allot__look named;
	/* Per-value buckets' (values.c): its tokens admitted and denied. */
	allot__look valued;
} allot__kcold;

struct allot_agent {
	/* The config in force (owned). Swapped by a reconfig under cfg_lock
	 * and dyn_lock; read by the reconfiguring thread or under either. */
	allot_config *cfg;
	allot__logger log;
	allot_clock_fn clock_fn;
	void *clock_ctx;
	const allot__tsc *tsc;
	uint64_t seed;
	uint64_t gen; /* unique per agent, keys TLS caches */

	/* Quotas: ids never change (agent_int.h, allot__qrt). quota_cap is
	 * fixed at create; nquotas is written only by the thread that
	 * reconfigures, read with an atomic load elsewhere. The default
	 * quota's id is the number of callers of the first config. */
	allot__qrt *quotas; /* quota_cap */
	uint32_t quota_cap;
	_Atomic uint32_t nquotas;
	uint32_t default_quota; /* its index */
	_Atomic uint32_t max_weight; /* of the config in force */

	/* Endpoint classes: nclasses reserved at create, the last one
	 * "default" (fixed); endpoints take classes 0.. in the order they
	 * first appear, never reused. Insert-only, read lock-free. */
	uint32_t nclasses;
	_Atomic uint32_t nep; /* endpoint classes in use */
	const char **class_names; /* nclasses; agent-owned strings */
	_Atomic uint32_t *class_weight; /* nclasses: endpoint weights */
	char *ep_names; /* nclasses * ALLOT__EP_NAME_SZ */
	size_t *ep_len;
	struct allot__ep_slot *ep_tab; /* hash index past EP_LINEAR */
	uint32_t ep_mask;

	/* Configured identities (groups of nclasses keys each), group_cap
	 * reserved at create: identity to keys, insert-only and read
	 * lock-free (agent.c). An identity keeps its keys for the agent's
	 * life, whatever quotas later configs give it. */
	_Atomic uint64_t *caller_tab; /* allot__caller_entry words */
	allot__caller_name *caller_names; /* group_cap */
	uint32_t caller_mask;
	uint32_t group_cap;
	_Atomic uint32_t ngroups;
	struct allot__arena *names; /* identities and quota names */

	/* Class by class: identity g's key of class c is
	 * known_keys[c * group_cap + g] (allot__known_key), so the keys
	 * (and counters) of one endpoint class lie together however many
	 * classes are reserved. */
	allot_key *known_keys; /* nclasses * group_cap */
	allot__kcold *kcold; /* nkeys, by key id */
	/* A configured identity's key's totals when it started charging its
	 * current quota (cfg_lock): what it counted before belongs to the
	 * quota it left (reconfig.c). By key id; only these keys move. */
	allot__ktotals *qbase; /* nclasses * group_cap */
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
	/* Per-value buckets (values.h), by pool key: NULL until a config
	 * has shared: false; written under dyn_lock. */
	struct allot__vbucket *vals; /* dyn_cap */
	allot__idmap val_index;
	uint32_t val_free; /* free list head, UINT32_MAX = none */
	_Atomic uint32_t nvals;
	bool per_value; /* the config in force has shared: false */
	/* The default quota's rate, burst and shadow for them. */
	double val_rate, val_burst;
	bool val_shadow;

	/* Stacked levels (allot__stack), by key id; NULL when no key
	 * has room for them (never: allocated at create, untouched pages
	 * until a config stacks). */
	allot__stack *stacks;
	uint32_t level_base; /* first level counter id: quotas' follow */
	/* The pattern callers of the config in force (stack.c): swapped
	 * with it, read under dyn_lock. */
	allot__patterns *pats;

	/* Per-thread counter blocks (thread.c). */
	uint32_t nkeys; /* keys of every kind and the level counters */
	uint32_t max_blocks;
	_Atomic uint32_t nblocks;
	allot__tblock **blocks; /* max_blocks slots */
	allot__tblock *shared_block;
	pthread_mutex_t blk_lock;
	pthread_key_t tkey;
	bool tkey_ok;

	pthread_mutex_t set_lock; /* serialises allowance writers */
	pthread_mutex_t settle_lock; /* serialises refunds (allot_settle) */
	pthread_mutex_t cfg_lock; /* serialises reconfigs (reconfig.c) */
	allot_agent_options opts;
	char *coordinator;
	char *tls_ca;
	char *tls_cert;
	char *tls_name;
	char *service;
	char *replica_id;
	struct allot__sync *sync;
	/* The tail path (tail.h), driven by the sync loop; NULL when
	 * local-only. */
	struct allot__tail *tail;
	/* The global ceiling's level on this replica (ceiling.c): the
	 * bucket of a->quotas[ceil_q], one past the quotas' slots; whether
	 * the config in force has a ceiling that cuts its quotas; and the
	 * sums of what its members add to it (allot__qrt.ceil_rate_m,
	 * set_lock). */
	uint32_t ceil_q;
	_Atomic bool ceil_on;
	int64_t ceil_rate_m, ceil_burst_m;
	/* The callers use the tail path (allot_acquire_wait(), _async()):
	 * from the first such call the bursts of quotas with a reserve are
	 * installed as sent, not raised to wmax (a costlier request waits
	 * for the reserve), and their reports say so (KeyReport.tail). */
	_Atomic bool waits;
};

/* The endpoint classes in use are 0..nep-1 and the default (the last):
 * the i-th of them, for i <= nep. Keys of the spare classes between are
 * never reached by a lookup, so walks over keys skip them. */
static inline uint32_t
allot__class_at(const allot_agent *a, uint32_t i, uint32_t nep)
{
	return i < nep ? i : a->nclasses - 1;
}

static inline allot__kcold *
allot__kc(const allot_agent *a, const struct allot_key *k)
{
	return &a->kcold[k->id];
}

static inline struct allot_key *
allot__known_key(const allot_agent *a, uint32_t g, uint32_t cls)
{
	return &a->known_keys[(size_t) cls * a->group_cap + g];
}

/* The class of endpoint `name` (`len` bytes, hash `h`) in the
 * insert-only index, or UINT32_MAX: lock-free, for resolve (agent.c)
 * and for a reconfig (reconfig.c). */
static inline uint32_t
allot__ep_find(const allot_agent *a, const char *name, size_t len, uint64_t h)
{
	for (uint32_t p = (uint32_t) h & a->ep_mask;;
	     p = (p + 1) & a->ep_mask) {
		const struct allot__ep_slot *e = &a->ep_tab[p];
		uint32_t v = atomic_load_explicit(
		    &e->cls, memory_order_acquire);
		if (v == 0)
			return UINT32_MAX;
		if (e->hash == h && a->ep_len[v - 1] == len &&
		    memcmp(&a->ep_names[(v - 1) * ALLOT__EP_NAME_SZ], name,
		        len) == 0)
			return v - 1;
	}
}

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

/* Zeroed, 64-byte aligned memory (thread.c). Large sizes are fresh
 * mapped pages, zero until first touched: capacity reserved at create
 * costs address space, not resident memory, until it is used. */
void *allot__zalloc(size_t sz);
void allot__zfree(void *p);

int allot__blocks_init(allot_agent *a);
void allot__blocks_fini(allot_agent *a);

/* Give back every lease open in block `b` (its owner, at thread exit). */
void allot__leases_return(allot_agent *a, allot__tblock *b);

/* Sum a key's counters over every thread block, minus its base. */
void allot__key_totals(
    const allot_agent *a, const allot_key *k, allot__ktotals *ret);
/* Who was throttled (denylog.c): on the sync thread, about once a
 * second, the keys that denied in the `span_ns` since the last call,
 * the most denied first, logged ("ALLOT-DENIED", info), at most
 * ALLOT__DENYLOG_LINES and a line for the rest. */
#define ALLOT__DENYLOG_LINES 5
#define ALLOT__DENYLOG_NS 1000000000u
void allot__denylog(allot_agent *a, uint64_t span_ns);

/* The strangers (strangers.c): unknown identities that asked the most
 * since the last look, the most denied first, then the most admitted;
 * for the audit, which otherwise sees them as the default quota only. */
#define ALLOT__STRANGERS_MAX 8
typedef struct allot__stranger {
	char identity[ALLOT_IDENTITY_MAX + 1];
	char endpoint[64];
	uint64_t admitted, denied; /* requests */
} allot__stranger;
/* On the sync thread, about once a second: the look moves on. Returns
 * how many of out[0..ALLOT__STRANGERS_MAX) it filled. */
size_t allot__strangers_take(allot_agent *a, allot__stranger *out);
/* v[0..n) as Sync.strangers: msgs and ptrs (room for n) point into v.
 * Returns n. */
struct Allot__V1__Stranger;
size_t allot__strangers_wire(const allot__stranger *v, size_t n,
    struct Allot__V1__Stranger *msgs, struct Allot__V1__Stranger **ptrs);

/* Sum of every key charging quota `q`, evicted keys included. */
void allot__quota_totals(
    allot_agent *a, const allot__qrt *q, allot__ktotals *ret);

/* The tail path's decisions (agent.c), on the thread that drives it
 * (tail.c): `k` admitted with `cost` tokens of the central reserve
 * (counted, `*ret` from its bucket's allowance), true; false when a
 * stacked level above its own quota denied it after all (counted, and
 * the tokens put into its own quota's bucket: a deposit of the reserve,
 * or the standby's debt paid back, as the caller books them); or, its
 * wait over without them, decided once more on its local bucket and
 * counted like any decision. */
bool allot__decide_central(allot_agent *a, struct allot_key *k, uint32_t cost,
    uint64_t now, allot_decision *ret);
void allot__decide_final(allot_agent *a, struct allot_key *k, uint32_t cost,
    uint64_t now, allot_decision *ret);

/* Install an allowance on a quota's bucket (any thread): for a closed
 * or unlimited quota, its fixed mode instead (allot__quota_fix). */
void allot__quota_set(
    allot_agent *a, allot__qrt *q, const allot__allowance *al);
/* The same with the quota's own allowance before the global ceiling's
 * cut (NULL: none; ceiling.c): a member of the ceiling's level runs its
 * bucket on the larger of the two and adds `al` to the level. */
void allot__quota_set_own(allot_agent *a, allot__qrt *q,
    const allot__allowance *al, const allot__allowance *own);

/* The global ceiling's level (ceiling.c). At create, once a->quotas is
 * allocated: its slot, closed and empty until members join it. */
void allot__ceiling_init(allot_agent *a);
/* Whether quota `q` may be one of the level's: the config in force has
 * a ceiling that may cut its quotas, `q` is limited, enforcing (not in
 * shadow), not removed, and keeps no central reserve (whose callers draw
 * on the ceiling's reserve at allotd instead). It is one while it runs
 * on its own allowance (allot__qrt.owned). */
bool allot__ceiling_member(const allot_agent *a, const allot__qrt *q);
/* Quota `q`'s part of the level from its allowance as the ceiling cut
 * it (q->cut) while it runs on its own (q->owned), and the level's
 * allowance from the sums (set_lock held). */
void allot__ceiling_add(allot_agent *a, allot__qrt *q, uint64_t now);
/* Quota `q` leaves the level, its bucket just set back to its cut
 * allowance (set_lock held): the bucket keeps at most what the level
 * holds, and what it keeps leaves the level. Its bucket held tokens the
 * level counted as everyone's; spent through the level by the others,
 * they must not be spent again from its bucket. (Not its part by its
 * share of the level's burst: when every quota leaves at once, as when
 * the demand comes to bind, the parts of those whose buckets are
 * emptier than their part would be lost with the level.) */
void allot__ceiling_leave(allot_agent *a, allot__qrt *q, uint64_t now);
/* Every quota's part again, after a change of who is a member (a
 * reconfig, a quota's central reserve coming or going). Takes set_lock. */
void allot__ceiling_update(allot_agent *a);
/* Tokens moved into (negative) or out of (positive) the bucket of quota
 * `q`, as allot__bucket_adjust(), moved in the level too when `q` is one
 * of its members: a loan, a refund, a settled debt. */
void allot__ceiling_adjust(
    allot_agent *a, const allot__qrt *q, int64_t tokens, uint64_t now);
/* The same for `tokens` put into it, a part of one included, as
 * allot__bucket_deposit(): the central reserve's tokens that move with
 * a burst it gave up (Share.prefill). */
void allot__ceiling_deposit(
    allot_agent *a, const allot__qrt *q, double tokens, uint64_t now);
/* `al` as quota `q` takes it: a closed or unlimited quota's fixed mode
 * (allot__qrt.access, no amounts), any other's unchanged. */
void allot__quota_fix(const allot__qrt *q, allot__allowance *al);

/* How the sync engine installs allowances and configs: given to it at
 * creation, so that it calls nothing in agent.c (agent.c starts sync.c,
 * which drives sync_core.c; no call goes back up). `quota` indexes
 * a->quotas. Positional initialisers { install, ctx } stay valid: the
 * later members are then NULL. */
typedef struct allot__installer {
	/* `own`: the quota's own allowance before the ceiling's cut
	 * (Share.own_rate, own_burst: rate and burst), or NULL. */
	void (*install)(void *ctx, uint32_t quota, const allot__allowance *al,
	    const allot__allowance *own);
	void *ctx;
	/* Install a config (a service's view, already verified) atomically:
	 * new and removed callers, weights, shadow, fallback, ceiling. On
	 * ALLOT_OK the agent owns `cfg`; on error nothing changed and the
	 * caller still owns it (ALLOT_EFULL: past the capacity reserved at
	 * create). Quota ids never change; new quotas are appended, so the
	 * caller compares a->nquotas before and after to find them. New
	 * quotas start at their static share over the replica count the
	 * agent was created with; other allowances are left as they are
	 * when a coordinator is set (it reinstalls them from the shares of
	 * the same reply; `static_allowance` for a fallback), and set to
	 * the new static share at once when local-only. Called from the
	 * thread that runs the engine. NULL: this engine cannot reconfigure.
	 */
	int (*reconfig)(void *ctx, allot_config *cfg);
	/* The static allowance of quota `quota` over `replicas` (0 counts
	 * as 1): its static share (fallback false) or its fallback (true),
	 * with the global ceiling's local share applied (fallback.h). NULL:
	 * compute it from the quota's own rate and burst. */
	void (*static_allowance)(void *ctx, uint32_t quota, uint32_t replicas,
	    bool fallback, allot__allowance *ret);
} allot__installer;

/* The installer of agent `a` (reconfig.c): install into its buckets,
 * reconfigure it. */
void allot__agent_installer(allot_agent *a, allot__installer *ret);

/* At create, before the keys (reconfig.c): the default quota and the
 * endpoint weights of `cfg`, which keys start from. */
int allot__reconfig_prepare(allot_agent *a, const allot_config *cfg);
/* At destroy: what reconfig.c allocated. */
void allot__reconfig_fini(allot_agent *a);
void allot__key_init(allot_agent *a, struct allot_key *k, allot__qrt *q,
    uint32_t cls, const char *identity, uint32_t id);

/* Install `cfg` (owned on ALLOT_OK) into `a` (reconfig.c): the engine
 * behind allot__installer.reconfig and allot_agent_set_config(). With
 * `initial`, the first config, at create (nothing in place yet). */
int allot__reconfig(allot_agent *a, allot_config *cfg, bool initial);

/* Stacked limits (stack.c). The pattern table of `cfg`, whose
 * callers[i] has quota slot slot[i] (NONE: none) and endpoint class
 * cls[i] (NONE: its caller's own): ALLOT_OK, or ALLOT_ENOMEM. */
int allot__patterns_build(const allot_config *cfg, const uint32_t *slot,
    const uint32_t *cls, allot__patterns **ret);
void allot__patterns_free(allot__patterns *t);
/* Set the levels key `k` (of `identity`, NULL for none) charges on top
 * of its own quota (k->quota): `own` first (its caller's own quota, when
 * `k` charges a stacked endpoint quota; else NONE), then its group's and
 * every caller's, from a->pats (dyn_lock held); and its largest cost,
 * the smallest of its quotas' (allot__qrt.max_cost) but those in
 * shadow. */
void allot__stack_set(
    allot_agent *a, struct allot_key *k, const char *identity, uint32_t own);
/* Every key's levels set again (dyn_lock taken): after a quota's central
 * reserve came or went, which decides whether its keys charge the
 * ceiling's level. The sync thread, which also reconfigures. */
void allot__stack_refresh(allot_agent *a);

/* Evict idle unknown-identity keys now (any thread; takes dyn_lock). */
void allot__agent_sweep(allot_agent *a, uint64_t now);

/* The coordinator loop (sync.c), installing through `in`. */
int allot__sync_start(allot_agent *a, const allot__installer *in);
void allot__sync_stop(allot_agent *a);

/* Whether quota `q`'s callers wait for its central reserve: its burst
 * is then run as the coordinator sent it (KeyReport.tail). */
static inline bool
allot__quota_waits(const allot_agent *a, allot__qrt *q)
{
	return atomic_load_explicit(&q->central, memory_order_relaxed) &&
	    atomic_load_explicit(&a->waits, memory_order_relaxed);
}

/* The standby of quota `q` (agent.c): whether a request of `cost` may
 * run its bucket into debt while no coordinator can be asked for the
 * reserve; if so the debt is taken. */
bool allot__standby_take(
    allot_agent *a, allot__qrt *q, uint32_t cost, uint64_t now);

/* Whether the calling thread is `a`'s sync loop (sync.c). */
bool allot__sync_on_loop(const allot_agent *a);

/* The coordinator's view of quota `quota` (a->quotas index) into the
 * fields of `ret` that say so (sync.c); untouched when local-only. */
void allot__sync_key_state(
    allot_agent *a, uint32_t quota, allot_key_stats *ret);

#endif
