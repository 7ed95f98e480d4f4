/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target "sequence": valid but extreme message SEQUENCES, not
 * malformed bytes (docs/reliability.md, "Adversary"). The input is a
 * program: each step picks a replica and an action (Register with up to
 * thousands of keys without a quota and any sync interval, Sync with
 * consumption, denials, demand and bucket levels anywhere from 0 to
 * UINT64_MAX, a stale or skipped sequence number, Leave, or time passing
 * with the periodic work), builds the valid message an agent (or a
 * hostile one) would send, and runs it through allotd's own dispatcher
 * (coordinator/dispatch/dispatch.c) against a registry on a virtual clock, with
 * each replica on its own connection and two addresses (replicas 0-3
 * and 4-7), so that the replica budget per peer and the joins that wait
 * for a first Sync are driven too. After every message the registry's
 * invariants are asserted through the state's public queries: the grants
 * of every quota of every service sum to at most R (rate) and B (burst),
 * no service holds more replicas than its budget, the registry no more
 * than its own, and services stay within their table.
 */
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "allot.pb-c.h"
#include "dispatch/dispatch.h"
#include "fuzz.h"
#include "state/metrics.h"
#include "state/state.h"

#define NREPLICAS 8
#define NSERVICES 5
#define MAX_REPLICAS 12
#define MAX_PER_SERVICE 5
#define MAX_PER_PEER 2 /* so a service holds at most 4 of 5 */
#define MAX_SERVICES 3
#define MAX_JUNK 4096

/* ---- the program being run ---- */

typedef struct prog {
	const uint8_t *p;
	size_t n;
	uint64_t now_ns;
	allot__state *st;
	allot__metrics metrics;
	uint64_t session[NREPLICAS];
	uint64_t seq[NREPLICAS];
	uint32_t nkeys[NREPLICAS];
} prog;

static uint8_t
byte(prog *g)
{
	if (g->n == 0)
		return 0;
	g->n--;
	return *g->p++;
}

/* A value from the extremes an agent could send, or one in between. */
static uint64_t
extreme(prog *g)
{
	static const uint64_t v[] = { 0, 1, 50, 100, 1000, 90000, 1u << 20,
		(uint64_t) 1 << 40, UINT64_MAX / 2, UINT64_MAX };
	uint8_t b = byte(g);
	if (b < 2 * (sizeof v / sizeof v[0]))
		return v[b % (sizeof v / sizeof v[0])];
	return (uint64_t) b * byte(g);
}

static uint64_t
vclock(void *ctx)
{
	return ((prog *) ctx)->now_ns;
}

static const char *const known[] = { "default", "spiffe://t/a", "spiffe://t/b",
	"spiffe://t/c" };
static const char *const services[NSERVICES] = { "s0", "s1", "s2", "s3",
	"s4" };
static const char *const replicas[NREPLICAS] = { "r0", "r1", "r2", "r3", "r4",
	"r5", "r6", "r7" };
static char junk_names[MAX_JUNK][16];
static char *junk[MAX_JUNK];

/* Run one Envelope through the dispatcher as replica r's connection
 * (pipe r + 1), and take a Welcome's session. */
static void
send(prog *g, int r, Allot__V1__Envelope *env)
{
	env->version = ALLOT__PROTOCOL_VERSION;
	size_t len = allot__v1__envelope__get_packed_size(env);
	uint8_t *buf = malloc(len ? len : 1);
	FUZZ_CHECK(buf != NULL);
	allot__v1__envelope__pack(env, buf);
	fuzz_blk *head = NULL;
	ProtobufCAllocator pa = {
		.alloc = fuzz_trk_alloc,
		.free = fuzz_trk_free,
		.allocator_data = &head,
	};
	allot__dispatch_ctx c;
	allot__dispatch_ctx_init(&c);
	c.state = g->st;
	c.metrics = &g->metrics;
	allot__peer peer;
	memset(&peer, 0, sizeof peer);
	peer.family = 4;
	peer.addr[0] = 10;
	peer.addr[3] = (uint8_t) (1 + r / 4);
	allot__dispatch_req req = {
		.buf = buf,
		.len = len,
		.pa = &pa,
		.pipe = (uint32_t) r + 1,
		.peer = &peer,
	};
	allot__dispatch_result res;
	FUZZ_CHECK(allot__dispatch(&c, &req, &res) == ALLOT_OK);
	Allot__V1__Envelope *back = allot__v1__envelope__unpack(
	    NULL, res.answer_len, res.answer);
	FUZZ_CHECK(back != NULL);
	if (back->body_case == ALLOT__V1__ENVELOPE__BODY_WELCOME) {
		g->session[r] = back->welcome->session;
		g->seq[r] = 0;
	} else if (back->body_case == ALLOT__V1__ENVELOPE__BODY_ERROR &&
	    back->error->code == ALLOT__V1__ERROR__CODE__UNKNOWN_SESSION) {
		g->session[r] = 0;
	}
	allot__v1__envelope__free_unpacked(back, NULL);
	fuzz_trk_reset(&head);
	free(buf);
}

static void
do_register(prog *g, int r)
{
	static const uint32_t iv[] = { 0, 5, 100, 1000, 60000, UINT32_MAX };
	uint8_t mask = byte(g), s = byte(g) % NSERVICES;
	uint32_t njunk = (uint32_t) byte(g) * 16u;
	if (njunk > MAX_JUNK)
		njunk = MAX_JUNK;
	char *keys[4 + MAX_JUNK];
	size_t n = 0;
	for (size_t k = 0; k < 4; k++)
		if (mask & (1u << k))
			keys[n++] = (char *) known[k];
	for (uint32_t k = 0; k < njunk; k++)
		keys[n++] = junk[k];
	if (mask & 0x10 && n > 0) /* a key listed twice: refused */
		keys[n++] = keys[0];
	Allot__V1__Register reg = ALLOT__V1__REGISTER__INIT;
	reg.replica_id = (char *) replicas[r];
	reg.service = (char *) services[s];
	reg.host = (char *) "fuzzhost";
	reg.agent_version = (char *) "fuzz";
	reg.n_keys = n;
	reg.keys = keys;
	reg.sync_interval_ms = iv[byte(g) % (sizeof iv / sizeof iv[0])];
	Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_REGISTER;
	env.register_ = &reg;
	send(g, r, &env);
	g->nkeys[r] = (uint32_t) n;
}

static void
do_sync(prog *g, int r)
{
	enum { NREP = 6 };
	Allot__V1__KeyReport kr[NREP], *krp[NREP];
	size_t n = byte(g) % (NREP + 1);
	for (size_t i = 0; i < n; i++) {
		allot__v1__key_report__init(&kr[i]);
		uint8_t k = byte(g);
		kr[i].key = k < 240 ? k % (g->nkeys[r] + 1) : UINT32_MAX;
		kr[i].consumed = extreme(g);
		kr[i].denied = extreme(g);
		kr[i].held = extreme(g);
		kr[i].demand = extreme(g);
		kr[i].foreign = byte(g) > 250;
		krp[i] = &kr[i];
	}
	uint8_t how = byte(g);
	uint64_t seq = how < 200 ? ++g->seq[r] :
	    how < 230          ? g->seq[r] : /* stale */
	                         (g->seq[r] += 2); /* a gap */
	Allot__V1__Sync sy = ALLOT__V1__SYNC__INIT;
	/* Mostly its own session; sometimes another replica's. */
	sy.session = how == 255 ? g->session[(r + 1) % NREPLICAS] :
	                          g->session[r];
	sy.seq = seq;
	sy.elapsed_ms = (uint32_t) extreme(g);
	sy.n_reports = n;
	sy.reports = n > 0 ? krp : NULL;
	Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_SYNC;
	env.sync = &sy;
	send(g, r, &env);
}

static void
do_leave(prog *g, int r)
{
	Allot__V1__Leave lv = ALLOT__V1__LEAVE__INIT;
	lv.session = g->session[r];
	lv.reason = (char *) "fuzz";
	Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_LEAVE;
	env.leave = &lv;
	send(g, r, &env);
}

static void
do_time(prog *g)
{
	uint8_t b = byte(g);
	/* Up to 25.5 s in 100 ms ticks, so expiry, claims and the freeing
	 * of empty services are all reached. */
	for (unsigned t = 0; t <= b / 16u; t++) {
		g->now_ns += (uint64_t) (b % 16u + 1) * 100000000u;
		allot__state_tick(g->st);
		allot__state_second(g->st);
	}
}

/* The registry's invariants, through its public queries. */
static void
check(prog *g)
{
	FUZZ_CHECK(allot__state_replicas(g->st) <= MAX_REPLICAS);
	size_t nsvcs = 0;
	for (size_t s = 0; s < NSERVICES; s++) {
		uint32_t n = allot__state_service_replicas(g->st, services[s]);
		FUZZ_CHECK(n <= MAX_PER_SERVICE);
		FUZZ_CHECK(n <= 2 * MAX_PER_PEER);
		for (size_t q = 0;; q++) {
			allot__state_quota sq;
			if (allot__state_quota_get(
			        g->st, services[s], q, &sq) != ALLOT_OK)
				break;
			nsvcs += q == 0;
			double er = 1e-9 * sq.rate + 1e-6;
			double eb = 1e-9 * sq.burst + 1e-6;
			FUZZ_CHECK(sq.granted_rate <= sq.rate + er);
			FUZZ_CHECK(sq.granted_burst <= sq.burst + eb);
			FUZZ_CHECK(sq.granted_rate >= -er);
			FUZZ_CHECK(isfinite(sq.level) && sq.level >= -eb &&
			    sq.level <= sq.burst + eb);
		}
	}
	FUZZ_CHECK(nsvcs <= MAX_SERVICES);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static allot_config *base;
	if (base == NULL) {
		char err[256];
		static const char text[] = FUZZ_CONFIG_YAML;
		if (allot_config_parse("fuzz.yaml", text, sizeof text - 1, err,
		        sizeof err, &base) != ALLOT_OK) {
			fprintf(stderr, "fuzz_sequence: config: %s\n", err);
			abort();
		}
		for (size_t k = 0; k < MAX_JUNK; k++) {
			snprintf(junk_names[k], sizeof junk_names[k],
			    "junk-%zu", k);
			junk[k] = junk_names[k];
		}
	}
	prog g = { .p = data, .n = size, .now_ns = 1000000000u };
	allot__metrics_init(&g.metrics);
	allot_config *cfg = allot__config_dup(base);
	FUZZ_CHECK(cfg != NULL);
	allot__state_opts so;
	allot__state_opts_init(&so);
	so.clock = vclock;
	so.clock_ctx = &g;
	so.max_replicas = MAX_REPLICAS;
	so.max_replicas_per_service = MAX_PER_SERVICE;
	so.max_replicas_per_peer = MAX_PER_PEER;
	so.max_services = MAX_SERVICES;
	so.service_idle_ms = 1000;
	so.metrics = &g.metrics;
	so.hold_expired = size % 2 ? ALLOT__HOLD_FALLBACK : ALLOT__HOLD_NONE;
	FUZZ_CHECK(allot__state_create(&so, cfg, "fuzz.yaml", FUZZ_CONFIG_YAML,
	               &g.st) == ALLOT_OK);
	for (unsigned steps = 0; g.n > 0 && steps < 400; steps++) {
		uint8_t op = byte(&g);
		int r = (op >> 2) % NREPLICAS;
		switch (op & 3) {
		case 0: do_register(&g, r); break;
		case 1: do_sync(&g, r); break;
		case 2:
			if (op & 0x80)
				do_leave(&g, r);
			else
				do_sync(&g, r);
			break;
		default: do_time(&g); break;
		}
		check(&g);
	}
	allot__buf b = { 0 };
	allot__state_render_metrics(g.st, &b);
	allot__state_render_status(g.st, &b);
	allot__buf_free(&b);
	allot__state_destroy(g.st);
	return 0;
}
