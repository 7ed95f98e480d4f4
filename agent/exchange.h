/* SPDX-License-Identifier: MIT */
/*
 * One request/reply exchange at a time with one peer over an nng REQ
 * socket: the agent's sessions with their coordinators (agent/sync.c)
 * and a cluster member's probes of its peers
 * (coordinator/consensus/cluster.c). It owns the socket, its context and aio,
 * the send-then-receive state machine run on nng's threads, the timeout,
 * cancellation, and the handover of the outcome to the owner's loop thread.
 *
 * Threads: nng completes an exchange on its own threads, which only
 * record the outcome (then call `wake`, if given); everything else,
 * sending and collecting the outcome included, is the owner's one loop
 * thread. A request is never resent by nng: a lost exchange is the
 * owner's to retry, at its own pace.
 */
#ifndef ALLOT_COMMON_EXCHANGE_H
#define ALLOT_COMMON_EXCHANGE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>

#include "dial.h"

typedef struct allot__exchange_opts {
	uint32_t reconnect_min_ms; /* nng's redial backoff */
	uint32_t reconnect_max_ms;
	size_t recv_max; /* largest reply; 0: nng's default */
	bool watch_link; /* count connections (allot__exchange_lost) */
	/* Called on an nng thread once an outcome is in; NULL: the owner
	 * polls allot__exchange_finish(). */
	void (*wake)(void *ctx);
	void *wake_ctx;
} allot__exchange_opts;

typedef struct allot__exchange {
	nng_socket sock; /* dial it with allot__dial() */
	bool sock_open;
	bool ctx_open; /* a context of another exchange's socket */
	nng_ctx ctx;
	nng_aio *aio;
	_Atomic int phase; /* idle, sending, receiving */
	_Atomic bool done; /* an outcome is in */
	int result; /* written by the nng thread before `done` */
	nng_msg *reply;
	allot__link link;
	void (*wake)(void *ctx);
	void *wake_ctx;
} allot__exchange;

/* Open `x` (zeroed) as a REQ socket with its context and aio. Returns 0
 * or an nng error; close `x` either way. */
int allot__exchange_open(allot__exchange *x, const allot__exchange_opts *o);

/* Open `x` (zeroed) as a second context of `base`'s socket: its own
 * exchanges run beside base's, to the same peer, over the same
 * connection. Close it before `base`. Returns 0 or an nng error; close
 * `x` either way. */
int allot__exchange_open_beside(allot__exchange *x,
    const allot__exchange *base, void (*wake)(void *ctx), void *wake_ctx);

/* Stop any exchange in flight and free everything. */
void allot__exchange_close(allot__exchange *x);

/* Send `m` (ownership passes) and receive the reply, within
 * `timeout_ms` for the two. Only when no exchange is in flight. */
void allot__exchange_send_msg(
    allot__exchange *x, nng_msg *m, uint32_t timeout_ms);

/* The same with a copy of `len` bytes at `buf`: 0, or NNG_ENOMEM and
 * nothing in flight. */
int allot__exchange_send(
    allot__exchange *x, const void *buf, size_t len, uint32_t timeout_ms);

/* Complete at once with nng error `err`, sending nothing: for a peer
 * known to be unreachable, or a request that could not be built. Only
 * when no exchange is in flight. */
void allot__exchange_fail(allot__exchange *x, int err);

/* Whether an exchange is in flight or its outcome not yet collected. */
static inline bool
allot__exchange_busy(allot__exchange *x)
{
	return atomic_load(&x->phase) != 0;
}

/* With opts.watch_link: the peer was connected and is no longer (a
 * killed process): an exchange in flight will not be answered. */
static inline bool
allot__exchange_lost(allot__exchange *x)
{
	return allot__link_lost(&x->link);
}

/* Cut short the exchange in flight: it completes with NNG_ECANCELED. */
void allot__exchange_cancel(allot__exchange *x);

/* Collect the outcome of the exchange, if it is in: false when none is.
 * Then `*ret_result` is 0 or an nng error, and on 0 `*ret_reply` is the
 * reply, the caller's to free with nng_msg_free(). */
bool allot__exchange_finish(
    allot__exchange *x, int *ret_result, nng_msg **ret_reply);

/* Stop the exchange in flight, waiting for nng to let go of it, and drop
 * its reply: the socket is free for allot__exchange_call(). */
void allot__exchange_stop(allot__exchange *x);

/* A whole exchange, blocking, on an aio of its own, with the reply
 * dropped: for a last message on the way out. 0 or an nng error. */
int allot__exchange_call(
    allot__exchange *x, const void *buf, size_t len, uint32_t timeout_ms);

#endif
