/* SPDX-License-Identifier: MIT */
/* The shared open-addressing hash index (idmap.h). */
#include "idmap.h"

#include <stdlib.h>

#include <allot/allot.h>

uint32_t
allot__idmap_slots(uint32_t n)
{
	/* At most half full: a probe stays a few slots long. */
	uint32_t cap = 8;
	while (cap < (uint64_t) n * 2 + 1 && cap < (1u << 30))
		cap <<= 1;
	return cap;
}

int
allot__idmap_init(allot__idmap *m, uint32_t n)
{
	uint32_t cap = allot__idmap_slots(n);
	m->mask = cap - 1;
	m->val = calloc(cap, sizeof *m->val);
	m->hash = calloc(cap, sizeof *m->hash);
	if (m->val == NULL || m->hash == NULL) {
		allot__idmap_fini(m);
		return ALLOT_ENOMEM;
	}
	return ALLOT_OK;
}

void
allot__idmap_fini(allot__idmap *m)
{
	free(m->val);
	free(m->hash);
	m->val = NULL;
	m->hash = NULL;
}

void
allot__idmap_add(allot__idmap *m, uint64_t h, uint32_t v)
{
	uint32_t p = (uint32_t) h & m->mask;
	while (m->val[p] != 0)
		p = (p + 1) & m->mask;
	m->val[p] = v + 1;
	m->hash[p] = h;
}

/* Whether slot `home` lies cyclically in (hole, at]: an entry at `at`
 * with that home must stay where it is when `hole` empties. */
static int
stays(uint32_t hole, uint32_t at, uint32_t home)
{
	return hole <= at ? hole < home && home <= at :
	                    hole < home || home <= at;
}

void
allot__idmap_remove(allot__idmap *m, uint64_t h, uint32_t v)
{
	uint32_t hole = (uint32_t) h & m->mask;
	while (m->val[hole] != v + 1) {
		if (m->val[hole] == 0)
			return;
		hole = (hole + 1) & m->mask;
	}
	/* Shift back every entry of the run that the hole would cut off
	 * from its home slot. */
	m->val[hole] = 0;
	for (uint32_t at = (hole + 1) & m->mask; m->val[at] != 0;
	     at = (at + 1) & m->mask) {
		if (stays(hole, at, (uint32_t) m->hash[at] & m->mask))
			continue;
		m->val[hole] = m->val[at];
		m->hash[hole] = m->hash[at];
		m->val[at] = 0;
		hole = at;
	}
}
