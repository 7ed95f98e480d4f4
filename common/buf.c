/* SPDX-License-Identifier: MIT */
/*
 * The growable text buffer and the JSON string escaper (buf.h). A buffer
 * that fails to grow stops appending and says so (oom) rather than
 * failing each caller: a truncated status page is reported, not fatal.
 */
#include "buf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool
reserve(allot__buf *b, size_t extra)
{
	if (b->oom)
		return false;
	if (b->len + extra + 1 <= b->cap)
		return true;
	/* Small first: a quota's text is built field by field in buffers
	 * of its own, and a diff of 59,001 quotas makes millions of them
	 * (4 KiB each took a 59,001-quota apply to 3.6 s and 750 MB). */
	size_t cap = b->cap ? b->cap : 128;
	while (cap < b->len + extra + 1)
		cap *= 2;
	char *p = realloc(b->p, cap);
	if (p == NULL) {
		b->oom = true;
		return false;
	}
	b->p = p;
	b->cap = cap;
	return true;
}

void
allot__buf_printf(allot__buf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char small[256];
	int n = vsnprintf(small, sizeof small, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if (!reserve(b, (size_t) n))
		return;
	if ((size_t) n < sizeof small) {
		memcpy(b->p + b->len, small, (size_t) n + 1);
	} else {
		va_start(ap, fmt);
		vsnprintf(b->p + b->len, (size_t) n + 1, fmt, ap);
		va_end(ap);
	}
	b->len += (size_t) n;
}

void
allot__buf_put(allot__buf *b, const char *s, size_t n)
{
	if (!reserve(b, n))
		return;
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
}

void
allot__buf_puts(allot__buf *b, const char *s)
{
	allot__buf_put(b, s, strlen(s));
}

void
allot__buf_label(allot__buf *b, const char *s)
{
	for (; *s != '\0'; s++) {
		if (!reserve(b, 2))
			return;
		if (*s == '\\' || *s == '"') {
			b->p[b->len++] = '\\';
			b->p[b->len++] = *s;
		} else if (*s == '\n') {
			b->p[b->len++] = '\\';
			b->p[b->len++] = 'n';
		} else {
			b->p[b->len++] = *s;
		}
		b->p[b->len] = '\0';
	}
}

static void
buf_sink(void *ctx, const char *s, size_t n)
{
	allot__buf_put(ctx, s, n);
}

void
allot__buf_json(allot__buf *b, const char *s)
{
	allot__json_escape(s, buf_sink, b);
}

void
allot__buf_num(allot__buf *b, double v)
{
	if (!isfinite(v))
		v = 0;
	if (v == floor(v) && fabs(v) < 1e15)
		allot__buf_printf(b, "%.0f", v);
	else
		allot__buf_printf(b, "%.9g", v);
}

void
allot__buf_free(allot__buf *b)
{
	free(b->p);
	b->p = NULL;
	b->len = b->cap = 0;
	b->oom = false;
}

void
allot__json_escape(const char *s, allot__json_sink *put, void *ctx)
{
	put(ctx, "\"", 1);
	const char *run = s;
	for (; s != NULL && *s != '\0'; s++) {
		unsigned char c = (unsigned char) *s;
		char esc[8];
		int n;
		if (c == '"' || c == '\\')
			n = snprintf(esc, sizeof esc, "\\%c", c);
		else if (c < 0x20 || c == 0x7f)
			n = snprintf(esc, sizeof esc, "\\u%04x", c);
		else
			continue;
		if (s > run)
			put(ctx, run, (size_t) (s - run));
		put(ctx, esc, (size_t) n);
		run = s + 1;
	}
	if (s != NULL && s > run)
		put(ctx, run, (size_t) (s - run));
	put(ctx, "\"", 1);
}
