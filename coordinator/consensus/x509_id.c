/* SPDX-License-Identifier: MIT */
/*
 * A certificate's SPIFFE ID through GnuTLS (x509_id.h): its URI SANs
 * collected, then judged by liballot's X509-SVID rule, so that a member,
 * an admin caller and an agent are named the same way.
 */
#include "x509_id.h"

#include <stdio.h>
#include <string.h>

#include <allot/allot.h>
#include <allot/identity.h>

/* URI SANs collected: two tell "more than one" from "one". */
#define URIS_KEPT 2u

int
allot__x509_spiffe_id(
    gnutls_x509_crt_t crt, char *buf, size_t len, char *why, size_t whylen)
{
	char uri[URIS_KEPT][ALLOT_SPIFFE_ID_MAX + 1];
	const char *uris[URIS_KEPT];
	size_t lens[URIS_KEPT];
	size_t k = 0;
	for (unsigned seq = 0; k < URIS_KEPT; seq++) {
		size_t size = sizeof uri[k];
		int type = gnutls_x509_crt_get_subject_alt_name(
		    crt, seq, uri[k], &size, NULL);
		if (type == GNUTLS_E_REQUESTED_DATA_NOT_AVAILABLE)
			break;
		if (type < 0) {
			snprintf(why, whylen,
			    "a subject alternative name too long or bad");
			return -1;
		}
		if (type != GNUTLS_SAN_URI)
			continue;
		uris[k] = uri[k];
		lens[k++] = size;
	}
	int r = allot_identity_from_uri_sans(uris, lens, k, NULL, buf, len);
	if (r == ALLOT_OK)
		return 0;
	if (k == 0)
		snprintf(why, whylen, "no spiffe:// URI SAN");
	else if (k > 1)
		snprintf(why, whylen, "more than one URI SAN");
	else
		snprintf(why, whylen, "its URI SAN is no SPIFFE ID: %s",
		    allot_strerror(r));
	return -1;
}
