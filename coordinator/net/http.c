/* SPDX-License-Identifier: MIT */
/*
 * The HTTP endpoints (http.h) on libmicrohttpd, one internal epoll
 * thread. The listener is bounded so that no client can take it, or the
 * process's descriptors, from anyone else: a cap on open connections, a
 * smaller cap per client address, and an idle timeout that also bounds how
 * long a client may take to send its request headers (libmicrohttpd counts
 * it from the last byte received, so a client that holds a connection
 * open without a complete request is closed after it). Connections over a
 * cap are refused at accept, counted and logged (rate-limited); the
 * descriptors this leaves free belong to the sync port, whose listener and
 * agents' pipes live in nng.
 *
 * libmicrohttpd's stop joins its thread, so once allot__http_stop()
 * returns no handler runs and none will: no reference counting is needed
 * around the state and the metrics.
 */
#include "http.h"
#include "consensus/cluster.h"
#include "dashboard.h"
#include "web/addr.h"
#include "web/reply.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

struct allot__http {
	_Atomic bool draining;
	allot__state *state;
	allot__metrics *metrics;
	allot__cluster *cluster;
	allot__logger lg;
	allot__logrl refused_rl; /* ALLOTD-HTTP-REFUSED */
	allot__logrl mhd_rl; /* ALLOTD-HTTP */
	allot__http_limits lim;
	_Atomic uint32_t open; /* connections open now */
	struct MHD_Daemon *d;
};

void
allot__http_limits_init(allot__http_limits *l)
{
	l->max_connections = ALLOT__HTTP_MAX_CONNECTIONS;
	l->max_per_address = ALLOT__HTTP_MAX_PER_ADDRESS;
	l->idle_timeout_s = ALLOT__HTTP_IDLE_TIMEOUT_S;
}

/* ---- endpoints ---- */

static enum MHD_Result
on_metrics(allot__http *h, struct MHD_Connection *c)
{
	allot__buf b = { 0 };
	allot__metrics_render(h->metrics, &b);
	allot__state_render_metrics(h->state, &b);
	if (h->cluster != NULL)
		allot__cluster_render_metrics(h->cluster, &b);
	return allot__web_buf(
	    c, "text/plain; version=0.0.4; charset=utf-8", &b);
}

static enum MHD_Result
on_status(allot__http *h, struct MHD_Connection *c)
{
	allot__buf b = { 0 };
	allot__state_render_status(h->state, &b);
	size_t end = b.len;
	while (end > 0 && b.p[end - 1] == '\n')
		end--;
	if (h->cluster != NULL && !b.oom && end > 0 && b.p[end - 1] == '}') {
		/* The state's object, with the cluster's added. */
		b.len = end - 1;
		allot__buf_puts(&b, ",\"cluster\":");
		allot__cluster_render_status(h->cluster, &b);
		allot__buf_puts(&b, "}\n");
	}
	return allot__web_buf(c, "application/json", &b);
}

static enum MHD_Result
on_dashboard(struct MHD_Connection *c)
{
	size_t len;
	const unsigned char *page = allot__dashboard_page(&len);
	return allot__web_reply(c, MHD_HTTP_OK, ALLOT__DASHBOARD_TYPE,
	    allot__dashboard_headers, page, len, ALLOT__WEB_STATIC);
}

static enum MHD_Result
on_request(void *cls, struct MHD_Connection *c, const char *url,
    const char *method, const char *version, const char *upload_data,
    size_t *upload_data_size, void **req_cls)
{
	allot__http *h = cls;
	(void) version;
	(void) upload_data;
	if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
	    strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
		return allot__web_text(c, MHD_HTTP_METHOD_NOT_ALLOWED,
		    "only GET and HEAD are served here");
	/* A GET with a body: answer once it has been read (and ignored). */
	if (*req_cls == NULL) {
		*req_cls = h;
		if (*upload_data_size != 0) {
			*upload_data_size = 0;
			return MHD_YES;
		}
	} else if (*upload_data_size != 0) {
		*upload_data_size = 0;
		return MHD_YES;
	}
	if (strcmp(url, "/healthz") == 0)
		return atomic_load(&h->draining) ?
		    allot__web_text(c, MHD_HTTP_SERVICE_UNAVAILABLE,
		        "allotd is shutting down") :
		    allot__web_text(c, MHD_HTTP_OK, "ok");
	if (strcmp(url, "/metrics") == 0)
		return on_metrics(h, c);
	if (strcmp(url, "/status") == 0)
		return on_status(h, c);
	if (strcmp(url, "/") == 0)
		return on_dashboard(c);
	return allot__web_text(c, MHD_HTTP_NOT_FOUND, "not found");
}

/* ---- connection accounting ---- */

/* Accept policy: the global cap, checked here so that a refusal is
 * counted and logged (the per-address cap is libmicrohttpd's, logged
 * through on_mhd_log). Runs on the listener's thread. */
static enum MHD_Result
on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
	allot__http *h = cls;
	(void) addrlen;
	if (atomic_load(&h->open) < h->lim.max_connections)
		return MHD_YES;
	allot__metrics_add(&h->metrics->http_refused, 1);
	char who[64];
	allot__web_addr_text(addr, who, sizeof who);
	allot__log_ratelimited(&h->lg, &h->refused_rl, ALLOT_LOG_WARNING,
	    "ALLOTD-HTTP-REFUSED",
	    "HTTP connection from %s refused: %u open, the cap "
	    "(--http-max-connections)",
	    who, h->lim.max_connections);
	return MHD_NO;
}

static void
on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx,
    enum MHD_ConnectionNotificationCode code)
{
	allot__http *h = cls;
	(void) c;
	(void) socket_ctx;
	if (code == MHD_CONNECTION_NOTIFY_STARTED) {
		atomic_fetch_add(&h->open, 1);
		allot__metrics_add(&h->metrics->http_connections, 1);
	} else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
		atomic_fetch_sub(&h->open, 1);
	}
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

static void
on_mhd_log(void *cls, const char *fmt, va_list ap)
{
	allot__http *h = cls;
	char msg[256];
	vsnprintf(msg, sizeof msg, fmt, ap);
	size_t n = strlen(msg);
	while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '.'))
		msg[--n] = '\0';
	if (strstr(msg, "limit") != NULL)
		allot__metrics_add(&h->metrics->http_refused, 1);
	allot__log_ratelimited(&h->lg, &h->mhd_rl, ALLOT_LOG_WARNING,
	    "ALLOTD-HTTP", "HTTP listener: %s", msg);
}

/* ---- start and stop ---- */

int
allot__http_start(const char *addr, const allot__http_limits *lim,
    allot__state *st, allot__metrics *m, allot__cluster *cl,
    const allot__logger *lg, char *err, size_t errlen, allot__http **ret)
{
	if (addr == NULL || st == NULL || m == NULL) {
		snprintf(err, errlen, "invalid HTTP options");
		return ALLOT_EINVAL;
	}
	allot__http_limits dflt;
	allot__http_limits_init(&dflt);
	if (lim == NULL)
		lim = &dflt;
	if (lim->max_connections == 0 || lim->max_per_address == 0 ||
	    lim->idle_timeout_s == 0) {
		snprintf(err, errlen,
		    "invalid HTTP limits: connections, per address and idle "
		    "timeout must be at least 1");
		return ALLOT_EINVAL;
	}
	struct sockaddr_storage sa;
	int rv = allot__web_parse_addr(addr, "http", &sa, err, errlen);
	if (rv != ALLOT_OK)
		return rv;
	allot__http *h = calloc(1, sizeof *h);
	if (h == NULL) {
		snprintf(err, errlen, "out of memory");
		return ALLOT_ENOMEM;
	}
	h->state = st;
	h->metrics = m;
	h->cluster = cl;
	h->lim = *lim;
	if (lg != NULL)
		h->lg = *lg;
	h->refused_rl = (allot__logrl) ALLOT__LOGRL_INIT(5, 10000);
	h->mhd_rl = (allot__logrl) ALLOT__LOGRL_INIT(5, 10000);
	unsigned int flags = MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
	if (sa.ss_family == AF_INET6)
		flags |= MHD_USE_IPv6;
	/* libmicrohttpd's own cap sits one above ours: ours refuses first
	 * (counted), its own is the backstop. */
	h->d = MHD_start_daemon(flags, 0, on_accept, h, on_request, h,
	    MHD_OPTION_SOCK_ADDR, (struct sockaddr *) &sa,
	    MHD_OPTION_CONNECTION_LIMIT,
	    (unsigned int) lim->max_connections + 1,
	    MHD_OPTION_PER_IP_CONNECTION_LIMIT,
	    (unsigned int) lim->max_per_address, MHD_OPTION_CONNECTION_TIMEOUT,
	    (unsigned int) lim->idle_timeout_s,
	    MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t) 32768,
	    MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
	    MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, h, MHD_OPTION_END);
	if (h->d == NULL) {
		snprintf(err, errlen,
		    "cannot listen for HTTP on %s (address in use or not "
		    "local?)",
		    addr);
		free(h);
		return ALLOT_EINVAL;
	}
	*ret = h;
	return ALLOT_OK;
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
	MHD_stop_daemon(h->d);
	free(h);
}
