/* SPDX-License-Identifier: MIT */
/*
 * Suite `sidecar`: what a decision costs a service that asks allot-agentd
 * instead of embedding liballot, side by side in one run with what
 * envoyproxy/ratelimit pays per decision (one Redis EVALSHA round trip,
 * redis.h). allot-agentd from the same build tree runs with a quota that
 * always allows; then, per round:
 *   - gRPC (Envoy's ShouldRateLimit, h2c on loopback, rlsclient.h): the
 *     latency of one call at a time (p50, p99), and decisions per second
 *     with two client connections of 64 calls in flight each, as Envoy
 *     multiplexes;
 *   - the HTTP/JSON API on the Unix socket, keep-alive: the latency of
 *     one POST /v1/acquire at a time, and decisions per second with four
 *     connections each making one call at a time;
 *   - Redis: the p50 of one EVALSHA at a time.
 * Every call is checked to be an allow (a decision that failed would
 * measure an error path). Medians over rounds are reported.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include "allotd.h"
#include "bench.h"
#include "proc.h"
#include "redis.h"
#include "rlsclient.h"

#define ID "bench"
#define WINDOW 64
#define HTTP_CONNS 4

enum {
	F_GRPC_P50,
	F_GRPC_P99,
	F_GRPC_RATE,
	F_HTTP_P50,
	F_HTTP_P99,
	F_HTTP_RATE,
	F_REDIS,
	F_NOISE,
	NFIG
};

static bench_figure figs[NFIG] = {
	[F_GRPC_P50] = { "sidecar.grpc_p50_ns", "ns", 0,
	    "gRPC ShouldRateLimit, h2c loopback, one call at a time, p50",
	    BENCH_AT_MOST, NAN },
	[F_GRPC_P99] = { "sidecar.grpc_p99_ns", "ns", 0, "the same, p99" },
	[F_GRPC_RATE] = { "sidecar.grpc_decisions_per_s", "/s", 0,
	    "gRPC, 2 connections x 64 calls in flight", BENCH_AT_LEAST,
	    50000 },
	[F_HTTP_P50] = { "sidecar.http_uds_p50_ns", "ns", 0,
	    "POST /v1/acquire, Unix socket, keep-alive, p50", BENCH_AT_MOST,
	    NAN },
	[F_HTTP_P99] = { "sidecar.http_uds_p99_ns", "ns", 0, "the same, p99" },
	[F_HTTP_RATE] = { "sidecar.http_uds_decisions_per_s", "/s", 0,
	    "HTTP on the Unix socket, 4 keep-alive connections" },
	[F_REDIS] = { "sidecar.redis_ns", "ns", 0,
	    "Redis+Lua bucket, one EVALSHA round trip, p50" },
	[F_NOISE] = { "sidecar.noise_cpu_pct", "%", 1,
	    "CPU used by other processes during the run (% of machine)" },
};

static double samples[NFIG][BENCH_MAX_ROUNDS];
static const bench_opts *opts;

struct daemon {
	pid_t pid;
	char dir[64];
	char sock[128];
	int grpc_port;
};

static void
start_daemon(struct daemon *dm)
{
	char cfg[128], port[64], log[128];
	const char *bin = pc_program("sidecar/allot-agentd");
	snprintf(dm->dir, sizeof dm->dir, "/tmp/allot-bench-sidecar-XXXXXX");
	if (mkdtemp(dm->dir) == NULL)
		bench_fail("mkdtemp: %s", strerror(errno));
	snprintf(cfg, sizeof cfg, "%s/quotas.yaml", dm->dir);
	snprintf(dm->sock, sizeof dm->sock, "%s/agentd.sock", dm->dir);
	snprintf(log, sizeof log, "%s/agentd.log", dm->dir);
	FILE *f = fopen(cfg, "w");
	if (f == NULL)
		bench_fail("%s: %s", cfg, strerror(errno));
	fprintf(f,
	    "quotas:\n  default: {tokens_per_second: 1, burst: 1}\n"
	    "  callers:\n    - {identity: \"" ID "\", "
	    "tokens_per_second: 1000000000, burst: 1000000000}\n");
	fclose(f);
	dm->grpc_port = pc_free_port();
	if (dm->grpc_port < 0)
		bench_fail("no free port");
	snprintf(port, sizeof port, "127.0.0.1:%d", dm->grpc_port);
	pid_t parent = getpid();
	dm->pid = fork();
	if (dm->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(126);
		freopen(log, "w", stdout);
		dup2(STDOUT_FILENO, STDERR_FILENO);
		execl(bin, bin, "--config", cfg, "--grpc-listen", port,
		    "--http-listen", "none", "--http-socket", dm->sock,
		    "--log-level", "warning", (char *) NULL);
		_exit(127);
	}
	for (int i = 0; i < 100; i++) {
		rlsc *c = rlsc_connect(dm->grpc_port);
		if (c != NULL && access(dm->sock, F_OK) == 0) {
			rlsc_close(c);
			return;
		}
		rlsc_close(c);
		usleep(50000);
	}
	bench_fail("allot-agentd did not start (log in %s)", log);
}

static void
stop_daemon(struct daemon *dm)
{
	kill(dm->pid, SIGTERM);
	waitpid(dm->pid, NULL, 0);
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dm->dir);
	if (system(cmd) != 0)
		bench_progress(opts, "could not remove %s", dm->dir);
}

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
	return x < y ? -1 : x > y;
}

static double
pct(uint64_t *v, size_t n, double p)
{
	qsort(v, n, sizeof *v, cmp_u64);
	size_t i = (size_t) (p * (double) (n - 1));
	return (double) v[i];
}

/* ---------------------------------------------------------------- */
/* gRPC                                                             */
/* ---------------------------------------------------------------- */

struct grpc_run {
	uint64_t *lat;
	size_t n, bad;
};

static void
grpc_done(void *ctx, int status, const uint8_t *msg, size_t len, uint64_t lat)
{
	struct grpc_run *r = ctx;
	/* overall_code OK is field 1 = 1: bytes 08 01. */
	if (status != 0 || len < 2 || msg[0] != 0x08 || msg[1] != 0x01)
		r->bad++;
	if (r->lat != NULL)
		r->lat[r->n] = lat;
	r->n++;
}

struct grpc_thread {
	int port;
	const uint8_t *body;
	size_t len, calls, done, bad;
};

static void *
grpc_flood(void *arg)
{
	struct grpc_thread *t = arg;
	rlsc *c = rlsc_connect(t->port);
	if (c == NULL)
		return NULL;
	struct grpc_run r = { NULL, 0, 0 };
	t->done = rlsc_run(
	    c, RLSC_PATH, t->body, t->len, t->calls, WINDOW, grpc_done, &r);
	t->bad = r.bad;
	rlsc_close(c);
	return NULL;
}

static void
measure_grpc(const struct daemon *dm, uint64_t calls, unsigned round)
{
	size_t len;
	uint8_t *body = rlsc_request(ID, "/v1", 1, &len);
	rlsc *c = rlsc_connect(dm->grpc_port);
	if (c == NULL || body == NULL)
		bench_fail("gRPC: cannot connect");
	uint64_t *lat = malloc(calls * sizeof *lat);
	struct grpc_run r = { lat, 0, 0 };
	if (rlsc_run(c, RLSC_PATH, body, len, calls, 1, grpc_done, &r) !=
	        calls ||
	    r.bad != 0)
		bench_fail(
		    "gRPC: %zu of %" PRIu64 " calls failed", r.bad, calls);
	rlsc_close(c);
	samples[F_GRPC_P50][round] = pct(lat, calls, 0.5);
	samples[F_GRPC_P99][round] = pct(lat, calls, 0.99);
	free(lat);

	struct grpc_thread t[2];
	pthread_t th[2];
	uint64_t t0 = bench_now_ns();
	for (int i = 0; i < 2; i++) {
		t[i] = (struct grpc_thread) { dm->grpc_port, body, len,
			calls * 4, 0, 0 };
		pthread_create(&th[i], NULL, grpc_flood, &t[i]);
	}
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	double s = (double) (bench_now_ns() - t0) / 1e9;
	if (t[0].done + t[1].done != calls * 8 || t[0].bad + t[1].bad != 0)
		bench_fail("gRPC flood: %zu done, %zu failed",
		    t[0].done + t[1].done, t[0].bad + t[1].bad);
	samples[F_GRPC_RATE][round] = (double) (calls * 8) / s;
	free(body);
}

/* ---------------------------------------------------------------- */
/* HTTP on the Unix socket                                          */
/* ---------------------------------------------------------------- */

static int
uds_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *) &sa, sizeof sa) != 0)
		bench_fail("connect %s: %s", path, strerror(errno));
	return fd;
}

static const char http_req[] =
    "POST /v1/acquire HTTP/1.1\r\nHost: agentd\r\n"
    "Content-Type: application/json\r\nContent-Length: 37\r\n\r\n"
    "{\"identity\":\"" ID "\",\"endpoint\":\"/v1\"}";

/* One call on a keep-alive connection: 1 allowed, 0 not, -1 error. */
static int
http_call(int fd)
{
	if (send(fd, http_req, sizeof http_req - 1, MSG_NOSIGNAL) !=
	    (ssize_t) sizeof http_req - 1)
		return -1;
	char buf[4096];
	size_t len = 0;
	char *end = NULL;
	size_t want = 0;
	for (;;) {
		ssize_t n = recv(fd, buf + len, sizeof buf - 1 - len, 0);
		if (n <= 0)
			return -1;
		len += (size_t) n;
		buf[len] = '\0';
		if (end == NULL && (end = strstr(buf, "\r\n\r\n")) != NULL) {
			const char *cl = strcasestr(buf, "content-length:");
			if (cl == NULL)
				return -1;
			want = (size_t) (end + 4 - buf) +
			    strtoul(cl + 15, NULL, 10);
		}
		if (end != NULL && len >= want)
			break;
		if (len == sizeof buf - 1)
			return -1;
	}
	return strstr(end, "\"allowed\":true") != NULL;
}

struct http_thread {
	const char *sock;
	size_t calls, bad;
};

static void *
http_flood(void *arg)
{
	struct http_thread *t = arg;
	int fd = uds_connect(t->sock);
	for (size_t i = 0; i < t->calls; i++)
		if (http_call(fd) != 1)
			t->bad++;
	close(fd);
	return NULL;
}

static void
measure_http(const struct daemon *dm, uint64_t calls, unsigned round)
{
	int fd = uds_connect(dm->sock);
	uint64_t *lat = malloc(calls * sizeof *lat);
	for (uint64_t i = 0; i < calls; i++) {
		uint64_t t0 = bench_now_ns();
		if (http_call(fd) != 1)
			bench_fail("HTTP: call %" PRIu64 " failed", i);
		lat[i] = bench_now_ns() - t0;
	}
	close(fd);
	samples[F_HTTP_P50][round] = pct(lat, calls, 0.5);
	samples[F_HTTP_P99][round] = pct(lat, calls, 0.99);
	free(lat);

	struct http_thread t[HTTP_CONNS];
	pthread_t th[HTTP_CONNS];
	uint64_t t0 = bench_now_ns();
	for (int i = 0; i < HTTP_CONNS; i++) {
		t[i] = (struct http_thread) { dm->sock, calls, 0 };
		pthread_create(&th[i], NULL, http_flood, &t[i]);
	}
	size_t bad = 0;
	for (int i = 0; i < HTTP_CONNS; i++) {
		pthread_join(th[i], NULL);
		bad += t[i].bad;
	}
	double s = (double) (bench_now_ns() - t0) / 1e9;
	if (bad != 0)
		bench_fail("HTTP flood: %zu calls failed", bad);
	samples[F_HTTP_RATE][round] = (double) (calls * HTTP_CONNS) / s;
}

static void
measure_redis(bench_redis *rd, uint64_t calls, unsigned round)
{
	uint64_t *lat = malloc(calls * sizeof *lat);
	char err[256];
	for (uint64_t i = 0; i < calls; i++) {
		uint64_t t0 = bench_now_ns();
		int rc = bench_redis_acquire(rd, "sidecar", "1000000000",
		    "1000000000", "1", err, sizeof err);
		lat[i] = bench_now_ns() - t0;
		if (rc != 1)
			bench_fail("redis: %s", rc < 0 ? err : "denied");
	}
	samples[F_REDIS][round] = pct(lat, calls, 0.5);
	free(lat);
}

int
main(int argc, char **argv)
{
	bench_opts o;
	bench_parse_args(argc, argv, "sidecar", 20000, &o);
	opts = &o;
	bench_cpu cpu0, cpu1;
	bench_cpu_mark(&cpu0);
	struct daemon dm;
	start_daemon(&dm);
	bench_redis rd;
	char err[256];
	if (!bench_redis_start(&rd, err, sizeof err))
		bench_fail("redis: %s", err);
	bench_progress(&o, "allot-agentd pid %d, gRPC port %d, socket %s",
	    (int) dm.pid, dm.grpc_port, dm.sock);
	/* Warm-up, then rounds of the three side by side. */
	measure_grpc(&dm, o.iters / 10 + 1, 0);
	measure_http(&dm, o.iters / 10 + 1, 0);
	for (unsigned r = 0; r < o.rounds; r++) {
		bench_progress(&o, "round %u/%u (%" PRIu64 " calls each)",
		    r + 1, o.rounds, o.iters);
		measure_grpc(&dm, o.iters, r);
		measure_http(&dm, o.iters, r);
		measure_redis(&rd, o.iters, r);
	}
	bench_redis_stop(&rd);
	stop_daemon(&dm);
	bench_cpu_mark(&cpu1);
	for (int f = 0; f < F_NOISE; f++)
		figs[f].value = bench_median(samples[f], o.rounds);
	figs[F_NOISE].value = bench_cpu_others_pct(&cpu0, &cpu1);
	/* The target of a decision through the sidecar: below one Redis
	 * round trip, measured in the same run. */
	figs[F_GRPC_P50].target = figs[F_REDIS].value;
	figs[F_HTTP_P50].target = figs[F_REDIS].value;
	bench_report(
	    &o, "sidecar: allot-agentd vs a Redis round trip", figs, NFIG);
	return 0;
}
