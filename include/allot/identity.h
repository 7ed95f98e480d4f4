/* SPDX-License-Identifier: MIT */
/*
 * liballot, caller identity: the SPIFFE rules a service applies to the URI
 * subject alternative names of a client certificate it has already
 * verified, whatever its TLS library. An X509-SVID carries exactly one URI
 * SAN, and it is a SPIFFE ID (spiffe://trust-domain/path); anything else
 * gives no identity, and the caller then lands in the shared default
 * bucket. The TLS library's part (verify the chain against the CA, check
 * the TLS client key purpose, list the URI SANs) is a dozen lines of glue
 * that stays in the embedding service: liballot links no TLS library, so
 * that a service built on OpenSSL, BoringSSL or GnuTLS embeds the same
 * agent without a second TLS stack in its process. examples/tls_identity.c
 * is the GnuTLS glue; docs/integrating.md shows where it goes.
 *
 * Threads: every function is pure and may be called from any thread.
 */
#ifndef ALLOT_IDENTITY_H
#define ALLOT_IDENTITY_H

#include <stddef.h>

#include <allot/allot.h>

#ifdef __cplusplus
extern "C" {
#endif

/** The longest SPIFFE ID the SPIFFE specification allows, in bytes. */
#define ALLOT_SPIFFE_ID_MAX 2048

/**
 * Check that `id` (`len` bytes, no NUL needed) is a well-formed SPIFFE ID
 * as the SPIFFE-ID specification defines it: the scheme "spiffe://"; a
 * non-empty trust domain of lowercase letters, digits, '.', '-' and '_'
 * (at most 255 bytes, so no port, user info or percent-encoding); then an
 * optional path of '/'-separated segments of letters, digits, '.', '-'
 * and '_', with no empty, "." or ".." segment and no trailing '/'; no
 * query or fragment; at most ALLOT_SPIFFE_ID_MAX bytes in all.
 * @return ALLOT_OK when well formed; ALLOT_EPROTO when not; ALLOT_EINVAL
 *         for a NULL `id`.
 */
ALLOT_API int allot_spiffe_id_check(const char *id, size_t len);

/**
 * The caller's identity from the URI SANs of a *verified* client
 * certificate (the X509-SVID rule: exactly one URI SAN, a SPIFFE ID).
 * Call it only after the TLS library has verified the certificate chain
 * against the trust anchor for callers: this function reads names, it
 * does not authenticate them.
 * @param uris the certificate's URI SANs, in certificate order; each is
 *        `lens[i]` bytes and need not be NUL-terminated. A SAN holding a
 *        NUL byte is malformed (it would hide the rest of the name).
 * @param n the number of URI SANs (0 is allowed).
 * @param trust_domain when not NULL, the only trust domain accepted (for
 *        example "prod.example.internal"); IDs of any other domain give no
 *        identity. NULL accepts any trust domain the CA signs for.
 * @param buf on ALLOT_OK, the SPIFFE ID, NUL-terminated. Untouched
 *        otherwise.
 * @return ALLOT_OK; ALLOT_ENOENT: no URI SAN, or a SPIFFE ID of another
 *         trust domain; ALLOT_EPROTO: more than one URI SAN, or one that is
 *         not a well-formed SPIFFE ID; ALLOT_ERANGE: the ID does not fit in
 *         `len` bytes with its NUL (a service that passes an
 *         ALLOT_IDENTITY_MAX + 1 buffer treats longer IDs as no identity);
 *         ALLOT_EINVAL: NULL arguments.
 */
ALLOT_API int allot_identity_from_uri_sans(const char *const *uris,
    const size_t *lens, size_t n, const char *trust_domain, char *buf,
    size_t len);

#ifdef __cplusplus
}
#endif
#endif /* ALLOT_IDENTITY_H */
