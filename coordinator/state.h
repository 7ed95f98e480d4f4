/* SPDX-License-Identifier: MIT */
/*
 * The coordinator's in-memory state: the quota config in force and its
 * epoch, the registry of services and their replica sessions, and per
 * service and quota the usage counters, the global bucket estimate and
 * the shares the allocator (alloc.h) handed out. One mutex guards it all;
 * it is held for array indexing and memory updates only (no I/O, no
 * logging), so the nng worker threads that call allot__state_register(),
 * _sync() and _leave() and the libuv loop thread that calls the periodic
 * functions never wait long on each other. Store rows (store.h) are
 * recorded from here too: recording only appends to the store's memory
 * batch.
 *
 * Protocol semantics (docs/protocol.md) live here: session ids, sequence
 * numbers, key interning, the bounds that make a report "absurd", and
 * which shares a Reply carries.
 */
#ifndef ALLOT_COORDINATOR_STATE_H
#define ALLOT_COORDINATOR_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "alloc.h"
#include "allot.pb-c.h"
#include "config.h"
#include "log.h"
#include "metrics.h"
#include "store.h"

typedef struct allot__state allot__state;

/* Defaults; allotd's options override them. */
#define ALLOT__STATE_LEASE_MS 3000u
#define ALLOT__STATE_INTERVAL_MS 100u
#define ALLOT__STATE_EXPIRY_INTERVALS 5u
#define ALLOT__STATE_MAX_REPLICAS 10000u
#define ALLOT__STATE_MAX_SERVICES 256u
#define ALLOT__STATE_FULL_EVERY 10u
#define ALLOT__STATE_ABSURD_FACTOR 4.0
/* Denials and demand may legitimately exceed the quota (a caller
 * flooding), so their bound is this many times wider than consumption's. */
#define ALLOT__STATE_FLOOD_FACTOR 1000.0
/* Longest string accepted in Register (replica id, service, host, key). */
#define ALLOT__STATE_NAME_MAX 255u
#define ALLOT__STATE_VERSION_MAX 64u
/* Agent sync intervals above this are treated as this for expiry. */
#define ALLOT__STATE_AGENT_INTERVAL_MAX 60000u

typedef struct allot__state_opts {
	uint32_t lease_ms;          /* validity of every allowance sent */
	uint32_t interval_ms;       /* expected agent sync interval */
	uint32_t expiry_intervals;  /* K: missed intervals before expiry */
	uint32_t max_replicas;      /* live sessions, all services */
	uint32_t max_services;
	uint32_t full_every;        /* a full Reply at least every N */
	double absurd_factor;       /* slack on the consumption bound */
	allot__alloc_policy policy;
	allot__store *store;        /* may be NULL (no durable rows) */
	const allot__logger *lg;
	allot__metrics *metrics;    /* may be NULL */
} allot__state_opts;

void allot__state_opts_init(allot__state_opts *o);

/* Create the state with `cfg` (ownership passes to the state on ALLOT_OK)
 * as epoch 1. `path` and `text` are what the config was parsed from; the
 * state records them as the first config row. */
int allot__state_create(const allot__state_opts *opts, allot_config *cfg,
    const char *path, const char *text, allot__state **ret);
void allot__state_destroy(allot__state *st);

/* Start-up, before any request: turn the replicas the store says were
 * live into placeholders ("restored") that count toward their service's
 * replica count until the same replica id re-registers (the placeholder
 * is then "replaced") or K intervals pass (it "expires"), and take back
 * the global bucket levels. Session ids continue after the largest the
 * store has seen. Loop thread. */
int allot__state_restore(allot__state *st);

/* ---- requests (nng worker threads) ----
 * Each returns ALLOT__V1__ERROR__CODE__UNSPECIFIED (0) on success with
 * `ret` filled (repeated fields allocated from `pa`, which the caller
 * resets after sending), or the Error code to answer with and a message
 * in `err`. Rejections are counted in the metrics here. */
Allot__V1__Error__Code allot__state_register(allot__state *st,
    const Allot__V1__Register *req, ProtobufCAllocator *pa,
    Allot__V1__Welcome *ret, char *err, size_t errlen);
Allot__V1__Error__Code allot__state_sync(allot__state *st,
    const Allot__V1__Sync *req, ProtobufCAllocator *pa,
    Allot__V1__Reply *ret, char *err, size_t errlen);
Allot__V1__Error__Code allot__state_leave(allot__state *st,
    const Allot__V1__Leave *req, Allot__V1__Reply *ret, char *err,
    size_t errlen);

/* ---- periodic work (loop thread) ---- */

/* Every interval: expire silent sessions and recompute the shares of
 * every service whose replica set or config changed. */
void allot__state_tick(allot__state *st);

/* Every second: usage rows per service and quota, last-seen rows, global
 * bucket levels, and the per-second rates shown by /metrics. */
void allot__state_second(allot__state *st);

/* Install a new config (ownership passes on ALLOT_OK): new epoch, config
 * row, keys re-mapped by identity, shares recomputed and a full Reply
 * queued for every session. A config with the digest in force is not a
 * change: ALLOT_OK is returned, `cfg` is freed and *ret_changed is false.
 */
int allot__state_reload(allot__state *st, allot_config *cfg,
    const char *path, const char *text, bool *ret_changed);

uint64_t allot__state_epoch(allot__state *st);
uint64_t allot__state_digest(allot__state *st);
size_t allot__state_replicas(allot__state *st);

/* Append the per-service and per-quota series (Prometheus text). */
void allot__state_render_metrics(allot__state *st, allot__buf *b);
/* Append the /status document (JSON). */
void allot__state_render_status(allot__state *st, allot__buf *b);

#endif
