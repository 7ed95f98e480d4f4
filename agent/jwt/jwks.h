/* SPDX-License-Identifier: MIT */
/*
 * A JWKS file (RFC 7517) read into the keys a verifier can use: each RSA
 * or EC public key as the PEM libjwt verifies with, each "oct" key as its
 * secret. Keys for another use than signing ("use" other than "sig"), of
 * another type or curve, or too short for their algorithm are left out,
 * and said why; a file with none left is an error.
 */
#ifndef ALLOT_JWT_JWKS_H
#define ALLOT_JWT_JWKS_H

#include <stddef.h>

#include <jwt.h>

#define ALLOT__JWKS_FILE_MAX (1u << 20) /* bytes */
#define ALLOT__JWKS_KEYS_MAX 64
#define ALLOT__JWK_KID_MAX 128

typedef enum allot__jwk_kty {
	ALLOT__JWK_RSA,
	ALLOT__JWK_EC,
	ALLOT__JWK_OCT,
} allot__jwk_kty;

typedef struct allot__jwk {
	char kid[ALLOT__JWK_KID_MAX + 1]; /* "" when the JWK has none */
	allot__jwk_kty kty;
	jwt_alg_t alg; /* the JWK's "alg"; JWT_ALG_NONE: any of its family */
	unsigned ec_bits; /* EC: 256, 384 or 521 */
	unsigned char *key; /* PEM (RSA, EC) or the secret (oct) */
	size_t len; /* bytes of `key`, no NUL counted */
} allot__jwk;

typedef struct allot__jwks {
	allot__jwk *keys;
	size_t n;
} allot__jwks;

/* Reads `path`. On failure `why` says what (a line for an operator) and
 * *out is left empty.
 * @return ALLOT_OK; ALLOT_ENOENT, ALLOT_EIO: the file; ALLOT_ECONFIG: not
 *         a JWKS, or no usable key; ALLOT_ENOMEM. */
int allot__jwks_load(
    const char *path, allot__jwks *out, char *why, size_t why_len);
void allot__jwks_free(allot__jwks *ks);

/* Whether key `k` may verify a token signed with `alg`: its family (RS,
 * ES with its curve, HS with a secret at least the hash's size) and its
 * own "alg" when it names one. */
int allot__jwk_fits(const allot__jwk *k, jwt_alg_t alg);

/* Decodes base64url (RFC 4648 §5, no padding) into a malloc'd buffer,
 * NUL-terminated (not counted in *ret_len).
 * @return ALLOT_OK; ALLOT_EPROTO: not base64url; ALLOT_ENOMEM. */
int allot__b64url_decode(
    const char *s, size_t len, unsigned char **ret, size_t *ret_len);

#endif /* ALLOT_JWT_JWKS_H */
