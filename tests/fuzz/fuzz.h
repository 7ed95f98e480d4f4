/* SPDX-License-Identifier: MIT */
/*
 * What the fuzz targets share: the libFuzzer entry point's prototype
 * (each fuzz_*.c defines it; libFuzzer's main calls it under clang with
 * -Dfuzz=true, and tests/fuzz/replay.c calls it in the normal build to
 * replay the seed corpus and the regression inputs), FUZZ_CHECK for the
 * invariants a target asserts beyond "does not crash", and the quota
 * config and key list that the wire and agent targets and the corpus
 * generator (mkcorpus.c) have in common, so that a seed Sync names keys
 * the target's coordinator knows.
 */
#ifndef ALLOT_TESTS_FUZZ_H
#define ALLOT_TESTS_FUZZ_H

#include <stdalign.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* An invariant the code under test promises: report and abort, which
 * libFuzzer records as a crash and the replay runner as a failure. */
#define FUZZ_CHECK(cond)                                                 \
	do {                                                             \
		if (!(cond)) {                                           \
			fprintf(stderr, "%s:%d: invariant failed: %s\n", \
			    __FILE__, __LINE__, #cond);                  \
			abort();                                         \
		}                                                        \
	} while (0)

/* Three callers (one open, one closed on fallback, one in shadow mode),
 * two weighted endpoints and a ceiling: every branch of the allocator
 * and of the agent's fallback is reachable. */
#define FUZZ_CONFIG_YAML                     \
	"quotas:\n"                          \
	"  default:\n"                       \
	"    tokens_per_second: 10\n"        \
	"    burst: 20\n"                    \
	"    shared: true\n"                 \
	"    priority: low\n"                \
	"  callers:\n"                       \
	"    - identity: \"spiffe://t/a\"\n" \
	"      tokens_per_second: 500\n"     \
	"      burst: 1000\n"                \
	"      priority: critical\n"         \
	"      fallback: open\n"             \
	"    - identity: \"spiffe://t/b\"\n" \
	"      tokens_per_second: 300\n"     \
	"      burst: 600\n"                 \
	"      priority: standard\n"         \
	"      fallback: closed\n"           \
	"    - identity: \"spiffe://t/c\"\n" \
	"      tokens_per_second: 0.5\n"     \
	"      burst: 50\n"                  \
	"      priority: batch\n"            \
	"      shadow: true\n"               \
	"  endpoint_weights:\n"              \
	"    default: 1\n"                   \
	"    \"/lookup\": 1\n"               \
	"    \"/export\": 20\n"              \
	"  global_ceiling:\n"                \
	"    tokens_per_second: 800\n"       \
	"    shed_order: [low, batch, standard, critical]\n"

/* The keys an agent with that config registers, in key-id order (the
 * callers in file order, then the default quota). */
#define FUZZ_NKEYS 4
#define FUZZ_KEYS                                                         \
	{                                                                 \
		"spiffe://t/a", "spiffe://t/b", "spiffe://t/c", "default" \
	}

/* A per-request allocator for protobuf-c, like allotd's arena, for the
 * targets that drive the dispatcher: every block is its own malloc so
 * that AddressSanitizer sees the bounds of each; fuzz_trk_reset()
 * releases them all at once after the answer is packed. */
typedef struct fuzz_blk {
	struct fuzz_blk *next;
	alignas(max_align_t) unsigned char data[];
} fuzz_blk;

static inline void *
fuzz_trk_alloc(void *arg, size_t size)
{
	fuzz_blk **head = arg;
	fuzz_blk *b = malloc(sizeof *b + (size > 0 ? size : 1));
	if (b == NULL)
		return NULL;
	b->next = *head;
	*head = b;
	return b->data;
}

static inline void
fuzz_trk_free(void *arg, void *p)
{
	(void) arg;
	(void) p; /* released by fuzz_trk_reset() */
}

static inline void
fuzz_trk_reset(fuzz_blk **head)
{
	while (*head != NULL) {
		fuzz_blk *n = (*head)->next;
		free(*head);
		*head = n;
	}
}

/* The service and replica of the session every wire input finds open
 * (session 1), and the sequence number the agent target's Sync carries. */
#define FUZZ_SERVICE "svc"
#define FUZZ_REPLICA "fuzz-replica-1"
#define FUZZ_SESSION 1u

#endif
