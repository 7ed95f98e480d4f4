/* SPDX-License-Identifier: MIT */
/*
 * Private to the quota file loader: what its stages share. The loader
 * runs in four steps, driven by allot_config_parse() (config.c): read
 * the YAML into a tree of nodes (config_yaml.c), walk the tree against
 * the schema of docs/configuration.md filling an allot_config
 * (config_schema.c), check what spans sections (config_check.c), then
 * take the digest (config_digest.c). config_value.c holds what they all
 * use: the messages, each naming the offending node as
 * "FILE:LINE:COL: what, expected what", and the typed scalar readers.
 */
#ifndef ALLOT_COMMON_CONFIG_PARSE_H
#define ALLOT_COMMON_CONFIG_PARSE_H

#include <locale.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "config.h"

/* Bytes of a user string quoted back in a message. */
#define QUOTE_MAX 128

/* ---- The document tree ---- */

enum ntype { NODE_SCALAR, NODE_MAP, NODE_SEQ };

typedef struct allot__cfg_node {
	enum ntype type;
	uint32_t line, col; /* 1-based start of the node */
	bool plain; /* unquoted scalar: YAML resolves its type */
	char *str; /* scalars: the value, NUL-terminated */
	size_t len;
	struct allot__cfg_node **kids; /* maps: key, value, key, value, ... */
	size_t nkids, cap;
} allot__cfg_node;

/* ---- Parse state ---- */

/* Side data for one quota, kept only while loading: the nodes that later
 * checks point their messages at. */
typedef struct allot__cfg_meta {
	/* The quota's mapping: its fields' values are found there by key
	 * (allot__cfg_value()). */
	const allot__cfg_node *map;
	const allot__cfg_node *ident;
	const allot__cfg_node *endpoint; /* endpoint quotas: the key */
	const allot__cfg_node *eps; /* callers: their `endpoints` */
	size_t parent; /* endpoint quotas: index of their caller */
	char *key; /* the wire key (allot__quota_key), owned */
} allot__cfg_meta;

/* One scope of the file: the top-level quotas, or a service's section.
 * `meta` is parallel to the scope's callers array. */
typedef struct allot__cfg_scope {
	const char *service; /* NULL: the top level */
	const allot__cfg_node *name; /* services: the key naming it */
	allot__cfg_meta def; /* its default (services: if it has one) */
	allot__cfg_meta *meta;
	size_t cap; /* of meta and the callers array */
	const allot__quota **byid; /* callers sorted by wire key */
	const allot__cfg_node *ceiling; /* its ceiling's rate value */
} allot__cfg_scope;

typedef struct allot__cfg_ctx {
	const char *name;
	char *errbuf;
	size_t errlen;
	locale_t cloc; /* "C" numeric locale for strtod_l */
	allot_config *cfg;
	allot__cfg_scope top;
	allot__cfg_scope *svc; /* per cfg->services entry */
	size_t nsvc; /* allocated */
	const allot__service **svc_sorted; /* cfg->services by name */
	/* quotas.plans (config_plans.c), and the mappings made of a plan
	 * and a quota's own keys, owned: freed after the checks. */
	const allot__cfg_node *plans;
	allot__cfg_node **merged;
	size_t nmerged, merged_cap;
} allot__cfg_ctx;

/* The value of key `key` in mapping `map`, and the value of its rate
 * key (whichever unit); NULL when it has none (or map is NULL). For
 * the checks after the walk, which point their messages at values the
 * walk accepted. config_schema.c. */
const allot__cfg_node *allot__cfg_value(
    const allot__cfg_node *map, const char *key);
/* Whether key node `k` is `name`; whether it is a rate key (one of the
 * units). config_schema.c. */
bool allot__cfg_key_is(const allot__cfg_node *k, const char *name);
bool allot__cfg_is_rate_key(const allot__cfg_node *k);
const allot__cfg_node *allot__cfg_rate_value(const allot__cfg_node *map);
/* The `access` of quota mapping `map` when it says closed or unlimited
 * (no rate, burst or candidate then), else NULL. */
const char *allot__cfg_fixed_access(const allot__cfg_node *map);
/* Whether key `k` is one a quota with a fixed access may not have: a
 * rate (any unit), burst or candidate. */
bool allot__cfg_is_amount_key(const allot__cfg_node *k);

/* Free what a scope owns (not the quotas). */
void allot__cfg_scope_free(allot__cfg_scope *s);

/* ---- The stages (see the top of this file) ---- */

/* The tree of `text`, or NULL for an empty document; anchors, aliases,
 * tags and second documents are refused. config_yaml.c. */
int allot__cfg_read_tree(
    allot__cfg_ctx *c, const char *text, size_t len, allot__cfg_node **ret);
void allot__cfg_node_free(allot__cfg_node *n);

/* Plans (config_plans.c): read quotas.plans (a mapping of names to
 * mappings, none of them naming a quota) before any section; the
 * mapping a quota with `plan: NAME` is read as (the plan's keys and its
 * own, its own winning; itself when it has no plan); free those. */
int allot__cfg_plans_read(allot__cfg_ctx *c, const allot__cfg_node *quotas);
int allot__cfg_plan_apply(allot__cfg_ctx *c, const allot__cfg_node *map,
    const char *path, const allot__cfg_node **ret);
void allot__cfg_plans_free(allot__cfg_ctx *c);

/* Check every key and value of the tree and fill c->cfg and the
 * allot__cfg_meta of each quota. config_schema.c. */
int allot__cfg_parse_root(allot__cfg_ctx *c, const allot__cfg_node *root);

/* Checks across sections, after the walk: priority classes, duplicate
 * wire keys (sorting each scope's byid), and in the view of every
 * service: bursts against endpoint weights, endpoint quotas against
 * endpoint_weights, quotas against the ceiling. config_check.c. */
int allot__cfg_check_all(allot__cfg_ctx *c);

/* The digest of a loaded config; each scope's byid is its callers
 * sorted by wire key. config_digest.c. */
uint64_t allot__cfg_digest(const allot__cfg_ctx *c);

/* ---- Messages (config_value.c) ---- */

void allot__cfg_report_at(allot__cfg_ctx *c, uint32_t line, uint32_t col,
    const char *fmt, ...) __attribute__((format(printf, 4, 5)));
void allot__cfg_report(allot__cfg_ctx *c, const allot__cfg_node *n,
    const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Report a bad file at line:col or at node `n`, and evaluate to
 * ALLOT_ECONFIG. Macros, so that the constant is visible at each call
 * site (to readers and to static analysers). */
#define FAIL_AT(...) (allot__cfg_report_at(__VA_ARGS__), ALLOT_ECONFIG)
#define FAIL(...) (allot__cfg_report(__VA_ARGS__), ALLOT_ECONFIG)

/* "NAME: out of memory"; evaluates to ALLOT_ENOMEM. */
int allot__cfg_nomem(allot__cfg_ctx *c);

const char *allot__cfg_quote(
    char *buf, size_t size, const char *s, size_t len);
const char *allot__cfg_numtext(
    char *buf, size_t size, const char *s, size_t len);

/* Buffers for a quoted string, and for allot__cfg_describe(). */
#define QBUF (QUOTE_MAX + 8)
#define DBUF (QBUF + 32)
#define Q(buf, s) allot__cfg_quote((buf), sizeof(buf), (s), strlen(s))
#define QN(buf, n) allot__cfg_quote((buf), sizeof(buf), (n)->str, (n)->len)
#define NUM(buf, n) allot__cfg_numtext((buf), sizeof(buf), (n)->str, (n)->len)

/* words[0..n) as "a, b, c" in buf. */
void allot__cfg_join(
    char *buf, size_t size, const char *const *words, size_t n);

/* ---- Scalars (config_value.c) ---- */

bool allot__cfg_is_null(const allot__cfg_node *n);
const char *allot__cfg_describe(
    const allot__cfg_node *n, char *buf, size_t size);
int allot__cfg_get_rate(allot__cfg_ctx *c, const allot__cfg_node *n,
    const char *what, double *ret);
/* A rate written per `unit_s` seconds, into tokens/s. */
int allot__cfg_get_rate_per(allot__cfg_ctx *c, const allot__cfg_node *n,
    const char *what, uint32_t unit_s, double *ret);
/* A number >= 0. */
/* A number from 0 to 1. */
int allot__cfg_get_fraction(allot__cfg_ctx *c, const allot__cfg_node *n,
    const char *what, double *ret);
int allot__cfg_get_amount(allot__cfg_ctx *c, const allot__cfg_node *n,
    const char *what, double *ret);
int allot__cfg_get_burst(allot__cfg_ctx *c, const allot__cfg_node *n,
    const char *what, double *ret);
int allot__cfg_get_weight(allot__cfg_ctx *c, const allot__cfg_node *n,
    const char *what, uint32_t *ret);
int allot__cfg_get_bool(
    allot__cfg_ctx *c, const allot__cfg_node *n, const char *what, bool *ret);
int allot__cfg_get_string(allot__cfg_ctx *c, const allot__cfg_node *n,
    const char *what, size_t max, const char *expect, const char **ret);

#endif
