/* SPDX-License-Identifier: MIT */
/*
 * The learning period of a cluster leader that took over (docs/operations.md,
 * Cluster; cluster.h): for one lease plus two intervals it grants only
 * within what the agents report they run on (allot__adopt(): the previous
 * leader's grants) and increases nothing. One leader allocates every
 * quota, so nothing here is about which member owns what any more.
 */
#include "registry_int.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

/* A key we are learning reported the allowance it runs on (granted by
 * the leader before): count it as our grant, as far as
 * the quota has room, so that what we hand out on top never makes the
 * total exceed R. Until it applies our answer it may still run on all
 * of it (may_*). Under the lock. */
void
allot__adopt(allot__state *st, service *svc, session *s, skey *key,
    const Allot__V1__KeyReport *r)
{
	squota *sq = &svc->q[key->q];
	double R = st->cur->rate[key->q], B = st->cur->burst[key->q];
	double hr = r->held_rate >= 0 && r->held_rate <= R ? r->held_rate :
	    r->held_rate > R                               ? R :
	                                                     0;
	double hb = r->held_burst >= 0 && r->held_burst <= B ? r->held_burst :
	    r->held_burst > B                                ? B :
	                                                       0;
	double h0 = key_hold(key);
	key->grant_rate = fmin(hr, fmax(0, R - sq->granted_rate));
	key->grant_burst = fmin(hb, fmax(0, B - sq->granted_burst));
	key->low_rate = fmin(key->low_rate, key->grant_rate);
	key->low_burst = fmin(key->low_burst, key->grant_burst);
	key->hold_rate = hr;
	key->hold_burst = hb;
	sq->granted_rate += key->grant_rate;
	sq->granted_burst += key->grant_burst;
	svc->held_total += key_hold(key) - h0;
	if (key->hold_rate != key->grant_rate ||
	    key->hold_burst != key->grant_burst)
		s->unacked = true;
	/* It is also the target to move from: the previous leader set it
	 * from this replica's demand, which our own estimate of it (from
	 * the first reports, noisy, so within the dead band for a few
	 * rounds) can only confirm or correct over time. Without this the
	 * target would be the one its Register got, with no demand known:
	 * the common level, below what the busiest replica serves. */
	key->rate = key->grant_rate;
	key->burst = key->grant_burst;
	key->targeted = true;
	key->rec_pending = true;
	svc->rec_pending = true;
}

/* The learning period of every quota of `svc`: a service that appears
 * while the leader learns (its first Register since the take-over)
 * learns until the period's end too. Under the lock. */
void
allot__own_quotas(allot__state *st, service *svc, uint64_t now)
{
	(void) now;
	if (st->cl_n == 0)
		return;
	for (size_t q = 0; q < st->cur->nq; q++) {
		squota *sq = &svc->q[q];
		if (sq->learn_until_ns < st->cl_boot_until_ns)
			sq->learn_until_ns = st->cl_boot_until_ns;
	}
}

/* A quota being learnt is learnt once every replica of the service has
 * said what it runs on (each holds a grant here, adopted or made) and
 * reported twice: no allowance of the previous owner is unknown any
 * more, and every replica's demand estimate is its own. A placeholder
 * (of a restart, or at a take-over one of the replicas the previous
 * leader last recorded live, replicated: restore.c) keeps the learning
 * period running until its replica registers again or the period ends;
 * so does a replica still reporting the quota elsewhere. Under the lock,
 * every tick. */
void
allot__learned(allot__state *st, service *svc, uint64_t now)
{
	const cfgv *v = st->cur;
	if (st->cl_n == 0 || svc->nsess == 0)
		return;
	for (size_t q = 0; q < v->nq; q++)
		svc->q[q].unheard = false;
	/* Nor before every replica has reported a second window: the
	 * first gives no demand estimate (a fresh replica claims the
	 * others' average), and a round run on it would cut the replica
	 * serving most of a quota to the common level right after the
	 * failover. */
	FOR_EACH_KEY (svc, i, s, key)
		if (s->placeholder || isnan(key->grant_rate) ||
		    s->last_seq < 2)
			svc->q[key->q].unheard = true;
	for (size_t q = 0; q < v->nq; q++) {
		squota *sq = &svc->q[q];
		if (now < sq->learn_until_ns && !sq->unheard)
			sq->learn_until_ns = now;
	}
}

/* allot__service_get(), and the cluster ownership of a service it
 * created. */
service *
allot__service_open(allot__state *st, const char *name, bool *full)
{
	size_t n = st->nsvcs;
	service *svc = allot__service_get(st, name, full);
	if (svc != NULL && st->nsvcs > n)
		allot__own_quotas(st, svc, now_ns(st));
	return svc;
}

void
allot__state_learn(allot__state *st)
{
	pthread_mutex_lock(&st->mu);
	uint64_t now = now_ns(st);
	st->cl_n = 1;
	st->cl_learn_ns = ((uint64_t) st->o.lease_ms +
	                      2u * (uint64_t) st->o.interval_ms) *
	    1000000u;
	st->cl_boot_until_ns = now + st->cl_learn_ns;
	for (size_t i = 0; i < st->nsvcs; i++) {
		allot__own_quotas(st, st->svcs[i], now);
		st->svcs[i]->gen++;
		for (uint32_t j = 0; j < st->svcs[i]->nsess; j++)
			st->svcs[i]->sess[j]->force_full = true;
	}
	pthread_mutex_unlock(&st->mu);
}
