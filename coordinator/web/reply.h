/* SPDX-License-Identifier: MIT */
/*
 * coordinator/web/: what allotd's two HTTP servers share, both on
 * libmicrohttpd: the read-only port (net/http.c: /metrics, /status, the
 * dashboard) and the admin socket (admin/admin.c). A room below admin/
 * and net/, which may not include each other, and above dispatch/: it
 * knows HTTP and nothing of the state. This header is its interface: the
 * one way either server queues an answer, every answer marked
 * Cache-Control: no-store.
 */
#ifndef ALLOT_COORDINATOR_WEB_REPLY_H
#define ALLOT_COORDINATOR_WEB_REPLY_H

#include <stddef.h>

#include <microhttpd.h>

#include "buf.h"

/* Who owns an answer's body. */
typedef enum allot__web_mem {
	ALLOT__WEB_STATIC, /* lives as long as the process (a literal) */
	ALLOT__WEB_COPY, /* copied before the call returns */
	ALLOT__WEB_TAKE, /* malloc'd: libmicrohttpd frees it, whatever
	                    happens */
} allot__web_mem;

/* One more response header; a list of them ends with { NULL, NULL }. */
typedef struct allot__web_header {
	const char *name;
	const char *value;
} allot__web_header;

/* Queue `len` bytes of `body` as the answer `status` to `c`, with
 * Content-Type `type`, Cache-Control: no-store, and the `extra` headers
 * (NULL: none). MHD_NO when it could not be queued (libmicrohttpd closes
 * the connection). Any libmicrohttpd thread. */
enum MHD_Result allot__web_reply(struct MHD_Connection *c, unsigned status,
    const char *type, const allot__web_header *extra, const void *body,
    size_t len, allot__web_mem mem);

/* A one-line text/plain answer: `fmt` formatted (at most 1534 bytes
 * kept), then a newline. Errors and short answers of both servers;
 * allotctl prints such a line as it is. */
enum MHD_Result allot__web_text(struct MHD_Connection *c, unsigned status,
    const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* 200 with the text of `b` as `type` (`b` is taken), or 500 "out of
 * memory" when an append to it failed. */
enum MHD_Result allot__web_buf(
    struct MHD_Connection *c, const char *type, allot__buf *b);

#endif
