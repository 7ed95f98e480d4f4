/* SPDX-License-Identifier: MIT */
/*
 * allot-agentd's listeners under clients that hold connections without
 * using them (issue 27): the gRPC listener with its table full of idle
 * HTTP/2 connections and out of descriptors, the HTTP listener with
 * every place held by connections that never finish a request. A new
 * caller gets in either way, and a request in course is never cut.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <check.h>

#include <allot/allot.h>

#include "adv_report.h"
#include "proc.h"
#include "proto_client.h"
#include "sidecar_fixture.h"

/* `n` TCP connections to the gRPC port opened at once (non-blocking
 * connects, then waited for): they arrive faster than one worker
 * accepts, so both workers take some. */
static void
idle_burst(int port, int *fds, int n)
{
	struct sockaddr_in sa = { .sin_family = AF_INET,
		.sin_port = htons((uint16_t) port) };
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	for (int i = 0; i < n; i++) {
		fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		ck_assert_int_ge(fds[i], 0);
		int rc = connect(fds[i], (struct sockaddr *) &sa, sizeof sa);
		ck_assert(rc == 0 || errno == EINPROGRESS);
	}
	for (int i = 0; i < n; i++) {
		struct pollfd p = { .fd = fds[i], .events = POLLOUT };
		ck_assert_int_eq(poll(&p, 1, 5000), 1);
	}
}

/* A PING on connection `fd` (after HTTP/2's preface and SETTINGS when
 * `hello`); errors ignored: the daemon may have closed it. */
static void
h2_ping(int fd, bool hello)
{
	static const uint8_t settings[9] = { 0, 0, 0, 4 };
	static const uint8_t ping[17] = { 0, 0, 8, 6, 0, 0, 0, 0, 0, 'p', 'i',
		'n', 'g' };
	int fl = MSG_NOSIGNAL | MSG_DONTWAIT;
	if (hello &&
	    (send(fd, h2_preface, sizeof h2_preface - 1, fl) < 0 ||
	        send(fd, settings, sizeof settings, fl) < 0))
		return;
	(void) send(fd, ping, sizeof ping, fl);
}

/* A gRPC connection with a stream that never ends: the preface,
 * SETTINGS, and the headers of a ShouldRateLimit call without its body.
 * Never idle (a stream is open), so never evicted. True when the daemon
 * served it (its SETTINGS came and it stayed open), false when it was
 * refused (closed). */
static bool
busy_conn(int port, int *ret)
{
	static const char path[] =
	    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
	uint8_t f[128] = { 0, 0, 0, 4, 0, 0, 0, 0, 0 }; /* SETTINGS */
	size_t n = 9 + 9, hb;
	int fd = idle_conn(port);
	/* HEADERS, stream 1, END_HEADERS only; HPACK: :method POST (static
	 * 3), :scheme http (6), :path literal (name 4), content-type
	 * literal (name 31). */
	f[n++] = 0x83;
	f[n++] = 0x86;
	f[n++] = 0x04;
	f[n++] = (uint8_t) (sizeof path - 1);
	memcpy(f + n, path, sizeof path - 1);
	n += sizeof path - 1;
	f[n++] = 0x0f;
	f[n++] = 31 - 15;
	f[n++] = 16;
	memcpy(f + n, "application/grpc", 16);
	n += 16;
	hb = n - 18;
	memcpy(f + 9, (uint8_t[]) { 0, 0, (uint8_t) hb, 1, 4, 0, 0, 0, 1 }, 9);
	*ret = fd;
	/* A refused connection may be closed already: no SIGPIPE. */
	if (send(fd, h2_preface, sizeof h2_preface - 1, MSG_NOSIGNAL) <= 0 ||
	    send(fd, f, n, MSG_NOSIGNAL) != (ssize_t) n)
		return false;
	struct timeval tv = { 3, 0 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	uint8_t buf[256];
	ssize_t got = recv(fd, buf, sizeof buf, 0);
	pc_sleep_ms(50);
	return got >= 9 && buf[3] == 4 /* SETTINGS */ &&
	    recv(fd, buf, sizeof buf, MSG_DONTWAIT) != 0;
}

/* The descriptors `pid` holds. */
static int
open_fds(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/fd", (int) pid);
	DIR *dir = opendir(path);
	ck_assert_ptr_nonnull(dir);
	int n = 0;
	for (struct dirent *e; (e = readdir(dir)) != NULL;)
		n += e->d_name[0] != '.';
	closedir(dir);
	return n;
}

/* CPU time `pid` used so far, in clock ticks (user and system). */
static long
cpu_ticks(pid_t pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%d/stat", (int) pid);
	FILE *f = fopen(path, "r");
	ck_assert_ptr_nonnull(f);
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* After the command's closing parenthesis: state is field 3,
	 * utime 14 and stime 15. */
	const char *p = strrchr(buf, ')');
	ck_assert_ptr_nonnull(p);
	long ut = 0, st = 0;
	ck_assert_int_eq(sscanf(p + 2,
	                     "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u "
	                     "%ld %ld",
	                     &ut, &st),
	    2);
	return ut + st;
}

/* Wait until allot-agentd has accepted `n` gRPC connections in all: an
 * idle connection's quiet second, what eviction waits for, starts when
 * the daemon accepts it, which under load comes after the connect. */
static void
await_accepted(int http_port, double n)
{
	uint64_t end = pc_now_ms() + 5000;
	while (pc_metric_get(
	           http_port, "allot_agentd_grpc_connections_total") < n &&
	    pc_now_ms() < end)
		pc_sleep_ms(10);
}

/* A call on a new connection: whether it was answered OK (if not, the
 * gRPC status and message the client saw are printed). */
static bool
call_ok(int port)
{
	char *out = py("call 127.0.0.1:%d '{\"descriptors\": [{\"entries\": "
	               "[[\"caller\", \"load\"]]}]}'",
	    port);
	bool ok = strstr(out, "\"overall\": \"OK\"") != NULL;
	if (!ok)
		fprintf(stderr, "sidecar: the call on a new connection: %s\n",
		    out);
	free(out);
	return ok;
}

/* Idle connections cannot hold the daemon (issue 27: 1,100 idle gRPC
 * connections failed 5,009 of 5,210 calls on new ones for the 300 s
 * idle timeout, and out of descriptors both workers spun at 185 % CPU).
 * With the connection table full of connections that never send, a new
 * client takes the place of the one quiet the longest once it has been
 * quiet for a second; out of descriptors, the same, and a worker with
 * nothing to evict pauses its listener instead of spinning. Fails
 * without evict_idle() (the call is refused) or without the pause (the
 * workers burn a CPU each). */
START_TEST(idle_connections_make_room)
{
	need_tools();
	/* The connection table: 16 connections that open no stream, opened
	 * at once so that both workers hold some. Workers evict only their
	 * own connections: a new one accepted by a worker with no idle
	 * connection left is handed to the other (before, it was refused:
	 * the flake this case had, 2 runs in about 20, "Socket closed").
	 * Then 16 new connections, each with a stream open (never idle),
	 * take the 16 places one by one, whichever worker holds them; a
	 * 17th finds nothing to evict and is refused; one freed place
	 * serves a new client. */
	const char *extra[] = { "--max-connections", "16", "--grpc-threads",
		"2", NULL };
	struct agentd a;
	agentd_start(&a, cfg_burst, extra);
	int fds[16], busy[17];
	idle_burst(a.grpc_port, fds, 16);
	await_accepted(a.http_port, 16);
	/* They speak HTTP/2 and send a PING every 200 ms and before each
	 * newcomer: no stream, so as idle as silent ones. */
	for (int t = 0; t < 7; t++) {
		for (int i = 0; i < 16; i++)
			h2_ping(fds[i], t == 0);
		pc_sleep_ms(200);
	}
	int served = 0;
	for (int i = 0; i < 16; i++) {
		for (int j = 0; j < 16; j++)
			h2_ping(fds[j], false);
		served += busy_conn(a.grpc_port, &busy[i]);
	}
	double evicted = pc_metric_get(
	    a.http_port, "allot_agentd_grpc_evicted_connections_total");
	fprintf(stderr,
	    "sidecar: 16 idle connections, 16 new ones: %d served, %.0f "
	    "evicted\n",
	    served, evicted);
	ck_assert_msg(served == 16 && evicted == 16,
	    "%d of 16 new connections served with the table full of idle "
	    "ones, %.0f evicted",
	    served, evicted);
	ck_assert_msg(!busy_conn(a.grpc_port, &busy[16]),
	    "a 17th connection was served with nothing idle to evict");
	close(busy[16]);
	close(busy[0]);
	pc_sleep_ms(200);
	ck_assert_msg(call_ok(a.grpc_port),
	    "a new client was refused with a place free");
	for (int i = 0; i < 16; i++) {
		close(fds[i]);
		if (i > 0)
			close(busy[i]);
	}
	agentd_stop(&a);

	/* The descriptors: the daemon's limit set to what it holds and 8
	 * more, then 12 idle connections (8 accepted, 4 left waiting). */
	agentd_start(&a, cfg_burst, extra + 2);
	rlim_t lim = (rlim_t) open_fds(a.pid) + 8;
	struct rlimit rl = { lim, lim };
	ck_assert_int_eq(prlimit(a.pid, RLIMIT_NOFILE, &rl, NULL), 0);
	for (int i = 0; i < 12; i++)
		fds[i] = idle_conn(a.grpc_port);
	/* Not await_accepted(): out of descriptors, the HTTP listener
	 * cannot accept either. 600 ms of slack for a late accept. */
	pc_sleep_ms(600);
	long t0 = cpu_ticks(a.pid);
	pc_sleep_ms(1000);
	long used = cpu_ticks(a.pid) - t0;
	long hz = sysconf(_SC_CLK_TCK);
	fprintf(stderr,
	    "sidecar: out of descriptors, %ld ticks of %ld in a second\n",
	    used, hz);
	ck_assert_msg(used < hz / 4,
	    "out of descriptors, allot-agentd used %ld of %ld ticks "
	    "in a second",
	    used, hz);
	ck_assert_msg(call_ok(a.grpc_port),
	    "a new client was refused out of descriptors");
	char *m = pc_http_get(a.http_port, "/metrics", &(int) { 0 });
	ck_assert_ptr_nonnull(m);
	ck_assert_msg(
	    strstr(m,
	        "allot_agentd_build_info{version=\"" ALLOT_VERSION_STRING
	        "\"} 1") != NULL &&
	        strstr(m, "allot_agentd_grpc_accept_pauses_total 0") == NULL &&
	        strstr(m, "allot_agentd_grpc_evicted_connections_total 0") ==
	            NULL,
	    "%s", m);
	free(m);
	for (int i = 0; i < 12; i++)
		close(fds[i]);
	agentd_stop(&a);
}
END_TEST

/* A client that keeps opening connections to `port` it never uses: a
 * new one every 25 ms, each closed 64 later (so it holds 64). Eight
 * unproven places then turn over every 200 ms, far within the idle
 * second; at 10 ms a call's own connection, unproven until its stream,
 * was pushed out after 80 ms once in four runs of scripts/test (its
 * Python client slow beside two other suites). */
struct churn {
	int port;
	atomic_bool stop;
	pthread_t thread;
};

static void *
churn_main(void *arg)
{
	struct churn *ch = arg;
	int ring[64];
	for (int i = 0; i < 64; i++)
		ring[i] = -1;
	for (unsigned i = 0; !atomic_load(&ch->stop); i++) {
		if (ring[i % 64] >= 0)
			close(ring[i % 64]);
		ring[i % 64] = idle_conn(ch->port);
		pc_sleep_ms(25);
	}
	for (int i = 0; i < 64; i++)
		if (ring[i] >= 0)
			close(ring[i]);
	return NULL;
}

/* Connections never used, opened without pause (a slowloris that keeps
 * every place younger than the idle second): those that never opened a
 * stream hold at most half the table, each newcomer taking the oldest
 * one's place (grpc.c, evict_unproven()), so calls still get in. Fails
 * with eviction of idle connections alone: a place is never a second
 * old, and every call is refused (0 of 8 on 9e14fd5). */
START_TEST(unused_grpc_connections_pushed_out)
{
	const char *extra[] = { "--max-connections", "16", "--grpc-threads",
		"2", NULL };
	struct agentd a;
	agentd_start(&a, cfg_burst, extra);
	struct churn ch = { .port = a.grpc_port };
	ck_assert_int_eq(pthread_create(&ch.thread, NULL, churn_main, &ch), 0);
	pc_sleep_ms(700);
	int ok = 0;
	for (int i = 0; i < 8; i++)
		ok += call_ok(a.grpc_port);
	atomic_store(&ch.stop, true);
	pthread_join(ch.thread, NULL);
	double evicted = pc_metric_get(
	    a.http_port, "allot_agentd_grpc_evicted_connections_total");
	adv_report("connections to allot-agentd's gRPC port opened every "
	           "25 ms and never used (64 held), 16 places",
	    "every call answered: those that never opened a stream hold at "
	    "most half the places",
	    "(not in the issue; with idle eviction alone, 0 of 8 calls "
	    "answered)",
	    ok == 8,
	    "%d of 8 calls answered, %.0f unused connections "
	    "closed to make room",
	    ok, evicted);
	ck_assert_msg(ok == 8, "%d of 8 calls answered", ok);
	agentd_stop(&a);
}
END_TEST

/* A connection to the HTTP port that starts a request and never
 * finishes its headers (a slowloris). */
static int
slow_http(int port)
{
	int fd = idle_conn(port);
	static const char part[] = "POST /v1/acquire HTTP/1.1\r\nHost: x\r\n";
	ck_assert_int_eq(write(fd, part, sizeof part - 1), sizeof part - 1);
	return fd;
}

/* Connections that never finish a request cannot hold the HTTP
 * listener (issue 27: 1,100 of them failed 6,823 of 6,836 legitimate
 * calls for the 300 s idle timeout). 48 of them held open against 16
 * places, a new one opened before every call: those that have not
 * finished a request hold at most half the places, each newcomer taking
 * the oldest one's (http_room.c), so every call gets in. Fails without
 * http_room.c (16 and 17 of 48 calls answered on 9e14fd5: libmicrohttpd
 * refuses every connection at its limit), and with eviction of idle
 * connections alone (after a second; 16 of 48 as well: the new slow ones
 * are never a second old). */
START_TEST(slow_http_connections_make_room)
{
	const char *extra[] = { "--max-connections", "16", NULL };
	struct agentd a;
	agentd_start(&a, cfg_burst, extra);
	int fds[48];
	for (int i = 0; i < 48; i++)
		fds[i] = slow_http(a.http_port);
	/* Another one before each call: the slowloris keeps opening. */
	int ok = 0, calls = 48;
	for (int i = 0; i < calls; i++) {
		close(fds[i]);
		fds[i] = slow_http(a.http_port);
		int st = 0;
		char *r = pc_http_get(
		    a.http_port, "/v1/remaining?identity=load", &st);
		ok += r != NULL && st == 200;
		free(r);
	}
	double evicted = pc_metric_get(
	    a.http_port, "allot_agentd_http_evicted_connections_total");
	double refused = pc_metric_get(
	    a.http_port, "allot_agentd_http_refused_connections_total");
	adv_report("connections to allot-agentd's HTTP port that never "
	           "finish a request (slowloris), 48 held and one more "
	           "before each call, 16 places",
	    "every call answered: those that never finished a request "
	    "hold at most half the places",
	    "1,100 of them failed 6,823 of 6,836 legitimate calls for the "
	    "300 s idle timeout",
	    ok == calls && evicted >= 1,
	    "%d of %d calls answered, each on a new connection; %.0f slow "
	    "ones closed to make room, %.0f newcomers closed at once",
	    ok, calls, evicted, refused);
	ck_assert_msg(ok == calls,
	    "%d of %d calls answered with the listener held by slow "
	    "connections (%.0f evicted)",
	    ok, calls, evicted);
	ck_assert(evicted >= 1);
	for (int i = 0; i < 48; i++)
		close(fds[i]);
	agentd_stop(&a);
}
END_TEST

TCase *
sidecar_room_tcase(void)
{
	TCase *tc = tcase_create("room");
	tcase_set_timeout(tc, 120);
	tcase_add_unchecked_fixture(tc, need_tools, NULL);
	tcase_add_test(tc, idle_connections_make_room);
	tcase_add_test(tc, unused_grpc_connections_pushed_out);
	tcase_add_test(tc, slow_http_connections_make_room);
	return tc;
}
