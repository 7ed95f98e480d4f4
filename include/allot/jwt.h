/* SPDX-License-Identifier: MIT */
/*
 * liballot-jwt: a caller's identity from a signed service token (a JWT,
 * RFC 7519), for services whose callers do not present a client
 * certificate. The verifier checks the token's signature against the
 * public keys its issuer publishes (a JWKS file, RFC 7517, re-read when it
 * changes), then its issuer, audience, expiry and not-before (with a
 * bounded clock skew), and gives the identity from one claim ("sub" by
 * default) and optionally a tenant from another. A token that fails any
 * check gives no identity and no quota: the service answers 401, never
 * charges a bucket for it.
 *
 * It is a library of its own, beside liballot: it links libjwt and GnuTLS,
 * which a service keyed on mTLS identities does not need in its process
 * (allot/identity.h). Link with `pkg-config --libs allot-jwt`.
 *
 * Accepted algorithms: RS256/384/512 (JWK "kty": "RSA"), ES256/384/512
 * ("EC", curves P-256, P-384, P-521) and HS256/384/512 ("oct", a shared
 * secret). A key is only ever used with its own family, and with its
 * "alg" when the JWK names one; "none" is always refused. A token naming a
 * key ("kid") is checked against that key only; one without "kid" against
 * each key of its issuer that fits its algorithm.
 *
 * Threads: allot_jwt_verify() and allot_jwt_verifier_stats() may be
 * called from any number of threads at once; create, reload and destroy
 * from one.
 */
#ifndef ALLOT_JWT_H
#define ALLOT_JWT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <allot/allot.h>

#ifdef __cplusplus
extern "C" {
#endif

/** The longest token allot_jwt_verify() reads, in bytes. */
#define ALLOT_JWT_TOKEN_MAX 8192
/** The most clock skew a verifier may allow, in seconds. */
#define ALLOT_JWT_LEEWAY_MAX 300

/** One trusted issuer. */
typedef struct allot_jwt_issuer {
	const char *issuer; /**< the "iss" its tokens carry, exactly */
	const char *jwks_file; /**< its keys: a JWKS ({"keys": [...]}) */
} allot_jwt_issuer;

/** A verifier's settings; zero-initialise, then set. Copied at create. */
typedef struct allot_jwt_options {
	const allot_jwt_issuer *issuers; /**< at least one */
	size_t n_issuers; /**< at most 16 */
	/** Required: the token's "aud" (a string, or an array of them) must
	 *  name it: a token minted for another service is refused. */
	const char *audience;
	/** The claim naming the caller (NULL: "sub"): a non-empty string of
	 *  at most ALLOT_IDENTITY_MAX bytes. */
	const char *identity_claim;
	/** The claim naming the caller's tenant (NULL: none). When set and
	 *  absent from a token, the tenant is "". */
	const char *tenant_claim;
	/** Clock skew allowed on "exp" and "nbf", seconds; at most
	 *  ALLOT_JWT_LEEWAY_MAX. */
	unsigned leeway_s;
	/** How often allot_jwt_verify() looks at the JWKS files for a change
	 *  (their size, inode or modification time), milliseconds; 0: 1,000.
	 */
	unsigned reload_check_ms;
	/** Tokens remembered once verified, so that the same token again
	 *  costs a SHA-256 instead of a signature check: 0 for 4,096, at
	 *  most 1,048,576 (about 600 bytes each); no_cache remembers none.
	 *  A remembered token's expiry is checked at each use, and every
	 *  remembered token is forgotten when a key file is re-read. */
	unsigned cache_entries;
	bool no_cache;
	/** Where a file that does not load says why (NULL: nowhere). */
	allot_log_fn log;
	void *log_ctx;
} allot_jwt_options;

typedef struct allot_jwt_verifier allot_jwt_verifier;

/** Why a token gave no identity. */
typedef enum allot_jwt_status {
	ALLOT_JWT_OK = 0, /**< verified: `identity` is set */
	ALLOT_JWT_MALFORMED, /**< not three base64url parts of JSON, too long,
	                          a required claim of the wrong type */
	ALLOT_JWT_ISSUER, /**< "iss" missing or not a trusted issuer */
	ALLOT_JWT_NO_KEY, /**< no key of the issuer fits its "kid" and "alg"
	                       ("none" included) */
	ALLOT_JWT_SIGNATURE, /**< the signature does not verify */
	ALLOT_JWT_EXPIRED, /**< "exp" missing, or past (beyond the leeway) */
	ALLOT_JWT_NOT_YET, /**< "nbf" in the future (beyond the leeway) */
	ALLOT_JWT_AUDIENCE, /**< "aud" does not name the audience */
	ALLOT_JWT_IDENTITY, /**< the identity (or tenant) claim is missing,
	                         empty, not a string or too long */
	ALLOT_JWT_ERROR, /**< out of memory: not the token's fault */
	ALLOT_JWT_NSTATUS
} allot_jwt_status;

/** What a verified token says. */
typedef struct allot_jwt_claims {
	char identity[ALLOT_IDENTITY_MAX + 1]; /**< for allot_key_resolve() */
	char tenant[ALLOT_IDENTITY_MAX + 1]; /**< "" without tenant_claim */
	int64_t expires; /**< "exp", seconds since the epoch */
	size_t issuer; /**< its index in allot_jwt_options.issuers */
} allot_jwt_claims;

/** Counters since create; every call to allot_jwt_verify() counts once. */
typedef struct allot_jwt_stats {
	uint64_t by_status[ALLOT_JWT_NSTATUS]; /**< by allot_jwt_status */
	uint64_t reloads; /**< JWKS files re-read after a change */
	uint64_t reload_failures; /**< changed files that did not load (the
	                               keys before stay in force) */
	uint64_t cache_hits; /**< of by_status[ALLOT_JWT_OK], answered from
	                          the tokens remembered */
} allot_jwt_stats;

/**
 * Load every issuer's JWKS file and make a verifier.
 * @return ALLOT_OK; ALLOT_EINVAL: missing issuers or audience, leeway
 *         above ALLOT_JWT_LEEWAY_MAX, two issuers of one name;
 *         ALLOT_ENOENT/ALLOT_EIO: a file that cannot be read;
 *         ALLOT_ECONFIG: a file that is not a JWKS, or one with no usable
 *         key (its log says which); ALLOT_ENOMEM.
 */
ALLOT_API int allot_jwt_verifier_create(
    const allot_jwt_options *o, allot_jwt_verifier **ret);

/** Free a verifier. Accepts NULL. No verify may be running. */
ALLOT_API void allot_jwt_verifier_destroy(allot_jwt_verifier *v);

/**
 * Verify `token` (`len` bytes, the part after "Bearer "), at the wall
 * clock `now_s` (seconds since the epoch; pass time(NULL)). A changed JWKS
 * file is re-read first, at most once per reload_check_ms: a key added
 * before the tokens it signs are issued, and removed after the last of
 * them expires, rotates with no refused caller; a removed key's tokens
 * are refused from the next call after the re-read, remembered or not.
 * @param out on ALLOT_JWT_OK, the claims; otherwise untouched.
 */
ALLOT_API allot_jwt_status allot_jwt_verify(allot_jwt_verifier *v,
    const char *token, size_t len, int64_t now_s, allot_jwt_claims *out);

/**
 * Re-read every JWKS file now, changed or not. A file that does not load
 * keeps its issuer's keys as they were.
 * @return ALLOT_OK; otherwise the first failure, as for create.
 */
ALLOT_API int allot_jwt_verifier_reload(allot_jwt_verifier *v);

/** The counters, for the service's metrics. */
ALLOT_API void allot_jwt_verifier_stats(
    allot_jwt_verifier *v, allot_jwt_stats *out);

/** A static name for a status ("ok", "expired", ...), for logs and
 *  metric labels. */
ALLOT_API const char *allot_jwt_status_name(allot_jwt_status s);

#ifdef __cplusplus
}
#endif
#endif /* ALLOT_JWT_H */
