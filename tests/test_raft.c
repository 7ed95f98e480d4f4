/* SPDX-License-Identifier: MIT */
/*
 * The Raft cluster with real allotd processes on loopback (issue 15,
 * stage 2; docs/operations.md, "Cluster"), spoken to with the raw
 * protocol client: one leader serves and the followers answer NOT_LEADER
 * with its agent URL and every member's; Welcome and Reply carry the
 * epoch; a SIGKILLed leader is replaced by one with a higher epoch within
 * the documented time; a SIGSTOPped leader, once continued, never grants
 * again (NOT_LEADER or a lower epoch only); a config applied on the
 * leader is in force and in the file of every member; the usage table of
 * every member equals the leader's after traffic (read with sqlite3
 * -readonly, as an auditor would); a wiped member rejoins under a new id
 * and catches up to the same rows; a member is added and another removed
 * while an agent keeps syncing without a refusal. Times are printed for
 * docs/operations.md.
 */
#include <check.h>
#include <inttypes.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <allot/allot.h>

#include "allotd.h"
#include "proc.h"
#include "proto_client.h"
#include "runner.h"

#define MAXM 5
#define ELECTION_MS 500
/* Kill to serving: detection (at most 2 election timeouts: libraft
 * randomises it in [T, 2T]), pre-vote and vote (a few round trips), the
 * EPOCH entry committed, the wait of lease x (1 + 1 %) + 5 ms, and the
 * poll (10 ms). docs/operations.md states the same bound; the margin
 * is for a loaded test machine. */
#define FAILOVER_BOUND_MS \
	(3 * ELECTION_MS + ELECTION_MS * 101 / 100 + 5 + 1500)

/* A member: its allotd (tests/support/allotd.h, c.sock its admin
 * socket), Raft id and address. */
typedef pc_member member;

typedef struct cluster {
	char dir[64];
	int n;
	member m[MAXM];
	/* Mutual TLS between members: one PEM (certificate + key) and the
	 * CA; NULL: plain TCP. */
	const char *cert, *ca;
} cluster;

static const char *const CFG =
    "quotas:\n  default: {tokens_per_second: 100, burst: 100}\n"
    "  callers:\n    - identity: c1\n      tokens_per_second: 300\n"
    "      burst: 300\n";
static const char *const CFG2 =
    "quotas:\n  default: {tokens_per_second: 100, burst: 100}\n"
    "  callers:\n    - identity: c1\n      tokens_per_second: 450\n"
    "      burst: 450\n"
    "      candidate: {tokens_per_second: 50, burst: 50}\n";

static void
member_init(cluster *c, int i, uint64_t id)
{
	pc_member_init(&c->m[i], c->dir, id, CFG);
}

/* Start member i: seeded with members [0, nseed) or joining. */
static void
start(cluster *c, int i, int nseed)
{
	const char *extra[] = { "--interval-ms", "100", "--tls-cert", c->cert,
		"--tls-ca", c->ca,
		/* Agents here are the raw client, without identity
		 * proofs. */
		"--no-require-identity", NULL };
	if (c->cert == NULL)
		extra[2] = NULL;
	pc_member_start(&c->m[i], c->m, (size_t) nseed, ELECTION_MS, extra);
}

static void
cluster_run(cluster *c)
{
	for (int i = 0; i < c->n; i++)
		member_init(c, i, (uint64_t) i + 1);
	for (int i = 0; i < c->n; i++)
		start(c, i, c->n);
}

static void
cluster_make(cluster *c, int n)
{
	memset(c, 0, sizeof *c);
	pc_mkdtemp(c->dir, sizeof c->dir, "/tmp/allot-raft");
	c->n = n;
}

static void
cluster_start(cluster *c, int n)
{
	cluster_make(c, n);
	cluster_run(c);
}

static void
cluster_stop(cluster *c)
{
	for (int i = 0; i < c->n; i++) {
		if (c->m[i].c.pid > 0)
			kill(c->m[i].c.pid, SIGCONT);
		pc_coord_done(&c->m[i].c, 5000);
	}
	if (getenv("ALLOT_KEEP_TMP") == NULL)
		pc_rm_rf(c->dir);
}

/* The member's /status "cluster" object as text ("" when unreachable). */
static char *
status(const member *m)
{
	int st = 0;
	char *body = pc_http_get(m->c.http, "/status", &st);
	if (body == NULL || st != 200) {
		free(body);
		return strdup("");
	}
	return body;
}

static uint64_t
status_num(const member *m, const char *key)
{
	char *s = status(m);
	char pat[64];
	snprintf(pat, sizeof pat, "\"%s\":", key);
	const char *cl = strstr(s, "\"cluster\":");
	const char *p = cl != NULL ? strstr(cl, pat) : NULL;
	uint64_t v = p != NULL ? strtoull(p + strlen(pat), NULL, 10) : 0;
	free(s);
	return v;
}

/* The index of the one serving member among the live ones, waiting up to
 * `timeout_ms`; -1 when none. Fails when two serve at once. */
static int
wait_leader(const cluster *c, int timeout_ms)
{
	return pc_member_serving(c->m, (size_t) c->n, timeout_ms);
}

/* True once every member of `c` reports config epoch `want`, within
 * `timeout_ms`: a follower applies what the leader committed a little
 * later (a heartbeat; longer under a sanitizer). */
static bool
config_epoch_everywhere(const cluster *c, uint64_t want, int timeout_ms)
{
	uint64_t until = pc_now_ms() + (uint64_t) timeout_ms;
	for (;;) {
		bool all = true;
		for (int i = 0; i < c->n; i++)
			all &= status_num(&c->m[i], "config_epoch") == want;
		if (all || pc_now_ms() >= until)
			return all;
		pc_sleep_ms(20);
	}
}

/* Whether the file at `path` holds `want` within `timeout_ms`. */
static bool
file_becomes(const char *path, const char *want, int timeout_ms)
{
	uint64_t until = pc_now_ms() + (uint64_t) timeout_ms;
	for (;;) {
		char *t = pc_read_file(path);
		bool same = t != NULL && strcmp(t, want) == 0;
		free(t);
		if (same || pc_now_ms() >= until)
			return same;
		pc_sleep_ms(20);
	}
}

static const char *const KEYS[] = { "c1" };

/* Register on member i: the answer (the caller frees it). */
static Allot__V1__Envelope *
reg(const member *m, pc_conn *conn, const char *replica)
{
	if (!conn->open)
		ck_assert_int_eq(pc_open(conn, m->c.url, 5000), 0);
	return pc_register(conn, replica, "svc", KEYS, 1, 100);
}

START_TEST(one_leader_redirects)
{
	cluster c;
	cluster_start(&c, 3);
	int L = wait_leader(&c, 10000);
	ck_assert_int_ge(L, 0);
	for (int i = 0; i < c.n; i++) {
		pc_conn conn = { 0 };
		Allot__V1__Envelope *e = reg(&c.m[i], &conn, "r1");
		/* A follower names the leader once its first AppendEntries
		 * arrived: under a sanitizer that can take a while. */
		for (int t = 0; i != L && t < 100 && e != NULL &&
		     e->body_case == ALLOT__V1__ENVELOPE__BODY_ERROR &&
		     e->error->leader[0] == '\0';
		     t++) {
			pc_free(e);
			pc_sleep_ms(100);
			e = reg(&c.m[i], &conn, "r1");
		}
		ck_assert_ptr_nonnull(e);
		if (i == L) {
			ck_assert_int_eq(
			    e->body_case, ALLOT__V1__ENVELOPE__BODY_WELCOME);
			ck_assert_uint_gt(e->welcome->epoch, 0);
			ck_assert_uint_eq(e->welcome->n_members, 3);
			uint64_t epoch = e->welcome->epoch;
			uint64_t session = e->welcome->session;
			pc_report r = {
				.key = 0, .consumed = 5, .demand = 50
			};
			Allot__V1__Envelope *y = pc_sync(
			    &conn, session, 1, 100, &r, 1);
			ck_assert_ptr_nonnull(y);
			ck_assert_int_eq(
			    y->body_case, ALLOT__V1__ENVELOPE__BODY_REPLY);
			ck_assert_uint_eq(y->reply->epoch, epoch);
			ck_assert_uint_eq(y->reply->n_members, 3);
			pc_free(y);
		} else {
			ck_assert_int_eq(pc_error_code(e),
			    ALLOT__V1__ERROR__CODE__NOT_LEADER);
			ck_assert_str_eq(e->error->leader, c.m[L].c.url);
			ck_assert_uint_eq(e->error->n_members, 3);
			bool listed = false;
			for (size_t k = 0; k < e->error->n_members; k++)
				listed |= strcmp(e->error->members[k],
				              c.m[i].c.url) == 0;
			ck_assert(listed);
		}
		pc_free(e);
		pc_close(&conn);
	}
	/* The config every member installed came through the log. */
	ck_assert(config_epoch_everywhere(&c, 1, 10000));
	cluster_stop(&c);
}
END_TEST

/* One row of a member's file, as text ("" when none). */
static char *
sql_one(const member *m, const char *sql)
{
	char cmd[768];
	snprintf(cmd, sizeof cmd, "sqlite3 -readonly %s \"%s\"", m->c.db, sql);
	char *s = pc_shell(cmd);
	return s != NULL ? s : strdup("");
}

START_TEST(sigkill_leader)
{
	cluster c;
	cluster_start(&c, 3);
	int L = wait_leader(&c, 10000);
	ck_assert_int_ge(L, 0);
	uint64_t e0 = status_num(&c.m[L], "epoch");
	/* A replica of the leader, live in every member's file before the
	 * kill (its join went through the log). */
	pc_conn old = { 0 };
	Allot__V1__Envelope *w = reg(&c.m[L], &old, "r0");
	ck_assert_int_eq(w->body_case, ALLOT__V1__ENVELOPE__BODY_WELCOME);
	uint64_t s0 = w->welcome->session;
	pc_free(w);
	char want[64];
	snprintf(want, sizeof want, "%" PRIu64 "|r0", s0);
	uint64_t until = pc_now_ms() + 5000;
	bool everywhere = false;
	while (!everywhere && pc_now_ms() < until) {
		everywhere = true;
		for (int i = 0; i < c.n; i++) {
			char *r = sql_one(&c.m[i],
			    "SELECT session, replica_id FROM v_live_replicas");
			everywhere &= strcmp(r, want) == 0;
			free(r);
		}
		pc_sleep_ms(50);
	}
	ck_assert_msg(everywhere, "r0's join is not live on every member");
	uint64_t t0 = pc_now_ms();
	kill(c.m[L].c.pid, SIGKILL);
	pc_wait_exit(c.m[L].c.pid, 5000);
	c.m[L].c.pid = 0;
	c.m[L].up = false;
	int N = wait_leader(&c, 20000);
	uint64_t took = pc_now_ms() - t0;
	ck_assert_int_ge(N, 0);
	fprintf(stderr,
	    "raft: SIGKILL of the leader -> a new leader serving in %" PRIu64
	    " ms (election %d ms; bound %d ms)\n",
	    took, ELECTION_MS, FAILOVER_BOUND_MS);
	ck_assert_uint_le(took, FAILOVER_BOUND_MS);
	/* The new leader counts r0 before it is heard from: its
	 * replicated row is a placeholder holding its part. */
	char *st = status(&c.m[N]);
	ck_assert_msg(strstr(st, "\"replica_id\":\"r0\"") != NULL &&
	        strstr(st, "\"restored\":true") != NULL,
	    "the new leader does not hold r0: %s", st);
	free(st);
	pc_close(&old);
	pc_conn conn = { 0 };
	Allot__V1__Envelope *e = reg(&c.m[N], &conn, "r0");
	ck_assert_int_eq(e->body_case, ALLOT__V1__ENVELOPE__BODY_WELCOME);
	ck_assert_uint_gt(e->welcome->epoch, e0);
	/* A session id no earlier leader issued. */
	uint64_t s1 = e->welcome->session;
	ck_assert_uint_gt(s1, s0);
	pc_free(e);
	pc_close(&conn);
	/* The old session was replaced, in the new leader's file and in the
	 * surviving follower's alike. */
	snprintf(
	    want, sizeof want, "%" PRIu64 "|replaced\n%" PRIu64 "|", s0, s1);
	until = pc_now_ms() + 5000;
	everywhere = false;
	while (!everywhere && pc_now_ms() < until) {
		everywhere = true;
		for (int i = 0; i < c.n; i++) {
			if (!c.m[i].up)
				continue;
			char *r = sql_one(&c.m[i],
			    "SELECT session, coalesce(left_why, '') FROM "
			    "replicas WHERE replica_id = 'r0' ORDER BY "
			    "session");
			everywhere &= strncmp(r, want, strlen(want)) == 0;
			free(r);
		}
		pc_sleep_ms(50);
	}
	ck_assert_msg(everywhere, "r0's sessions differ from '%s'", want);
	cluster_stop(&c);
}
END_TEST

START_TEST(sigstop_leader_is_fenced)
{
	cluster c;
	cluster_start(&c, 3);
	int L = wait_leader(&c, 10000);
	ck_assert_int_ge(L, 0);
	pc_conn old = { 0 };
	ck_assert_int_eq(pc_open(&old, c.m[L].c.url, 5000), 0);
	kill(c.m[L].c.pid, SIGSTOP);
	c.m[L].up = false;
	int N = wait_leader(&c, 20000);
	ck_assert_int_ge(N, 0);
	uint64_t e1 = status_num(&c.m[N], "epoch");
	kill(c.m[L].c.pid, SIGCONT);
	/* From its first answer on, the old leader grants nothing under the
	 * new epoch: NOT_LEADER, or (never seen: its lease ended long ago)
	 * a Welcome of a lower epoch, which agents drop. */
	int not_leader = 0;
	for (int k = 0; k < 20; k++) {
		char id[16];
		snprintf(id, sizeof id, "old%d", k);
		Allot__V1__Envelope *e = pc_register(
		    &old, id, "svc", KEYS, 1, 100);
		ck_assert_ptr_nonnull(e);
		if (e->body_case == ALLOT__V1__ENVELOPE__BODY_WELCOME)
			ck_assert_uint_lt(e->welcome->epoch, e1);
		else
			not_leader += pc_error_code(e) ==
			    ALLOT__V1__ERROR__CODE__NOT_LEADER;
		pc_free(e);
		pc_sleep_ms(20);
	}
	ck_assert_int_eq(not_leader, 20);
	pc_close(&old);
	c.m[L].up = true;
	ck_assert_int_eq(wait_leader(&c, 5000), N);
	cluster_stop(&c);
}
END_TEST

/* The usage rows of a member's file, as text, read as an auditor does. */
static char *
usage_dump(const member *m)
{
	char cmd[512];
	snprintf(cmd, sizeof cmd,
	    "sqlite3 -readonly %s \"SELECT at, service, quota, admitted, "
	    "denied FROM usage ORDER BY at, service, quota\"",
	    m->c.db);
	char *s = pc_shell(cmd);
	return s != NULL ? s : strdup("");
}

/* The events that went through the log, as text: the leader's (joins,
 * taking over) with the time it recorded them; the cluster's (config
 * commits, epochs) without, as each member stamps when it applied them. */
static char *
events_dump(const member *m)
{
	char cmd[512];
	snprintf(cmd, sizeof cmd,
	    "sqlite3 -readonly %s \"SELECT CASE WHEN kind IN ('join', "
	    "'leader') THEN at ELSE '' END, kind, subject, detail FROM "
	    "events WHERE kind IN ('join', 'leader', 'config_committed', "
	    "'epoch') ORDER BY id\"",
	    m->c.db);
	char *s = pc_shell(cmd);
	return s != NULL ? s : strdup("");
}

/* The replica, share and level rows of a member's file, as text: every
 * member writes them from the leader's AUDIT entries, times and all. */
static char *
state_dump(const member *m)
{
	char cmd[768];
	snprintf(cmd, sizeof cmd,
	    "sqlite3 -readonly %s \"SELECT session, replica_id, service, "
	    "pid, joined_at, last_seen, left_at, left_why FROM replicas "
	    "ORDER BY session; SELECT at, session, quota, rate, burst FROM "
	    "share_history ORDER BY id; SELECT session, quota, rate FROM "
	    "shares ORDER BY 1, 2; SELECT service, quota, level, at FROM "
	    "levels ORDER BY 1, 2; SELECT at, quota, shadow_denied, "
	    "candidate_denied, candidate_rate FROM usage WHERE "
	    "candidate_rate IS NOT NULL ORDER BY 1, 2\"",
	    m->c.db);
	char *s = pc_shell(cmd);
	return s != NULL ? s : strdup("");
}

static uint64_t
admitted_total(const member *m)
{
	char cmd[512];
	snprintf(cmd, sizeof cmd,
	    "sqlite3 -readonly %s \"SELECT coalesce(sum(admitted), 0) FROM "
	    "usage\"",
	    m->c.db);
	char *s = pc_shell(cmd);
	uint64_t v = s != NULL ? strtoull(s, NULL, 10) : 0;
	free(s);
	return v;
}

/* An agent on the leader for `ms`: every 100 ms a Sync reporting `per`
 * tokens. Returns what it reported; counts refusals in *ret_refused. */
static uint64_t
traffic(member *m, pc_replica *r, int ms, uint64_t per, int *ret_refused)
{
	uint64_t sum = 0;
	for (int t = 0; t < ms; t += 100) {
		pc_report rep = { .key = 0, .consumed = per, .demand = per };
		int rc = pc_replica_sync(r, &rep, 1, NULL);
		if (rc == 0)
			sum += per;
		else
			(*ret_refused)++;
		pc_sleep_ms(100);
	}
	(void) m;
	return sum;
}

static void
apply_on(const member *m, const char *file)
{
	char cmd[1024];
	snprintf(cmd, sizeof cmd,
	    "'%s' apply --admin %s --reason test %s >/dev/null 2>&1; echo $?",
	    pc_program("tools/allotctl"), m->c.sock, file);
	char *s = pc_shell(cmd);
	ck_assert_ptr_nonnull(s);
	ck_assert_str_eq(s, "0");
	free(s);
}

START_TEST(config_and_usage_on_every_member)
{
	cluster c;
	cluster_start(&c, 3);
	int L = wait_leader(&c, 10000);
	ck_assert_int_ge(L, 0);
	char next[300];
	snprintf(next, sizeof next, "%s/next.yaml", c.dir);
	pc_write_file(next, CFG2);
	apply_on(&c.m[L], next);
	ck_assert(config_epoch_everywhere(&c, 2, 10000));
	/* In force first (/status), then its audit rows flushed, then the
	 * file replaced (allotd_cluster.c install_apply()): the file
	 * follows within moments. */
	for (int i = 0; i < c.n; i++)
		ck_assert_msg(file_becomes(c.m[i].c.cfg, CFG2, 10000),
		    "member %d's quota file is not the applied one", i);
	pc_replica r = { 0 };
	ck_assert_int_eq(
	    pc_replica_join(&r, c.m[L].c.url, "a1", "svc", KEYS, 1), 0);
	int refused = 0;
	uint64_t sent = traffic(&c.m[L], &r, 3000, 10, &refused);
	ck_assert_int_eq(refused, 0);
	pc_replica_close(&r);
	pc_sleep_ms(2500); /* the last second flushed and replicated */
	/* Every member's audit names who applied it and why, as the
	 * leader's admin socket saw them (not just "cluster"). */
	struct passwd *pw = getpwuid(geteuid());
	ck_assert_ptr_nonnull(pw);
	char want[200];
	snprintf(want, sizeof want, "%s|test|2", pw->pw_name);
	for (int i = 0; i < c.n; i++) {
		char cmd[600];
		snprintf(cmd, sizeof cmd,
		    "sqlite3 -readonly %s \"SELECT DISTINCT who, reason, "
		    "epoch FROM v_quota_changes WHERE epoch = 2\"",
		    c.m[i].c.db);
		char *got = pc_shell(cmd);
		ck_assert_msg(got != NULL && strcmp(got, want) == 0,
		    "member %d's quota changes: '%s', want '%s'", i,
		    got ? got : "(none)", want);
		free(got);
	}
	char *lead = usage_dump(&c.m[L]);
	ck_assert_uint_eq(admitted_total(&c.m[L]), sent);
	char *ev = events_dump(&c.m[L]);
	ck_assert_ptr_nonnull(strstr(ev, "|join|"));
	/* The replica's session, from its join to its leave, the shares
	 * it was granted and what the candidate would have denied, on
	 * every member, not the leader's only. */
	char *state = state_dump(&c.m[L]);
	ck_assert_msg(strstr(state, "|a1|svc|") != NULL &&
	        (strstr(state, "|expired\n") != NULL ||
	            strstr(state, "|leave\n") != NULL) &&
	        strstr(state, "|50.0\n") != NULL,
	    "the leader's replicas: %s", state);
	for (int i = 0; i < c.n; i++) {
		char *d = usage_dump(&c.m[i]);
		ck_assert_str_eq(d, lead);
		free(d);
		d = events_dump(&c.m[i]);
		ck_assert_str_eq(d, ev);
		free(d);
		d = state_dump(&c.m[i]);
		ck_assert_msg(strcmp(d, state) == 0,
		    "member %d's replicas and shares:\n%s\nthe leader's:\n%s",
		    i, d, state);
		free(d);
	}
	free(state);
	free(ev);
	free(lead);
	cluster_stop(&c);
}
END_TEST

START_TEST(membership_under_traffic)
{
	cluster c;
	cluster_start(&c, 3);
	int L = wait_leader(&c, 10000);
	ck_assert_int_ge(L, 0);
	pc_replica r = { 0 };
	ck_assert_int_eq(
	    pc_replica_join(&r, c.m[L].c.url, "a1", "svc", KEYS, 1), 0);
	int refused = 0;
	traffic(&c.m[L], &r, 1000, 10, &refused);

	/* A follower dies with its disk: it is removed, and comes back
	 * wiped under a new id. */
	int F = (L + 1) % 3;
	kill(c.m[F].c.pid, SIGKILL);
	pc_wait_exit(c.m[F].c.pid, 5000);
	c.m[F].c.pid = 0;
	c.m[F].up = false;
	char args[256];
	snprintf(args, sizeof args, "remove %" PRIu64, c.m[F].id);
	ck_assert_int_eq(pc_ctl_member(c.m[L].c.sock, args), 0);
	traffic(&c.m[L], &r, 500, 10, &refused);
	char cmd[600];
	snprintf(
	    cmd, sizeof cmd, "rm -rf %s %s.raft", c.m[F].c.db, c.m[F].c.db);
	free(pc_shell(cmd));
	member_init(&c, F, 4);
	start(&c, F, 0);
	snprintf(
	    args, sizeof args, "add 4 %s %s", c.m[F].raftaddr, c.m[F].c.url);
	ck_assert_int_eq(pc_ctl_member(c.m[L].c.sock, args), 0);
	uint64_t until = pc_now_ms() + 15000;
	while (!pc_member_is_voter(c.m[F].c.sock, c.m[F].id) &&
	    pc_now_ms() < until)
		traffic(&c.m[L], &r, 200, 10, &refused);
	ck_assert(pc_member_is_voter(c.m[F].c.sock, c.m[F].id));

	/* Another member added, and one removed, still under traffic. */
	member_init(&c, 3, 5);
	c.n = 4;
	start(&c, 3, 0);
	snprintf(
	    args, sizeof args, "add 5 %s %s", c.m[3].raftaddr, c.m[3].c.url);
	ck_assert_int_eq(pc_ctl_member(c.m[L].c.sock, args), 0);
	until = pc_now_ms() + 15000;
	while (!pc_member_is_voter(c.m[3].c.sock, c.m[3].id) &&
	    pc_now_ms() < until)
		traffic(&c.m[L], &r, 200, 10, &refused);
	ck_assert(pc_member_is_voter(c.m[3].c.sock, c.m[3].id));
	int G = (L + 2) % 3;
	snprintf(args, sizeof args, "remove %" PRIu64, c.m[G].id);
	until = pc_now_ms() + 10000;
	int rc;
	while ((rc = pc_ctl_member(c.m[L].c.sock, args)) != 0 &&
	    pc_now_ms() < until)
		traffic(&c.m[L], &r, 200, 10, &refused);
	ck_assert_int_eq(rc, 0);
	traffic(&c.m[L], &r, 1000, 10, &refused);
	/* No agent was refused on the way. */
	ck_assert_int_eq(refused, 0);
	pc_replica_close(&r);
	pc_sleep_ms(2500);
	/* The rejoined and the added member caught up to the leader's rows
	 * (the removed one stopped where it was removed). */
	char *lead = usage_dump(&c.m[L]);
	ck_assert_uint_gt(strlen(lead), 0);
	char *d1 = usage_dump(&c.m[F]);
	char *d2 = usage_dump(&c.m[3]);
	ck_assert_str_eq(d1, lead);
	ck_assert_str_eq(d2, lead);
	free(d1);
	free(d2);
	free(lead);
	cluster_stop(&c);
}
END_TEST

static uint64_t
count_rows(const member *m, const char *table)
{
	char cmd[512];
	snprintf(cmd, sizeof cmd,
	    "sqlite3 -readonly %s \"SELECT count(*) FROM %s\"", m->c.db,
	    table);
	char *s = pc_shell(cmd);
	uint64_t v = s != NULL ? strtoull(s, NULL, 10) : 0;
	free(s);
	return v;
}

START_TEST(restarts_replay_idempotently)
{
	cluster c;
	cluster_start(&c, 3);
	int L = wait_leader(&c, 10000);
	ck_assert_int_ge(L, 0);
	pc_replica r = { 0 };
	ck_assert_int_eq(
	    pc_replica_join(&r, c.m[L].c.url, "a1", "svc", KEYS, 1), 0);
	int refused = 0;
	traffic(&c.m[L], &r, 1500, 10, &refused);
	/* A follower drains on SIGTERM, misses some traffic, comes back
	 * with the same id: it replays its log (writing nothing twice,
	 * installing no config again) and catches up. */
	int F = (L + 1) % 3;
	pc_sleep_ms(1200);
	uint64_t configs = count_rows(&c.m[F], "configs");
	uint64_t changes = count_rows(&c.m[F], "quota_changes");
	ck_assert_int_eq(pc_coord_stop(&c.m[F].c, SIGTERM, 5000), 0);
	c.m[F].up = false;
	traffic(&c.m[L], &r, 1500, 10, &refused);
	start(&c, F, 3);
	traffic(&c.m[L], &r, 1000, 10, &refused);
	ck_assert_int_eq(refused, 0);
	pc_replica_close(&r);
	pc_sleep_ms(2500);
	char *lead = usage_dump(&c.m[L]);
	char *d = usage_dump(&c.m[F]);
	ck_assert_str_eq(d, lead);
	free(d);
	free(lead);
	/* One row for the start's own load of the file, none for the
	 * replayed CONFIG entries. */
	ck_assert_uint_eq(count_rows(&c.m[F], "configs"), configs + 1);
	ck_assert_uint_eq(count_rows(&c.m[F], "quota_changes"), changes);
	/* The leader drains too; one of the others takes over, and the old
	 * leader comes back as a follower. */
	ck_assert_int_eq(pc_coord_stop(&c.m[L].c, SIGTERM, 5000), 0);
	c.m[L].up = false;
	int N = wait_leader(&c, 20000);
	ck_assert_int_ge(N, 0);
	ck_assert_int_ne(N, L);
	start(&c, L, 3);
	pc_sleep_ms(1000);
	ck_assert_int_eq(wait_leader(&c, 5000), N);
	cluster_stop(&c);
}
END_TEST

/* Removing the leader takes one call on its own admin socket: the call
 * waits while the leader records that it leaves, hands leadership over
 * and the new leader demotes and removes it, and exits 0. Every
 * survivor's member list then lacks it, the new leader is on a higher
 * epoch, and the old member no longer serves. Prints how long the call
 * took and when every survivor had the removal committed. A removal that
 * cannot commit (no quorum) answers 504 within its wait. */
START_TEST(remove_the_leader)
{
	cluster c;
	cluster_start(&c, 3);
	int L = wait_leader(&c, 10000);
	ck_assert_int_ge(L, 0);
	uint64_t e0 = status_num(&c.m[L], "epoch");
	char args[64];
	snprintf(args, sizeof args, "remove %" PRIu64, c.m[L].id);
	uint64_t t0 = pc_now_ms();
	ck_assert_int_eq(pc_ctl_member(c.m[L].c.sock, args), 0);
	uint64_t call_ms = pc_now_ms() - t0;
	c.m[L].up = false; /* no longer counted as a possible leader */
	const char *survivors[2];
	size_t ns = 0;
	for (int i = 0; i < 3; i++)
		if (i != L)
			survivors[ns++] = c.m[i].c.sock;
	ck_assert(pc_member_gone_everywhere(survivors, ns, c.m[L].id, 5000));
	uint64_t gone_ms = pc_now_ms() - t0;
	int N = wait_leader(&c, 5000);
	ck_assert_int_ge(N, 0);
	ck_assert_int_ne(N, L);
	ck_assert_uint_gt(status_num(&c.m[N], "epoch"), e0);
	/* The old member is not serving and knows it no longer votes. */
	char *body = status(&c.m[L]);
	ck_assert_ptr_null(strstr(body, "\"serving\":true"));
	free(body);
	ck_assert(!pc_member_is_voter(c.m[L].c.sock, c.m[L].id));
	/* With its last other voter dead, the new leader's own removal
	 * cannot commit: the call answers 504 within its wait, naming the
	 * state reached. */
	int O = 3 - L - N;
	kill(c.m[O].c.pid, SIGKILL);
	pc_wait_exit(c.m[O].c.pid, 5000);
	c.m[O].c.pid = 0;
	c.m[O].up = false;
	char cmd[1024];
	snprintf(cmd, sizeof cmd,
	    "curl -s -m 10 --unix-socket %s -X POST -w ' %%{http_code}' "
	    "'http://allotd/members/remove?id=%" PRIu64 "&wait_ms=500'",
	    c.m[N].c.sock, c.m[N].id);
	char *out = pc_shell(cmd);
	ck_assert_ptr_nonnull(out);
	ck_assert_msg(strstr(out, "was not removed within 500 ms") != NULL &&
	        strstr(out, " 504") != NULL,
	    "%s", out);
	free(out);
	fprintf(stderr,
	    "remove_the_leader: one call, %" PRIu64 " ms; the removal was "
	    "committed on every survivor %" PRIu64 " ms after the call "
	    "started (new leader %d, epoch %" PRIu64 " -> %" PRIu64 ")\n",
	    call_ms, gone_ms, N + 1, e0, status_num(&c.m[N], "epoch"));
	cluster_stop(&c);
}
END_TEST

/* The same cluster over mutual TLS (coordinator/consensus/raft_tls.c):
 * certificates for one member SPIFFE ID from scripts/mkcerts. A leader,
 * redirects, and the usage rows replicated through the TLS links. */
START_TEST(members_over_tls)
{
	cluster c;
	cluster_make(&c, 3);
	char cmd[1024], cert[128], ca[128];
	snprintf(cmd, sizeof cmd,
	    "set -e; d=%s/pki; %s/scripts/mkcerts -s "
	    "URI:spiffe://test.example/allot/member $d >$d.log 2>&1; "
	    "cat $d/server.pem $d/server.key > %s/member.pem",
	    c.dir, getenv("ALLOT_SOURCE_DIR"), c.dir);
	ck_assert_int_eq(system(cmd), 0);
	snprintf(cert, sizeof cert, "%s/member.pem", c.dir);
	snprintf(ca, sizeof ca, "%s/pki/ca.pem", c.dir);
	c.cert = cert;
	c.ca = ca;
	cluster_run(&c);
	int L = wait_leader(&c, 10000);
	ck_assert_int_ge(L, 0);
	pc_sleep_ms(300);
	int F = (L + 1) % 3;
	pc_conn conn = { 0 };
	Allot__V1__Envelope *e = reg(&c.m[F], &conn, "r1");
	ck_assert_int_eq(pc_error_code(e), ALLOT__V1__ERROR__CODE__NOT_LEADER);
	ck_assert_str_eq(e->error->leader, c.m[L].c.url);
	pc_free(e);
	pc_close(&conn);
	pc_replica r = { 0 };
	ck_assert_int_eq(
	    pc_replica_join(&r, c.m[L].c.url, "a1", "svc", KEYS, 1), 0);
	int refused = 0;
	uint64_t sent = traffic(&c.m[L], &r, 2000, 10, &refused);
	ck_assert_int_eq(refused, 0);
	pc_replica_close(&r);
	pc_sleep_ms(2500);
	char *lead = usage_dump(&c.m[L]);
	ck_assert_uint_eq(admitted_total(&c.m[L]), sent);
	for (int i = 0; i < c.n; i++) {
		char *d = usage_dump(&c.m[i]);
		ck_assert_str_eq(d, lead);
		free(d);
		char *log = pc_read_file(c.m[i].c.log);
		ck_assert_ptr_nonnull(
		    strstr(log, "mutual TLS between members"));
		free(log);
	}
	free(lead);
	cluster_stop(&c);
}
END_TEST

static Suite *
raft_suite(void)
{
	Suite *s = suite_create("raft");
	TCase *tc = tcase_create("allotd members");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, one_leader_redirects);
	tcase_add_test(tc, sigkill_leader);
	tcase_add_test(tc, sigstop_leader_is_fenced);
	tcase_add_test(tc, config_and_usage_on_every_member);
	tcase_add_test(tc, membership_under_traffic);
	tcase_add_test(tc, restarts_replay_idempotently);
	tcase_add_test(tc, remove_the_leader);
	tcase_add_test(tc, members_over_tls);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(raft_suite)
