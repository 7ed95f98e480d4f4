/* SPDX-License-Identifier: MIT */
/*
 * The replicated state of allotd's cluster: the state machine libraft
 * applies committed entries to (struct raft_fsm), with its snapshot and
 * restore.
 *
 * What it holds: the current epoch (the term and leader of the last
 * committed EPOCH entry), the quota config in force (text, digest, config
 * epoch), usage totals per (service, key), each agent account's usage
 * mark (ACCOUNT entries are booked once), the members that are leaving
 * (a MEMBER LEAVING entry committed, no MEMBER REMOVED since), and the
 * index of the last entry it applied. Every member applies the same entries in
 * the same order, so every member's state is the same once it has applied the
 * same index; the snapshot is a canonical encoding (keys sorted), so two
 * equal states have byte-identical snapshots, which the tests compare.
 *
 * Replay is idempotent: an entry at an index at or below the last applied
 * one changes nothing and is not passed on. libraft gives apply no index;
 * it sets last_applied right after apply returns, so the entry's index is
 * raft_last_applied() + 1 while apply runs (allot__cfsm.raft must be set).
 *
 * Not thread-safe: libraft and allotd's loop call it on the loop thread.
 */
#ifndef ALLOT_COORDINATOR_CONSENSUS_FSM_H
#define ALLOT_COORDINATOR_CONSENSUS_FSM_H

#include <raft.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "consensus_entry.h"
#include "store/marks.h"

/* Members that may be leaving at once; a LEAVING entry past it is
 * refused (counted in `refused`), and the leader refuses to propose one. */
#define ALLOT__CFSM_LEAVING_MAX 8

/* Called for each entry applied, after the state took it, with the
 * entry's log index: the store writes it (USAGE rows, events, the config)
 * in one transaction with that index, and skips indexes it already has. */
typedef void (*allot__cfsm_apply_cb)(
    void *ctx, uint64_t index, const allot__centry *e);
struct allot__cfsm;
/* Called after a snapshot replaced the state (fsm_restore): the config
 * in it is the cluster's, to be installed as a committed CONFIG's is. */
typedef void (*allot__cfsm_restore_cb)(void *ctx, const struct allot__cfsm *s);

typedef struct allot__cusage_total {
	char *service;
	char *key;
	uint64_t consumed;
	uint64_t denied;
	double demand;
	uint64_t last_second; /* the latest second a row carried */
} allot__cusage_total;

typedef struct allot__cfsm {
	struct raft_fsm fsm; /* handed to raft_init; fsm.data is this */
	struct raft *raft; /* for the index of the entry being applied */
	uint64_t applied; /* index of the last entry applied */
	struct {
		uint64_t term; /* the epoch; 0 before the first EPOCH */
		uint64_t leader_id;
		uint32_t lease_ms;
		char *address;
	} epoch;
	struct {
		uint64_t epoch; /* 0 before the first CONFIG */
		uint64_t digest;
		char *text;
		size_t len;
		/* Who proposed it and why (its CONFIG's), each NULL when
		 * none: a member restored from a snapshot records the change
		 * with its author. */
		char *who[4]; /* who, claimed_as, reason, source */
	} config;
	uint64_t refused; /* CONFIG entries for a stale config epoch, and
	                   * EPOCH entries of a lower term */
	uint64_t members_changed; /* MEMBER entries applied */
	/* Ids with a committed LEAVING and no REMOVED after it, ascending
	 * (so the snapshot is canonical). */
	uint64_t leaving[ALLOT__CFSM_LEAVING_MAX];
	unsigned nleaving;
	/* Usage totals: open addressing on (service, key). */
	allot__cusage_total *slots;
	size_t nslots, nkeys;
	/* Per agent account, the highest Usage id booked (store/marks.h):
	 * an ACCOUNT entry keeps only the records above it, so a record two
	 * leaders proposed is booked once. In the snapshot. */
	allot__marks marks;
	uint64_t usage_overlaps; /* folded records partly booked before */
	allot__cfsm_apply_cb on_apply;
	allot__cfsm_restore_cb on_restore; /* may be NULL */
	void *ctx;
} allot__cfsm;

/* Sets up an empty state; `on_apply` may be NULL. ALLOT_OK or
 * ALLOT_ENOMEM. */
int allot__cfsm_init(allot__cfsm *s, allot__cfsm_apply_cb on_apply, void *ctx);
void allot__cfsm_finish(allot__cfsm *s);

/* Applies the encoded entry at `index` (what the raft_fsm apply does
 * with the index libraft is at). An index at or below s->applied is a
 * replay: nothing changes, ALLOT_OK.
 * @return ALLOT_OK; ALLOT_EPROTO (malformed) or ALLOT_ERANGE (unknown
 *         version) leave the state untouched; ALLOT_ENOMEM. */
int allot__cfsm_apply_at(
    allot__cfsm *s, uint64_t index, const void *buf, size_t len);

/* The state's canonical encoding, in a raft_malloc'd buffer the caller
 * owns. ALLOT_OK or ALLOT_ENOMEM. */
int allot__cfsm_encode(const allot__cfsm *s, void **ret_buf, size_t *ret_len);

/* Replaces the state with a decoded snapshot; on error the state is
 * unchanged. ALLOT_OK, ALLOT_EPROTO, ALLOT_ERANGE or ALLOT_ENOMEM. */
int allot__cfsm_decode(allot__cfsm *s, const void *buf, size_t len);

/* Whether member `id` is leaving (see `leaving`). */
bool allot__cfsm_leaving(const allot__cfsm *s, uint64_t id);

/* The totals of one key, or NULL. */
const allot__cusage_total *allot__cfsm_usage(
    const allot__cfsm *s, const char *service, const char *key);

#endif
