/* SPDX-License-Identifier: MIT */
/*
 * allotctl: the operator's command line for allot. Most commands read a
 * running allotd through its HTTP endpoints (GET /status, parsed with
 * json-c; GET /metrics for the reload counters) and print tables; none of
 * them can change anything, because allotd's HTTP port is read-only.
 * `reload` is the one command that acts, and it does so by sending SIGHUP
 * to the allotd process on this host: the kernel only lets its own user
 * (or root) signal it, so that is the authentication, and the quota file
 * is validated first so a bad file is reported here instead of only in
 * allotd's log. Two commands need no allotd at all: `check-config`
 * validates a quota file with the same loader allotd uses and prints the
 * sizing arithmetic (allocation against the ceiling, the correlated
 * burst), and `audit` runs the standard audit queries on store files
 * with the SQLite C API, read-only.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>
#include <sqlite3.h>

#include <allot/allot.h>

#include "config.h"

#define EXIT_FAIL 1 /* the command ran and the answer is "no" */
#define EXIT_USAGE 2 /* bad command line */
#define EXIT_UNREACHABLE 3 /* allotd could not be reached or misanswered */

#define DEFAULT_HTTP "127.0.0.1:7480"
#define DEFAULT_TIMEOUT_MS 3000
#define DEFAULT_WAIT_MS 5000
#define HTTP_MAX_BYTES (64u * 1024u * 1024u)
#define ALLOT_APPLICATION_ID 0x414c4f54 /* "ALOT", schema/001 */
#define AUDIT_VIEWS_VERSION 2 /* schema/002_audit_views.sql */

/* Options every command accepts. */
typedef struct ctl {
	const char *http; /* HOST:PORT of allotd's HTTP endpoints */
	int timeout_ms; /* per HTTP exchange */
} ctl;

/* ------------------------------------------------------------------ */
/* small helpers                                                       */
/* ------------------------------------------------------------------ */

static void
die_oom(void)
{
	fputs("allotctl: out of memory\n", stderr);
	exit(EXIT_FAIL);
}

static void *
xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);
	if (p == NULL)
		die_oom();
	return p;
}

static void *
xrealloc(void *p, size_t size)
{
	p = realloc(p, size ? size : 1);
	if (p == NULL)
		die_oom();
	return p;
}

static char *
xstrdup(const char *s)
{
	char *d = strdup(s);
	if (d == NULL)
		die_oom();
	return d;
}

static char *xasprintf(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

static char *
xasprintf(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char *s = NULL;
	int n = vasprintf(&s, fmt, ap);
	va_end(ap);
	if (n < 0)
		die_oom();
	return s;
}

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* "allotctl: <message>" on stderr. */
static void
fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("allotctl: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

/* strerror() in lower case, as it reads in the middle of a sentence. */
static const char *
errstr(int e)
{
	static char buf[128];
	snprintf(buf, sizeof buf, "%s", strerror(e));
	if (buf[0] != '\0' && isupper((unsigned char) buf[0]) &&
	    !isupper((unsigned char) buf[1]))
		buf[0] = (char) tolower((unsigned char) buf[0]);
	return buf;
}

/* Drop trailing zeros after a decimal point ("400.0" -> "400"). */
static char *
trim_zeros(char *s)
{
	char *dot = strchr(s, '.');
	if (dot != NULL) {
		char *e = s + strlen(s) - 1;
		while (e > dot && *e == '0')
			*e-- = '\0';
		if (e == dot)
			*e = '\0';
	}
	return s;
}

/* A number as people read it: one decimal from 100 up, two from 1,
 * three significant digits below, trailing zeros dropped (400, 133.3,
 * 2.5, 0.125). */
static char *
num(double v)
{
	if (!isfinite(v))
		return xstrdup("-");
	double a = fabs(v);
	char *s = a >= 100 ? xasprintf("%.1f", v) :
	    a >= 1         ? xasprintf("%.2f", v) :
	                     xasprintf("%.3g", v);
	trim_zeros(s);
	if (strcmp(s, "-0") == 0)
		strcpy(s, "0");
	return s;
}

/* A ratio with up to three decimals, trailing zeros dropped (1.125,
 * 2.1, 3). */
static char *
ratio(double v)
{
	return trim_zeros(xasprintf("%.3f", v));
}

static char *
pct(double part, double whole)
{
	if (!(whole > 0))
		return xstrdup("-");
	return xasprintf("%.0f%%", 100.0 * part / whole);
}

static char *
utc_ms(int64_t ms)
{
	if (ms <= 0)
		return xstrdup("-");
	time_t t = (time_t) (ms / 1000);
	struct tm tm;
	if (gmtime_r(&t, &tm) == NULL)
		return xstrdup("-");
	char buf[64];
	strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
	return xstrdup(buf);
}

static bool
parse_int(const char *s, long min, long max, long *ret)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v < min || v > max)
		return false;
	*ret = v;
	return true;
}

static bool
parse_double(const char *s, double *ret)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno != 0 || end == s || *end != '\0' || !isfinite(v))
		return false;
	*ret = v;
	return true;
}

/* ------------------------------------------------------------------ */
/* tables                                                              */
/* ------------------------------------------------------------------ */

/* Rows of owned strings printed in aligned columns; a column whose
 * alignment is 'r' is right-aligned (numbers). */
typedef struct table {
	size_t ncols;
	const char *align;
	char **cells;
	size_t nrows;
	size_t cap;
} table;

static void
table_init(table *t, const char *align)
{
	memset(t, 0, sizeof *t);
	t->ncols = strlen(align);
	t->align = align;
}

/* Append a row of `ncols` strings; the table takes ownership. */
static void
table_row(table *t, ...)
{
	if (t->nrows == t->cap) {
		t->cap = t->cap ? t->cap * 2 : 16;
		t->cells = xrealloc(
		    t->cells, t->cap * t->ncols * sizeof *t->cells);
	}
	va_list ap;
	va_start(ap, t);
	for (size_t c = 0; c < t->ncols; c++) {
		char *s = va_arg(ap, char *);
		t->cells[t->nrows * t->ncols + c] = s ? s : xstrdup("");
	}
	va_end(ap);
	t->nrows++;
}

/* The header is row 0, added with table_row(t, xstrdup(..), ...). */
static void
table_print(const table *t, FILE *f)
{
	size_t *w = xcalloc(t->ncols, sizeof *w);
	for (size_t r = 0; r < t->nrows; r++)
		for (size_t c = 0; c < t->ncols; c++) {
			size_t l = strlen(t->cells[r * t->ncols + c]);
			if (l > w[c])
				w[c] = l;
		}
	for (size_t r = 0; r < t->nrows; r++) {
		for (size_t c = 0; c < t->ncols; c++) {
			const char *s = t->cells[r * t->ncols + c];
			bool last = c + 1 == t->ncols;
			if (t->align[c] == 'r')
				fprintf(f, "%*s", (int) w[c], s);
			else if (last)
				fputs(s, f);
			else
				fprintf(f, "%-*s", (int) w[c], s);
			if (!last)
				fputs("  ", f);
		}
		fputc('\n', f);
	}
	free(w);
}

static void
table_free(table *t)
{
	for (size_t i = 0; i < t->nrows * t->ncols; i++)
		free(t->cells[i]);
	free(t->cells);
	memset(t, 0, sizeof *t);
}

/* ------------------------------------------------------------------ */
/* HTTP                                                                */
/* ------------------------------------------------------------------ */

/* Split "HOST:PORT", "[V6]:PORT", "HOST" (port 7480) or an "http://"
 * URL into host and port. */
static bool
split_hostport(
    const char *addr, char *host, size_t hostlen, char *port, size_t portlen)
{
	if (strncmp(addr, "http://", 7) == 0)
		addr += 7;
	const char *end = addr + strcspn(addr, "/");
	const char *colon;
	if (*addr == '[') {
		const char *rb = memchr(addr, ']', (size_t) (end - addr));
		if (rb == NULL)
			return false;
		if ((size_t) (rb - addr - 1) >= hostlen)
			return false;
		memcpy(host, addr + 1, (size_t) (rb - addr - 1));
		host[rb - addr - 1] = '\0';
		colon = rb + 1 < end && rb[1] == ':' ? rb + 1 : NULL;
		if (colon == NULL && rb + 1 != end)
			return false;
	} else {
		colon = NULL;
		for (const char *p = addr; p < end; p++)
			if (*p == ':')
				colon = p;
		const char *hend = colon ? colon : end;
		if (hend == addr || (size_t) (hend - addr) >= hostlen)
			return false;
		memcpy(host, addr, (size_t) (hend - addr));
		host[hend - addr] = '\0';
	}
	if (colon == NULL) {
		snprintf(port, portlen, "7480");
		return true;
	}
	size_t pl = (size_t) (end - colon - 1);
	if (pl == 0 || pl >= portlen)
		return false;
	memcpy(port, colon + 1, pl);
	port[pl] = '\0';
	long v;
	return parse_int(port, 1, 65535, &v);
}

static int
remaining_ms(const struct timespec *deadline)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	long long ms = (long long) (deadline->tv_sec - now.tv_sec) * 1000 +
	    (deadline->tv_nsec - now.tv_nsec) / 1000000;
	return ms < 0 ? 0 : ms > INT_MAX ? INT_MAX : (int) ms;
}

/* Connect to one address before the deadline; -1 with errno set. */
static int
connect_one(const struct addrinfo *ai, const struct timespec *deadline)
{
	int fd = socket(ai->ai_family,
	    ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
	if (fd < 0)
		return -1;
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
		return fd;
	if (errno != EINPROGRESS) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	struct pollfd p = { .fd = fd, .events = POLLOUT };
	int n = poll(&p, 1, remaining_ms(deadline));
	if (n == 0) {
		close(fd);
		errno = ETIMEDOUT;
		return -1;
	}
	int soerr = 0;
	socklen_t sl = sizeof soerr;
	if (n < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 ||
	    soerr != 0) {
		int e = n < 0 || soerr == 0 ? errno : soerr;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

/* GET `path` from allotd. On 200 returns 0 and the body (NUL-terminated,
 * the caller's). Otherwise prints why and returns EXIT_UNREACHABLE. */
static int
http_get(const ctl *c, const char *path, char **ret_body)
{
	char host[256], port[16];
	if (!split_hostport(c->http, host, sizeof host, port, sizeof port)) {
		fail("bad --http address \"%s\", expected HOST:PORT", c->http);
		return EXIT_USAGE;
	}
	struct timespec deadline;
	clock_gettime(CLOCK_MONOTONIC, &deadline);
	deadline.tv_sec += c->timeout_ms / 1000;
	deadline.tv_nsec += (long) (c->timeout_ms % 1000) * 1000000L;
	if (deadline.tv_nsec >= 1000000000L) {
		deadline.tv_sec++;
		deadline.tv_nsec -= 1000000000L;
	}
	struct addrinfo hints = { .ai_family = AF_UNSPEC,
		.ai_socktype = SOCK_STREAM };
	struct addrinfo *res = NULL;
	int gai = getaddrinfo(host, port, &hints, &res);
	if (gai != 0) {
		fail("cannot reach allotd at %s: cannot resolve %s: %s",
		    c->http, host, gai_strerror(gai));
		return EXIT_UNREACHABLE;
	}
	int fd = -1, last = ECONNREFUSED;
	for (struct addrinfo *ai = res; ai != NULL && fd < 0; ai = ai->ai_next)
		if ((fd = connect_one(ai, &deadline)) < 0)
			last = errno;
	freeaddrinfo(res);
	if (fd < 0) {
		if (last == ETIMEDOUT)
			fail("cannot reach allotd at %s: no answer within "
			     "%d ms",
			    c->http, c->timeout_ms);
		else
			fail("cannot reach allotd at %s: %s", c->http,
			    errstr(last));
		return EXIT_UNREACHABLE;
	}
	char *req = xasprintf(
	    "GET %s HTTP/1.0\r\nHost: %s\r\nUser-Agent: "
	    "allotctl/%s\r\nAccept: */*\r\nConnection: close\r\n\r\n",
	    path, host, ALLOT_VERSION_STRING);
	size_t off = 0, reqlen = strlen(req);
	char *buf = NULL;
	size_t len = 0, cap = 0;
	const char *why = NULL;
	int werr = 0;
	while (off < reqlen) {
		struct pollfd p = { .fd = fd, .events = POLLOUT };
		if (poll(&p, 1, remaining_ms(&deadline)) <= 0) {
			why = "timeout";
			break;
		}
		ssize_t n = send(fd, req + off, reqlen - off, MSG_NOSIGNAL);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (n <= 0) {
			why = "send";
			werr = errno;
			break;
		}
		off += (size_t) n;
	}
	while (why == NULL) {
		if (cap - len < 4096) {
			cap = cap ? cap * 2 : 65536;
			buf = xrealloc(buf, cap + 1);
		}
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (poll(&p, 1, remaining_ms(&deadline)) <= 0) {
			why = "timeout";
			break;
		}
		ssize_t n = recv(fd, buf + len, cap - len, 0);
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (n < 0) {
			why = "recv";
			werr = errno;
			break;
		}
		if (n == 0)
			break;
		len += (size_t) n;
		if (len > HTTP_MAX_BYTES) {
			why = "too large";
			break;
		}
	}
	close(fd);
	free(req);
	if (why != NULL) {
		if (strcmp(why, "timeout") == 0)
			fail("cannot reach allotd at %s: no answer to GET %s "
			     "within %d ms",
			    c->http, path, c->timeout_ms);
		else if (strcmp(why, "too large") == 0)
			fail("allotd at %s: the answer to GET %s is larger "
			     "than %u bytes",
			    c->http, path, HTTP_MAX_BYTES);
		else
			fail("cannot reach allotd at %s: %s", c->http,
			    errstr(werr));
		free(buf);
		return EXIT_UNREACHABLE;
	}
	if (buf == NULL)
		buf = xcalloc(1, 1);
	buf[len] = '\0';
	int status = 0;
	char *body = strstr(buf, "\r\n\r\n");
	if (strncmp(buf, "HTTP/1.", 7) != 0 || len < 12 || body == NULL ||
	    sscanf(buf + 9, "%3d", &status) != 1) {
		fail("%s does not answer like allotd (not HTTP)", c->http);
		free(buf);
		return EXIT_UNREACHABLE;
	}
	body += 4;
	if (status != 200) {
		/* allotd's error bodies are one line of text. */
		size_t bl = strcspn(body, "\r\n");
		fail("allotd at %s answered %d to GET %s%s%.*s", c->http,
		    status, path, bl ? ": " : "", (int) (bl > 200 ? 200 : bl),
		    body);
		free(buf);
		return EXIT_UNREACHABLE;
	}
	size_t blen = len - (size_t) (body - buf);
	memmove(buf, body, blen + 1);
	*ret_body = buf;
	return 0;
}

/* ------------------------------------------------------------------ */
/* the /status document                                                */
/* ------------------------------------------------------------------ */

static json_object *
jget(json_object *o, const char *key)
{
	json_object *v = NULL;
	if (o == NULL || !json_object_is_type(o, json_type_object) ||
	    !json_object_object_get_ex(o, key, &v))
		return NULL;
	return v;
}

static const char *
jstr(json_object *o, const char *key)
{
	json_object *v = jget(o, key);
	return v != NULL && json_object_is_type(v, json_type_string) ?
	    json_object_get_string(v) :
	    "";
}

static double
jnum(json_object *o, const char *key)
{
	json_object *v = jget(o, key);
	if (v == NULL ||
	    !(json_object_is_type(v, json_type_int) ||
	        json_object_is_type(v, json_type_double)))
		return NAN;
	return json_object_get_double(v);
}

static double
jnum0(json_object *o, const char *key)
{
	double v = jnum(o, key);
	return isfinite(v) ? v : 0;
}

static bool
jbool(json_object *o, const char *key)
{
	json_object *v = jget(o, key);
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

/* Fetch and parse /status. 0 and the document (the caller puts it), or
 * an exit code after saying why. */
static int
get_status(const ctl *c, json_object **ret)
{
	char *body;
	int rc = http_get(c, "/status", &body);
	if (rc != 0)
		return rc;
	json_tokener *tok = json_tokener_new_ex(64);
	if (tok == NULL)
		die_oom();
	json_object *doc = json_tokener_parse_ex(
	    tok, body, (int) strlen(body));
	enum json_tokener_error jerr = json_tokener_get_error(tok);
	json_tokener_free(tok);
	free(body);
	if (doc == NULL || jerr != json_tokener_success ||
	    jget(doc, "config") == NULL || jget(doc, "services") == NULL) {
		fail("allotd at %s: /status is not the JSON document allotd "
		     "serves (%s)",
		    c->http,
		    doc == NULL || jerr != json_tokener_success ?
		        json_tokener_error_desc(jerr) :
		        "no config or services");
		json_object_put(doc);
		return EXIT_UNREACHABLE;
	}
	*ret = doc;
	return 0;
}

/* ------------------------------------------------------------------ */
/* status, replicas, quotas, shares, top-denied                        */
/* ------------------------------------------------------------------ */

static int
cmd_status(const ctl *c, int argc, char **argv)
{
	(void) argc;
	(void) argv;
	json_object *doc;
	int rc = get_status(c, &doc);
	if (rc != 0)
		return rc;
	json_object *cfg = jget(doc, "config");
	json_object *set = jget(doc, "settings");
	json_object *svcs = jget(doc, "services");
	json_object *store = jget(doc, "store");
	char *loaded = utc_ms((int64_t) jnum0(cfg, "loaded_at_ms"));
	char *ceil = num(jnum0(cfg, "ceiling_rate"));
	printf("allotd %s at %s", jstr(doc, "version"), c->http);
	if (isfinite(jnum(doc, "pid")))
		printf(" (pid %.0f)", jnum(doc, "pid"));
	printf("\nconfig    %s, epoch %.0f, digest %s, loaded %s\n",
	    jstr(cfg, "path"), jnum0(cfg, "epoch"), jstr(cfg, "digest"),
	    loaded);
	printf("quotas    %.0f", jnum0(cfg, "quotas"));
	if (jnum0(cfg, "ceiling_rate") > 0)
		printf(", global ceiling %s tokens/s\n", ceil);
	else
		printf(", no global ceiling\n");
	printf("settings  lease %.0f ms, sync interval %.0f ms, expiry after "
	       "%.0f intervals, allocator %s\n",
	    jnum0(set, "lease_ms"), jnum0(set, "interval_ms"),
	    jnum0(set, "expiry_intervals"), jstr(set, "allocator"));
	if (store == NULL || !json_object_is_type(store, json_type_object)) {
		printf("store     none\n");
	} else {
		double failures = jnum0(store, "commit_failures");
		double dropped = jnum0(store, "rows_dropped");
		bool bad = failures > 0 || dropped > 0;
		printf("store     %s: %.0f commits, %.0f failed",
		    bad ? "has had failures" : "ok", jnum0(store, "commits"),
		    failures);
		if (failures > 0)
			printf(" (last SQLite error %.0f)",
			    jnum0(store, "last_error"));
		printf(", %.0f rows pending, %.0f dropped\n",
		    jnum0(store, "pending_rows"), dropped);
	}
	size_t n = jlen(svcs);
	printf("sessions  %.0f live in %zu service%s\n",
	    jnum0(doc, "sessions"), n, n == 1 ? "" : "s");
	for (size_t i = 0; i < n; i++) {
		json_object *svc = jat(svcs, i);
		json_object *qs = jget(svc, "quotas");
		double adm = 0, den = 0;
		for (size_t q = 0; q < jlen(qs); q++) {
			adm += jnum0(jat(qs, q), "admitted_per_s");
			den += jnum0(jat(qs, q), "denied_per_s");
		}
		char *a = num(adm), *d = num(den);
		printf("  %s: %.0f replica%s, admitted %s tokens/s, denied %s "
		       "tokens/s",
		    jstr(svc, "name"), jnum0(svc, "live_replicas"),
		    jnum0(svc, "live_replicas") == 1 ? "" : "s", a, d);
		if (jnum0(cfg, "ceiling_rate") > 0) {
			char *p = pct(adm, jnum0(cfg, "ceiling_rate"));
			printf(" (%s of the ceiling)", p);
			free(p);
		}
		putchar('\n');
		free(a);
		free(d);
	}
	free(loaded);
	free(ceil);
	json_object_put(doc);
	return 0;
}

static int
cmd_replicas(const ctl *c, int argc, char **argv)
{
	const char *only = argc > 0 ? argv[0] : NULL;
	json_object *doc;
	int rc = get_status(c, &doc);
	if (rc != 0)
		return rc;
	json_object *svcs = jget(doc, "services");
	table t;
	table_init(&t, "llrllrrrl");
	table_row(&t, xstrdup("SERVICE"), xstrdup("REPLICA"),
	    xstrdup("SESSION"), xstrdup("HOST"), xstrdup("AGENT"),
	    xstrdup("PID"), xstrdup("LAST_SEQ"), xstrdup("SILENT_MS"),
	    xstrdup("STATE"));
	for (size_t i = 0; i < jlen(svcs); i++) {
		json_object *svc = jat(svcs, i);
		if (only != NULL && strcmp(jstr(svc, "name"), only) != 0)
			continue;
		json_object *reps = jget(svc, "replicas");
		for (size_t r = 0; r < jlen(reps); r++) {
			json_object *x = jat(reps, r);
			const char *host = jstr(x, "host");
			const char *ver = jstr(x, "agent_version");
			table_row(&t, xstrdup(jstr(svc, "name")),
			    xstrdup(jstr(x, "replica_id")),
			    xasprintf("%.0f", jnum0(x, "session")),
			    xstrdup(*host ? host : "-"),
			    xstrdup(*ver ? ver : "-"),
			    xasprintf("%.0f", jnum0(x, "pid")),
			    xasprintf("%.0f", jnum0(x, "last_seq")),
			    xasprintf("%.0f", jnum0(x, "silent_ms")),
			    xstrdup(jbool(x, "restored") ?
			            "restored (placeholder)" :
			            "live"));
		}
	}
	if (t.nrows == 1)
		printf(only ? "no live replica of service \"%s\"\n" :
		              "no live replicas%s\n",
		    only ? only : "");
	else
		table_print(&t, stdout);
	table_free(&t);
	json_object_put(doc);
	return 0;
}

static int
cmd_quotas(const ctl *c, int argc, char **argv)
{
	const char *only = argc > 0 ? argv[0] : NULL;
	json_object *doc;
	int rc = get_status(c, &doc);
	if (rc != 0)
		return rc;
	json_object *svcs = jget(doc, "services");
	table t;
	if (jlen(svcs) == 0) {
		/* No service registered: the configured quotas. */
		json_object *qs = jget(doc, "quotas");
		table_init(&t, "llrrl");
		table_row(&t, xstrdup("QUOTA"), xstrdup("PRIORITY"),
		    xstrdup("RATE/S"), xstrdup("BURST"), xstrdup("MODE"));
		for (size_t q = 0; q < jlen(qs); q++) {
			json_object *x = jat(qs, q);
			table_row(&t, xstrdup(jstr(x, "quota")),
			    xstrdup(jstr(x, "priority")),
			    num(jnum0(x, "rate")), num(jnum0(x, "burst")),
			    xstrdup(
			        jbool(x, "shadow") ? "shadow" : "enforce"));
		}
		printf("no service has registered yet; the quotas of config "
		       "epoch %.0f:\n",
		    jnum0(jget(doc, "config"), "epoch"));
		table_print(&t, stdout);
		table_free(&t);
		json_object_put(doc);
		return 0;
	}
	table_init(&t, "lllrrrrrrrr");
	table_row(&t, xstrdup("SERVICE"), xstrdup("QUOTA"),
	    xstrdup("PRIORITY"), xstrdup("RATE/S"), xstrdup("BURST"),
	    xstrdup("ADMITTED/S"), xstrdup("DENIED/S"), xstrdup("UTIL"),
	    xstrdup("GRANTED/S"), xstrdup("HOLDERS"), xstrdup("DEMAND/S"));
	for (size_t i = 0; i < jlen(svcs); i++) {
		json_object *svc = jat(svcs, i);
		if (only != NULL && strcmp(jstr(svc, "name"), only) != 0)
			continue;
		json_object *qs = jget(svc, "quotas");
		for (size_t q = 0; q < jlen(qs); q++) {
			json_object *x = jat(qs, q);
			table_row(&t, xstrdup(jstr(svc, "name")),
			    xstrdup(jstr(x, "quota")),
			    xstrdup(jstr(x, "priority")),
			    num(jnum0(x, "rate")), num(jnum0(x, "burst")),
			    num(jnum0(x, "admitted_per_s")),
			    num(jnum0(x, "denied_per_s")),
			    xasprintf("%.0f%%", 100 * jnum0(x, "utilization")),
			    num(jnum0(x, "sum_rate")),
			    xasprintf("%.0f/%.0f", jnum0(x, "holders"),
			        jnum0(svc, "live_replicas")),
			    num(jnum0(x, "demand")));
		}
	}
	if (t.nrows == 1)
		printf("no service \"%s\"\n", only);
	else
		table_print(&t, stdout);
	table_free(&t);
	json_object_put(doc);
	return 0;
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
	json_object *qs = jget(doc, "quotas");
	size_t n = jlen(qs);
	for (size_t q = 0; q < n; q++)
		if (strcmp(jstr(jat(qs, q), "quota"), caller) == 0)
			return jstr(jat(qs, q), "quota");
	for (int pass = 0; pass < 2; pass++) {
		const char *found = NULL;
		size_t hits = 0;
		for (size_t q = 0; q < n; q++) {
			const char *id = jstr(jat(qs, q), "quota");
			if (quota_hit(id, caller, pass)) {
				hits++;
				found = id;
			}
		}
		if (hits == 1)
			return found;
		if (hits > 1) {
			fail("\"%s\" matches %zu quotas; give the whole "
			     "identity:",
			    caller, hits);
			for (size_t q = 0; q < n; q++) {
				const char *id = jstr(jat(qs, q), "quota");
				if (quota_hit(id, caller, pass))
					fprintf(stderr, "    %s\n", id);
			}
			return NULL;
		}
	}
	fail("no quota matches \"%s\"; the quotas are:", caller);
	for (size_t q = 0; q < n; q++)
		fprintf(stderr, "    %s\n", jstr(jat(qs, q), "quota"));
	return NULL;
}

static int
cmd_shares(const ctl *c, int argc, char **argv)
{
	json_object *doc;
	int rc = get_status(c, &doc);
	if (rc != 0)
		return rc;
	const char *quota = match_quota(doc, argv[0]);
	if (quota == NULL) {
		json_object_put(doc);
		return EXIT_FAIL;
	}
	json_object *svcs = jget(doc, "services");
	size_t shown = 0;
	for (size_t i = 0; i < jlen(svcs); i++) {
		json_object *svc = jat(svcs, i);
		json_object *qs = jget(svc, "quotas");
		for (size_t q = 0; q < jlen(qs); q++) {
			json_object *x = jat(qs, q);
			if (strcmp(jstr(x, "quota"), quota) != 0)
				continue;
			json_object *sh = jget(x, "shares");
			double rate = jnum0(x, "rate");
			double sum = 0;
			table t;
			table_init(&t, "lrrrrr");
			table_row(&t, xstrdup("REPLICA"), xstrdup("SESSION"),
			    xstrdup("RATE/S"), xstrdup("BURST"),
			    xstrdup("TARGET/S"), xstrdup("OF_QUOTA"));
			for (size_t s = 0; s < jlen(sh); s++) {
				json_object *y = jat(sh, s);
				sum += jnum0(y, "rate");
				table_row(&t, xstrdup(jstr(y, "replica_id")),
				    xasprintf("%.0f", jnum0(y, "session")),
				    num(jnum0(y, "rate")),
				    num(jnum0(y, "burst")),
				    num(jnum0(y, "target_rate")),
				    pct(jnum0(y, "rate"), rate));
			}
			char *r = num(rate), *b = num(jnum0(x, "burst"));
			char *s = num(sum), *p = pct(sum, rate);
			printf("%s%s in service %s: quota %s tokens/s, burst "
			       "%s; %zu replica%s hold %s tokens/s (%s)\n",
			    shown ? "\n" : "", quota, jstr(svc, "name"), r, b,
			    jlen(sh), jlen(sh) == 1 ? "" : "s", s, p);
			if (jlen(sh) > 0)
				table_print(&t, stdout);
			free(r);
			free(b);
			free(s);
			free(p);
			table_free(&t);
			shown++;
		}
	}
	if (shown == 0)
		printf("%s: no service has registered, so no replica holds a "
		       "share yet\n",
		    quota);
	json_object_put(doc);
	return 0;
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
cmd_top_denied(const ctl *c, int argc, char **argv, long limit)
{
	(void) argc;
	(void) argv;
	json_object *doc;
	int rc = get_status(c, &doc);
	if (rc != 0)
		return rc;
	json_object *svcs = jget(doc, "services");
	denied_row *rows = NULL;
	size_t n = 0;
	for (size_t i = 0; i < jlen(svcs); i++) {
		json_object *svc = jat(svcs, i);
		json_object *qs = jget(svc, "quotas");
		for (size_t q = 0; q < jlen(qs); q++) {
			json_object *x = jat(qs, q);
			denied_row r = {
				.service = jstr(svc, "name"),
				.quota = jstr(x, "quota"),
				.denied_s = jnum0(x, "denied_per_s"),
				.admitted_s = jnum0(x, "admitted_per_s"),
				.denied_total = jnum0(x, "denied_total"),
				.admitted_total = jnum0(x, "admitted_total"),
			};
			if (r.denied_s <= 0 && r.denied_total <= 0)
				continue;
			rows = xrealloc(rows, (n + 1) * sizeof *rows);
			rows[n++] = r;
		}
	}
	if (n == 0) {
		printf("nobody has been denied since allotd started\n");
	} else {
		qsort(rows, n, sizeof *rows, cmp_denied);
		table t;
		table_init(&t, "llrrrrr");
		table_row(&t, xstrdup("SERVICE"), xstrdup("QUOTA"),
		    xstrdup("DENIED/S"), xstrdup("ADMITTED/S"),
		    xstrdup("DENIED_NOW"), xstrdup("DENIED_TOTAL"),
		    xstrdup("DENIED_ALL"));
		for (size_t i = 0; i < n && (long) i < limit; i++)
			table_row(&t, xstrdup(rows[i].service),
			    xstrdup(rows[i].quota), num(rows[i].denied_s),
			    num(rows[i].admitted_s),
			    pct(rows[i].denied_s,
			        rows[i].denied_s + rows[i].admitted_s),
			    num(rows[i].denied_total),
			    pct(rows[i].denied_total,
			        rows[i].denied_total +
			            rows[i].admitted_total));
		table_print(&t, stdout);
		table_free(&t);
	}
	free(rows);
	json_object_put(doc);
	return 0;
}

/* ------------------------------------------------------------------ */
/* reload                                                              */
/* ------------------------------------------------------------------ */

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
	int rc = http_get(c, "/metrics", &m);
	if (rc != 0)
		return rc;
	*ok = metric_value(m, "allotd_config_reloads_total{result=\"ok\"}");
	*failed = metric_value(
	    m, "allotd_config_reloads_total{result=\"fail\"}");
	free(m);
	if (*ok < 0 || *failed < 0) {
		fail("allotd at %s: /metrics has no "
		     "allotd_config_reloads_total",
		    c->http);
		return EXIT_UNREACHABLE;
	}
	return 0;
}

/* Every address of the --http host is a loopback address: allotd runs
 * on this machine, so its pid means something here. */
static bool
http_is_local(const ctl *c)
{
	char host[256], port[16];
	if (!split_hostport(c->http, host, sizeof host, port, sizeof port))
		return false;
	struct addrinfo hints = { .ai_family = AF_UNSPEC,
		.ai_socktype = SOCK_STREAM };
	struct addrinfo *res = NULL;
	if (getaddrinfo(host, port, &hints, &res) != 0)
		return false;
	bool local = res != NULL;
	for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
		if (ai->ai_family == AF_INET) {
			const struct sockaddr_in *s =
			    (const struct sockaddr_in *) ai->ai_addr;
			local &= (ntohl(s->sin_addr.s_addr) >> 24) == 127;
		} else if (ai->ai_family == AF_INET6) {
			const struct sockaddr_in6 *s =
			    (const struct sockaddr_in6 *) ai->ai_addr;
			local &= IN6_IS_ADDR_LOOPBACK(&s->sin6_addr);
		} else {
			local = false;
		}
	}
	freeaddrinfo(res);
	return local;
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
		fail("cannot read the pid file %s: %s", path, errstr(errno));
		return false;
	}
	char line[64] = "";
	bool ok = fgets(line, sizeof line, f) != NULL;
	fclose(f);
	line[strcspn(line, " \t\r\n")] = '\0';
	if (!ok || !parse_int(line, 1, INT_MAX, ret)) {
		fail("%s does not hold a process id", path);
		return false;
	}
	return true;
}

typedef struct reload_opts {
	long pid; /* 0: from --pid-file or /status */
	const char *pid_file;
	long wait_ms;
	bool check; /* validate the file before signalling */
} reload_opts;

static int
cmd_reload(const ctl *c, const reload_opts *o)
{
	json_object *doc;
	int rc = get_status(c, &doc);
	if (rc != 0)
		return rc;
	json_object *cfg = jget(doc, "config");
	double epoch0 = jnum0(cfg, "epoch");
	char digest0[32];
	snprintf(digest0, sizeof digest0, "%s", jstr(cfg, "digest"));
	char *path = xstrdup(jstr(cfg, "path"));
	long status_pid = isfinite(jnum(doc, "pid")) ?
	    (long) jnum(doc, "pid") :
	    0;
	json_object_put(doc);
	rc = EXIT_FAIL;

	/* Which process: --pid, --pid-file, or the pid allotd reports
	 * when it listens on this host. Whichever it is must be an allotd
	 * and, when allotd runs here, the one answering on --http. */
	long pid = o->pid;
	if (pid == 0 && o->pid_file != NULL &&
	    !read_pid_file(o->pid_file, &pid))
		goto out;
	bool local = http_is_local(c);
	if (pid == 0) {
		if (!local) {
			fail("reload sends SIGHUP to allotd, so it works on "
			     "allotd's own host: run it there, or give --pid "
			     "or --pid-file");
			rc = EXIT_USAGE;
			goto out;
		}
		pid = status_pid;
		if (pid <= 0) {
			fail("allotd at %s does not report its pid; give "
			     "--pid or --pid-file",
			    c->http);
			goto out;
		}
	} else if (local && status_pid > 0 && status_pid != pid) {
		fail("allotd at %s has pid %ld, not %ld: refusing to signal "
		     "another process",
		    c->http, status_pid, pid);
		goto out;
	}
	char comm[64];
	proc_comm(pid, comm, sizeof comm);
	if (strcmp(comm, "allotd") != 0) {
		if (comm[0] == '\0')
			fail("no process %ld on this host (is allotd in "
			     "another pid namespace? give --pid)",
			    pid);
		else
			fail("process %ld is \"%s\", not allotd: refusing to "
			     "signal it",
			    pid, comm);
		goto out;
	}

	/* Validate what allotd will read, when we can read it too: a bad
	 * file is then reported with the loader's own message and allotd
	 * is left alone. A relative path is relative to allotd's cwd. */
	char full[PATH_MAX + 1];
	if (path[0] == '/') {
		snprintf(full, sizeof full, "%s", path);
	} else {
		char link[64], cwd[PATH_MAX];
		snprintf(link, sizeof link, "/proc/%ld/cwd", pid);
		ssize_t l = readlink(link, cwd, sizeof cwd - 1);
		if (l > 0) {
			cwd[l] = '\0';
			snprintf(full, sizeof full, "%s/%s", cwd, path);
		} else {
			snprintf(full, sizeof full, "%s", path);
		}
	}
	if (o->check && access(full, R_OK) == 0) {
		char err[1024] = "";
		allot_config *tmp = NULL;
		int lrc = allot_config_load(full, err, sizeof err, &tmp);
		allot_config_free(tmp);
		if (lrc != ALLOT_OK) {
			fputs(err[0] ? err : allot_strerror(lrc), stderr);
			fputc('\n', stderr);
			fail("%s is not valid; nothing was sent, allotd keeps "
			     "config epoch %.0f (digest %s)",
			    path, epoch0, digest0);
			goto out;
		}
	} else if (o->check) {
		fprintf(stderr,
		    "allotctl: note: cannot read %s here (%s); "
		    "allotd will validate it\n",
		    full, errstr(errno));
	}

	double ok0, failed0;
	if ((rc = reload_counters(c, &ok0, &failed0)) != 0)
		goto out;
	rc = EXIT_FAIL;
	if (kill((pid_t) pid, SIGHUP) != 0) {
		if (errno == EPERM)
			fail("not permitted to signal allotd (pid %ld): run "
			     "allotctl as allotd's user or as root",
			    pid);
		else
			fail("cannot signal allotd (pid %ld): %s", pid,
			    errstr(errno));
		goto out;
	}
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		double ok, failed;
		if ((rc = reload_counters(c, &ok, &failed)) != 0)
			goto out;
		rc = EXIT_FAIL;
		if (failed > failed0) {
			fail("allotd rejected %s and keeps config epoch %.0f "
			     "(digest %s); its log has the reason "
			     "(ALLOTD-RELOAD-FAIL)",
			    path, epoch0, digest0);
			goto out;
		}
		if (ok > ok0)
			break;
		struct timespec now;
		clock_gettime(CLOCK_MONOTONIC, &now);
		long el = (long) (now.tv_sec - t0.tv_sec) * 1000 +
		    (now.tv_nsec - t0.tv_nsec) / 1000000;
		if (el >= o->wait_ms) {
			fail("sent SIGHUP to allotd (pid %ld) but it did not "
			     "report a reload within %ld ms",
			    pid, o->wait_ms);
			goto out;
		}
		usleep(50000);
	}
	if ((rc = get_status(c, &doc)) != 0)
		goto out;
	cfg = jget(doc, "config");
	double epoch1 = jnum0(cfg, "epoch");
	if (epoch1 != epoch0)
		printf("reloaded %s: epoch %.0f -> %.0f, digest %s -> %s; "
		       "agents get the new shares on their next sync\n",
		    path, epoch0, epoch1, digest0, jstr(cfg, "digest"));
	else
		printf("%s is unchanged (digest %s); epoch stays %.0f\n", path,
		    jstr(cfg, "digest"), epoch1);
	json_object_put(doc);
	rc = 0;
out:
	free(path);
	return rc;
}

/* ------------------------------------------------------------------ */
/* check-config                                                        */
/* ------------------------------------------------------------------ */

typedef struct check_opts {
	double capacity; /* tested capacity, requests/s; 0: unknown */
	double max_overcommit; /* exit 1 above this ratio; 0: no limit */
} check_opts;

static int
cmd_check_config(const char *file, const check_opts *o)
{
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

	table t;
	table_init(&t, "llrrrl");
	table_row(&t, xstrdup("QUOTA"), xstrdup("PRIORITY"), xstrdup("RATE/S"),
	    xstrdup("BURST"), xstrdup("FIRST_SECOND"), xstrdup("MODE"));
	double sum_rate = 0, sum_burst = 0;
	for (size_t i = 0; i < cfg->ncallers; i++) {
		const allot__quota *q = &cfg->callers[i];
		sum_rate += q->rate;
		sum_burst += q->burst;
		table_row(&t, xstrdup(q->identity),
		    xstrdup(cfg->classes[q->priority]), num(q->rate),
		    num(q->burst), num(q->rate + q->burst),
		    xstrdup(q->shadow ? "shadow" : "enforce"));
	}
	const allot__quota *d = &cfg->def;
	table_row(&t,
	    xstrdup(d->shared ? "default (shared by unknown "
	                        "callers)" :
	                        "default (each unknown caller)"),
	    xstrdup(cfg->classes[d->priority]), num(d->rate), num(d->burst),
	    num(d->rate + d->burst),
	    xstrdup(d->shadow ? "shadow" : "enforce"));
	putchar('\n');
	table_print(&t, stdout);
	table_free(&t);

	size_t n = cfg->ncallers;
	char *sr = num(sum_rate), *sb = num(sum_burst);
	char *sf = num(sum_rate + sum_burst);
	printf("\nallocation: %zu caller%s, %s tokens/s in total", n,
	    n == 1 ? "" : "s", sr);
	if (d->shared) {
		char *dr = num(d->rate), *all = num(sum_rate + d->rate);
		printf(" (%s with the shared default's %s)", all, dr);
		free(dr);
		free(all);
	} else {
		char *dr = num(d->rate);
		printf(" (plus %s per unknown caller: the default is not "
		       "shared)",
		    dr);
		free(dr);
	}
	putchar('\n');
	int rc = 0;
	double over = 0;
	if (cfg->ceiling_rate > 0) {
		char *c = num(cfg->ceiling_rate);
		over = sum_rate / cfg->ceiling_rate;
		char *r = ratio(over);
		if (sum_rate > cfg->ceiling_rate) {
			char *more = num(sum_rate - cfg->ceiling_rate);
			printf(
			    "ceiling:    %s tokens/s: overcommitted %sx "
			    "(%s vs %s, %s tokens/s more than the ceiling)\n",
			    c, r, sr, c, more);
			free(more);
		} else {
			printf("ceiling:    %s tokens/s: not overcommitted "
			       "(%s vs %s, %.0f%% allocated)\n",
			    c, sr, c, 100 * over);
		}
		free(r);
		free(c);
	} else {
		printf("ceiling:    none: nothing bounds the callers "
		       "together (add quotas.global_ceiling)\n");
	}
	/* The reference's sizing: a caller with rate R and burst B that
	 * bursts admits up to R + B in its first second (the bucket drains
	 * B while refilling R). Correlated, every caller does so at once. */
	printf("burst:      if every caller bursts together, the first "
	       "second admits up to sum(rate + burst) = %s + %s = %s tokens",
	    sr, sb, sf);
	if (n > 0) {
		bool equal = true;
		for (size_t i = 1; i < n; i++)
			equal &= cfg->callers[i].rate ==
			        cfg->callers[0].rate &&
			    cfg->callers[i].burst == cfg->callers[0].burst;
		if (equal && n > 1) {
			char *r = num(cfg->callers[0].rate);
			char *b = num(cfg->callers[0].burst);
			char *p = num(
			    cfg->callers[0].rate + cfg->callers[0].burst);
			printf(" (%zu callers x (%s + %s) = %zu x %s)", n, r,
			    b, n, p);
			free(r);
			free(b);
			free(p);
		}
	}
	putchar('\n');
	if (cfg->ceiling_rate > 0) {
		char *r = ratio((sum_rate + sum_burst) / cfg->ceiling_rate);
		printf("            %sx the ceiling for that second; "
		       "afterwards at most %s tokens/s\n",
		    r, sr);
		free(r);
	}
	if (o->capacity > 0) {
		char *cap = num(o->capacity);
		char *r = ratio((sum_rate + sum_burst) / o->capacity);
		printf("capacity:   %s requests/s tested: the allocation is "
		       "%.0f%% of it, the correlated first second %.0f%% "
		       "(%sx)\n",
		    cap, 100 * sum_rate / o->capacity,
		    100 * (sum_rate + sum_burst) / o->capacity, r);
		free(r);
		if (cfg->default_weight != 1 || cfg->nendpoints > 0)
			printf("            (tokens are requests only where "
			       "the endpoint weight is 1; weighted endpoints "
			       "admit fewer requests)\n");
		free(cap);
	}
	if (o->max_overcommit > 0 && cfg->ceiling_rate > 0 &&
	    over > o->max_overcommit) {
		char *r = ratio(over), *m = ratio(o->max_overcommit);
		fail("%s: overcommit %sx is above --max-overcommit %s", file,
		    r, m);
		free(r);
		free(m);
		rc = EXIT_FAIL;
	}
	free(sr);
	free(sb);
	free(sf);
	allot_config_free(cfg);
	return rc;
}

/* ------------------------------------------------------------------ */
/* audit                                                               */
/* ------------------------------------------------------------------ */

/* The standard audit questions (docs/operations.md's cookbook), each a
 * query on one store schema "S". Several stores are combined with
 * UNION ALL, a "db" column naming the file. */
static const struct audit_query {
	const char *title;
	const char *sql; /* %1$s is the schema, e.g. "db0" */
	const char *order; /* applied to the union */
} audit_queries[] = {
	{ "Configs loaded",
	    "SELECT epoch, digest, path, bytes, loaded FROM %1$s.v_configs",
	    "loaded" },
	{ "Consumption per caller (tokens)",
	    "SELECT service, quota, sum(admitted) AS admitted, sum(denied) AS "
	    "denied, round(100.0 * sum(denied) / max(sum(admitted) + "
	    "sum(denied), 1), 2) AS denied_pct, count(*) AS seconds, "
	    "max(live_replicas) AS max_replicas FROM %1$s.usage "
	    "GROUP BY service, quota",
	    "admitted DESC" },
	{ "Who was denied",
	    "SELECT service, quota, denied, admitted, denied_pct, "
	    "denied_per_s, first_denied, last_denied FROM %1$s.v_denied",
	    "denied DESC" },
	{ "Replicas per service",
	    "SELECT service, count(*) AS sessions, sum(left_at IS NULL) AS "
	    "live, sum(left_why IS 'leave') AS left, sum(left_why IS "
	    "'expired') AS expired, sum(left_why IS 'replaced') AS replaced, "
	    "sum(left_why IS 'shutdown') AS shutdown FROM %1$s.replicas "
	    "GROUP BY service",
	    "service" },
	{ "Share changes per caller",
	    "SELECT service, quota, count(*) AS changes, count(DISTINCT "
	    "session) AS replicas, round(min(rate), 3) AS min_rate, "
	    "round(max(rate), 3) AS max_rate FROM %1$s.share_history "
	    "GROUP BY service, quota",
	    "service, quota" },
	{ "Live replicas (as the coordinator last knew)",
	    "SELECT service, replica_id, session, host, agent_version, "
	    "last_seen, silent_s FROM %1$s.v_live_replicas",
	    "service, replica_id" },
	{ "Events", "SELECT at, kind, subject, detail FROM %1$s.v_events",
	    "at DESC" },
};

/* "file:" URI for a path, read-only, every special byte escaped. */
static char *
ro_uri(const char *path)
{
	size_t n = strlen(path);
	char *u = xcalloc(n * 3 + 32, 1);
	char *p = u + sprintf(u, "file:");
	for (const unsigned char *s = (const unsigned char *) path; *s; s++) {
		if (isalnum(*s) || strchr("/-._~", *s) != NULL)
			*p++ = (char) *s;
		else
			p += sprintf(p, "%%%02X", *s);
	}
	strcpy(p, "?mode=ro");
	return u;
}

static int
audit_print(sqlite3 *db, const char *title, const char *sql, bool show_sql)
{
	sqlite3_stmt *st = NULL;
	if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
		fail("%s: %s", title, sqlite3_errmsg(db));
		return EXIT_FAIL;
	}
	int ncol = sqlite3_column_count(st);
	char *align = xcalloc((size_t) ncol + 1, 1);
	memset(align, 'l', (size_t) ncol);
	table t;
	table_init(&t, align);
	/* A row at a time through a va_list is awkward for a variable
	 * column count: fill the cells directly. */
	t.cap = 16;
	t.cells = xcalloc(t.cap * (size_t) ncol, sizeof *t.cells);
	for (int i = 0; i < ncol; i++)
		t.cells[i] = xstrdup(sqlite3_column_name(st, i));
	t.nrows = 1;
	int rc;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		if (t.nrows == t.cap) {
			t.cap *= 2;
			t.cells = xrealloc(
			    t.cells, t.cap * (size_t) ncol * sizeof *t.cells);
		}
		for (int i = 0; i < ncol; i++) {
			int ty = sqlite3_column_type(st, i);
			const unsigned char *v = sqlite3_column_text(st, i);
			if (ty == SQLITE_INTEGER || ty == SQLITE_FLOAT)
				align[i] = 'r';
			t.cells[t.nrows * (size_t) ncol + (size_t) i] =
			    xstrdup(ty == SQLITE_NULL || v == NULL ?
			            "-" :
			            (const char *) v);
		}
		t.nrows++;
	}
	/* Header cells of numeric columns align with their numbers. */
	printf("== %s\n", title);
	if (show_sql)
		printf("-- %s;\n", sql);
	if (rc != SQLITE_DONE) {
		fail("%s: %s", title, sqlite3_errmsg(db));
		rc = EXIT_FAIL;
	} else {
		if (t.nrows == 1)
			printf("(no rows)\n");
		else
			table_print(&t, stdout);
		rc = 0;
	}
	putchar('\n');
	sqlite3_finalize(st);
	table_free(&t);
	free(align);
	return rc;
}

/* PRAGMA db<i>.<name>, an integer. */
static bool
pragma_int(sqlite3 *db, int i, const char *name, int *ret)
{
	char *sql = xasprintf("PRAGMA db%d.%s", i, name);
	sqlite3_stmt *st = NULL;
	int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
	free(sql);
	if (rc == SQLITE_OK)
		rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		*ret = sqlite3_column_int(st, 0);
	sqlite3_finalize(st);
	return rc == SQLITE_ROW;
}

static int
cmd_audit(int ndb, char **paths, long limit, bool show_sql)
{
	sqlite3 *db = NULL;
	int rc = EXIT_FAIL;
	if (sqlite3_open_v2(":memory:", &db,
	        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_URI,
	        NULL) != SQLITE_OK) {
		fail("cannot start SQLite: %s",
		    db ? sqlite3_errmsg(db) : "out of memory");
		goto out;
	}
	sqlite3_busy_timeout(db, 2000);
	for (int i = 0; i < ndb; i++) {
		if (access(paths[i], R_OK) != 0) {
			fail("cannot open %s: %s", paths[i], errstr(errno));
			goto out;
		}
		char *uri = ro_uri(paths[i]);
		char *sql = xasprintf("ATTACH ?1 AS db%d", i);
		sqlite3_stmt *st = NULL;
		int src = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
		if (src == SQLITE_OK)
			sqlite3_bind_text(st, 1, uri, -1, SQLITE_TRANSIENT);
		if (src == SQLITE_OK)
			src = sqlite3_step(st);
		sqlite3_finalize(st);
		free(sql);
		free(uri);
		if (src != SQLITE_DONE) {
			fail("cannot open %s: %s", paths[i],
			    sqlite3_errmsg(db));
			goto out;
		}
		/* An allot store, new enough to have the audit views. */
		int app = 0, ver = 0;
		if (!pragma_int(db, i, "application_id", &app) ||
		    !pragma_int(db, i, "user_version", &ver)) {
			fail("%s is not a readable SQLite database: %s",
			    paths[i], sqlite3_errmsg(db));
			goto out;
		}
		if (app != ALLOT_APPLICATION_ID) {
			fail("%s is not an allot store (application_id "
			     "0x%08x)",
			    paths[i], (unsigned) app);
			goto out;
		}
		if (ver < AUDIT_VIEWS_VERSION) {
			fail("%s has schema version %d, without the audit "
			     "views (version %d); open it once with a current "
			     "allotd",
			    paths[i], ver, AUDIT_VIEWS_VERSION);
			goto out;
		}
	}
	if (ndb > 1) {
		printf("stores:");
		for (int i = 0; i < ndb; i++)
			printf(" %s%s", paths[i], i + 1 < ndb ? "," : "\n");
		putchar('\n');
	}
	rc = 0;
	for (size_t q = 0; q < sizeof audit_queries / sizeof audit_queries[0];
	     q++) {
		const struct audit_query *aq = &audit_queries[q];
		char *sql = NULL;
		for (int i = 0; i < ndb; i++) {
			char schema[16];
			snprintf(schema, sizeof schema, "db%d", i);
			char *one = NULL;
			/* The query text is ours (audit_queries), only the
			 * schema name is substituted. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
			if (asprintf(&one, aq->sql, schema) < 0)
				die_oom();
#pragma GCC diagnostic pop
			char *label = NULL;
			if (ndb > 1) {
				/* The file's name as a string literal. */
				char *quoted = sqlite3_mprintf("%Q", paths[i]);
				if (quoted == NULL)
					die_oom();
				label = xasprintf("SELECT %s AS db, * FROM "
				                  "(%s)",
				    quoted, one);
				sqlite3_free(quoted);
				free(one);
				one = label;
			}
			char *joined = sql ?
			    xasprintf("%s UNION ALL %s", sql, one) :
			    xstrdup(one);
			free(sql);
			free(one);
			sql = joined;
		}
		char *full = xasprintf("SELECT * FROM (%s) ORDER BY %s%s "
		                       "LIMIT %ld",
		    sql, ndb > 1 ? "db, " : "", aq->order, limit);
		free(sql);
		if (audit_print(db, aq->title, full, show_sql) != 0)
			rc = EXIT_FAIL;
		free(full);
	}
out:
	sqlite3_close(db);
	return rc;
}

/* ------------------------------------------------------------------ */
/* help                                                                */
/* ------------------------------------------------------------------ */

#define COMMON_OPTIONS                                                      \
	"COMMON OPTIONS\n"                                                  \
	"    --http HOST:PORT\n"                                            \
	"        allotd's HTTP address (its --http option). Default: the\n" \
	"        ALLOT_HTTP environment variable, else " DEFAULT_HTTP ".\n" \
	"    --timeout MS\n"                                                \
	"        Give up on an HTTP exchange after MS milliseconds "        \
	"(default\n"                                                        \
	"        3000).\n"                                                  \
	"    -h, --help\n"                                                  \
	"        Print this text.\n"

#define EXIT_TEXT                                                             \
	"EXIT STATUS\n"                                                       \
	"    0 success; 1 the command failed (see its description); 2 bad\n"  \
	"    command line; 3 allotd could not be reached or did not answer\n" \
	"    like allotd.\n"

static const struct command_help {
	const char *name;
	const char *summary;
	const char *text;
} helps[] = {
	{ "status", "the coordinator's state at a glance",
	    "NAME\n"
	    "    allotctl status - the coordinator's state at a glance\n"
	    "\n"
	    "SYNOPSIS\n"
	    "    allotctl [--http HOST:PORT] status\n"
	    "\n"
	    "DESCRIPTION\n"
	    "    Reads GET /status and prints allotd's version and pid, the "
	    "quota\n"
	    "    config in force (path, epoch, digest, when it was loaded), "
	    "the\n"
	    "    number of quotas and the global ceiling, the protocol "
	    "settings\n"
	    "    (lease, sync interval, expiry), the store's health "
	    "(commits,\n"
	    "    failed commits with the last SQLite error code, rows waiting "
	    "to\n"
	    "    be written, rows dropped), and per service its live replicas "
	    "and\n"
	    "    the tokens per second admitted and denied over the last "
	    "whole\n"
	    "    second, with the share of the ceiling in use.\n"
	    "\n"
	    "    \"store: has had failures\" means a group commit failed at "
	    "some\n"
	    "    point since allotd started; rate limiting is not affected "
	    "(see\n"
	    "    docs/operations.md, \"Failure behaviour of the store\").\n"
	    "\n" COMMON_OPTIONS "\n" EXIT_TEXT "\n"
	    "EXAMPLE\n"
	    "    allotctl --http 127.0.0.1:7480 status\n" },
	{ "replicas", "the live replicas of every service",
	    "NAME\n"
	    "    allotctl replicas - the live replicas of every service\n"
	    "\n"
	    "SYNOPSIS\n"
	    "    allotctl [--http HOST:PORT] replicas [SERVICE]\n"
	    "\n"
	    "DESCRIPTION\n"
	    "    One row per live session: SERVICE, REPLICA (the agent's\n"
	    "    replica_id), SESSION, HOST, AGENT (version), PID, LAST_SEQ "
	    "(the\n"
	    "    last sync accepted), SILENT_MS (time since its last sync; a\n"
	    "    replica silent for expiry-intervals x interval is expired) "
	    "and\n"
	    "    STATE: \"live\", or \"restored (placeholder)\" for a "
	    "replica\n"
	    "    that was live when allotd last stopped and has not "
	    "registered\n"
	    "    again yet (it still counts toward the replica count). With\n"
	    "    SERVICE, only that service's replicas.\n"
	    "\n" COMMON_OPTIONS "\n" EXIT_TEXT },
	{ "quotas", "per service and quota: usage against the quota",
	    "NAME\n"
	    "    allotctl quotas - per service and quota: usage against the "
	    "quota\n"
	    "\n"
	    "SYNOPSIS\n"
	    "    allotctl [--http HOST:PORT] quotas [SERVICE]\n"
	    "\n"
	    "DESCRIPTION\n"
	    "    One row per service and quota: PRIORITY (the quota's "
	    "class),\n"
	    "    RATE/S and BURST (the quota R and B), ADMITTED/S and "
	    "DENIED/S\n"
	    "    (tokens over the last whole second, summed over the "
	    "replicas),\n"
	    "    UTIL (admitted / R), GRANTED/S (the sum of the shares the\n"
	    "    replicas were sent; at most R), HOLDERS (replicas holding a\n"
	    "    share / live replicas) and DEMAND/S (what the replicas "
	    "would\n"
	    "    admit if allowed). Before any service has registered it "
	    "lists\n"
	    "    the configured quotas instead (QUOTA, PRIORITY, RATE/S, "
	    "BURST,\n"
	    "    MODE: enforce or shadow).\n"
	    "\n" COMMON_OPTIONS "\n" EXIT_TEXT },
	{ "shares", "each replica's share of one caller's quota",
	    "NAME\n"
	    "    allotctl shares - each replica's share of one caller's "
	    "quota\n"
	    "\n"
	    "SYNOPSIS\n"
	    "    allotctl [--http HOST:PORT] shares CALLER\n"
	    "\n"
	    "DESCRIPTION\n"
	    "    For every service whose replicas enforce the quota of "
	    "CALLER,\n"
	    "    a line with the quota and the sum of the shares held, then "
	    "one\n"
	    "    row per replica: RATE/S and BURST (the share it was last "
	    "sent\n"
	    "    and enforces), TARGET/S (what the allocator wants it to "
	    "hold;\n"
	    "    a share grows to its target only out of the quota's "
	    "headroom,\n"
	    "    so the sum never exceeds the quota) and OF_QUOTA.\n"
	    "\n"
	    "    CALLER is the quota's identity as in the quota file (e.g.\n"
	    "    spiffe://prod.example.internal/ns/payments/sa/checkout), or\n"
	    "    \"default\", or any unambiguous part of an identity: its "
	    "last\n"
	    "    path segment (\"checkout\") or a substring.\n"
	    "\n" COMMON_OPTIONS "\n" EXIT_TEXT
	    "    Exit status 1 also when no quota, or more than one, matches\n"
	    "    CALLER; the quotas are listed.\n" },
	{ "top-denied", "the callers being denied, most first",
	    "NAME\n"
	    "    allotctl top-denied - the callers being denied, most first\n"
	    "\n"
	    "SYNOPSIS\n"
	    "    allotctl [--http HOST:PORT] top-denied [-n N]\n"
	    "\n"
	    "DESCRIPTION\n"
	    "    Every service and quota with denials since allotd started,\n"
	    "    ordered by DENIED/S (tokens denied over the last whole "
	    "second),\n"
	    "    then by DENIED_TOTAL. DENIED_NOW is the share of the "
	    "requested\n"
	    "    tokens denied in the last second, DENIED_ALL the same since\n"
	    "    allotd started. A caller denied steadily has reached its "
	    "quota:\n"
	    "    either it needs a larger one or it is misbehaving. For "
	    "history\n"
	    "    beyond allotd's uptime, use allotctl audit (the v_denied "
	    "view).\n"
	    "\n"
	    "OPTIONS\n"
	    "    -n, --limit N\n"
	    "        Print at most N rows (default 10).\n"
	    "\n" COMMON_OPTIONS "\n" EXIT_TEXT },
	{ "reload", "make allotd re-read its quota file",
	    "NAME\n"
	    "    allotctl reload - make allotd re-read its quota file\n"
	    "\n"
	    "SYNOPSIS\n"
	    "    allotctl [--http HOST:PORT] reload [--pid PID | --pid-file "
	    "FILE]\n"
	    "             [--wait MS] [--no-check]\n"
	    "\n"
	    "DESCRIPTION\n"
	    "    Validates the quota file allotd uses (the path in /status,\n"
	    "    relative to allotd's working directory) with the same "
	    "loader,\n"
	    "    then sends allotd SIGHUP and waits until allotd reports the\n"
	    "    reload in /metrics. Prints the new epoch and digest, or "
	    "that\n"
	    "    the file is unchanged (same digest: same epoch, nothing sent "
	    "to\n"
	    "    the agents). A file that does not validate is reported with "
	    "the\n"
	    "    loader's FILE:LINE:COL message and not signalled at all; "
	    "allotd\n"
	    "    keeps the config in force.\n"
	    "\n"
	    "AUTHENTICATION\n"
	    "    allotd's HTTP endpoints are read-only: nobody who can reach "
	    "the\n"
	    "    HTTP port can change anything. A reload is a signal, and "
	    "the\n"
	    "    kernel lets only allotd's own user (or root) signal it; the\n"
	    "    quota file itself is whatever that user may write. So "
	    "reload\n"
	    "    runs on allotd's host, as allotd's user or root. The process "
	    "is\n"
	    "    the one given with --pid or --pid-file, or else the pid "
	    "allotd\n"
	    "    reports in /status (only when --http is a loopback "
	    "address);\n"
	    "    allotctl refuses to signal a process whose name is not\n"
	    "    \"allotd\", or, with a loopback --http, one that is not the\n"
	    "    allotd answering there.\n"
	    "\n"
	    "OPTIONS\n"
	    "    --pid PID\n"
	    "        allotd's process id (needed when allotd runs in another "
	    "pid\n"
	    "        namespace, e.g. a container).\n"
	    "    --pid-file FILE\n"
	    "        Read the process id from FILE (first line).\n"
	    "    --wait MS\n"
	    "        How long to wait for allotd to report the reload "
	    "(default\n"
	    "        5000).\n"
	    "    --no-check\n"
	    "        Do not validate the file first; allotd still refuses a "
	    "bad\n"
	    "        one, and its log (ALLOTD-RELOAD-FAIL) says why.\n"
	    "\n" COMMON_OPTIONS "\n" EXIT_TEXT
	    "    Exit status 1 when the file is invalid, allotd rejected it, "
	    "the\n"
	    "    process may not be signalled, or no reload was reported in "
	    "time.\n"
	    "\n"
	    "EXAMPLE\n"
	    "    sudo -u allot allotctl reload\n" },
	{ "check-config", "validate a quota file and size it, offline",
	    "NAME\n"
	    "    allotctl check-config - validate a quota file and size it, "
	    "offline\n"
	    "\n"
	    "SYNOPSIS\n"
	    "    allotctl check-config FILE [--capacity RPS] "
	    "[--max-overcommit X]\n"
	    "\n"
	    "DESCRIPTION\n"
	    "    Loads FILE with the loader allotd and the agents use, so a "
	    "file\n"
	    "    that passes here loads there (for quota changes reviewed in\n"
	    "    CI). An invalid file prints the loader's message, in the "
	    "form\n"
	    "    FILE:LINE:COL: what was wrong, expected what, and exits 1.\n"
	    "\n"
	    "    A valid file prints its digest and every quota with its "
	    "class,\n"
	    "    rate, burst and FIRST_SECOND (rate + burst: the most the "
	    "caller\n"
	    "    can be admitted in one second, starting from a full "
	    "bucket),\n"
	    "    then the sizing arithmetic:\n"
	    "\n"
	    "    allocation  the callers' rates added up. Against the global\n"
	    "                ceiling this is the overcommit: 900 tokens/s of\n"
	    "                callers under an 800 ceiling is 1.12x. "
	    "Overcommit is\n"
	    "                normal (callers rarely peak together); the "
	    "ceiling\n"
	    "                and the shed order decide who gives way when "
	    "they do.\n"
	    "    burst       the worst case if every caller bursts at the "
	    "same\n"
	    "                moment (a deploy, a cron job firing "
	    "everywhere):\n"
	    "                sum(rate + burst) tokens in the first second. "
	    "Ten\n"
	    "                callers at 140/s with a burst of 280 give 10 x "
	    "420 =\n"
	    "                4200 in that second, twice a service tested at "
	    "2000\n"
	    "                requests/s. Size bursts for how likely callers "
	    "are to\n"
	    "                burst together, not for one caller alone.\n"
	    "\n"
	    "    The default quota is listed but not added up: it is one "
	    "small\n"
	    "    bucket when shared, and one per unknown caller when not.\n"
	    "\n"
	    "OPTIONS\n"
	    "    --capacity RPS\n"
	    "        The protected service's tested capacity in requests/s; "
	    "the\n"
	    "        allocation and the correlated burst are also given as a\n"
	    "        share of it.\n"
	    "    --max-overcommit X\n"
	    "        Exit 1 when the callers' rates exceed X times the "
	    "ceiling\n"
	    "        (e.g. 1.5), to hold quota changes to a policy in CI.\n"
	    "    -h, --help\n"
	    "        Print this text.\n"
	    "\n"
	    "EXIT STATUS\n"
	    "    0 the file is valid (and within --max-overcommit); 1 it is "
	    "not,\n"
	    "    or cannot be read; 2 bad command line.\n"
	    "\n"
	    "EXAMPLE\n"
	    "    allotctl check-config --capacity 2000 "
	    "/etc/allot/quotas.yaml\n" },
	{ "audit", "the standard audit queries on store files",
	    "NAME\n"
	    "    allotctl audit - the standard audit queries on store files\n"
	    "\n"
	    "SYNOPSIS\n"
	    "    allotctl audit [--limit N] [--sql] DB [DB...]\n"
	    "\n"
	    "DESCRIPTION\n"
	    "    Opens each DB (an allotd --db file) read-only and prints, "
	    "as\n"
	    "    tables: the configs loaded, consumption per caller, who was\n"
	    "    denied (v_denied), replicas per service with how they left,\n"
	    "    share changes per caller, the live replicas "
	    "(v_live_replicas)\n"
	    "    and the most recent events. With several files (the stores "
	    "of\n"
	    "    several coordinators, or old copies) they are ATTACHed to "
	    "one\n"
	    "    connection and every table gets a first column \"db\" "
	    "naming\n"
	    "    the file. Safe on a live store: reads take no write lock "
	    "(WAL).\n"
	    "    docs/operations.md has these and more queries for the "
	    "sqlite3\n"
	    "    shell.\n"
	    "\n"
	    "OPTIONS\n"
	    "    --limit N\n"
	    "        At most N rows per table (default 50).\n"
	    "    --sql\n"
	    "        Print each query before its table, to adapt in the "
	    "sqlite3\n"
	    "        shell.\n"
	    "    -h, --help\n"
	    "        Print this text.\n"
	    "\n"
	    "EXIT STATUS\n"
	    "    0 success; 1 a file is missing, not an allot store, too old, "
	    "or\n"
	    "    a query failed; 2 bad command line.\n"
	    "\n"
	    "EXAMPLE\n"
	    "    allotctl audit /var/lib/allot/allot.db\n" },
	{ "help", "help on a command",
	    "NAME\n"
	    "    allotctl help - help on a command\n"
	    "\n"
	    "SYNOPSIS\n"
	    "    allotctl help [COMMAND]\n"
	    "\n"
	    "DESCRIPTION\n"
	    "    Without COMMAND, the list of commands; with one, its manual\n"
	    "    (the same as allotctl COMMAND --help).\n" },
};

static void
usage(FILE *f)
{
	fputs("NAME\n"
	      "    allotctl - inspect a running allotd, reload its quotas, "
	      "check quota\n"
	      "    files and audit its store\n"
	      "\n"
	      "SYNOPSIS\n"
	      "    allotctl [--http HOST:PORT] [--timeout MS] COMMAND [ARGS]\n"
	      "    allotctl help [COMMAND] | --help | --version\n"
	      "\n"
	      "COMMANDS\n",
	    f);
	for (size_t i = 0; i < sizeof helps / sizeof helps[0]; i++)
		fprintf(f, "    %-13s %s\n", helps[i].name, helps[i].summary);
	fputs("\n"
	      "DESCRIPTION\n"
	      "    status, replicas, quotas, shares and top-denied read "
	      "allotd's\n"
	      "    GET /status on its HTTP port and never change anything. "
	      "reload\n"
	      "    signals allotd on its own host (see allotctl help reload "
	      "for how\n"
	      "    that is authenticated). check-config and audit work on "
	      "files and\n"
	      "    need no allotd. allotctl help COMMAND has each command's "
	      "manual.\n"
	      "\n" COMMON_OPTIONS "    -V, --version\n"
	      "        Print the version.\n"
	      "\n" EXIT_TEXT "\n"
	      "ENVIRONMENT\n"
	      "    ALLOT_HTTP   the default for --http.\n"
	      "\n"
	      "EXAMPLES\n"
	      "    allotctl status\n"
	      "    allotctl --http 10.0.0.5:7480 top-denied\n"
	      "    allotctl shares checkout\n"
	      "    allotctl check-config --capacity 2000 quotas.yaml\n"
	      "    allotctl audit /var/lib/allot/allot.db\n"
	      "\n"
	      "SEE ALSO\n"
	      "    allotd --help, docs/operations.md, docs/configuration.md\n",
	    f);
}

static const struct command_help *
find_help(const char *name)
{
	for (size_t i = 0; i < sizeof helps / sizeof helps[0]; i++)
		if (strcmp(helps[i].name, name) == 0)
			return &helps[i];
	return NULL;
}

static int usage_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int
usage_error(const char *cmd, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("allotctl: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	if (cmd != NULL)
		fprintf(stderr, "Try 'allotctl help %s'.\n", cmd);
	else
		fputs("Try 'allotctl --help'.\n", stderr);
	return EXIT_USAGE;
}

/* getopt_long's '?': an unknown option, or a known one whose value is
 * missing (`arg` is the word getopt stopped at). */
static int
bad_option(const char *cmd, const char *arg)
{
	/* Long options with a value have codes from 256; -n is the only
	 * short one that takes a value. */
	if (optopt >= 256 || (optopt == 'n' && cmd != NULL))
		return usage_error(cmd, "\"%s\" needs a value", arg);
	if (optopt != 0)
		return usage_error(cmd, "unknown option \"-%c\"", optopt);
	return usage_error(cmd, "unknown option \"%s\"", arg);
}

/* ------------------------------------------------------------------ */
/* main                                                                */
/* ------------------------------------------------------------------ */

enum {
	OPT_HTTP = 256,
	OPT_TIMEOUT,
	OPT_PID,
	OPT_PIDFILE,
	OPT_WAIT,
	OPT_NOCHECK,
	OPT_CAPACITY,
	OPT_MAXOVER,
	OPT_LIMIT,
	OPT_SQL,
};

static const struct option all_opts[] = {
	{ "http", required_argument, NULL, OPT_HTTP },
	{ "timeout", required_argument, NULL, OPT_TIMEOUT },
	{ "help", no_argument, NULL, 'h' },
	{ "version", no_argument, NULL, 'V' },
	{ "pid", required_argument, NULL, OPT_PID },
	{ "pid-file", required_argument, NULL, OPT_PIDFILE },
	{ "wait", required_argument, NULL, OPT_WAIT },
	{ "no-check", no_argument, NULL, OPT_NOCHECK },
	{ "capacity", required_argument, NULL, OPT_CAPACITY },
	{ "max-overcommit", required_argument, NULL, OPT_MAXOVER },
	{ "limit", required_argument, NULL, OPT_LIMIT },
	{ "sql", no_argument, NULL, OPT_SQL },
	{ NULL, 0, NULL, 0 },
};

/* Which options each command takes (besides --http, --timeout, -h). */
static bool
takes(const char *cmd, int opt)
{
	switch (opt) {
	case OPT_HTTP:
	case OPT_TIMEOUT:
	case 'h': return true;
	case OPT_PID:
	case OPT_PIDFILE:
	case OPT_WAIT:
	case OPT_NOCHECK: return strcmp(cmd, "reload") == 0;
	case OPT_CAPACITY:
	case OPT_MAXOVER: return strcmp(cmd, "check-config") == 0;
	case OPT_LIMIT:
		return strcmp(cmd, "top-denied") == 0 ||
		    strcmp(cmd, "audit") == 0;
	case 'n': return strcmp(cmd, "top-denied") == 0;
	case OPT_SQL: return strcmp(cmd, "audit") == 0;
	default: return false;
	}
}

int
main(int argc, char **argv)
{
	ctl c = { .http = DEFAULT_HTTP, .timeout_ms = DEFAULT_TIMEOUT_MS };
	const char *env = getenv("ALLOT_HTTP");
	if (env != NULL && *env != '\0')
		c.http = env;
	signal(SIGPIPE, SIG_IGN);

	/* Options before the command. */
	int ch;
	opterr = 0;
	while ((ch = getopt_long(argc, argv, "+hV", all_opts, NULL)) != -1) {
		long v;
		switch (ch) {
		case OPT_HTTP: c.http = optarg; break;
		case OPT_TIMEOUT:
			if (!parse_int(optarg, 1, 3600000, &v))
				return usage_error(NULL,
				    "--timeout expects "
				    "milliseconds (1 to 3600000), not \"%s\"",
				    optarg);
			c.timeout_ms = (int) v;
			break;
		case 'h': usage(stdout); return 0;
		case 'V':
			printf("allotctl %s\n", ALLOT_VERSION_STRING);
			return 0;
		case '?': return bad_option(NULL, argv[optind - 1]);
		default:
			return usage_error(NULL,
			    "\"%s\" goes after the "
			    "command",
			    argv[optind - 1]);
		}
	}
	if (optind >= argc)
		return usage_error(NULL, "no command given");
	const char *cmd = argv[optind];
	if (strcmp(cmd, "help") == 0) {
		if (optind + 1 >= argc) {
			usage(stdout);
			return 0;
		}
		const struct command_help *h = find_help(argv[optind + 1]);
		if (h == NULL)
			return usage_error(
			    NULL, "no command \"%s\"", argv[optind + 1]);
		fputs(h->text, stdout);
		return 0;
	}
	const struct command_help *help = find_help(cmd);
	if (help == NULL)
		return usage_error(NULL, "no command \"%s\"", cmd);

	/* The command's own options; the common ones are accepted here
	 * too. */
	int sargc = argc - optind;
	char **sargv = argv + optind;
	reload_opts ro = { .wait_ms = DEFAULT_WAIT_MS, .check = true };
	check_opts co = { 0 };
	long limit = strcmp(cmd, "audit") == 0 ? 50 : 10;
	bool show_sql = false;
	optind = 0; /* GNU: start over on the new vector */
	int li = -1;
	while ((ch = getopt_long(sargc, sargv, "+hn:", all_opts, &li)) != -1) {
		long v;
		char optname[32];
		if (li >= 0)
			snprintf(optname, sizeof optname, "--%s",
			    all_opts[li].name);
		else
			snprintf(optname, sizeof optname, "-%c", ch);
		li = -1;
		if (ch == '?')
			return bad_option(cmd, sargv[optind - 1]);
		if (!takes(cmd, ch))
			return usage_error(
			    cmd, "%s does not take \"%s\"", cmd, optname);
		switch (ch) {
		case 'h': fputs(help->text, stdout); return 0;
		case OPT_HTTP: c.http = optarg; break;
		case OPT_TIMEOUT:
			if (!parse_int(optarg, 1, 3600000, &v))
				return usage_error(cmd,
				    "--timeout expects "
				    "milliseconds (1 to 3600000), not \"%s\"",
				    optarg);
			c.timeout_ms = (int) v;
			break;
		case OPT_PID:
			if (!parse_int(optarg, 1, INT_MAX, &ro.pid))
				return usage_error(cmd,
				    "--pid expects a "
				    "process id, not \"%s\"",
				    optarg);
			break;
		case OPT_PIDFILE: ro.pid_file = optarg; break;
		case OPT_WAIT:
			if (!parse_int(optarg, 1, 3600000, &ro.wait_ms))
				return usage_error(cmd,
				    "--wait expects "
				    "milliseconds, not \"%s\"",
				    optarg);
			break;
		case OPT_NOCHECK: ro.check = false; break;
		case OPT_CAPACITY:
			if (!parse_double(optarg, &co.capacity) ||
			    co.capacity <= 0)
				return usage_error(cmd,
				    "--capacity expects "
				    "requests per second > 0, not \"%s\"",
				    optarg);
			break;
		case OPT_MAXOVER:
			if (!parse_double(optarg, &co.max_overcommit) ||
			    co.max_overcommit <= 0)
				return usage_error(cmd,
				    "--max-overcommit "
				    "expects a ratio > 0 (e.g. 1.5), not "
				    "\"%s\"",
				    optarg);
			break;
		case 'n':
		case OPT_LIMIT:
			if (!parse_int(optarg, 1, 1000000, &limit))
				return usage_error(cmd,
				    "%s expects a count "
				    "from 1 to 1000000, not \"%s\"",
				    ch == 'n' ? "-n" : "--limit", optarg);
			break;
		case OPT_SQL: show_sql = true; break;
		default: return usage_error(cmd, "unknown option");
		}
	}
	int npos = sargc - optind;
	char **pos = sargv + optind;
	if (ro.pid != 0 && ro.pid_file != NULL)
		return usage_error(cmd, "give --pid or --pid-file, not both");

	if (strcmp(cmd, "status") == 0 || strcmp(cmd, "reload") == 0 ||
	    strcmp(cmd, "top-denied") == 0) {
		if (npos != 0)
			return usage_error(cmd, "%s takes no arguments", cmd);
		if (strcmp(cmd, "status") == 0)
			return cmd_status(&c, npos, pos);
		if (strcmp(cmd, "reload") == 0)
			return cmd_reload(&c, &ro);
		return cmd_top_denied(&c, npos, pos, limit);
	}
	if (strcmp(cmd, "replicas") == 0 || strcmp(cmd, "quotas") == 0) {
		if (npos > 1)
			return usage_error(cmd,
			    "%s takes at most one "
			    "SERVICE",
			    cmd);
		return strcmp(cmd, "replicas") == 0 ?
		    cmd_replicas(&c, npos, pos) :
		    cmd_quotas(&c, npos, pos);
	}
	if (strcmp(cmd, "shares") == 0) {
		if (npos != 1)
			return usage_error(cmd, "shares takes one CALLER");
		return cmd_shares(&c, npos, pos);
	}
	if (strcmp(cmd, "check-config") == 0) {
		if (npos != 1)
			return usage_error(cmd, "check-config takes one FILE");
		return cmd_check_config(pos[0], &co);
	}
	if (strcmp(cmd, "audit") == 0) {
		if (npos < 1)
			return usage_error(cmd,
			    "audit takes one or more DB "
			    "files");
		if (npos > 10)
			return usage_error(cmd,
			    "audit takes at most 10 DB "
			    "files (SQLite attaches 10 by default)");
		return cmd_audit(npos, pos, limit, show_sql);
	}
	return usage_error(NULL, "no command \"%s\"", cmd);
}
