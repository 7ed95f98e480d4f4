/* SPDX-License-Identifier: MIT */
/*
 * The Raft transport suite's fixture (test_raft_tls.c, raft_tls_hostile.c):
 * the certificates scripts/mkcerts makes once per run, consensus members
 * run in turn on their own loops in this process, two bare transports on
 * one loop, and plain TCP connections. Every wait is bounded.
 */
#ifndef ALLOT_TESTS_RAFT_TLS_FIXTURE_H
#define ALLOT_TESTS_RAFT_TLS_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <raft.h>
#include <raft/uv.h>
#include <uv.h>

#include "consensus/consensus.h"
#include "log.h"

#define MEMBER_ID "spiffe://t/allot/member"

/* ---- certificates, under `root` (an unchecked fixture) ---- */

extern char root[64];
void make_certs(void);
void remove_certs(void);
/* Removes the members' data dirs: each case starts with none. */
void clean_members(void);

/* ---- members ---- */

typedef struct member {
	uv_loop_t loop;
	allot__consensus *c;
	char dir[128];
	char address[64];
	char cert[128];
	char key[128]; /* "": in cert's file; else allotd's --tls-key */
	char ca[128];
	const char *member_id; /* NULL: from its certificate */
	unsigned election_ms;
	bool frozen; /* its loop is not run: a stopped process */
	bool closed;
	allot__logger log;
	char lines[16384]; /* what it logged, truncated */
	size_t nlines;
} member;

/* Log lines into the member's `lines` (a logger's fn, ctx the member);
 * logged() finds `what` in them. */
void capture(void *ctx, int level, const char *id, const char *msg);
bool logged(const member *m, const char *what);
void member_init(member *m, int i, const char *cert);
/* Its certificate and key in two files, CA_DIR/server.pem and .key
 * (allotd's --tls-cert and --tls-key), instead of one. */
void member_key_apart(member *m, const char *ca_dir);
void member_start(
    member *m, uint64_t id, const allot__cmember *seed, size_t n);
void member_finish(member *m);
/* Runs the members' loops in turn until done(m, n) or `ms` passed. */
bool run_until(
    member *m, size_t n, bool (*done)(member *, size_t), unsigned ms);
/* The member that may grant now, -1 if none; at most one may. */
int granting(member *m, size_t n);
bool some_granting(member *m, size_t n);
uint64_t applied(const member *m);
bool same_applied(member *m, size_t n);
/* Commits config `text` at `epoch` through leader `g` (proposing again
 * through a new leader if it moved): the leader that committed it. */
int commit_config(
    member *m, size_t n, int g, const char *text, uint64_t epoch);
/* Three members of a new cluster, ids 1-3, with member.pem. */
void three(member *m, allot__cmember *seed, unsigned election_ms);

/* ---- two bare transports on one loop, as raft_uv drives them ---- */

typedef struct side {
	struct raft_uv_transport t;
	uv_stream_t *stream; /* what raft_uv would own */
	raft_id peer_id;
	char peer_address[64];
	int status; /* the connect callback's, 1 before it fired */
	bool closed;
	char *got; /* bytes read from `stream` */
	size_t ngot, cap;
	bool eof;
} side;

extern uv_loop_t pair_loop;
void pair_accept(struct raft_uv_transport *t, raft_id id, const char *address,
    uv_stream_t *stream);
void pair_connected(
    struct raft_uv_connect *req, uv_stream_t *stream, int status);
void pair_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b);
void pair_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b);
void pair_write(side *s, const char *data, size_t len);
void pair_closed(struct raft_uv_transport *t);
/* Runs pair_loop until *flag, a side's stream, or its connect callback
 * (status no longer 1); false after `ms`. */
bool pair_run(const bool *flag, unsigned ms);
bool pair_run_until_stream(side *s, unsigned ms);
bool pair_run_until_status(side *s, unsigned ms);
void pair_free_stream(uv_handle_t *h);
/* Closes a side's transport (waiting for its close callback) and frees
 * it; then, once every side is closed, runs and closes pair_loop. */
void pair_close(side *s);
void pair_loop_done(void);

/* ---- plain TCP ---- */

int plain_connect_from(const char *address, const char *from);
int plain_connect(const char *address);
bool fd_closed(int fd);

/* The hostile-peer cases (raft_tls_hostile.c). */
typedef struct TCase TCase;
void raft_tls_hostile_add(TCase *tc);

#endif
