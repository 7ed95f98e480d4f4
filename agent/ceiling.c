/* SPDX-License-Identifier: MIT */
/*
 * The global ceiling's level on this replica (docs/allocation.md, "The
 * ceiling's level"). While the ceiling cuts quotas on the configuration
 * (their rates sum above C) but does not bind on demand, allotd sends a
 * quota without a central reserve its own allowance beside the cut one
 * (Share.own_rate, own_burst). The quota's bucket then runs on its own,
 * and every request of its callers is also charged to one bucket per
 * replica, the level, whose rate and burst are the sums of the cut
 * allowances of its members: exactly what allotd counts this replica as
 * holding of the ceiling. What the replica admits under the ceiling is
 * bounded as before; only who may use it moves: an idle caller's burst
 * finds its own quota's tokens, as far as the others leave the level
 * some, as the equal split's per-replica ceiling bucket has it, instead
 * of a burst cut because the others could use their quotas.
 *
 * Members (allot__ceiling_member()): limited quotas, enforcing, of a
 * config with a ceiling that may cut them, that keep no central reserve
 * (a quota whose callers wait draws on the ceiling's reserve at allotd
 * instead), while they run on their own allowance (allot__qrt.owned).
 * Only their keys charge the level (stacked on the keys of every quota
 * that may be one, stack.c; skipped while it is not, agent.c), only
 * their cut allowances add to it, so a quota whose keys do not charge
 * it never lends it capacity.
 * The sums are kept in thousandths of a token, rounded down: exact
 * under any order of changes, and never above the allowances'.
 */
#include "agent_int.h"

#include <math.h>

#include "config.h"

#define MILLI 1000.0

void
allot__ceiling_init(allot_agent *a)
{
	allot__qrt *q = &a->quotas[a->ceil_q];
	q->name = "global_ceiling";
	q->index = a->ceil_q;
	atomic_init(&q->removed, false);
	atomic_init(&q->max_cost, UINT32_MAX);
	atomic_init(&q->access, (uint8_t) ALLOT__ACCESS_LIMITED);
	/* Closed and empty: its members' tokens join it with them
	 * (part()). */
	allot__allowance al = {
		.rate = 1, .burst = 1, .mode = ALLOT__MODE_CLOSED
	};
	allot__bucket_init(&q->bucket, &al);
	allot__bucket_empty(&q->bucket, 0);
}

bool
allot__ceiling_member(const allot_agent *a, const allot__qrt *q)
{
	return atomic_load_explicit(&a->ceil_on, memory_order_relaxed) &&
	    q->index != a->ceil_q &&
	    atomic_load_explicit(&q->access, memory_order_relaxed) ==
	    ALLOT__ACCESS_LIMITED &&
	    !atomic_load_explicit(&q->bucket.shadow, memory_order_relaxed) &&
	    !atomic_load_explicit(&q->removed, memory_order_relaxed) &&
	    !atomic_load_explicit(&q->central, memory_order_relaxed);
}

static int64_t
milli(double x)
{
	if (!(x > 0))
		return 0;
	double m = floor(x * MILLI);
	return m < 9.0e15 ? (int64_t) m : (int64_t) 9.0e15;
}

/* The level's allowance from the sums (set_lock held). */
static void
level_set(allot_agent *a, uint64_t now)
{
	double r = (double) a->ceil_rate_m / MILLI;
	double b = (double) a->ceil_burst_m / MILLI;
	allot__allowance al = {
		.rate = r,
		.burst = b,
		.mode = r > 0 && b > 0 ? ALLOT__MODE_LIMIT :
		                         ALLOT__MODE_CLOSED,
		.hint_ns = (uint64_t) a->opts.sync_interval_ms * 1000000u,
	};
	allot__bucket *lb = &a->quotas[a->ceil_q].bucket;
	allot__allowance was;
	allot__bucket_get(lb, &was);
	allot__bucket_set(lb, &al, now);
	/* Without members it holds nothing: a closed bucket goes on
	 * refilling, and the next members would find tokens no bucket of
	 * theirs held. They bring theirs (part()). */
	if (al.mode != ALLOT__MODE_LIMIT || was.mode != ALLOT__MODE_LIMIT)
		allot__bucket_empty(lb, now);
}

/* Quota `q`'s part, without setting the level; a quota that joins adds
 * to *join the tokens its bucket holds under the cut allowance, which
 * it could have spent alone and now spends through the level (a level
 * that grows gains no tokens of itself). */
static bool
part(allot_agent *a, allot__qrt *q, double *join, uint64_t now)
{
	bool in = q->cut.mode == ALLOT__MODE_LIMIT &&
	    atomic_load_explicit(&q->owned, memory_order_relaxed) &&
	    allot__ceiling_member(a, q);
	int64_t r = in ? milli(q->cut.rate) : 0;
	int64_t b = in ? milli(q->cut.burst) : 0;
	if (r == q->ceil_rate_m && b == q->ceil_burst_m)
		return false;
	if (q->ceil_burst_m == 0 && b > 0)
		*join += fmin(
		    allot__bucket_level(&q->bucket, now), (double) b / MILLI);
	a->ceil_rate_m += r - q->ceil_rate_m;
	a->ceil_burst_m += b - q->ceil_burst_m;
	q->ceil_rate_m = r;
	q->ceil_burst_m = b;
	return true;
}

/* The level's allowance from the sums, and the tokens that joined. */
static void
level_update(allot_agent *a, double join, uint64_t now)
{
	level_set(a, now);
	if (join > 0)
		allot__bucket_deposit(&a->quotas[a->ceil_q].bucket, join, now);
}

void
allot__ceiling_add(allot_agent *a, allot__qrt *q, uint64_t now)
{
	double join = 0;
	if (part(a, q, &join, now))
		level_update(a, join, now);
}

void
allot__ceiling_update(allot_agent *a)
{
	uint32_t nq = atomic_load(&a->nquotas);
	uint64_t now = allot__agent_now(a);
	pthread_mutex_lock(&a->set_lock);
	bool moved = false;
	double join = 0;
	for (uint32_t i = 0; i < nq; i++)
		moved |= part(a, &a->quotas[i], &join, now);
	if (moved)
		level_update(a, join, now);
	pthread_mutex_unlock(&a->set_lock);
}

void
allot__ceiling_leave(allot_agent *a, allot__qrt *q, uint64_t now)
{
	allot__bucket *lb = &a->quotas[a->ceil_q].bucket;
	double keep = fmin(fmax(allot__bucket_level(lb, now), 0),
	    fmax(allot__bucket_level(&q->bucket, now), 0));
	double over = allot__bucket_level(&q->bucket, now) - keep;
	if (over > 0)
		allot__bucket_take_part(&q->bucket, over, now);
	if (keep > 0)
		allot__bucket_take_part(lb, keep, now);
}

/* The level's bucket when quota `q` runs its own allowance inside it
 * (tokens moved in or out of q's bucket move in the level too); NULL
 * otherwise. */
static allot__bucket *
level_of(allot_agent *a, const allot__qrt *q)
{
	return atomic_load_explicit(&q->owned, memory_order_relaxed) &&
	        allot__ceiling_member(a, q) ?
	    &a->quotas[a->ceil_q].bucket :
	    NULL;
}

void
allot__ceiling_adjust(
    allot_agent *a, const allot__qrt *q, int64_t tokens, uint64_t now)
{
	allot__bucket *lb = level_of(a, q);
	if (lb != NULL)
		allot__bucket_adjust(lb, tokens, now);
}

void
allot__ceiling_deposit(
    allot_agent *a, const allot__qrt *q, double tokens, uint64_t now)
{
	allot__bucket *lb = level_of(a, q);
	if (lb != NULL)
		allot__bucket_deposit(lb, tokens, now);
}
