/* SPDX-License-Identifier: MIT */
/*
 * The agent's sync transport: a libuv loop on the agent's own thread that
 * runs the sync engine (sync_core.c) against allotd over nng REQ/REP
 * (schema/allot.proto). Every interval T, with jitter, it sends the
 * engine's request and feeds it the reply; allowances are installed into
 * the buckets atomically (bucket.h), so acquirers never wait.
 *
 * A cluster (docs/operations.md "Agents in a cluster"): the coordinator
 * option is a seed list, and the agent keeps ONE session, with the
 * member that leads. Every member it knows has a socket of its own,
 * dialled from the start (so a switch finds a connection up), but only
 * the current one carries exchanges. An answer NOT_LEADER moves the
 * session to the leader it names at once, or, when it names none (an
 * election in progress), to the next member after a short jittered
 * pause; so does a failed exchange (a member whose connection drops
 * fails its exchange at once: pipe events) and a Welcome or Reply from a
 * lower epoch than one already seen (a deposed leader, dropped
 * unapplied: fencing, sync_core.c). Each Welcome, Reply and NOT_LEADER
 * names every member, and the agent adds those it did not know: the
 * seed list is only where it starts. The allowances in force and their
 * lease carry on across a switch (fail-static, then each quota's
 * fallback); the new leader does not know the session, answers
 * UNKNOWN_SESSION, and the agent registers again, as after a restart.
 * Only after every known member failed in a row does the engine's
 * backoff apply.
 *
 * Threads: nng completes each exchange on its own threads; the completion
 * only records the result and wakes the loop with uv_async_send. Engine
 * state is touched by the loop thread alone. Destroy wakes the loop,
 * which cancels any exchange in flight, sends a graceful Leave (bounded
 * to 300 ms), closes its handles and exits; uv_loop_close() must succeed.
 *
 * Certificate rotation (allot_agent_reload_tls(), tls_reload.h) is done
 * on the loop thread too: it replaces every member's signer at once and
 * gives each a new dialer, started when its connection drops (a pipe
 * event wakes the loop then). After every exchange and lease check the
 * loop publishes each key's lease, fallback state and allowance for
 * allot_key_stats (atomics: readers on other threads never wait).
 */
#include "sync_int.h"
#include "sign.h"

#include <stdio.h>
#include <stdlib.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>

#include <nng/nng.h>
#include <uv.h>

#include "dial.h"
#include "exchange.h"
#include "tail.h"
#include "tls_reload.h"

/* Members known at once: the seeds and those the cluster named. */
#define MAX_MEMBERS 16u
#define NAME_MAX_LEN 64u

/* One coordinator the agent knows: a seed, or a member a Welcome, Reply
 * or NOT_LEADER named. Its socket stays open and dialled. */
struct member {
	char name[NAME_MAX_LEN]; /* the seed's NAME=, else its URL */
	char url[ALLOT__URL_MAX];
	bool seed;
	bool listed; /* in the last member list the cluster sent */
	uint64_t failed_ns; /* when an exchange with it last failed */
	allot__exchange x;
	/* The tail path's Asks, one per flight, beside x (tail.h). */
	allot__exchange ax[ALLOT__TAIL_FLIGHTS];
	allot__tlsdial td; /* its dialers, for certificate rotation */
	allot__signer *signer; /* for its URL (sign.h); NULL: none */
};

struct allot__sync {
	allot_agent *a;
	allot__installer in; /* given by agent.c */
	uv_loop_t loop;
	uv_thread_t thread;
	uv_async_t wake;
	uv_timer_t check; /* early asks (check_early) */
	uv_timer_t timer; /* the session's next exchange */
	_Atomic int stopping;

	allot__syncc core; /* the one session */
	size_t n;
	struct member m[MAX_MEMBERS];
	size_t cur; /* the member the session talks to */
	uint32_t failed_row; /* members failed in a row (backoff after n) */
	char *cache_path; /* a->opts.config_cache_file, copied; or NULL */
	_Atomic uint32_t n_pub;
	_Atomic uint64_t switches;

	/* Certificate rotation: asked from other threads, the automatic
	 * check's timer, and the pipe events' wake-up while a new dialer
	 * waits (link_wakers counts those in progress, for the close). */
	allot__tlsreq rl;
	uv_timer_t tls_timer;
	bool tls_timer_init;
	allot__tlsfiles tls_seen;
	_Atomic bool swap_pending;
	_Atomic bool link_wake_off;
	_Atomic int link_wakers;

	struct keypub *pub; /* quota_cap: each key's state, for stats */
	uint64_t denylog_ns; /* the denial log's last look (denylog.c) */

	/* The tail path (tail.h): its engine, the member its Ask in
	 * flight went to, and the timer of the next waiter's deadline. */
	allot__tail tail;
	bool tail_init;
	size_t tail_member[ALLOT__TAIL_FLIGHTS];
	uv_timer_t tail_timer;
};

static uint64_t
now_ns(const allot_agent *a)
{
	return allot__agent_now(a);
}

static uint32_t
request_timeout_ms(const allot_agent *a)
{
	return allot__exchange_timeout_ms(a->opts.sync_interval_ms);
}

/* An exchange completed (on an nng thread): wake the loop. */
static void
wake_loop(void *ctx)
{
	uv_async_send(ctx);
}

/* With several members: while an exchange is in flight, look every half
 * interval whether the member's connection is gone (a killed process):
 * then fail the exchange now rather than at its timeout. */
static uint64_t
watch_ms(const struct allot__sync *s)
{
	uint64_t t = s->a->opts.sync_interval_ms / 2;
	return t < 10 ? 10 : t;
}

/* ---- certificate rotation ---- */

/* The loop thread's own agent, so that a reload asked from a log handler
 * runs at once instead of waiting for itself. */
static _Thread_local const struct allot__sync *loop_of;

/* A member's connection count changed (on an nng thread): wake the loop
 * if a new dialer waits for the connection to drop. */
static void
link_changed(void *ctx)
{
	struct allot__sync *s = ctx;
	atomic_fetch_add(&s->link_wakers, 1);
	if (!atomic_load(&s->link_wake_off) && atomic_load(&s->swap_pending))
		uv_async_send(&s->wake);
	atomic_fetch_sub(&s->link_wakers, 1);
}

/* Before the wake-up handle closes: no pipe event may use it any more. */
static void
link_wake_off(struct allot__sync *s)
{
	atomic_store(&s->link_wake_off, true);
	while (atomic_load(&s->link_wakers) > 0)
		sched_yield();
}

/* Start the new dialers of the members whose connection is gone. */
static void
swap_dialers(struct allot__sync *s)
{
	if (!atomic_load(&s->swap_pending))
		return;
	bool waiting = false;
	for (size_t i = 0; i < s->n; i++) {
		struct member *mb = &s->m[i];
		if (allot__tlsdial_swap(&mb->td, &mb->x.link))
			allot__log(&s->a->log, ALLOT_LOG_NOTICE,
			    "ALLOT-TLS-SWAP",
			    "connecting to %s with the new certificate",
			    mb->url);
		waiting |= nng_dialer_id(mb->td.next) > 0;
	}
	atomic_store(&s->swap_pending, waiting);
}

/* New signers and unstarted dialers for every tls+tcp:// member, from
 * the files read now, into `sg` and `d` (n each). */
static int
reload_prepare(struct allot__sync *s, allot__signer **sg, nng_dialer *d,
    char *err, size_t errlen)
{
	const allot_agent_options *o = &s->a->opts;
	size_t ntls = 0;
	for (size_t i = 0; i < s->n; i++)
		ntls += strncmp(s->m[i].url, "tls+tcp", 7) == 0;
	if (ntls == 0) {
		snprintf(err, errlen, "no tls+tcp:// coordinator");
		return ALLOT_ESTATE;
	}
	nng_tls_config *cfg;
	int rc = allot__tls_load(o, &cfg, err, errlen);
	if (rc != ALLOT_OK)
		return rc;
	for (size_t i = 0; rc == ALLOT_OK && i < s->n; i++) {
		struct member *mb = &s->m[i];
		if (strncmp(mb->url, "tls+tcp", 7) != 0)
			continue;
		if (o->tls_cert_key_file != NULL &&
		    (rc = allot__signer_new(o->tls_cert_key_file, mb->url, err,
		         errlen, &sg[i])) != ALLOT_OK) {
			rc = rc == ALLOT_EINVAL ? ALLOT_ECONFIG : rc;
			break;
		}
		int rv = allot__dialer_new(
		    mb->x.sock, mb->url, cfg, false, &d[i]);
		if (rv != 0) {
			snprintf(
			    err, errlen, "%s: %s", mb->url, nng_strerror(rv));
			rc = rv == NNG_ENOMEM ? ALLOT_ENOMEM : ALLOT_EIO;
		}
	}
	nng_tls_config_free(cfg); /* the dialers hold their own */
	return rc;
}

/* allot_agent_reload_tls() on the loop thread: all or nothing. */
static int
reload(struct allot__sync *s)
{
	allot_agent *a = s->a;
	char err[512] = "out of memory";
	allot__signer **sg = calloc(s->n, sizeof *sg);
	nng_dialer *d = calloc(s->n, sizeof *d);
	int rc = sg == NULL || d == NULL ?
	    ALLOT_ENOMEM :
	    reload_prepare(s, sg, d, err, sizeof err);
	for (size_t i = 0; sg != NULL && d != NULL && i < s->n; i++) {
		struct member *mb = &s->m[i];
		if (rc != ALLOT_OK) {
			allot__signer_free(sg[i]);
			if (nng_dialer_id(d[i]) > 0)
				nng_dialer_close(d[i]);
			continue;
		}
		if (sg[i] != NULL) {
			allot__signer_free(mb->signer);
			mb->signer = sg[i];
			if (i == s->cur)
				s->core.signer = sg[i];
		}
		if (nng_dialer_id(d[i]) > 0)
			allot__tlsdial_set_next(&mb->td, d[i]);
	}
	free(sg);
	free(d);
	if (rc != ALLOT_OK) {
		allot__log(&a->log, ALLOT_LOG_ERR, "ALLOT-TLS-RELOAD",
		    "certificates not reloaded, the current ones stay in "
		    "use: %s",
		    err);
		return rc;
	}
	allot__log(&a->log, ALLOT_LOG_NOTICE, "ALLOT-TLS-RELOAD",
	    "reloaded %s and %s: Registers are signed with the new key, "
	    "and the next connection presents the new certificate; the "
	    "session continues",
	    a->opts.tls_ca_file,
	    a->opts.tls_cert_key_file != NULL ? a->opts.tls_cert_key_file :
	                                        "no certificate");
	atomic_store(&s->swap_pending, true);
	swap_dialers(s);
	return ALLOT_OK;
}

/* The automatic mode: reload when the files' metadata changed (a file
 * caught half written fails to load and is retried at its next change). */
static void
on_tls_check(uv_timer_t *t)
{
	struct allot__sync *s = t->data;
	allot__tlsfiles f = allot__tls_files_look(&s->a->opts);
	if (f.h == s->tls_seen.h)
		return;
	s->tls_seen = f;
	(void) reload(s);
}

static void
tls_check_start(struct allot__sync *s)
{
	uint32_t ms = s->a->opts.tls_reload_check_ms;
	loop_of = s;
	if (ms == 0 || s->a->opts.tls_ca_file == NULL)
		return;
	uv_timer_init(&s->loop, &s->tls_timer);
	s->tls_timer.data = s;
	s->tls_timer_init = true;
	uv_timer_start(&s->tls_timer, on_tls_check, ms, ms);
}

int
allot_agent_reload_tls(allot_agent *a)
{
	if (a == NULL)
		return ALLOT_EINVAL;
	struct allot__sync *s = a->sync;
	if (s == NULL || a->opts.tls_ca_file == NULL)
		return ALLOT_ESTATE;
	if (loop_of == s)
		return reload(s);
	return allot__tlsreq_ask(&s->rl, wake_loop, &s->wake);
}

/* ---- each key's state, for allot_key_stats ---- */

struct keypub {
	_Atomic bool in_fallback;
	_Atomic int64_t lease_until_ms; /* the agent's clock; 0: none */
	_Atomic double rate;
	_Atomic double burst;
};

/* Publish every key's state (loop thread, next to the exchange or lease
 * check it follows). */
static void
publish(struct allot__sync *s)
{
	allot_agent *a = s->a;
	const allot__syncc *c = &s->core;
	if (s->tail_init)
		allot__tail_publish(&s->tail, c);
	uint32_t nq = atomic_load_explicit(&a->nquotas, memory_order_relaxed);
	bool fb = atomic_load(&c->in_fallback);
	int64_t until = (int64_t) (c->lease_until_ns / 1000000u);
	for (uint32_t k = 0; k < nq; k++) {
		const allot__qsync *q = &c->q[k];
		struct keypub *p = &s->pub[k];
		atomic_store_explicit(
		    &p->in_fallback, fb, memory_order_relaxed);
		atomic_store_explicit(
		    &p->lease_until_ms, until, memory_order_relaxed);
		if (!q->has_share)
			continue;
		atomic_store_explicit(
		    &p->rate, q->share_rate, memory_order_relaxed);
		atomic_store_explicit(
		    &p->burst, q->share_burst, memory_order_relaxed);
	}
}

void
allot__sync_key_state(allot_agent *a, uint32_t quota, allot_key_stats *ret)
{
	struct allot__sync *s = a->sync;
	if (s == NULL ||
	    quota >= atomic_load_explicit(&a->nquotas, memory_order_relaxed))
		return;
	const struct keypub *p = &s->pub[quota];
	ret->in_fallback = atomic_load_explicit(
	    &p->in_fallback, memory_order_relaxed);
	int64_t until = atomic_load_explicit(
	    &p->lease_until_ms, memory_order_relaxed);
	ret->lease_remaining_ms = until == 0 ?
	    0 :
	    until - (int64_t) (allot__agent_now(a) / 1000000u);
	ret->granted_rate = atomic_load_explicit(
	    &p->rate, memory_order_relaxed);
	ret->granted_burst = atomic_load_explicit(
	    &p->burst, memory_order_relaxed);
}

/* Dial `url` (dial.h) with this replica's TLS files; plain TCP is
 * logged as fit for local use only. */
static int
dial(allot_agent *a, nng_socket sock, const char *url, nng_dialer *ret)
{
	if (strncmp(url, "tcp://", 6) == 0)
		allot__log(&a->log, ALLOT_LOG_NOTICE, "ALLOT-SYNC-PLAIN",
		    "coordinator %s over plain TCP: local use only, "
		    "use tls+tcp:// across hosts",
		    url);
	const allot_agent_options *o = &a->opts;
	return allot__dial_keep(sock, url, o->tls_ca_file,
	    o->tls_cert_key_file, o->tls_server_name, ret);
}

/* Over mutual TLS, prove in every Register that this replica holds its
 * certificate's key (sign.h): allotd binds the session to that identity,
 * and the proof names the URL dialled, so each member has its own. */
static int
member_signer(allot_agent *a, struct member *mb)
{
	if (strncmp(mb->url, "tls+tcp", 7) != 0 ||
	    a->opts.tls_cert_key_file == NULL)
		return ALLOT_OK;
	char err[256];
	int rc = allot__signer_new(
	    a->opts.tls_cert_key_file, mb->url, err, sizeof err, &mb->signer);
	if (rc != ALLOT_OK)
		allot__log(&a->log, ALLOT_LOG_ERR, "ALLOT-SYNC-IDENTITY",
		    "cannot sign Registers for %s: %s", mb->url, err);
	return rc;
}

static void
member_close(struct member *mb)
{
	allot__tlsdial_fini(&mb->td);
	for (uint32_t f = 0; f < ALLOT__TAIL_FLIGHTS; f++)
		allot__exchange_close(&mb->ax[f]);
	allot__exchange_close(&mb->x);
	allot__signer_free(mb->signer);
	mb->signer = NULL;
}

/* Open a socket to `url` in the next slot and start dialling it. On
 * anything but ALLOT_OK the slot is left free. */
static int
member_add(struct allot__sync *s, const char *name, const char *url, bool seed)
{
	allot_agent *a = s->a;
	if (s->n == MAX_MEMBERS)
		return ALLOT_EFULL;
	struct member *mb = &s->m[s->n];
	memset(mb, 0, sizeof *mb);
	if (strlen(url) >= sizeof mb->url || url[0] == '\0')
		return ALLOT_EINVAL;
	snprintf(mb->name, sizeof mb->name, "%s", name);
	strcpy(mb->url, url);
	mb->seed = seed;
	mb->listed = !seed;
	allot__exchange_opts xo = {
		.reconnect_min_ms = a->opts.reconnect_min_ms,
		.reconnect_max_ms = a->opts.reconnect_max_ms,
		.recv_max = 4u << 20,
		.watch_link = true, /* a drop fails the exchange at once */
		.wake = wake_loop,
		.wake_ctx = &s->wake,
	};
	bool opened = allot__exchange_open(&mb->x, &xo) == 0;
	for (uint32_t f = 0; opened && f < ALLOT__TAIL_FLIGHTS; f++)
		opened = allot__exchange_open_beside(
		             &mb->ax[f], &mb->x, wake_loop, &s->wake) == 0;
	if (!opened) {
		member_close(mb);
		return ALLOT_ENOMEM;
	}
	mb->x.link.on_change = link_changed;
	mb->x.link.on_change_ctx = s;
	int rv = dial(a, mb->x.sock, mb->url, &mb->td.cur);
	if (rv != 0) {
		allot__log(&a->log, ALLOT_LOG_ERR, "ALLOT-SYNC-ADDRESS",
		    "cannot use coordinator address \"%s\": %s", mb->url,
		    nng_strerror(rv));
		member_close(mb);
		return ALLOT_EINVAL;
	}
	int rc = member_signer(a, mb);
	if (rc != ALLOT_OK) {
		member_close(mb);
		return rc;
	}
	s->n++;
	atomic_store(&s->n_pub, (uint32_t) s->n);
	return ALLOT_OK;
}

static int
member_find(const struct allot__sync *s, const char *url)
{
	for (size_t i = 0; i < s->n; i++)
		if (strcmp(s->m[i].url, url) == 0)
			return (int) i;
	return -1;
}

/* The member list of a Welcome, Reply or NOT_LEADER (sync_core.c): new
 * members are added and dialled; those no longer named (removed from the
 * cluster) are skipped from now on, seeds apart. */
static void
learn(void *ctx, char *const *urls, size_t n)
{
	struct allot__sync *s = ctx;
	for (size_t i = 0; i < s->n; i++)
		s->m[i].listed = false;
	for (size_t i = 0; i < n; i++) {
		if (urls[i] == NULL || urls[i][0] == '\0')
			continue;
		int j = member_find(s, urls[i]);
		if (j < 0 &&
		    member_add(s, urls[i], urls[i], false) == ALLOT_OK) {
			j = (int) s->n - 1;
			allot__log(&s->a->log, ALLOT_LOG_INFO,
			    "ALLOT-SYNC-MEMBER",
			    "the cluster names member %s: added", urls[i]);
		}
		if (j >= 0)
			s->m[j].listed = true;
	}
}

/* Move the session to member `i`: the allowances in force and their
 * lease stay; the next exchange goes there. */
static void
switch_to(struct allot__sync *s, size_t i, const char *why)
{
	if (i == s->cur)
		return;
	const char *from = s->m[s->cur].url;
	s->cur = i;
	s->core.peer = s->m[i].url;
	s->core.signer = s->m[i].signer;
	allot__syncc_moved(&s->core);
	atomic_fetch_add(&s->switches, 1);
	allot__log(&s->a->log, ALLOT_LOG_NOTICE, "ALLOT-SYNC-LEADER",
	    "following %s instead of %s: %s; allowances keep their lease "
	    "meanwhile",
	    s->m[i].url, from, why);
}

/* The member after the current one, skipping those the cluster no
 * longer names (seeds are always tried). */
static size_t
next_member(const struct allot__sync *s)
{
	for (size_t k = 1; k < s->n; k++) {
		size_t i = (s->cur + k) % s->n;
		if (s->m[i].seed || s->m[i].listed)
			return i;
	}
	return s->cur;
}

/* ---- the loop ---- */

static void on_timer(uv_timer_t *t);

static void
schedule(struct allot__sync *s, uint64_t delay_ms)
{
	uv_timer_start(&s->timer, on_timer, delay_ms, 0);
}

/* A short jittered pause before asking another member: a quarter to a
 * half interval, so that an election has a moment to finish and the
 * agents that lost the same leader do not all arrive at once. */
static uint64_t
pause_ms(struct allot__sync *s, uint64_t now)
{
	uint64_t q = s->a->opts.sync_interval_ms / 4;
	if (q < 5)
		q = 5;
	return q + allot__mix64(now ^ s->core.rng) % (q + 1);
}

/* After a failed exchange: the next member after a short pause, until
 * every known member failed in a row; then the engine's backoff. */
static void
exchange_failed(struct allot__sync *s, uint64_t now, const char *why)
{
	allot__syncc_failed(&s->core, now, why);
	if (s->n == 1) {
		schedule(s, allot__syncc_next_delay_ms(&s->core, now, false));
		return;
	}
	s->m[s->cur].failed_ns = now;
	switch_to(s, next_member(s), "the exchange failed");
	if (++s->failed_row < s->n) {
		schedule(s, pause_ms(s, now));
		return;
	}
	/* Every member failed in a row: the engine's backoff, capped at
	 * two intervals, so that the agent is back soon after a new
	 * leader serves (it learns from the agents that arrive, and one
	 * that arrives late finds the quota handed out). */
	s->failed_row = 0;
	uint64_t d = allot__syncc_next_delay_ms(&s->core, now, false);
	uint64_t cap = 2 * (uint64_t) s->a->opts.sync_interval_ms;
	schedule(s, d < cap ? d : cap / 2 + pause_ms(s, now));
}

static void
start_exchange(struct allot__sync *s)
{
	allot_agent *a = s->a;
	struct member *mb = &s->m[s->cur];
	uint64_t now = now_ns(a);
	void *buf;
	size_t len;
	if (s->n > 1 && allot__exchange_lost(&mb->x)) {
		exchange_failed(s, now, "connection lost");
		return;
	}
	if (allot__syncc_request(&s->core, now, &buf, &len) != ALLOT_OK) {
		exchange_failed(s, now, "out of memory");
		return;
	}
	int rv = allot__exchange_send(&mb->x, buf, len, request_timeout_ms(a));
	free(buf);
	if (rv != 0) {
		exchange_failed(s, now, "out of memory");
		return;
	}
	if (s->n > 1)
		schedule(s, watch_ms(s));
	/* An exchange may take up to its timeout, and nothing else wakes
	 * the loop meanwhile: if the lease runs out first, wake up then so
	 * that the fallback starts on time, not when the exchange gives up
	 * (on_timer only checks the lease while an exchange is in flight;
	 * the completion re-arms the timer). */
	const allot__syncc *c = &s->core;
	if (c->lease_until_ns != 0 && !atomic_load(&c->in_fallback)) {
		uint64_t left = c->lease_until_ns > now ?
		    (c->lease_until_ns - now) / 1000000u + 1 :
		    0;
		if (left < request_timeout_ms(a) &&
		    (s->n == 1 || left < watch_ms(s)))
			schedule(s, left);
	}
}

/* Where the answer says to go next (sync_core.c sets it): the leader a
 * NOT_LEADER names, at once; another member after a pause when it names
 * none or the answer came from a lower epoch. */
static void
follow(struct allot__sync *s, uint64_t now)
{
	allot__route r = allot__syncc_take_route(&s->core);
	if (r == ALLOT__ROUTE_LEADER) {
		int i = member_find(s, s->core.leader);
		if (i < 0 &&
		    member_add(s, s->core.leader, s->core.leader, false) ==
		        ALLOT_OK)
			i = (int) s->n - 1;
		/* A follower may still name a leader that just stopped
		 * answering us (it has not noticed yet): that one waits its
		 * turn like the others. */
		uint64_t recent = 2 * (uint64_t) request_timeout_ms(s->a) *
		    1000000u;
		if (i >= 0 && (size_t) i != s->cur &&
		    (s->m[i].failed_ns == 0 ||
		        now - s->m[i].failed_ns > recent)) {
			switch_to(s, (size_t) i, "NOT_LEADER names it");
			schedule(s, 0);
			return;
		}
		/* It names itself: elected, waiting out the old lease
		 * before it serves. Ask it again after the pause. */
		if (i >= 0 && (size_t) i == s->cur) {
			s->core.leader[0] = '\0';
			schedule(s, pause_ms(s, now));
			return;
		}
	}
	/* No leader named (an election), or it named itself, or the
	 * answer was from a deposed leader. */
	switch_to(s, next_member(s),
	    r == ALLOT__ROUTE_NEXT && s->core.leader[0] == '\0' ?
	        "NOT_LEADER, no leader known yet" :
	        "no leader there");
	s->core.leader[0] = '\0';
	schedule(s, pause_ms(s, now));
}

static void
complete(struct allot__sync *s)
{
	int result;
	nng_msg *reply;
	struct member *mb = &s->m[s->cur];
	if (!allot__exchange_finish(&mb->x, &result, &reply))
		return;
	uint64_t now = now_ns(s->a);
	if (result != 0) {
		exchange_failed(s, now, nng_strerror(result));
		allot__syncc_check_lease(&s->core, now);
		return;
	}
	bool ok = allot__syncc_reply(
	    &s->core, now, nng_msg_body(reply), nng_msg_len(reply));
	nng_msg_free(reply);
	/* An answer, whatever it says: the member is up, and the members
	 * that failed before it were not all of them. */
	s->failed_row = 0;
	allot__syncc_check_lease(&s->core, now);
	if (s->core.route != ALLOT__ROUTE_STAY) {
		follow(s, now);
		return;
	}
	if (!ok && s->n > 1) {
		/* A broken answer: as a failed exchange (the engine counted
		 * it), the next member. */
		switch_to(s, next_member(s), "a failed answer");
		schedule(s, pause_ms(s, now));
		return;
	}
	schedule(s, allot__syncc_next_delay_ms(&s->core, now, ok));
}

/* ---- the tail path (tail.h) ---- */

static void tail_service(struct allot__sync *s);

static void
on_tail_timer(uv_timer_t *t)
{
	tail_service(t->data);
}

/* A caller queued a waiter (on its own thread). */
static void
tail_wake(void *ctx)
{
	uv_async_send(ctx);
}

/* Everything the tail path has to do now: collect the answer to the Ask
 * in flight, deny the waiters whose deadline passed, send the next Ask
 * to the member the session is with, and wake up again at the next
 * deadline. */
static void
tail_service(struct allot__sync *s)
{
	allot__tail *t = &s->tail;
	uint64_t now = now_ns(s->a);
	for (uint32_t f = 0; f < ALLOT__TAIL_FLIGHTS; f++) {
		int result;
		nng_msg *reply;
		if (!t->fl[f].busy ||
		    !allot__exchange_finish(
		        &s->m[s->tail_member[f]].ax[f], &result, &reply))
			continue;
		if (result == 0) {
			allot__tail_reply(t, &s->core, f, now,
			    nng_msg_body(reply), nng_msg_len(reply));
			nng_msg_free(reply);
		} else if (result == NNG_ETIMEDOUT) {
			allot__tail_lost(t, f, now);
		} else {
			allot__tail_failed(t, f, true, now);
		}
	}
	allot__tail_publish(t, &s->core);
	void *buf;
	size_t len;
	uint32_t to, f;
	uint64_t at = UINT64_MAX;
	while (allot__tail_has_pending(t) &&
	    allot__tail_request(t, &s->core, now, &buf, &len, &to, &f, &at) ==
	        ALLOT_OK) {
		s->tail_member[f] = s->cur;
		if (allot__exchange_send(&s->m[s->cur].ax[f], buf, len, to) !=
		    0)
			allot__tail_failed(t, f, false, now);
		free(buf);
	}
	uint64_t next = allot__tail_expire(t, now);
	if (at < next)
		next = at;
	if (next != UINT64_MAX)
		uv_timer_start(&s->tail_timer, on_tail_timer,
		    (next - now + 999999u) / 1000000u, 0);
	else
		uv_timer_stop(&s->tail_timer);
}

bool
allot__sync_on_loop(const allot_agent *a)
{
	return a->sync != NULL && loop_of == a->sync;
}

static void
on_wake(uv_async_t *h)
{
	struct allot__sync *s = h->data;
	if (atomic_load(&s->stopping)) {
		uv_stop(&s->loop);
		return;
	}
	if (allot__tlsreq_pending(&s->rl))
		allot__tlsreq_answer(&s->rl, reload(s));
	complete(s);
	swap_dialers(s);
	publish(s);
	tail_service(s);
}

static void
on_timer(uv_timer_t *t)
{
	struct allot__sync *s = t->data;
	struct member *mb = &s->m[s->cur];
	allot__syncc_check_lease(&s->core, now_ns(s->a));
	publish(s);
	if (allot__exchange_busy(&mb->x)) {
		if (s->n == 1)
			return;
		/* The watch: its completion re-arms the timer. */
		if (allot__exchange_lost(&mb->x))
			allot__exchange_cancel(&mb->x);
		else
			schedule(s, watch_ms(s));
		return;
	}
	start_exchange(s);
}

/* Every eighth of an interval: a session whose agent started denying a
 * key runs its exchange now instead of at its timer (sync_int.h
 * allot__syncc_early_due(): counters only, bounded to one early Sync
 * per quarter interval and per onset of denials). Leases are checked
 * here too: an early exchange stops the timer, which is what notices a
 * lease running out while an exchange is in flight. */
static void
check_early(uv_timer_t *t)
{
	struct allot__sync *s = t->data;
	uint64_t now = now_ns(s->a);
	allot__syncc_check_lease(&s->core, now);
	allot__syncc_tick(&s->core, now);
	publish(s);
	if (s->denylog_ns == 0)
		s->denylog_ns = now;
	else if (now - s->denylog_ns >= ALLOT__DENYLOG_NS) {
		allot__denylog(s->a, now - s->denylog_ns);
		s->core.nstrangers = allot__strangers_take(
		    s->a, s->core.strangers);
		s->denylog_ns = now;
	}
	if (allot__exchange_busy(&s->m[s->cur].x) ||
	    !allot__syncc_early_due(&s->core, now))
		return;
	uv_timer_stop(&s->timer);
	start_exchange(s);
}

static uint64_t
check_ms(const allot_agent *a)
{
	uint64_t t = a->opts.sync_interval_ms / 8;
	return t > 0 ? t : 1;
}

static void
send_leave(struct allot__sync *s)
{
	void *buf;
	size_t len;
	if (allot__syncc_leave(&s->core, &buf, &len) != ALLOT_OK)
		return;
	(void) allot__exchange_call(&s->m[s->cur].x, buf, len, 300);
	free(buf);
	allot__log(&s->a->log, ALLOT_LOG_INFO, "ALLOT-SYNC-LEAVE",
	    "left session %llu", (unsigned long long) s->core.session);
}

static void
close_cb(uv_handle_t *h)
{
	(void) h;
}

static void
thread_main(void *arg)
{
	struct allot__sync *s = arg;
	loop_of = s;
	schedule(s, 0);
	tls_check_start(s);
	uv_timer_start(&s->check, check_early, check_ms(s->a), check_ms(s->a));
	uv_run(&s->loop, UV_RUN_DEFAULT);
	link_wake_off(s);
	if (s->tls_timer_init)
		uv_close((uv_handle_t *) &s->tls_timer, close_cb);
	/* Stopping: cancel the exchanges in flight, deny whoever still
	 * waits for the reserve, then leave. */
	for (size_t i = 0; i < s->n; i++) {
		for (uint32_t f = 0; f < ALLOT__TAIL_FLIGHTS; f++)
			allot__exchange_stop(&s->m[i].ax[f]);
		allot__exchange_stop(&s->m[i].x);
	}
	s->a->tail = NULL;
	allot__tail_fini(&s->tail, now_ns(s->a));
	s->tail_init = false;
	send_leave(s);
	uv_close((uv_handle_t *) &s->tail_timer, close_cb);
	uv_close((uv_handle_t *) &s->timer, close_cb);
	uv_close((uv_handle_t *) &s->check, close_cb);
	uv_close((uv_handle_t *) &s->wake, close_cb);
	uv_run(&s->loop, UV_RUN_DEFAULT);
}

static void
sync_free(struct allot__sync *s)
{
	if (s->tail_init)
		allot__tail_fini(&s->tail, now_ns(s->a));
	for (size_t i = 0; i < s->n; i++)
		member_close(&s->m[i]);
	allot__syncc_fini(&s->core);
	free(s->pub);
	free(s->cache_path);
	allot__tlsreq_fini(&s->rl);
	free(s);
}

/* The seed list: comma-separated entries, each a URL or NAME=URL (the
 * name only labels log lines). Returns ALLOT_OK, or ALLOT_EINVAL with
 * the reason logged. */
static int
seeds_open(struct allot__sync *s, const char *list)
{
	allot_agent *a = s->a;
	const char *p = list;
	int rc = ALLOT_OK;
	while (rc == ALLOT_OK) {
		const char *end = strchr(p, ',');
		size_t len = end != NULL ? (size_t) (end - p) : strlen(p);
		char one[NAME_MAX_LEN + ALLOT__URL_MAX];
		if (len == 0 || len >= sizeof one) {
			allot__log(&a->log, ALLOT_LOG_ERR,
			    "ALLOT-SYNC-ADDRESS",
			    "cannot use coordinator list \"%s\": %s", list,
			    len == 0 ? "an empty entry" : "an entry too long");
			return ALLOT_EINVAL;
		}
		memcpy(one, p, len);
		one[len] = '\0';
		char *url = one, *name = one;
		char *eq = strchr(one, '=');
		char *sep = strstr(one, "://");
		if (eq != NULL && (sep == NULL || eq < sep)) {
			*eq = '\0';
			url = eq + 1;
		}
		if (member_find(s, url) >= 0) {
			allot__log(&a->log, ALLOT_LOG_ERR,
			    "ALLOT-SYNC-ADDRESS",
			    "cannot use coordinator list \"%s\": %s is "
			    "listed twice",
			    list, url);
			return ALLOT_EINVAL;
		}
		rc = member_add(s, name, url, true);
		if (rc == ALLOT_EFULL)
			allot__log(&a->log, ALLOT_LOG_ERR,
			    "ALLOT-SYNC-ADDRESS",
			    "cannot use coordinator list \"%s\": more "
			    "than %u entries",
			    list, MAX_MEMBERS);
		if (end == NULL)
			break;
		p = end + 1;
	}
	return rc == ALLOT_EFULL ? ALLOT_EINVAL : rc;
}

int
allot__sync_start(allot_agent *a, const allot__installer *in)
{
	struct allot__sync *s = calloc(1, sizeof *s);
	if (s == NULL)
		return ALLOT_ENOMEM;
	s->a = a;
	s->in = *in;
	allot__tlsreq_init(&s->rl);
	uint32_t cap = a->quota_cap > 0 ? a->quota_cap : 1;
	s->pub = calloc(cap, sizeof *s->pub);
	if (a->opts.config_cache_file != NULL &&
	    a->opts.config_cache_file[0] != '\0')
		s->cache_path = strdup(a->opts.config_cache_file);
	if (s->pub == NULL ||
	    (a->opts.config_cache_file != NULL &&
	        a->opts.config_cache_file[0] != '\0' &&
	        s->cache_path == NULL) ||
	    allot__syncc_create(&s->core, a,
	        allot__hash_seed() ^ (uint64_t) getpid(),
	        &s->in) != ALLOT_OK) {
		sync_free(s);
		return ALLOT_ENOMEM;
	}
	s->core.cache_path = s->cache_path;
	s->core.learn = learn;
	s->core.learn_ctx = s;
	/* Sockets are opened before the loop exists: the wake handle is
	 * only used by nng once an exchange or a pipe event happens, and
	 * the loop thread starts below. */
	int rc = seeds_open(s, a->coordinator);
	if (rc != ALLOT_OK) {
		sync_free(s);
		return rc;
	}
	s->cur = 0;
	s->core.peer = s->n > 1 ? s->m[0].url : NULL;
	s->core.signer = s->m[0].signer;
	if (uv_loop_init(&s->loop) != 0) {
		sync_free(s);
		return ALLOT_ENOMEM;
	}
	uv_timer_init(&s->loop, &s->timer);
	s->timer.data = s;
	uv_async_init(&s->loop, &s->wake, on_wake);
	s->wake.data = s;
	s->tls_seen = allot__tls_files_look(&a->opts);
	uv_timer_init(&s->loop, &s->check);
	s->check.data = s;
	uv_timer_init(&s->loop, &s->tail_timer);
	s->tail_timer.data = s;
	if (allot__tail_init(&s->tail, a, tail_wake, &s->wake) == ALLOT_OK)
		s->tail_init = true;
	a->sync = s;
	a->tail = s->tail_init ? &s->tail : NULL;
	if (uv_thread_create(&s->thread, thread_main, s) != 0) {
		a->tail = NULL;
		uv_close((uv_handle_t *) &s->tail_timer, NULL);
		uv_close((uv_handle_t *) &s->timer, NULL);
		uv_close((uv_handle_t *) &s->wake, NULL);
		uv_close((uv_handle_t *) &s->check, NULL);
		uv_run(&s->loop, UV_RUN_DEFAULT);
		uv_loop_close(&s->loop);
		a->sync = NULL;
		sync_free(s);
		return ALLOT_ENOMEM;
	}
	return ALLOT_OK;
}

void
allot__sync_stop(allot_agent *a)
{
	struct allot__sync *s = a->sync;
	if (s == NULL)
		return;
	atomic_store(&s->stopping, 1);
	uv_async_send(&s->wake);
	uv_thread_join(&s->thread);
	int rc = uv_loop_close(&s->loop);
	if (rc != 0)
		allot__log(&a->log, ALLOT_LOG_ERR, "ALLOT-SYNC-CLOSE",
		    "sync loop closed with handles open: %s", uv_strerror(rc));
	sync_free(s);
	a->sync = NULL;
}

int
allot_sync_stats_get_sized(allot_agent *a, allot_sync_stats *ret, size_t size)
{
	if (a == NULL || ret == NULL)
		return ALLOT_EINVAL;
	/* Filled whole here, then the fields the caller knows (allot.h,
	 * "Structs that grow"). */
	allot_sync_stats st;
	memset(&st, 0, sizeof st);
	if (a->sync != NULL) {
		struct allot__sync *s = a->sync;
		allot__syncc_stats(&s->core, now_ns(a), &st);
		allot__tail_stats(&s->tail, &st);
		st.members = atomic_load(&s->n_pub);
		st.leader_switches = atomic_load(&s->switches);
	}
	memcpy(ret, &st, size < sizeof st ? size : sizeof st);
	return ALLOT_OK;
}

/* Programs built before the _sized calls: the struct of this release. */
int(allot_sync_stats_get)(allot_agent *a, allot_sync_stats *ret)
{
	return allot_sync_stats_get_sized(a, ret, sizeof *ret);
}
