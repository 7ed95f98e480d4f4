/* SPDX-License-Identifier: MIT */
/*
 * A loopback TCP relay the fault tests put between an agent and allotd, to
 * make the network misbehave on command. Each relay listens on its own
 * 127.0.0.1 port and forwards every accepted connection to an upstream
 * port. It understands the SP-over-TCP framing of docs/protocol.md (an
 * 8-byte greeting, then messages each prefixed by a 64-bit big-endian
 * length), so faults act on whole messages and the stream stays valid:
 * replies (upstream to client) can be held back or dropped, and a
 * blackhole discards every message in both directions while keeping the
 * connection open, as a partition that loses packets without a reset
 * would. The relay runs on its own thread; the setters may be called from
 * any thread and apply to the next message.
 */
#ifndef ALLOT_TESTS_FAULT_RELAY_H
#define ALLOT_TESTS_FAULT_RELAY_H

#include <stdbool.h>
#include <stdint.h>

typedef struct fault_relay fault_relay;

/* Counters since the relay started, per direction and fate. */
typedef struct fault_relay_stats {
	uint64_t connections; /* client connections accepted */
	uint64_t upstream_refused; /* accepted, but upstream was down */
	uint64_t requests; /* client messages forwarded */
	uint64_t replies; /* upstream messages forwarded */
	uint64_t replies_delayed; /* of which held back first */
	uint64_t replies_dropped; /* upstream messages dropped */
	uint64_t blackholed; /* messages lost to the blackhole */
} fault_relay_stats;

/* Listen on 127.0.0.1 (an ephemeral port) and start the relay thread.
 * Returns 0, or -1 with errno set. */
int fault_relay_start(
    int upstream_port, uint64_t seed, fault_relay **ret_relay);

/* The port clients should dial. */
int fault_relay_port(const fault_relay *r);

/* Hold each reply this long before passing it on (0: none). */
void fault_relay_set_delay_ms(fault_relay *r, unsigned ms);

/* Drop this fraction (0 to 1) of replies, chosen at random. */
void fault_relay_set_drop(fault_relay *r, double fraction);

/* Discard every message in both directions (true) or pass them again. */
void fault_relay_set_blackhole(fault_relay *r, bool on);

void fault_relay_stats_get(fault_relay *r, fault_relay_stats *ret);

/* Stop the thread, close every connection and free the relay. Accepts
 * NULL. */
void fault_relay_stop(fault_relay *r);

#endif
