/* SPDX-License-Identifier: MIT */
/*
 * Key hashing: a fast seeded 64-bit hash for identity and endpoint
 * strings (XXH3, hash.c) used by the agent's key tables and the
 * coordinator's indexes, and a 64-bit finaliser. Not a
 * cryptographic hash: tables that hold attacker-chosen identities are
 * bounded and use a per-process random seed.
 */
#ifndef ALLOT_COMMON_HASH_H
#define ALLOT_COMMON_HASH_H

#include <stddef.h>
#include <stdint.h>

uint64_t allot__hash(const void *data, size_t len, uint64_t seed);

/* A 64-bit finaliser with full avalanche (every input bit affects every
 * output bit). */
static inline uint64_t
allot__mix64(uint64_t x)
{
	x ^= x >> 32;
	x *= 0xd6e8feb86659fd93ull;
	x ^= x >> 32;
	x *= 0xd6e8feb86659fd93ull;
	x ^= x >> 32;
	return x;
}

/* A process-wide random seed (from getrandom at first use). */
uint64_t allot__hash_seed(void);

#endif
