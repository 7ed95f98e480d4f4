/* SPDX-License-Identifier: MIT */
/*
 * The audit store's row types: what one second of usage, an event, a
 * replica's join, leave and last-seen time, a share, a level and a
 * second's shadow columns are when they are handed to the store to be
 * written. The store's batch produces them (store_batch.c), its commit
 * writes them (store_commit.c), and the Raft cluster carries them in its
 * log entries (consensus/consensus_entry.h encodes these types), so
 * that every member writes the leader's rows with the same statements.
 * The store knows nothing of the log; the log knows the store's rows.
 */
#ifndef ALLOT_COORDINATOR_STORE_ROWS_H
#define ALLOT_COORDINATOR_STORE_ROWS_H

#include <stddef.h>
#include <stdint.h>

/* One second of one key's usage, as the leader aggregated it. */
typedef struct allot__row_usage {
	const char *service;
	const char *key;
	uint64_t second; /* unix seconds */
	uint64_t consumed; /* tokens admitted */
	uint64_t denied;
	double demand; /* tokens asked for, summed over the second */
	uint32_t live_replicas;
} allot__row_usage;

/* One count of an agent's Usage record (docs/operations.md, "The
 * accounting guarantee"): what one agent account (incarnation) decided
 * for one quota in the second(s) of its record `id`. The rows of one
 * record are consecutive wherever they travel. A row with id 0 is a
 * link instead: the session's agent keeps that account (replicas). A
 * row with quota NULL ("" in the log) only marks its record booked. */
typedef struct allot__row_count {
	uint64_t session; /* the session that sent it */
	uint64_t incarnation;
	uint64_t first; /* the lowest id the record covers (folded) */
	uint64_t id;
	int64_t second; /* unix seconds */
	uint64_t admitted; /* tokens */
	uint64_t denied;
	uint64_t shadow_denied; /* of admitted */
	const char *service;
	const char *quota;
} allot__row_count;

/* One audit event, as the leader recorded it (the events table). */
typedef struct allot__row_event {
	int64_t at; /* ms since the Unix epoch */
	const char *kind;
	const char *subject; /* "" when none */
	const char *detail; /* "" when none */
} allot__row_event;

/* The audit rows: a replica's session began (replicas), ended, was last
 * heard from; a session's share of a quota (shares, and through its
 * trigger share_history); a quota's global bucket level (levels). Times
 * are ms since the Unix epoch; strings "" when none. */
typedef struct allot__row_join {
	uint64_t session;
	int64_t at;
	uint64_t digest; /* the agent's config digest */
	uint32_t pid;
	const char *replica_id;
	const char *service;
	const char *host;
	const char *version;
} allot__row_join;

typedef struct allot__row_left {
	uint64_t session;
	int64_t at;
	const char *why; /* leave, expired, replaced, shutdown */
} allot__row_left;

typedef struct allot__row_seen {
	uint64_t session;
	int64_t at;
} allot__row_seen;

typedef struct allot__row_share {
	uint64_t session;
	double rate;
	double burst;
	int64_t lease_until;
	int64_t at;
	const char *service;
	const char *quota;
} allot__row_share;

typedef struct allot__row_level {
	double level;
	int64_t at;
	const char *service;
	const char *quota;
} allot__row_level;

/* A second of a quota's usage as shadow mode and a candidate value saw
 * it (the usage table's shadow columns, added to the USAGE row of the
 * same second); only seconds with any are sent. */
typedef struct allot__row_shadow {
	uint64_t second; /* unix seconds */
	uint64_t shadow_denied;
	uint64_t candidate_denied;
	double candidate_rate; /* 0: none in that second */
	const char *service;
	const char *quota;
} allot__row_shadow;

/* One flush's rows; they are applied in this order (joins, shares,
 * leaves, which delete their session's shares, then last-seen times,
 * levels and shadow columns), as the leader's own commit would write
 * them. */
typedef struct allot__row_audit {
	const allot__row_join *joins;
	size_t njoins;
	const allot__row_share *shares;
	size_t nshares;
	const allot__row_left *lefts;
	size_t nlefts;
	const allot__row_seen *seen;
	size_t nseen;
	const allot__row_level *levels;
	size_t nlevels;
	const allot__row_shadow *shadow;
	size_t nshadow;
} allot__row_audit;

#endif
