/* SPDX-License-Identifier: MIT */
/*
 * The token verifier (allot/jwt.h). The token's header and claims are
 * read with json-c to choose the issuer and the key; libjwt then checks
 * the signature with that key alone, and the claims are checked on the
 * same bytes it verified. The keys of each issuer are swapped whole under
 * a mutex when its file changes; a verify holds the mutex only to copy
 * the keys it may use.
 */
#include <allot/jwt.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <gnutls/crypto.h>
#include <gnutls/gnutls.h>
#include <json-c/json.h>
#include <jwt.h>
#include <math.h>

#include "cache.h"
#include "jwks.h"

#define ISSUERS_MAX 16
#define CACHE_DEFAULT 4096
#define CACHE_MAX (1u << 20)
#define CANDIDATES_MAX 8 /* keys tried for one token without "kid" */

typedef struct issuer {
	char *name;
	char *path;
	allot__jwks keys; /* under the verifier's mu */
	struct stat seen; /* the file as last read (reloads only) */
} issuer;

struct allot_jwt_verifier {
	pthread_mutex_t mu; /* the key sets */
	pthread_mutex_t reload_mu; /* one reload at a time */
	issuer iss[ISSUERS_MAX];
	size_t n;
	char *audience;
	char *identity_claim;
	char *tenant_claim;
	unsigned leeway_s;
	unsigned check_ms;
	allot_log_fn log;
	void *log_ctx;
	_Atomic uint64_t next_check_ms;
	allot__jwt_cache *cache; /* NULL: no_cache */
	/* Moves on with every key set installed: remembered tokens of an
	 * older one are checked again. From 1 (0 marks an empty entry). */
	_Atomic uint64_t generation;
	_Atomic uint64_t count[ALLOT_JWT_NSTATUS];
	_Atomic uint64_t reloads, reload_failures, cache_hits;
};

static const char *const status_names[ALLOT_JWT_NSTATUS] = {
	[ALLOT_JWT_OK] = "ok",
	[ALLOT_JWT_MALFORMED] = "malformed",
	[ALLOT_JWT_ISSUER] = "issuer",
	[ALLOT_JWT_NO_KEY] = "no_key",
	[ALLOT_JWT_SIGNATURE] = "signature",
	[ALLOT_JWT_EXPIRED] = "expired",
	[ALLOT_JWT_NOT_YET] = "not_yet_valid",
	[ALLOT_JWT_AUDIENCE] = "audience",
	[ALLOT_JWT_IDENTITY] = "identity",
	[ALLOT_JWT_ERROR] = "error",
};

const char *
allot_jwt_status_name(allot_jwt_status s)
{
	if ((unsigned) s >= ALLOT_JWT_NSTATUS)
		return "unknown";
	return status_names[s];
}

static uint64_t
mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * 1000u + (uint64_t) ts.tv_nsec / 1000000u;
}

static void
say(const allot_jwt_verifier *v, int level, const char *msg)
{
	if (v->log != NULL)
		v->log(v->log_ctx, level, "ALLOT-JWT-KEYS", msg);
}

static bool
same_file(const struct stat *a, const struct stat *b)
{
	return a->st_dev == b->st_dev && a->st_ino == b->st_ino &&
	    a->st_size == b->st_size &&
	    a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
	    a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* Reads issuer `i`'s file (with v->reload_mu held, or at create) and
 * installs its keys. `force`: even when it looks unchanged. */
static int
load_issuer(allot_jwt_verifier *v, issuer *i, bool force, bool *changed)
{
	allot__jwks ks, old;
	struct stat st = { 0 };
	char why[512], line[640];
	int rv;

	*changed = false;
	/* A missing file reads as all zeros: one that stays missing is
	 * said once, not at every check. */
	if (stat(i->path, &st) != 0)
		memset(&st, 0, sizeof st);
	if (!force && same_file(&st, &i->seen))
		return ALLOT_OK;
	*changed = true;
	rv = allot__jwks_load(i->path, &ks, why, sizeof why);
	if (rv != ALLOT_OK) {
		snprintf(line, sizeof line, "issuer %s: keys not loaded, %s%s",
		    i->name, why,
		    i->keys.n > 0 ? " (its keys before stay in force)" : "");
		say(v, 3, line);
		if (rv != ALLOT_ENOMEM)
			i->seen = st; /* not again until it changes */
		return rv;
	}
	if (why[0] != '\0') {
		snprintf(line, sizeof line, "issuer %s: %s", i->name, why);
		say(v, 4, line);
	}
	pthread_mutex_lock(&v->mu);
	old = i->keys;
	i->keys = ks;
	pthread_mutex_unlock(&v->mu);
	atomic_fetch_add(&v->generation, 1);
	allot__jwks_free(&old);
	i->seen = st;
	return ALLOT_OK;
}

static int
reload(allot_jwt_verifier *v, bool force)
{
	int first = ALLOT_OK;

	for (size_t k = 0; k < v->n; k++) {
		bool changed;
		int rv = load_issuer(v, &v->iss[k], force, &changed);

		if (!changed)
			continue;
		if (rv == ALLOT_OK)
			atomic_fetch_add(&v->reloads, 1);
		else {
			atomic_fetch_add(&v->reload_failures, 1);
			if (first == ALLOT_OK)
				first = rv;
		}
	}
	return first;
}

/* From a verify: look at the files once per check_ms, one thread. */
static void
maybe_reload(allot_jwt_verifier *v)
{
	uint64_t now = mono_ms(), next = atomic_load(&v->next_check_ms);

	if (now < next ||
	    !atomic_compare_exchange_strong(
	        &v->next_check_ms, &next, now + v->check_ms))
		return;
	if (pthread_mutex_trylock(&v->reload_mu) != 0)
		return;
	(void) reload(v, false);
	pthread_mutex_unlock(&v->reload_mu);
}

int
allot_jwt_verifier_reload(allot_jwt_verifier *v)
{
	int rv;

	if (v == NULL)
		return ALLOT_EINVAL;
	pthread_mutex_lock(&v->reload_mu);
	rv = reload(v, true);
	pthread_mutex_unlock(&v->reload_mu);
	return rv;
}

static char *
dup_or(const char *s, const char *dflt)
{
	return strdup(s != NULL ? s : dflt);
}

static int
check_options(const allot_jwt_options *o)
{
	if (o == NULL || o->issuers == NULL || o->n_issuers == 0 ||
	    o->n_issuers > ISSUERS_MAX || o->audience == NULL ||
	    o->audience[0] == '\0' || o->leeway_s > ALLOT_JWT_LEEWAY_MAX ||
	    o->cache_entries > CACHE_MAX ||
	    (o->identity_claim != NULL && o->identity_claim[0] == '\0'))
		return ALLOT_EINVAL;
	for (size_t k = 0; k < o->n_issuers; k++) {
		const allot_jwt_issuer *i = &o->issuers[k];

		if (i->issuer == NULL || i->issuer[0] == '\0' ||
		    i->jwks_file == NULL)
			return ALLOT_EINVAL;
		for (size_t j = 0; j < k; j++)
			if (strcmp(o->issuers[j].issuer, i->issuer) == 0)
				return ALLOT_EINVAL;
	}
	return ALLOT_OK;
}

int
allot_jwt_verifier_create(const allot_jwt_options *o, allot_jwt_verifier **ret)
{
	allot_jwt_verifier *v;
	int rv;

	if (ret == NULL || check_options(o) != ALLOT_OK)
		return ALLOT_EINVAL;
	v = calloc(1, sizeof *v);
	if (v == NULL)
		return ALLOT_ENOMEM;
	pthread_mutex_init(&v->mu, NULL);
	pthread_mutex_init(&v->reload_mu, NULL);
	v->leeway_s = o->leeway_s;
	v->check_ms = o->reload_check_ms > 0 ? o->reload_check_ms : 1000;
	v->log = o->log;
	v->log_ctx = o->log_ctx;
	atomic_store(&v->generation, 1);
	v->audience = strdup(o->audience);
	v->identity_claim = dup_or(o->identity_claim, "sub");
	v->tenant_claim = o->tenant_claim != NULL ? strdup(o->tenant_claim) :
	                                            NULL;
	rv = v->audience != NULL && v->identity_claim != NULL &&
	        (o->tenant_claim == NULL || v->tenant_claim != NULL) ?
	    ALLOT_OK :
	    ALLOT_ENOMEM;
	for (size_t k = 0; k < o->n_issuers && rv == ALLOT_OK; k++) {
		issuer *i = &v->iss[v->n++];

		i->name = strdup(o->issuers[k].issuer);
		i->path = strdup(o->issuers[k].jwks_file);
		if (i->name == NULL || i->path == NULL)
			rv = ALLOT_ENOMEM;
	}
	if (rv == ALLOT_OK && !o->no_cache)
		rv = allot__jwt_cache_create(
		    o->cache_entries > 0 ? o->cache_entries : CACHE_DEFAULT,
		    &v->cache);
	if (rv == ALLOT_OK)
		rv = reload(v, true);
	if (rv != ALLOT_OK) {
		allot_jwt_verifier_destroy(v);
		return rv;
	}
	atomic_store(&v->reloads, 0);
	atomic_store(&v->next_check_ms, mono_ms() + v->check_ms);
	*ret = v;
	return ALLOT_OK;
}

void
allot_jwt_verifier_destroy(allot_jwt_verifier *v)
{
	if (v == NULL)
		return;
	for (size_t k = 0; k < v->n; k++) {
		allot__jwks_free(&v->iss[k].keys);
		free(v->iss[k].name);
		free(v->iss[k].path);
	}
	allot__jwt_cache_destroy(v->cache);
	free(v->audience);
	free(v->identity_claim);
	free(v->tenant_claim);
	pthread_mutex_destroy(&v->mu);
	pthread_mutex_destroy(&v->reload_mu);
	free(v);
}

void
allot_jwt_verifier_stats(allot_jwt_verifier *v, allot_jwt_stats *out)
{
	memset(out, 0, sizeof *out);
	if (v == NULL)
		return;
	for (int s = 0; s < ALLOT_JWT_NSTATUS; s++)
		out->by_status[s] = atomic_load(&v->count[s]);
	out->reloads = atomic_load(&v->reloads);
	out->reload_failures = atomic_load(&v->reload_failures);
	out->cache_hits = atomic_load(&v->cache_hits);
}

/* ---- one token ---- */

/* A decoded part of the token as a JSON object; NULL when not one. */
static json_object *
part_json(const char *s, size_t len, allot_jwt_status *st)
{
	unsigned char *raw;
	size_t n;
	json_object *o;
	json_tokener *tok;
	int rv = allot__b64url_decode(s, len, &raw, &n);

	if (rv != ALLOT_OK) {
		*st = rv == ALLOT_ENOMEM ? ALLOT_JWT_ERROR :
		                           ALLOT_JWT_MALFORMED;
		return NULL;
	}
	tok = json_tokener_new();
	o = tok != NULL && strlen((char *) raw) == n ?
	    json_tokener_parse_ex(tok, (char *) raw, (int) n) :
	    NULL;
	if (o != NULL &&
	    (json_tokener_get_error(tok) != json_tokener_success ||
	        json_tokener_get_parse_end(tok) != n ||
	        !json_object_is_type(o, json_type_object))) {
		json_object_put(o);
		o = NULL;
	}
	if (tok != NULL)
		json_tokener_free(tok);
	free(raw);
	*st = o != NULL ? ALLOT_JWT_OK : ALLOT_JWT_MALFORMED;
	return o;
}

static const char *
str_member(json_object *o, const char *name, bool *present)
{
	json_object *m;

	*present = json_object_object_get_ex(o, name, &m);
	if (!*present || !json_object_is_type(m, json_type_string))
		return NULL;
	/* A NUL inside would hide the rest of the string. */
	if (strlen(json_object_get_string(m)) !=
	    (size_t) json_object_get_string_len(m))
		return NULL;
	return json_object_get_string(m);
}

/* A NumericDate claim; false when absent; *bad when not a number. */
static bool
date_member(json_object *o, const char *name, double *t, bool *bad)
{
	json_object *m;

	if (!json_object_object_get_ex(o, name, &m))
		return false;
	if (!json_object_is_type(m, json_type_int) &&
	    !json_object_is_type(m, json_type_double)) {
		*bad = true;
		return false;
	}
	*t = json_object_get_double(m);
	return true;
}

static bool
audience_ok(json_object *claims, const char *audience)
{
	json_object *aud;

	if (!json_object_object_get_ex(claims, "aud", &aud))
		return false;
	if (json_object_is_type(aud, json_type_string))
		return strcmp(json_object_get_string(aud), audience) == 0;
	if (!json_object_is_type(aud, json_type_array))
		return false;
	for (size_t i = 0; i < json_object_array_length(aud); i++) {
		json_object *a = json_object_array_get_idx(aud, i);

		if (json_object_is_type(a, json_type_string) &&
		    strcmp(json_object_get_string(a), audience) == 0)
			return true;
	}
	return false;
}

/* A claim naming someone, into buf (ALLOT_IDENTITY_MAX + 1 bytes). */
static bool
name_claim(json_object *claims, const char *claim, bool required, char *buf)
{
	bool present;
	const char *s = str_member(claims, claim, &present);

	buf[0] = '\0';
	if (!present)
		return !required;
	if (s == NULL || s[0] == '\0' || strlen(s) > ALLOT_IDENTITY_MAX)
		return false;
	memcpy(buf, s, strlen(s) + 1);
	return true;
}

/* Copies the keys of issuer `i` that may check (kid, alg). */
static size_t
candidates(allot_jwt_verifier *v, const issuer *i, const char *kid,
    jwt_alg_t alg, allot__jwk *out)
{
	size_t n = 0;

	pthread_mutex_lock(&v->mu);
	for (size_t k = 0; k < i->keys.n && n < CANDIDATES_MAX; k++) {
		const allot__jwk *key = &i->keys.keys[k];

		if ((kid != NULL && strcmp(kid, key->kid) != 0) ||
		    !allot__jwk_fits(key, alg))
			continue;
		out[n] = *key;
		out[n].key = malloc(key->len + 1);
		if (out[n].key == NULL)
			break;
		memcpy(out[n].key, key->key, key->len + 1);
		n++;
	}
	pthread_mutex_unlock(&v->mu);
	return n;
}

/* The signature, by libjwt, with each candidate key in turn. */
static allot_jwt_status
signature(allot_jwt_verifier *v, const issuer *i, const char *token,
    const char *kid, jwt_alg_t alg)
{
	allot__jwk keys[CANDIDATES_MAX];
	size_t n = candidates(v, i, kid, alg, keys);
	allot_jwt_status st = n > 0 ? ALLOT_JWT_SIGNATURE : ALLOT_JWT_NO_KEY;

	for (size_t k = 0; k < n; k++) {
		jwt_t *jwt = NULL;

		if (st != ALLOT_JWT_OK &&
		    jwt_decode(&jwt, token, keys[k].key, (int) keys[k].len) ==
		        0 &&
		    jwt_get_alg(jwt) == alg)
			st = ALLOT_JWT_OK;
		jwt_free(jwt);
		free(keys[k].key);
	}
	return st;
}

/* "exp" and "nbf" against the clock, with the leeway. */
static allot_jwt_status
times_check(const allot_jwt_verifier *v, double exp, double nbf, int64_t now_s)
{
	double leeway = v->leeway_s;

	if ((double) now_s >= exp + leeway)
		return ALLOT_JWT_EXPIRED;
	if ((double) now_s + leeway < nbf)
		return ALLOT_JWT_NOT_YET;
	return ALLOT_JWT_OK;
}

/* The claims after the signature: time, audience, names. */
static allot_jwt_status
claims_check(allot_jwt_verifier *v, json_object *claims, int64_t now_s,
    allot__jwt_seen *out)
{
	double exp = 0, nbf = -INFINITY;
	bool bad = false, has_exp;
	allot_jwt_status st;

	has_exp = date_member(claims, "exp", &exp, &bad);
	(void) date_member(claims, "nbf", &nbf, &bad);
	if (bad)
		return ALLOT_JWT_MALFORMED;
	if (!has_exp)
		return ALLOT_JWT_EXPIRED;
	st = times_check(v, exp, nbf, now_s);
	if (st != ALLOT_JWT_OK)
		return st;
	if (!audience_ok(claims, v->audience))
		return ALLOT_JWT_AUDIENCE;
	if (!name_claim(
	        claims, v->identity_claim, true, out->claims.identity) ||
	    (v->tenant_claim != NULL &&
	        !name_claim(
	            claims, v->tenant_claim, false, out->claims.tenant)))
		return ALLOT_JWT_IDENTITY;
	out->exp = exp;
	out->nbf = nbf;
	out->claims.expires = exp > (double) INT64_MAX ? INT64_MAX :
	                                                 (int64_t) exp;
	return ALLOT_JWT_OK;
}

/* A token verified under key generation `gen` into *seen. */
static allot_jwt_status
verify_full(allot_jwt_verifier *v, const char *buf, int64_t now_s,
    allot__jwt_seen *seen)
{
	const char *dot1, *dot2, *alg_s, *kid, *iss;
	json_object *header = NULL, *claims = NULL;
	allot_jwt_status st;
	bool present;
	size_t k;

	dot1 = strchr(buf, '.');
	dot2 = dot1 != NULL ? strchr(dot1 + 1, '.') : NULL;
	if (dot2 == NULL || strchr(dot2 + 1, '.') != NULL)
		return ALLOT_JWT_MALFORMED;
	header = part_json(buf, (size_t) (dot1 - buf), &st);
	if (header != NULL)
		claims = part_json(dot1 + 1, (size_t) (dot2 - dot1 - 1), &st);
	if (claims == NULL)
		goto out;
	/* No extension is understood, so none may be critical (RFC 7515
	 * §4.1.11). */
	alg_s = str_member(header, "alg", &present);
	kid = str_member(header, "kid", &present);
	if (alg_s == NULL || (present && kid == NULL) ||
	    json_object_object_get_ex(header, "crit", NULL)) {
		st = ALLOT_JWT_MALFORMED;
		goto out;
	}
	iss = str_member(claims, "iss", &present);
	for (k = 0; iss != NULL && k < v->n; k++)
		if (strcmp(iss, v->iss[k].name) == 0)
			break;
	if (iss == NULL || k == v->n) {
		st = ALLOT_JWT_ISSUER;
		goto out;
	}
	st = signature(v, &v->iss[k], buf, kid, jwt_str_alg(alg_s));
	if (st == ALLOT_JWT_OK)
		st = claims_check(v, claims, now_s, seen);
	seen->claims.issuer = k;
out:
	json_object_put(header);
	json_object_put(claims);
	return st;
}

static allot_jwt_status
verify(allot_jwt_verifier *v, const char *token, size_t len, int64_t now_s,
    allot_jwt_claims *out)
{
	char buf[ALLOT_JWT_TOKEN_MAX + 1];
	uint8_t digest[ALLOT__JWT_DIGEST];
	allot__jwt_seen seen;
	allot_jwt_status st;
	uint64_t gen;
	bool hashed;

	if (token == NULL || len == 0 || len > ALLOT_JWT_TOKEN_MAX ||
	    memchr(token, '\0', len) != NULL)
		return ALLOT_JWT_MALFORMED;
	memcpy(buf, token, len);
	buf[len] = '\0';
	maybe_reload(v);
	/* Read before the keys are: a token checked with keys a re-read
	 * then replaced is remembered under the generation they had. */
	gen = atomic_load(&v->generation);
	hashed = v->cache != NULL &&
	    gnutls_hash_fast(GNUTLS_DIG_SHA256, buf, len, digest) == 0;
	if (hashed && allot__jwt_cache_get(v->cache, digest, gen, &seen) &&
	    times_check(v, seen.exp, seen.nbf, now_s) == ALLOT_JWT_OK) {
		atomic_fetch_add(&v->cache_hits, 1);
		*out = seen.claims;
		return ALLOT_JWT_OK;
	}
	memset(&seen, 0, sizeof seen);
	st = verify_full(v, buf, now_s, &seen);
	if (st != ALLOT_JWT_OK)
		return st;
	if (hashed)
		allot__jwt_cache_put(v->cache, digest, gen, &seen);
	*out = seen.claims;
	return ALLOT_JWT_OK;
}

allot_jwt_status
allot_jwt_verify(allot_jwt_verifier *v, const char *token, size_t len,
    int64_t now_s, allot_jwt_claims *out)
{
	allot_jwt_status st;

	if (v == NULL || out == NULL)
		return ALLOT_JWT_MALFORMED;
	st = verify(v, token, len, now_s, out);
	atomic_fetch_add(&v->count[st], 1);
	return st;
}
