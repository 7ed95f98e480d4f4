/* SPDX-License-Identifier: MIT */
/*
 * The agent's life: its options, the capacity it reserves at create
 * (identities, endpoint classes, unknown-identity keys, quotas) and
 * everything allocated then, the first config installed, the sync loop
 * started; and destroy. Nothing here runs per request (agent.c).
 */
#include "agent_int.h"
#include "values.h"
#include "config_cache.h"
#include "sync_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NAME_SZ (ALLOT_IDENTITY_MAX + 1)
#define NONE UINT32_MAX

/* ---- options ---- */

void
allot_agent_options_init(allot_agent_options *o)
{
	if (o == NULL)
		return;
	memset(o, 0, sizeof *o);
	o->max_unknown_keys = 4096;
	o->idle_evict_ms = 300000;
	o->max_threads = 64;
	o->log_level = ALLOT_LOG_INFO;
	o->sync_interval_ms = 100;
	o->sync_jitter = 0.1;
	o->initial_replicas = 1;
	o->reconnect_min_ms = 100;
	o->reconnect_max_ms = 5000;
}

static char *
dup_or_null(const char *s)
{
	return s == NULL ? NULL : strdup(s);
}

/* Zeroed, 64-byte aligned room for `n` keys (one more: never empty). */
static allot_key *
keys_alloc(size_t n)
{
	return allot__zalloc(sizeof(allot_key) * (n + 1));
}

/* ---- create / destroy ---- */

void
allot__key_init(allot_agent *a, allot_key *k, allot__qrt *q, uint32_t cls,
    const char *identity, uint32_t id)
{
	atomic_init(&k->bucket, &q->bucket);
	atomic_init(&k->quota, q);
	k->id = id;
	k->cls = cls;
	atomic_init(&k->weight,
	    atomic_load_explicit(&a->class_weight[cls], memory_order_relaxed));
	double b = floor(q->static_burst);
	atomic_init(
	    &k->max_cost, b >= 4294967295.0 ? UINT32_MAX : (uint32_t) b);
	atomic_init(&k->known, false);
	atomic_init(&k->nup, 0);
	k->identity = identity;
	atomic_init(&k->pins, 0);
	atomic_init(&k->gen, 0);
	allot__kc(a, k)->slot = NONE;
	allot__kc(a, k)->next_free = NONE;
}

/* Own copies of the option strings; the options then point at them. */
static int
options_copy(allot_agent *a, const allot_agent_options *o)
{
	a->coordinator = dup_or_null(o->coordinator);
	a->service = dup_or_null(o->service != NULL ? o->service : "default");
	if (o->replica_id != NULL) {
		a->replica_id = strdup(o->replica_id);
	} else {
		char host[256] = "localhost";
		gethostname(host, sizeof host - 1);
		char buf[300];
		snprintf(buf, sizeof buf, "%s-%ld", host, (long) getpid());
		a->replica_id = strdup(buf);
	}
	if (a->service == NULL || a->replica_id == NULL ||
	    (o->coordinator != NULL && a->coordinator == NULL))
		return ALLOT_ENOMEM;
	a->tls_ca = dup_or_null(o->tls_ca_file);
	a->tls_cert = dup_or_null(o->tls_cert_key_file);
	a->tls_name = dup_or_null(o->tls_server_name);
	if ((o->tls_ca_file != NULL && a->tls_ca == NULL) ||
	    (o->tls_cert_key_file != NULL && a->tls_cert == NULL) ||
	    (o->tls_server_name != NULL && a->tls_name == NULL))
		return ALLOT_ENOMEM;
	a->opts.tls_ca_file = a->tls_ca;
	a->opts.tls_cert_key_file = a->tls_cert;
	a->opts.tls_server_name = a->tls_name;
	a->opts.coordinator = a->coordinator;
	a->opts.service = a->service;
	a->opts.replica_id = a->replica_id;
	return ALLOT_OK;
}

/* Every key, numbered across kinds: configured identities by endpoint
 * class (group_cap of them, reserved; reconfig.c initialises an
 * identity's keys when it first appears), then anonymous and overflow
 * keys, then the unknown-identity pool, which charge the default quota. */
static int
keys_init(allot_agent *a)
{
	allot__qrt *def = &a->quotas[a->default_quota];
	uint32_t id = a->group_cap * a->nclasses;
	for (uint32_t j = 0; j < a->nclasses; j++) {
		allot__key_init(a, &a->anon_keys[j], def, j, "", id++);
		allot__key_init(
		    a, &a->overflow_keys[j], def, j, "(overflow)", id++);
	}
	for (uint32_t i = 0; i < a->dyn_cap; i++) {
		allot_key *k = &a->dyn_keys[i];
		allot__key_init(
		    a, k, def, 0, &a->dyn_names[(size_t) i * NAME_SZ], id++);
		k->dynamic = true;
		allot__kc(a, k)->next_free = i + 1 < a->dyn_cap ? i + 1 : NONE;
	}
	a->dyn_free = a->dyn_cap > 0 ? 0 : NONE;
	/* Sized as an idmap of the pool, but an index of its own: lock-free
	 * reads of atomic key pointers, written under dyn_lock. */
	a->dyn_mask = allot__idmap_slots(a->dyn_cap) - 1;
	a->dyn_index = calloc((size_t) a->dyn_mask + 1, sizeof *a->dyn_index);
	return a->dyn_index == NULL ? ALLOT_ENOMEM : ALLOT_OK;
}

int
allot__syncc_init(allot__syncc *c, allot_agent *a, uint64_t seed)
{
	allot__installer in;
	allot__agent_installer(a, &in);
	return allot__syncc_create(c, a, seed, &in);
}

static bool
options_valid(const allot_agent_options *o)
{
	return o->sync_interval_ms != 0 && o->initial_replicas != 0 &&
	    o->max_threads != 0 && o->max_threads <= 65536 &&
	    o->sync_jitter >= 0 && o->sync_jitter < 1 &&
	    o->reconnect_min_ms != 0 &&
	    o->reconnect_max_ms >= o->reconnect_min_ms &&
	    o->max_callers <= ALLOT__MAX_CALLERS;
}

/* What to reserve for later configs (agent_int.h, "Memory" in
 * docs/configuration.md): callers and endpoint classes. */
static void
capacity(allot_agent *a, const allot_config *c)
{
	size_t n = c->ncallers;
	size_t cap = a->opts.max_callers;
	if (cap == 0)
		cap = n * 2 > n + 256 ? n * 2 : n + 256;
	if (cap > ALLOT__MAX_CALLERS)
		cap = ALLOT__MAX_CALLERS;
	if (cap < n)
		cap = n;
	a->group_cap = (uint32_t) cap;
	a->quota_cap = (uint32_t) cap + 1;
	/* Spare endpoint classes, fewer when the callers are many: the
	 * known keys reserved (every identity has one per class, and every
	 * thread block a counter line per key) stay within 4 times what
	 * the first config needs, or ALLOT__KEYS_RESERVED. */
	size_t first = c->nendpoints + 1;
	size_t cls = first + ALLOT__SPARE_CLASSES;
	size_t budget = 4 * (n > 0 ? n : 1) * first;
	if (budget < ALLOT__KEYS_RESERVED)
		budget = ALLOT__KEYS_RESERVED;
	while (cls > first + 1 && cap * cls > budget)
		cls--;
	a->nclasses = (uint32_t) (cls > ALLOT__MAX_ENDPOINTS + 1 ?
	        ALLOT__MAX_ENDPOINTS + 1 :
	        cls);
}

/* The caller index's size: at most two thirds full. Its slots are 8
 * bytes, 8 to a line, so a probe past the home slot mostly stays in the
 * line it read, and the smaller table stays in the core's cache between
 * lookups of the same part of it (128 KB for 10,000 callers). */
static uint32_t
caller_slots(uint32_t n)
{
	uint32_t cap = 8;
	while (cap < (uint64_t) n * 3 / 2 + 1)
		cap <<= 1;
	return cap;
}

static int
alloc_all(allot_agent *a)
{
	size_t nknown = (size_t) a->group_cap * a->nclasses;
	size_t nkeys = nknown + 2 * (size_t) a->nclasses + a->dyn_cap;
	/* Then each quota's counters as a stacked level (agent_int.h), the
	 * ceiling's level's last (ceiling.c). */
	if (nkeys + a->quota_cap + 1 >= UINT32_MAX)
		return ALLOT_EINVAL;
	a->level_base = (uint32_t) nkeys;
	a->nkeys = (uint32_t) (nkeys + a->quota_cap + 1);
	a->ceil_q = a->quota_cap;
	a->stacks = allot__zalloc(sizeof *a->stacks * (nkeys + 1));
	a->quotas = allot__zalloc(sizeof(allot__qrt) * (a->quota_cap + 1));
	a->class_names = calloc(a->nclasses, sizeof *a->class_names);
	a->class_weight = calloc(a->nclasses, sizeof *a->class_weight);
	a->ep_names = calloc(a->nclasses, ALLOT__EP_NAME_SZ);
	a->ep_len = calloc(a->nclasses, sizeof *a->ep_len);
	a->ep_mask = allot__idmap_slots(a->nclasses) - 1;
	a->ep_tab = calloc((size_t) a->ep_mask + 1, sizeof *a->ep_tab);
	a->caller_mask = caller_slots(a->group_cap) - 1;
	a->caller_tab = allot__zalloc(
	    sizeof *a->caller_tab * ((size_t) a->caller_mask + 1));
	a->caller_names = allot__zalloc(
	    sizeof *a->caller_names * ((size_t) a->group_cap + 1));
	a->known_keys = keys_alloc(nknown);
	a->kcold = allot__zalloc(sizeof *a->kcold * (nkeys + 1));
	a->qbase = allot__zalloc(sizeof *a->qbase * (nknown + 1));
	a->anon_keys = keys_alloc(a->nclasses);
	a->overflow_keys = keys_alloc(a->nclasses);
	a->dyn_keys = keys_alloc(a->dyn_cap);
	a->dyn_names = calloc((size_t) a->dyn_cap + 1, NAME_SZ);
	if (a->quotas == NULL || a->class_names == NULL ||
	    a->class_weight == NULL || a->ep_names == NULL ||
	    a->ep_len == NULL || a->ep_tab == NULL || a->caller_tab == NULL ||
	    a->caller_names == NULL || a->known_keys == NULL ||
	    a->kcold == NULL || a->qbase == NULL || a->anon_keys == NULL ||
	    a->overflow_keys == NULL || a->dyn_keys == NULL ||
	    a->dyn_names == NULL || a->stacks == NULL)
		return ALLOT_ENOMEM;
	allot__ceiling_init(a);
	return ALLOT_OK;
}

/* Programs built before allot_agent_create_sized(): the options of
 * this release. When allot_agent_options grows, this keeps passing the
 * size it had here (docs/compatibility.md). */
int(allot_agent_create)(const allot_config *cfg,
    const allot_agent_options *opts, allot_agent **ret_agent)
{
	return allot_agent_create_sized(
	    cfg, opts, sizeof(allot_agent_options), ret_agent);
}

int
allot_agent_create_sized(const allot_config *cfg,
    const allot_agent_options *opts, size_t opts_size, allot_agent **ret_agent)
{
	if (cfg == NULL || ret_agent == NULL)
		return ALLOT_EINVAL;
	/* The fields the caller knows; the others at their defaults. */
	allot_agent_options o;
	allot_agent_options_init(&o);
	if (opts != NULL)
		memcpy(&o, opts, opts_size < sizeof o ? opts_size : sizeof o);
	if (!options_valid(&o))
		return ALLOT_EINVAL;

	int rc = ALLOT_ENOMEM;
	allot_agent *a = calloc(1, sizeof *a);
	if (a == NULL)
		return ALLOT_ENOMEM;
	pthread_mutex_init(&a->dyn_lock, NULL);
	pthread_mutex_init(&a->set_lock, NULL);
	pthread_mutex_init(&a->settle_lock, NULL);
	pthread_mutex_init(&a->cfg_lock, NULL);
	a->opts = o;
	atomic_store_explicit(&a->waits, o.waits, memory_order_relaxed);
	a->log.fn = o.log;
	a->log.ctx = o.log_ctx;
	a->log.level = o.log_level;
	a->clock_fn = o.clock;
	a->clock_ctx = o.clock_ctx;
	a->tsc = allot__tsc_get();
	a->seed = allot__hash_seed();
	a->max_blocks = o.max_threads;
	a->idle_evict_ns = (uint64_t) o.idle_evict_ms * 1000000u;
	a->dyn_free = NONE;
	a->dyn_cap = o.max_unknown_keys;

	/* The config plane: the last config the coordinator sent, when it
	 * was cached and still loads (config_cache.c); else `cfg`. */
	allot_config *c = NULL;
	allot__config_cache_load(&o, cfg, &a->log, &c);
	if (c == NULL)
		c = allot__config_dup(cfg);
	if (c == NULL || options_copy(a, &o) != ALLOT_OK)
		goto fail;
	capacity(a, c);
	if ((rc = alloc_all(a)) != ALLOT_OK ||
	    (rc = allot__blocks_init(a)) != ALLOT_OK)
		goto fail;
	/* The default quota takes the id after the first config's callers,
	 * as before reconfiguration existed, and keeps it. */
	a->default_quota = (uint32_t) c->ncallers;
	if ((rc = allot__reconfig_prepare(a, c)) != ALLOT_OK ||
	    (rc = keys_init(a)) != ALLOT_OK ||
	    (rc = allot__reconfig(a, c, true)) != ALLOT_OK)
		goto fail;
	c = NULL; /* the agent's now */

	allot__installer in;
	allot__agent_installer(a, &in);
	if (a->coordinator != NULL &&
	    (rc = allot__sync_start(a, &in)) != ALLOT_OK)
		goto fail;
	allot__log(&a->log, ALLOT_LOG_INFO, "ALLOT-AGENT-START",
	    "agent %s for service %s: %zu callers (room for %u), %u endpoint "
	    "classes (room for %u), clock %s, counters for up to %u threads, "
	    "coordinator %s",
	    a->replica_id, a->service, a->cfg->ncallers, a->group_cap,
	    atomic_load(&a->nep) + 1, a->nclasses,
	    a->clock_fn != NULL ? "injected" :
	        a->tsc->usable  ? "tsc" :
	                          "CLOCK_MONOTONIC",
	    a->max_blocks,
	    a->coordinator != NULL ? a->coordinator : "none (local-only)");
	*ret_agent = a;
	return ALLOT_OK;
fail:
	allot_config_free(c);
	allot_agent_destroy(a);
	return rc;
}

void
allot_agent_destroy(allot_agent *a)
{
	if (a == NULL)
		return;
	if (a->sync != NULL)
		allot__sync_stop(a);
	free(a->dyn_index);
	if (a->blocks != NULL || a->shared_block != NULL)
		allot__blocks_fini(a);
	free(a->dyn_names);
	allot__zfree(a->dyn_keys);
	allot__zfree(a->overflow_keys);
	allot__zfree(a->anon_keys);
	allot__zfree(a->known_keys);
	allot__zfree(a->kcold);
	allot__zfree(a->stacks);
	allot__patterns_free(a->pats);
	allot__zfree(a->qbase);
	allot__reconfig_fini(a);
	allot__values_fini(a);
	free(a->ep_tab);
	free(a->ep_len);
	free(a->ep_names);
	allot__zfree(a->caller_tab);
	allot__zfree(a->caller_names);
	free(a->class_names);
	free(a->class_weight);
	allot__zfree(a->quotas);
	free(a->coordinator);
	free(a->tls_ca);
	free(a->tls_cert);
	free(a->tls_name);
	free(a->service);
	free(a->replica_id);
	allot_config_free(a->cfg);
	pthread_mutex_destroy(&a->dyn_lock);
	pthread_mutex_destroy(&a->set_lock);
	pthread_mutex_destroy(&a->settle_lock);
	pthread_mutex_destroy(&a->cfg_lock);
	free(a);
}
