/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target "raft_preamble": libraft's handshake as a member that
 * accepts a connection on its Raft port reads it, before any Raft
 * message (coordinator/consensus/raft_preamble.c). The first input byte
 * chooses how the rest is cut into reads (TLS records arrive in any
 * sizes); each read is at most what the parser wants. The parser never
 * asks for a byte past the preamble (what follows is raft_uv's), takes
 * every byte it is given, and ends either refused with a reason or done
 * with the id it read and a NUL-terminated address of the length the
 * head announced.
 */
#include <string.h>

#include "consensus/raft_preamble.h"
#include "fuzz.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size == 0)
		return 0;
	size_t chunk = (size_t) data[0] % 32 + 1;
	data++;
	size--;
	allot__raft_preamble p;
	allot__raft_preamble_init(&p);
	char err[160] = "";
	allot__preamble_state st = ALLOT__PREAMBLE_MORE;
	size_t off = 0;
	while (st == ALLOT__PREAMBLE_MORE && off < size) {
		size_t want = allot__raft_preamble_want(&p);
		FUZZ_CHECK(want > 0);
		FUZZ_CHECK(p.got + want <= 24 + ALLOT__RAFT_ADDRESS_MAX);
		size_t n = size - off;
		n = n < chunk ? n : chunk;
		n = n < want ? n : want;
		size_t before = p.got;
		st = allot__raft_preamble_feed(
		    &p, data + off, n, err, sizeof err);
		FUZZ_CHECK(p.got == before + n || st == ALLOT__PREAMBLE_BAD);
		off += n;
	}
	/* Never more than wanted: one byte past is refused. */
	allot__raft_preamble q;
	allot__raft_preamble_init(&q);
	uint8_t extra[25] = { 0 };
	FUZZ_CHECK(allot__raft_preamble_feed(&q, extra, sizeof extra, err,
	               sizeof err) == ALLOT__PREAMBLE_BAD);
	switch (st) {
	case ALLOT__PREAMBLE_BAD:
		FUZZ_CHECK(err[0] != '\0');
		FUZZ_CHECK(allot__raft_preamble_want(&p) == 0);
		break;
	case ALLOT__PREAMBLE_DONE:
		FUZZ_CHECK(off >= 24);
		FUZZ_CHECK(p.address_len >= 1 &&
		    p.address_len <= ALLOT__RAFT_ADDRESS_MAX);
		FUZZ_CHECK(p.got == 24 + p.address_len && off == p.got);
		FUZZ_CHECK(allot__raft_preamble_want(&p) == 0);
		FUZZ_CHECK(strlen(p.address) < p.address_len);
		FUZZ_CHECK(data[0] == ALLOT__RAFT_HANDSHAKE_PROTOCOL &&
		    memcmp(data + 1, "\0\0\0\0\0\0\0", 7) == 0);
		break;
	case ALLOT__PREAMBLE_MORE:
		FUZZ_CHECK(off == size && allot__raft_preamble_want(&p) > 0);
		break;
	}
	return 0;
}
