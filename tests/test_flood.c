/* SPDX-License-Identifier: MIT */
/*
 * Flood control of allotd's protocol port (coordinator/dispatch/peerlimit.c):
 * a real allotd on loopback, a client that floods Registers or Syncs from
 * 127.0.0.1 as fast as it can for about a second (bounded in messages
 * and time), and a well-behaved replica dialing from 127.0.0.2, a
 * different peer, that must keep getting Welcome and Reply throughout.
 * The flooder must be answered RATE_LIMITED after its burst, at about
 * the configured rate, and /metrics must count exactly the RATE_LIMITED
 * answers it received under reasons peer_register_rate and
 * peer_message_rate. --max-keys bounds the keys one Register interns.
 * A unit part drives the peer table directly: its
 * bound, eviction of refilled peers and the shared overflow peer.
 */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include <allot/allot.h>

#include "allotd.h"
#include "dispatch/peerlimit.h"
#include "proc.h"
#include "proto_client.h"
#include "runner.h"

#define SVC "checkout"
#define FLOOD_MS 1000u /* how long a flood lasts at most */
#define FLOOD_MAX 200000u /* and how many messages at most */

static const char cfg_text[] = "quotas:\n"
                               "  default:\n"
                               "    tokens_per_second: 10\n"
                               "    burst: 20\n"
                               "  callers:\n"
                               "    - identity: \"spiffe://test/a\"\n"
                               "      tokens_per_second: 400\n"
                               "      burst: 800\n";

static const char *const keys[] = { "default", "spiffe://test/a" };
#define NKEYS 2

/* ------------------------------------------------------------------ */
/* the daemon under test                                               */
/* ------------------------------------------------------------------ */

typedef pc_coord coord;

/* Start allotd with `extra` (NULL-terminated) on free loopback ports and
 * wait (bounded) for /healthz. */
static void
coord_start(coord *c, const char *const *extra)
{
	pc_coord_init(c, "/tmp/allot-flood", cfg_text);
	const char *const args[] = { "--interval-ms", "100",
		"--expiry-intervals", "50", "--log-level", "info", NULL };
	pc_coord_spawn(c, args, extra);
}

static void
coord_done(coord *c)
{
	pc_coord_done(c, 0);
}

static double
rejected(const coord *c, const char *reason)
{
	char series[128];
	snprintf(series, sizeof series,
	    "allotd_rejected_messages_total{reason=\"%s\"}", reason);
	return pc_metric_get(c->http, series);
}

/* ------------------------------------------------------------------ */
/* a well-behaved replica on another address, in its own thread        */
/* ------------------------------------------------------------------ */

typedef struct good {
	const coord *c;
	pc_replica r;
	_Atomic bool stop;
	unsigned ok; /* Replies received */
	unsigned failed; /* anything else */
	int last_fail;
} good;

static void *
good_main(void *arg)
{
	good *g = arg;
	pc_report rep = { .key = 1, .consumed = 1, .held = 10, .demand = 5 };
	while (!atomic_load(&g->stop)) {
		int rc = pc_replica_sync(&g->r, &rep, 1, NULL);
		if (rc == 0) {
			g->ok++;
		} else {
			g->failed++;
			g->last_fail = rc;
		}
		pc_sleep_ms(10);
	}
	return NULL;
}

static void
good_start(good *g, const coord *c, pthread_t *th)
{
	memset(g, 0, sizeof *g);
	g->c = c;
	int rv = pc_open_from(&g->r.c, c->url, "127.0.0.2");
	ck_assert_msg(
	    rv == 0, "cannot dial from 127.0.0.2: %s", nng_strerror(rv));
	int rc = pc_replica_join(&g->r, c->url, "good-1", SVC, keys, NKEYS);
	ck_assert_msg(rc == 0, "the good replica could not register: %d", rc);
	ck_assert_int_eq(pthread_create(th, NULL, good_main, g), 0);
}

/* ------------------------------------------------------------------ */
/* the flooder                                                         */
/* ------------------------------------------------------------------ */

typedef struct flood {
	unsigned sent;
	unsigned welcome; /* or Reply, for a Sync flood */
	unsigned rl_register; /* RATE_LIMITED, Register budget */
	unsigned rl_message; /* RATE_LIMITED, message budget */
	unsigned other; /* any other answer */
	unsigned before_first_rl; /* admitted before the first refusal */
	double elapsed_s;
} flood;

static void
tally(flood *f, Allot__V1__Envelope *e, Allot__V1__Envelope__BodyCase ok)
{
	ck_assert_msg(e != NULL, "no answer to message %u", f->sent);
	if (e->body_case == ok) {
		f->welcome++;
	} else if (pc_error_code(e) == ALLOT__V1__ERROR__CODE__RATE_LIMITED) {
		const char *m = e->error->message;
		ck_assert_ptr_nonnull(m);
		ck_assert_msg(strstr(m, "peer 127.0.0.1") != NULL,
		    "the refusal does not name the peer: %s", m);
		if (f->rl_register + f->rl_message == 0)
			f->before_first_rl = f->welcome;
		if (strstr(m, "Register budget") != NULL)
			f->rl_register++;
		else if (strstr(m, "message budget") != NULL)
			f->rl_message++;
		else
			ck_abort_msg("RATE_LIMITED for another reason: %s", m);
	} else {
		f->other++;
	}
	pc_free(e);
}

/* ------------------------------------------------------------------ */
/* tests                                                               */
/* ------------------------------------------------------------------ */

/* Registers as fast as one connection gets them answered: the first
 * burst (50) is welcomed, then about 20 per second; every refusal is a
 * RATE_LIMITED naming the peer and is counted in /metrics; the replica
 * on 127.0.0.2 keeps syncing and can still register. */
START_TEST(test_register_flood)
{
	coord c;
	const char *extra[] = { "--peer-register-rate", "20:50",
		"--peer-message-rate", "100000:100000", NULL };
	coord_start(&c, extra);
	good g;
	pthread_t th;
	good_start(&g, &c, &th);

	pc_conn fc;
	ck_assert_int_eq(pc_open(&fc, c.url, 5000), 0);
	flood f = { 0 };
	uint64_t t0 = pc_now_ms();
	while (f.sent < FLOOD_MAX && pc_now_ms() - t0 < FLOOD_MS) {
		char id[32];
		snprintf(id, sizeof id, "flood-%u", f.sent % 64);
		Allot__V1__Envelope *e = pc_register(
		    &fc, id, SVC, keys, NKEYS, 100);
		f.sent++;
		tally(&f, e, ALLOT__V1__ENVELOPE__BODY_WELCOME);
	}
	f.elapsed_s = (double) (pc_now_ms() - t0) / 1e3;

	/* Meanwhile another peer may still register. */
	pc_replica late;
	memset(&late, 0, sizeof late);
	ck_assert_int_eq(pc_open_from(&late.c, c.url, "127.0.0.2"), 0);
	ck_assert_int_eq(
	    pc_replica_join(&late, c.url, "good-2", SVC, keys, NKEYS), 0);
	pc_replica_close(&late);

	atomic_store(&g.stop, true);
	pthread_join(th, NULL);
	fprintf(stderr,
	    "register flood: %u sent in %.2f s, %u welcomed (%u before "
	    "the first refusal), %u RATE_LIMITED; good peer %u ok, %u "
	    "failed\n",
	    f.sent, f.elapsed_s, f.welcome, f.before_first_rl, f.rl_register,
	    g.ok, g.failed);

	ck_assert_msg(f.sent > 200,
	    "only %u Registers in %.2f s: too slow a flood to test", f.sent,
	    f.elapsed_s);
	ck_assert_uint_eq(f.other, 0);
	ck_assert_uint_eq(f.rl_message, 0);
	ck_assert_uint_gt(f.rl_register, 0);
	ck_assert_uint_eq(f.welcome + f.rl_register, f.sent);
	/* The burst, then the rate. */
	ck_assert_uint_ge(f.before_first_rl, 50);
	double most = 50 + 20 * (f.elapsed_s + 0.2) + 1;
	ck_assert_msg(f.welcome <= most, "%u welcomed in %.2f s, at most %.0f",
	    f.welcome, f.elapsed_s, most);
	ck_assert_double_eq(
	    rejected(&c, "peer_register_rate"), (double) f.rl_register);
	ck_assert_double_eq(rejected(&c, "peer_message_rate"), 0);
	/* The other peer was served throughout. */
	ck_assert_msg(g.failed == 0, "the good peer failed %u times (last %d)",
	    g.failed, g.last_fail);
	ck_assert_uint_ge(g.ok, 20);
	/* Both addresses are in the table (updated once a second). */
	uint64_t end = pc_now_ms() + 3000;
	double tracked;
	while ((tracked = pc_metric_get(c.http, "allotd_peers_tracked")) < 2 &&
	    pc_now_ms() < end)
		pc_sleep_ms(50);
	ck_assert_double_eq(tracked, 2);
	ck_assert_double_eq(
	    pc_metric_get(c.http, "allotd_peer_overflow_total"), 0);

	pc_close(&fc);
	pc_replica_close(&g.r);
	coord_done(&c);
}
END_TEST

/* Syncs as fast as possible from one peer with a tight message budget:
 * the burst then the rate get Replies, the rest RATE_LIMITED (counted);
 * the other peer keeps syncing. Refused Syncs consume no sequence number
 * on the coordinator, so the flooder's next admitted Sync (a gap) is
 * still answered. */
START_TEST(test_message_flood)
{
	coord c;
	const char *extra[] = { "--peer-message-rate", "200:100", NULL };
	coord_start(&c, extra);
	good g;
	pthread_t th;
	good_start(&g, &c, &th);

	pc_replica fr;
	memset(&fr, 0, sizeof fr);
	ck_assert_int_eq(
	    pc_replica_join(&fr, c.url, "flooder", SVC, keys, NKEYS), 0);
	flood f = { 0 };
	pc_report rep = { .key = 1, .consumed = 1, .held = 10, .demand = 5 };
	uint64_t t0 = pc_now_ms();
	while (f.sent < FLOOD_MAX && pc_now_ms() - t0 < FLOOD_MS) {
		Allot__V1__Envelope *e = pc_sync(
		    &fr.c, fr.session, ++fr.seq, 100, &rep, 1);
		f.sent++;
		tally(&f, e, ALLOT__V1__ENVELOPE__BODY_REPLY);
	}
	f.elapsed_s = (double) (pc_now_ms() - t0) / 1e3;
	atomic_store(&g.stop, true);
	pthread_join(th, NULL);
	fprintf(stderr,
	    "message flood: %u sent in %.2f s, %u replies (%u before the "
	    "first refusal), %u RATE_LIMITED; good peer %u ok, %u failed\n",
	    f.sent, f.elapsed_s, f.welcome, f.before_first_rl, f.rl_message,
	    g.ok, g.failed);

	/* The flood must outrun the budget (a burst of 100, then 200/s) at
	 * least twice over for the rest to mean anything; how much more
	 * depends on the build (a sanitizer one is several times slower). */
	double budget = 100 + 200 * f.elapsed_s;
	ck_assert_msg(f.sent > 2 * budget,
	    "only %u Syncs in %.2f s against a budget of %.0f", f.sent,
	    f.elapsed_s, budget);
	ck_assert_uint_eq(f.other, 0);
	ck_assert_uint_eq(f.rl_register, 0);
	ck_assert_uint_gt(f.rl_message, 0);
	/* The Register used one token of the burst of 100. */
	ck_assert_uint_ge(f.before_first_rl, 99);
	double most = 100 + 200 * (f.elapsed_s + 0.2) + 1;
	ck_assert_msg(f.welcome <= most, "%u replies in %.2f s, at most %.0f",
	    f.welcome, f.elapsed_s, most);
	ck_assert_double_eq(
	    rejected(&c, "peer_message_rate"), (double) f.rl_message);
	ck_assert_double_eq(rejected(&c, "peer_register_rate"), 0);
	ck_assert_msg(g.failed == 0, "the good peer failed %u times (last %d)",
	    g.failed, g.last_fail);
	ck_assert_uint_ge(g.ok, 20);

	pc_replica_close(&fr);
	pc_replica_close(&g.r);
	coord_done(&c);
}
END_TEST

/* 0 disables a budget: 300 Registers in a row are all welcomed. Bad
 * values are refused at start with exit status 2. */
START_TEST(test_disabled_and_cli)
{
	coord c;
	const char *extra[] = { "--peer-register-rate", "0", NULL };
	coord_start(&c, extra);
	pc_conn fc;
	ck_assert_int_eq(pc_open(&fc, c.url, 5000), 0);
	for (unsigned i = 0; i < 300; i++) {
		Allot__V1__Envelope *e = pc_register(
		    &fc, "again", SVC, keys, NKEYS, 100);
		ck_assert_ptr_nonnull(e);
		ck_assert_msg(
		    e->body_case == ALLOT__V1__ENVELOPE__BODY_WELCOME,
		    "Register %u refused: %d", i, pc_error_code(e));
		pc_free(e);
	}
	pc_close(&fc);
	ck_assert_double_eq(rejected(&c, "peer_register_rate"), 0);
	coord_done(&c);

	const char *bad[] = { "abc", "10:0", "-1", "5:x", "1e12" };
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char *argv[] = { (char *) pc_allotd_path(), "--config",
			"/nonexistent", "--db", "/nonexistent",
			"--peer-message-rate", (char *) bad[i], NULL };
		pid_t pid = pc_spawn(argv, "/dev/null");
		ck_assert_int_gt(pid, 0);
		ck_assert_msg(pc_wait_exit(pid, 5000) == 2,
		    "--peer-message-rate %s was accepted", bad[i]);
	}
}
END_TEST

/* --max-keys bounds what one Register may intern: 2 keys pass, 3 are
 * answered TOO_LARGE and counted. */
START_TEST(test_max_keys)
{
	coord c;
	const char *extra[] = { "--max-keys", "2", NULL };
	coord_start(&c, extra);
	pc_conn pc;
	ck_assert_int_eq(pc_open(&pc, c.url, 5000), 0);
	Allot__V1__Envelope *e = pc_register(&pc, "two", SVC, keys, 2, 100);
	ck_assert_ptr_nonnull(e);
	ck_assert_int_eq(e->body_case, ALLOT__V1__ENVELOPE__BODY_WELCOME);
	pc_free(e);
	const char *three[] = { "default", "spiffe://test/a", "x" };
	e = pc_register(&pc, "three", SVC, three, 3, 100);
	ck_assert_ptr_nonnull(e);
	ck_assert_int_eq(pc_error_code(e), ALLOT__V1__ERROR__CODE__TOO_LARGE);
	ck_assert_ptr_nonnull(strstr(e->error->message, "at most 2"));
	pc_free(e);
	pc_close(&pc);
	ck_assert_double_eq(rejected(&c, "too_large"), 1);
	coord_done(&c);
}
END_TEST

/* ---- the table itself ---- */

static allot__peer
peer4(unsigned i)
{
	allot__peer p;
	memset(&p, 0, sizeof p);
	p.family = 4;
	p.addr[0] = 10;
	p.addr[1] = (uint8_t) (i >> 16);
	p.addr[2] = (uint8_t) (i >> 8);
	p.addr[3] = (uint8_t) i;
	return p;
}

/* A registered connection's budget: its address's budget spent by
 * others does not touch it; it shares one, the same size, with the
 * connections of its address registered as the same service, and not
 * with those of another service; the address binds at most
 * conns_per_peer connections, and a closed one frees its place. */
START_TEST(test_table_connections)
{
	allot__peerlimit_opts o;
	allot__peerlimit_opts_init(&o);
	o.message_rate = 10;
	o.message_burst = 2;
	o.capacity = 128; /* 8 a shard */
	o.conns_per_peer = 2;
	bool oom;
	allot__peerlimit *pl = allot__peerlimit_create(&o, &oom);
	ck_assert_ptr_nonnull(pl);
	uint64_t now = 1000000000ull;
	char err[256];
	allot__peer a = peer4(1);
	/* Connection 7 registers; connection 8 floods from the same
	 * address and spends the address's budget. */
	ck_assert(allot__peerlimit_bind(pl, 7, &a, 1, now));
	ck_assert(allot__peerlimit_bind(pl, 7, &a, 1, now)); /* again: no-op */
	for (int i = 0; i < 2; i++)
		ck_assert(allot__peerlimit_admit(
		    pl, 8, &a, ALLOT__PEER_MESSAGE, now, err, sizeof err));
	ck_assert(!allot__peerlimit_admit(
	    pl, 8, &a, ALLOT__PEER_MESSAGE, now, err, sizeof err));
	ck_assert_ptr_nonnull(strstr(err, "10.0.0.1"));
	/* Connection 7 still has its own burst of 2, then is limited
	 * itself, and says which connection. */
	for (int i = 0; i < 2; i++)
		ck_assert(allot__peerlimit_admit(
		    pl, 7, &a, ALLOT__PEER_MESSAGE, now, err, sizeof err));
	ck_assert(!allot__peerlimit_admit(
	    pl, 7, &a, ALLOT__PEER_MESSAGE, now, err, sizeof err));
	ck_assert_ptr_nonnull(strstr(err, "connection 7"));
	/* Registers stay on the address. */
	ck_assert(allot__peerlimit_admit(
	    pl, 7, &a, ALLOT__PEER_REGISTER, now, err, sizeof err));
	/* Connection 9 registers as the same service from the same
	 * address: it shares 7's budget, already spent (connections never
	 * multiply a budget). */
	ck_assert(allot__peerlimit_bind(pl, 9, &a, 1, now));
	ck_assert(!allot__peerlimit_admit(
	    pl, 9, &a, ALLOT__PEER_MESSAGE, now, err, sizeof err));
	ck_assert_ptr_nonnull(strstr(err, "connection 9"));
	/* At most two bound connections per address. */
	ck_assert(!allot__peerlimit_bind(pl, 10, &a, 1, now));
	allot__peerlimit_stats st;
	allot__peerlimit_stats_get(pl, &st);
	ck_assert_uint_eq(st.bound, 2);
	ck_assert_uint_eq(st.bind_refused, 1);
	/* Another service registered from the address has a budget of its
	 * own. */
	allot__peerlimit_unbind(pl, 9);
	ck_assert(allot__peerlimit_bind(pl, 11, &a, 2, now));
	for (int i = 0; i < 2; i++)
		ck_assert(allot__peerlimit_admit(
		    pl, 11, &a, ALLOT__PEER_MESSAGE, now, err, sizeof err));
	ck_assert(!allot__peerlimit_admit(
	    pl, 11, &a, ALLOT__PEER_MESSAGE, now, err, sizeof err));
	/* Bound connections survive a flood of new peers. */
	now += 1000000000ull;
	for (unsigned i = 100; i < 2100; i++) {
		allot__peer p = peer4(i);
		allot__peerlimit_take(pl, &p, ALLOT__PEER_MESSAGE, now, NULL);
	}
	allot__peerlimit_stats_get(pl, &st);
	ck_assert_uint_eq(st.bound, 2);
	/* Connection 7 closes: 10 may bind now (once the flood's peers have
	 * refilled and can be forgotten). */
	now += 1000000000ull;
	allot__peerlimit_unbind(pl, 7);
	allot__peerlimit_unbind(pl, 7);
	ck_assert(allot__peerlimit_bind(pl, 10, &a, 1, now));
	/* 10 starts its group afresh: 7's was forgotten with it. */
	ck_assert(allot__peerlimit_admit(
	    pl, 10, &a, ALLOT__PEER_MESSAGE, now, err, sizeof err));
	allot__peerlimit_stats_get(pl, &st);
	ck_assert_uint_eq(st.bound, 2);
	allot__peerlimit_destroy(pl);
}
END_TEST

START_TEST(test_table_bound)
{
	allot__peerlimit_opts o;
	allot__peerlimit_opts_init(&o);
	o.register_rate = 0; /* off */
	o.message_rate = 10;
	o.message_burst = 2;
	o.capacity = 16;
	bool oom;
	allot__peerlimit *pl = allot__peerlimit_create(&o, &oom);
	ck_assert_ptr_nonnull(pl);
	uint64_t now = 1000000000ull;
	allot__peerlimit_stats st;

	/* Registers are not limited; each peer has its own burst of 2. */
	allot__peer a = peer4(1);
	for (int i = 0; i < 100; i++)
		ck_assert(allot__peerlimit_take(
		    pl, &a, ALLOT__PEER_REGISTER, now, NULL));
	uint64_t wait = 0;
	ck_assert(
	    allot__peerlimit_take(pl, &a, ALLOT__PEER_MESSAGE, now, NULL));
	ck_assert(
	    allot__peerlimit_take(pl, &a, ALLOT__PEER_MESSAGE, now, NULL));
	ck_assert(
	    !allot__peerlimit_take(pl, &a, ALLOT__PEER_MESSAGE, now, &wait));
	ck_assert_uint_eq(wait, 100000000ull); /* 1/10 s */
	allot__peer b = peer4(2);
	ck_assert(
	    allot__peerlimit_take(pl, &b, ALLOT__PEER_MESSAGE, now, NULL));

	/* Thousands of peers, each using its burst: the table never holds
	 * more than its capacity, and peers beyond it share the overflow
	 * peer, which is soon empty. */
	unsigned refused = 0;
	for (unsigned i = 100; i < 5100; i++) {
		allot__peer p = peer4(i);
		for (int k = 0; k < 2; k++)
			if (!allot__peerlimit_take(
			        pl, &p, ALLOT__PEER_MESSAGE, now, NULL))
				refused++;
	}
	allot__peerlimit_stats_get(pl, &st);
	ck_assert_uint_le(st.peers, st.capacity);
	ck_assert_uint_ge(st.capacity, 16);
	ck_assert_uint_le(st.capacity, 16 + 15);
	ck_assert_uint_gt(st.overflow, 0);
	ck_assert_uint_gt(refused, 9000);
	/* Peer a, tracked and still in debt, was not forgotten: it is
	 * still refused. */
	ck_assert(
	    !allot__peerlimit_take(pl, &a, ALLOT__PEER_MESSAGE, now, NULL));

	/* A second later every bucket has refilled: a newcomer evicts a
	 * refilled peer instead of sharing the overflow peer. */
	now += 1000000000ull;
	uint64_t ov = st.overflow;
	allot__peer p = peer4(9000);
	ck_assert(
	    allot__peerlimit_take(pl, &p, ALLOT__PEER_MESSAGE, now, NULL));
	allot__peerlimit_stats_get(pl, &st);
	ck_assert_uint_eq(st.overflow, ov);
	ck_assert_uint_gt(st.evictions, 0);
	ck_assert_uint_le(st.peers, st.capacity);
	allot__peerlimit_destroy(pl);

	/* Both budgets off: no table at all. */
	o.message_rate = 0;
	ck_assert_ptr_null(allot__peerlimit_create(&o, &oom));
	ck_assert(!oom);
	ck_assert(
	    allot__peerlimit_take(NULL, &a, ALLOT__PEER_MESSAGE, now, NULL));

	double r, bu;
	char err[256];
	ck_assert_int_eq(
	    allot__peerlimit_parse("20:50", &r, &bu, err, sizeof err), 0);
	ck_assert_double_eq(r, 20);
	ck_assert_double_eq(bu, 50);
	ck_assert_int_eq(
	    allot__peerlimit_parse("30", &r, &bu, err, sizeof err), 0);
	ck_assert_double_eq(bu, 60);
	ck_assert_int_eq(
	    allot__peerlimit_parse("0", &r, &bu, err, sizeof err), 0);
	ck_assert_double_eq(r, 0);
	ck_assert_int_eq(
	    allot__peerlimit_parse("7:", &r, &bu, err, sizeof err), -1);
}
END_TEST

/* A real agent whose host is over its message budget: it is answered
 * RATE_LIMITED, backs off, and carries on syncing at about the budget,
 * never taking the answer for a lost coordinator (no fallback, still
 * connected). */
START_TEST(test_agent_backs_off)
{
	coord c;
	const char *extra[] = { "--peer-message-rate", "5:5", NULL };
	coord_start(&c, extra);
	char err[256];
	allot_config *cfg;
	ck_assert_int_eq(
	    allot_config_load(c.cfg, err, sizeof err, &cfg), ALLOT_OK);
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.coordinator = c.url;
	o.service = SVC;
	o.replica_id = "backs-off";
	o.sync_interval_ms = 50; /* 20 messages/s against a budget of 5 */
	o.reconnect_min_ms = 100;
	o.reconnect_max_ms = 400;
	allot_agent *a;
	ck_assert_int_eq(allot_agent_create(cfg, &o, &a), ALLOT_OK);
	allot_config_free(cfg);
	allot_sync_stats ss;
	uint64_t t0 = pc_now_ms();
	bool was_connected = false;
	while (pc_now_ms() - t0 < 4000) {
		allot_sync_stats_get(a, &ss);
		ck_assert_msg(!ss.in_fallback, "the agent fell back");
		if (was_connected)
			ck_assert_msg(ss.connected,
			    "a RATE_LIMITED answer was taken for a lost "
			    "coordinator");
		was_connected |= ss.connected;
		pc_sleep_ms(20);
	}
	allot_sync_stats_get(a, &ss);
	fprintf(stderr,
	    "agent over its budget: %llu syncs answered, %llu throttled, "
	    "%llu failed in 4 s\n",
	    (unsigned long long) ss.syncs_ok,
	    (unsigned long long) ss.throttled,
	    (unsigned long long) ss.syncs_failed);
	ck_assert_uint_gt(ss.throttled, 0);
	ck_assert_uint_ge(ss.syncs_ok, 8);
	ck_assert_uint_eq(ss.syncs_failed, 0);
	/* It backed off: without backing off it sends 20/s, 80 in 4 s
	 * (measured with the back-off: about 47, of which 23 answered). */
	ck_assert_uint_le(ss.syncs_ok + ss.throttled, 64);
	/* allotd counts a refusal when it answers; the agent when the answer
	 * arrives: one exchange may be in flight between the two readings. */
	double counted = rejected(&c, "peer_message_rate");
	ck_assert_msg(counted >= (double) ss.throttled &&
	        counted <= (double) ss.throttled + 1,
	    "allotd counted %.0f refusals, the agent %llu", counted,
	    (unsigned long long) ss.throttled);
	allot_agent_destroy(a);
	coord_done(&c);
}
END_TEST

static Suite *
flood_suite(void)
{
	Suite *s = suite_create("flood");
	TCase *tc = tcase_create("allotd");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_register_flood);
	tcase_add_test(tc, test_message_flood);
	tcase_add_test(tc, test_disabled_and_cli);
	tcase_add_test(tc, test_max_keys);
	tcase_add_test(tc, test_agent_backs_off);
	suite_add_tcase(s, tc);
	TCase *unit = tcase_create("table");
	tcase_add_test(unit, test_table_bound);
	tcase_add_test(unit, test_table_connections);
	suite_add_tcase(s, unit);
	return s;
}

ALLOT_TEST_MAIN(flood_suite)
