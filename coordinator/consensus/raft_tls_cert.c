/* SPDX-License-Identifier: MIT */
/*
 * Who is a member (raft_tls.h states the rule): the credentials a member
 * presents, and the check on the peer's certificate that runs inside
 * every TLS handshake of the transport (raft_tls.c).
 */
#include "raft_tls_int.h"
#include "x509_id.h"

#include <allot/identity.h>

#include <gnutls/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the peer's certificate ---- */

static bool
names_member(const tls_tr *tr, const char *id)
{
	size_t n = strlen(tr->member_id);

	if (!tr->member_prefix)
		return strcmp(id, tr->member_id) == 0;
	/* member_id is "PREFIX/" here: one more non-empty segment. */
	return strncmp(id, tr->member_id, n) == 0 && id[n] != '\0' &&
	    strchr(id + n, '/') == NULL;
}

/* Per-member IDs: the Raft id that the last segment of `id` (a member
 * ID, names_member) ends in, in decimal: .../member/3 and .../member/m3
 * name member 3. 0 when it ends in no digits or more than 19. */
static raft_id
member_number(const tls_tr *tr, const char *id)
{
	const char *seg = id + strlen(tr->member_id);
	size_t n = strlen(seg), k = n;
	raft_id v = 0;

	while (k > 0 && seg[k - 1] >= '0' && seg[k - 1] <= '9')
		k--;
	if (k == n || n - k > 19)
		return 0;
	for (size_t i = k; i < n; i++)
		v = v * 10 + (raft_id) (seg[i] - '0');
	return v;
}

/* Runs inside the handshake, once the peer's certificate arrived.
 * Non-zero aborts the handshake with an alert to the peer. */
static int
verify_cb(gnutls_session_t s)
{
	conn *c = gnutls_session_get_ptr(s);
	gnutls_typed_vdata_st d = { .type = GNUTLS_DT_KEY_PURPOSE_OID };
	const gnutls_datum_t *certs;
	unsigned status = 0, n = 0;
	gnutls_x509_crt_t crt;
	char id[ALLOT_SPIFFE_ID_MAX + 1];
	const char *why = NULL;
	char what[256] = "unreadable";
	int rv;

	d.data = (unsigned char *) (c->dialer ? GNUTLS_KP_TLS_WWW_SERVER :
	                                        GNUTLS_KP_TLS_WWW_CLIENT);
	certs = gnutls_certificate_get_peers(s, &n);
	if (certs == NULL || n == 0) {
		snprintf(c->reason, sizeof c->reason, "no certificate");
		c->alert = GNUTLS_A_CERTIFICATE_REQUIRED;
		return -1;
	}
	rv = gnutls_certificate_verify_peers(s, &d, 1, &status);
	if (rv < 0) {
		snprintf(c->reason, sizeof c->reason,
		    "certificate not verified: %s", gnutls_strerror(rv));
		return -1;
	}
	if (status & GNUTLS_CERT_SIGNER_NOT_FOUND) {
		snprintf(c->reason, sizeof c->reason,
		    "CA mismatch: its certificate does not chain to the "
		    "cluster CA");
		c->alert = GNUTLS_A_UNKNOWN_CA;
		return -1;
	}
	if (status != 0) {
		gnutls_datum_t out = { 0 };

		gnutls_certificate_verification_status_print(
		    status, GNUTLS_CRT_X509, &out, 0);
		snprintf(c->reason, sizeof c->reason,
		    "certificate not valid: %s",
		    out.data != NULL ? (char *) out.data : "?");
		c->alert = GNUTLS_A_BAD_CERTIFICATE;
		gnutls_free(out.data);
		return -1;
	}
	if (gnutls_x509_crt_init(&crt) < 0)
		return -1;
	rv = gnutls_x509_crt_import(crt, &certs[0], GNUTLS_X509_FMT_DER);
	if (rv < 0)
		why = gnutls_strerror(rv);
	else if (allot__x509_spiffe_id(
	             crt, id, sizeof id, what, sizeof what) != 0)
		why = what;
	gnutls_x509_crt_deinit(crt);
	if (why != NULL) {
		snprintf(c->reason, sizeof c->reason,
		    "certificate not a member: %s (want %.300s%s)", why,
		    c->tr->member_id, c->tr->member_prefix ? "*" : "");
		c->alert = GNUTLS_A_ACCESS_DENIED;
		return -1;
	}
	if (!names_member(c->tr, id)) {
		snprintf(c->reason, sizeof c->reason,
		    "certificate not a member: %.300s is not %.300s%s", id,
		    c->tr->member_id, c->tr->member_prefix ? "*" : "");
		c->alert = GNUTLS_A_ACCESS_DENIED;
		return -1;
	}
	if (!c->tr->member_prefix)
		return 0;
	c->cert_id = member_number(c->tr, id);
	if (c->cert_id == 0) {
		snprintf(c->reason, sizeof c->reason,
		    "certificate not a member: %.300s names no member id "
		    "(a per-member ID ends in the member's Raft id, e.g. "
		    "%.300s3)",
		    id, c->tr->member_id);
		c->alert = GNUTLS_A_ACCESS_DENIED;
		return -1;
	}
	if (c->dialer && c->cert_id != c->id) {
		snprintf(c->reason, sizeof c->reason,
		    "certificate of member %llu, not of member %llu dialed",
		    (unsigned long long) c->cert_id,
		    (unsigned long long) c->id);
		c->alert = GNUTLS_A_ACCESS_DENIED;
		return -1;
	}
	return 0;
}

bool
allot__raft_tls_claim_ok(conn *c)
{
	tls_tr *tr = c->tr;

	if (tr->member_prefix && c->cert_id != c->id) {
		allot__raft_tls_refuse(c,
		    "claims member %llu, but its certificate names member "
		    "%llu",
		    (unsigned long long) c->id,
		    (unsigned long long) c->cert_id);
		return false;
	}
	if (tr->is_member != NULL && !tr->is_member(tr->member_arg, c->id)) {
		allot__raft_tls_refuse(c,
		    "claims member %llu, which is not in the cluster's "
		    "configuration",
		    (unsigned long long) c->id);
		return false;
	}
	return true;
}

int
allot__raft_tls_own_id(tls_tr *tr, raft_id id)
{
	if (!tr->member_prefix || tr->own_cert_id == id)
		return 0;
	if (tr->own_cert_id == 0)
		snprintf(tr->t->errmsg, sizeof tr->t->errmsg,
		    "our certificate names no member of %s*: with per-member "
		    "IDs each member's ends in its own Raft id (%s%llu)",
		    tr->member_id, tr->member_id, (unsigned long long) id);
	else
		snprintf(tr->t->errmsg, sizeof tr->t->errmsg,
		    "our certificate names member %llu, but this is member "
		    "%llu: with per-member IDs each member's ends in its own "
		    "Raft id",
		    (unsigned long long) tr->own_cert_id,
		    (unsigned long long) id);
	return RAFT_INVALID;
}

int
allot__raft_tls_load(
    tls_tr *tr, struct raft_uv_transport *t, const allot__raft_tls_opts *o)
{
	gnutls_datum_t der = { 0 };
	gnutls_x509_crt_t crt;
	char id[ALLOT_SPIFFE_ID_MAX + 1];
	const char *why = NULL;
	char what[256] = "unreadable";
	int rv;

	rv = gnutls_certificate_set_x509_trust_file(
	    tr->cred, o->ca_file, GNUTLS_X509_FMT_PEM);
	if (rv <= 0) {
		snprintf(t->errmsg, sizeof t->errmsg, "%s: %s", o->ca_file,
		    rv == 0 ? "no certificate in it" : gnutls_strerror(rv));
		return RAFT_INVALID;
	}
	rv = gnutls_certificate_set_x509_key_file(tr->cred, o->cert_key_file,
	    o->key_file != NULL ? o->key_file : o->cert_key_file,
	    GNUTLS_X509_FMT_PEM);
	if (rv < 0) {
		snprintf(t->errmsg, sizeof t->errmsg,
		    "%s: certificate and key: %s", o->cert_key_file,
		    gnutls_strerror(rv));
		return RAFT_INVALID;
	}
	rv = gnutls_certificate_get_crt_raw(tr->cred, 0, 0, &der);
	if (rv == 0 && gnutls_x509_crt_init(&crt) == 0) {
		if (gnutls_x509_crt_import(crt, &der, GNUTLS_X509_FMT_DER) <
		        0 ||
		    allot__x509_spiffe_id(
		        crt, id, sizeof id, what, sizeof what) != 0)
			why = what;
		gnutls_x509_crt_deinit(crt);
	} else {
		why = "unreadable";
	}
	if (o->member_id == NULL) {
		if (why != NULL) {
			snprintf(t->errmsg, sizeof t->errmsg,
			    "%s: %.100s: a member certificate names the "
			    "member "
			    "identity in one spiffe:// URI SAN",
			    o->cert_key_file, why);
			return RAFT_INVALID;
		}
		tr->member_id = strdup(id);
	} else {
		size_t n = strlen(o->member_id);

		if (strncmp(o->member_id, "spiffe://", 9) != 0) {
			snprintf(t->errmsg, sizeof t->errmsg,
			    "member id %s is not a spiffe:// ID",
			    o->member_id);
			return RAFT_INVALID;
		}
		tr->member_id = strdup(o->member_id);
		if (tr->member_id != NULL && n > 2 &&
		    strcmp(o->member_id + n - 2, "/*") == 0) {
			tr->member_id[n - 1] = '\0'; /* keep the '/' */
			tr->member_prefix = true;
		}
	}
	if (tr->member_id == NULL)
		return RAFT_NOMEM;
	if (tr->member_prefix && why == NULL && names_member(tr, id))
		tr->own_cert_id = member_number(tr, id);
	gnutls_certificate_set_verify_function(tr->cred, verify_cb);
	return 0;
}
