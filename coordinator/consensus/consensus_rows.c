/* SPDX-License-Identifier: MIT */
/*
 * The AUDIT entry's body (consensus_entry.h): the leader's replica, share
 * and level rows of one flush, and its usage seconds' shadow columns.
 * Six counts (u32), then the rows of each
 * kind in the order they are applied, fixed-width fields first and the
 * short strings last. Decoding copies the rows and every string into one
 * block, as the other batch entries do, so an applied entry costs one
 * allocation whatever it holds.
 */
#include "consensus_entry.h"

#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>

/* The smallest encoded row of each kind (its fixed fields and the u16
 * lengths of its strings): a count the bytes left cannot hold is refused
 * before it sizes an allocation. */
#define JOIN_MIN (8 + 8 + 8 + 4 + 4 * 2)
#define LEFT_MIN (8 + 8 + 2)
#define SEEN_MIN (8 + 8)
#define SHARE_MIN (8 + 8 + 8 + 8 + 8 + 2 * 2)
#define LEVEL_MIN (8 + 8 + 2 * 2)
#define SHADOW_MIN (8 + 8 + 8 + 8 + 2 * 2)
#define KINDS 6

static void
put_str(allot__cwbuf *w, const char *s)
{
	s = s != NULL ? s : "";
	allot__cw_str(w, s, strlen(s), 0);
}

void
allot__centry_encode_audit(allot__cwbuf *w, const allot__row_audit *a)
{
	const size_t counts[KINDS] = { a->njoins, a->nshares, a->nlefts,
		a->nseen, a->nlevels, a->nshadow };

	for (size_t i = 0; i < KINDS; i++) {
		if (counts[i] > ALLOT__CENTRY_ROWS_MAX) {
			w->err = w->err != 0 ? w->err : ALLOT_EINVAL;
			return;
		}
		allot__cw_u32(w, (uint32_t) counts[i]);
	}
	for (size_t i = 0; i < a->njoins; i++) {
		const allot__row_join *j = &a->joins[i];

		allot__cw_u64(w, j->session);
		allot__cw_u64(w, (uint64_t) j->at);
		allot__cw_u64(w, j->digest);
		allot__cw_u32(w, j->pid);
		put_str(w, j->replica_id);
		put_str(w, j->service);
		put_str(w, j->host);
		put_str(w, j->version);
	}
	for (size_t i = 0; i < a->nshares; i++) {
		const allot__row_share *s = &a->shares[i];

		allot__cw_u64(w, s->session);
		allot__cw_f64(w, s->rate);
		allot__cw_f64(w, s->burst);
		allot__cw_u64(w, (uint64_t) s->lease_until);
		allot__cw_u64(w, (uint64_t) s->at);
		put_str(w, s->service);
		put_str(w, s->quota);
	}
	for (size_t i = 0; i < a->nlefts; i++) {
		allot__cw_u64(w, a->lefts[i].session);
		allot__cw_u64(w, (uint64_t) a->lefts[i].at);
		put_str(w, a->lefts[i].why);
	}
	for (size_t i = 0; i < a->nseen; i++) {
		allot__cw_u64(w, a->seen[i].session);
		allot__cw_u64(w, (uint64_t) a->seen[i].at);
	}
	for (size_t i = 0; i < a->nlevels; i++) {
		allot__cw_f64(w, a->levels[i].level);
		allot__cw_u64(w, (uint64_t) a->levels[i].at);
		put_str(w, a->levels[i].service);
		put_str(w, a->levels[i].quota);
	}
	for (size_t i = 0; i < a->nshadow; i++) {
		const allot__row_shadow *x = &a->shadow[i];

		allot__cw_u64(w, x->second);
		allot__cw_u64(w, x->shadow_denied);
		allot__cw_u64(w, x->candidate_denied);
		allot__cw_f64(w, x->candidate_rate);
		put_str(w, x->service);
		put_str(w, x->quota);
	}
}

bool
allot__caudit_cut(
    allot__row_audit *rest, size_t max, allot__row_audit *ret_part)
{
	allot__row_audit part = { 0 };
	size_t room = max;

	/* Each kind in turn: as many of its rows as still fit. */
#define TAKE(rows, n)                                        \
	do {                                                 \
		size_t k_ = rest->n < room ? rest->n : room; \
		part.rows = rest->rows;                      \
		part.n = k_;                                 \
		rest->rows += k_;                            \
		rest->n -= k_;                               \
		room -= k_;                                  \
	} while (0)
	TAKE(joins, njoins);
	TAKE(shares, nshares);
	TAKE(lefts, nlefts);
	TAKE(seen, nseen);
	TAKE(levels, nlevels);
	TAKE(shadow, nshadow);
#undef TAKE
	*ret_part = part;
	return room < max;
}

/* Copies a short string read from `r` to `*at` (with its NUL). */
static const char *
copy(allot__crbuf *r, char **at)
{
	size_t len;
	const char *s = allot__cr_str(r, &len, 0);
	char *d = *at;

	if (s == NULL)
		return "";
	memcpy(d, s, len);
	d[len] = '\0';
	*at = d + len + 1;
	return d;
}

/* Where each kind's rows start in the block, or false when the counts
 * cannot be what the bytes left hold. */
static bool
layout(allot__crbuf *r, uint32_t n[KINDS], size_t *ret_rows, size_t *ret_nstr)
{
	static const size_t min[KINDS] = { JOIN_MIN, SHARE_MIN, LEFT_MIN,
		SEEN_MIN, LEVEL_MIN, SHADOW_MIN };
	static const size_t strs[KINDS] = { 4, 2, 1, 0, 2, 2 };
	static const size_t size[KINDS] = { sizeof(allot__row_join),
		sizeof(allot__row_share), sizeof(allot__row_left),
		sizeof(allot__row_seen), sizeof(allot__row_level),
		sizeof(allot__row_shadow) };
	size_t bytes = 0, rows = 0, nstr = 0;

	for (int i = 0; i < KINDS; i++) {
		n[i] = allot__cr_u32(r);
		if (r->bad || n[i] > ALLOT__CENTRY_ROWS_MAX)
			return false;
		bytes += n[i] * min[i];
		rows += n[i] * size[i];
		nstr += n[i] * strs[i];
	}
	if (bytes > r->len - r->off)
		return false;
	*ret_rows = rows;
	*ret_nstr = nstr;
	return true;
}

int
allot__centry_decode_audit(allot__crbuf *r, allot__centry *e)
{
	uint32_t n[KINDS];
	size_t rows, nstr;

	if (!layout(r, n, &rows, &nstr))
		return ALLOT_EPROTO;
	/* The rows (every row type is 8-byte aligned), then the strings:
	 * at most the bytes left, plus a NUL each. */
	e->mem = malloc(rows + (r->len - r->off) + nstr + 1);
	if (e->mem == NULL)
		return ALLOT_ENOMEM;
	allot__row_audit *a = &e->audit;
	allot__row_join *joins = e->mem;
	allot__row_share *shares = (allot__row_share *) (joins + n[0]);
	allot__row_left *lefts = (allot__row_left *) (shares + n[1]);
	allot__row_seen *seen = (allot__row_seen *) (lefts + n[2]);
	allot__row_level *levels = (allot__row_level *) (seen + n[3]);
	allot__row_shadow *shadow = (allot__row_shadow *) (levels + n[4]);
	char *at = (char *) (shadow + n[5]);

	for (uint32_t i = 0; i < n[0] && !r->bad; i++) {
		allot__row_join *j = &joins[i];

		j->session = allot__cr_u64(r);
		j->at = (int64_t) allot__cr_u64(r);
		j->digest = allot__cr_u64(r);
		j->pid = allot__cr_u32(r);
		j->replica_id = copy(r, &at);
		j->service = copy(r, &at);
		j->host = copy(r, &at);
		j->version = copy(r, &at);
	}
	for (uint32_t i = 0; i < n[1] && !r->bad; i++) {
		allot__row_share *s = &shares[i];

		s->session = allot__cr_u64(r);
		s->rate = allot__cr_f64(r);
		s->burst = allot__cr_f64(r);
		s->lease_until = (int64_t) allot__cr_u64(r);
		s->at = (int64_t) allot__cr_u64(r);
		s->service = copy(r, &at);
		s->quota = copy(r, &at);
	}
	for (uint32_t i = 0; i < n[2] && !r->bad; i++) {
		lefts[i].session = allot__cr_u64(r);
		lefts[i].at = (int64_t) allot__cr_u64(r);
		lefts[i].why = copy(r, &at);
	}
	for (uint32_t i = 0; i < n[3] && !r->bad; i++) {
		seen[i].session = allot__cr_u64(r);
		seen[i].at = (int64_t) allot__cr_u64(r);
	}
	for (uint32_t i = 0; i < n[4] && !r->bad; i++) {
		levels[i].level = allot__cr_f64(r);
		levels[i].at = (int64_t) allot__cr_u64(r);
		levels[i].service = copy(r, &at);
		levels[i].quota = copy(r, &at);
	}
	for (uint32_t i = 0; i < n[5] && !r->bad; i++) {
		allot__row_shadow *x = &shadow[i];

		x->second = allot__cr_u64(r);
		x->shadow_denied = allot__cr_u64(r);
		x->candidate_denied = allot__cr_u64(r);
		x->candidate_rate = allot__cr_f64(r);
		x->service = copy(r, &at);
		x->quota = copy(r, &at);
	}
	*a = (allot__row_audit) { .joins = joins,
		.njoins = n[0],
		.shares = shares,
		.nshares = n[1],
		.lefts = lefts,
		.nlefts = n[2],
		.seen = seen,
		.nseen = n[3],
		.levels = levels,
		.nlevels = n[4],
		.shadow = shadow,
		.nshadow = n[5] };
	return r->bad ? ALLOT_EPROTO : ALLOT_OK;
}
