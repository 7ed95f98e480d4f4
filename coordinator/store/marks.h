/* SPDX-License-Identifier: MIT */
/*
 * Usage marks: per agent account (Register.incarnation), the highest
 * Usage id booked, and the second of its newest record. The audit books
 * an agent's Usage record once by comparing its id with the mark
 * (docs/operations.md, "The accounting guarantee"): the leader's state
 * before it books (what it accepted), a single allotd's store after a
 * commit (what is durable), each cluster member's state machine when it
 * applies a USAGE entry (what is committed, in its snapshots too).
 *
 * At most ALLOT__MARKS_MAX accounts; past it the one whose newest record
 * is oldest (then the lowest incarnation) is forgotten, so the same
 * sequence of calls leaves every member with the same marks. Not
 * thread-safe: the owner serialises.
 */
#ifndef ALLOT_COORDINATOR_STORE_MARKS_H
#define ALLOT_COORDINATOR_STORE_MARKS_H

#include <stddef.h>
#include <stdint.h>

#include "idmap.h"
#include "rows.h"

#define ALLOT__MARKS_MAX 65536u

typedef struct allot__mark {
	uint64_t incarnation;
	uint64_t id; /* the highest id booked */
	int64_t second; /* its record's second (the newest booked) */
} allot__mark;

typedef struct allot__marks {
	allot__mark *v;
	size_t n;
	size_t cap;
	allot__idmap index; /* incarnation -> position in v */
} allot__marks;

void allot__marks_init(allot__marks *m);
void allot__marks_fini(allot__marks *m);
void allot__marks_clear(allot__marks *m);

/* The mark of `incarnation`; 0 when there is none. */
uint64_t allot__marks_get(const allot__marks *m, uint64_t incarnation);

/* Raise the mark of `incarnation` to `id` (a lower id leaves it),
 * created if absent. ALLOT_OK or ALLOT_ENOMEM (nothing changed). */
int allot__marks_set(
    allot__marks *m, uint64_t incarnation, uint64_t id, int64_t second);

/* Make `dst` a copy of `src`. ALLOT_OK or ALLOT_ENOMEM (`dst` is then
 * empty). */
int allot__marks_copy(allot__marks *dst, const allot__marks *src);

/* Keep the rows of `rows` whose record is new to the marks, moving them
 * to the front in their order, and raise the marks past them (rows with
 * id 0 are links, a session's account, and always kept): a record
 * is new when its id is above its account's mark (a folded record whose
 * first id is not is still booked, and counted in `*ret_overlaps`).
 * Returns the rows kept. Out of memory keeps a row without marking it. */
size_t allot__marks_filter(
    allot__marks *m, allot__row_count *rows, size_t n, uint64_t *ret_overlaps);

#endif
