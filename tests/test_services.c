/* SPDX-License-Identifier: MIT */
/*
 * One allotd, one quota file, several services (docs/configuration.md,
 * "Services"): a real allotd loads tests/data/services.yaml and raw
 * protocol replicas of three services register the same keys. Each
 * service is allocated from its own view: a caller scoped to service
 * "search" has no quota for "billing" or for a service the file does not
 * name, billing's override of a top-level caller and of the default is
 * what billing's replicas are granted while search keeps the top-level
 * values, the endpoint quota is its own key, and /metrics shows each
 * service its own quotas once. A reload that changes billing's override
 * moves billing's grant and leaves search's alone.
 */
#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "allotd.h"
#include "proc.h"
#include "proto_client.h"
#include "runner.h"

#define DATA(f) ALLOT_TEST_DATA "/" f

#define REPORTING "spiffe://prod.example.internal/ns/analytics/sa/reporting"
#define INDEXER "spiffe://prod.example.internal/ns/search/sa/indexer"
#define CHECKOUT "spiffe://prod.example.internal/ns/payments/sa/checkout"

/* The keys every replica registers, in this order. */
enum { K_REPORTING, K_INDEXER, K_DEFAULT, K_EXPORT, NK };
static const char *const keys[NK] = { REPORTING, INDEXER, "default",
	REPORTING " /export" };

typedef pc_coord coord;

/* Spawn allotd on fresh ports with the file and store of `c`. */
static void
coord_spawn(coord *c)
{
	/* The renamed gauges under their names of 0.1 too (checked
	 * below). */
	const char *args[] = { "--interval-ms", "100", "--legacy-metric-names",
		NULL };
	pc_coord_spawn(c, args, NULL);
}

static void
coord_start(coord *c, const char *text)
{
	pc_coord_init(c, "/tmp/allot-svc", text);
	coord_spawn(c);
}

static void
coord_done(coord *c)
{
	pc_coord_done(c, 5000);
}

static bool
is_unknown(const pc_replica *r, uint32_t k)
{
	for (size_t i = 0; i < r->nunknown; i++)
		if (r->unknown[i] == k)
			return true;
	return false;
}

/* Sync every replica until key k of r holds `want` tokens/s (within
 * 1%), for at most 5 s. */
static void
await_share(pc_replica *rs, size_t n, pc_replica *r, uint32_t k, double want)
{
	uint64_t end = pc_now_ms() + 5000;
	for (;;) {
		for (size_t i = 0; i < n; i++) {
			pc_report rep[NK];
			size_t nr = 0;
			for (uint32_t j = 0; j < NK; j++)
				if (!is_unknown(&rs[i], j))
					rep[nr++] = (pc_report) { .key = j,
						.consumed = 1,
						.held = 1,
						.demand = 1 };
			int rc = pc_replica_sync(&rs[i], rep, nr, NULL);
			if (rc != 0 && pc_coord_live() != NULL) {
				char *log = pc_read_file(pc_coord_live()->log);
				fprintf(stderr, "%s\n", log ? log : "");
				free(log);
			}
			ck_assert_msg(rc == 0, "sync of %s: %d", rs[i].id, rc);
		}
		double got = r->rate[k];
		if (!isnan(got) && fabs(got - want) <= 0.01 * want)
			return;
		ck_assert_msg(pc_now_ms() < end,
		    "%s key %u holds %g tokens/s, want %g", r->id, k, got,
		    want);
		pc_sleep_ms(50);
	}
}

static void
join(pc_replica *r, const coord *c, const char *id, const char *service)
{
	memset(r, 0, sizeof *r);
	int rc = pc_replica_join(r, c->url, id, service, keys, NK);
	ck_assert_msg(rc == 0, "register %s failed: %d", id, rc);
}

START_TEST(each_service_its_view)
{
	char *text = pc_read_file(DATA("services.yaml"));
	ck_assert_ptr_nonnull(text);
	coord c;
	coord_start(&c, text);
	pc_replica r[3];
	join(&r[0], &c, "search-1", "search");
	join(&r[1], &c, "billing-1", "billing");
	join(&r[2], &c, "other-1", "checkout");

	/* The indexer is search's alone. */
	ck_assert(!is_unknown(&r[0], K_INDEXER));
	ck_assert(is_unknown(&r[1], K_INDEXER));
	ck_assert(is_unknown(&r[2], K_INDEXER));
	/* The endpoint quota is a key of its own, in every view. */
	for (size_t i = 0; i < 3; i++) {
		ck_assert(!is_unknown(&r[i], K_EXPORT));
		ck_assert(!is_unknown(&r[i], K_REPORTING));
		ck_assert(!is_unknown(&r[i], K_DEFAULT));
	}

	/* Each service is granted its view's values. */
	await_share(r, 3, &r[0], K_INDEXER, 10);
	await_share(r, 3, &r[0], K_REPORTING, 100);
	await_share(r, 3, &r[1], K_REPORTING, 20);
	await_share(r, 3, &r[2], K_REPORTING, 100);
	await_share(r, 3, &r[0], K_DEFAULT, 10);
	await_share(r, 3, &r[1], K_DEFAULT, 2);
	await_share(r, 3, &r[1], K_EXPORT, 1000.0 / 86400);

	/* /metrics: the configured quotas, a service section's own ones
	 * labelled with it; per service only the quotas of its view. */
	char *m = pc_http_get(c.http, "/metrics", NULL);
	ck_assert_ptr_nonnull(m);
	ck_assert_double_eq(
	    pc_metric(
	        m, "allotd_quota_tokens_per_second{quota=\"" REPORTING "\"}"),
	    100);
	ck_assert_double_eq(
	    pc_metric(m,
	        "allotd_quota_tokens_per_second{quota=\"" REPORTING
	        "\",service=\"billing\"}"),
	    20);
	ck_assert_double_eq_tol(
	    pc_metric(m,
	        "allotd_quota_tokens_per_second{quota=\"" REPORTING
	        " /export\"}"),
	    1000.0 / 86400, 1e-9);
	ck_assert(!isnan(pc_metric(m,
	    "allotd_allowance_tokens_per_second{service=\"search\",quota="
	    "\"" INDEXER "\"}")));
	ck_assert(isnan(pc_metric(m,
	    "allotd_allowance_tokens_per_second{service=\"billing\",quota="
	    "\"" INDEXER "\"}")));
	/* --legacy-metric-names: each renamed gauge under its old name
	 * too, the same value in the same page. */
	ck_assert_double_eq(
	    pc_metric(m, "allotd_quota_rate{quota=\"" REPORTING "\"}"), 100);
	ck_assert_double_eq(pc_metric(m,
	                        "allotd_allowance_rate{service=\"search\","
	                        "quota=\"" INDEXER "\"}"),
	    pc_metric(m,
	        "allotd_allowance_tokens_per_second{service=\"search\","
	        "quota=\"" INDEXER "\"}"));
	/* One series per (service, quota): billing's reporting once. */
	char *first = strstr(m,
	    "allotd_allowance_tokens_per_second{service=\"billing\",quota="
	    "\"" REPORTING "\"}");
	ck_assert_ptr_nonnull(first);
	ck_assert_ptr_null(strstr(first + 1,
	    "allotd_allowance_tokens_per_second{service=\"billing\",quota="
	    "\"" REPORTING "\"}"));
	free(m);

	/* A reload that changes billing's override: billing's grant moves,
	 * search keeps the top-level value. */
	char *t2 = strdup(text);
	char *at = strstr(t2, "tokens_per_second: 20\n");
	ck_assert_ptr_nonnull(at);
	memcpy(at, "tokens_per_second: 40\n", 22);
	pc_write_file(c.cfg, t2);
	kill(c.pid, SIGHUP);
	await_share(r, 3, &r[1], K_REPORTING, 40);
	await_share(r, 3, &r[0], K_REPORTING, 100);
	await_share(r, 3, &r[0], K_INDEXER, 10);
	free(t2);

	for (size_t i = 0; i < 3; i++)
		pc_replica_close(&r[i]);
	free(text);
	coord_done(&c);
}
END_TEST

/* allotctl check-config: units as written, the endpoint quota, the
 * candidate, the review metadata, and each service's view with its own
 * sizing. */
START_TEST(check_config_shows_views)
{
	char cmd[1024];
	snprintf(cmd, sizeof cmd, "'%s' check-config --capacity 2000 '%s'",
	    pc_program("tools/allotctl"), DATA("services.yaml"));
	char *out = pc_shell(cmd);
	ck_assert_ptr_nonnull(out);
	static const char *const want[] = {
		"valid, digest ",
		REPORTING " /export",
		"1000/day",
		"6000/min",
		"36000/hour",
		"4800/min+100",
		"owner team-payments; expected peak 420/s (84% of the quota); "
		"ticket=OPS-1234 tier=1; reason: Black Friday peak",
		"allocation: 2 callers and 1 endpoint quota, 600 tokens/s",
		"service search (line 36)",
		"allocation: 3 callers and 1 endpoint quota, 610 tokens/s",
		"service billing (line 42)",
		"allocation: 2 callers and 1 endpoint quota, 520 tokens/s",
		"ceiling:    600 tokens/s: not overcommitted (520 vs 600",
		"margin:     the ceiling is 30% of the tested capacity",
	};
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
		ck_assert_msg(strstr(out, want[i]) != NULL,
		    "no \"%s\" in:\n%s", want[i], out);
	/* search's caller is not in billing's table. */
	const char *billing = strstr(out, "service billing");
	ck_assert_ptr_null(strstr(billing, INDEXER));
	free(out);
}
END_TEST

static double
metric_of(const coord *c, const char *series)
{
	return pc_metric_get(c->http, series);
}

/* A restart restores each service with the quotas of its view, and an
 * endpoint quota's global bucket level as its own (not its caller's). */
START_TEST(restart_restores_per_view)
{
	char *text = pc_read_file(DATA("services.yaml"));
	ck_assert_ptr_nonnull(text);
	coord c;
	coord_start(&c, text);
	pc_replica r[2];
	join(&r[0], &c, "search-1", "search");
	join(&r[1], &c, "billing-1", "billing");
	await_share(r, 2, &r[1], K_EXPORT, 1000.0 / 86400);
	/* Billing's replica spends 40 of the 50 exports' tokens. */
	pc_report spend = {
		.key = K_EXPORT, .consumed = 40, .held = 10, .demand = 1
	};
	ck_assert_int_eq(pc_replica_sync(&r[1], &spend, 1, NULL), 0);
	const char *lvl_export = "allotd_bucket_level_tokens{service="
	                         "\"billing\",quota=\"" REPORTING
	                         " /export\"}";
	const char *lvl_caller = "allotd_bucket_level_tokens{service="
	                         "\"billing\",quota=\"" REPORTING "\"}";
	double before = metric_of(&c, lvl_export);
	ck_assert_msg(before < 20, "export level %g", before);
	pc_sleep_ms(1500); /* a per-second pass records it, then a commit */
	for (size_t i = 0; i < 2; i++)
		pc_replica_close(&r[i]);
	kill(c.pid, SIGTERM);
	ck_assert_int_eq(pc_wait_exit(c.pid, 10000), 0);

	coord_spawn(&c);
	/* Both replicas come back as placeholders of their own service. */
	ck_assert_double_eq(
	    metric_of(&c, "allotd_replicas{service=\"billing\"}"), 1);
	ck_assert_double_eq(
	    metric_of(&c, "allotd_replicas{service=\"search\"}"), 1);
	double after = metric_of(&c, lvl_export);
	ck_assert_msg(after < 20, "export level %g after restart", after);
	ck_assert_msg(metric_of(&c, lvl_caller) > 50, "caller level %g",
	    metric_of(&c, lvl_caller));
	char *m = pc_http_get(c.http, "/metrics", NULL);
	ck_assert_ptr_nonnull(m);
	ck_assert_ptr_null(strstr(m,
	    "allotd_allowance_tokens_per_second{service=\"billing\",quota="
	    "\"" INDEXER "\"}"));
	ck_assert_ptr_nonnull(strstr(m,
	    "allotd_allowance_tokens_per_second{service=\"search\",quota="
	    "\"" INDEXER "\"}"));
	free(m);
	free(text);
	coord_done(&c);
}
END_TEST

static Suite *
services_suite(void)
{
	Suite *s = suite_create("services");
	TCase *tc = tcase_create("views");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, each_service_its_view);
	tcase_add_test(tc, check_config_shows_views);
	tcase_add_test(tc, restart_restores_per_view);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(services_suite)
