/* SPDX-License-Identifier: MIT */
/* JSON strings to a stdio stream (json.h), escaped by buf.h's escaper. */
#include "json.h"

#include "buf.h"

static void
file_sink(void *ctx, const char *s, size_t n)
{
	fwrite(s, 1, n, ctx);
}

void
allot__json_fputs(FILE *f, const char *s)
{
	allot__json_escape(s, file_sink, f);
}
