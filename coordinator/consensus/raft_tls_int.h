/* SPDX-License-Identifier: MIT */
/*
 * The TLS transport's private state (raft_tls.c: the connections and
 * the pump; raft_tls_cert.c: loading the certificates and deciding
 * whether a peer is a member).
 */
#ifndef ALLOT_COORDINATOR_RAFT_TLS_INT_H
#define ALLOT_COORDINATOR_RAFT_TLS_INT_H

#include <gnutls/gnutls.h>
#include <stdbool.h>
#include <stdint.h>

#include "raft_preamble.h"
#include "raft_tls.h"

#define HANDSHAKE_PROTOCOL ALLOT__RAFT_HANDSHAKE_PROTOCOL
#define ADDRESS_MAX ALLOT__RAFT_ADDRESS_MAX
#define RBUF_SIZE (64 * 1024)
#define RECORD_MAX 16384

enum { RESOLVING, CONNECTING, HANDSHAKE, PREAMBLE, OPEN, CLOSING };

typedef struct tls_tr tls_tr;

typedef struct conn {
	tls_tr *tr;
	struct conn *prev, *next;
	bool dialer;
	int state;
	char peer[128]; /* for log lines */
	struct raft_uv_connect *req; /* dialer, until its callback fired */
	raft_id id; /* the member dialed, or the one that dialed us */
	uv_getaddrinfo_t gai;
	bool resolving;
	uv_connect_t creq;
	uv_tcp_t tcp;
	uv_pipe_t inner;
	uv_timer_t timer;
	bool tcp_init, inner_init;
	bool closed; /* conn_close ran */
	bool counted; /* in tr->pending */
	unsigned handles; /* initialized handles not yet closed */
	gnutls_session_t s;
	char *rbuf; /* ciphertext read, not yet pulled */
	size_t roff, rlen;
	size_t tcp_queued, inner_queued; /* bytes in uv_write requests */
	bool tcp_reading, inner_reading;
	char ip[64]; /* the acceptor's peer address, without its port */
	uint64_t since; /* uv_now when accepted */
	raft_id cert_id; /* per-member IDs: the member its certificate names */
	/* libraft's preamble, accept side (malloc'd with the conn's TLS
	 * session; NULL on the dial side). */
	allot__raft_preamble *pre;
	char reason[768]; /* why the peer's certificate was refused */
	gnutls_alert_description_t alert; /* and the alert it gets, or 0 */
	uv_shutdown_t sreq;
} conn;

struct tls_tr {
	struct raft_uv_transport *t;
	uv_loop_t *loop;
	gnutls_certificate_credentials_t cred;
	char *member_id;
	bool member_prefix; /* member_id's last segment was "*" */
	raft_id id;
	char *address;
	char *bind;
	uv_tcp_t listener;
	bool listener_init;
	raft_uv_accept_cb accept_cb;
	char *ibuf; /* plaintext read from raft_uv, encrypted at once */
	conn *conns;
	unsigned pending; /* acceptor conns not yet OPEN */
	bool closing;
	raft_uv_transport_close_cb close_cb;
	unsigned handshake_ms;
	size_t buffer_max;
	unsigned pending_max;
	unsigned pending_per_address;
	bool (*is_member)(void *arg, raft_id id);
	void *member_arg;
	raft_id own_cert_id; /* per-member IDs: the member ours names; 0 */
	unsigned user_timeout_ms;
	const allot__logger *log;
	allot__logrl rl;
};

/* Logs one line naming the peer and why its connection failed. */
void allot__raft_tls_refuse(conn *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Whether the Raft id an acceptor's peer claimed in libraft's handshake
 * may be its (raft_tls.h); logs why not. */
bool allot__raft_tls_claim_ok(conn *c);

/* 0 when our certificate may serve as member `id` (per-member IDs: it
 * names `id`); else RAFT_INVALID with tr->t->errmsg saying why. */
int allot__raft_tls_own_id(tls_tr *tr, raft_id id);

/* Loads the CA, our certificate and key, and the member identity into
 * tr->cred and tr->member_id, and installs the check on the peer's
 * certificate: 0 or a RAFT_ code with t->errmsg. */
int allot__raft_tls_load(
    tls_tr *tr, struct raft_uv_transport *t, const allot__raft_tls_opts *o);

#endif
