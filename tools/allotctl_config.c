/* SPDX-License-Identifier: MIT */
/*
 * allotctl check-config: validate a quota file offline with the loader
 * allotd and the agents use, then print its quotas and the sizing
 * arithmetic: the callers' rates against the global ceiling (the
 * overcommit), the correlated burst (every caller spending rate + burst
 * in the same second) and both as a share of a tested capacity. The
 * public API can load a file but does not expose the quotas inside it,
 * so this is the one part of allotctl that reads common/config.h.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include <allot/allot.h>

#include "allotctl.h"
#include "config.h"

/* What the sizing lines add up. */
typedef struct sums {
	double rate, burst; /* over the named callers */
	char *sr, *sb, *sf; /* rate, burst, rate + burst, as printed */
} sums;

/* The quota table: every caller, then the default. */
static void
print_quotas(const allot_config *cfg, sums *ret)
{
	ctl_table t;
	ctl_table_init(&t, "llrrrl");
	ctl_table_row(&t, ctl_strdup("QUOTA"), ctl_strdup("PRIORITY"),
	    ctl_strdup("RATE/S"), ctl_strdup("BURST"),
	    ctl_strdup("FIRST_SECOND"), ctl_strdup("MODE"));
	double sum_rate = 0, sum_burst = 0;
	for (size_t i = 0; i < cfg->ncallers; i++) {
		const allot__quota *q = &cfg->callers[i];
		sum_rate += q->rate;
		sum_burst += q->burst;
		ctl_table_row(&t, ctl_strdup(q->identity),
		    ctl_strdup(cfg->classes[q->priority]), ctl_num(q->rate),
		    ctl_num(q->burst), ctl_num(q->rate + q->burst),
		    ctl_strdup(q->shadow ? "shadow" : "enforce"));
	}
	const allot__quota *d = &cfg->def;
	ctl_table_row(&t,
	    ctl_strdup(d->shared ? "default (shared by unknown callers)" :
	                           "default (each unknown caller)"),
	    ctl_strdup(cfg->classes[d->priority]), ctl_num(d->rate),
	    ctl_num(d->burst), ctl_num(d->rate + d->burst),
	    ctl_strdup(d->shadow ? "shadow" : "enforce"));
	putchar('\n');
	ctl_table_print(&t, stdout);
	ctl_table_free(&t);
	ret->rate = sum_rate;
	ret->burst = sum_burst;
	ret->sr = ctl_num(sum_rate);
	ret->sb = ctl_num(sum_burst);
	ret->sf = ctl_num(sum_rate + sum_burst);
}

/* "allocation:" and "ceiling:"; returns the overcommit (0: no
 * ceiling). */
static double
print_allocation(const allot_config *cfg, const sums *s)
{
	const allot__quota *d = &cfg->def;
	size_t n = cfg->ncallers;
	printf("\nallocation: %zu caller%s, %s tokens/s in total", n,
	    n == 1 ? "" : "s", s->sr);
	char *dr = ctl_num(d->rate);
	if (d->shared) {
		char *all = ctl_num(s->rate + d->rate);
		printf(" (%s with the shared default's %s)", all, dr);
		free(all);
	} else {
		printf(" (plus %s per unknown caller: the default is not "
		       "shared)",
		    dr);
	}
	free(dr);
	putchar('\n');
	if (!(cfg->ceiling_rate > 0)) {
		printf("ceiling:    none: nothing bounds the callers "
		       "together (add quotas.global_ceiling)\n");
		return 0;
	}
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
	size_t n = cfg->ncallers;
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
	free(cap);
}

int
ctl_cmd_check_config(const ctl *c)
{
	const char *file = c->pos[0];
	char err[1024] = "";
	allot_config *cfg = NULL;
	int lrc = allot_config_load(file, err, sizeof err, &cfg);
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

	sums s;
	print_quotas(cfg, &s);
	double over = print_allocation(cfg, &s);
	print_burst(cfg, &s);
	if (c->capacity > 0)
		print_capacity(cfg, &s, c->capacity);
	int rc = 0;
	if (c->max_overcommit > 0 && cfg->ceiling_rate > 0 &&
	    over > c->max_overcommit) {
		char *r = ctl_ratio(over), *m = ctl_ratio(c->max_overcommit);
		ctl_fail("%s: overcommit %sx is above --max-overcommit %s",
		    file, r, m);
		free(r);
		free(m);
		rc = EXIT_FAIL;
	}
	free(s.sr);
	free(s.sb);
	free(s.sf);
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
