/* SPDX-License-Identifier: MIT */
/*
 * The store's find-or-add table (store_tab.h): an entry array that
 * doubles from 64 entries and a bucket array of indices kept at least as
 * large as the entry count, so chains stay short.
 */
#include "store_tab.h"

#include <stdlib.h>
#include <string.h>

#define NIL ALLOT__TAB_NIL

void
allot__tab_init(allot__tab *t, size_t esz)
{
	memset(t, 0, sizeof *t);
	t->esz = esz;
}

static int
tab_rehash(allot__tab *t, uint32_t nbkt)
{
	uint32_t *b = malloc((size_t) nbkt * sizeof *b);
	if (b == NULL)
		return -1;
	memset(b, 0xff, (size_t) nbkt * sizeof *b);
	for (uint32_t i = 0; i < t->n; i++) {
		allot__tab_hdr *e = allot__tab_at(t, i);
		if (!e->live)
			continue;
		e->next = b[e->h & (nbkt - 1)];
		b[e->h & (nbkt - 1)] = i;
	}
	free(t->bkt);
	t->bkt = b;
	t->nbkt = nbkt;
	return 0;
}

uint32_t
allot__tab_add(allot__tab *t, uint64_t h)
{
	if (t->n == t->cap) {
		if (t->cap >= (UINT32_MAX >> 1))
			return NIL;
		uint32_t cap = t->cap == 0 ? 64 : t->cap * 2;
		unsigned char *p = realloc(t->ents, (size_t) cap * t->esz);
		if (p == NULL)
			return NIL;
		t->ents = p;
		t->cap = cap;
	}
	if (t->n >= t->nbkt &&
	    tab_rehash(t, t->nbkt == 0 ? 64 : t->nbkt * 2) != 0)
		return NIL;
	uint32_t i = t->n++;
	allot__tab_hdr *e = allot__tab_at(t, i);
	memset(e, 0, t->esz);
	e->h = h;
	e->live = 1;
	e->next = t->bkt[h & (t->nbkt - 1)];
	t->bkt[h & (t->nbkt - 1)] = i;
	return i;
}

void
allot__tab_unlink(allot__tab *t, uint32_t i)
{
	allot__tab_hdr *e = allot__tab_at(t, i);
	uint32_t *slot = &t->bkt[e->h & (t->nbkt - 1)];
	while (*slot != i)
		slot = &allot__tab_at(t, *slot)->next;
	*slot = e->next;
	e->live = 0;
}

void
allot__tab_compact(allot__tab *t)
{
	uint32_t j = 0;
	for (uint32_t i = 0; i < t->n; i++) {
		if (!allot__tab_at(t, i)->live)
			continue;
		if (i != j)
			memcpy(
			    allot__tab_at(t, j), allot__tab_at(t, i), t->esz);
		j++;
	}
	t->n = j;
	/* Relinking in place cannot fail: the bucket array is kept. */
	memset(t->bkt, 0xff, (size_t) t->nbkt * sizeof *t->bkt);
	for (uint32_t i = 0; i < t->n; i++) {
		allot__tab_hdr *e = allot__tab_at(t, i);
		e->next = t->bkt[e->h & (t->nbkt - 1)];
		t->bkt[e->h & (t->nbkt - 1)] = i;
	}
}

void
allot__tab_free(allot__tab *t)
{
	free(t->ents);
	free(t->bkt);
	size_t esz = t->esz;
	allot__tab_init(t, esz);
}

void
allot__tab_clear(allot__tab *t)
{
	if (t->cap > 65536 && t->n < t->cap / 4) {
		allot__tab_free(t);
		return;
	}
	t->n = 0;
	if (t->nbkt != 0)
		memset(t->bkt, 0xff, (size_t) t->nbkt * sizeof *t->bkt);
}
