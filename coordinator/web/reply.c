/* SPDX-License-Identifier: MIT */
/*
 * The answers of allotd's HTTP servers (reply.h): a libmicrohttpd
 * response made, its headers added, queued and released in one place.
 */
#include "reply.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum MHD_Result
allot__web_reply(struct MHD_Connection *c, unsigned status, const char *type,
    const allot__web_header *extra, const void *body, size_t len,
    allot__web_mem mem)
{
	static const enum MHD_ResponseMemoryMode modes[] = {
		[ALLOT__WEB_STATIC] = MHD_RESPMEM_PERSISTENT,
		[ALLOT__WEB_COPY] = MHD_RESPMEM_MUST_COPY,
		[ALLOT__WEB_TAKE] = MHD_RESPMEM_MUST_FREE,
	};
	struct MHD_Response *r = MHD_create_response_from_buffer(
	    len, (void *) body, modes[mem]);
	if (r == NULL) {
		if (mem == ALLOT__WEB_TAKE)
			free((void *) body);
		return MHD_NO;
	}
	MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
	MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
	for (; extra != NULL && extra->name != NULL; extra++)
		MHD_add_response_header(r, extra->name, extra->value);
	enum MHD_Result rv = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return rv;
}

enum MHD_Result
allot__web_text(
    struct MHD_Connection *c, unsigned status, const char *fmt, ...)
{
	char msg[1536];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(msg, sizeof msg - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		msg[0] = '\0';
	size_t len = strlen(msg);
	msg[len++] = '\n';
	return allot__web_reply(c, status, "text/plain; charset=utf-8", NULL,
	    msg, len, ALLOT__WEB_COPY);
}

enum MHD_Result
allot__web_buf(struct MHD_Connection *c, const char *type, allot__buf *b)
{
	if (b->oom) {
		allot__buf_free(b);
		return allot__web_text(
		    c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory");
	}
	enum MHD_Result rv = allot__web_reply(
	    c, MHD_HTTP_OK, type, NULL, b->p, b->len, ALLOT__WEB_TAKE);
	*b = (allot__buf) { 0 };
	return rv;
}
