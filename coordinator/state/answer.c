/* SPDX-License-Identifier: MIT */
/*
 * What a Welcome or a Reply carries besides its counts (docs/protocol.md):
 * the shares, each grant brought toward its target on the way
 * (allot__grant()), and the quota config's text when the agent enforces
 * another. Shared by the Register (register.c) and Sync (sync.c)
 * paths; under the lock, except the report made after unlocking.
 */
#include "registry_int.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* The text of the config in force into `ret`, for session `s` whose
 * agent enforces `digest` (docs/protocol.md, "The config plane"): the
 * file's bytes when the digests differ, at most once per digest every
 * ALLOT__STATE_CONFIG_RESEND_MS per session, so that an agent that
 * cannot install it is not sent a file on every Reply. Copied into the
 * request's arena: the view may be replaced once the lock is let go.
 * Under the lock. */
allot__push
allot__config_push(allot__state *st, session *s, ProtobufCAllocator *pa,
    uint64_t digest, uint64_t now, ProtobufCBinaryData *ret)
{
	const cfgv *v = st->cur;
	if (digest == v->cfg->digest || v->text_len == 0)
		return ALLOT__PUSH_NONE;
	if (v->text == NULL)
		return ALLOT__PUSH_TOO_BIG;
	if (s->pushed_digest == v->cfg->digest && s->pushed_ns != 0 &&
	    since(now, s->pushed_ns) <
	        (uint64_t) ALLOT__STATE_CONFIG_RESEND_MS * 1000000u)
		return ALLOT__PUSH_HELD;
	uint8_t *buf = allot__pa_alloc(pa, v->text_len);
	if (buf == NULL)
		return ALLOT__PUSH_NOMEM;
	memcpy(buf, v->text, v->text_len);
	ret->data = buf;
	ret->len = v->text_len;
	s->pushed_digest = v->cfg->digest;
	s->pushed_ns = now != 0 ? now : 1;
	return ALLOT__PUSH_SENT;
}

/* After unlocking: a config sent is counted; one too big to send is
 * logged (rate limited). */
void
allot__config_push_report(allot__state *st, allot__push p, const char *replica,
    const char *svc_name, uint64_t digest, size_t text_len)
{
	if (p == ALLOT__PUSH_SENT && st->o.metrics != NULL)
		allot__metrics_add(&st->o.metrics->config_pushes, 1);
	if (p == ALLOT__PUSH_SENT)
		allot__log_ratelimited(st->o.lg, &st->rl_push, ALLOT_LOG_INFO,
		    "ALLOTD-CONFIG-PUSH",
		    "sent the quota config (digest %016" PRIx64
		    ", %zu bytes) to replica %s of %s",
		    digest, text_len, replica, svc_name);
	else if (p == ALLOT__PUSH_TOO_BIG)
		allot__log_ratelimited(st->o.lg, &st->rl_push,
		    ALLOT_LOG_WARNING, "ALLOTD-CONFIG-TOO-BIG",
		    "the quota file (digest %016" PRIx64 ", %zu bytes) is "
		    "above the %u bytes sent to agents: replica %s of %s "
		    "keeps its own config",
		    digest, text_len, ALLOT__STATE_CONFIG_PUSH_MAX, replica,
		    svc_name);
}

/* Bring every grant of `s` toward its target (allot__grant()) and fill
 * `shares` with the keys whose grant changed, or with every key that has
 * a quota when `all` is set. Returns false when `pa` is out of memory;
 * nothing is granted then. */
bool
allot__build_shares(allot__state *st, session *s, ProtobufCAllocator *pa,
    bool all, Allot__V1__Share ***ret, size_t *ret_n)
{
	*ret = NULL;
	*ret_n = 0;
	s->pending = 0;
	s->loan_due = false;
	if (s->nknown == 0)
		return true;
	/* Room for every key up front: once a grant is made it must reach
	 * the agent. The arena makes this a pointer bump. */
	Allot__V1__Share *arr = allot__pa_alloc(pa, s->nknown * sizeof *arr);
	Allot__V1__Share **ptrs = allot__pa_alloc(
	    pa, s->nknown * sizeof *ptrs);
	if (arr == NULL || ptrs == NULL)
		return false;
	size_t j = 0;
	uint64_t now = now_ns(st);
	for (uint32_t k = 0; k < s->nkeys; k++) {
		skey *key = &s->keys[k];
		if (key->q < 0)
			continue;
		/* A loan that has run its time: the burst goes back to the
		 * grant (the agent caps its level there). */
		if (allot__loan_end(key, now))
			key->force_share = true;
		if (key->loan_burst > 0)
			s->loan_due = true; /* its end is due */
		/* Cluster: while a leader learns what it took over, no
		 * grant for a replica that has not said what it runs on: it
		 * keeps that allowance, and its next report tells us. One
		 * that has keeps what it runs on (adopted): the targets come
		 * from demand estimates that are not in yet, and a first
		 * report's would cut the replica serving most of a quota to
		 * the common level right after the failover. */
		const squota *sq = &s->svc->q[key->q];
		bool learning = quota_learning(st, sq, now);
		if (learning && isnan(key->grant_rate))
			continue;
		bool is_short = false;
		bool changed = !learning &&
		    allot__grant(st, s->svc, s, key, &is_short);
		if (allot__standby_due(st, s->svc, key, now)) {
			changed = true;
			/* A lower one counts once acknowledged. */
			s->unacked |= key->standby_hold > key->standby;
		}
		s->pending += is_short;
		if (!changed && !all && !key->force_share)
			continue;
		key->force_share = false;
		allot__v1__share__init(&arr[j]);
		arr[j].key = key_id(s, key);
		arr[j].rate = key->grant_rate;
		arr[j].burst = key->grant_burst + key->loan_burst;
		arr[j].prefill = key->loan_prefill;
		arr[j].debit = key->loan_debit;
		arr[j].central = allot__central_on(st, (size_t) key->q);
		arr[j].standby = key->standby;
		if (!isnan(key->own_rate)) {
			arr[j].own_rate = key->own_rate;
			arr[j].own_burst = key->own_burst + key->loan_burst;
		}
		allot__loan_sent(s->svc, key);
		ptrs[j] = &arr[j];
		j++;
	}
	*ret = j > 0 ? ptrs : NULL;
	*ret_n = j;
	return true;
}
