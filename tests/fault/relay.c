/* SPDX-License-Identifier: MIT */
/*
 * The fault relay (relay.h): one poll() thread per relay. Each direction
 * of a connection is parsed into whole SP messages (greeting, then
 * length-prefixed messages); a complete message is either queued for
 * writing, with a release time when replies are delayed, or discarded.
 * Queues are FIFO, so a delay never reorders messages. When either side
 * of a connection closes, the relay closes the other, so the client sees
 * the coordinator go away exactly as it would without the relay.
 */
#include "relay.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "proc.h"

#define MAX_CONNS 32
#define MAX_MSG (8u << 20)
#define GREETING 8u

struct item {
	struct item *next;
	uint64_t release_ns;
	size_t len;
	size_t off;
	uint8_t data[];
};

/* One direction of a connection: bytes read from `in` go to `out`. */
struct half {
	int in;
	int out;
	bool reply; /* upstream to client */
	size_t greeted; /* greeting bytes passed so far */
	uint8_t hdr[8];
	size_t hdr_got;
	struct item *cur; /* message being read: header and body */
	size_t need; /* body bytes still to read into `cur` */
	struct item *head; /* queued for writing, oldest first */
	struct item *tail;
};

struct conn {
	bool used;
	struct half h[2]; /* [0] client to upstream, [1] the replies */
};

struct fault_relay {
	int listen_fd;
	int port;
	int upstream_port;
	int wake[2];
	pthread_t thread;
	_Atomic bool stop;
	_Atomic unsigned delay_ms;
	_Atomic uint32_t drop_ppm;
	_Atomic bool blackhole;
	uint64_t rng;
	struct conn conns[MAX_CONNS];
	_Atomic uint64_t n_conn, n_refused, n_req, n_rep, n_delayed, n_dropped,
	    n_black;
};

static uint32_t
rand_ppm(fault_relay *r)
{
	r->rng ^= r->rng >> 12;
	r->rng ^= r->rng << 25;
	r->rng ^= r->rng >> 27;
	return (
	    uint32_t) (((r->rng * 0x2545f4914f6cdd1dull) >> 32) % 1000000u);
}

static struct item *
item_new(size_t len)
{
	struct item *it = malloc(sizeof *it + len);
	if (it != NULL) {
		memset(it, 0, sizeof *it);
		it->len = len;
	}
	return it;
}

static void
enqueue(struct half *h, struct item *it, uint64_t release_ns)
{
	it->release_ns = release_ns;
	it->next = NULL;
	if (h->tail != NULL)
		h->tail->next = it;
	else
		h->head = it;
	h->tail = it;
}

static void
half_free(struct half *h)
{
	free(h->cur);
	h->cur = NULL;
	for (struct item *it = h->head, *n; it != NULL; it = n) {
		n = it->next;
		free(it);
	}
	h->head = h->tail = NULL;
}

/* A whole message arrived on `h`: pass it, hold it or lose it. */
static void
complete(fault_relay *r, struct half *h, struct item *it, uint64_t now)
{
	if (atomic_load(&r->blackhole)) {
		atomic_fetch_add(&r->n_black, 1);
		free(it);
		return;
	}
	if (!h->reply) {
		atomic_fetch_add(&r->n_req, 1);
		enqueue(h, it, now);
		return;
	}
	uint32_t drop = atomic_load(&r->drop_ppm);
	if (drop > 0 && rand_ppm(r) < drop) {
		atomic_fetch_add(&r->n_dropped, 1);
		free(it);
		return;
	}
	unsigned delay = atomic_load(&r->delay_ms);
	atomic_fetch_add(&r->n_rep, 1);
	if (delay > 0)
		atomic_fetch_add(&r->n_delayed, 1);
	enqueue(h, it, now + (uint64_t) delay * 1000000u);
}

/* Parse `n` bytes read from h->in. Returns -1 when the stream is not
 * SP framing (or out of memory): the connection is then closed. */
static int
feed(fault_relay *r, struct half *h, const uint8_t *p, size_t n, uint64_t now)
{
	while (n > 0) {
		if (h->greeted < GREETING) {
			size_t k = GREETING - h->greeted;
			k = k < n ? k : n;
			struct item *it = item_new(k);
			if (it == NULL)
				return -1;
			memcpy(it->data, p, k);
			enqueue(h, it, now);
			h->greeted += k;
			p += k;
			n -= k;
			continue;
		}
		if (h->cur == NULL) {
			size_t k = sizeof h->hdr - h->hdr_got;
			k = k < n ? k : n;
			memcpy(h->hdr + h->hdr_got, p, k);
			h->hdr_got += k;
			p += k;
			n -= k;
			if (h->hdr_got < sizeof h->hdr)
				continue;
			uint64_t len = 0;
			for (int i = 0; i < 8; i++)
				len = len << 8 | h->hdr[i];
			if (len > MAX_MSG)
				return -1;
			h->cur = item_new(sizeof h->hdr + (size_t) len);
			if (h->cur == NULL)
				return -1;
			memcpy(h->cur->data, h->hdr, sizeof h->hdr);
			h->hdr_got = 0;
			h->need = (size_t) len;
		} else {
			size_t k = h->need < n ? h->need : n;
			memcpy(h->cur->data + h->cur->len - h->need, p, k);
			h->need -= k;
			p += k;
			n -= k;
		}
		if (h->need == 0) {
			struct item *it = h->cur;
			h->cur = NULL;
			complete(r, h, it, now);
		}
	}
	return 0;
}

/* Write what is due. Returns -1 on a write error. */
static int
flush(struct half *h, uint64_t now)
{
	while (h->head != NULL && h->head->release_ns <= now) {
		struct item *it = h->head;
		ssize_t w = send(h->out, it->data + it->off, it->len - it->off,
		    MSG_NOSIGNAL);
		if (w < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK ||
			    errno == EINTR)
				return 0;
			return -1;
		}
		it->off += (size_t) w;
		if (it->off < it->len)
			return 0;
		h->head = it->next;
		if (h->head == NULL)
			h->tail = NULL;
		free(it);
	}
	return 0;
}

static void
conn_close(struct conn *c)
{
	close(c->h[0].in);
	close(c->h[0].out);
	half_free(&c->h[0]);
	half_free(&c->h[1]);
	memset(c, 0, sizeof *c);
}

static int
set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void
accept_one(fault_relay *r)
{
	int cfd = accept(r->listen_fd, NULL, NULL);
	if (cfd < 0)
		return;
	atomic_fetch_add(&r->n_conn, 1);
	struct conn *c = NULL;
	for (int i = 0; i < MAX_CONNS && c == NULL; i++)
		if (!r->conns[i].used)
			c = &r->conns[i];
	int ufd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET };
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	sa.sin_port = htons((uint16_t) r->upstream_port);
	if (c == NULL || ufd < 0 ||
	    connect(ufd, (struct sockaddr *) &sa, sizeof sa) != 0) {
		/* Upstream down: the client sees a closed connection. */
		atomic_fetch_add(&r->n_refused, 1);
		if (ufd >= 0)
			close(ufd);
		close(cfd);
		return;
	}
	int one = 1;
	setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	setsockopt(ufd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	set_nonblock(cfd);
	set_nonblock(ufd);
	memset(c, 0, sizeof *c);
	c->used = true;
	c->h[0].in = cfd;
	c->h[0].out = ufd;
	c->h[1].in = ufd;
	c->h[1].out = cfd;
	c->h[1].reply = true;
}

/* Read what `fd` has for half `h`. Returns -1 on EOF or error. */
static int
drain(fault_relay *r, struct half *h, uint64_t now)
{
	uint8_t buf[65536];
	for (;;) {
		ssize_t n = recv(h->in, buf, sizeof buf, 0);
		if (n == 0)
			return -1;
		if (n < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ||
			        errno == EINTR ?
			    0 :
			    -1;
		if (feed(r, h, buf, (size_t) n, now) != 0)
			return -1;
	}
}

/* The poll events for the socket half `o` writes to: output when its
 * oldest message is due; otherwise `*timeout` (ms, -1 for none) is
 * lowered to when it will be. */
static short
events(const struct half *o, uint64_t now, int *timeout)
{
	if (o->head == NULL)
		return POLLIN;
	if (o->head->release_ns <= now)
		return POLLIN | POLLOUT;
	int ms = (int) ((o->head->release_ns - now) / 1000000u + 1);
	if (*timeout < 0 || *timeout > ms)
		*timeout = ms;
	return POLLIN;
}

/* Read and write whatever `c`'s sockets are ready for. Returns -1 when
 * the connection is finished. */
static int
service(fault_relay *r, struct conn *c, const struct pollfd *pf,
    struct conn *const *owner, nfds_t n, uint64_t now)
{
	for (nfds_t k = 2; k < n; k++) {
		if (owner[k] != c ||
		    !(pf[k].revents & (POLLIN | POLLHUP | POLLERR)))
			continue;
		for (int d = 0; d < 2; d++)
			if (c->h[d].in == pf[k].fd &&
			    drain(r, &c->h[d], now) != 0)
				return -1;
	}
	if (flush(&c->h[0], now) != 0 || flush(&c->h[1], now) != 0)
		return -1;
	return 0;
}

static void *
relay_main(void *arg)
{
	fault_relay *r = arg;
	struct pollfd pf[2 + 2 * MAX_CONNS];
	struct conn *owner[2 + 2 * MAX_CONNS];
	while (!atomic_load(&r->stop)) {
		uint64_t now = pc_now_ns();
		int timeout = -1;
		nfds_t n = 0;
		pf[n++] = (struct pollfd) { .fd = r->wake[0],
			.events = POLLIN };
		pf[n++] = (struct pollfd) { .fd = r->listen_fd,
			.events = POLLIN };
		for (int i = 0; i < MAX_CONNS; i++) {
			struct conn *c = &r->conns[i];
			if (!c->used)
				continue;
			for (int d = 0; d < 2; d++) {
				struct half *h = &c->h[d];
				/* h->in is the socket the other half writes
				 * to: watch it for input, and for output when
				 * the other half has something due. */
				short ev = events(&c->h[1 - d], now, &timeout);
				owner[n] = c;
				pf[n++] = (struct pollfd) { .fd = h->in,
					.events = ev };
			}
		}
		if (poll(pf, n, timeout) < 0 && errno != EINTR)
			break;
		if (pf[0].revents & POLLIN) {
			char b[64];
			while (read(r->wake[0], b, sizeof b) > 0)
				;
		}
		if (pf[1].revents & POLLIN)
			accept_one(r);
		now = pc_now_ns();
		for (int i = 0; i < MAX_CONNS; i++) {
			struct conn *c = &r->conns[i];
			if (c->used && service(r, c, pf, owner, n, now) != 0)
				conn_close(c);
		}
	}
	for (int i = 0; i < MAX_CONNS; i++)
		if (r->conns[i].used)
			conn_close(&r->conns[i]);
	return NULL;
}

int
fault_relay_start(int upstream_port, uint64_t seed, fault_relay **ret)
{
	fault_relay *r = calloc(1, sizeof *r);
	if (r == NULL)
		return -1;
	r->upstream_port = upstream_port;
	r->rng = seed | 1;
	r->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET };
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t sl = sizeof sa;
	int one = 1;
	if (r->listen_fd < 0 ||
	    setsockopt(r->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one,
	        sizeof one) != 0 ||
	    bind(r->listen_fd, (struct sockaddr *) &sa, sizeof sa) != 0 ||
	    listen(r->listen_fd, 16) != 0 ||
	    getsockname(r->listen_fd, (struct sockaddr *) &sa, &sl) != 0 ||
	    pipe(r->wake) != 0) {
		if (r->listen_fd >= 0)
			close(r->listen_fd);
		free(r);
		return -1;
	}
	r->port = ntohs(sa.sin_port);
	set_nonblock(r->listen_fd);
	set_nonblock(r->wake[0]);
	if (pthread_create(&r->thread, NULL, relay_main, r) != 0) {
		close(r->listen_fd);
		close(r->wake[0]);
		close(r->wake[1]);
		free(r);
		return -1;
	}
	*ret = r;
	return 0;
}

int
fault_relay_port(const fault_relay *r)
{
	return r->port;
}

static void
poke(fault_relay *r)
{
	ssize_t w = write(r->wake[1], "x", 1);
	(void) w;
}

void
fault_relay_set_delay_ms(fault_relay *r, unsigned ms)
{
	atomic_store(&r->delay_ms, ms);
	poke(r);
}

void
fault_relay_set_drop(fault_relay *r, double fraction)
{
	double f = fraction < 0 ? 0 : fraction > 1 ? 1 : fraction;
	atomic_store(&r->drop_ppm, (uint32_t) (f * 1e6 + 0.5));
	poke(r);
}

void
fault_relay_set_blackhole(fault_relay *r, bool on)
{
	atomic_store(&r->blackhole, on);
	poke(r);
}

void
fault_relay_stats_get(fault_relay *r, fault_relay_stats *ret)
{
	ret->connections = atomic_load(&r->n_conn);
	ret->upstream_refused = atomic_load(&r->n_refused);
	ret->requests = atomic_load(&r->n_req);
	ret->replies = atomic_load(&r->n_rep);
	ret->replies_delayed = atomic_load(&r->n_delayed);
	ret->replies_dropped = atomic_load(&r->n_dropped);
	ret->blackholed = atomic_load(&r->n_black);
}

void
fault_relay_stop(fault_relay *r)
{
	if (r == NULL)
		return;
	atomic_store(&r->stop, true);
	poke(r);
	pthread_join(r->thread, NULL);
	close(r->listen_fd);
	close(r->wake[0]);
	close(r->wake[1]);
	free(r);
}
