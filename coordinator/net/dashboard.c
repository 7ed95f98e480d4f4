/* SPDX-License-Identifier: MIT */
/*
 * The dashboard page and its headers (dashboard.h). The page is a
 * constant: the build turns dashboard.html into dashboard_html.h, so
 * allotd needs no file at run time and the page always matches the
 * /status it reads. The headers are what keep the page self-contained in
 * fact and not only by intent: the Content-Security-Policy allows inline
 * script and style, fetches to the page's own origin (/status) and
 * nothing else, and forbids framing, so a page that tried to load an
 * external asset would fail in the browser test rather than work by
 * accident.
 */
#include "dashboard.h"

#include "dashboard_html.h"

#define CSP                                                           \
	"default-src 'none'; script-src 'unsafe-inline'; "            \
	"style-src 'unsafe-inline'; connect-src 'self'; "             \
	"img-src 'self' data:; base-uri 'none'; form-action 'none'; " \
	"frame-ancestors 'none'"

const allot__web_header allot__dashboard_headers[] = {
	{ "Content-Security-Policy", CSP },
	{ "X-Content-Type-Options", "nosniff" },
	{ "Referrer-Policy", "no-referrer" },
	{ NULL, NULL },
};

const unsigned char *
allot__dashboard_page(size_t *ret_len)
{
	*ret_len = allot__dashboard_html_len;
	return allot__dashboard_html;
}
