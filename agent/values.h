/* SPDX-License-Identifier: MIT */
/*
 * Per-value buckets (docs/configuration.md, "A bucket per value"): with
 * `shared: false` on the default quota, each unknown caller, that is
 * each value of whatever the service or the sidecar passes as the
 * identity (a user id, an API key, a client address), gets a bucket of
 * its own with the default's rate and burst instead of all of them
 * sharing one. The unknown-identity pool (agent.c) bounds them: a value
 * has one bucket however many endpoint classes it calls, at most
 * max_unknown_keys values are held, an idle one is evicted with its keys
 * and costs nothing after, and past the bound new values share the
 * overflow key's default bucket.
 *
 * A value active on several replicas is held to its quota globally: each
 * Sync reports the values that moved (ValueReport, the busiest
 * ALLOT__VALUES_PER_SYNC), and the Reply sends back this replica's part
 * of each (ValueShare), installed on its bucket. A value active here
 * alone, or with no answer yet, runs on the whole quota.
 *
 * Everything is allocated the first time a config says shared: false
 * (allot__values_reserve(), on the reconfiguring thread), never on a
 * decision; buckets, index and counters are written under dyn_lock, and
 * a decision reads only its key's bucket pointer, as for any key.
 */
#ifndef ALLOT_AGENT_VALUES_H
#define ALLOT_AGENT_VALUES_H

#include "agent_int.h"

/* Values reported per Sync at most, the busiest first. */
#define ALLOT__VALUES_PER_SYNC 256u

typedef struct allot__vbucket {
	allot__bucket bucket; /* first: 64-byte aligned */
	uint64_t hash; /* of the value (allot__hash, the agent's seed) */
	uint32_t refs; /* pool keys charging it; 0: free */
	uint32_t next_free;
	/* Replicas the coordinator last saw it active on, and this one's
	 * part of its quota; 0: no answer yet, the whole quota. */
	uint32_t replicas;
	double share_rate, share_burst;
	/* Tokens its keys admitted and denied since its last ValueReport
	 * (the sync thread, under dyn_lock). */
	uint64_t admitted, denied;
	char value[ALLOT_IDENTITY_MAX + 1];
} allot__vbucket;

/* One value's report, as the next Sync carries it. */
typedef struct allot__value_report {
	char value[ALLOT_IDENTITY_MAX + 1];
	uint64_t admitted, denied;
	uint32_t vb; /* its bucket's index in a->vals */
} allot__value_report;

/* Before config `cfg` is installed (cfg_lock held): the buckets and
 * their index, the first time a config has shared: false. ALLOT_OK or
 * ALLOT_ENOMEM (the config is then not installed). */
int allot__values_reserve(allot_agent *a, const allot_config *cfg);
void allot__values_fini(allot_agent *a);

/* The config in force changed (dyn_lock held): per value or shared,
 * every pool key's bucket accordingly, every value's allowance anew. */
void allot__values_apply(allot_agent *a);

/* Pool key `k` took an identity (dyn_lock held): with per-value buckets,
 * its value's bucket, made if it is new. */
void allot__value_attach(allot_agent *a, allot_key *k);
/* Pool key `k` is being recycled (dyn_lock held): its value's bucket
 * loses it, and goes when it was the last. */
void allot__value_detach(allot_agent *a, allot_key *k);

/* Whether pool key `k` may be evicted as far as its value goes: it is
 * not the last key of a value whose bucket has yet to refill. A value
 * leaves only with a full bucket, so its next request, which finds a
 * new full bucket, is not handed a burst its old one had spent (a
 * per-day quota's value idle for the pool's idle period stays). */
bool allot__value_evictable(allot_agent *a, const allot_key *k, uint64_t now);

/* On the sync thread, for the next Sync: the values whose keys admitted
 * or denied anything since the last call, the busiest first, at most
 * `max` into `out`; their counts start over. The default quota's key id
 * into `*ret_key`. Returns how many. */
size_t allot__values_take(
    allot_agent *a, allot__value_report *out, size_t max, uint32_t *ret_key);
/* v[0..n) as Sync.values of key `key`: msgs and ptrs (room for n) point
 * into v. Returns n. */
struct Allot__V1__ValueReport;
size_t allot__values_wire(const allot__value_report *v, size_t n, uint32_t key,
    struct Allot__V1__ValueReport *msgs, struct Allot__V1__ValueReport **ptrs);
/* The coordinator's parts (Reply.values), installed on their values'
 * buckets; a value no longer held is skipped. */
struct Allot__V1__ValueShare;
void allot__values_install(
    allot_agent *a, struct Allot__V1__ValueShare *const *v, size_t n);

/* Values held now (any thread; a relaxed read). */
uint32_t allot__values_held(const allot_agent *a);

#endif
