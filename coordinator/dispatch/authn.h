/* SPDX-License-Identifier: MIT */
/*
 * Register identity checks (docs/protocol.md "Identity", docs/operations.md
 * "TLS"). nng 1.5.2 verifies the peer's certificate in the TLS handshake
 * but does not hand it to allotd, so the agent proves its identity inside
 * the protocol: Register.identity carries its certificate chain and a
 * signature by the certificate's key over replica_id, service, the
 * coordinator URL it dialed, a timestamp and a nonce (common/authn_msg.h).
 * This module verifies the chain against the CA allotd was given, the
 * signature, that the URL names this coordinator, that the timestamp is
 * within the window of the coordinator's wall clock and that the nonce was
 * not seen in that window, then takes the service from the certificate's
 * SPIFFE ID and requires the Register to name the same one. The session
 * is then bound to the connection the Register came on (state.h), so a
 * peer can only act as the identity whose key it holds.
 */
#ifndef ALLOT_COORDINATOR_AUTHN_H
#define ALLOT_COORDINATOR_AUTHN_H

#include <stddef.h>
#include <stdint.h>

#include "allot.pb-c.h"
#include "state/metrics.h"

#define ALLOT__AUTHN_WINDOW_MS 60000 /* accepted clock skew, each way */
#define ALLOT__AUTHN_MAX_MAPS 16u
#define ALLOT__AUTHN_MAX_AUDIENCES 32u

typedef struct allot__authn allot__authn;

typedef struct allot__authn_opts {
	const char *ca_file; /* PEM, the CA agents' certificates chain to */
	/* SPIFFE ID patterns naming the service, tried in order: segments
	 * are literal, "*" (any one segment or trust domain) or "{service}"
	 * (exactly one, the service). None: the ID's last path segment. */
	const char *const *maps;
	size_t nmaps;
	/* URLs a proof may name as its audience. A URL whose host is
	 * 0.0.0.0, [::] or * accepts any host with the same scheme and
	 * port. */
	const char *const *audiences;
	size_t naudiences;
	int64_t window_ms; /* 0: ALLOT__AUTHN_WINDOW_MS */
} allot__authn_opts;

/* Load the CA and check the patterns. ALLOT_EINVAL with `err` filled. */
int allot__authn_new(
    const allot__authn_opts *o, char *err, size_t errlen, allot__authn **ret);
void allot__authn_free(allot__authn *au);

/* Check a Register's identity proof. UNSPECIFIED (0) when it may proceed;
 * otherwise UNAUTHENTICATED (or RATE_LIMITED when the replay cache is
 * full), the reason counted in `m` (identity_missing, _invalid,
 * _mismatch, _replay) and a message in `err`. Thread-safe. */
Allot__V1__Error__Code allot__authn_check(allot__authn *au,
    const Allot__V1__Register *reg, allot__metrics *m, char *err,
    size_t errlen);

/* The service a SPIFFE ID names under the patterns (see opts), into
 * `buf`; 0, or -1 when no pattern matches. For tests. */
int allot__authn_map(
    const allot__authn *au, const char *id, char *buf, size_t len);

#endif
