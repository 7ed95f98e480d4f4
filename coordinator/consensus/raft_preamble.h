/* SPDX-License-Identifier: MIT */
/*
 * libraft's uv_tcp handshake as the member that accepts a connection
 * reads it (raft_preamble.c): three little-endian 64-bit words (the
 * handshake protocol, the dialer's Raft id, the length of its address
 * with padding) and the address. No I/O: raft_tls.c feeds it what TLS
 * delivers, and the fuzz target "raft_preamble" what it likes.
 */
#ifndef ALLOT_COORDINATOR_RAFT_PREAMBLE_H
#define ALLOT_COORDINATOR_RAFT_PREAMBLE_H

#include <stddef.h>
#include <stdint.h>

#define ALLOT__RAFT_HANDSHAKE_PROTOCOL 1u /* libraft's uv_tcp version */
#define ALLOT__RAFT_ADDRESS_MAX 1024u /* a libraft address, padded */

typedef struct allot__raft_preamble {
	uint8_t head[24];
	size_t got; /* bytes taken so far */
	uint64_t id; /* the Raft id it claims, once the head is in */
	uint64_t address_len; /* with its padding, once the head is in */
	/* NUL terminated once complete (its last byte, padding, is
	 * overwritten: libraft pads with NULs). */
	char address[ALLOT__RAFT_ADDRESS_MAX + 1];
} allot__raft_preamble;

typedef enum allot__preamble_state {
	ALLOT__PREAMBLE_MORE, /* wants more bytes */
	ALLOT__PREAMBLE_DONE, /* complete: id and address are set */
	ALLOT__PREAMBLE_BAD, /* not libraft's handshake: `err` says why */
} allot__preamble_state;

void allot__raft_preamble_init(allot__raft_preamble *p);
/* How many more bytes it needs, never past its end (what follows it
 * belongs to raft_uv); 0 once complete or refused. */
size_t allot__raft_preamble_want(const allot__raft_preamble *p);
/* Take the `n` bytes at `b` (at most _want()). */
allot__preamble_state allot__raft_preamble_feed(allot__raft_preamble *p,
    const uint8_t *b, size_t n, char *err, size_t errlen);

#endif
