/* SPDX-License-Identifier: MIT */
/*
 * The table of a quota's fields (config_fields.h): one row per key a
 * quota mapping takes, the one place a new field is declared; and what
 * each type of field is in memory (its deep copy and its free). A row
 * says what the field is; the loader, the checks, the digest and the
 * diff each know what to do with each type.
 */
#include "config_fields.h"

#include <stdlib.h>
#include <string.h>

#define OFF(member) offsetof(allot__quota, member)

/* A word is kept as an int: the enums that hold them are int-sized. */
_Static_assert(sizeof(allot_fallback) == sizeof(int) &&
        sizeof(allot__access) == sizeof(int),
    "a word field is an int");

static const char *const fallback_words[] = { "static_share", "open", "closed",
	NULL };
static const char *const access_words[] = { "limited", "closed", "unlimited",
	NULL };

const allot__qfield allot__qfields[] = {
	{
	    .key = "tokens_per_second",
	    .type = ALLOT__QT_RATE,
	    .scopes = ALLOT__QS_ALL,
	    .flags = ALLOT__QF_REQUIRED | ALLOT__QF_DIGEST_EXT,
	    .off = OFF(rate),
	    .first = 1,
	    .label = "rate",
	},
	{
	    .key = "burst",
	    .type = ALLOT__QT_BURST,
	    .scopes = ALLOT__QS_ALL,
	    .flags = ALLOT__QF_REQUIRED,
	    .off = OFF(burst),
	    .first = 2,
	},
	{
	    .key = "priority",
	    .type = ALLOT__QT_CLASS,
	    .scopes = ALLOT__QS_ALL,
	    .flags = ALLOT__QF_INHERIT,
	    .off = OFF(priority),
	    .first = 3,
	    .max = ALLOT__CLASS_MAX,
	    .expect = "a priority class named in shed_order",
	},
	{
	    .key = "shadow",
	    .type = ALLOT__QT_BOOL,
	    .scopes = ALLOT__QS_ALL,
	    .flags = ALLOT__QF_INHERIT,
	    .off = OFF(shadow),
	    .first = 4,
	    .word = "shadow",
	},
	{
	    .key = "candidate",
	    .type = ALLOT__QT_CANDIDATE,
	    .scopes = ALLOT__QS_ALL,
	    .flags = ALLOT__QF_LISTED_LAST | ALLOT__QF_DIGEST_EXT,
	    .off = OFF(cand_rate),
	    .off2 = OFF(cand_burst),
	},
	{
	    .key = "fallback",
	    .type = ALLOT__QT_WORD,
	    .scopes = ALLOT__QS_ALL,
	    .flags = ALLOT__QF_INHERIT,
	    .off = OFF(fallback),
	    .first = 6,
	    .words = fallback_words,
	},
	{
	    /* The default's per-value buckets (docs/configuration.md):
	     * false gives each unknown caller a bucket of its own with the
	     * default's rate and burst (agent/values.c). */
	    .key = "shared",
	    .type = ALLOT__QT_BOOL,
	    .scopes = ALLOT__QS_DEFAULT,
	    .off = OFF(shared),
	    .first = 5,
	    .dflt = true,
	    .word = "per value",
	},
	{
	    .key = "owner",
	    .type = ALLOT__QT_TEXT,
	    .scopes = ALLOT__QS_ALL,
	    .flags = ALLOT__QF_DIGEST_EXT,
	    .off = OFF(owner),
	    .max = ALLOT__OWNER_MAX,
	    .expect = "who answers for the quota, such as a team",
	},
	{
	    .key = "reason",
	    .type = ALLOT__QT_TEXT,
	    .scopes = ALLOT__QS_ALL,
	    .flags = ALLOT__QF_DIGEST_EXT,
	    .off = OFF(reason),
	    .max = ALLOT__REASON_MAX,
	    .expect = "why the quota has this value",
	},
	{
	    .key = "expected_peak",
	    .type = ALLOT__QT_PER_UNIT,
	    .scopes = ALLOT__QS_ALL,
	    .flags = ALLOT__QF_DIGEST_EXT,
	    .off = OFF(expected_peak),
	    .prefix = "peak ",
	},
	{
	    .key = "labels",
	    .type = ALLOT__QT_LABELS,
	    .scopes = ALLOT__QS_ALL,
	    .flags = ALLOT__QF_DIGEST_EXT,
	    .off = OFF(labels),
	    .off2 = OFF(nlabels),
	},
	{
	    /* Stacked limits (docs/configuration.md): an endpoint quota
	     * charged on top of its caller's own quota. */
	    .key = "stacked",
	    .type = ALLOT__QT_BOOL,
	    .scopes = ALLOT__QS_ENDPOINT,
	    .off = OFF(stacked),
	    .word = "stacked",
	},
	{
	    /* The tail path's central reserve (docs/allocation.md): how
	     * much of the burst the coordinator may keep; 0 opts out. An
	     * endpoint quota follows its caller unless it says. */
	    .key = "reserve",
	    .type = ALLOT__QT_FRACTION,
	    .scopes = ALLOT__QS_ALL,
	    .flags = ALLOT__QF_INHERIT,
	    .off = OFF(reserve),
	    .num = 1.0,
	},
	{
	    /* Plans' closed and unlimited (docs/configuration.md): a
	     * quota that admits nothing (403, not 429) or everything,
	     * decided by each agent alone. Not inherited: an endpoint
	     * quota says for itself. */
	    .key = "access",
	    .type = ALLOT__QT_WORD,
	    .scopes = ALLOT__QS_ALL,
	    .off = OFF(access),
	    .words = access_words,
	},
};

const size_t allot__nqfields = sizeof allot__qfields /
    sizeof allot__qfields[0];

unsigned
allot__quota_scope(const allot__quota *q, bool is_default)
{
	if (is_default)
		return ALLOT__QS_DEFAULT;
	return q->endpoint != NULL ? ALLOT__QS_ENDPOINT : ALLOT__QS_CALLER;
}

const char *
allot__qfield_label(const allot__qfield *f)
{
	return f->label != NULL ? f->label : f->key;
}

static int
labels_copy(allot__quota *dst, const allot__quota *src, const allot__qfield *f)
{
	char **from = ALLOT__QFC(char **, src, f->off);
	size_t n = ALLOT__QFC(size_t, src, f->off2);
	char ***to = &ALLOT__QF(char **, dst, f->off);
	size_t *nto = &ALLOT__QF(size_t, dst, f->off2);
	*to = NULL;
	*nto = 0;
	if (n == 0)
		return ALLOT_OK;
	if ((*to = calloc(n, sizeof **to)) == NULL)
		return ALLOT_ENOMEM;
	/* Counted as each is copied: a failure half-way leaves what
	 * allot__qfield_free() releases. */
	for (; *nto < n; (*nto)++)
		if (((*to)[*nto] = strdup(from[*nto])) == NULL)
			return ALLOT_ENOMEM;
	return ALLOT_OK;
}

int
allot__qfield_copy(
    allot__quota *dst, const allot__quota *src, const allot__qfield *f)
{
	switch (f->type) {
	case ALLOT__QT_RATE:
	case ALLOT__QT_BURST:
	case ALLOT__QT_PER_UNIT:
	case ALLOT__QT_FRACTION:
		ALLOT__QF(double, dst, f->off) = ALLOT__QFC(
		    double, src, f->off);
		return ALLOT_OK;
	case ALLOT__QT_CLASS:
		ALLOT__QF(uint32_t, dst, f->off) = ALLOT__QFC(
		    uint32_t, src, f->off);
		return ALLOT_OK;
	case ALLOT__QT_BOOL:
		ALLOT__QF(bool, dst, f->off) = ALLOT__QFC(bool, src, f->off);
		return ALLOT_OK;
	case ALLOT__QT_WORD:
		ALLOT__QF(int, dst, f->off) = ALLOT__QFC(int, src, f->off);
		return ALLOT_OK;
	case ALLOT__QT_CANDIDATE:
		ALLOT__QF(double, dst, f->off) = ALLOT__QFC(
		    double, src, f->off);
		ALLOT__QF(double, dst, f->off2) = ALLOT__QFC(
		    double, src, f->off2);
		return ALLOT_OK;
	case ALLOT__QT_TEXT: {
		const char *s = ALLOT__QFC(char *, src, f->off);
		char **d = &ALLOT__QF(char *, dst, f->off);
		*d = s != NULL ? strdup(s) : NULL;
		return s != NULL && *d == NULL ? ALLOT_ENOMEM : ALLOT_OK;
	}
	case ALLOT__QT_LABELS: return labels_copy(dst, src, f);
	}
	return ALLOT_OK;
}

void
allot__qfield_free(allot__quota *q, const allot__qfield *f)
{
	switch (f->type) {
	case ALLOT__QT_RATE:
	case ALLOT__QT_BURST:
	case ALLOT__QT_CLASS:
	case ALLOT__QT_BOOL:
	case ALLOT__QT_WORD:
	case ALLOT__QT_PER_UNIT:
	case ALLOT__QT_CANDIDATE:
	case ALLOT__QT_FRACTION: break;
	case ALLOT__QT_TEXT:
		free(ALLOT__QF(char *, q, f->off));
		ALLOT__QF(char *, q, f->off) = NULL;
		break;
	case ALLOT__QT_LABELS: {
		char **v = ALLOT__QF(char **, q, f->off);
		size_t n = ALLOT__QF(size_t, q, f->off2);
		for (size_t i = 0; i < n; i++)
			free(v[i]);
		free(v);
		ALLOT__QF(char **, q, f->off) = NULL;
		ALLOT__QF(size_t, q, f->off2) = 0;
		break;
	}
	}
}
