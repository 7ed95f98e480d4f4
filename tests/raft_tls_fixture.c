/* SPDX-License-Identifier: MIT */
/* The Raft transport suite's fixture: raft_tls_fixture.h. */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "consensus/raft_tls.h"
#include "proc.h"
#include "raft_tls_fixture.h"

char root[64];

/* Once per run, in the runner's process (an unchecked fixture). */
void
make_certs(void)
{
	const char *src = getenv("ALLOT_SOURCE_DIR");
	char cmd[2048];

	snprintf(root, sizeof root, "/tmp/allot-raft-tls-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(root));
	ck_assert_ptr_nonnull(src);
	snprintf(cmd, sizeof cmd,
	    "set -e; m=%s/scripts/mkcerts; d=%s; exec 2>$d/mkcerts.log; "
	    "$m -s URI:" MEMBER_ID " $d/ca1; "
	    "mkdir -p $d/imp $d/nouri; "
	    "cp $d/ca1/ca.pem $d/ca1/ca.key $d/imp/; "
	    "cp $d/ca1/ca.pem $d/ca1/ca.key $d/nouri/; "
	    "$m -s URI:spiffe://t/svc/imposter $d/imp; "
	    "$m $d/nouri; "
	    "mkdir -p $d/pm; cp $d/ca1/ca.pem $d/ca1/ca.key $d/pm/; "
	    "$m -s URI:" MEMBER_ID "/m1 $d/pm; "
	    "cat $d/pm/server.pem $d/pm/server.key > $d/permember.pem; "
	    "mkdir -p $d/pm2; cp $d/ca1/ca.pem $d/ca1/ca.key $d/pm2/; "
	    "$m -s URI:" MEMBER_ID "/m2 $d/pm2; "
	    "cat $d/pm2/server.pem $d/pm2/server.key > $d/permember2.pem; "
	    "mkdir -p $d/pmx; cp $d/ca1/ca.pem $d/ca1/ca.key $d/pmx/; "
	    "$m -s URI:" MEMBER_ID "/mx $d/pmx; "
	    "cat $d/pmx/server.pem $d/pmx/server.key > $d/permemberx.pem; "
	    "$m -s URI:" MEMBER_ID " $d/ca2; "
	    "cat $d/ca1/server.pem $d/ca1/server.key > $d/member.pem; "
	    "cat $d/imp/server.pem $d/imp/server.key > $d/imposter.pem; "
	    "cat $d/nouri/server.pem $d/nouri/server.key > $d/nouri.pem; "
	    "cat $d/ca2/server.pem $d/ca2/server.key > $d/other.pem",
	    src, root);
	ck_assert_int_eq(system(cmd), 0);
}

/* Members' data dirs: each case starts with none. */
void
clean_members(void)
{
	char cmd[160];

	snprintf(cmd, sizeof cmd, "rm -rf '%s'/m[0-9]", root);
	ck_assert_int_eq(system(cmd), 0);
}

void
remove_certs(void)
{
	char cmd[160];

	snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
	ck_assert_int_eq(system(cmd), 0);
}

/* ---- members ---- */

void
capture(void *ctx, int level, const char *id, const char *msg)
{
	member *m = ctx;
	int n;

	(void) level;
	if (m->nlines >= sizeof m->lines - 1)
		return;
	n = snprintf(m->lines + m->nlines, sizeof m->lines - m->nlines,
	    "%s %s\n", id, msg);
	if (n > 0)
		m->nlines += (size_t) n;
	if (m->nlines > sizeof m->lines - 1)
		m->nlines = sizeof m->lines - 1;
}

bool
logged(const member *m, const char *what)
{
	return strstr(m->lines, what) != NULL;
}

void
member_init(member *m, int i, const char *cert)
{
	memset(m, 0, sizeof *m);
	ck_assert_int_eq(uv_loop_init(&m->loop), 0);
	snprintf(m->dir, sizeof m->dir, "%s/m%d", root, i + 1);
	snprintf(
	    m->address, sizeof m->address, "127.0.0.1:%d", pc_free_port());
	snprintf(m->cert, sizeof m->cert, "%s/%s", root, cert);
	m->key[0] = '\0';
	snprintf(m->ca, sizeof m->ca, "%s/ca1/ca.pem", root);
	m->log.fn = capture;
	m->log.ctx = m;
	m->log.level = ALLOT_LOG_DEBUG;
	m->election_ms = 300;
}

void
member_key_apart(member *m, const char *ca_dir)
{
	snprintf(m->cert, sizeof m->cert, "%s/%s/server.pem", root, ca_dir);
	snprintf(m->key, sizeof m->key, "%s/%s/server.key", root, ca_dir);
}

void
member_start(member *m, uint64_t id, const allot__cmember *seed, size_t n)
{
	allot__consensus_opts o = { 0 };
	allot__raft_tls_opts t = { 0 };

	t.cert_key_file = m->cert;
	t.key_file = m->key[0] != '\0' ? m->key : NULL;
	t.ca_file = m->ca;
	t.member_id = m->member_id;
	t.handshake_ms = 1000;
	t.buffer_max = 16384; /* small: a big entry runs into backpressure */
	o.id = id;
	o.address = m->address;
	o.dir = m->dir;
	o.election_ms = m->election_ms;
	o.heartbeat_ms = 30;
	o.log = &m->log;
	o.tls = &t;
	ck_assert_int_eq(
	    allot__consensus_create(&m->loop, &o, &m->c), ALLOT_OK);
	if (n > 0)
		ck_assert_int_eq(
		    allot__consensus_bootstrap(m->c, seed, n), ALLOT_OK);
	else
		ck_assert_int_eq(allot__consensus_join(m->c), ALLOT_OK);
	ck_assert_int_eq(allot__consensus_start(m->c), ALLOT_OK);
	m->closed = false;
}

static void
member_closed(void *ctx)
{
	((member *) ctx)->closed = true;
}

void
member_finish(member *m)
{
	if (m->c != NULL) {
		allot__consensus_close(m->c, member_closed, m);
		while (!m->closed)
			uv_run(&m->loop, UV_RUN_ONCE);
		m->c = NULL;
	}
	uv_run(&m->loop, UV_RUN_NOWAIT);
	ck_assert_int_eq(uv_loop_close(&m->loop), 0);
}

/* Runs every unfrozen loop a little, until `done` or the deadline. */
bool
run_until(member *m, size_t n, bool (*done)(member *, size_t), unsigned ms)
{
	uint64_t end = pc_now_ms() + ms;

	while (pc_now_ms() < end) {
		if (done != NULL && done(m, n))
			return true;
		for (size_t i = 0; i < n; i++)
			if (!m[i].frozen && m[i].c != NULL)
				uv_run(&m[i].loop, UV_RUN_NOWAIT);
		usleep(1000);
	}
	return done != NULL && done(m, n);
}

/* The member that may grant now, -1 if none; at most one may. */
int
granting(member *m, size_t n)
{
	int who = -1;

	for (size_t i = 0; i < n; i++) {
		if (m[i].frozen || m[i].c == NULL)
			continue;
		if (allot__consensus_may_grant(m[i].c, uv_now(&m[i].loop))) {
			ck_assert_int_eq(who, -1);
			who = (int) i;
		}
	}
	return who;
}

bool
some_granting(member *m, size_t n)
{
	return granting(m, n) >= 0;
}

static int committed; /* config_done's: 1 committed, -1 failed */

static void
config_done(void *ctx, int status, uint64_t index)
{
	(void) ctx;
	(void) index;
	committed = status == ALLOT_OK ? 1 : -1;
	if (status != ALLOT_OK)
		fprintf(stderr, "config proposal failed: %s\n",
		    allot_strerror(status));
}

static bool
config_settled(member *m, size_t n)
{
	(void) m;
	(void) n;
	return committed != 0;
}

uint64_t
applied(const member *m)
{
	return allot__consensus_state(m->c)->applied;
}

/* Members 0..n-1 applied the same index. */
bool
same_applied(member *m, size_t n)
{
	for (size_t i = 1; i < n; i++)
		if (applied(&m[i]) != applied(&m[0]))
			return false;
	return true;
}

/* Commits config epoch `epoch` through the granting member `g`; returns
 * the member it was committed through. When leadership moves before the
 * entry commits (a slow loop under a sanitizer misses heartbeats), the
 * proposal fails and is made again through the new leader: the config
 * epoch is a compare-and-set, so if the first entry survived the change
 * the second commits as refused and the state is the same. */
int
commit_config(member *m, size_t n, int g, const char *text, uint64_t epoch)
{
	for (int tries = 0; tries < 5; tries++) {
		int rv;

		if (tries > 0) {
			fprintf(stderr,
			    "config epoch %llu: proposal %d failed, again\n",
			    (unsigned long long) epoch, tries);
			ck_assert(run_until(m, n, some_granting, 15000));
			g = granting(m, n);
		}
		committed = 0;
		rv = allot__consensus_propose_config(m[g].c, text,
		    strlen(text), 7, epoch, NULL, config_done, NULL);
		if (rv == ALLOT_ESTATE)
			continue;
		ck_assert_int_eq(rv, ALLOT_OK);
		ck_assert(run_until(m, n, config_settled, 15000));
		if (committed > 0) {
			ck_assert_uint_eq(
			    allot__consensus_state(m[g].c)->config.epoch,
			    epoch);
			return g;
		}
	}
	ck_abort_msg(
	    "config epoch %llu never committed", (unsigned long long) epoch);
	return -1;
}

/* Three members, with election timeout `election_ms`. */
void
three(member *m, allot__cmember *seed, unsigned election_ms)
{
	for (int i = 0; i < 3; i++) {
		member_init(&m[i], i, "member.pem");
		m[i].election_ms = election_ms;
		seed[i].id = (uint64_t) i + 1;
		snprintf(seed[i].address, sizeof seed[i].address, "%s",
		    m[i].address);
	}
	for (int i = 0; i < 3; i++)
		member_start(&m[i], (uint64_t) i + 1, seed, 3);
}

/* ---- the transport alone, as raft_uv drives it ---- */

void
pair_accept(struct raft_uv_transport *t, raft_id id, const char *address,
    uv_stream_t *stream)
{
	side *s = t->data;

	s->peer_id = id;
	snprintf(s->peer_address, sizeof s->peer_address, "%s", address);
	s->stream = stream;
	stream->data = s;
}

void
pair_connected(struct raft_uv_connect *req, uv_stream_t *stream, int status)
{
	side *s = req->data;

	s->status = status;
	s->stream = stream;
	if (stream != NULL)
		stream->data = s;
}

void
pair_alloc(uv_handle_t *h, size_t hint, uv_buf_t *b)
{
	side *s = h->data;

	(void) hint;
	*b = uv_buf_init(s->got + s->ngot, (unsigned) (s->cap - s->ngot));
}

void
pair_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b)
{
	side *s = st->data;

	(void) b;
	if (n > 0)
		s->ngot += (size_t) n;
	else if (n == UV_EOF)
		s->eof = true;
	else
		ck_assert_int_ge(n, 0);
}

void
pair_write(side *s, const char *data, size_t len)
{
	uv_write_t *w = malloc(sizeof *w);
	uv_buf_t b = uv_buf_init((char *) data, (unsigned) len);

	ck_assert_int_eq(
	    uv_write(w, s->stream, &b, 1, (uv_write_cb) (void (*)(void)) free),
	    0);
}

void
pair_closed(struct raft_uv_transport *t)
{
	((side *) t->data)->closed = true;
}

uv_loop_t pair_loop;

/* Runs the loop until `*flag` or `ms` pass. */
bool
pair_run(const bool *flag, unsigned ms)
{
	uint64_t end = pc_now_ms() + ms;

	while (!*flag && pc_now_ms() < end)
		uv_run(&pair_loop, UV_RUN_NOWAIT), usleep(200);
	return *flag;
}

bool
pair_run_until_stream(side *s, unsigned ms)
{
	uint64_t end = pc_now_ms() + ms;

	while (s->stream == NULL && pc_now_ms() < end)
		uv_run(&pair_loop, UV_RUN_NOWAIT), usleep(200);
	return s->stream != NULL;
}

/* Until the connect callback fired (status no longer 1). */
bool
pair_run_until_status(side *s, unsigned ms)
{
	uint64_t end = pc_now_ms() + ms;

	while (s->status == 1 && pc_now_ms() < end)
		uv_run(&pair_loop, UV_RUN_NOWAIT), usleep(200);
	return s->status != 1;
}

void
pair_close(side *s)
{
	s->closed = false;
	s->t.close(&s->t, pair_closed);
	ck_assert(pair_run(&s->closed, 3000));
	allot__raft_tls_close(&s->t);
}

void
pair_loop_done(void)
{
	uv_run(&pair_loop, UV_RUN_NOWAIT);
	ck_assert_int_eq(uv_loop_close(&pair_loop), 0);
}

void
pair_free_stream(uv_handle_t *h)
{
	raft_free(h); /* what raft_uv does */
}

/* A TCP connection to `address` (127.0.0.1:PORT) from `from` (another
 * loopback address; NULL: any). */
int
plain_connect_from(const char *address, const char *from)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	const char *colon = strrchr(address, ':');
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	ck_assert_int_ge(fd, 0);
	if (from != NULL) {
		struct sockaddr_in src = { .sin_family = AF_INET };

		ck_assert_int_eq(inet_pton(AF_INET, from, &src.sin_addr), 1);
		ck_assert_int_eq(
		    bind(fd, (struct sockaddr *) &src, sizeof src), 0);
	}
	sa.sin_port = htons((uint16_t) atoi(colon + 1));
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(connect(fd, (struct sockaddr *) &sa, sizeof sa), 0);
	return fd;
}

int
plain_connect(const char *address)
{
	return plain_connect_from(address, NULL);
}

/* Whether the other end closed `fd`: EOF or a reset. */
bool
fd_closed(int fd)
{
	char buf[256];
	ssize_t r = recv(fd, buf, sizeof buf, MSG_DONTWAIT);

	return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}
