/* SPDX-License-Identifier: MIT */
/* Callers from signed service tokens (token_identity.h). */
#include "token_identity.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static void
jwt_log(void *ctx, int level, const char *id, const char *msg)
{
	svc_log(ctx, level, id, "%s", msg);
}

int
svc_token_start(struct svc *s)
{
	allot_jwt_issuer iss = { s->o.jwt_issuer, s->o.jwks };
	allot_jwt_options o = { 0 };
	int rc;

	o.issuers = &iss;
	o.n_issuers = 1;
	o.audience = s->o.jwt_audience != NULL ? s->o.jwt_audience :
	                                         s->o.service;
	o.leeway_s = s->o.jwt_leeway_s;
	o.log = jwt_log;
	o.log_ctx = s;
	rc = allot_jwt_verifier_create(&o, &s->jwt);
	if (rc != ALLOT_OK)
		return rc;
	svc_log(s, 6, "SVC-TOKENS",
	    "callers may present a token of %s for audience %s "
	    "(Authorization: Bearer); keys from %s",
	    s->o.jwt_issuer, o.audience, s->o.jwks);
	return ALLOT_OK;
}

allot_jwt_status
svc_token_identity(struct svc *s, const char *authz, char *id)
{
	allot_jwt_claims claims;
	allot_jwt_status st;
	const char *tok;

	/* RFC 6750 §2.1: the scheme is case-insensitive, then a space. */
	if (strncasecmp(authz, "Bearer ", 7) != 0) {
		atomic_fetch_add_explicit(
		    &s->not_bearer, 1, memory_order_relaxed);
		return ALLOT_JWT_MALFORMED;
	}
	tok = authz + 7;
	while (*tok == ' ')
		tok++;
	st = allot_jwt_verify(
	    s->jwt, tok, strlen(tok), (int64_t) time(NULL), &claims);
	if (st != ALLOT_JWT_OK) {
		svc_log(s, 7, "SVC-BAD-TOKEN", "token refused: %s",
		    allot_jwt_status_name(st));
		return st;
	}
	memcpy(id, claims.identity, sizeof claims.identity);
	return ALLOT_JWT_OK;
}
