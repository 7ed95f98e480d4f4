/* SPDX-License-Identifier: MIT */
/*
 * A bucket per value of a descriptor entry through allot-agentd
 * (docs/sidecar.md; docs/configuration.md, "A bucket per value"): with
 * `--identity-keys user_id` and a default quota with `shared: false`,
 * each user_id value has a bucket of its own; the pool bounds them and
 * memory with them, and a value asked through two sidecars is held to
 * its quota across them by allotd.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <check.h>

#include "allotd.h"
#include "proc.h"
#include "proto_client.h"
#include "sidecar_fixture.h"

/* The sidecar's resident memory, from its /metrics. */
static double
agentd_rss(const struct agentd *a)
{
	int st = 0;
	char *m = pc_http_get(a->http_port, "/metrics", &st);
	ck_assert_ptr_nonnull(m);
	const char *p = strstr(m, "\nprocess_resident_memory_bytes ");
	ck_assert_ptr_nonnull(p);
	double v = strtod(
	    p + strlen("\nprocess_resident_memory_bytes "), NULL);
	free(m);
	return v;
}

/* A bucket per value of a descriptor entry (docs/sidecar.md): 100,000
 * distinct user_id values through one sidecar whose pool holds 4,096;
 * the first values each get their own burst, and its memory stays within
 * the documented bound (docs/configuration.md, "Memory": about 1.1 KB a
 * pool slot with per-value buckets, all of it allocated by the first
 * thousands) whatever more values come. */
START_TEST(a_bucket_per_descriptor_value)
{
	need_tools();
	struct agentd a;
	const char *args[] = { "--identity-keys", "user_id",
		"--max-unknown-keys", "4096", NULL };
	agentd_start(&a,
	    "quotas:\n"
	    "  default: {tokens_per_second: 1, burst: 2, shared: false}\n",
	    args);
	/* One value twice, another twice: each its own burst of 2. */
	char *out = py("call 127.0.0.1:%d '{\"descriptors\": ["
	               "{\"entries\": [[\"user_id\", \"u1\"]]}, "
	               "{\"entries\": [[\"user_id\", \"u1\"]]}, "
	               "{\"entries\": [[\"user_id\", \"u2\"]]}, "
	               "{\"entries\": [[\"user_id\", \"u2\"]]}, "
	               "{\"entries\": [[\"user_id\", \"u1\"]]}]}'",
	    a.grpc_port);
	ck_assert_msg(count(out, "\"code\": \"OK\"") == 4 &&
	        count(out, "\"code\": \"OVER_LIMIT\"") == 1,
	    "%s", out);
	free(out);
	/* 20,000 values fill the pool; 100,000 others run the overflow
	 * path warm; 100,000 others again must cost nothing. */
	double rss0 = agentd_rss(&a);
	out = py("values 127.0.0.1:%d 20000 user_id", a.grpc_port);
	double rss1 = agentd_rss(&a);
	ck_assert_msg(strstr(out, "\"ok\": 4096,") != NULL, "%s", out);
	free(out);
	free(py("values 127.0.0.1:%d 100000 user_id 20000", a.grpc_port));
	double rss2 = agentd_rss(&a);
	out = py("values 127.0.0.1:%d 100000 user_id 120000", a.grpc_port);
	double rss3 = agentd_rss(&a);
	fprintf(stderr,
	    "sidecar: per-value buckets, a pool of 4,096: 20,000 values "
	    "(4,096 with buckets of their own) +%.0f KB resident; 100,000 "
	    "others +%.0f KB; 100,000 others again: %s, +%.0f KB\n",
	    (rss1 - rss0) / 1024, (rss2 - rss1) / 1024, out,
	    (rss3 - rss2) / 1024);
	ck_assert_msg(strstr(out, "\"calls\": 6250") != NULL, "%s", out);
	free(out);
	/* The pool's buckets: 4,096 × about 1.1 KB (and the first calls'
	 * own memory); nothing more for values past it. (Under
	 * AddressSanitizer, whose quarantine holds every call's freed
	 * memory, resident memory says nothing of ours.) */
#if !defined(__SANITIZE_ADDRESS__)
	ck_assert(rss1 - rss0 < 4096 * 1100 + 2 * 1024 * 1024);
	ck_assert(rss3 - rss2 < 256 * 1024);
#endif
	agentd_stop(&a);
}
END_TEST

/* The "ok", "start" and "end" of a paced run's JSON. */
static void
paced_of(const char *out, int *ret_ok, double *ret_start, double *ret_end)
{
	const char *ok = strstr(out, "\"ok\": ");
	const char *st = strstr(out, "\"start\": ");
	const char *en = strstr(out, "\"end\": ");
	ck_assert_msg(ok && st && en, "%s", out);
	*ret_ok = atoi(ok + 6);
	*ret_start = strtod(st + 9, NULL);
	*ret_end = strtod(en + 7, NULL);
}

/* One value asked back to back through two sidecars of one service
 * against a real allotd: held to its quota across them (each sidecar
 * runs its part, docs/allocation.md "Per-value buckets"). */
START_TEST(a_value_on_two_sidecars)
{
	need_tools();
	static const char quotas[] =
	    "quotas:\n"
	    "  default: {tokens_per_second: 20, burst: 5, shared: false}\n";
	pc_coord c;
	pc_coord_init(&c, "/tmp/allot-test-sidecar-values", quotas);
	const char *cargs[] = { "--interval-ms", "100", NULL };
	pc_coord_spawn(&c, cargs, NULL);
	const char *extra[] = { "--coordinator", c.url, "--initial-replicas",
		"2", "--service", "values", "--identity-keys", "user_id",
		"--sync-interval-ms", "100", NULL };
	struct agentd a[2];
	for (int i = 0; i < 2; i++)
		agentd_start(&a[i], quotas, extra);
	pc_sleep_ms(600); /* both registered */
	char cmd[2048];
	snprintf(cmd, sizeof cmd,
	    "cd %s && for p in %d %d; do ALLOT_SOURCE_DIR=%s " PY
	    " tests/sidecar_client.py paced 127.0.0.1:$p 3 user_id "
	    "user-7 > /tmp/allot-paced-$p.json & done; wait; "
	    "cat /tmp/allot-paced-%d.json; echo; "
	    "cat /tmp/allot-paced-%d.json; rm -f /tmp/allot-paced-%d.json "
	    "/tmp/allot-paced-%d.json",
	    source_dir(), a[0].grpc_port, a[1].grpc_port, source_dir(),
	    a[0].grpc_port, a[1].grpc_port, a[0].grpc_port, a[1].grpc_port);
	char *out = pc_shell(cmd);
	ck_assert_ptr_nonnull(out);
	char *nl = strchr(out, '\n');
	ck_assert_msg(nl != NULL, "%s", out);
	int ok0, ok1;
	double s0, e0, s1, e1;
	paced_of(out, &ok0, &s0, &e0);
	paced_of(nl + 1, &ok1, &s1, &e1);
	double w = fmax(e0, e1) - fmin(s0, s1);
	/* R W + B, plus the second sidecar's own full bucket and one
	 * interval of R before its first part arrived. */
	double bound = 20 * w + 5 + 5 + 20 * 0.1;
	fprintf(stderr,
	    "sidecar: one value through two sidecars: %d + %d admitted in "
	    "%.2f s, bound %.0f (R = 20/s, B = 5)\n",
	    ok0, ok1, w, bound);
	ck_assert_int_le(ok0 + ok1, (int) bound);
	ck_assert_int_ge(ok0 + ok1, (int) (20 * w * 0.7));
	ck_assert(
	    pc_metric_get(c.http, "allotd_values{service=\"values\"}") == 1);
	free(out);
	for (int i = 0; i < 2; i++)
		agentd_stop(&a[i]);
	pc_coord_done(&c, 0);
}
END_TEST

TCase *
sidecar_values_tcase(void)
{
	TCase *tc = tcase_create("values");
	tcase_set_timeout(tc, 120);
	tcase_add_unchecked_fixture(tc, need_tools, NULL);
	tcase_add_test(tc, a_bucket_per_descriptor_value);
	tcase_add_test(tc, a_value_on_two_sidecars);
	return tc;
}
