/* SPDX-License-Identifier: MIT */
/*
 * Quota changes through allotd's admin socket, with real parts: each
 * test starts $ALLOT_BUILD_DIR/coordinator/allotd with a temporary quota
 * file, a SQLite store and --admin-socket, and talks to it with
 * $ALLOT_BUILD_DIR/tools/allotctl (diff, apply) as a child process and
 * with libcurl over the Unix socket for what allotctl never sends. It
 * checks: the socket is mode 0600 (0660 and the group with
 * --admin-group); diff shows per quota before -> after and changes
 * nothing; apply installs a new epoch, writes the file, and records one
 * v_quota_changes row per changed quota with this test's user name (as
 * the kernel gives it), the claimed name and the reason, readable with
 * `sqlite3 -readonly`; the first config of an empty store, a SIGHUP
 * reload and a start with a changed file are recorded too; invalid files
 * are refused with FILE:LINE:COL (the client's file name) and leave the
 * epoch, the file and the audit table as they were; a stale expected
 * digest is refused (409); a restart keeps the epoch of an unchanged
 * file and moves past it for a changed one; the public HTTP port refuses
 * POST. Every wait is bounded.
 */
#include <check.h>
#include <curl/curl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include "allotd.h"
#include "proc.h"
#include "proto_client.h"

#define QA "spiffe://test/ns/payments/sa/checkout"
#define QB "spiffe://test/ns/batch/sa/backfill"
#define QC "spiffe://test/ns/search/sa/search"
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

/* A halved, B removed, C added. */
static const char cfg_next[] = CFG_HEAD "      tokens_per_second: 200\n"
                                        "      burst: 400\n"
                                        "      priority: critical\n"
                                        "    - identity: \"" QC "\"\n"
                                        "      tokens_per_second: 30\n"
                                        "      burst: 60\n"
                                        "      priority: standard\n"
                                        "  global_ceiling:\n"
                                        "    tokens_per_second: 500\n";

/* B's burst only. */
static const char cfg_other[] = CFG_HEAD "      tokens_per_second: 400\n"
                                         "      burst: 800\n"
                                         "      priority: critical\n"
                                         "    - identity: \"" QB "\"\n"
                                         "      tokens_per_second: 60\n"
                                         "      burst: 90\n"
                                         "      priority: batch\n"
                                         "  global_ceiling:\n"
                                         "    tokens_per_second: 500\n";

/* Line 8, column 26: a rate that is a string. */
static const char cfg_bad[] = CFG_HEAD "      tokens_per_second: fast\n"
                                       "      burst: 800\n";

/* ---- allotd ---- */

/* The test's allotd (tests/support/allotd.h), its admin socket at
 * c.sock, made group-accessible to `admin_group` when that is set. */
typedef pc_coord coord;

/* The deploy job's identity, on the --admin-allow list below. */
#define DEPLOYER "spiffe://t/ns/deploy/sa/ci"

static coord C;
static const char *admin_group; /* --admin-group, or NULL */

static void
coord_init(coord *c)
{
	pc_coord_init(c, "/tmp/allot-apply", cfg_good);
}

static void
coord_start(coord *c)
{
	const char *args[] = { "--admin-socket", c->sock,
		admin_group != NULL ? "--admin-group" : NULL, admin_group,
		NULL };
	pc_coord_spawn(c, args, NULL);
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

/* ---- the store, read as an auditor would ---- */

static int64_t
q_int(const char *sql)
{
	sqlite3 *db = NULL;
	ck_assert_int_eq(
	    sqlite3_open_v2(C.db, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
	sqlite3_busy_timeout(db, 2000);
	sqlite3_stmt *s = NULL;
	int rc = sqlite3_prepare_v2(db, sql, -1, &s, NULL);
	ck_assert_msg(rc == SQLITE_OK, "%s: %s", sql, sqlite3_errmsg(db));
	ck_assert_int_eq(sqlite3_step(s), SQLITE_ROW);
	int64_t v = sqlite3_column_int64(s, 0);
	sqlite3_finalize(s);
	sqlite3_close(db);
	return v;
}

/* `sql` through the sqlite3 shell, read-only (the audit check);
 * its output, the caller's. */
static char *
shell_sql(const char *sql)
{
	char cmd[2048];
	snprintf(cmd, sizeof cmd, "sqlite3 -readonly -separator '|' %s \"%s\"",
	    C.db, sql);
	char *out = pc_shell(cmd);
	ck_assert_msg(out != NULL, "sqlite3 failed: %s", cmd);
	return out;
}

static const char *
me(void)
{
	struct passwd *pw = getpwuid(getuid());
	ck_assert_ptr_nonnull(pw);
	return pw->pw_name;
}

/* ---- running allotctl ---- */

typedef pc_run_result run;

/* allotctl with the NULL-terminated arguments, in the test's directory
 * (so that file names in messages are the relative ones given). */
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
	    argv, C.dir, C.dir, "ALLOT_ADMIN_SOCKET", C.sock, RUN_TIMEOUT_MS);
}

#define assert_has(text, needle)                        \
	ck_assert_msg(strstr((text), (needle)) != NULL, \
	    "expected \"%s\" in:\n%s", (needle), (text))

/* ---- raw requests on the admin socket ---- */

static size_t
collect(char *data, size_t size, size_t n, void *ud)
{
	char **b = ud;
	size_t old = *b ? strlen(*b) : 0;
	*b = realloc(*b, old + size * n + 1);
	memcpy(*b + old, data, size * n);
	(*b)[old + size * n] = '\0';
	return size * n;
}

/* `method` `target` on `sock` with `body` (NULL: none); the status, and
 * the answer in *ret (the caller's). */
static long
admin_req(const char *sock, const char *method, const char *target,
    const char *body, size_t len, char **ret)
{
	CURL *e = curl_easy_init();
	ck_assert_ptr_nonnull(e);
	char url[1024];
	snprintf(url, sizeof url, "http://allotd%s", target);
	char *ans = NULL;
	curl_easy_setopt(e, CURLOPT_UNIX_SOCKET_PATH, sock);
	curl_easy_setopt(e, CURLOPT_URL, url);
	curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
	curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 10000L);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, collect);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, &ans);
	struct curl_slist *h = curl_slist_append(NULL, "Expect:");
	curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
	if (body != NULL) {
		curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(
		    e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) len);
	}
	CURLcode r = curl_easy_perform(e);
	long status = -1;
	if (r == CURLE_OK)
		curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
	curl_slist_free_all(h);
	curl_easy_cleanup(e);
	ck_assert_msg(
	    r == CURLE_OK, "%s %s: %s", method, target, curl_easy_strerror(r));
	*ret = ans != NULL ? ans : strdup("");
	return status;
}

/* The digest in force, from GET /config. */
static void
digest_in_force(char out[17])
{
	char *ans = NULL;
	ck_assert_int_eq(
	    admin_req(C.sock, "GET", "/config", NULL, 0, &ans), 200);
	const char *d = strstr(ans, "\"digest\":\"");
	ck_assert_ptr_nonnull(d);
	snprintf(out, 17, "%.16s", d + 10);
	free(ans);
}

static void
write_in_dir(const char *name, const char *text)
{
	char p[256];
	snprintf(p, sizeof p, "%s/%s", C.dir, name);
	pc_write_file(p, text);
}

/* ---- tests ---- */

START_TEST(apply_records_who_and_why)
{
	coord_init(&C);
	coord_start(&C);
	struct stat sb;
	ck_assert_int_eq(lstat(C.sock, &sb), 0);
	ck_assert(S_ISSOCK(sb.st_mode));
	ck_assert_int_eq(sb.st_mode & 0777, 0600);
	ck_assert_uint_eq(sb.st_uid, geteuid());
	ck_assert_int_eq((int) status_epoch(&C), 1);

	/* The first config of an empty store is recorded, every quota
	 * added, by "start". */
	uint64_t end = pc_now_ms() + 5000;
	while (q_int("SELECT count(*) FROM v_quota_changes") == 0 &&
	    pc_now_ms() < end)
		pc_sleep_ms(100);
	ck_assert_int_eq(
	    q_int("SELECT count(*) FROM v_quota_changes WHERE "
	          "epoch = 1 AND who = 'start' AND action = "
	          "'added' AND quota IN ('default', '" QA "', '" QB "')"),
	    3);

	/* diff: per quota before -> after, nothing applied. */
	write_in_dir("next.yaml", cfg_next);
	run r = ctl("diff", "next.yaml", "--capacity", "550", NULL);
	ck_assert_msg(r.status == 0, "diff: %d %s", r.status, r.err);
	assert_has(r.out, "~ " QA);
	assert_has(r.out, "before: 400/s burst 800 critical");
	assert_has(r.out, "after:  200/s burst 400 critical");
	assert_has(r.out, "rate 400/s -> 200/s; burst 800 -> 400");
	assert_has(r.out, "+ " QC);
	assert_has(r.out, "- " QB);
	assert_has(r.out, "3 changes: 1 added, 1 removed, 1 changed");
	/* The ceiling (500) is above 550 x 0.8 = 440. */
	assert_has(r.out, "WARNING:    the ceiling, 500 tokens/s");
	pc_run_free(&r);
	ck_assert_int_eq((int) status_epoch(&C), 1);
	char *disk = pc_read_file(C.cfg);
	ck_assert_str_eq(disk, cfg_good);
	free(disk);

	/* apply: the new epoch, the file, the audit. */
	r = ctl("apply", "next.yaml", "--reason", "halve checkout, move B",
	    "--as", "reviewer", NULL);
	ck_assert_msg(r.status == 0, "apply: %d %s", r.status, r.err);
	assert_has(r.out, "applied next.yaml: epoch 1 -> 2");
	char line[256];
	snprintf(
	    line, sizeof line, "recorded: by %s (as reviewer, claimed)", me());
	assert_has(r.out, line);
	pc_run_free(&r);
	ck_assert_int_eq((int) status_epoch(&C), 2);
	disk = pc_read_file(C.cfg);
	ck_assert_str_eq(disk, cfg_next);
	free(disk);
	/* Committed before apply answered: no wait needed. */
	char *rows = shell_sql(
	    "SELECT who, reason, action, quota, before, after FROM "
	    "v_quota_changes WHERE epoch = 2 ORDER BY quota");
	char want[1024];
	snprintf(want, sizeof want,
	    "%s (as reviewer, claimed)|halve checkout, move B|removed|" QB
	    "|60/s burst 120 batch|\n"
	    "%s (as reviewer, claimed)|halve checkout, move B|changed|" QA
	    "|400/s burst 800 critical|200/s burst 400 critical\n"
	    "%s (as reviewer, claimed)|halve checkout, move B|added|" QC
	    "||30/s burst 60 standard",
	    me(), me(), me());
	ck_assert_str_eq(rows, want);
	free(rows);

	/* A SIGHUP reload of a changed file is recorded as "signal". */
	pc_write_file(C.cfg, cfg_good);
	kill(C.pid, SIGHUP);
	end = pc_now_ms() + 5000;
	while (q_int("SELECT count(*) FROM v_quota_changes WHERE epoch = 3") <
	        3 &&
	    pc_now_ms() < end)
		pc_sleep_ms(100);
	ck_assert_int_eq(q_int("SELECT count(*) FROM v_quota_changes WHERE "
	                       "epoch = 3 AND who = 'signal' AND reason = "
	                       "'reload'"),
	    3);
	coord_stop(&C);
	coord_done(&C);
}
END_TEST

START_TEST(invalid_files_change_nothing)
{
	coord_init(&C);
	coord_start(&C);
	char d0[17];
	digest_in_force(d0);
	pc_sleep_ms(1200); /* the start-up rows are committed */
	int64_t rows0 = q_int("SELECT count(*) FROM quota_changes");
	int64_t changes0 = q_int("SELECT count(*) FROM config_changes");

	/* allotctl refuses it itself, with the loader's position. */
	write_in_dir("bad.yaml", cfg_bad);
	run r = ctl("apply", "bad.yaml", "--reason", "x", NULL);
	ck_assert_int_eq(r.status, 1);
	assert_has(r.err, "bad.yaml:8:26:");
	assert_has(r.err, "nothing was sent");
	pc_run_free(&r);
	/* A missing reason is a usage error, before anything is read. */
	write_in_dir("next.yaml", cfg_next);
	r = ctl("apply", "next.yaml", NULL);
	ck_assert_int_eq(r.status, 2);
	assert_has(r.err, "--reason");
	pc_run_free(&r);

	/* allotd refuses it too, naming the client's file. */
	char *ans = NULL;
	long st = admin_req(C.sock, "POST",
	    "/config/apply?file=team/quotas.yaml&reason=x", cfg_bad,
	    strlen(cfg_bad), &ans);
	ck_assert_int_eq(st, 422);
	assert_has(ans, "team/quotas.yaml:8:26:");
	free(ans);
	st = admin_req(C.sock, "POST", "/config/diff?file=d.yaml", cfg_bad,
	    strlen(cfg_bad), &ans);
	ck_assert_int_eq(st, 422);
	assert_has(ans, "d.yaml:8:26:");
	free(ans);
	/* No reason, a bad digest, a body too large, a wrong method. */
	st = admin_req(
	    C.sock, "POST", "/config/apply", cfg_next, strlen(cfg_next), &ans);
	ck_assert_int_eq(st, 400);
	assert_has(ans, "reason is required");
	free(ans);
	st = admin_req(C.sock, "POST", "/config/apply?reason=x&expect=zz",
	    cfg_next, strlen(cfg_next), &ans);
	ck_assert_int_eq(st, 400);
	free(ans);
	size_t big = 5u * 1024u * 1024u;
	char *huge = malloc(big);
	ck_assert_ptr_nonnull(huge);
	memset(huge, '#', big);
	st = admin_req(
	    C.sock, "POST", "/config/apply?reason=x", huge, big, &ans);
	free(huge);
	ck_assert_int_eq(st, 413);
	free(ans);
	st = admin_req(C.sock, "DELETE", "/config", NULL, 0, &ans);
	ck_assert_int_eq(st, 405);
	free(ans);
	st = admin_req(C.sock, "GET", "/nope", NULL, 0, &ans);
	ck_assert_int_eq(st, 404);
	free(ans);

	/* Nothing moved: epoch, digest, file, audit. */
	pc_sleep_ms(1200);
	ck_assert_int_eq((int) status_epoch(&C), 1);
	char d1[17];
	digest_in_force(d1);
	ck_assert_str_eq(d0, d1);
	char *disk = pc_read_file(C.cfg);
	ck_assert_str_eq(disk, cfg_good);
	free(disk);
	ck_assert_int_eq(q_int("SELECT count(*) FROM quota_changes"), rows0);
	ck_assert_int_eq(
	    q_int("SELECT count(*) FROM config_changes"), changes0);
	coord_stop(&C);
	coord_done(&C);
}
END_TEST

START_TEST(stale_digest_refused)
{
	coord_init(&C);
	coord_start(&C);
	char d0[17];
	digest_in_force(d0);
	/* Two reviewers diffed against d0; the first applies. */
	char target[256];
	snprintf(target, sizeof target,
	    "/config/apply?file=a.yaml&reason=first&expect=%s", d0);
	char *ans = NULL;
	ck_assert_int_eq(admin_req(C.sock, "POST", target, cfg_next,
	                     strlen(cfg_next), &ans),
	    200);
	assert_has(ans, "\"changed\":true");
	free(ans);
	snprintf(target, sizeof target,
	    "/config/apply?file=b.yaml&reason=second&expect=%s", d0);
	ck_assert_int_eq(admin_req(C.sock, "POST", target, cfg_other,
	                     strlen(cfg_other), &ans),
	    409);
	assert_has(ans, "not the expected");
	free(ans);
	/* allotctl with the stale digest: exit 1, nothing applied. */
	write_in_dir("other.yaml", cfg_other);
	run r = ctl(
	    "apply", "other.yaml", "--reason", "second", "--expect", d0, NULL);
	ck_assert_int_eq(r.status, 1);
	assert_has(r.err, "not the expected");
	pc_run_free(&r);
	ck_assert_int_eq((int) status_epoch(&C), 2);
	char *disk = pc_read_file(C.cfg);
	ck_assert_str_eq(disk, cfg_next);
	free(disk);
	ck_assert_int_eq(q_int("SELECT count(*) FROM v_quota_changes WHERE "
	                       "reason = 'second'"),
	    0);
	/* The same file again is not a change. */
	r = ctl("apply", "other.yaml", "--reason", "second", NULL);
	ck_assert_int_eq(r.status, 0);
	pc_run_free(&r);
	r = ctl("apply", "other.yaml", "--reason", "again", NULL);
	ck_assert_int_eq(r.status, 0);
	assert_has(r.out, "unchanged");
	pc_run_free(&r);
	ck_assert_int_eq((int) status_epoch(&C), 3);
	coord_stop(&C);
	coord_done(&C);
}
END_TEST

START_TEST(restart_keeps_epoch)
{
	coord_init(&C);
	coord_start(&C);
	write_in_dir("next.yaml", cfg_next);
	run r = ctl("apply", "next.yaml", "--reason", "before restart", NULL);
	ck_assert_msg(r.status == 0, "apply: %s", r.err);
	pc_run_free(&r);
	ck_assert_int_eq((int) status_epoch(&C), 2);
	char d2[17];
	digest_in_force(d2);
	coord_stop(&C);

	/* The same file (the one apply wrote): the same epoch and digest,
	 * and no audit row. */
	int64_t rows = q_int("SELECT count(*) FROM quota_changes");
	coord_start(&C);
	ck_assert_int_eq((int) status_epoch(&C), 2);
	char d[17];
	digest_in_force(d);
	ck_assert_str_eq(d, d2);
	coord_stop(&C);
	ck_assert_int_eq(q_int("SELECT count(*) FROM quota_changes"), rows);

	/* Edited while stopped: the next epoch, recorded as "start". */
	pc_write_file(C.cfg, cfg_other);
	coord_start(&C);
	ck_assert_int_eq((int) status_epoch(&C), 3);
	coord_stop(&C);
	ck_assert_int_eq(q_int("SELECT count(*) FROM v_quota_changes WHERE "
	                       "epoch = 3 AND who = 'start'"),
	    3);
	char *rows3 = shell_sql("SELECT action || ' ' || quota FROM "
	                        "v_quota_changes WHERE epoch = 3 AND quota "
	                        "= '" QB "'");
	ck_assert_str_eq(rows3, "added " QB);
	free(rows3);
	coord_done(&C);
}
END_TEST

START_TEST(public_port_read_only)
{
	coord_init(&C);
	coord_start(&C);
	char cmd[512];
	snprintf(cmd, sizeof cmd,
	    "curl -s -o /dev/null -w '%%{http_code}' --data-binary @%s "
	    "'http://127.0.0.1:%d/config/apply?reason=x'",
	    C.cfg, C.http);
	char *code = pc_shell(cmd);
	ck_assert_ptr_nonnull(code);
	ck_assert_str_eq(code, "405");
	free(code);
	int st = 0;
	char *body = pc_http_get(C.http, "/config", &st);
	ck_assert_int_eq(st, 404);
	free(body);
	ck_assert_int_eq((int) status_epoch(&C), 1);
	coord_stop(&C);
	/* The socket is removed on a clean stop. */
	struct stat sb;
	ck_assert_int_ne(lstat(C.sock, &sb), 0);
	coord_done(&C);
}
END_TEST

START_TEST(group_socket)
{
	struct group *g = getgrgid(getegid());
	ck_assert_ptr_nonnull(g);
	coord_init(&C);
	admin_group = g->gr_name;
	coord_start(&C);
	struct stat sb;
	ck_assert_int_eq(lstat(C.sock, &sb), 0);
	ck_assert_int_eq(sb.st_mode & 0777, 0660);
	ck_assert_uint_eq(sb.st_gid, getegid());
	/* A second allotd on the same socket is refused, and the first
	 * keeps it. */
	int port = pc_free_port();
	char url[64], http[32], log[256];
	snprintf(url, sizeof url, "tcp://127.0.0.1:%d", pc_free_port());
	snprintf(http, sizeof http, "127.0.0.1:%d", port);
	snprintf(log, sizeof log, "%s/second.log", C.dir);
	char db2[256];
	snprintf(db2, sizeof db2, "%s/second.db", C.dir);
	char *const args[] = { (char *) pc_allotd_path(), "--config", C.cfg,
		"--db", db2, "--listen", url, "--http", http, "--admin-socket",
		C.sock, NULL };
	pid_t p2 = pc_spawn(args, log);
	ck_assert_int_eq(pc_wait_exit(p2, 10000), 1);
	char *l = pc_read_file(log);
	assert_has(l, "another process answers on it");
	free(l);
	char *ans = NULL;
	ck_assert_int_eq(
	    admin_req(C.sock, "GET", "/config", NULL, 0, &ans), 200);
	free(ans);
	coord_stop(&C);
	coord_done(&C);
}
END_TEST

/* The admin API over HTTPS (--admin-listen): a certificate of the admin
 * CA whose SPIFFE ID --admin-allow names applies, recorded under that
 * ID; one it does not name, one of another CA and none are refused
 * before anything is read, and logged; the socket serves beside it. */
START_TEST(https_admin_mutual_tls)
{
	coord_init(&C);
	char cmd[4096];
	const char *src = getenv("ALLOT_SOURCE_DIR");
	const char *d = C.dir;
	snprintf(cmd, sizeof cmd,
	    "cd %s && %s/scripts/mkcerts ca1 deploy=" DEPLOYER
	    " bob=spiffe://t/ns/dev/sa/bob >/dev/null && "
	    "%s/scripts/mkcerts ca2 deploy=" DEPLOYER " >/dev/null && "
	    "cat ca1/deploy.pem ca1/deploy.key > deploy.pem && "
	    "cat ca1/bob.pem ca1/bob.key > bob.pem && "
	    "cat ca2/deploy.pem ca2/deploy.key > forged.pem && echo ok",
	    d, src, src);
	char *out = pc_shell(cmd);
	ck_assert_msg(out != NULL && strcmp(out, "ok") == 0,
	    "certificates: %s", out ? out : "(failed)");
	free(out);
	char listen[64], url[80], cert[256], key[256], ca[256];
	int port = pc_free_port();
	snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
	snprintf(url, sizeof url, "https://127.0.0.1:%d", port);
	/* allotd's certificate and key in two files (--tls-key). */
	snprintf(cert, sizeof cert, "%s/ca1/server.pem", d);
	snprintf(key, sizeof key, "%s/ca1/server.key", d);
	snprintf(ca, sizeof ca, "%s/ca1/ca.pem", d);
	const char *args[] = { "--admin-socket", C.sock, "--tls-cert", cert,
		"--tls-key", key, "--admin-ca", ca, "--admin-listen", listen,
		"--admin-allow", "spiffe://t/ns/deploy/sa/*", NULL };
	pc_coord_spawn(&C, args, NULL);

	/* Named by the list: applied, under its SPIFFE ID. */
	write_in_dir("next.yaml", cfg_next);
	run r = ctl("apply", "next.yaml", "--reason", "PR 42", "--admin", url,
	    "--admin-cert", "deploy.pem", "--admin-ca", "ca1/ca.pem", NULL);
	ck_assert_msg(r.status == 0, "apply: %d %s", r.status, r.err);
	assert_has(r.out, "applied next.yaml: epoch 1 -> 2");
	assert_has(r.out, "recorded: by " DEPLOYER);
	pc_run_free(&r);
	char *rows = shell_sql("SELECT DISTINCT who, reason FROM "
	                       "v_quota_changes WHERE epoch = 2");
	ck_assert_str_eq(rows, DEPLOYER "|PR 42");
	free(rows);

	/* Not on the list, another CA, no certificate: refused. */
	write_in_dir("good.yaml", cfg_good);
	r = ctl("apply", "good.yaml", "--reason", "x", "--admin", url,
	    "--admin-cert", "bob.pem", "--admin-ca", "ca1/ca.pem", NULL);
	ck_assert_int_eq(r.status, 1);
	assert_has(r.err,
	    "(403): spiffe://t/ns/dev/sa/bob is not on "
	    "allotd's --admin-allow list");
	pc_run_free(&r);
	r = ctl("diff", "good.yaml", "--admin", url, "--admin-cert",
	    "forged.pem", "--admin-ca", "ca1/ca.pem", NULL);
	ck_assert_int_eq(r.status, 1);
	assert_has(r.err, "(401): client certificate not valid");
	pc_run_free(&r);
	r = ctl("diff", "good.yaml", "--admin", url, NULL);
	ck_assert_int_eq(r.status, 2);
	assert_has(r.err, "takes mutual TLS: give --admin-cert");
	pc_run_free(&r);
	CURL *e = curl_easy_init();
	char target[128];
	snprintf(target, sizeof target, "%s/config/apply?reason=x", url);
	curl_easy_setopt(e, CURLOPT_URL, target);
	curl_easy_setopt(e, CURLOPT_CAINFO, ca);
	curl_easy_setopt(e, CURLOPT_POSTFIELDS, cfg_good);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, collect);
	char *ans = NULL;
	curl_easy_setopt(e, CURLOPT_WRITEDATA, &ans);
	ck_assert_int_eq(curl_easy_perform(e), CURLE_OK);
	long status = 0;
	curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
	curl_easy_cleanup(e);
	ck_assert_int_eq(status, 401);
	assert_has(ans, "no client certificate");
	free(ans);
	ck_assert_int_eq((int) status_epoch(&C), 2);

	/* The socket serves beside it, and the refusals are logged. */
	r = ctl("diff", "good.yaml", NULL);
	ck_assert_msg(
	    r.status == 0, "diff on the socket: %d %s", r.status, r.err);
	pc_run_free(&r);
	/* --json: allotd's answers as they are. */
	r = ctl("diff", "good.yaml", "--json", NULL);
	ck_assert_msg(r.status == 0, "diff --json: %d %s", r.status, r.err);
	assert_has(r.out, "\"same\":false");
	assert_has(r.out, "\"changes\":[");
	pc_run_free(&r);
	r = ctl("apply", "good.yaml", "--reason", "back", "--json", NULL);
	ck_assert_msg(r.status == 0, "apply --json: %d %s", r.status, r.err);
	assert_has(r.out, "\"changed\":true");
	char who[300];
	snprintf(who, sizeof who, "\"who\":\"%s\"", me());
	assert_has(r.out, who);
	pc_run_free(&r);
	coord_stop(&C);
	char *log = pc_read_file(C.log);
	assert_has(log,
	    "ALLOTD-ADMIN-REFUSED admin API: 127.0.0.1 refused "
	    "(403): spiffe://t/ns/dev/sa/bob");
	assert_has(log, "refused (401): no client certificate");
	free(log);
	coord_done(&C);
}
END_TEST

static Suite *
apply_suite(void)
{
	Suite *s = suite_create("apply");
	TCase *tc = tcase_create("admin socket");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, apply_records_who_and_why);
	tcase_add_test(tc, invalid_files_change_nothing);
	tcase_add_test(tc, stale_digest_refused);
	tcase_add_test(tc, restart_keeps_epoch);
	tcase_add_test(tc, public_port_read_only);
	tcase_add_test(tc, group_socket);
	suite_add_tcase(s, tc);
	tc = tcase_create("https");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, https_admin_mutual_tls);
	suite_add_tcase(s, tc);
	return s;
}

int
main(void)
{
	curl_global_init(CURL_GLOBAL_DEFAULT);
	SRunner *sr = srunner_create(apply_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	curl_global_cleanup();
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
