/* SPDX-License-Identifier: MIT */
/* libraft's uv_tcp handshake, acceptor side (raft_preamble.h). */
#include "raft_preamble.h"

#include <stdio.h>
#include <string.h>

static uint64_t
le64(const uint8_t *b)
{
	uint64_t v = 0;
	for (int k = 7; k >= 0; k--)
		v = v << 8 | b[k];
	return v;
}

void
allot__raft_preamble_init(allot__raft_preamble *p)
{
	memset(p, 0, sizeof *p);
}

size_t
allot__raft_preamble_want(const allot__raft_preamble *p)
{
	if (p->got < sizeof p->head)
		return sizeof p->head - p->got;
	/* address_len is in range once the head is in (feed() refuses
	 * the others). */
	return sizeof p->head + (size_t) p->address_len - p->got;
}

allot__preamble_state
allot__raft_preamble_feed(allot__raft_preamble *p, const uint8_t *b, size_t n,
    char *err, size_t errlen)
{
	size_t want = allot__raft_preamble_want(p);
	if (n > want) {
		snprintf(err, errlen, "%zu bytes fed, %zu wanted", n, want);
		return ALLOT__PREAMBLE_BAD;
	}
	while (n > 0) {
		size_t take;
		if (p->got < sizeof p->head) {
			take = sizeof p->head - p->got;
			take = take < n ? take : n;
			memcpy(p->head + p->got, b, take);
		} else {
			take = n;
			memcpy(
			    p->address + (p->got - sizeof p->head), b, take);
		}
		p->got += take;
		b += take;
		n -= take;
		if (p->got != sizeof p->head)
			continue;
		uint64_t proto = le64(p->head);
		p->id = le64(p->head + 8);
		p->address_len = le64(p->head + 16);
		if (proto != ALLOT__RAFT_HANDSHAKE_PROTOCOL ||
		    p->address_len == 0 ||
		    p->address_len > ALLOT__RAFT_ADDRESS_MAX) {
			snprintf(err, errlen,
			    "bad libraft handshake (protocol %llu, address "
			    "length %llu)",
			    (unsigned long long) proto,
			    (unsigned long long) p->address_len);
			p->address_len = 0;
			return ALLOT__PREAMBLE_BAD;
		}
	}
	if (p->got < sizeof p->head ||
	    p->got < sizeof p->head + p->address_len)
		return ALLOT__PREAMBLE_MORE;
	p->address[p->address_len - 1] = '\0';
	return ALLOT__PREAMBLE_DONE;
}
