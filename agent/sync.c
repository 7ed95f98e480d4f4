/* SPDX-License-Identifier: MIT */
/*
 * The agent's sync transport: a libuv loop on the agent's own thread that
 * runs the sync engine (sync_core.c) against allotd over nng REQ/REP
 * (schema/allot.proto). Every interval T, with jitter, it sends the
 * engine's request and feeds it the reply; allowances are installed into
 * the buckets atomically (bucket.h), so acquirers never wait.
 *
 * Threads: nng completes each exchange on its own threads; the completion
 * only records the result and wakes the loop with uv_async_send. Engine
 * state is touched by the loop thread alone. Destroy wakes the loop,
 * which cancels any exchange in flight, sends a graceful Leave (bounded
 * to 300 ms), closes its handles and exits; uv_loop_close() must succeed.
 */
#include "sync_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>
#include <uv.h>

enum phase { IDLE, SENDING, RECEIVING };

struct allot__sync {
	allot__syncc core;
	uv_loop_t loop;
	uv_thread_t thread;
	uv_timer_t timer;
	uv_async_t wake;

	nng_socket sock;
	nng_ctx ctx;
	nng_aio *aio;
	_Atomic int phase;      /* enum phase; nng thread and loop thread */
	_Atomic int done;       /* an exchange completed */
	_Atomic int stopping;
	int result;             /* written by the nng thread before `done` */
	nng_msg *reply;
};

static uint64_t
now_ns(const allot_agent *a)
{
	return allot__agent_now(a);
}

static uint32_t
request_timeout_ms(const allot_agent *a)
{
	uint32_t t = a->opts.sync_interval_ms * 2;
	return t < 250 ? 250 : t > 2000 ? 2000 : t;
}

/* ---- completion, on an nng thread ---- */

static void
post(struct allot__sync *s, int rv)
{
	s->result = rv;
	atomic_store_explicit(&s->done, 1, memory_order_release);
	uv_async_send(&s->wake);
}

static void
aio_cb(void *arg)
{
	struct allot__sync *s = arg;
	int rv = nng_aio_result(s->aio);
	if (atomic_load(&s->phase) == SENDING) {
		if (rv != 0) {
			nng_msg_free(nng_aio_get_msg(s->aio));
			post(s, rv);
			return;
		}
		atomic_store(&s->phase, RECEIVING);
		nng_ctx_recv(s->ctx, s->aio);
		return;
	}
	s->reply = rv == 0 ? nng_aio_get_msg(s->aio) : NULL;
	post(s, rv);
}

/* ---- the loop ---- */

static void on_timer(uv_timer_t *t);

static void
schedule(struct allot__sync *s, uint64_t delay_ms)
{
	uv_timer_start(&s->timer, on_timer, delay_ms, 0);
}

static void
start_exchange(struct allot__sync *s)
{
	allot_agent *a = s->core.a;
	uint64_t now = now_ns(a);
	void *buf;
	size_t len;
	nng_msg *m;
	if (allot__syncc_request(&s->core, now, &buf, &len) != ALLOT_OK) {
		allot__syncc_failed(&s->core, now, "out of memory");
		schedule(s, allot__syncc_next_delay_ms(&s->core, now, false));
		return;
	}
	if (nng_msg_alloc(&m, len) != 0) {
		free(buf);
		allot__syncc_failed(&s->core, now, "out of memory");
		schedule(s, allot__syncc_next_delay_ms(&s->core, now, false));
		return;
	}
	memcpy(nng_msg_body(m), buf, len);
	free(buf);
	atomic_store(&s->done, 0);
	atomic_store(&s->phase, SENDING);
	nng_aio_set_msg(s->aio, m);
	nng_aio_set_timeout(s->aio, (nng_duration) request_timeout_ms(a));
	nng_ctx_send(s->ctx, s->aio);
	/* An exchange may take up to its timeout, and nothing else wakes
	 * the loop meanwhile: if the lease runs out first, wake up then so
	 * that the fallback starts on time, not when the exchange gives up
	 * (on_timer only checks the lease while an exchange is in flight;
	 * the completion re-arms the timer). */
	const allot__syncc *c = &s->core;
	if (c->lease_until_ns != 0 && !atomic_load(&c->in_fallback)) {
		uint64_t left = c->lease_until_ns > now ?
		    (c->lease_until_ns - now) / 1000000u + 1 : 0;
		if (left < request_timeout_ms(a))
			schedule(s, left);
	}
}

static void
on_wake(uv_async_t *h)
{
	struct allot__sync *s = h->data;
	if (atomic_load(&s->stopping)) {
		uv_stop(&s->loop);
		return;
	}
	if (atomic_load(&s->phase) == IDLE ||
	    !atomic_load_explicit(&s->done, memory_order_acquire))
		return;
	atomic_store(&s->done, 0);
	atomic_store(&s->phase, IDLE);
	uint64_t now = now_ns(s->core.a);
	bool ok = false;
	if (s->result != 0) {
		allot__syncc_failed(&s->core, now, nng_strerror(s->result));
	} else {
		ok = allot__syncc_reply(&s->core, now, nng_msg_body(s->reply),
		    nng_msg_len(s->reply));
		nng_msg_free(s->reply);
		s->reply = NULL;
	}
	allot__syncc_check_lease(&s->core, now);
	schedule(s, allot__syncc_next_delay_ms(&s->core, now, ok));
}

static void
on_timer(uv_timer_t *t)
{
	struct allot__sync *s = t->data;
	allot__syncc_check_lease(&s->core, now_ns(s->core.a));
	if (atomic_load(&s->phase) != IDLE)
		return;
	start_exchange(s);
}

static void
send_leave(struct allot__sync *s)
{
	void *buf;
	size_t len;
	if (allot__syncc_leave(&s->core, &buf, &len) != ALLOT_OK)
		return;
	nng_aio *aio;
	nng_msg *m;
	if (nng_aio_alloc(&aio, NULL, NULL) != 0) {
		free(buf);
		return;
	}
	if (nng_msg_alloc(&m, len) == 0) {
		memcpy(nng_msg_body(m), buf, len);
		nng_aio_set_msg(aio, m);
		nng_aio_set_timeout(aio, 300);
		nng_ctx_send(s->ctx, aio);
		nng_aio_wait(aio);
		if (nng_aio_result(aio) != 0) {
			nng_msg_free(nng_aio_get_msg(aio));
		} else {
			nng_ctx_recv(s->ctx, aio);
			nng_aio_wait(aio);
			if (nng_aio_result(aio) == 0)
				nng_msg_free(nng_aio_get_msg(aio));
		}
	}
	free(buf);
	nng_aio_free(aio);
	allot__log(&s->core.a->log, ALLOT_LOG_INFO, "ALLOT-SYNC-LEAVE",
	    "left session %llu", (unsigned long long) s->core.session);
}

static void
close_cb(uv_handle_t *h)
{
	(void) h;
}

static void
thread_main(void *arg)
{
	struct allot__sync *s = arg;
	schedule(s, 0);
	uv_run(&s->loop, UV_RUN_DEFAULT);
	/* Stopping: cancel the exchange in flight, then leave. */
	nng_aio_stop(s->aio);
	if (s->reply != NULL) {
		nng_msg_free(s->reply);
		s->reply = NULL;
	}
	atomic_store(&s->phase, IDLE);
	send_leave(s);
	uv_close((uv_handle_t *) &s->timer, close_cb);
	uv_close((uv_handle_t *) &s->wake, close_cb);
	uv_run(&s->loop, UV_RUN_DEFAULT);
}

static void
sync_free(struct allot__sync *s)
{
	if (s->aio != NULL)
		nng_aio_free(s->aio);
	nng_close(s->sock);
	allot__syncc_fini(&s->core);
	free(s);
}

/* Dial `url` in the background (nng reconnects by itself). tls+tcp://
 * gets a client TLS configuration that verifies allotd against the CA
 * and presents this replica's certificate. */
static int
dial(allot_agent *a, nng_socket sock, const char *url)
{
	if (strncmp(url, "tls+tcp", 7) != 0) {
		if (strncmp(url, "tcp://", 6) == 0)
			allot__log(&a->log, ALLOT_LOG_NOTICE, "ALLOT-SYNC-PLAIN",
			    "coordinator %s over plain TCP: local use only, "
			    "use tls+tcp:// across hosts", url);
		return nng_dial(sock, url, NULL, NNG_FLAG_NONBLOCK);
	}
	const allot_agent_options *o = &a->opts;
	if (o->tls_ca_file == NULL)
		return NNG_EINVAL;
	nng_tls_config *cfg;
	nng_dialer d;
	int rv;
	if ((rv = nng_tls_config_alloc(&cfg, NNG_TLS_MODE_CLIENT)) != 0)
		return rv;
	if ((rv = nng_tls_config_ca_file(cfg, o->tls_ca_file)) != 0 ||
	    (o->tls_cert_key_file != NULL &&
		(rv = nng_tls_config_cert_key_file(cfg, o->tls_cert_key_file,
		     NULL)) != 0) ||
	    (o->tls_server_name != NULL &&
		(rv = nng_tls_config_server_name(cfg, o->tls_server_name)) !=
		    0) ||
	    (rv = nng_tls_config_auth_mode(cfg,
		 NNG_TLS_AUTH_MODE_REQUIRED)) != 0 ||
	    (rv = nng_dialer_create(&d, sock, url)) != 0 ||
	    (rv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, cfg)) != 0 ||
	    (rv = nng_dialer_start(d, NNG_FLAG_NONBLOCK)) != 0) {
		nng_tls_config_free(cfg);
		return rv;
	}
	nng_tls_config_free(cfg); /* the dialer holds its own reference */
	return 0;
}

int
allot__sync_start(allot_agent *a)
{
	struct allot__sync *s = calloc(1, sizeof *s);
	if (s == NULL)
		return ALLOT_ENOMEM;
	if (allot__syncc_init(&s->core, a,
		allot__hash_seed() ^ (uint64_t) getpid()) != ALLOT_OK) {
		free(s);
		return ALLOT_ENOMEM;
	}
	/* One coordinator per agent: the first address is used. */
	char url[512];
	snprintf(url, sizeof url, "%s", a->coordinator);
	char *comma = strchr(url, ',');
	if (comma != NULL)
		*comma = '\0';

	int rv;
	if ((rv = nng_req0_open(&s->sock)) != 0) {
		allot__syncc_fini(&s->core);
		free(s);
		return ALLOT_ENOMEM;
	}
	nng_socket_set_ms(s->sock, NNG_OPT_RECONNMINT,
	    (nng_duration) a->opts.reconnect_min_ms);
	nng_socket_set_ms(s->sock, NNG_OPT_RECONNMAXT,
	    (nng_duration) a->opts.reconnect_max_ms);
	nng_socket_set_ms(s->sock, NNG_OPT_REQ_RESENDTIME,
	    NNG_DURATION_INFINITE);
	nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, 4u << 20);
	if ((rv = nng_ctx_open(&s->ctx, s->sock)) != 0 ||
	    (rv = nng_aio_alloc(&s->aio, aio_cb, s)) != 0) {
		sync_free(s);
		return ALLOT_ENOMEM;
	}
	if ((rv = dial(a, s->sock, url)) != 0) {
		allot__log(&a->log, ALLOT_LOG_ERR, "ALLOT-SYNC-ADDRESS",
		    "cannot use coordinator address \"%s\": %s", url,
		    nng_strerror(rv));
		sync_free(s);
		return ALLOT_EINVAL;
	}
	if (uv_loop_init(&s->loop) != 0) {
		sync_free(s);
		return ALLOT_ENOMEM;
	}
	uv_timer_init(&s->loop, &s->timer);
	s->timer.data = s;
	uv_async_init(&s->loop, &s->wake, on_wake);
	s->wake.data = s;
	a->sync = s;
	if (uv_thread_create(&s->thread, thread_main, s) != 0) {
		uv_close((uv_handle_t *) &s->timer, NULL);
		uv_close((uv_handle_t *) &s->wake, NULL);
		uv_run(&s->loop, UV_RUN_DEFAULT);
		uv_loop_close(&s->loop);
		a->sync = NULL;
		sync_free(s);
		return ALLOT_ENOMEM;
	}
	return ALLOT_OK;
}

void
allot__sync_stop(allot_agent *a)
{
	struct allot__sync *s = a->sync;
	if (s == NULL)
		return;
	atomic_store(&s->stopping, 1);
	uv_async_send(&s->wake);
	uv_thread_join(&s->thread);
	int rc = uv_loop_close(&s->loop);
	if (rc != 0)
		allot__log(&a->log, ALLOT_LOG_ERR, "ALLOT-SYNC-CLOSE",
		    "sync loop closed with handles open: %s", uv_strerror(rc));
	sync_free(s);
	a->sync = NULL;
}

int
allot_sync_stats_get(allot_agent *a, allot_sync_stats *ret)
{
	if (a == NULL || ret == NULL)
		return ALLOT_EINVAL;
	memset(ret, 0, sizeof *ret);
	if (a->sync == NULL)
		return ALLOT_OK;
	allot__syncc_stats(&a->sync->core, now_ns(a), ret);
	return ALLOT_OK;
}
