/* SPDX-License-Identifier: MIT */
/*
 * Integration suite for the example protected service: scripts/mkcerts
 * makes a throwaway CA and SPIFFE client certificates, each test starts
 * the real allot-example-service binary on a free loopback port with its
 * own quota file, talks to it over real mutual TLS with libcurl, checks
 * what the service itself counted in /stats, and stops it with SIGTERM
 * (a clean exit is part of every test). This file has the suite, main and
 * the unit cases: the SPIFFE rules (allot/identity.h) and the gRPC
 * mapping (allot/grpc.h). The integration cases are in
 * service_identity.c (identities from verified certificates and nothing
 * else, the plain-HTTP modes), service_limits.c (the burst of
 * rate-limiting-between-services.txt, 30 simultaneous requests, 10
 * admitted, and its Retry-After exercise; the exact 429 contract and
 * shadow mode; reserve-then-settle on /export; the concurrency limiter
 * under a burst of slow exports while /lookup stays fast) and
 * service_lifecycle.c (/stats, SIGTERM, with a coordinator), on the
 * harness of service_harness.c. Fails at once when the service was not
 * built (the suite depends on it in meson).
 */
#include <check.h>
#include <curl/curl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <allot/allot.h>
#include <allot/grpc.h>
#include <allot/identity.h>

#include "allotd.h"
#include "service_harness.h"

/* ---------------------------------------------------------------- */
/* Unit: SPIFFE rules and the gRPC mapping                          */
/* ---------------------------------------------------------------- */

static int
check_id(const char *id)
{
	return allot_spiffe_id_check(id, strlen(id));
}

START_TEST(test_spiffe_rules)
{
	ck_assert_int_eq(check_id(ID_CHECKOUT), ALLOT_OK);
	ck_assert_int_eq(check_id("spiffe://td"), ALLOT_OK);
	ck_assert_int_eq(check_id("spiffe://a.b-c_d/X.y-z_0"), ALLOT_OK);
	static const char *const bad[] = {
		"",
		"spiffe://",
		"spiffe:///path",
		"SPIFFE://td/a",
		"https://td/a",
		"spiffe://TD/a",
		"spiffe://td:443/a",
		"spiffe://user@td/a",
		"spiffe://td/",
		"spiffe://td//a",
		"spiffe://td/a/",
		"spiffe://td/./a",
		"spiffe://td/a/..",
		"spiffe://td/a?x=1",
		"spiffe://td/a#f",
		"spiffe://td/a%20b",
		"spiffe://td/a b",
		"spiffe:/td/a",
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		ck_assert_msg(
		    check_id(bad[i]) == ALLOT_EPROTO, "'%s' accepted", bad[i]);
	ck_assert_int_eq(allot_spiffe_id_check(NULL, 0), ALLOT_EINVAL);
	/* Length limits: trust domain 255, whole ID 2048. */
	char long_id[2100] = "spiffe://";
	memset(long_id + 9, 'a', 256);
	long_id[9 + 256] = '\0';
	ck_assert_int_eq(check_id(long_id), ALLOT_EPROTO);
	long_id[9 + 255] = '\0';
	ck_assert_int_eq(check_id(long_id), ALLOT_OK);
	strcpy(long_id, "spiffe://td/");
	memset(long_id + 12, 'x', 2037);
	long_id[12 + 2037] = '\0';
	ck_assert_int_eq(check_id(long_id), ALLOT_EPROTO); /* 2049 */
	long_id[12 + 2036] = '\0';
	ck_assert_int_eq(check_id(long_id), ALLOT_OK); /* 2048 */

	/* The X509-SVID rule: exactly one URI SAN. */
	char buf[ALLOT_IDENTITY_MAX + 1] = "untouched";
	const char *one[] = { ID_CHECKOUT };
	size_t one_len[] = { strlen(ID_CHECKOUT) };
	ck_assert_int_eq(allot_identity_from_uri_sans(
	                     one, one_len, 1, NULL, buf, sizeof buf),
	    ALLOT_OK);
	ck_assert_str_eq(buf, ID_CHECKOUT);
	ck_assert_int_eq(allot_identity_from_uri_sans(one, one_len, 1,
	                     "prod.example.internal", buf, sizeof buf),
	    ALLOT_OK);
	strcpy(buf, "untouched");
	ck_assert_int_eq(allot_identity_from_uri_sans(
	                     one, one_len, 1, "prod.example", buf, sizeof buf),
	    ALLOT_ENOENT);
	ck_assert_int_eq(allot_identity_from_uri_sans(one, one_len, 1,
	                     "prod.example.internal.evil", buf, sizeof buf),
	    ALLOT_ENOENT);
	ck_assert_int_eq(
	    allot_identity_from_uri_sans(NULL, NULL, 0, NULL, buf, sizeof buf),
	    ALLOT_ENOENT);
	const char *two[] = { ID_CHECKOUT, ID_REPORTING };
	size_t two_len[] = { strlen(ID_CHECKOUT), strlen(ID_REPORTING) };
	ck_assert_int_eq(allot_identity_from_uri_sans(
	                     two, two_len, 2, NULL, buf, sizeof buf),
	    ALLOT_EPROTO);
	/* A NUL inside the SAN would hide a suffix. */
	const char nul[] = "spiffe://td/a\0.evil";
	const char *nuls[] = { nul };
	size_t nul_len[] = { sizeof nul - 1 };
	ck_assert_int_eq(allot_identity_from_uri_sans(
	                     nuls, nul_len, 1, NULL, buf, sizeof buf),
	    ALLOT_EPROTO);
	ck_assert_int_eq(
	    allot_identity_from_uri_sans(one, one_len, 1, NULL, buf, 10),
	    ALLOT_ERANGE);
	ck_assert_str_eq(buf, "untouched");
}
END_TEST

/* Minimal protobuf reader for the test: varint and length fields. */
static uint64_t
pb_varint(const uint8_t **p, const uint8_t *end)
{
	uint64_t v = 0;
	for (int shift = 0; *p < end && shift < 64; shift += 7) {
		uint8_t b = *(*p)++;
		v |= (uint64_t) (b & 0x7f) << shift;
		if (!(b & 0x80))
			break;
	}
	return v;
}

START_TEST(test_grpc_mapping)
{
	allot_decision d;
	allot_grpc_status st;
	memset(&d, 0, sizeof d);
	d.allowed = true;
	d.cost = 1;
	ck_assert_int_eq(
	    allot_grpc_from_decision(&d, ALLOT_OK, &st), ALLOT_OK);
	ck_assert_int_eq(st.code, ALLOT_GRPC_OK);
	ck_assert_str_eq(st.retry_after, "");
	ck_assert_int_eq(allot_grpc_status_details(&st, NULL, 0), 0);
	/* Shadow: allowed is allowed. */
	d.shadow_denied = true;
	ck_assert_int_eq(
	    allot_grpc_from_decision(&d, ALLOT_OK, &st), ALLOT_OK);
	ck_assert_int_eq(st.code, ALLOT_GRPC_OK);

	/* A denial 1.25 s from tokens: RESOURCE_EXHAUSTED, "2" seconds
	 * as the HTTP header would say, 1250 ms pushback, exact
	 * RetryInfo. */
	memset(&d, 0, sizeof d);
	d.cost = 20;
	d.retry_after_ns = 1250000000ull;
	ck_assert_int_eq(
	    allot_grpc_from_decision(&d, ALLOT_OK, &st), ALLOT_OK);
	ck_assert_int_eq(st.code, ALLOT_GRPC_RESOURCE_EXHAUSTED);
	char http_ra[24];
	allot_fmt_retry_after(&d, http_ra, sizeof http_ra);
	ck_assert_str_eq(st.retry_after, http_ra);
	ck_assert_str_eq(st.retry_after, "2");
	ck_assert_str_eq(st.pushback_ms, "1250");
	ck_assert_str_eq(st.message, "rate limit exceeded; retry after 2s");
	ck_assert_int_eq(st.retry_delay_seconds, 1);
	ck_assert_int_eq(st.retry_delay_nanos, 250000000);
	ck_assert_ptr_null(strchr(st.message, '%'));

	/* google.rpc.Status bytes, decoded field by field. */
	int need = allot_grpc_status_details(&st, NULL, 0);
	ck_assert_int_gt(need, 0);
	ck_assert_int_le(need, 256);
	uint8_t buf[256];
	ck_assert_int_eq(allot_grpc_status_details(&st, buf, 5), need);
	ck_assert_int_eq(
	    allot_grpc_status_details(&st, buf, sizeof buf), need);
	const uint8_t *p = buf, *end = buf + need;
	ck_assert_int_eq(pb_varint(&p, end), 1 << 3 | 0);
	ck_assert_int_eq(pb_varint(&p, end), 8);
	ck_assert_int_eq(pb_varint(&p, end), 2 << 3 | 2);
	uint64_t ml = pb_varint(&p, end);
	ck_assert_uint_eq(ml, strlen(st.message));
	ck_assert_int_eq(memcmp(p, st.message, ml), 0);
	p += ml;
	ck_assert_int_eq(pb_varint(&p, end), 3 << 3 | 2);
	uint64_t al = pb_varint(&p, end);
	ck_assert_ptr_eq(p + al, end);
	ck_assert_int_eq(pb_varint(&p, end), 1 << 3 | 2);
	uint64_t ul = pb_varint(&p, end);
	ck_assert_uint_eq(ul, strlen(ALLOT_GRPC_RETRY_INFO_TYPE));
	ck_assert_int_eq(memcmp(p, ALLOT_GRPC_RETRY_INFO_TYPE, ul), 0);
	p += ul;
	ck_assert_int_eq(pb_varint(&p, end), 2 << 3 | 2);
	uint64_t il = pb_varint(&p, end);
	ck_assert_ptr_eq(p + il, end);
	ck_assert_int_eq(pb_varint(&p, end), 1 << 3 | 2); /* retry_delay */
	uint64_t dl = pb_varint(&p, end);
	ck_assert_ptr_eq(p + dl, end);
	ck_assert_int_eq(pb_varint(&p, end), 1 << 3 | 0);
	ck_assert_int_eq(pb_varint(&p, end), 1);
	ck_assert_int_eq(pb_varint(&p, end), 2 << 3 | 0);
	ck_assert_int_eq(pb_varint(&p, end), 250000000);
	ck_assert_ptr_eq(p, end);

	/* A cost that can never pass: no retry (pushback -1). */
	memset(&d, 0, sizeof d);
	d.cost = 5000;
	ck_assert_int_eq(
	    allot_grpc_from_decision(&d, ALLOT_ETOOBIG, &st), ALLOT_OK);
	ck_assert_int_eq(st.code, ALLOT_GRPC_RESOURCE_EXHAUSTED);
	ck_assert_str_eq(st.pushback_ms, "-1");
	ck_assert_str_eq(st.retry_after, "");
	ck_assert_int_eq(
	    allot_grpc_from_decision(&d, ALLOT_EINVAL, &st), ALLOT_EINVAL);

	/* Concurrency: UNAVAILABLE, distinguishable from quota. */
	ck_assert_int_eq(
	    allot_grpc_from_conc(ALLOT_EBUSY, 1500, &st), ALLOT_OK);
	ck_assert_int_eq(st.code, ALLOT_GRPC_UNAVAILABLE);
	ck_assert_str_eq(st.retry_after, "2");
	ck_assert_str_eq(st.pushback_ms, "1500");
	ck_assert_str_eq(
	    st.message, "concurrency limit exceeded; retry after 2s");
	ck_assert_int_eq(
	    allot_grpc_from_conc(ALLOT_ETIMEDOUT, 10, &st), ALLOT_OK);
	ck_assert_int_eq(
	    allot_grpc_from_conc(ALLOT_OK, 10, &st), ALLOT_EINVAL);
	ck_assert_int_eq(
	    allot_grpc_from_conc(ALLOT_EBUSY, 0, &st), ALLOT_EINVAL);
}
END_TEST

static Suite *
service_suite(void)
{
	Suite *s = suite_create("service");

	TCase *unit = tcase_create("unit");
	tcase_add_test(unit, test_spiffe_rules);
	tcase_add_test(unit, test_grpc_mapping);
	suite_add_tcase(s, unit);

	TCase *tc = tcase_create("integration");
	tcase_add_unchecked_fixture(tc, svc_certs_setup, svc_certs_teardown);
	tcase_set_timeout(tc, 120);
	service_identity_cases(tc); /* service_identity.c */
	service_limit_cases(tc); /* service_limits.c */
	service_lifecycle_cases(tc); /* service_lifecycle.c */
	service_token_cases(tc); /* service_tokens.c */
	suite_add_tcase(s, tc);
	return s;
}

int
main(void)
{
	/* Outside a test a fixture's failure is no check failure: look the
	 * paths up by hand, and fail (not skip) when one is missing. */
	const char *build = pc_build_dir();
	const char *src = getenv("ALLOT_SOURCE_DIR");
	if (src == NULL) {
		fprintf(stderr,
		    "ALLOT_SOURCE_DIR must be set (meson test sets it)\n");
		return EXIT_FAILURE;
	}
	snprintf(svc_service_path, sizeof svc_service_path,
	    "%s/examples/allot-example-service", build);
	snprintf(svc_mkcerts_path, sizeof svc_mkcerts_path,
	    "%s/scripts/mkcerts", src);
	if (access(svc_service_path, X_OK) != 0) {
		fprintf(stderr,
		    "%s is not built: the suite depends on it in meson; is "
		    "ALLOT_BUILD_DIR the build it was made in?\n",
		    svc_service_path);
		return EXIT_FAILURE;
	}
	if (curl_global_init(CURL_GLOBAL_ALL) != CURLE_OK)
		return EXIT_FAILURE;
	SRunner *sr = srunner_create(service_suite());
	srunner_run_all(sr, CK_ENV); /* CK_VERBOSITY, default normal */
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	curl_global_cleanup();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
