/* SPDX-License-Identifier: MIT */
/*
 * The fault suite's harness (fault.h): scratch directories, the allotd
 * child, agents, the fixed-schedule load threads and the report lines.
 * Assertions use check's ck_assert, so a harness failure fails the test
 * that called it.
 */
#include "allotd.h"
#include "fault.h"
#include "proc.h"
#include "proto_client.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "json.h"

static const char *CFG = "# The fault suite's quotas (tests/fault/fault.h).\n"
                         "quotas:\n"
                         "  default: {tokens_per_second: 10, burst: 20}\n"
                         "  callers:\n"
                         "    - identity: steady\n"
                         "      tokens_per_second: 300\n"
                         "      burst: 60\n"
                         "    - identity: greedy\n"
                         "      tokens_per_second: 300\n"
                         "      burst: 30\n";

void
fault_env_init(fault_env *e, const char *name, const char *db_dir)
{
	char prefix[96];
	memset(e, 0, sizeof *e);
	snprintf(prefix, sizeof prefix, "/tmp/allot-fault-%s", name);
	pc_coord_init(&e->c, prefix, CFG);
	if (db_dir != NULL)
		snprintf(e->c.db, sizeof e->c.db, "%s/allot.db", db_dir);
}

void
fault_env_fini(fault_env *e)
{
	pc_coord_done(&e->c, 0);
}

uint64_t
fault_allotd_start(fault_env *e)
{
	char lease[16], interval[16], expiry[16];
	snprintf(lease, sizeof lease, "%u", FAULT_LEASE_MS);
	snprintf(interval, sizeof interval, "%u", FAULT_T_MS);
	snprintf(expiry, sizeof expiry, "%u", FAULT_EXPIRY);
	const char *args[] = { "--interval-ms", interval, "--expiry-intervals",
		expiry, "--lease-ms", lease,
		e->hold_expired != NULL ? "--hold-expired" : NULL,
		e->hold_expired, NULL };
	uint64_t t0 = pc_now_ms();
	pc_coord_spawn(&e->c, args, NULL);
	return pc_now_ms() - t0;
}

int
fault_allotd_stop(fault_env *e, int sig)
{
	if (e->c.pid <= 0)
		return -1;
	int rc = pc_coord_stop(&e->c, sig, 5000);
	if (rc < 0)
		rc = pc_coord_stop(&e->c, SIGKILL, 5000);
	e->c.pid = 0;
	return rc;
}

allot_agent *
fault_agent(const char *url, const char *replica)
{
	char err[256];
	allot_config *cfg;
	ck_assert_int_eq(allot_config_parse("fault.yaml", CFG, strlen(CFG),
	                     err, sizeof err, &cfg),
	    ALLOT_OK);
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.coordinator = url;
	o.service = "svc";
	o.replica_id = replica;
	o.sync_interval_ms = FAULT_T_MS;
	o.reconnect_min_ms = FAULT_T_MS;
	o.reconnect_max_ms = 4 * FAULT_T_MS;
	allot_agent *a;
	ck_assert_int_eq(allot_agent_create(cfg, &o, &a), ALLOT_OK);
	allot_config_free(cfg);
	return a;
}

/* ---- load ---- */

static void
count(allot_agent *a, allot_key *k, _Atomic uint64_t *ok,
    _Atomic uint64_t *denied, _Atomic uint64_t *err)
{
	allot_decision d;
	int rc = allot_acquire(a, k, 1, &d);
	if (rc != ALLOT_OK)
		atomic_fetch_add(err, 1);
	else if (d.allowed)
		atomic_fetch_add(ok, 1);
	else
		atomic_fetch_add(denied, 1);
}

/* An absolute schedule on CLOCK_MONOTONIC: a late tick does not shift
 * the ones after it, so the offered rate is the same on every run. */
static void *
load_main(void *arg)
{
	fault_load *l = arg;
	struct timespec next;
	clock_gettime(CLOCK_MONOTONIC, &next);
	for (uint64_t tick = 0; tick < l->max_ticks; tick++) {
		if (atomic_load(&l->stop))
			break;
		count(l->a, l->greedy, &l->greedy_ok, &l->greedy_denied,
		    &l->greedy_err);
		if (tick % FAULT_STEADY_EVERY == 0)
			count(l->a, l->steady, &l->steady_ok,
			    &l->steady_denied, &l->steady_err);
		next.tv_nsec += FAULT_TICK_US * 1000;
		while (next.tv_nsec >= 1000000000L) {
			next.tv_nsec -= 1000000000L;
			next.tv_sec++;
		}
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next,
		           NULL) == EINTR)
			;
	}
	atomic_store(&l->running, false);
	return NULL;
}

void
fault_load_start(fault_load *l, allot_agent *a, uint64_t max_ms)
{
	memset(l, 0, sizeof *l);
	l->a = a;
	ck_assert_int_eq(
	    allot_key_resolve(a, "steady", "/x", &l->steady), ALLOT_OK);
	ck_assert_int_eq(
	    allot_key_resolve(a, "greedy", "/x", &l->greedy), ALLOT_OK);
	l->max_ticks = max_ms * 1000u / FAULT_TICK_US;
	atomic_store(&l->running, true);
	ck_assert_int_eq(pthread_create(&l->thread, NULL, load_main, l), 0);
}

void
fault_load_stop(fault_load *l)
{
	atomic_store(&l->stop, true);
	pthread_join(l->thread, NULL);
}

void
fault_counts_get(fault_load *l, int n, fault_counts *ret)
{
	memset(ret, 0, sizeof *ret);
	for (int i = 0; i < n; i++) {
		ret->steady_ok += atomic_load(&l[i].steady_ok);
		ret->steady_failed += atomic_load(&l[i].steady_denied) +
		    atomic_load(&l[i].steady_err);
		ret->greedy_ok += atomic_load(&l[i].greedy_ok);
		ret->greedy_err += atomic_load(&l[i].greedy_err);
	}
}

double
fault_rate(allot_agent *a, const char *quota)
{
	allot_key *k;
	ck_assert_int_eq(allot_key_resolve(a, quota, "/x", &k), ALLOT_OK);
	allot_key_stats st;
	ck_assert_int_eq(allot_key_stats_get(a, k, &st), ALLOT_OK);
	return st.rate;
}

uint64_t
fault_await_synced(
    allot_agent **as, int n, uint64_t min_registers, int timeout_ms)
{
	uint64_t t0 = pc_now_ms();
	for (;;) {
		int ok = 0;
		double greedy = 0;
		uint32_t replicas = 0;
		for (int i = 0; i < n; i++) {
			allot_sync_stats ss;
			allot_sync_stats_get(as[i], &ss);
			double g = fault_rate(as[i], "greedy");
			greedy += g;
			replicas = ss.replicas;
			ok += ss.connected && !ss.in_fallback &&
			    ss.registers >= min_registers && ss.syncs_ok > 0 &&
			    g > 0 && fault_rate(as[i], "steady") > 0;
		}
		/* All of the quota handed out again (the agents asked for
		 * all of it), to within float noise. */
		bool full = replicas == (uint32_t) n &&
		    greedy >= FAULT_R * 0.95;
		if (ok == n && full)
			return pc_now_ms() - t0;
		ck_assert_msg(pc_now_ms() - t0 < (uint64_t) timeout_ms,
		    "agents not synced after %d ms (%d of %d ok, greedy "
		    "rates sum to %.1f, %u replicas)",
		    timeout_ms, ok, n, greedy, replicas);
		pc_sleep_ms(2);
	}
}

double
fault_over_rt(uint64_t admitted, uint64_t window_ms)
{
	double ideal = FAULT_R * (double) window_ms / 1000.0;
	double rt = FAULT_R * FAULT_T_MS / 1000.0;
	return ((double) admitted - ideal) / rt;
}

/* ---- the report ---- */

static void
json_num(FILE *f, double v)
{
	if (isnan(v))
		fputs("null", f);
	else
		fprintf(f, "%.3f", v);
}

static void
write_line(FILE *f, const fault_figures *r)
{
	fputs("{\"id\":", f);
	allot__json_fputs(f, r->id);
	fputs(",\"fault\":", f);
	allot__json_fputs(f, r->fault);
	fputs(",\"promised\":", f);
	allot__json_fputs(f, r->promised);
	fprintf(f, ",\"requests\":%llu,\"failed\":%llu,\"over_rt\":",
	    (unsigned long long) r->requests, (unsigned long long) r->failed);
	json_num(f, r->over_rt);
	fputs(",\"recovery_ms\":", f);
	json_num(f, r->recovery_ms);
	fputs(",\"measured\":", f);
	allot__json_fputs(f, r->measured);
	fputs("}\n", f);
}

void
fault_report(const fault_figures *r)
{
	write_line(stdout, r);
	fflush(stdout);
	const char *path = getenv("ALLOT_FAULT_REPORT");
	if (path == NULL || path[0] == '\0')
		return;
	/* One write of the whole line with O_APPEND: lines of tests running
	 * at once never interleave. */
	char *buf = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&buf, &len);
	ck_assert_ptr_nonnull(m);
	write_line(m, r);
	fclose(m);
	int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
	ck_assert_msg(fd >= 0, "cannot open %s: %s", path, strerror(errno));
	ck_assert_int_eq(write(fd, buf, len), (ssize_t) len);
	close(fd);
	free(buf);
}

/* ---- store and metrics ---- */

/* `s` in single quotes for sh, each ' as '\'' */
static void
shell_quote(char *out, size_t cap, const char *s)
{
	size_t n = 0;
	out[n++] = '\'';
	for (; *s != '\0' && n + 5 < cap; s++) {
		if (*s == '\'') {
			memcpy(out + n, "'\\''", 4);
			n += 4;
		} else {
			out[n++] = *s;
		}
	}
	ck_assert_msg(*s == '\0', "command too long");
	out[n++] = '\'';
	out[n] = '\0';
}

char *
fault_sql(const char *db, const char *sql)
{
	char qdb[512], qsql[2048], cmd[2600];
	shell_quote(qdb, sizeof qdb, db);
	shell_quote(qsql, sizeof qsql, sql);
	snprintf(
	    cmd, sizeof cmd, "sqlite3 -readonly -batch %s %s 2>&1", qdb, qsql);
	return pc_shell(cmd);
}

long long
fault_sql_int(const char *db, const char *sql)
{
	char *out = fault_sql(db, sql);
	ck_assert_msg(out != NULL, "sqlite3 failed: %s", sql);
	char *end;
	long long v = strtoll(out, &end, 10);
	ck_assert_msg(end != out, "sqlite3 said \"%s\" to %s", out, sql);
	free(out);
	return v;
}

double
fault_metric(const fault_env *e, const char *series)
{
	return pc_metric_get(e->c.http, series);
}

int64_t
fault_wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- store outages ---- */

static double
metric_now(const fault_env *e, const char *name)
{
	double v = fault_metric(e, name);
	ck_assert_msg(!isnan(v), "no %s in /metrics", name);
	return v;
}

#define M_FAIL "allotd_store_commit_failures_total"
#define M_PENDING "allotd_store_pending_rows"
#define M_WRITTEN "allotd_store_rows_written_total"

void
fault_store_outage(fault_env *e, const fault_outage *o, fault_figures *f)
{
	enum { N = 3 };
	fault_allotd_start(e);
	allot_agent *as[N + 1];
	fault_load ld[N];
	for (int i = 0; i < N; i++) {
		char id[16];
		snprintf(id, sizeof id, "r%d", i);
		as[i] = fault_agent(e->c.url, id);
	}
	fault_await_synced(as, N, 1, 10000);
	for (int i = 0; i < N; i++)
		fault_load_start(&ld[i], as[i], 60000);
	/* Commits are made every second: let a few succeed first. */
	pc_sleep_ms(1500);
	double fail0 = metric_now(e, M_FAIL);
	ck_assert(metric_now(e, M_WRITTEN) > 0);
	uint64_t syncs0[N];
	for (int i = 0; i < N; i++) {
		allot_sync_stats ss;
		allot_sync_stats_get(as[i], &ss);
		syncs0[i] = ss.syncs_ok;
	}
	fault_counts c0, c1;
	fault_counts_get(ld, N, &c0);
	int64_t wall0 = fault_wall_ms();
	uint64_t t0 = pc_now_ms();

	o->begin(o->ctx);
	/* A replica joins while nothing can be written. */
	as[N] = fault_agent(e->c.url, "late");
	uint64_t first_fail = 0;
	double pending_max = 0;
	while (pc_now_ms() - t0 < o->outage_ms) {
		double fails = metric_now(e, M_FAIL);
		double pending = metric_now(e, M_PENDING);
		if (first_fail == 0 && fails > fail0)
			first_fail = pc_now_ms() - t0;
		if (pending > pending_max)
			pending_max = pending;
		pc_sleep_ms(50);
	}
	double fails_outage = metric_now(e, M_FAIL) - fail0;
	ck_assert_msg(first_fail > 0, "no commit failed during the outage");
	ck_assert(pending_max > 0);
	double written1 = metric_now(e, M_WRITTEN);
	for (int i = 0; i <= N; i++) {
		allot_sync_stats ss;
		allot_sync_stats_get(as[i], &ss);
		ck_assert_msg(
		    ss.connected && !ss.in_fallback && ss.fallback_enters == 0,
		    "agent %d lost allotd", i);
		/* Replies kept coming: at least a quarter of the syncs. */
		if (i < N)
			ck_assert_uint_ge(ss.syncs_ok - syncs0[i],
			    o->outage_ms / FAULT_T_MS / 4);
		else
			ck_assert_uint_ge(ss.registers, 1);
	}
	/* The whole seconds inside the outage: their usage is queued, not
	 * written, until the outage ends. */
	int64_t wall1 = fault_wall_ms();
	int64_t s0 = (wall0 / 1000 + 1) * 1000;
	int64_t s1 = (wall1 / 1000) * 1000;
	ck_assert(s1 > s0);
	char sql[256];
	snprintf(sql, sizeof sql,
	    "SELECT count(*) FROM usage WHERE at >= "
	    "%lld AND at < %lld",
	    (long long) s0, (long long) s1);
	long long during_before = fault_sql_int(e->c.db, sql);
	long long late_before = fault_sql_int(e->c.db,
	    "SELECT count(*) FROM replicas WHERE replica_id = 'late'");
	uint64_t t1 = pc_now_ms();
	fault_counts_get(ld, N, &c1);

	o->end(o->ctx);
	for (;;) {
		if (metric_now(e, M_PENDING) == 0 &&
		    metric_now(e, M_WRITTEN) > written1)
			break;
		ck_assert_msg(
		    pc_now_ms() - t1 < 5000, "allotd did not resume writing");
		pc_sleep_ms(5);
	}
	uint64_t recovery = pc_now_ms() - t1;
	long long during_after = fault_sql_int(e->c.db, sql);
	long long late_after = fault_sql_int(e->c.db,
	    "SELECT count(*) FROM replicas WHERE replica_id = 'late'");
	for (int i = 0; i < N; i++)
		fault_load_stop(&ld[i]);

	char *log = pc_read_file(e->c.log);
	ck_assert_ptr_nonnull(log);
	ck_assert_msg(strstr(log, "ALLOT-STORE-FAIL") != NULL &&
	        strstr(log, o->log_text) != NULL,
	    "no ALLOT-STORE-FAIL ... %s "
	    "in %s",
	    o->log_text, e->c.log);
	ck_assert_msg(strstr(log, "ALLOT-STORE-OK") != NULL,
	    "no ALLOT-STORE-OK in %s", e->c.log);
	free(log);

	f->requests = c1.steady_ok + c1.steady_failed;
	f->failed = c1.steady_failed + c1.greedy_err;
	f->over_rt = fault_over_rt(c1.greedy_ok - c0.greedy_ok, t1 - t0);
	f->recovery_ms = (double) recovery;
	snprintf(f->measured, sizeof f->measured,
	    "outage %.1f s: first commit failure after %llu ms, %.0f failed "
	    "commits, up to %.0f rows queued; rows of the outage's whole "
	    "seconds in the file: %lld during, %lld after; the replica that "
	    "joined meanwhile: %lld row during, %lld after",
	    (double) (t1 - t0) / 1000.0, (unsigned long long) first_fail,
	    fails_outage, pending_max, during_before, during_after,
	    late_before, late_after);
	fault_report(f);

	ck_assert_int_eq(during_before, 0);
	ck_assert_int_gt(during_after, 0);
	ck_assert_int_eq(late_before, 0);
	ck_assert_int_eq(late_after, 1);
	ck_assert_msg(f->failed == 0, "%llu requests below their share failed",
	    (unsigned long long) f->failed);
	ck_assert(f->over_rt <= (FAULT_B_GREEDY + FAULT_R * FAULT_T_MS / 1e3) /
	        (FAULT_R * FAULT_T_MS / 1e3));
	for (int i = 0; i <= N; i++)
		allot_agent_destroy(as[i]);
	/* A clean stop writes everything: exit status 0. */
	ck_assert_int_eq(fault_allotd_stop(e, SIGTERM), 0);
}
