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

/* A label value with '\\', '"' and newlines escaped. */
static void
label(char *out, size_t len, const char *s)
{
	size_t j = 0;
	for (; *s != '\0' && j + 3 < len; s++) {
		if (*s == '\\' || *s == '"') {
			out[j++] = '\\';
			out[j++] = *s;
		} else if (*s == '\n') {
			out[j++] = '\\';
			out[j++] = 'n';
		} else {
			out[j++] = *s;
		}
	}
	out[j] = '\0';
}

static bool
per_key(FILE *f, allot_agent *agent)
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
	static const char *const names[] = { "admitted_total", "denied_total",
		"shadow_denied_total", "tokens_spent_total", "allowance_rate",
		"allowance_burst", "utilization", "fallback",
		"lease_remaining_seconds", "granted_rate", "granted_burst" };
	for (size_t m = 0; m < sizeof names / sizeof names[0]; m++) {
		fprintf(f, "# TYPE allot_agentd_key_%s %s\n", names[m],
		    m < 4 ? "counter" : "gauge");
		for (size_t i = 0; i < n; i++) {
			char id[2 * ALLOT_IDENTITY_MAX + 2], ep[130];
			char q[2 * ALLOT_IDENTITY_MAX + 2];
			label(id, sizeof id, ks[i].identity);
			label(q, sizeof q, ks[i].quota);
			label(ep, sizeof ep, ks[i].endpoint);
			double v[] = { (double) ks[i].allowed,
				(double) ks[i].denied,
				(double) ks[i].shadow_denied,
				(double) ks[i].tokens_spent, ks[i].rate,
				ks[i].limit, ks[i].utilization,
				ks[i].in_fallback ? 1.0 : 0.0,
				(double) ks[i].lease_remaining_ms / 1000.0,
				ks[i].granted_rate, ks[i].granted_burst };
			fprintf(f,
			    "allot_agentd_key_%s{identity=\"%s\","
			    "endpoint=\"%s\",quota=\"%s\"} %.17g\n",
			    names[m], id, ep, q, v[m]);
		}
	}
	free(ks);
	return true;
}

static void
sync_state(FILE *f, allot_agent *agent)
{
	allot_sync_stats s;
	if (allot_sync_stats_get(agent, &s) != ALLOT_OK)
		return;
	fprintf(f,
	    "# TYPE allot_agentd_sync_enabled gauge\n"
	    "allot_agentd_sync_enabled %d\n"
	    "# TYPE allot_agentd_sync_connected gauge\n"
	    "allot_agentd_sync_connected %d\n"
	    "# TYPE allot_agentd_fallback gauge\n"
	    "allot_agentd_fallback %d\n"
	    "# TYPE allot_agentd_lease_remaining_seconds gauge\n"
	    "allot_agentd_lease_remaining_seconds %.3f\n"
	    "# TYPE allot_agentd_replicas gauge\n"
	    "allot_agentd_replicas %" PRIu32 "\n"
	    "# TYPE allot_agentd_syncs_ok_total counter\n"
	    "allot_agentd_syncs_ok_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_syncs_failed_total counter\n"
	    "allot_agentd_syncs_failed_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_fallback_enters_total counter\n"
	    "allot_agentd_fallback_enters_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_early_syncs_total counter\n"
	    "allot_agentd_early_syncs_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_loan_tokens_total counter\n"
	    "allot_agentd_loan_tokens_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_debit_tokens_total counter\n"
	    "allot_agentd_debit_tokens_total %" PRIu64 "\n",
	    s.enabled, s.connected, s.in_fallback,
	    (double) s.lease_remaining_ms / 1000.0, s.replicas, s.syncs_ok,
	    s.syncs_failed, s.fallback_enters, s.early_syncs, s.loan_tokens,
	    s.debit_tokens);
	/* The tail path (docs/integrating.md, "The tail path"). */
	fprintf(f,
	    "# TYPE allot_agentd_central_asks_total counter\n"
	    "allot_agentd_central_asks_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_central_allowed_total counter\n"
	    "allot_agentd_central_allowed_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_central_denied_total counter\n"
	    "allot_agentd_central_denied_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_central_late_total counter\n"
	    "allot_agentd_central_late_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_central_short_total counter\n"
	    "allot_agentd_central_short_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_central_dry_total counter\n"
	    "allot_agentd_central_dry_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_central_lost_total counter\n"
	    "allot_agentd_central_lost_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_central_standby_total counter\n"
	    "allot_agentd_central_standby_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_central_tokens_total counter\n"
	    "allot_agentd_central_tokens_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_central_wait_seconds_total counter\n"
	    "allot_agentd_central_wait_seconds_total %.6f\n",
	    s.central_asks, s.central_allowed, s.central_denied,
	    s.central_late, s.central_short, s.central_dry, s.central_lost,
	    s.central_standby, s.central_tokens,
	    (double) s.central_wait_ns / 1e9);
	/* The coordinator cluster as this agent sees it, and the config
	 * plane (docs/operations.md "Cluster", docs/protocol.md). */
	fprintf(f,
	    "# TYPE allot_agentd_members gauge\n"
	    "allot_agentd_members %" PRIu32 "\n"
	    "# TYPE allot_agentd_leader_epoch gauge\n"
	    "allot_agentd_leader_epoch %" PRIu64 "\n"
	    "# TYPE allot_agentd_leader_switches_total counter\n"
	    "allot_agentd_leader_switches_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_not_leader_total counter\n"
	    "allot_agentd_not_leader_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_stale_epoch_total counter\n"
	    "allot_agentd_stale_epoch_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_config_installs_total counter\n"
	    "allot_agentd_config_installs_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_config_rejects_total counter\n"
	    "allot_agentd_config_rejects_total %" PRIu64 "\n",
	    s.members, s.leader_epoch, s.leader_switches, s.not_leader,
	    s.stale_epoch, s.config_installs, s.config_rejects);
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
	bool ok = per_key(f, d->agent);
	sync_state(f, d->agent);
	const struct agentd_counters *n = &d->n;
	fprintf(f,
	    "# HELP allot_agentd_build_info allot-agentd version.\n"
	    "# TYPE allot_agentd_build_info gauge\n"
	    "allot_agentd_build_info{version=\"%s\"} 1\n"
	    "# TYPE allot_agentd_grpc_calls_total counter\n"
	    "allot_agentd_grpc_calls_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_grpc_errors_total counter\n"
	    "allot_agentd_grpc_errors_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_grpc_connections_total counter\n"
	    "allot_agentd_grpc_connections_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_grpc_refused_connections_total counter\n"
	    "allot_agentd_grpc_refused_connections_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_grpc_evicted_connections_total counter\n"
	    "allot_agentd_grpc_evicted_connections_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_grpc_accept_pauses_total counter\n"
	    "allot_agentd_grpc_accept_pauses_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_http_calls_total counter\n"
	    "allot_agentd_http_calls_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_http_errors_total counter\n"
	    "allot_agentd_http_errors_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_cert_reloads_total counter\n"
	    "allot_agentd_cert_reloads_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_cert_reload_errors_total counter\n"
	    "allot_agentd_cert_reload_errors_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_coordinator_cert_reloads_total counter\n"
	    "allot_agentd_coordinator_cert_reloads_total %" PRIu64 "\n"
	    "# TYPE allot_agentd_coordinator_cert_reload_errors_total "
	    "counter\n"
	    "allot_agentd_coordinator_cert_reload_errors_total %" PRIu64 "\n",
	    ALLOT_VERSION_STRING, (uint64_t) n->grpc_calls,
	    (uint64_t) n->grpc_errors, (uint64_t) n->grpc_conns,
	    (uint64_t) n->grpc_refused_conns, (uint64_t) n->grpc_evicted_conns,
	    (uint64_t) n->grpc_accept_pauses, (uint64_t) n->http_calls,
	    (uint64_t) n->http_errors, (uint64_t) n->cert_reloads,
	    (uint64_t) n->cert_reload_errors, (uint64_t) n->coord_cert_reloads,
	    (uint64_t) n->coord_cert_reload_errors);
	tokens(f, d->map.jwt);
	ok = !ferror(f) && ok;
	if (fclose(f) != 0 || !ok) {
		free(text);
		return NULL;
	}
	*ret_len = len;
	return text;
}
