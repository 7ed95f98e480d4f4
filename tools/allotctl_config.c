/* SPDX-License-Identifier: MIT */
/*
 * allotctl check-config: validate a quota file offline with the loader
 * allotd and the agents use, then print its quotas and the sizing
 * arithmetic: the callers' rates against the global ceiling (the
 * overcommit), the correlated burst (every caller spending rate + burst
 * in the same second) and both as a share of a tested capacity, with the
 * margin the ceiling leaves below it. A file with services is shown once
 * per view: the top level, then each service's (allot__config_select()),
 * each with its own sizing. The public API can load a file but does not
 * expose the quotas inside it, so this (and allotctl diff, which calls
 * ctl_print_sizing()) is the part of allotctl that reads
 * common/config.h. A quota field it does not show in its own words is
 * shown on the quota's review line as a diff writes it.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>

#include "allotctl.h"
#include "bucket.h"
#include "config.h"
#include "config_diff.h"
#include "config_fields.h"

/* What the sizing lines add up. */
typedef struct sums {
	double rate, burst; /* over the named callers and endpoint quotas */
	size_t ncallers, nendpoint; /* caller-wide and endpoint quotas */
	char *sr, *sb, *sf; /* rate, burst, rate + burst, as printed */
} sums;

static const char *
unit_name(uint32_t unit_s)
{
	switch (unit_s) {
	case 60: return "min";
	case 3600: return "hour";
	case 86400: return "day";
	default: return "s";
	}
}

/* A rate as written: "1000/day". */
static char *
rate_as_written(double rate, uint32_t unit_s)
{
	uint32_t u = unit_s > 0 ? unit_s : 1;
	char *n = ctl_num(rate * u);
	char buf[96];
	snprintf(buf, sizeof buf, "%s/%s", n, unit_name(u));
	free(n);
	return ctl_strdup(buf);
}

static char *
candidate_text(const allot__quota *q)
{
	if (!(q->cand_rate > 0))
		return ctl_strdup("-");
	char *r = rate_as_written(q->cand_rate, q->unit_s);
	char *b = ctl_num(q->cand_burst);
	char buf[192];
	snprintf(buf, sizeof buf, "%s+%s", r, b);
	free(r);
	free(b);
	return ctl_strdup(buf);
}

/* What a quota does with a request: closed, unlimited, or its rate
 * enforced or in shadow. */
static const char *
mode_of(const allot__quota *q)
{
	switch (q->access) {
	case ALLOT__ACCESS_CLOSED: return "closed";
	case ALLOT__ACCESS_UNLIMITED: return "unlimited";
	case ALLOT__ACCESS_LIMITED: break;
	}
	return q->shadow ? "shadow" : "enforce";
}

static void
quota_row(
    ctl_table *t, const allot_config *cfg, const allot__quota *q, char *name)
{
	ctl_table_row(&t[0], name, ctl_strdup(cfg->classes[q->priority]),
	    ctl_num(q->rate), ctl_num(q->burst), ctl_num(q->rate + q->burst),
	    ctl_strdup(mode_of(q)), rate_as_written(q->rate, q->unit_s),
	    candidate_text(q));
}

/* The fields this file writes in its own words: the quota table's
 * columns and the review metadata (fallback and shared it has never
 * shown). Any other field of the field table (config_fields.c) is shown
 * on its quota's review line as a diff writes it, so that a new field
 * needs nothing here. */
static const char *const own_fields[] = { "tokens_per_second", "burst",
	"priority", "shadow", "candidate", "fallback", "shared", "owner",
	"reason", "expected_peak", "labels", "access" };

/* Field `f` of `q` as a diff writes it, when this file does not show it
 * in its own words and q has it; else NULL. The caller frees it. */
static char *
other_field(
    const allot_config *cfg, const allot__quota *q, const allot__qfield *f)
{
	for (size_t i = 0; i < sizeof own_fields / sizeof own_fields[0]; i++)
		if (strcmp(f->key, own_fields[i]) == 0)
			return NULL;
	char *t = allot__quota_field_text(cfg, q, f);
	if (t != NULL && t[0] == '\0') {
		free(t);
		t = NULL;
	}
	return t;
}

static bool
has_other_fields(const allot_config *cfg, const allot__quota *q)
{
	for (size_t i = 0; i < allot__nqfields; i++) {
		char *t = other_field(cfg, q, &allot__qfields[i]);
		free(t);
		if (t != NULL)
			return true;
	}
	return false;
}

/* "review:" lines: the metadata of every quota that has some, and its
 * fields this file does not show otherwise. */
static void
print_review(const allot_config *cfg)
{
	bool any = false;
	for (size_t i = 0; i <= cfg->ncallers; i++) {
		const allot__quota *q = i < cfg->ncallers ? &cfg->callers[i] :
		                                            &cfg->def;
		if (q->owner == NULL && q->reason == NULL &&
		    !(q->expected_peak > 0) && q->nlabels == 0 &&
		    !has_other_fields(cfg, q))
			continue;
		if (!any)
			printf("\nreview:\n");
		any = true;
		char key[ALLOT_IDENTITY_MAX + ALLOT__ENDPOINT_MAX + 2];
		allot__quota_key(q, key, sizeof key);
		printf("  %s:", key);
		const char *sep = " ";
		if (q->owner != NULL) {
			printf("%sowner %s", sep, q->owner);
			sep = "; ";
		}
		if (q->expected_peak > 0) {
			char *p = rate_as_written(q->expected_peak, q->unit_s);
			char *pct = ctl_pct(q->expected_peak, q->rate);
			printf("%sexpected peak %s (%s of the quota)", sep, p,
			    pct);
			free(p);
			free(pct);
			sep = "; ";
		}
		for (size_t j = 0; j < q->nlabels; j++) {
			printf("%s%s", j == 0 ? sep : " ", q->labels[j]);
			sep = "; ";
		}
		for (size_t j = 0; j < allot__nqfields; j++) {
			const allot__qfield *f = &allot__qfields[j];
			char *t = other_field(cfg, q, f);
			if (t == NULL)
				continue;
			printf("%s%s %s", sep, allot__qfield_label(f), t);
			sep = "; ";
			free(t);
		}
		if (q->reason != NULL)
			printf("%sreason: %s", sep, q->reason);
		putchar('\n');
	}
}

/* The quota table: every caller and endpoint quota, then the default. */
static void
print_quotas(const allot_config *cfg, sums *ret)
{
	ctl_table t;
	ctl_table_init(&t, "llrrrlrl");
	ctl_table_row(&t, ctl_strdup("QUOTA"), ctl_strdup("PRIORITY"),
	    ctl_strdup("RATE/S"), ctl_strdup("BURST"),
	    ctl_strdup("FIRST_SECOND"), ctl_strdup("MODE"),
	    ctl_strdup("AS_WRITTEN"), ctl_strdup("CANDIDATE"));
	*ret = (sums) { 0 };
	for (size_t i = 0; i < cfg->ncallers; i++) {
		const allot__quota *q = &cfg->callers[i];
		char key[ALLOT_IDENTITY_MAX + ALLOT__ENDPOINT_MAX + 2];
		allot__quota_key(q, key, sizeof key);
		ret->rate += q->rate;
		ret->burst += q->burst;
		if (q->endpoint != NULL)
			ret->nendpoint++;
		else
			ret->ncallers++;
		quota_row(&t, cfg, q, ctl_strdup(key));
	}
	quota_row(&t, cfg, &cfg->def,
	    ctl_strdup(cfg->def.shared ?
	            "default (shared by unknown callers)" :
	            "default (each unknown caller its own)"));
	putchar('\n');
	ctl_table_print(&t, stdout);
	ctl_table_free(&t);
	ret->sr = ctl_num(ret->rate);
	ret->sb = ctl_num(ret->burst);
	ret->sf = ctl_num(ret->rate + ret->burst);
}

/* "allocation:" and "ceiling:"; returns the overcommit (0: no
 * ceiling). */
static double
print_allocation(const allot_config *cfg, const sums *s)
{
	const allot__quota *d = &cfg->def;
	size_t n = s->ncallers;
	printf("\nallocation: %zu caller%s", n, n == 1 ? "" : "s");
	if (s->nendpoint > 0)
		printf(" and %zu endpoint quota%s", s->nendpoint,
		    s->nendpoint == 1 ? "" : "s");
	printf(", %s tokens/s in total", s->sr);
	char *dr = ctl_num(d->rate);
	char *all = ctl_num(s->rate + d->rate);
	if (d->shared)
		printf(" (%s with the shared default's %s)", all, dr);
	else
		printf(" (and %s more for each unknown caller: shared: false)",
		    dr);
	free(all);
	free(dr);
	putchar('\n');
	if (!(cfg->ceiling_rate > 0)) {
		printf("ceiling:    none: nothing bounds the callers "
		       "together (add quotas.global_ceiling)\n");
		return 0;
	}
	if (cfg->overcommit)
		printf("            (overcommit: true: one quota may exceed "
		       "the ceiling)\n");
	char *c = ctl_num(cfg->ceiling_rate);
	double over = s->rate / cfg->ceiling_rate;
	char *r = ctl_ratio(over);
	if (s->rate > cfg->ceiling_rate) {
		char *more = ctl_num(s->rate - cfg->ceiling_rate);
		printf("ceiling:    %s tokens/s: overcommitted %sx "
		       "(%s vs %s, %s tokens/s more than the ceiling)\n",
		    c, r, s->sr, c, more);
		free(more);
	} else {
		printf("ceiling:    %s tokens/s: not overcommitted "
		       "(%s vs %s, %.0f%% allocated)\n",
		    c, s->sr, c, 100 * over);
	}
	free(r);
	free(c);
	return over;
}

/* The reference's sizing: a caller with rate R and burst B that bursts
 * admits up to R + B in its first second (the bucket drains B while
 * refilling R). Correlated, every caller does so at once. */
static void
print_burst(const allot_config *cfg, const sums *s)
{
	size_t n = s->ncallers + s->nendpoint;
	printf("burst:      if every caller bursts together, the first "
	       "second admits up to sum(rate + burst) = %s + %s = %s tokens",
	    s->sr, s->sb, s->sf);
	bool equal = n > 1;
	for (size_t i = 1; i < n; i++)
		equal &= cfg->callers[i].rate == cfg->callers[0].rate &&
		    cfg->callers[i].burst == cfg->callers[0].burst;
	if (equal) {
		char *r = ctl_num(cfg->callers[0].rate);
		char *b = ctl_num(cfg->callers[0].burst);
		char *p = ctl_num(
		    cfg->callers[0].rate + cfg->callers[0].burst);
		printf(" (%zu callers x (%s + %s) = %zu x %s)", n, r, b, n, p);
		free(r);
		free(b);
		free(p);
	}
	putchar('\n');
	if (cfg->ceiling_rate > 0) {
		char *r = ctl_ratio((s->rate + s->burst) / cfg->ceiling_rate);
		printf("            %sx the ceiling for that second; "
		       "afterwards at most %s tokens/s\n",
		    r, s->sr);
		free(r);
	}
}

/* "capacity:", against --capacity RPS. */
static void
print_capacity(const allot_config *cfg, const sums *s, double capacity)
{
	char *cap = ctl_num(capacity);
	char *r = ctl_ratio((s->rate + s->burst) / capacity);
	printf("capacity:   %s requests/s tested: the allocation is "
	       "%.0f%% of it, the correlated first second %.0f%% "
	       "(%sx)\n",
	    cap, 100 * s->rate / capacity,
	    100 * (s->rate + s->burst) / capacity, r);
	free(r);
	if (cfg->default_weight != 1 || cfg->nendpoints > 0)
		printf("            (tokens are requests only where the "
		       "endpoint weight is 1; weighted endpoints admit fewer "
		       "requests)\n");
	if (cfg->ceiling_rate > 0) {
		char *c = ctl_num(cfg->ceiling_rate);
		if (cfg->ceiling_rate > capacity)
			printf(
			    "warning:    the ceiling (%s tokens/s) is above "
			    "the tested capacity (%s requests/s): it "
			    "cannot protect the service\n",
			    c, cap);
		else
			printf("margin:     the ceiling is %.0f%% of the "
			       "tested capacity, %.0f%% held in reserve\n",
			    100 * cfg->ceiling_rate / capacity,
			    100 * (1 - cfg->ceiling_rate / capacity));
		free(c);
	}
	free(cap);
}

/* A bucket holds at most ALLOT__TAU_MAX of refill (bucket.h): with a
 * rate per day, a burst of more than 13 days' worth acts as less. */
static void
print_refill_limits(const allot_config *cfg)
{
	double tau_s = (double) ALLOT__TAU_MAX / 1e9;
	for (size_t i = 0; i <= cfg->ncallers; i++) {
		const allot__quota *q = i < cfg->ncallers ? &cfg->callers[i] :
		                                            &cfg->def;
		if (!(q->burst / q->rate > tau_s))
			continue;
		char key[ALLOT_IDENTITY_MAX + ALLOT__ENDPOINT_MAX + 2];
		allot__quota_key(q, key, sizeof key);
		char *b = ctl_num(q->burst), *eff = ctl_num(q->rate * tau_s);
		printf("warning:    %s: burst %s takes %.0f days to refill; a "
		       "bucket holds at most %.0f days of refill, so it acts "
		       "as a burst of %s\n",
		    key, b, q->burst / q->rate / 86400, tau_s / 86400, eff);
		free(b);
		free(eff);
	}
}

double
ctl_print_sizing(const allot_config *cfg, double capacity)
{
	sums s;
	print_quotas(cfg, &s);
	print_review(cfg);
	print_refill_limits(cfg);
	double over = print_allocation(cfg, &s);
	print_burst(cfg, &s);
	if (capacity > 0)
		print_capacity(cfg, &s, capacity);
	free(s.sr);
	free(s.sb);
	free(s.sf);
	return over;
}

/* Exit 1 above --max-overcommit. */
static int
check_over(
    const ctl *c, const char *what, const allot_config *cfg, double over)
{
	if (!(c->max_overcommit > 0 && cfg->ceiling_rate > 0 &&
	        over > c->max_overcommit))
		return 0;
	char *r = ctl_ratio(over), *m = ctl_ratio(c->max_overcommit);
	ctl_fail(
	    "%s: overcommit %sx is above --max-overcommit %s", what, r, m);
	free(r);
	free(m);
	return EXIT_FAIL;
}

/* One view's quotas and sums as JSON (--json): what the text lists and
 * adds up, numbers as numbers. */
static json_object *
view_json(const allot_config *cfg)
{
	json_object *v = json_object_new_object();
	json_object *qs = json_object_new_array();
	double rate = 0, burst = 0;
	size_t ncallers = 0, nendpoint = 0;
	for (size_t i = 0; i <= cfg->ncallers; i++) {
		const allot__quota *q = i < cfg->ncallers ? &cfg->callers[i] :
		                                            &cfg->def;
		char key[512];
		allot__quota_key(q, key, sizeof key);
		json_object *o = json_object_new_object();
		json_object_object_add(
		    o, "quota", json_object_new_string(key));
		json_object_object_add(o, "priority",
		    json_object_new_string(cfg->classes[q->priority]));
		json_object_object_add(
		    o, "rate", json_object_new_double(q->rate));
		json_object_object_add(
		    o, "burst", json_object_new_double(q->burst));
		json_object_object_add(
		    o, "shadow", json_object_new_boolean(q->shadow));
		json_object_object_add(
		    o, "mode", json_object_new_string(mode_of(q)));
		json_object_array_add(qs, o);
		if (i == cfg->ncallers) {
			/* The default: one bucket, or one per unknown
			 * caller (shared: false). */
			json_object_object_add(
			    o, "shared", json_object_new_boolean(q->shared));
			break;
		}
		rate += q->rate;
		burst += q->burst;
		if (q->endpoint != NULL)
			nendpoint++;
		else
			ncallers++;
	}
	json_object_object_add(v, "quotas", qs);
	json_object_object_add(
	    v, "callers", json_object_new_int64((int64_t) ncallers));
	json_object_object_add(
	    v, "endpoint_quotas", json_object_new_int64((int64_t) nendpoint));
	json_object_object_add(v, "rate", json_object_new_double(rate));
	json_object_object_add(v, "burst", json_object_new_double(burst));
	json_object_object_add(
	    v, "first_second", json_object_new_double(rate + burst));
	bool ceil = cfg->ceiling_rate > 0;
	json_object_object_add(v, "ceiling",
	    ceil ? json_object_new_double(cfg->ceiling_rate) : NULL);
	json_object_object_add(v, "overcommit",
	    ceil ? json_object_new_double(rate / cfg->ceiling_rate) : NULL);
	return v;
}

/* check-config --json: {"file", "valid", "error"} for a bad file; else
 * also "digest", "classes", the top level's view and "services" (each
 * view with its "name" and "line"). --max-overcommit applies alike. */
static int
check_config_json(
    const ctl *c, const char *file, const allot_config *cfg, const char *err)
{
	json_object *o = json_object_new_object();
	json_object_object_add(o, "file", json_object_new_string(file));
	json_object_object_add(
	    o, "valid", json_object_new_boolean(cfg != NULL));
	if (cfg == NULL) {
		json_object_object_add(
		    o, "error", json_object_new_string(err));
		ctl_print_json(o);
		return EXIT_FAIL;
	}
	char digest[17];
	snprintf(digest, sizeof digest, "%016" PRIx64, cfg->digest);
	json_object_object_add(o, "digest", json_object_new_string(digest));
	json_object *cls = json_object_new_array();
	for (size_t i = 0; i < cfg->nclasses; i++)
		json_object_array_add(
		    cls, json_object_new_string(cfg->classes[i]));
	json_object_object_add(o, "classes", cls);
	json_object *top = view_json(cfg);
	int rc = 0;
	json_object *over = json_object_object_get(top, "overcommit");
	if (over != NULL && c->max_overcommit > 0 &&
	    json_object_get_double(over) > c->max_overcommit)
		rc = EXIT_FAIL;
	json_object_object_add(o, "view", top);
	json_object *svcs = json_object_new_array();
	for (size_t i = 0; i < cfg->nservices; i++) {
		allot_config *view = NULL;
		if (allot__config_select(cfg, cfg->services[i].name, &view) !=
		    ALLOT_OK)
			ctl_die_oom();
		json_object *v = view_json(view);
		json_object_object_add(
		    v, "name", json_object_new_string(cfg->services[i].name));
		json_object_object_add(
		    v, "line", json_object_new_int64(cfg->services[i].line));
		over = json_object_object_get(v, "overcommit");
		if (over != NULL && c->max_overcommit > 0 &&
		    json_object_get_double(over) > c->max_overcommit)
			rc = EXIT_FAIL;
		json_object_array_add(svcs, v);
		allot_config_free(view);
	}
	json_object_object_add(o, "services", svcs);
	ctl_print_json(o);
	return rc;
}

int
ctl_cmd_check_config(const ctl *c)
{
	const char *file = c->pos[0];
	char err[1024] = "";
	allot_config *cfg = NULL;
	int lrc = allot_config_load(file, err, sizeof err, &cfg);
	if (c->json) {
		if (lrc != ALLOT_OK && err[0] == '\0')
			snprintf(err, sizeof err, "%s: %s", file,
			    allot_strerror(lrc));
		int rc = check_config_json(
		    c, file, lrc == ALLOT_OK ? cfg : NULL, err);
		allot_config_free(cfg);
		return rc;
	}
	if (lrc != ALLOT_OK) {
		/* The loader's message is "FILE:LINE:COL: ...", the form
		 * editors and CI annotations understand: print it as is. */
		if (err[0] != '\0')
			fprintf(stderr, "%s\n", err);
		else
			fprintf(stderr, "%s: %s\n", file, allot_strerror(lrc));
		return EXIT_FAIL;
	}
	printf("%s: valid, digest %016" PRIx64 "\n", file, cfg->digest);
	printf("priority classes, shed first to last:");
	for (size_t i = 0; i < cfg->nclasses; i++)
		printf(" %s", cfg->classes[i]);
	putchar('\n');

	int rc = check_over(c, file, cfg, ctl_print_sizing(cfg, c->capacity));
	for (size_t i = 0; i < cfg->nservices; i++) {
		const char *name = cfg->services[i].name;
		allot_config *view = NULL;
		if (allot__config_select(cfg, name, &view) != ALLOT_OK) {
			ctl_fail("%s: out of memory", file);
			rc = EXIT_FAIL;
			break;
		}
		printf("\nservice %s (line %" PRIu32 "): the top level with "
		       "its section merged in\n",
		    name, cfg->services[i].line);
		char what[1024];
		snprintf(what, sizeof what, "%s: service %s", file, name);
		int r = check_over(
		    c, what, view, ctl_print_sizing(view, c->capacity));
		if (r != 0)
			rc = r;
		allot_config_free(view);
	}
	allot_config_free(cfg);
	return rc;
}

void
ctl_config_sizing(const ctl *c, const allot_config *cfg)
{
	sums s = { 0 };
	for (size_t i = 0; i < cfg->ncallers; i++) {
		s.rate += cfg->callers[i].rate;
		s.burst += cfg->callers[i].burst;
		if (cfg->callers[i].endpoint != NULL)
			s.nendpoint++;
		else
			s.ncallers++;
	}
	s.sr = ctl_num(s.rate);
	s.sb = ctl_num(s.burst);
	s.sf = ctl_num(s.rate + s.burst);
	print_allocation(cfg, &s);
	print_burst(cfg, &s);
	if (c->capacity > 0)
		print_capacity(cfg, &s, c->capacity);
	free(s.sr);
	free(s.sb);
	free(s.sf);
}
