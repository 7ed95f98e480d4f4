/* SPDX-License-Identifier: MIT */
/*
 * The nng rep0 server (server.h). Each worker loops RECV -> handle ->
 * SEND -> RECV in its aio callback, which nng runs on its own threads;
 * the handling itself (allot__dispatch: decode, one trip under the
 * registry's mutex, encode) is short, so it is done in the callback
 * rather than handed to another thread. protobuf-c allocates through a
 * per-worker bump arena that is reset after every request and keeps its
 * high-water mark, so the steady state allocates nothing per report (nng
 * still allocates one message per reply, into which the answer packed in
 * the arena is copied).
 */
#include "server.h"
#include "arena.h"
#include "dispatch/dispatch.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <gnutls/gnutls.h>
#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>
#include <nng/protocol/reqrep0/rep.h>

#include "clock.h"
#include "file.h"

/* How long allot__server_close() waits for nng to close the socket. */
#define SOCKET_CLOSE_MS 2000u

/* ------------------------------------------------------------------ */
/* workers                                                             */
/* ------------------------------------------------------------------ */

typedef enum wstate { W_IDLE, W_RECV, W_SEND } wstate;

typedef struct worker {
	allot__server *srv;
	nng_aio *aio;
	nng_ctx ctx;
	bool ctx_open;
	wstate state;
	allot__arena arena;
	ProtobufCAllocator pa;
} worker;

struct allot__server {
	allot__server_opts o;
	allot__dispatch_ctx dc; /* from o */
	allot__logger lgv;
	nng_socket sock;
	bool sock_open;
	nng_listener *listeners;
	size_t nlisteners;
	worker *workers;
	size_t nworkers;
	_Atomic bool draining;
	_Atomic bool closing;
	_Atomic uint32_t busy; /* requests between recv and send */
	allot__logrl rl[ALLOT__REJ_COUNT];
	allot__logrl rl_io;
};

void
allot__server_opts_init(allot__server_opts *o)
{
	memset(o, 0, sizeof *o);
	o->workers = ALLOT__SERVER_WORKERS;
	o->max_msg = ALLOT__SERVER_MAX_MSG;
	o->max_reports = ALLOT__SERVER_MAX_REPORTS;
	o->max_keys = ALLOT__SERVER_MAX_KEYS;
}

/* "1.2.3.4:5678", "ipc:/path" or "pipe 3": who sent `msg`, for the
 * log. */
static void
peer_name(nng_msg *msg, char *buf, size_t len)
{
	nng_sockaddr sa;
	nng_pipe p = nng_msg_get_pipe(msg);
	snprintf(buf, len, "?");
	if (nng_pipe_id(p) < 0 ||
	    nng_pipe_get_addr(p, NNG_OPT_REMADDR, &sa) != 0)
		return;
	switch (sa.s_family) {
	case NNG_AF_INET: {
		const uint8_t *a = (const uint8_t *) &sa.s_in.sa_addr;
		snprintf(buf, len, "%u.%u.%u.%u:%u", a[0], a[1], a[2], a[3],
		    (unsigned) ntohs(sa.s_in.sa_port));
		break;
	}
	case NNG_AF_IPC: snprintf(buf, len, "ipc:%s", sa.s_ipc.sa_path); break;
	default: snprintf(buf, len, "pipe %d", nng_pipe_id(p)); break;
	}
}

/* Log a refusal, rate-limited per reason. */
static void
log_reject(allot__server *srv, nng_msg *req, const allot__dispatch_result *res)
{
	allot__reject r = res->reason;
	/* Unknown sessions are expected after a restart or an expiry, and
	 * refusals while draining are by design. */
	int level = r == ALLOT__REJ_UNKNOWN_SESSION ||
	        r == ALLOT__REJ_SHUTTING_DOWN ?
	    ALLOT_LOG_NOTICE :
	    ALLOT_LOG_WARNING;
	if (srv->lgv.fn == NULL || level > srv->lgv.level)
		return;
	char peer[160];
	peer_name(req, peer, sizeof peer);
	allot__log_ratelimited(&srv->lgv, &srv->rl[r], level, "ALLOTD-REJECT",
	    "%s from %s rejected (%s): %s",
	    res->request != NULL ?
	        allot__dispatch_body_name(res->request->body_case) :
	        "message",
	    peer, allot__reject_name(r), res->err);
}

/* Answer one request (dispatch.h) with what the connection says of its
 * sender. Consumes `req`; the answer in a fresh message, or NULL when
 * out of memory. */
static nng_msg *
handle(worker *w, nng_msg *req)
{
	allot__server *srv = w->srv;
	uint64_t t0 = allot__mono_ns();
	int pid = nng_pipe_id(nng_msg_get_pipe(req));
	allot__peer peer;
	allot__peer_of(req, &peer);
	allot__dispatch_req dr = {
		.buf = nng_msg_body(req),
		.len = nng_msg_len(req),
		.pipe = pid > 0 ? (uint32_t) pid : 0,
		.peer = &peer,
		.now = t0,
		.draining = atomic_load(&srv->draining),
		.pa = &w->pa,
	};
	allot__metrics *m = srv->o.metrics;
	if (m != NULL)
		allot__metrics_add(&m->bytes_in, dr.len);
	allot__dispatch_result res;
	nng_msg *rep = NULL;
	if (allot__dispatch(&srv->dc, &dr, &res) == ALLOT_OK &&
	    nng_msg_alloc(&rep, res.answer_len) == 0)
		memcpy(nng_msg_body(rep), res.answer, res.answer_len);
	if (res.code != ALLOT__V1__ERROR__CODE__UNSPECIFIED)
		log_reject(srv, req, &res);
	allot__arena_reset(&w->arena);
	nng_msg_free(req);
	if (m != NULL) {
		if (rep != NULL)
			allot__metrics_add(&m->bytes_out, nng_msg_len(rep));
		allot__hist_observe_ns(
		    &m->sync_latency, allot__mono_ns() - t0);
	}
	return rep;
}

static void
worker_recv(worker *w)
{
	w->state = W_RECV;
	nng_ctx_recv(w->ctx, w->aio);
}

static void
worker_cb(void *arg)
{
	worker *w = arg;
	allot__server *srv = w->srv;
	int rv = nng_aio_result(w->aio);

	switch (w->state) {
	case W_RECV:
		if (rv != 0) {
			if (rv == NNG_ECLOSED || rv == NNG_ECANCELED ||
			    atomic_load(&srv->closing)) {
				w->state = W_IDLE;
				return;
			}
			allot__log_ratelimited(&srv->lgv, &srv->rl_io,
			    ALLOT_LOG_WARNING, "ALLOTD-RECV-FAIL",
			    "receive failed: %s", nng_strerror(rv));
			worker_recv(w);
			return;
		}
		atomic_fetch_add(&srv->busy, 1);
		nng_msg *rep = handle(w, nng_aio_get_msg(w->aio));
		if (rep == NULL) {
			/* Out of memory: no answer; the agent's request
			 * times out and it retries. */
			atomic_fetch_sub(&srv->busy, 1);
			allot__log_ratelimited(&srv->lgv, &srv->rl_io,
			    ALLOT_LOG_ERR, "ALLOTD-NOMEM",
			    "out of memory encoding a reply");
			worker_recv(w);
			return;
		}
		w->state = W_SEND;
		nng_aio_set_msg(w->aio, rep);
		nng_ctx_send(w->ctx, w->aio);
		return;
	case W_SEND:
		if (rv != 0) {
			/* The peer went away; the reply is ours to free. */
			nng_msg_free(nng_aio_get_msg(w->aio));
			nng_aio_set_msg(w->aio, NULL);
		}
		atomic_fetch_sub(&srv->busy, 1);
		if (atomic_load(&srv->closing)) {
			w->state = W_IDLE;
			return;
		}
		worker_recv(w);
		return;
	case W_IDLE: return;
	}
}
/* Whether `key` is the private key of the certificate `cert` (PEM
 * texts; GnuTLS parses and compares them, as nng's own TLS does not at
 * load): 0, or -1 with `why`. A mismatch would fail every handshake
 * later, agent by agent; it stops allotd at start instead. */
static int
pair_check(const char *cert, const char *key, char *why, size_t whylen)
{
	gnutls_certificate_credentials_t cred;
	if (gnutls_certificate_allocate_credentials(&cred) < 0) {
		snprintf(why, whylen, "out of memory");
		return -1;
	}
	gnutls_datum_t c = { (unsigned char *) cert, (unsigned) strlen(cert) };
	gnutls_datum_t k = { (unsigned char *) key, (unsigned) strlen(key) };
	int rv = gnutls_certificate_set_x509_key_mem(
	    cred, &c, &k, GNUTLS_X509_FMT_PEM);
	gnutls_certificate_free_credentials(cred);
	if (rv < 0) {
		snprintf(why, whylen, "%s", gnutls_strerror(rv));
		return -1;
	}
	return 0;
}

/* allotd's certificate into `cfg`: certificate and key in one PEM
 * file, or the key apart (--tls-key). 0, or an nng error with `err`
 * naming the file or files at fault. */
static int
own_cert(nng_tls_config *cfg, const char *cert_file, const char *key_file,
    char *err, size_t errlen)
{
	char *cert = NULL, *key = NULL, why[256];
	size_t len;
	int rv = NNG_EINVAL;
	if (allot__file_read(cert_file, ALLOT__PEM_MAX, err, errlen, &cert,
	        &len) != ALLOT_OK ||
	    (key_file != NULL &&
	        allot__file_read(key_file, ALLOT__PEM_MAX, err, errlen, &key,
	            &len) != ALLOT_OK))
		goto out;
	if (pair_check(cert, key != NULL ? key : cert, why, sizeof why) != 0) {
		snprintf(err, errlen, "%s%s%s: %s", cert_file,
		    key_file != NULL ? " and " : " (certificate and key)",
		    key_file != NULL ? key_file : "", why);
		goto out;
	}
	rv = nng_tls_config_own_cert(
	    cfg, cert, key != NULL ? key : cert, NULL);
	if (rv != 0)
		snprintf(err, errlen, "%s: %s", cert_file, nng_strerror(rv));
out:
	if (key_file == NULL && cert != NULL)
		explicit_bzero(cert, strlen(cert)); /* the key is in it */
	free(cert);
	if (key != NULL)
		explicit_bzero(key, strlen(key));
	free(key);
	return rv;
}

/* Listen on one URL. tls+tcp:// needs a certificate and a CA: both
 * sides verify (mutual TLS); plain tcp:// and ipc:// are for local use
 * and say so in the log. 0, or an nng error with `err`. */
static int
listen_url(allot__server *srv, const allot__server_opts *o, const char *url,
    nng_listener *ret, char *err, size_t errlen)
{
	int rv;
	if (strncmp(url, "tls+tcp", 7) != 0) {
		if (strncmp(url, "tcp://", 6) == 0 &&
		    strstr(url, "//127.") == NULL &&
		    strstr(url, "//localhost") == NULL &&
		    strstr(url, "//[::1]") == NULL)
			allot__log(o->lg, ALLOT_LOG_WARNING,
			    "ALLOTD-PLAINTEXT",
			    "%s is plain TCP beyond loopback: agents are not "
			    "authenticated; use tls+tcp:// with --tls-cert "
			    "and --tls-ca",
			    url);
		if ((rv = nng_listen(srv->sock, url, ret, 0)) != 0)
			snprintf(err, errlen, "cannot listen on %s: %s", url,
			    nng_strerror(rv));
		return rv;
	}
	if (o->tls_cert_key_file == NULL || o->tls_ca_file == NULL) {
		snprintf(err, errlen,
		    "cannot listen on %s: tls+tcp:// needs --tls-cert and "
		    "--tls-ca",
		    url);
		return NNG_EINVAL;
	}
	nng_tls_config *cfg;
	char why[512] = "";
	if ((rv = nng_tls_config_alloc(&cfg, NNG_TLS_MODE_SERVER)) != 0) {
		snprintf(err, errlen, "cannot listen on %s: %s", url,
		    nng_strerror(rv));
		return rv;
	}
	if ((rv = own_cert(cfg, o->tls_cert_key_file, o->tls_key_file, why,
	         sizeof why)) == 0 &&
	    (rv = nng_tls_config_ca_file(cfg, o->tls_ca_file)) != 0)
		snprintf(why, sizeof why, "%s (CA): %s", o->tls_ca_file,
		    nng_strerror(rv));
	if (rv == 0 &&
	    ((rv = nng_tls_config_auth_mode(
	          cfg, NNG_TLS_AUTH_MODE_REQUIRED)) != 0 ||
	        (rv = nng_listener_create(ret, srv->sock, url)) != 0 ||
	        (rv = nng_listener_set_ptr(*ret, NNG_OPT_TLS_CONFIG, cfg)) !=
	            0 ||
	        (rv = nng_listener_start(*ret, 0)) != 0))
		snprintf(why, sizeof why, "%s", nng_strerror(rv));
	nng_tls_config_free(cfg);
	if (rv != 0)
		snprintf(err, errlen, "cannot listen on %s: %s", url, why);
	return rv;
}

bool
allot__server_conn_open(void *ctx, uint32_t pipe)
{
	(void) ctx;
	nng_pipe p = NNG_PIPE_INITIALIZER;
	nng_sockaddr sa;
	/* nng forgets a pipe's id once its connection has closed. */
	p.id = pipe;
	return nng_pipe_get_addr(p, NNG_OPT_REMADDR, &sa) == 0;
}

/* A connection closed: its own message budget, if it had one, goes. */
static void
on_pipe_removed(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	allot__peerlimit *pl = arg;
	int id = nng_pipe_id(p);
	if (ev == NNG_PIPE_EV_REM_POST && id > 0)
		allot__peerlimit_unbind(pl, (uint32_t) id);
}

int
allot__server_start(const allot__server_opts *opts, char *err, size_t errlen,
    allot__server **ret)
{
	if (opts == NULL || opts->state == NULL || opts->nurls == 0 ||
	    opts->workers == 0 || opts->max_msg == 0) {
		snprintf(err, errlen, "invalid server options");
		return ALLOT_EINVAL;
	}
	allot__server *srv = calloc(1, sizeof *srv);
	if (srv == NULL) {
		snprintf(err, errlen, "out of memory");
		return ALLOT_ENOMEM;
	}
	int rc = ALLOT_ENOMEM;
	srv->o = *opts;
	srv->dc = (allot__dispatch_ctx) {
		.state = opts->state,
		.authn = opts->authn,
		.peerlimit = opts->peerlimit,
		.cluster = opts->cluster,
		.metrics = opts->metrics,
		.max_msg = opts->max_msg,
		.max_reports = opts->max_reports,
		.max_keys = opts->max_keys,
	};
	if (opts->lg != NULL)
		srv->lgv = *opts->lg;
	for (int r = 0; r < ALLOT__REJ_COUNT; r++)
		srv->rl[r] = (allot__logrl) ALLOT__LOGRL_INIT(5, 10000);
	srv->rl_io = (allot__logrl) ALLOT__LOGRL_INIT(5, 10000);
	srv->listeners = calloc(opts->nurls, sizeof *srv->listeners);
	srv->workers = calloc(opts->workers, sizeof *srv->workers);
	if (srv->listeners == NULL || srv->workers == NULL) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	int rv = nng_rep0_open(&srv->sock);
	if (rv != 0) {
		snprintf(err, errlen, "cannot open a rep0 socket: %s",
		    nng_strerror(rv));
		rc = ALLOT_EIO;
		goto fail;
	}
	srv->sock_open = true;
	if (opts->peerlimit != NULL)
		nng_pipe_notify(srv->sock, NNG_PIPE_EV_REM_POST,
		    on_pipe_removed, opts->peerlimit);
	/* nng drops (and closes the connection of) anything above its own
	 * limit without telling us; keep that limit above ours so that
	 * merely large messages are answered TOO_LARGE and counted. */
	nng_socket_set_size(srv->sock, NNG_OPT_RECVMAXSZ, 2 * opts->max_msg);
	srv->nworkers = opts->workers;
	for (size_t i = 0; i < srv->nworkers; i++) {
		worker *w = &srv->workers[i];
		w->srv = srv;
		w->pa.alloc = allot__arena_alloc;
		w->pa.free = allot__arena_free;
		w->pa.allocator_data = &w->arena;
		if ((rv = nng_aio_alloc(&w->aio, worker_cb, w)) != 0 ||
		    (rv = nng_ctx_open(&w->ctx, srv->sock)) != 0) {
			snprintf(err, errlen, "cannot create worker %zu: %s",
			    i, nng_strerror(rv));
			rc = ALLOT_EIO;
			goto fail;
		}
		w->ctx_open = true;
	}
	for (size_t i = 0; i < opts->nurls; i++) {
		rv = listen_url(
		    srv, opts, opts->urls[i], &srv->listeners[i], err, errlen);
		if (rv != 0) {
			rc = rv == NNG_EADDRINUSE || rv == NNG_EADDRINVAL ||
			        rv == NNG_EINVAL || rv == NNG_ENOTSUP ?
			    ALLOT_EINVAL :
			    ALLOT_EIO;
			goto fail;
		}
		srv->nlisteners++;
	}
	for (size_t i = 0; i < srv->nworkers; i++)
		worker_recv(&srv->workers[i]);
	*ret = srv;
	return ALLOT_OK;
fail:
	allot__server_close(srv);
	return rc;
}

void
allot__server_drain(allot__server *srv)
{
	if (srv == NULL)
		return;
	atomic_store(&srv->draining, true);
	for (size_t i = 0; i < srv->nlisteners; i++)
		nng_listener_close(srv->listeners[i]);
	srv->nlisteners = 0;
}

bool
allot__server_idle(allot__server *srv)
{
	return srv == NULL || atomic_load(&srv->busy) == 0;
}

/* nng_close() on a thread of its own, so that the caller can stop
 * waiting for it (allot__server_close()). */
static void *
close_socket(void *arg)
{
	nng_close(*(nng_socket *) arg);
	return NULL;
}

/* Close `sock`, waiting at most SOCKET_CLOSE_MS: false when it did not
 * close in that time. nng 1.5.2 (Debian 12's) can leave the receive of a
 * connection the peer closes just as the socket closes prepared but never
 * run (nanomsg/nng#1543): its reaper then waits for that receive forever,
 * and nng_close() with it. */
static bool
close_socket_bounded(nng_socket *sock)
{
	pthread_t th;
	if (pthread_create(&th, NULL, close_socket, sock) != 0) {
		nng_close(*sock);
		return true;
	}
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += SOCKET_CLOSE_MS / 1000;
	until.tv_nsec += (long) (SOCKET_CLOSE_MS % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	if (pthread_timedjoin_np(th, NULL, &until) == 0)
		return true;
	pthread_detach(th);
	return false;
}

bool
allot__server_close(allot__server *srv)
{
	if (srv == NULL)
		return true;
	atomic_store(&srv->closing, true);
	for (size_t i = 0; i < srv->nlisteners; i++)
		nng_listener_close(srv->listeners[i]);
	srv->nlisteners = 0;
	/* Stop each aio (waiting for a running callback), then the
	 * contexts and the socket; freeing an aio waits as well. */
	if (srv->workers != NULL) {
		for (size_t i = 0; i < srv->nworkers; i++)
			if (srv->workers[i].aio != NULL)
				nng_aio_stop(srv->workers[i].aio);
		for (size_t i = 0; i < srv->nworkers; i++) {
			worker *w = &srv->workers[i];
			if (w->ctx_open)
				nng_ctx_close(w->ctx);
			w->ctx_open = false;
		}
	}
	if (srv->sock_open && !close_socket_bounded(&srv->sock)) {
		/* The workers are stopped: nothing of ours runs any more.
		 * What nng may still touch (the socket, the pipe callback's
		 * budgets) is left to the process's exit. */
		allot__log(srv->o.lg, ALLOT_LOG_WARNING, "ALLOTD-CLOSE-STUCK",
		    "the protocol socket did not close within %u ms (an nng "
		    "1.5 race with a connection closing at the same time); "
		    "left open",
		    (unsigned) SOCKET_CLOSE_MS);
		return false;
	}
	srv->sock_open = false;
	if (srv->workers != NULL) {
		for (size_t i = 0; i < srv->nworkers; i++) {
			worker *w = &srv->workers[i];
			/* nng_aio_stop() ran the callback, which freed any
			 * reply it still owned. */
			if (w->aio != NULL)
				nng_aio_free(w->aio);
			allot__arena_destroy(&w->arena);
		}
	}
	free(srv->workers);
	free(srv->listeners);
	free(srv);
	return true;
}
