/* SPDX-License-Identifier: MIT */
/*
 * The load generator's pure pieces, shared by tools/loadgen.c and
 * tests/test_loadgen.c: the caller SPEC parser and its limits, the
 * loopback-only URL check, the targets-file parser, the open-loop pacer
 * (exact slot times, no drift), a bounded log-linear latency histogram
 * with percentiles (HDR style, about 3 % precision), a small seeded
 * generator, the endpoint-mix draw and sticky target choice (rendezvous
 * hashing, so removing a replica only moves the callers that lived on it).
 * Nothing here does I/O, allocates, or keeps global state; the engine
 * around it (threads, curl, output) is in loadgen.c.
 */
#ifndef ALLOT_TOOLS_LOADGEN_H
#define ALLOT_TOOLS_LOADGEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LG_MAX_CALLERS 64
#define LG_MAX_TARGETS 64
#define LG_MAX_MIX 16
#define LG_NAME_MAX 63
#define LG_PATH_MAX 255
#define LG_URL_MAX 255
#define LG_FILE_MAX 1023
#define LG_HEADER_MAX 255
#define LG_MAX_RATE 100000.0
#define LG_MAX_CONCURRENCY 1024

/* ------------------------------------------------------------------ */
/* Caller specification                                                */
/* ------------------------------------------------------------------ */

typedef struct lg_mix_entry {
	char path[LG_PATH_MAX + 1]; /* starts with '/', may carry a query */
	double weight; /* > 0, not normalised */
} lg_mix_entry;

/*
 * One --caller SPEC, "key=value" pairs separated by commas. The values
 * here are the defaults lg_caller_spec_parse() starts from.
 */
typedef struct lg_caller_spec {
	char name[LG_NAME_MAX + 1]; /* name=; required, [A-Za-z0-9._-] */
	char cert[LG_FILE_MAX + 1]; /* cert=; "" sends no certificate */
	char key[LG_FILE_MAX + 1]; /* key=; required with cert= */
	double rate; /* rate=; required, req/s */
	lg_mix_entry mix[LG_MAX_MIX]; /* mix=; default "/lookup:1" */
	size_t nmix;
	double mix_total; /* sum of the weights */
	double sticky; /* sticky=; [0,1], default 0 */
	bool retry; /* retry=on|off, default on */
	uint32_t concurrency; /* concurrency=; default 16 */
	uint32_t attempts; /* attempts=; default 4 */
	double budget; /* budget=; (0,1], default 0.1 */
	uint32_t max_wait_ms; /* max_wait=; default 10000 */
	bool throttle; /* throttle=on|off, default off */
	double throttle_k; /* throttle_k=; >= 1, default 2 */
	char header[LG_HEADER_MAX + 1]; /* header=NAME:VALUE, default none */
	double start_s; /* start=; offset of first arrival */
	double end_s; /* end=; 0: until the run ends */
} lg_caller_spec;

/*
 * Parse a caller SPEC into `ret` (filled with the defaults first).
 * Returns 0, or -1 with a one-line reason in `err`.
 */
int lg_caller_spec_parse(
    const char *spec, lg_caller_spec *ret, char *err, size_t errlen);

/* Parse a mix value "/a:0.9;/b?x=1:0.1" into spec->mix. 0 or -1. */
int lg_mix_parse(
    const char *text, lg_caller_spec *spec, char *err, size_t errlen);

/* Index of the mix entry for a uniform draw u in [0,1). */
size_t lg_mix_pick(const lg_caller_spec *spec, double u);

/* ------------------------------------------------------------------ */
/* Targets                                                             */
/* ------------------------------------------------------------------ */

/*
 * Check that `url` is an http or https URL whose host is loopback
 * (127.0.0.0/8, ::1 or "localhost") and write its normalised form, without
 * a trailing slash, to `out`. Userinfo, fragments and paths other than "/"
 * are refused. Returns 0, or -1 with the reason in `err`.
 */
int lg_target_check(
    const char *url, char *out, size_t outlen, char *err, size_t errlen);

/*
 * Parse the text of a targets file: one URL per line, blank lines and
 * lines starting with '#' ignored, surrounding blanks trimmed. Valid
 * targets are written to `out` (up to `cap`, duplicates dropped); each
 * invalid line is reported through `warn` (may be NULL) with its line
 * number. Returns the number of valid targets.
 */
size_t lg_targets_parse(const char *text, char out[][LG_URL_MAX + 1],
    size_t cap, void (*warn)(void *ctx, size_t line, const char *msg),
    void *ctx);

/* ------------------------------------------------------------------ */
/* Random numbers and hashing                                          */
/* ------------------------------------------------------------------ */

typedef struct lg_rng {
	uint64_t s;
} lg_rng;

void lg_rng_seed(lg_rng *r, uint64_t seed);
uint64_t lg_rng_next(lg_rng *r);
/* Uniform in [0, 1). */
double lg_rng_double(lg_rng *r);
/* Uniform in [0, n); n > 0. */
uint32_t lg_rng_below(lg_rng *r, uint32_t n);

/* FNV-1a over a string, then a 64-bit finaliser. */
uint64_t lg_hash_str(const char *s);

/*
 * The home replica of a caller among `n` targets, by rendezvous hashing:
 * the target maximising mix(caller_hash, target_hash[i]) over those with
 * active[i] set (active may be NULL: all). Returns the index, or -1 if
 * none is active.
 */
int lg_rendezvous(uint64_t caller_hash, const uint64_t *target_hash,
    const bool *active, size_t n);

/*
 * The target for one request: with probability `sticky` the home
 * replica, otherwise one drawn uniformly among the active targets (which
 * may be the home too). Returns the index or -1 if none is active.
 */
int lg_pick_target(lg_rng *r, double sticky, uint64_t caller_hash,
    const uint64_t *target_hash, const bool *active, size_t n);

/* ------------------------------------------------------------------ */
/* Pacing                                                              */
/* ------------------------------------------------------------------ */

/*
 * Open-loop arrivals at a constant rate: slot k is due at
 * start + ceil(k * 1e9 / rate) ns, whatever happened to earlier slots.
 * Slot times are computed from k, never accumulated, so there is no drift.
 */
typedef struct lg_pacer {
	uint64_t start_ns;
	double rate; /* slots per second, > 0 */
	uint64_t next; /* the first slot not yet taken */
} lg_pacer;

void lg_pacer_init(lg_pacer *p, uint64_t start_ns, double rate);
/* When slot k is due. */
uint64_t lg_pacer_due(const lg_pacer *p, uint64_t k);
/* When the next untaken slot is due. */
uint64_t lg_pacer_next_due(const lg_pacer *p);
/* Take every slot due at or before `now`; returns how many. */
uint64_t lg_pacer_take(lg_pacer *p, uint64_t now_ns);

/* ------------------------------------------------------------------ */
/* Latency histogram                                                   */
/* ------------------------------------------------------------------ */

/*
 * Log-linear buckets over microseconds: values below 64 us are exact;
 * above, each power of two is split into 32 buckets (error <= 1/32).
 * Values beyond LG_HIST_MAX_US are clamped. Fixed size: about 8.7 KiB.
 */
#define LG_HIST_SUB_BITS 5
#define LG_HIST_MAX_EXP 37 /* 2^38 us, about three days */
#define LG_HIST_BUCKETS             \
	((2u << LG_HIST_SUB_BITS) + \
	    (LG_HIST_MAX_EXP - LG_HIST_SUB_BITS) * (1u << LG_HIST_SUB_BITS))
#define LG_HIST_MAX_US ((UINT64_C(1) << (LG_HIST_MAX_EXP + 1)) - 1)

typedef struct lg_hist {
	uint64_t count;
	uint64_t min_us;
	uint64_t max_us;
	uint64_t sum_us;
	uint64_t buckets[LG_HIST_BUCKETS];
} lg_hist;

void lg_hist_reset(lg_hist *h);
void lg_hist_add(lg_hist *h, uint64_t us);
void lg_hist_merge(lg_hist *dst, const lg_hist *src);
/* Bucket index of a value, and the highest value that bucket holds. */
uint32_t lg_hist_index(uint64_t us);
uint64_t lg_hist_upper(uint32_t idx);
/*
 * The p-th percentile (0 < p <= 100) in microseconds: the highest value
 * equivalent to the smallest recorded value with at least p % of the
 * samples at or below it, clamped to [min, max]. 0 when empty.
 */
uint64_t lg_hist_percentile(const lg_hist *h, double p);

#endif /* ALLOT_TOOLS_LOADGEN_H */
