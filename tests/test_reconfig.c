/* SPDX-License-Identifier: MIT */
/*
 * A running agent takes a new quota config (agent/reconfig.c): callers
 * added, removed and added back while their keys are held, weights and
 * shadow taking effect on the next acquire, counts carried across swaps
 * and attributed to the quota a key charged at the time, a config past
 * the reserved capacity refused whole, endpoint quotas, the global
 * ceiling's local share in local-only mode, and real threads acquiring
 * while another thread installs a config every millisecond (run under
 * ThreadSanitizer with the threaded suites).
 */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <allot/allot.h>

#include "agent_int.h"
#include "values.h"
#include "fallback.h"
#include "runner.h"

#define MS 1000000ull
#define S 1000000000ull

static _Atomic uint64_t vnow;

static uint64_t
vclock(void *ctx)
{
	(void) ctx;
	return atomic_load(&vnow);
}

/* A config of callers "spiffe://t/NAME" given as "NAME:RATE:BURST[:s]"
 * (s: shadow), a default of 10/s burst 20, endpoint /x of weight `wx`
 * and `ceiling` (0: none). */
static allot_config *
mkcfg(const char *callers, uint32_t wx, double ceiling)
{
	char y[8192];
	size_t n = (size_t) snprintf(y, sizeof y,
	    "quotas:\n"
	    "  default:\n"
	    "    tokens_per_second: 10\n"
	    "    burst: 20\n"
	    "    priority: low\n");
	if (callers[0] != '\0')
		n += (size_t) snprintf(y + n, sizeof y - n, "  callers:\n");
	char buf[1024];
	snprintf(buf, sizeof buf, "%s", callers);
	for (char *save = NULL, *c = strtok_r(buf, " ", &save); c != NULL;
	     c = strtok_r(NULL, " ", &save)) {
		char name[64], prio[16] = "standard";
		double rate, burst;
		char shadow = 0;
		int got = sscanf(
		    c, "%63[^:]:%lf:%lf:%c", name, &rate, &burst, &shadow);
		ck_assert(got >= 3);
		if (shadow == 'c')
			snprintf(prio, sizeof prio, "critical");
		n += (size_t) snprintf(y + n, sizeof y - n,
		    "    - identity: \"spiffe://t/%s\"\n"
		    "      tokens_per_second: %g\n"
		    "      burst: %g\n"
		    "      priority: %s\n"
		    "      shadow: %s\n",
		    name, rate, burst, prio, shadow == 's' ? "true" : "false");
	}
	n += (size_t) snprintf(y + n, sizeof y - n,
	    "  endpoint_weights:\n"
	    "    default: 1\n"
	    "    \"/x\": %u\n",
	    wx);
	if (ceiling > 0)
		n += (size_t) snprintf(y + n, sizeof y - n,
		    "  global_ceiling:\n"
		    "    tokens_per_second: %g\n"
		    "    shed_order: [low, batch, standard, critical]\n",
		    ceiling);
	char err[512];
	allot_config *cfg;
	int rc = allot_config_parse("test.yaml", y, n, err, sizeof err, &cfg);
	ck_assert_msg(rc == ALLOT_OK, "config: %s\n%s", err, y);
	return cfg;
}

static char logged[4096];

static void
logfn(void *ctx, int level, const char *id, const char *msg)
{
	(void) ctx;
	(void) level;
	size_t n = strlen(logged);
	snprintf(logged + n, sizeof logged - n, "%s %s\n", id, msg);
}

static allot_agent *
mkagent(allot_config *cfg, uint32_t max_callers)
{
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.clock = vclock;
	o.max_callers = max_callers;
	o.log = logfn;
	allot_agent *a;
	ck_assert_int_eq(allot_agent_create(cfg, &o, &a), ALLOT_OK);
	allot_config_free(cfg);
	return a;
}

static void
set(allot_agent *a, allot_config *cfg)
{
	ck_assert_int_eq(allot_agent_set_config(a, cfg), ALLOT_OK);
	allot_config_free(cfg);
}

static allot_key *
key(allot_agent *a, const char *name, const char *ep)
{
	char id[128];
	snprintf(id, sizeof id, "spiffe://t/%s", name);
	allot_key *k;
	ck_assert_int_eq(allot_key_resolve(a, id, ep, &k), ALLOT_OK);
	return k;
}

static int
admit_n(allot_agent *a, allot_key *k, int n)
{
	int ok = 0;
	allot_decision d;
	for (int i = 0; i < n; i++) {
		allot_acquire(a, k, ALLOT_COST_DEFAULT, &d);
		ok += d.allowed;
	}
	return ok;
}

static const char *
quota_of(allot_agent *a, allot_key *k)
{
	allot_key_stats st;
	ck_assert_int_eq(allot_key_stats_get(a, k, &st), ALLOT_OK);
	return st.quota;
}

START_TEST(add_remove_readd)
{
	atomic_store(&vnow, 100 * S);
	allot_agent *a = mkagent(mkcfg("a:1:5 b:1:7", 1, 0), 0);
	ck_assert_uint_eq(a->nquotas, 3);
	ck_assert_uint_eq(a->default_quota, 2);
	ck_assert_uint_ge(a->quota_cap, 2 + 256 + 1);
	allot_key *ka = key(a, "a", "/x");
	ck_assert_str_eq(quota_of(a, ka), "spiffe://t/a");
	ck_assert_int_eq(admit_n(a, ka, 10), 5);

	/* a removed, c added: a's held key now charges the default quota
	 * (burst 20, a fresh bucket for it); c takes the next id. */
	set(a, mkcfg("b:1:7 c:1:3", 1, 0));
	ck_assert_uint_eq(a->nquotas, 4);
	ck_assert_str_eq(a->quotas[3].name, "spiffe://t/c");
	ck_assert(atomic_load(&a->quotas[0].removed));
	ck_assert_str_eq(quota_of(a, ka), "default");
	allot_key_stats st;
	allot_key_stats_get(a, ka, &st);
	ck_assert(!st.known);
	ck_assert_int_eq(admit_n(a, ka, 30), 20);
	allot_key *kc = key(a, "c", "/x");
	ck_assert_str_eq(quota_of(a, kc), "spiffe://t/c");
	ck_assert_int_eq(admit_n(a, kc, 10), 3);
	/* b untouched: its bucket kept its level (7 of 7). */
	ck_assert_int_eq(admit_n(a, key(a, "b", NULL), 10), 7);

	/* a back: the same key, its old id and bucket. c removed. */
	set(a, mkcfg("a:1:5 b:1:7", 1, 0));
	ck_assert_uint_eq(a->nquotas, 4);
	ck_assert(!atomic_load(&a->quotas[0].removed));
	ck_assert(atomic_load(&a->quotas[3].removed));
	ck_assert_ptr_eq(key(a, "a", "/x"), ka);
	ck_assert_str_eq(quota_of(a, ka), "spiffe://t/a");
	ck_assert_str_eq(quota_of(a, kc), "default");
	/* Its counts never stopped. */
	allot_key_stats_get(a, ka, &st);
	ck_assert_uint_eq(st.allowed, 25);
	ck_assert_uint_eq(st.denied, 15);
	allot_agent_destroy(a);
}
END_TEST

START_TEST(weight_and_shadow_next_acquire)
{
	atomic_store(&vnow, 100 * S);
	allot_agent *a = mkagent(mkcfg("a:1:10", 1, 0), 0);
	allot_key *k = key(a, "a", "/x");
	allot_key *kn = key(a, "nobody", "/x"); /* an unknown identity */
	ck_assert_uint_eq(allot_key_cost(k), 1);
	allot_decision d;
	ck_assert_int_eq(
	    allot_acquire(a, k, ALLOT_COST_DEFAULT, &d), ALLOT_OK);
	ck_assert_uint_eq(d.cost, 1);
	set(a, mkcfg("a:1:10", 4, 0));
	ck_assert_uint_eq(allot_key_cost(k), 4);
	ck_assert_uint_eq(allot_key_cost(kn), 4);
	ck_assert_int_eq(
	    allot_acquire(a, k, ALLOT_COST_DEFAULT, &d), ALLOT_OK);
	ck_assert_uint_eq(d.cost, 4);
	ck_assert(d.allowed);
	/* 5 tokens left: one more of 4, then denied. */
	ck_assert_int_eq(admit_n(a, k, 2), 1);
	/* Shadow: the next acquire passes, flagged. */
	set(a, mkcfg("a:1:10:s", 4, 0));
	ck_assert_int_eq(
	    allot_acquire(a, k, ALLOT_COST_DEFAULT, &d), ALLOT_OK);
	ck_assert(d.allowed && d.shadow_denied);
	set(a, mkcfg("a:1:10", 4, 0));
	ck_assert_int_eq(
	    allot_acquire(a, k, ALLOT_COST_DEFAULT, &d), ALLOT_OK);
	ck_assert(!d.allowed && !d.shadow_denied);
	/* A cost above the burst is refused: max_cost follows the quota. */
	ck_assert_int_eq(allot_acquire(a, k, 6, &d), ALLOT_OK);
	set(a, mkcfg("a:1:5", 4, 0));
	ck_assert_int_eq(allot_acquire(a, k, 6, &d), ALLOT_ETOOBIG);
	allot_agent_destroy(a);
}
END_TEST

/* Local-only, a changed rate takes effect at once (level kept). */
START_TEST(rate_change_local)
{
	atomic_store(&vnow, 100 * S);
	allot_agent *a = mkagent(mkcfg("a:1:10", 1, 0), 0);
	allot_key *k = key(a, "a", NULL);
	ck_assert_int_eq(admit_n(a, k, 20), 10);
	set(a, mkcfg("a:100:10", 1, 0));
	atomic_fetch_add(&vnow, 50 * MS); /* 5 tokens at 100/s */
	ck_assert_int_eq(admit_n(a, k, 20), 5);
	allot_agent_destroy(a);
}
END_TEST

START_TEST(counts_follow_quota)
{
	atomic_store(&vnow, 100 * S);
	allot_agent *a = mkagent(mkcfg("a:1:5 b:1:5", 1, 0), 0);
	allot_key *ka = key(a, "a", "/x");
	ck_assert_int_eq(admit_n(a, ka, 8), 5);
	allot__ktotals qa, qd;
	allot__quota_totals(a, &a->quotas[0], &qa);
	ck_assert_uint_eq(qa.allowed, 5);
	ck_assert_uint_eq(qa.denied, 3);
	/* Removed: what a counted stays with a's quota; from now on it is
	 * the default quota's. */
	set(a, mkcfg("b:1:5", 1, 0));
	ck_assert_int_eq(admit_n(a, ka, 4), 4);
	allot__quota_totals(a, &a->quotas[0], &qa);
	allot__quota_totals(a, &a->quotas[a->default_quota], &qd);
	ck_assert_uint_eq(qa.allowed, 5);
	ck_assert_uint_eq(qa.spent, 5);
	ck_assert_uint_eq(qd.allowed, 4);
	ck_assert_uint_eq(qd.spent, 4);
	/* Back: a's quota counts again from where it was. */
	set(a, mkcfg("a:1:5 b:1:5", 1, 0));
	atomic_fetch_add(&vnow, 2 * S);
	ck_assert_int_eq(admit_n(a, ka, 1), 1);
	allot__quota_totals(a, &a->quotas[0], &qa);
	allot__quota_totals(a, &a->quotas[a->default_quota], &qd);
	ck_assert_uint_eq(qa.allowed, 6);
	ck_assert_uint_eq(qd.allowed, 4);
	/* And the key's own counters never reset. */
	allot_key_stats st;
	allot_key_stats_get(a, ka, &st);
	ck_assert_uint_eq(st.allowed, 10);
	allot_agent_destroy(a);
}
END_TEST

START_TEST(capacity_refused)
{
	atomic_store(&vnow, 100 * S);
	logged[0] = '\0';
	allot_agent *a = mkagent(mkcfg("a:1:5", 1, 0), 2);
	ck_assert_uint_eq(a->group_cap, 2);
	allot_key *ka = key(a, "a", NULL);
	allot_config *big = mkcfg("a:100:100 b:1:5 c:1:5", 2, 0);
	ck_assert_int_eq(allot_agent_set_config(a, big), ALLOT_EFULL);
	allot_config_free(big);
	ck_assert_ptr_nonnull(strstr(logged, "ALLOT-CONFIG-FULL"));
	ck_assert_ptr_nonnull(strstr(logged, "max_callers"));
	/* Nothing changed: a's rate, weights, no new quota. */
	ck_assert_uint_eq(a->nquotas, 2);
	ck_assert_uint_eq(allot_key_cost(key(a, "a", "/x")), 1);
	ck_assert_int_eq(admit_n(a, ka, 10), 5);
	allot_key *kb = key(a, "b", NULL);
	ck_assert_str_eq(quota_of(a, kb), "default");
	/* Within it, fine; and the freed room is not reused: a removed
	 * caller keeps its slot. */
	set(a, mkcfg("b:1:5", 1, 0));
	ck_assert_uint_eq(a->nquotas, 3);
	big = mkcfg("c:1:5", 1, 0);
	ck_assert_int_eq(allot_agent_set_config(a, big), ALLOT_EFULL);
	allot_config_free(big);
	/* Too many new endpoints: refused too. */
	char y[8192];
	size_t n = (size_t) snprintf(y, sizeof y,
	    "quotas:\n  default:\n    tokens_per_second: 10\n"
	    "    burst: 20\n  endpoint_weights:\n    default: 1\n");
	for (int i = 0; i < 40; i++)
		n += (size_t) snprintf(
		    y + n, sizeof y - n, "    \"/e%d\": 1\n", i);
	char err[256];
	allot_config *eps;
	ck_assert_int_eq(
	    allot_config_parse("eps.yaml", y, n, err, sizeof err, &eps),
	    ALLOT_OK);
	ck_assert_int_eq(allot_agent_set_config(a, eps), ALLOT_EFULL);
	allot_config_free(eps);
	ck_assert_uint_eq(a->nep, 1);
	allot_agent_destroy(a);
}
END_TEST

/* The loader fills `endpoint` on another branch; set it by hand. */
static allot_config *
with_endpoint_quota(const char *callers, const char *ep, double ceiling)
{
	allot_config *c = mkcfg(callers, 1, ceiling);
	allot__quota *q = &c->callers[c->ncallers - 1];
	free(q->identity);
	q->identity = strdup("spiffe://t/a");
	q->endpoint = strdup(ep);
	return c;
}

START_TEST(endpoint_quota)
{
	atomic_store(&vnow, 100 * S);
	allot_agent *a = mkagent(
	    with_endpoint_quota("a:1:5 aex:1:2", "/x", 0), 0);
	ck_assert_str_eq(a->quotas[1].name, "spiffe://t/a /x");
	allot_key *kx = key(a, "a", "/x");
	allot_key *ky = key(a, "a", "/y");
	allot_key *kd = key(a, "a", NULL);
	ck_assert_str_eq(quota_of(a, kx), "spiffe://t/a /x");
	ck_assert_str_eq(quota_of(a, ky), "spiffe://t/a");
	ck_assert_str_eq(quota_of(a, kd), "spiffe://t/a");
	/* /x has a bucket of its own (2); the rest share a's (5). */
	ck_assert_int_eq(admit_n(a, kx, 5), 2);
	ck_assert_int_eq(admit_n(a, ky, 3), 3);
	ck_assert_int_eq(admit_n(a, kd, 5), 2);
	/* An endpoint quota added at run time, on an endpoint the config
	 * does not weigh: a class of its own appears. */
	set(a, with_endpoint_quota("a:1:5 aex:1:2 aez:1:4", "/z", 0));
	allot_key *kz = key(a, "a", "/z");
	ck_assert_str_eq(quota_of(a, kz), "spiffe://t/a /z");
	/* "a /x" is gone (aex is a caller of its own now): /x is a's. */
	ck_assert_str_eq(quota_of(a, kx), "spiffe://t/a");
	ck_assert_int_eq(admit_n(a, kz, 6), 4);
	/* An endpoint quota's burst is floored at its own endpoint's
	 * weight, not the heaviest: a burst of 5 stays 5 with /x at 9. */
	allot_config *c = with_endpoint_quota("a:1:10 aez:2:5", "/z", 0);
	c->endpoints[0].weight = 9;
	c->max_weight = 9;
	set(a, c);
	allot_decision d;
	allot_acquire(a, kz, 1, &d);
	ck_assert_double_eq(d.limit, 5);
	allot_acquire(a, kd, 1, &d);
	ck_assert_double_eq(d.limit, 10);
	allot_agent_destroy(a);
}
END_TEST

/* Local-only with a ceiling of 100/s and callers summing 200/s: held to
 * about the ceiling, shared by shed order. */
static uint64_t
drive(allot_agent *a, allot_key **k, size_t nk, uint64_t *adm, int secs)
{
	uint64_t total = 0;
	allot_decision d;
	for (int t = 0; t < secs * 1000; t++) {
		atomic_fetch_add(&vnow, MS);
		for (size_t i = 0; i < nk; i++)
			for (int r = 0; r < 2; r++) {
				allot_acquire(a, k[i], 1, &d);
				adm[i] += d.allowed;
				total += d.allowed;
			}
	}
	return total;
}

START_TEST(ceiling_local)
{
	atomic_store(&vnow, 100 * S);
	allot_agent *a = mkagent(mkcfg("a:100:10 b:100:10", 1, 100), 0);
	allot_key *k[2] = { key(a, "a", NULL), key(a, "b", NULL) };
	uint64_t adm[2] = { 0, 0 };
	uint64_t total = drive(a, k, 2, adm, 10);
	/* The default (10/s) shares the ceiling too: 100 * 10 s and the
	 * bursts, scaled alike. */
	ck_assert_uint_le(total, 1000 + 20);
	ck_assert_uint_ge(total, 900);
	/* Same class: an equal share. */
	ck_assert_uint_le(
	    adm[0] > adm[1] ? adm[0] - adm[1] : adm[1] - adm[0], 20);
	/* a critical: served first, b down to its floor (5 %). */
	set(a, mkcfg("a:100:10:c b:100:10", 1, 100));
	adm[0] = adm[1] = 0;
	total = drive(a, k, 2, adm, 10);
	ck_assert_uint_le(total, 1000 + 20);
	ck_assert_uint_ge(adm[0], 900);
	ck_assert_uint_le(adm[1], 60);
	/* No ceiling: each its own 100/s. */
	set(a, mkcfg("a:100:10:c b:100:10", 1, 0));
	adm[0] = adm[1] = 0;
	total = drive(a, k, 2, adm, 10);
	ck_assert_uint_ge(total, 1990);
	allot_agent_destroy(a);
}
END_TEST

/* What the sync engine installs in fallback (static_allowance): the
 * ceiling's cut, split over the replicas. */
START_TEST(ceiling_in_fallback)
{
	atomic_store(&vnow, 100 * S);
	allot_agent *a = mkagent(mkcfg("a:100:10:c b:100:10", 1, 100), 0);
	allot__installer in;
	allot__agent_installer(a, &in);
	ck_assert(in.reconfig != NULL);
	ck_assert(in.static_allowance != NULL);
	allot__allowance al;
	in.static_allowance(in.ctx, 0, 4, true, &al);
	ck_assert_int_eq(al.mode, ALLOT__MODE_LIMIT);
	ck_assert_double_eq_tol(al.rate, 94.5 / 4, 1e-9);
	in.static_allowance(in.ctx, 1, 4, true, &al);
	ck_assert_double_eq_tol(al.rate, 5.0 / 4, 1e-9);
	in.static_allowance(in.ctx, a->default_quota, 4, false, &al);
	ck_assert_double_eq_tol(al.rate, 0.5 / 4, 1e-9);
	/* A new ceiling through the installer: the cut follows. */
	ck_assert_int_eq(
	    in.reconfig(in.ctx, mkcfg("a:100:10:c b:100:10", 1, 0)), ALLOT_OK);
	in.static_allowance(in.ctx, 1, 4, true, &al);
	ck_assert_double_eq_tol(al.rate, 25, 1e-9);
	allot_agent_destroy(a);
}
END_TEST

START_TEST(ceiling_fit)
{
	double rate[4] = { 100, 100, 50, 10 }, cut[4];
	uint32_t prio[4] = { 3, 2, 2, 0 };
	allot__ceiling_fit(0, 4, rate, prio, cut);
	ck_assert_double_eq(cut[1], 100);
	allot__ceiling_fit(1000, 4, rate, prio, cut);
	ck_assert_double_eq(cut[2], 50);
	/* 260 into 150: floors 13; class 3 takes 95; class 2 shares 42
	 * max-min (21 each above their floors); class 0 its floor. */
	allot__ceiling_fit(150, 4, rate, prio, cut);
	ck_assert_double_eq_tol(cut[0], 100, 1e-6);
	ck_assert_double_eq_tol(cut[1], 5 + 21, 1e-6);
	ck_assert_double_eq_tol(cut[2], 2.5 + 21, 1e-6);
	ck_assert_double_eq_tol(cut[3], 0.5, 1e-6);
	ck_assert_double_eq_tol(cut[0] + cut[1] + cut[2] + cut[3], 150, 1e-6);
	/* Below the floors: in proportion. */
	allot__ceiling_fit(10, 4, rate, prio, cut);
	ck_assert_double_eq_tol(cut[0], 100 * 10 / 260.0, 1e-9);
}
END_TEST

START_TEST(coordinator_owns_config)
{
	allot_config *c = mkcfg("a:1:5", 1, 0);
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.coordinator = "tcp://127.0.0.1:1";
	o.log_level = ALLOT_LOG_ERR;
	allot_agent *a;
	ck_assert_int_eq(allot_agent_create(c, &o, &a), ALLOT_OK);
	ck_assert_int_eq(allot_agent_set_config(a, c), ALLOT_ESTATE);
	allot_config_free(c);
	allot_agent_destroy(a);
}
END_TEST

/* ---- threads acquiring while another installs configs ---- */

struct swap_arg {
	allot_agent *a;
	_Atomic bool *stop;
	int idx;
	uint64_t calls;
};

static void *
acquirer(void *p)
{
	struct swap_arg *x = p;
	static const char *ids[] = { "spiffe://t/a", "spiffe://t/b",
		"spiffe://t/c", "spiffe://t/zz" };
	static const char *eps[] = { "/x", "/y", NULL };
	allot_key *held[3];
	for (int i = 0; i < 3; i++)
		ck_assert_int_eq(
		    allot_key_resolve(x->a, ids[i], eps[i], &held[i]),
		    ALLOT_OK);
	allot_decision d;
	for (uint64_t n = 0; !atomic_load(x->stop); n++) {
		allot_acquire(x->a, held[n % 3], ALLOT_COST_DEFAULT, &d);
		allot_acquire_id(
		    x->a, ids[(n + (uint64_t) x->idx) % 4], eps[n % 3], 1, &d);
		x->calls += 2;
	}
	for (int i = 0; i < 3; i++)
		allot_key_release(x->a, held[i]);
	return NULL;
}

START_TEST(swap_every_ms_under_load)
{
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.log_level = ALLOT_LOG_WARNING;
	allot_agent *a;
	allot_config *c1 = mkcfg("a:400:50 b:300:5", 2, 500);
	allot_config *c2 = with_endpoint_quota(
	    "b:20:9:s c:5:5 ay:1:3", "/y", 0);
	ck_assert_int_eq(allot_agent_create(c1, &o, &a), ALLOT_OK);
	_Atomic bool stop = false;
	enum { NT = 3 };
	pthread_t th[NT];
	struct swap_arg args[NT];
	for (int i = 0; i < NT; i++) {
		args[i] = (struct swap_arg) { a, &stop, i, 0 };
		pthread_create(&th[i], NULL, acquirer, &args[i]);
	}
	int swaps = 0;
	struct timespec ms = { 0, 1000000 };
	for (int i = 0; i < 300; i++) {
		ck_assert_int_eq(
		    allot_agent_set_config(a, i % 2 ? c1 : c2), ALLOT_OK);
		swaps++;
		nanosleep(&ms, NULL);
	}
	atomic_store(&stop, true);
	uint64_t calls = 0;
	for (int i = 0; i < NT; i++) {
		pthread_join(th[i], NULL);
		calls += args[i].calls;
	}
	ck_assert_int_eq(swaps, 300);
	/* Every decision counted exactly once, wherever it was charged. */
	size_t n;
	ck_assert_int_eq(allot_stats(a, NULL, 0, &n), ALLOT_OK);
	allot_key_stats *st = calloc(n, sizeof *st);
	ck_assert_int_eq(allot_stats(a, st, n, &n), ALLOT_OK);
	uint64_t sum = 0;
	for (size_t i = 0; i < n; i++)
		sum += st[i].allowed + st[i].denied;
	free(st);
	ck_assert_uint_eq(sum, calls);
	/* And by quota: the same total. */
	uint64_t qsum = 0;
	for (uint32_t i = 0; i < a->nquotas; i++) {
		allot__ktotals t;
		allot__quota_totals(a, &a->quotas[i], &t);
		qsum += t.allowed + t.denied;
	}
	ck_assert_uint_eq(qsum, calls);
	ck_assert_uint_eq(a->nquotas, 5); /* a b default | c "a /y" */
	allot_config_free(c1);
	allot_config_free(c2);
	allot_agent_destroy(a);
}
END_TEST

struct churn_arg {
	allot_agent *a;
	_Atomic bool *stop;
	int id;
	uint64_t calls;
};

/* Decisions on many values, new ones all the time: their pool keys are
 * evicted and recycled, and their buckets with them, under the
 * decisions. */
static void *
churner(void *p)
{
	struct churn_arg *x = p;
	char id[32];
	uint64_t i = 0;
	while (!atomic_load(x->stop)) {
		snprintf(id, sizeof id, "v-%d-%llu", x->id,
		    (unsigned long long) (i++ % 400));
		allot_decision d;
		int rc = allot_acquire_id(
		    x->a, id, i % 3 ? "/y" : NULL, ALLOT_COST_DEFAULT, &d);
		ck_assert_int_eq(rc, ALLOT_OK);
		x->calls++;
	}
	return NULL;
}

/* Per-value buckets (agent/values.h) under load: three threads deciding
 * on 1,200 values through a pool of 64 keys evicted after 1 ms idle,
 * while the config flips between a shared default and a bucket per
 * value every millisecond: every decision counted once, no more values
 * held than the pool has keys, and none once the default is shared.
 * (ThreadSanitizer runs it: `scripts/test`, the threaded suites.) */
START_TEST(values_churn_under_swaps)
{
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.log_level = ALLOT_LOG_WARNING;
	o.max_unknown_keys = 64;
	o.idle_evict_ms = 1;
	static const char per_value[] =
	    "quotas:\n"
	    "  endpoint_weights: {default: 1, /y: 1}\n"
	    "  default: {tokens_per_second: 50, burst: 5, shared: false}\n";
	static const char shared[] =
	    "quotas:\n"
	    "  endpoint_weights: {default: 1, /y: 1}\n"
	    "  default: {tokens_per_second: 50, burst: 5}\n";
	char err[256];
	allot_config *c1, *c2;
	ck_assert_int_eq(allot_config_parse("v.yaml", per_value,
	                     strlen(per_value), err, sizeof err, &c1),
	    ALLOT_OK);
	ck_assert_int_eq(allot_config_parse("s.yaml", shared, strlen(shared),
	                     err, sizeof err, &c2),
	    ALLOT_OK);
	allot_agent *a;
	ck_assert_int_eq(allot_agent_create(c1, &o, &a), ALLOT_OK);
	_Atomic bool stop = false;
	enum { NT = 3 };
	pthread_t th[NT];
	struct churn_arg args[NT];
	for (int i = 0; i < NT; i++) {
		args[i] = (struct churn_arg) { a, &stop, i, 0 };
		pthread_create(&th[i], NULL, churner, &args[i]);
	}
	struct timespec ms = { 0, 1000000 };
	uint32_t most = 0;
	for (int i = 0; i < 200; i++) {
		ck_assert_int_eq(
		    allot_agent_set_config(a, i % 2 ? c2 : c1), ALLOT_OK);
		allot__agent_sweep(a, allot__agent_now(a));
		uint32_t held = allot__values_held(a);
		most = held > most ? held : most;
		nanosleep(&ms, NULL);
	}
	ck_assert_int_eq(allot_agent_set_config(a, c2), ALLOT_OK);
	atomic_store(&stop, true);
	uint64_t calls = 0;
	for (int i = 0; i < NT; i++) {
		pthread_join(th[i], NULL);
		calls += args[i].calls;
	}
	ck_assert_uint_le(most, 64);
	ck_assert_uint_eq(allot__values_held(a), 0);
	allot__ktotals t;
	allot__quota_totals(a, &a->quotas[a->default_quota], &t);
	ck_assert_uint_eq(t.allowed + t.denied, calls);
	allot_config_free(c1);
	allot_config_free(c2);
	allot_agent_destroy(a);
}
END_TEST

static Suite *
suite(void)
{
	Suite *s = suite_create("reconfig");
	TCase *tc = tcase_create("api");
	tcase_add_test(tc, add_remove_readd);
	tcase_add_test(tc, weight_and_shadow_next_acquire);
	tcase_add_test(tc, rate_change_local);
	tcase_add_test(tc, counts_follow_quota);
	tcase_add_test(tc, capacity_refused);
	tcase_add_test(tc, endpoint_quota);
	tcase_add_test(tc, ceiling_local);
	tcase_add_test(tc, ceiling_in_fallback);
	tcase_add_test(tc, ceiling_fit);
	tcase_add_test(tc, coordinator_owns_config);
	suite_add_tcase(s, tc);
	TCase *tt = tcase_create("threads");
	tcase_set_timeout(tt, 120);
	tcase_add_test(tt, swap_every_ms_under_load);
	tcase_add_test(tt, values_churn_under_swaps);
	suite_add_tcase(s, tt);
	return s;
}

ALLOT_TEST_MAIN(suite)
