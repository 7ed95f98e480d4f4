/* SPDX-License-Identifier: MIT */
/*
 * The one hash index of allot: open addressing with linear probing from
 * a 64-bit hash to a small integer (an index into the caller's own array
 * of entries). It stores each entry's hash, never its key: a lookup walks
 * the entries whose hash matches and the caller compares the keys, so
 * one index serves string identities, endpoint names and binary peer
 * addresses alike. Sized once at creation for a known number of entries
 * (at most half full); removal shifts the entries that follow back, so
 * no tombstones build up. Not thread-safe: readers and writers serialise
 * outside, or the index is built once and only read.
 *
 *	uint32_t pos = allot__idmap_start(m, h), v;
 *	while ((v = allot__idmap_next(m, h, &pos)) != ALLOT__IDMAP_NONE)
 *		if (key_equal(&entries[v], key))
 *			return v;
 */
#ifndef ALLOT_COMMON_IDMAP_H
#define ALLOT_COMMON_IDMAP_H

#include <stdint.h>

#define ALLOT__IDMAP_NONE UINT32_MAX

typedef struct allot__idmap {
	uint32_t *val; /* value + 1; 0 marks an empty slot */
	uint64_t *hash;
	uint32_t mask;
} allot__idmap;

/* Room for `n` entries (values below UINT32_MAX). ALLOT_OK or
 * ALLOT_ENOMEM; an index that failed to initialise may still be
 * finalised. */
int allot__idmap_init(allot__idmap *m, uint32_t n);
void allot__idmap_fini(allot__idmap *m);

/* The slots an index for `n` entries has (a power of two): for a
 * table of its own kind that must be sized the same way. */
uint32_t allot__idmap_slots(uint32_t n);

/* Add value `v` under hash `h`. The caller keeps within the `n` it
 * asked for and does not add a key twice. */
void allot__idmap_add(allot__idmap *m, uint64_t h, uint32_t v);

/* Remove value `v`, added under hash `h`; nothing if it is not there. */
void allot__idmap_remove(allot__idmap *m, uint64_t h, uint32_t v);

/* Where a walk of the values under `h` starts. */
static inline uint32_t
allot__idmap_start(const allot__idmap *m, uint64_t h)
{
	return (uint32_t) h & m->mask;
}

/* The next value added under hash `h`, or ALLOT__IDMAP_NONE when there is
 * none left; `*pos` is the walk's place, from allot__idmap_start(). */
static inline uint32_t
allot__idmap_next(const allot__idmap *m, uint64_t h, uint32_t *pos)
{
	for (;;) {
		uint32_t p = *pos;
		uint32_t v = m->val[p];
		if (v == 0)
			return ALLOT__IDMAP_NONE;
		*pos = (p + 1) & m->mask;
		if (m->hash[p] == h)
			return v - 1;
	}
}

#endif
