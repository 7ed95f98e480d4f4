/* SPDX-License-Identifier: MIT */
/*
 * The example service's requests. Each TCP connection gets a context when
 * libmicrohttpd accepts it; at its first request the caller's identity is
 * read (the verified SPIFFE ID of its client certificate in mTLS mode) and
 * the allot keys for it are resolved, then reused by every later request
 * on the connection and released when it closes. A request to a
 * rate-limited endpoint is admitted by allot_acquire_wait(): locally, or
 * after a wait of at most --wait-ms for the coordinator's central reserve
 * (the 429 contract on a denial), then executed under the concurrency limiter
 * (a 503 when it is full), and an export reconciles its estimated cost with
 * the measured one by allot_settle(). Every response of /lookup and /export
 * carries the RateLimit and X-RateLimit fields. The request path
 * allocates nothing beyond what libmicrohttpd needs for the response.
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "service.h"
#include "tls_identity.h"
#include "token_identity.h"

const char *const svc_endpoint_path[EP_COUNT] = { "/lookup", "/export" };

#define IDENTITY_HEADER "X-Allot-Identity"
#define JSON "application/json"

/* ---- connections and identity ---- */

static void
conn_release(struct svc *s, struct svc_conn *cc)
{
	for (int e = 0; e < EP_COUNT; e++) {
		allot_key_release(s->agent, cc->key[e]);
		cc->key[e] = NULL;
	}
	cc->caller = NULL;
	cc->identity[0] = '\0';
	cc->resolved = false;
}

void
svc_notify_connection(void *cls, struct MHD_Connection *c,
    void **socket_context, enum MHD_ConnectionNotificationCode toe)
{
	struct svc *s = cls;
	(void) c;
	if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
		/* One allocation per connection, none per request. A NULL
		 * context (out of memory) is answered 503 by the handler. */
		*socket_context = calloc(1, sizeof(struct svc_conn));
		atomic_fetch_add_explicit(
		    &s->connections, 1, memory_order_relaxed);
		return;
	}
	struct svc_conn *cc = *socket_context;
	if (cc == NULL)
		return;
	conn_release(s, cc);
	free(cc);
	*socket_context = NULL;
}

/* A self-declared identity is used as a key and echoed in JSON: accept
 * printable ASCII without quotes or backslashes, nothing else. */
static bool
header_identity_ok(const char *h)
{
	size_t n = 0;
	for (; h[n] != '\0'; n++) {
		unsigned char ch = (unsigned char) h[n];
		if (ch <= 0x20 || ch >= 0x7f || ch == '"' || ch == '\\')
			return false;
		if (n >= ALLOT_IDENTITY_MAX)
			return false;
	}
	return n > 0;
}

/* The caller's identity for this request into `buf` ("" for none). */
static void
request_identity(
    struct svc *s, struct MHD_Connection *c, char *buf, size_t len)
{
	buf[0] = '\0';
	if (s->mode == MODE_MTLS) {
		const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
		    c, MHD_CONNECTION_INFO_GNUTLS_SESSION);
		if (ci == NULL || ci->tls_session == NULL)
			return;
		int rc = example_tls_identity(
		    ci->tls_session, s->o.trust_domain, buf, len);
		if (rc != ALLOT_OK) {
			buf[0] = '\0';
			svc_log(s, 7, "SVC-NO-IDENTITY",
			    "connection without a verified identity (%s): "
			    "default bucket",
			    allot_strerror(rc));
		}
		return;
	}
	if (s->mode == MODE_PLAIN_INSECURE) {
		/* Only here, never in a TLS mode: the header is whatever
		 * the client says. */
		const char *h = MHD_lookup_connection_value(
		    c, MHD_HEADER_KIND, IDENTITY_HEADER);
		if (h != NULL && header_identity_ok(h))
			snprintf(buf, len, "%s", h);
	}
}

/* Resolve the connection's caller once (per identity change in the
 * insecure header mode, per request with a token). Keys are resolved lazily,
 * per endpoint. A request whose token does not verify is refused (false,
 * `*bad` says why) and leaves the connection's caller as it was. */
static bool
conn_resolve(struct svc *s, struct MHD_Connection *c, struct svc_conn *cc,
    allot_jwt_status *bad)
{
	const char *authz = s->jwt == NULL ?
	    NULL :
	    MHD_lookup_connection_value(
	        c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
	char id[ALLOT_IDENTITY_MAX + 1];
	if (authz != NULL) {
		*bad = svc_token_identity(s, authz, id);
		if (*bad != ALLOT_JWT_OK)
			return false;
		cc->by_token = true;
	} else {
		if (cc->resolved && !cc->by_token &&
		    s->mode != MODE_PLAIN_INSECURE)
			return true;
		cc->by_token = false;
		request_identity(s, c, id, sizeof id);
	}
	if (cc->resolved && strcmp(id, cc->identity) == 0)
		return true;
	conn_release(s, cc);
	memcpy(cc->identity, id, sizeof id);
	cc->caller = svc_callers_get(s, id);
	cc->resolved = true;
	return true;
}

static allot_key *
conn_key(struct svc *s, struct svc_conn *cc, enum svc_endpoint ep)
{
	if (cc->key[ep] != NULL)
		return cc->key[ep];
	allot_key *k;
	int rc = allot_key_resolve(s->agent,
	    cc->identity[0] != '\0' ? cc->identity : NULL,
	    svc_endpoint_path[ep], &k);
	if (rc != ALLOT_OK) {
		svc_log(s, 3, "SVC-KEY-FAIL", "allot_key_resolve: %s",
		    allot_strerror(rc));
		return NULL;
	}
	cc->key[ep] = k;
	return k;
}

/* ---- responses ---- */

static void
count(_Atomic uint64_t *c, uint64_t n)
{
	atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

/* Queue a response whose body is `body` (static, or the connection's
 * buffer: MHD_RESPMEM_PERSISTENT, no copy). With `d` set the rate-limit
 * fields of the decision are added; `retry_after` adds Retry-After. */
static enum MHD_Result
reply(struct MHD_Connection *c, unsigned status, const char *body, size_t len,
    const allot_decision *d, const char *policy, const char *retry_after)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(
	    len, (void *) body, MHD_RESPMEM_PERSISTENT);
	if (r == NULL)
		return MHD_NO;
	bool ok = MHD_add_response_header(
	              r, MHD_HTTP_HEADER_CONTENT_TYPE, JSON) == MHD_YES;
	/* An unlimited quota's decision has no policy to send. */
	if (d != NULL && !isinf(d->limit)) {
		/* Sized for any quota's name, escaped. */
		char pol[ALLOT_RATELIMIT_FIELD_MAX];
		char rl[ALLOT_RATELIMIT_FIELD_MAX];
		allot_xheaders xh;
		int np = allot_fmt_ratelimit_policy(
		    d, policy, pol, sizeof pol);
		int nr = allot_fmt_ratelimit(d, policy, rl, sizeof rl);
		allot_fmt_xratelimit(d, (int64_t) time(NULL), &xh);
		ok = ok && np > 0 && (size_t) np < sizeof pol && nr > 0 &&
		    (size_t) nr < sizeof rl &&
		    MHD_add_response_header(r, "RateLimit-Policy", pol) ==
		        MHD_YES &&
		    MHD_add_response_header(r, "RateLimit", rl) == MHD_YES &&
		    MHD_add_response_header(
		        r, "X-RateLimit-Limit", xh.limit) == MHD_YES &&
		    MHD_add_response_header(
		        r, "X-RateLimit-Remaining", xh.remaining) == MHD_YES &&
		    MHD_add_response_header(
		        r, "X-RateLimit-Reset", xh.reset) == MHD_YES;
		if (d->shadow_denied)
			ok = ok &&
			    MHD_add_response_header(
			        r, "X-Allot-Shadow", "would-deny") == MHD_YES;
	}
	if (retry_after != NULL)
		ok = ok &&
		    MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER,
		        retry_after) == MHD_YES;
	enum MHD_Result ret = ok ? MHD_queue_response(c, status, r) : MHD_NO;
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result
reply_static(struct MHD_Connection *c, unsigned status, const char *body)
{
	return reply(c, status, body, strlen(body), NULL, NULL, NULL);
}

/* Format the body into the connection's buffer. */
__attribute__((format(printf, 2, 3))) static size_t
body(struct svc_conn *cc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(cc->body, sizeof cc->body, fmt, ap);
	va_end(ap);
	if (n < 0)
		n = 0;
	if ((size_t) n >= sizeof cc->body)
		n = (int) sizeof cc->body - 1;
	return (size_t) n;
}

/* The 429 contract: Retry-After from the bucket, the same number in the
 * body, the rate-limit fields. */
static enum MHD_Result
reply_rate_denied(struct MHD_Connection *c, struct svc_conn *cc,
    const allot_decision *d, const char *policy)
{
	char ra[24];
	allot_fmt_retry_after(d, ra, sizeof ra);
	size_t n = body(
	    cc, "{\"error\":\"rate_limit_exceeded\",\"retry_after\":%s}", ra);
	return reply(
	    c, MHD_HTTP_TOO_MANY_REQUESTS, cc->body, n, d, policy, ra);
}

/* A concurrency-limit rejection: 503, its own error, the limiter's
 * retry hint, and the rate-limit fields of the admission decision. */
static enum MHD_Result
reply_busy(struct svc *s, struct MHD_Connection *c, struct svc_conn *cc,
    const allot_decision *d, const char *policy)
{
	char ra[24];
	snprintf(ra, sizeof ra, "%" PRIu32, s->conc_retry_after_s);
	size_t n = body(cc,
	    "{\"error\":\"concurrency_limit_exceeded\",\"retry_after\":%s}",
	    ra);
	return reply(
	    c, MHD_HTTP_SERVICE_UNAVAILABLE, cc->body, n, d, policy, ra);
}

/* A token that does not verify: 401 with the reason (RFC 6750 §3), and
 * no bucket charged. */
static enum MHD_Result
reply_bad_token(struct MHD_Connection *c, allot_jwt_status st)
{
	static const char body_fmt[] =
	    "{\"error\":\"invalid_token\",\"reason\":\"%s\"}";
	char buf[96];
	int n = snprintf(buf, sizeof buf, body_fmt, allot_jwt_status_name(st));
	struct MHD_Response *r = MHD_create_response_from_buffer(
	    (size_t) n, buf, MHD_RESPMEM_MUST_COPY);
	if (r == NULL)
		return MHD_NO;
	enum MHD_Result ret = MHD_NO;
	if (MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, JSON) ==
	        MHD_YES &&
	    MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
	        "Bearer error=\"invalid_token\"") == MHD_YES)
		ret = MHD_queue_response(c, MHD_HTTP_UNAUTHORIZED, r);
	MHD_destroy_response(r);
	return ret;
}

/* ---- the rate-limited endpoints ---- */

/* Give back what an admitted request was charged, when it ends up doing
 * `measured` tokens of work instead. A shadow-mode would-be denial took
 * no tokens (the bucket models a limiter that refused it): nothing to
 * reconcile. */
static void
reconcile(
    struct svc *s, allot_key *k, const allot_decision *d, uint32_t measured)
{
	if (d->shadow_denied)
		return;
	allot_settle(s->agent, k, d->cost, measured);
}

/* Admission. Returns true when the request may go on to execution;
 * otherwise the response is queued and `*ret` says how. */
static bool
admit(struct svc *s, struct MHD_Connection *c, struct svc_conn *cc,
    enum svc_endpoint ep, allot_key *k, allot_decision *d,
    enum MHD_Result *ret)
{
	struct svc_caller *who = cc->caller;
	count(&who->requests, 1);
	/* The tail path: a request the local bucket is short of may still
	 * fit the quota globally, and waits up to --wait-ms for the
	 * coordinator's central reserve (docs/integrating.md). */
	int rc = allot_acquire_wait(s->agent, k, ALLOT_COST_DEFAULT,
	    (uint64_t) s->o.wait_ms * 1000000u, d);
	if (rc == ALLOT_ETOOBIG) {
		/* A quota whose burst is below the endpoint's weight: no
		 * retry can ever pass, so not a 429. */
		count(&who->cost_too_big, 1);
		size_t n = body(cc,
		    "{\"error\":\"cost_exceeds_quota\",\"cost\":%" PRIu32 "}",
		    d->cost);
		*ret = reply(
		    c, MHD_HTTP_FORBIDDEN, cc->body, n, NULL, NULL, NULL);
		return false;
	}
	if (rc == ALLOT_EFORBIDDEN) {
		/* A closed quota (access: closed): no access, not a 429. */
		count(&who->closed, 1);
		*ret = reply_static(
		    c, MHD_HTTP_FORBIDDEN, "{\"error\":\"quota_closed\"}");
		return false;
	}
	if (rc != ALLOT_OK) {
		*ret = reply_static(c, MHD_HTTP_INTERNAL_SERVER_ERROR,
		    "{\"error\":\"internal\"}");
		return false;
	}
	if (!d->allowed) {
		count(&who->rate_denied, 1);
		*ret = reply_rate_denied(
		    c, cc, d, allot_decision_quota(s->agent, k, d));
		return false;
	}
	count(&who->admitted, 1);
	if (d->shadow_denied)
		count(&who->shadow_would_deny, 1);
	return true;
}

static enum MHD_Result
do_lookup(
    struct svc *s, struct MHD_Connection *c, struct svc_conn *cc, allot_key *k)
{
	allot_decision d;
	enum MHD_Result ret;
	if (!admit(s, c, cc, EP_LOOKUP, k, &d, &ret))
		return ret;
	struct svc_caller *who = cc->caller;
	/* The quota that bound the decision: with stacked limits, the one
	 * with the fewest tokens left. */
	const char *pol = allot_decision_quota(s->agent, k, &d);
	/* Interactive lane: exports can never take all of its permits, so a
	 * burst of them does not slow lookups down. */
	allot_conc_permit p;
	int rc = allot_conc_acquire(s->conc, who->conc_slot,
	    ALLOT_LANE_INTERACTIVE, ALLOT_CONC_WAIT_MAX, &p);
	if (rc != ALLOT_OK) {
		reconcile(s, k, &d, 0);
		count(&who->conc_rejected, 1);
		return reply_busy(s, c, cc, &d, pol);
	}
	count(&who->lookups_done, 1); /* the work: a cheap read */
	allot_conc_release(&p);
	size_t n = body(cc, "{\"result\":\"found\",\"caller\":%s%s%s}",
	    cc->identity[0] != '\0' ? "\"" : "",
	    cc->identity[0] != '\0' ? cc->identity : "null",
	    cc->identity[0] != '\0' ? "\"" : "");
	return reply(c, MHD_HTTP_OK, cc->body, n, &d, pol, NULL);
}

/* ?rows=N, strictly digits, 1 .. max; 0 when absent, -1 when bad. */
static int64_t
parse_rows(const char *v, uint32_t max)
{
	if (v == NULL)
		return 0;
	uint64_t x = 0;
	if (*v == '\0')
		return -1;
	for (; *v != '\0'; v++) {
		if (*v < '0' || *v > '9')
			return -1;
		x = x * 10 + (uint64_t) (*v - '0');
		if (x > max)
			return -1;
	}
	return x == 0 ? -1 : (int64_t) x;
}

/* The expensive work, simulated: export_ms per row, in slices short
 * enough to notice shutdown. Returns the rows actually exported. */
static uint64_t
simulate_export(struct svc *s, uint64_t rows)
{
	uint64_t total = rows * s->export_ns_per_row;
	uint64_t start = svc_now_ns();
	uint64_t now = start;
	while (now - start < total &&
	    !atomic_load_explicit(&s->stopping, memory_order_relaxed)) {
		uint64_t left = total - (now - start);
		uint64_t slice = left < 10000000u ? left : 10000000u;
		struct timespec ts = { (time_t) (slice / 1000000000u),
			(long) (slice % 1000000000u) };
		nanosleep(&ts, NULL);
		now = svc_now_ns();
	}
	uint64_t spent = now - start;
	if (total == 0 || spent >= total)
		return rows;
	return (uint64_t) ((double) rows * (double) spent / (double) total);
}

static enum MHD_Result
do_export(
    struct svc *s, struct MHD_Connection *c, struct svc_conn *cc, allot_key *k)
{
	allot_decision d;
	enum MHD_Result ret;
	if (!admit(s, c, cc, EP_EXPORT, k, &d, &ret))
		return ret;
	struct svc_caller *who = cc->caller;
	const char *pol = allot_decision_quota(s->agent, k, &d);
	int64_t rows = parse_rows(
	    MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "rows"),
	    s->o.export_max_rows);
	if (rows == 0)
		rows = 100;
	if (rows < 0) {
		/* Admitted, then refused before any work: charge it as
		 * the one token of work it caused. */
		reconcile(s, k, &d, 1);
		count(&who->bad_requests, 1);
		size_t n = body(cc,
		    "{\"error\":\"bad_request\",\"detail\":\"rows must be an "
		    "integer in 1..%" PRIu32 "\"}",
		    s->o.export_max_rows);
		return reply(
		    c, MHD_HTTP_BAD_REQUEST, cc->body, n, &d, pol, NULL);
	}
	/* Execution: a bulk permit, waiting at most --queue-ms. A rejection
	 * here is "busy", not "over quota": the admission is refunded. */
	allot_conc_permit p;
	int rc = allot_conc_acquire(
	    s->conc, who->conc_slot, ALLOT_LANE_BULK, ALLOT_CONC_WAIT_MAX, &p);
	if (rc != ALLOT_OK) {
		reconcile(s, k, &d, 0);
		count(&who->conc_rejected, 1);
		return reply_busy(s, c, cc, &d, pol);
	}
	uint64_t done = simulate_export(s, (uint64_t) rows);
	allot_conc_release(&p);
	/* Reserve, then reconcile: the weight was the estimate, one token
	 * per rows_per_token rows exported is the measure. */
	uint64_t measured = (done + s->o.rows_per_token - 1) /
	    s->o.rows_per_token;
	if (measured > UINT32_MAX)
		measured = UINT32_MAX;
	reconcile(s, k, &d, (uint32_t) measured);
	count(&who->exports_done, 1);
	count(&who->rows_exported, done);
	count(&who->export_tokens_estimated, d.cost);
	count(&who->export_tokens_measured, measured);
	if (done < (uint64_t) rows) {
		size_t n = body(cc,
		    "{\"error\":\"shutting_down\","
		    "\"rows\":%" PRIu64 "}",
		    done);
		return reply(c, MHD_HTTP_SERVICE_UNAVAILABLE, cc->body, n, &d,
		    pol, NULL);
	}
	size_t n = body(cc,
	    "{\"rows\":%" PRIu64 ",\"tokens_estimated\":%" PRIu32
	    ",\"tokens_measured\":%" PRIu64 "}",
	    done, d.cost, measured);
	return reply(c, MHD_HTTP_OK, cc->body, n, &d, pol, NULL);
}

/* ---- operational endpoints ---- */

static enum MHD_Result
do_stats(struct svc *s, struct MHD_Connection *c)
{
	size_t len;
	char *doc = svc_stats_json(s, &len);
	if (doc == NULL)
		return reply_static(c, MHD_HTTP_SERVICE_UNAVAILABLE,
		    "{\"error\":\"out_of_memory\"}");
	struct MHD_Response *r = MHD_create_response_from_buffer(
	    len, doc, MHD_RESPMEM_MUST_FREE);
	if (r == NULL) {
		free(doc);
		return MHD_NO;
	}
	enum MHD_Result ret = MHD_NO;
	if (MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, JSON) ==
	        MHD_YES &&
	    MHD_add_response_header(
	        r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store") == MHD_YES)
		ret = MHD_queue_response(c, MHD_HTTP_OK, r);
	MHD_destroy_response(r);
	return ret;
}

enum MHD_Result
svc_handle(void *cls, struct MHD_Connection *c, const char *url,
    const char *method, const char *version, const char *upload_data,
    size_t *upload_data_size, void **req_cls)
{
	struct svc *s = cls;
	static int request_seen;
	(void) version;
	(void) upload_data;

	/* libmicrohttpd calls once when the headers are in, again per piece
	 * of body, and once more at the end. Answering at the first call
	 * would make it close the connection (it cannot know where the
	 * next request starts), losing keep-alive and the keys resolved for
	 * the connection. Bodies are not used: they are discarded. */
	if (*req_cls == NULL) {
		*req_cls = &request_seen;
		return MHD_YES;
	}
	if (*upload_data_size != 0) {
		*upload_data_size = 0;
		return MHD_YES;
	}

	svc_log(s, 7, "SVC-REQUEST", "%s %s", method, url);
	if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
	    strcmp(method, MHD_HTTP_METHOD_HEAD) != 0) {
		struct MHD_Response *r = MHD_create_response_from_buffer(
		    sizeof "{\"error\":\"method_not_allowed\"}" - 1,
		    (void *) "{\"error\":\"method_not_allowed\"}",
		    MHD_RESPMEM_PERSISTENT);
		if (r == NULL)
			return MHD_NO;
		enum MHD_Result ret = MHD_NO;
		if (MHD_add_response_header(
		        r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD") == MHD_YES &&
		    MHD_add_response_header(
		        r, MHD_HTTP_HEADER_CONTENT_TYPE, JSON) == MHD_YES)
			ret = MHD_queue_response(
			    c, MHD_HTTP_METHOD_NOT_ALLOWED, r);
		MHD_destroy_response(r);
		return ret;
	}
	/* The caller is resolved at the connection's first request,
	 * whatever it asks for: a client that opens its connection with a
	 * health check pays for the certificate check there, not in the
	 * middle of its first burst. */
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
	    c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	struct svc_conn *cc = ci != NULL ? ci->socket_context : NULL;
	allot_jwt_status bad = ALLOT_JWT_OK;
	bool known = cc == NULL || conn_resolve(s, c, cc, &bad);

	if (strcmp(url, "/healthz") == 0)
		return atomic_load(&s->stopping) ?
		    reply_static(c, MHD_HTTP_SERVICE_UNAVAILABLE,
		        "{\"status\":\"stopping\"}") :
		    reply_static(c, MHD_HTTP_OK, "{\"status\":\"ok\"}");
	if (strcmp(url, "/stats") == 0)
		return do_stats(s, c);

	enum svc_endpoint ep;
	if (strcmp(url, svc_endpoint_path[EP_LOOKUP]) == 0)
		ep = EP_LOOKUP;
	else if (strcmp(url, svc_endpoint_path[EP_EXPORT]) == 0)
		ep = EP_EXPORT;
	else
		return reply_static(
		    c, MHD_HTTP_NOT_FOUND, "{\"error\":\"not_found\"}");

	if (cc == NULL)
		return reply_static(c, MHD_HTTP_SERVICE_UNAVAILABLE,
		    "{\"error\":\"out_of_memory\"}");
	if (!known)
		return reply_bad_token(c, bad);
	allot_key *k = conn_key(s, cc, ep);
	if (k == NULL)
		return reply_static(c, MHD_HTTP_INTERNAL_SERVER_ERROR,
		    "{\"error\":\"internal\"}");
	return ep == EP_LOOKUP ? do_lookup(s, c, cc, k) :
	                         do_export(s, c, cc, k);
}
