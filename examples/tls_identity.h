/* SPDX-License-Identifier: MIT */
/*
 * GnuTLS glue for caller identity: verify the peer's client certificate
 * of a TLS session against the server's trust anchors and return the
 * SPIFFE ID from its URI SAN. The SPIFFE rules themselves live in
 * liballot (allot/identity.h); this file is the part that depends on a
 * TLS library, kept out of liballot so that the agent links no TLS stack
 * (a service on OpenSSL writes the same dozen lines against its API).
 * Copy it into a GnuTLS-based service as it is.
 */
#ifndef ALLOT_EXAMPLE_TLS_IDENTITY_H
#define ALLOT_EXAMPLE_TLS_IDENTITY_H

#include <stddef.h>

#include <gnutls/gnutls.h>

/**
 * The verified caller identity of a server-side TLS session, after its
 * handshake. The chain is verified against the trust anchors of the
 * session's certificate credentials (for libmicrohttpd, the CA given with
 * MHD_OPTION_HTTPS_MEM_TRUST), for the TLS client key purpose, at the
 * current time; the leaf must not be a CA; its one URI SAN must be a
 * SPIFFE ID (of `trust_domain`, unless NULL).
 * @param buf on ALLOT_OK, the SPIFFE ID, NUL-terminated.
 * @return ALLOT_OK; ALLOT_ENOENT: no client certificate, or no SPIFFE ID
 *         (of the trust domain) in it; ALLOT_EPROTO: a certificate that
 *         does not verify, or a malformed one; ALLOT_ERANGE: the ID does
 *         not fit in `len`; ALLOT_ENOMEM. Every error means "no identity":
 *         the caller is charged to the default bucket.
 */
int example_tls_identity(
    gnutls_session_t session, const char *trust_domain, char *buf, size_t len);

#endif /* ALLOT_EXAMPLE_TLS_IDENTITY_H */
