/* SPDX-License-Identifier: MIT */
/*
 * The record is exact (issue 26; docs/operations.md, "The accounting
 * guarantee"): real liballot agents under steady load decide against
 * real allotd processes that are SIGKILLed again and again, and
 * afterwards the audit holds, per quota, exactly the tokens the agents
 * admitted and denied: none lost to a kill or a failover, none booked
 * twice when an agent sends its records again. One allotd killed and
 * restarted five times on its database (once after 3 s: the agents in
 * fallback meanwhile); a Raft cluster of three whose
 * leader is killed five times and a follower twice (each restarted on
 * its log and database) and whose files are locked by an auditor (a
 * follower's for 5 s, the leader's for 2 s), every member's file
 * checked. The load is counted by the test itself, decision by decision
 * and second by second: every file's seconds hold the agents' within
 * the skew bound.
 */
#include <check.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <allot/allot.h>
#include <sqlite3.h>

#include "allotd.h"
#include "proc.h"
#include "proto_client.h"
#include "runner.h"

#define AGENTS 4
#define MEMBERS 3
#define ELECTION_MS 300

/* c1 is under its quota, c2 far over it (denials), an unlisted caller
 * is the default's. */
static const char *const CFG =
    "quotas:\n"
    "  default: {tokens_per_second: 50, burst: 50}\n"
    "  callers:\n"
    "    - identity: c1\n      tokens_per_second: 2000\n"
    "      burst: 2000\n"
    "    - identity: c2\n      tokens_per_second: 40\n"
    "      burst: 40\n";

/* The change applied to the cluster: c2 doubled. */
static const char *const CFG2 =
    "quotas:\n"
    "  default: {tokens_per_second: 50, burst: 50}\n"
    "  callers:\n"
    "    - identity: c1\n      tokens_per_second: 2000\n"
    "      burst: 2000\n"
    "    - identity: c2\n      tokens_per_second: 80\n"
    "      burst: 80\n";

static const char *const CALLERS[] = { "c1", "c2", "someone" };
static const char *const QUOTAS[] = { "c1", "c2", "default" };
#define NCALLERS 3
#define SECONDS 400

typedef struct load {
	allot_agent *a[AGENTS];
	pthread_t th[AGENTS];
	_Atomic bool stop;
	/* What the agents decided, per caller, as the test saw it, and
	 * per wall-clock second from `t0_s` (every caller). */
	_Atomic uint64_t admitted[NCALLERS];
	_Atomic uint64_t denied[NCALLERS];
	int64_t t0_s;
	_Atomic uint64_t per_s[SECONDS];
} load;

typedef struct worker {
	load *l;
	int i;
} worker;

static uint64_t
wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t) ts.tv_sec * 1000u + (uint64_t) ts.tv_nsec / 1000000u;
}

/* About 600 decisions a second per agent, bounded to 5 minutes. */
static void *
run(void *arg)
{
	worker *w = arg;
	load *l = w->l;
	uint64_t end = pc_now_ms() + 300000;
	for (uint64_t n = 0; !atomic_load(&l->stop) && pc_now_ms() < end;
	     n++) {
		int c = (int) ((n + (uint64_t) w->i) % NCALLERS);
		allot_decision d;
		if (allot_acquire_id(l->a[w->i], CALLERS[c], "/x", 1, &d) !=
		    ALLOT_OK)
			continue;
		if (d.allowed)
			atomic_fetch_add(&l->admitted[c], 1);
		else
			atomic_fetch_add(&l->denied[c], 1);
		int64_t sec = (int64_t) (wall_ms() / 1000) - l->t0_s;
		if (sec >= 0 && sec < SECONDS)
			atomic_fetch_add(&l->per_s[sec], 1);
		if (n % 6 == 5)
			pc_sleep_ms(10);
	}
	free(w);
	return NULL;
}

static void
load_start(load *l, const char *coordinators)
{
	memset(l, 0, sizeof *l);
	l->t0_s = (int64_t) (wall_ms() / 1000) - 1;
	char err[256];
	allot_config *cfg;
	for (int i = 0; i < AGENTS; i++) {
		char path[64];
		snprintf(path, sizeof path, "/tmp/allot-record-cfg-%d.yaml",
		    (int) getpid());
		pc_write_file(path, CFG);
		ck_assert_int_eq(
		    allot_config_load(path, err, sizeof err, &cfg), ALLOT_OK);
		unlink(path);
		allot_agent_options o;
		allot_agent_options_init(&o);
		o.coordinator = coordinators;
		o.service = "svc";
		char id[16];
		snprintf(id, sizeof id, "r%d", i);
		o.replica_id = id;
		o.sync_interval_ms = 100;
		o.reconnect_min_ms = 50;
		o.reconnect_max_ms = 200;
		ck_assert_int_eq(
		    allot_agent_create(cfg, &o, &l->a[i]), ALLOT_OK);
		allot_config_free(cfg);
		worker *w = malloc(sizeof *w);
		ck_assert_ptr_nonnull(w);
		*w = (worker) { .l = l, .i = i };
		ck_assert_int_eq(pthread_create(&l->th[i], NULL, run, w), 0);
	}
}

/* Stop deciding, then destroy the agents: each Leave carries its last
 * records. */
static void
load_stop(load *l)
{
	atomic_store(&l->stop, true);
	for (int i = 0; i < AGENTS; i++)
		pthread_join(l->th[i], NULL);
	for (int i = 0; i < AGENTS; i++)
		allot_agent_destroy(l->a[i]);
}

/* A file's admitted and denied tokens of quota `q`. */
static void
audited(const char *db, const char *q, uint64_t *ret_adm, uint64_t *ret_den)
{
	char cmd[512];
	snprintf(cmd, sizeof cmd,
	    "sqlite3 -readonly %s \"SELECT coalesce(sum(admitted), 0), "
	    "coalesce(sum(denied), 0) FROM usage WHERE service = 'svc' "
	    "AND quota = '%s'\"",
	    db, q);
	char *s = pc_shell(cmd);
	unsigned long long a = 0, d = 0;
	if (s == NULL || sscanf(s, "%llu|%llu", &a, &d) != 2)
		a = d = UINT64_MAX;
	free(s);
	*ret_adm = a;
	*ret_den = d;
}

/* Whether `db` holds exactly what the agents decided, per quota; with
 * `say`, what differs is printed. */
static bool
exact(const load *l, const char *db, bool say)
{
	bool ok = true;
	for (int c = 0; c < NCALLERS; c++) {
		uint64_t a, d;
		audited(db, QUOTAS[c], &a, &d);
		uint64_t wa = atomic_load(&l->admitted[c]);
		uint64_t wd = atomic_load(&l->denied[c]);
		if (say)
			fprintf(stderr,
			    "record: %s %s admitted %" PRIu64
			    " (agents %" PRIu64 "), denied %" PRIu64
			    " (agents %" PRIu64 ")\n",
			    db, QUOTAS[c], a, wa, d, wd);
		ok &= a == wa && d == wd;
	}
	return ok;
}

/* The time of the record: up to every second, what the file holds is
 * at least what the agents decided up to the second before and at most
 * what they decided up to the second after (a decision is booked in the
 * second its agent next looked at its counters: a few ms later, a
 * boundary at most). */
static void
seconds_within_skew(const load *l, const char *db)
{
	char cmd[512];
	snprintf(cmd, sizeof cmd,
	    "sqlite3 -readonly %s \"SELECT at / 1000, sum(admitted + denied) "
	    "FROM usage WHERE service = 'svc' GROUP BY at ORDER BY at\"",
	    db);
	char *out = pc_shell(cmd);
	ck_assert_ptr_nonnull(out);
	static uint64_t audit[SECONDS];
	memset(audit, 0, sizeof audit);
	for (char *line = strtok(out, "\n"); line != NULL;
	     line = strtok(NULL, "\n")) {
		long long sec;
		unsigned long long n;
		ck_assert_int_eq(sscanf(line, "%lld|%llu", &sec, &n), 2);
		sec -= l->t0_s;
		ck_assert_msg(sec >= 0 && sec < SECONDS,
		    "a usage row outside the run: %s", line);
		audit[sec] += n;
	}
	free(out);
	uint64_t ca = 0, cw = 0, cw_prev = 0;
	for (int s = 0; s < SECONDS - 1; s++) {
		ca += audit[s];
		cw_prev = cw;
		cw += atomic_load(&l->per_s[s]);
		uint64_t cw_next = cw + atomic_load(&l->per_s[s + 1]);
		ck_assert_msg(ca >= cw_prev && ca <= cw_next,
		    "second %d: the file holds %" PRIu64 " tokens to it, the "
		    "agents decided %" PRIu64
		    " to the second before and %" PRIu64 " to the one after",
		    s, ca, cw_prev, cw_next);
	}
}

START_TEST(single_allotd_killed_five_times)
{
	pc_coord e;
	pc_coord_init(&e, "/tmp/allot-record", CFG);
	const char *args[] = { "--interval-ms", "100", NULL };
	pc_coord_spawn(&e, args, NULL);
	load l;
	load_start(&l, e.url);
	/* The third outage lasts 3 s: the agents run on their lease, then
	 * in fallback, and keep what they decide. */
	for (int k = 0; k < 5; k++) {
		pc_sleep_ms(700);
		ck_assert_int_eq(
		    pc_coord_stop(&e, SIGKILL, 5000), 128 + SIGKILL);
		pc_sleep_ms(k == 2 ? 3000 : 200);
		pc_coord_spawn(&e, args, NULL);
	}
	pc_sleep_ms(1500);
	load_stop(&l);
	/* The Leaves are booked; SIGTERM commits them. */
	ck_assert_int_eq(pc_coord_stop(&e, SIGTERM, 10000), 0);
	ck_assert(l.admitted[0] > 0 && l.denied[1] > 0);
	ck_assert_msg(exact(&l, e.db, true),
	    "the audit differs from what the agents decided");
	seconds_within_skew(&l, e.db);
	pc_coord_done(&e, 5000);
}
END_TEST

typedef struct cluster {
	const char *const *args; /* MEMBER_ARGS or COMPACT_ARGS */
	char dir[64];
	pc_member m[2 * MEMBERS];
	char urls[MEMBERS * 72];
} cluster;

/* The members' options. The log compacts every 1,024 entries by
 * default, so that a member killed and restarted replays what it missed
 * from the log into its file; the snapshot case compacts every 16, so
 * that a new member receives a snapshot (whose rows before it no file of
 * the new member holds: docs/operations.md, "Audit on every member"). */
static const char *const MEMBER_ARGS[] = { "--interval-ms", "100", NULL };
static const char *const COMPACT_ARGS[] = { "--interval-ms", "100",
	"--snapshot-entries", "16", NULL };

static void
member_start(cluster *c, int i)
{
	pc_member_start(&c->m[i], c->m, MEMBERS, ELECTION_MS, c->args);
}

/* An auditor's write transaction on member `i`'s file for `ms`: the
 * member cannot write its entries meanwhile (backlog.h). */
static void
lock_file(const cluster *c, int i, unsigned ms)
{
	sqlite3 *db;
	ck_assert_int_eq(
	    sqlite3_open_v2(c->m[i].c.db, &db, SQLITE_OPEN_READWRITE, NULL),
	    SQLITE_OK);
	sqlite3_busy_timeout(db, 5000);
	ck_assert_int_eq(
	    sqlite3_exec(db, "BEGIN EXCLUSIVE", NULL, NULL, NULL), SQLITE_OK);
	pc_sleep_ms(ms);
	ck_assert_int_eq(
	    sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
	ck_assert_int_eq(sqlite3_close(db), SQLITE_OK);
}

/* Kill member `i` with SIGKILL and start it again on its log and
 * database once `before_ms` passed. */
static void
bounce(cluster *c, int i, unsigned before_ms)
{
	ck_assert_int_eq(
	    pc_coord_stop(&c->m[i].c, SIGKILL, 5000), 128 + SIGKILL);
	c->m[i].up = false;
	pc_sleep_ms(before_ms);
	member_start(c, i);
}

/* Three members seeded with each other, one serving, and `urls` the
 * agents' seed list. */
static void
cluster_start(cluster *c, const char *const *args)
{
	memset(c, 0, sizeof *c);
	c->args = args;
	pc_mkdtemp(c->dir, sizeof c->dir, "/tmp/allot-record");
	for (int i = 0; i < MEMBERS; i++)
		pc_member_init(&c->m[i], c->dir, (uint64_t) i + 1, CFG);
	for (int i = 0; i < MEMBERS; i++)
		member_start(c, i);
	ck_assert_int_ge(pc_member_serving(c->m, MEMBERS, 15000), 0);
	for (int i = 0; i < MEMBERS; i++) {
		size_t n = strlen(c->urls);
		snprintf(c->urls + n, sizeof c->urls - n, "%s%s",
		    i > 0 ? "," : "", c->m[i].c.url);
	}
}

/* Stop every member still running and remove the directory. */
static void
cluster_done(cluster *c)
{
	for (int i = 0; i < 2 * MEMBERS; i++)
		if (c->m[i].c.dir[0] != '\0')
			pc_coord_done(&c->m[i].c, 5000);
	if (getenv("ALLOT_KEEP_TMP") == NULL)
		pc_rm_rf(c->dir);
}

START_TEST(cluster_leader_killed_five_times)
{
	cluster c;
	cluster_start(&c, MEMBER_ARGS);
	load l;
	load_start(&l, c.urls);
	for (int k = 0; k < 7; k++) {
		pc_sleep_ms(600);
		int L = pc_member_serving(c.m, MEMBERS, 15000);
		ck_assert_int_ge(L, 0);
		/* Five leaders, and (the third and sixth time) a follower. */
		int victim = k == 2 || k == 5 ? (L + 1) % MEMBERS : L;
		bounce(&c, victim, 400);
	}
	/* A follower's file locked for 5 s, then the leader's for 2 s
	 * (it hands leadership over): both catch up. */
	int L = pc_member_serving(c.m, MEMBERS, 15000);
	ck_assert_int_ge(L, 0);
	lock_file(&c, (L + 1) % MEMBERS, 5000);
	L = pc_member_serving(c.m, MEMBERS, 15000);
	ck_assert_int_ge(L, 0);
	lock_file(&c, L, 2000);
	ck_assert_int_ge(pc_member_serving(c.m, MEMBERS, 15000), 0);
	pc_sleep_ms(1500);
	load_stop(&l);
	ck_assert(l.admitted[0] > 0 && l.denied[1] > 0);
	/* Every member applies the leader's entries: poll until each file
	 * holds them (or 15 s). */
	for (int i = 0; i < MEMBERS; i++) {
		uint64_t until = pc_now_ms() + 15000;
		while (!exact(&l, c.m[i].c.db, false) && pc_now_ms() < until)
			pc_sleep_ms(100);
		ck_assert_msg(exact(&l, c.m[i].c.db, true),
		    "member %d's audit differs from what the agents decided",
		    i + 1);
		seconds_within_skew(&l, c.m[i].c.db);
	}
	cluster_done(&c);
}
END_TEST

/* `sql` on member `i`'s file, as text, each row ending in a newline. */
static char *
sql(const cluster *c, int i, const char *q)
{
	char cmd[768];
	snprintf(
	    cmd, sizeof cmd, "sqlite3 -readonly %s \"%s\"", c->m[i].c.db, q);
	char *r = pc_shell(cmd);
	size_t n = r != NULL ? strlen(r) : 0;
	char *out = malloc(n + 2);
	ck_assert_ptr_nonnull(out);
	memcpy(out, r != NULL ? r : "", n);
	out[n] = '\0';
	if (n > 0 && out[n - 1] != '\n')
		strcpy(out + n, "\n");
	free(r);
	return out;
}

/* Every agent enforces the config of `digest`. */
static bool
agents_enforce(const load *l, uint64_t digest)
{
	for (int i = 0; i < AGENTS; i++) {
		allot_sync_stats ss;
		allot_sync_stats_get(l->a[i], &ss);
		if (ss.enforced_digest != digest)
			return false;
	}
	return true;
}

/* A config change, log compaction, then each original member replaced
 * by a new one started from the original file: the new members take
 * the change from the snapshot (never their own file), agents keep it
 * throughout, and every new member's audit names its author. */
START_TEST(members_replaced_after_compaction)
{
	cluster c;
	cluster_start(&c, COMPACT_ARGS);
	int L = pc_member_serving(c.m, MEMBERS, 15000);
	ck_assert_int_ge(L, 0);
	load l;
	load_start(&l, c.urls);
	uint64_t d0 = 0;
	for (uint64_t t = pc_now_ms() + 10000; d0 == 0 && pc_now_ms() < t;) {
		allot_sync_stats ss;
		allot_sync_stats_get(l.a[0], &ss);
		d0 = ss.connected ? ss.enforced_digest : 0;
		pc_sleep_ms(50);
	}
	ck_assert_uint_ne(d0, 0);
	char path[256];
	snprintf(path, sizeof path, "%s/next.yaml", c.dir);
	pc_write_file(path, CFG2);
	const char *argv[] = { pc_program("tools/allotctl"), "apply", path,
		"--reason", "double c2", NULL };
	pc_run_result r = pc_run(
	    argv, c.dir, c.dir, "ALLOT_ADMIN_SOCKET", c.m[L].c.sock, 30000);
	ck_assert_msg(r.status == 0, "allotctl apply: %s %s", r.out, r.err);
	pc_run_free(&r);
	/* Every agent takes the change (the config plane). */
	uint64_t digest = 0;
	uint64_t until = pc_now_ms() + 10000;
	while (pc_now_ms() < until) {
		allot_sync_stats ss;
		allot_sync_stats_get(l.a[0], &ss);
		digest = ss.enforced_digest != d0 ? ss.enforced_digest : 0;
		if (digest != 0 && agents_enforce(&l, digest))
			break;
		pc_sleep_ms(50);
	}
	ck_assert_uint_ne(digest, 0);
	ck_assert(agents_enforce(&l, digest));
	/* Compaction: the CONFIG entry leaves the log (a snapshot every 16
	 * entries, 16 kept; a few entries a second). Each new member below
	 * says it installed a snapshot. */
	pc_sleep_ms(5000);
	/* Each original member in turn: a new one (ids 4, 5, 6) joins from
	 * the snapshot with the original file, the old one is removed. */
	for (int k = 0; k < MEMBERS; k++) {
		L = pc_member_serving(c.m, 2 * MEMBERS, 15000);
		ck_assert_int_ge(L, 0);
		int old = k == L ? (k + 1) % MEMBERS : k;
		if (!c.m[old].up)
			old = L;
		int nw = MEMBERS + k;
		pc_member_init(&c.m[nw], c.dir, (uint64_t) nw + 1, CFG);
		pc_member_start(&c.m[nw], NULL, 0, ELECTION_MS, COMPACT_ARGS);
		char args[256];
		snprintf(args, sizeof args, "add %d %s %s", nw + 1,
		    c.m[nw].raftaddr, c.m[nw].c.url);
		/* Refused while the previous removal is still being
		 * committed, or by a member that just lost the lead (both
		 * seen on a loaded host): asked again, of whoever serves. */
		until = pc_now_ms() + 20000;
		int added;
		while ((added = pc_ctl_member(c.m[L].c.sock, args)) != 0 &&
		    !pc_member_listed(c.m[L].c.sock, c.m[nw].id) &&
		    pc_now_ms() < until) {
			pc_sleep_ms(200);
			int s = pc_member_serving(c.m, 2 * MEMBERS, 5000);
			L = s >= 0 ? s : L;
		}
		ck_assert(
		    added == 0 || pc_member_listed(c.m[L].c.sock, c.m[nw].id));
		until = pc_now_ms() + 20000;
		while (!pc_member_is_voter(c.m[L].c.sock, c.m[nw].id) &&
		    pc_now_ms() < until)
			pc_sleep_ms(100);
		ck_assert(pc_member_is_voter(c.m[L].c.sock, c.m[nw].id));
		snprintf(args, sizeof args, "remove %" PRIu64, c.m[old].id);
		until = pc_now_ms() + 20000;
		int rc;
		while ((rc = pc_ctl_member(c.m[L].c.sock, args)) != 0 &&
		    pc_now_ms() < until)
			pc_sleep_ms(200);
		ck_assert_int_eq(rc, 0);
		pc_sleep_ms(1500);
		pc_coord_stop(&c.m[old].c, SIGTERM, 10000);
		c.m[old].up = false;
		/* The agents never went back to the old config. */
		ck_assert(agents_enforce(&l, digest));
		char *log = pc_read_file(c.m[nw].c.log);
		ck_assert_msg(
		    log != NULL && strstr(log, "installed a snapshot") != NULL,
		    "member %d joined from the log, not a snapshot", nw + 1);
		free(log);
	}
	/* Served by a new member, whose file is the changed config. */
	L = pc_member_serving(c.m, 2 * MEMBERS, 15000);
	ck_assert_int_ge(L, MEMBERS);
	pc_sleep_ms(1000);
	ck_assert(agents_enforce(&l, digest));
	load_stop(&l);
	for (int i = MEMBERS; i < 2 * MEMBERS; i++) {
		char *file = pc_read_file(c.m[i].c.cfg);
		ck_assert_ptr_nonnull(file);
		ck_assert_str_eq(file, CFG2);
		free(file);
		/* The change, with its author and reason, in its audit. */
		char *who = sql(&c, i,
		    "SELECT count(*) FROM v_quota_changes WHERE reason = "
		    "'double c2' AND quota = 'c2'");
		ck_assert_msg(atoi(who) >= 1,
		    "member %d: v_quota_changes lacks the change (%s)", i + 1,
		    who);
		free(who);
	}
	cluster_done(&c);
}
END_TEST

/* The leader SIGKILLed right after `allotctl apply` returns (the change
 * committed), five times: every member names the same author and
 * reason for every change, once, and none a start-up edit. */
START_TEST(author_survives_leader_kill)
{
	cluster c;
	cluster_start(&c, MEMBER_ARGS);
	for (int k = 0; k < 5; k++) {
		int L = pc_member_serving(c.m, MEMBERS, 15000);
		ck_assert_int_ge(L, 0);
		char path[256], text[512], reason[32];
		snprintf(path, sizeof path, "%s/change%d.yaml", c.dir, k);
		snprintf(text, sizeof text,
		    "quotas:\n  default: {tokens_per_second: 50, burst: 50}\n"
		    "  callers:\n    - identity: c2\n"
		    "      tokens_per_second: %d\n      burst: 80\n",
		    41 + k);
		pc_write_file(path, text);
		snprintf(reason, sizeof reason, "change %d", k);
		const char *argv[] = { pc_program("tools/allotctl"), "apply",
			path, "--reason", reason, NULL };
		pc_run_result r = pc_run(argv, c.dir, c.dir,
		    "ALLOT_ADMIN_SOCKET", c.m[L].c.sock, 30000);
		ck_assert_msg(
		    r.status == 0, "allotctl apply: %s %s", r.out, r.err);
		pc_run_free(&r);
		bounce(&c, L, 300);
	}
	ck_assert_int_ge(pc_member_serving(c.m, MEMBERS, 15000), 0);
	/* Every member applied everything: the same rows everywhere. */
	const char *q = "SELECT epoch || ':' || who || ':' || "
	                "coalesce(reason, '') FROM config_changes ORDER BY id";
	char *first = NULL;
	uint64_t until = pc_now_ms() + 15000;
	for (int i = 0; i < MEMBERS; i++) {
		char *rows = sql(&c, i, q);
		while (
		    pc_now_ms() < until && strstr(rows, ":change 4") == NULL) {
			free(rows);
			pc_sleep_ms(200);
			rows = sql(&c, i, q);
		}
		fprintf(
		    stderr, "record: member %d's changes:\n%s", i + 1, rows);
		for (int k = 0; k < 5; k++) {
			char want[32];
			snprintf(want, sizeof want, ":change %d\n", k);
			const char *at = strstr(rows, want);
			ck_assert_msg(
			    at != NULL && strstr(at + 1, want) == NULL,
			    "member %d: \"%s\" not there once", i + 1,
			    want + 1);
		}
		ck_assert_msg(
		    strstr(rows, "changed while allotd was stopped") == NULL,
		    "member %d recorded a start-up edit", i + 1);
		if (first == NULL)
			first = rows;
		else {
			ck_assert_str_eq(rows, first);
			free(rows);
		}
	}
	free(first);
	cluster_done(&c);
}
END_TEST

/* ---- an account is its agent's: another peer cannot shadow it ---- */

static uint64_t
reg_account(pc_conn *c, const char *url, const char *replica, uint64_t inc)
{
	ck_assert_int_eq(pc_open(c, url, 5000), 0);
	static const char *const keys[] = { "c1" };
	Allot__V1__Envelope *w = pc_register_account(
	    c, replica, "svc", keys, 1, 100, inc);
	ck_assert_ptr_nonnull(w);
	ck_assert_int_eq(w->body_case, ALLOT__V1__ENVELOPE__BODY_WELCOME);
	uint64_t session = w->welcome->session;
	pc_free(w);
	return session;
}

/* One Sync carrying Usage record `id`: `admitted` tokens of c1 now. The
 * Reply's durable. */
static uint64_t
sync_usage(
    pc_conn *c, uint64_t session, uint64_t seq, uint64_t id, uint64_t admitted)
{
	Allot__V1__UsageCount n = ALLOT__V1__USAGE_COUNT__INIT;
	n.key = 0;
	n.admitted = admitted;
	Allot__V1__UsageCount *np = &n;
	Allot__V1__Usage u = ALLOT__V1__USAGE__INIT;
	u.id = id;
	u.second = (int64_t) (wall_ms() / 1000);
	u.span = 1;
	u.n_counts = 1;
	u.counts = &np;
	Allot__V1__Usage *up = &u;
	Allot__V1__Sync sy = ALLOT__V1__SYNC__INIT;
	sy.session = session;
	sy.seq = seq;
	sy.n_usage = 1;
	sy.usage = &up;
	Allot__V1__Envelope *r = pc_send_sync(c, &sy);
	ck_assert_ptr_nonnull(r);
	ck_assert_int_eq(r->body_case, ALLOT__V1__ENVELOPE__BODY_REPLY);
	uint64_t durable = r->reply->durable;
	pc_free(r);
	return durable;
}

/* A peer registers as another replica with the victim's incarnation and
 * a record id far ahead: both are booked in full, and the victim's later
 * records too (issue 27). The same record sent twice is booked once. */
START_TEST(account_bound_to_its_replica)
{
	pc_coord e;
	pc_coord_init(&e, "/tmp/allot-record", CFG);
	const char *args[] = { "--interval-ms", "100", NULL };
	pc_coord_spawn(&e, args, NULL);
	const uint64_t inc = 0x5eed5eed5eed5eedull;
	pc_conn v = { 0 }, a = { 0 };
	uint64_t sv = reg_account(&v, e.url, "victim", inc);
	uint64_t sa = reg_account(&a, e.url, "attacker", inc);
	(void) sync_usage(&v, sv, 1, 1, 10);
	(void) sync_usage(&v, sv, 2, 1, 10); /* sent again: once */
	(void) sync_usage(&a, sa, 1, 100, 7);
	(void) sync_usage(&v, sv, 3, 2, 10);
	/* Durable once a commit wrote them (a second or so). */
	uint64_t durable = 0;
	for (uint64_t seq = 4, t = pc_now_ms() + 5000;
	     durable < 2 && pc_now_ms() < t; seq++) {
		pc_sleep_ms(100);
		durable = sync_usage(&v, sv, seq, 2, 10);
	}
	ck_assert_uint_eq(durable, 2);
	pc_close(&v);
	pc_close(&a);
	ck_assert_int_eq(pc_coord_stop(&e, SIGTERM, 10000), 0);
	uint64_t adm, den;
	audited(e.db, "c1", &adm, &den);
	ck_assert_uint_eq(adm, 10 + 10 + 7);
	pc_coord_done(&e, 5000);
}
END_TEST

/* Applies that overlap on the leader: nobody is told a change was made
 * that the log dropped (before, an apply proposed while another was in
 * flight, the new cluster's first config included, took the same
 * epoch; the log's compare-and-set dropped it, and its allotctl said
 * "committed" once the other's epoch was in force). Each allotctl that
 * says committed finds its change in every member's audit, once; one
 * refused ("another change is being committed", or a digest that
 * changed since its diff) finds nothing of it there. The first round
 * runs as the new cluster starts serving, its first config in flight. */
static void
applies_round(cluster *c, int round)
{
	enum { N = 3 };
	int L = pc_member_serving(c->m, MEMBERS, 15000);
	ck_assert_int_ge(L, 0);
	char cmd[4096] = "";
	size_t n = 0;
	for (int k = 0; k < N; k++) {
		char path[256], text[256];
		snprintf(
		    path, sizeof path, "%s/t%d-%d.yaml", c->dir, round, k);
		snprintf(text, sizeof text,
		    "quotas:\n  default: {tokens_per_second: 50, burst: 50}\n"
		    "  callers:\n    - identity: c2\n"
		    "      tokens_per_second: %d\n      burst: 80\n",
		    100 + 10 * round + k);
		pc_write_file(path, text);
		n += (size_t) snprintf(cmd + n, sizeof cmd - n,
		    "ALLOT_ADMIN_SOCKET=%s %s apply %s --reason 'race %d-%d' "
		    ">%s/t%d-%d.out 2>&1; echo $? > %s/t%d-%d.rc & ",
		    c->m[L].c.sock, pc_program("tools/allotctl"), path, round,
		    k, c->dir, round, k, c->dir, round, k);
	}
	snprintf(cmd + n, sizeof cmd - n, "wait");
	free(pc_shell(cmd));
	bool ok[N];
	int told = 0;
	for (int k = 0; k < N; k++) {
		char rc[256];
		snprintf(rc, sizeof rc, "%s/t%d-%d.rc", c->dir, round, k);
		char *t = pc_read_file(rc);
		ck_assert_ptr_nonnull(t);
		ok[k] = atoi(t) == 0;
		told += ok[k];
		free(t);
	}
	ck_assert_int_ge(told, 1);
	for (int i = 0; i < MEMBERS; i++) {
		uint64_t until = pc_now_ms() + 10000;
		char *rows;
		for (;;) {
			rows = sql(c, i,
			    "SELECT reason FROM config_changes ORDER BY id");
			int seen = 0;
			for (int k = 0; k < N; k++) {
				char want[32];
				snprintf(want, sizeof want, "race %d-%d\n",
				    round, k);
				seen += ok[k] && strstr(rows, want);
			}
			if (seen == told || pc_now_ms() > until)
				break;
			free(rows);
			pc_sleep_ms(100);
		}
		fprintf(stderr,
		    "record: round %d, %d of %d overlapping applies told "
		    "committed; member %d's changes:\n%s",
		    round, told, N, i + 1, rows);
		for (int k = 0; k < N; k++) {
			char want[32];
			snprintf(want, sizeof want, "race %d-%d\n", round, k);
			const char *at = strstr(rows, want);
			ck_assert_msg(ok[k] ?
			        at != NULL && strstr(at + 1, want) == NULL :
			        at == NULL,
			    "member %d: \"%s\" %s", i + 1, want,
			    ok[k] ? "told committed, not there once" :
			            "refused, yet there");
		}
		free(rows);
	}
}

START_TEST(applies_told_the_truth)
{
	cluster c;
	memset(&c, 0, sizeof c);
	c.args = MEMBER_ARGS;
	pc_mkdtemp(c.dir, sizeof c.dir, "/tmp/allot-record");
	for (int i = 0; i < MEMBERS; i++)
		pc_member_init(&c.m[i], c.dir, (uint64_t) i + 1, CFG);
	for (int i = 0; i < MEMBERS; i++)
		member_start(&c, i);
	for (int round = 0; round < 3; round++)
		applies_round(&c, round);
	cluster_done(&c);
}
END_TEST

static Suite *
suite(void)
{
	Suite *s = suite_create("record");
	TCase *tc = tcase_create("exact");
	tcase_set_timeout(tc, 180);
	tcase_add_test(tc, single_allotd_killed_five_times);
	tcase_add_test(tc, cluster_leader_killed_five_times);
	tcase_add_test(tc, members_replaced_after_compaction);
	tcase_add_test(tc, author_survives_leader_kill);
	tcase_add_test(tc, applies_told_the_truth);
	tcase_add_test(tc, account_bound_to_its_replica);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(suite)
