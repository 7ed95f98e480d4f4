/* SPDX-License-Identifier: MIT */
/*
 * Part of suite `coordinator`: bytes per key on both sides, measured with
 * glibc's allocator statistics (mallinfo2: bytes in use in the main arena
 * plus mmapped blocks) before and after, everything on the calling
 * thread, before the suite starts any other thread.
 *
 *   agent: liballot's unknown-identity pool is allocated at create
 *   (max_unknown_keys slots: key, name, index) and each thread that
 *   decides adds 40 bytes per key to its counter block. The marginal cost
 *   of one pool slot with one deciding thread is the difference between
 *   two agents (pools of 1,000 and 101,000) fed as many distinct
 *   identities as they hold, over 100,000. The bound: an agent with a
 *   100,000-slot pool is then fed 1,000,000 distinct identities, and its
 *   heap must not grow past what it held when the pool filled.
 *
 *   coordinator: keys are interned per session at Register (the agent's
 *   configured quotas, not the identities it sees). 10,000 replicas over
 *   100 services register through allot__state_register() with 8 and
 *   then 64 configured callers (+ default); the difference gives the
 *   bytes per key, the rest the bytes per replica.
 */
#include "memory.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent_int.h"
#include "bench.h"
#include "state/state.h"

static size_t
heap_bytes(void)
{
	struct mallinfo2 mi = mallinfo2();
	return mi.uordblks + mi.hblkhd;
}

/* ---- agent ---- */

static const char agent_cfg[] = "quotas:\n"
                                "  default:\n"
                                "    tokens_per_second: 1000000\n"
                                "    burst: 1000000\n"
                                "  callers:\n"
                                "    - identity: \"spiffe://bench/known\"\n"
                                "      tokens_per_second: 100\n"
                                "      burst: 100\n";
/* The same with a bucket per value (agent/values.h). */
static const char agent_cfg_values[] = "quotas:\n"
                                       "  default:\n"
                                       "    tokens_per_second: 1000000\n"
                                       "    burst: 1000000\n"
                                       "    shared: false\n";

/* Feed `n` distinct identities (numbered from `from`) to `a`. */
static void
feed(allot_agent *a, uint32_t from, uint32_t n)
{
	char id[64];
	for (uint32_t i = 0; i < n; i++) {
		snprintf(
		    id, sizeof id, "spiffe://flood/caller-%08u", from + i);
		allot_decision d;
		if (allot_acquire_id(a, id, NULL, 1, &d) != ALLOT_OK)
			bench_fail("acquire for %s failed", id);
		bench_sink += d.allowed;
	}
}

static allot_agent *
agent_new(uint32_t cap, const char *text)
{
	allot_config *cfg;
	char err[256];
	if (allot_config_parse("bench", text, strlen(text), err, sizeof err,
	        &cfg) != ALLOT_OK)
		bench_fail("config: %s", err);
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.max_unknown_keys = cap;
	o.idle_evict_ms = 0; /* nothing is evicted: the pool only fills */
	allot_agent *a;
	if (allot_agent_create(cfg, &o, &a) != ALLOT_OK)
		bench_fail("cannot create an agent with a pool of %u", cap);
	allot_config_free(cfg);
	return a;
}

/* Heap held by an agent with a pool of `cap` after `cap` identities. */
static double
agent_full(uint32_t cap, const char *text)
{
	size_t m0 = heap_bytes();
	allot_agent *a = agent_new(cap, text);
	feed(a, 0, cap);
	if (a->dyn_used != cap)
		bench_fail("pool of %u holds %u identities", cap, a->dyn_used);
	double held = (double) heap_bytes() - (double) m0;
	allot_agent_destroy(a);
	return held;
}

/* ---- coordinator ---- */

#define C_REPLICAS 10000u
#define C_SERVICES 100u

static unsigned char welcome_arena[1u << 20];
static size_t welcome_used;

static void *
w_alloc(void *ctx, size_t n)
{
	(void) ctx;
	n = (n + 15) & ~(size_t) 15;
	if (welcome_used + n > sizeof welcome_arena)
		bench_fail("welcome arena too small");
	void *p = welcome_arena + welcome_used;
	welcome_used += n;
	return p;
}

static void
w_free(void *ctx, void *p)
{
	(void) ctx;
	(void) p;
}

/* A clock that stands still: no session expires while 10,000 register. */
static uint64_t
still(void *ctx)
{
	(void) ctx;
	return 1000000000ull;
}

/* Heap added to the registry by C_REPLICAS sessions of `ncallers` + 1
 * keys (every configured caller and default). */
static double
coord_sessions(uint32_t ncallers)
{
	bench_buf b = { 0 };
	bench_buf_printf(&b,
	    "quotas:\n  default:\n    tokens_per_second: 1000\n"
	    "    burst: 2000\n  callers:\n");
	char **names = calloc(ncallers + 1, sizeof *names);
	if (names == NULL)
		bench_fail("out of memory");
	for (uint32_t k = 0; k < ncallers; k++) {
		char n[64];
		snprintf(n, sizeof n, "spiffe://bench/caller-%03u", k);
		names[k] = strdup(n);
		bench_buf_printf(&b,
		    "    - identity: \"%s\"\n      tokens_per_second: 100\n"
		    "      burst: 200\n",
		    n);
	}
	names[ncallers] = strdup("default");
	allot_config *cfg;
	char err[256];
	if (allot_config_parse("bench", b.p, b.len, err, sizeof err, &cfg) !=
	    ALLOT_OK)
		bench_fail("config: %s", err);
	allot__state_opts o;
	allot__state_opts_init(&o);
	o.max_replicas = C_REPLICAS;
	o.clock = still;
	allot__state *st;
	if (allot__state_create(&o, cfg, "bench", b.p, &st) != ALLOT_OK)
		bench_fail("cannot create the registry");
	size_t m0 = heap_bytes();
	ProtobufCAllocator pa = { w_alloc, w_free, NULL };
	for (uint32_t r = 0; r < C_REPLICAS; r++) {
		char id[32], svc[32];
		snprintf(id, sizeof id, "replica-%05u", r);
		snprintf(svc, sizeof svc, "svc-%03u", r % C_SERVICES);
		Allot__V1__Register rq = ALLOT__V1__REGISTER__INIT;
		rq.replica_id = id;
		rq.service = svc;
		rq.host = "bench-host";
		rq.agent_version = "bench";
		rq.n_keys = ncallers + 1;
		rq.keys = names;
		rq.sync_interval_ms = 100;
		Allot__V1__Welcome w = ALLOT__V1__WELCOME__INIT;
		welcome_used = 0;
		if (allot__state_register(st, &rq, &pa, &w, err, sizeof err) !=
		    0)
			bench_fail("register %s: %s", id, err);
	}
	allot__state_tick(st); /* shares computed for every service */
	if (allot__state_replicas(st) != C_REPLICAS)
		bench_fail("%zu replicas live, want %u",
		    allot__state_replicas(st), C_REPLICAS);
	double held = (double) heap_bytes() - (double) m0;
	allot__state_destroy(st);
	for (uint32_t k = 0; k <= ncallers; k++)
		free(names[k]);
	free(names);
	bench_buf_free(&b);
	return held;
}

void
bench_memory(const bench_opts *o, bench_memory_figures *ret)
{
	bench_progress(o, "memory: agent pools of 1,000 and 101,000");
	double small = agent_full(1000, agent_cfg),
	       large = agent_full(101000, agent_cfg);
	ret->agent_bytes_per_identity = (large - small) / 100000.0;
	bench_progress(o, "memory: the same with a bucket per value");
	small = agent_full(1000, agent_cfg_values);
	large = agent_full(101000, agent_cfg_values);
	ret->agent_bytes_per_value = (large - small) / 100000.0;

	bench_progress(o, "memory: 1,000,000 identities into 100,000 slots");
	size_t m0 = heap_bytes();
	allot_agent *a = agent_new(100000, agent_cfg);
	feed(a, 0, 100000);
	size_t full = heap_bytes();
	feed(a, 100000, 900000);
	size_t after = heap_bytes();
	if (a->dyn_used > a->dyn_cap)
		bench_fail("pool holds %u of %u", a->dyn_used, a->dyn_cap);
	ret->agent_pool_bytes = (double) full - (double) m0;
	ret->agent_growth_bytes = (double) after - (double) full;
	ret->agent_overflowed = (double) atomic_load(&a->overflowed);
	if (ret->agent_overflowed < 900000)
		bench_fail(
		    "only %.0f of 900,000 decisions on the overflow key",
		    ret->agent_overflowed);
	allot_agent_destroy(a);

	bench_progress(o, "memory: 10,000 replicas x 9 and x 65 keys");
	double k9 = coord_sessions(8), k65 = coord_sessions(64);
	ret->coord_bytes_per_key = (k65 - k9) / ((double) C_REPLICAS * 56.0);
	ret->coord_bytes_per_replica = k9 / C_REPLICAS -
	    9.0 * ret->coord_bytes_per_key;
}
