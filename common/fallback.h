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
 *
 * The global ceiling C binds static shares too: where no coordinator
 * allocates (local-only, before the first reply, in fallback) a replica
 * runs on its share C / n of it. When the quotas' rates sum above C, they
 * are cut as allotd cuts allowances under the ceiling, with the rates for
 * claims: every quota keeps a floor of ALLOT__CEILING_FLOOR of its rate
 * (a quota in a shed class still admits a trickle), then the classes are
 * served in reverse shed order, each in full while C lasts; the class
 * where it runs out shares the rest max-min fairly; the classes below
 * keep their floor. Should the floors alone exceed C, every quota gets
 * C in proportion to its rate. Cutting the rates and then splitting over
 * n replicas is the same as splitting C over n: the cut does not depend
 * on n, so it is made once per config (allot__ceiling_fit) and the
 * static share splits the cut rate, its burst scaled alike.
 */
#ifndef ALLOT_COMMON_FALLBACK_H
#define ALLOT_COMMON_FALLBACK_H

#include <stddef.h>
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

/* The floor of a quota's rate under the ceiling, a fraction of it: as
 * allotd's floor_fraction (coordinator/state/alloc.h). */
#define ALLOT__CEILING_FLOOR 0.05

/* Rates of `n` quotas (rate[i] > 0, priority class prio[i]: a higher
 * index is shed later) cut to fit `ceiling` (0: none) into ret_rate:
 * Σ ret_rate <= ceiling when there is one, ret_rate[i] <= rate[i].
 * ret_rate is not rate. */
void allot__ceiling_fit(double ceiling, size_t n, const double *rate,
    const uint32_t *prio, double *ret_rate);

#endif
