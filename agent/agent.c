/* SPDX-License-Identifier: MIT */
/*
 * The agent: key resolution and the hot path (create.c makes it).
 * Everything it uses is allocated at create; the per-request path
 * (allot_acquire) reads the key, reads the clock, runs the bucket (bucket.h)
 * and adds to two counters in the calling thread's own block (thread.c), with
 * no locked instruction. A key contended by several threads is served from
 * per-thread token leases instead (bucket.h), so its bucket's line is written
 * once per batch, not per decision. Keys of unknown identities come from a
 * bounded pool; when it is full they share one overflow key per endpoint
 * class, and idle unpinned keys are evicted to make room. A new config is
 * installed by reconfig.c while threads decide: the fields of a key a decision
 * reads are relaxed atomics (plain moves), and the identity and endpoint
 * indexes are insert-only, so resolution and decisions take no lock and read
 * nothing that can be freed. Layering: agent.c starts the sync loop (sync.c),
 * which drives the sync engine (sync_core.c); the engine installs allowances
 * and configs through the installer reconfig.c hands down (agent_int.h), so no
 * call goes back up.
 */
#include "agent_int.h"
#include "tail.h"
#include "values.h"

#include <linux/futex.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define NAME_SZ (ALLOT_IDENTITY_MAX + 1)
#define NONE UINT32_MAX

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
	/* One read of what it counted: into its quota's retired totals,
	 * and the base the next identity counts from (other threads'
	 * blocks are never written by anyone but their owner). A decision
	 * that resolved the old identity and counts after this read is
	 * the next identity's, still its quota's: counted once, never
	 * lost between two reads. */
	allot__ktotals t;
	allot__key_totals(a, k, &t);
	allot__ktotals_add(
	    &atomic_load_explicit(&k->quota, memory_order_relaxed)->retired,
	    &t);
	allot__ktotals_add(&allot__kc(a, k)->base, &t);
	dyn_remove(a, k);
	allot__value_detach(a, k);
	atomic_fetch_add_explicit(&k->gen, 1, memory_order_acq_rel);
	allot__kc(a, k)->settled = 0;
	allot__kc(a, k)->settled_tokens = 0;
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
		    now - kc->sweep_ns >= a->idle_evict_ns &&
		    allot__value_evictable(a, k, now))
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
	if (a->dyn_used >= a->dyn_cap - a->dyn_cap / 4 &&
	    a->idle_evict_ns != 0) {
		uint64_t now = allot__agent_now(a);
		/* At most one full scan per quarter of the idle period, from
		 * three quarters full: a scan notes which keys moved and the
		 * next evicts those idle since, so room is made before the
		 * pool runs out rather than after. */
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
	allot__stack_set(a, k, k->identity, NONE);
	allot__value_attach(a, k);
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
#if defined(__SANITIZE_THREAD__)
	/* ThreadSanitizer does not model the pool's seqlock (plain fields
	 * a lookup validates by the key's generation): its builds look up
	 * under dyn_lock, in dyn_insert(). */
	allot_key *k = NULL;
#else
	allot_key *k = pin ? NULL : dyn_lookup(a, identity, len, dh, cls);
#endif
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
	d->level = 0;
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

/* A decision an open bucket of quota `q` admitted (t->open): an
 * unlimited quota's has no amounts (fallback: open keeps its last). */
static void
open_fill(const allot__qrt *q, allot_decision *d)
{
	if (atomic_load_explicit(&q->access, memory_order_relaxed) ==
	    ALLOT__ACCESS_UNLIMITED)
		d->limit = d->rate = d->remaining = INFINITY;
}

void
allot__quota_fix(const allot__qrt *q, allot__allowance *al)
{
	switch (atomic_load_explicit(&q->access, memory_order_relaxed)) {
	case ALLOT__ACCESS_CLOSED:
		*al = (allot__allowance) { .mode = ALLOT__MODE_CLOSED };
		break;
	case ALLOT__ACCESS_UNLIMITED:
		*al = (allot__allowance) { .mode = ALLOT__MODE_OPEN };
		break;
	default: break;
	}
}

/* A denial by quota `q`: ALLOT_EFORBIDDEN when it is closed. */
static inline int
denied_rc(const allot__qrt *q)
{
	return atomic_load_explicit(&q->access, memory_order_relaxed) ==
	        ALLOT__ACCESS_CLOSED ?
	    ALLOT_EFORBIDDEN :
	    ALLOT_OK;
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
	d->level = 0;
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
	/* A key that charges a value's bucket now (values.h) leases no
	 * more: what its lease holds goes back. */
	if (allot__unlikely(atomic_load_explicit(
	                        &k->bucket, memory_order_relaxed) != bk)) {
		lease_close(a, l, now);
		l->on = 0;
		return false;
	}
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

/* ---- stacked limits (agent_int.h, allot__stack) ---- */

/* Whether `level` of a key of quota `q` is the ceiling's level while
 * `q` does not run on its own allowance (ceiling.c): stacked, not in
 * use. */
static inline bool
ceiling_idle(const allot_agent *a, const allot__qrt *q, uint32_t level)
{
	return level == a->ceil_q &&
	    !atomic_load_explicit(&q->owned, memory_order_relaxed);
}

/* Quota `quota`'s counters as a stacked level in block `b`. */
static inline allot__kcount *
level_count(allot_agent *a, allot__tblock *b, uint32_t quota)
{
	return &b->c[a->level_base + quota];
}

/* The quotas key `k` charges, its own first, into `lv`: their count. */
static uint32_t
stack_levels(allot_agent *a, const allot_key *k, uint32_t *lv)
{
	allot__qrt *q = atomic_load_explicit(&k->quota, memory_order_relaxed);
	uint32_t n = atomic_load_explicit(&k->nup, memory_order_relaxed);
	lv[0] = q->index;
	if (n > ALLOT__STACK_MAX)
		n = ALLOT__STACK_MAX;
	for (uint32_t i = 0; i < n; i++)
		lv[i + 1] = atomic_load_explicit(
		    &a->stacks[k->id].q[i], memory_order_relaxed);
	/* The ceiling's level (last): only while the key's quota runs on
	 * its own allowance (ceiling.c). */
	if (n > 0 && ceiling_idle(a, q, lv[n]))
		n--;
	return n + 1;
}

/* A request of `cost` key `k` (counters `c`) charges was denied by its
 * level `i` of `lv`: the key's denial, and above its own quota the
 * level's, not the own quota's (whose bucket did not deny it). */
static void
count_denial(allot_agent *a, allot__tblock *b, allot__kcount *c,
    const uint32_t *lv, uint32_t i, uint32_t cost)
{
	allot__bump(b, &c->denied, 1);
	allot__bump(b, &c->denied_tokens, cost);
	if (i == 0)
		return;
	allot__kcount *own = level_count(a, b, lv[0]);
	allot__kcount *up = level_count(a, b, lv[i]);
	allot__bump(b, &own->denied, (uint64_t) -1);
	allot__bump(b, &own->denied_tokens, (uint64_t) - (int64_t) cost);
	allot__bump(b, &up->denied, 1);
	allot__bump(b, &up->denied_tokens, cost);
}

/* Levels `from`.. of key `k` take `cost` tokens each, all or none (a
 * level in shadow that would deny lets the request pass and says so).
 * Admitted: true, `*ret` the level with the fewest tokens left, each
 * level above the key's own counted. Denied by a level: what the ones
 * before it took given back, `*ret` its decision (ret->level it). */
static bool
stack_take(allot_agent *a, allot__tblock *b, allot__bucket *own,
    const uint32_t *lv, uint32_t n, uint32_t from, uint32_t cost, uint64_t now,
    allot_decision *ret)
{
	bool shadow = false;
	uint32_t taken = 0; /* bit i: level i took its tokens */
	allot_decision d;
	for (uint32_t i = from; i < n; i++) {
		allot__bucket *bk = i == 0 ? own : &a->quotas[lv[i]].bucket;
		allot__take t;
		allot__bucket_take(bk, now, cost, &t);
		fill_decision(&t, cost, &d);
		if (allot__unlikely(t.open))
			open_fill(&a->quotas[lv[i]], &d);
		if (!t.allowed &&
		    !atomic_load_explicit(&bk->shadow, memory_order_relaxed)) {
			for (uint32_t j = from; j < i; j++)
				if (taken & (1u << j))
					allot__bucket_adjust(j == 0 ?
					        own :
					        &a->quotas[lv[j]].bucket,
					    -(int64_t) cost, now);
			*ret = d;
			ret->allowed = false;
			ret->shadow_denied = false;
			ret->level = (uint8_t) i;
			return false;
		}
		taken |= (uint32_t) t.allowed << i;
		shadow |= !t.allowed;
		if (i == from || d.remaining < ret->remaining) {
			*ret = d;
			ret->level = (uint8_t) i;
		}
	}
	ret->allowed = true;
	ret->shadow_denied = shadow;
	for (uint32_t i = from > 1 ? from : 1; i < n; i++) {
		allot__kcount *lc = level_count(a, b, lv[i]);
		allot__bump(b, &lc->allowed, 1);
		allot__bump(b, &lc->spent, cost);
	}
	return true;
}

/* Whether key `k`, which has stacked levels, charges one now: not when
 * its only one is the ceiling's level and its quota does not run on its
 * own allowance (ceiling.c), the case of every key of a quota a ceiling
 * may cut while the level is not in use, which then keeps the one-level
 * path (its leases included). */
static inline bool
stacked_now(allot_agent *a, const allot_key *k)
{
	return atomic_load_explicit(&k->nup, memory_order_relaxed) != 1 ||
	    !ceiling_idle(a,
	        atomic_load_explicit(&k->quota, memory_order_relaxed),
	        atomic_load_explicit(
	            &a->stacks[k->id].q[0], memory_order_relaxed));
}

/* The decision of a key with stacked levels (decide()), off the
 * one-level path: no leases (a lease taken before the key was stacked
 * is given back). */
static __attribute__((noinline)) int
decide_stacked(allot_agent *a, allot_key *k, allot__tblock *b,
    allot__kcount *c, uint32_t cost, allot_decision *ret, bool tail)
{
	uint32_t lv[ALLOT__STACK_MAX + 1];
	uint32_t n = stack_levels(a, k, lv);
	uint64_t now = allot__agent_now(a);
	if (allot__unlikely(c->lease.n != 0))
		lease_close(a, &c->lease, now);
	c->lease.on = 0;
	if (stack_take(a, b,
	        atomic_load_explicit(&k->bucket, memory_order_relaxed), lv, n,
	        0, cost, now, ret)) {
		allot__bump(b, &c->allowed, 1);
		allot__bump(b, &c->spent, cost);
		if (ret->shadow_denied) {
			allot__bump(b, &c->shadow_denied, 1);
			allot__bump(b, &c->shadow_tokens, cost);
		}
		return ALLOT_OK;
	}
	int rc = denied_rc(&a->quotas[lv[ret->level]]);
	/* The key's own quota denied a request about to wait for its
	 * central reserve: counted when its wait ends (tail.c). */
	if (tail && ret->level == 0 && rc == ALLOT_OK)
		return ALLOT_OK;
	count_denial(a, b, c, lv, ret->level, cost);
	return rc;
}

const char *
allot_decision_quota(
    allot_agent *a, const allot_key *k, const allot_decision *d)
{
	if (a == NULL || k == NULL || d == NULL)
		return "default";
	uint32_t lv[ALLOT__STACK_MAX + 1];
	uint32_t n = stack_levels(a, k, lv);
	return a->quotas[lv[d->level < n ? d->level : 0]].name;
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
	if (allot__unlikely(
	        atomic_load_explicit(&k->nup, memory_order_relaxed) != 0) &&
	    stacked_now(a, k))
		return decide_stacked(a, k, b, c, cost, ret, tail);
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
		if (allot__unlikely(t.open))
			open_fill(atomic_load_explicit(
			              &k->quota, memory_order_relaxed),
			    ret);
		allot__bump(b, &c->allowed, 1);
		allot__bump(b, &c->spent, cost);
		/* Another thread took from this bucket between our read and
		 * our CAS: lease from now on (an owned block only; a lease
		 * is of the quota's own bucket, not a value's, values.h). */
		if (allot__unlikely(t.contended) && !b->shared &&
		    bk ==
		        &atomic_load_explicit(&k->quota, memory_order_relaxed)
		             ->bucket) {
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
	int rc = denied_rc(
	    atomic_load_explicit(&k->quota, memory_order_relaxed));
	if (tail && rc == ALLOT_OK)
		return ALLOT_OK;
	allot__bump(b, &c->denied, 1);
	allot__bump(b, &c->denied_tokens, cost);
	return rc;
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
	/* A stacked level above the key's own quota is decided locally:
	 * its denial was counted and is final. */
	if (*ret_rc != ALLOT_OK || ret->allowed || ret->level != 0)
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
			if (!allot__decide_central(a, k, ret->cost, now, ret))
				atomic_fetch_sub_explicit(
				    &a->quotas[qi].standby_used, ret->cost,
				    memory_order_relaxed);
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

bool
allot__decide_central(allot_agent *a, allot_key *k, uint32_t cost,
    uint64_t now, allot_decision *ret)
{
	allot__tblock *b = allot__thread_block(a);
	allot__kcount *c = &b->c[k->id];
	allot_decision up = { .remaining = INFINITY };
	if (atomic_load_explicit(&k->nup, memory_order_relaxed) != 0) {
		/* Its own quota's tokens came from the reserve: the
		 * stacked levels above it still decide. */
		uint32_t lv[ALLOT__STACK_MAX + 1];
		uint32_t n = stack_levels(a, k, lv);
		allot__bucket *own = atomic_load_explicit(
		    &k->bucket, memory_order_relaxed);
		if (!stack_take(a, b, own, lv, n, 1, cost, now, &up)) {
			allot__bucket_adjust(own, -(int64_t) cost, now);
			count_denial(a, b, c, lv, up.level, cost);
			*ret = up;
			return false;
		}
	}
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
	if (up.remaining < ret->remaining)
		*ret = up; /* a stacked level has fewer tokens left */
	return true;
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

/* `al` as quota `q`'s bucket runs it: fixed by its access, and a local
 * burst below the largest endpoint weight raised to it, which would
 * otherwise make that endpoint impossible on this replica
 * (docs/allocation.md), unless its callers wait for the central
 * reserve, which serves it. */
static void
quota_fit(allot_agent *a, allot__qrt *q, allot__allowance *x)
{
	allot__quota_fix(q, x);
	if (x->mode == ALLOT__MODE_LIMIT && !allot__quota_waits(a, q) &&
	    x->burst < (double) atomic_load(&q->wmax))
		x->burst = (double) atomic_load(&q->wmax);
}

void
allot__quota_set_own(allot_agent *a, allot__qrt *q, const allot__allowance *al,
    const allot__allowance *own)
{
	allot__allowance x = *al;
	quota_fit(a, q, &x);
	uint64_t now = allot__agent_now(a);
	/* A member of the ceiling's level runs on its own allowance: the
	 * level holds it to the cut one with the others'. */
	bool owned = own != NULL && x.mode == ALLOT__MODE_LIMIT &&
	    allot__ceiling_member(a, q);
	pthread_mutex_lock(&a->set_lock);
	bool leaves = !owned &&
	    atomic_load_explicit(&q->owned, memory_order_relaxed);
	allot__allowance run = x;
	if (owned) {
		run.rate = fmax(x.rate, own->rate);
		run.burst = fmax(x.burst, own->burst);
	}
	if (atomic_load_explicit(&q->owned, memory_order_relaxed) != owned)
		atomic_store_explicit(&q->owned, owned, memory_order_relaxed);
	allot__bucket_set(&q->bucket, &run, now);
	if (leaves)
		allot__ceiling_leave(a, q, now);
	/* After the install: a quota that joins brings the tokens its
	 * bucket opens with (a closed one's refill included). */
	q->cut = x;
	allot__ceiling_add(a, q, now);
	pthread_mutex_unlock(&a->set_lock);
}

void
allot__quota_set(allot_agent *a, allot__qrt *q, const allot__allowance *al)
{
	allot__quota_set_own(a, q, al, NULL);
}
