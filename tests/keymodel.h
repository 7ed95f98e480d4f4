/* SPDX-License-Identifier: MIT */
/*
 * What the key model's suites share (test_stack.c, test_access.c): quota
 * files parsed or refused, local agents on a virtual clock, agents of
 * service "svc" against a real allotd, and one request asked of a key.
 */
#ifndef ALLOT_TESTS_KEYMODEL_H
#define ALLOT_TESTS_KEYMODEL_H

#include <stdbool.h>
#include <stdint.h>

#include <allot/allot.h>

#include "agent_int.h"
#include "allotd.h"

/* The virtual clock of local agents, and moving it on. */
uint64_t km_clock(void *ctx);
void km_advance_ms(uint64_t ms);

/* `y` parsed (failing the test when refused); refused, with `want` in
 * the message. */
allot_config *km_parse(const char *y);
void km_refused(const char *y, const char *want);

/* An agent of `y` without a coordinator, on the virtual clock. */
allot_agent *km_local_agent(const char *y);
/* An agent of `y`, replica `replica` of service "svc" of 2, syncing
 * every 50 ms with allotd `c`. */
allot_agent *km_remote_agent(
    const pc_coord *c, const char *replica, const char *y);
/* Until each of as[0..n) has synced three times (15 s at most). */
void km_synced(allot_agent **as, int n);

/* One request of `id` to `ep` at the default cost: what allot_acquire()
 * returned, `*ret` (may be NULL) the decision. */
int km_ask_rc(
    allot_agent *a, const char *id, const char *ep, allot_decision *ret);
/* The same, which must return ALLOT_OK: admitted or not. */
bool km_ask(
    allot_agent *a, const char *id, const char *ep, allot_decision *ret);
/* How many of `n` such requests were admitted. */
int km_admitted(allot_agent *a, const char *id, const char *ep, int n);
/* The name of the quota that decided `d`, a decision of `id` to `ep`. */
const char *km_bound_by(
    allot_agent *a, const char *id, const char *ep, const allot_decision *d);
/* Quota `name`'s totals, as the agent reports them to allotd. */
allot__ktotals km_totals(allot_agent *a, const char *name);

#endif
