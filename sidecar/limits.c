/* SPDX-License-Identifier: MIT */
/*
 * A descriptor's own limit (Envoy's RateLimitDescriptor.limit), honoured
 * with --descriptor-limits cap (docs/sidecar.md): a proxy we trust may
 * ask for a stricter limit on a request than its quota, and gets it. The
 * limit is a token bucket of this sidecar (requests_per_unit a unit,
 * burst requests_per_unit), one per (caller, endpoint class, limit),
 * charged on top of the quota: a request passes only when both admit
 * it, so the limit can make a decision stricter, never looser, and it
 * holds per replica (allotd does not see it). The table is bounded
 * (--max-descriptor-limits): a new limit takes a free slot, else the one
 * used longest ago among the slots it may go to. One mutex guards it,
 * held for a probe and one bucket take; liballot's decision is made
 * outside it.
 */
#include "agentd.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bucket.h"
#include "clock.h"
#include "hash.h"

#define PROBES 16u

struct lim_slot {
	allot__bucket b; /* first: aligned as the bucket wants */
	uint64_t hash; /* 0: free */
	uint64_t used_ns;
	uint32_t rpu;
	int unit;
	char identity[ALLOT_IDENTITY_MAX + 1];
	char endpoint[ALLOT_ENDPOINT_MAX + 1];
};

struct agentd_limits {
	pthread_mutex_t mu;
	struct lim_slot *s;
	uint32_t cap; /* a power of two */
	uint64_t seed;
};

/* Seconds in `unit` (Envoy's RateLimitUnit; a month 30 days); 0 for an
 * unknown unit. */
static double
unit_s(int unit)
{
	static const double s[] = { 0, 1, 60, 3600, 86400, 2592000, 31536000,
		604800 };
	return unit > 0 && unit < (int) (sizeof s / sizeof s[0]) ? s[unit] : 0;
}

struct agentd_limits *
agentd_limits_new(uint32_t n)
{
	uint32_t cap = 16;
	while (cap < n && cap < (1u << 24))
		cap <<= 1;
	struct agentd_limits *l = calloc(1, sizeof *l);
	if (l == NULL)
		return NULL;
	l->s = aligned_alloc(
	    _Alignof(struct lim_slot), (size_t) cap * sizeof *l->s);
	if (l->s == NULL) {
		free(l);
		return NULL;
	}
	memset(l->s, 0, (size_t) cap * sizeof *l->s);
	l->cap = cap;
	l->seed = allot__hash_seed();
	pthread_mutex_init(&l->mu, NULL);
	return l;
}

void
agentd_limits_free(struct agentd_limits *l)
{
	if (l == NULL)
		return;
	pthread_mutex_destroy(&l->mu);
	free(l->s);
	free(l);
}

static bool
same(const struct lim_slot *s, uint64_t h, const char *id, const char *ep,
    uint32_t rpu, int unit)
{
	return s->hash == h && s->rpu == rpu && s->unit == unit &&
	    strcmp(s->identity, id) == 0 && strcmp(s->endpoint, ep) == 0;
}

/* The slot of the limit, a new one (full bucket) when it has none: a
 * free slot among its probes, else the one used longest ago. Under mu. */
static struct lim_slot *
slot_of(struct agentd_limits *l, const char *id, const char *ep, uint32_t rpu,
    int unit, uint64_t now)
{
	char key[ALLOT_IDENTITY_MAX + ALLOT_ENDPOINT_MAX + 32];
	int n = snprintf(key, sizeof key, "%s\n%s\n%u\n%d", id, ep, rpu, unit);
	uint64_t h = allot__hash(key, (size_t) n, l->seed) | 1;
	struct lim_slot *free_one = NULL, *oldest = NULL;
	for (uint32_t i = 0; i < PROBES; i++) {
		struct lim_slot *s = &l->s[(h + i) & (l->cap - 1)];
		if (same(s, h, id, ep, rpu, unit))
			return s;
		if (s->hash == 0 && free_one == NULL)
			free_one = s;
		if (oldest == NULL || s->used_ns < oldest->used_ns)
			oldest = s;
	}
	struct lim_slot *s = free_one != NULL ? free_one : oldest;
	double per = (double) rpu / unit_s(unit);
	allot__allowance a = {
		.rate = rpu > 0 ? per : 1,
		.burst = rpu > 0 ? (double) rpu : 1,
		.mode = rpu > 0 ? ALLOT__MODE_LIMIT : ALLOT__MODE_CLOSED,
	};
	allot__bucket_init(&s->b, &a);
	s->hash = h;
	s->rpu = rpu;
	s->unit = unit;
	s->used_ns = now;
	snprintf(s->identity, sizeof s->identity, "%s", id);
	snprintf(s->endpoint, sizeof s->endpoint, "%s", ep);
	return s;
}

bool
agentd_limits_valid(int unit)
{
	return unit_s(unit) > 0;
}

bool
agentd_limits_take(struct agentd_limits *l, const char *id, const char *ep,
    uint32_t rpu, int unit, uint32_t cost, allot_decision *ret)
{
	uint64_t now = allot__mono_ns();
	allot__take t;
	pthread_mutex_lock(&l->mu);
	struct lim_slot *s = slot_of(
	    l, id != NULL ? id : "", ep != NULL ? ep : "", rpu, unit, now);
	s->used_ns = now;
	allot__bucket_take(&s->b, now, cost, &t);
	pthread_mutex_unlock(&l->mu);
	memset(ret, 0, sizeof *ret);
	ret->allowed = t.allowed;
	ret->cost = cost;
	ret->retry_after_ns = t.allowed ? 0 : t.wait_ns;
	ret->reset_ns = t.debt_ns;
	ret->limit = rpu > 0 ? (double) rpu : 0;
	ret->rate = rpu > 0 ? (double) rpu / unit_s(unit) : 0;
	double rem = ret->limit - (double) t.debt_ns * ret->rate / 1e9;
	ret->remaining = rem > 0 ? rem : 0;
	return t.allowed;
}

void
agentd_limits_give_back(struct agentd_limits *l, const char *id,
    const char *ep, uint32_t rpu, int unit, uint32_t cost)
{
	uint64_t now = allot__mono_ns();
	pthread_mutex_lock(&l->mu);
	struct lim_slot *s = slot_of(
	    l, id != NULL ? id : "", ep != NULL ? ep : "", rpu, unit, now);
	allot__bucket_adjust(&s->b, -(int64_t) cost, now);
	pthread_mutex_unlock(&l->mu);
}
