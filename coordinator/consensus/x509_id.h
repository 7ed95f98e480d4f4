/* SPDX-License-Identifier: MIT */
/*
 * The SPIFFE ID a GnuTLS certificate names: one rule for the Raft port's
 * members (raft_tls_cert.c) and the admin API's callers
 * (admin/admin_tls.c), the X509-SVID one liballot applies to agents
 * (allot_identity_from_uri_sans): exactly one URI SAN, a valid
 * spiffe:// ID.
 */
#ifndef ALLOT_X509_ID_H
#define ALLOT_X509_ID_H

#include <stddef.h>

#include <gnutls/x509.h>

/* The SPIFFE ID of `crt` into `buf` (NUL-terminated): 0, or -1 with
 * `why` saying what the certificate names instead ("no spiffe:// URI
 * SAN", "more than one URI SAN", or the check that failed). */
int allot__x509_spiffe_id(
    gnutls_x509_crt_t crt, char *buf, size_t len, char *why, size_t whylen);

#endif
