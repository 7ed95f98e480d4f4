/* SPDX-License-Identifier: MIT */
/*
 * The option-table parser (common/opts.h) every binary's command line
 * goes through: each kind stores its value or refuses it with the one
 * wording, unknown and misplaced options and missing values are refused
 * with the "Try" line, arguments are gathered wherever they stand (or the
 * parse stops at a command), an options file applies the same rows, and
 * --help lists them in both layouts.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "opts.h"
#include "runner.h"

typedef struct cfg {
	const char *name;
	bool on, keys;
	uint32_t n32;
	unsigned nu;
	uint64_t n64;
	double frac;
	int level;
	int calls;
} cfg;

#define AT(f) offsetof(cfg, f)

static int
count_call(const allot__opt_use *u, void *dst)
{
	cfg *c = dst;
	if (u->arg != NULL && strcmp(u->arg, "bad") == 0)
		return allot__opts_fail(u, "%s: no \"bad\" here", u->as);
	c->calls++;
	return ALLOT__OPTS_OK;
}

enum { CMD_A = 1, CMD_B = 2, GLOBAL = 4 };

static const allot__opt rows[] = {
	{ "name", 'N', ALLOT__OPT_STR, "NAME", "a name\n", .off = AT(name),
	    .section = "First" },
	{ "on", 0, ALLOT__OPT_TRUE, NULL, "switch it on\n", .off = AT(on),
	    .section = "First" },
	{ "no-keys", 0, ALLOT__OPT_FALSE, NULL, "no keys\n", .off = AT(keys),
	    .section = "First" },
	{ "n32", 0, ALLOT__OPT_U32, "N", "a count", .off = AT(n32), .min = 10,
	    .max = 60000, .dflt = "100", .section = "Numbers" },
	{ "nu", 0, ALLOT__OPT_UINT, "N", "any unsigned", .off = AT(nu),
	    .section = "Numbers" },
	{ "n64", 'n', ALLOT__OPT_U64, "N", "any 64-bit count", .off = AT(n64),
	    .section = "Numbers" },
	{ "frac", 0, ALLOT__OPT_DOUBLE, "F",
	    "a fraction, with a help text long enough that the columns layout "
	    "has to wrap it at seventy-nine columns",
	    .off = AT(frac), .lo = 0, .hi = 0.5,
	    .dflt = "0.1 of everything there is", .section = "Numbers" },
	{ "level", 0, ALLOT__OPT_LEVEL, "LEVEL", "how much to say",
	    .off = AT(level), .section = "Numbers" },
	{ "call", 'c', ALLOT__OPT_CALL, "X", NULL, .set = count_call,
	    .where = CMD_A, .shown = CMD_A, .section = "Commands" },
	{ "flag", 0, ALLOT__OPT_CALL, NULL, "both call and flag count\n",
	    .set = count_call, .where = CMD_B, .section = "Commands" },
	{ "help", 'h', ALLOT__OPT_HELP, NULL, "this text\n", .cli_only = true,
	    .shown = CMD_A, .where = GLOBAL | CMD_A, .section = "Commands" },
};

static const allot__opts table = {
	.prog = "prog",
	.rows = rows,
	.n = sizeof rows / sizeof rows[0],
	.style = ALLOT__OPTS_COLUMNS,
	.col = 24,
	.head = "usage: prog\n",
};

/* The same rows with environment variables and --options, for
 * options_env. */
static const allot__opt erows[] = {
	{ "options", 0, ALLOT__OPT_CALL, "FILE", "more\n",
	    .set = allot__opts_skip, .cli_only = true },
	{ "name", 0, ALLOT__OPT_STR, "NAME", "a name\n", .off = AT(name),
	    .env = "PROG_NAME" },
	{ "n32", 0, ALLOT__OPT_U32, "N", "a count\n", .off = AT(n32),
	    .max = 60000 },
	{ "n64", 0, ALLOT__OPT_U64, "N", "any 64-bit count\n", .off = AT(n64),
	    .env = "PROG_N64" },
};

static const allot__opts etable = {
	.prog = "prog",
	.rows = erows,
	.n = sizeof erows / sizeof erows[0],
	.style = ALLOT__OPTS_COLUMNS,
};

/* What a call wrote on stderr (the parse's messages), in `err`. */
static char err[4096];

static int
parse(allot__opts_run *run, cfg *c, ...)
{
	char *argv[32] = { "prog" };
	int argc = 1;
	va_list ap;
	va_start(ap, c);
	for (char *a; (a = va_arg(ap, char *)) != NULL;)
		argv[argc++] = a;
	va_end(ap);
	fflush(stderr);
	FILE *tmp = tmpfile();
	ck_assert_ptr_nonnull(tmp);
	int saved = dup(2);
	dup2(fileno(tmp), 2);
	int rc = allot__opts_parse(&table, run, argc, argv, c);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	rewind(tmp);
	size_t n = fread(err, 1, sizeof err - 1, tmp);
	err[n] = '\0';
	fclose(tmp);
	return rc;
}

static void
assert_err(const char *want)
{
	ck_assert_msg(
	    strcmp(err, want) == 0, "stderr: [%s], want [%s]", err, want);
}

START_TEST(kinds_store)
{
	cfg c = { .keys = true };
	ck_assert_int_eq(
	    parse(NULL, &c, "--name", "x", "--on", "--no-keys", "--n32=60000",
	        "--nu", "4294967295", "-n", "18446744073709551615", "--frac",
	        "0.5", "--level", "warning", NULL),
	    ALLOT__OPTS_OK);
	ck_assert_str_eq(c.name, "x");
	ck_assert(c.on && !c.keys);
	ck_assert_uint_eq(c.n32, 60000);
	ck_assert_uint_eq(c.nu, 4294967295u);
	ck_assert(c.n64 == UINT64_MAX);
	ck_assert(c.frac == 0.5);
	ck_assert_int_eq(c.level, 4);
	ck_assert_str_eq(err, "");
	ck_assert_int_eq(
	    parse(NULL, &c, "-Ny", "--level", "7", NULL), ALLOT__OPTS_OK);
	ck_assert_str_eq(c.name, "y");
	ck_assert_int_eq(c.level, 7);
}
END_TEST

START_TEST(values_refused)
{
	cfg c = { 0 };
	ck_assert_int_eq(
	    parse(NULL, &c, "--n32", "9", NULL), ALLOT__OPTS_USAGE);
	assert_err("prog: --n32 expects an integer from 10 to 60000, not "
	           "\"9\"\nTry 'prog --help'.\n");
	const char *bad[] = { "60001", "-5", "+5", " 5", "5x", "", "0x10" };
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		ck_assert_int_eq(
		    parse(NULL, &c, "--n32", bad[i], NULL), ALLOT__OPTS_USAGE);
	ck_assert_int_eq(
	    parse(NULL, &c, "--nu", "4294967296", NULL), ALLOT__OPTS_USAGE);
	ck_assert_int_eq(parse(NULL, &c, "-n", "18446744073709551616", NULL),
	    ALLOT__OPTS_USAGE);
	assert_err("prog: -n expects an integer from 0 to "
	           "18446744073709551615, not \"18446744073709551616\"\n"
	           "Try 'prog --help'.\n");
	ck_assert_int_eq(
	    parse(NULL, &c, "--frac", "0.6", NULL), ALLOT__OPTS_USAGE);
	assert_err("prog: --frac expects a number from 0 to 0.5, not "
	           "\"0.6\"\nTry 'prog --help'.\n");
	ck_assert_int_eq(
	    parse(NULL, &c, "--frac", "nan", NULL), ALLOT__OPTS_USAGE);
	ck_assert_int_eq(
	    parse(NULL, &c, "--level", "loud", NULL), ALLOT__OPTS_USAGE);
	assert_err("prog: --level expects err, warning, notice, info, debug "
	           "or 0-7, not \"loud\"\nTry 'prog --help'.\n");
	ck_assert_int_eq(
	    parse(NULL, &c, "--level", "8", NULL), ALLOT__OPTS_USAGE);
	/* A handler's own refusal, and the stop it causes. */
	ck_assert_int_eq(parse(NULL, &c, "-c", "bad", "-c", "good", NULL),
	    ALLOT__OPTS_USAGE);
	assert_err("prog: -c: no \"bad\" here\nTry 'prog --help'.\n");
	ck_assert_int_eq(c.calls, 0);
}
END_TEST

START_TEST(command_line_refused)
{
	cfg c = { 0 };
	ck_assert_int_eq(parse(NULL, &c, "--bogus", NULL), ALLOT__OPTS_USAGE);
	assert_err("prog: unknown option \"--bogus\"\nTry 'prog --help'.\n");
	ck_assert_int_eq(
	    parse(NULL, &c, "--bogus=1", NULL), ALLOT__OPTS_USAGE);
	assert_err("prog: unknown option \"--bogus\"\nTry 'prog --help'.\n");
	ck_assert_int_eq(parse(NULL, &c, "-Z", NULL), ALLOT__OPTS_USAGE);
	assert_err("prog: unknown option \"-Z\"\nTry 'prog --help'.\n");
	ck_assert_int_eq(parse(NULL, &c, "--name", NULL), ALLOT__OPTS_USAGE);
	assert_err("prog: --name needs a value\nTry 'prog --help'.\n");
	ck_assert_int_eq(parse(NULL, &c, "-N", NULL), ALLOT__OPTS_USAGE);
	assert_err("prog: -N needs a value\nTry 'prog --help'.\n");
	ck_assert_int_eq(parse(NULL, &c, "--on=yes", NULL), ALLOT__OPTS_USAGE);
	assert_err("prog: --on takes no value\nTry 'prog --help'.\n");
	ck_assert_int_eq(
	    parse(NULL, &c, "--on", "extra", NULL), ALLOT__OPTS_USAGE);
	assert_err("prog: unexpected argument \"extra\"\n"
	           "Try 'prog --help'.\n");
	ck_assert_int_eq(
	    parse(NULL, &c, "--", "--on", NULL), ALLOT__OPTS_USAGE);
	assert_err("prog: unexpected argument \"--on\"\n"
	           "Try 'prog --help'.\n");
}
END_TEST

START_TEST(arguments_anywhere)
{
	cfg c = { 0 };
	char *args[8];
	allot__opts_run run = { .args = args };
	ck_assert_int_eq(
	    parse(&run, &c, "a", "--on", "b", "-c", "x", "--", "--name", NULL),
	    ALLOT__OPTS_OK);
	ck_assert_int_eq(run.nargs, 3);
	ck_assert_str_eq(args[0], "a");
	ck_assert_str_eq(args[1], "b");
	ck_assert_str_eq(args[2], "--name"); /* after "--" */
	ck_assert(c.on);
	ck_assert_int_eq(c.calls, 1);
	ck_assert_ptr_null(c.name);
	/* In order: the first argument ends the parse (a command). */
	allot__opts_run first = { .in_order = true };
	c = (cfg) { 0 };
	ck_assert_int_eq(parse(&first, &c, "--on", "cmd", "--name", "x", NULL),
	    ALLOT__OPTS_OK);
	ck_assert_int_eq(first.next, 2);
	ck_assert(c.on);
	ck_assert_ptr_null(c.name);
}
END_TEST

START_TEST(options_by_command)
{
	cfg c = { 0 };
	char *args[8];
	allot__opts_run before = { .where = GLOBAL, .in_order = true };
	ck_assert_int_eq(
	    parse(&before, &c, "-c", "x", "cmd", NULL), ALLOT__OPTS_USAGE);
	assert_err("prog: \"-c\" goes after the command\n"
	           "Try 'prog --help'.\n");
	allot__opts_run b = { .where = CMD_B,
		.cmd = "b",
		.try_help = "Try 'prog help b'.",
		.args = args };
	ck_assert_int_eq(
	    parse(&b, &c, "--flag", "--call", "x", NULL), ALLOT__OPTS_USAGE);
	assert_err("prog: b does not take \"--call\"\nTry 'prog help b'.\n");
	ck_assert_int_eq(c.calls, 1); /* --flag, a CALL without a value */
	ck_assert_int_eq(parse(&b, &c, "--help", NULL), ALLOT__OPTS_USAGE);
	assert_err("prog: b does not take \"--help\"\nTry 'prog help b'.\n");
	allot__opts_run a = { .where = CMD_A, .cmd = "a", .args = args };
	ck_assert_int_eq(
	    parse(&a, &c, "arg", "--call", "x", NULL), ALLOT__OPTS_OK);
	ck_assert_int_eq(c.calls, 2);
	ck_assert_int_eq(a.nargs, 1);
	/* Rows without `where` are taken everywhere. */
	ck_assert_int_eq(parse(&a, &c, "--name", "n", NULL), ALLOT__OPTS_OK);
	ck_assert_str_eq(c.name, "n");
}
END_TEST

/* What `f` printed into a memory stream. */
static char *
printed(void (*f)(FILE *))
{
	char *text = NULL;
	size_t len = 0;
	FILE *m = open_memstream(&text, &len);
	ck_assert_ptr_nonnull(m);
	f(m);
	fclose(m);
	return text;
}

static void
print_columns(FILE *f)
{
	allot__opts_print(f, &table, NULL, 0);
}

static void
print_man(FILE *f)
{
	allot__opts man = table;
	man.style = ALLOT__OPTS_MAN;
	ck_assert_uint_eq(allot__opts_print(f, &man, "OPTIONS\n", CMD_A), 2);
	ck_assert_uint_eq(allot__opts_print(f, &man, "NONE\n", 64), 0);
}

START_TEST(help_lists_the_table)
{
	char *text = printed(print_columns);
	const char *want =
	    "\nFirst:\n"
	    "  -N, --name NAME       a name\n"
	    "      --on              switch it on\n"
	    "      --no-keys         no keys\n"
	    "\nNumbers:\n"
	    "      --n32 N           a count (default 100)\n"
	    "      --nu N            any unsigned\n"
	    "  -n, --n64 N           any 64-bit count\n"
	    "      --frac F          a fraction, with a help text long "
	    "enough that the\n"
	    "                        columns layout has to wrap it at "
	    "seventy-nine columns\n"
	    "                        (default 0.1 of everything there is)\n"
	    "      --level LEVEL     how much to say\n"
	    "\nCommands:\n"
	    "  -c, --call X\n"
	    "      --flag            both call and flag count\n"
	    "  -h, --help            this text\n";
	ck_assert_msg(strcmp(text, want) == 0, "got:\n%s", text);
	free(text);
	/* The manual layout, with a row listed with the next one. */
	text = printed(print_man);
	ck_assert_str_eq(text,
	    "OPTIONS\n"
	    "    -c, --call X, -h, --help\n"
	    "        this text\n");
	free(text);
}
END_TEST

START_TEST(help_and_done)
{
	cfg c = { 0 };
	fflush(stdout);
	FILE *tmp = tmpfile();
	int saved = dup(1);
	dup2(fileno(tmp), 1);
	int rc = parse(NULL, &c, "--on", "-h", "--name", NULL);
	fflush(stdout);
	dup2(saved, 1);
	close(saved);
	ck_assert_int_eq(rc, ALLOT__OPTS_DONE);
	ck_assert_str_eq(err, "");
	rewind(tmp);
	char out[64] = "";
	ck_assert_ptr_nonnull(fgets(out, sizeof out, tmp));
	fclose(tmp);
	ck_assert_str_eq(out, "usage: prog\n");
}
END_TEST

/* The options file `text`, applied to `c`; stderr in `err`. */
static int
file(const char *text, cfg *c)
{
	char path[] = "/tmp/allot-opts-XXXXXX";
	int fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, text, strlen(text)), (int) strlen(text));
	close(fd);
	fflush(stderr);
	FILE *tmp = tmpfile();
	int saved = dup(2);
	dup2(fileno(tmp), 2);
	int rc = allot__opts_file(&table, path, c);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	rewind(tmp);
	size_t n = fread(err, 1, sizeof err - 1, tmp);
	err[n] = '\0';
	fclose(tmp);
	/* Messages name the file: say it as FILE. */
	char *at = strstr(err, path);
	if (at != NULL) {
		memcpy(at, "FILE", 4);
		memmove(
		    at + 4, at + strlen(path), strlen(at + strlen(path)) + 1);
	}
	unlink(path);
	return rc;
}

START_TEST(options_file)
{
	cfg c = { 0 };
	ck_assert_int_eq(file("# a comment\n"
	                      "\n"
	                      "name = the name  # and a comment\n"
	                      "  n32 600\r\n"
	                      "frac=0.25\n"
	                      "call x\n",
	                     &c),
	    ALLOT__OPTS_OK);
	ck_assert_str_eq(c.name, "the name"); /* a copy, kept */
	ck_assert_uint_eq(c.n32, 600);
	ck_assert(c.frac == 0.25);
	ck_assert_int_eq(c.calls, 1);
	ck_assert_int_eq(file("n32 1\n", &c), ALLOT__OPTS_USAGE);
	assert_err("prog: FILE:1: n32 expects an integer from 10 to 60000, "
	           "not \"1\"\n");
	ck_assert_int_eq(file("\nbogus 1\n", &c), ALLOT__OPTS_USAGE);
	assert_err("prog: FILE:2: bogus: unknown option\n");
	/* Flags and command-line-only rows are no keys of a file. */
	ck_assert_int_eq(file("on 1\n", &c), ALLOT__OPTS_USAGE);
	ck_assert_int_eq(file("help x\n", &c), ALLOT__OPTS_USAGE);
	ck_assert_int_eq(file("name\n", &c), ALLOT__OPTS_USAGE);
	assert_err("prog: FILE:1: name needs a value\n");
	fflush(stderr);
	int saved = dup(2);
	FILE *null = fopen("/dev/null", "w");
	dup2(fileno(null), 2);
	int rc = allot__opts_file(&table, "/nonexistent/opts", &c);
	dup2(saved, 2);
	close(saved);
	fclose(null);
	ck_assert_int_eq(rc, ALLOT__OPTS_USAGE);
}
END_TEST

/* The quota file's style: a YAML mapping of long names ('_' for '-') to
 * values or lists; flags take true or false (false: the no- twin). */
START_TEST(options_file_yaml)
{
	cfg c = { .keys = true };
	ck_assert_int_eq(file("# allot options\n"
	                      "name: \"a: name\"\n"
	                      "n32: 600\n"
	                      "on: true\n"
	                      "no_keys: true\n"
	                      "call: [x, y, z]\n"
	                      "flag: yes\n"
	                      "level: debug\n",
	                     &c),
	    ALLOT__OPTS_OK);
	ck_assert_str_eq(c.name, "a: name");
	ck_assert_uint_eq(c.n32, 600);
	ck_assert(c.on);
	ck_assert(!c.keys); /* '_' for '-' */
	ck_assert_int_eq(c.calls, 4); /* three values and the flag */
	ck_assert_int_eq(c.level, 7);
	/* A false flag without a twin is left off; an on/off row set. */
	c = (cfg) { .on = true };
	ck_assert_int_eq(file("flag: false\non: false\nno-keys: false\n", &c),
	    ALLOT__OPTS_OK);
	ck_assert_int_eq(c.calls, 0);
	ck_assert(!c.on);
	ck_assert(c.keys);
	ck_assert_int_eq(file("\nn32: 1\n", &c), ALLOT__OPTS_USAGE);
	assert_err("prog: FILE:2: n32 expects an integer from 10 to 60000, "
	           "not \"1\"\n");
	ck_assert_int_eq(file("name: x\nbogus: 1\n", &c), ALLOT__OPTS_USAGE);
	assert_err("prog: FILE:2: bogus: unknown option (the keys are the "
	           "long options, as --help lists them)\n");
	ck_assert_int_eq(file("on: maybe\n", &c), ALLOT__OPTS_USAGE);
	assert_err("prog: FILE:1: on takes true or false, not \"maybe\"\n");
	ck_assert_int_eq(file("call: {a: b}\n", &c), ALLOT__OPTS_USAGE);
	assert_err("prog: FILE:1: call: a value or a list of values, not a "
	           "mapping\n");
	ck_assert_int_eq(file("help: true\n", &c), ALLOT__OPTS_USAGE);
	ck_assert_int_eq(file("call: bad\n", &c), ALLOT__OPTS_USAGE);
	assert_err("prog: FILE:1: call: no \"bad\" here\n");
}
END_TEST

/* The environment: a row's variable, as the command line would give it;
 * the command line wins over the environment, which wins over the file
 * (allot__opts_preload). */
START_TEST(options_env)
{
	char path[] = "/tmp/allot-opts-XXXXXX";
	int fd = mkstemp(path);
	ck_assert_int_ge(fd, 0);
	const char *text = "n64: 5\nn32: 700\nname: from-file\n";
	ck_assert_int_eq(write(fd, text, strlen(text)), (int) strlen(text));
	close(fd);
	setenv("PROG_N64", "9", 1);
	setenv("PROG_NAME", "", 1); /* empty: skipped */
	cfg c = { 0 };
	char *argv[] = { "prog", "--options", path, "--n32", "800", NULL };
	ck_assert_int_eq(
	    allot__opts_preload(&etable, 5, argv, &c, NULL), ALLOT__OPTS_OK);
	ck_assert_uint_eq(c.n64, 9); /* the environment over the file */
	ck_assert_uint_eq(c.n32, 700);
	ck_assert_str_eq(c.name, "from-file");
	ck_assert_int_eq(
	    allot__opts_parse(&etable, NULL, 5, argv, &c), ALLOT__OPTS_OK);
	ck_assert_uint_eq(c.n32, 800); /* the command line over both */
	setenv("PROG_N64", "x", 1);
	ck_assert_int_eq(allot__opts_preload(&etable, 5, argv, &c, NULL),
	    ALLOT__OPTS_USAGE);
	unsetenv("PROG_N64");
	unsetenv("PROG_NAME");
	unlink(path);
}
END_TEST

static Suite *
opts_suite(void)
{
	Suite *s = suite_create("opts");
	TCase *tc = tcase_create("opts");
	tcase_add_test(tc, kinds_store);
	tcase_add_test(tc, values_refused);
	tcase_add_test(tc, command_line_refused);
	tcase_add_test(tc, arguments_anywhere);
	tcase_add_test(tc, options_by_command);
	tcase_add_test(tc, help_lists_the_table);
	tcase_add_test(tc, help_and_done);
	tcase_add_test(tc, options_file);
	tcase_add_test(tc, options_file_yaml);
	tcase_add_test(tc, options_env);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(opts_suite)
