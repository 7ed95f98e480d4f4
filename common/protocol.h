/* SPDX-License-Identifier: MIT */
/*
 * What both ends of the wire protocol (schema/allot.proto,
 * docs/protocol.md) must agree on beyond the messages themselves: the
 * version this tree speaks (every Envelope carries it, and a coordinator
 * answers any other version with Error VERSION) and how long an agent
 * waits for an answer, which allotd's lease arithmetic assumes. The one
 * definition both sides include, so that agent, coordinator, simulator,
 * fuzz targets and benchmarks cannot drift apart.
 */
#ifndef ALLOT_COMMON_PROTOCOL_H
#define ALLOT_COMMON_PROTOCOL_H

#include <stdint.h>

#define ALLOT__PROTOCOL_VERSION 1u

/* How long one request/reply exchange with a coordinator (or a member's
 * probe of another) may take at sync interval T before it counts as
 * failed: 2 T, at least 250 ms, at most 2 s. allotd's lease arithmetic
 * (coordinator/state/state.c) assumes the agents use exactly this. */
static inline uint32_t
allot__exchange_timeout_ms(uint32_t interval_ms)
{
	uint32_t t = interval_ms * 2;
	return t < 250 ? 250 : t > 2000 ? 2000 : t;
}

/* How long after its last answer an agent that can ask no coordinator
 * starts running on its part of the reserve (Share.standby), and after
 * the last Sync from an agent the coordinator holds that part back: two
 * intervals and one exchange's timeout, so that a single lost exchange
 * (answered again within about T plus a timeout) starts neither. */
static inline uint64_t
allot__standby_after_ns(uint32_t interval_ms)
{
	return ((uint64_t) interval_ms * 2 +
	           allot__exchange_timeout_ms(interval_ms)) *
	    1000000u;
}

#endif
