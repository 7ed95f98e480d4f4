/* SPDX-License-Identifier: MIT */
/*
 * The registry behind state.h: services, their replica sessions, the
 * config in force and the per-quota bookkeeping. Requests from the nng
 * workers and the loop's periodic work meet under one mutex. The rule
 * inside it: array indexing and memory only. Anything that formats a log
 * line is done after unlocking, from values copied out; store records only
 * append to the store's in-memory batch, so they are allowed inside.
 *
 * Layout, chosen for the per-report path: a session holds its keys as an
 * array indexed by the key id of its Register (each entry names a quota
 * index of the config in force, or -1), and its service holds one squota
 * per quota index. A key report is therefore two bounds checks, two array
 * loads and a few additions, with no string work and no allocation.
 *
 * Targets and grants. The allocator sets each key's target share; what a
 * replica is actually sent (its grant) moves toward the target under one
 * rule that keeps the sum of grants of a quota at or below R (and of
 * bursts at or below B) at every instant, not only once all replicas have
 * synced: a decrease is granted at once, an increase only out of the
 * headroom R - sum(grants). When a replica joins, the others shrink on
 * their next sync and the newcomer grows on the sync after that, so a
 * change settles within two intervals. Replicas restored after a restart
 * are assumed to hold their equal share until they return or expire.
 *
 * Demand and the live bound (docs/allocation.md). Each key keeps a demand
 * estimate, admitted plus denied cost per second smoothed over the
 * session's own sync windows, from which the allocator water-fills every
 * interval. Each quota keeps the global bucket's level, refilled at R and
 * drained by reported consumption, which caps the bursts handed out.
 * What an agent may really hold can exceed its grant: a decrease counts
 * from its Reply but the agent applies it only on receipt, so a key
 * remembers the largest grant not acknowledged yet (the next Sync without
 * a sequence gap acknowledges), and an expired replica may still run on
 * its lease and then its fallback, so it stays counted for a while as an
 * "expired, counted" record. Those sums are the live bound in /metrics.
 */
#include "state.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "dial.h"
#include "hash.h"
#include "rendezvous.h"

/* A loaded config with what the hot paths derive from it. */
typedef struct cfgv {
	allot_config *cfg;
	uint64_t epoch;
	int64_t loaded_wall_ms;
	char *path;
	size_t nq; /* 1 + ncallers: index 0 is default */
	const allot__quota **q; /* q[i] for quota index i */
	double *rate; /* q[i]->rate, contiguous */
	double *burst;
	uint32_t *index; /* identity hash table: quota index + 1 */
	size_t index_mask;
	uint64_t seed;
} cfgv;

/* One interned key of a session. */
typedef struct skey {
	int32_t q; /* quota index; -1: no quota for it */
	bool rec_pending; /* share changed since its store row */
	double consumed; /* allocator window: tokens admitted */
	double denied; /* allocator window: tokens denied */
	double demand; /* last reported demand, tokens/s */
	double held; /* last reported bucket level */
	double rate; /* target share (allocator output) */
	double burst;
	double sent_rate; /* grant: what the agent was last sent */
	double sent_burst; /* (NaN: nothing yet, holds no share) */
	double may_rate; /* the largest grant it may still hold: */
	double may_burst; /* sent, or more until acknowledged */
	double reply_target; /* the target when it was last answered */
	double est; /* demand estimate, tokens/s */
	double est2; /* its second moment, (tokens/s)^2 */
	uint64_t est_ns; /* est covers up to here; 0: never */
	bool targeted; /* rate/burst hold an allocator output */
	bool was_short; /* its grant was below its target at some
	                   point since the last round */
	bool force_share; /* the next Reply carries its share (cluster:
	                     it reported an allowance from elsewhere) */
} skey;

/* The rate an agent may hold on a key: its grant, or an earlier larger
 * grant it has not acknowledged, or what it ran on before registering
 * again. */
static inline double
key_hold(const skey *key)
{
	double r = isnan(key->sent_rate) ? 0 : key->sent_rate;
	return isnan(key->may_rate) || key->may_rate < r ? r : key->may_rate;
}

struct service;

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
	uint32_t nkeys;
	uint32_t nknown; /* keys with q >= 0 */
	skey *keys;
	char **names; /* key identities (into names_blob) */
	char *names_blob;
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
	bool ghost; /* restored from the store, not back yet;
	               holds a key per quota, never syncs */
	bool seen_dirty; /* synced since its last-seen row */
	bool unacked; /* some key's may_* is above its grant */
	double interval_s; /* its sync interval (demand smoothing) */
	uint64_t last_reply_ns; /* our last answer: its lease runs from */
	uint32_t last_replicas; /* here at the latest, and the count */
	uint64_t acked_reply_ns; /* the last answer it acknowledged: its */
	uint32_t acked_replicas; /* lease runs from here at the earliest */
	struct session *hnext;
} session;

/* One quota of one service. */
typedef struct squota {
	uint64_t allowed_total; /* tokens, since start (counters) */
	uint64_t denied_total;
	uint64_t win_allowed; /* since the last per-second pass */
	uint64_t win_denied;
	double demand_sum; /* sum of the demand estimates, tokens/s */
	double level; /* global bucket estimate, tokens */
	uint64_t level_ns; /* when `level` was last brought up */
	double level_recorded;
	double sum_rate; /* sum of targets (allocator outputs) */
	double sum_burst;
	double granted_rate; /* sum of grants: what replicas hold */
	double granted_burst;
	double allowance; /* its part of the ceiling (allocator) */
	double burst_budget; /* what the bursts may sum to */
	double bound_rate; /* the live bound, see compute_bounds() */
	double bound_burst;
	uint32_t counted_expired; /* expired replicas in the bound */
	double reserved_rate; /* kept out of the headroom for expired */
	double reserved_burst; /* replicas (hold_expired) */
	uint32_t nslots; /* replicas holding a share */
	double admitted_rate; /* last second, tokens/s */
	double denied_rate;
	double utilization; /* admitted / (R * 1 s) */
	/* Cluster mode: another member owns it in our view (we book and
	 * grant nothing for it), or we took it over and grant only within
	 * what the agents report they hold until learn_until_ns. */
	bool disowned;
	uint64_t learn_until_ns;
	bool unheard; /* learned(): some replica holds nothing from us */
} squota;

/* An expired replica that may still be running: on its last grants
 * until its lease ends, then on each quota's fallback. Counted in the
 * live bound (not in the headroom) until it registers again or
 * zombie_ms pass. */
typedef struct zombie {
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
} zombie;

typedef struct service {
	char *name;
	session **sess;
	uint32_t nsess;
	uint32_t cap;
	squota *q; /* one per quota index of st->cur */
	double held_total; /* sum over every quota of what the agents
	                      may hold (key_hold()): the ceiling */
	zombie *zs;
	uint32_t nzs;
	uint32_t nsess_silenced; /* sessions when the last silence ended */
	uint64_t gen; /* bumped when any share changes */
	bool dirty; /* replica set or config changed */
	bool rec_pending; /* some key has rec_pending */
	uint64_t last_alloc_ns;
} service;

/* Work to finish after unlocking: log lines and store rows. */
typedef struct gone {
	session *s;
	const char *why; /* "expired", "replaced", "leave" */
	uint64_t silent_ms;
	uint32_t remaining;
} gone;

struct allot__state {
	pthread_mutex_t mu;
	allot__state_opts o;
	allot__logger lgv;
	cfgv *cur;
	service **svcs;
	size_t nsvcs;
	session **htab;
	size_t hmask;
	size_t nsessions; /* live sessions, restored ones included */
	uint64_t next_session;
	uint64_t last_second_ns;
	uint64_t last_heard_ns; /* last request from any replica */
	bool hold; /* grant(): no increase (see register) */
	uint64_t grace_until_ns; /* no expiry before (after a silence) */
	uint32_t *stamp; /* duplicate-key detection, per quota */
	size_t stamp_cap;
	uint32_t stamp_gen;
	/* allocator scratch, reused across rounds */
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
	/* Cluster mode (allot__state_cluster); cl_n == 0: one coordinator,
	 * every quota owned. */
	size_t cl_n;
	size_t cl_self;
	uint64_t cl_hash[ALLOT__CLUSTER_MAX_MEMBERS];
	bool cl_live[ALLOT__CLUSTER_MAX_MEMBERS];
	bool cl_cut_off; /* no increases, static ownership */
	uint64_t cl_learn_ns; /* learning period: lease + 2 intervals */
	uint64_t cl_boot_until_ns; /* every owned quota learns until */
};

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

/* ---- the global bucket and the demand estimates ---- */

/* Refill the quota's global bucket estimate up to `now`. */
static void
level_bring(squota *sq, double rate, double burst, uint64_t now)
{
	if (sq->level_ns != 0 && now > sq->level_ns) {
		sq->level += rate * (double) (now - sq->level_ns) / 1e9;
		if (sq->level > burst)
			sq->level = burst;
	}
	if (now > sq->level_ns)
		sq->level_ns = now;
}

/* The time constant of a session's demand estimates, seconds: a few
 * intervals, and never so short that a fast-syncing replica's estimate
 * rests on a handful of requests. */
static double
est_tau(const session *s)
{
	double tau = ALLOT__STATE_TAU * s->interval_s;
	return tau > ALLOT__STATE_TAU_MIN_S ? tau : ALLOT__STATE_TAU_MIN_S;
}

/* The decay of the demand estimates over `idle` seconds. */
static double
est_decay(const session *s, double idle)
{
	return idle > 0 ? exp(-idle / est_tau(s)) : 1;
}

/* The demand estimate of a key as of its session's last Sync: a key not
 * reported since was idle in between, so the estimate decays over that
 * time (lazily: an unreported key costs nothing per Sync). */
static double
est_read(const session *s, const skey *key)
{
	if (key->est_ns == 0)
		return 0;
	return key->est *
	    est_decay(s, (double) since(s->last_sync_ns, key->est_ns) / 1e9);
}

/* The variance of that estimate: the variance of the per-window rates
 * (from the second moment kept beside the mean) times what an
 * exponential average of weight a keeps of it, a / (2 - a). */
static double
est_var(const session *s, const skey *key)
{
	if (key->est_ns == 0)
		return 0;
	double d = est_decay(
	    s, (double) since(s->last_sync_ns, key->est_ns) / 1e9);
	double m1 = key->est * d, m2 = key->est2 * d;
	double var = m2 - m1 * m1;
	double a = 1.0 - exp(-s->interval_s / est_tau(s));
	return var > 0 ? var * a / (2.0 - a) : 0;
}

/* Fold `amount` tokens (admitted + denied) over the `w` seconds ending at
 * `now` into the estimate: first the decay over the idle time before
 * the window (zeros, in effect), then an exponential average of the
 * window's rate and of its square with the time constant
 * ALLOT__STATE_TAU intervals. A first window is taken as it is, with
 * the variance of a single noisy measure (its own square). */
static void
est_update(const session *s, skey *key, double amount, double w, uint64_t now)
{
	double inst = amount / w;
	if (key->est_ns == 0) {
		key->est = inst;
		key->est2 = 2 * inst * inst;
		key->est_ns = now;
		return;
	}
	uint64_t wns = (uint64_t) (w * 1e9);
	uint64_t start = now > wns ? now - wns : 0;
	double d = est_decay(s, (double) since(start, key->est_ns) / 1e9);
	key->est *= d;
	key->est2 *= d;
	double a = 1.0 - exp(-w / est_tau(s));
	key->est += a * (inst - key->est);
	key->est2 += a * (inst * inst - key->est2);
	key->est_ns = now;
}

/* ------------------------------------------------------------------ */
/* config views                                                        */
/* ------------------------------------------------------------------ */

static void
cfgv_free(cfgv *v)
{
	if (v == NULL)
		return;
	allot_config_free(v->cfg);
	free(v->path);
	free(v->q);
	free(v->rate);
	free(v->burst);
	free(v->index);
	free(v);
}

static int32_t
cfgv_find(const cfgv *v, const char *identity, size_t len)
{
	uint64_t h = allot__hash(identity, len, v->seed);
	for (size_t i = (size_t) h & v->index_mask;;
	     i = (i + 1) & v->index_mask) {
		uint32_t e = v->index[i];
		if (e == 0)
			return -1;
		const char *id = v->q[e - 1]->identity;
		if (strncmp(id, identity, len) == 0 && id[len] == '\0')
			return (int32_t) (e - 1);
	}
}

/* Takes ownership of cfg only on success. */
static cfgv *
cfgv_new(allot_config *cfg, const char *path, uint64_t epoch)
{
	cfgv *v = calloc(1, sizeof *v);
	if (v == NULL)
		return NULL;
	v->nq = 1 + cfg->ncallers;
	v->epoch = epoch;
	v->loaded_wall_ms = allot__wall_ms();
	v->seed = allot__hash_seed();
	size_t cap = 8;
	while (cap < 2 * v->nq)
		cap *= 2;
	v->index_mask = cap - 1;
	v->q = calloc(v->nq, sizeof *v->q);
	v->rate = calloc(v->nq, sizeof *v->rate);
	v->burst = calloc(v->nq, sizeof *v->burst);
	v->index = calloc(cap, sizeof *v->index);
	v->path = strdup(path != NULL ? path : "");
	if (v->q == NULL || v->rate == NULL || v->burst == NULL ||
	    v->index == NULL || v->path == NULL)
		goto fail;
	for (size_t i = 0; i < v->nq; i++) {
		const allot__quota *q = i == 0 ? &cfg->def :
		                                 &cfg->callers[i - 1];
		v->q[i] = q;
		v->rate[i] = q->rate;
		v->burst[i] = q->burst;
		size_t len = strlen(q->identity);
		if (cfgv_find(v, q->identity, len) >= 0)
			continue; /* the loader rejects duplicates; be safe */
		uint64_t h = allot__hash(q->identity, len, v->seed);
		size_t j = (size_t) h & v->index_mask;
		while (v->index[j] != 0)
			j = (j + 1) & v->index_mask;
		v->index[j] = (uint32_t) i + 1;
	}
	v->cfg = cfg;
	return v;
fail:
	cfgv_free(v);
	return NULL;
}

static const char *
priority_name(const cfgv *v, uint32_t p)
{
	return p < v->cfg->nclasses ? v->cfg->classes[p] : "?";
}

/* ------------------------------------------------------------------ */
/* sessions and services                                               */
/* ------------------------------------------------------------------ */

static void
session_free(session *s)
{
	if (s == NULL)
		return;
	free(s->replica_id);
	free(s->host);
	free(s->agent_version);
	free(s->keys);
	free(s->names);
	free(s->names_blob);
	free(s);
}

static session *
hfind(const allot__state *st, uint64_t id)
{
	session *s = st->htab[allot__mix64(id) & st->hmask];
	while (s != NULL && s->id != id)
		s = s->hnext;
	return s;
}

static void
hinsert(allot__state *st, session *s)
{
	size_t b = allot__mix64(s->id) & st->hmask;
	s->hnext = st->htab[b];
	st->htab[b] = s;
}

static void
hremove(allot__state *st, session *s)
{
	session **pp = &st->htab[allot__mix64(s->id) & st->hmask];
	while (*pp != NULL && *pp != s)
		pp = &(*pp)->hnext;
	if (*pp == s)
		*pp = s->hnext;
	s->hnext = NULL;
}

static service *
service_find(const allot__state *st, const char *name)
{
	for (size_t i = 0; i < st->nsvcs; i++)
		if (strcmp(st->svcs[i]->name, name) == 0)
			return st->svcs[i];
	return NULL;
}

static void
squota_init(squota *sq, const cfgv *v, size_t q)
{
	memset(sq, 0, sizeof *sq);
	sq->level = v->burst[q];
	sq->level_recorded = NAN;
}

static uint32_t own_quotas(
    allot__state *st, struct service *svc, uint64_t now);

/* NULL when out of memory or the table is full (*full set). */
static service *
service_get(allot__state *st, const char *name, bool *full)
{
	*full = false;
	service *svc = service_find(st, name);
	if (svc != NULL)
		return svc;
	if (st->nsvcs >= st->o.max_services) {
		*full = true;
		return NULL;
	}
	service **arr = realloc(st->svcs, (st->nsvcs + 1) * sizeof *arr);
	if (arr == NULL)
		return NULL;
	st->svcs = arr;
	svc = calloc(1, sizeof *svc);
	if (svc == NULL)
		return NULL;
	svc->name = strdup(name);
	svc->q = calloc(st->cur->nq, sizeof *svc->q);
	if (svc->name == NULL || svc->q == NULL) {
		free(svc->name);
		free(svc->q);
		free(svc);
		return NULL;
	}
	for (size_t q = 0; q < st->cur->nq; q++)
		squota_init(&svc->q[q], st->cur, q);
	st->svcs[st->nsvcs++] = svc;
	own_quotas(st, svc, now_ns(st));
	return svc;
}

static bool
service_add(service *svc, session *s)
{
	if (svc->nsess == svc->cap) {
		uint32_t cap = svc->cap ? svc->cap * 2 : 8;
		session **arr = realloc(svc->sess, cap * sizeof *arr);
		if (arr == NULL)
			return false;
		svc->sess = arr;
		svc->cap = cap;
	}
	s->svc = svc;
	s->slot = svc->nsess;
	svc->sess[svc->nsess++] = s;
	svc->dirty = true;
	return true;
}

/* Take `s` out of the registry (its memory stays for the caller). */
static void
session_unlink(allot__state *st, session *s)
{
	service *svc = s->svc;
	if (!s->ghost)
		hremove(st, s);
	for (uint32_t k = 0; k < s->nkeys; k++) {
		const skey *key = &s->keys[k];
		if (key->q < 0)
			continue;
		squota *sq = &svc->q[key->q];
		/* Its grant goes back to the headroom. */
		svc->held_total -= key_hold(key);
		if (!isnan(key->sent_rate)) {
			sq->granted_rate -= key->sent_rate;
			sq->granted_burst -= key->sent_burst;
		}
	}
	uint32_t last = svc->nsess - 1;
	if (s->slot != last) {
		svc->sess[s->slot] = svc->sess[last];
		svc->sess[s->slot]->slot = s->slot;
	}
	svc->nsess--;
	svc->dirty = true;
	st->nsessions--;
}

static uint64_t
expiry_ns(const allot__state *st, uint32_t agent_interval_ms)
{
	uint32_t iv = st->o.interval_ms;
	if (agent_interval_ms > ALLOT__STATE_AGENT_INTERVAL_MAX)
		agent_interval_ms = ALLOT__STATE_AGENT_INTERVAL_MAX;
	if (agent_interval_ms > iv)
		iv = agent_interval_ms;
	/* An agent gives an exchange up after max(2T, 250 ms) and retries
	 * after a backoff: one lost reply must never expire a replica, so
	 * the silence tolerated covers two such timeouts plus an interval. */
	uint64_t timeout = 2u * (uint64_t) iv > 250u ? 2u * (uint64_t) iv :
	                                               250u;
	uint64_t floor_ms = 2u * timeout + iv;
	uint64_t k_ms = (uint64_t) iv * st->o.expiry_intervals;
	return (k_ms > floor_ms ? k_ms : floor_ms) * 1000000u;
}

/* Demand is the callers', not the replicas': when the replica set
 * changes, the load balancer moves it, it does not appear or vanish. A
 * newcomer claims the average of the others (alloc.c), so the others'
 * estimates give up the same part (n / (n + 1) each); a replica that
 * leaves hands its estimate to the survivors in equal parts. The
 * estimates then correct themselves from the next reports; without
 * this they would lag a change by a few intervals, and the shares with
 * them. Under the lock. */
static void
conserve_join(service *svc)
{
	double n = 0;
	for (uint32_t i = 0; i < svc->nsess; i++)
		n += !svc->sess[i]->ghost;
	if (n < 1)
		return;
	double f = n / (n + 1);
	for (uint32_t i = 0; i < svc->nsess; i++) {
		session *s = svc->sess[i];
		for (uint32_t k = 0; !s->ghost && k < s->nkeys; k++) {
			s->keys[k].est *= f;
			s->keys[k].est2 *= f * f;
		}
	}
}

static void
conserve_leave(service *svc, const session *gone_s)
{
	if (gone_s->ghost || gone_s->last_seq == 0)
		return;
	double n = 0;
	for (uint32_t i = 0; i < svc->nsess; i++)
		n += svc->sess[i] != gone_s && !svc->sess[i]->ghost;
	if (n < 1)
		return;
	for (uint32_t k = 0; k < gone_s->nkeys; k++) {
		const skey *gk = &gone_s->keys[k];
		if (gk->q < 0 || gk->est_ns == 0)
			continue;
		double add = est_read(gone_s, gk) / n;
		for (uint32_t i = 0; i < svc->nsess; i++) {
			session *s = svc->sess[i];
			if (s == gone_s || s->ghost)
				continue;
			for (uint32_t j = 0; j < s->nkeys; j++) {
				skey *key = &s->keys[j];
				if (key->q != gk->q)
					continue;
				if (key->est_ns == 0) {
					key->est = key->est2 = 0;
					key->est_ns = s->last_sync_ns;
				}
				/* Shift the mean, keep the variance. */
				key->est2 += add * (2 * key->est + add);
				key->est += add;
				break;
			}
		}
	}
}

/* A replica registering again keeps its estimates. */
static void
inherit(session *s, const session *old)
{
	for (uint32_t k = 0; k < s->nkeys; k++) {
		skey *key = &s->keys[k];
		for (uint32_t j = 0; key->q >= 0 && j < old->nkeys; j++) {
			const skey *ok = &old->keys[j];
			if (ok->q == key->q && ok->est_ns != 0 &&
			    !old->ghost) {
				double d = est_decay(old,
				    (double) since(
				        old->last_sync_ns, ok->est_ns) /
				        1e9);
				key->est = ok->est * d;
				key->est2 = ok->est2 * d;
				key->est_ns = old->last_sync_ns;
				break;
			}
		}
	}
}

/* ------------------------------------------------------------------ */
/* expired replicas and the live bound                                 */
/* ------------------------------------------------------------------ */

static void
zombie_free(zombie *z)
{
	free(z->replica_id);
	free(z->rate);
	free(z->burst);
}

static void
zombies_clear(service *svc)
{
	for (uint32_t i = 0; i < svc->nzs; i++)
		zombie_free(&svc->zs[i]);
	free(svc->zs);
	svc->zs = NULL;
	svc->nzs = 0;
}

static void
zombie_remove(service *svc, uint32_t i)
{
	zombie_free(&svc->zs[i]);
	svc->zs[i] = svc->zs[--svc->nzs];
}

/* The replica registered again: its new session is what it holds. */
static void
zombie_forget(service *svc, const char *replica_id)
{
	for (uint32_t i = 0; i < svc->nzs; i++) {
		if (strcmp(svc->zs[i].replica_id, replica_id) == 0) {
			zombie_remove(svc, i);
			return;
		}
	}
}

/* The fewest replicas a session may have been told in its last answer:
 * its fallback is R divided by that. */
static uint32_t
fewest(const session *s)
{
	uint32_t a = s->last_replicas, b = s->acked_replicas;
	return b != 0 && b < a ? b : a;
}

/* Remember what the expiring session `s` may still hold. Without memory
 * it is simply not counted (the bound then under-reports). */
static void
zombie_add(allot__state *st, service *svc, const session *s, uint64_t now)
{
	zombie_forget(svc, s->replica_id);
	const cfgv *v = st->cur;
	zombie *arr = realloc(svc->zs, (svc->nzs + 1) * sizeof *arr);
	if (arr == NULL)
		return;
	svc->zs = arr;
	zombie z = {
		.replica_id = strdup(s->replica_id),
		.reply_ns = s->last_reply_ns,
		.acked_ns = s->acked_reply_ns,
		.drop_ns = now + (uint64_t) st->o.zombie_ms * 1000000u,
		.n_last = fewest(s),
		.interval_s = s->interval_s,
		.epoch = v->epoch,
		.rate = malloc(v->nq * sizeof(double)),
		.burst = malloc(v->nq * sizeof(double)),
	};
	if (z.replica_id == NULL || z.rate == NULL || z.burst == NULL) {
		zombie_free(&z);
		return;
	}
	for (size_t q = 0; q < v->nq; q++)
		z.rate[q] = z.burst[q] = NAN; /* no key for it */
	for (uint32_t k = 0; k < s->nkeys; k++) {
		const skey *key = &s->keys[k];
		if (key->q < 0)
			continue;
		z.rate[key->q] = isnan(key->sent_rate) ?
		    0 :
		    fmax(key->sent_rate, key->may_rate);
		z.burst[key->q] = isnan(key->sent_burst) ?
		    0 :
		    fmax(key->sent_burst, key->may_burst);
	}
	svc->zs[svc->nzs++] = z;
}

static void
zombies_expire(service *svc, uint64_t now)
{
	for (uint32_t i = svc->nzs; i-- > 0;)
		if (now >= svc->zs[i].drop_ns)
			zombie_remove(svc, i);
}

/* What an agent runs on when its lease ran out: the quota's fallback
 * (agent/sync_core.c), with the agent's minimum burst applied. */
static void
fallback_allowance(
    const cfgv *v, size_t q, uint32_t n, double *ret_r, double *ret_b)
{
	const allot__quota *qq = v->q[q];
	if (qq->fallback == ALLOT_FALLBACK_OPEN) {
		*ret_r = *ret_b = INFINITY;
		return;
	}
	if (qq->fallback == ALLOT_FALLBACK_CLOSED) {
		*ret_r = *ret_b = 0;
		return;
	}
	double nn = n > 0 ? (double) n : 1.0;
	*ret_r = v->rate[q] / nn;
	*ret_b = fmax(v->burst[q] / nn, (double) v->cfg->max_weight);
}

/* Where a replica stands with its lease at `now`, as far as the
 * coordinator can tell (see lease_at()). */
typedef enum lease_phase {
	LEASE_HELD,
	LEASE_EITHER,
	LEASE_LAPSED,
} lease_phase;

static lease_phase
lease_at(const allot__state *st, uint64_t sent_ns, uint64_t acked_ns,
    double interval_s, uint64_t now)
{
	/* Its lease started with the last answer it received: no earlier
	 * than the last it acknowledged (its Welcome counts: without it,
	 * it runs on its bootstrap allowance, a term of its own), no later
	 * than the last we sent plus its travel. And an agent notices the
	 * end of its lease between exchanges only, up to one request
	 * timeout late (allot__exchange_timeout_ms: 2 T, 250 ms to 2 s). */
	uint64_t lease = (uint64_t) st->o.lease_ms * 1000000u;
	double to = allot__exchange_timeout_ms(
	                (uint32_t) lround(interval_s * 1e3)) /
	    1e3;
	if (acked_ns == 0)
		acked_ns = sent_ns;
	if (sent_ns == 0 || now < acked_ns + lease)
		return LEASE_HELD;
	if (now < sent_ns + lease + (uint64_t) ((to + interval_s) * 1e9))
		return LEASE_EITHER;
	return LEASE_LAPSED;
}

/* The local burst an agent really runs with: it raises any burst of a
 * limiting allowance to the largest endpoint weight (agent.c), and a
 * zero rate closes the bucket. */
static double
eff_burst(const cfgv *v, double r, double b)
{
	return r > 0 ? fmax(b, (double) v->cfg->max_weight) : 0;
}

/* What one key of a session may run on now (live bound terms). */
static void
key_bound(const allot__state *st, const session *s, const skey *key,
    uint64_t now, double *ret_r, double *ret_b)
{
	const cfgv *v = st->cur;
	double r = isnan(key->sent_rate) ? 0 : key->sent_rate;
	double b = isnan(key->sent_burst) ? 0 : key->sent_burst;
	if (!s->ghost && !isnan(key->may_rate)) {
		r = fmax(r, key->may_rate);
		b = fmax(b, key->may_burst);
	}
	b = eff_burst(v, r, b);
	lease_phase ph = s->ghost ? LEASE_HELD :
	                            lease_at(st, s->last_reply_ns,
	                                s->acked_reply_ns, s->interval_s, now);
	if (ph != LEASE_HELD) {
		double fr, fb;
		fallback_allowance(v, (size_t) key->q, fewest(s), &fr, &fb);
		r = ph == LEASE_LAPSED ? fr : fmax(r, fr);
		b = ph == LEASE_LAPSED ? fb : fmax(b, fb);
	}
	*ret_r = r;
	*ret_b = b;
}

/* What expired replica `z` may run quota q on at `now`; false when it had
 * no key for it. */
static bool
zombie_value(const allot__state *st, const zombie *z, size_t q, uint64_t now,
    double *ret_r, double *ret_b)
{
	const cfgv *v = st->cur;
	if (z->epoch != v->epoch || q >= v->nq || isnan(z->rate[q]))
		return false;
	double r = z->rate[q];
	double b = eff_burst(v, r, z->burst[q]);
	lease_phase ph = lease_at(
	    st, z->reply_ns, z->acked_ns, z->interval_s, now);
	if (ph != LEASE_HELD) {
		double fr, fb;
		fallback_allowance(v, q, z->n_last, &fr, &fb);
		r = ph == LEASE_LAPSED ? fr : fmax(r, fr);
		b = ph == LEASE_LAPSED ? fb : fmax(b, fb);
	}
	*ret_r = r;
	*ret_b = b;
	return true;
}

/* What the expired replicas of `svc` may still be running on, kept out
 * of the headroom (grant()): their grants while their lease may run,
 * and with ALLOT__HOLD_FALLBACK their fallback afterwards. Under the
 * lock, every tick. */
static void
reserve_expired(allot__state *st, service *svc, uint64_t now)
{
	const cfgv *v = st->cur;
	if (st->o.hold_expired == ALLOT__HOLD_NONE)
		return;
	for (size_t q = 0; q < v->nq; q++) {
		squota *sq = &svc->q[q];
		sq->reserved_rate = sq->reserved_burst = 0;
		for (uint32_t i = 0; i < svc->nzs; i++) {
			const zombie *z = &svc->zs[i];
			double r, b;
			if (!zombie_value(st, z, q, now, &r, &b))
				continue;
			if (st->o.hold_expired == ALLOT__HOLD_LEASE) {
				if (lease_at(st, z->reply_ns, z->acked_ns,
				        z->interval_s, now) == LEASE_LAPSED)
					continue;
				r = z->rate[q];
				b = z->burst[q];
			}
			sq->reserved_rate += r;
			sq->reserved_burst += b;
		}
	}
}

/* The live bound of every quota of `svc` (squota.bound_*): per replica
 * the larger of its grant and any earlier grant it has not acknowledged,
 * its fallback once its lease ran out, a placeholder's assumed share,
 * and the expired replicas still counted. Under the lock. */
static void
compute_bounds(allot__state *st, service *svc, uint64_t now)
{
	const cfgv *v = st->cur;
	for (size_t q = 0; q < v->nq; q++) {
		svc->q[q].bound_rate = 0;
		svc->q[q].bound_burst = 0;
		svc->q[q].counted_expired = 0;
	}
	for (uint32_t i = 0; i < svc->nsess; i++) {
		const session *s = svc->sess[i];
		for (uint32_t k = 0; k < s->nkeys; k++) {
			const skey *key = &s->keys[k];
			if (key->q < 0)
				continue;
			double r, b;
			key_bound(st, s, key, now, &r, &b);
			svc->q[key->q].bound_rate += r;
			svc->q[key->q].bound_burst += b;
		}
	}
	for (uint32_t i = 0; i < svc->nzs; i++) {
		const zombie *z = &svc->zs[i];
		if (z->epoch != v->epoch)
			continue;
		for (size_t q = 0; q < v->nq; q++) {
			double r, b;
			if (!zombie_value(st, z, q, now, &r, &b))
				continue;
			svc->q[q].bound_rate += r;
			svc->q[q].bound_burst += b;
			svc->q[q].counted_expired++;
		}
	}
}

static double
bound_ratio(const squota *sq, double R, double B)
{
	double a = sq->bound_rate / R, b = sq->bound_burst / B;
	return a > b ? a : b;
}

/* A replica registering again keeps its local buckets and the
 * allowances it ran on (docs/protocol.md) until our Welcome reaches it,
 * so its new session may hold those until it acknowledges the Welcome.
 * `old` is its previous live session, or NULL. Under the lock. */
static void
carry_allowances(allot__state *st, service *svc, session *s,
    const session *old, uint64_t now)
{
	const zombie *z = NULL;
	for (uint32_t i = 0; i < svc->nzs; i++)
		if (strcmp(svc->zs[i].replica_id, s->replica_id) == 0)
			z = &svc->zs[i];
	for (uint32_t k = 0; k < s->nkeys; k++) {
		skey *key = &s->keys[k];
		if (key->q < 0)
			continue;
		double r = -1, b = -1, x, y;
		if (z != NULL &&
		    zombie_value(st, z, (size_t) key->q, now, &x, &y)) {
			r = x;
			b = y;
		}
		for (uint32_t j = 0;
		     old != NULL && !old->ghost && j < old->nkeys; j++) {
			if (old->keys[j].q != key->q)
				continue;
			key_bound(st, old, &old->keys[j], now, &x, &y);
			r = fmax(r, x);
			b = fmax(b, y);
		}
		if (r >= 0) {
			key->may_rate = r;
			key->may_burst = b;
			s->unacked = true;
		}
	}
}

/* A request from a replica: the coordinator is not cut off. When nobody
 * had been heard for K intervals, that silence was more likely the
 * coordinator's own network than every replica dying at once: the
 * silent replicas of services that had two or more get learn_ms to come
 * back before they expire, so the first to return is not handed the
 * shares of the others, which are running on their lease or fallback.
 * Under the lock. */
static void
heard(allot__state *st, uint64_t now)
{
	uint64_t win = expiry_ns(st, 0);
	if (st->last_heard_ns != 0 && since(now, st->last_heard_ns) > win &&
	    st->o.learn_ms > 0) {
		st->grace_until_ns = now +
		    (uint64_t) st->o.learn_ms * 1000000u;
		for (size_t i = 0; i < st->nsvcs; i++)
			st->svcs[i]->nsess_silenced = st->svcs[i]->nsess;
	}
	st->last_heard_ns = now;
}

/* ------------------------------------------------------------------ */
/* allocation                                                          */
/* ------------------------------------------------------------------ */

static bool
grow(void **p, size_t *cap, size_t need, size_t elem)
{
	if (need <= *cap)
		return true;
	size_t c = *cap ? *cap : 64;
	while (c < need)
		c *= 2;
	void *np = realloc(*p, c * elem);
	if (np == NULL)
		return false;
	*p = np;
	*cap = c;
	return true;
}

/* Differences below this are rounding, not a change worth a message. */
static double
tolerance(double total)
{
	return 1e-9 * (total > 1 ? total : 1);
}

/* The sums of grants of each quota of `svc`, from scratch (the running
 * sums are kept incrementally; this removes any rounding drift). */
static void
rebuild_granted(allot__state *st, service *svc)
{
	for (size_t q = 0; q < st->cur->nq; q++) {
		svc->q[q].granted_rate = 0;
		svc->q[q].granted_burst = 0;
	}
	svc->held_total = 0;
	for (uint32_t i = 0; i < svc->nsess; i++) {
		const session *s = svc->sess[i];
		for (uint32_t k = 0; k < s->nkeys; k++) {
			const skey *key = &s->keys[k];
			if (key->q < 0)
				continue;
			svc->held_total += key_hold(key);
			if (isnan(key->sent_rate))
				continue;
			svc->q[key->q].granted_rate += key->sent_rate;
			svc->q[key->q].granted_burst += key->sent_burst;
		}
	}
}

/* Recompute every target share of `svc` with the allocator. Under the
 * lock. Grants follow on each replica's next sync (grant()). */
static bool
recompute(allot__state *st, service *svc, uint64_t now)
{
	const cfgv *v = st->cur;
	size_t nq = v->nq;
	if (!grow((void **) &st->aq, &st->aq_cap, nq, sizeof *st->aq))
		return false;
	allot__alloc_quota *aq = st->aq;
	for (size_t q = 0; q < nq; q++) {
		level_bring(&svc->q[q], v->rate[q], v->burst[q], now);
		aq[q] = (allot__alloc_quota) {
			.rate = v->rate[q],
			.burst = v->burst[q],
			.priority = v->q[q]->priority,
			.level = svc->q[q].level,
			.horizon_s = (double) st->o.interval_ms / 1e3,
			.min_burst = (double) v->cfg->max_weight,
		};
		svc->q[q].demand_sum = 0;
	}
	size_t total = 0;
	for (uint32_t i = 0; i < svc->nsess; i++) {
		const session *s = svc->sess[i];
		for (uint32_t k = 0; k < s->nkeys; k++) {
			if (s->keys[k].q >= 0) {
				aq[s->keys[k].q].nslots++;
				total++;
			}
		}
	}
	size_t ocap = st->owner_cap;
	if (!grow((void **) &st->slots, &st->slot_cap, total + 1,
	        sizeof *st->slots) ||
	    !grow((void **) &st->owner_sess, &ocap, total + 1,
	        sizeof *st->owner_sess) ||
	    !grow((void **) &st->owner_key, &st->owner_cap, total + 1,
	        sizeof *st->owner_key))
		return false;
	size_t off = 0;
	for (size_t q = 0; q < nq; q++) {
		aq[q].slots = st->slots + off;
		off += aq[q].nslots;
		aq[q].nslots = 0;
	}
	double window_s = svc->last_alloc_ns != 0 ?
	    (double) since(now, svc->last_alloc_ns) / 1e9 :
	    0;
	for (uint32_t i = 0; i < svc->nsess; i++) {
		const session *s = svc->sess[i];
		for (uint32_t k = 0; k < s->nkeys; k++) {
			int32_t q = s->keys[k].q;
			if (q < 0)
				continue;
			allot__alloc_slot *sl = &aq[q].slots[aq[q].nslots];
			size_t idx = (size_t) (sl - st->slots);
			const skey *key = &s->keys[k];
			/* Until its first Sync a replica's demand is unknown
			 * (a placeholder's too); after it, a key it does not
			 * report is idle. */
			bool fresh = s->ghost || s->last_seq < 2;
			double d = fresh ? 0 : est_read(s, key);
			double dv = fresh ? 0 : est_var(s, key);
			svc->q[q].demand_sum += d;
			*sl = (allot__alloc_slot) {
				.replica = i,
				.consumed = key->consumed,
				/* Denials while its grant lagged its target
				 * (waiting for headroom) say nothing about
				 * the target. */
				.denied = key->was_short ? 0 : key->denied,
				.demand = d,
				.demand_var = dv,
				.fresh = fresh,
				.held = key->held,
				.has_prev = key->targeted,
				.prev_rate = key->rate,
				.prev_burst = key->burst,
			};
			st->owner_sess[idx] = i;
			st->owner_key[idx] = k;
			aq[q].nslots++;
		}
	}
	allot__alloc_service as = {
		.ceiling_rate = v->cfg->ceiling_rate,
		.window_s = window_s,
		.nreplicas = svc->nsess,
		.quotas = aq,
		.nquotas = nq,
	};
	allot__alloc_compute(&st->o.policy, &as);
	bool changed = false;
	for (size_t q = 0; q < nq; q++) {
		svc->q[q].sum_rate = aq[q].sum_rate;
		svc->q[q].sum_burst = aq[q].sum_burst;
		svc->q[q].allowance = aq[q].allowance;
		svc->q[q].burst_budget = aq[q].burst_budget;
		svc->q[q].nslots = (uint32_t) aq[q].nslots;
		for (size_t j = 0; j < aq[q].nslots; j++) {
			size_t idx = (size_t) (&aq[q].slots[j] - st->slots);
			session *s = svc->sess[st->owner_sess[idx]];
			skey *key = &s->keys[st->owner_key[idx]];
			if (!key->targeted ||
			    key->rate != aq[q].slots[j].rate ||
			    key->burst != aq[q].slots[j].burst) {
				key->rate = aq[q].slots[j].rate;
				key->burst = aq[q].slots[j].burst;
				key->targeted = true;
				changed = true;
			}
			key->consumed = 0;
			key->denied = 0;
			key->was_short = isnan(key->sent_rate) ||
			    key->rate - key->sent_rate >
			        0.01 * key->rate + tolerance(v->rate[q]);
		}
	}
	if (changed)
		svc->gen++;
	rebuild_granted(st, svc);
	svc->dirty = false;
	svc->last_alloc_ns = now;
	return true;
}

/* Move the grant of one key toward its target: a decrease at once, an
 * increase only as far as the quota's headroom allows, so the grants of
 * the quota never sum above R (rate) or B (burst); with `hold` (a key
 * being learnt, or a member cut off), or st->hold, no increase at all.
 * Returns true when the grant changed (the key belongs in the Reply);
 * *ret_short is set when the grant is still below the target. Under the
 * lock. */
static bool
grant(allot__state *st, service *svc, session *s, skey *key, bool hold,
    bool *ret_short)
{
	squota *sq = &svc->q[key->q];
	double R = st->cur->rate[key->q], B = st->cur->burst[key->q];
	double C = st->cur->cfg->ceiling_rate;
	bool fresh = isnan(key->sent_rate);
	double held_r = fresh ? 0 : key->sent_rate;
	double held_b = fresh ? 0 : key->sent_burst;
	double room_r = R - sq->granted_rate;
	/* Bursts only out of what the global bucket has (the allocator's
	 * budget), and rates also within the ceiling across quotas. The
	 * ceiling counts what the agents may hold, decreases they have not
	 * acknowledged included: it moves capacity between callers, where
	 * a lost Reply would otherwise let two of them use it at once. */
	double room_b = fmin(B, sq->burst_budget) - sq->granted_burst;
	if (C > 0 && C - svc->held_total < room_r)
		room_r = C - svc->held_total;
	room_r -= sq->reserved_rate;
	room_b -= sq->reserved_burst;
	if (st->hold || hold)
		room_r = room_b = 0;
	double gr = key->rate <= held_r ?
	    key->rate :
	    fmin(key->rate, held_r + (room_r > 0 ? room_r : 0));
	double gb = key->burst <= held_b ?
	    key->burst :
	    fmin(key->burst, held_b + (room_b > 0 ? room_b : 0));
	*ret_short = key->rate - gr > tolerance(R) ||
	    key->burst - gb > tolerance(B);
	if (key->rate - gr > 0.01 * key->rate + tolerance(R))
		key->was_short = true;
	key->reply_target = key->rate;
	if (!fresh && fabs(gr - held_r) <= tolerance(R) &&
	    fabs(gb - held_b) <= tolerance(B))
		return false;
	sq->granted_rate += gr - held_r;
	sq->granted_burst += gb - held_b;
	double h0 = key_hold(key);
	key->sent_rate = gr;
	key->sent_burst = gb;
	/* Until the agent acknowledges, it may still run on the larger of
	 * this grant and any earlier one it has not confirmed. */
	key->may_rate = isnan(key->may_rate) ? gr : fmax(key->may_rate, gr);
	key->may_burst = isnan(key->may_burst) ? gb : fmax(key->may_burst, gb);
	if (key->may_rate != gr || key->may_burst != gb)
		s->unacked = true;
	svc->held_total += key_hold(key) - h0;
	key->rec_pending = true;
	svc->rec_pending = true;
	return true;
}

/* Store rows for the grants that changed. Under the lock (memory only). */
static void
record_shares(allot__state *st, service *svc)
{
	if (!svc->rec_pending)
		return;
	svc->rec_pending = false;
	int64_t until = allot__wall_ms() + st->o.lease_ms;
	for (uint32_t i = 0; i < svc->nsess; i++) {
		session *s = svc->sess[i];
		for (uint32_t k = 0; k < s->nkeys; k++) {
			skey *key = &s->keys[k];
			if (!key->rec_pending)
				continue;
			key->rec_pending = false;
			if (st->o.store != NULL && key->q >= 0 && !s->ghost &&
			    !isnan(key->sent_rate))
				allot__store_share(st->o.store, s->id,
				    svc->name, st->cur->q[key->q]->identity,
				    key->sent_rate, key->sent_burst, until);
		}
	}
}

/* ------------------------------------------------------------------ */
/* create / destroy                                                    */
/* ------------------------------------------------------------------ */

void
allot__state_opts_init(allot__state_opts *o)
{
	memset(o, 0, sizeof *o);
	o->lease_ms = ALLOT__STATE_LEASE_MS;
	o->interval_ms = ALLOT__STATE_INTERVAL_MS;
	o->expiry_intervals = ALLOT__STATE_EXPIRY_INTERVALS;
	o->max_replicas = ALLOT__STATE_MAX_REPLICAS;
	o->max_services = ALLOT__STATE_MAX_SERVICES;
	o->full_every = ALLOT__STATE_FULL_EVERY;
	o->absurd_factor = ALLOT__STATE_ABSURD_FACTOR;
	allot__alloc_policy_init(&o->policy);
	o->learn_ms = 2 * ALLOT__STATE_LEASE_MS;
	o->zombie_ms = ALLOT__STATE_ZOMBIE_MS;
}

static void
record_config(allot__state *st, const cfgv *v, const char *text)
{
	if (st->o.store != NULL)
		allot__store_config_loaded(st->o.store, v->epoch,
		    v->cfg->digest, v->path, text != NULL ? text : "");
}

int
allot__state_create(const allot__state_opts *opts, allot_config *cfg,
    const char *path, const char *text, allot__state **ret)
{
	if (opts == NULL || cfg == NULL || ret == NULL ||
	    opts->interval_ms == 0 || opts->expiry_intervals == 0 ||
	    opts->max_replicas == 0 || opts->full_every == 0)
		return ALLOT_EINVAL;
	allot__state *st = calloc(1, sizeof *st);
	if (st == NULL)
		return ALLOT_ENOMEM;
	st->o = *opts;
	if (opts->lg != NULL)
		st->lgv = *opts->lg;
	st->o.lg = &st->lgv;
	st->rl_unknown = (allot__logrl) ALLOT__LOGRL_INIT(5, 10000);
	st->rl_absurd = (allot__logrl) ALLOT__LOGRL_INIT(5, 10000);
	st->rl_register = (allot__logrl) ALLOT__LOGRL_INIT(20, 10000);
	size_t buckets = 64;
	while (buckets < 2 * (size_t) opts->max_replicas)
		buckets *= 2;
	st->hmask = buckets - 1;
	st->htab = calloc(buckets, sizeof *st->htab);
	st->next_session = 1;
	if (st->htab == NULL || pthread_mutex_init(&st->mu, NULL) != 0) {
		free(st->htab);
		free(st);
		return ALLOT_ENOMEM;
	}
	st->cur = cfgv_new(cfg, path, 1);
	if (st->cur == NULL) {
		pthread_mutex_destroy(&st->mu);
		free(st->htab);
		free(st);
		return ALLOT_ENOMEM;
	}
	record_config(st, st->cur, text);
	st->last_second_ns = now_ns(st);
	*ret = st;
	return ALLOT_OK;
}

void
allot__state_destroy(allot__state *st)
{
	if (st == NULL)
		return;
	for (size_t i = 0; i < st->nsvcs; i++) {
		service *svc = st->svcs[i];
		for (uint32_t j = 0; j < svc->nsess; j++)
			session_free(svc->sess[j]);
		zombies_clear(svc);
		free(svc->sess);
		free(svc->q);
		free(svc->name);
		free(svc);
	}
	free(st->svcs);
	free(st->htab);
	free(st->stamp);
	free(st->aq);
	free(st->slots);
	free(st->owner_sess);
	free(st->owner_key);
	cfgv_free(st->cur);
	pthread_mutex_destroy(&st->mu);
	free(st);
}

/* ------------------------------------------------------------------ */
/* restore                                                             */
/* ------------------------------------------------------------------ */

typedef struct restore_ctx {
	allot__state *st;
	uint64_t now;
	uint64_t max_id;
	uint32_t restored;
	uint32_t dropped;
} restore_ctx;

static void
on_restored_replica(void *arg, const allot__store_replica *r)
{
	restore_ctx *rc = arg;
	allot__state *st = rc->st;
	if (r->session > rc->max_id)
		rc->max_id = r->session;
	bool full = false;
	service *svc = NULL;
	session *s = calloc(1, sizeof *s);
	if (s == NULL || r->replica_id == NULL || r->service == NULL ||
	    st->nsessions >= st->o.max_replicas)
		goto drop;
	svc = service_get(st, r->service, &full);
	s->replica_id = strdup(r->replica_id);
	if (svc == NULL || s->replica_id == NULL)
		goto drop;
	/* A placeholder holds one key per quota (names kept for reloads). */
	const cfgv *v = st->cur;
	size_t blob = 0;
	for (size_t q = 0; q < v->nq; q++)
		blob += strlen(v->q[q]->identity) + 1;
	s->keys = calloc(v->nq, sizeof *s->keys);
	s->names = calloc(v->nq, sizeof *s->names);
	s->names_blob = malloc(blob);
	if (s->keys == NULL || s->names == NULL || s->names_blob == NULL)
		goto drop;
	char *p = s->names_blob;
	for (size_t q = 0; q < v->nq; q++) {
		size_t len = strlen(v->q[q]->identity);
		memcpy(p, v->q[q]->identity, len + 1);
		s->names[q] = p;
		p += len + 1;
		s->keys[q].q = (int32_t) q;
		s->keys[q].sent_rate = NAN;
		s->keys[q].sent_burst = NAN;
	}
	s->nkeys = s->nknown = (uint32_t) v->nq;
	s->id = r->session;
	s->ghost = true;
	s->interval_s = (double) st->o.interval_ms / 1e3;
	s->last_seen_ns = rc->now;
	s->expiry_ns = expiry_ns(st, 0);
	s->joined_wall_ms = allot__wall_ms();
	s->seen_wall_ms = r->last_seen_ms;
	if (!service_add(svc, s))
		goto drop;
	st->nsessions++;
	rc->restored++;
	return;
drop:
	/* Without a placeholder the row would stay "live" forever. */
	session_free(s);
	rc->dropped++;
	if (st->o.store != NULL)
		allot__store_replica_left(st->o.store, r->session, "expired");
}

static void
on_restored_level(void *arg, const allot__store_level *l)
{
	restore_ctx *rc = arg;
	allot__state *st = rc->st;
	if (l->service == NULL || l->quota == NULL)
		return;
	int32_t q = cfgv_find(st->cur, l->quota, strlen(l->quota));
	if (q < 0 || !isfinite(l->level))
		return;
	bool full;
	service *svc = service_get(st, l->service, &full);
	if (svc == NULL)
		return;
	double b = st->cur->burst[q];
	svc->q[q].level = l->level < 0 ? 0 : l->level > b ? b : l->level;
	svc->q[q].level_ns = rc->now;
	svc->q[q].level_recorded = svc->q[q].level;
}

int
allot__state_restore(allot__state *st)
{
	if (st == NULL)
		return ALLOT_EINVAL;
	restore_ctx rc = { .st = st, .now = now_ns(st) };
	int rv = ALLOT_OK;
	pthread_mutex_lock(&st->mu);
	if (st->o.store != NULL) {
		rv = allot__store_restore(
		    st->o.store, on_restored_replica, on_restored_level, &rc);
		uint64_t mx = allot__store_max_session(st->o.store);
		if (mx > rc.max_id)
			rc.max_id = mx;
	}
	if (rc.max_id >= st->next_session)
		st->next_session = rc.max_id + 1;
	uint64_t now = now_ns(st);
	for (size_t i = 0; i < st->nsvcs; i++) {
		service *svc = st->svcs[i];
		if (!svc->dirty)
			continue;
		recompute(st, svc, now);
		/* What they held before the restart is unknown; assume their
		 * equal share, which is what the last run handed out. */
		for (uint32_t j = 0; j < svc->nsess; j++) {
			session *s = svc->sess[j];
			for (uint32_t k = 0; s->ghost && k < s->nkeys; k++) {
				s->keys[k].sent_rate = s->keys[k].rate;
				s->keys[k].sent_burst = s->keys[k].burst;
			}
		}
		rebuild_granted(st, svc);
	}
	pthread_mutex_unlock(&st->mu);
	if (rc.restored > 0 || rc.dropped > 0) {
		allot__log(st->o.lg, ALLOT_LOG_NOTICE, "ALLOTD-RESTORE",
		    "%u replicas were live at the last stop: they count "
		    "until they re-register or expire in %" PRIu64 " ms%s",
		    rc.restored, expiry_ns(st, 0) / 1000000u,
		    rc.dropped ? " (some could not be restored and were "
		                 "marked expired)" :
		                 "");
		if (st->o.store != NULL) {
			char detail[96];
			snprintf(detail, sizeof detail,
			    "restored=%u dropped=%u", rc.restored, rc.dropped);
			allot__store_event(
			    st->o.store, "restore", NULL, detail);
		}
	}
	return rv;
}

/* ------------------------------------------------------------------ */
/* requests                                                            */
/* ------------------------------------------------------------------ */

/* Printable ASCII, 1..max bytes (0 allowed when !required). Names end up
 * in label values, JSON and log lines; restricting them keeps all three
 * trivially safe. */
static bool
name_ok(const char *s, size_t max, bool required)
{
	if (s == NULL)
		return !required;
	size_t n = 0;
	for (; s[n] != '\0'; n++) {
		unsigned char c = (unsigned char) s[n];
		if (c < 0x20 || c > 0x7e || n >= max)
			return false;
	}
	return n > 0 || !required;
}

static void *
pa_alloc(ProtobufCAllocator *pa, size_t size)
{
	return pa->alloc(pa->allocator_data, size);
}

/* Bring every grant of `s` toward its target (grant()) and fill
 * `shares` with the keys whose grant changed, or with every key that has
 * a quota when `all` is set. Returns false when `pa` is out of memory;
 * nothing is granted then. */
/* ---- cluster ownership (docs/operations.md, Cluster) ---- */

/* A key we are learning reported the allowance it runs on (granted by
 * the member that owned it before): count it as our grant, as far as
 * the quota has room, so that what we hand out on top never makes the
 * total exceed R. Until it applies our answer it may still run on all
 * of it (may_*). Under the lock. */
static void
adopt(allot__state *st, service *svc, session *s, skey *key,
    const Allot__V1__KeyReport *r)
{
	squota *sq = &svc->q[key->q];
	double R = st->cur->rate[key->q], B = st->cur->burst[key->q];
	double hr = r->held_rate >= 0 && r->held_rate <= R ? r->held_rate :
	    r->held_rate > R                               ? R :
	                                                     0;
	double hb = r->held_burst >= 0 && r->held_burst <= B ? r->held_burst :
	    r->held_burst > B                                ? B :
	                                                       0;
	double h0 = key_hold(key);
	key->sent_rate = fmin(hr, fmax(0, R - sq->granted_rate));
	key->sent_burst = fmin(hb, fmax(0, B - sq->granted_burst));
	key->may_rate = hr;
	key->may_burst = hb;
	sq->granted_rate += key->sent_rate;
	sq->granted_burst += key->sent_burst;
	svc->held_total += key_hold(key) - h0;
	if (key->may_rate != key->sent_rate ||
	    key->may_burst != key->sent_burst)
		s->unacked = true;
	key->rec_pending = true;
	svc->rec_pending = true;
}

/* Another member owns quota `q` of `svc` now: what we granted for it
 * is that member's to account for (it learns what the agents hold). */
static void
disown(service *svc, size_t q)
{
	squota *sq = &svc->q[q];
	for (uint32_t i = 0; i < svc->nsess; i++) {
		session *s = svc->sess[i];
		for (uint32_t k = 0; k < s->nkeys; k++) {
			skey *key = &s->keys[k];
			if (key->q != (int32_t) q)
				continue;
			double h0 = key_hold(key);
			key->sent_rate = key->sent_burst = NAN;
			key->may_rate = key->may_burst = NAN;
			svc->held_total -= h0;
		}
	}
	sq->granted_rate = sq->granted_burst = 0;
	sq->disowned = true;
}

/* Ownership of every quota of `svc` in our current view; returns how
 * many quotas changed hands. A quota we gain is learnt for one lease
 * (plus two intervals: the old owner may have granted until it saw the
 * change). Under the lock. */
static uint32_t
own_quotas(allot__state *st, service *svc, uint64_t now)
{
	if (st->cl_n == 0)
		return 0;
	const cfgv *v = st->cur;
	uint32_t changed = 0;
	for (size_t q = 0; q < v->nq; q++) {
		squota *sq = &svc->q[q];
		int o = allot__rendezvous_owner(
		    allot__rendezvous_key(svc->name, v->q[q]->identity),
		    st->cl_hash, st->cl_cut_off ? NULL : st->cl_live,
		    st->cl_n);
		bool own = o == (int) st->cl_self;
		if (own && sq->disowned) {
			sq->disowned = false;
			sq->learn_until_ns = now + st->cl_learn_ns;
			changed++;
		} else if (!own && !sq->disowned) {
			disown(svc, q);
			changed++;
		}
		if (own && sq->learn_until_ns < st->cl_boot_until_ns)
			sq->learn_until_ns = st->cl_boot_until_ns;
	}
	if (changed > 0) {
		svc->gen++;
		for (uint32_t i = 0; i < svc->nsess; i++)
			svc->sess[i]->force_full = true;
	}
	return changed;
}

/* A quota being learnt is learnt once every replica of the service has
 * said what it runs on (each holds a grant here, adopted or made): no
 * allowance of the previous owner is unknown any more. A placeholder of
 * a restart, or a replica still reporting the quota elsewhere, keeps the
 * learning period running to its end. Under the lock, every tick. */
static void
learned(allot__state *st, service *svc, uint64_t now)
{
	const cfgv *v = st->cur;
	if (st->cl_n == 0 || svc->nsess == 0)
		return;
	for (size_t q = 0; q < v->nq; q++)
		svc->q[q].unheard = false;
	for (uint32_t i = 0; i < svc->nsess; i++) {
		const session *s = svc->sess[i];
		for (uint32_t k = 0; k < s->nkeys; k++)
			if (s->keys[k].q >= 0 &&
			    (s->ghost || isnan(s->keys[k].sent_rate)))
				svc->q[s->keys[k].q].unheard = true;
	}
	for (size_t q = 0; q < v->nq; q++) {
		squota *sq = &svc->q[q];
		if (!sq->disowned && now < sq->learn_until_ns && !sq->unheard)
			sq->learn_until_ns = now;
	}
}

static bool
build_shares(allot__state *st, session *s, ProtobufCAllocator *pa, bool all,
    Allot__V1__Share ***ret, size_t *ret_n)
{
	*ret = NULL;
	*ret_n = 0;
	s->pending = 0;
	if (s->nknown == 0)
		return true;
	/* Room for every key up front: once a grant is made it must reach
	 * the agent. The arena makes this a pointer bump. */
	Allot__V1__Share *arr = pa_alloc(pa, s->nknown * sizeof *arr);
	Allot__V1__Share **ptrs = pa_alloc(pa, s->nknown * sizeof *ptrs);
	if (arr == NULL || ptrs == NULL)
		return false;
	size_t j = 0;
	uint64_t now = st->cl_n > 0 ? now_ns(st) : 0;
	for (uint32_t k = 0; k < s->nkeys; k++) {
		skey *key = &s->keys[k];
		if (key->q < 0)
			continue;
		/* Cluster: nothing for another member's keys; and while a
		 * key is learnt (taken over) or we are cut off, no grant
		 * for a replica that has not said what it runs on: it keeps
		 * that allowance, and its next report tells us. */
		const squota *sq = &s->svc->q[key->q];
		if (sq->disowned)
			continue;
		bool hold = st->cl_n > 0 &&
		    (st->cl_cut_off || now < sq->learn_until_ns);
		if (hold && isnan(key->sent_rate))
			continue;
		bool is_short;
		bool changed = grant(st, s->svc, s, key, hold, &is_short);
		s->pending += is_short;
		if (!changed && !all && !key->force_share)
			continue;
		key->force_share = false;
		allot__v1__share__init(&arr[j]);
		arr[j].key = k;
		arr[j].rate = key->sent_rate;
		arr[j].burst = key->sent_burst;
		ptrs[j] = &arr[j];
		j++;
	}
	*ret = j > 0 ? ptrs : NULL;
	*ret_n = j;
	return true;
}

/* A session for `req` with everything copied, built before locking. */
static session *
session_new(const Allot__V1__Register *req)
{
	session *s = calloc(1, sizeof *s);
	if (s == NULL)
		return NULL;
	s->nkeys = (uint32_t) req->n_keys;
	s->replica_id = strdup(req->replica_id);
	s->host = strdup(req->host != NULL ? req->host : "");
	s->agent_version = strdup(
	    req->agent_version != NULL ? req->agent_version : "");
	s->pid = req->pid;
	s->digest = req->config_digest;
	size_t blob = 0;
	for (size_t k = 0; k < req->n_keys; k++)
		blob += strlen(req->keys[k]) + 1;
	s->keys = calloc(req->n_keys ? req->n_keys : 1, sizeof *s->keys);
	s->names = calloc(req->n_keys ? req->n_keys : 1, sizeof *s->names);
	s->names_blob = malloc(blob ? blob : 1);
	if (s->replica_id == NULL || s->host == NULL ||
	    s->agent_version == NULL || s->keys == NULL || s->names == NULL ||
	    s->names_blob == NULL) {
		session_free(s);
		return NULL;
	}
	char *p = s->names_blob;
	for (size_t k = 0; k < req->n_keys; k++) {
		size_t len = strlen(req->keys[k]);
		memcpy(p, req->keys[k], len + 1);
		s->names[k] = p;
		p += len + 1;
		s->keys[k].q = -1;
		s->keys[k].sent_rate = NAN;
		s->keys[k].sent_burst = NAN;
		s->keys[k].may_rate = NAN;
		s->keys[k].may_burst = NAN;
	}
	return s;
}

/* A session registered over one connection is driven over that one
 * only: a Sync or Leave for it arriving on another connection (another
 * peer guessing the sequential id, or the same agent after a reconnect)
 * is answered UNKNOWN_SESSION, which makes a genuine agent register
 * again, and counted apart. Pipe 0 (the simulator, tests) binds nothing. */
static bool
pipe_ok(const session *s, uint32_t pipe)
{
	return s->pipe == 0 || s->pipe == pipe;
}

static Allot__V1__Error__Code
pipe_mismatch(allot__metrics *m, uint64_t id, char *err, size_t errlen)
{
	snprintf(err, errlen,
	    "session %" PRIu64 " belongs to another connection: register "
	    "again",
	    id);
	allot__metrics_reject(m, ALLOT__REJ_SESSION_PIPE, 1);
	return ALLOT__V1__ERROR__CODE__UNKNOWN_SESSION;
}

Allot__V1__Error__Code
allot__state_register_on(allot__state *st, const Allot__V1__Register *req,
    uint32_t pipe, ProtobufCAllocator *pa, Allot__V1__Welcome *ret, char *err,
    size_t errlen)
{
	allot__metrics *m = st->o.metrics;
	if (!name_ok(req->replica_id, ALLOT__STATE_NAME_MAX, true) ||
	    !name_ok(req->service, ALLOT__STATE_NAME_MAX, true) ||
	    !name_ok(req->host, ALLOT__STATE_NAME_MAX, false) ||
	    !name_ok(req->agent_version, ALLOT__STATE_VERSION_MAX, false)) {
		snprintf(err, errlen,
		    "replica_id and service must be 1-%u "
		    "printable ASCII characters (host too, agent_version "
		    "at most %u)",
		    ALLOT__STATE_NAME_MAX, ALLOT__STATE_VERSION_MAX);
		allot__metrics_reject(m, ALLOT__REJ_MALFORMED, 1);
		return ALLOT__V1__ERROR__CODE__MALFORMED;
	}
	for (size_t k = 0; k < req->n_keys; k++) {
		if (!name_ok(req->keys[k], ALLOT__STATE_NAME_MAX, true)) {
			snprintf(err, errlen,
			    "key %zu: a key must be 1-%u "
			    "printable ASCII characters",
			    k, ALLOT__STATE_NAME_MAX);
			allot__metrics_reject(m, ALLOT__REJ_MALFORMED, 1);
			return ALLOT__V1__ERROR__CODE__MALFORMED;
		}
	}
	uint32_t *unknown = pa_alloc(pa, (req->n_keys + 1) * sizeof *unknown);
	session *s = session_new(req);
	if (s == NULL || unknown == NULL) {
		session_free(s);
		snprintf(err, errlen, "out of memory, try again later");
		allot__metrics_reject(m, ALLOT__REJ_CAPACITY, 1);
		return ALLOT__V1__ERROR__CODE__RATE_LIMITED;
	}
	size_t nunknown = 0;
	uint64_t now;
	session *old = NULL;
	Allot__V1__Error__Code code = ALLOT__V1__ERROR__CODE__UNSPECIFIED;
	allot__reject why = ALLOT__REJ_COUNT;
	uint32_t replicas = 0;

	pthread_mutex_lock(&st->mu);
	now = now_ns(st);
	heard(st, now);
	const cfgv *v = st->cur;
	size_t stamp_was = st->stamp_cap;
	if (!grow((void **) &st->stamp, &st->stamp_cap, v->nq,
	        sizeof *st->stamp)) {
		code = ALLOT__V1__ERROR__CODE__RATE_LIMITED;
		why = ALLOT__REJ_CAPACITY;
		snprintf(err, errlen, "out of memory, try again later");
		goto unlock;
	}
	/* realloc leaves the new stamps undefined: one equal to stamp_gen
	 * would call a key listed once "listed twice". */
	memset(st->stamp + stamp_was, 0,
	    (st->stamp_cap - stamp_was) * sizeof *st->stamp);
	if (++st->stamp_gen == 0) {
		memset(st->stamp, 0, st->stamp_cap * sizeof *st->stamp);
		st->stamp_gen = 1;
	}
	for (uint32_t k = 0; k < s->nkeys; k++) {
		int32_t q = cfgv_find(v, s->names[k], strlen(s->names[k]));
		if (q < 0) {
			unknown[nunknown++] = k;
			continue;
		}
		if (st->stamp[q] == st->stamp_gen) {
			code = ALLOT__V1__ERROR__CODE__MALFORMED;
			why = ALLOT__REJ_MALFORMED;
			snprintf(err, errlen, "key %u (%.64s) is listed twice",
			    k, s->names[k]);
			goto unlock;
		}
		st->stamp[q] = st->stamp_gen;
		s->keys[k].q = q;
		s->nknown++;
	}
	bool full = false;
	service *svc = service_get(st, req->service, &full);
	if (svc == NULL) {
		code = ALLOT__V1__ERROR__CODE__RATE_LIMITED;
		why = ALLOT__REJ_CAPACITY;
		snprintf(err, errlen,
		    full ? "too many services (at most %u)" :
		           "out of memory, try again later",
		    st->o.max_services);
		goto unlock;
	}
	for (uint32_t i = 0; i < svc->nsess; i++) {
		if (strcmp(svc->sess[i]->replica_id, s->replica_id) == 0) {
			old = svc->sess[i];
			break;
		}
	}
	if (old == NULL && st->nsessions >= st->o.max_replicas) {
		code = ALLOT__V1__ERROR__CODE__RATE_LIMITED;
		why = ALLOT__REJ_CAPACITY;
		snprintf(err, errlen, "too many replicas (at most %u)",
		    st->o.max_replicas);
		goto unlock;
	}
	bool returning = old != NULL;
	for (uint32_t i = 0; i < svc->nzs && !returning; i++)
		returning = strcmp(svc->zs[i].replica_id, s->replica_id) == 0;
	carry_allowances(st, svc, s, old, now);
	if (old != NULL) {
		inherit(s, old);
		session_unlink(st, old);
	} else {
		conserve_join(svc);
	}
	zombie_forget(svc, s->replica_id);
	if (!service_add(svc, s)) {
		code = ALLOT__V1__ERROR__CODE__RATE_LIMITED;
		why = ALLOT__REJ_CAPACITY;
		snprintf(err, errlen, "out of memory, try again later");
		if (old != NULL && service_add(svc, old)) {
			if (!old->ghost)
				hinsert(st, old);
			st->nsessions++;
			old = NULL;
		}
		goto unlock;
	}
	s->id = st->next_session++;
	s->pipe = pipe;
	s->last_seen_ns = now;
	s->last_sync_ns = now;
	s->expiry_ns = expiry_ns(st, req->sync_interval_ms);
	s->interval_s = (double) (req->sync_interval_ms > 0 &&
	                            req->sync_interval_ms <=
	                                ALLOT__STATE_AGENT_INTERVAL_MAX ?
	                        req->sync_interval_ms :
	                        st->o.interval_ms) /
	    1e3;
	s->joined_wall_ms = allot__wall_ms();
	s->seen_wall_ms = s->joined_wall_ms;
	hinsert(st, s);
	st->nsessions++;
	recompute(st, svc, now);
	replicas = svc->nsess;
	ret->session = s->id;
	ret->replicas = replicas;
	ret->config_epoch = v->epoch;
	ret->config_digest = v->cfg->digest;
	ret->lease_ms = st->o.lease_ms;
	/* A newcomer takes headroom at its Welcome only when it is alone
	 * (placeholders of a restart aside); otherwise it gets its first
	 * grant in its first Reply. In a wave of joins this keeps an early
	 * newcomer from taking a share sized for the smaller replica set,
	 * which it would only give back at its next Sync while the later
	 * ones wait for it: the wave settles in one round, not two. A
	 * replica coming back (replacing its session, or after it expired)
	 * is no newcomer: it gets what the headroom has at once. */
	for (uint32_t i = 0; i < svc->nsess && !st->hold && !returning; i++)
		st->hold = svc->sess[i] != s && !svc->sess[i]->ghost;
	bool built = build_shares(
	    st, s, pa, true, &ret->shares, &ret->n_shares);
	st->hold = false;
	if (!built) {
		/* Welcome without shares: the agent keeps its static split;
		 * the first Reply is full. */
		s->force_full = true;
	}
	s->last_reply_ns = now;
	s->last_replicas = replicas;
	s->sent_gen = svc->gen;
	ret->unknown_keys = unknown;
	ret->n_unknown_keys = nunknown;
	if (st->o.store != NULL) {
		if (old != NULL)
			allot__store_replica_left(
			    st->o.store, old->id, "replaced");
		allot__store_replica_joined(st->o.store, s->id, s->replica_id,
		    svc->name, s->host, s->pid, s->agent_version, s->digest);
	}
unlock:
	pthread_mutex_unlock(&st->mu);
	if (code != ALLOT__V1__ERROR__CODE__UNSPECIFIED) {
		allot__metrics_reject(m, why, 1);
		allot__log_ratelimited(st->o.lg, &st->rl_register,
		    ALLOT_LOG_WARNING, "ALLOTD-REGISTER-FAIL",
		    "replica %s of %s not registered: %s", req->replica_id,
		    req->service, err);
		session_free(s);
		return code;
	}
	if (m != NULL) {
		allot__metrics_add(&m->registers, 1);
		allot__metrics_add(&m->joins, 1);
		allot__metrics_add(&m->register_unknown_keys, nunknown);
		if (old != NULL)
			allot__metrics_add(&m->replaced, 1);
	}
	char detail[160];
	if (old != NULL) {
		allot__log(st->o.lg, ALLOT_LOG_INFO, "ALLOTD-REPLACE",
		    "replica %s of %s registered again: session %" PRIu64
		    " replaces %s session %" PRIu64,
		    s->replica_id, req->service, s->id,
		    old->ghost ? "restored" : "live", old->id);
		if (st->o.store != NULL) {
			snprintf(detail, sizeof detail,
			    "service=%.64s "
			    "session=%" PRIu64 " by=%" PRIu64,
			    req->service, old->id, s->id);
			allot__store_event(
			    st->o.store, "replaced", s->replica_id, detail);
		}
		session_free(old);
	}
	allot__log(st->o.lg, ALLOT_LOG_INFO, "ALLOTD-JOIN",
	    "replica %s of %s joined (host %s pid %u, agent %s): session "
	    "%" PRIu64 ", %u keys, %zu unknown; %u replicas now",
	    s->replica_id, req->service, s->host, s->pid, s->agent_version,
	    s->id, s->nkeys, nunknown, replicas);
	if (nunknown > 0)
		allot__log_ratelimited(st->o.lg, &st->rl_unknown,
		    ALLOT_LOG_WARNING, "ALLOTD-UNKNOWN-KEY",
		    "replica %s of %s named %zu identities without a quota "
		    "(first: %.128s); they stay at the agent's own config",
		    s->replica_id, req->service, nunknown,
		    req->keys[unknown[0]]);
	if (st->o.store != NULL) {
		snprintf(detail, sizeof detail,
		    "service=%.64s session=%" PRIu64
		    " keys=%u unknown=%zu replicas=%u",
		    req->service, s->id, s->nkeys, nunknown, replicas);
		allot__store_event(st->o.store, "join", s->replica_id, detail);
	}
	return ALLOT__V1__ERROR__CODE__UNSPECIFIED;
}

Allot__V1__Error__Code
allot__state_sync_on(allot__state *st, const Allot__V1__Sync *req,
    uint32_t pipe, ProtobufCAllocator *pa, Allot__V1__Reply *ret, char *err,
    size_t errlen)
{
	allot__metrics *m = st->o.metrics;
	uint32_t unknown = 0, absurd = 0;
	uint32_t bad_key = 0;
	const Allot__V1__KeyReport *bad = NULL;
	uint64_t last_seq = 0;

	pthread_mutex_lock(&st->mu);
	uint64_t now = now_ns(st);
	heard(st, now);
	session *s = hfind(st, req->session);
	if (s == NULL) {
		pthread_mutex_unlock(&st->mu);
		snprintf(err, errlen,
		    "unknown session %" PRIu64 ": register again",
		    req->session);
		allot__metrics_reject(m, ALLOT__REJ_UNKNOWN_SESSION, 1);
		return ALLOT__V1__ERROR__CODE__UNKNOWN_SESSION;
	}
	if (!pipe_ok(s, pipe)) {
		pthread_mutex_unlock(&st->mu);
		return pipe_mismatch(m, req->session, err, errlen);
	}
	if (req->seq <= s->last_seq) {
		last_seq = s->last_seq;
		pthread_mutex_unlock(&st->mu);
		snprintf(err, errlen,
		    "seq %" PRIu64 " is not above the last "
		    "accepted seq %" PRIu64 " of session %" PRIu64,
		    req->seq, last_seq, req->session);
		allot__metrics_reject(m, ALLOT__REJ_STALE_SEQ, 1);
		return ALLOT__V1__ERROR__CODE__STALE_SEQ;
	}
	service *svc = s->svc;
	const cfgv *v = st->cur;
	double n = svc->nsess;
	double window_s = (double) since(now, s->last_sync_ns) / 1e9 + 1.0;
	double f = st->o.absurd_factor;
	/* The window the reports cover, for the demand estimates: the
	 * agent's own measure (no network jitter in it) unless it is
	 * missing or beyond what the coordinator saw. */
	double w = (double) req->elapsed_ms / 1e3;
	double wseen = window_s - 1.0;
	if (!(w > 0) || w > wseen + 1.0)
		w = wseen;
	if (w < 1e-3)
		w = 1e-3;
	uint32_t *not_owner = NULL;
	size_t n_not_owner = 0;
	bool forced = false;
	for (size_t i = 0; i < req->n_reports; i++) {
		const Allot__V1__KeyReport *r = req->reports[i];
		if (r->key >= s->nkeys || s->keys[r->key].q < 0) {
			unknown++;
			continue;
		}
		skey *key = &s->keys[r->key];
		int32_t q = key->q;
		if (svc->q[q].disowned) {
			/* Another member's key in our view: no allocation
			 * and no lease for it (Reply.not_owner), but what was
			 * consumed is recorded, so that the members' files
			 * add up to everything the agents report. */
			squota *dq = &svc->q[q];
			double dlim = f * v->rate[q] * n * window_s +
			    v->burst[q];
			if ((double) r->consumed <= dlim &&
			    (double) r->denied <=
			        ALLOT__STATE_FLOOD_FACTOR * dlim) {
				dq->allowed_total += r->consumed;
				dq->denied_total += r->denied;
				dq->win_allowed += r->consumed;
				dq->win_denied += r->denied;
			}
			if (not_owner == NULL)
				not_owner = pa_alloc(
				    pa, req->n_reports * sizeof *not_owner);
			if (not_owner != NULL)
				not_owner[n_not_owner++] = r->key;
			continue;
		}
		if (r->foreign) {
			key->force_share = true;
			forced = true;
			if (isnan(key->sent_rate) &&
			    now < svc->q[q].learn_until_ns)
				adopt(st, svc, s, key, r);
		}
		double rate = v->rate[q], burst = v->burst[q];
		double lim = f * rate * n * window_s + burst;
		if ((double) r->consumed > lim ||
		    (double) r->denied > ALLOT__STATE_FLOOD_FACTOR * lim ||
		    (double) r->demand >
		        ALLOT__STATE_FLOOD_FACTOR * f * rate * n ||
		    (double) r->held > f * burst + 1) {
			if (absurd++ == 0) {
				bad = r;
				bad_key = r->key;
			}
			continue;
		}
		squota *sq = &svc->q[q];
		sq->allowed_total += r->consumed;
		sq->denied_total += r->denied;
		sq->win_allowed += r->consumed;
		sq->win_denied += r->denied;
		level_bring(sq, rate, burst, now);
		sq->level -= (double) r->consumed;
		if (sq->level < 0)
			sq->level = 0;
		est_update(
		    s, key, (double) r->consumed + (double) r->denied, w, now);
		key->consumed += (double) r->consumed;
		key->denied += (double) r->denied;
		key->demand = (double) r->demand;
		key->held = (double) r->held;
	}
	bool gap = req->seq != s->last_seq + 1;
	/* No gap: the agent applied our previous answer, so what it holds
	 * is its grant again, and its lease runs from that answer. */
	if (!gap) {
		s->acked_reply_ns = s->last_reply_ns;
		s->acked_replicas = s->last_replicas;
	}
	if (!gap && s->unacked) {
		for (uint32_t k = 0; k < s->nkeys; k++) {
			skey *key = &s->keys[k];
			double h0 = key->q >= 0 ? key_hold(key) : 0;
			key->may_rate = key->sent_rate;
			key->may_burst = key->sent_burst;
			if (key->q >= 0)
				svc->held_total += key_hold(key) - h0;
		}
		s->unacked = false;
	}
	s->last_seq = req->seq;
	s->last_seen_ns = now;
	s->last_sync_ns = now;
	s->seen_dirty = true;

	ret->seq = req->seq;
	ret->replicas = svc->nsess;
	ret->config_epoch = v->epoch;
	ret->lease_ms = st->o.lease_ms;
	ret->rejected_reports = unknown + absurd;
	ret->not_owner = not_owner;
	ret->n_not_owner = n_not_owner;
	bool full = s->force_full || gap ||
	    ++s->replies_since_full >= st->o.full_every;
	if (full || forced || s->sent_gen != svc->gen || s->pending > 0) {
		if (build_shares(
		        st, s, pa, full, &ret->shares, &ret->n_shares)) {
			ret->full = full;
			if (full) {
				s->replies_since_full = 0;
				s->force_full = false;
			}
			s->sent_gen = svc->gen;
		} else {
			s->force_full = true;
		}
	}
	s->last_reply_ns = now;
	s->last_replicas = svc->nsess;
	pthread_mutex_unlock(&st->mu);

	if (m != NULL) {
		allot__metrics_add(&m->syncs, 1);
		allot__metrics_add(
		    &m->key_reports, req->n_reports - unknown - absurd);
	}
	if (n_not_owner > 0)
		allot__metrics_reject(m, ALLOT__REJ_NOT_OWNER, n_not_owner);
	if (unknown > 0) {
		allot__metrics_reject(m, ALLOT__REJ_UNKNOWN_KEY, unknown);
		allot__log_ratelimited(st->o.lg, &st->rl_unknown,
		    ALLOT_LOG_WARNING, "ALLOTD-UNKNOWN-KEY",
		    "session %" PRIu64 " seq %" PRIu64 ": %u reports for keys "
		    "that are out of range or have no quota were dropped",
		    req->session, req->seq, unknown);
	}
	if (absurd > 0) {
		allot__metrics_reject(m, ALLOT__REJ_ABSURD, absurd);
		allot__log_ratelimited(st->o.lg, &st->rl_absurd,
		    ALLOT_LOG_WARNING, "ALLOTD-ABSURD",
		    "session %" PRIu64 " seq %" PRIu64 ": %u reports with "
		    "impossible numbers dropped (first: key %u consumed "
		    "%" PRIu64 " denied %" PRIu64 " held %" PRIu64
		    " demand %" PRIu64 ")",
		    req->session, req->seq, absurd, bad_key, bad->consumed,
		    bad->denied, bad->held, bad->demand);
	}
	return ALLOT__V1__ERROR__CODE__UNSPECIFIED;
}

/* Agent-supplied free text for a store row: printable, bounded. */
static void
sanitize(char *dst, size_t cap, const char *src)
{
	size_t j = 0;
	for (size_t i = 0; src != NULL && src[i] != '\0' && j + 1 < cap; i++) {
		unsigned char c = (unsigned char) src[i];
		dst[j++] = c >= 0x20 && c < 0x7f ? (char) c : '?';
	}
	dst[j] = '\0';
}

Allot__V1__Error__Code
allot__state_leave_on(allot__state *st, const Allot__V1__Leave *req,
    uint32_t pipe, Allot__V1__Reply *ret, char *err, size_t errlen)
{
	allot__metrics *m = st->o.metrics;
	pthread_mutex_lock(&st->mu);
	uint64_t now = now_ns(st);
	heard(st, now);
	session *s = hfind(st, req->session);
	if (s == NULL) {
		pthread_mutex_unlock(&st->mu);
		snprintf(
		    err, errlen, "unknown session %" PRIu64, req->session);
		allot__metrics_reject(m, ALLOT__REJ_UNKNOWN_SESSION, 1);
		return ALLOT__V1__ERROR__CODE__UNKNOWN_SESSION;
	}
	if (!pipe_ok(s, pipe)) {
		pthread_mutex_unlock(&st->mu);
		return pipe_mismatch(m, req->session, err, errlen);
	}
	service *svc = s->svc;
	conserve_leave(svc, s);
	session_unlink(st, s);
	recompute(st, svc, now);
	uint32_t remaining = svc->nsess;
	ret->seq = 0;
	ret->replicas = remaining;
	ret->config_epoch = st->cur->epoch;
	ret->lease_ms = 0;
	ret->full = true;
	if (st->o.store != NULL)
		allot__store_replica_left(st->o.store, s->id, "leave");
	pthread_mutex_unlock(&st->mu);

	char reason[129];
	sanitize(reason, sizeof reason, req->reason);
	if (m != NULL)
		allot__metrics_add(&m->leaves, 1);
	allot__log(st->o.lg, ALLOT_LOG_INFO, "ALLOTD-LEAVE",
	    "replica %s of %s left (session %" PRIu64 ", reason \"%s\"); %u "
	    "replicas now",
	    s->replica_id, svc->name, s->id, reason, remaining);
	if (st->o.store != NULL) {
		char detail[256];
		snprintf(detail, sizeof detail,
		    "service=%.64s session=%" PRIu64 " replicas=%u reason=%s",
		    svc->name, s->id, remaining, reason);
		allot__store_event(
		    st->o.store, "leave", s->replica_id, detail);
	}
	session_free(s);
	return ALLOT__V1__ERROR__CODE__UNSPECIFIED;
}

/* ------------------------------------------------------------------ */
/* periodic work                                                       */
/* ------------------------------------------------------------------ */

void
allot__state_tick(allot__state *st)
{
	gone *list = NULL;
	size_t n = 0, cap = 0;

	pthread_mutex_lock(&st->mu);
	uint64_t now = now_ns(st);
	uint64_t win = expiry_ns(st, 0);
	/* Nobody heard for K intervals: the coordinator is probably the one
	 * cut off (see heard()), so it expires no one for now. */
	bool quiet = st->last_heard_ns == 0 ||
	    since(now, st->last_heard_ns) > win;
	bool grace = now < st->grace_until_ns;
	for (size_t i = 0; i < st->nsvcs; i++) {
		service *svc = st->svcs[i];
		zombies_expire(svc, now);
		for (uint32_t j = svc->nsess; j-- > 0;) {
			session *s = svc->sess[j];
			if (since(now, s->last_seen_ns) <= s->expiry_ns)
				continue;
			if (!s->ghost &&
			    (quiet || (grace && svc->nsess_silenced >= 2)))
				continue;
			if (!grow((void **) &list, &cap, n + 1, sizeof *list))
				break; /* retried on the next tick */
			conserve_leave(svc, s);
			session_unlink(st, s);
			if (!s->ghost)
				zombie_add(st, svc, s, now);
			list[n++] = (gone) {
				.s = s,
				.why = "expired",
				.silent_ms = since(now, s->last_seen_ns) /
				    1000000u,
			};
			if (st->o.store != NULL)
				allot__store_replica_left(
				    st->o.store, s->id, "expired");
		}
		reserve_expired(st, svc, now);
		learned(st, svc, now);
		/* The demand-aware allocator follows demand every interval;
		 * the static split only changes with the replica set. */
		if (svc->dirty || st->o.policy.kind != ALLOT__ALLOC_STATIC)
			recompute(st, svc, now);
		record_shares(st, svc);
	}
	for (size_t i = 0; i < n; i++)
		list[i].remaining = list[i].s->svc->nsess;
	pthread_mutex_unlock(&st->mu);

	for (size_t i = 0; i < n; i++) {
		session *s = list[i].s;
		if (st->o.metrics != NULL)
			allot__metrics_add(&st->o.metrics->expiries, 1);
		allot__log(st->o.lg, ALLOT_LOG_WARNING, "ALLOTD-EXPIRE",
		    "%sreplica %s of %s expired: session %" PRIu64 " silent "
		    "for %" PRIu64 " ms; %u replicas now",
		    s->ghost ? "restored " : "", s->replica_id, s->svc->name,
		    s->id, list[i].silent_ms, list[i].remaining);
		if (st->o.store != NULL) {
			char detail[160];
			snprintf(detail, sizeof detail,
			    "service=%.64s "
			    "session=%" PRIu64 " silent_ms=%" PRIu64
			    " replicas=%u%s",
			    s->svc->name, s->id, list[i].silent_ms,
			    list[i].remaining, s->ghost ? " restored" : "");
			allot__store_event(
			    st->o.store, "expiry", s->replica_id, detail);
		}
		session_free(s);
	}
	free(list);
}

void
allot__state_second(allot__state *st)
{
	pthread_mutex_lock(&st->mu);
	uint64_t now = now_ns(st);
	double dt = (double) since(now, st->last_second_ns) / 1e9;
	st->last_second_ns = now;
	if (dt <= 0)
		dt = 1e-3;
	const cfgv *v = st->cur;
	allot__store *store = st->o.store;
	for (size_t i = 0; i < st->nsvcs; i++) {
		service *svc = st->svcs[i];
		for (size_t q = 0; q < v->nq; q++) {
			squota *sq = &svc->q[q];
			double R = v->rate[q], B = v->burst[q];
			sq->admitted_rate = (double) sq->win_allowed / dt;
			sq->denied_rate = (double) sq->win_denied / dt;
			sq->utilization = sq->admitted_rate / R;
			/* Consumption was taken off as it was reported. */
			level_bring(sq, R, B, now);
			if (store != NULL &&
			    (sq->win_allowed > 0 || sq->win_denied > 0))
				allot__store_usage(store, svc->name,
				    v->q[q]->identity, sq->win_allowed,
				    sq->win_denied, sq->demand_sum,
				    svc->nsess);
			if (store != NULL &&
			    !(fabs(sq->level - sq->level_recorded) < 1e-6)) {
				allot__store_level(store, svc->name,
				    v->q[q]->identity, sq->level);
				sq->level_recorded = sq->level;
			}
			sq->win_allowed = 0;
			sq->win_denied = 0;
		}
		for (uint32_t j = 0; j < svc->nsess; j++) {
			session *s = svc->sess[j];
			if (!s->seen_dirty)
				continue;
			s->seen_dirty = false;
			s->seen_wall_ms = allot__wall_ms();
			if (store != NULL)
				allot__store_replica_seen(store, s->id);
		}
	}
	pthread_mutex_unlock(&st->mu);
}

/* ------------------------------------------------------------------ */
/* reload                                                              */
/* ------------------------------------------------------------------ */

int
allot__state_reload(allot__state *st, allot_config *cfg, const char *path,
    const char *text, bool *ret_changed)
{
	if (st == NULL || cfg == NULL)
		return ALLOT_EINVAL;
	pthread_mutex_lock(&st->mu);
	uint64_t digest = st->cur->cfg->digest;
	uint64_t epoch = st->cur->epoch;
	pthread_mutex_unlock(&st->mu);
	if (cfg->digest == digest) {
		allot_config_free(cfg);
		if (ret_changed != NULL)
			*ret_changed = false;
		return ALLOT_OK;
	}
	/* Only the loop thread reloads, so the epoch read above stays the
	 * latest while the new view is built outside the lock. */
	cfgv *nv = cfgv_new(cfg, path, epoch + 1);
	if (nv == NULL)
		return ALLOT_ENOMEM;
	squota **nq = NULL;
	size_t nsvcs = 0;
	int rv = ALLOT_OK;
	uint64_t now = now_ns(st);

	pthread_mutex_lock(&st->mu);
	cfgv *ov = st->cur;
	nsvcs = st->nsvcs;
	nq = calloc(nsvcs ? nsvcs : 1, sizeof *nq);
	if (nq == NULL) {
		rv = ALLOT_ENOMEM;
		goto unlock;
	}
	for (size_t i = 0; i < nsvcs; i++) {
		nq[i] = calloc(nv->nq, sizeof **nq);
		if (nq[i] == NULL) {
			rv = ALLOT_ENOMEM;
			goto unlock;
		}
	}
	/* Nothing can fail from here on. */
	for (size_t i = 0; i < st->nsvcs; i++) {
		service *svc = st->svcs[i];
		for (size_t q = 0; q < nv->nq; q++) {
			const char *id = nv->q[q]->identity;
			int32_t oq = cfgv_find(ov, id, strlen(id));
			if (oq >= 0) {
				nq[i][q] = svc->q[oq];
				if (nq[i][q].level > nv->burst[q])
					nq[i][q].level = nv->burst[q];
			} else {
				squota_init(&nq[i][q], nv, q);
			}
		}
		free(svc->q);
		svc->q = nq[i];
		nq[i] = NULL;
		for (uint32_t j = 0; j < svc->nsess; j++) {
			session *s = svc->sess[j];
			s->nknown = 0;
			for (uint32_t k = 0; k < s->nkeys; k++) {
				skey *key = &s->keys[k];
				key->q = cfgv_find(
				    nv, s->names[k], strlen(s->names[k]));
				if (key->q >= 0)
					s->nknown++;
			}
			s->force_full = true;
		}
		/* Expired replicas were counted per quota index of the old
		 * config; a reload forgets them (docs/allocation.md). */
		zombies_clear(svc);
		svc->dirty = true;
	}
	st->cur = nv;
	for (size_t i = 0; i < st->nsvcs; i++) {
		own_quotas(st, st->svcs[i], now);
		recompute(st, st->svcs[i], now);
		st->svcs[i]->gen++;
	}
	record_config(st, nv, text);
	nv = NULL;
unlock:
	pthread_mutex_unlock(&st->mu);
	if (nq != NULL) {
		for (size_t i = 0; i < nsvcs; i++)
			free(nq[i]);
		free(nq);
	}
	if (rv != ALLOT_OK) {
		/* The caller keeps cfg; detach it from the unused view. */
		nv->cfg = NULL;
		cfgv_free(nv);
		return rv;
	}
	cfgv_free(ov);
	if (ret_changed != NULL)
		*ret_changed = true;
	return ALLOT_OK;
}

uint64_t
allot__state_epoch(allot__state *st)
{
	pthread_mutex_lock(&st->mu);
	uint64_t e = st->cur->epoch;
	pthread_mutex_unlock(&st->mu);
	return e;
}

uint64_t
allot__state_digest(allot__state *st)
{
	pthread_mutex_lock(&st->mu);
	uint64_t d = st->cur->cfg->digest;
	pthread_mutex_unlock(&st->mu);
	return d;
}

size_t
allot__state_replicas(allot__state *st)
{
	pthread_mutex_lock(&st->mu);
	size_t n = st->nsessions;
	pthread_mutex_unlock(&st->mu);
	return n;
}

uint32_t
allot__state_service_replicas(allot__state *st, const char *name)
{
	pthread_mutex_lock(&st->mu);
	const struct service *svc = service_find(st, name);
	uint32_t n = svc != NULL ? svc->nsess : 0;
	pthread_mutex_unlock(&st->mu);
	return n;
}

size_t
allot__state_foreach_share(
    allot__state *st, const char *name, allot__state_share_fn fn, void *ctx)
{
	size_t n = 0;
	pthread_mutex_lock(&st->mu);
	const cfgv *v = st->cur;
	const struct service *svc = service_find(st, name);
	uint64_t now = now_ns(st);
	for (uint32_t i = 0; svc != NULL && i < svc->nsess; i++) {
		const session *s = svc->sess[i];
		for (uint32_t k = 0; k < s->nkeys; k++) {
			const skey *key = &s->keys[k];
			if (key->q < 0)
				continue;
			allot__state_share sh = {
				.replica_id = s->replica_id,
				.session = s->id,
				.quota = key->q,
				.identity = v->q[key->q]->identity,
				.restored = s->ghost,
				.fresh = s->ghost || s->last_seq < 2,
				.demand = s->ghost ? 0 : est_read(s, key),
				.target_rate = key->rate,
				.target_burst = key->burst,
				.reply_target_rate = key->reply_target,
				.rate = isnan(key->sent_rate) ? 0 :
				                                key->sent_rate,
				.burst = isnan(key->sent_burst) ?
				    0 :
				    key->sent_burst,
			};
			key_bound(
			    st, s, key, now, &sh.bound_rate, &sh.bound_burst);
			if (fn != NULL)
				fn(ctx, &sh);
			n++;
		}
	}
	pthread_mutex_unlock(&st->mu);
	return n;
}

int
allot__state_quota_get(
    allot__state *st, const char *name, size_t q, allot__state_quota *ret)
{
	int rc = ALLOT_ENOENT;
	pthread_mutex_lock(&st->mu);
	const cfgv *v = st->cur;
	struct service *svc = service_find(st, name);
	if (svc != NULL && q < v->nq) {
		uint64_t now = now_ns(st);
		compute_bounds(st, svc, now);
		squota *sq = &svc->q[q];
		level_bring(sq, v->rate[q], v->burst[q], now);
		*ret = (allot__state_quota) {
			.identity = v->q[q]->identity,
			.rate = v->rate[q],
			.burst = v->burst[q],
			.allowance = sq->allowance,
			.burst_budget = sq->burst_budget,
			.level = sq->level,
			.demand = sq->demand_sum,
			.target_rate = sq->sum_rate,
			.granted_rate = sq->granted_rate,
			.granted_burst = sq->granted_burst,
			.bound_rate = sq->bound_rate,
			.bound_burst = sq->bound_burst,
			.bound_ratio = bound_ratio(
			    sq, v->rate[q], v->burst[q]),
			.holders = sq->nslots,
			.expired_counted = sq->counted_expired,
		};
		rc = ALLOT_OK;
	}
	pthread_mutex_unlock(&st->mu);
	return rc;
}

/* ------------------------------------------------------------------ */
/* rendering                                                           */
/* ------------------------------------------------------------------ */

/* A bound is +Inf when a replica runs an `open` fallback: Prometheus
 * says so, JSON has null. */
static void
put_bound(allot__buf *b, double v, bool json)
{
	if (isinf(v))
		allot__buf_puts(b, json ? "null" : "+Inf");
	else
		allot__buf_num(b, v);
}

static void
sq_labels(
    allot__buf *b, const char *metric, const service *svc, const char *quota)
{
	allot__buf_printf(b, "%s{service=\"", metric);
	allot__buf_label(b, svc->name);
	allot__buf_puts(b, "\",quota=\"");
	allot__buf_label(b, quota);
	allot__buf_puts(b, "\"} ");
}

typedef enum sq_field {
	F_ALLOWED,
	F_DENIED,
	F_UTIL,
	F_ARATE,
	F_ABURST,
	F_LEVEL,
	F_BRATE,
	F_BBURST,
	F_BRATIO,
	F_ALLOWANCE,
	F_BUDGET,
	F_DEMAND,
	F_EXPIRED
} sq_field;

static void
sq_family(allot__state *st, allot__buf *b, const char *name, const char *type,
    const char *help, sq_field f)
{
	const cfgv *v = st->cur;
	allot__buf_printf(
	    b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
	for (size_t i = 0; i < st->nsvcs; i++) {
		const service *svc = st->svcs[i];
		for (size_t q = 0; q < v->nq; q++) {
			const squota *sq = &svc->q[q];
			sq_labels(b, name, svc, v->q[q]->identity);
			switch (f) {
			case F_ALLOWED:
				allot__buf_printf(
				    b, "%" PRIu64 "\n", sq->allowed_total);
				continue;
			case F_DENIED:
				allot__buf_printf(
				    b, "%" PRIu64 "\n", sq->denied_total);
				continue;
			case F_UTIL: allot__buf_num(b, sq->utilization); break;
			case F_ARATE:
				allot__buf_num(b, sq->granted_rate);
				break;
			case F_ABURST:
				allot__buf_num(b, sq->granted_burst);
				break;
			case F_LEVEL: allot__buf_num(b, sq->level); break;
			case F_BRATE:
				put_bound(b, sq->bound_rate, false);
				break;
			case F_BBURST:
				put_bound(b, sq->bound_burst, false);
				break;
			case F_BRATIO:
				put_bound(b,
				    bound_ratio(sq, v->rate[q], v->burst[q]),
				    false);
				break;
			case F_ALLOWANCE:
				allot__buf_num(b, sq->allowance);
				break;
			case F_BUDGET:
				allot__buf_num(b, sq->burst_budget);
				break;
			case F_DEMAND:
				allot__buf_num(b, sq->demand_sum);
				break;
			case F_EXPIRED:
				allot__buf_printf(
				    b, "%u\n", sq->counted_expired);
				continue;
			}
			allot__buf_puts(b, "\n");
		}
	}
}

void
allot__state_render_metrics(allot__state *st, allot__buf *b)
{
	pthread_mutex_lock(&st->mu);
	const cfgv *v = st->cur;
	uint64_t bnow = now_ns(st);
	for (size_t i = 0; i < st->nsvcs; i++)
		compute_bounds(st, st->svcs[i], bnow);
	allot__buf_printf(b,
	    "# HELP allotd_config_epoch Epoch of the quota "
	    "config in force.\n# TYPE allotd_config_epoch gauge\n"
	    "allotd_config_epoch %" PRIu64 "\n",
	    v->epoch);
	allot__buf_printf(b,
	    "# HELP allotd_config_info Digest of the quota "
	    "config in force.\n# TYPE allotd_config_info gauge\n"
	    "allotd_config_info{digest=\"%016" PRIx64 "\",epoch=\"%" PRIu64
	    "\"} 1\n",
	    v->cfg->digest, v->epoch);
	allot__buf_puts(b,
	    "# HELP allotd_replicas Live replicas per service "
	    "(restored ones included).\n# TYPE allotd_replicas gauge\n");
	for (size_t i = 0; i < st->nsvcs; i++) {
		allot__buf_puts(b, "allotd_replicas{service=\"");
		allot__buf_label(b, st->svcs[i]->name);
		allot__buf_printf(b, "\"} %u\n", st->svcs[i]->nsess);
	}
	allot__buf_printf(b,
	    "# HELP allotd_sessions Live sessions, all "
	    "services.\n# TYPE allotd_sessions gauge\nallotd_sessions %zu\n",
	    st->nsessions);
	allot__buf_puts(b,
	    "# HELP allotd_quota_rate Configured rate R per "
	    "quota, tokens/s.\n# TYPE allotd_quota_rate gauge\n");
	for (size_t q = 0; q < v->nq; q++) {
		allot__buf_puts(b, "allotd_quota_rate{quota=\"");
		allot__buf_label(b, v->q[q]->identity);
		allot__buf_puts(b, "\"} ");
		allot__buf_num(b, v->rate[q]);
		allot__buf_puts(b, "\n");
	}
	allot__buf_puts(b,
	    "# HELP allotd_quota_burst Configured burst B per "
	    "quota, tokens.\n# TYPE allotd_quota_burst gauge\n");
	for (size_t q = 0; q < v->nq; q++) {
		allot__buf_puts(b, "allotd_quota_burst{quota=\"");
		allot__buf_label(b, v->q[q]->identity);
		allot__buf_puts(b, "\"} ");
		allot__buf_num(b, v->burst[q]);
		allot__buf_puts(b, "\n");
	}
	sq_family(st, b, "allotd_allowed_tokens_total", "counter",
	    "Tokens admitted, as reported by the agents.", F_ALLOWED);
	sq_family(st, b, "allotd_denied_tokens_total", "counter",
	    "Tokens denied, as reported by the agents.", F_DENIED);
	sq_family(st, b, "allotd_utilization", "gauge",
	    "Admitted tokens over the last second / (R * 1 s).", F_UTIL);
	sq_family(st, b, "allotd_allowance_rate", "gauge",
	    "Sum of the rate shares the replicas hold, tokens/s (<= R).",
	    F_ARATE);
	sq_family(st, b, "allotd_allowance_burst", "gauge",
	    "Sum of the burst shares the replicas hold, tokens (<= B).",
	    F_ABURST);
	sq_family(st, b, "allotd_bucket_level_tokens", "gauge",
	    "Estimated level of the global bucket.", F_LEVEL);
	/* The live bound (docs/allocation.md, "The live bound"). */
	sq_family(st, b, "allotd_allowance_bound_rate", "gauge",
	    "Rate the agents may admit at now, tokens/s: grants, decreases "
	    "not acknowledged yet, fallbacks of lapsed and expired "
	    "replicas.",
	    F_BRATE);
	sq_family(st, b, "allotd_allowance_bound_burst", "gauge",
	    "Tokens the agents' local buckets may hold now (same terms, "
	    "local bursts raised to the largest endpoint weight).",
	    F_BBURST);
	sq_family(st, b, "allotd_overadmission_bound_ratio", "gauge",
	    "max(bound rate / R, bound burst / B): the worst-case "
	    "admission over any window relative to the quota's (1 = "
	    "none above it).",
	    F_BRATIO);
	sq_family(st, b, "allotd_expired_replicas_counted", "gauge",
	    "Expired replicas whose lease or fallback is still counted in "
	    "the bound.",
	    F_EXPIRED);
	sq_family(st, b, "allotd_allocation_rate", "gauge",
	    "The quota's allowance under the global ceiling, tokens/s "
	    "(<= R).",
	    F_ALLOWANCE);
	sq_family(st, b, "allotd_burst_budget_tokens", "gauge",
	    "What the burst shares may sum to: the global bucket's level "
	    "plus one interval of refill (<= B).",
	    F_BUDGET);
	sq_family(st, b, "allotd_demand_rate", "gauge",
	    "Sum of the replicas' demand estimates (admitted + denied "
	    "cost), tokens/s.",
	    F_DEMAND);
	pthread_mutex_unlock(&st->mu);
}

/* The (session, key) pairs of a service grouped by quota, so /status
 * lists each quota's shares in time linear in the number of keys. */
typedef struct share_index {
	uint32_t *start; /* nq + 1 offsets into sess/key */
	uint32_t *sess;
	uint32_t *key;
} share_index;

static void
share_index_free(share_index *x)
{
	free(x->start);
	free(x->sess);
	free(x->key);
}

static bool
share_index_build(share_index *x, const service *svc, size_t nq)
{
	size_t total = 0;
	for (uint32_t j = 0; j < svc->nsess; j++)
		total += svc->sess[j]->nknown;
	x->start = calloc(nq + 2, sizeof *x->start);
	x->sess = malloc((total + 1) * sizeof *x->sess);
	x->key = malloc((total + 1) * sizeof *x->key);
	if (x->start == NULL || x->sess == NULL || x->key == NULL) {
		share_index_free(x);
		return false;
	}
	for (uint32_t j = 0; j < svc->nsess; j++) {
		const session *s = svc->sess[j];
		for (uint32_t k = 0; k < s->nkeys; k++)
			if (s->keys[k].q >= 0)
				x->start[s->keys[k].q + 2]++;
	}
	for (size_t q = 2; q < nq + 2; q++)
		x->start[q] += x->start[q - 1];
	/* start[q + 1] is now the fill cursor of quota q; after the fill
	 * start[q] .. start[q + 1] are quota q's entries. */
	for (uint32_t j = 0; j < svc->nsess; j++) {
		const session *s = svc->sess[j];
		for (uint32_t k = 0; k < s->nkeys; k++) {
			if (s->keys[k].q < 0)
				continue;
			uint32_t e = x->start[s->keys[k].q + 1]++;
			x->sess[e] = j;
			x->key[e] = k;
		}
	}
	return true;
}

void
allot__state_render_status(allot__state *st, allot__buf *b)
{
	int64_t wall = allot__wall_ms();
	/* Taken before st->mu: the store has its own lock. */
	allot__store_stats ss;
	memset(&ss, 0, sizeof ss);
	allot__store_stats_get(st->o.store, &ss);
	pthread_mutex_lock(&st->mu);
	uint64_t now = now_ns(st);
	const cfgv *v = st->cur;
	for (size_t i = 0; i < st->nsvcs; i++)
		compute_bounds(st, st->svcs[i], now);
	allot__buf_printf(b,
	    "{\"version\":\"%s\",\"config\":{\"epoch\":%" PRIu64
	    ",\"digest\":\"%016" PRIx64 "\",\"path\":",
	    ALLOT_VERSION_STRING, v->epoch, v->cfg->digest);
	allot__buf_json(b, v->path);
	allot__buf_printf(b,
	    ",\"loaded_at_ms\":%" PRId64 ",\"quotas\":%zu,"
	    "\"ceiling_rate\":",
	    v->loaded_wall_ms, v->nq);
	allot__buf_num(b, v->cfg->ceiling_rate);
	allot__buf_printf(b,
	    "},\"settings\":{\"lease_ms\":%u,\"interval_ms\":"
	    "%u,\"expiry_intervals\":%u,\"allocator\":\"%s\"},"
	    "\"sessions\":%zu,\"services\":[",
	    st->o.lease_ms, st->o.interval_ms, st->o.expiry_intervals,
	    allot__alloc_name(&st->o.policy), st->nsessions);
	for (size_t i = 0; i < st->nsvcs; i++) {
		const service *svc = st->svcs[i];
		allot__buf_puts(b, i ? ",{\"name\":" : "{\"name\":");
		allot__buf_json(b, svc->name);
		allot__buf_printf(
		    b, ",\"live_replicas\":%u,\"replicas\":[", svc->nsess);
		for (uint32_t j = 0; j < svc->nsess; j++) {
			const session *s = svc->sess[j];
			allot__buf_printf(b,
			    "%s{\"session\":%" PRIu64 ",\"replica_id\":",
			    j ? "," : "", s->id);
			allot__buf_json(b, s->replica_id);
			allot__buf_puts(b, ",\"host\":");
			allot__buf_json(b, s->host != NULL ? s->host : "");
			allot__buf_printf(
			    b, ",\"pid\":%u,\"agent_version\":", s->pid);
			allot__buf_json(b,
			    s->agent_version != NULL ? s->agent_version : "");
			allot__buf_printf(b,
			    ",\"restored\":%s,\"keys\":%u,"
			    "\"unknown_keys\":%u,\"last_seq\":%" PRIu64
			    ",\"last_seen_ms\":%" PRId64
			    ",\"silent_ms\":%" PRIu64 "}",
			    s->ghost ? "true" : "false", s->nkeys,
			    s->nkeys - s->nknown, s->last_seq, s->seen_wall_ms,
			    since(now, s->last_seen_ns) / 1000000u);
		}
		allot__buf_puts(b, "],\"quotas\":[");
		share_index idx;
		if (!share_index_build(&idx, svc, v->nq)) {
			b->oom = true;
			break;
		}
		for (size_t q = 0; q < v->nq; q++) {
			const squota *sq = &svc->q[q];
			allot__buf_puts(b, q ? ",{\"quota\":" : "{\"quota\":");
			allot__buf_json(b, v->q[q]->identity);
			allot__buf_puts(b, ",\"rate\":");
			allot__buf_num(b, v->rate[q]);
			allot__buf_puts(b, ",\"burst\":");
			allot__buf_num(b, v->burst[q]);
			allot__buf_puts(b, ",\"priority\":");
			allot__buf_json(
			    b, priority_name(v, v->q[q]->priority));
			allot__buf_puts(b, ",\"sum_rate\":");
			allot__buf_num(b, sq->granted_rate);
			allot__buf_puts(b, ",\"sum_burst\":");
			allot__buf_num(b, sq->granted_burst);
			allot__buf_puts(b, ",\"target_sum_rate\":");
			allot__buf_num(b, sq->sum_rate);
			allot__buf_puts(b, ",\"target_sum_burst\":");
			allot__buf_num(b, sq->sum_burst);
			allot__buf_puts(b, ",\"allocation_rate\":");
			allot__buf_num(b, sq->allowance);
			allot__buf_puts(b, ",\"burst_budget\":");
			allot__buf_num(b, sq->burst_budget);
			allot__buf_puts(b, ",\"bound_rate\":");
			put_bound(b, sq->bound_rate, true);
			allot__buf_puts(b, ",\"bound_burst\":");
			put_bound(b, sq->bound_burst, true);
			allot__buf_puts(b, ",\"overadmission_bound_ratio\":");
			put_bound(
			    b, bound_ratio(sq, v->rate[q], v->burst[q]), true);
			allot__buf_printf(
			    b, ",\"expired_counted\":%u", sq->counted_expired);
			allot__buf_printf(b,
			    ",\"holders\":%u,"
			    "\"admitted_per_s\":",
			    sq->nslots);
			allot__buf_num(b, sq->admitted_rate);
			allot__buf_puts(b, ",\"denied_per_s\":");
			allot__buf_num(b, sq->denied_rate);
			allot__buf_puts(b, ",\"utilization\":");
			allot__buf_num(b, sq->utilization);
			allot__buf_puts(b, ",\"level\":");
			allot__buf_num(b, sq->level);
			allot__buf_puts(b, ",\"demand\":");
			allot__buf_num(b, sq->demand_sum);
			/* Cluster mode: whether this member owns the quota
			 * now, and learns it (always owned, not learning,
			 * for a single coordinator). */
			allot__buf_printf(b, ",\"owned\":%s,\"learning\":%s",
			    sq->disowned ? "false" : "true",
			    st->cl_n > 0 && !sq->disowned &&
			            now < sq->learn_until_ns ?
			        "true" :
			        "false");
			allot__buf_printf(b,
			    ",\"admitted_total\":%" PRIu64
			    ",\"denied_total\":%" PRIu64 ",\"shares\":[",
			    sq->allowed_total, sq->denied_total);
			for (uint32_t e = idx.start[q]; e < idx.start[q + 1];
			     e++) {
				const session *s = svc->sess[idx.sess[e]];
				const skey *key = &s->keys[idx.key[e]];
				allot__buf_printf(b,
				    "%s{\"session\":%" PRIu64
				    ",\"replica_id\":",
				    e > idx.start[q] ? "," : "", s->id);
				allot__buf_json(b, s->replica_id);
				allot__buf_puts(b, ",\"rate\":");
				allot__buf_num(b,
				    isnan(key->sent_rate) ? 0 :
				                            key->sent_rate);
				allot__buf_puts(b, ",\"burst\":");
				allot__buf_num(b,
				    isnan(key->sent_burst) ? 0 :
				                             key->sent_burst);
				allot__buf_puts(b, ",\"target_rate\":");
				allot__buf_num(b, key->rate);
				allot__buf_puts(b, ",\"target_burst\":");
				allot__buf_num(b, key->burst);
				allot__buf_puts(b, ",\"demand\":");
				allot__buf_num(
				    b, s->ghost ? 0 : est_read(s, key));
				allot__buf_puts(b, "}");
			}
			allot__buf_puts(b, "]}");
		}
		share_index_free(&idx);
		allot__buf_puts(b, "]}");
	}
	/* For allotctl and the dashboard: every configured quota (also
	 * before any service registered), the pid (allotctl reload signals
	 * it) and the store's counters (its health). */
	allot__buf_printf(b, "],\"pid\":%ld,\"quotas\":[", (long) getpid());
	for (size_t q = 0; q < v->nq; q++) {
		allot__buf_puts(b, q ? ",{\"quota\":" : "{\"quota\":");
		allot__buf_json(b, v->q[q]->identity);
		allot__buf_puts(b, ",\"rate\":");
		allot__buf_num(b, v->rate[q]);
		allot__buf_puts(b, ",\"burst\":");
		allot__buf_num(b, v->burst[q]);
		allot__buf_puts(b, ",\"priority\":");
		allot__buf_json(b, priority_name(v, v->q[q]->priority));
		allot__buf_printf(
		    b, ",\"shadow\":%s}", v->q[q]->shadow ? "true" : "false");
	}
	allot__buf_puts(b, "],\"store\":");
	if (st->o.store == NULL)
		allot__buf_puts(b, "null");
	else
		allot__buf_printf(b,
		    "{\"commits\":%" PRIu64 ",\"commit_failures\":%" PRIu64
		    ",\"pending_rows\":%" PRIu64 ",\"rows_written\":%" PRIu64
		    ",\"rows_dropped\":%" PRIu64 ",\"last_error\":%d}",
		    ss.commits, ss.commit_failures, ss.pending,
		    ss.rows_written, ss.rows_dropped, ss.last_error);
	allot__buf_printf(b, ",\"now_ms\":%" PRId64 "}\n", wall);
	pthread_mutex_unlock(&st->mu);
}

/* ------------------------------------------------------------------ */
/* cluster                                                             */
/* ------------------------------------------------------------------ */

void
allot__state_cluster(
    allot__state *st, const uint64_t *hashes, size_t n, size_t self)
{
	pthread_mutex_lock(&st->mu);
	uint64_t now = now_ns(st);
	st->cl_n = n;
	st->cl_self = self;
	for (size_t i = 0; i < n; i++) {
		st->cl_hash[i] = hashes[i];
		st->cl_live[i] = true;
	}
	st->cl_learn_ns = ((uint64_t) st->o.lease_ms +
	                      2u * (uint64_t) st->o.interval_ms) *
	    1000000u;
	st->cl_boot_until_ns = now + st->cl_learn_ns;
	for (size_t i = 0; i < st->nsvcs; i++)
		own_quotas(st, st->svcs[i], now);
	pthread_mutex_unlock(&st->mu);
}

uint32_t
allot__state_view(allot__state *st, const bool *live, bool cut_off)
{
	uint32_t moved = 0;
	pthread_mutex_lock(&st->mu);
	uint64_t now = now_ns(st);
	bool same = st->cl_cut_off == cut_off;
	for (size_t i = 0; i < st->cl_n; i++) {
		same = same && st->cl_live[i] == live[i];
		st->cl_live[i] = live[i];
	}
	st->cl_cut_off = cut_off;
	if (!same)
		for (size_t i = 0; i < st->nsvcs; i++)
			moved += own_quotas(st, st->svcs[i], now);
	pthread_mutex_unlock(&st->mu);
	return moved;
}

void
allot__state_ownership(allot__state *st, allot__state_owned *ret)
{
	memset(ret, 0, sizeof *ret);
	pthread_mutex_lock(&st->mu);
	uint64_t now = now_ns(st);
	for (size_t i = 0; i < st->nsvcs; i++)
		for (size_t q = 0; q < st->cur->nq; q++) {
			const squota *sq = &st->svcs[i]->q[q];
			ret->owned += !sq->disowned;
			ret->learning += !sq->disowned && st->cl_n > 0 &&
			    now < sq->learn_until_ns;
			ret->total++;
		}
	ret->cut_off = st->cl_cut_off;
	pthread_mutex_unlock(&st->mu);
}

Allot__V1__Error__Code
allot__state_register(allot__state *st, const Allot__V1__Register *req,
    ProtobufCAllocator *pa, Allot__V1__Welcome *ret, char *err, size_t errlen)
{
	return allot__state_register_on(st, req, 0, pa, ret, err, errlen);
}

Allot__V1__Error__Code
allot__state_sync(allot__state *st, const Allot__V1__Sync *req,
    ProtobufCAllocator *pa, Allot__V1__Reply *ret, char *err, size_t errlen)
{
	return allot__state_sync_on(st, req, 0, pa, ret, err, errlen);
}

Allot__V1__Error__Code
allot__state_leave(allot__state *st, const Allot__V1__Leave *req,
    Allot__V1__Reply *ret, char *err, size_t errlen)
{
	return allot__state_leave_on(st, req, 0, ret, err, errlen);
}
