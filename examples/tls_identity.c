/* SPDX-License-Identifier: MIT */
/*
 * GnuTLS glue for caller identity (tls_identity.h): verification of the
 * client certificate chain with gnutls_certificate_verify_peers() (trust
 * anchors, validity dates, the TLS client key purpose), then the URI SANs
 * of the leaf handed to allot_identity_from_uri_sans(), which applies the
 * SPIFFE rules. Runs once per TLS connection, not per request.
 */
#include <string.h>

#include <gnutls/x509.h>

#include <allot/identity.h>

#include "tls_identity.h"

/* Two URI SANs are enough to know there are too many (X509-SVID allows
 * exactly one), so only the first two are copied. */
#define URIS_KEPT 2

int
example_tls_identity(
    gnutls_session_t session, const char *trust_domain, char *buf, size_t len)
{
	if (session == NULL || buf == NULL || len == 0)
		return ALLOT_EINVAL;
	if (gnutls_certificate_type_get(session) != GNUTLS_CRT_X509)
		return ALLOT_ENOENT;
	unsigned int npeers = 0;
	const gnutls_datum_t *peers = gnutls_certificate_get_peers(
	    session, &npeers);
	if (peers == NULL || npeers == 0)
		return ALLOT_ENOENT; /* the client sent no certificate */

	/* Verify before reading any name: an unverified certificate's
	 * names are the client's claims. */
	gnutls_typed_vdata_st purpose = {
		.type = GNUTLS_DT_KEY_PURPOSE_OID,
		.data = (unsigned char *) GNUTLS_KP_TLS_WWW_CLIENT,
		.size = 0,
	};
	unsigned int status = 0;
	if (gnutls_certificate_verify_peers(session, &purpose, 1, &status) <
	        0 ||
	    status != 0)
		return ALLOT_EPROTO;

	gnutls_x509_crt_t crt;
	if (gnutls_x509_crt_init(&crt) < 0)
		return ALLOT_ENOMEM;
	int rc = ALLOT_EPROTO;
	if (gnutls_x509_crt_import(crt, &peers[0], GNUTLS_X509_FMT_DER) < 0)
		goto out;
	unsigned int critical = 0, ca = 0;
	int pathlen = 0;
	int bc = gnutls_x509_crt_get_basic_constraints(
	    crt, &critical, &ca, &pathlen);
	if (bc >= 0 && ca)
		goto out; /* a CA certificate is never a caller */

	char uri[URIS_KEPT][ALLOT_SPIFFE_ID_MAX + 1];
	const char *uris[URIS_KEPT];
	size_t lens[URIS_KEPT];
	size_t n = 0;
	for (unsigned int seq = 0;; seq++) {
		char san[ALLOT_SPIFFE_ID_MAX + 1];
		size_t size = sizeof san;
		int type = gnutls_x509_crt_get_subject_alt_name(
		    crt, seq, san, &size, NULL);
		if (type == GNUTLS_E_REQUESTED_DATA_NOT_AVAILABLE)
			break;
		/* Any error, GNUTLS_E_SHORT_MEMORY_BUFFER included (a name
		 * longer than any SPIFFE ID may be), rejects the whole
		 * certificate: a caller with a strange certificate is
		 * charged to the default bucket, never to a guess. */
		if (type < 0)
			goto out;
		if (type != GNUTLS_SAN_URI)
			continue;
		if (n < URIS_KEPT) {
			memcpy(uri[n], san, size);
			uris[n] = uri[n];
			lens[n] = size;
		}
		n++;
	}
	rc = allot_identity_from_uri_sans(
	    uris, lens, n < URIS_KEPT ? n : URIS_KEPT, trust_domain, buf, len);
	if (n > URIS_KEPT)
		rc = ALLOT_EPROTO;
out:
	gnutls_x509_crt_deinit(crt);
	return rc;
}
