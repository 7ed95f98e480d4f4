/* SPDX-License-Identifier: MIT */
/*
 * What every benchmark suite shares: the command line (`--json`,
 * `--rounds`, `--iters`), the batch timer (CLOCK_MONOTONIC), medians, a
 * sink that keeps results alive past the optimiser, loud failure when a
 * benchmark measured the wrong path, a small growable text buffer for
 * building configs, a reproducible random generator, and the report: a
 * readable table with PASS/MISS beside each target, or one flat JSON object
 * of named figures that bench/run merges across suites. Suites are
 * executables named bench-<suite>; docs/benchmarks.md describes them.
 */
#ifndef ALLOT_BENCH_H
#define ALLOT_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BENCH_MAX_ROUNDS 64

/* Command-line options common to every suite. */
typedef struct bench_opts {
	const char *suite; /* suite name, e.g. "hotpath" */
	bool json; /* --json: one flat JSON object on stdout */
	unsigned rounds; /* --rounds N: repetitions, median reported */
	uint64_t iters; /* --iters N: decisions per round and thread
	                   for ns-scale loops */
	bool quiet; /* --quiet: no progress on stderr */
	const char *only; /* --only LIST: run only the measurements named
	                     (for profiling); NULL: all */
} bench_opts;

/* Whether the measurement `name` runs under o->only. */
bool bench_selected(const bench_opts *o, const char *name);

/*
 * Parse the common options; `default_iters` is the suite's --iters default.
 * Prints usage and exits on --help (status 0) or a bad argument (2).
 */
void bench_parse_args(int argc, char **argv, const char *suite,
    uint64_t default_iters, bench_opts *ret);

/* Nanoseconds from CLOCK_MONOTONIC: the batch timer. */
uint64_t bench_now_ns(void);

/* Median of `n` values (copied; `v` is left as is). n must be > 0. */
double bench_median(const double *v, size_t n);

/* Progress and diagnostics go to stderr so --json keeps stdout clean. */
void bench_progress(const bench_opts *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Print "bench: FAIL: ..." to stderr and exit(1). For a benchmark that
 * measured something other than what it claims, or could not run. */
_Noreturn void bench_fail(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

/*
 * Results of measured loops are added here so that no loop is dead code
 * even if a future build inlines across translation units (LTO).
 */
extern volatile uint64_t bench_sink;

/* xorshift64*: reproducible pseudo-random numbers for access patterns. */
typedef struct bench_rng {
	uint64_t s;
} bench_rng;
void bench_rng_seed(bench_rng *r, uint64_t seed);
uint64_t bench_rng_next(bench_rng *r);
/* Uniform in [0, n), n > 0. */
uint32_t bench_rng_below(bench_rng *r, uint32_t n);

/* A growable NUL-terminated text buffer (aborts the run on OOM). */
typedef struct bench_buf {
	char *p;
	size_t len;
	size_t cap;
} bench_buf;
void bench_buf_printf(bench_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void bench_buf_free(bench_buf *b);

/*
 * Machine noise: how much CPU time anything other than this process (and
 * its reaped children) used between two marks, from /proc/stat and
 * getrusage(). Two-thread figures on a small machine mean little when this
 * is high, so suites report it beside their figures.
 */
typedef struct bench_cpu {
	double busy_s; /* all CPUs, non-idle (steal included) */
	double total_s; /* all CPUs, busy + idle */
	double self_s; /* this process + waited-for children */
	bool ok; /* /proc/stat was readable */
} bench_cpu;
void bench_cpu_mark(bench_cpu *ret);
/* Percent of the machine's CPU time used by others; NaN if unknown. */
double bench_cpu_others_pct(const bench_cpu *start, const bench_cpu *end);

/* How a figure is judged against its target; a miss never fails the run. */
typedef enum bench_cmp {
	BENCH_NO_TARGET = 0,
	BENCH_AT_MOST, /* PASS when value <= target */
	BENCH_AT_LEAST, /* PASS when value >= target */
} bench_cmp;

typedef struct bench_figure {
	const char *name; /* JSON key, "<suite>.<figure>" */
	const char *unit; /* "ns", "x", ... (table only) */
	int decimals; /* digits after the point, table and JSON */
	const char *what; /* one-line meaning (table only) */
	bench_cmp cmp;
	double target;
	double value; /* NaN: not measured, reported as null */
} bench_figure;

/*
 * Print the figures: a table (with `header` above it, PASS/MISS beside
 * targets) or, with o->json, one flat JSON object on a single line.
 */
void bench_report(
    const bench_opts *o, const char *header, const bench_figure *f, size_t n);

#endif
