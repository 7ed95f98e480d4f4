/* SPDX-License-Identifier: MIT */
/*
 * The example service's second way to know a caller: a signed service
 * token in "Authorization: Bearer ...", verified by liballot-jwt
 * (allot/jwt.h) against the issuer's JWKS file. Every request's token is
 * checked: a key withdrawn from the file stops its tokens at once, on
 * open connections too.
 */
#ifndef ALLOT_EXAMPLE_TOKEN_IDENTITY_H
#define ALLOT_EXAMPLE_TOKEN_IDENTITY_H

#include <allot/jwt.h>

#include "service.h"

/* Makes s->jwt from --jwt-issuer, --jwks and --jwt-audience.
 * @return ALLOT_OK, or why the key file did not load (logged). */
int svc_token_start(struct svc *s);

/* The identity of the request's Authorization header `authz` into `id`
 * (ALLOT_IDENTITY_MAX + 1 bytes): ALLOT_JWT_OK, or why not (the
 * request is then answered 401). */
allot_jwt_status svc_token_identity(
    struct svc *s, const char *authz, char *id);

#endif
