/* SPDX-License-Identifier: MIT */
/*
 * Mutual TLS between agents and allotd (nng's tls+tcp transport): an
 * agent with a certificate from the configured CA registers and syncs; an
 * agent with a certificate from another CA, or with none, never gets a
 * session, and allotd keeps serving the good one. Certificates come from
 * scripts/mkcerts.
 */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <allot/allot.h>

#include "allotd.h"
#include "proc.h"
#include "runner.h"

/* The test's allotd on tls+tcp (tests/support/allotd.h); its directory
 * holds the certificates, its quota file the agents' config. */
static pc_coord C;
static const char *dir = C.dir;
static const char *url = C.url;

static void
setup(void)
{
	pc_coord_init(&C, "/tmp/allot-tls",
	    "quotas:\n  default: {tokens_per_second: 10, burst: 20}\n");
	const char *src = getenv("ALLOT_SOURCE_DIR");
	char cmd[4096];
	snprintf(cmd, sizeof cmd,
	    "%s/scripts/mkcerts %s/ca1 a=spiffe://t/svc >/dev/null && "
	    "%s/scripts/mkcerts %s/ca2 a=spiffe://t/a >/dev/null && "
	    "cat %s/ca1/a.pem %s/ca1/a.key > %s/good.pem && "
	    "cat %s/ca2/a.pem %s/ca2/a.key > %s/bad.pem && echo ok",
	    src, dir, src, dir, dir, dir, dir, dir, dir, dir);
	char *out = pc_shell(cmd);
	ck_assert_msg(out != NULL && strcmp(out, "ok") == 0,
	    "certificates: %s", out ? out : "(failed)");
	free(out);
	snprintf(C.url, sizeof C.url, "tls+tcp://127.0.0.1:%d", C.port);
	/* allotd's certificate and key in two files (--tls-key); the other
	 * suites give allotd both in one. */
	char cert[256], key[256], ca[256];
	snprintf(cert, sizeof cert, "%s/ca1/server.pem", dir);
	snprintf(key, sizeof key, "%s/ca1/server.key", dir);
	snprintf(ca, sizeof ca, "%s/ca1/ca.pem", dir);
	const char *args[] = { "--tls-cert", cert, "--tls-key", key,
		"--tls-ca", ca, "--interval-ms", "50", NULL };
	pc_coord_spawn(&C, args, NULL);
}

static void
teardown(void)
{
	pc_coord_done(&C, 5000);
}

static allot_agent *
agent(const char *id, const char *cert)
{
	char ca[256], certp[256], err[256];
	const char *cfgp = C.cfg;
	snprintf(ca, sizeof ca, "%s/ca1/ca.pem", dir);
	snprintf(certp, sizeof certp, "%s/%s", dir, cert != NULL ? cert : "");
	allot_config *cfg;
	ck_assert_int_eq(
	    allot_config_load(cfgp, err, sizeof err, &cfg), ALLOT_OK);
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.coordinator = url;
	o.service = "svc";
	o.replica_id = id;
	o.sync_interval_ms = 50;
	o.tls_ca_file = ca;
	o.tls_cert_key_file = cert != NULL ? certp : NULL;
	o.tls_server_name = "localhost";
	allot_agent *a;
	ck_assert_int_eq(allot_agent_create(cfg, &o, &a), ALLOT_OK);
	allot_config_free(cfg);
	return a;
}

START_TEST(mutual_tls)
{
	allot_agent *good = agent("good", "good.pem");
	allot_agent *bad = agent("bad", "bad.pem");
	allot_agent *none = agent("none", NULL);
	allot_sync_stats gs, bs, ns;
	uint64_t t0 = pc_now_ms();
	do {
		pc_sleep_ms(50);
		allot_sync_stats_get(good, &gs);
	} while (gs.syncs_ok < 5 && pc_now_ms() - t0 < 10000);
	ck_assert_msg(gs.connected && gs.syncs_ok >= 5,
	    "the agent with a valid certificate did not sync");
	pc_sleep_ms(500);
	allot_sync_stats_get(bad, &bs);
	allot_sync_stats_get(none, &ns);
	ck_assert_uint_eq(bs.registers, 0);
	ck_assert(!bs.connected);
	ck_assert_uint_eq(ns.registers, 0);
	ck_assert(!ns.connected);
	/* allotd saw one replica only. */
	allot_sync_stats_get(good, &gs);
	ck_assert_uint_eq(gs.replicas, 1);
	/* A tls+tcp address without a CA is refused at create. */
	char err[256];
	allot_config *cfg;
	const char *cfgp = C.cfg;
	ck_assert_int_eq(
	    allot_config_load(cfgp, err, sizeof err, &cfg), ALLOT_OK);
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.coordinator = url;
	allot_agent *x = NULL;
	ck_assert_int_eq(allot_agent_create(cfg, &o, &x), ALLOT_EINVAL);
	allot_config_free(cfg);
	allot_agent_destroy(good);
	allot_agent_destroy(bad);
	allot_agent_destroy(none);
}
END_TEST

/* allotd that cannot load its certificate says which file and why, and
 * exits non-zero (it does not serve plain text instead). */
static void
refused_start(const char *cert, const char *key, const char *want)
{
	char port[64], db[256], ca[256];
	snprintf(port, sizeof port, "tls+tcp://127.0.0.1:%d", pc_free_port());
	snprintf(db, sizeof db, "%s/refused.db", dir);
	snprintf(ca, sizeof ca, "%s/ca1/ca.pem", dir);
	const char *argv[] = { pc_allotd_path(), "--config", C.cfg, "--db", db,
		"--listen", port, "--tls-cert", cert, "--tls-key", key,
		"--tls-ca", ca, NULL };
	pc_run_result r = pc_run(argv, dir, NULL, NULL, NULL, 20000);
	ck_assert_msg(
	    r.status != 0, "allotd started with %s and %s", cert, key);
	ck_assert_msg(strstr(r.err, want) != NULL,
	    "allotd's error does not name %s: %s", want, r.err);
	pc_run_free(&r);
}

START_TEST(certificate_files)
{
	char cert[256], key[256], other[256];
	snprintf(cert, sizeof cert, "%s/ca1/server.pem", dir);
	snprintf(key, sizeof key, "%s/missing.key", dir);
	snprintf(other, sizeof other, "%s/ca1/a.key", dir);
	/* A key file that is not there. */
	refused_start(cert, key, "missing.key: No such file");
	/* A key that is not the certificate's: both files named. */
	refused_start(cert, other, "a.key:");
}
END_TEST

static Suite *
tls_suite(void)
{
	Suite *s = suite_create("tls");
	TCase *tc = tcase_create("mtls");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, mutual_tls);
	tcase_add_test(tc, certificate_files);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(tls_suite)
