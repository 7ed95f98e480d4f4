/* SPDX-License-Identifier: MIT */
/*
 * Valid but hostile peers against a real allotd (docs/reliability.md,
 * "Adversary"): each case replays one attack, bounded in count and time,
 * and asserts the honest side's figures, not only that allotd survived.
 *
 * HTTP exhaustion: an attacker holds as many idle and half-sent
 * connections to the status port as it can. Its own address gets no more
 * than --http-max-per-address of them, the rest are refused and counted,
 * /healthz keeps answering another address, the sync port keeps accepting
 * new agents, and once the idle timeout passes every held connection has
 * been closed by allotd. With the global cap reached from several
 * addresses, the sync port still accepts agents: its descriptors are not
 * the HTTP listener's.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto_client.h"
#include "runner.h"

#define SVC "checkout"
#define PER_ADDRESS 8
#define MAX_CONNS 24
#define IDLE_S 2

static const char cfg_text[] = "quotas:\n"
                               "  default:\n"
                               "    tokens_per_second: 10\n"
                               "    burst: 20\n"
                               "  callers:\n"
                               "    - identity: \"spiffe://test/a\"\n"
                               "      tokens_per_second: 400\n"
                               "      burst: 800\n";

static const char *const keys[] = { "default", "spiffe://test/a" };

typedef struct coord {
	char dir[128];
	char log[192];
	char url[64];
	int http;
	pid_t pid;
} coord;

static void
coord_start(coord *c)
{
	memset(c, 0, sizeof *c);
	snprintf(c->dir, sizeof c->dir, "/tmp/allot-adversary-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(c->dir));
	char cfg[192], db[192], http[32], maxc[16], pera[16], idle[16];
	snprintf(cfg, sizeof cfg, "%s/quotas.yaml", c->dir);
	snprintf(db, sizeof db, "%s/allot.db", c->dir);
	snprintf(c->log, sizeof c->log, "%s/allotd.log", c->dir);
	pc_write_file(cfg, cfg_text);
	int port = pc_free_port();
	c->http = pc_free_port();
	snprintf(c->url, sizeof c->url, "tcp://127.0.0.1:%d", port);
	snprintf(http, sizeof http, "127.0.0.1:%d", c->http);
	snprintf(maxc, sizeof maxc, "%d", MAX_CONNS);
	snprintf(pera, sizeof pera, "%d", PER_ADDRESS);
	snprintf(idle, sizeof idle, "%d", IDLE_S);
	const char *args[] = { "--config", cfg, "--db", db, "--listen", c->url,
		"--http", http, "--http-max-connections", maxc,
		"--http-max-per-address", pera, "--http-idle-timeout", idle,
		"--interval-ms", "100", NULL };
	c->pid = pc_allotd_start(args, c->http, c->log);
}

static void
coord_stop(coord *c)
{
	pc_allotd_stop(c->pid, 5000);
	bool dirty = pc_log_has_sanitizer_report(c->log);
	pc_rm_rf(c->dir);
	ck_assert_msg(!dirty, "allotd reported a sanitizer error");
}

/* A TCP connection to 127.0.0.1:port leaving from `from`; -1 if the
 * connect itself fails. */
static int
tcp_from(const char *from, int port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	ck_assert_int_ge(fd, 0);
	struct sockaddr_in src = { .sin_family = AF_INET };
	ck_assert_int_eq(inet_pton(AF_INET, from, &src.sin_addr), 1);
	ck_assert_int_eq(bind(fd, (struct sockaddr *) &src, sizeof src), 0);
	struct sockaddr_in dst = { .sin_family = AF_INET,
		.sin_port = htons((uint16_t) port) };
	inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
	if (connect(fd, (struct sockaddr *) &dst, sizeof dst) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* True once the peer has closed `fd` (read gives 0 or an error), waiting
 * at most `ms`. */
static bool
closed_by_peer(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	if (poll(&p, 1, ms) <= 0)
		return false;
	char b[256];
	ssize_t n = recv(fd, b, sizeof b, MSG_DONTWAIT);
	return n == 0 || (n < 0 && errno != EAGAIN);
}

/* Connections from `from`, alternately idle and with half a request, then
 * how many of them allotd kept open after a moment. */
static size_t
hold(const char *from, int port, int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		fds[i] = tcp_from(from, port);
		if (fds[i] >= 0 && i % 2 == 1) {
			static const char half[] = "GET /status HTTP/1.1\r\n";
			ck_assert_int_eq(
			    send(fds[i], half, sizeof half - 1, 0),
			    (ssize_t) sizeof half - 1);
		}
	}
	pc_sleep_ms(300);
	size_t open = 0;
	for (size_t i = 0; i < n; i++)
		if (fds[i] >= 0 && !closed_by_peer(fds[i], 0))
			open++;
	return open;
}

static void
release(int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

static void
assert_agent_joins(const coord *c, const char *id)
{
	pc_replica r;
	int rc = pc_replica_join(&r, c->url, id, SVC, keys, 2);
	ck_assert_msg(rc == 0, "a new agent was refused (%d)", rc);
	ck_assert_int_eq(pc_replica_sync(&r, NULL, 0, NULL), 0);
	pc_replica_close(&r);
}

START_TEST(test_http_one_address)
{
	coord c;
	coord_start(&c);
	enum { N = 60 };
	int fds[N];
	size_t open = hold("127.0.0.2", c.http, fds, N);
	ck_assert_msg(open <= PER_ADDRESS,
	    "one address holds %zu connections, cap %d", open, PER_ADDRESS);

	/* Another address is served, and agents still join. */
	int status = 0;
	char *body = pc_http_get(c.http, "/healthz", &status);
	ck_assert_ptr_nonnull(body);
	ck_assert_int_eq(status, 200);
	free(body);
	assert_agent_joins(&c, "r-one-address");
	double refused =
	    pc_metric_get(c.http, "allotd_http_refused_total");
	ck_assert_msg(refused >= N - PER_ADDRESS, "refused %.0f, want >= %d",
	    refused, N - PER_ADDRESS);

	/* Idle and half-sent connections are closed after the timeout. */
	size_t still = 0;
	uint64_t deadline = pc_now_ms() + (IDLE_S + 3) * 1000u;
	for (size_t i = 0; i < N; i++) {
		if (fds[i] < 0)
			continue;
		int left = (int) (deadline - pc_now_ms());
		if (!closed_by_peer(fds[i], left > 0 ? left : 0))
			still++;
	}
	ck_assert_msg(still == 0,
	    "%zu connections still open %d s after the idle timeout", still,
	    3);
	release(fds, N);
	coord_stop(&c);
}
END_TEST

START_TEST(test_http_all_addresses)
{
	coord c;
	coord_start(&c);
	enum { ADDRS = 6, N = ADDRS * PER_ADDRESS };
	int fds[N];
	size_t open = 0;
	for (int a = 0; a < ADDRS; a++) {
		char from[32];
		snprintf(from, sizeof from, "127.0.0.%d", 10 + a);
		open += hold(from, c.http, fds + a * PER_ADDRESS, PER_ADDRESS);
	}
	ck_assert_msg(open <= MAX_CONNS, "%zu connections held, cap %d", open,
	    MAX_CONNS);
	/* The HTTP listener is full; the sync port is not. */
	assert_agent_joins(&c, "r-all-addresses");
	release(fds, N);
	/* Once they are gone the listener serves again. */
	int status = 0;
	char *body = NULL;
	for (int i = 0; i < 50 && status != 200; i++) {
		free(body);
		body = pc_http_get(c.http, "/healthz", &status);
		if (status != 200)
			pc_sleep_ms(100);
	}
	free(body);
	ck_assert_int_eq(status, 200);
	coord_stop(&c);
}
END_TEST

static Suite *
adversary_suite(void)
{
	Suite *s = suite_create("adversary");
	TCase *tc = tcase_create("http");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_http_one_address);
	tcase_add_test(tc, test_http_all_addresses);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(adversary_suite)
