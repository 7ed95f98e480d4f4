/* SPDX-License-Identifier: MIT */
/*
 * Shadow decisions and candidate values at the coordinator
 * (coordinator/state/register.c, candidate.c, render.c, the store): replicas
 * register and sync through allotd's own dispatcher (coordinator/
 * dispatch.c) on a virtual clock, with a real SQLite file behind the
 * state. Shadow would-denies land in their own metric, status field and
 * usage column, never in the denials, are neither clipped as implausible
 * nor counted as unmet demand, and are bounded as denials are; a
 * candidate below the load is charged close to what a per-request
 * global bucket would deny (computed here, request by request), one
 * above the load with nothing; a reload that changes the candidate
 * starts its evaluation again.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include <allot/allot.h>

#include "arena.h"
#include "buf.h"
#include "config.h"
#include "dispatch/dispatch.h"
#include "state/metrics.h"
#include "runner.h"
#include "state/state.h"
#include "store/store.h"

#define SVC "orders"
#define T0_MS INT64_C(1700000000000)
#define INTERVAL_NS 100000000ull /* the replicas' sync interval */

/* Key ids: 0 default, 1 a, 2 b (config order). */
static const char CFG[] = "quotas:\n"
                          "  default: {tokens_per_second: 10, burst: 20}\n"
                          "  callers:\n"
                          "    - identity: a\n"
                          "      tokens_per_second: %s\n"
                          "      burst: %s\n"
                          "      shadow: %s\n"
                          "    - identity: b\n"
                          "      tokens_per_second: 1000\n"
                          "      burst: 1000\n";

/* ---- the coordinator under test ---- */

static uint64_t vclock;
static char dir[128];
static char dbpath[200];

static uint64_t
vnow(void *ctx)
{
	(void) ctx;
	return vclock;
}

static int64_t
vwall(void *ctx)
{
	(void) ctx;
	return T0_MS + (int64_t) (vclock / 1000000u);
}

typedef struct coord {
	allot__state *st;
	allot__store *store;
	allot__metrics m;
	allot__dispatch_ctx dc;
	allot__arena ar;
	char text[512];
} coord;

/* A config of caller a at RATE/BURST, in shadow or not, with a's
 * candidate (0: none). */
static allot_config *
mkcfg(coord *c, const char *rate, const char *burst, bool shadow,
    double cand_rate, double cand_burst)
{
	snprintf(c->text, sizeof c->text, CFG, rate, burst,
	    shadow ? "true" : "false");
	allot_config *cfg;
	char err[256];
	ck_assert_msg(allot_config_parse("t.yaml", c->text, strlen(c->text),
	                  err, sizeof err, &cfg) == ALLOT_OK,
	    "%s", err);
	/* The loader of candidates is another part's: set the fields it
	 * fills (common/config.h). */
	ck_assert_str_eq(cfg->callers[0].identity, "a");
	cfg->callers[0].cand_rate = cand_rate;
	cfg->callers[0].cand_burst = cand_burst;
	return cfg;
}

static void
coord_start(coord *c, allot_config *cfg)
{
	memset(&c->m, 0, sizeof c->m);
	allot__metrics_init(&c->m);
	char err[256];
	ck_assert_int_eq(
	    allot__store_open(dbpath, NULL, NULL, err, sizeof err, &c->store),
	    ALLOT_OK);
	allot__store_set_clock(c->store, vwall, NULL);
	allot__state_opts o;
	allot__state_opts_init(&o);
	o.clock = vnow;
	o.interval_ms = 100;
	o.store = c->store;
	o.metrics = &c->m;
	ck_assert_int_eq(
	    allot__state_create(&o, cfg, "t.yaml", c->text, &c->st), ALLOT_OK);
	allot__dispatch_ctx_init(&c->dc);
	c->dc.state = c->st;
	c->dc.metrics = &c->m;
	memset(&c->ar, 0, sizeof c->ar);
	allot__state_second(c->st);
}

static void
coord_stop(coord *c)
{
	allot__state_destroy(c->st);
	allot__store_close(c->store);
	allot__arena_destroy(&c->ar);
}

/* One request through the dispatcher; the answer unpacked (malloc'd:
 * allot__v1__envelope__free_unpacked). */
static Allot__V1__Envelope *
roundtrip(coord *c, Allot__V1__Envelope *env)
{
	env->version = ALLOT__PROTOCOL_VERSION;
	size_t n = allot__v1__envelope__get_packed_size(env);
	uint8_t *buf = malloc(n ? n : 1);
	ck_assert_ptr_nonnull(buf);
	allot__v1__envelope__pack(env, buf);
	ProtobufCAllocator pa = { allot__arena_alloc, allot__arena_free,
		&c->ar };
	allot__dispatch_req req = {
		.buf = buf, .len = n, .now = vclock, .pa = &pa
	};
	allot__dispatch_result res;
	ck_assert_int_eq(allot__dispatch(&c->dc, &req, &res), ALLOT_OK);
	ck_assert_msg(
	    res.code == ALLOT__V1__ERROR__CODE__UNSPECIFIED, "%s", res.err);
	Allot__V1__Envelope *out = allot__v1__envelope__unpack(
	    NULL, res.answer_len, res.answer);
	ck_assert_ptr_nonnull(out);
	allot__arena_reset(&c->ar);
	free(buf);
	return out;
}

static char *KEYS[] = { "default", "a", "b" };

typedef struct rep {
	uint64_t session;
	uint64_t seq;
} rep;

static void
reg(coord *c, rep *r, const char *id)
{
	Allot__V1__Register rq = ALLOT__V1__REGISTER__INIT;
	rq.replica_id = (char *) id;
	rq.service = SVC;
	rq.host = "h";
	rq.pid = 1;
	rq.agent_version = "test";
	rq.keys = KEYS;
	rq.n_keys = 3;
	rq.sync_interval_ms = 100;
	Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_REGISTER;
	env.register_ = &rq;
	Allot__V1__Envelope *out = roundtrip(c, &env);
	ck_assert_int_eq(out->body_case, ALLOT__V1__ENVELOPE__BODY_WELCOME);
	r->session = out->welcome->session;
	r->seq = 0;
	allot__v1__envelope__free_unpacked(out, NULL);
}

/* One report per key id 1 (a) and 2 (b); `digest` is what the agent says
 * it enforces (0: not said). */
typedef struct kr {
	uint64_t consumed, denied, shadow;
} kr;

/* Returns Reply.rejected_reports. */
static uint32_t
sync1(coord *c, rep *r, kr a, kr b, uint64_t digest)
{
	Allot__V1__KeyReport ka = ALLOT__V1__KEY_REPORT__INIT;
	Allot__V1__KeyReport kb = ALLOT__V1__KEY_REPORT__INIT;
	ka.key = 1;
	ka.consumed = a.consumed;
	ka.denied = a.denied;
	ka.shadow_denied = a.shadow;
	ka.demand = (a.consumed + a.denied) * 10;
	kb.key = 2;
	kb.consumed = b.consumed;
	kb.denied = b.denied;
	kb.shadow_denied = b.shadow;
	kb.demand = (b.consumed + b.denied) * 10;
	Allot__V1__KeyReport *reps[] = { &ka, &kb };
	Allot__V1__Sync sy = ALLOT__V1__SYNC__INIT;
	sy.session = r->session;
	sy.seq = ++r->seq;
	sy.elapsed_ms = 100;
	sy.reports = reps;
	sy.n_reports = 2;
	sy.config_digest = digest;
	Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_SYNC;
	env.sync = &sy;
	Allot__V1__Envelope *out = roundtrip(c, &env);
	ck_assert_int_eq(out->body_case, ALLOT__V1__ENVELOPE__BODY_REPLY);
	uint32_t rejected = out->reply->rejected_reports;
	allot__v1__envelope__free_unpacked(out, NULL);
	return rejected;
}

/* The loop thread's periodic work at virtual time `vclock`. */
static void
periodic(coord *c, bool second)
{
	allot__state_tick(c->st);
	if (second) {
		allot__state_second(c->st);
		ck_assert_int_eq(allot__store_flush(c->store), ALLOT_OK);
	}
}

/* ---- reading what it shows ---- */

static char *
render(coord *c, bool metrics)
{
	allot__buf b = { 0 };
	if (metrics)
		allot__state_render_metrics(c->st, &b);
	else
		allot__state_render_status(c->st, &b);
	ck_assert(!b.oom);
	return b.p;
}

/* The value of series `name` for quota `q` of SVC in /metrics text. */
static double
metric(const char *text, const char *name, const char *q)
{
	char pat[160];
	snprintf(
	    pat, sizeof pat, "%s{service=\"" SVC "\",quota=\"%s\"} ", name, q);
	const char *p = strstr(text, pat);
	ck_assert_msg(p != NULL, "no %s in /metrics", pat);
	return strtod(p + strlen(pat), NULL);
}

/* In /status: the object of quota `q` of SVC's quota list. */
static const char *
status_quota(const char *doc, const char *q)
{
	const char *svc = strstr(doc, "{\"name\":\"" SVC "\"");
	ck_assert_ptr_nonnull(svc);
	char pat[64];
	snprintf(pat, sizeof pat, "{\"quota\":\"%s\"", q);
	const char *p = strstr(svc, pat);
	ck_assert_ptr_nonnull(p);
	return p;
}

/* The number after the first "field": from `from` on. */
static double
jnum(const char *from, const char *field)
{
	char pat[64];
	snprintf(pat, sizeof pat, "\"%s\":", field);
	const char *p = strstr(from, pat);
	ck_assert_msg(p != NULL, "no %s", pat);
	return strtod(p + strlen(pat), NULL);
}

static double
q_double(const char *sql)
{
	sqlite3 *db;
	ck_assert_int_eq(
	    sqlite3_open_v2(dbpath, &db, SQLITE_OPEN_READONLY, NULL),
	    SQLITE_OK);
	sqlite3_stmt *s;
	ck_assert_msg(sqlite3_prepare_v2(db, sql, -1, &s, NULL) == SQLITE_OK,
	    "%s: %s", sql, sqlite3_errmsg(db));
	ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
	double v = sqlite3_column_double(s, 0);
	sqlite3_finalize(s);
	sqlite3_close(db);
	return v;
}

static void
setup(void)
{
	snprintf(dir, sizeof dir, "/tmp/allot-shadow-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(dbpath, sizeof dbpath, "%s/allot.db", dir);
	vclock = 1000000000ull;
}

static void
teardown(void)
{
	char p[300];
	const char *sfx[] = { "", "-wal", "-shm" };
	for (int i = 0; i < 3; i++) {
		snprintf(p, sizeof p, "%s%s", dbpath, sfx[i]);
		unlink(p);
	}
	rmdir(dir);
}

/* ---- shadow ---- */

START_TEST(shadow_counted_apart)
{
	/* Caller a in shadow at 100/s: two replicas each admit 20 tokens
	 * an interval (400/s in all), 15 of which shadow would have
	 * denied; b enforces at 1,000/s: each replica admits what its
	 * share allows, 50 an interval, and is denied 3 more (a replica
	 * that admitted less than its grant refilled could not have been
	 * denied: its denials would be refuted). 5 s. */
	coord c;
	coord_start(&c, mkcfg(&c, "100", "100", true, 0, 0));
	uint64_t digest = allot__state_digest(c.st);
	rep r[2];
	reg(&c, &r[0], "r0");
	reg(&c, &r[1], "r1");
	for (int t = 1; t <= 50; t++) {
		vclock += INTERVAL_NS;
		for (int i = 0; i < 2; i++)
			sync1(&c, &r[i], (kr) { 20, 0, 15 }, (kr) { 50, 3, 0 },
			    digest);
		periodic(&c, t % 10 == 0);
	}
	uint64_t consumed = 2 * 50 * 20, shadow = 2 * 50 * 15;

	char *m = render(&c, true);
	ck_assert_double_eq(
	    metric(m, "allotd_shadow_denied_tokens_total", "a"), shadow);
	ck_assert_double_eq(metric(m, "allotd_denied_tokens_total", "a"), 0);
	/* Admitted in shadow is admitted: all of it, none clipped as more
	 * than the replicas could admit at 100/s. */
	ck_assert_double_eq(
	    metric(m, "allotd_allowed_tokens_total", "a"), consumed);
	ck_assert_uint_eq(atomic_load(&c.m.tokens_clipped), 0);
	ck_assert_uint_eq(atomic_load(&c.m.reports_clipped), 0);
	ck_assert_double_eq(metric(m, "allotd_denied_tokens_total", "b"), 300);
	ck_assert_uint_eq(atomic_load(&c.m.denial_reports_refuted), 0);
	ck_assert_double_eq(
	    metric(m, "allotd_shadow_denied_tokens_total", "b"), 0);
	/* No candidate: 0. */
	ck_assert_double_eq(
	    metric(m, "allotd_candidate_denied_tokens_total", "a"), 0);
	free(m);

	char *doc = render(&c, false);
	const char *qa = status_quota(doc, "a");
	ck_assert_double_eq(jnum(qa, "shadow_denied_total"), shadow);
	ck_assert_double_eq(jnum(qa, "denied_total"), 0);
	ck_assert_double_eq_tol(jnum(qa, "shadow_denied_per_s"), 300, 1);
	ck_assert_ptr_nonnull(strstr(qa, "\"shadow\":true"));
	ck_assert_ptr_nonnull(strstr(qa, "\"candidate\":null"));
	/* Demand is what was admitted (400/s), not admitted + shadow. */
	ck_assert_double_eq_tol(jnum(qa, "demand"), 400, 40);
	free(doc);

	allot__state_quota q;
	ck_assert_int_eq(allot__state_quota_get(c.st, SVC, 1, &q), ALLOT_OK);
	ck_assert_double_eq_tol(q.demand, 400, 40);
	coord_stop(&c);

	/* The usage rows, from the file. */
	ck_assert_double_eq(q_double("SELECT sum(shadow_denied) FROM usage "
	                             "WHERE quota = 'a'"),
	    shadow);
	ck_assert_double_eq(
	    q_double("SELECT sum(denied) FROM usage WHERE quota = 'a'"), 0);
	ck_assert_double_eq(
	    q_double("SELECT sum(admitted) FROM usage WHERE quota = 'a'"),
	    consumed);
	ck_assert_double_eq(
	    q_double("SELECT sum(denied) FROM usage WHERE quota = 'b'"), 300);
	ck_assert_double_eq(q_double("SELECT shadow_denied_pct FROM v_shadow "
	                             "WHERE quota = 'a'"),
	    75);
	ck_assert_double_eq(
	    q_double("SELECT count(*) FROM v_denied WHERE quota = 'a'"), 0);
}
END_TEST

START_TEST(shadow_after_reload_to_enforce)
{
	/* a enforces at 100/s. A replica still on the previous config
	 * (in shadow, by its digest) reports shadow would-denies beyond
	 * the allowance: booked apart, not clipped. One that says it runs
	 * the config in force is held to the allowance. */
	coord c;
	coord_start(&c, mkcfg(&c, "100", "100", false, 0, 0));
	uint64_t digest = allot__state_digest(c.st);
	rep r[2];
	reg(&c, &r[0], "old");
	reg(&c, &r[1], "cur");
	for (int t = 1; t <= 10; t++) {
		vclock += INTERVAL_NS;
		sync1(&c, &r[0], (kr) { 40, 0, 35 }, (kr) { 0 }, digest + 1);
		sync1(&c, &r[1], (kr) { 4, 0, 0 }, (kr) { 0 }, digest);
		periodic(&c, t % 10 == 0);
	}
	ck_assert_uint_eq(atomic_load(&c.m.tokens_clipped), 0);
	char *m = render(&c, true);
	ck_assert_double_eq(
	    metric(m, "allotd_shadow_denied_tokens_total", "a"), 350);
	ck_assert_double_eq(
	    metric(m, "allotd_allowed_tokens_total", "a"), 10 * 40 + 10 * 4);
	free(m);
	for (int t = 1; t <= 10; t++) {
		vclock += INTERVAL_NS;
		sync1(&c, &r[0], (kr) { 4, 0, 0 }, (kr) { 0 }, digest + 1);
		sync1(&c, &r[1], (kr) { 40, 0, 35 }, (kr) { 0 }, digest);
		periodic(&c, t % 10 == 0);
	}
	/* 400/s against a share of about 50/s plus its burst. */
	ck_assert_uint_gt(atomic_load(&c.m.tokens_clipped), 100);
	m = render(&c, true);
	/* Its shadow tokens are counted, up to what was booked admitted. */
	double sd = metric(m, "allotd_shadow_denied_tokens_total", "a");
	ck_assert(sd > 350 && sd < 700);
	ck_assert_double_eq(metric(m, "allotd_denied_tokens_total", "a"), 0);
	free(m);
	coord_stop(&c);
}
END_TEST

START_TEST(shadow_bounds)
{
	/* More would-denies than admitted tokens (a refund lowered what
	 * the agent reports consumed): no more than admitted is booked.
	 * Would-denies beyond the flood bound: the report is dropped as
	 * absurd, like denials beyond it. */
	coord c;
	coord_start(&c, mkcfg(&c, "100", "100", true, 0, 0));
	rep r;
	reg(&c, &r, "r0");
	vclock += INTERVAL_NS;
	ck_assert_uint_eq(sync1(&c, &r, (kr) { 10, 0, 50 }, (kr) { 0 }, 0), 0);
	char *m = render(&c, true);
	ck_assert_double_eq(
	    metric(m, "allotd_shadow_denied_tokens_total", "a"), 10);
	ck_assert_double_eq(metric(m, "allotd_allowed_tokens_total", "a"), 10);
	free(m);
	vclock += INTERVAL_NS;
	ck_assert_uint_eq(
	    sync1(&c, &r, (kr) { 5000000, 0, 4999990 }, (kr) { 0 }, 0), 1);
	ck_assert_uint_eq(atomic_load(&c.m.rejected[ALLOT__REJ_ABSURD]), 1);
	m = render(&c, true);
	ck_assert_double_eq(
	    metric(m, "allotd_shadow_denied_tokens_total", "a"), 10);
	free(m);
	coord_stop(&c);
}
END_TEST

/* ---- candidates ---- */

/* What a global token bucket of `rate`/`burst`, full at the start,
 * denies of the requests the test sends, request by request: `n`
 * arrivals at times t[i] (s) of one token each. */
static double
exact_denied(const double *t, size_t n, double rate, double burst)
{
	double level = burst, last = t[0], denied = 0;
	for (size_t i = 0; i < n; i++) {
		level = fmin(burst, level + rate * (t[i] - last));
		last = t[i];
		if (level >= 1)
			level -= 1;
		else
			denied += 1;
	}
	return denied;
}

/* The load of one replica in interval k (tokens): 250/s, with a burst
 * to 600/s for one second in every four (both: 510/s and 1,210/s, 685/s
 * on average). */
static uint64_t
load(int k, int replica)
{
	int sec = k / 10;
	uint64_t base = sec % 4 == 1 ? 60 : 25;
	return base + (uint64_t) replica; /* replicas differ a little */
}

START_TEST(candidate_below_and_above_load)
{
	/* a enforces 2000/s (nothing denied); its candidate is 400/s with
	 * a burst of 200. Two replicas offer 685/s on average, with
	 * bursts: the candidate would deny part of it. b carries none. */
	coord c;
	coord_start(&c, mkcfg(&c, "2000", "2000", false, 400, 200));
	rep r[2];
	reg(&c, &r[0], "r0");
	reg(&c, &r[1], "r1");
	enum { K = 200 }; /* 20 s */
	size_t cap = 2 * K * 61, n = 0;
	double *arr = malloc(cap * sizeof *arr);
	ck_assert_ptr_nonnull(arr);
	uint64_t offered = 0;
	for (int k = 0; k < K; k++) {
		/* The two replicas' requests of interval k spread evenly
		 * over it, in time order (for the exact bucket). */
		uint64_t l0 = load(k, 0), l1 = load(k, 1);
		double start = k * 0.1;
		uint64_t tot = l0 + l1;
		for (uint64_t j = 0; j < tot; j++)
			arr[n++] = start +
			    0.1 * ((double) j + 0.5) / (double) tot;
		offered += tot;
		vclock += INTERVAL_NS;
		sync1(&c, &r[0], (kr) { l0, 0, 0 }, (kr) { l0, 0, 0 }, 0);
		sync1(&c, &r[1], (kr) { l1, 0, 0 }, (kr) { l1, 0, 0 }, 0);
		periodic(&c, k % 10 == 9);
	}
	double want = exact_denied(arr, n, 400, 200);
	free(arr);
	/* Sanity: 5 busy seconds of 1,210 tokens, 15 quiet of 510. */
	ck_assert_uint_eq(offered, 5 * 1210 + 15 * 510);
	ck_assert(want > 1000);

	char *m = render(&c, true);
	double got = metric(m, "allotd_candidate_denied_tokens_total", "a");
	/* Interval-granular: within one interval of refill (40 tokens) per
	 * burst episode (5) of the per-request figure. */
	ck_assert_msg(fabs(got - want) <= 5 * 40 + 0.02 * want,
	    "candidate denied %.0f, a global bucket %.0f", got, want);
	ck_assert_double_eq(
	    metric(m, "allotd_candidate_denied_tokens_total", "b"), 0);
	/* Never booked as a denial. */
	ck_assert_double_eq(metric(m, "allotd_denied_tokens_total", "a"), 0);
	ck_assert_ptr_nonnull(strstr(
	    m, "allotd_quota_candidate_tokens_per_second{quota=\"a\"} 400"));
	free(m);

	char *doc = render(&c, false);
	const char *qa = status_quota(doc, "a");
	const char *cand = strstr(qa, "\"candidate\":{");
	ck_assert_ptr_nonnull(cand);
	ck_assert_double_eq(jnum(cand, "rate"), 400);
	ck_assert_double_eq(jnum(cand, "burst"), 200);
	ck_assert_double_eq_tol(jnum(cand, "denied"), got, 1);
	ck_assert_double_eq(jnum(cand, "offered"), (double) offered);
	ck_assert_double_eq_tol(
	    jnum(cand, "denied_pct"), 100.0 * got / (double) offered, 0.01);
	ck_assert_ptr_nonnull(
	    strstr(status_quota(doc, "b"), "\"candidate\":null"));
	free(doc);
	coord_stop(&c);

	/* The usage rows add up to the counter (fractions carried). */
	double rows = q_double("SELECT sum(candidate_denied) FROM usage "
	                       "WHERE quota = 'a'");
	ck_assert_double_eq_tol(rows, floor(got), 1);
	ck_assert_double_eq(q_double("SELECT max(candidate_rate) FROM usage "
	                             "WHERE quota = 'a'"),
	    400);
	ck_assert_double_eq_tol(
	    q_double("SELECT candidate_denied_pct FROM v_shadow "
	             "WHERE quota = 'a'"),
	    100.0 * got / (double) offered, 0.01);
	ck_assert_double_eq(q_double("SELECT count(*) FROM usage "
	                             "WHERE quota = 'b' AND "
	                             "candidate_rate IS NOT NULL"),
	    0);
}
END_TEST

START_TEST(candidate_above_load_and_reload)
{
	/* A candidate of 1,300/s over the same load (at most 1,210/s)
	 * denies nothing; a reload to 300/s starts again from a full
	 * bucket. */
	coord c;
	coord_start(&c, mkcfg(&c, "2000", "2000", false, 1300, 400));
	rep r[2];
	reg(&c, &r[0], "r0");
	reg(&c, &r[1], "r1");
	for (int k = 0; k < 100; k++) {
		vclock += INTERVAL_NS;
		sync1(&c, &r[0], (kr) { load(k, 0), 0, 0 }, (kr) { 0 }, 0);
		sync1(&c, &r[1], (kr) { load(k, 1), 0, 0 }, (kr) { 0 }, 0);
		periodic(&c, k % 10 == 9);
	}
	char *m = render(&c, true);
	ck_assert_double_eq(
	    metric(m, "allotd_candidate_denied_tokens_total", "a"), 0);
	free(m);
	char *doc = render(&c, false);
	const char *cand = strstr(status_quota(doc, "a"), "\"candidate\":{");
	ck_assert_ptr_nonnull(cand);
	ck_assert_double_eq(jnum(cand, "rate"), 1300);
	ck_assert_double_eq(jnum(cand, "denied"), 0);
	ck_assert(jnum(cand, "offered") > 0);
	free(doc);

	bool changed = false;
	ck_assert_int_eq(
	    allot__state_reload(c.st, mkcfg(&c, "2001", "2000", false, 300, 0),
	        "t.yaml", c.text, &changed),
	    ALLOT_OK);
	ck_assert(changed);
	doc = render(&c, false);
	cand = strstr(status_quota(doc, "a"), "\"candidate\":{");
	ck_assert_ptr_nonnull(cand);
	ck_assert_double_eq(jnum(cand, "rate"), 300);
	/* Without its own burst, the burst in force. */
	ck_assert_double_eq(jnum(cand, "burst"), 2000);
	ck_assert_double_eq(jnum(cand, "offered"), 0);
	ck_assert_double_eq(jnum(cand, "level"), 2000);
	free(doc);
	/* 600/s for 10 s against 300/s with 2,000 in the bucket: about
	 * 3,000 over the rate minus the burst. */
	for (int k = 0; k < 100; k++) {
		vclock += INTERVAL_NS;
		sync1(&c, &r[0], (kr) { 30, 0, 0 }, (kr) { 0 }, 0);
		sync1(&c, &r[1], (kr) { 30, 0, 0 }, (kr) { 0 }, 0);
		periodic(&c, k % 10 == 9);
	}
	m = render(&c, true);
	ck_assert_double_eq_tol(
	    metric(m, "allotd_candidate_denied_tokens_total", "a"), 1000, 40);
	free(m);
	coord_stop(&c);
	ck_assert_double_eq(q_double("SELECT count(DISTINCT candidate_rate) "
	                             "FROM usage WHERE quota = 'a'"),
	    2);
}
END_TEST

static Suite *
shadow_suite(void)
{
	Suite *s = suite_create("shadow");
	TCase *tc = tcase_create("shadow");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, shadow_counted_apart);
	tcase_add_test(tc, shadow_after_reload_to_enforce);
	tcase_add_test(tc, shadow_bounds);
	tcase_add_test(tc, candidate_below_and_above_load);
	tcase_add_test(tc, candidate_above_load_and_reload);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(shadow_suite)
