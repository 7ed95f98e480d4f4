/* SPDX-License-Identifier: MIT */
/*
 * Cluster membership as one member sees it (docs/operations.md,
 * Cluster). Every probe period (half the sync interval) the member sends
 * a Probe to every other member over its own nng REQ socket and answers
 * theirs (allot__cluster_on_probe, called by the server; what an inbound
 * Probe says is never taken: only the answers to its own). A peer that
 * misses ALLOT__CLUSTER_DOWN_AFTER probes in a row is down; its
 * connection dropping (a killed process) fails the probe in flight at
 * once. The view (who is live, and whether this member reaches a
 * majority) is handed to the registry (allot__state_view), which moves
 * key ownership; a member cut off from the majority keeps the static
 * ownership and grants no increase. Probes carry the quota config digest:
 * a peer whose digest differs is reported on /status, in /metrics and
 * as an event row.
 *
 * Threads: probes complete on nng threads, which only record the result;
 * the libuv loop thread (the probe timer) reads them, decides the view
 * and logs. Rendering and on_probe take the member table's mutex.
 */
#ifndef ALLOT_COORDINATOR_CLUSTER_H
#define ALLOT_COORDINATOR_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "allot.pb-c.h"
#include "log.h"
#include "metrics.h"
#include "rendezvous.h"
#include "state.h"
#include "store.h"

#define ALLOT__CLUSTER_DOWN_AFTER 2u

typedef struct allot__cluster allot__cluster;

typedef struct allot__cluster_opts {
	const allot__member *members; /* the static list, self included */
	size_t n;
	size_t self;
	uint32_t interval_ms; /* the sync interval T; probes every T/2 */
	allot__state *state;
	allot__store *store; /* event rows; may be NULL */
	const allot__logger *lg;
	/* Client side of tls+tcp:// peers: this member's certificate and
	 * key (one PEM) and the CA the peers' certificates chain to. */
	const char *tls_cert_key_file;
	const char *tls_ca_file;
} allot__cluster_opts;

/* Register the member list with the registry and start probing on
 * `loop` (its thread is the only caller of everything but on_probe and
 * the renderers). */
int allot__cluster_start(const allot__cluster_opts *o, uv_loop_t *loop,
    char *err, size_t errlen, allot__cluster **ret);

/* Stop probing, close the sockets; the timer is closed on `loop`, which
 * must run once more before it is closed. Accepts NULL. */
void allot__cluster_stop(allot__cluster *c);

/* Answer a peer's Probe (nng worker thread): `ret` gets ours, its
 * array allocated from `pa`, its strings the member table's. Records the
 * peer's config digest. */
void allot__cluster_on_probe(allot__cluster *c, const Allot__V1__Probe *in,
    ProtobufCAllocator *pa, Allot__V1__Probe *ret);

/* /metrics series and the /status "cluster" object. */
void allot__cluster_render_metrics(allot__cluster *c, allot__buf *b);
void allot__cluster_render_status(allot__cluster *c, allot__buf *b);

#endif
