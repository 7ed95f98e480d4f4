/* SPDX-License-Identifier: MIT */
/*
 * allotctl: the operator's command line for allot. This file reads the
 * command line and runs one command: the options are one table (each
 * row: its names, its value, which commands take it, its manual text and
 * how it is stored) that drives the parse (common/opts.h) and the
 * manuals alike, and the commands are another. The commands themselves live
 * one family to a file: status, replicas, quotas, shares and top-denied read a
 * running allotd's GET /status (allotctl_status.c) and never change anything;
 * reload signals allotd on its own host (allotctl_reload.c);
 * check-config validates and sizes a quota file (allotctl_config.c) and
 * audit queries store files (allotctl_audit.c), both without an allotd;
 * diff and apply review and make a quota change through allotd's admin
 * socket (allotctl_apply.c).
 */
#include <float.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>

#include "allotctl.h"
#include "opts.h"

#define CTL_ONLINE                                             \
	(CTL_STATUS | CTL_REPLICAS | CTL_QUOTAS | CTL_SHARES | \
	    CTL_TOP_DENIED | CTL_RELOAD)
#define CTL_ALL                                                             \
	(CTL_ONLINE | CTL_CHECK_CONFIG | CTL_AUDIT | CTL_DIFF | CTL_APPLY | \
	    CTL_MEMBER)
#define CTL_CHANGE (CTL_DIFF | CTL_APPLY)
/* The commands that answer --json. */
#define CTL_JSON CTL_ALL

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
set_timeout(const allot__opt_use *u, void *dst)
{
	long v;
	if (!ctl_parse_int(u->arg, 1, 3600000, &v))
		return allot__opts_fail(u,
		    "--timeout expects milliseconds (1 to 3600000), not "
		    "\"%s\"",
		    u->arg);
	((ctl *) dst)->timeout_ms = (int) v;
	return ALLOT__OPTS_OK;
}

static int
set_pid(const allot__opt_use *u, void *dst)
{
	if (!ctl_parse_int(u->arg, 1, INT_MAX, &((ctl *) dst)->pid))
		return allot__opts_fail(
		    u, "--pid expects a process id, not \"%s\"", u->arg);
	return ALLOT__OPTS_OK;
}

static int
set_wait(const allot__opt_use *u, void *dst)
{
	if (!ctl_parse_int(u->arg, 1, 3600000, &((ctl *) dst)->wait_ms))
		return allot__opts_fail(
		    u, "--wait expects milliseconds, not \"%s\"", u->arg);
	return ALLOT__OPTS_OK;
}

/* A number above 0 (and at most `max`), or the message. */
static int
set_positive(
    const allot__opt_use *u, double max, double *ret, const char *expected)
{
	if (!allot__opts_double(u->arg, 0, max, ret) || *ret <= 0)
		return allot__opts_fail(
		    u, "%s expects %s, not \"%s\"", u->as, expected, u->arg);
	return ALLOT__OPTS_OK;
}

static int
set_capacity(const allot__opt_use *u, void *dst)
{
	return set_positive(
	    u, DBL_MAX, &((ctl *) dst)->capacity, "requests per second > 0");
}

static int
set_max_overcommit(const allot__opt_use *u, void *dst)
{
	return set_positive(u, DBL_MAX, &((ctl *) dst)->max_overcommit,
	    "a ratio > 0 (e.g. 1.5)");
}

static int
set_margin(const allot__opt_use *u, void *dst)
{
	return set_positive(u, 1, &((ctl *) dst)->margin,
	    "a share of the capacity, above 0 and at most 1 (e.g. 0.8)");
}

static int
set_as(const allot__opt_use *u, void *dst)
{
	if (u->arg[0] == '\0')
		return allot__opts_fail(u, "--as expects a name");
	((ctl *) dst)->as_name = u->arg;
	return ALLOT__OPTS_OK;
}

static int
set_expect(const allot__opt_use *u, void *dst)
{
	size_t n = strlen(u->arg);
	if (n == 0 || n > 16 || strspn(u->arg, "0123456789abcdefABCDEF") != n)
		return allot__opts_fail(u,
		    "--expect expects a digest of 16 hex digits (allotctl "
		    "status, or the diff's), not \"%s\"",
		    u->arg);
	((ctl *) dst)->expect = u->arg;
	return ALLOT__OPTS_OK;
}

static int
set_limit(const allot__opt_use *u, void *dst)
{
	if (!ctl_parse_int(u->arg, 1, 1000000, &((ctl *) dst)->limit))
		return allot__opts_fail(u,
		    "%s expects a count from 1 to 1000000, not \"%s\"", u->as,
		    u->arg);
	return ALLOT__OPTS_OK;
}

/* --help: parse() prints the usage, or the command's manual. */
static int
show_help(const allot__opt_use *u, void *dst)
{
	((ctl *) dst)->help = true;
	return ALLOT__OPTS_DONE;
}

static int
show_version(const allot__opt_use *u, void *dst)
{
	printf("allotctl %s\n", ALLOT_VERSION_STRING);
	return ALLOT__OPTS_DONE;
}

#define AT(f) offsetof(ctl, f)

/* In the order the manuals list them; --help comes after the options of
 * check-config and audit, and --version after --help. `where`: the
 * commands that take it (CTL_GLOBAL: before the command); `shown`: the
 * manuals that list it. */
static const allot__opt rows[] = {
	{ "http", 0, ALLOT__OPT_STR, "HOST:PORT",
	    "allotd's HTTP address (its --http option). Default: the\n"
	    "ALLOT_HTTP environment variable, else " DEFAULT_HTTP ".\n",
	    .off = AT(http), .where = CTL_GLOBAL | CTL_ALL,
	    .shown = CTL_COMMON },
	{ "timeout", 0, ALLOT__OPT_CALL, "MS",
	    "Give up on an HTTP exchange after MS milliseconds (default\n"
	    "3000).\n",
	    .set = set_timeout, .where = CTL_GLOBAL | CTL_ALL,
	    .shown = CTL_COMMON | CTL_CHANGE },
	{ "pid", 0, ALLOT__OPT_CALL, "PID",
	    "allotd's process id (needed when allotd runs in another pid\n"
	    "namespace, e.g. a container).\n",
	    .set = set_pid, .where = CTL_RELOAD, .shown = CTL_RELOAD },
	{ "pid-file", 0, ALLOT__OPT_STR, "FILE",
	    "Read the process id from FILE (first line).\n",
	    .off = AT(pid_file), .where = CTL_RELOAD, .shown = CTL_RELOAD },
	{ "wait", 0, ALLOT__OPT_CALL, "MS",
	    "How long to wait for allotd to report the reload (default\n"
	    "5000).\n",
	    .set = set_wait, .where = CTL_RELOAD, .shown = CTL_RELOAD },
	{ "no-check", 0, ALLOT__OPT_FALSE, NULL,
	    "Do not validate the file first; allotd still refuses a bad\n"
	    "one, and its log (ALLOTD-RELOAD-FAIL) says why.\n",
	    .off = AT(check), .where = CTL_RELOAD, .shown = CTL_RELOAD },
	{ "admin", 0, ALLOT__OPT_STR, "PATH|URL",
	    "allotd's admin socket (its --admin-socket), or the URL\n"
	    "https://HOST:PORT of its --admin-listen (mutual TLS, from\n"
	    "another host). Default: the ALLOT_ADMIN environment\n"
	    "variable, else ALLOT_ADMIN_SOCKET, else " DEFAULT_ADMIN ".\n",
	    .off = AT(admin), .where = CTL_CHANGE | CTL_MEMBER,
	    .shown = CTL_CHANGE | CTL_MEMBER },
	{ "admin-cert", 0, ALLOT__OPT_STR, "FILE",
	    "With an https:// --admin: this client's certificate (PEM),\n"
	    "its key in the same file unless --admin-key; allotd records\n"
	    "its SPIFFE ID as the change's author. Default: the\n"
	    "ALLOT_ADMIN_CERT environment variable.\n",
	    .off = AT(admin_cert), .where = CTL_CHANGE | CTL_MEMBER,
	    .shown = CTL_CHANGE | CTL_MEMBER },
	{ "admin-key", 0, ALLOT__OPT_STR, "FILE",
	    "Its private key, when not in --admin-cert's file (default:\n"
	    "ALLOT_ADMIN_KEY).\n",
	    .off = AT(admin_key), .where = CTL_CHANGE | CTL_MEMBER,
	    .shown = CTL_CHANGE | CTL_MEMBER },
	{ "admin-ca", 0, ALLOT__OPT_STR, "FILE",
	    "The CA allotd's certificate must chain to (default:\n"
	    "ALLOT_ADMIN_CA, else the system's CAs).\n",
	    .off = AT(admin_ca), .where = CTL_CHANGE | CTL_MEMBER,
	    .shown = CTL_CHANGE | CTL_MEMBER },
	{ "json", 0, ALLOT__OPT_TRUE, NULL,
	    "Print the answer as one JSON document on stdout instead of\n"
	    "text: allotd's own (status; diff, apply and member as its\n"
	    "admin API answers), an array of the rows the text shows\n"
	    "(each with its service; audit: each query's rows), or the\n"
	    "outcome (reload, check-config). Exit statuses as without it.\n",
	    .off = AT(json), .where = CTL_JSON, .shown = CTL_JSON },
	{ "reason", 0, ALLOT__OPT_STR, "TEXT",
	    "Why the change is made (required; one line). Recorded in the\n"
	    "audit table with the user the kernel names.\n",
	    .off = AT(reason), .where = CTL_APPLY, .shown = CTL_APPLY },
	{ "as", 0, ALLOT__OPT_CALL, "NAME",
	    "Also record NAME (e.g. the reviewer or the person a deploy\n"
	    "job acts for), marked as claimed: it is not verified.\n",
	    .set = set_as, .where = CTL_APPLY, .shown = CTL_APPLY },
	{ "expect", 0, ALLOT__OPT_CALL, "DIGEST",
	    "Apply only if the config in force has this digest (the one a\n"
	    "reviewed diff was made against). Default: the digest of the\n"
	    "diff apply prints first.\n",
	    .set = set_expect, .where = CTL_APPLY, .shown = CTL_APPLY },
	{ "margin", 0, ALLOT__OPT_CALL, "X",
	    "Share of --capacity the ceiling should stay under (default\n"
	    "0.8); above it the sizing check prints a WARNING.\n",
	    .set = set_margin, .where = CTL_CHANGE, .shown = CTL_CHANGE },
	{ "capacity", 0, ALLOT__OPT_CALL, "RPS",
	    "The protected service's tested capacity in requests/s; the\n"
	    "allocation and the correlated burst are also given as a\n"
	    "share of it.\n",
	    .set = set_capacity, .where = CTL_CHECK_CONFIG | CTL_CHANGE,
	    .shown = CTL_CHECK_CONFIG | CTL_CHANGE },
	{ "max-overcommit", 0, ALLOT__OPT_CALL, "X",
	    "Exit 1 when the callers' rates exceed X times the ceiling\n"
	    "(e.g. 1.5), to hold quota changes to a policy in CI.\n",
	    .set = set_max_overcommit, .where = CTL_CHECK_CONFIG,
	    .shown = CTL_CHECK_CONFIG },
	/* --limit means "rows" in both commands, with its own text. */
	{ "limit", 'n', ALLOT__OPT_CALL, "N",
	    "Print at most N rows (default 10).\n", .set = set_limit,
	    .where = CTL_TOP_DENIED, .shown = CTL_TOP_DENIED },
	{ "limit", 0, ALLOT__OPT_CALL, "N",
	    "At most N rows per table (default 50).\n", .set = set_limit,
	    .where = CTL_AUDIT, .shown = CTL_AUDIT },
	{ "sql", 0, ALLOT__OPT_TRUE, NULL,
	    "Print each query before its table, to adapt in the sqlite3\n"
	    "shell.\n",
	    .off = AT(show_sql), .where = CTL_AUDIT, .shown = CTL_AUDIT },
	{ "help", 'h', ALLOT__OPT_CALL, NULL, "Print this text.\n",
	    .set = show_help, .where = CTL_GLOBAL | CTL_ALL,
	    .shown = CTL_COMMON | CTL_CHECK_CONFIG | CTL_AUDIT | CTL_CHANGE |
	        CTL_MEMBER },
	{ "version", 'V', ALLOT__OPT_CALL, NULL, "Print the version.\n",
	    .set = show_version, .where = CTL_GLOBAL, .shown = CTL_GLOBAL },
};

static const allot__opts table = {
	.prog = "allotctl",
	.rows = rows,
	.n = sizeof rows / sizeof rows[0],
	.style = ALLOT__OPTS_MAN,
	.try_help = "Try 'allotctl --help'.",
};

/* ------------------------------------------------------------------ */
/* main                                                                */
/* ------------------------------------------------------------------ */

/* `allotctl help [COMMAND]`. */
static int
help_command(int argc, char **argv)
{
	if (argc < 2) {
		ctl_usage(stdout, &table);
		return 0;
	}
	const struct command *cmd = find_command(argv[1]);
	if (!ctl_manual(stdout, argv[1], cmd ? cmd->bit : 0, &table))
		return usage_error(NULL, "no command \"%s\"", argv[1]);
	return 0;
}

/* The command's options and arguments, in any order (allotctl apply
 * FILE --reason TEXT); argv[0] is the command. 0, CTL_DONE, or an exit
 * status. */
static int
parse_command(ctl *c, const struct command *cmd, int argc, char **argv)
{
	char try[64];
	snprintf(try, sizeof try, "Try 'allotctl help %s'.", cmd->name);
	char **pos = ctl_calloc((size_t) argc + 1, sizeof *pos);
	allot__opts_run run = { .where = cmd->bit,
		.cmd = cmd->name,
		.try_help = try,
		.args = pos };
	c->limit = cmd->limit;
	int rc = allot__opts_parse(&table, &run, argc, argv, c);
	if (c->help)
		ctl_manual(stdout, cmd->name, cmd->bit, &table);
	c->npos = run.nargs;
	c->pos = pos; /* freed by main() */
	if (rc != ALLOT__OPTS_OK)
		return rc == ALLOT__OPTS_DONE ? CTL_DONE : rc;
	if (c->pid != 0 && c->pid_file != NULL)
		return usage_error(
		    cmd->name, "give --pid or --pid-file, not both");
	if (c->npos < cmd->min_args)
		return usage_error(cmd->name, "%s", cmd->too_few);
	if (c->npos > cmd->max_args)
		return usage_error(cmd->name, "%s",
		    cmd->too_many ? cmd->too_many : cmd->too_few);
	return 0;
}

/* Parse the command line into `c` and pick the command: the options
 * before the command, then the command's. 0 and the command, CTL_DONE,
 * or an exit status. */
static int
parse(ctl *c, int argc, char **argv, const struct command **ret_cmd)
{
	allot__opts_run run = { .where = CTL_GLOBAL, .in_order = true };
	int rc = allot__opts_parse(&table, &run, argc, argv, c);
	if (c->help)
		ctl_usage(stdout, &table);
	if (rc != ALLOT__OPTS_OK)
		return rc == ALLOT__OPTS_DONE ? CTL_DONE : rc;
	if (run.next >= argc)
		return usage_error(NULL, "no command given");
	argc -= run.next;
	argv += run.next;
	if (strcmp(argv[0], "help") == 0) {
		rc = help_command(argc, argv);
		return rc == 0 ? CTL_DONE : rc;
	}
	const struct command *cmd = find_command(argv[0]);
	if (cmd == NULL)
		return usage_error(NULL, "no command \"%s\"", argv[0]);
	rc = parse_command(c, cmd, argc, argv);
	if (rc == 0)
		*ret_cmd = cmd;
	return rc;
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
	env = getenv("ALLOT_ADMIN");
	if (env != NULL && *env != '\0')
		c.admin = env;
	env = getenv("ALLOT_ADMIN_CERT");
	c.admin_cert = env != NULL && *env != '\0' ? env : NULL;
	env = getenv("ALLOT_ADMIN_KEY");
	c.admin_key = env != NULL && *env != '\0' ? env : NULL;
	env = getenv("ALLOT_ADMIN_CA");
	c.admin_ca = env != NULL && *env != '\0' ? env : NULL;
	signal(SIGPIPE, SIG_IGN);

	const struct command *cmd = NULL;
	int rc = parse(&c, argc, argv, &cmd);
	if (rc == 0)
		rc = cmd->run(&c);
	free(c.pos); /* the arguments, gathered by parse() */
	return rc == CTL_DONE ? 0 : rc;
}
