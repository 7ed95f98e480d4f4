/* SPDX-License-Identifier: MIT */
/*
 * The consensus suite's first part: the log entries' bytes
 * (consensus_entry.c, consensus_rows.c) and the replicated state machine
 * (consensus_fsm.c) alone: round trips, truncations, replay and the
 * canonical snapshot.
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
	allot__row_usage rows[2] = {
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
	allot__row_event ev[2] = {
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
	allot__row_join joins[2] = {
		{ 7, 1700000000100, 0xabcdef0123456789ull, 4242, "r-1", "svc",
		    "host-a", "1.2.3" },
		{ 8, 1700000000200, 1, 1, "r-2", "svc", NULL, "" },
	};
	allot__row_share shares[3] = {
		{ 7, 150.25, 30.5, 1700000003000, 1700000000300, "svc", "k1" },
		{ 8, 0, 0, 1700000003000, 1700000000300, "svc", "k1" },
		{ 8, 1e-9, 2, -1, 1700000000301, "svc", "k2" },
	};
	allot__row_left lefts[1] = { { 7, 1700000000400, "replaced" } };
	allot__row_seen seen[2] = { { 8, 1700000000500 }, { 9, 1 } };
	allot__row_level levels[1] = { { 12.5, 1700000000600, "svc", "k1" } };
	allot__row_shadow shadow[1] = { { 1700000000, 40, 7, 90.5, "svc",
	    "k2" } };
	allot__centry in = { .type = ALLOT__CENTRY_AUDIT }, out;
	void *buf;
	size_t len;

	in.audit = (allot__row_audit) { joins, 2, shares, 3, lefts, 1, seen, 2,
		levels, 1, shadow, 1 };
	encode(&in, &buf, &len);
	ck_assert_uint_eq(len % 8, 0);
	ck_assert_int_eq(allot__centry_decode(buf, len, &out), ALLOT_OK);
	ck_assert_int_eq(out.type, ALLOT__CENTRY_AUDIT);
	const allot__row_audit *a = &out.audit;
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
	in.audit = (allot__row_audit) { 0 };
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
    allot__row_usage *row)
{
	allot__centry e = { .type = ALLOT__CENTRY_USAGE };

	*row = (allot__row_usage) { "svc", key, second, consumed, denied,
		(double) (consumed + denied), 1 };
	e.usage.rows = row;
	e.usage.n = 1;
	return e;
}

allot__centry
consensus_config_entry(const char *text, uint64_t epoch)
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
	allot__row_usage row;
	char key[16];

	for (uint64_t i = from; i <= to; i++) {
		allot__centry e;

		snprintf(key, sizeof key, "k%u", (unsigned) (i % 9));
		if (i % 17 == 1)
			e = epoch1(i / 17 + 1, i % 3 + 1);
		else if (i % 13 == 0)
			e = consensus_config_entry(
			    i % 2 ? "quota a" : "quota bb", i / 13);
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
	e = consensus_config_entry("first", 1);
	apply(&s, 1, &e);
	/* Two pushes against config epoch 1: the first committed wins. */
	e = consensus_config_entry("second", 2);
	apply(&s, 2, &e);
	e = consensus_config_entry("racing", 2);
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

/* A large flush goes as several AUDIT entries: the parts hold every
 * row once, in the order they are applied, none over the bound. */
START_TEST(audit_cut_in_order)
{
	allot__row_join joins[3] = { { .session = 1 }, { .session = 2 },
		{ .session = 3 } };
	allot__row_share shares[4] = { { .session = 1 }, { .session = 2 },
		{ .session = 3 }, { .session = 4 } };
	allot__row_left lefts[2] = { { .session = 1 }, { .session = 2 } };
	allot__row_seen seen[1] = { { .session = 5 } };
	allot__row_level levels[1] = { { .level = 1 } };
	allot__row_audit all = { joins, 3, shares, 4, lefts, 2, seen, 1, levels,
		1, NULL, 0 };
	allot__row_audit part;
	size_t sizes[8], n = 0, total = 0;
	uint64_t order[16];
	size_t no = 0;

	while (allot__caudit_cut(&all, 4, &part)) {
		ck_assert_uint_lt(n, 8);
		sizes[n] = part.njoins + part.nshares + part.nlefts +
		    part.nseen + part.nlevels + part.nshadow;
		ck_assert_uint_le(sizes[n], 4);
		total += sizes[n++];
		/* Joins, then shares, then leaves, within and across
		 * parts. */
		for (size_t i = 0; i < part.njoins; i++)
			order[no++] = 100 + part.joins[i].session;
		for (size_t i = 0; i < part.nshares; i++)
			order[no++] = 200 + part.shares[i].session;
		for (size_t i = 0; i < part.nlefts; i++)
			order[no++] = 300 + part.lefts[i].session;
	}
	ck_assert_uint_eq(total, 11);
	ck_assert_uint_eq(n, 3);
	ck_assert_uint_eq(sizes[0], 4);
	ck_assert_uint_eq(sizes[2], 3);
	const uint64_t want[] = { 101, 102, 103, 201, 202, 203, 204, 301,
		302 };
	ck_assert_uint_eq(no, 9);
	for (size_t i = 0; i < no; i++)
		ck_assert_uint_eq(order[i], want[i]);
	/* Nothing left: nothing more to cut. */
	ck_assert(!allot__caudit_cut(&all, 4, &part));
}
END_TEST

TCase *
consensus_state_cases(void)
{
	TCase *tc = tcase_create("state");

	tcase_add_test(tc, entry_round_trip);
	tcase_add_test(tc, entry_audit_round_trip);
	tcase_add_test(tc, audit_cut_in_order);
	tcase_add_test(tc, fsm_replay_and_snapshot);
	tcase_add_test(tc, fsm_config_cas_and_epoch);
	tcase_add_test(tc, fsm_leaving_set);
	return tc;
}
