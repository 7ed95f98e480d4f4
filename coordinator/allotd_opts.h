/* SPDX-License-Identifier: MIT */
/*
 * allotd's command line: the settings it carries (allot__daemon_opts)
 * and the one table of options behind both getopt_long and `--help`
 * (allotd_opts.c). Part of the allotd executable only, not of the
 * coordinator library.
 */
#ifndef ALLOT_COORDINATOR_ALLOTD_OPTS_H
#define ALLOT_COORDINATOR_ALLOTD_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "admin/admin_tls.h"
#include "logfmt.h"
#include "dispatch/authn.h"
#include "net/http.h"
#include "dispatch/peerlimit.h"
#include "consensus/cluster.h"
#include "net/server.h"
#include "state/state.h"

#define ALLOT__DAEMON_EXIT_USAGE 2
#define ALLOT__DAEMON_DEFAULT_LISTEN "tcp://127.0.0.1:7400"
#define ALLOT__DAEMON_DEFAULT_HTTP "127.0.0.1:7480"

typedef struct allot__daemon_opts {
	const char *config_path;
	const char *db_path;
	const char *urls[ALLOT__SERVER_MAX_URLS];
	size_t nurls;
	const char *http_addr; /* NULL: "off" */
	allot__http_limits http_lim;
	const char *admin_socket; /* NULL: none (reload by SIGHUP only) */
	const char *admin_group; /* NULL: the socket is mode 0600 */
	/* The admin API over HTTPS with mutual TLS (admin/admin_tls.h). */
	const char *admin_listen; /* NULL: none */
	const char *admin_ca; /* NULL: tls_ca */
	const char *admin_allow[ALLOT__ADMIN_ALLOW_MAX];
	size_t nadmin_allow;
	const char *tls_cert;
	const char *tls_key; /* NULL: in tls_cert's file */
	const char *tls_ca;
	int require_id; /* -1 until parsed: then on with --tls-ca */
	const char *idmaps[ALLOT__AUTHN_MAX_MAPS];
	size_t nidmaps;
	/* The --identity-audience URLs, then (with identity required) the
	 * listen URLs and this member's sync URL. */
	const char *idaud[ALLOT__AUTHN_MAX_AUDIENCES];
	size_t nidaud;
	uint32_t retention_s;
	uint32_t workers;
	uint32_t max_keys;
	int log_level;
	allot__logfmt log_format; /* --log-format */
	/* Cluster mode (cluster.h); raft_id 0: a single allotd. */
	uint64_t raft_id;
	const char *raft_addr;
	const char *raft_dir; /* default: db_path + ".raft" */
	char raft_dir_buf[4096];
	const char *agent_url; /* default: the seed's, else urls[0] */
	allot__cluster_seed seeds[ALLOT__CLUSTER_MAX_SEEDS];
	size_t nseeds;
	bool join;
	uint32_t election_ms;
	uint32_t snapshot_entries; /* 0: the consensus core's default */
	const char *raft_member_id; /* TLS between members: the peers' ID */
	allot__state_opts so; /* store, lg and metrics are left unset */
	allot__peerlimit_opts plo;
	allot__authn *authn; /* with identity required; the caller frees */
} allot__daemon_opts;

/* Parse the command line into `o` and check it. Returns -1 when allotd
 * should start; otherwise the exit status, with what to say (the help
 * text, the version, or the error) already printed: 0 for --help and
 * --version, ALLOT__DAEMON_EXIT_USAGE for a bad command line. */
int allot__daemon_parse(int argc, char **argv, allot__daemon_opts *o);

#endif
