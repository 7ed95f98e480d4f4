/* SPDX-License-Identifier: MIT */
/*
 * The TLS transport for raft_uv (raft_tls.h). One `conn` per connection,
 * either way:
 *
 *   dialer:   resolve -> TCP connect -> TLS handshake -> send libraft's
 *             handshake through TLS -> OPEN (connect callback)
 *   acceptor: accept -> TLS handshake -> read libraft's handshake
 *             through TLS -> OPEN (accept callback)
 *
 * Once OPEN, the pump moves plaintext between `inner` (our end of the
 * socketpair; raft_uv has the other) and the TLS session, ciphertext
 * between the session and `tcp`. GnuTLS pulls ciphertext from `rbuf`
 * (filled by tcp reads) and pushes it straight into uv_write requests,
 * so it never blocks; the bytes queued towards either side are counted
 * and reading from the side that feeds them stops above buffer_max.
 *
 * Closing: raft_uv closing its end (EOF on inner) sends close_notify and
 * shuts the TCP socket down; the peer's EOF or close_notify flushes what
 * is queued to raft_uv and shuts inner down, so raft_uv sees EOF. Either
 * way a timer bounds the wait. The transport's close callback fires
 * once every conn and the listener are closed, after the callbacks of
 * pending connect requests (RAFT_CANCELED).
 *
 * We use GnuTLS rather than nng's mbedTLS: Debian's mbedTLS 2.28 speaks
 * TLS 1.2 only (its 1.3 is experimental), while GnuTLS 3.7 gives TLS 1.3
 * (the member certificates are encrypted on the wire), a verification
 * callback inside the handshake (a refused peer gets an alert, not a
 * session) and plain push/pull hooks for a non-blocking pump; the
 * sidecar already depends on it.
 */
#include "raft_tls.h"
#include "raft_tls_int.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef struct wreq {
	uv_write_t w;
	conn *c;
	size_t len;
	char data[];
} wreq;

static void conn_close(conn *c);
static void pump_in(conn *c);
static void inner_resume(conn *c);
static void tls_failed(conn *c, const char *what, int rv);

/* One line per failed connection, naming the peer and the reason. */
void
allot__raft_tls_refuse(conn *c, const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	allot__log_ratelimited(c->tr->log, &c->tr->rl, ALLOT_LOG_WARNING,
	    "ALLOT-RAFT-TLS", "%s %s: %s", c->dialer ? "to member at" : "from",
	    c->peer, msg);
}

/* No delay, and TCP_USER_TIMEOUT (raft_tls.h): a connection whose data
 * stays unacknowledged that long fails with ETIMEDOUT, seen in
 * tcp_read. */
static void
tcp_tune(conn *c)
{
	uv_os_fd_t fd;
	unsigned ms = c->tr->user_timeout_ms;

	uv_tcp_nodelay(&c->tcp, 1);
	if (uv_fileno((uv_handle_t *) &c->tcp, &fd) != 0 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof ms) != 0)
		allot__raft_tls_refuse(
		    c, "TCP_USER_TIMEOUT not set: %s", strerror(errno));
}

/* ---- GnuTLS over memory ---- */

static void
tcp_written(uv_write_t *w, int status)
{
	wreq *q = (wreq *) w;
	conn *c = q->c;

	c->tcp_queued -= q->len;
	free(q);
	if (status < 0 && c->state != CLOSING) {
		allot__raft_tls_refuse(c, "write: %s", uv_strerror(status));
		conn_close(c);
		return;
	}
	if (c->state == OPEN && !c->inner_reading &&
	    c->tcp_queued <= c->tr->buffer_max / 2)
		inner_resume(c);
}

/* GnuTLS hands us ciphertext: queue it on the socket, all of it (the
 * queue is bounded by not reading more plaintext, see inner_read). */
static ssize_t
push(gnutls_transport_ptr_t p, const void *data, size_t len)
{
	conn *c = p;
	wreq *q;
	uv_buf_t b;
	int rv;

	q = malloc(sizeof *q + len);
	if (q == NULL) {
		gnutls_transport_set_errno(c->s, ENOMEM);
		return -1;
	}
	q->c = c;
	q->len = len;
	memcpy(q->data, data, len);
	b = uv_buf_init(q->data, (unsigned) len);
	rv = uv_write(&q->w, (uv_stream_t *) &c->tcp, &b, 1, tcp_written);
	if (rv < 0) {
		free(q);
		gnutls_transport_set_errno(c->s, EPIPE);
		return -1;
	}
	c->tcp_queued += len;
	return (ssize_t) len;
}

static ssize_t
pull(gnutls_transport_ptr_t p, void *data, size_t len)
{
	conn *c = p;
	size_t n = c->rlen - c->roff;

	if (n == 0) {
		gnutls_transport_set_errno(c->s, EAGAIN);
		return -1;
	}
	if (n > len)
		n = len;
	memcpy(data, c->rbuf + c->roff, n);
	c->roff += n;
	if (c->roff == c->rlen)
		c->roff = c->rlen = 0;
	return (ssize_t) n;
}

/* GnuTLS never waits here: data is there or it is not. */
static int
pull_timeout(gnutls_transport_ptr_t p, unsigned ms)
{
	conn *c = p;

	(void) ms;
	return c->rlen > c->roff ? 1 : 0;
}

/* ---- handles and closing ---- */

static void
conn_free(conn *c)
{
	tls_tr *tr = c->tr;
	struct raft_uv_connect *req = c->req;

	if (c->prev != NULL)
		c->prev->next = c->next;
	else
		tr->conns = c->next;
	if (c->next != NULL)
		c->next->prev = c->prev;
	if (c->s != NULL)
		gnutls_deinit(c->s);
	free(c->rbuf);
	free(c->pre);
	free(c);
	if (req != NULL)
		req->cb(req, NULL,
		    tr->closing ? RAFT_CANCELED : RAFT_NOCONNECTION);
	if (tr->closing && tr->conns == NULL && !tr->listener_init &&
	    tr->close_cb != NULL) {
		raft_uv_transport_close_cb cb = tr->close_cb;

		tr->close_cb = NULL;
		cb(tr->t);
	}
}

static void
handle_closed(uv_handle_t *h)
{
	conn *c = h->data;

	if (--c->handles == 0 && !c->resolving)
		conn_free(c);
}

static void
conn_close(conn *c)
{
	if (c->closed)
		return;
	c->closed = true;
	c->state = CLOSING;
	if (c->counted) {
		c->counted = false;
		c->tr->pending--;
	}
	if (c->resolving)
		uv_cancel((uv_req_t *) &c->gai);
	if (!uv_is_closing((uv_handle_t *) &c->timer))
		uv_close((uv_handle_t *) &c->timer, handle_closed);
	if (c->tcp_init && !uv_is_closing((uv_handle_t *) &c->tcp))
		uv_close((uv_handle_t *) &c->tcp, handle_closed);
	if (c->inner_init && !uv_is_closing((uv_handle_t *) &c->inner))
		uv_close((uv_handle_t *) &c->inner, handle_closed);
}

static void
timer_cb(uv_timer_t *t)
{
	conn *c = t->data;

	if (c->state == CLOSING) {
		conn_close(c); /* the graceful close took too long */
		return;
	}
	allot__raft_tls_refuse(
	    c, "handshake timed out after %u ms", c->tr->handshake_ms);
	conn_close(c);
}

/* Starts the graceful close: nothing more is read; `sreq` flushes what
 * is queued on `stream` and then everything closes, within
 * handshake_ms. */
static void
shut_done(uv_shutdown_t *r, int status)
{
	(void) status;
	conn_close(r->data);
}

static void
conn_shutdown(conn *c, uv_stream_t *stream)
{
	c->state = CLOSING;
	if (c->tcp_reading)
		uv_read_stop((uv_stream_t *) &c->tcp);
	if (c->inner_reading)
		uv_read_stop((uv_stream_t *) &c->inner);
	c->tcp_reading = c->inner_reading = false;
	uv_timer_start(&c->timer, timer_cb, c->tr->handshake_ms, 0);
	c->sreq.data = c;
	if (uv_shutdown(&c->sreq, stream, shut_done) != 0)
		conn_close(c);
}

static conn *
conn_new(tls_tr *tr, bool dialer)
{
	conn *c = calloc(1, sizeof *c);

	if (c == NULL)
		return NULL;
	c->rbuf = malloc(RBUF_SIZE);
	c->pre = dialer ? NULL : malloc(sizeof *c->pre);
	if (c->rbuf == NULL || (!dialer && c->pre == NULL)) {
		free(c->rbuf);
		free(c->pre);
		free(c);
		return NULL;
	}
	if (c->pre != NULL)
		allot__raft_preamble_init(c->pre);
	c->tr = tr;
	c->dialer = dialer;
	c->next = tr->conns;
	if (tr->conns != NULL)
		tr->conns->prev = c;
	tr->conns = c;
	uv_timer_init(tr->loop, &c->timer);
	c->timer.data = c;
	c->handles = 1;
	uv_timer_start(&c->timer, timer_cb, tr->handshake_ms, 0);
	return c;
}

/* ---- the pump ---- */

static void
inner_written(uv_write_t *w, int status)
{
	wreq *q = (wreq *) w;
	conn *c = q->c;

	c->inner_queued -= q->len;
	free(q);
	if (status < 0 && c->state != CLOSING) {
		conn_close(c); /* raft_uv closed its end */
		return;
	}
	if (c->state == OPEN && c->inner_queued <= c->tr->buffer_max / 2)
		pump_in(c);
}

static void
tcp_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
	conn *c = h->data;

	(void) hint;
	if (c->roff > 0) {
		memmove(c->rbuf, c->rbuf + c->roff, c->rlen - c->roff);
		c->rlen -= c->roff;
		c->roff = 0;
	}
	*b = uv_buf_init(c->rbuf + c->rlen, (unsigned) (RBUF_SIZE - c->rlen));
}

static void
tcp_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
	conn *c = s->data;

	(void) b;
	if (n == UV_ENOBUFS) {
		uv_read_stop(s); /* rbuf full: pump_in resumes us */
		c->tcp_reading = false;
		return;
	}
	if (n < 0) {
		if (c->state == OPEN && n == UV_EOF && c->inner_init) {
			/* The peer went without close_notify: flush what we
			 * have to raft_uv, then EOF. */
			conn_shutdown(c, (uv_stream_t *) &c->inner);
			return;
		}
		if (c->state != OPEN && c->state != CLOSING)
			allot__raft_tls_refuse(c,
			    "connection closed during the handshake "
			    "(%s)",
			    uv_strerror((int) n));
		else if (c->state == OPEN && n != UV_EOF)
			/* ETIMEDOUT: TCP_USER_TIMEOUT ran out (the peer
			 * vanished); raft_uv dials again. */
			allot__raft_tls_refuse(
			    c, "connection dropped: %s", uv_strerror((int) n));
		conn_close(c);
		return;
	}
	c->rlen += (size_t) n;
	pump_in(c);
}

static void
tcp_read_start(conn *c)
{
	if (!c->tcp_reading && c->state != CLOSING) {
		c->tcp.data = c;
		if (uv_read_start(
		        (uv_stream_t *) &c->tcp, tcp_alloc, tcp_read) == 0)
			c->tcp_reading = true;
	}
}

static void
inner_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
	conn *c = h->data;

	(void) hint;
	*b = uv_buf_init(c->tr->ibuf, RBUF_SIZE);
}

/* Plaintext from raft_uv: encrypt it onto the socket. */
static void
inner_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
	conn *c = s->data;
	size_t off = 0;

	if (n < 0) {
		/* raft_uv closed its end: close_notify, then shut down. */
		if (n == UV_EOF && c->state == OPEN) {
			gnutls_bye(c->s, GNUTLS_SHUT_WR);
			conn_shutdown(c, (uv_stream_t *) &c->tcp);
		} else {
			conn_close(c);
		}
		return;
	}
	while (off < (size_t) n) {
		ssize_t rv = gnutls_record_send(
		    c->s, b->base + off, (size_t) n - off);

		if (rv == GNUTLS_E_INTERRUPTED)
			continue;
		if (rv < 0) { /* push never says EAGAIN */
			allot__raft_tls_refuse(
			    c, "TLS send: %s", gnutls_strerror((int) rv));
			conn_close(c);
			return;
		}
		off += (size_t) rv;
	}
	if (c->tcp_queued > c->tr->buffer_max) {
		uv_read_stop(s); /* the peer reads slowly: wait for it */
		c->inner_reading = false;
	}
}

static void
inner_resume(conn *c)
{
	c->inner.data = c;
	if (uv_read_start(
	        (uv_stream_t *) &c->inner, inner_alloc, inner_read) == 0)
		c->inner_reading = true;
}

/* Makes the socketpair; `*ret` is raft_uv's end (raft_malloc'ed: raft_uv
 * frees it with raft_free after closing it). */
static int
pair_open(conn *c, uv_stream_t **ret)
{
	uv_os_sock_t fds[2];
	uv_pipe_t *theirs;

	theirs = raft_malloc(sizeof *theirs);
	if (theirs == NULL)
		return UV_ENOMEM;
	if (uv_socketpair(SOCK_STREAM, 0, fds, UV_NONBLOCK_PIPE,
	        UV_NONBLOCK_PIPE) != 0) {
		raft_free(theirs);
		return UV_EMFILE;
	}
	uv_pipe_init(c->tr->loop, &c->inner, 0);
	c->inner.data = c;
	c->inner_init = true;
	c->handles++;
	uv_pipe_open(&c->inner, fds[0]);
	uv_pipe_init(c->tr->loop, theirs, 0);
	uv_pipe_open(theirs, fds[1]);
	*ret = (uv_stream_t *) theirs;
	return 0;
}

static void
open_failed(conn *c, int rv)
{
	allot__raft_tls_refuse(c, "socketpair: %s", uv_strerror(rv));
	conn_close(c);
}

/* The dialer's TLS is up: send libraft's handshake in it and hand
 * raft_uv the stream. */
static void
dialer_open(conn *c)
{
	size_t alen = (strlen(c->tr->address) + 1 + 7) / 8 * 8;
	size_t len = 24 + alen, off = 0;
	uint8_t *hs = calloc(1, len);
	uint64_t v[3] = { HANDSHAKE_PROTOCOL, c->tr->id, alen };
	struct raft_uv_connect *req = c->req;
	uv_stream_t *theirs;
	int rv;

	if (hs == NULL) {
		conn_close(c);
		return;
	}
	/* libraft's byte order: little endian. */
	for (int i = 0; i < 3; i++)
		for (int k = 0; k < 8; k++)
			hs[i * 8 + k] = (uint8_t) (v[i] >> (8 * k));
	memcpy(hs + 24, c->tr->address, strlen(c->tr->address));
	while (off < len) {
		ssize_t n = gnutls_record_send(c->s, hs + off, len - off);

		if (n == GNUTLS_E_INTERRUPTED)
			continue;
		if (n < 0)
			break;
		off += (size_t) n;
	}
	free(hs);
	if (off < len) {
		allot__raft_tls_refuse(c, "TLS send of the handshake failed");
		conn_close(c);
		return;
	}
	rv = pair_open(c, &theirs);
	if (rv != 0) {
		open_failed(c, rv);
		return;
	}
	c->state = OPEN;
	uv_timer_stop(&c->timer);
	inner_resume(c);
	c->req = NULL;
	req->cb(req, theirs, 0);
}

/* The acceptor has libraft's handshake: hand raft_uv the stream. */
static void
acceptor_open(conn *c)
{
	uv_stream_t *theirs;
	int rv = pair_open(c, &theirs);

	if (rv != 0) {
		open_failed(c, rv);
		return;
	}
	c->state = OPEN;
	c->tr->pending--;
	c->counted = false;
	uv_timer_stop(&c->timer);
	inner_resume(c);
	c->tr->accept_cb(c->tr->t, c->id, c->pre->address, theirs);
}

/* Reads libraft's preamble and address (raft_preamble.c), never past
 * them; true when the conn goes on. */
static bool
preamble(conn *c)
{
	for (;;) {
		uint8_t buf[64];
		size_t want = allot__raft_preamble_want(c->pre);
		ssize_t n = gnutls_record_recv(
		    c->s, buf, want < sizeof buf ? want : sizeof buf);
		if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED)
			return true;
		if (n <= 0) {
			if (n == 0)
				allot__raft_tls_refuse(
				    c, "closed before libraft's handshake");
			else
				tls_failed(
				    c, "before libraft's handshake", (int) n);
			conn_close(c);
			return false;
		}
		char err[160];
		switch (allot__raft_preamble_feed(
		    c->pre, buf, (size_t) n, err, sizeof err)) {
		case ALLOT__PREAMBLE_MORE: continue;
		case ALLOT__PREAMBLE_BAD:
			allot__raft_tls_refuse(c, "%s", err);
			conn_close(c);
			return false;
		case ALLOT__PREAMBLE_DONE: break;
		}
		c->id = c->pre->id;
		if (!allot__raft_tls_claim_ok(c)) {
			conn_close(c);
			return false;
		}
		acceptor_open(c);
		return c->state == OPEN;
	}
}

/* Logs why a TLS call failed: our verdict on the peer's certificate,
 * the peer's verdict on ours (an alert: TLS 1.3 clients learn that
 * their certificate was refused after their handshake ended), or
 * GnuTLS's error. */
static void
tls_failed(conn *c, const char *what, int rv)
{
	if (c->reason[0] != '\0')
		allot__raft_tls_refuse(c, "%s", c->reason);
	else if (rv == GNUTLS_E_FATAL_ALERT_RECEIVED)
		allot__raft_tls_refuse(c,
		    "%s: the peer refused us (alert: %s)", what,
		    gnutls_alert_get_name(gnutls_alert_get(c->s)));
	else
		allot__raft_tls_refuse(c, "%s: %s", what, gnutls_strerror(rv));
}

static bool
handshake(conn *c)
{
	int rv = gnutls_handshake(c->s);

	if (rv == GNUTLS_E_AGAIN || rv == GNUTLS_E_INTERRUPTED)
		return true;
	if (rv < 0) {
		tls_failed(c, "handshake failed", rv);
		/* GnuTLS leaves the alert to us: tell the peer why, and let
		 * it reach the peer before closing. */
		if (c->alert != 0)
			gnutls_alert_send(c->s, GNUTLS_AL_FATAL, c->alert);
		else
			gnutls_alert_send_appropriate(c->s, rv);
		conn_shutdown(c, (uv_stream_t *) &c->tcp);
		return false;
	}
	if (c->dialer) {
		dialer_open(c);
		return c->state == OPEN;
	}
	c->state = PREAMBLE;
	return true;
}

/* Ciphertext arrived, or raft_uv drained its queue: decrypt what we can
 * while raft_uv's queue has room. */
static void
pump_in(conn *c)
{
	if (c->state == HANDSHAKE && !handshake(c))
		return;
	if (c->state == PREAMBLE && !preamble(c))
		return;
	while (c->state == OPEN && c->inner_queued < c->tr->buffer_max) {
		wreq *q = malloc(sizeof *q + RECORD_MAX);
		ssize_t n;
		uv_buf_t b;

		if (q == NULL) {
			conn_close(c);
			return;
		}
		n = gnutls_record_recv(c->s, q->data, RECORD_MAX);
		if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED) {
			free(q);
			break;
		}
		if (n <= 0) {
			free(q);
			if (n == 0) {
				/* close_notify: flush to raft_uv, then EOF. */
				conn_shutdown(c, (uv_stream_t *) &c->inner);
				return;
			}
			tls_failed(c, "TLS receive", (int) n);
			conn_close(c);
			return;
		}
		q->c = c;
		q->len = (size_t) n;
		b = uv_buf_init(q->data, (unsigned) n);
		if (uv_write(&q->w, (uv_stream_t *) &c->inner, &b, 1,
		        inner_written) != 0) {
			free(q);
			conn_close(c);
			return;
		}
		c->inner_queued += (size_t) n;
	}
	if (c->state == CLOSING)
		return;
	if (c->state == OPEN && c->inner_queued >= c->tr->buffer_max) {
		if (c->tcp_reading)
			uv_read_stop((uv_stream_t *) &c->tcp);
		c->tcp_reading = false;
	} else {
		tcp_read_start(c);
	}
}

/* ---- sessions ---- */

static int
session_new(conn *c)
{
	int rv = gnutls_init(&c->s,
	    (c->dialer ? GNUTLS_CLIENT : GNUTLS_SERVER) | GNUTLS_NONBLOCK |
	        GNUTLS_NO_TICKETS);

	if (rv < 0)
		return rv;
	rv = gnutls_priority_set_direct(
	    c->s, "NORMAL:-VERS-ALL:+VERS-TLS1.3", NULL);
	if (rv == 0)
		rv = gnutls_credentials_set(
		    c->s, GNUTLS_CRD_CERTIFICATE, c->tr->cred);
	if (rv < 0)
		return rv;
	if (!c->dialer)
		gnutls_certificate_server_set_request(
		    c->s, GNUTLS_CERT_REQUIRE);
	gnutls_session_set_ptr(c->s, c);
	gnutls_transport_set_ptr(c->s, c);
	gnutls_transport_set_push_function(c->s, push);
	gnutls_transport_set_pull_function(c->s, pull);
	gnutls_transport_set_pull_timeout_function(c->s, pull_timeout);
	gnutls_handshake_set_timeout(c->s, 0); /* our timer bounds it */
	c->state = HANDSHAKE;
	return 0;
}

static void
tcp_connected(uv_connect_t *r, int status)
{
	conn *c = r->data;
	int rv;

	if (c->state == CLOSING)
		return;
	if (status != 0) {
		/* Refused or unreachable: a member that is down, the
		 * usual case, not worth a line each retry. */
		conn_close(c);
		return;
	}
	rv = session_new(c);
	if (rv < 0) {
		allot__raft_tls_refuse(
		    c, "TLS session: %s", gnutls_strerror(rv));
		conn_close(c);
		return;
	}
	tcp_tune(c);
	pump_in(c); /* sends the ClientHello */
}

static void
resolved(uv_getaddrinfo_t *r, int status, struct addrinfo *ai)
{
	conn *c = r->data;

	c->resolving = false;
	if (c->state == CLOSING) {
		uv_freeaddrinfo(ai);
		if (c->handles == 0)
			conn_free(c);
		return;
	}
	if (status != 0 || ai == NULL) {
		allot__raft_tls_refuse(
		    c, "cannot resolve: %s", uv_strerror(status));
		uv_freeaddrinfo(ai);
		conn_close(c);
		return;
	}
	uv_tcp_init(c->tr->loop, &c->tcp);
	c->tcp.data = c;
	c->tcp_init = true;
	c->handles++;
	c->state = CONNECTING;
	c->creq.data = c;
	status = uv_tcp_connect(&c->creq, &c->tcp, ai->ai_addr, tcp_connected);
	uv_freeaddrinfo(ai);
	if (status != 0)
		conn_close(c);
}

/* Splits "host:port" (or "[v6]:port") into `host` and `port`. */
static int
split_address(const char *a, char *host, size_t hlen, char *port, size_t plen)
{
	const char *colon = strrchr(a, ':');
	size_t n;

	if (colon == NULL || colon[1] == '\0' || strlen(colon + 1) >= plen)
		return -1;
	n = (size_t) (colon - a);
	if (n >= 2 && a[0] == '[' && a[n - 1] == ']') {
		a++;
		n -= 2;
	}
	if (n == 0 || n >= hlen)
		return -1;
	memcpy(host, a, n);
	host[n] = '\0';
	snprintf(port, plen, "%s", colon + 1);
	return 0;
}

/* ---- the raft_uv_transport interface ---- */

static int
tr_init(struct raft_uv_transport *t, raft_id id, const char *address)
{
	tls_tr *tr = t->impl;
	int rv = allot__raft_tls_own_id(tr, id);

	if (rv != 0)
		return rv;
	tr->id = id;
	free(tr->address);
	tr->address = strdup(address);
	return tr->address != NULL ? 0 : RAFT_NOMEM;
}

static int
tr_connect(struct raft_uv_transport *t, struct raft_uv_connect *req,
    raft_id id, const char *address, raft_uv_connect_cb cb)
{
	tls_tr *tr = t->impl;
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM };
	char host[256], port[16];
	conn *c;
	int rv;

	req->cb = cb;
	if (split_address(address, host, sizeof host, port, sizeof port)) {
		snprintf(
		    t->errmsg, sizeof t->errmsg, "bad address %s", address);
		return RAFT_INVALID;
	}
	c = conn_new(tr, true);
	if (c == NULL)
		return RAFT_NOMEM;
	snprintf(c->peer, sizeof c->peer, "%s (id %llu)", address,
	    (unsigned long long) id);
	c->id = id;
	c->req = req;
	c->state = RESOLVING;
	c->gai.data = c;
	rv = uv_getaddrinfo(tr->loop, &c->gai, resolved, host, port, &hints);
	if (rv != 0) {
		c->req = NULL;
		conn_close(c);
		return RAFT_NOCONNECTION;
	}
	c->resolving = true;
	return 0;
}

/* A place for `nc` among the connections in their handshakes (the
 * bounds in raft_tls.h): true when it may go on, after the one from its
 * address (or, at the total, from anyone) waiting the longest gave its
 * place if a bound was reached. */
static bool
make_room(tls_tr *tr, conn *nc)
{
	conn *oldest = NULL, *oldest_here = NULL, *victim;
	unsigned here = 0;
	uint64_t now = uv_now(tr->loop);

	for (conn *c = tr->conns; c != NULL; c = c->next) {
		if (!c->counted)
			continue;
		if (oldest == NULL || c->since < oldest->since)
			oldest = c;
		if (strcmp(c->ip, nc->ip) != 0)
			continue;
		here++;
		if (oldest_here == NULL || c->since < oldest_here->since)
			oldest_here = c;
	}
	if (here >= tr->pending_per_address)
		victim = oldest_here;
	else if (tr->pending >= tr->pending_max)
		victim = oldest;
	else
		return true;
	if (now - victim->since < tr->handshake_ms / 4) {
		allot__raft_tls_refuse(nc,
		    "too many connections in their handshakes (%u from "
		    "its address, %u in all; at most %u and %u)",
		    here, tr->pending, tr->pending_per_address,
		    tr->pending_max);
		return false;
	}
	allot__raft_tls_refuse(victim,
	    "still in its handshake after %llu ms: its place goes to a "
	    "new connection",
	    (unsigned long long) (now - victim->since));
	conn_close(victim);
	return true;
}

static void
accepted(uv_stream_t *l, int status)
{
	tls_tr *tr = l->data;
	conn *c;
	struct sockaddr_storage ss;
	int len = sizeof ss, rv;
	char ip[64] = "?";

	if (status != 0 || tr->closing)
		return;
	c = conn_new(tr, false);
	if (c == NULL)
		return;
	uv_tcp_init(tr->loop, &c->tcp);
	c->tcp.data = c;
	c->tcp_init = true;
	c->handles++;
	c->state = HANDSHAKE;
	if (uv_accept(l, (uv_stream_t *) &c->tcp) != 0) {
		conn_close(c);
		return;
	}
	if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *) &ss, &len) == 0) {
		if (ss.ss_family == AF_INET)
			uv_ip4_name((struct sockaddr_in *) &ss, ip, sizeof ip);
		else
			uv_ip6_name(
			    (struct sockaddr_in6 *) &ss, ip, sizeof ip);
		/* sin_port and sin6_port sit at the same offset. */
		snprintf(c->peer, sizeof c->peer,
		    ss.ss_family == AF_INET ? "%s:%d" : "[%s]:%d", ip,
		    ntohs(((struct sockaddr_in *) &ss)->sin_port));
	}
	snprintf(c->ip, sizeof c->ip, "%s", ip);
	c->since = uv_now(tr->loop);
	if (!make_room(tr, c)) {
		conn_close(c);
		return;
	}
	tr->pending++;
	c->counted = true;
	rv = session_new(c);
	if (rv < 0) {
		allot__raft_tls_refuse(
		    c, "TLS session: %s", gnutls_strerror(rv));
		conn_close(c);
		return;
	}
	tcp_tune(c);
	tcp_read_start(c);
}

static int
tr_listen(struct raft_uv_transport *t, raft_uv_accept_cb cb)
{
	tls_tr *tr = t->impl;
	const char *a = tr->bind != NULL ? tr->bind : tr->address;
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM,
		.ai_flags = AI_PASSIVE };
	char host[256], port[16];
	uv_getaddrinfo_t gai;
	int rv;

	if (a == NULL ||
	    split_address(a, host, sizeof host, port, sizeof port)) {
		snprintf(t->errmsg, sizeof t->errmsg, "bad address %s",
		    a != NULL ? a : "(none)");
		return RAFT_INVALID;
	}
	rv = uv_getaddrinfo(tr->loop, &gai, NULL, host, port, &hints);
	if (rv != 0) {
		snprintf(
		    t->errmsg, sizeof t->errmsg, "%s: %s", a, uv_strerror(rv));
		return RAFT_IOERR;
	}
	tr->accept_cb = cb;
	uv_tcp_init(tr->loop, &tr->listener);
	tr->listener.data = tr;
	tr->listener_init = true;
	rv = uv_tcp_bind(&tr->listener, gai.addrinfo->ai_addr, 0);
	if (rv == 0)
		rv = uv_listen((uv_stream_t *) &tr->listener, 128, accepted);
	uv_freeaddrinfo(gai.addrinfo);
	if (rv != 0) {
		snprintf(t->errmsg, sizeof t->errmsg, "listen on %s: %s", a,
		    uv_strerror(rv));
		return RAFT_IOERR;
	}
	return 0;
}

static void
listener_closed(uv_handle_t *h)
{
	tls_tr *tr = h->data;

	tr->listener_init = false;
	if (tr->conns == NULL && tr->close_cb != NULL) {
		raft_uv_transport_close_cb cb = tr->close_cb;

		tr->close_cb = NULL;
		cb(tr->t);
	}
}

static void
tr_close(struct raft_uv_transport *t, raft_uv_transport_close_cb cb)
{
	tls_tr *tr = t->impl;
	conn *c, *next;

	tr->closing = true;
	tr->close_cb = cb;
	for (c = tr->conns; c != NULL; c = next) {
		next = c->next; /* conn_close frees nothing synchronously */
		conn_close(c);
	}
	if (tr->listener_init)
		uv_close((uv_handle_t *) &tr->listener, listener_closed);
	else if (tr->conns == NULL) {
		tr->close_cb = NULL;
		cb(t);
	}
}

int
allot__raft_tls_init(struct raft_uv_transport *t, uv_loop_t *loop,
    const allot__raft_tls_opts *o)
{
	tls_tr *tr;
	int rv;

	memset(t, 0, sizeof *t);
	if (o == NULL || o->cert_key_file == NULL || o->ca_file == NULL) {
		snprintf(t->errmsg, sizeof t->errmsg,
		    "TLS between members needs a certificate and a CA");
		return RAFT_INVALID;
	}
	tr = calloc(1, sizeof *tr);
	if (tr == NULL)
		return RAFT_NOMEM;
	tr->t = t;
	tr->loop = loop;
	tr->handshake_ms = o->handshake_ms != 0 ? o->handshake_ms : 5000;
	tr->user_timeout_ms = o->user_timeout_ms != 0 ? o->user_timeout_ms :
	                                                5000;
	tr->buffer_max = o->buffer_max != 0 ? o->buffer_max : 256 * 1024;
	tr->pending_max = o->pending_max != 0 ? o->pending_max : 64;
	tr->pending_per_address = o->pending_per_address != 0 ?
	    o->pending_per_address :
	    8;
	tr->is_member = o->is_member;
	tr->member_arg = o->member_arg;
	tr->log = o->log;
	tr->rl = (allot__logrl) ALLOT__LOGRL_INIT(20, 10000);
	tr->ibuf = malloc(RBUF_SIZE);
	rv = tr->ibuf != NULL ?
	    gnutls_certificate_allocate_credentials(&tr->cred) :
	    GNUTLS_E_MEMORY_ERROR;
	if (rv < 0) {
		free(tr->ibuf);
		free(tr);
		return RAFT_NOMEM;
	}
	t->impl = tr;
	rv = allot__raft_tls_load(tr, t, o);
	if (rv != 0) {
		allot__raft_tls_close(t);
		t->impl = NULL;
		return rv;
	}
	t->init = tr_init;
	t->listen = tr_listen;
	t->connect = tr_connect;
	t->close = tr_close;
	return 0;
}

int
allot__raft_tls_set_bind_address(
    struct raft_uv_transport *t, const char *address)
{
	tls_tr *tr = t->impl;
	char host[256], port[16];

	if (split_address(address, host, sizeof host, port, sizeof port))
		return RAFT_INVALID;
	free(tr->bind);
	tr->bind = strdup(address);
	return tr->bind != NULL ? 0 : RAFT_NOMEM;
}

void
allot__raft_tls_close(struct raft_uv_transport *t)
{
	tls_tr *tr = t->impl;

	if (tr == NULL)
		return;
	gnutls_certificate_free_credentials(tr->cred);
	free(tr->member_id);
	free(tr->address);
	free(tr->bind);
	free(tr->ibuf);
	free(tr);
	t->impl = NULL;
}
