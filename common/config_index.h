/* SPDX-License-Identifier: MIT */
/*
 * The wire key -> quota index of a loaded config (config.h), built once
 * and then only read, by any number of threads: the agent resolves every
 * allot_acquire_id() through it, and the coordinator every reported key.
 * Two numberings, one per side: the agent's (caller i is quota i, the
 * default bucket is not indexed) and the coordinator's (the default is
 * quota 0 and caller i is quota i + 1). A caller-wide quota's wire key is
 * its identity, an endpoint quota's "IDENTITY ENDPOINT"
 * (allot__quota_key()).
 */
#ifndef ALLOT_COMMON_CONFIG_INDEX_H
#define ALLOT_COMMON_CONFIG_INDEX_H

#include <string.h>

#include "config.h"
#include "hash.h"
#include "idmap.h"

typedef struct allot__config_index {
	allot__idmap map;
	const char **ids; /* quota index -> wire key: the identity in the
	                     config, or an endpoint quota's key in `blob` */
	char *blob; /* endpoint quotas' keys, owned */
	uint32_t n; /* quotas indexed */
	uint64_t seed; /* of allot__hash */
} allot__config_index;

/* Index `cfg`'s quotas by wire key, hashed with `seed`; with
 * `with_default`, the coordinator's numbering. The index points into
 * `cfg`, which must outlive it. ALLOT_OK or ALLOT_ENOMEM. */
int allot__config_index_build(allot__config_index *ix, const allot_config *cfg,
    bool with_default, uint64_t seed);
void allot__config_index_free(allot__config_index *ix);

/* The quota index of the `len` bytes at `id`, whose allot__hash with the
 * index's seed is `h`, or -1. */
static inline int64_t
allot__config_index_find_h(
    const allot__config_index *ix, const char *id, size_t len, uint64_t h)
{
	uint32_t pos = allot__idmap_start(&ix->map, h), v;
	while (
	    (v = allot__idmap_next(&ix->map, h, &pos)) != ALLOT__IDMAP_NONE) {
		const char *s = ix->ids[v];
		if (memcmp(s, id, len) == 0 && s[len] == '\0')
			return v;
	}
	return -1;
}

/* The same, hashing `id` itself. */
static inline int64_t
allot__config_index_find(
    const allot__config_index *ix, const char *id, size_t len)
{
	return allot__config_index_find_h(
	    ix, id, len, allot__hash(id, len, ix->seed));
}

#endif
