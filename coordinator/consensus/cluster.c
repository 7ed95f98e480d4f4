/* SPDX-License-Identifier: MIT */
/*
 * This allotd's part in the Raft cluster (cluster.h): the consensus core
 * on the loop, the view agents are told (published for nng's threads),
 * the fencing gate, taking over and stepping down, the config and the
 * usage rows through the log, the committed entries into the store, and
 * membership changes for the admin socket.
 *
 * A timer (every ALLOT__CLUSTER_POLL_MS) does the loop-side work: it
 * publishes a new view when the epoch, the leader or the members
 * changed, and moves this member between serving and not serving. Views
 * are never freed before the stop, so a reader on another thread may
 * hold one as long as it likes; they change only with leadership and
 * membership, so the list stays short.
 */
#include "cluster.h"
#include "backlog.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>

#include "buf.h"
#include "consensus_addr.h"

#define POLL_MS 10u
/* The store backlog's retries (backlog.h). */
#define RETRY_MS 200u
#define MAX_MEMBERS 64u

typedef struct pub {
	allot__cluster_view v;
	struct pub *next; /* every view published, freed at the stop */
	char *sig; /* what it was built from, to tell a change */
	char *strs[MAX_MEMBERS + 1];
} pub;

struct allot__cluster {
	uv_loop_t *loop;
	allot__consensus *cons;
	uv_timer_t timer;
	allot__cluster_opts o;
	char *self_addr; /* RAFT_ADDR|AGENT_URL */
	_Atomic(pub *) view;
	pub *all;
	atomic_bool serving;
	atomic_bool leader;
	_Atomic uint64_t applied;
	_Atomic uint64_t usage_batches;
	_Atomic uint64_t usage_lost; /* rows the leader could not propose */
	_Atomic uint64_t takeovers;
	_Atomic uint64_t config_epoch;
	/* Committed entries this member's file could not take yet
	 * (backlog.h), and the last index it holds. */
	allot__backlog backlog;
	uint64_t behind_since; /* uv_now + 1 when the backlog began; 0 */
	uint64_t handed_over_at; /* uv_now of the last hand-over asked */
	uint64_t retry_at; /* uv_now of the backlog's next try */
	_Atomic uint64_t backlog_n;
	_Atomic uint64_t backlog_lost;
	_Atomic uint64_t store_applied;
	/* The latest committed CONFIG not installed yet: installed by the
	 * next timer tick, so that a replay of the log at start installs
	 * only the last of its configs (no audit rows for the others). */
	struct pending_config *pending;
	/* This leader's last config proposal: its config epoch and the
	 * leader epoch it was made in (0: none). The next proposal of the
	 * same leadership chains on it (its epoch + 1), so that a change
	 * proposed while another is uncommitted (the new cluster's first
	 * config, a change applied right behind another) follows it
	 * instead of losing the compare-and-set to it. */
	uint64_t proposed_epoch;
	uint64_t proposed_in;
	uint64_t proposed_digest;
	unsigned closing;
};

/* A committed CONFIG, copied out of the log entry: one block, the
 * strings after the struct. */
struct pending_config {
	size_t len;
	uint64_t epoch;
	allot__state_who who;
	char *text;
};

/* A copy of a string into `*at`, advancing it; NULL for "". */
static const char *
copy_opt(char **at, const char *s)
{
	if (s == NULL || s[0] == '\0')
		return NULL;
	size_t n = strlen(s) + 1;
	char *d = memcpy(*at, s, n);
	*at += n;
	return d;
}

static struct pending_config *
pending_copy(const allot__centry *e)
{
	const allot__cwho *w = &e->config.who;
	const char *s[4] = { w->who, w->claimed_as, w->reason, w->source };
	size_t n = sizeof(struct pending_config) + e->config.text_len + 1;
	for (size_t i = 0; i < 4; i++)
		n += s[i] != NULL ? strlen(s[i]) + 1 : 0;
	struct pending_config *p = malloc(n);
	if (p == NULL)
		return NULL;
	char *at = (char *) (p + 1);
	p->len = e->config.text_len;
	p->epoch = e->config.config_epoch;
	p->text = memcpy(at, e->config.text, p->len);
	p->text[p->len] = '\0';
	at += p->len + 1;
	/* A CONFIG without a proposer (none recorded) is the cluster's. */
	p->who.who = copy_opt(&at, w->who);
	if (p->who.who == NULL)
		p->who.who = "cluster";
	p->who.claimed_as = copy_opt(&at, w->claimed_as);
	p->who.reason = copy_opt(&at, w->reason);
	if (p->who.reason == NULL)
		p->who.reason = "committed through the log";
	p->who.source = copy_opt(&at, w->source);
	return p;
}

/* ---- the view ---- */

static void
pub_free(pub *p)
{
	for (size_t i = 0; i <= MAX_MEMBERS; i++)
		free(p->strs[i]);
	free(p->v.members);
	free(p->sig);
	free(p);
}

/* The agent URL of a member address, copied; NULL when it has none. */
static char *
url_of(const char *addr)
{
	char raft[ALLOT__CNODE_ADDR_MAX];
	const char *url;
	if (addr == NULL ||
	    !allot__caddr_split(addr, raft, sizeof raft, &url) ||
	    url[0] == '\0')
		return NULL;
	return strdup(url);
}

/* Publish a new view if anything agents are told changed. */
static void
publish(allot__cluster *c)
{
	allot__cmember m[MAX_MEMBERS];
	size_t n = allot__consensus_members(c->cons, m, MAX_MEMBERS);
	uint64_t lid = 0;
	const char *laddr = NULL;
	bool known = allot__consensus_leader(c->cons, &lid, &laddr);
	/* A follower learns the leader's address from the connection's
	 * handshake, without the agent URL: take the configuration's. */
	for (size_t i = 0; known && i < n; i++)
		if (m[i].id == lid)
			laddr = m[i].address;
	uint64_t epoch = allot__consensus_epoch(c->cons);
	allot__buf sig = { 0 };
	allot__buf_printf(&sig, "%" PRIu64 "|%s", epoch,
	    known && laddr != NULL ? laddr : "");
	for (size_t i = 0; i < n; i++)
		allot__buf_printf(&sig, "|%s", m[i].address);
	pub *cur = atomic_load(&c->view);
	if (sig.p != NULL && cur != NULL && cur->sig != NULL &&
	    strcmp(cur->sig, sig.p) == 0) {
		allot__buf_free(&sig);
		return;
	}
	pub *p = calloc(1, sizeof *p);
	if (p == NULL ||
	    (p->v.members = calloc(n + 1, sizeof *p->v.members)) == NULL) {
		free(p);
		allot__buf_free(&sig);
		return; /* keep the old view; the next poll retries */
	}
	p->sig = sig.p; /* the buffer's memory is ours now */
	p->v.epoch = epoch;
	p->strs[0] = known ? url_of(laddr) : NULL;
	p->v.leader = p->strs[0];
	for (size_t i = 0; i < n; i++) {
		p->strs[i + 1] = url_of(m[i].address);
		if (p->strs[i + 1] != NULL)
			p->v.members[p->v.nmembers++] = p->strs[i + 1];
	}
	p->next = c->all;
	c->all = p;
	atomic_store_explicit(&c->view, p, memory_order_release);
}

/* Serving and within the lease, now: what the gate decides, and what
 * /status and /metrics report. The flag alone lags: a leader stopped
 * (SIGSTOP) past its lease and continued still has it set until its
 * loop hears that it lost, while the lease check already refuses. */
static bool
serving_now(const allot__cluster *c)
{
	if (!atomic_load_explicit(&c->serving, memory_order_acquire))
		return false;
	/* The lease end is on the raft instance's clock (the loop's
	 * uv_now, which never runs ahead of uv_hrtime). */
	return uv_hrtime() / 1000000u < allot__consensus_grant_until(c->cons);
}

bool
allot__cluster_gate(const allot__cluster *c, const allot__cluster_view **ret)
{
	pub *p = atomic_load_explicit(
	    &((allot__cluster *) c)->view, memory_order_acquire);
	*ret = &p->v;
	return serving_now(c);
}

/* ---- leadership ---- */

static void usage_tap(void *ctx, const allot__store_tap_rows *t);

static void
step(allot__cluster *c)
{
	bool leader = allot__consensus_is_leader(c->cons);
	/* The gate reads the published lease end, which lags may_grant
	 * by up to one tick of the core: serve once both say so. */
	bool may = allot__consensus_may_grant(c->cons, uv_now(c->loop)) &&
	    uv_hrtime() / 1000000u < allot__consensus_grant_until(c->cons);
	atomic_store(&c->leader, leader);
	bool serving = atomic_load(&c->serving);
	if (!serving && may &&
	    (c->o.config_busy == NULL || !c->o.config_busy(c->o.ctx))) {
		/* Every earlier lease has ended: start from what the agents
		 * hold, never from what this member had before. */
		allot__state_forget(c->o.state, true);
		/* What an earlier leadership of ours proposed and the log
		 * dropped is booked again when its agents send it again. */
		allot__store_marks_rebase(c->o.store);
		allot__store_set_usage_tap(c->o.store, usage_tap, c);
		atomic_store(&c->serving, true);
		atomic_fetch_add(&c->takeovers, 1);
		allot__log(c->o.lg, ALLOT_LOG_NOTICE, "ALLOTD-LEADER",
		    "member %" PRIu64 " is the leader and serves agents from "
		    "epoch %" PRIu64 " on (quotas learnt first)",
		    c->o.id, allot__consensus_epoch(c->cons));
		allot__store_event(c->o.store, "leader", c->o.agent_url, NULL);
		if (c->o.on_serving != NULL)
			c->o.on_serving(c->o.ctx);
	} else if (serving && !leader) {
		atomic_store(&c->serving, false);
		/* What this leadership recorded since the last flush goes to
		 * the tap, which can no longer propose it: it is counted lost,
		 * not written to this member's file alone, where its session
		 * ids could later meet the new leader's. */
		allot__store_flush(c->o.store);
		allot__store_set_usage_tap(c->o.store, NULL, NULL);
		allot__store_marks_rebase(c->o.store);
		allot__state_forget(c->o.state, false);
		allot__log(c->o.lg, ALLOT_LOG_NOTICE, "ALLOTD-FOLLOWER",
		    "member %" PRIu64 " is no longer the leader: its "
		    "registry is dropped; agents are sent to the leader",
		    c->o.id);
		allot__store_event(
		    c->o.store, "follower", c->o.agent_url, NULL);
	}
}

static void
install_pending(allot__cluster *c)
{
	struct pending_config *p = c->pending;
	if (p == NULL)
		return;
	c->pending = NULL;
	if (c->o.on_config != NULL)
		c->o.on_config(c->o.ctx, p->text, p->len, p->epoch, &p->who);
	free(p);
}

static void drain_backlog(allot__cluster *c);

/* A leader whose file lags the log hands leadership to a member whose
 * file does not (at most every two election timeouts): the audit the
 * cluster serves from is complete, and the locked file catches up. */
static void
hand_over_if_behind(allot__cluster *c)
{
	uint64_t now = uv_now(c->loop);
	if (c->backlog.n == 0 || !atomic_load(&c->leader) ||
	    now - c->handed_over_at < 2u * c->o.election_ms)
		return;
	c->handed_over_at = now;
	if (allot__consensus_hand_over(c->cons) == ALLOT_OK)
		allot__log(c->o.lg, ALLOT_LOG_WARNING, "ALLOTD-HAND-OVER",
		    "member %" PRIu64 " hands leadership over: its file is "
		    "%zu entries behind the log",
		    c->o.id, c->backlog.n);
}

static void
on_timer(uv_timer_t *t)
{
	allot__cluster *c = t->data;
	install_pending(c);
	drain_backlog(c);
	hand_over_if_behind(c);
	step(c);
	publish(c);
}

/* ---- the log into the store and the state ---- */

/* Entry `e` at `index` into this member's file: its rows, or the audit
 * event of an entry without rows. ALLOT_OK or ALLOT_EIO. */
static int
store_entry(allot__cluster *c, uint64_t index, const allot__centry *e)
{
	char detail[512];
	allot__row_event one = { .at = allot__wall_ms() };
	switch (e->type) {
	case ALLOT__CENTRY_USAGE:
		return allot__store_apply(
		    c->o.store, index, e->usage.rows, e->usage.n, NULL, 0);
	case ALLOT__CENTRY_EVENTS:
		return allot__store_apply(
		    c->o.store, index, NULL, 0, e->events.rows, e->events.n);
	case ALLOT__CENTRY_AUDIT:
		return allot__store_apply_audit(c->o.store, index, &e->audit);
	case ALLOT__CENTRY_ACCOUNT:
		/* The records new to the state machine's marks only. */
		return allot__store_apply_counts(
		    c->o.store, index, e->account.rows, e->account.n);
	case ALLOT__CENTRY_CONFIG:
		snprintf(detail, sizeof detail,
		    "epoch=%" PRIu64 " digest=%016" PRIx64 " index=%" PRIu64,
		    e->config.config_epoch, e->config.digest, index);
		one.kind = "config_committed";
		break;
	case ALLOT__CENTRY_MEMBER:
		snprintf(detail, sizeof detail,
		    "event=%s id=%" PRIu64 " index=%" PRIu64,
		    e->member.event == ALLOT__CMEMBER_ADDED ? "added" :
		        e->member.event == ALLOT__CMEMBER_PROMOTED ?
		                                              "promoted" :
		        e->member.event == ALLOT__CMEMBER_LEAVING ? "leaving" :
		                                                    "removed",
		    e->member.id, index);
		one.kind = "member";
		one.subject = e->member.address;
		break;
	case ALLOT__CENTRY_EPOCH:
		snprintf(detail, sizeof detail,
		    "term=%" PRIu64 " leader=%" PRIu64 " lease_ms=%u",
		    e->epoch.term, e->epoch.leader_id, e->epoch.lease_ms);
		one.kind = "epoch";
		one.subject = e->epoch.address;
		break;
	default: return ALLOT_OK;
	}
	one.detail = detail;
	return allot__store_apply(c->o.store, index, NULL, 0, &one, 1);
}

/* The backlog, oldest first, while the store takes it. */
static void
drain_backlog(allot__cluster *c)
{
	uint64_t index, now = uv_now(c->loop);
	allot__centry e;
	/* Each try may wait the store's busy timeout on this loop: a few a
	 * second, not one a tick. */
	if (c->backlog.n == 0 || now < c->retry_at)
		return;
	c->retry_at = now + RETRY_MS;
	while (allot__backlog_peek(&c->backlog, &index, &e)) {
		int rv = store_entry(c, index, &e);
		allot__centry_clear(&e);
		if (rv != ALLOT_OK)
			break;
		allot__backlog_pop(&c->backlog);
		atomic_store(&c->store_applied, index);
	}
	atomic_store(&c->backlog_n, c->backlog.n);
	atomic_store(&c->backlog_lost, c->backlog.lost);
	if (c->backlog.n == 0 && c->behind_since != 0) {
		allot__log(c->o.lg, ALLOT_LOG_NOTICE, "ALLOTD-STORE-CAUGHT-UP",
		    "member %" PRIu64 "'s file holds every applied entry "
		    "again (to index %" PRIu64 ")",
		    c->o.id, atomic_load(&c->store_applied));
		c->behind_since = 0;
	}
}

/* A snapshot replaced the state (a member that joined or fell behind
 * past the log's start): its config is the cluster's committed one, and
 * is installed, with the author of its change, exactly as the CONFIG
 * entry it stands for would have been. Until then this member's own
 * file is not the cluster's: it serves nothing first (install_pending
 * runs before step), and never proposes its file as a first config. */
static void
on_restore(void *ctx, const allot__cfsm *s)
{
	allot__cluster *c = ctx;
	atomic_store(&c->applied, s->applied);
	if (s->config.epoch == 0 || s->config.text == NULL)
		return;
	allot__centry e = { .type = ALLOT__CENTRY_CONFIG };
	e.config.config_epoch = s->config.epoch;
	e.config.digest = s->config.digest;
	e.config.text = s->config.text;
	e.config.text_len = s->config.len;
	e.config.who = (allot__cwho) { .who = s->config.who[0],
		.claimed_as = s->config.who[1],
		.reason = s->config.who[2],
		.source = s->config.who[3] };
	atomic_store(&c->config_epoch, s->config.epoch);
	struct pending_config *p = pending_copy(&e);
	if (p == NULL) {
		allot__log(c->o.lg, ALLOT_LOG_ERR, "ALLOTD-CONFIG-FAIL",
		    "out of memory for the config of epoch %" PRIu64
		    " from a snapshot: installed with the next CONFIG",
		    s->config.epoch);
		return;
	}
	free(c->pending);
	c->pending = p;
	allot__log(c->o.lg, ALLOT_LOG_NOTICE, "ALLOTD-SNAPSHOT",
	    "member %" PRIu64 " installed a snapshot to index %" PRIu64
	    ": config epoch %" PRIu64 " (digest %016" PRIx64
	    ") is the cluster's",
	    c->o.id, s->applied, s->config.epoch, s->config.digest);
}

static void
on_apply(void *ctx, uint64_t index, const allot__centry *e)
{
	allot__cluster *c = ctx;
	atomic_store(&c->applied, index);
	if (e->type == ALLOT__CENTRY_CONFIG) {
		atomic_store(&c->config_epoch, e->config.config_epoch);
		struct pending_config *p = pending_copy(e);
		if (p != NULL) { /* else the next CONFIG, or a restart */
			free(c->pending);
			c->pending = p;
		}
	}
	/* In log order: behind the backlog, or written through. */
	if (c->backlog.n == 0 && store_entry(c, index, e) == ALLOT_OK) {
		atomic_store(&c->store_applied, index);
		return;
	}
	if (c->backlog.n == 0) {
		c->behind_since = uv_now(c->loop) + 1;
		allot__log(c->o.lg, ALLOT_LOG_ERR, "ALLOTD-STORE-BEHIND",
		    "member %" PRIu64 " cannot write log entry %" PRIu64
		    " to its file: kept, with every entry after it, and "
		    "retried in order every %u ms (its file lags the log "
		    "until then; as leader it hands leadership over)",
		    c->o.id, index, (unsigned) RETRY_MS);
		c->retry_at = uv_now(c->loop) + RETRY_MS;
	}
	if (!allot__backlog_push(&c->backlog, index, e))
		allot__log(c->o.lg, ALLOT_LOG_ERR, "ALLOTD-STORE-LOST",
		    "member %" PRIu64 ": log entry %" PRIu64 " is not in its "
		    "file and could not be kept for it (backlog over %u MB, "
		    "or out of memory): this member's audit lacks it",
		    c->o.id, index, ALLOT__BACKLOG_BYTES >> 20);
	atomic_store(&c->backlog_n, c->backlog.n);
	atomic_store(&c->backlog_lost, c->backlog.lost);
}

static void
proposal_done(void *ctx, int status, uint64_t index)
{
	(void) ctx;
	(void) status;
	(void) index;
}

/* Rows per log entry. A flush of a large deployment (10,000 replicas
 * with 50 quotas each changing their shares: 500,000 share rows, about
 * 30 MB) goes as several entries of at most this many rows (about
 * 1 MB), applied in order: no entry is tens of megabytes on the wire
 * and on every member's disk, and none holds a member's loop for long
 * when it applies it. */
#define ENTRY_ROWS 16384u

static int
propose_audit(allot__cluster *c, const allot__row_audit *a)
{
	allot__row_audit rest = *a, part;
	int rv = ALLOT_OK;
	while (rv == ALLOT_OK && allot__caudit_cut(&rest, ENTRY_ROWS, &part))
		rv = allot__consensus_propose_audit(
		    c->cons, &part, proposal_done, c);
	return rv;
}

/* Usage rows or events in entries of at most ENTRY_ROWS. */
static int
propose_rows(allot__cluster *c, const allot__row_usage *rows, size_t n,
    const allot__row_event *ev, size_t nev)
{
	int rv = ALLOT_OK;
	for (size_t i = 0; i < n && rv == ALLOT_OK; i += ENTRY_ROWS)
		rv = allot__consensus_propose_usage(c->cons, rows + i,
		    n - i < ENTRY_ROWS ? n - i : ENTRY_ROWS, proposal_done, c);
	for (size_t i = 0; i < nev && rv == ALLOT_OK; i += ENTRY_ROWS)
		rv = allot__consensus_propose_events(c->cons, ev + i,
		    nev - i < ENTRY_ROWS ? nev - i : ENTRY_ROWS, proposal_done,
		    c);
	return rv;
}

/* Agents' Usage records in entries of about ENTRY_ROWS, never cutting
 * a record (every member keeps or drops a record whole). */
static int
propose_counts(allot__cluster *c, const allot__row_count *rows, size_t n)
{
	int rv = ALLOT_OK;
	size_t i = 0;
	while (i < n && rv == ALLOT_OK) {
		size_t j = i + (n - i < ENTRY_ROWS ? n - i : ENTRY_ROWS);
		while (j < n && rows[j].id != 0 &&
		    rows[j].id == rows[j - 1].id &&
		    rows[j].incarnation == rows[j - 1].incarnation)
			j++;
		rv = allot__consensus_propose_account(
		    c->cons, rows + i, j - i, proposal_done, c);
		i = j;
	}
	return rv;
}

/* The leader's audit rows of one flush, into the log: USAGE, EVENTS,
 * AUDIT and ACCOUNT entries (after the joins its links name), each only
 * when it has rows. */
static void
usage_tap(void *ctx, const allot__store_tap_rows *t)
{
	allot__cluster *c = ctx;
	const allot__row_audit *a = &t->audit;
	size_t na = a->njoins + a->nshares + a->nlefts + a->nseen +
	    a->nlevels + a->nshadow;
	int rv = propose_rows(c, t->rows, t->n, t->ev, t->nev);
	if (rv == ALLOT_OK)
		rv = propose_audit(c, a);
	if (rv == ALLOT_OK)
		rv = propose_counts(c, t->counts, t->ncounts);
	if (rv == ALLOT_OK) {
		atomic_fetch_add(&c->usage_batches, 1);
		return;
	}
	/* Agents keep their records until they are durable: they are
	 * booked again at their next Sync. */
	allot__store_marks_rebase(c->o.store);
	atomic_fetch_add(&c->usage_lost, t->n + t->nev + na);
	allot__log(c->o.lg, ALLOT_LOG_WARNING, "ALLOTD-USAGE-LOST",
	    "%zu usage rows, %zu events and %zu replica, share and level "
	    "rows could not go through the log: %s",
	    t->n, t->nev, na, allot_strerror(rv));
}

/* ---- start and stop ---- */

static int
bootstrap(allot__cluster *c, char *err, size_t errlen)
{
	if (c->o.seeds == NULL || c->o.nseeds == 0)
		return allot__consensus_join(c->cons);
	allot__cmember *m = calloc(c->o.nseeds, sizeof *m);
	if (m == NULL)
		return ALLOT_ENOMEM;
	for (size_t i = 0; i < c->o.nseeds; i++) {
		m[i].id = c->o.seeds[i].id;
		m[i].role = RAFT_VOTER;
		if (!allot__caddr_join(c->o.seeds[i].raft, c->o.seeds[i].url,
		        m[i].address, sizeof m[i].address)) {
			snprintf(err, errlen,
			    "--seed %" PRIu64 ": address too "
			    "long or holds '|'",
			    m[i].id);
			free(m);
			return ALLOT_EINVAL;
		}
	}
	int rv = allot__consensus_bootstrap(c->cons, m, c->o.nseeds);
	free(m);
	if (rv != ALLOT_OK)
		snprintf(err, errlen,
		    "cannot record the first configuration "
		    "in %s: %s",
		    c->o.dir, allot_strerror(rv));
	return rv;
}

static void free_all(allot__cluster *c);

int
allot__cluster_start(const allot__cluster_opts *o, uv_loop_t *loop, char *err,
    size_t errlen, allot__cluster **ret)
{
	allot__cluster *c = calloc(1, sizeof *c);
	char addr[ALLOT__CNODE_ADDR_MAX];
	if (c == NULL) {
		snprintf(err, errlen, "out of memory");
		return ALLOT_ENOMEM;
	}
	c->loop = loop;
	c->o = *o;
	if (c->o.election_ms == 0)
		c->o.election_ms = ALLOT__CLUSTER_ELECTION_MS;
	allot__backlog_init(&c->backlog);
	if (!allot__caddr_join(
	        o->raft_addr, o->agent_url, addr, sizeof addr)) {
		snprintf(err, errlen,
		    "--raft-addr %s and agent URL %s: too long together, or "
		    "one holds '|'",
		    o->raft_addr, o->agent_url);
		free(c);
		return ALLOT_EINVAL;
	}
	c->self_addr = strdup(addr);
	pub *p = calloc(1, sizeof *p);
	if (c->self_addr == NULL || p == NULL ||
	    (p->v.members = calloc(1, sizeof *p->v.members)) == NULL) {
		free(p);
		free(c->self_addr);
		free(c);
		snprintf(err, errlen, "out of memory");
		return ALLOT_ENOMEM;
	}
	c->all = p;
	atomic_store(&c->view, p);
	allot__consensus_opts co = {
		.id = o->id,
		.address = c->self_addr,
		.dir = o->dir,
		.election_ms = c->o.election_ms,
		.snapshot_threshold = c->o.snapshot_entries,
		.snapshot_trailing = c->o.snapshot_entries,
		.on_apply = on_apply,
		.on_restore = on_restore,
		.ctx = c,
		.log = o->lg,
		.tls = o->tls,
	};
	int rv = allot__consensus_create(loop, &co, &c->cons);
	if (rv != ALLOT_OK) {
		snprintf(err, errlen,
		    "cannot start the consensus core in %s: %s", o->dir,
		    allot_strerror(rv));
		goto fail;
	}
	if ((rv = bootstrap(c, err, errlen)) != ALLOT_OK)
		goto fail_close;
	if ((rv = allot__consensus_start(c->cons)) != ALLOT_OK) {
		snprintf(err, errlen,
		    "cannot load the log in %s (or listen on %s): %s", o->dir,
		    o->raft_addr, allot_strerror(rv));
		goto fail_close;
	}
	install_pending(c);
	uv_timer_init(loop, &c->timer);
	c->timer.data = c;
	uv_timer_start(&c->timer, on_timer, POLL_MS, POLL_MS);
	c->closing = 0;
	publish(c);
	*ret = c;
	return ALLOT_OK;
fail_close:
	/* The timer never started; the core closes on the loop. */
	c->closing = 1;
	allot__consensus_close(c->cons, NULL, NULL);
	c->cons = NULL;
	/* What is left is freed now; the core frees itself. */
fail:
	free_all(c);
	return rv;
}

static void
free_all(allot__cluster *c)
{
	allot__backlog_fini(&c->backlog);
	free(c->pending);
	for (pub *q = c->all; q != NULL;) {
		pub *nx = q->next;
		pub_free(q);
		q = nx;
	}
	free(c->self_addr);
	free(c);
}

static void
closed_one(allot__cluster *c)
{
	if (--c->closing == 0)
		free_all(c);
}

static void
timer_closed(uv_handle_t *h)
{
	closed_one(h->data);
}

static void
cons_closed(void *ctx)
{
	closed_one(ctx);
}

void
allot__cluster_stop(allot__cluster *c)
{
	if (c == NULL)
		return;
	atomic_store(&c->serving, false);
	allot__store_set_usage_tap(c->o.store, NULL, NULL);
	c->closing = 2;
	uv_close((uv_handle_t *) &c->timer, timer_closed);
	allot__consensus_close(c->cons, cons_closed, c);
}

/* ---- config and members (loop thread) ---- */

static void
leader_url(const allot__cluster *c, char *out, size_t len)
{
	pub *p = atomic_load(&((allot__cluster *) c)->view);
	snprintf(out, len, "%s", p->v.leader != NULL ? p->v.leader : "");
}

/* A config proposal ended: one that failed (not committed: leadership
 * lost, the log refused it) breaks the chain of this leader's
 * proposals, and the next counts from the state again. */
static void
config_done(void *ctx, int status, uint64_t index)
{
	allot__cluster *c = ctx;
	(void) index;
	if (status != 0)
		c->proposed_in = 0;
}

int
allot__cluster_propose_config(allot__cluster *c, const char *text, size_t len,
    uint64_t digest, const allot__state_who *who, uint64_t *ret_epoch,
    char *ret_leader, size_t leader_len)
{
	if (ret_leader != NULL && leader_len > 0)
		ret_leader[0] = '\0';
	if (!allot__consensus_is_leader(c->cons)) {
		if (ret_leader != NULL)
			leader_url(c, ret_leader, leader_len);
		return ALLOT_ESTATE;
	}
	/* Until it serves, a new leader's state may lag what earlier
	 * leaders committed: a config proposed on it could take an epoch
	 * already taken. */
	if (!atomic_load(&c->serving))
		return ALLOT_EBUSY;
	uint64_t epoch = allot__consensus_state(c->cons)->config.epoch + 1;
	uint64_t lead = allot__consensus_epoch(c->cons);
	if (c->proposed_in == lead && c->proposed_epoch >= epoch)
		epoch = c->proposed_epoch + 1;
	allot__cwho w = { 0 };
	if (who != NULL)
		w = (allot__cwho) { who->who, who->claimed_as, who->reason,
			who->source };
	int rv = allot__consensus_propose_config(
	    c->cons, text, len, digest, epoch, &w, config_done, c);
	if (rv == ALLOT_OK) {
		c->proposed_epoch = epoch;
		c->proposed_in = lead;
		c->proposed_digest = digest;
	}
	if (rv == ALLOT_OK && ret_epoch != NULL)
		*ret_epoch = epoch;
	return rv;
}

uint64_t
allot__cluster_config_in_flight(const allot__cluster *c, uint64_t *ret_epoch)
{
	if (c->proposed_in == 0 ||
	    c->proposed_in != allot__consensus_epoch(c->cons) ||
	    c->proposed_epoch <= allot__consensus_state(c->cons)->config.epoch)
		return 0;
	if (ret_epoch != NULL)
		*ret_epoch = c->proposed_epoch;
	return c->proposed_digest;
}

bool
allot__cluster_is_leader(const allot__cluster *c)
{
	return allot__consensus_is_leader(c->cons);
}

uint64_t
allot__cluster_config_epoch(const allot__cluster *c)
{
	return allot__consensus_state(c->cons)->config.epoch;
}

static int
not_leader(const allot__cluster *c, char *err, size_t errlen)
{
	char url[ALLOT__CNODE_ADDR_MAX];
	leader_url(c, url, sizeof url);
	snprintf(err, errlen,
	    "this member is not the leader; ask the leader%s%s",
	    url[0] ? " at " : "", url[0] ? url : " (none known yet: retry)");
	return ALLOT_ESTATE;
}

int
allot__cluster_member_add(allot__cluster *c, uint64_t id,
    const char *raft_addr, const char *agent_url, char *err, size_t errlen)
{
	char addr[ALLOT__CNODE_ADDR_MAX];
	if (id == 0 ||
	    !allot__caddr_join(raft_addr, agent_url, addr, sizeof addr)) {
		snprintf(err, errlen,
		    "a member needs an id > 0, a raft address and an agent "
		    "URL (without '|')");
		return ALLOT_EINVAL;
	}
	int rv = allot__consensus_add_member(c->cons, id, addr);
	if (rv == ALLOT_ESTATE)
		return not_leader(c, err, errlen);
	if (rv == ALLOT_EBUSY)
		snprintf(err, errlen,
		    "another membership change is in progress; retry when "
		    "`allotctl member list` shows it done");
	else if (rv != ALLOT_OK)
		snprintf(err, errlen, "cannot add member %" PRIu64 ": %s", id,
		    allot_strerror(rv));
	return rv;
}

int
allot__cluster_member_remove(
    allot__cluster *c, uint64_t id, char *err, size_t errlen)
{
	int rv = allot__consensus_remove_member(c->cons, id);
	if (rv == ALLOT_ESTATE)
		return not_leader(c, err, errlen);
	if (rv == ALLOT_EINVAL && id == c->o.id)
		snprintf(err, errlen,
		    "member %" PRIu64 " is the leader and the last voter: "
		    "add another member first",
		    id);
	else if (rv == ALLOT_EBUSY)
		snprintf(err, errlen,
		    "another membership change is in progress; retry");
	else if (rv == ALLOT_ENOENT)
		snprintf(err, errlen, "no member %" PRIu64, id);
	else if (rv != ALLOT_OK)
		snprintf(err, errlen, "cannot remove member %" PRIu64 ": %s",
		    id, allot_strerror(rv));
	return rv;
}

bool
allot__cluster_member_left(
    allot__cluster *c, uint64_t id, char *state, size_t len)
{
	int st = allot__consensus_leave_state(c->cons, id);
	uint64_t lid = 0;
	const char *laddr = NULL;
	allot__consensus_leader(c->cons, &lid, &laddr);
	switch (st) {
	case ALLOT__CLEAVE_GONE:
		snprintf(state, len,
		    "member %" PRIu64 " is out of the committed configuration",
		    id);
		return true;
	case ALLOT__CLEAVE_DEMOTED:
		snprintf(state, len,
		    "member %" PRIu64 "%s no longer votes (a standby in the "
		    "committed configuration); leader %" PRIu64
		    " removes it from the configuration next",
		    id, id == c->o.id ? " handed leadership over and" : "",
		    lid);
		return id == c->o.id && lid != id;
	case ALLOT__CLEAVE_LEAVING:
		snprintf(state, len,
		    "member %" PRIu64 "'s removal is committed to the log but "
		    "it still votes (leader: %" PRIu64 "%s)",
		    id, lid,
		    lid == id    ? ", still handing leadership over" :
		        lid == 0 ? ", none known" :
		                   "");
		return false;
	default:
		snprintf(state, len,
		    "member %" PRIu64 " is still in the configuration "
		    "(leader: %" PRIu64 ")",
		    id, lid);
		return false;
	}
}

static const char *
role_name(int role)
{
	switch (role) {
	case RAFT_VOTER: return "voter";
	case RAFT_STANDBY: return "standby";
	case RAFT_SPARE: return "spare";
	default: return "?";
	}
}

void
allot__cluster_member_list(allot__cluster *c, allot__buf *b)
{
	allot__cmember m[MAX_MEMBERS];
	size_t n = allot__consensus_members(c->cons, m, MAX_MEMBERS);
	uint64_t lid = 0;
	const char *laddr = NULL;
	allot__consensus_leader(c->cons, &lid, &laddr);
	allot__buf_printf(b,
	    "{\"self\":%" PRIu64 ",\"leader\":%" PRIu64 ",\"epoch\":%" PRIu64
	    ",\"changing\":%s,\"members\":[",
	    c->o.id, lid, allot__consensus_epoch(c->cons),
	    allot__consensus_changing(c->cons) ? "true" : "false");
	for (size_t i = 0; i < n; i++) {
		char raft[ALLOT__CNODE_ADDR_MAX];
		const char *url = "";
		if (!allot__caddr_split(m[i].address, raft, sizeof raft, &url))
			raft[0] = '\0';
		allot__buf_printf(b,
		    "%s{\"id\":%" PRIu64 ",\"raft\":", i ? "," : "", m[i].id);
		allot__buf_json(b, raft);
		allot__buf_puts(b, ",\"url\":");
		allot__buf_json(b, url);
		allot__buf_printf(b,
		    ",\"role\":\"%s\",\"leader\":%s,\"leaving\":%s}",
		    role_name(m[i].role), m[i].id == lid ? "true" : "false",
		    allot__consensus_leave_state(c->cons, m[i].id) ==
		            ALLOT__CLEAVE_MEMBER ?
		        "false" :
		        "true");
	}
	allot__buf_puts(b, "]}");
}

/* ---- /metrics and /status (HTTP thread: atomics and the view) ---- */

void
allot__cluster_render_metrics(allot__cluster *c, allot__buf *b)
{
	pub *p = atomic_load(&c->view);
	allot__buf_printf(b,
	    "# HELP allotd_cluster_leader 1 while this member is the "
	    "Raft leader.\n# TYPE allotd_cluster_leader gauge\n"
	    "allotd_cluster_leader %d\n"
	    "# HELP allotd_cluster_serving 1 while this member allocates "
	    "(leader, lease held, taken over).\n"
	    "# TYPE allotd_cluster_serving gauge\n"
	    "allotd_cluster_serving %d\n"
	    "# HELP allotd_cluster_epoch The epoch agents are told.\n"
	    "# TYPE allotd_cluster_epoch gauge\n"
	    "allotd_cluster_epoch %" PRIu64 "\n"
	    "# HELP allotd_cluster_members Members in the configuration.\n"
	    "# TYPE allotd_cluster_members gauge\n"
	    "allotd_cluster_members %zu\n"
	    "# HELP allotd_cluster_applied_index Last log index applied.\n"
	    "# TYPE allotd_cluster_applied_index gauge\n"
	    "allotd_cluster_applied_index %" PRIu64 "\n"
	    "# HELP allotd_cluster_takeovers_total Times this member "
	    "started serving as leader.\n"
	    "# TYPE allotd_cluster_takeovers_total counter\n"
	    "allotd_cluster_takeovers_total %" PRIu64 "\n"
	    "# HELP allotd_cluster_usage_rows_lost_total Audit rows (usage, "
	    "events, replica, share and level rows) the leader could not "
	    "propose.\n"
	    "# TYPE allotd_cluster_usage_rows_lost_total counter\n"
	    "allotd_cluster_usage_rows_lost_total %" PRIu64 "\n"
	    "# HELP allotd_cluster_store_backlog_entries Committed log "
	    "entries this member's file could not take yet (retried in "
	    "order).\n"
	    "# TYPE allotd_cluster_store_backlog_entries gauge\n"
	    "allotd_cluster_store_backlog_entries %" PRIu64 "\n"
	    "# HELP allotd_cluster_store_lost_entries_total Committed log "
	    "entries this member's file will never hold (backlog full).\n"
	    "# TYPE allotd_cluster_store_lost_entries_total counter\n"
	    "allotd_cluster_store_lost_entries_total %" PRIu64 "\n",
	    atomic_load(&c->leader) ? 1 : 0, serving_now(c) ? 1 : 0,
	    p->v.epoch, p->v.nmembers, atomic_load(&c->applied),
	    atomic_load(&c->takeovers), atomic_load(&c->usage_lost),
	    atomic_load(&c->backlog_n), atomic_load(&c->backlog_lost));
}

void
allot__cluster_render_status(allot__cluster *c, allot__buf *b)
{
	pub *p = atomic_load(&c->view);
	allot__buf_printf(b,
	    "{\"id\":%" PRIu64 ",\"leader\":%s,\"serving\":%s,"
	    "\"epoch\":%" PRIu64 ",\"config_epoch\":%" PRIu64
	    ",\"applied_index\":%" PRIu64 ",\"store_index\":%" PRIu64
	    ",\"store_behind\":%" PRIu64 ",\"store_lost\":%" PRIu64
	    ",\"leader_url\":",
	    c->o.id, atomic_load(&c->leader) ? "true" : "false",
	    serving_now(c) ? "true" : "false", p->v.epoch,
	    atomic_load(&c->config_epoch), atomic_load(&c->applied),
	    atomic_load(&c->store_applied), atomic_load(&c->backlog_n),
	    atomic_load(&c->backlog_lost));
	allot__buf_json(b, p->v.leader);
	allot__buf_puts(b, ",\"members\":[");
	for (size_t i = 0; i < p->v.nmembers; i++) {
		if (i > 0)
			allot__buf_puts(b, ",");
		allot__buf_json(b, p->v.members[i]);
	}
	allot__buf_puts(b, "]}");
}
