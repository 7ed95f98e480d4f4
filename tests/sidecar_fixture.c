/* SPDX-License-Identifier: MIT */
/* The sidecar suites' shared parts (sidecar_fixture.h). */
#include "sidecar_fixture.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <check.h>

#include "allotd.h"
#include "proc.h"
#include "proto_client.h"

const char cfg_burst[] =
    "quotas:\n"
    "  default: {tokens_per_second: 1, burst: 2}\n"
    "  callers:\n"
    "    - {identity: \"" ID_BURSTER "\", tokens_per_second: 5, "
    "burst: 10}\n"
    "    - {identity: \"load\", tokens_per_second: 1000000, "
    "burst: 1000000}\n"
    "  endpoint_weights: {default: 1, \"/lookup\": 1}\n";

const char *
source_dir(void)
{
	const char *s = getenv("ALLOT_SOURCE_DIR");
	return s != NULL ? s : ".";
}

/* Start allot-agentd with the quota `cfg` and extra arguments (NULL
 * terminated), and wait until /healthz answers. */
void
agentd_start(struct agentd *a, const char *cfg, const char *const *extra)
{
	memset(a, 0, sizeof *a);
	snprintf(a->dir, sizeof a->dir, "/tmp/allot-test-sidecar-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(a->dir));
	char cfgpath[256], grpc[64], http[64];
	char *bin = (char *) pc_program("sidecar/allot-agentd");
	snprintf(cfgpath, sizeof cfgpath, "%s/quotas.yaml", a->dir);
	snprintf(a->log, sizeof a->log, "%s/agentd.log", a->dir);
	snprintf(a->sock, sizeof a->sock, "%s/agentd.sock", a->dir);
	pc_write_file(cfgpath, cfg);
	a->grpc_port = pc_free_port();
	a->http_port = pc_free_port();
	snprintf(grpc, sizeof grpc, "127.0.0.1:%d", a->grpc_port);
	snprintf(http, sizeof http, "127.0.0.1:%d", a->http_port);
	char *argv[40] = { bin, "--config", cfgpath, "--grpc-listen", grpc,
		"--http-listen", http, "--http-socket", a->sock };
	size_t n = 9;
	for (size_t i = 0; extra != NULL && extra[i] != NULL && n < 39; i++)
		argv[n++] = (char *) extra[i];
	argv[n] = NULL;
	a->pid = pc_spawn(argv, a->log);
	for (int i = 0; i < 200; i++) {
		int st = 0;
		char *r = pc_http_get(a->http_port, "/healthz", &st);
		free(r);
		if (st == 200)
			return;
		ck_assert_msg(pc_wait_exit(a->pid, 0) == -1,
		    "allot-agentd exited; log in %s", a->log);
		pc_sleep_ms(25);
	}
	ck_abort_msg("allot-agentd did not answer; log in %s", a->log);
}

void
agentd_stop(struct agentd *a)
{
	if (a->pid > 0) {
		kill(a->pid, SIGTERM);
		int rc = pc_wait_exit(a->pid, 10000);
		ck_assert_msg(
		    rc == 0, "allot-agentd exit %d; log in %s", rc, a->log);
		ck_assert(!pc_log_has_sanitizer_report(a->log));
	}
	if (getenv("ALLOT_KEEP_TMP") == NULL)
		pc_rm_rf(a->dir);
}

bool
have(const char *cmd)
{
	char *out = pc_shell(cmd);
	free(out);
	return out != NULL;
}

void
need_tools(void)
{
	if (!have(PY " -c 'import grpc, grpc_tools' 2>/dev/null") ||
	    !have("curl --version >/dev/null 2>&1")) {
		fprintf(stderr,
		    "test_sidecar: needs " PY " with grpcio and "
		    "grpc_tools, and curl (scripts/bootstrap)\n");
		exit(77);
	}
}

/* Run the Python client; its JSON output, malloc'd. */
char *
py(const char *fmt, ...)
{
	char args[8192], cmd[9000];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(args, sizeof args, fmt, ap);
	va_end(ap);
	snprintf(cmd, sizeof cmd,
	    "ALLOT_SOURCE_DIR=%s " PY " %s/tests/"
	    "sidecar_client.py %s",
	    source_dir(), source_dir(), args);
	char *out = pc_shell(cmd);
	ck_assert_msg(out != NULL, "failed: %s", cmd);
	return out;
}

int
count(const char *hay, const char *needle)
{
	int n = 0;
	for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++)
		n++;
	return n;
}

/* A TCP connection to the gRPC port on loopback, nothing sent yet. */
int
idle_conn(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = { .sin_family = AF_INET,
		.sin_port = htons((uint16_t) port) };
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	ck_assert_int_eq(connect(fd, (struct sockaddr *) &sa, sizeof sa), 0);
	return fd;
}
