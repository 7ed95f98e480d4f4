/* SPDX-License-Identifier: MIT */
/*
 * allotd's consensus core: one member of the coordinator cluster, a
 * libraft instance on allotd's own libuv loop (raft_uv for the log and
 * snapshots in a data directory, raft_uv's TCP transport between
 * members), with the replicated state (consensus_fsm.h) and the lease
 * that fences grants (consensus_node.h states the assumption and the
 * bound).
 *
 * How allotd uses it (the next stage wires this in):
 * - create on the loop with this member's id, address and data dir;
 *   then allot__consensus_bootstrap (the first start of a new cluster:
 *   the seed members, all voters) or allot__consensus_join (a member a
 *   leader will add), then allot__consensus_start. A member that already
 *   has state in its dir ignores the bootstrap list.
 * - dispatch answers agents only while the lease holds: on nng's worker
 *   threads, uv_hrtime() / 1000000 < allot__consensus_grant_until(c);
 *   on the loop, allot__consensus_may_grant(c, uv_now(loop)). Otherwise
 *   NOT_LEADER with allot__consensus_leader(). Welcome and Reply carry
 *   allot__consensus_epoch().
 * - the leader proposes the quota config and the per-second usage
 *   batches; every member's store writes what on_apply hands it, with
 *   the applied index, in one transaction.
 * - allotctl member add|remove|list call add_member / remove_member /
 *   members on the leader.
 *
 * Between members: plain TCP (raft_uv_tcp) unless `tls` is set, then
 * mutual TLS (raft_tls.h: allotd's --tls-cert and --tls-ca, a peer's
 * certificate must chain to the CA and carry the member SPIFFE ID).
 *
 * Single-threaded: every call on the loop's thread.
 */
#ifndef ALLOT_COORDINATOR_CONSENSUS_H
#define ALLOT_COORDINATOR_CONSENSUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "consensus_entry.h"
#include "consensus_fsm.h"
#include "consensus_node.h"
#include "log.h"
#include "raft_tls.h"

typedef struct allot__consensus allot__consensus;

typedef struct allot__consensus_opts {
	uint64_t id; /* this member's id, > 0, unique and never reused */
	const char *address; /* "host:port" members reach it at */
	const char *bind; /* NULL: bind to `address` */
	const char *dir; /* data directory (created if missing) */
	unsigned election_ms; /* 0: 1000 */
	unsigned heartbeat_ms; /* 0: election_ms / 10 */
	uint32_t lease_ms; /* 0: election_ms */
	double drift; /* 0: ALLOT__CNODE_DRIFT */
	unsigned snapshot_threshold; /* 0: 1024 entries */
	unsigned snapshot_trailing; /* 0: 128 entries */
	allot__cfsm_apply_cb on_apply; /* every applied entry, may be NULL */
	allot__cfsm_restore_cb on_restore; /* a snapshot installed; may be
	                                      NULL */
	allot__cnode_leader_cb on_leader; /* may be NULL */
	void *ctx; /* for both callbacks */
	const allot__logger *log; /* NULL: silent */
	/* NULL: plain TCP between members. Else mutual TLS with these
	 * (copied; its log NULL: `log` above). */
	const allot__raft_tls_opts *tls;
} allot__consensus_opts;

/* Creates the member (nothing runs until allot__consensus_start).
 * @return ALLOT_OK; ALLOT_EINVAL; ALLOT_EIO (the data dir, libraft);
 *         ALLOT_ENOMEM. */
int allot__consensus_create(uv_loop_t *loop, const allot__consensus_opts *opts,
    allot__consensus **ret_c);

/* Records the first configuration of a new cluster (every member passes
 * the same list). ALLOT_OK also when the dir already has state. */
int allot__consensus_bootstrap(
    allot__consensus *c, const allot__cmember *members, size_t n);

/* Nothing to record: the member waits for a leader to add it. Present
 * for symmetry and to state intent at the call site. */
int allot__consensus_join(allot__consensus *c);

/* Loads the log and snapshot, replays them into the state (on_apply sees
 * every entry again: the store skips indexes it has) and starts taking
 * part. ALLOT_OK or ALLOT_EIO. */
int allot__consensus_start(allot__consensus *c);

/* Closes asynchronously; `cb` runs on the loop when every handle is
 * closed and `c` is freed. Pending proposals complete with
 * ALLOT_ECLOSED or ALLOT_ESTATE first. */
void allot__consensus_close(
    allot__consensus *c, void (*cb)(void *ctx), void *ctx);

/* The fencing predicate, on the loop's thread (consensus_node.h). */
bool allot__consensus_may_grant(const allot__consensus *c, uint64_t now);
/* The published lease end, for any thread (allot__cnode_grant_until). */
uint64_t allot__consensus_grant_until(const allot__consensus *c);
uint64_t allot__consensus_epoch(const allot__consensus *c);
bool allot__consensus_leader(
    const allot__consensus *c, uint64_t *ret_id, const char **ret_address);
bool allot__consensus_is_leader(const allot__consensus *c);

/* Proposes a quota config: it becomes config epoch `config_epoch`, which
 * must be the state's + 1 (a compare-and-set; a stale one is applied as
 * refused and on_apply does not see it). `who` (NULL: none) is who
 * proposed it and why, for every member's audit rows. Leader only; see
 * allot__cnode_propose for `done` and the return values. */
int allot__consensus_propose_config(allot__consensus *c, const char *text,
    size_t len, uint64_t digest, uint64_t config_epoch, const allot__cwho *who,
    allot__cnode_done_cb done, void *ctx);

/* Proposes a batch of usage rows (copied). Leader only. */
int allot__consensus_propose_usage(allot__consensus *c,
    const allot__row_usage *rows, size_t n, allot__cnode_done_cb done,
    void *ctx);

/* Proposes a batch of audit events (copied). Leader only. */
int allot__consensus_propose_events(allot__consensus *c,
    const allot__row_event *rows, size_t n, allot__cnode_done_cb done,
    void *ctx);
int allot__consensus_propose_audit(allot__consensus *c,
    const allot__row_audit *a, allot__cnode_done_cb done, void *ctx);

/* Hands leadership to another voter (allot__cnode_hand_over). */
int allot__consensus_hand_over(allot__consensus *c);

/* Proposes agents' Usage records (copied; whole records). Leader
 * only. */
int allot__consensus_propose_account(allot__consensus *c,
    const allot__row_count *rows, size_t n, allot__cnode_done_cb done,
    void *ctx);

int allot__consensus_add_member(
    allot__consensus *c, uint64_t id, const char *address);
int allot__consensus_remove_member(allot__consensus *c, uint64_t id);
/* How far the removal of member `id` has gone here (enum
 * allot__cnode_leave, consensus_node.h). */
int allot__consensus_leave_state(const allot__consensus *c, uint64_t id);
/* True while a membership change this member drives is in progress
 * (the next add or remove gets ALLOT_EBUSY until then). */
bool allot__consensus_changing(const allot__consensus *c);
/* The configuration this member knows, the latest even before it is
 * committed. */
size_t allot__consensus_members(
    const allot__consensus *c, allot__cmember *out, size_t cap);

/* The replicated state as this member has applied it (read-only). */
const allot__cfsm *allot__consensus_state(const allot__consensus *c);

#endif
