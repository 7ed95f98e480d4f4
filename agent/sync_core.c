/* SPDX-License-Identifier: MIT */
/*
 * The agent's sync engine (sync_int.h): report building, reply handling,
 * allowance installation, the lease and fallback state machine (the
 * schedule of exchanges is sync_schedule.c's, the account
 * sync_account.c's). It has no transport and no clock of its own: every
 * entry point takes `now`, so the same code runs over nng in production
 * (sync.c) and over a simulated network on a virtual clock (allot-sim).
 *
 * Failure handling, in order: a failed exchange is retried with capped,
 * full-jitter exponential backoff; the allowances in force stay
 * (fail-static) until their lease expires; then each quota applies its
 * `fallback` (static_share: R / last known replica count, open, closed)
 * until a reply arrives again. Every transition is counted and logged.
 *
 * The config plane (docs/protocol.md): every Sync announces the digest
 * of the config the agent enforces; a Welcome or Reply that carries the
 * coordinator's file is loaded, checked against its digest and installed
 * through the installer's `reconfig`, before the shares of the same
 * message are applied; quotas it appended are named in the next Sync's
 * add_keys; and the text is cached (config_cache.c). A config that fails
 * is backed off per digest. An installer without `reconfig` (the
 * simulator) announces digest 0 and is never sent one.
 */
#include "sync_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "allot.pb-c.h"
#include "config_cache.h"
#include "fallback.h"
#include "tail.h"
#include "values.h"
#include "protocol.h"
#include "sign.h"

typedef allot__syncc syncc;
typedef allot__qsync qsync;

/* The digest of the config the agent enforces; 0 when this engine
 * cannot install one (the simulator): allotd then never sends it. */
static uint64_t
enforced_digest(const syncc *s)
{
	/* While a config that would not install is backed off, say 0 too:
	 * allotd does not send it again until the backoff ends. */
	if (s->in.reconfig == NULL ||
	    (s->bad_digest != 0 && s->sent_ns < s->bad_until_ns))
		return 0;
	return s->a->cfg->digest;
}

static const char *
peer(const syncc *s)
{
	return s->peer != NULL ? s->peer : s->a->coordinator;
}

int
allot__syncc_create(
    syncc *s, allot_agent *a, uint64_t seed, const allot__installer *in)
{
	memset(s, 0, sizeof *s);
	s->a = a;
	s->in = *in;
	s->fail_rl = (allot__logrl) ALLOT__LOGRL_INIT(5, 10000);
	s->rng = seed | 1;
	/* Room for every quota a config may append (quota ids are never
	 * reused): the arrays never move while the agent lives. */
	uint32_t cap = a->quota_cap > 0 ? a->quota_cap : 1;
	s->q = calloc(cap, sizeof *s->q);
	s->seen = calloc(cap, sizeof *s->seen);
	s->was = calloc(3 * (size_t) cap, sizeof *s->was);
	atomic_store(&s->replicas, a->opts.initial_replicas);
	atomic_store(&s->enforced, a->cfg->digest);
	s->acct_rl = (allot__logrl) ALLOT__LOGRL_INIT(1, 60000);
	if (s->q == NULL || s->seen == NULL || s->was == NULL ||
	    allot__acct_init(&s->acct, cap, allot__syncc_acct_seed(a, seed)) !=
	        ALLOT_OK) {
		allot__syncc_fini(s);
		return ALLOT_ENOMEM;
	}
	return ALLOT_OK;
}

void
allot__syncc_fini(syncc *s)
{
	allot__acct_fini(&s->acct);
	free(s->q);
	free(s->seen);
	free(s->was);
	s->q = NULL;
	s->seen = NULL;
	s->was = NULL;
}

static int
pack(Allot__V1__Envelope *env, void **ret_buf, size_t *ret_len)
{
	size_t len = allot__v1__envelope__get_packed_size(env);
	void *buf = malloc(len > 0 ? len : 1);
	if (buf == NULL)
		return ALLOT_ENOMEM;
	allot__v1__envelope__pack(env, buf);
	*ret_buf = buf;
	*ret_len = len;
	return ALLOT_OK;
}

static int
build_register(syncc *s, void **ret_buf, size_t *ret_len)
{
	allot_agent *a = s->a;
	uint32_t n = allot__syncc_nq(s);
	const char **keys = malloc(sizeof *keys * (n > 0 ? n : 1));
	if (keys == NULL)
		return ALLOT_ENOMEM;
	for (uint32_t i = 0; i < n; i++)
		keys[i] = a->quotas[i].name;
	char host[256] = "";
	gethostname(host, sizeof host - 1);

	Allot__V1__Register reg = ALLOT__V1__REGISTER__INIT;
	reg.replica_id = a->replica_id;
	reg.service = a->service;
	reg.host = host;
	reg.pid = (uint32_t) getpid();
	reg.agent_version = (char *) ALLOT_VERSION_STRING;
	reg.config_digest = a->cfg->digest;
	reg.n_keys = n;
	reg.keys = (char **) keys;
	s->nwire = n;
	s->adding = 0;
	reg.sync_interval_ms = a->opts.sync_interval_ms;
	/* The deployment's size, for a service the coordinator has not
	 * seen yet: its first Welcomes are sized for all of them. */
	reg.expected_replicas = a->opts.initial_replicas;
	reg.waits = atomic_load_explicit(&a->waits, memory_order_relaxed);
	reg.incarnation = s->acct.incarnation;
	if (s->signer != NULL && allot__signer_sign(s->signer, &reg) != 0) {
		free(keys);
		return ALLOT_EIO;
	}
	Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
	env.version = ALLOT__PROTOCOL_VERSION;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_REGISTER;
	env.register_ = &reg;
	s->expect = ALLOT__EXPECT_WELCOME;
	int rc = pack(&env, ret_buf, ret_len);
	free(keys);
	return rc;
}

static void install_share(syncc *s, uint32_t key, double rate, double burst);

static int
build_sync(syncc *s, uint64_t now, void **ret_buf, size_t *ret_len)
{
	allot_agent *a = s->a;
	double elapsed = s->last_sync_ns != 0 && now > s->last_sync_ns ?
	    (double) (now - s->last_sync_ns) / 1e9 :
	    0.0;
	uint32_t elapsed_ms = (uint32_t) (elapsed * 1000.0 + 0.5);
	s->last_sync_ns = now;

	int rc = ALLOT_ENOMEM;
	allot__syncc_acct_take(s, now);
	void *umem = NULL;
	allot__value_report *vals = NULL;
	Allot__V1__ValueReport *vm, **vp;
	Allot__V1__Usage **usage = NULL;
	size_t nusage = 0;
	uint32_t nquotas = allot__syncc_nq(s);
	Allot__V1__KeyReport *reps = calloc(nquotas, sizeof *reps);
	Allot__V1__KeyReport **ptrs = calloc(nquotas, sizeof *ptrs);
	/* Quotas a config appended since the session last heard of them:
	 * their wire keys, in id order (Sync.add_keys). */
	uint32_t nadd = nquotas > s->nwire ? nquotas - s->nwire : 0;
	char **add = calloc(nadd > 0 ? nadd : 1, sizeof *add);
	size_t n = 0;
	if (reps == NULL || ptrs == NULL || add == NULL ||
	    allot__acct_wire(&s->acct, ALLOT__ACCT_SEND, &usage, &nusage,
	        &umem) != ALLOT_OK)
		goto out;
	for (uint32_t i = 0; i < nadd; i++)
		add[i] = (char *) a->quotas[s->nwire + i].name;
	for (uint32_t i = 0; i < nquotas; i++) {
		allot__qrt *q = &a->quotas[i];
		qsync *qs = &s->q[i];
		/* The level before the counts: ledger.h. */
		double level = allot__bucket_level(&q->bucket, now);
		allot__ktotals t;
		allot__quota_totals(a, q, &t);
		uint64_t overflow = 0;
		if (allot__quota_waits(a, q))
			overflow = allot__ledger_close(
			    &qs->ledger, q, level, t.spent, now);
		else
			allot__ledger_reset(&qs->ledger);
		/* Totals that went down (a refund, a stacked level's denial
		 * in transit) report nothing until they are back. */
		uint64_t consumed = allot__acct_rise(t.spent, &qs->last_spent);
		uint64_t denied = allot__acct_rise(
		    t.denied_tokens, &qs->last_denied);
		uint64_t shadow = t.shadow_tokens - qs->last_shadow;
		qs->last_shadow = t.shadow_tokens;
		/* Closed or unlimited: this agent's alone to decide, nothing
		 * for allotd to allocate or book (docs/configuration.md). */
		if (atomic_load_explicit(&q->access, memory_order_relaxed) !=
		    ALLOT__ACCESS_LIMITED)
			continue;
		qs->denying = denied > 0;
		if (elapsed > 0) {
			double inst = (double) (consumed + denied) / elapsed;
			qs->demand = 0.5 * qs->demand + 0.5 * inst;
		}
		/* A key whose allowance came from another leader is reported
		 * even when idle: the new leader learns from it what the
		 * old one handed out (docs/operations.md, "Taking over"). */
		bool tail = allot__quota_waits(a, q);
		/* Its callers started to wait for the reserve: the burst it
		 * was sent applies as sent from now on (agent.c), and what
		 * the raise held above it goes back to the reserve. */
		if (tail && !qs->tail_said && qs->has_share &&
		    !atomic_load(&s->in_fallback))
			install_share(s, i, qs->share_rate, qs->share_burst);
		if (consumed == 0 && denied == 0 && shadow == 0 &&
		    qs->returned == 0 && overflow == 0 && !qs->foreign &&
		    tail == qs->tail_said)
			continue;
		qs->tail_said = tail;
		Allot__V1__KeyReport *r = &reps[n];
		allot__v1__key_report__init(r);
		if (qs->foreign) {
			allot__allowance al;
			allot__bucket_get(&q->bucket, &al);
			r->foreign = true;
			r->held_rate = al.mode == ALLOT__MODE_CLOSED ? 0 :
			    al.mode == ALLOT__MODE_OPEN ? q->q->rate :
			                                  al.rate;
			r->held_burst = al.mode == ALLOT__MODE_CLOSED ? 0 :
			    al.mode == ALLOT__MODE_OPEN ? q->q->burst :
			                                  al.burst;
		}
		r->key = q->index;
		r->consumed = consumed;
		r->denied = denied;
		r->shadow_denied = shadow;
		r->returned = qs->returned;
		qs->returned = 0;
		r->overflow = overflow;
		r->tail = tail;
		r->held = level > 0 ? (uint64_t) level : 0;
		r->demand = (uint64_t) ceil(qs->demand);
		ptrs[n++] = r;
	}
	Allot__V1__Sync sy = ALLOT__V1__SYNC__INIT;
	sy.session = s->session;
	sy.seq = ++s->seq;
	sy.elapsed_ms = elapsed_ms;
	sy.n_reports = n;
	sy.reports = ptrs;
	sy.early = s->early;
	sy.config_digest = enforced_digest(s);
	sy.n_add_keys = nadd;
	sy.add_keys = nadd > 0 ? add : NULL;
	sy.n_usage = nusage;
	sy.usage = usage;
	Allot__V1__Stranger sm[ALLOT__STRANGERS_MAX],
	    *sp[ALLOT__STRANGERS_MAX];
	sy.n_strangers = allot__strangers_wire(
	    s->strangers, s->nstrangers, sm, sp);
	sy.strangers = sy.n_strangers > 0 ? sp : NULL;
	s->nstrangers = 0;
	/* Per-value buckets' traffic (values.h), when any are held. */
	if (allot__values_held(a) > 0 &&
	    (vals = malloc(ALLOT__VALUES_PER_SYNC *
	         (sizeof *vals + sizeof *vm + sizeof *vp))) != NULL) {
		vm = (Allot__V1__ValueReport *) (vals +
		    ALLOT__VALUES_PER_SYNC);
		vp = (Allot__V1__ValueReport **) (vm + ALLOT__VALUES_PER_SYNC);
		uint32_t vkey;
		size_t nv = allot__values_take(
		    a, vals, ALLOT__VALUES_PER_SYNC, &vkey);
		sy.n_values = allot__values_wire(vals, nv, vkey, vm, vp);
		sy.values = nv > 0 ? vp : NULL;
	}
	s->adding = nadd;
	if (s->early)
		atomic_fetch_add(&s->early_syncs, 1);
	s->early_sent = s->early;
	s->early = false;
	Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
	env.version = ALLOT__PROTOCOL_VERSION;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_SYNC;
	env.sync = &sy;
	s->sent_reports = (uint32_t) n;
	s->expect = ALLOT__EXPECT_REPLY;
	rc = pack(&env, ret_buf, ret_len);
out:
	free(reps);
	free(ptrs);
	free(add);
	free(umem);
	free(vals);
	return rc;
}

int
allot__syncc_request(syncc *s, uint64_t now, void **ret_buf, size_t *ret_len)
{
	s->sent_ns = now;
	int rc = s->session == 0 ? build_register(s, ret_buf, ret_len) :
	                           build_sync(s, now, ret_buf, ret_len);
	if (rc == ALLOT_OK && s->expect == ALLOT__EXPECT_REPLY)
		s->sent_bytes = *ret_len;
	return rc;
}

int
allot__syncc_leave(syncc *s, void **ret_buf, size_t *ret_len)
{
	if (s->session == 0 || !atomic_load(&s->connected))
		return ALLOT_ESTATE;
	/* Its last decisions go with it. */
	allot__syncc_acct_take(s, allot__agent_now(s->a));
	(void) allot__acct_close(&s->acct);
	Allot__V1__Leave lv = ALLOT__V1__LEAVE__INIT;
	lv.session = s->session;
	lv.reason = (char *) "agent destroyed";
	void *umem = NULL;
	if (allot__acct_wire(&s->acct, ALLOT__ACCT_LEAVE, &lv.usage,
	        &lv.n_usage, &umem) != ALLOT_OK)
		return ALLOT_ENOMEM;
	Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
	env.version = ALLOT__PROTOCOL_VERSION;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_LEAVE;
	env.leave = &lv;
	int rc = pack(&env, ret_buf, ret_len);
	free(umem);
	return rc;
}

/* ---- allowances ---- */

/* Below this a level above the burst is rounding, not a drop. */
#define DROP_EPS 1e-6

/* When its callers wait for a central reserve, what a lower `burst`
 * drops of the `level` a key's bucket holds goes back to the reserve
 * (KeyReport.returned, or AskKey.returned), which is the place for it;
 * it is nowhere until the next Sync says so (the first Welcome closes
 * the bucket the agent started with, a burst moves on). In whole
 * tokens, rounded up while the bucket stays open (`open`) with room
 * below its new burst for the rest of the last one, which it gives up
 * too: rounded down, the part above a whole token was lost at every
 * drop (about a token per replica whose body shrank: 8 of `allot-sim
 * -s onoff --seed 18`'s start-up). The part the bucket still has to
 * give up after the install, or 0. At most the tokens taken while the
 * allowance changes hands are counted twice. */
static double
drop_to(syncc *s, uint32_t key, double level, double burst, bool open)
{
	double x = level - burst;
	if (!(x > DROP_EPS))
		return 0;
	double whole = ceil(x - DROP_EPS), part = whole - x;
	if (!open || part > burst) {
		whole = floor(x);
		part = 0;
	}
	if (whole < 1)
		return 0;
	/* More than it keeps: said after T/8 rather than T. */
	if (x > burst)
		s->returning = true;
	s->q[key].returned += (uint64_t) whole;
	allot__ledger_out(&s->q[key].ledger, whole);
	return part > 0 ? part : 0;
}

/* Install one coordinator allowance. A zero rate is a real answer (the
 * coordinator grants increases only from headroom, so a newcomer may get
 * nothing until others have given back): the bucket then denies, with
 * the sync interval as the retry hint, until the next reply. */
static void
install_share(syncc *s, uint32_t key, double rate, double burst)
{
	allot_agent *a = s->a;
	allot__qrt *q = &a->quotas[key];
	allot__ledger *l = &s->q[key].ledger;
	bool waits = allot__quota_waits(a, q);
	uint64_t now = allot__agent_now(a);
	double level = 0, part = 0;
	if (waits) {
		level = allot__bucket_level(&q->bucket, now);
		/* A closed bucket opens empty: while it was closed its part
		 * of the quota was the reserve's, which may have served it
		 * to anyone since (the reserve moves tokens to it, Share.
		 * prefill, rather than it refilling on its own). */
		allot__allowance cur;
		allot__bucket_get(&q->bucket, &cur);
		bool opens = cur.mode == ALLOT__MODE_CLOSED && rate > 0;
		part = drop_to(s, key, level, burst, rate > 0 && !opens);
		if (level > burst)
			level = burst;
		allot__ledger_rate(l, rate, now);
		if (opens) {
			allot__bucket_empty(&q->bucket, now);
			level = 0;
		}
	} else {
		allot__ledger_reset(l);
	}
	allot__allowance al = {
		.rate = rate,
		.burst = burst,
		.mode = ALLOT__MODE_LIMIT,
		.hint_ns = (uint64_t) a->opts.sync_interval_ms * 1000000u,
	};
	if (!(rate > 0))
		al.mode = ALLOT__MODE_CLOSED;
	/* Its own allowance, when the ceiling cut it (ceiling.c). */
	allot__allowance own = al;
	own.rate = s->q[key].share_own_rate;
	own.burst = s->q[key].share_own_burst;
	bool has_own = rate > 0 && own.rate > 0 && own.burst > 0;
	s->in.install(s->in.ctx, key, &al, has_own ? &own : NULL);
	if (part > 0) {
		allot__bucket_take_part(&q->bucket, part, now);
		level -= part;
	}
	/* What it gave back and has not said so yet is still its own: a
	 * bucket with room takes it back, rather than the reserve receiving
	 * it once the capacity for it has moved here. */
	uint64_t back = s->q[key].returned;
	if (waits && rate > 0 && back > 0 && burst - level >= 1) {
		if ((double) back > burst - level)
			back = (uint64_t) (burst - level);
		allot__bucket_adjust(&q->bucket, -(int64_t) back, now);
		s->q[key].returned -= back;
		allot__ledger_in(l, (double) back);
	}
	s->q[key].share_rate = rate;
	s->q[key].share_burst = burst;
	s->q[key].has_share = true;
	s->q[key].foreign = false;
}

/* A loan (docs/allocation.md, "Loans") or the central reserve's tokens
 * that move with the burst it gave up: `prefill` tokens, a part of one
 * included, added to the key's bucket (its burst, just installed, has
 * room for them), or
 * `debit` tokens lent to another replica taken out of it. A debit the
 * bucket no longer holds (it spent them since its report) leaves it in
 * debt, repaid out of its refill: tokens are moved, never created, so
 * loans add nothing to what the quota admits in the long run. On the
 * sync thread, after the install: acquires see one more change of the
 * bucket's level, as after a take. */
static void
move_tokens(syncc *s, uint32_t key, double prefill, double debit, uint64_t now)
{
	allot__bucket *b = &s->a->quotas[key].bucket;
	const allot__qrt *q = &s->a->quotas[key];
	if (prefill > 0) {
		allot__bucket_deposit(b, prefill, now);
		allot__ceiling_deposit(s->a, q, prefill, now);
		atomic_fetch_add(&s->loan_tokens, (uint64_t) prefill);
		allot__ledger_in(&s->q[key].ledger, prefill);
	}
	if (debit >= 1) {
		allot__bucket_adjust(b, (int64_t) debit, now);
		allot__ceiling_adjust(s->a, q, (int64_t) debit, now);
		atomic_fetch_add(&s->debit_tokens, (uint64_t) debit);
		allot__ledger_out(&s->q[key].ledger, (double) (int64_t) debit);
	}
}

static int
apply_shares(
    syncc *s, Allot__V1__Share **shares, size_t n, bool full, uint64_t now)
{
	allot_agent *a = s->a;
	bool *seen = s->seen;
	memset(seen, 0, sizeof *seen * allot__syncc_nq(s));
	int bad = 0;
	bool members = false;
	for (size_t i = 0; i < n; i++) {
		const Allot__V1__Share *sh = shares[i];
		/* No quota file allows more than ALLOT__RATE_MAX or
		 * ALLOT__BURST_MAX: a share above (or NaN, or negative) is
		 * not an allowance, and would overflow the counters the
		 * next report is built from. */
		if (sh->key >= allot__syncc_nq(s) ||
		    !(sh->rate >= 0 && sh->rate <= ALLOT__RATE_MAX) ||
		    !(sh->burst >= 0 && sh->burst <= ALLOT__BURST_MAX) ||
		    !(sh->prefill >= 0 && sh->prefill <= sh->burst) ||
		    !(sh->debit >= 0 && sh->debit <= ALLOT__BURST_MAX) ||
		    !(sh->standby >= 0 && sh->standby <= ALLOT__RATE_MAX) ||
		    !(sh->own_rate >= 0 && sh->own_rate <= ALLOT__RATE_MAX) ||
		    !(sh->own_burst >= 0 &&
		        sh->own_burst <= ALLOT__BURST_MAX)) {
			bad++;
			continue;
		}
		/* Whether its keys charge the ceiling's level follows. */
		if (atomic_load_explicit(&a->quotas[sh->key].central,
		        memory_order_relaxed) != sh->central)
			members = true;
		atomic_store_explicit(&a->quotas[sh->key].central, sh->central,
		    memory_order_relaxed);
		s->q[sh->key].share_own_rate = sh->own_rate;
		s->q[sh->key].share_own_burst = sh->own_burst;
		atomic_store_explicit(&a->quotas[sh->key].standby_rate,
		    sh->standby, memory_order_relaxed);
		install_share(s, sh->key, sh->rate, sh->burst);
		move_tokens(s, sh->key, sh->prefill, sh->debit, now);
		seen[sh->key] = true;
	}
	/* Coming back from fallback with a partial reply: the keys the
	 * coordinator left out keep their last coordinator allowance. */
	if (!full && atomic_load(&s->in_fallback))
		for (uint32_t k = 0; k < allot__syncc_nq(s); k++)
			if (!seen[k] && s->q[k].has_share)
				install_share(s, k, s->q[k].share_rate,
				    s->q[k].share_burst);
	/* A quota's central reserve came or went (its first Welcome, a
	 * config): whether its keys charge the ceiling's level follows (its
	 * part of the level followed with its share's install). */
	if (members && atomic_load(&a->ceil_on))
		allot__stack_refresh(a);
	if (bad > 0)
		allot__log_ratelimited(&a->log, &s->fail_rl, ALLOT_LOG_WARNING,
		    "ALLOT-SYNC-BADSHARE",
		    "coordinator sent %d invalid shares; ignored", bad);
	return bad;
}

/* A new session starts counting from now. What was consumed since the
 * last report of the previous session (e.g. during a coordinator outage)
 * cannot be checked by the coordinator against any window of its own, so
 * it is not replayed; it is counted in unreported_tokens instead. */
static void
rebaseline(syncc *s)
{
	allot_agent *a = s->a;
	for (uint32_t i = 0; i < allot__syncc_nq(s); i++) {
		allot__ktotals t;
		allot__quota_totals(a, &a->quotas[i], &t);
		qsync *qs = &s->q[i];
		atomic_fetch_add(&s->unreported_tokens,
		    allot__acct_rise(t.spent, &qs->last_spent));
		/* Its denials too, from the highest total seen, as above. */
		(void) allot__acct_rise(t.denied_tokens, &qs->last_denied);
	}
}

/* Key `i`'s fallback allowance over `n` replicas. */
static void
key_fallback(syncc *s, uint32_t i, uint32_t n)
{
	allot_agent *a = s->a;
	allot__ledger_reset(&s->q[i].ledger);
	const allot__quota *q = a->quotas[i].q;
	allot__allowance al;
	/* The agent's: with the ceiling's local share (fallback.h). */
	if (s->in.static_allowance != NULL)
		s->in.static_allowance(s->in.ctx, i, n, true, &al);
	else
		allot__fallback_allowance(q->fallback, q->rate, q->burst, n,
		    a->cfg->max_weight, &al);
	al.hint_ns = (uint64_t) a->opts.reconnect_max_ms * 1000000u;
	s->in.install(s->in.ctx, i, &al, NULL);
}

static uint32_t
fallback_replicas(syncc *s)
{
	uint32_t n = atomic_load(&s->replicas);
	return n == 0 ? s->a->opts.initial_replicas : n;
}

/* Keys whose reports say foreign (allot_sync_stats.keys_unconfirmed). */
static void
count_unconfirmed(syncc *s)
{
	uint32_t n = 0;
	for (uint32_t k = 0; k < allot__syncc_nq(s); k++)
		n += s->q[k].foreign;
	atomic_store(&s->unconfirmed, n);
}

static void
enter_fallback(syncc *s)
{
	allot_agent *a = s->a;
	uint32_t n = fallback_replicas(s);
	/* What each key runs on now is no leader's grant: its reports say
	 * so (foreign), and the leader answers for every one of them. */
	for (uint32_t i = 0; i < allot__syncc_nq(s); i++) {
		key_fallback(s, i, n);
		s->q[i].foreign = true;
	}
	count_unconfirmed(s);
	atomic_store(&s->in_fallback, true);
	atomic_fetch_add(&s->fallback_enters, 1);
	allot__log(&a->log, ALLOT_LOG_WARNING, "ALLOT-FALLBACK-ENTER",
	    "lease expired without a reply from %s: applying each quota's "
	    "fallback (static share over %u replicas where configured)",
	    peer(s), n);
}

static void
leave_fallback(syncc *s)
{
	if (!atomic_load(&s->in_fallback))
		return;
	atomic_store(&s->in_fallback, false);
	atomic_fetch_add(&s->fallback_leaves, 1);
	allot__log(&s->a->log, ALLOT_LOG_NOTICE, "ALLOT-FALLBACK-LEAVE",
	    "coordinator %s answers again: allowances restored", peer(s));
}

static void
set_lease(syncc *s, uint64_t now, uint32_t lease_ms)
{
	s->lease_until_ns = now + (uint64_t) lease_ms * 1000000u;
	s->answered_ns = now;
	atomic_store(
	    &s->lease_until_pub, (int64_t) (s->lease_until_ns / 1000000u));
}

/* ---- the config plane ---- */

/* A config that failed to install is not taken again for this long,
 * doubling up to CONFIG_BACKOFF_MAX_MS: meanwhile the Syncs announce
 * digest 0, so allotd does not send it again (docs/protocol.md). */
#define CONFIG_BACKOFF_MIN_MS 30000u
#define CONFIG_BACKOFF_MAX_MS 600000u

static void
config_refused(syncc *s, uint64_t now, uint64_t digest)
{
	atomic_fetch_add(&s->config_rejects, 1);
	if (s->bad_digest != digest)
		s->bad_backoff_ms = 0;
	uint32_t b = s->bad_backoff_ms == 0 ? CONFIG_BACKOFF_MIN_MS :
	                                      s->bad_backoff_ms * 2;
	s->bad_backoff_ms = b > CONFIG_BACKOFF_MAX_MS ? CONFIG_BACKOFF_MAX_MS :
	                                                b;
	s->bad_digest = digest;
	s->bad_until_ns = now + (uint64_t) s->bad_backoff_ms * 1000000u;
}

/* Each quota's rate, burst and fallback before a reconfig, to find the
 * ones whose allowance must be installed again. */
static void
config_remember(syncc *s, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		const allot__quota *q = s->a->quotas[i].q;
		s->was[3 * i] = q->rate;
		s->was[3 * i + 1] = q->burst;
		s->was[3 * i + 2] = (double) q->fallback;
	}
}

static bool
config_changed(const syncc *s, uint32_t i, uint32_t before)
{
	const allot__quota *q = s->a->quotas[i].q;
	return i >= before || s->was[3 * i] != q->rate ||
	    s->was[3 * i + 1] != q->burst ||
	    s->was[3 * i + 2] != (double) q->fallback;
}

/* Parse, check and install the coordinator's config `text` announced
 * as `digest` (Welcome.config or Reply.config). Returns the number of
 * quotas before the install (the new ones follow), or UINT32_MAX when
 * nothing was installed. Failures are logged, counted and backed off
 * per digest. */
static uint32_t
config_take(
    syncc *s, uint64_t now, uint64_t digest, const ProtobufCBinaryData *text)
{
	allot_agent *a = s->a;
	if (s->in.reconfig == NULL || text->len == 0 ||
	    digest == a->cfg->digest ||
	    (digest == s->bad_digest && now < s->bad_until_ns))
		return UINT32_MAX;
	char err[512];
	allot_config *cfg = NULL, *view = NULL;
	if (allot_config_parse("coordinator config", (const char *) text->data,
	        text->len, err, sizeof err, &cfg) != ALLOT_OK) {
		allot__log(&a->log, ALLOT_LOG_ERR, "ALLOT-CONFIG-REJECT",
		    "config from %s (digest %016llx) does not load: %s; "
		    "keeping digest %016llx",
		    peer(s), (unsigned long long) digest, err,
		    (unsigned long long) a->cfg->digest);
		config_refused(s, now, digest);
		return UINT32_MAX;
	}
	if (cfg->digest != digest) {
		allot__log(&a->log, ALLOT_LOG_ERR, "ALLOT-CONFIG-DIGEST",
		    "config from %s announced as digest %016llx loads as "
		    "%016llx: refused, keeping digest %016llx",
		    peer(s), (unsigned long long) digest,
		    (unsigned long long) cfg->digest,
		    (unsigned long long) a->cfg->digest);
		allot_config_free(cfg);
		config_refused(s, now, digest);
		return UINT32_MAX;
	}
	int rc = allot__config_select(cfg, a->service, &view);
	uint32_t before = allot__syncc_nq(s);
	config_remember(s, before);
	if (rc == ALLOT_OK)
		rc = s->in.reconfig(s->in.ctx, view);
	if (rc != ALLOT_OK) {
		allot__log(&a->log, ALLOT_LOG_ERR, "ALLOT-CONFIG-REJECT",
		    "config from %s (digest %016llx) not installed: %s; "
		    "keeping digest %016llx, not taking it again for %u s",
		    peer(s), (unsigned long long) digest, allot_strerror(rc),
		    (unsigned long long) a->cfg->digest,
		    (s->bad_digest == digest && s->bad_backoff_ms > 0 ?
		            2 * s->bad_backoff_ms :
		            CONFIG_BACKOFF_MIN_MS) /
		        1000u);
		allot_config_free(view);
		allot_config_free(cfg);
		config_refused(s, now, digest);
		return UINT32_MAX;
	}
	allot_config_free(cfg); /* the agent owns `view` now */
	s->bad_digest = 0;
	s->bad_backoff_ms = 0;
	s->reconfigured = true;
	/* Keys may have moved between quotas: every count starts again. */
	for (uint32_t i = 0; i < allot__syncc_nq(s); i++)
		allot__ledger_reset(&s->q[i].ledger);
	atomic_store(&s->enforced, digest);
	atomic_fetch_add(&s->config_installs, 1);
	allot__log(&a->log, ALLOT_LOG_NOTICE, "ALLOT-CONFIG-INSTALL",
	    "installed the config of %s (digest %016llx, %zu bytes): %u "
	    "quotas, %u of them new",
	    peer(s), (unsigned long long) digest, text->len,
	    allot__syncc_nq(s), allot__syncc_nq(s) - before);
	if (s->cache_path != NULL)
		(void) allot__config_cache_write(s->cache_path, a->coordinator,
		    digest, text->data, text->len, &a->log);
	return before;
}

/* After a config was installed and the shares of the same message
 * applied: every quota whose values changed, or that is new, and got no
 * share in it runs on what it should now: its fallback when the session
 * (or the key) is in fallback, the coordinator's last share (installed
 * again: its burst may be above the new one) when it has one, else its
 * static share. */
static void
config_settle(syncc *s, uint32_t before)
{
	uint32_t n = fallback_replicas(s);
	for (uint32_t i = 0; i < allot__syncc_nq(s); i++) {
		qsync *qs = &s->q[i];
		if (s->seen[i] || !config_changed(s, i, before))
			continue;
		if (atomic_load(&s->in_fallback)) {
			key_fallback(s, i, n);
		} else if (qs->has_share && i < before) {
			install_share(s, i, qs->share_rate, qs->share_burst);
		} else if (s->in.static_allowance != NULL) {
			allot__allowance al;
			s->in.static_allowance(s->in.ctx, i, n, false, &al);
			allot__ledger_reset(&qs->ledger);
			al.hint_ns = (uint64_t) s->a->opts.sync_interval_ms *
			    1000000u;
			s->in.install(s->in.ctx, i, &al, NULL);
		}
	}
}

bool
allot__syncc_take_reconfigured(syncc *s)
{
	bool r = s->reconfigured;
	s->reconfigured = false;
	return r;
}

/* ---- replies ---- */

void
allot__syncc_failed(syncc *s, uint64_t now, const char *why)
{
	(void) now;
	allot_agent *a = s->a;
	atomic_fetch_add(&s->syncs_failed, 1);
	/* Skip a sequence number after a lost exchange: the coordinator
	 * answers a gap with a full Reply, so no allowance change it sent
	 * in the lost reply stays unknown. */
	if (s->session != 0 && s->expect == ALLOT__EXPECT_REPLY)
		s->seq++;
	/* Whether allotd appended the keys of a lost Sync is unknown, and
	 * sending them again would name them twice: register again, with
	 * every key. */
	if (s->adding > 0 && s->expect == ALLOT__EXPECT_REPLY)
		s->session = 0;
	s->adding = 0;
	if (atomic_exchange(&s->connected, false))
		allot__log(&a->log, ALLOT_LOG_WARNING, "ALLOT-SYNC-LOST",
		    "lost the coordinator %s: %s; keeping current "
		    "allowances until the lease expires",
		    peer(s), why);
	else
		allot__log_ratelimited(&a->log, &s->fail_rl, ALLOT_LOG_WARNING,
		    "ALLOT-SYNC-FAIL", "exchange with %s failed: %s", peer(s),
		    why);
	uint32_t max = a->opts.reconnect_max_ms;
	uint32_t next = s->backoff_ms == 0 ? a->opts.reconnect_min_ms :
	                                     s->backoff_ms * 2;
	s->backoff_ms = next > max ? max : next;
}

/* A Welcome: the new session, the coordinator's config when it sent
 * one, the first shares and the lease. */
static void
apply_welcome(syncc *s, uint64_t now, const Allot__V1__Welcome *w)
{
	allot_agent *a = s->a;
	rebaseline(s);
	s->session = w->session;
	s->seq = 0;
	s->applied_seq = 0;
	allot__acct_durable(&s->acct, w->durable);
	s->last_sync_ns = now;
	atomic_store(&s->session_pub, w->session);
	atomic_store(&s->replicas, w->replicas);
	atomic_store(&s->epoch, w->config_epoch);
	atomic_store(&s->digest, w->config_digest);
	atomic_fetch_add(&s->unknown_keys, w->n_unknown_keys);
	atomic_fetch_add(&s->registers, 1);
	if (w->n_unknown_keys > 0)
		allot__log(&a->log, ALLOT_LOG_WARNING,
		    "ALLOT-SYNC-UNKNOWN-KEYS",
		    "coordinator has no quota for %zu of our %u "
		    "quotas; they keep their local allowance",
		    w->n_unknown_keys, allot__syncc_nq(s));
	uint32_t before = config_take(s, now, w->config_digest, &w->config);
	if (w->config_digest != a->cfg->digest)
		allot__log(&a->log, ALLOT_LOG_NOTICE,
		    "ALLOT-SYNC-CONFIG-DIFFERS",
		    "coordinator quota config (digest %016llx) "
		    "differs from ours (%016llx)%s; the "
		    "coordinator's allowances win",
		    (unsigned long long) w->config_digest,
		    (unsigned long long) a->cfg->digest,
		    w->config.len > 0 ?
		        "" :
		        " and it did not send it (too large, or we "
		        "do not take configs)");
	if (a->tail != NULL)
		allot__tail_welcomed(a->tail, w->session, w->epoch,
		    (uint64_t) w->lease_ms * 1000000u, now);
	apply_shares(s, w->shares, w->n_shares, true, now);
	if (before != UINT32_MAX)
		config_settle(s, before);
	/* Ask again after half an interval: a Welcome may not have
	 * granted every key yet (the others had not given back), and our
	 * demand is unknown to the coordinator until our first Sync (we
	 * claim the others' average until our second), so the sooner it
	 * comes, the sooner our share follows our traffic. It also spreads
	 * the phases of replicas that registered together over the
	 * interval instead of lining them up on the coordinator's tick. */
	s->welcomed = true;
	set_lease(s, now, w->lease_ms);
}

/* Hand the member list an answer carried to the driver. */
static void
learn(syncc *s, char *const *urls, size_t n)
{
	if (s->learn != NULL && n > 0)
		s->learn(s->learn_ctx, urls, n);
}

/* Fencing: a Welcome or Reply whose epoch is below the highest seen
 * comes from a deposed leader (one stopped, then continued, say) whose
 * grants the new leader no longer counts: it is dropped before anything
 * in it is installed, and counted. Epoch 0 is a single allotd's; an
 * agent that only ever talks to one never sees another, so nothing is
 * fenced there. */
static bool
stale(syncc *s, const Allot__V1__Envelope *env)
{
	uint64_t e;
	if (env->body_case == ALLOT__V1__ENVELOPE__BODY_WELCOME)
		e = env->welcome->epoch;
	else if (env->body_case == ALLOT__V1__ENVELOPE__BODY_REPLY)
		e = env->reply->epoch;
	else
		return false;
	if (e >= s->epoch_seen) {
		/* A new epoch: a new leader, perhaps on the member we
		 * already talk to (restarted, and elected again). What we
		 * run on is the old leader's grant: say so (foreign). */
		if (e > s->epoch_seen && s->epoch_seen != 0)
			for (uint32_t k = 0; k < allot__syncc_nq(s); k++)
				s->q[k].foreign = true;
		s->epoch_seen = e;
		atomic_store(&s->epoch_pub, e);
		return false;
	}
	atomic_fetch_add(&s->stale_epoch_n, 1);
	allot__log_ratelimited(&s->a->log, &s->fail_rl, ALLOT_LOG_WARNING,
	    "ALLOT-SYNC-STALE-EPOCH",
	    "%s answered with epoch %llu, below the %llu already seen "
	    "(a deposed leader): dropped unapplied, trying another member",
	    peer(s), (unsigned long long) e,
	    (unsigned long long) s->epoch_seen);
	return true;
}

allot__route
allot__syncc_take_route(syncc *s)
{
	allot__route r = s->route;
	s->route = ALLOT__ROUTE_STAY;
	return r;
}

/* Returns true when the exchange succeeded. */
bool
allot__syncc_reply(syncc *s, uint64_t now, const void *buf, size_t len)
{
	allot_agent *a = s->a;
	Allot__V1__Envelope *env = allot__v1__envelope__unpack(NULL, len, buf);
	if (env == NULL) {
		allot__syncc_failed(s, now, "undecodable reply");
		return false;
	}
	bool ok = false;
	atomic_store(&s->last_rtt_us, (now - s->sent_ns) / 1000u);
	if (env->version != ALLOT__PROTOCOL_VERSION) {
		allot__syncc_failed(
		    s, now, "reply with an unsupported protocol version");
		goto out;
	}
	if (env->body_case == ALLOT__V1__ENVELOPE__BODY_ERROR) {
		atomic_fetch_add(&s->errors_received, 1);
		const Allot__V1__Error *e = env->error;
		if (e->code == ALLOT__V1__ERROR__CODE__UNKNOWN_SESSION ||
		    e->code == ALLOT__V1__ERROR__CODE__STALE_SEQ) {
			/* The coordinator restarted or lost us: register
			 * again; local buckets are untouched. */
			allot__log(&a->log, ALLOT_LOG_NOTICE,
			    "ALLOT-SYNC-REREGISTER",
			    "coordinator says: %s; registering again",
			    e->message);
			s->session = 0;
			ok = true; /* the coordinator is alive */
			s->backoff_ms = 0;
			goto out;
		}
		if (e->code == ALLOT__V1__ERROR__CODE__NOT_LEADER) {
			/* A follower, or a leader whose lease does not
			 * hold yet: nothing was applied or booked. Go to
			 * the leader it names, else to another member;
			 * the allowances in force keep their lease. */
			atomic_fetch_add(&s->not_leader_n, 1);
			learn(s, e->members, e->n_members);
			if (e->leader != NULL && e->leader[0] != '\0' &&
			    strlen(e->leader) < sizeof s->leader) {
				strcpy(s->leader, e->leader);
				s->route = ALLOT__ROUTE_LEADER;
			} else {
				s->route = ALLOT__ROUTE_NEXT;
			}
			if (s->session != 0 &&
			    s->expect == ALLOT__EXPECT_REPLY)
				s->seq++;
			goto out;
		}
		if (e->code == ALLOT__V1__ERROR__CODE__RATE_LIMITED) {
			/* Alive, but this host sends more than its budget
			 * (docs/protocol.md): not a lost coordinator, and
			 * in a cluster not a member down. Nothing was
			 * applied; back off as after a failure. */
			atomic_fetch_add(&s->throttled_n, 1);
			allot__log_ratelimited(&a->log, &s->fail_rl,
			    ALLOT_LOG_WARNING, "ALLOT-SYNC-THROTTLED",
			    "coordinator %s is rate limiting this host: %s; "
			    "backing off, allowances unchanged",
			    peer(s), e->message);
			if (s->session != 0 &&
			    s->expect == ALLOT__EXPECT_REPLY)
				s->seq++;
			uint32_t max = a->opts.reconnect_max_ms;
			uint32_t next = s->backoff_ms == 0 ?
			    a->opts.reconnect_min_ms :
			    s->backoff_ms * 2;
			s->backoff_ms = next > max ? max : next;
			s->throttled = true;
			ok = true;
			goto out;
		}
		allot__syncc_failed(s, now,
		    e->message != NULL && e->message[0] != '\0' ?
		        e->message :
		        "error reply");
		goto out;
	}
	if (stale(s, env)) {
		if (s->session != 0 && s->expect == ALLOT__EXPECT_REPLY)
			s->seq++;
		s->route = ALLOT__ROUTE_NEXT;
		goto out;
	}
	if (s->expect == ALLOT__EXPECT_WELCOME &&
	    env->body_case == ALLOT__V1__ENVELOPE__BODY_WELCOME) {
		apply_welcome(s, now, env->welcome);
		learn(s, env->welcome->members, env->welcome->n_members);
		ok = true;
	} else if (s->expect == ALLOT__EXPECT_REPLY &&
	    env->body_case == ALLOT__V1__ENVELOPE__BODY_REPLY) {
		const Allot__V1__Reply *r = env->reply;
		if (r->seq != s->seq) {
			allot__syncc_failed(
			    s, now, "reply to another request");
			goto out;
		}
		atomic_store(&s->replicas, r->replicas);
		atomic_store(&s->epoch, r->config_epoch);
		if (r->config_digest != 0)
			atomic_store(&s->digest, r->config_digest);
		s->nwire += s->adding;
		s->adding = 0;
		uint32_t before = config_take(
		    s, now, r->config_digest, &r->config);
		apply_shares(s, r->shares, r->n_shares, r->full, now);
		allot__values_install(s->a, r->values, r->n_values);
		if (before != UINT32_MAX)
			config_settle(s, before);
		set_lease(s, now, r->lease_ms);
		learn(s, r->members, r->n_members);
		allot__acct_durable(&s->acct, r->durable);
		s->applied_seq = r->seq;
		atomic_fetch_add(&s->syncs_ok, 1);
		atomic_fetch_add(&s->reports_sent, s->sent_reports);
		atomic_fetch_add(&s->bytes_sent, s->sent_bytes);
		ok = true;
	} else {
		allot__syncc_failed(s, now, "unexpected message type");
		goto out;
	}
	if (!atomic_exchange(&s->connected, true))
		allot__log(&a->log, ALLOT_LOG_INFO, "ALLOT-SYNC-CONNECTED",
		    "synced with %s: session %llu, %u live replicas", peer(s),
		    (unsigned long long) s->session,
		    atomic_load(&s->replicas));
	leave_fallback(s);
	s->backoff_ms = 0;
	count_unconfirmed(s);
out:
	allot__v1__envelope__free_unpacked(env, NULL);
	return ok;
}

/* ---- schedule ---- */

void
allot__syncc_moved(syncc *s)
{
	for (uint32_t k = 0; k < allot__syncc_nq(s); k++)
		s->q[k].foreign = true;
	count_unconfirmed(s);
}

void
allot__syncc_check_lease(syncc *s, uint64_t now)
{
	if (s->lease_until_ns == 0 || atomic_load(&s->in_fallback))
		return;
	if (now >= s->lease_until_ns)
		enter_fallback(s);
}
