/* SPDX-License-Identifier: MIT */
/*
 * Processes, ports, files and time for the tests and benchmarks that
 * drive real programs: a free loopback port (the one copy), a temporary
 * directory, spawning a child with its output in a log (and extra
 * environment), waiting for it, running a program to its end with its
 * output captured, small file and shell helpers, and whether a log holds
 * a sanitizer report. Failures that leave nothing to test go through
 * fail.h.
 */
#ifndef ALLOT_TESTS_SUPPORT_PROC_H
#define ALLOT_TESTS_SUPPORT_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Monotonic milliseconds, and nanoseconds. */
uint64_t pc_now_ms(void);
uint64_t pc_now_ns(void);
void pc_sleep_ms(unsigned ms);

/* A loopback TCP port that was free a moment ago (bound and released),
 * never one this process was handed in its last 64 calls: a suite that
 * takes several ports before anything binds them gets distinct ones.
 * -1 if no socket could be bound. */
int pc_free_port(void);

/* A fresh directory PREFIX-XXXXXX (e.g. "/tmp/allot-flood") into `buf`;
 * fails (fail.h) when it cannot be made. */
void pc_mkdtemp(char *buf, size_t len, const char *prefix);

/* Spawn `argv[0]` (a path) with stdout and stderr appended to
 * `log_path`. The child dies with its parent (PR_SET_PDEATHSIG): a test
 * that fails half-way leaves no process behind. */
pid_t pc_spawn(char *const argv[], const char *log_path);
/* The same with `env` ("NAME=value" strings, NULL-terminated; may be
 * NULL) added to this process's environment, each replacing a variable
 * of the same name. */
pid_t pc_spawn_env(
    char *const argv[], const char *const *env, const char *log_path);
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

/* Write `text` to `path`, replacing it; fails on error. */
void pc_write_file(const char *path, const char *text);
/* Whole file into a malloc'd string (NULL if unreadable). */
char *pc_read_file(const char *path);
/* Remove `dir` and everything below it; says so on stderr when it
 * cannot. */
void pc_rm_rf(const char *dir);
/* Run a shell command and capture its trimmed stdout (NULL on failure). */
char *pc_shell(const char *cmd);

/* True when the log of a process this test spawned holds a sanitizer
 * report (ASan, UBSan and TSan write theirs to its stderr), which is
 * then echoed to the test's stderr. */
bool pc_log_has_sanitizer_report(const char *log_path);

#endif
