/* SPDX-License-Identifier: MIT */
/*
 * The usual alternative, for comparison: a central token bucket in Redis.
 * bench_redis_start() runs a private redis-server on a free loopback port
 * (no persistence: --save "" --appendonly no, its files in a temporary
 * directory), connects one hiredis client and loads the Lua token bucket
 * from ../shared/reference/api-rate-limiting-what-works.txt with SCRIPT
 * LOAD; bench_redis_acquire() is one EVALSHA round trip, as a service
 * would make per request. bench_redis_stop() stops the server and removes
 * its directory; the server also dies with the benchmark (PDEATHSIG).
 */
#ifndef ALLOT_BENCH_REDIS_H
#define ALLOT_BENCH_REDIS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct bench_redis {
	pid_t pid; /* redis-server, 0 when not running */
	int port;
	char dir[64]; /* its --dir (log file only) */
	void *ctx; /* redisContext * */
	char sha[41]; /* SHA1 of the loaded script */
} bench_redis;

/* Start, connect, load the script. On failure `err` says why and nothing
 * is left running. The binary is $ALLOT_REDIS_SERVER or redis-server. */
bool bench_redis_start(bench_redis *r, char *err, size_t errlen);

/*
 * One decision: EVALSHA the bucket script on `key` with capacity `burst`,
 * `rate` tokens/s, `cost`, and now = CLOCK_MONOTONIC in seconds.
 * Returns 1 allowed, 0 denied, -1 on a protocol or connection error
 * (message in `err`).
 */
int bench_redis_acquire(bench_redis *r, const char *key, const char *burst,
    const char *rate, const char *cost, char *err, size_t errlen);

/* Stop the server (SIGTERM, then SIGKILL after 5 s) and clean up.
 * Accepts a never-started or already-stopped handle. */
void bench_redis_stop(bench_redis *r);

#endif
