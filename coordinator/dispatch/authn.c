/* SPDX-License-Identifier: MIT */
/*
 * Register identity verification with mbedTLS (authn.h): the library nng's
 * TLS transport already uses. The replay cache is an open-addressed table
 * of nonces, each kept until its proof's timestamp leaves the window (a
 * replay after that fails the time check instead); lookups and inserts
 * probe a bounded run of slots, so a full run answers RATE_LIMITED rather
 * than forgetting a live nonce.
 */
#include "authn.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mbedtls/asn1.h>
#include <mbedtls/oid.h>
#include <mbedtls/pk.h>
#include <mbedtls/sha256.h>
#include <mbedtls/version.h>
#include <mbedtls/x509_crt.h>

#include <allot/allot.h>
#include <allot/identity.h>

#include "authn_msg.h"
#include "hash.h"
#include "clock.h"

#define MAX_CERTS 8u
#define MAX_CERT_BYTES 16384u
#define REPLAY_SLOTS (1u << 16)
#define REPLAY_PROBE 64u
#define SAN_URI 6 /* GeneralName uniformResourceIdentifier [6] */

typedef struct nonce_slot {
	int64_t until_ms; /* 0: free */
	unsigned char nonce[ALLOT__AUTHN_NONCE];
} nonce_slot;

struct allot__authn {
	pthread_mutex_t mu;
	mbedtls_x509_crt ca;
	char **maps;
	size_t nmaps;
	char **aud;
	size_t naud;
	int64_t window_ms;
	uint64_t seed;
	nonce_slot *replay;
};

static void
free_list(char **l, size_t n)
{
	for (size_t i = 0; l != NULL && i < n; i++)
		free(l[i]);
	free(l);
}

void
allot__authn_free(allot__authn *au)
{
	if (au == NULL)
		return;
	mbedtls_x509_crt_free(&au->ca);
	free_list(au->maps, au->nmaps);
	free_list(au->aud, au->naud);
	free(au->replay);
	pthread_mutex_destroy(&au->mu);
	free(au);
}

static char **
copy_list(const char *const *l, size_t n)
{
	char **c = calloc(n > 0 ? n : 1, sizeof *c);
	for (size_t i = 0; c != NULL && i < n; i++) {
		if ((c[i] = strdup(l[i])) == NULL) {
			free_list(c, i);
			return NULL;
		}
	}
	return c;
}

/* A pattern is spiffe://TD/SEG/... where TD and each SEG are literal or
 * "*", and exactly one SEG is "{service}". */
static bool
map_ok(const char *p)
{
	if (strncmp(p, "spiffe://", 9) != 0)
		return false;
	const char *s = strstr(p, "{service}");
	if (s == NULL || s[-1] != '/' || (s[9] != '\0' && s[9] != '/') ||
	    strstr(s + 9, "{service}") != NULL)
		return false;
	return true;
}

int
allot__authn_new(
    const allot__authn_opts *o, char *err, size_t errlen, allot__authn **ret)
{
	if (o == NULL || o->ca_file == NULL) {
		snprintf(err, errlen, "identity checks need a CA (--tls-ca)");
		return ALLOT_EINVAL;
	}
	for (size_t i = 0; i < o->nmaps; i++) {
		if (!map_ok(o->maps[i])) {
			snprintf(err, errlen,
			    "identity map \"%s\": want a SPIFFE ID with one "
			    "whole path segment \"{service}\" (others literal "
			    "or \"*\"), e.g. spiffe://example.org/ns/*/sa/"
			    "{service}",
			    o->maps[i]);
			return ALLOT_EINVAL;
		}
	}
	allot__authn *au = calloc(1, sizeof *au);
	if (au == NULL) {
		snprintf(err, errlen, "out of memory");
		return ALLOT_ENOMEM;
	}
	pthread_mutex_init(&au->mu, NULL);
	mbedtls_x509_crt_init(&au->ca);
	au->window_ms = o->window_ms > 0 ? o->window_ms :
	                                   ALLOT__AUTHN_WINDOW_MS;
	au->maps = copy_list(o->maps, o->nmaps);
	au->nmaps = o->nmaps;
	au->aud = copy_list(o->audiences, o->naudiences);
	au->naud = o->naudiences;
	au->replay = calloc(REPLAY_SLOTS, sizeof *au->replay);
	au->seed = allot__hash_seed();
	if (au->maps == NULL || au->aud == NULL || au->replay == NULL) {
		if (au->maps == NULL)
			au->nmaps = 0;
		if (au->aud == NULL)
			au->naud = 0;
		allot__authn_free(au);
		snprintf(err, errlen, "out of memory");
		return ALLOT_ENOMEM;
	}
	int rv = mbedtls_x509_crt_parse_file(&au->ca, o->ca_file);
	if (rv != 0 || au->ca.raw.p == NULL) {
		snprintf(err, errlen, "%s: cannot read the CA certificates",
		    o->ca_file);
		allot__authn_free(au);
		return ALLOT_EINVAL;
	}
	*ret = au;
	return ALLOT_OK;
}

/* ---- service mapping ---- */

/* The next '/'-separated segment of [*p, end). */
static bool
next_seg(const char **p, const char *end, const char **s, size_t *n)
{
	if (*p >= end)
		return false;
	const char *q = memchr(*p, '/', (size_t) (end - *p));
	if (q == NULL)
		q = end;
	*s = *p;
	*n = (size_t) (q - *p);
	*p = q < end ? q + 1 : end;
	return true;
}

static bool
match(const char *pat, const char *id, const char **svc, size_t *svclen)
{
	const char *pp = pat + 9, *pe = pat + strlen(pat);
	const char *ip = id + 9, *ie = id + strlen(id);
	const char *ps, *is;
	size_t pn, in;
	for (;;) {
		bool hp = next_seg(&pp, pe, &ps, &pn);
		bool hi = next_seg(&ip, ie, &is, &in);
		if (!hp || !hi)
			return hp == hi;
		if (pn == 9 && memcmp(ps, "{service}", 9) == 0) {
			*svc = is;
			*svclen = in;
		} else if (!(pn == 1 && ps[0] == '*') &&
		    (pn != in || memcmp(ps, is, pn) != 0)) {
			return false;
		}
	}
}

int
allot__authn_map(const allot__authn *au, const char *id, char *buf, size_t len)
{
	const char *svc = NULL;
	size_t n = 0;
	if (strncmp(id, "spiffe://", 9) != 0)
		return -1;
	if (au->nmaps == 0) {
		const char *slash = strrchr(id + 9, '/');
		if (slash == NULL)
			return -1; /* no path: nothing names a service */
		svc = slash + 1;
		n = strlen(svc);
	} else {
		size_t i = 0;
		while (i < au->nmaps && !match(au->maps[i], id, &svc, &n))
			i++;
		if (i == au->nmaps)
			return -1;
	}
	if (n == 0 || n >= len)
		return -1;
	memcpy(buf, svc, n);
	buf[n] = '\0';
	return 0;
}

/* ---- audience ---- */

static void
split_url(const char *u, size_t *scheme, const char **host, size_t *hlen,
    const char **port)
{
	const char *sep = strstr(u, "://");
	*scheme = sep != NULL ? (size_t) (sep - u) : 0;
	const char *h = sep != NULL ? sep + 3 : u;
	const char *colon = strrchr(h, ':');
	if (colon == NULL || strchr(colon, ']') != NULL)
		colon = h + strlen(h);
	*host = h;
	*hlen = (size_t) (colon - h);
	*port = *colon == ':' ? colon + 1 : "";
}

static bool
audience_ok(const allot__authn *au, const char *a)
{
	size_t as, ah;
	const char *ahost, *aport;
	split_url(a, &as, &ahost, &ah, &aport);
	for (size_t i = 0; i < au->naud; i++) {
		const char *u = au->aud[i];
		if (strcmp(u, a) == 0)
			return true;
		size_t us, uh;
		const char *uhost, *uport;
		split_url(u, &us, &uhost, &uh, &uport);
		bool any = (uh == 7 && memcmp(uhost, "0.0.0.0", 7) == 0) ||
		    (uh == 4 && memcmp(uhost, "[::]", 4) == 0) ||
		    (uh == 1 && uhost[0] == '*');
		if (any && us == as && memcmp(u, a, us) == 0 &&
		    strcmp(uport, aport) == 0 && aport[0] != '\0')
			return true;
	}
	return false;
}

/* ---- replay cache (under au->mu) ---- */

/* 1: seen, 0: recorded now, -1: no room. */
static int
replay_check(
    allot__authn *au, const unsigned char *nonce, int64_t now, int64_t until)
{
	uint64_t h = allot__hash(nonce, ALLOT__AUTHN_NONCE, au->seed);
	nonce_slot *free_slot = NULL;
	for (uint32_t i = 0; i < REPLAY_PROBE; i++) {
		nonce_slot *s = &au->replay[(h + i) & (REPLAY_SLOTS - 1)];
		bool live = s->until_ms > now;
		if (live && memcmp(s->nonce, nonce, ALLOT__AUTHN_NONCE) == 0)
			return 1;
		if (!live && free_slot == NULL)
			free_slot = s;
	}
	if (free_slot == NULL)
		return -1;
	free_slot->until_ms = until;
	memcpy(free_slot->nonce, nonce, ALLOT__AUTHN_NONCE);
	return 0;
}

/* ---- the check ---- */

/* The one URI SAN of `crt`, NUL-terminated into `buf`: 0, or -1 when it
 * has none, several, or one that is no valid SPIFFE ID. */
static int
spiffe_id(const mbedtls_x509_crt *crt, char *buf, size_t len)
{
	const char *uris[2];
	size_t lens[2];
	size_t n = 0;
	for (const mbedtls_x509_sequence *s = &crt->subject_alt_names;
	     s != NULL && s->buf.p != NULL; s = s->next) {
		int tag = s->buf.tag;
		if ((tag & MBEDTLS_ASN1_TAG_CLASS_MASK) !=
		        MBEDTLS_ASN1_CONTEXT_SPECIFIC ||
		    (tag & MBEDTLS_ASN1_TAG_VALUE_MASK) != SAN_URI)
			continue;
		if (n < 2) {
			uris[n] = (const char *) s->buf.p;
			lens[n] = s->buf.len;
		}
		n++;
	}
	if (n > 2)
		n = 2;
	return allot_identity_from_uri_sans(uris, lens, n, NULL, buf, len) ==
	        ALLOT_OK ?
	    0 :
	    -1;
}

static Allot__V1__Error__Code refuse(allot__metrics *m, allot__reject why,
    char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static Allot__V1__Error__Code
refuse(allot__metrics *m, allot__reject why, char *err, size_t errlen,
    const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	allot__metrics_reject(m, why, 1);
	return ALLOT__V1__ERROR__CODE__UNAUTHENTICATED;
}

static int
sha256(const unsigned char *in, size_t n, unsigned char out[32])
{
#if MBEDTLS_VERSION_MAJOR >= 3
	return mbedtls_sha256(in, n, out, 0);
#else
	return mbedtls_sha256_ret(in, n, out, 0);
#endif
}

/* Verify chain, usage, signature, audience and time; the leaf's SPIFFE
 * ID into `id`. Under au->mu. */
static Allot__V1__Error__Code
verify(allot__authn *au, const Allot__V1__Register *reg,
    const Allot__V1__IdentityProof *p, int64_t now, allot__metrics *m,
    char *id, size_t idlen, char *err, size_t errlen)
{
	const allot__reject bad = ALLOT__REJ_IDENTITY_INVALID;
	if (p->n_certs == 0 || p->n_certs > MAX_CERTS)
		return refuse(m, bad, err, errlen,
		    "identity proof with %zu certificates (1-%u)", p->n_certs,
		    MAX_CERTS);
	mbedtls_x509_crt chain;
	mbedtls_x509_crt_init(&chain);
	Allot__V1__Error__Code code = ALLOT__V1__ERROR__CODE__UNSPECIFIED;
	for (size_t i = 0; i < p->n_certs; i++) {
		if (p->certs[i].len > MAX_CERT_BYTES ||
		    mbedtls_x509_crt_parse_der(
		        &chain, p->certs[i].data, p->certs[i].len) != 0) {
			code = refuse(m, bad, err, errlen,
			    "identity certificate %zu does not parse", i);
			goto out;
		}
	}
	uint32_t flags = 0;
	if (mbedtls_x509_crt_verify(
	        &chain, &au->ca, NULL, NULL, &flags, NULL, NULL) != 0) {
		char info[256];
		mbedtls_x509_crt_verify_info(info, sizeof info, "", flags);
		for (char *c = info; *c != '\0'; c++)
			if (*c == '\n')
				*c = ' ';
		code = refuse(m, bad, err, errlen,
		    "identity certificate does not verify against the CA: "
		    "%s",
		    info);
		goto out;
	}
	if (mbedtls_x509_crt_check_key_usage(
	        &chain, MBEDTLS_X509_KU_DIGITAL_SIGNATURE) != 0 ||
	    mbedtls_x509_crt_check_extended_key_usage(&chain,
	        MBEDTLS_OID_CLIENT_AUTH,
	        MBEDTLS_OID_SIZE(MBEDTLS_OID_CLIENT_AUTH)) != 0) {
		code = refuse(m, bad, err, errlen,
		    "identity certificate is not for client authentication "
		    "(key usage digitalSignature, extended key usage "
		    "clientAuth)");
		goto out;
	}
	if (p->audience == NULL || !audience_ok(au, p->audience)) {
		code = refuse(m, bad, err, errlen,
		    "identity proof is for \"%.128s\", not this coordinator "
		    "(see --identity-audience)",
		    p->audience != NULL ? p->audience : "");
		goto out;
	}
	int64_t t = p->time_ms > (uint64_t) INT64_MAX ? INT64_MAX :
	                                                (int64_t) p->time_ms;
	if (t < now - au->window_ms || t > now + au->window_ms) {
		code = refuse(m, bad, err, errlen,
		    "identity proof signed at %" PRId64 " ms, %" PRId64
		    " ms from this coordinator's clock (at most %" PRId64
		    "): check the clocks",
		    t, t - now, au->window_ms);
		goto out;
	}
	if (p->nonce.len != ALLOT__AUTHN_NONCE) {
		code = refuse(m, bad, err, errlen,
		    "identity nonce of %zu bytes (want %u)", p->nonce.len,
		    ALLOT__AUTHN_NONCE);
		goto out;
	}
	unsigned char msg[ALLOT__AUTHN_MSG_MAX], hash[32];
	size_t n = allot__authn_msg(msg, reg->replica_id, reg->service,
	    p->audience, p->time_ms, p->nonce.data);
	if (n == 0 || sha256(msg, n, hash) != 0 ||
	    mbedtls_pk_verify(&chain.pk, MBEDTLS_MD_SHA256, hash, sizeof hash,
	        p->signature.data, p->signature.len) != 0) {
		code = refuse(m, bad, err, errlen,
		    "identity signature does not verify with the "
		    "certificate's key");
		goto out;
	}
	if (spiffe_id(&chain, id, idlen) != 0) {
		code = refuse(m, bad, err, errlen,
		    "identity certificate has no SPIFFE ID (exactly one "
		    "spiffe:// URI SAN)");
		goto out;
	}
out:
	mbedtls_x509_crt_free(&chain);
	return code;
}

Allot__V1__Error__Code
allot__authn_check(allot__authn *au, const Allot__V1__Register *reg,
    allot__metrics *m, char *err, size_t errlen)
{
	const Allot__V1__IdentityProof *p = reg->identity;
	if (p == NULL)
		return refuse(m, ALLOT__REJ_IDENTITY_MISSING, err, errlen,
		    "Register without an identity proof: this coordinator "
		    "requires one (agent with tls+tcp:// and "
		    "tls_cert_key_file)");
	char id[ALLOT_SPIFFE_ID_MAX + 1];
	int64_t now = allot__wall_ms();
	pthread_mutex_lock(&au->mu);
	Allot__V1__Error__Code code = verify(
	    au, reg, p, now, m, id, sizeof id, err, errlen);
	int seen = 0;
	if (code == ALLOT__V1__ERROR__CODE__UNSPECIFIED) {
		int64_t t = (int64_t) p->time_ms;
		seen = replay_check(au, p->nonce.data, now,
		    (t > now ? t : now) + au->window_ms + 1);
	}
	pthread_mutex_unlock(&au->mu);
	if (code != ALLOT__V1__ERROR__CODE__UNSPECIFIED)
		return code;
	if (seen > 0)
		return refuse(m, ALLOT__REJ_IDENTITY_REPLAY, err, errlen,
		    "identity proof of %.*s was used before (replayed "
		    "Register)",
		    (int) strnlen(id, 256), id);
	if (seen < 0) {
		snprintf(err, errlen,
		    "too many Registers to remember; try again later");
		allot__metrics_reject(m, ALLOT__REJ_CAPACITY, 1);
		return ALLOT__V1__ERROR__CODE__RATE_LIMITED;
	}
	char svc[256];
	if (allot__authn_map(au, id, svc, sizeof svc) != 0)
		return refuse(m, ALLOT__REJ_IDENTITY_MISMATCH, err, errlen,
		    "certificate identity %s names no service (see "
		    "--identity-map)",
		    id);
	if (reg->service == NULL || strcmp(svc, reg->service) != 0)
		return refuse(m, ALLOT__REJ_IDENTITY_MISMATCH, err, errlen,
		    "certificate identity %s is service \"%s\", not \"%.64s\"",
		    id, svc, reg->service != NULL ? reg->service : "");
	return ALLOT__V1__ERROR__CODE__UNSPECIFIED;
}
