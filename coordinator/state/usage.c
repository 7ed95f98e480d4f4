/* SPDX-License-Identifier: MIT */
/*
 * Agents' Usage records into the audit (docs/operations.md, "The
 * accounting guarantee"): an agent that keeps an account
 * (Register.incarnation) is audited from its records, each booked once at
 * its own second, and not from its KeyReports, which serve the
 * allocation alone. Every Reply says how far its records are durable.
 *
 * A record is checked before it is booked: its second must be within
 * ALLOT__USAGE_SKEW_S ahead of this coordinator's clock (further ahead
 * it is booked at this coordinator's second, counted and audited), and
 * no count may exceed what the whole quota could admit and deny in the
 * seconds it covers (ALLOT__STATE_FLOOD_FACTOR times rate by span plus
 * burst): such a count is dropped, counted and audited, as an absurd
 * KeyReport is. Under the state's lock.
 */
#include "registry_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "clock.h"

/* Booked at this coordinator's second beyond this much ahead. */
#define ALLOT__USAGE_SKEW_S 10

static bool
plausible(const service *svc, const cfgv *v, int32_t q,
    const Allot__V1__UsageCount *c, uint32_t span)
{
	/* A quota with a bucket per value: the quota for every value the
	 * service splits (values.c). */
	double values = allot__quota_per_value(v, q) ?
	    (double) allot__values_count(svc) + 1 :
	    1;
	double lim = ALLOT__STATE_FLOOD_FACTOR * values *
	    (v->rate[q] * (double) span + v->burst[q]);
	return (double) c->admitted <= lim && (double) c->denied <= lim &&
	    c->shadow_denied <= c->admitted;
}

/* One record's rows, and whether it may be booked. */
static size_t
record_rows(allot__state *st, session *s, const Allot__V1__Usage *u,
    int64_t now_s, allot__row_count *rows, size_t cap, bool *ret_clamped,
    uint32_t *ret_refused)
{
	const cfgv *v = st->cur;
	uint32_t span = u->span > 1 ? u->span : 1;
	int64_t second = u->second;
	if (second > now_s + ALLOT__USAGE_SKEW_S) {
		second = now_s;
		*ret_clamped = true;
	}
	allot__row_count base = {
		.session = s->id,
		.incarnation = s->incarnation,
		.first = u->first != 0 && u->first < u->id ? u->first : u->id,
		.id = u->id,
		.second = second,
		.service = s->svc->name,
	};
	size_t n = 0;
	for (size_t i = 0; i < u->n_counts && n < cap; i++) {
		const Allot__V1__UsageCount *c = u->counts[i];
		skey *key = session_key(s, c->key);
		if (key == NULL || key->q < 0)
			continue; /* no quota: nothing to audit it under */
		if (!plausible(s->svc, v, key->q, c, span)) {
			(*ret_refused)++;
			continue;
		}
		rows[n] = base;
		rows[n].quota = v->names[key->q];
		rows[n].admitted = c->admitted;
		rows[n].denied = c->denied;
		rows[n].shadow_denied = c->shadow_denied;
		n++;
	}
	/* Nothing to book: the record is still marked, so that its agent
	 * stops sending it. */
	if (n == 0)
		rows[n++] = base;
	return n;
}

void
allot__usage_book(
    allot__state *st, session *s, Allot__V1__Usage *const *usage, size_t n)
{
	if (s->incarnation == 0 || n == 0)
		return;
	allot__metrics *m = st->o.metrics;
	int64_t now_s = allot__wall_ms() / 1000;
	/* A row per count of the largest record, and one more. */
	size_t cap = 1;
	for (size_t i = 0; i < n; i++)
		if (usage[i]->n_counts + 1 > cap)
			cap = usage[i]->n_counts + 1;
	allot__row_count *rows = malloc(cap * sizeof *rows);
	if (rows == NULL)
		return; /* not booked: its agent sends it again */
	uint32_t refused = 0, clamped = 0, booked = 0, repeats = 0;
	for (size_t i = 0; i < n; i++) {
		const Allot__V1__Usage *u = usage[i];
		if (u->id == 0)
			continue;
		if (u->id > s->usage_seen)
			s->usage_seen = u->id;
		bool cl = false;
		size_t k = record_rows(
		    st, s, u, now_s, rows, cap, &cl, &refused);
		clamped += cl;
		if (st->o.store == NULL ||
		    allot__store_usage_record(st->o.store, rows, k))
			booked++;
		else
			repeats++;
	}
	free(rows);
	if (m != NULL) {
		allot__metrics_add(&m->usage_booked, booked);
		allot__metrics_add(&m->usage_repeats, repeats);
		allot__metrics_add(&m->usage_refused, refused);
		allot__metrics_add(&m->usage_clamped, clamped);
	}
	if ((refused > 0 || clamped > 0) && st->o.store != NULL) {
		char detail[192];
		snprintf(detail, sizeof detail,
		    "service=%.64s session=%" PRIu64
		    " counts_refused=%u records_clamped=%u",
		    s->svc->name, s->id, refused, clamped);
		allot__store_event(
		    st->o.store, "usage_implausible", s->replica_id, detail);
	}
}

uint64_t
allot__usage_durable(allot__state *st, const session *s)
{
	if (s->incarnation == 0)
		return 0;
	if (st->o.store == NULL)
		return s->usage_seen;
	return allot__store_durable(st->o.store, s->incarnation);
}
