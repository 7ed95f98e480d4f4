/* SPDX-License-Identifier: MIT */
/*
 * A quota bucket's ledger between two reports, for the central reserve
 * (docs/allocation.md, "The central reserve"): what the bucket was at
 * the last report, what its refill produced since at the allowances in
 * force, what was put in (a prefill, the reserve's leftovers) and taken
 * out otherwise (a debit, what a lower burst dropped), and what its
 * callers spent from it. What is missing from the level it has now was
 * discarded: the refill of a full bucket. The agent reports it
 * (KeyReport.overflow) and the coordinator puts it in the reserve, so a
 * replica's bucket may refill generously, for the body of its traffic,
 * without wasting what the global bucket would have kept.
 *
 * The arithmetic is exact when nothing but the engine's own calls
 * changes the bucket between two reports; where it cannot be (a token
 * lease open at either end, an allowance installed by another path, a
 * config installed), the ledger starts again and that interval reports
 * nothing: a missed overflow costs capacity, never more than the quota.
 * Sync thread only.
 */
#ifndef ALLOT_AGENT_LEDGER_H
#define ALLOT_AGENT_LEDGER_H

#include <stdbool.h>
#include <stdint.h>

#include "agent_int.h"

typedef struct allot__ledger {
	uint64_t mark_ns; /* the last report; 0: start again */
	double level; /* the bucket's level then */
	uint64_t spent; /* its callers' spent tokens then (every path) */
	uint64_t central; /* of them, from the reserve (tail.c) */
	uint64_t deposited; /* the reserve's leftovers put in, then */
	double rate; /* the refill in force since rate_ns */
	uint64_t rate_ns;
	double produced; /* refill since the mark */
	double in, out; /* put in, taken out, by the engine */
	double part; /* discarded, less than a token, not reported yet */
} allot__ledger;

/* The allowance in force changes to refill `rate` (0: not a limiting
 * bucket) at `now`: what the old one produced is counted. */
void allot__ledger_rate(allot__ledger *l, double rate, uint64_t now);

/* Tokens the engine put into the bucket, or took out of it. */
void allot__ledger_in(allot__ledger *l, double tokens);
void allot__ledger_out(allot__ledger *l, double tokens);

/* Start again: the next report counts from then. */
void allot__ledger_reset(allot__ledger *l);

/* At a report: the whole tokens quota `q`'s bucket discarded since the
 * last one, the part of a token left over from the reports before
 * included (the rest of it is carried to the next), and the ledger
 * marked again at `now`. `level` is the
 * bucket's level at `now`, read before `spent`, its callers' spent
 * tokens (every path): a take between the two reads then only lowers
 * the figure. */
uint64_t allot__ledger_close(allot__ledger *l, allot__qrt *q, double level,
    uint64_t spent, uint64_t now);

#endif
