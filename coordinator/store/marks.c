/* SPDX-License-Identifier: MIT */
/* Usage marks (marks.h). */
#include "marks.h"

#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>

#include "hash.h"

static uint64_t
hash_of(uint64_t incarnation)
{
	return allot__mix64(incarnation);
}

void
allot__marks_init(allot__marks *m)
{
	memset(m, 0, sizeof *m);
}

void
allot__marks_fini(allot__marks *m)
{
	free(m->v);
	allot__idmap_fini(&m->index);
	memset(m, 0, sizeof *m);
}

void
allot__marks_clear(allot__marks *m)
{
	allot__marks_fini(m);
}

static size_t
find(const allot__marks *m, uint64_t incarnation)
{
	if (m->n == 0)
		return SIZE_MAX;
	uint64_t h = hash_of(incarnation);
	uint32_t pos = allot__idmap_start(&m->index, h), v;
	while (
	    (v = allot__idmap_next(&m->index, h, &pos)) != ALLOT__IDMAP_NONE)
		if (m->v[v].incarnation == incarnation)
			return v;
	return SIZE_MAX;
}

uint64_t
allot__marks_get(const allot__marks *m, uint64_t incarnation)
{
	size_t i = find(m, incarnation);
	return i == SIZE_MAX ? 0 : m->v[i].id;
}

/* Room for one more: a larger array and index, rebuilt. */
static int
grow(allot__marks *m)
{
	size_t cap = m->cap == 0 ? 64 : m->cap * 2;
	if (cap > ALLOT__MARKS_MAX)
		cap = ALLOT__MARKS_MAX;
	allot__mark *v = realloc(m->v, cap * sizeof *v);
	if (v == NULL)
		return ALLOT_ENOMEM;
	m->v = v;
	allot__idmap ix;
	if (allot__idmap_init(&ix, (uint32_t) cap) != ALLOT_OK)
		return ALLOT_ENOMEM;
	for (size_t i = 0; i < m->n; i++)
		allot__idmap_add(&ix, hash_of(v[i].incarnation), (uint32_t) i);
	allot__idmap_fini(&m->index);
	m->index = ix;
	m->cap = cap;
	return ALLOT_OK;
}

/* Remove the entry at `i`: the last one takes its place. */
static void
remove_at(allot__marks *m, size_t i)
{
	allot__idmap_remove(
	    &m->index, hash_of(m->v[i].incarnation), (uint32_t) i);
	size_t last = m->n - 1;
	if (i != last) {
		allot__idmap_remove(&m->index, hash_of(m->v[last].incarnation),
		    (uint32_t) last);
		m->v[i] = m->v[last];
		allot__idmap_add(
		    &m->index, hash_of(m->v[i].incarnation), (uint32_t) i);
	}
	m->n--;
}

/* Full: forget the account whose newest record is oldest. */
static void
evict(allot__marks *m)
{
	size_t worst = 0;
	for (size_t i = 1; i < m->n; i++) {
		const allot__mark *a = &m->v[i], *b = &m->v[worst];
		if (a->second < b->second ||
		    (a->second == b->second &&
		        a->incarnation < b->incarnation))
			worst = i;
	}
	remove_at(m, worst);
}

int
allot__marks_set(
    allot__marks *m, uint64_t incarnation, uint64_t id, int64_t second)
{
	size_t i = find(m, incarnation);
	if (i != SIZE_MAX) {
		allot__mark *k = &m->v[i];
		if (id > k->id) {
			k->id = id;
			k->second = second;
		}
		return ALLOT_OK;
	}
	if (m->n == ALLOT__MARKS_MAX)
		evict(m);
	else if (m->n == m->cap && grow(m) != ALLOT_OK)
		return ALLOT_ENOMEM;
	m->v[m->n] = (allot__mark) {
		.incarnation = incarnation, .id = id, .second = second
	};
	allot__idmap_add(&m->index, hash_of(incarnation), (uint32_t) m->n);
	m->n++;
	return ALLOT_OK;
}

int
allot__marks_copy(allot__marks *dst, const allot__marks *src)
{
	if (src->n == 0) {
		allot__marks_fini(dst);
		return ALLOT_OK;
	}
	if (dst->cap != src->cap || dst->v == NULL) {
		allot__marks_fini(dst);
		dst->v = malloc(src->cap * sizeof *dst->v);
		if (dst->v == NULL ||
		    allot__idmap_init(&dst->index, (uint32_t) src->cap) !=
		        ALLOT_OK) {
			allot__marks_fini(dst);
			return ALLOT_ENOMEM;
		}
		dst->cap = src->cap;
	}
	/* Same capacity, same index size: the index is copied as is. */
	uint32_t slots = src->index.mask + 1;
	memcpy(dst->v, src->v, src->n * sizeof *dst->v);
	memcpy(dst->index.val, src->index.val, slots * sizeof *dst->index.val);
	memcpy(
	    dst->index.hash, src->index.hash, slots * sizeof *dst->index.hash);
	dst->n = src->n;
	return ALLOT_OK;
}

size_t
allot__marks_filter(
    allot__marks *m, allot__row_count *rows, size_t n, uint64_t *ret_overlaps)
{
	size_t kept = 0;
	for (size_t i = 0; i < n;) {
		if (rows[i].id == 0) {
			/* A link (a session's account), not a record. */
			rows[kept++] = rows[i++];
			continue;
		}
		/* One record: the rows of the same account and id. */
		size_t j = i + 1;
		while (j < n && rows[j].id != 0 &&
		    rows[j].incarnation == rows[i].incarnation &&
		    rows[j].id == rows[i].id)
			j++;
		uint64_t mark = allot__marks_get(m, rows[i].incarnation);
		if (rows[i].id > mark) {
			if (rows[i].first <= mark && ret_overlaps != NULL)
				(*ret_overlaps)++;
			(void) allot__marks_set(m, rows[i].incarnation,
			    rows[i].id, rows[i].second);
			for (size_t k = i; k < j; k++)
				rows[kept++] = rows[k];
		}
		i = j;
	}
	return kept;
}
