/* SPDX-License-Identifier: MIT */
/*
 * The consensus suite's raft_uv part: three members on raft_uv over
 * loopback TCP in one process (one loop each, run in turn). It commits a
 * config, freezes the leader's loop (like SIGSTOP), checks a new leader
 * commits, then restarts a member from its data directory and checks it
 * replays to the same state, and rejoins a wiped member.
 */
#include <check.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>
#include <time.h>

#include <raft.h>
#include <raft/fixture.h>

#include "consensus/consensus.h"
#include "consensus/consensus_entry.h"
#include "consensus/consensus_fsm.h"
#include "consensus/consensus_node.h"
#include "consensus_cases.h"
#include "proc.h"
#include "runner.h"

#include <allot/allot.h>

/* ---- three members on raft_uv over loopback TCP ---- */

typedef struct uv_member {
	uv_loop_t loop;
	allot__consensus *c;
	char dir[128];
	char address[64];
	bool frozen; /* its loop is not run: a stopped process */
	bool closed;
	uint64_t last_index;
} uv_member;

static void
uv_on_apply(void *ctx, uint64_t index, const allot__centry *e)
{
	uv_member *m = ctx;

	(void) e;
	ck_assert_uint_gt(index, m->last_index);
	m->last_index = index;
}

static void
uv_start(uv_member *m, uint64_t id, const allot__cmember *seed, size_t n)
{
	allot__consensus_opts o = { 0 };

	o.id = id;
	o.address = m->address;
	o.dir = m->dir;
	o.election_ms = 300;
	o.heartbeat_ms = 30;
	o.snapshot_threshold = 16;
	o.snapshot_trailing = 4;
	o.on_apply = uv_on_apply;
	o.ctx = m;
	m->last_index = 0;
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

/* Runs every unfrozen loop a little, until `done` or the deadline. */
static bool
uv_run_until(
    uv_member *m, size_t n, bool (*done)(uv_member *, size_t), unsigned ms)
{
	uint64_t end = pc_now_ms() + ms;

	while (pc_now_ms() < end) {
		if (done != NULL && done(m, n))
			return true;
		for (size_t i = 0; i < n; i++)
			if (!m[i].frozen)
				uv_run(&m[i].loop, UV_RUN_NOWAIT);
		usleep(1000);
	}
	return done != NULL && done(m, n);
}

static int
uv_granting(uv_member *m, size_t n)
{
	int who = -1, published = 0;

	for (size_t i = 0; i < n; i++) {
		if (m[i].closed)
			continue;
		/* What a worker thread would grant by, for every member, the
		 * frozen one included (its value is stale, not wrong). */
		if (uv_hrtime() / 1000000 <
		    allot__consensus_grant_until(m[i].c))
			published++;
		if (!m[i].frozen &&
		    allot__consensus_may_grant(m[i].c, uv_now(&m[i].loop))) {
			ck_assert_int_eq(who, -1); /* at most one */
			who = (int) i;
		}
	}
	ck_assert_int_le(published, 1);
	return who;
}

static bool
some_granting(uv_member *m, size_t n)
{
	return uv_granting(m, n) >= 0;
}

static int committed_configs;

static void
config_done(void *ctx, int status, uint64_t index)
{
	(void) ctx;
	(void) index;
	if (status == ALLOT_OK)
		committed_configs++;
}

static bool
config_committed(uv_member *m, size_t n)
{
	(void) m;
	(void) n;
	return committed_configs > 0;
}

static bool
same_applied(uv_member *m, size_t n)
{
	for (size_t i = 1; i < n; i++)
		if (allot__consensus_state(m[i].c)->applied !=
		    allot__consensus_state(m[0].c)->applied)
			return false;
	return true;
}

static void
uv_closed(void *ctx)
{
	uv_member *m = ctx;

	m->closed = true;
}

static void
uv_close_member(uv_member *m)
{
	allot__consensus_close(m->c, uv_closed, m);
	while (!m->closed)
		uv_run(&m->loop, UV_RUN_ONCE);
	m->c = NULL;
}

static void
same_state(uv_member *a, uv_member *b)
{
	void *x, *y;
	size_t lx, ly;

	ck_assert_int_eq(
	    allot__cfsm_encode(allot__consensus_state(a->c), &x, &lx),
	    ALLOT_OK);
	ck_assert_int_eq(
	    allot__cfsm_encode(allot__consensus_state(b->c), &y, &ly),
	    ALLOT_OK);
	ck_assert(lx == ly && memcmp(x, y, lx) == 0);
	raft_free(x);
	raft_free(y);
}

/* What member_is waits for: the granting member's configuration has
 * `want_id` in role `want_role` (-1: absent), and the change is done. */
static uint64_t want_id;
static int want_role;

static bool
member_is(uv_member *m, size_t n)
{
	allot__cmember list[8];
	int l = uv_granting(m, n);
	size_t k;

	if (l < 0)
		return false;
	k = allot__consensus_members(m[l].c, list, 8);
	for (size_t i = 0; i < k; i++)
		if (list[i].id == want_id)
			return list[i].role == want_role &&
			    !allot__consensus_changing(m[l].c);
	return want_role == -1 && !allot__consensus_changing(m[l].c);
}

static bool
three_events(uv_member *m, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (allot__consensus_state(m[i].c)->members_changed < 3)
			return false;
	return same_applied(m, n);
}

/* Member g loses its disk: it is removed, and rejoins empty under a new
 * id (a wiped member must not vote under its old id: it forgot its
 * votes), as a non-voter first, and catches up to the same state. */
static void
wipe_and_rejoin(uv_member *m, int g, uint64_t new_id)
{
	char cmd[200];
	int l;

	uv_close_member(&m[g]);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", m[g].dir);
	ck_assert_int_eq(system(cmd), 0);
	ck_assert(uv_run_until(m, 3, some_granting, 10000));
	l = uv_granting(m, 3);
	ck_assert_int_eq(
	    allot__consensus_remove_member(m[l].c, (uint64_t) g + 1),
	    ALLOT_OK);
	want_id = (uint64_t) g + 1;
	want_role = -1;
	ck_assert(uv_run_until(m, 3, member_is, 10000));

	uv_start(&m[g], new_id, NULL, 0);
	ck_assert(uv_run_until(m, 3, some_granting, 10000));
	l = uv_granting(m, 3);
	ck_assert_int_eq(
	    allot__consensus_add_member(m[l].c, new_id, m[g].address),
	    ALLOT_OK);
	want_id = new_id;
	want_role = RAFT_VOTER;
	ck_assert(uv_run_until(m, 3, member_is, 20000));
	/* Its MEMBER events (removed, added, promoted) applied everywhere. */
	ck_assert(uv_run_until(m, 3, three_events, 10000));
	l = uv_granting(m, 3);
	ck_assert_int_ge(l, 0);
	same_state(&m[g], &m[l]);
}

START_TEST(uv_three_members_failover)
{
	uv_member m[3];
	allot__cmember seed[3];
	char root[] = "/tmp/allot-consensus-XXXXXX";
	const char *text = "services: {}\n";
	int g, g2;
	uint64_t t0;

	/* raft_uv writes to peers that may have gone: like allotd, the
	 * process ignores SIGPIPE and sees EPIPE. */
	signal(SIGPIPE, SIG_IGN);
	ck_assert_ptr_nonnull(mkdtemp(root));
	memset(m, 0, sizeof m);
	for (int i = 0; i < 3; i++) {
		ck_assert_int_eq(uv_loop_init(&m[i].loop), 0);
		snprintf(m[i].dir, sizeof m[i].dir, "%s/m%d", root, i + 1);
		snprintf(m[i].address, sizeof m[i].address, "127.0.0.1:%d",
		    pc_free_port());
		seed[i].id = (uint64_t) i + 1;
		snprintf(seed[i].address, sizeof seed[i].address, "%s",
		    m[i].address);
	}
	for (int i = 0; i < 3; i++)
		uv_start(&m[i], (uint64_t) i + 1, seed, 3);

	ck_assert(uv_run_until(m, 3, some_granting, 10000));
	g = uv_granting(m, 3);
	ck_assert_int_eq(allot__consensus_propose_config(m[g].c, text,
	                     strlen(text), 42, 1, NULL, config_done, NULL),
	    ALLOT_OK);
	ck_assert(uv_run_until(m, 3, config_committed, 5000));
	ck_assert(uv_run_until(m, 3, same_applied, 5000));
	for (int i = 0; i < 3; i++) {
		ck_assert_str_eq(
		    allot__consensus_state(m[i].c)->config.text, text);
		ck_assert_uint_eq(allot__consensus_epoch(m[i].c),
		    allot__consensus_epoch(m[g].c));
	}

	/* Freeze the leader's loop: the others elect a new leader, which
	 * grants after the old lease ran out, at a higher epoch. */
	m[g].frozen = true;
	t0 = pc_now_ms();
	ck_assert(uv_run_until(m, 3, some_granting, 15000));
	g2 = uv_granting(m, 3);
	ck_assert_int_ne(g2, g);
	ck_assert_uint_ge(pc_now_ms() - t0, 300);
	ck_assert_uint_gt(
	    allot__consensus_epoch(m[g2].c), allot__consensus_epoch(m[g].c));
	committed_configs = 0;
	ck_assert_int_eq(allot__consensus_propose_config(
	                     m[g2].c, "v2", 2, 7, 2, NULL, config_done, NULL),
	    ALLOT_OK);
	ck_assert(uv_run_until(m, 3, config_committed, 5000));

	/* Thaw it: it steps down and catches up. Then restart it from its
	 * data dir: it replays to the same state, each index once. Then
	 * wipe it. */
	m[g].frozen = false;
	ck_assert(uv_run_until(m, 3, same_applied, 10000));
	/* Someone grants (g2 unless timing moved it on; at most one is
	 * what uv_granting checks). */
	ck_assert(uv_run_until(m, 3, some_granting, 5000));
	uv_close_member(&m[g]);
	uv_start(&m[g], (uint64_t) g + 1, seed, 3);
	ck_assert(uv_run_until(m, 3, same_applied, 10000));
	same_state(&m[g], &m[g2]);
	ck_assert_str_eq(allot__consensus_state(m[g].c)->config.text, "v2");

	wipe_and_rejoin(m, g, 4);
	for (int i = 0; i < 3; i++) {
		uv_close_member(&m[i]);
		ck_assert_int_eq(uv_loop_close(&m[i].loop), 0);
	}
	{
		char cmd[160];

		snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
		ck_assert_int_eq(system(cmd), 0);
	}
}
END_TEST

TCase *
consensus_uv_cases(void)
{
	TCase *io = tcase_create("raft_uv");

	tcase_add_test(io, uv_three_members_failover);
	tcase_set_timeout(io, 60);
	return io;
}
