/* SPDX-License-Identifier: MIT */
/* Logging: level check before formatting, rate-limited call sites. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "clock.h"

static void vlog(const allot__logger *lg, int level, const char *id,
    const char *fmt, va_list ap) __attribute__((format(printf, 4, 0)));

static void
vlog(const allot__logger *lg, int level, const char *id, const char *fmt,
    va_list ap)
{
	char msg[1024];
	vsnprintf(msg, sizeof msg, fmt, ap);
	lg->fn(lg->ctx, level, id, msg);
}

static bool
enabled(const allot__logger *lg, int level)
{
	return lg != NULL && lg->fn != NULL && level <= lg->level;
}

void
allot__log(
    const allot__logger *lg, int level, const char *id, const char *fmt, ...)
{
	if (!enabled(lg, level))
		return;
	va_list ap;
	va_start(ap, fmt);
	vlog(lg, level, id, fmt, ap);
	va_end(ap);
}

/* Whether one more message fits `rl`'s window. A new window first says
 * how many the last one suppressed. */
static bool
admit(const allot__logger *lg, allot__logrl *rl, int level, const char *id)
{
	uint64_t now = allot__mono_ns() / 1000000u;
	uint64_t start = atomic_load(&rl->window_start_ms);
	if (now - start >= rl->interval_ms &&
	    atomic_compare_exchange_strong(
	        &rl->window_start_ms, &start, now)) {
		uint32_t dropped = atomic_exchange(&rl->suppressed, 0);
		atomic_store(&rl->count, 0);
		if (dropped > 0) {
			char note[160];
			snprintf(note, sizeof note,
			    "%u similar messages suppressed", dropped);
			lg->fn(lg->ctx, level, id, note);
		}
	}
	if (atomic_fetch_add(&rl->count, 1) >= rl->burst) {
		atomic_fetch_add(&rl->suppressed, 1);
		return false;
	}
	return true;
}

void
allot__log_ratelimited(const allot__logger *lg, allot__logrl *rl, int level,
    const char *id, const char *fmt, ...)
{
	if (!enabled(lg, level) || !admit(lg, rl, level, id))
		return;
	va_list ap;
	va_start(ap, fmt);
	vlog(lg, level, id, fmt, ap);
	va_end(ap);
}
