/* SPDX-License-Identifier: MIT */
/*
 * The gRPC listener: Envoy's ShouldRateLimit over HTTP/2, cleartext
 * (h2c with prior knowledge, as Envoy and grpcio speak it) or TLS
 * (GnuTLS, ALPN "h2"). nghttp2 does the HTTP/2 framing, flow control and
 * HPACK; this file is the small gRPC layer above it (the 5-byte message
 * prefix, application/grpc, grpc-status and grpc-message trailers) and
 * the connections below it: --grpc-threads workers, each an epoll loop
 * owning its connections, all accepting from one listening socket.
 *
 * Everything a client controls is bounded: connections (beyond
 * --max-connections an accepted socket is closed at once), streams per
 * connection (SETTINGS_MAX_CONCURRENT_STREAMS; nghttp2 refuses the rest
 * with REFUSED_STREAM), header bytes per stream, message size (a larger
 * body is answered RESOURCE_EXHAUSTED as soon as it is seen, and its
 * further bytes dropped), request bytes held per connection, and idle
 * time. A protocol error ends the
 * connection with GOAWAY (nghttp2 writes it); a bad request ends only its
 * stream with a gRPC status. Idle connections cannot hold the daemon's
 * capacity for the whole idle timeout: when the connection table is full,
 * or the process is out of descriptors, a new connection takes the place
 * of the one quiet the longest with no stream open (evict_idle()); when
 * there is none, a worker out of descriptors stops watching the listener
 * for a moment (accept_pause()) rather than spinning on it. A worker
 * touches only its own connections, so one that accepted a connection
 * for a full table while holding no idle connection itself hands it to
 * the worker whose idle one is the oldest (hand_over(): a pipe into that
 * worker's epoll set), which evicts it and serves the newcomer; each
 * worker publishes how long its oldest idle connection has been quiet
 * (publish_idle(), every TICK_MS). Idle means no stream open: a client
 * that only sends PINGs is idle too. Connections that never opened a
 * stream hold at most half the table, each worker its part: past that a
 * newcomer takes the place of the worker's oldest one, whatever its age
 * (evict_unproven()), so that a client that keeps opening connections
 * it never uses cannot keep every place younger than the idle second.
 *
 * Certificates rotate: grpc_server_check_certs() (the main thread, every
 * --cert-check-ms) loads the files again when they change and swaps the
 * credentials new handshakes use; connections already open keep theirs
 * (reference counted) until they close, so no session is dropped.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gnutls/gnutls.h>
#include <nghttp2/nghttp2.h>

#include "agentd.h"

#define RLS_PATH "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
/* gRPC's health checking protocol, as Kubernetes' gRPC probes and
 * Envoy's gRPC health checks call it. */
#define HEALTH_PATH "/grpc.health.v1.Health/Check"
#define GRPC_INVALID_ARGUMENT 3
#define GRPC_RESOURCE_EXHAUSTED 8
#define GRPC_UNIMPLEMENTED 12
#define GRPC_UNAVAILABLE 14
/* Header bytes (names and values) a stream may send. */
#define HEADER_BYTES_MAX 16384
/* Output gathered before one write, and the most a connection may have
 * waiting for a slow reader before it stops producing. */
#define OUT_BATCH 65536
#define TICK_MS 250
/* How long a connection with no stream open must have been quiet before
 * a new one may take its place (evict_idle()). */
#define EVICT_IDLE_MS 1000
/* Out of descriptors and nothing to evict: how long the listener leaves
 * the worker's epoll set (it is level-triggered, and would wake the
 * worker at once to fail the same way). */
#define ACCEPT_PAUSE_MS 100
/* Request bytes one connection may hold at once, across its streams, in
 * messages of the largest size: what bounds a client that opens every
 * stream it may and sends each a message it never ends. */
#define CONN_IN_MESSAGES 16

/* Reference-counted TLS credentials: the current ones, and older ones
 * that connections opened before a rotation still use. */
struct creds {
	gnutls_certificate_credentials_t c;
	unsigned refs; /* under grpc_server.tls_mu */
};

struct conn;

struct worker {
	struct grpc_server *g;
	pthread_t thread;
	int ep;
	struct conn *conns; /* doubly linked, for the idle scan */
	uint64_t paused_until_ms; /* the listener is out of ep until then;
	                             0: it is in */
	/* Accepted sockets other workers hand over (hand_over()): written
	 * by them, read by this worker (in ep, data.ptr == the worker). */
	int hand[2];
	/* When its oldest connection with no stream open went quiet, as of
	 * the last publish_idle(); 0: none. Read by the other workers. */
	_Atomic uint64_t idle_since;
	uint64_t published_ms;
	/* Its connections that never opened a stream: at most
	 * unproven_max() (conn_open()). */
	unsigned unproven;
};

struct grpc_server {
	struct agentd *d;
	int lfd;
	unsigned port;
	struct worker *workers;
	size_t nworkers;
	atomic_bool stop;
	atomic_uint nconns;
	nghttp2_session_callbacks *cbs;
	nghttp2_option *h2opt;
	bool tls; /* set before the workers start, then read-only */
	pthread_mutex_t tls_mu;
	struct creds *creds; /* under tls_mu; NULL: cleartext */
	struct stat cert_st, key_st; /* of the files loaded */
};

struct conn {
	struct worker *w;
	struct conn *prev, *next;
	int fd;
	gnutls_session_t tls;
	struct creds *creds;
	bool handshaken;
	bool tls_retry; /* the last gnutls_record_send said AGAIN */
	bool want_out; /* EPOLLOUT is on */
	nghttp2_session *h2;
	struct stream *streams; /* freed with the connection if still open */
	size_t in_bytes; /* request bytes its streams hold */
	uint8_t *out;
	size_t out_len, out_off, out_cap;
	uint64_t last_ms; /* of the last I/O, for the idle timeout */
	/* When it last had a stream open (or opened): idle since then if
	 * none is open now. PINGs and SETTINGS do not count, so a client
	 * that only pings is as idle as one that is silent. */
	uint64_t quiet_since;
	bool proven; /* it opened a stream (unproven: worker.unproven) */
};

struct stream {
	struct stream *prev, *next; /* the connection's open streams */
	uint8_t *in;
	size_t in_len;
	size_t header_bytes;
	enum { M_NONE, M_RLS, M_HEALTH } method;
	bool post, ct_ok, answered;
	uint8_t *body;
	size_t body_len, body_off;
	char status[12];
};

/* ---------------------------------------------------------------- */
/* Responses                                                        */
/* ---------------------------------------------------------------- */

#define NV(n, v)                                                            \
	{                                                                   \
		(uint8_t *) (n), (uint8_t *) (v), sizeof(n) - 1, strlen(v), \
		    NGHTTP2_NV_FLAG_NO_COPY_NAME                            \
	}

/* A response with no message: the status in the headers, which end the
 * stream (gRPC's "trailers-only" form). */
static void
answer_status(struct agentd *d, nghttp2_session *h2, int32_t id,
    struct stream *st, int code, const char *msg)
{
	if (st != NULL)
		st->answered = true;
	atomic_fetch_add(&d->n.grpc_errors, 1);
	char c[12];
	snprintf(c, sizeof c, "%d", code);
	nghttp2_nv nv[] = { NV(":status", "200"),
		NV("content-type", "application/grpc"), NV("grpc-status", c),
		NV("grpc-message", msg) };
	nghttp2_submit_response(h2, id, nv, 4, NULL);
}

static ssize_t
read_body(nghttp2_session *h2, int32_t id, uint8_t *buf, size_t len,
    uint32_t *flags, nghttp2_data_source *src, void *user)
{
	struct stream *st = src->ptr;
	size_t n = st->body_len - st->body_off;
	if (n > len)
		n = len;
	memcpy(buf, st->body + st->body_off, n);
	st->body_off += n;
	if (st->body_off == st->body_len) {
		/* The trailers end the stream, not the data. */
		*flags |= NGHTTP2_DATA_FLAG_EOF |
		    NGHTTP2_DATA_FLAG_NO_END_STREAM;
		nghttp2_nv tr[] = { NV("grpc-status", "0") };
		nghttp2_submit_trailer(h2, id, tr, 1);
	}
	return (ssize_t) n;
}

/* The one message of a unary call, without its prefix; NULL with the
 * stream answered when the envelope is wrong. */
static const uint8_t *
message_of(struct agentd *d, nghttp2_session *h2, int32_t id,
    struct stream *st, uint32_t *ret_len)
{
	if (!st->ct_ok) {
		st->answered = true;
		nghttp2_nv nv[] = { NV(":status", "415") };
		nghttp2_submit_response(h2, id, nv, 1, NULL);
		return NULL;
	}
	if (!st->post || st->method == M_NONE) {
		answer_status(d, h2, id, st, GRPC_UNIMPLEMENTED,
		    "unknown method: allot-agentd serves " RLS_PATH);
		return NULL;
	}
	if (st->in_len < 5) {
		answer_status(d, h2, id, st, GRPC_INVALID_ARGUMENT,
		    "no request message");
		return NULL;
	}
	uint32_t len = (uint32_t) st->in[1] << 24 |
	    (uint32_t) st->in[2] << 16 | (uint32_t) st->in[3] << 8 | st->in[4];
	if (st->in[0] != 0) {
		answer_status(d, h2, id, st, GRPC_UNIMPLEMENTED,
		    "compressed messages are not supported");
		return NULL;
	}
	if ((size_t) len + 5 != st->in_len) {
		answer_status(d, h2, id, st, GRPC_INVALID_ARGUMENT,
		    "the body is not one length-prefixed message");
		return NULL;
	}
	*ret_len = len;
	return st->in + 5;
}

/* HealthCheckResponse{status: SERVING}: the daemon answers, so it
 * serves (whatever service the request names). */
static int
health(struct stream *st)
{
	static const uint8_t serving[] = { 0x08, 0x01 };
	st->body = malloc(5 + sizeof serving);
	if (st->body == NULL)
		return GRPC_RESOURCE_EXHAUSTED;
	memcpy(st->body + 5, serving, sizeof serving);
	st->body_len = 5 + sizeof serving;
	return 0;
}

/* The request is complete: check its envelope, decide, answer. */
static void
serve(struct agentd *d, nghttp2_session *h2, int32_t id, struct stream *st)
{
	if (st->answered)
		return;
	atomic_fetch_add(&d->n.grpc_calls, 1);
	uint32_t len;
	const uint8_t *req = message_of(d, h2, id, st, &len);
	if (req == NULL)
		return;
	char msg[160] = "out of memory";
	int code = st->method == M_HEALTH ?
	    health(st) :
	    agentd_rls(d->agent, &d->map, req, len, &st->body, &st->body_len,
	        msg, sizeof msg);
	if (code != 0) {
		answer_status(d, h2, id, st, code, msg);
		return;
	}
	size_t n = st->body_len - 5;
	st->body[0] = 0;
	st->body[1] = (uint8_t) (n >> 24);
	st->body[2] = (uint8_t) (n >> 16);
	st->body[3] = (uint8_t) (n >> 8);
	st->body[4] = (uint8_t) n;
	st->answered = true;
	nghttp2_nv nv[] = { NV(":status", "200"),
		NV("content-type", "application/grpc") };
	nghttp2_data_provider prd = { .source.ptr = st,
		.read_callback = read_body };
	nghttp2_submit_response(h2, id, nv, 2, &prd);
}

/* ---------------------------------------------------------------- */
/* nghttp2 callbacks                                                */
/* ---------------------------------------------------------------- */

static int
on_begin_headers(nghttp2_session *h2, const nghttp2_frame *f, void *user)
{
	if (f->hd.type != NGHTTP2_HEADERS ||
	    f->headers.cat != NGHTTP2_HCAT_REQUEST)
		return 0;
	struct conn *c = user;
	struct stream *st = calloc(1, sizeof *st);
	if (st == NULL)
		return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
	c->quiet_since = agentd_now_ms();
	if (!c->proven) {
		c->proven = true;
		c->w->unproven--;
	}
	st->next = c->streams;
	if (c->streams != NULL)
		c->streams->prev = st;
	c->streams = st;
	nghttp2_session_set_stream_user_data(h2, f->hd.stream_id, st);
	return 0;
}

static bool
eq(const uint8_t *a, size_t alen, const char *b)
{
	return alen == strlen(b) && memcmp(a, b, alen) == 0;
}

static int
on_header(nghttp2_session *h2, const nghttp2_frame *f, const uint8_t *name,
    size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
    void *user)
{
	struct stream *st = nghttp2_session_get_stream_user_data(
	    h2, f->hd.stream_id);
	if (st == NULL || f->hd.type != NGHTTP2_HEADERS)
		return 0;
	st->header_bytes += namelen + valuelen;
	if (st->header_bytes > HEADER_BYTES_MAX)
		return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* RST_STREAM */
	if (eq(name, namelen, ":path"))
		st->method = eq(value, valuelen, RLS_PATH) ? M_RLS :
		    eq(value, valuelen, HEALTH_PATH)       ? M_HEALTH :
		                                             M_NONE;
	else if (eq(name, namelen, ":method"))
		st->post = eq(value, valuelen, "POST");
	else if (eq(name, namelen, "content-type"))
		st->ct_ok = valuelen >= 16 &&
		    memcmp(value, "application/grpc", 16) == 0 &&
		    (valuelen == 16 || value[16] == '+' || value[16] == ';');
	return 0;
}

static int
on_data(nghttp2_session *h2, uint8_t flags, int32_t id, const uint8_t *data,
    size_t len, void *user)
{
	struct conn *c = user;
	struct agentd *d = c->w->g->d;
	struct stream *st = nghttp2_session_get_stream_user_data(h2, id);
	if (st == NULL || st->answered)
		return 0;
	size_t max = (size_t) d->o.max_message + 5;
	char msg[96];
	msg[0] = '\0';
	if (st->in_len + len > max)
		snprintf(msg, sizeof msg,
		    "request message above %" PRIu32 " bytes",
		    d->o.max_message);
	else if (c->in_bytes + len > CONN_IN_MESSAGES * max)
		snprintf(msg, sizeof msg,
		    "too many request bytes in flight on this connection");
	if (msg[0] != '\0') {
		answer_status(d, h2, id, st, GRPC_RESOURCE_EXHAUSTED, msg);
		c->in_bytes -= st->in_len;
		free(st->in);
		st->in = NULL;
		st->in_len = 0;
		return 0;
	}
	uint8_t *p = realloc(st->in, st->in_len + len);
	if (p == NULL) {
		answer_status(
		    d, h2, id, st, GRPC_RESOURCE_EXHAUSTED, "out of memory");
		return 0;
	}
	memcpy(p + st->in_len, data, len);
	st->in = p;
	st->in_len += len;
	c->in_bytes += len;
	return 0;
}

static int
on_frame(nghttp2_session *h2, const nghttp2_frame *f, void *user)
{
	if ((f->hd.type != NGHTTP2_HEADERS && f->hd.type != NGHTTP2_DATA) ||
	    !(f->hd.flags & NGHTTP2_FLAG_END_STREAM))
		return 0;
	struct stream *st = nghttp2_session_get_stream_user_data(
	    h2, f->hd.stream_id);
	if (st != NULL)
		serve(
		    ((struct conn *) user)->w->g->d, h2, f->hd.stream_id, st);
	return 0;
}

static void
stream_free(struct conn *c, struct stream *st)
{
	c->quiet_since = agentd_now_ms();
	if (st->prev != NULL)
		st->prev->next = st->next;
	else
		c->streams = st->next;
	if (st->next != NULL)
		st->next->prev = st->prev;
	c->in_bytes -= st->in_len;
	free(st->in);
	free(st->body);
	free(st);
}

static int
on_close(nghttp2_session *h2, int32_t id, uint32_t err, void *user)
{
	struct stream *st = nghttp2_session_get_stream_user_data(h2, id);
	if (st != NULL) {
		nghttp2_session_set_stream_user_data(h2, id, NULL);
		stream_free(user, st);
	}
	return 0;
}

/* ---------------------------------------------------------------- */
/* Connections                                                      */
/* ---------------------------------------------------------------- */

static void
creds_put(struct grpc_server *g, struct creds *c)
{
	if (c == NULL)
		return;
	pthread_mutex_lock(&g->tls_mu);
	bool last = --c->refs == 0;
	pthread_mutex_unlock(&g->tls_mu);
	if (last) {
		gnutls_certificate_free_credentials(c->c);
		free(c);
	}
}

static void
conn_close(struct conn *c)
{
	struct worker *w = c->w;
	if (c->prev != NULL)
		c->prev->next = c->next;
	else
		w->conns = c->next;
	if (c->next != NULL)
		c->next->prev = c->prev;
	epoll_ctl(w->ep, EPOLL_CTL_DEL, c->fd, NULL);
	nghttp2_session_del(c->h2); /* calls no stream-close callbacks */
	while (c->streams != NULL)
		stream_free(c, c->streams);
	if (c->tls != NULL)
		gnutls_deinit(c->tls);
	creds_put(w->g, c->creds);
	close(c->fd);
	free(c->out);
	w->unproven -= !c->proven;
	free(c);
	atomic_fetch_sub(&w->g->nconns, 1);
}

static void
want_out(struct conn *c, bool on)
{
	if (c->want_out == on)
		return;
	/* While answers wait for a slow reader, read no more requests:
	 * the reader's own backlog is what stops it. */
	struct epoll_event ev = { .events = on ? EPOLLOUT : EPOLLIN,
		.data.ptr = c };
	epoll_ctl(c->w->ep, EPOLL_CTL_MOD, c->fd, &ev);
	c->want_out = on;
}

/* Write what is buffered. Returns -1 on a dead connection, 0 when all
 * was written, 1 when the socket is full. */
static int
write_out(struct conn *c)
{
	while (c->out_off < c->out_len) {
		ssize_t n;
		if (c->tls != NULL) {
			n = c->tls_retry ?
			    gnutls_record_send(c->tls, NULL, 0) :
			    gnutls_record_send(c->tls, c->out + c->out_off,
			        c->out_len - c->out_off);
			c->tls_retry = n == GNUTLS_E_AGAIN ||
			    n == GNUTLS_E_INTERRUPTED;
			if (c->tls_retry)
				return 1;
			if (n < 0)
				return -1;
		} else {
			n = send(c->fd, c->out + c->out_off,
			    c->out_len - c->out_off, MSG_NOSIGNAL);
			if (n < 0 && (errno == EAGAIN || errno == EINTR))
				return 1;
			if (n < 0)
				return -1;
		}
		c->out_off += (size_t) n;
	}
	c->out_off = c->out_len = 0;
	return 0;
}

/* Gather nghttp2's output and write it, in batches. */
static int
flush(struct conn *c)
{
	for (;;) {
		int rc = write_out(c);
		if (rc != 0) {
			if (rc > 0)
				want_out(c, true);
			return rc < 0 ? -1 : 0;
		}
		while (c->out_len < OUT_BATCH) {
			const uint8_t *data;
			ssize_t n = nghttp2_session_mem_send(c->h2, &data);
			if (n < 0)
				return -1;
			if (n == 0)
				break;
			if (c->out_len + (size_t) n > c->out_cap) {
				size_t cap = c->out_len + (size_t) n +
				    OUT_BATCH;
				uint8_t *p = realloc(c->out, cap);
				if (p == NULL)
					return -1;
				c->out = p;
				c->out_cap = cap;
			}
			memcpy(c->out + c->out_len, data, (size_t) n);
			c->out_len += (size_t) n;
		}
		if (c->out_len == 0)
			break;
	}
	want_out(c, false);
	if (!nghttp2_session_want_read(c->h2) &&
	    !nghttp2_session_want_write(c->h2))
		return -1;
	return 0;
}

static ssize_t
read_in(struct conn *c, uint8_t *buf, size_t len)
{
	if (c->tls != NULL) {
		ssize_t n = gnutls_record_recv(c->tls, buf, len);
		if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED) {
			errno = EAGAIN;
			return -1;
		}
		return n < 0 ? 0 : n; /* a TLS error ends it as EOF would */
	}
	return recv(c->fd, buf, len, 0);
}

/* The connection is readable (or writable): returns false to close. */
static bool
conn_io(struct conn *c, uint32_t events)
{
	c->last_ms = agentd_now_ms();
	if (c->tls != NULL && !c->handshaken) {
		int rc = gnutls_handshake(c->tls);
		if (rc == GNUTLS_E_AGAIN || rc == GNUTLS_E_INTERRUPTED) {
			/* Blocked writing: wait until the socket drains. */
			want_out(c, gnutls_record_get_direction(c->tls) == 1);
			return true;
		}
		if (rc < 0)
			return false;
		c->handshaken = true;
	}
	if (events & EPOLLOUT) {
		if (flush(c) < 0)
			return false;
	}
	/* Records GnuTLS has already decrypted raise no epoll event: read
	 * them once the backlog that stopped reading is gone. */
	bool pending = c->tls != NULL && c->out_len == 0 &&
	    gnutls_record_check_pending(c->tls) > 0;
	if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && !pending)
		return true;
	uint8_t buf[16384];
	for (;;) {
		if (c->out_len > 0)
			break; /* backlogged: EPOLLOUT first */
		ssize_t n = read_in(c, buf, sizeof buf);
		if (n == 0)
			return false;
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				break;
			return false;
		}
		ssize_t rv = nghttp2_session_mem_recv(c->h2, buf, (size_t) n);
		if (rv < 0) {
			nghttp2_session_terminate_session(
			    c->h2, NGHTTP2_PROTOCOL_ERROR);
			flush(c);
			return false;
		}
		if (flush(c) < 0)
			return false;
		if ((size_t) n < sizeof buf && c->tls == NULL)
			break;
	}
	return flush(c) == 0;
}

static struct creds *
creds_get(struct grpc_server *g)
{
	pthread_mutex_lock(&g->tls_mu);
	struct creds *c = g->creds;
	if (c != NULL)
		c->refs++;
	pthread_mutex_unlock(&g->tls_mu);
	return c;
}

static bool
conn_tls(struct conn *c)
{
	struct grpc_server *g = c->w->g;
	c->creds = creds_get(g);
	if (gnutls_init(&c->tls, GNUTLS_SERVER | GNUTLS_NONBLOCK) < 0) {
		c->tls = NULL;
		return false;
	}
	static const gnutls_datum_t h2 = { (unsigned char *) "h2", 2 };
	gnutls_set_default_priority(c->tls);
	gnutls_credentials_set(c->tls, GNUTLS_CRD_CERTIFICATE, c->creds->c);
	gnutls_alpn_set_protocols(c->tls, &h2, 1, 0);
	gnutls_transport_set_int(c->tls, c->fd);
	return true;
}

/* This worker's connection with no stream open for the longest; NULL
 * when every one has a stream open. */
static struct conn *
oldest_idle(struct worker *w)
{
	struct conn *oldest = NULL;
	for (struct conn *c = w->conns; c != NULL; c = c->next)
		if (c->streams == NULL &&
		    (oldest == NULL || c->quiet_since < oldest->quiet_since))
			oldest = c;
	return oldest;
}

/* Publishes when this worker's oldest connection with no stream open
 * went quiet (worker.idle_since), for hand_over() in the others. */
static void
publish_idle(struct worker *w)
{
	struct conn *c = oldest_idle(w);
	atomic_store(&w->idle_since, c != NULL ? c->quiet_since : 0);
	w->published_ms = agentd_now_ms();
}

/* Close this worker's connection quiet the longest, if it has no stream
 * open and has been quiet for EVICT_IDLE_MS: room for a new one. False
 * when there is none. */
static bool
evict_idle(struct worker *w)
{
	struct conn *oldest = oldest_idle(w);
	if (oldest == NULL ||
	    agentd_now_ms() - oldest->quiet_since < EVICT_IDLE_MS)
		return false;
	atomic_fetch_add(&w->g->d->n.grpc_evicted_conns, 1);
	conn_close(oldest);
	publish_idle(w);
	return true;
}

/* The table is full and none of this worker's connections is idle:
 * hands the accepted socket `fd` to the worker whose idle connection
 * has been quiet the longest, at least EVICT_IDLE_MS, which evicts it
 * and opens this one (handed_in()). False when no worker has one, or
 * its pipe is full: the caller refuses the connection. */
static bool
hand_over(struct worker *w, int fd)
{
	struct grpc_server *g = w->g;
	uint64_t now = agentd_now_ms();
	struct worker *to = NULL;
	uint64_t best = 0;
	for (size_t i = 0; i < g->nworkers; i++) {
		struct worker *o = &g->workers[i];
		uint64_t t = atomic_load(&o->idle_since);
		if (o == w || t == 0 || now - t < EVICT_IDLE_MS)
			continue;
		if (to == NULL || t < best) {
			to = o;
			best = t;
		}
	}
	return to != NULL &&
	    write(to->hand[1], &fd, sizeof fd) == (ssize_t) sizeof fd;
}

/* How many connections that never opened a stream a worker keeps: its
 * part of half the table. A caller's first stream arrives right behind
 * its connect, while one that never opens any (a slowloris) is pushed
 * out by the next newcomers (as http_room.c does for HTTP). */
static unsigned
unproven_max(const struct grpc_server *g)
{
	unsigned n = g->d->o.max_connections / 2 / (unsigned) g->nworkers;
	return n > 0 ? n : 1;
}

/* This worker's oldest connection that never opened a stream, closed
 * when it keeps unproven_max() of them: a newcomer takes its place. */
static void
evict_unproven(struct worker *w)
{
	if (w->unproven < unproven_max(w->g))
		return;
	struct conn *oldest = NULL;
	for (struct conn *c = w->conns; c != NULL; c = c->next)
		if (!c->proven &&
		    (oldest == NULL || c->quiet_since < oldest->quiet_since))
			oldest = c;
	if (oldest == NULL)
		return;
	atomic_fetch_add(&w->g->d->n.grpc_evicted_conns, 1);
	conn_close(oldest);
	publish_idle(w);
}

/* A place in the connection table (--max-connections) for a new
 * connection, evicting an idle one when it is full. */
static bool
conn_slot(struct worker *w)
{
	struct grpc_server *g = w->g;
	unsigned max = g->d->o.max_connections;
	if (atomic_fetch_add(&g->nconns, 1) < max)
		return true;
	atomic_fetch_sub(&g->nconns, 1);
	if (!evict_idle(w))
		return false;
	if (atomic_fetch_add(&g->nconns, 1) < max)
		return true;
	atomic_fetch_sub(&g->nconns, 1);
	return false;
}

/* Serves the accepted socket `fd`, or hands it over (`may_hand`: it was
 * not handed to this worker already) or refuses it when the table is
 * full. */
static void
conn_open(struct worker *w, int fd, bool may_hand)
{
	struct grpc_server *g = w->g;
	struct agentd *d = g->d;
	evict_unproven(w);
	if (!conn_slot(w)) {
		if (may_hand && hand_over(w, fd))
			return;
		atomic_fetch_add(&d->n.grpc_refused_conns, 1);
		close(fd);
		return;
	}
	atomic_fetch_add(&d->n.grpc_conns, 1);
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	struct conn *c = calloc(1, sizeof *c);
	if (c == NULL) {
		close(fd);
		atomic_fetch_sub(&g->nconns, 1);
		return;
	}
	c->w = w;
	c->fd = fd;
	c->last_ms = c->quiet_since = agentd_now_ms();
	w->unproven++;
	c->next = w->conns;
	if (w->conns != NULL)
		w->conns->prev = c;
	w->conns = c;
	struct epoll_event ev = { .events = EPOLLIN, .data.ptr = c };
	nghttp2_settings_entry iv[] = {
		{ NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, d->o.max_streams },
		{ NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, HEADER_BYTES_MAX },
	};
	if (nghttp2_session_server_new2(&c->h2, g->cbs, c, g->h2opt) != 0 ||
	    nghttp2_submit_settings(c->h2, NGHTTP2_FLAG_NONE, iv, 2) != 0 ||
	    (g->tls && !conn_tls(c)) ||
	    epoll_ctl(w->ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
		conn_close(c);
		return;
	}
}

/* The listener out of this worker's epoll set for ACCEPT_PAUSE_MS. */
static void
accept_pause(struct worker *w)
{
	struct agentd *d = w->g->d;
	int e = errno;
	if (epoll_ctl(w->ep, EPOLL_CTL_DEL, w->g->lfd, NULL) != 0)
		return;
	w->paused_until_ms = agentd_now_ms() + ACCEPT_PAUSE_MS;
	if (atomic_fetch_add(&d->n.grpc_accept_pauses, 1) == 0)
		agentd_log(d, 4, "AGENTD-GRPC-ACCEPT",
		    "cannot accept a connection (%s) and none is idle to "
		    "make room: accepting again in %d ms (counted in "
		    "allot_agentd_grpc_accept_pauses_total; raise the "
		    "descriptor limit or lower --max-connections)",
		    strerror(e), ACCEPT_PAUSE_MS);
}

/* The listener back in the epoll set once its pause is over. */
static void
accept_resume(struct worker *w)
{
	if (w->paused_until_ms == 0 || agentd_now_ms() < w->paused_until_ms)
		return;
	struct epoll_event ev = { .events = EPOLLIN | EPOLLEXCLUSIVE,
		.data.ptr = NULL };
	if (epoll_ctl(w->ep, EPOLL_CTL_ADD, w->g->lfd, &ev) == 0)
		w->paused_until_ms = 0;
}

static void
accept_all(struct worker *w)
{
	for (;;) {
		int fd = accept4(w->g->lfd, NULL, NULL, SOCK_NONBLOCK);
		if (fd >= 0) {
			conn_open(w, fd, true);
			continue;
		}
		if (errno == EINTR || errno == ECONNABORTED)
			continue;
		/* Out of descriptors (or of the kernel's memory for one):
		 * an idle connection makes room, else a pause. */
		if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
		    errno == ENOMEM) {
			if (evict_idle(w))
				continue;
			accept_pause(w);
		}
		return;
	}
}

/* The sockets other workers handed over: each evicts an idle
 * connection of this worker, or is refused if none is idle any more. */
static void
handed_in(struct worker *w)
{
	int fd;
	while (read(w->hand[0], &fd, sizeof fd) == (ssize_t) sizeof fd)
		conn_open(w, fd, false);
	publish_idle(w);
}

/* Close connections idle for longer than --idle-timeout-s: no stream
 * open for that long (PINGs do not count), or no byte at all. */
static void
reap_idle(struct worker *w)
{
	uint64_t now = agentd_now_ms();
	uint64_t max = (uint64_t) w->g->d->o.idle_timeout_s * 1000u;
	for (struct conn *c = w->conns, *next; c != NULL; c = next) {
		next = c->next;
		if (now - c->last_ms > max ||
		    (c->streams == NULL && now - c->quiet_since > max))
			conn_close(c);
	}
}

static void *
worker_main(void *arg)
{
	struct worker *w = arg;
	struct epoll_event evs[64];
	uint64_t last_reap = agentd_now_ms();
	while (!atomic_load(&w->g->stop)) {
		int n = epoll_wait(w->ep, evs, 64,
		    w->paused_until_ms != 0 ? ACCEPT_PAUSE_MS / 4 : TICK_MS);
		accept_resume(w);
		for (int i = 0; i < n; i++) {
			if (evs[i].data.ptr == NULL) {
				accept_all(w);
				continue;
			}
			if (evs[i].data.ptr == w) {
				handed_in(w);
				continue;
			}
			struct conn *c = evs[i].data.ptr;
			if (!conn_io(c, evs[i].events))
				conn_close(c);
		}
		if (agentd_now_ms() - last_reap > 1000) {
			reap_idle(w);
			last_reap = agentd_now_ms();
		}
		if (agentd_now_ms() - w->published_ms >= TICK_MS)
			publish_idle(w);
	}
	while (w->conns != NULL)
		conn_close(w->conns);
	return NULL;
}

/* ---------------------------------------------------------------- */
/* Listener and certificates                                        */
/* ---------------------------------------------------------------- */

static int
listen_on(struct agentd *d, const char *spec, unsigned *ret_port)
{
	char host[256];
	const char *colon = strrchr(spec, ':');
	size_t hl = colon != NULL ? (size_t) (colon - spec) : 0;
	if (colon == NULL || hl == 0 || hl >= sizeof host) {
		agentd_log(
		    d, 3, "AGENTD-LISTEN", "wants HOST:PORT, not '%s'", spec);
		return -1;
	}
	const char *h = spec;
	if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
		h++;
		hl -= 2;
	}
	memcpy(host, h, hl);
	host[hl] = '\0';
	struct addrinfo hints = { .ai_family = AF_UNSPEC,
		.ai_socktype = SOCK_STREAM,
		.ai_flags = AI_NUMERICSERV | AI_PASSIVE },
	                *res;
	if (getaddrinfo(host, colon + 1, &hints, &res) != 0) {
		agentd_log(d, 3, "AGENTD-LISTEN", "bad address '%s'", spec);
		return -1;
	}
	int fd = socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
	int one = 1;
	if (fd >= 0)
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0 ||
	    listen(fd, 1024) != 0) {
		agentd_log(
		    d, 3, "AGENTD-LISTEN", "%s: %s", spec, strerror(errno));
		if (fd >= 0)
			close(fd);
		freeaddrinfo(res);
		return -1;
	}
	freeaddrinfo(res);
	struct sockaddr_storage ss;
	socklen_t sl = sizeof ss;
	getsockname(fd, (struct sockaddr *) &ss, &sl);
	*ret_port = ntohs(ss.ss_family == AF_INET6 ?
	        ((struct sockaddr_in6 *) &ss)->sin6_port :
	        ((struct sockaddr_in *) &ss)->sin_port);
	return fd;
}

static bool
same_file(const struct stat *a, const struct stat *b)
{
	return a->st_ino == b->st_ino && a->st_size == b->st_size &&
	    a->st_mtim.tv_sec == b->st_mtim.tv_sec &&
	    a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

/* Load the certificate and key; on success they are what new
 * handshakes use. */
static bool
load_creds(
    struct grpc_server *g, const struct stat *cst, const struct stat *kst)
{
	struct agentd *d = g->d;
	struct creds *c = calloc(1, sizeof *c);
	if (c == NULL)
		return false;
	int rc = gnutls_certificate_allocate_credentials(&c->c);
	if (rc >= 0)
		rc = gnutls_certificate_set_x509_key_file(
		    c->c, d->o.tls_cert, d->o.tls_key, GNUTLS_X509_FMT_PEM);
	if (rc < 0) {
		agentd_log(d, 3, "AGENTD-TLS", "%s, %s: %s", d->o.tls_cert,
		    d->o.tls_key, gnutls_strerror(rc));
		if (c->c != NULL)
			gnutls_certificate_free_credentials(c->c);
		free(c);
		return false;
	}
	c->refs = 1; /* the server's own reference */
	pthread_mutex_lock(&g->tls_mu);
	struct creds *old = g->creds;
	g->creds = c;
	g->cert_st = *cst;
	g->key_st = *kst;
	pthread_mutex_unlock(&g->tls_mu);
	creds_put(g, old);
	return true;
}

void
grpc_server_check_certs(struct grpc_server *g)
{
	if (g == NULL || !g->tls)
		return;
	struct agentd *d = g->d;
	struct stat cst, kst;
	if (stat(d->o.tls_cert, &cst) != 0 || stat(d->o.tls_key, &kst) != 0)
		return; /* being replaced: look again at the next tick */
	if (same_file(&cst, &g->cert_st) && same_file(&kst, &g->key_st))
		return;
	/* A certificate written before its key does not load: the old
	 * pair stays in force and the next tick tries again. */
	if (load_creds(g, &cst, &kst)) {
		atomic_fetch_add(&d->n.cert_reloads, 1);
		agentd_log(
		    d, 6, "AGENTD-TLS-RELOAD", "%s reloaded", d->o.tls_cert);
	} else {
		atomic_fetch_add(&d->n.cert_reload_errors, 1);
	}
}

static int
setup_h2(struct grpc_server *g)
{
	if (nghttp2_session_callbacks_new(&g->cbs) != 0 ||
	    nghttp2_option_new(&g->h2opt) != 0)
		return ALLOT_ENOMEM;
	nghttp2_session_callbacks_set_on_begin_headers_callback(
	    g->cbs, on_begin_headers);
	nghttp2_session_callbacks_set_on_header_callback(g->cbs, on_header);
	nghttp2_session_callbacks_set_on_data_chunk_recv_callback(
	    g->cbs, on_data);
	nghttp2_session_callbacks_set_on_frame_recv_callback(g->cbs, on_frame);
	nghttp2_session_callbacks_set_on_stream_close_callback(
	    g->cbs, on_close);
	/* Streams beyond our SETTINGS are refused before its ACK too. */
	nghttp2_option_set_max_deflate_dynamic_table_size(g->h2opt, 4096);
	return ALLOT_OK;
}

int
grpc_server_start(struct agentd *d, struct grpc_server **ret)
{
	struct grpc_server *g = calloc(1, sizeof *g);
	if (g == NULL)
		return ALLOT_ENOMEM;
	g->d = d;
	pthread_mutex_init(&g->tls_mu, NULL);
	if (setup_h2(g) != ALLOT_OK)
		return ALLOT_ENOMEM;
	if (d->o.tls_cert != NULL) {
		struct stat cst, kst;
		if (stat(d->o.tls_cert, &cst) != 0 ||
		    stat(d->o.tls_key, &kst) != 0 ||
		    !load_creds(g, &cst, &kst)) {
			agentd_log(d, 3, "AGENTD-TLS", "cannot load %s / %s",
			    d->o.tls_cert, d->o.tls_key);
			return ALLOT_EIO;
		}
		g->tls = true;
	}
	g->lfd = listen_on(d, d->o.grpc_listen, &g->port);
	if (g->lfd < 0)
		return ALLOT_EIO;
	g->nworkers = d->o.grpc_threads;
	g->workers = calloc(g->nworkers, sizeof *g->workers);
	if (g->workers == NULL)
		return ALLOT_ENOMEM;
	for (size_t i = 0; i < g->nworkers; i++) {
		struct worker *w = &g->workers[i];
		w->g = g;
		w->hand[0] = w->hand[1] = -1;
		w->ep = epoll_create1(EPOLL_CLOEXEC);
		/* One worker wakes per new connection. */
		struct epoll_event ev = { .events = EPOLLIN | EPOLLEXCLUSIVE,
			.data.ptr = NULL };
		struct epoll_event hev = { .events = EPOLLIN, .data.ptr = w };
		if (w->ep < 0 ||
		    epoll_ctl(w->ep, EPOLL_CTL_ADD, g->lfd, &ev) != 0 ||
		    pipe2(w->hand, O_NONBLOCK | O_CLOEXEC) != 0 ||
		    epoll_ctl(w->ep, EPOLL_CTL_ADD, w->hand[0], &hev) != 0)
			return ALLOT_EIO;
	}
	/* Every worker's pipe exists before any may hand over to it. */
	for (size_t i = 0; i < g->nworkers; i++)
		if (pthread_create(&g->workers[i].thread, NULL, worker_main,
		        &g->workers[i]) != 0)
			return ALLOT_EIO;
	*ret = g;
	return ALLOT_OK;
}

unsigned
grpc_server_port(const struct grpc_server *g)
{
	return g->port;
}

void
grpc_server_stop(struct grpc_server *g)
{
	if (g == NULL)
		return;
	atomic_store(&g->stop, true);
	for (size_t i = 0; i < g->nworkers; i++)
		pthread_join(g->workers[i].thread, NULL);
	for (size_t i = 0; i < g->nworkers; i++) {
		struct worker *w = &g->workers[i];
		int fd;
		/* Sockets handed over after their worker's last wake-up. */
		while (read(w->hand[0], &fd, sizeof fd) == (ssize_t) sizeof fd)
			close(fd);
		close(w->hand[0]);
		close(w->hand[1]);
		close(w->ep);
	}
	close(g->lfd);
	creds_put(g, g->creds);
	nghttp2_session_callbacks_del(g->cbs);
	nghttp2_option_del(g->h2opt);
	pthread_mutex_destroy(&g->tls_mu);
	free(g->workers);
	free(g);
}
