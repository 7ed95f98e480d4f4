/* SPDX-License-Identifier: MIT */
/*
 * The load generator's reports: each second the main thread copies every
 * caller's counters out (a snapshot, with the deltas since the last) and
 * appends one JSON line to --stats-file; at the end the same shape goes
 * to stdout with --json, or a table. Strings go through the project's one
 * JSON string writer (common/json.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "json.h"
#include "loadgen.h"
#include "loadgen_engine.h"

static void
counts_sub(counts *d, const counts *a, const counts *b)
{
#define SUB_FIELD(f) d->f = a->f - b->f;
	COUNT_FIELDS(SUB_FIELD)
}

static void
counts_add(counts *d, const counts *a)
{
#define ADD_FIELD(f) d->f += a->f;
	COUNT_FIELDS(ADD_FIELD)
}

static void
tcounts_sub(tcounts *d, const tcounts *a, const tcounts *b)
{
	TCOUNT_FIELDS(SUB_FIELD)
}

static void
tcounts_add(tcounts *d, const tcounts *a)
{
	TCOUNT_FIELDS(ADD_FIELD)
}

void
lg_take_snapshot(caller *c, snap *s)
{
	pthread_mutex_lock(&c->mu);
	s->total = c->c;
	memcpy(s->ttotal, c->t, sizeof s->ttotal);
	s->hlast = c->hist_last;
	s->htotal = c->hist_total;
	lg_hist_reset(&c->hist_last);
	s->inflight = c->inflight_now;
	s->waiting = c->waiting_now;
	memcpy(s->last_error, c->last_error, sizeof s->last_error);
	pthread_mutex_unlock(&c->mu);
	counts_sub(&s->last, &s->total, &c->prev_c);
	c->prev_c = s->total;
	for (size_t i = 0; i < LG_MAX_TARGETS; i++) {
		tcounts_sub(&s->tlast[i], &s->ttotal[i], &c->prev_t[i]);
		c->prev_t[i] = s->ttotal[i];
	}
}

static void
json_latency(FILE *f, const lg_hist *h, bool extra)
{
	fprintf(f, "\"latency_ms\":{\"p50\":%.3f,\"p90\":%.3f,\"p99\":%.3f",
	    (double) lg_hist_percentile(h, 50) / 1000.0,
	    (double) lg_hist_percentile(h, 90) / 1000.0,
	    (double) lg_hist_percentile(h, 99) / 1000.0);
	if (extra)
		fprintf(f, ",\"max\":%.3f,\"mean\":%.3f",
		    (double) h->max_us / 1000.0,
		    h->count > 0 ?
		        (double) h->sum_us / (double) h->count / 1000.0 :
		        0.0);
	fputc('}', f);
}

static void
json_counts(FILE *f, const counts *c, const lg_hist *h, bool extra)
{
	bool first = true;

	fputc('{', f);
#define JSON_FIELD(x)                                                \
	fprintf(f, "%s\"" #x "\":%" PRIu64, first ? "" : ",", c->x); \
	first = false;
	COUNT_FIELDS(JSON_FIELD)
	fputc(',', f);
	json_latency(f, h, extra);
	fputc('}', f);
}

static void
json_tcounts(FILE *f, const tcounts *c)
{
	bool first = true;

	fputc('{', f);
	TCOUNT_FIELDS(JSON_FIELD)
	fputc('}', f);
}

/*
 * One report: the shape of a --stats-file line (and, with final set, of
 * the --json summary). `dt` is the length of the interval "last" covers.
 */
void
lg_json_report(FILE *f, snap *snaps, double t, double dt, bool final,
    const char *stopped_by)
{
	struct timespec wall;
	tcounts tl[LG_MAX_TARGETS], tt[LG_MAX_TARGETS];
	size_t nt;
	uint64_t sent = 0;

	clock_gettime(CLOCK_REALTIME, &wall);
	memset(tl, 0, sizeof tl);
	memset(tt, 0, sizeof tt);
	fprintf(f, "{\"t\":%.3f,\"dt\":%.3f,\"unix\":%.3f,\"final\":%s", t, dt,
	    (double) wall.tv_sec + (double) wall.tv_nsec / 1e9,
	    final ? "true" : "false");
	if (final)
		fprintf(f, ",\"stopped_by\":\"%s\"", stopped_by);
	for (size_t i = 0; i < lg.ncallers; i++)
		sent += snaps[i].total.sent;
	fprintf(f, ",\"attempts_sent\":%" PRIu64 ",\"max_requests\":%" PRIu64,
	    sent, lg.o.max_requests);
	fputs(",\"callers\":[", f);
	pthread_mutex_lock(&lg.tmu);
	nt = lg.ntargets;
	for (size_t i = 0; i < lg.ncallers; i++) {
		const caller *c = &lg.callers[i];
		snap *s = &snaps[i];
		bool first = true;

		fprintf(f, "%s{\"name\":", i ? "," : "");
		allot__json_fputs(f, c->spec.name);
		fprintf(f,
		    ",\"rate\":%g,\"concurrency\":%u,\"cert\":%s,"
		    "\"inflight\":%u,\"waiting\":%u,\"last\":",
		    c->spec.rate, c->spec.concurrency,
		    c->spec.cert[0] != '\0' ? "true" : "false", s->inflight,
		    s->waiting);
		json_counts(f, &s->last, &s->hlast, false);
		fputs(",\"total\":", f);
		json_counts(f, &s->total, &s->htotal, true);
		fputs(",\"targets\":{", f);
		for (size_t j = 0; j < nt; j++) {
			tcounts_add(&tl[j], &s->tlast[j]);
			tcounts_add(&tt[j], &s->ttotal[j]);
			if (s->ttotal[j].sent == 0)
				continue;
			fprintf(f, "%s", first ? "" : ",");
			first = false;
			allot__json_fputs(f, lg.turl[j]);
			fputs(":{\"last\":", f);
			json_tcounts(f, &s->tlast[j]);
			fputs(",\"total\":", f);
			json_tcounts(f, &s->ttotal[j]);
			fputc('}', f);
		}
		fputc('}', f);
		if (final) {
			fputs(",\"last_error\":", f);
			allot__json_fputs(f, s->last_error);
		}
		fputc('}', f);
	}
	fputs("],\"targets\":[", f);
	for (size_t j = 0; j < nt; j++) {
		fprintf(f, "%s{\"url\":", j ? "," : "");
		allot__json_fputs(f, lg.turl[j]);
		fprintf(f, ",\"active\":%s,\"last\":",
		    lg.tactive[j] ? "true" : "false");
		json_tcounts(f, &tl[j]);
		fputs(",\"total\":", f);
		json_tcounts(f, &tt[j]);
		fputc('}', f);
	}
	pthread_mutex_unlock(&lg.tmu);
	fputs("]}", f);
}

/* Write one JSON line to the stats file in a single write(), so that a
 * reader tailing it never sees half a line. */
void
lg_stats_line(
    snap *snaps, double t, double dt, bool final, const char *stopped_by)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *m;

	if (lg.stats == NULL)
		return;
	m = open_memstream(&buf, &len);
	if (m == NULL)
		return;
	lg_json_report(m, snaps, t, dt, final, stopped_by);
	fputc('\n', m);
	fclose(m);
	if (fwrite(buf, 1, len, lg.stats) != len || fflush(lg.stats) != 0)
		lg_note("writing %s: %s", lg.o.stats_file, strerror(errno));
	free(buf);
}

void
lg_print_table(snap *snaps, double elapsed, const char *stopped_by)
{
	tcounts tt[LG_MAX_TARGETS];
	counts sum;
	lg_hist hsum;

	memset(tt, 0, sizeof tt);
	memset(&sum, 0, sizeof sum);
	lg_hist_reset(&hsum);
	printf("%s: %.1f s, stopped by %s\n\n", PROG, elapsed, stopped_by);
	printf("%-16s %8s %8s %8s %8s %6s %6s %6s %7s %7s %7s %7s %6s %8s "
	       "%8s %8s\n",
	    "caller", "rate/s", "sent", "ok", "denied", "503", "other",
	    "errors", "retried", "gaveup", "skipped", "thrott", "conns",
	    "p50ms", "p90ms", "p99ms");
	for (size_t i = 0; i < lg.ncallers; i++) {
		const caller *c = &lg.callers[i];
		const snap *s = &snaps[i];
		printf("%-16.16s %8.1f %8" PRIu64 " %8" PRIu64 " %8" PRIu64
		       " %6" PRIu64 " %6" PRIu64 " %6" PRIu64 " %7" PRIu64
		       " %7" PRIu64 " %7" PRIu64 " %7" PRIu64 " %6" PRIu64
		       " %8.2f %8.2f %8.2f\n",
		    c->spec.name, c->spec.rate, s->total.sent, s->total.ok,
		    s->total.denied, s->total.conc_rejected, s->total.other,
		    s->total.errors, s->total.retried, s->total.gave_up,
		    s->total.skipped, s->total.throttled, s->total.connects,
		    (double) lg_hist_percentile(&s->htotal, 50) / 1000.0,
		    (double) lg_hist_percentile(&s->htotal, 90) / 1000.0,
		    (double) lg_hist_percentile(&s->htotal, 99) / 1000.0);
		counts_add(&sum, &s->total);
		lg_hist_merge(&hsum, &s->htotal);
		for (size_t j = 0; j < LG_MAX_TARGETS; j++)
			tcounts_add(&tt[j], &s->ttotal[j]);
	}
	printf("%-16s %8s %8" PRIu64 " %8" PRIu64 " %8" PRIu64 " %6" PRIu64
	       " %6" PRIu64 " %6" PRIu64 " %7" PRIu64 " %7" PRIu64 " %7" PRIu64
	       " %7" PRIu64 " %6" PRIu64 " %8.2f %8.2f %8.2f\n",
	    "(all)", "", sum.sent, sum.ok, sum.denied, sum.conc_rejected,
	    sum.other, sum.errors, sum.retried, sum.gave_up, sum.skipped,
	    sum.throttled, sum.connects,
	    (double) lg_hist_percentile(&hsum, 50) / 1000.0,
	    (double) lg_hist_percentile(&hsum, 90) / 1000.0,
	    (double) lg_hist_percentile(&hsum, 99) / 1000.0);

	printf("\n%-32s %6s %8s %8s %8s %6s %6s %6s\n", "target", "active",
	    "sent", "ok", "denied", "503", "other", "errors");
	pthread_mutex_lock(&lg.tmu);
	for (size_t j = 0; j < lg.ntargets; j++)
		printf("%-32.32s %6s %8" PRIu64 " %8" PRIu64 " %8" PRIu64
		       " %6" PRIu64 " %6" PRIu64 " %6" PRIu64 "\n",
		    lg.turl[j], lg.tactive[j] ? "yes" : "no", tt[j].sent,
		    tt[j].ok, tt[j].denied, tt[j].conc_rejected, tt[j].other,
		    tt[j].errors);
	pthread_mutex_unlock(&lg.tmu);

	for (size_t i = 0; i < lg.ncallers; i++)
		if (snaps[i].last_error[0] != '\0')
			printf("\n%s: last error: %s", lg.callers[i].spec.name,
			    snaps[i].last_error);
	printf("\n");
}
