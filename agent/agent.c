/* SPDX-License-Identifier: MIT */
/*
 * The agent: creation from a quota config, key resolution and the hot
 * path. Everything allocated here is allocated at create; the per-request
 * path (allot_acquire) reads the key, reads the clock, runs the bucket
 * (bucket.h) and adds to two counters in the calling thread's own block
 * (thread.c), with no locked instruction. A key contended by several
 * threads is served from per-thread token leases instead (bucket.h), so
 * its bucket's line is written once per batch, not per decision.
 * Keys of unknown identities come from a bounded pool; when it is full
 * they share one overflow key per endpoint class, and idle unpinned keys
 * are evicted to make room.
 * A new config is installed by reconfig.c while threads decide: the
 * fields of a key a decision reads are relaxed atomics (plain moves),
 * and the identity and endpoint indexes are insert-only, so resolution
 * and decisions take no lock and read nothing that can be freed.
 * Layering: agent.c starts the sync loop (sync.c), which drives the sync
 * engine (sync_core.c); the engine installs allowances and configs
 * through the installer reconfig.c hands down (agent_int.h), so no call
 * goes back up.
 */
#include "agent_int.h"
#include "config_cache.h"
#include "sync_int.h"
#include "tail.h"

#include <errno.h>
#include <linux/futex.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fallback.h"

#define NAME_SZ (ALLOT_IDENTITY_MAX + 1)
#define NONE UINT32_MAX

/* ---- options ---- */

void
allot_agent_options_init(allot_agent_options *o)
{
	if (o == NULL)
		return;
	memset(o, 0, sizeof *o);
	o->max_unknown_keys = 4096;
	o->idle_evict_ms = 300000;
	o->max_threads = 64;
	o->log_level = ALLOT_LOG_INFO;
	o->sync_interval_ms = 100;
	o->sync_jitter = 0.1;
	o->initial_replicas = 1;
	o->reconnect_min_ms = 100;
	o->reconnect_max_ms = 5000;
}

static char *
dup_or_null(const char *s)
{
	return s == NULL ? NULL : strdup(s);
}

/* ---- lock-free string indexes ---- */

static inline uint32_t
find_class(const allot_agent *a, const char *ep)
{
	uint32_t dflt = a->nclasses - 1;
	uint32_t nep = atomic_load_explicit(&a->nep, memory_order_acquire);
	if (ep == NULL || nep == 0)
		return dflt;
	size_t len = strlen(ep);
	/* A handful of endpoints: compare lengths, then bytes. */
	if (nep <= ALLOT__EP_LINEAR) {
		for (uint32_t i = 0; i < nep; i++)
			if (a->ep_len[i] == len &&
			    memcmp(&a->ep_names[i * ALLOT__EP_NAME_SZ], ep,
			        len) == 0)
				return i;
		return dflt;
	}
	uint32_t v = allot__ep_find(a, ep, len, allot__hash(ep, len, a->seed));
	return v != UINT32_MAX ? v : dflt;
}

static inline allot_key *
find_caller(
    const allot_agent *a, const char *id, size_t len, uint64_t h, uint32_t cls)
{
	for (uint32_t p = (uint32_t) h & a->caller_mask;;
	     p = (p + 1) & a->caller_mask) {
		/* An acquire load (a plain move on x86): the name and keys
		 * of the group were written before it was published. */
		uint64_t e = atomic_load_explicit(
		    &a->caller_tab[p], memory_order_acquire);
		if (e == 0)
			return NULL;
		if (!allot__caller_tag_is(e, h))
			continue;
		/* Everything the decision will read, asked for now, from
		 * the entry alone: the key, the bucket and this thread's
		 * counters come while the name is compared, not one after
		 * the other. Known keys are numbered class by class,
		 * identity by identity (allot__known_key). */
		uint32_t g = allot__caller_group(e);
		size_t off = (size_t) cls * a->group_cap + g;
		allot_key *k = &a->known_keys[off];
		const char *name = a->caller_names[g].s;
		__builtin_prefetch(name);
		__builtin_prefetch(k);
		__builtin_prefetch(
		    &a->quotas[allot__caller_quota(e)].bucket, 1);
		if (allot__likely(allot__tl.gen == a->gen))
			__builtin_prefetch(&allot__tl.b->c[off], 1);
		if (allot__likely(len <= ALLOT__CALLER_INLINE)) {
			/* The terminator too: not a longer name's prefix. */
			if (memcmp(name, id, len + 1) == 0)
				return k;
		} else if (memcmp(k->identity, id, len) == 0 &&
		    k->identity[len] == '\0') {
			/* The arena copy, zero padded past its end. */
			return k;
		}
	}
}

/* Zeroed, 64-byte aligned room for `n` keys (one more: never empty). */
static allot_key *
keys_alloc(size_t n)
{
	return allot__zalloc(sizeof(allot_key) * (n + 1));
}

/* ---- create / destroy ---- */

void
allot__key_init(allot_agent *a, allot_key *k, allot__qrt *q, uint32_t cls,
    const char *identity, uint32_t id)
{
	atomic_init(&k->bucket, &q->bucket);
	atomic_init(&k->quota, q);
	k->id = id;
	k->cls = cls;
	atomic_init(&k->weight,
	    atomic_load_explicit(&a->class_weight[cls], memory_order_relaxed));
	double b = floor(q->static_burst);
	atomic_init(
	    &k->max_cost, b >= 4294967295.0 ? UINT32_MAX : (uint32_t) b);
	atomic_init(&k->known, false);
	k->identity = identity;
	atomic_init(&k->pins, 0);
	atomic_init(&k->gen, 0);
	allot__kc(a, k)->slot = NONE;
	allot__kc(a, k)->next_free = NONE;
}

/* Own copies of the option strings; the options then point at them. */
static int
options_copy(allot_agent *a, const allot_agent_options *o)
{
	a->coordinator = dup_or_null(o->coordinator);
	a->service = dup_or_null(o->service != NULL ? o->service : "default");
	if (o->replica_id != NULL) {
		a->replica_id = strdup(o->replica_id);
	} else {
		char host[256] = "localhost";
		gethostname(host, sizeof host - 1);
		char buf[300];
		snprintf(buf, sizeof buf, "%s-%ld", host, (long) getpid());
		a->replica_id = strdup(buf);
	}
	if (a->service == NULL || a->replica_id == NULL ||
	    (o->coordinator != NULL && a->coordinator == NULL))
		return ALLOT_ENOMEM;
	a->tls_ca = dup_or_null(o->tls_ca_file);
	a->tls_cert = dup_or_null(o->tls_cert_key_file);
	a->tls_name = dup_or_null(o->tls_server_name);
	if ((o->tls_ca_file != NULL && a->tls_ca == NULL) ||
	    (o->tls_cert_key_file != NULL && a->tls_cert == NULL) ||
	    (o->tls_server_name != NULL && a->tls_name == NULL))
		return ALLOT_ENOMEM;
	a->opts.tls_ca_file = a->tls_ca;
	a->opts.tls_cert_key_file = a->tls_cert;
	a->opts.tls_server_name = a->tls_name;
	a->opts.coordinator = a->coordinator;
	a->opts.service = a->service;
	a->opts.replica_id = a->replica_id;
	return ALLOT_OK;
}

/* Every key, numbered across kinds: configured identities by endpoint
 * class (group_cap of them, reserved; reconfig.c initialises an
 * identity's keys when it first appears), then anonymous and overflow
 * keys, then the unknown-identity pool, which charge the default quota. */
static int
keys_init(allot_agent *a)
{
	allot__qrt *def = &a->quotas[a->default_quota];
	uint32_t id = a->group_cap * a->nclasses;
	for (uint32_t j = 0; j < a->nclasses; j++) {
		allot__key_init(a, &a->anon_keys[j], def, j, "", id++);
		allot__key_init(
		    a, &a->overflow_keys[j], def, j, "(overflow)", id++);
	}
	for (uint32_t i = 0; i < a->dyn_cap; i++) {
		allot_key *k = &a->dyn_keys[i];
		allot__key_init(
		    a, k, def, 0, &a->dyn_names[(size_t) i * NAME_SZ], id++);
		k->dynamic = true;
		allot__kc(a, k)->next_free = i + 1 < a->dyn_cap ? i + 1 : NONE;
	}
	a->dyn_free = a->dyn_cap > 0 ? 0 : NONE;
	/* Sized as an idmap of the pool, but an index of its own: lock-free
	 * reads of atomic key pointers, written under dyn_lock. */
	a->dyn_mask = allot__idmap_slots(a->dyn_cap) - 1;
	a->dyn_index = calloc((size_t) a->dyn_mask + 1, sizeof *a->dyn_index);
	return a->dyn_index == NULL ? ALLOT_ENOMEM : ALLOT_OK;
}

int
allot__syncc_init(allot__syncc *c, allot_agent *a, uint64_t seed)
{
	allot__installer in;
	allot__agent_installer(a, &in);
	return allot__syncc_create(c, a, seed, &in);
}

static bool
options_valid(const allot_agent_options *o)
{
	return o->sync_interval_ms != 0 && o->initial_replicas != 0 &&
	    o->max_threads != 0 && o->max_threads <= 65536 &&
	    o->sync_jitter >= 0 && o->sync_jitter < 1 &&
	    o->reconnect_min_ms != 0 &&
	    o->reconnect_max_ms >= o->reconnect_min_ms &&
	    o->max_callers <= ALLOT__MAX_CALLERS;
}

/* What to reserve for later configs (agent_int.h, "Memory" in
 * docs/configuration.md): callers and endpoint classes. */
static void
capacity(allot_agent *a, const allot_config *c)
{
	size_t n = c->ncallers;
	size_t cap = a->opts.max_callers;
	if (cap == 0)
		cap = n * 2 > n + 256 ? n * 2 : n + 256;
	if (cap > ALLOT__MAX_CALLERS)
		cap = ALLOT__MAX_CALLERS;
	if (cap < n)
		cap = n;
	a->group_cap = (uint32_t) cap;
	a->quota_cap = (uint32_t) cap + 1;
	/* Spare endpoint classes, fewer when the callers are many: the
	 * known keys reserved (every identity has one per class, and every
	 * thread block a counter line per key) stay within 4 times what
	 * the first config needs, or ALLOT__KEYS_RESERVED. */
	size_t first = c->nendpoints + 1;
	size_t cls = first + ALLOT__SPARE_CLASSES;
	size_t budget = 4 * (n > 0 ? n : 1) * first;
	if (budget < ALLOT__KEYS_RESERVED)
		budget = ALLOT__KEYS_RESERVED;
	while (cls > first + 1 && cap * cls > budget)
		cls--;
	a->nclasses = (uint32_t) (cls > ALLOT__MAX_ENDPOINTS + 1 ?
	        ALLOT__MAX_ENDPOINTS + 1 :
	        cls);
}

/* The caller index's size: at most two thirds full. Its slots are 8
 * bytes, 8 to a line, so a probe past the home slot mostly stays in the
 * line it read, and the smaller table stays in the core's cache between
 * lookups of the same part of it (128 KB for 10,000 callers). */
static uint32_t
caller_slots(uint32_t n)
{
	uint32_t cap = 8;
	while (cap < (uint64_t) n * 3 / 2 + 1)
		cap <<= 1;
	return cap;
}

static int
alloc_all(allot_agent *a)
{
	size_t nknown = (size_t) a->group_cap * a->nclasses;
	size_t nkeys = nknown + 2 * (size_t) a->nclasses + a->dyn_cap;
	if (nkeys >= UINT32_MAX)
		return ALLOT_EINVAL;
	a->nkeys = (uint32_t) nkeys;
	a->quotas = allot__zalloc(sizeof(allot__qrt) * a->quota_cap);
	a->class_names = calloc(a->nclasses, sizeof *a->class_names);
	a->class_weight = calloc(a->nclasses, sizeof *a->class_weight);
	a->ep_names = calloc(a->nclasses, ALLOT__EP_NAME_SZ);
	a->ep_len = calloc(a->nclasses, sizeof *a->ep_len);
	a->ep_mask = allot__idmap_slots(a->nclasses) - 1;
	a->ep_tab = calloc((size_t) a->ep_mask + 1, sizeof *a->ep_tab);
	a->caller_mask = caller_slots(a->group_cap) - 1;
	a->caller_tab = allot__zalloc(
	    sizeof *a->caller_tab * ((size_t) a->caller_mask + 1));
	a->caller_names = allot__zalloc(
	    sizeof *a->caller_names * ((size_t) a->group_cap + 1));
	a->known_keys = keys_alloc(nknown);
	a->kcold = allot__zalloc(sizeof *a->kcold * (nkeys + 1));
	a->qbase = allot__zalloc(sizeof *a->qbase * (nknown + 1));
	a->anon_keys = keys_alloc(a->nclasses);
	a->overflow_keys = keys_alloc(a->nclasses);
	a->dyn_keys = keys_alloc(a->dyn_cap);
	a->dyn_names = calloc((size_t) a->dyn_cap + 1, NAME_SZ);
	if (a->quotas == NULL || a->class_names == NULL ||
	    a->class_weight == NULL || a->ep_names == NULL ||
	    a->ep_len == NULL || a->ep_tab == NULL || a->caller_tab == NULL ||
	    a->caller_names == NULL || a->known_keys == NULL ||
	    a->kcold == NULL || a->qbase == NULL || a->anon_keys == NULL ||
	    a->overflow_keys == NULL || a->dyn_keys == NULL ||
	    a->dyn_names == NULL)
		return ALLOT_ENOMEM;
	return ALLOT_OK;
}

int
allot_agent_create(const allot_config *cfg, const allot_agent_options *opts,
    allot_agent **ret_agent)
{
	if (cfg == NULL || ret_agent == NULL)
		return ALLOT_EINVAL;
	allot_agent_options o;
	if (opts != NULL)
		o = *opts;
	else
		allot_agent_options_init(&o);
	if (!options_valid(&o))
		return ALLOT_EINVAL;

	int rc = ALLOT_ENOMEM;
	allot_agent *a = calloc(1, sizeof *a);
	if (a == NULL)
		return ALLOT_ENOMEM;
	pthread_mutex_init(&a->dyn_lock, NULL);
	pthread_mutex_init(&a->set_lock, NULL);
	pthread_mutex_init(&a->settle_lock, NULL);
	pthread_mutex_init(&a->cfg_lock, NULL);
	a->opts = o;
	atomic_store_explicit(&a->waits, o.waits, memory_order_relaxed);
	a->log.fn = o.log;
	a->log.ctx = o.log_ctx;
	a->log.level = o.log_level;
	a->clock_fn = o.clock;
	a->clock_ctx = o.clock_ctx;
	a->tsc = allot__tsc_get();
	a->seed = allot__hash_seed();
	a->max_blocks = o.max_threads;
	a->idle_evict_ns = (uint64_t) o.idle_evict_ms * 1000000u;
	a->dyn_free = NONE;
	a->dyn_cap = o.max_unknown_keys;

	/* The config plane: the last config the coordinator sent, when it
	 * was cached and still loads (config_cache.c); else `cfg`. */
	allot_config *c = NULL;
	allot__config_cache_load(&o, cfg, &a->log, &c);
	if (c == NULL)
		c = allot__config_dup(cfg);
	if (c == NULL || options_copy(a, &o) != ALLOT_OK)
		goto fail;
	capacity(a, c);
	if ((rc = alloc_all(a)) != ALLOT_OK ||
	    (rc = allot__blocks_init(a)) != ALLOT_OK)
		goto fail;
	/* The default quota takes the id after the first config's callers,
	 * as before reconfiguration existed, and keeps it. */
	a->default_quota = (uint32_t) c->ncallers;
	if ((rc = allot__reconfig_prepare(a, c)) != ALLOT_OK ||
	    (rc = keys_init(a)) != ALLOT_OK ||
	    (rc = allot__reconfig(a, c, true)) != ALLOT_OK)
		goto fail;
	c = NULL; /* the agent's now */

	allot__installer in;
	allot__agent_installer(a, &in);
	if (a->coordinator != NULL &&
	    (rc = allot__sync_start(a, &in)) != ALLOT_OK)
		goto fail;
	allot__log(&a->log, ALLOT_LOG_INFO, "ALLOT-AGENT-START",
	    "agent %s for service %s: %zu callers (room for %u), %u endpoint "
	    "classes (room for %u), clock %s, counters for up to %u threads, "
	    "coordinator %s",
	    a->replica_id, a->service, a->cfg->ncallers, a->group_cap,
	    atomic_load(&a->nep) + 1, a->nclasses,
	    a->clock_fn != NULL ? "injected" :
	        a->tsc->usable  ? "tsc" :
	                          "CLOCK_MONOTONIC",
	    a->max_blocks,
	    a->coordinator != NULL ? a->coordinator : "none (local-only)");
	*ret_agent = a;
	return ALLOT_OK;
fail:
	allot_config_free(c);
	allot_agent_destroy(a);
	return rc;
}

void
allot_agent_destroy(allot_agent *a)
{
	if (a == NULL)
		return;
	if (a->sync != NULL)
		allot__sync_stop(a);
	free(a->dyn_index);
	if (a->blocks != NULL || a->shared_block != NULL)
		allot__blocks_fini(a);
	free(a->dyn_names);
	allot__zfree(a->dyn_keys);
	allot__zfree(a->overflow_keys);
	allot__zfree(a->anon_keys);
	allot__zfree(a->known_keys);
	allot__zfree(a->kcold);
	allot__zfree(a->qbase);
	allot__reconfig_fini(a);
	free(a->ep_tab);
	free(a->ep_len);
	free(a->ep_names);
	allot__zfree(a->caller_tab);
	allot__zfree(a->caller_names);
	free(a->class_names);
	free(a->class_weight);
	allot__zfree(a->quotas);
	free(a->coordinator);
	free(a->tls_ca);
	free(a->tls_cert);
	free(a->tls_name);
	free(a->service);
	free(a->replica_id);
	allot_config_free(a->cfg);
	pthread_mutex_destroy(&a->dyn_lock);
	pthread_mutex_destroy(&a->set_lock);
	pthread_mutex_destroy(&a->settle_lock);
	pthread_mutex_destroy(&a->cfg_lock);
	free(a);
}

/* ---- unknown identities ---- */

static inline uint64_t
dyn_hash(uint64_t id_hash, uint32_t cls)
{
	return allot__mix64(id_hash ^ ((uint64_t) cls << 56));
}

/* Re-read a key's generation after reading its name: a seqlock read
 * side. ThreadSanitizer does not model fences, so its builds use a
 * read-modify-write, which orders the same way. */
static inline uint32_t
gen_recheck(allot_key *k)
{
#if defined(__SANITIZE_THREAD__)
	return atomic_fetch_add_explicit(&k->gen, 0, memory_order_acq_rel);
#else
	atomic_thread_fence(memory_order_acquire);
	return atomic_load_explicit(&k->gen, memory_order_relaxed);
#endif
}

/* Lock-free lookup. A hit is verified against the key's generation so a
 * key being recycled concurrently is never returned for the wrong name. */
static allot_key *
dyn_lookup(
    allot_agent *a, const char *id, size_t len, uint64_t h, uint32_t cls)
{
	uint32_t p = (uint32_t) h & a->dyn_mask;
	for (uint32_t n = 0; n <= a->dyn_mask; n++) {
		allot_key *k = atomic_load_explicit(
		    &a->dyn_index[p], memory_order_acquire);
		if (k == NULL)
			return NULL;
		uint32_t g = atomic_load_explicit(
		    &k->gen, memory_order_acquire);
		if ((g & 1) == 0 && k->hash == h && k->cls == cls &&
		    strncmp(k->identity, id, len) == 0 &&
		    k->identity[len] == '\0') {
			if (gen_recheck(k) == g)
				return k;
		}
		p = (p + 1) & a->dyn_mask;
	}
	return NULL;
}

static void
fold_retired(allot_agent *a, allot_key *k)
{
	allot__ktotals t;
	allot__key_totals(a, k, &t);
	allot__ktotals *r =
	    &atomic_load_explicit(&k->quota, memory_order_relaxed)->retired;
	r->allowed += t.allowed;
	r->denied += t.denied;
	r->shadow_denied += t.shadow_denied;
	r->spent += t.spent;
	r->denied_tokens += t.denied_tokens;
	r->shadow_tokens += t.shadow_tokens;
}

/* Remove a key from the index (dyn_lock held), keeping every probe
 * chain intact by re-inserting the entries that follow it. */
static void
dyn_remove(allot_agent *a, allot_key *k)
{
	uint32_t p = allot__kc(a, k)->slot;
	atomic_store_explicit(&a->dyn_index[p], NULL, memory_order_release);
	allot__kc(a, k)->slot = NONE;
	for (uint32_t q = (p + 1) & a->dyn_mask;; q = (q + 1) & a->dyn_mask) {
		allot_key *e = atomic_load_explicit(
		    &a->dyn_index[q], memory_order_relaxed);
		if (e == NULL)
			break;
		uint32_t home = (uint32_t) e->hash & a->dyn_mask;
		uint32_t r = home;
		while (atomic_load_explicit(
		           &a->dyn_index[r], memory_order_relaxed) != NULL &&
		    r != q)
			r = (r + 1) & a->dyn_mask;
		if (r != q) {
			/* Publish the copy before clearing the original, so a
			 * concurrent lookup finds it in one place or both;
			 * a miss is re-checked under the lock anyway. */
			atomic_store_explicit(
			    &a->dyn_index[r], e, memory_order_release);
			atomic_store_explicit(
			    &a->dyn_index[q], NULL, memory_order_release);
			allot__kc(a, e)->slot = r;
		}
	}
}

static void
dyn_recycle(allot_agent *a, allot_key *k)
{
	fold_retired(a, k);
	dyn_remove(a, k);
	atomic_fetch_add_explicit(&k->gen, 1, memory_order_acq_rel);
	/* The next identity counts from here: other threads' blocks are
	 * never written by anyone but their owner. */
	allot__ktotals raw;
	allot__key_totals(a, k, &raw);
	allot__kc(a, k)->settled = 0;
	allot__kc(a, k)->settled_tokens = 0;
	allot__ktotals *base = &allot__kc(a, k)->base;
	base->allowed += raw.allowed;
	base->denied += raw.denied;
	base->shadow_denied += raw.shadow_denied;
	base->spent += raw.spent;
	base->denied_tokens += raw.denied_tokens;
	base->shadow_tokens += raw.shadow_tokens;
	((char *) k->identity)[0] = '\0'; /* dyn_names storage */
	atomic_fetch_add_explicit(&k->gen, 1, memory_order_release);
	allot__kc(a, k)->next_free = a->dyn_free;
	a->dyn_free = (uint32_t) (k - a->dyn_keys);
	a->dyn_used--;
	atomic_fetch_add_explicit(&a->evictions, 1, memory_order_relaxed);
}

static void
sweep_locked(allot_agent *a, uint64_t now)
{
	a->last_sweep_ns = now;
	for (uint32_t i = 0; i < a->dyn_cap; i++) {
		allot_key *k = &a->dyn_keys[i];
		if (allot__kc(a, k)->slot == NONE)
			continue;
		allot__ktotals t;
		allot__key_totals(a, k, &t);
		uint64_t sum = t.allowed + t.denied + t.shadow_denied;
		allot__kcold *kc = allot__kc(a, k);
		if (sum != kc->sweep_sum) {
			kc->sweep_sum = sum;
			kc->sweep_ns = now;
			continue;
		}
		if (atomic_load_explicit(&k->pins, memory_order_acquire) ==
		        0 &&
		    now - kc->sweep_ns >= a->idle_evict_ns)
			dyn_recycle(a, k);
	}
}

void
allot__agent_sweep(allot_agent *a, uint64_t now)
{
	if (a->idle_evict_ns == 0)
		return;
	pthread_mutex_lock(&a->dyn_lock);
	sweep_locked(a, now);
	pthread_mutex_unlock(&a->dyn_lock);
}

static allot_key *
dyn_insert(allot_agent *a, const char *id, size_t len, uint64_t h,
    uint32_t cls, bool pin)
{
	pthread_mutex_lock(&a->dyn_lock);
	allot_key *k = dyn_lookup(a, id, len, h, cls);
	if (k != NULL)
		goto out;
	if (a->dyn_free == NONE && a->idle_evict_ns != 0) {
		uint64_t now = allot__agent_now(a);
		/* At most one full scan per quarter of the idle period. */
		if (now - a->last_sweep_ns >= a->idle_evict_ns / 4)
			sweep_locked(a, now);
	}
	if (a->dyn_free == NONE) {
		k = &a->overflow_keys[cls];
		atomic_fetch_add_explicit(
		    &a->overflowed, 1, memory_order_relaxed);
		goto out;
	}
	k = &a->dyn_keys[a->dyn_free];
	a->dyn_free = allot__kc(a, k)->next_free;
	a->dyn_used++;
	atomic_fetch_add_explicit(&k->gen, 1, memory_order_acq_rel);
	memcpy((char *) k->identity, id, len);
	((char *) k->identity)[len] = '\0';
	k->hash = h;
	k->cls = cls;
	/* Under dyn_lock, as a reconfig rewrites the pool's weights. */
	atomic_store_explicit(&k->weight,
	    atomic_load_explicit(&a->class_weight[cls], memory_order_relaxed),
	    memory_order_relaxed);
	allot__kc(a, k)->sweep_sum = 0;
	allot__kc(a, k)->sweep_ns = allot__agent_now(a);
	atomic_fetch_add_explicit(&k->gen, 1, memory_order_release);
	uint32_t p = (uint32_t) h & a->dyn_mask;
	while (atomic_load_explicit(&a->dyn_index[p], memory_order_relaxed) !=
	    NULL)
		p = (p + 1) & a->dyn_mask;
	allot__kc(a, k)->slot = p;
	atomic_store_explicit(&a->dyn_index[p], k, memory_order_release);
out:
	if (pin && k->dynamic)
		atomic_fetch_add_explicit(&k->pins, 1, memory_order_acq_rel);
	pthread_mutex_unlock(&a->dyn_lock);
	return k;
}

/* ---- resolution ---- */

static inline int
resolve(allot_agent *a, const char *identity, const char *endpoint, bool pin,
    allot_key **ret)
{
	uint32_t cls = find_class(a, endpoint);
	if (identity == NULL || identity[0] == '\0') {
		*ret = &a->anon_keys[cls];
		return ALLOT_OK;
	}
	size_t len = strnlen(identity, ALLOT_IDENTITY_MAX + 1);
	if (len > ALLOT_IDENTITY_MAX)
		return ALLOT_EINVAL;
	uint64_t h = allot__hash(identity, len, a->seed);
	allot_key *known = find_caller(a, identity, len, h, cls);
	if (known != NULL) {
		*ret = known;
		return ALLOT_OK;
	}
	uint64_t dh = dyn_hash(h, cls);
	allot_key *k = pin ? NULL : dyn_lookup(a, identity, len, dh, cls);
	if (k == NULL)
		k = dyn_insert(a, identity, len, dh, cls, pin);
	*ret = k;
	return ALLOT_OK;
}

int
allot_key_resolve(allot_agent *a, const char *identity, const char *endpoint,
    allot_key **ret_key)
{
	if (a == NULL || ret_key == NULL)
		return ALLOT_EINVAL;
	return resolve(a, identity, endpoint, true, ret_key);
}

void
allot_key_release(allot_agent *a, allot_key *k)
{
	(void) a;
	if (k == NULL || !k->dynamic)
		return;
	uint32_t old = atomic_load_explicit(&k->pins, memory_order_relaxed);
	while (old > 0 &&
	    !atomic_compare_exchange_weak_explicit(&k->pins, &old, old - 1,
	        memory_order_acq_rel, memory_order_relaxed))
		;
}

uint32_t
allot_key_cost(const allot_key *k)
{
	return k == NULL ?
	    0 :
	    atomic_load_explicit(&k->weight, memory_order_relaxed);
}

/* ---- the hot path ---- */

static inline void
fill_decision(const allot__take *t, uint32_t cost, allot_decision *d)
{
	double burst = t->burst;
	/* As the slot's tokens_per_ns was computed: the same double. */
	double tpn = t->rate / 1e9;
	d->cost = cost;
	d->retry_after_ns = t->wait_ns;
	d->reset_ns = t->debt_ns;
	d->limit = burst;
	d->rate = t->rate;
	double rem = burst - (double) t->debt_ns * tpn;
	d->remaining = rem > 0 ? rem : 0;
	/* A closed bucket (fallback: closed, or a zero grant) has nothing
	 * to offer, whatever level it will resume from. */
	if (allot__unlikely(!t->allowed && t->wait_ns != 0 &&
	        t->mode == ALLOT__MODE_CLOSED))
		d->remaining = 0;
}

/* ---- token leases (agent_int.h, bucket.h) ---- */

static inline unsigned
lease_tick(uint64_t now)
{
	return (unsigned) (now >> ALLOT__LEASE_TICK_SHIFT) & 0xffffu;
}

static inline bool
lease_idle(const allot__lease *l, uint64_t now)
{
	return ((lease_tick(now) - l->stamp) & 0xffffu) >=
	    ALLOT__LEASE_IDLE_TICKS;
}

/* Close `c`'s lease, refunding what it still holds to the bucket it was
 * taken from (the key may charge another one since). */
static void
lease_close(allot_agent *a, allot__lease *l, uint64_t now)
{
	if (l->n != 0)
		allot__bucket_unlease(
		    &a->quotas[l->quota].bucket, l->n, l->held, now);
	l->n = 0;
	l->held = 0;
}

/* Whether the lease was taken from bucket `b` under the version in force
 * there: low bits of the version, as a lease lives a millisecond. */
static inline bool
lease_live(const allot_agent *a, const allot__lease *l, const allot__bucket *b)
{
	uint32_t v = atomic_load_explicit(
	    &b->slot[l->ver & 1u].ver, memory_order_acquire);
	return (v & ALLOT__VER_RETIRED) == 0 && (v & 0xffffu) == l->ver &&
	    b == &a->quotas[l->quota].bucket;
}

/* The batch a lease takes on `r`'s allowance: small, and all the
 * leases of the key together about 1/LEASE_SHARE of its burst
 * (agent_int.h). */
static inline uint32_t
lease_size(const allot_agent *a, const allot__rate *r)
{
	double burst = atomic_load_explicit(&r->burst, memory_order_relaxed);
	/* Over the threads that decide (their blocks), not max_threads:
	 * with the default 64 a burst under 2,048 would never lease. */
	uint32_t threads = atomic_load_explicit(
	    &a->nblocks, memory_order_relaxed);
	double n = floor(burst /
	    (ALLOT__LEASE_SHARE * (double) (threads > 0 ? threads : 1)));
	return n >= ALLOT__LEASE_MAX ? ALLOT__LEASE_MAX : (uint32_t) n;
}

/* An admission from the thread's own lease: a decision as the bucket
 * would give it when the batch was taken. */
static inline void
lease_decision(const allot__lease *l, const allot__rate *r, uint32_t cost,
    uint64_t now, allot_decision *d)
{
	double burst = atomic_load_explicit(&r->burst, memory_order_relaxed);
	double tpn = atomic_load_explicit(
	    &r->tokens_per_ns, memory_order_relaxed);
	uint64_t debt = l->z_ns > now ? l->z_ns - now : 0;
	d->cost = cost;
	d->retry_after_ns = 0;
	d->reset_ns = debt;
	d->limit = burst;
	d->rate = atomic_load_explicit(&r->rate, memory_order_relaxed);
	double rem = burst - (double) debt * tpn;
	d->remaining = rem > 0 ? rem : 0;
	d->allowed = true;
	d->shadow_denied = false;
}

/* The lease is spent, stale or idle: give it back and, while the key
 * stays contended, take the next batch and admit from it. False: decide
 * through the bucket as usual (a denial there writes nothing). */
static __attribute__((noinline)) bool
lease_renew(allot_agent *a, allot_key *k, allot__kcount *c, uint32_t cost,
    uint64_t now, allot_decision *ret)
{
	allot__lease *l = &c->lease;
	bool idle = lease_idle(l, now);
	allot__qrt *q = atomic_load_explicit(&k->quota, memory_order_relaxed);
	allot__bucket *bk = &q->bucket;
	uint32_t cur = atomic_load_explicit(&bk->cur, memory_order_acquire);
	uint32_t n = lease_size(a, &bk->slot[cur & 1u]);
	allot__take t;
	/* The busy key's usual renewal: the batch is spent and the next is
	 * the same size from the same bucket, so its reservation stays and
	 * one CAS takes the next batch. */
	if (allot__likely(!idle && l->held == 0 && l->n == n &&
	        l->quota == q->index && cost <= n &&
	        allot__bucket_relet(bk, now, n, &t)))
		goto leased;
	lease_close(a, l, now);
	if (idle) {
		l->on = 0; /* contended again before it leases again */
		return false;
	}
	if (n < 2 || cost > n || !allot__bucket_lease(bk, now, n, &t))
		return false;
leased:
	l->quota = q->index;
	l->n = n;
	l->held = n - cost;
	l->ver = t.ver & 0xffffu;
	l->stamp = lease_tick(now);
	l->z_ns = now + t.debt_ns;
	lease_decision(l, t.r, cost, now, ret);
	return true;
}

/* Admit from the thread's lease on `k`, renewing it when needed. */
static inline bool
lease_spend(allot_agent *a, allot_key *k, allot__bucket *bk, allot__kcount *c,
    uint32_t cost, uint64_t now, allot_decision *ret)
{
	allot__lease *l = &c->lease;
	if (allot__likely(l->held >= cost && !lease_idle(l, now) &&
	        lease_live(a, l, bk))) {
		l->held -= cost;
		l->stamp = lease_tick(now);
		lease_decision(l, &bk->slot[l->ver & 1u], cost, now, ret);
		return true;
	}
	return lease_renew(a, k, c, cost, now, ret);
}

static void
leases_return_keys(
    allot_agent *a, allot__tblock *b, allot_key *keys, size_t n, uint64_t now)
{
	for (size_t i = 0; i < n; i++) {
		allot__lease *l = &b->c[keys[i].id].lease;
		lease_close(a, l, now);
		l->on = 0;
	}
}

void
allot__leases_return(allot_agent *a, allot__tblock *b)
{
	uint64_t now = allot__agent_now(a);
	size_t ng = atomic_load_explicit(&a->ngroups, memory_order_acquire);
	uint32_t nep = atomic_load_explicit(&a->nep, memory_order_acquire);
	for (uint32_t i = 0; i <= nep; i++)
		leases_return_keys(a, b,
		    allot__known_key(a, 0, allot__class_at(a, i, nep)), ng,
		    now);
	leases_return_keys(a, b, a->anon_keys, a->nclasses, now);
	leases_return_keys(a, b, a->overflow_keys, a->nclasses, now);
	leases_return_keys(a, b, a->dyn_keys, a->dyn_cap, now);
}

/* The decision. With `tail` (a constant at each call site, so the hot
 * path compiles as if it were not there) a denial is not counted: the
 * request is about to wait for the central reserve, and its final
 * decision is counted when it is made (tail.c). */
static inline int
decide(allot_agent *a, allot_key *k, uint32_t cost, allot_decision *ret,
    const bool tail)
{
	/* Relaxed loads: plain moves, what they were before reconfigs. */
	if (cost == ALLOT_COST_DEFAULT)
		cost = atomic_load_explicit(&k->weight, memory_order_relaxed);
	allot__tblock *b = allot__thread_block(a);
	allot__kcount *c = &b->c[k->id];
	if (allot__unlikely(cost >
	        atomic_load_explicit(&k->max_cost, memory_order_relaxed))) {
		memset(ret, 0, sizeof *ret);
		ret->cost = cost;
		allot__bump(b, &c->denied, 1);
		allot__bump(b, &c->denied_tokens, cost);
		return ALLOT_ETOOBIG;
	}
	allot__bucket *bk = atomic_load_explicit(
	    &k->bucket, memory_order_relaxed);
	uint64_t now = allot__agent_now(a);
	if (allot__unlikely(c->lease.on) &&
	    lease_spend(a, k, bk, c, cost, now, ret)) {
		allot__bump(b, &c->allowed, 1);
		allot__bump(b, &c->spent, cost);
		return ALLOT_OK;
	}
	allot__take t;
	allot__bucket_take(bk, now, cost, &t);
	fill_decision(&t, cost, ret);
	if (allot__likely(t.allowed)) {
		ret->allowed = true;
		ret->shadow_denied = false;
		allot__bump(b, &c->allowed, 1);
		allot__bump(b, &c->spent, cost);
		/* Another thread took from this bucket between our read and
		 * our CAS: lease from now on (an owned block only). */
		if (allot__unlikely(t.contended) && !b->shared) {
			c->lease.on = 1;
			c->lease.stamp = lease_tick(now);
		}
		return ALLOT_OK;
	}
	if (atomic_load_explicit(&bk->shadow, memory_order_relaxed)) {
		/* Shadow mode: the bucket is evaluated as if enforcing (a
		 * would-be denial takes no tokens), the request passes. It
		 * is consumption, not a denial (docs/allocation.md): counted
		 * as admitted and spent, its tokens apart. */
		ret->allowed = true;
		ret->shadow_denied = true;
		allot__bump(b, &c->allowed, 1);
		allot__bump(b, &c->spent, cost);
		allot__bump(b, &c->shadow_denied, 1);
		allot__bump(b, &c->shadow_tokens, cost);
		return ALLOT_OK;
	}
	ret->allowed = false;
	ret->shadow_denied = false;
	if (tail)
		return ALLOT_OK;
	allot__bump(b, &c->denied, 1);
	allot__bump(b, &c->denied_tokens, cost);
	return ALLOT_OK;
}

static inline int
acquire(allot_agent *a, allot_key *k, uint32_t cost, allot_decision *ret)
{
	return decide(a, k, cost, ret, false);
}

int
allot_acquire(allot_agent *a, allot_key *k, uint32_t cost, allot_decision *ret)
{
	if (allot__unlikely(a == NULL || k == NULL || ret == NULL))
		return ALLOT_EINVAL;
	return acquire(a, k, cost, ret);
}

/* ---- the tail path (tail.h, docs/integrating.md) ---- */

_Static_assert(sizeof(allot__waiter) <= sizeof(((allot_wait *) 0)->priv_),
    "a waiter fits in an allot_wait");

/* The standby (docs/allocation.md, "When it fails"): while no
 * coordinator can be asked for the reserve, but the agent still runs on
 * its lease, a request the reserve would have served runs the bucket
 * into debt, repaid from its later refill, at most one sync interval of
 * its rate and one token until a coordinator answers again, plus its
 * part of the reserve's rate over the outage (Share.standby, which the
 * coordinator holds back from the reserve while it does not hear from
 * the agent: docs/allocation.md). Over all n agents the first is at most
 * R * T + n: a leader failover (whose new leader counts every replica at
 * its equal share until it registers) or a coordinator restart costs the
 * callers' tail nothing, and the bound at most one interval of rate. */
bool
allot__standby_take(allot_agent *a, allot__qrt *q, uint32_t cost, uint64_t now)
{
	allot__allowance al;
	allot__bucket_get(&q->bucket, &al);
	if (al.mode != ALLOT__MODE_LIMIT)
		return false;
	/* The reserve's part the coordinator holds back for it over the
	 * outage (Share.standby), even for a closed bucket. */
	double part = atomic_load_explicit(
	                  &q->standby_outage, memory_order_relaxed) *
	    allot__tail_outage_s(a->tail, now);
	if (!(al.rate > 0) && !(part > 0))
		return false;
	double cap = part +
	    (al.rate > 0 ?
	            al.rate * (double) a->opts.sync_interval_ms / 1e3 + 1 :
	            0);
	uint64_t used = atomic_fetch_add_explicit(
	                    &q->standby_used, cost, memory_order_relaxed) +
	    cost;
	if ((double) used > cap) {
		atomic_fetch_sub_explicit(
		    &q->standby_used, cost, memory_order_relaxed);
		return false;
	}
	allot__bucket_adjust(&q->bucket, (int64_t) cost, now);
	return true;
}

/* The local decision, or the start of a wait: true with `wt` filled
 * (not yet entered) when the request waits for the central reserve. */
static bool
wait_begins(allot_agent *a, allot_key *k, uint32_t cost, uint64_t timeout_ns,
    allot_decision *ret, int *ret_rc, allot__waiter *wt)
{
	allot__tail *t = a->tail;
	if (t == NULL || timeout_ns == 0) {
		*ret_rc = acquire(a, k, cost, ret);
		return false;
	}
	if (allot__unlikely(
	        !atomic_load_explicit(&a->waits, memory_order_relaxed)))
		atomic_store_explicit(&a->waits, true, memory_order_relaxed);
	*ret_rc = decide(a, k, cost, ret, true);
	if (*ret_rc != ALLOT_OK || ret->allowed)
		return false;
	uint64_t now = allot__agent_now(a);
	allot__qrt *q = atomic_load_explicit(&k->quota, memory_order_relaxed);
	uint32_t qi = (uint32_t) (q - a->quotas);
	if (!allot__tail_usable(t, qi, ret->cost, now)) {
		if (allot__tail_standby_ok(t, now) &&
		    atomic_load_explicit(
		        &a->quotas[qi].central, memory_order_relaxed) &&
		    allot__standby_take(a, &a->quotas[qi], ret->cost, now)) {
			atomic_fetch_add_explicit(
			    &t->standby, 1, memory_order_relaxed);
			allot__decide_central(a, k, ret->cost, now, ret);
			return false;
		}
		allot__decide_final(a, k, ret->cost, now, ret);
		if (!ret->allowed &&
		    atomic_load_explicit(
		        &a->quotas[qi].central, memory_order_relaxed))
			atomic_fetch_add_explicit(
			    &t->dry, 1, memory_order_relaxed);
		return false;
	}
	*wt = (allot__waiter) {
		.key = k,
		.cost = ret->cost,
		.quota = qi,
		.since_ns = now,
		.deadline_ns = now + timeout_ns,
		.state = ALLOT__WAIT_PENDING,
	};
	return true;
}

static void
futex_wait(_Atomic uint32_t *p, uint32_t v)
{
	syscall(
	    SYS_futex, (uint32_t *) p, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
}

int
allot_acquire_wait(allot_agent *a, allot_key *k, uint32_t cost,
    uint64_t timeout_ns, allot_decision *ret)
{
	if (allot__unlikely(a == NULL || k == NULL || ret == NULL))
		return ALLOT_EINVAL;
	allot__waiter wt;
	int rc;
	/* The sync thread completes waits: it may not wait itself. */
	if (allot__sync_on_loop(a))
		timeout_ns = 0;
	if (!wait_begins(a, k, cost, timeout_ns, ret, &rc, &wt))
		return rc;
	wt.out = ret;
	allot__tail_enter(a->tail, &wt);
	/* The driver completes every waiter by its deadline (tail.h). */
	while (atomic_load_explicit(&wt.state, memory_order_acquire) ==
	    ALLOT__WAIT_PENDING)
		futex_wait(&wt.state, ALLOT__WAIT_PENDING);
	return ALLOT_OK;
}

int
allot_acquire_id_wait(allot_agent *a, const char *identity,
    const char *endpoint, uint32_t cost, uint64_t timeout_ns,
    allot_decision *ret)
{
	if (allot__unlikely(a == NULL || ret == NULL))
		return ALLOT_EINVAL;
	allot_key *k;
	int rc = resolve(a, identity, endpoint, false, &k);
	if (rc != ALLOT_OK)
		return rc;
	return allot_acquire_wait(a, k, cost, timeout_ns, ret);
}

int
allot_acquire_async(allot_agent *a, allot_wait *w, allot_key *k, uint32_t cost,
    uint64_t timeout_ns, allot_wait_cb cb, allot_decision *ret)
{
	if (allot__unlikely(a == NULL || w == NULL || k == NULL ||
	        cb == NULL || ret == NULL))
		return ALLOT_EINVAL;
	allot__waiter *wt = (allot__waiter *) (void *) w->priv_;
	int rc;
	if (!wait_begins(a, k, cost, timeout_ns, ret, &rc, wt))
		return rc;
	wt->cb = cb;
	wt->w = w;
	allot__tail_enter(a->tail, wt);
	return ALLOT_EINPROGRESS;
}

void
allot__decide_central(allot_agent *a, allot_key *k, uint32_t cost,
    uint64_t now, allot_decision *ret)
{
	allot__tblock *b = allot__thread_block(a);
	allot__kcount *c = &b->c[k->id];
	allot__bump(b, &c->allowed, 1);
	allot__bump(b, &c->spent, cost);
	allot__bucket *bk = atomic_load_explicit(
	    &k->bucket, memory_order_relaxed);
	allot__allowance al;
	allot__bucket_get(bk, &al);
	double level = allot__bucket_level(bk, now);
	*ret = (allot_decision) {
		.allowed = true,
		.cost = cost,
		.limit = al.burst,
		.rate = al.rate,
		.remaining = level > 0 ? level : 0,
		.reset_ns = al.rate > 0 && al.burst > level ?
		    (uint64_t) ((al.burst - level) / al.rate * 1e9) :
		    0,
	};
}

void
allot__decide_final(allot_agent *a, allot_key *k, uint32_t cost, uint64_t now,
    allot_decision *ret)
{
	(void) now;
	acquire(a, k, cost, ret);
}

int
allot_acquire_id(allot_agent *a, const char *identity, const char *endpoint,
    uint32_t cost, allot_decision *ret)
{
	if (allot__unlikely(a == NULL || ret == NULL))
		return ALLOT_EINVAL;
	allot_key *k;
	int rc = resolve(a, identity, endpoint, false, &k);
	if (rc != ALLOT_OK)
		return rc;
	return acquire(a, k, cost, ret);
}

/* ---- allowances ---- */

void
allot__quota_set(allot_agent *a, allot__qrt *q, const allot__allowance *al)
{
	allot__allowance x = *al;
	/* A local burst below the largest endpoint weight would make that
	 * endpoint impossible on this replica (docs/allocation.md), unless
	 * its callers wait for the central reserve, which serves it. */
	if (x.mode == ALLOT__MODE_LIMIT && !allot__quota_waits(a, q) &&
	    x.burst < (double) atomic_load(&q->wmax))
		x.burst = (double) atomic_load(&q->wmax);
	pthread_mutex_lock(&a->set_lock);
	allot__bucket_set(&q->bucket, &x, allot__agent_now(a));
	pthread_mutex_unlock(&a->set_lock);
}
