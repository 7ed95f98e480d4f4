/* SPDX-License-Identifier: MIT */
/*
 * Verified tokens remembered (allot/jwt.h, cache_entries): a token is
 * known by its SHA-256, so that a second use costs a hash instead of a
 * signature check. Direct-mapped, a mutex per stripe of entries; an
 * entry holds the claims and the times to check again at each use, and
 * the key generation it was verified under: a re-read of any key file
 * moves the generation on, and every entry of an older one is a miss.
 */
#ifndef ALLOT_JWT_CACHE_H
#define ALLOT_JWT_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include <allot/jwt.h>

#define ALLOT__JWT_DIGEST 32 /* SHA-256 */

typedef struct allot__jwt_cache allot__jwt_cache;

/* What a verified token said, beside its claims. */
typedef struct allot__jwt_seen {
	allot_jwt_claims claims;
	double exp; /* "exp" */
	double nbf; /* "nbf"; -inf when absent */
} allot__jwt_seen;

/* @return ALLOT_OK; ALLOT_ENOMEM. */
int allot__jwt_cache_create(unsigned entries, allot__jwt_cache **ret);
void allot__jwt_cache_destroy(allot__jwt_cache *c);

/* The token of `digest`, verified under key generation `gen`, into
 * *out; false when not remembered (or under another generation). */
bool allot__jwt_cache_get(allot__jwt_cache *c,
    const uint8_t digest[ALLOT__JWT_DIGEST], uint64_t gen,
    allot__jwt_seen *out);
void allot__jwt_cache_put(allot__jwt_cache *c,
    const uint8_t digest[ALLOT__JWT_DIGEST], uint64_t gen,
    const allot__jwt_seen *seen);

#endif /* ALLOT_JWT_CACHE_H */
