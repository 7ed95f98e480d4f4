/* SPDX-License-Identifier: MIT */
/*
 * allotd's own parts, shared by its files: the daemon's state (allotd.c
 * owns it: main, the loop, signals, the admin socket's jobs) and its part
 * in a cluster (allotd_cluster.c: the config the cluster commits, the
 * leader's proposals, membership). Loop thread only, unless said.
 */
#ifndef ALLOT_COORDINATOR_ALLOTD_INT_H
#define ALLOT_COORDINATOR_ALLOTD_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "admin/admin.h"
#include "consensus/cluster.h"
#include "dispatch/peerlimit.h"
#include "log.h"
#include "logfmt.h"
#include "net/http.h"
#include "net/server.h"
#include "state/metrics.h"
#include "state/state.h"
#include "store/store.h"

typedef struct allotd {
	uv_loop_t loop;
	uv_timer_t tick;
	uv_timer_t drain_timer;
	uv_signal_t sig_term;
	uv_signal_t sig_int;
	uv_signal_t sig_hup;
	bool loop_open;
	bool handles_open;
	allot__logger lg;
	allot__logfmt log_format; /* the logger's ctx */
	allot__metrics metrics;
	allot__store *store;
	allot__state *state;
	allot__server *server;
	/* nng did not close the protocol socket (allot__server_close()):
	 * the process ends with _exit(), the peer limits are kept. */
	bool server_stuck;
	allot__peerlimit *peerlimit;
	allot__http *http;
	allot__cluster *cluster;
	allot__admin *admin;
	const char *config_path;
	/* The quota config at start-up until the state owns it. */
	allot_config *cfg;
	/* The config in force as its text (what the store recorded and
	 * GET /config answers) and a copy of its model (what an apply is
	 * diffed against); replaced at each change, loop thread only. */
	char *text;
	allot_config *cur;
	uint64_t last_second_ns;
	uint64_t drain_deadline_ns;
	bool draining;
	const char *stop_signal;
	allot__logrl rl_store;
	/* The cluster's committed config being installed: parsed on a
	 * worker thread (allotd_cluster.c), then installed on the loop; the
	 * latest one committed meanwhile waits in `install_next`. */
	struct allotd_install *installing, *install_next;
} allotd;

/* cluster.h's on_config: a committed config, installed in the state and
 * the quota file. It is parsed on libuv's thread pool, so that a large
 * file never stalls the loop that answers agents and Raft's heartbeats
 * (issue 27); committed configs are installed one at a time, in order,
 * and one committed while another is parsed waits for it (a later one
 * replaces it: the latest is what the log says). */
void allotd_cluster_install(void *ctx, const char *text, size_t len,
    uint64_t epoch, const allot__state_who *who);
/* cluster.h's config_busy: whether an install is under way (parsed or
 * waiting). */
bool allotd_cluster_installing(void *ctx);
/* Stopping: a config still waiting is dropped, one being parsed is
 * freed when its parse ends, without installing. */
void allotd_cluster_install_cancel(allotd *d);
/* cluster.h's on_serving: a new cluster's first leader proposes its
 * quota file. */
void allotd_cluster_serving(void *ctx);
/* SIGHUP in a cluster: the leader proposes the file (takes cfg and
 * text). */
void allotd_cluster_reload(allotd *d, allot_config *cfg, char *text);
/* allotctl apply in a cluster: the leader proposes. */
void allotd_cluster_apply(allotd *d, allot__admin_job *job);
/* allotctl member add|remove|list. */
void allotd_admin_member(allotd *d, allot__admin_job *job);

#endif
