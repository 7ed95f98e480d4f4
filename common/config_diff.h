/* SPDX-License-Identifier: MIT */
/*
 * What changes between two loaded quota configs, quota by quota: the
 * one diff allotd records in its audit table (v_quota_changes), answers
 * on its admin socket (POST /config/diff, /config/apply) and allotctl
 * prints. Each quota is described as one line of readable text
 * ("500/s burst 1000 critical shadow owner payments"), which is what the
 * audit rows hold as before and after. Settings of the whole file (the
 * global ceiling, the endpoint weights, the shed order) are compared
 * too and appear as pseudo-quotas in parentheses. Set-up paths only:
 * this allocates freely.
 */
#ifndef ALLOT_COMMON_CONFIG_DIFF_H
#define ALLOT_COMMON_CONFIG_DIFF_H

#include <stddef.h>

#include "config.h"
#include "config_fields.h"

typedef enum allot__change_kind {
	ALLOT__QUOTA_ADDED = 0,
	ALLOT__QUOTA_REMOVED = 1,
	ALLOT__QUOTA_CHANGED = 2,
} allot__change_kind;

/* One quota added, removed or changed. Every string is owned by the
 * change. */
typedef struct allot__quota_change {
	allot__change_kind kind;
	/* The service section (services.NAME) the quota is set in; NULL
	 * for the top level of the file. A service's row is only for what
	 * its own section sets: a top-level change is one row, not one per
	 * service that inherits it. */
	char *service;
	/* Its wire key (allot__quota_key: "IDENTITY" or "IDENTITY
	 * ENDPOINT"), "default", or a whole-file setting in parentheses:
	 * "(global_ceiling)", "(endpoint_weights)", "(shed_order)". */
	char *quota;
	char *before; /* its text; NULL when added */
	char *after; /* its text; NULL when removed */
	/* Changed only: what moved, "rate 400/s -> 200/s; burst 800 ->
	 * 400" (fields in a fixed order). NULL otherwise. */
	char *fields;
	char *owner; /* metadata owner, of after (else before); NULL */
} allot__quota_change;

typedef struct allot__config_diff {
	allot__quota_change *v; /* in the order of `after`, then removed */
	size_t n;
} allot__config_diff;

/* The changes from `before` (NULL: an empty store, every quota added)
 * to `after`. ALLOT_OK or ALLOT_ENOMEM (then *ret is empty). */
int allot__config_diff_compute(const allot_config *before,
    const allot_config *after, allot__config_diff *ret);
void allot__config_diff_free(allot__config_diff *d);

/* "added", "removed", "changed" (the audit table's action column). */
const char *allot__change_kind_name(allot__change_kind k);

/* The text of quota `q` of `cfg` (the priority names come from it);
 * a string the caller frees, NULL when out of memory. */
char *allot__quota_text(const allot_config *cfg, const allot__quota *q);

/* Field `f` (a row of allot__qfields) of quota `q` of `cfg` as the text
 * writes it, without its prefix: "" when it has its default (or q's
 * kind of quota does not take it). A string the caller frees, NULL when
 * out of memory. */
char *allot__quota_field_text(
    const allot_config *cfg, const allot__quota *q, const allot__qfield *f);

#endif
