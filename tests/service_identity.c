/* SPDX-License-Identifier: MIT */
/*
 * The service suite's identity cases: scripts/mkcerts run again remakes
 * nothing (and refuses bad arguments), each SPIFFE identity from a
 * verified client certificate gets its own quota while everyone without
 * one (no certificate, no URI SAN, a CA nobody trusts, an identity the
 * config does not know) shares the default, a forged identity header is
 * ignored, and the plain-HTTP modes (the header trusted only when opted
 * in, and never over TLS).
 */
#include <check.h>
#include <curl/curl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proc.h"
#include "service_harness.h"

/* ---------------------------------------------------------------- */
/* mkcerts                                                          */
/* ---------------------------------------------------------------- */

START_TEST(test_mkcerts_idempotent)
{
	char path[PATH_MAX + 32];
	static const char *const files[] = { "ca.pem", "server.pem",
		"checkout.pem", "checkout.key", "nosan.pem" };
	char *before[5];
	for (int i = 0; i < 5; i++) {
		snprintf(path, sizeof path, "%s/%s", svc_dir, files[i]);
		before[i] = pc_read_file(path);
		ck_assert_ptr_nonnull(before[i]);
	}
	ck_assert_int_eq(svc_mkcerts(svc_dir), 0);
	for (int i = 0; i < 5; i++) {
		snprintf(path, sizeof path, "%s/%s", svc_dir, files[i]);
		char *after = pc_read_file(path);
		ck_assert_ptr_nonnull(after);
		ck_assert_msg(
		    strcmp(before[i], after) == 0, "%s was remade", files[i]);
		free(after);
		free(before[i]);
	}
	/* Bad arguments are refused, not half-done. */
	char *bad[] = { svc_mkcerts_path, svc_dir, (char *) "not-a-spiffe-id",
		NULL };
	ck_assert_int_eq(svc_run(bad), 2);
	char *dup[] = { svc_mkcerts_path, svc_dir, (char *) "x=spiffe://a/b",
		(char *) "x=spiffe://a/c", NULL };
	ck_assert_int_eq(svc_run(dup), 2);
}
END_TEST

/* ---------------------------------------------------------------- */
/* Identity                                                         */
/* ---------------------------------------------------------------- */

START_TEST(test_identities_map_to_quotas)
{
	struct svc s;
	struct resp *r = malloc(sizeof *r);
	svc_start(&s, svc_cfg_identities, true, NULL);

	svc_get1(&s, svc_dir, "checkout", "/lookup", NULL, r);
	ck_assert_int_eq(r->status, 200);
	svc_assert_policy(r, ID_CHECKOUT, 1000, 2);
	svc_assert_ratelimit_headers(r);
	svc_get1(&s, svc_dir, "reporting", "/lookup", NULL, r);
	ck_assert_int_eq(r->status, 200);
	svc_assert_policy(r, ID_REPORTING, 200, 2);
	ck_assert_str_eq(
	    r->body, "{\"result\":\"found\",\"caller\":\"" ID_REPORTING "\"}");

	/* Everyone without a verified identity shares the default bucket:
	 * no certificate, a certificate without a URI SAN, one signed by a
	 * CA nobody trusts (naming checkout!), and a verified identity
	 * the config does not know. */
	svc_get1(&s, svc_dir, NULL, "/lookup", NULL, r);
	ck_assert_int_eq(r->status, 200);
	svc_assert_policy(r, "default", 20, 2);
	ck_assert_str_eq(r->body, "{\"result\":\"found\",\"caller\":null}");
	svc_get1(&s, svc_dir, "nosan", "/lookup", NULL, r);
	svc_assert_policy(r, "default", 20, 2);
	svc_get1(&s, svc_other_ca, "checkout", "/lookup", NULL, r);
	ck_assert_int_eq(r->status, 200);
	svc_assert_policy(r, "default", 20, 2);
	svc_get1(&s, svc_dir, "stranger", "/lookup", NULL, r);
	svc_assert_policy(r, "default", 20, 2);

	/* The service's own books agree. */
	char *doc = svc_stats(&s);
	ck_assert_int_eq(
	    svc_caller_field(doc, ID_CHECKOUT, "lookups_done"), 1);
	ck_assert_int_eq(
	    svc_caller_field(doc, ID_REPORTING, "lookups_done"), 1);
	ck_assert_int_eq(svc_caller_field(doc, NULL, "lookups_done"), 3);
	ck_assert_int_eq(
	    svc_caller_field(doc, ID_STRANGER, "lookups_done"), 1);
	ck_assert_ptr_nonnull(strstr(
	    doc, "{\"identity\":\"" ID_STRANGER "\",\"quota\":\"default\""));
	ck_assert_int_eq(
	    svc_key_field(doc, ID_CHECKOUT, "/lookup", "allowed"), 1);
	free(doc);
	svc_stop(&s);
	free(r);
}
END_TEST

START_TEST(test_forged_header_ignored)
{
	struct svc s;
	struct resp *r = malloc(sizeof *r);
	svc_start(&s, svc_cfg_identities, true, NULL);
	const char *forged = "X-Allot-Identity: " ID_CHECKOUT;
	svc_get1(&s, svc_dir, NULL, "/lookup", forged, r);
	ck_assert_int_eq(r->status, 200);
	svc_assert_policy(r, "default", 20, 2);
	svc_get1(&s, svc_dir, "reporting", "/lookup", forged, r);
	svc_assert_policy(r, ID_REPORTING, 200, 2);
	/* A connection keeps its identity whatever later requests say. */
	CURL *h = svc_client(svc_dir, "reporting");
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(svc_get(h, &s, false, "/lookup",
		                     i == 1 ? forged : NULL, r),
		    CURLE_OK);
		svc_assert_policy(r, ID_REPORTING, 200, 2);
	}
	curl_easy_cleanup(h);
	char *doc = svc_stats(&s);
	ck_assert_int_eq(svc_caller_field(doc, ID_CHECKOUT, "requests"), -1);
	ck_assert_int_eq(
	    svc_caller_field(doc, ID_REPORTING, "lookups_done"), 4);
	ck_assert_int_eq(svc_caller_field(doc, NULL, "lookups_done"), 1);
	free(doc);
	svc_stop(&s);
	free(r);
}
END_TEST

START_TEST(test_plain_http_modes)
{
	struct svc s;
	struct resp *r = malloc(sizeof *r);
	const char *claim = "X-Allot-Identity: " ID_CHECKOUT;

	/* The header is never trusted by default, not even in plain HTTP. */
	svc_start(&s, svc_cfg_identities, false, "--plain-http", NULL);
	CURL *h = svc_client(svc_dir, NULL);
	ck_assert_int_eq(svc_get(h, &s, true, "/lookup", claim, r), CURLE_OK);
	ck_assert_int_eq(r->status, 200);
	svc_assert_policy(r, "default", 20, 2);
	svc_stop(&s);
	char *err = pc_read_file(s.err);
	ck_assert_ptr_null(strstr(err, "INSECURE"));
	free(err);

	/* Opted in: the header is the identity, and the service says
	 * loudly that it is self-declared. */
	svc_start(&s, svc_cfg_identities, false, "--plain-http",
	    "--insecure-identity-header", NULL);
	err = pc_read_file(s.err);
	ck_assert_ptr_nonnull(
	    strstr(err, "INSECURE: identities are self-declared"));
	free(err);
	ck_assert_int_eq(svc_get(h, &s, true, "/lookup", claim, r), CURLE_OK);
	svc_assert_policy(r, ID_CHECKOUT, 1000, 2);
	/* Same connection, another claim: re-resolved. */
	ck_assert_int_eq(svc_get(h, &s, true, "/lookup",
	                     "X-Allot-Identity: " ID_REPORTING, r),
	    CURLE_OK);
	svc_assert_policy(r, ID_REPORTING, 200, 2);
	ck_assert_int_eq(svc_get(h, &s, true, "/lookup", NULL, r), CURLE_OK);
	svc_assert_policy(r, "default", 20, 2);
	curl_easy_cleanup(h);
	svc_stop(&s);

	/* Never over TLS. */
	ck_assert(!svc_try_start(
	    &s, svc_cfg_identities, true, "--insecure-identity-header", NULL));
	ck_assert_int_eq(s.exit_status, 2);
	free(r);
}
END_TEST

void
service_identity_cases(TCase *tc)
{
	tcase_add_test(tc, test_mkcerts_idempotent);
	tcase_add_test(tc, test_identities_map_to_quotas);
	tcase_add_test(tc, test_forged_header_ignored);
	tcase_add_test(tc, test_plain_http_modes);
}
