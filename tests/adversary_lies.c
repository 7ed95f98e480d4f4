/* SPDX-License-Identifier: MIT */
/*
 * The adversary suite's attacks by valid messages that lie
 * (tests/test_adversary.c has the suite): no accepted config makes a
 * Register fail, whatever its names; 49 fake replicas registered in one
 * burst, from the honest replica's address or another, leave it its
 * share; the replica budget per peer refuses and counts the rest and
 * frees a place on Leave; a Register carrying a live replica's id from
 * another connection is refused; fakes fill a service's budget, not the
 * replica or service tables; a replica reporting more consumption than it
 * could have admitted does not take the honest one's share; and Probes
 * claiming to be a member change nothing and write nothing.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <allot/allot.h>

#include "adversary_fixture.h"
#include "arena.h"
#include "proc.h"
#include "proto_client.h"
#include "state/state.h"

/* ---- names: no accepted config makes a Register fail ---- */

/* A random name: printable ASCII, UTF-8 sequences, control characters
 * and YAML's own escapes, written as a double-quoted YAML scalar (`yaml`)
 * and as the bytes it stands for (`raw`). */
static void
random_name(unsigned *seed, char *yaml, size_t ylen, char *raw, size_t rlen)
{
	static const char *const pieces[][2] = {
		{ "a", "a" },
		{ "Z", "Z" },
		{ "0", "0" },
		{ "/", "/" },
		{ ":", ":" },
		{ " ", " " },
		{ "~", "~" },
		{ "\\t", "\t" },
		{ "\\u00fc", "\xc3\xbc" },
		{ "\\u00ef", "\xc3\xaf" },
		{ "\\u00f8", "\xc3\xb8" },
		{ "\\x01", "\x01" },
		{ "\\x7f", "\x7f" },
		{ "\\u2603", "\xe2\x98\x83" },
		{ "-", "-" },
		{ ".", "." },
		{ "\\\"", "\"" },
		{ "\\\\", "\\" },
	};
	size_t np = sizeof pieces / sizeof pieces[0];
	size_t yn = 0, rn = 0;
	int len = 1 + (int) (rand_r(seed) % 12);
	/* Mostly valid, so that acceptance is exercised as well. */
	bool plain = rand_r(seed) % 2 == 0;
	for (int i = 0; i < len; i++) {
		size_t k = (size_t) rand_r(seed) % (plain ? 7 : np);
		size_t a = strlen(pieces[k][0]), b = strlen(pieces[k][1]);
		if (yn + a + 1 >= ylen || rn + b + 1 >= rlen)
			break;
		memcpy(yaml + yn, pieces[k][0], a);
		memcpy(raw + rn, pieces[k][1], b);
		yn += a;
		rn += b;
	}
	yaml[yn] = '\0';
	raw[rn] = '\0';
}

START_TEST(test_names_property)
{
	unsigned seed = 18;
	int accepted = 0, refused = 0;
	for (int i = 0; i < 400; i++) {
		char yname[128], raw[128], text[512], err[256];
		random_name(&seed, yname, sizeof yname, raw, sizeof raw);
		snprintf(text, sizeof text,
		    "quotas:\n  default:\n    tokens_per_second: 10\n"
		    "    burst: 20\n  callers:\n    - identity: \"%s\"\n"
		    "      tokens_per_second: 5\n      burst: 5\n",
		    yname);
		allot_config *cfg = NULL;
		if (allot_config_parse("t", text, strlen(text), err,
		        sizeof err, &cfg) != ALLOT_OK) {
			refused++;
			continue;
		}
		accepted++;
		allot__state_opts o;
		allot__state_opts_init(&o);
		allot__state *st = NULL;
		ck_assert_int_eq(
		    allot__state_create(&o, cfg, "t", text, &st), ALLOT_OK);
		char *ks[] = { "default", raw };
		Allot__V1__Register rq = ALLOT__V1__REGISTER__INIT;
		rq.replica_id = "r1";
		rq.service = "svc";
		rq.n_keys = 2;
		rq.keys = ks;
		rq.sync_interval_ms = 100;
		Allot__V1__Welcome w = ALLOT__V1__WELCOME__INIT;
		allot__arena a = { 0 };
		ProtobufCAllocator pa = { allot__arena_alloc,
			allot__arena_free, &a };
		int code = allot__state_register(
		    st, &rq, &pa, &w, err, sizeof err);
		ck_assert_msg(code == 0,
		    "config with identity \"%s\" accepted, Register refused: "
		    "%s",
		    yname, err);
		ck_assert_uint_eq(w.n_unknown_keys, 0);
		allot__arena_destroy(&a);
		allot__state_destroy(st);
	}
	ck_assert_int_gt(accepted, 50);
	ck_assert_int_gt(refused, 50);
	adv_report("a quota identity with non-ASCII or control characters",
	    "no accepted config makes a Register fail",
	    "check-config valid, then every Register refused MALFORMED", true,
	    "one rule (common/name.h): %d random names accepted by the "
	    "loader all register; %d refused by the loader with the wire's "
	    "words",
	    accepted, refused);
}
END_TEST

/* ---- fake replicas ---- */

static const char share_cfg[] = "quotas:\n"
                                "  default:\n"
                                "    tokens_per_second: 10\n"
                                "    burst: 20\n"
                                "  callers:\n"
                                "    - identity: \"spiffe://test/a\"\n"
                                "      tokens_per_second: 1000\n"
                                "      burst: 1000\n";

/* The honest replica's bucket, as an agent keeps it: when it last
 * reported (0: not yet) and the fraction of a token its grant refilled
 * beyond what it could admit. honest_start() resets it. */
static uint64_t honest_ms;
static double honest_carry;

static void
honest_start(void)
{
	honest_ms = 0;
	honest_carry = 0;
}

/* allotd on share_cfg (with `extra`, NULL terminated, or NULL) and the
 * honest replica `h` joined to it, its bucket reset. */
static void
honest_join(adv_coord *c, const char *const *extra, pc_replica *h)
{
	adv_coord_start_with(c, share_cfg, extra);
	memset(h, 0, sizeof *h);
	ck_assert_int_eq(
	    pc_replica_join(h, c->url, "honest", ADV_SVC, adv_keys, 2), 0);
	honest_start();
}

/* One round (about 100 ms) of an honest replica wanting 1,500 tokens/s
 * of key 1 (R = 1,000): it admits what its grant refilled since its last
 * round, as its bucket would, and reports the rest denied (and so never
 * denials its bucket could have admitted: denials()). Returns its rate
 * share after the round. */
static double
honest_round(pc_replica *r)
{
	double rate = isnan(r->rate[1]) ? 0 : r->rate[1];
	uint64_t now = pc_now_ms();
	double el = honest_ms != 0 ? (double) (now - honest_ms) / 1e3 : 0.1;
	honest_ms = now;
	double refill = rate * el + honest_carry;
	uint64_t want = (uint64_t) (1500 * el), can = (uint64_t) refill;
	uint64_t got = can < want ? can : want;
	honest_carry = got < can ? 0 : refill - (double) can;
	pc_report rep = { .key = 1,
		.consumed = got,
		.denied = want - got,
		.held = 0,
		.demand = 1500 };
	ck_assert_int_eq(pc_replica_sync(r, &rep, 1, NULL), 0);
	pc_sleep_ms(100);
	return isnan(r->rate[1]) ? 0 : r->rate[1];
}

/* What the honest replica kept through a burst of fakes. */
typedef struct burst {
	int joined, refused;
	double before, worst, after;
	int low; /* samples below 90 % */
} burst;

/* 49 fake replicas registered in one burst from `from` (NULL: the
 * honest replica's own address), the honest replica wanting more than R
 * throughout. The fakes declare the longest sync interval, so that they
 * live for the 5-minute expiry, and never sync. The honest replica is
 * sampled every 100 ms (and every 10 Registers) from the first fake's
 * Register to 4 s after the last: past the 3 s lease of every grant
 * their Welcomes carried, and the 2 s of a forming service. */
static void
fake_burst(const char *from, const char *const *extra, burst *ret)
{
	adv_coord c;
	pc_replica h;
	honest_join(&c, extra, &h);
	memset(ret, 0, sizeof *ret);
	for (int i = 0; i < 15; i++)
		ret->before = honest_round(&h);
	enum { FAKES = 49 };
	pc_conn f[FAKES];
	ret->worst = 1e9;
	for (int i = 0; i < FAKES; i++) {
		memset(&f[i], 0, sizeof f[i]);
		ck_assert_int_eq(from != NULL ?
		        pc_open_from(&f[i], c.url, from) :
		        pc_open(&f[i], c.url, 5000),
		    0);
		char id[32];
		snprintf(id, sizeof id, "fake-%d", i);
		Allot__V1__Envelope *e = pc_register(
		    &f[i], id, ADV_SVC, adv_keys, 2, 60000);
		ck_assert_ptr_nonnull(e);
		ret->joined += e->body_case ==
		    ALLOT__V1__ENVELOPE__BODY_WELCOME;
		ret->refused += pc_error_code(e) ==
		    ALLOT__V1__ERROR__CODE__RATE_LIMITED;
		pc_free(e);
		if (i % 10 == 9 &&
		    (ret->after = honest_round(&h)) < ret->worst)
			ret->worst = ret->after;
	}
	for (int i = 0; i < 40; i++) {
		ret->after = honest_round(&h);
		ret->low += ret->after < 0.9 * 1000;
		if (ret->after < ret->worst)
			ret->worst = ret->after;
	}
	for (int i = 0; i < FAKES; i++)
		pc_close(&f[i]);
	pc_replica_close(&h);
	adv_coord_stop(&c);
}

/* From the honest replica's address (the attack, allotd's
 * defaults): they claim no demand (a replica claims from its first
 * Sync) and, coming from an address that already has a replica of the
 * service, move none at their Register: the honest replica keeps its
 * share throughout. */
START_TEST(test_fake_replicas)
{
	burst b;
	fake_burst(NULL, NULL, &b);
	/* Its fair share: the whole quota, the fakes wanting nothing. */
	double fair = 1000;
	bool ok = b.worst >= 0.9 * fair;
	adv_report("49 fake replicas registered in one burst, never syncing",
	    "the honest replica keeps >= 90 % of its fair share throughout",
	    "share 1,000/s -> 20/s for 5 minutes", ok,
	    "%d fakes joined from its address; honest share %.0f/s before, "
	    "at least %.0f/s of a fair %.0f/s sampled every 100 ms during "
	    "and 4 s after the burst (below 90 %% for %.1f s), %.0f/s at "
	    "the end",
	    b.joined, b.before, b.worst, fair, b.low * 0.1, b.after);
	ck_assert_msg(ok, "honest share %.0f of a fair %.0f", b.worst, fair);
}
END_TEST

/* From another address, with a replica budget of 8 per address: the
 * first fake takes its part at its Register, as an honest newcomer on
 * a host of its own would (that is what makes a scale-up converge in an
 * interval); the other 7 admitted move nothing, the rest are refused. */
START_TEST(test_fake_replicas_elsewhere)
{
	const char *extra[] = { "--max-replicas-per-peer", "8", NULL };
	burst b;
	fake_burst("127.0.0.2", extra, &b);
	double fair = 1000;
	bool ok = b.refused == 41 && b.after >= 0.9 * fair &&
	    b.worst >= 0.4 * fair;
	adv_report("49 fake replicas from another address, "
	           "--max-replicas-per-peer 8",
	    "the fakes bounded; the honest replica loses at most the "
	    "first newcomer's part, briefly",
	    "(not in the issue)", ok,
	    "%d fakes joined, %d refused by the address's replica budget; "
	    "honest share %.0f/s before, at least %.0f/s (below 90 %% for "
	    "%.1f s), %.0f/s at the end",
	    b.joined, b.refused, b.before, b.worst, b.low * 0.1, b.after);
	ck_assert_int_eq(b.refused, 41);
	ck_assert_msg(
	    b.worst >= 0.4 * fair, "honest share fell to %.0f", b.worst);
	ck_assert_msg(
	    b.after >= 0.9 * fair, "honest share %.0f at the end", b.after);
}
END_TEST

/* The replica budget per peer: one address registers 10 replicas of a
 * service against a budget of 4; the rest are refused and counted, and
 * a replica that leaves frees its place. */
START_TEST(test_peer_replicas)
{
	adv_coord c;
	const char *extra[] = { "--max-replicas-per-peer", "4", NULL };
	adv_coord_start_with(&c, share_cfg, extra);
	pc_conn one;
	memset(&one, 0, sizeof one);
	ck_assert_int_eq(pc_open(&one, c.url, 5000), 0);
	int joined = 0, refused = 0;
	uint64_t first = 0;
	for (int i = 0; i < 10; i++) {
		char id[32];
		snprintf(id, sizeof id, "many-%d", i);
		Allot__V1__Envelope *e = pc_register(
		    &one, id, ADV_SVC, adv_keys, 2, 100);
		ck_assert_ptr_nonnull(e);
		if (e->body_case == ALLOT__V1__ENVELOPE__BODY_WELCOME) {
			if (joined++ == 0)
				first = e->welcome->session;
		}
		refused += pc_error_code(e) ==
		    ALLOT__V1__ERROR__CODE__RATE_LIMITED;
		pc_free(e);
	}
	ck_assert_int_eq(joined, 4);
	ck_assert_int_eq(refused, 6);
	double counted = pc_metric_get(c.http,
	    "allotd_rejected_messages_total{reason=\"peer_replicas\"}");
	ck_assert_double_eq(counted, 6);
	Allot__V1__Envelope *e = pc_leave(&one, first, "bye");
	ck_assert_ptr_nonnull(e);
	pc_free(e);
	e = pc_register(&one, "after-leave", ADV_SVC, adv_keys, 2, 100);
	ck_assert_ptr_nonnull(e);
	ck_assert_int_eq(e->body_case, ALLOT__V1__ENVELOPE__BODY_WELCOME);
	pc_free(e);
	pc_close(&one);
	adv_coord_stop(&c);
}
END_TEST

/* Issue 27: a Register naming a live replica's id from another
 * connection (the same address, so no peer budget tells them apart)
 * is refused and counted, and the victim's Syncs go on being answered;
 * once the victim's connection has closed, as a restart closes it, the
 * id registers again. */
START_TEST(test_replica_hijack)
{
	adv_coord c;
	adv_coord_start_with(&c, share_cfg, NULL);
	pc_conn victim, thief;
	memset(&victim, 0, sizeof victim);
	memset(&thief, 0, sizeof thief);
	ck_assert_int_eq(pc_open(&victim, c.url, 5000), 0);
	ck_assert_int_eq(pc_open(&thief, c.url, 5000), 0);
	Allot__V1__Envelope *e = pc_register(
	    &victim, "victim", ADV_SVC, adv_keys, 2, 100);
	ck_assert_ptr_nonnull(e);
	ck_assert_int_eq(e->body_case, ALLOT__V1__ENVELOPE__BODY_WELCOME);
	uint64_t session = e->welcome->session;
	pc_free(e);
	int refused = 0, answered = 0;
	for (int i = 0; i < 20; i++) {
		e = pc_register(&thief, "victim", ADV_SVC, adv_keys, 2, 100);
		ck_assert_ptr_nonnull(e);
		refused += pc_error_code(e) ==
		    ALLOT__V1__ERROR__CODE__RATE_LIMITED;
		pc_free(e);
		pc_report r = { .key = 0, .consumed = 1 };
		e = pc_sync(&victim, session, (uint64_t) i + 1, 100, &r, 1);
		ck_assert_ptr_nonnull(e);
		answered += e->body_case == ALLOT__V1__ENVELOPE__BODY_REPLY;
		pc_free(e);
	}
	double counted = pc_metric_get(c.http,
	    "allotd_rejected_messages_total{reason=\"replica_in_use\"}");
	bool ok = refused == 20 && answered == 20 && counted == 20;
	adv_report("a Register carrying a live replica's id, from another "
	           "connection of its address",
	    "refused; the victim's Syncs all answered",
	    "99 of 99 of the victim's Syncs UNKNOWN_SESSION", ok,
	    "%d of 20 Registers refused (%g counted replica_in_use), %d of "
	    "20 of the victim's Syncs answered",
	    refused, counted, answered);
	ck_assert_int_eq(refused, 20);
	ck_assert_int_eq(answered, 20);
	ck_assert_double_eq(counted, 20);
	/* The victim restarts: its connection closes, and the same id
	 * registers from the new one. */
	pc_close(&victim);
	bool back = false;
	for (int i = 0; i < 100 && !back; i++) {
		e = pc_register(&thief, "victim", ADV_SVC, adv_keys, 2, 100);
		ck_assert_ptr_nonnull(e);
		back = e->body_case == ALLOT__V1__ENVELOPE__BODY_WELCOME;
		pc_free(e);
		if (!back)
			usleep(10000);
	}
	ck_assert(back);
	pc_close(&thief);
	adv_coord_stop(&c);
}
END_TEST

/* ---- replica and service tables ---- */

START_TEST(test_tables)
{
	adv_coord c;
	const char *extra[] = { "--max-replicas-per-service", "20",
		"--max-services", "8", "--service-idle-ms", "300",
		"--peer-register-rate", "0", NULL };
	adv_coord_start_with(&c, adv_cfg_text, extra);
	/* Fake replicas of one service: the service's budget, not the
	 * replica table, runs out. */
	pc_conn one;
	memset(&one, 0, sizeof one);
	ck_assert_int_eq(pc_open(&one, c.url, 5000), 0);
	int refused = 0;
	for (int i = 0; i < 30; i++) {
		char id[32];
		snprintf(id, sizeof id, "fill-%d", i);
		Allot__V1__Envelope *e = pc_register(
		    &one, id, "filler", adv_keys, 2, 100);
		ck_assert_ptr_nonnull(e);
		refused += pc_error_code(e) ==
		    ALLOT__V1__ERROR__CODE__RATE_LIMITED;
		pc_free(e);
	}
	ck_assert_int_eq(refused, 10);
	adv_assert_agent_joins(&c, "new-replica");
	/* Register+Leave pairs under new service names: the empty
	 * services are freed and new services still accepted. */
	for (int i = 0; i < 40; i++) {
		char svc[32];
		snprintf(svc, sizeof svc, "junk-%d", i);
		Allot__V1__Envelope *e = pc_register(
		    &one, "r", svc, adv_keys, 2, 100);
		ck_assert_ptr_nonnull(e);
		if (e->body_case == ALLOT__V1__ENVELOPE__BODY_WELCOME) {
			uint64_t sid = e->welcome->session;
			pc_free(e);
			e = pc_leave(&one, sid, "bye");
			ck_assert_ptr_nonnull(e);
		}
		pc_free(e);
		if (i % 4 == 3)
			pc_sleep_ms(400);
	}
	pc_sleep_ms(500);
	pc_replica n;
	memset(&n, 0, sizeof n);
	int rc = pc_replica_join(
	    &n, c.url, "svc-new", "brand-new", adv_keys, 2);
	double series = 0;
	char *m = pc_http_get(c.http, "/metrics", NULL);
	ck_assert_ptr_nonnull(m);
	for (const char *p = m; (p = strstr(p, "quota=\"")) != NULL; p++)
		series++;
	size_t mlen = strlen(m);
	free(m);
	bool ok = rc == 0 && refused == 10;
	adv_report("replica and service tables filled (Register+Leave pairs, "
	           "fake replicas of one service)",
	    "new replicas and services still accepted; /metrics bounded",
	    "new replicas refused 5 min, new services until restart; "
	    "/metrics 760 KB",
	    ok,
	    "%d of 30 fake replicas refused by the service's budget, a "
	    "new replica and, after 40 Register+Leave services, a new "
	    "service accepted; /metrics %zu bytes, %.0f per-quota series",
	    refused, mlen, series);
	ck_assert_msg(rc == 0, "a new service was refused (%d)", rc);
	pc_replica_close(&n);
	pc_close(&one);
	adv_coord_stop(&c);
}
END_TEST

/* ---- consumption plausibility ---- */

START_TEST(test_plausibility)
{
	adv_coord c;
	adv_coord_start_with(&c, share_cfg, NULL);
	pc_replica h, liar;
	memset(&h, 0, sizeof h);
	memset(&liar, 0, sizeof liar);
	ck_assert_int_eq(
	    pc_replica_join(&h, c.url, "honest", ADV_SVC, adv_keys, 2), 0);
	ck_assert_int_eq(
	    pc_replica_join(&liar, c.url, "liar", ADV_SVC, adv_keys, 2), 0);
	uint64_t t0 = pc_now_ms();
	honest_start();
	enum { ROUNDS = 30 };
	for (int i = 0; i < ROUNDS; i++) {
		/* 90,000 tokens/s against R = 1,000: under the old bound
		 * per Sync (4 R n (T + 1 s) + B), far above what it could
		 * have admitted. */
		pc_report lie = { .key = 1,
			.consumed = 9000,
			.denied = 0,
			.held = 0,
			.demand = 1000 };
		ck_assert_int_eq(pc_replica_sync(&liar, &lie, 1, NULL), 0);
		honest_round(&h);
	}
	double secs = (double) (pc_now_ms() - t0) / 1e3;
	char *m = pc_http_get(c.http, "/metrics", NULL);
	ck_assert_ptr_nonnull(m);
	double clipped = pc_metric(m, "allotd_reports_clipped_total");
	double booked = pc_metric(m,
	    "allotd_allowed_tokens_total{service=\"" ADV_SVC
	    "\",quota=\"spiffe://test/a\"}");
	free(m);
	/* What both could have admitted: R over the time plus a burst and
	 * a second of slack each. */
	double can = 1000 * secs + 2 * (1000 + 1000);
	bool ok = clipped >= ROUNDS - 2 && booked <= can;
	adv_report("consumption reported at the old bound (90,000 tokens/s "
	           "against R = 1,000)",
	    "implausible reports clipped, counted, audited; never booked",
	    "0 of 100 rejected; 914,910 phantom tokens booked", ok,
	    "%.0f of %d reports clipped; %.0f tokens booked in %.1f s "
	    "(at most %.0f could have been admitted; the lie was %d)",
	    clipped, ROUNDS, booked, secs, can, ROUNDS * 9000);
	ck_assert_msg(clipped >= ROUNDS - 2, "%.0f clipped", clipped);
	ck_assert_msg(
	    booked <= can, "%.0f booked, at most %.0f possible", booked, can);
	pc_replica_close(&h);
	pc_replica_close(&liar);
	adv_coord_stop(&c);
}
END_TEST

/* ---- denial plausibility ---- */

/* Issue 27: 49 fake replicas that do sync, every round, reporting a
 * million denied tokens a second and no consumption, held 98 % of the
 * quota (980 of 1,000/s) and left the honest replica 2 %. A bucket that
 * admitted nothing while its grant refilled it cannot have denied
 * anything: once a fake's bound of its level passes the largest weight
 * its denials are refuted, not booked, and its demand falls to what it
 * consumed, nothing: the fakes keep the floor of idle replicas. The
 * honest replica, wanting 1,500/s, drains its bucket and its denials
 * stand. Sampled over the last 10 of 30 rounds (the first few rounds'
 * denials stand: a bound starts at the most debt an agent may carry). */
START_TEST(test_fake_denials)
{
	adv_coord c;
	pc_replica h;
	honest_join(&c, NULL, &h);
	double before = 0;
	for (int i = 0; i < 15; i++)
		before = honest_round(&h);
	enum { FAKES = 49, ROUNDS = 30 };
	pc_replica *f = calloc(FAKES, sizeof *f);
	ck_assert_ptr_nonnull(f);
	for (int i = 0; i < FAKES; i++) {
		char id[32];
		snprintf(id, sizeof id, "liar-%d", i);
		ck_assert_int_eq(
		    pc_replica_join(&f[i], c.url, id, ADV_SVC, adv_keys, 2),
		    0);
	}
	double worst_late = 1e9, after = 0, fakes_held = 0;
	for (int r = 0; r < ROUNDS; r++) {
		fakes_held = 0;
		for (int i = 0; i < FAKES; i++) {
			pc_report lie = { .key = 1,
				.consumed = 0,
				.denied = 100000,
				.held = 0,
				.demand = 1000000 };
			ck_assert_int_eq(
			    pc_replica_sync(&f[i], &lie, 1, NULL), 0);
			fakes_held += isnan(f[i].rate[1]) ? 0 : f[i].rate[1];
		}
		after = honest_round(&h);
		if (r >= ROUNDS - 10 && after < worst_late)
			worst_late = after;
	}
	char *m = pc_http_get(c.http, "/metrics", NULL);
	ck_assert_ptr_nonnull(m);
	double refuted = pc_metric(m, "allotd_denials_refuted_total");
	double reports = pc_metric(m, "allotd_denial_reports_refuted_total");
	free(m);
	/* Its fair share: what the allocator leaves a busy replica beside
	 * 49 idle ones, each of which keeps a floor of a quarter of the
	 * equal share (docs/allocation.md): 1,000 - 49 * 1,000 / 200. */
	double fair = 1000 - FAKES * 1000.0 / (4 * (FAKES + 1));
	bool ok = worst_late >= 0.9 * fair && refuted > 0;
	adv_report("49 fake replicas syncing every 100 ms, each reporting "
	           "1e6 denied tokens/s and no consumption",
	    "the honest replica keeps >= 90 % of its fair share once the "
	    "fakes' denials are refuted",
	    "the fakes held 980 of 1,000/s, the honest replica 20/s", ok,
	    "honest share %.0f/s before, at least %.0f/s of a fair %.0f/s "
	    "over the last %d rounds, %.0f/s at the end; the fakes held "
	    "%.0f/s in all; %.0f reports and %.3g denied tokens refuted",
	    before, worst_late, fair, 10, after, fakes_held, reports, refuted);
	ck_assert_msg(ok, "honest share %.0f of a fair %.0f, %.0f refuted",
	    worst_late, fair, refuted);
	for (int i = 0; i < FAKES; i++)
		pc_replica_close(&f[i]);
	free(f);
	pc_replica_close(&h);
	adv_coord_stop(&c);
}
END_TEST

/* ---- forged member Probes ---- */

START_TEST(test_forged_probes)
{
	adv_coord c;
	/* Members no longer probe each other (they run Raft): a Probe is
	 * MALFORMED wherever it lands, and must still change nothing. */
	const char *extra[] = { NULL };
	adv_coord_start_with(&c, adv_cfg_text, extra);
	pc_conn att;
	memset(&att, 0, sizeof att);
	ck_assert_int_eq(pc_open(&att, c.url, 5000), 0);
	enum { N = 200 };
	int answered = 0;
	for (int i = 0; i < N; i++) {
		Allot__V1__Probe pr = ALLOT__V1__PROBE__INIT;
		pr.member = "m2";
		/* Alternating digests: each change was a log line and an
		 * event row before. */
		pr.config_digest = (uint64_t) (i % 2) + 1;
		pr.config_epoch = 7;
		Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
		env.version = 1;
		env.body_case = ALLOT__V1__ENVELOPE__BODY_PROBE;
		env.probe = &pr;
		Allot__V1__Envelope *e = pc_send(&att, &env);
		answered += e != NULL;
		pc_free(e);
	}
	pc_close(&att);
	pc_sleep_ms(300);
	char *log = pc_read_file(c.log);
	ck_assert_ptr_nonnull(log);
	int lines = 0;
	for (const char *p = log;
	     (p = strstr(p, "ALLOTD-CLUSTER-CONFIG-MISMATCH")) != NULL; p++)
		lines++;
	free(log);
	char *status = pc_http_get(c.http, "/status", NULL);
	bool believed = status != NULL &&
	    (strstr(status, "\"config_digest\":\"0000000000000001\"") !=
	            NULL ||
	        strstr(status, "\"config_digest\":\"0000000000000002\"") !=
	            NULL);
	free(status);
	bool ok = lines == 0 && !believed;
	adv_report("Probes claiming to be a member",
	    "a name in a message changes nothing and writes nothing",
	    "86 mismatch log lines and event rows in 4 s", ok,
	    "%d forged Probes answered; %d mismatch log lines; the claimed "
	    "member's state %s",
	    answered, lines, believed ? "taken" : "untouched");
	ck_assert_msg(ok, "%d mismatch lines, believed %d", lines, believed);
	adv_coord_stop(&c);
}
END_TEST

void
adversary_lies_tests(const adversary_tcases *tc)
{
	tcase_add_test(tc->names, test_names_property);
	tcase_add_test(tc->fake_replicas, test_fake_replicas);
	tcase_add_test(
	    tc->fake_replicas_elsewhere, test_fake_replicas_elsewhere);
	tcase_add_test(tc->peer_replicas, test_peer_replicas);
	tcase_add_test(tc->peer_replicas, test_replica_hijack);
	tcase_add_test(tc->tables, test_tables);
	tcase_add_test(tc->plausibility, test_plausibility);
	tcase_add_test(tc->plausibility, test_fake_denials);
	tcase_add_test(tc->forged_probes, test_forged_probes);
}
