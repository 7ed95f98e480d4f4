/* SPDX-License-Identifier: MIT */
/* The key model's test helpers (keymodel.h). */
#include "keymodel.h"

#include <check.h>
#include <stdatomic.h>
#include <string.h>

#include "proc.h"

static _Atomic uint64_t vnow = 1000000000000ull;

uint64_t
km_clock(void *ctx)
{
	(void) ctx;
	return atomic_load(&vnow);
}

void
km_advance_ms(uint64_t ms)
{
	atomic_fetch_add(&vnow, ms * 1000000u);
}

allot_config *
km_parse(const char *y)
{
	char err[512];
	allot_config *cfg;
	int rc = allot_config_parse(
	    "keymodel.yaml", y, strlen(y), err, sizeof err, &cfg);
	ck_assert_msg(rc == ALLOT_OK, "config: %s\n%s", err, y);
	return cfg;
}

void
km_refused(const char *y, const char *want)
{
	char err[512];
	allot_config *cfg = NULL;
	int rc = allot_config_parse(
	    "keymodel.yaml", y, strlen(y), err, sizeof err, &cfg);
	ck_assert_msg(rc != ALLOT_OK, "accepted:\n%s", y);
	ck_assert_msg(strstr(err, want) != NULL, "message \"%s\" lacks \"%s\"",
	    err, want);
}

allot_agent *
km_local_agent(const char *y)
{
	allot_config *cfg = km_parse(y);
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.clock = km_clock;
	allot_agent *a;
	ck_assert_int_eq(allot_agent_create(cfg, &o, &a), ALLOT_OK);
	allot_config_free(cfg);
	return a;
}

allot_agent *
km_remote_agent(const pc_coord *c, const char *replica, const char *y)
{
	allot_config *cfg = km_parse(y);
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.coordinator = c->url;
	o.service = "svc";
	o.replica_id = replica;
	o.sync_interval_ms = 50;
	o.initial_replicas = 2;
	allot_agent *a;
	ck_assert_int_eq(allot_agent_create(cfg, &o, &a), ALLOT_OK);
	allot_config_free(cfg);
	return a;
}

void
km_synced(allot_agent **as, int n)
{
	uint64_t t0 = pc_now_ms();
	for (int i = 0; i < n; i++) {
		allot_sync_stats ss;
		for (;;) {
			allot_sync_stats_get(as[i], &ss);
			if (ss.connected && ss.syncs_ok >= 3)
				break;
			ck_assert_msg(pc_now_ms() - t0 < 15000,
			    "agent %d did not sync", i);
			pc_sleep_ms(10);
		}
	}
}

int
km_ask_rc(allot_agent *a, const char *id, const char *ep, allot_decision *ret)
{
	allot_decision d;
	allot_key *k;
	ck_assert_int_eq(allot_key_resolve(a, id, ep, &k), ALLOT_OK);
	int rc = allot_acquire(a, k, ALLOT_COST_DEFAULT, &d);
	if (ret != NULL)
		*ret = d;
	allot_key_release(a, k);
	return rc;
}

bool
km_ask(allot_agent *a, const char *id, const char *ep, allot_decision *ret)
{
	allot_decision d;
	ck_assert_int_eq(km_ask_rc(a, id, ep, &d), ALLOT_OK);
	if (ret != NULL)
		*ret = d;
	return d.allowed;
}

int
km_admitted(allot_agent *a, const char *id, const char *ep, int n)
{
	int ok = 0;
	for (int i = 0; i < n; i++)
		ok += km_ask(a, id, ep, NULL);
	return ok;
}

const char *
km_bound_by(
    allot_agent *a, const char *id, const char *ep, const allot_decision *d)
{
	allot_key *k;
	ck_assert_int_eq(allot_key_resolve(a, id, ep, &k), ALLOT_OK);
	const char *n = allot_decision_quota(a, k, d);
	allot_key_release(a, k);
	return n;
}

allot__ktotals
km_totals(allot_agent *a, const char *name)
{
	allot__ktotals t;
	uint32_t n = atomic_load(&a->nquotas);
	for (uint32_t i = 0; i < n; i++)
		if (strcmp(a->quotas[i].name, name) == 0) {
			allot__quota_totals(a, &a->quotas[i], &t);
			return t;
		}
	ck_abort_msg("no quota %s", name);
	return t;
}
