/* SPDX-License-Identifier: MIT */
/*
 * The protocol front end of allotd: one nng rep0 socket listening on every
 * configured address (tcp://, ipc://), served by a fixed pool of workers,
 * each an nng context with its own aio, so that many requests are decoded
 * and answered concurrently on nng's threads. The server is the
 * transport only: a worker takes what the connection says of the sender
 * (its pipe, its address or uid), hands the request to the dispatcher
 * (dispatch.h: decoding into a per-worker arena, limits, version,
 * identity, peer budgets, the registry, the answer) and sends what it
 * packed. Every rejection is answered with an Error, counted by reason
 * and logged here with a rate limit.
 */
#ifndef ALLOT_COORDINATOR_SERVER_H
#define ALLOT_COORDINATOR_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dispatch/dispatch.h"
#include "log.h"
#include "state/metrics.h"
#include "dispatch/peerlimit.h"
#include "state/state.h"

typedef struct allot__cluster allot__cluster;

/* The request bounds are the dispatcher's (dispatch.h). */
#define ALLOT__SERVER_MAX_MSG ALLOT__DISPATCH_MAX_MSG
#define ALLOT__SERVER_MAX_REPORTS ALLOT__DISPATCH_MAX_REPORTS
#define ALLOT__SERVER_MAX_KEYS ALLOT__DISPATCH_MAX_KEYS
#define ALLOT__SERVER_WORKERS 8u
#define ALLOT__SERVER_MAX_URLS 16u

typedef struct allot__server allot__server;

typedef struct allot__server_opts {
	const char *const *urls; /* nng URLs to listen on */
	size_t nurls;
	uint32_t workers; /* concurrent requests (nng contexts) */
	size_t max_msg; /* larger messages: Error TOO_LARGE */
	uint32_t max_reports;
	uint32_t max_keys;
	allot__state *state;
	allot__metrics *metrics;
	const allot__logger *lg;
	/* Per-peer Register and message budgets (peerlimit.h); NULL: none.
	 * Messages over them are answered RATE_LIMITED. */
	allot__peerlimit *peerlimit;
	/* tls+tcp:// listeners: allotd's certificate and key (one PEM) and
	 * the CA agents' certificates must chain to. Agents without a valid
	 * certificate cannot connect. */
	const char *tls_cert_key_file;
	const char *tls_key_file; /* NULL: in tls_cert_key_file */
	const char *tls_ca_file;
	allot__cluster *cluster; /* the fencing gate; NULL: one allotd */
	/* Non-NULL: every Register must carry a valid identity proof for
	 * its service (authn.h). Not owned. */
	struct allot__authn *authn;
} allot__server_opts;

void allot__server_opts_init(allot__server_opts *o);

/* Whether the connection with nng pipe id `pipe` (the one a session
 * registered on) is still open: allot__state_opts.conn_open. nng pipe
 * ids are process-wide, so `ctx` is unused and this works before the
 * server starts. */
bool allot__server_conn_open(void *ctx, uint32_t pipe);

/* Open the socket, listen on every URL and start the workers. On failure
 * nothing is left running and `err` names the URL and the nng error.
 * Messages above 2 * max_msg are dropped by nng itself (the connection is
 * closed); between max_msg and that they are answered TOO_LARGE. */
int allot__server_start(const allot__server_opts *opts, char *err,
    size_t errlen, allot__server **ret);

/* Stop accepting: close the listeners so no new connection arrives, and
 * answer requests that still arrive on open connections with
 * Error SHUTTING_DOWN. Requests being handled complete normally. */
void allot__server_drain(allot__server *srv);

/* True when no request is between its receipt and its reply being
 * handed to nng. */
bool allot__server_idle(allot__server *srv);

/* Stop the workers, close the socket and free. Accepts NULL. Must not be
 * called from an nng callback. False when nng did not close the socket
 * within two seconds (server.c says why): the workers are stopped but
 * the socket is left open, and the process must then end with _exit(),
 * not exit() (nng's exit handler would wait for it too), and keep the
 * peer limits it was given (nng may still call on them). */
bool allot__server_close(allot__server *srv);

#endif
