/* SPDX-License-Identifier: MIT */
/*
 * allotd's HTTP endpoints on their own port, served by nng's HTTP server:
 * GET /metrics (Prometheus text format 0.0.4), GET /status (JSON: config,
 * replicas, per-quota figures and shares) and GET /healthz ("ok", or 503
 * while draining). Handlers run on nng threads and only read: they take
 * the registry's mutex while rendering.
 */
#ifndef ALLOT_COORDINATOR_HTTP_H
#define ALLOT_COORDINATOR_HTTP_H

#include <stddef.h>

#include "log.h"
#include "metrics.h"
#include "state.h"

typedef struct allot__cluster allot__cluster;
typedef struct allot__http allot__http;

/* Listen on `addr`: "HOST:PORT", "[V6]:PORT" or a full "http://" URL.
 * `cl` (NULL unless a cluster member) adds the cluster's series and the
 * /status "cluster" object; it must outlive allot__http_stop().
 * On failure `err` says why and nothing is left running. */
int allot__http_start(const char *addr, allot__state *st, allot__metrics *m,
    allot__cluster *cl, const allot__logger *lg, char *err, size_t errlen,
    allot__http **ret);

/* Answer /healthz with 503 from now on. */
void allot__http_drain(allot__http *h);

/* Stop serving and wait until no handler is using the state or the
 * metrics any longer (a request that arrives later is answered 503 by a
 * handler that touches neither). Accepts NULL. Not from a handler. */
void allot__http_stop(allot__http *h);

#endif
