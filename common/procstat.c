/* SPDX-License-Identifier: MIT */
/* This process's metrics from /proc (procstat.h). */
#include "procstat.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* Append one metric (HELP, TYPE, the sample) at b[*n]. */
static void
put(char *b, size_t len, size_t *n, const char *name, const char *type,
    const char *help, double v)
{
	if (*n >= len)
		return;
	int w = snprintf(b + *n, len - *n,
	    "# HELP %s %s\n# TYPE %s %s\n%s %.15g\n", name, help, name, type,
	    name, v);
	if (w > 0)
		*n += (size_t) w < len - *n ? (size_t) w : len - *n - 1;
}

/* CPU seconds (utime + stime), the start (clock ticks after boot), the
 * virtual size and the resident size (bytes) from /proc/self/stat; 0 if
 * unreadable. */
static int
self_stat(double *cpu_s, double *start_ticks, double *vsize, double *rss)
{
	FILE *f = fopen("/proc/self/stat", "r");
	if (f == NULL)
		return 0;
	char line[2048];
	int ok = fgets(line, sizeof line, f) != NULL;
	fclose(f);
	/* The command name may hold spaces and parentheses: the fields
	 * start after the last ')'. */
	char *p = ok ? strrchr(line, ')') : NULL;
	if (p == NULL)
		return 0;
	unsigned long long v[23] = { 0 };
	int i = 0;
	char *save = NULL;
	for (char *tok = strtok_r(p + 2, " ", &save); tok != NULL && i < 23;
	     tok = strtok_r(NULL, " ", &save))
		v[i++] = strtoull(tok, NULL, 10);
	if (i < 22)
		return 0;
	/* Fields 14, 15 (utime, stime), 22 (starttime), 23 (vsize), 24
	 * (rss) of proc(5); v[0] is field 3. */
	double tick = (double) sysconf(_SC_CLK_TCK);
	*cpu_s = (double) (v[11] + v[12]) / tick;
	*start_ticks = (double) v[19];
	*vsize = (double) v[20];
	*rss = (double) v[21] * (double) sysconf(_SC_PAGESIZE);
	return 1;
}

/* Seconds since the epoch at boot, from /proc/stat's btime. */
static double
boot_time(void)
{
	FILE *f = fopen("/proc/stat", "r");
	if (f == NULL)
		return -1;
	char line[256];
	double bt = -1;
	while (fgets(line, sizeof line, f) != NULL)
		if (strncmp(line, "btime ", 6) == 0) {
			bt = strtod(line + 6, NULL);
			break;
		}
	fclose(f);
	return bt;
}

static double
open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (d == NULL)
		return -1;
	double n = 0;
	for (struct dirent *e; (e = readdir(d)) != NULL;)
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1; /* the directory's own descriptor */
}

size_t
allot__procstat_text(char *buf, size_t len)
{
	size_t n = 0;
	if (len == 0)
		return 0;
	buf[0] = '\0';
	double cpu, start, vsize, rss;
	if (self_stat(&cpu, &start, &vsize, &rss)) {
		put(buf, len, &n, "process_cpu_seconds_total", "counter",
		    "Total user and system CPU time spent in seconds.", cpu);
		put(buf, len, &n, "process_resident_memory_bytes", "gauge",
		    "Resident memory size in bytes.", rss);
		put(buf, len, &n, "process_virtual_memory_bytes", "gauge",
		    "Virtual memory size in bytes.", vsize);
		double bt = boot_time();
		if (bt >= 0)
			put(buf, len, &n, "process_start_time_seconds",
			    "gauge",
			    "Start time of the process since unix epoch in "
			    "seconds.",
			    bt + start / (double) sysconf(_SC_CLK_TCK));
	}
	double fds = open_fds();
	if (fds >= 0)
		put(buf, len, &n, "process_open_fds", "gauge",
		    "Number of open file descriptors.", fds);
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
		put(buf, len, &n, "process_max_fds", "gauge",
		    "Maximum number of open file descriptors.",
		    (double) rl.rlim_cur);
	return n;
}
