/* SPDX-License-Identifier: MIT */
/*
 * liballot: the allot agent, embedded in every replica of a protected
 * service. It decides allow/deny for each request from local token buckets
 * (no network hop, no lock, no malloc on that path) and, when a coordinator
 * is configured, a background thread reconciles consumption with `allotd`
 * and installs the allowances it returns.
 *
 * This header is the whole supported interface. Anything not declared here
 * (or in the other headers of this directory) is private and may change
 * without notice.
 *
 * Threads: every function may be called from any thread unless its comment
 * says otherwise. The agent's own thread (the sync loop) is reached only
 * through lock-free shared state and libuv async handles.
 */
#ifndef ALLOT_ALLOT_H
#define ALLOT_ALLOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define ALLOT_API __attribute__((visibility("default")))
#else
#define ALLOT_API
#endif

#define ALLOT_VERSION_MAJOR 0
#define ALLOT_VERSION_MINOR 1
#define ALLOT_VERSION_PATCH 0
#define ALLOT_VERSION_STRING "0.1.0"

/** Error codes. Every function returning `int` returns one of these. */
typedef enum allot_err {
	ALLOT_OK = 0,
	ALLOT_EINVAL = 1, /**< invalid argument (API misuse) */
	ALLOT_ENOMEM = 2, /**< out of memory */
	ALLOT_ECONFIG = 3, /**< bad quota configuration */
	ALLOT_ENOENT = 4, /**< no such key, caller or file */
	ALLOT_EFULL = 5, /**< a bounded table is full */
	ALLOT_ETOOBIG = 6, /**< cost exceeds the burst: can never pass */
	ALLOT_EIO = 7, /**< I/O error */
	ALLOT_EPROTO = 8, /**< malformed or unexpected protocol message */
	ALLOT_ETIMEDOUT = 9, /**< operation timed out */
	ALLOT_ECLOSED = 10, /**< object is shutting down */
	ALLOT_ESTATE = 11, /**< call not valid in the current state */
	ALLOT_EUNREACH = 12, /**< coordinator unreachable */
	ALLOT_ERANGE = 13, /**< value out of range */
	ALLOT_EBUSY = 14, /**< concurrency limit or queue full */
	ALLOT_EINPROGRESS = 15, /**< the decision comes later, through the
	                             callback (allot_acquire_async()) */
	ALLOT_EFORBIDDEN = 16, /**< the quota admits nobody (access:
	                            closed): answer 403, not 429 */
} allot_err;

/** @return a static, human-readable description of `err`. Never NULL. */
ALLOT_API const char *allot_strerror(int err);

/* ------------------------------------------------------------------ */
/* Logging                                                             */
/* ------------------------------------------------------------------ */

/**
 * Log levels use syslog numbers: 3 error, 4 warning, 6 info, 7 debug.
 * `id` is a short stable message identifier such as "ALLOT-SYNC-FAIL".
 * The library never prints; install a handler to see its messages.
 * The handler may be called from any thread, including the sync thread.
 */
typedef void (*allot_log_fn)(
    void *ctx, int level, const char *id, const char *msg);

/* ------------------------------------------------------------------ */
/* Quota configuration                                                 */
/* ------------------------------------------------------------------ */

typedef struct allot_config allot_config;

/** Fallback policy when the coordinator's lease on an allowance expires. */
typedef enum allot_fallback {
	ALLOT_FALLBACK_STATIC_SHARE = 0, /**< R / last known replica count */
	ALLOT_FALLBACK_OPEN = 1, /**< admit everything */
	ALLOT_FALLBACK_CLOSED = 2, /**< deny everything */
} allot_fallback;

/**
 * Load and validate a quota file (YAML, see docs/configuration.md).
 * A bad file never half-loads: on error nothing is returned and, when
 * `errbuf` is not NULL, it receives "FILE:LINE:COL: what was expected".
 * @param ret_cfg on ALLOT_OK, a config owned by the caller
 *        (allot_config_free()).
 * @return ALLOT_OK, ALLOT_ENOENT (file missing), ALLOT_EIO, ALLOT_ECONFIG
 *         or ALLOT_ENOMEM.
 */
ALLOT_API int allot_config_load(
    const char *path, char *errbuf, size_t errlen, allot_config **ret_cfg);

/**
 * As allot_config_load(), from memory. `name` is used in error messages.
 */
ALLOT_API int allot_config_parse(const char *name, const char *text,
    size_t len, char *errbuf, size_t errlen, allot_config **ret_cfg);

/** Free a config. Accepts NULL. Agents keep their own copy. */
ALLOT_API void allot_config_free(allot_config *cfg);

/* ------------------------------------------------------------------ */
/* The agent                                                           */
/* ------------------------------------------------------------------ */

typedef struct allot_agent allot_agent;

/**
 * A resolved key: (caller identity, endpoint class). Resolve once when a
 * connection is accepted, then pass it to every acquire on that connection:
 * the per-request call does no hashing and no string work. Keys for
 * configured callers live as long as the agent. Keys for unknown identities
 * (the shared default bucket) are pinned by allot_key_resolve() until
 * allot_key_release().
 */
typedef struct allot_key allot_key;

/**
 * Time source for all bucket arithmetic: monotonic nanoseconds from an
 * arbitrary origin, below 2^59 (18 years: buckets store 60-bit times, so
 * an epoch-based wall clock such as CLOCK_REALTIME is not a valid
 * source). Injectable for simulation and tests; production leaves
 * it NULL and the agent uses the CPU's invariant TSC when the kernel trusts
 * it, CLOCK_MONOTONIC otherwise (docs/configuration.md, "Time").
 */
typedef uint64_t (*allot_clock_fn)(void *ctx);

typedef struct allot_agent_options {
	/** Capacity for keys of unknown identities (default 4096). Beyond
	 *  it, new unknown identities share one overflow key per endpoint. */
	uint32_t max_unknown_keys;
	/** Unknown-identity keys idle this long and not pinned are evicted
	 *  (default 300000 ms). 0 disables eviction. */
	uint32_t idle_evict_ms;
	/** Threads that count in a block of their own (default 64): a
	 *  thread's first acquire allocates nkeys * 64 bytes for it, reused
	 *  by a later thread once it exits. Beyond this many live threads
	 *  the rest share one block and count with atomic instructions. */
	uint32_t max_threads;
	/** Log handler and threshold (default NULL, 6). */
	allot_log_fn log;
	void *log_ctx;
	int log_level;
	/** Clock injection (default NULL: the real monotonic clock). */
	allot_clock_fn clock;
	void *clock_ctx;
	/** Coordinator address(es), comma separated (nng URLs such as
	 *  "tcp://127.0.0.1:7400" or "ipc:///run/allot.sock"). NULL runs
	 *  local-only: buckets keep the configured quota as-is. Several
	 *  entries (a URL or NAME=URL each, the name only labelling log
	 *  lines) are a seed list for an allotd Raft cluster: the agent
	 *  keeps one session, with the leader, follows NOT_LEADER, learns
	 *  the other members from the answers, and drops an answer from an
	 *  epoch below the highest seen (docs/configuration.md). */
	const char *coordinator;
	/** Mutual TLS to the coordinator, for "tls+tcp://" addresses: the
	 *  CA that signed allotd's certificate, this replica's certificate
	 *  and private key in one PEM file, and the name to verify allotd's
	 *  certificate against (default: the address's host). Both sides
	 *  verify; a tls+tcp:// address without tls_ca_file is rejected. */
	const char *tls_ca_file;
	const char *tls_cert_key_file;
	const char *tls_server_name;
	/** Name of the protected service (keys are scoped to it). */
	const char *service;
	/** Replica id; default "<hostname>-<pid>". */
	const char *replica_id;
	/** Sync interval T in ms (default 100) and jitter fraction
	 *  (default 0.1, i.e. each interval is T * [0.9, 1.1]). */
	uint32_t sync_interval_ms;
	double sync_jitter;
	/** Replica count assumed for the static split before the first
	 *  reply from the coordinator (default 1: the whole quota). */
	uint32_t initial_replicas;
	/** Lease granted when none is known yet, and the reconnect backoff
	 *  bounds in ms (defaults 3 * T, T, 5000). */
	uint32_t reconnect_min_ms;
	uint32_t reconnect_max_ms;
	/** Certificate rotation (allot_agent_reload_tls()) done by the
	 *  agent itself: every this many ms the sync thread looks whether
	 *  tls_ca_file or tls_cert_key_file changed (inode, size, times)
	 *  and reloads them if so, for short-lived certificates such as
	 *  SPIFFE X509-SVIDs. Default 0: off (call allot_agent_reload_tls()
	 *  when the files change instead). */
	uint32_t tls_reload_check_ms;
	/** Capacity reserved at creation for quotas of configured callers
	 *  (endpoint quotas included) across every config the agent will
	 *  install (allot_agent_set_config(), or the coordinator's): 0 is
	 *  max(2 * ncallers, ncallers + 256), at most 65536. The agent also
	 *  reserves room for 16 endpoints more than the first config names.
	 *  A config beyond either is refused (ALLOT-CONFIG-FULL); restart
	 *  with a larger max_callers. */
	uint32_t max_callers;
	/** With a coordinator: a file where the agent keeps the last quota
	 *  config the coordinator sent (written atomically, mode 0600,
	 *  after every install). allot_agent_create() starts from it
	 *  instead of `cfg` when it holds a config from the same
	 *  coordinator that loads, so that a replica started while the
	 *  coordinator is down runs the config it last received. Default
	 *  NULL: no cache. */
	const char *config_cache_file;
	/** The callers decide with allot_acquire_wait() or
	 *  allot_acquire_async(): the coordinator then keeps this
	 *  replica's buckets of quotas with a central reserve to the body
	 *  of its traffic and pools the rest of its part there, where a
	 *  request its bucket is short of finds it in one round trip
	 *  (docs/integrating.md, "The tail path"). Default false: the agent
	 *  says so from the first such call instead (until then, and for
	 *  callers of allot_acquire() alone, its buckets get their classic
	 *  split). */
	bool waits;
} allot_agent_options;

/** Fill `opts` with the documented defaults. */
ALLOT_API void allot_agent_options_init(allot_agent_options *opts);

/**
 * Create an agent from a quota config. The agent copies what it needs from
 * `cfg`; the caller still owns `cfg`. When `opts->coordinator` is set the
 * sync thread starts before this returns; until the first reply every
 * bucket runs at the static split.
 * @param opts NULL for defaults.
 * @param ret_agent on ALLOT_OK, the agent (allot_agent_destroy()).
 */
ALLOT_API int allot_agent_create(const allot_config *cfg,
    const allot_agent_options *opts, allot_agent **ret_agent);

/*
 * Structs that grow. allot_agent_options, allot_key_stats and
 * allot_sync_stats gain fields in minor releases; the functions that
 * read or write them take the size the caller was compiled with, so
 * that a program built against older headers keeps working with a newer
 * library: the fields it does not know are left at their defaults when
 * read (options) and are not written (statistics; an array's stride is
 * the caller's size). The macros below pass sizeof for you: call
 * allot_agent_create() and the others as before. The names without
 * _sized stay exported for programs built before they existed, with the
 * sizes of this release (docs/compatibility.md).
 */
ALLOT_API int allot_agent_create_sized(const allot_config *cfg,
    const allot_agent_options *opts, size_t opts_size,
    allot_agent **ret_agent);
#define allot_agent_create(cfg, opts, ret_agent) \
	allot_agent_create_sized(                \
	    (cfg), (opts), sizeof(allot_agent_options), (ret_agent))

/**
 * Install a new quota config (the view of the agent's service,
 * allot_agent_options.service) atomically while threads acquire: new
 * and removed callers, weights, shadow, fallback, rates and bursts, the
 * ceiling. Keys already resolved stay valid: a removed caller's keys
 * charge the default quota from then on, and charge its own quota again
 * if a later config brings it back. Counters carry on. Buckets whose
 * rate or burst changed take the new value at once (their level capped
 * at the new burst). The agent copies `cfg`; the caller still owns it.
 * Callable from any thread; calls are serialised.
 * @return ALLOT_OK; ALLOT_ESTATE when the agent has a coordinator (the
 *         coordinator's config is the truth there); ALLOT_EFULL when the
 *         config needs more callers or endpoints than the capacity
 *         reserved at creation (allot_agent_options.max_callers);
 *         ALLOT_ENOMEM; ALLOT_EINVAL for NULL arguments. On any error
 *         nothing changes.
 */
ALLOT_API int allot_agent_set_config(
    allot_agent *agent, const allot_config *cfg);

/**
 * Stop the sync thread (sending a graceful leave when connected) and free
 * everything. Accepts NULL. No other call on `agent` may be running or
 * follow; keys resolved from it become invalid.
 */
ALLOT_API void allot_agent_destroy(allot_agent *agent);

/**
 * Resolve (identity, endpoint) to a key. `identity` is the caller's
 * verified identity (SPIFFE ID, token subject) or NULL/"" for none: those
 * and unrecognised identities land in the shared default bucket. An
 * endpoint absent from `endpoint_weights` uses the `default` weight.
 * Identities longer than ALLOT_IDENTITY_MAX bytes are ALLOT_EINVAL.
 * @param ret_key on ALLOT_OK, a key valid until allot_key_release() and
 *        at most until allot_agent_destroy().
 */
ALLOT_API int allot_key_resolve(allot_agent *agent, const char *identity,
    const char *endpoint, allot_key **ret_key);

/** Unpin a key from allot_key_resolve(). Accepts NULL. */
ALLOT_API void allot_key_release(allot_agent *agent, allot_key *key);

/** The longest identity, in bytes (without the terminating NUL). */
#define ALLOT_IDENTITY_MAX 255
/** The longest endpoint class name, in bytes (without the NUL). */
#define ALLOT_ENDPOINT_MAX 63

/** The endpoint's weight (tokens one request costs) for a key. */
ALLOT_API uint32_t allot_key_cost(const allot_key *key);

/** Pass as `cost` to charge the key's endpoint weight. */
#define ALLOT_COST_DEFAULT 0u

/** The outcome of one acquire. */
typedef struct allot_decision {
	bool allowed; /**< the request may proceed */
	bool shadow_denied; /**< shadow mode: would have been denied */
	/** Which of the key's stacked limits the other fields describe:
	 * the one that denied, or admitted, the one with the fewest tokens
	 * left; 0 is the key's own quota (allot_decision_quota() names
	 * it). Always 0 without stacked limits. */
	uint8_t level;
	uint32_t cost; /**< tokens charged (or that would have been) */
	uint64_t retry_after_ns; /**< denied: exact time until `cost` tokens
	                           exist at the current rate; 0 if allowed */
	uint64_t reset_ns; /**< time until the bucket is full again */
	double limit; /**< bucket capacity (burst) in force */
	double rate; /**< refill rate in force, tokens/second */
	double remaining; /**< tokens left after this decision */
} allot_decision;

/**
 * The hot path. Charge `cost` tokens (ALLOT_COST_DEFAULT: the endpoint
 * weight) to `key`'s bucket. Lock-free, allocation-free, no I/O.
 * Denials write no shared bucket state. A key with stacked limits
 * charges each of them, all or none: a level that denies gives back
 * what the levels before it took (docs/configuration.md).
 * A quota with `access: unlimited` admits every request: `limit`,
 * `rate` and `remaining` are then INFINITY (send no RateLimit header).
 * @return ALLOT_OK with `*ret` filled (allowed or not); ALLOT_ETOOBIG when
 *         `cost` exceeds the quota's burst (the request can never pass;
 *         `*ret` is filled with allowed = false and retry_after_ns = 0);
 *         ALLOT_EFORBIDDEN when the quota that decided is closed
 *         (`access: closed`: answer 403, and do not retry; `*ret` as
 *         for ALLOT_ETOOBIG, `level` naming the quota);
 *         ALLOT_EINVAL for NULL arguments.
 */
ALLOT_API int allot_acquire(
    allot_agent *agent, allot_key *key, uint32_t cost, allot_decision *ret);

/**
 * The name of the quota that decided `d`, a decision of `key`: its
 * level's wire key ("IDENTITY", "IDENTITY ENDPOINT", "*",
 * "* ENDPOINT" or "default"), for the `RateLimit-Policy` of a response.
 * With stacked limits (docs/configuration.md) a request charges
 * several quotas, and this names the one that bound it;
 * "global_ceiling" when it was the global ceiling's level on this
 * replica (docs/allocation.md, "The ceiling's level"). Valid while the
 * agent lives; "default" for NULL arguments.
 */
ALLOT_API const char *allot_decision_quota(
    allot_agent *agent, const allot_key *key, const allot_decision *d);

/**
 * Convenience: resolve (identity, endpoint) without pinning and acquire.
 * Costs one hash lookup more than allot_acquire().
 */
ALLOT_API int allot_acquire_id(allot_agent *agent, const char *identity,
    const char *endpoint, uint32_t cost, allot_decision *ret);

/**
 * Reserve, then reconcile: after an acquire of an estimated cost, report
 * the measured cost once the work is done. An underestimate becomes debt
 * paid from the next tokens; an overestimate is refunded (never above the
 * burst). Settlements are reported to the coordinator like consumption.
 * Each call settles one request the key admitted, and a refund never
 * exceeds what was charged and not yet settled: a settlement beyond the
 * requests admitted refunds nothing, and a refund leaves every other
 * unsettled request at least one token.
 * @param charged the cost the acquire charged (decision.cost).
 * @return ALLOT_OK; ALLOT_ERANGE when only part of the refund (or none)
 *         was made, the key not having been charged that much;
 *         ALLOT_EINVAL for NULL arguments.
 */
ALLOT_API int allot_settle(
    allot_agent *agent, allot_key *key, uint32_t charged, uint32_t measured);

/* ------------------------------------------------------------------ */
/* The tail path: waiting for the central reserve                      */
/* ------------------------------------------------------------------ */

/*
 * A request its local bucket cannot admit may still fit the quota
 * globally: the coordinator keeps each quota's unused capacity in a
 * central reserve (docs/allocation.md, "The central reserve"). The two
 * calls below decide like allot_acquire() and, when it would deny while
 * the quota has a reserve and the coordinator is reachable, ask the
 * coordinator for the tokens and wait for the answer, at most
 * `timeout_ns` (a couple of milliseconds is typical: about two round
 * trips). Asks from every thread and key are batched into one message
 * per round trip. No answer in time, a quota without a reserve or an
 * empty reserve mean the local decision: denied, with the local
 * Retry-After. While no coordinator can be reached at all (an outage, a
 * leader failover) a few such requests are admitted on the quota's
 * standby, at most one sync interval of its rate and a token per outage
 * (central_standby). allot_acquire() itself
 * never waits and is unchanged (docs/integrating.md, "The tail path").
 */

/** Default wait for the central answer, in ns: 20 ms (a round trip on a
 *  busy machine; an answer normally comes in one, well under 1 ms). */
#define ALLOT_WAIT_DEFAULT_NS 20000000u

/** A pending decision of allot_acquire_async(): the caller's memory,
 *  which must stay valid until the callback has run. */
typedef struct allot_wait allot_wait;

/**
 * The decision of an allot_acquire_async() that returned
 * ALLOT_EINPROGRESS. Runs exactly once, on the agent's sync thread, by
 * the deadline: it must not block, and may call allot_acquire() or
 * allot_acquire_async() but not allot_acquire_wait(). `w` may be reused
 * or freed once it returns.
 */
typedef void (*allot_wait_cb)(allot_wait *w, const allot_decision *d);

struct allot_wait {
	void *data; /**< the caller's: never touched by the agent */
	uint64_t priv_[12]; /**< the agent's while a decision is pending */
};

/**
 * As allot_acquire(), then, when the local bucket denies and the
 * quota's central reserve may have room, wait up to `timeout_ns` for it.
 * Blocks the calling thread (never the agent's own); never longer than
 * the timeout plus the agent's timer granularity (about 1 ms).
 * @return as allot_acquire(); `*ret` is the final decision.
 */
ALLOT_API int allot_acquire_wait(allot_agent *agent, allot_key *key,
    uint32_t cost, uint64_t timeout_ns, allot_decision *ret);

/**
 * Convenience: resolve (identity, endpoint) without pinning, as
 * allot_acquire_id(), then allot_acquire_wait().
 */
ALLOT_API int allot_acquire_id_wait(allot_agent *agent, const char *identity,
    const char *endpoint, uint32_t cost, uint64_t timeout_ns,
    allot_decision *ret);

/**
 * The same without blocking: for a service on an event loop (libuv,
 * epoll). When the decision is made at once (the local bucket admits,
 * or the central path does not apply) it is in `*ret`, ALLOT_OK is
 * returned and `cb` never runs. Otherwise ALLOT_EINPROGRESS is returned
 * and `cb` runs once with the decision, on the agent's sync thread,
 * within `timeout_ns` plus about 1 ms: post it to your own loop from
 * there (uv_async_send(), an eventfd write). `w` must stay valid until
 * then. On any other return `cb` never runs.
 */
ALLOT_API int allot_acquire_async(allot_agent *agent, allot_wait *w,
    allot_key *key, uint32_t cost, uint64_t timeout_ns, allot_wait_cb cb,
    allot_decision *ret);

/* ------------------------------------------------------------------ */
/* Metrics                                                             */
/* ------------------------------------------------------------------ */

/** Counters of one key, since the agent started. */
typedef struct allot_key_stats {
	char identity[ALLOT_IDENTITY_MAX + 1]; /**< "" for the overflow key */
	char endpoint[ALLOT_ENDPOINT_MAX + 1]; /**< endpoint class ("default"
	                                         if none) */
	const char *quota; /**< identity of the quota charged or
	                        "default"; valid while the agent lives */
	bool known; /**< identity is a configured caller */
	bool shadow; /**< quota is in shadow mode */
	uint64_t allowed; /**< admitted, shadow would-be denials included */
	uint64_t denied; /**< enforced denials */
	uint64_t shadow_denied; /**< shadow would-be denials (admitted) */
	uint64_t tokens_spent;
	uint64_t tokens_denied; /**< of enforced denials */
	uint64_t tokens_shadow; /**< of shadow would-be denials (admitted,
	                             so also in tokens_spent) */
	double rate; /**< the bucket's current local rate */
	double limit; /**< the bucket's current local burst */
	double utilization; /**< 1 - level / burst, now: the fraction of
	                         the bucket drained (the leading signal) */
	/* The coordinator's view of the key's quota (all zero when
	 * local-only), published by the sync thread after each exchange
	 * and lease check: the fields may come from neighbouring rounds. */
	bool in_fallback; /**< its lease ran out: on its fallback */
	int64_t lease_remaining_ms; /**< until the allowance's lease ends;
	                                 negative once expired, 0 before the
	                                 first grant */
	double granted_rate; /**< the coordinator's last allowance
	                          (tokens/s), kept through a fallback */
	double granted_burst; /**< its burst */
} allot_key_stats;

/**
 * Snapshot the counters of up to `cap` keys with any activity into `out`.
 * @param ret_n the number of keys with activity (may exceed `cap`; call
 *        again with a larger array to get them all).
 */
ALLOT_API int allot_stats(
    allot_agent *agent, allot_key_stats *out, size_t cap, size_t *ret_n);

/** Counters of one key. */
ALLOT_API int allot_key_stats_get(
    allot_agent *agent, const allot_key *key, allot_key_stats *ret);

/** allot_stats() and allot_key_stats_get() for a caller whose
 * allot_key_stats is `size` bytes (the macros pass it). */
ALLOT_API int allot_stats_sized(allot_agent *agent, allot_key_stats *out,
    size_t cap, size_t size, size_t *ret_n);
ALLOT_API int allot_key_stats_get_sized(allot_agent *agent,
    const allot_key *key, allot_key_stats *ret, size_t size);
#define allot_stats(agent, out, cap, ret_n) \
	allot_stats_sized(                  \
	    (agent), (out), (cap), sizeof(allot_key_stats), (ret_n))
#define allot_key_stats_get(agent, key, ret) \
	allot_key_stats_get_sized(           \
	    (agent), (key), (ret), sizeof(allot_key_stats))

/**
 * Certificate rotation: re-read `tls_ca_file` and `tls_cert_key_file`
 * (the paths given at creation) and use them from now on, without
 * dropping the session. Callable from any thread; it waits for the sync
 * thread to do it (so not from a log handler). On success the next
 * Register's identity proof is signed with the new key at once, and the
 * next connection to each coordinator presents the new certificate: nng
 * cannot change the certificate of a live dialer, so a new one is made
 * and started when the current connection drops; the connection in
 * progress (its handshake already made) and the session carry on.
 * @return ALLOT_OK; ALLOT_EIO when a file cannot be read; ALLOT_ECONFIG
 *         when its contents are not a usable CA, certificate or key (the
 *         key does not match the certificate); ALLOT_ENOMEM; ALLOT_ESTATE
 *         for an agent with no tls+tcp:// coordinator. On any error
 *         nothing changes: the agent keeps the certificate it had.
 */
ALLOT_API int allot_agent_reload_tls(allot_agent *agent);

/** State of the coordinator sync loop (all zero when local-only). */
typedef struct allot_sync_stats {
	bool enabled; /**< a coordinator is configured */
	bool connected; /**< registered and replies arriving */
	bool in_fallback; /**< a lease expired: fallback in force */
	uint32_t replicas; /**< live replicas, as last told */
	uint64_t config_epoch; /**< the coordinator's config epoch */
	uint64_t config_digest; /**< the coordinator's config digest */
	uint64_t session; /**< current session id (0: none) */
	uint64_t registers; /**< Register messages answered */
	uint64_t syncs_ok; /**< Sync exchanges answered */
	uint64_t syncs_failed; /**< timeouts, transport and decode errors */
	uint64_t errors_received; /**< Error replies from the coordinator */
	uint64_t fallback_enters; /**< lease expiries (fail-static ended) */
	uint64_t fallback_leaves; /**< recoveries from fallback */
	uint64_t unknown_keys; /**< keys the coordinator had no quota for */
	uint64_t reports_sent; /**< key reports sent in total */
	uint64_t bytes_sent; /**< Sync message bytes sent in total */
	uint64_t last_rtt_us; /**< round trip of the last exchange */
	uint64_t unreported_tokens; /**< consumed between sessions (e.g.
	                             during an outage), not replayed to the
	                             new session */
	int64_t lease_remaining_ms; /**< < 0 once expired */
	uint32_t members; /**< coordinator members known: the seed list
	                       and the members the cluster named (1: one
	                       allotd) */
	uint32_t members_down; /**< unused since the Raft cluster: 0 */
	uint64_t reroutes; /**< unused since the Raft cluster: 0 */
	uint64_t not_owner; /**< unused since the Raft cluster: 0 */
	uint64_t throttled; /**< RATE_LIMITED answers (this host over its
	                         per-peer budget): backed off, allowances
	                         unchanged */
	uint32_t keys_unconfirmed; /**< keys running on an allowance the
	                                member now synced with has not
	                                answered for yet (the session moved
	                                to a new leader) */
	uint64_t early_syncs; /**< Syncs sent before the interval was up
	                           because a key started denying */
	uint64_t enforced_digest; /**< digest of the config the agent
	                               enforces (config_digest is the
	                               coordinator's) */
	uint64_t config_installs; /**< configs received from the
	                               coordinator and installed */
	uint64_t config_rejects; /**< configs received and refused (digest
	                              mismatch, parse or install failure) */
	uint64_t leader_switches; /**< a cluster: times the session moved
	                               to another member (NOT_LEADER, a
	                               failed exchange, a lower epoch) */
	uint64_t not_leader; /**< NOT_LEADER answers (a follower) */
	uint64_t stale_epoch; /**< Welcomes and Replies dropped unapplied:
	                           their epoch was below leader_epoch (a
	                           deposed leader) */
	uint64_t leader_epoch; /**< the highest leader epoch seen (0: a
	                            single allotd) */
	uint64_t loan_tokens; /**< tokens the coordinator lent this agent
	                           at once when a key started denying
	                           (Share.prefill, docs/allocation.md
	                           "Loans") */
	uint64_t debit_tokens; /**< tokens taken back from this agent's
	                            idle buckets for other replicas' loans
	                            (Share.debit) */
	/* The tail path (allot_acquire_wait(), allot_acquire_async()). */
	uint64_t central_asks; /**< Ask messages answered */
	uint64_t central_allowed; /**< requests admitted from the central
	                               reserve */
	uint64_t central_denied; /**< requests that waited and were denied
	                              (reserve empty, no answer in time) */
	uint64_t central_tokens; /**< tokens granted by the reserves */
	uint64_t central_wait_ns; /**< time those requests waited, summed */
	uint64_t central_wait_max_ns; /**< the longest of those waits */
	uint64_t central_late; /**< of central_denied: no answer by the
	                            deadline */
	uint64_t central_short; /**< requests a Grant (or a failed Ask)
	                             did not cover: decided on the local
	                             bucket then, most of them denied */
	uint64_t central_dry; /**< denied at once without asking: the
	                           reserve had said it was empty, or no
	                           session could be asked */
	uint64_t central_lost; /**< Asks whose answer did not come in time:
	                           their requests were asked for again */
	uint64_t central_standby; /**< admitted while no coordinator could be
	                               asked, their bucket run into debt
	                               (at most one sync interval of its
	                               rate per outage) */
	uint64_t usage_incarnation; /**< the agent's account: the number
	                                 its Usage records are booked under
	                                 (docs/operations.md, "The
	                                 accounting guarantee") */
	uint64_t usage_pending; /**< seconds of decisions (Usage records)
	                             not yet durable at the coordinator */
	uint64_t usage_durable; /**< the highest Usage id the coordinator
	                             confirmed durable */
	uint64_t usage_folded; /**< records folded into a minute: the list
	                            of waiting records was full */
	uint64_t usage_dropped_tokens; /**< tokens of records dropped: every
	                                    waiting minute was folded
	                                    already (never silently: logged
	                                    as ALLOT-SYNC-USAGE-LOST) */
} allot_sync_stats;

/** Snapshot of the sync loop's state and counters. */
ALLOT_API int allot_sync_stats_get(allot_agent *agent, allot_sync_stats *ret);
/** allot_sync_stats_get() for a caller whose allot_sync_stats is `size`
 * bytes (the macro passes it). */
ALLOT_API int allot_sync_stats_get_sized(
    allot_agent *agent, allot_sync_stats *ret, size_t size);
#define allot_sync_stats_get(agent, ret) \
	allot_sync_stats_get_sized((agent), (ret), sizeof(allot_sync_stats))

/* ------------------------------------------------------------------ */
/* Response headers                                                    */
/* ------------------------------------------------------------------ */

/**
 * Retry-After value (delta-seconds, rounded up, at least 1 for a denial)
 * into `buf`. @return the length written (without NUL), or the length
 * needed if `len` is too small, as snprintf.
 */
ALLOT_API int allot_fmt_retry_after(
    const allot_decision *d, char *buf, size_t len);

/**
 * The IETF RateLimit fields (draft-ietf-httpapi-ratelimit-headers):
 * `RateLimit-Policy` value, e.g. `"default";q=20;w=2` and `RateLimit`
 * value, e.g. `"default";r=7;t=1`. `name` names the policy (e.g. the
 * quota); NULL means "default". It is written as a structured-field
 * string (RFC 9651): `"` and `\` escaped, and each byte such a string
 * cannot hold (controls, anything outside printable ASCII) as `?`, so
 * the field is valid whatever the quota's name. A decision of an
 * unlimited quota (`limit` INFINITY) has no policy: both write ""
 * (return 0), and no field should be sent.
 */
ALLOT_API int allot_fmt_ratelimit_policy(
    const allot_decision *d, const char *name, char *buf, size_t len);
/** A buffer this large holds either field whatever the policy's name,
 * up to a quota's longest (its identity, a space and its endpoint),
 * every byte of it escaped: the terminating NUL included. */
#define ALLOT_RATELIMIT_FIELD_MAX \
	(2 * (ALLOT_IDENTITY_MAX + 1 + ALLOT_ENDPOINT_MAX) + 2 + 48)
ALLOT_API int allot_fmt_ratelimit(
    const allot_decision *d, const char *name, char *buf, size_t len);

/**
 * The common X-RateLimit-* triple. `now_unix` is the wall-clock time in
 * seconds used for X-RateLimit-Reset (an epoch timestamp by convention);
 * pass 0 for delta-seconds instead. An unlimited quota's decision
 * (`limit` INFINITY) leaves all three "".
 */
typedef struct allot_xheaders {
	char limit[24];
	char remaining[24];
	char reset[24];
} allot_xheaders;
ALLOT_API void allot_fmt_xratelimit(
    const allot_decision *d, int64_t now_unix, allot_xheaders *ret);

#ifdef __cplusplus
}
#endif
#endif /* ALLOT_ALLOT_H */
