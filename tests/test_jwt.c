/* SPDX-License-Identifier: MIT */
/*
 * liballot-jwt (allot/jwt.h): caller identities from signed service
 * tokens. Real keys (GnuTLS), real signatures (libjwt), JWKS files on
 * disk replaced by rename; every way a token can be wrong gets its own
 * status and no identity, and keys rotate with no valid caller refused.
 */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <allot/jwt.h>

#include "jwt_mint.h"
#include "runner.h"

#define ISS "https://issuer.test"
#define AUD "orders"

static char dir[64], jwks_a[128], jwks_b[128];
static mint_key rsa1, rsa2, ec1, hs1;
static int64_t now;

static void
setup(void)
{
	snprintf(dir, sizeof dir, "/tmp/allot-jwt-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(jwks_a, sizeof jwks_a, "%s/a.json", dir);
	snprintf(jwks_b, sizeof jwks_b, "%s/b.json", dir);
	mint_rsa(&rsa1, "r1", 2048);
	mint_rsa(&rsa2, "r2", 2048);
	mint_ec(&ec1, "e1");
	mint_hmac(&hs1, "h1", 32);
	now = (int64_t) time(NULL);
}

static void
teardown(void)
{
	char cmd[128];

	mint_free(&rsa1);
	mint_free(&rsa2);
	mint_free(&ec1);
	mint_free(&hs1);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	ck_assert_int_eq(system(cmd), 0);
}

static allot_jwt_verifier *
verifier(unsigned leeway_s, const char *tenant_claim)
{
	allot_jwt_issuer iss[] = { { ISS, jwks_a },
		{ "https://other.test", jwks_b } };
	allot_jwt_options o = { 0 };
	allot_jwt_verifier *v = NULL;
	mint_key *a[] = { &rsa1, &ec1, &hs1 }, *b[] = { &rsa2 };

	mint_jwks(jwks_a, a, 3);
	mint_jwks(jwks_b, b, 1);
	o.issuers = iss;
	o.n_issuers = 2;
	o.audience = AUD;
	o.tenant_claim = tenant_claim;
	o.leeway_s = leeway_s;
	o.reload_check_ms = 20;
	ck_assert_int_eq(allot_jwt_verifier_create(&o, &v), ALLOT_OK);
	return v;
}

/* Claims: iss, aud, sub, exp = now + exp_in; `extra` appended. */
static char *
claims(const char *iss, const char *aud, const char *sub, long exp_in,
    const char *extra)
{
	char *s;

	ck_assert_int_gt(asprintf(&s,
	                     "{\"iss\":\"%s\",\"aud\":%s,\"sub\":\"%s\","
	                     "\"exp\":%lld%s}",
	                     iss, aud, sub, (long long) (now + exp_in), extra),
	    0);
	return s;
}

static allot_jwt_status
check_token(allot_jwt_verifier *v, const char *token, allot_jwt_claims *c)
{
	return allot_jwt_verify(v, token, strlen(token), now, c);
}

/* `k` signs `alg` over claims(...); the status it gets. */
static allot_jwt_status
sign_and_check(allot_jwt_verifier *v, const mint_key *k, jwt_alg_t alg,
    const char *claims_json, allot_jwt_claims *c)
{
	char *t = mint_token(k, alg, claims_json);
	allot_jwt_status st = check_token(v, t, c);

	free(t);
	return st;
}

START_TEST(valid_tokens_give_their_subject)
{
	allot_jwt_verifier *v = verifier(0, "org");
	allot_jwt_claims c;
	char *cl = claims(ISS, "\"" AUD "\"", "spiffe://t/billing", 600,
	    ",\"org\":\"acme\"");
	const struct {
		const mint_key *k;
		jwt_alg_t alg;
	} ok[] = { { &rsa1, JWT_ALG_RS256 }, { &rsa1, JWT_ALG_RS512 },
		{ &ec1, JWT_ALG_ES256 }, { &hs1, JWT_ALG_HS256 } };
	allot_jwt_stats st;

	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
		memset(&c, 0, sizeof c);
		ck_assert_msg(sign_and_check(v, ok[i].k, ok[i].alg, cl, &c) ==
		        ALLOT_JWT_OK,
		    "key %zu", i);
		ck_assert_str_eq(c.identity, "spiffe://t/billing");
		ck_assert_str_eq(c.tenant, "acme");
		ck_assert_int_eq(c.expires, now + 600);
		ck_assert_uint_eq(c.issuer, 0);
	}
	free(cl);
	/* An "aud" array naming the audience among others. */
	cl = claims(ISS, "[\"x\",\"" AUD "\"]", "svc-a", 60, "");
	ck_assert_int_eq(
	    sign_and_check(v, &rsa1, JWT_ALG_RS256, cl, &c), ALLOT_JWT_OK);
	ck_assert_str_eq(c.identity, "svc-a");
	ck_assert_str_eq(c.tenant, ""); /* no "org": no tenant */
	free(cl);
	/* The second issuer, with its own key. */
	cl = claims("https://other.test", "\"" AUD "\"", "svc-b", 60, "");
	ck_assert_int_eq(
	    sign_and_check(v, &rsa2, JWT_ALG_RS256, cl, &c), ALLOT_JWT_OK);
	ck_assert_uint_eq(c.issuer, 1);
	free(cl);
	allot_jwt_verifier_stats(v, &st);
	ck_assert_uint_eq(st.by_status[ALLOT_JWT_OK], 6);
	allot_jwt_verifier_destroy(v);
}
END_TEST

/* Each wrong token: its status, no identity written, counted. */
START_TEST(wrong_tokens_get_no_identity)
{
	allot_jwt_verifier *v = verifier(0, NULL);
	allot_jwt_claims c;
	char *good = claims(ISS, "\"" AUD "\"", "svc", 600, "");
	char *cl;
	mint_key stranger;
	allot_jwt_stats st;

	memset(&c, 0x5a, sizeof c);
	/* Forged: the right kid, another key. */
	mint_rsa(&stranger, "r1", 2048);
	ck_assert_int_eq(sign_and_check(v, &stranger, JWT_ALG_RS256, good, &c),
	    ALLOT_JWT_SIGNATURE);
	mint_free(&stranger);
	/* Another issuer's key for this issuer's tokens. */
	ck_assert_int_eq(sign_and_check(v, &rsa2, JWT_ALG_RS256, good, &c),
	    ALLOT_JWT_NO_KEY); /* kid r2 is not issuer a's */
	/* Expired, not yet valid, no expiry. */
	cl = claims(ISS, "\"" AUD "\"", "svc", -1, "");
	ck_assert_int_eq(sign_and_check(v, &rsa1, JWT_ALG_RS256, cl, &c),
	    ALLOT_JWT_EXPIRED);
	free(cl);
	cl = claims(ISS, "\"" AUD "\"", "svc", 600, ",\"nbf\":9999999999");
	ck_assert_int_eq(sign_and_check(v, &rsa1, JWT_ALG_RS256, cl, &c),
	    ALLOT_JWT_NOT_YET);
	free(cl);
	ck_assert_int_eq(
	    sign_and_check(v, &rsa1, JWT_ALG_RS256,
	        "{\"iss\":\"" ISS "\",\"aud\":\"" AUD "\",\"sub\":\"svc\"}",
	        &c),
	    ALLOT_JWT_EXPIRED);
	/* Minted for another service. */
	cl = claims(ISS, "\"payments\"", "svc", 600, "");
	ck_assert_int_eq(sign_and_check(v, &rsa1, JWT_ALG_RS256, cl, &c),
	    ALLOT_JWT_AUDIENCE);
	free(cl);
	cl = claims(ISS, "[\"payments\"]", "svc", 600, "");
	ck_assert_int_eq(sign_and_check(v, &rsa1, JWT_ALG_RS256, cl, &c),
	    ALLOT_JWT_AUDIENCE);
	free(cl);
	/* An issuer nobody trusts, and none at all. */
	cl = claims("https://evil.test", "\"" AUD "\"", "svc", 600, "");
	ck_assert_int_eq(
	    sign_and_check(v, &rsa1, JWT_ALG_RS256, cl, &c), ALLOT_JWT_ISSUER);
	free(cl);
	ck_assert_int_eq(sign_and_check(v, &rsa1, JWT_ALG_RS256,
	                     "{\"aud\":\"" AUD "\",\"sub\":\"s\",\"exp\":"
	                     "9999999999}",
	                     &c),
	    ALLOT_JWT_ISSUER);
	/* The subject: empty, too long, not a string. */
	cl = claims(ISS, "\"" AUD "\"", "", 600, "");
	ck_assert_int_eq(sign_and_check(v, &rsa1, JWT_ALG_RS256, cl, &c),
	    ALLOT_JWT_IDENTITY);
	free(cl);
	{
		char longsub[300];

		memset(longsub, 'a', sizeof longsub - 1);
		longsub[sizeof longsub - 1] = '\0';
		cl = claims(ISS, "\"" AUD "\"", longsub, 600, "");
		ck_assert_int_eq(
		    sign_and_check(v, &rsa1, JWT_ALG_RS256, cl, &c),
		    ALLOT_JWT_IDENTITY);
		free(cl);
	}
	ck_assert_int_eq(sign_and_check(v, &rsa1, JWT_ALG_RS256,
	                     "{\"iss\":\"" ISS "\",\"aud\":\"" AUD
	                     "\",\"sub\":7,\"exp\":9999999999}",
	                     &c),
	    ALLOT_JWT_IDENTITY);
	/* Nothing above wrote an identity. */
	ck_assert_int_eq((unsigned char) c.identity[0], 0x5a);
	allot_jwt_verifier_stats(v, &st);
	ck_assert_uint_eq(st.by_status[ALLOT_JWT_OK], 0);
	ck_assert_uint_eq(st.by_status[ALLOT_JWT_AUDIENCE], 2);
	ck_assert_uint_eq(st.by_status[ALLOT_JWT_IDENTITY], 3);
	free(good);
	allot_jwt_verifier_destroy(v);
}
END_TEST

/* The algorithm is the key's, never the token's choice: "none", and the
 * RSA public key used as an HMAC secret (the classic confusion), and an
 * RSA algorithm naming an EC key, find no key. */
START_TEST(the_key_decides_the_algorithm)
{
	allot_jwt_verifier *v = verifier(0, NULL);
	allot_jwt_claims c;
	char *cl = claims(ISS, "\"" AUD "\"", "svc", 600, "");
	char *t;
	mint_key confused = rsa1;

	t = mint_raw("{\"alg\":\"none\"}", cl, "");
	ck_assert_int_eq(check_token(v, t, &c), ALLOT_JWT_NO_KEY);
	free(t);
	t = mint_raw("{\"alg\":\"none\",\"kid\":\"r1\"}", cl, "");
	ck_assert_int_eq(check_token(v, t, &c), ALLOT_JWT_NO_KEY);
	free(t);
	/* HS256 keyed with the PEM the verifier itself holds for r1. */
	confused.secret = (unsigned char *) rsa1.public_pem;
	confused.len = strlen(rsa1.public_pem);
	ck_assert_int_eq(sign_and_check(v, &confused, JWT_ALG_HS256, cl, &c),
	    ALLOT_JWT_NO_KEY);
	confused.kid[0] = '\0'; /* and with no kid: every key of the issuer */
	ck_assert_int_eq(sign_and_check(v, &confused, JWT_ALG_HS256, cl, &c),
	    ALLOT_JWT_SIGNATURE); /* only h1 fits HS256, and it is not it */
	/* ES256 signed by the EC key but naming r1. */
	{
		mint_key lying = ec1;

		snprintf(lying.kid, sizeof lying.kid, "r1");
		ck_assert_int_eq(
		    sign_and_check(v, &lying, JWT_ALG_ES256, cl, &c),
		    ALLOT_JWT_NO_KEY);
	}
	/* No kid: each key that fits is tried. */
	{
		mint_key anon = ec1;

		anon.kid[0] = '\0';
		ck_assert_int_eq(
		    sign_and_check(v, &anon, JWT_ALG_ES256, cl, &c),
		    ALLOT_JWT_OK);
	}
	free(cl);
	allot_jwt_verifier_destroy(v);
}
END_TEST

START_TEST(malformed_tokens)
{
	allot_jwt_verifier *v = verifier(0, NULL);
	allot_jwt_claims c;
	char *cl = claims(ISS, "\"" AUD "\"", "svc", 600, "");
	char *good = mint_token(&rsa1, JWT_ALG_RS256, cl);
	char *t, *huge;
	const char *bad[] = { "", "abc", "a.b", "a.b.c.d", "!!.??.**",
		"e30.e30.", "bm90IGpzb24.e30.c2ln" };

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		ck_assert_msg(
		    check_token(v, bad[i], &c) == ALLOT_JWT_MALFORMED, "%s",
		    bad[i]);
	/* A critical extension nobody here understands. */
	t = mint_raw(
	    "{\"alg\":\"RS256\",\"crit\":[\"x\"],\"x\":1}", cl, "c2ln");
	ck_assert_int_eq(check_token(v, t, &c), ALLOT_JWT_MALFORMED);
	free(t);
	/* A NUL inside the token; a token past the bound. */
	ck_assert_int_eq(allot_jwt_verify(v, good, strlen(good) + 1, now, &c),
	    ALLOT_JWT_MALFORMED);
	huge = calloc(ALLOT_JWT_TOKEN_MAX + 2, 1);
	memset(huge, 'a', ALLOT_JWT_TOKEN_MAX + 1);
	ck_assert_int_eq(check_token(v, huge, &c), ALLOT_JWT_MALFORMED);
	free(huge);
	/* Trailing bytes after the JSON of a part. */
	t = mint_raw("{\"alg\":\"RS256\"} x", cl, "c2ln");
	ck_assert_int_eq(check_token(v, t, &c), ALLOT_JWT_MALFORMED);
	free(t);
	/* The good one still passes; a flipped signature byte does not. */
	ck_assert_int_eq(check_token(v, good, &c), ALLOT_JWT_OK);
	good[strlen(good) - 5] ^= 1;
	ck_assert_int_ne(check_token(v, good, &c), ALLOT_JWT_OK);
	free(good);
	free(cl);
	allot_jwt_verifier_destroy(v);
}
END_TEST

START_TEST(leeway_is_bounded)
{
	allot_jwt_verifier *v = verifier(30, NULL);
	allot_jwt_claims c;
	char *cl = claims(ISS, "\"" AUD "\"", "svc", -20, "");
	allot_jwt_issuer iss = { ISS, jwks_a };
	allot_jwt_options o = { 0 };
	allot_jwt_verifier *w = NULL;

	ck_assert_int_eq(
	    sign_and_check(v, &rsa1, JWT_ALG_RS256, cl, &c), ALLOT_JWT_OK);
	free(cl);
	cl = claims(ISS, "\"" AUD "\"", "svc", -40, "");
	ck_assert_int_eq(sign_and_check(v, &rsa1, JWT_ALG_RS256, cl, &c),
	    ALLOT_JWT_EXPIRED);
	free(cl);
	allot_jwt_verifier_destroy(v);
	o.issuers = &iss;
	o.n_issuers = 1;
	o.audience = AUD;
	o.leeway_s = ALLOT_JWT_LEEWAY_MAX + 1;
	ck_assert_int_eq(allot_jwt_verifier_create(&o, &w), ALLOT_EINVAL);
	o.leeway_s = 0;
	o.audience = NULL;
	ck_assert_int_eq(allot_jwt_verifier_create(&o, &w), ALLOT_EINVAL);
	ck_assert_ptr_null(w);
}
END_TEST

static char logged[4096];

static void
capture(void *ctx, int level, const char *id, const char *msg)
{
	(void) ctx;
	(void) level;
	snprintf(logged + strlen(logged), sizeof logged - strlen(logged),
	    "%s %s\n", id, msg);
}

/* Files that are not a usable JWKS: a clear error at create. */
START_TEST(bad_key_files)
{
	allot_jwt_issuer iss = { ISS, jwks_a };
	allot_jwt_options o = { 0 };
	allot_jwt_verifier *v = NULL;
	mint_key weak, short_secret;
	mint_key *k[] = { &weak, &short_secret };
	FILE *f;

	o.issuers = &iss;
	o.n_issuers = 1;
	o.audience = AUD;
	o.log = capture;
	ck_assert_int_eq(allot_jwt_verifier_create(&o, &v), ALLOT_ENOENT);
	f = fopen(jwks_a, "w");
	fputs("{\"keys\": 3}", f);
	fclose(f);
	logged[0] = '\0';
	ck_assert_int_eq(allot_jwt_verifier_create(&o, &v), ALLOT_ECONFIG);
	ck_assert_msg(strstr(logged, "not a JWKS") != NULL, "%s", logged);
	/* A 1024-bit RSA key and a 16-byte secret: nothing usable. */
	mint_rsa(&weak, "w", 1024);
	mint_hmac(&short_secret, "s", 16);
	mint_jwks(jwks_a, k, 2);
	logged[0] = '\0';
	ck_assert_int_eq(allot_jwt_verifier_create(&o, &v), ALLOT_ECONFIG);
	ck_assert_msg(strstr(logged, "key 0 left out") != NULL &&
	        strstr(logged, "key 1 left out") != NULL,
	    "%s", logged); /* the 16-byte secret fits no HS algorithm */
	ck_assert_ptr_null(v);
	mint_free(&weak);
	mint_free(&short_secret);
}
END_TEST

/* Rotation through the file: a new key is taken up within the check
 * interval, a broken file keeps the keys before, a removed key stops. */
START_TEST(keys_rotate_through_the_file)
{
	allot_jwt_verifier *v = verifier(0, NULL);
	allot_jwt_claims c;
	char *cl = claims(ISS, "\"" AUD "\"", "svc", 600, "");
	char *t1 = mint_token(&rsa1, JWT_ALG_RS256, cl);
	char *t2 = mint_token(&rsa2, JWT_ALG_RS256, cl);
	mint_key *both[] = { &rsa1, &rsa2 }, *second[] = { &rsa2 };
	allot_jwt_stats st;
	FILE *f;

	ck_assert_int_eq(check_token(v, t1, &c), ALLOT_JWT_OK);
	ck_assert_int_eq(
	    check_token(v, t1, &c), ALLOT_JWT_OK); /* remembered */
	ck_assert_int_eq(check_token(v, t2, &c), ALLOT_JWT_NO_KEY);
	mint_jwks(jwks_a, both, 2);
	usleep(50 * 1000);
	ck_assert_int_eq(check_token(v, t2, &c), ALLOT_JWT_OK);
	ck_assert_int_eq(check_token(v, t1, &c), ALLOT_JWT_OK);
	/* Broken mid-rotation: the keys before stay. */
	f = fopen(jwks_a, "w");
	fputs("{\"keys\": [", f);
	fclose(f);
	usleep(50 * 1000);
	ck_assert_int_eq(check_token(v, t2, &c), ALLOT_JWT_OK);
	ck_assert_int_eq(check_token(v, t1, &c), ALLOT_JWT_OK);
	mint_jwks(jwks_a, second, 1);
	usleep(50 * 1000);
	ck_assert_int_eq(check_token(v, t2, &c), ALLOT_JWT_OK);
	ck_assert_int_eq(check_token(v, t1, &c), ALLOT_JWT_NO_KEY);
	allot_jwt_verifier_stats(v, &st);
	ck_assert_uint_eq(st.reloads, 2);
	ck_assert_uint_eq(st.reload_failures, 1);
	/* t1 was remembered before k1 went: the re-read forgot it. */
	ck_assert_uint_ge(st.cache_hits, 1);
	/* An explicit reload of an unchanged good file. */
	ck_assert_int_eq(allot_jwt_verifier_reload(v), ALLOT_OK);
	/* The file removed: the keys stay, and a file that stays missing
	 * is one failure, not one a check. */
	ck_assert_int_eq(unlink(jwks_a), 0);
	for (int i = 0; i < 3; i++) {
		usleep(50 * 1000);
		ck_assert_int_eq(check_token(v, t2, &c), ALLOT_JWT_OK);
	}
	allot_jwt_verifier_stats(v, &st);
	ck_assert_uint_eq(st.reload_failures, 2);
	free(t1);
	free(t2);
	free(cl);
	allot_jwt_verifier_destroy(v);
}
END_TEST

/* A token verified once is remembered: the second use is a hit with the
 * same claims, its expiry is still checked at each use, and no_cache
 * remembers nothing. */
START_TEST(verified_tokens_are_remembered)
{
	allot_jwt_verifier *v = verifier(0, "org");
	allot_jwt_claims c1, c2;
	char *cl = claims(ISS, "\"" AUD "\"", "svc", 10, ",\"org\":\"acme\"");
	char *t = mint_token(&ec1, JWT_ALG_ES256, cl);
	allot_jwt_issuer iss = { ISS, jwks_a };
	allot_jwt_options o = { 0 };
	allot_jwt_verifier *w = NULL;
	allot_jwt_stats st;

	ck_assert_int_eq(check_token(v, t, &c1), ALLOT_JWT_OK);
	ck_assert_int_eq(check_token(v, t, &c2), ALLOT_JWT_OK);
	ck_assert_int_eq(memcmp(&c1, &c2, sizeof c1), 0);
	allot_jwt_verifier_stats(v, &st);
	ck_assert_uint_eq(st.by_status[ALLOT_JWT_OK], 2);
	ck_assert_uint_eq(st.cache_hits, 1);
	/* Remembered, then past its expiry: refused. */
	ck_assert_int_eq(allot_jwt_verify(v, t, strlen(t), now + 11, &c2),
	    ALLOT_JWT_EXPIRED);
	/* A token differing in one byte of its signature is not the one
	 * remembered. */
	t[strlen(t) - 3] ^= 1;
	ck_assert_int_ne(check_token(v, t, &c2), ALLOT_JWT_OK);
	allot_jwt_verifier_stats(v, &st);
	ck_assert_uint_eq(st.cache_hits, 1);
	allot_jwt_verifier_destroy(v);

	t[strlen(t) - 3] ^= 1;
	o.issuers = &iss;
	o.n_issuers = 1;
	o.audience = AUD;
	o.no_cache = true;
	ck_assert_int_eq(allot_jwt_verifier_create(&o, &w), ALLOT_OK);
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(check_token(w, t, &c2), ALLOT_JWT_OK);
	allot_jwt_verifier_stats(w, &st);
	ck_assert_uint_eq(st.cache_hits, 0);
	allot_jwt_verifier_destroy(w);
	o.no_cache = false;
	o.cache_entries = (1u << 20) + 1;
	ck_assert_int_eq(allot_jwt_verifier_create(&o, &w), ALLOT_EINVAL);
	free(t);
	free(cl);
}
END_TEST

typedef struct worker {
	allot_jwt_verifier *v;
	const char *token;
	int ok, n;
} worker;

static void *
verify_loop(void *arg)
{
	worker *w = arg;
	allot_jwt_claims c;

	for (int i = 0; i < w->n; i++)
		w->ok += allot_jwt_verify(w->v, w->token, strlen(w->token),
		             now, &c) == ALLOT_JWT_OK;
	return NULL;
}

/* Four threads verify while the file is rewritten under them: every
 * valid token passes throughout. */
START_TEST(rotation_under_load_refuses_no_valid_caller)
{
	allot_jwt_verifier *v = verifier(0, NULL);
	char *cl = claims(ISS, "\"" AUD "\"", "svc", 600, "");
	char *t = mint_token(&ec1, JWT_ALG_ES256, cl);
	mint_key *with[] = { &ec1, &rsa2 }, *without[] = { &ec1 };
	pthread_t th[4];
	worker w[4];

	for (int i = 0; i < 4; i++) {
		w[i] = (worker) { .v = v, .token = t, .n = 1500 };
		ck_assert_int_eq(
		    pthread_create(&th[i], NULL, verify_loop, &w[i]), 0);
	}
	for (int r = 0; r < 20; r++) {
		mint_jwks(jwks_a, r % 2 ? with : without, r % 2 ? 2 : 1);
		usleep(10 * 1000);
	}
	for (int i = 0; i < 4; i++) {
		ck_assert_int_eq(pthread_join(th[i], NULL), 0);
		ck_assert_int_eq(w[i].ok, w[i].n);
	}
	free(t);
	free(cl);
	allot_jwt_verifier_destroy(v);
}
END_TEST

static Suite *
jwt_suite(void)
{
	Suite *s = suite_create("jwt");
	TCase *tc = tcase_create("jwt");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, valid_tokens_give_their_subject);
	tcase_add_test(tc, wrong_tokens_get_no_identity);
	tcase_add_test(tc, the_key_decides_the_algorithm);
	tcase_add_test(tc, malformed_tokens);
	tcase_add_test(tc, leeway_is_bounded);
	tcase_add_test(tc, bad_key_files);
	tcase_add_test(tc, keys_rotate_through_the_file);
	tcase_add_test(tc, verified_tokens_are_remembered);
	tcase_add_test(tc, rotation_under_load_refuses_no_valid_caller);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(jwt_suite)
