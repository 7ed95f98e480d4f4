/* SPDX-License-Identifier: MIT */
/*
 * The addresses of allotd's HTTP listeners: the one a listener binds
 * (net/http.c: --http; admin/admin_tls.c: --admin-listen), as its option
 * writes it, and a client's, as the logs name it.
 */
#ifndef ALLOT_COORDINATOR_WEB_ADDR_H
#define ALLOT_COORDINATOR_WEB_ADDR_H

#include <stddef.h>
#include <sys/socket.h>

/* "HOST:PORT", "[V6]:PORT" or "SCHEME://HOST:PORT[/]" (`scheme` is
 * "http" or "https": the one the listener serves) into a socket
 * address. ALLOT_OK, or ALLOT_EINVAL with `err` saying why. */
int allot__web_parse_addr(const char *addr, const char *scheme,
    struct sockaddr_storage *ret, char *err, size_t errlen);

/* A client's address `sa` as numeric text into `out` ("?" when it has
 * none), for a log line. */
void allot__web_addr_text(const struct sockaddr *sa, char *out, size_t cap);

#endif
