/* SPDX-License-Identifier: MIT */
/*
 * The option-table parser every allot binary's command line goes through
 * (allotd, allot-agentd, allotctl, allot-loadgen, allot-sim): one row per
 * option names it (long and short), says what its value is and where it
 * goes (a field of the caller's struct by offset and type, or a handler),
 * and carries its help. From the table come getopt_long's option array
 * and short-option string, the parse with its error messages (unknown
 * option, missing value, a number out of range, each followed by the
 * binary's "Try ..." line), the options list of --help, and for
 * allot-agentd the options file. An option therefore cannot be accepted
 * without being documented, or the other way round.
 *
 * It is an archive of its own (opts_dep), not part of the agent: liballot
 * never parses a command line, and allot-agentd, which otherwise uses
 * the public headers only, links this piece alone. Not thread-safe
 * (getopt_long's state is global): call it from main().
 */
#ifndef ALLOT_COMMON_OPTS_H
#define ALLOT_COMMON_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* What a parse, a handler or an options file ends with. The values are
 * the exit statuses the binaries use: DONE after --help or --version
 * (exit 0), USAGE after a bad command line was explained (exit 2). */
enum {
	ALLOT__OPTS_OK = 0,
	ALLOT__OPTS_DONE = 1,
	ALLOT__OPTS_USAGE = 2,
};

/* What a row's value is, and where it goes. Every kind but CALL stores
 * at `off` in the caller's struct; a row takes a value when it has an
 * `arg` (its name in the help), and the kinds that store a value need
 * one. */
typedef enum allot__opt_kind {
	ALLOT__OPT_CALL, /* the row's `set` handler does it */
	ALLOT__OPT_STR, /* const char *: the value itself */
	ALLOT__OPT_TRUE, /* bool: set (no value) */
	ALLOT__OPT_FALSE, /* bool: cleared (no value) */
	ALLOT__OPT_U32, /* uint32_t in [min, max] (max 0: UINT32_MAX) */
	ALLOT__OPT_UINT, /* unsigned in [min, max] (max 0: UINT_MAX) */
	ALLOT__OPT_U64, /* uint64_t in [min, max] (max 0: UINT64_MAX) */
	ALLOT__OPT_DOUBLE, /* double in [lo, hi] (both 0: any finite) */
	ALLOT__OPT_LEVEL, /* int: a syslog level, by name or 0-7 */
	ALLOT__OPT_HELP, /* print the table's help, then DONE */
} allot__opt_kind;

typedef struct allot__opts allot__opts;
typedef struct allot__opt allot__opt;

/* One use of an option, as a handler sees it. */
typedef struct allot__opt_use {
	const allot__opts *t;
	const allot__opt *o; /* the row */
	const char *arg; /* its value; NULL when it takes none */
	/* The option as written, for messages: "--limit", "-n", or in an
	 * options file "FILE:LINE: name". */
	const char *as;
} allot__opt_use;

/* A CALL row's handler: store `u->arg` in `dst` (the struct given to the
 * parse). Returns ALLOT__OPTS_OK, ALLOT__OPTS_DONE (the program is
 * finished: --version printed), or ALLOT__OPTS_USAGE after saying what
 * is wrong with allot__opts_fail(). */
typedef int allot__opt_fn(const allot__opt_use *u, void *dst);

struct allot__opt {
	const char *name; /* long name, without "--" */
	int short_name; /* 0: none */
	allot__opt_kind kind;
	const char *arg; /* the value's name in the help; NULL: no value */
	/* Help lines, each ending in '\n' (a longer one is wrapped at 79
	 * columns). NULL: the next row's help is theirs too; the manual
	 * layout lists both on one line ("--tls-cert FILE, --tls-ca
	 * FILE"), the columns layout this one without help. */
	const char *help;
	const char *dflt; /* shown as "(default DFLT)" after the help */
	/* Printed after the help as it is (a table of sub-keys). */
	const char *more;
	const char *section; /* ALLOT__OPTS_COLUMNS: the heading it is under */
	size_t off; /* where the value goes in the caller's struct */
	uint64_t min, max; /* the integer kinds */
	double lo, hi; /* ALLOT__OPT_DOUBLE */
	allot__opt_fn *set; /* ALLOT__OPT_CALL */
	/* The caller's bits (allotctl: its commands): the row is accepted
	 * where the parse's `where` meets them (0: everywhere), and listed
	 * by allot__opts_print where its `shown` meets them. */
	unsigned where, shown;
	bool cli_only; /* not a key of an options file (--help) */
	/* An environment variable that sets it (allot__opts_env), e.g.
	 * "ALLOT_COORDINATOR"; NULL: none. */
	const char *env;
};

/* How --help lists the options. */
typedef enum allot__opts_style {
	/* A manual: each option on its own line, its help indented under
	 * it by eight columns (allotd, allotctl). */
	ALLOT__OPTS_MAN,
	/* Two columns: the option, then its help from column `col`
	 * (allot-agentd, allot-loadgen, allot-sim). */
	ALLOT__OPTS_COLUMNS,
} allot__opts_style;

struct allot__opts {
	const char *prog; /* "allotd": begins every message */
	const allot__opt *rows;
	size_t n;
	allot__opts_style style;
	int col; /* ALLOT__OPTS_COLUMNS: where the help starts; 0: 30 */
	/* What an ALLOT__OPT_HELP row prints on stdout: `head`, the
	 * options list, `tail` (either may be NULL). */
	const char *head, *tail;
	/* The line after a usage error; NULL: "Try 'PROG --help'." */
	const char *try_help;
};

/* One parse's settings (NULL to allot__opts_parse: all rows accepted, no
 * arguments but options). */
typedef struct allot__opts_run {
	unsigned where; /* rows accepted; 0: all */
	/* The command being parsed (allotctl), so that an option another
	 * command takes is refused as "CMD does not take "--x"" (before
	 * the command: ""--x" goes after the command"). */
	const char *cmd;
	const char *try_help; /* NULL: the table's */
	/* Stop at the first argument that is not an option (a command):
	 * `next` is its index. Otherwise options and arguments may come in
	 * any order, and the arguments are gathered in `args`. */
	bool in_order;
	char **args; /* room for argc pointers; NULL: arguments refused */
	int nargs; /* out: the arguments in `args` */
	int next; /* out, in order: the first argument not parsed */
} allot__opts_run;

/* Parse argv[1..argc) by table `t` into `dst`. ALLOT__OPTS_OK, DONE
 * (help or version printed on stdout), or USAGE (what is wrong printed
 * on stderr, "PROG: ..." and the "Try" line). */
int allot__opts_parse(const allot__opts *t, allot__opts_run *run, int argc,
    char **argv, void *dst);

/* Apply an options file (opts_file.c): a YAML mapping of option names
 * (as on the command line, or with '_' for '-') to values, the quota
 * file's style:
 *
 *     listen: [tls+tcp://0.0.0.0:7400, ipc:///run/allot/allotd.ipc]
 *     interval-ms: 100
 *     require-identity: true
 *
 * A repeatable option takes a list; an option without a value takes
 * true (given) or false (its no- twin, or nothing). A file that is not a
 * mapping is read in the older format, one option a line, "name value"
 * or "name = value", '#' comments. Rows marked cli_only are not keys of
 * it. Every value is a copy kept for the life of the process, as argv's
 * strings are, so a handler may keep the pointer. ALLOT__OPTS_OK or
 * USAGE (said, naming FILE:LINE). */
int allot__opts_file(const allot__opts *t, const char *path, void *dst);

/* The environment's values for the rows that name a variable (`env`),
 * each applied as if given once on the command line ("$NAME" in
 * messages); an unset or empty variable is skipped. */
int allot__opts_env(const allot__opts *t, void *dst);

/* What a daemon does before it parses its command line: the options
 * file of "--options FILE" (given once, anywhere before "--"), then the
 * environment (allot__opts_env), so that the command line wins over
 * both and the environment over the file. *ret_path (may be NULL) is the
 * file, or NULL. The table's "options" row is then a cli_only CALL row
 * with allot__opts_skip as its handler. */
int allot__opts_preload(const allot__opts *t, int argc, char **argv, void *dst,
    const char **ret_path);
int allot__opts_skip(const allot__opt_use *u, void *dst);

/* Store or act on one use of row `o` (`arg` NULL for a row without a
 * value; `as` names it in messages). */
int allot__opts_apply(const allot__opts *t, const allot__opt *o,
    const char *arg, const char *as, void *dst);

/* The options list of --help, in table order: the rows whose `shown`
 * meets `shown` (0: every row), `title` first when there is any.
 * Returns how many rows were listed. */
size_t allot__opts_print(
    FILE *f, const allot__opts *t, const char *title, unsigned shown);

/* "PROG: <message>" on stderr, for handlers. Returns ALLOT__OPTS_USAGE. */
int allot__opts_fail(const allot__opt_use *u, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* "PROG: <message>" and the "Try" line on stderr, for what the caller
 * checks once everything is parsed. Returns ALLOT__OPTS_USAGE. */
int allot__opts_error(const allot__opts *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The number parsers behind the kinds, for handlers: decimal digits only
 * (no sign, no space), in [min, max]; a finite number in [lo, hi].
 * False when `s` is not one. */
bool allot__opts_uint(
    const char *s, uint64_t min, uint64_t max, uint64_t *ret);
bool allot__opts_double(const char *s, double lo, double hi, double *ret);

#endif
