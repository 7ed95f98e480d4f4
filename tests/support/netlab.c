/* SPDX-License-Identifier: MIT */
/*
 * Network namespaces for process tests: see netlab.h. Every change goes
 * through the `ip` program (iproute2), run without a shell.
 */
#include "netlab.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* Run `ip` with the words of `fmt` (split on spaces; no quoting needed:
 * every name here is ours). 0 when it exits 0; otherwise its stderr has
 * said why, and -1. */
static int
ip(const char *fmt, ...)
{
	char line[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	char *argv[40] = { "ip" };
	int n = 1;
	for (char *save = NULL, *w = strtok_r(line, " ", &save);
	     w != NULL && n < 39; w = strtok_r(NULL, " ", &save))
		argv[n++] = w;
	argv[n] = NULL;
	pid_t pid;
	if (posix_spawnp(&pid, "ip", NULL, NULL, argv, environ) != 0) {
		fprintf(
		    stderr, "netlab: cannot run ip: %s\n", strerror(errno));
		return -1;
	}
	int st = 0;
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "netlab: failed:");
		for (int i = 0; i < n; i++)
			fprintf(stderr, " %s", argv[i]);
		fprintf(stderr, "\n");
		return -1;
	}
	return 0;
}

int
netlab_available(char *why, size_t len)
{
	if (geteuid() != 0) {
		snprintf(why, len,
		    "not root: network namespaces need "
		    "CAP_SYS_ADMIN and CAP_NET_ADMIN");
		return -1;
	}
	if (access("/usr/sbin/ip", X_OK) != 0 &&
	    access("/usr/bin/ip", X_OK) != 0 &&
	    access("/sbin/ip", X_OK) != 0) {
		snprintf(why, len, "no `ip` program (iproute2)");
		return -1;
	}
	return 0;
}

const char *
netlab_ip(int i)
{
	static char buf[NETLAB_MAX_NODES][16];
	if (i < 0 || i >= NETLAB_MAX_NODES)
		return "0.0.0.0";
	snprintf(buf[i], sizeof buf[i], "10.77.0.%d", i + 1);
	return buf[i];
}

static int
open_ns(const char *name)
{
	char path[96];
	snprintf(path, sizeof path, "/run/netns/%s", name);
	return open(path, O_RDONLY | O_CLOEXEC);
}

int
netlab_create(netlab *lab, const char *dir, int n)
{
	memset(lab, 0, sizeof *lab);
	lab->selffd = -1;
	for (int i = 0; i < NETLAB_MAX_NODES; i++)
		lab->nsfd[i] = -1;
	if (n < 1 || n > NETLAB_MAX_NODES)
		return -1;
	lab->n = n;
	snprintf(lab->prefix, sizeof lab->prefix, "al%d", (int) getpid());
	snprintf(lab->dir, sizeof lab->dir, "%s", dir);
	lab->selffd = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
	if (lab->selffd < 0)
		goto fail;

	const char *p = lab->prefix;
	if (ip("netns add %s-hub", p) != 0)
		goto fail;
	lab->made[NETLAB_MAX_NODES] = true;
	if (ip("-n %s-hub link set lo up", p) != 0 ||
	    ip("-n %s-hub link add br0 type bridge", p) != 0 ||
	    ip("-n %s-hub link set br0 up", p) != 0)
		goto fail;
	for (int i = 0; i < n; i++) {
		if (ip("netns add %s-n%d", p, i) != 0)
			goto fail;
		lab->made[i] = true;
		if (ip("-n %s-hub link add p%d type veth peer name eth0 "
		       "netns %s-n%d",
		        p, i, p, i) != 0 ||
		    ip("-n %s-hub link set p%d master br0 up", p, i) != 0 ||
		    ip("-n %s-n%d addr add %s/24 dev eth0", p, i,
		        netlab_ip(i)) != 0 ||
		    ip("-n %s-n%d link set eth0 up", p, i) != 0 ||
		    ip("-n %s-n%d link set lo up", p, i) != 0)
			goto fail;
		char name[64];
		snprintf(name, sizeof name, "%s-n%d", p, i);
		lab->nsfd[i] = open_ns(name);
		if (lab->nsfd[i] < 0)
			goto fail;
	}
	char pids[192];
	snprintf(pids, sizeof pids, "%s/lab.pids", dir);
	int fd = open(pids, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		goto fail;
	close(fd);
	return 0;
fail:
	fprintf(
	    stderr, "netlab: could not build the lab (%s)\n", strerror(errno));
	netlab_destroy(lab);
	return -1;
}

/* True when /proc/<pid>/cmdline names `dir`: the process is still one
 * this lab started (not a recycled pid). */
static bool
ours(pid_t pid, const char *dir)
{
	char path[64], buf[4096];
	snprintf(path, sizeof path, "/proc/%d/cmdline", (int) pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	ssize_t len = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (len <= 0)
		return false;
	for (ssize_t i = 0; i < len; i++)
		if (buf[i] == '\0')
			buf[i] = ' ';
	buf[len] = '\0';
	return strstr(buf, dir) != NULL;
}

static void
kill_started(const netlab *lab)
{
	char path[192];
	snprintf(path, sizeof path, "%s/lab.pids", lab->dir);
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return;
	pid_t pids[256];
	int n = 0, v;
	while (n < 256 && fscanf(f, "%d", &v) == 1)
		if (v > 1 && ours((pid_t) v, lab->dir))
			pids[n++] = (pid_t) v;
	fclose(f);
	for (int i = 0; i < n; i++)
		kill(pids[i], SIGKILL);
	/* Reap our children; others (a dead test child's) go to init: wait
	 * until /proc no longer shows them, 2 s at most. */
	struct timespec ts = { 0, 10 * 1000 * 1000 };
	for (int round = 0; round < 200; round++) {
		bool left = false;
		for (int i = 0; i < n; i++) {
			if (pids[i] == 0)
				continue;
			if (waitpid(pids[i], NULL, WNOHANG) == pids[i] ||
			    !ours(pids[i], lab->dir))
				pids[i] = 0;
			else
				left = true;
		}
		if (!left)
			break;
		nanosleep(&ts, NULL);
	}
	unlink(path);
}

void
netlab_destroy(netlab *lab)
{
	if (lab->dir[0] != '\0')
		kill_started(lab);
	for (int i = 0; i < NETLAB_MAX_NODES; i++) {
		if (lab->nsfd[i] >= 0)
			close(lab->nsfd[i]);
		lab->nsfd[i] = -1;
		if (lab->made[i])
			ip("netns del %s-n%d", lab->prefix, i);
		lab->made[i] = false;
	}
	if (lab->made[NETLAB_MAX_NODES])
		ip("netns del %s-hub", lab->prefix);
	lab->made[NETLAB_MAX_NODES] = false;
	if (lab->selffd >= 0)
		close(lab->selffd);
	lab->selffd = -1;
}

static int
route(netlab *lab, const char *verb, int a, int b)
{
	if (a < 0 || b < 0 || a >= lab->n || b >= lab->n || a == b)
		return -1;
	if (ip("-n %s-n%d route %s prohibit %s/32", lab->prefix, a, verb,
	        netlab_ip(b)) != 0)
		return -1;
	return ip("-n %s-n%d route %s prohibit %s/32", lab->prefix, b, verb,
	    netlab_ip(a));
}

int
netlab_cut(netlab *lab, int a, int b)
{
	return route(lab, "add", a, b);
}

int
netlab_heal(netlab *lab, int a, int b)
{
	return route(lab, "del", a, b);
}

static void
note_pid(const netlab *lab, pid_t pid)
{
	char path[192], line[24];
	snprintf(path, sizeof path, "%s/lab.pids", lab->dir);
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return;
	int len = snprintf(line, sizeof line, "%d\n", (int) pid);
	if (write(fd, line, (size_t) len) != len)
		fprintf(stderr, "netlab: cannot note pid %d\n", (int) pid);
	close(fd);
}

pid_t
netlab_spawn(netlab *lab, int i, char *const argv[], char *const envp[],
    const char *log_path)
{
	if (i < 0 || i >= lab->n || lab->nsfd[i] < 0)
		return -1;
	int logfd = open(
	    log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
	if (logfd < 0)
		return -1;
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid == 0) {
		/* Only async-signal-safe calls from here on. A process whose
		 * starter dies (a failed assert) must not outlive it. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(126);
		if (setns(lab->nsfd[i], CLONE_NEWNET) != 0)
			_exit(126);
		dup2(logfd, 1);
		dup2(logfd, 2);
		int null = open("/dev/null", O_RDONLY);
		if (null >= 0)
			dup2(null, 0);
		execve(argv[0], argv, envp != NULL ? envp : environ);
		_exit(127);
	}
	close(logfd);
	if (pid > 0)
		note_pid(lab, pid);
	return pid;
}

int
netlab_enter(netlab *lab, int i)
{
	if (i < 0 || i >= lab->n || lab->nsfd[i] < 0)
		return -1;
	return setns(lab->nsfd[i], CLONE_NEWNET);
}

int
netlab_leave(netlab *lab)
{
	return setns(lab->selffd, CLONE_NEWNET);
}
