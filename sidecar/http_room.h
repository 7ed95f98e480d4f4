/* SPDX-License-Identifier: MIT */
/*
 * The connections of one HTTP listener of allot-agentd, and which one
 * gives its place to a newcomer when --max-connections are open
 * (http_room.c); used by http.c only.
 */
#ifndef ALLOT_AGENTD_HTTP_ROOM_H
#define ALLOT_AGENTD_HTTP_ROOM_H

#include <stdbool.h>

#include <microhttpd.h>

struct agentd;
struct http_room;

/* A room for `cap` connections (the counters in d->n); NULL when out of
 * memory. */
struct http_room *http_room_new(struct agentd *d, unsigned cap);
void http_room_free(struct http_room *r);
/* MHD_OPTION_NOTIFY_CONNECTION's callback, with the room as `cls`. */
void http_room_notify(void *cls, struct MHD_Connection *connection,
    void **socket_context, enum MHD_ConnectionNotificationCode toe);
/* A request begins (busy) or ends on `connection`. */
void http_room_busy(
    struct http_room *r, struct MHD_Connection *connection, bool busy);

#endif
