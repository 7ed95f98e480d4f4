/* SPDX-License-Identifier: MIT */
/*
 * A bump arena for protobuf-c (arena.h): chunks of at least 64 KiB,
 * doubling; a reset frees all but the base chunk, which it regrows to
 * what the last round needed (up to 16 MiB) when that overflowed it.
 */
#include "arena.h"

#include <stdalign.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>

#define ARENA_MIN (64u * 1024u)
#define ARENA_KEEP_MAX (16u * 1024u * 1024u)

struct allot__arena_chunk {
	struct allot__arena_chunk *next;
	size_t cap;
	size_t used;
	alignas(max_align_t) unsigned char data[];
};

typedef struct allot__arena_chunk chunk;
typedef allot__arena arena;

static chunk *
chunk_new(size_t cap)
{
	chunk *c = malloc(sizeof *c + cap);
	if (c == NULL)
		return NULL;
	c->next = NULL;
	c->cap = cap;
	c->used = 0;
	return c;
}

void *
allot__arena_alloc(void *arg, size_t size)
{
	arena *a = arg;
	size = (size + alignof(max_align_t) - 1) &
	    ~(size_t) (alignof(max_align_t) - 1);
	if (size == 0)
		size = alignof(max_align_t);
	chunk *c = a->head;
	if (c == NULL || c->cap - c->used < size) {
		size_t cap = c != NULL ? c->cap * 2 : ARENA_MIN;
		while (cap < size)
			cap *= 2;
		chunk *n = chunk_new(cap);
		if (n == NULL)
			return NULL;
		n->next = a->head;
		a->head = n;
		if (a->base == NULL)
			a->base = n;
		c = n;
	}
	void *p = c->data + c->used;
	c->used += size;
	a->total += size;
	return p;
}

void
allot__arena_free(void *arg, void *p)
{
	(void) arg;
	(void) p; /* released all at once by allot__arena_reset() */
}

/* Release everything; when the last request overflowed the base chunk,
 * replace it with one as large as that request needed (up to a bound),
 * so a steady stream of such requests stops allocating. */
void
allot__arena_reset(allot__arena *a)
{
	bool overflowed = a->head != a->base;
	size_t want = a->total;
	chunk *c = a->head;
	while (c != NULL) {
		chunk *next = c->next;
		if (c != a->base)
			free(c);
		c = next;
	}
	a->head = a->base;
	if (a->base != NULL)
		a->base->used = 0;
	if (overflowed && want <= ARENA_KEEP_MAX && a->base != NULL &&
	    want > a->base->cap) {
		size_t cap = a->base->cap;
		while (cap < want)
			cap *= 2;
		chunk *n = chunk_new(cap);
		if (n != NULL) {
			free(a->base);
			a->base = a->head = n;
		}
	}
	a->total = 0;
}

void
allot__arena_destroy(allot__arena *a)
{
	chunk *c = a->head;
	while (c != NULL) {
		chunk *next = c->next;
		free(c);
		c = next;
	}
	a->head = a->base = NULL;
}
