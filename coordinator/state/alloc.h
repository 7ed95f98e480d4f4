/* SPDX-License-Identifier: MIT */
/*
 * The allocator: the one place that decides how each quota's global rate R
 * and burst B are divided among the live replicas of a service. The
 * allocation round (grants.c) fills an allot__alloc_service with, per quota,
 * one slot per participating replica carrying its demand estimate, what it
 * reported since the previous round and its current target, calls
 * allot__alloc_compute() and hands the slot outputs (rate, burst) to the
 * replicas as targets. The allocator keeps no state of its own between
 * rounds and never allocates memory, takes locks or does I/O, so it can
 * run under the registry's mutex. Two policies: the static split (R/n and
 * B/n, the bootstrap and the reference) and the demand-aware allocator
 * (docs/allocation.md): a global ceiling shared across quotas in priority
 * order, max-min fair water-filling of each quota's allowance across its
 * replicas by demand with a floor for idle replicas and the leftover
 * spread over everyone, each replica claiming at least its long-run part
 * of the demand, and burst shares of B with no replica weighed below its
 * equal part. Every policy keeps, per quota, the sum of slot rates <= the
 * quota's allowance <= R, the sum of slot bursts <= the burst budget <= B,
 * and the sum of allowances <= the ceiling.
 */
#ifndef ALLOT_COORDINATOR_ALLOC_H
#define ALLOT_COORDINATOR_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum allot__alloc_kind {
	ALLOT__ALLOC_STATIC = 0, /* R/n and B/n for each participant */
	ALLOT__ALLOC_DEMAND = 1, /* demand-aware water-filling */
} allot__alloc_kind;

/* Defaults of the demand-aware policy (allot__alloc_policy_init()). */
#define ALLOT__ALLOC_FLOOR_FRACTION 0.05
#define ALLOT__ALLOC_REPLICA_FLOOR 0.25
#define ALLOT__ALLOC_HEADROOM 0.25
#define ALLOT__ALLOC_DEADBAND 0.05
#define ALLOT__ALLOC_NOISE_Z 2.0
#define ALLOT__ALLOC_LOAN_FRAC 0.3
#define ALLOT__ALLOC_BODY_INTERVALS 4.0
/* The longest interval a body counts: its window is BODY_INTERVALS
 * intervals of at most this many seconds (docs/allocation.md). */
#define ALLOT__ALLOC_BODY_INTERVAL_MAX_S 0.1
#define ALLOT__ALLOC_CENTRAL_POOL 0.1

typedef struct allot__alloc_policy {
	allot__alloc_kind kind;
	/* The fraction of R a quota that went quiet still wants under the
	 * ceiling, so it can admit again before the next round. In [0, 1]. */
	double floor_fraction;
	/* The fraction of the equal share (allowance / n) an idle replica
	 * that has served the quota's callers keeps, so that its bucket
	 * refills (its burst follows its rate) for a burst that lands on it
	 * next rather than where the last one did. One that never saw
	 * their traffic keeps floor_fraction of it, enough to admit its
	 * first requests: replicas the callers do not reach (or replicas
	 * that only registered) hold little of a busy quota. In [0, 1]. */
	double replica_floor;
	/* A replica claims its demand estimate times (1 + headroom): the
	 * margin that absorbs the fluctuation of its arrivals between two
	 * rounds. >= 0. */
	double headroom;
	/* A slot whose new rate is within this fraction of its current
	 * target keeps the current target (as long as the quota's sum
	 * allows): shares do not follow noise in the demand estimates, and
	 * Replies stay small. In [0, 1); 0 disables it. */
	double deadband;
	/* The dead band is also at least this many standard deviations of
	 * the slot's demand estimate (a replica that sees a few requests
	 * per interval has a noisy one). A rise beyond the current target
	 * passes regardless when the replica was denied something, and up
	 * to its mark (the smaller of its long-run part of the allowance
	 * and the equal share) when the target is below it. >= 0. */
	double noise_z;
	/* Loans (grants.c, docs/allocation.md "Loans"): tokens moved at
	 * once to a replica whose early Sync reports denials, taken from
	 * the others' unused levels; at most loan_frac * R * T of a quota
	 * lent at a time. >= 0; 0 disables them. */
	double loan_frac;
	/* The central reserve (docs/allocation.md): a quota whose config
	 * does not opt out (`reserve: 0`) keeps what its replicas' traffic
	 * does not need in the coordinator's reserve, served to a request
	 * its local bucket is short of in one round trip (the tail path).
	 * Its replicas' rates are their claims, not the claims with the
	 * leftover spread over them, and their bursts cover body_intervals
	 * sync intervals at that rate (intervals of at most
	 * ALLOT__ALLOC_BODY_INTERVAL_MAX_S): the rest of the allowance refills
	 * the reserve and the rest of the budget is its capacity. false:
	 * every quota is local only (loans still move tokens). */
	bool central;
	double body_intervals; /* > 0 */
	/* With a central reserve, the part of the allowance that stays
	 * pooled at the coordinator when the replicas' claims exceed the
	 * rest (every replica short): in [0, 1). */
	double central_pool;
} allot__alloc_policy;

/* The demand-aware policy with its defaults. */
void allot__alloc_policy_init(allot__alloc_policy *pol);

/* One replica's use of one quota. Inputs describe the replica now;
 * outputs are its new target allowance. */
typedef struct allot__alloc_slot {
	/* inputs */
	uint32_t replica; /* index of the replica within the service,
	                     the same across quotas of one round */
	double consumed; /* tokens admitted during the window */
	double denied; /* tokens denied during the window */
	double demand; /* demand estimate, tokens/s (admitted +
	                  denied cost, smoothed) */
	double demand_var; /* its variance (noise), (tokens/s)^2;
	                      0: unknown */
	double demand_body; /* the body of the demand, tokens/s: its
	                       estimate over windows each clipped to
	                       four times it plus a step (a burst
	                       barely moves it) */
	double demand_slow; /* the demand estimate averaged over a
	                       much longer time (ALLOT__SLOW_TAUS), tokens/s:
	                       the replica's part of the traffic in the
	                       long run; 0: unknown */
	bool fresh; /* no estimate yet (a newcomer): it claims
	               what the others claim on average */
	double held; /* tokens in the replica's bucket, last seen */
	bool served; /* it has reported traffic of this quota at some
	                point (its floor is replica_floor, not
	                floor_fraction) */
	bool stale; /* it has not reported since demand appeared in
	               its quota (onset): its estimate predates it, so
	               it keeps its target (rate and burst) this round */
	bool tail; /* its agent waits for the central reserve when its
	              bucket is short, and so does not raise a burst
	              below the largest endpoint weight to it (a costlier
	              request goes to the reserve) */
	bool has_prev; /* prev_* is the current target */
	double prev_rate;
	double prev_burst;
	/* outputs */
	double rate; /* local refill rate, tokens/s */
	double burst; /* local capacity, tokens */
	/* With aq->own: its own allowance's target, before the ceiling's
	 * cut: the rate times aq->own, and its part of the whole B (by
	 * the same weights as its burst, but never the stale slots'
	 * keeping theirs, which a falling allowance shrinks). */
	double own_rate;
	double own_burst;
} allot__alloc_slot;

typedef struct allot__alloc_quota {
	/* inputs */
	double rate; /* R, tokens/s */
	double burst; /* B, tokens */
	uint32_t priority; /* index into the config's shed order:
	                      0 is shed first, higher is kept longer */
	double min_burst; /* the largest endpoint weight: an agent
	                     raises a smaller local burst to it */
	bool central; /* keeps a central reserve (policy.central and
	                 the quota does not opt out) */
	double reserve; /* the quota's `reserve`: the most of its burst the
	                   reserve may hold, in [0, 1] */
	allot__alloc_slot *slots; /* one per participating replica */
	size_t nslots;
	/* outputs */
	double allowance; /* the quota's share of the ceiling, <= R */
	double burst_budget; /* what the slot bursts may sum to, <= B */
	double claim; /* sum of the slots' claims, tokens/s */
	double demand; /* sum of the slots' demand estimates, tokens/s:
	                  the claim without its headroom and noise */
	double sum_rate; /* sum of slot rates, <= allowance */
	double sum_burst; /* sum of slot bursts, <= burst_budget */
	bool pooled; /* central and some slot waits for the reserve: the
	                parts of those slots not in their buckets are
	                pooled there */
	double own; /* > 1 while the ceiling cuts the quota on the
	               configuration but not on demand and it keeps no
	               central reserve: R / allowance, what its slots'
	               own allowances are of their rates and bursts
	               (Share.own_rate, agent/ceiling.c); 0: none */
} allot__alloc_quota;

/* One round for one service: all its quotas at once, so a policy may
 * apply a cross-quota bound (the global ceiling) as well. */
typedef struct allot__alloc_service {
	double ceiling_rate; /* global ceiling over all quotas; 0 = none */
	double window_s; /* time covered by the slot inputs */
	double interval_s; /* the sync interval T */
	uint32_t nreplicas; /* live replicas of the service */
	allot__alloc_quota *quotas;
	size_t nquotas;
} allot__alloc_service;

/* Compute every slot's rate and burst and each quota's outputs in place.
 * Inputs are not modified. Safe from any thread; the caller owns `svc`.
 * Returns ALLOT_OK, or ALLOT_EINVAL for a NULL argument or an unknown
 * policy (the outputs are then zero: nothing is handed out). */
int allot__alloc_compute(
    const allot__alloc_policy *pol, allot__alloc_service *svc);

/* The name of a policy for logs and /status. */
const char *allot__alloc_name(const allot__alloc_policy *pol);

#endif
