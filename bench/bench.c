/* SPDX-License-Identifier: MIT */
/*
 * The shared benchmark helpers declared in bench.h: option parsing,
 * CLOCK_MONOTONIC batch timing, medians, failure reporting, the text
 * buffer and random generator, and the table/JSON report. Nothing here is
 * on a measured path except bench_now_ns(), read once per batch.
 */
#include "bench.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "prng.h"

volatile uint64_t bench_sink;

static _Noreturn void
usage(const char *suite, int status)
{
	FILE *f = status == 0 ? stdout : stderr;
	fprintf(f,
	    "usage: bench-%s [--json] [--rounds N] [--iters N] [--quiet] "
	    "[--only S]\n"
	    "  --json      print one flat JSON object of figures\n"
	    "  --rounds N  repetitions of every measurement (median "
	    "reported; default 5)\n"
	    "  --iters N   decisions per round and thread in ns-scale "
	    "loops\n"
	    "  --quiet     no progress on stderr\n"
	    "  --only L    run only the measurements named in the comma-"
	    "separated\n"
	    "              list L (\"x*\" matches names starting with x); "
	    "for\n"
	    "              profiling, the other figures are null\n",
	    suite);
	exit(status);
}

static uint64_t
parse_u64(const char *suite, const char *opt, const char *s)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v == 0) {
		fprintf(stderr,
		    "bench-%s: %s needs a positive integer, "
		    "not '%s'\n",
		    suite, opt, s);
		usage(suite, 2);
	}
	return v;
}

void
bench_parse_args(int argc, char **argv, const char *suite,
    uint64_t default_iters, bench_opts *ret)
{
	bench_opts o = {
		.suite = suite,
		.rounds = 5,
		.iters = default_iters,
	};
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--json") == 0) {
			o.json = true;
		} else if (strcmp(a, "--quiet") == 0) {
			o.quiet = true;
		} else if (strcmp(a, "--rounds") == 0 && i + 1 < argc) {
			uint64_t r = parse_u64(suite, a, argv[++i]);
			if (r > BENCH_MAX_ROUNDS) {
				fprintf(stderr,
				    "bench-%s: at most %d "
				    "rounds\n",
				    suite, BENCH_MAX_ROUNDS);
				usage(suite, 2);
			}
			o.rounds = (unsigned) r;
		} else if (strcmp(a, "--iters") == 0 && i + 1 < argc) {
			o.iters = parse_u64(suite, a, argv[++i]);
		} else if (strcmp(a, "--only") == 0 && i + 1 < argc) {
			o.only = argv[++i];
		} else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			usage(suite, 0);
		} else {
			fprintf(stderr, "bench-%s: unknown argument '%s'\n",
			    suite, a);
			usage(suite, 2);
		}
	}
	*ret = o;
}

bool
bench_selected(const bench_opts *o, const char *name)
{
	if (o->only == NULL)
		return true;
	/* A comma-separated list of names; "x*" matches every name that
	 * starts with x. */
	size_t nlen = strlen(name);
	for (const char *p = o->only; *p != '\0';) {
		size_t len = strcspn(p, ",");
		if (len > 0 && p[len - 1] == '*') {
			if (len - 1 <= nlen && strncmp(p, name, len - 1) == 0)
				return true;
		} else if (len == nlen && strncmp(p, name, len) == 0) {
			return true;
		}
		p += len;
		if (*p == ',')
			p++;
	}
	return false;
}

uint64_t
bench_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *) a, y = *(const double *) b;
	return (x > y) - (x < y);
}

double
bench_median(const double *v, size_t n)
{
	double tmp[BENCH_MAX_ROUNDS];
	if (n == 0 || n > BENCH_MAX_ROUNDS)
		return NAN;
	for (size_t i = 0; i < n; i++)
		if (isnan(v[i]))
			return NAN;
	memcpy(tmp, v, n * sizeof *v);
	qsort(tmp, n, sizeof *tmp, cmp_double);
	return n % 2 ? tmp[n / 2] : (tmp[n / 2 - 1] + tmp[n / 2]) / 2;
}

void
bench_progress(const bench_opts *o, const char *fmt, ...)
{
	if (o->quiet)
		return;
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "bench-%s: ", o->suite);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

void
bench_fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("bench: FAIL: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

void
bench_rng_seed(bench_rng *r, uint64_t seed)
{
	r->s = seed ? seed : ALLOT__GOLDEN64;
}

uint64_t
bench_rng_next(bench_rng *r)
{
	return allot__xorshift64s(&r->s);
}

uint32_t
bench_rng_below(bench_rng *r, uint32_t n)
{
	/* Multiply-shift: bias is below 2^-32 for the sizes used here. */
	return (uint32_t) (((bench_rng_next(r) >> 32) * (uint64_t) n) >> 32);
}

void
bench_buf_printf(bench_buf *b, const char *fmt, ...)
{
	for (;;) {
		size_t room = b->cap - b->len;
		va_list ap;
		va_start(ap, fmt);
		int n = vsnprintf(b->p ? b->p + b->len : NULL, room, fmt, ap);
		va_end(ap);
		if (n < 0)
			bench_fail("bench_buf_printf: bad format");
		if ((size_t) n < room) {
			b->len += (size_t) n;
			return;
		}
		size_t cap = b->cap ? b->cap * 2 : 4096;
		while (cap - b->len <= (size_t) n)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (p == NULL)
			bench_fail("out of memory");
		b->p = p;
		b->cap = cap;
	}
}

void
bench_buf_free(bench_buf *b)
{
	free(b->p);
	*b = (bench_buf) { 0 };
}

void
bench_cpu_mark(bench_cpu *ret)
{
	*ret = (bench_cpu) { 0 };
	FILE *f = fopen("/proc/stat", "r");
	if (f != NULL) {
		unsigned long long v[8] = { 0 };
		if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu",
		        &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
		        &v[7]) == 8) {
			double hz = (double) sysconf(_SC_CLK_TCK);
			/* user nice system idle iowait irq softirq steal */
			double busy = (double) (v[0] + v[1] + v[2] + v[5] +
			    v[6] + v[7]);
			double idle = (double) (v[3] + v[4]);
			ret->busy_s = busy / hz;
			ret->total_s = (busy + idle) / hz;
			ret->ok = true;
		}
		fclose(f);
	}
	struct rusage ru;
	int who[2] = { RUSAGE_SELF, RUSAGE_CHILDREN };
	for (int i = 0; i < 2; i++) {
		if (getrusage(who[i], &ru) != 0)
			continue;
		ret->self_s += (double) ru.ru_utime.tv_sec +
		    (double) ru.ru_utime.tv_usec / 1e6 +
		    (double) ru.ru_stime.tv_sec +
		    (double) ru.ru_stime.tv_usec / 1e6;
	}
}

double
bench_cpu_others_pct(const bench_cpu *a, const bench_cpu *b)
{
	double total = b->total_s - a->total_s;
	if (!a->ok || !b->ok || total <= 0)
		return NAN;
	double others = (b->busy_s - a->busy_s) - (b->self_s - a->self_s);
	return others > 0 ? 100.0 * others / total : 0.0;
}

static const char *
verdict(const bench_figure *f)
{
	if (f->cmp == BENCH_NO_TARGET)
		return "";
	if (isnan(f->value))
		return "n/a";
	bool ok = f->cmp == BENCH_AT_MOST ? f->value <= f->target :
	                                    f->value >= f->target;
	return ok ? "PASS" : "MISS";
}

void
bench_report(
    const bench_opts *o, const char *header, const bench_figure *f, size_t n)
{
	if (o->json) {
		fputc('{', stdout);
		for (size_t i = 0; i < n; i++) {
			printf("%s\"%s\": ", i ? ", " : "", f[i].name);
			if (isnan(f[i].value) || isinf(f[i].value))
				fputs("null", stdout);
			else
				printf("%.*f", f[i].decimals, f[i].value);
		}
		fputs("}\n", stdout);
		fflush(stdout);
		return;
	}

	printf("%s\n\n", header);
	printf("  %-34s %12s %-3s  %-12s %-4s  %s\n", "figure", "value", "",
	    "target", "", "meaning");
	for (size_t i = 0; i < n; i++) {
		char val[32], tgt[32] = "";
		if (isnan(f[i].value))
			snprintf(val, sizeof val, "n/a");
		else
			snprintf(val, sizeof val, "%.*f", f[i].decimals,
			    f[i].value);
		if (f[i].cmp != BENCH_NO_TARGET)
			snprintf(tgt, sizeof tgt, "%s %.*g",
			    f[i].cmp == BENCH_AT_MOST ? "<=" : ">=",
			    f[i].target < 100 ? 3 : 6, f[i].target);
		printf("  %-34s %12s %-3s  %-12s %-4s  %s\n", f[i].name, val,
		    f[i].unit, tgt, verdict(&f[i]), f[i].what);
	}
	putchar('\n');
	fflush(stdout);
}
