/* SPDX-License-Identifier: MIT */
/*
 * The coordinator's request handling without a transport: the bytes of
 * one request in, the bytes of its answer out. allot__dispatch() refuses
 * requests while draining or over their sender's message budget (those
 * come before decoding so that a flood costs no decoding), bounds the
 * size, decodes the Envelope, checks the version and the key and report
 * counts, checks a Register's sender budget and identity proof, hands the
 * message to the registry (allot__state_register_on, _sync_on, _leave_on)
 * (in a cluster, only past the fencing gate), and packs the answer, an Error
 * for every refusal, counted by reason in the metrics.
 *
 * allotd's server (server.c) calls it from nng's threads with what the
 * connection says about the sender; the simulator (sim/engine.c), the
 * wire fuzz target and the corpus generator call it in-process, so that
 * all of them run this one code.
 *
 * Ownership: the dispatcher keeps nothing between calls. Everything it
 * allocates, the decoded request and the packed answer included, comes
 * from the caller's protobuf-c allocator, which the caller releases (an
 * arena: resets) once it has sent the answer. The context's objects are
 * the caller's and are not freed here.
 *
 * Threads: no threads, no I/O, no clock of its own (the caller passes the
 * time). Calls may run concurrently, each with its own allocator and
 * result; the registry, metrics, peer table, verifier and cluster they
 * share are thread-safe.
 */
#ifndef ALLOT_COORDINATOR_DISPATCH_H
#define ALLOT_COORDINATOR_DISPATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "allot.pb-c.h"
#include "state/metrics.h"
#include "peerlimit.h"
#include "protocol.h"
#include "state/state.h"

struct allot__authn;
struct allot__cluster;

#define ALLOT__DISPATCH_MAX_MSG (1u << 20) /* bytes, answered TOO_LARGE */
#define ALLOT__DISPATCH_MAX_REPORTS 65536u /* per Sync */
#define ALLOT__DISPATCH_MAX_KEYS 65537u /* per Register */

/* What stays the same from one request to the next. */
typedef struct allot__dispatch_ctx {
	allot__state *state; /* required */
	/* Non-NULL: every Register must carry a valid identity proof for
	 * its service (authn.h). */
	struct allot__authn *authn;
	/* Per-peer Register and message budgets; NULL: none. */
	allot__peerlimit *peerlimit;
	/* The fencing gate of a cluster member (cluster.h); NULL: a single
	 * allotd, which always allocates (epoch 0, no members). */
	struct allot__cluster *cluster;
	allot__metrics *metrics; /* NULL: nothing counted here */
	size_t max_msg; /* larger requests: Error TOO_LARGE */
	uint32_t max_reports; /* per Sync */
	uint32_t max_keys; /* per Register */
} allot__dispatch_ctx;

/* The bounds above; every pointer NULL. */
void allot__dispatch_ctx_init(allot__dispatch_ctx *c);

/* One request and what the transport knows of it. */
typedef struct allot__dispatch_req {
	const void *buf; /* the Envelope's bytes */
	size_t len;
	/* The connection it came on (a session is bound to the one it
	 * registered on); 0: none, sessions are not bound. */
	uint32_t pipe;
	/* Who sent it, for the peer budgets and the replica budget per
	 * peer (state.h); NULL: the shared "local" peer for the former,
	 * nobody (no replica budget) for the latter. */
	const allot__peer *peer;
	uint64_t now; /* monotonic ns, for the peer budgets */
	bool draining; /* refuse with SHUTTING_DOWN */
	/* Everything is allocated from here, the answer included. */
	ProtobufCAllocator *pa;
} allot__dispatch_req;

/* What came of it. The pointers are into the request's allocator. */
typedef struct allot__dispatch_result {
	const uint8_t *answer; /* the packed answer Envelope */
	size_t answer_len;
	/* The decoded request, or NULL when it was refused before decoding
	 * or could not be decoded. */
	const Allot__V1__Envelope *request;
	/* UNSPECIFIED, or the code of the Error answered, the reason it was
	 * counted under and why, in plain words. */
	Allot__V1__Error__Code code;
	allot__reject reason; /* ALLOT__REJ_COUNT when not refused */
	char err[256];
} allot__dispatch_result;

/* Handle one request. ALLOT_OK with the answer in *ret, or ALLOT_ENOMEM
 * when the allocator could not hold the answer (*ret still says what was
 * decided; nothing is to be sent). `ret` is the caller's and need not be
 * initialised. */
int allot__dispatch(const allot__dispatch_ctx *c,
    const allot__dispatch_req *req, allot__dispatch_result *ret);

/* "Register", "Sync", ... for a body case; "nothing" when none. */
const char *allot__dispatch_body_name(Allot__V1__Envelope__BodyCase c);

#endif
