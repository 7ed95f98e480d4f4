/* SPDX-License-Identifier: MIT */
/*
 * The HTTP endpoints (http.h) on nng's HTTP server. nng tears connections
 * down asynchronously, so a handler may still run after
 * nng_http_server_stop() returns; the shared context therefore counts the
 * handlers inside it and is reference-counted by the handlers, which nng
 * releases (running our destructor) only once the server is finalised.
 */
#include "http.h"
#include "dashboard.h"
#include "cluster.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/supplemental/http/http.h>

struct allot__http {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int refs; /* the owner plus one per handler */
	int active; /* handlers using state/metrics */
	bool stopped;
	_Atomic bool draining;
	allot__state *state;
	allot__metrics *metrics;
	allot__cluster *cluster;
	allot__logger lg;
	nng_http_server *srv;
	nng_url *url;
};

static void
unref(void *arg)
{
	allot__http *h = arg;
	pthread_mutex_lock(&h->mu);
	bool last = --h->refs == 0;
	pthread_mutex_unlock(&h->mu);
	if (!last)
		return;
	pthread_cond_destroy(&h->cv);
	pthread_mutex_destroy(&h->mu);
	free(h);
}

static bool
enter(allot__http *h)
{
	pthread_mutex_lock(&h->mu);
	bool ok = !h->stopped;
	if (ok)
		h->active++;
	pthread_mutex_unlock(&h->mu);
	return ok;
}

static void
leave(allot__http *h)
{
	pthread_mutex_lock(&h->mu);
	if (--h->active == 0)
		pthread_cond_broadcast(&h->cv);
	pthread_mutex_unlock(&h->mu);
}

static void
respond(nng_aio *aio, uint16_t status, const char *type, const char *body,
    size_t len)
{
	nng_http_res *res;
	if (nng_http_res_alloc(&res) != 0) {
		nng_aio_finish(aio, NNG_ENOMEM);
		return;
	}
	if (nng_http_res_set_status(res, status) != 0 ||
	    nng_http_res_set_header(res, "Content-Type", type) != 0 ||
	    nng_http_res_set_header(res, "Cache-Control", "no-store") != 0 ||
	    nng_http_res_copy_data(res, body, len) != 0) {
		nng_http_res_free(res);
		nng_aio_finish(aio, NNG_ENOMEM);
		return;
	}
	nng_aio_set_output(aio, 0, res);
	nng_aio_finish(aio, 0);
}

static allot__http *
ctx_of(nng_aio *aio)
{
	return nng_http_handler_get_data(nng_aio_get_input(aio, 1));
}

static void
unavailable(nng_aio *aio)
{
	static const char msg[] = "allotd is shutting down\n";
	respond(aio, NNG_HTTP_STATUS_SERVICE_UNAVAILABLE,
	    "text/plain; charset=utf-8", msg, sizeof msg - 1);
}

static void
on_metrics(nng_aio *aio)
{
	allot__http *h = ctx_of(aio);
	if (!enter(h)) {
		unavailable(aio);
		return;
	}
	allot__buf b = { 0 };
	allot__metrics_render(h->metrics, &b);
	allot__state_render_metrics(h->state, &b);
	if (h->cluster != NULL)
		allot__cluster_render_metrics(h->cluster, &b);
	leave(h);
	if (b.oom) {
		allot__buf_free(&b);
		nng_aio_finish(aio, NNG_ENOMEM);
		return;
	}
	respond(aio, NNG_HTTP_STATUS_OK,
	    "text/plain; version=0.0.4; charset=utf-8", b.p, b.len);
	allot__buf_free(&b);
}

static void
on_status(nng_aio *aio)
{
	allot__http *h = ctx_of(aio);
	if (!enter(h)) {
		unavailable(aio);
		return;
	}
	allot__buf b = { 0 };
	allot__state_render_status(h->state, &b);
	size_t end = b.len;
	while (end > 0 && b.p[end - 1] == '\n')
		end--;
	if (h->cluster != NULL && !b.oom && end > 0 && b.p[end - 1] == '}') {
		/* The registry's object, with the cluster's added. */
		b.len = end - 1;
		allot__buf_puts(&b, ",\"cluster\":");
		allot__cluster_render_status(h->cluster, &b);
		allot__buf_puts(&b, "}\n");
	}
	leave(h);
	if (b.oom) {
		allot__buf_free(&b);
		nng_aio_finish(aio, NNG_ENOMEM);
		return;
	}
	respond(aio, NNG_HTTP_STATUS_OK, "application/json", b.p, b.len);
	allot__buf_free(&b);
}

static void
on_healthz(nng_aio *aio)
{
	allot__http *h = ctx_of(aio);
	if (atomic_load(&h->draining)) {
		unavailable(aio);
		return;
	}
	static const char ok[] = "ok\n";
	respond(aio, NNG_HTTP_STATUS_OK, "text/plain; charset=utf-8", ok,
	    sizeof ok - 1);
}

static int
add_handler(allot__http *h, const char *path, void (*cb)(nng_aio *))
{
	nng_http_handler *hd;
	int rv = nng_http_handler_alloc(&hd, path, cb);
	if (rv != 0)
		return rv;
	nng_http_handler_collect_body(hd, false, 0);
	pthread_mutex_lock(&h->mu);
	h->refs++;
	pthread_mutex_unlock(&h->mu);
	nng_http_handler_set_data(hd, h, unref);
	if ((rv = nng_http_server_add_handler(h->srv, hd)) != 0)
		nng_http_handler_free(hd); /* runs unref */
	return rv;
}

int
allot__http_start(const char *addr, allot__state *st, allot__metrics *m,
    allot__cluster *cl, const allot__logger *lg, char *err, size_t errlen,
    allot__http **ret)
{
	char url[512];
	if (addr == NULL || st == NULL || m == NULL) {
		snprintf(err, errlen, "invalid HTTP options");
		return ALLOT_EINVAL;
	}
	if (strstr(addr, "://") != NULL)
		snprintf(url, sizeof url, "%s", addr);
	else
		snprintf(url, sizeof url, "http://%s", addr);
	allot__http *h = calloc(1, sizeof *h);
	if (h == NULL) {
		snprintf(err, errlen, "out of memory");
		return ALLOT_ENOMEM;
	}
	pthread_mutex_init(&h->mu, NULL);
	pthread_cond_init(&h->cv, NULL);
	h->refs = 1;
	h->state = st;
	h->metrics = m;
	h->cluster = cl;
	if (lg != NULL)
		h->lg = *lg;
	int rv = nng_url_parse(&h->url, url);
	if (rv != 0) {
		snprintf(err, errlen, "bad HTTP address %s: %s", addr,
		    nng_strerror(rv));
		goto fail;
	}
	if ((rv = nng_http_server_hold(&h->srv, h->url)) != 0 ||
	    (rv = add_handler(h, "/metrics", on_metrics)) != 0 ||
	    (rv = add_handler(h, "/status", on_status)) != 0 ||
	    (rv = add_handler(h, "/healthz", on_healthz)) != 0 ||
	    (rv = add_handler(h, "/", allot__dashboard_serve)) != 0) {
		snprintf(err, errlen, "cannot set up HTTP on %s: %s", url,
		    nng_strerror(rv));
		goto fail;
	}
	if ((rv = nng_http_server_start(h->srv)) != 0) {
		snprintf(err, errlen, "cannot listen for HTTP on %s: %s", url,
		    nng_strerror(rv));
		goto fail;
	}
	*ret = h;
	return ALLOT_OK;
fail:
	allot__http_stop(h);
	return rv == NNG_EADDRINUSE || rv == NNG_EADDRINVAL ||
	        rv == NNG_EINVAL ?
	    ALLOT_EINVAL :
	    ALLOT_EIO;
}

void
allot__http_drain(allot__http *h)
{
	if (h != NULL)
		atomic_store(&h->draining, true);
}

void
allot__http_stop(allot__http *h)
{
	if (h == NULL)
		return;
	if (h->srv != NULL)
		nng_http_server_stop(h->srv);
	pthread_mutex_lock(&h->mu);
	h->stopped = true;
	while (h->active > 0)
		pthread_cond_wait(&h->cv, &h->mu);
	pthread_mutex_unlock(&h->mu);
	if (h->srv != NULL)
		nng_http_server_release(h->srv);
	h->srv = NULL;
	if (h->url != NULL)
		nng_url_free(h->url);
	h->url = NULL;
	unref(h);
}
