/* SPDX-License-Identifier: MIT */
/*
 * The tail path's engine (docs/allocation.md, "The central reserve"),
 * without a transport, like sync_core.c: requests whose local bucket was
 * short wait in a queue, the engine asks the coordinator for their
 * tokens in Asks that batch every waiter of every key, and completes
 * them from the Grant, from the local bucket or, at their deadline, with
 * a denial. At most ALLOT__TAIL_FLIGHTS Asks are in flight, the next no
 * sooner than half a round trip after the last: a request waits at most
 * about a round trip and a half, and a burst costs the coordinator two
 * messages per round trip whatever its size. sync.c
 * drives it on the agent's loop over a second nng context of the
 * session's socket; the simulator drives it on its virtual clock.
 *
 * Threads: allot__tail_enter() (and allot__tail_usable()) run on the
 * caller's thread, lock-free: a waiter is pushed onto an atomic stack
 * and the driver's `wake` is called. Everything else is the driver's one
 * thread, which owns the queues, builds the Asks and completes the
 * waiters: a callback runs there, a blocking caller is woken through a
 * futex on its waiter. A waiter is completed exactly once, by its
 * deadline (as the driver's timer sees it), and never touched again.
 */
#ifndef ALLOT_AGENT_TAIL_H
#define ALLOT_AGENT_TAIL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "agent_int.h"

struct allot__syncc;

/* One request waiting for the central answer: inside an allot_wait
 * (async) or on the blocked caller's stack (allot_acquire_wait). */
typedef struct allot__waiter {
	struct allot__waiter *next;
	allot_key *key;
	uint32_t cost;
	uint32_t quota; /* a->quotas index when it entered */
	uint64_t since_ns; /* when it entered */
	uint64_t deadline_ns;
	allot_wait_cb cb; /* NULL: a blocking caller, woken on `state` */
	allot_wait *w;
	allot_decision *out; /* a blocking caller's decision */
	_Atomic uint32_t state; /* WAIT_PENDING, then WAIT_DONE */
} allot__waiter;

#define ALLOT__WAIT_PENDING 1u
#define ALLOT__WAIT_DONE 2u

#define ALLOT__TAIL_FLIGHTS 2u
#define ALLOT__TAIL_LOST_QUIET 2u
/* The standby of a quota (agent.c) comes back when a coordinator
 * answers again, at most this often: over any window W an agent runs
 * at most 1 + W / 10 s sync intervals of its rate into debt. */
#define ALLOT__TAIL_STANDBY_RENEW_NS 10000000000ull

/* One Ask in flight and the waiters it asked for, oldest first. */
typedef struct allot__flight {
	allot__waiter *head, **end;
	bool busy;
	uint64_t sent_ns;
	uint64_t session; /* the session it asked for */
} allot__flight;

typedef struct allot__tail {
	allot_agent *a;
	/* Callers push here (a Treiber stack); the driver takes it all. */
	_Atomic(allot__waiter *) inbox;
	/* The driver's: waiting to be asked for, oldest first, and the
	 * Asks in flight. */
	allot__waiter *pending, **pending_end;
	allot__flight fl[ALLOT__TAIL_FLIGHTS];
	uint64_t last_sent_ns;
	uint64_t rtt_ns; /* smoothed Ask round trip; 0: none yet */
	/* The coordinator does not know Ask (an older allotd): off until
	 * the next session. */
	bool unsupported;
	uint64_t unsupported_session;
	/* Per quota, sized a->quota_cap: no Ask for it before this time
	 * (its reserve said it was empty). Written by the driver, read by
	 * callers (relaxed: a stale value costs one Ask or one denial). */
	_Atomic uint64_t *dry_until;
	_Atomic uint64_t *dry_left; /* what it still held then */
	/* Whether a session can be asked now (the driver publishes it
	 * after each exchange and lease check). */
	_Atomic bool usable;
	/* Wakes the driver: called by a caller that pushed onto an empty
	 * inbox (on the caller's thread; must only signal). */
	void (*wake)(void *ctx);
	void *wake_ctx;
	/* Per quota scratch for building an Ask and applying its Grant:
	 * the waiters' tokens and smallest cost, and the tokens granted, a
	 * part of one included (GrantKey.part). */
	uint64_t *want, *min;
	double *got;
	/* Per quota, the part of a token its bucket had refilled toward
	 * the waiters of an Ask (AskKey.held), taken out of the bucket
	 * when the Ask left so that no other request spends it meanwhile,
	 * and the flight (1 + its index) that holds it, 0: none. With the
	 * Grant's part it makes whole tokens; it goes back into the bucket
	 * if the Ask fails. One flight at a time holds a quota's part. */
	double *held;
	uint8_t *held_by;
	uint32_t nheld; /* slots with held_by set */
	/* The Asks do not offer those parts to the reserve (AskKey.pool),
	 * which keeps them when it cannot complete them and makes whole
	 * tokens of them for the next asker. Clear (they are offered, when
	 * the bucket would not complete its own sooner: pool_worth()); the
	 * simulator sets it to measure without (sim.h). */
	bool no_pool;
	/* Counters (allot_sync_stats): of the denials, those whose wait
	 * ran out (`late`) and those the reserve could not cover
	 * (`short_`). */
	_Atomic uint64_t asks, allowed, denied, tokens, wait_ns, wait_max_ns;
	_Atomic uint64_t late, short_;
	/* Asks that timed out (their waiters asked for again). */
	_Atomic uint64_t lost;
	/* Asks lost in a row (the driver's): at ALLOT__TAIL_LOST_QUIET the
	 * coordinator is taken for gone and nothing is asked until
	 * `quiet_until`, one sync interval on, so that an outage costs its
	 * requests no more than two lost round trips each (read by
	 * callers, relaxed). */
	uint32_t lost_streak;
	_Atomic uint64_t quiet_until;
	/* No coordinator can be asked (no session, or it stopped answering)
	 * while the agent still runs on its lease, not in fallback: a
	 * request the reserve would have served may run its bucket into
	 * debt instead, within its quota's standby (agent.c). Published
	 * with `usable`; `standby` counts those requests, and
	 * `standby_reset_ns` when the quotas' standby was last given back
	 * (ALLOT__TAIL_STANDBY_RENEW_NS, so that a flapping link does not
	 * renew it every round trip). */
	_Atomic bool unreachable;
	uint64_t last_epoch; /* the driver's: the last Welcome's */
	_Atomic uint64_t takeover_until;
	_Atomic uint64_t standby;
	uint64_t standby_reset_ns;
	/* The outage the quotas' standby rates run over (driver-written):
	 * from allot__standby_after_ns() after the last answer (the
	 * coordinator holds the standby back from then on, central.c) to when
	 * a coordinator could be asked again; 0: none, or still running. */
	_Atomic uint64_t outage_from;
	_Atomic uint64_t outage_to;
	/* Denied without asking: the quota's reserve had said it was
	 * empty (dry_until), or no session could be asked. */
	_Atomic uint64_t dry;
} allot__tail;

int allot__tail_init(
    allot__tail *t, allot_agent *a, void (*wake)(void *ctx), void *wake_ctx);
/* Completes whatever still waits (denied) and frees. */
void allot__tail_fini(allot__tail *t, uint64_t now);

/* Caller's thread: whether a request of quota `q` costing `cost` that
 * the local bucket just denied may wait for the reserve now. */
bool allot__tail_usable(
    allot__tail *t, uint32_t q, uint32_t cost, uint64_t now);
/* Caller's thread: queue `wt` (filled, state PENDING) and wake the
 * driver if it may be asleep. */
void allot__tail_enter(allot__tail *t, allot__waiter *wt);

/* Driver: publish whether the session `c` can be asked now. */
void allot__tail_publish(allot__tail *t, const struct allot__syncc *c);
/* Driver: a Welcome of leader epoch `epoch` gave session `session`,
 * whose shares are about to be installed: it can be asked from now on
 * (a bucket closed by them would otherwise deny until the next
 * publish). A Welcome from a new leader (a higher epoch than the last)
 * opens the take-over window: two leases, while the new leader learns
 * and its reserves fill from empty, in which the standby serves what
 * they cannot. */
void allot__tail_welcomed(allot__tail *t, uint64_t session, uint64_t epoch,
    uint64_t lease_ns, uint64_t now);
/* Caller's thread: whether a request the reserve cannot serve now may
 * go on its quota's standby: no coordinator can be asked, or a new
 * leader took over less than two leases ago. */
bool allot__tail_standby_ok(allot__tail *t, uint64_t now);
/* Caller's thread: the seconds of outage the quotas' standby rates run
 * over as of `now` (Share.standby): 0 when no coordinator was lost. */
double allot__tail_outage_s(allot__tail *t, uint64_t now);
/* Driver: the next Ask, for every waiter not asked for yet. ALLOT_OK
 * with `*ret_buf` (malloc, the caller's), how long the exchange may take
 * and the flight it is (0 .. ALLOT__TAIL_FLIGHTS - 1); ALLOT_ENOENT when
 * there is nothing to ask (waiters that cannot be asked for are decided
 * on their local bucket at once); ALLOT_EBUSY when the Ask must wait for
 * a flight to land or until `*ret_at_ns`, whichever comes first. */
int allot__tail_request(allot__tail *t, struct allot__syncc *c, uint64_t now,
    void **ret_buf, size_t *ret_len, uint32_t *ret_timeout_ms,
    uint32_t *ret_flight, uint64_t *ret_at_ns);
/* Driver: the answer to flight `f` (a Grant or an Error). */
void allot__tail_reply(allot__tail *t, struct allot__syncc *c, uint32_t f,
    uint64_t now, const void *buf, size_t len);
/* Driver: flight `f` failed (transport): its waiters are decided on
 * their local bucket. `sent`: the Ask may have reached the coordinator
 * (then the parts it held are not put back: AskKey.pool). */
void allot__tail_failed(allot__tail *t, uint32_t f, bool sent, uint64_t now);
/* Driver: flight `f` timed out, its Ask or its Grant lost: its waiters
 * are asked for again (those whose deadline passed are denied by
 * allot__tail_expire()); after ALLOT__TAIL_LOST_QUIET losses in a row
 * they are decided on their local bucket, and nothing is asked for one
 * sync interval. */
void allot__tail_lost(allot__tail *t, uint32_t f, uint64_t now);
/* Driver: complete every waiter whose deadline has passed; returns the
 * earliest deadline still ahead (UINT64_MAX: none). */
uint64_t allot__tail_expire(allot__tail *t, uint64_t now);
/* Driver: whether waiters sit in the inbox or the pending queue. */
bool allot__tail_has_pending(allot__tail *t);

void allot__tail_stats(allot__tail *t, allot_sync_stats *ret);

#endif
