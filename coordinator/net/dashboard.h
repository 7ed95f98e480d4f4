/* SPDX-License-Identifier: MIT */
/*
 * The live dashboard allotd serves at "/" on its HTTP port: one
 * self-contained HTML page (dashboard.html, embedded at build time) whose
 * script polls /status every second and draws the charts in the browser.
 * The server side is only the page and its headers: they touch neither
 * the state nor the metrics, so serving them needs no lock.
 */
#ifndef ALLOT_COORDINATOR_DASHBOARD_H
#define ALLOT_COORDINATOR_DASHBOARD_H

#include <stddef.h>

#include "web/reply.h"

/* The page's type; it is served, as every answer, not to be cached. */
#define ALLOT__DASHBOARD_TYPE "text/html; charset=utf-8"

/* The page's other response headers, ending with { NULL, NULL }: a
 * Content-Security-Policy that lets it reach only its own origin (no
 * scripts, styles, fonts or images from anywhere). */
extern const allot__web_header allot__dashboard_headers[];

/* The embedded page: its bytes (not NUL-terminated) and length. */
const unsigned char *allot__dashboard_page(size_t *ret_len);

#endif
