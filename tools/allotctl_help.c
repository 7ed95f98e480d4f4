/* SPDX-License-Identifier: MIT */
/*
 * allotctl's manuals: `allotctl --help` and one page per command
 * (`allotctl help COMMAND`, the same as `allotctl COMMAND --help`). The
 * prose is here; the OPTIONS and COMMON OPTIONS sections are printed from
 * the option table that also drives the parser (allotctl.c), so an
 * option cannot be accepted without being documented, or the reverse.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "allotctl.h"

#define EXIT_TEXT                                                             \
	"EXIT STATUS\n"                                                       \
	"    0 success; 1 the command failed (see its description); 2 bad\n"  \
	"    command line; 3 allotd could not be reached or did not answer\n" \
	"    like allotd.\n"

/* One manual page: `head` (NAME to the end of the description), the
 * options from the table, then `tail` (EXIT STATUS, EXAMPLE). A command
 * that reads allotd (`online`) lists the common options as well. */
static const struct manual {
	const char *name;
	const char *summary;
	bool online;
	const char *head;
	const char *tail;
} manuals[] = {
	{ "status", "the coordinator's state at a glance", true,
	    "NAME\n"
	    "    allotctl status - the coordinator's state at a glance\n"
	    "\n"
	    "SYNOPSIS\n"
	    "    allotctl [--http HOST:PORT] status\n"
	    "\n"
	    "DESCRIPTION\n"
	    "    Reads GET /status and prints allotd's version and pid, the "
	    "quota\n"
	    "    config in force (path, epoch, digest, when it was loaded), "
	    "the\n"
	    "    number of quotas and the global ceiling, the protocol "
	    "settings\n"
	    "    (lease, sync interval, expiry), the store's health "
	    "(commits,\n"
	    "    failed commits with the last SQLite error code, rows waiting "
	    "to\n"
	    "    be written, rows dropped), and per service its live replicas "
	    "and\n"
	    "    the tokens per second admitted and denied over the last "
	    "whole\n"
	    "    second, with the share of the ceiling in use.\n"
	    "\n"
	    "    \"store: has had failures\" means a group commit failed at "
	    "some\n"
	    "    point since allotd started; rate limiting is not affected "
	    "(see\n"
	    "    docs/operations.md, \"Failure behaviour of the store\").\n"
	    "\n",
	    EXIT_TEXT "\n"
	              "EXAMPLE\n"
	              "    allotctl --http 127.0.0.1:7480 status\n" },
	{ "replicas", "the live replicas of every service", true,
	    "NAME\n"
	    "    allotctl replicas - the live replicas of every service\n"
	    "\n"
	    "SYNOPSIS\n"
	    "    allotctl [--http HOST:PORT] replicas [SERVICE]\n"
	    "\n"
	    "DESCRIPTION\n"
	    "    One row per live session: SERVICE, REPLICA (the agent's\n"
	    "    replica_id), SESSION, HOST, AGENT (version), PID, LAST_SEQ "
	    "(the\n"
	    "    last sync accepted), SILENT_MS (time since its last sync; a\n"
	    "    replica silent for expiry-intervals x interval is expired) "
	    "and\n"
	    "    STATE: \"live\", or \"restored (placeholder)\" for a "
	    "replica\n"
	    "    that was live when allotd last stopped and has not "
	    "registered\n"
	    "    again yet (it still counts toward the replica count). With\n"
	    "    SERVICE, only that service's replicas.\n"
	    "\n",
	    EXIT_TEXT },
	{ "quotas", "per service and quota: usage against the quota", true,
	    "NAME\n"
	    "    allotctl quotas - per service and quota: usage against the "
	    "quota\n"
	    "\n"
	    "SYNOPSIS\n"
	    "    allotctl [--http HOST:PORT] quotas [SERVICE]\n"
	    "\n"
	    "DESCRIPTION\n"
	    "    One row per service and quota: PRIORITY (the quota's "
	    "class),\n"
	    "    RATE/S and BURST (the quota R and B), ADMITTED/S and "
	    "DENIED/S\n"
	    "    (tokens over the last whole second, summed over the "
	    "replicas),\n"
	    "    UTIL (admitted / R), GRANTED/S (the sum of the shares the\n"
	    "    replicas were sent; at most R), HOLDERS (replicas holding a\n"
	    "    share / live replicas), DEMAND/S (what the replicas "
	    "would\n"
	    "    admit if allowed), SHADOW/S (for a quota in shadow, what "
	    "it\n"
	    "    admitted that enforcing would have denied; never in "
	    "DENIED/S)\n"
	    "    and CANDIDATE (the quota's candidate rate and the share of "
	    "the\n"
	    "    offered tokens it would have denied since it was set). "
	    "Before\n"
	    "    any service has registered it lists the configured quotas\n"
	    "    instead (QUOTA, PRIORITY, RATE/S, BURST, MODE: enforce,\n"
	    "    shadow, closed or unlimited, CANDIDATE).\n"
	    "\n",
	    EXIT_TEXT },
	{ "shares", "each replica's share of one caller's quota", true,
	    "NAME\n"
	    "    allotctl shares - each replica's share of one caller's "
	    "quota\n"
	    "\n"
	    "SYNOPSIS\n"
	    "    allotctl [--http HOST:PORT] shares CALLER\n"
	    "\n"
	    "DESCRIPTION\n"
	    "    For every service whose replicas enforce the quota of "
	    "CALLER,\n"
	    "    a line with the quota and the sum of the shares held, then "
	    "one\n"
	    "    row per replica: RATE/S and BURST (the share it was last "
	    "sent\n"
	    "    and enforces), TARGET/S (what the allocator wants it to "
	    "hold;\n"
	    "    a share grows to its target only out of the quota's "
	    "headroom,\n"
	    "    so the sum never exceeds the quota) and OF_QUOTA.\n"
	    "\n"
	    "    CALLER is the quota's identity as in the quota file (e.g.\n"
	    "    spiffe://prod.example.internal/ns/payments/sa/checkout), or\n"
	    "    \"default\", or any unambiguous part of an identity: its "
	    "last\n"
	    "    path segment (\"checkout\") or a substring.\n"
	    "\n",
	    EXIT_TEXT
	    "    Exit status 1 also when no quota, or more than one, matches\n"
	    "    CALLER; the quotas are listed.\n" },
	{ "top-denied", "the callers being denied, most first", true,
	    "NAME\n"
	    "    allotctl top-denied - the callers being denied, most first\n"
	    "\n"
	    "SYNOPSIS\n"
	    "    allotctl [--http HOST:PORT] top-denied [-n N]\n"
	    "\n"
	    "DESCRIPTION\n"
	    "    Every service and quota with denials since allotd started,\n"
	    "    ordered by DENIED/S (tokens denied over the last whole "
	    "second),\n"
	    "    then by DENIED_TOTAL. DENIED_NOW is the share of the "
	    "requested\n"
	    "    tokens denied in the last second, DENIED_ALL the same since\n"
	    "    allotd started. A caller denied steadily has reached its "
	    "quota:\n"
	    "    either it needs a larger one or it is misbehaving. For "
	    "history\n"
	    "    beyond allotd's uptime, use allotctl audit (the v_denied "
	    "view).\n"
	    "\n",
	    EXIT_TEXT },
	{ "reload", "make allotd re-read its quota file", true,
	    "NAME\n"
	    "    allotctl reload - make allotd re-read its quota file\n"
	    "\n"
	    "SYNOPSIS\n"
	    "    allotctl [--http HOST:PORT] reload [--pid PID | --pid-file "
	    "FILE]\n"
	    "             [--wait MS] [--no-check]\n"
	    "\n"
	    "DESCRIPTION\n"
	    "    Validates the quota file allotd uses (the path in /status,\n"
	    "    relative to allotd's working directory) with the same "
	    "loader,\n"
	    "    then sends allotd SIGHUP and waits until allotd reports the\n"
	    "    reload in /metrics. Prints the new epoch and digest, or "
	    "that\n"
	    "    the file is unchanged (same digest: same epoch, nothing sent "
	    "to\n"
	    "    the agents). A file that does not validate is reported with "
	    "the\n"
	    "    loader's FILE:LINE:COL message and not signalled at all; "
	    "allotd\n"
	    "    keeps the config in force.\n"
	    "\n"
	    "AUTHENTICATION\n"
	    "    allotd's HTTP endpoints are read-only: nobody who can reach "
	    "the\n"
	    "    HTTP port can change anything. A reload is a signal, and "
	    "the\n"
	    "    kernel lets only allotd's own user (or root) signal it; the\n"
	    "    quota file itself is whatever that user may write. So "
	    "reload\n"
	    "    runs on allotd's host, as allotd's user or root. The process "
	    "is\n"
	    "    the one given with --pid or --pid-file, or else the pid "
	    "allotd\n"
	    "    reports in /status (only when --http is a loopback "
	    "address);\n"
	    "    allotctl refuses to signal a process whose name is not\n"
	    "    \"allotd\", or, with a loopback --http, one that is not the\n"
	    "    allotd answering there.\n"
	    "\n",
	    EXIT_TEXT "    Exit status 1 when the file is invalid, allotd "
	              "rejected it, the\n"
	              "    process may not be signalled, or no reload was "
	              "reported in time.\n"
	              "\n"
	              "EXAMPLE\n"
	              "    sudo -u allot allotctl reload\n" },
	{ "check-config", "validate a quota file and size it, offline", false,
	    "NAME\n"
	    "    allotctl check-config - validate a quota file and size it, "
	    "offline\n"
	    "\n"
	    "SYNOPSIS\n"
	    "    allotctl check-config FILE [--capacity RPS] "
	    "[--max-overcommit X]\n"
	    "\n"
	    "DESCRIPTION\n"
	    "    Loads FILE with the loader allotd and the agents use, so a "
	    "file\n"
	    "    that passes here loads there (for quota changes reviewed in\n"
	    "    CI). An invalid file prints the loader's message, in the "
	    "form\n"
	    "    FILE:LINE:COL: what was wrong, expected what, and exits 1.\n"
	    "\n"
	    "    A valid file prints its digest and every quota with its "
	    "class,\n"
	    "    rate, burst and FIRST_SECOND (rate + burst: the most the "
	    "caller\n"
	    "    can be admitted in one second, starting from a full "
	    "bucket),\n"
	    "    then the sizing arithmetic:\n"
	    "\n"
	    "    allocation  the callers' rates added up. Against the global\n"
	    "                ceiling this is the overcommit: 900 tokens/s of\n"
	    "                callers under an 800 ceiling is 1.12x. "
	    "Overcommit is\n"
	    "                normal (callers rarely peak together); the "
	    "ceiling\n"
	    "                and the shed order decide who gives way when "
	    "they do.\n"
	    "    burst       the worst case if every caller bursts at the "
	    "same\n"
	    "                moment (a deploy, a cron job firing "
	    "everywhere):\n"
	    "                sum(rate + burst) tokens in the first second. "
	    "Ten\n"
	    "                callers at 140/s with a burst of 280 give 10 x "
	    "420 =\n"
	    "                4200 in that second, twice a service tested at "
	    "2000\n"
	    "                requests/s. Size bursts for how likely callers "
	    "are to\n"
	    "                burst together, not for one caller alone.\n"
	    "\n"
	    "    The default quota is listed but not added up: it is one "
	    "small\n"
	    "    bucket when shared, and one per unknown caller when not.\n"
	    "\n",
	    "EXIT STATUS\n"
	    "    0 the file is valid (and within --max-overcommit); 1 it is "
	    "not,\n"
	    "    or cannot be read; 2 bad command line.\n"
	    "\n"
	    "EXAMPLE\n"
	    "    allotctl check-config --capacity 2000 "
	    "/etc/allot/quotas.yaml\n" },
	{ "diff", "what a quota file would change, per quota", false,
	    "NAME\n"
	    "    allotctl diff - what a quota file would change, per quota\n"
	    "\n"
	    "SYNOPSIS\n"
	    "    allotctl diff FILE [--admin PATH] [--capacity RPS] "
	    "[--margin X]\n"
	    "\n"
	    "DESCRIPTION\n"
	    "    Loads FILE with the loader allotd uses (an invalid file is\n"
	    "    reported as FILE:LINE:COL and never sent), asks allotd on "
	    "its\n"
	    "    admin socket what it would change against the config in "
	    "force,\n"
	    "    and prints per quota: + added, - removed, ~ changed, with "
	    "the\n"
	    "    quota before and after (rate in its unit, burst, priority,\n"
	    "    shadow, candidate, fallback, owner, reason, expected peak,\n"
	    "    labels) and what moved; the global ceiling, the endpoint\n"
	    "    weights and the shed order appear as (global_ceiling),\n"
	    "    (endpoint_weights) and (shed_order). Then check-config's\n"
	    "    sizing of FILE, and with --capacity the margin check: a\n"
	    "    WARNING when the ceiling (or, without one, the callers' "
	    "total)\n"
	    "    is above capacity x margin. Nothing is applied.\n"
	    "\n",
	    "EXIT STATUS\n"
	    "    0 the diff was printed; 1 FILE is invalid or allotd refused "
	    "it;\n"
	    "    2 bad command line; 3 the admin socket could not be "
	    "reached.\n"
	    "\n"
	    "EXAMPLE\n"
	    "    allotctl diff --capacity 2000 "
	    "/etc/allot/quotas.next.yaml\n" },
	{ "apply", "apply a quota file, with who and why", false,
	    "NAME\n"
	    "    allotctl apply - apply a quota file, with who and why\n"
	    "\n"
	    "SYNOPSIS\n"
	    "    allotctl apply FILE --reason TEXT [--as NAME] [--expect "
	    "DIGEST]\n"
	    "                   [--admin PATH|URL [--admin-cert FILE] "
	    "[--admin-ca FILE]]\n"
	    "                   [--capacity RPS] [--margin X]\n"
	    "\n"
	    "DESCRIPTION\n"
	    "    Prints what allotctl diff prints, then sends FILE to allotd "
	    "on\n"
	    "    its admin socket with the digest the diff was made against:\n"
	    "    if the config in force moved in between, allotd refuses "
	    "(run\n"
	    "    it again and review the new diff). allotd validates FILE "
	    "again,\n"
	    "    writes it over its quota file atomically (a restart keeps "
	    "it),\n"
	    "    installs it as a new epoch (the agents take it on their "
	    "next\n"
	    "    sync), records one row per changed quota in the audit table\n"
	    "    (v_quota_changes: who, reason, before, after), commits it, "
	    "and\n"
	    "    answers. allotctl prints the new epoch and digest. A file "
	    "with\n"
	    "    the digest in force changes nothing.\n"
	    "\n"
	    "AUTHENTICATION\n"
	    "    Who may: whoever may open the admin socket (allotd's user, "
	    "or\n"
	    "    the members of allotd's --admin-group). Who did: allotd "
	    "asks\n"
	    "    the kernel which user is on the other end (SO_PEERCRED) "
	    "and\n"
	    "    records that name; --as adds a name marked as claimed.\n"
	    "    From another host, --admin https://HOST:PORT (allotd's\n"
	    "    --admin-listen) with --admin-cert and --admin-ca: allotd\n"
	    "    lets in the certificates whose SPIFFE ID its --admin-allow\n"
	    "    names and records that ID; any other gets 401 or 403.\n"
	    "\n",
	    "EXIT STATUS\n"
	    "    0 applied, or unchanged; 1 FILE is invalid, the config in "
	    "force\n"
	    "    moved since the diff (--expect), or allotd could not write "
	    "or\n"
	    "    install it (nothing changed); 2 bad command line (--reason\n"
	    "    missing); 3 the admin socket could not be reached or allotd "
	    "is\n"
	    "    stopping.\n"
	    "\n"
	    "EXAMPLE\n"
	    "    sudo -u allot allotctl apply quotas.yaml --reason \"Q3 "
	    "launch:\n"
	    "        checkout to 650/s (JIRA-123)\" --as alice\n" },
	{ "member", "the coordinator cluster's members", false,
	    "NAME\n"
	    "    allotctl member - the coordinator cluster's members\n"
	    "\n"
	    "SYNOPSIS\n"
	    "    allotctl member list [--admin PATH]\n"
	    "    allotctl member add ID RAFT_ADDR AGENT_URL [--admin PATH]\n"
	    "    allotctl member remove ID [--admin PATH]\n"
	    "\n"
	    "DESCRIPTION\n"
	    "    Through a member's admin socket. list prints every member:\n"
	    "    its id, where the others reach its log (RAFT), where agents\n"
	    "    reach it (AGENT URL), its role (voter; standby or spare "
	    "while\n"
	    "    it catches up) and which is the leader. add and remove run "
	    "on\n"
	    "    the leader (another member refuses, naming the leader's "
	    "agent\n"
	    "    URL). Start the new member first with --raft-id ID "
	    "--raft-addr\n"
	    "    RAFT_ADDR --join: it joins as a non-voter, catches up with "
	    "the\n"
	    "    log, then votes. remove waits until the removal is done "
	    "(10 s\n"
	    "    at most), the leader's own too: one call on the leader "
	    "records\n"
	    "    that it leaves, it hands leadership over, and the new "
	    "leader\n"
	    "    demotes and removes it. Agents learn the members from every\n"
	    "    reply; none restarts.\n"
	    "    One change at a time: the next is refused until list shows "
	    "none\n"
	    "    in progress.\n"
	    "\n",
	    "EXIT STATUS\n"
	    "    0 done (remove: removed; add: started); 1 refused (not the\n"
	    "    leader, a change in progress, no such member, the last "
	    "voter)\n"
	    "    or a removal not done within 10 s (it goes on: see list); 2 "
	    "bad\n"
	    "    command line; 3 the admin socket could not be reached.\n"
	    "\n"
	    "EXAMPLE\n"
	    "    allotctl member add 4 10.0.0.4:7500 tcp://10.0.0.4:7400\n" },
	{ "audit", "the standard audit queries on store files", false,
	    "NAME\n"
	    "    allotctl audit - the standard audit queries on store files\n"
	    "\n"
	    "SYNOPSIS\n"
	    "    allotctl audit [--limit N] [--sql] DB [DB...]\n"
	    "\n"
	    "DESCRIPTION\n"
	    "    Opens each DB (an allotd --db file) read-only and prints, "
	    "as\n"
	    "    tables: the configs loaded, consumption per caller, who was\n"
	    "    denied (v_denied), replicas per service with how they left,\n"
	    "    share changes per caller, the live replicas "
	    "(v_live_replicas),\n"
	    "    quota changes with who and why (v_quota_changes), shadow "
	    "and\n"
	    "    candidate quotas (v_shadow) and the most recent events. "
	    "With\n"
	    "    several files (the stores of several coordinators, or old\n"
	    "    copies) they are ATTACHed to one connection and every "
	    "table\n"
	    "    gets a first column \"db\" naming the file. Safe on a "
	    "live\n"
	    "    store: reads take no write lock (WAL).\n"
	    "    docs/operations.md has these and more queries for the "
	    "sqlite3\n"
	    "    shell.\n"
	    "\n",
	    "EXIT STATUS\n"
	    "    0 success; 1 a file is missing, not an allot store, too old, "
	    "or\n"
	    "    a query failed; 2 bad command line.\n"
	    "\n"
	    "EXAMPLE\n"
	    "    allotctl audit /var/lib/allot/allot.db\n" },
	{ "help", "help on a command", false,
	    "NAME\n"
	    "    allotctl help - help on a command\n"
	    "\n"
	    "SYNOPSIS\n"
	    "    allotctl help [COMMAND]\n"
	    "\n"
	    "DESCRIPTION\n"
	    "    Without COMMAND, the list of commands; with one, its manual\n"
	    "    (the same as allotctl COMMAND --help).\n",
	    "" },
};

#define NMANUALS (sizeof manuals / sizeof manuals[0])

static const struct manual *
find_manual(const char *name)
{
	for (size_t i = 0; i < NMANUALS; i++)
		if (strcmp(manuals[i].name, name) == 0)
			return &manuals[i];
	return NULL;
}

bool
ctl_has_manual(const char *name)
{
	return find_manual(name) != NULL;
}

/* The rows of the option table listed where `shown` is set, with the
 * title before them and a blank line after; nothing when there are
 * none. */
static void
print_options(FILE *f, const char *title, unsigned shown, const allot__opts *t)
{
	if (allot__opts_print(f, t, title, shown) > 0)
		fputc('\n', f);
}

void
ctl_usage(FILE *f, const allot__opts *t)
{
	fputs("NAME\n"
	      "    allotctl - inspect a running allotd, reload its quotas, "
	      "check quota\n"
	      "    files and audit its store\n"
	      "\n"
	      "SYNOPSIS\n"
	      "    allotctl [--http HOST:PORT] [--timeout MS] COMMAND [ARGS]\n"
	      "    allotctl help [COMMAND] | --help | --version\n"
	      "\n"
	      "COMMANDS\n",
	    f);
	for (size_t i = 0; i < NMANUALS; i++)
		fprintf(
		    f, "    %-13s %s\n", manuals[i].name, manuals[i].summary);
	fputs("\n"
	      "DESCRIPTION\n"
	      "    status, replicas, quotas, shares and top-denied read "
	      "allotd's\n"
	      "    GET /status on its HTTP port and never change anything. "
	      "reload\n"
	      "    signals allotd on its own host (see allotctl help reload "
	      "for how\n"
	      "    that is authenticated). check-config and audit work on "
	      "files and\n"
	      "    need no allotd. diff and apply review and make a quota "
	      "change\n"
	      "    through allotd's admin socket, recorded with who and why.\n"
	      "    allotctl help COMMAND has each command's manual.\n"
	      "\n",
	    f);
	print_options(f, "COMMON OPTIONS\n", CTL_COMMON | CTL_GLOBAL, t);
	fputs(EXIT_TEXT
	    "\n"
	    "ENVIRONMENT\n"
	    "    ALLOT_HTTP   the default for --http.\n"
	    "    ALLOT_ADMIN   the default for --admin, else\n"
	    "    ALLOT_ADMIN_SOCKET, else " DEFAULT_ADMIN ".\n"
	    "    ALLOT_ADMIN_CERT, ALLOT_ADMIN_KEY, ALLOT_ADMIN_CA   the\n"
	    "    defaults for --admin-cert, --admin-key and --admin-ca.\n"
	    "\n"
	    "EXAMPLES\n"
	    "    allotctl status\n"
	    "    allotctl --http 10.0.0.5:7480 top-denied\n"
	    "    allotctl shares checkout\n"
	    "    allotctl check-config --capacity 2000 quotas.yaml\n"
	    "    allotctl apply quotas.yaml --reason \"checkout to 650/s\"\n"
	    "    allotctl apply quotas.yaml --reason \"PR 42\" \\\n"
	    "        --admin https://allotd.internal:7443 \\\n"
	    "        --admin-cert deploy.pem --admin-ca allot-ca.pem\n"
	    "    allotctl audit /var/lib/allot/allot.db\n"
	    "\n"
	    "SEE ALSO\n"
	    "    allotd --help, docs/operations.md, docs/configuration.md\n",
	    f);
}

bool
ctl_manual(FILE *f, const char *name, unsigned bit, const allot__opts *t)
{
	const struct manual *m = find_manual(name);
	if (m == NULL)
		return false;
	fputs(m->head, f);
	print_options(f, "OPTIONS\n", bit, t);
	if (m->online)
		print_options(f, "COMMON OPTIONS\n", CTL_COMMON, t);
	fputs(m->tail, f);
	return true;
}
