/* SPDX-License-Identifier: MIT */
/*
 * The one allotd fixture of the tests and benchmarks: the programs of
 * this build (allotd, allotctl, ...) by path, allotd started and waited
 * for on /healthz and stopped, pc_coord (a test's allotd: its temporary
 * directory, quota file, database, log, ports, extra environment and
 * process, cleaned up at exit when a test ends half-way), pc_member (one
 * member of a Raft cluster on loopback: a pc_coord with its Raft id,
 * address and admin socket), and what the cluster suites ask of members
 * (who serves, allotctl member).
 *
 * Programs are found under $ALLOT_BUILD_DIR when it is set (meson test
 * sets it), else under the build directory this library was built in.
 * A program that is not there fails the caller: every suite depends in
 * meson on what it runs, so a missing one is a wrong build, never a
 * reason to skip.
 */
#ifndef ALLOT_TESTS_SUPPORT_ALLOTD_H
#define ALLOT_TESTS_SUPPORT_ALLOTD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* The build directory the programs are in. */
const char *pc_build_dir(void);
/* pc_build_dir()/`rel` (e.g. "tools/allotctl"), checked to be an
 * executable file: fails (fail.h) naming it when it is not. The path is
 * malloc'd once per `rel` and kept. */
const char *pc_program(const char *rel);
/* pc_program("coordinator/allotd"). */
const char *pc_allotd_path(void);

/* Spawn the allotd of this build with `args` (NULL-terminated, after the
 * program name), its output appended to `log_path`, and wait (10 s at
 * most) until /healthz on `http_port` answers 200. Fails if allotd exits
 * first or never answers. Returns its pid. */
pid_t pc_allotd_start(
    const char *const *args, int http_port, const char *log_path);
/* SIGTERM and wait up to `timeout_ms`, then SIGKILL: the exit status
 * after SIGTERM as pc_wait_exit() gives it, or -1 if it had to be
 * killed (or `pid` <= 0). */
int pc_allotd_stop(pid_t pid, int timeout_ms);

/* ---- a test's allotd: its directory, files, ports and process ---- */

typedef struct pc_coord {
	char dir[128]; /* made by pc_coord_init, removed by pc_coord_done */
	char cfg[192]; /* DIR/quotas.yaml, the quota file */
	char db[192]; /* DIR/allot.db */
	char log[192]; /* DIR/allotd.log, allotd's stdout and stderr */
	char sock[192]; /* DIR/allotd.sock, for an admin or ipc socket */
	char ipc[200]; /* "ipc://" and sock */
	char url[64]; /* tcp://127.0.0.1:port; a suite may make it
	                 tls+tcp:// on the same port before spawning */
	int port; /* the protocol port */
	int http; /* the HTTP port */
	/* Extra environment for allotd ("NAME=value", NULL-terminated;
	 * NULL: none), e.g. libfaketime's. */
	const char *const *env;
	pid_t pid; /* 0 when not running */
} pc_coord;

/* A fresh directory PREFIX-XXXXXX (e.g. "/tmp/allot-flood") for `c`, its
 * paths, `cfg_text` as its quota file, and two fresh loopback ports (the
 * protocol's, `url`, and HTTP), known before allotd starts and kept
 * across restarts. `c` is registered live: if the process exits before
 * pc_coord_done() (exit(), or a failed test run with CK_FORK=no), an
 * atexit handler SIGKILLs its allotd and removes the directory. A forked
 * test that fails runs no atexit handler; its allotd still dies with it
 * (PR_SET_PDEATHSIG). */
void pc_coord_init(pc_coord *c, const char *prefix, const char *cfg_text);
/* Spawn allotd with --config, --db, --listen and --http of `c`, then
 * `args` and `extra` (each NULL-terminated, may be NULL: a suite's own
 * options and a case's) and `c->env`, and wait for /healthz as
 * pc_allotd_start() does. */
void pc_coord_spawn(
    pc_coord *c, const char *const *args, const char *const *extra);
/* Send `sig` and wait up to `timeout_ms`: the exit status as
 * pc_wait_exit() gives it (and pid 0), or -1 (and the pid kept). */
int pc_coord_stop(pc_coord *c, int sig, int timeout_ms);
/* Stop allotd if it still runs (SIGTERM and up to `term_ms` as
 * pc_allotd_stop() does; `term_ms` 0: SIGKILL at once), remove the
 * directory (kept, and named on stderr, when ALLOT_KEEP_TMP is set), and
 * fail when allotd's log holds a sanitizer report. */
void pc_coord_done(pc_coord *c, int term_ms);
/* The pc_coord registered last and still live (NULL when none). */
pc_coord *pc_coord_live(void);

/* ---- a member of a Raft cluster on loopback ---- */

typedef struct pc_member {
	pc_coord c; /* its allotd; c.sock is its admin socket */
	uint64_t id;
	int raft; /* its Raft port */
	char raftaddr[64]; /* 127.0.0.1:raft */
	bool up; /* started, and not stopped since as far as we know */
} pc_member;

/* Member `id`: pc_coord_init under PREFIX-m<id> with `cfg_text`, and a
 * third port for Raft. */
void pc_member_init(
    pc_member *m, const char *prefix, uint64_t id, const char *cfg_text);
/* Start it (pc_coord_spawn) with --admin-socket, --raft-id, --raft-addr
 * and --election-ms `election_ms`, a --seed ID=RAFT=URL for each of
 * `seeds[0, nseed)` or --join when `nseed` is 0, then `extra`. */
void pc_member_start(pc_member *m, const pc_member *seeds, size_t nseed,
    int election_ms, const char *const *extra);

/* The index of the one member of `ms[0, n)` that is up and whose
 * /status says it serves, waiting up to `timeout_ms`; -1 when none.
 * Fails when two serve at once. */
int pc_member_serving(const pc_member *ms, size_t n, int timeout_ms);

/* `allotctl member ARGS` on a member's admin socket: its exit status
 * (-1: it could not run). */
int pc_ctl_member(const char *admin, const char *args);
/* True once `allotctl member list` on `admin` lists member `id` as a
 * voter. */
bool pc_member_is_voter(const char *admin, uint64_t id);
/* Whether `allotctl member list` on `admin` answers and lists member
 * `id` (false also when it does not answer: check with another call). */
bool pc_member_listed(const char *admin, uint64_t id);
/* Every admin socket in `admins` (n of them) answers a member list
 * without `id`, polled until `timeout_ms`. */
bool pc_member_gone_everywhere(
    const char *const *admins, size_t n, uint64_t id, int timeout_ms);

#endif
