/* SPDX-License-Identifier: MIT */
/*
 * Hostile peers on the Raft port (issue 27), against the TLS transport
 * (coordinator/consensus/raft_tls.c) and real members: a TLS client of
 * the test's own that claims any Raft id and sends any bytes, idle TCP
 * connections from one address and from many. Each case reports its
 * figure for docs/reliability.md's adversary table (adv_report.h).
 */
#include <check.h>
#include <fcntl.h>
#include <gnutls/gnutls.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adv_report.h"
#include "consensus/consensus_fsm.h"
#include "consensus/raft_tls.h"
#include "proc.h"
#include "raft_tls_fixture.h"

typedef struct forged {
	int fd;
	gnutls_session_t s;
	gnutls_certificate_credentials_t cred;
} forged;

typedef void (*spin_fn)(void);

static member *spun; /* what spin_members runs */
static size_t nspun;

static void
spin_members(void)
{
	for (size_t i = 0; i < nspun; i++)
		if (!spun[i].frozen && spun[i].c != NULL)
			uv_run(&spun[i].loop, UV_RUN_NOWAIT);
}

static void
spin_pair(void)
{
	uv_run(&pair_loop, UV_RUN_NOWAIT);
}

static void
put64(uint8_t *p, uint64_t v)
{
	for (int k = 0; k < 8; k++)
		p[k] = (uint8_t) (v >> (8 * k));
}

static bool
forge_send(forged *f, const void *data, size_t len, spin_fn spin)
{
	const uint8_t *p = data;
	uint64_t end = pc_now_ms() + 3000;

	while (len > 0 && pc_now_ms() < end) {
		ssize_t n = gnutls_record_send(f->s, p, len);

		if (n > 0) {
			p += n;
			len -= (size_t) n;
		} else if (gnutls_error_is_fatal((int) n)) {
			return false;
		} else {
			spin();
			usleep(200);
		}
	}
	return len == 0;
}

/* A holder of `cert` (from the cluster's CA) dials `address` with a TLS
 * client of its own and claims Raft id `claim` in libraft's handshake:
 * true once the TLS handshake finished and the claim went out. */
static bool
forge_open(forged *f, const char *address, const char *cert, uint64_t claim,
    spin_fn spin)
{
	char ca[128], path[128];
	uint8_t pre[24 + 16] = { 0 };
	uint64_t end = pc_now_ms() + 3000;
	int rv;

	snprintf(ca, sizeof ca, "%s/ca1/ca.pem", root);
	snprintf(path, sizeof path, "%s/%s", root, cert);
	ck_assert_int_eq(gnutls_certificate_allocate_credentials(&f->cred), 0);
	ck_assert_int_gt(gnutls_certificate_set_x509_trust_file(
	                     f->cred, ca, GNUTLS_X509_FMT_PEM),
	    0);
	ck_assert_int_eq(gnutls_certificate_set_x509_key_file(
	                     f->cred, path, path, GNUTLS_X509_FMT_PEM),
	    0);
	f->fd = plain_connect(address);
	ck_assert_int_eq(fcntl(f->fd, F_SETFL, O_NONBLOCK), 0);
	ck_assert_int_eq(
	    gnutls_init(&f->s, GNUTLS_CLIENT | GNUTLS_NONBLOCK), 0);
	ck_assert_int_eq(gnutls_set_default_priority(f->s), 0);
	ck_assert_int_eq(
	    gnutls_credentials_set(f->s, GNUTLS_CRD_CERTIFICATE, f->cred), 0);
	gnutls_transport_set_int(f->s, f->fd);
	do {
		rv = gnutls_handshake(f->s);
		if (rv == 0 || gnutls_error_is_fatal(rv))
			break;
		spin();
		usleep(200);
	} while (pc_now_ms() < end);
	if (rv != 0)
		return false;
	put64(pre, 1); /* libraft's handshake protocol */
	put64(pre + 8, claim);
	put64(pre + 16, 16);
	memcpy(pre + 24, "127.0.0.1:9", 11);
	return forge_send(f, pre, sizeof pre, spin);
}

/* Whether the member closed the forged connection within `ms`. */
static bool
forge_closed(forged *f, spin_fn spin, unsigned ms)
{
	uint64_t end = pc_now_ms() + ms;
	char buf[256];

	do {
		ssize_t n = gnutls_record_recv(f->s, buf, sizeof buf);

		if (n == 0 || (n < 0 && gnutls_error_is_fatal((int) n)))
			return true;
		spin();
		usleep(500);
	} while (pc_now_ms() < end);
	return false;
}

static void
forge_close(forged *f)
{
	gnutls_deinit(f->s);
	gnutls_certificate_free_credentials(f->cred);
	close(f->fd);
}

static uint64_t
term_of(const member *m)
{
	return allot__consensus_state(m->c)->raft->current_term;
}

/* A holder of the (shared) member certificate claims Raft id 99, which
 * no configuration has, and sends the leader a RequestVote a thousand
 * terms ahead with disrupt_leader set: refused at libraft's handshake,
 * the leader keeps its place and its term (issue 27: the term went
 * 2 -> 1022 and leadership moved). */
START_TEST(forged_vote_refused)
{
	member m[3];
	allot__cmember seed[3];
	forged f = { 0 };
	uint8_t vote[16 + 40];
	uint64_t term;
	bool closed;
	int g, g2;

	signal(SIGPIPE, SIG_IGN);
	clean_members();
	three(m, seed, 1000);
	ck_assert(run_until(m, 3, some_granting, 15000));
	g = granting(m, 3);
	term = term_of(&m[g]);
	spun = m;
	nspun = 3;
	ck_assert(
	    forge_open(&f, m[g].address, "member.pem", 99, spin_members));
	put64(vote, RAFT_IO_REQUEST_VOTE);
	put64(vote + 8, 40);
	put64(vote + 16, term + 1000);
	put64(vote + 24, 99); /* candidate */
	put64(vote + 32, 1u << 30); /* last log index */
	put64(vote + 40, term + 999); /* last log term */
	put64(vote + 48, 1); /* flags: disrupt_leader */
	(void) forge_send(&f, vote, sizeof vote, spin_members);
	closed = forge_closed(&f, spin_members, 3000);
	run_until(m, 3, NULL, 1500);
	g2 = granting(m, 3);
	adv_report("a member certificate claiming Raft id 99 (in no "
	           "configuration) sends the leader a RequestVote 1,000 terms "
	           "ahead with disrupt_leader",
	    "refused at libraft's handshake; the leader keeps its place and "
	    "its term",
	    "term 2 -> 1022, leadership moved, agents in fallback 5 of 8 s",
	    closed && g2 == g && term_of(&m[g]) == term,
	    "connection %s; the leader's term %llu -> %llu, granting member "
	    "%d -> %d",
	    closed ? "refused" : "open", (unsigned long long) term,
	    (unsigned long long) term_of(&m[g]), g + 1, g2 + 1);
	ck_assert(closed);
	ck_assert_int_eq(g2, g);
	ck_assert_uint_eq(term_of(&m[g]), term);
	ck_assert_msg(logged(&m[g],
	                  "claims member 99, which is not in the cluster's "
	                  "configuration"),
	    "%s", m[g].lines);
	forge_close(&f);
	for (int i = 0; i < 3; i++)
		member_finish(&m[i]);
	clean_members();
}
END_TEST

static raft_id config_max; /* the configuration: members 1 to this */

static bool
in_config(void *arg, raft_id id)
{
	(void) arg;
	return id >= 1 && id <= config_max;
}

/* Per-member IDs bind the Raft id: a certificate for .../member/m2 may
 * claim 2 and nothing else; one naming no id, or the shared ID, is no
 * member; a member we dial must present its own; our own certificate
 * must name our id; an id outside the configuration is refused even
 * with its own certificate. */
START_TEST(per_member_ids_bound)
{
	side a = { .status = 1 }, b = { .status = 1 };
	allot__raft_tls_opts o = { 0 };
	struct raft_uv_connect req = { .data = &a };
	struct raft_uv_transport x;
	char cert_a[128], cert_b[128], ca[128], addr_a[64], addr_b[64];
	allot__logger lg = { capture, NULL, ALLOT_LOG_DEBUG };
	member *log = calloc(1, sizeof *log);
	static const struct {
		const char *cert;
		uint64_t claim;
		raft_id config_max;
		const char *why; /* NULL: accepted */
	} tries[] = {
		{ "member.pem", 2, 2,
		    "certificate not a member: " MEMBER_ID " is not " MEMBER_ID
		    "/*" },
		{ "permemberx.pem", 2, 2, "names no member id" },
		{ "permember2.pem", 1, 2,
		    "claims member 1, but its certificate names member 2" },
		{ "permember2.pem", 2, 1, /* member 2 removed */
		    "claims member 2, which is not in the cluster's "
		    "configuration" },
		{ "permember2.pem", 2, 2, NULL },
	};

	signal(SIGPIPE, SIG_IGN);
	lg.ctx = log;
	ck_assert_int_eq(uv_loop_init(&pair_loop), 0);
	snprintf(ca, sizeof ca, "%s/ca1/ca.pem", root);
	snprintf(cert_a, sizeof cert_a, "%s/permember.pem", root);
	snprintf(cert_b, sizeof cert_b, "%s/permember2.pem", root);
	o.ca_file = ca;
	o.member_id = MEMBER_ID "/*";
	o.log = &lg;
	o.is_member = in_config;

	/* Our own certificate names member 1: it cannot serve as 2. */
	o.cert_key_file = cert_a;
	ck_assert_int_eq(allot__raft_tls_init(&x, &pair_loop, &o), 0);
	ck_assert_int_eq(x.init(&x, 2, "127.0.0.1:1"), RAFT_INVALID);
	ck_assert_msg(
	    strstr(x.errmsg, "names member 1, but this is member 2") != NULL,
	    "%s", x.errmsg);
	allot__raft_tls_close(&x);

	snprintf(addr_a, sizeof addr_a, "127.0.0.1:%d", pc_free_port());
	snprintf(addr_b, sizeof addr_b, "127.0.0.1:%d", pc_free_port());
	ck_assert_int_eq(allot__raft_tls_init(&a.t, &pair_loop, &o), 0);
	o.cert_key_file = cert_b;
	ck_assert_int_eq(allot__raft_tls_init(&b.t, &pair_loop, &o), 0);
	a.t.data = &a;
	b.t.data = &b;
	ck_assert_int_eq(a.t.init(&a.t, 1, addr_a), 0);
	ck_assert_int_eq(b.t.init(&b.t, 2, addr_b), 0);
	ck_assert_int_eq(a.t.listen(&a.t, pair_accept), 0);
	ck_assert_int_eq(b.t.listen(&b.t, pair_accept), 0);

	for (size_t i = 0; i < sizeof tries / sizeof tries[0]; i++) {
		forged f = { 0 };
		bool sent;

		config_max = tries[i].config_max;
		sent = forge_open(
		    &f, addr_a, tries[i].cert, tries[i].claim, spin_pair);

		if (tries[i].why == NULL) {
			ck_assert(sent);
			ck_assert(pair_run_until_stream(&a, 3000));
			ck_assert_uint_eq(a.peer_id, 2);
			uv_close((uv_handle_t *) a.stream, pair_free_stream);
			a.stream = NULL;
		} else {
			ck_assert_msg(forge_closed(&f, spin_pair, 3000),
			    "%s claiming %llu: still open", tries[i].cert,
			    (unsigned long long) tries[i].claim);
			ck_assert_ptr_null(a.stream);
			ck_assert_msg(logged(log, tries[i].why), "%s: %s",
			    tries[i].why, log->lines);
		}
		forge_close(&f);
	}
	adv_report("per-member certificates claiming another Raft id, or a "
	           "removed member's",
	    "each refused at libraft's handshake, naming why",
	    "any holder of a member certificate could claim any Raft id", true,
	    "4 of 4 refused (the shared ID, a certificate naming no id, "
	    "another member's id, a removed member's own id); member 2's "
	    "own claim accepted");

	/* a dials b as member 2 (its certificate: m2), then as member 3
	 * at the same address: that one is refused. */
	ck_assert_int_eq(
	    a.t.connect(&a.t, &req, 2, addr_b, pair_connected), 0);
	ck_assert(pair_run_until_status(&a, 3000));
	ck_assert_int_eq(a.status, 0);
	ck_assert(pair_run_until_stream(&b, 3000));
	ck_assert_uint_eq(b.peer_id, 1);
	uv_close((uv_handle_t *) a.stream, pair_free_stream);
	uv_close((uv_handle_t *) b.stream, pair_free_stream);
	a.stream = b.stream = NULL;
	a.status = 1;
	ck_assert_int_eq(
	    a.t.connect(&a.t, &req, 3, addr_b, pair_connected), 0);
	ck_assert(pair_run_until_status(&a, 3000));
	ck_assert_int_eq(a.status, RAFT_NOCONNECTION);
	ck_assert_msg(
	    logged(log, "certificate of member 2, not of member 3 dialed"),
	    "%s", log->lines);

	a.t.close(&a.t, pair_closed);
	b.t.close(&b.t, pair_closed);
	ck_assert(pair_run(&a.closed, 3000));
	ck_assert(pair_run(&b.closed, 3000));
	allot__raft_tls_close(&a.t);
	allot__raft_tls_close(&b.t);
	pair_loop_done();
	free(log);
}
END_TEST

/* Idle TCP connections never keep a member out: 70 of them from one
 * address (the member's own here), then 70 from ten other addresses;
 * once they have waited a quarter of handshake_ms, a member's dial
 * takes the place of the one waiting the longest (issue 27: seventy
 * made a real member's handshake fail). */
START_TEST(idle_connections_make_room)
{
	enum { IDLE = 70 };
	allot__raft_tls_opts o = { 0 };
	char cert[128], ca[128], addr_a[64], from[32];
	allot__logger lg = { capture, NULL, ALLOT_LOG_DEBUG };
	member *log = calloc(1, sizeof *log);
	side a = { .status = 1 };
	int fds[IDLE];

	signal(SIGPIPE, SIG_IGN);
	lg.ctx = log;
	ck_assert_int_eq(uv_loop_init(&pair_loop), 0);
	snprintf(cert, sizeof cert, "%s/member.pem", root);
	snprintf(ca, sizeof ca, "%s/ca1/ca.pem", root);
	o.cert_key_file = cert;
	o.ca_file = ca;
	o.handshake_ms = 2000; /* a place is taken after 500 ms */
	o.log = &lg;
	snprintf(addr_a, sizeof addr_a, "127.0.0.1:%d", pc_free_port());
	ck_assert_int_eq(allot__raft_tls_init(&a.t, &pair_loop, &o), 0);
	a.t.data = &a;
	ck_assert_int_eq(a.t.init(&a.t, 1, addr_a), 0);
	ck_assert_int_eq(a.t.listen(&a.t, pair_accept), 0);

	for (int round = 0; round < 2; round++) {
		side b = { .status = 1 };
		struct raft_uv_connect req = { .data = &b };
		unsigned held = 0, after = 0;
		uint64_t t0;

		for (int i = 0; i < IDLE; i++) {
			snprintf(from, sizeof from, "127.0.0.%d",
			    round == 0 ? 1 : 2 + i / 7);
			fds[i] = plain_connect_from(addr_a, from);
			spin_pair();
		}
		for (uint64_t end = pc_now_ms() + 700; pc_now_ms() < end;)
			spin_pair(), usleep(1000);
		for (int i = 0; i < IDLE; i++)
			held += !fd_closed(fds[i]);

		ck_assert_int_eq(
		    allot__raft_tls_init(&b.t, &pair_loop, &o), 0);
		b.t.data = &b;
		ck_assert_int_eq(b.t.init(&b.t, 2, "127.0.0.1:1"), 0);
		t0 = pc_now_ms();
		ck_assert_int_eq(
		    b.t.connect(&b.t, &req, 1, addr_a, pair_connected), 0);
		ck_assert(pair_run_until_status(&b, 3000));
		for (int i = 0; i < IDLE; i++)
			after += !fd_closed(fds[i]);
		adv_report(round == 0 ?
		        "70 idle TCP connections to a member's Raft port "
		        "from one address" :
		        "70 idle TCP connections to a member's Raft port "
		        "from ten addresses",
		    "a member's dial connects at once; one address holds at "
		    "most 8 places",
		    "a real member's handshake failed (the 64 places held)",
		    b.status == 0 && after == held - 1,
		    "%u of 70 held; a member's dial %s in %llu ms, in the "
		    "place "
		    "of the one waiting the longest (%u held after it)",
		    held, b.status == 0 ? "connected" : "failed",
		    (unsigned long long) (pc_now_ms() - t0), after);
		ck_assert_int_eq(b.status, 0);
		ck_assert_uint_eq(after, held - 1); /* it gave its place */
		ck_assert(pair_run_until_stream(&a, 3000));
		ck_assert_uint_eq(a.peer_id, 2);
		ck_assert_uint_le(held, round == 0 ? 8 : 64);
		uv_close((uv_handle_t *) a.stream, pair_free_stream);
		uv_close((uv_handle_t *) b.stream, pair_free_stream);
		a.stream = NULL;
		pair_close(&b);
		for (int i = 0; i < IDLE; i++)
			close(fds[i]);
	}
	pair_close(&a);
	pair_loop_done();
	free(log);
}
END_TEST

void
raft_tls_hostile_add(TCase *tc)
{
	tcase_add_test(tc, idle_connections_make_room);
	tcase_add_test(tc, per_member_ids_bound);
	tcase_add_test(tc, forged_vote_refused);
}
