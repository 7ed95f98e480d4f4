/* SPDX-License-Identifier: MIT */
/*
 * The state as text: the per-service and per-quota series of /metrics
 * (Prometheus) and the /status document (JSON).
 */
#include "registry_int.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A bound is +Inf when a replica runs an `open` fallback: Prometheus
 * says so, JSON has null. */
static void
put_bound(allot__buf *b, double v, bool json)
{
	if (isinf(v))
		allot__buf_puts(b, json ? "null" : "+Inf");
	else
		allot__buf_num(b, v);
}

static void
sq_labels(
    allot__buf *b, const char *metric, const service *svc, const char *quota)
{
	allot__buf_printf(b, "%s{service=\"", metric);
	allot__buf_label(b, svc->name);
	allot__buf_puts(b, "\",quota=\"");
	allot__buf_label(b, quota);
	allot__buf_puts(b, "\"} ");
}

typedef enum sq_field {
	F_ALLOWED,
	F_DENIED,
	F_UTIL,
	F_ARATE,
	F_ABURST,
	F_LEVEL,
	F_BRATE,
	F_BBURST,
	F_BRATIO,
	F_ALLOWANCE,
	F_BUDGET,
	F_DEMAND,
	F_EXPIRED
} sq_field;

static void
sq_family(allot__state *st, allot__buf *b, const char *name, const char *type,
    const char *help, sq_field f)
{
	const cfgv *v = st->cur;
	allot__buf_printf(
	    b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
	for (size_t i = 0; i < st->nsvcs; i++) {
		const service *svc = st->svcs[i];
		for (size_t q = 0; q < v->nq; q++) {
			const squota *sq = &svc->q[q];
			sq_labels(b, name, svc, v->q[q]->identity);
			switch (f) {
			case F_ALLOWED:
				allot__buf_printf(
				    b, "%" PRIu64 "\n", sq->allowed_total);
				continue;
			case F_DENIED:
				allot__buf_printf(
				    b, "%" PRIu64 "\n", sq->denied_total);
				continue;
			case F_UTIL: allot__buf_num(b, sq->utilization); break;
			case F_ARATE:
				allot__buf_num(b, sq->granted_rate);
				break;
			case F_ABURST:
				allot__buf_num(b, sq->granted_burst);
				break;
			case F_LEVEL: allot__buf_num(b, sq->level); break;
			case F_BRATE:
				put_bound(b, sq->bound_rate, false);
				break;
			case F_BBURST:
				put_bound(b, sq->bound_burst, false);
				break;
			case F_BRATIO:
				put_bound(b,
				    allot__bound_ratio(
				        sq, v->rate[q], v->burst[q]),
				    false);
				break;
			case F_ALLOWANCE:
				allot__buf_num(b, sq->allowance);
				break;
			case F_BUDGET:
				allot__buf_num(b, sq->burst_budget);
				break;
			case F_DEMAND:
				allot__buf_num(b, sq->demand_sum);
				break;
			case F_EXPIRED:
				allot__buf_printf(
				    b, "%u\n", sq->counted_expired);
				continue;
			}
			allot__buf_puts(b, "\n");
		}
	}
}

void
allot__state_render_metrics(allot__state *st, allot__buf *b)
{
	pthread_mutex_lock(&st->mu);
	const cfgv *v = st->cur;
	uint64_t bnow = now_ns(st);
	for (size_t i = 0; i < st->nsvcs; i++)
		allot__compute_bounds(st, st->svcs[i], bnow);
	allot__buf_printf(b,
	    "# HELP allotd_config_epoch Epoch of the quota "
	    "config in force.\n# TYPE allotd_config_epoch gauge\n"
	    "allotd_config_epoch %" PRIu64 "\n",
	    v->epoch);
	allot__buf_printf(b,
	    "# HELP allotd_config_info Digest of the quota "
	    "config in force.\n# TYPE allotd_config_info gauge\n"
	    "allotd_config_info{digest=\"%016" PRIx64 "\",epoch=\"%" PRIu64
	    "\"} 1\n",
	    v->cfg->digest, v->epoch);
	allot__buf_puts(b,
	    "# HELP allotd_replicas Live replicas per service "
	    "(restored ones included).\n# TYPE allotd_replicas gauge\n");
	for (size_t i = 0; i < st->nsvcs; i++) {
		allot__buf_puts(b, "allotd_replicas{service=\"");
		allot__buf_label(b, st->svcs[i]->name);
		allot__buf_printf(b, "\"} %u\n", st->svcs[i]->nsess);
	}
	allot__buf_printf(b,
	    "# HELP allotd_sessions Live sessions, all "
	    "services.\n# TYPE allotd_sessions gauge\nallotd_sessions %zu\n",
	    st->nsessions);
	allot__buf_puts(b,
	    "# HELP allotd_quota_rate Configured rate R per "
	    "quota, tokens/s.\n# TYPE allotd_quota_rate gauge\n");
	for (size_t q = 0; q < v->nq; q++) {
		allot__buf_puts(b, "allotd_quota_rate{quota=\"");
		allot__buf_label(b, v->q[q]->identity);
		allot__buf_puts(b, "\"} ");
		allot__buf_num(b, v->rate[q]);
		allot__buf_puts(b, "\n");
	}
	allot__buf_puts(b,
	    "# HELP allotd_quota_burst Configured burst B per "
	    "quota, tokens.\n# TYPE allotd_quota_burst gauge\n");
	for (size_t q = 0; q < v->nq; q++) {
		allot__buf_puts(b, "allotd_quota_burst{quota=\"");
		allot__buf_label(b, v->q[q]->identity);
		allot__buf_puts(b, "\"} ");
		allot__buf_num(b, v->burst[q]);
		allot__buf_puts(b, "\n");
	}
	sq_family(st, b, "allotd_allowed_tokens_total", "counter",
	    "Tokens admitted, as reported by the agents.", F_ALLOWED);
	sq_family(st, b, "allotd_denied_tokens_total", "counter",
	    "Tokens denied, as reported by the agents.", F_DENIED);
	sq_family(st, b, "allotd_utilization", "gauge",
	    "Admitted tokens over the last second / (R * 1 s).", F_UTIL);
	sq_family(st, b, "allotd_allowance_rate", "gauge",
	    "Sum of the rate shares the replicas hold, tokens/s (<= R).",
	    F_ARATE);
	sq_family(st, b, "allotd_allowance_burst", "gauge",
	    "Sum of the burst shares the replicas hold, tokens (<= B).",
	    F_ABURST);
	sq_family(st, b, "allotd_bucket_level_tokens", "gauge",
	    "Estimated level of the global bucket.", F_LEVEL);
	/* The live bound (docs/allocation.md, "The live bound"). */
	sq_family(st, b, "allotd_allowance_bound_rate", "gauge",
	    "Rate the agents may admit at now, tokens/s: grants, decreases "
	    "not acknowledged yet, fallbacks of lapsed and expired "
	    "replicas.",
	    F_BRATE);
	sq_family(st, b, "allotd_allowance_bound_burst", "gauge",
	    "Tokens the agents' local buckets may hold now (same terms, "
	    "local bursts raised to the largest endpoint weight).",
	    F_BBURST);
	sq_family(st, b, "allotd_overadmission_bound_ratio", "gauge",
	    "max(bound rate / R, bound burst / B): the worst-case "
	    "admission over any window relative to the quota's (1 = "
	    "none above it).",
	    F_BRATIO);
	sq_family(st, b, "allotd_expired_replicas_counted", "gauge",
	    "Expired replicas whose lease or fallback is still counted in "
	    "the bound.",
	    F_EXPIRED);
	sq_family(st, b, "allotd_allocation_rate", "gauge",
	    "The quota's allowance under the global ceiling, tokens/s "
	    "(<= R).",
	    F_ALLOWANCE);
	sq_family(st, b, "allotd_burst_budget_tokens", "gauge",
	    "What the burst shares may sum to: the global bucket's level "
	    "plus one interval of refill (<= B).",
	    F_BUDGET);
	sq_family(st, b, "allotd_demand_rate", "gauge",
	    "Sum of the replicas' demand estimates (admitted + denied "
	    "cost), tokens/s.",
	    F_DEMAND);
	pthread_mutex_unlock(&st->mu);
}

/* The (session, key) pairs of a service grouped by quota, so /status
 * lists each quota's shares in time linear in the number of keys. */
typedef struct share_index {
	uint32_t *start; /* nq + 1 offsets into sess/key */
	uint32_t *sess;
	uint32_t *key;
} share_index;

static void
share_index_free(share_index *x)
{
	free(x->start);
	free(x->sess);
	free(x->key);
}

static bool
share_index_build(share_index *x, const service *svc, size_t nq)
{
	size_t total = 0;
	for (uint32_t j = 0; j < svc->nsess; j++)
		total += svc->sess[j]->nknown;
	x->start = calloc(nq + 2, sizeof *x->start);
	x->sess = malloc((total + 1) * sizeof *x->sess);
	x->key = malloc((total + 1) * sizeof *x->key);
	if (x->start == NULL || x->sess == NULL || x->key == NULL) {
		share_index_free(x);
		return false;
	}
	for (uint32_t j = 0; j < svc->nsess; j++) {
		const session *s = svc->sess[j];
		for (uint32_t k = 0; k < s->nkeys; k++)
			if (s->keys[k].q >= 0)
				x->start[s->keys[k].q + 2]++;
	}
	for (size_t q = 2; q < nq + 2; q++)
		x->start[q] += x->start[q - 1];
	/* start[q + 1] is now the fill cursor of quota q; after the fill
	 * start[q] .. start[q + 1] are quota q's entries. */
	for (uint32_t j = 0; j < svc->nsess; j++) {
		const session *s = svc->sess[j];
		for (uint32_t k = 0; k < s->nkeys; k++) {
			if (s->keys[k].q < 0)
				continue;
			uint32_t e = x->start[s->keys[k].q + 1]++;
			x->sess[e] = j;
			x->key[e] = k;
		}
	}
	return true;
}

void
allot__state_render_status(allot__state *st, allot__buf *b)
{
	int64_t wall = allot__wall_ms();
	/* Taken before st->mu: the store has its own lock. */
	allot__store_stats ss;
	memset(&ss, 0, sizeof ss);
	allot__store_stats_get(st->o.store, &ss);
	pthread_mutex_lock(&st->mu);
	uint64_t now = now_ns(st);
	const cfgv *v = st->cur;
	for (size_t i = 0; i < st->nsvcs; i++)
		allot__compute_bounds(st, st->svcs[i], now);
	allot__buf_printf(b,
	    "{\"version\":\"%s\",\"config\":{\"epoch\":%" PRIu64
	    ",\"digest\":\"%016" PRIx64 "\",\"path\":",
	    ALLOT_VERSION_STRING, v->epoch, v->cfg->digest);
	allot__buf_json(b, v->path);
	allot__buf_printf(b,
	    ",\"loaded_at_ms\":%" PRId64 ",\"quotas\":%zu,"
	    "\"ceiling_rate\":",
	    v->loaded_wall_ms, v->nq);
	allot__buf_num(b, v->cfg->ceiling_rate);
	allot__buf_printf(b,
	    "},\"settings\":{\"lease_ms\":%u,\"interval_ms\":"
	    "%u,\"expiry_intervals\":%u,\"allocator\":\"%s\"},"
	    "\"sessions\":%zu,\"services\":[",
	    st->o.lease_ms, st->o.interval_ms, st->o.expiry_intervals,
	    allot__alloc_name(&st->o.policy), st->nsessions);
	for (size_t i = 0; i < st->nsvcs; i++) {
		const service *svc = st->svcs[i];
		allot__buf_puts(b, i ? ",{\"name\":" : "{\"name\":");
		allot__buf_json(b, svc->name);
		allot__buf_printf(
		    b, ",\"live_replicas\":%u,\"replicas\":[", svc->nsess);
		for (uint32_t j = 0; j < svc->nsess; j++) {
			const session *s = svc->sess[j];
			allot__buf_printf(b,
			    "%s{\"session\":%" PRIu64 ",\"replica_id\":",
			    j ? "," : "", s->id);
			allot__buf_json(b, s->replica_id);
			allot__buf_puts(b, ",\"host\":");
			allot__buf_json(b, s->host != NULL ? s->host : "");
			allot__buf_printf(
			    b, ",\"pid\":%u,\"agent_version\":", s->pid);
			allot__buf_json(b,
			    s->agent_version != NULL ? s->agent_version : "");
			allot__buf_printf(b,
			    ",\"restored\":%s,\"keys\":%u,"
			    "\"unknown_keys\":%u,\"last_seq\":%" PRIu64
			    ",\"last_seen_ms\":%" PRId64
			    ",\"silent_ms\":%" PRIu64 "}",
			    s->ghost ? "true" : "false", s->nkeys,
			    s->nkeys - s->nknown, s->last_seq, s->seen_wall_ms,
			    since(now, s->last_seen_ns) / 1000000u);
		}
		allot__buf_puts(b, "],\"quotas\":[");
		share_index idx;
		if (!share_index_build(&idx, svc, v->nq)) {
			b->oom = true;
			break;
		}
		for (size_t q = 0; q < v->nq; q++) {
			const squota *sq = &svc->q[q];
			allot__buf_puts(b, q ? ",{\"quota\":" : "{\"quota\":");
			allot__buf_json(b, v->q[q]->identity);
			allot__buf_puts(b, ",\"rate\":");
			allot__buf_num(b, v->rate[q]);
			allot__buf_puts(b, ",\"burst\":");
			allot__buf_num(b, v->burst[q]);
			allot__buf_puts(b, ",\"priority\":");
			allot__buf_json(b,
			    allot__cfgv_priority_name(v, v->q[q]->priority));
			allot__buf_puts(b, ",\"sum_rate\":");
			allot__buf_num(b, sq->granted_rate);
			allot__buf_puts(b, ",\"sum_burst\":");
			allot__buf_num(b, sq->granted_burst);
			allot__buf_puts(b, ",\"target_sum_rate\":");
			allot__buf_num(b, sq->sum_rate);
			allot__buf_puts(b, ",\"target_sum_burst\":");
			allot__buf_num(b, sq->sum_burst);
			allot__buf_puts(b, ",\"allocation_rate\":");
			allot__buf_num(b, sq->allowance);
			allot__buf_puts(b, ",\"burst_budget\":");
			allot__buf_num(b, sq->burst_budget);
			allot__buf_puts(b, ",\"bound_rate\":");
			put_bound(b, sq->bound_rate, true);
			allot__buf_puts(b, ",\"bound_burst\":");
			put_bound(b, sq->bound_burst, true);
			allot__buf_puts(b, ",\"overadmission_bound_ratio\":");
			put_bound(b,
			    allot__bound_ratio(sq, v->rate[q], v->burst[q]),
			    true);
			allot__buf_printf(
			    b, ",\"expired_counted\":%u", sq->counted_expired);
			allot__buf_printf(b,
			    ",\"holders\":%u,"
			    "\"admitted_per_s\":",
			    sq->nslots);
			allot__buf_num(b, sq->admitted_rate);
			allot__buf_puts(b, ",\"denied_per_s\":");
			allot__buf_num(b, sq->denied_rate);
			allot__buf_puts(b, ",\"utilization\":");
			allot__buf_num(b, sq->utilization);
			allot__buf_puts(b, ",\"level\":");
			allot__buf_num(b, sq->level);
			allot__buf_puts(b, ",\"demand\":");
			allot__buf_num(b, sq->demand_sum);
			/* Cluster mode: whether this member owns the quota
			 * now, and learns it (always owned, not learning,
			 * for a single coordinator). */
			allot__buf_printf(b, ",\"owned\":%s,\"learning\":%s",
			    sq->disowned ? "false" : "true",
			    st->cl_n > 0 && !sq->disowned &&
			            now < sq->learn_until_ns ?
			        "true" :
			        "false");
			allot__buf_printf(b,
			    ",\"admitted_total\":%" PRIu64
			    ",\"denied_total\":%" PRIu64 ",\"shares\":[",
			    sq->allowed_total, sq->denied_total);
			for (uint32_t e = idx.start[q]; e < idx.start[q + 1];
			     e++) {
				const session *s = svc->sess[idx.sess[e]];
				const skey *key = &s->keys[idx.key[e]];
				allot__buf_printf(b,
				    "%s{\"session\":%" PRIu64
				    ",\"replica_id\":",
				    e > idx.start[q] ? "," : "", s->id);
				allot__buf_json(b, s->replica_id);
				allot__buf_puts(b, ",\"rate\":");
				allot__buf_num(b,
				    isnan(key->sent_rate) ? 0 :
				                            key->sent_rate);
				allot__buf_puts(b, ",\"burst\":");
				allot__buf_num(b,
				    isnan(key->sent_burst) ? 0 :
				                             key->sent_burst);
				allot__buf_puts(b, ",\"target_rate\":");
				allot__buf_num(b, key->rate);
				allot__buf_puts(b, ",\"target_burst\":");
				allot__buf_num(b, key->burst);
				allot__buf_puts(b, ",\"demand\":");
				allot__buf_num(
				    b, s->ghost ? 0 : allot__est_read(s, key));
				allot__buf_puts(b, "}");
			}
			allot__buf_puts(b, "]}");
		}
		share_index_free(&idx);
		allot__buf_puts(b, "]}");
	}
	/* For allotctl and the dashboard: every configured quota (also
	 * before any service registered), the pid (allotctl reload signals
	 * it) and the store's counters (its health). */
	allot__buf_printf(b, "],\"pid\":%ld,\"quotas\":[", (long) getpid());
	for (size_t q = 0; q < v->nq; q++) {
		allot__buf_puts(b, q ? ",{\"quota\":" : "{\"quota\":");
		allot__buf_json(b, v->q[q]->identity);
		allot__buf_puts(b, ",\"rate\":");
		allot__buf_num(b, v->rate[q]);
		allot__buf_puts(b, ",\"burst\":");
		allot__buf_num(b, v->burst[q]);
		allot__buf_puts(b, ",\"priority\":");
		allot__buf_json(
		    b, allot__cfgv_priority_name(v, v->q[q]->priority));
		allot__buf_printf(
		    b, ",\"shadow\":%s}", v->q[q]->shadow ? "true" : "false");
	}
	allot__buf_puts(b, "],\"store\":");
	if (st->o.store == NULL)
		allot__buf_puts(b, "null");
	else
		allot__buf_printf(b,
		    "{\"commits\":%" PRIu64 ",\"commit_failures\":%" PRIu64
		    ",\"pending_rows\":%" PRIu64 ",\"rows_written\":%" PRIu64
		    ",\"rows_dropped\":%" PRIu64 ",\"last_error\":%d}",
		    ss.commits, ss.commit_failures, ss.pending,
		    ss.rows_written, ss.rows_dropped, ss.last_error);
	allot__buf_printf(b, ",\"now_ms\":%" PRId64 "}\n", wall);
	pthread_mutex_unlock(&st->mu);
}
