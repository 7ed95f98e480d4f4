/* SPDX-License-Identifier: MIT */
/*
 * Dialling a coordinator: the agent's sessions and a cluster member's
 * probes of its peers connect the same way, plain or over mutual TLS.
 */
#ifndef ALLOT_COMMON_DIAL_H
#define ALLOT_COMMON_DIAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>

#include "protocol.h"

/* Dial `url` on `sock` in the background (nng reconnects by itself). A
 * tls+tcp:// URL gets a client TLS configuration that verifies the peer
 * against `ca_file`, presents `cert_key_file` (certificate and key in
 * one PEM; NULL: none) and, when `server_name` is not NULL, checks the
 * peer's certificate names it. Returns 0 or an nng error: NNG_EINVAL for
 * tls+tcp:// without a CA. */
int allot__dial(nng_socket sock, const char *url, const char *ca_file,
    const char *cert_key_file, const char *server_name);

/* The same, keeping the dialer in `*ret` (NULL: not kept), for an owner
 * that replaces it later (a certificate rotation, agent/tls_reload.c). */
int allot__dial_keep(nng_socket sock, const char *url, const char *ca_file,
    const char *cert_key_file, const char *server_name, nng_dialer *ret);

/* The client TLS configuration allot__dial() gives a tls+tcp:// dialer,
 * in `*ret` (the caller's reference: nng_tls_config_free()). nng makes a
 * configuration read-only once a dialer uses it, so new certificates
 * take a new configuration and a new dialer. 0 or an nng error. */
int allot__tls_client_config(const char *ca_file, const char *cert_key_file,
    const char *server_name, nng_tls_config **ret);

/* A dialer for `url` on `sock` with TLS configuration `cfg` (NULL: none;
 * the dialer takes its own reference), started in the background when
 * `start`, else left for nng_dialer_start(). 0 or an nng error. */
int allot__dialer_new(nng_socket sock, const char *url, nng_tls_config *cfg,
    bool start, nng_dialer *ret);

/* Whether a socket's peer is there: its connections (nng pipes), counted
 * by a pipe callback (on nng's threads; it does nothing else, since nng
 * supports no aio operation from there). A peer that was connected and
 * has no connection left is gone (a killed process): a request in
 * flight to it will not be answered, and the next can fail at once. */
typedef struct allot__link {
	_Atomic int pipes;
	_Atomic bool was_connected;
	/* Called after each count change (on nng's thread; it must only
	 * wake its owner). Set before the socket dials; NULL: none. */
	void (*on_change)(void *ctx);
	void *on_change_ctx;
} allot__link;

/* Start counting `sock`'s connections into `l` (zeroed). Returns 0 or an
 * nng error. */
int allot__link_watch(nng_socket sock, allot__link *l);

static inline bool
allot__link_lost(allot__link *l)
{
	return atomic_load(&l->was_connected) && atomic_load(&l->pipes) == 0;
}

#endif
