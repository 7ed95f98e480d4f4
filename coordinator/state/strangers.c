/* SPDX-License-Identifier: MIT */
/*
 * The strangers (registry_int.h): unknown identities, which the agents
 * charge to the default quota and allotd otherwise sees as "default",
 * named in the audit. Each Sync may name up to ALLOT__STRANGERS_SYNC
 * of them with their requests since its agent's last look (about once
 * a second, Sync.strangers). The state sums them per service, identity
 * and endpoint class over the second in a fixed table
 * (ALLOT__STRANGERS_TAB entries; when it is full, a stranger that
 * denied more takes the place of the one that denied least), and each
 * second writes the ALLOT__STRANGERS_ROWS that were denied the most as
 * `unknown_caller` events (subject: the identity; detail: JSON with the
 * service, endpoint, admitted and denied requests), which the view
 * v_unknown_callers sums per minute. Sampled and bounded: what the
 * agents' Usage records book under "default" stays the record. Under
 * the state's lock.
 */
#include "registry_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "buf.h"
#include "name.h"

/* Whether a Stranger may be noted: names a Register would take. */
static bool
stranger_ok(const Allot__V1__Stranger *x)
{
	return x != NULL &&
	    allot__name_valid(x->identity, ALLOT__STATE_NAME_MAX, true) &&
	    allot__name_valid(
	        x->endpoint, ALLOT__STRANGER_ENDPOINT_MAX, false);
}

static bool
same(const allot__stranger_ent *e, const char *svc,
    const Allot__V1__Stranger *x)
{
	return strcmp(e->service, svc) == 0 &&
	    strcmp(e->identity, x->identity) == 0 &&
	    strcmp(e->endpoint, x->endpoint != NULL ? x->endpoint : "") == 0;
}

static uint64_t
sat_add(uint64_t a, uint64_t b)
{
	return a + b < a ? UINT64_MAX : a + b;
}

void
allot__strangers_note(
    allot__state *st, const char *svc, Allot__V1__Stranger *const *v, size_t n)
{
	if (n > ALLOT__STRANGERS_SYNC)
		n = ALLOT__STRANGERS_SYNC;
	for (size_t i = 0; i < n; i++) {
		const Allot__V1__Stranger *x = v[i];
		if (!stranger_ok(x))
			continue;
		allot__stranger_ent *e = NULL, *least = NULL;
		for (size_t k = 0; k < st->nstrangers && e == NULL; k++) {
			if (same(&st->strangers[k], svc, x))
				e = &st->strangers[k];
			else if (least == NULL ||
			    st->strangers[k].denied < least->denied)
				least = &st->strangers[k];
		}
		if (e == NULL) {
			if (st->nstrangers < ALLOT__STRANGERS_TAB)
				e = &st->strangers[st->nstrangers++];
			else if (least != NULL && x->denied > least->denied)
				e = least;
			else
				continue;
			memset(e, 0, sizeof *e);
			snprintf(e->service, sizeof e->service, "%s", svc);
			snprintf(e->identity, sizeof e->identity, "%s",
			    x->identity);
			snprintf(e->endpoint, sizeof e->endpoint, "%s",
			    x->endpoint != NULL ? x->endpoint : "");
		}
		e->admitted = sat_add(e->admitted, x->admitted);
		e->denied = sat_add(e->denied, x->denied);
	}
}

/* The most denied first, then the most admitted. */
static int
by_denied(const void *a, const void *b)
{
	const allot__stranger_ent *x = a, *y = b;
	if (x->denied != y->denied)
		return x->denied < y->denied ? 1 : -1;
	return x->admitted < y->admitted ? 1 :
	    x->admitted > y->admitted    ? -1 :
	                                   0;
}

void
allot__strangers_second(allot__state *st)
{
	if (st->nstrangers == 0)
		return;
	qsort(
	    st->strangers, st->nstrangers, sizeof st->strangers[0], by_denied);
	size_t n = st->nstrangers < ALLOT__STRANGERS_ROWS ?
	    st->nstrangers :
	    ALLOT__STRANGERS_ROWS;
	for (size_t i = 0; i < n && st->o.store != NULL; i++) {
		const allot__stranger_ent *e = &st->strangers[i];
		allot__buf b = { 0 };
		allot__buf_puts(&b, "{\"service\":");
		allot__buf_json(&b, e->service);
		allot__buf_puts(&b, ",\"endpoint\":");
		allot__buf_json(&b, e->endpoint);
		allot__buf_printf(&b,
		    ",\"admitted\":%" PRIu64 ",\"denied\":%" PRIu64 "}",
		    e->admitted, e->denied);
		if (!b.oom)
			allot__store_event(
			    st->o.store, "unknown_caller", e->identity, b.p);
		allot__buf_free(&b);
	}
	st->nstrangers = 0;
}
