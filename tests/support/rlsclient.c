/* SPDX-License-Identifier: MIT */
/*
 * The gRPC client of rlsclient.h: an nghttp2 client session on a
 * blocking loopback socket driven by poll(). Requests are submitted
 * while fewer than the window are in flight; responses are collected
 * per stream (body and grpc-status trailer) and reported when the
 * stream closes.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <nghttp2/nghttp2.h>

#include "proc.h"
#include "rlsclient.h"
#include "rls.pb-c.h"

struct rlsc {
	int fd;
	nghttp2_session *h2;
	rlsc_done_fn done;
	void *ctx;
	size_t inflight, completed, refused, exhausted;
	size_t partial; /* rlsc_flood's bytes per stream */
	bool dead;
	const uint8_t *body;
	size_t body_len;
};

struct call {
	uint64_t start_ns;
	int status;
	uint8_t buf[4096];
	size_t len;
	size_t off; /* of the request body sent */
};

static int
on_header(nghttp2_session *h2, const nghttp2_frame *f, const uint8_t *name,
    size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
    void *user)
{
	rlsc *c = user;
	struct call *call = nghttp2_session_get_stream_user_data(
	    h2, f->hd.stream_id);
	if (namelen != 11 || memcmp(name, "grpc-status", 11) != 0)
		return 0;
	if (call != NULL)
		call->status = atoi((const char *) value);
	else if (atoi((const char *) value) == 8)
		c->exhausted++;
	return 0;
}

static int
on_data(nghttp2_session *h2, uint8_t flags, int32_t id, const uint8_t *data,
    size_t len, void *user)
{
	struct call *call = nghttp2_session_get_stream_user_data(h2, id);
	if (call != NULL && call->len + len <= sizeof call->buf) {
		memcpy(call->buf + call->len, data, len);
		call->len += len;
	}
	return 0;
}

static int
on_close(nghttp2_session *h2, int32_t id, uint32_t err, void *user)
{
	rlsc *c = user;
	struct call *call = nghttp2_session_get_stream_user_data(h2, id);
	if (err == NGHTTP2_REFUSED_STREAM)
		c->refused++;
	if (call == NULL)
		return 0;
	uint64_t lat = pc_now_ns() - call->start_ns;
	if (c->done != NULL)
		c->done(c->ctx, call->status,
		    call->len >= 5 ? call->buf + 5 : NULL,
		    call->len >= 5 ? call->len - 5 : 0, lat);
	c->inflight--;
	c->completed++;
	free(call);
	return 0;
}

rlsc *
rlsc_connect(int port)
{
	rlsc *c = calloc(1, sizeof *c);
	if (c == NULL)
		return NULL;
	c->fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET,
		.sin_port = htons((uint16_t) port) };
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int one = 1;
	setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	if (connect(c->fd, (struct sockaddr *) &sa, sizeof sa) != 0) {
		close(c->fd);
		free(c);
		return NULL;
	}
	nghttp2_session_callbacks *cbs;
	nghttp2_session_callbacks_new(&cbs);
	nghttp2_session_callbacks_set_on_header_callback(cbs, on_header);
	nghttp2_session_callbacks_set_on_data_chunk_recv_callback(
	    cbs, on_data);
	nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_close);
	nghttp2_option *opt;
	nghttp2_option_new(&opt);
	/* Let the flood go past the server's limit before its SETTINGS
	 * arrive: the server must refuse, not trust the client. */
	nghttp2_option_set_peer_max_concurrent_streams(opt, 1u << 30);
	nghttp2_session_client_new2(&c->h2, cbs, c, opt);
	nghttp2_option_del(opt);
	nghttp2_session_callbacks_del(cbs);
	nghttp2_settings_entry iv[] = {
		{ NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20 },
	};
	nghttp2_submit_settings(c->h2, NGHTTP2_FLAG_NONE, iv, 1);
	return c;
}

void
rlsc_close(rlsc *c)
{
	if (c == NULL)
		return;
	nghttp2_session_del(c->h2);
	close(c->fd);
	free(c);
}

static int
send_all(rlsc *c, const uint8_t *data, size_t n)
{
	for (size_t off = 0; off < n;) {
		ssize_t w = send(c->fd, data + off, n - off, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			c->dead = true;
			return -1;
		}
		off += (size_t) w;
	}
	return 0;
}

/* Send what nghttp2 has queued in one write, as a proxy batches its
 * frames: a request's HEADERS and DATA arrive together. */
static void
pump_out(rlsc *c)
{
	uint8_t buf[65536];
	size_t len = 0;
	for (;;) {
		const uint8_t *data;
		ssize_t n = nghttp2_session_mem_send(c->h2, &data);
		if (n < 0) {
			c->dead = true;
			return;
		}
		if (n > 0 && len + (size_t) n <= sizeof buf) {
			memcpy(buf + len, data, (size_t) n);
			len += (size_t) n;
			continue;
		}
		if (len > 0 && send_all(c, buf, len) != 0)
			return;
		len = 0;
		if (n == 0)
			return;
		if (send_all(c, data, (size_t) n) != 0)
			return;
	}
}

/* Read what arrived within `ms`; false when the connection is gone. */
static bool
pump_in(rlsc *c, int ms)
{
	struct pollfd p = { c->fd, POLLIN, 0 };
	if (poll(&p, 1, ms) <= 0)
		return true;
	uint8_t buf[65536];
	ssize_t n = recv(c->fd, buf, sizeof buf, 0);
	if (n <= 0 || nghttp2_session_mem_recv(c->h2, buf, (size_t) n) < 0) {
		c->dead = true;
		return false;
	}
	return true;
}

static ssize_t
read_req(nghttp2_session *h2, int32_t id, uint8_t *buf, size_t len,
    uint32_t *flags, nghttp2_data_source *src, void *user)
{
	rlsc *c = user;
	struct call *call = src->ptr;
	size_t n = c->body_len - call->off;
	if (n > len)
		n = len;
	memcpy(buf, c->body + call->off, n);
	call->off += n;
	if (call->off == c->body_len)
		*flags |= NGHTTP2_DATA_FLAG_EOF;
	return (ssize_t) n;
}

/* A flood stream's body: `partial` zero bytes, the stream left open. */
static ssize_t
read_partial(nghttp2_session *h2, int32_t id, uint8_t *buf, size_t len,
    uint32_t *flags, nghttp2_data_source *src, void *user)
{
	rlsc *c = user;
	size_t n = c->partial < len ? c->partial : len;
	memset(buf, 0, n);
	/* One frame per stream is enough to hold the server's memory. */
	*flags |= NGHTTP2_DATA_FLAG_EOF | NGHTTP2_DATA_FLAG_NO_END_STREAM;
	return (ssize_t) n;
}

static int
submit(rlsc *c, const char *path, bool end)
{
	if (!end) {
		/* Streams of a flood carry nothing to free. */
		nghttp2_nv nv[] = {
			{ (uint8_t *) ":method", (uint8_t *) "POST", 7, 4, 0 },
			{ (uint8_t *) ":scheme", (uint8_t *) "http", 7, 4, 0 },
			{ (uint8_t *) ":authority", (uint8_t *) "localhost",
			    10, 9, 0 },
			{ (uint8_t *) ":path", (uint8_t *) path, 5,
			    strlen(path), 0 },
			{ (uint8_t *) "content-type",
			    (uint8_t *) "application/grpc", 12, 16, 0 },
		};
		nghttp2_data_provider prd = { .read_callback = read_partial };
		int32_t id = c->partial > 0 ?
		    nghttp2_submit_request(c->h2, NULL, nv, 5, &prd, NULL) :
		    nghttp2_submit_headers(c->h2, 0, -1, NULL, nv, 5, NULL);
		return id < 0 ? -1 : 0;
	}
	struct call *call = calloc(1, sizeof *call);
	if (call == NULL)
		return -1;
	call->status = -1;
	call->start_ns = pc_now_ns();
	nghttp2_nv nv[] = {
		{ (uint8_t *) ":method", (uint8_t *) "POST", 7, 4, 0 },
		{ (uint8_t *) ":scheme", (uint8_t *) "http", 7, 4, 0 },
		{ (uint8_t *) ":authority", (uint8_t *) "localhost", 10, 9,
		    0 },
		{ (uint8_t *) ":path", (uint8_t *) path, 5, strlen(path), 0 },
		{ (uint8_t *) "content-type", (uint8_t *) "application/grpc",
		    12, 16, 0 },
		{ (uint8_t *) "te", (uint8_t *) "trailers", 2, 8, 0 },
	};
	nghttp2_data_provider prd = { .source.ptr = call,
		.read_callback = read_req };
	int32_t id = nghttp2_submit_request(c->h2, NULL, nv, 6, &prd, call);
	if (id < 0) {
		free(call);
		return -1;
	}
	c->inflight++;
	return 0;
}

size_t
rlsc_run(rlsc *c, const char *path, const uint8_t *body, size_t len, size_t n,
    size_t window, rlsc_done_fn done, void *ctx)
{
	c->done = done;
	c->ctx = ctx;
	c->body = body;
	c->body_len = len;
	c->completed = 0;
	size_t sent = 0;
	while (c->completed < n && !c->dead) {
		while (sent < n && c->inflight < window) {
			if (submit(c, path, true) != 0)
				return c->completed;
			sent++;
		}
		pump_out(c);
		if (!pump_in(c, 5000))
			break;
	}
	return c->completed;
}

int
rlsc_flood(rlsc *c, size_t n, size_t partial, int wait_ms, size_t *ret_refused,
    size_t *ret_exhausted)
{
	c->done = NULL;
	c->refused = 0;
	c->exhausted = 0;
	c->partial = partial;
	for (size_t i = 0; i < n; i++)
		if (submit(c, RLSC_PATH, false) != 0)
			return -1;
	pump_out(c);
	uint64_t end = pc_now_ns() + (uint64_t) wait_ms * 1000000u;
	while (!c->dead && pc_now_ns() < end) {
		pump_in(c, 50);
		pump_out(c);
	}
	*ret_refused = c->refused;
	*ret_exhausted = c->exhausted;
	return c->dead ? -1 : 0;
}

uint8_t *
rlsc_request(
    const char *identity, const char *endpoint, uint32_t hits, size_t *ret_len)
{
	Envoy__Extensions__Common__Ratelimit__V3__RateLimitDescriptor__Entry
	    e[2] = {
		    ENVOY__EXTENSIONS__COMMON__RATELIMIT__V3__RATE_LIMIT_DESCRIPTOR__ENTRY__INIT,
		    ENVOY__EXTENSIONS__COMMON__RATELIMIT__V3__RATE_LIMIT_DESCRIPTOR__ENTRY__INIT
	    };
	Envoy__Extensions__Common__Ratelimit__V3__RateLimitDescriptor__Entry
	    *ep[2] = { &e[0], &e[1] };
	e[0].key = (char *) "caller";
	e[0].value = (char *) identity;
	e[1].key = (char *) "endpoint";
	e[1].value = (char *) endpoint;
	Envoy__Extensions__Common__Ratelimit__V3__RateLimitDescriptor d =
	    ENVOY__EXTENSIONS__COMMON__RATELIMIT__V3__RATE_LIMIT_DESCRIPTOR__INIT;
	Envoy__Extensions__Common__Ratelimit__V3__RateLimitDescriptor *dp = &d;
	d.n_entries = 2;
	d.entries = ep;
	Envoy__Service__Ratelimit__V3__RateLimitRequest r =
	    ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_REQUEST__INIT;
	r.domain = (char *) "allot";
	r.n_descriptors = 1;
	r.descriptors = &dp;
	r.hits_addend = hits;
	size_t n =
	    envoy__service__ratelimit__v3__rate_limit_request__get_packed_size(
	        &r);
	uint8_t *buf = malloc(n + 5);
	if (buf == NULL)
		return NULL;
	envoy__service__ratelimit__v3__rate_limit_request__pack(&r, buf + 5);
	buf[0] = 0;
	buf[1] = (uint8_t) (n >> 24);
	buf[2] = (uint8_t) (n >> 16);
	buf[3] = (uint8_t) (n >> 8);
	buf[4] = (uint8_t) n;
	*ret_len = n + 5;
	return buf;
}
