/* SPDX-License-Identifier: MIT */
/*
 * allotd's part in a Raft cluster (allotd_int.h): the config the cluster
 * commits, installed by every member (parsed on libuv's thread pool,
 * installed on the loop, one at a time), what the leader proposes
 * (its first file, SIGHUP, allotctl apply), and allotctl member.
 */
#include "allotd_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "config_diff.h"

/* A committed config on its way in: its text and author (copies), and
 * what the worker made of them. */
struct allotd_install {
	uv_work_t work;
	allotd *d;
	char *text;
	size_t len;
	uint64_t epoch;
	bool has_who;
	char *who[4]; /* who, claimed_as, reason, source */
	/* The worker's: the parsed config and a copy of it (the state
	 * takes one, allotd keeps the other to diff applies against), or
	 * NULL with `err`; and, when `diffed`, the audit's diff from the
	 * config in force (of digest `from`). */
	allot_config *cfg, *cur;
	bool diffed;
	uint64_t from;
	allot__config_diff diff;
	char err[1024];
	bool cancelled;
};

static void
install_free(struct allotd_install *j)
{
	if (j == NULL)
		return;
	free(j->text);
	for (int i = 0; i < 4; i++)
		free(j->who[i]);
	allot_config_free(j->cfg);
	allot_config_free(j->cur);
	allot__config_diff_free(&j->diff);
	free(j);
}

static bool
dup_opt(const char *s, char **ret)
{
	*ret = s != NULL ? strdup(s) : NULL;
	return s == NULL || *ret != NULL;
}

static struct allotd_install *
install_new(allotd *d, const char *text, size_t len, uint64_t epoch,
    const allot__state_who *who)
{
	struct allotd_install *j = calloc(1, sizeof *j);
	if (j == NULL)
		return NULL;
	j->d = d;
	j->len = len;
	j->epoch = epoch;
	j->work.data = j;
	j->text = malloc(len + 1);
	bool ok = j->text != NULL;
	if (ok) {
		memcpy(j->text, text, len);
		j->text[len] = '\0';
	}
	if (ok && who != NULL) {
		j->has_who = true;
		ok = dup_opt(who->who, &j->who[0]) &&
		    dup_opt(who->claimed_as, &j->who[1]) &&
		    dup_opt(who->reason, &j->who[2]) &&
		    dup_opt(who->source, &j->who[3]);
	}
	if (!ok) {
		install_free(j);
		return NULL;
	}
	return j;
}

/* On the thread pool: the parse and the audit's diff, which take about
 * 0.4 and 0.6 s for 59,001 quotas over 9,001, and the copy. Reads the
 * config path, which never changes, and the config in force, which only
 * an install replaces (on the loop, one at a time: never meanwhile). */
static void
install_parse(uv_work_t *w)
{
	struct allotd_install *j = w->data;
	if (allot_config_parse(j->d->config_path, j->text, j->len, j->err,
	        sizeof j->err, &j->cfg) != ALLOT_OK)
		return;
	j->cur = allot__config_dup(j->cfg);
	if (j->cur == NULL) {
		snprintf(
		    j->err, sizeof j->err, "%s", allot_strerror(ALLOT_ENOMEM));
		return;
	}
	/* Without it (out of memory) the state computes the diff itself. */
	j->from = j->d->cur->digest;
	j->diffed = allot__config_diff_compute(j->d->cur, j->cfg, &j->diff) ==
	    ALLOT_OK;
}

/* On the loop: the state takes the parsed config with the cluster's
 * epoch, and the quota file becomes its text, so that a restart (or a
 * member that becomes leader) starts from what the cluster agreed. */
static void
install_apply(allotd *d, struct allotd_install *j)
{
	char err[1024];
	uint64_t epoch = j->epoch;
	size_t len = j->len;
	const allot__state_who w = { .who = j->who[0],
		.claimed_as = j->who[1],
		.reason = j->who[2],
		.source = j->who[3] };
	const allot__state_who *who = j->has_who ? &w : NULL;
	if (j->cfg == NULL || j->cur == NULL) {
		allot__log(&d->lg, ALLOT_LOG_ERR, "ALLOTD-CONFIG-FAIL",
		    "the committed config of epoch %" PRIu64
		    " does not load here (%s): keeping epoch %" PRIu64,
		    epoch, j->err, allot__state_epoch(d->state));
		return;
	}
	/* Ours from here on. */
	allot_config *cfg = j->cfg, *cur = j->cur;
	char *copy_text = j->text;
	j->cfg = j->cur = NULL;
	j->text = NULL;
	/* A restart replays the log: a config older than the one this
	 * member recorded last is history, not to be installed again (nor
	 * its rows recorded twice); the one it recorded last is installed
	 * without rows. */
	uint64_t le = 0, ld = 0;
	char *lt = NULL;
	bool known = allot__store_last_config(d->store, &le, &ld, &lt) ==
	    ALLOT_OK;
	free(lt);
	if (known && epoch < le) {
		allot_config_free(cfg);
		allot_config_free(cur);
		free(copy_text);
		return;
	}
	bool recorded = known && epoch == le;
	bool changed = false;
	int rc = allot__state_apply_diffed(d->state, cfg, d->config_path,
	    copy_text, recorded ? NULL : who, epoch, j->from,
	    j->diffed ? &j->diff : NULL, &changed);
	if (rc != ALLOT_OK) {
		allot_config_free(cfg);
		allot_config_free(cur);
		free(copy_text);
		allot__log(&d->lg, ALLOT_LOG_ERR, "ALLOTD-CONFIG-FAIL",
		    "cannot install the committed config of epoch %" PRIu64
		    ": %s",
		    epoch, allot_strerror(rc));
		return;
	}
	if (d->text != NULL && strcmp(d->text, copy_text) == 0) {
		allot_config_free(cur);
		free(copy_text);
		return;
	}
	/* Who changed it, and why, are durable before the file changes: a
	 * crash in between leaves the old file, which the log's replay
	 * replaces (the rows are not written again, above), never a new
	 * file whose author is lost. */
	if (changed && allot__store_flush(d->store) != ALLOT_OK)
		allot__log(&d->lg, ALLOT_LOG_WARNING, "ALLOTD-CONFIG-AUDIT",
		    "the change rows of config epoch %" PRIu64 " are queued, "
		    "not yet written (the store's commit failed): written "
		    "with its next commit",
		    epoch);
	if (allot__admin_write_file(
	        d->config_path, copy_text, len, err, sizeof err) != ALLOT_OK)
		allot__log(&d->lg, ALLOT_LOG_ERR, "ALLOTD-CONFIG-FAIL",
		    "%s; the config of epoch %" PRIu64
		    " is in force but not in the file",
		    err, epoch);
	free(d->text);
	d->text = copy_text;
	allot_config_free(d->cur);
	d->cur = cur;
	allot__log(&d->lg, ALLOT_LOG_NOTICE, "ALLOTD-RELOAD",
	    "installed the cluster's config epoch %" PRIu64
	    " (digest %016" PRIx64 ") into %s",
	    epoch, allot__state_digest(d->state), d->config_path);
}

static void install_start(allotd *d, struct allotd_install *j);

static void
install_done(uv_work_t *w, int status)
{
	struct allotd_install *j = w->data;
	allotd *d = j->d;
	d->installing = NULL;
	if (!j->cancelled && status == 0)
		install_apply(d, j);
	install_free(j);
	struct allotd_install *next = d->install_next;
	d->install_next = NULL;
	if (next != NULL)
		install_start(d, next);
}

static void
install_start(allotd *d, struct allotd_install *j)
{
	d->installing = j;
	if (uv_queue_work(&d->loop, &j->work, install_parse, install_done) ==
	    0)
		return;
	/* No thread pool: parse here. */
	install_parse(&j->work);
	install_done(&j->work, 0);
}

void
allotd_cluster_install(void *ctx, const char *text, size_t len, uint64_t epoch,
    const allot__state_who *who)
{
	allotd *d = ctx;
	struct allotd_install *j = install_new(d, text, len, epoch, who);
	if (j == NULL) {
		allot__log(&d->lg, ALLOT_LOG_ERR, "ALLOTD-CONFIG-FAIL",
		    "out of memory for the committed config of epoch %" PRIu64
		    ": keeping epoch %" PRIu64,
		    epoch, allot__state_epoch(d->state));
		return;
	}
	if (d->installing != NULL) {
		install_free(d->install_next);
		d->install_next = j;
		return;
	}
	install_start(d, j);
}

bool
allotd_cluster_installing(void *ctx)
{
	const allotd *d = ctx;
	return d->installing != NULL || d->install_next != NULL;
}

void
allotd_cluster_install_cancel(allotd *d)
{
	install_free(d->install_next);
	d->install_next = NULL;
	if (d->installing != NULL)
		d->installing->cancelled = true;
}

/* This member started serving: a new cluster's first leader proposes
 * its quota file. */
void
allotd_cluster_serving(void *ctx)
{
	allotd *d = ctx;
	if (d->cluster == NULL || allot__cluster_config_epoch(d->cluster) != 0)
		return;
	uint64_t epoch = 0;
	const allot__state_who who = {
		.who = "start",
		.reason = "the first config of a new cluster",
		.source = d->config_path,
	};
	int rv = allot__cluster_propose_config(d->cluster, d->text,
	    strlen(d->text), d->cur->digest, &who, &epoch, NULL, 0);
	if (rv != ALLOT_OK)
		allot__log(&d->lg, ALLOT_LOG_ERR, "ALLOTD-CONFIG-FAIL",
		    "cannot propose %s as the cluster's first config: %s",
		    d->config_path, allot_strerror(rv));
}

/* SIGHUP in a cluster: the leader proposes the file; a follower's file
 * is the cluster's, written on each commit. */
void
allotd_cluster_reload(allotd *d, allot_config *cfg, char *text)
{
	char leader[256];
	uint64_t epoch = 0;
	uint64_t digest = cfg->digest;
	const allot__state_who who = {
		.who = "signal",
		.reason = "reload",
		.source = d->config_path,
	};
	int rv = digest == allot__state_digest(d->state) ?
	    ALLOT_OK :
	    allot__cluster_propose_config(d->cluster, text, strlen(text),
	        digest, &who, &epoch, leader, sizeof leader);
	allot_config_free(cfg);
	free(text);
	if (rv == ALLOT_ESTATE) {
		allot__metrics_add(&d->metrics.reloads_failed, 1);
		allot__log(&d->lg, ALLOT_LOG_ERR, "ALLOTD-RELOAD-FAIL",
		    "%s: this member is not the leader; the cluster's config "
		    "changes on the leader (%s): SIGHUP it, or allotctl apply "
		    "there",
		    d->config_path, leader[0] ? leader : "none known");
		return;
	}
	if (rv != ALLOT_OK) {
		allot__metrics_add(&d->metrics.reloads_failed, 1);
		allot__log(&d->lg, ALLOT_LOG_ERR, "ALLOTD-RELOAD-FAIL",
		    "%s: cannot propose it: %s", d->config_path,
		    allot_strerror(rv));
		return;
	}
	if (epoch == 0) {
		allot__log(&d->lg, ALLOT_LOG_NOTICE, "ALLOTD-RELOAD-SAME",
		    "%s is unchanged (digest %016" PRIx64 ")", d->config_path,
		    digest);
		return;
	}
	allot__log(&d->lg, ALLOT_LOG_NOTICE, "ALLOTD-RELOAD",
	    "proposed %s as the cluster's config epoch %" PRIu64
	    " (digest %016" PRIx64 "); every member installs it once "
	    "committed",
	    d->config_path, epoch, digest);
}

/* allotctl apply in a cluster: the leader proposes; another member
 * names the leader (421). The answer comes when it is proposed, not
 * committed (`committed` false): every member installs it on commit. */
void
allotd_cluster_apply(allotd *d, allot__admin_job *job)
{
	char leader[256];
	uint64_t epoch = 0;
	/* A change of this leader not committed yet is the one to review
	 * against: an apply diffed against the config installed would
	 * undo it unseen (its own change chained after it). */
	uint64_t fly_epoch = 0;
	uint64_t fly = allot__cluster_config_in_flight(d->cluster, &fly_epoch);
	if (fly != 0 && fly != job->digest && job->has_expect &&
	    job->expect != fly) {
		job->status = 409;
		snprintf(job->msg, sizeof job->msg,
		    "another change (digest %016" PRIx64 ", epoch %" PRIu64
		    ") is being committed: review the diff again once it "
		    "is in force. Nothing was applied",
		    fly, fly_epoch);
		return;
	}
	/* The answer's diff is the handler's to compute, from a copy of
	 * the config in force (about 10 ms for 59,001 quotas here, where
	 * the diff would take the better part of a second). */
	if ((job->before = allot__config_dup(d->cur)) == NULL) {
		job->status = 500;
		snprintf(job->msg, sizeof job->msg,
		    "out of memory; nothing was applied");
		return;
	}
	int rv = allot__cluster_propose_config(d->cluster, job->text, job->len,
	    job->cfg->digest, job->who, &epoch, leader, sizeof leader);
	if (rv != ALLOT_OK) {
		job->status = rv == ALLOT_ESTATE ? 421 :
		    rv == ALLOT_EBUSY            ? 503 :
		                                   500;
		if (rv == ALLOT_EBUSY)
			snprintf(job->msg, sizeof job->msg,
			    "this member is the leader but is still taking "
			    "over (it serves once every earlier lease has "
			    "ended); nothing was applied: retry in a moment");
		else if (rv == ALLOT_ESTATE)
			snprintf(job->msg, sizeof job->msg,
			    "this member is not the leader; apply on the "
			    "leader's admin socket (agents reach it at %s). "
			    "Nothing was applied",
			    leader[0] ? leader : "none known yet");
		else
			snprintf(job->msg, sizeof job->msg,
			    "cannot propose it: %s; nothing was applied",
			    allot_strerror(rv));
		return;
	}
	job->status = 200;
	job->changed = true;
	job->committed = false;
	job->proposed = true;
	job->epoch = epoch;
	job->digest = job->cfg->digest;
}

/* allotctl member add|remove|list: the cluster's, on the loop thread. */
void
allotd_admin_member(allotd *d, allot__admin_job *job)
{
	job->status = 200;
	if (d->cluster == NULL) {
		job->status = 409;
		snprintf(job->msg, sizeof job->msg,
		    "this allotd is not a cluster member (no --raft-id)");
		return;
	}
	int rv = ALLOT_OK;
	if (job->op == ALLOT__ADMIN_MEMBER_ADD)
		rv = allot__cluster_member_add(d->cluster, job->member_id,
		    job->member_raft, job->member_url, job->msg,
		    sizeof job->msg);
	else if (job->op == ALLOT__ADMIN_MEMBER_REMOVE)
		rv = allot__cluster_member_remove(
		    d->cluster, job->member_id, job->msg, sizeof job->msg);
	if (rv != ALLOT_OK) {
		job->status = rv == ALLOT_ESTATE ? 421 :
		    rv == ALLOT_EBUSY            ? 409 :
		    rv == ALLOT_ENOENT           ? 404 :
		    rv == ALLOT_EINVAL           ? 400 :
		                                   500;
		return;
	}
	if (job->member_id != 0 && job->op != ALLOT__ADMIN_MEMBER_ADD)
		job->member_left = allot__cluster_member_left(
		    d->cluster, job->member_id, job->msg, sizeof job->msg);
	allot__buf b = { 0 };
	allot__cluster_member_list(d->cluster, &b);
	job->text_out = b.p;
}
