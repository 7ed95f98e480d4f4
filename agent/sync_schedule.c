/* SPDX-License-Identifier: MIT */
/*
 * The sync engine's schedule (sync_int.h): when the next exchange runs
 * (the interval with jitter, half of it after a Welcome or an early
 * Sync, a full-jitter backoff after a failure, never past the lease's
 * end), whether one is due early (a key started denying), and the
 * public statistics the engine publishes. Split from sync_core.c, which
 * builds the messages and applies the answers.
 */
#include "sync_int.h"

#include <math.h>

#include "prng.h"

typedef allot__syncc syncc;

/* xorshift64* (prng.h): jitter only. */
static double
uniform(syncc *s)
{
	return allot__xorshift64s_unit(&s->rng);
}

uint64_t
allot__syncc_next_delay_ms(syncc *s, uint64_t now, bool ok)
{
	allot_agent *a = s->a;
	if (ok && s->throttled) {
		s->throttled = false;
		ok = false; /* the backoff, not the interval */
	} else if (ok && s->session == 0) {
		return 0; /* re-register at once */
	} else if (ok && allot__syncc_nq(s) > s->nwire) {
		/* A config appended quotas: name them now (add_keys), so
		 * that their shares come within an exchange, not a T. */
		return 1;
	}
	double t;
	if (ok) {
		double j = a->opts.sync_jitter;
		t = a->opts.sync_interval_ms *
		    (1.0 + j * (2 * uniform(s) - 1));
		/* After a Welcome, or an early Sync (the grant may need
		 * the others' next Syncs to free headroom): again after
		 * half an interval. */
		if (s->welcomed || s->early_sent) {
			s->welcomed = false;
			s->early_sent = false;
			t /= 2;
		}
		if (s->returning) {
			s->returning = false;
			t = fmin(t, a->opts.sync_interval_ms / 8.0);
		}
	} else {
		/* Full jitter between the floor and the current backoff. */
		double lo = a->opts.reconnect_min_ms;
		double hi = s->backoff_ms > lo ? s->backoff_ms : lo;
		t = lo + (hi - lo) * uniform(s);
	}
	/* Wake up in time to notice the lease running out. */
	if (s->lease_until_ns != 0 && !atomic_load(&s->in_fallback)) {
		double left = s->lease_until_ns > now ?
		    (double) (s->lease_until_ns - now) / 1e6 :
		    0;
		if (left + 1 < t)
			t = left + 1;
	}
	return t < 1 ? 1 : (uint64_t) t;
}

bool
allot__syncc_early_due(syncc *s, uint64_t now)
{
	allot_agent *a = s->a;
	/* A newcomer's first Syncs are paced by its Welcome (it asks
	 * again after half an interval), and a zero grant is the
	 * coordinator waiting for the others to give back: asking sooner
	 * would find no headroom, and would only push the next Sync back. */
	if (s->session == 0 || s->seq < 3 || s->welcomed || s->throttled ||
	    s->backoff_ms != 0 || atomic_load(&s->in_fallback))
		return false;
	uint64_t gap = (uint64_t) a->opts.sync_interval_ms * 250000u;
	if (now < s->last_sync_ns + gap)
		return false;
	for (uint32_t i = 0; i < allot__syncc_nq(s); i++) {
		allot__qrt *q = &a->quotas[i];
		if (q->is_default || s->q[i].denying ||
		    !(s->q[i].share_rate > 0))
			continue;
		allot__ktotals t;
		allot__quota_totals(a, q, &t);
		if ((int64_t) (t.denied_tokens - s->q[i].last_denied) > 0) {
			s->early = true;
			return true;
		}
	}
	return false;
}

void
allot__syncc_stats(syncc *s, uint64_t now, allot_sync_stats *ret)
{
	ret->enabled = true;
	ret->connected = atomic_load(&s->connected);
	ret->in_fallback = atomic_load(&s->in_fallback);
	ret->replicas = atomic_load(&s->replicas);
	ret->config_epoch = atomic_load(&s->epoch);
	ret->config_digest = atomic_load(&s->digest);
	ret->session = atomic_load(&s->session_pub);
	ret->registers = atomic_load(&s->registers);
	ret->syncs_ok = atomic_load(&s->syncs_ok);
	ret->syncs_failed = atomic_load(&s->syncs_failed);
	ret->errors_received = atomic_load(&s->errors_received);
	ret->fallback_enters = atomic_load(&s->fallback_enters);
	ret->fallback_leaves = atomic_load(&s->fallback_leaves);
	ret->unknown_keys = atomic_load(&s->unknown_keys);
	ret->reports_sent = atomic_load(&s->reports_sent);
	ret->bytes_sent = atomic_load(&s->bytes_sent);
	ret->last_rtt_us = atomic_load(&s->last_rtt_us);
	ret->unreported_tokens = atomic_load(&s->unreported_tokens);
	ret->throttled = atomic_load(&s->throttled_n);
	ret->early_syncs = atomic_load(&s->early_syncs);
	ret->enforced_digest = atomic_load(&s->enforced);
	ret->config_installs = atomic_load(&s->config_installs);
	ret->config_rejects = atomic_load(&s->config_rejects);
	ret->keys_unconfirmed = atomic_load(&s->unconfirmed);
	ret->not_leader = atomic_load(&s->not_leader_n);
	ret->stale_epoch = atomic_load(&s->stale_epoch_n);
	ret->leader_epoch = atomic_load(&s->epoch_pub);
	ret->loan_tokens = atomic_load(&s->loan_tokens);
	ret->debit_tokens = atomic_load(&s->debit_tokens);
	ret->usage_incarnation = s->acct.incarnation;
	ret->usage_pending = atomic_load(&s->acct.pending_pub);
	ret->usage_durable = atomic_load(&s->acct.durable);
	ret->usage_folded = atomic_load(&s->acct.folded);
	ret->usage_dropped_tokens = atomic_load(&s->acct.dropped_tokens);
	int64_t until = atomic_load(&s->lease_until_pub);
	ret->lease_remaining_ms = until == 0 ?
	    0 :
	    until - (int64_t) (now / 1000000u);
}
