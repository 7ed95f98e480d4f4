/* SPDX-License-Identifier: MIT */
/*
 * Mutual TLS between coordinator cluster members
 * (coordinator/consensus/raft_tls.c) under test: real consensus members
 * (allot__consensus on raft_uv, one libuv loop each, run in turn in this
 * process) talking over loopback TCP through the TLS transport, with
 * certificates made by scripts/mkcerts:
 * - member.pem: the cluster CA, SPIFFE ID spiffe://t/allot/member;
 * - imposter.pem: the same CA, another SPIFFE ID (not a member's);
 * - other.pem: the member SPIFFE ID, but from another CA;
 * - nouri.pem: the cluster CA, no SPIFFE ID at all;
 * - permember.pem: the cluster CA, a per-member ID spiffe://t/allot/member/m1;
 *   permember2.pem .../member/m2; permemberx.pem .../member/mx (no id).
 * Every wait is bounded; each member's log lines are kept so that the
 * tests can check what was refused and why.
 */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "consensus/raft_tls.h"
#include "proc.h"
#include "raft_tls_fixture.h"
#include "runner.h"

#include <allot/allot.h>

/* ---- the cases ---- */

/* Three members elect a leader and commit over TLS; the leader's loop
 * stops (SIGSTOP), the others elect another and commit; it resumes,
 * reconnects and catches up to the same state. Then a 2 MiB config,
 * through 16 KiB buffers, arrives intact everywhere. */
START_TEST(three_members_over_tls)
{
	enum { BIG = 2 << 20 };
	member m[3];
	allot__cmember seed[3];
	int g, g2;
	char *big;

	signal(SIGPIPE, SIG_IGN);
	clean_members();
	/* allotd's default election timeout: the 2 MiB entry must reach
	 * the followers, through 16 KiB buffers and three loops taking
	 * turns on one thread, before their election timers fire. */
	three(m, seed, 1000);
	ck_assert(run_until(m, 3, some_granting, 10000));
	g = granting(m, 3);
	commit_config(m, 3, g, "services: {}\n", 1);
	ck_assert(run_until(m, 3, same_applied, 15000));
	for (int i = 0; i < 3; i++)
		ck_assert_str_eq(allot__consensus_state(m[i].c)->config.text,
		    "services: {}\n");

	m[g].frozen = true;
	ck_assert(run_until(m, 3, some_granting, 15000));
	g2 = granting(m, 3);
	ck_assert_int_ne(g2, g);
	g2 = commit_config(m, 3, g2, "v2", 2);
	ck_assert_uint_lt(applied(&m[g]), applied(&m[g2]));
	m[g].frozen = false;
	ck_assert(run_until(m, 3, same_applied, 10000));
	ck_assert_str_eq(allot__consensus_state(m[g].c)->config.text, "v2");
	ck_assert(run_until(m, 3, some_granting, 15000));

	big = malloc(BIG + 1);
	ck_assert_ptr_nonnull(big);
	for (size_t i = 0; i < BIG; i++)
		big[i] = (char) ('a' + (i * 7 + i / 4093) % 26);
	big[BIG] = '\0';
	g = granting(m, 3);
	commit_config(m, 3, g, big, 3);
	ck_assert(run_until(m, 3, same_applied, 10000));
	for (int i = 0; i < 3; i++)
		ck_assert_str_eq(
		    allot__consensus_state(m[i].c)->config.text, big);
	free(big);
	for (int i = 0; i < 3; i++) {
		ck_assert_msg(!logged(&m[i], "not a member") &&
		        !logged(&m[i], "CA mismatch"),
		    "member %d: %s", i, m[i].lines);
		member_finish(&m[i]);
	}
	clean_members();
}
END_TEST

/* A fourth member, with another CA's certificate (0) or the cluster
 * CA's but another identity (1): it has a configuration naming the three
 * and itself and campaigns (its connections are refused), and the
 * leader adds it (the leader's connections to it are refused): it never
 * receives an entry, and the cluster keeps its leader and epoch and
 * commits. With a member's certificate (2, the control), joining, it
 * catches up and votes. */
START_TEST(outsider_cannot_join)
{
	static const char *certs[] = { "other.pem", "imposter.pem",
		"member.pem" };
	static const char *why[] = { "CA mismatch",
		"certificate not a member: spiffe://t/svc/imposter is not "
		"spiffe://t/allot/member",
		NULL };
	member m[4];
	allot__cmember seed[4], list[8];
	int g, g2;
	uint64_t epoch;
	size_t k;
	bool voter = false;
	uint64_t lid;
	const char *laddr;

	signal(SIGPIPE, SIG_IGN);
	clean_members();
	three(m, seed, 300);
	member_init(&m[3], 3, certs[_i]);
	ck_assert(run_until(m, 3, some_granting, 10000));
	g = granting(m, 3);
	g = commit_config(m, 3, g, "services: {}\n", 1);
	epoch = allot__consensus_epoch(m[g].c);

	m[3].member_id = MEMBER_ID; /* what it pretends to be */
	seed[3].id = 4;
	snprintf(seed[3].address, sizeof seed[3].address, "%s", m[3].address);
	if (why[_i] != NULL)
		member_start(&m[3], 4, seed, 4);
	else
		member_start(&m[3], 4, NULL, 0);
	ck_assert_int_eq(
	    allot__consensus_add_member(m[g].c, 4, m[3].address), ALLOT_OK);
	run_until(m, 4, NULL, 3000);
	g2 = granting(m, 4);
	if (why[_i] != NULL) {
		ck_assert_uint_eq(applied(&m[3]), 0);
		ck_assert_int_eq(g2, g); /* undisturbed: same leader */
		ck_assert_uint_eq(allot__consensus_epoch(m[g].c), epoch);
		ck_assert(allot__consensus_changing(m[g].c));
		ck_assert_msg(
		    logged(&m[g], why[_i]), "leader logged: %s", m[g].lines);
		/* Its own connections, refused by the member it dialed. */
		ck_assert_msg(logged(&m[(g + 1) % 3], why[_i]) &&
		        logged(&m[(g + 1) % 3], "from 127.0.0.1:"),
		    "follower logged: %s", m[(g + 1) % 3].lines);
		ck_assert(!allot__consensus_leader(m[3].c, &lid, &laddr));
		/* It was told why (a TLS alert), both ways. */
		ck_assert_msg(logged(&m[3],
		                  "handshake failed: the peer "
		                  "refused us") &&
		        logged(&m[3], "TLS receive: the peer refused us"),
		    "outsider logged: %s", m[3].lines);
		commit_config(m, 4, g, "v2", 2);
		ck_assert_uint_eq(applied(&m[3]), 0);
	} else {
		ck_assert(run_until(m, 4, same_applied, 15000));
		ck_assert_int_ge(g2, 0);
		k = allot__consensus_members(m[g2].c, list, 8);
		for (size_t i = 0; i < k; i++)
			if (list[i].id == 4)
				voter = list[i].role == RAFT_VOTER;
		ck_assert(voter);
	}
	for (int i = 0; i < 4; i++)
		member_finish(&m[i]);
	clean_members();
}
END_TEST

/* Two transports on one loop: libraft's handshake arrives with the
 * dialer's id and address; 1 MiB each way arrives unchanged; closing one
 * end gives the other EOF; a dial to nobody fails, a dial still in its
 * handshake when the transport closes is RAFT_CANCELED; everything
 * closes (uv_loop_close succeeds). */
START_TEST(transport_pair)
{
	enum { N = 1 << 20 };
	side a = { .status = 1 }, b = { .status = 1 }, c = { .status = 1 };
	allot__raft_tls_opts o = { 0 };
	struct raft_uv_connect req = { .data = &b }, req2 = { .data = &c };
	char cert[128], ca[128], addr_a[64], addr_b[64], addr_x[64];
	char *data = malloc(N);
	bool accepted = false;
	int lfd;
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t len = sizeof sa;

	signal(SIGPIPE, SIG_IGN);
	ck_assert_int_eq(uv_loop_init(&pair_loop), 0);
	snprintf(cert, sizeof cert, "%s/member.pem", root);
	snprintf(ca, sizeof ca, "%s/ca1/ca.pem", root);
	o.cert_key_file = cert;
	o.ca_file = ca;
	o.buffer_max = 8192;
	snprintf(addr_a, sizeof addr_a, "127.0.0.1:%d", pc_free_port());
	snprintf(addr_b, sizeof addr_b, "127.0.0.1:%d", pc_free_port());
	ck_assert_int_eq(allot__raft_tls_init(&a.t, &pair_loop, &o), 0);
	ck_assert_int_eq(allot__raft_tls_init(&b.t, &pair_loop, &o), 0);
	a.t.data = &a;
	b.t.data = &b;
	ck_assert_int_eq(a.t.init(&a.t, 1, addr_a), 0);
	ck_assert_int_eq(b.t.init(&b.t, 2, addr_b), 0);
	ck_assert_int_eq(a.t.listen(&a.t, pair_accept), 0);
	ck_assert_int_eq(
	    b.t.connect(&b.t, &req, 1, addr_a, pair_connected), 0);
	{
		uint64_t end = pc_now_ms() + 5000;

		while (
		    (a.stream == NULL || b.status == 1) && pc_now_ms() < end)
			uv_run(&pair_loop, UV_RUN_NOWAIT), usleep(200);
	}
	ck_assert_int_eq(b.status, 0);
	ck_assert_ptr_nonnull(a.stream);
	accepted = true;
	ck_assert_uint_eq(a.peer_id, 2);
	ck_assert_str_eq(a.peer_address, addr_b);

	for (size_t i = 0; i < N; i++)
		data[i] = (char) (i * 131 + i / 977);
	a.got = malloc(N + 1); /* room to see a byte too many */
	b.got = malloc(N + 1);
	a.cap = b.cap = N + 1;
	ck_assert_int_eq(uv_read_start(a.stream, pair_alloc, pair_read), 0);
	ck_assert_int_eq(uv_read_start(b.stream, pair_alloc, pair_read), 0);
	pair_write(&b, data, N);
	pair_write(&a, data + 1, N - 1);
	{
		uint64_t end = pc_now_ms() + 10000;

		while ((a.ngot < N || b.ngot < N - 1) && pc_now_ms() < end)
			uv_run(&pair_loop, UV_RUN_NOWAIT), usleep(200);
	}
	ck_assert_uint_eq(a.ngot, N);
	ck_assert_uint_eq(b.ngot, N - 1);
	ck_assert(memcmp(a.got, data, N) == 0);
	ck_assert(memcmp(b.got, data + 1, N - 1) == 0);

	/* b's owner closes its stream: a's reads EOF. */
	uv_close((uv_handle_t *) b.stream, pair_free_stream);
	ck_assert(pair_run(&a.eof, 3000));
	uv_close((uv_handle_t *) a.stream, pair_free_stream);

	/* Nobody at the address: the dial fails. */
	snprintf(addr_x, sizeof addr_x, "127.0.0.1:%d", pc_free_port());
	req2.data = &c;
	ck_assert_int_eq(
	    b.t.connect(&b.t, &req2, 3, addr_x, pair_connected), 0);
	{
		uint64_t end = pc_now_ms() + 3000;

		while (c.status == 1 && pc_now_ms() < end)
			uv_run(&pair_loop, UV_RUN_NOWAIT), usleep(200);
	}
	ck_assert_int_eq(c.status, RAFT_NOCONNECTION);

	/* A listener that never answers: closing the transport cancels. */
	lfd = socket(AF_INET, SOCK_STREAM, 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(bind(lfd, (struct sockaddr *) &sa, sizeof sa), 0);
	ck_assert_int_eq(listen(lfd, 4), 0);
	ck_assert_int_eq(getsockname(lfd, (struct sockaddr *) &sa, &len), 0);
	snprintf(addr_x, sizeof addr_x, "127.0.0.1:%d", ntohs(sa.sin_port));
	c.status = 1;
	ck_assert_int_eq(
	    b.t.connect(&b.t, &req2, 3, addr_x, pair_connected), 0);
	for (int i = 0; i < 100; i++)
		uv_run(&pair_loop, UV_RUN_NOWAIT), usleep(1000);
	ck_assert_int_eq(c.status, 1); /* still in its handshake */
	b.t.close(&b.t, pair_closed);
	a.t.close(&a.t, pair_closed);
	ck_assert(pair_run(&b.closed, 3000));
	ck_assert(pair_run(&a.closed, 3000));
	ck_assert_int_eq(c.status, RAFT_CANCELED);
	close(lfd);
	allot__raft_tls_close(&a.t);
	allot__raft_tls_close(&b.t);
	pair_loop_done();
	ck_assert(accepted);
	free(a.got);
	free(b.got);
	free(data);
}
END_TEST

/* Per-member SPIFFE IDs: with member_id ".../member/" followed by "*",
 * member 2 with a certificate for .../member/m2 dials member 1 (m1) and
 * both take each other for members (per_member_ids_bound has what is
 * refused). */
START_TEST(member_id_pattern)
{
	side a = { .status = 1 }, b = { .status = 1 };
	allot__raft_tls_opts o = { 0 };
	struct raft_uv_connect req = { .data = &b };
	char cert[128], ca[128], addr_a[64];
	allot__logger lg = { capture, NULL, ALLOT_LOG_DEBUG };
	member *log = calloc(1, sizeof *log);

	signal(SIGPIPE, SIG_IGN);
	lg.ctx = log;
	ck_assert_int_eq(uv_loop_init(&pair_loop), 0);
	snprintf(ca, sizeof ca, "%s/ca1/ca.pem", root);
	o.ca_file = ca;
	o.cert_key_file = cert;
	o.member_id = MEMBER_ID "/*";
	o.log = &lg;
	snprintf(addr_a, sizeof addr_a, "127.0.0.1:%d", pc_free_port());
	snprintf(cert, sizeof cert, "%s/permember.pem", root);
	ck_assert_msg(
	    allot__raft_tls_init(&a.t, &pair_loop, &o) == 0, "%s", a.t.errmsg);
	a.t.data = &a;
	ck_assert_int_eq(a.t.init(&a.t, 1, addr_a), 0);
	ck_assert_int_eq(a.t.listen(&a.t, pair_accept), 0);
	snprintf(cert, sizeof cert, "%s/permember2.pem", root);
	ck_assert_int_eq(allot__raft_tls_init(&b.t, &pair_loop, &o), 0);
	b.t.data = &b;
	ck_assert_int_eq(b.t.init(&b.t, 2, "127.0.0.1:1"), 0);
	ck_assert_int_eq(
	    b.t.connect(&b.t, &req, 1, addr_a, pair_connected), 0);
	ck_assert(pair_run_until_status(&b, 5000));
	ck_assert_msg(b.status == 0, "%s", log->lines);
	ck_assert(pair_run_until_stream(&a, 3000));
	ck_assert_uint_eq(a.peer_id, 2);
	uv_close((uv_handle_t *) b.stream, pair_free_stream);
	uv_close((uv_handle_t *) a.stream, pair_free_stream);
	pair_close(&b);
	pair_close(&a);
	pair_loop_done();
	free(log);
}
END_TEST

static int plain_fd;

/* The member closed our plain connection: EOF or a reset. */
static bool
plain_closed(member *m, size_t n)
{
	(void) m;
	(void) n;
	return fd_closed(plain_fd);
}

/* Plain TCP to a TLS member: libraft's own handshake in clear is refused
 * as a failed TLS handshake, a client that says nothing is dropped after
 * handshake_ms; both are logged with the peer's address, and the
 * member keeps serving. */
START_TEST(plain_tcp_refused)
{
	member m[1];
	allot__cmember seed[1];
	uint8_t hs[32] = { 1 }; /* protocol 1, id 0, address "" */
	uint64_t t0;

	signal(SIGPIPE, SIG_IGN);
	clean_members();
	member_init(&m[0], 0, "member.pem");
	/* Its key apart from its certificate (--tls-key): it still
	 * serves. */
	member_key_apart(&m[0], "ca1");
	seed[0].id = 1;
	snprintf(seed[0].address, sizeof seed[0].address, "%s", m[0].address);
	member_start(&m[0], 1, seed, 1);
	ck_assert(run_until(m, 1, some_granting, 5000));

	plain_fd = plain_connect(m[0].address);
	hs[8] = 9;
	hs[16] = 8;
	ck_assert_int_eq(
	    send(plain_fd, hs, sizeof hs, 0), (ssize_t) sizeof hs);
	ck_assert(run_until(m, 1, plain_closed, 3000));
	close(plain_fd);
	ck_assert_msg(logged(&m[0], "from 127.0.0.1:") &&
	        logged(&m[0], "handshake failed"),
	    "%s", m[0].lines);

	plain_fd = plain_connect(m[0].address);
	t0 = pc_now_ms();
	ck_assert(run_until(m, 1, plain_closed, 3000));
	ck_assert_uint_ge(pc_now_ms() - t0, 900); /* handshake_ms = 1000 */
	close(plain_fd);
	ck_assert_msg(logged(&m[0], "handshake timed out after 1000 ms"), "%s",
	    m[0].lines);
	ck_assert(run_until(m, 1, some_granting, 2000));
	member_finish(&m[0]);
	clean_members();
}
END_TEST

/* Bad setups are refused at create, naming the file and the reason. */
START_TEST(init_errors)
{
	struct raft_uv_transport t;
	allot__raft_tls_opts o = { 0 };
	uv_loop_t loop;
	char cert[128], ca[128];

	ck_assert_int_eq(uv_loop_init(&loop), 0);
	snprintf(ca, sizeof ca, "%s/ca1/ca.pem", root);
	o.ca_file = ca;
	o.cert_key_file = cert;

	snprintf(cert, sizeof cert, "%s/missing.pem", root);
	ck_assert_int_eq(allot__raft_tls_init(&t, &loop, &o), RAFT_INVALID);
	ck_assert_msg(strstr(t.errmsg, "missing.pem") != NULL, "%s", t.errmsg);

	snprintf(cert, sizeof cert, "%s/nouri.pem", root);
	ck_assert_int_eq(allot__raft_tls_init(&t, &loop, &o), RAFT_INVALID);
	ck_assert_msg(
	    strstr(t.errmsg, "no spiffe:// URI SAN") != NULL, "%s", t.errmsg);
	/* ... unless the member identity is given. */
	o.member_id = "spiffe://t/allot/member/*";
	ck_assert_int_eq(allot__raft_tls_init(&t, &loop, &o), 0);
	allot__raft_tls_close(&t);
	o.member_id = "t/allot/member";
	ck_assert_int_eq(allot__raft_tls_init(&t, &loop, &o), RAFT_INVALID);
	o.member_id = NULL;

	snprintf(cert, sizeof cert, "%s/member.pem", root);
	snprintf(ca, sizeof ca, "%s/nothing.pem", root);
	ck_assert_int_eq(allot__raft_tls_init(&t, &loop, &o), RAFT_INVALID);
	ck_assert_msg(strstr(t.errmsg, "nothing.pem") != NULL, "%s", t.errmsg);
	ck_assert_int_eq(uv_loop_close(&loop), 0);
	clean_members();
}
END_TEST

static Suite *
raft_tls_suite(void)
{
	Suite *s = suite_create("raft_tls");
	TCase *tc = tcase_create("tls");

	tcase_set_timeout(tc, 60);
	tcase_add_unchecked_fixture(tc, make_certs, remove_certs);
	tcase_add_test(tc, init_errors);
	tcase_add_test(tc, transport_pair);
	tcase_add_test(tc, member_id_pattern);
	tcase_add_test(tc, plain_tcp_refused);
	raft_tls_hostile_add(tc);
	tcase_add_test(tc, three_members_over_tls);
	tcase_add_loop_test(tc, outsider_cannot_join, 0, 3);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(raft_tls_suite)
