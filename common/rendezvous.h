/* SPDX-License-Identifier: MIT */
/*
 * Cluster membership and key ownership: a static member list (NAME=URL
 * entries, identical on every member and agent) and rendezvous, or
 * highest-random-weight, hashing of a key (service, quota) to the live
 * member that owns it. The hash is seeded with a fixed constant, never
 * the per-process seed, so that every member and every agent computes
 * the same owner for the same key and the same set of live members.
 * Removing a member moves only the keys it owned (each to its next
 * highest weight); bringing it back moves exactly those keys back.
 */
#ifndef ALLOT_COMMON_RENDEZVOUS_H
#define ALLOT_COMMON_RENDEZVOUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Fixed for the protocol: changing it reshuffles every cluster. */
#define ALLOT__RENDEZVOUS_SEED 0x616c6c6f742d6877ull /* "allot-hw" */
#define ALLOT__CLUSTER_MAX_MEMBERS 16u
#define ALLOT__MEMBER_NAME_MAX 64u
#define ALLOT__MEMBER_URL_MAX 256u

typedef struct allot__member {
	char name[ALLOT__MEMBER_NAME_MAX];
	char url[ALLOT__MEMBER_URL_MAX];
	uint64_t hash; /* allot__rendezvous_member(name) */
} allot__member;

/* The rendezvous identity of a key: service and quota identity. */
uint64_t allot__rendezvous_key(const char *service, const char *quota);

/* The rendezvous identity of a member, from its name. */
uint64_t allot__rendezvous_member(const char *name);

/* The weight of `member` for `key`; the owner has the highest. */
uint64_t allot__rendezvous_weight(uint64_t key, uint64_t member);

/* The index of the owner of `key` among the `n` members whose `live[i]`
 * is true (every member when `live` is NULL), or -1 when none is live.
 * Ties (never seen in practice) go to the lower index. */
int allot__rendezvous_owner(
    uint64_t key, const uint64_t *members, const bool *live, size_t n);

/* Parse one "NAME=URL" entry. An entry without "NAME=" (a bare URL) is
 * named by its URL when `bare_ok`. Returns 0, or -1 with a reason in
 * `err` (empty name or URL, too long, a name with a ',' or '='). */
int allot__member_parse(const char *spec, bool bare_ok, char *err,
    size_t errlen, allot__member *ret);

/* Parse a comma-separated list of entries into `ret[0..max)`; names
 * must be distinct. Returns the count, or -1 with a reason in `err`. */
int allot__member_parse_list(const char *list, bool bare_ok,
    allot__member *ret, size_t max, char *err, size_t errlen);

#endif
