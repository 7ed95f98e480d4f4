/* SPDX-License-Identifier: MIT */
/*
 * Envoy's Rate Limit Service request, decided by liballot: a
 * RateLimitRequest is decoded (protobuf-c, from a message already bounded
 * by --max-message), checked against the limits of the mapping (domain,
 * descriptors, entries), and every descriptor becomes one acquire on the
 * key (caller identity, endpoint class) that its entries name. The
 * response carries a status per descriptor (OK or OVER_LIMIT, the limit
 * in force, what remains, the time until reset) and the headers Envoy
 * adds for the client: RateLimit-Policy and RateLimit of the binding
 * descriptor, and Retry-After when the request is over the limit.
 * The mapping itself is parsed from the options here (agentd_map_init).
 * agentd_decide() is the one decision both APIs make. Nothing here keeps
 * state between calls: the fuzz target drives agentd_rls() directly.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "agentd.h"
#include "rls.pb-c.h"

typedef Envoy__Service__Ratelimit__V3__RateLimitRequest request;
typedef Envoy__Service__Ratelimit__V3__RateLimitResponse response;
typedef Envoy__Service__Ratelimit__V3__RateLimitResponse__DescriptorStatus
    status;
typedef Envoy__Service__Ratelimit__V3__RateLimitResponse__RateLimit limit;
typedef Envoy__Extensions__Common__Ratelimit__V3__RateLimitDescriptor
    descriptor;
typedef Envoy__Config__Core__V3__HeaderValue header;

#define CODE_OK ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__CODE__OK
#define CODE_OVER \
	ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__CODE__OVER_LIMIT
#define UNIT(u) \
	ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__RATE_LIMIT__UNIT__##u

/* gRPC status codes (grpc/status.h). */
#define GRPC_INVALID_ARGUMENT 3
#define GRPC_RESOURCE_EXHAUSTED 8
#define GRPC_INTERNAL 13

/* The policy's name: the endpoint class, or "default" when there is
 * none. allot_fmt_* write it as a structured-field string, escaped. */
static const char *
policy_name(const char *endpoint)
{
	return endpoint == NULL || endpoint[0] == '\0' ? "default" : endpoint;
}

/* The verdict's fields from its decision (ret->rc, ret->d). */
static void
verdict_fields(const char *endpoint, struct agentd_verdict *ret)
{
	if (!agentd_decided(ret->rc))
		return;
	const char *name = policy_name(endpoint);
	ret->name = name;
	if (ret->rc == ALLOT_EFORBIDDEN)
		return; /* closed: no policy, no retry */
	allot_fmt_ratelimit_policy(
	    &ret->d, name, ret->policy, sizeof ret->policy);
	allot_fmt_ratelimit(
	    &ret->d, name, ret->ratelimit, sizeof ret->ratelimit);
	/* A cost above the burst, or a closed quota, can never pass: no
	 * Retry-After. */
	if (!ret->d.allowed && ret->rc == ALLOT_OK)
		allot_fmt_retry_after(
		    &ret->d, ret->retry_after, sizeof ret->retry_after);
}

void
agentd_decide(allot_agent *agent, const char *identity, const char *endpoint,
    uint32_t cost, uint64_t wait_ns, struct agentd_verdict *ret)
{
	memset(ret, 0, sizeof *ret);
	ret->rc = allot_acquire_id_wait(
	    agent, identity, endpoint, cost, wait_ns, &ret->d);
	verdict_fields(endpoint, ret);
}

/* agentd_decide() under a descriptor's own limit `lim` (--descriptor-
 * limits cap): the limit first, on this sidecar; the quota only when it
 * admits, and what it took given back when the quota refuses. The
 * decision is the one that refused, else the one with less left. */
static void
decide_capped(allot_agent *agent, struct agentd_limits *l,
    const Envoy__Extensions__Common__Ratelimit__V3__RateLimitDescriptor__RateLimitOverride
        *lim,
    const char *id, const char *ep, uint32_t cost, uint64_t wait_ns,
    struct agentd_verdict *v)
{
	allot_decision cap;
	/* The limit counts hits: a cost of 0 (the endpoint's weight, which
	 * the quota charges) is one hit here. */
	uint32_t hits = cost > 0 ? cost : 1;
	if (!agentd_limits_take(
	        l, id, ep, lim->requests_per_unit, lim->unit, hits, &cap)) {
		memset(v, 0, sizeof *v);
		v->rc = ALLOT_OK;
		v->d = cap;
		verdict_fields(ep, v);
		return;
	}
	agentd_decide(agent, id, ep, cost, wait_ns, v);
	if (v->rc != ALLOT_OK || !v->d.allowed) {
		agentd_limits_give_back(
		    l, id, ep, lim->requests_per_unit, lim->unit, hits);
		return;
	}
	if (cap.remaining < v->d.remaining) {
		v->d = cap;
		verdict_fields(ep, v);
	}
}

static bool
key_listed(const char *key, const char *const *keys, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(key, keys[i]) == 0)
			return true;
	return false;
}

/* The value of the first entry whose key is one of `keys`, or NULL. */
static const char *
entry_value(const descriptor *ds, const char *const *keys, size_t n)
{
	for (size_t i = 0; i < ds->n_entries; i++)
		if (key_listed(ds->entries[i]->key, keys, n))
			return ds->entries[i]->value;
	return NULL;
}

/* One descriptor's decision; *ret_skip when it is not charged (an
 * unknown descriptor under --unknown allow). Returns a gRPC status. */
static int
decide_one(allot_agent *agent, const struct rls_map *m, const descriptor *ds,
    uint32_t hits, struct agentd_verdict *v, bool *ret_skip,
    allot_jwt_status *ret_token, char *msg, size_t msglen)
{
	char token_id[ALLOT_IDENTITY_MAX + 1];
	*ret_skip = false;
	*ret_token = ALLOT_JWT_OK;
	if (ds->n_entries > m->max_entries) {
		snprintf(msg, msglen,
		    "a descriptor has %zu entries (at most %" PRIu32 ")",
		    ds->n_entries, m->max_entries);
		return GRPC_INVALID_ARGUMENT;
	}
	const char *id = entry_value(ds, m->identity_keys, m->n_identity_keys);
	const char *ep = entry_value(ds, m->endpoint_keys, m->n_endpoint_keys);
	const char *token = m->jwt == NULL ?
	    NULL :
	    entry_value(ds, m->token_keys, m->n_token_keys);
	if (token != NULL) {
		/* A token names the caller, whatever the identity entries
		 * say; a bad one is refused and charges nobody. */
		*ret_token = agentd_token_identity(m, token, token_id);
		if (*ret_token != ALLOT_JWT_OK) {
			*ret_skip = true;
			return 0;
		}
		id = token_id;
	}
	if (id == NULL && m->unknown == UNKNOWN_ALLOW) {
		*ret_skip = true;
		return 0;
	}
	if (id == NULL && m->unknown == UNKNOWN_REJECT) {
		snprintf(msg, msglen, "a descriptor has no identity entry");
		return GRPC_INVALID_ARGUMENT;
	}
	if ((id != NULL && strlen(id) > ALLOT_IDENTITY_MAX) ||
	    (ep != NULL && strlen(ep) > ALLOT_ENDPOINT_MAX)) {
		snprintf(msg, msglen, "identity or endpoint too long");
		return GRPC_INVALID_ARGUMENT;
	}
	uint64_t cost = hits;
	if (ds->hits_addend != NULL && ds->hits_addend->value > 0)
		cost = ds->hits_addend->value;
	if (cost > UINT32_MAX) {
		snprintf(msg, msglen, "hits_addend above 2^32");
		return GRPC_INVALID_ARGUMENT;
	}
	if (m->limits != NULL && ds->limit != NULL) {
		if (!agentd_limits_valid(ds->limit->unit)) {
			snprintf(msg, msglen,
			    "a descriptor's limit has an unknown unit %d",
			    (int) ds->limit->unit);
			return GRPC_INVALID_ARGUMENT;
		}
		decide_capped(agent, m->limits, ds->limit, id, ep,
		    (uint32_t) cost, m->wait_ns, v);
	} else {
		agentd_decide(agent, id, ep, (uint32_t) cost, m->wait_ns, v);
	}
	if (!agentd_decided(v->rc)) {
		snprintf(msg, msglen, "%s", allot_strerror(v->rc));
		return v->rc == ALLOT_EINVAL ? GRPC_INVALID_ARGUMENT :
		                               GRPC_INTERNAL;
	}
	return 0;
}

/* The limit in force: per second when that is whole or large, else per
 * minute when that is whole or large, else per hour, so that a quota of
 * 0.5/s is not reported as 0/s and 3 a minute stays 3 a minute. */
static void
fill_limit(limit *l, const allot_decision *d, const char *name)
{
	envoy__service__ratelimit__v3__rate_limit_response__rate_limit__init(
	    l);
	l->name = (char *) name;
	double r = d->rate;
	if (r >= 10 || r <= 0 || (r >= 1 && fabs(r - round(r)) < 1e-9)) {
		l->unit = UNIT(SECOND);
		l->requests_per_unit = r > UINT32_MAX ? UINT32_MAX :
		                                        (uint32_t) llround(r);
	} else if (r * 60 >= 10 ||
	    (r * 60 >= 1 && fabs(r * 60 - round(r * 60)) < 1e-9)) {
		l->unit = UNIT(MINUTE);
		l->requests_per_unit = (uint32_t) llround(r * 60);
	} else {
		l->unit = UNIT(HOUR);
		l->requests_per_unit = (uint32_t) llround(r * 3600);
	}
}

struct slot {
	status st;
	limit lim;
	Google__Protobuf__Duration reset;
	struct agentd_verdict v;
	allot_jwt_status token; /* not OK: its token was refused */
};

static void
fill_status(struct slot *s, bool skip)
{
	envoy__service__ratelimit__v3__rate_limit_response__descriptor_status__init(
	    &s->st);
	if (skip) {
		/* Uncharged: OK for an unknown descriptor under --unknown
		 * allow, OVER_LIMIT for a token that does not verify. */
		s->st.code = s->token == ALLOT_JWT_OK ? CODE_OK : CODE_OVER;
		return;
	}
	const allot_decision *d = &s->v.d;
	s->st.code = d->allowed ? CODE_OK : CODE_OVER;
	/* An unlimited quota has no limit to name. */
	if (isinf(d->limit))
		return;
	fill_limit(&s->lim, d, s->v.name);
	s->st.current_limit = &s->lim;
	double rem = d->remaining > 0 ? floor(d->remaining) : 0;
	s->st.limit_remaining = rem > UINT32_MAX ? UINT32_MAX : (uint32_t) rem;
	google__protobuf__duration__init(&s->reset);
	uint64_t ns = d->allowed ? d->reset_ns : d->retry_after_ns;
	s->reset.seconds = (int64_t) (ns / 1000000000u);
	s->reset.nanos = (int32_t) (ns % 1000000000u);
	s->st.duration_until_reset = &s->reset;
}

/* The descriptor whose headers the client sees: the first over the
 * limit, else the one with the least left. -1 if none was charged. */
static int
binding(const struct slot *slots, const bool *skip, size_t n)
{
	int best = -1;
	for (size_t i = 0; i < n; i++) {
		if (skip[i])
			continue;
		if (!slots[i].v.d.allowed)
			return (int) i;
		if (best < 0 ||
		    slots[i].v.d.remaining < slots[best].v.d.remaining)
			best = (int) i;
	}
	return best;
}

static int
encode(
    response *r, uint8_t **ret_buf, size_t *ret_len, char *msg, size_t msglen)
{
	size_t n =
	    envoy__service__ratelimit__v3__rate_limit_response__get_packed_size(
	        r);
	uint8_t *buf = malloc(5 + n);
	if (buf == NULL) {
		snprintf(msg, msglen, "out of memory");
		return GRPC_RESOURCE_EXHAUSTED;
	}
	envoy__service__ratelimit__v3__rate_limit_response__pack(r, buf + 5);
	*ret_buf = buf;
	*ret_len = 5 + n;
	return 0;
}

/* Decide every descriptor of `req` and encode the response. */
static int
answer(allot_agent *agent, const struct rls_map *m, const request *req,
    uint8_t **ret_buf, size_t *ret_len, char *msg, size_t msglen)
{
	size_t n = req->n_descriptors;
	struct slot *slots = calloc(n > 0 ? n : 1, sizeof *slots);
	status **ptrs = calloc(n > 0 ? n : 1, sizeof *ptrs);
	bool *skip = calloc(n > 0 ? n : 1, sizeof *skip);
	int rc = 0;
	if (slots == NULL || ptrs == NULL || skip == NULL) {
		snprintf(msg, msglen, "out of memory");
		rc = GRPC_RESOURCE_EXHAUSTED;
		goto out;
	}
	response r = ENVOY__SERVICE__RATELIMIT__V3__RATE_LIMIT_RESPONSE__INIT;
	r.overall_code = CODE_OK;
	for (size_t i = 0; i < n && rc == 0; i++) {
		rc = decide_one(agent, m, req->descriptors[i],
		    req->hits_addend, &slots[i].v, &skip[i], &slots[i].token,
		    msg, msglen);
		if (rc != 0)
			break;
		fill_status(&slots[i], skip[i]);
		ptrs[i] = &slots[i].st;
		if (slots[i].st.code == CODE_OVER)
			r.overall_code = CODE_OVER;
	}
	if (rc != 0)
		goto out;
	r.n_statuses = n;
	r.statuses = ptrs;
	header h[5], *hp[5];
	int b = binding(slots, skip, n);
	if (b >= 0) {
		const struct agentd_verdict *v = &slots[b].v;
		/* A closed quota bound it: Envoy answers its
		 * rate_limited_status (429) for any OVER_LIMIT, so the
		 * client learns it from this field (docs/sidecar.md). */
		const char *keys[4] = { "RateLimit-Policy", "RateLimit",
			"Retry-After", "X-Allot-Access" };
		const char *vals[4] = { v->policy, v->ratelimit,
			v->retry_after,
			v->rc == ALLOT_EFORBIDDEN ? "closed" : "" };
		for (size_t i = 0; i < 4; i++) {
			if (vals[i][0] == '\0')
				continue;
			envoy__config__core__v3__header_value__init(
			    &h[r.n_response_headers_to_add]);
			h[r.n_response_headers_to_add].key = (char *) keys[i];
			h[r.n_response_headers_to_add].value = (char *)
			    vals[i];
			hp[r.n_response_headers_to_add] =
			    &h[r.n_response_headers_to_add];
			r.n_response_headers_to_add++;
		}
		r.response_headers_to_add = hp;
	}
	for (size_t i = 0; i < n; i++) {
		if (slots[i].token == ALLOT_JWT_OK)
			continue;
		/* RFC 6750 §3: the client learns its token was the matter
		 * (Envoy answers with its rate_limited_status, 429). */
		envoy__config__core__v3__header_value__init(
		    &h[r.n_response_headers_to_add]);
		h[r.n_response_headers_to_add].key =
		    (char *) "WWW-Authenticate";
		h[r.n_response_headers_to_add].value =
		    (char *) "Bearer error=\"invalid_token\"";
		hp[r.n_response_headers_to_add] =
		    &h[r.n_response_headers_to_add];
		r.n_response_headers_to_add++;
		r.response_headers_to_add = hp;
		break;
	}
	rc = encode(&r, ret_buf, ret_len, msg, msglen);
out:
	free(slots);
	free(ptrs);
	free(skip);
	return rc;
}

int
agentd_rls(allot_agent *agent, const struct rls_map *m, const uint8_t *req,
    size_t len, uint8_t **ret_buf, size_t *ret_len, char *msg, size_t msglen)
{
	request *rq =
	    envoy__service__ratelimit__v3__rate_limit_request__unpack(
	        NULL, len, req);
	if (rq == NULL) {
		snprintf(msg, msglen, "malformed RateLimitRequest");
		return GRPC_INVALID_ARGUMENT;
	}
	int rc;
	if (m->domain != NULL && strcmp(rq->domain, m->domain) != 0) {
		snprintf(msg, msglen, "unknown domain");
		rc = GRPC_INVALID_ARGUMENT;
	} else if (rq->n_descriptors == 0) {
		snprintf(msg, msglen, "no descriptors");
		rc = GRPC_INVALID_ARGUMENT;
	} else if (rq->n_descriptors > m->max_descriptors) {
		snprintf(msg, msglen, "%zu descriptors (at most %" PRIu32 ")",
		    rq->n_descriptors, m->max_descriptors);
		rc = GRPC_INVALID_ARGUMENT;
	} else {
		rc = answer(agent, m, rq, ret_buf, ret_len, msg, msglen);
	}
	envoy__service__ratelimit__v3__rate_limit_request__free_unpacked(
	    rq, NULL);
	return rc;
}

/* Split a comma-separated list in place (into a copy kept for life). */
static bool
split(const char *list, const char **out, size_t *ret_n)
{
	char *copy = strdup(list);
	size_t n = 0;
	if (copy == NULL)
		return false;
	for (char *save = NULL, *t = strtok_r(copy, ",", &save); t != NULL;
	     t = strtok_r(NULL, ",", &save)) {
		if (n == RLS_MAX_KEYS)
			return false;
		out[n++] = t;
	}
	*ret_n = n;
	return true;
}

bool
agentd_map_init(struct rls_map *m, const struct agentd_options *o, char *err,
    size_t errlen)
{
	memset(m, 0, sizeof *m);
	m->wait_ns = (uint64_t) o->wait_ms * 1000000u;
	if (!split(o->identity_keys, m->identity_keys, &m->n_identity_keys) ||
	    !split(o->endpoint_keys, m->endpoint_keys, &m->n_endpoint_keys) ||
	    (o->token_keys != NULL &&
	        !split(o->token_keys, m->token_keys, &m->n_token_keys))) {
		snprintf(err, errlen,
		    "at most %d identity, endpoint and token keys",
		    RLS_MAX_KEYS);
		return false;
	}
	if (o->descriptor_limits != NULL &&
	    strcmp(o->descriptor_limits, "cap") == 0) {
		if ((m->limits = agentd_limits_new(
		         o->max_descriptor_limits)) == NULL) {
			snprintf(err, errlen, "out of memory");
			return false;
		}
	} else if (o->descriptor_limits != NULL &&
	    strcmp(o->descriptor_limits, "ignore") != 0) {
		snprintf(err, errlen,
		    "--descriptor-limits wants ignore or cap, not '%s'",
		    o->descriptor_limits);
		return false;
	}
	if (strcmp(o->unknown, "default") == 0)
		m->unknown = UNKNOWN_DEFAULT;
	else if (strcmp(o->unknown, "allow") == 0)
		m->unknown = UNKNOWN_ALLOW;
	else if (strcmp(o->unknown, "reject") == 0)
		m->unknown = UNKNOWN_REJECT;
	else {
		snprintf(err, errlen,
		    "--unknown wants default, allow or "
		    "reject, not '%s'",
		    o->unknown);
		return false;
	}
	m->domain = o->domain;
	m->max_descriptors = o->max_descriptors;
	m->max_entries = o->max_entries;
	return true;
}

bool
agentd_map_tokens(struct rls_map *m, const struct agentd_options *o,
    allot_log_fn log, void *log_ctx, char *err, size_t errlen)
{
	if (o->jwt_issuer == NULL)
		return true;
	allot_jwt_issuer iss = { o->jwt_issuer, o->jwks };
	allot_jwt_options jo = { 0 };
	jo.issuers = &iss;
	jo.n_issuers = 1;
	jo.audience = o->jwt_audience != NULL ? o->jwt_audience :
	                                        o->agent.service;
	jo.leeway_s = o->jwt_leeway_s;
	jo.log = log;
	jo.log_ctx = log_ctx;
	int rc = allot_jwt_verifier_create(&jo, &m->jwt);
	if (rc != ALLOT_OK) {
		snprintf(err, errlen,
		    "--jwks %s: %s (the line above says why)", o->jwks,
		    allot_strerror(rc));
		return false;
	}
	return true;
}

void
agentd_map_fini(struct rls_map *m)
{
	allot_jwt_verifier_destroy(m->jwt);
	m->jwt = NULL;
	agentd_limits_free(m->limits);
	m->limits = NULL;
}

allot_jwt_status
agentd_token_identity(const struct rls_map *m, const char *value, char *id)
{
	allot_jwt_claims c;
	/* RFC 6750 §2.1: the scheme is case-insensitive. */
	if (strncasecmp(value, "Bearer ", 7) == 0)
		value += 7;
	while (*value == ' ')
		value++;
	allot_jwt_status st = allot_jwt_verify(
	    m->jwt, value, strlen(value), (int64_t) time(NULL), &c);
	if (st == ALLOT_JWT_OK)
		memcpy(id, c.identity, sizeof c.identity);
	return st;
}
