/* SPDX-License-Identifier: MIT */
/*
 * The coordinator's in-memory state: the quota config in force and its
 * epoch, the registry of services and their replica sessions, and per
 * service and quota the usage counters, the global bucket estimate and
 * the shares the allocator (alloc.h) handed out. One mutex guards it all;
 * it is held for array indexing and memory updates only (no I/O, no
 * logging), so the nng worker threads that call allot__state_register(),
 * _sync() and _leave() and the libuv loop thread that calls the periodic
 * functions never wait long on each other. Store rows (store.h) are
 * recorded from here too: recording only appends to the store's memory
 * batch.
 *
 * Protocol semantics (docs/protocol.md) live here: session ids, sequence
 * numbers, key interning, the bounds that make a report "absurd", and
 * which shares a Reply carries.
 */
#ifndef ALLOT_COORDINATOR_STATE_H
#define ALLOT_COORDINATOR_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "alloc.h"
#include "allot.pb-c.h"
#include "config.h"
#include "config_diff.h"
#include "log.h"
#include "metrics.h"
#include "store/store.h"

typedef struct allot__state allot__state;

/* Defaults; allotd's options override them. */
#define ALLOT__STATE_LEASE_MS 3000u
#define ALLOT__STATE_INTERVAL_MS 100u
#define ALLOT__STATE_EXPIRY_INTERVALS 5u
#define ALLOT__STATE_MAX_REPLICAS 10000u
#define ALLOT__STATE_MAX_SERVICES 256u
/* Live sessions of one service: fake replicas of a service cannot take
 * the whole replica table (docs/operations.md, "Budgets"). */
#define ALLOT__STATE_MAX_REPLICAS_PER_SERVICE 1000u
#define ALLOT__STATE_MAX_REPLICAS_PER_PEER 256u /* of one service */
/* A service with no replica and nothing expired left is freed after
 * this long, so that Register+Leave pairs do not fill the table. */
#define ALLOT__STATE_SERVICE_IDLE_MS 60000u
#define ALLOT__STATE_FULL_EVERY 10u
/* How long a new service waits for the replicas its first Register
 * announced (Register.expected_replicas) before its live replicas are
 * allotted all of every quota (docs/allocation.md, "Start-up"). */
#define ALLOT__STATE_FORM_MS 2000u
#define ALLOT__STATE_ABSURD_FACTOR 4.0
/* Denials and demand may legitimately exceed the quota (a caller
 * flooding), so their bound is this many times wider than consumption's. */
#define ALLOT__STATE_FLOOD_FACTOR 1000.0
/* Longest string accepted in Register (replica id, service, host, key). */
#define ALLOT__STATE_NAME_MAX 255u /* = ALLOT__NAME_MAX, common/name.h */
#define ALLOT__STATE_VERSION_MAX 64u
/* The config plane (docs/protocol.md): a quota file longer than this is
 * never sent to agents (they keep their own; allotd logs it at load), so
 * that a Reply with its shares stays within the 1 MiB message limit; and
 * the same text goes to the same session at most once in this long. */
#define ALLOT__STATE_CONFIG_PUSH_MAX (512u * 1024u)
#define ALLOT__STATE_CONFIG_RESEND_MS 5000u
/* Keys of one session, its Register's and the ones Syncs add. */
#define ALLOT__STATE_MAX_KEYS 65537u
/* Agent sync intervals above this are treated as this for expiry. */
#define ALLOT__STATE_AGENT_INTERVAL_MAX 60000u
/* The time constant of the demand estimates (docs/allocation.md): this
 * many sync intervals, at least ALLOT__STATE_TAU_MIN_S seconds. */
#define ALLOT__STATE_TAU 2.0
#define ALLOT__STATE_TAU_MIN_S 0.25
/* How long an expired replica still counts in the live bound (its lease,
 * then its fallback allowance), unless it registers again before. */
#define ALLOT__STATE_COUNTED_MS 60000u

/* Time source of the state (monotonic ns); NULL in the options means
 * CLOCK_MONOTONIC. The simulator runs the state on a virtual clock. */
typedef uint64_t (*allot__state_clock_fn)(void *ctx);

typedef enum allot__hold_expired {
	/* Nothing: its share goes to the others at once (the default:
	 * best after a crash; in a partition the replica's last grants,
	 * then its fallback, come on top of R; the live bound shows it). */
	ALLOT__HOLD_NONE = 0,
	/* Its grants, until its lease has certainly ended: no capacity is
	 * handed out twice while a lease runs; after it, a partitioned
	 * replica's fallback (static_share: R/n) comes on top of R. */
	ALLOT__HOLD_LEASE,
	/* Also its fallback allowance afterwards, for counted_ms: a
	 * partition never over-admits, but after a crash that capacity
	 * stays unused for counted_ms. */
	ALLOT__HOLD_FALLBACK,
} allot__hold_expired;

typedef struct allot__state_opts {
	uint32_t lease_ms; /* validity of every allowance sent */
	uint32_t interval_ms; /* expected agent sync interval */
	uint32_t expiry_intervals; /* K: missed intervals before expiry */
	uint32_t max_replicas; /* live sessions, all services */
	uint32_t max_services;
	uint32_t max_replicas_per_service; /* live sessions, one service */
	/* Live sessions of one service registered by one peer (a Register
	 * naming its peer, allot__state_register_from); 0: no limit. */
	uint32_t max_replicas_per_peer;
	uint32_t service_idle_ms; /* an empty service is freed after */
	uint32_t full_every; /* a full Reply at least every N */
	/* Keys of a session, Register and Sync.add_keys together (allotd's
	 * --max-keys); 0: ALLOT__STATE_MAX_KEYS. */
	uint32_t max_keys;
	double absurd_factor; /* slack on the consumption bound */
	/* The renamed gauges of /metrics under their names of 0.1 too
	 * (--legacy-metric-names; docs/operations.md, "Metric names"). */
	bool legacy_metric_names;
	allot__alloc_policy policy;
	allot__store *store; /* may be NULL (no durable rows) */
	const allot__logger *lg;
	allot__metrics *metrics; /* may be NULL */
	allot__state_clock_fn clock; /* NULL: CLOCK_MONOTONIC */
	void *clock_ctx;
	/* After a silence of the whole coordinator (no request from any
	 * replica for K intervals: more likely its own network than every
	 * replica dying at once), replicas of services with two or more
	 * get this long to come back before they expire. 0 disables it;
	 * the default is twice the default lease, longer than an agent's
	 * longest reconnect backoff (5 s). */
	uint32_t learn_ms;
	uint32_t counted_ms; /* ALLOT__STATE_COUNTED_MS */
	/* What an expired replica (silent past its expiry, maybe crashed,
	 * maybe partitioned and still admitting) keeps out of the headroom
	 * while it may still be running on it. */
	allot__hold_expired hold_expired;
	/* Whether the connection a session registered on is still open
	 * (NULL: not known). A replica whose connection has closed by the
	 * time it expires has exited, or its host closed the socket: it
	 * runs on nothing, so nothing of it is held, whatever
	 * hold_expired says. A silent replica whose connection is still
	 * open may be cut off and admitting: it is held. */
	bool (*conn_open)(void *ctx, uint32_t pipe);
	void *conn_ctx;
	/* The epoch of the config given to allot__state_create(); 0 means
	 * 1. allotd passes the store's last epoch for an unchanged file and
	 * one more for a changed one, so epochs never restart. */
	uint64_t epoch;
} allot__state_opts;

void allot__state_opts_init(allot__state_opts *o);

/* Create the state with `cfg` (ownership passes to the state on ALLOT_OK)
 * as epoch opts->epoch (1 when 0). `path` and `text` are what the config was
 * parsed from; the state records them as the first config row. */
int allot__state_create(const allot__state_opts *opts, allot_config *cfg,
    const char *path, const char *text, allot__state **ret);
void allot__state_destroy(allot__state *st);

/* Start-up, before any request: turn the replicas the store says were
 * live into placeholders ("restored") that count toward their service's
 * replica count until the same replica id re-registers (the placeholder
 * is then "replaced") or K intervals pass (it "expires"), and take back
 * the global bucket levels. Session ids continue after the largest the
 * store has seen. Loop thread. */
int allot__state_restore(allot__state *st);

/* ---- requests (nng worker threads) ----
 * Each returns ALLOT__V1__ERROR__CODE__UNSPECIFIED (0) on success with
 * `ret` filled (repeated fields allocated from `pa`, which the caller
 * resets after sending), or the Error code to answer with and a message
 * in `err`. Rejections are counted in the metrics here. */
Allot__V1__Error__Code allot__state_register(allot__state *st,
    const Allot__V1__Register *req, ProtobufCAllocator *pa,
    Allot__V1__Welcome *ret, char *err, size_t errlen);
Allot__V1__Error__Code allot__state_sync(allot__state *st,
    const Allot__V1__Sync *req, ProtobufCAllocator *pa, Allot__V1__Reply *ret,
    char *err, size_t errlen);
Allot__V1__Error__Code allot__state_leave(allot__state *st,
    const Allot__V1__Leave *req, Allot__V1__Reply *ret, char *err,
    size_t errlen);
/* The same, for a request that arrived on nng pipe `pipe` (nonzero): a
 * session remembers the pipe it registered on, and a Sync or Leave for
 * it on another pipe is answered UNKNOWN_SESSION and counted as
 * session_pipe_mismatch. The functions above pass 0: not bound. */
Allot__V1__Error__Code allot__state_register_on(allot__state *st,
    const Allot__V1__Register *req, uint32_t pipe, ProtobufCAllocator *pa,
    Allot__V1__Welcome *ret, char *err, size_t errlen);
Allot__V1__Error__Code allot__state_sync_on(allot__state *st,
    const Allot__V1__Sync *req, uint32_t pipe, ProtobufCAllocator *pa,
    Allot__V1__Reply *ret, char *err, size_t errlen);
/* The tail path (ask.c): tokens from the central reserves for requests
 * an agent's local buckets were short of. */
Allot__V1__Error__Code allot__state_ask_on(allot__state *st,
    const Allot__V1__Ask *req, uint32_t pipe, ProtobufCAllocator *pa,
    Allot__V1__Grant *ret, char *err, size_t errlen);
Allot__V1__Error__Code allot__state_leave_on(allot__state *st,
    const Allot__V1__Leave *req, uint32_t pipe, Allot__V1__Reply *ret,
    char *err, size_t errlen);
/* allot__state_register_on for a Register from `peer`, a nonzero key of
 * its sender (the dispatcher's: its address, uid or verified identity;
 * 0: unknown, as for the functions above). A peer's live replicas of one
 * service are bounded (max_replicas_per_peer), and a new replica from a
 * peer that already has one in the service takes demand from the others
 * at its first Sync, not at its Register: a burst of replicas that
 * register from one address and never sync cannot shrink the others'
 * shares (docs/allocation.md, "Joins and leaves"). */
Allot__V1__Error__Code allot__state_register_from(allot__state *st,
    const Allot__V1__Register *req, uint32_t pipe, uint64_t peer,
    ProtobufCAllocator *pa, Allot__V1__Welcome *ret, char *err, size_t errlen);
/* A Sync for `session` on `pipe` was refused before it reached the state
 * (its peer's message budget): it still proves the session alive, so its
 * last-seen time moves and it does not expire while throttled. Nothing
 * else changes. True when such a session exists on that pipe. */
bool allot__state_alive(allot__state *st, uint64_t session, uint32_t pipe);

/* ---- periodic work (loop thread) ---- */

/* Every interval: expire silent sessions and recompute the shares of
 * every service whose replica set or config changed. */
void allot__state_tick(allot__state *st);

/* Every second: usage rows per service and quota, last-seen rows, global
 * bucket levels, and the per-second rates shown by /metrics. */
void allot__state_second(allot__state *st);

/* Install a new config (ownership passes on ALLOT_OK): new epoch, config
 * row, keys re-mapped by identity, shares recomputed and a full Reply
 * queued for every session. A config with the digest in force is not a
 * change: ALLOT_OK is returned, `cfg` is freed and *ret_changed is false.
 */
int allot__state_reload(allot__state *st, allot_config *cfg, const char *path,
    const char *text, bool *ret_changed);

/* Who installs a config, and why: what the audit rows (config_changes,
 * quota_changes; store.h) say. */
typedef struct allot__state_who {
	const char *who; /* a kernel-verified user name, "signal", "start" */
	const char *claimed_as; /* NULL: nothing claimed */
	const char *reason;
	const char *source; /* the client's file name; NULL: none */
} allot__state_who;

/* allot__state_reload() recording `w` with one audit row per quota that
 * changed (allot__state_reload() is this with who "signal" and reason
 * "reload"). Loop thread only: one reload at a time. */
int allot__state_apply(allot__state *st, allot_config *cfg, const char *path,
    const char *text, const allot__state_who *w, bool *ret_changed);

/* allot__state_apply() installing the config as epoch `at` (0: the
 * next one), the epoch the cluster committed it with (cluster.h): every
 * member then tells agents the same epoch. A config with the digest in
 * force only takes the epoch. */
int allot__state_apply_at(allot__state *st, allot_config *cfg,
    const char *path, const char *text, const allot__state_who *w, uint64_t at,
    bool *ret_changed);

/* allot__state_apply_at() whose audit rows come from `diff`, computed
 * beforehand off the loop from the config of digest `from` (a diff of
 * 59,001 quotas takes the better part of a second: issue 27); used when
 * `from` is still the config in force, else the diff is computed here.
 * `diff` stays the caller's. */
int allot__state_apply_diffed(allot__state *st, allot_config *cfg,
    const char *path, const char *text, const allot__state_who *w, uint64_t at,
    uint64_t from, const allot__config_diff *diff, bool *ret_changed);

/* Cluster: this member stops allocating (it lost leadership) or starts
 * (it took over): every session and service is dropped, so that nothing
 * granted from stale state survives; then, when `take_over`, every quota
 * is learnt for one lease plus two intervals (grants start from what the
 * agents report they hold, KeyReport.foreign, and increase nothing), and
 * the store's live replicas come back as placeholders. Loop thread. */
void allot__state_forget(allot__state *st, bool take_over);

/* The audit rows of the config allot__state_create() installed, against
 * `before` (the config the store recorded last, or NULL for an empty
 * store: every quota added). Start-up, loop thread. ALLOT_OK or
 * ALLOT_ENOMEM (nothing recorded). */
int allot__state_audit_start(
    allot__state *st, const allot_config *before, const allot__state_who *w);

uint64_t allot__state_epoch(allot__state *st);
uint64_t allot__state_digest(allot__state *st);
size_t allot__state_replicas(allot__state *st);

/* One replica's share of one quota, for the simulator and tests. */
typedef struct allot__state_share {
	const char *replica_id;
	uint64_t session;
	int32_t quota; /* quota index: 0 default, i caller i-1 */
	const char *identity; /* the quota's identity */
	bool restored; /* a placeholder after a restart */
	bool fresh; /* no Sync since its Register yet */
	double demand; /* the coordinator's estimate, tokens/s */
	double target_rate; /* allocator output */
	double target_burst;
	double reply_target_rate; /* the target when it was last answered:
	                             what its grant moved toward */
	double rate; /* grant: what it was last sent */
	double burst;
	double bound_rate; /* what it may hold (live bound) */
	double bound_burst;
} allot__state_share;

/* One quota of one service: the allocation and the live bound. */
typedef struct allot__state_quota {
	const char *identity;
	double rate; /* R */
	double burst; /* B */
	double allowance; /* its part of the ceiling, <= R */
	double burst_budget; /* what the bursts may sum to, <= B */
	double level; /* global bucket estimate, tokens */
	double demand; /* sum of the estimates, tokens/s */
	double target_rate; /* sum of targets */
	double granted_rate; /* sum of grants (<= R at all times) */
	double granted_burst;
	/* The live bound: what the agents may admit at, counting grants,
	 * decreases not acknowledged yet, the allowance of expired
	 * replicas (their lease, then their fallback) and the agents'
	 * minimum burst. Over any window W they admit at most
	 * bound_burst + bound_rate * W. */
	double bound_rate;
	double bound_burst;
	double bound_ratio; /* max(bound_rate/R, bound_burst/B) */
	uint32_t holders;
	uint32_t expired_counted; /* expired replicas still in the bound */
	/* Its central reserve (docs/allocation.md): what no replica holds
	 * of the allowance and of the burst budget, and the tokens in it
	 * (zeros for a quota without one). */
	double reserve_rate;
	double reserve_burst;
	double reserve_level;
} allot__state_quota;

typedef void (*allot__state_share_fn)(void *ctx, const allot__state_share *sh);

/* Call `fn` for every share of every replica of `service` (placeholders
 * included), under the state's lock: `fn` must not call back into the
 * state. Returns the number of shares, 0 for an unknown service. */
size_t allot__state_foreach_share(allot__state *st, const char *service,
    allot__state_share_fn fn, void *ctx);

/* The allocation and live bound of quota index `q` of `service`.
 * Returns ALLOT_OK, or ALLOT_ENOENT when either is unknown. */
int allot__state_quota_get(
    allot__state *st, const char *service, size_t q, allot__state_quota *ret);

/* Live replicas of `service` (restored ones included), 0 if unknown. */
uint32_t allot__state_service_replicas(allot__state *st, const char *service);

/* ---- cluster (loop thread) ----
 * The leader of a Raft cluster (cluster.h) that takes over learns every
 * quota for one lease plus two intervals from now: grants start from
 * what the agents report they run on (KeyReport.foreign: the previous
 * leader's grants, counted as handed out) and increase nothing until
 * the period ends, or until every replica of the service holds a grant
 * from this leader. Called by allot__state_forget(st, true). */
void allot__state_learn(allot__state *st);

/* Append the per-service and per-quota series (Prometheus text). */
void allot__state_render_metrics(allot__state *st, allot__buf *b);
/* Append the /status document (JSON). */
void allot__state_render_status(allot__state *st, allot__buf *b);

#endif
