/* SPDX-License-Identifier: MIT */
/*
 * The inspecting commands: status, replicas, quotas, shares and
 * top-denied (shadow would-denies and candidates are shown apart from
 * denials, which they never are). Each reads allotd's GET /status document
 * once (json-c) and prints it as a few lines or a table; none changes
 * anything. Also the json-c accessors the reload command uses on the same
 * document.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "allotctl.h"

json_object *
ctl_jget(json_object *o, const char *key)
{
	json_object *v = NULL;
	if (o == NULL || !json_object_is_type(o, json_type_object) ||
	    !json_object_object_get_ex(o, key, &v))
		return NULL;
	return v;
}

const char *
ctl_jstr(json_object *o, const char *key)
{
	json_object *v = ctl_jget(o, key);
	return v != NULL && json_object_is_type(v, json_type_string) ?
	    json_object_get_string(v) :
	    "";
}

double
ctl_jnum(json_object *o, const char *key)
{
	json_object *v = ctl_jget(o, key);
	if (v == NULL ||
	    !(json_object_is_type(v, json_type_int) ||
	        json_object_is_type(v, json_type_double)))
		return NAN;
	return json_object_get_double(v);
}

double
ctl_jnum0(json_object *o, const char *key)
{
	double v = ctl_jnum(o, key);
	return isfinite(v) ? v : 0;
}

static bool
jbool(json_object *o, const char *key)
{
	json_object *v = ctl_jget(o, key);
	return v != NULL && json_object_is_type(v, json_type_boolean) &&
	    json_object_get_boolean(v);
}

static size_t
jlen(json_object *arr)
{
	return arr != NULL && json_object_is_type(arr, json_type_array) ?
	    json_object_array_length(arr) :
	    0;
}

static json_object *
jat(json_object *arr, size_t i)
{
	return json_object_array_get_idx(arr, i);
}

json_object *
ctl_json_parse(const char *text, int depth, const char **ret_why)
{
	json_tokener *tok = json_tokener_new_ex(depth);
	if (tok == NULL)
		ctl_die_oom();
	json_object *doc = json_tokener_parse_ex(
	    tok, text, (int) strlen(text));
	enum json_tokener_error jerr = json_tokener_get_error(tok);
	json_tokener_free(tok);
	if (doc != NULL && jerr == json_tokener_success)
		return doc;
	json_object_put(doc);
	*ret_why = json_tokener_error_desc(jerr);
	return NULL;
}

void
ctl_print_json(json_object *o)
{
	puts(json_object_to_json_string_ext(
	    o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE));
	json_object_put(o);
}

/* A copy of `row` with "service" set (null: none): a row of a --json
 * answer. */
static json_object *
with_service(json_object *row, const char *service)
{
	json_object *o = NULL;
	if (json_object_deep_copy(row, &o, NULL) != 0 || o == NULL)
		ctl_die_oom();
	json_object_object_add(o, "service",
	    service != NULL ? json_object_new_string(service) : NULL);
	return o;
}

/* Fetch and parse /status. 0 and the document (the caller puts it), or
 * an exit code after saying why. */
int
ctl_get_status(const ctl *c, json_object **ret)
{
	char *body;
	int rc = ctl_http_get(c, "/status", &body);
	if (rc != 0)
		return rc;
	const char *why = "no config or services";
	json_object *doc = ctl_json_parse(body, 64, &why);
	free(body);
	if (doc == NULL || ctl_jget(doc, "config") == NULL ||
	    ctl_jget(doc, "services") == NULL) {
		ctl_fail(
		    "allotd at %s: /status is not the JSON document allotd "
		    "serves (%s)",
		    c->http, why);
		json_object_put(doc);
		return EXIT_UNREACHABLE;
	}
	*ret = doc;
	return 0;
}

/* Fetch /status and show it with `view`; the exit status. */
static int
with_status(const ctl *c, int (*view)(const ctl *c, json_object *doc))
{
	json_object *doc;
	int rc = ctl_get_status(c, &doc);
	if (rc != 0)
		return rc;
	rc = view(c, doc);
	json_object_put(doc);
	return rc;
}

static int
print_status(const ctl *c, json_object *doc)
{
	if (c->json) {
		ctl_print_json(json_object_get(doc));
		return 0;
	}
	json_object *cfg = ctl_jget(doc, "config");
	json_object *set = ctl_jget(doc, "settings");
	json_object *svcs = ctl_jget(doc, "services");
	json_object *store = ctl_jget(doc, "store");
	char *loaded = ctl_utc_ms((int64_t) ctl_jnum0(cfg, "loaded_at_ms"));
	char *ceil = ctl_num(ctl_jnum0(cfg, "ceiling_rate"));
	printf("allotd %s at %s", ctl_jstr(doc, "version"), c->http);
	if (isfinite(ctl_jnum(doc, "pid")))
		printf(" (pid %.0f)", ctl_jnum(doc, "pid"));
	printf("\nconfig    %s, epoch %.0f, digest %s, loaded %s\n",
	    ctl_jstr(cfg, "path"), ctl_jnum0(cfg, "epoch"),
	    ctl_jstr(cfg, "digest"), loaded);
	printf("quotas    %.0f", ctl_jnum0(cfg, "quotas"));
	if (ctl_jnum0(cfg, "ceiling_rate") > 0)
		printf(", global ceiling %s tokens/s\n", ceil);
	else
		printf(", no global ceiling\n");
	printf("settings  lease %.0f ms, sync interval %.0f ms, expiry after "
	       "%.0f intervals, allocator %s\n",
	    ctl_jnum0(set, "lease_ms"), ctl_jnum0(set, "interval_ms"),
	    ctl_jnum0(set, "expiry_intervals"), ctl_jstr(set, "allocator"));
	if (store == NULL || !json_object_is_type(store, json_type_object)) {
		printf("store     none\n");
	} else {
		double failures = ctl_jnum0(store, "commit_failures");
		double dropped = ctl_jnum0(store, "rows_dropped");
		bool bad = failures > 0 || dropped > 0;
		printf("store     %s: %.0f commits, %.0f failed",
		    bad ? "has had failures" : "ok",
		    ctl_jnum0(store, "commits"), failures);
		if (failures > 0)
			printf(" (last SQLite error %.0f)",
			    ctl_jnum0(store, "last_error"));
		printf(", %.0f rows pending, %.0f dropped\n",
		    ctl_jnum0(store, "pending_rows"), dropped);
	}
	size_t n = jlen(svcs);
	printf("sessions  %.0f live in %zu service%s\n",
	    ctl_jnum0(doc, "sessions"), n, n == 1 ? "" : "s");
	for (size_t i = 0; i < n; i++) {
		json_object *svc = jat(svcs, i);
		json_object *qs = ctl_jget(svc, "quotas");
		double adm = 0, den = 0, shd = 0;
		for (size_t q = 0; q < jlen(qs); q++) {
			adm += ctl_jnum0(jat(qs, q), "admitted_per_s");
			den += ctl_jnum0(jat(qs, q), "denied_per_s");
			shd += ctl_jnum0(jat(qs, q), "shadow_denied_per_s");
		}
		char *a = ctl_num(adm), *d = ctl_num(den);
		printf("  %s: %.0f replica%s, admitted %s tokens/s, denied %s "
		       "tokens/s",
		    ctl_jstr(svc, "name"), ctl_jnum0(svc, "live_replicas"),
		    ctl_jnum0(svc, "live_replicas") == 1 ? "" : "s", a, d);
		if (ctl_jnum0(cfg, "ceiling_rate") > 0) {
			char *p = ctl_pct(adm, ctl_jnum0(cfg, "ceiling_rate"));
			printf(" (%s of the ceiling)", p);
			free(p);
		}
		/* Shadow would-denies were admitted: apart, never in the
		 * denials. */
		if (shd > 0) {
			char *sh = ctl_num(shd);
			printf(", shadow would deny %s tokens/s", sh);
			free(sh);
		}
		putchar('\n');
		free(a);
		free(d);
	}
	free(loaded);
	free(ceil);
	return 0;
}

int
ctl_cmd_status(const ctl *c)
{
	return with_status(c, print_status);
}

/* Onto `out`, the rows of member `what` (an array) of every service of
 * /status (only `only`'s when it is not NULL), each with its service. */
static void
add_rows(
    json_object *out, json_object *svcs, const char *only, const char *what)
{
	for (size_t i = 0; i < jlen(svcs); i++) {
		json_object *svc = jat(svcs, i);
		const char *name = ctl_jstr(svc, "name");
		if (only != NULL && strcmp(name, only) != 0)
			continue;
		json_object *rows = ctl_jget(svc, what);
		for (size_t r = 0; r < jlen(rows); r++)
			json_object_array_add(
			    out, with_service(jat(rows, r), name));
	}
}

static int
print_replicas(const ctl *c, json_object *doc)
{
	const char *only = c->npos > 0 ? c->pos[0] : NULL;
	json_object *svcs = ctl_jget(doc, "services");
	if (c->json) {
		json_object *out = json_object_new_array();
		add_rows(out, svcs, only, "replicas");
		ctl_print_json(out);
		return 0;
	}
	ctl_table t;
	ctl_table_init(&t, "llrllrrrl");
	ctl_table_row(&t, ctl_strdup("SERVICE"), ctl_strdup("REPLICA"),
	    ctl_strdup("SESSION"), ctl_strdup("HOST"), ctl_strdup("AGENT"),
	    ctl_strdup("PID"), ctl_strdup("LAST_SEQ"), ctl_strdup("SILENT_MS"),
	    ctl_strdup("STATE"));
	for (size_t i = 0; i < jlen(svcs); i++) {
		json_object *svc = jat(svcs, i);
		if (only != NULL && strcmp(ctl_jstr(svc, "name"), only) != 0)
			continue;
		json_object *reps = ctl_jget(svc, "replicas");
		for (size_t r = 0; r < jlen(reps); r++) {
			json_object *x = jat(reps, r);
			const char *host = ctl_jstr(x, "host");
			const char *ver = ctl_jstr(x, "agent_version");
			ctl_table_row(&t, ctl_strdup(ctl_jstr(svc, "name")),
			    ctl_strdup(ctl_jstr(x, "replica_id")),
			    ctl_asprintf("%.0f", ctl_jnum0(x, "session")),
			    ctl_strdup(*host ? host : "-"),
			    ctl_strdup(*ver ? ver : "-"),
			    ctl_asprintf("%.0f", ctl_jnum0(x, "pid")),
			    ctl_asprintf("%.0f", ctl_jnum0(x, "last_seq")),
			    ctl_asprintf("%.0f", ctl_jnum0(x, "silent_ms")),
			    ctl_strdup(jbool(x, "restored") ?
			            "restored (placeholder)" :
			            "live"));
		}
	}
	if (t.nrows == 1)
		printf(only ? "no live replica of service \"%s\"\n" :
		              "no live replicas%s\n",
		    only ? only : "");
	else
		ctl_table_print(&t, stdout);
	ctl_table_free(&t);
	return 0;
}

int
ctl_cmd_replicas(const ctl *c)
{
	return with_status(c, print_replicas);
}

/* A quota's candidate for the tables: "RATE/s", with the share of the
 * offered tokens it would have denied when `eval` (a per-service quota
 * of /status) is set; "-" without one. */
static char *
cand_cell(json_object *x, bool eval)
{
	json_object *cand = ctl_jget(x, eval ? "candidate" : "candidate_rate");
	if (cand == NULL || json_object_is_type(cand, json_type_null))
		return ctl_strdup("-");
	double rate = eval ? ctl_jnum0(cand, "rate") :
	                     ctl_jnum0(x, "candidate_rate");
	char *r = ctl_num(rate);
	char *out = eval ? ctl_asprintf("%s/s: %.1f%% denied", r,
	                       ctl_jnum0(cand, "denied_pct")) :
	                   ctl_asprintf("%s/s", r);
	free(r);
	return out;
}

static int
print_quotas(const ctl *c, json_object *doc)
{
	const char *only = c->npos > 0 ? c->pos[0] : NULL;
	json_object *svcs = ctl_jget(doc, "services");
	if (c->json) {
		/* Each service's quotas; none registered: the configured
		 * ones, with service null. */
		json_object *out = json_object_new_array();
		json_object *qs = ctl_jget(doc, "quotas");
		for (size_t q = 0; jlen(svcs) == 0 && q < jlen(qs); q++)
			json_object_array_add(
			    out, with_service(jat(qs, q), NULL));
		add_rows(out, svcs, only, "quotas");
		ctl_print_json(out);
		return 0;
	}
	ctl_table t;
	if (jlen(svcs) == 0) {
		/* No service registered: the configured quotas. */
		json_object *qs = ctl_jget(doc, "quotas");
		ctl_table_init(&t, "llrrll");
		ctl_table_row(&t, ctl_strdup("QUOTA"), ctl_strdup("PRIORITY"),
		    ctl_strdup("RATE/S"), ctl_strdup("BURST"),
		    ctl_strdup("MODE"), ctl_strdup("CANDIDATE"));
		for (size_t q = 0; q < jlen(qs); q++) {
			json_object *x = jat(qs, q);
			ctl_table_row(&t, ctl_strdup(ctl_jstr(x, "quota")),
			    ctl_strdup(ctl_jstr(x, "priority")),
			    ctl_num(ctl_jnum0(x, "rate")),
			    ctl_num(ctl_jnum0(x, "burst")),
			    ctl_strdup(
			        jbool(x, "shadow") ? "shadow" : "enforce"),
			    cand_cell(x, false));
		}
		printf("no service has registered yet; the quotas of config "
		       "epoch %.0f:\n",
		    ctl_jnum0(ctl_jget(doc, "config"), "epoch"));
		ctl_table_print(&t, stdout);
		ctl_table_free(&t);
		return 0;
	}
	ctl_table_init(&t, "lllrrrrrrrrrl");
	ctl_table_row(&t, ctl_strdup("SERVICE"), ctl_strdup("QUOTA"),
	    ctl_strdup("PRIORITY"), ctl_strdup("RATE/S"), ctl_strdup("BURST"),
	    ctl_strdup("ADMITTED/S"), ctl_strdup("DENIED/S"),
	    ctl_strdup("UTIL"), ctl_strdup("GRANTED/S"), ctl_strdup("HOLDERS"),
	    ctl_strdup("DEMAND/S"), ctl_strdup("SHADOW/S"),
	    ctl_strdup("CANDIDATE"));
	for (size_t i = 0; i < jlen(svcs); i++) {
		json_object *svc = jat(svcs, i);
		if (only != NULL && strcmp(ctl_jstr(svc, "name"), only) != 0)
			continue;
		json_object *qs = ctl_jget(svc, "quotas");
		for (size_t q = 0; q < jlen(qs); q++) {
			json_object *x = jat(qs, q);
			ctl_table_row(&t, ctl_strdup(ctl_jstr(svc, "name")),
			    ctl_strdup(ctl_jstr(x, "quota")),
			    ctl_strdup(ctl_jstr(x, "priority")),
			    ctl_num(ctl_jnum0(x, "rate")),
			    ctl_num(ctl_jnum0(x, "burst")),
			    ctl_num(ctl_jnum0(x, "admitted_per_s")),
			    ctl_num(ctl_jnum0(x, "denied_per_s")),
			    ctl_asprintf(
			        "%.0f%%", 100 * ctl_jnum0(x, "utilization")),
			    ctl_num(ctl_jnum0(x, "sum_rate")),
			    ctl_asprintf("%.0f/%.0f", ctl_jnum0(x, "holders"),
			        ctl_jnum0(svc, "live_replicas")),
			    ctl_num(ctl_jnum0(x, "demand")),
			    jbool(x, "shadow") ||
			            ctl_jnum0(x, "shadow_denied_per_s") > 0 ?
			        ctl_num(ctl_jnum0(x, "shadow_denied_per_s")) :
			        ctl_strdup("-"),
			    cand_cell(x, true));
		}
	}
	if (t.nrows == 1)
		printf("no service \"%s\"\n", only);
	else
		ctl_table_print(&t, stdout);
	ctl_table_free(&t);
	return 0;
}

int
ctl_cmd_quotas(const ctl *c)
{
	return with_status(c, print_quotas);
}

/* Pass 0: `id` ends in "/CALLER"; pass 1: `id` contains CALLER. */
static bool
quota_hit(const char *id, const char *caller, int pass)
{
	size_t il = strlen(id), cl = strlen(caller);
	if (pass == 0)
		return il > cl && id[il - cl - 1] == '/' &&
		    strcmp(id + il - cl, caller) == 0;
	return strstr(id, caller) != NULL;
}

/* The quota `caller` names: its exact identity, or else the one quota
 * whose identity ends in "/CALLER", or else the one that contains
 * CALLER. NULL (after saying why) when none or several match. */
static const char *
match_quota(json_object *doc, const char *caller)
{
	json_object *qs = ctl_jget(doc, "quotas");
	size_t n = jlen(qs);
	for (size_t q = 0; q < n; q++)
		if (strcmp(ctl_jstr(jat(qs, q), "quota"), caller) == 0)
			return ctl_jstr(jat(qs, q), "quota");
	for (int pass = 0; pass < 2; pass++) {
		const char *found = NULL;
		size_t hits = 0;
		for (size_t q = 0; q < n; q++) {
			const char *id = ctl_jstr(jat(qs, q), "quota");
			if (quota_hit(id, caller, pass)) {
				hits++;
				found = id;
			}
		}
		if (hits == 1)
			return found;
		if (hits > 1) {
			ctl_fail("\"%s\" matches %zu quotas; give the whole "
			         "identity:",
			    caller, hits);
			for (size_t q = 0; q < n; q++) {
				const char *id = ctl_jstr(jat(qs, q), "quota");
				if (quota_hit(id, caller, pass))
					fprintf(stderr, "    %s\n", id);
			}
			return NULL;
		}
	}
	ctl_fail("no quota matches \"%s\"; the quotas are:", caller);
	for (size_t q = 0; q < n; q++)
		fprintf(stderr, "    %s\n", ctl_jstr(jat(qs, q), "quota"));
	return NULL;
}

static int
print_shares(const ctl *c, json_object *doc)
{
	const char *quota = match_quota(doc, c->pos[0]);
	if (quota == NULL)
		return EXIT_FAIL;
	json_object *svcs = ctl_jget(doc, "services");
	size_t shown = 0;
	json_object *out = c->json ? json_object_new_array() : NULL;
	for (size_t i = 0; i < jlen(svcs); i++) {
		json_object *svc = jat(svcs, i);
		json_object *qs = ctl_jget(svc, "quotas");
		for (size_t q = 0; q < jlen(qs); q++) {
			json_object *x = jat(qs, q);
			if (strcmp(ctl_jstr(x, "quota"), quota) != 0)
				continue;
			if (out != NULL) {
				json_object_array_add(out,
				    with_service(x, ctl_jstr(svc, "name")));
				continue;
			}
			json_object *sh = ctl_jget(x, "shares");
			double rate = ctl_jnum0(x, "rate");
			double sum = 0;
			ctl_table t;
			ctl_table_init(&t, "lrrrrr");
			ctl_table_row(&t, ctl_strdup("REPLICA"),
			    ctl_strdup("SESSION"), ctl_strdup("RATE/S"),
			    ctl_strdup("BURST"), ctl_strdup("TARGET/S"),
			    ctl_strdup("OF_QUOTA"));
			for (size_t s = 0; s < jlen(sh); s++) {
				json_object *y = jat(sh, s);
				sum += ctl_jnum0(y, "rate");
				ctl_table_row(&t,
				    ctl_strdup(ctl_jstr(y, "replica_id")),
				    ctl_asprintf(
				        "%.0f", ctl_jnum0(y, "session")),
				    ctl_num(ctl_jnum0(y, "rate")),
				    ctl_num(ctl_jnum0(y, "burst")),
				    ctl_num(ctl_jnum0(y, "target_rate")),
				    ctl_pct(ctl_jnum0(y, "rate"), rate));
			}
			char *r = ctl_num(rate),
			     *b = ctl_num(ctl_jnum0(x, "burst"));
			char *s = ctl_num(sum), *p = ctl_pct(sum, rate);
			printf("%s%s in service %s: quota %s tokens/s, burst "
			       "%s; %zu replica%s hold %s tokens/s (%s)\n",
			    shown ? "\n" : "", quota, ctl_jstr(svc, "name"), r,
			    b, jlen(sh), jlen(sh) == 1 ? "" : "s", s, p);
			if (jlen(sh) > 0)
				ctl_table_print(&t, stdout);
			free(r);
			free(b);
			free(s);
			free(p);
			ctl_table_free(&t);
			shown++;
		}
	}
	if (out != NULL)
		ctl_print_json(out);
	else if (shown == 0)
		printf("%s: no service has registered, so no replica holds a "
		       "share yet\n",
		    quota);
	return 0;
}

int
ctl_cmd_shares(const ctl *c)
{
	return with_status(c, print_shares);
}

typedef struct denied_row {
	const char *service;
	const char *quota;
	double denied_s, admitted_s, denied_total, admitted_total;
} denied_row;

static int
cmp_denied(const void *a, const void *b)
{
	const denied_row *x = a, *y = b;
	if (x->denied_s != y->denied_s)
		return x->denied_s < y->denied_s ? 1 : -1;
	if (x->denied_total != y->denied_total)
		return x->denied_total < y->denied_total ? 1 : -1;
	return strcmp(x->quota, y->quota);
}

static int
print_top_denied(const ctl *c, json_object *doc)
{
	json_object *svcs = ctl_jget(doc, "services");
	denied_row *rows = NULL;
	size_t n = 0;
	for (size_t i = 0; i < jlen(svcs); i++) {
		json_object *svc = jat(svcs, i);
		json_object *qs = ctl_jget(svc, "quotas");
		for (size_t q = 0; q < jlen(qs); q++) {
			json_object *x = jat(qs, q);
			denied_row r = {
				.service = ctl_jstr(svc, "name"),
				.quota = ctl_jstr(x, "quota"),
				.denied_s = ctl_jnum0(x, "denied_per_s"),
				.admitted_s = ctl_jnum0(x, "admitted_per_s"),
				.denied_total = ctl_jnum0(x, "denied_total"),
				.admitted_total = ctl_jnum0(
				    x, "admitted_total"),
			};
			if (r.denied_s <= 0 && r.denied_total <= 0)
				continue;
			rows = ctl_realloc(rows, (n + 1) * sizeof *rows);
			rows[n++] = r;
		}
	}
	if (c->json) {
		qsort(rows, n, sizeof *rows, cmp_denied);
		json_object *out = json_object_new_array();
		for (size_t i = 0; i < n && (long) i < c->limit; i++) {
			json_object *o = json_object_new_object();
			json_object_object_add(o, "service",
			    json_object_new_string(rows[i].service));
			json_object_object_add(
			    o, "quota", json_object_new_string(rows[i].quota));
			json_object_object_add(o, "denied_per_s",
			    json_object_new_double(rows[i].denied_s));
			json_object_object_add(o, "admitted_per_s",
			    json_object_new_double(rows[i].admitted_s));
			json_object_object_add(o, "denied_total",
			    json_object_new_double(rows[i].denied_total));
			json_object_object_add(o, "admitted_total",
			    json_object_new_double(rows[i].admitted_total));
			json_object_array_add(out, o);
		}
		ctl_print_json(out);
	} else if (n == 0) {
		printf("nobody has been denied since allotd started\n");
	} else {
		qsort(rows, n, sizeof *rows, cmp_denied);
		ctl_table t;
		ctl_table_init(&t, "llrrrrr");
		ctl_table_row(&t, ctl_strdup("SERVICE"), ctl_strdup("QUOTA"),
		    ctl_strdup("DENIED/S"), ctl_strdup("ADMITTED/S"),
		    ctl_strdup("DENIED_NOW"), ctl_strdup("DENIED_TOTAL"),
		    ctl_strdup("DENIED_ALL"));
		for (size_t i = 0; i < n && (long) i < c->limit; i++)
			ctl_table_row(&t, ctl_strdup(rows[i].service),
			    ctl_strdup(rows[i].quota),
			    ctl_num(rows[i].denied_s),
			    ctl_num(rows[i].admitted_s),
			    ctl_pct(rows[i].denied_s,
			        rows[i].denied_s + rows[i].admitted_s),
			    ctl_num(rows[i].denied_total),
			    ctl_pct(rows[i].denied_total,
			        rows[i].denied_total +
			            rows[i].admitted_total));
		ctl_table_print(&t, stdout);
		ctl_table_free(&t);
	}
	free(rows);
	return 0;
}

int
ctl_cmd_top_denied(const ctl *c)
{
	return with_status(c, print_top_denied);
}
