/* SPDX-License-Identifier: MIT */
/*
 * The load generator's engine, shared by its files: the counters, a
 * caller with its request slots and worker thread, the options, and the
 * one run's state (`lg`), which the main thread and the workers share
 * under the locks noted at each field. The pure pieces (parsing, pacing,
 * histograms) are in loadgen.h; this header is for the program only.
 *
 *   loadgen.c          main: the command line, start, tick, stop
 *   loadgen_run.c      the run's state, the clock and the messages
 *   loadgen_targets.c  the target table and the targets file
 *   loadgen_worker.c   a caller's thread: slots, attempts, retries
 *   loadgen_report.c   snapshots, JSON lines and the final table
 */
#ifndef ALLOT_TOOLS_LOADGEN_ENGINE_H
#define ALLOT_TOOLS_LOADGEN_ENGINE_H

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <curl/curl.h>

#include <allot/client.h>

#include "loadgen.h"

#define PROG "allot-loadgen"
#define NS_PER_MS UINT64_C(1000000)
#define NS_PER_S UINT64_C(1000000000)
/* The longest a worker sleeps before looking at the stop flag again. */
#define WORKER_TICK_MS 100

/*
 * Outcomes of one caller. `scheduled`, `skipped`, `requests`, `gave_up`
 * and `cancelled` count logical requests (arrivals); the others count
 * attempts (HTTP exchanges, retries included), so a request denied twice
 * and then admitted adds 2 to `denied`, 1 to `ok` and 2 to `retried`.
 */
typedef struct counts {
	uint64_t scheduled; /* arrivals due by the pacer */
	uint64_t skipped; /* arrivals not sent: concurrency bound */
	uint64_t requests; /* arrivals started */
	uint64_t sent; /* attempts sent */
	uint64_t ok; /* 2xx */
	uint64_t denied; /* 429 */
	uint64_t conc_rejected; /* 503 */
	uint64_t other; /* any other status */
	uint64_t errors; /* transport errors, timeouts, no target */
	uint64_t throttled; /* attempts refused locally (throttle) */
	uint64_t retried; /* retries granted by allot_retry_next() */
	uint64_t gave_up; /* rejections whose retry was refused */
	uint64_t cancelled; /* cut short by the end of the run */
	uint64_t connects; /* new connections (TCP + TLS handshakes) */
} counts;

#define COUNT_FIELDS(X)  \
	X(scheduled)     \
	X(skipped)       \
	X(requests)      \
	X(sent)          \
	X(ok)            \
	X(denied)        \
	X(conc_rejected) \
	X(other)         \
	X(errors)        \
	X(throttled)     \
	X(retried)       \
	X(gave_up)       \
	X(cancelled)     \
	X(connects)

/* Attempts of one caller on one target. */
typedef struct tcounts {
	uint64_t sent, ok, denied, conc_rejected, other, errors;
} tcounts;

#define TCOUNT_FIELDS(X) \
	X(sent) X(ok) X(denied) X(conc_rejected) X(other) X(errors)

enum slot_state { SLOT_FREE, SLOT_INFLIGHT, SLOT_WAIT };

/* One logical request of a caller, from its first attempt to its final
 * answer, retry waits included. A caller has 2 * concurrency slots: at
 * most `concurrency` INFLIGHT and at most `concurrency` in WAIT. */
typedef struct slot {
	CURL *easy;
	enum slot_state state;
	uint32_t attempt; /* 0-based attempt number */
	size_t mix; /* index into spec.mix */
	int target; /* index into lg.targets, for the counters */
	uint64_t started_ns; /* of the current attempt */
	uint64_t retry_at_ns; /* SLOT_WAIT: when to send the next attempt */
	char url[LG_URL_MAX + LG_PATH_MAX + 2];
	char errbuf[CURL_ERROR_SIZE];
} slot;

typedef struct caller {
	lg_caller_spec spec;
	uint64_t hash;
	lg_rng rng;
	pthread_t thread;
	bool started;
	CURLM *multi;
	CURLSH *share;
	struct curl_slist *headers;
	slot *slots;
	uint32_t nslots; /* 2 * concurrency: in flight + waiting */
	uint32_t nfree;
	uint32_t ninflight; /* at most spec.concurrency */
	uint32_t nwait;
	allot_retry *retry;
	allot_throttle *throttle;
	lg_pacer pacer;
	uint64_t end_ns;

	/* Shared with the main thread, under `mu`. */
	pthread_mutex_t mu;
	counts c;
	tcounts t[LG_MAX_TARGETS];
	lg_hist hist_total;
	lg_hist hist_last;
	uint32_t inflight_now;
	uint32_t waiting_now;
	char last_error[LG_URL_MAX + LG_PATH_MAX + CURL_ERROR_SIZE + 8];
	_Atomic bool done;

	/* Main thread only: the previous snapshot, for the deltas. */
	counts prev_c;
	tcounts prev_t[LG_MAX_TARGETS];
} caller;

typedef struct options {
	char ca[LG_FILE_MAX + 1];
	char targets_file[LG_FILE_MAX + 1];
	char stats_file[LG_FILE_MAX + 1];
	double duration_s;
	uint64_t max_requests; /* 0: no bound */
	bool json;
	bool quiet;
	bool verify_host;
	bool seeded;
	uint64_t seed;
	uint32_t timeout_ms;
	uint32_t drain_ms;
} options;

/*
 * The one run. The main thread fills `o` and `callers` before any worker
 * starts and alone keeps the targets file state (tfile_*), `t0_ns` and
 * `stats`; the target table is shared under `tmu`; the attempt budget
 * and the stop flags are atomics; `signals` is written by the handler.
 */
typedef struct lg_run {
	options o;
	caller *callers;
	size_t ncallers;

	/* Targets: append-only (indices are stable), `active` toggles. */
	pthread_mutex_t tmu;
	char turl[LG_MAX_TARGETS][LG_URL_MAX + 1];
	uint64_t thash[LG_MAX_TARGETS];
	bool tactive[LG_MAX_TARGETS];
	bool tstatic[LG_MAX_TARGETS];
	size_t ntargets;
	uint64_t tfile_digest;
	bool tfile_missing_warned;

	_Atomic uint64_t budget_used;
	_Atomic bool exhausted;
	/* 0 running, 1 draining (finish in-flight requests), 2 abort. */
	_Atomic int stop;
	volatile sig_atomic_t signals;

	uint64_t t0_ns;
	FILE *stats;
} lg_run;

extern lg_run lg;

/* ------------------------------------------------------------------ */
/* The clock and messages (loadgen_run.c)                              */
/* ------------------------------------------------------------------ */

uint64_t lg_now_ns(void);
/* Seconds since the run started. */
double lg_since_start_s(uint64_t now);
/* A progress note on stderr, unless --quiet. */
void lg_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* An error on stderr, then exit(2). */
void lg_fatal(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));

/* ------------------------------------------------------------------ */
/* Targets (loadgen_targets.c)                                         */
/* ------------------------------------------------------------------ */

/* Add a target (normalised URL) or mark it active; under lg.tmu.
 * Returns its index, or -1 when the table is full. */
int lg_target_add_locked(const char *url, bool is_static);
/* Re-read the targets file; false only at start-up, when it is needed. */
bool lg_targets_reload(bool startup);
/* How many targets are active now. */
size_t lg_targets_active(void);

/* ------------------------------------------------------------------ */
/* Callers (loadgen_worker.c)                                          */
/* ------------------------------------------------------------------ */

/* Ready caller `idx` of lg.callers: its generator, retry helper,
 * throttle and curl handles. Exits on failure. */
void lg_caller_setup(caller *c, size_t idx);
void lg_caller_teardown(caller *c);
/* The thread of one caller (`arg`), until lg.stop or its end. */
void *lg_worker(void *arg);

/* ------------------------------------------------------------------ */
/* Reports (loadgen_report.c)                                          */
/* ------------------------------------------------------------------ */

/* What the main thread copies out of a caller at each report. */
typedef struct snap {
	counts total, last;
	tcounts ttotal[LG_MAX_TARGETS], tlast[LG_MAX_TARGETS];
	lg_hist hlast, htotal;
	uint32_t inflight, waiting;
	char last_error[LG_URL_MAX + LG_PATH_MAX + CURL_ERROR_SIZE + 8];
} snap;

/* Copy a caller's counters out and start its next interval. */
void lg_take_snapshot(caller *c, snap *s);
/* One report as JSON: a --stats-file line, or with `final` the --json
 * summary. `dt` is the length of the interval "last" covers. */
void lg_json_report(FILE *f, snap *snaps, double t, double dt, bool final,
    const char *stopped_by);
/* Append one JSON line to the stats file, in one write(). */
void lg_stats_line(
    snap *snaps, double t, double dt, bool final, const char *stopped_by);
/* The final summary as a table on stdout. */
void lg_print_table(snap *snaps, double elapsed, const char *stopped_by);

#endif /* ALLOT_TOOLS_LOADGEN_ENGINE_H */
