/* SPDX-License-Identifier: MIT */
/*
 * What the suites that drive real allotd processes share (`coordinator`,
 * `cluster`): a free loopback port, the quota file, starting and stopping
 * allotd (the release build next to the benchmark), one request/reply
 * exchange in protobuf-c over nng req0, registering a session, and the
 * protocol-level load: client threads holding replicas that register
 * their keys with every member and send each member, back to back, a Sync
 * with the reports of the keys it owns, counting the key reports
 * acknowledged per second. With one member this is the coordinator
 * suite's load; with several it is an agent's view of a cluster
 * (docs/operations.md, "Cluster").
 */
#ifndef ALLOT_BENCH_PROTO_H
#define ALLOT_BENCH_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <nng/nng.h>

#include "allot.pb-c.h"

#define PROTO_MAX_MEMBERS 8

/* A fresh /tmp/allot-bench-XXXXXX into `buf` (at least 32 bytes). */
void proto_mkdtemp(char *buf, size_t len);
/* Remove it and everything in it (a failure is only reported). */
void proto_rmdir(const char *dir);

/* The coordinator suite's quota identities, spiffe://bench/cNN, into
 * `buf[0..n)`, with `keys[i]` pointing at `buf[i]`. */
#define PROTO_KEY_MAX 32
void proto_spiffe_keys(char (*buf)[PROTO_KEY_MAX], const char **keys, int n);

/* An agent from the quota file `cfgpath` with `opts` (fails the run on
 * an error). */
struct allot_agent;
struct allot_agent_options;
struct allot_agent *proto_agent(
    const char *cfgpath, const struct allot_agent_options *opts);

/* A TCP port on 127.0.0.1 that was free a moment ago. */
int proto_free_port(void);

/* allotd from the same build tree as this benchmark, into `buf`. */
void proto_allotd_path(char *buf, size_t len);

/*
 * Write a quota file: the default bucket (10/s, burst 20) and one caller
 * per identity with `rate` tokens/s and `burst`, and `fallback` (e.g.
 * "closed") unless NULL.
 */
void proto_write_quotas(const char *path, const char *const *ids, int n,
    double rate, double burst, const char *fallback);

/*
 * Start allotd with --config `cfg`, --db `db`, --http off, --log-level
 * warning, --peer-message-rate 0 and then `args` (NULL-terminated), its
 * stderr into `log`.
 */
pid_t proto_start_allotd(const char *bin, const char *cfg, const char *db,
    const char *log, const char *const *args);

/* SIGTERM, then wait: fails the run unless allotd drained cleanly. */
void proto_stop_allotd(pid_t pid, const char *log);

/* Send one Envelope; 0 or an nng error. */
int proto_send(nng_socket s, Allot__V1__Envelope *env);
/* Receive one Envelope (free with allot__v1__envelope__free_unpacked);
 * NULL on a transport error or undecodable bytes. */
Allot__V1__Envelope *proto_recv(nng_socket s);
/* proto_send, then proto_recv. */
Allot__V1__Envelope *proto_exchange(nng_socket s, Allot__V1__Envelope *env);

typedef struct proto_session {
	nng_socket s;
	uint64_t id;
	uint64_t seq;
} proto_session;

/*
 * Open a req0 socket to `url` (5 s timeouts, dialling for up to 4 s) and
 * register `replica_id` of service "bench" with `keys[0..nkeys)`
 * (T = 1 s). 0 on a Welcome, -1 otherwise.
 */
int proto_join(proto_session *ss, const char *url, const char *replica_id,
    const char *const *keys, int nkeys);

/* The load: threads × replicas_per_thread replicas, each with one
 * session per member. */
typedef struct proto_load {
	int members; /* 1..PROTO_MAX_MEMBERS */
	const char *urls[PROTO_MAX_MEMBERS];
	const char *const *keys; /* registered with every member */
	int nkeys;
	const int *owner; /* per key, the member its reports go to; NULL:
	                     all to member 0 */
	int threads;
	int replicas_per_thread;
	const char *where; /* the logs to see when a join fails */
} proto_load;

typedef struct proto_result {
	double key_reports_per_s; /* acknowledged: neither rejected nor
	                             not_owner */
	uint64_t not_owner; /* reports refused as not_owner while measured */
	uint64_t rejected; /* reports rejected while measured */
} proto_result;

/*
 * Join every replica with every member, let them sync for `warm_ms`,
 * then count for `measure_ms`. Fails the run on any failed exchange.
 */
void proto_load_run(const proto_load *l, unsigned warm_ms, unsigned measure_ms,
    proto_result *ret);

#endif
