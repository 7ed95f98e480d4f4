/* SPDX-License-Identifier: MIT */
/*
 * Per-peer flood control for allotd's protocol port: a bounded table of
 * token buckets (common/bucket.h) keyed by who sent a message, with two
 * budgets per peer, one for Registers (each recomputes shares and writes
 * the store) and one for every message. The server checks the message
 * budget before decoding and the Register budget after; a message over
 * either is answered Error RATE_LIMITED and counted under its own
 * rejection reason.
 *
 * Who a peer is: the remote IP address for tcp:// and tls+tcp:// (the
 * port is ignored, so new connections do not buy a new budget; IPv4 and
 * IPv6 addresses are distinct peers), the peer's uid for ipc:// (every
 * process of one local user is one peer), and one shared "local" peer for
 * anything else (inproc://, or an address nng cannot give).
 *
 * Until it registers, that is. A connection (nng pipe) on which a
 * Register succeeded (with --tls-ca: carried a verified identity proof)
 * is bound (allot__peerlimit_bind): from then on its messages are
 * charged to the message budget of its group, the connections of its
 * address registered under the same identity (the service), the same
 * size as an address's, so a flood from unregistered connections of its
 * address, or from connections registered as another service, cannot
 * throttle it. Registers stay charged to the address. An address has at
 * most `conns_per_peer` bound connections; the others stay on the
 * address's budget. So what one address can send is bounded by
 * (identities registered from it + 1) message budgets, never multiplied
 * by connections, and a connection stays in its group until it closes
 * (allot__peerlimit_unbind).
 *
 * Memory is bounded: the table holds at most `capacity` peers (rounded
 * up to a multiple of the shard count), about 450 bytes each, allocated
 * once at creation. A new peer takes a free slot, else the slot of a
 * peer whose buckets have both refilled to their bursts (forgetting it
 * loses nothing: it would start full again), found by a clock hand.
 * When every slot holds a peer still paying off a burst, the new peer is
 * charged to one shared overflow peer with the same budgets, so a flood
 * from more addresses than the table holds throttles the newcomers, never
 * the peers already tracked, and never grows memory.
 *
 * Thread-safe: the table is split into shards, each behind its own mutex,
 * chosen by a seeded hash of the peer; nng's worker threads call in
 * concurrently.
 */
#ifndef ALLOT_COORDINATOR_PEERLIMIT_H
#define ALLOT_COORDINATOR_PEERLIMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>

#define ALLOT__PEER_REGISTER_RATE 20.0 /* Registers per second per peer */
#define ALLOT__PEER_REGISTER_BURST 50.0
#define ALLOT__PEER_MESSAGE_RATE 2000.0 /* messages per second per peer */
#define ALLOT__PEER_MESSAGE_BURST 4000.0
#define ALLOT__PEER_CAPACITY 4096u /* peers tracked */
#define ALLOT__PEER_CONNS 256u /* bound connections per address */

typedef struct allot__peerlimit allot__peerlimit;

typedef struct allot__peerlimit_opts {
	double register_rate; /* per second; 0 disables this budget */
	double register_burst; /* > 0 when register_rate > 0 */
	double message_rate; /* per second; 0 disables this budget */
	double message_burst;
	uint32_t capacity; /* peers tracked, >= 1 */
	/* Bound connections per address, each with its own message
	 * budget; 0: none (every message is charged to its address). */
	uint32_t conns_per_peer;
} allot__peerlimit_opts;

/* The defaults above. */
void allot__peerlimit_opts_init(allot__peerlimit_opts *o);

/* Parse "R" or "R:B" (R per second, B burst; B defaults to 2 R, at
 * least 1). "0" disables. 0, or -1 with `err` naming the problem. */
int allot__peerlimit_parse(const char *s, double *ret_rate, double *ret_burst,
    char *err, size_t errlen);

/* NULL when both budgets are disabled (every check then passes), or when
 * out of memory (*ret_oom set). */
allot__peerlimit *allot__peerlimit_create(
    const allot__peerlimit_opts *o, bool *ret_oom);
void allot__peerlimit_destroy(allot__peerlimit *pl);

/* Who sent `msg`, as a table key. */
typedef struct allot__peer {
	uint8_t family; /* 0 local/unknown, 4, 6, 'u' (ipc uid) */
	uint8_t addr[16];
} allot__peer;

void allot__peer_of(nng_msg *msg, allot__peer *ret);
/* A nonzero 64-bit name of `p`, the same in every process (the
 * registry's replica budget per peer, state.h). */
uint64_t allot__peer_id(const allot__peer *p);
/* "127.0.0.1", "::1", "uid 0" or "local". */
void allot__peer_format(const allot__peer *p, char *buf, size_t len);

/* Move connection `pipe` (nonzero), from `peer`, registered as
 * `identity` (a hash of the service it proved or named), to the message
 * budget of its group (above). False when it is not moved: no table, a
 * zero pipe, the address's bound connections at their cap, or the table
 * full of peers still paying off a burst. Binding a bound pipe again is
 * a no-op (it stays in its first group). */
bool allot__peerlimit_bind(allot__peerlimit *pl, uint32_t pipe,
    const allot__peer *peer, uint64_t identity, uint64_t now);
/* Connection `pipe` closed: it leaves its group (which goes with its
 * last connection), its address may bind another. A no-op for a pipe
 * that was not bound. */
void allot__peerlimit_unbind(allot__peerlimit *pl, uint32_t pipe);

typedef enum allot__peer_budget {
	ALLOT__PEER_MESSAGE = 0,
	ALLOT__PEER_REGISTER = 1,
} allot__peer_budget;

/* Take one token from `peer`'s `budget` at monotonic time `now` (ns).
 * True when admitted (or the budget is disabled, or `pl` is NULL); false
 * with *ret_wait_ns (may be NULL) the time until a token exists. */
bool allot__peerlimit_take(allot__peerlimit *pl, const allot__peer *peer,
    allot__peer_budget budget, uint64_t now, uint64_t *ret_wait_ns);

/* allot__peerlimit_take for the dispatcher (dispatch.h): true when a
 * message of `peer` (NULL: the shared "local" peer) that came on
 * connection `pipe` (0: none) is within its `budget`, charged to the
 * connection's own message budget when it is bound, else to `peer`;
 * false with `err` saying whose budget was exceeded, what it is and when
 * to retry. The transport names the peer (allot__peer_of). */
bool allot__peerlimit_admit(allot__peerlimit *pl, uint32_t pipe,
    const allot__peer *peer, allot__peer_budget budget, uint64_t now,
    char *err, size_t errlen);

typedef struct allot__peerlimit_stats {
	uint64_t peers; /* slots in use by addresses */
	uint64_t capacity;
	uint64_t evictions; /* refilled peers forgotten for a new one */
	uint64_t overflow; /* checks charged to the overflow peer */
	uint64_t bound; /* registered connections, off their address budget */
	uint64_t bind_refused; /* Registers whose connection stayed on its
	                          address's budget (cap or table full) */
} allot__peerlimit_stats;

void allot__peerlimit_stats_get(
    allot__peerlimit *pl, allot__peerlimit_stats *ret);

#endif
