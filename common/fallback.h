/* SPDX-License-Identifier: MIT */
/*
 * The fallback rule: what a quota runs on where no coordinator answers
 * for it, written once for the agent (which installs it when a lease
 * runs out) and the coordinator (which must count on a replica running
 * on it once that replica's lease may have run out).
 *
 * The static share of a quota (R, B) over n replicas is R / n and B / n,
 * but never a burst below the largest endpoint weight, which would make
 * that endpoint impossible on a replica (docs/allocation.md). A quota's
 * `fallback` picks the static share, open (admit everything) or closed
 * (deny everything).
 */
#ifndef ALLOT_COMMON_FALLBACK_H
#define ALLOT_COMMON_FALLBACK_H

#include <stdint.h>

#include <allot/allot.h>

#include "bucket.h"

/* The static share of (rate, burst) over `n` replicas (0 counts as 1):
 * a MODE_LIMIT allowance. */
void allot__static_share(double rate, double burst, uint32_t n,
    uint32_t max_weight, allot__allowance *ret);

/* The allowance of a quota with fallback `kind` over `n` replicas. Open
 * and closed allowances carry R / n and B / n as their nominal figures
 * (what an acquire reports as the limit). hint_ns is left 0. */
void allot__fallback_allowance(allot_fallback kind, double rate, double burst,
    uint32_t n, uint32_t max_weight, allot__allowance *ret);

/* The same as the coordinator accounts for it: the rate and burst a
 * replica on its fallback may spend, INFINITY when open, 0 when closed. */
void allot__fallback_rate_burst(allot_fallback kind, double rate, double burst,
    uint32_t n, uint32_t max_weight, double *ret_rate, double *ret_burst);

#endif
