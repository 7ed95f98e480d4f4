/* SPDX-License-Identifier: MIT */
/*
 * The string hash of in-memory tables: XXH3 (Debian's libxxhash-dev),
 * seeded per process. Its 17-128 byte path, where identities fall,
 * mixes 16-byte pairs from both ends in parallel multiplies rather than
 * one after another, and the whole of it is inlined from the library's
 * header (XXH_INLINE_ALL: no call into the shared library). Never
 * persisted, so it may change between versions.
 */
#include "hash.h"

#include <stdatomic.h>
#include <sys/random.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

uint64_t
allot__hash(const void *data, size_t len, uint64_t seed)
{
	return XXH3_64bits_withSeed(data, len, seed);
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
