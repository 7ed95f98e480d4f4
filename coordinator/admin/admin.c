/* SPDX-License-Identifier: MIT */
/*
 * allotd's admin API on a Unix domain socket (admin.h): the socket and
 * its permissions, who the kernel says the peer is, the three endpoints,
 * the hand-over of jobs to the loop thread, and the atomic write of the
 * quota file. The handlers run on libmicrohttpd's threads (one per
 * connection, at most ALLOT__ADMIN_MAX_CONNECTIONS); they parse and
 * diff files themselves and only hand the loop thread what must be done
 * there: reading the config in force and installing a new one.
 * POST /members/remove waits (polling the loop thread) until the removal
 * is done as far as this member can tell, so one request removes even
 * the leader it is sent to (consensus_node.h has the steps).
 */
#include "admin.h"

#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <pthread.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include <allot/identity.h>

#include "admin_tls.h"
#include "buf.h"
#include "clock.h"
#include "file.h"
#include "web/addr.h"
#include "web/reply.h"

/* How long a handler waits for the loop thread to take its job: the loop
 * runs nothing long, so only a stuck allotd gets near it. */
#define JOB_WAIT_S 30
#define NAME_MAX_LEN 255u
#define IDLE_TIMEOUT_S 30u
/* How long POST /members/remove waits for the removal by default
 * (`wait_ms` sets it, up to the maximum; 0 answers at once): a
 * hand-over, an election and two configuration changes take a few
 * election timeouts at most. */
#define LEAVE_WAIT_MS 10000u
#define LEAVE_WAIT_MAX_MS 120000u
#define LEAVE_POLL_MS 20

enum { QUEUED, RUNNING, DONE };

/* A job waiting for the loop thread, on its handler's stack. */
struct pending {
	allot__admin_job *job;
	int state; /* under allot__admin.mu */
	struct pending *next;
};

struct allot__admin {
	char *path; /* NULL: no Unix socket */
	struct MHD_Daemon *mhd;
	allot__admin_tls *tls; /* NULL: no HTTPS listener */
	allot__logrl refused_rl; /* callers the HTTPS listener turned away */
	uv_async_t async;
	allot__admin_run_fn run;
	void *ctx;
	allot__logger lg;
	pthread_mutex_t mu;
	pthread_cond_t cv; /* a job is done, or stopping */
	struct pending *queue; /* under mu */
	bool stopping; /* under mu */
	/* Diffs and applies parsing and diffing now (under mu), at most
	 * CONFIG_WORK_MAX; `work_cv`: one ended. */
	unsigned working;
	pthread_cond_t work_cv;
};

/* A diff or an apply holds both files parsed and their diff, about
 * 2.2 KB a quota (151 MB for 59,001 over 9,001): at most this many at
 * once, the others wait (holding only their body) up to
 * CONFIG_WAIT_S, then get 503. Sixteen at once took allotd to 3.2 GB
 * (issue 27). */
#define CONFIG_WORK_MAX 2u
#define CONFIG_WAIT_S 30

/* One request being received. */
struct req {
	char *body;
	size_t len;
	size_t cap;
	bool too_big;
	/* Came in on the HTTPS listener: `who` is its caller's verified
	 * SPIFFE ID (admin_tls.h). */
	bool tls;
	char who[ALLOT_SPIFFE_ID_MAX + 1];
};

/* ---- the loop thread's side ---- */

static void
on_async(uv_async_t *h)
{
	allot__admin *a = h->data;
	pthread_mutex_lock(&a->mu);
	while (a->queue != NULL && !a->stopping) {
		struct pending *p = a->queue;
		a->queue = p->next;
		p->state = RUNNING;
		pthread_mutex_unlock(&a->mu);
		a->run(a->ctx, p->job);
		pthread_mutex_lock(&a->mu);
		/* `p` belongs to the handler from here on. */
		p->state = DONE;
		pthread_cond_broadcast(&a->cv);
	}
	pthread_mutex_unlock(&a->mu);
}

static void
unqueue(allot__admin *a, struct pending *p)
{
	for (struct pending **pp = &a->queue; *pp != NULL; pp = &(*pp)->next)
		if (*pp == p) {
			*pp = p->next;
			return;
		}
}

/* Hand `job` to the loop thread and wait until it ran. False when allotd
 * is stopping or the loop did not take it in time (nothing ran). */
static bool
submit(allot__admin *a, allot__admin_job *job)
{
	struct pending p = { .job = job, .state = QUEUED };
	struct timespec until;
	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_sec += JOB_WAIT_S;
	pthread_mutex_lock(&a->mu);
	if (a->stopping) {
		pthread_mutex_unlock(&a->mu);
		return false;
	}
	struct pending **tail = &a->queue;
	while (*tail != NULL)
		tail = &(*tail)->next;
	*tail = &p;
	uv_async_send(&a->async);
	while (p.state != DONE) {
		int rc = 0;
		if (p.state == QUEUED && a->stopping)
			rc = ETIMEDOUT;
		else
			rc = pthread_cond_timedwait(&a->cv, &a->mu, &until);
		/* A job the loop has taken is always waited for. */
		if (rc == ETIMEDOUT && p.state == QUEUED) {
			unqueue(a, &p);
			pthread_mutex_unlock(&a->mu);
			return false;
		}
	}
	pthread_mutex_unlock(&a->mu);
	return true;
}

/* ---- answers ---- */

static void
put_hex(allot__buf *b, const char *key, uint64_t v)
{
	allot__buf_printf(b, "\"%s\":\"%016" PRIx64 "\"", key, v);
}

static void
put_str_or_null(allot__buf *b, const char *s)
{
	if (s == NULL)
		allot__buf_puts(b, "null");
	else
		allot__buf_json(b, s);
}

/* "changes":[{"service":..,"quota":..,"action":..,"before":..,
 * "after":..,"fields":..,"owner":..},...] */
static void
put_diff(allot__buf *b, const allot__config_diff *d)
{
	allot__buf_puts(b, "\"changes\":[");
	for (size_t i = 0; i < d->n; i++) {
		const allot__quota_change *q = &d->v[i];
		allot__buf_puts(b, i > 0 ? ",{\"service\":" : "{\"service\":");
		put_str_or_null(b, q->service);
		allot__buf_puts(b, ",\"quota\":");
		allot__buf_json(b, q->quota);
		allot__buf_printf(
		    b, ",\"action\":\"%s\"", allot__change_kind_name(q->kind));
		allot__buf_puts(b, ",\"before\":");
		put_str_or_null(b, q->before);
		allot__buf_puts(b, ",\"after\":");
		put_str_or_null(b, q->after);
		allot__buf_puts(b, ",\"fields\":");
		put_str_or_null(b, q->fields);
		allot__buf_puts(b, ",\"owner\":");
		put_str_or_null(b, q->owner);
		allot__buf_puts(b, "}");
	}
	allot__buf_puts(b, "]");
}

/* ---- requests ---- */

/* The peer's user name as the kernel gives it (SO_PEERCRED): what the
 * audit records as who. False when the kernel does not say. */
static bool
peer_user(struct MHD_Connection *c, char *who, size_t n)
{
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
	    c, MHD_CONNECTION_INFO_CONNECTION_FD);
	struct ucred cr;
	socklen_t l = sizeof cr;
	if (ci == NULL ||
	    getsockopt(ci->connect_fd, SOL_SOCKET, SO_PEERCRED, &cr, &l) != 0)
		return false;
	struct passwd pw, *res = NULL;
	char buf[2048];
	if (getpwuid_r(cr.uid, &pw, buf, sizeof buf, &res) == 0 && res != NULL)
		snprintf(who, n, "%s", pw.pw_name);
	else
		snprintf(who, n, "uid %u", (unsigned) cr.uid);
	return true;
}

/* A query argument, NULL when absent. */
static const char *
arg(struct MHD_Connection *c, const char *name)
{
	return MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
}

/* Printable text of at most `max` bytes (no control characters): what
 * the names and reasons that go into messages and the audit must be. */
static bool
printable(const char *s, size_t max)
{
	size_t n = strlen(s);
	if (n > max)
		return false;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char) s[i] < 0x20 || s[i] == 0x7f)
			return false;
	return true;
}

/* The file name the client gave (?file=), checked; NULL after answering
 * 400. */
static const char *
file_name(struct MHD_Connection *c, enum MHD_Result *ret)
{
	const char *f = arg(c, "file");
	if (f == NULL || f[0] == '\0')
		return "(request body)";
	if (!printable(f, NAME_MAX_LEN)) {
		*ret = allot__web_text(c, MHD_HTTP_BAD_REQUEST,
		    "file: at most %u printable bytes", NAME_MAX_LEN);
		return NULL;
	}
	return f;
}

/* Parse the body as the quota file `name`; NULL after answering. */
static allot_config *
parse_body(struct MHD_Connection *c, struct req *r, const char *name,
    enum MHD_Result *ret)
{
	char err[1024] = "";
	allot_config *cfg = NULL;
	int rc = allot_config_parse(name, r->body != NULL ? r->body : "",
	    r->len, err, sizeof err, &cfg);
	if (rc == ALLOT_OK)
		return cfg;
	/* The loader's "FILE:LINE:COL: ..." with the client's file name. */
	*ret = allot__web_text(c,
	    rc == ALLOT_ENOMEM ? MHD_HTTP_INTERNAL_SERVER_ERROR :
	                         MHD_HTTP_UNPROCESSABLE_CONTENT,
	    "%s", err[0] != '\0' ? err : allot_strerror(rc));
	return NULL;
}

/* The config in force, through the loop thread: a GET job. False after
 * answering. */
static bool
get_current(allot__admin *a, struct MHD_Connection *c, allot__admin_job *job,
    enum MHD_Result *ret)
{
	memset(job, 0, sizeof *job);
	job->op = ALLOT__ADMIN_GET;
	if (!submit(a, job)) {
		*ret = allot__web_text(c, MHD_HTTP_SERVICE_UNAVAILABLE,
		    "allotd is stopping or busy; try again");
		return false;
	}
	if (job->status != MHD_HTTP_OK) {
		*ret = allot__web_text(
		    c, (unsigned) job->status, "%s", job->msg);
		free(job->path);
		free(job->text_out);
		return false;
	}
	return true;
}

static enum MHD_Result
get_config(allot__admin *a, struct MHD_Connection *c)
{
	allot__admin_job job;
	enum MHD_Result ret = MHD_NO;
	if (!get_current(a, c, &job, &ret))
		return ret;
	allot__buf b = { 0 };
	allot__buf_printf(&b, "{\"epoch\":%" PRIu64 ",", job.epoch);
	put_hex(&b, "digest", job.digest);
	allot__buf_puts(&b, ",\"path\":");
	allot__buf_json(&b, job.path);
	allot__buf_puts(&b, ",\"text\":");
	allot__buf_json(&b, job.text_out);
	allot__buf_puts(&b, "}\n");
	free(job.path);
	free(job.text_out);
	return allot__web_buf(c, "application/json", &b);
}

static enum MHD_Result
post_diff(allot__admin *a, struct MHD_Connection *c, struct req *r)
{
	enum MHD_Result ret = MHD_NO;
	const char *name = file_name(c, &ret);
	if (name == NULL)
		return ret;
	allot_config *cfg = parse_body(c, r, name, &ret);
	if (cfg == NULL)
		return ret;
	allot__admin_job job;
	if (!get_current(a, c, &job, &ret)) {
		allot_config_free(cfg);
		return ret;
	}
	char err[1024] = "";
	allot_config *cur = NULL;
	allot__config_diff d = { 0 };
	int rc = allot_config_parse(job.path, job.text_out,
	    strlen(job.text_out), err, sizeof err, &cur);
	if (rc == ALLOT_OK)
		rc = allot__config_diff_compute(cur, cfg, &d);
	if (rc != ALLOT_OK) {
		ret = allot__web_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR,
		    "cannot diff against the config in force: %s",
		    err[0] != '\0' ? err : allot_strerror(rc));
	} else {
		allot__buf b = { 0 };
		allot__buf_puts(&b, "{\"file\":");
		allot__buf_json(&b, name);
		allot__buf_printf(
		    &b, ",\"from\":{\"epoch\":%" PRIu64 ",", job.epoch);
		put_hex(&b, "digest", job.digest);
		allot__buf_puts(&b, "},\"to\":{");
		put_hex(&b, "digest", cfg->digest);
		allot__buf_printf(&b, "},\"same\":%s,",
		    cfg->digest == job.digest ? "true" : "false");
		put_diff(&b, &d);
		allot__buf_puts(&b, "}\n");
		ret = allot__web_buf(c, "application/json", &b);
	}
	allot__config_diff_free(&d);
	allot_config_free(cur);
	allot_config_free(cfg);
	free(job.path);
	free(job.text_out);
	return ret;
}

/* ?reason=, ?as= and ?expect= of an apply; false after answering. */
static bool
apply_args(struct MHD_Connection *c, allot__state_who *w,
    allot__admin_job *job, enum MHD_Result *ret)
{
	const char *reason = arg(c, "reason");
	const char *as = arg(c, "as");
	const char *expect = arg(c, "expect");
	if (reason == NULL || reason[strspn(reason, " ")] == '\0') {
		*ret = allot__web_text(c, MHD_HTTP_BAD_REQUEST,
		    "a reason is required (allotctl apply --reason TEXT)");
		return false;
	}
	if (!printable(reason, ALLOT__ADMIN_REASON_MAX)) {
		*ret = allot__web_text(c, MHD_HTTP_BAD_REQUEST,
		    "reason: at most %u printable bytes, one line",
		    ALLOT__ADMIN_REASON_MAX);
		return false;
	}
	if (as != NULL && (as[0] == '\0' || !printable(as, NAME_MAX_LEN))) {
		*ret = allot__web_text(c, MHD_HTTP_BAD_REQUEST,
		    "as: a name of 1 to %u printable bytes", NAME_MAX_LEN);
		return false;
	}
	if (expect != NULL) {
		char *end;
		errno = 0;
		unsigned long long v = strtoull(expect, &end, 16);
		size_t n = strlen(expect);
		if (n == 0 || n > 16 || *end != '\0' || errno != 0 ||
		    strspn(expect, "0123456789abcdefABCDEF") != n) {
			*ret = allot__web_text(c, MHD_HTTP_BAD_REQUEST,
			    "expect: the digest of the config in force, 16 "
			    "hex digits, not \"%.32s\"",
			    expect);
			return false;
		}
		job->has_expect = true;
		job->expect = (uint64_t) v;
	}
	w->reason = reason;
	w->claimed_as = as;
	return true;
}

static enum MHD_Result
post_apply(allot__admin *a, struct MHD_Connection *c, struct req *r)
{
	enum MHD_Result ret = MHD_NO;
	char user[256];
	const char *who = r->who;
	if (!r->tls) {
		if (!peer_user(c, user, sizeof user))
			return allot__web_text(c, MHD_HTTP_FORBIDDEN,
			    "the kernel did not name this connection's user "
			    "(SO_PEERCRED): refused");
		who = user;
	}
	const char *name = file_name(c, &ret);
	if (name == NULL)
		return ret;
	allot__admin_job job;
	memset(&job, 0, sizeof job);
	allot__state_who w = { .who = who, .source = name };
	if (!apply_args(c, &w, &job, &ret))
		return ret;
	allot_config *cfg = parse_body(c, r, name, &ret);
	if (cfg == NULL)
		return ret;
	job.op = ALLOT__ADMIN_APPLY;
	job.cfg = cfg;
	job.text = r->body != NULL ? r->body : "";
	job.len = r->len;
	job.who = &w;
	if (!submit(a, &job)) {
		allot_config_free(job.cfg);
		return allot__web_text(c, MHD_HTTP_SERVICE_UNAVAILABLE,
		    "allotd is stopping or busy; nothing was applied");
	}
	/* The diff the loop left to this thread (a cluster's apply). */
	if (job.before != NULL && job.cfg != NULL &&
	    job.status == MHD_HTTP_OK &&
	    allot__config_diff_compute(job.before, job.cfg, &job.diff) !=
	        ALLOT_OK)
		allot__log(&a->lg, ALLOT_LOG_WARNING, "ALLOTD-APPLY",
		    "out of memory for the diff of the answer: it lists no "
		    "change (the audit has them)");
	allot_config_free(job.before);
	allot_config_free(job.cfg); /* NULL when the run took it */
	if (job.status != MHD_HTTP_OK) {
		allot__config_diff_free(&job.diff);
		return allot__web_text(
		    c, (unsigned) job.status, "%s", job.msg);
	}
	allot__buf b = { 0 };
	allot__buf_puts(&b, "{\"file\":");
	allot__buf_json(&b, name);
	allot__buf_puts(&b, ",\"who\":");
	allot__buf_json(&b, who);
	allot__buf_printf(&b,
	    ",\"changed\":%s,\"committed\":%s,\"proposed\":%s,"
	    "\"from\":{\"epoch\":%" PRIu64 ",",
	    job.changed ? "true" : "false", job.committed ? "true" : "false",
	    job.proposed ? "true" : "false", job.prev_epoch);
	put_hex(&b, "digest", job.prev_digest);
	allot__buf_printf(&b, "},\"to\":{\"epoch\":%" PRIu64 ",", job.epoch);
	put_hex(&b, "digest", job.digest);
	allot__buf_puts(&b, "},");
	put_diff(&b, &job.diff);
	allot__buf_puts(&b, "}\n");
	allot__config_diff_free(&job.diff);
	allot__log(&a->lg, ALLOT_LOG_NOTICE, "ALLOTD-APPLY",
	    "%s applied %s (reason: %s): epoch %" PRIu64 " -> %" PRIu64
	    ", digest %016" PRIx64,
	    who, name, w.reason, job.prev_epoch, job.epoch, job.digest);
	return allot__web_buf(c, "application/json", &b);
}

static uint64_t
mono_ms(void)
{
	return allot__mono_ns() / 1000000u;
}

/* After a removal started: polls the loop thread (a MEMBERS job naming
 * the member) until it has left or `wait_ms` passed. `job` holds the
 * last answer; false on a timeout or a stopping allotd (job->status
 * and msg say which). */
static bool
wait_left(allot__admin *a, allot__admin_job *job, uint64_t wait_ms,
    uint64_t *ret_waited)
{
	uint64_t id = job->member_id, start = mono_ms();
	const struct timespec poll = { 0, LEAVE_POLL_MS * 1000000L };
	while (!job->member_left) {
		*ret_waited = mono_ms() - start;
		if (*ret_waited >= wait_ms) {
			char state[256];
			snprintf(state, sizeof state, "%.255s", job->msg);
			job->status = MHD_HTTP_GATEWAY_TIMEOUT;
			snprintf(job->msg, sizeof job->msg,
			    "member %" PRIu64
			    " was not removed within %" PRIu64
			    " ms: %.255s. The removal is recorded and the "
			    "leader goes on with it: see `allotctl member "
			    "list`",
			    id, wait_ms, state);
			return false;
		}
		nanosleep(&poll, NULL);
		free(job->text_out);
		memset(job, 0, sizeof *job);
		job->op = ALLOT__ADMIN_MEMBERS;
		job->member_id = id;
		if (!submit(a, job) || job->status != MHD_HTTP_OK) {
			job->status = MHD_HTTP_SERVICE_UNAVAILABLE;
			snprintf(job->msg, sizeof job->msg,
			    "allotd stopped while member %" PRIu64
			    "'s removal was under way",
			    id);
			return false;
		}
	}
	*ret_waited = mono_ms() - start;
	return true;
}

/* The cluster's member endpoints: one job each, the answer the run's
 * JSON or its error; a removal waits until done (wait_left) and its
 * answer also says how it ended and how long it took. */
static enum MHD_Result
members(allot__admin *a, struct MHD_Connection *c, const char *url)
{
	allot__admin_job job;
	uint64_t wait_ms = LEAVE_WAIT_MS, waited = 0;
	memset(&job, 0, sizeof job);
	job.op = ALLOT__ADMIN_MEMBERS;
	if (strcmp(url, "/members") != 0) {
		job.op = strcmp(url, "/members/add") == 0 ?
		    ALLOT__ADMIN_MEMBER_ADD :
		    ALLOT__ADMIN_MEMBER_REMOVE;
		const char *id = MHD_lookup_connection_value(
		    c, MHD_GET_ARGUMENT_KIND, "id");
		char *end = NULL;
		errno = 0;
		unsigned long long v = id != NULL ? strtoull(id, &end, 10) : 0;
		if (id == NULL || *end != '\0' || errno != 0 || v == 0)
			return allot__web_text(c, MHD_HTTP_BAD_REQUEST,
			    "id: a member id, an integer > 0");
		job.member_id = (uint64_t) v;
		job.member_raft = MHD_lookup_connection_value(
		    c, MHD_GET_ARGUMENT_KIND, "raft");
		job.member_url = MHD_lookup_connection_value(
		    c, MHD_GET_ARGUMENT_KIND, "url");
		if (job.op == ALLOT__ADMIN_MEMBER_ADD &&
		    (job.member_raft == NULL || job.member_url == NULL))
			return allot__web_text(c, MHD_HTTP_BAD_REQUEST,
			    "add needs raft=HOST:PORT and url=AGENT_URL");
		const char *w = MHD_lookup_connection_value(
		    c, MHD_GET_ARGUMENT_KIND, "wait_ms");
		errno = 0;
		end = NULL;
		v = w != NULL ? strtoull(w, &end, 10) : LEAVE_WAIT_MS;
		if (w != NULL &&
		    (*end != '\0' || errno != 0 || v > LEAVE_WAIT_MAX_MS))
			return allot__web_text(c, MHD_HTTP_BAD_REQUEST,
			    "wait_ms: how long a removal may take, 0 to %u",
			    LEAVE_WAIT_MAX_MS);
		wait_ms = v;
	}
	if (!submit(a, &job))
		return allot__web_text(c, MHD_HTTP_SERVICE_UNAVAILABLE,
		    "allotd is stopping or busy; try again");
	if (job.status == MHD_HTTP_OK &&
	    job.op == ALLOT__ADMIN_MEMBER_REMOVE && wait_ms > 0)
		(void) wait_left(a, &job, wait_ms, &waited);
	if (job.status != MHD_HTTP_OK) {
		free(job.text_out);
		return allot__web_text(
		    c, (unsigned) job.status, "%s", job.msg);
	}
	allot__buf b = { 0 };
	const char *list = job.text_out != NULL ? job.text_out : "{}";
	if (job.member_id != 0 && job.op != ALLOT__ADMIN_MEMBER_ADD &&
	    list[0] == '{' && list[1] != '}') {
		/* The removal's outcome, then the list's own fields. */
		allot__buf_puts(&b, "{\"outcome\":");
		allot__buf_json(&b, job.msg);
		allot__buf_printf(&b, ",\"waited_ms\":%" PRIu64 ",", waited);
		list++;
	}
	allot__buf_puts(&b, list);
	allot__buf_puts(&b, "\n");
	free(job.text_out);
	return allot__web_buf(c, "application/json", &b);
}

/* A place among the CONFIG_WORK_MAX diffs and applies: false when none
 * came free in CONFIG_WAIT_S or allotd is stopping. */
static bool
config_work_begin(allot__admin *a)
{
	struct timespec until;
	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_sec += CONFIG_WAIT_S;
	pthread_mutex_lock(&a->mu);
	int rc = 0;
	while (!a->stopping && a->working >= CONFIG_WORK_MAX && rc == 0)
		rc = pthread_cond_timedwait(&a->work_cv, &a->mu, &until);
	bool ok = !a->stopping && a->working < CONFIG_WORK_MAX;
	if (ok)
		a->working++;
	pthread_mutex_unlock(&a->mu);
	return ok;
}

static void
config_work_end(allot__admin *a)
{
	pthread_mutex_lock(&a->mu);
	a->working--;
	pthread_cond_signal(&a->work_cv);
	pthread_mutex_unlock(&a->mu);
}

static enum MHD_Result
route(allot__admin *a, struct MHD_Connection *c, const char *url,
    const char *method, struct req *r)
{
	bool get = strcmp(method, MHD_HTTP_METHOD_GET) == 0;
	bool post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
	bool is_cfg = strcmp(url, "/config") == 0;
	bool is_diff = strcmp(url, "/config/diff") == 0;
	bool is_apply = strcmp(url, "/config/apply") == 0;
	if (strcmp(url, "/members") == 0) {
		if (!get)
			return allot__web_text(c, MHD_HTTP_METHOD_NOT_ALLOWED,
			    "/members: GET only");
		return members(a, c, url);
	}
	if (strcmp(url, "/members/add") == 0 ||
	    strcmp(url, "/members/remove") == 0) {
		if (!post)
			return allot__web_text(c, MHD_HTTP_METHOD_NOT_ALLOWED,
			    "%s: POST only", url);
		return members(a, c, url);
	}
	if (!is_cfg && !is_diff && !is_apply)
		return allot__web_text(c, MHD_HTTP_NOT_FOUND,
		    "no such endpoint: GET /config, POST /config/diff, "
		    "POST /config/apply, GET /members, POST /members/add, "
		    "POST /members/remove");
	if (is_cfg && !get)
		return allot__web_text(
		    c, MHD_HTTP_METHOD_NOT_ALLOWED, "/config: GET only");
	if (!is_cfg && !post)
		return allot__web_text(c, MHD_HTTP_METHOD_NOT_ALLOWED,
		    "%s: POST only, with the quota file as the body", url);
	if (r->too_big)
		return allot__web_text(c, MHD_HTTP_CONTENT_TOO_LARGE,
		    "the body is larger than %u bytes", ALLOT__ADMIN_BODY_MAX);
	if (is_cfg)
		return get_config(a, c);
	if (!config_work_begin(a))
		return allot__web_text(c, MHD_HTTP_SERVICE_UNAVAILABLE,
		    "%u config diffs or applies ran for %d s and allotd "
		    "takes at most %u at once (or it is stopping); nothing "
		    "was applied, try again",
		    CONFIG_WORK_MAX, CONFIG_WAIT_S, CONFIG_WORK_MAX);
	enum MHD_Result ret = is_diff ? post_diff(a, c, r) :
	                                post_apply(a, c, r);
	config_work_end(a);
	return ret;
}

/* A request on the HTTPS listener, its headers in: its caller may go on,
 * or is answered 401 or 403 before its body is read. */
static enum MHD_Result
tls_caller(allot__admin *a, struct MHD_Connection *c, struct req *r)
{
	char why[512];
	unsigned status = allot__admin_tls_caller(
	    a->tls, c, r->who, sizeof r->who, why, sizeof why);
	if (status == MHD_HTTP_OK) {
		r->tls = true;
		return MHD_YES;
	}
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
	    c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	char host[NI_MAXHOST] = "?";
	if (ci != NULL && ci->client_addr != NULL)
		allot__web_addr_text(ci->client_addr, host, sizeof host);
	allot__log_ratelimited(&a->lg, &a->refused_rl, ALLOT_LOG_WARNING,
	    "ALLOTD-ADMIN-REFUSED", "admin API: %s refused (%u): %s", host,
	    status, why);
	return allot__web_text(c, status, "%s", why);
}

static enum MHD_Result
on_request(void *cls, struct MHD_Connection *c, const char *url,
    const char *method, const char *version, const char *upload,
    size_t *upload_size, void **req_cls)
{
	allot__admin *a = cls;
	(void) version;
	struct req *r = *req_cls;
	if (r == NULL) {
		r = calloc(1, sizeof *r);
		if (r == NULL)
			return MHD_NO;
		*req_cls = r;
		if (allot__admin_tls_owns(a->tls, c))
			return tls_caller(a, c, r);
		return MHD_YES;
	}
	if (*upload_size > 0) {
		size_t n = *upload_size;
		*upload_size = 0;
		if (r->too_big || r->len + n > ALLOT__ADMIN_BODY_MAX) {
			/* Read and dropped: answered once it is all in. */
			r->too_big = true;
			return MHD_YES;
		}
		if (r->len + n + 1 > r->cap) {
			size_t cap = r->cap ? r->cap : 8192;
			while (cap < r->len + n + 1)
				cap *= 2;
			char *nb = realloc(r->body, cap);
			if (nb == NULL)
				return MHD_NO;
			r->body = nb;
			r->cap = cap;
		}
		memcpy(r->body + r->len, upload, n);
		r->len += n;
		r->body[r->len] = '\0';
		return MHD_YES;
	}
	return route(a, c, url, method, r);
}

static void
on_completed(void *cls, struct MHD_Connection *c, void **req_cls,
    enum MHD_RequestTerminationCode toe)
{
	(void) cls;
	(void) c;
	(void) toe;
	struct req *r = *req_cls;
	if (r != NULL) {
		free(r->body);
		free(r);
	}
	*req_cls = NULL;
}

/* ---- the socket ---- */

/* Bind `path` with the permissions asked for; the descriptor, or -1
 * with `err` set. A socket file left by an earlier run is replaced, one
 * another process still answers on is not, and nothing else is ever
 * removed. */
static int
listen_at(const char *path, const char *group, char *err, size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof sa.sun_path) {
		snprintf(err, errlen,
		    "--admin-socket %s: longer than %zu bytes", path,
		    sizeof sa.sun_path - 1);
		return -1;
	}
	strcpy(sa.sun_path, path);
	gid_t gid = (gid_t) -1;
	if (group != NULL) {
		struct group gr, *res = NULL;
		char buf[4096];
		if (getgrnam_r(group, &gr, buf, sizeof buf, &res) != 0 ||
		    res == NULL) {
			snprintf(err, errlen,
			    "--admin-group %s: no such group", group);
			return -1;
		}
		gid = gr.gr_gid;
	}
	struct stat st;
	if (lstat(path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode)) {
			snprintf(err, errlen,
			    "--admin-socket %s exists and is not a socket; "
			    "allotd will not remove it",
			    path);
			return -1;
		}
		int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		bool live = probe >= 0 &&
		    connect(probe, (struct sockaddr *) &sa, sizeof sa) == 0;
		if (probe >= 0)
			close(probe);
		if (live) {
			snprintf(err, errlen,
			    "--admin-socket %s: another process answers on "
			    "it (another allotd?)",
			    path);
			return -1;
		}
		unlink(path);
	}
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, errlen, "--admin-socket %s: %s", path,
		    strerror(errno));
		return -1;
	}
	/* Created with no access for others from the first instant. */
	mode_t old = umask(0177);
	int rc = bind(fd, (struct sockaddr *) &sa, sizeof sa);
	umask(old);
	if (rc == 0 && group != NULL &&
	    (chown(path, (uid_t) -1, gid) != 0 || chmod(path, 0660) != 0))
		rc = -1;
	if (rc != 0 || listen(fd, 16) != 0) {
		snprintf(err, errlen, "--admin-socket %s: %s", path,
		    strerror(errno));
		close(fd);
		if (rc == 0)
			unlink(path);
		return -1;
	}
	return fd;
}

static void
free_admin(allot__admin *a)
{
	pthread_cond_destroy(&a->cv);
	pthread_cond_destroy(&a->work_cv);
	pthread_mutex_destroy(&a->mu);
	free(a->path);
	free(a);
}

static void
on_closed(uv_handle_t *h)
{
	free_admin(h->data);
}

int
allot__admin_start(
    const allot__admin_opts *o, char *err, size_t errlen, allot__admin **ret)
{
	allot__admin *a = calloc(1, sizeof *a);
	if (a == NULL ||
	    (o->path != NULL && (a->path = strdup(o->path)) == NULL)) {
		free(a);
		snprintf(err, errlen, "out of memory");
		return ALLOT_ENOMEM;
	}
	a->run = o->run;
	a->ctx = o->ctx;
	if (o->lg != NULL)
		a->lg = *o->lg;
	a->refused_rl = (allot__logrl) ALLOT__LOGRL_INIT(5, 10000);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&a->cv, &ca);
	pthread_cond_init(&a->work_cv, &ca);
	pthread_condattr_destroy(&ca);
	pthread_mutex_init(&a->mu, NULL);
	int fd = -1;
	if (o->path != NULL &&
	    (fd = listen_at(o->path, o->group, err, errlen)) < 0) {
		free_admin(a);
		return ALLOT_EIO;
	}
	/* Before the first request can arrive: a handler signals it. */
	uv_async_init(o->loop, &a->async, on_async);
	a->async.data = a;
	if (fd >= 0) {
		a->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD |
		        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL,
		    0, NULL, NULL, on_request, a, MHD_OPTION_LISTEN_SOCKET, fd,
		    MHD_OPTION_CONNECTION_LIMIT, ALLOT__ADMIN_MAX_CONNECTIONS,
		    MHD_OPTION_CONNECTION_TIMEOUT, IDLE_TIMEOUT_S,
		    MHD_OPTION_NOTIFY_COMPLETED, on_completed, a,
		    MHD_OPTION_END);
		if (a->mhd == NULL) {
			snprintf(err, errlen,
			    "--admin-socket %s: cannot serve on it", o->path);
			close(fd);
			unlink(o->path);
			/* Freed once the loop has run the close. */
			uv_close((uv_handle_t *) &a->async, on_closed);
			return ALLOT_EIO;
		}
	}
	if (o->tls.listen != NULL) {
		allot__admin_tls_opts to = o->tls;
		to.max_connections = ALLOT__ADMIN_MAX_CONNECTIONS;
		to.idle_timeout_s = IDLE_TIMEOUT_S;
		int rc = allot__admin_tls_start(
		    &to, on_request, on_completed, a, err, errlen, &a->tls);
		if (rc != ALLOT_OK) {
			if (a->mhd != NULL) {
				MHD_stop_daemon(a->mhd);
				unlink(a->path);
			}
			uv_close((uv_handle_t *) &a->async, on_closed);
			return rc;
		}
	}
	*ret = a;
	return ALLOT_OK;
}

void
allot__admin_stop(allot__admin *a)
{
	if (a == NULL)
		return;
	pthread_mutex_lock(&a->mu);
	a->stopping = true;
	pthread_cond_broadcast(&a->cv);
	pthread_cond_broadcast(&a->work_cv);
	pthread_mutex_unlock(&a->mu);
	/* Handlers waiting for a job give up now; MHD closes the listening
	 * descriptors. */
	if (a->mhd != NULL) {
		MHD_stop_daemon(a->mhd);
		unlink(a->path);
	}
	allot__admin_tls_stop(a->tls);
	uv_close((uv_handle_t *) &a->async, on_closed);
}

/* ---- the quota file ---- */

int
allot__admin_write_file(
    const char *path, const char *text, size_t len, char *err, size_t errlen)
{
	/* The operator's --config may be a symbolic link (to a file a
	 * deploy manages): the file it points at is replaced, beside
	 * itself, and the link keeps pointing at it. */
	char real[PATH_MAX];
	if (realpath(path, real) == NULL)
		snprintf(real, sizeof real, "%s", path);
	struct iovec iov = { (void *) text, len };
	return allot__file_replace(
	    real, &iov, 1, 0644, ALLOT__FILE_KEEP_MODE, err, errlen);
}
