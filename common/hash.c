/* SPDX-License-Identifier: MIT */
/* A fast string hash: eight bytes per multiply, then a full finaliser. */
#include "hash.h"

#include <stdatomic.h>
#include <string.h>
#include <sys/random.h>

uint64_t
allot__hash(const void *data, size_t len, uint64_t seed)
{
	const unsigned char *p = data;
	uint64_t h = seed ^ (len * 0x9e3779b97f4a7c15ull);
	while (len >= 8) {
		uint64_t w;
		memcpy(&w, p, 8);
		h = (h ^ allot__mix64(w + 0x9e3779b97f4a7c15ull)) *
		    0xbf58476d1ce4e5b9ull;
		p += 8;
		len -= 8;
	}
	if (len > 0) {
		uint64_t w = 0;
		memcpy(&w, p, len);
		h = (h ^ allot__mix64(w + len)) * 0x94d049bb133111ebull;
	}
	return allot__mix64(h);
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
