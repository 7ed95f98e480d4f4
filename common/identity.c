/* SPDX-License-Identifier: MIT */
/*
 * SPIFFE ID validation and the X509-SVID "exactly one URI SAN" rule
 * (allot/identity.h). Pure byte checks, no allocation, no TLS library: the
 * embedding service verifies the certificate chain with its own TLS stack
 * and hands the URI SANs here. Every byte is checked against the grammar
 * of the SPIFFE-ID specification, so what comes out is safe to use as a
 * bucket key, log field or JSON string without escaping.
 */
#include <string.h>

#include <allot/identity.h>

#define SCHEME "spiffe://"
#define SCHEME_LEN (sizeof SCHEME - 1)
#define TRUST_DOMAIN_MAX 255

static int
td_char(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
	    c == '-' || c == '_';
}

static int
path_char(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	    (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
}

/* Length of the trust domain of a checked ID. */
static size_t
td_len(const char *id, size_t len)
{
	size_t i = SCHEME_LEN;
	while (i < len && id[i] != '/')
		i++;
	return i - SCHEME_LEN;
}

int
allot_spiffe_id_check(const char *id, size_t len)
{
	if (id == NULL)
		return ALLOT_EINVAL;
	if (len <= SCHEME_LEN || len > ALLOT_SPIFFE_ID_MAX ||
	    memcmp(id, SCHEME, SCHEME_LEN) != 0)
		return ALLOT_EPROTO;
	size_t i = SCHEME_LEN;
	while (i < len && id[i] != '/') {
		if (!td_char((unsigned char) id[i]))
			return ALLOT_EPROTO;
		i++;
	}
	size_t td = i - SCHEME_LEN;
	if (td == 0 || td > TRUST_DOMAIN_MAX)
		return ALLOT_EPROTO;
	/* The path: each '/' opens a segment that must be non-empty and
	 * neither "." nor "..". */
	while (i < len) {
		size_t start = ++i; /* skip the '/' */
		while (i < len && id[i] != '/') {
			if (!path_char((unsigned char) id[i]))
				return ALLOT_EPROTO;
			i++;
		}
		size_t seg = i - start;
		if (seg == 0)
			return ALLOT_EPROTO; /* "//" or a trailing '/' */
		if (id[start] == '.' &&
		    (seg == 1 || (seg == 2 && id[start + 1] == '.')))
			return ALLOT_EPROTO;
	}
	return ALLOT_OK;
}

int
allot_identity_from_uri_sans(const char *const *uris, const size_t *lens,
    size_t n, const char *trust_domain, char *buf, size_t len)
{
	if ((n > 0 && (uris == NULL || lens == NULL)) || buf == NULL ||
	    len == 0)
		return ALLOT_EINVAL;
	if (n == 0)
		return ALLOT_ENOENT;
	/* X509-SVID: exactly one URI SAN. A certificate naming two
	 * identities names none we could charge. */
	if (n > 1)
		return ALLOT_EPROTO;
	const char *id = uris[0];
	size_t idlen = lens[0];
	if (id == NULL || memchr(id, '\0', idlen) != NULL)
		return ALLOT_EPROTO;
	int rc = allot_spiffe_id_check(id, idlen);
	if (rc != ALLOT_OK)
		return rc;
	if (trust_domain != NULL) {
		size_t want = strlen(trust_domain);
		if (td_len(id, idlen) != want ||
		    memcmp(id + SCHEME_LEN, trust_domain, want) != 0)
			return ALLOT_ENOENT;
	}
	if (idlen >= len)
		return ALLOT_ERANGE;
	memcpy(buf, id, idlen);
	buf[idlen] = '\0';
	return ALLOT_OK;
}
