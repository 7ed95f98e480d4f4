/* SPDX-License-Identifier: MIT */
/*
 * The agent's account: what it decided, per key and second of its own
 * clock, kept until the coordinator says it is durable
 * (docs/operations.md, "The accounting guarantee").
 *
 * The sync engine takes the quotas' counters into the account at each
 * exchange and, between them, at the last check (every eighth of an
 * interval: sync.c's check timer) before a second ends and the first
 * after it, so a decision lands in the second it was made in, or, made
 * in the last eighth of an interval of a second, in the next one. When the
 * second changes the open record closes: it gets the next id (1, 2, 3...
 * within the account's incarnation, a random number drawn once per agent) and
 * waits in the pending list. Every Sync carries the oldest pending records
 * (Sync.usage), again and again, until a Reply's `durable` covers them; a
 * Leave carries what is left. The coordinator books a record once per
 * (incarnation, id), so a record re-sent after a timeout, a failover or a
 * coordinator restart is counted once, and nothing the agent decided while the
 * coordinator was away is lost: records are only ever dropped by the
 * coordinator's word.
 *
 * Memory is bounded: at most ALLOT__ACCT_RECORDS records wait. When the
 * list is full, the oldest minute that holds several records is folded
 * into one (its second the minute's first, span 60, ids first..id),
 * counted and logged by the engine; a record is dropped (counted, never
 * silently) only when every minute waiting is one record already, some
 * 15 hours of an unreachable coordinator.
 *
 * Touched by the thread that drives the engine alone (sync.c's loop, or
 * the simulator); the counters for the stats are atomics.
 */
#ifndef ALLOT_AGENT_ACCOUNT_H
#define ALLOT_AGENT_ACCOUNT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What a quota's total `now` rose by since `*base`, `*base` moved up by
 * as much: a total that went down counts nothing until it is back above
 * (a refund lowers `spent`; a stacked level's denial moves from one
 * quota's total to another's in two stores a read may see one of). For
 * the account below and for the reports of the sync engine alike. */
static inline uint64_t
allot__acct_rise(uint64_t now, uint64_t *base)
{
	int64_t d = (int64_t) (now - *base);
	uint64_t r = d > 0 ? (uint64_t) d : 0;
	*base += r;
	return r;
}

/* Records that may wait for the coordinator's word; past it, folding. */
#define ALLOT__ACCT_RECORDS 900u
/* Records per Sync, and per Leave. */
#define ALLOT__ACCT_SEND 64u
#define ALLOT__ACCT_LEAVE 256u

typedef struct allot__acct_count {
	uint32_t key; /* the quota's index (its wire key id) */
	uint64_t admitted;
	uint64_t denied;
	uint64_t shadow; /* of admitted */
} allot__acct_count;

typedef struct allot__acct_rec {
	uint64_t first; /* the lowest id folded into it (id when none) */
	uint64_t id;
	int64_t second; /* Unix seconds, the agent's clock */
	uint32_t span; /* 1, or 60 when folded */
	uint32_t n;
	allot__acct_count *c; /* n counts, by key */
} allot__acct_rec;

/* A quota's counters as the account last took them. */
typedef struct allot__acct_base {
	uint64_t spent;
	uint64_t denied;
	uint64_t shadow;
} allot__acct_base;

typedef struct allot__account {
	uint64_t incarnation; /* never 0 */
	uint64_t next_id;
	_Atomic uint64_t durable; /* the highest id confirmed durable */
	uint32_t cap; /* quotas the arrays below hold */
	allot__acct_base *base;
	allot__acct_count *open; /* per quota: the open second's counts */
	int64_t open_second; /* INT64_MIN: none open */
	bool open_used;
	allot__acct_rec *ring; /* ALLOT__ACCT_RECORDS */
	size_t head;
	size_t n;
	/* For the stats and the engine's log lines (any thread). */
	_Atomic uint64_t folded; /* records folded into others */
	_Atomic uint64_t dropped; /* records dropped: list full */
	_Atomic uint64_t dropped_tokens;
	_Atomic uint64_t pending_pub; /* n, and the open second if it
	                                 holds counts, published */
} allot__account;

/* An account for `cap` quotas whose incarnation derives from `seed`
 * (never 0). ALLOT_OK or ALLOT_ENOMEM. */
int allot__acct_init(allot__account *ac, uint32_t cap, uint64_t seed);
void allot__acct_fini(allot__account *ac);

/* The account's clock reads `second`: a different second than the open
 * one closes that one (it becomes the next record). False when the
 * record could not be allocated (the counts stay open, closed at the
 * next call). */
bool allot__acct_second(allot__account *ac, int64_t second);

/* What quota `q` did since the account last took it, its counters now
 * being `spent`, `denied` and `shadow` (cumulative), added to the open
 * second. A `spent` below the baseline (refunds, allot_settle) is booked
 * when consumption is back above it. */
void allot__acct_take(allot__account *ac, uint32_t q, uint64_t spent,
    uint64_t denied, uint64_t shadow);

/* Close the open second now (before a Leave). False on out of memory. */
bool allot__acct_close(allot__account *ac);

/* The coordinator confirmed every id up to `id`: drop them. */
void allot__acct_durable(allot__account *ac, uint64_t id);

/* The i-th waiting record, oldest first (i < ac->n). */
const allot__acct_rec *allot__acct_at(const allot__account *ac, size_t i);

/* The oldest `max` waiting records as Usage messages for a Sync or a
 * Leave: `*ret_list` (n entries) and everything it points to live in one
 * allocation, `*ret_mem`, which the caller frees once the message is
 * packed. ALLOT_OK (n may be 0; then *ret_list is NULL) or
 * ALLOT_ENOMEM. */
struct Allot__V1__Usage;
int allot__acct_wire(const allot__account *ac, size_t max,
    struct Allot__V1__Usage ***ret_list, size_t *ret_n, void **ret_mem);

#endif
