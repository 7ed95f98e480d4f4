/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target "config": the YAML quota loader. The input is the file's
 * text, handed to allot_config_parse() in a buffer of exactly its length
 * (no terminating NUL, so a read past `len` is caught). A rejected file
 * must come back with no config and a message naming the file; an
 * accepted one must hold the limits common/config.h promises (rates,
 * bursts and weights in range, burst at least the largest weight, every
 * priority a known class, bounded names), copy to the same digest, and
 * make an agent whose configured callers resolve to their own quotas.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "agent_int.h"
#include "config.h"
#include "fuzz.h"

#define NAME "fuzz.yaml"

static void
check_quota(const allot_config *cfg, const allot__quota *q)
{
	FUZZ_CHECK(q->identity != NULL);
	FUZZ_CHECK(strlen(q->identity) <= ALLOT_IDENTITY_MAX);
	FUZZ_CHECK(isfinite(q->rate) && q->rate >= ALLOT__RATE_MIN &&
	    q->rate <= ALLOT__RATE_MAX);
	FUZZ_CHECK(isfinite(q->burst) && q->burst > 0 &&
	    q->burst <= ALLOT__BURST_MAX);
	/* An endpoint quota is charged only on its endpoint. */
	FUZZ_CHECK(q->burst >= (q->endpoint != NULL ?
	                               allot__config_weight(cfg, q->endpoint) :
	                               cfg->max_weight));
	FUZZ_CHECK(q->priority < cfg->nclasses);
	FUZZ_CHECK(q->fallback == ALLOT_FALLBACK_STATIC_SHARE ||
	    q->fallback == ALLOT_FALLBACK_OPEN ||
	    q->fallback == ALLOT_FALLBACK_CLOSED);
}

static void
check_config(const allot_config *cfg)
{
	FUZZ_CHECK(cfg->source != NULL && strcmp(cfg->source, NAME) == 0);
	FUZZ_CHECK(cfg->ncallers <= ALLOT__MAX_CALLERS);
	FUZZ_CHECK(cfg->ncallers == 0 || cfg->callers != NULL);
	FUZZ_CHECK(cfg->nendpoints <= ALLOT__MAX_ENDPOINTS);
	FUZZ_CHECK(cfg->nclasses >= 1 && cfg->nclasses <= ALLOT__MAX_CLASSES);
	for (size_t i = 0; i < cfg->nclasses; i++)
		FUZZ_CHECK(cfg->classes[i] != NULL &&
		    strlen(cfg->classes[i]) <= ALLOT__CLASS_MAX);
	FUZZ_CHECK(cfg->default_weight >= 1 &&
	    cfg->default_weight <= ALLOT__WEIGHT_MAX);
	uint32_t maxw = cfg->default_weight;
	for (size_t i = 0; i < cfg->nendpoints; i++) {
		const allot__endpoint *e = &cfg->endpoints[i];
		FUZZ_CHECK(
		    e->name != NULL && strlen(e->name) <= ALLOT__ENDPOINT_MAX);
		FUZZ_CHECK(e->weight >= 1 && e->weight <= ALLOT__WEIGHT_MAX);
		FUZZ_CHECK(allot__config_weight(cfg, e->name) == e->weight);
		if (e->weight > maxw)
			maxw = e->weight;
	}
	FUZZ_CHECK(cfg->max_weight == maxw);
	FUZZ_CHECK(isfinite(cfg->ceiling_rate) && cfg->ceiling_rate >= 0);
	check_quota(cfg, &cfg->def);
	for (size_t i = 0; i < cfg->ncallers; i++) {
		check_quota(cfg, &cfg->callers[i]);
		/* Identities are unique: the first match is this one. */
		FUZZ_CHECK(cfg->callers[i].endpoint != NULL ||
		    allot__config_find(cfg, cfg->callers[i].identity) ==
		        &cfg->callers[i]);
	}
}

/* An agent from the config: each configured caller charges its quota. */
static void
check_agent(const allot_config *cfg)
{
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.max_unknown_keys = 2;
	allot_agent *a;
	int rc = allot_agent_create(cfg, &o, &a);
	FUZZ_CHECK(rc == ALLOT_OK);
	for (size_t i = 0; i < cfg->ncallers; i++) {
		allot_key *k;
		const char *id = cfg->callers[i].identity;
		const char *ep = cfg->nendpoints > 0 ?
		    cfg->endpoints[i % cfg->nendpoints].name :
		    NULL;
		rc = allot_key_resolve(a, id, ep, &k);
		if (rc != ALLOT_OK) {
			/* Only an identity the resolver cannot take. */
			FUZZ_CHECK(id[0] == '\0');
			continue;
		}
		allot_key_stats st;
		FUZZ_CHECK(allot_key_stats_get(a, k, &st) == ALLOT_OK);
		FUZZ_CHECK(st.known);
		/* Its endpoint quota for that endpoint if it has one, else
		 * its caller-wide quota (or the default if it has none). */
		const char *want = "default";
		char kbuf[ALLOT_IDENTITY_MAX + ALLOT__ENDPOINT_MAX + 2];
		for (size_t j = 0; j < cfg->ncallers; j++) {
			const allot__quota *q = &cfg->callers[j];
			if (strcmp(q->identity, id) != 0)
				continue;
			if (q->endpoint == NULL &&
			    strcmp(want, "default") == 0)
				want = id;
			if (q->endpoint != NULL && ep != NULL &&
			    strcmp(q->endpoint, ep) == 0) {
				allot__quota_key(q, kbuf, sizeof kbuf);
				want = kbuf;
				break;
			}
		}
		FUZZ_CHECK(strcmp(st.quota, want) == 0);
		allot_decision d;
		rc = allot_acquire(a, k, ALLOT_COST_DEFAULT, &d);
		FUZZ_CHECK(rc == ALLOT_OK);
		allot_key_release(a, k);
	}
	allot_agent_destroy(a);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* Exactly `size` bytes: no terminator to lean on. */
	char *text = malloc(size > 0 ? size : 1);
	FUZZ_CHECK(text != NULL);
	if (size > 0)
		memcpy(text, data, size);
	char err[256];
	memset(err, 'x', sizeof err);
	allot_config *cfg = (allot_config *) (uintptr_t) 1;
	int rc = allot_config_parse(NAME, text, size, err, sizeof err, &cfg);
	free(text);
	FUZZ_CHECK(memchr(err, '\0', sizeof err) != NULL);
	if (rc != ALLOT_OK) {
		FUZZ_CHECK(rc == ALLOT_ECONFIG || rc == ALLOT_ENOMEM);
		FUZZ_CHECK(cfg == (allot_config *) (uintptr_t) 1);
		FUZZ_CHECK(rc != ALLOT_ECONFIG ||
		    strncmp(err, NAME ":", strlen(NAME ":")) == 0);
		return 0;
	}
	FUZZ_CHECK(cfg != NULL);
	check_config(cfg);
	allot_config *dup = allot__config_dup(cfg);
	FUZZ_CHECK(dup != NULL);
	FUZZ_CHECK(dup->digest == cfg->digest);
	check_config(dup);
	allot_config_free(dup);
	check_agent(cfg);
	allot_config_free(cfg);
	return 0;
}
