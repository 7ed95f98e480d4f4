/* SPDX-License-Identifier: MIT */
/*
 * The sync protocol engine of the agent, without a transport: it builds
 * the next request (Register or Sync) from the buckets' counters, applies
 * replies (installing allowances), and runs the lease / fallback / backoff
 * state machine, all at an explicit time `now`. It reads the agent's
 * quotas and counters and installs allowances through the installer it
 * was created with (agent_int.h), never calling back into agent.c. sync.c
 * drives it over nng from a libuv loop; the simulator drives it over a
 * simulated transport on a virtual clock. One driver thread at a time; the
 * counters are atomics so allot_sync_stats_get() may read them from any
 * thread.
 */
#ifndef ALLOT_AGENT_SYNC_INT_H
#define ALLOT_AGENT_SYNC_INT_H

#include "account.h"
#include "agent_int.h"
#include "ledger.h"

typedef struct allot__qsync {
	uint64_t last_spent; /* tokens reported as consumed so far */
	uint64_t last_denied;
	uint64_t last_shadow; /* shadow would-deny tokens reported */
	double demand; /* smoothed tokens/s */
	double share_rate; /* last allowance from the coordinator */
	double share_burst;
	/* and its own before the ceiling's cut (Share.own_rate, own_burst;
	 * 0: none) */
	double share_own_rate, share_own_burst;
	bool has_share;
	/* The allowance in force came from another member (the session
	 * moved, sync.c): reported with what it runs on (KeyReport.foreign,
	 * held_rate, held_burst) until this one grants it a share. */
	bool foreign;
	bool denying; /* its last report carried denials */
	/* Tokens its bucket dropped when a lower burst was installed, not
	 * reported yet (KeyReport.returned). */
	uint64_t returned;
	allot__ledger ledger; /* what a full bucket discarded (ledger.h) */
	bool tail_said; /* its last report's KeyReport.tail */
} allot__qsync;

/* Where the next exchange goes, as the last answer says. */
typedef enum allot__route {
	ALLOT__ROUTE_STAY, /* the same member */
	ALLOT__ROUTE_LEADER, /* NOT_LEADER naming the leader: syncc.leader */
	ALLOT__ROUTE_NEXT, /* NOT_LEADER without one, or a lower epoch */
} allot__route;

#define ALLOT__URL_MAX 256u

typedef enum allot__expect {
	ALLOT__EXPECT_WELCOME,
	ALLOT__EXPECT_REPLY,
} allot__expect;

typedef struct allot__syncc {
	allot_agent *a; /* read only: its quotas, options and counters */
	allot__installer in; /* where allowances go */
	allot__expect expect;
	uint64_t session;
	uint64_t seq;
	uint64_t applied_seq; /* the Sync whose Reply was applied last */
	uint64_t lease_until_ns;
	uint64_t answered_ns; /* the last Welcome or Reply applied */
	uint64_t last_sync_ns;
	uint64_t sent_ns;
	uint32_t sent_reports;
	size_t sent_bytes;
	uint32_t backoff_ms;
	bool welcomed; /* a Welcome came: the next Sync after T/2 */
	bool early; /* the next Sync goes out early (syncc_early_due) */
	bool early_sent; /* the last Sync went out early */
	bool returning; /* a lower burst dropped more tokens than it
	                   keeps: the next Sync after T/8 (sync_core.c,
	                   install_share) */
	uint64_t rng;
	/* Per quota, sized a->quota_cap: a config installed from a reply
	 * appends quotas (sync_core.c, "The config plane"). */
	allot__qsync *q;
	bool *seen; /* scratch */
	double *was; /* scratch: rate, burst, fallback of each quota */
	/* The config plane: keys this session knows (its Register's and
	 * the add_keys it acknowledged), the add_keys of the Sync in flight,
	 * and the backoff of a config that would not install. */
	uint32_t nwire;
	uint32_t adding;
	uint64_t bad_digest;
	uint64_t bad_until_ns;
	uint32_t bad_backoff_ms;
	/* Where an installed config's text is cached (config_cache.c);
	 * NULL: nowhere. Set by the driver. */
	const char *cache_path;
	/* The member this session talks to, for log lines (sync.c). NULL:
	 * the agent's coordinator option. */
	const char *peer;
	/* With TLS and a certificate: signs every Register (sign.h); owned
	 * by the driver. NULL: Registers carry no identity proof. */
	struct allot__signer *signer;
	/* A cluster (sync.c, docs/configuration.md "Agent options"): the
	 * highest leader epoch seen in a Welcome or Reply (one with a lower
	 * epoch is dropped unapplied: a deposed leader), where the last
	 * answer says to go (allot__syncc_take_route()), and the member
	 * list each Welcome, Reply and NOT_LEADER carries, handed to the
	 * driver's `learn` (NULL: ignored, as in the simulator). */
	uint64_t epoch_seen;
	allot__route route;
	char leader[ALLOT__URL_MAX];
	void (*learn)(void *ctx, char *const *urls, size_t n);
	void *learn_ctx;

	/* The unknown identities that asked the most at the driver's last
	 * look (strangers.c), for the next Sync; then none. */
	allot__stranger strangers[ALLOT__STRANGERS_MAX];
	size_t nstrangers;

	/* What the agent decided, until the coordinator says it is
	 * durable (account.h). */
	allot__account acct;
	allot__logrl acct_rl;
	uint64_t acct_dropped_said;

	_Atomic bool connected;
	_Atomic bool in_fallback;
	_Atomic uint32_t replicas;
	_Atomic uint64_t epoch;
	_Atomic uint64_t digest;
	_Atomic uint64_t session_pub;
	_Atomic uint64_t registers;
	_Atomic uint64_t syncs_ok;
	_Atomic uint64_t syncs_failed;
	_Atomic uint64_t errors_received;
	_Atomic uint64_t fallback_enters;
	_Atomic uint64_t fallback_leaves;
	_Atomic uint64_t unknown_keys;
	_Atomic uint64_t reports_sent;
	_Atomic uint64_t bytes_sent;
	_Atomic uint64_t last_rtt_us;
	_Atomic uint64_t unreported_tokens;
	_Atomic uint64_t throttled_n; /* RATE_LIMITED answers */
	_Atomic uint64_t early_syncs; /* Syncs sent early, short */
	_Atomic uint64_t loan_tokens; /* lent to this agent (prefill) */
	_Atomic uint64_t debit_tokens; /* taken back from it (debit) */
	_Atomic uint64_t enforced; /* digest of the config in force */
	_Atomic uint64_t config_installs; /* configs installed from replies */
	_Atomic uint64_t config_rejects; /* refused (digest, parse, install) */
	_Atomic uint32_t unconfirmed; /* keys still foreign */
	_Atomic uint64_t not_leader_n; /* NOT_LEADER answers */
	_Atomic uint64_t
	    stale_epoch_n; /* Welcomes, Replies of a lower epoch */
	_Atomic uint64_t epoch_pub; /* epoch_seen, for the stats */
	bool throttled; /* the last answer was RATE_LIMITED */
	bool reconfigured; /* allot__syncc_take_reconfigured() */
	_Atomic int64_t lease_until_pub;
	allot__logrl fail_rl;
} allot__syncc;

/* An engine for agent `a`'s quotas that installs allowances through
 * `in`; `seed` starts its jitter. */
int allot__syncc_create(allot__syncc *c, allot_agent *a, uint64_t seed,
    const allot__installer *in);

/* The same, installing straight into `a`'s buckets (agent.c): for the
 * drivers that have no installer of their own (the simulator, the fuzz
 * targets, the benchmarks). */
int allot__syncc_init(allot__syncc *c, allot_agent *a, uint64_t seed);
void allot__syncc_fini(allot__syncc *c);

/* The next request: Register when there is no session, else Sync.
 * On ALLOT_OK `*ret_buf` (malloc) belongs to the caller. */
int allot__syncc_request(
    allot__syncc *c, uint64_t now, void **ret_buf, size_t *ret_len);

/* A Leave for the current session, or ALLOT_ESTATE when there is none. */
int allot__syncc_leave(allot__syncc *c, void **ret_buf, size_t *ret_len);

/* Apply a reply received at `now`. Returns true when the exchange
 * succeeded (the coordinator is alive and answered sensibly). */
bool allot__syncc_reply(
    allot__syncc *c, uint64_t now, const void *buf, size_t len);

/* The exchange failed (timeout, transport error): back off. */
void allot__syncc_failed(allot__syncc *c, uint64_t now, const char *why);

/* Enter fallback if the lease ran out. */
void allot__syncc_check_lease(allot__syncc *c, uint64_t now);

/* The quotas in use: the engine's thread is the one that appends to
 * them. */
static inline uint32_t
allot__syncc_nq(const allot__syncc *c)
{
	return atomic_load_explicit(&c->a->nquotas, memory_order_relaxed);
}

/* When to run the next exchange, in ms from now (sync_schedule.c): the
 * interval with jitter after success, a full-jitter backoff after failure,
 * never past the lease expiry, and 0 when a re-registration is due. */
uint64_t allot__syncc_next_delay_ms(allot__syncc *c, uint64_t now, bool ok);

/* Whether to run an exchange now, before the interval is up: a key
 * (other than `default`) started denying since the last report, which
 * had none, and at least a quarter interval has passed since the last
 * Sync. Reads only the keys' counters (no lock); the driver calls it on
 * a timer finer than the interval while no exchange is in flight, and
 * on true runs the exchange at once (the Sync says `early`). */
bool allot__syncc_early_due(allot__syncc *c, uint64_t now);

/* The seed of a new engine's account incarnation (sync_account.c). */
uint64_t allot__syncc_acct_seed(const allot_agent *a, uint64_t seed);

/* Take the quotas' counters into the account at `now` (sync_account.c):
 * each exchange does, before it builds its request or Leave. */
void allot__syncc_acct_take(allot__syncc *c, uint64_t now);

/* The account's clock (account.h): the driver calls it between
 * exchanges, every eighth of an interval. The counters are taken (as at
 * each exchange) at the last call before a second ends and the first
 * after it, so that a decision is recorded in the second it was made in,
 * or, made in the last eighth of an interval of a second, in the next. */
void allot__syncc_tick(allot__syncc *c, uint64_t now);

/* Whether the engine installed a config (a->nquotas may have grown)
 * since the driver last asked; clears the flag. */
bool allot__syncc_take_reconfigured(allot__syncc *c);

/* The session moved to another member: every key's allowance is now
 * foreign to it, and said so in its reports until it answers for it. */
void allot__syncc_moved(allot__syncc *c);

/* Where the last answer says the next exchange goes; clears it. On
 * ALLOT__ROUTE_LEADER the leader's URL is in `c->leader`. */
allot__route allot__syncc_take_route(allot__syncc *c);

/* Fill the public stats from the engine. */
void allot__syncc_stats(allot__syncc *c, uint64_t now, allot_sync_stats *ret);

#endif
