/* SPDX-License-Identifier: MIT */
/*
 * Register identity proofs, signed with mbedTLS (sign.h): the library nng
 * already uses for its TLS transport, so the agent gains no dependency.
 * SHA-256 over the canonical message of common/authn_msg.h, signed with
 * the certificate's key (ECDSA or RSA PKCS#1 v1.5, whichever it is).
 */
#include "sign.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <mbedtls/pk.h>
#include <mbedtls/sha256.h>
#include <mbedtls/version.h>
#include <mbedtls/x509_crt.h>

#include <allot/allot.h>

#include "authn_msg.h"
#include "clock.h"

#define MAX_CERTS 8

struct allot__signer {
	mbedtls_x509_crt chain;
	mbedtls_pk_context key;
	char *audience;
	size_t ncerts;
	ProtobufCBinaryData certs[MAX_CERTS];
	unsigned char nonce[ALLOT__AUTHN_NONCE];
	unsigned char sig[MBEDTLS_PK_SIGNATURE_MAX_SIZE];
	Allot__V1__IdentityProof proof;
};

/* mbedTLS's RNG callback, from the kernel's CSPRNG. */
static int
rng(void *arg, unsigned char *buf, size_t len)
{
	(void) arg;
	while (len > 0) {
		ssize_t n = getrandom(buf, len, 0);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		buf += n;
		len -= (size_t) n;
	}
	return 0;
}

void
allot__signer_free(allot__signer *sg)
{
	if (sg == NULL)
		return;
	mbedtls_x509_crt_free(&sg->chain);
	mbedtls_pk_free(&sg->key);
	free(sg->audience);
	free(sg);
}

int
allot__signer_new(const char *pem_file, const char *audience, char *err,
    size_t errlen, allot__signer **ret)
{
	allot__signer *sg = calloc(1, sizeof *sg);
	if (sg == NULL) {
		snprintf(err, errlen, "out of memory");
		return ALLOT_ENOMEM;
	}
	mbedtls_x509_crt_init(&sg->chain);
	mbedtls_pk_init(&sg->key);
	allot__v1__identity_proof__init(&sg->proof);
	sg->audience = strdup(audience);
	if (sg->audience == NULL) {
		allot__signer_free(sg);
		snprintf(err, errlen, "out of memory");
		return ALLOT_ENOMEM;
	}
	int rv = mbedtls_x509_crt_parse_file(&sg->chain, pem_file);
	if (rv != 0 || sg->chain.raw.p == NULL) {
		snprintf(
		    err, errlen, "%s: no certificate could be read", pem_file);
		goto fail;
	}
#if MBEDTLS_VERSION_MAJOR >= 3
	rv = mbedtls_pk_parse_keyfile(&sg->key, pem_file, NULL, rng, NULL);
#else
	rv = mbedtls_pk_parse_keyfile(&sg->key, pem_file, NULL);
#endif
	if (rv != 0) {
		snprintf(
		    err, errlen, "%s: no private key could be read", pem_file);
		goto fail;
	}
#if MBEDTLS_VERSION_MAJOR >= 3
	rv = mbedtls_pk_check_pair(&sg->chain.pk, &sg->key, rng, NULL);
#else
	rv = mbedtls_pk_check_pair(&sg->chain.pk, &sg->key);
#endif
	if (rv != 0) {
		snprintf(err, errlen,
		    "%s: the private key does not belong to the first "
		    "certificate",
		    pem_file);
		goto fail;
	}
	for (const mbedtls_x509_crt *c = &sg->chain;
	     c != NULL && c->raw.p != NULL && sg->ncerts < MAX_CERTS;
	     c = c->next) {
		sg->certs[sg->ncerts].data = c->raw.p;
		sg->certs[sg->ncerts].len = c->raw.len;
		sg->ncerts++;
	}
	*ret = sg;
	return ALLOT_OK;
fail:
	allot__signer_free(sg);
	return ALLOT_EINVAL;
}

int
allot__signer_sign(allot__signer *sg, Allot__V1__Register *reg)
{
	unsigned char msg[ALLOT__AUTHN_MSG_MAX], hash[32];
	uint64_t t = (uint64_t) allot__wall_ms();
	if (rng(NULL, sg->nonce, sizeof sg->nonce) != 0)
		return ALLOT_EIO;
	size_t n = allot__authn_msg(
	    msg, reg->replica_id, reg->service, sg->audience, t, sg->nonce);
	if (n == 0)
		return ALLOT_EINVAL;
	size_t siglen = 0;
	int rv;
#if MBEDTLS_VERSION_MAJOR >= 3
	rv = mbedtls_sha256(msg, n, hash, 0);
	if (rv == 0)
		rv = mbedtls_pk_sign(&sg->key, MBEDTLS_MD_SHA256, hash,
		    sizeof hash, sg->sig, sizeof sg->sig, &siglen, rng, NULL);
#else
	rv = mbedtls_sha256_ret(msg, n, hash, 0);
	if (rv == 0)
		rv = mbedtls_pk_sign(&sg->key, MBEDTLS_MD_SHA256, hash,
		    sizeof hash, sg->sig, &siglen, rng, NULL);
#endif
	if (rv != 0)
		return ALLOT_EIO;
	allot__v1__identity_proof__init(&sg->proof);
	sg->proof.n_certs = sg->ncerts;
	sg->proof.certs = sg->certs;
	sg->proof.audience = sg->audience;
	sg->proof.time_ms = t;
	sg->proof.nonce.data = sg->nonce;
	sg->proof.nonce.len = sizeof sg->nonce;
	sg->proof.signature.data = sg->sig;
	sg->proof.signature.len = siglen;
	reg->identity = &sg->proof;
	return ALLOT_OK;
}
