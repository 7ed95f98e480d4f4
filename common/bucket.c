/* SPDX-License-Identifier: MIT */
/*
 * The slow paths of the token bucket (bucket.h): allowance installation,
 * version upgrades, levels and after-the-fact adjustments. None of these
 * run per request in the steady state.
 */
#include "bucket.h"

#include <math.h>
#include <stddef.h>

/* Fill slot `r` with allowance `a` as version `ver`. OPEN and CLOSED
 * slots carry the interval and burst of `prev` (the slot in force), so a
 * later return to MODE_LIMIT converts the level through them unchanged. */
static void
fill_slot(allot__rate *r, const allot__allowance *a, uint32_t ver,
    const allot__rate *prev, uint64_t since)
{
	atomic_store_explicit(&r->since_ns, since, memory_order_relaxed);
	if (a->mode != ALLOT__MODE_LIMIT && prev != NULL) {
		atomic_store_explicit(&r->interval_fp,
		    atomic_load_explicit(
		        &prev->interval_fp, memory_order_relaxed),
		    memory_order_relaxed);
		atomic_store_explicit(&r->tau_ns,
		    atomic_load_explicit(&prev->tau_ns, memory_order_relaxed),
		    memory_order_relaxed);
		atomic_store_explicit(&r->rate,
		    atomic_load_explicit(&prev->rate, memory_order_relaxed),
		    memory_order_relaxed);
		atomic_store_explicit(&r->burst,
		    atomic_load_explicit(&prev->burst, memory_order_relaxed),
		    memory_order_relaxed);
		atomic_store_explicit(&r->tokens_per_ns,
		    atomic_load_explicit(
		        &prev->tokens_per_ns, memory_order_relaxed),
		    memory_order_relaxed);
		atomic_store_explicit(
		    &r->hint_ns, a->hint_ns, memory_order_relaxed);
		atomic_store_explicit(
		    &r->mode, (uint32_t) a->mode, memory_order_relaxed);
		atomic_store_explicit(
		    &r->ver, ver & ~ALLOT__VER_RETIRED, memory_order_release);
		return;
	}
	double rate = a->rate, burst = a->burst;
	if (!(rate > 0) || !isfinite(rate))
		rate = 1.0;
	if (!(burst > 0) || !isfinite(burst))
		burst = 1.0;
	double ns_per_token = 1e9 / rate;
	double ifp = ns_per_token * (double) (1u << ALLOT__FPBITS);
	uint64_t interval_fp = ifp >= 1.8e19 ? UINT64_MAX :
	    ifp < 1.0                        ? 1 :
	                                       (uint64_t) ifp;
	/* From the interval as stored: where it saturates (a rate of a few
	 * tokens a week or less), tau must too, or the bucket would hold
	 * more tokens of the saturated interval than its burst. */
	double tau = burst * (double) interval_fp /
	    (double) (1u << ALLOT__FPBITS);
	uint64_t tau_ns = tau >= (double) ALLOT__TAU_MAX ? ALLOT__TAU_MAX :
	                                                   (uint64_t) tau;
	atomic_store_explicit(
	    &r->interval_fp, interval_fp, memory_order_relaxed);
	atomic_store_explicit(&r->tau_ns, tau_ns, memory_order_relaxed);
	atomic_store_explicit(&r->rate, rate, memory_order_relaxed);
	atomic_store_explicit(&r->burst, burst, memory_order_relaxed);
	atomic_store_explicit(
	    &r->tokens_per_ns, rate / 1e9, memory_order_relaxed);
	atomic_store_explicit(&r->hint_ns, a->hint_ns, memory_order_relaxed);
	atomic_store_explicit(
	    &r->mode, (uint32_t) a->mode, memory_order_relaxed);
	atomic_store_explicit(
	    &r->ver, ver & ~ALLOT__VER_RETIRED, memory_order_release);
}

/* Copy slot[ver & 1] into the state's line (the single writer, once the
 * state has left the version the copy held: bucket.h). */
static void
hot_copy(allot__bucket *b, uint32_t ver)
{
	const allot__rate *r = &b->slot[ver & 1u];
	atomic_store_explicit(&b->hot_interval_fp,
	    atomic_load_explicit(&r->interval_fp, memory_order_relaxed),
	    memory_order_relaxed);
	atomic_store_explicit(&b->hot_tau_ns,
	    atomic_load_explicit(&r->tau_ns, memory_order_relaxed),
	    memory_order_relaxed);
	atomic_store_explicit(&b->hot_rate,
	    atomic_load_explicit(&r->rate, memory_order_relaxed),
	    memory_order_relaxed);
	atomic_store_explicit(&b->hot_burst,
	    atomic_load_explicit(&r->burst, memory_order_relaxed),
	    memory_order_relaxed);
	atomic_store_explicit(&b->hot_mode,
	    atomic_load_explicit(&r->mode, memory_order_relaxed),
	    memory_order_relaxed);
	atomic_store_explicit(&b->hot_ver, ver, memory_order_release);
}

void
allot__bucket_init(allot__bucket *b, const allot__allowance *a)
{
	allot__allowance lim = *a;
	lim.mode = ALLOT__MODE_LIMIT;
	fill_slot(&b->slot[0], &lim, 0, NULL, 0);
	fill_slot(&b->slot[1], &lim, 0, NULL, 0);
	if (a->mode != ALLOT__MODE_LIMIT) {
		fill_slot(&b->slot[1], a, 1, &b->slot[0], 0);
		atomic_init(&b->cur, 1);
		atomic_init(&b->leased, 0);
		atomic_init(&b->shadow, false);
		atomic_init(&b->state, 1); /* z = 0, version 1 */
		hot_copy(b, 1);
		return;
	}
	atomic_init(&b->cur, 0);
	atomic_init(&b->leased, 0);
	atomic_init(&b->shadow, false);
	atomic_init(&b->state, 0); /* z = 0: full */
	hot_copy(b, 0);
}

/* Debt in tokens under slot `r` at `now` for state word `s`. */
static double
debt_tokens(const allot__rate *r, uint64_t s, uint64_t now)
{
	uint64_t z = s >> ALLOT__VBITS;
	if (z <= now)
		return 0.0;
	double ns_per_token = (double) atomic_load_explicit(
	                          &r->interval_fp, memory_order_relaxed) /
	    (double) (1u << ALLOT__FPBITS);
	return (double) (z - now) / ns_per_token;
}

/* z for a bucket of allowance `to` holding the level that `s` holds
 * under `from`. */
static uint64_t
convert(
    uint64_t s, uint64_t now, const allot__rate *from, const allot__rate *to)
{
	double from_burst = atomic_load_explicit(
	    &from->burst, memory_order_relaxed);
	double to_burst = atomic_load_explicit(
	    &to->burst, memory_order_relaxed);
	double level = from_burst - debt_tokens(from, s, now);
	if (level > to_burst)
		level = to_burst;
	double debt = to_burst - level; /* > to_burst after settle debt */
	double ns_per_token = (double) atomic_load_explicit(
	                          &to->interval_fp, memory_order_relaxed) /
	    (double) (1u << ALLOT__FPBITS);
	/* Rounded up: a conversion never creates a token. */
	double dz = ceil(debt * ns_per_token);
	if (!(dz > 0))
		return now;
	if (dz > (double) (2 * ALLOT__NEED_MAX))
		dz = (double) (2 * ALLOT__NEED_MAX);
	return now + (uint64_t) dz;
}

uint64_t
allot__bucket_upgrade(allot__bucket *b, uint64_t s, uint64_t now)
{
	for (;;) {
		uint32_t cur = atomic_load_explicit(
		    &b->cur, memory_order_acquire);
		uint32_t v = (uint32_t) s & ALLOT__VMASK;
		if (v == (cur & ALLOT__VMASK))
			return s;
		/* The state lags by exactly one version: the writer only
		 * rewrites slot v & 1 after the state has left version v. */
		const allot__rate *from = &b->slot[v & 1u];
		const allot__rate *to = &b->slot[cur & 1u];
		/* Convert at the time the new allowance took effect, never
		 * earlier: a caller holding an older `now` would otherwise
		 * credit the time before the swap at the new rate. */
		uint64_t since = atomic_load_explicit(
		    &to->since_ns, memory_order_relaxed);
		uint64_t nz = convert(s, now > since ? now : since, from, to);
		uint64_t ns = (nz << ALLOT__VBITS) | (cur & ALLOT__VMASK);
		if (atomic_compare_exchange_strong_explicit(&b->state, &s, ns,
		        memory_order_acq_rel, memory_order_acquire))
			return ns;
	}
}

void
allot__bucket_set(allot__bucket *b, const allot__allowance *a, uint64_t now)
{
	uint32_t cur = atomic_load_explicit(&b->cur, memory_order_relaxed);
	/* The state may still be one version behind if no acquire ran since
	 * the last set: bring it up to date before reusing its slot. */
	uint64_t s = atomic_load_explicit(&b->state, memory_order_acquire);
	allot__bucket_upgrade(b, s, now);
	uint32_t next = cur + 1;
	fill_slot(&b->slot[next & 1u], a, next, &b->slot[cur & 1u], now);
	atomic_store_explicit(&b->cur, next, memory_order_seq_cst);
	/* Leases taken under `cur` are spent no more (bucket.h). */
	atomic_store_explicit(&b->slot[cur & 1u].ver,
	    (cur & ~ALLOT__VER_RETIRED) | ALLOT__VER_RETIRED,
	    memory_order_release);
	s = atomic_load_explicit(&b->state, memory_order_acquire);
	allot__bucket_upgrade(b, s, now);
	/* The state is at `next` now: no decision that reads the copy of
	 * `cur` can stand any more. */
	hot_copy(b, next);
}

/* Whether `n` tokens are there for a lease at `now`, `own` of the
 * tokens reserved in `leased` being the caller's; read-only: a bucket
 * that cannot lease is not written to. */
static bool
lease_possible(allot__bucket *b, uint64_t now, uint64_t n, uint64_t own)
{
	uint64_t s = atomic_load_explicit(&b->state, memory_order_acquire);
	uint32_t cur = atomic_load_explicit(&b->cur, memory_order_acquire);
	if ((s & ALLOT__VMASK) != (cur & ALLOT__VMASK))
		return true; /* lagging: the take below upgrades it */
	const allot__rate *r = &b->slot[cur & 1u];
	if (atomic_load_explicit(&r->mode, memory_order_relaxed) !=
	    ALLOT__MODE_LIMIT)
		return false;
	uint64_t iv = atomic_load_explicit(
	    &r->interval_fp, memory_order_relaxed);
	uint64_t held = atomic_load_explicit(&b->leased, memory_order_relaxed);
	uint64_t z = s >> ALLOT__VBITS;
	uint64_t floor_z = now +
	    (held > own ? allot__need_ns(held - own, iv) : 0);
	uint64_t base = z > floor_z ? z : floor_z;
	return base + allot__need_ns(n, iv) - now <=
	    atomic_load_explicit(&r->tau_ns, memory_order_relaxed);
}

bool
allot__bucket_lease(
    allot__bucket *b, uint64_t now, uint64_t n, allot__take *out)
{
	if (!lease_possible(b, now, n, 0))
		return false;
	/* Reserve first: a take that reads the reservation keeps the
	 * level below burst - leased; one that read before it is ordered
	 * by the CAS on the state either way (bucket.h). */
	atomic_fetch_add_explicit(&b->leased, n, memory_order_acq_rel);
	allot__bucket_take_own(b, now, n, n, out);
	if (out->allowed && !out->open)
		return true;
	atomic_fetch_sub_explicit(&b->leased, n, memory_order_acq_rel);
	return false;
}

bool
allot__bucket_relet(
    allot__bucket *b, uint64_t now, uint64_t n, allot__take *out)
{
	/* The reservation stays as it is: between the two batches it
	 * holds tokens already spent, which only keeps the bucket lower
	 * than a release and a new reservation would have. */
	if (!lease_possible(b, now, n, n))
		return false;
	allot__bucket_take_own(b, now, n, n, out);
	return out->allowed && !out->open;
}

void
allot__bucket_unlease(
    allot__bucket *b, uint64_t n, uint64_t unspent, uint64_t now)
{
	/* Release the reservation before refunding: level + leased never
	 * exceeds the burst in between, since unspent <= n. */
	atomic_fetch_sub_explicit(&b->leased, n, memory_order_acq_rel);
	allot__bucket_adjust(b, -(int64_t) unspent, now);
}

void
allot__bucket_get(const allot__bucket *b, allot__allowance *ret)
{
	uint32_t cur = atomic_load_explicit(&b->cur, memory_order_acquire);
	const allot__rate *r = &b->slot[cur & 1u];
	ret->rate = atomic_load_explicit(&r->rate, memory_order_relaxed);
	ret->burst = atomic_load_explicit(&r->burst, memory_order_relaxed);
	ret->mode = (allot__mode) atomic_load_explicit(
	    &r->mode, memory_order_relaxed);
	ret->hint_ns = atomic_load_explicit(&r->hint_ns, memory_order_relaxed);
}

double
allot__bucket_level(allot__bucket *b, uint64_t now)
{
	uint64_t s = atomic_load_explicit(&b->state, memory_order_acquire);
	s = allot__bucket_upgrade(b, s, now);
	const allot__rate *r = &b->slot[(s & ALLOT__VMASK) & 1u];
	if (atomic_load_explicit(&r->mode, memory_order_relaxed) ==
	    ALLOT__MODE_CLOSED)
		return 0;
	return atomic_load_explicit(&r->burst, memory_order_relaxed) -
	    debt_tokens(r, s, now);
}

void
allot__bucket_empty(allot__bucket *b, uint64_t now)
{
	uint64_t s = atomic_load_explicit(&b->state, memory_order_acquire);
	for (;;) {
		s = allot__bucket_upgrade(b, s, now);
		uint32_t v = (uint32_t) s & ALLOT__VMASK;
		const allot__rate *r = &b->slot[v & 1u];
		uint64_t nz = now +
		    atomic_load_explicit(&r->tau_ns, memory_order_relaxed);
		if ((s >> ALLOT__VBITS) >= nz)
			return; /* empty already (or in debt) */
		if (atomic_compare_exchange_weak_explicit(&b->state, &s,
		        (nz << ALLOT__VBITS) | v, memory_order_acq_rel,
		        memory_order_acquire))
			return;
	}
}

/* Move the bucket's z by `whole` + `part` tokens at its rate in force:
 * later (`add`: tokens taken, debt allowed) or earlier (tokens put in,
 * never above the burst). */
static void
shift(allot__bucket *b, bool add, uint64_t whole, double part, uint64_t now)
{
	uint64_t s = atomic_load_explicit(&b->state, memory_order_acquire);
	for (;;) {
		s = allot__bucket_upgrade(b, s, now);
		uint32_t v = (uint32_t) s & ALLOT__VMASK;
		const allot__rate *r = &b->slot[v & 1u];
		uint64_t iv = atomic_load_explicit(
		    &r->interval_fp, memory_order_relaxed);
		uint64_t z = s >> ALLOT__VBITS;
		uint64_t ns = allot__need_ns(whole, iv);
		if (part > 0)
			ns += (uint64_t) (part * (double) iv /
			    (double) (1u << ALLOT__FPBITS));
		uint64_t nz;
		if (add) {
			uint64_t base = z > now ? z : now;
			nz = base + ns;
			if (nz - now > 2 * ALLOT__NEED_MAX)
				nz = now + 2 * ALLOT__NEED_MAX;
		} else {
			if (z <= now)
				return; /* already full */
			nz = z - now > ns ? z - ns : now;
		}
		if (atomic_compare_exchange_weak_explicit(&b->state, &s,
		        (nz << ALLOT__VBITS) | v, memory_order_acq_rel,
		        memory_order_acquire))
			return;
	}
}

void
allot__bucket_adjust(allot__bucket *b, int64_t extra, uint64_t now)
{
	if (extra > 0)
		shift(b, true, (uint64_t) extra, 0, now);
	else if (extra < 0)
		shift(b, false, 0u - (uint64_t) extra, 0, now);
}

/* shift() by a count of tokens that may have a part of one. */
static void
shift_tokens(allot__bucket *b, bool add, double tokens, uint64_t now)
{
	if (!(tokens > 0) || !(tokens < 1e18))
		return;
	double whole = floor(tokens);
	shift(b, add, (uint64_t) whole, tokens - whole, now);
}

void
allot__bucket_deposit(allot__bucket *b, double tokens, uint64_t now)
{
	shift_tokens(b, false, tokens, now);
}

void
allot__bucket_take_part(allot__bucket *b, double tokens, uint64_t now)
{
	shift_tokens(b, true, tokens, now);
}
