/* SPDX-License-Identifier: MIT */
/*
 * The dashboard in a real browser: starts a real allotd (from
 * $ALLOT_BUILD_DIR) on free loopback ports with a temporary quota file and
 * database, keeps three replicas of one service syncing with the raw
 * protocol client from a thread (one caller well inside its quota, one
 * flooding and denied), and loads http://127.0.0.1:PORT/ in headless
 * Chromium. With --dump-dom it asserts that the page polled /status and
 * that every chart drew data (data-points > 0) with the right figures:
 * three replicas, three replica shares per quota, admitted and denied
 * rates above zero, the shadow quota's would-denies and the candidate
 * drawn and tabled apart from the denials. With --screenshot it writes
 * $ALLOT_BUILD_DIR/meson-logs/dashboard.png and asserts it is a real,
 * non-trivial PNG. It also checks that "/" carries the page with a
 * Content-Security-Policy and no reference to any other origin. Exits 77
 * (skipped) when Chromium is not installed; every wait is bounded.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <allot/allot.h>

#include "allotd.h"
#include "proc.h"
#include "proto_client.h"

#define SVC "checkout-api"
#define QA "spiffe://test/ns/payments/sa/checkout"
#define QB "spiffe://test/ns/batch/sa/backfill"
#define NREP 3
#define CHROMIUM_TIMEOUT_MS 90000

/* The default quota runs in shadow; caller A carries a candidate of
 * 150/s (well below its load of about 300/s). */
#define CFG_HEAD                         \
	"quotas:\n"                      \
	"  default:\n"                   \
	"    tokens_per_second: 10\n"    \
	"    burst: 20\n"                \
	"    priority: low\n"            \
	"    shadow: true\n"             \
	"  callers:\n"                   \
	"    - identity: \"" QA "\"\n"   \
	"      tokens_per_second: 400\n" \
	"      burst: 800\n"             \
	"      priority: critical\n"
#define CFG_CAND "      candidate: {tokens_per_second: 150, burst: 100}\n"
#define CFG_TAIL                        \
	"    - identity: \"" QB "\"\n"  \
	"      tokens_per_second: 60\n" \
	"      burst: 120\n"            \
	"      priority: batch\n"       \
	"  global_ceiling:\n"           \
	"    tokens_per_second: 500\n"
static const char cfg[] = CFG_HEAD CFG_CAND CFG_TAIL;

static const char *const keys[] = { "default", QA, QB };
#define NKEYS 3

static char chromium[512];

/* ---- allotd ---- */

/* The test's allotd (tests/support/allotd.h). */
typedef pc_coord coord;

static coord C;

static void
coord_start(coord *c)
{
	pc_coord_init(c, "/tmp/allot-dash", cfg);
	pc_coord_spawn(c, NULL, NULL);
}

static void
coord_stop(coord *c)
{
	pc_coord_done(c, 5000);
}

/* ---- replicas: a thread keeps them syncing every 100 ms ---- */

/* Caller A: 10 tokens per replica per 100 ms, about 300/s of its 400.
 * Caller B floods replica 0: 6 admitted and 30 denied per 100 ms. The
 * default quota, in shadow, admits 4 tokens per replica per 100 ms that
 * enforcing would deny (120/s). */
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
		.held = 0,
		.demand = i == 0 ? 360 : 10 };
	rep[2] = (pc_report) { .key = 0,
		.consumed = 4,
		.shadow_denied = 4,
		.held = 0,
		.demand = 40 };
	return 3;
}

/* Three replicas "web-N" syncing, until /status has per-second rates
 * (two whole seconds). */
static void
driver_start(pc_driver *d, const coord *c)
{
	pc_driver_start(
	    d, c->url, "web", SVC, keys, NKEYS, NREP, 100, reports, NULL);
	uint64_t end = pc_now_ms() + 10000;
	for (;;) {
		int st = 0;
		char *body = pc_http_get(c->http, "/status", &st);
		const char *qa = body ? strstr(body, "\"quota\":\"" QA "\"") :
		                        NULL;
		const char *ap = qa ? strstr(qa, "\"admitted_per_s\":") : NULL;
		bool ready = ap != NULL && strtod(ap + 17, NULL) > 0;
		free(body);
		if (ready && atomic_load(&d->syncs) >= 3 * NREP * 10)
			break;
		ck_assert_msg(pc_now_ms() < end,
		    "no per-second rates in "
		    "/status after 10 s");
		pc_sleep_ms(100);
	}
}

/* ---- chromium ---- */

static bool
find_chromium(void)
{
	const char *env = getenv("ALLOT_CHROMIUM");
	if (env != NULL && *env != '\0') {
		snprintf(chromium, sizeof chromium, "%s", env);
		return access(chromium, X_OK) == 0;
	}
	const char *names[] = { "chromium", "chromium-browser" };
	const char *path = getenv("PATH");
	if (path == NULL)
		path = "/usr/local/bin:/usr/bin:/bin";
	for (size_t n = 0; n < 2; n++) {
		const char *p = path;
		while (*p != '\0') {
			const char *e = strchr(p, ':');
			size_t len = e ? (size_t) (e - p) : strlen(p);
			snprintf(chromium, sizeof chromium, "%.*s/%s",
			    (int) len, p, names[n]);
			if (len > 0 && access(chromium, X_OK) == 0)
				return true;
			p += len + (e != NULL);
		}
	}
	return false;
}

/* Run chromium headless on the dashboard with `mode_args` (--dump-dom,
 * or --screenshot=... --window-size=...); stdout goes to `out`, stderr
 * to `log`. Returns its exit status; kills it (its whole process group)
 * after CHROMIUM_TIMEOUT_MS. */
static int
run_chromium(const coord *c, const char *const *mode_args, const char *out,
    const char *log)
{
	char url[64], profile[256], budget[64];
	snprintf(url, sizeof url, "http://127.0.0.1:%d/", c->http);
	snprintf(profile, sizeof profile, "%s/profile-XXXXXX", c->dir);
	ck_assert_ptr_nonnull(mkdtemp(profile));
	char udd[300];
	snprintf(udd, sizeof udd, "--user-data-dir=%s", profile);
	/* Eight seconds of page time: eight polls of /status. Virtual time
	 * stands still while a fetch is in flight, so this is about a
	 * second of real time. */
	snprintf(budget, sizeof budget, "--virtual-time-budget=8000");
	const char *argv[32] = { chromium, "--headless", "--no-sandbox",
		"--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking",
		"--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", "--hide-scrollbars", udd, budget };
	size_t n = 13;
	for (size_t i = 0; mode_args[i] != NULL && n < 30; i++)
		argv[n++] = mode_args[i];
	argv[n++] = url;
	argv[n] = NULL;
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		setpgid(0, 0);
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		int fo = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		int fl = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
		if (fo >= 0)
			dup2(fo, STDOUT_FILENO);
		if (fl >= 0)
			dup2(fl, STDERR_FILENO);
		execv(argv[0], (char *const *) argv);
		_exit(127);
	}
	setpgid(pid, pid);
	int ex = pc_wait_exit(pid, CHROMIUM_TIMEOUT_MS);
	if (ex < 0) {
		kill(-pid, SIGKILL);
		kill(pid, SIGKILL);
		pc_wait_exit(pid, 5000);
	}
	return ex;
}

/* The value of attribute `name` in the tag starting at `tag`, or NULL. */
static char *
attr(const char *tag, const char *name)
{
	const char *end = strchr(tag, '>');
	char pat[64];
	snprintf(pat, sizeof pat, " %s=\"", name);
	const char *p = strstr(tag, pat);
	if (p == NULL || (end != NULL && p > end))
		return NULL;
	p += strlen(pat);
	const char *q = strchr(p, '"');
	if (q == NULL)
		return NULL;
	char *v = malloc((size_t) (q - p) + 1);
	ck_assert_ptr_nonnull(v);
	memcpy(v, p, (size_t) (q - p));
	v[q - p] = '\0';
	return v;
}

static double
attr_num(const char *tag, const char *name)
{
	char *v = attr(tag, name);
	ck_assert_msg(v != NULL, "canvas without %s", name);
	double d = strtod(v, NULL);
	free(v);
	return d;
}

/* The <canvas ...> tag whose data-chart is `kind` and, if `quota` is not
 * NULL, whose data-quota is `quota`. */
static const char *
find_canvas(const char *dom, const char *kind, const char *quota)
{
	char want[64];
	snprintf(want, sizeof want, "data-chart=\"%s\"", kind);
	for (const char *p = strstr(dom, "<canvas"); p != NULL;
	     p = strstr(p + 1, "<canvas")) {
		const char *end = strchr(p, '>');
		const char *k = strstr(p, want);
		if (k == NULL || end == NULL || k > end)
			continue;
		if (quota == NULL)
			return p;
		char *q = attr(p, "data-quota");
		bool match = q != NULL && strcmp(q, quota) == 0;
		free(q);
		if (match)
			return p;
	}
	return NULL;
}

static char *
dump_excerpt(const char *text)
{
	static char buf[2048];
	snprintf(buf, sizeof buf, "%.2000s", text ? text : "(none)");
	return buf;
}

/* ---- tests ---- */

START_TEST(page_is_self_contained)
{
	coord_start(&C);
	int st = 0;
	char *page = pc_http_get(C.http, "/", &st);
	ck_assert_int_eq(st, 200);
	ck_assert_ptr_nonnull(page);
	ck_assert_ptr_nonnull(strstr(page, "<canvas"));
	ck_assert_ptr_nonnull(strstr(page, "fetch('/status'"));
	/* Nothing from elsewhere: no src/href attributes, no CSS imports or
	 * url() references, no absolute URLs. */
	const char *banned[] = { "src=", "href=", "@import", "url(", "http://",
		"https://", "//cdn" };
	for (size_t i = 0; i < sizeof banned / sizeof banned[0]; i++)
		ck_assert_msg(strstr(page, banned[i]) == NULL,
		    "the page references \"%s\"", banned[i]);
	free(page);
	char cmd[256];
	snprintf(cmd, sizeof cmd,
	    "curl -sS -m 5 -D - -o /dev/null "
	    "http://127.0.0.1:%d/",
	    C.http);
	char *hdr = pc_shell(cmd);
	ck_assert_ptr_nonnull(hdr);
	ck_assert_msg(strstr(hdr,
	                  "Content-Security-Policy: default-src "
	                  "'none'") != NULL,
	    "headers: %s", hdr);
	ck_assert_ptr_nonnull(strstr(hdr, "connect-src 'self'"));
	ck_assert_ptr_nonnull(strstr(hdr, "text/html"));
	free(hdr);
	/* /status still answers next to it, with what the page reads. */
	char *status = pc_http_get(C.http, "/status", &st);
	ck_assert_int_eq(st, 200);
	ck_assert_ptr_nonnull(strstr(status, "\"pid\":"));
	ck_assert_ptr_nonnull(strstr(status, "\"store\":{\"commits\":"));
	free(status);
	coord_stop(&C);
}
END_TEST

START_TEST(charts_draw_live_data)
{
	coord_start(&C);
	static pc_driver d;
	driver_start(&d, &C);

	/* /status: the default quota's shadow would-denies apart from its
	 * denials, and the candidate (or null) per quota. */
	int hst = 0;
	char *doc = pc_http_get(C.http, "/status", &hst);
	ck_assert_ptr_nonnull(doc);
	const char *qd = strstr(doc, "{\"quota\":\"default\"");
	ck_assert_ptr_nonnull(qd);
	const char *fv = strstr(qd, "\"denied_total\":");
	ck_assert_ptr_nonnull(fv);
	ck_assert_double_eq(strtod(fv + strlen("\"denied_total\":"), NULL), 0);
	fv = strstr(qd, "\"shadow_denied_total\":");
	ck_assert_ptr_nonnull(fv);
	ck_assert_double_gt(
	    strtod(fv + strlen("\"shadow_denied_total\":"), NULL), 0);
	ck_assert_ptr_nonnull(strstr(qd, "\"candidate\":null"));
	const char *qa = strstr(doc, "{\"quota\":\"" QA "\"");
	ck_assert_ptr_nonnull(qa);
	const char *cand = strstr(qa, "\"candidate\":");
	ck_assert_ptr_nonnull(cand);
	ck_assert_ptr_nonnull(strstr(cand, "\"candidate\":{\"rate\":150,"));
	free(doc);

	char dom_path[256], log_path[256];
	snprintf(dom_path, sizeof dom_path, "%s/dom.html", C.dir);
	snprintf(log_path, sizeof log_path, "%s/chromium.log", C.dir);
	const char *dump[] = { "--dump-dom", NULL };
	int ex = run_chromium(&C, dump, dom_path, log_path);
	char *dom = pc_read_file(dom_path);
	if (ex != 0 || dom == NULL || strstr(dom, "<canvas") == NULL) {
		char *log = pc_read_file(log_path);
		fprintf(stderr, "chromium log:\n%s\n", dump_excerpt(log));
		free(log);
	}
	ck_assert_msg(ex == 0, "chromium --dump-dom exited with %d", ex);
	ck_assert_ptr_nonnull(dom);

	/* The page polled and is not showing an error. */
	const char *body = strstr(dom, "<body");
	ck_assert_ptr_nonnull(body);
	double polls = attr_num(body, "data-polls");
	ck_assert_msg(polls >= 3, "only %g polls of /status", polls);
	char *err = attr(body, "data-error");
	ck_assert_msg(err != NULL && err[0] == '\0', "page error: %s", err);
	free(err);

	/* Replica count over time: three replicas. */
	const char *rep = find_canvas(dom, "replicas", NULL);
	ck_assert_msg(
	    rep != NULL, "no replica chart in %s", dump_excerpt(dom));
	ck_assert_double_ge(attr_num(rep, "data-points"), 3);
	ck_assert_double_eq(attr_num(rep, "data-max"), NREP);
	ck_assert_double_eq(attr_num(rep, "data-series"), 1);

	/* All callers together. */
	const char *tot = find_canvas(dom, "total", NULL);
	ck_assert_ptr_nonnull(tot);
	ck_assert_double_ge(attr_num(tot, "data-points"), 3);
	ck_assert_double_gt(attr_num(tot, "data-max"), 0);

	/* Caller A: about 300 admitted/s of 400 (the tolerance covers a
	 * replica missing a tick in a busy second). */
	const char *ca = find_canvas(dom, "caller", QA);
	ck_assert_msg(ca != NULL, "no caller chart for " QA);
	ck_assert_double_ge(attr_num(ca, "data-points"), 3);
	double amax = attr_num(ca, "data-max");
	ck_assert_msg(amax >= 150 && amax <= 450, "caller A peak %g", amax);
	/* Caller B is denied: its chart's peak is the denial rate (about
	 * 300/s), far above what it was admitted (about 80/s). */
	const char *cb = find_canvas(dom, "caller", QB);
	ck_assert_ptr_nonnull(cb);
	ck_assert_double_ge(attr_num(cb, "data-points"), 3);
	ck_assert_double_gt(attr_num(cb, "data-max"), 120);

	/* Shares: one series per replica, each about R / 3. */
	const char *sa = find_canvas(dom, "share", QA);
	ck_assert_msg(sa != NULL, "no share chart for " QA);
	ck_assert_double_ge(attr_num(sa, "data-points"), 3);
	ck_assert_double_eq(attr_num(sa, "data-series"), NREP);
	double smax = attr_num(sa, "data-max");
	ck_assert_msg(smax > 400.0 / NREP - 1 && smax <= 400.0 + 1e-6,
	    "caller A share peak %g", smax);
	/* Stacked, the shares add up to the quota and never exceed it. */
	double stack = attr_num(sa, "data-stack-max");
	ck_assert_msg(stack > 399 && stack <= 400.0 + 1e-3,
	    "caller A shares add up to %g", stack);
	const char *sb = find_canvas(dom, "share", QB);
	ck_assert_ptr_nonnull(sb);
	ck_assert_double_eq(attr_num(sb, "data-series"), NREP);
	ck_assert_double_gt(attr_num(sb, "data-max"), 0);
	/* The default quota runs in shadow: what it would have denied
	 * (about 120/s) is a series of its own, never a denial. */
	const char *cdf = find_canvas(dom, "caller", "default");
	ck_assert_ptr_nonnull(cdf);
	double shd = attr_num(cdf, "data-shadow");
	ck_assert_msg(shd >= 60 && shd <= 180, "default shadow peak %g", shd);
	ck_assert_double_eq(attr_num(cdf, "data-series"), 3);
	/* Caller B enforces: denials only. */
	ck_assert_double_eq(attr_num(cb, "data-shadow"), 0);
	ck_assert_double_eq(attr_num(cb, "data-series"), 2);
	/* The table's shadow column: default's cell (the first row) has a
	 * figure, B's none. */
	const char *cell = strstr(dom, "data-col=\"shadow\">");
	ck_assert_ptr_nonnull(cell);
	cell += strlen("data-col=\"shadow\">");
	ck_assert_msg(
	    cell[0] >= '1' && cell[0] <= '9', "shadow cell %.8s", cell);
	/* Caller A's candidate: its rate, its would-denies drawn
	 * apart, its share in the table. */
	ck_assert_double_eq(attr_num(ca, "data-candidate"), 150);
	ck_assert_double_eq(attr_num(ca, "data-series"), 3);
	ck_assert_ptr_nonnull(strstr(dom, "data-col=\"candidate\">150/s: "));
	/* Seconds of about 300/s against 150/s with a burst of
	 * 100: the candidate has denied something by now. */
	int hs = 0;
	char *js = pc_http_get(C.http, "/status", &hs);
	ck_assert_ptr_nonnull(js);
	const char *ja = strstr(js, "{\"quota\":\"" QA "\"");
	ck_assert_ptr_nonnull(ja);
	const char *jc = strstr(ja, "\"candidate\":{");
	ck_assert_ptr_nonnull(jc);
	const char *jd = strstr(jc, "\"denied\":");
	ck_assert_ptr_nonnull(jd);
	ck_assert_double_gt(strtod(jd + strlen("\"denied\":"), NULL), 0);
	free(js);
	/* The header shows the coordinator's state. */
	ck_assert_ptr_nonnull(strstr(dom, "id=\"epoch\">1<"));
	ck_assert_ptr_nonnull(strstr(dom, "class=\"badge ok\">ok<"));
	free(dom);

	/* The screenshot, kept in the build's log directory. */
	char png[512], shot[600];
	snprintf(
	    png, sizeof png, "%s/meson-logs/dashboard.png", pc_build_dir());
	snprintf(shot, sizeof shot, "--screenshot=%s", png);
	unlink(png);
	const char *shot_args[] = { shot, "--window-size=1280,900", NULL };
	char out_path[256];
	snprintf(out_path, sizeof out_path, "%s/screenshot.out", C.dir);
	ex = run_chromium(&C, shot_args, out_path, log_path);
	ck_assert_msg(ex == 0, "chromium --screenshot exited with %d", ex);
	struct stat sbuf;
	ck_assert_msg(stat(png, &sbuf) == 0, "no screenshot at %s", png);
	ck_assert_msg(sbuf.st_size > 20000,
	    "screenshot %s is only %lld "
	    "bytes",
	    png, (long long) sbuf.st_size);
	FILE *f = fopen(png, "rb");
	ck_assert_ptr_nonnull(f);
	unsigned char sig[8];
	ck_assert_int_eq(fread(sig, 1, 8, f), 8);
	fclose(f);
	ck_assert_int_eq(memcmp(sig, "\x89PNG\r\n\x1a\n", 8), 0);
	fprintf(stderr, "dashboard screenshot: %s (%lld bytes)\n", png,
	    (long long) sbuf.st_size);

	ck_assert_int_eq(atomic_load(&d.errors), 0);
	pc_driver_stop(&d);
	coord_stop(&C);
}
END_TEST

static Suite *
dashboard_suite(void)
{
	Suite *s = suite_create("dashboard");
	TCase *tc = tcase_create("browser");
	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, page_is_self_contained);
	tcase_add_test(tc, charts_draw_live_data);
	suite_add_tcase(s, tc);
	return s;
}

int
main(void)
{
	if (!find_chromium()) {
		printf("SKIP: chromium is not installed (scripts/bootstrap "
		       "installs it; ALLOT_CHROMIUM names another binary)\n");
		return 77;
	}
	SRunner *sr = srunner_create(dashboard_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
