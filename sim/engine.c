/* SPDX-License-Identifier: MIT */
/*
 * The simulator's engine (sim.h). One virtual clock, one event heap,
 * three limiters fed the same arrivals:
 *
 * - ideal: one GCRA bucket (common/bucket.h) of (R, B) per quota, and
 *   one of (C, B_C) for the ceiling, as if every replica shared them;
 * - allot: per replica a real agent (liballot, its clock injected) whose
 *   sync engine (agent/sync_core.c) is driven exactly as agent/sync.c
 *   drives it (timer, request, reply or timeout, lease check, next
 *   delay), its messages carried by a simulated transport (latency,
 *   jitter, loss, coordinator outage) to the real registry
 *   (coordinator/state/state.h, its clock injected) through allotd's own
 *   dispatcher (coordinator/dispatch/dispatch.c), as its server hands it
 * requests (in a `restart` scenario that coordinator has a real store, and is
 *   killed and restored mid-run: sim/coord.c);
 * - split: per replica buckets of R/n and B/n (and C/n), n being the live
 *   replica count at every instant, i.e. the equal split at its best.
 *
 * Admissions are taken per quota with their time as they come, and the
 * figures of docs/allocation.md are computed from them exactly (sliding
 * windows starting at every admission, not bins). While allot runs, its
 * invariants are checked at every coordinator tick: the grants never
 * exceed R, and what the agents hold never exceeds the coordinator's
 * live bound.
 */
#include "sim.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "admissions.h"
#include "allot.pb-c.h"
#include "arena.h"
#include "bucket.h"
#include "config.h"
#include "coord.h"
#include "dispatch/dispatch.h"
#include "prng.h"
#include "state/state.h"
#include "sync_int.h"
#include "tail.h"

const char *const sim_mode_names[SIM_NMODES] = { "ideal", "allot", "split",
	"local" };

#define SERVICE "svc"

/* ---- events ---- */

typedef enum evkind {
	EV_CHANGE,
	EV_TIMER,
	EV_TO_COORD,
	EV_TO_AGENT,
	EV_TIMEOUT,
	EV_TICK,
	EV_SECOND,
	EV_KILL, /* the coordinator is killed (a `restart` scenario) */
	EV_RESTART, /* and restarted from its store */
	EV_CHECK,
	/* The tail path (tail.h): a replica's engine has work, an Ask on
	 * its way to the coordinator and its Grant back, its timeout. */
	EV_TAIL,
	EV_ASK_TO_COORD,
	EV_ASK_TO_AGENT,
	EV_ASK_TIMEOUT,
} evkind;

typedef struct ev {
	uint64_t t;
	uint64_t seq;
	evkind kind;
	uint32_t replica;
	uint64_t tag; /* timer generation, exchange id, change */
	void *buf;
	size_t len;
} ev;

typedef struct heap {
	ev *e;
	size_t n, cap;
	uint64_t seq;
} heap;

static bool
ev_less(const ev *a, const ev *b)
{
	return a->t != b->t ? a->t < b->t : a->seq < b->seq;
}

static int
heap_push(heap *h, ev x)
{
	if (h->n == h->cap) {
		size_t cap = h->cap ? h->cap * 2 : 1024;
		ev *ne = realloc(h->e, cap * sizeof *ne);
		if (ne == NULL)
			return ALLOT_ENOMEM;
		h->e = ne;
		h->cap = cap;
	}
	x.seq = h->seq++;
	size_t i = h->n++;
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!ev_less(&x, &h->e[p]))
			break;
		h->e[i] = h->e[p];
		i = p;
	}
	h->e[i] = x;
	return ALLOT_OK;
}

static ev
heap_pop(heap *h)
{
	ev top = h->e[0];
	ev last = h->e[--h->n];
	size_t i = 0;
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		const ev *best = &last;
		if (l < h->n && ev_less(&h->e[l], best)) {
			m = l;
			best = &h->e[l];
		}
		if (r < h->n && ev_less(&h->e[r], best))
			m = r;
		if (m == i)
			break;
		h->e[i] = h->e[m];
		i = m;
	}
	if (h->n > 0)
		h->e[i] = last;
	return top;
}

/* ---- the run ---- */

struct engine;

/* What the tail engine's wake-up needs: which replica's engine. */
typedef struct tail_wake {
	struct engine *e;
	uint32_t idx;
} tail_wake;

typedef struct replica {
	bool live;
	bool welcomed; /* applied a first Welcome */
	allot_agent *a;
	allot__syncc sc;
	bool sc_init;
	allot_key **keys; /* [caller * nep + endpoint] */
	uint64_t timer_gen;
	bool waiting;
	uint64_t xid;
	char id[16];
	/* split */
	allot__bucket *sb; /* per quota, + 1 for the ceiling */
	/* the tail path (SIM_ALLOT) */
	allot__tail tail;
	bool tail_init;
	uint64_t ask_xid[ALLOT__TAIL_FLIGHTS];
	tail_wake tw;
} replica;

/* A request waiting for the central reserve: its allot_wait, and what
 * its decision is recorded against. */
typedef struct sim_wait {
	allot_wait w;
	struct engine *e;
	size_t q;
	uint64_t t0;
	bool boot; /* arrived before its replica's first Welcome */
} sim_wait;

typedef struct engine {
	sim_mode mode; /* the allot run in progress: SIM_ALLOT or SIM_LOCAL */
	const sim_scenario *s;
	const sim_params *p;
	const allot_config *cfg;
	uint64_t now;
	uint64_t T; /* ns */
	uint64_t wins[SIM_NWIN]; /* over-admission windows: T, 1 s, 10 s */
	uint64_t warm;
	size_t nq; /* agent quota order: callers, default */
	size_t nep; /* endpoints + default */
	double ceiling;
	double ceiling_burst;
	sim_admvec adm[SIM_NMODES][SIM_MAX_KEYS + 1]; /* last: the ceiling */
	double boot[SIM_MAX_KEYS];
	double offered[SIM_MAX_KEYS];
	replica *r;
	heap h;
	uint64_t rng;
	allot__state *st; /* co.st; NULL while the coordinator is dead */
	sim_coord co;
	allot__arena arena; /* the coordinator's protobuf-c allocator,
	                       as allotd's server has one per worker */
	/* convergence */
	bool conv_pending;
	uint64_t conv_t0;
	double conv_worst;
	bool conv_any;
	/* load */
	uint64_t syncs, reports, bytes;
	/* the tail path: decisions, those that waited, and how long (us) */
	uint64_t decisions, central;
	allot_sync_stats tail; /* the replicas' tail counters, summed */
	uint32_t *lat_us;
	size_t nlat, lat_cap;
	/* invariants */
	double max_granted_ratio, max_held_over_bound, max_bound_ratio;
	double max_tokens_over_burst;
	uint64_t checks;
	allot__metrics metrics; /* allotd's counters, over the allot modes */
	int err;
} engine;

static uint64_t
eng_clock(void *ctx)
{
	return ((const engine *) ctx)->now;
}

static double
eng_unit(engine *e)
{
	return allot__splitmix64_unit(&e->rng);
}

static size_t
quota_of(const engine *e, uint16_t caller)
{
	return caller < e->cfg->ncallers ? caller : e->cfg->ncallers;
}

static const allot__quota *
quota_cfg(const engine *e, size_t q)
{
	return q < e->cfg->ncallers ? &e->cfg->callers[q] : &e->cfg->def;
}

static uint32_t
weight_of(const engine *e, uint16_t ep)
{
	return ep < e->cfg->nendpoints ? e->cfg->endpoints[ep].weight :
	                                 e->cfg->default_weight;
}

static void
record(engine *e, sim_mode m, size_t q, uint64_t t, uint32_t cost)
{
	if (sim_adm_push(&e->adm[m][q], t, cost, e->warm, e->wins) !=
	        ALLOT_OK ||
	    (e->ceiling > 0 &&
	        sim_adm_push(&e->adm[m][SIM_MAX_KEYS], t, cost, e->warm,
	            e->wins) != ALLOT_OK))
		e->err = ALLOT_ENOMEM;
}

static void
bucket_new(allot__bucket *b, double rate, double burst)
{
	allot__allowance al = {
		.rate = rate, .burst = burst, .mode = ALLOT__MODE_LIMIT
	};
	allot__bucket_init(b, &al);
}

/* Take `cost` from the quota bucket and, when there is one, the ceiling
 * bucket; undo the first when the second says no. */
static bool
take2(allot__bucket *bq, allot__bucket *bc, uint64_t now, uint32_t cost)
{
	allot__take t;
	allot__bucket_take(bq, now, cost, &t);
	if (!t.allowed)
		return false;
	if (bc == NULL)
		return true;
	allot__bucket_take(bc, now, cost, &t);
	if (t.allowed)
		return true;
	allot__bucket_adjust(bq, -(int64_t) cost, now);
	return false;
}

/* ---- ideal ---- */

static void
run_ideal(engine *e)
{
	const sim_scenario *s = e->s;
	allot__bucket *b = aligned_alloc(64, sizeof *b * (e->nq + 1));
	if (b == NULL) {
		e->err = ALLOT_ENOMEM;
		return;
	}
	for (size_t q = 0; q < e->nq; q++)
		bucket_new(
		    &b[q], quota_cfg(e, q)->rate, quota_cfg(e, q)->burst);
	if (e->ceiling > 0)
		bucket_new(&b[e->nq], e->ceiling, e->ceiling_burst);
	for (size_t i = 0; i < s->narr; i++) {
		const sim_arrival *a = &s->arr[i];
		size_t q = quota_of(e, a->caller);
		uint32_t cost = weight_of(e, a->endpoint);
		e->offered[q] += cost;
		if (take2(
		        &b[q], e->ceiling > 0 ? &b[e->nq] : NULL, a->t, cost))
			record(e, SIM_IDEAL, q, a->t, cost);
	}
	free(b);
}

/* ---- split ---- */

static void
split_set(engine *e, replica *r, uint32_t n, bool init)
{
	double w = (double) e->cfg->max_weight;
	for (size_t q = 0; q <= e->nq; q++) {
		double R, B;
		if (q == e->nq) {
			if (!(e->ceiling > 0))
				break;
			R = e->ceiling;
			B = e->ceiling_burst;
		} else {
			R = quota_cfg(e, q)->rate;
			B = quota_cfg(e, q)->burst;
		}
		allot__allowance al = { .rate = R / n,
			.burst = fmax(B / n, w),
			.mode = ALLOT__MODE_LIMIT };
		if (init)
			allot__bucket_init(&r->sb[q], &al);
		else
			allot__bucket_set(&r->sb[q], &al, e->now);
	}
}

static void
run_split(engine *e)
{
	const sim_scenario *s = e->s;
	size_t ci = 0;
	uint32_t live = 0;
	for (uint32_t i = 0; i < s->nreplicas; i++) {
		e->r[i].sb = aligned_alloc(
		    64, sizeof(allot__bucket) * (e->nq + 1));
		if (e->r[i].sb == NULL) {
			e->err = ALLOT_ENOMEM;
			return;
		}
		e->r[i].live = false;
	}
	bool *fresh = calloc(s->nreplicas + 1, sizeof *fresh);
	if (fresh == NULL) {
		e->err = ALLOT_ENOMEM;
		return;
	}
	for (size_t i = 0; i <= s->narr; i++) {
		uint64_t t = i < s->narr ? s->arr[i].t : UINT64_MAX;
		/* Replica changes up to t: every live replica moves to the
		 * new R/n at once (the split's best case). */
		while (ci < s->nchanges && s->changes[ci].t <= t) {
			uint64_t ct = s->changes[ci].t;
			e->now = ct;
			for (; ci < s->nchanges && s->changes[ci].t == ct;
			     ci++) {
				const sim_change *c = &s->changes[ci];
				replica *r = &e->r[c->replica];
				if (c->kind == SIM_START && !r->live) {
					r->live = fresh[c->replica] = true;
					live++;
				} else if (c->kind != SIM_START && r->live) {
					r->live = false;
					live--;
				}
			}
			for (uint32_t k = 0; k < s->nreplicas; k++) {
				if (!e->r[k].live)
					continue;
				split_set(e, &e->r[k], live, fresh[k]);
				fresh[k] = false;
			}
		}
		if (i == s->narr)
			break;
		const sim_arrival *a = &s->arr[i];
		replica *r = &e->r[a->replica];
		if (!r->live)
			continue;
		size_t q = quota_of(e, a->caller);
		uint32_t cost = weight_of(e, a->endpoint);
		if (take2(&r->sb[q], e->ceiling > 0 ? &r->sb[e->nq] : NULL,
		        a->t, cost))
			record(e, SIM_SPLIT, q, a->t, cost);
	}
	free(fresh);
	for (uint32_t i = 0; i < s->nreplicas; i++) {
		free(e->r[i].sb);
		e->r[i].sb = NULL;
		e->r[i].live = false;
	}
}

/* ---- allot: the transport and the coordinator ---- */

/* Hand a request to allotd's own dispatcher (coordinator/dispatch/dispatch.h),
 * decoded into and answered from the arena as by a server worker, with
 * no peer budgets and no identity checks. The answer is copied out for
 * the wire (malloc). */
static int
coord_handle(
    engine *e, const void *buf, size_t len, void **ret, size_t *ret_len)
{
	ProtobufCAllocator pa = { allot__arena_alloc, allot__arena_free,
		&e->arena };
	allot__dispatch_ctx c;
	allot__dispatch_ctx_init(&c);
	c.state = e->st;
	allot__dispatch_req req = {
		.buf = buf, .len = len, .now = e->now, .pa = &pa
	};
	allot__dispatch_result res;
	e->bytes += len;
	int rc = allot__dispatch(&c, &req, &res);
	const Allot__V1__Envelope *in = res.request;
	if (in != NULL && in->version == ALLOT__PROTOCOL_VERSION &&
	    in->body_case == ALLOT__V1__ENVELOPE__BODY_SYNC) {
		e->syncs++;
		e->reports += in->sync->n_reports;
	}
	size_t n = res.answer_len;
	void *b = rc == ALLOT_OK ? malloc(n ? n : 1) : NULL;
	if (b != NULL)
		memcpy(b, res.answer, n);
	allot__arena_reset(&e->arena);
	if (b == NULL)
		return ALLOT_ENOMEM;
	e->bytes += n;
	*ret = b;
	*ret_len = n;
	return ALLOT_OK;
}

static bool
outage(const engine *e)
{
	return e->now >= e->s->outage_from && e->now < e->s->outage_to;
}

static uint64_t
one_way(engine *e)
{
	double ms = e->p->latency_ms + e->p->latency_jitter_ms * eng_unit(e);
	return (uint64_t) (ms * 1e6);
}

/* Put a message on the wire, arriving `delay` ns from now; it may be
 * lost (or the coordinator be unreachable). Takes `buf`. */
static void
send_in(engine *e, evkind kind, uint32_t idx, uint64_t tag, void *buf,
    size_t len, uint64_t delay)
{
	if (outage(e) || (e->p->loss > 0 && eng_unit(e) < e->p->loss)) {
		free(buf);
		return;
	}
	ev x = { .t = e->now + delay,
		.kind = kind,
		.replica = idx,
		.tag = tag,
		.buf = buf,
		.len = len };
	if (heap_push(&e->h, x) != ALLOT_OK) {
		free(buf);
		e->err = ALLOT_ENOMEM;
	}
}

static void
send_msg(
    engine *e, evkind kind, uint32_t idx, uint64_t tag, void *buf, size_t len)
{
	send_in(e, kind, idx, tag, buf, len, one_way(e));
}

static void
push(engine *e, uint64_t t, evkind kind, uint32_t idx, uint64_t tag)
{
	ev x = { .t = t, .kind = kind, .replica = idx, .tag = tag };
	if (heap_push(&e->h, x) != ALLOT_OK)
		e->err = ALLOT_ENOMEM;
}

/* agent/sync.c's request timeout. */
static uint64_t
request_timeout_ns(const engine *e)
{
	uint32_t t = e->p->interval_ms * 2;
	t = t < 250 ? 250 : t > 2000 ? 2000 : t;
	return (uint64_t) t * 1000000u;
}

/* agent/sync.c's early-ask check period. */
static uint64_t
check_ns(const engine *e)
{
	return (uint64_t) e->p->interval_ms * 1000000u / 8;
}

static void
schedule_timer(engine *e, replica *r, uint32_t idx, uint64_t delay_ms)
{
	push(e, e->now + delay_ms * 1000000u, EV_TIMER, idx, ++r->timer_gen);
}

/* The rate and burst an agent runs quota q (agent order) with now. */
static void
held(const replica *r, size_t q, double *ret_r, double *ret_b)
{
	allot__allowance al;
	allot__bucket_get(&r->a->quotas[q].bucket, &al);
	if (al.mode == ALLOT__MODE_OPEN) {
		*ret_r = *ret_b = INFINITY;
	} else if (al.mode == ALLOT__MODE_CLOSED) {
		*ret_r = *ret_b = 0;
	} else {
		*ret_r = al.rate;
		*ret_b = al.burst;
	}
}

/* Coordinator quota index of agent quota q. */
static size_t
cq_of(const engine *e, size_t q)
{
	return q < e->cfg->ncallers ? q + 1 : 0;
}

/* ---- allot: the tail path (agent/tail.h) ---- */

/* A caller queued a waiter: the engine runs at once, as sync.c's loop
 * would on its wake-up. */
static void
on_tail_wake(void *ctx)
{
	tail_wake *tw = ctx;
	push(tw->e, tw->e->now, EV_TAIL, tw->idx, 0);
}

/* A decision that waited: recorded at the time it was made. */
static void
on_decided(allot_wait *w, const allot_decision *d)
{
	sim_wait *sw = (sim_wait *) (void *) w;
	engine *e = sw->e;
	if (d->allowed) {
		record(e, e->mode, sw->q, e->now, d->cost);
		if (sw->boot)
			e->boot[sw->q] += d->cost;
	}
	uint64_t us = (e->now - sw->t0) / 1000u;
	if (e->nlat == e->lat_cap) {
		size_t cap = e->lat_cap ? 2 * e->lat_cap : 1024;
		uint32_t *p = realloc(e->lat_us, cap * sizeof *p);
		if (p == NULL) {
			e->err = ALLOT_ENOMEM;
			free(sw);
			return;
		}
		e->lat_us = p;
		e->lat_cap = cap;
	}
	e->lat_us[e->nlat++] = us > UINT32_MAX ? UINT32_MAX : (uint32_t) us;
	free(sw);
}

/* What sync.c's tail_service() does: send the Asks that can go, then
 * wake up at the next deadline (or when the next Ask may go). */
static void
tail_service(engine *e, uint32_t idx)
{
	replica *r = &e->r[idx];
	if (!r->live || !r->tail_init)
		return;
	allot__tail *t = &r->tail;
	allot__tail_publish(t, &r->sc);
	void *buf;
	size_t len;
	uint32_t to, f;
	uint64_t at = UINT64_MAX;
	uint64_t half = (uint64_t) (e->p->central_rtt_ms * 0.5e6);
	while (allot__tail_has_pending(t) &&
	    allot__tail_request(t, &r->sc, e->now, &buf, &len, &to, &f, &at) ==
	        ALLOT_OK) {
		uint64_t tag = ++r->ask_xid[f] * ALLOT__TAIL_FLIGHTS + f;
		send_in(e, EV_ASK_TO_COORD, idx, tag, buf, len, half);
		push(e, e->now + (uint64_t) to * 1000000u, EV_ASK_TIMEOUT, idx,
		    tag);
	}
	uint64_t next = allot__tail_expire(t, e->now);
	if (at < next)
		next = at;
	if (next != UINT64_MAX)
		push(e, next, EV_TAIL, idx, 0);
}

static int coord_handle(
    engine *e, const void *buf, size_t len, void **ret, size_t *ret_len);

static void
on_ask_coord(engine *e, ev *x)
{
	void *out;
	size_t len;
	if (outage(e) || e->st == NULL)
		return;
	if (coord_handle(e, x->buf, x->len, &out, &len) != ALLOT_OK) {
		e->err = ALLOT_ENOMEM;
		return;
	}
	send_in(e, EV_ASK_TO_AGENT, x->replica, x->tag, out, len,
	    (uint64_t) ((e->p->central_serve_ms + e->p->central_rtt_ms * 0.5) *
	        1e6));
}

/* The answer to an Ask, or its timeout: for the flight still waiting
 * for it only. */
static void
on_ask_agent(engine *e, ev *x, bool timeout)
{
	replica *r = &e->r[x->replica];
	uint32_t f = (uint32_t) (x->tag % ALLOT__TAIL_FLIGHTS);
	if (!r->live || !r->tail_init ||
	    r->ask_xid[f] * ALLOT__TAIL_FLIGHTS + f != x->tag)
		return;
	if (timeout)
		allot__tail_lost(&r->tail, f, e->now);
	else
		allot__tail_reply(&r->tail, &r->sc, f, e->now, x->buf, x->len);
	tail_service(e, x->replica);
}

/* One arrival at a live replica: decided at once, or waiting for the
 * central reserve (SIM_ALLOT). */
static void
arrive(engine *e, replica *r, const sim_arrival *a)
{
	size_t q = quota_of(e, a->caller);
	allot_decision d;
	allot_key *k = r->keys[(size_t) a->caller * e->nep + a->endpoint];
	e->decisions++;
	sim_wait *sw = calloc(1, sizeof *sw);
	if (sw == NULL) {
		e->err = ALLOT_ENOMEM;
		return;
	}
	int rc = allot_acquire_async(r->a, &sw->w, k, ALLOT_COST_DEFAULT,
	    (uint64_t) (e->p->wait_ms * 1e6), on_decided, &d);
	if (rc == ALLOT_EINPROGRESS) {
		sw->e = e;
		sw->q = q;
		sw->t0 = a->t;
		sw->boot = !r->welcomed;
		e->central++;
		return;
	}
	free(sw);
	if (rc == ALLOT_OK && d.allowed) {
		record(e, e->mode, q, a->t, d.cost);
		if (!r->welcomed)
			e->boot[q] += d.cost;
	}
}

static int
replica_start(engine *e, uint32_t idx, uint32_t nlive)
{
	replica *r = &e->r[idx];
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.clock = eng_clock;
	o.clock_ctx = e;
	o.service = SERVICE;
	snprintf(r->id, sizeof r->id, "r%u", idx);
	o.replica_id = r->id;
	o.max_unknown_keys = 0;
	o.sync_interval_ms = e->p->interval_ms;
	o.sync_jitter = e->p->sync_jitter;
	o.waits = e->mode == SIM_ALLOT;
	/* The operator's expected count: what runs right after it. */
	o.initial_replicas = nlive > 0 ? nlive : 1;
	o.log = NULL;
	int rc = allot_agent_create(e->cfg, &o, &r->a);
	if (rc != ALLOT_OK)
		return rc;
	/* The agent's own installer, without configs: the simulated
	 * agents announce digest 0, so the coordinator never sends one. */
	allot__installer in;
	allot__agent_installer(r->a, &in);
	in.reconfig = NULL;
	rc = allot__syncc_create(
	    &r->sc, r->a, e->p->seed * 7919u + idx + 1, &in);
	if (rc != ALLOT_OK) {
		allot_agent_destroy(r->a);
		r->a = NULL;
		return rc;
	}
	r->sc_init = true;
	r->tw = (tail_wake) { .e = e, .idx = idx };
	if (e->mode == SIM_ALLOT) {
		rc = allot__tail_init(&r->tail, r->a, on_tail_wake, &r->tw);
		if (rc != ALLOT_OK)
			return rc;
		r->tail_init = true;
		r->tail.no_pool = !e->p->pool;
		r->a->tail = &r->tail;
	}
	r->keys = calloc((e->cfg->ncallers + 1) * e->nep, sizeof *r->keys);
	if (r->keys == NULL)
		return ALLOT_ENOMEM;
	for (size_t c = 0; c <= e->cfg->ncallers; c++) {
		for (size_t p = 0; p < e->nep; p++) {
			const char *id = c < e->cfg->ncallers ?
			    e->cfg->callers[c].identity :
			    NULL;
			const char *ep = p < e->cfg->nendpoints ?
			    e->cfg->endpoints[p].name :
			    NULL;
			rc = allot_key_resolve(
			    r->a, id, ep, &r->keys[c * e->nep + p]);
			if (rc != ALLOT_OK)
				return rc;
		}
	}
	r->live = true;
	r->welcomed = false;
	r->waiting = false;
	schedule_timer(e, r, idx, 0);
	return ALLOT_OK;
}

static void
replica_stop(engine *e, uint32_t idx, bool graceful)
{
	replica *r = &e->r[idx];
	if (!r->live)
		return;
	if (graceful) {
		void *buf;
		size_t len;
		if (allot__syncc_leave(&r->sc, &buf, &len) == ALLOT_OK)
			send_msg(e, EV_TO_COORD, idx, 0, buf, len);
	}
	r->live = false;
	r->waiting = false;
	r->timer_gen++;
	if (r->tail_init) {
		/* Whoever still waits is denied (and recorded) now. */
		r->a->tail = NULL;
		allot__tail_fini(&r->tail, e->now);
		allot_sync_stats ts;
		allot__tail_stats(&r->tail, &ts);
		e->tail.central_allowed += ts.central_allowed;
		e->tail.central_denied += ts.central_denied;
		e->tail.central_late += ts.central_late;
		e->tail.central_short += ts.central_short;
		e->tail.central_asks += ts.central_asks;
		e->tail.central_dry += ts.central_dry;
		e->tail.central_standby += ts.central_standby;
		r->tail_init = false;
	}
	if (r->sc_init)
		allot__syncc_fini(&r->sc);
	r->sc_init = false;
	allot_agent_destroy(r->a);
	r->a = NULL;
	free(r->keys);
	r->keys = NULL;
}

static void
on_timer(engine *e, uint32_t idx)
{
	replica *r = &e->r[idx];
	allot__syncc_check_lease(&r->sc, e->now);
	if (r->tail_init)
		allot__tail_publish(&r->tail, &r->sc);
	if (r->waiting)
		return;
	void *buf;
	size_t len;
	if (allot__syncc_request(&r->sc, e->now, &buf, &len) != ALLOT_OK) {
		allot__syncc_failed(&r->sc, e->now, "out of memory");
		schedule_timer(e, r, idx,
		    allot__syncc_next_delay_ms(&r->sc, e->now, false));
		return;
	}
	r->waiting = true;
	r->xid++;
	send_msg(e, EV_TO_COORD, idx, r->xid, buf, len);
	push(e, e->now + request_timeout_ns(e), EV_TIMEOUT, idx, r->xid);
}

static void
on_coord(engine *e, ev *x)
{
	void *out;
	size_t len;
	if (outage(e) || e->st == NULL)
		return; /* arrived at an unreachable coordinator */
	if (coord_handle(e, x->buf, x->len, &out, &len) != ALLOT_OK) {
		e->err = ALLOT_ENOMEM;
		return;
	}
	if (x->tag == 0) {
		free(out); /* the answer to a Leave: nobody waits */
		return;
	}
	send_msg(e, EV_TO_AGENT, x->replica, x->tag, out, len);
}

static void
on_agent(engine *e, ev *x)
{
	replica *r = &e->r[x->replica];
	if (!r->live || !r->waiting || x->tag != r->xid)
		return; /* too late: the exchange was given up */
	r->waiting = false;
	bool ok = allot__syncc_reply(&r->sc, e->now, x->buf, x->len);
	if (atomic_load(&r->sc.registers) > 0)
		r->welcomed = true;
	allot__syncc_check_lease(&r->sc, e->now);
	if (r->tail_init)
		allot__tail_publish(&r->tail, &r->sc);
	schedule_timer(
	    e, r, x->replica, allot__syncc_next_delay_ms(&r->sc, e->now, ok));
}

static void
on_timeout(engine *e, ev *x)
{
	replica *r = &e->r[x->replica];
	if (!r->live || !r->waiting || x->tag != r->xid)
		return;
	r->waiting = false;
	allot__syncc_failed(&r->sc, e->now, "timed out");
	allot__syncc_check_lease(&r->sc, e->now);
	if (r->tail_init)
		allot__tail_publish(&r->tail, &r->sc);
	schedule_timer(e, r, x->replica,
	    allot__syncc_next_delay_ms(&r->sc, e->now, false));
}

/* agent/sync.c's check for keys that started denying, every eighth of
 * an interval: a replica with one runs its exchange at once. */
static void
on_check(engine *e)
{
	for (uint32_t i = 0; i < e->s->nreplicas; i++) {
		replica *r = &e->r[i];
		if (!r->live || !r->sc_init || r->waiting ||
		    !allot__syncc_early_due(&r->sc, e->now))
			continue;
		r->timer_gen++; /* the regular timer is superseded */
		on_timer(e, i);
	}
}

/* ---- allot: checks ---- */

typedef struct conv_ctx {
	engine *e;
	bool ok;
	size_t shares;
	double *sum; /* per coordinator quota */
} conv_ctx;

static void
conv_share(void *ctx, const allot__state_share *sh)
{
	conv_ctx *c = ctx;
	engine *e = c->e;
	unsigned idx;
	if (sscanf(sh->replica_id, "r%u", &idx) != 1 ||
	    idx >= e->s->nreplicas || !e->r[idx].live) {
		c->ok = false;
		return;
	}
	size_t q = sh->quota == 0 ? e->cfg->ncallers : (size_t) sh->quota - 1;
	double hr, hb;
	held(&e->r[idx], q, &hr, &hb);
	double R = quota_cfg(e, q)->rate;
	/* Its target as of the coordinator's last answer to it: targets
	 * can only reach an agent in an answer. */
	if (fabs(hr - sh->reply_target_rate) >
	    SIM_CONVERGE_TOL * sh->reply_target_rate + 1e-9 * R)
		c->ok = false;
	c->sum[sh->quota] += hr;
	c->shares++;
}

/* Every live replica holds its target within 1 % and the held rates of
 * every quota sum to at most R. */
static bool
converged(engine *e)
{
	uint32_t live = 0;
	if (e->st == NULL)
		return false; /* a killed coordinator */
	for (uint32_t i = 0; i < e->s->nreplicas; i++) {
		if (!e->r[i].live)
			continue;
		live++;
		if (!e->r[i].welcomed || e->r[i].sc.session == 0)
			return false;
	}
	if (allot__state_service_replicas(e->st, SERVICE) != live)
		return false;
	double sum[SIM_MAX_KEYS + 1] = { 0 };
	conv_ctx c = { .e = e, .ok = true, .sum = sum };
	allot__state_foreach_share(e->st, SERVICE, conv_share, &c);
	if (!c.ok || c.shares != (size_t) live * e->nq)
		return false;
	for (size_t q = 0; q < e->nq; q++)
		if (sum[cq_of(e, q)] > quota_cfg(e, q)->rate * (1 + 1e-9))
			return false;
	return true;
}

static void
conv_check(engine *e)
{
	if (!e->conv_pending)
		return;
	double iv = (double) (e->now - e->conv_t0) / (double) e->T;
	if (converged(e)) {
		e->conv_pending = false;
		if (!(iv <= e->conv_worst))
			e->conv_worst = iv;
	} else if (iv > SIM_CONVERGE_MAX_INTERVALS) {
		e->conv_pending = false;
		e->conv_worst = NAN;
	}
}

/* Grants within R, and what the welcomed agents hold within the live
 * bound. */
static void
invariants(engine *e)
{
	for (size_t q = 0; q < e->nq; q++) {
		allot__state_quota sq;
		if (allot__state_quota_get(e->st, SERVICE, cq_of(e, q), &sq) !=
		    ALLOT_OK)
			continue;
		double hr = 0, hb = 0, tokens = sq.reserve_level;
		for (uint32_t i = 0; i < e->s->nreplicas; i++) {
			if (!e->r[i].live || !e->r[i].welcomed)
				continue;
			double r, b;
			held(&e->r[i], q, &r, &b);
			hr += r;
			hb += b;
			if (isfinite(b) && b > 0)
				tokens += fmax(0,
				    allot__bucket_level(
				        &e->r[i].a->quotas[q].bucket, e->now));
		}
		double t = (tokens - sq.burst) / sq.burst;
		if (isfinite(t) && t > e->max_tokens_over_burst)
			e->max_tokens_over_burst = t;
		double g = sq.granted_rate / sq.rate;
		if (g > e->max_granted_ratio)
			e->max_granted_ratio = g;
		if (sq.bound_ratio > e->max_bound_ratio)
			e->max_bound_ratio = sq.bound_ratio;
		double x = fmax((hr - sq.bound_rate) / sq.rate,
		    (hb - sq.bound_burst) / sq.burst);
		if (isnan(x))
			x = 0; /* both +Inf: an open fallback, counted */
		if (x > e->max_held_over_bound)
			e->max_held_over_bound = x;
		e->checks++;
	}
}

static int
run_allot(engine *e, sim_mode mode)
{
	const sim_scenario *s = e->s;
	e->mode = mode;
	allot__state_opts o;
	allot__state_opts_init(&o);
	o.policy.central = mode == SIM_ALLOT;
	o.clock = eng_clock;
	o.clock_ctx = e;
	o.interval_ms = e->p->interval_ms;
	o.lease_ms = e->p->lease_ms;
	o.expiry_intervals = e->p->expiry_intervals;
	o.metrics = &e->metrics;
	if (e->p->loan_frac >= 0)
		o.policy.loan_frac = e->p->loan_frac;
	e->now = 0;
	int rc = sim_coord_start(
	    &e->co, &o, e->cfg, s->config_text, s->restart);
	e->st = e->co.st;
	if (rc != ALLOT_OK) {
		sim_coord_stop(&e->co);
		return rc;
	}
	e->max_held_over_bound = -INFINITY;
	e->max_tokens_over_burst = -INFINITY;
	for (size_t i = 0; i < s->nchanges; i++)
		push(e, s->changes[i].t, EV_CHANGE, s->changes[i].replica, i);
	if (s->restart) {
		push(e, s->outage_from, EV_KILL, 0, 0);
		push(e, s->outage_to, EV_RESTART, 0, 0);
	}
	push(e, e->T, EV_TICK, 0, 0);
	push(e, SIM_NS, EV_SECOND, 0, 0);
	push(e, check_ns(e), EV_CHECK, 0, 0);
	size_t ai = 0;
	while (e->err == ALLOT_OK) {
		uint64_t ta = ai < s->narr ? s->arr[ai].t : UINT64_MAX;
		uint64_t te = e->h.n > 0 ? e->h.e[0].t : UINT64_MAX;
		if (ta == UINT64_MAX && te == UINT64_MAX)
			break;
		if (ta < te) {
			if (ta >= s->duration)
				break;
			const sim_arrival *a = &s->arr[ai++];
			e->now = a->t;
			replica *r = &e->r[a->replica];
			if (r->live)
				arrive(e, r, a);
			continue;
		}
		if (te >= s->duration)
			break;
		ev x = heap_pop(&e->h);
		e->now = x.t;
		switch (x.kind) {
		case EV_CHANGE: {
			const sim_change *c = &s->changes[x.tag];
			if (c->kind == SIM_START) {
				int64_t live = 0;
				for (size_t j = 0; j < s->nchanges &&
				     s->changes[j].t <= c->t;
				     j++)
					live += s->changes[j].kind ==
					        SIM_START ?
					    1 :
					    -1;
				rc = replica_start(e, c->replica,
				    live > 0 ? (uint32_t) live : 1);
				if (rc != ALLOT_OK)
					e->err = rc;
			} else {
				replica_stop(
				    e, c->replica, c->kind == SIM_LEAVE);
			}
			if (c->t > 0) {
				if (e->conv_pending && e->conv_t0 != c->t)
					e->conv_worst = NAN;
				if (!e->conv_pending || e->conv_t0 != c->t) {
					e->conv_pending = true;
					e->conv_t0 = c->t;
					e->conv_any = true;
				}
			}
			conv_check(e);
			break;
		}
		case EV_TIMER:
			if (e->r[x.replica].live &&
			    x.tag == e->r[x.replica].timer_gen)
				on_timer(e, x.replica);
			break;
		case EV_TO_COORD: on_coord(e, &x); break;
		case EV_TO_AGENT:
			on_agent(e, &x);
			conv_check(e);
			break;
		case EV_TIMEOUT: on_timeout(e, &x); break;
		case EV_TICK:
			if (e->st != NULL) {
				allot__state_tick(e->st);
				invariants(e);
				conv_check(e);
				sim_coord_commit(&e->co);
			}
			push(e, e->now + e->T, EV_TICK, 0, 0);
			break;
		case EV_SECOND:
			if (e->st != NULL)
				allot__state_second(e->st);
			push(e, e->now + SIM_NS, EV_SECOND, 0, 0);
			break;
		case EV_KILL:
			sim_coord_kill(&e->co);
			e->st = NULL;
			break;
		case EV_RESTART:
			if ((rc = sim_coord_restart(&e->co)) != ALLOT_OK)
				e->err = rc;
			e->st = e->co.st;
			break;
		case EV_CHECK:
			on_check(e);
			push(e, e->now + check_ns(e), EV_CHECK, 0, 0);
			break;
		case EV_TAIL: tail_service(e, x.replica); break;
		case EV_ASK_TO_COORD: on_ask_coord(e, &x); break;
		case EV_ASK_TO_AGENT: on_ask_agent(e, &x, false); break;
		case EV_ASK_TIMEOUT: on_ask_agent(e, &x, true); break;
		}
		free(x.buf);
	}
	if (e->conv_pending)
		e->conv_worst = NAN;
	for (uint32_t i = 0; i < s->nreplicas; i++)
		replica_stop(e, i, false);
	while (e->h.n > 0) {
		ev x = heap_pop(&e->h);
		free(x.buf);
	}
	sim_coord_stop(&e->co);
	e->st = NULL;
	allot__arena_destroy(&e->arena);
	return e->err;
}

/* ---- figures ---- */

static void
figures(engine *e, sim_result *res)
{
	const sim_scenario *s = e->s;
	double dur = (double) s->duration / SIM_NS;
	double Ts = (double) e->T / SIM_NS;
	const uint64_t *wins = e->wins;
	res->nkeys = 0;
	for (size_t q = 0; q <= e->nq && q <= SIM_MAX_KEYS; q++) {
		bool ceil_row = q == e->nq;
		if (ceil_row && !(e->ceiling > 0))
			break;
		size_t src = ceil_row ? SIM_MAX_KEYS : q;
		if (!ceil_row && e->offered[q] == 0 && q == e->cfg->ncallers)
			continue; /* the default quota, unused */
		sim_key *k = &res->keys[res->nkeys++];
		memset(k, 0, sizeof *k);
		if (ceil_row) {
			snprintf(k->identity, sizeof k->identity, "(ceiling)");
			k->rate = e->ceiling;
			k->burst = e->ceiling_burst;
			k->ceiling = true;
			for (size_t j = 0; j < e->nq; j++)
				k->offered += e->offered[j];
		} else {
			const allot__quota *qc = quota_cfg(e, q);
			snprintf(k->identity, sizeof k->identity, "%s",
			    qc->identity);
			k->rate = qc->rate;
			k->burst = qc->burst;
			snprintf(k->priority, sizeof k->priority, "%s",
			    qc->priority < e->cfg->nclasses ?
			        e->cfg->classes[qc->priority] :
			        "?");
			k->offered = e->offered[q];
			k->bootstrap = e->boot[q] / (k->rate * Ts);
		}
		double ideal_after = e->adm[SIM_IDEAL][src].after_warmup;
		for (int m = 0; m < SIM_NMODES; m++) {
			sim_admvec *v = &e->adm[m][src];
			sim_fig *f = &k->f[m];
			f->admitted = v->total;
			f->over = -INFINITY;
			double mw[SIM_NWIN];
			sim_adm_max_windows(v, wins, mw);
			for (int w = 0; w < SIM_NWIN; w++) {
				double W = (double) wins[w] / SIM_NS;
				f->over_w[w] = (mw[w] -
				                   (k->burst + k->rate * W)) /
				    (k->rate * Ts);
				if (f->over_w[w] > f->over)
					f->over = f->over_w[w];
			}
			f->under = ideal_after > 0 ?
			    fmax(0,
			        (ideal_after - v->after_warmup) /
			            ideal_after) :
			    0;
			f->util = v->total / (k->rate * dur + k->burst);
		}
	}
	/* Under-admission of the scenario: of all the quotas' admissions
	 * (per quota in the rows). */
	double ideal_all = 0;
	for (size_t q = 0; q < e->nq; q++)
		ideal_all += e->adm[SIM_IDEAL][q].after_warmup;
	for (int m = 0; m < SIM_NMODES; m++) {
		double over = -INFINITY, sum = 0, cap = 0, after = 0;
		double cutil = NAN;
		for (size_t q = 0; q < e->nq; q++)
			after += e->adm[m][q].after_warmup;
		for (size_t i = 0; i < res->nkeys; i++) {
			const sim_key *k = &res->keys[i];
			if (k->f[m].over > over)
				over = k->f[m].over;
			if (k->ceiling) {
				cutil = k->f[m].util;
				continue;
			}
			sum += k->f[m].admitted;
			cap += k->rate * dur + k->burst;
		}
		res->over[m] = over;
		/* The quotas whose callers stay below R: none of their
		 * demand should be refused; the worst of them. Without
		 * any (overload), all the quotas' admissions together. */
		double worst = -1;
		for (size_t i = 0; i < res->nkeys; i++) {
			const sim_key *k = &res->keys[i];
			if (!k->ceiling && k->offered < k->rate * dur &&
			    k->f[m].under > worst)
				worst = k->f[m].under;
		}
		res->under[m] = worst >= 0 ? worst :
		    ideal_all > 0 ? fmax(0, (ideal_all - after) / ideal_all) :
		                    0;
		res->util[m] = !isnan(cutil) ? cutil : cap > 0 ? sum / cap : 0;
		res->converge[m] = NAN;
		res->neighbour[m] = NAN;
	}
	res->bootstrap = 0;
	for (size_t i = 0; i < res->nkeys; i++)
		if (res->keys[i].bootstrap > res->bootstrap)
			res->bootstrap = res->keys[i].bootstrap;
}

static int
cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *) a, y = *(const uint32_t *) b;
	return x < y ? -1 : x > y;
}

/* The tail path's figures of the shipped run. */
static void
central_figures(engine *e, sim_result *res)
{
	res->central_fraction = e->decisions > 0 ?
	    (double) e->central / (double) e->decisions :
	    0;
	res->central_p99_ms = 0;
	res->central_asks = e->tail.central_asks;
	res->central_allowed = e->tail.central_allowed;
	res->central_denied = e->tail.central_denied;
	res->central_late = e->tail.central_late;
	res->central_short = e->tail.central_short;
	res->central_dry = e->tail.central_dry;
	res->central_standby = e->tail.central_standby;
	if (e->nlat == 0)
		return;
	qsort(e->lat_us, e->nlat, sizeof *e->lat_us, cmp_u32);
	size_t i = (size_t) ceil(0.99 * (double) e->nlat) - 1;
	res->central_p99_ms = e->lat_us[i < e->nlat ? i : e->nlat - 1] / 1e3;
}

int
sim_run(const sim_scenario *s, const sim_params *p, sim_result *res)
{
	struct timespec w0, w1;
	clock_gettime(CLOCK_MONOTONIC, &w0);
	memset(res, 0, sizeof *res);
	if (s->cfg == NULL || s->cfg->ncallers + 1 > SIM_MAX_KEYS ||
	    s->nreplicas > SIM_MAX_REPLICAS || p->interval_ms == 0)
		return ALLOT_EINVAL;
	engine *e = calloc(1, sizeof *e);
	if (e == NULL)
		return ALLOT_ENOMEM;
	allot__metrics_init(&e->metrics);
	e->s = s;
	e->p = p;
	e->cfg = s->cfg;
	e->T = (uint64_t) p->interval_ms * 1000000u;
	e->wins[0] = e->T;
	e->wins[1] = SIM_NS;
	e->wins[2] = 10 * SIM_NS;
	e->warm = (uint64_t) (SIM_WARMUP_INTERVALS * (double) e->T);
	e->nq = s->cfg->ncallers + 1;
	e->nep = s->cfg->nendpoints + 1;
	e->ceiling = s->cfg->ceiling_rate;
	double horizon = 0;
	for (size_t q = 0; q < s->cfg->ncallers; q++)
		horizon = fmax(horizon,
		    s->cfg->callers[q].burst / s->cfg->callers[q].rate);
	e->ceiling_burst = e->ceiling * (horizon > 0 ? horizon : 1.0);
	e->rng = p->seed ^ 0x5deece66dull;
	e->r = calloc(s->nreplicas + 1, sizeof *e->r);
	int rc = e->r == NULL ? ALLOT_ENOMEM : ALLOT_OK;
	if (rc == ALLOT_OK) {
		run_ideal(e);
		run_split(e);
		rc = e->err;
	}
	/* Local only first, then as shipped: the figures of the coordinator
	 * (load, convergence, bootstrap) are the shipped run's; the
	 * invariants are checked in both. */
	if (rc == ALLOT_OK && p->run_local) {
		rc = run_allot(e, SIM_LOCAL);
		e->syncs = e->reports = e->bytes = 0;
		e->conv_pending = e->conv_any = false;
		e->conv_worst = 0;
		memset(e->boot, 0, sizeof e->boot);
	}
	e->decisions = e->central = 0;
	e->nlat = 0;
	memset(&e->tail, 0, sizeof e->tail);
	if (rc == ALLOT_OK)
		rc = run_allot(e, SIM_ALLOT);
	if (rc == ALLOT_OK) {
		snprintf(res->scenario, sizeof res->scenario, "%s", s->name);
		res->interval_ms = p->interval_ms;
		res->seed = p->seed;
		res->duration_s = (double) s->duration / SIM_NS;
		res->nreplicas_max = s->nreplicas;
		figures(e, res);
		res->converge[SIM_ALLOT] = e->conv_any ? e->conv_worst : NAN;
		res->syncs_per_s = (double) e->syncs / res->duration_s;
		res->reports_per_s = (double) e->reports / res->duration_s;
		res->bytes_per_s = (double) e->bytes / res->duration_s;
		res->max_granted_ratio = e->max_granted_ratio;
		res->max_held_over_bound = e->max_held_over_bound;
		res->max_tokens_over_burst = e->max_tokens_over_burst;
		res->max_bound_ratio = e->max_bound_ratio;
		res->invariant_checks = e->checks;
		res->denials_refuted = atomic_load(
		    &e->metrics.denial_reports_refuted);
		central_figures(e, res);
	}
	for (int m = 0; m < SIM_NMODES; m++)
		for (size_t q = 0; q <= SIM_MAX_KEYS; q++)
			free(e->adm[m][q].a);
	free(e->h.e);
	free(e->r);
	free(e->lat_us);
	free(e);
	clock_gettime(CLOCK_MONOTONIC, &w1);
	res->wall_s = (double) (w1.tv_sec - w0.tv_sec) +
	    (double) (w1.tv_nsec - w0.tv_nsec) / 1e9;
	return rc;
}

void
sim_neighbour(sim_result *with, const sim_result *without, int noisy)
{
	for (int m = 0; m < SIM_NMODES; m++) {
		double worst = 0;
		for (size_t i = 0; i < with->nkeys; i++) {
			const sim_key *k = &with->keys[i];
			if (k->ceiling || (int) i == noisy)
				continue;
			for (size_t j = 0; j < without->nkeys; j++) {
				const sim_key *o = &without->keys[j];
				if (strcmp(o->identity, k->identity) != 0 ||
				    !(o->f[m].admitted > 0))
					continue;
				double d = fabs(k->f[m].admitted -
				               o->f[m].admitted) /
				    o->f[m].admitted;
				if (d > worst)
					worst = d;
			}
		}
		with->neighbour[m] = worst;
	}
}
