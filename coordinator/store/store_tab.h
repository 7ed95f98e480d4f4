/* SPDX-License-Identifier: MIT */
/*
 * The store's find-or-add table: a chained hash table over one array of
 * fixed-size entries, each starting with an allot__tab_hdr. Entries stay
 * in insertion order (so the oldest usage rows are at the front), buckets
 * hold indices, and clearing keeps the memory, so a batch reaches a
 * steady size and stops allocating. Unlinked entries stay in the array as
 * holes until the next clear or compaction. The caller does the lookup
 * (walk allot__tab_head() and each entry's hdr.next, comparing its own
 * fields) and locks; the table only stores and links.
 */
#ifndef ALLOT_COORDINATOR_STORE_TAB_H
#define ALLOT_COORDINATOR_STORE_TAB_H

#include <stddef.h>
#include <stdint.h>

#define ALLOT__TAB_NIL UINT32_MAX

typedef struct allot__tab_hdr {
	uint64_t h;
	uint32_t next;
	uint32_t live;
} allot__tab_hdr;

typedef struct allot__tab {
	unsigned char *ents;
	size_t esz;
	uint32_t n; /* entries used, holes included */
	uint32_t cap;
	uint32_t *bkt;
	uint32_t nbkt; /* power of two, or 0 */
} allot__tab;

/* An empty table of entries of `esz` bytes (allocates nothing). */
void allot__tab_init(allot__tab *t, size_t esz);

/* Entry `i`, valid until the next allot__tab_add(). */
static inline allot__tab_hdr *
allot__tab_at(const allot__tab *t, uint32_t i)
{
	return (allot__tab_hdr *) (void *) (t->ents + (size_t) i * t->esz);
}

/* The first entry of the chain hash `h` falls in, or ALLOT__TAB_NIL. */
static inline uint32_t
allot__tab_head(const allot__tab *t, uint64_t h)
{
	return t->nbkt == 0 ? ALLOT__TAB_NIL : t->bkt[h & (t->nbkt - 1)];
}

/* Append a zeroed live entry with hash `h`; ALLOT__TAB_NIL when out of
 * memory. The array may move: pointers from allot__tab_at() before this
 * call are stale. */
uint32_t allot__tab_add(allot__tab *t, uint64_t h);

/* Take entry `i` out of its chain; it stays in the array as a hole. */
void allot__tab_unlink(allot__tab *t, uint32_t i);

/* Squeeze the holes out (order kept). */
void allot__tab_compact(allot__tab *t);

/* Empty the table; memory is kept unless a spike left it mostly unused. */
void allot__tab_clear(allot__tab *t);

/* Release the memory; the table is empty and may be used again. */
void allot__tab_free(allot__tab *t);

#endif
