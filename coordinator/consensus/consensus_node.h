/* SPDX-License-Identifier: MIT */
/*
 * One member's consensus logic on top of a libraft instance, whatever
 * its I/O: leadership and its lease (fencing), the EPOCH claim,
 * proposals, and membership changes. consensus.c runs it on raft_uv and
 * allotd's loop; tests/test_consensus.c runs the same code on
 * raft_fixture's in-memory I/O and clock, so the deterministic tests
 * exercise exactly what allotd runs.
 *
 * The lease. Assumption: every member's clock (what raft_io->time
 * returns) runs at a rate within (1 +- d) of real time, d = `drift`
 * (default 1 %); nothing is assumed about offsets. A leader may grant
 * (allot__cnode_may_grant) only while
 *   (a) it is leader, and not handing leadership over;
 *   (b) the EPOCH entry of its term has been committed and applied
 *       (so agents are told an epoch every member will agree on);
 *   (c) now >= elected + lease * (1 + d): a new leader waits out any
 *       earlier leader's lease, measured from when it noticed it won;
 *   (d) now < lease_until, where lease_until = t + lease * (1 - d) for
 *       the latest entry (a barrier when idle, every `renew_ms`) that the
 *       leader submitted at time t in its term and saw committed.
 * Why that is safe: an entry submitted at t and committed was stored by a
 * quorum, each of whom received it after t. A later leader's election
 * quorum shares a member with that quorum, which voted for it (moving to
 * the higher term, after which it refuses the old leader's entries)
 * after storing the entry, so the new leader won at some e > t. The old
 * lease lasts at most lease * (1 - d) / (1 - d) = lease of real time
 * after t; the new leader's wait lasts at least lease * (1 + d) / (1 + d)
 * = lease of real time after e > t. So two leases never overlap. The
 * argument needs neither libraft's refusal to vote while a leader is
 * known, nor bounded restart times, nor anything about transfers.
 * The price is the wait: a new leader grants lease * (1 + d) after it
 * wins. Counting the wait from when the new leader last heard of the old
 * one instead would not be safe: in a bridge partition (A - C - B, A and
 * B cut apart) B may never hear of A, yet A renewed its lease through C
 * just before C voted for B.
 *
 * Clocks read in whole milliseconds, and libuv's loop time can lag
 * CLOCK_MONOTONIC by a coarse tick, so the wait also adds
 * ALLOT__CNODE_CLOCK_SLACK_MS, and every time the node records (the win,
 * a submission) is read no later than the event, which only makes the
 * lease shorter and the wait longer.
 *
 * Other threads (allotd's nng workers answer agents) read one value,
 * allot__cnode_grant_until(): grant iff a fresh monotonic reading in
 * milliseconds is below it. The node publishes the lease end there only
 * once (b) and (c) hold, and 0 when (a) fails or a hand-over starts; a
 * stale value is still safe, because the argument above bounds the
 * lease by time alone, whether or not the member has noticed it lost.
 *
 * The epoch agents see is the term of the last committed EPOCH entry
 * (allot__cnode_epoch): it only increases, on every member.
 *
 * Single-threaded: every call on the thread that runs the raft instance.
 */
#ifndef ALLOT_COORDINATOR_CONSENSUS_NODE_H
#define ALLOT_COORDINATOR_CONSENSUS_NODE_H

#include <raft.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "consensus_entry.h"
#include "consensus_fsm.h"

#define ALLOT__CNODE_DRIFT 0.01 /* assumed bound on clock-rate drift */
#define ALLOT__CNODE_CLOCK_SLACK_MS 5 /* see "Clocks" above */
#define ALLOT__CNODE_ADDR_MAX 256
/* A non-voter is promoted once its log is this close to the leader's
 * (raft_assign then finishes the catch-up in rounds of its own). */
#define ALLOT__CNODE_CATCHUP_SLACK 64

/* Called when the leader this member knows of changes (id 0, address
 * NULL: none known). The address is valid until the next call. */
typedef void (*allot__cnode_leader_cb)(
    void *ctx, uint64_t id, const char *address);

/* The outcome of a proposal: ALLOT_OK once the entry is committed and
 * applied on this member (`index` is its log index); ALLOT_ESTATE when
 * leadership was lost first (the entry may still commit under the next
 * leader); ALLOT_ECLOSED at shutdown; ALLOT_EIO otherwise. */
typedef void (*allot__cnode_done_cb)(void *ctx, int status, uint64_t index);

typedef struct allot__cnode_opts {
	uint32_t lease_ms; /* 0: the raft instance's election timeout */
	double drift; /* 0: ALLOT__CNODE_DRIFT */
	uint32_t renew_ms; /* 0: lease_ms / 4 */
	allot__cnode_leader_cb on_leader;
	void *ctx;
	/* The clock the lease is measured on, in ms; NULL: the raft
	 * instance's (raft_io->time). The tests give members clocks that
	 * run at different rates within the drift bound. */
	uint64_t (*clock)(void *clock_ctx);
	void *clock_ctx;
} allot__cnode_opts;

typedef struct allot__cmember {
	uint64_t id;
	char address[ALLOT__CNODE_ADDR_MAX];
	int role; /* RAFT_VOTER, RAFT_STANDBY or RAFT_SPARE */
} allot__cmember;

enum allot__cnode_change_stage {
	ALLOT__CCHANGE_IDLE,
	ALLOT__CCHANGE_ADDING, /* raft_add in flight */
	ALLOT__CCHANGE_TO_STANDBY, /* raft_assign(STANDBY) due or in flight */
	ALLOT__CCHANGE_CATCHING_UP, /* replicating; promote when close */
	ALLOT__CCHANGE_PROMOTING, /* raft_assign(VOTER) in flight */
	ALLOT__CCHANGE_REMOVING, /* raft_remove in flight */
	ALLOT__CCHANGE_DEMOTING, /* a leaving voter: raft_assign(STANDBY) */
};

/* How far the removal of a member has gone, as this member's committed
 * configuration and state see it (allot__cnode_leave_state). */
enum allot__cnode_leave {
	ALLOT__CLEAVE_MEMBER, /* in the configuration, no intent to leave */
	ALLOT__CLEAVE_LEAVING, /* LEAVING committed; still votes */
	ALLOT__CLEAVE_DEMOTED, /* leaving, and a non-voter in the committed
	                        * configuration: it can no longer vote or
	                        * lead; the leader removes it next */
	ALLOT__CLEAVE_GONE, /* not in the committed configuration */
};

typedef struct allot__cnode {
	struct raft *r;
	allot__cfsm *fsm;
	allot__cnode_opts opts;
	uint32_t wait_ms; /* lease * (1 + d), rounded up, + clock slack */
	uint32_t hold_ms; /* lease * (1 - d), rounded down */

	/* The lease; lease_term 0 while not leader. */
	uint64_t lease_term;
	uint64_t elected_at;
	uint64_t lease_until;
	uint64_t last_submit; /* last entry submitted that anchors */
	bool epoch_sent;
	bool renewing; /* a renewal barrier is in flight */
	bool transferring;
	_Atomic uint64_t grant_until; /* what other threads read */

	uint64_t seen_leader;

	struct {
		int stage; /* enum allot__cnode_change_stage */
		bool in_flight;
		uint64_t id;
		char address[ALLOT__CNODE_ADDR_MAX];
		int status; /* the last change's outcome (ALLOT_*) */
		struct raft_change req;
	} change;
	struct raft_transfer transfer;
	/* The REMOVED entry proposed for a leaving member already out of
	 * the configuration (its own REMOVED was lost with a leadership):
	 * once per term and member. */
	uint64_t cleared_id, cleared_term;
	/* When this leader first found `demoted_id` demoted: it waits (at most
	 * a lease) for that member to acknowledge a later entry, which tells
	 * it the demotion is committed, before removing it (after which
	 * nothing more reaches it). */
	uint64_t demoted_id, demoted_seen;
	unsigned inflight; /* proposals and barriers not yet called back */
} allot__cnode;

/* Wires the node to a raft instance that was raft_init'ed with `fsm`
 * (and sets fsm->raft); call before raft_start. Turns pre-vote on. */
void allot__cnode_init(allot__cnode *n, struct raft *r, allot__cfsm *fsm,
    const allot__cnode_opts *opts);

/* Drives the node: notices leadership, proposes the EPOCH entry, renews
 * the lease, moves membership changes on. Call it often (allotd: from a
 * timer every heartbeat / 2; the tests: after every fixture step). */
void allot__cnode_tick(allot__cnode *n);

/* The fencing predicate (see the top of this file); `now` on the node's
 * clock (raft_io->time unless opts.clock: uv_now on allotd's loop). */
bool allot__cnode_may_grant(const allot__cnode *n, uint64_t now);

/* The published lease end (0: do not grant), for any thread: grant iff a
 * fresh monotonic reading in ms, on the clock the raft instance uses, is
 * below it. It starts being published at the first tick after the wait,
 * so it lags may_grant by at most one tick. */
uint64_t allot__cnode_grant_until(const allot__cnode *n);

/* The epoch agents are told: the term of the last committed EPOCH. */
uint64_t allot__cnode_epoch(const allot__cnode *n);

/* The leader this member knows of: false when none. The address is
 * libraft's, valid until the leader changes. */
bool allot__cnode_leader(
    const allot__cnode *n, uint64_t *ret_id, const char **ret_address);

/* Proposes an entry (leader only); `done` runs exactly once on
 * ALLOT_OK, never otherwise.
 * @return ALLOT_OK; ALLOT_ESTATE when not the leader (ask
 *         allot__cnode_leader who is); ALLOT_EINVAL; ALLOT_ENOMEM. */
int allot__cnode_propose(allot__cnode *n, const allot__centry *e,
    allot__cnode_done_cb done, void *ctx);

/* Starts adding a member: it joins as a non-voter (spare, then standby
 * so it replicates the log) and is promoted to voter by a later tick
 * once caught up. Calling it again for a member already in the
 * configuration resumes from its role. Leader only.
 * @return ALLOT_OK (started, or nothing to do: already a voter);
 *         ALLOT_ESTATE (not leader); ALLOT_EBUSY (another change in
 *         progress, or the member is still leaving); ALLOT_EINVAL. */
int allot__cnode_add_member(allot__cnode *n, uint64_t id, const char *address);

/* Hands leadership to another voter (raft_transfer, to the one libraft
 * picks): its lease is given up at once, as when the leader leaves; a
 * failed hand-over leaves it leader. Leader only.
 * @return ALLOT_OK (started); ALLOT_ESTATE (not leader, or a hand-over
 *         in progress); ALLOT_EBUSY (libraft refused: no other voter). */
int allot__cnode_hand_over(allot__cnode *n);

/* Removes a member. Another member is removed at once (raft_remove),
 * as before. Removing the leader itself proposes a MEMBER LEAVING entry
 * instead, and from its commit on every tick of whoever leads drives the
 * configuration toward the leaving set, one change at a time, nothing
 * but the log passing between members:
 *   - a leader that is itself leaving hands leadership over (its lease
 *     ends at once; it retries if the transfer fails);
 *   - a leader demotes a leaving voter to standby (so it learns it no
 *     longer votes: libraft never sends a member the entry removing it)
 *     and then removes it, which proposes MEMBER REMOVED;
 *   - a leaving member already gone gets its REMOVED proposed again.
 * A leader acts only once its own term's EPOCH is applied, so its state
 * holds every intent committed before it. Calling it again while the
 * member is leaving is ALLOT_OK. Poll allot__cnode_leave_state for the
 * outcome. Leader only.
 * @return ALLOT_OK (started); ALLOT_ENOENT; ALLOT_ESTATE; ALLOT_EBUSY
 *         (another change in progress, or too many leaving);
 *         ALLOT_EINVAL (the leader is the last voter). */
int allot__cnode_remove_member(allot__cnode *n, uint64_t id);

/* How far the removal of `id` has gone here (enum allot__cnode_leave).
 * While this member's latest configuration is not yet committed, it
 * answers at most LEAVING (never GONE or DEMOTED early). */
int allot__cnode_leave_state(const allot__cnode *n, uint64_t id);

/* True while a membership change is in progress (a leaving member not
 * yet removed included). */
bool allot__cnode_changing(const allot__cnode *n);

/* The configuration this member knows, up to `cap` members. */
size_t allot__cnode_members(
    const allot__cnode *n, allot__cmember *out, size_t cap);

/* Maps a libraft error code to ALLOT_*. */
int allot__cnode_err(int raft_rv);

#endif
