/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the load generator's pure pieces (tools/loadgen.h): the
 * --caller SPEC parser and its errors, the endpoint-mix draw, the
 * loopback-only target check and the targets file, the open-loop pacer
 * (exact slot counts at integer and fractional rates, no drift, backlog
 * after a stall), the log-linear latency histogram (bucket bounds,
 * percentiles against exact order statistics, merge, clamping) and the
 * sticky target choice (rendezvous homes spread evenly and move only when
 * their replica goes, and the home share matches `sticky`). The engine
 * itself is exercised against the real example service, not here.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loadgen.h"
#include "runner.h"

/* ------------------------------------------------------------------ */
/* Caller SPEC                                                         */
/* ------------------------------------------------------------------ */

START_TEST(spec_full)
{
	lg_caller_spec s;
	char err[256] = "";

	ck_assert_int_eq(lg_caller_spec_parse(
	                     "name=checkout,cert=/c/checkout.pem,"
	                     "key=/c/checkout.key,rate=50.5,"
	                     "mix=/lookup:0.9;/export?rows=100:0.1,sticky=0.8,"
	                     "retry=off,concurrency=32,attempts=3,budget=0.2,"
	                     "max_wait=2000,throttle=on,throttle_k=1.5,"
	                     "header=X-Id: a,start=2,end=20",
	                     &s, err, sizeof err),
	    0);
	ck_assert_str_eq(s.name, "checkout");
	ck_assert_str_eq(s.cert, "/c/checkout.pem");
	ck_assert_str_eq(s.key, "/c/checkout.key");
	ck_assert_double_eq(s.rate, 50.5);
	ck_assert_uint_eq(s.nmix, 2);
	ck_assert_str_eq(s.mix[0].path, "/lookup");
	ck_assert_str_eq(s.mix[1].path, "/export?rows=100");
	ck_assert_double_eq_tol(s.mix[0].weight, 0.9, 1e-12);
	ck_assert_double_eq_tol(s.mix_total, 1.0, 1e-12);
	ck_assert_double_eq(s.sticky, 0.8);
	ck_assert(!s.retry);
	ck_assert_uint_eq(s.concurrency, 32);
	ck_assert_uint_eq(s.attempts, 3);
	ck_assert_double_eq(s.budget, 0.2);
	ck_assert_uint_eq(s.max_wait_ms, 2000);
	ck_assert(s.throttle);
	ck_assert_double_eq(s.throttle_k, 1.5);
	ck_assert_str_eq(s.header, "X-Id: a");
	ck_assert_double_eq(s.start_s, 2);
	ck_assert_double_eq(s.end_s, 20);
}
END_TEST

START_TEST(spec_defaults)
{
	lg_caller_spec s;
	char err[256] = "";

	ck_assert_int_eq(
	    lg_caller_spec_parse("rate=3,name=unknown", &s, err, sizeof err),
	    0);
	ck_assert_str_eq(s.cert, "");
	ck_assert_uint_eq(s.nmix, 1);
	ck_assert_str_eq(s.mix[0].path, "/lookup");
	ck_assert_double_eq(s.sticky, 0);
	ck_assert(s.retry);
	ck_assert(!s.throttle);
	ck_assert_uint_eq(s.concurrency, 16);
	ck_assert_uint_eq(s.attempts, 4);
	ck_assert_double_eq(s.budget, 0.1);
	ck_assert_double_eq(s.end_s, 0);
}
END_TEST

START_TEST(spec_errors)
{
	static const struct {
		const char *spec;
		const char *want; /* a fragment of the error */
	} cases[] = {
		{ "", "empty" },
		{ "rate=1", "name= is required" },
		{ "name=a", "rate= is required" },
		{ "name=a,rate=0", "rate" },
		{ "name=a,rate=-3", "rate" },
		{ "name=a,rate=1e9", "rate" },
		{ "name=a,rate=nan", "rate" },
		{ "name=a,rate=1x", "rate" },
		{ "name=a b,rate=1", "name" },
		{ "name=a,name=b,rate=1", "given twice" },
		{ "name=a,rate=1,cert=/x", "go together" },
		{ "name=a,rate=1,key=/x", "go together" },
		{ "name=a,rate=1,sticky=1.5", "sticky" },
		{ "name=a,rate=1,retry=maybe", "retry" },
		{ "name=a,rate=1,concurrency=0", "concurrency" },
		{ "name=a,rate=1,concurrency=5000", "concurrency" },
		{ "name=a,rate=1,attempts=0", "attempts" },
		{ "name=a,rate=1,budget=0", "budget" },
		{ "name=a,rate=1,throttle_k=0.5", "throttle_k" },
		{ "name=a,rate=1,bogus=1", "unknown key" },
		{ "name=a,rate=1,", "trailing" },
		{ "name=a,rate", "not key=value" },
		{ "name=a,rate=1,mix=", "mix" },
		{ "name=a,rate=1,mix=lookup:1", "start with '/'" },
		{ "name=a,rate=1,mix=/lookup", "PATH:WEIGHT" },
		{ "name=a,rate=1,mix=/lookup:0", "weight" },
		{ "name=a,rate=1,mix=/lookup:x", "weight" },
		{ "name=a,rate=1,mix=/a:1;", "trailing" },
		{ "name=a,rate=1,mix=/a b:1", "blank" },
		{ "name=a,rate=1,header=NoColon", "header" },
		{ "name=a,rate=1,start=5,end=3", "after start" },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		lg_caller_spec s;
		char err[256] = "";
		int rc = lg_caller_spec_parse(
		    cases[i].spec, &s, err, sizeof err);
		ck_assert_msg(rc == -1, "'%s' accepted", cases[i].spec);
		ck_assert_msg(strstr(err, cases[i].want) != NULL,
		    "'%s': error '%s' lacks '%s'", cases[i].spec, err,
		    cases[i].want);
	}
}
END_TEST

START_TEST(spec_mix_limits)
{
	char buf[1024] = "name=a,rate=1,mix=";
	lg_caller_spec s;
	char err[256];

	for (int i = 0; i < LG_MAX_MIX; i++)
		snprintf(buf + strlen(buf), sizeof buf - strlen(buf),
		    "%s/p%d:1", i ? ";" : "", i);
	ck_assert_int_eq(lg_caller_spec_parse(buf, &s, err, sizeof err), 0);
	ck_assert_uint_eq(s.nmix, LG_MAX_MIX);
	strcat(buf, ";/one-more:1");
	ck_assert_int_eq(lg_caller_spec_parse(buf, &s, err, sizeof err), -1);
	ck_assert_ptr_nonnull(strstr(err, "more than"));
	/* A ':' inside the query: the weight follows the last one. */
	ck_assert_int_eq(lg_caller_spec_parse("name=a,rate=1,mix=/q?t=1:2:3",
	                     &s, err, sizeof err),
	    0);
	ck_assert_str_eq(s.mix[0].path, "/q?t=1:2");
	ck_assert_double_eq(s.mix[0].weight, 3);
}
END_TEST

START_TEST(mix_pick_distribution)
{
	lg_caller_spec s;
	char err[256];
	lg_rng r;
	size_t hits[3] = { 0, 0, 0 };
	const size_t n = 200000;

	ck_assert_int_eq(
	    lg_caller_spec_parse("name=a,rate=1,mix=/a:0.9;/b:0.09;/c:0.01",
	        &s, err, sizeof err),
	    0);
	lg_rng_seed(&r, 42);
	for (size_t i = 0; i < n; i++)
		hits[lg_mix_pick(&s, lg_rng_double(&r))]++;
	ck_assert_double_eq_tol((double) hits[0] / n, 0.90, 0.005);
	ck_assert_double_eq_tol((double) hits[1] / n, 0.09, 0.005);
	ck_assert_double_eq_tol((double) hits[2] / n, 0.01, 0.002);
	/* The edges of [0, 1). */
	ck_assert_uint_eq(lg_mix_pick(&s, 0.0), 0);
	ck_assert_uint_eq(lg_mix_pick(&s, 0.9999999999), 2);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Targets                                                             */
/* ------------------------------------------------------------------ */

START_TEST(target_loopback_only)
{
	static const struct {
		const char *in, *out;
	} ok[] = {
		{ "https://127.0.0.1:9001", "https://127.0.0.1:9001" },
		{ "https://127.0.0.1:9001/", "https://127.0.0.1:9001" },
		{ "http://127.255.3.4", "http://127.255.3.4" },
		{ "https://localhost:8443", "https://localhost:8443" },
		{ "https://LOCALHOST:8443", "https://localhost:8443" },
		{ "https://[::1]:9001", "https://[::1]:9001" },
		/* curl normalises these IPv4 forms: judged as it would
		 * connect. */
		{ "http://127.1:80", "http://127.0.0.1:80" },
		{ "http://2130706433:80", "http://127.0.0.1:80" },
	};
	static const char *const refused[] = {
		"https://10.0.0.1:9001",
		"https://128.0.0.1:9001",
		"https://126.255.255.255:9001",
		"https://0.0.0.0:9001",
		"https://example.com",
		"https://localhost.example.com",
		"https://127.0.0.1.nip.io",
		"https://[::2]:9001",
		"https://[::ffff:10.0.0.1]:9001",
		"http://127.0.0.1@example.com/",
		"http://user:pw@127.0.0.1/",
		"ftp://127.0.0.1/",
		"file:///etc/passwd",
		"https://127.0.0.1:9001/lookup",
		"https://127.0.0.1:9001?x=1",
		"https://127.0.0.1:9001#f",
		"not a url",
		"",
	};
	char out[LG_URL_MAX + 1], err[256];

	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
		ck_assert_msg(lg_target_check(ok[i].in, out, sizeof out, err,
		                  sizeof err) == 0,
		    "%s refused: %s", ok[i].in, err);
		ck_assert_str_eq(out, ok[i].out);
	}
	for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
		err[0] = '\0';
		ck_assert_msg(lg_target_check(refused[i], out, sizeof out, err,
		                  sizeof err) == -1,
		    "%s accepted", refused[i]);
		ck_assert_msg(err[0] != '\0', "%s: no reason", refused[i]);
	}
	ck_assert_int_eq(lg_target_check("https://example.com", out,
	                     sizeof out, err, sizeof err),
	    -1);
	ck_assert_ptr_nonnull(strstr(err, "not loopback"));
}
END_TEST

static size_t warned_line[8];
static size_t nwarned;

static void
record_warning(void *ctx, size_t line, const char *msg)
{
	(void) ctx;
	(void) msg;
	if (nwarned < 8)
		warned_line[nwarned] = line;
	nwarned++;
}

START_TEST(targets_file)
{
	char out[4][LG_URL_MAX + 1];
	const char *text = "# replicas\n"
	                   "\n"
	                   "  https://127.0.0.1:9001  \n"
	                   "https://10.1.1.1:9002\n"
	                   "https://127.0.0.1:9002/\r\n"
	                   "https://127.0.0.1:9001\n"
	                   "\t# indented comment\n"
	                   "https://127.0.0.1:9003\n"
	                   "https://127.0.0.1:9004\n"
	                   "https://127.0.0.1:9005";
	size_t n;

	nwarned = 0;
	n = lg_targets_parse(text, out, 4, record_warning, NULL);
	ck_assert_uint_eq(n, 4);
	ck_assert_str_eq(out[0], "https://127.0.0.1:9001");
	ck_assert_str_eq(out[1], "https://127.0.0.1:9002");
	ck_assert_str_eq(out[2], "https://127.0.0.1:9003");
	ck_assert_str_eq(out[3], "https://127.0.0.1:9004");
	/* The non-loopback line, and the fifth target over the cap. */
	ck_assert_uint_eq(nwarned, 2);
	ck_assert_uint_eq(warned_line[0], 4);
	ck_assert_uint_eq(warned_line[1], 10);
	ck_assert_uint_eq(lg_targets_parse("", out, 4, NULL, NULL), 0);
	ck_assert_uint_eq(lg_targets_parse("#x\n\n", out, 4, NULL, NULL), 0);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Pacing                                                              */
/* ------------------------------------------------------------------ */

#define MS 1000000ull
#define SEC 1000000000ull

START_TEST(pacer_integer_rate)
{
	lg_pacer p;
	const uint64_t t0 = 5 * SEC;

	lg_pacer_init(&p, t0, 100);
	ck_assert_uint_eq(lg_pacer_take(&p, t0 - 1), 0);
	ck_assert_uint_eq(lg_pacer_take(&p, t0), 1); /* slot 0 at t0 */
	ck_assert_uint_eq(lg_pacer_take(&p, t0), 0);
	ck_assert_uint_eq(lg_pacer_next_due(&p), t0 + 10 * MS);
	ck_assert_uint_eq(lg_pacer_take(&p, t0 + 10 * MS - 1), 0);
	ck_assert_uint_eq(lg_pacer_take(&p, t0 + 10 * MS), 1);
	/* Over [t0, t0 + 10 s]: slots 0..1000. */
	ck_assert_uint_eq(lg_pacer_take(&p, t0 + 10 * SEC), 999);
	ck_assert_uint_eq(p.next, 1001);
}
END_TEST

START_TEST(pacer_no_drift)
{
	static const double rates[] = { 3, 7.3, 33.333, 0.5, 999.9, 12345.6 };

	for (size_t r = 0; r < sizeof rates / sizeof rates[0]; r++) {
		lg_pacer p;
		uint64_t got = 0, now = 0;
		const uint64_t span = 100 * SEC;

		lg_pacer_init(&p, 0, rates[r]);
		/* Wake exactly when each slot is due, as the worker does;
		 * the count over 100 s must be floor(100 * rate) + 1. */
		while (now <= span) {
			uint64_t n = lg_pacer_take(&p, now);
			/* Plain ifs: a passing ck_assert costs a message
			 * to the parent, and this loop runs a million
			 * times. */
			if (n != 1)
				ck_abort_msg("rate %g: %llu slots at %llu",
				    rates[r], (unsigned long long) n,
				    (unsigned long long) now);
			got += n;
			if (lg_pacer_next_due(&p) <= now)
				ck_abort_msg("rate %g: next slot not after "
				             "%llu",
				    rates[r], (unsigned long long) now);
			now = lg_pacer_next_due(&p);
		}
		ck_assert_uint_eq(
		    got, (uint64_t) floor(100.0 * rates[r] + 1e-9) + 1);
	}
}
END_TEST

START_TEST(pacer_stall_backlog)
{
	lg_pacer p;
	uint64_t total = 0;

	lg_pacer_init(&p, 0, 250); /* a slot every 4 ms */
	total += lg_pacer_take(&p, 0);
	/* A 1 s stall: the 250 slots due meanwhile come at once (the
	 * engine then sends what its concurrency bound allows and counts
	 * the rest as skipped). */
	total += lg_pacer_take(&p, SEC);
	ck_assert_uint_eq(total, 251);
	/* Irregular wake-ups lose and duplicate nothing. */
	for (uint64_t t = SEC; t <= 2 * SEC; t += 3 * MS + 7)
		total += lg_pacer_take(&p, t);
	total += lg_pacer_take(&p, 2 * SEC);
	ck_assert_uint_eq(total, 501);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Latency histogram                                                   */
/* ------------------------------------------------------------------ */

START_TEST(hist_buckets)
{
	uint32_t prev = 0;

	for (uint64_t v = 0; v < 64; v++) {
		ck_assert_uint_eq(lg_hist_index(v), v);
		ck_assert_uint_eq(lg_hist_upper((uint32_t) v), v);
	}
	ck_assert_uint_eq(lg_hist_index(LG_HIST_MAX_US), LG_HIST_BUCKETS - 1);
	ck_assert_uint_eq(lg_hist_upper(LG_HIST_BUCKETS - 1), LG_HIST_MAX_US);
	ck_assert_uint_eq(lg_hist_index(UINT64_MAX), LG_HIST_BUCKETS - 1);
	/* Every value lies in its bucket, the bucket is at most 1/32 of
	 * the value wide, and indices never go backwards. */
	for (uint64_t v = 1; v < LG_HIST_MAX_US; v += v / 97 + 1) {
		uint32_t i = lg_hist_index(v);
		uint64_t hi = lg_hist_upper(i);
		uint64_t lo = i == 0 ? 0 : lg_hist_upper(i - 1) + 1;
		ck_assert_uint_ge(i, prev);
		ck_assert_msg(lo <= v && v <= hi, "%llu not in [%llu, %llu]",
		    (unsigned long long) v, (unsigned long long) lo,
		    (unsigned long long) hi);
		ck_assert_uint_le(hi - lo, v / 32);
		prev = i;
	}
}
END_TEST

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
	return x < y ? -1 : x > y;
}

START_TEST(hist_percentiles)
{
	static lg_hist h, a, b;
	static uint64_t v[20000];
	static const double ps[] = { 1, 50, 90, 99, 99.9, 100 };
	const size_t n = sizeof v / sizeof v[0];
	lg_rng r;

	lg_hist_reset(&h);
	ck_assert_uint_eq(lg_hist_percentile(&h, 50), 0);
	lg_hist_reset(&a);
	lg_hist_reset(&b);
	lg_rng_seed(&r, 7);
	/* A long-tailed latency sample: 100 us to about 2 s. */
	for (size_t i = 0; i < n; i++) {
		v[i] = (uint64_t) (100.0 * exp(lg_rng_double(&r) * 10.0));
		lg_hist_add(&h, v[i]);
		lg_hist_add(i % 2 ? &a : &b, v[i]);
	}
	qsort(v, n, sizeof v[0], cmp_u64);
	for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
		size_t rank = (size_t) ceil(ps[i] * n / 100.0);
		uint64_t exact = v[rank - 1];
		uint64_t got = lg_hist_percentile(&h, ps[i]);
		/* Never below the true order statistic, at most one
		 * bucket (1/32) above it. */
		ck_assert_msg(got >= exact && got <= exact + exact / 32,
		    "p%g: got %llu, exact %llu", ps[i],
		    (unsigned long long) got, (unsigned long long) exact);
	}
	ck_assert_uint_eq(lg_hist_percentile(&h, 100), v[n - 1]);
	ck_assert_uint_eq(h.min_us, v[0]);
	lg_hist_merge(&a, &b);
	ck_assert_uint_eq(a.count, h.count);
	ck_assert_uint_eq(a.sum_us, h.sum_us);
	ck_assert_uint_eq(a.min_us, h.min_us);
	ck_assert_uint_eq(a.max_us, h.max_us);
	ck_assert_mem_eq(a.buckets, h.buckets, sizeof h.buckets);
}
END_TEST

START_TEST(hist_small_exact)
{
	static lg_hist h;

	/* 1..100 us: exact below 64, and p99 of 100 samples is the 99th. */
	lg_hist_reset(&h);
	for (uint64_t v = 1; v <= 100; v++)
		lg_hist_add(&h, v);
	ck_assert_uint_eq(lg_hist_percentile(&h, 50), 50);
	ck_assert_uint_eq(lg_hist_percentile(&h, 1), 1);
	ck_assert_uint_eq(lg_hist_percentile(&h, 99), 99);
	ck_assert_uint_eq(lg_hist_percentile(&h, 100), 100);
	/* One sample: every percentile is that sample, clamped to it. */
	lg_hist_reset(&h);
	lg_hist_add(&h, 123457);
	ck_assert_uint_eq(lg_hist_percentile(&h, 50), 123457);
	lg_hist_add(&h, UINT64_MAX);
	ck_assert_uint_eq(h.max_us, LG_HIST_MAX_US);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Sticky assignment                                                   */
/* ------------------------------------------------------------------ */

static void
make_targets(uint64_t *th, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		char url[64];
		snprintf(url, sizeof url, "https://127.0.0.1:%zu", 9001 + i);
		th[i] = lg_hash_str(url);
	}
}

START_TEST(rendezvous_spread_and_stability)
{
	uint64_t th[6];
	bool active[6] = { true, true, true, true, false, false };
	size_t per[6] = { 0 };
	const size_t callers = 4000;

	make_targets(th, 6);
	for (size_t c = 0; c < callers; c++) {
		char name[32];
		uint64_t ch;
		int home4, home3, home6;

		snprintf(name, sizeof name, "caller-%zu", c);
		ch = lg_hash_str(name);
		active[3] = true;
		active[4] = active[5] = false;
		home4 = lg_rendezvous(ch, th, active, 6);
		ck_assert_int_ge(home4, 0);
		ck_assert_int_lt(home4, 4);
		per[home4]++;
		/* One replica goes: only its callers move. */
		active[3] = false;
		home3 = lg_rendezvous(ch, th, active, 6);
		if (home4 != 3)
			ck_assert_int_eq(home3, home4);
		else
			ck_assert_int_ne(home3, 3);
		/* Two are added: callers move only onto the new ones. */
		active[3] = active[4] = active[5] = true;
		home6 = lg_rendezvous(ch, th, active, 6);
		if (home6 < 4)
			ck_assert_int_eq(home6, home4);
		per[4] += home6 >= 4;
	}
	/* Homes are spread evenly: each of 4 replicas near 1000. */
	for (size_t i = 0; i < 4; i++)
		ck_assert_msg(per[i] > 850 && per[i] < 1150,
		    "replica %zu is home to %zu of %zu", i, per[i], callers);
	/* About 2/6 of the callers moved to the two new replicas. */
	ck_assert_msg(per[4] > 1150 && per[4] < 1520, "%zu moved", per[4]);
	ck_assert_int_eq(lg_rendezvous(1, th, (bool[6]) { false }, 6), -1);
}
END_TEST

START_TEST(sticky_share)
{
	static const double stickies[] = { 0.0, 0.5, 0.8, 1.0 };
	uint64_t th[4];
	bool active[4] = { true, true, true, true };
	uint64_t ch = lg_hash_str("checkout");
	int home;
	const size_t n = 100000;

	make_targets(th, 4);
	home = lg_rendezvous(ch, th, active, 4);
	for (size_t k = 0; k < sizeof stickies / sizeof stickies[0]; k++) {
		lg_rng r;
		size_t per[4] = { 0 };
		double want_home = stickies[k] + (1 - stickies[k]) / 4;

		lg_rng_seed(&r, 1234 + k);
		for (size_t i = 0; i < n; i++)
			per[lg_pick_target(
			    &r, stickies[k], ch, th, active, 4)]++;
		ck_assert_double_eq_tol(
		    (double) per[home] / n, want_home, 0.01);
		for (size_t t = 0; t < 4; t++)
			if ((int) t != home)
				ck_assert_double_eq_tol((double) per[t] / n,
				    (1 - stickies[k]) / 4, 0.01);
	}
	/* Inactive targets are never picked, sticky or not. */
	active[home] = false;
	active[(home + 1) % 4] = false;
	{
		lg_rng r;
		lg_rng_seed(&r, 99);
		for (size_t i = 0; i < 10000; i++) {
			int t = lg_pick_target(&r, 0.8, ch, th, active, 4);
			ck_assert(t >= 0 && active[t]);
		}
		memset(active, 0, sizeof active);
		ck_assert_int_eq(
		    lg_pick_target(&r, 0.0, ch, th, active, 4), -1);
		ck_assert_int_eq(
		    lg_pick_target(&r, 1.0, ch, th, active, 4), -1);
	}
}
END_TEST

static Suite *
loadgen_suite(void)
{
	Suite *s = suite_create("loadgen");
	TCase *tc;

	tc = tcase_create("spec");
	tcase_add_test(tc, spec_full);
	tcase_add_test(tc, spec_defaults);
	tcase_add_test(tc, spec_errors);
	tcase_add_test(tc, spec_mix_limits);
	tcase_add_test(tc, mix_pick_distribution);
	suite_add_tcase(s, tc);

	tc = tcase_create("targets");
	tcase_add_test(tc, target_loopback_only);
	tcase_add_test(tc, targets_file);
	suite_add_tcase(s, tc);

	tc = tcase_create("pacer");
	tcase_add_test(tc, pacer_integer_rate);
	tcase_add_test(tc, pacer_no_drift);
	tcase_add_test(tc, pacer_stall_backlog);
	suite_add_tcase(s, tc);

	tc = tcase_create("hist");
	tcase_add_test(tc, hist_buckets);
	tcase_add_test(tc, hist_percentiles);
	tcase_add_test(tc, hist_small_exact);
	suite_add_tcase(s, tc);

	tc = tcase_create("sticky");
	tcase_add_test(tc, rendezvous_spread_and_stability);
	tcase_add_test(tc, sticky_share);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(loadgen_suite)
