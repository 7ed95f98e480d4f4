/* SPDX-License-Identifier: MIT */
/*
 * allot-agentd's start-up and shutdown: options, the quota file and the
 * agent (liballot, syncing with allotd when --coordinator is given), the
 * gRPC and HTTP listeners, the "listening" lines that tests and scripts
 * wait for, then the main thread's watch: every --cert-check-ms it looks
 * whether the TLS certificate files changed (and the listeners reload
 * them; connections in progress keep their session) and whether the
 * coordinator's client certificate changed (and liballot reloads it; see
 * watch_coordinator_cert),
 * until SIGTERM or
 * SIGINT stops everything in order: listeners first, so that no request
 * uses the agent once it is destroyed, then the agent (a graceful leave).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agentd.h"
#include "logfmt.h"

/* Idle timeouts are read on every I/O event and need no more than
 * milliseconds: the coarse clock costs no more than a memory read. */
uint64_t
agentd_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
	return (uint64_t) ts.tv_sec * 1000u + (uint64_t) ts.tv_nsec / 1000000u;
}

static void
emit(const struct agentd *d, int level, const char *id, const char *msg)
{
	char text[1200];
	snprintf(text, sizeof text, AGENTD_PROG ": %s %s: %s",
	    allot__logfmt_level(level), id, msg);
	allot__logfmt_emit((allot__logfmt) d->o.log_format, AGENTD_PROG, level,
	    id, msg, text);
}

void
agentd_log(
    const struct agentd *d, int level, const char *id, const char *fmt, ...)
{
	if (level > d->o.log_level)
		return;
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	emit(d, level, id, msg);
}

/* liballot's handler: the library never prints by itself. */
static void
agent_log(void *ctx, int level, const char *id, const char *msg)
{
	const struct agentd *d = ctx;
	if (level <= d->o.log_level)
		emit(d, level, id, msg);
}

__attribute__((noreturn)) static void
fail(const char *what, const char *why)
{
	fprintf(stderr, AGENTD_PROG ": %s: %s\n", what, why);
	exit(2);
}

static void
start_agent(struct agentd *d)
{
	char err[512];
	int rc = allot_config_load(d->o.config, err, sizeof err, &d->cfg);
	if (rc != ALLOT_OK)
		fail(d->o.config,
		    rc == ALLOT_ECONFIG || rc == ALLOT_ENOENT ?
		        err :
		        allot_strerror(rc));
	if (!agentd_map_init(&d->map, &d->o, err, sizeof err) ||
	    !agentd_map_tokens(&d->map, &d->o, agent_log, d, err, sizeof err))
		fail("mapping", err);
	allot_agent_options ao = d->o.agent;
	ao.log = agent_log;
	ao.log_ctx = d;
	ao.log_level = d->o.log_level;
	ao.waits = d->o.wait_ms > 0; /* every decision may wait */
	rc = allot_agent_create(d->cfg, &ao, &d->agent);
	if (rc != ALLOT_OK)
		fail("agent", allot_strerror(rc));
}

/*
 * The certificate and key liballot presents to allotd: when that file
 * changes, liballot reloads it with the CA (allot_agent_reload_tls()):
 * the session in progress keeps its TLS connection, the next Register's
 * identity proof is signed with the new key, and the next connection
 * presents the new certificate. A file caught half written fails to
 * load and is tried again at its next change; the old certificate stays
 * in use meanwhile (liballot logs why).
 */
static void
watch_coordinator_cert(struct agentd *d, struct stat *last)
{
	struct stat st;
	if (d->o.agent.tls_cert_key_file == NULL ||
	    d->o.agent.coordinator == NULL ||
	    stat(d->o.agent.tls_cert_key_file, &st) != 0)
		return;
	bool changed = last->st_ino != 0 &&
	    (st.st_ino != last->st_ino || st.st_size != last->st_size ||
	        st.st_mtim.tv_sec != last->st_mtim.tv_sec ||
	        st.st_mtim.tv_nsec != last->st_mtim.tv_nsec);
	*last = st;
	if (!changed)
		return;
	int rc = allot_agent_reload_tls(d->agent);
	if (rc == ALLOT_OK)
		atomic_fetch_add(&d->n.coord_cert_reloads, 1);
	else
		atomic_fetch_add(&d->n.coord_cert_reload_errors, 1);
	agentd_log(d, rc == ALLOT_OK ? 6 : 4, "AGENTD-COORD-CERT",
	    "%s changed: %s", d->o.agent.tls_cert_key_file,
	    rc == ALLOT_OK ? "reloaded; the session to allotd continues" :
	                     allot_strerror(rc));
}

static bool
enabled(const char *listen)
{
	return listen != NULL && listen[0] != '\0' &&
	    strcmp(listen, "none") != 0;
}

/* Descriptors: each connection takes one (the HTTP API a thread too),
 * and the soft limit many systems start a process with (1,024) is far
 * below what --max-connections allows. Raised to the hard limit, as
 * servers do; when that is still below what the listeners may hold, the
 * gRPC workers make room by closing idle connections, then pause
 * accepting (grpc.c), and the log says so now. */
static void
raise_fd_limit(struct agentd *d)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return;
	rlim_t was = rl.rlim_cur;
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
			rl.rlim_cur = was;
	}
	/* Both listeners' connections, and room for the rest. */
	rlim_t want = 2 * (rlim_t) d->o.max_connections + 64;
	if (rl.rlim_cur < want)
		agentd_log(d, 4, "AGENTD-LIMIT",
		    "%llu descriptors (hard limit %llu) for up to %u "
		    "connections per listener: raise the limit (systemd "
		    "LimitNOFILE=, ulimit -n) or lower --max-connections",
		    (unsigned long long) rl.rlim_cur,
		    (unsigned long long) rl.rlim_max, d->o.max_connections);
	else if (rl.rlim_cur != was)
		agentd_log(d, 7, "AGENTD-LIMIT",
		    "descriptors: soft limit raised from %llu to %llu",
		    (unsigned long long) was,
		    (unsigned long long) rl.rlim_cur);
}

int
main(int argc, char **argv)
{
	static struct agentd daemon; /* zeroed; reached from every thread */
	struct agentd *d = &daemon;
	agentd_options_parse(&d->o, argc, argv);

	/* Signals are taken by the main thread only: block them before
	 * any thread exists. SIGHUP checks the certificates at once (as
	 * after a rotation); a client that hangs up must not kill us. */
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGHUP);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
	raise_fd_limit(d);

	start_agent(d);
	if (enabled(d->o.grpc_listen)) {
		if (grpc_server_start(d, &d->grpc) != ALLOT_OK)
			fail("gRPC", "cannot serve (see above)");
		printf("grpc listening on %s://%s (port %u)\n",
		    d->o.tls_cert != NULL ? "https" : "http", d->o.grpc_listen,
		    grpc_server_port(d->grpc));
	}
	if (enabled(d->o.http_listen) || d->o.http_socket != NULL ||
	    enabled(d->o.metrics_listen)) {
		if (http_api_start(d, &d->http) != ALLOT_OK)
			fail("HTTP", "cannot serve (see above)");
		if (enabled(d->o.http_listen))
			printf("http listening on %s (port %u)\n",
			    d->o.http_listen, http_api_port(d->http));
		if (d->o.http_socket != NULL)
			printf(
			    "http listening on unix:%s\n", d->o.http_socket);
		if (enabled(d->o.metrics_listen))
			printf("metrics listening on %s (port %u)\n",
			    d->o.metrics_listen, http_api_ops_port(d->http));
	}
	printf("ready\n");
	fflush(stdout);
	agentd_log(d, 6, "AGENTD-START", "service %s, coordinator %s",
	    d->o.agent.service,
	    d->o.agent.coordinator ? d->o.agent.coordinator : "none");

	struct timespec tick = { d->o.cert_check_ms / 1000,
		(long) (d->o.cert_check_ms % 1000) * 1000000 };
	int sig;
	struct stat coord_cert = { 0 };
	for (;;) {
		watch_coordinator_cert(d, &coord_cert);
		sig = sigtimedwait(&sigs, NULL, &tick);
		if (sig > 0 && sig != SIGHUP)
			break;
		if (d->grpc != NULL)
			grpc_server_check_certs(d->grpc);
	}
	agentd_log(d, 6, "AGENTD-STOP", "signal %d: stopping", sig);
	atomic_store(&d->stopping, true);
	http_api_stop(d->http);
	grpc_server_stop(d->grpc);
	allot_agent_destroy(d->agent);
	allot_config_free(d->cfg);
	agentd_map_fini(&d->map);
	agentd_log(d, 6, "AGENTD-STOPPED", "stopped");
	return 0;
}
