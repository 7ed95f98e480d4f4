/* SPDX-License-Identifier: MIT */
/*
 * allotd's command line (allotd_opts.h). One table lists every option:
 * its names, its argument, its help text and the function that stores
 * its value. getopt_long's option array, the OPTIONS section of `--help`
 * and the dispatch all come from that table, so an option cannot be
 * parsed without being documented or the other way round. What depends
 * on several options (required ones, the cluster's, identity with
 * --tls-ca) is checked once everything is parsed.
 */
#include "allotd_opts.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

#define EXIT_USAGE ALLOT__DAEMON_EXIT_USAGE
#define DEFAULT_LISTEN ALLOT__DAEMON_DEFAULT_LISTEN
#define DEFAULT_HTTP ALLOT__DAEMON_DEFAULT_HTTP

typedef allot__daemon_opts opts;
struct opt;

/* Store `arg` for option `def` into `o`. Returns 0, -1 after printing
 * what is wrong (exit 2), or an exit status to stop with (1 + status:
 * --help and --version). */
typedef int parse_fn(const struct opt *def, const char *arg, opts *o);

struct opt {
	const char *name; /* long name, without the dashes */
	char short_name; /* or 0 */
	const char *arg; /* the argument's name in the help, NULL if none */
	/* Help lines, each ending in a newline; printed indented under
	 * the heading. NULL: described together with the next option (the
	 * headings are joined with a comma). */
	const char *help;
	parse_fn *parse;
	size_t off; /* the field of opts that parse stores into */
	uint32_t min, max; /* for parse_u32 */
};

#define FIELD(f) offsetof(opts, f)
#define AT(o, def, type) ((type *) (void *) ((char *) (o) + (def)->off))

/* ---- value parsers ---- */

static int
parse_str(const struct opt *def, const char *arg, opts *o)
{
	*AT(o, def, const char *) = arg;
	return 0;
}

static int
parse_u32(const struct opt *def, const char *s, opts *o)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || s[0] == '-' ||
	    v < def->min || v > def->max) {
		fprintf(stderr,
		    "allotd: --%s expects an integer from %" PRIu32
		    " to %" PRIu32 ", not \"%s\"\n",
		    def->name, def->min, def->max, s);
		return -1;
	}
	*AT(o, def, uint32_t) = (uint32_t) v;
	return 0;
}

/* --require-identity (min 1) and --no-require-identity (min 0). */
static int
parse_flag(const struct opt *def, const char *arg, opts *o)
{
	*AT(o, def, int) = (int) def->min;
	return 0;
}

/* Append `arg` to the list of a repeatable option, of at most `cap`. */
static int
append(const struct opt *def, const char *arg, const char **list, size_t *n,
    size_t cap)
{
	if (*n == cap) {
		fprintf(stderr, "allotd: at most %zu --%s\n", cap, def->name);
		return -1;
	}
	list[(*n)++] = arg;
	return 0;
}

static int
parse_listen(const struct opt *def, const char *arg, opts *o)
{
	return append(def, arg, o->urls, &o->nurls, ALLOT__SERVER_MAX_URLS);
}

static int
parse_idmap(const struct opt *def, const char *arg, opts *o)
{
	return append(def, arg, o->idmaps, &o->nidmaps, ALLOT__AUTHN_MAX_MAPS);
}

static int
parse_audience(const struct opt *def, const char *arg, opts *o)
{
	/* Leave room for the --listen URLs and --agent-url. */
	if (o->nidaud + ALLOT__SERVER_MAX_URLS + 1 >=
	    ALLOT__AUTHN_MAX_AUDIENCES) {
		fprintf(stderr, "allotd: too many --identity-audience\n");
		return -1;
	}
	o->idaud[o->nidaud++] = arg;
	return 0;
}

/* The options of the old probing cluster: say what replaced them. */
static int
parse_gone(const struct opt *def, const char *arg, opts *o)
{
	fprintf(stderr,
	    "allotd: --%s is gone: the coordinator cluster now runs on Raft "
	    "(one leader allocates, followers redirect agents). Give each "
	    "member --raft-id ID --raft-addr HOST:PORT, and either --seed "
	    "ID=RAFT_ADDR=AGENT_URL for every member of a new cluster or "
	    "--join for a member `allotctl member add` will add. See "
	    "docs/operations.md, \"Cluster\".\n",
	    def->name);
	return -1;
}

static int
parse_u64(const char *what, const char *s, uint64_t *ret)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || s[0] == '-' || v == 0) {
		fprintf(stderr,
		    "allotd: %s expects a member id (an integer > 0), not "
		    "\"%s\"\n",
		    what, s);
		return -1;
	}
	*ret = (uint64_t) v;
	return 0;
}

static int
parse_raft_id(const struct opt *def, const char *arg, opts *o)
{
	return parse_u64("--raft-id", arg, &o->raft_id);
}

/* --seed ID=RAFT_ADDR=AGENT_URL */
static int
parse_seed(const struct opt *def, const char *arg, opts *o)
{
	if (o->nseeds == ALLOT__CLUSTER_MAX_SEEDS) {
		fprintf(stderr, "allotd: at most %u --seed\n",
		    ALLOT__CLUSTER_MAX_SEEDS);
		return -1;
	}
	allot__cluster_seed *m = &o->seeds[o->nseeds];
	const char *e1 = strchr(arg, '=');
	const char *e2 = e1 != NULL ? strchr(e1 + 1, '=') : NULL;
	char id[32];
	if (e1 == NULL || e2 == NULL || (size_t) (e1 - arg) >= sizeof id ||
	    (size_t) (e2 - e1 - 1) >= sizeof m->raft || e2 == e1 + 1 ||
	    strlen(e2 + 1) >= sizeof m->url || e2[1] == '\0') {
		fprintf(stderr,
		    "allotd: --seed %s: expected ID=RAFT_ADDR=AGENT_URL, "
		    "e.g. 1=10.0.0.1:7500=tcp://10.0.0.1:7400\n",
		    arg);
		return -1;
	}
	memcpy(id, arg, (size_t) (e1 - arg));
	id[e1 - arg] = '\0';
	if (parse_u64("--seed", id, &m->id) != 0)
		return -1;
	memcpy(m->raft, e1 + 1, (size_t) (e2 - e1 - 1));
	m->raft[e2 - e1 - 1] = '\0';
	snprintf(m->url, sizeof m->url, "%s", e2 + 1);
	for (size_t i = 0; i < o->nseeds; i++)
		if (o->seeds[i].id == m->id) {
			fprintf(stderr,
			    "allotd: --seed %" PRIu64 " given twice\n", m->id);
			return -1;
		}
	o->nseeds++;
	return 0;
}

static int
parse_hold(const struct opt *def, const char *arg, opts *o)
{
	static const struct {
		const char *name;
		allot__hold_expired hold;
	} holds[] = {
		{ "none", ALLOT__HOLD_NONE },
		{ "lease", ALLOT__HOLD_LEASE },
		{ "fallback", ALLOT__HOLD_FALLBACK },
	};
	for (size_t i = 0; i < sizeof holds / sizeof holds[0]; i++)
		if (strcmp(arg, holds[i].name) == 0) {
			o->so.hold_expired = holds[i].hold;
			return 0;
		}
	fprintf(stderr,
	    "allotd: --hold-expired %s: expected none, lease or fallback\n",
	    arg);
	return -1;
}

/* --loan-frac F: a fraction of R * T in [0, 1]. */
static int
parse_loan(const struct opt *def, const char *arg, opts *o)
{
	char *end;
	errno = 0;
	double v = strtod(arg, &end);
	if (errno != 0 || end == arg || *end != '\0' || !(v >= 0 && v <= 1)) {
		fprintf(stderr,
		    "allotd: --%s expects a number from 0 to 1, not \"%s\"\n",
		    def->name, arg);
		return -1;
	}
	o->so.policy.loan_frac = v;
	return 0;
}

/* --peer-register-rate and --peer-message-rate: R[:B] into a budget's
 * rate and burst. */
static int
peer_rate(const struct opt *def, const char *arg, double *ret_rate,
    double *ret_burst)
{
	char perr[256];
	if (allot__peerlimit_parse(
	        arg, ret_rate, ret_burst, perr, sizeof perr) != 0) {
		fprintf(stderr, "allotd: --%s: %s\n", def->name, perr);
		return -1;
	}
	return 0;
}

static int
parse_peer_register(const struct opt *def, const char *arg, opts *o)
{
	return peer_rate(
	    def, arg, &o->plo.register_rate, &o->plo.register_burst);
}

static int
parse_peer_message(const struct opt *def, const char *arg, opts *o)
{
	return peer_rate(
	    def, arg, &o->plo.message_rate, &o->plo.message_burst);
}

static int
parse_level(const struct opt *def, const char *s, opts *o)
{
	static const struct {
		const char *name;
		int level;
	} names[] = {
		{ "err", 3 },
		{ "error", 3 },
		{ "warning", 4 },
		{ "warn", 4 },
		{ "notice", 5 },
		{ "info", 6 },
		{ "debug", 7 },
	};
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		if (strcmp(s, names[i].name) == 0) {
			o->log_level = names[i].level;
			return 0;
		}
	}
	if (s[0] >= '0' && s[0] <= '7' && s[1] == '\0') {
		o->log_level = s[0] - '0';
		return 0;
	}
	fprintf(stderr,
	    "allotd: --log-level expects err, warning, notice, "
	    "info, debug or 0-7, not \"%s\"\n",
	    s);
	return -1;
}

static parse_fn show_help, show_version;

/* ---- the options ---- */

static const struct opt options[] = {
	{ "config", 'c', "FILE",
	    "Quota file (YAML, docs/configuration.md). Required. A bad file\n"
	    "at start-up is fatal; on SIGHUP it is logged and the config in\n"
	    "force is kept.\n",
	    parse_str, FIELD(config_path), 0, 0 },
	{ "db", 'd', "FILE",
	    "SQLite store, created if missing (WAL mode, schema migrated).\n"
	    "Required. Query it with the sqlite3 shell "
	    "(docs/operations.md).\n",
	    parse_str, FIELD(db_path), 0, 0 },
	{ "listen", 'l', "URL",
	    "Protocol address, nng syntax: tls+tcp://HOST:PORT (mutual TLS,\n"
	    "across hosts), tcp://HOST:PORT (loopback) or ipc:///PATH.\n"
	    "Repeat for several. Default " DEFAULT_LISTEN " (loopback\n"
	    "only), or with --self this member's SYNC_URL.\n",
	    parse_listen, 0, 0, 0 },
	{ "http", 'H', "HOST:PORT",
	    "Address of the dashboard (/), /metrics, /status and /healthz,\n"
	    "or \"off\". Read-only: nothing on it changes allotd.\n"
	    "Default " DEFAULT_HTTP ".\n",
	    parse_str, FIELD(http_addr), 0, 0 },
	{ "admin-socket", 0, "PATH",
	    "Unix socket of the admin API (GET /config, POST /config/diff,\n"
	    "POST /config/apply: allotctl diff and apply). Created mode "
	    "0600,\n"
	    "owned by allotd's user; the kernel names each caller\n"
	    "(SO_PEERCRED), and that name goes into the audit table.\n"
	    "Default none: quotas change by file and SIGHUP only.\n",
	    parse_str, FIELD(admin_socket), 0, 0 },
	{ "admin-group", 0, "GROUP",
	    "Make the admin socket mode 0660 and of this group, so that its\n"
	    "members may apply changes too (default: allotd's user only).\n",
	    parse_str, FIELD(admin_group), 0, 0 },
	{ "http-max-connections", 0, "N",
	    "HTTP connections open at once, all clients together (default\n"
	    "128). More are refused at accept and counted in\n"
	    "allotd_http_refused_total; the sync port is not affected.\n",
	    parse_u32, FIELD(http_lim.max_connections), 1, 65536 },
	{ "http-max-per-address", 0, "N",
	    "HTTP connections open at once from one IP address (default\n"
	    "32), so that one client cannot hold the others' part.\n",
	    parse_u32, FIELD(http_lim.max_per_address), 1, 65536 },
	{ "http-idle-timeout", 0, "S",
	    "Seconds an HTTP connection may stay silent, between requests\n"
	    "or while sending its headers, before allotd closes it\n"
	    "(default 10).\n",
	    parse_u32, FIELD(http_lim.idle_timeout_s), 1, 3600 },
	{ "tls-cert", 0, "FILE", NULL, parse_str, FIELD(tls_cert), 0, 0 },
	{ "tls-ca", 0, "FILE",
	    "For tls+tcp:// listeners (mutual TLS): allotd's certificate and\n"
	    "private key in one PEM file, and the CA that agents'\n"
	    "certificates must chain to. Agents without a valid certificate\n"
	    "cannot connect. Plain tcp:// beyond loopback logs a warning.\n",
	    parse_str, FIELD(tls_ca), 0, 0 },
	{ "require-identity", 0, NULL, NULL, parse_flag, FIELD(require_id), 1,
	    0 },
	{ "no-require-identity", 0, NULL,
	    "Every Register must prove, by a signature with its "
	    "certificate's\n"
	    "key, the SPIFFE identity of its service; sessions stay bound\n"
	    "to their connection. On by default with --tls-ca.\n",
	    parse_flag, FIELD(require_id), 0, 0 },
	{ "identity-map", 0, "SPIFFE_PATTERN",
	    "Which part of a certificate's SPIFFE ID is the service, e.g.\n"
	    "spiffe://example.org/ns/*/sa/{service} (repeat; first match\n"
	    "wins). Default: the ID's last path segment.\n",
	    parse_idmap, 0, 0, 0 },
	{ "identity-audience", 0, "URL",
	    "A coordinator URL agents dial that is not a --listen URL\n"
	    "(e.g. behind a DNS name or NAT); repeat for several.\n",
	    parse_audience, 0, 0, 0 },
	{ "raft-id", 0, "ID",
	    "Cluster mode (docs/operations.md, \"Cluster\"): this member's\n"
	    "id, an integer > 0, unique and never reused (a wiped member\n"
	    "rejoins under a new id). Members run Raft: one leader\n"
	    "allocates, the others answer agents NOT_LEADER with its URL.\n",
	    parse_raft_id, 0, 0, 0 },
	{ "raft-addr", 0, "HOST:PORT",
	    "Where the other members reach this one's log (plain TCP: bind\n"
	    "it to a private network).\n",
	    parse_str, FIELD(raft_addr), 0, 0 },
	{ "raft-dir", 0, "DIR",
	    "The log and snapshots (default: the --db path + \".raft\").\n",
	    parse_str, FIELD(raft_dir), 0, 0 },
	{ "agent-url", 0, "URL",
	    "Where agents reach this member, as the others tell them\n"
	    "(default: the first --listen).\n",
	    parse_str, FIELD(agent_url), 0, 0 },
	{ "seed", 0, "ID=RAFT_ADDR=AGENT_URL",
	    "A member of a new cluster; repeat for each (the same list on\n"
	    "every seed member, itself included). Used only at the first\n"
	    "start: afterwards the log holds the membership.\n",
	    parse_seed, 0, 0, 0 },
	{ "join", 0, NULL,
	    "Start with no configuration and wait for the leader to add\n"
	    "this member (allotctl member add ID RAFT_ADDR AGENT_URL).\n",
	    parse_flag, FIELD(join), 1, 0 },
	{ "election-ms", 0, "MS",
	    "Raft's election timeout, also the leader's lease (default\n"
	    "1000). A new leader serves about 1.01 x this after it wins.\n",
	    parse_u32, FIELD(election_ms), 50, 60000 },
	{ "raft-member-id", 0, "SPIFFE_ID",
	    "With --tls-cert and --tls-ca, members talk mutual TLS: a peer\n"
	    "must present a certificate from that CA for this SPIFFE ID\n"
	    "(default: the one in this member's own certificate; a last\n"
	    "segment \"*\" accepts per-member IDs). Without them, members\n"
	    "talk plain TCP: keep --raft-addr on a private network.\n",
	    parse_str, FIELD(raft_member_id), 0, 0 },
	{ "member", 0, "NAME=SYNC_URL", NULL, parse_gone, 0, 0, 0 },
	{ "self", 0, "NAME",
	    "Gone (the probing cluster): an error naming what replaced\n"
	    "them.\n",
	    parse_gone, 0, 0, 0 },
	{ "hold-expired", 0, "none|lease|fallback",
	    "What the share of an expired replica (silent past its expiry\n"
	    "with its connection still open: stopped, or partitioned and\n"
	    "still admitting) keeps out of the headroom: none (the others\n"
	    "get it at once), lease (default: its grants until its lease\n"
	    "has certainly ended), fallback (also its fallback allowance\n"
	    "afterwards, for 60 s: a partition never over-admits, a hung\n"
	    "replica's capacity stays unused that long). A replica whose\n"
	    "connection closed (it exited) is never held. See\n"
	    "docs/allocation.md.\n",
	    parse_hold, 0, 0, 0 },
	{ "loan-frac", 0, "F",
	    "Loans: a replica that starts denying a quota gets tokens taken\n"
	    "from idle replicas' buckets at once, at most F x R x min(T,\n"
	    "100 ms) of a quota lent at a time (0 to 1, default 0.3; 0: no\n"
	    "loans). See docs/allocation.md, \"Loans\".\n",
	    parse_loan, 0, 0, 0 },
	{ "lease-ms", 0, "MS",
	    "How long an agent may use a share without hearing from allotd\n"
	    "(default 3000).\n",
	    parse_u32, FIELD(so.lease_ms), 10, 3600000 },
	{ "interval-ms", 0, "MS",
	    "Expected agent sync interval T; also allotd's sweep period\n"
	    "(default 100).\n",
	    parse_u32, FIELD(so.interval_ms), 5, 600000 },
	{ "expiry-intervals", 0, "K",
	    "A replica silent for K intervals (of T, or of its own longer\n"
	    "interval) is expired and its share given back (default 5).\n",
	    parse_u32, FIELD(so.expiry_intervals), 1, 1000 },
	{ "retention-s", 0, "S",
	    "Usage and event rows older than S seconds are deleted\n"
	    "(default 604800, 7 days; 0 keeps everything).\n",
	    parse_u32, FIELD(retention_s), 0, UINT32_MAX },
	{ "workers", 0, "N",
	    "Requests handled concurrently, one nng context each (default "
	    "8).\n",
	    parse_u32, FIELD(workers), 1, 1024 },
	{ "max-replicas", 0, "N",
	    "Live replicas over all services (default 10000).\n", parse_u32,
	    FIELD(so.max_replicas), 1, 10000000 },
	{ "max-services", 0, "N",
	    "Services at once (default 256); a Register of a new one\n"
	    "beyond it is answered RATE_LIMITED. Empty services are freed\n"
	    "(--service-idle-ms), so only live ones count.\n",
	    parse_u32, FIELD(so.max_services), 1, 1000000 },
	{ "max-replicas-per-service", 0, "N",
	    "Live replicas of one service (default 1000); a new one beyond\n"
	    "it is answered RATE_LIMITED, reason \"capacity\".\n",
	    parse_u32, FIELD(so.max_replicas_per_service), 1, 10000000 },
	{ "max-replicas-per-peer", 0, "N",
	    "Live replicas of one service registered from one peer (an IP\n"
	    "address, or a local uid for ipc://; default 256, 0 no limit);\n"
	    "a new one beyond it is answered RATE_LIMITED, reason\n"
	    "\"peer_replicas\". Size it for the most replicas of a service\n"
	    "behind one address (NAT).\n",
	    parse_u32, FIELD(so.max_replicas_per_peer), 0, 10000000 },
	{ "service-idle-ms", 0, "MS",
	    "A service with no replica left (live, restored or expired) is\n"
	    "freed after MS (default 60000; 0 never): its counters and\n"
	    "series go, a later Register starts it afresh.\n",
	    parse_u32, FIELD(so.service_idle_ms), 0, UINT32_MAX },
	{ "max-keys", 0, "N",
	    "Keys one Register may name (default 65537); more are\n"
	    "answered TOO_LARGE. Only keys that name a quota are kept (at\n"
	    "most one per quota), about 180 bytes each; the others are\n"
	    "counted (docs/operations.md, \"Memory bounds\").\n",
	    parse_u32, FIELD(max_keys), 1, ALLOT__SERVER_MAX_KEYS },
	{ "peer-register-rate", 0, "R[:B]",
	    "Registers per second each peer may send, with a burst of B\n"
	    "(default 20:50; B defaults to 2 R; 0 disables). A peer is a\n"
	    "remote IP address (tcp, tls+tcp), a local uid (ipc), or\n"
	    "\"local\". Over it: Error RATE_LIMITED, counted as\n"
	    "allotd_rejected_messages_total{reason=\"peer_register_rate\"}.\n",
	    parse_peer_register, 0, 0, 0 },
	{ "peer-message-rate", 0, "R[:B]",
	    "Messages of any kind per second each peer may send (default\n"
	    "2000:4000; 0 disables); reason \"peer_message_rate\". A host\n"
	    "sends about (its replicas) x (members) / T per second over\n"
	    "the cluster, (its replicas) / T to each member.\n",
	    parse_peer_message, 0, 0, 0 },
	{ "peer-table", 0, "N",
	    "Peers tracked for those budgets (default 4096, about 450\n"
	    "bytes each); beyond it, new peers share one budget while\n"
	    "every tracked peer is still paying off a burst.\n",
	    parse_u32, FIELD(plo.capacity), 1, 1000000 },
	{ "peer-connections", 0, "N",
	    "Connections of one peer that, once a Register on them\n"
	    "succeeded (with --tls-ca: proved its identity), get a message\n"
	    "budget of their own, so that a flood from other connections\n"
	    "of the same address cannot throttle them (default 256; 0:\n"
	    "every message is charged to its address). Each holds a slot\n"
	    "of --peer-table until it closes.\n",
	    parse_u32, FIELD(plo.conns_per_peer), 0, 1000000 },
	{ "log-level", 0, "LEVEL",
	    "err, warning, notice, info or debug, or 0-7 (default info).\n",
	    parse_level, 0, 0, 0 },
	{ "help", 'h', NULL, "Print this text and exit.\n", show_help, 0, 0,
	    0 },
	{ "version", 'V', NULL, "Print the version and exit.\n", show_version,
	    0, 0, 0 },
};

#define NOPTS (sizeof options / sizeof options[0])

/* ---- --help and --version ---- */

static const char help_head[] =
    "NAME\n"
    "    allotd - the allot coordinator: global quotas, per-replica "
    "shares\n"
    "\n"
    "SYNOPSIS\n"
    "    allotd --config FILE --db FILE [--listen URL]... [--http "
    "HOST:PORT]\n"
    "           [--lease-ms MS] [--interval-ms MS] [--expiry-intervals K]\n"
    "           [--retention-s S] [--workers N] [--log-level LEVEL]\n"
    "           [--raft-id ID --raft-addr HOST:PORT [--raft-dir DIR]\n"
    "            [--agent-url URL] (--seed ID=RAFT_ADDR=AGENT_URL... | "
    "--join)]\n"
    "           [--hold-expired none|lease|fallback] [--loan-frac F]\n"
    "           [--admin-socket PATH [--admin-group GROUP]]\n"
    "    allotd --help | --version\n"
    "\n"
    "DESCRIPTION\n"
    "    allotd receives what every replica's agent (liballot) admitted "
    "and\n"
    "    denied per quota, keeps global usage in memory and in a SQLite "
    "file,\n"
    "    and answers each agent with its share of every quota: a local "
    "rate\n"
    "    and burst valid for a lease. Shares are recomputed whenever the\n"
    "    number of live replicas of a service or the quota config "
    "changes,\n"
    "    and reach the agents on their next sync. The quota file applies "
    "to\n"
    "    every service; each agent names its service when it registers.\n"
    "    The wire protocol is described in docs/protocol.md.\n"
    "\n"
    "OPTIONS\n";

static const char help_tail[] =
    "\n"
    "SIGNALS\n"
    "    SIGHUP   reload the quota file: a new epoch and new shares, or "
    "an\n"
    "             ALLOTD-RELOAD-FAIL line naming the error.\n"
    "    SIGTERM, SIGINT\n"
    "             drain: stop accepting, finish requests in flight (at "
    "most\n"
    "             2 s), commit the store, record a \"stop\" event, exit "
    "0.\n"
    "\n"
    "RESTART\n"
    "    Sessions do not survive a restart: agents get UNKNOWN_SESSION "
    "and\n"
    "    register again, keeping their local buckets. Replicas that were\n"
    "    live are restored as placeholders that keep counting toward "
    "their\n"
    "    service's replica count (so the first to return is not handed "
    "the\n"
    "    whole quota) until they register again or expire.\n"
    "\n"
    "LOGGING\n"
    "    Lines on stderr: time, level, a stable id (ALLOTD-START, -JOIN,\n"
    "    -LEAVE, -EXPIRE, -REPLACE, -REJECT, -RELOAD, -RELOAD-FAIL,\n"
    "    -STORE-FAIL, -DRAIN, -STOP, ...), then the message.\n"
    "\n"
    "EXIT STATUS\n"
    "    0 after a clean drain; 1 when the store, a listener or the "
    "event\n"
    "    loop fails; 2 for a bad command line or quota file.\n"
    "\n"
    "EXAMPLE\n"
    "    allotd --config /etc/allot/quotas.yaml --db "
    "/var/lib/allot/allot.db \\\n"
    "        --listen tls+tcp://0.0.0.0:7400 --tls-cert "
    "/etc/allot/allotd.pem \\\n"
    "        --tls-ca /etc/allot/agents-ca.pem --listen "
    "ipc:///run/allot/allotd.sock\n"
    "\n"
    "SEE ALSO\n"
    "    docs/protocol.md, docs/operations.md, docs/configuration.md\n";

/* The OPTIONS section: each option's heading, then its help indented
 * under it; options without help share the next one's paragraph. */
static void
print_options(FILE *f)
{
	bool joined = false;
	for (size_t i = 0; i < NOPTS; i++) {
		const struct opt *d = &options[i];
		fputs(joined ? ", " : "    ", f);
		if (d->short_name != 0)
			fprintf(f, "-%c, ", d->short_name);
		fprintf(f, "--%s%s%s", d->name, d->arg != NULL ? " " : "",
		    d->arg != NULL ? d->arg : "");
		joined = d->help == NULL;
		if (joined)
			continue;
		fputc('\n', f);
		for (const char *l = d->help; *l != '\0';) {
			const char *nl = strchr(l, '\n');
			size_t n = nl != NULL ? (size_t) (nl - l) + 1 :
			                        strlen(l);
			fputs("        ", f);
			fwrite(l, 1, n, f);
			l += n;
		}
	}
}

static int
show_help(const struct opt *def, const char *arg, opts *o)
{
	fputs(help_head, stdout);
	print_options(stdout);
	fputs(help_tail, stdout);
	return 1;
}

static int
show_version(const struct opt *def, const char *arg, opts *o)
{
	printf("allotd %s\n", ALLOT_VERSION_STRING);
	return 1;
}

/* ---- parsing ---- */

static void
opts_init(opts *o)
{
	memset(o, 0, sizeof *o);
	o->http_addr = DEFAULT_HTTP;
	o->require_id = -1;
	o->retention_s = 7u * 24u * 3600u;
	o->workers = 8;
	o->max_keys = ALLOT__SERVER_MAX_KEYS;
	o->log_level = ALLOT_LOG_INFO;
	allot__state_opts_init(&o->so);
	/* A silent replica whose connection is still open may be cut off
	 * and admitting on its grants: they stay out of the headroom until
	 * its lease has ended, so that a partition (of a replica, or of a
	 * cluster's members) never hands capacity out twice. One whose
	 * connection closed has exited and is not held (conn_open). */
	o->so.hold_expired = ALLOT__HOLD_LEASE;
	allot__peerlimit_opts_init(&o->plo);
	allot__http_limits_init(&o->http_lim);
}

/* getopt_long's view of the table: an option is known by its short name
 * when it has one, else by 256 + its index. */
static int
opt_val(size_t i)
{
	return options[i].short_name != 0 ? options[i].short_name :
	                                    256 + (int) i;
}

static const struct opt *
opt_find(int val)
{
	for (size_t i = 0; i < NOPTS; i++)
		if (opt_val(i) == val)
			return &options[i];
	return NULL;
}

static void
make_getopt(struct option *ret_long, char *ret_short)
{
	size_t n = 0;
	for (size_t i = 0; i < NOPTS; i++) {
		const struct opt *d = &options[i];
		ret_long[i] = (struct option) {
			.name = d->name,
			.has_arg = d->arg != NULL ? required_argument :
			                            no_argument,
			.flag = NULL,
			.val = opt_val(i),
		};
		if (d->short_name != 0) {
			ret_short[n++] = d->short_name;
			if (d->arg != NULL)
				ret_short[n++] = ':';
		}
	}
	ret_long[NOPTS] = (struct option) { 0 };
	ret_short[n] = '\0';
}

/* Identity proofs may name any address allotd listens on or is known by
 * in the cluster, besides the --identity-audience ones. */
static int
make_authn(opts *o)
{
	for (size_t i = 0; i < o->nurls; i++)
		o->idaud[o->nidaud++] = o->urls[i];
	if (o->agent_url != NULL)
		o->idaud[o->nidaud++] = o->agent_url;
	allot__authn_opts ao = {
		.ca_file = o->tls_ca,
		.maps = o->idmaps,
		.nmaps = o->nidmaps,
		.audiences = o->idaud,
		.naudiences = o->nidaud,
	};
	char aerr[512];
	if (allot__authn_new(&ao, aerr, sizeof aerr, &o->authn) != ALLOT_OK) {
		fprintf(stderr, "allotd: %s\n", aerr);
		return -1;
	}
	return 0;
}

/* The cluster options go together: an id and an address, and either
 * seeds (naming this member) or --join. */
static int
check_cluster(opts *o)
{
	bool any = o->raft_id != 0 || o->raft_addr != NULL || o->nseeds > 0 ||
	    o->join || o->raft_dir != NULL;
	if (!any)
		return 0;
	if (o->raft_id == 0 || o->raft_addr == NULL) {
		fprintf(stderr,
		    "allotd: a cluster member needs --raft-id and "
		    "--raft-addr\nTry 'allotd --help'.\n");
		return -1;
	}
	if ((o->nseeds > 0) == o->join) {
		fprintf(stderr,
		    "allotd: give either --seed for every member of a new "
		    "cluster, or --join\n");
		return -1;
	}
	bool self = false;
	for (size_t i = 0; i < o->nseeds; i++)
		if (o->seeds[i].id == o->raft_id) {
			self = true;
			if (strcmp(o->seeds[i].raft, o->raft_addr) != 0) {
				fprintf(stderr,
				    "allotd: --seed %" PRIu64 " names %s, "
				    "but --raft-addr is %s\n",
				    o->raft_id, o->seeds[i].raft,
				    o->raft_addr);
				return -1;
			}
			if (o->agent_url == NULL)
				o->agent_url = o->seeds[i].url;
		}
	if (o->nseeds > 0 && !self) {
		fprintf(stderr,
		    "allotd: --raft-id %" PRIu64
		    " is not one of the --seed ids\n",
		    o->raft_id);
		return -1;
	}
	if (o->raft_member_id != NULL &&
	    (o->tls_cert == NULL || o->tls_ca == NULL)) {
		fprintf(stderr,
		    "allotd: --raft-member-id needs --tls-cert and "
		    "--tls-ca (members talk TLS only with both)\n");
		return -1;
	}
	if (o->agent_url == NULL)
		o->agent_url = o->urls[0];
	if (o->raft_dir == NULL) {
		snprintf(o->raft_dir_buf, sizeof o->raft_dir_buf, "%s.raft",
		    o->db_path);
		o->raft_dir = o->raft_dir_buf;
	}
	return 0;
}

/* What depends on several options, once all are parsed; fills in the
 * defaults that depend on others. */
static int
check(opts *o)
{
	if (o->config_path == NULL || o->db_path == NULL) {
		fprintf(stderr,
		    "allotd: --config and --db are required\n"
		    "Try 'allotd --help'.\n");
		return -1;
	}
	if (o->nurls == 0)
		o->urls[o->nurls++] = DEFAULT_LISTEN;
	if (check_cluster(o) != 0)
		return -1;
	if (strcmp(o->http_addr, "off") == 0 ||
	    strcmp(o->http_addr, "none") == 0)
		o->http_addr = NULL;
	if (o->admin_group != NULL && o->admin_socket == NULL) {
		fprintf(
		    stderr, "allotd: --admin-group needs --admin-socket\n");
		return -1;
	}
	if (o->require_id < 0)
		o->require_id = o->tls_ca != NULL;
	if (o->require_id && o->tls_ca == NULL) {
		fprintf(stderr, "allotd: --require-identity needs --tls-ca\n");
		return -1;
	}
	if (o->require_id && make_authn(o) != 0)
		return -1;
	return 0;
}

int
allot__daemon_parse(int argc, char **argv, allot__daemon_opts *o)
{
	opts_init(o);
	struct option longopts[NOPTS + 1];
	char shortopts[2 * NOPTS + 1];
	make_getopt(longopts, shortopts);
	int c;
	while (
	    (c = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
		const struct opt *def = opt_find(c);
		if (def == NULL) {
			/* getopt_long said what is wrong. */
			fprintf(stderr, "Try 'allotd --help'.\n");
			return EXIT_USAGE;
		}
		int rc = def->parse(def, optarg, o);
		if (rc != 0)
			return rc < 0 ? EXIT_USAGE : EXIT_SUCCESS;
	}
	if (optind < argc) {
		fprintf(stderr,
		    "allotd: unexpected argument \"%s\"\n"
		    "Try 'allotd --help'.\n",
		    argv[optind]);
		return EXIT_USAGE;
	}
	return check(o) != 0 ? EXIT_USAGE : -1;
}
