/* SPDX-License-Identifier: MIT */
/*
 * JSON string output to a stdio stream, for the tools and test reports
 * that write JSON lines (allot-sim --json, the fault suite's figures).
 * allotd renders into memory instead (allot__buf_json); both use the
 * one escaper, allot__json_escape (buf.h).
 */
#ifndef ALLOT_COMMON_JSON_H
#define ALLOT_COMMON_JSON_H

#include <stdio.h>

/* `s` as a JSON string, quotes included: '"' and '\' escaped, control
 * characters and DEL as \u00XX; NULL is written as "". */
void allot__json_fputs(FILE *f, const char *s);

#endif
