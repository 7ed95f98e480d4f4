/* SPDX-License-Identifier: MIT */
/*
 * Logging shared by the agent and the daemon. A logger is a handler plus a
 * threshold; the level is checked before any formatting. Messages carry a
 * short stable id ("ALLOT-SYNC-FAIL") so operators can grep and alert on
 * them. allot__log_ratelimited() drops repeats of one id beyond a burst
 * per interval and reports how many were suppressed (as libinput does).
 */
#ifndef ALLOT_COMMON_LOG_H
#define ALLOT_COMMON_LOG_H

#include <stdatomic.h>
#include <stdint.h>

#include <allot/allot.h>

#define ALLOT_LOG_ERR 3
#define ALLOT_LOG_WARNING 4
#define ALLOT_LOG_NOTICE 5
#define ALLOT_LOG_INFO 6
#define ALLOT_LOG_DEBUG 7

typedef struct allot__logger {
	allot_log_fn fn; /* NULL: discard */
	void *ctx;
	int level; /* messages above this level are dropped */
} allot__logger;

/* A rate limit for one call site: at most `burst` lines per `interval_ms`. */
typedef struct allot__logrl {
	_Atomic uint64_t window_start_ms;
	_Atomic uint32_t count;
	_Atomic uint32_t suppressed;
	uint32_t burst;
	uint32_t interval_ms;
} allot__logrl;

#define ALLOT__LOGRL_INIT(burst_, interval_ms_)   \
	{                                         \
		0, 0, 0, (burst_), (interval_ms_) \
	}

void allot__log(const allot__logger *lg, int level, const char *id,
    const char *fmt, ...) __attribute__((format(printf, 4, 5)));

void allot__log_ratelimited(const allot__logger *lg, allot__logrl *rl,
    int level, const char *id, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#endif
