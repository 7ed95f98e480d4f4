/* SPDX-License-Identifier: MIT */
/*
 * The simulator's admissions ledger (engine.c records into it): per quota
 * and mode, the tokens admitted and, for each of SIM_NWIN window lengths,
 * the costliest window of that length, exactly, reduced as the admissions
 * come so that a run's admissions need not be kept. Not thread-safe: one
 * engine, one thread.
 */
#ifndef ALLOT_SIM_ADMISSIONS_H
#define ALLOT_SIM_ADMISSIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Over-admission is taken over windows of three lengths: T, 1 s, 10 s. */
#define SIM_NWIN 3

/* An admission: its time and the cost admitted before it. */
typedef struct sim_adm {
	uint64_t t;
	uint64_t before;
} sim_adm;

/* Sentinels after the last admission, the first carrying the cost so
 * far: time UINT64_MAX, after every window. */
#define SIM_ADM_PAD 8

/*
 * The admissions of one quota (or of the ceiling) in one mode, reduced
 * as they come to what the figures need: the tokens admitted, and for
 * each window length w the max over windows [t, t + w] of the cost
 * admitted in them, t every admission, exactly.
 *
 * The windows are taken in blocks of ADM_BLOCK first admissions once
 * they are closed (an admission came after the block's last window),
 * from the admissions kept in a buffer. The window of a block's first
 * admission is taken exactly; it bounds the max from below. Every window
 * of the block starts no earlier and ends no later than the block's last
 * one: that bounds them from above, and only the blocks whose bound
 * beats the max so far (a few in a hundred) are taken one admission at
 * a time. The buffer keeps the admissions from the first window not
 * taken on, about the longest window's worth, in cache. (The simulator
 * used to keep every admission of a run, tens of megabytes, and take
 * every window afterwards: more than a fifth of allot-sim's time.)
 */
typedef struct sim_admvec {
	sim_adm *a; /* a[0 .. n), then SIM_ADM_PAD sentinels */
	size_t n, cap;
	size_t next[SIM_NWIN]; /* first admission whose window is not taken */
	size_t front[SIM_NWIN]; /* the window of next[k] ends at or after it */
	uint64_t cost; /* tokens admitted so far */
	uint64_t best[SIM_NWIN]; /* costliest window taken, per length */
	double after_warmup; /* tokens admitted from arrivals >= 3T */
	double total;
} sim_admvec;

/* `cost` tokens admitted at t, not before the previous admission; w: the
 * window lengths; admissions from `warm` on count in after_warmup.
 * ALLOT_OK or ALLOT_ENOMEM. */
int sim_adm_push(sim_admvec *v, uint64_t t, uint32_t cost, uint64_t warm,
    const uint64_t w[SIM_NWIN]);

/* The run is over: the costliest window of each length. */
void sim_adm_max_windows(
    sim_admvec *v, const uint64_t w[SIM_NWIN], double ret[SIM_NWIN]);

#endif
