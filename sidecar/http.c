/* SPDX-License-Identifier: MIT */
/*
 * The local HTTP/JSON decision API, for services in any language that do
 * not sit behind Envoy: libmicrohttpd on loopback TCP (--http-listen)
 * and on a Unix socket (--http-socket), HTTP/1.1 keep-alive, so that a
 * call per request costs one small write and read on a connection that
 * stays open (a thread per connection). The API (docs/sidecar.md):
 *   POST /v1/acquire   {"identity", "endpoint", "cost"} → the decision,
 *                      Retry-After and the RateLimit headers to set
 *   POST /v1/settle    {"identity", "endpoint", "charged", "measured"}
 *   GET  /v1/remaining?identity=&endpoint=   the bucket, without charging
 *   GET  /metrics      Prometheus text (metrics.c)
 *   GET  /healthz      200 while the process serves
 *   GET  /readyz       200 once its decisions follow allotd (synced,
 *                      not in fallback), or with no allotd to follow;
 *                      503 with the reason otherwise
 * A decision is always 200: the body says allow or deny; errors in the
 * request are 400, unknown paths 404, bodies above 4 KiB 413.
 */
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <json-c/json.h>
#include <microhttpd.h>

#include "agentd.h"
#include "http_room.h"

#define BODY_MAX 4096
#define HTTP_STACK (256 * 1024)
#define JSON "application/json"

/* One libmicrohttpd daemon: the TCP one, the Unix socket's or the
 * operations one (--metrics-listen: /metrics, /healthz and /readyz
 * alone), each with its own connections (http_room.c). */
struct listener {
	struct agentd *d;
	struct http_room *room;
	struct MHD_Daemon *mhd;
	bool ops_only;
};

struct http_api {
	struct agentd *d;
	struct listener tcp;
	struct listener uds;
	struct listener ops;
	int uds_fd;
	unsigned port, ops_port;
};

/* libmicrohttpd's own connection limit is above --max-connections by
 * this much: the newcomers that find the room full (closed at once) and
 * the connections closed to make room are counted until their threads
 * have closed them. */
#define MHD_LIMIT_SLACK 64u

/* A request's body, gathered across calls of the handler. */
struct req {
	size_t len;
	bool too_big;
	char body[BODY_MAX + 1];
};

static enum MHD_Result
send_text(struct MHD_Connection *c, unsigned status, const char *type,
    const char *text, size_t len)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(
	    len, (void *) text, MHD_RESPMEM_MUST_COPY);
	if (r == NULL)
		return MHD_NO;
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	enum MHD_Result ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result
send_json(struct MHD_Connection *c, unsigned status, json_object *o)
{
	size_t len;
	const char *s = json_object_to_json_string_length(
	    o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
	enum MHD_Result ret = send_text(c, status, JSON, s, len);
	json_object_put(o);
	return ret;
}

static enum MHD_Result
send_error(struct agentd *d, struct MHD_Connection *c, unsigned status,
    const char *msg)
{
	atomic_fetch_add(&d->n.http_errors, 1);
	json_object *o = json_object_new_object();
	json_object_object_add(o, "error", json_object_new_string(msg));
	return send_json(c, status, o);
}

/* A string member, or NULL (absent or null). */
static const char *
member_str(json_object *o, const char *name, bool *bad)
{
	json_object *v;
	if (!json_object_object_get_ex(o, name, &v) || v == NULL)
		return NULL;
	if (!json_object_is_type(v, json_type_string)) {
		*bad = true;
		return NULL;
	}
	return json_object_get_string(v);
}

/* A non-negative integer member below 2^32; `def` when absent. */
static uint32_t
member_u32(json_object *o, const char *name, uint32_t def, bool *bad)
{
	json_object *v;
	if (!json_object_object_get_ex(o, name, &v) || v == NULL)
		return def;
	if (!json_object_is_type(v, json_type_int)) {
		*bad = true;
		return def;
	}
	int64_t x = json_object_get_int64(v);
	if (x < 0 || x > UINT32_MAX) {
		*bad = true;
		return def;
	}
	return (uint32_t) x;
}

/* A token that does not verify: 401 with the reason (RFC 6750 §3). */
static enum MHD_Result
send_bad_token(struct agentd *d, struct MHD_Connection *c, allot_jwt_status st)
{
	char body[96];
	int n = snprintf(body, sizeof body,
	    "{\"error\":\"invalid_token\",\"reason\":\"%s\"}",
	    allot_jwt_status_name(st));
	atomic_fetch_add(&d->n.http_errors, 1);
	struct MHD_Response *r = MHD_create_response_from_buffer(
	    (size_t) n, body, MHD_RESPMEM_MUST_COPY);
	if (r == NULL)
		return MHD_NO;
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, JSON);
	MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
	    "Bearer error=\"invalid_token\"");
	enum MHD_Result ret = MHD_queue_response(c, 401, r);
	MHD_destroy_response(r);
	return ret;
}

/* The caller a call names: its "identity", or the subject of its
 * "token" (with --jwt-issuer). False when the call is answered already
 * (`*ret`): both given, tokens not accepted, or a token refused. */
static bool
caller(struct agentd *d, struct MHD_Connection *c, const char *identity,
    const char *token, char *buf, const char **ret_id, enum MHD_Result *ret)
{
	*ret_id = identity;
	if (token == NULL)
		return true;
	if (identity != NULL || d->map.jwt == NULL) {
		*ret = send_error(d, c, 400,
		    identity != NULL ?
		        "identity and token exclude each other" :
		        "tokens are not accepted here (no --jwt-issuer)");
		return false;
	}
	allot_jwt_status st = agentd_token_identity(&d->map, token, buf);
	if (st != ALLOT_JWT_OK) {
		*ret = send_bad_token(d, c, st);
		return false;
	}
	*ret_id = buf;
	return true;
}

/* A finite number, or null (INFINITY: an unlimited quota's). */
static json_object *
number_or_null(double x)
{
	return isfinite(x) ? json_object_new_double(x) : NULL;
}

static enum MHD_Result
acquire(struct agentd *d, struct MHD_Connection *c, json_object *in)
{
	bool bad = false;
	const char *id = member_str(in, "identity", &bad);
	const char *token = member_str(in, "token", &bad);
	const char *ep = member_str(in, "endpoint", &bad);
	uint32_t cost = member_u32(in, "cost", ALLOT_COST_DEFAULT, &bad);
	char buf[ALLOT_IDENTITY_MAX + 1];
	enum MHD_Result ret;
	if (bad)
		return send_error(d, c, 400,
		    "identity, token and endpoint are strings, cost an "
		    "integer");
	if (!caller(d, c, id, token, buf, &id, &ret))
		return ret;
	struct agentd_verdict v;
	agentd_decide(d->agent, id, ep, cost, d->map.wait_ns, &v);
	if (!agentd_decided(v.rc))
		return send_error(d, c, 400, allot_strerror(v.rc));
	json_object *o = json_object_new_object();
	json_object *h = json_object_new_object();
	json_object_object_add(
	    o, "allowed", json_object_new_boolean(v.d.allowed));
	json_object_object_add(
	    o, "shadow_denied", json_object_new_boolean(v.d.shadow_denied));
	/* A closed quota: answer 403, not 429, and do not retry. */
	json_object_object_add(
	    o, "forbidden", json_object_new_boolean(v.rc == ALLOT_EFORBIDDEN));
	json_object_object_add(o, "cost", json_object_new_int64(v.d.cost));
	json_object_object_add(o, "retry_after_ms",
	    json_object_new_int64(
	        (int64_t) ((v.d.retry_after_ns + 999999) / 1000000)));
	/* An unlimited quota has no amounts (null) and no policy. */
	json_object_object_add(o, "remaining", number_or_null(v.d.remaining));
	json_object_object_add(o, "limit", number_or_null(v.d.limit));
	json_object_object_add(o, "rate", number_or_null(v.d.rate));
	if (v.policy[0] != '\0')
		json_object_object_add(
		    h, "RateLimit-Policy", json_object_new_string(v.policy));
	if (v.ratelimit[0] != '\0')
		json_object_object_add(
		    h, "RateLimit", json_object_new_string(v.ratelimit));
	if (v.retry_after[0] != '\0')
		json_object_object_add(
		    h, "Retry-After", json_object_new_string(v.retry_after));
	json_object_object_add(o, "headers", h);
	return send_json(c, 200, o);
}

static enum MHD_Result
settle(struct agentd *d, struct MHD_Connection *c, json_object *in)
{
	bool bad = false;
	const char *id = member_str(in, "identity", &bad);
	const char *token = member_str(in, "token", &bad);
	const char *ep = member_str(in, "endpoint", &bad);
	uint32_t charged = member_u32(in, "charged", 0, &bad);
	uint32_t measured = member_u32(in, "measured", 0, &bad);
	char buf[ALLOT_IDENTITY_MAX + 1];
	enum MHD_Result ret;
	if (bad)
		return send_error(d, c, 400,
		    "identity, token and endpoint are strings, charged and "
		    "measured integers");
	if (!caller(d, c, id, token, buf, &id, &ret))
		return ret;
	allot_key *key;
	int rc = allot_key_resolve(d->agent, id, ep, &key);
	if (rc == ALLOT_OK) {
		rc = allot_settle(d->agent, key, charged, measured);
		allot_key_release(d->agent, key);
	}
	if (rc == ALLOT_ERANGE)
		return send_error(d, c, 409,
		    "refund above what the key was charged and has not had "
		    "settled: refunded only that");
	if (rc != ALLOT_OK)
		return send_error(d, c, 400, allot_strerror(rc));
	json_object *o = json_object_new_object();
	json_object_object_add(o, "settled", json_object_new_boolean(true));
	return send_json(c, 200, o);
}

static enum MHD_Result
remaining(struct agentd *d, struct MHD_Connection *c)
{
	const char *id = MHD_lookup_connection_value(
	    c, MHD_GET_ARGUMENT_KIND, "identity");
	const char *ep = MHD_lookup_connection_value(
	    c, MHD_GET_ARGUMENT_KIND, "endpoint");
	allot_key *key;
	allot_key_stats ks;
	int rc = allot_key_resolve(d->agent, id, ep, &key);
	if (rc == ALLOT_OK) {
		rc = allot_key_stats_get(d->agent, key, &ks);
		allot_key_release(d->agent, key);
	}
	if (rc != ALLOT_OK)
		return send_error(d, c, 400, allot_strerror(rc));
	json_object *o = json_object_new_object();
	json_object_object_add(
	    o, "identity", json_object_new_string(ks.identity));
	json_object_object_add(
	    o, "endpoint", json_object_new_string(ks.endpoint));
	json_object_object_add(o, "quota", json_object_new_string(ks.quota));
	json_object_object_add(o, "known", json_object_new_boolean(ks.known));
	json_object_object_add(o, "remaining",
	    json_object_new_double(ks.limit * (1 - ks.utilization)));
	json_object_object_add(o, "limit", json_object_new_double(ks.limit));
	json_object_object_add(o, "rate", json_object_new_double(ks.rate));
	return send_json(c, 200, o);
}

static enum MHD_Result
post(
    struct agentd *d, struct MHD_Connection *c, const char *url, struct req *r)
{
	if (r->too_big)
		return send_error(d, c, 413, "body above 4096 bytes");
	bool is_acquire = strcmp(url, "/v1/acquire") == 0;
	if (!is_acquire && strcmp(url, "/v1/settle") != 0)
		return send_error(d, c, 404, "no such endpoint");
	r->body[r->len] = '\0';
	json_tokener *tok = json_tokener_new_ex(8);
	json_object *in = tok != NULL ?
	    json_tokener_parse_ex(tok, r->body, (int) r->len) :
	    NULL;
	bool ok = in != NULL &&
	    json_tokener_get_error(tok) == json_tokener_success &&
	    json_object_is_type(in, json_type_object);
	json_tokener_free(tok);
	enum MHD_Result ret;
	if (!ok)
		ret = send_error(d, c, 400, "the body is not a JSON object");
	else if (is_acquire)
		ret = acquire(d, c, in);
	else
		ret = settle(d, c, in);
	json_object_put(in);
	return ret;
}

/* Ready: decisions follow allotd's allocation (the agent was welcomed
 * and is not in fallback: within its lease an outage changes nothing
 * it decides), or there is no allotd to follow. A load balancer or
 * Kubernetes holds traffic back from a sidecar that is not. */
static enum MHD_Result
ready(struct agentd *d, struct MHD_Connection *c)
{
	allot_sync_stats ss;
	allot_sync_stats_get(d->agent, &ss);
	const char *why = !ss.enabled ? NULL :
	    ss.in_fallback            ? "in fallback: allotd unreachable "
	                                "for longer than the lease\n" :
	    ss.registers == 0         ? "not synced with allotd yet\n" :
	                                NULL;
	if (why == NULL)
		return send_text(c, 200, "text/plain", "ready\n", 6);
	return send_text(c, 503, "text/plain", why, strlen(why));
}

static enum MHD_Result
get(struct agentd *d, struct MHD_Connection *c, const char *url)
{
	if (strcmp(url, "/v1/remaining") == 0)
		return remaining(d, c);
	if (strcmp(url, "/healthz") == 0)
		return send_text(c, 200, "text/plain", "ok\n", 3);
	if (strcmp(url, "/readyz") == 0)
		return ready(d, c);
	if (strcmp(url, "/metrics") == 0) {
		size_t len;
		char *text = agentd_metrics(d, &len);
		if (text == NULL)
			return send_error(d, c, 500, "out of memory");
		enum MHD_Result ret = send_text(
		    c, 200, "text/plain; version=0.0.4", text, len);
		free(text);
		return ret;
	}
	return send_error(d, c, 404, "no such endpoint");
}

static enum MHD_Result
handle(void *cls, struct MHD_Connection *c, const char *url,
    const char *method, const char *version, const char *upload,
    size_t *upload_size, void **con_cls)
{
	struct listener *l = cls;
	struct agentd *d = l->d;
	bool is_post = strcmp(method, "POST") == 0;
	if (*con_cls == NULL) {
		atomic_fetch_add(&d->n.http_calls, 1);
		http_room_busy(l->room, c, true);
		if (l->ops_only &&
		    (is_post ||
		        (strcmp(url, "/metrics") != 0 &&
		            strcmp(url, "/healthz") != 0 &&
		            strcmp(url, "/readyz") != 0)))
			return send_error(d, c, 404,
			    "this listener (--metrics-listen) serves GET "
			    "/metrics, /healthz and /readyz only");
		if (!is_post) {
			if (strcmp(method, "GET") != 0)
				return send_error(d, c, 405, "GET or POST");
			return get(d, c, url);
		}
		struct req *r = malloc(sizeof *r);
		if (r == NULL)
			return MHD_NO;
		r->len = 0;
		r->too_big = false;
		*con_cls = r;
		return MHD_YES;
	}
	struct req *r = *con_cls;
	if (*upload_size > 0) {
		if (r->len + *upload_size > BODY_MAX)
			r->too_big = true;
		else
			memcpy(r->body + r->len, upload, *upload_size);
		if (!r->too_big)
			r->len += *upload_size;
		*upload_size = 0;
		return MHD_YES;
	}
	return post(d, c, url, r);
}

static void
completed(void *cls, struct MHD_Connection *c, void **con_cls,
    enum MHD_RequestTerminationCode toe)
{
	struct listener *l = cls;
	http_room_busy(l->room, c, false);
	free(*con_cls);
	*con_cls = NULL;
}

static int
start(struct listener *l, struct agentd *d, unsigned flags, int fd,
    const struct sockaddr *sa)
{
	l->d = d;
	l->room = http_room_new(d, d->o.max_connections);
	if (l->room == NULL)
		return -1;
	/* A thread per connection: a caller keeps its connection open and
	 * makes one call at a time, and a thread blocked in read answers
	 * it with no poller between (half the latency of a thread pool,
	 * twice the throughput, bench/run sidecar). --max-connections
	 * bounds the threads (http_room.c); their stacks are small. */
	flags |= MHD_USE_INTERNAL_POLLING_THREAD |
	    MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL | MHD_USE_TURBO;
	l->mhd = MHD_start_daemon(flags, 0, NULL, NULL, handle, l,
	    fd >= 0 ? MHD_OPTION_LISTEN_SOCKET : MHD_OPTION_SOCK_ADDR,
	    fd >= 0 ? (void *) (intptr_t) fd : (void *) sa,
	    MHD_OPTION_THREAD_STACK_SIZE, (size_t) HTTP_STACK,
	    MHD_OPTION_CONNECTION_LIMIT,
	    (unsigned) d->o.max_connections + MHD_LIMIT_SLACK,
	    MHD_OPTION_CONNECTION_TIMEOUT, (unsigned) d->o.idle_timeout_s,
	    MHD_OPTION_NOTIFY_CONNECTION, http_room_notify, l->room,
	    MHD_OPTION_NOTIFY_COMPLETED, completed, l, MHD_OPTION_END);
	return l->mhd != NULL ? 0 : -1;
}

static int
uds_listen(struct agentd *d, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof sa.sun_path)
		return -1;
	strcpy(sa.sun_path, path);
	struct stat st;
	/* A socket left by an earlier run; never any other file. */
	if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
		unlink(path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *) &sa, sizeof sa) != 0 ||
	    listen(fd, 1024) != 0) {
		agentd_log(d, 3, "AGENTD-LISTEN", "unix:%s: %s", path,
		    strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

/* Serve `l` on the TCP address `addr` (HOST:PORT; "none" or empty:
 * not at all); the port bound into *port. */
static int
start_tcp(
    struct listener *l, struct agentd *d, const char *addr, unsigned *port)
{
	if (addr == NULL || addr[0] == '\0' || strcmp(addr, "none") == 0)
		return ALLOT_OK;
	char host[256];
	const char *colon = strrchr(addr, ':');
	if (colon == NULL || (size_t) (colon - addr) >= sizeof host)
		return ALLOT_EINVAL;
	memcpy(host, addr, (size_t) (colon - addr));
	host[colon - addr] = '\0';
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM,
		.ai_flags = AI_NUMERICSERV | AI_PASSIVE },
	                *res;
	if (getaddrinfo(host, colon + 1, &hints, &res) != 0)
		return ALLOT_EINVAL;
	int rc = start(l, d, res->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0, -1,
	    res->ai_addr);
	freeaddrinfo(res);
	if (rc != 0) {
		agentd_log(d, 3, "AGENTD-LISTEN", "cannot serve on %s", addr);
		return ALLOT_EIO;
	}
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(
	    l->mhd, MHD_DAEMON_INFO_BIND_PORT);
	*port = di != NULL ? di->port : 0;
	return ALLOT_OK;
}

int
http_api_start(struct agentd *d, struct http_api **ret)
{
	struct http_api *h = calloc(1, sizeof *h);
	if (h == NULL)
		return ALLOT_ENOMEM;
	h->d = d;
	h->uds_fd = -1;
	h->ops.ops_only = true;
	int rc = start_tcp(&h->tcp, d, d->o.http_listen, &h->port);
	if (rc == ALLOT_OK)
		rc = start_tcp(&h->ops, d, d->o.metrics_listen, &h->ops_port);
	if (rc != ALLOT_OK)
		return rc;
	if (d->o.http_socket != NULL) {
		h->uds_fd = uds_listen(d, d->o.http_socket);
		if (h->uds_fd < 0)
			return ALLOT_EIO;
		if (start(&h->uds, d, 0, h->uds_fd, NULL) != 0)
			return ALLOT_EIO;
	}
	*ret = h;
	return ALLOT_OK;
}

unsigned
http_api_port(const struct http_api *h)
{
	return h->port;
}

unsigned
http_api_ops_port(const struct http_api *h)
{
	return h->ops_port;
}

void
http_api_stop(struct http_api *h)
{
	if (h == NULL)
		return;
	if (h->tcp.mhd != NULL)
		MHD_stop_daemon(h->tcp.mhd);
	if (h->ops.mhd != NULL)
		MHD_stop_daemon(h->ops.mhd);
	if (h->uds.mhd != NULL) {
		MHD_stop_daemon(h->uds.mhd);
		unlink(h->d->o.http_socket);
	}
	http_room_free(h->tcp.room);
	http_room_free(h->ops.room);
	http_room_free(h->uds.room);
	if (h->uds_fd >= 0)
		close(h->uds_fd);
	free(h);
}
