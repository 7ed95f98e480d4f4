/* SPDX-License-Identifier: MIT */
/*
 * allotd: the allot coordinator daemon. main() parses the command line
 * (allotd_opts.c), then starts: it loads the quota config, opens the
 * SQLite store, restores what the last run left live, starts the
 * protocol server (server.c), in a cluster its member (cluster.c: Raft,
 * the fencing gate, the config and usage through the log) and the HTTP
 * endpoints (http.c); then runs a libuv loop on the main thread that
 * owns every periodic duty: expiry sweeps and share recomputation every
 * interval, usage rows and one group commit per second, SIGHUP reloads
 * and the applies of the admin socket (admin.c), each recorded in the
 * audit table, and the SIGTERM/SIGINT drain (stop accepting, let in-flight
 * requests finish, final commit, "stop" event); and last stops, closing
 * whatever was opened, every handle included, with uv_loop_close() == 0.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nng/nng.h>
#include <uv.h>

#include "allotd_int.h"
#include "allotd_opts.h"
#include "state/alloc.h"
#include "dispatch/authn.h"
#include "clock.h"
#include "consensus/cluster.h"
#include "config.h"
#include "config_diff.h"
#include "net/http.h"
#include "log.h"
#include "state/metrics.h"
#include "net/server.h"
#include "state/state.h"
#include "store/store.h"

#define EXIT_USAGE ALLOT__DAEMON_EXIT_USAGE
#define DRAIN_MAX_MS 2000u
#define CONFIG_MAX_BYTES (16u * 1024u * 1024u)

/* Read a whole file (the store keeps the config text as it was read). */
static int
read_file(
    const char *path, char **ret, size_t *ret_len, char *err, size_t errlen)
{
	FILE *f = fopen(path, "rb");
	if (f == NULL) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return errno == ENOENT ? ALLOT_ENOENT : ALLOT_EIO;
	}
	char *buf = NULL;
	size_t len = 0, cap = 0;
	int rc = ALLOT_OK;
	for (;;) {
		if (cap - len < 4096) {
			cap = cap ? cap * 2 : 8192;
			char *nb = realloc(buf, cap + 1);
			if (nb == NULL) {
				snprintf(
				    err, errlen, "%s: out of memory", path);
				rc = ALLOT_ENOMEM;
				goto out;
			}
			buf = nb;
		}
		size_t n = fread(buf + len, 1, cap - len, f);
		len += n;
		if (len > CONFIG_MAX_BYTES) {
			snprintf(err, errlen, "%s: larger than %u bytes", path,
			    CONFIG_MAX_BYTES);
			rc = ALLOT_ECONFIG;
			goto out;
		}
		if (n == 0)
			break;
	}
	if (ferror(f)) {
		snprintf(err, errlen, "%s: read error", path);
		rc = ALLOT_EIO;
		goto out;
	}
	buf[len] = '\0';
	*ret = buf;
	*ret_len = len;
	buf = NULL;
out:
	free(buf);
	fclose(f);
	return rc;
}

/* Load and validate; on success *ret_cfg and *ret_text are the caller's. */
static int
load_config(const char *path, allot_config **ret_cfg, char **ret_text,
    char *err, size_t errlen)
{
	char *text;
	size_t len;
	int rc = read_file(path, &text, &len, err, errlen);
	if (rc != ALLOT_OK)
		return rc;
	allot_config *cfg;
	rc = allot_config_parse(path, text, len, err, errlen, &cfg);
	if (rc != ALLOT_OK) {
		free(text);
		return rc;
	}
	*ret_cfg = cfg;
	*ret_text = text;
	return ALLOT_OK;
}

/* ------------------------------------------------------------------ */
/* loop callbacks                                                      */
/* ------------------------------------------------------------------ */

static int
store_commit(allotd *d)
{
	if (d->store == NULL)
		return ALLOT_OK;
	uint64_t t0 = allot__mono_ns();
	int rc = allot__store_flush(d->store);
	allot__hist_observe_ns(
	    &d->metrics.store_commit, allot__mono_ns() - t0);
	allot__store_stats s;
	allot__store_stats_get(d->store, &s);
	atomic_store(&d->metrics.store_commit_failures, s.commit_failures);
	atomic_store(&d->metrics.store_pending, s.pending);
	atomic_store(&d->metrics.store_rows_dropped, s.rows_dropped);
	atomic_store(&d->metrics.store_rows_written, s.rows_written);
	if (rc != ALLOT_OK)
		allot__log_ratelimited(&d->lg, &d->rl_store, ALLOT_LOG_ERR,
		    "ALLOTD-STORE-FAIL",
		    "group commit failed (SQLite code "
		    "%d, %" PRIu64 " rows queued, %" PRIu64 " failures so "
		    "far); allocating from memory and retrying",
		    s.last_error, s.pending, s.commit_failures);
	return rc;
}

static void
on_tick(uv_timer_t *t)
{
	allotd *d = t->data;
	allot__state_tick(d->state);
	uint64_t now = allot__mono_ns();
	if (now - d->last_second_ns >= 1000000000u) {
		d->last_second_ns = now;
		allot__state_second(d->state);
		store_commit(d);
		allot__peerlimit_stats ps;
		allot__peerlimit_stats_get(d->peerlimit, &ps);
		atomic_store(&d->metrics.peers_tracked, ps.peers);
		atomic_store(&d->metrics.peer_overflow, ps.overflow);
		atomic_store(&d->metrics.peer_connections, ps.bound);
		atomic_store(&d->metrics.peer_bind_refused, ps.bind_refused);
	}
}

static void
reload(allotd *d)
{
	char err[1024];
	allot_config *cfg;
	char *text;
	int rc = load_config(d->config_path, &cfg, &text, err, sizeof err);
	if (rc == ALLOT_OK && d->cluster != NULL) {
		allotd_cluster_reload(d, cfg, text);
		return;
	}
	if (rc != ALLOT_OK) {
		allot__metrics_add(&d->metrics.reloads_failed, 1);
		allot__log(&d->lg, ALLOT_LOG_ERR, "ALLOTD-RELOAD-FAIL",
		    "%s; keeping config epoch %" PRIu64 " (digest %016" PRIx64
		    ")",
		    err, allot__state_epoch(d->state),
		    allot__state_digest(d->state));
		allot__store_event(
		    d->store, "config_rejected", d->config_path, err);
		return;
	}
	bool changed = false;
	uint64_t digest = cfg->digest;
	allot_config *copy = allot__config_dup(cfg);
	rc = copy != NULL ? allot__state_reload(d->state, cfg, d->config_path,
	                        text, &changed) :
	                    ALLOT_ENOMEM;
	if (rc != ALLOT_OK || !changed) {
		free(text);
		allot_config_free(copy);
	} else {
		free(d->text);
		d->text = text;
		allot_config_free(d->cur);
		d->cur = copy;
	}
	if (rc != ALLOT_OK) {
		allot_config_free(cfg);
		allot__metrics_add(&d->metrics.reloads_failed, 1);
		allot__log(&d->lg, ALLOT_LOG_ERR, "ALLOTD-RELOAD-FAIL",
		    "%s: %s; keeping the config in force", d->config_path,
		    allot_strerror(rc));
		return;
	}
	allot__metrics_add(&d->metrics.reloads_ok, 1);
	if (!changed) {
		allot__log(&d->lg, ALLOT_LOG_NOTICE, "ALLOTD-RELOAD-SAME",
		    "%s is unchanged (digest %016" PRIx64
		    "); epoch stays %" PRIu64,
		    d->config_path, digest, allot__state_epoch(d->state));
		return;
	}
	uint64_t epoch = allot__state_epoch(d->state);
	allot__log(&d->lg, ALLOT_LOG_NOTICE, "ALLOTD-RELOAD",
	    "loaded %s: epoch %" PRIu64 ", digest %016" PRIx64
	    "; shares recomputed",
	    d->config_path, epoch, digest);
	char detail[96];
	snprintf(detail, sizeof detail, "epoch=%" PRIu64 " digest=%016" PRIx64,
	    epoch, digest);
	allot__store_event(d->store, "config", d->config_path, detail);
}

/* An apply of the admin socket, on the loop thread: the expected digest,
 * then the file on disk (so that a restart keeps what was applied), then
 * the state, the audit rows and a commit, so that the answer says the
 * audit is on disk. Nothing changes when a step before the state fails;
 * the file is put back when the state refuses. */
static void
admin_apply(allotd *d, allot__admin_job *job)
{
	allot_config *cfg = job->cfg;
	job->prev_epoch = job->epoch = allot__state_epoch(d->state);
	job->prev_digest = job->digest = allot__state_digest(d->state);
	if (d->draining) {
		job->status = 503;
		snprintf(job->msg, sizeof job->msg,
		    "allotd is stopping; nothing was applied");
		return;
	}
	if (d->cluster != NULL &&
	    !(job->has_expect && job->expect != job->digest) &&
	    cfg->digest != job->digest) {
		allotd_cluster_apply(d, job);
		return;
	}
	if (job->has_expect && job->expect != job->digest) {
		job->status = 409;
		snprintf(job->msg, sizeof job->msg,
		    "the config in force is %016" PRIx64 " (epoch %" PRIu64
		    "), not the expected %016" PRIx64
		    ": it changed since; review the diff again. Nothing was "
		    "applied",
		    job->digest, job->epoch, job->expect);
		return;
	}
	if (cfg->digest == job->digest) {
		job->status = 200; /* the same config: not a change */
		return;
	}
	char err[512];
	char *text = malloc(job->len + 1);
	allot_config *copy = allot__config_dup(cfg);
	if (text == NULL || copy == NULL ||
	    allot__config_diff_compute(d->cur, cfg, &job->diff) != ALLOT_OK) {
		snprintf(err, sizeof err, "out of memory");
		goto fail;
	}
	memcpy(text, job->text, job->len);
	text[job->len] = '\0';
	if (allot__admin_write_file(
	        d->config_path, text, job->len, err, sizeof err) != ALLOT_OK)
		goto fail;
	bool changed = false;
	/* The audit's rows from the answer's diff: computed once. */
	int rc = allot__state_apply_diffed(d->state, cfg, d->config_path, text,
	    job->who, 0, d->cur->digest, &job->diff, &changed);
	if (rc != ALLOT_OK) {
		char e2[256];
		if (allot__admin_write_file(d->config_path, d->text,
		        strlen(d->text), e2, sizeof e2) != ALLOT_OK)
			allot__log(&d->lg, ALLOT_LOG_ERR, "ALLOTD-APPLY-FAIL",
			    "%s; %s now differs from the config in force", e2,
			    d->config_path);
		snprintf(err, sizeof err, "cannot install it: %s",
		    allot_strerror(rc));
		goto fail;
	}
	job->cfg = NULL; /* the state's */
	free(d->text);
	d->text = text;
	allot_config_free(d->cur);
	d->cur = copy;
	job->changed = changed;
	job->epoch = allot__state_epoch(d->state);
	job->digest = allot__state_digest(d->state);
	allot__metrics_add(&d->metrics.reloads_ok, 1);
	char detail[512];
	snprintf(detail, sizeof detail,
	    "epoch=%" PRIu64 " digest=%016" PRIx64 " who=%s", job->epoch,
	    job->digest, job->who->who);
	allot__store_event(d->store, "config", d->config_path, detail);
	job->committed = store_commit(d) == ALLOT_OK;
	job->status = 200;
	return;
fail:
	free(text);
	allot_config_free(copy);
	allot__config_diff_free(&job->diff);
	job->status = 500;
	snprintf(
	    job->msg, sizeof job->msg, "%.480s; nothing was applied", err);
	allot__log(&d->lg, ALLOT_LOG_ERR, "ALLOTD-APPLY-FAIL", "%s", job->msg);
}

/* The admin socket's jobs (admin.h), on the loop thread. */
static void
admin_run(void *ctx, allot__admin_job *job)
{
	allotd *d = ctx;
	if (job->op == ALLOT__ADMIN_APPLY) {
		admin_apply(d, job);
		return;
	}
	if (job->op != ALLOT__ADMIN_GET) {
		allotd_admin_member(d, job);
		return;
	}
	job->epoch = allot__state_epoch(d->state);
	job->digest = allot__state_digest(d->state);
	job->path = strdup(d->config_path);
	job->text_out = strdup(d->text);
	job->status = 200;
	if (job->path == NULL || job->text_out == NULL) {
		free(job->path);
		free(job->text_out);
		job->path = job->text_out = NULL;
		job->status = 500;
		snprintf(job->msg, sizeof job->msg, "out of memory");
	}
}

static void
close_cb(uv_handle_t *h)
{
	(void) h;
}

/* Close the loop's timers and signal handlers (once); the loop must run
 * again for the closes to complete. */
static void
close_handles(allotd *d)
{
	if (!d->handles_open)
		return;
	uv_close((uv_handle_t *) &d->tick, close_cb);
	uv_close((uv_handle_t *) &d->drain_timer, close_cb);
	uv_close((uv_handle_t *) &d->sig_term, close_cb);
	uv_close((uv_handle_t *) &d->sig_int, close_cb);
	uv_close((uv_handle_t *) &d->sig_hup, close_cb);
	d->handles_open = false;
}

/* The protocol server (in-flight requests end), the HTTP endpoints and
 * the cluster links; each may already be closed. */
static void
close_listeners(allotd *d)
{
	if (!allot__server_close(d->server))
		d->server_stuck = true;
	d->server = NULL;
	allot__http_stop(d->http);
	d->http = NULL;
	allot__cluster_stop(d->cluster);
	d->cluster = NULL;
	allot__admin_stop(d->admin);
	d->admin = NULL;
}

static void
finish(allotd *d)
{
	uv_timer_stop(&d->drain_timer);
	uv_timer_stop(&d->tick);
	/* A config still being parsed is dropped when its parse ends (the
	 * loop runs until then); the log installs it at the next start. */
	allotd_cluster_install_cancel(d);
	close_listeners(d);
	/* The last partial second of usage, then the stop event, then one
	 * final commit. Sessions stay open in the store: the replicas are
	 * alive, only the coordinator stops; a restart restores them. */
	allot__state_second(d->state);
	char detail[96];
	snprintf(detail, sizeof detail, "signal=%s replicas=%zu",
	    d->stop_signal, allot__state_replicas(d->state));
	allot__store_event(d->store, "stop", NULL, detail);
	store_commit(d);
	allot__log(&d->lg, ALLOT_LOG_NOTICE, "ALLOTD-STOP", "stopped on %s",
	    d->stop_signal);
	close_handles(d);
}

static void
on_drain_timer(uv_timer_t *t)
{
	allotd *d = t->data;
	bool idle = allot__server_idle(d->server);
	if (!idle && allot__mono_ns() < d->drain_deadline_ns)
		return;
	if (!idle)
		allot__log(&d->lg, ALLOT_LOG_WARNING, "ALLOTD-DRAIN",
		    "requests still in flight after %u ms; closing anyway",
		    DRAIN_MAX_MS);
	finish(d);
}

static void
on_signal(uv_signal_t *s, int signum)
{
	allotd *d = s->data;
	if (signum == SIGHUP) {
		if (!d->draining)
			reload(d);
		return;
	}
	if (d->draining) {
		/* A second SIGTERM/SIGINT: stop waiting for requests. */
		d->drain_deadline_ns = 0;
		return;
	}
	d->draining = true;
	d->stop_signal = signum == SIGTERM ? "SIGTERM" : "SIGINT";
	allot__log(&d->lg, ALLOT_LOG_NOTICE, "ALLOTD-DRAIN",
	    "%s: no longer accepting; finishing requests in flight",
	    d->stop_signal);
	allot__server_drain(d->server);
	allot__http_drain(d->http);
	d->drain_deadline_ns = allot__mono_ns() + DRAIN_MAX_MS * 1000000ull;
	uv_timer_start(&d->drain_timer, on_drain_timer, 0, 5);
}

/* ------------------------------------------------------------------ */
/* start, run, stop                                                    */
/* ------------------------------------------------------------------ */

/* The audit rows of the config allotd starts with: every quota, for an
 * empty store (`lrc` ALLOT_ENOENT); what changed since the config the
 * store recorded last (`last_text`), when the file changed while allotd
 * was stopped (a single allotd: `member` false); nothing for an
 * unchanged file. */
static void
audit_start(allotd *d, int lrc, uint64_t last_digest, const char *last_text,
    bool member)
{
	if (lrc == ALLOT_OK && last_digest == d->cur->digest)
		return;
	/* A cluster member's file is the cluster's, rewritten from the
	 * log, whose CONFIG entries are the changes (allotd_cluster_install):
	 * one that differs at start-up is a stale copy the log replaces, not
	 * an edit to record. */
	if (member && lrc == ALLOT_OK)
		return;
	if (lrc != ALLOT_OK && lrc != ALLOT_ENOENT)
		return; /* the store could not say: logged there */
	allot__state_who w = {
		.who = "start",
		.reason = "the first config of an empty store",
		.source = d->config_path,
	};
	allot_config *before = NULL;
	if (lrc == ALLOT_OK) {
		char err[512];
		w.reason = "the file changed while allotd was stopped";
		/* A file the loader no longer takes is diffed as nothing. */
		if (allot_config_parse("(store)", last_text, strlen(last_text),
		        err, sizeof err, &before) != ALLOT_OK)
			before = NULL;
	}
	if (allot__state_audit_start(d->state, before, &w) != ALLOT_OK)
		allot__log(&d->lg, ALLOT_LOG_ERR, "ALLOTD-AUDIT-FAIL",
		    "out of memory: the quotas of epoch %" PRIu64
		    " are not in the audit table",
		    allot__state_epoch(d->state));
	allot_config_free(before);
}

/* The quota config, the store, and the registry with what the last run
 * left live. Returns EXIT_SUCCESS, EXIT_USAGE for a bad quota file, or
 * EXIT_FAILURE. */
static int
open_state(allotd *d, allot__daemon_opts *o)
{
	char err[1024];
	if (load_config(d->config_path, &d->cfg, &d->text, err, sizeof err) !=
	    ALLOT_OK) {
		allot__log(
		    &d->lg, ALLOT_LOG_ERR, "ALLOTD-CONFIG-FAIL", "%s", err);
		return EXIT_USAGE;
	}
	allot__store_opts sto = {
		.retention_s = o->retention_s,
		.max_pending = 1000000,
		.busy_timeout_ms = 50,
	};
	if (allot__store_open(o->db_path, &sto, &d->lg, err, sizeof err,
	        &d->store) != ALLOT_OK) {
		allot__log(
		    &d->lg, ALLOT_LOG_ERR, "ALLOTD-STORE-FAIL", "%s", err);
		return EXIT_FAILURE;
	}
	o->so.store = d->store;
	o->so.lg = &d->lg;
	o->so.metrics = &d->metrics;
	uint64_t last_epoch = 0, last_digest = 0;
	char *last_text = NULL;
	int lrc = allot__store_last_config(
	    d->store, &last_epoch, &last_digest, &last_text);
	if (lrc == ALLOT_OK)
		o->so.epoch = last_digest == d->cfg->digest ? last_epoch :
		                                              last_epoch + 1;
	o->so.max_keys = o->max_keys;
	o->so.conn_open = allot__server_conn_open;
	d->cur = allot__config_dup(d->cfg);
	if (d->cur == NULL ||
	    allot__state_create(&o->so, d->cfg, d->config_path, d->text,
	        &d->state) != ALLOT_OK) {
		free(last_text);
		allot__log(&d->lg, ALLOT_LOG_ERR, "ALLOTD-NOMEM",
		    "cannot create the registry");
		return EXIT_FAILURE;
	}
	d->cfg = NULL; /* the state owns it */
	audit_start(d, lrc, last_digest, last_text, o->raft_id != 0);
	free(last_text);
	/* A Raft member restores when it takes over (cluster.c): the
	 * replicas in its file are the leader's, not its own to expire. */
	if (o->raft_id == 0 && allot__state_restore(d->state) != ALLOT_OK)
		allot__log(&d->lg, ALLOT_LOG_WARNING, "ALLOTD-RESTORE-FAIL",
		    "could not read the replicas of the last run from %s; "
		    "starting with none",
		    o->db_path);
	return EXIT_SUCCESS;
}

/* The event loop with its timers and signal handlers. */
static int
open_loop(allotd *d)
{
	if (uv_loop_init(&d->loop) != 0) {
		allot__log(&d->lg, ALLOT_LOG_ERR, "ALLOTD-LOOP-FAIL",
		    "cannot create the event loop");
		return -1;
	}
	d->loop_open = true;
	uv_timer_init(&d->loop, &d->tick);
	uv_timer_init(&d->loop, &d->drain_timer);
	uv_signal_init(&d->loop, &d->sig_term);
	uv_signal_init(&d->loop, &d->sig_int);
	uv_signal_init(&d->loop, &d->sig_hup);
	d->handles_open = true;
	d->tick.data = d->drain_timer.data = d;
	d->sig_term.data = d->sig_int.data = d->sig_hup.data = d;
	uv_signal_start(&d->sig_term, on_signal, SIGTERM);
	uv_signal_start(&d->sig_int, on_signal, SIGINT);
	uv_signal_start(&d->sig_hup, on_signal, SIGHUP);
	return 0;
}

/* The cluster links, the per-peer budgets, the protocol server and the
 * HTTP endpoints, in that order (the server needs the first two). */
static int
start_listeners(allotd *d, const allot__daemon_opts *o)
{
	char err[1024];
	allot__server_opts svo;
	allot__server_opts_init(&svo);
	svo.urls = o->urls;
	svo.nurls = o->nurls;
	svo.workers = o->workers;
	svo.max_keys = o->max_keys;
	svo.state = d->state;
	svo.metrics = &d->metrics;
	svo.lg = &d->lg;
	svo.tls_cert_key_file = o->tls_cert;
	svo.tls_key_file = o->tls_key;
	svo.tls_ca_file = o->tls_ca;
	allot__raft_tls_opts tls = {
		.cert_key_file = o->tls_cert,
		.key_file = o->tls_key,
		.ca_file = o->tls_ca,
		.member_id = o->raft_member_id,
		/* A vanished peer noticed after a few election timeouts. */
		.user_timeout_ms = 4 *
		    (o->election_ms != 0 ? o->election_ms : 1000),
		.log = &d->lg,
	};
	if (o->raft_id != 0) {
		allot__cluster_opts co = {
			.id = o->raft_id,
			.raft_addr = o->raft_addr,
			.agent_url = o->agent_url,
			.dir = o->raft_dir,
			.seeds = o->nseeds > 0 ? o->seeds : NULL,
			.nseeds = o->nseeds,
			.election_ms = o->election_ms,
			.snapshot_entries = o->snapshot_entries,
			.tls = o->tls_cert != NULL && o->tls_ca != NULL ?
			    &tls :
			    NULL,
			.state = d->state,
			.store = d->store,
			.lg = &d->lg,
			.on_config = allotd_cluster_install,
			.config_busy = allotd_cluster_installing,
			.on_serving = allotd_cluster_serving,
			.ctx = d,
		};
		if (allot__cluster_start(&co, &d->loop, err, sizeof err,
		        &d->cluster) != ALLOT_OK) {
			allot__log(&d->lg, ALLOT_LOG_ERR,
			    "ALLOTD-CLUSTER-FAIL", "%s", err);
			return -1;
		}
		svo.cluster = d->cluster;
	}
	svo.authn = o->authn;
	bool pl_oom;
	d->peerlimit = allot__peerlimit_create(&o->plo, &pl_oom);
	if (pl_oom) {
		allot__log(&d->lg, ALLOT_LOG_ERR, "ALLOTD-LISTEN-FAIL",
		    "out of memory for a table of %u peers", o->plo.capacity);
		return -1;
	}
	svo.peerlimit = d->peerlimit;
	if (allot__server_start(&svo, err, sizeof err, &d->server) !=
	    ALLOT_OK) {
		allot__log(
		    &d->lg, ALLOT_LOG_ERR, "ALLOTD-LISTEN-FAIL", "%s", err);
		return -1;
	}
	allot__admin_opts ado = {
		.path = o->admin_socket,
		.group = o->admin_group,
		.tls = {
			.listen = o->admin_listen,
			.cert_key = o->tls_cert,
			.key = o->tls_key,
			.ca = o->admin_ca,
			.allow = o->admin_allow,
			.nallow = o->nadmin_allow,
		},
		.loop = &d->loop,
		.run = admin_run,
		.ctx = d,
		.lg = &d->lg,
	};
	if ((o->admin_socket != NULL || o->admin_listen != NULL) &&
	    allot__admin_start(&ado, err, sizeof err, &d->admin) != ALLOT_OK) {
		allot__log(
		    &d->lg, ALLOT_LOG_ERR, "ALLOTD-LISTEN-FAIL", "%s", err);
		return -1;
	}
	/* HTTP last: once /healthz answers, the admin socket does too (a
	 * script that waits for /healthz, then runs allotctl, raced it). */
	if (o->http_addr != NULL &&
	    allot__http_start(o->http_addr, &o->http_lim, d->state,
	        &d->metrics, d->cluster, &d->lg, err, sizeof err,
	        &d->http) != ALLOT_OK) {
		allot__log(
		    &d->lg, ALLOT_LOG_ERR, "ALLOTD-LISTEN-FAIL", "%s", err);
		return -1;
	}
	return 0;
}

/* "a,b,c" into buf. */
static void
join_names(const char *const *names, size_t n, char *buf, size_t len)
{
	buf[0] = '\0';
	for (size_t i = 0; i < n; i++) {
		size_t l = strlen(buf);
		snprintf(buf + l, len - l, "%s%s", i ? "," : "", names[i]);
	}
}

/* The "start" event (committed at once) and the start-up log lines. */
static void
announce(allotd *d, const allot__daemon_opts *o)
{
	char listen_list[512];
	join_names(o->urls, o->nurls, listen_list, sizeof listen_list);
	const char *http = o->http_addr != NULL ? o->http_addr : "off";
	char detail[2048];
	snprintf(detail, sizeof detail,
	    "version=%s pid=%ld listen=%s "
	    "http=%s admin=%s admin_https=%s epoch=%" PRIu64
	    " digest=%016" PRIx64,
	    ALLOT_VERSION_STRING, (long) getpid(), listen_list, http,
	    o->admin_socket != NULL ? o->admin_socket : "off",
	    o->admin_listen != NULL ? o->admin_listen : "off",
	    allot__state_epoch(d->state), allot__state_digest(d->state));
	if (o->raft_id != 0) {
		size_t l = strlen(detail);
		snprintf(detail + l, sizeof detail - l,
		    " raft_id=%" PRIu64 " raft=%s agent_url=%s", o->raft_id,
		    o->raft_addr, o->agent_url);
		allot__log(&d->lg, ALLOT_LOG_NOTICE, "ALLOTD-CLUSTER",
		    "member %" PRIu64 " at %s (%s; agents: %s), log in %s; %s",
		    o->raft_id, o->raft_addr,
		    o->tls_cert != NULL && o->tls_ca != NULL ?
		        "mutual TLS between members" :
		        "plain TCP between members",
		    o->agent_url, o->raft_dir,
		    o->join ? "waiting to be added by the leader" :
		              "seeded as a new cluster (ignored when the log "
		              "has state)");
	}
	allot__store_event(d->store, "start", NULL, detail);
	store_commit(d);
	const allot__state_opts *so = &o->so;
	const allot__peerlimit_opts *plo = &o->plo;
	allot__log(&d->lg, ALLOT_LOG_NOTICE, "ALLOTD-START",
	    "allotd %s listening on %s, HTTP on %s; config %s epoch %" PRIu64
	    " digest %016" PRIx64 "; store %s; lease %u ms, interval %u ms, "
	    "expiry after %u intervals, %u workers; per peer %g "
	    "Registers/s (burst %g), %g messages/s (burst %g), 0 = off",
	    ALLOT_VERSION_STRING, listen_list, http, d->config_path,
	    allot__state_epoch(d->state), allot__state_digest(d->state),
	    o->db_path, so->lease_ms, so->interval_ms, so->expiry_intervals,
	    o->workers, plo->register_rate, plo->register_burst,
	    plo->message_rate, plo->message_burst);
}

/* Everything up to the loop. Returns EXIT_SUCCESS when allotd is up, or
 * the exit status (what failed is logged); stop() closes what was
 * opened either way. */
/* Every agent pipe, store file and HTTP connection is a descriptor; the
 * HTTP listener is capped (--http-max-connections) so that the rest
 * belong to the sync port. Take the hard limit, not the shell's soft
 * 1,024, so that cap is what binds. */
static void
raise_fd_limit(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		(void) setrlimit(RLIMIT_NOFILE, &rl);
	}
}

static int
start(allotd *d, allot__daemon_opts *o)
{
	signal(SIGPIPE, SIG_IGN);
	raise_fd_limit();
	d->stop_signal = "?";
	d->rl_store = (allot__logrl) ALLOT__LOGRL_INIT(3, 10000);
	d->config_path = o->config_path;
	d->log_format = o->log_format;
	d->lg = (allot__logger) {
		.fn = allot__log_stderr,
		.ctx = &d->log_format,
		.level = o->log_level,
	};
	allot__metrics_init(&d->metrics);
	d->metrics.start_wall_ms = (uint64_t) allot__wall_ms();
	int rc = open_state(d, o);
	if (rc != EXIT_SUCCESS)
		return rc;
	if (open_loop(d) != 0 || start_listeners(d, o) != 0)
		return EXIT_FAILURE;
	announce(d, o);
	return EXIT_SUCCESS;
}

/* The loop, until the drain (finish()) has closed every handle. */
static int
run(allotd *d, const allot__daemon_opts *o)
{
	d->last_second_ns = allot__mono_ns();
	uv_timer_start(
	    &d->tick, on_tick, o->so.interval_ms, o->so.interval_ms);
	if (uv_run(&d->loop, UV_RUN_DEFAULT) != 0) {
		allot__log(&d->lg, ALLOT_LOG_ERR, "ALLOTD-LOOP-FAIL",
		    "event loop ended with active handles");
		return EXIT_FAILURE;
	}
	return EXIT_SUCCESS;
}

/* Close whatever is still open (on the error paths nothing ran yet) and
 * return the exit status: `exit_code`, or EXIT_FAILURE when the loop
 * does not close cleanly. */
static int
stop(allotd *d, allot__daemon_opts *o, int exit_code)
{
	close_listeners(d);
	/* After the server: it was the budgets' only user. */
	if (!d->server_stuck)
		allot__peerlimit_destroy(d->peerlimit);
	d->peerlimit = NULL;
	if (d->handles_open) {
		close_handles(d);
		uv_run(&d->loop, UV_RUN_DEFAULT);
	}
	int rv;
	if (d->loop_open && (rv = uv_loop_close(&d->loop)) != 0) {
		allot__log(&d->lg, ALLOT_LOG_ERR, "ALLOTD-LOOP-FAIL",
		    "uv_loop_close: %s", uv_strerror(rv));
		exit_code = EXIT_FAILURE;
	}
	allot__state_destroy(d->state);
	allot__store_close(d->store);
	allot_config_free(d->cfg);
	allot_config_free(d->cur);
	free(d->text);
	allot__authn_free(o->authn);
	if (d->server_stuck) {
		/* nng_fini() and the exit handler nng registered would wait
		 * for the socket that did not close: everything of ours is
		 * closed and committed, so end here. */
		fflush(NULL);
		_exit(exit_code);
	}
	nng_fini();
	return exit_code;
}

int
main(int argc, char **argv)
{
	static allot__daemon_opts o;
	int rc = allot__daemon_parse(argc, argv, &o);
	if (rc >= 0)
		return rc;
	static allotd d;
	rc = start(&d, &o);
	if (rc == EXIT_SUCCESS)
		rc = run(&d, &o);
	return stop(&d, &o, rc);
}
