/* SPDX-License-Identifier: MIT */
/*
 * The pseudo-random generators, one definition each: splitmix64 for
 * seeded, reproducible streams (retry and throttle jitter, the
 * simulator's workloads) and xorshift64* for the sync engine's jitter
 * and the benchmarks. None is for secrets. The numbers are part of
 * behaviour: the simulator's output is compared byte for byte and the
 * retry and throttle tests pin sequences, so these must never change.
 */
#ifndef ALLOT_COMMON_PRNG_H
#define ALLOT_COMMON_PRNG_H

#include <stdint.h>

/* splitmix64's increment, the golden ratio in 64 bits. Also a handy
 * odd constant to spread small seeds with. */
#define ALLOT__GOLDEN64 0x9e3779b97f4a7c15ull

/* splitmix64's output function: a bijective mix of all 64 bits, also
 * good as a hash finalizer. */
static inline uint64_t
allot__splitmix64_mix(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* The next splitmix64 number of the stream whose state is `*s`. */
static inline uint64_t
allot__splitmix64(uint64_t *s)
{
	return allot__splitmix64_mix(*s += ALLOT__GOLDEN64);
}

/* The top 53 bits of `x` as a double in [0, 1). */
static inline double
allot__unit53(uint64_t x)
{
	return (double) (x >> 11) * 0x1.0p-53;
}

/* A splitmix64 number as a double in [0, 1). */
static inline double
allot__splitmix64_unit(uint64_t *s)
{
	return allot__unit53(allot__splitmix64(s));
}

/* The next xorshift64* number; `*s` must not be 0. */
static inline uint64_t
allot__xorshift64s(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545f4914f6cdd1dull;
}

/* An xorshift64* number as a double in [0, 1). */
static inline double
allot__xorshift64s_unit(uint64_t *s)
{
	return allot__unit53(allot__xorshift64s(s));
}

/* `seed`, or when it is 0 a seed from the kernel's entropy (the clock
 * and `salt`'s address if that fails): how every stream that may be
 * pinned by its caller is started. */
uint64_t allot__prng_seed(uint64_t seed, const void *salt);

#endif
