/* SPDX-License-Identifier: MIT */
/*
 * Candidate values (docs/operations.md, "Rolling out a change with a
 * candidate"). A quota may carry a candidate rate and burst beside the
 * value in force: never enforced, only evaluated, so that an operator
 * sees how much of a caller's traffic the candidate would have denied
 * before applying it. The coordinator evaluates it alone, from the
 * reports it books anyway: per (service, quota) one global token bucket
 * at the candidate's rate and burst, refilled lazily, and drained each
 * time a replica's report arrives by what that report says was offered
 * (tokens admitted plus tokens denied: a request denied today would be
 * offered under the candidate too). What the bucket cannot cover is what
 * the candidate would have denied; a would-deny takes no tokens, as in
 * the agents' buckets. No agent changes and nothing on the hot path: a
 * few floating-point operations per report, under the state's lock that
 * booking the report holds already.
 *
 * Accuracy: per report, not per request. The bucket sees each replica's
 * traffic as one lump per sync interval, so a burst shorter than an
 * interval is smoothed: it can move what is counted denied by about one
 * interval of refill (rate x T, T the sync interval: 0.1 s by default),
 * and a load steadily above or below the candidate is counted exactly
 * (tests/test_shadow.c: 0.7 % from a bucket fed request by request over
 * a bursty load). The question a candidate answers ("would 400/s deny
 * 3 % of this caller's traffic, or 0.1 %?") is one of sustained rates
 * over hours, which this measures well; it does not say which requests
 * would have been refused.
 *
 * The bucket starts full, and starts again (full, counts zeroed) when
 * the candidate changes: a config reload with another candidate, or
 * none, is noticed lazily at the next report or rendering.
 */
#include "registry_int.h"

#include <math.h>

/* The candidate of `qc` as (rate, burst); false when it has none. A
 * candidate without its own burst keeps the burst in force. */
static bool
cand_of(const allot__quota *qc, double *ret_rate, double *ret_burst)
{
	if (qc == NULL || !(qc->cand_rate > 0))
		return false;
	*ret_rate = qc->cand_rate;
	*ret_burst = qc->cand_burst > 0 ? qc->cand_burst : qc->burst;
	return true;
}

/* Start evaluating the candidate of `qc` (or stop, without one) when it
 * is not the one `sq` evaluates. Under the lock. */
void
allot__cand_check(squota *sq, const allot__quota *qc, uint64_t now)
{
	double rate = 0, burst = 0;
	cand_of(qc, &rate, &burst);
	if (rate == sq->cand_rate && burst == sq->cand_burst)
		return;
	sq->cand_rate = rate;
	sq->cand_burst = burst;
	sq->cand_level = burst;
	sq->cand_ns = now;
	sq->cand_since_ms = rate > 0 ? allot__wall_ms() : 0;
	sq->cand_offered = 0;
	sq->cand_denied = 0;
	sq->cand_denied_rate = 0;
	/* win_cand stays: a usage row takes what was counted so far. */
}

/* `offered` tokens (admitted + denied) reported now for the quota of
 * `qc`: through the candidate's bucket. Under the lock. */
void
allot__cand_book(
    squota *sq, const allot__quota *qc, double offered, uint64_t now)
{
	allot__cand_check(sq, qc, now);
	if (!(sq->cand_rate > 0) || !(offered > 0))
		return;
	double dt = (double) since(now, sq->cand_ns) / 1e9;
	if (now > sq->cand_ns)
		sq->cand_ns = now;
	sq->cand_level = fmin(
	    sq->cand_burst, sq->cand_level + sq->cand_rate * dt);
	double take = fmin(sq->cand_level, offered);
	double deny = offered - take;
	sq->cand_level -= take;
	sq->cand_offered += offered;
	sq->cand_denied += deny;
	sq->cand_denied_total += deny;
	sq->win_cand += deny;
}

/* The per-second pass: the rate of would-denies over the last `dt`
 * seconds, and the whole tokens of them for the usage row (the fraction
 * is carried to the next row, so that the rows add up). Under the lock.
 */
uint64_t
allot__cand_second(squota *sq, double dt)
{
	sq->cand_denied_rate = dt > 0 ? sq->win_cand / dt : 0;
	double all = sq->win_cand + sq->win_cand_carry;
	double whole = floor(all + 1e-9);
	sq->win_cand = 0;
	sq->win_cand_carry = all - whole > 0 ? all - whole : 0;
	return (uint64_t) whole;
}
