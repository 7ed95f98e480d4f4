/* SPDX-License-Identifier: MIT */
/*
 * The live dashboard allotd serves at "/" on its HTTP port: one
 * self-contained HTML page (dashboard.html, embedded at build time) whose
 * script polls /status every second and draws the charts in the browser.
 * The server side is only this handler: it touches neither the state nor
 * the metrics, so it needs no lock and may answer during a drain.
 */
#ifndef ALLOT_COORDINATOR_DASHBOARD_H
#define ALLOT_COORDINATOR_DASHBOARD_H

#include <nng/nng.h>

/* nng HTTP handler callback (nng_http_handler_alloc) for GET /: answers
 * 200 with the page, a Content-Security-Policy that lets it reach only
 * its own origin (and nothing else: no scripts, styles, fonts or images
 * from anywhere), and no caching. Any nng thread. */
void allot__dashboard_serve(nng_aio *aio);

#endif
