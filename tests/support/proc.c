/* SPDX-License-Identifier: MIT */
/*
 * Processes, ports, files and time (proc.h): what every suite that runs
 * real programs needs, in one place. Children are made with fork and
 * exec; what a child needs after fork (its environment) is built before,
 * since the parent may have threads.
 */
#include "proc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fail.h"

extern char **environ;

uint64_t
pc_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * 1000u + (uint64_t) ts.tv_nsec / 1000000u;
}

uint64_t
pc_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

void
pc_sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000u, (long) (ms % 1000u) * 1000000L };
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/* ---- ports and directories ---- */

/* Whether `port` on loopback can be bound now (0: the kernel's choice;
 * then *ret_port says which). */
static bool
can_bind(int port, int *ret_port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		return false;
	struct sockaddr_in sa = { .sin_family = AF_INET,
		.sin_port = htons((uint16_t) port) };
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t sl = sizeof sa;
	bool ok = bind(fd, (struct sockaddr *) &sa, sizeof sa) == 0 &&
	    getsockname(fd, (struct sockaddr *) &sa, &sl) == 0;
	if (ok)
		*ret_port = ntohs(sa.sin_port);
	close(fd);
	return ok;
}

/* The ports the kernel gives outgoing connections (their local ports):
 * [*lo, *hi]. */
static void
ephemeral_range(int *lo, int *hi)
{
	*lo = 32768;
	*hi = 60999;
	FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
	if (f == NULL)
		return;
	if (fscanf(f, "%d %d", lo, hi) != 2) {
		*lo = 32768;
		*hi = 60999;
	}
	fclose(f);
}

int
pc_free_port(void)
{
	/* A port picked now is bound by its process later. One from the
	 * kernel's ephemeral range may meanwhile become the local port of
	 * any outgoing connection (an agent dialling, curl), and the
	 * listener then fails with EADDRINUSE: so the port comes from
	 * below that range, at random (suites run side by side), never one
	 * given before in this process. */
	static int recent[64];
	static unsigned next;
	static uint64_t rng;
	if (rng == 0)
		rng = pc_now_ns() ^ ((uint64_t) getpid() << 32) ^
		    0x9e3779b97f4a7c15ull;
	int lo, hi;
	ephemeral_range(&lo, &hi);
	int base = 10000, span = lo - 1 - base;
	for (int tries = 0; tries < 1000; tries++) {
		int p = -1;
		if (span >= 1000) {
			rng ^= rng << 13;
			rng ^= rng >> 7;
			rng ^= rng << 17;
			int want = base + (int) (rng % (uint64_t) span);
			if (!can_bind(want, &p))
				continue;
		} else if (!can_bind(0, &p)) {
			return -1;
		}
		bool seen = false;
		for (size_t i = 0; i < sizeof recent / sizeof recent[0]; i++)
			seen |= recent[i] == p;
		if (seen)
			continue;
		recent[next++ % (sizeof recent / sizeof recent[0])] = p;
		return p;
	}
	return -1;
}

void
pc_mkdtemp(char *buf, size_t len, const char *prefix)
{
	int n = snprintf(buf, len, "%s-XXXXXX", prefix);
	PC_CHECK(n > 0 && (size_t) n < len, "directory prefix too long: %s",
	    prefix);
	PC_CHECK(mkdtemp(buf) != NULL, "mkdtemp %s: %s", buf, strerror(errno));
}

/* ---- children ---- */

/* This process's environment with `env` added, each entry replacing one
 * of the same name; malloc'd array of borrowed strings. */
static char **
env_with(const char *const *env)
{
	size_t n = 0, k = 0;
	while (environ[n] != NULL)
		n++;
	while (env != NULL && env[k] != NULL)
		k++;
	char **envp = calloc(n + k + 1, sizeof *envp);
	PC_CHECK(envp != NULL, "out of memory");
	size_t m = 0;
	for (size_t i = 0; i < n; i++) {
		bool replaced = false;
		for (size_t j = 0; j < k && !replaced; j++) {
			const char *eq = strchr(env[j], '=');
			size_t len = eq != NULL ? (size_t) (eq - env[j]) + 1 :
			                          strlen(env[j]);
			replaced = strncmp(environ[i], env[j], len) == 0;
		}
		if (!replaced)
			envp[m++] = environ[i];
	}
	for (size_t j = 0; j < k; j++)
		envp[m++] = (char *) env[j];
	envp[m] = NULL;
	return envp;
}

pid_t
pc_spawn_env(char *const argv[], const char *const *env, const char *log_path)
{
	char **envp = env_with(env);
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid != 0) {
		free(envp);
		PC_CHECK(pid > 0, "fork: %s", strerror(errno));
		return pid;
	}
	/* A test that fails stops without its clean-up: its processes
	 * must not outlive it (nor start if it is gone already). */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(126);
	int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
	if (fd >= 0) {
		dup2(fd, STDOUT_FILENO);
		dup2(fd, STDERR_FILENO);
		close(fd);
	}
	execve(argv[0], argv, envp);
	_exit(127);
}

pid_t
pc_spawn(char *const argv[], const char *log_path)
{
	return pc_spawn_env(argv, NULL, log_path);
}

int
pc_wait_exit(pid_t pid, int timeout_ms)
{
	uint64_t end = pc_now_ms() + (uint64_t) timeout_ms;
	for (;;) {
		int st;
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid) {
			if (WIFEXITED(st))
				return WEXITSTATUS(st);
			if (WIFSIGNALED(st))
				return 128 + WTERMSIG(st);
			return -1;
		}
		if (r < 0 || pc_now_ms() >= end)
			return -1;
		pc_sleep_ms(10);
	}
}

pc_run_result
pc_run(const char *const *argv, const char *dir, const char *cwd,
    const char *env_name, const char *env_value, int timeout_ms)
{
	char out_path[256], err_path[256];
	snprintf(out_path, sizeof out_path, "%s/run-%d.out", dir, getpid());
	snprintf(err_path, sizeof err_path, "%s/run-%d.err", dir, getpid());
	pid_t pid = fork();
	PC_CHECK(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		int fo = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		int fe = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fo < 0 || fe < 0 || (cwd != NULL && chdir(cwd) != 0))
			_exit(126);
		dup2(fo, STDOUT_FILENO);
		dup2(fe, STDERR_FILENO);
		if (env_name != NULL)
			setenv(env_name, env_value, 1);
		execv(argv[0], (char *const *) argv);
		_exit(127);
	}
	pc_run_result r = { .status = pc_wait_exit(pid, timeout_ms) };
	if (r.status < 0) {
		kill(pid, SIGKILL);
		pc_wait_exit(pid, 2000);
	}
	r.out = pc_read_file(out_path);
	r.err = pc_read_file(err_path);
	unlink(out_path);
	unlink(err_path);
	if (r.out == NULL)
		r.out = strdup("");
	if (r.err == NULL)
		r.err = strdup("");
	return r;
}

void
pc_run_free(pc_run_result *r)
{
	free(r->out);
	free(r->err);
	memset(r, 0, sizeof *r);
}

/* ---- files ---- */

void
pc_write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	PC_CHECK(f != NULL, "cannot write %s: %s", path, strerror(errno));
	int put = fputs(text, f);
	int closed = fclose(f);
	PC_CHECK(put >= 0 && closed == 0, "cannot write %s", path);
}

void
pc_rm_rf(const char *dir)
{
	char cmd[512];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
}

/* Everything `f` yields, NUL terminated (malloc'd), with its length;
 * NULL when out of memory. */
static char *
slurp(FILE *f, size_t *ret_len)
{
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap + 1);
	while (buf != NULL) {
		size_t n = fread(buf + len, 1, cap - len, f);
		len += n;
		if (n == 0)
			break;
		if (len == cap) {
			char *nb = realloc(buf, cap * 2 + 1);
			if (nb == NULL) {
				free(buf);
				return NULL;
			}
			buf = nb;
			cap *= 2;
		}
	}
	if (buf != NULL)
		buf[len] = '\0';
	*ret_len = len;
	return buf;
}

char *
pc_read_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (f == NULL)
		return NULL;
	size_t len;
	char *buf = slurp(f, &len);
	fclose(f);
	return buf;
}

char *
pc_shell(const char *cmd)
{
	FILE *p = popen(cmd, "r");
	if (p == NULL)
		return NULL;
	size_t len = 0;
	char *buf = slurp(p, &len);
	int st = pclose(p);
	if (buf == NULL)
		return NULL;
	while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == ' '))
		buf[--len] = '\0';
	if (st != 0) {
		free(buf);
		return NULL;
	}
	return buf;
}

bool
pc_log_has_sanitizer_report(const char *log_path)
{
	char *text = pc_read_file(log_path);
	bool dirty = text != NULL &&
	    (strstr(text, "Sanitizer") != NULL ||
	        strstr(text, "runtime error:") != NULL);
	if (dirty)
		fprintf(stderr, "%s\n", text);
	free(text);
	return dirty;
}
