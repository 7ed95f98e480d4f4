/* SPDX-License-Identifier: MIT */
/*
 * The growable text buffer allotd's HTTP endpoints, metrics and status
 * documents render into, and the one JSON string escaper: the buffer's
 * allot__buf_json and json.h's stdio writer both go through
 * allot__json_escape, so every JSON string allot writes is escaped the
 * same way ('"' and '\' backslashed, control characters and DEL as
 * \u00XX).
 */
#ifndef ALLOT_COMMON_BUF_H
#define ALLOT_COMMON_BUF_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct allot__buf {
	char *p;
	size_t len;
	size_t cap;
	bool oom; /* an append failed: the text is truncated */
} allot__buf;

void allot__buf_printf(allot__buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void allot__buf_puts(allot__buf *b, const char *s);
/* Append `n` bytes of `s`. */
void allot__buf_put(allot__buf *b, const char *s, size_t n);
/* Append `s` escaped as a Prometheus label value (\\, \", \n). */
void allot__buf_label(allot__buf *b, const char *s);
/* Append `s` as a JSON string, quotes included; NULL as "". */
void allot__buf_json(allot__buf *b, const char *s);
/* Append a finite double as a number (JSON/Prometheus); NaN/Inf as 0. */
void allot__buf_num(allot__buf *b, double v);
void allot__buf_free(allot__buf *b);

/* Where allot__json_escape writes: `n` bytes at `s`. */
typedef void allot__json_sink(void *ctx, const char *s, size_t n);

/* Write `s` as a JSON string, quotes included, through `put`: runs of
 * plain bytes in one call each. NULL is written as "". */
void allot__json_escape(const char *s, allot__json_sink *put, void *ctx);

#endif
