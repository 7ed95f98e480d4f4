/* SPDX-License-Identifier: MIT */
/*
 * The service suite's shared parts (tests/test_service.c has the suite):
 * the identities the certificates carry, the real allot-example-service
 * process started with a quota file and stopped with SIGTERM, libcurl
 * requests over mutual TLS (or plain HTTP) and the headers they answer
 * with, the counters of /stats, the throwaway CA that scripts/mkcerts
 * makes once per run, and the quota files more than one case file uses.
 */
#ifndef ALLOT_TESTS_SERVICE_HARNESS_H
#define ALLOT_TESTS_SERVICE_HARNESS_H

#include <check.h>
#include <curl/curl.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>

#include "proc.h"

#define TD "spiffe://prod.example.internal"
#define ID_CHECKOUT TD "/ns/payments/sa/checkout"
#define ID_REPORTING TD "/ns/analytics/sa/reporting"
#define ID_SEARCH TD "/ns/search/sa/search"
#define ID_BURSTER TD "/ns/test/sa/burster"
#define ID_SLOW TD "/ns/test/sa/slow"
#define ID_SHADOW TD "/ns/test/sa/shadow"
#define ID_EXPORTER TD "/ns/test/sa/exporter"
#define ID_INTERACTIVE TD "/ns/test/sa/interactive"
#define ID_STRANGER TD "/ns/nobody/sa/stranger" /* not in any config */

struct svc {
	pid_t pid;
	int port;
	int exit_status; /* of a service that stopped before listening */
	char cfg[PATH_MAX];
	char err[PATH_MAX];
};

#define svc_start(s, yaml, ...)                                       \
	do {                                                          \
		bool started_ = svc_try_start(s, yaml, __VA_ARGS__);  \
		if (!started_) {                                      \
			char *e_ = pc_read_file((s)->err);            \
			fprintf(stderr, "service stderr:\n%s\n",      \
			    e_ != NULL ? e_ : "");                    \
			free(e_);                                     \
		}                                                     \
		ck_assert_msg(started_, "the service did not start"); \
	} while (0)

struct resp {
	long status;
	char body[1 << 17];
	size_t blen;
	char hdrs[8192];
	size_t hlen;
	double seconds;
};

/* Where the certificates are: made once by the unchecked fixture in the
 * runner process, shared by the forked tests. */
extern char svc_dir[1024];
extern char svc_other_ca[PATH_MAX]; /* a second CA, nobody trusts it */
extern char svc_service_path[PATH_MAX]; /* allot-example-service */
extern char svc_mkcerts_path[PATH_MAX]; /* scripts/mkcerts */

/* ---- processes ---- */

/* Time, waits, files: tests/support/proc.h (pc_now_ms, pc_wait_exit,
 * pc_read_file, ...). */
/* Run a program to completion (at most 60 s), its output to /dev/null;
 * returns its exit code as pc_wait_exit() gives it. */
int svc_run(char *const argv[]);
/* Start the service with `yaml` as its quota file and the arguments
 * after `tls` (NULL-terminated); mTLS arguments are added unless `tls`
 * is false. True once it said it listens (bounded wait); false if it
 * exited first (`exit_status` says how) or never said so. svc_start()
 * asserts it. */
bool svc_try_start(struct svc *s, const char *yaml, bool tls, ...);
/* SIGTERM, then SIGKILL after 10 s. Asserts a clean exit (status 0):
 * under AddressSanitizer that includes no leak. */
void svc_stop(struct svc *s);

/* ---- HTTP ---- */

/* A client presenting certificate `name` from `dir` (NULL: none). */
CURL *svc_client(const char *dir, const char *name);
/* GET over https (or http when `plain`), with optional extra header
 * lines. Returns the CURLcode; `r` has status, headers and body. */
CURLcode svc_get(CURL *h, const struct svc *s, bool plain, const char *path,
    const char *extra_header, struct resp *r);
/* One request on a fresh connection; asserts the transfer worked. */
void svc_get1(const struct svc *s, const char *dir, const char *cert,
    const char *path, const char *extra_header, struct resp *r);
/* The value of header `name` (case-insensitive), trimmed; NULL if
 * absent. */
const char *svc_header(
    const struct resp *r, const char *name, char *buf, size_t len);
void svc_assert_header(
    const struct resp *r, const char *name, const char *want);
/* Every response of /lookup and /export carries these. */
void svc_assert_ratelimit_headers(const struct resp *r);
/* RateLimit-Policy names quota `name`, `q` tokens per window `w`. */
void svc_assert_policy(
    const struct resp *r, const char *name, unsigned q, unsigned w);

/* ---- /stats ---- */

/* The /stats document (malloc'd). */
char *svc_stats(const struct svc *s);
/* A numeric field of the first flat JSON object that starts with
 * `anchor`; -1 if there is none. */
int64_t svc_jfield(const char *doc, const char *anchor, const char *field);
/* A caller's counter in /stats (id NULL: the callers without one). */
int64_t svc_caller_field(const char *doc, const char *id, const char *field);
/* A counter of caller `id` on `endpoint` in /stats. */
int64_t svc_key_field(
    const char *doc, const char *id, const char *endpoint, const char *field);

/* ---- the certificates ---- */

/* scripts/mkcerts into `dir` for every identity above; its exit code. */
int svc_mkcerts(const char *dir);
/* The integration cases' unchecked fixture: runs in the runner process,
 * once, making the certificates for every test; the teardown removes
 * them (unless ALLOT_KEEP_TMP is set). */
void svc_certs_setup(void);
void svc_certs_teardown(void);

/* ---- quota files used by more than one case file ---- */

extern const char svc_cfg_identities[];
extern const char svc_cfg_export[];

/* Each case file adds its cases, in order, to the suite's integration
 * TCase (the one with the certificates fixture). */
void service_identity_cases(TCase *tc);
void service_limit_cases(TCase *tc);
void service_lifecycle_cases(TCase *tc);
void service_token_cases(TCase *tc);

#endif
