/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target "wire": one request as allotd receives it. The input is the
 * body of an nng message; it goes through allotd's own dispatcher
 * (coordinator/dispatch/dispatch.c, the code its server runs: size bound, Envelope
 * decode into a per-request allocator, version check, key and report count
 * bounds, allot__state_register_on/_sync_on/_leave_on, the answer packed),
 * against a registry created in-process with the fuzz config and no store,
 * in which the session FUZZ_SESSION of FUZZ_REPLICA is already open so
 * that a Sync or Leave can name a live session. Each input is handled twice (a
 * replay: a re-registration, a stale sequence number, a leave of a gone
 * session), then the periodic work runs and /metrics and /status are rendered,
 * which is where agent-supplied names end up. The registry is, by the input's
 * length, a single coordinator or a cluster member (ownership, learning,
 * not_owner and a view change between the two passes). Beyond not crashing,
 * the target checks that every answer decodes again and says what was
 * decided (an Error with the code of a refusal), that an Error's text is
 * bounded, and that every share sent is a finite, non-negative allowance
 * for a key the session registered.
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

/* What an accepted request's answer must hold. `in` is the request,
 * `back` the answer decoded again from the bytes the dispatcher packed. */
static void
check_answer(const Allot__V1__Envelope *in, const Allot__V1__Envelope *back)
{
	switch (in->body_case) {
	case ALLOT__V1__ENVELOPE__BODY_REGISTER: {
		FUZZ_CHECK(
		    back->body_case == ALLOT__V1__ENVELOPE__BODY_WELCOME);
		const Allot__V1__Welcome *w = back->welcome;
		size_t nkeys = in->register_->n_keys;
		FUZZ_CHECK(w->session != 0);
		FUZZ_CHECK(w->replicas >= 1);
		check_shares(w->shares, w->n_shares, nkeys);
		FUZZ_CHECK(w->n_unknown_keys <= nkeys);
		for (size_t i = 0; i < w->n_unknown_keys; i++)
			FUZZ_CHECK(w->unknown_keys[i] < nkeys);
		break;
	}
	case ALLOT__V1__ENVELOPE__BODY_SYNC: {
		FUZZ_CHECK(back->body_case == ALLOT__V1__ENVELOPE__BODY_REPLY);
		const Allot__V1__Reply *r = back->reply;
		FUZZ_CHECK(r->seq == in->sync->seq);
		FUZZ_CHECK(r->rejected_reports <= in->sync->n_reports);
		/* Key ids are bounded by what any session may register. */
		check_shares(r->shares, r->n_shares, ALLOT__DISPATCH_MAX_KEYS);
		FUZZ_CHECK(r->n_not_owner <= in->sync->n_reports);
		break;
	}
	case ALLOT__V1__ENVELOPE__BODY_LEAVE:
		FUZZ_CHECK(back->body_case == ALLOT__V1__ENVELOPE__BODY_REPLY);
		break;
	default:
		/* Probe included: there is no cluster object here, so
		 * nothing else may be accepted. */
		FUZZ_CHECK(
		    in->body_case == ALLOT__V1__ENVELOPE__BODY_REGISTER);
		break;
	}
}

/* One request through allotd's own dispatcher (coordinator/dispatch/dispatch.c)
 * with its default bounds, minus the transport: no peer budgets, no
 * identity checks, no cluster object (a Probe is answered MALFORMED).
 * The answer must decode again and agree with what was decided. */
static void
handle(allot__state *st, const uint8_t *data, size_t len)
{
	fuzz_blk *head = NULL;
	ProtobufCAllocator pa = {
		.alloc = fuzz_trk_alloc,
		.free = fuzz_trk_free,
		.allocator_data = &head,
	};
	allot__dispatch_ctx c;
	allot__dispatch_ctx_init(&c);
	c.state = st;
	c.metrics = &metrics;
	allot__dispatch_req req = { .buf = data, .len = len, .pa = &pa };
	allot__dispatch_result res;
	FUZZ_CHECK(allot__dispatch(&c, &req, &res) == ALLOT_OK);
	FUZZ_CHECK(memchr(res.err, '\0', sizeof res.err) != NULL);
	Allot__V1__Envelope *back = allot__v1__envelope__unpack(
	    NULL, res.answer_len, res.answer);
	FUZZ_CHECK(back != NULL);
	FUZZ_CHECK(back->version == ALLOT__PROTOCOL_VERSION);
	if (res.code != ALLOT__V1__ERROR__CODE__UNSPECIFIED) {
		FUZZ_CHECK(res.reason < ALLOT__REJ_COUNT);
		FUZZ_CHECK(back->body_case == ALLOT__V1__ENVELOPE__BODY_ERROR);
		FUZZ_CHECK(back->error->code == res.code);
	} else {
		FUZZ_CHECK(res.request != NULL);
		check_answer(res.request, back);
	}
	allot__v1__envelope__free_unpacked(back, NULL);
	fuzz_trk_reset(&head);
}

/* Open session FUZZ_SESSION as an agent with the fuzz config would. */
static void
register_resident(allot__state *st)
{
	fuzz_blk *head = NULL;
	ProtobufCAllocator pa = {
		.alloc = fuzz_trk_alloc,
		.free = fuzz_trk_free,
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
	fuzz_trk_reset(&head);
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
	 * leader learning its quotas since it took over, or one that lost
	 * and regained leadership first (its registry dropped, every quota
	 * learnt again); and whether expired replicas' shares are held
	 * back. */
	unsigned mode = (unsigned) (size % 3);
	so.hold_expired = size % 2 ? ALLOT__HOLD_FALLBACK : ALLOT__HOLD_NONE;
	allot__state *st;
	FUZZ_CHECK(allot__state_create(&so, cfg, "fuzz.yaml", FUZZ_CONFIG_YAML,
	               &st) == ALLOT_OK);
	if (mode == 1)
		allot__state_learn(st);
	if (mode == 2) {
		/* Leadership lost and taken again: nothing survives. */
		allot__state_forget(st, false);
		allot__state_forget(st, true);
	}
	register_resident(st);

	handle(st, data, size);
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
