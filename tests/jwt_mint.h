/* SPDX-License-Identifier: MIT */
/*
 * Signed service tokens for the tests, made the way an issuer makes
 * them: GnuTLS generates the keys, libjwt signs, and the public halves
 * are written as a JWKS file (replaced by rename, as a key rotation
 * job would). Shared by test_jwt.c and the service suite.
 */
#ifndef ALLOT_TESTS_JWT_MINT_H
#define ALLOT_TESTS_JWT_MINT_H

#include <stdbool.h>
#include <stddef.h>

#include <jwt.h>

typedef struct mint_key {
	char kid[32]; /* "" for none in the JWK */
	char kind; /* 'R' RSA, 'E' EC P-256, 'H' HMAC secret */
	unsigned char *secret; /* 'R', 'E': the private key's PEM */
	size_t len;
	char *public_pem; /* 'R', 'E' */
	char *jwk; /* its public JWK, a JSON object */
} mint_key;

void mint_rsa(mint_key *k, const char *kid, unsigned bits);
void mint_ec(mint_key *k, const char *kid);
void mint_hmac(mint_key *k, const char *kid, size_t len);
void mint_free(mint_key *k);

/* Writes the public keys as a JWKS to `path` (through a rename). */
void mint_jwks(const char *path, mint_key *const *keys, size_t n);

/* A token signed by `k` with `alg`, its header naming `k`'s kid (when
 * not ""), carrying `claims` (a JSON object). malloc'd. */
char *mint_token(const mint_key *k, jwt_alg_t alg, const char *claims);

/* A token with the given header and claims, and `sig` as its signature,
 * none of it signed: for the malformed and "none" cases. malloc'd. */
char *mint_raw(const char *header, const char *claims, const char *sig);

/* base64url, no padding. malloc'd. */
char *mint_b64url(const void *data, size_t len);

#endif
