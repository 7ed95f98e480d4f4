/* SPDX-License-Identifier: MIT */
/*
 * A fast string hash for in-memory tables: sixteen bytes per 64x64->128
 * bit multiply, folded high into low, with the tail read as (possibly
 * overlapping) whole words so no byte loop or library call runs for the
 * short strings identities and endpoints are. Seeded per process; never
 * persisted, so it may change between versions.
 */
#include "hash.h"

#include <stdatomic.h>
#include <string.h>
#include <sys/random.h>

#define K0 0xa0761d6478bd642full
#define K1 0xe7037ed1a0b428dbull
#define K2 0x8ebc6af09c88c6e3ull
#define K3 0x589965cc75374cc3ull

static inline uint64_t
mum(uint64_t a, uint64_t b)
{
	__extension__ typedef unsigned __int128 u128;
	u128 r = (u128) a * b;
	return (uint64_t) r ^ (uint64_t) (r >> 64);
}

static inline uint64_t
load64(const unsigned char *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return v;
}

static inline uint64_t
load32(const unsigned char *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return v;
}

uint64_t
allot__hash(const void *data, size_t len, uint64_t seed)
{
	const unsigned char *p = data;
	uint64_t h = seed ^ mum(seed ^ K0, (uint64_t) len ^ K1);
	size_t n = len;
	while (n > 16) {
		h = mum(load64(p) ^ K1 ^ h, load64(p + 8) ^ K2);
		p += 16;
		n -= 16;
	}
	uint64_t a, b;
	if (n > 8) {
		a = load64(p);
		b = load64(p + n - 8);
	} else if (n >= 4) {
		a = load32(p) << 32 | load32(p + n - 4);
		b = 0;
	} else if (n > 0) {
		a = (uint64_t) p[0] << 16 | (uint64_t) p[n >> 1] << 8 |
		    p[n - 1];
		b = 0;
	} else {
		a = b = 0;
	}
	h = mum(a ^ K1 ^ h, b ^ K3 ^ (uint64_t) len);
	return mum(h ^ K0, h ^ K2 ^ (uint64_t) len);
}

uint64_t
allot__hash_seed(void)
{
	static _Atomic uint64_t seed;
	uint64_t s = atomic_load_explicit(&seed, memory_order_relaxed);
	if (s != 0)
		return s;
	if (getrandom(&s, sizeof s, 0) != (ssize_t) sizeof s)
		s = (uint64_t) (uintptr_t) &seed ^ 0x2545f4914f6cdd1dull;
	s |= 1;
	uint64_t expected = 0;
	if (!atomic_compare_exchange_strong(&seed, &expected, s))
		return expected;
	return s;
}
