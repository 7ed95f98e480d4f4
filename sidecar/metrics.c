/* SPDX-License-Identifier: MIT */
/*
 * allot-agentd's /metrics, Prometheus text: per key (caller identity,
 * endpoint class) what liballot counted (admitted, denied, shadow-denied,
 * the allowance it holds as rate and burst, how drained it is), the sync
 * loop's state (connected, in fallback, the lease left, replicas), so
 * that an operator sees from outside whether this replica runs on its
 * coordinator's allowance or in fallback, and the daemon's own counters.
 * Everything comes from liballot's public stats API: per key also its
 * fallback state, the lease left on its allowance and the coordinator's
 * last grant (allot_key_stats), and the agent-wide sync state besides.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentd.h"
#include "procstat.h"

/* Room for a label value of `n` bytes: each may take five. */
#define LABEL_ROOM(n) (5 * (n) + 1)

/* A label value with '\\', '"' and newlines escaped, and every other
 * byte outside printable ASCII written as the text \xNN (an escaped
 * backslash, then its hex): unknown identities are any string a caller
 * sends, and one invalid UTF-8 byte in a label makes the whole scrape
 * invalid (common/name.h: names allot keeps are printable ASCII). */
static void
label(char *out, size_t len, const char *s)
{
	static const char hex[] = "0123456789abcdef";
	size_t j = 0;
	for (; *s != '\0' && j + 6 <= len; s++) {
		unsigned char c = (unsigned char) *s;
		if (c == '\\' || c == '"') {
			out[j++] = '\\';
			out[j++] = (char) c;
		} else if (c == '\n') {
			out[j++] = '\\';
			out[j++] = 'n';
		} else if (c < 0x20 || c > 0x7e) {
			out[j++] = '\\';
			out[j++] = '\\';
			out[j++] = 'x';
			out[j++] = hex[c >> 4];
			out[j++] = hex[c & 15];
		} else {
			out[j++] = (char) c;
		}
	}
	out[j] = '\0';
}

/* One agent-wide series: its name, type, help, and its value, an
 * integer (`u`) or not (`d`, when `real`). */
struct series {
	const char *name;
	const char *type;
	const char *help;
	bool real;
	uint64_t u;
	double d;
};

#define COUNTER(n, h, v)                                       \
	{                                                      \
		"allot_agentd_" n, "counter", h, false, (v), 0 \
	}
#define GAUGE(n, h, v)                                       \
	{                                                    \
		"allot_agentd_" n, "gauge", h, false, (v), 0 \
	}
#define GAUGE_REAL(n, h, v)                                 \
	{                                                   \
		"allot_agentd_" n, "gauge", h, true, 0, (v) \
	}

static void
emit(FILE *f, const struct series *rows, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const struct series *r = &rows[i];
		fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", r->name, r->help,
		    r->name, r->type);
		if (r->real)
			fprintf(f, "%s %.15g\n", r->name, r->d);
		else
			fprintf(f, "%s %" PRIu64 "\n", r->name, r->u);
	}
}

/* The per-key families: name, type, help, and the name of 0.1 of
 * those renamed in 0.2 (--legacy-metric-names), else NULL. */
static const struct {
	const char *name, *type, *help, *legacy;
} key_families[] = {
	{ "admitted_total", "counter", "Requests the key admitted.", NULL },
	{ "denied_total", "counter", "Requests the key denied.", NULL },
	{ "shadow_denied_total", "counter",
	    "Requests a shadow quota admitted that enforcing would deny.",
	    NULL },
	{ "tokens_spent_total", "counter",
	    "Tokens the key spent, settlements included.", NULL },
	{ "allowance_tokens_per_second", "gauge",
	    "The rate the key's bucket runs at now, tokens/s.",
	    "allowance_rate" },
	{ "allowance_burst_tokens", "gauge",
	    "The burst the key's bucket holds at most, tokens.",
	    "allowance_burst" },
	{ "utilization_ratio", "gauge",
	    "How drained the key's bucket is, from 0 (full) to 1 (empty).",
	    "utilization" },
	{ "fallback", "gauge",
	    "1 while the key's lease has run out and its fallback is in "
	    "force.",
	    NULL },
	{ "lease_remaining_seconds", "gauge",
	    "Time left on the key's lease; negative once expired.", NULL },
	{ "granted_tokens_per_second", "gauge",
	    "The coordinator's last grant of rate to the key, tokens/s.",
	    "granted_rate" },
	{ "granted_burst_tokens", "gauge",
	    "The coordinator's last grant of burst to the key, tokens.",
	    "granted_burst" },
};

/* The label value of the identities no quota names, folded into one
 * series per endpoint and quota (--metrics-unknown fold). */
#define UNKNOWN_LABEL "(unknown)"

/* The keys of identities the quota file does not name summed into one
 * per endpoint and quota (the counters added; the allowance is the one
 * bucket they share), after the configured callers' keys: the series are
 * then (configured identities + 1) x endpoint classes, whatever callers
 * send. Each unknown key is matched against the folded ones only (a few:
 * one per endpoint class), never against the configured keys. Returns
 * the keys left in ks, or 0 when out of memory (nothing is then shown,
 * as when allot_stats fails). */
static size_t
fold_unknown(allot_key_stats *ks, size_t n)
{
	allot_key_stats *fold = malloc(n * sizeof *fold);
	if (fold == NULL)
		return 0;
	size_t out = 0, nf = 0;
	for (size_t i = 0; i < n; i++) {
		if (ks[i].known) {
			ks[out++] = ks[i];
			continue;
		}
		size_t j = 0;
		while (j < nf &&
		    (strcmp(fold[j].endpoint, ks[i].endpoint) != 0 ||
		        strcmp(fold[j].quota, ks[i].quota) != 0))
			j++;
		if (j == nf) {
			fold[nf] = ks[i];
			snprintf(fold[nf].identity, sizeof fold[nf].identity,
			    "%s", UNKNOWN_LABEL);
			nf++;
			continue;
		}
		fold[j].allowed += ks[i].allowed;
		fold[j].denied += ks[i].denied;
		fold[j].shadow_denied += ks[i].shadow_denied;
		fold[j].tokens_spent += ks[i].tokens_spent;
	}
	memcpy(ks + out, fold, nf * sizeof *fold);
	free(fold);
	return out + nf;
}

/* Family `m` of the per-key series, under `name`, for keys ks[0..n). */
static void
key_family(FILE *f, size_t m, const char *name, const char *help,
    const allot_key_stats *ks, size_t n)
{
	fprintf(f,
	    "# HELP allot_agentd_key_%s %s\n"
	    "# TYPE allot_agentd_key_%s %s\n",
	    name, help, name, key_families[m].type);
	for (size_t i = 0; i < n; i++) {
		char id[LABEL_ROOM(ALLOT_IDENTITY_MAX)];
		char q[LABEL_ROOM(ALLOT_IDENTITY_MAX)];
		char ep[LABEL_ROOM(64)];
		label(id, sizeof id, ks[i].identity);
		label(q, sizeof q, ks[i].quota);
		label(ep, sizeof ep, ks[i].endpoint);
		double v[] = { (double) ks[i].allowed, (double) ks[i].denied,
			(double) ks[i].shadow_denied,
			(double) ks[i].tokens_spent, ks[i].rate, ks[i].limit,
			ks[i].utilization, ks[i].in_fallback ? 1.0 : 0.0,
			(double) ks[i].lease_remaining_ms / 1000.0,
			ks[i].granted_rate, ks[i].granted_burst };
		fprintf(f,
		    "allot_agentd_key_%s{identity=\"%s\","
		    "endpoint=\"%s\",quota=\"%s\"} %.17g\n",
		    name, id, ep, q, v[m]);
	}
}

static bool
per_key(FILE *f, allot_agent *agent, bool fold, bool legacy)
{
	size_t n = 0, cap = 64;
	allot_key_stats *ks = NULL;
	for (;;) {
		allot_key_stats *p = realloc(ks, cap * sizeof *ks);
		if (p == NULL) {
			free(ks);
			return false;
		}
		ks = p;
		if (allot_stats(agent, ks, cap, &n) != ALLOT_OK)
			n = 0;
		if (n <= cap)
			break;
		cap = n;
	}
	if (fold)
		n = fold_unknown(ks, n);
	for (size_t m = 0; m < sizeof key_families / sizeof key_families[0];
	     m++) {
		key_family(
		    f, m, key_families[m].name, key_families[m].help, ks, n);
		if (legacy && key_families[m].legacy != NULL) {
			char help[128];
			snprintf(help, sizeof help,
			    "Deprecated: the name of allot_agentd_key_%s in "
			    "0.1, removed in 0.3.",
			    key_families[m].name);
			key_family(f, m, key_families[m].legacy, help, ks, n);
		}
	}
	free(ks);
	return true;
}

/* The sync loop, the tail path (docs/integrating.md, "The tail path"),
 * the coordinator cluster as this agent sees it and the config plane
 * (docs/operations.md "Cluster", docs/protocol.md). */
static void
sync_state(FILE *f, allot_agent *agent)
{
	allot_sync_stats s;
	if (allot_sync_stats_get(agent, &s) != ALLOT_OK)
		return;
	const struct series rows[] = {
		GAUGE("sync_enabled", "1 when the agent syncs with allotd.",
		    s.enabled),
		GAUGE("sync_connected",
		    "1 while the last exchange with allotd succeeded.",
		    s.connected),
		GAUGE("fallback",
		    "1 while a lease has expired and the fallback policy is "
		    "in "
		    "force.",
		    s.in_fallback),
		GAUGE_REAL("lease_remaining_seconds",
		    "Time left on the session's lease; negative once expired.",
		    (double) s.lease_remaining_ms / 1000.0),
		GAUGE("replicas",
		    "Replicas of the service allotd last counted.",
		    s.replicas),
		COUNTER("syncs_ok_total", "Exchanges with allotd answered.",
		    s.syncs_ok),
		COUNTER("syncs_failed_total", "Exchanges with allotd failed.",
		    s.syncs_failed),
		COUNTER("fallback_enters_total",
		    "Times a lease ran out and the fallback took over.",
		    s.fallback_enters),
		COUNTER("early_syncs_total",
		    "Syncs sent before the interval because a key started "
		    "denying.",
		    s.early_syncs),
		COUNTER("loan_tokens_total",
		    "Tokens allotd lent this agent's buckets.", s.loan_tokens),
		COUNTER("debit_tokens_total",
		    "Tokens allotd took from this agent's buckets for others' "
		    "loans.",
		    s.debit_tokens),
		COUNTER("central_asks_total",
		    "Asks to the central reserve answered.", s.central_asks),
		COUNTER("central_allowed_total",
		    "Requests admitted from the central reserve.",
		    s.central_allowed),
		COUNTER("central_denied_total",
		    "Requests that waited for the central reserve and were "
		    "denied.",
		    s.central_denied),
		COUNTER("central_late_total",
		    "Requests whose answer came after their wait.",
		    s.central_late),
		COUNTER("central_short_total",
		    "Requests the reserve's grant did not cover.",
		    s.central_short),
		COUNTER("central_dry_total",
		    "Requests denied without asking: the reserve was empty, "
		    "or "
		    "no session.",
		    s.central_dry),
		COUNTER("central_lost_total",
		    "Asks that timed out and were asked "
		    "again.",
		    s.central_lost),
		COUNTER("central_standby_total",
		    "Requests admitted on the standby while no coordinator "
		    "could be asked.",
		    s.central_standby),
		COUNTER("central_tokens_total",
		    "Tokens the central reserve granted.", s.central_tokens),
		{ "allot_agentd_central_wait_seconds_total", "counter",
		    "Time requests spent waiting for the central reserve.",
		    true, 0, (double) s.central_wait_ns / 1e9 },
		GAUGE("members", "Coordinator members this agent knows of.",
		    s.members),
		GAUGE("leader_epoch", "The highest leader epoch seen.",
		    s.leader_epoch),
		COUNTER("leader_switches_total",
		    "Times the agent moved to another leader.",
		    s.leader_switches),
		COUNTER("not_leader_total",
		    "Answers from a member that was not the leader.",
		    s.not_leader),
		COUNTER("stale_epoch_total",
		    "Answers of a deposed leader dropped.", s.stale_epoch),
		COUNTER("config_installs_total",
		    "Quota configs from allotd installed.", s.config_installs),
		COUNTER("config_rejects_total",
		    "Quota configs from allotd refused.", s.config_rejects),
	};
	emit(f, rows, sizeof rows / sizeof rows[0]);
}

/* The daemon's own counters. */
static void
daemon_counters(FILE *f, const struct agentd_counters *n)
{
	const struct series rows[] = {
		COUNTER(
		    "grpc_calls_total", "RLS calls answered.", n->grpc_calls),
		COUNTER(
		    "grpc_errors_total", "RLS calls failed.", n->grpc_errors),
		COUNTER("grpc_connections_total", "gRPC connections accepted.",
		    n->grpc_conns),
		COUNTER("grpc_refused_connections_total",
		    "gRPC connections refused at a bound.",
		    n->grpc_refused_conns),
		COUNTER("grpc_evicted_connections_total",
		    "Idle gRPC connections closed to make room.",
		    n->grpc_evicted_conns),
		COUNTER("grpc_accept_pauses_total",
		    "Listener pauses while out of descriptors.",
		    n->grpc_accept_pauses),
		COUNTER("http_calls_total", "HTTP API calls.", n->http_calls),
		COUNTER("http_refused_connections_total",
		    "HTTP connections closed at once: the listener full, none "
		    "idle.",
		    n->http_refused_conns),
		COUNTER("http_evicted_connections_total",
		    "Idle HTTP connections closed to make room.",
		    n->http_evicted_conns),
		COUNTER("http_errors_total",
		    "HTTP API calls answered with an "
		    "error.",
		    n->http_errors),
		COUNTER("cert_reloads_total",
		    "The gRPC listener's certificate reloaded.",
		    n->cert_reloads),
		COUNTER("cert_reload_errors_total",
		    "The gRPC listener's certificate failed to reload.",
		    n->cert_reload_errors),
		COUNTER("coordinator_cert_reloads_total",
		    "The certificate for allotd reloaded.",
		    n->coord_cert_reloads),
		COUNTER("coordinator_cert_reload_errors_total",
		    "The certificate for allotd failed to reload.",
		    n->coord_cert_reload_errors),
	};
	fprintf(f,
	    "# HELP allot_agentd_build_info allot-agentd version.\n"
	    "# TYPE allot_agentd_build_info gauge\n"
	    "allot_agentd_build_info{version=\"%s\"} 1\n",
	    ALLOT_VERSION_STRING);
	char proc[4096];
	allot__procstat_text(proc, sizeof proc);
	fputs(proc, f);
	emit(f, rows, sizeof rows / sizeof rows[0]);
}

/* Token checks by outcome (--jwt-issuer), and the key file's reloads. */
static void
tokens(FILE *f, allot_jwt_verifier *v)
{
	if (v == NULL)
		return;
	allot_jwt_stats st;
	allot_jwt_verifier_stats(v, &st);
	fprintf(f,
	    "# HELP allot_agentd_tokens_total Signed tokens checked, by "
	    "outcome.\n"
	    "# TYPE allot_agentd_tokens_total counter\n");
	for (int i = 0; i < ALLOT_JWT_NSTATUS; i++)
		fprintf(f,
		    "allot_agentd_tokens_total{result=\"%s\"} %" PRIu64 "\n",
		    allot_jwt_status_name((allot_jwt_status) i),
		    st.by_status[i]);
	fprintf(f,
	    "# HELP allot_agentd_token_key_reloads_total JWKS files re-read "
	    "after a change, by result.\n"
	    "# TYPE allot_agentd_token_key_reloads_total counter\n"
	    "allot_agentd_token_key_reloads_total{result=\"ok\"} %" PRIu64 "\n"
	    "allot_agentd_token_key_reloads_total{result=\"fail\"} %" PRIu64
	    "\n"
	    "# HELP allot_agentd_token_cache_hits_total Tokens answered from "
	    "those remembered once verified.\n"
	    "# TYPE allot_agentd_token_cache_hits_total counter\n"
	    "allot_agentd_token_cache_hits_total %" PRIu64 "\n",
	    st.reloads, st.reload_failures, st.cache_hits);
}

char *
agentd_metrics(struct agentd *d, size_t *ret_len)
{
	/* A memory stream grows as the text does. */
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (f == NULL)
		return NULL;
	bool ok = per_key(
	    f, d->agent, !d->o.metrics_each_unknown, d->o.legacy_metric_names);
	sync_state(f, d->agent);
	daemon_counters(f, &d->n);
	tokens(f, d->map.jwt);
	ok = !ferror(f) && ok;
	if (fclose(f) != 0 || !ok) {
		free(text);
		return NULL;
	}
	*ret_len = len;
	return text;
}
