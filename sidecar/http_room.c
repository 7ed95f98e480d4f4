/* SPDX-License-Identifier: MIT */
/*
 * Room on an HTTP listener (http.c). libmicrohttpd gives each connection
 * a thread and refuses every connection above its own limit, so a
 * client that opens connections and never finishes a request on them
 * (a slowloris) would hold every place until the idle timeout, and no
 * caller could get in. http.c sets that limit a little above
 * --max-connections and the count is kept here, in two parts:
 *
 * - A connection that has not finished a request yet is *unproven*; at
 *   most half the places are theirs. A newcomer (unproven itself) past
 *   that takes the place of the oldest unproven one, whatever its age: a
 *   caller's request arrives right behind its connect, so to push it out
 *   before that, a slowloris would have to open half the places' worth
 *   of connections within that moment (in the suite, 24 every
 *   millisecond), while one that never finishes a request is pushed out
 *   by the next newcomers.
 * - Past --max-connections in all, a newcomer takes the place of the
 *   connection with no request in course that has been quiet the
 *   longest, if that is at least EVICT_IDLE_MS, and is closed at once
 *   otherwise.
 *
 * A connection gives its place by having its socket shut down: its
 * thread wakes and libmicrohttpd closes it. A request in course is
 * never cut.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>

#include "agentd.h"
#include "http_room.h"

/* How long a connection must have had no request in course before a
 * newcomer may take its place (as grpc.c's). */
#define EVICT_IDLE_MS 1000

/* http_conn.state: a request in course; it began one once; its socket
 * was shut down to make room. A request's start and an eviction race
 * for the same word, so a connection is never shut down under a request
 * that began. The connection's own thread touches it with no lock (two
 * atomics per request); the list and the count are the room's, under
 * its lock. */
enum { C_BUSY = 1u, C_PROVEN = 2u, C_GONE = 4u };

struct http_conn {
	int fd; /* under the room's lock */
	_Atomic unsigned state;
	_Atomic uint64_t quiet_since; /* accepted, or its last request ended */
	struct http_conn *prev, *next;
};

struct http_room {
	struct agentd *d;
	pthread_mutex_t mu;
	unsigned cap;
	struct http_conn head; /* circular list of the open ones */
};

struct http_room *
http_room_new(struct agentd *d, unsigned cap)
{
	struct http_room *r = calloc(1, sizeof *r);
	if (r == NULL)
		return NULL;
	r->d = d;
	r->cap = cap;
	r->head.prev = r->head.next = &r->head;
	pthread_mutex_init(&r->mu, NULL);
	return r;
}

void
http_room_free(struct http_room *r)
{
	if (r == NULL)
		return;
	pthread_mutex_destroy(&r->mu);
	free(r);
}

/* What a walk of the room found: the connections not shut down, and
 * how many of them have never begun a request. */
struct room_count {
	unsigned live;
	unsigned unproven;
};

/* Under the lock: the connection quiet the longest with no request in
 * course (one that never began a request only, with `unproven`), or
 * NULL; and the room's count. */
static struct http_conn *
oldest(struct http_room *r, bool unproven, struct room_count *n)
{
	struct http_conn *best = NULL;
	uint64_t best_t = 0;
	*n = (struct room_count) { 0 };
	for (struct http_conn *c = r->head.next; c != &r->head; c = c->next) {
		unsigned st = atomic_load(&c->state);
		n->live += !(st & C_GONE);
		if (st & (C_BUSY | C_GONE))
			continue;
		n->unproven += !(st & C_PROVEN);
		uint64_t t = atomic_load(&c->quiet_since);
		if ((!unproven || !(st & C_PROVEN)) &&
		    (best == NULL || t < best_t)) {
			best = c;
			best_t = t;
		}
	}
	return best;
}

/* Shut `v` down unless a request began on it meanwhile. Under the
 * lock. */
static bool
evict(struct http_room *r, struct http_conn *v)
{
	unsigned st = atomic_load(&v->state);
	do {
		if (st & (C_BUSY | C_GONE))
			return false;
	} while (!atomic_compare_exchange_weak(&v->state, &st, st | C_GONE));
	shutdown(v->fd, SHUT_RDWR);
	atomic_fetch_add(&r->d->n.http_evicted_conns, 1);
	return true;
}

/* Whether a newcomer may stay: it takes the oldest unproven
 * connection's place when those hold half the places, an idle one's
 * when all are held, or a free one. A connection already shut down
 * holds no place, though it stays on the list until its thread has
 * closed it: on a loaded host those threads lag, and counting them
 * refused callers while the slow ones were being pushed out (42 of 48
 * answered beside four busy loops). libmicrohttpd's own limit leaves
 * them room (MHD_LIMIT_SLACK). Under the lock. */
static bool
make_room(struct http_room *r, uint64_t now)
{
	struct room_count n;
	struct http_conn *v = oldest(r, true, &n);
	unsigned half = r->cap > 1 ? r->cap / 2 : 1;
	if (v != NULL && n.unproven >= half && evict(r, v))
		return true;
	if (n.live < r->cap)
		return true;
	v = oldest(r, false, &n);
	if (v != NULL && now - atomic_load(&v->quiet_since) >= EVICT_IDLE_MS &&
	    evict(r, v))
		return true;
	atomic_fetch_add(&r->d->n.http_refused_conns, 1);
	return false;
}

void
http_room_notify(void *cls, struct MHD_Connection *connection,
    void **socket_context, enum MHD_ConnectionNotificationCode toe)
{
	struct http_room *r = cls;
	if (toe == MHD_CONNECTION_NOTIFY_CLOSED) {
		struct http_conn *c = *socket_context;
		if (c == NULL)
			return;
		pthread_mutex_lock(&r->mu);
		c->prev->next = c->next;
		c->next->prev = c->prev;
		pthread_mutex_unlock(&r->mu);
		free(c);
		*socket_context = NULL;
		return;
	}
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
	    connection, MHD_CONNECTION_INFO_CONNECTION_FD);
	int fd = ci != NULL ? ci->connect_fd : -1;
	struct http_conn *c = calloc(1, sizeof *c);
	*socket_context = c;
	uint64_t now = agentd_now_ms();
	pthread_mutex_lock(&r->mu);
	bool stays = c != NULL && fd >= 0 && make_room(r, now);
	if (c != NULL) {
		/* Listed even when refused, until its thread has closed
		 * it; shut down, it holds no place (make_room()). */
		c->fd = fd;
		atomic_store(&c->state, stays ? 0u : C_GONE);
		atomic_store(&c->quiet_since, now);
		c->prev = r->head.prev;
		c->next = &r->head;
		r->head.prev->next = c;
		r->head.prev = c;
	}
	pthread_mutex_unlock(&r->mu);
	if (!stays && fd >= 0)
		shutdown(fd, SHUT_RDWR);
}

void
http_room_busy(
    struct http_room *r, struct MHD_Connection *connection, bool busy)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
	    connection, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	struct http_conn *c = ci != NULL ? ci->socket_context : NULL;
	if (c == NULL)
		return;
	if (!busy) {
		atomic_store(&c->quiet_since, agentd_now_ms());
		atomic_fetch_and(&c->state, ~C_BUSY);
		return;
	}
	unsigned st = atomic_load(&c->state);
	while (!(st & C_GONE) &&
	    !atomic_compare_exchange_weak(
	        &c->state, &st, st | C_BUSY | C_PROVEN))
		;
}
