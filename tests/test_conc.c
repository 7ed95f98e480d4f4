/* SPDX-License-Identifier: MIT */
/*
 * Tests of the concurrency limiter (allot/conc.h) with real threads: the
 * per-caller, per-lane and global bounds are never exceeded under
 * contention (checked by counters kept outside the limiter), interactive
 * work keeps its reserved capacity while bulk is saturated, waiters are
 * rejected once they reach the maximum age and no later, queues are
 * bounded and served first come first served, and the statistics report
 * what happened. Timing assertions leave room for sanitizer builds.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include <allot/conc.h>

#include "proc.h"
#include "runner.h"

/* Slack on timing bounds: generous for loaded CI hosts and TSan. */
#define SLACK_MS 150

static void
sleep_us(long us)
{
	struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };
	nanosleep(&ts, NULL);
}

static allot_conc *
conc_new(const allot_conc_options *o)
{
	allot_conc *c = NULL;
	ck_assert_int_eq(allot_conc_create(o, &c), ALLOT_OK);
	return c;
}

/* Wait until `lane` has at least `n` waiters (the threads under test have
 * reached the queue). */
static void
wait_queued(allot_conc *c, allot_conc_lane lane, uint32_t n)
{
	allot_conc_stats st;
	uint64_t t0 = pc_now_ms();
	for (;;) {
		ck_assert_int_eq(
		    allot_conc_lane_stats(c, lane, &st), ALLOT_OK);
		if (st.queued >= n)
			return;
		ck_assert_msg(pc_now_ms() - t0 < 10000,
		    "queue stuck at %u of %u", st.queued, n);
		sleep_us(500);
	}
}

/* ------------------------------------------------------------------ */
/* Basics                                                              */
/* ------------------------------------------------------------------ */

START_TEST(options_validation)
{
	allot_conc_options o;
	allot_conc *c = NULL;

	allot_conc_options_init(&o);
	ck_assert_uint_eq(o.global_max, 64);
	o.global_max = 1;
	ck_assert_int_eq(allot_conc_create(&o, &c), ALLOT_EINVAL);
	allot_conc_options_init(&o);
	o.lane_max[ALLOT_LANE_BULK] = o.global_max; /* nothing reserved */
	ck_assert_int_eq(allot_conc_create(&o, &c), ALLOT_EINVAL);
	allot_conc_options_init(&o);
	o.lane_max[ALLOT_LANE_INTERACTIVE] = o.global_max + 1;
	ck_assert_int_eq(allot_conc_create(&o, &c), ALLOT_EINVAL);
	allot_conc_options_init(&o);
	o.caller_max[ALLOT_LANE_BULK] = 0;
	ck_assert_int_eq(allot_conc_create(&o, &c), ALLOT_EINVAL);
	allot_conc_options_init(&o);
	o.max_callers = 0;
	ck_assert_int_eq(allot_conc_create(&o, &c), ALLOT_EINVAL);
	ck_assert_ptr_null(c);
	ck_assert_int_eq(allot_conc_create(NULL, NULL), ALLOT_EINVAL);
	c = conc_new(NULL);
	allot_conc_destroy(c);
	allot_conc_destroy(NULL);
}
END_TEST

START_TEST(caller_names)
{
	allot_conc_options o;
	allot_conc *c;
	uint32_t a, b, a2, d, x;
	char longname[ALLOT_IDENTITY_MAX + 2];

	allot_conc_options_init(&o);
	o.max_callers = 4; /* the default slot and three names */
	c = conc_new(&o);
	ck_assert_int_eq(allot_conc_caller(c, "spiffe://t/a", &a), ALLOT_OK);
	ck_assert_int_eq(allot_conc_caller(c, "spiffe://t/b", &b), ALLOT_OK);
	ck_assert_int_eq(allot_conc_caller(c, "spiffe://t/a", &a2), ALLOT_OK);
	ck_assert_uint_eq(a, a2);
	ck_assert_uint_ne(a, b);
	ck_assert_uint_ne(a, ALLOT_CONC_DEFAULT_CALLER);
	ck_assert_uint_lt(b, 4);
	ck_assert_int_eq(allot_conc_caller(c, NULL, &d), ALLOT_OK);
	ck_assert_uint_eq(d, ALLOT_CONC_DEFAULT_CALLER);
	ck_assert_int_eq(allot_conc_caller(c, "", &d), ALLOT_OK);
	ck_assert_uint_eq(d, ALLOT_CONC_DEFAULT_CALLER);
	ck_assert_int_eq(allot_conc_caller(c, "spiffe://t/c", &x), ALLOT_OK);
	ck_assert_uint_ne(x, ALLOT_CONC_DEFAULT_CALLER);
	/* Table full: new names share the default slot; old ones keep
	 * theirs. */
	ck_assert_int_eq(allot_conc_caller(c, "spiffe://t/d", &x), ALLOT_OK);
	ck_assert_uint_eq(x, ALLOT_CONC_DEFAULT_CALLER);
	ck_assert_int_eq(allot_conc_caller(c, "spiffe://t/b", &x), ALLOT_OK);
	ck_assert_uint_eq(x, b);
	memset(longname, 'x', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = '\0';
	x = 77;
	ck_assert_int_eq(allot_conc_caller(c, longname, &x), ALLOT_EINVAL);
	ck_assert_uint_eq(x, 77);
	allot_conc_destroy(c);
}
END_TEST

START_TEST(try_acquire_limits)
{
	allot_conc_options o;
	allot_conc *c;
	allot_conc_permit p[8], q;
	allot_conc_stats st;

	allot_conc_options_init(&o);
	o.max_callers = 8;
	o.global_max = 4;
	o.caller_max[ALLOT_LANE_INTERACTIVE] = 2;
	c = conc_new(&o);

	/* Caller bound. */
	ck_assert_int_eq(
	    allot_conc_try_acquire(c, 1, ALLOT_LANE_INTERACTIVE, &p[0]),
	    ALLOT_OK);
	ck_assert_int_eq(
	    allot_conc_try_acquire(c, 1, ALLOT_LANE_INTERACTIVE, &p[1]),
	    ALLOT_OK);
	memset(&q, 0xa5, sizeof(q));
	ck_assert_int_eq(
	    allot_conc_try_acquire(c, 1, ALLOT_LANE_INTERACTIVE, &q),
	    ALLOT_EBUSY);
	ck_assert_ptr_eq(q.conc, (void *) (uintptr_t) 0xa5a5a5a5a5a5a5a5ull);
	/* Global bound. */
	ck_assert_int_eq(
	    allot_conc_try_acquire(c, 2, ALLOT_LANE_INTERACTIVE, &p[2]),
	    ALLOT_OK);
	ck_assert_int_eq(
	    allot_conc_try_acquire(c, 3, ALLOT_LANE_INTERACTIVE, &p[3]),
	    ALLOT_OK);
	ck_assert_int_eq(
	    allot_conc_try_acquire(c, 4, ALLOT_LANE_INTERACTIVE, &q),
	    ALLOT_EBUSY);
	/* acquire with timeout 0 is the try variant. */
	ck_assert_int_eq(
	    allot_conc_acquire(c, 4, ALLOT_LANE_INTERACTIVE, 0, &q),
	    ALLOT_EBUSY);

	ck_assert_int_eq(allot_conc_total_stats(c, &st), ALLOT_OK);
	ck_assert_uint_eq(st.in_flight, 4);
	ck_assert_uint_eq(st.acquired, 4);
	ck_assert_uint_eq(st.rejected_full, 3);
	ck_assert_int_eq(
	    allot_conc_caller_stats(c, 1, ALLOT_LANE_INTERACTIVE, &st),
	    ALLOT_OK);
	ck_assert_uint_eq(st.in_flight, 2);
	ck_assert_uint_eq(st.rejected_full, 1);
	ck_assert_int_eq(
	    allot_conc_caller_stats(c, 4, ALLOT_LANE_INTERACTIVE, &st),
	    ALLOT_OK);
	ck_assert_uint_eq(st.rejected_full, 2);
	ck_assert_uint_eq(st.acquired, 0);

	/* Release frees exactly one permit; a second release is a no-op. */
	allot_conc_release(&p[3]);
	ck_assert_ptr_null(p[3].conc);
	allot_conc_release(&p[3]);
	allot_conc_release(NULL);
	ck_assert_int_eq(allot_conc_total_stats(c, &st), ALLOT_OK);
	ck_assert_uint_eq(st.in_flight, 3);
	ck_assert_uint_eq(st.max_in_flight, 4);
	ck_assert_int_eq(
	    allot_conc_try_acquire(c, 4, ALLOT_LANE_INTERACTIVE, &p[3]),
	    ALLOT_OK);
	ck_assert_int_eq(
	    allot_conc_try_acquire(c, 5, ALLOT_LANE_INTERACTIVE, &q),
	    ALLOT_EBUSY);

	/* Misuse. */
	ck_assert_int_eq(
	    allot_conc_try_acquire(c, 8, ALLOT_LANE_INTERACTIVE, &q),
	    ALLOT_EINVAL);
	ck_assert_int_eq(allot_conc_try_acquire(c, 1, (allot_conc_lane) 2, &q),
	    ALLOT_EINVAL);
	ck_assert_int_eq(
	    allot_conc_try_acquire(c, 1, ALLOT_LANE_BULK, NULL), ALLOT_EINVAL);
	ck_assert_int_eq(
	    allot_conc_caller_stats(c, 8, ALLOT_LANE_BULK, &st), ALLOT_EINVAL);

	for (int i = 0; i < 4; i++)
		allot_conc_release(&p[i]);
	ck_assert_int_eq(allot_conc_total_stats(c, &st), ALLOT_OK);
	ck_assert_uint_eq(st.in_flight, 0);
	allot_conc_destroy(c);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Bounds under contention                                             */
/* ------------------------------------------------------------------ */

#define NCALLERS 4
#define NTHREADS 16

struct shared {
	allot_conc *c;
	_Atomic int total;
	_Atomic int max_total;
	_Atomic int lane[ALLOT_CONC_LANES];
	_Atomic int max_lane[ALLOT_CONC_LANES];
	_Atomic int caller[NCALLERS][ALLOT_CONC_LANES];
	_Atomic int max_caller[NCALLERS][ALLOT_CONC_LANES];
	_Atomic uint64_t ok;
	_Atomic uint64_t rejected;
	int iterations;
	pthread_barrier_t start;
};

static void
raise_max(_Atomic int *max, int v)
{
	int m = atomic_load(max);
	while (v > m && !atomic_compare_exchange_weak(max, &m, v))
		;
}

struct worker {
	struct shared *sh;
	uint32_t caller;
	allot_conc_lane lane;
};

static void *
bounds_worker(void *p)
{
	struct worker *w = p;
	struct shared *sh = w->sh;
	unsigned seed = w->caller * 31 + (unsigned) w->lane;

	pthread_barrier_wait(&sh->start);
	for (int i = 0; i < sh->iterations; i++) {
		allot_conc_permit permit;
		int rc = allot_conc_acquire(
		    sh->c, w->caller, w->lane, ALLOT_CONC_WAIT_MAX, &permit);
		if (rc != ALLOT_OK) {
			atomic_fetch_add(&sh->rejected, 1);
			continue;
		}
		raise_max(&sh->max_total, atomic_fetch_add(&sh->total, 1) + 1);
		raise_max(&sh->max_lane[w->lane],
		    atomic_fetch_add(&sh->lane[w->lane], 1) + 1);
		raise_max(&sh->max_caller[w->caller][w->lane],
		    atomic_fetch_add(&sh->caller[w->caller][w->lane], 1) + 1);
		seed = seed * 1103515245u + 12345u;
		sleep_us(20 + (long) (seed >> 16) % 200);
		atomic_fetch_sub(&sh->caller[w->caller][w->lane], 1);
		atomic_fetch_sub(&sh->lane[w->lane], 1);
		atomic_fetch_sub(&sh->total, 1);
		allot_conc_release(&permit);
		atomic_fetch_add(&sh->ok, 1);
	}
	return NULL;
}

START_TEST(bounds_under_threads)
{
	allot_conc_options o;
	struct shared sh;
	pthread_t th[NTHREADS];
	struct worker w[NTHREADS];
	allot_conc_stats st;

	allot_conc_options_init(&o);
	o.max_callers = NCALLERS;
	o.global_max = 6;
	o.lane_max[ALLOT_LANE_BULK] = 3;
	o.caller_max[ALLOT_LANE_INTERACTIVE] = 2;
	o.caller_max[ALLOT_LANE_BULK] = 1;
	o.max_wait_ms[ALLOT_LANE_INTERACTIVE] = 20000;
	o.max_wait_ms[ALLOT_LANE_BULK] = 20000;
	memset(&sh, 0, sizeof(sh));
	sh.c = conc_new(&o);
	sh.iterations = 300;
	pthread_barrier_init(&sh.start, NULL, NTHREADS);

	/* Four callers, each with three interactive and one bulk thread:
	 * demand (16) well over every bound. */
	for (int i = 0; i < NTHREADS; i++) {
		w[i].sh = &sh;
		w[i].caller = (uint32_t) (i % NCALLERS);
		w[i].lane = i / NCALLERS == 3 ? ALLOT_LANE_BULK :
		                                ALLOT_LANE_INTERACTIVE;
		ck_assert_int_eq(
		    pthread_create(&th[i], NULL, bounds_worker, &w[i]), 0);
	}
	for (int i = 0; i < NTHREADS; i++)
		pthread_join(th[i], NULL);

	ck_assert_uint_eq(atomic_load(&sh.rejected), 0);
	ck_assert_uint_eq(atomic_load(&sh.ok), NTHREADS * 300);
	ck_assert_int_le(atomic_load(&sh.max_total), 6);
	ck_assert_int_le(atomic_load(&sh.max_lane[ALLOT_LANE_BULK]), 3);
	for (int i = 0; i < NCALLERS; i++) {
		ck_assert_int_le(
		    atomic_load(&sh.max_caller[i][ALLOT_LANE_INTERACTIVE]), 2);
		ck_assert_int_le(
		    atomic_load(&sh.max_caller[i][ALLOT_LANE_BULK]), 1);
	}
	/* The limiter admitted concurrency, not one at a time. */
	ck_assert_int_ge(atomic_load(&sh.max_total), 4);
	pthread_barrier_destroy(&sh.start);

	/* Its own accounting agrees. */
	ck_assert_int_eq(allot_conc_total_stats(sh.c, &st), ALLOT_OK);
	ck_assert_uint_eq(st.in_flight, 0);
	ck_assert_uint_eq(st.queued, 0);
	ck_assert_uint_le(st.max_in_flight, 6);
	ck_assert_uint_ge(
	    st.max_in_flight, (uint32_t) atomic_load(&sh.max_total));
	ck_assert_uint_eq(st.acquired, NTHREADS * 300);
	ck_assert_uint_eq(st.rejected_full + st.rejected_age, 0);
	ck_assert_uint_gt(st.max_queue_age_ms, 0); /* demand did queue */
	ck_assert_int_eq(
	    allot_conc_lane_stats(sh.c, ALLOT_LANE_BULK, &st), ALLOT_OK);
	ck_assert_uint_le(st.max_in_flight, 3);
	ck_assert_uint_eq(st.acquired, NCALLERS * 300);
	for (uint32_t i = 0; i < NCALLERS; i++) {
		ck_assert_int_eq(allot_conc_caller_stats(
		                     sh.c, i, ALLOT_LANE_INTERACTIVE, &st),
		    ALLOT_OK);
		ck_assert_uint_le(st.max_in_flight, 2);
		ck_assert_uint_eq(st.acquired, 3 * 300);
	}
	allot_conc_destroy(sh.c);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Lanes                                                               */
/* ------------------------------------------------------------------ */

struct bulk_arg {
	allot_conc *c;
	_Atomic bool stop;
	_Atomic uint64_t done;
};

static void *
bulk_hog(void *p)
{
	struct bulk_arg *a = p;
	uint32_t caller = 1;
	while (!atomic_load(&a->stop)) {
		allot_conc_permit permit;
		if (allot_conc_acquire(a->c, caller, ALLOT_LANE_BULK,
		        ALLOT_CONC_WAIT_MAX, &permit) == ALLOT_OK) {
			sleep_us(2000); /* a slow export */
			allot_conc_release(&permit);
			atomic_fetch_add(&a->done, 1);
		}
		caller = caller % 7 + 1;
	}
	return NULL;
}

START_TEST(interactive_survives_bulk_saturation)
{
	allot_conc_options o;
	struct bulk_arg a;
	pthread_t th[12];
	allot_conc_stats st;

	allot_conc_options_init(&o);
	o.max_callers = 16;
	o.global_max = 8; /* bulk may hold 4; 4 are interactive's */
	o.caller_max[ALLOT_LANE_BULK] = 8;
	o.caller_queue_max[ALLOT_LANE_BULK] = 64;
	o.max_wait_ms[ALLOT_LANE_INTERACTIVE] = 50;
	memset(&a, 0, sizeof(a));
	a.c = conc_new(&o);

	/* Twelve threads of slow bulk work: the bulk lane is full and its
	 * queue busy for the whole test. */
	for (int i = 0; i < 12; i++)
		ck_assert_int_eq(
		    pthread_create(&th[i], NULL, bulk_hog, &a), 0);
	wait_queued(a.c, ALLOT_LANE_BULK, 8);

	/* Interactive requests get permits at once, every time, up to the
	 * four reserved for them, although the bulk queue is never empty. */
	for (int round = 0; round < 200; round++) {
		allot_conc_permit p[4];
		for (int i = 0; i < 4; i++)
			ck_assert_int_eq(
			    allot_conc_try_acquire(a.c, (uint32_t) (9 + i),
			        ALLOT_LANE_INTERACTIVE, &p[i]),
			    ALLOT_OK);
		for (int i = 0; i < 4; i++)
			allot_conc_release(&p[i]);
	}
	/* Bulk never exceeded its share, even with global room left. */
	ck_assert_int_eq(
	    allot_conc_lane_stats(a.c, ALLOT_LANE_BULK, &st), ALLOT_OK);
	ck_assert_uint_eq(st.max_in_flight, 4);
	ck_assert_uint_gt(st.queued, 0);

	atomic_store(&a.stop, true);
	for (int i = 0; i < 12; i++)
		pthread_join(th[i], NULL);
	ck_assert_uint_gt(atomic_load(&a.done), 0);
	ck_assert_int_eq(
	    allot_conc_lane_stats(a.c, ALLOT_LANE_INTERACTIVE, &st), ALLOT_OK);
	ck_assert_uint_eq(st.acquired, 800);
	ck_assert_uint_eq(st.rejected_full + st.rejected_age, 0);
	allot_conc_destroy(a.c);
}
END_TEST

START_TEST(bulk_cannot_take_reserve)
{
	allot_conc_options o;
	allot_conc *c;
	allot_conc_permit b[4], i1[8], x;

	allot_conc_options_init(&o);
	o.max_callers = 16;
	o.global_max = 8;
	o.caller_max[ALLOT_LANE_BULK] = 8;
	o.caller_max[ALLOT_LANE_INTERACTIVE] = 8;
	c = conc_new(&o);
	/* Bulk stops at half the global bound with the other half idle. */
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(
		    allot_conc_try_acquire(c, 1, ALLOT_LANE_BULK, &b[i]),
		    ALLOT_OK);
	ck_assert_int_eq(
	    allot_conc_try_acquire(c, 2, ALLOT_LANE_BULK, &x), ALLOT_EBUSY);
	/* Interactive gets the rest. */
	for (int i = 0; i < 4; i++)
		ck_assert_int_eq(allot_conc_try_acquire(
		                     c, 3, ALLOT_LANE_INTERACTIVE, &i1[i]),
		    ALLOT_OK);
	ck_assert_int_eq(
	    allot_conc_try_acquire(c, 3, ALLOT_LANE_INTERACTIVE, &x),
	    ALLOT_EBUSY);
	for (int i = 0; i < 4; i++) {
		allot_conc_release(&b[i]);
		allot_conc_release(&i1[i]);
	}
	/* Interactive may use all of the global bound; bulk then waits. */
	for (int i = 0; i < 8; i++)
		ck_assert_int_eq(allot_conc_try_acquire(
		                     c, 3, ALLOT_LANE_INTERACTIVE, &i1[i]),
		    ALLOT_OK);
	ck_assert_int_eq(
	    allot_conc_try_acquire(c, 1, ALLOT_LANE_BULK, &x), ALLOT_EBUSY);
	for (int i = 0; i < 8; i++)
		allot_conc_release(&i1[i]);
	allot_conc_destroy(c);
}
END_TEST

/* ------------------------------------------------------------------ */
/* Queue: age, length, order                                           */
/* ------------------------------------------------------------------ */

struct waiter_arg {
	allot_conc *c;
	uint32_t caller;
	allot_conc_lane lane;
	uint32_t timeout_ms;
	int rc;
	uint64_t waited_ms;
	int id;
	_Atomic int *order; /* arrival order of grants, -1: none yet */
	_Atomic int *pos;
	bool hold_until_released; /* keep the permit until `go` */
	_Atomic bool *go;
};

static void *
waiter_thread(void *p)
{
	struct waiter_arg *a = p;
	allot_conc_permit permit;
	uint64_t t0 = pc_now_ms();

	a->rc = allot_conc_acquire(
	    a->c, a->caller, a->lane, a->timeout_ms, &permit);
	a->waited_ms = pc_now_ms() - t0;
	if (a->rc == ALLOT_OK) {
		if (a->order != NULL)
			atomic_store(
			    &a->order[atomic_fetch_add(a->pos, 1)], a->id);
		while (a->hold_until_released && !atomic_load(a->go))
			sleep_us(200);
		allot_conc_release(&permit);
	}
	return NULL;
}

START_TEST(queue_age_bound)
{
	allot_conc_options o;
	allot_conc *c;
	allot_conc_permit held[4];
	allot_conc_stats st;
	pthread_t th[6];
	struct waiter_arg w[6];

	allot_conc_options_init(&o);
	o.max_callers = 16;
	o.global_max = 4;
	o.caller_max[ALLOT_LANE_BULK] = 4;
	o.max_wait_ms[ALLOT_LANE_BULK] = 100;
	c = conc_new(&o);
	/* Fill the bulk lane (2 permits) and keep it full. */
	ck_assert_int_eq(
	    allot_conc_try_acquire(c, 1, ALLOT_LANE_BULK, &held[0]), ALLOT_OK);
	ck_assert_int_eq(
	    allot_conc_try_acquire(c, 1, ALLOT_LANE_BULK, &held[1]), ALLOT_OK);

	/* Six waiters asking for up to an hour: the lane's 100 ms wins. */
	memset(w, 0, sizeof(w));
	for (int i = 0; i < 6; i++) {
		w[i].c = c;
		w[i].caller = (uint32_t) (2 + i);
		w[i].lane = ALLOT_LANE_BULK;
		w[i].timeout_ms = 3600000;
		ck_assert_int_eq(
		    pthread_create(&th[i], NULL, waiter_thread, &w[i]), 0);
	}
	for (int i = 0; i < 6; i++) {
		pthread_join(th[i], NULL);
		ck_assert_int_eq(w[i].rc, ALLOT_ETIMEDOUT);
		ck_assert_uint_ge(w[i].waited_ms, 99);
		ck_assert_uint_le(w[i].waited_ms, 100 + SLACK_MS);
	}
	ck_assert_int_eq(
	    allot_conc_lane_stats(c, ALLOT_LANE_BULK, &st), ALLOT_OK);
	ck_assert_uint_eq(st.rejected_age, 6);
	ck_assert_uint_eq(st.queued, 0);
	ck_assert_uint_ge(st.max_queue_age_ms, 100);
	ck_assert_uint_le(st.max_queue_age_ms, 100 + SLACK_MS);
	ck_assert_int_eq(
	    allot_conc_caller_stats(c, 2, ALLOT_LANE_BULK, &st), ALLOT_OK);
	ck_assert_uint_eq(st.rejected_age, 1);

	/* A caller's own timeout, shorter than the lane's, is honoured. */
	allot_conc_permit x;
	uint64_t t0 = pc_now_ms();
	ck_assert_int_eq(allot_conc_acquire(c, 3, ALLOT_LANE_BULK, 30, &x),
	    ALLOT_ETIMEDOUT);
	uint64_t el = pc_now_ms() - t0;
	ck_assert_uint_ge(el, 29);
	ck_assert_uint_le(el, 30 + SLACK_MS);

	/* The interactive lane's shorter age applies to it. */
	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(allot_conc_try_acquire(c, 9,
		                     ALLOT_LANE_INTERACTIVE, &held[2 + i]),
		    ALLOT_OK);
	t0 = pc_now_ms();
	ck_assert_int_eq(allot_conc_acquire(c, 10, ALLOT_LANE_INTERACTIVE,
	                     ALLOT_CONC_WAIT_MAX, &x),
	    ALLOT_ETIMEDOUT);
	el = pc_now_ms() - t0;
	ck_assert_uint_ge(el, 99);
	ck_assert_uint_le(el, 100 + SLACK_MS);

	/* A waiter that gets a permit in time is not rejected. */
	w[0].timeout_ms = ALLOT_CONC_WAIT_MAX;
	w[0].caller = 4;
	ck_assert_int_eq(
	    pthread_create(&th[0], NULL, waiter_thread, &w[0]), 0);
	wait_queued(c, ALLOT_LANE_BULK, 1);
	allot_conc_release(&held[0]);
	pthread_join(th[0], NULL);
	ck_assert_int_eq(w[0].rc, ALLOT_OK);
	ck_assert_uint_lt(w[0].waited_ms, 100);

	allot_conc_release(&held[1]);
	allot_conc_release(&held[2]);
	allot_conc_release(&held[3]);
	allot_conc_destroy(c);
}
END_TEST

START_TEST(queue_length_bound)
{
	allot_conc_options o;
	allot_conc *c;
	allot_conc_permit held, x;
	allot_conc_stats st;
	pthread_t th[3];
	struct waiter_arg w[3];

	allot_conc_options_init(&o);
	o.max_callers = 16;
	o.global_max = 2; /* bulk: one permit */
	o.queue_max[ALLOT_LANE_BULK] = 3;
	o.caller_queue_max[ALLOT_LANE_BULK] = 2;
	o.max_wait_ms[ALLOT_LANE_BULK] = 5000;
	c = conc_new(&o);
	ck_assert_int_eq(
	    allot_conc_try_acquire(c, 1, ALLOT_LANE_BULK, &held), ALLOT_OK);

	/* Caller 2 queues twice; its third try is refused at once while
	 * caller 3 may still queue. */
	memset(w, 0, sizeof(w));
	uint32_t callers[3] = { 2, 2, 3 };
	for (int i = 0; i < 3; i++) {
		w[i].c = c;
		w[i].caller = callers[i];
		w[i].lane = ALLOT_LANE_BULK;
		w[i].timeout_ms = ALLOT_CONC_WAIT_MAX;
		ck_assert_int_eq(
		    pthread_create(&th[i], NULL, waiter_thread, &w[i]), 0);
		wait_queued(c, ALLOT_LANE_BULK, (uint32_t) i + 1);
		if (i == 1)
			ck_assert_int_eq(
			    allot_conc_acquire(c, 2, ALLOT_LANE_BULK,
			        ALLOT_CONC_WAIT_MAX, &x),
			    ALLOT_EBUSY);
	}
	/* The lane's queue is full: anyone is refused, without waiting. */
	uint64_t t0 = pc_now_ms();
	ck_assert_int_eq(
	    allot_conc_acquire(c, 4, ALLOT_LANE_BULK, ALLOT_CONC_WAIT_MAX, &x),
	    ALLOT_EBUSY);
	ck_assert_uint_lt(pc_now_ms() - t0, 50);
	ck_assert_int_eq(
	    allot_conc_caller_stats(c, 2, ALLOT_LANE_BULK, &st), ALLOT_OK);
	ck_assert_uint_eq(st.queued, 2);
	ck_assert_uint_eq(st.rejected_full, 1);
	ck_assert_int_eq(
	    allot_conc_lane_stats(c, ALLOT_LANE_BULK, &st), ALLOT_OK);
	ck_assert_uint_eq(st.queued, 3);
	ck_assert_uint_eq(st.rejected_full, 2);

	allot_conc_release(&held);
	for (int i = 0; i < 3; i++) {
		pthread_join(th[i], NULL);
		ck_assert_int_eq(w[i].rc, ALLOT_OK);
	}
	ck_assert_int_eq(
	    allot_conc_lane_stats(c, ALLOT_LANE_BULK, &st), ALLOT_OK);
	ck_assert_uint_eq(st.queued, 0);
	ck_assert_uint_eq(st.in_flight, 0);
	ck_assert_uint_eq(st.acquired, 4);
	allot_conc_destroy(c);
}
END_TEST

START_TEST(caller_queue_share)
{
	allot_conc_options o;
	allot_conc *c;
	allot_conc_permit held, x;
	pthread_t th[2];
	struct waiter_arg w[2];

	allot_conc_options_init(&o);
	o.max_callers = 16;
	o.global_max = 2;
	o.caller_queue_max[ALLOT_LANE_BULK] = 1;
	o.max_wait_ms[ALLOT_LANE_BULK] = 5000;
	c = conc_new(&o);
	ck_assert_int_eq(
	    allot_conc_try_acquire(c, 1, ALLOT_LANE_BULK, &held), ALLOT_OK);
	memset(w, 0, sizeof(w));
	w[0].c = c;
	w[0].caller = 5;
	w[0].lane = ALLOT_LANE_BULK;
	w[0].timeout_ms = ALLOT_CONC_WAIT_MAX;
	ck_assert_int_eq(
	    pthread_create(&th[0], NULL, waiter_thread, &w[0]), 0);
	wait_queued(c, ALLOT_LANE_BULK, 1);
	/* A large caller cannot fill the queue ... */
	ck_assert_int_eq(
	    allot_conc_acquire(c, 5, ALLOT_LANE_BULK, 1000, &x), ALLOT_EBUSY);
	/* ... before a smaller one gets a place in it. */
	w[1] = w[0];
	w[1].caller = 6;
	ck_assert_int_eq(
	    pthread_create(&th[1], NULL, waiter_thread, &w[1]), 0);
	wait_queued(c, ALLOT_LANE_BULK, 2);
	allot_conc_release(&held);
	for (int i = 0; i < 2; i++) {
		pthread_join(th[i], NULL);
		ck_assert_int_eq(w[i].rc, ALLOT_OK);
	}
	allot_conc_destroy(c);
}
END_TEST

START_TEST(fifo_order)
{
	enum { N = 8 };
	allot_conc_options o;
	allot_conc *c;
	allot_conc_permit held;
	pthread_t th[N];
	struct waiter_arg w[N];
	_Atomic int order[N];
	_Atomic int pos = 0;

	allot_conc_options_init(&o);
	o.max_callers = 16;
	o.global_max = 2; /* bulk: one permit, so grants are serial */
	o.max_wait_ms[ALLOT_LANE_BULK] = 10000;
	o.caller_queue_max[ALLOT_LANE_BULK] = N;
	c = conc_new(&o);
	ck_assert_int_eq(
	    allot_conc_try_acquire(c, 1, ALLOT_LANE_BULK, &held), ALLOT_OK);

	/* Enqueue in a known order, alternating callers. */
	memset(w, 0, sizeof(w));
	for (int i = 0; i < N; i++) {
		w[i].c = c;
		w[i].caller = (uint32_t) (2 + i % 3);
		w[i].lane = ALLOT_LANE_BULK;
		w[i].timeout_ms = ALLOT_CONC_WAIT_MAX;
		w[i].id = i;
		w[i].order = order;
		w[i].pos = &pos;
		ck_assert_int_eq(
		    pthread_create(&th[i], NULL, waiter_thread, &w[i]), 0);
		wait_queued(c, ALLOT_LANE_BULK, (uint32_t) i + 1);
	}
	/* An arrival now must not overtake them. */
	allot_conc_permit x;
	ck_assert_int_eq(
	    allot_conc_try_acquire(c, 9, ALLOT_LANE_BULK, &x), ALLOT_EBUSY);
	allot_conc_release(&held);
	for (int i = 0; i < N; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < N; i++) {
		ck_assert_int_eq(w[i].rc, ALLOT_OK);
		ck_assert_int_eq(atomic_load(&order[i]), i);
	}
	allot_conc_destroy(c);
}
END_TEST

START_TEST(blocked_caller_does_not_block_others)
{
	allot_conc_options o;
	allot_conc *c;
	allot_conc_permit a, b, d;
	pthread_t th[2];
	struct waiter_arg w[2];
	allot_conc_stats st;

	allot_conc_options_init(&o);
	o.max_callers = 16;
	o.global_max = 4;
	o.lane_max[ALLOT_LANE_INTERACTIVE] = 3;
	o.caller_max[ALLOT_LANE_INTERACTIVE] = 1;
	o.max_wait_ms[ALLOT_LANE_INTERACTIVE] = 10000;
	c = conc_new(&o);
	/* Callers 1, 2 and 3 fill the interactive lane. */
	ck_assert_int_eq(
	    allot_conc_try_acquire(c, 1, ALLOT_LANE_INTERACTIVE, &a),
	    ALLOT_OK);
	ck_assert_int_eq(
	    allot_conc_try_acquire(c, 2, ALLOT_LANE_INTERACTIVE, &b),
	    ALLOT_OK);
	ck_assert_int_eq(
	    allot_conc_try_acquire(c, 3, ALLOT_LANE_INTERACTIVE, &d),
	    ALLOT_OK);
	/* First in line: caller 1 again (at its own limit); then caller 4. */
	memset(w, 0, sizeof(w));
	for (int i = 0; i < 2; i++) {
		w[i].c = c;
		w[i].caller = i == 0 ? 1 : 4;
		w[i].lane = ALLOT_LANE_INTERACTIVE;
		w[i].timeout_ms = ALLOT_CONC_WAIT_MAX;
		ck_assert_int_eq(
		    pthread_create(&th[i], NULL, waiter_thread, &w[i]), 0);
		wait_queued(c, ALLOT_LANE_INTERACTIVE, (uint32_t) i + 1);
	}
	/* Caller 3 finishes: the permit goes to caller 4, since caller 1
	 * may not run two. (Caller 4 then releases it at once; caller 1 is
	 * still at its limit, so its waiter stays queued.) */
	allot_conc_release(&d);
	pthread_join(th[1], NULL);
	ck_assert_int_eq(w[1].rc, ALLOT_OK);
	ck_assert_int_eq(
	    allot_conc_caller_stats(c, 1, ALLOT_LANE_INTERACTIVE, &st),
	    ALLOT_OK);
	ck_assert_uint_eq(st.queued, 1);
	ck_assert_uint_eq(st.in_flight, 1);
	/* Caller 1 finishes its first: its waiter runs. */
	allot_conc_release(&a);
	pthread_join(th[0], NULL);
	ck_assert_int_eq(w[0].rc, ALLOT_OK);
	allot_conc_release(&b);
	ck_assert_int_eq(allot_conc_total_stats(c, &st), ALLOT_OK);
	ck_assert_uint_eq(st.in_flight, 0);
	ck_assert_uint_eq(st.acquired, 5);
	allot_conc_destroy(c);
}
END_TEST

START_TEST(interactive_served_first)
{
	allot_conc_options o;
	allot_conc *c;
	allot_conc_permit held[4];
	pthread_t th[2];
	struct waiter_arg w[2];
	_Atomic int order[2] = { -1, -1 };
	_Atomic int pos = 0;
	_Atomic bool go = false;
	allot_conc_stats st;

	allot_conc_options_init(&o);
	o.max_callers = 16;
	o.global_max = 4;
	o.lane_max[ALLOT_LANE_BULK] = 2;
	o.caller_max[ALLOT_LANE_INTERACTIVE] = 4;
	o.caller_max[ALLOT_LANE_BULK] = 4;
	o.max_wait_ms[ALLOT_LANE_INTERACTIVE] = 10000;
	o.max_wait_ms[ALLOT_LANE_BULK] = 10000;
	c = conc_new(&o);
	/* One bulk permit held, three interactive: global full, bulk lane
	 * has room. */
	ck_assert_int_eq(
	    allot_conc_try_acquire(c, 1, ALLOT_LANE_BULK, &held[0]), ALLOT_OK);
	for (int i = 1; i < 4; i++)
		ck_assert_int_eq(allot_conc_try_acquire(
		                     c, 2, ALLOT_LANE_INTERACTIVE, &held[i]),
		    ALLOT_OK);
	/* A bulk waiter arrives first, an interactive one second. */
	memset(w, 0, sizeof(w));
	for (int i = 0; i < 2; i++) {
		w[i].c = c;
		w[i].caller = 3;
		w[i].lane = i == 0 ? ALLOT_LANE_BULK : ALLOT_LANE_INTERACTIVE;
		w[i].timeout_ms = ALLOT_CONC_WAIT_MAX;
		w[i].id = i;
		w[i].order = order;
		w[i].pos = &pos;
		w[i].hold_until_released = true;
		w[i].go = &go;
		ck_assert_int_eq(
		    pthread_create(&th[i], NULL, waiter_thread, &w[i]), 0);
		wait_queued(c, w[i].lane, 1);
	}
	/* The first freed permit, although a bulk one and although the bulk
	 * lane has room, goes to the interactive waiter. */
	allot_conc_release(&held[0]);
	for (uint64_t t0 = pc_now_ms(); atomic_load(&order[0]) == -1;) {
		ck_assert_uint_lt(pc_now_ms() - t0, 10000);
		sleep_us(200);
	}
	ck_assert_int_eq(atomic_load(&order[0]), 1);
	ck_assert_int_eq(
	    allot_conc_lane_stats(c, ALLOT_LANE_BULK, &st), ALLOT_OK);
	ck_assert_uint_eq(st.queued, 1);
	atomic_store(&go, true);
	allot_conc_release(&held[1]);
	pthread_join(th[0], NULL);
	pthread_join(th[1], NULL);
	ck_assert_int_eq(atomic_load(&pos), 2);
	ck_assert_int_eq(atomic_load(&order[1]), 0);
	allot_conc_release(&held[2]);
	allot_conc_release(&held[3]);
	allot_conc_destroy(c);
}
END_TEST

static Suite *
conc_suite(void)
{
	Suite *s = suite_create("conc");
	TCase *tc = tcase_create("basics");
	tcase_add_test(tc, options_validation);
	tcase_add_test(tc, caller_names);
	tcase_add_test(tc, try_acquire_limits);
	suite_add_tcase(s, tc);

	tc = tcase_create("threads");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, bounds_under_threads);
	tcase_add_test(tc, interactive_survives_bulk_saturation);
	tcase_add_test(tc, bulk_cannot_take_reserve);
	suite_add_tcase(s, tc);

	tc = tcase_create("queue");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, queue_age_bound);
	tcase_add_test(tc, queue_length_bound);
	tcase_add_test(tc, caller_queue_share);
	tcase_add_test(tc, fifo_order);
	tcase_add_test(tc, blocked_caller_does_not_block_others);
	tcase_add_test(tc, interactive_served_first);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(conc_suite)
