/* SPDX-License-Identifier: MIT */
/*
 * The concurrency limiter (allot/conc.h). One mutex guards all of it: the
 * in-flight counts at three levels (caller-in-lane, lane, whole limiter),
 * one FIFO queue per lane, and the caller-name table. Each waiter sleeps
 * on its own condition variable (CLOCK_MONOTONIC, so wall-clock steps do
 * not stretch the maximum age), and a release hands the freed permit
 * directly to the chosen waiter, counting it as held before the waiter
 * wakes. That keeps one invariant that makes the queue fair: after every
 * call returns, no queued waiter could run, so an arrival that finds room
 * never overtakes a waiter that could have used it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <allot/conc.h>

#include "clock.h"
#include "hash.h"
#include "idmap.h"

struct cstats {
	uint32_t in_flight;
	uint32_t max_in_flight;
	uint32_t queued;
	uint64_t acquired;
	uint64_t rejected_full;
	uint64_t rejected_age;
	uint64_t max_age_ns;
};

struct waiter {
	struct waiter *prev;
	struct waiter *next;
	uint32_t caller;
	bool granted; /* set by the granter, under the mutex */
	uint64_t enq_ns;
	pthread_cond_t cv;
};

struct queue {
	struct waiter *head;
	struct waiter *tail;
};

struct allot_conc {
	allot_conc_options o; /* with derived lane_max filled in */
	pthread_mutex_t mu;
	pthread_condattr_t cvattr;
	struct queue q[ALLOT_CONC_LANES];
	struct cstats total;
	struct cstats lane[ALLOT_CONC_LANES];
	struct cstats *caller; /* [slot * ALLOT_CONC_LANES + lane] */
	allot__idmap names; /* caller name hash -> slot (idmap.h) */
	char **slot_name; /* [slot]: its caller's name; [0] unused */
	uint32_t next_slot;
	uint64_t seed;
};

void
allot_conc_options_init(allot_conc_options *opts)
{
	if (opts == NULL)
		return;
	memset(opts, 0, sizeof(*opts));
	opts->max_callers = 256;
	opts->global_max = 64;
	opts->caller_max[ALLOT_LANE_INTERACTIVE] = 16;
	opts->caller_max[ALLOT_LANE_BULK] = 4;
	opts->queue_max[ALLOT_LANE_INTERACTIVE] = 64;
	opts->queue_max[ALLOT_LANE_BULK] = 64;
	opts->caller_queue_max[ALLOT_LANE_INTERACTIVE] = 8;
	opts->caller_queue_max[ALLOT_LANE_BULK] = 8;
	opts->max_wait_ms[ALLOT_LANE_INTERACTIVE] = 100;
	opts->max_wait_ms[ALLOT_LANE_BULK] = 1000;
}

int
allot_conc_create(const allot_conc_options *opts, allot_conc **ret_conc)
{
	allot_conc_options o;
	allot_conc *c;

	if (ret_conc == NULL)
		return ALLOT_EINVAL;
	if (opts == NULL)
		allot_conc_options_init(&o);
	else
		o = *opts;
	if (o.lane_max[ALLOT_LANE_INTERACTIVE] == 0)
		o.lane_max[ALLOT_LANE_INTERACTIVE] = o.global_max;
	if (o.lane_max[ALLOT_LANE_BULK] == 0)
		o.lane_max[ALLOT_LANE_BULK] = o.global_max / 2;
	if (o.max_callers == 0 || o.max_callers > (1u << 24) ||
	    o.global_max < 2 ||
	    o.lane_max[ALLOT_LANE_INTERACTIVE] > o.global_max ||
	    o.lane_max[ALLOT_LANE_BULK] >= o.global_max ||
	    o.caller_max[ALLOT_LANE_INTERACTIVE] == 0 ||
	    o.caller_max[ALLOT_LANE_BULK] == 0)
		return ALLOT_EINVAL;

	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return ALLOT_ENOMEM;
	c->o = o;
	c->caller = calloc(
	    (size_t) o.max_callers * ALLOT_CONC_LANES, sizeof(*c->caller));
	c->slot_name = calloc(o.max_callers, sizeof(*c->slot_name));
	if (c->caller == NULL || c->slot_name == NULL ||
	    allot__idmap_init(&c->names, o.max_callers) != ALLOT_OK)
		goto fail_mem;
	if (pthread_condattr_init(&c->cvattr) != 0)
		goto fail_mem;
	if (pthread_condattr_setclock(&c->cvattr, CLOCK_MONOTONIC) != 0 ||
	    pthread_mutex_init(&c->mu, NULL) != 0) {
		pthread_condattr_destroy(&c->cvattr);
		goto fail_mem;
	}
	c->next_slot = 1;
	c->seed = allot__hash_seed();
	*ret_conc = c;
	return ALLOT_OK;

fail_mem:
	free(c->caller);
	free(c->slot_name);
	allot__idmap_fini(&c->names);
	free(c);
	return ALLOT_ENOMEM;
}

void
allot_conc_destroy(allot_conc *conc)
{
	if (conc == NULL)
		return;
	for (uint32_t i = 1; i < conc->next_slot; i++)
		free(conc->slot_name[i]);
	pthread_mutex_destroy(&conc->mu);
	pthread_condattr_destroy(&conc->cvattr);
	free(conc->slot_name);
	allot__idmap_fini(&conc->names);
	free(conc->caller);
	free(conc);
}

int
allot_conc_caller(allot_conc *conc, const char *name, uint32_t *ret_slot)
{
	allot_conc *c = conc;

	if (c == NULL || ret_slot == NULL)
		return ALLOT_EINVAL;
	if (name == NULL || name[0] == '\0') {
		*ret_slot = ALLOT_CONC_DEFAULT_CALLER;
		return ALLOT_OK;
	}
	size_t len = strnlen(name, ALLOT_IDENTITY_MAX + 1);
	if (len > ALLOT_IDENTITY_MAX)
		return ALLOT_EINVAL;

	uint64_t h = allot__hash(name, len, c->seed);
	int rc = ALLOT_OK;
	pthread_mutex_lock(&c->mu);
	uint32_t pos = allot__idmap_start(&c->names, h), slot;
	while ((slot = allot__idmap_next(&c->names, h, &pos)) !=
	        ALLOT__IDMAP_NONE &&
	    strcmp(c->slot_name[slot], name) != 0)
		;
	if (slot != ALLOT__IDMAP_NONE) {
		*ret_slot = slot;
	} else if (c->next_slot >= c->o.max_callers) {
		*ret_slot = ALLOT_CONC_DEFAULT_CALLER;
	} else {
		char *copy = malloc(len + 1);
		if (copy == NULL) {
			rc = ALLOT_ENOMEM;
		} else {
			memcpy(copy, name, len + 1);
			slot = c->next_slot++;
			c->slot_name[slot] = copy;
			allot__idmap_add(&c->names, h, slot);
			*ret_slot = slot;
		}
	}
	pthread_mutex_unlock(&c->mu);
	return rc;
}

static struct cstats *
caller_stats(allot_conc *c, uint32_t caller, uint32_t lane)
{
	return &c->caller[(size_t) caller * ALLOT_CONC_LANES + lane];
}

/* May a permit for (caller, lane) be held on top of those held now? */
static bool
may_run(const allot_conc *c, uint32_t caller, uint32_t lane)
{
	const struct cstats *cs =
	    &c->caller[(size_t) caller * ALLOT_CONC_LANES + lane];
	return c->total.in_flight < c->o.global_max &&
	    c->lane[lane].in_flight < c->o.lane_max[lane] &&
	    cs->in_flight < c->o.caller_max[lane];
}

/* The three levels a permit counts at: the caller in the lane, the lane,
 * and the whole limiter. */
static void
levels(allot_conc *c, uint32_t caller, uint32_t lane, struct cstats *lv[3])
{
	lv[0] = caller_stats(c, caller, lane);
	lv[1] = &c->lane[lane];
	lv[2] = &c->total;
}

/* Count a permit as held at every level. Called with the mutex held. */
static void
hold(allot_conc *c, uint32_t caller, uint32_t lane)
{
	struct cstats *lv[3];
	levels(c, caller, lane, lv);
	for (int i = 0; i < 3; i++) {
		lv[i]->in_flight++;
		if (lv[i]->in_flight > lv[i]->max_in_flight)
			lv[i]->max_in_flight = lv[i]->in_flight;
		lv[i]->acquired++;
	}
}

static void
unlink_waiter(allot_conc *c, uint32_t lane, struct waiter *w, uint64_t now)
{
	struct queue *q = &c->q[lane];
	uint64_t age = now > w->enq_ns ? now - w->enq_ns : 0;

	if (w->prev != NULL)
		w->prev->next = w->next;
	else
		q->head = w->next;
	if (w->next != NULL)
		w->next->prev = w->prev;
	else
		q->tail = w->prev;
	w->prev = w->next = NULL;
	struct cstats *lv[3];
	levels(c, w->caller, lane, lv);
	for (int i = 0; i < 3; i++) {
		lv[i]->queued--;
		if (age > lv[i]->max_age_ns)
			lv[i]->max_age_ns = age;
	}
}

/* Hand free permits to queued waiters: interactive first, then bulk, each
 * lane in arrival order, skipping waiters whose limits do not allow them
 * to run yet. Called with the mutex held after anything that frees a
 * permit. */
static void
grant_waiters(allot_conc *c)
{
	uint64_t now = 0;

	for (uint32_t lane = 0; lane < ALLOT_CONC_LANES; lane++) {
		struct waiter *w = c->q[lane].head;
		while (w != NULL && c->total.in_flight < c->o.global_max) {
			struct waiter *next = w->next;
			if (may_run(c, w->caller, lane)) {
				if (now == 0)
					now = allot__mono_ns();
				unlink_waiter(c, lane, w, now);
				hold(c, w->caller, lane);
				w->granted = true;
				pthread_cond_signal(&w->cv);
			}
			w = next;
		}
	}
}

static int
check_args(allot_conc *c, uint32_t caller, allot_conc_lane lane,
    const allot_conc_permit *ret_permit)
{
	if (c == NULL || ret_permit == NULL || caller >= c->o.max_callers ||
	    (unsigned) lane >= ALLOT_CONC_LANES)
		return ALLOT_EINVAL;
	return ALLOT_OK;
}

static void
fill_permit(
    allot_conc *c, uint32_t caller, uint32_t lane, allot_conc_permit *p)
{
	p->conc = c;
	p->caller = caller;
	p->lane = lane;
}

int
allot_conc_acquire(allot_conc *conc, uint32_t caller, allot_conc_lane lane,
    uint32_t timeout_ms, allot_conc_permit *ret_permit)
{
	allot_conc *c = conc;
	struct waiter w;
	int rc;

	rc = check_args(c, caller, lane, ret_permit);
	if (rc != ALLOT_OK)
		return rc;
	uint32_t l = (uint32_t) lane;
	uint32_t wait_ms = timeout_ms < c->o.max_wait_ms[l] ?
	    timeout_ms :
	    c->o.max_wait_ms[l];

	pthread_mutex_lock(&c->mu);
	if (may_run(c, caller, l)) {
		hold(c, caller, l);
		pthread_mutex_unlock(&c->mu);
		fill_permit(c, caller, l, ret_permit);
		return ALLOT_OK;
	}
	struct cstats *lv[3];
	levels(c, caller, l, lv);
	if (wait_ms == 0 || lv[1]->queued >= c->o.queue_max[l] ||
	    lv[0]->queued >= c->o.caller_queue_max[l]) {
		for (int i = 0; i < 3; i++)
			lv[i]->rejected_full++;
		pthread_mutex_unlock(&c->mu);
		return ALLOT_EBUSY;
	}

	memset(&w, 0, sizeof(w));
	w.caller = caller;
	if (pthread_cond_init(&w.cv, &c->cvattr) != 0) {
		pthread_mutex_unlock(&c->mu);
		return ALLOT_ENOMEM;
	}
	w.enq_ns = allot__mono_ns();
	w.prev = c->q[l].tail;
	if (w.prev != NULL)
		w.prev->next = &w;
	else
		c->q[l].head = &w;
	c->q[l].tail = &w;
	for (int i = 0; i < 3; i++)
		lv[i]->queued++;

	uint64_t deadline = w.enq_ns + (uint64_t) wait_ms * 1000000u;
	struct timespec ts = {
		.tv_sec = (time_t) (deadline / 1000000000u),
		.tv_nsec = (long) (deadline % 1000000000u),
	};
	while (!w.granted) {
		int e = pthread_cond_timedwait(&w.cv, &c->mu, &ts);
		if (e == ETIMEDOUT && !w.granted) {
			unlink_waiter(c, l, &w, allot__mono_ns());
			for (int i = 0; i < 3; i++)
				lv[i]->rejected_age++;
			break;
		}
	}
	rc = w.granted ? ALLOT_OK : ALLOT_ETIMEDOUT;
	pthread_mutex_unlock(&c->mu);
	pthread_cond_destroy(&w.cv);
	if (rc == ALLOT_OK)
		fill_permit(c, caller, l, ret_permit);
	return rc;
}

int
allot_conc_try_acquire(allot_conc *conc, uint32_t caller, allot_conc_lane lane,
    allot_conc_permit *ret_permit)
{
	return allot_conc_acquire(conc, caller, lane, 0, ret_permit);
}

void
allot_conc_release(allot_conc_permit *permit)
{
	if (permit == NULL || permit->conc == NULL)
		return;
	allot_conc *c = permit->conc;
	uint32_t caller = permit->caller, lane = permit->lane;
	permit->conc = NULL;

	pthread_mutex_lock(&c->mu);
	struct cstats *lv[3];
	levels(c, caller, lane, lv);
	for (int i = 0; i < 3; i++)
		lv[i]->in_flight--;
	grant_waiters(c);
	pthread_mutex_unlock(&c->mu);
}

static void
export_stats(const struct cstats *s, allot_conc_stats *ret)
{
	ret->in_flight = s->in_flight;
	ret->max_in_flight = s->max_in_flight;
	ret->queued = s->queued;
	ret->acquired = s->acquired;
	ret->rejected_full = s->rejected_full;
	ret->rejected_age = s->rejected_age;
	ret->max_queue_age_ms = (s->max_age_ns + 999999u) / 1000000u;
}

int
allot_conc_caller_stats(allot_conc *conc, uint32_t caller,
    allot_conc_lane lane, allot_conc_stats *ret)
{
	if (conc == NULL || ret == NULL || caller >= conc->o.max_callers ||
	    (unsigned) lane >= ALLOT_CONC_LANES)
		return ALLOT_EINVAL;
	pthread_mutex_lock(&conc->mu);
	export_stats(caller_stats(conc, caller, (uint32_t) lane), ret);
	pthread_mutex_unlock(&conc->mu);
	return ALLOT_OK;
}

int
allot_conc_lane_stats(
    allot_conc *conc, allot_conc_lane lane, allot_conc_stats *ret)
{
	if (conc == NULL || ret == NULL || (unsigned) lane >= ALLOT_CONC_LANES)
		return ALLOT_EINVAL;
	pthread_mutex_lock(&conc->mu);
	export_stats(&conc->lane[lane], ret);
	pthread_mutex_unlock(&conc->mu);
	return ALLOT_OK;
}

int
allot_conc_total_stats(allot_conc *conc, allot_conc_stats *ret)
{
	if (conc == NULL || ret == NULL)
		return ALLOT_EINVAL;
	pthread_mutex_lock(&conc->mu);
	export_stats(&conc->total, ret);
	pthread_mutex_unlock(&conc->mu);
	return ALLOT_OK;
}
