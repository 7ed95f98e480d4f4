/* SPDX-License-Identifier: MIT */
/*
 * allot-agentd's options: one table names every option, its type and
 * bounds, and serves both the command line (--name VALUE) and the
 * options file (--options FILE: one "name value" or "name = value" per
 * line, '#' starts a comment), so that every option, liballot's agent
 * options included, is both a flag and a config key. The file is read
 * first and the command line wins.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentd.h"

__attribute__((format(printf, 1, 2), noreturn)) static void
die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, AGENTD_PROG ": ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(2);
}

enum kind { K_STR, K_U32, K_DOUBLE, K_LEVEL, K_OPTIONS, K_HELP };

struct optdef {
	const char *name;
	enum kind kind;
	size_t off;
	uint32_t min, max;
	const char *help;
};

#define AT(f) offsetof(struct agentd_options, f)

static const struct optdef optdefs[] = {
	{ "config", K_STR, AT(config), 0, 0, "quota file (YAML; required)" },
	{ "options", K_OPTIONS, AT(options_file), 0, 0,
	    "file of further options, one \"name value\" a line" },
	{ "grpc-listen", K_STR, AT(grpc_listen), 0, 0,
	    "Envoy RLS over gRPC, HOST:PORT (default 127.0.0.1:8081; "
	    "\"none\" disables)" },
	{ "http-listen", K_STR, AT(http_listen), 0, 0,
	    "JSON API and /metrics, HOST:PORT (default 127.0.0.1:8082)" },
	{ "http-socket", K_STR, AT(http_socket), 0, 0,
	    "the same on a Unix socket PATH (default none)" },
	{ "tls-cert", K_STR, AT(tls_cert), 0, 0,
	    "gRPC over TLS: certificate (PEM), reloaded when it changes" },
	{ "tls-key", K_STR, AT(tls_key), 0, 0, "its private key (PEM)" },
	{ "cert-check-ms", K_U32, AT(cert_check_ms), 100, 3600000,
	    "how often the certificate files are checked (default 1000)" },
	{ "domain", K_STR, AT(domain), 0, 0,
	    "accept only this RLS domain (default: any)" },
	{ "identity-keys", K_STR, AT(identity_keys), 0, 0,
	    "descriptor entry keys naming the caller, comma separated, "
	    "first match wins (default caller)" },
	{ "endpoint-keys", K_STR, AT(endpoint_keys), 0, 0,
	    "entry keys naming the endpoint class (default endpoint,path)" },
	{ "unknown", K_STR, AT(unknown), 0, 0,
	    "a descriptor without an identity entry: default (the shared "
	    "default bucket), allow (OK, uncharged) or reject" },
	{ "grpc-threads", K_U32, AT(grpc_threads), 1, 64,
	    "gRPC I/O threads (default 2)" },
	{ "max-connections", K_U32, AT(max_connections), 1, 1000000,
	    "connections at once, per listener (default 1024)" },
	{ "max-streams", K_U32, AT(max_streams), 1, 65536,
	    "concurrent streams per gRPC connection (default 128)" },
	{ "max-message", K_U32, AT(max_message), 64, 16777216,
	    "largest gRPC request message in bytes (default 16384)" },
	{ "max-descriptors", K_U32, AT(max_descriptors), 1, 4096,
	    "descriptors per request (default 16)" },
	{ "max-entries", K_U32, AT(max_entries), 1, 4096,
	    "entries per descriptor (default 16)" },
	{ "idle-timeout-s", K_U32, AT(idle_timeout_s), 1, 86400,
	    "close idle connections after (default 300)" },
	{ "log-level", K_LEVEL, AT(log_level), 0, 0,
	    "error, warning, info (default), debug or 0-7" },
	{ "coordinator", K_STR, AT(agent.coordinator), 0, 0,
	    "allotd address(es), comma separated (default: local-only)" },
	{ "coordinator-ca", K_STR, AT(agent.tls_ca_file), 0, 0,
	    "tls+tcp://: the CA of allotd's certificate" },
	{ "coordinator-cert-key", K_STR, AT(agent.tls_cert_key_file), 0, 0,
	    "tls+tcp://: this agent's certificate and key, one PEM file" },
	{ "coordinator-server-name", K_STR, AT(agent.tls_server_name), 0, 0,
	    "tls+tcp://: the name allotd's certificate must carry" },
	{ "service", K_STR, AT(agent.service), 0, 0,
	    "protected service's name (default sidecar)" },
	{ "replica-id", K_STR, AT(agent.replica_id), 0, 0,
	    "default <hostname>-<pid>" },
	{ "sync-interval-ms", K_U32, AT(agent.sync_interval_ms), 1, 3600000,
	    "sync interval T (default 100)" },
	{ "sync-jitter", K_DOUBLE, AT(agent.sync_jitter), 0, 0,
	    "jitter fraction of T, 0..0.5 (default 0.1)" },
	{ "initial-replicas", K_U32, AT(agent.initial_replicas), 1, 1000000,
	    "replicas assumed before allotd answers (default 1)" },
	{ "reconnect-min-ms", K_U32, AT(agent.reconnect_min_ms), 1, 3600000,
	    "reconnect backoff, lower bound (default T)" },
	{ "reconnect-max-ms", K_U32, AT(agent.reconnect_max_ms), 1, 3600000,
	    "reconnect backoff, upper bound (default 5000)" },
	{ "max-unknown-keys", K_U32, AT(agent.max_unknown_keys), 1, 1u << 24,
	    "keys for unknown identities (default 4096)" },
	{ "idle-evict-ms", K_U32, AT(agent.idle_evict_ms), 0, 86400000,
	    "evict idle unknown keys after (default 300000; 0 never)" },
	{ "max-threads", K_U32, AT(agent.max_threads), 1, 65536,
	    "threads counting in blocks of their own (default 64)" },
	{ "max-callers", K_U32, AT(agent.max_callers), 1, 65536,
	    "callers' quotas room is kept for, across configs allotd "
	    "sends (default max(2n, n + 256) for n in --config)" },
	{ "config-cache", K_STR, AT(agent.config_cache_file), 0, 0,
	    "file keeping the last config allotd sent, used at start "
	    "while allotd is down (default none)" },
	{ "help", K_HELP, 0, 0, 0, "this text" },
};
#define NOPTS (sizeof optdefs / sizeof optdefs[0])

static void
usage(FILE *f)
{
	fprintf(f,
	    "usage: " AGENTD_PROG " --config FILE [options]\n\n"
	    "liballot as a sidecar: Envoy's Rate Limit Service over "
	    "gRPC,\na JSON decision API and /metrics over HTTP. "
	    "docs/sidecar.md.\n\n");
	/* Each help text wrapped at 79 columns, indented past the names. */
	for (size_t i = 0; i < NOPTS; i++) {
		int col = fprintf(f, "  --%-24s", optdefs[i].name);
		for (const char *w = optdefs[i].help; *w != '\0';) {
			int n = (int) strcspn(w, " ");
			if (col + 1 + n > 79) {
				col = fprintf(f, "\n%28s", "") - 1;
			}
			col += fprintf(f, " %.*s", n, w);
			w += n;
			w += *w == ' ';
		}
		fputc('\n', f);
	}
}

static const char *const levels[8] = { "emerg", "alert", "crit", "error",
	"warning", "notice", "info", "debug" };

const char *
agentd_level_name(int level)
{
	return levels[level < 0 ? 0 : level > 7 ? 7 : level];
}

static uint32_t
parse_u32(const char *name, const char *v, uint32_t min, uint32_t max)
{
	char *end;
	errno = 0;
	unsigned long long x = strtoull(v, &end, 10);
	if (errno != 0 || end == v || *end != '\0' || v[0] == '-' || x < min ||
	    x > max)
		die("--%s wants an integer in %" PRIu32 "..%" PRIu32
		    ", not '%s'",
		    name, min, max, v);
	return (uint32_t) x;
}

static void read_file(struct agentd_options *o, const char *path);

/* Store `arg` as `d` says. Strings from the options file are kept for
 * the life of the process. */
static void
store(struct agentd_options *o, const struct optdef *d, const char *arg)
{
	char *field = (char *) o + d->off;
	char *end;
	switch (d->kind) {
	case K_STR: *(const char **) field = arg; break;
	case K_U32:
		*(uint32_t *) field = parse_u32(d->name, arg, d->min, d->max);
		break;
	case K_DOUBLE:
		errno = 0;
		*(double *) field = strtod(arg, &end);
		if (errno != 0 || end == arg || *end != '\0' ||
		    !(*(double *) field >= 0 && *(double *) field <= 0.5))
			die("--%s wants a fraction in 0..0.5, not '%s'",
			    d->name, arg);
		break;
	case K_LEVEL:
		for (int i = 0; i < 8; i++)
			if (strcmp(arg, levels[i]) == 0) {
				o->log_level = i;
				return;
			}
		o->log_level = (int) parse_u32(d->name, arg, 0, 7);
		break;
	case K_OPTIONS:
		if (o->options_file != NULL)
			die("--options may be given once");
		o->options_file = arg;
		read_file(o, arg);
		break;
	case K_HELP: usage(stdout); exit(0);
	}
}

static const struct optdef *
find(const char *name)
{
	for (size_t i = 0; i < NOPTS; i++)
		if (strcmp(optdefs[i].name, name) == 0)
			return &optdefs[i];
	return NULL;
}

static char *
trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	size_t n = strlen(s);
	while (n > 0 && strchr(" \t\r\n", s[n - 1]) != NULL)
		s[--n] = '\0';
	return s;
}

/* One "name value" or "name = value" a line. */
static void
read_file(struct agentd_options *o, const char *path)
{
	FILE *f = fopen(path, "r");
	if (f == NULL)
		die("%s: %s", path, strerror(errno));
	char line[4096];
	for (unsigned ln = 1; fgets(line, sizeof line, f) != NULL; ln++) {
		char *hash = strchr(line, '#');
		if (hash != NULL)
			*hash = '\0';
		char *s = trim(line);
		if (*s == '\0')
			continue;
		size_t nl = strcspn(s, " \t=");
		char *v = s + nl;
		if (*v != '\0')
			*v++ = '\0';
		v = trim(v);
		if (*v == '=')
			v = trim(v + 1);
		const struct optdef *d = find(s);
		if (d == NULL || d->kind == K_HELP || d->kind == K_OPTIONS)
			die("%s:%u: unknown option '%s'", path, ln, s);
		if (*v == '\0')
			die("%s:%u: '%s' wants a value", path, ln, s);
		if (d->kind != K_STR) {
			store(o, d, v);
			continue;
		}
		char *copy = strdup(v); /* kept: the options live as long */
		if (copy == NULL)
			die("out of memory");
		store(o, d, copy);
	}
	fclose(f);
}

static void
defaults(struct agentd_options *o)
{
	memset(o, 0, sizeof *o);
	o->grpc_listen = "127.0.0.1:8081";
	o->http_listen = "127.0.0.1:8082";
	o->cert_check_ms = 1000;
	o->identity_keys = "caller";
	o->endpoint_keys = "endpoint,path";
	o->unknown = "default";
	o->grpc_threads = 2;
	o->max_connections = 1024;
	o->max_streams = 128;
	o->max_message = 16384;
	o->max_descriptors = 16;
	o->max_entries = 16;
	o->idle_timeout_s = 300;
	o->log_level = 6;
	allot_agent_options_init(&o->agent);
	o->agent.service = "sidecar";
}

void
agentd_options_parse(struct agentd_options *o, int argc, char **argv)
{
	struct option longopts[NOPTS + 1];
	for (size_t i = 0; i < NOPTS; i++)
		longopts[i] = (struct option) { optdefs[i].name,
			optdefs[i].kind == K_HELP ? no_argument :
			                            required_argument,
			NULL,
			optdefs[i].kind == K_HELP ? 'h' : 256 + (int) i };
	longopts[NOPTS] = (struct option) { NULL, 0, NULL, 0 };
	defaults(o);
	/* The options file first, wherever --options stands. */
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--") == 0)
			break;
		if (strncmp(argv[i], "--options=", 10) == 0)
			store(o, find("options"), argv[i] + 10);
		else if (strcmp(argv[i], "--options") == 0 && i + 1 < argc)
			store(o, find("options"), argv[++i]);
	}
	int ch;
	while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		if (ch == 'h') {
			usage(stdout);
			exit(0);
		}
		if (ch < 256 || ch >= 256 + (int) NOPTS) {
			usage(stderr);
			exit(2);
		}
		const struct optdef *d = &optdefs[ch - 256];
		if (d->kind != K_OPTIONS)
			store(o, d, optarg);
	}
	if (optind < argc)
		die("unexpected argument '%s' (see --help)", argv[optind]);
	if (o->config == NULL)
		die("--config FILE is required (see --help)");
	if ((o->tls_cert == NULL) != (o->tls_key == NULL))
		die("--tls-cert and --tls-key go together");
}
