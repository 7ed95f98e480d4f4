/* SPDX-License-Identifier: MIT */
/*
 * The quota file loader. libyaml's event parser builds a small tree of
 * scalars, sequences and mappings (anchors, aliases, tags and second
 * documents are refused while reading); a schema walk then checks every
 * key and value against docs/configuration.md and fills an allot_config.
 * Checks that span sections (priority classes, duplicate identities,
 * bursts against endpoint weights) run after the walk, because YAML
 * mappings are unordered and endpoint_weights may follow callers. Every
 * error names the offending node as "FILE:LINE:COL: what, expected what";
 * on any error the half-built config is freed and nothing is returned.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

#include "hash.h"

#define STR_(x) #x
#define STR(x) STR_(x)

/* The schema nests five levels; anything much deeper is hostile. */
#define MAX_DEPTH 32
/* Files above this size are refused before parsing. */
#define MAX_FILE_BYTES (64u << 20)
/* Bytes of a user string quoted back in a message. */
#define QUOTE_MAX 128

/* ------------------------------------------------------------------ */
/* The document tree                                                  */
/* ------------------------------------------------------------------ */

enum ntype { NODE_SCALAR, NODE_MAP, NODE_SEQ };

struct node {
	enum ntype type;
	uint32_t line, col; /* 1-based start of the node */
	bool plain; /* unquoted scalar: YAML resolves its type */
	char *str; /* scalars: the value, NUL-terminated */
	size_t len;
	struct node **kids; /* maps: key, value, key, value, ... */
	size_t nkids, cap;
};

static void
node_free(struct node *n)
{
	if (n == NULL)
		return;
	for (size_t i = 0; i < n->nkids; i++)
		node_free(n->kids[i]);
	free(n->kids);
	free(n->str);
	free(n);
}

static int
node_add(struct node *parent, struct node *kid)
{
	if (parent->nkids == parent->cap) {
		size_t cap = parent->cap ? parent->cap * 2 : 4;
		struct node **k = realloc(parent->kids, cap * sizeof *k);
		if (k == NULL)
			return ALLOT_ENOMEM;
		parent->kids = k;
		parent->cap = cap;
	}
	parent->kids[parent->nkids++] = kid;
	return ALLOT_OK;
}

/* ------------------------------------------------------------------ */
/* Parse state and messages                                           */
/* ------------------------------------------------------------------ */

/* Side data for one quota, kept only while loading: the nodes that later
 * checks point their messages at. */
struct qmeta {
	const struct node *ident;
	const struct node *burst;
	const struct node *prio;
};

struct ctx {
	const char *name;
	char *errbuf;
	size_t errlen;
	locale_t cloc; /* "C" numeric locale for strtod_l */
	allot_config *cfg;
	struct qmeta def; /* quotas.default */
	struct qmeta *meta; /* quotas.callers, cfg->ncallers long */
	const allot__quota **byid; /* callers sorted by identity */
};

static void vfail(struct ctx *c, uint32_t line, uint32_t col, const char *fmt,
    va_list ap) __attribute__((format(printf, 4, 0)));

static void
vfail(struct ctx *c, uint32_t line, uint32_t col, const char *fmt, va_list ap)
{
	if (c->errbuf == NULL || c->errlen == 0)
		return;
	int n = snprintf(c->errbuf, c->errlen, "%s:%" PRIu32 ":%" PRIu32 ": ",
	    c->name, line, col);
	if (n >= 0 && (size_t) n < c->errlen)
		vsnprintf(c->errbuf + n, c->errlen - (size_t) n, fmt, ap);
}

static void report_at(struct ctx *c, uint32_t line, uint32_t col,
    const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void
report_at(struct ctx *c, uint32_t line, uint32_t col, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfail(c, line, col, fmt, ap);
	va_end(ap);
}

static void report(struct ctx *c, const struct node *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void
report(struct ctx *c, const struct node *n, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vfail(c, n->line, n->col, fmt, ap);
	va_end(ap);
}

/* Report a bad file at line:col or at node `n`, and evaluate to
 * ALLOT_ECONFIG. Macros, so that the constant is visible at each call
 * site (to readers and to static analysers). */
#define FAIL_AT(...) (report_at(__VA_ARGS__), ALLOT_ECONFIG)
#define FAIL(...) (report(__VA_ARGS__), ALLOT_ECONFIG)

static int
nomem(struct ctx *c)
{
	if (c->errbuf != NULL && c->errlen > 0)
		snprintf(c->errbuf, c->errlen, "%s: out of memory", c->name);
	return ALLOT_ENOMEM;
}

/* A user string for a message: quoted, control bytes replaced with '?'
 * and cut (on a UTF-8 boundary) after QUOTE_MAX bytes. */
static const char *
quote(char *buf, size_t size, const char *s, size_t len)
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
static const char *
numtext(char *buf, size_t size, const char *s, size_t len)
{
	if (len <= QUOTE_MAX || size < QUOTE_MAX + 4)
		return s;
	snprintf(buf, size, "%.*s...", QUOTE_MAX, s);
	return buf;
}

#define QBUF (QUOTE_MAX + 8)
#define Q(buf, s) quote((buf), sizeof(buf), (s), strlen(s))
#define QN(buf, n) quote((buf), sizeof(buf), (n)->str, (n)->len)
#define NUM(buf, n) numtext((buf), sizeof(buf), (n)->str, (n)->len)

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

static bool
is_null(const struct node *n)
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
static const char *
describe(const struct node *n, char *buf, size_t size)
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

#define DBUF (QBUF + 32)

static int
get_number(struct ctx *c, const struct node *n, const char *what, double *ret)
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
		    describe(n, d, sizeof d));
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

static int
get_rate(struct ctx *c, const struct node *n, const char *what, double *ret)
{
	char q[QBUF];
	double v = 0;
	int rc = get_number(c, n, what, &v);
	if (rc != ALLOT_OK)
		return rc;
	if (v <= 0)
		return FAIL(c, n, "%s is %s, expected a rate > 0 tokens/s",
		    what, NUM(q, n));
	if (v < ALLOT__RATE_MIN || v > ALLOT__RATE_MAX)
		return FAIL(c, n,
		    "%s is %s, out of range, expected a rate in [" STR(
		        ALLOT__RATE_MIN) ", " STR(ALLOT__RATE_MAX) "] "
		                                                   "tokens/s",
		    what, NUM(q, n));
	*ret = v;
	return ALLOT_OK;
}

static int
get_burst(struct ctx *c, const struct node *n, const char *what, double *ret)
{
	char q[QBUF];
	double v = 0;
	int rc = get_number(c, n, what, &v);
	if (rc != ALLOT_OK)
		return rc;
	if (v <= 0)
		return FAIL(c, n, "%s is %s, expected a burst > 0 tokens",
		    what, NUM(q, n));
	if (v > ALLOT__BURST_MAX)
		return FAIL(c, n,
		    "%s is %s, out of range, expected a burst of at most " STR(
		        ALLOT__BURST_MAX) " tokens",
		    what, NUM(q, n));
	*ret = v;
	return ALLOT_OK;
}

static int
get_weight(
    struct ctx *c, const struct node *n, const char *what, uint32_t *ret)
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
	    describe(n, d, sizeof d), ALLOT__WEIGHT_MAX);
}

static int
get_bool(struct ctx *c, const struct node *n, const char *what, bool *ret)
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
	    describe(n, d, sizeof d));
}

/* A non-empty string of at most `max` bytes; `*ret` points into `n`. */
static int
get_string(struct ctx *c, const struct node *n, const char *what, size_t max,
    const char *expect, const char **ret)
{
	char d[DBUF], q[QBUF];
	if (n->type != NODE_SCALAR)
		return FAIL(c, n, "%s is %s, expected %s", what,
		    describe(n, d, sizeof d), expect);
	if (n->len == 0 || is_null(n))
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

/* ------------------------------------------------------------------ */
/* Reading YAML into a tree                                           */
/* ------------------------------------------------------------------ */

static int
yaml_fail(struct ctx *c, const yaml_parser_t *p, const char *text, size_t len)
{
	uint32_t line = (uint32_t) p->problem_mark.line + 1;
	uint32_t col = (uint32_t) p->problem_mark.column + 1;
	if (p->error == YAML_MEMORY_ERROR)
		return nomem(c);
	if (p->error == YAML_READER_ERROR) {
		/* The reader reports a byte offset, not a mark. */
		size_t off = p->problem_offset < len ? p->problem_offset : len;
		line = 1;
		col = 1;
		for (size_t i = 0; i < off; i++) {
			if (text[i] == '\n') {
				line++;
				col = 1;
			} else if (((unsigned char) text[i] & 0xc0) != 0x80) {
				col++;
			}
		}
		if (p->problem_value != -1)
			return FAIL_AT(c, line, col,
			    "invalid YAML: %s (byte 0x%02x), expected UTF-8 "
			    "text",
			    p->problem, (unsigned) p->problem_value & 0xff);
		return FAIL_AT(c, line, col,
		    "invalid YAML: %s, expected UTF-8 text", p->problem);
	}
	if (p->context != NULL)
		return FAIL_AT(c, line, col,
		    "invalid YAML: %s (%s at line %zu, column %zu), expected "
		    "valid YAML",
		    p->problem, p->context, p->context_mark.line + 1,
		    p->context_mark.column + 1);
	return FAIL_AT(c, line, col, "invalid YAML: %s, expected valid YAML",
	    p->problem ? p->problem : "unknown error");
}

/* Anchors, aliases and tags would let one file mean different things to
 * different YAML readers (and aliases let a small file expand hugely):
 * the quota file is plain data, so they are refused. */
static int
check_props(struct ctx *c, const yaml_event_t *ev, const yaml_char_t *anchor,
    const yaml_char_t *tag)
{
	uint32_t line = (uint32_t) ev->start_mark.line + 1;
	uint32_t col = (uint32_t) ev->start_mark.column + 1;
	char q[QBUF];
	if (anchor != NULL)
		return FAIL_AT(c, line, col,
		    "anchor %s: anchors and aliases are not supported, "
		    "expected plain values (write each value out)",
		    Q(q, (const char *) anchor));
	if (tag != NULL)
		return FAIL_AT(c, line, col,
		    "tag %s: tags are not supported, expected an untagged "
		    "value (quote strings instead)",
		    Q(q, (const char *) tag));
	return ALLOT_OK;
}

static int
read_tree(struct ctx *c, const char *text, size_t len, struct node **ret)
{
	yaml_parser_t p;
	yaml_event_t ev;
	struct node *stack[MAX_DEPTH];
	size_t depth = 0, ndocs = 0;
	struct node *root = NULL;
	bool done = false;
	int rc = ALLOT_OK;
	char q[QBUF];

	if (!yaml_parser_initialize(&p))
		return nomem(c);
	yaml_parser_set_input_string(&p, (const unsigned char *) text, len);
	while (!done && rc == ALLOT_OK) {
		if (!yaml_parser_parse(&p, &ev)) {
			rc = yaml_fail(c, &p, text, len);
			break;
		}
		uint32_t line = (uint32_t) ev.start_mark.line + 1;
		uint32_t col = (uint32_t) ev.start_mark.column + 1;
		struct node *n = NULL;
		switch (ev.type) {
		case YAML_STREAM_END_EVENT: done = true; break;
		case YAML_DOCUMENT_START_EVENT:
			if (ndocs++ > 0)
				rc = FAIL_AT(c, line, col,
				    "a second YAML document, expected exactly "
				    "one document per quota file");
			break;
		case YAML_ALIAS_EVENT:
			rc = FAIL_AT(c, line, col,
			    "alias %s: anchors and aliases are not supported, "
			    "expected plain values (write each value out)",
			    Q(q, (const char *) ev.data.alias.anchor));
			break;
		case YAML_SCALAR_EVENT:
			rc = check_props(
			    c, &ev, ev.data.scalar.anchor, ev.data.scalar.tag);
			if (rc != ALLOT_OK)
				break;
			n = calloc(1, sizeof *n);
			if (n == NULL ||
			    (n->str = malloc(ev.data.scalar.length + 1)) ==
			        NULL) {
				free(n);
				n = NULL;
				rc = nomem(c);
				break;
			}
			n->type = NODE_SCALAR;
			n->len = ev.data.scalar.length;
			memcpy(n->str, ev.data.scalar.value, n->len);
			n->str[n->len] = '\0';
			n->plain = ev.data.scalar.style ==
			    YAML_PLAIN_SCALAR_STYLE;
			break;
		case YAML_SEQUENCE_START_EVENT:
		case YAML_MAPPING_START_EVENT:
			if (ev.type == YAML_SEQUENCE_START_EVENT)
				rc = check_props(c, &ev,
				    ev.data.sequence_start.anchor,
				    ev.data.sequence_start.tag);
			else
				rc = check_props(c, &ev,
				    ev.data.mapping_start.anchor,
				    ev.data.mapping_start.tag);
			if (rc != ALLOT_OK)
				break;
			if (depth == MAX_DEPTH) {
				rc = FAIL_AT(c, line, col,
				    "nesting deeper than %d levels, expected "
				    "the quota file layout",
				    MAX_DEPTH);
				break;
			}
			n = calloc(1, sizeof *n);
			if (n == NULL) {
				rc = nomem(c);
				break;
			}
			n->type = ev.type == YAML_SEQUENCE_START_EVENT ?
			    NODE_SEQ :
			    NODE_MAP;
			break;
		case YAML_SEQUENCE_END_EVENT:
		case YAML_MAPPING_END_EVENT:
			if (depth > 0) /* libyaml balances them */
				depth--;
			break;
		default: break;
		}
		yaml_event_delete(&ev);
		if (n == NULL)
			continue;
		n->line = line;
		n->col = col;
		struct node *parent = depth > 0 ? stack[depth - 1] : NULL;
		if (parent != NULL && parent->type == NODE_MAP &&
		    parent->nkids % 2 == 0 && n->type != NODE_SCALAR) {
			rc = FAIL(c, n,
			    "%s used as a mapping key, expected a plain key "
			    "such as burst",
			    n->type == NODE_MAP ? "a mapping" : "a sequence");
			node_free(n);
			break;
		}
		if (parent == NULL && root != NULL) {
			/* Unreachable: one document holds one root. */
			rc = FAIL(c, n,
			    "a second top-level node, expected exactly one "
			    "document per quota file");
			node_free(n);
			break;
		}
		if (parent == NULL) {
			root = n;
		} else if (node_add(parent, n) != ALLOT_OK) {
			node_free(n);
			rc = nomem(c);
			break;
		}
		if (n->type != NODE_SCALAR)
			stack[depth++] = n;
	}
	yaml_parser_delete(&p);
	if (rc != ALLOT_OK) {
		node_free(root);
		return rc;
	}
	*ret = root;
	return ALLOT_OK;
}

/* ------------------------------------------------------------------ */
/* The schema walk                                                    */
/* ------------------------------------------------------------------ */

static bool
key_is(const struct node *k, const char *name)
{
	size_t len = strlen(name);
	return k->len == len && memcmp(k->str, name, len) == 0;
}

static size_t
key_index(const struct node *k, const char *const *keys, size_t nkeys)
{
	size_t i;
	for (i = 0; i < nkeys; i++)
		if (key_is(k, keys[i]))
			break;
	return i;
}

static void
join(char *buf, size_t size, const char *const *words, size_t n)
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

/* Check that `map` is a mapping whose keys are all in `keys`, each at
 * most once, and fill vals[i] with the value of keys[i] (NULL if absent).
 */
static int
walk_map(struct ctx *c, const struct node *map, const char *what,
    const char *const *keys, size_t nkeys, const struct node **vals)
{
	const struct node *seen[8] = { NULL };
	char d[DBUF], q[QBUF], list[256];
	for (size_t i = 0; i < nkeys; i++)
		vals[i] = NULL;
	if (map->type != NODE_MAP)
		return FAIL(c, map, "%s is %s, expected a mapping", what,
		    describe(map, d, sizeof d));
	for (size_t i = 0; i + 1 < map->nkids; i += 2) {
		const struct node *k = map->kids[i];
		size_t j = key_index(k, keys, nkeys);
		if (j == nkeys) {
			join(list, sizeof list, keys, nkeys);
			return FAIL(c, k,
			    "unknown key %s in %s, expected one of: %s",
			    QN(q, k), what, list);
		}
		if (seen[j] != NULL)
			return FAIL(c, k,
			    "duplicate key %s in %s (first at line %" PRIu32
			    "), expected each key once",
			    QN(q, k), what, seen[j]->line);
		seen[j] = k;
		vals[j] = map->kids[i + 1];
	}
	return ALLOT_OK;
}

/* The first required key missing from vals, reported at the mapping. */
static int
need(struct ctx *c, const struct node *map, const char *what,
    const char *const *keys, const struct node **vals, size_t nreq)
{
	char list[128];
	for (size_t i = 0; i < nreq; i++) {
		if (vals[i] != NULL)
			continue;
		join(list, sizeof list, keys, nreq);
		return FAIL(c, map,
		    "missing required key \"%s\" in %s, expected all of: %s",
		    keys[i], what, list);
	}
	return ALLOT_OK;
}

/* Keys of a quota; the required ones come first. */
enum {
	QK_RATE,
	QK_BURST,
	QK_PRIORITY,
	QK_SHADOW,
	QK_FALLBACK,
	QK_SHARED, /* quotas.default only */
	QK_IDENTITY, /* quotas.callers only */
};
static const char *const default_keys[] = { "tokens_per_second", "burst",
	"priority", "shadow", "fallback", "shared" };
/* Same indices as above except identity, which is listed first. */
static const char *const caller_keys[] = { "identity", "tokens_per_second",
	"burst", "priority", "shadow", "fallback" };

static int
parse_fallback(
    struct ctx *c, const struct node *n, const char *what, allot_fallback *ret)
{
	char q[QBUF];
	const char *s = NULL;
	int rc = get_string(
	    c, n, what, 32, "one of: static_share, open, closed", &s);
	if (rc != ALLOT_OK)
		return rc;
	if (strcmp(s, "static_share") == 0)
		*ret = ALLOT_FALLBACK_STATIC_SHARE;
	else if (strcmp(s, "open") == 0)
		*ret = ALLOT_FALLBACK_OPEN;
	else if (strcmp(s, "closed") == 0)
		*ret = ALLOT_FALLBACK_CLOSED;
	else
		return FAIL(c, n,
		    "%s is %s, expected one of: static_share, open, closed",
		    what, QN(q, n));
	return ALLOT_OK;
}

/* One quota mapping: quotas.default (`path` "quotas.default") or an entry
 * of quotas.callers. */
static int
parse_quota(struct ctx *c, const struct node *map, const char *path,
    bool is_default, allot__quota *q, struct qmeta *m)
{
	const char *const *keys = is_default ? default_keys : caller_keys;
	const struct node *vals[6];
	char what[96];
	int rc = walk_map(c, map, path, keys, 6, vals);
	if (rc == ALLOT_OK)
		rc = need(c, map, path, keys, vals, is_default ? 2 : 3);
	if (rc != ALLOT_OK)
		return rc;
	q->line = map->line;
	q->shared = is_default;
	q->fallback = ALLOT_FALLBACK_STATIC_SHARE;
	for (size_t i = 0; i + 1 < map->nkids && rc == ALLOT_OK; i += 2) {
		const struct node *k = map->kids[i], *v = map->kids[i + 1];
		size_t j = key_index(k, keys, 6);
		int field = is_default ? (int) j :
		    j == 0             ? QK_IDENTITY :
		                         (int) j - 1;
		const char *s = NULL;
		snprintf(what, sizeof what, "%s.%s", path, keys[j]);
		switch (field) {
		case QK_IDENTITY:
			rc = get_string(c, v, what, ALLOT_IDENTITY_MAX,
			    "a verified caller identity such as a SPIFFE ID",
			    &s);
			m->ident = v;
			if (rc != ALLOT_OK)
				break;
			/* "default" names the default quota in statistics
			 * and in the keys an agent registers. */
			if (strcmp(s, "default") == 0)
				rc = FAIL(c, v,
				    "%s \"default\" is reserved for "
				    "quotas.default, expected a caller's own "
				    "identity",
				    what);
			else if ((q->identity = strdup(s)) == NULL)
				rc = nomem(c);
			break;
		case QK_RATE: rc = get_rate(c, v, what, &q->rate); break;
		case QK_BURST:
			rc = get_burst(c, v, what, &q->burst);
			m->burst = v;
			break;
		case QK_PRIORITY:
			rc = get_string(c, v, what, ALLOT__CLASS_MAX,
			    "a priority class named in shed_order", &s);
			m->prio = v;
			break;
		case QK_SHADOW: rc = get_bool(c, v, what, &q->shadow); break;
		case QK_FALLBACK:
			rc = parse_fallback(c, v, what, &q->fallback);
			break;
		case QK_SHARED: rc = get_bool(c, v, what, &q->shared); break;
		default: break;
		}
	}
	return rc;
}

static int
parse_callers(struct ctx *c, const struct node *seq)
{
	allot_config *cfg = c->cfg;
	char d[DBUF], path[48];
	if (seq->type != NODE_SEQ)
		return FAIL(c, seq,
		    "quotas.callers is %s, expected a sequence of callers "
		    "(\"- identity: ...\"; [] for none)",
		    describe(seq, d, sizeof d));
	if (seq->nkids > ALLOT__MAX_CALLERS)
		return FAIL(c, seq->kids[ALLOT__MAX_CALLERS],
		    "too many callers (%zu), expected at most %d", seq->nkids,
		    ALLOT__MAX_CALLERS);
	if (seq->nkids == 0)
		return ALLOT_OK;
	cfg->callers = calloc(seq->nkids, sizeof *cfg->callers);
	c->meta = calloc(seq->nkids, sizeof *c->meta);
	if (cfg->callers == NULL || c->meta == NULL)
		return nomem(c);
	cfg->ncallers = seq->nkids;
	for (size_t i = 0; i < seq->nkids; i++) {
		snprintf(path, sizeof path, "quotas.callers[%zu]", i);
		int rc = parse_quota(c, seq->kids[i], path, false,
		    &cfg->callers[i], &c->meta[i]);
		if (rc != ALLOT_OK)
			return rc;
	}
	return ALLOT_OK;
}

static int
parse_weights(struct ctx *c, const struct node *map)
{
	allot_config *cfg = c->cfg;
	char d[DBUF], q[QBUF], what[ALLOT__ENDPOINT_MAX + 64];
	if (map->type != NODE_MAP)
		return FAIL(c, map,
		    "quotas.endpoint_weights is %s, expected a mapping of "
		    "endpoint: weight",
		    describe(map, d, sizeof d));
	size_t pairs = map->nkids / 2;
	size_t cap = pairs < ALLOT__MAX_ENDPOINTS ? pairs :
	                                            ALLOT__MAX_ENDPOINTS;
	if (cap > 0) {
		cfg->endpoints = calloc(cap, sizeof *cfg->endpoints);
		if (cfg->endpoints == NULL)
			return nomem(c);
	}
	for (size_t i = 0; i < map->nkids; i += 2) {
		const struct node *k = map->kids[i], *v = map->kids[i + 1];
		const char *name = NULL;
		int rc = get_string(c, k, "endpoint name", ALLOT__ENDPOINT_MAX,
		    "an endpoint name such as \"/export\"", &name);
		if (rc != ALLOT_OK)
			return rc;
		for (size_t j = 0; j < i; j += 2) {
			const struct node *o = map->kids[j];
			if (o->len == k->len &&
			    memcmp(o->str, k->str, k->len) == 0)
				return FAIL(c, k,
				    "duplicate key %s in "
				    "quotas.endpoint_weights (first at line "
				    "%" PRIu32
				    "), expected each endpoint once",
				    QN(q, k), o->line);
		}
		snprintf(what, sizeof what, "the weight of %s", QN(q, k));
		if (strcmp(name, "default") == 0) {
			rc = get_weight(c, v, what, &cfg->default_weight);
			if (rc != ALLOT_OK)
				return rc;
			continue;
		}
		if (cfg->nendpoints == ALLOT__MAX_ENDPOINTS)
			return FAIL(c, k,
			    "too many endpoints in quotas.endpoint_weights, "
			    "expected at most %d besides default",
			    ALLOT__MAX_ENDPOINTS);
		allot__endpoint *ep = &cfg->endpoints[cfg->nendpoints];
		rc = get_weight(c, v, what, &ep->weight);
		if (rc != ALLOT_OK)
			return rc;
		if ((ep->name = strdup(name)) == NULL)
			return nomem(c);
		cfg->nendpoints++;
	}
	return ALLOT_OK;
}

static int
parse_shed_order(struct ctx *c, const struct node *seq)
{
	allot_config *cfg = c->cfg;
	char d[DBUF], q[QBUF];
	if (seq->type != NODE_SEQ)
		return FAIL(c, seq,
		    "quotas.global_ceiling.shed_order is %s, expected a "
		    "sequence of class names, shed first to last",
		    describe(seq, d, sizeof d));
	if (seq->nkids == 0)
		return FAIL(c, seq,
		    "quotas.global_ceiling.shed_order is empty, expected at "
		    "least one class name");
	if (seq->nkids > ALLOT__MAX_CLASSES)
		return FAIL(c, seq->kids[ALLOT__MAX_CLASSES],
		    "too many classes in shed_order (%zu), expected at most "
		    "%d",
		    seq->nkids, ALLOT__MAX_CLASSES);
	for (size_t i = 0; i < seq->nkids; i++) {
		const struct node *n = seq->kids[i];
		const char *s = NULL;
		int rc = get_string(c, n, "shed_order entry", ALLOT__CLASS_MAX,
		    "a priority class name", &s);
		if (rc != ALLOT_OK)
			return rc;
		for (size_t j = 0; j < i; j++)
			if (strcmp(cfg->classes[j], s) == 0)
				return FAIL(c, n,
				    "duplicate class %s in shed_order (first "
				    "at line %" PRIu32 ", column %" PRIu32
				    "), expected each class once",
				    QN(q, n), seq->kids[j]->line,
				    seq->kids[j]->col);
		if ((cfg->classes[i] = strdup(s)) == NULL)
			return nomem(c);
		cfg->nclasses++;
	}
	return ALLOT_OK;
}

static int
parse_ceiling(struct ctx *c, const struct node *map)
{
	static const char *const keys[] = { "tokens_per_second",
		"shed_order" };
	const char *path = "quotas.global_ceiling";
	const struct node *vals[2];
	int rc = walk_map(c, map, path, keys, 2, vals);
	if (rc == ALLOT_OK)
		rc = need(c, map, path, keys, vals, 1);
	if (rc != ALLOT_OK)
		return rc;
	/* Fields in file order, so the first bad one is reported. */
	for (size_t i = 0; i + 1 < map->nkids && rc == ALLOT_OK; i += 2) {
		const struct node *v = map->kids[i + 1];
		if (key_is(map->kids[i], "tokens_per_second"))
			rc = get_rate(c, v,
			    "quotas.global_ceiling.tokens_per_second",
			    &c->cfg->ceiling_rate);
		else
			rc = parse_shed_order(c, v);
	}
	return rc;
}

static int
parse_root(struct ctx *c, const struct node *root)
{
	static const char *const top_keys[] = { "quotas" };
	enum { K_DEFAULT, K_CALLERS, K_WEIGHTS, K_CEILING };
	static const char *const keys[] = { "default", "callers",
		"endpoint_weights", "global_ceiling" };
	const struct node *top[1], *vals[4];
	char d[DBUF];
	if (root == NULL || is_null(root))
		return FAIL_AT(c, root ? root->line : 1, root ? root->col : 1,
		    "the file is empty, expected a top-level \"quotas\" "
		    "mapping");
	if (root->type != NODE_MAP)
		return FAIL(c, root,
		    "the document is %s, expected a mapping with a top-level "
		    "\"quotas\" key",
		    describe(root, d, sizeof d));
	int rc = walk_map(c, root, "the top level", top_keys, 1, top);
	if (rc != ALLOT_OK)
		return rc;
	if (top[0] == NULL)
		return FAIL(c, root,
		    "missing required key \"quotas\" at the top level, "
		    "expected a top-level \"quotas\" mapping");
	const struct node *quotas = top[0];
	rc = walk_map(c, quotas, "quotas", keys, 4, vals);
	if (rc == ALLOT_OK)
		rc = need(c, quotas, "quotas", keys, vals, 1);
	/* Sections in file order, so the first bad one is reported. */
	for (size_t i = 0; i + 1 < quotas->nkids && rc == ALLOT_OK; i += 2) {
		const struct node *v = quotas->kids[i + 1];
		switch (key_index(quotas->kids[i], keys, 4)) {
		case K_DEFAULT:
			rc = parse_quota(c, v, "quotas.default", true,
			    &c->cfg->def, &c->def);
			break;
		case K_CALLERS: rc = parse_callers(c, v); break;
		case K_WEIGHTS: rc = parse_weights(c, v); break;
		case K_CEILING: rc = parse_ceiling(c, v); break;
		default: break;
		}
	}
	return rc;
}

/* ------------------------------------------------------------------ */
/* Checks across sections                                             */
/* ------------------------------------------------------------------ */

static int
set_default_classes(struct ctx *c)
{
	static const char *const names[] = { "low", "batch", "standard",
		"critical" };
	allot_config *cfg = c->cfg;
	for (size_t i = 0; i < 4; i++) {
		if ((cfg->classes[i] = strdup(names[i])) == NULL)
			return nomem(c);
		cfg->nclasses++;
	}
	return ALLOT_OK;
}

/* A quota without `priority` gets classes[0], the class shed first:
 * protection from shedding is opted into, never granted by omission. */
static int
resolve_priority(struct ctx *c, allot__quota *q, const struct qmeta *m)
{
	allot_config *cfg = c->cfg;
	char q1[QBUF], list[ALLOT__MAX_CLASSES * (ALLOT__CLASS_MAX + 2)];
	q->priority = 0;
	if (m->prio == NULL)
		return ALLOT_OK;
	for (size_t i = 0; i < cfg->nclasses; i++) {
		if (strcmp(cfg->classes[i], m->prio->str) == 0) {
			q->priority = (uint32_t) i;
			return ALLOT_OK;
		}
	}
	join(list, sizeof list, (const char *const *) cfg->classes,
	    cfg->nclasses);
	return FAIL(c, m->prio,
	    "unknown priority class %s, expected one of: %s", QN(q1, m->prio),
	    list);
}

static int
cmp_identity(const void *a, const void *b)
{
	const allot__quota *x = *(const allot__quota *const *) a;
	const allot__quota *y = *(const allot__quota *const *) b;
	int r = strcmp(x->identity, y->identity);
	if (r != 0)
		return r;
	return x < y ? -1 : x > y; /* file order among equals */
}

/* Sort callers by identity (kept for the digest) and report the earliest
 * repeated identity, pointing back at its first definition. */
static int
check_identities(struct ctx *c)
{
	allot_config *cfg = c->cfg;
	char q[QBUF];
	if (cfg->ncallers == 0)
		return ALLOT_OK;
	c->byid = malloc(cfg->ncallers * sizeof *c->byid);
	if (c->byid == NULL)
		return nomem(c);
	for (size_t i = 0; i < cfg->ncallers; i++)
		c->byid[i] = &cfg->callers[i];
	qsort(c->byid, cfg->ncallers, sizeof *c->byid, cmp_identity);
	/* Each run of equal identities is in file order: its first entry
	 * is the definition, its second the earliest repeat. */
	const allot__quota *dup = NULL, *first = NULL;
	for (size_t i = 0, j; i < cfg->ncallers; i = j) {
		for (j = i + 1; j < cfg->ncallers; j++)
			if (strcmp(c->byid[i]->identity,
			        c->byid[j]->identity) != 0)
				break;
		if (j - i > 1 && (dup == NULL || c->byid[i + 1] < dup)) {
			dup = c->byid[i + 1];
			first = c->byid[i];
		}
	}
	if (dup == NULL)
		return ALLOT_OK;
	const struct node *n = c->meta[dup - cfg->callers].ident;
	return FAIL(c, n,
	    "duplicate identity %s (first defined at line %" PRIu32
	    "), expected each caller identity once",
	    Q(q, dup->identity), first->line);
}

/* Every request to any endpoint must be able to pass a full bucket. */
static int
check_burst(struct ctx *c, const allot__quota *q, const struct qmeta *m,
    bool is_default)
{
	allot_config *cfg = c->cfg;
	char q1[QBUF], q2[QBUF], q3[QBUF], who[QBUF + 16];
	if (q->burst >= cfg->max_weight)
		return ALLOT_OK;
	const char *ep = "default";
	for (size_t i = 0; i < cfg->nendpoints; i++) {
		if (cfg->endpoints[i].weight == cfg->max_weight) {
			ep = cfg->endpoints[i].name;
			break;
		}
	}
	if (is_default)
		snprintf(who, sizeof who, "quotas.default");
	else
		snprintf(who, sizeof who, "caller %s", Q(q1, q->identity));
	return FAIL(c, m->burst,
	    "%s has burst %s, below the weight %" PRIu32
	    " of endpoint %s, expected burst >= %" PRIu32
	    " (a request there could never pass)",
	    who, NUM(q3, m->burst), cfg->max_weight, Q(q2, ep),
	    cfg->max_weight);
}

static int
check_all(struct ctx *c)
{
	allot_config *cfg = c->cfg;
	int rc = ALLOT_OK;
	if (cfg->nclasses == 0 && (rc = set_default_classes(c)) != ALLOT_OK)
		return rc;
	rc = resolve_priority(c, &cfg->def, &c->def);
	for (size_t i = 0; i < cfg->ncallers && rc == ALLOT_OK; i++)
		rc = resolve_priority(c, &cfg->callers[i], &c->meta[i]);
	if (rc == ALLOT_OK)
		rc = check_identities(c);
	cfg->max_weight = cfg->default_weight;
	for (size_t i = 0; i < cfg->nendpoints; i++)
		if (cfg->endpoints[i].weight > cfg->max_weight)
			cfg->max_weight = cfg->endpoints[i].weight;
	if (rc == ALLOT_OK)
		rc = check_burst(c, &cfg->def, &c->def, true);
	for (size_t i = 0; i < cfg->ncallers && rc == ALLOT_OK; i++)
		rc = check_burst(c, &cfg->callers[i], &c->meta[i], false);
	return rc;
}

/* ------------------------------------------------------------------ */
/* The digest                                                         */
/* ------------------------------------------------------------------ */

/* FNV-1a over a canonical serialisation of the loaded values (not the
 * text): fixed-width little-endian integers, IEEE-754 bit patterns for
 * rates, length-prefixed strings, endpoints and callers sorted by name.
 * Two files that load to the same quotas have the same digest whatever
 * their comments, layout, quoting, key order or number spelling. */
#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

static void
dg_bytes(uint64_t *h, const void *data, size_t len)
{
	const unsigned char *p = data;
	for (size_t i = 0; i < len; i++) {
		*h ^= p[i];
		*h *= FNV_PRIME;
	}
}

static void
dg_u64(uint64_t *h, uint64_t v)
{
	unsigned char b[8];
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char) (v >> (8 * i));
	dg_bytes(h, b, sizeof b);
}

static void
dg_str(uint64_t *h, const char *s)
{
	size_t len = strlen(s);
	dg_u64(h, len);
	dg_bytes(h, s, len);
}

static void
dg_double(uint64_t *h, double d)
{
	uint64_t u;
	memcpy(&u, &d, sizeof u);
	dg_u64(h, u);
}

static void
dg_quota(uint64_t *h, const allot_config *cfg, const allot__quota *q)
{
	dg_str(h, q->identity);
	dg_double(h, q->rate);
	dg_double(h, q->burst);
	dg_str(h, cfg->classes[q->priority]);
	dg_u64(h, q->shadow);
	dg_u64(h, q->shared);
	dg_u64(h, (uint64_t) q->fallback);
}

static int
cmp_endpoint(const void *a, const void *b)
{
	const allot__endpoint *x = *(const allot__endpoint *const *) a;
	const allot__endpoint *y = *(const allot__endpoint *const *) b;
	return strcmp(x->name, y->name);
}

static uint64_t
digest(const allot_config *cfg, const allot__quota *const *byid)
{
	const allot__endpoint *eps[ALLOT__MAX_ENDPOINTS];
	uint64_t h = FNV_OFFSET;
	dg_str(&h, "allot-quotas-v1");
	dg_u64(&h, cfg->nclasses);
	for (size_t i = 0; i < cfg->nclasses; i++)
		dg_str(&h, cfg->classes[i]);
	dg_u64(&h, cfg->default_weight);
	for (size_t i = 0; i < cfg->nendpoints; i++)
		eps[i] = &cfg->endpoints[i];
	qsort(eps, cfg->nendpoints, sizeof eps[0], cmp_endpoint);
	dg_u64(&h, cfg->nendpoints);
	for (size_t i = 0; i < cfg->nendpoints; i++) {
		dg_str(&h, eps[i]->name);
		dg_u64(&h, eps[i]->weight);
	}
	dg_double(&h, cfg->ceiling_rate);
	dg_quota(&h, cfg, &cfg->def);
	dg_u64(&h, cfg->ncallers);
	for (size_t i = 0; i < cfg->ncallers; i++)
		dg_quota(&h, cfg, byid[i]);
	return allot__mix64(h);
}

/* ------------------------------------------------------------------ */
/* Public entry points                                                */
/* ------------------------------------------------------------------ */

void
allot_config_free(allot_config *cfg)
{
	if (cfg == NULL)
		return;
	free(cfg->source);
	free(cfg->def.identity);
	for (size_t i = 0; i < cfg->ncallers; i++)
		free(cfg->callers[i].identity);
	free(cfg->callers);
	for (size_t i = 0; i < cfg->nendpoints; i++)
		free(cfg->endpoints[i].name);
	free(cfg->endpoints);
	for (size_t i = 0; i < cfg->nclasses; i++)
		free(cfg->classes[i]);
	free(cfg);
}

int
allot_config_parse(const char *name, const char *text, size_t len,
    char *errbuf, size_t errlen, allot_config **ret_cfg)
{
	struct ctx c = {
		.name = name != NULL ? name : "<config>",
		.errbuf = errbuf,
		.errlen = errlen,
	};
	struct node *root = NULL;
	int rc;

	if (errbuf != NULL && errlen > 0)
		errbuf[0] = '\0';
	if (ret_cfg == NULL || (text == NULL && len > 0))
		return ALLOT_EINVAL;
	if (text == NULL)
		text = "";
	c.cloc = newlocale(LC_NUMERIC_MASK, "C", (locale_t) 0);
	c.cfg = calloc(1, sizeof *c.cfg);
	if (c.cloc == (locale_t) 0 || c.cfg == NULL) {
		rc = nomem(&c);
		goto out;
	}
	c.cfg->default_weight = 1;
	if ((c.cfg->source = strdup(c.name)) == NULL ||
	    (c.cfg->def.identity = strdup("default")) == NULL) {
		rc = nomem(&c);
		goto out;
	}
	rc = read_tree(&c, text, len, &root);
	if (rc == ALLOT_OK)
		rc = parse_root(&c, root);
	if (rc == ALLOT_OK)
		rc = check_all(&c);
	if (rc != ALLOT_OK)
		goto out;
	c.cfg->digest = digest(c.cfg, c.byid);
	*ret_cfg = c.cfg;
	c.cfg = NULL;
out:
	allot_config_free(c.cfg);
	node_free(root);
	free(c.meta);
	free(c.byid);
	if (c.cloc != (locale_t) 0)
		freelocale(c.cloc);
	return rc;
}

static const char *
errno_str(int err, char *buf, size_t len)
{
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
	return strerror_r(err, buf, len);
#else
	if (strerror_r(err, buf, len) != 0)
		snprintf(buf, len, "error %d", err);
	return buf;
#endif
}

int
allot_config_load(
    const char *path, char *errbuf, size_t errlen, allot_config **ret_cfg)
{
	char ebuf[128];
	char *text = NULL;
	size_t len = 0, cap = 0;
	int rc = ALLOT_OK, fd, err = 0;

	if (errbuf != NULL && errlen > 0)
		errbuf[0] = '\0';
	if (path == NULL || ret_cfg == NULL)
		return ALLOT_EINVAL;
	do
		fd = open(path, O_RDONLY | O_CLOEXEC);
	while (fd < 0 && errno == EINTR);
	if (fd < 0) {
		err = errno;
		rc = err == ENOENT ? ALLOT_ENOENT : ALLOT_EIO;
		goto fail;
	}
	for (;;) {
		if (len == cap) {
			if (cap >= MAX_FILE_BYTES) {
				rc = ALLOT_ECONFIG;
				if (errbuf != NULL && errlen > 0)
					snprintf(errbuf, errlen,
					    "%s:1:1: file larger than %u MiB, "
					    "expected a quota file",
					    path, MAX_FILE_BYTES >> 20);
				goto out;
			}
			size_t ncap = cap ? cap * 2 : 16384;
			char *t = realloc(text, ncap);
			if (t == NULL) {
				rc = ALLOT_ENOMEM;
				if (errbuf != NULL && errlen > 0)
					snprintf(errbuf, errlen,
					    "%s: out of memory", path);
				goto out;
			}
			text = t;
			cap = ncap;
		}
		ssize_t n = read(fd, text + len, cap - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			err = errno;
			rc = ALLOT_EIO;
			goto fail;
		}
		if (n == 0)
			break;
		len += (size_t) n;
	}
	rc = allot_config_parse(path, text, len, errbuf, errlen, ret_cfg);
	goto out;
fail:
	if (errbuf != NULL && errlen > 0)
		snprintf(errbuf, errlen, "%s: cannot read the quota file: %s",
		    path, errno_str(err, ebuf, sizeof ebuf));
out:
	if (fd >= 0)
		close(fd);
	free(text);
	return rc;
}

const allot__quota *
allot__config_find(const allot_config *cfg, const char *identity)
{
	if (cfg == NULL || identity == NULL)
		return NULL;
	for (size_t i = 0; i < cfg->ncallers; i++)
		if (strcmp(cfg->callers[i].identity, identity) == 0)
			return &cfg->callers[i];
	return NULL;
}

uint32_t
allot__config_weight(const allot_config *cfg, const char *endpoint)
{
	if (endpoint != NULL)
		for (size_t i = 0; i < cfg->nendpoints; i++)
			if (strcmp(cfg->endpoints[i].name, endpoint) == 0)
				return cfg->endpoints[i].weight;
	return cfg->default_weight;
}

allot_config *
allot__config_dup(const allot_config *cfg)
{
	allot_config *d = calloc(1, sizeof *d);
	if (d == NULL)
		return NULL;
	*d = *cfg;
	/* Clear every owned pointer before copying, so that a failure
	 * half-way leaves something allot_config_free() can release. */
	d->source = NULL;
	d->def.identity = NULL;
	d->callers = NULL;
	d->ncallers = 0;
	d->endpoints = NULL;
	d->nendpoints = 0;
	d->nclasses = 0;
	memset(d->classes, 0, sizeof d->classes);
	if ((d->source = strdup(cfg->source)) == NULL ||
	    (d->def.identity = strdup(cfg->def.identity)) == NULL)
		goto fail;
	if (cfg->ncallers > 0) {
		d->callers = calloc(cfg->ncallers, sizeof *d->callers);
		if (d->callers == NULL)
			goto fail;
		for (; d->ncallers < cfg->ncallers; d->ncallers++) {
			allot__quota *q = &d->callers[d->ncallers];
			*q = cfg->callers[d->ncallers];
			if ((q->identity = strdup(q->identity)) == NULL)
				goto fail;
		}
	}
	if (cfg->nendpoints > 0) {
		d->endpoints = calloc(cfg->nendpoints, sizeof *d->endpoints);
		if (d->endpoints == NULL)
			goto fail;
		for (; d->nendpoints < cfg->nendpoints; d->nendpoints++) {
			allot__endpoint *e = &d->endpoints[d->nendpoints];
			*e = cfg->endpoints[d->nendpoints];
			if ((e->name = strdup(e->name)) == NULL)
				goto fail;
		}
	}
	for (; d->nclasses < cfg->nclasses; d->nclasses++)
		if ((d->classes[d->nclasses] = strdup(
		         cfg->classes[d->nclasses])) == NULL)
			goto fail;
	return d;
fail:
	allot_config_free(d);
	return NULL;
}
