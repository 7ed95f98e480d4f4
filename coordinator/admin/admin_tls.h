/* SPDX-License-Identifier: MIT */
/*
 * The admin API over HTTPS with mutual TLS (--admin-listen): the listener
 * and who its callers are, for pipelines that change quotas from another
 * host (a GitOps job, a Kubernetes Job) without a shell on allotd's.
 *
 * Who may: a caller whose certificate chains to the admin CA
 * (--admin-ca, by default --tls-ca), is meant for TLS clients, and
 * carries exactly one URI SAN, a SPIFFE ID, that an --admin-allow
 * pattern names: the ID itself, or a prefix followed by * (the prefix
 * spiffe://example.org/ns/ops/sa/ and a star name any ID one segment
 * below it). Anyone else gets 401 (no valid certificate) or 403 (not on
 * the list) before a byte of the request is read, and a log line.
 * Who did: that SPIFFE ID, recorded as the change's author in the audit
 * (config_changes, v_quota_changes), as the Unix socket records the
 * kernel's user name.
 */
#ifndef ALLOT_COORDINATOR_ADMIN_TLS_H
#define ALLOT_COORDINATOR_ADMIN_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include <microhttpd.h>

/* At most this many --admin-allow patterns. */
#define ALLOT__ADMIN_ALLOW_MAX 64u

typedef struct allot__admin_tls allot__admin_tls;

typedef struct allot__admin_tls_opts {
	const char *listen; /* HOST:PORT or https://HOST:PORT */
	const char *cert_key; /* allotd's certificate and key, one PEM */
	const char *key; /* NULL: in cert_key (--tls-key) */
	const char *ca; /* the CA callers' certificates chain to */
	const char *const *allow; /* SPIFFE IDs, or prefixes and a star */
	size_t nallow;
	unsigned max_connections;
	unsigned idle_timeout_s;
} allot__admin_tls_opts;

/* Check `pattern` as an --admin-allow value: a well-formed SPIFFE ID,
 * or one followed by a slash and a star. False with `err` saying why. */
bool allot__admin_tls_pattern_ok(
    const char *pattern, char *err, size_t errlen);

/* Read the PEM files, bind and serve `handler` and `completed` (with
 * `cls`) on the listener. ALLOT_OK, or an error with `err` saying why
 * and nothing left running. */
int allot__admin_tls_start(const allot__admin_tls_opts *o,
    MHD_AccessHandlerCallback handler, MHD_RequestCompletedCallback completed,
    void *cls, char *err, size_t errlen, allot__admin_tls **ret);

/* Stop serving and free. Accepts NULL. */
void allot__admin_tls_stop(allot__admin_tls *t);

/* Whether connection `c` came in on this listener. */
bool allot__admin_tls_owns(
    const allot__admin_tls *t, struct MHD_Connection *c);

/* The caller of `c` (a connection of this listener): 200 with its
 * SPIFFE ID in `who` when it may use the API; else 401 or 403, with
 * `why` saying what is wrong (and `who` the ID when there is one). */
unsigned allot__admin_tls_caller(const allot__admin_tls *t,
    struct MHD_Connection *c, char *who, size_t n, char *why, size_t whylen);

#endif
