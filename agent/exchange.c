/* SPDX-License-Identifier: MIT */
/*
 * The REQ/REP exchange state machine (exchange.h). An exchange goes
 * idle -> sending -> receiving -> (outcome in) -> idle: the aio
 * callback, on an nng thread, turns a completed send into a receive and
 * records any other completion as the outcome; the owner's thread
 * collects it and returns the exchange to idle.
 */
#include "exchange.h"

#include <string.h>

#include <nng/protocol/reqrep0/req.h>

enum { IDLE, SENDING, RECEIVING };

static void
aio_cb(void *arg)
{
	allot__exchange *x = arg;
	int rv = nng_aio_result(x->aio);
	if (atomic_load(&x->phase) == SENDING) {
		if (rv == 0) {
			atomic_store(&x->phase, RECEIVING);
			nng_ctx_recv(x->ctx, x->aio);
			return;
		}
		/* Not sent: the request is still ours. */
		nng_msg_free(nng_aio_get_msg(x->aio));
		x->reply = NULL;
	} else {
		x->reply = rv == 0 ? nng_aio_get_msg(x->aio) : NULL;
	}
	x->result = rv;
	atomic_store_explicit(&x->done, true, memory_order_release);
	if (x->wake != NULL)
		x->wake(x->wake_ctx);
}

int
allot__exchange_open(allot__exchange *x, const allot__exchange_opts *o)
{
	x->wake = o->wake;
	x->wake_ctx = o->wake_ctx;
	int rv;
	if ((rv = nng_req0_open(&x->sock)) != 0)
		return rv;
	x->sock_open = true;
	nng_socket_set_ms(
	    x->sock, NNG_OPT_RECONNMINT, (nng_duration) o->reconnect_min_ms);
	nng_socket_set_ms(
	    x->sock, NNG_OPT_RECONNMAXT, (nng_duration) o->reconnect_max_ms);
	/* Never resent behind the owner's back: it retries, or not. */
	nng_socket_set_ms(
	    x->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	if (o->recv_max != 0)
		nng_socket_set_size(x->sock, NNG_OPT_RECVMAXSZ, o->recv_max);
	if ((rv = nng_ctx_open(&x->ctx, x->sock)) != 0 ||
	    (rv = nng_aio_alloc(&x->aio, aio_cb, x)) != 0)
		return rv;
	if (o->watch_link)
		return allot__link_watch(x->sock, &x->link);
	return 0;
}

int
allot__exchange_open_beside(allot__exchange *x, const allot__exchange *base,
    void (*wake)(void *ctx), void *wake_ctx)
{
	x->wake = wake;
	x->wake_ctx = wake_ctx;
	x->sock = base->sock;
	int rv;
	if ((rv = nng_ctx_open(&x->ctx, x->sock)) != 0)
		return rv;
	x->ctx_open = true;
	return nng_aio_alloc(&x->aio, aio_cb, x);
}

void
allot__exchange_close(allot__exchange *x)
{
	if (x->aio != NULL)
		nng_aio_stop(x->aio);
	if (x->reply != NULL)
		nng_msg_free(x->reply);
	x->reply = NULL;
	if (x->ctx_open)
		nng_ctx_close(x->ctx);
	x->ctx_open = false;
	if (x->sock_open)
		nng_close(x->sock);
	x->sock_open = false;
	if (x->aio != NULL)
		nng_aio_free(x->aio);
	x->aio = NULL;
}

void
allot__exchange_send_msg(allot__exchange *x, nng_msg *m, uint32_t timeout_ms)
{
	atomic_store(&x->done, false);
	atomic_store(&x->phase, SENDING);
	nng_aio_set_msg(x->aio, m);
	nng_aio_set_timeout(x->aio, (nng_duration) timeout_ms);
	nng_ctx_send(x->ctx, x->aio);
}

int
allot__exchange_send(
    allot__exchange *x, const void *buf, size_t len, uint32_t timeout_ms)
{
	nng_msg *m;
	if (nng_msg_alloc(&m, len) != 0)
		return NNG_ENOMEM;
	memcpy(nng_msg_body(m), buf, len);
	allot__exchange_send_msg(x, m, timeout_ms);
	return 0;
}

void
allot__exchange_fail(allot__exchange *x, int err)
{
	x->result = err;
	x->reply = NULL;
	atomic_store(&x->done, true);
	atomic_store(&x->phase, SENDING);
}

void
allot__exchange_cancel(allot__exchange *x)
{
	nng_aio_cancel(x->aio);
}

bool
allot__exchange_finish(
    allot__exchange *x, int *ret_result, nng_msg **ret_reply)
{
	if (atomic_load(&x->phase) == IDLE ||
	    !atomic_load_explicit(&x->done, memory_order_acquire))
		return false;
	atomic_store(&x->done, false);
	atomic_store(&x->phase, IDLE);
	*ret_result = x->result;
	*ret_reply = x->result == 0 ? x->reply : NULL;
	x->reply = NULL;
	return true;
}

void
allot__exchange_stop(allot__exchange *x)
{
	nng_aio_stop(x->aio);
	if (x->reply != NULL) {
		nng_msg_free(x->reply);
		x->reply = NULL;
	}
	atomic_store(&x->phase, IDLE);
}

int
allot__exchange_call(
    allot__exchange *x, const void *buf, size_t len, uint32_t timeout_ms)
{
	nng_aio *aio;
	nng_msg *m;
	int rv;
	if ((rv = nng_aio_alloc(&aio, NULL, NULL)) != 0)
		return rv;
	if ((rv = nng_msg_alloc(&m, len)) != 0) {
		nng_aio_free(aio);
		return rv;
	}
	memcpy(nng_msg_body(m), buf, len);
	nng_aio_set_msg(aio, m);
	nng_aio_set_timeout(aio, (nng_duration) timeout_ms);
	nng_ctx_send(x->ctx, aio);
	nng_aio_wait(aio);
	if ((rv = nng_aio_result(aio)) != 0) {
		nng_msg_free(nng_aio_get_msg(aio));
	} else {
		nng_ctx_recv(x->ctx, aio);
		nng_aio_wait(aio);
		if ((rv = nng_aio_result(aio)) == 0)
			nng_msg_free(nng_aio_get_msg(aio));
	}
	nng_aio_free(aio);
	return rv;
}
