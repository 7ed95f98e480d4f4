/* SPDX-License-Identifier: MIT */
/*
 * Identity from certificates (docs/operations.md, "TLS"): a real allotd
 * on tls+tcp with --tls-ca requires every Register to carry a proof signed
 * with the agent's certificate key (agent/sign.c,
 * coordinator/dispatch/authn.c). Real agents and raw protocol clients over
 * mutual TLS on loopback check that a certified replica registers and syncs,
 * that a certificate for another service, a replayed Register, a missing or
 * foreign proof are refused and counted, and that a session cannot be driven
 * from another connection. Certificates come from scripts/mkcerts, made once
 * for the suite (two CAs take seconds of openssl) and copied for each test.
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>

#include <allot/allot.h>

#include "allotd.h"
#include "authn_msg.h"
#include "dispatch/authn.h"
#include "proc.h"
#include "proto_client.h"
#include "runner.h"
#include "sign.h"

static char certdir[64]; /* the suite's certificates and quota file */
/* The test's allotd on tls+tcp (tests/support/allotd.h); its directory
 * holds a copy of the certificates and its databases. */
static pc_coord C;
static const char *const dir = C.dir;
static const char *const url = C.url;

static const char *const keys[] = { "default" };

static void
path(char *buf, size_t len, const char *name)
{
	snprintf(buf, len, "%s/%s", dir, name);
}

static void start_allotd(const char *dbname);

/* The certificates every test uses, made once in the runner process
 * (an unchecked fixture): ca1 with allotd's, svc's, other's and svc2's
 * (the rotation's), ca2 with a foreign svc; the PEM pairs the tests
 * name; mixed.pem, svc2's certificate with svc's key (no pair). */
static void
suite_setup(void)
{
	snprintf(certdir, sizeof certdir, "/tmp/allot-authn-certs-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(certdir));
	const char *src = getenv("ALLOT_SOURCE_DIR");
	char cmd[4096];
	snprintf(cmd, sizeof cmd,
	    "d=%s; s=%s/scripts/mkcerts; "
	    "$s $d/ca1 svc=spiffe://t/ns/prod/sa/svc "
	    "other=spiffe://t/ns/prod/sa/other "
	    "svc2=spiffe://t/ns/prod/sa/svc >/dev/null && "
	    "$s $d/ca2 svc=spiffe://t/ns/prod/sa/svc >/dev/null && "
	    "cat $d/ca1/server.pem $d/ca1/server.key > $d/allotd.pem && "
	    "cat $d/ca1/svc.pem $d/ca1/svc.key > $d/svc.pem && "
	    "cat $d/ca1/other.pem $d/ca1/other.key > $d/other.pem && "
	    "cat $d/ca2/svc.pem $d/ca2/svc.key > $d/foreign.pem && "
	    "cat $d/ca1/svc2.pem $d/ca1/svc2.key > $d/svc2.pem && "
	    "cat $d/ca1/svc2.pem $d/ca1/svc.key > $d/mixed.pem && "
	    "printf 'quotas:\\n  default: {tokens_per_second: 100, burst: "
	    "200}\\n' > $d/q.yaml && echo ok",
	    certdir, src);
	char *out = pc_shell(cmd);
	ck_assert_msg(out != NULL && strcmp(out, "ok") == 0,
	    "certificates: %s", out ? out : "(failed)");
	free(out);
}

static void
suite_teardown(void)
{
	pc_rm_rf(certdir);
}

/* Each test: its own copy of the certificates (rotation replaces files),
 * its ports and its allotd. */
static void
setup(void)
{
	pc_coord_init(&C, "/tmp/allot-authn",
	    "quotas:\n  default: {tokens_per_second: 100, burst: 200}\n");
	char cmd[512];
	snprintf(cmd, sizeof cmd, "cp -a %s/. %s && echo ok", certdir, dir);
	char *out = pc_shell(cmd);
	ck_assert_msg(out != NULL && strcmp(out, "ok") == 0, "copy: %s",
	    out ? out : "(failed)");
	free(out);
	snprintf(C.url, sizeof C.url, "tls+tcp://127.0.0.1:%d", C.port);
	start_allotd("a.db");
}

/* allotd on `url`, storing into `dbname` (a new one forgets every
 * session, as a restart without its store would). */
static void
start_allotd(const char *dbname)
{
	char cert[256], ca[256];
	path(C.db, sizeof C.db, dbname);
	path(cert, sizeof cert, "allotd.pem");
	path(ca, sizeof ca, "ca1/ca.pem");
	const char *args[] = { "--tls-cert", cert, "--tls-ca", ca,
		"--interval-ms", "50", NULL };
	pc_coord_spawn(&C, args, NULL);
}

static void
stop_allotd(void)
{
	pc_allotd_stop(C.pid, 5000);
	C.pid = 0;
}

static void
teardown(void)
{
	pc_coord_done(&C, 5000);
}

static double
rejected(const char *reason)
{
	char series[128];
	snprintf(series, sizeof series,
	    "allotd_rejected_messages_total{reason=\"%s\"}", reason);
	double v = pc_metric_get(C.http, series);
	ck_assert_msg(!isnan(v), "no series %s", series);
	return v;
}

static double
allowed(void)
{
	double v = pc_metric_get(C.http,
	    "allotd_allowed_tokens_total{service=\"svc\",quota=\"default\"}");
	return isnan(v) ? 0 : v;
}

static unsigned char *
slurp(const char *p, size_t *ret_len)
{
	FILE *f = fopen(p, "rb");
	ck_assert_ptr_nonnull(f);
	unsigned char *buf = malloc(65536);
	ck_assert_ptr_nonnull(buf);
	*ret_len = fread(buf, 1, 65536, f);
	fclose(f);
	return buf;
}

/* A raw client over mutual TLS presenting `pem` (cert + key). */
static void
tls_open(pc_conn *c, const char *pem)
{
	char ca[256], certp[256];
	path(ca, sizeof ca, "ca1/ca.pem");
	path(certp, sizeof certp, pem);
	ck_assert_int_eq(nng_req0_open(&c->sock), 0);
	c->open = true;
	nng_socket_set_ms(c->sock, NNG_OPT_RECVTIMEO, 5000);
	nng_socket_set_ms(c->sock, NNG_OPT_SENDTIMEO, 5000);
	nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, 3600000);
	nng_tls_config *cfg;
	nng_dialer d;
	ck_assert_int_eq(nng_tls_config_alloc(&cfg, NNG_TLS_MODE_CLIENT), 0);
	ck_assert_int_eq(nng_tls_config_ca_file(cfg, ca), 0);
	ck_assert_int_eq(nng_tls_config_cert_key_file(cfg, certp, NULL), 0);
	ck_assert_int_eq(nng_tls_config_server_name(cfg, "localhost"), 0);
	ck_assert_int_eq(
	    nng_tls_config_auth_mode(cfg, NNG_TLS_AUTH_MODE_REQUIRED), 0);
	ck_assert_int_eq(nng_dialer_create(&d, c->sock, url), 0);
	ck_assert_int_eq(nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, cfg), 0);
	ck_assert_int_eq(nng_dialer_start(d, 0), 0);
	nng_tls_config_free(cfg);
}

/* A packed Register for `service`, signed with the key in `pem` (NULL:
 * no proof). */
static void *
signed_register(
    const char *pem, const char *replica, const char *service, size_t *ret_len)
{
	Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
	Allot__V1__Register reg = ALLOT__V1__REGISTER__INIT;
	reg.replica_id = (char *) replica;
	reg.service = (char *) service;
	reg.host = (char *) "testhost";
	reg.agent_version = (char *) "test-0";
	reg.keys = (char **) keys;
	reg.n_keys = 1;
	reg.sync_interval_ms = 100;
	allot__signer *sg = NULL;
	if (pem != NULL) {
		char p[256], err[256];
		path(p, sizeof p, pem);
		ck_assert_msg(allot__signer_new(
		                  p, url, err, sizeof err, &sg) == ALLOT_OK,
		    "signer: %s", err);
		ck_assert_int_eq(allot__signer_sign(sg, &reg), ALLOT_OK);
	}
	env.version = 1;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_REGISTER;
	env.register_ = &reg;
	size_t n = allot__v1__envelope__get_packed_size(&env);
	void *buf = malloc(n);
	ck_assert_ptr_nonnull(buf);
	allot__v1__envelope__pack(&env, buf);
	allot__signer_free(sg);
	*ret_len = n;
	return buf;
}

/* Register over `c`; the session, or 0 with `*ret_code` the Error. */
static uint64_t
join(pc_conn *c, const char *pem, const char *replica, const char *service,
    int *ret_code)
{
	size_t len;
	void *buf = signed_register(pem, replica, service, &len);
	Allot__V1__Envelope *e = pc_raw(c, buf, len);
	free(buf);
	ck_assert_ptr_nonnull(e);
	uint64_t session = 0;
	*ret_code = pc_error_code(e);
	if (*ret_code < 0) {
		ck_assert_int_eq(
		    e->body_case, ALLOT__V1__ENVELOPE__BODY_WELCOME);
		session = e->welcome->session;
	}
	pc_free(e);
	return session;
}

static int
sync_once(pc_conn *c, uint64_t session, uint64_t seq, uint64_t consumed)
{
	pc_report r = { .key = 0, .consumed = consumed, .demand = 10 };
	Allot__V1__Envelope *e = pc_sync(c, session, seq, 100, &r, 1);
	ck_assert_ptr_nonnull(e);
	int code = pc_error_code(e);
	if (code < 0)
		ck_assert_int_eq(
		    e->body_case, ALLOT__V1__ENVELOPE__BODY_REPLY);
	pc_free(e);
	return code;
}

static allot_agent *
agent(const char *id, const char *pem)
{
	char cfgp[256], ca[256], certp[256], err[256];
	path(cfgp, sizeof cfgp, "q.yaml");
	path(ca, sizeof ca, "ca1/ca.pem");
	path(certp, sizeof certp, pem);
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
	o.tls_cert_key_file = certp;
	o.tls_server_name = "localhost";
	allot_agent *a;
	ck_assert_int_eq(allot_agent_create(cfg, &o, &a), ALLOT_OK);
	allot_config_free(cfg);
	return a;
}

/* (a) and (b): a replica certified for its service registers and syncs;
 * one whose certificate names another service never gets a session. */
START_TEST(agents)
{
	allot_agent *good = agent("good", "svc.pem");
	allot_agent *liar = agent("liar", "other.pem");
	allot_sync_stats gs, ls;
	uint64_t t0 = pc_now_ms();
	do {
		pc_sleep_ms(50);
		allot_sync_stats_get(good, &gs);
		allot_sync_stats_get(liar, &ls);
	} while ((gs.syncs_ok < 5 || ls.errors_received < 2) &&
	    pc_now_ms() - t0 < 10000);
	ck_assert_msg(gs.connected && gs.syncs_ok >= 5,
	    "the certified agent did not sync");
	ck_assert_uint_eq(gs.registers, 1);
	ck_assert_uint_eq(ls.registers, 0);
	ck_assert_uint_ge(ls.errors_received, 2);
	ck_assert(!ls.connected);
	ck_assert_uint_eq(gs.replicas, 1);
	ck_assert_double_ge(rejected("identity_mismatch"), 2);
	ck_assert_double_eq(rejected("identity_invalid"), 0);
	ck_assert_double_eq(rejected("identity_replay"), 0);
	ck_assert_double_eq(rejected("identity_missing"), 0);
	allot_agent_destroy(good);
	allot_agent_destroy(liar);
}
END_TEST

/* (b) on the wire: the Error is UNAUTHENTICATED and says why. */
START_TEST(mismatch_raw)
{
	pc_conn c = { 0 };
	tls_open(&c, "other.pem");
	size_t len;
	void *buf = signed_register("other.pem", "r1", "svc", &len);
	Allot__V1__Envelope *e = pc_raw(&c, buf, len);
	free(buf);
	ck_assert_int_eq(
	    pc_error_code(e), ALLOT__V1__ERROR__CODE__UNAUTHENTICATED);
	ck_assert_ptr_nonnull(strstr(e->error->message, "\"other\""));
	pc_free(e);
	ck_assert_double_eq(rejected("identity_mismatch"), 1);
	/* Its own service is fine. */
	int code;
	ck_assert_uint_ne(join(&c, "other.pem", "r1", "other", &code), 0);
	pc_close(&c);
}
END_TEST

/* (c) the same Register bytes twice: the second is a replay. */
START_TEST(replay)
{
	pc_conn a = { 0 }, b = { 0 };
	tls_open(&a, "svc.pem");
	tls_open(&b, "other.pem");
	size_t len;
	void *buf = signed_register("svc.pem", "r1", "svc", &len);
	Allot__V1__Envelope *e = pc_raw(&a, buf, len);
	ck_assert_int_eq(e->body_case, ALLOT__V1__ENVELOPE__BODY_WELCOME);
	uint64_t session = e->welcome->session;
	pc_free(e);
	/* Replayed by another peer, and by the same connection. */
	e = pc_raw(&b, buf, len);
	ck_assert_int_eq(
	    pc_error_code(e), ALLOT__V1__ERROR__CODE__UNAUTHENTICATED);
	pc_free(e);
	e = pc_raw(&a, buf, len);
	ck_assert_int_eq(
	    pc_error_code(e), ALLOT__V1__ERROR__CODE__UNAUTHENTICATED);
	pc_free(e);
	free(buf);
	ck_assert_double_eq(rejected("identity_replay"), 2);
	/* The original session was not replaced. */
	ck_assert_int_eq(sync_once(&a, session, 1, 5), -1);
	pc_close(&a);
	pc_close(&b);
}
END_TEST

/* A Register without a proof, or signed by a key another CA certified. */
START_TEST(missing_and_foreign)
{
	pc_conn c = { 0 };
	tls_open(&c, "svc.pem");
	int code;
	ck_assert_uint_eq(join(&c, NULL, "r1", "svc", &code), 0);
	ck_assert_int_eq(code, ALLOT__V1__ERROR__CODE__UNAUTHENTICATED);
	ck_assert_double_eq(rejected("identity_missing"), 1);
	ck_assert_uint_eq(join(&c, "foreign.pem", "r1", "svc", &code), 0);
	ck_assert_int_eq(code, ALLOT__V1__ERROR__CODE__UNAUTHENTICATED);
	ck_assert_double_eq(rejected("identity_invalid"), 1);
	ck_assert_uint_ne(join(&c, "svc.pem", "r1", "svc", &code), 0);
	pc_close(&c);
}
END_TEST

/* (d) a certified peer on another connection reports for the victim's
 * session: refused, counted, and the victim's figures do not move. */
START_TEST(session_hijack)
{
	pc_conn v = { 0 }, x = { 0 };
	tls_open(&v, "svc.pem");
	tls_open(&x, "svc.pem");
	int code;
	uint64_t victim = join(&v, "svc.pem", "victim", "svc", &code);
	ck_assert_uint_ne(victim, 0);
	uint64_t mine = join(&x, "svc.pem", "attacker", "svc", &code);
	ck_assert_uint_ne(mine, 0);
	ck_assert_int_eq(sync_once(&v, victim, 1, 7), -1);
	double before = allowed();
	ck_assert_double_eq(before, 7);
	/* The attacker guesses the id and any seq. */
	ck_assert_int_eq(sync_once(&x, victim, 2, 1000000),
	    ALLOT__V1__ERROR__CODE__UNKNOWN_SESSION);
	ck_assert_int_eq(sync_once(&x, victim, 1000, 1000000),
	    ALLOT__V1__ERROR__CODE__UNKNOWN_SESSION);
	Allot__V1__Envelope *e = pc_leave(&x, victim, "hijack");
	ck_assert_int_eq(
	    pc_error_code(e), ALLOT__V1__ERROR__CODE__UNKNOWN_SESSION);
	pc_free(e);
	ck_assert_double_eq(rejected("session_pipe_mismatch"), 3);
	ck_assert_double_eq(allowed(), before);
	/* The victim goes on at its next seq, unaffected. */
	ck_assert_int_eq(sync_once(&v, victim, 2, 3), -1);
	ck_assert_double_eq(allowed(), before + 3);
	/* And over a new connection, even its own key must register
	 * again; while the old connection is alive the replica id is not
	 * taken over from another one (issue 27), once it has closed (a
	 * restart) it is. */
	pc_conn v2 = { 0 };
	tls_open(&v2, "svc.pem");
	ck_assert_int_eq(sync_once(&v2, victim, 3, 1),
	    ALLOT__V1__ERROR__CODE__UNKNOWN_SESSION);
	ck_assert_uint_eq(join(&v2, "svc.pem", "victim", "svc", &code), 0);
	ck_assert_int_eq(code, ALLOT__V1__ERROR__CODE__RATE_LIMITED);
	pc_close(&v);
	uint64_t again = 0;
	for (int i = 0; i < 100 && again == 0; i++) {
		again = join(&v2, "svc.pem", "victim", "svc", &code);
		if (again == 0)
			pc_sleep_ms(10);
	}
	ck_assert_uint_ne(again, 0);
	ck_assert_int_eq(sync_once(&v2, again, 1, 1), -1);
	pc_close(&v2);
	pc_close(&x);
}
END_TEST

/* A Register whose proof is made with the openssl command line, as a
 * client in another language would: the byte string of docs/protocol.md
 * ("Identity"), `openssl dgst -sha256 -sign`, the certificate in DER. */
static Allot__V1__Envelope *
openssl_register(pc_conn *c, const char *name, const char *service,
    const char *audience, int64_t skew_ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	uint64_t t = (uint64_t) ((int64_t) ts.tv_sec * 1000 +
	    ts.tv_nsec / 1000000 + skew_ms);
	unsigned char nonce[ALLOT__AUTHN_NONCE];
	for (size_t i = 0; i < sizeof nonce; i++)
		nonce[i] = (unsigned char) (t >> (i % 8)) ^ (unsigned char) i;
	unsigned char msg[ALLOT__AUTHN_MSG_MAX];
	size_t n = allot__authn_msg(
	    msg, "r-ossl", service, audience, t, nonce);
	ck_assert_uint_gt(n, 0);
	char mp[256];
	path(mp, sizeof mp, "msg.bin");
	FILE *f = fopen(mp, "wb");
	ck_assert_ptr_nonnull(f);
	ck_assert_uint_eq(fwrite(msg, 1, n, f), n);
	fclose(f);
	char cmd[1024];
	snprintf(cmd, sizeof cmd,
	    "cd %s && openssl dgst -sha256 -sign ca1/%s.key -out sig.bin "
	    "msg.bin && openssl x509 -in ca1/%s.pem -outform DER "
	    "-out crt.der && echo ok",
	    dir, name, name);
	char *out = pc_shell(cmd);
	ck_assert_msg(out != NULL && strcmp(out, "ok") == 0, "openssl: %s",
	    out ? out : "(failed)");
	free(out);
	char p1[256], p2[256];
	path(p1, sizeof p1, "sig.bin");
	path(p2, sizeof p2, "crt.der");
	size_t siglen = 0, crtlen = 0;
	unsigned char *sig = slurp(p1, &siglen), *crt = slurp(p2, &crtlen);
	Allot__V1__IdentityProof proof = ALLOT__V1__IDENTITY_PROOF__INIT;
	ProtobufCBinaryData certs[1] = { { crtlen, crt } };
	proof.n_certs = 1;
	proof.certs = certs;
	proof.audience = (char *) audience;
	proof.time_ms = t;
	proof.nonce.data = nonce;
	proof.nonce.len = sizeof nonce;
	proof.signature.data = sig;
	proof.signature.len = siglen;
	Allot__V1__Register reg = ALLOT__V1__REGISTER__INIT;
	reg.replica_id = (char *) "r-ossl";
	reg.service = (char *) service;
	reg.keys = (char **) keys;
	reg.n_keys = 1;
	reg.identity = &proof;
	Allot__V1__Envelope *e = pc_send_register(c, &reg);
	free(sig);
	free(crt);
	ck_assert_ptr_nonnull(e);
	return e;
}

/* A proof made with openssl is accepted; a stale one, or one naming
 * another coordinator, is not. */
START_TEST(openssl_interop)
{
	pc_conn c = { 0 };
	tls_open(&c, "svc.pem");
	Allot__V1__Envelope *e = openssl_register(&c, "svc", "svc", url, 0);
	ck_assert_int_eq(e->body_case, ALLOT__V1__ENVELOPE__BODY_WELCOME);
	pc_free(e);
	e = openssl_register(&c, "svc", "svc", url, -120000);
	ck_assert_int_eq(
	    pc_error_code(e), ALLOT__V1__ERROR__CODE__UNAUTHENTICATED);
	ck_assert_ptr_nonnull(strstr(e->error->message, "clock"));
	pc_free(e);
	e = openssl_register(&c, "svc", "svc", "tls+tcp://10.9.9.9:1", 0);
	ck_assert_int_eq(
	    pc_error_code(e), ALLOT__V1__ERROR__CODE__UNAUTHENTICATED);
	ck_assert_ptr_nonnull(strstr(e->error->message, "10.9.9.9"));
	pc_free(e);
	ck_assert_double_eq(rejected("identity_invalid"), 2);
	pc_close(&c);
}
END_TEST

/* Which part of a SPIFFE ID is the service. */
START_TEST(service_map)
{
	char mdir[64], ca[128], err[256], svc[64];
	pc_mkdtemp(mdir, sizeof mdir, "/tmp/allot-authn-map");
	char cmd[512];
	snprintf(cmd, sizeof cmd,
	    "%s/scripts/mkcerts %s >/dev/null && echo ok",
	    getenv("ALLOT_SOURCE_DIR"), mdir);
	free(pc_shell(cmd));
	snprintf(ca, sizeof ca, "%s/ca.pem", mdir);
	allot__authn_opts o = { .ca_file = ca };
	allot__authn *au;
	ck_assert_int_eq(allot__authn_new(&o, err, sizeof err, &au), 0);
	ck_assert_int_eq(allot__authn_map(au, "spiffe://t/ns/p/sa/checkout",
	                     svc, sizeof svc),
	    0);
	ck_assert_str_eq(svc, "checkout");
	ck_assert_int_eq(
	    allot__authn_map(au, "spiffe://t", svc, sizeof svc), -1);
	allot__authn_free(au);

	const char *maps[] = { "spiffe://t/ns/*/sa/{service}",
		"spiffe://*/svc/{service}/x" };
	o.maps = maps;
	o.nmaps = 2;
	ck_assert_int_eq(allot__authn_new(&o, err, sizeof err, &au), 0);
	ck_assert_int_eq(allot__authn_map(au, "spiffe://t/ns/p/sa/checkout",
	                     svc, sizeof svc),
	    0);
	ck_assert_str_eq(svc, "checkout");
	ck_assert_int_eq(
	    allot__authn_map(au, "spiffe://u/svc/pay/x", svc, sizeof svc), 0);
	ck_assert_str_eq(svc, "pay");
	ck_assert_int_eq(allot__authn_map(au, "spiffe://u/ns/p/sa/checkout",
	                     svc, sizeof svc),
	    -1);
	ck_assert_int_eq(
	    allot__authn_map(au, "spiffe://t/ns/p/sa/c/d", svc, sizeof svc),
	    -1);
	allot__authn_free(au);

	const char *bad[] = { "spiffe://t/ns/x{service}" };
	o.maps = bad;
	o.nmaps = 1;
	ck_assert_int_eq(
	    allot__authn_new(&o, err, sizeof err, &au), ALLOT_EINVAL);
	pc_rm_rf(mdir);
}
END_TEST

/* Certificate rotation (allot_agent_reload_tls()): log lines seen, and a
 * steady load that must never be refused. */
struct rot {
	pthread_mutex_t mu;
	char ids[4096];
	allot_agent *a;
	_Atomic bool stop;
	_Atomic uint64_t allowed, denied;
};

static void
rot_log(void *ctx, int level, const char *id, const char *msg)
{
	(void) level;
	(void) msg;
	struct rot *r = ctx;
	pthread_mutex_lock(&r->mu);
	size_t n = strlen(r->ids);
	if (n + strlen(id) + 2 < sizeof r->ids)
		snprintf(r->ids + n, sizeof r->ids - n, "%s ", id);
	pthread_mutex_unlock(&r->mu);
}

static int
rot_seen(struct rot *r, const char *id)
{
	pthread_mutex_lock(&r->mu);
	int n = 0;
	for (const char *p = r->ids; (p = strstr(p, id)) != NULL; p++)
		n += p[strlen(id)] == ' ';
	pthread_mutex_unlock(&r->mu);
	return n;
}

/* 40 requests a second against a quota of 100. */
static void *
rot_load(void *arg)
{
	struct rot *r = arg;
	while (!atomic_load(&r->stop)) {
		allot_decision dec;
		ck_assert_int_eq(
		    allot_acquire_id(r->a, "svc", "x", 1, &dec), ALLOT_OK);
		atomic_fetch_add(dec.allowed ? &r->allowed : &r->denied, 1);
		pc_sleep_ms(25);
	}
	return NULL;
}

/* Put `from` (a PEM under dir) in place of the agent's rot.pem, as a
 * rotation does: a new file renamed over the old one. */
static void
rot_install(const char *from)
{
	char cmd[512];
	snprintf(cmd, sizeof cmd,
	    "cd %s && cp %s rot.new && mv rot.new rot.pem && echo ok", dir,
	    from);
	char *out = pc_shell(cmd);
	ck_assert_msg(out != NULL && strcmp(out, "ok") == 0, "rot: %s", out);
	free(out);
}

/* Wait until the agent has registered `n` times and synced since. */
static void
rot_wait_registers(allot_agent *a, uint64_t n, allot_sync_stats *ret)
{
	uint64_t t0 = pc_now_ms(), ok0 = 0;
	do {
		pc_sleep_ms(50);
		allot_sync_stats_get(a, ret);
		if (ret->registers < n)
			ok0 = ret->syncs_ok;
	} while ((ret->registers < n || ret->syncs_ok < ok0 + 3 ||
	             !ret->connected) &&
	    pc_now_ms() - t0 < 15000);
	ck_assert_uint_eq(ret->registers, n);
	ck_assert(ret->connected);
}

/* rot.pem, the agent's file, starts as svc's (svc2.pem, another
 * certificate for svc from the same CA, and mixed.pem, it with svc's key,
 * are the suite's). */
static void
rot_certs(void)
{
	char cmd[512];
	snprintf(
	    cmd, sizeof cmd, "cp %s/svc.pem %s/rot.pem && echo ok", dir, dir);
	char *out = pc_shell(cmd);
	ck_assert_msg(out != NULL && strcmp(out, "ok") == 0, "certs: %s", out);
	free(out);
}

/* An agent presenting rot.pem, its log lines into `r`. */
static void
rot_agent(struct rot *r, uint32_t check_ms)
{
	char cfgp[256], ca[256], certp[256], err[256];
	path(cfgp, sizeof cfgp, "q.yaml");
	path(ca, sizeof ca, "ca1/ca.pem");
	path(certp, sizeof certp, "rot.pem");
	allot_config *cfg;
	ck_assert_int_eq(
	    allot_config_load(cfgp, err, sizeof err, &cfg), ALLOT_OK);
	memset(r, 0, sizeof *r);
	pthread_mutex_init(&r->mu, NULL);
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.coordinator = url;
	o.service = "svc";
	o.replica_id = "rot";
	o.sync_interval_ms = 50;
	o.tls_ca_file = ca;
	o.tls_cert_key_file = certp;
	o.tls_server_name = "localhost";
	o.tls_reload_check_ms = check_ms;
	o.log = rot_log;
	o.log_ctx = r;
	ck_assert_int_eq(allot_agent_create(cfg, &o, &r->a), ALLOT_OK);
	allot_config_free(cfg);
}

/* Replace the agent's certificate under load: the session continues and
 * no request is refused; a bad file changes nothing; after a restart of
 * allotd the agent connects and registers with the new certificate. */
START_TEST(rotation)
{
	char cmd[1024];
	rot_certs();
	static struct rot r;
	rot_agent(&r, 0);
	allot_sync_stats st;
	rot_wait_registers(r.a, 1, &st);
	uint64_t session = st.session;
	pthread_t load;
	ck_assert_int_eq(pthread_create(&load, NULL, rot_load, &r), 0);
	pc_sleep_ms(300);

	/* Unusable files: refused, and nothing changes. */
	path(cmd, sizeof cmd, "rot.pem");
	char moved[256];
	path(moved, sizeof moved, "rot.away");
	ck_assert_int_eq(rename(cmd, moved), 0);
	ck_assert_int_eq(allot_agent_reload_tls(r.a), ALLOT_EIO);
	ck_assert_int_eq(rename(moved, cmd), 0);
	rot_install("mixed.pem");
	ck_assert_int_eq(allot_agent_reload_tls(r.a), ALLOT_ECONFIG);
	ck_assert_int_eq(rot_seen(&r, "ALLOT-TLS-RELOAD"), 2);

	/* The new pair: the session and its connection carry on. */
	rot_install("svc2.pem");
	ck_assert_int_eq(allot_agent_reload_tls(r.a), ALLOT_OK);
	uint64_t ok0 = st.syncs_ok;
	pc_sleep_ms(1000);
	allot_sync_stats_get(r.a, &st);
	ck_assert_uint_eq(st.session, session);
	ck_assert_uint_eq(st.registers, 1);
	ck_assert_uint_ge(st.syncs_ok, ok0 + 10);
	ck_assert(st.connected && !st.in_fallback);
	ck_assert_int_eq(rot_seen(&r, "ALLOT-TLS-SWAP"), 0);
	ck_assert_uint_eq(atomic_load(&r.denied), 0);

	/* The per-key view agrees with the coordinator's grant. */
	allot_key *k;
	ck_assert_int_eq(allot_key_resolve(r.a, "svc", "x", &k), ALLOT_OK);
	allot_key_stats ks;
	ck_assert_int_eq(allot_key_stats_get(r.a, k, &ks), ALLOT_OK);
	ck_assert(!ks.in_fallback);
	ck_assert_int_gt(ks.lease_remaining_ms, 0);
	ck_assert_double_gt(ks.granted_rate, 0);
	ck_assert_double_gt(ks.granted_burst, 0);
	allot_key_release(r.a, k);

	/* A restart that forgets the session: the next connection is made
	 * with the new certificate, and the new Register's proof verifies. */
	stop_allotd();
	start_allotd("b.db");
	rot_wait_registers(r.a, 2, &st);
	ck_assert_int_eq(rot_seen(&r, "ALLOT-TLS-SWAP"), 1);
	ck_assert_double_eq(rejected("identity_invalid"), 0);
	ck_assert_double_eq(rejected("identity_mismatch"), 0);

	/* Which certificate signs: one naming another service is taken
	 * (same CA), the session continues, and only the next Register,
	 * after another restart, is refused for it. */
	session = st.session;
	rot_install("other.pem");
	ck_assert_int_eq(allot_agent_reload_tls(r.a), ALLOT_OK);
	pc_sleep_ms(500);
	allot_sync_stats_get(r.a, &st);
	ck_assert_uint_eq(st.session, session);
	ck_assert(st.connected);
	atomic_store(&r.stop, true);
	pthread_join(load, NULL);
	ck_assert_uint_eq(atomic_load(&r.denied), 0);
	ck_assert_uint_gt(atomic_load(&r.allowed), 50);
	stop_allotd();
	start_allotd("c.db");
	uint64_t t0 = pc_now_ms();
	while (rejected("identity_mismatch") < 1 && pc_now_ms() - t0 < 10000)
		pc_sleep_ms(50);
	ck_assert_double_ge(rejected("identity_mismatch"), 1);
	allot_sync_stats_get(r.a, &st);
	ck_assert_uint_eq(st.registers, 2);
	allot_agent_destroy(r.a);
	pthread_mutex_destroy(&r.mu);
}
END_TEST

/* The automatic mode: a changed file is reloaded by the agent itself, a
 * bad one is refused, and the session carries on. */
START_TEST(rotation_auto)
{
	rot_certs();
	static struct rot r;
	rot_agent(&r, 50);
	allot_sync_stats st;
	rot_wait_registers(r.a, 1, &st);
	uint64_t session = st.session;
	ck_assert_int_eq(rot_seen(&r, "ALLOT-TLS-RELOAD"), 0);
	rot_install("svc2.pem");
	uint64_t t0 = pc_now_ms();
	while (rot_seen(&r, "ALLOT-TLS-RELOAD") < 1 && pc_now_ms() - t0 < 5000)
		pc_sleep_ms(20);
	ck_assert_int_eq(rot_seen(&r, "ALLOT-TLS-RELOAD"), 1);
	rot_install("mixed.pem");
	while (rot_seen(&r, "ALLOT-TLS-RELOAD") < 2 && pc_now_ms() - t0 < 5000)
		pc_sleep_ms(20);
	ck_assert_int_eq(rot_seen(&r, "ALLOT-TLS-RELOAD"), 2);
	pc_sleep_ms(300); /* no change: no further attempt */
	ck_assert_int_eq(rot_seen(&r, "ALLOT-TLS-RELOAD"), 2);
	allot_sync_stats_get(r.a, &st);
	ck_assert_uint_eq(st.session, session);
	ck_assert_uint_eq(st.registers, 1);
	ck_assert(st.connected);
	allot_agent_destroy(r.a);
	pthread_mutex_destroy(&r.mu);
}
END_TEST

static Suite *
authn_suite(void)
{
	Suite *s = suite_create("authn");
	TCase *tc = tcase_create("identity");
	tcase_add_unchecked_fixture(tc, suite_setup, suite_teardown);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, agents);
	tcase_add_test(tc, mismatch_raw);
	tcase_add_test(tc, replay);
	tcase_add_test(tc, missing_and_foreign);
	tcase_add_test(tc, session_hijack);
	tcase_add_test(tc, openssl_interop);
	tcase_add_test(tc, rotation);
	tcase_add_test(tc, rotation_auto);
	suite_add_tcase(s, tc);
	TCase *tu = tcase_create("map");
	tcase_add_test(tu, service_map);
	suite_add_tcase(s, tu);
	return s;
}

ALLOT_TEST_MAIN(authn_suite)
