/* SPDX-License-Identifier: MIT */
/*
 * allotctl's output helpers: allocation that ends the program when memory
 * runs out (a command-line tool has nothing better to do), the
 * "allotctl: ..." error line, numbers written as people read them (400,
 * 133.3, 2.5, 0.125, "33%", UTC times), strict number parsing for option
 * values, and tables printed in aligned columns. No I/O other than the
 * stream a caller passes.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "allotctl.h"

void
ctl_die_oom(void)
{
	fputs("allotctl: out of memory\n", stderr);
	exit(EXIT_FAIL);
}

void *
ctl_calloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);
	if (p == NULL)
		ctl_die_oom();
	return p;
}

void *
ctl_realloc(void *p, size_t size)
{
	p = realloc(p, size ? size : 1);
	if (p == NULL)
		ctl_die_oom();
	return p;
}

char *
ctl_strdup(const char *s)
{
	char *d = strdup(s);
	if (d == NULL)
		ctl_die_oom();
	return d;
}

char *
ctl_asprintf(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char *s = NULL;
	int n = vasprintf(&s, fmt, ap);
	va_end(ap);
	if (n < 0)
		ctl_die_oom();
	return s;
}

void
ctl_vfail(const char *fmt, va_list ap)
{
	fputs("allotctl: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
}

void
ctl_fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	ctl_vfail(fmt, ap);
	va_end(ap);
}

/* strerror() in lower case, as it reads in the middle of a sentence. */
const char *
ctl_errstr(int e)
{
	static char buf[128];
	snprintf(buf, sizeof buf, "%s", strerror(e));
	if (buf[0] != '\0' && isupper((unsigned char) buf[0]) &&
	    !isupper((unsigned char) buf[1]))
		buf[0] = (char) tolower((unsigned char) buf[0]);
	return buf;
}

/* Drop trailing zeros after a decimal point ("400.0" -> "400"). */
static char *
trim_zeros(char *s)
{
	char *dot = strchr(s, '.');
	if (dot != NULL) {
		char *e = s + strlen(s) - 1;
		while (e > dot && *e == '0')
			*e-- = '\0';
		if (e == dot)
			*e = '\0';
	}
	return s;
}

/* A number as people read it: one decimal from 100 up, two from 1,
 * three significant digits below, trailing zeros dropped (400, 133.3,
 * 2.5, 0.125). */
char *
ctl_num(double v)
{
	if (!isfinite(v))
		return ctl_strdup("-");
	double a = fabs(v);
	char *s = a >= 100 ? ctl_asprintf("%.1f", v) :
	    a >= 1         ? ctl_asprintf("%.2f", v) :
	                     ctl_asprintf("%.3g", v);
	trim_zeros(s);
	if (strcmp(s, "-0") == 0)
		strcpy(s, "0");
	return s;
}

/* A ratio with up to three decimals, trailing zeros dropped (1.125,
 * 2.1, 3). */
char *
ctl_ratio(double v)
{
	return trim_zeros(ctl_asprintf("%.3f", v));
}

char *
ctl_pct(double part, double whole)
{
	if (!(whole > 0))
		return ctl_strdup("-");
	return ctl_asprintf("%.0f%%", 100.0 * part / whole);
}

char *
ctl_utc_ms(int64_t ms)
{
	if (ms <= 0)
		return ctl_strdup("-");
	time_t t = (time_t) (ms / 1000);
	struct tm tm;
	if (gmtime_r(&t, &tm) == NULL)
		return ctl_strdup("-");
	char buf[64];
	strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
	return ctl_strdup(buf);
}

bool
ctl_parse_int(const char *s, long min, long max, long *ret)
{
	uint64_t v;
	if (min < 0 ||
	    !allot__opts_uint(s, (uint64_t) min, (uint64_t) max, &v))
		return false;
	*ret = (long) v;
	return true;
}

void
ctl_table_init(ctl_table *t, const char *align)
{
	memset(t, 0, sizeof *t);
	t->ncols = strlen(align);
	t->align = align;
}

/* Room for one more row. */
static char **
next_row(ctl_table *t)
{
	if (t->nrows == t->cap) {
		t->cap = t->cap ? t->cap * 2 : 16;
		t->cells = ctl_realloc(
		    t->cells, t->cap * t->ncols * sizeof *t->cells);
	}
	return &t->cells[t->nrows++ * t->ncols];
}

/* Append a row of `ncols` strings; the table takes ownership. */
void
ctl_table_row(ctl_table *t, ...)
{
	char **row = next_row(t);
	va_list ap;
	va_start(ap, t);
	for (size_t c = 0; c < t->ncols; c++) {
		char *s = va_arg(ap, char *);
		row[c] = s ? s : ctl_strdup("");
	}
	va_end(ap);
}

void
ctl_table_row_v(ctl_table *t, char **cells)
{
	char **row = next_row(t);
	for (size_t c = 0; c < t->ncols; c++)
		row[c] = cells[c] ? cells[c] : ctl_strdup("");
}

/* The header is row 0. */
void
ctl_table_print(const ctl_table *t, FILE *f)
{
	size_t *w = ctl_calloc(t->ncols, sizeof *w);
	for (size_t r = 0; r < t->nrows; r++)
		for (size_t c = 0; c < t->ncols; c++) {
			size_t l = strlen(t->cells[r * t->ncols + c]);
			if (l > w[c])
				w[c] = l;
		}
	for (size_t r = 0; r < t->nrows; r++) {
		for (size_t c = 0; c < t->ncols; c++) {
			const char *s = t->cells[r * t->ncols + c];
			bool last = c + 1 == t->ncols;
			if (t->align[c] == 'r')
				fprintf(f, "%*s", (int) w[c], s);
			else if (last)
				fputs(s, f);
			else
				fprintf(f, "%-*s", (int) w[c], s);
			if (!last)
				fputs("  ", f);
		}
		fputc('\n', f);
	}
	free(w);
}

void
ctl_table_free(ctl_table *t)
{
	for (size_t i = 0; i < t->nrows * t->ncols; i++)
		free(t->cells[i]);
	free(t->cells);
	memset(t, 0, sizeof *t);
}
