/* SPDX-License-Identifier: MIT */
/*
 * The /stats document of the example service: what each caller asked for
 * and what work was actually done for it (the service's own count, which
 * tests and the demo compare with what clients saw), the concurrency
 * limiter's lanes, the agent's per-key counters (allot_stats()) and the
 * coordinator sync state with the share of each quota this replica holds
 * now. docs/integrating.md documents the shape. Built in a growing
 * buffer; /stats is an operator's endpoint, not the hot path.
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service.h"

struct jbuf {
	char *p;
	size_t len;
	size_t cap;
	bool oom;
};

__attribute__((format(printf, 2, 3))) static void
jf(struct jbuf *b, const char *fmt, ...)
{
	if (b->oom)
		return;
	for (;;) {
		va_list ap;
		va_start(ap, fmt);
		int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->oom = true;
			return;
		}
		if ((size_t) n < b->cap - b->len) {
			b->len += (size_t) n;
			return;
		}
		size_t cap = b->cap * 2 + (size_t) n;
		char *p = realloc(b->p, cap);
		if (p == NULL) {
			b->oom = true;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
}

/* A JSON string, or null for NULL / "" when `empty_null`. */
static void
jstr(struct jbuf *b, const char *s, bool empty_null)
{
	if (s == NULL || (empty_null && s[0] == '\0')) {
		jf(b, "null");
		return;
	}
	jf(b, "\"");
	for (; *s != '\0'; s++) {
		unsigned char c = (unsigned char) *s;
		if (c == '"' || c == '\\')
			jf(b, "\\%c", c);
		else if (c < 0x20 || c == 0x7f)
			jf(b, "\\u%04x", c);
		else
			jf(b, "%c", c);
	}
	jf(b, "\"");
}

/* Finite numbers only: JSON has no NaN or infinity. */
static void
jnum(struct jbuf *b, double x)
{
	jf(b, "%.6g", isfinite(x) ? x : 0.0);
}

static uint64_t
ld(_Atomic uint64_t *c)
{
	return atomic_load_explicit(c, memory_order_relaxed);
}

struct totals {
	uint64_t requests, admitted, rate_denied, shadow_would_deny;
	uint64_t conc_rejected, cost_too_big, closed, bad_requests;
	uint64_t lookups_done, exports_done, rows_exported;
	uint64_t tokens_estimated, tokens_measured;
};

/* The counters a caller and the totals both carry; the first preceded by
 * a comma unless it opens its object. */
static void
counts_json(struct jbuf *b, const struct totals *x, bool first)
{
	jf(b, "%s\"requests\":%" PRIu64, first ? "" : ",", x->requests);
	jf(b,
	    ",\"admitted\":%" PRIu64 ",\"rate_denied\":%" PRIu64
	    ",\"shadow_would_deny\":%" PRIu64 ",\"conc_rejected\":%" PRIu64
	    ",\"cost_too_big\":%" PRIu64 ",\"closed\":%" PRIu64
	    ",\"bad_requests\":%" PRIu64 ",\"work_done\":%" PRIu64
	    ",\"lookups_done\":%" PRIu64 ",\"exports_done\":%" PRIu64
	    ",\"rows_exported\":%" PRIu64
	    ",\"export_tokens_estimated\":%" PRIu64
	    ",\"export_tokens_measured\":%" PRIu64,
	    x->admitted, x->rate_denied, x->shadow_would_deny,
	    x->conc_rejected, x->cost_too_big, x->closed, x->bad_requests,
	    x->lookups_done + x->exports_done, x->lookups_done,
	    x->exports_done, x->rows_exported, x->tokens_estimated,
	    x->tokens_measured);
}

static void
caller_json(
    struct jbuf *b, struct svc *s, struct svc_caller *c, struct totals *t)
{
	struct totals x = {
		ld(&c->requests),
		ld(&c->admitted),
		ld(&c->rate_denied),
		ld(&c->shadow_would_deny),
		ld(&c->conc_rejected),
		ld(&c->cost_too_big),
		ld(&c->closed),
		ld(&c->bad_requests),
		ld(&c->lookups_done),
		ld(&c->exports_done),
		ld(&c->rows_exported),
		ld(&c->export_tokens_estimated),
		ld(&c->export_tokens_measured),
	};
	t->requests += x.requests;
	t->admitted += x.admitted;
	t->rate_denied += x.rate_denied;
	t->shadow_would_deny += x.shadow_would_deny;
	t->conc_rejected += x.conc_rejected;
	t->cost_too_big += x.cost_too_big;
	t->closed += x.closed;
	t->bad_requests += x.bad_requests;
	t->lookups_done += x.lookups_done;
	t->exports_done += x.exports_done;
	t->rows_exported += x.rows_exported;
	t->tokens_estimated += x.tokens_estimated;
	t->tokens_measured += x.tokens_measured;
	allot_conc_stats cs;
	memset(&cs, 0, sizeof cs);
	allot_conc_caller_stats(s->conc, c->conc_slot, ALLOT_LANE_BULK, &cs);

	jf(b, "{\"identity\":");
	jstr(b, c->has_identity ? c->identity : NULL, true);
	jf(b, ",\"quota\":");
	jstr(b, c->quota, false);
	counts_json(b, &x, false);
	jf(b,
	    ",\"export_in_flight\":%" PRIu32
	    ",\"export_max_in_flight\":%" PRIu32 ",\"export_queued\":%" PRIu32
	    "}",
	    cs.in_flight, cs.max_in_flight, cs.queued);
}

static void
conc_json(struct jbuf *b, const allot_conc_stats *cs)
{
	jf(b,
	    "{\"in_flight\":%" PRIu32 ",\"max_in_flight\":%" PRIu32
	    ",\"queued\":%" PRIu32 ",\"acquired\":%" PRIu64
	    ",\"rejected_full\":%" PRIu64 ",\"rejected_age\":%" PRIu64
	    ",\"max_queue_age_ms\":%" PRIu64 "}",
	    cs->in_flight, cs->max_in_flight, cs->queued, cs->acquired,
	    cs->rejected_full, cs->rejected_age, cs->max_queue_age_ms);
}

static void
key_json(struct jbuf *b, const allot_key_stats *k)
{
	jf(b, "{\"identity\":");
	jstr(b, k->identity, true);
	jf(b, ",\"endpoint\":");
	jstr(b, k->endpoint, false);
	jf(b, ",\"quota\":");
	jstr(b, k->quota, false);
	jf(b,
	    ",\"known\":%s,\"shadow\":%s,\"allowed\":%" PRIu64
	    ",\"denied\":%" PRIu64 ",\"shadow_denied\":%" PRIu64
	    ",\"tokens_spent\":%" PRIu64 ",\"tokens_denied\":%" PRIu64
	    ",\"rate\":",
	    k->known ? "true" : "false", k->shadow ? "true" : "false",
	    k->allowed, k->denied, k->shadow_denied, k->tokens_spent,
	    k->tokens_denied);
	jnum(b, k->rate);
	jf(b, ",\"limit\":");
	jnum(b, k->limit);
	jf(b, ",\"utilization\":");
	jnum(b, k->utilization);
	jf(b, "}");
}

/* The agent's keys with activity; NULL when out of memory. */
static allot_key_stats *
snapshot_keys(struct svc *s, size_t *ret_n)
{
	allot_key_stats *ks = NULL;
	size_t cap = 0, n = 0;
	for (int tries = 0; tries < 8; tries++) {
		if (allot_stats(s->agent, ks, cap, &n) != ALLOT_OK)
			break;
		if (n <= cap) {
			*ret_n = n;
			return ks;
		}
		/* Keys appeared between the calls: grow with room. */
		cap = n + n / 4 + 8;
		allot_key_stats *p = realloc(ks, cap * sizeof *ks);
		if (p == NULL)
			break;
		ks = p;
	}
	free(ks);
	*ret_n = 0;
	return NULL;
}

static void
sync_json(struct jbuf *b, struct svc *s, const allot_key_stats *ks, size_t nk)
{
	allot_sync_stats ss;
	memset(&ss, 0, sizeof ss);
	allot_sync_stats_get(s->agent, &ss);
	jf(b,
	    "{\"enabled\":%s,\"connected\":%s,\"in_fallback\":%s"
	    ",\"replicas\":%" PRIu32 ",\"session\":%" PRIu64
	    ",\"config_epoch\":%" PRIu64 ",\"registers\":%" PRIu64
	    ",\"syncs_ok\":%" PRIu64 ",\"syncs_failed\":%" PRIu64
	    ",\"errors_received\":%" PRIu64 ",\"fallback_enters\":%" PRIu64
	    ",\"fallback_leaves\":%" PRIu64 ",\"unknown_keys\":%" PRIu64
	    ",\"reports_sent\":%" PRIu64 ",\"bytes_sent\":%" PRIu64
	    ",\"last_rtt_us\":%" PRIu64 ",\"lease_remaining_ms\":%" PRId64
	    ",\"early_syncs\":%" PRIu64 ",\"central\":{\"asks\":%" PRIu64
	    ",\"allowed\":%" PRIu64 ",\"denied\":%" PRIu64 ",\"late\":%" PRIu64
	    ",\"short\":%" PRIu64 ",\"dry\":%" PRIu64 ",\"tokens\":%" PRIu64
	    ",\"wait_max_us\":%" PRIu64
	    "},\"usage\":{\"account\":\"%016" PRIx64 "\",\"pending\":%" PRIu64
	    ",\"durable\":%" PRIu64 ",\"folded\":%" PRIu64
	    ",\"dropped_tokens\":%" PRIu64 "},\"shares\":[",
	    ss.enabled ? "true" : "false", ss.connected ? "true" : "false",
	    ss.in_fallback ? "true" : "false", ss.replicas, ss.session,
	    ss.config_epoch, ss.registers, ss.syncs_ok, ss.syncs_failed,
	    ss.errors_received, ss.fallback_enters, ss.fallback_leaves,
	    ss.unknown_keys, ss.reports_sent, ss.bytes_sent, ss.last_rtt_us,
	    ss.lease_remaining_ms, ss.early_syncs, ss.central_asks,
	    ss.central_allowed, ss.central_denied, ss.central_late,
	    ss.central_short, ss.central_dry, ss.central_tokens,
	    ss.central_wait_max_ns / 1000, ss.usage_incarnation,
	    ss.usage_pending, ss.usage_durable, ss.usage_folded,
	    ss.usage_dropped_tokens);
	/* One share per quota: the keys of a quota share its bucket, so
	 * the first key seen speaks for it. */
	bool first = true;
	for (size_t i = 0; i < nk; i++) {
		bool seen = false;
		for (size_t j = 0; j < i && !seen; j++)
			seen = strcmp(ks[j].quota, ks[i].quota) == 0;
		if (seen)
			continue;
		jf(b, "%s{\"quota\":", first ? "" : ",");
		jstr(b, ks[i].quota, false);
		jf(b, ",\"rate\":");
		jnum(b, ks[i].rate);
		jf(b, ",\"limit\":");
		jnum(b, ks[i].limit);
		jf(b, "}");
		first = false;
	}
	jf(b, "]}");
}

/* Signed-token checks by outcome (allot/jwt.h), when tokens are on. */
static void
tokens_json(struct jbuf *b, struct svc *s)
{
	allot_jwt_stats st;
	if (s->jwt == NULL)
		return;
	allot_jwt_verifier_stats(s->jwt, &st);
	jf(b, ",\"tokens\":{");
	for (int i = 0; i < ALLOT_JWT_NSTATUS; i++)
		jf(b, "%s\"%s\":%" PRIu64, i > 0 ? "," : "",
		    allot_jwt_status_name((allot_jwt_status) i),
		    st.by_status[i]);
	jf(b,
	    ",\"not_bearer\":%" PRIu64 ",\"cache_hits\":%" PRIu64
	    ",\"key_reloads\":%" PRIu64 ",\"key_reload_failures\":%" PRIu64
	    "}",
	    ld(&s->not_bearer), st.cache_hits, st.reloads, st.reload_failures);
}

static const char *
mode_name(enum svc_mode m)
{
	switch (m) {
	case MODE_MTLS: return "mtls";
	case MODE_TLS: return "tls";
	case MODE_PLAIN: return "plain";
	case MODE_PLAIN_INSECURE: return "plain-insecure-identity-header";
	}
	return "?";
}

char *
svc_stats_json(struct svc *s, size_t *ret_len)
{
	struct jbuf b = { malloc(4096), 0, 4096, false };
	if (b.p == NULL)
		return NULL;
	size_t nk = 0;
	allot_key_stats *ks = snapshot_keys(s, &nk);

	jf(&b, "{\"service\":");
	jstr(&b, s->o.service, false);
	jf(&b, ",\"replica_id\":");
	jstr(&b, s->o.replica_id, true);
	jf(&b,
	    ",\"mode\":\"%s\",\"uptime_ms\":%" PRIu64
	    ",\"connections_accepted\":%" PRIu64 ",\"callers\":[",
	    mode_name(s->mode), (svc_now_ns() - s->started_ns) / 1000000u,
	    ld(&s->connections));
	struct totals t;
	memset(&t, 0, sizeof t);
	uint32_t n = atomic_load_explicit(&s->callers.n, memory_order_acquire);
	for (uint32_t i = 0; i < n; i++) {
		if (i > 0)
			jf(&b, ",");
		caller_json(&b, s, &s->callers.rec[i], &t);
	}
	jf(&b, "],\"totals\":{");
	counts_json(&b, &t, true);
	jf(&b, ",\"callers_overflowed\":%" PRIu64 "}",
	    ld(&s->callers.overflowed));

	const allot_conc_options *co = &s->conc_opts;
	jf(&b,
	    ",\"concurrency\":{\"global_max\":%" PRIu32
	    ",\"export_max_in_flight\":%" PRIu32
	    ",\"export_max_per_caller\":%" PRIu32
	    ",\"export_queue_max\":%" PRIu32 ",\"export_queue_ms\":%" PRIu32
	    ",\"interactive\":",
	    co->global_max, co->lane_max[ALLOT_LANE_BULK],
	    co->caller_max[ALLOT_LANE_BULK], co->queue_max[ALLOT_LANE_BULK],
	    co->max_wait_ms[ALLOT_LANE_BULK]);
	allot_conc_stats cs;
	memset(&cs, 0, sizeof cs);
	allot_conc_lane_stats(s->conc, ALLOT_LANE_INTERACTIVE, &cs);
	conc_json(&b, &cs);
	jf(&b, ",\"bulk\":");
	memset(&cs, 0, sizeof cs);
	allot_conc_lane_stats(s->conc, ALLOT_LANE_BULK, &cs);
	conc_json(&b, &cs);

	jf(&b, "}");
	tokens_json(&b, s);
	jf(&b, ",\"keys\":[");
	for (size_t i = 0; i < nk; i++) {
		if (i > 0)
			jf(&b, ",");
		key_json(&b, &ks[i]);
	}
	jf(&b, "],\"sync\":");
	sync_json(&b, s, ks, nk);
	jf(&b, "}\n");
	free(ks);
	if (b.oom) {
		free(b.p);
		return NULL;
	}
	*ret_len = b.len;
	return b.p;
}
