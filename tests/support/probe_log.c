/* SPDX-License-Identifier: MIT */
/*
 * Reading and merging agent-probe logs: see probe_log.h.
 */
#include "probe_log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One parsed row set of one file: the slot times first, to size the
 * run, then the values. */
typedef struct row {
	uint64_t t;
	char kind; /* 'S' or 'K' */
	char caller[64];
	double rate, granted;
	uint64_t epoch, allowed, denied, stale, switches;
} row;

static int
read_rows(const char *path, row **ret, size_t *ret_n)
{
	FILE *f = fopen(path, "r");
	if (f == NULL) {
		fprintf(stderr, "%s: cannot read\n", path);
		return -1;
	}
	size_t n = 0, cap = 1024;
	row *v = malloc(cap * sizeof *v);
	char line[256];
	int lineno = 0;
	while (v != NULL && fgets(line, sizeof line, f) != NULL) {
		lineno++;
		if (n == cap) {
			row *nv = realloc(v, 2 * cap * sizeof *v);
			if (nv == NULL) {
				free(v);
				v = NULL;
				break;
			}
			v = nv;
			cap *= 2;
		}
		row *r = &v[n];
		memset(r, 0, sizeof *r);
		int conn, fb;
		uint64_t nl, fe;
		if (line[0] == 'S' &&
		    sscanf(line,
		        "S %" SCNu64 " %" SCNu64 " %d %" SCNu64 " %" SCNu64
		        " %" SCNu64 " %" SCNu64,
		        &r->t, &r->epoch, &conn, &r->switches, &r->stale, &nl,
		        &fe) == 7)
			r->kind = 'S';
		else if (line[0] == 'K' &&
		    sscanf(line,
		        "K %" SCNu64 " %63s %lf %" SCNu64 " %" SCNu64
		        " %d %lf",
		        &r->t, r->caller, &r->rate, &r->allowed, &r->denied,
		        &fb, &r->granted) == 7)
			r->kind = 'K';
		else if (strchr(line, '\n') == NULL && feof(f))
			continue; /* a last row cut short by a kill */
		else {
			fprintf(stderr, "%s:%d:1: malformed probe row\n", path,
			    lineno);
			free(v);
			fclose(f);
			return -1;
		}
		n++;
	}
	fclose(f);
	if (v == NULL)
		return -1;
	*ret = v;
	*ret_n = n;
	return 0;
}

int
probe_load(probe_run *r, const char *const *paths, int n, const char *hot,
    const char *calm)
{
	memset(r, 0, sizeof *r);
	if (n < 1 || n > PROBE_MAX_AGENTS)
		return -1;
	row *rows[PROBE_MAX_AGENTS] = { NULL };
	size_t nrows[PROBE_MAX_AGENTS] = { 0 };
	uint64_t lo = UINT64_MAX, hi = 0;
	int rc = -1;
	for (int i = 0; i < n; i++) {
		if (read_rows(paths[i], &rows[i], &nrows[i]) != 0)
			goto out;
		for (size_t k = 0; k < nrows[i]; k++) {
			lo = rows[i][k].t < lo ? rows[i][k].t : lo;
			hi = rows[i][k].t > hi ? rows[i][k].t : hi;
		}
	}
	if (lo > hi)
		lo = hi = 0;
	r->n = n;
	r->t0 = lo / 10 * 10;
	r->nslots = (size_t) ((hi - r->t0) / 10 + 1);
	for (int i = 0; i < n; i++) {
		probe_agent *a = &r->a[i];
		size_t s = r->nslots;
		a->hot_rate = calloc(s, sizeof *a->hot_rate);
		a->hot_allowed = calloc(s, sizeof(uint64_t));
		a->calm_allowed = calloc(s, sizeof(uint64_t));
		a->calm_denied = calloc(s, sizeof(uint64_t));
		a->epoch = calloc(s, sizeof(uint64_t));
		if (!a->hot_rate || !a->hot_allowed || !a->calm_allowed ||
		    !a->calm_denied || !a->epoch)
			goto out;
		/* Rows come in time order; fill each slot from its row,
		 * then carry forward over the gaps. */
		uint8_t *seen = calloc(s, 1);
		if (seen == NULL)
			goto out;
		uint64_t last = 0;
		for (size_t k = 0; k < nrows[i]; k++) {
			const row *w = &rows[i][k];
			size_t j = (size_t) ((w->t - r->t0) / 10);
			seen[j] = 1;
			if (w->kind == 'S') {
				/* The epoch as it went, row by row. */
				if (w->epoch < last && a->epoch_drops++ == 0)
					a->first_drop_at = w->t;
				last = w->epoch;
				a->epoch[j] = w->epoch;
				a->stale_epoch = w->stale;
				a->switches = w->switches;
			} else if (strcmp(w->caller, hot) == 0) {
				a->hot_rate[j] = w->rate;
				a->hot_allowed[j] = w->allowed;
			} else if (strcmp(w->caller, calm) == 0) {
				a->calm_allowed[j] = w->allowed;
				a->calm_denied[j] = w->denied;
			}
		}
		for (size_t j = 1; j < s; j++)
			if (!seen[j]) {
				a->hot_rate[j] = a->hot_rate[j - 1];
				a->hot_allowed[j] = a->hot_allowed[j - 1];
				a->calm_allowed[j] = a->calm_allowed[j - 1];
				a->calm_denied[j] = a->calm_denied[j - 1];
				a->epoch[j] = a->epoch[j - 1];
			}
		free(seen);
	}
	rc = 0;
out:
	for (int i = 0; i < n; i++)
		free(rows[i]);
	if (rc != 0)
		probe_free(r);
	return rc;
}

void
probe_free(probe_run *r)
{
	for (int i = 0; i < PROBE_MAX_AGENTS; i++) {
		probe_agent *a = &r->a[i];
		free(a->hot_rate);
		free(a->hot_allowed);
		free(a->calm_allowed);
		free(a->calm_denied);
		free(a->epoch);
	}
	memset(r, 0, sizeof *r);
}

/* The slot range of [from, to], clamped; false when empty. */
static bool
span(const probe_run *r, uint64_t from, uint64_t to, size_t *ret_a,
    size_t *ret_b)
{
	if (r->nslots == 0)
		return false;
	uint64_t end = r->t0 + (r->nslots - 1) * 10;
	if (to < r->t0 || from > end || from > to)
		return false;
	*ret_a = from <= r->t0 ? 0 : (size_t) ((from - r->t0) / 10);
	*ret_b = to >= end ? r->nslots - 1 : (size_t) ((to - r->t0) / 10);
	return true;
}

double
probe_max_sum(const probe_run *r, uint64_t from, uint64_t to, uint64_t *ret_at)
{
	size_t a, b;
	double best = 0;
	uint64_t at = 0;
	if (span(r, from, to, &a, &b))
		for (size_t j = a; j <= b; j++) {
			double sum = 0;
			for (int i = 0; i < r->n; i++)
				sum += r->a[i].hot_rate[j];
			if (sum > best) {
				best = sum;
				at = r->t0 + j * 10;
			}
		}
	if (ret_at != NULL)
		*ret_at = at;
	return best;
}

static uint64_t
delta(const probe_run *r, uint64_t *const *col, uint64_t from, uint64_t to)
{
	size_t a, b;
	if (!span(r, from, to, &a, &b))
		return 0;
	uint64_t sum = 0;
	for (int i = 0; i < r->n; i++)
		sum += col[i][b] - col[i][a];
	return sum;
}

uint64_t
probe_calm_denied(const probe_run *r, uint64_t from, uint64_t to)
{
	uint64_t *col[PROBE_MAX_AGENTS];
	for (int i = 0; i < r->n; i++)
		col[i] = r->a[i].calm_denied;
	return delta(r, col, from, to);
}

uint64_t
probe_calm_allowed(const probe_run *r, uint64_t from, uint64_t to)
{
	uint64_t *col[PROBE_MAX_AGENTS];
	for (int i = 0; i < r->n; i++)
		col[i] = r->a[i].calm_allowed;
	return delta(r, col, from, to);
}

double
probe_over(const probe_run *r, uint64_t from, uint64_t to, double rate,
    double burst, uint64_t w_ms)
{
	size_t a, b;
	if (!span(r, from, to, &a, &b))
		return 0;
	size_t w = (size_t) (w_ms / 10);
	double best = -burst;
	for (size_t j = a; j <= b; j++) {
		size_t k = j + w <= b ? j + w : b;
		uint64_t got = 0;
		for (int i = 0; i < r->n; i++)
			got += r->a[i].hot_allowed[k] - r->a[i].hot_allowed[j];
		double over = (double) got -
		    (rate * (double) (k - j) * 10 / 1000.0 + burst);
		if (over > best)
			best = over;
		if (k == b)
			break;
	}
	return best;
}

/* The whole file, NUL terminated (malloc'd), or NULL. */
static char *
read_all(const char *path)
{
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return NULL;
	size_t cap = 1 << 16, len = 0;
	char *buf = malloc(cap + 1);
	for (size_t n;
	     buf != NULL && (n = fread(buf + len, 1, cap - len, f)) > 0;) {
		len += n;
		if (len == cap) {
			char *nb = realloc(buf, 2 * cap + 1);
			if (nb == NULL) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = nb;
			cap *= 2;
		}
	}
	fclose(f);
	if (buf != NULL)
		buf[len] = '\0';
	return buf;
}

bool
probe_last(const char *path, uint64_t *ret_epoch, bool *ret_connected,
    bool *ret_granted)
{
	char *text = read_all(path);
	if (text == NULL)
		return false;
	char *s = NULL;
	for (char *p = strstr(text, "S "); p != NULL;
	     p = strstr(p + 1, "\nS "))
		s = p[0] == '\n' ? p + 1 : p;
	uint64_t t, e;
	int conn = 0;
	bool ok = s != NULL &&
	    sscanf(s, "S %" SCNu64 " %" SCNu64 " %d", &t, &e, &conn) == 3;
	bool granted = ok;
	/* The K rows after the last S row: that sample's callers. */
	for (char *p = s;
	     ok && p != NULL && (p = strstr(p, "\nK ")) != NULL;) {
		p++;
		double rate, g = 0;
		char who[64];
		uint64_t t2, a, d;
		int fb;
		if (sscanf(p,
		        "K %" SCNu64 " %63s %lf %" SCNu64 " %" SCNu64
		        " %d %lf",
		        &t2, who, &rate, &a, &d, &fb, &g) == 7 &&
		    g <= 0)
			granted = false;
	}
	free(text);
	if (ok) {
		*ret_epoch = e;
		*ret_connected = conn == 1;
		*ret_granted = granted;
	}
	return ok;
}

uint64_t
probe_low_epoch(const probe_run *r, uint64_t t)
{
	size_t a, b;
	if (!span(r, t, t, &a, &b))
		return 0;
	uint64_t low = UINT64_MAX;
	for (int i = 0; i < r->n; i++)
		if (r->a[i].epoch[a] < low)
			low = r->a[i].epoch[a];
	return low;
}
