/* SPDX-License-Identifier: MIT */
/*
 * allotd's HTTP endpoints on their own port, served by libmicrohttpd:
 * GET /metrics (Prometheus text format 0.0.4), GET /status (JSON: config,
 * replicas, per-quota figures and shares), GET /healthz ("ok", or 503
 * while draining) and GET / (the dashboard page). Handlers run on the
 * listener's own thread and only read: they take the state's mutex while
 * rendering. The listener is bounded (allot__http_limits): no client,
 * idle or slow, can hold more than its part of it.
 */
#ifndef ALLOT_COORDINATOR_HTTP_H
#define ALLOT_COORDINATOR_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "log.h"
#include "state/metrics.h"
#include "state/state.h"

typedef struct allot__cluster allot__cluster;
typedef struct allot__http allot__http;

/* Defaults of allotd's --http-max-connections, --http-max-per-address and
 * --http-idle-timeout. */
#define ALLOT__HTTP_MAX_CONNECTIONS 128u
#define ALLOT__HTTP_MAX_PER_ADDRESS 32u
#define ALLOT__HTTP_IDLE_TIMEOUT_S 10u

typedef struct allot__http_limits {
	uint32_t max_connections; /* open at once, all clients */
	uint32_t max_per_address; /* open at once from one IP address */
	/* Seconds a connection may stay without receiving a byte: idle
	 * between requests, or stalled while sending its headers. */
	uint32_t idle_timeout_s;
} allot__http_limits;

void allot__http_limits_init(allot__http_limits *l);

/* Listen on `addr`: "HOST:PORT", "[V6]:PORT" or a full "http://" URL,
 * within `lim` (NULL: the defaults). `cl` (NULL unless a cluster member)
 * adds the cluster's series and the /status "cluster" object; it must
 * outlive allot__http_stop(). On failure `err` says why and nothing is
 * left running. */
int allot__http_start(const char *addr, const allot__http_limits *lim,
    allot__state *st, allot__metrics *m, allot__cluster *cl,
    const allot__logger *lg, char *err, size_t errlen, allot__http **ret);

/* Answer /healthz with 503 from now on. */
void allot__http_drain(allot__http *h);

/* Stop serving; when it returns no handler is running. Accepts NULL. Not
 * from a handler. */
void allot__http_stop(allot__http *h);

#endif
