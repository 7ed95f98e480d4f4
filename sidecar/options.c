/* SPDX-License-Identifier: MIT */
/*
 * allot-agentd's options: one table names every option, its type and
 * bounds, and serves both the command line (--name VALUE) and the
 * options file (--options FILE: a YAML mapping, common/opts.h), so that
 * every option, liballot's agent options included, is both a flag and a
 * config key; a few are environment variables too (ALLOT_COORDINATOR,
 * ALLOT_SERVICE, ALLOT_REPLICA_ID: what a container sets). The file is
 * read first, then the environment, and the command line wins. The parser is
 * common/opts.h, the one piece of allot beyond the public headers this daemon
 * uses.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>

#include "agentd.h"
#include "logfmt.h"
#include "opts.h"

#define AT(f) offsetof(struct agentd_options, f)

static int
set_metrics_unknown(const allot__opt_use *u, void *dst)
{
	struct agentd_options *o = dst;
	if (strcmp(u->arg, "fold") != 0 && strcmp(u->arg, "each") != 0)
		return allot__opts_fail(
		    u, "%s expects fold or each, not \"%s\"", u->as, u->arg);
	o->metrics_each_unknown = strcmp(u->arg, "each") == 0;
	return ALLOT__OPTS_OK;
}

static int
set_log_format(const allot__opt_use *u, void *dst)
{
	struct agentd_options *o = dst;
	allot__logfmt f;
	if (allot__logfmt_parse(u->arg, &f) != 0)
		return allot__opts_fail(u,
		    "%s expects text, json, journal or auto, not \"%s\"",
		    u->as, u->arg);
	o->log_format = (int) f;
	return ALLOT__OPTS_OK;
}

static int
show_version(const allot__opt_use *u, void *dst)
{
	printf(AGENTD_PROG " %s\n", ALLOT_VERSION_STRING);
	return ALLOT__OPTS_DONE;
}

static const allot__opt rows[] = {
	{ "config", 0, ALLOT__OPT_STR, "FILE", "quota file (YAML; required)",
	    .off = AT(config) },
	{ "options", 0, ALLOT__OPT_CALL, "FILE",
	    "further options, a YAML mapping (\"service: orders\"); the "
	    "environment and the command line win over it",
	    .set = allot__opts_skip, .cli_only = true },
	{ "grpc-listen", 0, ALLOT__OPT_STR, "HOST:PORT",
	    "Envoy RLS over gRPC; \"none\" disables", .off = AT(grpc_listen),
	    .dflt = "127.0.0.1:8081" },
	{ "http-listen", 0, ALLOT__OPT_STR, "HOST:PORT",
	    "JSON API and /metrics; \"none\" disables", .off = AT(http_listen),
	    .dflt = "127.0.0.1:8082" },
	{ "http-socket", 0, ALLOT__OPT_STR, "PATH",
	    "the same on a Unix socket", .off = AT(http_socket),
	    .dflt = "none" },
	{ "metrics-unknown", 0, ALLOT__OPT_CALL, "fold|each",
	    "/metrics: the identities the quota file does not name summed "
	    "into one identity=\"(unknown)\" per endpoint (fold), or a "
	    "series each, as many as --max-unknown-keys (each)",
	    .set = set_metrics_unknown, .dflt = "fold" },
	{ "legacy-metric-names", 0, ALLOT__OPT_TRUE, NULL,
	    "/metrics: also the per-key gauges renamed in 0.2 under their "
	    "names of 0.1 (allot_agentd_key_allowance_rate, ...), until 0.3 "
	    "(docs/operations.md, \"Metric names\")",
	    .off = AT(legacy_metric_names) },
	{ "metrics-listen", 0, ALLOT__OPT_STR, "HOST:PORT",
	    "/metrics, /healthz and /readyz alone, for a scraper or a probe "
	    "that must not reach the decision API; \"none\" disables",
	    .off = AT(metrics_listen), .dflt = "none" },
	{ "tls-cert", 0, ALLOT__OPT_STR, "FILE",
	    "gRPC over TLS: the certificate and its private key in one PEM "
	    "file (as allotd's --tls-cert), or the certificate alone with "
	    "--tls-key; reloaded when it changes",
	    .off = AT(tls_cert) },
	{ "tls-key", 0, ALLOT__OPT_STR, "FILE",
	    "the private key (PEM), when not in --tls-cert's file",
	    .off = AT(tls_key) },
	{ "cert-check-ms", 0, ALLOT__OPT_U32, "MS",
	    "how often the certificate files are checked",
	    .off = AT(cert_check_ms), .min = 100, .max = 3600000,
	    .dflt = "1000" },
	{ "domain", 0, ALLOT__OPT_STR, "NAME", "accept only this RLS domain",
	    .off = AT(domain), .dflt = "any" },
	{ "identity-keys", 0, ALLOT__OPT_STR, "KEYS",
	    "descriptor entry keys naming the caller, comma separated, first "
	    "match wins",
	    .off = AT(identity_keys), .dflt = "caller" },
	{ "endpoint-keys", 0, ALLOT__OPT_STR, "KEYS",
	    "entry keys naming the endpoint class", .off = AT(endpoint_keys),
	    .dflt = "endpoint,path" },
	{ "unknown", 0, ALLOT__OPT_STR, "default|allow|reject",
	    "a descriptor without an identity entry: default (the shared "
	    "default bucket; the default), allow (OK, uncharged) or reject",
	    .off = AT(unknown) },
	{ "descriptor-limits", 0, ALLOT__OPT_STR, "ignore|cap",
	    "a descriptor's own limit (from a proxy you trust): ignored, or "
	    "a cap charged on top of its quota on this sidecar",
	    .off = AT(descriptor_limits), .dflt = "ignore" },
	{ "max-descriptor-limits", 0, ALLOT__OPT_U32, "N",
	    "limits the cap table holds (caller, endpoint, limit), the "
	    "longest unused making room",
	    .off = AT(max_descriptor_limits), .min = 16, .max = 1000000,
	    .dflt = "4096" },
	{ "token-keys", 0, ALLOT__OPT_STR, "KEYS",
	    "entry keys carrying a signed token (\"Bearer T\" or T) that "
	    "names the caller, checked with --jwt-issuer and --jwks",
	    .off = AT(token_keys), .dflt = "token" },
	{ "jwt-issuer", 0, ALLOT__OPT_STR, "ISS",
	    "accept tokens of this issuer (\"iss\"); the caller is their "
	    "\"sub\"",
	    .off = AT(jwt_issuer) },
	{ "jwks", 0, ALLOT__OPT_STR, "FILE",
	    "the issuer's public keys, a JWKS file re-read when it changes",
	    .off = AT(jwks) },
	{ "jwt-audience", 0, ALLOT__OPT_STR, "AUD",
	    "the \"aud\" tokens must name", .off = AT(jwt_audience),
	    .dflt = "the --service name" },
	{ "jwt-leeway-s", 0, ALLOT__OPT_U32, "S",
	    "clock skew allowed on a token's expiry", .off = AT(jwt_leeway_s),
	    .min = 0, .max = ALLOT_JWT_LEEWAY_MAX, .dflt = "30" },
	{ "grpc-threads", 0, ALLOT__OPT_U32, "N", "gRPC I/O threads",
	    .off = AT(grpc_threads), .min = 1, .max = 64, .dflt = "2" },
	{ "max-connections", 0, ALLOT__OPT_U32, "N",
	    "connections at once, per listener", .off = AT(max_connections),
	    .min = 1, .max = 1000000, .dflt = "1024" },
	{ "max-streams", 0, ALLOT__OPT_U32, "N",
	    "concurrent streams per gRPC connection", .off = AT(max_streams),
	    .min = 1, .max = 65536, .dflt = "128" },
	{ "max-message", 0, ALLOT__OPT_U32, "BYTES",
	    "largest gRPC request message", .off = AT(max_message), .min = 64,
	    .max = 16777216, .dflt = "16384" },
	{ "max-descriptors", 0, ALLOT__OPT_U32, "N", "descriptors per request",
	    .off = AT(max_descriptors), .min = 1, .max = 4096, .dflt = "16" },
	{ "max-entries", 0, ALLOT__OPT_U32, "N", "entries per descriptor",
	    .off = AT(max_entries), .min = 1, .max = 4096, .dflt = "16" },
	{ "idle-timeout", 0, ALLOT__OPT_U32, "S", NULL,
	    .off = AT(idle_timeout_s), .min = 1, .max = 86400 },
	{ "idle-timeout-s", 0, ALLOT__OPT_U32, "S",
	    "close idle connections after (--idle-timeout, as allotd's; "
	    "--idle-timeout-s, the older name, stays)",
	    .off = AT(idle_timeout_s), .min = 1, .max = 86400, .dflt = "300" },
	{ "wait-ms", 0, ALLOT__OPT_U32, "MS",
	    "how long a request its local bucket is short of waits for the "
	    "coordinator's central reserve (the tail path); 0 decides locally",
	    .off = AT(wait_ms), .min = 0, .max = 1000, .dflt = "20" },
	{ "log-level", 0, ALLOT__OPT_LEVEL, "LEVEL",
	    "error, warning, info, debug or 0-7", .off = AT(log_level),
	    .dflt = "info" },
	{ "log-format", 0, ALLOT__OPT_CALL, "FORMAT",
	    "text, json (one object a line: ts, level, program, id, msg), "
	    "journal (text with the syslog priority prefix journald reads) "
	    "or auto (journal when stderr is the journal, else text)",
	    .set = set_log_format, .dflt = "auto" },
	{ "coordinator", 0, ALLOT__OPT_STR, "URLS",
	    "allotd address(es), comma separated",
	    .off = AT(agent.coordinator), .dflt = "local-only",
	    .env = "ALLOT_COORDINATOR" },
	{ "coordinator-ca", 0, ALLOT__OPT_STR, "FILE",
	    "tls+tcp://: the CA of allotd's certificate",
	    .off = AT(agent.tls_ca_file) },
	{ "coordinator-cert-key", 0, ALLOT__OPT_STR, "FILE",
	    "tls+tcp://: this agent's certificate and key, one PEM file",
	    .off = AT(agent.tls_cert_key_file) },
	{ "coordinator-server-name", 0, ALLOT__OPT_STR, "NAME",
	    "tls+tcp://: the name allotd's certificate must carry",
	    .off = AT(agent.tls_server_name) },
	{ "service", 0, ALLOT__OPT_STR, "NAME", "protected service's name",
	    .off = AT(agent.service), .dflt = "sidecar",
	    .env = "ALLOT_SERVICE" },
	{ "replica-id", 0, ALLOT__OPT_STR, "ID", "this replica's name",
	    .off = AT(agent.replica_id), .dflt = "<hostname>-<pid>",
	    .env = "ALLOT_REPLICA_ID" },
	{ "sync-interval-ms", 0, ALLOT__OPT_U32, "MS", "sync interval T",
	    .off = AT(agent.sync_interval_ms), .min = 1, .max = 3600000,
	    .dflt = "100" },
	{ "sync-jitter", 0, ALLOT__OPT_DOUBLE, "F",
	    "jitter, a fraction of T from 0 to 0.5",
	    .off = AT(agent.sync_jitter), .lo = 0, .hi = 0.5, .dflt = "0.1" },
	{ "initial-replicas", 0, ALLOT__OPT_U32, "N",
	    "replicas assumed before allotd answers",
	    .off = AT(agent.initial_replicas), .min = 1, .max = 1000000,
	    .dflt = "1" },
	{ "reconnect-min-ms", 0, ALLOT__OPT_U32, "MS",
	    "reconnect backoff, lower bound",
	    .off = AT(agent.reconnect_min_ms), .min = 1, .max = 3600000,
	    .dflt = "T" },
	{ "reconnect-max-ms", 0, ALLOT__OPT_U32, "MS",
	    "reconnect backoff, upper bound",
	    .off = AT(agent.reconnect_max_ms), .min = 1, .max = 3600000,
	    .dflt = "5000" },
	{ "max-unknown-keys", 0, ALLOT__OPT_U32, "N",
	    "keys for unknown identities", .off = AT(agent.max_unknown_keys),
	    .min = 1, .max = 1u << 24, .dflt = "4096" },
	{ "idle-evict-ms", 0, ALLOT__OPT_U32, "MS",
	    "evict idle unknown keys after; 0 never",
	    .off = AT(agent.idle_evict_ms), .min = 0, .max = 86400000,
	    .dflt = "300000" },
	{ "max-threads", 0, ALLOT__OPT_U32, "N",
	    "threads counting in blocks of their own",
	    .off = AT(agent.max_threads), .min = 1, .max = 65536,
	    .dflt = "64" },
	{ "max-callers", 0, ALLOT__OPT_U32, "N",
	    "callers' quotas room is kept for, across configs allotd sends",
	    .off = AT(agent.max_callers), .min = 1, .max = 65536,
	    .dflt = "max(2n, n + 256) for n in --config" },
	{ "config-cache", 0, ALLOT__OPT_STR, "FILE",
	    "file keeping the last config allotd sent, used at start while "
	    "allotd is down",
	    .off = AT(agent.config_cache_file), .dflt = "none" },
	{ "help", 'h', ALLOT__OPT_HELP, NULL, "this text", .cli_only = true },
	{ "version", 'V', ALLOT__OPT_CALL, NULL, "print the version",
	    .set = show_version, .cli_only = true },
};

static const allot__opts table = {
	.prog = AGENTD_PROG,
	.rows = rows,
	.n = sizeof rows / sizeof rows[0],
	.style = ALLOT__OPTS_COLUMNS,
	.col = 34,
	.head =
	    "usage: " AGENTD_PROG " --config FILE [options]\n\n"
	    "liballot as a sidecar: Envoy's Rate Limit Service over gRPC,\n"
	    "a JSON decision API and /metrics over HTTP. "
	    "docs/sidecar.md.\n\n",
};

static void
defaults(struct agentd_options *o)
{
	memset(o, 0, sizeof *o);
	o->grpc_listen = "127.0.0.1:8081";
	o->http_listen = "127.0.0.1:8082";
	o->cert_check_ms = 1000;
	o->identity_keys = "caller";
	o->endpoint_keys = "endpoint,path";
	o->unknown = "default";
	o->descriptor_limits = "ignore";
	o->max_descriptor_limits = 4096;
	o->token_keys = "token";
	o->jwt_leeway_s = 30;
	o->grpc_threads = 2;
	o->max_connections = 1024;
	o->max_streams = 128;
	o->max_message = 16384;
	o->max_descriptors = 16;
	o->max_entries = 16;
	o->idle_timeout_s = 300;
	o->wait_ms = (uint32_t) (ALLOT_WAIT_DEFAULT_NS / 1000000u);
	o->log_level = 6;
	allot__logfmt f;
	allot__logfmt_parse("auto", &f);
	o->log_format = (int) f;
	allot_agent_options_init(&o->agent);
	o->agent.service = "sidecar";
}

void
agentd_options_parse(struct agentd_options *o, int argc, char **argv)
{
	defaults(o);
	int rc = allot__opts_preload(&table, argc, argv, o, &o->options_file);
	if (rc == ALLOT__OPTS_OK)
		rc = allot__opts_parse(&table, NULL, argc, argv, o);
	if (rc == ALLOT__OPTS_OK && o->config == NULL)
		rc = allot__opts_error(&table, "--config FILE is required");
	/* --tls-cert alone: one PEM file holds the certificate and its
	 * key, as allotd's --tls-cert does. */
	if (rc == ALLOT__OPTS_OK && o->tls_cert == NULL && o->tls_key != NULL)
		rc = allot__opts_error(&table, "--tls-key needs --tls-cert");
	if (rc == ALLOT__OPTS_OK && o->tls_cert != NULL && o->tls_key == NULL)
		o->tls_key = o->tls_cert;
	if (rc == ALLOT__OPTS_OK &&
	    (o->jwt_issuer == NULL) != (o->jwks == NULL))
		rc = allot__opts_error(
		    &table, "--jwt-issuer and --jwks go together");
	if (rc != ALLOT__OPTS_OK)
		exit(rc == ALLOT__OPTS_DONE ? 0 : 2);
}
