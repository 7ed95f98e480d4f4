/* SPDX-License-Identifier: MIT */
/*
 * The example protected service's shared state: the options from the
 * command line, the service object (agent, concurrency limiter, HTTP
 * daemon, caller table), the per-caller counters that /stats reports as
 * "work actually done", and the per-connection context that carries the
 * caller's resolved allot keys from the first request of a TLS
 * connection to its last. service.c owns start-up and shutdown,
 * handlers.c the requests, callers.c the caller table, stats_json.c the
 * /stats document.
 */
#ifndef ALLOT_EXAMPLE_SERVICE_H
#define ALLOT_EXAMPLE_SERVICE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>

#include <microhttpd.h>

#include <allot/allot.h>
#include <allot/conc.h>
#include <allot/jwt.h>

/* The rate-limited endpoints; /stats and /healthz are operational and
 * never charged. */
enum svc_endpoint { EP_LOOKUP = 0, EP_EXPORT = 1, EP_COUNT };

extern const char *const svc_endpoint_path[EP_COUNT];

struct svc_options {
	const char *config;
	const char *listen;
	const char *tls_cert;
	const char *tls_key;
	const char *ca;
	const char *trust_domain;
	const char *coordinator;
	const char *service;
	const char *replica_id;
	uint32_t sync_interval_ms;
	uint32_t initial_replicas;
	bool plain_http;
	bool insecure_identity_header;
	/* Signed service tokens (token_identity.h): the issuer, its JWKS
	 * file, the audience (NULL: the service name), the clock skew. */
	const char *jwt_issuer;
	const char *jwks;
	const char *jwt_audience;
	uint32_t jwt_leeway_s;
	double export_ms; /* simulated work per exported row */
	uint32_t export_max_rows; /* largest ?rows= accepted */
	uint32_t rows_per_token; /* measured cost: ceil(rows / this) */
	uint32_t max_inflight; /* exports running at once, all callers */
	uint32_t max_inflight_per_caller;
	uint32_t queue_ms; /* longest an export waits for a permit */
	/* How long a request its local bucket is short of waits for the
	 * coordinator's central reserve (allot_acquire_wait); 0: never. */
	uint32_t wait_ms;
	uint32_t queue_max; /* exports waiting at once */
	uint32_t interactive_reserve; /* permits exports can never take */
	uint32_t max_callers;
	uint32_t max_connections;
	uint32_t max_per_address; /* connections from one IP address */
	uint32_t connection_timeout_s; /* idle, TLS handshake included */
	int log_level;
};

/* Counters of one caller (a verified identity, or none). Updated with
 * relaxed atomics from connection threads; /stats reads them. */
struct svc_caller {
	char identity[ALLOT_IDENTITY_MAX + 1]; /* "" for none */
	bool has_identity;
	uint32_t conc_slot;
	const char *quota; /* the quota charged ("default" for none); set
	                      before the record is published */
	_Atomic uint64_t requests; /* to /lookup and /export */
	_Atomic uint64_t admitted; /* the rate limiter said yes */
	_Atomic uint64_t rate_denied; /* answered 429 */
	_Atomic uint64_t shadow_would_deny; /* shadow quota: allowed, marked */
	_Atomic uint64_t conc_rejected; /* answered 503 by the limiter */
	_Atomic uint64_t cost_too_big; /* answered 403: cost > burst */
	_Atomic uint64_t closed; /* answered 403: access: closed */
	_Atomic uint64_t bad_requests; /* answered 400 */
	_Atomic uint64_t lookups_done; /* work actually done */
	_Atomic uint64_t exports_done;
	_Atomic uint64_t rows_exported;
	_Atomic uint64_t export_tokens_estimated;
	_Atomic uint64_t export_tokens_measured;
};

struct svc_callers {
	pthread_mutex_t mu;
	struct svc_caller *rec; /* rec[0]: no identity */
	uint32_t *index; /* open addressing over rec, 0: empty */
	uint32_t cap; /* records */
	uint32_t index_cap; /* a power of two, >= 2 * cap */
	_Atomic uint32_t n; /* records in use */
	_Atomic uint64_t overflowed; /* identities folded into rec[0] */
};

enum svc_mode {
	MODE_MTLS, /* TLS, client certificates verified against --ca */
	MODE_TLS, /* TLS without --ca: nobody has an identity */
	MODE_PLAIN, /* plain HTTP: nobody has an identity */
	MODE_PLAIN_INSECURE, /* plain HTTP, identity from a header */
};

struct svc {
	struct svc_options o;
	enum svc_mode mode;
	allot_config *cfg;
	allot_agent *agent;
	allot_conc *conc;
	allot_conc_options conc_opts;
	struct MHD_Daemon *httpd;
	struct svc_callers callers;
	allot_jwt_verifier *jwt; /* NULL: no tokens accepted */
	_Atomic uint64_t not_bearer; /* Authorization of another scheme */
	uint64_t started_ns;
	uint64_t export_ns_per_row;
	uint32_t conc_retry_after_s;
	atomic_bool stopping;
	_Atomic uint64_t connections; /* accepted, ever */
};

/* Per TCP connection: MHD's socket context. The identity is fixed for a
 * TLS connection, so the caller and its keys are resolved at its first
 * request and released when it closes. */
struct svc_conn {
	bool resolved;
	struct svc_caller *caller;
	allot_key *key[EP_COUNT];
	/* The identity the keys were resolved for ("" for none). With
	 * --insecure-identity-header a request whose header differs from
	 * the previous one on the connection re-resolves. */
	char identity[ALLOT_IDENTITY_MAX + 1];
	/* The identity came from the last request's token: a request
	 * without one goes back to the connection's own. */
	bool by_token;
	/* The body of the response in flight (MHD_RESPMEM_PERSISTENT: MHD
	 * sends one response per connection at a time). */
	char body[384];
};

/* service.c */
uint64_t svc_now_ns(void);
void svc_log(const struct svc *s, int level, const char *id, const char *fmt,
    ...) __attribute__((format(printf, 4, 5)));

/* callers.c */
int svc_callers_init(struct svc_callers *t, uint32_t cap);
void svc_callers_fini(struct svc_callers *t);
struct svc_caller *svc_callers_get(struct svc *s, const char *identity);

/* handlers.c */
enum MHD_Result svc_handle(void *cls, struct MHD_Connection *c,
    const char *url, const char *method, const char *version,
    const char *upload_data, size_t *upload_data_size, void **req_cls);
void svc_notify_connection(void *cls, struct MHD_Connection *c,
    void **socket_context, enum MHD_ConnectionNotificationCode toe);

/* stats_json.c: the /stats document, malloc'd; NULL when out of
 * memory. */
char *svc_stats_json(struct svc *s, size_t *ret_len);

#endif /* ALLOT_EXAMPLE_SERVICE_H */
