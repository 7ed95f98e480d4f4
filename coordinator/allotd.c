/* SPDX-License-Identifier: MIT */
/*
 * allotd: the allot coordinator daemon. main() parses the command line,
 * loads the quota config, opens the SQLite store, restores what the last
 * run left live, starts the protocol server (server.c) and the HTTP
 * endpoints (http.c), and then runs a libuv loop on the main thread that
 * owns every periodic duty: expiry sweeps and share recomputation every
 * interval, usage rows and one group commit per second, SIGHUP reloads,
 * and the SIGTERM/SIGINT drain (stop accepting, let in-flight requests
 * finish, final commit, "stop" event, every handle closed and
 * uv_loop_close() == 0).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nng/nng.h>
#include <uv.h>

#include "alloc.h"
#include "authn.h"
#include "clock.h"
#include "config.h"
#include "http.h"
#include "log.h"
#include "metrics.h"
#include "rendezvous.h"
#include "server.h"
#include "state.h"
#include "store.h"
#include "cluster.h"

#define EXIT_USAGE 2
#define DEFAULT_LISTEN "tcp://127.0.0.1:7400"
#define DEFAULT_HTTP "127.0.0.1:7480"
#define DRAIN_MAX_MS 2000u
#define CONFIG_MAX_BYTES (16u * 1024u * 1024u)

typedef struct allotd {
	uv_loop_t loop;
	uv_timer_t tick;
	uv_timer_t drain_timer;
	uv_signal_t sig_term;
	uv_signal_t sig_int;
	uv_signal_t sig_hup;
	bool handles_open;
	allot__logger lg;
	allot__metrics metrics;
	allot__store *store;
	allot__state *state;
	allot__server *server;
	allot__peerlimit *peerlimit;
	allot__http *http;
	allot__cluster *cluster;
	const char *config_path;
	uint32_t interval_ms;
	uint64_t last_second_ns;
	uint64_t drain_deadline_ns;
	bool draining;
	const char *stop_signal;
	allot__logrl rl_store;
} allotd;

static void
usage(FILE *f)
{
	fputs(
	    "NAME\n"
	    "    allotd - the allot coordinator: global quotas, per-replica "
	    "shares\n"
	    "\n"
	    "SYNOPSIS\n"
	    "    allotd --config FILE --db FILE [--listen URL]... [--http "
	    "HOST:PORT]\n"
	    "           [--lease-ms MS] [--interval-ms MS] "
	    "[--expiry-intervals K]\n"
	    "           [--retention-s S] [--workers N] [--log-level LEVEL]\n"
	    "           [--member NAME=SYNC_URL]... [--self NAME]\n"
	    "           [--hold-expired none|lease|fallback]\n"
	    "    allotd --help | --version\n"
	    "\n"
	    "DESCRIPTION\n"
	    "    allotd receives what every replica's agent (liballot) "
	    "admitted and\n"
	    "    denied per quota, keeps global usage in memory and in a "
	    "SQLite file,\n"
	    "    and answers each agent with its share of every quota: a "
	    "local rate\n"
	    "    and burst valid for a lease. Shares are recomputed whenever "
	    "the\n"
	    "    number of live replicas of a service or the quota config "
	    "changes,\n"
	    "    and reach the agents on their next sync. The quota file "
	    "applies to\n"
	    "    every service; each agent names its service when it "
	    "registers.\n"
	    "    The wire protocol is described in docs/protocol.md.\n"
	    "\n"
	    "OPTIONS\n"
	    "    -c, --config FILE\n"
	    "        Quota file (YAML, docs/configuration.md). Required. A "
	    "bad file\n"
	    "        at start-up is fatal; on SIGHUP it is logged and the "
	    "config in\n"
	    "        force is kept.\n"
	    "    -d, --db FILE\n"
	    "        SQLite store, created if missing (WAL mode, schema "
	    "migrated).\n"
	    "        Required. Query it with the sqlite3 shell "
	    "(docs/operations.md).\n"
	    "    -l, --listen URL\n"
	    "        Protocol address, nng syntax: tcp://HOST:PORT or "
	    "ipc:///PATH.\n"
	    "        Repeat for several. Default " DEFAULT_LISTEN ".\n"
	    "    -H, --http HOST:PORT\n"
	    "        Address of the dashboard (/), /metrics, /status and "
	    "/healthz,\n"
	    "        or \"off\". Read-only: nothing on it changes allotd.\n"
	    "        Default " DEFAULT_HTTP ".\n"
	    "    --tls-cert FILE, --tls-ca FILE\n"
	    "        For tls+tcp:// listeners (mutual TLS): allotd's "
	    "certificate and\n"
	    "        private key in one PEM file, and the CA that agents'\n"
	    "        certificates must chain to. Agents without a valid "
	    "certificate\n"
	    "        cannot connect. Plain tcp:// beyond loopback logs a "
	    "warning.\n"
	    "    --require-identity, --no-require-identity\n"
	    "        Every Register must prove, by a signature with its "
	    "certificate's\n"
	    "        key, the SPIFFE identity of its service; sessions stay "
	    "bound\n"
	    "        to their connection. On by default with --tls-ca.\n"
	    "    --identity-map SPIFFE_PATTERN\n"
	    "        Which part of a certificate's SPIFFE ID is the service, "
	    "e.g.\n"
	    "        spiffe://example.org/ns/*/sa/{service} (repeat; first "
	    "match\n"
	    "        wins). Default: the ID's last path segment.\n"
	    "    --identity-audience URL\n"
	    "        A coordinator URL agents dial that is not a --listen "
	    "URL\n"
	    "        (e.g. behind a DNS name or NAT); repeat for several.\n"
	    "    --member NAME=SYNC_URL, --self NAME\n"
	    "        Cluster mode: the full static member list (repeat "
	    "--member\n"
	    "        for each member, identical on every member and in every\n"
	    "        agent's coordinator list) and which of them this allotd "
	    "is.\n"
	    "        Each key (service, quota) is owned by one live member "
	    "chosen\n"
	    "        by rendezvous hashing of the member names. Without "
	    "--listen,\n"
	    "        allotd listens on its own SYNC_URL. See "
	    "docs/operations.md,\n"
	    "        \"Cluster\".\n",
	    f);
	fputs(
	    "    --hold-expired none|lease|fallback\n"
	    "        What the share of an expired replica (silent past its "
	    "expiry:\n"
	    "        crashed, or partitioned and still admitting) keeps out "
	    "of "
	    "the\n"
	    "        headroom: none (default: the others get it at once), "
	    "lease (its\n"
	    "        grants until its lease has certainly ended), fallback "
	    "(also its\n"
	    "        fallback allowance afterwards, for 60 s: a partition "
	    "never\n"
	    "        over-admits, a crash leaves that capacity unused). See\n"
	    "        docs/allocation.md.\n"
	    "    --lease-ms MS\n"
	    "        How long an agent may use a share without hearing from "
	    "allotd\n"
	    "        (default 3000).\n"
	    "    --interval-ms MS\n"
	    "        Expected agent sync interval T; also allotd's sweep "
	    "period\n"
	    "        (default 100).\n"
	    "    --expiry-intervals K\n"
	    "        A replica silent for K intervals (of T, or of its own "
	    "longer\n"
	    "        interval) is expired and its share given back (default "
	    "5).\n"
	    "    --retention-s S\n"
	    "        Usage and event rows older than S seconds are deleted\n"
	    "        (default 604800, 7 days; 0 keeps everything).\n"
	    "    --workers N\n"
	    "        Requests handled concurrently, one nng context each "
	    "(default 8).\n"
	    "    --max-replicas N\n"
	    "        Live replicas over all services (default 10000).\n"
	    "    --max-keys N\n"
	    "        Keys one Register may name (default 65537); more are\n"
	    "        answered TOO_LARGE. With --max-replicas it bounds the\n"
	    "        registry: about 165 bytes per key (docs/operations.md,\n"
	    "        \"Memory bounds\").\n",
	    f);
	fputs("    --peer-register-rate R[:B]\n"
	      "        Registers per second each peer may send, with a burst "
	      "of B\n"
	      "        (default 20:50; B defaults to 2 R; 0 disables). A peer "
	      "is a\n"
	      "        remote IP address (tcp, tls+tcp), a local uid (ipc), "
	      "or\n"
	      "        \"local\". Over it: Error RATE_LIMITED, counted as\n"
	      "        allotd_rejected_messages_total{reason=\""
	      "peer_register_rate\"}.\n"
	      "    --peer-message-rate R[:B]\n"
	      "        Messages of any kind per second each peer may send "
	      "(default\n"
	      "        2000:4000; 0 disables); reason \"peer_message_rate\". "
	      "A host\n"
	      "        sends about (its replicas) x (members) / T per second "
	      "over\n"
	      "        the cluster, (its replicas) / T to each member.\n"
	      "    --peer-table N\n"
	      "        Peers tracked for those budgets (default 4096, about "
	      "450\n"
	      "        bytes each); beyond it, new peers share one budget "
	      "while\n"
	      "        every tracked peer is still paying off a burst.\n"
	      "    --log-level LEVEL\n"
	      "        err, warning, notice, info or debug, or 0-7 (default "
	      "info).\n"
	      "    -h, --help\n"
	      "        Print this text and exit.\n"
	      "    -V, --version\n"
	      "        Print the version and exit.\n"
	      "\n",
	    f);
	fputs(
	    "SIGNALS\n"
	    "    SIGHUP   reload the quota file: a new epoch and new shares, "
	    "or an\n"
	    "             ALLOTD-RELOAD-FAIL line naming the error.\n"
	    "    SIGTERM, SIGINT\n"
	    "             drain: stop accepting, finish requests in flight "
	    "(at most\n"
	    "             2 s), commit the store, record a \"stop\" event, "
	    "exit 0.\n"
	    "\n"
	    "RESTART\n"
	    "    Sessions do not survive a restart: agents get "
	    "UNKNOWN_SESSION and\n"
	    "    register again, keeping their local buckets. Replicas that "
	    "were\n"
	    "    live are restored as placeholders that keep counting toward "
	    "their\n"
	    "    service's replica count (so the first to return is not "
	    "handed the\n"
	    "    whole quota) until they register again or expire.\n"
	    "\n"
	    "LOGGING\n"
	    "    Lines on stderr: time, level, a stable id (ALLOTD-START, "
	    "-JOIN,\n"
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
	    "        --listen tcp://0.0.0.0:7400 --listen "
	    "ipc:///run/allot/allotd.sock\n"
	    "\n"
	    "SEE ALSO\n"
	    "    docs/protocol.md, docs/operations.md, "
	    "docs/configuration.md\n",
	    f);
}

static int
parse_u32(
    const char *opt, const char *s, uint32_t min, uint32_t max, uint32_t *ret)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || s[0] == '-' || v < min ||
	    v > max) {
		fprintf(stderr,
		    "allotd: %s expects an integer from %" PRIu32
		    " to %" PRIu32 ", not \"%s\"\n",
		    opt, min, max, s);
		return -1;
	}
	*ret = (uint32_t) v;
	return 0;
}

static int
parse_level(const char *s, int *ret)
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
			*ret = names[i].level;
			return 0;
		}
	}
	if (s[0] >= '0' && s[0] <= '7' && s[1] == '\0') {
		*ret = s[0] - '0';
		return 0;
	}
	fprintf(stderr,
	    "allotd: --log-level expects err, warning, notice, "
	    "info, debug or 0-7, not \"%s\"\n",
	    s);
	return -1;
}

/* Read a whole file (the store keeps the config text as it was read). */
static int
read_file(
    const char *path, char **ret, size_t *ret_len, char *err, size_t errlen)
{
	FILE *f = fopen(path, "rb");
	if (f == NULL) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return errno == ENOENT ? ALLOT_ENOENT : ALLOT_EIO;
	}
	char *buf = NULL;
	size_t len = 0, cap = 0;
	int rc = ALLOT_OK;
	for (;;) {
		if (cap - len < 4096) {
			cap = cap ? cap * 2 : 8192;
			char *nb = realloc(buf, cap + 1);
			if (nb == NULL) {
				snprintf(
				    err, errlen, "%s: out of memory", path);
				rc = ALLOT_ENOMEM;
				goto out;
			}
			buf = nb;
		}
		size_t n = fread(buf + len, 1, cap - len, f);
		len += n;
		if (len > CONFIG_MAX_BYTES) {
			snprintf(err, errlen, "%s: larger than %u bytes", path,
			    CONFIG_MAX_BYTES);
			rc = ALLOT_ECONFIG;
			goto out;
		}
		if (n == 0)
			break;
	}
	if (ferror(f)) {
		snprintf(err, errlen, "%s: read error", path);
		rc = ALLOT_EIO;
		goto out;
	}
	buf[len] = '\0';
	*ret = buf;
	*ret_len = len;
	buf = NULL;
out:
	free(buf);
	fclose(f);
	return rc;
}

/* Load and validate; on success *ret_cfg and *ret_text are the caller's. */
static int
load_config(const char *path, allot_config **ret_cfg, char **ret_text,
    char *err, size_t errlen)
{
	char *text;
	size_t len;
	int rc = read_file(path, &text, &len, err, errlen);
	if (rc != ALLOT_OK)
		return rc;
	allot_config *cfg;
	rc = allot_config_parse(path, text, len, err, errlen, &cfg);
	if (rc != ALLOT_OK) {
		free(text);
		return rc;
	}
	*ret_cfg = cfg;
	*ret_text = text;
	return ALLOT_OK;
}

/* ------------------------------------------------------------------ */
/* loop callbacks                                                      */
/* ------------------------------------------------------------------ */

static void
store_commit(allotd *d)
{
	if (d->store == NULL)
		return;
	uint64_t t0 = allot__mono_ns();
	int rc = allot__store_flush(d->store);
	allot__hist_observe_ns(
	    &d->metrics.store_commit, allot__mono_ns() - t0);
	allot__store_stats s;
	allot__store_stats_get(d->store, &s);
	atomic_store(&d->metrics.store_commit_failures, s.commit_failures);
	atomic_store(&d->metrics.store_pending, s.pending);
	atomic_store(&d->metrics.store_rows_dropped, s.rows_dropped);
	atomic_store(&d->metrics.store_rows_written, s.rows_written);
	if (rc != ALLOT_OK)
		allot__log_ratelimited(&d->lg, &d->rl_store, ALLOT_LOG_ERR,
		    "ALLOTD-STORE-FAIL",
		    "group commit failed (SQLite code "
		    "%d, %" PRIu64 " rows queued, %" PRIu64 " failures so "
		    "far); allocating from memory and retrying",
		    s.last_error, s.pending, s.commit_failures);
}

static void
on_tick(uv_timer_t *t)
{
	allotd *d = t->data;
	allot__state_tick(d->state);
	uint64_t now = allot__mono_ns();
	if (now - d->last_second_ns >= 1000000000u) {
		d->last_second_ns = now;
		allot__state_second(d->state);
		store_commit(d);
		allot__peerlimit_stats ps;
		allot__peerlimit_stats_get(d->peerlimit, &ps);
		atomic_store(&d->metrics.peers_tracked, ps.peers);
		atomic_store(&d->metrics.peer_overflow, ps.overflow);
	}
}

static void
reload(allotd *d)
{
	char err[1024];
	allot_config *cfg;
	char *text;
	int rc = load_config(d->config_path, &cfg, &text, err, sizeof err);
	if (rc != ALLOT_OK) {
		allot__metrics_add(&d->metrics.reloads_failed, 1);
		allot__log(&d->lg, ALLOT_LOG_ERR, "ALLOTD-RELOAD-FAIL",
		    "%s; keeping config epoch %" PRIu64 " (digest %016" PRIx64
		    ")",
		    err, allot__state_epoch(d->state),
		    allot__state_digest(d->state));
		allot__store_event(
		    d->store, "config_rejected", d->config_path, err);
		return;
	}
	bool changed = false;
	uint64_t digest = cfg->digest;
	rc = allot__state_reload(
	    d->state, cfg, d->config_path, text, &changed);
	free(text);
	if (rc != ALLOT_OK) {
		allot_config_free(cfg);
		allot__metrics_add(&d->metrics.reloads_failed, 1);
		allot__log(&d->lg, ALLOT_LOG_ERR, "ALLOTD-RELOAD-FAIL",
		    "%s: %s; keeping the config in force", d->config_path,
		    allot_strerror(rc));
		return;
	}
	allot__metrics_add(&d->metrics.reloads_ok, 1);
	if (!changed) {
		allot__log(&d->lg, ALLOT_LOG_NOTICE, "ALLOTD-RELOAD-SAME",
		    "%s is unchanged (digest %016" PRIx64
		    "); epoch stays %" PRIu64,
		    d->config_path, digest, allot__state_epoch(d->state));
		return;
	}
	uint64_t epoch = allot__state_epoch(d->state);
	allot__log(&d->lg, ALLOT_LOG_NOTICE, "ALLOTD-RELOAD",
	    "loaded %s: epoch %" PRIu64 ", digest %016" PRIx64
	    "; shares recomputed",
	    d->config_path, epoch, digest);
	char detail[96];
	snprintf(detail, sizeof detail, "epoch=%" PRIu64 " digest=%016" PRIx64,
	    epoch, digest);
	allot__store_event(d->store, "config", d->config_path, detail);
}

static void
close_cb(uv_handle_t *h)
{
	(void) h;
}

static void
finish(allotd *d)
{
	uv_timer_stop(&d->drain_timer);
	uv_timer_stop(&d->tick);
	allot__server_close(d->server);
	d->server = NULL;
	allot__http_stop(d->http);
	d->http = NULL;
	allot__cluster_stop(d->cluster);
	d->cluster = NULL;
	/* The last partial second of usage, then the stop event, then one
	 * final commit. Sessions stay open in the store: the replicas are
	 * alive, only the coordinator stops; a restart restores them. */
	allot__state_second(d->state);
	char detail[96];
	snprintf(detail, sizeof detail, "signal=%s replicas=%zu",
	    d->stop_signal, allot__state_replicas(d->state));
	allot__store_event(d->store, "stop", NULL, detail);
	store_commit(d);
	allot__log(&d->lg, ALLOT_LOG_NOTICE, "ALLOTD-STOP", "stopped on %s",
	    d->stop_signal);
	if (d->handles_open) {
		uv_close((uv_handle_t *) &d->tick, close_cb);
		uv_close((uv_handle_t *) &d->drain_timer, close_cb);
		uv_close((uv_handle_t *) &d->sig_term, close_cb);
		uv_close((uv_handle_t *) &d->sig_int, close_cb);
		uv_close((uv_handle_t *) &d->sig_hup, close_cb);
		d->handles_open = false;
	}
}

static void
on_drain_timer(uv_timer_t *t)
{
	allotd *d = t->data;
	bool idle = allot__server_idle(d->server);
	if (!idle && allot__mono_ns() < d->drain_deadline_ns)
		return;
	if (!idle)
		allot__log(&d->lg, ALLOT_LOG_WARNING, "ALLOTD-DRAIN",
		    "requests still in flight after %u ms; closing anyway",
		    DRAIN_MAX_MS);
	finish(d);
}

static void
on_signal(uv_signal_t *s, int signum)
{
	allotd *d = s->data;
	if (signum == SIGHUP) {
		if (!d->draining)
			reload(d);
		return;
	}
	if (d->draining) {
		/* A second SIGTERM/SIGINT: stop waiting for requests. */
		d->drain_deadline_ns = 0;
		return;
	}
	d->draining = true;
	d->stop_signal = signum == SIGTERM ? "SIGTERM" : "SIGINT";
	allot__log(&d->lg, ALLOT_LOG_NOTICE, "ALLOTD-DRAIN",
	    "%s: no longer accepting; finishing requests in flight",
	    d->stop_signal);
	allot__server_drain(d->server);
	allot__http_drain(d->http);
	d->drain_deadline_ns = allot__mono_ns() + DRAIN_MAX_MS * 1000000ull;
	uv_timer_start(&d->drain_timer, on_drain_timer, 0, 5);
}

/* ------------------------------------------------------------------ */
/* main                                                                */
/* ------------------------------------------------------------------ */

enum {
	OPT_LEASE = 256,
	OPT_INTERVAL,
	OPT_EXPIRY,
	OPT_RETENTION,
	OPT_WORKERS,
	OPT_LOGLEVEL,
	OPT_MAXREP,
	OPT_MAXKEYS,
	OPT_TLSCERT,
	OPT_TLSCA,
	OPT_REQID,
	OPT_NOREQID,
	OPT_IDMAP,
	OPT_IDAUD,
	OPT_MEMBER,
	OPT_SELF,
	OPT_HOLD,
	OPT_PEER_REG,
	OPT_PEER_MSG,
	OPT_PEER_TABLE,
};

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "config", required_argument, NULL, 'c' },
		{ "db", required_argument, NULL, 'd' },
		{ "listen", required_argument, NULL, 'l' },
		{ "http", required_argument, NULL, 'H' },
		{ "lease-ms", required_argument, NULL, OPT_LEASE },
		{ "interval-ms", required_argument, NULL, OPT_INTERVAL },
		{ "expiry-intervals", required_argument, NULL, OPT_EXPIRY },
		{ "retention-s", required_argument, NULL, OPT_RETENTION },
		{ "workers", required_argument, NULL, OPT_WORKERS },
		{ "max-replicas", required_argument, NULL, OPT_MAXREP },
		{ "max-keys", required_argument, NULL, OPT_MAXKEYS },
		{ "tls-cert", required_argument, NULL, OPT_TLSCERT },
		{ "tls-ca", required_argument, NULL, OPT_TLSCA },
		{ "require-identity", no_argument, NULL, OPT_REQID },
		{ "no-require-identity", no_argument, NULL, OPT_NOREQID },
		{ "identity-map", required_argument, NULL, OPT_IDMAP },
		{ "identity-audience", required_argument, NULL, OPT_IDAUD },
		{ "log-level", required_argument, NULL, OPT_LOGLEVEL },
		{ "member", required_argument, NULL, OPT_MEMBER },
		{ "self", required_argument, NULL, OPT_SELF },
		{ "hold-expired", required_argument, NULL, OPT_HOLD },
		{ "peer-register-rate", required_argument, NULL,
		    OPT_PEER_REG },
		{ "peer-message-rate", required_argument, NULL, OPT_PEER_MSG },
		{ "peer-table", required_argument, NULL, OPT_PEER_TABLE },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	const char *urls[ALLOT__SERVER_MAX_URLS];
	size_t nurls = 0;
	const char *db_path = NULL, *http_addr = DEFAULT_HTTP;
	const char *tls_cert = NULL, *tls_ca = NULL;
	int require_id = -1; /* default: with --tls-ca */
	const char *idmaps[ALLOT__AUTHN_MAX_MAPS];
	const char *idaud[ALLOT__AUTHN_MAX_AUDIENCES];
	size_t nidmaps = 0, nidaud = 0;
	allot__authn *authn = NULL;
	uint32_t retention_s = 7u * 24u * 3600u, workers = 8;
	uint32_t max_keys = ALLOT__SERVER_MAX_KEYS;
	int log_level = ALLOT_LOG_INFO;
	static allot__member members[ALLOT__CLUSTER_MAX_MEMBERS];
	size_t nmembers = 0;
	const char *self_name = NULL;
	int self = -1;
	allot__state_opts so;
	allot__state_opts_init(&so);
	allot__peerlimit_opts plo;
	allot__peerlimit_opts_init(&plo);
	static allotd d;
	d.stop_signal = "?";
	d.rl_store = (allot__logrl) ALLOT__LOGRL_INIT(3, 10000);

	int c;
	while ((c = getopt_long(argc, argv, "c:d:l:H:hV", longopts, NULL)) !=
	    -1) {
		switch (c) {
		case 'c': d.config_path = optarg; break;
		case 'd': db_path = optarg; break;
		case 'l':
			if (nurls == ALLOT__SERVER_MAX_URLS) {
				fprintf(stderr,
				    "allotd: at most %u --listen\n",
				    ALLOT__SERVER_MAX_URLS);
				return EXIT_USAGE;
			}
			urls[nurls++] = optarg;
			break;
		case 'H': http_addr = optarg; break;
		case OPT_LEASE:
			if (parse_u32("--lease-ms", optarg, 10, 3600000,
			        &so.lease_ms) != 0)
				return EXIT_USAGE;
			break;
		case OPT_INTERVAL:
			if (parse_u32("--interval-ms", optarg, 5, 600000,
			        &so.interval_ms) != 0)
				return EXIT_USAGE;
			break;
		case OPT_EXPIRY:
			if (parse_u32("--expiry-intervals", optarg, 1, 1000,
			        &so.expiry_intervals) != 0)
				return EXIT_USAGE;
			break;
		case OPT_RETENTION:
			if (parse_u32("--retention-s", optarg, 0, UINT32_MAX,
			        &retention_s) != 0)
				return EXIT_USAGE;
			break;
		case OPT_WORKERS:
			if (parse_u32(
			        "--workers", optarg, 1, 1024, &workers) != 0)
				return EXIT_USAGE;
			break;
		case OPT_MAXKEYS:
			if (parse_u32("--max-keys", optarg, 1,
			        ALLOT__SERVER_MAX_KEYS, &max_keys) != 0)
				return EXIT_USAGE;
			break;
		case OPT_MAXREP:
			if (parse_u32("--max-replicas", optarg, 1, 10000000,
			        &so.max_replicas) != 0)
				return EXIT_USAGE;
			break;
		case OPT_TLSCERT: tls_cert = optarg; break;
		case OPT_TLSCA: tls_ca = optarg; break;
		case OPT_REQID: require_id = 1; break;
		case OPT_NOREQID: require_id = 0; break;
		case OPT_IDMAP:
			if (nidmaps == ALLOT__AUTHN_MAX_MAPS) {
				fprintf(stderr,
				    "allotd: at most %u --identity-map\n",
				    ALLOT__AUTHN_MAX_MAPS);
				return EXIT_USAGE;
			}
			idmaps[nidmaps++] = optarg;
			break;
		case OPT_IDAUD:
			/* Leave room for the --listen URLs and --self. */
			if (nidaud + ALLOT__SERVER_MAX_URLS + 1 >=
			    ALLOT__AUTHN_MAX_AUDIENCES) {
				fprintf(stderr,
				    "allotd: too many --identity-audience\n");
				return EXIT_USAGE;
			}
			idaud[nidaud++] = optarg;
			break;
		case OPT_MEMBER: {
			char merr[256];
			if (nmembers == ALLOT__CLUSTER_MAX_MEMBERS) {
				fprintf(stderr,
				    "allotd: at most %u --member\n",
				    ALLOT__CLUSTER_MAX_MEMBERS);
				return EXIT_USAGE;
			}
			if (allot__member_parse(optarg, false, merr,
			        sizeof merr, &members[nmembers]) != 0) {
				fprintf(
				    stderr, "allotd: --member: %s\n", merr);
				return EXIT_USAGE;
			}
			for (size_t i = 0; i < nmembers; i++)
				if (strcmp(members[i].name,
				        members[nmembers].name) == 0) {
					fprintf(stderr,
					    "allotd: --member %s "
					    "given twice\n",
					    members[i].name);
					return EXIT_USAGE;
				}
			nmembers++;
			break;
		}
		case OPT_SELF: self_name = optarg; break;
		case OPT_HOLD:
			if (strcmp(optarg, "none") == 0)
				so.hold_expired = ALLOT__HOLD_NONE;
			else if (strcmp(optarg, "lease") == 0)
				so.hold_expired = ALLOT__HOLD_LEASE;
			else if (strcmp(optarg, "fallback") == 0)
				so.hold_expired = ALLOT__HOLD_FALLBACK;
			else {
				fprintf(stderr,
				    "allotd: --hold-expired %s: expected "
				    "none, "
				    "lease or fallback\n",
				    optarg);
				return EXIT_USAGE;
			}
			break;
		case OPT_PEER_REG:
		case OPT_PEER_MSG: {
			char perr[256];
			bool reg = c == OPT_PEER_REG;
			if (allot__peerlimit_parse(optarg,
			        reg ? &plo.register_rate : &plo.message_rate,
			        reg ? &plo.register_burst : &plo.message_burst,
			        perr, sizeof perr) != 0) {
				fprintf(stderr, "allotd: --peer-%s-rate: %s\n",
				    reg ? "register" : "message", perr);
				return EXIT_USAGE;
			}
			break;
		}
		case OPT_PEER_TABLE:
			if (parse_u32("--peer-table", optarg, 1, 1000000,
			        &plo.capacity) != 0)
				return EXIT_USAGE;
			break;
		case OPT_LOGLEVEL:
			if (parse_level(optarg, &log_level) != 0)
				return EXIT_USAGE;
			break;
		case 'h': usage(stdout); return EXIT_SUCCESS;
		case 'V':
			printf("allotd %s\n", ALLOT_VERSION_STRING);
			return EXIT_SUCCESS;
		default:
			fprintf(stderr, "Try 'allotd --help'.\n");
			return EXIT_USAGE;
		}
	}
	if (optind < argc) {
		fprintf(stderr,
		    "allotd: unexpected argument \"%s\"\n"
		    "Try 'allotd --help'.\n",
		    argv[optind]);
		return EXIT_USAGE;
	}
	if (d.config_path == NULL || db_path == NULL) {
		fprintf(stderr,
		    "allotd: --config and --db are required\n"
		    "Try 'allotd --help'.\n");
		return EXIT_USAGE;
	}
	if ((nmembers > 0) != (self_name != NULL)) {
		fprintf(stderr,
		    "allotd: --member and --self go together\n"
		    "Try 'allotd --help'.\n");
		return EXIT_USAGE;
	}
	for (size_t i = 0; i < nmembers; i++)
		if (strcmp(members[i].name, self_name) == 0)
			self = (int) i;
	if (nmembers > 0 && self < 0) {
		fprintf(stderr,
		    "allotd: --self %s is not one of the --member "
		    "names\n",
		    self_name);
		return EXIT_USAGE;
	}
	if (nurls == 0)
		urls[nurls++] = self >= 0 ? members[self].url : DEFAULT_LISTEN;
	if (strcmp(http_addr, "off") == 0 || strcmp(http_addr, "none") == 0)
		http_addr = NULL;
	if (require_id < 0)
		require_id = tls_ca != NULL;
	if (require_id && tls_ca == NULL) {
		fprintf(stderr, "allotd: --require-identity needs --tls-ca\n");
		return EXIT_USAGE;
	}
	if (require_id) {
		/* Proofs may name any address allotd listens on or is known
		 * by in the cluster, besides the --identity-audience ones. */
		for (size_t i = 0; i < nurls; i++)
			idaud[nidaud++] = urls[i];
		if (self >= 0)
			idaud[nidaud++] = members[self].url;
		allot__authn_opts ao = {
			.ca_file = tls_ca,
			.maps = idmaps,
			.nmaps = nidmaps,
			.audiences = idaud,
			.naudiences = nidaud,
		};
		char aerr[512];
		if (allot__authn_new(&ao, aerr, sizeof aerr, &authn) !=
		    ALLOT_OK) {
			fprintf(stderr, "allotd: %s\n", aerr);
			return EXIT_USAGE;
		}
	}
	signal(SIGPIPE, SIG_IGN);

	int exit_code = EXIT_FAILURE;
	int rv;
	char err[1024];
	char *text = NULL;
	allot_config *cfg = NULL;
	d.lg = (allot__logger) {
		.fn = allot__log_stderr,
		.ctx = NULL,
		.level = log_level,
	};
	allot__metrics_init(&d.metrics);
	d.metrics.start_wall_ms = (uint64_t) allot__wall_ms();
	d.interval_ms = so.interval_ms;

	if (load_config(d.config_path, &cfg, &text, err, sizeof err) !=
	    ALLOT_OK) {
		allot__log(
		    &d.lg, ALLOT_LOG_ERR, "ALLOTD-CONFIG-FAIL", "%s", err);
		return EXIT_USAGE;
	}
	allot__store_opts sto = {
		.retention_s = retention_s,
		.max_pending = 1000000,
		.busy_timeout_ms = 50,
	};
	if (allot__store_open(
	        db_path, &sto, &d.lg, err, sizeof err, &d.store) != ALLOT_OK) {
		allot__log(
		    &d.lg, ALLOT_LOG_ERR, "ALLOTD-STORE-FAIL", "%s", err);
		goto out;
	}
	so.store = d.store;
	so.lg = &d.lg;
	so.metrics = &d.metrics;
	if (allot__state_create(&so, cfg, d.config_path, text, &d.state) !=
	    ALLOT_OK) {
		allot__log(&d.lg, ALLOT_LOG_ERR, "ALLOTD-NOMEM",
		    "cannot create the registry");
		goto out;
	}
	cfg = NULL; /* the state owns it */
	if (allot__state_restore(d.state) != ALLOT_OK)
		allot__log(&d.lg, ALLOT_LOG_WARNING, "ALLOTD-RESTORE-FAIL",
		    "could not read the replicas of the last run from %s; "
		    "starting with none",
		    db_path);

	if (uv_loop_init(&d.loop) != 0) {
		allot__log(&d.lg, ALLOT_LOG_ERR, "ALLOTD-LOOP-FAIL",
		    "cannot create the event loop");
		goto out_state;
	}
	uv_timer_init(&d.loop, &d.tick);
	uv_timer_init(&d.loop, &d.drain_timer);
	uv_signal_init(&d.loop, &d.sig_term);
	uv_signal_init(&d.loop, &d.sig_int);
	uv_signal_init(&d.loop, &d.sig_hup);
	d.handles_open = true;
	d.tick.data = d.drain_timer.data = &d;
	d.sig_term.data = d.sig_int.data = d.sig_hup.data = &d;
	uv_signal_start(&d.sig_term, on_signal, SIGTERM);
	uv_signal_start(&d.sig_int, on_signal, SIGINT);
	uv_signal_start(&d.sig_hup, on_signal, SIGHUP);

	allot__server_opts svo;
	allot__server_opts_init(&svo);
	svo.urls = urls;
	svo.nurls = nurls;
	svo.workers = workers;
	svo.max_keys = max_keys;
	svo.state = d.state;
	svo.metrics = &d.metrics;
	svo.lg = &d.lg;
	svo.tls_cert_key_file = tls_cert;
	svo.tls_ca_file = tls_ca;
	if (self >= 0) {
		allot__cluster_opts co = {
			.members = members,
			.n = nmembers,
			.self = (size_t) self,
			.interval_ms = so.interval_ms,
			.state = d.state,
			.store = d.store,
			.lg = &d.lg,
			.tls_cert_key_file = tls_cert,
			.tls_ca_file = tls_ca,
		};
		if (allot__cluster_start(&co, &d.loop, err, sizeof err,
		        &d.cluster) != ALLOT_OK) {
			allot__log(&d.lg, ALLOT_LOG_ERR, "ALLOTD-CLUSTER-FAIL",
			    "%s", err);
			goto out_loop;
		}
		svo.cluster = d.cluster;
	}
	svo.authn = authn;
	bool pl_oom;
	d.peerlimit = allot__peerlimit_create(&plo, &pl_oom);
	if (pl_oom) {
		allot__log(&d.lg, ALLOT_LOG_ERR, "ALLOTD-LISTEN-FAIL",
		    "out of memory for a table of %u peers", plo.capacity);
		goto out_loop;
	}
	svo.peerlimit = d.peerlimit;
	if (allot__server_start(&svo, err, sizeof err, &d.server) !=
	    ALLOT_OK) {
		allot__log(
		    &d.lg, ALLOT_LOG_ERR, "ALLOTD-LISTEN-FAIL", "%s", err);
		goto out_loop;
	}
	if (http_addr != NULL &&
	    allot__http_start(http_addr, NULL, d.state, &d.metrics, d.cluster, &d.lg,
	        err, sizeof err, &d.http) != ALLOT_OK) {
		allot__log(
		    &d.lg, ALLOT_LOG_ERR, "ALLOTD-LISTEN-FAIL", "%s", err);
		goto out_loop;
	}
	char listen_list[512] = "";
	for (size_t i = 0; i < nurls; i++) {
		size_t l = strlen(listen_list);
		snprintf(listen_list + l, sizeof listen_list - l, "%s%s",
		    i ? "," : "", urls[i]);
	}
	char detail[2048];
	snprintf(detail, sizeof detail,
	    "version=%s pid=%ld listen=%s "
	    "http=%s epoch=%" PRIu64 " digest=%016" PRIx64,
	    ALLOT_VERSION_STRING, (long) getpid(), listen_list,
	    http_addr ? http_addr : "off", allot__state_epoch(d.state),
	    allot__state_digest(d.state));
	if (self >= 0) {
		char mlist[1024] = "";
		for (size_t i = 0; i < nmembers; i++) {
			size_t l = strlen(mlist);
			snprintf(mlist + l, sizeof mlist - l, "%s%s",
			    i ? "," : "", members[i].name);
		}
		size_t l = strlen(detail);
		snprintf(detail + l, sizeof detail - l, " self=%s members=%s",
		    members[self].name, mlist);
		allot__log(&d.lg, ALLOT_LOG_NOTICE, "ALLOTD-CLUSTER",
		    "member %s of a %zu-member cluster (%s); keys are owned "
		    "by rendezvous hashing of the member names",
		    members[self].name, nmembers, mlist);
	}
	allot__store_event(d.store, "start", NULL, detail);
	store_commit(&d);
	allot__log(&d.lg, ALLOT_LOG_NOTICE, "ALLOTD-START",
	    "allotd %s listening on %s, HTTP on %s; config %s epoch %" PRIu64
	    " digest %016" PRIx64 "; store %s; lease %u ms, interval %u ms, "
	    "expiry after %u intervals, %u workers; per peer %g "
	    "Registers/s (burst %g), %g messages/s (burst %g), 0 = off",
	    ALLOT_VERSION_STRING, listen_list, http_addr ? http_addr : "off",
	    d.config_path, allot__state_epoch(d.state),
	    allot__state_digest(d.state), db_path, so.lease_ms, so.interval_ms,
	    so.expiry_intervals, workers, plo.register_rate,
	    plo.register_burst, plo.message_rate, plo.message_burst);

	d.last_second_ns = allot__mono_ns();
	uv_timer_start(&d.tick, on_tick, so.interval_ms, so.interval_ms);
	rv = uv_run(&d.loop, UV_RUN_DEFAULT);
	exit_code = EXIT_SUCCESS;
	if (rv != 0) {
		allot__log(&d.lg, ALLOT_LOG_ERR, "ALLOTD-LOOP-FAIL",
		    "event loop ended with active handles");
		exit_code = EXIT_FAILURE;
	}

out_loop:
	/* On the error paths nothing ran yet: close what was opened. */
	allot__server_close(d.server);
	d.server = NULL;
	allot__peerlimit_destroy(d.peerlimit);
	d.peerlimit = NULL;
	allot__http_stop(d.http);
	d.http = NULL;
	allot__cluster_stop(d.cluster);
	d.cluster = NULL;
	if (d.handles_open) {
		uv_close((uv_handle_t *) &d.tick, close_cb);
		uv_close((uv_handle_t *) &d.drain_timer, close_cb);
		uv_close((uv_handle_t *) &d.sig_term, close_cb);
		uv_close((uv_handle_t *) &d.sig_int, close_cb);
		uv_close((uv_handle_t *) &d.sig_hup, close_cb);
		d.handles_open = false;
		uv_run(&d.loop, UV_RUN_DEFAULT);
	}
	if ((rv = uv_loop_close(&d.loop)) != 0) {
		allot__log(&d.lg, ALLOT_LOG_ERR, "ALLOTD-LOOP-FAIL",
		    "uv_loop_close: %s", uv_strerror(rv));
		exit_code = EXIT_FAILURE;
	}
out_state:
	allot__state_destroy(d.state);
out:
	allot__store_close(d.store);
	allot_config_free(cfg);
	free(text);
	allot__authn_free(authn);
	nng_fini();
	return exit_code;
}
