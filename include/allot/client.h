/* SPDX-License-Identifier: MIT */
/*
 * liballot, the caller's side: what a service that *calls* a rate-limited
 * service links so that server-side rejections do not turn into retry
 * storms. Two independent objects, usable without an agent: allot_retry
 * (honour Retry-After, full-jitter exponential backoff, a hard attempt cap,
 * a cap on the wait accepted, and a per-client retry budget) and
 * allot_throttle (client-side adaptive throttling from Google's SRE book,
 * "Handling Overload"). Neither sleeps nor does I/O: they answer "how long
 * should I wait" and "should I send", and the caller acts on the answer.
 * docs/integrating.md, "Callers: retry discipline", shows the loop.
 *
 * Threads: every function may be called from any thread; one object is
 * meant to be shared by all the threads of one client (the budget and the
 * throttle are per client, not per request). They take a short mutex:
 * these calls cost about as much as building a request, not the tens of
 * nanoseconds of allot_acquire().
 */
#ifndef ALLOT_CLIENT_H
#define ALLOT_CLIENT_H

#include <stdbool.h>
#include <stdint.h>

#include <allot/allot.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ */
/* Retry helper                                                        */
/* ------------------------------------------------------------------ */

/**
 * How a client retries. Fill with allot_retry_policy_init() and change
 * what you need. allot_retry_create() refuses (ALLOT_EINVAL) a zero
 * max_attempts, base_delay_ms, max_delay_ms or budget_window_ms, and a
 * budget_ratio outside (0, 1].
 */
typedef struct allot_retry_policy {
	/** Attempts per logical request, the first try included
	 *  (default 4: one try and three retries). */
	uint32_t max_attempts;
	/** First backoff window in ms (default 200). Retry n (0-based)
	 *  waits uniformly in [0, min(max_delay_ms, base_delay_ms * 2^n)]. */
	uint32_t base_delay_ms;
	/** The longest single wait accepted, in ms (default 10000). A server
	 *  hint longer than this makes allot_retry_next() give up rather than
	 *  wait. */
	uint32_t max_delay_ms;
	/** Jitter added on top of a Retry-After hint, uniform in
	 *  [0, hint_jitter_ms] (default 200), so that replicas rejected at the
	 *  same moment do not retry in lockstep. The delay never exceeds
	 *  max_delay_ms. */
	uint32_t hint_jitter_ms;
	/** Retry budget: retries may be at most this fraction of the
	 *  requests recorded over the last `budget_window_ms` (default 0.1).
	 *  Must be in (0, 1]. */
	double budget_ratio;
	/** The sliding window of the budget in ms (default 10000). */
	uint32_t budget_window_ms;
	/** Retries allowed per window on top of the ratio, so that a client
	 *  sending one request a minute may still retry it (default 3;
	 *  0 makes the ratio strict). Under a sustained storm the retry
	 *  fraction is at most budget_ratio + budget_min_retries / (requests
	 *  per window). */
	uint32_t budget_min_retries;
	/** Seed for the jitter generator; 0 (default) seeds from the
	 *  system's entropy. Tests pass a fixed seed for reproducible
	 *  delays. */
	uint64_t seed;
	/** Monotonic time for the budget window (default NULL: the real
	 *  clock). See allot_clock_fn. */
	allot_clock_fn clock;
	void *clock_ctx;
} allot_retry_policy;

/** Fill `policy` with the documented defaults. */
ALLOT_API void allot_retry_policy_init(allot_retry_policy *policy);

/** A retry helper: one per client (per upstream service, typically). */
typedef struct allot_retry allot_retry;

/**
 * Create a retry helper. The policy is copied.
 * @param policy NULL for the defaults.
 * @param ret_retry on ALLOT_OK, the helper, owned by the caller
 *        (allot_retry_destroy()).
 * @return ALLOT_OK, ALLOT_EINVAL (a field out of range) or ALLOT_ENOMEM.
 */
ALLOT_API int allot_retry_create(
    const allot_retry_policy *policy, allot_retry **ret_retry);

/** Free a retry helper. Accepts NULL. No other call on it may be running. */
ALLOT_API void allot_retry_destroy(allot_retry *retry);

/**
 * Count one logical request (call it once per request, before its first
 * attempt; retries are counted by allot_retry_next()). Requests earn the
 * retry budget.
 */
ALLOT_API void allot_retry_record_request(allot_retry *retry);

/**
 * Parse a Retry-After field value (RFC 9110, section 10.2.3): either
 * delta-seconds or an HTTP-date in any of the three formats a recipient
 * must accept (IMF-fixdate "Sun, 06 Nov 1994 08:49:37 GMT", obsolete
 * RFC 850 "Sunday, 06-Nov-94 08:49:37 GMT" and asctime
 * "Sun Nov  6 08:49:37 1994"). Surrounding spaces and tabs are ignored.
 * Delta-seconds beyond 2^31 are read as 2^31 (as RFC 9110 asks); a date
 * in the past means "now" (0 ms). Two-digit RFC 850 years are resolved
 * against `now_unix` (a year more than 50 years ahead is taken from the
 * previous century). Locale independent.
 * @param header_value the field value, NUL-terminated.
 * @param now_unix the wall-clock time, seconds since the epoch, against
 *        which an HTTP-date is measured.
 * @param ret_ms on ALLOT_OK, the wait in milliseconds.
 * @return ALLOT_OK; ALLOT_EINVAL for NULL arguments or a value in none
 *         of the formats (negative, fractional, garbage, impossible date);
 *         ALLOT_ENOMEM if the C locale cannot be created.
 */
ALLOT_API int allot_retry_parse_after(
    const char *header_value, int64_t now_unix, uint64_t *ret_ms);

/**
 * Decide whether to retry after attempt number `attempt` (0-based: 0 is
 * the first try) failed with HTTP status `status`, and how long to wait.
 *
 * Only quota and overload rejections are retried: 429, and 503 when it
 * carries a usable Retry-After (the server asked for a retry at a given
 * time; a bare 503 is often a fault that retrying makes worse). gRPC users
 * pass 429 for RESOURCE_EXHAUSTED. Any other status gives up.
 *
 * With a usable hint the delay is the hint plus jitter in
 * [0, hint_jitter_ms], capped at max_delay_ms: the hint is a floor. A 429
 * whose Retry-After is absent or unparseable falls back to full-jitter
 * exponential backoff: uniform in [0, min(max_delay_ms,
 * base_delay_ms * 2^attempt)].
 *
 * A retry is granted only if the budget has room; on ALLOT_OK it is
 * counted as spent whether or not the caller then retries.
 *
 * @param retry_after the response's Retry-After value, or NULL.
 * @param ret_delay_ms on ALLOT_OK, how long to wait before the retry.
 * @return ALLOT_OK: wait `*ret_delay_ms`, then retry. Otherwise give up,
 *         and the code says why:
 *         - ALLOT_EPROTO: the status is not retryable (not 429, nor 503
 *           with a usable Retry-After);
 *         - ALLOT_ERANGE: the attempt cap is reached
 *           (attempt + 1 >= max_attempts);
 *         - ALLOT_ETIMEDOUT: the server asks for a wait longer than
 *           max_delay_ms;
 *         - ALLOT_EBUSY: the client's retry budget is exhausted;
 *         - ALLOT_EINVAL: NULL `retry` or `ret_delay_ms`.
 *         Checks run in that order, so a refused retry never spends
 *         budget. The wall clock (time()) dates HTTP-date hints.
 */
ALLOT_API int allot_retry_next(allot_retry *retry, uint32_t attempt,
    const char *retry_after, uint32_t status, uint64_t *ret_delay_ms);

/** Counters of a retry helper, since it was created. */
typedef struct allot_retry_stats {
	uint64_t requests; /**< allot_retry_record_request() calls */
	uint64_t retries; /**< retries granted (ALLOT_OK) */
	uint64_t budget_denied; /**< gave up: budget exhausted */
	uint64_t gave_up; /**< every give-up, whatever the reason */
	uint64_t not_retryable; /**< gave up: status not retryable */
	uint64_t attempts_exhausted; /**< gave up: attempt cap */
	uint64_t hint_too_long; /**< gave up: hint over max_delay_ms */
} allot_retry_stats;

/** Snapshot the counters. @return ALLOT_OK or ALLOT_EINVAL (NULL). */
ALLOT_API int allot_retry_stats_get(
    allot_retry *retry, allot_retry_stats *ret);

/* ------------------------------------------------------------------ */
/* Adaptive throttling                                                 */
/* ------------------------------------------------------------------ */

/**
 * Client-side adaptive throttling. Over a sliding window the client
 * counts `requests` (every attempt the application wanted to send,
 * including those this throttle rejected) and `accepts` (responses the
 * backend did not reject for quota or overload). A sent attempt counts
 * when its answer is recorded, so replies still in flight (a slow
 * backend) are not mistaken for rejections; a locally rejected one
 * counts at once. Before each send it rejects locally with probability
 *
 *     max(0, (requests - K * accepts) / (requests + 1))
 *
 * so a client of a saturated backend sends about K times what the
 * backend accepts instead of everything, and sends normally again once
 * accepts resume. Larger K is more permissive.
 */
typedef struct allot_throttle_options {
	/** The multiplier K (default 2.0). Must be >= 1. */
	double k;
	/** Sliding window in ms (default 60000). */
	uint32_t window_ms;
	/** Bucket width in ms (default 1000). The window forgets a bucket at
	 *  a time; window_ms / bucket_ms must be in [1, 3600]. */
	uint32_t bucket_ms;
	/** Seed for the rejection draws; 0 (default) seeds from entropy. */
	uint64_t seed;
	/** Monotonic time (default NULL: the real clock). */
	allot_clock_fn clock;
	void *clock_ctx;
} allot_throttle_options;

/** Fill `opts` with the documented defaults. */
ALLOT_API void allot_throttle_options_init(allot_throttle_options *opts);

typedef struct allot_throttle allot_throttle;

/**
 * Create a throttle (one per client and backend). The options are copied.
 * @param opts NULL for the defaults.
 * @param ret_throttle on ALLOT_OK, owned by the caller
 *        (allot_throttle_destroy()).
 * @return ALLOT_OK, ALLOT_EINVAL or ALLOT_ENOMEM.
 */
ALLOT_API int allot_throttle_create(
    const allot_throttle_options *opts, allot_throttle **ret_throttle);

/** Free a throttle. Accepts NULL. No other call on it may be running. */
ALLOT_API void allot_throttle_destroy(allot_throttle *throttle);

/**
 * Call before every attempt (retries included). Counts a request and
 * draws against the rejection probability.
 * @return true: send, then report the outcome with
 *         allot_throttle_record(). false: do not send; fail the attempt
 *         locally as if the backend had answered 429 without Retry-After
 *         (and do not call allot_throttle_record()). A NULL throttle
 *         admits everything.
 */
ALLOT_API bool allot_throttle_admit(allot_throttle *throttle);

/**
 * Report the outcome of an attempt that allot_throttle_admit() let
 * through. `accepted` is false only for quota and overload rejections
 * (429, 503, RESOURCE_EXHAUSTED, UNAVAILABLE); any other answer, errors
 * included, means the backend had capacity to process it and counts as
 * accepted. No-op on NULL.
 */
ALLOT_API void allot_throttle_record(allot_throttle *throttle, bool accepted);

/** Counters of a throttle. */
typedef struct allot_throttle_stats {
	uint64_t requests; /**< admit() calls, since creation */
	uint64_t throttled; /**< of those, rejected locally */
	uint64_t accepts; /**< record(true) calls */
	uint64_t rejects; /**< record(false) calls */
	uint64_t window_requests; /**< requests in the window, now */
	uint64_t window_accepts; /**< accepts in the window, now */
	double reject_probability; /**< what admit() would draw against now */
} allot_throttle_stats;

/** Snapshot the counters. @return ALLOT_OK or ALLOT_EINVAL (NULL). */
ALLOT_API int allot_throttle_stats_get(
    allot_throttle *throttle, allot_throttle_stats *ret);

#ifdef __cplusplus
}
#endif
#endif /* ALLOT_CLIENT_H */
