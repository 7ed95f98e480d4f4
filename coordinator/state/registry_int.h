/* SPDX-License-Identifier: MIT */
/*
 * The private structures of the coordinator state (state.h), shared by
 * the files that implement it and included by no other. The state is the
 * whole: the config in force (a cfgv, config_view.c), the registry of
 * services and their sessions (registry.c), per key the demand estimates
 * (demand.c), per quota the live bound (bounds.c), the grants
 * (grants.c) and the candidate's evaluation (candidate.c), cluster
 * the take-over learning (learning.c), and on top of those the
 * requests (register.c), the restart (restore.c), the rendering
 * (render.c) and the periodic work (state.c). Calls go one way, down
 * that list; the prototypes below are grouped the same way.
 *
 * Everything here is guarded by the state's one mutex (st->mu) unless a
 * comment says otherwise: every function declared below expects it held,
 * except the allot__cfgv_* ones, which work on a view not installed yet
 * or on the one in force. Under the lock: array indexing and memory only;
 * anything that formats a log line is done after unlocking, from values
 * copied out; store records only append to the store's in-memory batch,
 * so they are allowed inside.
 *
 * Layout, chosen for the per-report path: a session keeps only the keys
 * of its Register that name a quota (at most one per quota index of the
 * config, duplicates being refused), each naming a quota index of the
 * config in force, or -1 after a reload took its quota away; its service
 * holds one squota per quota index. Keys without a quota are counted, not
 * kept: they cost no memory and no work per tick, however many a Register
 * lists (docs/operations.md, "Memory bounds"). When every key of the
 * Register was kept, the kept array is indexed by the Register's key id
 * and a key report is two bounds checks, two array loads and a few
 * additions; otherwise `kid` maps kept keys to key ids and a report is a
 * binary search over the session's kept keys.
 */
#ifndef ALLOT_COORDINATOR_REGISTRY_INT_H
#define ALLOT_COORDINATOR_REGISTRY_INT_H

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "clock.h"
#include "config_index.h"
#include "protocol.h"
#include "state.h"

/* One service's view of the file (config_view.c): the quotas that
 * apply to it, indexed by wire key, each mapped to its quota index. */
typedef struct cfgv_svc {
	const char *name; /* into cfg */
	allot_config *view; /* allot__config_select(), owned */
	allot__config_index index; /* wire key -> view quota (0: default) */
	int32_t *gq; /* view quota -> quota index */
} cfgv_svc;

/* A loaded config with what the hot paths derive from it (config_view.c).
 * Owns the config and its arrays, and never changes once built. The
 * loop thread replaces st->cur under the lock (allot__state_reload())
 * and frees the old view after unlocking: nothing may keep a pointer
 * into it past the lock (render.c copies what it shows). Quota indexes
 * are shared by every service: 0 is the top-level default, 1..ntop-1 the
 * top-level callers, then each service section's own quotas; a service
 * reaches only those of its view (allot__cfgv_find_svc()). */
typedef struct cfgv {
	allot_config *cfg;
	uint64_t epoch;
	int64_t loaded_wall_ms;
	char *path;
	/* The file's bytes as read, what agents receive (docs/protocol.md,
	 * "The config plane"); NULL when it is above
	 * ALLOT__STATE_CONFIG_PUSH_MAX (never pushed) or was not given.
	 * text_len is the file's length either way. */
	char *text;
	size_t text_len;
	size_t nq; /* quotas of every scope */
	size_t ntop; /* 1 + ncallers: the top level's */
	const allot__quota **q; /* q[i] for quota index i */
	const char **names; /* q[i]'s wire key (allot__quota_key()) */
	const char **qsvc; /* the service whose section q[i] is; NULL: the
	                      top level's, in every service's view */
	double *rate; /* q[i]->rate, contiguous */
	double *burst;
	allot__config_index index; /* the top level: wire key -> index */
	cfgv_svc *svc; /* the services the file names, by name */
	size_t nsvc;
} cfgv;

/* One interned key of a session: owned by its session (the array of its
 * kept keys, see session.kid). */
typedef struct skey {
	int32_t q; /* quota index; -1: no quota for it */
	bool rec_pending; /* share changed since its store row */
	double consumed; /* allocator window: tokens admitted */
	double denied; /* allocator window: tokens denied */
	double demand; /* last reported demand, tokens/s */
	double held; /* last reported bucket level */
	uint64_t held_ns; /* when; 0: never reported */
	double rate; /* target share (allocator output) */
	double burst;
	double grant_rate; /* grant: what the agent was last sent */
	double grant_burst; /* (NaN: nothing yet, holds no share) */
	double hold_rate; /* the largest grant it may still hold: */
	double hold_burst; /* sent, or more until acknowledged */
	/* Its own allowance before the ceiling's cut, as last sent
	 * (Share.own_rate, own_burst; agent/ceiling.c): at least the
	 * grant; NaN: none sent, the grant. */
	double own_rate;
	double own_burst;
	/* the largest it may still run on: sent, or more until
	 * acknowledged (NaN: none) */
	double own_hold_rate;
	double own_hold_burst;
	/* and its target (the allocator's own_rate, own_burst; 0: none) */
	double own_target_rate;
	double own_target_burst;
	double reply_target; /* the target when it was last answered */
	double est; /* demand estimate, tokens/s */
	double est2; /* its second moment, (tokens/s)^2 */
	double slow; /* the same demand averaged ALLOT__SLOW_TAUS times
	                longer, tokens/s: where the callers' traffic
	                lands in the long run (demand.c) */
	double body; /* the body of its demand, tokens/s: the same
	                average over windows each clipped to twice it
	                (demand.c), so that a burst barely moves it */
	uint64_t est_ns; /* est covers up to here; 0: never */
	double credit; /* tokens it may still report (plausibility) */
	uint64_t credit_ns; /* credit brought up to here; 0: never */
	/* Denials' plausibility (sync.c, denials()): a lower bound of its
	 * agent's bucket level as of low_ns (0: none yet), and the smallest
	 * grant (rate, burst) the agent may have run since the answer it
	 * last acknowledged: 0 until one, lowered by every grant sent
	 * (grants.c). */
	double low;
	uint64_t low_ns;
	double low_rate;
	double low_burst;
	double resets; /* restarts of the bound it may still make */
	bool denials_refuted; /* its last report's denials were not booked */
	bool targeted; /* rate/burst hold an allocator output */
	bool was_short; /* its grant was below its target at some
	                   point since the last round */
	bool force_share; /* the next Reply carries its share (cluster:
	                     it reported an allowance from elsewhere) */
	/* Loans (grants.c): the extra burst it was lent (sent on top of
	 * grant_burst) until loan_until_ns, and what its next Reply adds
	 * to (prefill) or takes from (debit) its bucket. */
	double loan_burst;
	double loan_hold; /* the larger, until the agent acknowledges */
	uint64_t loan_until_ns;
	double loan_prefill;
	double loan_debit;
	/* Tokens the central reserve granted it (ask.c) that its reports
	 * have not yet claimed as consumed: added to what they may claim. */
	double central;
	/* What its bucket may have dropped since its grants fell (or its
	 * bootstrap allowance gave way to its first grant): the most its
	 * reports may give back to the reserve (KeyReport.returned). */
	double returnable;
	/* Its agent said in its last report that it waits for the central
	 * reserve (KeyReport.tail): it runs the bursts it is sent, not
	 * raised to the largest endpoint weight. */
	bool tail;
	/* The standby (central.c, allot__standby_rate()): what the reserve
	 * served it lately, a sum decaying with a one-second time constant
	 * as of srv_ns; the standby rate last sent (Share.standby) and the
	 * largest sent since its agent acknowledged, which the reserve holds
	 * back while that agent is silent (bounds.c). */
	double srv_sum;
	uint64_t srv_ns;
	double standby;
	double standby_hold;
} skey;

/* The rate an agent may hold on a key: its grant, or an earlier larger
 * grant it has not acknowledged, or what it ran on before registering
 * again. */
static inline double
key_hold(const skey *key)
{
	double r = isnan(key->grant_rate) ? 0 : key->grant_rate;
	return isnan(key->hold_rate) || key->hold_rate < r ? r :
	                                                     key->hold_rate;
}

/* What a key's own allowance adds to its grant (skey.own_rate): 0
 * without one. */
static inline double
own_extra_rate(const skey *key)
{
	return isnan(key->own_rate) || isnan(key->grant_rate) ?
	    0 :
	    key->own_rate - key->grant_rate;
}

static inline double
own_extra_burst(const skey *key)
{
	return isnan(key->own_burst) || isnan(key->grant_burst) ?
	    0 :
	    key->own_burst - key->grant_burst;
}

struct service;
typedef struct allot__vtab allot__vtab;

/* A replica's session (registry.c): owned by its service (svc->sess),
 * linked into st->htab unless it is a placeholder of a restart.
 * Its strings and keys are its own. */
typedef struct session {
	uint64_t id;
	uint32_t pipe; /* nng pipe it registered on; 0: not bound */
	char *replica_id;
	char *host;
	char *agent_version;
	uint32_t pid;
	uint64_t digest;
	struct service *svc;
	uint32_t slot; /* index in svc->sess */
	uint32_t nwire; /* keys listed in its Register */
	uint32_t boot_replicas; /* its Register's expected_replicas (>= 1):
	                           it ran R/n, B/n of each quota before its
	                           first grants */
	bool waits; /* Register.waits: its callers wait for the central
	               reserve (skey.tail of every key from the start) */
	/* Register.incarnation: its agent's account (usage.c); 0: none,
	 * audited from its KeyReports. */
	uint64_t incarnation;
	uint64_t usage_seen; /* the highest Usage id it sent */
	uint32_t nkeys; /* keys kept: those that named a quota */
	uint32_t nknown; /* kept keys with q >= 0 */
	skey *keys;
	uint32_t *kid; /* per kept key its Register key id, ascending;
	                  NULL: every key was kept, kid[i] == i */
	char **names; /* kept key identities (into names_blob) */
	char *names_blob;
	/* The config plane: the digest whose text we last sent it, and
	 * when (no resend of the same text before
	 * ALLOT__STATE_CONFIG_RESEND_MS). */
	uint64_t pushed_digest;
	uint64_t pushed_ns;
	bool reregister; /* a reload added quotas and it listed keys
	                    without one: its next Sync is answered
	                    UNKNOWN_SESSION so that it registers again */
	uint64_t last_seq;
	uint64_t last_seen_ns;
	uint64_t last_sync_ns;
	uint64_t expiry_ns;
	int64_t joined_wall_ms;
	int64_t seen_wall_ms;
	uint64_t sent_gen;
	uint32_t replies_since_full;
	uint32_t pending; /* keys whose grant is below target */
	bool force_full;
	/* A key of it has a loan or a debit its next Reply must carry
	 * (grants.c): the Reply builds its shares. */
	bool loan_due;
	bool placeholder; /* restored from the store, not back yet;
	               holds a key per quota, never syncs */
	bool seen_dirty; /* synced since its last-seen row */
	uint64_t peer; /* who registered it (state.h); 0: unknown */
	bool join_pending; /* a newcomer whose peer had another replica
	                      of the service: its first Sync, not its
	                      Register, moves demand to it
	                      (allot__conserve_join) */
	bool unacked; /* some key's may_* is above its grant */
	uint32_t nvalues; /* values it holds a part of (values.c) */
	double interval_s; /* its sync interval (demand smoothing) */
	uint64_t last_reply_ns; /* our last answer: its lease runs from */
	uint32_t last_replicas; /* here at the latest, and the count */
	uint64_t acked_reply_ns; /* the last answer it acknowledged: its */
	uint32_t acked_replicas; /* lease runs from here at the earliest */
	uint64_t welcomed_ns; /* its Welcome (register.c) */
	struct session *hnext;
} session;

/* One quota of one service: per quota index of st->cur, owned by the
 * service (svc->q); re-mapped by identity when the config changes. */
typedef struct squota {
	uint64_t allowed_total; /* tokens, since start (counters) */
	uint64_t denied_total;
	uint64_t win_allowed; /* since the last per-second pass */
	uint64_t win_denied;
	double demand_sum; /* sum of the demand estimates, tokens/s */
	double level; /* global bucket estimate, tokens */
	uint64_t level_ns; /* when `level` was last brought up */
	double level_recorded;
	double target_sum_rate; /* sum of targets (allocator outputs) */
	double target_sum_burst;
	double granted_rate; /* sum of grants: what replicas hold */
	double granted_burst;
	/* What the replicas' own allowances (skey.own_rate) add to the
	 * grants: each key's own less its grant, summed. */
	double own_extra_rate;
	double own_extra_burst;
	double own; /* the allocator's aq->own: R / allowance, or 0 */
	double allowance; /* its part of the ceiling (allocator) */
	double burst_budget; /* what the bursts may sum to */
	double bound_rate; /* the live bound, see allot__compute_bounds() */
	double bound_burst;
	uint32_t counted_expired; /* expired replicas in the bound */
	double reserved_rate; /* kept out of the headroom for expired */
	double reserved_burst; /* replicas (hold_expired) */
	uint32_t nslots; /* replicas holding a share */
	double admitted_rate; /* last second, tokens/s */
	double denied_rate;
	double utilization; /* admitted / (R * 1 s) */
	/* Cluster: a leader that took over grants only within what the
	 * agents report they hold until learn_until_ns (learning.c). */
	uint64_t learn_until_ns;
	bool unheard; /* allot__learned(): a replica holds nothing here */
	/* The first report of a jump in demand (allot__est_onset()):
	 * replicas that have not reported since keep their targets. */
	uint64_t onset_ns;
	/* Shadow would-denies: tokens admitted in shadow that enforcing
	 * would have denied (part of allowed_total, never of denied). */
	uint64_t shadow_total;
	uint64_t win_shadow; /* since the last per-second pass */
	/* Of the win_ counts, those of agents without an account: the
	 * audit rows of the second (usage.c audits the others). */
	uint64_t aud_allowed;
	uint64_t aud_denied;
	uint64_t aud_shadow;
	double shadow_rate; /* last second, tokens/s */
	/* The candidate value's global bucket (candidate.c). */
	double cand_rate; /* the candidate evaluated; 0: none */
	double cand_burst;
	double cand_level; /* tokens */
	uint64_t cand_ns; /* cand_level brought up to here */
	int64_t cand_since_ms; /* wall time it started evaluating */
	double cand_offered; /* tokens offered since then */
	double cand_denied; /* of them, would-denies under the candidate */
	double cand_denied_total; /* every candidate's, since start */
	double win_cand; /* since the last per-second pass */
	double win_cand_carry; /* its fraction not yet in a usage row */
	double cand_denied_rate; /* last second, tokens/s */
	double loan_out; /* loans: bursts raised and not yet lowered */
	double debit_due; /* loans: debits not yet sent to the lenders */
	/* The central reserve (reserve.c): what no replica holds of the
	 * allowance (rsv_rate) and of the burst budget (rsv_burst), and the
	 * tokens in it now, served to agents' Asks. */
	double rsv_rate;
	double rsv_burst;
	double rsv_level;
	uint64_t rsv_ns; /* rsv_level brought up to here; 0: never */
	/* The standby (central.c): what the reserve served its keys lately
	 * (skey.srv_sum summed) and how many keys wait for it, at the
	 * last tick. */
	double srv_total;
	uint32_t srv_keys;
	/* Tokens replicas dropped when their bursts were lowered and
	 * reported (KeyReport.returned): back in the reserve at the next
	 * tick, once its capacity has grown by those bursts. */
	double rsv_returned;
} squota;

/* An expired replica that may still be running: on its last grants
 * until its lease ends, then on each quota's fallback. Counted in the
 * live bound (not in the headroom) until it registers again or
 * counted_ms pass. Owned by its service (svc->zs, registry.c). */
typedef struct expired_rep {
	char *replica_id;
	uint64_t reply_ns; /* as in its session */
	uint64_t acked_ns;
	uint64_t drop_ns;
	uint32_t n_last; /* the fewest replicas it may have been
	                    told last (the largest fallback) */
	double interval_s;
	uint64_t epoch; /* config the arrays index */
	double *rate; /* per quota index: what it may hold */
	double *burst;
} expired_rep;

/* A service (registry.c): owned by the state (st->svcs), freed by the
 * loop thread once empty for service_idle_ms (allot__service_idle()).
 * Owns its sessions, squotas and expired replicas. */
typedef struct service {
	char *name;
	session **sess;
	uint32_t nsess;
	uint32_t cap;
	squota *q; /* one per quota index of st->cur */
	double held_total; /* sum over every quota of what the agents
	                      may hold (key_hold()): the ceiling */
	expired_rep *zs;
	uint32_t nzs;
	uint32_t nsess_silenced; /* sessions when the last silence ended */
	uint64_t gen; /* bumped when any share changes */
	bool dirty; /* replica set or config changed */
	/* Start-up (allot__forming()): a service created by a Register
	 * that named its deployment's replica count N (form_expect) is
	 * allotted n / N of every quota while n < N replicas are live,
	 * until form_until_ns; the rest waits in the headroom for the
	 * Welcomes of the replicas still to come. 0: not forming. */
	uint32_t form_expect;
	uint64_t form_until_ns;
	bool rec_pending; /* some key has rec_pending */
	uint64_t last_alloc_ns;
	uint64_t empty_ns; /* when it was first seen empty; 0: not */
	/* The ceiling's central reserve (central.c): what no replica holds
	 * of the ceiling C (rate) and of its burst B_C, C * max(B/R) over
	 * its callers' quotas, and the tokens in it. Every central grant
	 * takes from it as well as from its quota's reserve. */
	double crsv_rate;
	double crsv_burst;
	double crsv_level;
	uint64_t crsv_ns;
	/* The ceiling's global bucket estimate (C, B_C, less what every
	 * report admitted), as squota.level is a quota's: the reserve never
	 * holds more. 0 clevel_ns: full. */
	double clevel;
	uint64_t clevel_ns;
	/* The ceiling as of the last tick (central.c): C, B_C, and whether
	 * it can bind at all (the quotas it covers sum to more than C or
	 * their bursts to more than B_C); when it cannot, the quotas'
	 * reserves alone bound what they serve. */
	double c_rate;
	double c_burst;
	bool c_binds;
	/* Per-value buckets (values.c): the values its replicas report and
	 * their parts; NULL while none are active. */
	struct allot__vtab *vals;
	uint64_t values_unsplit; /* reports of values the full table left
	                            unsplit, since start */
} service;

/* The whole coordinator state (state.h). `o`, `lgv` and the rate limits
 * are set at create and read without the lock (the rate limits are
 * atomic); everything else is guarded by `mu`. The state owns the config
 * in force (`cur`), every service (and through them every session and
 * expired replica), the session hash and the scratch arrays below. */
/* The strangers (strangers.c): unknown identities named over one second,
 * summed per service, identity and endpoint class. */
#define ALLOT__STRANGERS_SYNC 8u /* noted per Sync, the agent's most */
#define ALLOT__STRANGERS_TAB 64u /* table entries */
#define ALLOT__STRANGERS_ROWS 16u /* audit rows a second, at most */
#define ALLOT__STRANGER_ENDPOINT_MAX 63u
typedef struct allot__stranger_ent {
	char service[ALLOT__STATE_NAME_MAX + 1];
	char identity[ALLOT__STATE_NAME_MAX + 1];
	char endpoint[ALLOT__STRANGER_ENDPOINT_MAX + 1];
	uint64_t admitted, denied; /* requests */
} allot__stranger_ent;

struct allot__state {
	pthread_mutex_t mu;
	allot__state_opts o;
	allot__logger lgv;
	cfgv *cur; /* config_view.c; replaced by allot__state_reload() */
	/* The registry (registry.c): services and the session hash. */
	service **svcs;
	size_t nsvcs;
	session **htab; /* live sessions by id (placeholders are not in it) */
	size_t hmask;
	size_t nsessions; /* live sessions, restored ones included */
	uint64_t next_session;
	uint64_t last_second_ns;
	uint64_t last_heard_ns; /* last request from any replica */
	bool hold; /* allot__grant(): no increase (see register) */
	uint64_t grace_until_ns; /* no expiry before (after a silence) */
	uint32_t *stamp; /* duplicate-key detection, per quota */
	size_t stamp_cap;
	uint32_t stamp_gen;
	/* allocator scratch (grants.c), reused across rounds */
	allot__alloc_quota *aq;
	size_t aq_cap;
	allot__alloc_slot *slots;
	size_t slot_cap;
	uint32_t *owner_sess; /* per slot: index in svc->sess */
	uint32_t *owner_key; /* per slot: key index in the session */
	size_t owner_cap;
	allot__logrl rl_unknown;
	allot__logrl rl_absurd;
	allot__logrl rl_register;
	allot__logrl rl_clip;
	allot__logrl rl_push; /* config texts sent, or too big to send */
	uint64_t clip_event_ns; /* last "implausible" event row */
	allot__stranger_ent strangers[ALLOT__STRANGERS_TAB];
	size_t nstrangers;
	/* Cluster (learning.c); cl_n == 0: one coordinator, which never
	 * learns; 1: the leader of a cluster, which learns at take-over. */
	size_t cl_n;
	uint64_t cl_learn_ns; /* learning period: lease + 2 intervals */
	uint64_t cl_boot_until_ns; /* every owned quota learns until */
};

/* Whether this leader still learns quota `sq` of a service it took over
 * (learning.c): it adopts what agents report they run on and moves no
 * grant. Never for a single coordinator. */
static inline bool
quota_learning(const allot__state *st, const squota *sq, uint64_t now)
{
	return st->cl_n > 0 && now < sq->learn_until_ns;
}

/* Monotonic differences never wrap: a timestamp taken by another thread
 * may be a hair newer than `now`. */
static inline uint64_t
since(uint64_t now, uint64_t then)
{
	return now > then ? now - then : 0;
}

static inline uint64_t
now_ns(const allot__state *st)
{
	return st->o.clock != NULL ? st->o.clock(st->o.clock_ctx) :
	                             allot__mono_ns();
}

/* The fewest replicas a session may have been told in its last answer:
 * its fallback is R divided by that. */
static inline uint32_t
fewest(const session *s)
{
	uint32_t a = s->last_replicas, b = s->acked_replicas;
	return b != 0 && b < a ? b : a;
}

/* Every session `s` of `svc` (its index in svc->sess is `i`) and every
 * key `key` of it, in order. The loop is three nested fors: `continue`
 * moves to the next key, `break` ends this session's keys only. */
#define FOR_EACH_SESSION_KEY(svc, i, s, key)                                \
	for (uint32_t i = 0; i < (svc)->nsess; i++)                         \
		for (session *s = (svc)->sess[i]; s != NULL; s = NULL)      \
			for (skey *key = s->keys; key < s->keys + s->nkeys; \
			     key++)

/* The kept key of Register key id `id`, or NULL when it had no quota. */
static inline skey *
session_key(const session *s, uint32_t id)
{
	if (s->kid == NULL)
		return id < s->nkeys ? &s->keys[id] : NULL;
	uint32_t lo = 0, hi = s->nkeys;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (s->kid[mid] < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < s->nkeys && s->kid[lo] == id ? &s->keys[lo] : NULL;
}

/* The Register key id of a kept key. */
static inline uint32_t
key_id(const session *s, const skey *key)
{
	uint32_t i = (uint32_t) (key - s->keys);
	return s->kid != NULL ? s->kid[i] : i;
}

/* The same, for the keys that name a quota of the config (key->q >= 0). */
#define FOR_EACH_KEY(svc, i, s, key)          \
	FOR_EACH_SESSION_KEY (svc, i, s, key) \
		if (key->q < 0) {             \
		} else

/* The functions of each file, in the order of the layers; each one's
 * contract is in the comment above its definition. */

/* ---- config_view.c ---- */

void allot__cfgv_free(cfgv *v);
/* The quota index of wire key key[0..len) in the top-level view (the
 * view of every service the file does not name), or -1. */
int32_t allot__cfgv_find(const cfgv *v, const char *key, size_t len);
/* The quota index of wire key key[0..len) for service `sname` (NULL, or a
 * service the file does not name: the top level's), or -1: what keys of
 * that service's replicas resolve through. ALLOT__CFGV_FIXED (< 0 too)
 * for a closed or unlimited quota: each agent decides it alone, so a key
 * of it is neither kept nor unknown. */
#define ALLOT__CFGV_FIXED (-2)
int32_t allot__cfgv_find_svc(
    const cfgv *v, const char *sname, const char *key, size_t len);
/* The quotas of `service`'s view: allot__cfgv_at(v, service, i) for i
 * below allot__cfgv_count(v, service) is a quota index. */
size_t allot__cfgv_count(const cfgv *v, const char *sname);
int32_t allot__cfgv_at(const cfgv *v, const char *sname, size_t i);
/* in[i] for every quota index i: whether `sname`'s view has it. */
void allot__cfgv_mask(const cfgv *v, const char *sname, bool *in);
/* The ceiling of `service`'s view (0: none). */
double allot__cfgv_ceiling(const cfgv *v, const char *sname);
/* Takes ownership of `cfg` only on success. */
cfgv *allot__cfgv_new(allot_config *cfg, const char *path, uint64_t epoch);
const char *allot__cfgv_priority_name(const cfgv *v, uint32_t p);
/* Record view `v` as a config row (`store` may be NULL) and keep its
 * text for the agents (cfgv.text). */
void allot__cfgv_record(allot__store *store, cfgv *v, const char *text);

/* ---- registry.c ---- */

void allot__session_free(session *s);
/* The live session `id`, or NULL (placeholders are not in the hash). */
session *allot__session_find(const allot__state *st, uint64_t id);
void allot__session_hash_add(allot__state *st, session *s);
void allot__session_hash_del(allot__state *st, session *s);
service *allot__service_find(const allot__state *st, const char *name);
void allot__squota_init(squota *sq, const cfgv *v, size_t q);
service *allot__service_get(allot__state *st, const char *name, bool *full);
bool allot__service_idle(allot__state *st, service *svc, uint64_t now);
void allot__service_remove(allot__state *st, size_t i);
bool allot__service_add(service *svc, session *s);
void allot__session_unlink(allot__state *st, session *s);
uint64_t allot__expiry_ns(const allot__state *st, uint32_t agent_interval_ms);
/* Whether session `s` is alive on a connection other than `pipe`: not a
 * placeholder, its connection known to be open and heard from within
 * its expiry. A Register naming its replica from elsewhere is refused
 * (register.c): a replica id is not a credential. */
bool allot__session_live_elsewhere(
    const allot__state *st, const session *s, uint32_t pipe, uint64_t now);
void allot__heard(allot__state *st, uint64_t now);
/* Make *p hold `need` elements of `elem` bytes (doubling); false when
 * out of memory, *p unchanged. */
bool allot__grow(void **p, size_t *cap, size_t need, size_t elem);
void allot__expired_clear(service *svc);
void allot__expired_forget(service *svc, const char *replica_id);
void allot__expired_add(
    allot__state *st, service *svc, const session *s, uint64_t now);
void allot__expired_drop(service *svc, uint64_t now);

/* ---- demand.c ---- */

void allot__level_bring(squota *sq, double rate, double burst, uint64_t now);
double allot__est_read(const session *s, const skey *key);
double allot__est_var(const session *s, const skey *key);
/* The slow estimate (skey.slow) as of the session's last Sync. */
double allot__est_slow(const session *s, const skey *key);
double allot__est_body(const session *s, const skey *key);
/* How many times longer than the demand estimate's the slow estimate's
 * time constant is: about 5 s at T = 100 ms, long enough that where a
 * few bursts happened to land does not read as where the traffic goes. */
#define ALLOT__SLOW_TAUS 20.0
/* `step`: how far above twice the body a window may lift it (the
 * equal share's quarter). */
void allot__est_update(const session *s, skey *key, double amount, double w,
    double step, uint64_t now);
void allot__est_onset(squota *sq, const session *s, const skey *key,
    double amount, double w, uint64_t now, uint64_t episode_ns);
void allot__est_refute(skey *key, double rate);
void allot__conserve_join(service *svc, const session *newcomer);
void allot__conserve_leave(service *svc, const session *gone_s);
void allot__est_inherit(session *s, const session *old);

/* ---- candidate.c ---- */

void allot__cand_check(squota *sq, const allot__quota *qc, uint64_t now);
void allot__cand_book(
    squota *sq, const allot__quota *qc, double offered, uint64_t now);
uint64_t allot__cand_second(squota *sq, double dt);

/* ---- bounds.c ---- */

void allot__key_bound(const allot__state *st, const session *s,
    const skey *key, uint64_t now, double *ret_r, double *ret_b);
bool allot__expired_value(const allot__state *st, const expired_rep *z,
    size_t q, uint64_t now, double *ret_r, double *ret_b);
void allot__reserve_expired(allot__state *st, service *svc, uint64_t now);
void allot__compute_bounds(allot__state *st, service *svc, uint64_t now);
double allot__bound_ratio(const squota *sq, double R, double B);

/* ---- grants.c ---- */

void allot__rebuild_granted(allot__state *st, service *svc);
bool allot__recompute(allot__state *st, service *svc, uint64_t now);
bool allot__early_round(allot__state *st, service *svc, uint64_t now);
/* Lend a key that reported `denied` tokens in an early Sync tokens taken
 * from the other replicas of its quota (docs/allocation.md, "Loans");
 * returns what was lent. Under the lock. */
double allot__loan(allot__state *st, service *svc, session *s, skey *key,
    double denied, uint64_t now);
/* End the loan of `key` once it has run its time; returns whether its
 * share changed. Under the lock. */
bool allot__loan_end(skey *key, uint64_t now);
/* The agent acknowledged the Reply that ended the loan of `key`: the
 * budget is lent again. Under the lock. */
void allot__loan_acked(service *svc, skey *key);
/* The Reply being built carries the debit of `key`. Under the lock. */
void allot__loan_sent(service *svc, skey *key);
bool allot__grant(
    allot__state *st, service *svc, session *s, skey *key, bool *ret_short);
/* A Register that creates `svc` and names `expected` replicas starts its
 * forming period; false when it does not (docs/allocation.md,
 * "Start-up"). Under the lock. */
bool allot__forming_start(
    allot__state *st, service *svc, uint32_t expected, uint64_t now);
/* The part of every quota the live replicas of `svc` are allotted: n / N
 * while it forms, 1 after; ends the period (svc->dirty) once N are live
 * or its time is up. Under the lock. */
double allot__forming(service *svc, uint64_t now);
void allot__record_shares(allot__state *st, service *svc);
void allot__carry_allowances(allot__state *st, service *svc, session *s,
    const session *old, uint64_t now);

/* ---- sync.c ---- */

/* Session `s` applied our last answer: what it may hold is its grants
 * again (the capacity it gave up goes to the reserve, central.c). */
void allot__session_acked(allot__state *st, session *s, uint64_t now);

/* ---- central.c ---- */

/* Whether quota q of the config in force keeps a central reserve. */
bool allot__central_on(const allot__state *st, size_t q);
/* The reserves' rates and capacities of every quota of `svc` (and of
 * its ceiling) from the live bound, and their levels brought up to
 * `now`. Under the lock, every tick. */
void allot__central_caps(allot__state *st, service *svc, uint64_t now);
/* A grant of quota q rose by `dr` (rate) and `db` (burst): the reserves
 * give up as much at once, and the tokens their smaller capacity cannot
 * keep are returned, for the replica's bucket (Share.prefill). Under the
 * lock. */
double allot__central_shrink(allot__state *st, service *svc, size_t q,
    double dr, double db, uint64_t now);
/* A replica acknowledged grants of quota q below what it held: the
 * reserves take the `dr` of rate and the burst it held above `b_now`
 * (`b_was` before) at once, rather than at the next tick. Under the
 * lock. */
void allot__central_grow(allot__state *st, service *svc, size_t q, double dr,
    double b_was, double b_now, bool key_tail, uint64_t now);
/* `key`'s bucket dropped `tokens` since its grant fell
 * (KeyReport.returned, AskKey.returned): at most what it may give back
 * (skey.returnable) is owed to its quota's reserve (rsv_returned). Under
 * the lock. */
void allot__central_give_back(
    allot__state *st, service *svc, skey *key, uint64_t tokens);
/* Quota q's replicas gave tokens back (squota.rsv_returned): into its
 * reserve and the ceiling's now, once the Sync that says so has
 * acknowledged the grants that lowered their bursts. Under the lock. */
void allot__central_returned(
    allot__state *st, service *svc, size_t q, uint64_t now);
/* Reports of `svc` said `admitted` tokens were spent: the ceiling's
 * bucket estimate takes them. Under the lock. */
void allot__central_admitted(
    allot__state *st, service *svc, double admitted, uint64_t now);
/* Quota q's reserve as of `now`: its rate, capacity and level (zeros
 * when it keeps none). Under the lock. */
void allot__central_peek(allot__state *st, service *svc, size_t q,
    uint64_t now, double *ret_rate, double *ret_burst, double *ret_level);
/* What allot__central_take() gave one key of an Ask. */
typedef struct allot__central_given {
	double got; /* taken from the reserve (a part of a token included) */
	double whole; /* the whole tokens the asker may spend with `held` */
	uint32_t dry_us; /* fewer than asked: until it could give `min` */
	uint64_t left; /* then: the whole tokens the reserve still holds */
	double kept; /* nothing given: the part of `held` pooled here */
} allot__central_given;
/* Take from quota q's reserve (and the ceiling's) what completes the
 * `held` tokens (0 <= held < min) an asker's bucket holds into whole
 * tokens, between `min` and `want` of them (all of `want` while the
 * reserve holds it, `held` then staying the asker's). When it cannot,
 * it keeps up to `pool` of `held` (AskKey.pool; 0: none), as far as its
 * capacity has room. Under the lock. */
allot__central_given allot__central_take(allot__state *st, service *svc,
    size_t q, double min, double want, double held, double pool, uint64_t now);
/* The standby (docs/allocation.md, "When it fails"): the reserve served
 * `key` `tokens` at `now`. Under the lock. */
void allot__standby_served(skey *key, double tokens, uint64_t now);
/* Whether `key`'s standby rate moved enough to be sent: then
 * key->standby (and standby_hold, if larger) take the new one, its part
 * of the reserve's rate (central.c). Under the lock. */
bool allot__standby_due(
    const allot__state *st, service *svc, skey *key, uint64_t now);
/* What a silent agent may be running on its standby (bounds.c): its
 * standby rate from allot__standby_after_ns() after the last Sync we had
 * from it (the caller stops at the end of its lease). */
double allot__standby_held(const session *s, const skey *key, uint64_t now);

/* ---- answer.c ---- */

/* From the request's arena (freed with the answer). */
static inline void *
allot__pa_alloc(ProtobufCAllocator *pa, size_t size)
{
	return pa->alloc(pa->allocator_data, size);
}

/* What became of the config text for one answer (logged and counted
 * after unlocking). */
typedef enum allot__push {
	ALLOT__PUSH_NONE, /* the agent has it, or does not speak the config
	                     plane */
	ALLOT__PUSH_SENT,
	ALLOT__PUSH_HELD, /* sent to this session less than RESEND_MS ago */
	ALLOT__PUSH_TOO_BIG, /* above ALLOT__STATE_CONFIG_PUSH_MAX: never sent
	                      */
	ALLOT__PUSH_NOMEM,
} allot__push;

/* The text of the config in force into `ret`, for session `s` whose
 * agent enforces `digest` (docs/protocol.md, "The config plane"): the
 * file's bytes when the digests differ, at most once per digest every
 * ALLOT__STATE_CONFIG_RESEND_MS per session. Under the lock. */
allot__push allot__config_push(allot__state *st, session *s,
    ProtobufCAllocator *pa, uint64_t digest, uint64_t now,
    ProtobufCBinaryData *ret);
/* After unlocking: a config sent is counted, one too big is logged. */
void allot__config_push_report(allot__state *st, allot__push p,
    const char *replica, const char *svc_name, uint64_t digest,
    size_t text_len);
/* Bring every grant of `s` toward its target and fill `ret` with the
 * keys whose grant changed, or every key with a quota when `all`; false
 * when `pa` is out of memory (nothing is granted then). Under the lock. */
bool allot__build_shares(allot__state *st, session *s, ProtobufCAllocator *pa,
    bool all, Allot__V1__Share ***ret, size_t *ret_n);

/* ---- learning.c ---- */

void allot__adopt(allot__state *st, service *svc, session *s, skey *key,
    const Allot__V1__KeyReport *r);
void allot__own_quotas(allot__state *st, service *svc, uint64_t now);
service *allot__service_open(allot__state *st, const char *name, bool *full);
void allot__learned(allot__state *st, service *svc, uint64_t now);

/* ---- values.c ---- */

/* The Sync.values of session `s` noted, and their parts into `ret`
 * (Reply.values, allocated from `pa`). */
void allot__values_sync(allot__state *st, service *svc, session *s,
    const Allot__V1__Sync *req, uint64_t now, ProtobufCAllocator *pa,
    Allot__V1__Reply *ret);
/* Each second: values nobody reported lately leave. */
void allot__values_second(const allot__state *st, service *svc, uint64_t now);
void allot__values_free(service *svc);
/* Values `svc` splits now. */
uint32_t allot__values_count(const service *svc);
/* Whether quota index `q` of view `v` has a bucket per value (a default
 * with shared: false). Any thread, on a view it holds. */
bool allot__quota_per_value(const cfgv *v, int32_t q);

/* ---- strangers.c ---- */

/* The Sync.strangers of a replica of `service`: summed into the second's
 * table (the first ALLOT__STRANGERS_SYNC; names a Register would refuse
 * are skipped). */
void allot__strangers_note(allot__state *st, const char *svc,
    Allot__V1__Stranger *const *v, size_t n);
/* Once a second: the most denied as `unknown_caller` events; the table
 * starts over. */
void allot__strangers_second(allot__state *st);

/* ---- validate.c ---- */

Allot__V1__Error__Code allot__register_check(
    const Allot__V1__Register *req, char *err, size_t errlen);
session *allot__session_new(const Allot__V1__Register *req);
/* Keep, of the Register's keys `wire`, only those whose q[k] >= 0
 * (nknown of them), names copied; false when out of memory, `s`
 * unchanged. */
bool allot__session_keep(
    session *s, char *const *wire, const int32_t *q, uint32_t nknown);
/* Whether the identities a Sync appends (Sync.add_keys) are acceptable
 * for a session that has `nwire` keys already: names as a Register's,
 * at most `max_keys` keys in all. */
Allot__V1__Error__Code allot__add_keys_check(const Allot__V1__Sync *req,
    uint32_t nwire, uint32_t max_keys, char *err, size_t errlen);
/* Append the identities `wire` (n of them, key ids from s->nwire on),
 * keeping those whose q[k] >= 0 (nknown of them) as
 * allot__session_keep() does; false when out of memory, `s` unchanged.
 * Kept keys move in memory: no skey pointer survives it. */
bool allot__session_append(session *s, char *const *wire, uint32_t n,
    const int32_t *q, uint32_t nknown);
/* A fresh generation of the per-quota stamps that find a quota named
 * twice in a Register or Sync.add_keys; false when out of memory. Under
 * the lock. */
bool allot__stamp_next(allot__state *st);
bool allot__pipe_ok(const session *s, uint32_t pipe);
Allot__V1__Error__Code allot__pipe_mismatch(
    allot__metrics *m, uint64_t id, char *err, size_t errlen);
void allot__sanitize(char *dst, size_t cap, const char *src);

/* usage.c: a session's Usage records (Sync.usage, Leave.usage) into the
 * store, each once; and how far its account is durable (Reply.durable).
 * Under the lock. */
void allot__usage_book(
    allot__state *st, session *s, Allot__V1__Usage *const *usage, size_t n);
uint64_t allot__usage_durable(allot__state *st, const session *s);

#endif
