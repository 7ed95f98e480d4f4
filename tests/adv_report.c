/* SPDX-License-Identifier: MIT */
/* adv_report.h */
#include "adv_report.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void
adv_report(const char *attack, const char *target, const char *before, bool ok,
    const char *fmt, ...)
{
	char after[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(after, sizeof after, fmt, ap);
	va_end(ap);
	fprintf(stderr, "adversary: %s: %s\n", attack, after);
	const char *path = getenv("ALLOT_ADVERSARY_REPORT");
	if (path == NULL || path[0] == '\0')
		return;
	FILE *f = fopen(path, "a");
	if (f == NULL)
		return;
	fprintf(f,
	    "{\"attack\":\"%s\",\"target\":\"%s\",\"before\":\"%s\","
	    "\"after\":\"%s\",\"ok\":%s}\n",
	    attack, target, before, after, ok ? "true" : "false");
	fclose(f);
}
