/* SPDX-License-Identifier: MIT */
/* Building the wire key -> quota index of a config (config_index.h). */
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
	size_t blob = 0;
	for (size_t i = 0; i < cfg->ncallers; i++)
		if (cfg->callers[i].endpoint != NULL)
			blob += allot__quota_key(&cfg->callers[i], NULL, 0) +
			    1;
	if (blob > 0 && (ix->blob = malloc(blob)) == NULL) {
		allot__config_index_free(ix);
		return ALLOT_ENOMEM;
	}
	char *p = ix->blob;
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
		if (q->endpoint != NULL) {
			size_t n = allot__quota_key(q, NULL, 0) + 1;
			allot__quota_key(q, p, n);
			ix->ids[i] = p;
			p += n;
		}
		const char *id = ix->ids[i];
		size_t len = strlen(id);
		uint64_t h = allot__hash(id, len, seed);
		/* The loader rejects duplicates; should one get through,
		 * the first stands. */
		if (allot__config_index_find_h(ix, id, len, h) >= 0)
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
	free(ix->blob);
	ix->ids = NULL;
	ix->blob = NULL;
}
