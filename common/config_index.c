/* SPDX-License-Identifier: MIT */
/* Building the identity -> quota index of a config (config_index.h). */
#include "config_index.h"

#include <stdlib.h>

int
allot__config_index_build(allot__config_index *ix, const allot_config *cfg,
    bool with_default, uint64_t seed)
{
	memset(ix, 0, sizeof *ix);
	ix->seed = seed;
	ix->n = (uint32_t) cfg->ncallers + (with_default ? 1 : 0);
	ix->ids = calloc(ix->n > 0 ? ix->n : 1, sizeof *ix->ids);
	if (ix->ids == NULL ||
	    allot__idmap_init(&ix->map, ix->n) != ALLOT_OK) {
		allot__config_index_free(ix);
		return ALLOT_ENOMEM;
	}
	for (uint32_t i = 0; i < ix->n; i++) {
		const allot__quota *q = !with_default ? &cfg->callers[i] :
		    i == 0                            ? &cfg->def :
		                                        &cfg->callers[i - 1];
		ix->ids[i] = q->identity;
		size_t len = strlen(q->identity);
		uint64_t h = allot__hash(q->identity, len, seed);
		/* The loader rejects duplicates; should one get through,
		 * the first stands. */
		if (allot__config_index_find_h(ix, q->identity, len, h) >= 0)
			continue;
		allot__idmap_add(&ix->map, h, i);
	}
	return ALLOT_OK;
}

void
allot__config_index_free(allot__config_index *ix)
{
	allot__idmap_fini(&ix->map);
	free(ix->ids);
	ix->ids = NULL;
}
