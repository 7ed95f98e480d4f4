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
 * Layering: agent.c starts the sync loop (sync.c), which drives the sync
 * engine (sync_core.c); the engine installs allowances through the
 * installer agent.c hands down (agent_int.h), so no call goes back up.
 */
#include "agent_int.h"
#include "sync_int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* ---- read-only string indexes ---- */

static inline uint32_t
find_class(const allot_agent *a, const char *ep)
{
	uint32_t dflt = a->nclasses - 1;
	if (ep == NULL || dflt == 0)
		return dflt;
	size_t len = strlen(ep);
	/* A handful of endpoints: compare lengths, then bytes. */
	if (dflt <= ALLOT__EP_LINEAR) {
		for (uint32_t i = 0; i < dflt; i++)
			if (a->ep_len[i] == len &&
			    memcmp(a->cfg->endpoints[i].name, ep, len) == 0)
				return i;
		return dflt;
	}
	uint64_t h = allot__hash(ep, len, a->seed);
	uint32_t pos = allot__idmap_start(&a->ep_map, h), v;
	while (
	    (v = allot__idmap_next(&a->ep_map, h, &pos)) != ALLOT__IDMAP_NONE)
		if (a->ep_len[v] == len &&
		    memcmp(a->cfg->endpoints[v].name, ep, len) == 0)
			return v;
	return dflt;
}

static int
endpoints_index(allot_agent *a)
{
	const allot_config *c = a->cfg;
	a->ep_len = calloc(a->nclasses, sizeof *a->ep_len);
	if (a->ep_len == NULL ||
	    allot__idmap_init(&a->ep_map, (uint32_t) c->nendpoints) !=
	        ALLOT_OK)
		return ALLOT_ENOMEM;
	for (uint32_t j = 0; j + 1 < a->nclasses; j++) {
		const char *name = c->endpoints[j].name;
		a->class_names[j] = name;
		a->ep_len[j] = strlen(name);
		allot__idmap_add(
		    &a->ep_map, allot__hash(name, a->ep_len[j], a->seed), j);
	}
	a->class_names[a->nclasses - 1] = "default";
	return ALLOT_OK;
}

/*
 * Configured identities to their keys: the hot form of the config index
 * (config_index.h numbers callers the same way). One slot holds the full
 * hash, the identity, the caller's first key and its bucket, so a lookup
 * of a cold caller costs the slot's line, then the identity, the key, the
 * bucket and the thread's counters all at once: the identity is only
 * compared on a hash match, and nothing waits for the comparison. At most
 * half full; built once, then only read.
 */
struct allot__caller_slot {
	uint64_t hash;
	allot_key *keys; /* ncallers * nclasses: this caller's first; NULL:
	                    empty */
	const char *identity; /* NUL-terminated, on a line of its own */
	allot__bucket *bucket; /* the caller's */
};

/* Identities copied to lines of their own: one of up to 63 bytes is one
 * line to compare, wherever the config allocated it. Zeroed, and with
 * ALLOT_IDENTITY_MAX bytes to spare at the end, so that comparing any
 * identity the caller may pass reads inside the copy. */
static char *
names_copy(const allot_config *c)
{
	size_t total = 64 + ALLOT_IDENTITY_MAX + 1;
	for (size_t i = 0; i < c->ncallers; i++)
		total += (strlen(c->callers[i].identity) + 64) & ~(size_t) 63;
	total = (total + 63) & ~(size_t) 63;
	char *arena = aligned_alloc(64, total);
	if (arena == NULL)
		return NULL;
	memset(arena, 0, total);
	char *p = arena;
	for (size_t i = 0; i < c->ncallers; i++) {
		size_t len = strlen(c->callers[i].identity);
		memcpy(p, c->callers[i].identity, len + 1);
		p += (len + 64) & ~(size_t) 63;
	}
	return arena;
}

static int
callers_index(allot_agent *a)
{
	const allot_config *c = a->cfg;
	uint32_t cap = allot__idmap_slots((uint32_t) c->ncallers);
	size_t sz = sizeof(struct allot__caller_slot) * cap;
	a->caller_mask = cap - 1;
	a->caller_tab = aligned_alloc(64, sz);
	a->caller_names = names_copy(c);
	if (a->caller_tab == NULL || a->caller_names == NULL)
		return ALLOT_ENOMEM;
	memset(a->caller_tab, 0, sz);
	const char *id = a->caller_names;
	for (size_t i = 0; i < c->ncallers; i++) {
		size_t len = strlen(id);
		uint64_t h = allot__hash(id, len, a->seed);
		uint32_t p = (uint32_t) h & a->caller_mask;
		bool dup = false;
		for (; a->caller_tab[p].keys != NULL;
		     p = (p + 1) & a->caller_mask) {
			const struct allot__caller_slot *e = &a->caller_tab[p];
			/* The loader rejects duplicates; should one get
			 * through, the first stands. */
			dup |= e->hash == h && strcmp(e->identity, id) == 0;
		}
		if (!dup)
			a->caller_tab[p] = (struct allot__caller_slot) { h,
				&a->known_keys[i * a->nclasses], id,
				&a->quotas[i].bucket };
		id += (len + 64) & ~(size_t) 63;
	}
	return ALLOT_OK;
}

static inline allot_key *
find_caller(
    const allot_agent *a, const char *id, size_t len, uint64_t h, uint32_t cls)
{
	for (uint32_t p = (uint32_t) h & a->caller_mask;;
	     p = (p + 1) & a->caller_mask) {
		const struct allot__caller_slot *e = &a->caller_tab[p];
		if (e->keys == NULL)
			return NULL;
		if (e->hash != h)
			continue;
		/* Everything the decision will read, asked for now: the
		 * key, the bucket and this thread's counters come while the
		 * identity is compared, not one after the other. Known keys
		 * are numbered caller by caller, class by class. */
		allot_key *k = e->keys + cls;
		__builtin_prefetch(k);
		__builtin_prefetch(e->bucket, 1);
		if (allot__likely(allot__tl.gen == a->gen))
			__builtin_prefetch(
			    &allot__tl.b->c[(e->keys - a->known_keys) + cls],
			    1);
		if (memcmp(e->identity, id, len) == 0 &&
		    e->identity[len] == '\0')
			return k;
	}
}

/* Zeroed, 64-byte aligned room for `n` keys (one more: never empty). */
static allot_key *
keys_alloc(size_t n)
{
	size_t sz = sizeof(allot_key) * (n + 1);
	allot_key *k = aligned_alloc(64, sz);
	if (k != NULL)
		memset(k, 0, sz);
	return k;
}

/* ---- create / destroy ---- */

static void
key_init(allot_agent *a, allot_key *k, allot__qrt *q, uint32_t cls,
    const char *identity, bool known, uint32_t id)
{
	k->bucket = &q->bucket;
	k->quota = q;
	k->id = id;
	k->cls = cls;
	k->weight = cls + 1 == a->nclasses ? a->cfg->default_weight :
	                                     a->cfg->endpoints[cls].weight;
	double b = floor(q->q->burst);
	k->max_cost = b >= 4294967295.0 ? UINT32_MAX : (uint32_t) b;
	k->known = known;
	k->identity = identity;
	atomic_init(&k->pins, 0);
	atomic_init(&k->gen, 0);
	k->slot = NONE;
	k->next_free = NONE;
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

/* Quotas: before the first reply from a coordinator every bucket runs
 * at the static share R / initial_replicas (fallback.h). */
static void
quotas_init(allot_agent *a)
{
	const allot_config *c = a->cfg;
	memset(a->quotas, 0, sizeof(allot__qrt) * a->nquotas);
	for (uint32_t i = 0; i < a->nquotas; i++) {
		allot__qrt *q = &a->quotas[i];
		q->q = i < c->ncallers ? &c->callers[i] : &c->def;
		q->index = i;
		q->is_default = i == c->ncallers;
		allot__allowance al;
		allot__static_share(q->q->rate, q->q->burst,
		    a->opts.initial_replicas, c->max_weight, &al);
		allot__bucket_init(&q->bucket, &al);
		atomic_store(&q->bucket.shadow, q->q->shadow);
	}
}

/* Every key, numbered across kinds: known callers by endpoint class,
 * then anonymous and overflow keys, then the unknown-identity pool. */
static int
keys_init(allot_agent *a)
{
	const allot_config *c = a->cfg;
	uint32_t id = 0;
	allot__qrt *def = &a->quotas[a->nquotas - 1];
	for (size_t i = 0; i < c->ncallers; i++)
		for (uint32_t j = 0; j < a->nclasses; j++)
			key_init(a, &a->known_keys[i * a->nclasses + j],
			    &a->quotas[i], j, c->callers[i].identity, true,
			    id++);
	for (uint32_t j = 0; j < a->nclasses; j++) {
		key_init(a, &a->anon_keys[j], def, j, "", false, id++);
		key_init(a, &a->overflow_keys[j], def, j, "(overflow)", false,
		    id++);
	}
	for (uint32_t i = 0; i < a->dyn_cap; i++) {
		allot_key *k = &a->dyn_keys[i];
		key_init(a, k, def, 0, &a->dyn_names[(size_t) i * NAME_SZ],
		    false, id++);
		k->dynamic = true;
		k->next_free = i + 1 < a->dyn_cap ? i + 1 : NONE;
	}
	a->dyn_free = a->dyn_cap > 0 ? 0 : NONE;
	/* Sized as an idmap of the pool, but an index of its own: lock-free
	 * reads of atomic key pointers, written under dyn_lock. */
	a->dyn_mask = allot__idmap_slots(a->dyn_cap) - 1;
	a->dyn_index = calloc((size_t) a->dyn_mask + 1, sizeof *a->dyn_index);
	return a->dyn_index == NULL ? ALLOT_ENOMEM : ALLOT_OK;
}

/* The sync engine installs allowances here (allot__installer). */
static void
install(void *ctx, uint32_t quota, const allot__allowance *al)
{
	allot_agent *a = ctx;
	allot__quota_set(a, &a->quotas[quota], al);
}

int
allot__syncc_init(allot__syncc *c, allot_agent *a, uint64_t seed)
{
	allot__installer in = { install, a };
	return allot__syncc_create(c, a, seed, &in);
}

static bool
options_valid(const allot_agent_options *o)
{
	return o->sync_interval_ms != 0 && o->initial_replicas != 0 &&
	    o->max_threads != 0 && o->max_threads <= 65536 &&
	    o->sync_jitter >= 0 && o->sync_jitter < 1 &&
	    o->reconnect_min_ms != 0 &&
	    o->reconnect_max_ms >= o->reconnect_min_ms;
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
	a->opts = o;
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

	if ((a->cfg = allot__config_dup(cfg)) == NULL ||
	    options_copy(a, &o) != ALLOT_OK)
		goto fail;
	const allot_config *c = a->cfg;
	a->nquotas = (uint32_t) c->ncallers + 1;
	a->nclasses = (uint32_t) c->nendpoints + 1;
	a->dyn_cap = o.max_unknown_keys;
	size_t nknown = (size_t) c->ncallers * a->nclasses;
	size_t nkeys = nknown + 2 * (size_t) a->nclasses + a->dyn_cap;

	a->quotas = aligned_alloc(64, sizeof(allot__qrt) * a->nquotas);
	a->class_names = calloc(a->nclasses, sizeof *a->class_names);
	a->known_keys = keys_alloc(nknown);
	a->anon_keys = keys_alloc(a->nclasses);
	a->overflow_keys = keys_alloc(a->nclasses);
	a->dyn_keys = keys_alloc(a->dyn_cap);
	a->dyn_names = calloc((size_t) a->dyn_cap + 1, NAME_SZ);
	a->nkeys = (uint32_t) nkeys;
	if (a->quotas == NULL || a->class_names == NULL ||
	    a->known_keys == NULL || a->anon_keys == NULL ||
	    a->overflow_keys == NULL || a->dyn_keys == NULL ||
	    a->dyn_names == NULL)
		goto fail;
	if ((rc = allot__blocks_init(a)) != ALLOT_OK)
		goto fail;
	quotas_init(a);
	if ((rc = endpoints_index(a)) != ALLOT_OK ||
	    (rc = keys_init(a)) != ALLOT_OK ||
	    (rc = callers_index(a)) != ALLOT_OK)
		goto fail;

	allot__installer in = { install, a };
	if (a->coordinator != NULL &&
	    (rc = allot__sync_start(a, &in)) != ALLOT_OK)
		goto fail;
	allot__log(&a->log, ALLOT_LOG_INFO, "ALLOT-AGENT-START",
	    "agent %s for service %s: %zu callers, %u endpoint classes, "
	    "clock %s, counters for up to %u threads, coordinator %s",
	    a->replica_id, a->service, c->ncallers, a->nclasses,
	    a->clock_fn != NULL ? "injected" :
	        a->tsc->usable  ? "tsc" :
	                          "CLOCK_MONOTONIC",
	    a->max_blocks,
	    a->coordinator != NULL ? a->coordinator : "none (local-only)");
	*ret_agent = a;
	return ALLOT_OK;
fail:
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
	free(a->dyn_keys);
	free(a->overflow_keys);
	free(a->anon_keys);
	free(a->known_keys);
	allot__idmap_fini(&a->ep_map);
	free(a->ep_len);
	free(a->caller_tab);
	free(a->caller_names);
	free(a->class_names);
	free(a->quotas);
	free(a->coordinator);
	free(a->tls_ca);
	free(a->tls_cert);
	free(a->tls_name);
	free(a->service);
	free(a->replica_id);
	allot_config_free(a->cfg);
	pthread_mutex_destroy(&a->dyn_lock);
	pthread_mutex_destroy(&a->set_lock);
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
	allot__ktotals *r = &k->quota->retired;
	r->allowed += t.allowed;
	r->denied += t.denied;
	r->shadow_denied += t.shadow_denied;
	r->spent += t.spent;
	r->denied_tokens += t.denied_tokens;
}

/* Remove a key from the index (dyn_lock held), keeping every probe
 * chain intact by re-inserting the entries that follow it. */
static void
dyn_remove(allot_agent *a, allot_key *k)
{
	uint32_t p = k->slot;
	atomic_store_explicit(&a->dyn_index[p], NULL, memory_order_release);
	k->slot = NONE;
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
			e->slot = r;
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
	k->base.allowed += raw.allowed;
	k->base.denied += raw.denied;
	k->base.shadow_denied += raw.shadow_denied;
	k->base.spent += raw.spent;
	k->base.denied_tokens += raw.denied_tokens;
	((char *) k->identity)[0] = '\0'; /* dyn_names storage */
	atomic_fetch_add_explicit(&k->gen, 1, memory_order_release);
	k->next_free = a->dyn_free;
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
		if (k->slot == NONE)
			continue;
		allot__ktotals t;
		allot__key_totals(a, k, &t);
		uint64_t sum = t.allowed + t.denied + t.shadow_denied;
		if (sum != k->sweep_sum) {
			k->sweep_sum = sum;
			k->sweep_ns = now;
			continue;
		}
		if (atomic_load_explicit(&k->pins, memory_order_acquire) ==
		        0 &&
		    now - k->sweep_ns >= a->idle_evict_ns)
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
	a->dyn_free = k->next_free;
	a->dyn_used++;
	atomic_fetch_add_explicit(&k->gen, 1, memory_order_acq_rel);
	memcpy((char *) k->identity, id, len);
	((char *) k->identity)[len] = '\0';
	k->hash = h;
	k->cls = cls;
	k->weight = cls + 1 == a->nclasses ? a->cfg->default_weight :
	                                     a->cfg->endpoints[cls].weight;
	k->sweep_sum = 0;
	k->sweep_ns = allot__agent_now(a);
	atomic_fetch_add_explicit(&k->gen, 1, memory_order_release);
	uint32_t p = (uint32_t) h & a->dyn_mask;
	while (atomic_load_explicit(&a->dyn_index[p], memory_order_relaxed) !=
	    NULL)
		p = (p + 1) & a->dyn_mask;
	k->slot = p;
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
	return k == NULL ? 0 : k->weight;
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

/* Close `c`'s lease on `k`'s bucket, refunding what it still holds. */
static void
lease_close(allot_key *k, allot__lease *l, uint64_t now)
{
	if (l->n != 0)
		allot__bucket_unlease(k->bucket, l->n, l->held, now);
	l->n = 0;
	l->held = 0;
}

/* The batch a lease takes on `r`'s allowance: small, and all the
 * leases of the key together at most 1/LEASE_SHARE of its burst. */
static inline uint32_t
lease_size(const allot_agent *a, const allot__rate *r)
{
	double burst = atomic_load_explicit(&r->burst, memory_order_relaxed);
	double n = floor(
	    burst / (ALLOT__LEASE_SHARE * (double) a->max_blocks));
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
	bool idle = now - l->stamp_ns >= ALLOT__LEASE_IDLE_NS;
	lease_close(k, l, now);
	if (idle) {
		l->on = false; /* contended again before it leases again */
		return false;
	}
	uint32_t cur = atomic_load_explicit(
	    &k->bucket->cur, memory_order_acquire);
	uint32_t n = lease_size(a, &k->bucket->slot[cur & 1u]);
	allot__take t;
	if (n < 2 || cost > n || !allot__bucket_lease(k->bucket, now, n, &t))
		return false;
	l->n = (uint16_t) n;
	l->held = (uint8_t) (n - cost);
	l->ver = t.ver;
	l->stamp_ns = now;
	l->z_ns = now + t.debt_ns;
	lease_decision(l, t.r, cost, now, ret);
	return true;
}

/* Admit from the thread's lease on `k`, renewing it when needed. */
static inline bool
lease_spend(allot_agent *a, allot_key *k, allot__kcount *c, uint32_t cost,
    uint64_t now, allot_decision *ret)
{
	allot__lease *l = &c->lease;
	if (allot__likely(l->held >= cost &&
	        now - l->stamp_ns < ALLOT__LEASE_IDLE_NS &&
	        allot__bucket_lease_live(k->bucket, l->ver))) {
		l->held = (uint8_t) (l->held - cost);
		l->stamp_ns = now;
		lease_decision(
		    l, &k->bucket->slot[l->ver & 1u], cost, now, ret);
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
		lease_close(&keys[i], l, now);
		l->on = false;
	}
}

void
allot__leases_return(allot_agent *a, allot__tblock *b)
{
	uint64_t now = allot__agent_now(a);
	leases_return_keys(
	    a, b, a->known_keys, (size_t) a->cfg->ncallers * a->nclasses, now);
	leases_return_keys(a, b, a->anon_keys, a->nclasses, now);
	leases_return_keys(a, b, a->overflow_keys, a->nclasses, now);
	leases_return_keys(a, b, a->dyn_keys, a->dyn_cap, now);
}

static inline int
acquire(allot_agent *a, allot_key *k, uint32_t cost, allot_decision *ret)
{
	if (cost == ALLOT_COST_DEFAULT)
		cost = k->weight;
	allot__tblock *b = allot__thread_block(a);
	allot__kcount *c = &b->c[k->id];
	if (allot__unlikely(cost > k->max_cost)) {
		memset(ret, 0, sizeof *ret);
		ret->cost = cost;
		allot__bump(b, &c->denied, 1);
		allot__bump(b, &c->denied_tokens, cost);
		return ALLOT_ETOOBIG;
	}
	uint64_t now = allot__agent_now(a);
	if (allot__unlikely(c->lease.on) &&
	    lease_spend(a, k, c, cost, now, ret)) {
		allot__bump(b, &c->allowed, 1);
		allot__bump(b, &c->spent, cost);
		return ALLOT_OK;
	}
	allot__take t;
	allot__bucket_take(k->bucket, now, cost, &t);
	fill_decision(&t, cost, ret);
	if (allot__likely(t.allowed)) {
		ret->allowed = true;
		ret->shadow_denied = false;
		allot__bump(b, &c->allowed, 1);
		allot__bump(b, &c->spent, cost);
		/* Another thread took from this bucket between our read and
		 * our CAS: lease from now on (an owned block only). */
		if (allot__unlikely(t.contended) && !b->shared) {
			c->lease.on = true;
			c->lease.stamp_ns = now;
		}
		return ALLOT_OK;
	}
	if (atomic_load_explicit(&k->bucket->shadow, memory_order_relaxed)) {
		/* Shadow mode: the bucket is evaluated as if enforcing (a
		 * would-be denial takes no tokens), the request passes. */
		ret->allowed = true;
		ret->shadow_denied = true;
		allot__bump(b, &c->shadow_denied, 1);
		allot__bump(b, &c->denied_tokens, cost);
		return ALLOT_OK;
	}
	ret->allowed = false;
	ret->shadow_denied = false;
	allot__bump(b, &c->denied, 1);
	allot__bump(b, &c->denied_tokens, cost);
	return ALLOT_OK;
}

int
allot_acquire(allot_agent *a, allot_key *k, uint32_t cost, allot_decision *ret)
{
	if (allot__unlikely(a == NULL || k == NULL || ret == NULL))
		return ALLOT_EINVAL;
	return acquire(a, k, cost, ret);
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

int
allot_settle(allot_agent *a, allot_key *k, uint32_t charged, uint32_t measured)
{
	if (a == NULL || k == NULL)
		return ALLOT_EINVAL;
	if (charged == measured)
		return ALLOT_OK;
	int64_t extra = (int64_t) measured - (int64_t) charged;
	allot__bucket_adjust(k->bucket, extra, allot__agent_now(a));
	allot__tblock *b = allot__thread_block(a);
	/* Unsigned wrap-around subtracts a refund. */
	allot__bump(b, &b->c[k->id].spent, (uint64_t) extra);
	return ALLOT_OK;
}

/* ---- allowances ---- */

void
allot__quota_set(allot_agent *a, allot__qrt *q, const allot__allowance *al)
{
	allot__allowance x = *al;
	/* A local burst below the largest endpoint weight would make that
	 * endpoint impossible on this replica (docs/allocation.md). */
	if (x.mode == ALLOT__MODE_LIMIT &&
	    x.burst < (double) a->cfg->max_weight)
		x.burst = (double) a->cfg->max_weight;
	pthread_mutex_lock(&a->set_lock);
	allot__bucket_set(&q->bucket, &x, allot__agent_now(a));
	pthread_mutex_unlock(&a->set_lock);
}
