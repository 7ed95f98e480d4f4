/* SPDX-License-Identifier: MIT */
/*
 * The one definition of a valid name: a caller identity in the config, a
 * key, service or replica id of a Register, and so a name in the store.
 * The config loader (config_schema.c), the coordinator's wire check
 * (coordinator/state/validate.c) and everything downstream use this rule, so a
 * config the loader accepts can never make a Register fail on a name.
 *
 * A name is 1 to max bytes of printable ASCII (0x20-0x7e). UTF-8 and
 * control characters are refused everywhere with the same words: names
 * end up in Prometheus label values, JSON, log lines and SQLite rows, and
 * printable ASCII keeps all four safe without escaping.
 */
#ifndef ALLOT_COMMON_NAME_H
#define ALLOT_COMMON_NAME_H

#include <stdbool.h>
#include <stddef.h>

#define ALLOT__NAME_MAX 255u

/* The words every refusal uses, after "must be 1-N". */
#define ALLOT__NAME_RULE "printable ASCII characters (0x20-0x7e)"

/* Whether s is a valid name of at most `max` bytes; NULL or "" is valid
 * only when !required. */
bool allot__name_valid(const char *s, size_t max, bool required);

#endif
