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

typedef struct allot__dashboard_header {
	const char *name;
	const char *value;
} allot__dashboard_header;

/* The response headers of the page, ending with { NULL, NULL }: its
 * type, no caching, and a Content-Security-Policy that lets it reach only
 * its own origin (no scripts, styles, fonts or images from anywhere). */
extern const allot__dashboard_header allot__dashboard_headers[];

/* The embedded page: its bytes (not NUL-terminated) and length. */
const unsigned char *allot__dashboard_page(size_t *ret_len);

#endif
