/* SPDX-License-Identifier: MIT */
/*
 * The sync engine's side of the agent's account (account.h): its
 * incarnation, its clock (wall seconds, or the caller's clock's), and
 * taking the quotas' counters into it at each exchange and at the ends
 * of seconds between them (allot__syncc_tick). sync_core.c sends what
 * it holds and drops what the coordinator confirmed.
 */
#include "sync_int.h"

#include <inttypes.h>
#include <sys/random.h>
#include <unistd.h>

typedef allot__syncc syncc;

/* The account's incarnation must differ between two runs of one agent
 * (a restarted replica keeps its replica_id): drawn from the kernel,
 * the engine's seed only mixed in; under a clock of the caller's, the
 * seed alone. */
uint64_t
allot__syncc_acct_seed(const allot_agent *a, uint64_t seed)
{
	uint64_t r = 0;
	/* A clock of the caller's (the simulator): its runs repeat. */
	if (a->clock_fn != NULL)
		return seed;
	if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t) sizeof r)
		r = (uint64_t) allot__wall_ms() * 0x9e3779b97f4a7c15ull ^
		    (uint64_t) getpid();
	return r ^ seed;
}

/* The account's second for `now`: the wall clock's, or with a clock of
 * the caller's (the simulator) its own seconds. */
static int64_t
acct_second_ahead(const syncc *s, uint64_t now, uint64_t ahead_ms)
{
	if (s->a->clock_fn != NULL)
		return (int64_t) ((now + ahead_ms * 1000000u) / 1000000000u);
	return (allot__wall_ms() + (int64_t) ahead_ms) / 1000;
}

static int64_t
acct_second(const syncc *s, uint64_t now)
{
	return acct_second_ahead(s, now, 0);
}

void
allot__syncc_acct_take(syncc *s, uint64_t now)
{
	allot_agent *a = s->a;
	/* This thread is the one that appends quotas. */
	uint32_t n = atomic_load_explicit(&a->nquotas, memory_order_relaxed);
	(void) allot__acct_second(&s->acct, acct_second(s, now));
	for (uint32_t i = 0; i < n; i++) {
		allot__ktotals t;
		allot__quota_totals(a, &a->quotas[i], &t);
		allot__acct_take(
		    &s->acct, i, t.spent, t.denied_tokens, t.shadow_tokens);
	}
	uint64_t lost = atomic_load(&s->acct.dropped_tokens);
	if (lost != s->acct_dropped_said) {
		allot__log_ratelimited(&a->log, &s->acct_rl, ALLOT_LOG_ERR,
		    "ALLOT-SYNC-USAGE-LOST",
		    "%" PRIu64 " tokens of decisions dropped from the "
		    "account: the coordinator has confirmed nothing for "
		    "%u records, every minute of them folded already",
		    lost - s->acct_dropped_said, ALLOT__ACCT_RECORDS);
		s->acct_dropped_said = lost;
	}
}

void
allot__syncc_tick(syncc *s, uint64_t now)
{
	/* Between exchanges only the ends of seconds matter: the last
	 * check before one takes what the second holds, the first after
	 * it closes it (the driver checks every eighth of an interval). */
	uint64_t step = s->a->opts.sync_interval_ms / 8 + 1;
	int64_t sec = acct_second(s, now);
	if (sec != s->acct.open_second ||
	    acct_second_ahead(s, now, step) != sec)
		allot__syncc_acct_take(s, now);
}
