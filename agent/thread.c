/* SPDX-License-Identifier: MIT */
/*
 * Per-thread counter blocks (agent_int.h): how a thread finds its block
 * (a TLS cache keyed by the agent's generation, then a pthread key), how
 * blocks are created, adopted after their thread exits, and freed with
 * the agent, and the return of a thread's token leases when it exits.
 * Only the first acquire of a thread comes here.
 */
#include "agent_int.h"

#include <stdlib.h>
#include <string.h>

_Thread_local allot__tlcache allot__tl
    __attribute__((tls_model("initial-exec")));

static _Atomic uint64_t next_gen = 1;

/* calloc, aligned to a line: the allocator hands large sizes out as
 * fresh mapped pages, which it does not clear (they are zero), so the
 * pages of a reserve stay untouched until used; and its statistics
 * (mallinfo2) still count them. The pointer calloc gave is kept in the
 * 8 bytes before the aligned one. */
void *
allot__zalloc(size_t sz)
{
	char *raw = calloc(1, sz + 64);
	if (raw == NULL)
		return NULL;
	char *p = (char *) (((uintptr_t) raw + 64) & ~(uintptr_t) 63);
	((void **) p)[-1] = raw;
	return p;
}

void
allot__zfree(void *p)
{
	if (p != NULL)
		free(((void **) p)[-1]);
}

/* A block's size: its counters for every key the agent may have, most
 * of them (the reserved capacity) never touched. */
static size_t
block_size(const allot_agent *a)
{
	return sizeof(allot__tblock) +
	    sizeof(allot__kcount) * (size_t) a->nkeys;
}

static allot__tblock *
block_new(allot_agent *a, bool shared)
{
	allot__tblock *b = allot__zalloc(block_size(a));
	if (b == NULL)
		return NULL;
	b->shared = shared;
	b->agent = a;
	return b;
}

/* A thread exits: its block may be adopted by the next new thread. The
 * counts stay; the adopter keeps adding to them. */
static void
thread_exit(void *p)
{
	allot__tblock *b = p;
	/* Its leases go back now: an adopter may come much later. */
	allot__leases_return(b->agent, b);
	atomic_store_explicit(&b->owned, 0, memory_order_release);
}

int
allot__blocks_init(allot_agent *a)
{
	a->gen = atomic_fetch_add(&next_gen, 1);
	pthread_mutex_init(&a->blk_lock, NULL);
	a->blocks = calloc(a->max_blocks, sizeof *a->blocks);
	a->shared_block = block_new(a, true);
	if (a->blocks == NULL || a->shared_block == NULL)
		return ALLOT_ENOMEM;
	if (pthread_key_create(&a->tkey, thread_exit) != 0)
		return ALLOT_ENOMEM;
	a->tkey_ok = true;
	return ALLOT_OK;
}

void
allot__blocks_fini(allot_agent *a)
{
	/* After this no destructor of ours runs for threads still alive. */
	if (a->tkey_ok)
		pthread_key_delete(a->tkey);
	if (allot__tl.gen == a->gen)
		allot__tl.gen = 0;
	uint32_t n = atomic_load(&a->nblocks);
	for (uint32_t i = 0; i < n && a->blocks != NULL; i++)
		allot__zfree(a->blocks[i]);
	free(a->blocks);
	allot__zfree(a->shared_block);
	pthread_mutex_destroy(&a->blk_lock);
}

allot__tblock *
allot__thread_block_slow(allot_agent *a)
{
	allot__tblock *b = pthread_getspecific(a->tkey);
	if (b == NULL) {
		pthread_mutex_lock(&a->blk_lock);
		uint32_t n = atomic_load_explicit(
		    &a->nblocks, memory_order_relaxed);
		for (uint32_t i = 0; i < n; i++)
			if (!atomic_load_explicit(
			        &a->blocks[i]->owned, memory_order_acquire)) {
				b = a->blocks[i];
				break;
			}
		if (b == NULL && n < a->max_blocks &&
		    (b = block_new(a, false)) != NULL) {
			a->blocks[n] = b;
			atomic_store_explicit(
			    &a->nblocks, n + 1, memory_order_release);
		}
		if (b != NULL)
			atomic_store_explicit(
			    &b->owned, 1, memory_order_relaxed);
		pthread_mutex_unlock(&a->blk_lock);
		if (b == NULL || pthread_setspecific(a->tkey, b) != 0) {
			if (b != NULL)
				atomic_store(&b->owned, 0);
			/* Past max_threads (or out of memory): count in the
			 * shared block, atomically. Not cached, so a block
			 * freed later by an exiting thread is picked up. */
			return a->shared_block;
		}
	}
	allot__tl.gen = a->gen;
	allot__tl.b = b;
	return b;
}
