/* SPDX-License-Identifier: MIT */
/*
 * The option-table parser (opts.h): getopt_long's arrays built from a
 * table, the parse with one wording of every error for all the binaries,
 * the options file, and the options list of --help in the two layouts
 * the binaries use. getopt_long runs with its own messages off (a
 * leading ':') and in one of two orders: "+" stops at a command
 * (allotctl before its command), "-" hands every argument back where it
 * stands, so that options may follow arguments whatever POSIXLY_CORRECT
 * says.
 */
#include "opts.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define WIDTH 79
#define MAN_INDENT 8
#define DEFAULT_COL 30
/* getopt_long's value for a long option: CODE_LONG + its first row. */
#define CODE_LONG 256

/* ---- numbers ---- */

bool
allot__opts_uint(const char *s, uint64_t min, uint64_t max, uint64_t *ret)
{
	if (s == NULL || *s < '0' || *s > '9')
		return false;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno != 0 || *end != '\0' || v < min || v > max)
		return false;
	*ret = (uint64_t) v;
	return true;
}

bool
allot__opts_double(const char *s, double lo, double hi, double *ret)
{
	if (s == NULL || *s == '\0' || isspace((unsigned char) *s))
		return false;
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno != 0 || *end != '\0' || !isfinite(v) || !(v >= lo) ||
	    !(v <= hi))
		return false;
	*ret = v;
	return true;
}

static int
level(const char *s, int *ret)
{
	static const struct {
		const char *name;
		int level;
	} names[] = {
		{ "emerg", 0 },
		{ "alert", 1 },
		{ "crit", 2 },
		{ "err", 3 },
		{ "error", 3 },
		{ "warning", 4 },
		{ "warn", 4 },
		{ "notice", 5 },
		{ "info", 6 },
		{ "debug", 7 },
	};
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if (strcmp(s, names[i].name) == 0) {
			*ret = names[i].level;
			return 0;
		}
	if (s[0] >= '0' && s[0] <= '7' && s[1] == '\0') {
		*ret = s[0] - '0';
		return 0;
	}
	return -1;
}

/* ---- messages ---- */

static void vsay(const char *prog, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

static void
vsay(const char *prog, const char *fmt, va_list ap)
{
	fprintf(stderr, "%s: ", prog);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
}

int
allot__opts_fail(const allot__opt_use *u, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsay(u->t->prog, fmt, ap);
	va_end(ap);
	return ALLOT__OPTS_USAGE;
}

static void
try_help(const allot__opts *t, const allot__opts_run *run)
{
	if (run != NULL && run->try_help != NULL)
		fprintf(stderr, "%s\n", run->try_help);
	else if (t->try_help != NULL)
		fprintf(stderr, "%s\n", t->try_help);
	else
		fprintf(stderr, "Try '%s --help'.\n", t->prog);
}

int
allot__opts_error(const allot__opts *t, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsay(t->prog, fmt, ap);
	va_end(ap);
	try_help(t, NULL);
	return ALLOT__OPTS_USAGE;
}

/* ---- one option ---- */

static void *
field(void *dst, const allot__opt *o)
{
	return (char *) dst + o->off;
}

static int
store_uint(const allot__opt_use *u, void *dst)
{
	const allot__opt *o = u->o;
	uint64_t top = o->kind == ALLOT__OPT_U32 ? UINT32_MAX :
	    o->kind == ALLOT__OPT_UINT           ? UINT_MAX :
	                                           UINT64_MAX;
	uint64_t max = o->max != 0 && o->max < top ? o->max : top;
	uint64_t v;
	if (!allot__opts_uint(u->arg, o->min, max, &v))
		return allot__opts_fail(u,
		    "%s expects an integer from %" PRIu64 " to %" PRIu64
		    ", not \"%s\"",
		    u->as, o->min, max, u->arg);
	if (o->kind == ALLOT__OPT_U32)
		*(uint32_t *) field(dst, o) = (uint32_t) v;
	else if (o->kind == ALLOT__OPT_UINT)
		*(unsigned *) field(dst, o) = (unsigned) v;
	else
		*(uint64_t *) field(dst, o) = v;
	return ALLOT__OPTS_OK;
}

static int
store_double(const allot__opt_use *u, void *dst)
{
	const allot__opt *o = u->o;
	bool any = o->lo == 0 && o->hi == 0;
	double v;
	if (!allot__opts_double(
	        u->arg, any ? -DBL_MAX : o->lo, any ? DBL_MAX : o->hi, &v)) {
		if (any)
			return allot__opts_fail(u,
			    "%s expects a number, not \"%s\"", u->as, u->arg);
		return allot__opts_fail(u,
		    "%s expects a number from %g to %g, not \"%s\"", u->as,
		    o->lo, o->hi, u->arg);
	}
	*(double *) field(dst, o) = v;
	return ALLOT__OPTS_OK;
}

int
allot__opts_apply(const allot__opts *t, const allot__opt *o, const char *arg,
    const char *as, void *dst)
{
	allot__opt_use u = { .t = t, .o = o, .arg = arg, .as = as };
	switch (o->kind) {
	case ALLOT__OPT_CALL: return o->set(&u, dst);
	case ALLOT__OPT_STR:
		*(const char **) field(dst, o) = arg;
		return ALLOT__OPTS_OK;
	case ALLOT__OPT_TRUE:
	case ALLOT__OPT_FALSE:
		*(bool *) field(dst, o) = o->kind == ALLOT__OPT_TRUE;
		return ALLOT__OPTS_OK;
	case ALLOT__OPT_U32:
	case ALLOT__OPT_UINT:
	case ALLOT__OPT_U64: return store_uint(&u, dst);
	case ALLOT__OPT_DOUBLE: return store_double(&u, dst);
	case ALLOT__OPT_LEVEL:
		if (level(arg, (int *) field(dst, o)) != 0)
			return allot__opts_fail(&u,
			    "%s expects err, warning, notice, info, debug or "
			    "0-7, not \"%s\"",
			    as, arg);
		return ALLOT__OPTS_OK;
	case ALLOT__OPT_HELP:
		if (t->head != NULL)
			fputs(t->head, stdout);
		allot__opts_print(stdout, t, NULL, 0);
		if (t->tail != NULL)
			fputs(t->tail, stdout);
		return ALLOT__OPTS_DONE;
	}
	return ALLOT__OPTS_USAGE;
}

/* ---- the command line ---- */

static bool
accepted(const allot__opt *o, const allot__opts_run *run)
{
	return run == NULL || run->where == 0 || o->where == 0 ||
	    (o->where & run->where) != 0;
}

/* getopt_long's arrays: each long name once, answering CODE_LONG + its
 * first row; each short letter once, answering itself. NULL when out of
 * memory. */
static struct option *
make_getopt(const allot__opts *t, bool in_order, char **ret_shorts)
{
	struct option *lo = calloc(t->n + 1, sizeof *lo);
	char *s = malloc(3 * t->n + 3);
	if (lo == NULL || s == NULL) {
		free(lo);
		free(s);
		return NULL;
	}
	size_t nl = 0, ns = 0;
	s[ns++] = in_order ? '+' : '-';
	s[ns++] = ':';
	for (size_t i = 0; i < t->n; i++) {
		const allot__opt *o = &t->rows[i];
		bool seen = false;
		for (size_t j = 0; j < i && !seen; j++)
			seen = strcmp(t->rows[j].name, o->name) == 0;
		if (!seen)
			lo[nl++] = (struct option) { o->name,
				o->arg != NULL ? required_argument :
				                 no_argument,
				NULL, CODE_LONG + (int) i };
		if (o->short_name == 0 || memchr(s, o->short_name, ns) != NULL)
			continue;
		s[ns++] = (char) o->short_name;
		if (o->arg != NULL)
			s[ns++] = ':';
	}
	s[ns] = '\0';
	*ret_shorts = s;
	return lo;
}

/* The row getopt_long's answer `ch` stands for where `run` parses: a
 * long name stands for every row of that name, a letter for the rows
 * with that short form. NULL with *ret_known set when such a row exists
 * but is accepted elsewhere. */
static const allot__opt *
find(const allot__opts *t, const allot__opts_run *run, int ch, bool *ret_known)
{
	const char *name = ch >= CODE_LONG ? t->rows[ch - CODE_LONG].name :
	                                     NULL;
	*ret_known = false;
	for (size_t i = 0; i < t->n; i++) {
		const allot__opt *o = &t->rows[i];
		bool same = name != NULL ? strcmp(o->name, name) == 0 :
		                           o->short_name == ch;
		if (!same)
			continue;
		*ret_known = true;
		if (accepted(o, run))
			return o;
	}
	return NULL;
}

/* The option as written in `word`, without its "=value". */
static void
as_written(const char *word, char *as, size_t cap)
{
	size_t n = strcspn(word, "=");
	snprintf(as, cap, "%.*s", (int) (n < cap ? n : cap - 1), word);
}

/* getopt_long's ':' (a value missing) or '?' (an unknown option, or a
 * value given to one that takes none), explained. */
static int
bad_option(const allot__opts *t, int ch, const char *word)
{
	char as[64];
	if (optopt >= CODE_LONG || (optopt == 0 && word != NULL))
		as_written(word != NULL ? word : "", as, sizeof as);
	else
		snprintf(as, sizeof as, "-%c", optopt);
	allot__opt_use u = { .t = t, .as = as };
	if (ch == ':')
		return allot__opts_fail(&u, "%s needs a value", as);
	if (optopt >= CODE_LONG)
		return allot__opts_fail(&u, "%s takes no value", as);
	return allot__opts_fail(&u, "unknown option \"%s\"", as);
}

/* One answer of getopt_long: an argument, an error, or an option. */
static int
take(const allot__opts *t, allot__opts_run *run, int ch, const char *word,
    void *dst)
{
	if (ch == 1) {
		if (run == NULL || run->args == NULL) {
			allot__opt_use u = { .t = t };
			return allot__opts_fail(
			    &u, "unexpected argument \"%s\"", optarg);
		}
		run->args[run->nargs++] = optarg;
		return ALLOT__OPTS_OK;
	}
	if (ch == '?' || ch == ':')
		return bad_option(t, ch, word);
	char as[64];
	if (ch >= CODE_LONG)
		snprintf(as, sizeof as, "--%s", t->rows[ch - CODE_LONG].name);
	else
		snprintf(as, sizeof as, "-%c", ch);
	bool known;
	const allot__opt *o = find(t, run, ch, &known);
	if (o == NULL) {
		allot__opt_use u = { .t = t, .as = as };
		if (!known)
			return allot__opts_fail(
			    &u, "unknown option \"%s\"", as);
		if (run != NULL && run->cmd != NULL)
			return allot__opts_fail(
			    &u, "%s does not take \"%s\"", run->cmd, as);
		return allot__opts_fail(
		    &u, "\"%s\" goes after the command", as);
	}
	return allot__opts_apply(
	    t, o, o->arg != NULL ? optarg : NULL, as, dst);
}

int
allot__opts_parse(const allot__opts *t, allot__opts_run *run, int argc,
    char **argv, void *dst)
{
	char *shorts;
	bool in_order = run != NULL && run->in_order;
	struct option *lo = make_getopt(t, in_order, &shorts);
	if (lo == NULL) {
		fprintf(stderr, "%s: out of memory\n", t->prog);
		return ALLOT__OPTS_USAGE;
	}
	if (run != NULL)
		run->nargs = 0;
	int rc = ALLOT__OPTS_OK, ch;
	opterr = 0;
	optind = 0; /* glibc: start afresh, on a new vector too */
	while (rc == ALLOT__OPTS_OK &&
	    (ch = getopt_long(argc, argv, shorts, lo, NULL)) != -1) {
		/* The word getopt_long just read (a long option's, for its
		 * messages). */
		const char *word = optind > 0 && optind <= argc ?
		    argv[optind - 1] :
		    NULL;
		if (word != NULL && strncmp(word, "--", 2) != 0)
			word = NULL;
		rc = take(t, run, ch, word, dst);
	}
	if (rc == ALLOT__OPTS_OK && run != NULL)
		run->next = optind;
	/* After "--", the rest are arguments. */
	for (int i = optind; rc == ALLOT__OPTS_OK && !in_order && i < argc;
	     i++) {
		optarg = argv[i];
		rc = take(t, run, 1, NULL, dst);
	}
	if (rc == ALLOT__OPTS_USAGE)
		try_help(t, run);
	free(lo);
	free(shorts);
	return rc;
}

/* ---- --help ---- */

/* `n` bytes of `line` from column *col, wrapped at spaces onto lines
 * indented by `indent` when it does not fit in WIDTH columns. */
static void
put_line(FILE *f, const char *line, size_t n, int *col, int indent)
{
	if (*col + (int) n <= WIDTH) {
		fwrite(line, 1, n, f);
		*col += (int) n;
		return;
	}
	int start = *col;
	for (const char *w = line, *end = line + n; w < end;) {
		const char *sp = memchr(w, ' ', (size_t) (end - w));
		int wn = (int) ((sp != NULL ? sp : end) - w);
		if (*col > start && *col + 1 + wn > WIDTH) {
			*col = fprintf(f, "\n%*s", indent, "") - 1;
			start = *col;
		} else if (*col > start) {
			*col += fprintf(f, " ");
		}
		*col += fprintf(f, "%.*s", wn, w);
		w += wn + (sp != NULL);
	}
}

/* "(WHAT TEXT)" after the help at column *col: on a line of its own
 * (indented by `indent`) rather than broken when it does not fit. */
static void
put_note(FILE *f, int *col, int indent, const char *what, const char *text)
{
	int n = (int) (strlen(what) + strlen(text)) + 3;
	if (*col > indent && *col + 1 + n > WIDTH)
		*col = fprintf(f, "\n%*s", indent, "") - 1;
	else if (*col > indent)
		*col += fprintf(f, " ");
	*col += fprintf(f, "(%s %s)", what, text);
}

/* A row's help, its default on the last line (moved to a line of its
 * own rather than broken), and its `more`: the first line from column
 * `at` (where the cursor stands), the others indented by `indent`. */
static void
put_help(FILE *f, const allot__opt *o, int at, int indent)
{
	const char *h = o->help;
	size_t hn = strlen(h);
	if (hn > 0 && h[hn - 1] == '\n')
		hn--;
	int col = at;
	for (const char *l = h;;) {
		size_t n = strcspn(l, "\n");
		if (l + n > h + hn)
			n = (size_t) (h + hn - l);
		put_line(f, l, n, &col, indent);
		if (l + n >= h + hn)
			break;
		l += n + 1;
		col = fprintf(f, "\n%*s", indent, "") - 1;
	}
	if (o->dflt != NULL)
		put_note(f, &col, indent, "default", o->dflt);
	if (o->env != NULL)
		put_note(f, &col, indent, "environment", o->env);
	fputc('\n', f);
	if (o->more != NULL)
		fputs(o->more, f);
}

static bool
listed(const allot__opt *o, unsigned shown)
{
	return shown == 0 || (o->shown & shown) != 0;
}

/* "-x, --name ARG", or "--name ARG" */
static int
put_names(FILE *f, const allot__opt *o, const char *no_short)
{
	int n = 0;
	if (o->short_name != 0)
		n += fprintf(f, "-%c, ", o->short_name);
	else
		n += fprintf(f, "%s", no_short);
	n += fprintf(f, "--%s", o->name);
	if (o->arg != NULL)
		n += fprintf(f, " %s", o->arg);
	return n;
}

size_t
allot__opts_print(
    FILE *f, const allot__opts *t, const char *title, unsigned shown)
{
	bool shorts = false;
	for (size_t i = 0; i < t->n; i++)
		shorts |= t->rows[i].short_name != 0 &&
		    listed(&t->rows[i], shown);
	int col = t->col > 0 ? t->col : DEFAULT_COL;
	const char *section = NULL;
	bool joined = false;
	size_t count = 0;
	for (size_t i = 0; i < t->n; i++) {
		const allot__opt *o = &t->rows[i];
		if (!listed(o, shown))
			continue;
		if (count++ == 0 && title != NULL)
			fputs(title, f);
		if (t->style == ALLOT__OPTS_MAN) {
			fputs(joined ? ", " : "    ", f);
			put_names(f, o, "");
			joined = o->help == NULL;
			if (joined)
				continue;
			fprintf(f, "\n%*s", MAN_INDENT, "");
			put_help(f, o, MAN_INDENT, MAN_INDENT);
			continue;
		}
		if (o->section != NULL &&
		    (section == NULL || strcmp(section, o->section) != 0))
			fprintf(f, "\n%s:\n", o->section);
		section = o->section;
		int at = fprintf(f, "  ");
		at += put_names(f, o, shorts ? "    " : "");
		if (o->help == NULL) {
			fputc('\n', f);
			continue;
		}
		/* Two spaces at least between an option and its text (a
		 * reader, and help2roff, tell them apart by that). */
		if (at + 2 > col)
			at = fprintf(f, "\n") - 1;
		at += fprintf(f, "%*s", col - at, "");
		put_help(f, o, at, col);
	}
	return count;
}
