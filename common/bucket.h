/* SPDX-License-Identifier: MIT */
/*
 * The token bucket every decision runs through, shared by the agent, the
 * simulator and the coordinator's accounting.
 *
 * It is a GCRA (generic cell rate algorithm) bucket: its whole state is
 * one 64-bit word holding `z`, the monotonic time at which the bucket will
 * be full again. With interval I = 1/rate (ns per token) and tolerance
 * tau = burst * I, the level at time `now` is (tau - max(0, z - now)) / I,
 * so lazy refill, fractional tokens and exact retry-after all fall out of
 * one subtraction. A request of cost c passes when
 * max(z, now) + c*I - now <= tau, and then z becomes max(z, now) + c*I:
 * one compare-and-swap. A denial writes nothing.
 *
 * The allowance (rate, burst) is replaceable from another thread while
 * acquires run. Two allowance slots alternate; the low ALLOT__VBITS bits
 * of the state word name the version the state was computed under. The
 * single writer (allot__bucket_set, serialised by its caller) fills the
 * idle slot, publishes the new version in `cur`, then converts the state
 * (level preserved, capped at the new burst) with a CAS. An acquirer that
 * finds the state one version behind converts it itself. A slot is only
 * rewritten once the state has left its version, so an acquirer that read
 * a slot being rewritten always sees the state word change and retries:
 * for allowed requests the CAS fails, for denials the state is re-read
 * after the slot (a seqlock whose sequence is the state word itself).
 *
 * Token leases (the hot-key path of a contended key): a thread may take a
 * small batch of tokens in one CAS and spend them without touching the
 * shared line again. Leased tokens stay inside the burst: `leased` counts
 * the tokens reserved by every open lease, and no take lets the bucket
 * refill above burst - leased (its base is max(z, now + leased * I)), so
 * the bucket's level plus what threads hold never exceeds the burst and
 * the over-admission bound is that of a bucket without leases. A lease
 * is spent only under the allowance it was taken under (a swap marks the
 * old slot retired) and is given back, unspent tokens refunded, on a
 * swap, when idle, or when its thread exits (agent.c). With nothing
 * leased (always, in one thread) the arithmetic is the plain GCRA's.
 *
 * Arithmetic saturates: tau is capped at ALLOT__TAU_MAX (about 13 days of
 * refill), costs at ALLOT__NEED_MAX, and `z` at now + 2 * ALLOT__NEED_MAX,
 * so no configured rate or burst can overflow the 60 bits of `z`
 * (2^60 ns = 36 years of monotonic time).
 */
#ifndef ALLOT_COMMON_BUCKET_H
#define ALLOT_COMMON_BUCKET_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define ALLOT__VBITS 4u
#define ALLOT__VMASK ((1u << ALLOT__VBITS) - 1u)
#define ALLOT__FPBITS 16u /* fraction bits of interval_fp */
#define ALLOT__TAU_MAX (1ull << 50) /* ns, ~13 days */
#define ALLOT__NEED_MAX (1ull << 52) /* ns */

#if defined(__GNUC__)
#define allot__likely(x) __builtin_expect(!!(x), 1)
#define allot__unlikely(x) __builtin_expect(!!(x), 0)
#else
#define allot__likely(x) (x)
#define allot__unlikely(x) (x)
#endif

typedef enum allot__mode {
	ALLOT__MODE_LIMIT = 0, /* a token bucket */
	ALLOT__MODE_OPEN = 1, /* admit everything (fallback: open) */
	ALLOT__MODE_CLOSED = 2, /* deny everything (fallback: closed) */
} allot__mode;

/* A slot's `ver` once a newer version is in force: leases taken under
 * it are no longer spent. Versions are stored modulo 2^31. */
#define ALLOT__VER_RETIRED (1u << 31)

/* One allowance version, on one cache line. Fields are atomics because
 * the writer may rewrite an idle slot while a slow reader still looks at
 * it (the reader then retries, see above). */
typedef struct allot__rate {
	_Alignas(64) _Atomic uint64_t interval_fp; /* ns per token, 48.16 */
	_Atomic uint64_t tau_ns; /* burst * interval, <= TAU_MAX */
	_Atomic double rate; /* tokens per second */
	_Atomic double burst; /* tokens */
	_Atomic double tokens_per_ns; /* rate / 1e9, for levels */
	_Atomic uint64_t hint_ns; /* CLOSED: retry-after to suggest */
	_Atomic uint64_t since_ns; /* when this version took effect */
	_Atomic uint32_t mode; /* allot__mode */
	_Atomic uint32_t ver; /* version stored here, | VER_RETIRED */
} allot__rate;

/*
 * Three lines: the one a decision reads (the state, the lease
 * reservations that bound it and a copy of what a decision needs of the
 * slot in force), then one per slot. The copy is rewritten by the
 * single writer only after the state has left the version it held, so it
 * is validated exactly as the slots are (by the CAS, or by the re-read of
 * the state); `hot_ver` is stored last, so a reader that finds its
 * version there reads a complete copy. Until then decisions read the
 * slot.
 */
typedef struct allot__bucket {
	_Alignas(64) _Atomic uint64_t state; /* z << VBITS | version */
	_Atomic uint32_t cur; /* version in force (full counter) */
	_Atomic uint32_t hot_ver; /* version the copy holds (full counter) */
	_Atomic uint64_t leased; /* tokens reserved by open leases */
	_Atomic uint64_t hot_interval_fp; /* of slot[hot_ver & 1] */
	_Atomic uint64_t hot_tau_ns;
	_Atomic double hot_rate;
	_Atomic double hot_burst;
	_Atomic uint32_t hot_mode;
	_Atomic bool shadow; /* evaluate, count, never deny */
	allot__rate slot[2]; /* slot[v & 1] holds version v */
} allot__bucket;
_Static_assert(__builtin_offsetof(allot__bucket, slot) == 64,
    "a decision reads the bucket's first line only");

/* What one take decided. */
typedef struct allot__take {
	bool allowed;
	bool open; /* decided by MODE_OPEN */
	bool contended; /* a CAS lost to another thread on the way */
	uint64_t debt_ns; /* z - now after the decision: time until full */
	uint64_t wait_ns; /* denied: time until `cost` tokens exist */
	const allot__rate *r; /* the slot decided under */
	double rate, burst; /* its allowance */
	uint32_t mode; /* its allot__mode */
	uint32_t ver; /* the version decided under (full counter) */
} allot__take;

/* An allowance to install. */
typedef struct allot__allowance {
	double rate; /* tokens/s, > 0 for MODE_LIMIT */
	double burst; /* tokens, > 0 for MODE_LIMIT */
	allot__mode mode;
	uint64_t hint_ns; /* MODE_CLOSED: suggested retry-after */
} allot__allowance;

/* Initialise a full bucket at `a` (not thread-safe: before publication). */
void allot__bucket_init(allot__bucket *b, const allot__allowance *a);

/* Install a new allowance; the level is preserved (capped at the new
 * burst). One writer at a time per bucket; any number of concurrent
 * acquirers. */
void allot__bucket_set(
    allot__bucket *b, const allot__allowance *a, uint64_t now);

/* The allowance currently in force. */
void allot__bucket_get(const allot__bucket *b, allot__allowance *ret);

/* Tokens in the bucket at `now` (may be negative after a settlement
 * debt); 0 while it is closed: it admits nothing (though the level it
 * opens with, unless emptied, goes on refilling). */
double allot__bucket_level(allot__bucket *b, uint64_t now);

/* Take every token the bucket holds at `now` (in any mode: a closed
 * bucket then opens empty). The single writer's, like
 * allot__bucket_set(). */
void allot__bucket_empty(allot__bucket *b, uint64_t now);

/* Add (extra > 0) or refund (extra < 0) tokens after the fact: debt may
 * take the level below zero; a refund never lifts it above the burst. */
void allot__bucket_adjust(allot__bucket *b, int64_t extra, uint64_t now);

/* Put `tokens` into the bucket, a part of one included (the central
 * reserve's part that completes a token, agent/tail.c): never above the
 * burst. */
void allot__bucket_deposit(allot__bucket *b, double tokens, uint64_t now);

/* Take `tokens` out of the bucket, a part of one included, whatever it
 * holds: what a racing take leaves short is debt. */
void allot__bucket_take_part(allot__bucket *b, double tokens, uint64_t now);

/* Bring a state computed under an older version up to date (slow path;
 * returns the state now in the bucket). */
uint64_t allot__bucket_upgrade(allot__bucket *b, uint64_t s, uint64_t now);

static inline uint64_t
allot__need_ns(uint64_t cost, uint64_t interval_fp)
{
	__extension__ typedef unsigned __int128 u128;
	u128 prod = ((u128) cost * interval_fp) >> ALLOT__FPBITS;
	return prod > ALLOT__NEED_MAX ? ALLOT__NEED_MAX : (uint64_t) prod;
}

/*
 * Take `cost` tokens at `now`, `own` of the tokens reserved in `leased`
 * being the caller's own (a lease being taken) and the rest holding the
 * bucket below its burst. Lock-free; the allow path is one CAS, the deny
 * path only reads.
 */
static inline void
allot__bucket_take_own(allot__bucket *b, uint64_t now, uint64_t cost,
    uint64_t own, allot__take *out)
{
	uint64_t s = atomic_load_explicit(&b->state, memory_order_acquire);
	out->contended = false;
	for (;;) {
		uint32_t v = (uint32_t) s & ALLOT__VMASK;
		uint32_t cur = atomic_load_explicit(
		    &b->cur, memory_order_acquire);
		if (allot__unlikely(v != (cur & ALLOT__VMASK))) {
			s = allot__bucket_upgrade(b, s, now);
			continue;
		}
		const allot__rate *r = &b->slot[v & 1u];
		/* Acquire loads (plain moves on x86): the state re-read
		 * below cannot be hoisted above them. The copy in the
		 * state's line when it holds this version, else the slot. */
		uint64_t iv, tau;
		uint32_t mode;
		if (allot__likely(atomic_load_explicit(&b->hot_ver,
		                      memory_order_acquire) == cur)) {
			iv = atomic_load_explicit(
			    &b->hot_interval_fp, memory_order_acquire);
			tau = atomic_load_explicit(
			    &b->hot_tau_ns, memory_order_acquire);
			mode = atomic_load_explicit(
			    &b->hot_mode, memory_order_acquire);
			out->rate = atomic_load_explicit(
			    &b->hot_rate, memory_order_acquire);
			out->burst = atomic_load_explicit(
			    &b->hot_burst, memory_order_acquire);
		} else {
			iv = atomic_load_explicit(
			    &r->interval_fp, memory_order_acquire);
			tau = atomic_load_explicit(
			    &r->tau_ns, memory_order_acquire);
			mode = atomic_load_explicit(
			    &r->mode, memory_order_acquire);
			out->rate = atomic_load_explicit(
			    &r->rate, memory_order_acquire);
			out->burst = atomic_load_explicit(
			    &r->burst, memory_order_acquire);
		}
		out->mode = mode;
		uint64_t held = atomic_load_explicit(
		    &b->leased, memory_order_relaxed);
		uint64_t z = s >> ALLOT__VBITS;
		uint64_t floor_z = now;
		/* Tokens held in leases never refill into the bucket. */
		if (allot__unlikely(held > own))
			floor_z += allot__need_ns(held - own, iv);
		uint64_t base = z > floor_z ? z : floor_z;
		uint64_t nz = base + allot__need_ns(cost, iv);
		out->r = r;
		out->ver = cur;
		if (allot__likely(mode == ALLOT__MODE_LIMIT)) {
			if (nz - now <= tau) {
				if (atomic_compare_exchange_weak_explicit(
				        &b->state, &s,
				        (nz << ALLOT__VBITS) | v,
				        memory_order_acq_rel,
				        memory_order_acquire)) {
					out->allowed = true;
					out->open = false;
					out->debt_ns = nz - now;
					out->wait_ns = 0;
					return;
				}
				out->contended = true;
				continue;
			}
		}
		/* Not admitted by the bucket (or not a bucket): validate that
		 * the slot we read belonged to the state we read. */
		uint64_t s2 = atomic_load_explicit(
		    &b->state, memory_order_acquire);
		if (allot__unlikely(s2 != s)) {
			s = s2;
			continue;
		}
		out->debt_ns = base - now;
		if (mode == ALLOT__MODE_OPEN) {
			out->allowed = true;
			out->open = true;
			out->wait_ns = 0;
		} else if (mode == ALLOT__MODE_CLOSED) {
			out->allowed = false;
			out->open = false;
			out->wait_ns = atomic_load_explicit(
			    &r->hint_ns, memory_order_relaxed);
		} else {
			out->allowed = false;
			out->open = false;
			out->wait_ns = nz - now - tau;
		}
		return;
	}
}

/* The hot path: try to take `cost` tokens at time `now`. */
static inline void
allot__bucket_take(
    allot__bucket *b, uint64_t now, uint64_t cost, allot__take *out)
{
	allot__bucket_take_own(b, now, cost, 0, out);
}

/* Open a lease of `n` tokens: reserve them in `leased` and take them in
 * one CAS. True when the bucket (in MODE_LIMIT) had them; `out` says
 * under which version, to spend them under. A refusal writes nothing
 * but the reservation it takes back. */
bool allot__bucket_lease(
    allot__bucket *b, uint64_t now, uint64_t n, allot__take *out);

/* Take the next batch of a lease of `n` tokens, all spent, whose `n`
 * tokens stay reserved: one CAS and no other write, the hot key's
 * renewal. False (nothing written): the bucket has not `n` tokens, or is
 * not in MODE_LIMIT; the lease is still open, to close. */
bool allot__bucket_relet(
    allot__bucket *b, uint64_t now, uint64_t n, allot__take *out);

/* Close a lease of `n` tokens, `unspent` of them refunded. */
void allot__bucket_unlease(
    allot__bucket *b, uint64_t n, uint64_t unspent, uint64_t now);

/* Whether a lease taken under version `ver` may still be spent: no
 * allowance has replaced it. */
static inline bool
allot__bucket_lease_live(const allot__bucket *b, uint32_t ver)
{
	return atomic_load_explicit(&b->slot[ver & 1u].ver,
	           memory_order_acquire) == (ver & ~ALLOT__VER_RETIRED);
}

#endif
