/* SPDX-License-Identifier: MIT */
/*
 * Certificate rotation for the agent's coordinator connections
 * (allot_agent_reload_tls(), docs/integrating.md "TLS"): the pieces that
 * need no session state. Reading and checking the new files into a TLS
 * configuration; the handover of a reload asked on any thread to the
 * sync thread, which alone owns the sessions' signers and dialers
 * (sync.c); the swap of a member's dialer for the one made with the new
 * files, once its connection is gone; and the look at the files' inode,
 * size and times that the automatic mode (tls_reload_check_ms) runs.
 */
#ifndef ALLOT_AGENT_TLS_RELOAD_H
#define ALLOT_AGENT_TLS_RELOAD_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>

#include <allot/allot.h>

#include "dial.h"
#include "log.h"

/* Read `o`'s CA and certificate files into a new client configuration
 * (the caller's reference). ALLOT_OK; ALLOT_EIO when a file cannot be
 * read, ALLOT_ECONFIG when nng or mbedTLS will not take its contents,
 * with a reason in `err`. */
int allot__tls_load(const allot_agent_options *o, nng_tls_config **ret,
    char *err, size_t errlen);

/* One member's dialers: the one in use, and the one a reload made, not
 * yet started (id 0: none). Loop thread only. */
typedef struct allot__tlsdial {
	nng_dialer cur;
	nng_dialer next;
} allot__tlsdial;

/* Take `d` (not started) as the next dialer, dropping any earlier one
 * not started yet. */
void allot__tlsdial_set_next(allot__tlsdial *td, nng_dialer d);

/* When a next dialer waits and `l` shows no connection: close the dialer
 * in use and start the next. Returns true when it swapped; a next dialer
 * that would not start stays next, to be started at the next call. */
bool allot__tlsdial_swap(allot__tlsdial *td, allot__link *l);

/* Close the next dialer, if any (the socket closes the one in use). */
void allot__tlsdial_fini(allot__tlsdial *td);

/* A reload asked on another thread and answered by the sync thread. */
typedef struct allot__tlsreq {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int state; /* idle, asked, answered */
	int result;
	_Atomic bool asked; /* read by the loop without the lock */
} allot__tlsreq;

void allot__tlsreq_init(allot__tlsreq *r);
void allot__tlsreq_fini(allot__tlsreq *r);

/* Ask, wake the loop with `wake(ctx)`, and wait for the answer; one
 * caller at a time. Returns the loop's result. */
int allot__tlsreq_ask(allot__tlsreq *r, void (*wake)(void *), void *ctx);

/* Loop thread: whether a reload is asked. Then answer it with `result`
 * by allot__tlsreq_answer(). */
bool allot__tlsreq_pending(allot__tlsreq *r);
void allot__tlsreq_answer(allot__tlsreq *r, int result);

/* What the automatic check compares: both files' identity, size and
 * modification and change times. */
typedef struct allot__tlsfiles {
	uint64_t h;
} allot__tlsfiles;

/* A digest of the files' metadata now (a missing file counts as such). */
allot__tlsfiles allot__tls_files_look(const allot_agent_options *o);

#endif
