/* SPDX-License-Identifier: MIT */
/*
 * The quota configuration model shared by the agent and the coordinator,
 * and its YAML loader (config.c, libyaml). The public opaque type
 * `allot_config` (allot/allot.h) is this struct. A loaded config is
 * immutable: both sides share it read-only across threads.
 */
#ifndef ALLOT_COMMON_CONFIG_H
#define ALLOT_COMMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <allot/allot.h>

/* Limits enforced by the loader; docs/configuration.md lists them. */
#define ALLOT__RATE_MIN 1e-6 /* tokens/s: below 1 token per day */
#define ALLOT__RATE_MAX 1e9 /* tokens/s */
#define ALLOT__BURST_MAX 1e9 /* tokens */
#define ALLOT__WEIGHT_MAX 1000000u
#define ALLOT__MAX_CALLERS 65536
#define ALLOT__MAX_ENDPOINTS 256
#define ALLOT__ENDPOINT_MAX ALLOT_ENDPOINT_MAX /* bytes */
#define ALLOT__MAX_CLASSES 8
#define ALLOT__CLASS_MAX 31 /* bytes */
#define ALLOT__MAX_SERVICES 1024
#define ALLOT__MAX_LABELS 32
#define ALLOT__LABEL_MAX 255 /* bytes of "name=value" */
#define ALLOT__OWNER_MAX 255 /* bytes */
#define ALLOT__REASON_MAX 1024 /* bytes */

/* Who a quota admits (`access`, docs/configuration.md, "Plans"). */
typedef enum allot__access {
	ALLOT__ACCESS_LIMITED = 0, /* its rate and burst: the default */
	ALLOT__ACCESS_CLOSED = 1, /* nobody: 403, not 429 */
	ALLOT__ACCESS_UNLIMITED = 2, /* everybody, counted, never limited */
} allot__access;

/* One quota: a configured caller, or the shared default bucket. */
typedef struct allot__quota {
	char *identity; /* SPIFFE ID; "default" for the default quota */
	/* NULL: every request of `identity`. Else an endpoint quota: only
	 * its requests to this endpoint, which then do not also charge its
	 * caller-wide quota. Its wire key is "IDENTITY ENDPOINT" (one
	 * space), allot__quota_key(). */
	char *endpoint;
	/* Limited: its rate and burst. Closed or unlimited: no rate or
	 * burst (both 0), no candidate, no central reserve; each agent
	 * decides alone and allotd allocates nothing for it. */
	allot__access access;
	double rate; /* tokens_per_second, > 0 (0 when not limited) */
	double burst; /* burst, >= the largest endpoint weight (ditto) */
	uint32_t priority; /* index into allot_config.classes */
	bool shadow; /* evaluate and count, never deny */
	/* The most of its burst the coordinator may keep in the quota's
	 * central reserve for the tail path (docs/allocation.md), in
	 * [0, 1]: 1 (the default) as much as its replicas' traffic leaves,
	 * 0 none (decided locally only). */
	double reserve;
	bool shared; /* the default bucket: one bucket for all */
	/* An endpoint quota charged on top of its caller's own quota (both
	 * or neither) instead of in its place. */
	bool stacked;
	allot_fallback fallback;
	uint32_t line; /* where it was defined, for messages */
	uint32_t unit_s; /* the rate was written per 1, 60, 3600 or 86400 s */
	/* A candidate value evaluated in shadow beside this one, never
	 * enforced; 0: none. */
	double cand_rate; /* tokens/s */
	double cand_burst;
	/* Review metadata: kept, shown and audited, never enforced. NULL
	 * or 0 when absent. */
	char *owner;
	char *reason;
	double expected_peak; /* tokens/s (written per unit_s) */
	char **labels; /* "name=value" */
	size_t nlabels;
} allot__quota;

typedef struct allot__endpoint {
	char *name; /* e.g. "/export" */
	uint32_t weight; /* tokens per request, >= 1 */
} allot__endpoint;

/* A service's section of the file (services.NAME): what it overrides of
 * the top-level quotas. allot__config_select() merges it into a view. */
typedef struct allot__service {
	char *name; /* the service name of a Register */
	uint32_t line; /* where it was defined, for messages */
	allot__quota *def; /* its own default quota; NULL: quotas.default */
	/* Its callers and endpoint quotas: each replaces the top-level
	 * quota of the same wire key, or adds one. */
	allot__quota *callers;
	size_t ncallers;
	/* Its endpoint weights: each replaces the top-level weight of the
	 * same endpoint, or adds one. */
	allot__endpoint *endpoints;
	size_t nendpoints;
	uint32_t default_weight; /* 0: quotas.endpoint_weights.default */
	double ceiling_rate; /* 0: quotas.global_ceiling */
	bool overcommit; /* with its own ceiling only */
} allot__service;

struct allot_config {
	char *source; /* file name used in messages */
	allot__quota def; /* quotas.default */
	allot__quota *callers; /* quotas.callers, in file order */
	size_t ncallers;
	allot__endpoint *endpoints; /* endpoint_weights except `default` */
	size_t nendpoints;
	uint32_t default_weight; /* endpoint_weights.default (1 if absent) */
	uint32_t max_weight; /* max over all weights */
	double ceiling_rate; /* global_ceiling.tokens_per_second; 0 = none */
	/* global_ceiling.overcommit: a single quota may exceed the ceiling
	 * (the sum of all of them always may). */
	bool overcommit;
	/* Priority classes in shed order: classes[0] is shed first. Defaults
	 * to low, batch, standard, critical when shed_order is absent. */
	char *classes[ALLOT__MAX_CLASSES];
	size_t nclasses;
	/* services.NAME, in file order; none in a view made by
	 * allot__config_select(). */
	allot__service *services;
	size_t nservices;
	uint64_t digest; /* 64-bit digest of the canonical content */
};

/* Whether a caller's identity is a pattern, "PREFIX*": the group of
 * every identity that starts with PREFIX (a tenant), "*" every caller of
 * the service. Its quota (and each of its endpoint quotas) is charged
 * by every request of the group (to that endpoint) on top of the
 * request's own quota. Patterns never nest but in "*". */
bool allot__identity_is_pattern(const char *identity);

/* Whether quota `q` is a stacked level: charged on top of a request's
 * own quota (an endpoint quota with `stacked`, or a pattern's), never
 * instead of it (docs/configuration.md, "Stacked limits"). */
bool allot__quota_is_level(const allot__quota *q);

/* The caller-wide quota for an identity (not one of its endpoint
 * quotas), or NULL if it is not a configured caller. Linear scan: for
 * set-up paths only (agents build their own index). */
const allot__quota *allot__config_find(
    const allot_config *cfg, const char *identity);

/* The weight of an endpoint (default_weight if not listed). */
uint32_t allot__config_weight(const allot_config *cfg, const char *endpoint);

/* The wire key name of a quota into buf: its identity, or "IDENTITY
 * ENDPOINT" for an endpoint quota. Returns the length it needs (as
 * snprintf). */
size_t allot__quota_key(const allot__quota *q, char *buf, size_t size);

/* Deep copy of a quota's owned strings into `d` (a struct copy of `q`);
 * ALLOT_OK or ALLOT_ENOMEM, with `d` then freeable either way. */
int allot__quota_copy(allot__quota *d, const allot__quota *q);
void allot__quota_free(allot__quota *q);

/* The service section `name` of cfg, or NULL. */
const allot__service *allot__config_service(
    const allot_config *cfg, const char *name);

/* Deep copy; NULL on allocation failure. */
allot_config *allot__config_dup(const allot_config *cfg);

/* The quotas that apply to `service` (NULL, or a service the file does
 * not name: the top level only), as a config of its own that the caller
 * frees: what an agent of that service enforces and what allotd
 * allocates for it. The view is the top-level quotas with the service's
 * section merged in: its default replaces quotas.default, each of its
 * callers (and endpoint quotas) replaces the top-level quota of the same
 * wire key in place or is appended, its weights replace or add weights,
 * its ceiling replaces the top-level one. The view has no services. Its
 * `digest` stays the digest of the whole file, which is what agents and
 * allotd compare. ALLOT_OK or ALLOT_ENOMEM. */
int allot__config_select(
    const allot_config *cfg, const char *service, allot_config **ret);

#endif
