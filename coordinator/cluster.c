/* SPDX-License-Identifier: MIT */
/*
 * Member-to-member probing and the view it yields (cluster.h). One
 * request/reply exchange per peer (exchange.h), dialled in the
 * background (nng reconnects by itself); one Probe in flight per peer at
 * a time, with a timeout of two sync intervals (at least 250 ms). Each
 * peer's connections are counted (dial.h's link); the probe timer
 * cancels a probe in flight to a peer that has none left, and a peer that was
 * connected and has none fails its next probe without waiting, so a killed
 * member is down within about one sync interval.
 */
#include "cluster.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>

#include "clock.h"
#include "dial.h"
#include "exchange.h"
#include "protocol.h"

typedef struct peer {
	struct allot__cluster *c;
	const allot__member *m;
	/* The probe (exchange.h), watching the peer's connections: gone
	 * when it is killed. */
	allot__exchange x;
	int result; /* the last probe's outcome */
	/* loop thread */
	uint32_t fails;
	bool down;
	/* under c->mu: probe counts, and what the peer last said (in
	 * either direction) */
	uint64_t last_ok_ns;
	uint64_t probes_ok, probes_failed;
	bool heard;
	uint64_t digest;
	uint64_t epoch;
	bool cut_off;
	bool mismatch_logged;
} peer;

struct allot__cluster {
	allot__cluster_opts o;
	allot__member members[ALLOT__CLUSTER_MAX_MEMBERS];
	peer peers[ALLOT__CLUSTER_MAX_MEMBERS]; /* [self] unused */
	uv_timer_t timer;
	bool timer_init;
	pthread_mutex_t mu;
	bool live[ALLOT__CLUSTER_MAX_MEMBERS]; /* under mu */
	bool cut_off; /* under mu */
	uint64_t view_changes; /* under mu */
	uint64_t moved_total; /* under mu: quotas that changed hands */
};

static uint32_t
probe_timeout_ms(const allot__cluster *c)
{
	return allot__exchange_timeout_ms(c->o.interval_ms);
}

/* ---- what a peer says ---- */

static void
heard_from(allot__cluster *c, size_t i, const Allot__V1__Probe *pr)
{
	peer *p = &c->peers[i];
	uint64_t ours = allot__state_digest(c->o.state);
	bool log_it = false;
	pthread_mutex_lock(&c->mu);
	p->heard = true;
	p->digest = pr->config_digest;
	p->epoch = pr->config_epoch;
	p->cut_off = pr->cut_off;
	if (p->digest != ours && !p->mismatch_logged)
		log_it = p->mismatch_logged = true;
	else if (p->digest == ours)
		p->mismatch_logged = false;
	pthread_mutex_unlock(&c->mu);
	if (!log_it)
		return;
	allot__log(c->o.lg, ALLOT_LOG_ERR, "ALLOTD-CLUSTER-CONFIG-MISMATCH",
	    "member %s runs quota config digest %016" PRIx64 " (epoch %" PRIu64
	    "), this member %016" PRIx64
	    ": members may size the same key differently; deploy one quota "
	    "file to every member",
	    p->m->name, pr->config_digest, pr->config_epoch, ours);
	if (c->o.store != NULL) {
		char detail[160];
		snprintf(detail, sizeof detail,
		    "theirs=%016" PRIx64 " ours=%016" PRIx64,
		    pr->config_digest, ours);
		allot__store_event(
		    c->o.store, "config_mismatch", p->m->name, detail);
	}
}

static void
fill_probe(allot__cluster *c, const char **live, Allot__V1__Probe *pr)
{
	allot__v1__probe__init(pr);
	pr->member = c->members[c->o.self].name;
	pr->config_digest = allot__state_digest(c->o.state);
	pr->config_epoch = allot__state_epoch(c->o.state);
	size_t n = 0;
	pthread_mutex_lock(&c->mu);
	pr->cut_off = c->cut_off;
	for (size_t i = 0; i < c->o.n; i++)
		if (c->live[i])
			live[n++] = c->members[i].name;
	pthread_mutex_unlock(&c->mu);
	pr->n_live = n;
	pr->live = (char **) live;
}

/* An inbound Probe is answered, never believed: the name in it proves
 * nothing (anyone who reaches the port can claim to be a member). What a
 * member says is taken only from the answer to this member's own Probe,
 * sent over the connection it dialed to that member's configured address
 * (with tls+tcp://, to a server whose certificate the CA verified). So a
 * forged Probe can neither change the view nor write log lines and event
 * rows in the member's name. */
void
allot__cluster_on_probe(allot__cluster *c, const Allot__V1__Probe *in,
    ProtobufCAllocator *pa, Allot__V1__Probe *ret)
{
	(void) in;
	const char **live = pa->alloc(
	    pa->allocator_data, ALLOT__CLUSTER_MAX_MEMBERS * sizeof *live);
	if (live == NULL) {
		allot__v1__probe__init(ret);
		ret->member = c->members[c->o.self].name;
		return;
	}
	fill_probe(c, live, ret);
}

/* ---- the loop ---- */

static void
start_probe(allot__cluster *c, peer *p)
{
	const char *live[ALLOT__CLUSTER_MAX_MEMBERS];
	Allot__V1__Probe pr;
	fill_probe(c, live, &pr);
	Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
	env.version = ALLOT__PROTOCOL_VERSION;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_PROBE;
	env.probe = &pr;
	size_t len = allot__v1__envelope__get_packed_size(&env);
	nng_msg *m;
	if (nng_msg_alloc(&m, len) != 0) {
		allot__exchange_fail(&p->x, NNG_ENOMEM);
		return;
	}
	allot__v1__envelope__pack(&env, nng_msg_body(m));
	allot__exchange_send_msg(&p->x, m, probe_timeout_ms(c));
}

/* The outcome of peer `i`'s probe, if it is in: true when one was. */
static bool
finish_probe(allot__cluster *c, size_t i, uint64_t now)
{
	peer *p = &c->peers[i];
	nng_msg *reply;
	if (!allot__exchange_finish(&p->x, &p->result, &reply))
		return false;
	bool ok = false;
	if (p->result == 0) {
		Allot__V1__Envelope *env = allot__v1__envelope__unpack(
		    NULL, nng_msg_len(reply), nng_msg_body(reply));
		ok = env != NULL &&
		    env->body_case == ALLOT__V1__ENVELOPE__BODY_PROBE &&
		    env->probe->member != NULL &&
		    strcmp(env->probe->member, p->m->name) == 0;
		if (ok)
			heard_from(c, i, env->probe);
		else
			allot__log(c->o.lg, ALLOT_LOG_WARNING,
			    "ALLOTD-CLUSTER-BAD-PROBE",
			    "member %s (%s) answered a Probe with something "
			    "else (another process on its address, or a "
			    "different member list)",
			    p->m->name, p->m->url);
		if (env != NULL)
			allot__v1__envelope__free_unpacked(env, NULL);
		nng_msg_free(reply);
	}
	pthread_mutex_lock(&c->mu);
	if (ok) {
		p->last_ok_ns = now;
		p->probes_ok++;
	} else {
		p->probes_failed++;
	}
	pthread_mutex_unlock(&c->mu);
	if (ok) {
		p->fails = 0;
		if (p->down) {
			p->down = false;
			allot__log(c->o.lg, ALLOT_LOG_NOTICE,
			    "ALLOTD-CLUSTER-MEMBER-UP",
			    "member %s (%s) answers probes again", p->m->name,
			    p->m->url);
		}
	} else {
		if (++p->fails >= ALLOT__CLUSTER_DOWN_AFTER && !p->down) {
			p->down = true;
			allot__log(c->o.lg, ALLOT_LOG_WARNING,
			    "ALLOTD-CLUSTER-MEMBER-DOWN",
			    "member %s (%s) missed %u probes in a row (%s)",
			    p->m->name, p->m->url, p->fails,
			    p->result != 0 ? nng_strerror(p->result) :
			                     "bad answer");
		}
	}
	return true;
}

/* Decide the view from the peers' states and hand it to the registry. */
static void
update_view(allot__cluster *c)
{
	bool live[ALLOT__CLUSTER_MAX_MEMBERS];
	size_t up = 0;
	for (size_t i = 0; i < c->o.n; i++) {
		live[i] = i == c->o.self || !c->peers[i].down;
		up += live[i];
	}
	bool cut_off = up < c->o.n / 2 + 1;
	pthread_mutex_lock(&c->mu);
	bool same = cut_off == c->cut_off;
	for (size_t i = 0; i < c->o.n; i++)
		same = same && live[i] == c->live[i];
	bool was_cut = c->cut_off;
	memcpy(c->live, live, sizeof live);
	c->cut_off = cut_off;
	if (!same)
		c->view_changes++;
	pthread_mutex_unlock(&c->mu);
	if (same)
		return;
	uint32_t moved = allot__state_view(c->o.state, live, cut_off);
	pthread_mutex_lock(&c->mu);
	c->moved_total += moved;
	pthread_mutex_unlock(&c->mu);
	char names[512] = "";
	for (size_t i = 0; i < c->o.n; i++)
		if (live[i]) {
			size_t l = strlen(names);
			snprintf(names + l, sizeof names - l, "%s%s",
			    l ? "," : "", c->members[i].name);
		}
	if (cut_off && !was_cut)
		allot__log(c->o.lg, ALLOT_LOG_ERR, "ALLOTD-CLUSTER-CUT-OFF",
		    "only %zu of %zu members reachable (%s): keeping the "
		    "static ownership and granting no increase until a "
		    "majority answers",
		    up, c->o.n, names);
	else
		allot__log(c->o.lg, ALLOT_LOG_NOTICE, "ALLOTD-CLUSTER-VIEW",
		    "live members now %s%s; %u quotas changed hands "
		    "(the ones gained are learnt for one lease)",
		    names, was_cut ? " (majority reached again)" : "", moved);
	if (c->o.store != NULL) {
		char detail[640];
		snprintf(detail, sizeof detail,
		    "live=%s cut_off=%d quotas_moved=%u", names, cut_off,
		    moved);
		allot__store_event(c->o.store, "cluster_view",
		    c->members[c->o.self].name, detail);
	}
}

static void
on_timer(uv_timer_t *t)
{
	allot__cluster *c = t->data;
	uint64_t now = allot__mono_ns();
	bool changed = false;
	for (size_t i = 0; i < c->o.n; i++) {
		if (i == c->o.self)
			continue;
		peer *p = &c->peers[i];
		bool was_down = p->down;
		finish_probe(c, i, now);
		if (allot__exchange_busy(&p->x)) {
			/* In flight, within its timeout; but a peer whose
			 * connection is gone will not answer it. */
			if (allot__exchange_lost(&p->x))
				allot__exchange_cancel(&p->x);
			continue;
		}
		if (allot__exchange_lost(&p->x)) {
			/* Connected once, not now: fails at once. */
			allot__exchange_fail(&p->x, NNG_ECLOSED);
			finish_probe(c, i, now);
		} else {
			start_probe(c, p);
		}
		changed |= was_down != p->down;
	}
	if (changed)
		update_view(c);
}

/* ---- set-up ---- */

static int
peer_open(allot__cluster *c, size_t i)
{
	peer *p = &c->peers[i];
	p->c = c;
	p->m = &c->members[i];
	allot__exchange_opts xo = {
		.reconnect_min_ms = 50,
		.reconnect_max_ms = 500,
		.watch_link = true,
	};
	int rv = allot__exchange_open(&p->x, &xo);
	if (rv != 0)
		return rv;
	return allot__dial(p->x.sock, p->m->url, c->o.tls_ca_file,
	    c->o.tls_cert_key_file, NULL);
}

static void
cluster_free(allot__cluster *c)
{
	for (size_t i = 0; i < c->o.n; i++)
		allot__exchange_close(&c->peers[i].x);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

int
allot__cluster_start(const allot__cluster_opts *o, uv_loop_t *loop, char *err,
    size_t errlen, allot__cluster **ret)
{
	allot__cluster *c = calloc(1, sizeof *c);
	if (c == NULL) {
		snprintf(err, errlen, "out of memory");
		return ALLOT_ENOMEM;
	}
	c->o = *o;
	pthread_mutex_init(&c->mu, NULL);
	uint64_t hashes[ALLOT__CLUSTER_MAX_MEMBERS];
	for (size_t i = 0; i < o->n; i++) {
		c->members[i] = o->members[i];
		hashes[i] = o->members[i].hash;
		c->live[i] = true;
	}
	c->o.members = c->members;
	for (size_t i = 0; i < o->n; i++) {
		if (i == o->self)
			continue;
		int rv = peer_open(c, i);
		if (rv != 0) {
			snprintf(err, errlen,
			    "cannot probe member %s at %s: %s%s",
			    o->members[i].name, o->members[i].url,
			    nng_strerror(rv),
			    rv == NNG_EINVAL ? " (tls+tcp:// members need "
			                       "--tls-ca and --tls-cert)" :
			                       "");
			cluster_free(c);
			return ALLOT_EINVAL;
		}
	}
	allot__state_cluster(o->state, hashes, o->n, o->self);
	uv_timer_init(loop, &c->timer);
	c->timer.data = c;
	c->timer_init = true;
	uint64_t period = o->interval_ms / 2 > 10 ? o->interval_ms / 2 : 10;
	uv_timer_start(&c->timer, on_timer, 0, period);
	*ret = c;
	return ALLOT_OK;
}

static void
timer_closed(uv_handle_t *h)
{
	cluster_free(h->data);
}

void
allot__cluster_stop(allot__cluster *c)
{
	if (c == NULL)
		return;
	uv_timer_stop(&c->timer);
	uv_close((uv_handle_t *) &c->timer, timer_closed);
}

/* ---- rendering ---- */

void
allot__cluster_render_metrics(allot__cluster *c, allot__buf *b)
{
	uint64_t ours = allot__state_digest(c->o.state);
	allot__state_owned ow;
	allot__state_ownership(c->o.state, &ow);
	pthread_mutex_lock(&c->mu);
	allot__buf_puts(b,
	    "# HELP allotd_cluster_member_up 1 while the member answers "
	    "this one's probes (this member: 1).\n"
	    "# TYPE allotd_cluster_member_up gauge\n");
	for (size_t i = 0; i < c->o.n; i++) {
		allot__buf_puts(b, "allotd_cluster_member_up{member=\"");
		allot__buf_label(b, c->members[i].name);
		allot__buf_printf(b, "\"} %d\n", c->live[i] ? 1 : 0);
	}
	allot__buf_puts(b,
	    "# HELP allotd_cluster_config_mismatch 1 when the member's "
	    "quota config digest differs from this one's.\n"
	    "# TYPE allotd_cluster_config_mismatch gauge\n");
	for (size_t i = 0; i < c->o.n; i++) {
		if (i == c->o.self)
			continue;
		const peer *p = &c->peers[i];
		allot__buf_puts(b, "allotd_cluster_config_mismatch{member=\"");
		allot__buf_label(b, c->members[i].name);
		allot__buf_printf(
		    b, "\"} %d\n", p->heard && p->digest != ours ? 1 : 0);
	}
	allot__buf_printf(b,
	    "# HELP allotd_cluster_cut_off 1 while fewer than a majority of "
	    "members answer: no increases, static ownership.\n"
	    "# TYPE allotd_cluster_cut_off gauge\n"
	    "allotd_cluster_cut_off %d\n"
	    "# HELP allotd_cluster_view_changes_total Changes of the set of "
	    "live members.\n"
	    "# TYPE allotd_cluster_view_changes_total counter\n"
	    "allotd_cluster_view_changes_total %" PRIu64 "\n"
	    "# HELP allotd_cluster_quotas_moved_total (service, quota) "
	    "pairs gained or lost by view changes.\n"
	    "# TYPE allotd_cluster_quotas_moved_total counter\n"
	    "allotd_cluster_quotas_moved_total %" PRIu64 "\n"
	    "# HELP allotd_cluster_quotas (service, quota) pairs known, "
	    "owned here, and owned and still learnt.\n"
	    "# TYPE allotd_cluster_quotas gauge\n"
	    "allotd_cluster_quotas{state=\"known\"} %u\n"
	    "allotd_cluster_quotas{state=\"owned\"} %u\n"
	    "allotd_cluster_quotas{state=\"learning\"} %u\n",
	    c->cut_off ? 1 : 0, c->view_changes, c->moved_total, ow.total,
	    ow.owned, ow.learning);
	pthread_mutex_unlock(&c->mu);
}

void
allot__cluster_render_status(allot__cluster *c, allot__buf *b)
{
	uint64_t ours = allot__state_digest(c->o.state);
	allot__state_owned ow;
	allot__state_ownership(c->o.state, &ow);
	uint64_t now = allot__mono_ns();
	pthread_mutex_lock(&c->mu);
	allot__buf_puts(b, "{\"self\":");
	allot__buf_json(b, c->members[c->o.self].name);
	allot__buf_printf(b,
	    ",\"cut_off\":%s,\"view_changes\":%" PRIu64
	    ",\"quotas\":{\"known\":%u,\"owned\":%u,\"learning\":%u},"
	    "\"members\":[",
	    c->cut_off ? "true" : "false", c->view_changes, ow.total, ow.owned,
	    ow.learning);
	for (size_t i = 0; i < c->o.n; i++) {
		const peer *p = &c->peers[i];
		bool self = i == c->o.self;
		allot__buf_puts(b, i ? ",{\"name\":" : "{\"name\":");
		allot__buf_json(b, c->members[i].name);
		allot__buf_puts(b, ",\"url\":");
		allot__buf_json(b, c->members[i].url);
		allot__buf_printf(b, ",\"self\":%s,\"live\":%s",
		    self ? "true" : "false", c->live[i] ? "true" : "false");
		if (self) {
			allot__buf_printf(b,
			    ",\"config_digest\":\"%016" PRIx64
			    "\",\"config_match\":true}",
			    ours);
			continue;
		}
		allot__buf_printf(b,
		    ",\"probes_ok\":%" PRIu64 ",\"probes_failed\":%" PRIu64
		    ",\"last_ok_ms_ago\":",
		    p->probes_ok, p->probes_failed);
		if (p->last_ok_ns != 0)
			allot__buf_printf(
			    b, "%" PRIu64, (now - p->last_ok_ns) / 1000000u);
		else
			allot__buf_puts(b, "null");
		if (p->heard)
			allot__buf_printf(b,
			    ",\"config_digest\":\"%016" PRIx64
			    "\",\"config_epoch\":%" PRIu64
			    ",\"config_match\":%s,\"cut_off\":%s}",
			    p->digest, p->epoch,
			    p->digest == ours ? "true" : "false",
			    p->cut_off ? "true" : "false");
		else
			allot__buf_puts(b,
			    ",\"config_digest\":null,\"config_match\":null}");
	}
	allot__buf_puts(b, "]}");
	pthread_mutex_unlock(&c->mu);
}
