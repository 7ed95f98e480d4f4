/* SPDX-License-Identifier: MIT */
/*
 * The service suite's token cases: the example service keyed by signed
 * service tokens (--jwt-issuer, --jwks; allot/jwt.h). A valid token gets
 * its subject's quota; forged, expired, wrong-audience, wrong-issuer and
 * malformed ones get 401 with the reason and charge no bucket; a token
 * wins over the connection's certificate and a request without one falls
 * back to it; the JWKS file rotated mid-run keeps valid callers served.
 */
#include <check.h>
#include <curl/curl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "jwt_mint.h"
#include "proc.h"
#include "service_harness.h"

#define ISS "https://tokens.example.internal"
#define AUD "orders"

/* Claims for `sub`: issuer `iss`, audience `aud`, expiring in `exp_in`
 * seconds. */
static char *
token_for(const mint_key *k, const char *iss, const char *aud, const char *sub,
    long exp_in)
{
	char claims[1024];

	snprintf(claims, sizeof claims,
	    "{\"iss\":\"%s\",\"aud\":\"%s\",\"sub\":\"%s\",\"exp\":%lld}", iss,
	    aud, sub, (long long) time(NULL) + exp_in);
	return mint_token(k, JWT_ALG_RS256, claims);
}

/* "Authorization: Bearer <t>" (static buffer: one at a time). */
static const char *
bearer(const char *t)
{
	static char h[4096];

	snprintf(h, sizeof h, "Authorization: Bearer %s", t);
	return h;
}

/* GET /lookup on `h` with `header`; the status. */
static long
lookup(CURL *h, const struct svc *s, bool plain, const char *header,
    struct resp *r)
{
	ck_assert_int_eq(svc_get(h, s, plain, "/lookup", header, r), CURLE_OK);
	return r->status;
}

static void
assert_refused(CURL *h, const struct svc *s, const char *header,
    const char *reason, struct resp *r)
{
	char want[128], buf[128];

	ck_assert_int_eq(lookup(h, s, true, header, r), 401);
	snprintf(want, sizeof want,
	    "{\"error\":\"invalid_token\",\"reason\":\"%s\"}", reason);
	ck_assert_str_eq(r->body, want);
	ck_assert_ptr_nonnull(
	    svc_header(r, "WWW-Authenticate", buf, sizeof buf));
	ck_assert_ptr_null(svc_header(r, "RateLimit-Policy", buf, sizeof buf));
}

/* /stats of a plain-HTTP service (malloc'd). */
static char *
plain_stats(const struct svc *s, struct resp *r)
{
	CURL *h = svc_client(svc_dir, NULL);

	ck_assert_int_eq(svc_get(h, s, true, "/stats", NULL, r), CURLE_OK);
	ck_assert_int_eq(r->status, 200);
	curl_easy_cleanup(h);
	return strdup(r->body);
}

START_TEST(test_tokens_name_callers)
{
	struct svc s;
	struct resp *r = malloc(sizeof *r);
	char jwks[PATH_MAX];
	mint_key k1, forger;
	mint_key *keys[] = { &k1 };
	char *good, *t;
	CURL *h;

	snprintf(jwks, sizeof jwks, "%s/jwks-%d.json", svc_dir, getpid());
	mint_rsa(&k1, "k1", 2048);
	mint_rsa(&forger, "k1", 2048); /* the right kid, another key */
	mint_jwks(jwks, keys, 1);
	svc_start(&s, svc_cfg_identities, false, "--plain-http",
	    "--jwt-issuer", ISS, "--jwks", jwks, "--jwt-audience", AUD, NULL);
	h = svc_client(svc_dir, NULL);

	good = token_for(&k1, ISS, AUD, ID_CHECKOUT, 600);
	ck_assert_int_eq(lookup(h, &s, true, bearer(good), r), 200);
	svc_assert_policy(r, ID_CHECKOUT, 1000, 2);
	ck_assert_str_eq(
	    r->body, "{\"result\":\"found\",\"caller\":\"" ID_CHECKOUT "\"}");
	/* No token: the default bucket, as any caller without identity. */
	ck_assert_int_eq(lookup(h, &s, true, NULL, r), 200);
	svc_assert_policy(r, "default", 20, 2);

	t = token_for(&forger, ISS, AUD, ID_CHECKOUT, 600);
	assert_refused(h, &s, bearer(t), "signature", r);
	free(t);
	t = token_for(&k1, ISS, AUD, ID_CHECKOUT, -60);
	assert_refused(h, &s, bearer(t), "expired", r);
	free(t);
	t = token_for(&k1, ISS, "payments", ID_CHECKOUT, 600);
	assert_refused(h, &s, bearer(t), "audience", r);
	free(t);
	t = token_for(&k1, "https://evil.test", AUD, ID_CHECKOUT, 600);
	assert_refused(h, &s, bearer(t), "issuer", r);
	free(t);
	assert_refused(
	    h, &s, "Authorization: Basic Y2hlY2tvdXQ6eA==", "malformed", r);
	assert_refused(
	    h, &s, "Authorization: Bearer not.a.token", "malformed", r);
	/* The connection is still checkout's with its token. */
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(lookup(h, &s, true, bearer(good), r), 200);
		svc_assert_policy(r, ID_CHECKOUT, 1000, 2);
	}
	curl_easy_cleanup(h);

	char *doc = plain_stats(&s, r);
	ck_assert_int_eq(svc_jfield(doc, "\"tokens\":{", "signature"), 1);
	ck_assert_int_eq(svc_jfield(doc, "\"tokens\":{", "expired"), 1);
	ck_assert_int_eq(svc_jfield(doc, "\"tokens\":{", "audience"), 1);
	ck_assert_int_eq(svc_jfield(doc, "\"tokens\":{", "issuer"), 1);
	ck_assert_int_eq(svc_jfield(doc, "\"tokens\":{", "malformed"), 1);
	ck_assert_int_eq(svc_jfield(doc, "\"tokens\":{", "not_bearer"), 1);
	ck_assert_int_eq(svc_jfield(doc, "\"tokens\":{", "ok"), 3);
	/* The good token, checked once and remembered for the other two. */
	ck_assert_int_eq(svc_jfield(doc, "\"tokens\":{", "cache_hits"), 2);
	/* Refused tokens charged nobody: 3 lookups by checkout, 1 by the
	 * caller without identity, nothing else. */
	ck_assert_int_eq(svc_caller_field(doc, ID_CHECKOUT, "requests"), 3);
	ck_assert_int_eq(svc_caller_field(doc, NULL, "requests"), 1);
	free(doc);
	svc_stop(&s);
	free(good);
	mint_free(&k1);
	mint_free(&forger);
	unlink(jwks);
	free(r);
}
END_TEST

/* Over mutual TLS: a token names the caller whatever the certificate;
 * without one the certificate does. */
START_TEST(test_token_over_mtls)
{
	struct svc s;
	struct resp *r = malloc(sizeof *r);
	char jwks[PATH_MAX];
	mint_key k1;
	mint_key *keys[] = { &k1 };
	char *t;
	CURL *h;

	snprintf(jwks, sizeof jwks, "%s/jwks-%d.json", svc_dir, getpid());
	mint_rsa(&k1, "k1", 2048);
	mint_jwks(jwks, keys, 1);
	svc_start(&s, svc_cfg_identities, true, "--jwt-issuer", ISS, "--jwks",
	    jwks, "--jwt-audience", AUD, NULL);
	h = svc_client(svc_dir, "reporting");
	t = token_for(&k1, ISS, AUD, ID_CHECKOUT, 600);
	ck_assert_int_eq(
	    svc_get(h, &s, false, "/lookup", bearer(t), r), CURLE_OK);
	ck_assert_int_eq(r->status, 200);
	svc_assert_policy(r, ID_CHECKOUT, 1000, 2);
	ck_assert_int_eq(svc_get(h, &s, false, "/lookup", NULL, r), CURLE_OK);
	svc_assert_policy(r, ID_REPORTING, 200, 2);
	curl_easy_cleanup(h);
	svc_stop(&s);
	free(t);
	mint_free(&k1);
	unlink(jwks);
	free(r);
}
END_TEST

/* The issuer rotates: k2 is published beside k1, tokens move to k2, k1
 * is withdrawn. A k2 caller sending a request every 20 ms throughout is
 * never refused; a k1 token stops passing once k1 is gone. */
START_TEST(test_key_rotation_mid_run)
{
	struct svc s;
	struct resp *r = malloc(sizeof *r);
	char jwks[PATH_MAX];
	mint_key k1, k2;
	mint_key *old[] = { &k1 }, *both[] = { &k1, &k2 }, *fresh[] = { &k2 };
	char *t1, *t2;
	CURL *h1, *h2;
	int served = 0, refused = 0;
	uint64_t until;

	snprintf(jwks, sizeof jwks, "%s/jwks-%d.json", svc_dir, getpid());
	mint_rsa(&k1, "k1", 2048);
	mint_rsa(&k2, "k2", 2048);
	mint_jwks(jwks, old, 1);
	svc_start(&s, svc_cfg_identities, false, "--plain-http",
	    "--jwt-issuer", ISS, "--jwks", jwks, "--jwt-audience", AUD, NULL);
	h1 = svc_client(svc_dir, NULL);
	h2 = svc_client(svc_dir, NULL);
	t1 = token_for(&k1, ISS, AUD, ID_REPORTING, 600);
	t2 = token_for(&k2, ISS, AUD, ID_CHECKOUT, 600);
	ck_assert_int_eq(lookup(h1, &s, true, bearer(t1), r), 200);
	assert_refused(h2, &s, bearer(t2), "no_key", r);

	/* Published: k2's tokens pass within the service's check (1 s). */
	mint_jwks(jwks, both, 2);
	until = pc_now_ms() + 5000;
	while (
	    lookup(h2, &s, true, bearer(t2), r) != 200 && pc_now_ms() < until)
		usleep(50 * 1000);
	ck_assert_int_eq(r->status, 200);
	svc_assert_policy(r, ID_CHECKOUT, 1000, 2);

	/* Withdrawn: k2's caller keeps going, k1's stops. */
	mint_jwks(jwks, fresh, 1);
	until = pc_now_ms() + 3000;
	while (pc_now_ms() < until) {
		if (lookup(h2, &s, true, bearer(t2), r) == 200)
			served++;
		else
			refused++;
		usleep(20 * 1000);
	}
	ck_assert_int_eq(refused, 0);
	ck_assert_int_gt(served, 10);
	/* k1's caller, on the connection it was served on: refused. */
	assert_refused(h1, &s, bearer(t1), "no_key", r);

	char *doc = plain_stats(&s, r);
	ck_assert_int_eq(svc_jfield(doc, "\"tokens\":{", "key_reloads"), 2);
	free(doc);
	curl_easy_cleanup(h1);
	curl_easy_cleanup(h2);
	svc_stop(&s);
	free(t1);
	free(t2);
	mint_free(&k1);
	mint_free(&k2);
	unlink(jwks);
	free(r);
}
END_TEST

/* A key file that does not load stops the service at start, saying why. */
START_TEST(test_bad_jwks_refused_at_start)
{
	struct svc s;
	char jwks[PATH_MAX], *err;
	FILE *f;

	snprintf(jwks, sizeof jwks, "%s/jwks-%d.json", svc_dir, getpid());
	f = fopen(jwks, "w");
	ck_assert_ptr_nonnull(f);
	fputs("{\"keys\": [{\"kty\": \"RSA\"}]}", f);
	fclose(f);
	ck_assert(!svc_try_start(&s, svc_cfg_identities, false, "--plain-http",
	    "--jwt-issuer", ISS, "--jwks", jwks, NULL));
	ck_assert_int_eq(s.exit_status, 2);
	err = pc_read_file(s.err);
	ck_assert_ptr_nonnull(strstr(err, "key 0 left out"));
	free(err);
	ck_assert(!svc_try_start(&s, svc_cfg_identities, false, "--plain-http",
	    "--jwt-issuer", ISS, NULL));
	ck_assert_int_eq(s.exit_status, 2);
	unlink(jwks);
}
END_TEST

void
service_token_cases(TCase *tc)
{
	tcase_add_test(tc, test_tokens_name_callers);
	tcase_add_test(tc, test_token_over_mtls);
	tcase_add_test(tc, test_key_rotation_mid_run);
	tcase_add_test(tc, test_bad_jwks_refused_at_start);
}
