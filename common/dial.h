/* SPDX-License-Identifier: MIT */
/*
 * Dialling a coordinator: the agent's sessions and a cluster member's
 * probes of its peers connect the same way, plain or over mutual TLS.
 */
#ifndef ALLOT_COMMON_DIAL_H
#define ALLOT_COMMON_DIAL_H

#include <nng/nng.h>

/* Dial `url` on `sock` in the background (nng reconnects by itself). A
 * tls+tcp:// URL gets a client TLS configuration that verifies the peer
 * against `ca_file`, presents `cert_key_file` (certificate and key in
 * one PEM; NULL: none) and, when `server_name` is not NULL, checks the
 * peer's certificate names it. Returns 0 or an nng error: NNG_EINVAL for
 * tls+tcp:// without a CA. */
int allot__dial(nng_socket sock, const char *url, const char *ca_file,
    const char *cert_key_file, const char *server_name);

#endif
