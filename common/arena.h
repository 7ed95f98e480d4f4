/* SPDX-License-Identifier: MIT */
/*
 * A bump arena to hand protobuf-c as its allocator, reset after every
 * message: decoding a request and building its answer then allocate
 * nothing in the steady state. allotd's server keeps one per worker; the
 * simulator one for its coordinator. Not thread-safe: one user at a time.
 *
 *     allot__arena ar = { 0 };
 *     ProtobufCAllocator pa = { allot__arena_alloc, allot__arena_free,
 *         &ar };
 *     ... unpack with &pa, build the answer from &pa, pack it ...
 *     allot__arena_reset(&ar);
 *     ...
 *     allot__arena_destroy(&ar);
 */
#ifndef ALLOT_COMMON_ARENA_H
#define ALLOT_COMMON_ARENA_H

#include <stddef.h>

typedef struct allot__arena {
	struct allot__arena_chunk *head; /* the chunk being filled */
	struct allot__arena_chunk *base; /* kept across resets */
	size_t total; /* bytes handed out since the last reset */
} allot__arena;

/* protobuf-c's alloc and free: `arena` is the allot__arena. Free does
 * nothing: everything goes at the next reset. */
void *allot__arena_alloc(void *arena, size_t size);
void allot__arena_free(void *arena, void *p);

/* Release what was handed out since the last reset. */
void allot__arena_reset(allot__arena *a);
/* Release everything; the arena may be used again (it is empty). */
void allot__arena_destroy(allot__arena *a);

#endif
