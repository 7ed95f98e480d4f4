/* SPDX-License-Identifier: MIT */
/*
 * allotd's process-wide counters and histograms (the text buffer the
 * HTTP endpoints render into is common/buf.h). Counters are relaxed atomics so
 * the nng worker threads bump them without a lock; per-service and per-quota
 * figures live in the state (state.h) under its mutex and are rendered
 * from there. Label sets are fixed enums (rejection reasons) or come from
 * the quota config and the bounded service table, so the number of series
 * stays bounded whatever the peers send.
 */
#ifndef ALLOT_COORDINATOR_METRICS_H
#define ALLOT_COORDINATOR_METRICS_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"

/* ---- rejection reasons (label values of allotd_rejected_messages_total) */

typedef enum allot__reject {
	ALLOT__REJ_VERSION = 0,
	ALLOT__REJ_MALFORMED,
	ALLOT__REJ_UNKNOWN_SESSION,
	ALLOT__REJ_STALE_SEQ,
	ALLOT__REJ_UNKNOWN_KEY, /* counts key reports, not messages */
	ALLOT__REJ_ABSURD, /* counts key reports, not messages */
	ALLOT__REJ_TOO_LARGE,
	ALLOT__REJ_CAPACITY, /* replica or service table full */
	ALLOT__REJ_SHUTTING_DOWN,
	ALLOT__REJ_NOT_OWNER, /* key reports for another member's key */
	ALLOT__REJ_SESSION_PIPE, /* Sync/Leave on another connection */
	ALLOT__REJ_IDENTITY_MISSING, /* Register without a proof */
	ALLOT__REJ_IDENTITY_INVALID, /* proof does not verify */
	ALLOT__REJ_IDENTITY_MISMATCH, /* certified service != service */
	ALLOT__REJ_IDENTITY_REPLAY, /* proof seen before */
	ALLOT__REJ_PEER_REGISTER_RATE, /* a peer over its Register budget */
	ALLOT__REJ_PEER_MESSAGE_RATE, /* a peer over its message budget */
	ALLOT__REJ_PEER_REPLICAS, /* a peer over its replica budget */
	ALLOT__REJ_NOT_LEADER, /* cluster: a follower, or no lease */
	ALLOT__REJ_REPLICA_IN_USE, /* Register of a replica live elsewhere */
	ALLOT__REJ_COUNT
} allot__reject;

const char *allot__reject_name(allot__reject r);

/* ---- histograms (fixed buckets, seconds) ---- */

#define ALLOT__HIST_BUCKETS 16

typedef struct allot__hist {
	const double *bounds; /* ALLOT__HIST_BUCKETS upper bounds, seconds */
	_Atomic uint64_t bucket[ALLOT__HIST_BUCKETS + 1]; /* last: +Inf */
	_Atomic uint64_t count;
	_Atomic uint64_t sum_ns;
} allot__hist;

void allot__hist_observe_ns(allot__hist *h, uint64_t ns);

typedef struct allot__metrics {
	_Atomic uint64_t registers;
	_Atomic uint64_t syncs;
	_Atomic uint64_t early_syncs; /* Syncs flagged early (short) */
	_Atomic uint64_t early_rounds; /* allocation rounds they ran */
	_Atomic uint64_t loans; /* loans made to denying keys */
	_Atomic uint64_t loan_tokens; /* tokens those loans moved */
	_Atomic uint64_t asks; /* Asks answered (the tail path) */
	_Atomic uint64_t ask_tokens_granted; /* from central reserves */
	_Atomic uint64_t ask_tokens_refused; /* asked for, not granted */
	_Atomic uint64_t config_pushes; /* config texts sent to agents */
	_Atomic uint64_t leaves;
	_Atomic uint64_t key_reports; /* accepted key reports */
	_Atomic uint64_t register_unknown_keys;
	_Atomic uint64_t reports_clipped; /* implausible key reports */
	_Atomic uint64_t tokens_clipped; /* consumption not booked */
	_Atomic uint64_t denial_reports_refuted; /* denials none could have */
	_Atomic uint64_t denials_refuted; /* tokens of them, not booked */
	_Atomic uint64_t usage_booked; /* Usage records booked (usage.c) */
	_Atomic uint64_t usage_repeats; /* sent again, booked before */
	_Atomic uint64_t usage_refused; /* implausible counts dropped */
	_Atomic uint64_t usage_clamped; /* records from too far ahead */
	_Atomic uint64_t throttled_alive; /* refused Syncs kept alive */
	_Atomic uint64_t rejected[ALLOT__REJ_COUNT];
	_Atomic uint64_t joins;
	_Atomic uint64_t expiries;
	_Atomic uint64_t replaced;
	_Atomic uint64_t reloads_ok;
	_Atomic uint64_t reloads_failed;
	_Atomic uint64_t bytes_in;
	_Atomic uint64_t bytes_out;
	allot__hist sync_latency; /* decode to reply, per request */
	allot__hist store_commit; /* allot__store_flush duration */
	/* Written by the loop thread from the store's statistics. */
	_Atomic uint64_t store_commit_failures;
	_Atomic uint64_t store_pending;
	_Atomic uint64_t store_rows_dropped;
	_Atomic uint64_t store_rows_written;
	/* Written by the loop thread from the flood-control table. */
	_Atomic uint64_t peers_tracked;
	_Atomic uint64_t peer_overflow;
	_Atomic uint64_t peer_connections; /* with their own budget */
	_Atomic uint64_t peer_bind_refused;
	/* The HTTP listener (http.c): connections accepted, and refused
	 * at a cap (all clients, or one address). */
	_Atomic uint64_t http_connections;
	_Atomic uint64_t http_refused;
	uint64_t start_wall_ms;
} allot__metrics;

void allot__metrics_init(allot__metrics *m);

static inline void
allot__metrics_reject(allot__metrics *m, allot__reject r, uint64_t n)
{
	if (m != NULL && r < ALLOT__REJ_COUNT)
		atomic_fetch_add_explicit(
		    &m->rejected[r], n, memory_order_relaxed);
}

static inline void
allot__metrics_add(_Atomic uint64_t *c, uint64_t n)
{
	atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

/* Render the process-wide series (everything but the per-service and
 * per-quota ones, which render.c renders) in Prometheus text format. */
void allot__metrics_render(const allot__metrics *m, allot__buf *b);

#endif
