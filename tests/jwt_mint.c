/* SPDX-License-Identifier: MIT */
/* Keys, JWKS files and tokens for the tests (jwt_mint.h). */
#include "jwt_mint.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <gnutls/abstract.h>
#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>

char *
mint_b64url(const void *data, size_t len)
{
	gnutls_datum_t in = { (unsigned char *) data, (unsigned) len };
	gnutls_datum_t out = { 0 };
	char *s;
	size_t n = 0;

	ck_assert_int_eq(gnutls_base64_encode2(&in, &out), 0);
	s = malloc(out.size + 1u);
	ck_assert_ptr_nonnull(s);
	for (unsigned i = 0; i < out.size; i++) {
		char c = (char) out.data[i];

		if (c == '=' || c == '\n' || c == '\r')
			continue;
		s[n++] = c == '+' ? '-' : c == '/' ? '_' : c;
	}
	s[n] = '\0';
	gnutls_free(out.data);
	return s;
}

/* An unsigned big-endian integer without its sign byte, at least
 * `width` bytes (an EC coordinate keeps its field's length). */
static char *
b64_int(const gnutls_datum_t *d, size_t width)
{
	size_t skip = 0;

	while (
	    skip + 1 < d->size && d->size - skip > width && d->data[skip] == 0)
		skip++;
	return mint_b64url(d->data + skip, d->size - skip);
}

static void
private_pem(mint_key *k, gnutls_x509_privkey_t x)
{
	gnutls_datum_t pem = { 0 }, pub = { 0 };
	gnutls_privkey_t pk;
	gnutls_pubkey_t pu;

	ck_assert_int_eq(
	    gnutls_x509_privkey_export2(x, GNUTLS_X509_FMT_PEM, &pem), 0);
	k->secret = malloc(pem.size + 1u);
	memcpy(k->secret, pem.data, pem.size);
	k->secret[pem.size] = '\0';
	k->len = pem.size;
	ck_assert_int_eq(gnutls_privkey_init(&pk), 0);
	ck_assert_int_eq(gnutls_privkey_import_x509(pk, x, 0), 0);
	ck_assert_int_eq(gnutls_pubkey_init(&pu), 0);
	ck_assert_int_eq(gnutls_pubkey_import_privkey(pu, pk, 0, 0), 0);
	ck_assert_int_eq(
	    gnutls_pubkey_export2(pu, GNUTLS_X509_FMT_PEM, &pub), 0);
	k->public_pem = strndup((char *) pub.data, pub.size);
	gnutls_free(pem.data);
	gnutls_free(pub.data);
	gnutls_pubkey_deinit(pu);
	gnutls_privkey_deinit(pk);
}

void
mint_rsa(mint_key *k, const char *kid, unsigned bits)
{
	gnutls_x509_privkey_t x;
	gnutls_datum_t m, e;
	char *n64, *e64;

	memset(k, 0, sizeof *k);
	snprintf(k->kid, sizeof k->kid, "%s", kid);
	k->kind = 'R';
	ck_assert_int_eq(gnutls_x509_privkey_init(&x), 0);
	ck_assert_int_eq(
	    gnutls_x509_privkey_generate(x, GNUTLS_PK_RSA, bits, 0), 0);
	private_pem(k, x);
	ck_assert_int_eq(gnutls_x509_privkey_export_rsa_raw(
	                     x, &m, &e, NULL, NULL, NULL, NULL),
	    0);
	n64 = b64_int(&m, 1);
	e64 = b64_int(&e, 1);
	ck_assert_int_gt(asprintf(&k->jwk,
	                     "{\"kty\":\"RSA\",\"kid\":\"%s\",\"use\":\"sig\","
	                     "\"n\":\"%s\",\"e\":\"%s\"}",
	                     kid, n64, e64),
	    0);
	free(n64);
	free(e64);
	gnutls_free(m.data);
	gnutls_free(e.data);
	gnutls_x509_privkey_deinit(x);
}

void
mint_ec(mint_key *k, const char *kid)
{
	gnutls_x509_privkey_t x;
	gnutls_ecc_curve_t curve;
	gnutls_datum_t px, py, d;
	char *x64, *y64;

	memset(k, 0, sizeof *k);
	snprintf(k->kid, sizeof k->kid, "%s", kid);
	k->kind = 'E';
	ck_assert_int_eq(gnutls_x509_privkey_init(&x), 0);
	ck_assert_int_eq(
	    gnutls_x509_privkey_generate(x, GNUTLS_PK_EC,
	        GNUTLS_CURVE_TO_BITS(GNUTLS_ECC_CURVE_SECP256R1), 0),
	    0);
	private_pem(k, x);
	ck_assert_int_eq(
	    gnutls_x509_privkey_export_ecc_raw(x, &curve, &px, &py, &d), 0);
	x64 = b64_int(&px, 32);
	y64 = b64_int(&py, 32);
	ck_assert_int_gt(
	    asprintf(&k->jwk,
	        "{\"kty\":\"EC\",\"kid\":\"%s\",\"crv\":\"P-256\","
	        "\"x\":\"%s\",\"y\":\"%s\"}",
	        kid, x64, y64),
	    0);
	free(x64);
	free(y64);
	gnutls_free(px.data);
	gnutls_free(py.data);
	gnutls_free(d.data);
	gnutls_x509_privkey_deinit(x);
}

void
mint_hmac(mint_key *k, const char *kid, size_t len)
{
	char *k64;

	memset(k, 0, sizeof *k);
	snprintf(k->kid, sizeof k->kid, "%s", kid);
	k->kind = 'H';
	k->secret = malloc(len);
	k->len = len;
	ck_assert_int_eq(gnutls_rnd(GNUTLS_RND_RANDOM, k->secret, len), 0);
	k64 = mint_b64url(k->secret, len);
	ck_assert_int_gt(
	    asprintf(&k->jwk, "{\"kty\":\"oct\",\"kid\":\"%s\",\"k\":\"%s\"}",
	        kid, k64),
	    0);
	free(k64);
}

void
mint_free(mint_key *k)
{
	free(k->secret);
	free(k->public_pem);
	free(k->jwk);
	memset(k, 0, sizeof *k);
}

void
mint_jwks(const char *path, mint_key *const *keys, size_t n)
{
	char tmp[512];
	FILE *f;

	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	f = fopen(tmp, "w");
	ck_assert_ptr_nonnull(f);
	fputs("{\"keys\":[", f);
	for (size_t i = 0; i < n; i++)
		fprintf(f, "%s%s", i > 0 ? "," : "", keys[i]->jwk);
	fputs("]}\n", f);
	ck_assert_int_eq(fclose(f), 0);
	ck_assert_int_eq(rename(tmp, path), 0);
}

char *
mint_token(const mint_key *k, jwt_alg_t alg, const char *claims)
{
	jwt_t *jwt;
	char *s;

	ck_assert_int_eq(jwt_new(&jwt), 0);
	ck_assert_int_eq(jwt_add_grants_json(jwt, claims), 0);
	if (k->kid[0] != '\0')
		ck_assert_int_eq(jwt_add_header(jwt, "kid", k->kid), 0);
	ck_assert_int_eq(jwt_set_alg(jwt, alg, k->secret, (int) k->len), 0);
	s = jwt_encode_str(jwt);
	ck_assert_ptr_nonnull(s);
	jwt_free(jwt);
	return s;
}

char *
mint_raw(const char *header, const char *claims, const char *sig)
{
	char *h = mint_b64url(header, strlen(header));
	char *c = mint_b64url(claims, strlen(claims));
	char *s;

	ck_assert_int_gt(asprintf(&s, "%s.%s.%s", h, c, sig), 0);
	free(h);
	free(c);
	return s;
}
