/* SPDX-License-Identifier: MIT */
/*
 * Serves the dashboard page (dashboard.h). The page is a constant: the
 * build turns dashboard.html into dashboard_html.h, so allotd needs no
 * file at run time and the page always matches the /status it reads.
 * The response headers are what keep the page self-contained in fact and
 * not only by intent: the Content-Security-Policy allows inline script
 * and style, fetches to the page's own origin (/status) and nothing else,
 * and forbids framing, so a page that tried to load an external asset
 * would fail in the browser test rather than work by accident.
 */
#include "dashboard.h"

#include <nng/supplemental/http/http.h>

#include "dashboard_html.h"

#define CSP                                                           \
	"default-src 'none'; script-src 'unsafe-inline'; "            \
	"style-src 'unsafe-inline'; connect-src 'self'; "             \
	"img-src 'self' data:; base-uri 'none'; form-action 'none'; " \
	"frame-ancestors 'none'"

void
allot__dashboard_serve(nng_aio *aio)
{
	nng_http_res *res;
	int rv = nng_http_res_alloc(&res);
	if (rv != 0) {
		nng_aio_finish(aio, rv);
		return;
	}
	if ((rv = nng_http_res_set_status(res, NNG_HTTP_STATUS_OK)) != 0 ||
	    (rv = nng_http_res_set_header(
	         res, "Content-Type", "text/html; charset=utf-8")) != 0 ||
	    (rv = nng_http_res_set_header(res, "Cache-Control", "no-store")) !=
	        0 ||
	    (rv = nng_http_res_set_header(
	         res, "Content-Security-Policy", CSP)) != 0 ||
	    (rv = nng_http_res_set_header(
	         res, "X-Content-Type-Options", "nosniff")) != 0 ||
	    (rv = nng_http_res_set_header(
	         res, "Referrer-Policy", "no-referrer")) != 0 ||
	    (rv = nng_http_res_set_data(res, allot__dashboard_html,
	         allot__dashboard_html_len)) != 0) {
		nng_http_res_free(res);
		nng_aio_finish(aio, rv);
		return;
	}
	nng_aio_set_output(aio, 0, res);
	nng_aio_finish(aio, 0);
}
