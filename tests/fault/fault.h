/* SPDX-License-Identifier: MIT */
/*
 * The fault suite's harness: a scratch directory with a quota file, a real
 * allotd child (started, killed, restarted on the same database), real
 * agents (liballot) syncing with it every 50 ms, a load generator that
 * drives them from one thread per agent on a fixed schedule, and the
 * figures each test records for docs/reliability.md. Every wait is bounded
 * and every load loop ends after a fixed number of ticks.
 *
 * The load and the figures. Two quotas of R = 300 tokens/s are shared by
 * the agents (R/n each). "steady" is offered at half of its share, so
 * every denial or error on it is a request that failed because of the
 * limiter (the caller was below its share). "greedy" is offered at ten
 * times its share on every agent, so the sum admitted over a window W
 * measures over-admission: (admitted - R * W) / (R * T), in units of one
 * sync interval of traffic. The design bounds what all agents admit over
 * any window W by B + R(W + T), i.e. over-admission by B / (R T) + 1.
 */
#ifndef ALLOT_TESTS_FAULT_FAULT_H
#define ALLOT_TESTS_FAULT_FAULT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <allot/allot.h>

#include "allotd.h"
#include "proc.h"

/* The quotas every fault test runs (see above). */
#define FAULT_R 300.0 /* tokens/s, both quotas */
#define FAULT_B_STEADY 60.0
#define FAULT_B_GREEDY 30.0
#define FAULT_T_MS 50u /* agents' sync interval T */
#define FAULT_LEASE_MS 1000u /* allotd --lease-ms */
#define FAULT_EXPIRY 5u /* allotd --expiry-intervals (default) */
#define FAULT_TICK_US 1000u /* one greedy acquire per tick per agent */
#define FAULT_STEADY_EVERY 20u /* one steady acquire every N ticks */

typedef struct fault_env {
	/* allotd (tests/support/allotd.h): its directory, files, ports,
	 * extra environment (c.env) and process. */
	pc_coord c;
	const char *hold_expired; /* allotd --hold-expired; NULL: default */
} fault_env;

/* A scratch directory /tmp/allot-fault-NAME-XXXXXX with the quota file;
 * fresh ports; the database at DIR/allot.db unless `db_dir` is given.
 * A test that fails leaves it behind, with allotd's log, for a look. */
void fault_env_init(fault_env *e, const char *name, const char *db_dir);
/* SIGKILL allotd if running, remove the directory (kept with
 * ALLOT_KEEP_TMP); fails the test when allotd's log holds a sanitizer
 * report. */
void fault_env_fini(fault_env *e);

/* Spawn allotd and wait (10 s at most) for /healthz. Returns the ms it
 * took to answer. */
uint64_t fault_allotd_start(fault_env *e);
/* Send `sig` and reap (5 s at most). Returns the exit status as
 * pc_wait_exit() does. */
int fault_allotd_stop(fault_env *e, int sig);

/* An agent of service "svc" syncing with `url` every FAULT_T_MS. */
allot_agent *fault_agent(const char *url, const char *replica);

/* One load thread per agent. */
typedef struct fault_load {
	allot_agent *a;
	allot_key *steady;
	allot_key *greedy;
	pthread_t thread;
	uint64_t max_ticks;
	_Atomic bool stop;
	_Atomic bool running;
	_Atomic uint64_t steady_ok, steady_denied, steady_err;
	_Atomic uint64_t greedy_ok, greedy_denied, greedy_err;
} fault_load;

/* Start loading `a` for at most `max_ms`. */
void fault_load_start(fault_load *l, allot_agent *a, uint64_t max_ms);
void fault_load_stop(fault_load *l);

/* Sums over `n` loads. */
typedef struct fault_counts {
	uint64_t steady_ok, steady_failed; /* failed: denied or error */
	uint64_t greedy_ok, greedy_err;
} fault_counts;
void fault_counts_get(fault_load *l, int n, fault_counts *ret);

/* Local rate in force on an agent for a quota ("steady", "greedy"). */
double fault_rate(allot_agent *a, const char *quota);

/* Wait (bounded) until every agent is connected, out of fallback, has
 * registered at least `min_registers` times and runs both quotas at R/n.
 * Returns the ms waited. Fails the test on timeout. */
uint64_t fault_await_synced(
    allot_agent **as, int n, uint64_t min_registers, int timeout_ms);

/* Over-admission of greedy over a window of `window_ms` in which `admitted`
 * tokens passed, in units of R * T. */
double fault_over_rt(uint64_t admitted, uint64_t window_ms);

/* Record one row of the report (docs/reliability.md) as a JSON line in
 * the file named by $ALLOT_FAULT_REPORT (nothing when unset), and print
 * it. `over_rt` and `recovery_ms` may be NaN (not applicable). */
typedef struct fault_figures {
	const char *id; /* sort key, e.g. "1-restart" */
	const char *fault;
	const char *promised;
	uint64_t requests; /* steady requests offered */
	uint64_t failed; /* of which failed because of the limiter */
	double over_rt;
	double recovery_ms;
	char measured[512]; /* further figures, free text */
} fault_figures;
void fault_report(const fault_figures *f);

/* Run `sql` with the sqlite3 shell on `db`, read-only. The trimmed
 * output, malloc'd, or NULL. */
char *fault_sql(const char *db, const char *sql);
/* As fault_sql, one integer (fails the test when absent). */
long long fault_sql_int(const char *db, const char *sql);

/* A metric of allotd (NaN when unavailable). */
double fault_metric(const fault_env *e, const char *series);

/* Milliseconds of wall-clock time, for comparing with store rows. */
int64_t fault_wall_ms(void);

/* A store outage: `begin` makes allotd's commits fail, `end` lets them
 * succeed again. fault_store_outage() starts allotd (on e->db) and three
 * agents under load, runs `begin`, has a fourth agent join while commits
 * fail, keeps the outage for `outage_ms`, runs `end`, and asserts: every
 * agent kept syncing (connected, never in fallback), no request failed
 * because of the limiter, allotd counted commit failures and queued rows,
 * and after `end` it wrote them all: the late agent's replica row and the
 * usage of the seconds inside the outage appear. `log_text` must appear
 * in allotd's log. Fills `f` (except id, fault and promised). */
typedef struct fault_outage {
	void (*begin)(void *ctx);
	void (*end)(void *ctx);
	void *ctx;
	uint64_t outage_ms;
	const char *log_text;
} fault_outage;
void fault_store_outage(fault_env *e, const fault_outage *o, fault_figures *f);

#endif
