/* SPDX-License-Identifier: MIT */
/*
 * What the sidecar suites share (test_sidecar.c, sidecar_room.c): a
 * real allot-agentd on loopback, the Python gRPC client, raw
 * connections to its gRPC port.
 */
#ifndef ALLOT_TESTS_SIDECAR_FIXTURE_H
#define ALLOT_TESTS_SIDECAR_FIXTURE_H

#include <stdbool.h>
#include <sys/types.h>

#include <check.h>

#define PY "/usr/bin/python3"
#define ID_BURSTER "spiffe://test.example/ns/a/sa/burster"

/* What an HTTP/2 client sends first (RFC 9113, 3.4). */
static const char h2_preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/* The seed-002 quota file: the burster's 5/s and 10, and "load" without
 * a practical limit. */
extern const char cfg_burst[];

struct agentd {
	pid_t pid;
	char dir[128];
	char log[192];
	char sock[192];
	int grpc_port, http_port;
};

/* $ALLOT_SOURCE_DIR, or ".". */
const char *source_dir(void);
/* Start allot-agentd with the quota `cfg` and extra arguments (NULL
 * terminated), and wait until /healthz answers. */
void agentd_start(struct agentd *a, const char *cfg, const char *const *extra);
/* SIGTERM, a clean exit without a sanitizer report, the directory gone. */
void agentd_stop(struct agentd *a);
/* Whether the shell command `cmd` succeeds. */
bool have(const char *cmd);
/* Exit 77 (skipped) without the Python gRPC modules or curl. */
void need_tools(void);
/* Run the Python client (tests/sidecar_client.py); its JSON output,
 * malloc'd. */
char *py(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* How many times `needle` occurs in `hay`. */
int count(const char *hay, const char *needle);
/* A TCP connection to `port` on loopback, nothing sent yet. */
int idle_conn(int port);

/* sidecar_room.c: the listeners' room under idle, unused and slow
 * connections (check's tcase "room"). */
TCase *sidecar_room_tcase(void);
/* sidecar_values.c: a bucket per value of a descriptor entry (check's
 * tcase "values"). */
TCase *sidecar_values_tcase(void);

#endif
