/* SPDX-License-Identifier: MIT */
/*
 * A small network lab of Linux network namespaces for process tests and
 * benchmarks that cut links between real processes (tests/
 * test_partition.c, bench/cluster.c). Needs root (CAP_SYS_ADMIN and
 * CAP_NET_ADMIN).
 *
 * Layout: a hub namespace holding one bridge, and `n` node namespaces,
 * each with one veth to the bridge carrying 10.77.0.<i+1>/24 (as eth0)
 * and its loopback up. Nothing is created in the caller's own namespace,
 * so labs of concurrent runs never collide; names carry the creator's
 * pid. A link is cut with a `prohibit` route to the other node in both
 * namespaces (connections fail at once, as a firewall's reject would),
 * and healed by deleting both routes.
 *
 * Processes are started inside a node with fork + setns + exec (nng
 * dials from its own threads, so a setns on one thread of a process that
 * is already running would not take its sockets along). Every pid is
 * appended to `<dir>/lab.pids`, so that whoever tears the lab down,
 * even a parent process after the child that spawned them died on a
 * failed assert, kills exactly the processes this lab started: a pid
 * is killed only if its command line still names `dir`.
 *
 * No check.h here: errors are returned (and printed), so that the
 * benchmarks can use it too.
 */
#ifndef ALLOT_TESTS_SUPPORT_NETLAB_H
#define ALLOT_TESTS_SUPPORT_NETLAB_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define NETLAB_MAX_NODES 8

typedef struct netlab {
	char prefix[32]; /* "al<pid>": namespace names <prefix>-hub, -n<i> */
	char dir[128]; /* scratch directory; its pids file */
	int n;
	int nsfd[NETLAB_MAX_NODES];
	int selffd; /* the caller's own network namespace */
	bool made[NETLAB_MAX_NODES + 1]; /* namespaces created: hub last */
} netlab;

/* 0 when this process may build namespaces (root, `ip` present); else
 * -1 with the reason in `why`. */
int netlab_available(char *why, size_t len);

/* Create the lab: `n` nodes (at most NETLAB_MAX_NODES) under `dir`
 * (which must exist). 0, or -1 after undoing what was made. */
int netlab_create(netlab *lab, const char *dir, int n);
/* Kill every process the lab started (see above), then delete its
 * namespaces. Safe to call twice, and from a process other than the
 * one that created it when `lab` was copied to it (fork). */
void netlab_destroy(netlab *lab);

/* Node i's address, "10.77.0.<i+1>". */
const char *netlab_ip(int i);

/* Cut or heal the link between nodes a and b (both directions). 0 or
 * -1. Cutting a link already cut is an error, as is healing one that is
 * not cut. */
int netlab_cut(netlab *lab, int a, int b);
int netlab_heal(netlab *lab, int a, int b);

/* Start argv[0] (a path) with `argv` and `envp` (NULL: this process's)
 * in node i, stdout and stderr appended to `log_path`. The pid, or -1. */
pid_t netlab_spawn(netlab *lab, int i, char *const argv[], char *const envp[],
    const char *log_path);

/* Run the calling thread in node i's namespace (for plain sockets made
 * by this thread, e.g. an HTTP GET to a member's 127.0.0.1), and back to
 * the caller's own namespace. 0 or -1. */
int netlab_enter(netlab *lab, int i);
int netlab_leave(netlab *lab);

#endif
