/* SPDX-License-Identifier: MIT */
/*
 * The admin API's HTTPS listener and its callers (admin_tls.h): the PEM
 * files libmicrohttpd serves from memory, and the check of each caller's
 * certificate against the admin CA and the allow-list.
 */
#include "admin_tls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

#include <allot/identity.h>

#include "consensus/x509_id.h"
#include "file.h"
#include "web/addr.h"

struct allot__admin_tls {
	struct MHD_Daemon *mhd;
	char *cert_key; /* PEM text, served from memory */
	char *key; /* the key's, when apart (--tls-key); else NULL */
	char *ca;
	char **allow;
	size_t nallow;
};

bool
allot__admin_tls_pattern_ok(const char *pattern, char *err, size_t errlen)
{
	size_t n = strlen(pattern);
	bool prefix = n >= 2 && strcmp(pattern + n - 2, "/*") == 0;
	size_t idlen = prefix ? n - 2 : n;
	if (allot_spiffe_id_check(pattern, idlen) != ALLOT_OK) {
		snprintf(err, errlen,
		    "--admin-allow %.300s: expected a SPIFFE ID "
		    "(spiffe://TRUST-DOMAIN/PATH), or one followed by /* for "
		    "any ID one segment below it",
		    pattern);
		return false;
	}
	if (prefix && strchr(pattern + 9, '/') == pattern + n - 2) {
		snprintf(err, errlen,
		    "--admin-allow %.300s: a whole trust domain is too wide; "
		    "name a path below it",
		    pattern);
		return false;
	}
	return true;
}

/* Whether `id` is named by `pattern`: equal, or for a prefix P and a
 * star, one more non-empty segment below P (--raft-member-id's rule). */
static bool
allowed(const char *pattern, const char *id)
{
	size_t n = strlen(pattern);
	if (n < 2 || strcmp(pattern + n - 2, "/*") != 0)
		return strcmp(pattern, id) == 0;
	n--; /* "P/" */
	return strncmp(id, pattern, n) == 0 && id[n] != '\0' &&
	    strchr(id + n, '/') == NULL;
}

/* The one SPIFFE ID of a verified certificate `der` into `who`; 0, or
 * -1 with `why`. */
static int
spiffe_of(
    const gnutls_datum_t *der, char *who, size_t n, char *why, size_t whylen)
{
	gnutls_x509_crt_t crt;
	if (gnutls_x509_crt_init(&crt) < 0) {
		snprintf(why, whylen, "out of memory");
		return -1;
	}
	int rc = -1;
	if (gnutls_x509_crt_import(crt, der, GNUTLS_X509_FMT_DER) < 0) {
		snprintf(why, whylen, "its certificate does not parse");
		goto out;
	}
	unsigned critical = 0, ca = 0;
	int pathlen = 0;
	if (gnutls_x509_crt_get_basic_constraints(
	        crt, &critical, &ca, &pathlen) >= 0 &&
	    ca) {
		snprintf(why, whylen, "a CA certificate is no caller");
		goto out;
	}
	char what[ALLOT_SPIFFE_ID_MAX + 64];
	if (allot__x509_spiffe_id(crt, who, n, what, sizeof what) != 0) {
		snprintf(why, whylen,
		    "its certificate names no SPIFFE ID (exactly one "
		    "spiffe:// URI SAN): %s",
		    what);
		goto out;
	}
	rc = 0;
out:
	gnutls_x509_crt_deinit(crt);
	return rc;
}

unsigned
allot__admin_tls_caller(const allot__admin_tls *t, struct MHD_Connection *c,
    char *who, size_t n, char *why, size_t whylen)
{
	who[0] = '\0';
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
	    c, MHD_CONNECTION_INFO_GNUTLS_SESSION);
	gnutls_session_t s = ci != NULL ? ci->tls_session : NULL;
	unsigned npeers = 0;
	const gnutls_datum_t *peers = s != NULL ?
	    gnutls_certificate_get_peers(s, &npeers) :
	    NULL;
	if (peers == NULL || npeers == 0) {
		snprintf(why, whylen,
		    "no client certificate: the admin API takes mutual TLS "
		    "only");
		return MHD_HTTP_UNAUTHORIZED;
	}
	/* Verified before any name is read: an unverified certificate's
	 * names are the client's claims. */
	gnutls_typed_vdata_st purpose = {
		.type = GNUTLS_DT_KEY_PURPOSE_OID,
		.data = (unsigned char *) GNUTLS_KP_TLS_WWW_CLIENT,
	};
	unsigned status = 0;
	int rv = gnutls_certificate_verify_peers(s, &purpose, 1, &status);
	if (rv < 0 || status != 0) {
		gnutls_datum_t out = { 0 };
		if (rv >= 0)
			gnutls_certificate_verification_status_print(
			    status, GNUTLS_CRT_X509, &out, 0);
		snprintf(why, whylen, "client certificate not valid: %s",
		    rv < 0               ? gnutls_strerror(rv) :
		        out.data != NULL ? (const char *) out.data :
		                           "?");
		gnutls_free(out.data);
		size_t l = strlen(why);
		while (l > 0 && why[l - 1] == ' ')
			why[--l] = '\0';
		return MHD_HTTP_UNAUTHORIZED;
	}
	if (spiffe_of(&peers[0], who, n, why, whylen) != 0)
		return MHD_HTTP_UNAUTHORIZED;
	for (size_t i = 0; i < t->nallow; i++)
		if (allowed(t->allow[i], who))
			return MHD_HTTP_OK;
	snprintf(
	    why, whylen, "%.300s is not on allotd's --admin-allow list", who);
	return MHD_HTTP_FORBIDDEN;
}

bool
allot__admin_tls_owns(const allot__admin_tls *t, struct MHD_Connection *c)
{
	if (t == NULL)
		return false;
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
	    c, MHD_CONNECTION_INFO_DAEMON);
	return ci != NULL && ci->daemon == t->mhd;
}

static void
free_tls(allot__admin_tls *t)
{
	for (size_t i = 0; i < t->nallow; i++)
		free(t->allow[i]);
	free(t->allow);
	free(t->cert_key);
	free(t->key);
	free(t->ca);
	free(t);
}

static int
read_pem(
    const char *what, const char *path, char **ret, char *err, size_t errlen)
{
	char e[256];
	size_t len;
	int rc = allot__file_read(
	    path, ALLOT__PEM_MAX, e, sizeof e, ret, &len);
	if (rc != ALLOT_OK)
		snprintf(err, errlen, "%s %s: %s", what, path, e);
	return rc;
}

int
allot__admin_tls_start(const allot__admin_tls_opts *o,
    MHD_AccessHandlerCallback handler, MHD_RequestCompletedCallback completed,
    void *cls, char *err, size_t errlen, allot__admin_tls **ret)
{
	if (o->cert_key == NULL || o->ca == NULL || o->nallow == 0 ||
	    o->nallow > ALLOT__ADMIN_ALLOW_MAX) {
		snprintf(err, errlen,
		    "--admin-listen needs --tls-cert (allotd's certificate "
		    "and key), a CA for its callers (--admin-ca or --tls-ca) "
		    "and 1 to %u --admin-allow",
		    ALLOT__ADMIN_ALLOW_MAX);
		return ALLOT_EINVAL;
	}
	for (size_t i = 0; i < o->nallow; i++)
		if (!allot__admin_tls_pattern_ok(o->allow[i], err, errlen))
			return ALLOT_EINVAL;
	struct sockaddr_storage sa;
	int rc = allot__web_parse_addr(o->listen, "https", &sa, err, errlen);
	if (rc != ALLOT_OK)
		return rc;
	allot__admin_tls *t = calloc(1, sizeof *t);
	if (t == NULL ||
	    (t->allow = calloc(o->nallow, sizeof *t->allow)) == NULL) {
		free(t);
		snprintf(err, errlen, "out of memory");
		return ALLOT_ENOMEM;
	}
	for (; t->nallow < o->nallow; t->nallow++)
		if ((t->allow[t->nallow] = strdup(o->allow[t->nallow])) ==
		    NULL) {
			free_tls(t);
			snprintf(err, errlen, "out of memory");
			return ALLOT_ENOMEM;
		}
	rc = read_pem("--tls-cert", o->cert_key, &t->cert_key, err, errlen);
	if (rc == ALLOT_OK && o->key != NULL)
		rc = read_pem("--tls-key", o->key, &t->key, err, errlen);
	if (rc == ALLOT_OK)
		rc = read_pem("--admin-ca", o->ca, &t->ca, err, errlen);
	if (rc != ALLOT_OK) {
		free_tls(t);
		return rc;
	}
	unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD |
	    MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL | MHD_USE_TLS;
	if (sa.ss_family == AF_INET6)
		flags |= MHD_USE_IPv6;
	/* With a trust list libmicrohttpd asks every client for a
	 * certificate; allot__admin_tls_caller() verifies it. The one PEM
	 * holds both the certificate and the key: GnuTLS finds each. */
	t->mhd = MHD_start_daemon(flags, 0, NULL, NULL, handler, cls,
	    MHD_OPTION_SOCK_ADDR, (struct sockaddr *) &sa,
	    MHD_OPTION_HTTPS_MEM_CERT, t->cert_key, MHD_OPTION_HTTPS_MEM_KEY,
	    t->key != NULL ? t->key : t->cert_key, MHD_OPTION_HTTPS_MEM_TRUST,
	    t->ca, MHD_OPTION_CONNECTION_LIMIT, o->max_connections,
	    MHD_OPTION_PER_IP_CONNECTION_LIMIT, o->max_connections / 2,
	    MHD_OPTION_CONNECTION_TIMEOUT, o->idle_timeout_s,
	    MHD_OPTION_NOTIFY_COMPLETED, completed, cls, MHD_OPTION_END);
	if (t->mhd == NULL) {
		snprintf(err, errlen,
		    "--admin-listen %s: cannot serve on it (address in use, "
		    "or a certificate, key or CA GnuTLS cannot read?)",
		    o->listen);
		free_tls(t);
		return ALLOT_EIO;
	}
	*ret = t;
	return ALLOT_OK;
}

void
allot__admin_tls_stop(allot__admin_tls *t)
{
	if (t == NULL)
		return;
	MHD_stop_daemon(t->mhd);
	free_tls(t);
}
