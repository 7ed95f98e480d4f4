/* SPDX-License-Identifier: MIT */
/*
 * allotd's admin API (--admin-socket): HTTP over a Unix domain socket,
 * and the same over HTTPS with mutual TLS (--admin-listen, admin_tls.h),
 * served by libmicrohttpd, the one place where the quota config can be
 * changed other than by editing the file and sending SIGHUP.
 *
 *   GET  /config          the config in force: text, path, epoch, digest
 *   POST /config/diff     body: a quota file; its changes, per quota
 *   POST /config/apply    body: a quota file; ?reason= (required),
 *                         ?file= (the name errors use), ?expect=DIGEST
 *                         (refused with 409 when the config in force
 *                         moved), ?as=NAME (recorded as claimed)
 *   GET  /members         cluster: the members, their roles, the leader
 *   POST /members/add     ?id=&raft=HOST:PORT&url=AGENT_URL (leader)
 *   POST /members/remove  ?id= (leader), ?wait_ms= (default 10000, at
 *                         most 120000; 0: answer at once): answers when
 *                         the removal is done as far as this member can
 *                         tell (the leader's own too), with "outcome"
 *                         and "waited_ms" before the member list; 504
 *                         naming the state reached on timeout
 *
 * In a cluster, apply and the member changes run on the leader; another
 * member answers 421 naming the leader's agent URL.
 *
 * Who may: whoever may connect to the socket, i.e. allotd's user (mode
 * 0600) or the members of --admin-group (0660); over HTTPS, the callers
 * whose certificates' SPIFFE IDs --admin-allow names. Who did: the kernel
 * names the peer of each connection (SO_PEERCRED), and that user name is
 * what the audit table records; over HTTPS, the verified SPIFFE ID. Files are
 * checked by the same loader on the handler's thread; what touches the state
 * (reading the config in force, applying) runs on allotd's loop thread, handed
 * over as a job, so that reloads stay on the one thread that does them.
 */
#ifndef ALLOT_COORDINATOR_ADMIN_H
#define ALLOT_COORDINATOR_ADMIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "admin_tls.h"
#include "config.h"
#include "config_diff.h"
#include "log.h"
#include "state/state.h"

/* Largest request body (a quota file) and reason accepted. */
#define ALLOT__ADMIN_BODY_MAX (4u * 1024u * 1024u)
#define ALLOT__ADMIN_REASON_MAX 1024u
#define ALLOT__ADMIN_MAX_CONNECTIONS 16u

typedef struct allot__admin allot__admin;

typedef enum allot__admin_op {
	ALLOT__ADMIN_GET, /* the config in force */
	ALLOT__ADMIN_APPLY, /* install `cfg` */
	ALLOT__ADMIN_MEMBERS, /* the cluster's members, JSON in text_out;
	                       * with member_id, also member_left */
	ALLOT__ADMIN_MEMBER_ADD,
	ALLOT__ADMIN_MEMBER_REMOVE,
} allot__admin_op;

/* A job for the loop thread. The run function fills the outputs. */
typedef struct allot__admin_job {
	allot__admin_op op;
	/* APPLY, in: */
	allot_config *cfg; /* the run function takes it */
	const char *text; /* the file as sent, NUL-terminated */
	size_t len;
	const allot__state_who *who;
	bool has_expect; /* refuse unless the digest in force is: */
	uint64_t expect;
	/* MEMBER_ADD, MEMBER_REMOVE (and MEMBERS, for member_left), in: */
	uint64_t member_id;
	const char *member_raft;
	const char *member_url;
	/* out: */
	int status; /* HTTP status: 200, or why not (409, 500, 503) */
	char msg[512]; /* the error, when status is not 200 */
	uint64_t epoch; /* in force after the job */
	uint64_t digest;
	uint64_t prev_epoch; /* APPLY: in force before */
	uint64_t prev_digest;
	bool changed; /* APPLY: a new epoch was installed */
	bool committed; /* APPLY: the audit rows are on disk */
	/* APPLY in a cluster: proposed through the log; every member
	 * installs it once committed (GET /config shows the epoch). */
	bool proposed;
	char *path; /* GET: allotd's quota file (malloc) */
	char *text_out; /* GET: the text in force; MEMBERS: JSON (malloc) */
	/* MEMBER_REMOVE and MEMBERS with a member_id: whether its removal
	 * is done as far as this member can tell, and `msg` (status 200)
	 * says where it is (allot__cluster_member_left). */
	bool member_left;
	allot__config_diff diff; /* APPLY: what changed */
	/* APPLY: instead of `diff`, the config it changed from (a copy,
	 * freed by the handler), which diffs it on its own thread: a diff
	 * of 59,001 quotas would stall the loop (issue 27). */
	allot_config *before;
} allot__admin_job;

/* Runs `job` on the loop thread. */
typedef void (*allot__admin_run_fn)(void *ctx, allot__admin_job *job);

typedef struct allot__admin_opts {
	const char *path; /* the socket; NULL: none */
	const char *group; /* NULL: mode 0600 */
	/* The HTTPS listener (admin_tls.h); tls.listen NULL: none. Its
	 * connection limits are the socket's. */
	allot__admin_tls_opts tls;
	uv_loop_t *loop; /* the run function is called on its thread */
	allot__admin_run_fn run;
	void *ctx;
	const allot__logger *lg;
} allot__admin_opts;

/* Create the socket and serve. On failure `err` says why and nothing is
 * left running. Loop thread. */
int allot__admin_start(
    const allot__admin_opts *o, char *err, size_t errlen, allot__admin **ret);

/* Refuse new jobs, stop serving, remove the socket, and close the loop
 * handle (freed once the loop has run the close). Accepts NULL. Loop
 * thread, not from the run function. */
void allot__admin_stop(allot__admin *a);

/* Write `len` bytes of `text` over the quota file `path` atomically
 * (common/file.h: a temporary file beside it, fsync, rename, fsync of
 * the directory), so that the file is the old one or the new one after
 * any crash, and a restart loads what was applied. When `path` is a
 * symbolic link, the file it names is replaced and the link kept. The
 * mode of the old file is kept. ALLOT_OK, or ALLOT_EIO with `err` saying
 * why (and the file unchanged). */
int allot__admin_write_file(
    const char *path, const char *text, size_t len, char *err, size_t errlen);

#endif
