/* SPDX-License-Identifier: MIT */
/*
 * Client-side adaptive throttling (allot/client.h), after Google's SRE
 * book, chapter "Handling Overload": a sliding window of requests and
 * accepts, kept as a ring of fixed-width buckets with running totals so
 * that each call is O(1) however many buckets the window has, and a local
 * rejection drawn with probability max(0, (requests - K * accepts) /
 * (requests + 1)). One mutex guards the ring, the totals and the random
 * generator; a throttle decision costs about what building a request
 * does.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <allot/client.h>

#include "clock.h"
#include "prng.h"

#define MAX_BUCKETS 3600u

struct tslot {
	uint64_t requests;
	uint64_t accepts;
};

struct allot_throttle {
	allot_throttle_options opts;
	uint64_t width_ns;
	uint32_t n; /* buckets in the window */
	pthread_mutex_t mu; /* guards everything below but the counters */
	struct tslot *ring; /* bucket e lives in ring[e % n] */
	uint64_t head; /* newest bucket index seen */
	uint64_t win_requests; /* sums over the ring */
	uint64_t win_accepts;
	uint64_t rng;
	_Atomic uint64_t requests;
	_Atomic uint64_t throttled;
	_Atomic uint64_t accepts;
	_Atomic uint64_t rejects;
};

void
allot_throttle_options_init(allot_throttle_options *opts)
{
	if (opts == NULL)
		return;
	memset(opts, 0, sizeof(*opts));
	opts->k = 2.0;
	opts->window_ms = 60000;
	opts->bucket_ms = 1000;
}

static uint64_t
now_ns(const allot_throttle *t)
{
	if (t->opts.clock != NULL)
		return t->opts.clock(t->opts.clock_ctx);
	return allot__mono_ns();
}

int
allot_throttle_create(
    const allot_throttle_options *opts, allot_throttle **ret_throttle)
{
	allot_throttle_options o;
	allot_throttle *t;

	if (ret_throttle == NULL)
		return ALLOT_EINVAL;
	if (opts == NULL)
		allot_throttle_options_init(&o);
	else
		o = *opts;
	if (!(o.k >= 1.0) || o.bucket_ms == 0 || o.window_ms < o.bucket_ms ||
	    o.window_ms / o.bucket_ms > MAX_BUCKETS)
		return ALLOT_EINVAL;

	t = calloc(1, sizeof(*t));
	if (t == NULL)
		return ALLOT_ENOMEM;
	t->n = o.window_ms / o.bucket_ms;
	t->ring = calloc(t->n, sizeof(*t->ring));
	if (t->ring == NULL || pthread_mutex_init(&t->mu, NULL) != 0) {
		free(t->ring);
		free(t);
		return ALLOT_ENOMEM;
	}
	t->opts = o;
	t->width_ns = (uint64_t) o.bucket_ms * 1000000u;
	t->rng = allot__prng_seed(o.seed, t);
	t->head = now_ns(t) / t->width_ns;
	*ret_throttle = t;
	return ALLOT_OK;
}

void
allot_throttle_destroy(allot_throttle *throttle)
{
	if (throttle == NULL)
		return;
	pthread_mutex_destroy(&throttle->mu);
	free(throttle->ring);
	free(throttle);
}

/* Move the window to time `now`: every bucket that falls out of it is
 * subtracted from the totals and cleared for reuse. A clock that steps
 * back (only an injected one can) leaves the window where it is. Called
 * with the mutex held. */
static struct tslot *
advance(allot_throttle *t, uint64_t now)
{
	uint64_t e = now / t->width_ns;

	if (e > t->head) {
		uint64_t steps = e - t->head;
		if (steps >= t->n) {
			memset(t->ring, 0, t->n * sizeof(*t->ring));
			t->win_requests = 0;
			t->win_accepts = 0;
		} else {
			for (uint64_t i = 1; i <= steps; i++) {
				struct tslot *s =
				    &t->ring[(t->head + i) % t->n];
				t->win_requests -= s->requests;
				t->win_accepts -= s->accepts;
				s->requests = 0;
				s->accepts = 0;
			}
		}
		t->head = e;
	}
	return &t->ring[t->head % t->n];
}

static double
probability(const allot_throttle *t)
{
	double req = (double) t->win_requests;
	double p = (req - t->opts.k * (double) t->win_accepts) / (req + 1.0);
	return p > 0.0 ? p : 0.0;
}

bool
allot_throttle_admit(allot_throttle *throttle)
{
	allot_throttle *t = throttle;
	bool send = true;

	if (t == NULL)
		return true;
	uint64_t now = now_ns(t);
	pthread_mutex_lock(&t->mu);
	struct tslot *s = advance(t, now);
	double p = probability(t);
	if (p > 0.0) {
		double u = allot__splitmix64_unit(&t->rng);
		send = u >= p;
	}
	/* A request sent now is counted when its answer is recorded, so a
	 * slow reply is not mistaken for a rejection; one refused here is
	 * counted at once (the SRE formula counts attempts the application
	 * made, throttled ones included). */
	if (!send) {
		s->requests++;
		t->win_requests++;
	}
	pthread_mutex_unlock(&t->mu);
	atomic_fetch_add_explicit(&t->requests, 1, memory_order_relaxed);
	if (!send)
		atomic_fetch_add_explicit(
		    &t->throttled, 1, memory_order_relaxed);
	return send;
}

void
allot_throttle_record(allot_throttle *throttle, bool accepted)
{
	allot_throttle *t = throttle;

	if (t == NULL)
		return;
	if (!accepted)
		atomic_fetch_add_explicit(
		    &t->rejects, 1, memory_order_relaxed);
	uint64_t now = now_ns(t);
	pthread_mutex_lock(&t->mu);
	struct tslot *s = advance(t, now);
	s->requests++;
	t->win_requests++;
	if (accepted) {
		s->accepts++;
		t->win_accepts++;
	}
	pthread_mutex_unlock(&t->mu);
	if (accepted)
		atomic_fetch_add_explicit(
		    &t->accepts, 1, memory_order_relaxed);
}

int
allot_throttle_stats_get(allot_throttle *throttle, allot_throttle_stats *ret)
{
	allot_throttle *t = throttle;

	if (t == NULL || ret == NULL)
		return ALLOT_EINVAL;
	uint64_t now = now_ns(t);
	pthread_mutex_lock(&t->mu);
	advance(t, now);
	ret->window_requests = t->win_requests;
	ret->window_accepts = t->win_accepts;
	ret->reject_probability = probability(t);
	pthread_mutex_unlock(&t->mu);
	ret->requests = atomic_load_explicit(
	    &t->requests, memory_order_relaxed);
	ret->throttled = atomic_load_explicit(
	    &t->throttled, memory_order_relaxed);
	ret->accepts = atomic_load_explicit(&t->accepts, memory_order_relaxed);
	ret->rejects = atomic_load_explicit(&t->rejects, memory_order_relaxed);
	return ALLOT_OK;
}
