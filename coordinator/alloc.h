/* SPDX-License-Identifier: MIT */
/*
 * The allocator: the one place that decides how each quota's global rate R
 * and burst B are divided among the live replicas of a service. The
 * registry (state.c) fills an allot__alloc_service with, per quota, one
 * slot per participating replica carrying what that replica reported since
 * the previous round (consumed, denied, demand, held), calls
 * allot__alloc_compute() and hands the slot outputs (rate, burst) to the
 * replicas. The allocator keeps no state of its own between rounds and
 * never allocates memory, takes locks or does I/O, so it can run under the
 * registry's mutex. This issue ships the static split (each participant
 * gets R/n and B/n); the demand-aware water-filling allocator replaces the
 * body of allot__alloc_compute() behind the same interface. Every policy
 * must keep, per quota, the sum of slot rates <= R and the sum of slot
 * bursts <= B.
 */
#ifndef ALLOT_COORDINATOR_ALLOC_H
#define ALLOT_COORDINATOR_ALLOC_H

#include <stddef.h>
#include <stdint.h>

typedef enum allot__alloc_kind {
	ALLOT__ALLOC_STATIC = 0,  /* R/n and B/n for each participant */
} allot__alloc_kind;

typedef struct allot__alloc_policy {
	allot__alloc_kind kind;
	/* Demand-aware policies: the fraction of the equal share an idle
	 * replica keeps so it can admit its first requests (unused by the
	 * static split). */
	double floor_fraction;
} allot__alloc_policy;

/* One replica's use of one quota. Inputs cover the window since the
 * previous round of this service; outputs are the new allowance. */
typedef struct allot__alloc_slot {
	/* inputs */
	uint32_t replica;       /* index of the replica within the service,
	                           the same across quotas of one round */
	double consumed;        /* tokens admitted during the window */
	double denied;          /* tokens denied during the window */
	double demand;          /* last demand estimate, tokens/s */
	double held;            /* tokens in the replica's bucket, last seen */
	/* outputs */
	double rate;            /* local refill rate, tokens/s */
	double burst;           /* local capacity, tokens */
} allot__alloc_slot;

typedef struct allot__alloc_quota {
	/* inputs */
	double rate;            /* R, tokens/s */
	double burst;           /* B, tokens */
	uint32_t priority;      /* index into the config's shed order */
	double level;           /* estimated global bucket level, tokens */
	allot__alloc_slot *slots; /* one per participating replica */
	size_t nslots;
	/* outputs */
	double sum_rate;        /* sum of slot rates, <= rate */
	double sum_burst;       /* sum of slot bursts, <= burst */
} allot__alloc_quota;

/* One round for one service: all its quotas at once, so a policy may
 * apply a cross-quota bound (the global ceiling) as well. */
typedef struct allot__alloc_service {
	double ceiling_rate;    /* global ceiling over all quotas; 0 = none */
	double window_s;        /* time covered by the slot inputs */
	uint32_t nreplicas;     /* live replicas of the service */
	allot__alloc_quota *quotas;
	size_t nquotas;
} allot__alloc_service;

/* Compute every slot's rate and burst and each quota's sums in place.
 * Inputs are not modified. Safe from any thread; the caller owns `svc`.
 * Returns ALLOT_OK, or ALLOT_EINVAL for a NULL argument or an unknown
 * policy (the outputs are then zero: nothing is handed out). */
int allot__alloc_compute(const allot__alloc_policy *pol,
    allot__alloc_service *svc);

/* The name of a policy for logs and /status. */
const char *allot__alloc_name(const allot__alloc_policy *pol);

#endif
