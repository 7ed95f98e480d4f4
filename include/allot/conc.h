/* SPDX-License-Identifier: MIT */
/*
 * liballot's concurrency limiter: execution control for expensive work,
 * the complement of the rate limiter's admission control. The rate limiter
 * (allot_acquire()) decides how much work a caller may *start* per second;
 * this limiter decides how much may *run at once*: in-flight permits per
 * caller, a global bound, two lanes so that bulk work (exports, reports)
 * can never take the capacity reserved for interactive work (sign-in,
 * cancel, lookups), and a bounded FIFO wait queue per lane whose waiters
 * are rejected once they have waited the lane's maximum age, so that
 * overload is reported at once instead of hidden in a queue.
 *
 * Rejections from this limiter mean "the server is busy", not "you are
 * over your quota", and they use their own error codes: ALLOT_EBUSY (no
 * room in the queue) and ALLOT_ETIMEDOUT (waited the maximum age). Map
 * them to HTTP 503 Service Unavailable with a short Retry-After (gRPC
 * UNAVAILABLE); map rate-limit denials (allot_acquire() answering
 * allowed = false) to 429 Too Many Requests (gRPC RESOURCE_EXHAUSTED).
 * docs/integrating.md, "Concurrency limits", has the table.
 *
 * Threads: every function may be called from any thread. The limiter
 * takes one mutex and allot_conc_acquire() blocks on a condition
 * variable; it is meant for work that takes milliseconds or more, not for
 * the rate-limit hot path.
 */
#ifndef ALLOT_CONC_H
#define ALLOT_CONC_H

#include <stdbool.h>
#include <stdint.h>

#include <allot/allot.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Traffic lanes. Each has its own queue, limits and statistics. */
typedef enum allot_conc_lane {
	/** Short, latency-sensitive work. Has capacity bulk cannot take. */
	ALLOT_LANE_INTERACTIVE = 0,
	/** Long or batch work; may hold at most lane_max[ALLOT_LANE_BULK]
	 *  permits, which is less than the global bound. */
	ALLOT_LANE_BULK = 1,
} allot_conc_lane;

/** The number of lanes (size of the per-lane option arrays). */
#define ALLOT_CONC_LANES 2

/** The shared caller slot: callers without an identity, and callers
 *  resolved after the caller table filled up. */
#define ALLOT_CONC_DEFAULT_CALLER 0u

/** Pass as `timeout_ms` to wait as long as the lane's max_wait_ms. */
#define ALLOT_CONC_WAIT_MAX UINT32_MAX

/**
 * Limits. Fill with allot_conc_options_init() and change what you need.
 * Arrays are indexed by allot_conc_lane.
 */
typedef struct allot_conc_options {
	/** Caller slots, the shared default slot 0 included (default 256,
	 *  at most 2^24). */
	uint32_t max_callers;
	/** Permits in flight over all callers and lanes (default 64). At
	 *  least 2, so that both lanes can run. */
	uint32_t global_max;
	/** Permits one lane may hold. 0 (the default) derives them from
	 *  global_max: interactive may use all of it, bulk half of it
	 *  (rounded down). lane_max[ALLOT_LANE_BULK] must be below
	 *  global_max: the difference is reserved for interactive work. */
	uint32_t lane_max[ALLOT_CONC_LANES];
	/** Permits one caller may hold in a lane (default 16, 4). */
	uint32_t caller_max[ALLOT_CONC_LANES];
	/** Waiters a lane's queue holds; an acquire that finds it full is
	 *  ALLOT_EBUSY at once (default 64, 64). 0: no queue. */
	uint32_t queue_max[ALLOT_CONC_LANES];
	/** Waiters one caller may have in a lane's queue, so that a large
	 *  caller cannot fill the queue before smaller ones arrive
	 *  (default 8, 8). */
	uint32_t caller_queue_max[ALLOT_CONC_LANES];
	/** The maximum age of a waiter in ms: one that cannot get a permit
	 *  in this time is rejected with ALLOT_ETIMEDOUT (default 100 for
	 *  interactive, 1000 for bulk). */
	uint32_t max_wait_ms[ALLOT_CONC_LANES];
} allot_conc_options;

/** Fill `opts` with the documented defaults. */
ALLOT_API void allot_conc_options_init(allot_conc_options *opts);

typedef struct allot_conc allot_conc;

/**
 * A held permit. The caller owns the storage (a local variable, a field
 * of the request's context); treat the fields as private. A permit that
 * is not held has `conc == NULL`.
 */
typedef struct allot_conc_permit {
	allot_conc *conc;
	uint32_t caller;
	uint32_t lane;
} allot_conc_permit;

/**
 * Create a limiter. The options are copied.
 * @param opts NULL for the defaults.
 * @param ret_conc on ALLOT_OK, the limiter, owned by the caller
 *        (allot_conc_destroy()).
 * @return ALLOT_OK, ALLOT_EINVAL (inconsistent limits) or ALLOT_ENOMEM.
 */
ALLOT_API int allot_conc_create(
    const allot_conc_options *opts, allot_conc **ret_conc);

/**
 * Free a limiter. Accepts NULL. No call on it may be running or waiting,
 * and permits still held become invalid (releasing them afterwards is a
 * use after free).
 */
ALLOT_API void allot_conc_destroy(allot_conc *conc);

/**
 * Resolve a caller's name (its verified identity) to a slot. The first
 * call for a name assigns the next free slot; later calls return it. NULL
 * or "" resolve to ALLOT_CONC_DEFAULT_CALLER, and so do new names once
 * every slot is taken (they then share that slot's limits). Slots are
 * never reassigned. Callers that already number their callers
 * (0 .. max_callers - 1) may skip this and pass their own indices.
 * @param ret_slot on ALLOT_OK, the slot.
 * @return ALLOT_OK, ALLOT_EINVAL (NULL ret_slot, name longer than
 *         ALLOT_IDENTITY_MAX) or ALLOT_ENOMEM.
 */
ALLOT_API int allot_conc_caller(
    allot_conc *conc, const char *name, uint32_t *ret_slot);

/**
 * Acquire a permit for `caller` in `lane`, waiting in the lane's FIFO
 * queue for at most min(timeout_ms, the lane's max_wait_ms). Waiters are
 * served in arrival order among those whose limits allow them to run
 * (a waiter whose own caller is at its limit does not hold up the others),
 * interactive before bulk.
 * @param timeout_ms 0 never waits (as allot_conc_try_acquire());
 *        ALLOT_CONC_WAIT_MAX waits up to the lane's maximum age.
 * @param ret_permit on ALLOT_OK, the permit; release it with
 *        allot_conc_release() once the work is done.
 * @return ALLOT_OK; ALLOT_EBUSY: rejected without waiting, the lane's
 *         queue or the caller's share of it being full (or no permit free
 *         and `timeout_ms` 0); ALLOT_ETIMEDOUT: waited and no permit came
 *         in time; ALLOT_EINVAL: bad slot, lane or NULL argument;
 *         ALLOT_ENOMEM: no condition variable could be made for the wait.
 */
ALLOT_API int allot_conc_acquire(allot_conc *conc, uint32_t caller,
    allot_conc_lane lane, uint32_t timeout_ms, allot_conc_permit *ret_permit);

/**
 * Acquire a permit only if one is free now. Never blocks.
 * @return ALLOT_OK, ALLOT_EBUSY or ALLOT_EINVAL, as allot_conc_acquire().
 */
ALLOT_API int allot_conc_try_acquire(allot_conc *conc, uint32_t caller,
    allot_conc_lane lane, allot_conc_permit *ret_permit);

/**
 * Release a permit and hand it to the oldest waiter that may run. The
 * permit is marked not held, so a second release is a no-op. Accepts NULL
 * and permits not held. Any thread may release a permit, not only the
 * one that acquired it, but only once.
 */
ALLOT_API void allot_conc_release(allot_conc_permit *permit);

/** Statistics of a (caller, lane) pair, a lane, or the whole limiter. */
typedef struct allot_conc_stats {
	uint32_t in_flight; /**< permits held now */
	uint32_t max_in_flight; /**< most permits held at once, ever */
	uint32_t queued; /**< waiters now */
	uint64_t acquired; /**< permits granted, ever */
	uint64_t rejected_full; /**< ALLOT_EBUSY rejections */
	uint64_t rejected_age; /**< ALLOT_ETIMEDOUT rejections */
	uint64_t max_queue_age_ms; /**< longest time a waiter spent queued
	                                (granted or rejected), rounded up */
} allot_conc_stats;

/** Statistics of one caller in one lane. @return ALLOT_OK or EINVAL. */
ALLOT_API int allot_conc_caller_stats(allot_conc *conc, uint32_t caller,
    allot_conc_lane lane, allot_conc_stats *ret);

/** Statistics of one lane over all callers. */
ALLOT_API int allot_conc_lane_stats(
    allot_conc *conc, allot_conc_lane lane, allot_conc_stats *ret);

/** Statistics over all lanes and callers. */
ALLOT_API int allot_conc_total_stats(allot_conc *conc, allot_conc_stats *ret);

#ifdef __cplusplus
}
#endif
#endif /* ALLOT_CONC_H */
