/* SPDX-License-Identifier: MIT */
/*
 * allotctl reload: make allotd re-read its quota file. allotd's HTTP port
 * is read-only, so the reload is a SIGHUP, and the kernel letting only
 * allotd's own user (or root) send it is the authentication. Before
 * signalling, allotctl makes sure the process is the allotd answering on
 * --http and validates the file with the loader allotd uses (the public
 * allot_config_load()), so a bad file is reported here and allotd is left
 * alone. Afterwards it watches allotd's reload counters, which only
 * /metrics carries (/status has the epoch and digest, not the outcome of a
 * reload that changed nothing), and reports the new epoch from /status.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include <allot/allot.h>

#include "allotctl.h"

/* The config in force before the reload, for the messages. */
typedef struct before {
	double epoch;
	char digest[32];
	char *path; /* as allotd reports it */
	long pid; /* as allotd reports it; 0: not reported */
} before;

/* A counter from allotd's /metrics text, or -1. */
static double
metric_value(const char *text, const char *series)
{
	size_t sl = strlen(series);
	for (const char *p = text; p != NULL && *p != '\0';) {
		if (strncmp(p, series, sl) == 0 && p[sl] == ' ')
			return strtod(p + sl + 1, NULL);
		p = strchr(p, '\n');
		if (p != NULL)
			p++;
	}
	return -1;
}

static int
reload_counters(const ctl *c, double *ok, double *failed)
{
	char *m;
	int rc = ctl_http_get(c, "/metrics", &m);
	if (rc != 0)
		return rc;
	*ok = metric_value(m, "allotd_config_reloads_total{result=\"ok\"}");
	*failed = metric_value(
	    m, "allotd_config_reloads_total{result=\"fail\"}");
	free(m);
	if (*ok < 0 || *failed < 0) {
		ctl_fail("allotd at %s: /metrics has no "
		         "allotd_config_reloads_total",
		    c->http);
		return EXIT_UNREACHABLE;
	}
	return 0;
}

/* The process's command name from /proc ("" if it cannot be read). */
static void
proc_comm(long pid, char *buf, size_t len)
{
	char path[64];
	snprintf(path, sizeof path, "/proc/%ld/comm", pid);
	buf[0] = '\0';
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return;
	if (fgets(buf, (int) len, f) == NULL)
		buf[0] = '\0';
	fclose(f);
	buf[strcspn(buf, "\n")] = '\0';
}

static bool
read_pid_file(const char *path, long *ret)
{
	FILE *f = fopen(path, "r");
	if (f == NULL) {
		ctl_fail("cannot read the pid file %s: %s", path,
		    ctl_errstr(errno));
		return false;
	}
	char line[64] = "";
	bool ok = fgets(line, sizeof line, f) != NULL;
	fclose(f);
	line[strcspn(line, " \t\r\n")] = '\0';
	if (!ok || !ctl_parse_int(line, 1, INT_MAX, ret)) {
		ctl_fail("%s does not hold a process id", path);
		return false;
	}
	return true;
}

/* Which process to signal: --pid, --pid-file, or the pid allotd reports
 * when it listens on this host. Whichever it is must be an allotd and,
 * when allotd runs here, the one answering on --http. 0 and the pid, or
 * an exit status after saying why. */
static int
which_pid(const ctl *c, const before *b, long *ret_pid)
{
	long pid = c->pid;
	if (pid == 0 && c->pid_file != NULL &&
	    !read_pid_file(c->pid_file, &pid))
		return EXIT_FAIL;
	bool local = ctl_http_is_local(c);
	if (pid == 0) {
		if (!local) {
			ctl_fail("reload sends SIGHUP to allotd, so it works "
			         "on allotd's own host: run it there, or give "
			         "--pid or --pid-file");
			return EXIT_USAGE;
		}
		pid = b->pid;
		if (pid <= 0) {
			ctl_fail("allotd at %s does not report its pid; give "
			         "--pid or --pid-file",
			    c->http);
			return EXIT_FAIL;
		}
	} else if (local && b->pid > 0 && b->pid != pid) {
		ctl_fail("allotd at %s has pid %ld, not %ld: refusing to "
		         "signal another process",
		    c->http, b->pid, pid);
		return EXIT_FAIL;
	}
	char comm[64];
	proc_comm(pid, comm, sizeof comm);
	if (strcmp(comm, "allotd") != 0) {
		if (comm[0] == '\0')
			ctl_fail("no process %ld on this host (is allotd in "
			         "another pid namespace? give --pid)",
			    pid);
		else
			ctl_fail("process %ld is \"%s\", not allotd: refusing "
			         "to signal it",
			    pid, comm);
		return EXIT_FAIL;
	}
	*ret_pid = pid;
	return 0;
}

/* Validate what allotd will read, when we can read it too: a bad file is
 * then reported with the loader's own message and allotd is left alone.
 * A relative path is relative to allotd's cwd. False after saying why
 * the file is bad. */
static bool
file_is_valid(const before *b, long pid)
{
	char full[PATH_MAX + 1];
	if (b->path[0] == '/') {
		snprintf(full, sizeof full, "%s", b->path);
	} else {
		char link[64], cwd[PATH_MAX];
		snprintf(link, sizeof link, "/proc/%ld/cwd", pid);
		ssize_t l = readlink(link, cwd, sizeof cwd - 1);
		if (l > 0) {
			cwd[l] = '\0';
			snprintf(full, sizeof full, "%s/%s", cwd, b->path);
		} else {
			snprintf(full, sizeof full, "%s", b->path);
		}
	}
	if (access(full, R_OK) != 0) {
		fprintf(stderr,
		    "allotctl: note: cannot read %s here (%s); "
		    "allotd will validate it\n",
		    full, ctl_errstr(errno));
		return true;
	}
	char err[1024] = "";
	allot_config *tmp = NULL;
	int lrc = allot_config_load(full, err, sizeof err, &tmp);
	allot_config_free(tmp);
	if (lrc == ALLOT_OK)
		return true;
	fputs(err[0] ? err : allot_strerror(lrc), stderr);
	fputc('\n', stderr);
	ctl_fail("%s is not valid; nothing was sent, allotd keeps config "
	         "epoch %.0f (digest %s)",
	    b->path, b->epoch, b->digest);
	return false;
}

/* Send SIGHUP and wait until allotd's reload counters move. 0 when it
 * reloaded, or an exit status after saying why not. */
static int
signal_and_wait(const ctl *c, const before *b, long pid)
{
	double ok0, failed0;
	int rc = reload_counters(c, &ok0, &failed0);
	if (rc != 0)
		return rc;
	if (kill((pid_t) pid, SIGHUP) != 0) {
		if (errno == EPERM)
			ctl_fail("not permitted to signal allotd (pid %ld): "
			         "run allotctl as allotd's user or as root",
			    pid);
		else
			ctl_fail("cannot signal allotd (pid %ld): %s", pid,
			    ctl_errstr(errno));
		return EXIT_FAIL;
	}
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		double ok, failed;
		if ((rc = reload_counters(c, &ok, &failed)) != 0)
			return rc;
		if (failed > failed0) {
			ctl_fail("allotd rejected %s and keeps config epoch "
			         "%.0f (digest %s); its log has the reason "
			         "(ALLOTD-RELOAD-FAIL)",
			    b->path, b->epoch, b->digest);
			return EXIT_FAIL;
		}
		if (ok > ok0)
			return 0;
		struct timespec now;
		clock_gettime(CLOCK_MONOTONIC, &now);
		long el = (long) (now.tv_sec - t0.tv_sec) * 1000 +
		    (now.tv_nsec - t0.tv_nsec) / 1000000;
		if (el >= c->wait_ms) {
			ctl_fail("sent SIGHUP to allotd (pid %ld) but it did "
			         "not report a reload within %ld ms",
			    pid, c->wait_ms);
			return EXIT_FAIL;
		}
		usleep(50000);
	}
}

/* Read the config in force from /status. */
static int
read_before(const ctl *c, before *ret)
{
	json_object *doc;
	int rc = ctl_get_status(c, &doc);
	if (rc != 0)
		return rc;
	json_object *cfg = ctl_jget(doc, "config");
	ret->epoch = ctl_jnum0(cfg, "epoch");
	snprintf(
	    ret->digest, sizeof ret->digest, "%s", ctl_jstr(cfg, "digest"));
	ret->path = ctl_strdup(ctl_jstr(cfg, "path"));
	ret->pid = isfinite(ctl_jnum(doc, "pid")) ?
	    (long) ctl_jnum(doc, "pid") :
	    0;
	json_object_put(doc);
	return 0;
}

/* Say what the reload did, from /status. */
static int
report_after(const ctl *c, const before *b)
{
	json_object *doc;
	int rc = ctl_get_status(c, &doc);
	if (rc != 0)
		return rc;
	json_object *cfg = ctl_jget(doc, "config");
	double epoch1 = ctl_jnum0(cfg, "epoch");
	if (c->json) {
		json_object *o = json_object_new_object(), *from, *to;
		json_object_object_add(
		    o, "file", json_object_new_string(b->path));
		json_object_object_add(
		    o, "changed", json_object_new_boolean(epoch1 != b->epoch));
		json_object_object_add(
		    o, "from", from = json_object_new_object());
		json_object_object_add(
		    from, "epoch", json_object_new_int64((int64_t) b->epoch));
		json_object_object_add(
		    from, "digest", json_object_new_string(b->digest));
		json_object_object_add(o, "to", to = json_object_new_object());
		json_object_object_add(
		    to, "epoch", json_object_new_int64((int64_t) epoch1));
		json_object_object_add(to, "digest",
		    json_object_new_string(ctl_jstr(cfg, "digest")));
		ctl_print_json(o);
	} else if (epoch1 != b->epoch)
		printf("reloaded %s: epoch %.0f -> %.0f, digest %s -> %s; "
		       "agents get the new shares on their next sync\n",
		    b->path, b->epoch, epoch1, b->digest,
		    ctl_jstr(cfg, "digest"));
	else
		printf("%s is unchanged (digest %s); epoch stays %.0f\n",
		    b->path, ctl_jstr(cfg, "digest"), epoch1);
	json_object_put(doc);
	return 0;
}

int
ctl_cmd_reload(const ctl *c)
{
	before b;
	int rc = read_before(c, &b);
	if (rc != 0)
		return rc;
	long pid = 0;
	rc = which_pid(c, &b, &pid);
	if (rc == 0 && c->check && !file_is_valid(&b, pid))
		rc = EXIT_FAIL;
	if (rc == 0)
		rc = signal_and_wait(c, &b, pid);
	if (rc == 0)
		rc = report_after(c, &b);
	free(b.path);
	return rc;
}
