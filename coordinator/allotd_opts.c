/* SPDX-License-Identifier: MIT */
/*
 * allotd's command line (allotd_opts.h). One table lists every option:
 * its names, its argument, its help text and where its value goes (a
 * field, or the handler that stores it); common/opts.c builds
 * getopt_long's arrays, parses and prints the OPTIONS section of
 * `--help` from it, so an option cannot be parsed without being
 * documented or the other way round. What depends on several options
 * (required ones, the cluster's, identity with --tls-ca) is checked once
 * everything is parsed.
 */
#include "allotd_opts.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "opts.h"

#define DEFAULT_LISTEN ALLOT__DAEMON_DEFAULT_LISTEN
#define DEFAULT_HTTP ALLOT__DAEMON_DEFAULT_HTTP

typedef allot__daemon_opts opts;

#define FIELD(f) offsetof(opts, f)

/* ---- the options that need more than a field ---- */

/* --require-identity and --no-require-identity: on, off, or (neither)
 * on with --tls-ca. */
static int
set_require(const allot__opt_use *u, void *dst)
{
	((opts *) dst)->require_id = 1;
	return ALLOT__OPTS_OK;
}

static int
set_no_require(const allot__opt_use *u, void *dst)
{
	((opts *) dst)->require_id = 0;
	return ALLOT__OPTS_OK;
}

/* Append `arg` to the list of a repeatable option, of at most `cap`. */
static int
append(const allot__opt_use *u, const char **list, size_t *n, size_t cap)
{
	if (*n == cap)
		return allot__opts_fail(u, "at most %zu %s", cap, u->as);
	list[(*n)++] = u->arg;
	return ALLOT__OPTS_OK;
}

static int
parse_listen(const allot__opt_use *u, void *dst)
{
	opts *o = dst;
	return append(u, o->urls, &o->nurls, ALLOT__SERVER_MAX_URLS);
}

static int
parse_idmap(const allot__opt_use *u, void *dst)
{
	opts *o = dst;
	return append(u, o->idmaps, &o->nidmaps, ALLOT__AUTHN_MAX_MAPS);
}

static int
parse_audience(const allot__opt_use *u, void *dst)
{
	opts *o = dst;
	/* Leave room for the --listen URLs and --agent-url. */
	if (o->nidaud + ALLOT__SERVER_MAX_URLS + 1 >=
	    ALLOT__AUTHN_MAX_AUDIENCES)
		return allot__opts_fail(u, "too many --identity-audience");
	o->idaud[o->nidaud++] = u->arg;
	return ALLOT__OPTS_OK;
}

static int
parse_admin_allow(const allot__opt_use *u, void *dst)
{
	opts *o = dst;
	char err[512];
	if (o->nadmin_allow == ALLOT__ADMIN_ALLOW_MAX)
		return allot__opts_fail(
		    u, "at most %u --admin-allow", ALLOT__ADMIN_ALLOW_MAX);
	if (!allot__admin_tls_pattern_ok(u->arg, err, sizeof err))
		return allot__opts_fail(u, "%s", err);
	o->admin_allow[o->nadmin_allow++] = u->arg;
	return ALLOT__OPTS_OK;
}

/* The options of the old probing cluster: say what replaced them. */
static int
parse_gone(const allot__opt_use *u, void *dst)
{
	return allot__opts_fail(u,
	    "%s is gone: the coordinator cluster now runs on Raft "
	    "(one leader allocates, followers redirect agents). Give each "
	    "member --raft-id ID --raft-addr HOST:PORT, and either --seed "
	    "ID=RAFT_ADDR=AGENT_URL for every member of a new cluster or "
	    "--join for a member `allotctl member add` will add. See "
	    "docs/operations.md, \"Cluster\".",
	    u->as);
}

static int
member_id(const allot__opt_use *u, const char *s, uint64_t *ret)
{
	if (!allot__opts_uint(s, 1, UINT64_MAX, ret))
		return allot__opts_fail(u,
		    "%s expects a member id (an integer > 0), not \"%s\"",
		    u->as, s);
	return ALLOT__OPTS_OK;
}

static int
parse_raft_id(const allot__opt_use *u, void *dst)
{
	return member_id(u, u->arg, &((opts *) dst)->raft_id);
}

/* --seed ID=RAFT_ADDR=AGENT_URL */
static int
parse_seed(const allot__opt_use *u, void *dst)
{
	opts *o = dst;
	const char *arg = u->arg;
	if (o->nseeds == ALLOT__CLUSTER_MAX_SEEDS)
		return allot__opts_fail(
		    u, "at most %u --seed", ALLOT__CLUSTER_MAX_SEEDS);
	allot__cluster_seed *m = &o->seeds[o->nseeds];
	const char *e1 = strchr(arg, '=');
	const char *e2 = e1 != NULL ? strchr(e1 + 1, '=') : NULL;
	char id[32];
	if (e1 == NULL || e2 == NULL || (size_t) (e1 - arg) >= sizeof id ||
	    (size_t) (e2 - e1 - 1) >= sizeof m->raft || e2 == e1 + 1 ||
	    strlen(e2 + 1) >= sizeof m->url || e2[1] == '\0')
		return allot__opts_fail(u,
		    "--seed %s: expected ID=RAFT_ADDR=AGENT_URL, "
		    "e.g. 1=10.0.0.1:7500=tcp://10.0.0.1:7400",
		    arg);
	memcpy(id, arg, (size_t) (e1 - arg));
	id[e1 - arg] = '\0';
	if (member_id(u, id, &m->id) != ALLOT__OPTS_OK)
		return ALLOT__OPTS_USAGE;
	memcpy(m->raft, e1 + 1, (size_t) (e2 - e1 - 1));
	m->raft[e2 - e1 - 1] = '\0';
	snprintf(m->url, sizeof m->url, "%s", e2 + 1);
	for (size_t i = 0; i < o->nseeds; i++)
		if (o->seeds[i].id == m->id)
			return allot__opts_fail(
			    u, "--seed %" PRIu64 " given twice", m->id);
	o->nseeds++;
	return ALLOT__OPTS_OK;
}

static int
parse_hold(const allot__opt_use *u, void *dst)
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
		if (strcmp(u->arg, holds[i].name) == 0) {
			((opts *) dst)->so.hold_expired = holds[i].hold;
			return ALLOT__OPTS_OK;
		}
	return allot__opts_fail(
	    u, "--hold-expired %s: expected none, lease or fallback", u->arg);
}

/* --central-reserve on|off. */
static int
parse_central(const allot__opt_use *u, void *dst)
{
	bool on = strcmp(u->arg, "on") == 0;
	if (!on && strcmp(u->arg, "off") != 0)
		return allot__opts_fail(
		    u, "--central-reserve %s: expected on or off", u->arg);
	((opts *) dst)->so.policy.central = on;
	return ALLOT__OPTS_OK;
}

/* --peer-register-rate and --peer-message-rate: R[:B] into a budget's
 * rate and burst. */
static int
peer_rate(const allot__opt_use *u, double *ret_rate, double *ret_burst)
{
	char perr[256];
	if (allot__peerlimit_parse(
	        u->arg, ret_rate, ret_burst, perr, sizeof perr) != 0)
		return allot__opts_fail(u, "%s: %s", u->as, perr);
	return ALLOT__OPTS_OK;
}

static int
parse_peer_register(const allot__opt_use *u, void *dst)
{
	opts *o = dst;
	return peer_rate(u, &o->plo.register_rate, &o->plo.register_burst);
}

static int
parse_peer_message(const allot__opt_use *u, void *dst)
{
	opts *o = dst;
	return peer_rate(u, &o->plo.message_rate, &o->plo.message_burst);
}

static int
parse_log_format(const allot__opt_use *u, void *dst)
{
	opts *o = dst;
	if (allot__logfmt_parse(u->arg, &o->log_format) != 0)
		return allot__opts_fail(u,
		    "%s expects text, json, journal or auto, not \"%s\"",
		    u->as, u->arg);
	return ALLOT__OPTS_OK;
}

static int
show_version(const allot__opt_use *u, void *dst)
{
	printf("allotd %s\n", ALLOT_VERSION_STRING);
	return ALLOT__OPTS_DONE;
}

/* ---- the options ---- */

static const allot__opt rows[] = {
	{ "config", 'c', ALLOT__OPT_STR, "FILE",
	    "Quota file (YAML, docs/configuration.md). Required. A bad file\n"
	    "at start-up is fatal; on SIGHUP it is logged and the config in\n"
	    "force is kept.\n",
	    .off = FIELD(config_path) },
	{ "options", 0, ALLOT__OPT_CALL, "FILE",
	    "Further options from a YAML file, each key an option's long\n"
	    "name (\"listen: [tls+tcp://0.0.0.0:7400]\", \"interval-ms: "
	    "100\",\n"
	    "\"require-identity: true\"); the command line wins over it.\n",
	    .set = allot__opts_skip, .cli_only = true },
	{ "db", 'd', ALLOT__OPT_STR, "FILE",
	    "SQLite store, created if missing (WAL mode, schema migrated).\n"
	    "Required. Query it with the sqlite3 shell "
	    "(docs/operations.md).\n",
	    .off = FIELD(db_path) },
	{ "listen", 'l', ALLOT__OPT_CALL, "URL",
	    "Protocol address, nng syntax: tls+tcp://HOST:PORT (mutual TLS,\n"
	    "across hosts), tcp://HOST:PORT (loopback) or ipc:///PATH.\n"
	    "Repeat for several. Default " DEFAULT_LISTEN " (loopback\n"
	    "only), or with --self this member's SYNC_URL.\n",
	    .set = parse_listen },
	{ "http", 'H', ALLOT__OPT_STR, "HOST:PORT",
	    "Address of the dashboard (/), /metrics, /status and /healthz,\n"
	    "or \"off\". Read-only: nothing on it changes allotd.\n"
	    "Default " DEFAULT_HTTP ".\n",
	    .off = FIELD(http_addr) },
	{ "admin-socket", 0, ALLOT__OPT_STR, "PATH",
	    "Unix socket of the admin API (GET /config, POST /config/diff,\n"
	    "POST /config/apply: allotctl diff and apply). Created mode "
	    "0600,\n"
	    "owned by allotd's user; the kernel names each caller\n"
	    "(SO_PEERCRED), and that name goes into the audit table.\n"
	    "Default none: quotas change by file and SIGHUP only.\n",
	    .off = FIELD(admin_socket) },
	{ "admin-group", 0, ALLOT__OPT_STR, "GROUP",
	    "Make the admin socket mode 0660 and of this group, so that its\n"
	    "members may apply changes too (default: allotd's user only).\n",
	    .off = FIELD(admin_group) },
	{ "admin-listen", 0, ALLOT__OPT_STR, "HOST:PORT",
	    "The admin API over HTTPS with mutual TLS as well, for changes\n"
	    "from other hosts (allotctl --admin https://HOST:PORT): served\n"
	    "with --tls-cert; a caller must present a certificate of\n"
	    "--admin-ca whose SPIFFE ID --admin-allow names, and that ID "
	    "goes\n"
	    "into the audit table. Default none.\n",
	    .off = FIELD(admin_listen) },
	{ "admin-ca", 0, ALLOT__OPT_STR, "FILE",
	    "The CA admin callers' certificates chain to (default "
	    "--tls-ca).\n",
	    .off = FIELD(admin_ca) },
	{ "admin-allow", 0, ALLOT__OPT_CALL, "SPIFFE_ID",
	    "A caller --admin-listen lets in: a SPIFFE ID, or a prefix\n"
	    "followed by * for any ID one segment below it, e.g.\n"
	    "spiffe://example.org/ns/deploy/sa/* (repeat; at least one).\n",
	    .set = parse_admin_allow },
	{ "http-max-connections", 0, ALLOT__OPT_U32, "N",
	    "HTTP connections open at once, all clients together (default\n"
	    "128). More are refused at accept and counted in\n"
	    "allotd_http_refused_total; the sync port is not affected.\n",
	    .off = FIELD(http_lim.max_connections), .min = 1, .max = 65536 },
	{ "http-max-per-address", 0, ALLOT__OPT_U32, "N",
	    "HTTP connections open at once from one IP address (default\n"
	    "32), so that one client cannot hold the others' part.\n",
	    .off = FIELD(http_lim.max_per_address), .min = 1, .max = 65536 },
	{ "idle-timeout", 0, ALLOT__OPT_U32, "S", NULL,
	    .off = FIELD(http_lim.idle_timeout_s), .min = 1, .max = 3600 },
	{ "http-idle-timeout", 0, ALLOT__OPT_U32, "S",
	    "Seconds an HTTP connection may stay silent, between requests\n"
	    "or while sending its headers, before allotd closes it\n"
	    "(default 10). --idle-timeout is the name allot-agentd shares;\n"
	    "--http-idle-timeout, the older one, stays.\n",
	    .off = FIELD(http_lim.idle_timeout_s), .min = 1, .max = 3600 },
	{ "tls-cert", 0, ALLOT__OPT_STR, "FILE", NULL,
	    .off = FIELD(tls_cert) },
	{ "tls-key", 0, ALLOT__OPT_STR, "FILE", NULL, .off = FIELD(tls_key) },
	{ "tls-ca", 0, ALLOT__OPT_STR, "FILE",
	    "For tls+tcp:// listeners (mutual TLS): allotd's certificate and\n"
	    "private key in one PEM file (or the key apart in --tls-key, as\n"
	    "allot-agentd takes them), and the CA that agents'\n"
	    "certificates must chain to. Agents without a valid certificate\n"
	    "cannot connect. Plain tcp:// beyond loopback logs a warning.\n"
	    "The same certificate serves the Raft port and --admin-listen.\n",
	    .off = FIELD(tls_ca) },
	{ "legacy-metric-names", 0, ALLOT__OPT_TRUE, NULL,
	    "Also serve the gauges /metrics renamed in 0.2 under their\n"
	    "names of 0.1 (allotd_utilization, allotd_*_rate, ...), each\n"
	    "HELP saying which name replaces it, while dashboards and\n"
	    "alerts move (docs/operations.md, \"Metric names\"). Removed\n"
	    "in 0.3.\n",
	    .off = FIELD(so.legacy_metric_names) },
	{ "require-identity", 0, ALLOT__OPT_CALL, NULL, NULL,
	    .set = set_require },
	{ "no-require-identity", 0, ALLOT__OPT_CALL, NULL,
	    "Every Register must prove, by a signature with its "
	    "certificate's\n"
	    "key, the SPIFFE identity of its service; sessions stay bound\n"
	    "to their connection. On by default with --tls-ca.\n",
	    .set = set_no_require },
	{ "identity-map", 0, ALLOT__OPT_CALL, "SPIFFE_PATTERN",
	    "Which part of a certificate's SPIFFE ID is the service, e.g.\n"
	    "spiffe://example.org/ns/*/sa/{service} (repeat; first match\n"
	    "wins). Default: the ID's last path segment.\n",
	    .set = parse_idmap },
	{ "identity-audience", 0, ALLOT__OPT_CALL, "URL",
	    "A coordinator URL agents dial that is not a --listen URL\n"
	    "(e.g. behind a DNS name or NAT); repeat for several.\n",
	    .set = parse_audience },
	{ "raft-id", 0, ALLOT__OPT_CALL, "ID",
	    "Cluster mode (docs/operations.md, \"Cluster\"): this member's\n"
	    "id, an integer > 0, unique and never reused (a wiped member\n"
	    "rejoins under a new id). Members run Raft: one leader\n"
	    "allocates, the others answer agents NOT_LEADER with its URL.\n",
	    .set = parse_raft_id },
	{ "raft-addr", 0, ALLOT__OPT_STR, "HOST:PORT",
	    "Where the other members reach this one's log (plain TCP: bind\n"
	    "it to a private network).\n",
	    .off = FIELD(raft_addr) },
	{ "raft-dir", 0, ALLOT__OPT_STR, "DIR",
	    "The log and snapshots (default: the --db path + \".raft\").\n",
	    .off = FIELD(raft_dir) },
	{ "agent-url", 0, ALLOT__OPT_STR, "URL",
	    "Where agents reach this member, as the others tell them\n"
	    "(default: the first --listen).\n",
	    .off = FIELD(agent_url) },
	{ "seed", 0, ALLOT__OPT_CALL, "ID=RAFT_ADDR=AGENT_URL",
	    "A member of a new cluster; repeat for each (the same list on\n"
	    "every seed member, itself included). Used only at the first\n"
	    "start: afterwards the log holds the membership.\n",
	    .set = parse_seed },
	{ "join", 0, ALLOT__OPT_TRUE, NULL,
	    "Start with no configuration and wait for the leader to add\n"
	    "this member (allotctl member add ID RAFT_ADDR AGENT_URL).\n",
	    .off = FIELD(join) },
	{ "election-ms", 0, ALLOT__OPT_U32, "MS",
	    "Raft's election timeout, also the leader's lease (default\n"
	    "1000). A new leader serves about 1.01 x this after it wins.\n",
	    .off = FIELD(election_ms), .min = 50, .max = 60000 },
	{ "snapshot-entries", 0, ALLOT__OPT_U32, "N",
	    "Log entries between two snapshots of the state; the log keeps\n"
	    "as many more for members that lag a little (default: 1024,\n"
	    "keeping 128). A member further behind, or a new one, is sent\n"
	    "the snapshot, and installs its config as the cluster's.\n",
	    .off = FIELD(snapshot_entries), .min = 16, .max = 1000000 },
	{ "raft-member-id", 0, ALLOT__OPT_STR, "SPIFFE_ID",
	    "With --tls-cert and --tls-ca, members talk mutual TLS: a peer\n"
	    "must present a certificate from that CA for this SPIFFE ID\n"
	    "(default: the one in this member's own certificate; a last\n"
	    "segment \"*\" accepts per-member IDs). Without them, members\n"
	    "talk plain TCP: keep --raft-addr on a private network.\n",
	    .off = FIELD(raft_member_id) },
	{ "member", 0, ALLOT__OPT_CALL, "NAME=SYNC_URL", NULL,
	    .set = parse_gone },
	{ "self", 0, ALLOT__OPT_CALL, "NAME",
	    "Gone (the probing cluster): an error naming what replaced\n"
	    "them.\n",
	    .set = parse_gone },
	{ "hold-expired", 0, ALLOT__OPT_CALL, "none|lease|fallback",
	    "What the share of an expired replica (silent past its expiry\n"
	    "with its connection still open: stopped, or partitioned and\n"
	    "still admitting) keeps out of the headroom: none (the others\n"
	    "get it at once), lease (default: its grants until its lease\n"
	    "has certainly ended), fallback (also its fallback allowance\n"
	    "afterwards, for 60 s: a partition never over-admits, a hung\n"
	    "replica's capacity stays unused that long). A replica whose\n"
	    "connection closed (it exited) is never held. See\n"
	    "docs/allocation.md.\n",
	    .set = parse_hold },
	{ "central-reserve", 0, ALLOT__OPT_CALL, "on|off",
	    "The tail path (default on): each quota keeps what its\n"
	    "replicas' traffic does not need in a central reserve, served\n"
	    "to a request whose local bucket is short in one round trip\n"
	    "(an Ask); off: every quota is decided locally only, as with\n"
	    "`reserve: 0` on each. See docs/allocation.md, \"The central\n"
	    "reserve\".\n",
	    .set = parse_central },
	{ "loan-frac", 0, ALLOT__OPT_DOUBLE, "F",
	    "Loans: a replica that starts denying a quota gets tokens taken\n"
	    "from idle replicas' buckets at once, at most F x R x min(T,\n"
	    "100 ms) of a quota lent at a time (0 to 1, default 0.3; 0: no\n"
	    "loans). See docs/allocation.md, \"Loans\".\n",
	    .off = FIELD(so.policy.loan_frac), .lo = 0, .hi = 1 },
	{ "lease-ms", 0, ALLOT__OPT_U32, "MS",
	    "How long an agent may use a share without hearing from allotd\n"
	    "(default 3000).\n",
	    .off = FIELD(so.lease_ms), .min = 10, .max = 3600000 },
	{ "interval-ms", 0, ALLOT__OPT_U32, "MS",
	    "Expected agent sync interval T; also allotd's sweep period\n"
	    "(default 100).\n",
	    .off = FIELD(so.interval_ms), .min = 5, .max = 600000 },
	{ "expiry-intervals", 0, ALLOT__OPT_U32, "K",
	    "A replica silent for K intervals (of T, or of its own longer\n"
	    "interval) is expired and its share given back (default 5).\n",
	    .off = FIELD(so.expiry_intervals), .min = 1, .max = 1000 },
	{ "retention-s", 0, ALLOT__OPT_U32, "S",
	    "Usage and event rows older than S seconds are deleted\n"
	    "(default 604800, 7 days; 0 keeps everything).\n",
	    .off = FIELD(retention_s), .min = 0 },
	{ "workers", 0, ALLOT__OPT_U32, "N",
	    "Requests handled concurrently, one nng context each (default "
	    "8).\n",
	    .off = FIELD(workers), .min = 1, .max = 1024 },
	{ "max-replicas", 0, ALLOT__OPT_U32, "N",
	    "Live replicas over all services (default 10000).\n",
	    .off = FIELD(so.max_replicas), .min = 1, .max = 10000000 },
	{ "max-services", 0, ALLOT__OPT_U32, "N",
	    "Services at once (default 256); a Register of a new one\n"
	    "beyond it is answered RATE_LIMITED. Empty services are freed\n"
	    "(--service-idle-ms), so only live ones count.\n",
	    .off = FIELD(so.max_services), .min = 1, .max = 1000000 },
	{ "max-replicas-per-service", 0, ALLOT__OPT_U32, "N",
	    "Live replicas of one service (default 1000); a new one beyond\n"
	    "it is answered RATE_LIMITED, reason \"capacity\".\n",
	    .off = FIELD(so.max_replicas_per_service), .min = 1,
	    .max = 10000000 },
	{ "max-replicas-per-peer", 0, ALLOT__OPT_U32, "N",
	    "Live replicas of one service registered from one peer (an IP\n"
	    "address, or a local uid for ipc://; default 256, 0 no limit);\n"
	    "a new one beyond it is answered RATE_LIMITED, reason\n"
	    "\"peer_replicas\". Size it for the most replicas of a service\n"
	    "behind one address (NAT).\n",
	    .off = FIELD(so.max_replicas_per_peer), .min = 0,
	    .max = 10000000 },
	{ "service-idle-ms", 0, ALLOT__OPT_U32, "MS",
	    "A service with no replica left (live, restored or expired) is\n"
	    "freed after MS (default 60000; 0 never): its counters and\n"
	    "series go, a later Register starts it afresh.\n",
	    .off = FIELD(so.service_idle_ms), .min = 0 },
	{ "max-keys", 0, ALLOT__OPT_U32, "N",
	    "Keys one Register may name (default 65537); more are\n"
	    "answered TOO_LARGE. Only keys that name a quota are kept (at\n"
	    "most one per quota), about 180 bytes each; the others are\n"
	    "counted (docs/operations.md, \"Memory bounds\").\n",
	    .off = FIELD(max_keys), .min = 1, .max = ALLOT__SERVER_MAX_KEYS },
	{ "peer-register-rate", 0, ALLOT__OPT_CALL, "R[:B]",
	    "Registers per second each peer may send, with a burst of B\n"
	    "(default 20:50; B defaults to 2 R; 0 disables). A peer is a\n"
	    "remote IP address (tcp, tls+tcp), a local uid (ipc), or\n"
	    "\"local\". Over it: Error RATE_LIMITED, counted as\n"
	    "allotd_rejected_messages_total{reason=\"peer_register_rate\"}.\n",
	    .set = parse_peer_register },
	{ "peer-message-rate", 0, ALLOT__OPT_CALL, "R[:B]",
	    "Messages of any kind per second each peer may send (default\n"
	    "2000:4000; 0 disables); reason \"peer_message_rate\". A host\n"
	    "sends about (its replicas) x (members) / T per second over\n"
	    "the cluster, (its replicas) / T to each member.\n",
	    .set = parse_peer_message },
	{ "peer-table", 0, ALLOT__OPT_U32, "N",
	    "Peers tracked for those budgets (default 4096, about 450\n"
	    "bytes each); beyond it, new peers share one budget while\n"
	    "every tracked peer is still paying off a burst.\n",
	    .off = FIELD(plo.capacity), .min = 1, .max = 1000000 },
	{ "peer-connections", 0, ALLOT__OPT_U32, "N",
	    "Connections of one peer that, once a Register on them\n"
	    "succeeded (with --tls-ca: proved its identity), leave the\n"
	    "address's message budget for one shared by the address's\n"
	    "connections of the same service, so that a flood from other\n"
	    "connections of the address cannot throttle them (default\n"
	    "256; 0: every message is charged to its address). Each holds\n"
	    "a slot of --peer-table until it closes.\n",
	    .off = FIELD(plo.conns_per_peer), .min = 0, .max = 1000000 },
	{ "log-level", 0, ALLOT__OPT_LEVEL, "LEVEL",
	    "err, warning, notice, info or debug, or 0-7 (default info).\n",
	    .off = FIELD(log_level) },
	{ "log-format", 0, ALLOT__OPT_CALL, "FORMAT",
	    "text (\"TIME LEVEL ID message\" lines), json (one object a\n"
	    "line: ts, level, program, id, msg), journal (text with the\n"
	    "syslog priority prefix journald reads) or auto (default:\n"
	    "journal when stderr is the journal, else text).\n",
	    .set = parse_log_format },
	{ "help", 'h', ALLOT__OPT_HELP, NULL, "Print this text and exit.\n",
	    .cli_only = true },
	{ "version", 'V', ALLOT__OPT_CALL, NULL,
	    "Print the version and exit.\n", .set = show_version },
};

/* ---- --help and --version ---- */

static const char help_head[] =
    "NAME\n"
    "    allotd - the allot coordinator: global quotas, per-replica "
    "shares\n"
    "\n"
    "SYNOPSIS\n"
    "    allotd [--options FILE] --config FILE --db FILE [--listen URL]... "
    "[--http "
    "HOST:PORT]\n"
    "           [--lease-ms MS] [--interval-ms MS] [--expiry-intervals K]\n"
    "           [--retention-s S] [--workers N] [--log-level LEVEL]\n"
    "           [--log-format text|json|journal|auto]\n"
    "           [--raft-id ID --raft-addr HOST:PORT [--raft-dir DIR]\n"
    "            [--agent-url URL] (--seed ID=RAFT_ADDR=AGENT_URL... | "
    "--join)]\n"
    "           [--hold-expired none|lease|fallback] [--loan-frac F]\n"
    "           [--central-reserve on|off]\n"
    "           [--admin-socket PATH [--admin-group GROUP]]\n"
    "           [--admin-listen HOST:PORT [--admin-ca FILE]\n"
    "            --admin-allow SPIFFE_ID...]\n"
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

static const allot__opts table = {
	.prog = "allotd",
	.rows = rows,
	.n = sizeof rows / sizeof rows[0],
	.style = ALLOT__OPTS_MAN,
	.head = help_head,
	.tail = help_tail,
};

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
	allot__logfmt_parse("auto", &o->log_format);
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

/* A cross-option error: said with the "Try" line; -1. */
static int usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int
usage(const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	allot__opts_error(&table, "%s", msg);
	return -1;
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
	if (o->raft_id == 0 || o->raft_addr == NULL)
		return usage("a cluster member needs --raft-id and "
		             "--raft-addr");
	if ((o->nseeds > 0) == o->join)
		return usage("give either --seed for every member of a new "
		             "cluster, or --join");
	bool self = false;
	for (size_t i = 0; i < o->nseeds; i++)
		if (o->seeds[i].id == o->raft_id) {
			self = true;
			if (strcmp(o->seeds[i].raft, o->raft_addr) != 0)
				return usage("--seed %" PRIu64 " names %s, "
				             "but --raft-addr is %s",
				    o->raft_id, o->seeds[i].raft,
				    o->raft_addr);
			if (o->agent_url == NULL)
				o->agent_url = o->seeds[i].url;
		}
	if (o->nseeds > 0 && !self)
		return usage("--raft-id %" PRIu64
		             " is not one of the --seed ids",
		    o->raft_id);
	if (o->tls_key != NULL && o->tls_cert == NULL)
		return usage("--tls-key needs --tls-cert (the certificate "
		             "the key goes with)");
	if (o->raft_member_id != NULL &&
	    (o->tls_cert == NULL || o->tls_ca == NULL))
		return usage("--raft-member-id needs --tls-cert and "
		             "--tls-ca (members talk TLS only with both)");
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
	if (o->config_path == NULL || o->db_path == NULL)
		return usage("--config and --db are required");
	if (o->nurls == 0)
		o->urls[o->nurls++] = DEFAULT_LISTEN;
	if (check_cluster(o) != 0)
		return -1;
	if (strcmp(o->http_addr, "off") == 0 ||
	    strcmp(o->http_addr, "none") == 0)
		o->http_addr = NULL;
	if (o->admin_group != NULL && o->admin_socket == NULL)
		return usage("--admin-group needs --admin-socket");
	if (o->admin_listen == NULL &&
	    (o->admin_ca != NULL || o->nadmin_allow > 0))
		return usage(
		    "--admin-ca and --admin-allow need --admin-listen");
	if (o->admin_ca == NULL)
		o->admin_ca = o->tls_ca;
	if (o->admin_listen != NULL &&
	    (o->tls_cert == NULL || o->admin_ca == NULL ||
	        o->nadmin_allow == 0))
		return usage(
		    "--admin-listen needs --tls-cert (allotd's "
		    "certificate and key), --admin-ca or --tls-ca (its "
		    "callers' CA) and at least one --admin-allow");
	if (o->require_id < 0)
		o->require_id = o->tls_ca != NULL;
	if (o->require_id && o->tls_ca == NULL)
		return usage("--require-identity needs --tls-ca");
	if (o->require_id && make_authn(o) != 0)
		return -1;
	return 0;
}

int
allot__daemon_parse(int argc, char **argv, allot__daemon_opts *o)
{
	opts_init(o);
	int rc = allot__opts_preload(&table, argc, argv, o, NULL);
	if (rc == ALLOT__OPTS_OK)
		rc = allot__opts_parse(&table, NULL, argc, argv, o);
	if (rc != ALLOT__OPTS_OK)
		return rc == ALLOT__OPTS_DONE ? EXIT_SUCCESS :
		                                ALLOT__DAEMON_EXIT_USAGE;
	return check(o) != 0 ? ALLOT__DAEMON_EXIT_USAGE : -1;
}
