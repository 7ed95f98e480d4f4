/* SPDX-License-Identifier: MIT */
/*
 * Regenerates the binary seed corpora of the "wire" and "agent_reply"
 * fuzz targets: `fuzz-mkcorpus DIR` writes NAME.bin files into DIR/wire
 * and DIR/agent_reply (run it with DIR = tests/fuzz/corpus). The
 * messages are real: agents made with the fuzz config (tests/fuzz/fuzz.h)
 * talk to a registry made the same way as the wire target's, in-process,
 * and every request and answer they exchange is saved as packed. The
 * first agent is FUZZ_REPLICA, so its session is FUZZ_SESSION, the one
 * the wire target keeps open, and its first Sync is seq 1, the one the
 * agent target answers. Hand-built variants (bad versions, wrong
 * direction, unknown and duplicate keys, absurd reports, bad shares,
 * every Error code) cover the rejections.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "allot.pb-c.h"
#include "arena.h"
#include "dispatch/dispatch.h"
#include "fuzz.h"
#include "state/state.h"
#include "sync_int.h"

#define MS 1000000ull

static const char *outdir;
static _Atomic uint64_t vnow = 1000 * MS;
static allot__state *st;
static allot_config *cfg;

static uint64_t
vclock(void *ctx)
{
	(void) ctx;
	return atomic_load(&vnow);
}

static void
save(const char *target, const char *name, const void *buf, size_t len)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", outdir, target);
	if (mkdir(path, 0777) != 0 && errno != EEXIST) {
		perror(path);
		exit(1);
	}
	snprintf(path, sizeof path, "%s/%s/%s.bin", outdir, target, name);
	FILE *f = fopen(path, "wb");
	if (f == NULL || fwrite(buf, 1, len, f) != len || fclose(f) != 0) {
		perror(path);
		exit(1);
	}
	printf("%s (%zu bytes)\n", path, len);
}

static void
save_env(const char *target, const char *name, const Allot__V1__Envelope *e)
{
	size_t n = allot__v1__envelope__get_packed_size(e);
	uint8_t *buf = malloc(n > 0 ? n : 1);
	FUZZ_CHECK(buf != NULL);
	allot__v1__envelope__pack(e, buf);
	save(target, name, buf, n);
	free(buf);
}

/* allotd's handling of one request, in-process: its own dispatcher
 * (coordinator/dispatch/dispatch.c) without a transport. The answer is copied
 * into *ret (malloc). */
static void
serve(const void *req, size_t len, uint8_t **ret, size_t *ret_len)
{
	allot__arena arena = { 0 };
	ProtobufCAllocator pa = { allot__arena_alloc, allot__arena_free,
		&arena };
	allot__dispatch_ctx c;
	allot__dispatch_ctx_init(&c);
	c.state = st;
	allot__dispatch_req dr = { .buf = req, .len = len, .pa = &pa };
	allot__dispatch_result res;
	FUZZ_CHECK(allot__dispatch(&c, &dr, &res) == ALLOT_OK);
	FUZZ_CHECK(res.request != NULL);
	*ret_len = res.answer_len;
	*ret = malloc(*ret_len > 0 ? *ret_len : 1);
	FUZZ_CHECK(*ret != NULL);
	memcpy(*ret, res.answer, *ret_len);
	allot__arena_destroy(&arena);
}

typedef struct peer {
	allot_agent *a;
	allot__syncc c;
} peer;

static void
peer_init(peer *p, const char *replica)
{
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.clock = vclock;
	o.max_unknown_keys = 4;
	o.service = FUZZ_SERVICE;
	o.replica_id = replica;
	FUZZ_CHECK(allot_agent_create(cfg, &o, &p->a) == ALLOT_OK);
	p->a->coordinator = strdup("inproc://mkcorpus");
	FUZZ_CHECK(allot__syncc_init(&p->c, p->a, 1) == ALLOT_OK);
}

static void
peer_fini(peer *p)
{
	allot__syncc_fini(&p->c);
	allot_agent_destroy(p->a);
}

/* One exchange; the request and the answer are saved under the names
 * given (NULL: not saved). */
static void
exchange(peer *p, const char *req_name, const char *rep_name)
{
	void *req;
	size_t len;
	FUZZ_CHECK(allot__syncc_request(
	               &p->c, atomic_load(&vnow), &req, &len) == ALLOT_OK);
	uint8_t *rep;
	size_t rlen;
	serve(req, len, &rep, &rlen);
	if (req_name != NULL)
		save("wire", req_name, req, len);
	if (rep_name != NULL)
		save("agent_reply", rep_name, rep, rlen);
	atomic_store(&vnow, atomic_load(&vnow) + 2 * MS);
	FUZZ_CHECK(allot__syncc_reply(&p->c, atomic_load(&vnow), rep, rlen));
	free(req);
	free(rep);
}

static void
traffic(allot_agent *a, int n)
{
	static const char *ids[] = { "spiffe://t/a", "spiffe://t/b",
		"spiffe://t/c", "spiffe://t/other", NULL };
	for (int i = 0; i < n; i++)
		for (size_t j = 0; j < sizeof ids / sizeof ids[0]; j++) {
			allot_decision d;
			allot_acquire_id(a, ids[j],
			    i % 2 ? "/export" : "/lookup", ALLOT_COST_DEFAULT,
			    &d);
		}
}

static void
real_exchanges(void)
{
	peer p1, p2;
	peer_init(&p1, FUZZ_REPLICA);
	exchange(&p1, "register", "welcome");
	traffic(p1.a, 40);
	atomic_store(&vnow, atomic_load(&vnow) + 100 * MS);
	exchange(&p1, "sync-seq1", "reply-seq1");
	/* A second replica changes every share: a partial Reply. */
	peer_init(&p2, "fuzz-replica-2");
	exchange(&p2, "register-second", NULL);
	traffic(p1.a, 500);
	atomic_store(&vnow, atomic_load(&vnow) + 100 * MS);
	/* Saved as a wire seed, not as an agent reply: seq 2. */
	exchange(&p1, "sync-seq2", NULL);
	void *buf;
	size_t len;
	FUZZ_CHECK(allot__syncc_leave(&p1.c, &buf, &len) == ALLOT_OK);
	uint8_t *rep;
	size_t rlen;
	serve(buf, len, &rep, &rlen);
	save("wire", "leave", buf, len);
	save("agent_reply", "reply-leave", rep, rlen);
	free(buf);
	free(rep);
	peer_fini(&p2);
	peer_fini(&p1);
}

static void
wire_variants(void)
{
	const char *keys[] = { "spiffe://t/a", "spiffe://t/zz", "default",
		"spiffe://t/a" };
	Allot__V1__Register reg = ALLOT__V1__REGISTER__INIT;
	reg.replica_id = (char *) "fuzz-replica-3";
	reg.service = (char *) FUZZ_SERVICE;
	reg.host = (char *) "h";
	reg.agent_version = (char *) "0.1.0";
	reg.n_keys = 3;
	reg.keys = (char **) keys;
	reg.sync_interval_ms = 100;
	Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
	env.version = ALLOT__PROTOCOL_VERSION;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_REGISTER;
	env.register_ = &reg;
	save_env("wire", "register-unknown-key", &env);
	reg.n_keys = 4;
	save_env("wire", "register-duplicate-key", &env);
	reg.n_keys = 3;
	reg.service = (char *) "other-service";
	save_env("wire", "register-other-service", &env);
	reg.service = (char *) "bad\nname";
	save_env("wire", "register-bad-name", &env);
	reg.service = (char *) FUZZ_SERVICE;
	env.version = 2;
	save_env("wire", "register-version2", &env);

	Allot__V1__KeyReport kr[3];
	Allot__V1__KeyReport *krp[3];
	for (int i = 0; i < 3; i++) {
		allot__v1__key_report__init(&kr[i]);
		krp[i] = &kr[i];
	}
	kr[0].key = 0;
	kr[0].consumed = 100;
	kr[0].denied = 5;
	kr[0].held = 900;
	kr[0].demand = 120;
	kr[1].key = 9;
	kr[1].consumed = 1;
	kr[2].key = 2;
	kr[2].consumed = UINT64_MAX;
	kr[2].held = UINT64_MAX;
	kr[2].demand = UINT64_MAX;
	Allot__V1__Sync sy = ALLOT__V1__SYNC__INIT;
	sy.session = FUZZ_SESSION;
	sy.seq = 1;
	sy.elapsed_ms = 100;
	sy.n_reports = 1;
	sy.reports = krp;
	env = (Allot__V1__Envelope) ALLOT__V1__ENVELOPE__INIT;
	env.version = ALLOT__PROTOCOL_VERSION;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_SYNC;
	env.sync = &sy;
	save_env("wire", "sync-one-report", &env);
	sy.n_reports = 3;
	save_env("wire", "sync-unknown-and-absurd", &env);
	sy.seq = 7;
	sy.n_reports = 1;
	save_env("wire", "sync-gap", &env);
	sy.session = 99;
	save_env("wire", "sync-unknown-session", &env);

	Allot__V1__Welcome w = ALLOT__V1__WELCOME__INIT;
	w.session = 1;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_WELCOME;
	env.welcome = &w;
	save_env("wire", "welcome-wrong-direction", &env);
	env.body_case = ALLOT__V1__ENVELOPE__BODY__NOT_SET;
	save_env("wire", "no-body", &env);
	save("wire", "empty", "", 0);
}

static void
reply_variants(void)
{
	Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
	env.version = ALLOT__PROTOCOL_VERSION;
	Allot__V1__Error e = ALLOT__V1__ERROR__INIT;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_ERROR;
	env.error = &e;
	static const char *names[] = { "unspecified", "version", "malformed",
		"unknown-session", "stale-seq", "rate-limited", "too-large",
		"shutting-down" };
	for (int c = 0; c < 8; c++) {
		char name[64];
		e.code = (Allot__V1__Error__Code) c;
		e.message = (char *) names[c];
		snprintf(name, sizeof name, "error-%s", names[c]);
		save_env("agent_reply", name, &env);
	}

	Allot__V1__Share sh[4];
	Allot__V1__Share *shp[4];
	for (int i = 0; i < 4; i++) {
		allot__v1__share__init(&sh[i]);
		shp[i] = &sh[i];
	}
	sh[0].key = 0;
	sh[0].rate = 1e300;
	sh[0].burst = 1e300;
	sh[1].key = 1;
	sh[1].rate = -1;
	sh[1].burst = 0.5;
	sh[2].key = 2;
	sh[2].rate = 0;
	sh[2].burst = 0;
	sh[3].key = 40;
	sh[3].rate = 5;
	sh[3].burst = 5;
	Allot__V1__Reply r = ALLOT__V1__REPLY__INIT;
	r.seq = 1;
	r.replicas = 3;
	r.config_epoch = 2;
	r.lease_ms = 1;
	r.n_shares = 4;
	r.shares = shp;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_REPLY;
	env.reply = &r;
	save_env("agent_reply", "reply-odd-shares", &env);
	r.full = true;
	r.replicas = 0;
	r.lease_ms = UINT32_MAX;
	save_env("agent_reply", "reply-full-no-replicas", &env);

	Allot__V1__Welcome w = ALLOT__V1__WELCOME__INIT;
	uint32_t unknown[] = { 3, 70000 };
	w.session = 5;
	w.replicas = UINT32_MAX;
	w.lease_ms = 0;
	w.n_shares = 4;
	w.shares = shp;
	w.n_unknown_keys = 2;
	w.unknown_keys = unknown;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_WELCOME;
	env.welcome = &w;
	save_env("agent_reply", "welcome-odd", &env);
	env.version = 0;
	save_env("agent_reply", "welcome-version0", &env);
}

int
main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: fuzz-mkcorpus DIR\n");
		return 2;
	}
	outdir = argv[1];
	char err[256];
	static const char text[] = FUZZ_CONFIG_YAML;
	if (allot_config_parse("fuzz.yaml", text, sizeof text - 1, err,
	        sizeof err, &cfg) != ALLOT_OK) {
		fprintf(stderr, "fuzz-mkcorpus: %s\n", err);
		return 1;
	}
	allot__state_opts so;
	allot__state_opts_init(&so);
	so.max_replicas = 8;
	so.max_services = 4;
	allot_config *own = allot__config_dup(cfg);
	FUZZ_CHECK(own != NULL);
	FUZZ_CHECK(
	    allot__state_create(&so, own, "fuzz.yaml", text, &st) == ALLOT_OK);
	real_exchanges();
	wire_variants();
	reply_variants();
	allot__state_destroy(st);
	allot_config_free(cfg);
	return 0;
}
