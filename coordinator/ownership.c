/* SPDX-License-Identifier: MIT */
/*
 * Cluster mode (docs/operations.md, Cluster): which quotas this member
 * owns in its view of the members, and the learning period of a quota it
 * takes over, during which it grants only within what the agents report
 * they run on (allot__adopt()) and increases nothing.
 */
#include "registry_int.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

/* A key we are learning reported the allowance it runs on (granted by
 * the member that owned it before): count it as our grant, as far as
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
	key->hold_rate = hr;
	key->hold_burst = hb;
	sq->granted_rate += key->grant_rate;
	sq->granted_burst += key->grant_burst;
	svc->held_total += key_hold(key) - h0;
	if (key->hold_rate != key->grant_rate ||
	    key->hold_burst != key->grant_burst)
		s->unacked = true;
	key->rec_pending = true;
	svc->rec_pending = true;
}

/* Another member owns quota `q` of `svc` now: what we granted for it
 * is that member's to account for (it learns what the agents hold). */
static void
disown(service *svc, size_t q)
{
	squota *sq = &svc->q[q];
	FOR_EACH_KEY (svc, i, s, key) {
		if (key->q != (int32_t) q)
			continue;
		double h0 = key_hold(key);
		key->grant_rate = key->grant_burst = NAN;
		key->hold_rate = key->hold_burst = NAN;
		svc->held_total -= h0;
	}
	sq->granted_rate = sq->granted_burst = 0;
	sq->disowned = true;
}

/* Ownership of every quota of `svc` in our current view; returns how
 * many quotas changed hands. A quota we gain is learnt for one lease
 * (plus two intervals: the old owner may have granted until it saw the
 * change). Under the lock. */
uint32_t
allot__own_quotas(allot__state *st, service *svc, uint64_t now)
{
	if (st->cl_n == 0)
		return 0;
	const cfgv *v = st->cur;
	uint32_t changed = 0;
	for (size_t q = 0; q < v->nq; q++) {
		squota *sq = &svc->q[q];
		int o = allot__rendezvous_owner(
		    allot__rendezvous_key(svc->name, v->names[q]), st->cl_hash,
		    st->cl_cut_off ? NULL : st->cl_live, st->cl_n);
		bool own = o == (int) st->cl_self;
		if (own && sq->disowned) {
			sq->disowned = false;
			sq->learn_until_ns = now + st->cl_learn_ns;
			changed++;
		} else if (!own && !sq->disowned) {
			disown(svc, q);
			changed++;
		}
		if (own && sq->learn_until_ns < st->cl_boot_until_ns)
			sq->learn_until_ns = st->cl_boot_until_ns;
	}
	if (changed > 0) {
		svc->gen++;
		for (uint32_t i = 0; i < svc->nsess; i++)
			svc->sess[i]->force_full = true;
	}
	return changed;
}

/* A quota being learnt is learnt once every replica of the service has
 * said what it runs on (each holds a grant here, adopted or made): no
 * allowance of the previous owner is unknown any more. A placeholder of
 * a restart, or a replica still reporting the quota elsewhere, keeps the
 * learning period running to its end. Under the lock, every tick. */
void
allot__learned(allot__state *st, service *svc, uint64_t now)
{
	const cfgv *v = st->cur;
	if (st->cl_n == 0 || svc->nsess == 0)
		return;
	for (size_t q = 0; q < v->nq; q++)
		svc->q[q].unheard = false;
	FOR_EACH_KEY (svc, i, s, key)
		if (s->placeholder || isnan(key->grant_rate))
			svc->q[key->q].unheard = true;
	for (size_t q = 0; q < v->nq; q++) {
		squota *sq = &svc->q[q];
		if (!sq->disowned && now < sq->learn_until_ns && !sq->unheard)
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
allot__state_cluster(
    allot__state *st, const uint64_t *hashes, size_t n, size_t self)
{
	pthread_mutex_lock(&st->mu);
	uint64_t now = now_ns(st);
	st->cl_n = n;
	st->cl_self = self;
	for (size_t i = 0; i < n; i++) {
		st->cl_hash[i] = hashes[i];
		st->cl_live[i] = true;
	}
	st->cl_learn_ns = ((uint64_t) st->o.lease_ms +
	                      2u * (uint64_t) st->o.interval_ms) *
	    1000000u;
	st->cl_boot_until_ns = now + st->cl_learn_ns;
	for (size_t i = 0; i < st->nsvcs; i++)
		allot__own_quotas(st, st->svcs[i], now);
	pthread_mutex_unlock(&st->mu);
}

uint32_t
allot__state_view(allot__state *st, const bool *live, bool cut_off)
{
	uint32_t moved = 0;
	pthread_mutex_lock(&st->mu);
	uint64_t now = now_ns(st);
	bool same = st->cl_cut_off == cut_off;
	for (size_t i = 0; i < st->cl_n; i++) {
		same = same && st->cl_live[i] == live[i];
		st->cl_live[i] = live[i];
	}
	st->cl_cut_off = cut_off;
	if (!same)
		for (size_t i = 0; i < st->nsvcs; i++)
			moved += allot__own_quotas(st, st->svcs[i], now);
	pthread_mutex_unlock(&st->mu);
	return moved;
}

void
allot__state_ownership(allot__state *st, allot__state_owned *ret)
{
	memset(ret, 0, sizeof *ret);
	pthread_mutex_lock(&st->mu);
	uint64_t now = now_ns(st);
	for (size_t i = 0; i < st->nsvcs; i++)
		for (size_t q = 0; q < st->cur->nq; q++) {
			const squota *sq = &st->svcs[i]->q[q];
			ret->owned += !sq->disowned;
			ret->learning += !sq->disowned && st->cl_n > 0 &&
			    now < sq->learn_until_ns;
			ret->total++;
		}
	ret->cut_off = st->cl_cut_off;
	pthread_mutex_unlock(&st->mu);
}
