/* SPDX-License-Identifier: MIT */
/*
 * This allotd's part in the coordinator cluster (docs/operations.md,
 * "Cluster"): the consensus core (consensus.h) on allotd's loop, and
 * what allotd does with it.
 *
 * - One leader allocates. allot__cluster_gate() is the fencing check
 *   dispatch runs on nng's threads before a Register, Sync or Leave
 *   touches the registry: this member serves only while it is the
 *   leader, has taken over (below), and a fresh monotonic reading is
 *   below the lease end the core publishes (consensus_node.h has the
 *   assumption and the bound). Otherwise the agent is answered
 *   NOT_LEADER with the leader's agent URL and every member's. Welcome
 *   and Reply carry the epoch (the leader's term, committed) and the
 *   members' agent URLs, from the same published view.
 * - Taking over. When the core says this member may grant (it has waited
 *   out any earlier lease), the registry is dropped and every quota is
 *   learnt (allot__state_forget): grants start from what the agents say
 *   they hold. When it is no longer leader, the registry is dropped
 *   again, so that it can never grant from stale state.
 * - One config. The leader proposes the quota file through the log
 *   (allot__cluster_propose_config: at the first start of a cluster, on
 *   SIGHUP, on an apply); every member installs the committed CONFIG
 *   with its epoch through the on_config callback (state and file).
 * - Audit everywhere. The leader's per-second usage rows and events leave
 *   its store through the tap and go through the log as USAGE and EVENTS
 *   entries; every
 *   member writes each committed entry in one transaction with its index
 *   (allot__store_apply), as it does CONFIG and MEMBER events.
 * - Members carry two addresses, "RAFT_ADDR|AGENT_URL"
 *   (consensus_addr.h), so the agent URLs are replicated with the
 *   membership.
 *
 * Threads: everything on the loop thread but allot__cluster_gate and
 * the renderers.
 */
#ifndef ALLOT_COORDINATOR_CLUSTER_H
#define ALLOT_COORDINATOR_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "consensus.h"
#include "log.h"
#include "state/metrics.h"
#include "state/state.h"
#include "store/store.h"

#define ALLOT__CLUSTER_MAX_SEEDS 16u
#define ALLOT__CLUSTER_ELECTION_MS 1000u

typedef struct allot__cluster allot__cluster;

/* A member of a new cluster (--seed ID=RAFT_ADDR=AGENT_URL). */
typedef struct allot__cluster_seed {
	uint64_t id;
	char raft[ALLOT__CNODE_ADDR_MAX / 2];
	char url[ALLOT__CNODE_ADDR_MAX / 2];
} allot__cluster_seed;

/* Install a committed config: `text` (len bytes, NUL-terminated) as
 * config epoch `epoch`, proposed by `who` (the leader's admin client,
 * "signal" or "start"; "cluster" when the entry names none). Loop
 * thread. */
typedef void (*allot__cluster_config_cb)(void *ctx, const char *text,
    size_t len, uint64_t epoch, const allot__state_who *who);

typedef struct allot__cluster_opts {
	uint64_t id; /* > 0, never reused */
	const char *raft_addr; /* host:port */
	const char *agent_url; /* where agents reach this member */
	const char *dir; /* the log and snapshots */
	const allot__cluster_seed *seeds; /* a new cluster; NULL: join */
	size_t nseeds;
	unsigned election_ms; /* 0: ALLOT__CLUSTER_ELECTION_MS */
	unsigned snapshot_entries; /* between snapshots, and kept after
	                              one; 0: 1024 and 128 */
	/* Mutual TLS between members (raft_tls.h); NULL: plain TCP. */
	const allot__raft_tls_opts *tls;
	allot__state *state;
	allot__store *store;
	const allot__logger *lg;
	/* A committed config to install; it may finish later (off the
	 * loop), as long as `config_busy` says so meanwhile. */
	allot__cluster_config_cb on_config;
	/* Whether a config handed to on_config is still being installed
	 * (NULL: never): a leader does not start serving until it is, so
	 * that it never serves from a config older than the log's. */
	bool (*config_busy)(void *ctx);
	/* This member started serving as leader (it may propose). */
	void (*on_serving)(void *ctx);
	void *ctx;
} allot__cluster_opts;

int allot__cluster_start(const allot__cluster_opts *o, uv_loop_t *loop,
    char *err, size_t errlen, allot__cluster **ret);

/* Stops serving and closes the consensus core; the loop must run until
 * the close completes (it frees everything). Accepts NULL. */
void allot__cluster_stop(allot__cluster *c);

/* What agents are told: immutable once published, valid until stop. */
typedef struct allot__cluster_view {
	uint64_t epoch;
	const char *leader; /* agent URL; NULL: none known */
	char **members; /* agent URLs */
	size_t nmembers;
} allot__cluster_view;

/* The fencing check (any thread): true when this member may allocate
 * now. `ret` gets the view either way. */
bool allot__cluster_gate(
    const allot__cluster *c, const allot__cluster_view **ret);

/* The leader proposes `text` as the next config epoch, by `who` (NULL:
 * none named; every member's audit rows say who and why): the epoch
 * after its last proposal still in flight, else after the state's.
 * ALLOT_OK (proposed; installed on every member once committed),
 * ALLOT_ESTATE (not the leader: `ret_leader` gets its agent URL or ""),
 * ALLOT_EBUSY (the leader, not serving yet: its state may lag), or
 * another error. */
int allot__cluster_propose_config(allot__cluster *c, const char *text,
    size_t len, uint64_t digest, const allot__state_who *who,
    uint64_t *ret_epoch, char *ret_leader, size_t leader_len);
/* The digest of this leader's last config proposal while it is in
 * flight (proposed in this leadership, not applied yet), and its epoch
 * into `*ret_epoch`; 0: none. An apply is checked against it, not the
 * config installed (allotd_cluster.c). */
uint64_t allot__cluster_config_in_flight(
    const allot__cluster *c, uint64_t *ret_epoch);

bool allot__cluster_is_leader(const allot__cluster *c);
/* The config epoch committed (0: none yet). */
uint64_t allot__cluster_config_epoch(const allot__cluster *c);

/* allotctl member add|remove|list (leader only for add and remove;
 * ALLOT_ESTATE otherwise, with the leader's agent URL). */
int allot__cluster_member_add(allot__cluster *c, uint64_t id,
    const char *raft_addr, const char *agent_url, char *err, size_t errlen);
int allot__cluster_member_remove(
    allot__cluster *c, uint64_t id, char *err, size_t errlen);
/* Whether member `id`'s removal is done as far as this member can
 * tell: out of the committed configuration, or (this member itself,
 * no longer leader) demoted to a non-voter with the leader removing it
 * next, which is all a removed member ever hears. `state` gets a
 * sentence saying where it is either way. */
bool allot__cluster_member_left(
    allot__cluster *c, uint64_t id, char *state, size_t len);
/* The members as JSON into `b` (allot__buf). */
void allot__cluster_member_list(allot__cluster *c, allot__buf *b);

/* /metrics series and the /status "cluster" object. */
void allot__cluster_render_metrics(allot__cluster *c, allot__buf *b);
void allot__cluster_render_status(allot__cluster *c, allot__buf *b);

#endif
