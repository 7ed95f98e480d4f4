/* SPDX-License-Identifier: MIT */
/*
 * What the requests accept before they touch the state: the names of a
 * Register (common/name.h: one rule with the config loader), a session
 * built from one outside the lock, the connection a session is bound to,
 * and the free text of a Leave made safe for a store row.
 */
#include "registry_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "name.h"

/* One rule for every name (common/name.h): the config loader applies
 * the same one to identities, so an accepted config never makes a
 * Register fail here. */
static bool
name_ok(const char *s, size_t max, bool required)
{
	return allot__name_valid(s, max, required);
}

/* Whether the names of a Register are acceptable; if not, the Error code
 * with a message in `err`. */
Allot__V1__Error__Code
allot__register_check(const Allot__V1__Register *req, char *err, size_t errlen)
{
	if (!name_ok(req->replica_id, ALLOT__STATE_NAME_MAX, true) ||
	    !name_ok(req->service, ALLOT__STATE_NAME_MAX, true) ||
	    !name_ok(req->host, ALLOT__STATE_NAME_MAX, false) ||
	    !name_ok(req->agent_version, ALLOT__STATE_VERSION_MAX, false)) {
		snprintf(err, errlen,
		    "replica_id and service must be 1-%u " ALLOT__NAME_RULE
		    " (host too, agent_version at most %u)",
		    ALLOT__STATE_NAME_MAX, ALLOT__STATE_VERSION_MAX);
		return ALLOT__V1__ERROR__CODE__MALFORMED;
	}
	for (size_t k = 0; k < req->n_keys; k++) {
		if (!name_ok(req->keys[k], ALLOT__STATE_NAME_MAX, true)) {
			snprintf(err, errlen,
			    "key %zu: a key must be 1-%u " ALLOT__NAME_RULE, k,
			    ALLOT__STATE_NAME_MAX);
			return ALLOT__V1__ERROR__CODE__MALFORMED;
		}
	}
	return ALLOT__V1__ERROR__CODE__UNSPECIFIED;
}

/* A session for `req` with its strings copied, built before locking. Its
 * keys are not: allot__session_keep() copies, under the lock, those that
 * name a quota of the config in force, so that a Register of 65,537 keys
 * without a quota allocates nothing for them. */
session *
allot__session_new(const Allot__V1__Register *req)
{
	session *s = calloc(1, sizeof *s);
	if (s == NULL)
		return NULL;
	s->nwire = (uint32_t) req->n_keys;
	s->replica_id = strdup(req->replica_id);
	s->host = strdup(req->host != NULL ? req->host : "");
	s->agent_version = strdup(
	    req->agent_version != NULL ? req->agent_version : "");
	s->pid = req->pid;
	s->digest = req->config_digest;
	if (s->replica_id == NULL || s->host == NULL ||
	    s->agent_version == NULL) {
		allot__session_free(s);
		return NULL;
	}
	return s;
}

/* The session's key table rebuilt with the known ones of `wire[0..n)`
 * (q[k] >= 0) appended after the keys it has, their wire ids from
 * `base`: one blob for the names, so rebuilt rather than grown. `dense`:
 * every wire id maps to the key of the same index (no kid table). */
static bool
keys_rebuild(session *s, char *const *wire, uint32_t n, uint32_t base,
    const int32_t *q, uint32_t nknown, bool dense, bool force_share)
{
	uint32_t total = s->nkeys + nknown;
	size_t blob = 0;
	for (uint32_t k = 0; k < s->nkeys; k++)
		blob += strlen(s->names[k]) + 1;
	for (uint32_t k = 0; k < n; k++)
		if (q[k] >= 0)
			blob += strlen(wire[k]) + 1;
	skey *keys = calloc(total ? total : 1, sizeof *keys);
	char **names = calloc(total ? total : 1, sizeof *names);
	char *nb = malloc(blob ? blob : 1);
	uint32_t *kid = dense ? NULL : calloc(total ? total : 1, sizeof *kid);
	if (keys == NULL || names == NULL || nb == NULL ||
	    (!dense && kid == NULL)) {
		free(keys);
		free(names);
		free(nb);
		free(kid);
		return false;
	}
	if (s->nkeys > 0)
		memcpy(keys, s->keys, s->nkeys * sizeof *keys);
	char *p = nb;
	for (uint32_t k = 0; k < s->nkeys; k++) {
		size_t len = strlen(s->names[k]);
		memcpy(p, s->names[k], len + 1);
		names[k] = p;
		p += len + 1;
		if (kid != NULL)
			kid[k] = s->kid != NULL ? s->kid[k] : k;
	}
	uint32_t j = s->nkeys;
	for (uint32_t k = 0; k < n; k++) {
		if (q[k] < 0)
			continue;
		size_t len = strlen(wire[k]);
		memcpy(p, wire[k], len + 1);
		names[j] = p;
		p += len + 1;
		if (kid != NULL)
			kid[j] = base + k;
		keys[j] = (skey) {
			.q = q[k],
			.grant_rate = NAN,
			.grant_burst = NAN,
			.hold_rate = NAN,
			.hold_burst = NAN,
			.own_rate = NAN,
			.own_burst = NAN,
			.own_hold_rate = NAN,
			.own_hold_burst = NAN,
			.force_share = force_share,
			.tail = s->waits,
		};
		j++;
	}
	free(s->keys);
	free(s->kid);
	free(s->names);
	free(s->names_blob);
	s->keys = keys;
	s->kid = kid;
	s->names = names;
	s->names_blob = nb;
	s->nkeys = total;
	return true;
}

bool
allot__session_keep(
    session *s, char *const *wire, const int32_t *q, uint32_t nknown)
{
	if (!keys_rebuild(
	        s, wire, s->nwire, 0, q, nknown, nknown == s->nwire, false))
		return false;
	s->nknown = nknown;
	return true;
}

Allot__V1__Error__Code
allot__add_keys_check(const Allot__V1__Sync *req, uint32_t nwire,
    uint32_t max_keys, char *err, size_t errlen)
{
	if (req->n_add_keys > max_keys ||
	    (uint64_t) nwire + req->n_add_keys > max_keys) {
		snprintf(err, errlen,
		    "add_keys: %zu keys more than the %u of session %" PRIu64
		    " is above the limit of %u keys",
		    req->n_add_keys, nwire, req->session, max_keys);
		return ALLOT__V1__ERROR__CODE__TOO_LARGE;
	}
	for (size_t k = 0; k < req->n_add_keys; k++) {
		if (!name_ok(req->add_keys[k], ALLOT__STATE_NAME_MAX, true)) {
			snprintf(err, errlen,
			    "add_keys %zu: a key must be "
			    "1-%u " ALLOT__NAME_RULE,
			    k, ALLOT__STATE_NAME_MAX);
			return ALLOT__V1__ERROR__CODE__MALFORMED;
		}
	}
	return ALLOT__V1__ERROR__CODE__UNSPECIFIED;
}

/* A config an agent installed added callers (Sync.add_keys). */
bool
allot__session_append(session *s, char *const *wire, uint32_t n,
    const int32_t *q, uint32_t nknown)
{
	bool dense = s->kid == NULL && s->nkeys == s->nwire && nknown == n;
	if (!keys_rebuild(s, wire, n, s->nwire, q, nknown, dense, true))
		return false;
	s->nknown += nknown;
	s->nwire += n;
	return true;
}

/* A session registered over one connection is driven over that one
 * only: a Sync or Leave for it arriving on another connection (another
 * peer guessing the sequential id, or the same agent after a reconnect)
 * is answered UNKNOWN_SESSION, which makes a genuine agent register
 * again, and counted apart. Pipe 0 (the simulator, tests) binds nothing. */
bool
allot__pipe_ok(const session *s, uint32_t pipe)
{
	return s->pipe == 0 || s->pipe == pipe;
}

Allot__V1__Error__Code
allot__pipe_mismatch(allot__metrics *m, uint64_t id, char *err, size_t errlen)
{
	snprintf(err, errlen,
	    "session %" PRIu64 " belongs to another connection: register "
	    "again",
	    id);
	allot__metrics_reject(m, ALLOT__REJ_SESSION_PIPE, 1);
	return ALLOT__V1__ERROR__CODE__UNKNOWN_SESSION;
}

/* Agent-supplied free text for a store row: printable, bounded. */
void
allot__sanitize(char *dst, size_t cap, const char *src)
{
	size_t j = 0;
	for (size_t i = 0; src != NULL && src[i] != '\0' && j + 1 < cap; i++) {
		unsigned char c = (unsigned char) src[i];
		dst[j++] = c >= 0x20 && c < 0x7f ? (char) c : '?';
	}
	dst[j] = '\0';
}
