/* SPDX-License-Identifier: MIT */
/*
 * A member's store backlog: committed log entries its SQLite file could
 * not take yet (an auditor's write lock, a full disk), kept in log order,
 * encoded (consensus_entry.h), until the store takes them. The cluster
 * (cluster.c) writes an applied entry through at once only while the
 * backlog is empty, retries the oldest on every tick, and says how far
 * behind the file is (/status, allotd_cluster_store_backlog_entries);
 * the store's applied index (schema/005_raft.sql) advances only in the
 * transaction that writes an entry, so a member restarted with a
 * backlog replays it from its log.
 *
 * Bounded by bytes: an entry past the bound is not kept (counted in
 * `lost`: this member's file then lacks it, which /status says). Loop
 * thread only.
 */
#ifndef ALLOT_COORDINATOR_CONSENSUS_BACKLOG_H
#define ALLOT_COORDINATOR_CONSENSUS_BACKLOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "consensus_entry.h"

#define ALLOT__BACKLOG_BYTES (256u << 20)

typedef struct allot__backlog_ent {
	struct allot__backlog_ent *next;
	uint64_t index;
	size_t len;
	void *buf; /* raft_malloc'd encoding */
} allot__backlog_ent;

typedef struct allot__backlog {
	allot__backlog_ent *head;
	allot__backlog_ent **tail;
	size_t n;
	size_t bytes;
	uint64_t lost; /* entries not kept: over the bound, or no memory */
} allot__backlog;

void allot__backlog_init(allot__backlog *b);
void allot__backlog_fini(allot__backlog *b);

/* Keep a copy of entry `e` at `index` behind the others. False when it
 * could not be kept (counted in `lost`). */
bool allot__backlog_push(
    allot__backlog *b, uint64_t index, const allot__centry *e);

/* The oldest entry, decoded into `ret` (clear it after use), and its
 * index; false when the backlog is empty. An entry that no longer
 * decodes is dropped and counted lost. */
bool allot__backlog_peek(
    allot__backlog *b, uint64_t *ret_index, allot__centry *ret);

/* Drop the oldest entry (the store took it). */
void allot__backlog_pop(allot__backlog *b);

#endif
