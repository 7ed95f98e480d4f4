/* SPDX-License-Identifier: MIT */
/*
 * One member's consensus logic over a libraft instance (consensus_node.h
 * has the lease argument): leadership tracking, the EPOCH claim, lease
 * renewal, proposals, the staged membership changes, and the leaving
 * members every leader removes (allot__cnode_remove_member in the
 * header has the steps).
 *
 * Every proposal and barrier is a heap request freed in its callback:
 * libraft calls back each one exactly once, also when leadership is lost
 * or the instance closes, so nothing here outlives its request.
 */
#include "consensus_node.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>

typedef struct creq {
	union {
		struct raft_apply apply;
		struct raft_barrier barrier;
	};
	allot__cnode *n;
	uint64_t term; /* the term it was submitted in */
	uint64_t submitted; /* on the instance's clock */
	bool renewal;
	allot__cnode_done_cb done;
	void *ctx;
} creq;

int
allot__cnode_err(int raft_rv)
{
	switch (raft_rv) {
	case 0: return ALLOT_OK;
	case RAFT_NOMEM: return ALLOT_ENOMEM;
	case RAFT_NOTLEADER:
	case RAFT_LEADERSHIPLOST: return ALLOT_ESTATE;
	case RAFT_CANTCHANGE:
	case RAFT_BUSY: return ALLOT_EBUSY;
	case RAFT_NOTFOUND:
	case RAFT_BADID: return ALLOT_ENOENT;
	case RAFT_DUPLICATEID:
	case RAFT_DUPLICATEADDRESS:
	case RAFT_BADROLE:
	case RAFT_INVALID: return ALLOT_EINVAL;
	case RAFT_SHUTDOWN:
	case RAFT_CANCELED: return ALLOT_ECLOSED;
	default: return ALLOT_EIO;
	}
}

static uint64_t
now_of(const allot__cnode *n)
{
	if (n->opts.clock != NULL)
		return n->opts.clock(n->opts.clock_ctx);
	return n->r->io->time(n->r->io);
}

void
allot__cnode_init(allot__cnode *n, struct raft *r, allot__cfsm *fsm,
    const allot__cnode_opts *opts)
{
	double d;

	memset(n, 0, sizeof *n);
	n->r = r;
	n->fsm = fsm;
	fsm->raft = r;
	if (opts != NULL)
		n->opts = *opts;
	if (n->opts.lease_ms == 0)
		n->opts.lease_ms = r->election_timeout;
	if (n->opts.drift <= 0.0 || n->opts.drift >= 0.5)
		n->opts.drift = ALLOT__CNODE_DRIFT;
	if (n->opts.renew_ms == 0)
		n->opts.renew_ms = n->opts.lease_ms / 4 > 0 ?
		    n->opts.lease_ms / 4 :
		    1;
	d = n->opts.drift;
	n->wait_ms = (uint32_t) ceil(n->opts.lease_ms * (1.0 + d)) +
	    ALLOT__CNODE_CLOCK_SLACK_MS;
	n->hold_ms = (uint32_t) floor(n->opts.lease_ms * (1.0 - d));
	n->change.status = ALLOT_OK;
	raft_set_pre_vote(r, true);
}

/* The value other threads grant by: the lease end once the EPOCH is
 * committed and the wait is over, else 0. */
static void
publish(allot__cnode *n, uint64_t now)
{
	uint64_t until = 0;

	if (n->lease_term != 0 && n->lease_term == n->r->current_term &&
	    n->r->state == RAFT_LEADER && !n->transferring &&
	    n->fsm->epoch.term == n->lease_term &&
	    n->fsm->epoch.leader_id == n->r->id &&
	    now >= n->elected_at + n->wait_ms)
		until = n->lease_until;
	atomic_store_explicit(&n->grant_until, until, memory_order_release);
}

uint64_t
allot__cnode_grant_until(const allot__cnode *n)
{
	return atomic_load_explicit(
	    &((allot__cnode *) n)->grant_until, memory_order_acquire);
}

/* A committed entry this leader submitted at `q->submitted` in its
 * current term moves the lease end (the argument in the header). */
static void
anchor(allot__cnode *n, const creq *q)
{
	if (n->lease_term == 0 || q->term != n->lease_term ||
	    n->r->state != RAFT_LEADER || n->r->current_term != q->term)
		return;
	if (q->submitted + n->hold_ms > n->lease_until)
		n->lease_until = q->submitted + n->hold_ms;
	publish(n, now_of(n));
}

static void
apply_cb(struct raft_apply *req, int status, void *result)
{
	creq *q = req->data;
	allot__cnode *n = q->n;

	(void) result;
	n->inflight--;
	if (status == 0)
		anchor(n, q);
	if (q->done != NULL)
		q->done(q->ctx, allot__cnode_err(status), req->index);
	free(q);
}

static void
barrier_cb(struct raft_barrier *req, int status)
{
	creq *q = req->data;
	allot__cnode *n = q->n;

	n->inflight--;
	if (q->renewal)
		n->renewing = false;
	if (status == 0)
		anchor(n, q);
	free(q);
}

static creq *
new_req(allot__cnode *n, allot__cnode_done_cb done, void *ctx)
{
	creq *q = calloc(1, sizeof *q);

	if (q == NULL)
		return NULL;
	q->n = n;
	q->term = n->r->current_term;
	q->submitted = now_of(n);
	q->done = done;
	q->ctx = ctx;
	return q;
}

int
allot__cnode_propose(allot__cnode *n, const allot__centry *e,
    allot__cnode_done_cb done, void *ctx)
{
	struct raft_buffer buf;
	creq *q;
	int rv;

	if (n->r->state != RAFT_LEADER)
		return ALLOT_ESTATE;
	rv = allot__centry_encode(e, &buf.base, &buf.len);
	if (rv != ALLOT_OK)
		return rv;
	q = new_req(n, done, ctx);
	if (q == NULL) {
		raft_free(buf.base);
		return ALLOT_ENOMEM;
	}
	q->apply.data = q;
	rv = raft_apply(n->r, &q->apply, &buf, 1, apply_cb);
	if (rv != 0) {
		raft_free(buf.base);
		free(q);
		return allot__cnode_err(rv);
	}
	n->inflight++;
	n->last_submit = q->submitted;
	return ALLOT_OK;
}

static void
renew(allot__cnode *n)
{
	creq *q = new_req(n, NULL, NULL);

	if (q == NULL)
		return; /* the next tick tries again */
	q->renewal = true;
	q->barrier.data = q;
	if (raft_barrier(n->r, &q->barrier, barrier_cb) != 0) {
		free(q);
		return;
	}
	n->inflight++;
	n->renewing = true;
	n->last_submit = q->submitted;
}

static void
propose_epoch(allot__cnode *n)
{
	allot__centry e = { .type = ALLOT__CENTRY_EPOCH };

	e.epoch.term = n->r->current_term;
	e.epoch.leader_id = n->r->id;
	e.epoch.lease_ms = n->opts.lease_ms;
	e.epoch.address = n->r->address;
	n->epoch_sent = allot__cnode_propose(n, &e, NULL, NULL) == ALLOT_OK;
}

/* ---- membership ---- */

static const struct raft_server *
server_of(const struct raft *r, uint64_t id, unsigned *ret_i)
{
	for (unsigned i = 0; i < r->configuration.n; i++) {
		if (r->configuration.servers[i].id == id) {
			if (ret_i != NULL)
				*ret_i = i;
			return &r->configuration.servers[i];
		}
	}
	return NULL;
}

static void
member_event(allot__cnode *n, int event)
{
	allot__centry e = { .type = ALLOT__CENTRY_MEMBER };

	e.member.event = event;
	e.member.id = n->change.id;
	e.member.address = n->change.address;
	/* An audit record only: if it is lost with the leadership, the
	 * configuration change itself still stands. */
	(void) allot__cnode_propose(n, &e, NULL, NULL);
}

static void
change_cb(struct raft_change *req, int status)
{
	allot__cnode *n = req->data;

	n->change.in_flight = false;
	n->change.status = allot__cnode_err(status);
	if (status != 0) {
		n->change.stage = ALLOT__CCHANGE_IDLE;
		return;
	}
	switch (n->change.stage) {
	case ALLOT__CCHANGE_ADDING:
		member_event(n, ALLOT__CMEMBER_ADDED);
		n->change.stage = ALLOT__CCHANGE_TO_STANDBY;
		break;
	case ALLOT__CCHANGE_TO_STANDBY:
		n->change.stage = ALLOT__CCHANGE_CATCHING_UP;
		break;
	case ALLOT__CCHANGE_PROMOTING:
		member_event(n, ALLOT__CMEMBER_PROMOTED);
		n->change.stage = ALLOT__CCHANGE_IDLE;
		break;
	case ALLOT__CCHANGE_REMOVING:
		member_event(n, ALLOT__CMEMBER_REMOVED);
		/* That entry also takes it out of the leaving set: not one
		 * more from step_leaving meanwhile. */
		n->cleared_id = n->change.id;
		n->cleared_term = n->r->current_term;
		n->change.stage = ALLOT__CCHANGE_IDLE;
		break;
	case ALLOT__CCHANGE_DEMOTING:
		n->change.stage = ALLOT__CCHANGE_IDLE;
		break;
	default: break;
	}
}

static void
change_failed(allot__cnode *n, int rv)
{
	n->change.status = allot__cnode_err(rv);
	n->change.stage = ALLOT__CCHANGE_IDLE;
}

/* Moves a staged change on: assigns the standby role, promotes a
 * standby that has caught up. */
static void
step_change(allot__cnode *n)
{
	struct raft *r = n->r;
	const struct raft_server *s;
	unsigned i;
	int rv;

	if (n->change.in_flight)
		return;
	switch (n->change.stage) {
	case ALLOT__CCHANGE_TO_STANDBY:
		rv = raft_assign(
		    r, &n->change.req, n->change.id, RAFT_STANDBY, change_cb);
		if (rv == 0)
			n->change.in_flight = true;
		else if (rv != RAFT_CANTCHANGE)
			change_failed(n, rv);
		break;
	case ALLOT__CCHANGE_CATCHING_UP:
		s = server_of(r, n->change.id, &i);
		if (s == NULL) {
			change_failed(n, RAFT_NOTFOUND);
			break;
		}
		if (r->leader_state.progress[i].match_index +
		        ALLOT__CNODE_CATCHUP_SLACK <
		    raft_last_index(r))
			break;
		n->change.stage = ALLOT__CCHANGE_PROMOTING;
		rv = raft_assign(
		    r, &n->change.req, n->change.id, RAFT_VOTER, change_cb);
		if (rv == 0)
			n->change.in_flight = true;
		else if (rv == RAFT_CANTCHANGE)
			n->change.stage = ALLOT__CCHANGE_CATCHING_UP;
		else
			change_failed(n, rv);
		break;
	default: break;
	}
}

int
allot__cnode_add_member(allot__cnode *n, uint64_t id, const char *address)
{
	const struct raft_server *s;
	int rv;

	if (id == 0 || address == NULL ||
	    strlen(address) >= ALLOT__CNODE_ADDR_MAX)
		return ALLOT_EINVAL;
	if (n->r->state != RAFT_LEADER)
		return ALLOT_ESTATE;
	if (n->change.stage != ALLOT__CCHANGE_IDLE ||
	    allot__cfsm_leaving(n->fsm, id))
		return ALLOT_EBUSY;
	n->change.id = id;
	snprintf(n->change.address, sizeof n->change.address, "%s", address);
	n->change.req.data = n;
	s = server_of(n->r, id, NULL);
	if (s != NULL) {
		/* Resume an add that an earlier leader did not finish. */
		if (s->role == RAFT_VOTER)
			return ALLOT_OK;
		n->change.stage = s->role == RAFT_SPARE ?
		    ALLOT__CCHANGE_TO_STANDBY :
		    ALLOT__CCHANGE_CATCHING_UP;
		step_change(n);
		return ALLOT_OK;
	}
	n->change.stage = ALLOT__CCHANGE_ADDING;
	rv = raft_add(n->r, &n->change.req, id, address, change_cb);
	if (rv != 0) {
		n->change.stage = ALLOT__CCHANGE_IDLE;
		return allot__cnode_err(rv);
	}
	n->change.in_flight = true;
	return ALLOT_OK;
}

static void
transfer_cb(struct raft_transfer *req)
{
	allot__cnode *n = req->data;

	/* Leadership moved (or the attempt timed out): either way this
	 * member is back to the ordinary rules; a failed hand-over leaves
	 * it leader with its lease to renew. */
	n->transferring = false;
}

int
allot__cnode_hand_over(allot__cnode *n)
{
	struct raft *r = n->r;

	if (r->state != RAFT_LEADER || n->transferring)
		return ALLOT_ESTATE;
	n->transferring = true;
	publish(n, now_of(n));
	n->transfer.data = n;
	if (raft_transfer(r, &n->transfer, 0, transfer_cb) != 0) {
		n->transferring = false;
		return ALLOT_EBUSY;
	}
	return ALLOT_OK;
}

/* Starts a raft_remove or raft_assign(STANDBY) of `id` as the staged
 * change `stage`; RAFT_* as libraft returns it. */
static int
start_change(allot__cnode *n, uint64_t id, int stage)
{
	const struct raft_server *s = server_of(n->r, id, NULL);
	int rv;

	n->change.id = id;
	snprintf(n->change.address, sizeof n->change.address, "%s",
	    s != NULL ? s->address : "");
	n->change.req.data = n;
	n->change.stage = stage;
	if (stage == ALLOT__CCHANGE_REMOVING)
		rv = raft_remove(n->r, &n->change.req, id, change_cb);
	else
		rv = raft_assign(
		    n->r, &n->change.req, id, RAFT_STANDBY, change_cb);
	if (rv != 0) {
		n->change.stage = ALLOT__CCHANGE_IDLE;
		return rv;
	}
	n->change.in_flight = true;
	return 0;
}

static unsigned
other_voters(const struct raft *r)
{
	unsigned k = 0;

	for (unsigned i = 0; i < r->configuration.n; i++)
		k += r->configuration.servers[i].role == RAFT_VOTER &&
		    r->configuration.servers[i].id != r->id;
	return k;
}

int
allot__cnode_remove_member(allot__cnode *n, uint64_t id)
{
	allot__centry e = { .type = ALLOT__CENTRY_MEMBER };
	const struct raft_server *s;

	if (n->r->state != RAFT_LEADER)
		return ALLOT_ESTATE;
	s = server_of(n->r, id, NULL);
	if (s == NULL)
		return ALLOT_ENOENT;
	if (allot__cfsm_leaving(n->fsm, id))
		return ALLOT_OK; /* under way: the ticks finish it */
	if (n->change.stage != ALLOT__CCHANGE_IDLE || n->transferring)
		return ALLOT_EBUSY;
	if (id != n->r->id)
		return allot__cnode_err(
		    start_change(n, id, ALLOT__CCHANGE_REMOVING));
	/* The leader itself: the intent goes through the log, so whoever
	 * leads next finishes the removal even if this member never gets
	 * to hand over. */
	if (other_voters(n->r) == 0)
		return ALLOT_EINVAL;
	if (n->fsm->nleaving >= ALLOT__CFSM_LEAVING_MAX)
		return ALLOT_EBUSY;
	e.member.event = ALLOT__CMEMBER_LEAVING;
	e.member.id = id;
	e.member.address = s->address;
	return allot__cnode_propose(n, &e, NULL, NULL);
}

int
allot__cnode_leave_state(const allot__cnode *n, uint64_t id)
{
	const struct raft *r = n->r;
	const struct raft_server *s = server_of(r, id, NULL);
	bool leaving = allot__cfsm_leaving(n->fsm, id);

	if (r->configuration_uncommitted_index == 0) {
		if (s == NULL)
			return ALLOT__CLEAVE_GONE;
		if (leaving && s->role != RAFT_VOTER)
			return ALLOT__CLEAVE_DEMOTED;
	}
	return leaving ? ALLOT__CLEAVE_LEAVING : ALLOT__CLEAVE_MEMBER;
}

/* One step toward the leaving set, on a leader whose state holds every
 * earlier intent (its EPOCH is applied), between other changes. */
static void
step_leaving(allot__cnode *n, uint64_t now)
{
	struct raft *r = n->r;
	allot__centry e = { .type = ALLOT__CENTRY_MEMBER };

	if (n->change.stage != ALLOT__CCHANGE_IDLE || n->transferring ||
	    n->fsm->epoch.term != r->current_term ||
	    n->fsm->epoch.leader_id != r->id ||
	    r->configuration_uncommitted_index != 0)
		return;
	for (unsigned k = 0; k < n->fsm->nleaving; k++) {
		uint64_t id = n->fsm->leaving[k];
		unsigned i;
		const struct raft_server *s = server_of(r, id, &i);

		if (s == NULL) {
			if (n->cleared_id == id &&
			    n->cleared_term == r->current_term)
				continue;
			n->cleared_id = id;
			n->cleared_term = r->current_term;
			e.member.event = ALLOT__CMEMBER_REMOVED;
			e.member.id = id;
			e.member.address = "";
			(void) allot__cnode_propose(n, &e, NULL, NULL);
			continue;
		}
		if (id == r->id) {
			/* Stop granting first: from here the lease is
			 * given up. A failed hand-over comes back here. */
			n->transferring = true;
			publish(n, now);
			n->transfer.data = n;
			if (raft_transfer(r, &n->transfer, 0, transfer_cb) !=
			    0)
				n->transferring = false;
			return;
		}
		if (s->role == RAFT_VOTER) {
			(void) start_change(n, id, ALLOT__CCHANGE_DEMOTING);
			return;
		}
		/* Let a demoted member hear that its demotion committed
		 * (it acknowledged an entry after it: the renewals), for
		 * at most a lease, so its own allotctl call can tell. */
		if (n->demoted_id != id) {
			n->demoted_id = id;
			n->demoted_seen = now;
		}
		if (r->leader_state.progress[i].match_index <=
		        r->configuration_index &&
		    now < n->demoted_seen + n->opts.lease_ms)
			return;
		(void) start_change(n, id, ALLOT__CCHANGE_REMOVING);
		return;
	}
}

bool
allot__cnode_changing(const allot__cnode *n)
{
	return n->change.stage != ALLOT__CCHANGE_IDLE || n->fsm->nleaving > 0;
}

size_t
allot__cnode_members(const allot__cnode *n, allot__cmember *out, size_t cap)
{
	const struct raft_configuration *c = &n->r->configuration;
	size_t k = 0;

	for (unsigned i = 0; i < c->n && k < cap; i++, k++) {
		out[k].id = c->servers[i].id;
		snprintf(out[k].address, sizeof out[k].address, "%s",
		    c->servers[i].address);
		out[k].role = c->servers[i].role;
	}
	return k;
}

/* ---- the tick and the predicate ---- */

static void
notice_leader(allot__cnode *n)
{
	raft_id id = 0;
	const char *address = NULL;

	raft_leader(n->r, &id, &address);
	if (id == n->seen_leader)
		return;
	n->seen_leader = id;
	if (n->opts.on_leader != NULL)
		n->opts.on_leader(n->opts.ctx, id, id != 0 ? address : NULL);
}

void
allot__cnode_tick(allot__cnode *n)
{
	struct raft *r = n->r;
	uint64_t now = now_of(n);

	notice_leader(n);
	if (r->state != RAFT_LEADER) {
		n->lease_term = 0;
		n->lease_until = 0;
		n->transferring = false;
		/* A change this member was driving is the next leader's to
		 * resume (allotctl retries there). */
		if (!n->change.in_flight)
			n->change.stage = ALLOT__CCHANGE_IDLE;
		publish(n, now);
		return;
	}
	if (n->lease_term != r->current_term) {
		/* Won an election: the wait starts now, which is no earlier
		 * than the win (consensus_node.h). */
		n->lease_term = r->current_term;
		n->elected_at = now;
		n->lease_until = 0;
		n->epoch_sent = false;
		n->renewing = false;
	}
	if (!n->epoch_sent)
		propose_epoch(n);
	if (!n->renewing && !n->transferring &&
	    now - n->last_submit >= n->opts.renew_ms)
		renew(n);
	step_change(n);
	step_leaving(n, now);
	publish(n, now);
}

bool
allot__cnode_may_grant(const allot__cnode *n, uint64_t now)
{
	const struct raft *r = n->r;

	if (r->state != RAFT_LEADER || n->transferring ||
	    n->lease_term != r->current_term)
		return false;
	if (n->fsm->epoch.term != r->current_term ||
	    n->fsm->epoch.leader_id != r->id)
		return false;
	if (now < n->elected_at + n->wait_ms)
		return false;
	return now < n->lease_until;
}

uint64_t
allot__cnode_epoch(const allot__cnode *n)
{
	return n->fsm->epoch.term;
}

bool
allot__cnode_leader(
    const allot__cnode *n, uint64_t *ret_id, const char **ret_address)
{
	raft_id id = 0;
	const char *address = NULL;

	raft_leader(n->r, &id, &address);
	if (id == 0)
		return false;
	*ret_id = id;
	*ret_address = address;
	return true;
}
