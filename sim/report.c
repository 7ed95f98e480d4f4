/* SPDX-License-Identifier: MIT */
/*
 * The simulator's output (sim.h): a table per run (per quota and per
 * mode, then the summary, the coordinator's load and allot's checked
 * invariants), a one-row-per-run summary for --all and sweeps, and the
 * same figures as one JSON object per run. NaN (not applicable, or no
 * convergence) prints as "-" and as null. Also the process's CPU time,
 * which the speed lines are counted in.
 */
#include "sim.h"

#include <math.h>
#include <string.h>
#include <sys/resource.h>

#include "json.h"

/* A right-aligned number with `dec` decimals, or "-" for NaN. */
static void
num(FILE *f, const char *pre, double v, int width, int dec)
{
	fputs(pre, f);
	if (isnan(v) || isinf(v))
		fprintf(f, "%*s", width,
		    isnan(v)  ? "-" :
		        v > 0 ? "inf" :
		                "-inf");
	else
		fprintf(f, "%*.*f", width, dec, v);
}

static void
jnum(FILE *f, double v)
{
	if (isnan(v) || isinf(v))
		fputs("null", f);
	else
		fprintf(f, "%.6g", v);
}

void
sim_print_table(FILE *f, const sim_result *r, bool per_key)
{
	fprintf(f,
	    "scenario %s: T = %u ms, seed %llu, %.0f s, up to %u "
	    "replicas (run in %.2f s: %.0f simulated s per s)\n",
	    r->scenario, r->interval_ms, (unsigned long long) r->seed,
	    r->duration_s, r->nreplicas_max, r->wall_s,
	    r->wall_s > 0 ? r->duration_s / r->wall_s : 0);
	if (per_key) {
		fprintf(f,
		    "  %-28s %8s %7s %9s | %9s | %9s %6s %6s | %9s "
		    "%6s %6s\n",
		    "quota", "R", "B", "offered", "ideal", "allot", "over",
		    "under%", "split", "over", "under%");
		for (size_t i = 0; i < r->nkeys; i++) {
			const sim_key *k = &r->keys[i];
			const char *id = k->identity;
			if (strncmp(id, "spiffe://sim/", 13) == 0)
				id += 13;
			fprintf(f,
			    "  %-28.28s %8.0f %7.0f %9.0f | %9.0f | "
			    "%9.0f ",
			    id, k->rate, k->burst, k->offered,
			    k->f[SIM_IDEAL].admitted,
			    k->f[SIM_ALLOT].admitted);
			num(f, "", k->f[SIM_ALLOT].over, 6, 2);
			num(f, " ", 100 * k->f[SIM_ALLOT].under, 6, 2);
			fprintf(f, " | %9.0f ", k->f[SIM_SPLIT].admitted);
			num(f, "", k->f[SIM_SPLIT].over, 6, 2);
			num(f, " ", 100 * k->f[SIM_SPLIT].under, 6, 2);
			fputc('\n', f);
		}
	}
	fprintf(f, "  %-6s %12s %9s %8s %10s\n", "mode", "over (R*T)",
	    "under %", "util %", "converge");
	for (int m = 0; m < SIM_NMODES; m++) {
		fprintf(f, "  %-6s ", sim_mode_names[m]);
		num(f, "", r->over[m], 12, 3);
		num(f, " ", 100 * r->under[m], 9, 3);
		num(f, " ", 100 * r->util[m], 8, 2);
		num(f, " ", r->converge[m], 10, 2);
		if (!isnan(r->neighbour[m]))
			fprintf(f, "   others vs. no noisy caller: %.3f %%",
			    100 * r->neighbour[m]);
		fputc('\n', f);
	}
	fprintf(f,
	    "  allot: bootstrap term %.3f R*T; coordinator %.0f "
	    "syncs/s, %.0f key reports/s, %.1f KiB/s; grants/R max %.6f; "
	    "held - bound max %+.2e R; bound ratio max %.3f; tokens - B "
	    "max %+.2e B (%llu checks)\n",
	    r->bootstrap, r->syncs_per_s, r->reports_per_s,
	    r->bytes_per_s / 1024, r->max_granted_ratio,
	    r->max_held_over_bound, r->max_bound_ratio,
	    r->max_tokens_over_burst,
	    (unsigned long long) r->invariant_checks);
	fprintf(f,
	    "  allot: tail path: %.3f %% of decisions waited for the "
	    "central reserve, p99 %.2f ms; %llu Asks, %llu admitted, %llu "
	    "denied (%llu late, %llu short), %llu denied dry, %llu "
	    "admitted on standby\n",
	    100 * r->central_fraction, r->central_p99_ms,
	    (unsigned long long) r->central_asks,
	    (unsigned long long) r->central_allowed,
	    (unsigned long long) r->central_denied,
	    (unsigned long long) r->central_late,
	    (unsigned long long) r->central_short,
	    (unsigned long long) r->central_dry,
	    (unsigned long long) r->central_standby);
}

void
sim_print_summary_header(FILE *f)
{
	fprintf(f,
	    "%-10s %5s | %7s %7s %7s | %7s %7s | %6s %6s %6s | "
	    "%6s %6s | %9s\n",
	    "scenario", "T ms", "over:id", "allot", "split", "under:al",
	    "split", "util:id", "allot", "split", "conv", "boot", "syncs/s");
}

void
sim_print_summary_row(FILE *f, const sim_result *r)
{
	fprintf(f, "%-10s %5u | ", r->scenario, r->interval_ms);
	num(f, "", r->over[SIM_IDEAL], 7, 2);
	num(f, " ", r->over[SIM_ALLOT], 7, 2);
	num(f, " ", r->over[SIM_SPLIT], 7, 2);
	fputs(" | ", f);
	num(f, "", 100 * r->under[SIM_ALLOT], 6, 2);
	fputc('%', f);
	num(f, " ", 100 * r->under[SIM_SPLIT], 6, 2);
	fputc('%', f);
	fputs(" | ", f);
	num(f, "", 100 * r->util[SIM_IDEAL], 6, 1);
	num(f, " ", 100 * r->util[SIM_ALLOT], 6, 1);
	num(f, " ", 100 * r->util[SIM_SPLIT], 6, 1);
	fputs(" | ", f);
	num(f, "", r->converge[SIM_ALLOT], 6, 2);
	num(f, " ", r->bootstrap, 6, 2);
	fprintf(f, " | %9.0f\n", r->syncs_per_s);
}

void
sim_print_json(FILE *f, const sim_result *r)
{
	fputs("{\"scenario\":", f);
	allot__json_fputs(f, r->scenario);
	fprintf(f, ",\"interval_ms\":%u,\"seed\":%llu,\"duration_s\":",
	    r->interval_ms, (unsigned long long) r->seed);
	jnum(f, r->duration_s);
	fprintf(f, ",\"replicas\":%u,\"modes\":{", r->nreplicas_max);
	for (int m = 0; m < SIM_NMODES; m++) {
		fprintf(
		    f, "%s\"%s\":{\"over\":", m ? "," : "", sim_mode_names[m]);
		jnum(f, r->over[m]);
		fputs(",\"under\":", f);
		jnum(f, r->under[m]);
		fputs(",\"util\":", f);
		jnum(f, r->util[m]);
		fputs(",\"converge\":", f);
		jnum(f, r->converge[m]);
		fputs(",\"neighbour\":", f);
		jnum(f, r->neighbour[m]);
		fputc('}', f);
	}
	fputs("},\"keys\":[", f);
	for (size_t i = 0; i < r->nkeys; i++) {
		const sim_key *k = &r->keys[i];
		fputs(i ? ",{\"quota\":" : "{\"quota\":", f);
		allot__json_fputs(f, k->identity);
		fputs(",\"rate\":", f);
		jnum(f, k->rate);
		fputs(",\"burst\":", f);
		jnum(f, k->burst);
		fputs(",\"priority\":", f);
		allot__json_fputs(f, k->priority);
		fputs(",\"offered\":", f);
		jnum(f, k->offered);
		fputs(",\"bootstrap\":", f);
		jnum(f, k->bootstrap);
		for (int m = 0; m < SIM_NMODES; m++) {
			const sim_fig *g = &k->f[m];
			fprintf(
			    f, ",\"%s\":{\"admitted\":", sim_mode_names[m]);
			jnum(f, g->admitted);
			fputs(",\"over\":", f);
			jnum(f, g->over);
			fputs(",\"over_T\":", f);
			jnum(f, g->over_w[0]);
			fputs(",\"over_1s\":", f);
			jnum(f, g->over_w[1]);
			fputs(",\"over_10s\":", f);
			jnum(f, g->over_w[2]);
			fputs(",\"under\":", f);
			jnum(f, g->under);
			fputs(",\"util\":", f);
			jnum(f, g->util);
			fputc('}', f);
		}
		fputc('}', f);
	}
	fputs("],\"bootstrap\":", f);
	jnum(f, r->bootstrap);
	fputs(",\"load\":{\"syncs_per_s\":", f);
	jnum(f, r->syncs_per_s);
	fputs(",\"reports_per_s\":", f);
	jnum(f, r->reports_per_s);
	fputs(",\"bytes_per_s\":", f);
	jnum(f, r->bytes_per_s);
	fputs("},\"tail\":{\"central_fraction\":", f);
	jnum(f, r->central_fraction);
	fputs(",\"central_p99_ms\":", f);
	jnum(f, r->central_p99_ms);
	fputs("},\"checks\":{\"max_granted_ratio\":", f);
	jnum(f, r->max_granted_ratio);
	fputs(",\"max_held_over_bound\":", f);
	jnum(f, r->max_held_over_bound);
	fputs(",\"max_bound_ratio\":", f);
	jnum(f, r->max_bound_ratio);
	fputs(",\"max_tokens_over_burst\":", f);
	jnum(f, r->max_tokens_over_burst);
	fprintf(f, ",\"denials_refuted\":%llu,\"count\":%llu},\"wall_s\":",
	    (unsigned long long) r->denials_refuted,
	    (unsigned long long) r->invariant_checks);
	jnum(f, r->wall_s);
	/* The speed: simulated seconds of the scenario (its three modes
	 * counted once) per real second. */
	fputs(",\"sim_seconds_per_real_s\":", f);
	jnum(f, r->wall_s > 0 ? r->duration_s / r->wall_s : NAN);
	fputs("}\n", f);
}

double
sim_cpu_s(void)
{
	struct rusage u;
	if (getrusage(RUSAGE_SELF, &u) != 0)
		return NAN;
	return (double) (u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
	    (double) (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}
