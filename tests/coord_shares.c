/* SPDX-License-Identifier: MIT */
/*
 * The coordinator suite's share cases: shares that follow the replica
 * count (join, expiry, leave) and never sum above the quota whatever the
 * order of syncs, a silent replica's grants kept out of the others'
 * headroom until its lease has certainly ended, shadow
 * would-denies counted apart from denials in /metrics, /status, allotctl
 * and the usage rows, and (in-process, no allotd) the allocator's static
 * split summing to the quota exactly.
 */
#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "allotd.h"
#include "coord_harness.h"
#include "proc.h"
#include "proto_client.h"
#include "state/alloc.h"

/* coord_cfg_good with caller b in shadow. */
static const char cfg_shadow[] = "quotas:\n"
                                 "  default:\n"
                                 "    tokens_per_second: 10\n"
                                 "    burst: 20\n"
                                 "    shared: true\n"
                                 "    priority: low\n"
                                 "  callers:\n"
                                 "    - identity: \"" QA "\"\n"
                                 "      tokens_per_second: 400\n"
                                 "      burst: 800\n"
                                 "      priority: standard\n"
                                 "    - identity: \"" QB "\"\n"
                                 "      tokens_per_second: 120\n"
                                 "      burst: 240\n"
                                 "      priority: batch\n"
                                 "      shadow: true\n";

/* The rates of quota a that the live replicas hold now. */
static double
held_sum(const pc_replica *r, const bool *alive, size_t n)
{
	double sum = 0;
	for (size_t i = 0; i < n; i++)
		if (alive[i] && !isnan(r[i].rate[1]))
			sum += r[i].rate[1];
	return sum;
}

/* The coordinator's invariant: whatever the order of syncs, the shares
 * the live replicas hold never sum above R. */
static void
assert_within(const pc_replica *r, const bool *alive, size_t n)
{
	double sum = held_sum(r, alive, n);
	ck_assert_msg(
	    sum <= RA * (1 + 1e-9), "replicas hold %.17g of %g", sum, RA);
}

static void
sync_all(pc_replica *r, const bool *alive, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (!alive[i])
			continue;
		coord_sync_ok(&r[i]);
		assert_within(r, alive, n);
	}
}

/* Sync rounds until every live replica holds R/want_n (a change settles
 * within two rounds: others shrink first, then the newcomer grows). */
static int
settle(pc_replica *r, const bool *alive, size_t n, uint32_t want_n)
{
	for (int round = 1; round <= 5; round++) {
		sync_all(r, alive, n);
		bool done = true;
		for (size_t i = 0; i < n; i++)
			if (alive[i] &&
			    (r[i].replicas != want_n ||
			        fabs(r[i].rate[1] - RA / want_n) > EPS))
				done = false;
		if (done)
			return round;
	}
	ck_abort_msg("shares did not settle at R/%u", want_n);
	return 0;
}

/* Every live replica holds R/n of a and B/n of its burst, says n
 * replicas, and the shares sum to at most R. */
static void
assert_split(const pc_replica *r, const bool *alive, size_t n, uint32_t want_n,
    double rate, double burst)
{
	double sum = 0, sumb = 0;
	for (size_t i = 0; i < n; i++) {
		if (!alive[i])
			continue;
		ck_assert_msg(r[i].replicas == want_n,
		    "%s sees %u replicas, "
		    "want %u",
		    r[i].id, r[i].replicas, want_n);
		ck_assert_double_eq_tol(r[i].rate[1], rate / want_n, EPS);
		ck_assert_double_eq_tol(r[i].burst[1], burst / want_n, EPS);
		ck_assert_double_eq_tol(r[i].rate[0], 10.0 / want_n, EPS);
		ck_assert_double_eq_tol(r[i].rate[2], 120.0 / want_n, EPS);
		ck_assert_msg(isnan(r[i].rate[3]), "unknown key got a share");
		sum += r[i].rate[1];
		sumb += r[i].burst[1];
	}
	ck_assert_msg(sum <= rate * (1 + 1e-9),
	    "shares sum to %.17g > R "
	    "%.17g",
	    sum, rate);
	ck_assert_msg(
	    sumb <= burst * (1 + 1e-9), "bursts sum to %.17g > B", sumb);
	ck_assert_double_eq_tol(sum, rate, 1e-6);
}

START_TEST(test_shares_follow_replicas)
{
	coord c;
	coord_init(&c, coord_cfg_good);
	coord_start(&c, NULL);
	pc_replica r[6];
	bool alive[6] = { true, true, true, true, false, false };
	static const char *const ids[6] = { "r0", "r1", "r2", "r3", "r4",
		"r5" };

	for (size_t i = 0; i < 4; i++) {
		coord_join(&r[i], &c, ids[i]);
		ck_assert_uint_eq(r[i].replicas, i + 1);
		ck_assert_uint_eq(r[i].lease_ms, 3000);
		ck_assert_uint_eq(r[i].epoch, 1);
		/* The identity without a quota is named in the Welcome. */
		ck_assert_uint_eq(r[i].nunknown, 1);
		ck_assert_uint_eq(r[i].unknown[0], 3);
		/* A newcomer gets at most its share, and only out of what
		 * the others do not hold: nobody has synced yet, so the
		 * first holds R and the later ones nothing. */
		ck_assert(r[i].rate[1] <= RA / (i + 1) + EPS);
		ck_assert_double_eq_tol(r[i].rate[1], i == 0 ? RA : 0, EPS);
		assert_within(r, alive, i + 1);
		if (i > 0)
			ck_assert_uint_gt(r[i].session, r[i - 1].session);
	}
	/* Earlier replicas shrink on their next sync, later ones grow. */
	ck_assert_int_le(settle(r, alive, 6, 4), 2);
	assert_split(r, alive, 6, 4, RA, BA);
	ck_assert_double_eq(
	    coord_metric(&c, "allotd_replicas{service=\"" SVC "\"}"), 4);
	ck_assert_double_eq_tol(
	    coord_metric(&c,
	        "allotd_allowance_tokens_per_second{service=\"" SVC
	        "\",quota=\"" QA "\"}"),
	    RA, EPS);
	ck_assert_double_eq(
	    coord_metric(&c, "allotd_register_unknown_keys_total"), 4);

	/* r3 exits without a Leave (its connection closes): it goes two
	 * intervals after it was last heard (not after K = 5: a closed
	 * connection is an exited replica; test_alloc's
	 * state_closed_goes_early times both on a virtual clock), and,
	 * gone, it holds nothing, so the others split R at once. (One
	 * silent on an open connection may be cut off and admitting:
	 * test_silent_replica_held.) */
	alive[3] = false;
	pc_replica_close(&r[3]);
	uint64_t t0 = pc_now_ms();
	for (;;) {
		sync_all(r, alive, 6);
		if (r[0].replicas == 3)
			break;
		ck_assert_msg(pc_now_ms() - t0 < 3000, "r3 never expired");
		pc_sleep_ms(50);
	}
	uint64_t took = pc_now_ms() - t0;
	printf("closed connection: gone after %llu ms\n",
	    (unsigned long long) took);
	ck_assert_msg(took >= 150, "expired after only %llu ms",
	    (unsigned long long) took);
	ck_assert_int_le(settle(r, alive, 6, 3), 2);
	assert_split(r, alive, 6, 3, RA, BA);
	ck_assert(coord_metric(&c,
	              "allotd_allowance_tokens_per_second{service=\"" SVC
	              "\",quota=\"" QA "\"}") <= RA);
	/* Its session is gone: a Sync naming it is refused. */
	ck_assert_int_eq(pc_open(&r[3].c, c.url, 2000), 0);
	ck_assert_int_eq(pc_replica_sync(&r[3], NULL, 0, NULL),
	    ALLOT__V1__ERROR__CODE__UNKNOWN_SESSION);
	ck_assert(coord_log_contains(&c, "ALLOTD-EXPIRE"));
	ck_assert_double_eq(
	    coord_metric(&c, "allotd_replica_events_total{kind=\"expiry\"}"),
	    1);

	/* Two more join: R/5 each, never above R on the way. */
	coord_join(&r[4], &c, ids[4]);
	alive[4] = true;
	assert_within(r, alive, 6);
	coord_join(&r[5], &c, ids[5]);
	alive[5] = true;
	assert_within(r, alive, 6);
	ck_assert_uint_eq(r[5].replicas, 5);
	ck_assert_int_le(settle(r, alive, 6, 5), 2);
	assert_split(r, alive, 6, 5, RA, BA);
	ck_assert_double_eq(
	    coord_metric(&c, "allotd_replicas{service=\"" SVC "\"}"), 5);
	ck_assert(coord_metric(&c,
	              "allotd_allowance_tokens_per_second{service=\"" SVC
	              "\",quota=\"" QA "\"}") <= RA);

	/* /status lists the replicas and each quota's shares. */
	int status = 0;
	char *js = pc_http_get(c.http, "/status", &status);
	ck_assert_int_eq(status, 200);
	ck_assert_ptr_nonnull(strstr(js, "\"epoch\":1"));
	ck_assert_ptr_nonnull(strstr(js, "\"live_replicas\":5"));
	ck_assert_ptr_nonnull(strstr(js, "\"replica_id\":\"r5\""));
	ck_assert_ptr_nonnull(strstr(js,
	    "\"quota\":\"" QA "\",\"rate\":400,"
	    "\"burst\":800,\"priority\":\"standard\",\"sum_rate\":400"));
	free(js);

	for (size_t i = 0; i < 6; i++)
		pc_replica_close(&r[i]);
	ck_assert_int_eq(pc_coord_stop(&c, SIGTERM, 5000), 0);
	coord_done(&c);
}
END_TEST

/* A replica that stops syncing with its connection still open (hung, or
 * cut off and still admitting on its grants) expires, but its grants
 * stay out of the others' headroom until its lease has certainly ended
 * (allotd's default --hold-expired lease): the replicas allotd can reach
 * never hold more than R minus what the silent one may still use. */
START_TEST(test_silent_replica_held)
{
	coord c;
	coord_init(&c, coord_cfg_good);
	static const char *const extra[] = { "--lease-ms", "1000", NULL };
	coord_start(&c, extra);
	pc_replica r[3];
	bool alive[3] = { true, true, true };
	static const char *const ids[3] = { "h0", "h1", "h2" };
	for (size_t i = 0; i < 3; i++)
		coord_join(&r[i], &c, ids[i]);
	ck_assert_int_le(settle(r, alive, 3, 3), 2);
	double held = r[2].rate[1];
	ck_assert_double_gt(held, 0);

	/* h2 goes silent; its connection stays open. */
	alive[2] = false;
	uint64_t t0 = pc_now_ms();
	bool expired = false, split = false;
	double most = 0;
	for (int i = 0; i < 200 && !split; i++) {
		sync_all(r, alive, 3);
		expired |= r[0].replicas == 2;
		double sum = r[0].rate[1] + r[1].rate[1];
		split = expired && fabs(r[0].rate[1] - RA / 2) <= EPS &&
		    fabs(r[1].rate[1] - RA / 2) <= EPS;
		if (!split && sum > most)
			most = sum;
		/* Its last answer came at most an interval before t0, so its
		 * lease certainly runs until 900 ms after t0: until then the
		 * others stay within R minus its grant. */
		if (!split && pc_now_ms() - t0 < 800)
			ck_assert_msg(sum <= RA - held + EPS,
			    "after %llu ms the reachable replicas hold %.3f "
			    "of R = %g while the silent one may use %.3f",
			    (unsigned long long) (pc_now_ms() - t0), sum, RA,
			    held);
		pc_sleep_ms(50);
	}
	uint64_t took = pc_now_ms() - t0;
	ck_assert_msg(split, "never split between the two");
	/* Not before its lease (1 s from its last answer) had ended, and
	 * not long after (lease + one exchange timeout + a few T). */
	ck_assert_msg(took >= 900 && took <= 4000, "split after %llu ms",
	    (unsigned long long) took);
	fprintf(stderr,
	    "held: a silent replica's %.1f/s kept out for %llu ms (lease "
	    "1000 ms); the others held at most %.1f of %g meanwhile\n",
	    held, (unsigned long long) took, most, RA);
	for (size_t i = 0; i < 3; i++)
		pc_replica_close(&r[i]);
	ck_assert_int_eq(pc_coord_stop(&c, SIGTERM, 5000), 0);
	coord_done(&c);
}
END_TEST

/* Caller b in shadow: two replicas admit 30 tokens of b per sync, 25 of
 * which enforcing would have denied (about 600/s against 120/s), while
 * a is really denied 5 per sync. The would-denies are a series, status
 * field and usage column of their own; b shows no denial, nothing is
 * clipped as more than the replicas could admit, and allotctl quotas
 * shows them in SHADOW/S. */
START_TEST(test_shadow_counted_apart)
{
	coord c;
	coord_init(&c, cfg_shadow);
	coord_start(&c, NULL);
	pc_replica r[2];
	coord_join(&r[0], &c, "s0");
	coord_join(&r[1], &c, "s1");
	int n = 0;
	uint64_t t0 = pc_now_ms();
	while (pc_now_ms() - t0 < 1500) {
		for (int i = 0; i < 2; i++) {
			pc_report rep[2] = {
				{ .key = 1, .consumed = 10, .denied = 5 },
				{ .key = 2,
				    .consumed = 30,
				    .shadow_denied = 25,
				    .demand = 300 },
			};
			ck_assert_int_eq(
			    pc_replica_sync(&r[i], rep, 2, NULL), 0);
		}
		n++;
		pc_sleep_ms(100);
	}
	char series[160];
	snprintf(series, sizeof series,
	    "allotd_shadow_denied_tokens_total{service=\"" SVC "\",quota=\"" QB
	    "\"}");
	ck_assert_double_eq(coord_metric(&c, series), 2.0 * 25 * n);
	snprintf(series, sizeof series,
	    "allotd_denied_tokens_total{service=\"" SVC "\",quota=\"" QB
	    "\"}");
	ck_assert_double_eq(coord_metric(&c, series), 0);
	snprintf(series, sizeof series,
	    "allotd_allowed_tokens_total{service=\"" SVC "\",quota=\"" QB
	    "\"}");
	ck_assert_double_eq(coord_metric(&c, series), 2.0 * 30 * n);
	snprintf(series, sizeof series,
	    "allotd_denied_tokens_total{service=\"" SVC "\",quota=\"" QA
	    "\"}");
	ck_assert_double_eq(coord_metric(&c, series), 2.0 * 5 * n);
	snprintf(series, sizeof series,
	    "allotd_shadow_denied_tokens_total{service=\"" SVC "\",quota=\"" QA
	    "\"}");
	ck_assert_double_eq(coord_metric(&c, series), 0);
	ck_assert_double_eq(
	    coord_metric(&c, "allotd_tokens_clipped_total"), 0);

	int status = 0;
	char *js = pc_http_get(c.http, "/status", &status);
	ck_assert_int_eq(status, 200);
	const char *qb = strstr(js, "{\"quota\":\"" QB "\"");
	ck_assert_ptr_nonnull(qb);
	ck_assert_ptr_nonnull(strstr(qb, "\"shadow\":true"));
	const char *f = strstr(qb, "\"shadow_denied_total\":");
	ck_assert_ptr_nonnull(f);
	ck_assert_double_eq(strtod(f + 22, NULL), 2.0 * 25 * n);
	f = strstr(qb, "\"denied_total\":");
	ck_assert_ptr_nonnull(f);
	ck_assert_double_eq(strtod(f + 15, NULL), 0);
	free(js);

	/* allotctl quotas: b's SHADOW/S (column 12) has a figure, a's is
	 * "-". */
	char cmd[700];
	const char *ctl = pc_program("tools/allotctl");
	snprintf(cmd, sizeof cmd,
	    "'%s' --http 127.0.0.1:%d quotas | awk '$2 == \"%s\" "
	    "{print $12}'",
	    ctl, c.http, QB);
	char *out = pc_shell(cmd);
	ck_assert_ptr_nonnull(out);
	ck_assert_msg(strtod(out, NULL) > 0, "SHADOW/S of b: %s", out);
	free(out);
	snprintf(cmd, sizeof cmd,
	    "'%s' --http 127.0.0.1:%d quotas | awk '$2 == \"%s\" "
	    "{print $12}'",
	    ctl, c.http, QA);
	out = pc_shell(cmd);
	ck_assert_ptr_nonnull(out);
	ck_assert_str_eq(out, "-");
	free(out);

	ck_assert_int_eq(pc_coord_stop(&c, SIGTERM, 5000), 0);
	char want[64];
	snprintf(want, sizeof want, "%d/%d/0", 2 * 30 * n, 2 * 25 * n);
	coord_assert_sql(&c,
	    "SELECT sum(admitted) || '/' || sum(shadow_denied) || '/' || "
	    "sum(denied) FROM usage WHERE quota = '" QB "'",
	    want);
	snprintf(want, sizeof want, "%d/0", 2 * 5 * n);
	coord_assert_sql(&c,
	    "SELECT sum(denied) || '/' || sum(shadow_denied) FROM usage "
	    "WHERE quota = '" QA "'",
	    want);
	coord_assert_sql(
	    &c, "SELECT shadow_denied_pct FROM v_shadow", "83.33");
	coord_assert_sql(
	    &c, "SELECT count(*) FROM v_denied WHERE quota = '" QB "'", "0");
	pc_replica_close(&r[0]);
	pc_replica_close(&r[1]);
	coord_done(&c);
}
END_TEST

/* ---- the allocator, in-process ---- */

/* The static split sums to at most R and B exactly, whatever the
 * rounding of R/n, and every participant gets (almost) R/n. */
START_TEST(test_alloc_static_split)
{
	static const double rates[] = { 400, 0.001, 1e9, 1.0 / 3, 100.1, 7e-3,
		123456.789 };
	static allot__alloc_slot slots[1000];
	allot__alloc_policy pol = { .kind = ALLOT__ALLOC_STATIC };
	ck_assert_str_eq(allot__alloc_name(&pol), "static_split");
	for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++) {
		for (size_t n = 1; n <= 1000; n += n < 20 ? 1 : 37) {
			allot__alloc_quota q = {
				.rate = rates[i],
				.burst = 2 * rates[i],
				.slots = slots,
				.nslots = n,
			};
			for (size_t j = 0; j < n; j++)
				slots[j] = (allot__alloc_slot) {
					.replica = (uint32_t) j,
					.consumed = (double) j,
				};
			allot__alloc_service svc = { .nreplicas = (uint32_t) n,
				.quotas = &q,
				.nquotas = 1 };
			ck_assert_int_eq(allot__alloc_compute(&pol, &svc), 0);
			double sum = 0, sumb = 0;
			for (size_t j = 0; j < n; j++) {
				sum += slots[j].rate;
				sumb += slots[j].burst;
				ck_assert(slots[j].rate >=
				    rates[i] / (double) n * (1 - 1e-12));
			}
			ck_assert_msg(sum <= rates[i], "R %.17g n %zu: %.17g",
			    rates[i], n, sum);
			ck_assert(sumb <= 2 * rates[i]);
			ck_assert(q.sum_rate == sum);
		}
	}
	/* No participants: nothing handed out; bad arguments refused. */
	allot__alloc_quota q0 = { .rate = 5, .burst = 5 };
	allot__alloc_service s0 = { .quotas = &q0, .nquotas = 1 };
	ck_assert_int_eq(allot__alloc_compute(&pol, &s0), 0);
	ck_assert(q0.sum_rate == 0);
	ck_assert_int_ne(allot__alloc_compute(NULL, &s0), 0);
	ck_assert_int_ne(allot__alloc_compute(&pol, NULL), 0);
}
END_TEST

void
coord_share_cases(TCase *tc)
{
	tcase_add_test(tc, test_shares_follow_replicas);
	tcase_add_test(tc, test_silent_replica_held);
	tcase_add_test(tc, test_shadow_counted_apart);
}

void
coord_alloc_cases(TCase *tc)
{
	tcase_add_test(tc, test_alloc_static_split);
}
