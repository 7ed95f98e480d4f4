/* SPDX-License-Identifier: MIT */
/*
 * The agent in a cluster, against scripted members over real nng REP
 * sockets (each answers as a leader of some epoch, or NOT_LEADER), so that
 * every path is taken on cue and in a fixed order: the agent given one
 * seed follows NOT_LEADER to the leader it names and learns every member
 * from the answers; when the leader steps down without naming another,
 * the agent tries the next member it learned and registers again with the
 * new leader (UNKNOWN_SESSION), its allowance running on meanwhile and
 * reported to the new leader as held (KeyReport.foreign); and a
 * Reply from a lower epoch than one already seen (a deposed leader) is
 * dropped unapplied: its allowance is never installed, not even for an
 * instant (sampled every millisecond), and counted. tests/test_cluster.c
 * does the same against real allotd members.
 */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>

#include "allot.pb-c.h"
#include "proc.h"
#include "proto_client.h"
#include "runner.h"

static const char *CFG = "quotas:\n"
                         "  default: {tokens_per_second: 10, burst: 20}\n"
                         "  callers:\n"
                         "    - identity: a\n"
                         "      tokens_per_second: 400\n"
                         "      burst: 800\n";

enum { NOT_LEADER_NAMING, NOT_LEADER_NONE, LEADER };

#define NMEMBERS 3

/* One scripted member. Its role, epoch and the rate it grants caller
 * "a" change on cue (atomics: the test thread sets them). */
typedef struct member {
	nng_socket sock;
	char url[64];
	pthread_t th;
	int id;
	_Atomic bool stop;
	_Atomic int role;
	_Atomic int leader; /* NOT_LEADER_NAMING: index of the one named */
	_Atomic uint64_t epoch;
	_Atomic int rate; /* for caller "a" */
	_Atomic int registers;
	_Atomic int syncs;
	_Atomic int unknown; /* UNKNOWN_SESSION answered */
	_Atomic bool learning; /* Welcomes grant nothing (a new leader) */
	_Atomic int foreign_a; /* reports of "a" saying it runs on 100/s */
	int key_a; /* index of "a" in the last Register */
	uint32_t nkeys;
} member;

static member ms[NMEMBERS];
static char *urls[NMEMBERS];

static void
grant(member *m, Allot__V1__Share *sh, Allot__V1__Share **shp)
{
	for (uint32_t k = 0; k < m->nkeys; k++) {
		allot__v1__share__init(&sh[k]);
		sh[k].key = k;
		sh[k].rate = (int) k == m->key_a ? atomic_load(&m->rate) : 10;
		sh[k].burst = 2 * sh[k].rate;
		shp[k] = &sh[k];
	}
}

static void
answer(member *m, const Allot__V1__Envelope *in, nng_msg **ret)
{
	Allot__V1__Envelope out = ALLOT__V1__ENVELOPE__INIT;
	Allot__V1__Welcome w = ALLOT__V1__WELCOME__INIT;
	Allot__V1__Reply r = ALLOT__V1__REPLY__INIT;
	Allot__V1__Error e = ALLOT__V1__ERROR__INIT;
	Allot__V1__Share sh[16];
	Allot__V1__Share *shp[16];
	out.version = 1;
	int role = atomic_load(&m->role);
	uint64_t session = 100 + (uint64_t) m->id;
	if (role != LEADER) {
		e.code = ALLOT__V1__ERROR__CODE__NOT_LEADER;
		e.message = "not the leader";
		e.leader = role == NOT_LEADER_NAMING ?
		    urls[atomic_load(&m->leader)] :
		    "";
		e.n_members = NMEMBERS;
		e.members = urls;
		out.body_case = ALLOT__V1__ENVELOPE__BODY_ERROR;
		out.error = &e;
	} else if (in->body_case == ALLOT__V1__ENVELOPE__BODY_REGISTER) {
		const Allot__V1__Register *rg = in->register_;
		m->nkeys = rg->n_keys < 16 ? (uint32_t) rg->n_keys : 16;
		m->key_a = -1;
		for (uint32_t k = 0; k < m->nkeys; k++)
			if (strcmp(rg->keys[k], "a") == 0)
				m->key_a = (int) k;
		atomic_fetch_add(&m->registers, 1);
		w.session = session;
		w.replicas = 1;
		w.lease_ms = 3000;
		w.epoch = atomic_load(&m->epoch);
		w.n_members = NMEMBERS;
		w.members = urls;
		if (!atomic_load(&m->learning)) {
			grant(m, sh, shp);
			w.n_shares = m->nkeys;
			w.shares = shp;
		}
		out.body_case = ALLOT__V1__ENVELOPE__BODY_WELCOME;
		out.welcome = &w;
	} else if (in->body_case == ALLOT__V1__ENVELOPE__BODY_SYNC &&
	    in->sync->session != session) {
		atomic_fetch_add(&m->unknown, 1);
		e.code = ALLOT__V1__ERROR__CODE__UNKNOWN_SESSION;
		e.message = "unknown session";
		out.body_case = ALLOT__V1__ENVELOPE__BODY_ERROR;
		out.error = &e;
	} else {
		if (in->body_case == ALLOT__V1__ENVELOPE__BODY_SYNC) {
			const Allot__V1__Sync *sy = in->sync;
			r.seq = sy->seq;
			atomic_fetch_add(&m->syncs, 1);
			for (size_t i = 0; i < sy->n_reports; i++)
				if ((int) sy->reports[i]->key == m->key_a &&
				    sy->reports[i]->foreign &&
				    sy->reports[i]->held_rate == 100)
					atomic_fetch_add(&m->foreign_a, 1);
		}
		r.replicas = 1;
		r.lease_ms = 3000;
		r.full = true;
		r.epoch = atomic_load(&m->epoch);
		r.n_members = NMEMBERS;
		r.members = urls;
		grant(m, sh, shp);
		r.n_shares = m->nkeys;
		r.shares = shp;
		out.body_case = ALLOT__V1__ENVELOPE__BODY_REPLY;
		out.reply = &r;
	}
	size_t n = allot__v1__envelope__get_packed_size(&out);
	*ret = NULL;
	if (nng_msg_alloc(ret, n) == 0)
		allot__v1__envelope__pack(&out, nng_msg_body(*ret));
}

static void *
member_main(void *arg)
{
	member *m = arg;
	for (int i = 0; i < 1000000 && !atomic_load(&m->stop); i++) {
		nng_msg *msg;
		if (nng_recvmsg(m->sock, &msg, 0) != 0)
			continue; /* the receive timeout: look at `stop` */
		Allot__V1__Envelope *in = allot__v1__envelope__unpack(
		    NULL, nng_msg_len(msg), nng_msg_body(msg));
		nng_msg_free(msg);
		if (in == NULL)
			continue;
		nng_msg *out;
		answer(m, in, &out);
		allot__v1__envelope__free_unpacked(in, NULL);
		if (out != NULL && nng_sendmsg(m->sock, out, 0) != 0)
			nng_msg_free(out);
	}
	return NULL;
}

static void
members_start(void)
{
	for (int i = 0; i < NMEMBERS; i++) {
		member *m = &ms[i];
		memset(m, 0, sizeof *m);
		m->id = i + 1;
		snprintf(m->url, sizeof m->url, "tcp://127.0.0.1:%d",
		    pc_free_port());
		urls[i] = m->url;
		ck_assert_int_eq(nng_rep0_open(&m->sock), 0);
		nng_socket_set_ms(m->sock, NNG_OPT_RECVTIMEO, 20);
		ck_assert_int_eq(nng_listen(m->sock, m->url, NULL, 0), 0);
	}
	for (int i = 0; i < NMEMBERS; i++)
		ck_assert_int_eq(
		    pthread_create(&ms[i].th, NULL, member_main, &ms[i]), 0);
}

static void
members_stop(void)
{
	for (int i = 0; i < NMEMBERS; i++)
		atomic_store(&ms[i].stop, true);
	for (int i = 0; i < NMEMBERS; i++) {
		pthread_join(ms[i].th, NULL);
		nng_close(ms[i].sock);
	}
}

static void
lead(int i, uint64_t epoch, int rate)
{
	atomic_store(&ms[i].epoch, epoch);
	atomic_store(&ms[i].rate, rate);
	atomic_store(&ms[i].role, LEADER);
}

static void
follow(int i, int leader)
{
	atomic_store(&ms[i].leader, leader);
	atomic_store(
	    &ms[i].role, leader < 0 ? NOT_LEADER_NONE : NOT_LEADER_NAMING);
}

static pc_log_ids ids = PC_LOG_IDS_INIT;

static allot_agent *
agent_on(const char *seeds)
{
	char err[256];
	allot_config *cfg;
	ck_assert_int_eq(
	    allot_config_parse("t", CFG, strlen(CFG), err, sizeof err, &cfg),
	    ALLOT_OK);
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.coordinator = seeds;
	o.service = "svc";
	o.sync_interval_ms = 50;
	o.reconnect_min_ms = 20;
	o.reconnect_max_ms = 200;
	o.log = pc_log_ids_record;
	o.log_ctx = &ids;
	memset(ids.ids, 0, sizeof ids.ids);
	allot_agent *a;
	ck_assert_int_eq(allot_agent_create(cfg, &o, &a), ALLOT_OK);
	allot_config_free(cfg);
	return a;
}

static double
rate_a(allot_agent *a)
{
	allot_key *k;
	ck_assert_int_eq(allot_key_resolve(a, "a", "/x", &k), ALLOT_OK);
	allot_key_stats st;
	allot_key_stats_get(a, k, &st);
	return st.rate;
}

/* Wait (bounded) until caller "a" runs at `want`; every sample on the
 * way is one of `allowed` (n of them), else the test fails there. */
static void
await_rate(
    allot_agent *a, double want, const double *allowed, int n, int timeout_ms)
{
	uint64_t end = pc_now_ms() + (uint64_t) timeout_ms;
	for (;;) {
		double r = rate_a(a);
		bool ok = false;
		for (int i = 0; i < n; i++)
			ok |= r == allowed[i];
		ck_assert_msg(ok, "caller a runs at %.1f", r);
		if (r == want)
			return;
		ck_assert_msg(pc_now_ms() < end,
		    "caller a still at %.1f, not %.1f", r, want);
		pc_sleep_ms(1);
	}
}

START_TEST(follows_the_leader)
{
	members_start();
	follow(0, 1);
	lead(1, 5, 100);
	follow(2, 1);
	/* One seed, a follower: it names the leader and every member. */
	char seed[96];
	snprintf(seed, sizeof seed, "m1=%s", ms[0].url);
	allot_agent *a = agent_on(seed);
	const double r1[] = { 400, 100 }; /* the static share, then m2's */
	await_rate(a, 100, r1, 2, 5000);
	allot_sync_stats ss;
	allot_sync_stats_get(a, &ss);
	ck_assert_uint_eq(ss.members, 3);
	ck_assert_uint_ge(ss.not_leader, 1);
	ck_assert_uint_eq(ss.leader_switches, 1);
	ck_assert_uint_eq(ss.leader_epoch, 5);
	ck_assert_int_eq(pc_log_ids_count(&ids, "ALLOT-SYNC-LEADER"), 1);
	ck_assert_int_eq(atomic_load(&ms[2].registers), 0);

	/* m2 steps down and names no one (an election); m3 wins. The
	 * agent tries the next member it learned, is unknown there, and
	 * registers again; the allowance runs on meanwhile. */
	atomic_store(&ms[2].learning, true);
	lead(2, 6, 150);
	follow(1, -1);
	follow(0, -1);
	const double r2[] = { 100, 150 };
	await_rate(a, 150, r2, 2, 5000);
	allot_sync_stats_get(a, &ss);
	ck_assert_uint_eq(ss.leader_epoch, 6);
	ck_assert_uint_ge(ss.leader_switches, 2);
	ck_assert_uint_eq(ss.fallback_enters, 0);
	ck_assert_int_ge(atomic_load(&ms[2].registers), 1);
	/* Its first Sync there said what "a" ran on (the old leader's
	 * grant), idle or not: what a new leader learns from. */
	ck_assert_int_ge(atomic_load(&ms[2].foreign_a), 1);
	/* The rate above may come from the Welcome; the keys are confirmed
	 * by the Reply to the first Sync (later under a sanitizer). */
	uint64_t until = pc_now_ms() + 5000;
	while (ss.keys_unconfirmed != 0 && pc_now_ms() < until) {
		pc_sleep_ms(5);
		allot_sync_stats_get(a, &ss);
	}
	ck_assert_uint_eq(ss.keys_unconfirmed, 0);
	/* Then it stays: Syncs go to m3 alone. */
	int s3 = atomic_load(&ms[2].syncs);
	uint64_t sw = ss.leader_switches;
	pc_sleep_ms(300);
	allot_sync_stats_get(a, &ss);
	ck_assert_int_gt(atomic_load(&ms[2].syncs), s3 + 2);
	ck_assert_uint_eq(ss.leader_switches, sw);
	allot_agent_destroy(a);
	members_stop();
}
END_TEST

START_TEST(lower_epoch_dropped)
{
	members_start();
	follow(0, 1);
	lead(1, 8, 120);
	follow(2, 1);
	char seeds[160];
	snprintf(seeds, sizeof seeds, "%s,%s", ms[0].url, ms[1].url);
	allot_agent *a = agent_on(seeds);
	const double r1[] = { 400, 120 };
	await_rate(a, 120, r1, 2, 5000);
	/* m1, deposed at epoch 7 but unaware, answers as a leader with a
	 * larger grant, and m2 (wrongly) points there: the agent goes,
	 * registers, and drops m1's Welcome unapplied. */
	lead(0, 7, 555);
	follow(1, 0);
	uint64_t end = pc_now_ms() + 5000;
	allot_sync_stats ss;
	for (;;) {
		ck_assert_double_eq(rate_a(a), 120);
		allot_sync_stats_get(a, &ss);
		if (ss.stale_epoch >= 3)
			break;
		ck_assert_msg(pc_now_ms() < end, "stale_epoch %llu",
		    (unsigned long long) ss.stale_epoch);
		pc_sleep_ms(1);
	}
	ck_assert_int_ge(atomic_load(&ms[0].registers), 1);
	ck_assert_uint_eq(ss.leader_epoch, 8);
	ck_assert_int_ge(pc_log_ids_count(&ids, "ALLOT-SYNC-STALE-EPOCH"), 1);
	/* m2 leads again: the agent settles there, 555 never installed. */
	lead(1, 8, 130);
	const double r2[] = { 120, 130 };
	await_rate(a, 130, r2, 2, 5000);
	allot_sync_stats_get(a, &ss);
	ck_assert_uint_eq(ss.leader_epoch, 8);
	ck_assert_uint_eq(ss.fallback_enters, 0);
	allot_agent_destroy(a);
	members_stop();
}
END_TEST

static Suite *
follow_suite(void)
{
	Suite *s = suite_create("follow");
	TCase *tc = tcase_create("leader");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, follows_the_leader);
	tcase_add_test(tc, lower_epoch_dropped);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(follow_suite)
