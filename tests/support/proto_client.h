/* SPDX-License-Identifier: MIT */
/*
 * A raw allot protocol client for tests and benchmarks: one nng req0
 * socket per simulated replica, protobuf-c messages built by hand, so the
 * tests see exactly what goes over the wire (and can send what a real
 * agent never would). Also a tiny HTTP/1.0 GET over a plain socket for
 * /metrics and /status, the digest of a quota file's text, and a log
 * handler for a liballot agent that records the log ids. The allotd it
 * speaks to comes from allotd.h; processes and files from proc.h.
 */
#ifndef ALLOT_TESTS_SUPPORT_PROTO_CLIENT_H
#define ALLOT_TESTS_SUPPORT_PROTO_CLIENT_H

#include <pthread.h>
#include <stdatomic.h>
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
/* One message in a version-1 Envelope, exchanged as pc_send() does. */
Allot__V1__Envelope *pc_send_register(pc_conn *c, Allot__V1__Register *reg);
Allot__V1__Envelope *pc_send_sync(pc_conn *c, Allot__V1__Sync *sync);
Allot__V1__Envelope *pc_send_ask(pc_conn *c, Allot__V1__Ask *ask);
/* Its two halves, for a client with several connections in flight at
 * once: pack and send `env` (0 or an nng error); receive and decode the
 * answer (NULL on a transport error or timeout). */
int pc_post(pc_conn *c, const Allot__V1__Envelope *env);
Allot__V1__Envelope *pc_collect(pc_conn *c);
void pc_free(Allot__V1__Envelope *env);

Allot__V1__Envelope *pc_register(pc_conn *c, const char *replica_id,
    const char *service, const char *const *keys, size_t nkeys,
    uint32_t interval_ms);
/* The same for an agent that keeps an account (Register.incarnation;
 * 0: none, as pc_register). */
Allot__V1__Envelope *pc_register_account(pc_conn *c, const char *replica_id,
    const char *service, const char *const *keys, size_t nkeys,
    uint32_t interval_ms, uint64_t incarnation);

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
/* Sync `sy` (whatever else it carries) as replica `r`'s next: its
 * session, next seq and `elapsed_ms` filled in. The answer (NULL on a
 * transport failure), to free with pc_free(). */
Allot__V1__Envelope *pc_replica_send(
    pc_replica *r, Allot__V1__Sync *sy, uint32_t elapsed_ms);
void pc_replica_close(pc_replica *r);

/* ---- replicas kept syncing from a thread ---- */

#define PC_DRIVER_MAX 8

/* Writes replica `i`'s reports for its next Sync into `rep` (room for
 * PC_MAX_KEYS); returns how many. Called on the driver's thread. */
typedef size_t (*pc_driver_fill)(void *ctx, size_t i, pc_report *rep);

typedef struct pc_driver {
	pc_replica r[PC_DRIVER_MAX];
	size_t n;
	unsigned period_ms;
	pc_driver_fill fill;
	void *ctx;
	pthread_t thread;
	bool running;
	atomic_bool stop;
	atomic_int syncs; /* answered without an error */
	atomic_int errors; /* answered with one, or not at all */
} pc_driver;

/* Join `n` replicas ID_PREFIX-1 .. ID_PREFIX-n of `service` with
 * `keys[0, nkeys)` to allotd at `url` (fails on a refusal), then Sync
 * each every `period_ms` from a thread, with the reports `fill` gives. */
void pc_driver_start(pc_driver *d, const char *url, const char *id_prefix,
    const char *service, const char *const *keys, size_t nkeys, size_t n,
    unsigned period_ms, pc_driver_fill fill, void *ctx);
/* Stop the thread and close the replicas (nothing if not running). */
void pc_driver_stop(pc_driver *d);

/* ---- HTTP ---- */

/* GET http://127.0.0.1:port/path. Returns the body (malloc'd, NUL
 * terminated) and the status, or NULL. */
char *pc_http_get(int port, const char *path, int *ret_status);
/* The value of the sample whose name and labels are exactly `series`
 * (e.g. "allotd_rejected_messages_total{reason=\"malformed\"}"), or NaN. */
double pc_metric(const char *text, const char *series);
/* Fetch /metrics and return one series (NaN when unavailable). */
double pc_metric_get(int port, const char *series);

/* ---- configs and agents' logs ---- */

/* The digest of a quota file's text (allot_config's, as allotd and the
 * agents compute it); fails if the text does not load. */
uint64_t pc_config_digest(const char *text);

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

#endif
