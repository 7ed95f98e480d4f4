/* SPDX-License-Identifier: MIT */
/*
 * Process-wide counters of allotd and their Prometheus rendering
 * (metrics.h). Nothing here locks: counters are relaxed
 * atomics, and a rendered snapshot may mix values from slightly different
 * instants, which Prometheus tolerates.
 */
#include "metrics.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>

#include "procstat.h"

/* ---- reasons ---- */

const char *
allot__reject_name(allot__reject r)
{
	static const char *const names[ALLOT__REJ_COUNT] = {
		[ALLOT__REJ_VERSION] = "version",
		[ALLOT__REJ_MALFORMED] = "malformed",
		[ALLOT__REJ_UNKNOWN_SESSION] = "unknown_session",
		[ALLOT__REJ_STALE_SEQ] = "stale_seq",
		[ALLOT__REJ_UNKNOWN_KEY] = "unknown_key",
		[ALLOT__REJ_ABSURD] = "absurd",
		[ALLOT__REJ_TOO_LARGE] = "too_large",
		[ALLOT__REJ_CAPACITY] = "capacity",
		[ALLOT__REJ_SHUTTING_DOWN] = "shutting_down",
		[ALLOT__REJ_NOT_OWNER] = "not_owner",
		[ALLOT__REJ_NOT_LEADER] = "not_leader",
		[ALLOT__REJ_SESSION_PIPE] = "session_pipe_mismatch",
		[ALLOT__REJ_IDENTITY_MISSING] = "identity_missing",
		[ALLOT__REJ_IDENTITY_INVALID] = "identity_invalid",
		[ALLOT__REJ_IDENTITY_MISMATCH] = "identity_mismatch",
		[ALLOT__REJ_IDENTITY_REPLAY] = "identity_replay",
		[ALLOT__REJ_PEER_REGISTER_RATE] = "peer_register_rate",
		[ALLOT__REJ_PEER_MESSAGE_RATE] = "peer_message_rate",
		[ALLOT__REJ_PEER_REPLICAS] = "peer_replicas",
		[ALLOT__REJ_REPLICA_IN_USE] = "replica_in_use",
	};
	return r < ALLOT__REJ_COUNT ? names[r] : "unknown";
}

/* ---- histograms ---- */

/* Request handling takes microseconds; the buckets span 5 µs to 1 s. */
static const double latency_bounds[ALLOT__HIST_BUCKETS] = {
	5e-6,
	10e-6,
	25e-6,
	50e-6,
	100e-6,
	250e-6,
	500e-6,
	1e-3,
	2.5e-3,
	5e-3,
	10e-3,
	25e-3,
	50e-3,
	100e-3,
	250e-3,
	1.0,
};

/* A group commit takes about a millisecond on an idle disk and up to the
 * busy timeout when an auditor holds a lock. */
static const double commit_bounds[ALLOT__HIST_BUCKETS] = {
	100e-6,
	250e-6,
	500e-6,
	1e-3,
	2.5e-3,
	5e-3,
	10e-3,
	25e-3,
	50e-3,
	100e-3,
	250e-3,
	500e-3,
	1.0,
	2.5,
	5.0,
	10.0,
};

void
allot__hist_observe_ns(allot__hist *h, uint64_t ns)
{
	double s = (double) ns / 1e9;
	size_t i = 0;
	while (i < ALLOT__HIST_BUCKETS && s > h->bounds[i])
		i++;
	atomic_fetch_add_explicit(&h->bucket[i], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
}

void
allot__metrics_init(allot__metrics *m)
{
	memset(m, 0, sizeof *m);
	m->sync_latency.bounds = latency_bounds;
	m->store_commit.bounds = commit_bounds;
}

static uint64_t
ld(const _Atomic uint64_t *c)
{
	return atomic_load_explicit(c, memory_order_relaxed);
}

/* One series with one sample: a counter or a gauge. */
static void
simple(allot__buf *b, const char *type, const char *name, const char *help,
    uint64_t v)
{
	allot__buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", name,
	    help, name, type, name, (unsigned long long) v);
}

static void
histogram(
    allot__buf *b, const char *name, const char *help, const allot__hist *h)
{
	allot__buf_printf(
	    b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
	uint64_t cum = 0;
	for (size_t i = 0; i < ALLOT__HIST_BUCKETS; i++) {
		cum += ld(&h->bucket[i]);
		allot__buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name,
		    h->bounds[i], (unsigned long long) cum);
	}
	cum += ld(&h->bucket[ALLOT__HIST_BUCKETS]);
	allot__buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name,
	    (unsigned long long) cum);
	allot__buf_printf(b, "%s_sum %.9f\n%s_count %llu\n", name,
	    (double) ld(&h->sum_ns) / 1e9, name, (unsigned long long) cum);
}

static void
build_info(const allot__metrics *m, allot__buf *b)
{
	allot__buf_printf(b,
	    "# HELP allotd_build_info allotd version.\n"
	    "# TYPE allotd_build_info gauge\n"
	    "allotd_build_info{version=\"%s\"} 1\n",
	    ALLOT_VERSION_STRING);
	allot__buf_printf(b,
	    "# HELP allotd_start_time_seconds Wall-clock "
	    "start time.\n# TYPE allotd_start_time_seconds gauge\n"
	    "allotd_start_time_seconds %.3f\n",
	    (double) m->start_wall_ms / 1e3);
}

/* The process collector's metrics (common/procstat.h). */
static void
process(const allot__metrics *m, allot__buf *b)
{
	(void) m;
	char text[4096];
	size_t n = allot__procstat_text(text, sizeof text);
	allot__buf_put(b, text, n);
}

static void
rejected(const allot__metrics *m, allot__buf *b)
{
	allot__buf_puts(b,
	    "# HELP allotd_rejected_messages_total Rejected "
	    "input by reason (unknown_key and absurd count key reports, the "
	    "others whole messages).\n"
	    "# TYPE allotd_rejected_messages_total counter\n");
	for (int r = 0; r < ALLOT__REJ_COUNT; r++)
		allot__buf_printf(b,
		    "allotd_rejected_messages_total{reason=\"%s\"} %llu\n",
		    allot__reject_name((allot__reject) r),
		    (unsigned long long) ld(&m->rejected[r]));
}

static void
events(const allot__metrics *m, allot__buf *b)
{
	allot__buf_printf(b,
	    "# HELP allotd_replica_events_total Replica "
	    "registry changes by kind.\n"
	    "# TYPE allotd_replica_events_total counter\n"
	    "allotd_replica_events_total{kind=\"join\"} %llu\n"
	    "allotd_replica_events_total{kind=\"leave\"} %llu\n"
	    "allotd_replica_events_total{kind=\"expiry\"} %llu\n"
	    "allotd_replica_events_total{kind=\"replaced\"} %llu\n",
	    (unsigned long long) ld(&m->joins),
	    (unsigned long long) ld(&m->leaves),
	    (unsigned long long) ld(&m->expiries),
	    (unsigned long long) ld(&m->replaced));
	allot__buf_printf(b,
	    "# HELP allotd_config_reloads_total Quota config "
	    "reloads by result.\n# TYPE allotd_config_reloads_total counter\n"
	    "allotd_config_reloads_total{result=\"ok\"} %llu\n"
	    "allotd_config_reloads_total{result=\"fail\"} %llu\n",
	    (unsigned long long) ld(&m->reloads_ok),
	    (unsigned long long) ld(&m->reloads_failed));
}

/* The process-wide series in the order /metrics shows them: a counter or
 * gauge names its field, a histogram its allot__hist, anything with
 * labels a function. */
typedef enum series_kind { COUNTER, GAUGE, HISTOGRAM, CUSTOM } series_kind;

static const struct series {
	series_kind kind;
	const char *name;
	const char *help;
	size_t off; /* of the field, for all but CUSTOM */
	void (*fn)(const allot__metrics *m, allot__buf *b); /* CUSTOM */
} series[] = {
#define F(f) offsetof(allot__metrics, f), NULL
	{ CUSTOM, NULL, NULL, 0, build_info },
	{ CUSTOM, NULL, NULL, 0, process },
	{ COUNTER, "allotd_registers_total", "Register messages accepted.",
	    F(registers) },
	{ COUNTER, "allotd_syncs_total", "Sync messages accepted.", F(syncs) },
	{ COUNTER, "allotd_early_syncs_total",
	    "Syncs sent early by an agent whose key started denying.",
	    F(early_syncs) },
	{ COUNTER, "allotd_early_rounds_total",
	    "Allocation rounds run at once for an early Sync.",
	    F(early_rounds) },
	{ COUNTER, "allotd_loans_total",
	    "Loans made to a key that started denying (Share.prefill).",
	    F(loans) },
	{ COUNTER, "allotd_loan_tokens_total",
	    "Tokens those loans moved from idle replicas (whole tokens).",
	    F(loan_tokens) },
	{ COUNTER, "allotd_asks_total",
	    "Asks answered: requests short locally, served centrally.",
	    F(asks) },
	{ COUNTER, "allotd_ask_granted_tokens_total",
	    "Tokens Asks were granted from the central reserves.",
	    F(ask_tokens_granted) },
	{ COUNTER, "allotd_ask_refused_tokens_total",
	    "Tokens Asks asked for that the reserves could not give.",
	    F(ask_tokens_refused) },
	{ COUNTER, "allotd_config_pushes_total",
	    "Quota config texts sent to agents (Welcome or Reply).",
	    F(config_pushes) },
	{ COUNTER, "allotd_leaves_total", "Leave messages accepted.",
	    F(leaves) },
	{ COUNTER, "allotd_key_reports_total", "Key reports accepted.",
	    F(key_reports) },
	{ COUNTER, "allotd_register_unknown_keys_total",
	    "Keys named at registration that have no quota.",
	    F(register_unknown_keys) },
	{ COUNTER, "allotd_reports_clipped_total",
	    "Key reports claiming more consumption than the replica could "
	    "have admitted since its last report; the excess is not "
	    "booked.",
	    F(reports_clipped) },
	{ COUNTER, "allotd_tokens_clipped_total",
	    "Tokens of consumption clipped from implausible reports.",
	    F(tokens_clipped) },
	{ COUNTER, "allotd_denial_reports_refuted_total",
	    "Key reports claiming denials while the replica's bucket held "
	    "the largest endpoint weight throughout; not booked.",
	    F(denial_reports_refuted) },
	{ COUNTER, "allotd_denials_refuted_total",
	    "Tokens of denials in refuted reports, not booked.",
	    F(denials_refuted) },
	{ COUNTER, "allotd_usage_records_total",
	    "Agents' Usage records booked into the audit (each once).",
	    F(usage_booked) },
	{ COUNTER, "allotd_usage_repeats_total",
	    "Usage records sent again that were booked already (a lost "
	    "Reply, a failover, a restart): not booked twice.",
	    F(usage_repeats) },
	{ COUNTER, "allotd_usage_refused_total",
	    "Usage counts above what their whole quota could admit in "
	    "the seconds they cover: dropped and audited.",
	    F(usage_refused) },
	{ COUNTER, "allotd_usage_clamped_total",
	    "Usage records dated more than 10 s ahead of this "
	    "coordinator's clock: booked at its second instead.",
	    F(usage_clamped) },
	{ COUNTER, "allotd_throttled_syncs_alive_total",
	    "Syncs refused by a peer budget that still proved their "
	    "session alive.",
	    F(throttled_alive) },
	{ CUSTOM, NULL, NULL, 0, rejected },
	{ CUSTOM, NULL, NULL, 0, events },
	{ COUNTER, "allotd_received_bytes_total", "Protocol bytes received.",
	    F(bytes_in) },
	{ COUNTER, "allotd_sent_bytes_total", "Protocol bytes sent.",
	    F(bytes_out) },
	{ HISTOGRAM, "allotd_sync_latency_seconds",
	    "Time from receiving a request to queueing its reply.",
	    F(sync_latency) },
	{ HISTOGRAM, "allotd_store_commit_seconds",
	    "Duration of each store group commit.", F(store_commit) },
	{ COUNTER, "allotd_store_commit_failures_total",
	    "Store group commits that failed (the batch is retried).",
	    F(store_commit_failures) },
	{ GAUGE, "allotd_peers_tracked",
	    "Peers in the flood-control table (--peer-table).",
	    F(peers_tracked) },
	{ COUNTER, "allotd_peer_overflow_total",
	    "Messages charged to the shared overflow budget because the "
	    "flood-control table was full of busy peers.",
	    F(peer_overflow) },
	{ GAUGE, "allotd_peer_connections",
	    "Registered connections charged to their service's budget "
	    "(--peer-connections).",
	    F(peer_connections) },
	{ COUNTER, "allotd_peer_bind_refused_total",
	    "Registers whose connection stayed on its address's message "
	    "budget: the address had --peer-connections of them, or the "
	    "table was full.",
	    F(peer_bind_refused) },
	{ COUNTER, "allotd_http_connections_total",
	    "Connections accepted by the HTTP listener.",
	    F(http_connections) },
	{ COUNTER, "allotd_http_refused_total",
	    "HTTP connections refused at a cap (--http-max-connections, "
	    "--http-max-per-address).",
	    F(http_refused) },
	{ GAUGE, "allotd_store_pending_rows",
	    "Rows queued for the next group commit.", F(store_pending) },
	{ COUNTER, "allotd_store_rows_written_total",
	    "Rows committed to the store.", F(store_rows_written) },
	{ COUNTER, "allotd_store_rows_dropped_total",
	    "Usage rows dropped because the queue was full.",
	    F(store_rows_dropped) },
#undef F
};

void
allot__metrics_render(const allot__metrics *m, allot__buf *b)
{
	for (size_t i = 0; i < sizeof series / sizeof series[0]; i++) {
		const struct series *x = &series[i];
		const char *field = (const char *) m + x->off;
		switch (x->kind) {
		case COUNTER:
		case GAUGE:
			simple(b, x->kind == COUNTER ? "counter" : "gauge",
			    x->name, x->help,
			    ld((const _Atomic uint64_t *) (const void *)
			            field));
			break;
		case HISTOGRAM:
			histogram(b, x->name, x->help,
			    (const allot__hist *) (const void *) field);
			break;
		case CUSTOM: x->fn(m, b); break;
		}
	}
}
