/* SPDX-License-Identifier: MIT */
/*
 * The consensus core (coordinator/consensus*.c) under test.
 *
 * Most cases run libraft's raft_fixture: several members in one process
 * on in-memory I/O and one virtual clock, stepped one event at a time,
 * deterministic. Each member runs the REAL state machine (consensus_fsm.c)
 * and the REAL node logic with its lease predicate (consensus_node.c), the
 * same code allotd runs on raft_uv. After every fixture step every node
 * ticks and the invariants are checked:
 * - at most one member may grant (allot__cnode_may_grant at the
 *   fixture's time), counting killed and cut-off members too;
 * - each member's epoch never goes down, and a client that follows
 *   whoever grants never sees the epoch go down; a granting member's
 *   epoch is its own term;
 * - no member applies an index twice or one usage batch twice.
 * After healing, every member in the configuration has a byte-identical
 * snapshot, and its usage totals equal the sum of the batches committed
 * (the union of what members applied), which includes every batch whose
 * proposal was acknowledged.
 *
 * One case runs three members on raft_uv over loopback TCP in one
 * process (one loop each, run in turn), commits a config, freezes the
 * leader's loop (like SIGSTOP), checks a new leader commits, then
 * restarts a member from its data directory and checks it replays to the
 * same state.
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

#include "consensus.h"
#include "consensus_entry.h"
#include "consensus_fsm.h"
#include "consensus_node.h"
#include "runner.h"

#include <allot/allot.h>

/* ---- entries and the state machine alone ---- */

static void
encode(const allot__centry *e, void **buf, size_t *len)
{
	ck_assert_int_eq(allot__centry_encode(e, buf, len), ALLOT_OK);
}

START_TEST(entry_round_trip)
{
	allot__cusage_row rows[2] = {
		{ "svc", "k1", 1700000000, 12, 3, 15.5, 2 },
		{ "other", "", 1700000001, 0, 7, 0.25, 1 },
	};
	allot__centry in = { .type = ALLOT__CENTRY_USAGE }, out;
	void *buf;
	size_t len;

	in.usage.rows = rows;
	in.usage.n = 2;
	encode(&in, &buf, &len);
	ck_assert_int_eq(allot__centry_decode(buf, len, &out), ALLOT_OK);
	ck_assert_int_eq(out.type, ALLOT__CENTRY_USAGE);
	ck_assert_uint_eq(out.usage.n, 2);
	ck_assert_str_eq(out.usage.rows[1].service, "other");
	ck_assert_str_eq(out.usage.rows[1].key, "");
	ck_assert_uint_eq(out.usage.rows[0].consumed, 12);
	ck_assert_uint_eq(out.usage.rows[1].denied, 7);
	ck_assert(out.usage.rows[0].demand == 15.5);
	ck_assert_uint_eq(out.usage.rows[0].live_replicas, 2);
	allot__centry_clear(&out);
	/* Entries are padded to 8 bytes for raft_uv; every truncation
	 * into the fields is refused, never read past. */
	ck_assert_uint_eq(len % 8, 0);
	for (size_t cut = 0; cut < len; cut++) {
		int rv = allot__centry_decode(buf, cut, &out);

		if (rv == ALLOT_OK) {
			allot__centry_clear(&out);
			ck_assert_uint_gt(cut + 8, len); /* only padding cut */
			continue;
		}
		ck_assert_int_eq(rv, ALLOT_EPROTO);
	}
	/* A version this build does not know stops the member. */
	((uint8_t *) buf)[0] = ALLOT__CENTRY_VERSION + 1;
	ck_assert_int_eq(allot__centry_decode(buf, len, &out), ALLOT_ERANGE);
	raft_free(buf);

	in = (allot__centry) { .type = ALLOT__CENTRY_CONFIG };
	in.config.text = "a\0b";
	in.config.text_len = 3;
	in.config.digest = 0xdeadbeefcafef00dull;
	in.config.config_epoch = 4;
	in.config.who = (allot__cwho) {
		.who = "alice", .reason = "halve it", .source = "q.yaml"
	};
	encode(&in, &buf, &len);
	ck_assert_int_eq(allot__centry_decode(buf, len, &out), ALLOT_OK);
	ck_assert_uint_eq(out.config.text_len, 3);
	ck_assert_int_eq(memcmp(out.config.text, "a\0b", 3), 0);
	ck_assert_uint_eq(out.config.digest, 0xdeadbeefcafef00dull);
	ck_assert_uint_eq(out.config.config_epoch, 4);
	/* Who and why travel with it; what was not given comes back "". */
	ck_assert_str_eq(out.config.who.who, "alice");
	ck_assert_str_eq(out.config.who.claimed_as, "");
	ck_assert_str_eq(out.config.who.reason, "halve it");
	ck_assert_str_eq(out.config.who.source, "q.yaml");
	allot__centry_clear(&out);
	raft_free(buf);

	in = (allot__centry) { .type = ALLOT__CENTRY_EPOCH };
	in.epoch.term = 9;
	in.epoch.leader_id = 2;
	in.epoch.lease_ms = 1000;
	in.epoch.address = "10.0.0.2:7001";
	encode(&in, &buf, &len);
	ck_assert_int_eq(allot__centry_decode(buf, len, &out), ALLOT_OK);
	ck_assert_str_eq(out.epoch.address, "10.0.0.2:7001");
	ck_assert_uint_eq(out.epoch.term, 9);
	allot__centry_clear(&out);
	/* Padding must be zeros: anything else makes a different entry. */
	((uint8_t *) buf)[len - 1] = 1;
	ck_assert_int_eq(allot__centry_decode(buf, len, &out), ALLOT_EPROTO);
	raft_free(buf);

	/* The leader's audit events (allotd's store through the log). */
	allot__cevent ev[2] = {
		{ 1700000000123, "join", "svc/r1", "session=3" },
		{ 1700000000456, "leader", "", NULL },
	};
	in = (allot__centry) { .type = ALLOT__CENTRY_EVENTS };
	in.events.rows = ev;
	in.events.n = 2;
	encode(&in, &buf, &len);
	ck_assert_uint_eq(len % 8, 0);
	ck_assert_int_eq(allot__centry_decode(buf, len, &out), ALLOT_OK);
	ck_assert_uint_eq(out.events.n, 2);
	ck_assert_int_eq(out.events.rows[0].at, 1700000000123);
	ck_assert_str_eq(out.events.rows[0].kind, "join");
	ck_assert_str_eq(out.events.rows[0].subject, "svc/r1");
	ck_assert_str_eq(out.events.rows[0].detail, "session=3");
	ck_assert_str_eq(out.events.rows[1].detail, "");
	allot__centry_clear(&out);
	for (size_t cut = 0; cut < len; cut++) {
		int rv = allot__centry_decode(buf, cut, &out);

		if (rv == ALLOT_OK) {
			allot__centry_clear(&out);
			ck_assert_uint_gt(cut + 8, len);
			continue;
		}
		ck_assert_int_eq(rv, ALLOT_EPROTO);
	}
	raft_free(buf);

	in = (allot__centry) { .type = 99 };
	ck_assert_int_eq(allot__centry_encode(&in, &buf, &len), ALLOT_EINVAL);
}
END_TEST

/* The leader's replica, share and level rows: every field of every kind
 * comes back, strings absent come back "", and a truncation or a count
 * the bytes cannot hold is refused. */
START_TEST(entry_audit_round_trip)
{
	allot__cjoin joins[2] = {
		{ 7, 1700000000100, 0xabcdef0123456789ull, 4242, "r-1", "svc",
		    "host-a", "1.2.3" },
		{ 8, 1700000000200, 1, 1, "r-2", "svc", NULL, "" },
	};
	allot__cshare shares[3] = {
		{ 7, 150.25, 30.5, 1700000003000, 1700000000300, "svc", "k1" },
		{ 8, 0, 0, 1700000003000, 1700000000300, "svc", "k1" },
		{ 8, 1e-9, 2, -1, 1700000000301, "svc", "k2" },
	};
	allot__cleft lefts[1] = { { 7, 1700000000400, "replaced" } };
	allot__cseen seen[2] = { { 8, 1700000000500 }, { 9, 1 } };
	allot__clevel levels[1] = { { 12.5, 1700000000600, "svc", "k1" } };
	allot__cshadow shadow[1] = { { 1700000000, 40, 7, 90.5, "svc",
	    "k2" } };
	allot__centry in = { .type = ALLOT__CENTRY_AUDIT }, out;
	void *buf;
	size_t len;

	in.audit = (allot__caudit) { joins, 2, shares, 3, lefts, 1, seen, 2,
		levels, 1, shadow, 1 };
	encode(&in, &buf, &len);
	ck_assert_uint_eq(len % 8, 0);
	ck_assert_int_eq(allot__centry_decode(buf, len, &out), ALLOT_OK);
	ck_assert_int_eq(out.type, ALLOT__CENTRY_AUDIT);
	const allot__caudit *a = &out.audit;
	ck_assert_uint_eq(a->njoins, 2);
	ck_assert_uint_eq(a->nshares, 3);
	ck_assert_uint_eq(a->nlefts, 1);
	ck_assert_uint_eq(a->nseen, 2);
	ck_assert_uint_eq(a->nlevels, 1);
	ck_assert_uint_eq(a->joins[0].session, 7);
	ck_assert_int_eq(a->joins[0].at, 1700000000100);
	ck_assert_uint_eq(a->joins[0].digest, 0xabcdef0123456789ull);
	ck_assert_uint_eq(a->joins[0].pid, 4242);
	ck_assert_str_eq(a->joins[0].replica_id, "r-1");
	ck_assert_str_eq(a->joins[0].host, "host-a");
	ck_assert_str_eq(a->joins[0].version, "1.2.3");
	ck_assert_str_eq(a->joins[1].host, "");
	ck_assert(a->shares[0].rate == 150.25 && a->shares[0].burst == 30.5);
	ck_assert(a->shares[2].rate == 1e-9);
	ck_assert_int_eq(a->shares[2].lease_until, -1);
	ck_assert_int_eq(a->shares[1].at, 1700000000300);
	ck_assert_str_eq(a->shares[2].quota, "k2");
	ck_assert_uint_eq(a->lefts[0].session, 7);
	ck_assert_str_eq(a->lefts[0].why, "replaced");
	ck_assert_uint_eq(a->seen[1].session, 9);
	ck_assert_int_eq(a->seen[0].at, 1700000000500);
	ck_assert(a->levels[0].level == 12.5);
	ck_assert_str_eq(a->levels[0].service, "svc");
	ck_assert_str_eq(a->levels[0].quota, "k1");
	ck_assert_uint_eq(a->nshadow, 1);
	ck_assert_uint_eq(a->shadow[0].second, 1700000000);
	ck_assert_uint_eq(a->shadow[0].shadow_denied, 40);
	ck_assert_uint_eq(a->shadow[0].candidate_denied, 7);
	ck_assert(a->shadow[0].candidate_rate == 90.5);
	ck_assert_str_eq(a->shadow[0].quota, "k2");
	allot__centry_clear(&out);
	for (size_t cut = 0; cut < len; cut++) {
		int rv = allot__centry_decode(buf, cut, &out);

		if (rv == ALLOT_OK) {
			allot__centry_clear(&out);
			ck_assert_uint_gt(cut + 8, len);
			continue;
		}
		ck_assert_int_eq(rv, ALLOT_EPROTO);
	}
	/* A count far beyond the bytes: refused before any allocation. */
	((uint8_t *) buf)[2 + 3 * 4 + 2] = 0x0f; /* nseen = 0x000f0002 */
	ck_assert_int_eq(allot__centry_decode(buf, len, &out), ALLOT_EPROTO);
	raft_free(buf);
	/* An empty one is valid (the cluster proposes none, but replay may
	 * meet any). */
	in.audit = (allot__caudit) { 0 };
	encode(&in, &buf, &len);
	ck_assert_int_eq(allot__centry_decode(buf, len, &out), ALLOT_OK);
	ck_assert_uint_eq(out.audit.nshares, 0);
	allot__centry_clear(&out);
	raft_free(buf);
}
END_TEST

static void
apply(allot__cfsm *s, uint64_t index, const allot__centry *e)
{
	void *buf;
	size_t len;

	encode(e, &buf, &len);
	ck_assert_int_eq(allot__cfsm_apply_at(s, index, buf, len), ALLOT_OK);
	raft_free(buf);
}

static allot__centry
usage1(const char *key, uint64_t second, uint64_t consumed, uint64_t denied,
    allot__cusage_row *row)
{
	allot__centry e = { .type = ALLOT__CENTRY_USAGE };

	*row = (allot__cusage_row) { "svc", key, second, consumed, denied,
		(double) (consumed + denied), 1 };
	e.usage.rows = row;
	e.usage.n = 1;
	return e;
}

static allot__centry
config1(const char *text, uint64_t epoch)
{
	allot__centry e = { .type = ALLOT__CENTRY_CONFIG };

	e.config.text = text;
	e.config.text_len = strlen(text);
	e.config.digest = strlen(text) * 31;
	e.config.config_epoch = epoch;
	return e;
}

static allot__centry
epoch1(uint64_t term, uint64_t leader)
{
	allot__centry e = { .type = ALLOT__CENTRY_EPOCH };

	e.epoch.term = term;
	e.epoch.leader_id = leader;
	e.epoch.lease_ms = 1000;
	e.epoch.address = "x";
	return e;
}

static int applied_calls;

static void
count_apply(void *ctx, uint64_t index, const allot__centry *e)
{
	(void) ctx;
	(void) index;
	(void) e;
	applied_calls++;
}

/* Builds a state from a fixed list of 60 entries. */
static void
fill(allot__cfsm *s, uint64_t from, uint64_t to)
{
	allot__cusage_row row;
	char key[16];

	for (uint64_t i = from; i <= to; i++) {
		allot__centry e;

		snprintf(key, sizeof key, "k%u", (unsigned) (i % 9));
		if (i % 17 == 1)
			e = epoch1(i / 17 + 1, i % 3 + 1);
		else if (i % 13 == 0)
			e = config1(i % 2 ? "quota a" : "quota bb", i / 13);
		else
			e = usage1(key, 1000 + i, i % 5 + 1, i % 2, &row);
		apply(s, i, &e);
	}
}

START_TEST(fsm_replay_and_snapshot)
{
	allot__cfsm a, b;
	void *sa, *sb;
	size_t la, lb;
	const allot__cusage_total *t;

	allot__cfsm_init(&a, count_apply, NULL);
	allot__cfsm_init(&b, NULL, NULL);
	fill(&a, 1, 60);
	ck_assert_uint_eq(a.applied, 60);
	ck_assert_uint_eq(a.epoch.term, 60 / 17 + 1);
	/* 13, 26, 39 (52 is an EPOCH) */
	ck_assert_uint_eq(a.config.epoch, 3);
	ck_assert_str_eq(a.config.text, "quota a");
	t = allot__cfsm_usage(&a, "svc", "k3");
	ck_assert_ptr_nonnull(t);

	/* Replaying any prefix changes nothing and tells no one. */
	ck_assert_int_eq(allot__cfsm_encode(&a, &sa, &la), ALLOT_OK);
	applied_calls = 0;
	fill(&a, 1, 60);
	ck_assert_int_eq(applied_calls, 0);
	ck_assert_int_eq(allot__cfsm_encode(&a, &sb, &lb), ALLOT_OK);
	ck_assert_uint_eq(la, lb);
	ck_assert_int_eq(memcmp(sa, sb, la), 0);
	raft_free(sb);

	/* A snapshot taken midway, restored, and the rest replayed from
	 * the start (the log's trailing entries overlap the snapshot): the
	 * same bytes as applying everything once. */
	fill(&b, 1, 30);
	ck_assert_int_eq(allot__cfsm_encode(&b, &sb, &lb), ALLOT_OK);
	allot__cfsm_finish(&b);
	allot__cfsm_init(&b, NULL, NULL);
	ck_assert_int_eq(allot__cfsm_decode(&b, sb, lb), ALLOT_OK);
	raft_free(sb);
	fill(&b, 1, 60);
	ck_assert_int_eq(allot__cfsm_encode(&b, &sb, &lb), ALLOT_OK);
	ck_assert_uint_eq(la, lb);
	ck_assert_int_eq(memcmp(sa, sb, la), 0);

	/* Round trip of the whole state, and refusals leave it alone. */
	allot__cfsm_finish(&b);
	allot__cfsm_init(&b, NULL, NULL);
	ck_assert_int_eq(allot__cfsm_decode(&b, sa, la), ALLOT_OK);
	raft_free(sb);
	ck_assert_int_eq(allot__cfsm_encode(&b, &sb, &lb), ALLOT_OK);
	ck_assert_int_eq(memcmp(sa, sb, la), 0);
	ck_assert_int_eq(allot__cfsm_decode(&b, sa, la - 8), ALLOT_EPROTO);
	ck_assert_uint_eq(b.applied, 60);
	raft_free(sb);
	raft_free(sa);
	allot__cfsm_finish(&a);
	allot__cfsm_finish(&b);
}
END_TEST

START_TEST(fsm_config_cas_and_epoch)
{
	allot__cfsm s;
	allot__centry e;

	allot__cfsm_init(&s, NULL, NULL);
	e = config1("first", 1);
	apply(&s, 1, &e);
	/* Two pushes against config epoch 1: the first committed wins. */
	e = config1("second", 2);
	apply(&s, 2, &e);
	e = config1("racing", 2);
	apply(&s, 3, &e);
	ck_assert_str_eq(s.config.text, "second");
	ck_assert_uint_eq(s.config.epoch, 2);
	ck_assert_uint_eq(s.refused, 1);
	e = epoch1(5, 2);
	apply(&s, 4, &e);
	e = epoch1(3, 1); /* a lower term never lowers the epoch */
	apply(&s, 5, &e);
	ck_assert_uint_eq(s.epoch.term, 5);
	ck_assert_uint_eq(s.epoch.leader_id, 2);
	ck_assert_uint_eq(s.applied, 5);
	allot__cfsm_finish(&s);
}
END_TEST

static allot__centry
member1(int event, uint64_t id)
{
	allot__centry e = { .type = ALLOT__CENTRY_MEMBER };

	e.member.event = event;
	e.member.id = id;
	e.member.address = "127.0.0.1:1";
	return e;
}

/* The leaving set: LEAVING adds, REMOVED takes out, kept ascending and
 * in the snapshot, bounded; a version 1 snapshot reads as empty. */
START_TEST(fsm_leaving_set)
{
	allot__cfsm s, t;
	allot__centry e;
	void *buf;
	size_t len;
	uint64_t idx = 1;

	allot__cfsm_init(&s, NULL, NULL);
	allot__cfsm_init(&t, NULL, NULL);
	e = member1(ALLOT__CMEMBER_LEAVING, 7);
	apply(&s, idx++, &e);
	e = member1(ALLOT__CMEMBER_LEAVING, 3);
	apply(&s, idx++, &e);
	e = member1(ALLOT__CMEMBER_LEAVING, 7); /* again: one entry */
	apply(&s, idx++, &e);
	ck_assert_uint_eq(s.nleaving, 2);
	ck_assert_uint_eq(s.leaving[0], 3);
	ck_assert_uint_eq(s.leaving[1], 7);
	ck_assert(allot__cfsm_leaving(&s, 7));
	ck_assert(!allot__cfsm_leaving(&s, 5));
	/* The set survives a snapshot, byte for byte. */
	ck_assert_int_eq(allot__cfsm_encode(&s, &buf, &len), ALLOT_OK);
	ck_assert_int_eq(allot__cfsm_decode(&t, buf, len), ALLOT_OK);
	ck_assert_uint_eq(t.nleaving, 2);
	ck_assert_uint_eq(t.leaving[1], 7);
	raft_free(buf);
	e = member1(ALLOT__CMEMBER_REMOVED, 3);
	apply(&s, idx++, &e);
	e = member1(ALLOT__CMEMBER_PROMOTED, 7); /* other events: no change */
	apply(&s, idx++, &e);
	ck_assert_uint_eq(s.nleaving, 1);
	ck_assert_uint_eq(s.leaving[0], 7);
	ck_assert_uint_eq(s.members_changed, 5);
	for (uint64_t id = 10; id < 10 + ALLOT__CFSM_LEAVING_MAX; id++) {
		e = member1(ALLOT__CMEMBER_LEAVING, id);
		apply(&s, idx++, &e);
	}
	ck_assert_uint_eq(s.nleaving, ALLOT__CFSM_LEAVING_MAX);
	ck_assert_uint_eq(s.refused, 1);
	allot__cfsm_finish(&s);
	allot__cfsm_finish(&t);
}
END_TEST

/* ---- the fixture cluster ---- */

#define MAXS RAFT_FIXTURE_MAX_SERVERS
#define MAXB 8192 /* usage batches one case may propose */
#define NKEYS 7

typedef struct batch {
	bool proposed;
	bool acked;
} batch;

typedef struct cluster cluster;

typedef struct member_ctx {
	cluster *c;
	unsigned i;
	double rate; /* its clock's rate against the fixture's */
} member_ctx;

struct cluster {
	struct raft_fixture f;
	unsigned n;
	allot__cfsm fsm[MAXS];
	allot__cnode node[MAXS];
	member_ctx ctx[MAXS];
	/* Invariant bookkeeping. */
	uint64_t last_epoch[MAXS];
	uint64_t last_index[MAXS];
	uint8_t seen[MAXS][MAXB]; /* times member i applied batch b */
	uint64_t client_epoch;
	/* Each leadership's grant window in fixture (real) time: from the
	 * first step its lease was published to the end of that lease,
	 * whether or not the member ever noticed it lost. */
	struct {
		unsigned member;
		uint64_t term;
		double from, until;
	} win[512];
	unsigned nwin;
	unsigned granter; /* index of the last member that granted, +1 */
	unsigned handovers; /* times the granting member changed */
	uint64_t grant_ms; /* fixture time some member could grant */
	uint64_t last_step_time;
	/* The usage driver. */
	bool driving;
	uint64_t next_propose;
	unsigned nbatches;
	batch batches[MAXB];
	uint32_t lease_ms; /* 0: the default (the election timeout) */
	uint32_t renew_ms; /* 0: the default (a quarter lease) */
	uint64_t rng;
};

static uint64_t
rnd(cluster *c)
{
	c->rng ^= c->rng << 13;
	c->rng ^= c->rng >> 7;
	c->rng ^= c->rng << 17;
	return c->rng;
}

static void
batch_row(unsigned id, allot__cusage_row *row, char *key, size_t cap)
{
	snprintf(key, cap, "k%u", id % NKEYS);
	*row = (allot__cusage_row) { "svc", key, id, id % 13 + 1, id % 3,
		(double) (id % 13 + 1 + id % 3), 1 };
}

static void
on_apply(void *ctx, uint64_t index, const allot__centry *e)
{
	member_ctx *m = ctx;
	cluster *c = m->c;

	/* Applied indexes only go up on a member: nothing is applied
	 * twice, whatever restarts, snapshots or replays happen. */
	ck_assert_msg(index > c->last_index[m->i],
	    "member %u applied index %llu after %llu", m->i,
	    (unsigned long long) index,
	    (unsigned long long) c->last_index[m->i]);
	c->last_index[m->i] = index;
	if (e->type == ALLOT__CENTRY_USAGE) {
		unsigned id = (unsigned) e->usage.rows[0].second;

		ck_assert_uint_lt(id, MAXB);
		ck_assert_msg(c->seen[m->i][id] == 0,
		    "member %u applied batch %u twice", m->i, id);
		c->seen[m->i][id]++;
	}
}

static void
batch_done(void *ctx, int status, uint64_t index)
{
	batch *b = ctx;

	(void) index;
	b->acked = status == ALLOT_OK;
}

/* Member i's clock: the fixture's, run at 1 - d, 1 + d or 1 by member
 * (0, 1, 2, 3, ...), the drift the lease allows for, so the margins are
 * exercised: a hand-over from member 0 to 1 is the worst case, a slow old
 * leader and a fast new one. */
static uint64_t
member_clock(void *ctx)
{
	member_ctx *m = ctx;

	return (uint64_t) ((double) raft_fixture_time(&m->c->f) * m->rate);
}

/* Whether member i may grant now, on its own clock. */
static bool
grants(cluster *c, unsigned i)
{
	return allot__cnode_may_grant(&c->node[i], member_clock(&c->ctx[i]));
}

static struct raft *
raft_of(cluster *c, unsigned i)
{
	return raft_fixture_get(&c->f, i);
}

/* The member in leader state with the highest term, or c->n. */
static unsigned
leader_of(cluster *c)
{
	unsigned best = c->n;

	for (unsigned i = 0; i < c->n; i++) {
		struct raft *r = raft_of(c, i);

		if (raft_fixture_alive(&c->f, i) && r->state == RAFT_LEADER &&
		    (best == c->n ||
		        r->current_term > raft_of(c, best)->current_term))
			best = i;
	}
	return best;
}

static void
drive(cluster *c, uint64_t now)
{
	unsigned l;
	allot__cusage_row row;
	allot__centry e = { .type = ALLOT__CENTRY_USAGE };
	char key[16];

	if (!c->driving || now < c->next_propose)
		return;
	c->next_propose = now + 100;
	l = leader_of(c);
	if (l == c->n || c->nbatches >= MAXB - 1)
		return;
	batch_row(c->nbatches, &row, key, sizeof key);
	e.usage.rows = &row;
	e.usage.n = 1;
	if (allot__cnode_propose(&c->node[l], &e, batch_done,
	        &c->batches[c->nbatches]) == ALLOT_OK) {
		c->batches[c->nbatches].proposed = true;
		c->nbatches++;
	}
	/* Now and then a config push against the config the leader has. */
	if (rnd(c) % 20 == 0) {
		allot__centry cfg = config1(
		    "quota: x", c->fsm[l].config.epoch + 1);

		(void) allot__cnode_propose(&c->node[l], &cfg, NULL, NULL);
	}
}

/* The lease argument itself: no two leaderships' windows overlap in
 * real time, judged by what each published, so a leader that steps down
 * (and stops granting at once) is still held to the lease it had. */
static void
check_windows(cluster *c, unsigned i, uint64_t now)
{
	const allot__cnode *n = &c->node[i];
	uint64_t until = allot__cnode_grant_until(n);
	double real_until;
	unsigned w;

	if (until == 0 || n->lease_term == 0)
		return;
	real_until = (double) until / c->ctx[i].rate;
	for (w = 0; w < c->nwin; w++)
		if (c->win[w].member == i && c->win[w].term == n->lease_term)
			break;
	if (w == c->nwin) {
		ck_assert_uint_lt(c->nwin, 512);
		c->win[w].member = i;
		c->win[w].term = n->lease_term;
		c->win[w].from = (double) now;
		c->win[w].until = 0;
		c->nwin++;
	}
	if (real_until > c->win[w].until)
		c->win[w].until = real_until;
	for (unsigned k = 0; k < c->nwin; k++) {
		if (k == w || c->win[k].from >= c->win[k].until)
			continue;
		ck_assert_msg(!(c->win[w].from < c->win[k].until &&
		                  c->win[k].from < c->win[w].until),
		    "member %u's lease (term %llu, %.0f-%.0f) overlaps member "
		    "%u's (term %llu, %.0f-%.0f)",
		    i, (unsigned long long) c->win[w].term, c->win[w].from,
		    c->win[w].until, c->win[k].member,
		    (unsigned long long) c->win[k].term, c->win[k].from,
		    c->win[k].until);
	}
}

static void
check_step(cluster *c)
{
	uint64_t now = raft_fixture_time(&c->f);
	unsigned granting = 0, who = 0, published = 0;

	ck_assert_uint_ge(now, c->last_step_time);
	c->last_step_time = now;
	for (unsigned i = 0; i < c->n; i++) {
		uint64_t epoch = allot__cnode_epoch(&c->node[i]);

		now = member_clock(&c->ctx[i]);
		ck_assert_msg(epoch >= c->last_epoch[i],
		    "member %u epoch went from %llu to %llu", i,
		    (unsigned long long) c->last_epoch[i],
		    (unsigned long long) epoch);
		c->last_epoch[i] = epoch;
		if (allot__cnode_may_grant(&c->node[i], now)) {
			granting++;
			who = i;
		}
		/* What other threads would grant by: stale values of
		 * members that stepped down, or were killed, included. */
		if (now < allot__cnode_grant_until(&c->node[i]))
			published++;
		check_windows(c, i, raft_fixture_time(&c->f));
	}
	now = raft_fixture_time(&c->f);
	ck_assert_msg(granting <= 1, "%u members may grant at t=%llu",
	    granting, (unsigned long long) now);
	ck_assert_msg(published <= 1, "%u members publish a lease at t=%llu",
	    published, (unsigned long long) now);
	if (granting == 1) {
		uint64_t epoch = allot__cnode_epoch(&c->node[who]);

		ck_assert_uint_eq(epoch, raft_of(c, who)->current_term);
		ck_assert_msg(epoch >= c->client_epoch,
		    "a client saw epoch %llu after %llu",
		    (unsigned long long) epoch,
		    (unsigned long long) c->client_epoch);
		c->client_epoch = epoch;
		if (c->granter != who + 1) {
			c->handovers++;
			c->granter = who + 1;
		}
		c->grant_ms = now;
	}
}

static void
step(cluster *c)
{
	raft_fixture_step(&c->f);
	for (unsigned i = 0; i < c->n; i++)
		if (raft_fixture_alive(&c->f, i))
			allot__cnode_tick(&c->node[i]);
	drive(c, raft_fixture_time(&c->f));
	check_step(c);
}

static void
run_for(cluster *c, unsigned ms)
{
	uint64_t end = raft_fixture_time(&c->f) + ms;

	while (raft_fixture_time(&c->f) < end)
		step(c);
}

/* Steps until some member may grant; fails after `ms`. */
static unsigned
until_granting(cluster *c, unsigned ms)
{
	uint64_t end = raft_fixture_time(&c->f) + ms;

	while (raft_fixture_time(&c->f) < end) {
		step(c);
		for (unsigned i = 0; i < c->n; i++)
			if (grants(c, i))
				return i;
	}
	ck_abort_msg("no member could grant within %u ms", ms);
	return c->n;
}

static void
add_server(cluster *c)
{
	unsigned i = c->n;
	allot__cnode_opts opts = { .lease_ms = c->lease_ms,
		.renew_ms = c->renew_ms,
		.clock = member_clock,
		.clock_ctx = &c->ctx[i] };

	static const int skew[3] = { -1, +1, 0 };

	c->ctx[i] = (member_ctx) { c, i,
		1.0 + ALLOT__CNODE_DRIFT * skew[i % 3] };
	allot__cfsm_init(&c->fsm[i], on_apply, &c->ctx[i]);
	ck_assert_int_eq(raft_fixture_grow(&c->f, &c->fsm[i].fsm), 0);
	/* Small snapshots, so lagging members catch up by InstallSnapshot
	 * and restore runs in every case. */
	raft_set_snapshot_threshold(raft_of(c, i), 32);
	raft_set_snapshot_trailing(raft_of(c, i), 8);
	allot__cnode_init(&c->node[i], raft_of(c, i), &c->fsm[i], &opts);
	c->n++;
}

/* lease_ms 0: the default. A lease longer than the election timeout is
 * allowed (safety rests on the wait, not on election timing) and makes
 * the wait, not the election delay, what keeps two leases apart: the
 * cases that kill and cut leaders run with one. */
static cluster *
cluster_new(unsigned n, uint64_t seed, uint32_t lease_ms)
{
	cluster *c = calloc(1, sizeof *c);
	struct raft_configuration conf;

	ck_assert_ptr_nonnull(c);
	c->rng = seed;
	c->lease_ms = lease_ms;
	ck_assert_int_eq(raft_fixture_initialize(&c->f), 0);
	for (unsigned i = 0; i < n; i++)
		add_server(c);
	ck_assert_int_eq(raft_fixture_configuration(&c->f, n, &conf), 0);
	ck_assert_int_eq(raft_fixture_bootstrap(&c->f, &conf), 0);
	raft_configuration_close(&conf);
	ck_assert_int_eq(raft_fixture_start(&c->f), 0);
	c->driving = true;
	return c;
}

static void
cut(cluster *c, unsigned i, unsigned j)
{
	raft_fixture_disconnect(&c->f, i, j);
	raft_fixture_disconnect(&c->f, j, i);
}

static void
join(cluster *c, unsigned i, unsigned j)
{
	raft_fixture_reconnect(&c->f, i, j);
	raft_fixture_reconnect(&c->f, j, i);
}

static void
heal(cluster *c)
{
	for (unsigned i = 0; i < c->n; i++) {
		if (!raft_fixture_alive(&c->f, i))
			raft_fixture_revive(&c->f, i);
		for (unsigned j = 0; j < c->n; j++)
			if (i != j)
				raft_fixture_reconnect(&c->f, i, j);
	}
}

static bool
in_config(cluster *c, unsigned i)
{
	unsigned l = leader_of(c);
	const struct raft_configuration *conf = &raft_of(c, l)->configuration;

	for (unsigned k = 0; k < conf->n; k++)
		if (conf->servers[k].id == raft_of(c, i)->id)
			return true;
	return false;
}

/* After healing and stopping the driver: every member in the
 * configuration converges to one state, byte for byte, whose usage is
 * exactly the committed batches, every acknowledged one included. */
static void
check_converged(cluster *c)
{
	uint64_t end;
	bool same = false;
	void *ref = NULL, *buf;
	size_t ref_len = 0, len;
	uint64_t consumed[NKEYS] = { 0 }, denied[NKEYS] = { 0 };
	bool committed[MAXB] = { false };
	uint64_t target;
	unsigned l;

	heal(c);
	c->driving = false;
	(void) until_granting(c, 20000);
	l = leader_of(c);
	/* Everything the leader has when the driver stops, applied
	 * everywhere (renewal barriers keep coming after it). */
	target = raft_last_index(raft_of(c, l));
	end = raft_fixture_time(&c->f) + 20000;
	while (!same && raft_fixture_time(&c->f) < end) {
		step(c);
		same = true;
		for (unsigned i = 0; i < c->n; i++)
			if (in_config(c, i) &&
			    (raft_last_applied(raft_of(c, i)) < target ||
			        c->fsm[i].applied != c->fsm[l].applied))
				same = false;
	}
	ck_assert_msg(same, "members did not converge");

	for (unsigned i = 0; i < c->n; i++)
		for (unsigned b = 0; b < c->nbatches; b++)
			if (c->seen[i][b] != 0)
				committed[b] = true;
	for (unsigned b = 0; b < c->nbatches; b++) {
		allot__cusage_row row;
		char key[16];

		if (c->batches[b].acked)
			ck_assert_msg(committed[b],
			    "batch %u acknowledged but not applied", b);
		if (!committed[b])
			continue;
		batch_row(b, &row, key, sizeof key);
		consumed[b % NKEYS] += row.consumed;
		denied[b % NKEYS] += row.denied;
	}
	for (unsigned i = 0; i < c->n; i++) {
		if (!in_config(c, i))
			continue;
		for (unsigned k = 0; k < NKEYS; k++) {
			char key[16];
			const allot__cusage_total *t;

			snprintf(key, sizeof key, "k%u", k);
			t = allot__cfsm_usage(&c->fsm[i], "svc", key);
			ck_assert_uint_eq(
			    t != NULL ? t->consumed : 0, consumed[k]);
			ck_assert_uint_eq(
			    t != NULL ? t->denied : 0, denied[k]);
		}
		ck_assert_int_eq(
		    allot__cfsm_encode(&c->fsm[i], &buf, &len), ALLOT_OK);
		if (ref == NULL) {
			ref = buf;
			ref_len = len;
			continue;
		}
		ck_assert_msg(len == ref_len && memcmp(buf, ref, len) == 0,
		    "member %u's state differs", i);
		raft_free(buf);
	}
	raft_free(ref);
}

static void
cluster_free(cluster *c)
{
	/* Closing calls back the requests still pending, which touch the
	 * nodes: free the states only after. */
	raft_fixture_close(&c->f);
	for (unsigned i = 0; i < c->n; i++)
		allot__cfsm_finish(&c->fsm[i]);
	free(c);
}

START_TEST(fixture_elects_and_commits)
{
	cluster *c = cluster_new(3, 1, 0);
	unsigned g = until_granting(c, 10000);
	uint64_t elected = c->node[g].elected_at;

	/* Not before the wait: lease * (1 + d) after winning. */
	ck_assert_uint_ge(
	    member_clock(&c->ctx[g]), elected + c->node[g].wait_ms);
	ck_assert_uint_eq(
	    allot__cnode_epoch(&c->node[g]), raft_of(c, g)->current_term);
	run_for(c, 5000);
	ck_assert_uint_gt(c->nbatches, 40);
	/* The lease stays renewed while nothing goes wrong. */
	ck_assert_uint_eq(c->handovers, 1);
	ck_assert_uint_eq(c->grant_ms, raft_fixture_time(&c->f));
	check_converged(c);
	cluster_free(c);
}
END_TEST

/* A bridge: members a and b cannot reach each other, the bridge reaches
 * both. Run with each member in the bridge's place, the leader among
 * them or not. */
START_TEST(fixture_bridge_partition)
{
	for (unsigned bridge = 0; bridge < 3; bridge++) {
		cluster *c = cluster_new(3, 7 + bridge, 0);
		unsigned a = (bridge + 1) % 3, b = (bridge + 2) % 3;

		(void) until_granting(c, 10000);
		cut(c, a, b);
		run_for(c, 15000);
		/* Someone still grants through the bridge. */
		ck_assert_uint_ge(
		    c->grant_ms, raft_fixture_time(&c->f) - 3000);
		check_converged(c);
		cluster_free(c);
	}
}
END_TEST

START_TEST(fixture_leader_isolation)
{
	cluster *c = cluster_new(5, 11, 3000);
	unsigned l = until_granting(c, 10000);
	unsigned handovers = c->handovers;

	for (unsigned j = 0; j < c->n; j++)
		if (j != l)
			cut(c, l, j);
	run_for(c, 10000);
	/* The old leader stopped; a new one took over after the wait. */
	ck_assert(!grants(c, l));
	ck_assert_uint_gt(c->handovers, handovers);
	ck_assert_uint_ne(c->granter, l + 1);
	ck_assert_uint_gt(c->client_epoch, c->last_epoch[l]);
	check_converged(c);
	cluster_free(c);
}
END_TEST

START_TEST(fixture_flapping_links)
{
	cluster *c = cluster_new(5, 23, 3000);
	uint64_t end;

	(void) until_granting(c, 10000);
	end = raft_fixture_time(&c->f) + 60000;
	while (raft_fixture_time(&c->f) < end) {
		unsigned i = (unsigned) (rnd(c) % c->n);
		unsigned j = (unsigned) (rnd(c) % c->n);

		if (i != j) {
			if (rnd(c) % 2)
				cut(c, i, j);
			else
				join(c, i, j);
		}
		run_for(c, (unsigned) (50 + rnd(c) % 450));
	}
	check_converged(c);
	cluster_free(c);
}
END_TEST

START_TEST(fixture_kill_revive)
{
	cluster *c = cluster_new(5, 31, 3000);

	for (unsigned round = 0; round < 6; round++) {
		unsigned l = until_granting(c, 15000);
		unsigned other = (l + 1 + round) % c->n;

		raft_fixture_kill(&c->f, l);
		if (round % 2)
			raft_fixture_kill(&c->f, other);
		run_for(c, 3000 + 700 * round);
		/* Revive heals every link of the revived member. */
		raft_fixture_revive(&c->f, l);
		if (round % 2)
			raft_fixture_revive(&c->f, other);
		run_for(c, 2000);
	}
	ck_assert_uint_ge(c->handovers, 6);
	check_converged(c);
	cluster_free(c);
}
END_TEST

static void
transfer_done(struct raft_transfer *req)
{
	(void) req;
}

/* A leadership transfer elects the new leader at once (its RequestVote
 * may disrupt a known leader), so the old leader's last renewal is only
 * moments old: the case where the wait alone keeps the two leases apart.
 * The transfer goes to libraft directly, so the old leader keeps its
 * lease (the node would give it up). */
START_TEST(fixture_transfer_keeps_leases_apart)
{
	/* A long lease makes the drift margins (lease * d = 200 ms) larger
	 * than the transfer takes, so they are what the invariant checks. */
	cluster *c = cluster_new(3, 57, 20000);
	struct raft_transfer req;
	unsigned moved = 0;

	/* Renew often, so the last renewal is as close to the new leader's
	 * win as it gets. */
	for (unsigned i = 0; i < c->n; i++)
		c->node[i].opts.renew_ms = 10;
	for (unsigned k = 0; k < 30; k++) {
		unsigned l = until_granting(c, 40000);
		unsigned to = (l + 1 + k % 2) % c->n;

		run_for(c, (unsigned) (rnd(c) % 800));
		if (leader_of(c) != l)
			continue;
		if (raft_transfer(raft_of(c, l), &req, raft_of(c, to)->id,
		        transfer_done) != 0)
			continue;
		run_for(c, 2000);
		moved += leader_of(c) == to;
	}
	ck_assert_uint_ge(moved, 15);
	ck_assert_uint_ge(c->handovers, 15);
	check_converged(c);
	cluster_free(c);
}
END_TEST

/* Add two members and remove one while a follower is cut off. */
START_TEST(fixture_membership_during_partition)
{
	cluster *c = cluster_new(3, 43, 0);
	unsigned l = until_granting(c, 10000), cutoff = (l + 1) % 3;
	uint64_t end;

	for (unsigned j = 0; j < 3; j++)
		if (j != cutoff)
			cut(c, cutoff, j);
	run_for(c, 3000);
	for (unsigned k = 0; k < 2; k++) {
		unsigned nw;

		add_server(c);
		nw = c->n - 1;
		ck_assert_int_eq(raft_start(raft_of(c, nw)), 0);
		/* The cut-off member cannot reach the newcomer either. */
		cut(c, cutoff, nw);
		l = until_granting(c, 10000);
		ck_assert_int_eq(
		    allot__cnode_add_member(&c->node[l], raft_of(c, nw)->id,
		        raft_of(c, nw)->address),
		    ALLOT_OK);
		end = raft_fixture_time(&c->f) + 20000;
		while (raft_fixture_time(&c->f) < end) {
			const struct raft_configuration *conf;
			bool voter = false;

			step(c);
			l = leader_of(c);
			if (l == c->n)
				continue;
			conf = &raft_of(c, l)->configuration;
			for (unsigned s = 0; s < conf->n; s++)
				if (conf->servers[s].id ==
				        raft_of(c, nw)->id &&
				    conf->servers[s].role == RAFT_VOTER)
					voter = true;
			if (voter && !allot__cnode_changing(&c->node[l]))
				break;
		}
		ck_assert_msg(raft_fixture_time(&c->f) < end,
		    "member %u was not promoted", nw);
		/* It caught up before voting: its state has what the
		 * leader's had when it was promoted. */
		ck_assert_uint_gt(c->fsm[nw].applied, 0);
	}
	/* Remove the cut-off member; the rest go on. */
	l = until_granting(c, 10000);
	ck_assert_int_eq(
	    allot__cnode_remove_member(&c->node[l], raft_of(c, cutoff)->id),
	    ALLOT_OK);
	run_for(c, 3000);
	ck_assert(!in_config(c, cutoff));
	ck_assert_uint_ge(c->fsm[l].members_changed, 5);
	/* Removing the leader itself: one call, and the next leader
	 * finishes it (fixture_leader_leaves has the cases). */
	l = until_granting(c, 10000);
	ck_assert_int_eq(
	    allot__cnode_remove_member(&c->node[l], raft_of(c, l)->id),
	    ALLOT_OK);
	run_for(c, 5000);
	ck_assert_uint_ne(leader_of(c), l);
	ck_assert(!in_config(c, l));
	check_converged(c);
	cluster_free(c);
}
END_TEST

/* How fixture_leader_leaves loses the old leader once its intent to
 * leave is committed, before it can hand over: 1 kills it, 2 cuts it
 * off from every other member (it keeps ticking and trying). */
static int leave_how;
static unsigned leave_victim;

static void
intent_committed(void *ctx, int status, uint64_t index)
{
	cluster *c = ctx;

	(void) index;
	if (status != ALLOT_OK)
		return;
	if (leave_how == 1)
		raft_fixture_kill(&c->f, leave_victim);
	for (unsigned j = 0; leave_how == 2 && j < c->n; j++)
		if (j != leave_victim)
			cut(c, leave_victim, j);
}

/* Steps until a leader other than member v has v out of its committed
 * configuration; returns how long it took (fixture ms). */
static uint64_t
until_removed(cluster *c, unsigned v, unsigned ms)
{
	uint64_t start = raft_fixture_time(&c->f), end = start + ms;

	while (raft_fixture_time(&c->f) < end) {
		unsigned l;

		step(c);
		l = leader_of(c);
		if (l != c->n && l != v &&
		    allot__cnode_leave_state(&c->node[l], raft_of(c, v)->id) ==
		        ALLOT__CLEAVE_GONE)
			return raft_fixture_time(&c->f) - start;
	}
	ck_abort_msg("member %u was not removed within %u ms", v, ms);
	return 0;
}

/* The leader removes itself with one call: its intent goes through the
 * log, it hands over, and the new leader demotes and removes it. Also
 * when the old leader is lost (killed, or cut off) right after the
 * intent commits, before any hand-over: the next leader still removes
 * it. Every step checks the usual invariants (one granting member,
 * epochs only up, no lease overlap), and afterwards every member left
 * has the same state with nobody leaving. */
START_TEST(fixture_leader_leaves)
{
	for (leave_how = 0; leave_how < 3; leave_how++) {
		cluster *c = cluster_new(
		    3, 71 + (uint64_t) leave_how, leave_how ? 3000 : 0);
		unsigned l = until_granting(c, 10000), now;
		uint64_t id = raft_of(c, l)->id, took;

		leave_victim = l;
		if (leave_how == 0) {
			ck_assert_int_eq(
			    allot__cnode_remove_member(&c->node[l], id),
			    ALLOT_OK);
		} else {
			allot__centry e = { .type = ALLOT__CENTRY_MEMBER };

			e.member.event = ALLOT__CMEMBER_LEAVING;
			e.member.id = id;
			e.member.address = raft_of(c, l)->address;
			ck_assert_int_eq(allot__cnode_propose(&c->node[l], &e,
			                     intent_committed, c),
			    ALLOT_OK);
		}
		took = until_removed(c, l, 30000);
		fprintf(stderr,
		    "leader_leaves (case %d): removed after %llu ms\n",
		    leave_how, (unsigned long long) took);
		now = leader_of(c);
		/* A hand-over is immediate; a lost leader costs an
		 * election and the wait for its ack of the demotion. */
		if (leave_how == 0)
			ck_assert_uint_lt(took, 3000);
		ck_assert(!grants(c, l));
		/* The old member heard it was demoted (all it ever hears,
		 * libraft sends nothing to a removed member): what its
		 * own allotctl call waits for. */
		if (leave_how == 0)
			ck_assert_int_eq(
			    allot__cnode_leave_state(&c->node[l], id),
			    ALLOT__CLEAVE_DEMOTED);
		ck_assert_int_eq(allot__cnode_leave_state(&c->node[now], id),
		    ALLOT__CLEAVE_GONE);
		check_converged(c);
		ck_assert_uint_ne(c->granter, l + 1);
		/* Healed and revived, it still neither leads nor returns. */
		run_for(c, 5000);
		ck_assert_uint_ne(leader_of(c), l);
		ck_assert(!in_config(c, l));
		ck_assert(!grants(c, l));
		for (unsigned i = 0; i < c->n; i++)
			if (in_config(c, i))
				ck_assert_uint_eq(c->fsm[i].nleaving, 0);
		cluster_free(c);
	}
}
END_TEST

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

static int
free_port(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t len = sizeof sa;
	int fd = socket(AF_INET, SOCK_STREAM, 0), port;

	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(bind(fd, (struct sockaddr *) &sa, sizeof sa), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *) &sa, &len), 0);
	port = ntohs(sa.sin_port);
	close(fd);
	return port;
}

static uint64_t
mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
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
	uint64_t end = mono_ms() + ms;

	while (mono_ms() < end) {
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
		    free_port());
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
	t0 = mono_ms();
	ck_assert(uv_run_until(m, 3, some_granting, 15000));
	g2 = uv_granting(m, 3);
	ck_assert_int_ne(g2, g);
	ck_assert_uint_ge(mono_ms() - t0, 300);
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

static Suite *
consensus_suite(void)
{
	Suite *s = suite_create("consensus");
	TCase *tc = tcase_create("state");
	TCase *fx = tcase_create("fixture");
	TCase *io = tcase_create("raft_uv");

	tcase_add_test(tc, entry_round_trip);
	tcase_add_test(tc, entry_audit_round_trip);
	tcase_add_test(tc, fsm_replay_and_snapshot);
	tcase_add_test(tc, fsm_config_cas_and_epoch);
	tcase_add_test(tc, fsm_leaving_set);
	suite_add_tcase(s, tc);
	tcase_set_timeout(fx, 120);
	tcase_add_test(fx, fixture_elects_and_commits);
	tcase_add_test(fx, fixture_bridge_partition);
	tcase_add_test(fx, fixture_leader_isolation);
	tcase_add_test(fx, fixture_flapping_links);
	tcase_add_test(fx, fixture_kill_revive);
	tcase_add_test(fx, fixture_transfer_keeps_leases_apart);
	tcase_add_test(fx, fixture_membership_during_partition);
	tcase_add_test(fx, fixture_leader_leaves);
	suite_add_tcase(s, fx);
	tcase_add_test(io, uv_three_members_failover);
	tcase_set_timeout(io, 60);
	suite_add_tcase(s, io);
	return s;
}

ALLOT_TEST_MAIN(consensus_suite)
