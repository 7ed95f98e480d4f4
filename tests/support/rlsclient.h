/* SPDX-License-Identifier: MIT */
/*
 * A small gRPC client of Envoy's rate limit service over cleartext
 * HTTP/2 (nghttp2), for the sidecar benchmark and its tests: one
 * connection, many requests in flight on it (as Envoy multiplexes its
 * calls), each completion reported with its gRPC status, message and
 * latency. It can also misbehave on purpose: open streams it never ends,
 * to see the server refuse those beyond its SETTINGS.
 */
#ifndef ALLOT_TESTS_SUPPORT_RLSCLIENT_H
#define ALLOT_TESTS_SUPPORT_RLSCLIENT_H

#include <stddef.h>
#include <stdint.h>

#define RLSC_PATH \
	"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

typedef struct rlsc rlsc;

/* One completed call: grpc-status (-1 if none came), the response
 * message without its 5-byte prefix, the latency. */
typedef void (*rlsc_done_fn)(void *ctx, int grpc_status, const uint8_t *msg,
    size_t len, uint64_t latency_ns);

/* Connect to 127.0.0.1:port. NULL on failure. */
rlsc *rlsc_connect(int port);
void rlsc_close(rlsc *c);

/* Send `n` calls of `path` whose body is `body` (prefix included), at
 * most `window` in flight; returns the number completed (n unless the
 * connection failed). */
size_t rlsc_run(rlsc *c, const char *path, const uint8_t *body, size_t len,
    size_t n, size_t window, rlsc_done_fn done, void *ctx);

/* Open `n` streams, never ended: headers only, or with `partial` bytes
 * of a message that never completes. Then wait up to `wait_ms` for the
 * server's answers: *ret_refused counts streams it reset with
 * REFUSED_STREAM, *ret_exhausted those it answered RESOURCE_EXHAUSTED.
 * Returns 0, or -1 if the connection died. */
int rlsc_flood(rlsc *c, size_t n, size_t partial, int wait_ms,
    size_t *ret_refused, size_t *ret_exhausted);

/* A request body: RateLimitRequest with one descriptor of the entries
 * caller=`identity`, endpoint=`endpoint`, prefixed for gRPC; malloc'd. */
uint8_t *rlsc_request(const char *identity, const char *endpoint,
    uint32_t hits, size_t *ret_len);

#endif
