/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target "wire": one request as allotd receives it. The input is the
 * body of an nng message; it goes through the same steps as handle() in
 * coordinator/server.c (size bound, Envelope decode into a per-request
 * allocator, version check, key and report count bounds, dispatch to
 * allot__state_register/_sync/_leave, the answer packed), against a
 * registry created in-process with the fuzz config and no store, in which
 * the session FUZZ_SESSION of FUZZ_REPLICA is already open so that a Sync
 * or Leave can name a live session. Each input is handled twice (a replay:
 * a re-registration, a stale sequence number, a leave of a gone session),
 * then the periodic work runs and /metrics and /status are rendered, which
 * is where agent-supplied names end up. The registry is, by the input's
 * length, a single coordinator or a cluster member (ownership, learning,
 * not_owner and a view change between the two passes). Beyond not crashing,
 * the target checks that every answer packs and decodes again, that an Error's
 * text is bounded, and that every share sent is a finite, non-negative
 * allowance for a key the session registered.
 */
#include <math.h>
#include <stdalign.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "allot.pb-c.h"
#include "fuzz.h"
#include "metrics.h"
#include "rendezvous.h"
#include "server.h"
#include "state.h"

/* ---- a per-request allocator, like the server's arena ----
 * Every block is its own malloc so that AddressSanitizer sees the bounds
 * of each; everything is released at once after the answer is packed. */

typedef struct blk {
	struct blk *next;
	alignas(max_align_t) unsigned char data[];
} blk;

static void *
trk_alloc(void *arg, size_t size)
{
	blk **head = arg;
	blk *b = malloc(sizeof *b + (size > 0 ? size : 1));
	if (b == NULL)
		return NULL;
	b->next = *head;
	*head = b;
	return b->data;
}

static void
trk_free(void *arg, void *p)
{
	(void) arg;
	(void) p; /* released by trk_reset() */
}

static void
trk_reset(blk **head)
{
	while (*head != NULL) {
		blk *n = (*head)->next;
		free(*head);
		*head = n;
	}
}

/* ---- the fixed part: config, logger, metrics ---- */

static allot_config *base_cfg;
static allot__metrics metrics;

/* Format every message (allot__log only formats when a handler is set)
 * and touch it, then drop it. */
static void
log_sink(void *ctx, int level, const char *id, const char *msg)
{
	(void) ctx;
	(void) level;
	FUZZ_CHECK(id != NULL && msg != NULL);
	volatile size_t n = strlen(id) + strlen(msg);
	(void) n;
}

static const allot__logger logger = {
	.fn = log_sink,
	.ctx = NULL,
	.level = ALLOT_LOG_DEBUG,
};

static void
init_once(void)
{
	if (base_cfg != NULL)
		return;
	char err[256];
	static const char text[] = FUZZ_CONFIG_YAML;
	if (allot_config_parse("fuzz.yaml", text, sizeof text - 1, err,
	        sizeof err, &base_cfg) != ALLOT_OK) {
		fprintf(stderr, "fuzz_wire: config: %s\n", err);
		abort();
	}
	allot__metrics_init(&metrics);
}

static void
check_shares(Allot__V1__Share *const *shares, size_t n, size_t nkeys)
{
	FUZZ_CHECK(n <= nkeys);
	FUZZ_CHECK(n == 0 || shares != NULL);
	for (size_t i = 0; i < n; i++) {
		const Allot__V1__Share *s = shares[i];
		FUZZ_CHECK(s->key < nkeys);
		FUZZ_CHECK(isfinite(s->rate) && s->rate >= 0);
		FUZZ_CHECK(isfinite(s->burst) && s->burst >= 0);
	}
}

/* Pack the answer as the server does and decode it again. */
static void
answer(const Allot__V1__Envelope *out)
{
	size_t n = allot__v1__envelope__get_packed_size(out);
	uint8_t *buf = malloc(n > 0 ? n : 1);
	FUZZ_CHECK(buf != NULL);
	FUZZ_CHECK(allot__v1__envelope__pack(out, buf) == n);
	Allot__V1__Envelope *back = allot__v1__envelope__unpack(NULL, n, buf);
	FUZZ_CHECK(back != NULL);
	FUZZ_CHECK(back->body_case == out->body_case);
	allot__v1__envelope__free_unpacked(back, NULL);
	free(buf);
}

/* handle() of coordinator/server.c, minus the transport and logging. */
static void
handle(allot__state *st, const uint8_t *data, size_t len)
{
	blk *head = NULL;
	ProtobufCAllocator pa = {
		.alloc = trk_alloc,
		.free = trk_free,
		.allocator_data = &head,
	};
	char err[256] = "";
	Allot__V1__Error__Code code = ALLOT__V1__ERROR__CODE__UNSPECIFIED;
	Allot__V1__Envelope out = ALLOT__V1__ENVELOPE__INIT;
	Allot__V1__Welcome welcome = ALLOT__V1__WELCOME__INIT;
	Allot__V1__Reply reply = ALLOT__V1__REPLY__INIT;
	Allot__V1__Error error = ALLOT__V1__ERROR__INIT;
	out.version = ALLOT__PROTOCOL_VERSION;
	Allot__V1__Envelope *in = NULL;

	if (len > ALLOT__SERVER_MAX_MSG) {
		code = ALLOT__V1__ERROR__CODE__TOO_LARGE;
		goto done;
	}
	in = allot__v1__envelope__unpack(&pa, len, data);
	if (in == NULL) {
		code = ALLOT__V1__ERROR__CODE__MALFORMED;
		goto done;
	}
	if (in->version != ALLOT__PROTOCOL_VERSION) {
		code = ALLOT__V1__ERROR__CODE__VERSION;
		goto done;
	}
	switch (in->body_case) {
	case ALLOT__V1__ENVELOPE__BODY_REGISTER:
		if (in->register_->n_keys > ALLOT__SERVER_MAX_KEYS) {
			code = ALLOT__V1__ERROR__CODE__TOO_LARGE;
			break;
		}
		code = allot__state_register(
		    st, in->register_, &pa, &welcome, err, sizeof err);
		out.body_case = ALLOT__V1__ENVELOPE__BODY_WELCOME;
		out.welcome = &welcome;
		if (code == ALLOT__V1__ERROR__CODE__UNSPECIFIED) {
			FUZZ_CHECK(welcome.session != 0);
			FUZZ_CHECK(welcome.replicas >= 1);
			check_shares(welcome.shares, welcome.n_shares,
			    in->register_->n_keys);
			FUZZ_CHECK(
			    welcome.n_unknown_keys <= in->register_->n_keys);
			for (size_t i = 0; i < welcome.n_unknown_keys; i++)
				FUZZ_CHECK(welcome.unknown_keys[i] <
				    in->register_->n_keys);
		}
		break;
	case ALLOT__V1__ENVELOPE__BODY_SYNC:
		if (in->sync->n_reports > ALLOT__SERVER_MAX_REPORTS) {
			code = ALLOT__V1__ERROR__CODE__TOO_LARGE;
			break;
		}
		code = allot__state_sync(
		    st, in->sync, &pa, &reply, err, sizeof err);
		out.body_case = ALLOT__V1__ENVELOPE__BODY_REPLY;
		out.reply = &reply;
		if (code == ALLOT__V1__ERROR__CODE__UNSPECIFIED) {
			FUZZ_CHECK(reply.seq == in->sync->seq);
			FUZZ_CHECK(
			    reply.rejected_reports <= in->sync->n_reports);
			/* Key ids are bounded by what any session may
			 * register. */
			check_shares(reply.shares, reply.n_shares,
			    ALLOT__SERVER_MAX_KEYS);
			FUZZ_CHECK(reply.n_not_owner <= in->sync->n_reports);
		}
		break;
	case ALLOT__V1__ENVELOPE__BODY_LEAVE:
		code = allot__state_leave(
		    st, in->leave, &reply, err, sizeof err);
		out.body_case = ALLOT__V1__ENVELOPE__BODY_REPLY;
		out.reply = &reply;
		break;
	default:
		/* Probe included: no cluster object here (server.c answers
		 * MALFORMED without one too). */
		code = ALLOT__V1__ERROR__CODE__MALFORMED;
		break;
	}
done:
	if (code != ALLOT__V1__ERROR__CODE__UNSPECIFIED) {
		FUZZ_CHECK(memchr(err, '\0', sizeof err) != NULL);
		error.code = code;
		error.message = err;
		out.body_case = ALLOT__V1__ENVELOPE__BODY_ERROR;
		out.error = &error;
	}
	answer(&out);
	trk_reset(&head);
}

/* Open session FUZZ_SESSION as an agent with the fuzz config would. */
static void
register_resident(allot__state *st)
{
	blk *head = NULL;
	ProtobufCAllocator pa = {
		.alloc = trk_alloc,
		.free = trk_free,
		.allocator_data = &head,
	};
	const char *keys[FUZZ_NKEYS] = FUZZ_KEYS;
	Allot__V1__Register reg = ALLOT__V1__REGISTER__INIT;
	reg.replica_id = (char *) FUZZ_REPLICA;
	reg.service = (char *) FUZZ_SERVICE;
	reg.host = (char *) "fuzzhost";
	reg.pid = 1;
	reg.agent_version = (char *) "fuzz";
	reg.config_digest = base_cfg->digest;
	reg.n_keys = FUZZ_NKEYS;
	reg.keys = (char **) keys;
	reg.sync_interval_ms = 100;
	Allot__V1__Welcome w = ALLOT__V1__WELCOME__INIT;
	char err[256];
	FUZZ_CHECK(allot__state_register(st, &reg, &pa, &w, err, sizeof err) ==
	    ALLOT__V1__ERROR__CODE__UNSPECIFIED);
	FUZZ_CHECK(w.session == FUZZ_SESSION);
	trk_reset(&head);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	init_once();
	allot_config *cfg = allot__config_dup(base_cfg);
	FUZZ_CHECK(cfg != NULL);
	allot__state_opts so;
	allot__state_opts_init(&so);
	/* Small tables keep each run cheap; the bounds are still hit. */
	so.max_replicas = 8;
	so.max_services = 4;
	so.lg = &logger;
	so.metrics = &metrics;
	/* The input's length picks the coordinator's situation, so that
	 * the same corpus reaches every path: one coordinator, a cluster
	 * member with every member live (learning its keys since start),
	 * or one whose peer m2 is down (learning m2's keys too); and
	 * whether expired replicas' shares are held back. */
	unsigned mode = (unsigned) (size % 3);
	so.hold_expired = size % 2 ? ALLOT__HOLD_FALLBACK : ALLOT__HOLD_NONE;
	allot__state *st;
	FUZZ_CHECK(allot__state_create(&so, cfg, "fuzz.yaml", FUZZ_CONFIG_YAML,
	               &st) == ALLOT_OK);
	bool live[3] = { true, true, true };
	if (mode > 0) {
		uint64_t h[3] = { allot__rendezvous_member("m1"),
			allot__rendezvous_member("m2"),
			allot__rendezvous_member("m3") };
		allot__state_cluster(st, h, 3, 0);
		live[1] = mode == 1;
		allot__state_view(st, live, false);
	}
	register_resident(st);

	handle(st, data, size);
	if (mode == 2) {
		/* m2 comes back: its keys leave this member. */
		live[1] = true;
		allot__state_view(st, live, false);
	}
	handle(st, data, size);

	allot__state_tick(st);
	allot__state_second(st);
	allot__buf b = { 0 };
	allot__state_render_metrics(st, &b);
	allot__state_render_status(st, &b);
	allot__metrics_render(&metrics, &b);
	FUZZ_CHECK(b.oom || b.len == 0 || strlen(b.p) == b.len);
	allot__buf_free(&b);
	allot__state_destroy(st);
	return 0;
}
