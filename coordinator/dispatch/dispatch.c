/* SPDX-License-Identifier: MIT */
/*
 * The transport-free dispatcher (dispatch.h), in the order a request
 * meets it: refusals that need no decoding (draining, the sender's
 * message budget, the size), the decoding and the version, then one step
 * per kind of message, then the answer. Each step either fills the answer
 * body or leaves an Error code and its text in the result; the last one
 * turns a code into the Error answer, counts it (unless the registry or
 * the verifier already did) and packs.
 *
 * In a cluster (cluster.h), Register, Sync and Leave reach the registry
 * only through the fencing gate: a member that may not allocate now
 * answers NOT_LEADER with the leader's agent URL and every member's, and
 * every Welcome and Reply carries the epoch and the members from the same
 * view the gate read. Members no longer probe each other: a Probe is
 * answered MALFORMED (the message stays in the schema so that old peers
 * decode the answer).
 */
#include "dispatch.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "authn.h"
#include "hash.h"
#include "consensus/cluster.h"

#define OK ALLOT__V1__ERROR__CODE__UNSPECIFIED

/* The answer being built: the Envelope and the bodies it may point to. */
typedef struct answer {
	Allot__V1__Envelope env;
	Allot__V1__Welcome welcome;
	Allot__V1__Reply reply;
	Allot__V1__Grant grant;
	Allot__V1__Error error;
	/* The cluster's view, when the gate was asked. */
	const allot__cluster_view *view;
	/* The registry or the verifier counted the rejection itself. */
	bool counted;
} answer;

void
allot__dispatch_ctx_init(allot__dispatch_ctx *c)
{
	memset(c, 0, sizeof *c);
	c->max_msg = ALLOT__DISPATCH_MAX_MSG;
	c->max_reports = ALLOT__DISPATCH_MAX_REPORTS;
	c->max_keys = ALLOT__DISPATCH_MAX_KEYS;
}

const char *
allot__dispatch_body_name(Allot__V1__Envelope__BodyCase c)
{
	switch (c) {
	case ALLOT__V1__ENVELOPE__BODY_REGISTER: return "Register";
	case ALLOT__V1__ENVELOPE__BODY_WELCOME: return "Welcome";
	case ALLOT__V1__ENVELOPE__BODY_SYNC: return "Sync";
	case ALLOT__V1__ENVELOPE__BODY_REPLY: return "Reply";
	case ALLOT__V1__ENVELOPE__BODY_LEAVE: return "Leave";
	case ALLOT__V1__ENVELOPE__BODY_ERROR: return "Error";
	case ALLOT__V1__ENVELOPE__BODY_PROBE: return "Probe";
	case ALLOT__V1__ENVELOPE__BODY_ASK: return "Ask";
	case ALLOT__V1__ENVELOPE__BODY_GRANT: return "Grant";
	default: return "nothing";
	}
}

static allot__reject
reason_of(Allot__V1__Error__Code c)
{
	switch (c) {
	case ALLOT__V1__ERROR__CODE__VERSION: return ALLOT__REJ_VERSION;
	case ALLOT__V1__ERROR__CODE__MALFORMED: return ALLOT__REJ_MALFORMED;
	case ALLOT__V1__ERROR__CODE__UNKNOWN_SESSION:
		return ALLOT__REJ_UNKNOWN_SESSION;
	case ALLOT__V1__ERROR__CODE__STALE_SEQ: return ALLOT__REJ_STALE_SEQ;
	case ALLOT__V1__ERROR__CODE__TOO_LARGE: return ALLOT__REJ_TOO_LARGE;
	case ALLOT__V1__ERROR__CODE__SHUTTING_DOWN:
		return ALLOT__REJ_SHUTTING_DOWN;
	case ALLOT__V1__ERROR__CODE__RATE_LIMITED: return ALLOT__REJ_CAPACITY;
	case ALLOT__V1__ERROR__CODE__UNAUTHENTICATED:
		return ALLOT__REJ_IDENTITY_INVALID;
	case ALLOT__V1__ERROR__CODE__NOT_LEADER: return ALLOT__REJ_NOT_LEADER;
	default: return ALLOT__REJ_MALFORMED;
	}
}

/* Take one token of the sender's `budget`. False, with the result's
 * code, reason and text set, when it is spent. */
static bool
admit(const allot__dispatch_ctx *c, const allot__dispatch_req *req,
    allot__peer_budget budget, allot__dispatch_result *res)
{
	if (allot__peerlimit_admit(c->peerlimit, req->pipe, req->peer, budget,
	        req->now, res->err, sizeof res->err))
		return true;
	res->code = ALLOT__V1__ERROR__CODE__RATE_LIMITED;
	res->reason = budget == ALLOT__PEER_REGISTER ?
	    ALLOT__REJ_PEER_REGISTER_RATE :
	    ALLOT__REJ_PEER_MESSAGE_RATE;
	return false;
}

/* A Sync refused by its peer's message budget still proves that its
 * session's agent is alive (docs/reliability.md, "Adversary"): a flood
 * from the same address as an honest agent must throttle the agent, not
 * expire it. The Sync is decoded only to find its session, which is
 * touched when the Sync came over the session's own connection; nothing
 * of it is booked. */
static void
still_alive(const allot__dispatch_ctx *c, const allot__dispatch_req *req)
{
	if (c->state == NULL || req->len > c->max_msg)
		return;
	Allot__V1__Envelope *in = allot__v1__envelope__unpack(
	    req->pa, req->len, req->buf);
	if (in == NULL)
		return;
	if (in->version == ALLOT__PROTOCOL_VERSION &&
	    in->body_case == ALLOT__V1__ENVELOPE__BODY_SYNC &&
	    allot__state_alive(c->state, in->sync->session, req->pipe) &&
	    c->metrics != NULL)
		allot__metrics_add(&c->metrics->throttled_alive, 1);
	allot__v1__envelope__free_unpacked(in, req->pa);
}

/* Everything before a message's kind matters: the refusals that need no
 * decoding, then the decoding and the version. The decoded request, or
 * NULL with the result's code set. */
static Allot__V1__Envelope *
open_request(const allot__dispatch_ctx *c, const allot__dispatch_req *req,
    allot__dispatch_result *res)
{
	if (req->draining) {
		res->code = ALLOT__V1__ERROR__CODE__SHUTTING_DOWN;
		snprintf(res->err, sizeof res->err,
		    "the coordinator is shutting down; "
		    "retry on another or after it restarts");
		return NULL;
	}
	if (!admit(c, req, ALLOT__PEER_MESSAGE, res)) {
		still_alive(c, req);
		return NULL;
	}
	if (req->len > c->max_msg) {
		res->code = ALLOT__V1__ERROR__CODE__TOO_LARGE;
		snprintf(res->err, sizeof res->err,
		    "message of %zu bytes is above the limit of %zu", req->len,
		    c->max_msg);
		return NULL;
	}
	Allot__V1__Envelope *in = allot__v1__envelope__unpack(
	    req->pa, req->len, req->buf);
	if (in == NULL) {
		res->code = ALLOT__V1__ERROR__CODE__MALFORMED;
		snprintf(res->err, sizeof res->err,
		    "could not decode an Envelope from %zu bytes", req->len);
		return NULL;
	}
	res->request = in;
	if (in->version != ALLOT__PROTOCOL_VERSION) {
		res->code = ALLOT__V1__ERROR__CODE__VERSION;
		snprintf(res->err, sizeof res->err,
		    "protocol version %" PRIu32 " is not "
		    "supported; this coordinator speaks version %u",
		    in->version, ALLOT__PROTOCOL_VERSION);
		return NULL;
	}
	return in;
}

static void
on_register(const allot__dispatch_ctx *c, const allot__dispatch_req *req,
    const Allot__V1__Register *reg, answer *a, allot__dispatch_result *res)
{
	if (!admit(c, req, ALLOT__PEER_REGISTER, res))
		return;
	if (reg->n_keys > c->max_keys) {
		res->code = ALLOT__V1__ERROR__CODE__TOO_LARGE;
		snprintf(res->err, sizeof res->err,
		    "%zu keys in Register; at most %u", reg->n_keys,
		    c->max_keys);
		return;
	}
	if (c->authn != NULL &&
	    (res->code = allot__authn_check(c->authn, reg, c->metrics,
	         res->err, sizeof res->err)) != OK) {
		a->counted = true;
		return;
	}
	res->code = allot__state_register_from(c->state, reg, req->pipe,
	    req->peer != NULL ? allot__peer_id(req->peer) : 0, req->pa,
	    &a->welcome, res->err, sizeof res->err);
	a->counted = true;
	/* A connection that registered (with a verifier: proved its
	 * identity) spends the message budget of the connections of its
	 * address registered as its service (peerlimit.h). */
	if (res->code == OK)
		allot__peerlimit_bind(c->peerlimit, req->pipe, req->peer,
		    allot__hash(reg->service, strlen(reg->service), 0),
		    req->now);
	a->env.body_case = ALLOT__V1__ENVELOPE__BODY_WELCOME;
	a->env.welcome = &a->welcome;
}

static void
on_sync(const allot__dispatch_ctx *c, const allot__dispatch_req *req,
    const Allot__V1__Sync *sync, answer *a, allot__dispatch_result *res)
{
	if (sync->n_reports > c->max_reports) {
		res->code = ALLOT__V1__ERROR__CODE__TOO_LARGE;
		snprintf(res->err, sizeof res->err,
		    "%zu reports in Sync; at most %u", sync->n_reports,
		    c->max_reports);
		return;
	}
	/* The session's keys in all are checked under the state's lock
	 * (Register's and every add_keys'); a list longer than a Register
	 * may be is refused before. */
	if (sync->n_add_keys > c->max_keys) {
		res->code = ALLOT__V1__ERROR__CODE__TOO_LARGE;
		snprintf(res->err, sizeof res->err,
		    "%zu add_keys in Sync; at most %u", sync->n_add_keys,
		    c->max_keys);
		return;
	}
	res->code = allot__state_sync_on(c->state, sync, req->pipe, req->pa,
	    &a->reply, res->err, sizeof res->err);
	a->counted = true;
	a->env.body_case = ALLOT__V1__ENVELOPE__BODY_REPLY;
	a->env.reply = &a->reply;
}

static void
on_ask(const allot__dispatch_ctx *c, const allot__dispatch_req *req,
    const Allot__V1__Ask *ask, answer *a, allot__dispatch_result *res)
{
	if (ask->n_keys > c->max_reports) {
		res->code = ALLOT__V1__ERROR__CODE__TOO_LARGE;
		snprintf(res->err, sizeof res->err,
		    "%zu keys in Ask; at most %u", ask->n_keys,
		    c->max_reports);
		return;
	}
	res->code = allot__state_ask_on(c->state, ask, req->pipe, req->pa,
	    &a->grant, res->err, sizeof res->err);
	a->counted = true;
	a->env.body_case = ALLOT__V1__ENVELOPE__BODY_GRANT;
	a->env.grant = &a->grant;
}

static void
on_leave(const allot__dispatch_ctx *c, const allot__dispatch_req *req,
    const Allot__V1__Leave *leave, answer *a, allot__dispatch_result *res)
{
	res->code = allot__state_leave_on(
	    c->state, leave, req->pipe, &a->reply, res->err, sizeof res->err);
	a->counted = true;
	a->env.body_case = ALLOT__V1__ENVELOPE__BODY_REPLY;
	a->env.reply = &a->reply;
}

/* The cluster's fencing gate: true when the request may reach the
 * registry. Otherwise the answer is NOT_LEADER with where to go. */
static bool
gate(const allot__dispatch_ctx *c, answer *a, allot__dispatch_result *res)
{
	if (c->cluster == NULL)
		return true;
	if (allot__cluster_gate(c->cluster, &a->view))
		return true;
	res->code = ALLOT__V1__ERROR__CODE__NOT_LEADER;
	a->error.leader = (char *) (a->view->leader != NULL ? a->view->leader :
	                                                      "");
	a->error.n_members = a->view->nmembers;
	a->error.members = a->view->members;
	snprintf(res->err, sizeof res->err,
	    "this member does not allocate now (epoch %" PRIu64
	    "); the leader is %s",
	    a->view->epoch,
	    a->view->leader != NULL ? a->view->leader :
	                              "not known yet: try another member");
	return false;
}

/* Welcome and Reply carry the epoch and the members the gate saw. */
static void
stamp(answer *a)
{
	if (a->view == NULL)
		return;
	a->welcome.epoch = a->reply.epoch = a->grant.epoch = a->view->epoch;
	a->welcome.n_members = a->reply.n_members = a->view->nmembers;
	a->welcome.members = a->reply.members = a->view->members;
}

/* Hand a decoded request of the right version to its step. */
static void
route(const allot__dispatch_ctx *c, const allot__dispatch_req *req,
    const Allot__V1__Envelope *in, answer *a, allot__dispatch_result *res)
{
	switch (in->body_case) {
	case ALLOT__V1__ENVELOPE__BODY_REGISTER:
		if (gate(c, a, res))
			on_register(c, req, in->register_, a, res);
		break;
	case ALLOT__V1__ENVELOPE__BODY_SYNC:
		if (gate(c, a, res))
			on_sync(c, req, in->sync, a, res);
		break;
	case ALLOT__V1__ENVELOPE__BODY_LEAVE:
		if (gate(c, a, res))
			on_leave(c, req, in->leave, a, res);
		break;
	case ALLOT__V1__ENVELOPE__BODY_ASK:
		if (gate(c, a, res))
			on_ask(c, req, in->ask, a, res);
		break;
	default:
		res->code = ALLOT__V1__ERROR__CODE__MALFORMED;
		snprintf(res->err, sizeof res->err,
		    "an agent may send Register, Sync, Ask or Leave, not %s%s",
		    allot__dispatch_body_name(in->body_case),
		    in->body_case == ALLOT__V1__ENVELOPE__BODY_PROBE ?
		        " (members no longer probe each other: they run "
		        "Raft, docs/operations.md)" :
		        "");
		break;
	}
	if (res->code == OK)
		stamp(a);
}

/* Turn a refusal into the Error answer and count it, then pack the
 * answer into the request's allocator. */
static int
finish(const allot__dispatch_ctx *c, const allot__dispatch_req *req, answer *a,
    allot__dispatch_result *res)
{
	if (res->code != OK) {
		if (res->reason == ALLOT__REJ_COUNT)
			res->reason = reason_of(res->code);
		if (!a->counted)
			allot__metrics_reject(c->metrics, res->reason, 1);
		a->error.code = res->code;
		a->error.message = res->err;
		a->env.body_case = ALLOT__V1__ENVELOPE__BODY_ERROR;
		a->env.error = &a->error;
	}
	size_t n = allot__v1__envelope__get_packed_size(&a->env);
	uint8_t *buf = req->pa->alloc(req->pa->allocator_data, n > 0 ? n : 1);
	if (buf == NULL)
		return ALLOT_ENOMEM;
	allot__v1__envelope__pack(&a->env, buf);
	res->answer = buf;
	res->answer_len = n;
	return ALLOT_OK;
}

int
allot__dispatch(const allot__dispatch_ctx *c, const allot__dispatch_req *req,
    allot__dispatch_result *ret)
{
	answer a = {
		.env = ALLOT__V1__ENVELOPE__INIT,
		.welcome = ALLOT__V1__WELCOME__INIT,
		.reply = ALLOT__V1__REPLY__INIT,
		.grant = ALLOT__V1__GRANT__INIT,
		.error = ALLOT__V1__ERROR__INIT,
		.view = NULL,
		.counted = false,
	};
	a.env.version = ALLOT__PROTOCOL_VERSION;
	ret->answer = NULL;
	ret->answer_len = 0;
	ret->request = NULL;
	ret->code = OK;
	ret->reason = ALLOT__REJ_COUNT;
	ret->err[0] = '\0';
	const Allot__V1__Envelope *in = open_request(c, req, ret);
	if (in != NULL)
		route(c, req, in, &a, ret);
	return finish(c, req, &a, ret);
}
