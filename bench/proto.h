/* SPDX-License-Identifier: MIT */
/*
 * What the benchmark suites that drive real allotd processes share
 * (`coordinator`, `cluster`), on top of the test support library
 * (tests/support/: allotd.h's fixture, proto_client.h's client, proc.h):
 * the quota identities and file, allotd with the benchmarks' options,
 * registering a session, and the protocol-level load: client threads
 * holding replicas that register their keys with every member and send
 * each member, back to back, a Sync with the reports of the keys it owns,
 * counting the key reports acknowledged per second. With one member this
 * is the coordinator suite's load; with several it is an agent's view of
 * a cluster (docs/operations.md, "Cluster").
 */
#ifndef ALLOT_BENCH_PROTO_H
#define ALLOT_BENCH_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "allotd.h"
#include "proc.h"
#include "proto_client.h"

#define PROTO_MAX_MEMBERS 8

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

/*
 * A quota file's text (malloc'd): the default bucket (10/s, burst 20)
 * and one caller per identity with `rate` tokens/s and `burst`, and
 * `fallback` (e.g. "closed") unless NULL.
 */
char *proto_quotas(const char *const *ids, int n, double rate, double burst,
    const char *fallback);

/* What every benchmark's allotd runs with (NULL-terminated): warnings
 * only, no per-peer message budget (every client syncs flat out from
 * one address), T = 1 s and expiry after 30 T. */
extern const char *const proto_allotd_args[];

/* allotd of this build (pc_coord) under PREFIX-XXXXXX with `quotas` and
 * proto_allotd_args; waits for /healthz. */
void proto_allotd_start(pc_coord *c, const char *prefix, const char *quotas);
/* SIGTERM: fails the run unless allotd drained cleanly; its directory
 * is removed. */
void proto_allotd_stop(pc_coord *c);

/*
 * Open `conn` to `url` (5 s timeouts, dialling for up to 4 s) and
 * register `replica_id` of service "bench" with `keys[0..nkeys)`
 * (T = 1 s). The session id on a Welcome, 0 otherwise.
 */
uint64_t proto_join(pc_conn *conn, const char *url, const char *replica_id,
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

/* A quota file's text (malloc'd) of `n` callers, each "cN" at `rate`/s,
 * burst twice that, and the default bucket (10/s, burst 20). */
char *proto_many_quotas(unsigned n, unsigned rate);
/* POST `file` to `path` on the admin socket `sock` (curl): the seconds
 * it took (fails the run unless the answer is 200). */
double proto_admin_post(const char *sock, const char *file, const char *path);

#endif
