/* SPDX-License-Identifier: MIT */
/*
 * The store's in-memory batch: what record calls queued since the last
 * commit, in a form that costs no I/O and, in the steady state, no
 * malloc. Usage is summed per (second, service, quota), shares, syncs
 * ("seen") and bucket levels are coalesced per session and quota (only
 * the newest value matters), and the rare records (joins, leaves, config
 * loads, events) are appended to a list of ops allocated from an arena.
 * (service, quota) pairs are interned once in an allot__store_keys and
 * live until the store closes, so entries compare keys by pointer.
 *
 * Nothing here locks or touches SQLite: the record side (store_record.c)
 * calls it under the store's mutex, the commit (store_commit.c) on the
 * loop thread with batches no record call can reach.
 */
#ifndef ALLOT_COORDINATOR_STORE_BATCH_H
#define ALLOT_COORDINATOR_STORE_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "hash.h"
#include "rows.h"
#include "store_tab.h"

/* An interned (service, quota) pair; both strings NUL-terminated. */
struct key {
	uint64_t h;
	const char *service;
	const char *quota;
	uint32_t slen;
	uint32_t qlen;
};

struct usage_ent {
	allot__tab_hdr hdr;
	int64_t sec;
	const struct key *k;
	uint64_t admitted;
	uint64_t denied;
	uint64_t shadow_denied; /* of admitted: would-denies in shadow */
	uint64_t candidate_denied; /* would-denies under the candidate */
	double candidate_rate; /* the newest candidate; 0: none */
	double demand;
	uint32_t live_replicas;
};

struct share_ent {
	allot__tab_hdr hdr;
	uint64_t session;
	const struct key *k;
	double rate;
	double burst;
	int64_t lease_until;
	int64_t at;
	bool write; /* decided by the commit: changed or due a refresh */
};

struct seen_ent {
	allot__tab_hdr hdr;
	uint64_t session;
	int64_t at;
};

struct level_ent {
	allot__tab_hdr hdr;
	const struct key *k;
	double level;
	int64_t at;
};

enum op_kind { OP_JOIN, OP_LEFT, OP_CONFIG, OP_EVENT, OP_CHANGE, OP_QUOTA };

#define OP_STRINGS 6

/* One appended record. JOIN: s = replica_id, service, host, version;
 * u = config digest. LEFT: s[0] = why. CONFIG: u = epoch, u2 = digest,
 * s = path, content. EVENT: s = kind, subject, detail. CHANGE (a config
 * change, config_changes): u = epoch, u2 = digest, s = who, claimed_as,
 * reason, source. QUOTA (one of its quotas, quota_changes, written after
 * its CHANGE, which it refers to): s = service, quota, before, after,
 * fields, owner; pid = the action (allot__change_kind). */
struct op {
	struct op *next;
	enum op_kind kind;
	uint32_t pid;
	int64_t at;
	uint64_t session;
	uint64_t u;
	uint64_t u2;
	const char *s[OP_STRINGS];
};

struct batch {
	allot__arena arena; /* ops and their strings */
	struct op *ops;
	struct op **tail;
	size_t nops;
	allot__tab usage; /* struct usage_ent */
	size_t usage_live;
	uint32_t drop_head; /* usage entries before this are all holes */
	allot__tab shares; /* struct share_ent */
	allot__tab seen; /* struct seen_ent */
	allot__tab levels; /* struct level_ent */
	/* Agents' Usage records (rows.h), in the order they came; their
	 * strings are interned keys' (allot__store_keys). */
	allot__row_count *counts;
	size_t ncounts;
	size_t ccounts;
	bool counts_trimmed; /* trim dropped some: the marks go back */
};

void allot__batch_init(struct batch *b);
/* Rows a commit of `b` would write (before unchanged shares are
 * skipped). */
size_t allot__batch_rows(const struct batch *b);
void allot__batch_clear(struct batch *b);
void allot__batch_free(struct batch *b);

/* The entry for the arguments, created (zeroed; seen and level with
 * at = INT64_MIN) if absent; NULL when out of memory. Pointers are valid
 * until the next call on the same batch. */
struct usage_ent *allot__batch_usage(
    struct batch *b, int64_t sec, const struct key *k);
struct share_ent *allot__batch_share(
    struct batch *b, uint64_t session, const struct key *k);
struct seen_ent *allot__batch_seen(struct batch *b, uint64_t session);
struct level_ent *allot__batch_level(struct batch *b, const struct key *k);

/* A zeroed op of `kind` at `at` from the batch's arena, not yet queued;
 * NULL when out of memory. */
struct op *allot__batch_op_new(struct batch *b, enum op_kind kind, int64_t at);
/* Copy the non-NULL strings into o->s[] and append `o`; false (op not
 * queued) when out of memory. */
bool allot__batch_op_push(struct batch *b, struct op *o, const char *s0,
    const char *s1, const char *s2, const char *s3);
/* The same for `n` (<= OP_STRINGS) strings. */
bool allot__batch_op_push_v(
    struct batch *b, struct op *o, const char *const *in, size_t n);

/* Append a Usage record's count (its strings interned keys'). False
 * when out of memory. */
bool allot__batch_count(struct batch *b, const allot__row_count *row);

/* Drop the oldest usage rows until the batch holds at most `bound` rows,
 * then the oldest Usage counts (setting counts_trimmed: their agents
 * send them again once the marks go back); other rows are never
 * dropped. Returns how many were dropped. */
uint64_t allot__batch_trim(struct batch *b, size_t bound);

/* Move everything of `src` (newer) into `dst` (older) and empty `src`.
 * Usage adds up, shares and levels keep the newer value, syncs the later
 * time; ops are appended. Returns rows lost to out-of-memory. */
uint64_t allot__batch_merge(struct batch *dst, struct batch *src);

/* The hash of a share (session, key): batches and the commit's record
 * of written shares index them by it. */
static inline uint64_t
allot__share_hash(uint64_t session, const struct key *k)
{
	return allot__mix64(k->h ^ (session * 0xbf58476d1ce4e5b9ull));
}

/* The interned (service, quota) pairs. */
typedef struct allot__store_keys {
	allot__tab tab; /* entries hold a struct key pointer */
	allot__arena arena; /* the keys and their strings */
	uint64_t seed;
} allot__store_keys;

void allot__store_keys_init(allot__store_keys *ks);
void allot__store_keys_free(allot__store_keys *ks);
/* The hash of a pair, for allot__store_keys_intern(): computed before
 * taking the store's lock (the seed never changes after init). */
uint64_t allot__store_keys_hash(const allot__store_keys *ks,
    const char *service, size_t slen, const char *quota, size_t qlen);
/* The interned pair of hash `h`; NULL when out of memory or past the
 * bound on distinct pairs (1 << 20). */
const struct key *allot__store_keys_intern(allot__store_keys *ks, uint64_t h,
    const char *service, size_t slen, const char *quota, size_t qlen);

#endif
