/* SPDX-License-Identifier: MIT */
/*
 * allot-agentd, the sidecar: what its files share. The daemon embeds
 * liballot through its public headers only, as any service would, and
 * answers for other processes: Envoy's Rate Limit Service over gRPC
 * (grpc.c: HTTP/2 with nghttp2, cleartext or GnuTLS; rls.c: the request
 * mapped to keys and decisions), a JSON decision API and /metrics over
 * HTTP/1.1 (http.c, libmicrohttpd, loopback and a Unix socket), and the
 * start-up, options and certificate watch (main.c, options.c). Every
 * limit that bounds a client's memory is an option here.
 */
#ifndef ALLOT_AGENTD_H
#define ALLOT_AGENTD_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <allot/allot.h>
#include <allot/jwt.h>

#define AGENTD_PROG "allot-agentd"

/* What a descriptor that names no configured identity key gets. */
enum agentd_unknown {
	UNKNOWN_DEFAULT, /* the shared default bucket (DESIGN.md) */
	UNKNOWN_ALLOW, /* OK, nothing charged (envoyproxy/ratelimit) */
	UNKNOWN_REJECT, /* the RPC fails with INVALID_ARGUMENT */
};

struct agentd_options {
	/* Quota file, and the optional file of further options. */
	const char *config;
	const char *options_file;
	/* Listeners; "" or "none" disables one. */
	const char *grpc_listen;
	const char *http_listen;
	const char *http_socket;
	const char *metrics_listen; /* /metrics, /healthz, /readyz alone */
	bool metrics_each_unknown; /* a series per unknown identity */
	bool legacy_metric_names; /* renamed gauges under 0.1's names too */
	/* TLS for the gRPC listener (both or neither), watched for
	 * rotation every cert_check_ms. */
	const char *tls_cert;
	const char *tls_key;
	uint32_t cert_check_ms;
	/* Descriptor mapping (rls.c). */
	const char *domain;
	const char *identity_keys;
	const char *endpoint_keys;
	const char *unknown;
	/* A descriptor's own limit (limits.c): "ignore" or "cap", and how
	 * many limits the table holds. */
	const char *descriptor_limits;
	uint32_t max_descriptor_limits;
	/* Signed service tokens (rls.c, http.c): the entry keys that carry
	 * one, its issuer, the issuer's JWKS file, the audience (NULL: the
	 * service name), the clock skew. */
	const char *token_keys;
	const char *jwt_issuer;
	const char *jwks;
	const char *jwt_audience;
	uint32_t jwt_leeway_s;
	/* Bounds. */
	uint32_t grpc_threads;
	uint32_t max_connections;
	uint32_t max_streams;
	uint32_t max_message;
	uint32_t max_descriptors;
	uint32_t max_entries;
	uint32_t idle_timeout_s;
	/* The tail path (allot_acquire_id_wait()): how long a request its
	 * local bucket is short of waits for the central reserve; 0: never
	 * (decided locally). */
	uint32_t wait_ms;
	int log_level;
	int log_format; /* an allot__logfmt (common/logfmt.h) */
	/* liballot's options, every one an option of ours too (the log
	 * handler and level are set from the daemon's). */
	allot_agent_options agent;
};

/* The descriptor mapping, parsed from the options once. */
#define RLS_MAX_KEYS 8
struct rls_map {
	const char *identity_keys[RLS_MAX_KEYS];
	size_t n_identity_keys;
	const char *endpoint_keys[RLS_MAX_KEYS];
	size_t n_endpoint_keys;
	const char *token_keys[RLS_MAX_KEYS];
	size_t n_token_keys;
	allot_jwt_verifier *jwt; /* NULL: tokens are not accepted */
	enum agentd_unknown unknown;
	const char *domain; /* NULL: any */
	uint32_t max_descriptors;
	uint32_t max_entries;
	uint64_t wait_ns; /* the tail path's wait (--wait-ms) */
	/* --descriptor-limits cap: the descriptors' own limits (limits.c);
	 * NULL: ignored. */
	struct agentd_limits *limits;
};

/* Whether an acquire's return code is a decision to answer (allowed or
 * not, a cost above the burst, a closed quota), not an error. */
static inline bool
agentd_decided(int rc)
{
	return rc == ALLOT_OK || rc == ALLOT_ETOOBIG || rc == ALLOT_EFORBIDDEN;
}

/* limits.c: a descriptor's own limit, a bucket of this sidecar charged
 * on top of the quota. Any thread. */
struct agentd_limits *agentd_limits_new(uint32_t n);
void agentd_limits_free(struct agentd_limits *l);
/* Whether `unit` is one of Envoy's RateLimitUnit values we know. */
bool agentd_limits_valid(int unit);
/* Take `cost` from the limit of (id, ep): true when admitted; `*ret`
 * the limit's decision either way. */
bool agentd_limits_take(struct agentd_limits *l, const char *id,
    const char *ep, uint32_t rpu, int unit, uint32_t cost,
    allot_decision *ret);
/* Give back what agentd_limits_take() took (the quota refused). */
void agentd_limits_give_back(struct agentd_limits *l, const char *id,
    const char *ep, uint32_t rpu, int unit, uint32_t cost);

/* The daemon's own counters, for /metrics. */
struct agentd_counters {
	atomic_uint_fast64_t grpc_calls;
	atomic_uint_fast64_t grpc_errors;
	atomic_uint_fast64_t grpc_refused_conns;
	atomic_uint_fast64_t grpc_evicted_conns; /* idle, to make room */
	atomic_uint_fast64_t grpc_accept_pauses; /* out of descriptors */
	atomic_uint_fast64_t grpc_conns;
	atomic_uint_fast64_t http_calls;
	atomic_uint_fast64_t http_errors;
	atomic_uint_fast64_t http_refused_conns; /* the table full */
	atomic_uint_fast64_t http_evicted_conns; /* idle, to make room */
	atomic_uint_fast64_t cert_reloads;
	atomic_uint_fast64_t cert_reload_errors;
	/* The coordinator certificate, reloaded by liballot. */
	atomic_uint_fast64_t coord_cert_reloads;
	atomic_uint_fast64_t coord_cert_reload_errors;
};

struct agentd {
	struct agentd_options o;
	struct rls_map map;
	allot_config *cfg;
	allot_agent *agent;
	struct agentd_counters n;
	atomic_bool stopping;
	struct grpc_server *grpc;
	struct http_api *http;
	char replica[300];
};

/* main.c */
void agentd_log(const struct agentd *d, int level, const char *id,
    const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Monotonic milliseconds, coarse: for timeouts. */
uint64_t agentd_now_ms(void);

/* options.c: defaults, then the options file, then the command line
 * (later wins); exits with a message on a bad value. */
void agentd_options_parse(struct agentd_options *o, int argc, char **argv);
/* "error", "warning", ... for a syslog level (clamped to 0-7). */
/* The mapping from the options; false with `err` set when bad. */
bool agentd_map_init(struct rls_map *m, const struct agentd_options *o,
    char *err, size_t errlen);
/* The verifier of --jwt-issuer and --jwks into m->jwt (none without
 * them); false with the reason in `err`. */
bool agentd_map_tokens(struct rls_map *m, const struct agentd_options *o,
    allot_log_fn log, void *log_ctx, char *err, size_t errlen);
void agentd_map_fini(struct rls_map *m);
/* The caller a token names, into `id` (ALLOT_IDENTITY_MAX + 1 bytes):
 * `value` is the token, or "Bearer " and the token. */
allot_jwt_status agentd_token_identity(
    const struct rls_map *m, const char *value, char *id);

/* rls.c: one decision for (identity, endpoint, cost), with the headers a
 * proxy should set; shared by the gRPC and the HTTP APIs. */
/* Either RateLimit field of a policy named after an endpoint class of
 * up to ALLOT_ENDPOINT_MAX bytes, each escaped (allot.h,
 * ALLOT_RATELIMIT_FIELD_MAX), and its NUL. */
#define AGENTD_FIELD_MAX (2 * ALLOT_ENDPOINT_MAX + 2 + 48)
struct agentd_verdict {
	int rc; /* allot_acquire's */
	allot_decision d;
	const char *name; /* the policy's: the endpoint class or "default";
	                     valid as long as `endpoint` */
	char policy[AGENTD_FIELD_MAX]; /* RateLimit-Policy */
	char ratelimit[AGENTD_FIELD_MAX]; /* RateLimit */
	char retry_after[24]; /* Retry-After; "" when allowed */
};
/* The one decision of both APIs; a request its local bucket is short of
 * waits up to `wait_ns` for the central reserve (0: never). */
void agentd_decide(allot_agent *agent, const char *identity,
    const char *endpoint, uint32_t cost, uint64_t wait_ns,
    struct agentd_verdict *ret);
/* Decode one RateLimitRequest, decide every descriptor and encode the
 * RateLimitResponse into a malloc'd buffer after 5 bytes left free for
 * the gRPC prefix. Returns a gRPC status: 0 with *ret_buf and *ret_len
 * (prefix included) set, else the error code with `msg` filled. */
int agentd_rls(allot_agent *agent, const struct rls_map *m, const uint8_t *req,
    size_t len, uint8_t **ret_buf, size_t *ret_len, char *msg, size_t msglen);

/* grpc.c */
struct grpc_server;
int grpc_server_start(struct agentd *d, struct grpc_server **ret);
unsigned grpc_server_port(const struct grpc_server *g);
/* Reload the TLS certificate and key if their files changed. */
void grpc_server_check_certs(struct grpc_server *g);
void grpc_server_stop(struct grpc_server *g);

/* http.c */
struct http_api;
int http_api_start(struct agentd *d, struct http_api **ret);
unsigned http_api_port(const struct http_api *h);
unsigned http_api_ops_port(const struct http_api *h); /* --metrics-listen */
void http_api_stop(struct http_api *h);

/* metrics.c: Prometheus text of the agent and the daemon, malloc'd. */
char *agentd_metrics(struct agentd *d, size_t *ret_len);

#endif
