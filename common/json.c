/* SPDX-License-Identifier: MIT */
/* JSON strings to a stdio stream (json.h). */
#include "json.h"

void
allot__json_fputs(FILE *f, const char *s)
{
	fputc('"', f);
	for (; s != NULL && *s != '\0'; s++) {
		unsigned char c = (unsigned char) *s;
		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20 || c == 0x7f)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}
