/* SPDX-License-Identifier: MIT */
/*
 * The entries allotd's members replicate through the Raft log
 * (coordinator/consensus/consensus.h), and their byte format.
 *
 * An entry is a small, versioned binary record: byte 0 is the format
 * version (ALLOT__CENTRY_VERSION), byte 1 the type, then the type's fields
 * in a fixed order, integers little-endian and fixed-width, doubles as
 * their IEEE-754 bits, strings as a length (u16, or u32 for the config
 * text) followed by the bytes, then zero bytes up to a multiple of 8:
 * libraft 0.15's raft_uv sends an entry's bytes as they are but reads
 * them back as if padded to 8 (uvDecodeEntriesBatch), so an entry of
 * any other length corrupts the entries after it on the followers. Why not
 * protobuf like schema/allot.proto: these bytes never leave the cluster and
 * are read only by allotd members of one version, so unknown-field skipping
 * buys nothing, while a fixed layout gives a decoder that is one short
 * function per type, no allocation per field on the apply path, and the same
 * bytes on every member for the same entry (the tests compare states byte for
 * byte). A member that meets a version it does not know stops applying rather
 * than diverge (allot__cfsm's apply returns an error to libraft).
 *
 * Types:
 * - EPOCH: a leader's claim: its term, id, address and lease duration.
 *   The term of the last committed EPOCH is the epoch agents see.
 * - CONFIG: a quota file's text, its digest and its config epoch (the
 *   number it must become: the state's config epoch + 1, so two racing
 *   pushes cannot both win), and who proposed it and why (the audit row
 *   every member writes: the admin socket's verified user, or "signal",
 *   "start"; what the client claimed; the reason; the client's file).
 * - USAGE: a batch of per-second usage rows.
 * - MEMBER: an audit event for a membership change, or (LEAVING) the
 *   intent that a member leave: every leader from then on drives the
 *   configuration until it no longer holds that member
 *   (consensus_node.c), so removing the leader takes one request.
 * - EVENTS: a batch of the leader's audit events (joins, leaves,
 *   expiries, refusals...), as its store would have written them.
 * - AUDIT: the leader's replica, share and level rows of one flush (the
 *   replicas, shares and levels tables; consensus_rows.c), as its store
 *   would have written them.
 * - ACCOUNT: agents' Usage records (rows.h, allot__row_count) as the
 *   leader received them, whole records only: every member's state
 *   machine keeps those new to its marks (consensus_fsm.h), so a record
 *   that two leaders proposed is booked once (docs/operations.md, "The
 *   accounting guarantee").
 */
#ifndef ALLOT_COORDINATOR_CONSENSUS_ENTRY_H
#define ALLOT_COORDINATOR_CONSENSUS_ENTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/rows.h"

#define ALLOT__CENTRY_VERSION 1
#define ALLOT__CENTRY_STR_MAX 0xffffu /* service, key, address */
#define ALLOT__CENTRY_TEXT_MAX (16u << 20) /* a config's text */
#define ALLOT__CENTRY_ROWS_MAX (1u << 20) /* rows in one USAGE batch */

enum allot__centry_type {
	ALLOT__CENTRY_EPOCH = 1,
	ALLOT__CENTRY_CONFIG = 2,
	ALLOT__CENTRY_USAGE = 3,
	ALLOT__CENTRY_MEMBER = 4,
	ALLOT__CENTRY_EVENTS = 5,
	ALLOT__CENTRY_AUDIT = 6,
	ALLOT__CENTRY_ACCOUNT = 7,
};

enum allot__cmember_event {
	ALLOT__CMEMBER_ADDED = 1, /* joined as a non-voter */
	ALLOT__CMEMBER_PROMOTED = 2, /* caught up, now votes */
	ALLOT__CMEMBER_REMOVED = 3,
	ALLOT__CMEMBER_LEAVING = 4, /* to be removed, by whoever leads */
};

/* Cut the first at most `max` rows of `rest` (max > 0), in the order
 * they are applied, into `ret_part` and advance `rest` past them; false
 * when `rest` has none left. Applying the parts one after the other
 * writes what `rest` as one entry would. */
bool allot__caudit_cut(
    allot__row_audit *rest, size_t max, allot__row_audit *ret_part);

/* Who proposed a CONFIG and why; each "" when none (NULL encodes as
 * ""). */
typedef struct allot__cwho {
	const char *who;
	const char *claimed_as;
	const char *reason;
	const char *source;
} allot__cwho;

/* A decoded (or to-be-encoded) entry. Strings are NUL-terminated; in a
 * decoded entry they point into `mem`, which allot__centry_clear frees. */
typedef struct allot__centry {
	int type; /* enum allot__centry_type */
	union {
		struct {
			uint64_t term;
			uint64_t leader_id;
			uint32_t lease_ms;
			const char *address;
		} epoch;
		struct {
			uint64_t config_epoch;
			uint64_t digest;
			const char *text; /* text_len bytes (+ a NUL) */
			size_t text_len;
			allot__cwho who;
		} config;
		struct {
			const allot__row_usage *rows;
			size_t n;
		} usage;
		struct {
			int event; /* enum allot__cmember_event */
			uint64_t id;
			const char *address;
		} member;
		struct {
			const allot__row_event *rows;
			size_t n;
		} events;
		allot__row_audit audit;
		struct {
			/* Decoded: the state machine keeps the new rows
			 * in place (n shrinks). */
			allot__row_count *rows;
			size_t n;
		} account;
	};
	void *mem;
} allot__centry;

/* Encodes `e` into a buffer allocated with raft_malloc (so it can be
 * handed to raft_apply, which then owns it).
 * @return ALLOT_OK, ALLOT_EINVAL (unknown type, a string or batch over its
 *         limit) or ALLOT_ENOMEM. */
int allot__centry_encode(
    const allot__centry *e, void **ret_buf, size_t *ret_len);

/* Decodes `len` bytes. On ALLOT_OK `ret` owns its memory (clear it).
 * @return ALLOT_OK; ALLOT_EPROTO for a truncated, over-long or unknown
 *         entry (ret untouched); ALLOT_ERANGE for a version this build does
 *         not know; ALLOT_ENOMEM. */
int allot__centry_decode(const void *buf, size_t len, allot__centry *ret);

void allot__centry_clear(allot__centry *e);

/* Little-endian writer and reader shared with the state's snapshot
 * format (consensus_fsm.c). The writer grows a raft_malloc buffer and
 * remembers a failure instead of returning one per call; the reader
 * remembers running past the end. */
typedef struct allot__cwbuf {
	uint8_t *p;
	size_t len, cap;
	int err;
} allot__cwbuf;

void allot__cw_u8(allot__cwbuf *w, uint8_t v);
void allot__cw_u32(allot__cwbuf *w, uint32_t v);
void allot__cw_u64(allot__cwbuf *w, uint64_t v);
void allot__cw_f64(allot__cwbuf *w, double v);
void allot__cw_str(allot__cwbuf *w, const char *s, size_t len, int wide);
/* Zero bytes up to a multiple of 8 (see the top of this file). */
void allot__cw_pad(allot__cwbuf *w);

typedef struct allot__crbuf {
	const uint8_t *p;
	size_t len, off;
	int bad;
} allot__crbuf;

uint8_t allot__cr_u8(allot__crbuf *r);
uint32_t allot__cr_u32(allot__crbuf *r);
uint64_t allot__cr_u64(allot__crbuf *r);
double allot__cr_f64(allot__crbuf *r);
/* A string's bytes (not NUL-terminated) and length, or NULL when short. */
const char *allot__cr_str(allot__crbuf *r, size_t *ret_len, int wide);
/* True when everything was read but at most the zero padding. */
bool allot__cr_end(const allot__crbuf *r);

/* AUDIT's body (consensus_rows.c), for allot__centry_encode and
 * allot__centry_decode: written after the type byte; decoded into one
 * allocation (e->mem). */
void allot__centry_encode_audit(allot__cwbuf *w, const allot__row_audit *a);
int allot__centry_decode_audit(allot__crbuf *r, allot__centry *e);

#endif
