/* SPDX-License-Identifier: MIT */
/*
 * allot-example-service: a real protected HTTP service embedding liballot,
 * the walkthrough of docs/integrating.md ("Embedding liballot in a
 * service"). libmicrohttpd serves HTTPS with GnuTLS, one thread per
 * connection (an export blocks its thread while it waits for a permit
 * and while it works); callers are identified by the SPIFFE ID of their
 * verified client certificate. This file is start-up and shutdown: the
 * command line, the quota config and the agent (with the coordinator when
 * one is given), the concurrency limiter, the daemon, the "listening on"
 * line that tests and the demo wait for, and on SIGTERM or SIGINT a clean
 * stop in which destroying the agent sends the coordinator a graceful
 * leave. Requests are in handlers.c.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <signal.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "service.h"
#include "token_identity.h"

#define PROG "allot-example-service"

static const char *const level_names[8] = { "emerg", "alert", "crit", "error",
	"warning", "notice", "info", "debug" };

uint64_t
svc_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

static void
vlog(int level, const char *id, const char *fmt, va_list ap)
{
	char msg[1024];
	vsnprintf(msg, sizeof msg, fmt, ap);
	/* One fprintf per line: stderr is unbuffered, and lines from
	 * connection threads must not interleave mid-line. */
	fprintf(stderr, PROG ": %s %s: %s\n",
	    level_names[level < 0 ? 0 :
	            level > 7     ? 7 :
	                            level],
	    id, msg);
}

void
svc_log(const struct svc *s, int level, const char *id, const char *fmt, ...)
{
	if (level > s->o.log_level)
		return;
	va_list ap;
	va_start(ap, fmt);
	vlog(level, id, fmt, ap);
	va_end(ap);
}

/* liballot's log handler (the library never prints by itself). */
static void
agent_log(void *ctx, int level, const char *id, const char *msg)
{
	const struct svc *s = ctx;
	if (level <= s->o.log_level)
		fprintf(stderr, PROG ": %s %s: %s\n",
		    level_names[level < 0 ? 0 :
		            level > 7     ? 7 :
		                            level],
		    id, msg);
}

/* libmicrohttpd's messages are mostly about clients that went away or
 * failed their handshake: debug level. */
static void
mhd_log(void *cls, const char *fmt, va_list ap)
{
	const struct svc *s = cls;
	if (s->o.log_level < 7)
		return;
	char msg[512];
	vsnprintf(msg, sizeof msg, fmt, ap);
	size_t n = strlen(msg);
	while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
		msg[--n] = '\0';
	fprintf(stderr, PROG ": debug SVC-HTTPD: %s\n", msg);
}

__attribute__((format(printf, 1, 2), noreturn)) static void
die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, PROG ": ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(2);
}

static void
usage(FILE *f)
{
	static const char text[] =
	    "usage: " PROG " --config FILE [options]\n"
	    "\n"
	    "A protected HTTP service embedding liballot: GET /lookup\n"
	    "(cheap), GET /export?rows=N (expensive), GET /stats,\n"
	    "GET /healthz.\n"
	    "\n"
	    "--config FILE        quota file (YAML; required)\n"
	    "--listen HOST:PORT   default 127.0.0.1:8443; port 0 picks a\n"
	    "                     free one (see the listening line)\n"
	    "--tls-cert FILE      server certificate (PEM)\n"
	    "--tls-key FILE       its private key (PEM)\n"
	    "--ca FILE            CA of client certificates: mutual TLS,\n"
	    "                     callers are the SPIFFE IDs of verified\n"
	    "                     certificates\n"
	    "--trust-domain NAME  accept SPIFFE IDs of this trust domain\n"
	    "                     only (default: any)\n"
	    "--plain-http         no TLS: every caller is the default\n"
	    "                     bucket, unless...\n"
	    "--insecure-identity-header\n"
	    "                     with --plain-http, the caller is the\n"
	    "                     X-Allot-Identity header (self-declared:\n"
	    "                     local experiments only)\n"
	    "--jwt-issuer ISS     also accept callers by a signed token\n"
	    "                     (Authorization: Bearer) of this issuer\n"
	    "                     (\"iss\"); its identity is the \"sub\"\n"
	    "                     claim, and a bad token is answered 401\n"
	    "--jwks FILE          the issuer's public keys (a JWKS file,\n"
	    "                     re-read when it changes)\n"
	    "--jwt-audience AUD   the \"aud\" tokens must name (default:\n"
	    "                     the service name)\n"
	    "--jwt-leeway-s S     clock skew allowed on expiry (default\n"
	    "                     30, at most 300)\n"
	    "--coordinator URL    allotd address(es), comma separated\n"
	    "--service NAME       service name (default example)\n"
	    "--replica-id ID      default <hostname>-<pid>\n"
	    "--sync-interval-ms N sync interval T (default 100)\n"
	    "--initial-replicas N replicas the deployment starts with\n"
	    "                     (default 1): the split before the first\n"
	    "                     Welcome, and a new service's first shares\n"
	    "--export-ms MS       simulated work per exported row\n"
	    "                     (default 1, fractions allowed)\n"
	    "--export-max-rows N  largest ?rows= (default 10000)\n"
	    "--rows-per-token N   measured export cost: a token per N\n"
	    "                     rows, rounded up (default 50)\n"
	    "--max-inflight N     exports running at once (default 8)\n"
	    "--max-inflight-per-caller N\n"
	    "                     the same, per caller (default 2)\n"
	    "--queue-ms MS        longest an export waits for a slot\n"
	    "                     (default 1000)\n"
	    "--queue-max N        exports waiting at once (default 16)\n"
	    "--wait-ms MS         how long a request its local bucket is\n"
	    "                     short of waits for the coordinator's\n"
	    "                     central reserve (default 20; 0: never)\n"
	    "--interactive-reserve N\n"
	    "                     permits only /lookup may use (default 16)\n"
	    "--max-callers N      caller records in /stats (default 1024)\n"
	    "--max-connections N  default 1024\n"
	    "--max-per-address N  connections from one IP address\n"
	    "                     (default 32); more are refused and logged\n"
	    "--connection-timeout S\n"
	    "                     a connection idle this long, TLS handshake\n"
	    "                     included, is closed (default 10)\n"
	    "--log-level LEVEL    error, warning, info (default), debug or\n"
	    "                     0-7\n"
	    "-h, --help\n";
	fputs(text, f);
}

static uint32_t
arg_u32(const char *name, const char *v, uint32_t min, uint32_t max)
{
	char *end;
	errno = 0;
	unsigned long long x = strtoull(v, &end, 10);
	if (errno != 0 || end == v || *end != '\0' || v[0] == '-' || x < min ||
	    x > max)
		die("%s wants an integer in %" PRIu32 "..%" PRIu32
		    ", not '%s'",
		    name, min, max, v);
	return (uint32_t) x;
}

static int
arg_level(const char *v)
{
	for (int i = 0; i < 8; i++)
		if (strcmp(v, level_names[i]) == 0)
			return i;
	if (strcmp(v, "warn") == 0)
		return 4;
	if (strcmp(v, "err") == 0)
		return 3;
	return (int) arg_u32("--log-level", v, 0, 7);
}

/* How a command-line option is stored in svc_options. */
enum opt_kind {
	OK_STR, /* const char *: the argument itself */
	OK_TRUE, /* bool: set */
	OK_U32, /* uint32_t: an integer in [min, max] */
	OK_MS, /* double: milliseconds in [0, 1000] */
	OK_LEVEL, /* int: a log level, by name or 0-7 */
	OK_HELP,
};

struct optdef {
	const char *name;
	enum opt_kind kind;
	size_t off; /* of the field in svc_options */
	uint32_t min, max; /* OK_U32 */
};

#define AT(field) offsetof(struct svc_options, field)

static const struct optdef optdefs[] = {
	{ "config", OK_STR, AT(config), 0, 0 },
	{ "listen", OK_STR, AT(listen), 0, 0 },
	{ "tls-cert", OK_STR, AT(tls_cert), 0, 0 },
	{ "tls-key", OK_STR, AT(tls_key), 0, 0 },
	{ "ca", OK_STR, AT(ca), 0, 0 },
	{ "trust-domain", OK_STR, AT(trust_domain), 0, 0 },
	{ "plain-http", OK_TRUE, AT(plain_http), 0, 0 },
	{ "insecure-identity-header", OK_TRUE, AT(insecure_identity_header), 0,
	    0 },
	{ "jwt-issuer", OK_STR, AT(jwt_issuer), 0, 0 },
	{ "jwks", OK_STR, AT(jwks), 0, 0 },
	{ "jwt-audience", OK_STR, AT(jwt_audience), 0, 0 },
	{ "jwt-leeway-s", OK_U32, AT(jwt_leeway_s), 0, ALLOT_JWT_LEEWAY_MAX },
	{ "coordinator", OK_STR, AT(coordinator), 0, 0 },
	{ "service", OK_STR, AT(service), 0, 0 },
	{ "replica-id", OK_STR, AT(replica_id), 0, 0 },
	{ "sync-interval-ms", OK_U32, AT(sync_interval_ms), 1, 3600000 },
	{ "initial-replicas", OK_U32, AT(initial_replicas), 1, 1000000 },
	{ "export-ms", OK_MS, AT(export_ms), 0, 0 },
	{ "export-max-rows", OK_U32, AT(export_max_rows), 1, 1000000 },
	{ "rows-per-token", OK_U32, AT(rows_per_token), 1, 1000000 },
	{ "max-inflight", OK_U32, AT(max_inflight), 1, 100000 },
	{ "max-inflight-per-caller", OK_U32, AT(max_inflight_per_caller), 1,
	    100000 },
	{ "queue-ms", OK_U32, AT(queue_ms), 0, 600000 },
	{ "queue-max", OK_U32, AT(queue_max), 0, 100000 },
	{ "wait-ms", OK_U32, AT(wait_ms), 0, 1000 },
	{ "interactive-reserve", OK_U32, AT(interactive_reserve), 1, 100000 },
	{ "max-callers", OK_U32, AT(max_callers), 1, 1u << 20 },
	{ "max-connections", OK_U32, AT(max_connections), 1, 1000000 },
	{ "max-per-address", OK_U32, AT(max_per_address), 1, 1000000 },
	{ "connection-timeout", OK_U32, AT(connection_timeout_s), 1, 3600 },
	{ "log-level", OK_LEVEL, AT(log_level), 0, 0 },
	{ "help", OK_HELP, 0, 0, 0 },
};
#define NOPTS (sizeof optdefs / sizeof optdefs[0])

/* What getopt_long returns for optdefs[i]: 'h' for --help, else a code
 * above any character. */
static int
opt_code(size_t i)
{
	return optdefs[i].kind == OK_HELP ? 'h' : 256 + (int) i;
}

/* Store `arg` as `d` says; exits on a bad value. */
static void
opt_store(struct svc_options *o, const struct optdef *d, const char *arg)
{
	char *field = (char *) o + d->off;
	char name[64];
	char *end;
	snprintf(name, sizeof name, "--%s", d->name);
	switch (d->kind) {
	case OK_STR: *(const char **) field = arg; break;
	case OK_TRUE: *(bool *) field = true; break;
	case OK_U32:
		*(uint32_t *) field = arg_u32(name, arg, d->min, d->max);
		break;
	case OK_MS:
		errno = 0;
		*(double *) field = strtod(arg, &end);
		if (errno != 0 || end == arg || *end != '\0' ||
		    !(*(double *) field >= 0 && *(double *) field <= 1000))
			die("--export-ms wants milliseconds in "
			    "0..1000, not '%s'",
			    arg);
		break;
	case OK_LEVEL: *(int *) field = arg_level(arg); break;
	case OK_HELP: usage(stdout); exit(0);
	}
}

static void
set_defaults(struct svc_options *o)
{
	memset(o, 0, sizeof *o);
	o->listen = "127.0.0.1:8443";
	o->service = "example";
	o->sync_interval_ms = 100;
	o->initial_replicas = 1;
	o->export_ms = 1.0;
	o->export_max_rows = 10000;
	o->rows_per_token = 50;
	o->max_inflight = 8;
	o->max_inflight_per_caller = 2;
	o->queue_ms = 1000;
	o->wait_ms = 20;
	o->queue_max = 16;
	o->interactive_reserve = 16;
	o->max_callers = 1024;
	o->max_connections = 1024;
	/* One thread per connection: without a cap per address, 1,100
	 * plain TCP connects that never start their TLS handshake took
	 * 1,026 threads and every slot, and mTLS callers got no answer
	 * for the whole 60 s timeout (docs/reliability.md, "Adversary"). */
	o->max_per_address = 32;
	o->connection_timeout_s = 10;
	o->jwt_leeway_s = 30;
	o->log_level = 6;
}

/* The options that only make sense together. */
static void
check_combinations(const struct svc_options *o)
{
	if (o->config == NULL)
		die("--config FILE is required (see --help)");
	if (o->plain_http &&
	    (o->tls_cert != NULL || o->tls_key != NULL || o->ca != NULL))
		die("--plain-http excludes --tls-cert, --tls-key and --ca");
	if ((o->jwt_issuer == NULL) != (o->jwks == NULL))
		die("--jwt-issuer and --jwks go together");
	if (o->jwt_audience != NULL && o->jwt_issuer == NULL)
		die("--jwt-audience needs --jwt-issuer and --jwks");
	if (o->jwt_issuer != NULL && o->insecure_identity_header)
		die("--jwt-issuer excludes --insecure-identity-header: a "
		    "caller is a verified token or nobody");
	if (o->insecure_identity_header && !o->plain_http)
		die("--insecure-identity-header exists only with --plain-http:"
		    " over TLS, callers are their verified certificates");
	if (!o->plain_http && (o->tls_cert == NULL || o->tls_key == NULL))
		die("--tls-cert and --tls-key are required (or --plain-http "
		    "for local experiments)");
	if (o->trust_domain != NULL && o->ca == NULL)
		die("--trust-domain needs --ca");
}

static void
parse_args(struct svc_options *o, int argc, char **argv)
{
	struct option longopts[NOPTS + 1];
	for (size_t i = 0; i < NOPTS; i++) {
		bool flag = optdefs[i].kind == OK_TRUE ||
		    optdefs[i].kind == OK_HELP;
		longopts[i] = (struct option) { optdefs[i].name,
			flag ? no_argument : required_argument, NULL,
			opt_code(i) };
	}
	longopts[NOPTS] = (struct option) { NULL, 0, NULL, 0 };
	set_defaults(o);
	int ch;
	while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		size_t i = 0;
		while (i < NOPTS && opt_code(i) != ch)
			i++;
		if (i == NOPTS) {
			usage(stderr);
			exit(2);
		}
		opt_store(o, &optdefs[i], optarg);
	}
	if (optind < argc)
		die("unexpected argument '%s' (see --help)", argv[optind]);
	check_combinations(o);
}

/* Read a whole (PEM) file; NUL-terminated, as libmicrohttpd wants. */
static char *
slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (f == NULL)
		die("%s: %s", path, strerror(errno));
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap);
	for (;;) {
		if (buf == NULL)
			die("%s: out of memory", path);
		len += fread(buf + len, 1, cap - len - 1, f);
		if (ferror(f))
			die("%s: %s", path, strerror(errno));
		if (feof(f))
			break;
		if (cap >= (1u << 24))
			die("%s: too large for a PEM file", path);
		cap *= 2;
		char *p = realloc(buf, cap);
		if (p == NULL)
			free(buf);
		buf = p;
	}
	fclose(f);
	buf[len] = '\0';
	return buf;
}

/* HOST:PORT or [HOST]:PORT into a socket address. */
static void
parse_listen(const char *spec, struct sockaddr_storage *ss, socklen_t *sslen,
    char *host, size_t hostlen)
{
	const char *colon = strrchr(spec, ':');
	if (colon == NULL || colon[1] == '\0')
		die("--listen wants HOST:PORT, not '%s'", spec);
	const char *h = spec;
	size_t hl = (size_t) (colon - spec);
	if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
		h++;
		hl -= 2;
	}
	if (hl == 0 || hl >= hostlen)
		die("--listen: bad host in '%s'", spec);
	memcpy(host, h, hl);
	host[hl] = '\0';
	arg_u32("--listen port", colon + 1, 0, 65535);
	struct addrinfo hints, *res = NULL;
	memset(&hints, 0, sizeof hints);
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_NUMERICSERV | AI_PASSIVE;
	int rc = getaddrinfo(host, colon + 1, &hints, &res);
	if (rc != 0)
		die("--listen %s: %s", spec, gai_strerror(rc));
	memcpy(ss, res->ai_addr, res->ai_addrlen);
	*sslen = res->ai_addrlen;
	freeaddrinfo(res);
}

static void
setup_conc(struct svc *s)
{
	allot_conc_options *co = &s->conc_opts;
	allot_conc_options_init(co);
	const struct svc_options *o = &s->o;
	/* Exports may hold at most --max-inflight permits; the reserve on
	 * top of that is only ever used by /lookup. */
	co->global_max = o->max_inflight + o->interactive_reserve;
	co->lane_max[ALLOT_LANE_INTERACTIVE] = co->global_max;
	co->lane_max[ALLOT_LANE_BULK] = o->max_inflight;
	co->caller_max[ALLOT_LANE_BULK] = o->max_inflight_per_caller;
	co->queue_max[ALLOT_LANE_BULK] = o->queue_max;
	co->caller_queue_max[ALLOT_LANE_BULK] = o->queue_max;
	co->max_wait_ms[ALLOT_LANE_BULK] = o->queue_ms;
	co->max_callers = o->max_callers + 1;
	int rc = allot_conc_create(co, &s->conc);
	if (rc != ALLOT_OK)
		die("concurrency limiter: %s", allot_strerror(rc));
	/* The limiter has no bucket to compute a wait from: advertise the
	 * queue's maximum age, the time after which a waiter would have
	 * learnt the answer anyway. */
	s->conc_retry_after_s = (o->queue_ms + 999) / 1000;
	if (s->conc_retry_after_s == 0)
		s->conc_retry_after_s = 1;
}

/* The quota file, then the agent (which syncs with the coordinator when
 * one is given), the concurrency limiter and the caller table.
 * `replica` holds the agent's default replica id, made here so that
 * /stats can show it; it must outlive the service. */
static void
start_agent(struct svc *s, char *replica, size_t replica_len)
{
	char errbuf[512];
	int rc = allot_config_load(
	    s->o.config, errbuf, sizeof errbuf, &s->cfg);
	if (rc != ALLOT_OK)
		die("%s",
		    rc == ALLOT_ECONFIG || rc == ALLOT_ENOENT ?
		        errbuf :
		        allot_strerror(rc));
	if (s->o.replica_id == NULL) {
		char hn[256];
		if (gethostname(hn, sizeof hn) != 0)
			snprintf(hn, sizeof hn, "localhost");
		hn[sizeof hn - 1] = '\0';
		snprintf(replica, replica_len, "%s-%ld", hn, (long) getpid());
		s->o.replica_id = replica;
	}

	allot_agent_options ao;
	allot_agent_options_init(&ao);
	ao.log = agent_log;
	ao.log_ctx = s;
	ao.log_level = s->o.log_level;
	ao.coordinator = s->o.coordinator;
	ao.service = s->o.service;
	ao.replica_id = s->o.replica_id;
	ao.sync_interval_ms = s->o.sync_interval_ms;
	ao.initial_replicas = s->o.initial_replicas;
	ao.waits = s->o.wait_ms > 0;
	rc = allot_agent_create(s->cfg, &ao, &s->agent);
	if (rc != ALLOT_OK)
		die("agent: %s", allot_strerror(rc));
	setup_conc(s);
	if (s->o.jwt_issuer != NULL && (rc = svc_token_start(s)) != ALLOT_OK)
		die("--jwks %s: %s (the line above says why)", s->o.jwks,
		    allot_strerror(rc));
	if (svc_callers_init(&s->callers, s->o.max_callers) != ALLOT_OK)
		die("caller table: out of memory");
}

/* The PEM files libmicrohttpd serves from memory; freed at the end. */
struct pems {
	char *cert, *key, *ca;
};

/* Room for libmicrohttpd's TLS options: certificate, key, trust list and
 * the end. */
#define TLS_OPTS 4

/* libmicrohttpd's TLS options (MHD_OPTION_END alone for plain HTTP),
 * the PEM files read into `pems`. */
static void
tls_options(
    const struct svc_options *o, struct pems *pems, struct MHD_OptionItem *tls)
{
	size_t ntls = 0;
	memset(tls, 0, TLS_OPTS * sizeof *tls);
	if (!o->plain_http) {
		pems->cert = slurp(o->tls_cert);
		pems->key = slurp(o->tls_key);
		tls[ntls++] = (struct MHD_OptionItem) {
			MHD_OPTION_HTTPS_MEM_CERT, 0, pems->cert
		};
		tls[ntls++] = (struct MHD_OptionItem) {
			MHD_OPTION_HTTPS_MEM_KEY, 0, pems->key
		};
		if (o->ca != NULL) {
			/* With a trust list libmicrohttpd asks every client
			 * for a certificate; handlers.c verifies it. A
			 * client without one is served, as the default
			 * caller. */
			pems->ca = slurp(o->ca);
			tls[ntls++] = (struct MHD_OptionItem) {
				MHD_OPTION_HTTPS_MEM_TRUST, 0, pems->ca
			};
		}
	}
	tls[ntls] = (struct MHD_OptionItem) { MHD_OPTION_END, 0, NULL };
}

/* Serve on `addr`; returns the port bound (port 0 picks one). */
static unsigned
start_httpd(
    struct svc *s, const struct sockaddr_storage *addr, struct pems *pems)
{
	unsigned int flags = MHD_USE_THREAD_PER_CONNECTION |
	    MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG;
	if (addr->ss_family == AF_INET6)
		flags |= MHD_USE_IPv6;
	if (!s->o.plain_http)
		flags |= MHD_USE_TLS;
	struct MHD_OptionItem tls[TLS_OPTS];
	tls_options(&s->o, pems, tls);

	/* The logger goes first, so that it sees the other options. */
	s->httpd = MHD_start_daemon(flags, 0, NULL, NULL, svc_handle, s,
	    MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_SOCK_ADDR,
	    (const struct sockaddr *) addr, MHD_OPTION_NOTIFY_CONNECTION,
	    svc_notify_connection, s, MHD_OPTION_CONNECTION_LIMIT,
	    (unsigned int) s->o.max_connections,
	    MHD_OPTION_PER_IP_CONNECTION_LIMIT,
	    (unsigned int) s->o.max_per_address, MHD_OPTION_CONNECTION_TIMEOUT,
	    (unsigned int) s->o.connection_timeout_s, MHD_OPTION_ARRAY, tls,
	    MHD_OPTION_END);
	if (s->httpd == NULL)
		die("cannot serve on %s (address in use, bad certificate or "
		    "key?); run with --log-level debug for details",
		    s->o.listen);
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(
	    s->httpd, MHD_DAEMON_INFO_BIND_PORT);
	return di != NULL ? di->port : 0;
}

/* What the mode means for callers' identities, the start-up line, and
 * the "listening on" line that tests and the demo wait for. */
static void
announce(const struct svc *s, bool v6, const char *host, unsigned port)
{
	switch (s->mode) {
	case MODE_PLAIN_INSECURE:
		fprintf(stderr,
		    "\n"
		    "***************************************************"
		    "*******************\n"
		    "INSECURE: identities are self-declared (" PROG
		    " --plain-http\n"
		    "--insecure-identity-header): any client can claim any "
		    "caller's quota\n"
		    "by sending an X-Allot-Identity header. For local "
		    "experiments only;\n"
		    "never expose this port. Use mutual TLS (--tls-cert "
		    "--tls-key --ca).\n"
		    "***************************************************"
		    "*******************\n\n");
		break;
	case MODE_PLAIN:
		svc_log(s, 4, "SVC-PLAIN",
		    "plain HTTP: no caller has an identity, every request is "
		    "charged to the default bucket");
		break;
	case MODE_TLS:
		svc_log(s, 4, "SVC-NO-CA",
		    "no --ca: client certificates are not requested, every "
		    "request is charged to the default bucket");
		break;
	case MODE_MTLS: break;
	}
	svc_log(s, 6, "SVC-START",
	    "service %s, coordinator %s, exports: %" PRIu32 " in flight "
	    "(%" PRIu32 " per caller), queue %" PRIu32 " for %" PRIu32 " ms",
	    s->o.service, s->o.coordinator ? s->o.coordinator : "none",
	    s->o.max_inflight, s->o.max_inflight_per_caller, s->o.queue_max,
	    s->o.queue_ms);
	printf("listening on %s://%s%s%s:%u\n",
	    s->o.plain_http ? "http" : "https", v6 ? "[" : "", host,
	    v6 ? "]" : "", port);
	fflush(stdout);
}

/* Exports in progress see `stopping` and end early; waiters in the
 * limiter's queue give up within --queue-ms. Stopping the daemon joins
 * every connection thread, so that nothing uses the agent once it is
 * destroyed. */
static void
stop_service(struct svc *s, struct pems *pems)
{
	atomic_store(&s->stopping, true);
	MHD_stop_daemon(s->httpd);
	allot_conc_destroy(s->conc);
	allot_agent_destroy(s->agent); /* graceful leave, when synced */
	allot_config_free(s->cfg);
	allot_jwt_verifier_destroy(s->jwt);
	svc_callers_fini(&s->callers);
	free(pems->cert);
	free(pems->key);
	free(pems->ca);
}

int
main(int argc, char **argv)
{
	static struct svc svc; /* zeroed; reachable from every thread */
	struct svc *s = &svc;
	parse_args(&s->o, argc, argv);
	s->started_ns = svc_now_ns();
	s->export_ns_per_row = (uint64_t) llround(s->o.export_ms * 1e6);
	s->mode = s->o.plain_http ?
	    (s->o.insecure_identity_header ? MODE_PLAIN_INSECURE :
	                                     MODE_PLAIN) :
	    (s->o.ca != NULL ? MODE_MTLS : MODE_TLS);

	/* Signals are taken synchronously by the main thread: block them
	 * before any thread exists, so that every thread inherits the
	 * mask. A client that hangs up must not kill the service. */
	sigset_t stop;
	sigemptyset(&stop);
	sigaddset(&stop, SIGTERM);
	sigaddset(&stop, SIGINT);
	pthread_sigmask(SIG_BLOCK, &stop, NULL);
	signal(SIGPIPE, SIG_IGN);

	char replica[300];
	start_agent(s, replica, sizeof replica);
	struct sockaddr_storage addr;
	socklen_t addrlen;
	char host[256];
	parse_listen(s->o.listen, &addr, &addrlen, host, sizeof host);
	(void) addrlen;
	struct pems pems = { NULL, NULL, NULL };
	unsigned port = start_httpd(s, &addr, &pems);
	announce(s, addr.ss_family == AF_INET6, host, port);

	int sig = 0;
	while (sigwait(&stop, &sig) != 0)
		;
	svc_log(s, 6, "SVC-STOP", "signal %d: stopping", sig);
	stop_service(s, &pems);
	svc_log(s, 6, "SVC-STOPPED", "stopped");
	return 0;
}
