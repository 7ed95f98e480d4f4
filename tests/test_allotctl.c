/* SPDX-License-Identifier: MIT */
/*
 * allotctl against a real allotd: each test that needs a coordinator
 * starts $ALLOT_BUILD_DIR/coordinator/allotd on free loopback ports with
 * a temporary quota file and database, keeps three replicas of one
 * service syncing with the raw protocol client (one caller inside its
 * quota, one flooding and denied), and runs
 * $ALLOT_BUILD_DIR/tools/allotctl as a child process, checking its
 * output, its stderr and its exit status: status, replicas, quotas,
 * shares and top-denied show the right figures; reload moves the epoch
 * on a good file and reports a bad one with FILE:LINE:COL (whether
 * allotctl or allotd catches it); check-config prints the overcommit and
 * the correlated-burst arithmetic and rejects a bad file; audit prints
 * rows from a store allotd wrote, for one file and for two; an
 * unreachable coordinator is exit 3 with a clear message; every command
 * has a manual (diff and apply too, whose own tests are in
 * test_apply.c). Every wait is bounded.
 */
#include <check.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <json-c/json.h>

#include "allotd.h"
#include "proc.h"
#include "proto_client.h"

#define SVC "checkout-api"
#define QA "spiffe://test/ns/payments/sa/checkout"
#define QB "spiffe://test/ns/batch/sa/backfill"
#define NREP 3
#define RUN_TIMEOUT_MS 20000

#define CFG_HEAD                      \
	"quotas:\n"                   \
	"  default:\n"                \
	"    tokens_per_second: 10\n" \
	"    burst: 20\n"             \
	"    priority: low\n"         \
	"  callers:\n"                \
	"    - identity: \"" QA "\"\n"

static const char cfg_good[] = CFG_HEAD "      tokens_per_second: 400\n"
                                        "      burst: 800\n"
                                        "      priority: critical\n"
                                        "    - identity: \"" QB "\"\n"
                                        "      tokens_per_second: 60\n"
                                        "      burst: 120\n"
                                        "      priority: batch\n"
                                        "  global_ceiling:\n"
                                        "    tokens_per_second: 500\n";

/* Caller A halved. */
static const char cfg_halved[] = CFG_HEAD "      tokens_per_second: 200\n"
                                          "      burst: 400\n"
                                          "      priority: critical\n"
                                          "    - identity: \"" QB "\"\n"
                                          "      tokens_per_second: 60\n"
                                          "      burst: 120\n"
                                          "      priority: batch\n"
                                          "  global_ceiling:\n"
                                          "    tokens_per_second: 500\n";

/* Line 8, column 26: a rate that is a string. */
static const char cfg_bad[] = CFG_HEAD "      tokens_per_second: fast\n"
                                       "      burst: 800\n";

static const char *const keys[] = { "default", QA, QB };
#define NKEYS 3

/* ---- allotd ---- */

/* The test's allotd (tests/support/allotd.h). */
typedef pc_coord coord;

static coord C;

static void
coord_init(coord *c)
{
	pc_coord_init(c, "/tmp/allot-ctl", cfg_good);
}

static void
coord_start(coord *c)
{
	pc_coord_spawn(c, NULL, NULL);
}

/* SIGTERM and wait for the drain (exit 0). */
static void
coord_stop(coord *c)
{
	ck_assert_int_eq(pc_coord_stop(c, SIGTERM, 10000), 0);
}

/* Kill allotd if it still runs, remove its files; fails the test when
 * its log holds a sanitizer report. */
static void
coord_done(coord *c)
{
	pc_coord_done(c, 0);
}

/* "127.0.0.1:PORT" of its HTTP listener, for allotctl --http. */
static const char *
http_addr(const coord *c)
{
	static char buf[32];
	snprintf(buf, sizeof buf, "127.0.0.1:%d", c->http);
	return buf;
}

/* ---- replicas: a thread keeps them syncing every 100 ms ---- */

static pc_driver D;

/* Caller A: 10 tokens per replica per 100 ms. Caller B floods replica 0
 * and is denied there. */
static size_t
reports(void *ctx, size_t i, pc_report *rep)
{
	(void) ctx;
	rep[0] = (pc_report) {
		.key = 1, .consumed = 10, .held = 50, .demand = 100
	};
	rep[1] = (pc_report) { .key = 2,
		.consumed = i == 0 ? 6 : 1,
		.denied = i == 0 ? 30 : 0,
		.demand = i == 0 ? 360 : 10 };
	return 2;
}

/* Per-second rate of a quota in /status, or -1. */
static double
status_rate(const coord *c, const char *quota, const char *field)
{
	int st = 0;
	char *body = pc_http_get(c->http, "/status", &st);
	double v = -1;
	char pat[160];
	snprintf(pat, sizeof pat, "\"quota\":\"%s\"", quota);
	const char *q = body ? strstr(body, pat) : NULL;
	char fpat[64];
	snprintf(fpat, sizeof fpat, "\"%s\":", field);
	const char *f = q ? strstr(q, fpat) : NULL;
	if (f != NULL)
		v = strtod(f + strlen(fpat), NULL);
	free(body);
	return v;
}

/* Three replicas "web-N" syncing, until /status has a whole second of
 * both callers' traffic and the shares have settled (three replicas,
 * R / 3 each). */
static void
driver_start(pc_driver *d, const coord *c)
{
	pc_driver_start(
	    d, c->url, "web", SVC, keys, NKEYS, NREP, 100, reports, NULL);
	uint64_t end = pc_now_ms() + 10000;
	while (status_rate(c, QA, "admitted_per_s") <= 0 ||
	    status_rate(c, QB, "denied_per_s") <= 0 ||
	    status_rate(c, QA, "sum_rate") < 399.9) {
		ck_assert_msg(pc_now_ms() < end,
		    "no traffic in /status "
		    "after 10 s");
		pc_sleep_ms(100);
	}
}

/* ---- running allotctl ---- */

typedef pc_run_result run;

/* Run allotctl with the NULL-terminated arguments. */
static run
ctl(const char *first, ...)
{
	const char *argv[40] = { pc_program("tools/allotctl") };
	size_t n = 1;
	va_list ap;
	va_start(ap, first);
	for (const char *a = first; a != NULL && n < 39;
	     a = va_arg(ap, const char *))
		argv[n++] = a;
	va_end(ap);
	argv[n] = NULL;
	return pc_run(
	    argv, C.dir[0] ? C.dir : "/tmp", NULL, NULL, NULL, RUN_TIMEOUT_MS);
}

#define assert_has(text, needle)                        \
	ck_assert_msg(strstr((text), (needle)) != NULL, \
	    "expected \"%s\" in:\n%s", (needle), (text))

#define assert_lacks(text, needle)                      \
	ck_assert_msg(strstr((text), (needle)) == NULL, \
	    "did not expect \"%s\" in:\n%s", (needle), (text))

/* The line of `text` that contains `needle` (static copy), or "". */
static const char *
line_with(const char *text, const char *needle)
{
	static char line[1024];
	const char *p = strstr(text, needle);
	line[0] = '\0';
	if (p == NULL)
		return line;
	const char *s = p;
	while (s > text && s[-1] != '\n')
		s--;
	size_t l = strcspn(s, "\n");
	snprintf(line, sizeof line, "%.*s", (int) l, s);
	return line;
}

/* Whitespace-separated field `i` (0-based) of `line`, static copy. */
static const char *
field(const char *line, int i)
{
	static char f[256];
	const char *p = line;
	for (int k = 0;; k++) {
		p += strspn(p, " \t");
		size_t l = strcspn(p, " \t");
		if (l == 0) {
			f[0] = '\0';
			return f;
		}
		if (k == i) {
			snprintf(f, sizeof f, "%.*s", (int) l, p);
			return f;
		}
		p += l;
	}
}

static double
status_epoch(const coord *c)
{
	int st = 0;
	char *body = pc_http_get(c->http, "/status", &st);
	const char *e = body ? strstr(body, "\"epoch\":") : NULL;
	double v = e ? strtod(e + 8, NULL) : -1;
	free(body);
	return v;
}

/* ---- tests ---- */

START_TEST(inspect_commands)
{
	coord_init(&C);
	coord_start(&C);
	driver_start(&D, &C);

	run r = ctl("--http", http_addr(&C), "status", NULL);
	ck_assert_msg(r.status == 0, "status: %d %s", r.status, r.err);
	assert_has(r.out, "allotd 0.1.0 at ");
	assert_has(r.out, C.cfg);
	assert_has(r.out, "epoch 1,");
	assert_has(r.out, "global ceiling 500 tokens/s");
	assert_has(r.out, SVC ": 3 replicas, admitted ");
	assert_has(r.out, "store     ok:");
	char pid[32];
	snprintf(pid, sizeof pid, "(pid %d)", (int) C.pid);
	assert_has(r.out, pid);
	pc_run_free(&r);

	/* The common options may also follow the command. */
	r = ctl("replicas", "--http", http_addr(&C), NULL);
	ck_assert_msg(r.status == 0, "replicas: %d %s", r.status, r.err);
	assert_has(r.out, "SERVICE");
	for (int i = 1; i <= NREP; i++) {
		char id[16];
		snprintf(id, sizeof id, "web-%d", i);
		const char *l = line_with(r.out, id);
		ck_assert_str_eq(field(l, 0), SVC);
		ck_assert_str_eq(field(l, 1), id);
		ck_assert_str_eq(field(l, 8), "live");
	}
	pc_run_free(&r);
	r = ctl("--http", http_addr(&C), "replicas", "no-such-service", NULL);
	ck_assert_int_eq(r.status, 0);
	assert_has(r.out, "no live replica of service \"no-such-service\"");
	pc_run_free(&r);

	r = ctl("--http", http_addr(&C), "quotas", NULL);
	ck_assert_msg(r.status == 0, "quotas: %d %s", r.status, r.err);
	const char *la = line_with(r.out, QA);
	ck_assert_str_eq(field(la, 2), "critical");
	ck_assert_str_eq(field(la, 3), "400"); /* RATE/S */
	ck_assert_str_eq(field(la, 4), "800"); /* BURST */
	double adm = strtod(field(la, 5), NULL); /* ADMITTED/S, ~300 */
	ck_assert_msg(adm >= 150 && adm <= 450, "admitted %g", adm);
	ck_assert_str_eq(field(la, 6), "0"); /* DENIED/S */
	ck_assert_str_eq(field(la, 8), "400"); /* GRANTED/S */
	ck_assert_str_eq(field(la, 9), "3/3"); /* HOLDERS */
	const char *lb = line_with(r.out, QB);
	ck_assert_str_eq(field(lb, 3), "60");
	ck_assert_double_gt(strtod(field(lb, 6), NULL), 100);
	pc_run_free(&r);

	/* Shares by full identity and by the last path segment. */
	const char *callers[] = { QA, "checkout" };
	for (int k = 0; k < 2; k++) {
		r = ctl("--http", http_addr(&C), "shares", callers[k], NULL);
		ck_assert_msg(r.status == 0, "shares: %d %s", r.status, r.err);
		assert_has(r.out,
		    QA " in service " SVC ": quota 400 "
		       "tokens/s, burst 800; 3 replicas hold 400 tokens/s "
		       "(100%)");
		for (int i = 1; i <= NREP; i++) {
			char id[16];
			snprintf(id, sizeof id, "web-%d ", i);
			const char *l = line_with(r.out, id);
			ck_assert_str_eq(field(l, 2), "133.3"); /* RATE/S */
			ck_assert_str_eq(field(l, 3), "266.7"); /* BURST */
			ck_assert_str_eq(field(l, 5), "33%");
		}
		pc_run_free(&r);
	}
	r = ctl("--http", http_addr(&C), "shares", "nobody", NULL);
	ck_assert_int_eq(r.status, 1);
	assert_has(r.err, "no quota matches \"nobody\"");
	assert_has(r.err, QB);
	pc_run_free(&r);
	/* "sa/" is in both identities. */
	r = ctl("--http", http_addr(&C), "shares", "sa/", NULL);
	ck_assert_int_eq(r.status, 1);
	assert_has(r.err, "matches 2 quotas");
	pc_run_free(&r);

	/* Only the flooding caller is denied, and it comes first. */
	r = ctl("--http", http_addr(&C), "top-denied", NULL);
	ck_assert_msg(r.status == 0, "top-denied: %d %s", r.status, r.err);
	const char *first = strchr(r.out, '\n');
	ck_assert_ptr_nonnull(first);
	ck_assert_str_eq(field(first + 1, 1), QB);
	ck_assert_double_gt(strtod(field(first + 1, 2), NULL), 100);
	assert_lacks(r.out, QA);
	pc_run_free(&r);
	r = ctl("--http", http_addr(&C), "top-denied", "-n", "0", NULL);
	ck_assert_int_eq(r.status, 2);
	pc_run_free(&r);

	/* --json: the same answers as one JSON document, numbers as
	 * numbers. */
	r = ctl("--http", http_addr(&C), "status", "--json", NULL);
	ck_assert_msg(r.status == 0, "status --json: %d %s", r.status, r.err);
	json_object *doc = json_tokener_parse(r.out), *v;
	ck_assert_msg(doc != NULL, "not JSON: %s", r.out);
	ck_assert(json_object_object_get_ex(doc, "pid", &v));
	ck_assert_int_eq(json_object_get_int(v), (int) C.pid);
	json_object_put(doc);
	pc_run_free(&r);
	r = ctl("--http", http_addr(&C), "replicas", SVC, "--json", NULL);
	ck_assert_int_eq(r.status, 0);
	doc = json_tokener_parse(r.out);
	ck_assert_msg(doc != NULL && json_object_is_type(doc, json_type_array),
	    "replicas --json: %s", r.out);
	ck_assert_int_eq((int) json_object_array_length(doc), NREP);
	ck_assert(json_object_object_get_ex(
	    json_object_array_get_idx(doc, 0), "service", &v));
	ck_assert_str_eq(json_object_get_string(v), SVC);
	json_object_put(doc);
	pc_run_free(&r);
	r = ctl("--http", http_addr(&C), "top-denied", "--json", NULL);
	ck_assert_int_eq(r.status, 0);
	doc = json_tokener_parse(r.out);
	ck_assert_msg(doc != NULL && json_object_array_length(doc) >= 1,
	    "top-denied --json: %s", r.out);
	json_object *top = json_object_array_get_idx(doc, 0);
	ck_assert(json_object_object_get_ex(top, "quota", &v));
	ck_assert_str_eq(json_object_get_string(v), QB);
	ck_assert(json_object_object_get_ex(top, "denied_per_s", &v));
	ck_assert_double_gt(json_object_get_double(v), 100);
	json_object_put(doc);
	pc_run_free(&r);
	r = ctl("--http", http_addr(&C), "shares", "checkout", "--json", NULL);
	ck_assert_int_eq(r.status, 0);
	doc = json_tokener_parse(r.out);
	ck_assert_msg(doc != NULL && json_object_array_length(doc) == 1,
	    "shares --json: %s", r.out);
	ck_assert(json_object_object_get_ex(
	    json_object_array_get_idx(doc, 0), "shares", &v));
	ck_assert_int_eq((int) json_object_array_length(v), NREP);
	json_object_put(doc);
	pc_run_free(&r);

	pc_driver_stop(&D);
	coord_done(&C);
}
END_TEST

START_TEST(reload_good_and_bad_files)
{
	coord_init(&C);
	coord_start(&C);
	ck_assert_double_eq(status_epoch(&C), 1);

	/* Unchanged: same digest, same epoch. */
	run r = ctl("--http", http_addr(&C), "reload", NULL);
	ck_assert_msg(r.status == 0, "reload: %d %s", r.status, r.err);
	assert_has(r.out, "is unchanged");
	assert_has(r.out, "epoch stays 1");
	pc_run_free(&r);

	/* A new file: epoch 2, the new rate in force; --json says so as an
	 * object. */
	pc_write_file(C.cfg, cfg_halved);
	r = ctl("--http", http_addr(&C), "reload", "--json", NULL);
	ck_assert_msg(r.status == 0, "reload: %d %s", r.status, r.err);
	json_object *doc = json_tokener_parse(r.out), *v, *to;
	ck_assert_msg(doc != NULL, "reload --json: %s", r.out);
	ck_assert(json_object_object_get_ex(doc, "changed", &v) &&
	    json_object_get_boolean(v));
	ck_assert(json_object_object_get_ex(doc, "to", &to) &&
	    json_object_object_get_ex(to, "epoch", &v));
	ck_assert_int_eq(json_object_get_int(v), 2);
	json_object_put(doc);
	pc_run_free(&r);
	ck_assert_double_eq(status_epoch(&C), 2);
	r = ctl("--http", http_addr(&C), "quotas", NULL);
	ck_assert_str_eq(field(line_with(r.out, QA), 2), "200");
	pc_run_free(&r);

	/* A bad file is reported with the loader's position, and allotd is
	 * not even signalled. */
	pc_write_file(C.cfg, cfg_bad);
	r = ctl("--http", http_addr(&C), "reload", NULL);
	ck_assert_int_eq(r.status, 1);
	char where[256];
	snprintf(where, sizeof where, "%s:8:26: ", C.cfg);
	assert_has(r.err, where);
	assert_has(r.err, "nothing was sent, allotd keeps config epoch 2");
	pc_run_free(&r);
	ck_assert_double_eq(status_epoch(&C), 2);
	ck_assert_double_eq(
	    pc_metric_get(
	        C.http, "allotd_config_reloads_total{result=\"fail\"}"),
	    0);

	/* Without the check, allotd itself refuses it, and says so. */
	r = ctl("--http", http_addr(&C), "reload", "--no-check", NULL);
	ck_assert_int_eq(r.status, 1);
	assert_has(r.err, "allotd rejected");
	assert_has(r.err, "keeps config epoch 2");
	pc_run_free(&r);
	ck_assert_double_eq(status_epoch(&C), 2);
	ck_assert_double_eq(
	    pc_metric_get(
	        C.http, "allotd_config_reloads_total{result=\"fail\"}"),
	    1);

	/* The same through a pid file. */
	pc_write_file(C.cfg, cfg_good);
	char pidfile[256], pidtext[32];
	snprintf(pidfile, sizeof pidfile, "%s/allotd.pid", C.dir);
	snprintf(pidtext, sizeof pidtext, "%d\n", (int) C.pid);
	pc_write_file(pidfile, pidtext);
	r = ctl(
	    "--http", http_addr(&C), "reload", "--pid-file", pidfile, NULL);
	ck_assert_msg(r.status == 0, "reload: %d %s", r.status, r.err);
	assert_has(r.out, "epoch 2 -> 3");
	pc_run_free(&r);

	/* Never a process that is not this allotd. */
	char self[32];
	snprintf(self, sizeof self, "%d", (int) getpid());
	r = ctl("--http", http_addr(&C), "reload", "--pid", self, NULL);
	ck_assert_int_eq(r.status, 1);
	assert_has(r.err, "refusing to signal another process");
	pc_run_free(&r);
	ck_assert_double_eq(status_epoch(&C), 3);
	coord_done(&C);
}
END_TEST

START_TEST(check_config_sizing)
{
	char ref[512];
	snprintf(ref, sizeof ref, "%s/reference.yaml", ALLOT_TEST_DATA);
	run r = ctl("check-config", ref, NULL);
	ck_assert_msg(r.status == 0, "check-config: %d %s", r.status, r.err);
	assert_has(r.out, "valid, digest ");
	assert_has(r.out, "allocation: 3 callers, 900 tokens/s in total");
	assert_has(r.out,
	    "overcommitted 1.125x (900 vs 800, 100 tokens/s "
	    "more than the ceiling)");
	assert_has(r.out, "sum(rate + burst) = 900 + 1800 = 2700 tokens");
	assert_has(r.out, "3.375x the ceiling for that second");
	const char *l = line_with(r.out, "sa/checkout");
	ck_assert_str_eq(field(l, 1), "critical");
	ck_assert_str_eq(field(l, 4), "1500"); /* FIRST_SECOND */
	pc_run_free(&r);

	/* Over a policy limit: exit 1. */
	r = ctl("check-config", "--max-overcommit", "1.1", ref, NULL);
	ck_assert_int_eq(r.status, 1);
	assert_has(r.err, "overcommit 1.125x is above --max-overcommit 1.1");
	pc_run_free(&r);

	/* --json: the same figures as numbers, the same exit statuses. */
	r = ctl("check-config", ref, "--json", NULL);
	ck_assert_msg(r.status == 0, "check-config --json: %d", r.status);
	json_object *doc = json_tokener_parse(r.out), *view, *v;
	ck_assert_msg(doc != NULL, "not JSON: %s", r.out);
	ck_assert(json_object_object_get_ex(doc, "view", &view));
	ck_assert(json_object_object_get_ex(view, "rate", &v));
	ck_assert_double_eq(json_object_get_double(v), 900);
	ck_assert(json_object_object_get_ex(view, "overcommit", &v));
	ck_assert_double_eq_tol(json_object_get_double(v), 1.125, 1e-9);
	ck_assert(json_object_object_get_ex(view, "quotas", &v));
	ck_assert_int_eq((int) json_object_array_length(v), 4);
	json_object_put(doc);
	pc_run_free(&r);
	r = ctl(
	    "check-config", "--max-overcommit", "1.1", ref, "--json", NULL);
	ck_assert_int_eq(r.status, 1);
	pc_run_free(&r);

	/* The reference's own example: 10 callers at 140/s with a burst of
	 * 280 against a service tested at 2000 requests/s. */
	char dir[] = "/tmp/allot-ctl-cfg-XXXXXX";
	ck_assert_ptr_nonnull(mkdtemp(dir));
	char ten[256];
	snprintf(ten, sizeof ten, "%s/ten.yaml", dir);
	FILE *f = fopen(ten, "w");
	ck_assert_ptr_nonnull(f);
	fputs("quotas:\n  default: {tokens_per_second: 1, burst: 2}\n"
	      "  callers:\n",
	    f);
	for (int i = 0; i < 10; i++)
		fprintf(f,
		    "    - {identity: \"spiffe://x/c%d\", "
		    "tokens_per_second: 140, burst: 280}\n",
		    i);
	fputs("  global_ceiling: {tokens_per_second: 1400}\n", f);
	ck_assert_int_eq(fclose(f), 0);
	r = ctl("check-config", "--capacity", "2000", ten, NULL);
	ck_assert_msg(r.status == 0, "check-config: %d %s", r.status, r.err);
	assert_has(r.out,
	    "= 1400 + 2800 = 4200 tokens (10 callers x "
	    "(140 + 280) = 10 x 420)");
	assert_has(r.out, "not overcommitted (1400 vs 1400, 100% allocated)");
	assert_has(r.out,
	    "the allocation is 70% of it, the correlated first "
	    "second 210% (2.1x)");
	pc_run_free(&r);

	/* A bucket per unknown caller is said as such, and not summed. */
	char pv[256];
	snprintf(pv, sizeof pv, "%s/per-value.yaml", dir);
	pc_write_file(pv,
	    "quotas:\n"
	    "  default: {tokens_per_second: 5, burst: 10, shared: false}\n"
	    "  callers:\n"
	    "    - {identity: a, tokens_per_second: 1, burst: 2}\n");
	r = ctl("check-config", pv, NULL);
	ck_assert_msg(r.status == 0, "check-config: %d %s", r.status, r.err);
	assert_has(r.out, "default (each unknown caller its own)");
	assert_has(r.out,
	    "1 tokens/s in total (and 5 more for each unknown caller: "
	    "shared: false)");
	pc_run_free(&r);
	r = ctl("check-config", pv, "--json", NULL);
	ck_assert_msg(r.status == 0, "check-config --json: %d", r.status);
	assert_has(r.out, "\"shared\":false");
	pc_run_free(&r);

	/* A bad file: the loader's FILE:LINE:COL message, exit 1. */
	char bad[256];
	snprintf(bad, sizeof bad, "%s/bad.yaml", dir);
	pc_write_file(bad, cfg_bad);
	r = ctl("check-config", bad, NULL);
	ck_assert_int_eq(r.status, 1);
	char want[512];
	snprintf(want, sizeof want,
	    "%s:8:26: quotas.callers[0]."
	    "tokens_per_second is the string \"fast\", expected a number",
	    bad);
	ck_assert_msg(
	    strncmp(r.err, want, strlen(want)) == 0, "stderr: %s", r.err);
	ck_assert_str_eq(r.out, "");
	pc_run_free(&r);
	snprintf(bad, sizeof bad, "%s/bad-burst.yaml", ALLOT_TEST_DATA);
	r = ctl("check-config", bad, NULL);
	ck_assert_int_eq(r.status, 1);
	snprintf(want, sizeof want, "%s:10:14: ", bad);
	ck_assert_msg(
	    strncmp(r.err, want, strlen(want)) == 0, "stderr: %s", r.err);
	pc_run_free(&r);
	snprintf(bad, sizeof bad, "%s/missing.yaml", dir);
	r = ctl("check-config", bad, NULL);
	ck_assert_int_eq(r.status, 1);
	assert_has(r.err, bad);
	pc_run_free(&r);
	r = ctl("check-config", NULL);
	ck_assert_int_eq(r.status, 2);
	assert_has(r.err, "Try 'allotctl help check-config'.");
	pc_run_free(&r);
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(audit_stores)
{
	coord_init(&C);
	coord_start(&C);
	driver_start(&D, &C);
	pc_sleep_ms(1200); /* one more committed second */
	pc_driver_stop(&D);
	coord_stop(&C);

	run r = ctl("audit", C.db, "--json", NULL);
	ck_assert_msg(r.status == 0, "audit --json: %d %s", r.status, r.err);
	json_object *doc = json_tokener_parse(r.out), *v;
	ck_assert_msg(doc != NULL && json_object_array_length(doc) >= 5,
	    "audit --json: %s", r.out);
	json_object *first = json_object_array_get_idx(doc, 0);
	ck_assert(json_object_object_get_ex(first, "title", &v));
	ck_assert_str_eq(json_object_get_string(v), "Configs loaded");
	ck_assert(json_object_object_get_ex(first, "rows", &v));
	ck_assert_int_ge((int) json_object_array_length(v), 1);
	json_object_put(doc);
	pc_run_free(&r);
	r = ctl("audit", C.db, NULL);
	ck_assert_msg(r.status == 0, "audit: %d %s", r.status, r.err);
	assert_has(r.out, "== Configs loaded");
	assert_has(r.out, "== Consumption per caller (tokens)");
	assert_has(r.out, "== Who was denied");
	assert_has(r.out, "== Replicas per service");
	assert_has(r.out, "== Events");
	/* Consumption: caller A admitted, nothing denied. */
	const char *cons = strstr(r.out, "== Consumption");
	const char *l = line_with(cons, QA);
	ck_assert_str_eq(field(l, 0), SVC);
	ck_assert_double_gt(strtod(field(l, 2), NULL), 100);
	ck_assert_str_eq(field(l, 3), "0");
	/* Denied: only caller B. */
	const char *den = strstr(r.out, "== Who was denied");
	const char *next = strstr(den, "\n== ");
	l = line_with(den, QB);
	ck_assert(
	    strstr(den, QB) != NULL && next != NULL && strstr(den, QB) < next);
	ck_assert(strstr(den, QA) == NULL || strstr(den, QA) > next);
	ck_assert_double_gt(strtod(field(l, 2), NULL), 100);
	/* Three sessions; they stay open in the store (the replicas did
	 * not leave, allotd stopped). */
	l = line_with(strstr(r.out, "== Replicas per service"), SVC " ");
	ck_assert_str_eq(field(l, 1), "3");
	assert_has(strstr(r.out, "== Events"), "start");
	/* Quota changes: the empty store's first config added each quota,
	 * by "start". */
	const char *qc = strstr(r.out, "== Quota changes");
	ck_assert_ptr_nonnull(qc);
	l = line_with(qc, QA);
	ck_assert_ptr_nonnull(l);
	ck_assert_msg(strstr(l, "start") != NULL && strstr(l, "added") != NULL,
	    "quota change row: %.200s", l);
	assert_has(r.out, "== Shadow and candidate quotas");
	pc_run_free(&r);

	/* Two stores at once: a "db" column names each file. */
	char copy[256], cmd[600];
	snprintf(copy, sizeof copy, "%s/copy.db", C.dir);
	snprintf(cmd, sizeof cmd, "sqlite3 '%s' \".backup '%s'\"", C.db, copy);
	ck_assert_int_eq(system(cmd), 0);
	r = ctl("audit", "--limit", "5", "--sql", C.db, copy, NULL);
	ck_assert_msg(r.status == 0, "audit: %d %s", r.status, r.err);
	assert_has(r.out, "-- SELECT");
	cons = strstr(r.out, "== Consumption");
	ck_assert_ptr_nonnull(cons);
	const char *a = strstr(cons, C.db);
	const char *b = strstr(cons, copy);
	ck_assert_ptr_nonnull(a);
	ck_assert_ptr_nonnull(b);
	ck_assert_msg(
	    strstr(cons, "\ndb ") != NULL, "no db column:\n%s", cons);
	pc_run_free(&r);

	/* A store from before the quota-change audit (schema 2): the
	 * questions it cannot answer say what it needs. */
	snprintf(
	    cmd, sizeof cmd, "sqlite3 '%s' 'PRAGMA user_version = 2'", copy);
	ck_assert_int_eq(system(cmd), 0);
	r = ctl("audit", copy, NULL);
	ck_assert_msg(r.status == 0, "audit: %d %s", r.status, r.err);
	qc = strstr(r.out, "== Quota changes");
	ck_assert_ptr_nonnull(qc);
	ck_assert_msg(strncmp(strchr(qc, '\n') + 1,
	                  "(needs store schema version 3", 29) == 0,
	    "%.200s", qc);
	pc_run_free(&r);

	/* Not a store; missing. */
	r = ctl("audit", C.cfg, NULL);
	ck_assert_int_eq(r.status, 1);
	assert_has(r.err, C.cfg);
	pc_run_free(&r);
	snprintf(copy, sizeof copy, "%s/none.db", C.dir);
	r = ctl("audit", copy, NULL);
	ck_assert_int_eq(r.status, 1);
	assert_has(r.err, "cannot open");
	pc_run_free(&r);
	coord_done(&C);
}
END_TEST

START_TEST(unreachable_coordinator)
{
	int port = pc_free_port();
	ck_assert_int_gt(port, 0);
	char addr[32], want[128];
	snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
	snprintf(want, sizeof want,
	    "allotctl: cannot reach allotd at %s: "
	    "connection refused\n",
	    addr);
	const char *cmds[][2] = { { "status", NULL }, { "replicas", NULL },
		{ "quotas", NULL }, { "shares", "x" }, { "top-denied", NULL },
		{ "reload", NULL } };
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
		run r = ctl("--http", addr, cmds[i][0], cmds[i][1], NULL);
		ck_assert_msg(
		    r.status == 3, "%s: exit %d", cmds[i][0], r.status);
		ck_assert_str_eq(r.err, want);
		ck_assert_str_eq(r.out, "");
		pc_run_free(&r);
	}
	/* The environment variable is the default address. */
	setenv("ALLOT_HTTP", addr, 1);
	run r = ctl("status", NULL);
	unsetenv("ALLOT_HTTP");
	ck_assert_int_eq(r.status, 3);
	ck_assert_str_eq(r.err, want);
	pc_run_free(&r);
	r = ctl("--http", "no-such-host.invalid:7480", "status", NULL);
	ck_assert_int_eq(r.status, 3);
	assert_has(r.err,
	    "cannot reach allotd at no-such-host.invalid:7480: "
	    "cannot resolve");
	pc_run_free(&r);
	r = ctl("--http", "127.0.0.1:99999", "status", NULL);
	ck_assert_int_eq(r.status, 2);
	pc_run_free(&r);
}
END_TEST

START_TEST(manuals)
{
	const char *cmds[] = { "status", "replicas", "quotas", "shares",
		"top-denied", "reload", "check-config", "audit", "diff",
		"apply" };
	run r = ctl("--help", NULL);
	ck_assert_int_eq(r.status, 0);
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
		assert_has(r.out, cmds[i]);
	assert_has(r.out, "EXIT STATUS");
	pc_run_free(&r);
	for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
		run a = ctl("help", cmds[i], NULL);
		run b = ctl(cmds[i], "--help", NULL);
		ck_assert_int_eq(a.status, 0);
		ck_assert_int_eq(b.status, 0);
		ck_assert_str_eq(a.out, b.out);
		char name[64];
		snprintf(name, sizeof name, "allotctl %s - ", cmds[i]);
		assert_has(a.out, name);
		assert_has(a.out, "SYNOPSIS");
		assert_has(a.out, "DESCRIPTION");
		assert_has(a.out, "EXIT STATUS");
		pc_run_free(&a);
		pc_run_free(&b);
	}
	r = ctl("help", "reload", NULL);
	assert_has(r.out, "AUTHENTICATION");
	pc_run_free(&r);
	r = ctl("help", "apply", NULL);
	assert_has(r.out, "AUTHENTICATION");
	assert_has(r.out, "--reason TEXT");
	assert_has(r.out, "--admin PATH");
	assert_has(r.out, "--margin X");
	pc_run_free(&r);
	/* Options after the file, and the ones a command does not take. */
	r = ctl("apply", "x.yaml", "--reason", "r", "--margin", "2", NULL);
	ck_assert_int_eq(r.status, 2);
	assert_has(r.err, "--margin expects a share of the capacity");
	pc_run_free(&r);
	r = ctl("diff", "x.yaml", "--reason", "r", NULL);
	ck_assert_int_eq(r.status, 2);
	assert_has(r.err, "diff does not take \"--reason\"");
	pc_run_free(&r);
	r = ctl("apply", "x.yaml", "--reason", "r", "--admin",
	    "/nonexistent/admin.sock", NULL);
	ck_assert_int_eq(r.status, 1); /* x.yaml does not exist */
	pc_run_free(&r);
	r = ctl("frobnicate", NULL);
	ck_assert_int_eq(r.status, 2);
	assert_has(r.err, "no command \"frobnicate\"");
	pc_run_free(&r);
	r = ctl("status", "--pid", "1", NULL);
	ck_assert_int_eq(r.status, 2);
	assert_has(r.err, "status does not take \"--pid\"");
	pc_run_free(&r);
}
END_TEST

static Suite *
allotctl_suite(void)
{
	Suite *s = suite_create("allotctl");
	TCase *tc = tcase_create("allotctl");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, inspect_commands);
	tcase_add_test(tc, reload_good_and_bad_files);
	tcase_add_test(tc, check_config_sizing);
	tcase_add_test(tc, audit_stores);
	tcase_add_test(tc, unreachable_coordinator);
	tcase_add_test(tc, manuals);
	suite_add_tcase(s, tc);
	return s;
}

int
main(void)
{
	SRunner *sr = srunner_create(allotctl_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
