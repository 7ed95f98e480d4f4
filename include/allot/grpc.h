/* SPDX-License-Identifier: MIT */
/*
 * liballot for gRPC services: the same decisions as the HTTP 429 contract,
 * mapped to a gRPC status and the trailing metadata that tells a client
 * when to retry. A rate-limit denial (allot_acquire() answering
 * allowed = false) is RESOURCE_EXHAUSTED (8); a concurrency-limit rejection
 * (allot_conc_acquire() answering ALLOT_EBUSY or ALLOT_ETIMEDOUT) is
 * UNAVAILABLE (14), as HTTP maps them to 429 and 503. The retry delay is
 * carried three ways, because gRPC clients read three: "retry-after"
 * (delta-seconds, as the HTTP header), "grpc-retry-pushback-ms" (what
 * gRPC's built-in retry policy honours, gRFC A6) and a google.rpc.Status
 * with a google.rpc.RetryInfo detail in "grpc-status-details-bin" (the
 * richer error model that grpc-go, grpc-java and Google APIs read).
 *
 * Pure C with no gRPC or protobuf dependency: these functions fill
 * buffers, and the service copies them into its gRPC library's status and
 * trailers (docs/integrating.md, "gRPC: RESOURCE_EXHAUSTED"). Nothing here
 * allocates.
 *
 * Threads: every function is pure and may be called from any thread.
 */
#ifndef ALLOT_GRPC_H
#define ALLOT_GRPC_H

#include <stddef.h>
#include <stdint.h>

#include <allot/allot.h>

#ifdef __cplusplus
extern "C" {
#endif

/** gRPC status codes used here (grpc/status.h numbering). */
#define ALLOT_GRPC_OK 0
#define ALLOT_GRPC_PERMISSION_DENIED 7
#define ALLOT_GRPC_RESOURCE_EXHAUSTED 8
#define ALLOT_GRPC_UNAVAILABLE 14

/** Trailing metadata keys. */
#define ALLOT_GRPC_KEY_RETRY_AFTER "retry-after"
#define ALLOT_GRPC_KEY_PUSHBACK "grpc-retry-pushback-ms"
#define ALLOT_GRPC_KEY_DETAILS "grpc-status-details-bin"

/** The type URL of the RetryInfo detail in grpc-status-details-bin. */
#define ALLOT_GRPC_RETRY_INFO_TYPE "type.googleapis.com/google.rpc.RetryInfo"

/**
 * A decision as a gRPC status. Strings are NUL-terminated; an empty
 * string means "do not send this metadata entry".
 */
typedef struct allot_grpc_status {
	/** grpc-status: ALLOT_GRPC_OK, _PERMISSION_DENIED,
	 *  _RESOURCE_EXHAUSTED or _UNAVAILABLE. */
	int code;
	/** grpc-message: printable ASCII without '%', so it needs no
	 *  percent-encoding. "" when OK. */
	char message[96];
	/** "retry-after": delta-seconds, rounded up, at least 1, exactly the
	 *  HTTP Retry-After for the same decision. "" when OK or when a retry
	 *  can never succeed. */
	char retry_after[24];
	/** "grpc-retry-pushback-ms": the delay in ms, rounded up; "-1" when a
	 *  retry can never succeed (gRFC A6: a negative pushback tells the
	 *  client's retry policy not to retry). "" when OK. */
	char pushback_ms[24];
	/** google.rpc.RetryInfo.retry_delay, exact to the nanosecond; both 0
	 *  when there is no delay to advertise. */
	int64_t retry_delay_seconds;
	int32_t retry_delay_nanos;
} allot_grpc_status;

/**
 * Map a rate-limit decision to a gRPC status.
 * @param d the decision allot_acquire() filled.
 * @param acquire_rc what allot_acquire() returned: ALLOT_OK, or
 *        ALLOT_ETOOBIG for a cost above the quota's burst, which is
 *        RESOURCE_EXHAUSTED with pushback "-1" and no retry delay (no
 *        retry can pass), or ALLOT_EFORBIDDEN for a closed quota, which
 *        is PERMISSION_DENIED with pushback "-1".
 * @param ret on ALLOT_OK, the status: OK (code 0, empty strings) for an
 *        allowed decision, shadow-mode would-be denials included; for a
 *        denial RESOURCE_EXHAUSTED with "rate limit exceeded; retry after
 *        Ns" and the delay of d->retry_after_ns.
 * @return ALLOT_OK, or ALLOT_EINVAL for NULL arguments or any other
 *         `acquire_rc` (an error there is not a decision to report).
 */
ALLOT_API int allot_grpc_from_decision(
    const allot_decision *d, int acquire_rc, allot_grpc_status *ret);

/**
 * Map a concurrency-limit rejection to UNAVAILABLE ("concurrency limit
 * exceeded; retry after Ns"), the server's way of saying "busy now", not
 * "over your quota".
 * @param conc_rc ALLOT_EBUSY or ALLOT_ETIMEDOUT from allot_conc_acquire().
 * @param retry_after_ms the delay the service advertises (its choice: the
 *        limiter has no bucket to compute one from), at least 1 ms.
 * @return ALLOT_OK, or ALLOT_EINVAL for another `conc_rc`, a zero delay
 *         or NULL `ret`.
 */
ALLOT_API int allot_grpc_from_conc(
    int conc_rc, uint64_t retry_after_ms, allot_grpc_status *ret);

/**
 * Serialize the google.rpc.Status (code, message and, when there is a
 * retry delay, one google.protobuf.Any holding a google.rpc.RetryInfo) to
 * send as the binary "grpc-status-details-bin" trailer. gRPC libraries
 * base64-encode "-bin" values themselves: pass these raw bytes.
 * @param buf where the bytes go; may be NULL when `len` is 0.
 * @return the number of bytes of the message, written when it is at most
 *         `len` (as snprintf: call with len 0 to size the buffer; 256
 *         bytes always suffice); 0 for an OK status, which needs no
 *         details; -1 for NULL `st`.
 */
ALLOT_API int allot_grpc_status_details(
    const allot_grpc_status *st, uint8_t *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif /* ALLOT_GRPC_H */
