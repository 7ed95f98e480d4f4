/* SPDX-License-Identifier: MIT */
/*
 * What every stage of the quota file loader shares (config_parse.h): the
 * messages, "FILE:LINE:COL: what, expected what" with user strings
 * quoted safely, and the typed readers of scalars. YAML 1.1 and 1.2
 * disagree on what a plain scalar means (yes, 010, .inf), so a scalar is
 * classified here once, strictly: decimal numbers, the two boolean word
 * lists, the null words; anything else is a string. A value of the wrong
 * kind is described as the user wrote it ("the string \"ten\"").
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_parse.h"

#define STR_(x) #x
#define STR(x) STR_(x)

/* ------------------------------------------------------------------ */
/* Messages                                                           */
/* ------------------------------------------------------------------ */

static void vfail(allot__cfg_ctx *c, uint32_t line, uint32_t col,
    const char *fmt, va_list ap) __attribute__((format(printf, 4, 0)));

static void
vfail(allot__cfg_ctx *c, uint32_t line, uint32_t col, const char *fmt,
    va_list ap)
{
	if (c->errbuf == NULL || c->errlen == 0)
		return;
	int n = snprintf(c->errbuf, c->errlen, "%s:%" PRIu32 ":%" PRIu32 ": ",
	    c->name, line, col);
	if (n >= 0 && (size_t) n < c->errlen)
		vsnprintf(c->errbuf + n, c->errlen - (size_t) n, fmt, ap);
}

void
allot__cfg_report_at(
    allot__cfg_ctx *c, uint32_t line, uint32_t col, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfail(c, line, col, fmt, ap);
	va_end(ap);
}

void
allot__cfg_report(
    allot__cfg_ctx *c, const allot__cfg_node *n, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfail(c, n->line, n->col, fmt, ap);
	va_end(ap);
}

int
allot__cfg_nomem(allot__cfg_ctx *c)
{
	if (c->errbuf != NULL && c->errlen > 0)
		snprintf(c->errbuf, c->errlen, "%s: out of memory", c->name);
	return ALLOT_ENOMEM;
}

/* A user string for a message: quoted, control bytes replaced with '?'
 * and cut (on a UTF-8 boundary) after QUOTE_MAX bytes. */
const char *
allot__cfg_quote(char *buf, size_t size, const char *s, size_t len)
{
	size_t n = len, o = 0;
	bool cut = false;
	if (n > QUOTE_MAX) {
		n = QUOTE_MAX;
		while (n > 0 && ((unsigned char) s[n] & 0xc0) == 0x80)
			n--;
		cut = true;
	}
	if (size < QUOTE_MAX + 8)
		return "\"...\"";
	buf[o++] = '"';
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char) s[i];
		buf[o++] = (ch < 0x20 || ch == 0x7f) ? '?' : (char) ch;
	}
	if (cut) {
		memcpy(buf + o, "...", 3);
		o += 3;
	}
	buf[o++] = '"';
	buf[o] = '\0';
	return buf;
}

/* A number as written, unquoted; cut after QUOTE_MAX bytes. Only for
 * scalars that classify() accepted, which are ASCII. */
const char *
allot__cfg_numtext(char *buf, size_t size, const char *s, size_t len)
{
	if (len <= QUOTE_MAX || size < QUOTE_MAX + 4)
		return s;
	snprintf(buf, size, "%.*s...", QUOTE_MAX, s);
	return buf;
}

void
allot__cfg_join(char *buf, size_t size, const char *const *words, size_t n)
{
	size_t o = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < n && o < size; i++) {
		int w = snprintf(
		    buf + o, size - o, "%s%s", i ? ", " : "", words[i]);
		if (w < 0)
			break;
		o += (size_t) w;
	}
}

/* ------------------------------------------------------------------ */
/* Scalar types                                                       */
/* ------------------------------------------------------------------ */

static bool
is_one_of(const char *s, const char *const *words)
{
	for (; *words != NULL; words++)
		if (strcmp(s, *words) == 0)
			return true;
	return false;
}

static const char *const null_words[] = { "", "~", "null", "Null", "NULL",
	NULL };
static const char *const true_words[] = { "true", "True", "TRUE", "yes", "Yes",
	"YES", NULL };
static const char *const false_words[] = { "false", "False", "FALSE", "no",
	"No", "NO", NULL };

bool
allot__cfg_is_null(const allot__cfg_node *n)
{
	return n->type == NODE_SCALAR && n->plain &&
	    is_one_of(n->str, null_words);
}

enum numkind {
	NUM_NO, /* not a number */
	NUM_INT, /* [-+]?[0-9]+ */
	NUM_FLOAT, /* decimal with a point or an exponent */
	NUM_ZERO, /* a leading zero: octal in YAML 1.1, decimal in 1.2 */
	NUM_NAN,
	NUM_INF,
};

static bool
is_digit(char ch)
{
	return ch >= '0' && ch <= '9';
}

static bool
word_ci(const char *s, const char *word)
{
	for (; *word != '\0'; s++, word++)
		if ((*s | 0x20) != *word)
			return false;
	return *s == '\0';
}

/* Classify a plain scalar as a YAML number: decimal only (no hex, octal,
 * underscores or sexagesimal), plus the special NaN and infinities in
 * either YAML (".nan", "-.inf") or C ("nan", "infinity") spelling. */
static enum numkind
classify(const char *s, size_t len)
{
	const char *p = s, *end = s + len;
	if (p < end && (*p == '-' || *p == '+'))
		p++;
	const char *w = (p < end && *p == '.') ? p + 1 : p;
	if (word_ci(w, "nan"))
		return NUM_NAN;
	if (word_ci(w, "inf") || word_ci(w, "infinity"))
		return NUM_INF;
	const char *ip = p;
	while (p < end && is_digit(*p))
		p++;
	size_t nint = (size_t) (p - ip), nfrac = 0;
	bool isfloat = false;
	if (p < end && *p == '.') {
		isfloat = true;
		const char *fp = ++p;
		while (p < end && is_digit(*p))
			p++;
		nfrac = (size_t) (p - fp);
	}
	if (nint + nfrac == 0)
		return NUM_NO;
	if (p < end && (*p == 'e' || *p == 'E')) {
		isfloat = true;
		p++;
		if (p < end && (*p == '-' || *p == '+'))
			p++;
		const char *ep = p;
		while (p < end && is_digit(*p))
			p++;
		if (p == ep)
			return NUM_NO;
	}
	if (p != end)
		return NUM_NO;
	if (nint > 1 && *ip == '0')
		return NUM_ZERO;
	return isfloat ? NUM_FLOAT : NUM_INT;
}

/* What a node is, for "X is <this>, expected Y" messages. */
const char *
allot__cfg_describe(const allot__cfg_node *n, char *buf, size_t size)
{
	char q[QBUF];
	switch (n->type) {
	case NODE_MAP: return "a mapping";
	case NODE_SEQ: return "a sequence";
	case NODE_SCALAR: break;
	}
	if (!n->plain) {
		snprintf(buf, size, "the string %s", QN(q, n));
		return buf;
	}
	if (is_one_of(n->str, null_words))
		return "empty";
	if (is_one_of(n->str, true_words) || is_one_of(n->str, false_words)) {
		snprintf(buf, size, "the boolean %s", n->str);
		return buf;
	}
	switch (classify(n->str, n->len)) {
	case NUM_INT:
	case NUM_FLOAT:
	case NUM_ZERO: snprintf(buf, size, "%s", NUM(q, n)); return buf;
	case NUM_NAN: return "NaN";
	case NUM_INF: return "infinite";
	case NUM_NO: break;
	}
	snprintf(buf, size, "the string %s", QN(q, n));
	return buf;
}

static int
get_number(
    allot__cfg_ctx *c, const allot__cfg_node *n, const char *what, double *ret)
{
	char d[DBUF], q[QBUF];
	enum numkind kind = NUM_NO;
	if (n->type == NODE_SCALAR && n->plain)
		kind = classify(n->str, n->len);
	switch (kind) {
	case NUM_INT:
	case NUM_FLOAT: break;
	case NUM_NAN:
		return FAIL(c, n, "%s is NaN, expected a finite number", what);
	case NUM_INF:
		return FAIL(c, n,
		    "%s is %s, which is infinite, expected a finite number",
		    what, NUM(q, n));
	case NUM_ZERO:
		return FAIL(c, n,
		    "%s is %s, a number with a leading zero (octal in YAML "
		    "1.1), expected a decimal number such as 8 or 0.5",
		    what, NUM(q, n));
	case NUM_NO:
		return FAIL(c, n, "%s is %s, expected a number", what,
		    allot__cfg_describe(n, d, sizeof d));
	}
	char *end;
	double v = strtod_l(n->str, &end, c->cloc);
	if (*end != '\0' || !isfinite(v))
		return FAIL(c, n,
		    "%s is %s, which overflows, expected a finite number",
		    what, NUM(q, n));
	*ret = v;
	return ALLOT_OK;
}

/* A number above 0 within [min, max]. The messages say what was
 * expected: `positive` ("a rate > 0 tokens/s") when it is not above 0,
 * `range` when it is out of range. */
static int
get_positive(allot__cfg_ctx *c, const allot__cfg_node *n, const char *what,
    const char *positive, double min, double max, const char *range,
    double *ret)
{
	char q[QBUF];
	double v = 0;
	int rc = get_number(c, n, what, &v);
	if (rc != ALLOT_OK)
		return rc;
	if (v <= 0)
		return FAIL(
		    c, n, "%s is %s, expected %s", what, NUM(q, n), positive);
	if (v < min || v > max)
		return FAIL(c, n, "%s is %s, out of range, expected %s", what,
		    NUM(q, n), range);
	*ret = v;
	return ALLOT_OK;
}

int
allot__cfg_get_rate(
    allot__cfg_ctx *c, const allot__cfg_node *n, const char *what, double *ret)
{
	return get_positive(c, n, what, "a rate > 0 tokens/s", ALLOT__RATE_MIN,
	    ALLOT__RATE_MAX,
	    "a rate in [" STR(ALLOT__RATE_MIN) ", " STR(
	        ALLOT__RATE_MAX) "] tokens/s",
	    ret);
}

static const char *
unit_word(uint32_t unit_s)
{
	switch (unit_s) {
	case 60: return "minute";
	case 3600: return "hour";
	case 86400: return "day";
	default: return "second";
	}
}

int
allot__cfg_get_rate_per(allot__cfg_ctx *c, const allot__cfg_node *n,
    const char *what, uint32_t unit_s, double *ret)
{
	char q[QBUF], pos[48];
	if (unit_s <= 1)
		return allot__cfg_get_rate(c, n, what, ret);
	double v = 0;
	int rc = get_number(c, n, what, &v);
	if (rc != ALLOT_OK)
		return rc;
	if (v <= 0) {
		snprintf(pos, sizeof pos, "a rate > 0 tokens/%s",
		    unit_word(unit_s));
		return FAIL(
		    c, n, "%s is %s, expected %s", what, NUM(q, n), pos);
	}
	double r = v / unit_s;
	if (!(r >= ALLOT__RATE_MIN && r <= ALLOT__RATE_MAX))
		return FAIL(c, n,
		    "%s is %s, which is %.3g tokens/s, out of range, expected "
		    "a rate in [" STR(ALLOT__RATE_MIN) ", " STR(
		        ALLOT__RATE_MAX) "] tokens/s",
		    what, NUM(q, n), r);
	*ret = r;
	return ALLOT_OK;
}

int
allot__cfg_get_amount(
    allot__cfg_ctx *c, const allot__cfg_node *n, const char *what, double *ret)
{
	char q[QBUF];
	double v = 0;
	int rc = get_number(c, n, what, &v);
	if (rc != ALLOT_OK)
		return rc;
	if (v < 0 || v > ALLOT__RATE_MAX * 86400.0)
		return FAIL(c, n,
		    "%s is %s, out of range, expected a number of tokens >= 0",
		    what, NUM(q, n));
	*ret = v;
	return ALLOT_OK;
}

int
allot__cfg_get_fraction(
    allot__cfg_ctx *c, const allot__cfg_node *n, const char *what, double *ret)
{
	char q[QBUF];
	double v = 0;
	int rc = get_number(c, n, what, &v);
	if (rc != ALLOT_OK)
		return rc;
	if (!(v >= 0 && v <= 1))
		return FAIL(c, n,
		    "%s is %s, out of range, expected a number "
		    "from 0 to 1",
		    what, NUM(q, n));
	*ret = v;
	return ALLOT_OK;
}

int
allot__cfg_get_burst(
    allot__cfg_ctx *c, const allot__cfg_node *n, const char *what, double *ret)
{
	return get_positive(c, n, what, "a burst > 0 tokens", 0,
	    ALLOT__BURST_MAX,
	    "a burst of at most " STR(ALLOT__BURST_MAX) " tokens", ret);
}

int
allot__cfg_get_weight(allot__cfg_ctx *c, const allot__cfg_node *n,
    const char *what, uint32_t *ret)
{
	char d[DBUF];
	enum numkind kind = NUM_NO;
	if (n->type == NODE_SCALAR && n->plain)
		kind = classify(n->str, n->len);
	if (kind != NUM_INT)
		goto bad;
	const char *s = n->str;
	if (*s == '-') {
		/* "-0" is zero; any other negative is out of range. */
		while (*++s == '0')
			;
		if (*s != '\0')
			goto bad;
	} else if (*s == '+') {
		s++;
	}
	errno = 0;
	unsigned long long v = strtoull(s, NULL, 10);
	if (errno != 0 || v < 1 || v > ALLOT__WEIGHT_MAX)
		goto bad;
	*ret = (uint32_t) v;
	return ALLOT_OK;
bad:
	return FAIL(c, n,
	    "%s is %s, expected a whole number of tokens in [1, %u]", what,
	    allot__cfg_describe(n, d, sizeof d), ALLOT__WEIGHT_MAX);
}

int
allot__cfg_get_bool(
    allot__cfg_ctx *c, const allot__cfg_node *n, const char *what, bool *ret)
{
	char d[DBUF];
	if (n->type == NODE_SCALAR && n->plain) {
		if (is_one_of(n->str, true_words)) {
			*ret = true;
			return ALLOT_OK;
		}
		if (is_one_of(n->str, false_words)) {
			*ret = false;
			return ALLOT_OK;
		}
	}
	return FAIL(c, n, "%s is %s, expected true or false", what,
	    allot__cfg_describe(n, d, sizeof d));
}

/* A non-empty string of at most `max` bytes; `*ret` points into `n`. */
int
allot__cfg_get_string(allot__cfg_ctx *c, const allot__cfg_node *n,
    const char *what, size_t max, const char *expect, const char **ret)
{
	char d[DBUF], q[QBUF];
	if (n->type != NODE_SCALAR)
		return FAIL(c, n, "%s is %s, expected %s", what,
		    allot__cfg_describe(n, d, sizeof d), expect);
	if (n->len == 0 || allot__cfg_is_null(n))
		return FAIL(c, n, "%s is empty, expected %s", what, expect);
	if (strlen(n->str) != n->len)
		return FAIL(c, n, "%s %s contains a NUL byte, expected %s",
		    what, QN(q, n), expect);
	if (n->len > max)
		return FAIL(c, n,
		    "%s %s is %zu bytes long, expected %s of at most %zu "
		    "bytes",
		    what, QN(q, n), n->len, expect, max);
	*ret = n->str;
	return ALLOT_OK;
}
