/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target "agent_reply": one message as an agent receives it from a
 * coordinator. An agent is created in-process with the fuzz config on an
 * injected clock and no coordinator (so no sync thread runs); its sync
 * engine (agent/sync_int.h) is driven by hand. The input is given to
 * allot__syncc_reply() twice: first as the answer to a Register (where a
 * Welcome opens a session; a second Sync then follows and the same bytes
 * answer it as well), then, on a fresh engine that a real Welcome has
 * connected and that has reported consumption, as the answer to Sync
 * seq 1. After each reply the agent does what it does next in production:
 * admits requests on the allowances installed, builds its next Sync,
 * checks the lease (entering fallback when it ran out), schedules the
 * next exchange and publishes its stats. The target checks that every
 * bucket keeps a rate and burst within the config limits (0 to
 * ALLOT__RATE_MAX and ALLOT__BURST_MAX), that the next exchange is
 * scheduled within bounds and that the next request still encodes.
 */
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "allot.pb-c.h"
#include "fuzz.h"
#include "sync_int.h"

#define MS 1000000ull

static allot_config *base_cfg;
static uint8_t *welcome_buf; /* a real Welcome for session 7 */
static size_t welcome_len;
static _Atomic uint64_t vnow;

static uint64_t
vclock(void *ctx)
{
	(void) ctx;
	return atomic_load(&vnow);
}

static void
log_sink(void *ctx, int level, const char *id, const char *msg)
{
	(void) ctx;
	(void) level;
	FUZZ_CHECK(id != NULL && msg != NULL);
	volatile size_t n = strlen(id) + strlen(msg);
	(void) n;
}

static void
init_once(void)
{
	if (base_cfg != NULL)
		return;
	char err[256];
	static const char text[] = FUZZ_CONFIG_YAML;
	if (allot_config_parse("fuzz.yaml", text, sizeof text - 1, err,
	        sizeof err, &base_cfg) != ALLOT_OK) {
		fprintf(stderr, "fuzz_agent_reply: config: %s\n", err);
		abort();
	}
	Allot__V1__Share sh[FUZZ_NKEYS];
	Allot__V1__Share *ptrs[FUZZ_NKEYS];
	for (uint32_t k = 0; k < FUZZ_NKEYS; k++) {
		allot__v1__share__init(&sh[k]);
		sh[k].key = k;
		sh[k].rate = 50.0 * (k + 1);
		sh[k].burst = 100.0 * (k + 1);
		ptrs[k] = &sh[k];
	}
	Allot__V1__Welcome w = ALLOT__V1__WELCOME__INIT;
	w.session = 7;
	w.replicas = 2;
	w.config_epoch = 1;
	w.config_digest = base_cfg->digest;
	w.lease_ms = 3000;
	w.n_shares = FUZZ_NKEYS;
	w.shares = ptrs;
	Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
	env.version = 1;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_WELCOME;
	env.welcome = &w;
	welcome_len = allot__v1__envelope__get_packed_size(&env);
	welcome_buf = malloc(welcome_len);
	FUZZ_CHECK(welcome_buf != NULL);
	allot__v1__envelope__pack(&env, welcome_buf);
}

static allot_agent *
mkagent(void)
{
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.clock = vclock;
	o.max_unknown_keys = 4;
	o.idle_evict_ms = 0;
	o.service = FUZZ_SERVICE;
	o.replica_id = "fuzz-agent";
	o.log = log_sink;
	o.log_level = ALLOT_LOG_DEBUG;
	allot_agent *a;
	FUZZ_CHECK(allot_agent_create(base_cfg, &o, &a) == ALLOT_OK);
	/* What the sync thread would have: the address named in logs. */
	a->coordinator = strdup("inproc://fuzz");
	FUZZ_CHECK(a->coordinator != NULL);
	return a;
}

/* The next request must encode and decode as what the engine expects. */
static void
next_request(allot__syncc *c)
{
	void *buf = NULL;
	size_t len = 0;
	FUZZ_CHECK(allot__syncc_request(c, atomic_load(&vnow), &buf, &len) ==
	    ALLOT_OK);
	Allot__V1__Envelope *env = allot__v1__envelope__unpack(NULL, len, buf);
	FUZZ_CHECK(env != NULL);
	FUZZ_CHECK(env->body_case ==
	    (c->session == 0 ? ALLOT__V1__ENVELOPE__BODY_REGISTER :
	                       ALLOT__V1__ENVELOPE__BODY_SYNC));
	allot__v1__envelope__free_unpacked(env, NULL);
	free(buf);
}

/* Admit a little on every quota: consumption for the next report. */
static void
traffic(allot_agent *a)
{
	static const char *ids[] = { "spiffe://t/a", "spiffe://t/b",
		"spiffe://t/c", "spiffe://t/unknown", NULL };
	for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
		allot_decision d;
		int rc = allot_acquire_id(
		    a, ids[i], "/export", ALLOT_COST_DEFAULT, &d);
		FUZZ_CHECK(rc == ALLOT_OK || rc == ALLOT_ETOOBIG);
		rc = allot_acquire_id(a, ids[i], "/lookup", 1, &d);
		FUZZ_CHECK(rc == ALLOT_OK || rc == ALLOT_ETOOBIG);
	}
}

/* Every bucket holds an allowance some quota file could give, whatever
 * the coordinator said (NaN fails both comparisons). */
static void
check_buckets(allot_agent *a)
{
	for (uint32_t i = 0; i < a->nquotas; i++) {
		allot__allowance al;
		allot__bucket_get(&a->quotas[i].bucket, &al);
		FUZZ_CHECK(al.rate >= 0 && al.rate <= ALLOT__RATE_MAX);
		FUZZ_CHECK(al.burst >= 0 && al.burst <= ALLOT__BURST_MAX);
	}
}

static void
after_reply(allot__syncc *c, bool ok)
{
	allot_agent *a = c->a;
	uint64_t now = atomic_load(&vnow);
	check_buckets(a);
	/* 0 only for "register again at once"; never past the backoff cap
	 * or, after a success, the jittered interval. */
	uint64_t d = allot__syncc_next_delay_ms(c, now, ok);
	FUZZ_CHECK(d >= 1 || (ok && c->session == 0));
	FUZZ_CHECK(d <=
	    (ok ? a->opts.sync_interval_ms * 2u : a->opts.reconnect_max_ms));
	traffic(a);
	atomic_store(&vnow, now + 100 * MS);
	next_request(c);
	allot_sync_stats ss;
	allot__syncc_stats(c, atomic_load(&vnow), &ss);
	/* Past any lease: fallback, then admit on it. */
	atomic_store(&vnow, atomic_load(&vnow) + 3600000 * MS);
	allot__syncc_check_lease(c, atomic_load(&vnow));
	check_buckets(a);
	traffic(a);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	init_once();
	atomic_store(&vnow, 1000 * MS);
	allot_agent *a = mkagent();
	allot__syncc c;

	/* 1: the answer to a Register. */
	FUZZ_CHECK(allot__syncc_init(&c, a, 1) == ALLOT_OK);
	next_request(&c);
	atomic_store(&vnow, atomic_load(&vnow) + 2 * MS);
	bool ok = allot__syncc_reply(&c, atomic_load(&vnow), data, size);
	if (ok && c.session != 0) {
		/* A Welcome: the same bytes then answer the first Sync. */
		traffic(a);
		atomic_store(&vnow, atomic_load(&vnow) + 100 * MS);
		next_request(&c);
		ok = allot__syncc_reply(&c, atomic_load(&vnow), data, size);
	}
	after_reply(&c, ok);
	allot__syncc_fini(&c);

	/* 2: the answer to Sync seq 1 of a connected session. */
	atomic_store(&vnow, 5000000 * MS);
	FUZZ_CHECK(allot__syncc_init(&c, a, 2) == ALLOT_OK);
	next_request(&c);
	FUZZ_CHECK(allot__syncc_reply(
	    &c, atomic_load(&vnow), welcome_buf, welcome_len));
	FUZZ_CHECK(c.session == 7);
	/* Odd lengths: as the session of a cluster that has seen leader
	 * epoch 3, so that a Reply of a lower epoch is dropped unapplied. */
	if (size % 2 == 1)
		c.epoch_seen = 3;
	traffic(a);
	atomic_store(&vnow, atomic_load(&vnow) + 100 * MS);
	next_request(&c);
	FUZZ_CHECK(c.seq == 1);
	atomic_store(&vnow, atomic_load(&vnow) + 2 * MS);
	ok = allot__syncc_reply(&c, atomic_load(&vnow), data, size);
	after_reply(&c, ok);
	/* And once more after the lease ran out: leaving fallback. */
	(void) allot__syncc_reply(&c, atomic_load(&vnow), data, size);
	check_buckets(a);
	void *buf = NULL;
	size_t len = 0;
	if (allot__syncc_leave(&c, &buf, &len) == ALLOT_OK)
		free(buf);
	allot__syncc_check_lease(&c, atomic_load(&vnow) + 10000 * MS);
	allot__syncc_fini(&c);
	allot_agent_destroy(a);
	return 0;
}
