/* SPDX-License-Identifier: MIT */
/*
 * The logs of several agent-probe processes (tests/agent_probe.c) merged
 * on their common 10 ms slots, and the figures the partition tests and
 * the cluster benchmark take from them: the allowances of one caller
 * summed over agents at every slot, each agent's epoch never going down,
 * denials of the calm caller in a span, and over-admission against
 * R·w + B over windows of length w.
 *
 * A slot an agent did not write (a late wake-up, or before its first row)
 * carries its previous row forward (zeros before the first).
 */
#ifndef ALLOT_TESTS_SUPPORT_PROBE_LOG_H
#define ALLOT_TESTS_SUPPORT_PROBE_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PROBE_MAX_AGENTS 8

typedef struct probe_agent {
	/* per slot, carried forward */
	double *hot_rate;
	uint64_t *hot_allowed, *calm_allowed, *calm_denied, *epoch;
	uint64_t stale_epoch, switches; /* at the end */
	int epoch_drops; /* slots where the epoch went below the one before */
	uint64_t first_drop_at;
} probe_agent;

typedef struct probe_run {
	int n;
	uint64_t t0; /* monotonic ms of slot 0 */
	size_t nslots;
	probe_agent a[PROBE_MAX_AGENTS];
} probe_run;

/* Read `n` probe logs; `hot` and `calm` name the callers. 0, or -1 with
 * the reason on stderr (unreadable file, malformed row: FILE:LINE). */
int probe_load(probe_run *r, const char *const *paths, int n, const char *hot,
    const char *calm);
void probe_free(probe_run *r);

/* The largest sum over agents of the hot caller's allowance at one slot
 * within [from, to] (monotonic ms; 0, UINT64_MAX: all), and its slot's
 * time in `ret_at` (may be NULL). */
double probe_max_sum(
    const probe_run *r, uint64_t from, uint64_t to, uint64_t *ret_at);

/* Calm calls denied, or allowed, over all agents within [from, to]. */
uint64_t probe_calm_denied(const probe_run *r, uint64_t from, uint64_t to);
uint64_t probe_calm_allowed(const probe_run *r, uint64_t from, uint64_t to);

/* Over-admission of the hot caller within [from, to]: the max over
 * windows [t, t + w] inside it (t every slot) of the tokens admitted by
 * all agents minus (r_tokens · w + burst), in tokens. */
double probe_over(const probe_run *r, uint64_t from, uint64_t to, double rate,
    double burst, uint64_t w_ms);

/* The newest sample of one probe log while it is being written: its
 * epoch, whether it is connected, and whether every caller runs on an
 * explicit grant from the coordinator (not its bootstrap share). False
 * when there is no sample yet. */
bool probe_last(const char *path, uint64_t *ret_epoch, bool *ret_connected,
    bool *ret_granted);

/* The lowest epoch among the agents at the slot of `t`. */
uint64_t probe_low_epoch(const probe_run *r, uint64_t t);

#endif
