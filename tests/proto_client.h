/* SPDX-License-Identifier: MIT */
/*
 * A raw allot protocol client for tests: one nng req0 socket per simulated
 * replica, protobuf-c messages built by hand, so the tests see exactly
 * what goes over the wire (and can send what a real agent never would).
 * Also a tiny HTTP/1.0 GET over a plain socket for /metrics and /status,
 * helpers to spawn and stop a real allotd child process, and pc_coord,
 * the one fixture of a test's allotd (its temporary directory, quota
 * file, database, log, ports and process) that the allotd suites share.
 */
#ifndef ALLOT_TESTS_PROTO_CLIENT_H
#define ALLOT_TESTS_PROTO_CLIENT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <nng/nng.h>

#include "allot.pb-c.h"

typedef struct pc_conn {
	nng_socket sock;
	bool open;
} pc_conn;

/* Dial `url` (blocking, retried until `timeout_ms`). 0 or an nng error. */
int pc_open(pc_conn *c, const char *url, int timeout_ms);
/* pc_open, but the connection leaves from `local_ip` ("127.0.0.2"), so
 * allotd sees another peer. */
int pc_open_from(pc_conn *c, const char *url, const char *local_ip);
void pc_close(pc_conn *c);

/* Send `len` raw bytes and decode the answer. NULL on a transport error
 * or timeout; free with pc_free(). */
Allot__V1__Envelope *pc_raw(pc_conn *c, const void *buf, size_t len);
/* Pack `env` and exchange it. */
Allot__V1__Envelope *pc_send(pc_conn *c, const Allot__V1__Envelope *env);
void pc_free(Allot__V1__Envelope *env);

Allot__V1__Envelope *pc_register(pc_conn *c, const char *replica_id,
    const char *service, const char *const *keys, size_t nkeys,
    uint32_t interval_ms);

typedef struct pc_report {
	uint32_t key;
	uint64_t consumed;
	uint64_t denied;
	uint64_t held;
	uint64_t demand;
	uint64_t shadow_denied; /* admitted in shadow, would-deny */
} pc_report;

Allot__V1__Envelope *pc_sync(pc_conn *c, uint64_t session, uint64_t seq,
    uint32_t elapsed_ms, const pc_report *r, size_t n);
Allot__V1__Envelope *pc_leave(
    pc_conn *c, uint64_t session, const char *reason);

/* The error code of an Error answer, or -1 if `env` is not an Error. */
int pc_error_code(const Allot__V1__Envelope *env);

/* ---- a simulated replica: session, sequence and the shares it holds */

#define PC_MAX_KEYS 16

typedef struct pc_replica {
	pc_conn c;
	char id[64];
	uint64_t session;
	uint64_t seq;
	uint32_t replicas;
	uint64_t epoch;
	uint32_t lease_ms;
	size_t nkeys;
	double rate[PC_MAX_KEYS]; /* NaN: no share for the key */
	double burst[PC_MAX_KEYS];
	size_t nunknown;
	uint32_t unknown[PC_MAX_KEYS];
} pc_replica;

/* Connect and register; 0, or the Error code / -1 on failure. */
int pc_replica_join(pc_replica *r, const char *url, const char *id,
    const char *service, const char *const *keys, size_t nkeys);
/* One Sync with the next seq; shares in the Reply are applied. Returns
 * 0, an Error code, or -1 on a transport failure. `ret_rejected` (may be
 * NULL) receives Reply.rejected_reports. */
int pc_replica_sync(
    pc_replica *r, const pc_report *rep, size_t n, uint32_t *ret_rejected);
void pc_replica_close(pc_replica *r);

/* ---- HTTP ---- */

/* GET http://127.0.0.1:port/path. Returns the body (malloc'd, NUL
 * terminated) and the status, or NULL. */
char *pc_http_get(int port, const char *path, int *ret_status);
/* The value of the sample whose name and labels are exactly `series`
 * (e.g. "allotd_rejected_messages_total{reason=\"malformed\"}"), or NaN. */
double pc_metric(const char *text, const char *series);
/* Fetch /metrics and return one series (NaN when unavailable). */
double pc_metric_get(int port, const char *series);

/* ---- processes and ports ---- */

/* A free loopback TCP port (bound and released; good enough for tests). */
int pc_free_port(void);

/* Spawn `argv[0]` with stdout+stderr appended to `log_path`. */
pid_t pc_spawn(char *const argv[], const char *log_path);
/* Wait up to `timeout_ms` for `pid` to exit: its exit status (0-255),
 * 128 + signal when killed, or -1 on timeout. */
int pc_wait_exit(pid_t pid, int timeout_ms);

/* A program run to its end: its exit status as pc_wait_exit() gives it,
 * and what it wrote on stdout and stderr (never NULL). */
typedef struct pc_run_result {
	int status;
	char *out;
	char *err;
} pc_run_result;

/* Run `argv` (NULL-terminated, argv[0] a path) with stdout and stderr
 * captured through files in `dir`, in working directory `cwd` (NULL:
 * ours), with `env_name`=`env_value` set (NULL: nothing), for at most
 * `timeout_ms` (then SIGKILL, status -1). */
pc_run_result pc_run(const char *const *argv, const char *dir, const char *cwd,
    const char *env_name, const char *env_value, int timeout_ms);
void pc_run_free(pc_run_result *r);

/* $ALLOT_BUILD_DIR/coordinator/allotd, the allotd of this build. */
const char *pc_allotd_path(void);
/* Spawn the allotd of this build ($ALLOT_BUILD_DIR/coordinator/allotd)
 * with `args` (NULL-terminated, after the program name), its output
 * appended to `log_path`, and wait (10 s at most) until /healthz on
 * `http_port` answers 200. Fails the test if allotd exits first or never
 * answers. Returns its pid. */
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
	char url[64]; /* tcp://127.0.0.1:port, set by pc_coord_spawn */
	int port; /* the protocol port */
	int http; /* the HTTP port */
	pid_t pid; /* 0 when not running */
} pc_coord;

/* A fresh directory PREFIX-XXXXXX (e.g. "/tmp/allot-flood") for `c`, its
 * paths, and `cfg_text` as its quota file. `c` becomes the live one: if
 * the process exits before pc_coord_done() (exit(), or a failed test
 * run with CK_FORK=no), an atexit handler SIGKILLs its allotd and
 * removes the directory. A forked test that fails runs no atexit
 * handler; its allotd still dies with it (PR_SET_PDEATHSIG). */
void pc_coord_init(pc_coord *c, const char *prefix, const char *cfg_text);
/* Spawn allotd on fresh loopback ports with --config, --db, --listen
 * and --http of `c`, then `args` and `extra` (each NULL-terminated, may
 * be NULL: a suite's own options and a case's), and wait for /healthz
 * as pc_allotd_start() does. */
void pc_coord_spawn(
    pc_coord *c, const char *const *args, const char *const *extra);
/* Send `sig` and wait up to `timeout_ms`: the exit status as
 * pc_wait_exit() gives it (and pid 0), or -1 (and the pid kept). */
int pc_coord_stop(pc_coord *c, int sig, int timeout_ms);
/* Stop allotd if it still runs (SIGTERM and up to `term_ms` as
 * pc_allotd_stop() does; `term_ms` 0: SIGKILL at once), remove the
 * directory, and fail the test when allotd's log holds a sanitizer
 * report. */
void pc_coord_done(pc_coord *c, int term_ms);
/* The live pc_coord (NULL after pc_coord_done()). */
pc_coord *pc_coord_live(void);

/* The digest of a quota file's text (allot_config's, as allotd and the
 * agents compute it); fails the test if the text does not load. */
uint64_t pc_config_digest(const char *text);

/* Write `text` to `path`, replacing it; fails the test on error. */
void pc_write_file(const char *path, const char *text);
/* Remove `dir` and everything below it; says so on stderr when it
 * cannot. */
void pc_rm_rf(const char *dir);
/* True when the log of a process this test spawned holds a sanitizer
 * report (ASan, UBSan and TSan write theirs to its stderr), which is
 * then echoed to the test's stderr. */
bool pc_log_has_sanitizer_report(const char *log_path);

/* Monotonic milliseconds. */
uint64_t pc_now_ms(void);
void pc_sleep_ms(unsigned ms);

/* Whole file into a malloc'd string (NULL if unreadable). */
char *pc_read_file(const char *path);
/* Run a shell command and capture its trimmed stdout (NULL on failure). */
char *pc_shell(const char *cmd);

/* The one cluster member, of the `n` whose HTTP ports are `http` and
 * that are up (`up[i]`), whose /status says it serves, waiting up to
 * `timeout_ms`; -1 when none. Fails the test when two serve at once. */
int pc_wait_serving(const int *http, const bool *up, size_t n, int timeout_ms);

/* The log ids a liballot agent logged: give pc_log_ids_record as its
 * options' `log` and a pc_log_ids (PC_LOG_IDS_INIT) as `log_ctx`. */
typedef struct pc_log_ids {
	pthread_mutex_t mu;
	char ids[8192]; /* "ID ID ..." in order, as many as fit */
} pc_log_ids;
#define PC_LOG_IDS_INIT                         \
	{                                       \
		.mu = PTHREAD_MUTEX_INITIALIZER \
	}

void pc_log_ids_record(void *ctx, int level, const char *id, const char *msg);
/* How many times `id` was logged. */
int pc_log_ids_count(pc_log_ids *s, const char *id);

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
