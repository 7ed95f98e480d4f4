/* SPDX-License-Identifier: MIT */
/*
 * allotctl: the operator's command line for allot. This file reads the
 * command line and runs one command: the options are one table (each
 * row: its names, its value, which commands take it, its manual text and
 * how it is stored) that drives getopt_long and the manuals alike, and
 * the commands are another. The commands themselves live one family to
 * a file: status, replicas, quotas, shares and top-denied read a running
 * allotd's GET /status (allotctl_status.c) and never change anything;
 * reload signals allotd on its own host (allotctl_reload.c);
 * check-config validates and sizes a quota file (allotctl_config.c) and
 * audit queries store files (allotctl_audit.c), both without an allotd;
 * diff and apply review and make a quota change through allotd's admin
 * socket (allotctl_apply.c).
 */
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>

#include "allotctl.h"

#define CTL_ONLINE                                             \
	(CTL_STATUS | CTL_REPLICAS | CTL_QUOTAS | CTL_SHARES | \
	    CTL_TOP_DENIED | CTL_RELOAD)
#define CTL_ALL                                                             \
	(CTL_ONLINE | CTL_CHECK_CONFIG | CTL_AUDIT | CTL_DIFF | CTL_APPLY | \
	    CTL_MEMBER)
#define CTL_CHANGE (CTL_DIFF | CTL_APPLY)

/* The commands, and the positional arguments each takes. */
static const struct command {
	const char *name;
	unsigned bit;
	int (*run)(const ctl *c);
	int min_args, max_args;
	const char *too_few; /* also for too many when `too_many` is NULL */
	const char *too_many;
	long limit; /* the default of -n / --limit */
} commands[] = {
	{ "status", CTL_STATUS, ctl_cmd_status, 0, 0,
	    "status takes no arguments", NULL, 10 },
	{ "replicas", CTL_REPLICAS, ctl_cmd_replicas, 0, 1,
	    "replicas takes at most one SERVICE", NULL, 10 },
	{ "quotas", CTL_QUOTAS, ctl_cmd_quotas, 0, 1,
	    "quotas takes at most one SERVICE", NULL, 10 },
	{ "shares", CTL_SHARES, ctl_cmd_shares, 1, 1,
	    "shares takes one CALLER", NULL, 10 },
	{ "top-denied", CTL_TOP_DENIED, ctl_cmd_top_denied, 0, 0,
	    "top-denied takes no arguments", NULL, 10 },
	{ "reload", CTL_RELOAD, ctl_cmd_reload, 0, 0,
	    "reload takes no arguments", NULL, 10 },
	{ "check-config", CTL_CHECK_CONFIG, ctl_cmd_check_config, 1, 1,
	    "check-config takes one FILE", NULL, 10 },
	{ "diff", CTL_DIFF, ctl_cmd_diff, 1, 1, "diff takes one FILE", NULL,
	    10 },
	{ "apply", CTL_APPLY, ctl_cmd_apply, 1, 1, "apply takes one FILE",
	    NULL, 10 },
	{ "member", CTL_MEMBER, ctl_cmd_member, 1, 4,
	    "member takes add ID RAFT_ADDR AGENT_URL, remove ID or list", NULL,
	    10 },
	/* SQLite attaches at most 10 databases by default. */
	{ "audit", CTL_AUDIT, ctl_cmd_audit, 1, 10,
	    "audit takes one or more DB files",
	    "audit takes at most 10 DB files (SQLite attaches 10 by "
	    "default)",
	    50 },
};

#define NCOMMANDS (sizeof commands / sizeof commands[0])

static const struct command *
find_command(const char *name)
{
	for (size_t i = 0; i < NCOMMANDS; i++)
		if (strcmp(commands[i].name, name) == 0)
			return &commands[i];
	return NULL;
}

static int usage_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Say what is wrong with the command line and where the manual is. */
static int
usage_error(const char *cmd, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	ctl_vfail(fmt, ap);
	va_end(ap);
	if (cmd != NULL)
		fprintf(stderr, "Try 'allotctl help %s'.\n", cmd);
	else
		fputs("Try 'allotctl --help'.\n", stderr);
	return EXIT_USAGE;
}

/* ------------------------------------------------------------------ */
/* The options                                                         */
/* ------------------------------------------------------------------ */

static int
set_http(ctl *c, const char *cmd, const char *as, const char *arg)
{
	c->http = arg;
	return 0;
}

static int
set_timeout(ctl *c, const char *cmd, const char *as, const char *arg)
{
	long v;
	if (!ctl_parse_int(arg, 1, 3600000, &v))
		return usage_error(cmd,
		    "--timeout expects milliseconds (1 to 3600000), not "
		    "\"%s\"",
		    arg);
	c->timeout_ms = (int) v;
	return 0;
}

static int
set_pid(ctl *c, const char *cmd, const char *as, const char *arg)
{
	if (!ctl_parse_int(arg, 1, INT_MAX, &c->pid))
		return usage_error(
		    cmd, "--pid expects a process id, not \"%s\"", arg);
	return 0;
}

static int
set_pid_file(ctl *c, const char *cmd, const char *as, const char *arg)
{
	c->pid_file = arg;
	return 0;
}

static int
set_wait(ctl *c, const char *cmd, const char *as, const char *arg)
{
	if (!ctl_parse_int(arg, 1, 3600000, &c->wait_ms))
		return usage_error(
		    cmd, "--wait expects milliseconds, not \"%s\"", arg);
	return 0;
}

static int
set_no_check(ctl *c, const char *cmd, const char *as, const char *arg)
{
	c->check = false;
	return 0;
}

static int
set_capacity(ctl *c, const char *cmd, const char *as, const char *arg)
{
	if (!ctl_parse_double(arg, &c->capacity) || c->capacity <= 0)
		return usage_error(cmd,
		    "--capacity expects requests per second > 0, not \"%s\"",
		    arg);
	return 0;
}

static int
set_max_overcommit(ctl *c, const char *cmd, const char *as, const char *arg)
{
	if (!ctl_parse_double(arg, &c->max_overcommit) ||
	    c->max_overcommit <= 0)
		return usage_error(cmd,
		    "--max-overcommit expects a ratio > 0 (e.g. 1.5), not "
		    "\"%s\"",
		    arg);
	return 0;
}

static int
set_admin(ctl *c, const char *cmd, const char *as, const char *arg)
{
	c->admin = arg;
	return 0;
}

static int
set_reason(ctl *c, const char *cmd, const char *as, const char *arg)
{
	c->reason = arg;
	return 0;
}

static int
set_as(ctl *c, const char *cmd, const char *as, const char *arg)
{
	if (arg[0] == '\0')
		return usage_error(cmd, "--as expects a name");
	c->as_name = arg;
	return 0;
}

static int
set_expect(ctl *c, const char *cmd, const char *as, const char *arg)
{
	size_t n = strlen(arg);
	if (n == 0 || n > 16 || strspn(arg, "0123456789abcdefABCDEF") != n)
		return usage_error(cmd,
		    "--expect expects a digest of 16 hex digits (allotctl "
		    "status, or the diff's), not \"%s\"",
		    arg);
	c->expect = arg;
	return 0;
}

static int
set_margin(ctl *c, const char *cmd, const char *as, const char *arg)
{
	if (!ctl_parse_double(arg, &c->margin) || c->margin <= 0 ||
	    c->margin > 1)
		return usage_error(cmd,
		    "--margin expects a share of the capacity, above 0 and "
		    "at most 1 (e.g. 0.8), not \"%s\"",
		    arg);
	return 0;
}

static int
set_limit(ctl *c, const char *cmd, const char *as, const char *arg)
{
	if (!ctl_parse_int(arg, 1, 1000000, &c->limit))
		return usage_error(cmd,
		    "%s expects a count from 1 to 1000000, not \"%s\"", as,
		    arg);
	return 0;
}

static int
set_sql(ctl *c, const char *cmd, const char *as, const char *arg)
{
	c->show_sql = true;
	return 0;
}

/* --help: parse() prints the usage, or the command's manual. */

static int
show_help(ctl *c, const char *cmd, const char *as, const char *arg)
{
	c->help = true;
	return CTL_DONE;
}

static int
show_version(ctl *c, const char *cmd, const char *as, const char *arg)
{
	printf("allotctl %s\n", ALLOT_VERSION_STRING);
	return CTL_DONE;
}

/* In the order the manuals list them; --help comes after the options of
 * check-config and audit, and --version after --help. */
static const ctl_option options[] = {
	{ "http", 0, "HOST:PORT", CTL_GLOBAL | CTL_ALL, CTL_COMMON,
	    "allotd's HTTP address (its --http option). Default: the\n"
	    "ALLOT_HTTP environment variable, else " DEFAULT_HTTP ".\n",
	    set_http },
	{ "timeout", 0, "MS", CTL_GLOBAL | CTL_ALL, CTL_COMMON | CTL_CHANGE,
	    "Give up on an HTTP exchange after MS milliseconds (default\n"
	    "3000).\n",
	    set_timeout },
	{ "pid", 0, "PID", CTL_RELOAD, CTL_RELOAD,
	    "allotd's process id (needed when allotd runs in another pid\n"
	    "namespace, e.g. a container).\n",
	    set_pid },
	{ "pid-file", 0, "FILE", CTL_RELOAD, CTL_RELOAD,
	    "Read the process id from FILE (first line).\n", set_pid_file },
	{ "wait", 0, "MS", CTL_RELOAD, CTL_RELOAD,
	    "How long to wait for allotd to report the reload (default\n"
	    "5000).\n",
	    set_wait },
	{ "no-check", 0, NULL, CTL_RELOAD, CTL_RELOAD,
	    "Do not validate the file first; allotd still refuses a bad\n"
	    "one, and its log (ALLOTD-RELOAD-FAIL) says why.\n",
	    set_no_check },
	{ "admin", 0, "PATH", CTL_CHANGE | CTL_MEMBER, CTL_CHANGE | CTL_MEMBER,
	    "allotd's admin socket (its --admin-socket). Default: the\n"
	    "ALLOT_ADMIN_SOCKET environment variable, else\n" DEFAULT_ADMIN
	    ".\n",
	    set_admin },
	{ "reason", 0, "TEXT", CTL_APPLY, CTL_APPLY,
	    "Why the change is made (required; one line). Recorded in the\n"
	    "audit table with the user the kernel names.\n",
	    set_reason },
	{ "as", 0, "NAME", CTL_APPLY, CTL_APPLY,
	    "Also record NAME (e.g. the reviewer or the person a deploy\n"
	    "job acts for), marked as claimed: it is not verified.\n",
	    set_as },
	{ "expect", 0, "DIGEST", CTL_APPLY, CTL_APPLY,
	    "Apply only if the config in force has this digest (the one a\n"
	    "reviewed diff was made against). Default: the digest of the\n"
	    "diff apply prints first.\n",
	    set_expect },
	{ "margin", 0, "X", CTL_CHANGE, CTL_CHANGE,
	    "Share of --capacity the ceiling should stay under (default\n"
	    "0.8); above it the sizing check prints a WARNING.\n",
	    set_margin },
	{ "capacity", 0, "RPS", CTL_CHECK_CONFIG | CTL_CHANGE,
	    CTL_CHECK_CONFIG | CTL_CHANGE,
	    "The protected service's tested capacity in requests/s; the\n"
	    "allocation and the correlated burst are also given as a\n"
	    "share of it.\n",
	    set_capacity },
	{ "max-overcommit", 0, "X", CTL_CHECK_CONFIG, CTL_CHECK_CONFIG,
	    "Exit 1 when the callers' rates exceed X times the ceiling\n"
	    "(e.g. 1.5), to hold quota changes to a policy in CI.\n",
	    set_max_overcommit },
	/* --limit means "rows" in both commands, with its own text. */
	{ "limit", 'n', "N", CTL_TOP_DENIED, CTL_TOP_DENIED,
	    "Print at most N rows (default 10).\n", set_limit },
	{ "limit", 0, "N", CTL_AUDIT, CTL_AUDIT,
	    "At most N rows per table (default 50).\n", set_limit },
	{ "sql", 0, NULL, CTL_AUDIT, CTL_AUDIT,
	    "Print each query before its table, to adapt in the sqlite3\n"
	    "shell.\n",
	    set_sql },
	{ "help", 'h', NULL, CTL_GLOBAL | CTL_ALL,
	    CTL_COMMON | CTL_CHECK_CONFIG | CTL_AUDIT | CTL_CHANGE |
	        CTL_MEMBER,
	    "Print this text.\n", show_help },
	{ "version", 'V', NULL, CTL_GLOBAL, CTL_GLOBAL, "Print the version.\n",
	    show_version },
};

static const size_t noptions = sizeof options / sizeof options[0];

/* getopt_long's codes: a flag with a short form answers to it (-h, -V);
 * every other option has 256 + its row, so that bad_option() can tell a
 * missing value from an unknown letter. A long name that two rows share
 * is listed once. */
static int
option_code(size_t i)
{
	const ctl_option *o = &options[i];
	return o->short_name != 0 && o->arg == NULL ? o->short_name :
	                                              256 + (int) i;
}

/* getopt_long's short options for the rows accepted in `where`: "+"
 * (stop at the command), then each letter, with ':' if it takes a
 * value. */
static void
build_shorts(unsigned where, char *shorts)
{
	*shorts++ = '+';
	for (size_t i = 0; i < noptions; i++) {
		if (options[i].short_name == 0 || !(options[i].cmds & where))
			continue;
		*shorts++ = (char) options[i].short_name;
		if (options[i].arg != NULL)
			*shorts++ = ':';
	}
	*shorts = '\0';
}

static void
build_longopts(struct option *lo)
{
	size_t n = 0;
	for (size_t i = 0; i < noptions; i++) {
		bool seen = false;
		for (size_t j = 0; j < n; j++)
			seen |= strcmp(lo[j].name, options[i].name) == 0;
		if (seen)
			continue;
		lo[n++] = (struct option) { options[i].name,
			options[i].arg ? required_argument : no_argument, NULL,
			option_code(i) };
	}
	lo[n] = (struct option) { NULL, 0, NULL, 0 };
}

/* The row getopt_long's answer `ch` stands for, accepted where `where`
 * is set; NULL when the option exists but is not accepted there. A
 * short form stands only for its own row (-n is top-denied's), a long
 * name for every row of that name. */
static const ctl_option *
find_option(int ch, unsigned where)
{
	const char *name = ch >= 256 ? options[ch - 256].name : NULL;
	for (size_t i = 0; i < noptions; i++) {
		const ctl_option *o = &options[i];
		bool same = name != NULL ? strcmp(o->name, name) == 0 :
		                           o->short_name == ch;
		if (same && (o->cmds & where) != 0)
			return o;
	}
	return NULL;
}

/* getopt_long's '?': an unknown option, or a known one whose value is
 * missing (`arg` is the word getopt stopped at). */
static int
bad_option(const char *cmd, const char *arg)
{
	bool short_value = false; /* a command's short option, as -n */
	for (size_t i = 0; i < noptions && cmd != NULL && optopt != 0; i++)
		short_value |= options[i].short_name == optopt &&
		    options[i].arg != NULL;
	if (optopt >= 256 || short_value)
		return usage_error(cmd, "\"%s\" needs a value", arg);
	if (optopt != 0)
		return usage_error(cmd, "unknown option \"-%c\"", optopt);
	return usage_error(cmd, "unknown option \"%s\"", arg);
}

/* Parse the options of `argv` for the command `cmd` (NULL: the options
 * before the command) into `c`; stops at the first word that is not an
 * option, at optind. 0, CTL_DONE, or an exit status. */
static int
parse_options(ctl *c, const struct command *cmd, int argc, char **argv)
{
	struct option lo[sizeof options / sizeof options[0] + 1];
	char shorts[2 * sizeof options / sizeof options[0] + 2];
	build_longopts(lo);
	build_shorts(cmd ? CTL_ALL : CTL_GLOBAL, shorts);
	const char *name = cmd ? cmd->name : NULL;
	unsigned where = cmd ? cmd->bit : CTL_GLOBAL;
	int ch, li = -1;
	opterr = 0;
	optind = 0; /* GNU: start over on a new vector */
	while ((ch = getopt_long(argc, argv, shorts, lo, &li)) != -1) {
		if (ch == '?')
			return bad_option(name, argv[optind - 1]);
		char as[32];
		if (li >= 0)
			snprintf(as, sizeof as, "--%s", lo[li].name);
		else
			snprintf(as, sizeof as, "-%c", ch);
		li = -1;
		const ctl_option *o = find_option(ch, where);
		if (o == NULL && cmd == NULL)
			return usage_error(NULL,
			    "\"%s\" goes after the command", argv[optind - 1]);
		if (o == NULL)
			return usage_error(
			    name, "%s does not take \"%s\"", name, as);
		int rc = o->set(c, name, as, optarg);
		if (rc != 0)
			return rc;
	}
	return 0;
}

/* ------------------------------------------------------------------ */
/* main                                                                */
/* ------------------------------------------------------------------ */

/* `allotctl help [COMMAND]`. */
static int
help_command(int argc, char **argv)
{
	if (argc < 2) {
		ctl_usage(stdout, options, noptions);
		return 0;
	}
	const struct command *cmd = find_command(argv[1]);
	if (!ctl_manual(
	        stdout, argv[1], cmd ? cmd->bit : 0, options, noptions))
		return usage_error(NULL, "no command \"%s\"", argv[1]);
	return 0;
}

/* Parse the command line into `c` and pick the command. 0 and the
 * command, CTL_DONE, or an exit status. */
static int
parse(ctl *c, int argc, char **argv, const struct command **ret_cmd)
{
	int rc = parse_options(c, NULL, argc, argv);
	if (c->help)
		ctl_usage(stdout, options, noptions);
	if (rc != 0)
		return rc;
	if (optind >= argc)
		return usage_error(NULL, "no command given");
	argc -= optind;
	argv += optind;
	if (strcmp(argv[0], "help") == 0) {
		rc = help_command(argc, argv);
		return rc == 0 ? CTL_DONE : rc;
	}
	const struct command *cmd = find_command(argv[0]);
	if (cmd == NULL)
		return usage_error(NULL, "no command \"%s\"", argv[0]);
	c->limit = cmd->limit;
	/* The command's own options; the common ones are accepted here
	 * too. */
	rc = parse_options(c, cmd, argc, argv);
	/* Options may follow the arguments too (allotctl apply FILE
	 * --reason TEXT): each run of them is parsed with the word before
	 * it standing in for the command name. */
	char **pos = ctl_calloc((size_t) argc + 1, sizeof *pos);
	int npos = 0;
	for (int i = optind; rc == 0 && !c->help && i < argc;) {
		if (argv[i][0] == '-' && argv[i][1] != '\0') {
			rc = parse_options(c, cmd, argc - i + 1, argv + i - 1);
			i += optind - 1;
		} else {
			pos[npos++] = argv[i++];
		}
	}
	if (c->help)
		ctl_manual(stdout, cmd->name, cmd->bit, options, noptions);
	if (rc != 0) {
		free(pos);
		return rc;
	}
	c->npos = npos;
	c->pos = pos;
	if (c->pid != 0 && c->pid_file != NULL)
		return usage_error(
		    cmd->name, "give --pid or --pid-file, not both");
	if (c->npos < cmd->min_args)
		return usage_error(cmd->name, "%s", cmd->too_few);
	if (c->npos > cmd->max_args)
		return usage_error(cmd->name, "%s",
		    cmd->too_many ? cmd->too_many : cmd->too_few);
	*ret_cmd = cmd;
	return 0;
}

int
main(int argc, char **argv)
{
	ctl c = { .http = DEFAULT_HTTP,
		.timeout_ms = DEFAULT_TIMEOUT_MS,
		.wait_ms = DEFAULT_WAIT_MS,
		.check = true,
		.admin = DEFAULT_ADMIN,
		.margin = DEFAULT_MARGIN };
	const char *env = getenv("ALLOT_HTTP");
	if (env != NULL && *env != '\0')
		c.http = env;
	env = getenv("ALLOT_ADMIN_SOCKET");
	if (env != NULL && *env != '\0')
		c.admin = env;
	signal(SIGPIPE, SIG_IGN);

	const struct command *cmd = NULL;
	int rc = parse(&c, argc, argv, &cmd);
	if (rc == 0)
		rc = cmd->run(&c);
	free(c.pos); /* the arguments, gathered by parse() */
	return rc == CTL_DONE ? 0 : rc;
}
