/* SPDX-License-Identifier: MIT */
/*
 * The agent's sync transport: a libuv loop on the agent's own thread that
 * runs the sync engine (sync_core.c) against allotd over nng REQ/REP
 * (schema/allot.proto). Every interval T, with jitter, it sends the
 * engine's request and feeds it the reply; allowances are installed into
 * the buckets atomically (bucket.h), so acquirers never wait.
 *
 * Cluster mode (several coordinator addresses): one session per member,
 * each on its own socket and timer; every key is reported to, and takes
 * its allowance from, its owner by rendezvous hashing (rendezvous.h)
 * over the members that answer. A member that misses MEMBER_DOWN_AFTER
 * exchanges in a row is marked down and its keys go to their next
 * owner, keeping their allowance (fail-static) until it answers; it is
 * still probed, and its first reply moves its keys back. A member
 * whose connection drops fails its exchange at once (pipe events), so a
 * killed member is down within about one interval. A key keeps the
 * allowance it runs on, and that allowance's lease, across a move, and
 * its reports tell the new owner what it holds (KeyReport.foreign); a
 * member that says it does not own a key (Reply.not_owner) renews no
 * lease for it, so the key falls back when the lease ends.
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
#include "rendezvous.h"
#include "tls_reload.h"

/* Consecutive failed exchanges (timeouts, transport errors) after which
 * a cluster member is taken as down and its keys re-routed; a single
 * lost exchange is retried first. */
#define MEMBER_DOWN_AFTER 2u

/* One session with one coordinator (one cluster member). */
struct member {
	struct allot__sync *s;
	allot__syncc core;
	allot__member m;
	bool *mine; /* quota_cap; NULL with a single coordinator */
	uv_timer_t timer;
	bool timer_init;

	/* Cluster mode watches the connection: a member whose connection
	 * dropped (a killed process) fails its exchange at once rather
	 * than at its timeout. */
	allot__exchange x;
	allot__tlsdial td; /* its dialers, for certificate rotation */
	uint32_t fails; /* consecutive failed exchanges */
	_Atomic bool down; /* read by allot_sync_stats_get() */
};

struct allot__sync {
	allot_agent *a;
	allot__installer in; /* given by agent.c, for every engine */
	uv_loop_t loop;
	uv_thread_t thread;
	uv_async_t wake;
	uv_timer_t check; /* early asks (check_early) */
	_Atomic int stopping;

	size_t n;
	struct member *m;
	uint64_t *hashes; /* n: rendezvous identity of each member */
	bool *live; /* n: scratch */
	uint64_t *keyhash; /* quota_cap: rendezvous identity of each key */
	uint32_t nhashed; /* keys with a keyhash (and an owner) so far */
	char *cache_path; /* a->opts.config_cache_file, copied; or NULL */
	_Atomic uint32_t down_pub;
	_Atomic uint64_t reroutes;

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

/* Cluster mode: while an exchange is in flight, look every half
 * interval whether the member's connection is gone (a killed process):
 * then fail the exchange now rather than at its timeout. */
static uint64_t
watch_ms(const struct member *mb)
{
	uint64_t t = mb->s->a->opts.sync_interval_ms / 2;
	return t < 10 ? 10 : t;
}

/* ---- routing (cluster mode) ---- */

/* Give every key to its owner among the members not marked down (all
 * of them when every one is down: the leases and fallbacks of the
 * static owners then apply). A key that moves keeps the allowance in
 * force (fail-static) until its new owner's next reply replaces it. */
static void
reroute(struct allot__sync *s)
{
	allot_agent *a = s->a;
	size_t up = 0;
	for (size_t i = 0; i < s->n; i++) {
		s->live[i] = !s->m[i].down;
		up += s->live[i];
	}
	atomic_store(&s->down_pub, (uint32_t) (s->n - up));
	uint64_t moved = 0;
	for (uint32_t k = 0; k < s->nhashed; k++) {
		int o = allot__rendezvous_owner(
		    s->keyhash[k], s->hashes, up > 0 ? s->live : NULL, s->n);
		int from = -1;
		for (size_t i = 0; i < s->n; i++)
			if (s->m[i].mine[k])
				from = (int) i;
		if (o < 0 || o == from)
			continue;
		/* The allowance in force, and its lease, go along. */
		uint64_t lease = 0;
		if (from >= 0) {
			const allot__syncc *c = &s->m[from].core;
			lease = c->q[k].lease_until_ns != 0 ?
			    c->q[k].lease_until_ns :
			    c->lease_until_ns;
			s->m[from].mine[k] = false;
		}
		allot__syncc_adopt_key(&s->m[o].core, k, lease);
		s->m[o].mine[k] = true;
		moved++;
	}
	for (size_t i = 0; moved > 0 && i < s->n; i++)
		allot__syncc_count_unconfirmed(&s->m[i].core);
	atomic_fetch_add(&s->reroutes, moved);
	if (moved > 0)
		allot__log(&a->log, ALLOT_LOG_NOTICE, "ALLOT-CLUSTER-REROUTE",
		    "%llu keys moved to another member (%zu of %zu members "
		    "up); they keep their allowance until the new owner "
		    "answers",
		    (unsigned long long) moved, up, s->n);
}

/* Track a member's health after an exchange: down after
 * MEMBER_DOWN_AFTER consecutive failures, up again on the first reply. */
static void
member_health(struct member *mb, bool ok)
{
	struct allot__sync *s = mb->s;
	if (mb->mine == NULL)
		return;
	if (ok) {
		mb->fails = 0;
		if (!mb->down)
			return;
		mb->down = false;
		allot__log(&s->a->log, ALLOT_LOG_NOTICE, "ALLOT-CLUSTER-UP",
		    "member %s (%s) answers again: its keys move back",
		    mb->m.name, mb->m.url);
	} else {
		if (++mb->fails < MEMBER_DOWN_AFTER || mb->down)
			return;
		mb->down = true;
		allot__log(&s->a->log, ALLOT_LOG_WARNING, "ALLOT-CLUSTER-DOWN",
		    "member %s (%s) missed %u exchanges "
		    "in a row: its keys go to their next owner",
		    mb->m.name, mb->m.url, mb->fails);
	}
	reroute(s);
}

static void schedule(struct member *mb, uint64_t delay_ms);

/* A member's engine installed a config (sync_core.c): every session
 * reports the digest in force, and in a cluster each quota it appended
 * goes to its owner like the others (every engine names them in its
 * next add_keys). */
static void
config_installed(struct allot__sync *s, const allot__syncc *from)
{
	allot_agent *a = s->a;
	for (size_t i = 0; i < s->n; i++)
		atomic_store(
		    &s->m[i].core.enforced, atomic_load(&from->enforced));
	uint32_t n = atomic_load_explicit(&a->nquotas, memory_order_relaxed);
	if (s->n < 2 || n <= s->nhashed)
		return;
	for (uint32_t k = s->nhashed; k < n; k++)
		s->keyhash[k] = allot__rendezvous_key(
		    a->service, a->quotas[k].name);
	s->nhashed = n;
	reroute(s);
	/* The other members hear of the new keys at once too (the one that
	 * sent the config does: allot__syncc_next_delay_ms()). */
	for (size_t i = 0; i < s->n; i++)
		if (&s->m[i].core != from && !allot__exchange_busy(&s->m[i].x))
			schedule(&s->m[i], 1);
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
			    mb->m.url);
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
		ntls += strncmp(s->m[i].m.url, "tls+tcp", 7) == 0;
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
		if (strncmp(mb->m.url, "tls+tcp", 7) != 0)
			continue;
		if (o->tls_cert_key_file != NULL &&
		    (rc = allot__signer_new(o->tls_cert_key_file, mb->m.url,
		         err, errlen, &sg[i])) != ALLOT_OK) {
			rc = rc == ALLOT_EINVAL ? ALLOT_ECONFIG : rc;
			break;
		}
		int rv = allot__dialer_new(
		    mb->x.sock, mb->m.url, cfg, false, &d[i]);
		if (rv != 0) {
			snprintf(err, errlen, "%s: %s", mb->m.url,
			    nng_strerror(rv));
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
			allot__signer_free(mb->core.signer);
			mb->core.signer = sg[i];
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

/* Publish every key's state from the session that owns it (loop thread;
 * O(keys x members), next to the exchange it follows). */
static void
publish(struct allot__sync *s)
{
	allot_agent *a = s->a;
	uint32_t nq = atomic_load_explicit(&a->nquotas, memory_order_relaxed);
	for (uint32_t k = 0; k < nq; k++) {
		const struct member *mb = &s->m[0];
		for (size_t i = 1; i < s->n; i++)
			if (s->m[i].mine[k])
				mb = &s->m[i];
		const allot__syncc *c = &mb->core;
		const allot__qsync *q = &c->q[k];
		bool fb = mb->mine != NULL ? q->key_fallback :
		                             atomic_load(&c->in_fallback);
		uint64_t until = mb->mine != NULL ? q->lease_until_ns :
		                                    c->lease_until_ns;
		struct keypub *p = &s->pub[k];
		atomic_store_explicit(
		    &p->in_fallback, fb, memory_order_relaxed);
		atomic_store_explicit(&p->lease_until_ms,
		    (int64_t) (until / 1000000u), memory_order_relaxed);
		if (!q->has_share)
			continue; /* a moved key: its last grant stands */
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

/* ---- the loop ---- */

static void on_timer(uv_timer_t *t);

static void
schedule(struct member *mb, uint64_t delay_ms)
{
	uv_timer_start(&mb->timer, on_timer, delay_ms, 0);
}

/* Cluster mode: the longest a member is left untried. Its keys are
 * served by the others meanwhile, but they refuse them as soon as they
 * see it back, so it must be found back about as soon (a single
 * coordinator backs off to reconnect_max_ms instead). */
static uint32_t
member_retry_ms(const allot_agent *a)
{
	uint32_t t = 2 * a->opts.sync_interval_ms;
	if (t < a->opts.reconnect_min_ms)
		t = a->opts.reconnect_min_ms;
	return t < a->opts.reconnect_max_ms ? t : a->opts.reconnect_max_ms;
}

static uint64_t
failed_delay_ms(struct member *mb, uint64_t now)
{
	uint64_t d = allot__syncc_next_delay_ms(&mb->core, now, false);
	uint32_t cap = member_retry_ms(mb->s->a);
	if (mb->mine != NULL && d > cap)
		d = cap / 2 + allot__mix64(now) % (cap / 2 + 1);
	return d;
}

static void
exchange_failed(struct member *mb, uint64_t now, const char *why)
{
	allot__syncc_failed(&mb->core, now, why);
	member_health(mb, false);
	schedule(mb, failed_delay_ms(mb, now));
}

static void
start_exchange(struct member *mb)
{
	allot_agent *a = mb->s->a;
	uint64_t now = now_ns(a);
	void *buf;
	size_t len;
	if (mb->mine != NULL && allot__exchange_lost(&mb->x)) {
		exchange_failed(mb, now, "connection lost");
		return;
	}
	if (allot__syncc_request(&mb->core, now, &buf, &len) != ALLOT_OK) {
		exchange_failed(mb, now, "out of memory");
		return;
	}
	int rv = allot__exchange_send(&mb->x, buf, len, request_timeout_ms(a));
	free(buf);
	if (rv != 0) {
		exchange_failed(mb, now, "out of memory");
		return;
	}
	if (mb->mine != NULL)
		schedule(mb, watch_ms(mb));
	/* An exchange may take up to its timeout, and nothing else wakes
	 * the loop meanwhile: if the lease runs out first, wake up then so
	 * that the fallback starts on time, not when the exchange gives up
	 * (on_timer only checks the lease while an exchange is in flight;
	 * the completion re-arms the timer). */
	const allot__syncc *c = &mb->core;
	if (c->lease_until_ns != 0 && !atomic_load(&c->in_fallback)) {
		uint64_t left = c->lease_until_ns > now ?
		    (c->lease_until_ns - now) / 1000000u + 1 :
		    0;
		if (left < request_timeout_ms(a) &&
		    (mb->mine == NULL || left < watch_ms(mb)))
			schedule(mb, left);
	}
}

static void
complete(struct member *mb)
{
	int result;
	nng_msg *reply;
	if (!allot__exchange_finish(&mb->x, &result, &reply))
		return;
	uint64_t now = now_ns(mb->s->a);
	bool ok = false;
	if (result != 0) {
		allot__syncc_failed(&mb->core, now, nng_strerror(result));
	} else {
		ok = allot__syncc_reply(
		    &mb->core, now, nng_msg_body(reply), nng_msg_len(reply));
		nng_msg_free(reply);
	}
	member_health(mb, ok);
	if (allot__syncc_take_reconfigured(&mb->core))
		config_installed(mb->s, &mb->core);
	allot__syncc_check_lease(&mb->core, now);
	schedule(mb,
	    ok ? allot__syncc_next_delay_ms(&mb->core, now, true) :
	         failed_delay_ms(mb, now));
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
	for (size_t i = 0; i < s->n; i++)
		complete(&s->m[i]);
	swap_dialers(s);
	publish(s);
}

static void
on_timer(uv_timer_t *t)
{
	struct member *mb = t->data;
	allot__syncc_check_lease(&mb->core, now_ns(mb->s->a));
	publish(mb->s);
	if (allot__exchange_busy(&mb->x)) {
		if (mb->mine == NULL)
			return;
		/* The watch: its completion re-arms the timer. */
		if (allot__exchange_lost(&mb->x))
			allot__exchange_cancel(&mb->x);
		else
			schedule(mb, watch_ms(mb));
		return;
	}
	start_exchange(mb);
}

/* Every eighth of an interval: a member whose agent started denying a
 * key runs its exchange now instead of at its timer (sync_int.h
 * allot__syncc_early_due(): counters only, bounded to one early Sync
 * per quarter interval and per onset of denials). Leases are checked
 * here too: an early exchange stops the member's timer, which is what
 * notices a lease running out while an exchange is in flight. */
static void
check_early(uv_timer_t *t)
{
	struct allot__sync *s = t->data;
	uint64_t now = now_ns(s->a);
	for (size_t i = 0; i < s->n; i++)
		allot__syncc_check_lease(&s->m[i].core, now);
	publish(s);
	for (size_t i = 0; i < s->n; i++) {
		struct member *mb = &s->m[i];
		if (allot__exchange_busy(&mb->x) ||
		    !allot__syncc_early_due(&mb->core, now))
			continue;
		uv_timer_stop(&mb->timer);
		start_exchange(mb);
	}
}

static uint64_t
check_ms(const allot_agent *a)
{
	uint64_t t = a->opts.sync_interval_ms / 8;
	return t > 0 ? t : 1;
}

static void
send_leave(struct member *mb)
{
	void *buf;
	size_t len;
	if (allot__syncc_leave(&mb->core, &buf, &len) != ALLOT_OK)
		return;
	(void) allot__exchange_call(&mb->x, buf, len, 300);
	free(buf);
	allot__log(&mb->s->a->log, ALLOT_LOG_INFO, "ALLOT-SYNC-LEAVE",
	    "left session %llu", (unsigned long long) mb->core.session);
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
	for (size_t i = 0; i < s->n; i++)
		schedule(&s->m[i], 0);
	tls_check_start(s);
	uv_timer_start(&s->check, check_early, check_ms(s->a), check_ms(s->a));
	uv_run(&s->loop, UV_RUN_DEFAULT);
	link_wake_off(s);
	if (s->tls_timer_init)
		uv_close((uv_handle_t *) &s->tls_timer, close_cb);
	/* Stopping: cancel the exchanges in flight, then leave. */
	for (size_t i = 0; i < s->n; i++) {
		struct member *mb = &s->m[i];
		allot__exchange_stop(&mb->x);
		send_leave(mb);
		uv_close((uv_handle_t *) &mb->timer, close_cb);
	}
	uv_close((uv_handle_t *) &s->check, close_cb);
	uv_close((uv_handle_t *) &s->wake, close_cb);
	uv_run(&s->loop, UV_RUN_DEFAULT);
}

static void
sync_free(struct allot__sync *s)
{
	for (size_t i = 0; i < s->n; i++) {
		struct member *mb = &s->m[i];
		allot__tlsdial_fini(&mb->td);
		allot__exchange_close(&mb->x);
		allot__syncc_fini(&mb->core);
		allot__signer_free(mb->core.signer);
		free(mb->mine);
	}
	free(s->m);
	free(s->hashes);
	free(s->live);
	free(s->keyhash);
	free(s->pub);
	free(s->cache_path);
	allot__tlsreq_fini(&s->rl);
	free(s);
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
 * certificate's key (sign.h): allotd binds the session to that identity. */
static int
member_signer(allot_agent *a, struct member *mb)
{
	if (strncmp(mb->m.url, "tls+tcp", 7) != 0 ||
	    a->opts.tls_cert_key_file == NULL)
		return ALLOT_OK;
	char err[256];
	int rc = allot__signer_new(a->opts.tls_cert_key_file, mb->m.url, err,
	    sizeof err, &mb->core.signer);
	if (rc != ALLOT_OK)
		allot__log(&a->log, ALLOT_LOG_ERR, "ALLOT-SYNC-IDENTITY",
		    "cannot sign Registers for %s: %s", mb->m.url, err);
	return rc;
}

/* Open member `i`'s socket and start dialling it. */
static int
member_open(struct allot__sync *s, size_t i, bool cluster)
{
	allot_agent *a = s->a;
	struct member *mb = &s->m[i];
	mb->s = s;
	if (allot__syncc_create(&mb->core, a,
	        allot__hash_seed() ^ (uint64_t) getpid() ^ allot__mix64(i + 1),
	        &s->in) != ALLOT_OK)
		return ALLOT_ENOMEM;
	mb->core.cache_path = s->cache_path;
	if (cluster) {
		mb->mine = calloc(
		    a->quota_cap > 0 ? a->quota_cap : 1, sizeof *mb->mine);
		if (mb->mine == NULL)
			return ALLOT_ENOMEM;
		mb->core.mine = mb->mine;
		mb->core.peer = mb->m.url;
	}
	allot__exchange_opts xo = {
		.reconnect_min_ms = a->opts.reconnect_min_ms,
		.reconnect_max_ms = cluster ? member_retry_ms(a) :
		                              a->opts.reconnect_max_ms,
		.recv_max = 4u << 20,
		.watch_link = true, /* rotation swaps dialers on a drop */
		.wake = wake_loop,
		.wake_ctx = &s->wake,
	};
	if (allot__exchange_open(&mb->x, &xo) != 0)
		return ALLOT_ENOMEM;
	mb->x.link.on_change = link_changed;
	mb->x.link.on_change_ctx = s;
	int rv = dial(a, mb->x.sock, mb->m.url, &mb->td.cur);
	if (rv != 0) {
		allot__log(&a->log, ALLOT_LOG_ERR, "ALLOT-SYNC-ADDRESS",
		    "cannot use coordinator address \"%s\": %s", mb->m.url,
		    nng_strerror(rv));
		return ALLOT_EINVAL;
	}
	return member_signer(a, mb);
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
	/* Several comma-separated addresses are a cluster: NAME=URL
	 * entries named as in allotd's --member (a bare URL is named by
	 * itself). One address is the single-coordinator path. */
	allot__member list[ALLOT__CLUSTER_MAX_MEMBERS];
	char err[256];
	int n = allot__member_parse_list(a->coordinator, true, list,
	    ALLOT__CLUSTER_MAX_MEMBERS, err, sizeof err);
	if (n <= 0) {
		allot__log(&a->log, ALLOT_LOG_ERR, "ALLOT-SYNC-ADDRESS",
		    "cannot use coordinator list \"%s\": %s", a->coordinator,
		    err);
		free(s);
		return ALLOT_EINVAL;
	}
	bool cluster = n > 1;
	s->m = calloc((size_t) n, sizeof *s->m);
	s->hashes = calloc((size_t) n, sizeof *s->hashes);
	s->live = calloc((size_t) n, sizeof *s->live);
	uint32_t cap = a->quota_cap > 0 ? a->quota_cap : 1;
	s->keyhash = calloc(cap, sizeof *s->keyhash);
	s->pub = calloc(cap, sizeof *s->pub);
	if (a->opts.config_cache_file != NULL &&
	    a->opts.config_cache_file[0] != '\0')
		s->cache_path = strdup(a->opts.config_cache_file);
	if (s->m == NULL || s->hashes == NULL || s->live == NULL ||
	    s->keyhash == NULL || s->pub == NULL ||
	    (a->opts.config_cache_file != NULL &&
	        a->opts.config_cache_file[0] != '\0' &&
	        s->cache_path == NULL)) {
		sync_free(s);
		return ALLOT_ENOMEM;
	}
	int rc = ALLOT_OK;
	for (int i = 0; i < n && rc == ALLOT_OK; i++) {
		s->m[i].m = list[i];
		s->hashes[i] = list[i].hash;
		s->n = (size_t) i + 1;
		rc = member_open(s, (size_t) i, cluster);
	}
	if (rc != ALLOT_OK) {
		sync_free(s);
		return rc;
	}
	if (cluster) {
		s->nhashed = atomic_load(&a->nquotas);
		for (uint32_t k = 0; k < s->nhashed; k++)
			s->keyhash[k] = allot__rendezvous_key(
			    a->service, a->quotas[k].name);
		reroute(s);
		atomic_store(&s->reroutes, 0);
	}
	if (uv_loop_init(&s->loop) != 0) {
		sync_free(s);
		return ALLOT_ENOMEM;
	}
	for (size_t i = 0; i < s->n; i++) {
		uv_timer_init(&s->loop, &s->m[i].timer);
		s->m[i].timer.data = &s->m[i];
	}
	uv_async_init(&s->loop, &s->wake, on_wake);
	s->wake.data = s;
	s->tls_seen = allot__tls_files_look(&a->opts);
	uv_timer_init(&s->loop, &s->check);
	s->check.data = s;
	a->sync = s;
	if (uv_thread_create(&s->thread, thread_main, s) != 0) {
		for (size_t i = 0; i < s->n; i++)
			uv_close((uv_handle_t *) &s->m[i].timer, NULL);
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
allot_sync_stats_get(allot_agent *a, allot_sync_stats *ret)
{
	if (a == NULL || ret == NULL)
		return ALLOT_EINVAL;
	memset(ret, 0, sizeof *ret);
	if (a->sync == NULL)
		return ALLOT_OK;
	struct allot__sync *s = a->sync;
	uint64_t now = now_ns(a);
	allot__syncc_stats(&s->m[0].core, now, ret);
	/* A cluster: counters add up over the members; connected and
	 * in_fallback hold if they hold for any member; the lease is the
	 * shortest among the members that are up. */
	bool have_lease = !s->m[0].down;
	for (size_t i = 1; i < s->n; i++) {
		allot_sync_stats m;
		allot__syncc_stats(&s->m[i].core, now, &m);
		ret->connected |= m.connected;
		ret->in_fallback |= m.in_fallback;
		ret->replicas = m.replicas > ret->replicas ? m.replicas :
		                                             ret->replicas;
		ret->registers += m.registers;
		ret->syncs_ok += m.syncs_ok;
		ret->syncs_failed += m.syncs_failed;
		ret->errors_received += m.errors_received;
		ret->fallback_enters += m.fallback_enters;
		ret->fallback_leaves += m.fallback_leaves;
		ret->unknown_keys += m.unknown_keys;
		ret->reports_sent += m.reports_sent;
		ret->bytes_sent += m.bytes_sent;
		ret->unreported_tokens += m.unreported_tokens;
		ret->not_owner += m.not_owner;
		ret->keys_unconfirmed += m.keys_unconfirmed;
		ret->throttled += m.throttled;
		ret->early_syncs += m.early_syncs;
		ret->config_installs += m.config_installs;
		ret->config_rejects += m.config_rejects;
		if (!s->m[i].down &&
		    (!have_lease ||
		        m.lease_remaining_ms < ret->lease_remaining_ms)) {
			ret->lease_remaining_ms = m.lease_remaining_ms;
			have_lease = true;
		}
	}
	ret->members = (uint32_t) s->n;
	ret->members_down = atomic_load(&s->down_pub);
	ret->reroutes = atomic_load(&s->reroutes);
	return ALLOT_OK;
}
