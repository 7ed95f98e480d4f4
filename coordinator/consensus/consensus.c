/* SPDX-License-Identifier: MIT */
/*
 * The consensus core on allotd's libuv loop (consensus.h): libraft with
 * raft_uv (log segments and snapshots in the data directory) and
 * raft_uv_tcp or raft_tls.c between members, a timer that drives the node
 * (consensus_node.c) every half heartbeat, and the asynchronous close.
 * Everything about leadership, the lease and membership is in
 * consensus_node.c, shared with the deterministic tests.
 */
#include "consensus.h"

#include "consensus_addr.h"

#include <errno.h>
#include <raft/uv.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <allot/allot.h>

struct allot__consensus {
	uv_loop_t *loop;
	/* raft_uv_tcp, or mutual TLS (raft_tls.h) with opts.tls */
	struct raft_uv_transport tcp;
	struct raft_uv_transport transport; /* strips agent URLs */
	struct raft_io io;
	struct raft raft;
	allot__cfsm fsm;
	allot__cnode node;
	uv_timer_t timer;
	allot__consensus_opts opts;
	char *address;
	char *dir;
	unsigned tick_ms;
	unsigned closing; /* handles still closing */
	void (*close_cb)(void *ctx);
	void *close_ctx;
};

static void
fail(const allot__consensus *c, const char *what, const char *msg)
{
	allot__log(c->opts.log, ALLOT_LOG_ERR, "ALLOT-RAFT-FAIL", "%s: %s",
	    what, msg);
}

/* The wrapper, then the inner transport. */
static void
transport_close(allot__consensus *c)
{
	allot__caddr_free(&c->transport);
	if (c->opts.tls != NULL)
		allot__raft_tls_close(&c->tcp);
	else
		raft_uv_tcp_close(&c->tcp);
}

static void
tick_cb(uv_timer_t *t)
{
	allot__consensus *c = t->data;

	allot__cnode_tick(&c->node);
}

static void
leader_cb(void *ctx, uint64_t id, const char *address)
{
	allot__consensus *c = ctx;

	if (id != 0)
		allot__log(c->opts.log, ALLOT_LOG_NOTICE, "ALLOT-RAFT-LEADER",
		    "member %llu: leader is %llu at %s",
		    (unsigned long long) c->opts.id, (unsigned long long) id,
		    address);
	else
		allot__log(c->opts.log, ALLOT_LOG_NOTICE, "ALLOT-RAFT-LEADER",
		    "member %llu: no leader known",
		    (unsigned long long) c->opts.id);
	if (c->opts.on_leader != NULL)
		c->opts.on_leader(c->opts.ctx, id, address);
}

/* The TLS transport's membership check (raft_tls.h): whether `id` is in
 * the configuration this member has, the uncommitted one included (a
 * member being added dials the leader before the change commits). An
 * empty one, before the first entry came, takes any member. */
static bool
in_configuration(void *arg, raft_id id)
{
	const struct raft_configuration *cf =
	    &((allot__consensus *) arg)->raft.configuration;

	if (cf->n == 0)
		return true;
	for (unsigned i = 0; i < cf->n; i++)
		if (cf->servers[i].id == id)
			return true;
	return false;
}

int
allot__consensus_create(uv_loop_t *loop, const allot__consensus_opts *opts,
    allot__consensus **ret_c)
{
	allot__consensus *c;
	allot__cnode_opts nopts = { 0 };
	int rv;

	if (loop == NULL || opts == NULL || opts->id == 0 ||
	    opts->address == NULL || opts->dir == NULL ||
	    strlen(opts->address) >= ALLOT__CNODE_ADDR_MAX)
		return ALLOT_EINVAL;
	c = calloc(1, sizeof *c);
	if (c == NULL)
		return ALLOT_ENOMEM;
	c->loop = loop;
	c->opts = *opts;
	c->address = strdup(opts->address);
	c->dir = strdup(opts->dir);
	if (c->address == NULL || c->dir == NULL) {
		rv = ALLOT_ENOMEM;
		goto err_free;
	}
	if (c->opts.election_ms == 0)
		c->opts.election_ms = 1000;
	if (c->opts.heartbeat_ms == 0)
		c->opts.heartbeat_ms = c->opts.election_ms / 10 > 0 ?
		    c->opts.election_ms / 10 :
		    1;
	c->tick_ms = c->opts.heartbeat_ms / 2 > 0 ? c->opts.heartbeat_ms / 2 :
	                                            1;
	if (mkdir(c->dir, 0700) != 0 && errno != EEXIST) {
		fail(c, c->dir, strerror(errno));
		rv = ALLOT_EIO;
		goto err_free;
	}
	allot__cfsm_init(&c->fsm, opts->on_apply, opts->ctx);
	c->fsm.on_restore = opts->on_restore;
	if (opts->tls != NULL) {
		allot__raft_tls_opts t = *opts->tls;

		if (t.log == NULL)
			t.log = opts->log;
		t.is_member = in_configuration;
		t.member_arg = c;
		rv = allot__raft_tls_init(&c->tcp, loop, &t);
	} else {
		rv = raft_uv_tcp_init(&c->tcp, loop);
	}
	if (rv != 0) {
		fail(c, "transport",
		    opts->tls != NULL ? c->tcp.errmsg : raft_strerror(rv));
		rv = rv == RAFT_NOMEM ? ALLOT_ENOMEM : ALLOT_EINVAL;
		goto err_free;
	}
	if (allot__caddr_wrap(&c->transport, &c->tcp) != ALLOT_OK) {
		rv = ALLOT_ENOMEM;
		goto err_transport;
	}
	if (opts->bind != NULL) {
		rv = opts->tls != NULL ?
		    allot__raft_tls_set_bind_address(&c->tcp, opts->bind) :
		    raft_uv_tcp_set_bind_address(&c->tcp, opts->bind);
		if (rv != 0) {
			fail(c, opts->bind, raft_strerror(rv));
			rv = ALLOT_EINVAL;
			goto err_transport;
		}
	}
	rv = raft_uv_init(&c->io, loop, c->dir, &c->transport);
	if (rv != 0) {
		fail(c, c->dir, c->io.errmsg);
		rv = ALLOT_EIO;
		goto err_transport;
	}
	rv = raft_init(&c->raft, &c->io, &c->fsm.fsm, opts->id, c->address);
	if (rv != 0) {
		fail(c, "raft_init", raft_errmsg(&c->raft));
		rv = allot__cnode_err(rv);
		goto err_io;
	}
	c->raft.data = c;
	raft_set_election_timeout(&c->raft, c->opts.election_ms);
	raft_set_heartbeat_timeout(&c->raft, c->opts.heartbeat_ms);
	raft_set_snapshot_threshold(&c->raft,
	    opts->snapshot_threshold != 0 ? opts->snapshot_threshold : 1024);
	raft_set_snapshot_trailing(&c->raft,
	    opts->snapshot_trailing != 0 ? opts->snapshot_trailing : 128);
	nopts.lease_ms = opts->lease_ms;
	nopts.drift = opts->drift;
	nopts.on_leader = leader_cb;
	nopts.ctx = c;
	allot__cnode_init(&c->node, &c->raft, &c->fsm, &nopts);
	uv_timer_init(loop, &c->timer);
	c->timer.data = c;
	*ret_c = c;
	return ALLOT_OK;

err_io:
	raft_uv_close(&c->io);
err_transport:
	transport_close(c);
err_free:
	allot__cfsm_finish(&c->fsm);
	free(c->address);
	free(c->dir);
	free(c);
	return rv;
}

int
allot__consensus_bootstrap(
    allot__consensus *c, const allot__cmember *members, size_t n)
{
	struct raft_configuration conf;
	int rv = 0;

	raft_configuration_init(&conf);
	for (size_t i = 0; i < n && rv == 0; i++)
		rv = raft_configuration_add(
		    &conf, members[i].id, members[i].address, RAFT_VOTER);
	if (rv == 0)
		rv = raft_bootstrap(&c->raft, &conf);
	raft_configuration_close(&conf);
	if (rv == RAFT_CANTBOOTSTRAP)
		return ALLOT_OK; /* the dir already has state */
	if (rv != 0) {
		fail(c, "raft_bootstrap", raft_strerror(rv));
		return allot__cnode_err(rv);
	}
	return ALLOT_OK;
}

int
allot__consensus_join(allot__consensus *c)
{
	(void) c;
	return ALLOT_OK;
}

int
allot__consensus_start(allot__consensus *c)
{
	int rv = raft_start(&c->raft);

	if (rv != 0) {
		fail(c, "raft_start", raft_errmsg(&c->raft));
		return ALLOT_EIO;
	}
	uv_timer_start(&c->timer, tick_cb, c->tick_ms, c->tick_ms);
	return ALLOT_OK;
}

static void
closed_one(allot__consensus *c)
{
	void (*cb)(void *) = c->close_cb;
	void *ctx = c->close_ctx;

	if (--c->closing > 0)
		return;
	allot__cfsm_finish(&c->fsm);
	free(c->address);
	free(c->dir);
	free(c);
	if (cb != NULL)
		cb(ctx);
}

static void
timer_closed(uv_handle_t *h)
{
	closed_one(h->data);
}

static void
raft_closed(struct raft *r)
{
	allot__consensus *c = r->data;

	raft_uv_close(&c->io);
	transport_close(c);
	closed_one(c);
}

void
allot__consensus_close(allot__consensus *c, void (*cb)(void *ctx), void *ctx)
{
	if (c == NULL)
		return;
	c->close_cb = cb;
	c->close_ctx = ctx;
	c->closing = 2;
	uv_close((uv_handle_t *) &c->timer, timer_closed);
	raft_close(&c->raft, raft_closed);
}

bool
allot__consensus_may_grant(const allot__consensus *c, uint64_t now)
{
	return allot__cnode_may_grant(&c->node, now);
}

uint64_t
allot__consensus_grant_until(const allot__consensus *c)
{
	return allot__cnode_grant_until(&c->node);
}

uint64_t
allot__consensus_epoch(const allot__consensus *c)
{
	return allot__cnode_epoch(&c->node);
}

bool
allot__consensus_leader(
    const allot__consensus *c, uint64_t *ret_id, const char **ret_address)
{
	return allot__cnode_leader(&c->node, ret_id, ret_address);
}

bool
allot__consensus_is_leader(const allot__consensus *c)
{
	return c->raft.state == RAFT_LEADER;
}

int
allot__consensus_propose_config(allot__consensus *c, const char *text,
    size_t len, uint64_t digest, uint64_t config_epoch, const allot__cwho *who,
    allot__cnode_done_cb done, void *ctx)
{
	allot__centry e = { .type = ALLOT__CENTRY_CONFIG };

	if (who != NULL)
		e.config.who = *who;
	e.config.text = text;
	e.config.text_len = len;
	e.config.digest = digest;
	e.config.config_epoch = config_epoch;
	return allot__cnode_propose(&c->node, &e, done, ctx);
}

int
allot__consensus_propose_usage(allot__consensus *c,
    const allot__row_usage *rows, size_t n, allot__cnode_done_cb done,
    void *ctx)
{
	allot__centry e = { .type = ALLOT__CENTRY_USAGE };

	e.usage.rows = rows;
	e.usage.n = n;
	return allot__cnode_propose(&c->node, &e, done, ctx);
}

int
allot__consensus_propose_events(allot__consensus *c,
    const allot__row_event *rows, size_t n, allot__cnode_done_cb done,
    void *ctx)
{
	allot__centry e = { .type = ALLOT__CENTRY_EVENTS };

	e.events.rows = rows;
	e.events.n = n;
	return allot__cnode_propose(&c->node, &e, done, ctx);
}

int
allot__consensus_propose_audit(allot__consensus *c, const allot__row_audit *a,
    allot__cnode_done_cb done, void *ctx)
{
	allot__centry e = { .type = ALLOT__CENTRY_AUDIT };

	e.audit = *a;
	return allot__cnode_propose(&c->node, &e, done, ctx);
}

int
allot__consensus_hand_over(allot__consensus *c)
{
	return allot__cnode_hand_over(&c->node);
}

int
allot__consensus_propose_account(allot__consensus *c,
    const allot__row_count *rows, size_t n, allot__cnode_done_cb done,
    void *ctx)
{
	allot__centry e = { .type = ALLOT__CENTRY_ACCOUNT };

	e.account.rows = (allot__row_count *) rows;
	e.account.n = n;
	return allot__cnode_propose(&c->node, &e, done, ctx);
}

int
allot__consensus_add_member(
    allot__consensus *c, uint64_t id, const char *address)
{
	return allot__cnode_add_member(&c->node, id, address);
}

int
allot__consensus_remove_member(allot__consensus *c, uint64_t id)
{
	return allot__cnode_remove_member(&c->node, id);
}

int
allot__consensus_leave_state(const allot__consensus *c, uint64_t id)
{
	return allot__cnode_leave_state(&c->node, id);
}

bool
allot__consensus_changing(const allot__consensus *c)
{
	return allot__cnode_changing(&c->node);
}

size_t
allot__consensus_members(
    const allot__consensus *c, allot__cmember *out, size_t cap)
{
	return allot__cnode_members(&c->node, out, cap);
}

const allot__cfsm *
allot__consensus_state(const allot__consensus *c)
{
	return &c->fsm;
}
