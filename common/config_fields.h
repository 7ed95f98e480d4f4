/* SPDX-License-Identifier: MIT */
/*
 * The per-quota fields of the quota model as one table (config_fields.c):
 * each row is a key that a quota mapping takes (quotas.default, a
 * caller, an endpoint quota, at the top level or in a service), with
 * its type, the quotas that take it, where it lives in allot__quota,
 * whether an endpoint quota inherits it from its caller, where it
 * enters the digest and what a diff calls it. The loader's key lists
 * and per-key parsing (config_schema.c), its checks (config_check.c),
 * the digest (config_digest.c), the text of diffs and audit rows
 * (config_diff.c) and the copy and free of a quota (config.c) all walk
 * the table, so that adding a field is a row and the code that uses
 * it. A quota's name (its identity and endpoint) and a caller's
 * endpoint quotas are not fields: they say which quota it is, not one
 * of its values.
 */
#ifndef ALLOT_COMMON_CONFIG_FIELDS_H
#define ALLOT_COMMON_CONFIG_FIELDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"

/* What a field holds. The type decides how the loader reads it and
 * checks it, how it enters the digest, how a diff writes it and how a
 * quota copies and frees it: each of those is a switch over this enum
 * without a default, so a new type fails to compile until every one of
 * them handles it. */
typedef enum allot__qtype {
	/* The quota's rate: one of the unit keys (tokens_per_second, ...),
	 * in tokens/s (double); the unit goes to the quota's unit_s, in
	 * which its other rates are written too. Held to the ceiling. */
	ALLOT__QT_RATE,
	/* A number of tokens > 0, at most ALLOT__BURST_MAX (double). Held
	 * to the endpoint weights. */
	ALLOT__QT_BURST,
	/* A priority class named in shed_order: its index (uint32_t),
	 * resolved once the whole file is read (config_check.c). */
	ALLOT__QT_CLASS,
	/* true or false (bool); see `dflt` and `word`. */
	ALLOT__QT_BOOL,
	/* One word of the row's `words`, kept as its index (int, the
	 * value of an enum such as allot_fallback); index 0 when absent. */
	ALLOT__QT_WORD,
	/* Free text on one line of at most `max` bytes (char *, owned;
	 * NULL when absent). */
	ALLOT__QT_TEXT,
	/* A number of tokens >= 0 per the quota's unit, kept in tokens/s
	 * (double; 0 when absent). */
	ALLOT__QT_PER_UNIT,
	/* A mapping of label name: value, kept as "name=value" in file
	 * order: the strings (char **, owned) at off, their count (size_t)
	 * at off2. */
	ALLOT__QT_LABELS,
	/* A rate (any unit) and a burst evaluated in shadow: the rate in
	 * tokens/s (double) at off, the burst (double) at off2; a rate of
	 * 0: none. Held to the ceiling and the weights like the quota's. */
	ALLOT__QT_CANDIDATE,
	/* A number from 0 to 1 (double); `num` when absent. */
	ALLOT__QT_FRACTION,
} allot__qtype;

/* The quotas that take a field (allot__qfield.scopes). */
#define ALLOT__QS_DEFAULT 1u /* quotas.default, services.NAME.default */
#define ALLOT__QS_CALLER 2u /* an entry of callers */
#define ALLOT__QS_ENDPOINT 4u /* an endpoint quota of a caller */
#define ALLOT__QS_ALL 7u

/* allot__qfield.flags */
#define ALLOT__QF_REQUIRED 1u /* a quota without it is refused */
/* An endpoint quota that does not set it has its caller's value. */
#define ALLOT__QF_INHERIT 2u
/* Named after the other fields in the loader's lists of keys, where it
 * has always been. */
#define ALLOT__QF_LISTED_LAST 4u
/* Frozen: in the second format's extension of the digest, always
 * written there once a quota has the extension (config_digest.c). No
 * row may join it: every digest with an extension would change. */
#define ALLOT__QF_DIGEST_EXT 8u

/* The places of the digest's first format (allot__qfield.first). */
#define ALLOT__QFIRST_N 6u

typedef struct allot__qfield {
	/* Its key in a quota mapping; a rate's is the first unit key. */
	const char *key;
	allot__qtype type;
	unsigned scopes; /* ALLOT__QS_* */
	unsigned flags; /* ALLOT__QF_* */
	/* offsetof(allot__quota, ...) of its value; off2 as its type
	 * says. */
	size_t off, off2;
	/* Frozen: its place in the digest's first format, 1 to
	 * ALLOT__QFIRST_N, or 0. A field added since the first format is
	 * digested only in quotas that set it (config_digest.c). */
	unsigned first;
	/* Its name in a diff's list of what moved ("burst 800 -> 400");
	 * NULL: its key. */
	const char *label;
	/* What precedes its value in a quota's text ("... burst 800 ...");
	 * NULL: its label and a space, except for a rate, a class and a
	 * flag, whose text says what they are ("500/s critical shadow"). */
	const char *prefix;
	/* Text and class: the most bytes, and what the loader's messages
	 * say it expects. */
	size_t max;
	const char *expect;
	/* A flag: its value when absent, and its text when it has the
	 * other value (at its default it has none). */
	bool dflt;
	const char *word;
	/* A fraction: its value when absent. */
	double num;
	/* A word: the words it may be, NULL-terminated, the first its
	 * default. */
	const char *const *words;
} allot__qfield;

/* The rows, in the order of a quota's text and of a diff's list of
 * what moved (and of the digest's extension). */
extern const allot__qfield allot__qfields[];
extern const size_t allot__nqfields;

/* At most this many keys in a quota mapping: the fields' (a rate's four
 * units), a caller's identity and its endpoints. */
#define ALLOT__QKEYS_MAX 32

/* The member of quota `q` at offset `off` (a row's off or off2), as a
 * T: an lvalue, read-only through a const quota (ALLOT__QFC). */
#define ALLOT__QF(T, q, off) (*(T *) (void *) ((char *) (q) + (off)))
#define ALLOT__QFC(T, q, off) \
	(*(T const *) (const void *) ((const char *) (q) + (off)))

/* The scope (ALLOT__QS_*) of quota `q`; `is_default`: it is a default
 * quota (quotas.default or a service's). */
unsigned allot__quota_scope(const allot__quota *q, bool is_default);

/* What a diff calls field `f`: its label, else its key. */
const char *allot__qfield_label(const allot__qfield *f);

/* Field `f` of `src` into `dst`, deep (text and labels are copied);
 * whatever dst held there is overwritten, not freed. dst's field is
 * left freeable either way. ALLOT_OK or ALLOT_ENOMEM. */
int allot__qfield_copy(
    allot__quota *dst, const allot__quota *src, const allot__qfield *f);

/* Free what field `f` of `q` owns and clear it. */
void allot__qfield_free(allot__quota *q, const allot__qfield *f);

#endif
