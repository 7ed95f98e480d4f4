/* SPDX-License-Identifier: MIT */
/*
 * JWKS files into keys (jwks.h). json-c reads the JSON; GnuTLS turns an
 * RSA modulus and exponent, or an EC point, into the SubjectPublicKeyInfo
 * PEM that libjwt verifies with.
 */
#include "jwks.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <gnutls/abstract.h>
#include <gnutls/gnutls.h>
#include <json-c/json.h>

#include <allot/allot.h>

static void
say(char *why, size_t len, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, len, fmt, ap);
	va_end(ap);
}

int
allot__b64url_decode(
    const char *s, size_t len, unsigned char **ret, size_t *ret_len)
{
	size_t pad = (4 - len % 4) % 4;
	gnutls_datum_t in, out = { 0 };
	char *std;
	int rv;

	if (len % 4 == 1)
		return ALLOT_EPROTO;
	std = malloc(len + pad + 1);
	if (std == NULL)
		return ALLOT_ENOMEM;
	for (size_t i = 0; i < len; i++) {
		char c = s[i];

		if (c == '-')
			c = '+';
		else if (c == '_')
			c = '/';
		else if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
		             (c >= '0' && c <= '9'))) {
			free(std);
			return ALLOT_EPROTO;
		}
		std[i] = c;
	}
	memset(std + len, '=', pad);
	std[len + pad] = '\0';
	in.data = (unsigned char *) std;
	in.size = (unsigned) (len + pad);
	rv = len == 0 ? 0 : gnutls_base64_decode2(&in, &out);
	free(std);
	if (rv == GNUTLS_E_MEMORY_ERROR)
		return ALLOT_ENOMEM;
	if (rv < 0)
		return ALLOT_EPROTO;
	*ret = malloc(out.size + 1u);
	if (*ret == NULL) {
		gnutls_free(out.data);
		return ALLOT_ENOMEM;
	}
	if (out.size > 0)
		memcpy(*ret, out.data, out.size);
	(*ret)[out.size] = '\0';
	*ret_len = out.size;
	gnutls_free(out.data);
	return ALLOT_OK;
}

/* Member `name` of `o` as a string, NULL when absent or not a string. */
static const char *
member(json_object *o, const char *name)
{
	json_object *v;

	if (!json_object_object_get_ex(o, name, &v) ||
	    !json_object_is_type(v, json_type_string))
		return NULL;
	return json_object_get_string(v);
}

/* Member `name`, base64url-decoded into `d` (gnutls_free it). */
static int
member_bytes(json_object *o, const char *name, gnutls_datum_t *d)
{
	const char *s = member(o, name);
	unsigned char *b;
	size_t n;
	int rv;

	if (s == NULL)
		return ALLOT_ECONFIG;
	rv = allot__b64url_decode(s, strlen(s), &b, &n);
	if (rv != ALLOT_OK)
		return rv == ALLOT_ENOMEM ? rv : ALLOT_ECONFIG;
	d->data = gnutls_malloc(n + 1);
	if (d->data == NULL) {
		free(b);
		return ALLOT_ENOMEM;
	}
	memcpy(d->data, b, n + 1);
	d->size = (unsigned) n;
	free(b);
	return n > 0 ? ALLOT_OK : ALLOT_ECONFIG;
}

static int
curve_of(const char *crv, gnutls_ecc_curve_t *curve, unsigned *bits)
{
	static const struct {
		const char *name;
		gnutls_ecc_curve_t curve;
		unsigned bits;
	} curves[] = {
		{ "P-256", GNUTLS_ECC_CURVE_SECP256R1, 256 },
		{ "P-384", GNUTLS_ECC_CURVE_SECP384R1, 384 },
		{ "P-521", GNUTLS_ECC_CURVE_SECP521R1, 521 },
	};

	for (size_t i = 0; crv != NULL && i < 3; i++)
		if (strcmp(crv, curves[i].name) == 0) {
			*curve = curves[i].curve;
			*bits = curves[i].bits;
			return ALLOT_OK;
		}
	return ALLOT_ECONFIG;
}

/* An RSA or EC JWK as PEM, into k->key. */
static int
public_pem(json_object *o, allot__jwk *k)
{
	gnutls_datum_t a = { 0 }, b = { 0 }, pem = { 0 };
	gnutls_pubkey_t pub = NULL;
	gnutls_ecc_curve_t curve = GNUTLS_ECC_CURVE_INVALID;
	unsigned bits = 0;
	int rv;

	if (k->kty == ALLOT__JWK_EC &&
	    curve_of(member(o, "crv"), &curve, &k->ec_bits) != ALLOT_OK)
		return ALLOT_ECONFIG;
	rv = member_bytes(o, k->kty == ALLOT__JWK_RSA ? "n" : "x", &a);
	if (rv == ALLOT_OK)
		rv = member_bytes(o, k->kty == ALLOT__JWK_RSA ? "e" : "y", &b);
	if (rv == ALLOT_OK && gnutls_pubkey_init(&pub) < 0)
		rv = ALLOT_ENOMEM;
	if (rv == ALLOT_OK) {
		int g = k->kty == ALLOT__JWK_RSA ?
		    gnutls_pubkey_import_rsa_raw(pub, &a, &b) :
		    gnutls_pubkey_import_ecc_raw(pub, curve, &a, &b);

		if (g < 0 ||
		    gnutls_pubkey_export2(pub, GNUTLS_X509_FMT_PEM, &pem) < 0)
			rv = ALLOT_ECONFIG;
	}
	if (rv == ALLOT_OK && k->kty == ALLOT__JWK_RSA &&
	    (gnutls_pubkey_get_pk_algorithm(pub, &bits) < 0 || bits < 2048))
		rv = ALLOT_ECONFIG; /* RFC 7518 §3.3: 2048 bits or more */
	if (rv == ALLOT_OK) {
		k->key = malloc(pem.size + 1u);
		if (k->key == NULL)
			rv = ALLOT_ENOMEM;
		else {
			memcpy(k->key, pem.data, pem.size);
			k->key[pem.size] = '\0';
			k->len = pem.size;
		}
	}
	gnutls_free(a.data);
	gnutls_free(b.data);
	gnutls_free(pem.data);
	gnutls_pubkey_deinit(pub);
	return rv;
}

/* One JWK into `k`. ALLOT_ECONFIG: not usable (`why` says why). */
static int
one_key(json_object *o, allot__jwk *k, char *why, size_t why_len)
{
	const char *kty = member(o, "kty"), *kid = member(o, "kid");
	const char *use = member(o, "use"), *alg = member(o, "alg");
	int rv;

	memset(k, 0, sizeof *k);
	if (kid != NULL && strlen(kid) > ALLOT__JWK_KID_MAX) {
		say(why, why_len, "its \"kid\" is longer than %d bytes",
		    ALLOT__JWK_KID_MAX);
		return ALLOT_ECONFIG;
	}
	snprintf(k->kid, sizeof k->kid, "%s", kid != NULL ? kid : "");
	if (use != NULL && strcmp(use, "sig") != 0) {
		say(why, why_len, "\"use\" is \"%s\", not \"sig\"", use);
		return ALLOT_ECONFIG;
	}
	if (kty != NULL && strcmp(kty, "RSA") == 0)
		k->kty = ALLOT__JWK_RSA;
	else if (kty != NULL && strcmp(kty, "EC") == 0)
		k->kty = ALLOT__JWK_EC;
	else if (kty != NULL && strcmp(kty, "oct") == 0)
		k->kty = ALLOT__JWK_OCT;
	else {
		say(why, why_len, "\"kty\" %s%s%s is not RSA, EC or oct",
		    kty ? "\"" : "", kty ? kty : "missing", kty ? "\"" : "");
		return ALLOT_ECONFIG;
	}
	k->alg = JWT_ALG_NONE;
	if (alg != NULL) {
		k->alg = jwt_str_alg(alg);
		if (k->alg == JWT_ALG_NONE || k->alg == JWT_ALG_INVAL) {
			say(why, why_len,
			    "\"alg\" \"%s\" is not one of RS, "
			    "ES or HS 256/384/512",
			    alg);
			return ALLOT_ECONFIG;
		}
	}
	if (k->kty == ALLOT__JWK_OCT) {
		gnutls_datum_t d = { 0 };

		rv = member_bytes(o, "k", &d);
		if (rv == ALLOT_OK) {
			k->key = malloc(d.size + 1u);
			if (k->key == NULL)
				rv = ALLOT_ENOMEM;
			else {
				memcpy(k->key, d.data, d.size + 1u);
				k->len = d.size;
			}
		}
		gnutls_free(d.data);
		if (rv == ALLOT_OK && k->len < 32)
			rv = ALLOT_ECONFIG; /* shorter than any HS hash */
	} else
		rv = public_pem(o, k);
	if (rv == ALLOT_ECONFIG)
		say(why, why_len,
		    "its key material is missing or invalid "
		    "(RSA: n, e of 2048 bits or more; EC: crv "
		    "P-256/384/521, x, y; oct: k of 32 bytes or "
		    "more)");
	if (rv == ALLOT_OK && k->alg != JWT_ALG_NONE &&
	    !allot__jwk_fits(k, k->alg)) {
		say(why, why_len, "\"alg\" \"%s\" does not fit its key", alg);
		rv = ALLOT_ECONFIG;
	}
	if (rv != ALLOT_OK) {
		free(k->key);
		k->key = NULL;
	}
	return rv;
}

int
allot__jwk_fits(const allot__jwk *k, jwt_alg_t alg)
{
	if (k->alg != JWT_ALG_NONE && k->alg != alg)
		return 0;
	switch (alg) {
	case JWT_ALG_RS256:
	case JWT_ALG_RS384:
	case JWT_ALG_RS512: return k->kty == ALLOT__JWK_RSA;
	case JWT_ALG_ES256:
		return k->kty == ALLOT__JWK_EC && k->ec_bits == 256;
	case JWT_ALG_ES384:
		return k->kty == ALLOT__JWK_EC && k->ec_bits == 384;
	case JWT_ALG_ES512:
		return k->kty == ALLOT__JWK_EC && k->ec_bits == 521;
	case JWT_ALG_HS256: /* RFC 7518 §3.2: a key the hash's size or more */
		return k->kty == ALLOT__JWK_OCT && k->len >= 32;
	case JWT_ALG_HS384: return k->kty == ALLOT__JWK_OCT && k->len >= 48;
	case JWT_ALG_HS512: return k->kty == ALLOT__JWK_OCT && k->len >= 64;
	default: return 0;
	}
}

/* The file's bytes, NUL-terminated. */
static int
read_all(const char *path, char **ret, char *why, size_t why_len)
{
	FILE *f = fopen(path, "rb");
	struct stat st;
	size_t n;
	char *buf;

	if (f == NULL) {
		say(why, why_len, "%s: %s", path, strerror(errno));
		return errno == ENOENT ? ALLOT_ENOENT : ALLOT_EIO;
	}
	if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) ||
	    st.st_size > (off_t) ALLOT__JWKS_FILE_MAX) {
		say(why, why_len, "%s: not a regular file of at most %u bytes",
		    path, ALLOT__JWKS_FILE_MAX);
		fclose(f);
		return ALLOT_EIO;
	}
	buf = malloc((size_t) st.st_size + 1);
	if (buf == NULL) {
		fclose(f);
		return ALLOT_ENOMEM;
	}
	n = fread(buf, 1, (size_t) st.st_size, f);
	fclose(f);
	buf[n] = '\0';
	*ret = buf;
	return ALLOT_OK;
}

int
allot__jwks_load(const char *path, allot__jwks *out, char *why, size_t why_len)
{
	json_object *root = NULL, *keys;
	char *text = NULL, kwhy[160];
	allot__jwks ks = { 0 };
	size_t n;
	int rv;

	memset(out, 0, sizeof *out);
	rv = read_all(path, &text, why, why_len);
	if (rv != ALLOT_OK)
		return rv;
	root = json_tokener_parse(text);
	free(text);
	if (root == NULL || !json_object_object_get_ex(root, "keys", &keys) ||
	    !json_object_is_type(keys, json_type_array)) {
		say(why, why_len,
		    "%s: not a JWKS (a JSON object with a "
		    "\"keys\" array)",
		    path);
		json_object_put(root);
		return ALLOT_ECONFIG;
	}
	n = json_object_array_length(keys);
	if (n > ALLOT__JWKS_KEYS_MAX) {
		say(why, why_len, "%s: %zu keys, at most %d", path, n,
		    ALLOT__JWKS_KEYS_MAX);
		json_object_put(root);
		return ALLOT_ECONFIG;
	}
	ks.keys = calloc(n > 0 ? n : 1, sizeof *ks.keys);
	if (ks.keys == NULL) {
		json_object_put(root);
		return ALLOT_ENOMEM;
	}
	why[0] = '\0';
	for (size_t i = 0; i < n && rv == ALLOT_OK; i++) {
		json_object *o = json_object_array_get_idx(keys, i);

		if (!json_object_is_type(o, json_type_object)) {
			size_t at = strlen(why);

			say(why + at, why_len - at,
			    "%s%s: key %zu is not an object",
			    at > 0 ? "; " : "", path, i);
			continue;
		}
		rv = one_key(o, &ks.keys[ks.n], kwhy, sizeof kwhy);
		if (rv == ALLOT_OK)
			ks.n++;
		else if (rv == ALLOT_ECONFIG) {
			size_t at = strlen(why);

			say(why + at, why_len - at,
			    "%s%s: key %zu left out: %s", at > 0 ? "; " : "",
			    path, i, kwhy);
			rv = ALLOT_OK;
		}
	}
	json_object_put(root);
	if (rv == ALLOT_OK && ks.n == 0) {
		if (why[0] == '\0')
			say(why, why_len, "%s: no keys", path);
		rv = ALLOT_ECONFIG;
	}
	if (rv != ALLOT_OK) {
		allot__jwks_free(&ks);
		return rv;
	}
	*out = ks;
	return ALLOT_OK;
}

void
allot__jwks_free(allot__jwks *ks)
{
	for (size_t i = 0; i < ks->n; i++)
		free(ks->keys[i].key);
	free(ks->keys);
	ks->keys = NULL;
	ks->n = 0;
}
