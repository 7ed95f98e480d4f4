/* SPDX-License-Identifier: MIT */
/* Seeding the generators of prng.h from the kernel's entropy. */
#include "prng.h"

#include <stdint.h>
#include <sys/random.h>
#include <time.h>

#include "clock.h"

uint64_t
allot__prng_seed(uint64_t seed, const void *salt)
{
	if (seed != 0)
		return seed;
	uint64_t s = 0;
	if (getrandom(&s, sizeof s, GRND_NONBLOCK) != (ssize_t) sizeof s) {
		s = allot__mono_ns() ^ (uint64_t) (uintptr_t) salt;
		s ^= (uint64_t) time(NULL) << 20;
	}
	return s;
}
