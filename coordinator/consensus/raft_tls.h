/* SPDX-License-Identifier: MIT */
/*
 * Mutual TLS between coordinator cluster members: a libraft transport
 * (struct raft_uv_transport) for raft_uv that carries the same bytes as
 * raft_uv_tcp, inside TLS 1.3 (GnuTLS) with both sides authenticated.
 *
 * A peer is a member when, in the TLS handshake, its certificate
 * 1. chains to the cluster CA (`ca_file`, allotd's --tls-ca), is within
 *    its validity period and, if it lists extended key usages, allows
 *    serverAuth (a member we dial) or clientAuth (a member that dials
 *    us);
 * 2. carries exactly one spiffe:// URI SAN, the peer's SPIFFE ID;
 * 3. and that ID is the member identity: `member_id` if set, else the
 *    SPIFFE ID in this member's own certificate (every member then
 *    holds a certificate for the same ID, e.g.
 *    spiffe://prod.example/allot/member). A `member_id` whose last path
 *    segment is "*" accepts any one last segment there instead
 *    (per-member IDs: spiffe://prod.example/allot/member/m3 matches
 *    the member_id spiffe://prod.example/allot/member/ followed by *).
 * Host names and IP SANs are not checked: a member's address is only
 * where to dial, its identity is the SPIFFE ID.
 *
 * The Raft id a peer claims in libraft's handshake is bound (issue 27):
 * - to the membership: an id that `is_member` says is not in the
 *   cluster's configuration (a removed member, an id nobody has) is
 *   refused before raft_uv sees a byte of it;
 * - with per-member IDs, to the certificate: the last segment ends in
 *   the member's Raft id in decimal (.../member/3 or .../member/m3),
 *   and a peer claiming another id, or a member we dialed presenting
 *   another member's certificate, is refused. Our own certificate must
 *   name our own id (tr_init fails otherwise). With one shared ID any
 *   holder of it may still claim any current member's id.
 *
 * Connections still in their handshakes are bounded: at most
 * `pending_max` in all and `pending_per_address` from one address.
 * When a bound is reached, the connection of that address (or, for the
 * total, of anyone) waiting the longest gives its place to the new one
 * if it has waited a quarter of handshake_ms (a member's handshake
 * takes milliseconds); otherwise the new one is refused. Idle TCP
 * connections therefore never keep a member out for longer than that.
 *
 * Each connection is pumped on the loop it was created on, no thread:
 * libuv reads and writes the TCP socket, GnuTLS encrypts and decrypts
 * through push/pull functions over in-memory buffers, and raft_uv gets
 * one end of a socketpair (a uv_pipe_t) whose other end the pump reads
 * and writes. Each direction holds at most `buffer_max` bytes queued
 * before the pump stops reading the side that feeds it (backpressure).
 * libraft's own handshake (protocol, server id, address) goes inside
 * the TLS session unchanged.
 *
 * Single-threaded: every call on the loop's thread.
 */
#ifndef ALLOT_COORDINATOR_RAFT_TLS_H
#define ALLOT_COORDINATOR_RAFT_TLS_H

#include <stdbool.h>
#include <stddef.h>
#include <raft.h>
#include <raft/uv.h>
#include <uv.h>

#include "log.h"

typedef struct allot__raft_tls_opts {
	/* This member's certificate chain and private key, one PEM file
	 * (allotd's --tls-cert). */
	const char *cert_key_file;
	const char *key_file; /* NULL: in cert_key_file (--tls-key) */
	const char *ca_file; /* the cluster CA, PEM (allotd's --tls-ca) */
	const char *member_id; /* NULL: the SPIFFE ID of our certificate */
	unsigned handshake_ms; /* connect + TLS + libraft handshake; 0: 5000 */
	size_t buffer_max; /* bytes queued per direction; 0: 256 KiB */
	unsigned pending_max; /* incoming connections before the libraft
	                        handshake; 0: 64 */
	unsigned pending_per_address; /* of those, from one address; 0: 8 */
	/* Whether Raft id `id` is in the cluster's configuration now: a
	 * peer claiming an id outside it is refused. It should answer true
	 * while the configuration is empty (a member waiting to be added
	 * hears from the leader first). NULL: any id. */
	bool (*is_member)(void *arg, raft_id id);
	void *member_arg;
	/* TCP_USER_TIMEOUT on every member connection: data unacknowledged
	 * this long drops the connection (logged), so a peer that vanished
	 * without closing (power loss, a cut link) is noticed and dialled
	 * again, not after the kernel's retransmissions give up (about 15
	 * minutes). allotd gives a few election timeouts; 0: 5000. */
	unsigned user_timeout_ms;
	const allot__logger *log; /* NULL: silent */
} allot__raft_tls_opts;

/* Fills `t` for raft_uv_init (like raft_uv_tcp_init), loading the
 * certificate, key and CA now. `o` is copied.
 * @return 0; RAFT_INVALID with t->errmsg saying which file and why (a
 *         missing file, a key that does not match, no SPIFFE ID in our
 *         certificate and no member_id); RAFT_NOMEM. */
int allot__raft_tls_init(struct raft_uv_transport *t, uv_loop_t *loop,
    const allot__raft_tls_opts *o);

/* Where to listen ("ip:port"), when not at the member's own address
 * (raft_uv_tcp_set_bind_address). Before raft_uv_init. */
int allot__raft_tls_set_bind_address(
    struct raft_uv_transport *t, const char *address);

/* Releases the memory, after raft_uv closed the transport (the close
 * callback fired) or if raft_uv_init was never called. */
void allot__raft_tls_close(struct raft_uv_transport *t);

#endif
