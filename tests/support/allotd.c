/* SPDX-License-Identifier: MIT */
/*
 * The allotd fixture (allotd.h): this build's programs, allotd's start
 * and stop, pc_coord with its atexit clean-up, Raft members, and the
 * cluster questions the suites ask (who serves, allotctl member).
 */
#include "allotd.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fail.h"
#include "proc.h"
#include "proto_client.h"

/* ---- this build's programs ---- */

const char *
pc_build_dir(void)
{
	const char *b = getenv("ALLOT_BUILD_DIR");
	return b != NULL && b[0] != '\0' ? b : ALLOT_BUILD_ROOT;
}

const char *
pc_program(const char *rel)
{
	/* A few programs, each looked up once. */
	static struct {
		const char *rel;
		char *path;
	} known[16];
	size_t i = 0;
	for (; i < sizeof known / sizeof known[0] && known[i].rel != NULL; i++)
		if (strcmp(known[i].rel, rel) == 0)
			return known[i].path;
	char path[1024];
	snprintf(path, sizeof path, "%s/%s", pc_build_dir(), rel);
	PC_CHECK(access(path, X_OK) == 0,
	    "%s is not built: the suite depends on it in meson; is "
	    "ALLOT_BUILD_DIR (%s) the build it was made in?",
	    path, pc_build_dir());
	char *copy = strdup(path);
	PC_CHECK(copy != NULL, "out of memory");
	if (i < sizeof known / sizeof known[0]) {
		known[i].rel = rel;
		known[i].path = copy;
	}
	return copy;
}

const char *
pc_allotd_path(void)
{
	return pc_program("coordinator/allotd");
}

/* ---- allotd's start and stop ---- */

/* allotd with `args`, `env` added to its environment; waits for
 * /healthz. */
static pid_t
allotd_start(const char *const *args, const char *const *env, int http_port,
    const char *log_path)
{
	char *argv[64] = { (char *) pc_allotd_path() };
	size_t n = 1;
	for (size_t i = 0; args[i] != NULL; i++) {
		PC_CHECK(n + 1 < sizeof argv / sizeof argv[0],
		    "too many allotd arguments");
		argv[n++] = (char *) args[i];
	}
	argv[n] = NULL;
	pid_t pid = pc_spawn_env(argv, env, log_path);
	uint64_t end = pc_now_ms() + 10000;
	for (;;) {
		int status = 0;
		free(pc_http_get(http_port, "/healthz", &status));
		if (status == 200)
			return pid;
		int ex = pc_wait_exit(pid, 0);
		PC_CHECK(ex == -1, "allotd exited early with %d (see %s)", ex,
		    log_path);
		PC_CHECK(pc_now_ms() < end, "allotd did not come up (see %s)",
		    log_path);
		pc_sleep_ms(20);
	}
}

pid_t
pc_allotd_start(const char *const *args, int http_port, const char *log_path)
{
	return allotd_start(args, NULL, http_port, log_path);
}

int
pc_allotd_stop(pid_t pid, int timeout_ms)
{
	if (pid <= 0)
		return -1;
	kill(pid, SIGTERM);
	int ex = pc_wait_exit(pid, timeout_ms);
	if (ex < 0) {
		kill(pid, SIGKILL);
		pc_wait_exit(pid, 5000);
	}
	return ex;
}

/* ---- a test's allotd ---- */

/* The pc_coords whose allotd and directory the atexit handler removes
 * when the process ends before pc_coord_done(): a test that calls
 * exit(), or one run without fork (CK_FORK=no) that fails half-way. A
 * forked test that fails ends without running atexit handlers: its
 * allotd dies with it (PR_SET_PDEATHSIG), and a suite that wants its
 * files gone as well makes them under a directory of the runner's, as
 * coord_harness.c does. */
#define MAX_LIVE 16
static pc_coord *live[MAX_LIVE];
static size_t nlive;

static void
coord_cleanup_at_exit(void)
{
	while (nlive > 0) {
		pc_coord *c = live[--nlive];
		if (c->pid > 0) {
			kill(c->pid, SIGKILL);
			pc_wait_exit(c->pid, 2000);
			c->pid = 0;
		}
		pc_rm_rf(c->dir);
	}
}

static void
live_remove(pc_coord *c)
{
	for (size_t i = 0; i < nlive; i++)
		if (live[i] == c) {
			memmove(&live[i], &live[i + 1],
			    (nlive - i - 1) * sizeof live[0]);
			nlive--;
			return;
		}
}

static void
live_add(pc_coord *c)
{
	static bool registered;
	if (!registered) {
		atexit(coord_cleanup_at_exit);
		registered = true;
	}
	live_remove(c);
	PC_CHECK(nlive < MAX_LIVE, "more than %d allotd fixtures at once",
	    MAX_LIVE);
	live[nlive++] = c;
}

void
pc_coord_init(pc_coord *c, const char *prefix, const char *cfg_text)
{
	memset(c, 0, sizeof *c);
	pc_mkdtemp(c->dir, sizeof c->dir, prefix);
	snprintf(c->cfg, sizeof c->cfg, "%s/quotas.yaml", c->dir);
	snprintf(c->db, sizeof c->db, "%s/allot.db", c->dir);
	snprintf(c->log, sizeof c->log, "%s/allotd.log", c->dir);
	snprintf(c->sock, sizeof c->sock, "%s/allotd.sock", c->dir);
	snprintf(c->ipc, sizeof c->ipc, "ipc://%s", c->sock);
	pc_write_file(c->cfg, cfg_text);
	c->port = pc_free_port();
	c->http = pc_free_port();
	PC_CHECK(c->port > 0 && c->http > 0, "no free port");
	snprintf(c->url, sizeof c->url, "tcp://127.0.0.1:%d", c->port);
	live_add(c);
}

/* Append the NULL-terminated `list` (may be NULL) to argv[*n]. */
static void
append_args(const char **argv, size_t cap, size_t *n, const char *const *list)
{
	for (size_t i = 0; list != NULL && list[i] != NULL; i++) {
		PC_CHECK(*n + 1 < cap, "too many allotd arguments");
		argv[(*n)++] = list[i];
	}
}

void
pc_coord_spawn(pc_coord *c, const char *const *args, const char *const *extra)
{
	char http[32];
	snprintf(http, sizeof http, "127.0.0.1:%d", c->http);
	const char *argv[56] = { "--config", c->cfg, "--db", c->db, "--listen",
		c->url, "--http", http };
	size_t n = 8;
	size_t cap = sizeof argv / sizeof argv[0];
	append_args(argv, cap, &n, args);
	append_args(argv, cap, &n, extra);
	argv[n] = NULL;
	c->pid = allotd_start(argv, c->env, c->http, c->log);
}

int
pc_coord_stop(pc_coord *c, int sig, int timeout_ms)
{
	if (c->pid <= 0)
		return -1;
	kill(c->pid, sig);
	int ex = pc_wait_exit(c->pid, timeout_ms);
	if (ex >= 0)
		c->pid = 0;
	return ex;
}

void
pc_coord_done(pc_coord *c, int term_ms)
{
	if (c->pid > 0) {
		if (term_ms > 0) {
			pc_allotd_stop(c->pid, term_ms);
		} else {
			kill(c->pid, SIGKILL);
			pc_wait_exit(c->pid, 2000);
		}
		c->pid = 0;
	}
	/* Sanitizer builds: allotd's own reports end up in its log. */
	bool dirty = pc_log_has_sanitizer_report(c->log);
	if (getenv("ALLOT_KEEP_TMP") != NULL)
		fprintf(stderr, "kept %s (ALLOT_KEEP_TMP)\n", c->dir);
	else
		pc_rm_rf(c->dir);
	live_remove(c);
	PC_CHECK(!dirty, "allotd reported a sanitizer error");
}

pc_coord *
pc_coord_live(void)
{
	return nlive > 0 ? live[nlive - 1] : NULL;
}

/* ---- Raft members ---- */

void
pc_member_init(
    pc_member *m, const char *prefix, uint64_t id, const char *cfg_text)
{
	char p[128];
	snprintf(p, sizeof p, "%s/m%" PRIu64, prefix, id);
	memset(m, 0, sizeof *m);
	pc_coord_init(&m->c, p, cfg_text);
	m->id = id;
	m->raft = pc_free_port();
	PC_CHECK(m->raft > 0, "no free port");
	snprintf(m->raftaddr, sizeof m->raftaddr, "127.0.0.1:%d", m->raft);
}

void
pc_member_start(pc_member *m, const pc_member *seeds, size_t nseed,
    int election_ms, const char *const *extra)
{
	enum { MAX_SEEDS = 8 };
	char id[24], el[16], seed[MAX_SEEDS][160];
	snprintf(id, sizeof id, "%" PRIu64, m->id);
	snprintf(el, sizeof el, "%d", election_ms);
	const char *args[12 + 2 * MAX_SEEDS] = { "--admin-socket", m->c.sock,
		"--raft-id", id, "--raft-addr", m->raftaddr, "--election-ms",
		el };
	size_t n = 8;
	PC_CHECK(
	    nseed <= MAX_SEEDS, "%zu seeds, at most %d", nseed, MAX_SEEDS);
	for (size_t j = 0; j < nseed; j++) {
		snprintf(seed[j], sizeof seed[j], "%" PRIu64 "=%s=%s",
		    seeds[j].id, seeds[j].raftaddr, seeds[j].c.url);
		args[n++] = "--seed";
		args[n++] = seed[j];
	}
	if (nseed == 0)
		args[n++] = "--join";
	args[n] = NULL;
	pc_coord_spawn(&m->c, args, extra);
	m->up = true;
}

static bool
serving(int http_port)
{
	int st = 0;
	char *body = pc_http_get(http_port, "/status", &st);
	bool yes = body != NULL && st == 200 &&
	    strstr(body, "\"serving\":true") != NULL;
	free(body);
	return yes;
}

int
pc_member_serving(const pc_member *ms, size_t n, int timeout_ms)
{
	uint64_t until = pc_now_ms() + (uint64_t) timeout_ms;
	do {
		int who = -1, count = 0;
		for (size_t i = 0; i < n; i++)
			if (ms[i].up && serving(ms[i].c.http)) {
				who = (int) i;
				count++;
			}
		PC_CHECK(count <= 1, "%d members serve at once", count);
		if (who >= 0)
			return who;
		pc_sleep_ms(10);
	} while (pc_now_ms() < until);
	return -1;
}

/* ---- allotctl member ---- */

int
pc_ctl_member(const char *admin, const char *args)
{
	char cmd[1024];
	snprintf(cmd, sizeof cmd,
	    "'%s' member %s --admin %s >/dev/null 2>&1; echo $?",
	    pc_program("tools/allotctl"), args, admin);
	char *s = pc_shell(cmd);
	int rc = s != NULL ? atoi(s) : -1;
	free(s);
	return rc;
}

bool
pc_member_is_voter(const char *admin, uint64_t id)
{
	char cmd[1024];
	snprintf(cmd, sizeof cmd,
	    "'%s' member list --admin %s 2>/dev/null | "
	    "awk '$1 == %" PRIu64 " {print $4}'",
	    pc_program("tools/allotctl"), admin, id);
	char *s = pc_shell(cmd);
	bool yes = s != NULL && strcmp(s, "voter") == 0;
	free(s);
	return yes;
}

/* The number of rows for `id` in the member list, -1 when the list
 * did not come (allotctl failed). */
static int
member_rows(const char *admin, uint64_t id)
{
	char cmd[1024];
	snprintf(cmd, sizeof cmd,
	    "out=$('%s' member list --admin %s 2>/dev/null) "
	    "|| { echo -1; exit 0; }; echo \"$out\" | "
	    "awk '$1 == %" PRIu64 "' | wc -l",
	    pc_program("tools/allotctl"), admin, id);
	char *s = pc_shell(cmd);
	int n = s != NULL ? atoi(s) : -1;
	free(s);
	return n;
}

bool
pc_member_listed(const char *admin, uint64_t id)
{
	return member_rows(admin, id) > 0;
}

bool
pc_member_gone_everywhere(
    const char *const *admins, size_t n, uint64_t id, int timeout_ms)
{
	uint64_t until = pc_now_ms() + (uint64_t) timeout_ms;
	for (;;) {
		bool gone = true;
		for (size_t i = 0; i < n && gone; i++)
			gone = member_rows(admins[i], id) == 0;
		if (gone)
			return true;
		if (pc_now_ms() >= until)
			return false;
		pc_sleep_ms(20);
	}
}
