/* SPDX-License-Identifier: MIT */
/*
 * The state as text: the per-service and per-quota series of /metrics
 * (Prometheus) and the /status document (JSON). Each takes a snapshot
 * of what it shows under the state's lock and formats it after
 * unlocking.
 */
#include "registry_int.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "arena.h"

/* ---- the snapshot ----
 * Rendering formats a copy of the state taken under the lock (bounds
 * computed, strings copied), so that the nng workers' requests, which
 * need the lock, never wait for the formatting of every replica. The
 * copy lives in an arena and goes at once after the rendering. */

/* One share of one quota, as /status lists it. */
typedef struct snap_share {
	uint64_t session;
	const char *replica_id;
	double rate; /* its grant (0: none yet) */
	double burst;
	double target_rate;
	double target_burst;
	double demand;
} snap_share;

/* One replica of a service, as /status lists it. */
typedef struct snap_replica {
	uint64_t session;
	const char *replica_id;
	const char *host;
	const char *agent_version;
	uint32_t pid;
	bool restored;
	uint32_t keys;
	uint32_t unknown_keys;
	uint64_t last_seq;
	int64_t last_seen_ms;
	uint64_t silent_ms;
} snap_replica;

/* One quota of one service. */
typedef struct snap_quota {
	squota sq; /* a copy, bounds computed */
	bool learning;
	uint32_t nshares;
	snap_share *shares; /* in session order */
} snap_quota;

typedef struct snap_service {
	const char *name;
	/* Its series of one number each (allot__state_metrics()). */
	uint64_t nsess;
	uint64_t values; /* per-value buckets split now (values.c) */
	uint64_t values_unsplit;
	snap_replica *reps; /* NULL in a snapshot without sessions */
	snap_quota *q; /* nq */
	bool *in; /* nq: whether the service's view has the quota */
} snap_service;

/* One quota of the config in force. */
typedef struct snap_qcfg {
	const char *identity; /* its wire key: "IDENTITY ENDPOINT" for an
	                         endpoint quota */
	const char *service; /* NULL: the top level's (every service's) */
	double rate;
	double burst;
	const char *priority;
	bool shadow;
	double cand_rate; /* its candidate (candidate.c); 0: none */
	double cand_burst;
} snap_qcfg;

typedef struct snap {
	allot__arena ar;
	uint64_t epoch;
	uint64_t digest;
	const char *path;
	int64_t loaded_wall_ms;
	double ceiling_rate;
	size_t nq;
	snap_qcfg *qc;
	size_t nsessions;
	size_t nsvcs;
	snap_service *svcs;
} snap;

static void *
snap_alloc(snap *sn, size_t n, size_t size)
{
	return allot__arena_alloc(&sn->ar, (n ? n : 1) * size);
}

/* A copy of `s` in the snapshot's arena; NULL when out of memory. */
static const char *
snap_str(snap *sn, const char *s)
{
	size_t n = strlen(s) + 1;
	char *p = allot__arena_alloc(&sn->ar, n);
	if (p != NULL)
		memcpy(p, s, n);
	return p;
}

/* The replicas of `svc` and, per quota, its shares in the order of the
 * sessions and their keys. */
static bool
snap_sessions(snap *sn, snap_service *ss, const service *svc, uint64_t now)
{
	ss->reps = snap_alloc(sn, svc->nsess, sizeof *ss->reps);
	if (ss->reps == NULL)
		return false;
	for (uint32_t j = 0; j < svc->nsess; j++) {
		const session *s = svc->sess[j];
		ss->reps[j] = (snap_replica) {
			.session = s->id,
			.replica_id = snap_str(sn, s->replica_id),
			.host = snap_str(sn, s->host != NULL ? s->host : ""),
			.agent_version = snap_str(sn,
			    s->agent_version != NULL ? s->agent_version : ""),
			.pid = s->pid,
			.restored = s->placeholder,
			.keys = s->nwire,
			.unknown_keys = s->nwire - s->nknown,
			.last_seq = s->last_seq,
			.last_seen_ms = s->seen_wall_ms,
			.silent_ms = since(now, s->last_seen_ns) / 1000000u,
		};
		if (ss->reps[j].replica_id == NULL ||
		    ss->reps[j].host == NULL ||
		    ss->reps[j].agent_version == NULL)
			return false;
	}
	FOR_EACH_KEY (svc, j, s, key)
		ss->q[key->q].nshares++;
	for (size_t q = 0; q < sn->nq; q++) {
		snap_quota *sq = &ss->q[q];
		sq->shares = snap_alloc(sn, sq->nshares, sizeof *sq->shares);
		if (sq->shares == NULL)
			return false;
		sq->nshares = 0;
	}
	FOR_EACH_KEY (svc, j, s, key) {
		snap_quota *sq = &ss->q[key->q];
		sq->shares[sq->nshares++] = (snap_share) {
			.session = s->id,
			.replica_id = ss->reps[j].replica_id,
			.rate = isnan(key->grant_rate) ? 0 : key->grant_rate,
			.burst = isnan(key->grant_burst) ? 0 :
			                                   key->grant_burst,
			.target_rate = key->rate,
			.target_burst = key->burst,
			.demand = s->placeholder ? 0 : allot__est_read(s, key),
		};
	}
	return true;
}

/* Copy what the rendering shows, with the live bounds computed, and with
 * the replicas and shares when `sessions` is set. Under the lock. False
 * when out of memory (the arena is the caller's to free). */
static bool
snap_take(snap *sn, allot__state *st, bool sessions)
{
	const cfgv *v = st->cur;
	uint64_t now = now_ns(st);
	for (size_t i = 0; i < st->nsvcs; i++)
		allot__compute_bounds(st, st->svcs[i], now);
	sn->epoch = v->epoch;
	sn->digest = v->cfg->digest;
	sn->path = snap_str(sn, v->path);
	sn->loaded_wall_ms = v->loaded_wall_ms;
	sn->ceiling_rate = v->cfg->ceiling_rate;
	sn->nq = v->nq;
	sn->nsessions = st->nsessions;
	sn->nsvcs = st->nsvcs;
	sn->qc = snap_alloc(sn, v->nq, sizeof *sn->qc);
	sn->svcs = snap_alloc(sn, st->nsvcs, sizeof *sn->svcs);
	if (sn->path == NULL || sn->qc == NULL || sn->svcs == NULL)
		return false;
	for (size_t q = 0; q < v->nq; q++) {
		sn->qc[q] = (snap_qcfg) {
			.identity = snap_str(sn, v->names[q]),
			.service = v->qsvc[q] != NULL ?
			    snap_str(sn, v->qsvc[q]) :
			    NULL,
			.rate = v->rate[q],
			.burst = v->burst[q],
			.priority = snap_str(sn,
			    allot__cfgv_priority_name(v, v->q[q]->priority)),
			.shadow = v->q[q]->shadow,
			.cand_rate = v->q[q]->cand_rate > 0 ?
			    v->q[q]->cand_rate :
			    0,
			.cand_burst = v->q[q]->cand_rate > 0 ?
			    (v->q[q]->cand_burst > 0 ? v->q[q]->cand_burst :
			                               v->q[q]->burst) :
			    0,
		};
		if (sn->qc[q].identity == NULL || sn->qc[q].priority == NULL ||
		    (v->qsvc[q] != NULL && sn->qc[q].service == NULL))
			return false;
	}
	for (size_t i = 0; i < st->nsvcs; i++) {
		service *svc = st->svcs[i];
		snap_service *ss = &sn->svcs[i];
		*ss = (snap_service) {
			.name = snap_str(sn, svc->name),
			.nsess = svc->nsess,
			.values = allot__values_count(svc),
			.values_unsplit = svc->values_unsplit,
			.q = snap_alloc(sn, v->nq, sizeof *ss->q),
			.in = snap_alloc(sn, v->nq, sizeof *ss->in),
		};
		if (ss->name == NULL || ss->q == NULL || ss->in == NULL)
			return false;
		/* A service shows the quotas of its view only. */
		allot__cfgv_mask(v, svc->name, ss->in);
		for (size_t q = 0; q < v->nq; q++) {
			squota *sq = &svc->q[q];
			/* A candidate changed by a reload shows its own
			 * figures from the start, not the previous one's. */
			allot__cand_check(sq, v->q[q], now);
			ss->q[q] = (snap_quota) {
				.sq = *sq,
				/* Cluster: whether this leader still learns
				 * the quota it took over (never for a single
				 * coordinator). */
				.learning = quota_learning(st, sq, now),
			};
		}
		if (sessions && !snap_sessions(sn, ss, svc, now))
			return false;
	}
	return true;
}

/* ---- /metrics ---- */

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
sq_labels(allot__buf *b, const char *metric, const snap_service *svc,
    const char *quota)
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
	F_EXPIRED,
	F_SHADOW,
	F_CAND
} sq_field;

static void
sq_family(const snap *sn, allot__buf *b, const char *name, const char *type,
    const char *help, sq_field f)
{
	allot__buf_printf(
	    b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
	for (size_t i = 0; i < sn->nsvcs; i++) {
		const snap_service *svc = &sn->svcs[i];
		for (size_t q = 0; q < sn->nq; q++) {
			const squota *sq = &svc->q[q].sq;
			const snap_qcfg *qc = &sn->qc[q];
			if (!svc->in[q])
				continue;
			sq_labels(b, name, svc, qc->identity);
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
				        sq, qc->rate, qc->burst),
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
			case F_SHADOW:
				allot__buf_printf(
				    b, "%" PRIu64 "\n", sq->shadow_total);
				continue;
			case F_CAND:
				allot__buf_printf(
				    b, "%.0f\n", floor(sq->cand_denied_total));
				continue;
			}
			allot__buf_puts(b, "\n");
		}
	}
}

/* The per-service and per-quota families of /metrics, in their order. */
static const struct sq_family_def {
	const char *name;
	const char *type;
	const char *help;
	sq_field f;
	const char *legacy; /* its name in 0.1, or NULL: unchanged */
} sq_families[] = {
	{ "allotd_allowed_tokens_total", "counter",
	    "Tokens admitted, as reported by the agents.", F_ALLOWED, NULL },
	{ "allotd_denied_tokens_total", "counter",
	    "Tokens denied, as reported by the agents (shadow would-denies "
	    "are not denials).",
	    F_DENIED, NULL },
	{ "allotd_shadow_denied_tokens_total", "counter",
	    "Tokens admitted in shadow that enforcing would have denied (also "
	    "in allotd_allowed_tokens_total).",
	    F_SHADOW, NULL },
	{ "allotd_candidate_denied_tokens_total", "counter",
	    "Tokens the quota's candidate value would have denied, evaluated "
	    "per report over the tokens offered (admitted + denied).",
	    F_CAND, NULL },
	{ "allotd_utilization_ratio", "gauge",
	    "Admitted tokens over the last second / (R * 1 s).", F_UTIL,
	    "allotd_utilization" },
	{ "allotd_allowance_tokens_per_second", "gauge",
	    "Sum of the rate shares the replicas hold, tokens/s (<= R).",
	    F_ARATE, "allotd_allowance_rate" },
	{ "allotd_allowance_burst_tokens", "gauge",
	    "Sum of the burst shares the replicas hold, tokens (<= B).",
	    F_ABURST, "allotd_allowance_burst" },
	{ "allotd_bucket_level_tokens", "gauge",
	    "Estimated level of the global bucket.", F_LEVEL, NULL },
	/* The live bound (docs/allocation.md, "The live bound"). */
	{ "allotd_allowance_bound_tokens_per_second", "gauge",
	    "Rate the agents may admit at now, tokens/s: grants, decreases "
	    "not acknowledged yet, fallbacks of lapsed and expired replicas.",
	    F_BRATE, "allotd_allowance_bound_rate" },
	{ "allotd_allowance_bound_burst_tokens", "gauge",
	    "Tokens the agents' local buckets may hold now (same terms, local "
	    "bursts raised to the largest endpoint weight).",
	    F_BBURST, "allotd_allowance_bound_burst" },
	{ "allotd_overadmission_bound_ratio", "gauge",
	    "max(bound rate / R, bound burst / B): the worst-case admission "
	    "over any window relative to the quota's (1 = none above it).",
	    F_BRATIO, NULL },
	{ "allotd_expired_replicas_counted", "gauge",
	    "Expired replicas whose lease or fallback is still counted in the "
	    "bound.",
	    F_EXPIRED, NULL },
	{ "allotd_allocation_tokens_per_second", "gauge",
	    "The quota's allowance under the global ceiling, tokens/s (<= R).",
	    F_ALLOWANCE, "allotd_allocation_rate" },
	{ "allotd_burst_budget_tokens", "gauge",
	    "What the burst shares may sum to: the global bucket's level plus "
	    "one interval of refill (<= B).",
	    F_BUDGET, NULL },
	{ "allotd_demand_tokens_per_second", "gauge",
	    "Sum of the replicas' demand estimates (admitted + denied cost), "
	    "tokens/s.",
	    F_DEMAND, "allotd_demand_rate" },
};

/* The per-quota configuration gauges: what each holds of a quota. */
typedef enum qc_field { QC_RATE, QC_BURST, QC_CANDIDATE } qc_field;

/* A gauge per configured quota (QC_CANDIDATE: per quota with a
 * candidate, labelled by quota alone). */
static void
quota_series(const snap *sn, allot__buf *b, const char *name, const char *help,
    qc_field f)
{
	allot__buf_printf(
	    b, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
	for (size_t q = 0; q < sn->nq; q++) {
		const snap_qcfg *qc = &sn->qc[q];
		if (f == QC_CANDIDATE && !(qc->cand_rate > 0))
			continue;
		allot__buf_printf(b, "%s{quota=\"", name);
		allot__buf_label(b, qc->identity);
		/* A service section's own quota: one series per service. */
		if (f != QC_CANDIDATE && qc->service != NULL) {
			allot__buf_puts(b, "\",service=\"");
			allot__buf_label(b, qc->service);
		}
		allot__buf_puts(b, "\"} ");
		allot__buf_num(b,
		    f == QC_RATE      ? qc->rate :
		        f == QC_BURST ? qc->burst :
		                        qc->cand_rate);
		allot__buf_puts(b, "\n");
	}
}

static const struct {
	const char *name, *help;
	qc_field f;
	const char *legacy; /* its name in 0.1 */
} quota_gauges[] = {
	{ "allotd_quota_tokens_per_second",
	    "Configured rate R per quota, tokens/s.", QC_RATE,
	    "allotd_quota_rate" },
	{ "allotd_quota_burst_tokens", "Configured burst B per quota, tokens.",
	    QC_BURST, "allotd_quota_burst" },
	{ "allotd_quota_candidate_tokens_per_second",
	    "Candidate rate per quota (evaluated, never enforced), tokens/s; "
	    "only quotas with one.",
	    QC_CANDIDATE, "allotd_quota_candidate_rate" },
};

/* The HELP of a gauge under its name of 0.1 (--legacy-metric-names),
 * renamed `name`, into `buf`. */
static const char *
legacy_help(char *buf, size_t len, const char *name)
{
	snprintf(buf, len,
	    "Deprecated: the name of %s in 0.1, removed in 0.3.", name);
	return buf;
}

/* The config, replica and per-quota configuration series; with
 * `legacy`, the renamed ones under their names of 0.1 too. */
static void
metrics_config(const snap *sn, allot__buf *b, bool legacy)
{
	allot__buf_printf(b,
	    "# HELP allotd_config_epoch Epoch of the quota "
	    "config in force.\n# TYPE allotd_config_epoch gauge\n"
	    "allotd_config_epoch %" PRIu64 "\n",
	    sn->epoch);
	allot__buf_printf(b,
	    "# HELP allotd_config_info Digest of the quota "
	    "config in force.\n# TYPE allotd_config_info gauge\n"
	    "allotd_config_info{digest=\"%016" PRIx64 "\",epoch=\"%" PRIu64
	    "\"} 1\n",
	    sn->digest, sn->epoch);
	static const struct {
		const char *name, *type, *help;
		size_t off; /* a uint64_t of snap_service */
	} per_service[] = {
		{ "allotd_replicas", "gauge",
		    "Live replicas per service (restored ones included).",
		    offsetof(snap_service, nsess) },
		{ "allotd_values", "gauge",
		    "Values of a per-value default quota (shared: false) "
		    "split across replicas now.",
		    offsetof(snap_service, values) },
		{ "allotd_values_unsplit_total", "counter",
		    "Value reports left unsplit: the service's table of "
		    "values, or the replica's share of it, was full.",
		    offsetof(snap_service, values_unsplit) },
	};
	for (size_t f = 0; f < sizeof per_service / sizeof *per_service; f++) {
		allot__buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n",
		    per_service[f].name, per_service[f].help,
		    per_service[f].name, per_service[f].type);
		for (size_t i = 0; i < sn->nsvcs; i++) {
			uint64_t v;
			memcpy(&v,
			    (const char *) &sn->svcs[i] + per_service[f].off,
			    sizeof v);
			allot__buf_printf(
			    b, "%s{service=\"", per_service[f].name);
			allot__buf_label(b, sn->svcs[i].name);
			allot__buf_printf(b, "\"} %" PRIu64 "\n", v);
		}
	}
	allot__buf_printf(b,
	    "# HELP allotd_sessions Live sessions, all "
	    "services.\n# TYPE allotd_sessions gauge\nallotd_sessions %zu\n",
	    sn->nsessions);
	char help[160];
	for (size_t i = 0; i < sizeof quota_gauges / sizeof *quota_gauges;
	     i++) {
		quota_series(sn, b, quota_gauges[i].name, quota_gauges[i].help,
		    quota_gauges[i].f);
		if (legacy)
			quota_series(sn, b, quota_gauges[i].legacy,
			    legacy_help(
			        help, sizeof help, quota_gauges[i].name),
			    quota_gauges[i].f);
	}
}

void
allot__state_render_metrics(allot__state *st, allot__buf *b)
{
	snap sn = { 0 };
	pthread_mutex_lock(&st->mu);
	bool ok = snap_take(&sn, st, false);
	pthread_mutex_unlock(&st->mu);
	if (!ok) {
		b->oom = true;
		allot__arena_destroy(&sn.ar);
		return;
	}
	bool legacy = st->o.legacy_metric_names;
	metrics_config(&sn, b, legacy);
	for (size_t i = 0; i < sizeof sq_families / sizeof *sq_families; i++) {
		const struct sq_family_def *fd = &sq_families[i];
		sq_family(&sn, b, fd->name, fd->type, fd->help, fd->f);
		char help[160];
		if (legacy && fd->legacy != NULL)
			sq_family(&sn, b, fd->legacy, fd->type,
			    legacy_help(help, sizeof help, fd->name), fd->f);
	}
	allot__arena_destroy(&sn.ar);
}

/* ---- /status ---- */

/* `,"name":v` */
static void
put_num(allot__buf *b, const char *name, double v)
{
	allot__buf_printf(b, ",\"%s\":", name);
	allot__buf_num(b, v);
}

/* The opening of quota `q`'s object, with its configuration. */
static void
put_quota(allot__buf *b, bool comma, const snap_qcfg *qc)
{
	allot__buf_puts(b, comma ? ",{\"quota\":" : "{\"quota\":");
	allot__buf_json(b, qc->identity);
	if (qc->service != NULL) {
		allot__buf_puts(b, ",\"service\":");
		allot__buf_json(b, qc->service);
	}
	put_num(b, "rate", qc->rate);
	put_num(b, "burst", qc->burst);
	allot__buf_puts(b, ",\"priority\":");
	allot__buf_json(b, qc->priority);
}

/* The document up to the list of services. */
static void
status_head(const snap *sn, const allot__state_opts *o, allot__buf *b)
{
	allot__buf_printf(b,
	    "{\"version\":\"%s\",\"config\":{\"epoch\":%" PRIu64
	    ",\"digest\":\"%016" PRIx64 "\",\"path\":",
	    ALLOT_VERSION_STRING, sn->epoch, sn->digest);
	allot__buf_json(b, sn->path);
	allot__buf_printf(b,
	    ",\"loaded_at_ms\":%" PRId64 ",\"quotas\":%zu,"
	    "\"ceiling_rate\":",
	    sn->loaded_wall_ms, sn->nq);
	allot__buf_num(b, sn->ceiling_rate);
	allot__buf_printf(b,
	    "},\"settings\":{\"lease_ms\":%u,\"interval_ms\":"
	    "%u,\"expiry_intervals\":%u,\"allocator\":\"%s\"},"
	    "\"sessions\":%zu,\"services\":[",
	    o->lease_ms, o->interval_ms, o->expiry_intervals,
	    allot__alloc_name(&o->policy), sn->nsessions);
}

/* The replicas of one service. */
static void
status_replicas(const snap_service *svc, allot__buf *b)
{
	for (uint32_t j = 0; j < svc->nsess; j++) {
		const snap_replica *s = &svc->reps[j];
		allot__buf_printf(b,
		    "%s{\"session\":%" PRIu64 ",\"replica_id\":", j ? "," : "",
		    s->session);
		allot__buf_json(b, s->replica_id);
		allot__buf_puts(b, ",\"host\":");
		allot__buf_json(b, s->host);
		allot__buf_printf(b, ",\"pid\":%u,\"agent_version\":", s->pid);
		allot__buf_json(b, s->agent_version);
		allot__buf_printf(b,
		    ",\"restored\":%s,\"keys\":%u,"
		    "\"unknown_keys\":%u,\"last_seq\":%" PRIu64
		    ",\"last_seen_ms\":%" PRId64 ",\"silent_ms\":%" PRIu64 "}",
		    s->restored ? "true" : "false", s->keys, s->unknown_keys,
		    s->last_seq, s->last_seen_ms, s->silent_ms);
	}
}

/* Shadow would-denies (admitted, not denied) and the candidate's
 * evaluation of one quota of one service: "candidate" is null without
 * one; its percentage is of the tokens offered since it was set. */
static void
status_shadow(const squota *sq, const snap_qcfg *qc, allot__buf *b)
{
	allot__buf_printf(b, ",\"shadow\":%s", qc->shadow ? "true" : "false");
	put_num(b, "shadow_denied_per_s", sq->shadow_rate);
	allot__buf_printf(
	    b, ",\"shadow_denied_total\":%" PRIu64, sq->shadow_total);
	if (!(sq->cand_rate > 0)) {
		allot__buf_puts(b, ",\"candidate\":null");
		return;
	}
	allot__buf_puts(b, ",\"candidate\":{\"rate\":");
	allot__buf_num(b, sq->cand_rate);
	put_num(b, "burst", sq->cand_burst);
	put_num(b, "level", sq->cand_level);
	put_num(b, "denied_per_s", sq->cand_denied_rate);
	put_num(b, "denied", floor(sq->cand_denied));
	put_num(b, "offered", floor(sq->cand_offered));
	put_num(b, "denied_pct",
	    sq->cand_offered > 0 ? 100.0 * sq->cand_denied / sq->cand_offered :
	                           0);
	allot__buf_printf(b, ",\"since_ms\":%" PRId64 "}", sq->cand_since_ms);
}

/* One quota of one service, with its shares. */
static void
status_quota(const snap *sn, const snap_service *svc, size_t q, bool comma,
    allot__buf *b)
{
	const snap_quota *sqs = &svc->q[q];
	const squota *sq = &sqs->sq;
	const snap_qcfg *qc = &sn->qc[q];
	put_quota(b, comma, qc);
	put_num(b, "sum_rate", sq->granted_rate);
	put_num(b, "sum_burst", sq->granted_burst);
	put_num(b, "target_sum_rate", sq->target_sum_rate);
	put_num(b, "target_sum_burst", sq->target_sum_burst);
	put_num(b, "allocation_rate", sq->allowance);
	put_num(b, "burst_budget", sq->burst_budget);
	allot__buf_puts(b, ",\"bound_rate\":");
	put_bound(b, sq->bound_rate, true);
	allot__buf_puts(b, ",\"bound_burst\":");
	put_bound(b, sq->bound_burst, true);
	allot__buf_puts(b, ",\"overadmission_bound_ratio\":");
	put_bound(b, allot__bound_ratio(sq, qc->rate, qc->burst), true);
	allot__buf_printf(b, ",\"expired_counted\":%u", sq->counted_expired);
	allot__buf_printf(b,
	    ",\"holders\":%u,"
	    "\"admitted_per_s\":",
	    sq->nslots);
	allot__buf_num(b, sq->admitted_rate);
	put_num(b, "denied_per_s", sq->denied_rate);
	put_num(b, "utilization", sq->utilization);
	put_num(b, "level", sq->level);
	put_num(b, "demand", sq->demand_sum);
	/* Cluster: whether the leader learns it (a quota is always owned
	 * since one leader allocates them all; "owned" stays for readers
	 * of the old document). */
	allot__buf_printf(b, ",\"owned\":true,\"learning\":%s",
	    sqs->learning ? "true" : "false");
	allot__buf_printf(b,
	    ",\"admitted_total\":%" PRIu64 ",\"denied_total\":%" PRIu64,
	    sq->allowed_total, sq->denied_total);
	status_shadow(sq, qc, b);
	allot__buf_puts(b, ",\"shares\":[");
	for (uint32_t e = 0; e < sqs->nshares; e++) {
		const snap_share *s = &sqs->shares[e];
		allot__buf_printf(b,
		    "%s{\"session\":%" PRIu64 ",\"replica_id\":",
		    e > 0 ? "," : "", s->session);
		allot__buf_json(b, s->replica_id);
		put_num(b, "rate", s->rate);
		put_num(b, "burst", s->burst);
		put_num(b, "target_rate", s->target_rate);
		put_num(b, "target_burst", s->target_burst);
		put_num(b, "demand", s->demand);
		allot__buf_puts(b, "}");
	}
	allot__buf_puts(b, "]}");
}

/* After the services: every configured quota, the pid and the store. */
static void
status_tail(const snap *sn, const allot__store *store,
    const allot__store_stats *ss, allot__buf *b)
{
	/* For allotctl and the dashboard: every configured quota (also
	 * before any service registered), the pid (allotctl reload signals
	 * it) and the store's counters (its health). */
	allot__buf_printf(b, "],\"pid\":%ld,\"quotas\":[", (long) getpid());
	for (size_t q = 0; q < sn->nq; q++) {
		const snap_qcfg *qc = &sn->qc[q];
		put_quota(b, q > 0, qc);
		allot__buf_printf(
		    b, ",\"shadow\":%s", qc->shadow ? "true" : "false");
		if (qc->cand_rate > 0) {
			put_num(b, "candidate_rate", qc->cand_rate);
			put_num(b, "candidate_burst", qc->cand_burst);
		} else {
			allot__buf_puts(b,
			    ",\"candidate_rate\":null,\"candidate_burst\":"
			    "null");
		}
		allot__buf_puts(b, "}");
	}
	allot__buf_puts(b, "],\"store\":");
	if (store == NULL)
		allot__buf_puts(b, "null");
	else
		allot__buf_printf(b,
		    "{\"commits\":%" PRIu64 ",\"commit_failures\":%" PRIu64
		    ",\"pending_rows\":%" PRIu64 ",\"rows_written\":%" PRIu64
		    ",\"rows_dropped\":%" PRIu64 ",\"last_error\":%d}",
		    ss->commits, ss->commit_failures, ss->pending,
		    ss->rows_written, ss->rows_dropped, ss->last_error);
}

void
allot__state_render_status(allot__state *st, allot__buf *b)
{
	int64_t wall = allot__wall_ms();
	/* Taken before st->mu: the store has its own lock. */
	allot__store_stats ss;
	memset(&ss, 0, sizeof ss);
	allot__store_stats_get(st->o.store, &ss);
	snap sn = { 0 };
	pthread_mutex_lock(&st->mu);
	bool ok = snap_take(&sn, st, true);
	pthread_mutex_unlock(&st->mu);
	if (!ok) {
		b->oom = true;
		allot__arena_destroy(&sn.ar);
		return;
	}
	status_head(&sn, &st->o, b);
	for (size_t i = 0; i < sn.nsvcs; i++) {
		const snap_service *svc = &sn.svcs[i];
		allot__buf_puts(b, i ? ",{\"name\":" : "{\"name\":");
		allot__buf_json(b, svc->name);
		allot__buf_printf(b,
		    ",\"live_replicas\":%" PRIu64 ",\"replicas\":[",
		    svc->nsess);
		status_replicas(svc, b);
		allot__buf_puts(b, "],\"quotas\":[");
		bool comma = false;
		for (size_t q = 0; q < sn.nq; q++) {
			if (!svc->in[q])
				continue;
			status_quota(&sn, svc, q, comma, b);
			comma = true;
		}
		allot__buf_puts(b, "]}");
	}
	status_tail(&sn, st->o.store, &ss, b);
	allot__buf_printf(b, ",\"now_ms\":%" PRId64 "}\n", wall);
	allot__arena_destroy(&sn.ar);
}
