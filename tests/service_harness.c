/* SPDX-License-Identifier: MIT */
/*
 * The service suite's harness (declared in service_harness.h): starting
 * and stopping the real allot-example-service, libcurl requests over
 * mutual TLS and the rate-limit headers of their answers, the counters
 * of /stats, the throwaway CA made once per run by scripts/mkcerts, and
 * the quota files that more than one case file starts the service with.
 */
#include <check.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proc.h"
#include "service_harness.h"

/* Where the certificates are: made once by the unchecked fixture in the
 * runner process, shared by the forked tests. */
char svc_dir[1024];
char svc_other_ca[PATH_MAX]; /* a second CA, nobody trusts it */
char svc_service_path[PATH_MAX];
char svc_mkcerts_path[PATH_MAX];

/* ---------------------------------------------------------------- */
/* Processes                                                        */
/* ---------------------------------------------------------------- */

/* Run a program to completion (at most 60 s); returns its exit code. */
int
svc_run(char *const argv[])
{
	pid_t pid = pc_spawn(argv, "/dev/null");
	int rc = pc_wait_exit(pid, 60000);
	if (rc < 0) {
		kill(pid, SIGKILL);
		pc_wait_exit(pid, 5000);
	}
	return rc;
}

/*
 * Start the service with `yaml` as its quota file and the arguments after
 * it (NULL-terminated). mTLS arguments are added unless `tls` is false.
 * Returns true once it printed its "listening on" line (bounded wait);
 * false if it exited first (`exit_status` says how) or never said so.
 */
static bool
svc_start_v(struct svc *s, const char *yaml, bool tls, va_list ap)
{
	static int seq;
	memset(s, 0, sizeof *s);
	s->exit_status = -1;
	snprintf(s->cfg, sizeof s->cfg, "%s/quota-%ld-%d.yaml", svc_dir,
	    (long) getpid(), seq);
	snprintf(s->err, sizeof s->err, "%s/service-%ld-%d.err", svc_dir,
	    (long) getpid(), seq++);
	FILE *f = fopen(s->cfg, "w");
	ck_assert_ptr_nonnull(f);
	fputs(yaml, f);
	fclose(f);

	char cert[PATH_MAX + 16], key[PATH_MAX + 16], ca[PATH_MAX + 16];
	snprintf(cert, sizeof cert, "%s/server.pem", svc_dir);
	snprintf(key, sizeof key, "%s/server.key", svc_dir);
	snprintf(ca, sizeof ca, "%s/ca.pem", svc_dir);
	const char *argv[64];
	int n = 0;
	argv[n++] = svc_service_path;
	argv[n++] = "--config";
	argv[n++] = s->cfg;
	argv[n++] = "--listen";
	argv[n++] = "127.0.0.1:0";
	argv[n++] = "--log-level";
	argv[n++] = "warning";
	if (tls) {
		argv[n++] = "--tls-cert";
		argv[n++] = cert;
		argv[n++] = "--tls-key";
		argv[n++] = key;
		argv[n++] = "--ca";
		argv[n++] = ca;
	}
	const char *a;
	while ((a = va_arg(ap, const char *)) != NULL && n < 62)
		argv[n++] = a;
	argv[n] = NULL;

	int out[2];
	ck_assert_int_eq(pipe(out), 0);
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		/* If this test dies on a failed assertion, so does its
		 * service. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(out[1], STDOUT_FILENO);
		int err = open(s->err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		if (err >= 0)
			dup2(err, STDERR_FILENO);
		close(out[0]);
		close(out[1]);
		execv(svc_service_path, (char *const *) argv);
		_exit(127);
	}
	close(out[1]);
	s->pid = pid;

	/* Read stdout until the listening line, at most 20 s (sanitizer
	 * builds start slowly). */
	char line[512];
	size_t len = 0;
	uint64_t end = pc_now_ms() + 20000;
	bool ok = false;
	while (!ok && pc_now_ms() < end) {
		struct pollfd pfd = { out[0], POLLIN, 0 };
		if (poll(&pfd, 1, 100) <= 0)
			continue;
		ssize_t r = read(out[0], line + len, sizeof line - 1 - len);
		if (r <= 0)
			break; /* exited */
		len += (size_t) r;
		line[len] = '\0';
		const char *p = strstr(line, "listening on ");
		if (p != NULL && strchr(p, '\n') != NULL) {
			const char *colon = strrchr(p, ':');
			s->port = atoi(colon + 1);
			ok = s->port > 0;
		}
		if (len == sizeof line - 1)
			break;
	}
	close(out[0]);
	if (!ok) {
		int st = pc_wait_exit(pid, 5000);
		if (st == -1) {
			kill(pid, SIGKILL);
			pc_wait_exit(pid, 5000);
		} else {
			s->exit_status = st;
		}
		s->pid = 0;
	}
	return ok;
}

bool
svc_try_start(struct svc *s, const char *yaml, bool tls, ...)
{
	va_list ap;
	va_start(ap, tls);
	bool ok = svc_start_v(s, yaml, tls, ap);
	va_end(ap);
	return ok;
}

/* SIGTERM, then SIGKILL after 10 s. Asserts a clean exit (status 0):
 * under AddressSanitizer that includes no leak. */
void
svc_stop(struct svc *s)
{
	if (s->pid <= 0)
		return;
	kill(s->pid, SIGTERM);
	int st = pc_wait_exit(s->pid, 10000);
	if (st == -1) {
		kill(s->pid, SIGKILL);
		pc_wait_exit(s->pid, 5000);
	}
	s->pid = 0;
	bool clean = st == 0;
	if (!clean) {
		char *e = pc_read_file(s->err);
		fprintf(stderr, "service stderr:\n%s\n", e != NULL ? e : "");
		free(e);
	}
	ck_assert_msg(
	    clean, "the service did not stop cleanly (status %d)", st);
}

/* ---------------------------------------------------------------- */
/* HTTP                                                             */
/* ---------------------------------------------------------------- */

static size_t
on_body(char *p, size_t size, size_t n, void *ud)
{
	struct resp *r = ud;
	size_t len = size * n;
	size_t room = sizeof r->body - 1 - r->blen;
	size_t take = len < room ? len : room;
	memcpy(r->body + r->blen, p, take);
	r->blen += take;
	r->body[r->blen] = '\0';
	return len;
}

static size_t
on_header(char *p, size_t size, size_t n, void *ud)
{
	struct resp *r = ud;
	size_t len = size * n;
	size_t room = sizeof r->hdrs - 1 - r->hlen;
	size_t take = len < room ? len : room;
	memcpy(r->hdrs + r->hlen, p, take);
	r->hlen += take;
	r->hdrs[r->hlen] = '\0';
	return len;
}

/* A client presenting certificate `name` from `dir` (NULL: none). */
CURL *
svc_client(const char *dir, const char *name)
{
	CURL *h = curl_easy_init();
	ck_assert_ptr_nonnull(h);
	char path[PATH_MAX + 32];
	snprintf(path, sizeof path, "%s/ca.pem", svc_dir);
	curl_easy_setopt(h, CURLOPT_CAINFO, path);
	/* Only our CA: not the system's directory of them, which libcurl
	 * would otherwise parse for every handshake. */
	curl_easy_setopt(h, CURLOPT_CAPATH, NULL);
	if (name != NULL) {
		snprintf(path, sizeof path, "%s/%s.pem", dir, name);
		curl_easy_setopt(h, CURLOPT_SSLCERT, path);
		snprintf(path, sizeof path, "%s/%s.key", dir, name);
		curl_easy_setopt(h, CURLOPT_SSLKEY, path);
	}
	curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 30000L);
	curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 30000L);
	curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
	return h;
}

/* GET over https (or http when `plain`), with optional extra header
 * lines. Returns the CURLcode; `r` has status, headers and body. */
CURLcode
svc_get(CURL *h, const struct svc *s, bool plain, const char *path,
    const char *extra_header, struct resp *r)
{
	char url[256];
	snprintf(url, sizeof url, "%s://127.0.0.1:%d%s",
	    plain ? "http" : "https", s->port, path);
	r->status = 0;
	r->blen = r->hlen = 0;
	r->body[0] = r->hdrs[0] = '\0';
	struct curl_slist *hl = NULL;
	if (extra_header != NULL)
		hl = curl_slist_append(hl, extra_header);
	curl_easy_setopt(h, CURLOPT_URL, url);
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
	curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
	curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
	uint64_t t0 = pc_now_ms();
	CURLcode rc = curl_easy_perform(h);
	r->seconds = (double) (pc_now_ms() - t0) / 1000.0;
	curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
	if (rc != CURLE_OK) {
		double tc = 0, ta = 0, tp = 0;
		curl_easy_getinfo(h, CURLINFO_CONNECT_TIME, &tc);
		curl_easy_getinfo(h, CURLINFO_APPCONNECT_TIME, &ta);
		curl_easy_getinfo(h, CURLINFO_PRETRANSFER_TIME, &tp);
		fprintf(stderr,
		    "GET %s: %s after %.3f s (connect %.3f, "
		    "TLS %.3f, request sent %.3f)\n",
		    path, curl_easy_strerror(rc), r->seconds, tc, ta, tp);
	}
	curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
	curl_slist_free_all(hl);
	return rc;
}

/* One request on a fresh connection; asserts the transfer worked. */
void
svc_get1(const struct svc *s, const char *dir, const char *cert,
    const char *path, const char *extra_header, struct resp *r)
{
	CURL *h = svc_client(dir, cert);
	CURLcode rc = svc_get(h, s, false, path, extra_header, r);
	ck_assert_msg(
	    rc == CURLE_OK, "GET %s: %s", path, curl_easy_strerror(rc));
	curl_easy_cleanup(h);
}

/* The value of header `name` (case-insensitive), trimmed; NULL if
 * absent. */
const char *
svc_header(const struct resp *r, const char *name, char *buf, size_t len)
{
	size_t nl = strlen(name);
	for (const char *p = r->hdrs; *p != '\0';) {
		const char *eol = strstr(p, "\r\n");
		if (eol == NULL)
			eol = p + strlen(p);
		if ((size_t) (eol - p) > nl && p[nl] == ':' &&
		    strncasecmp(p, name, nl) == 0) {
			const char *v = p + nl + 1;
			while (*v == ' ' || *v == '\t')
				v++;
			size_t vl = (size_t) (eol - v);
			while (
			    vl > 0 && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
				vl--;
			if (vl >= len)
				vl = len - 1;
			memcpy(buf, v, vl);
			buf[vl] = '\0';
			return buf;
		}
		p = *eol != '\0' ? eol + 2 : eol;
	}
	return NULL;
}

void
svc_assert_header(const struct resp *r, const char *name, const char *want)
{
	char buf[512];
	const char *v = svc_header(r, name, buf, sizeof buf);
	ck_assert_msg(v != NULL, "no %s header in:\n%s", name, r->hdrs);
	ck_assert_str_eq(v, want);
}

/* Every response of /lookup and /export carries these. */
void
svc_assert_ratelimit_headers(const struct resp *r)
{
	static const char *const names[] = { "RateLimit-Policy", "RateLimit",
		"X-RateLimit-Limit", "X-RateLimit-Remaining",
		"X-RateLimit-Reset" };
	char buf[512];
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		ck_assert_msg(svc_header(r, names[i], buf, sizeof buf) != NULL,
		    "status %ld without %s:\n%s", r->status, names[i],
		    r->hdrs);
}

void
svc_assert_policy(
    const struct resp *r, const char *name, unsigned q, unsigned w)
{
	char want[512];
	snprintf(want, sizeof want, "\"%s\";q=%u;w=%u", name, q, w);
	svc_assert_header(r, "RateLimit-Policy", want);
}

/* ---------------------------------------------------------------- */
/* /stats                                                           */
/* ---------------------------------------------------------------- */

char *
svc_stats(const struct svc *s)
{
	struct resp *r = malloc(sizeof *r);
	ck_assert_ptr_nonnull(r);
	svc_get1(s, svc_dir, NULL, "/stats", NULL, r);
	ck_assert_int_eq(r->status, 200);
	char *doc = strdup(r->body);
	free(r);
	ck_assert_ptr_nonnull(doc);
	return doc;
}

/* A numeric field of the first flat JSON object that starts with
 * `anchor`; -1 if there is none. */
int64_t
svc_jfield(const char *doc, const char *anchor, const char *field)
{
	const char *p = strstr(doc, anchor);
	if (p == NULL)
		return -1;
	const char *end = strchr(p, '}');
	char pat[128];
	snprintf(pat, sizeof pat, "\"%s\":", field);
	const char *f = strstr(p, pat);
	if (f == NULL || (end != NULL && f > end))
		return -1;
	return strtoll(f + strlen(pat), NULL, 10);
}

/* A caller's counter in /stats (id NULL: the callers without one). */
int64_t
svc_caller_field(const char *doc, const char *id, const char *field)
{
	char anchor[512];
	if (id == NULL)
		snprintf(
		    anchor, sizeof anchor, "{\"identity\":null,\"quota\"");
	else
		snprintf(anchor, sizeof anchor,
		    "{\"identity\":\"%s\",\"quota\"", id);
	return svc_jfield(doc, anchor, field);
}

int64_t
svc_key_field(
    const char *doc, const char *id, const char *endpoint, const char *field)
{
	char anchor[512];
	snprintf(anchor, sizeof anchor,
	    "{\"identity\":\"%s\",\"endpoint\":\"%s\"", id, endpoint);
	return svc_jfield(doc, anchor, field);
}

/* ---------------------------------------------------------------- */
/* Fixtures                                                         */
/* ---------------------------------------------------------------- */

static const char *const g_identities[] = {
	ID_CHECKOUT,
	ID_REPORTING,
	ID_SEARCH,
	ID_BURSTER,
	ID_SLOW,
	ID_SHADOW,
	ID_EXPORTER,
	ID_INTERACTIVE,
	ID_STRANGER,
	"nosan=",
};
#define N_IDENTITIES (sizeof g_identities / sizeof g_identities[0])

int
svc_mkcerts(const char *dir)
{
	char *argv[N_IDENTITIES + 3];
	size_t n = 0;
	argv[n++] = svc_mkcerts_path;
	argv[n++] = (char *) dir;
	for (size_t i = 0; i < N_IDENTITIES; i++)
		argv[n++] = (char *) g_identities[i];
	argv[n] = NULL;
	return svc_run(argv);
}

/* Runs in the runner process, once: certificates for every test. */
void
svc_certs_setup(void)
{
	if (svc_dir[0] != '\0')
		return;
	const char *tmp = getenv("TMPDIR");
	snprintf(svc_dir, sizeof svc_dir, "%s/allot-test-service.XXXXXX",
	    tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
	if (mkdtemp(svc_dir) == NULL)
		ck_abort_msg("mkdtemp: %s", strerror(errno));
	snprintf(svc_other_ca, sizeof svc_other_ca, "%s/other-ca", svc_dir);
	ck_assert_int_eq(svc_mkcerts(svc_dir), 0);
	char *argv[] = { svc_mkcerts_path, svc_other_ca, (char *) ID_CHECKOUT,
		NULL };
	ck_assert_int_eq(svc_run(argv), 0);
}

void
svc_certs_teardown(void)
{
	if (svc_dir[0] != '\0' && getenv("ALLOT_KEEP_TMP") == NULL)
		pc_rm_rf(svc_dir);
}

/* ---------------------------------------------------------------- */
/* Configs shared by more than one file                             */
/* ---------------------------------------------------------------- */

const char svc_cfg_identities[] =
    "quotas:\n"
    "  default: {tokens_per_second: 10, burst: 20, shared: true}\n"
    "  callers:\n"
    "    - {identity: \"" ID_CHECKOUT "\", tokens_per_second: 500, "
    "burst: 1000}\n"
    "    - {identity: \"" ID_REPORTING "\", tokens_per_second: 100, "
    "burst: 200}\n"
    "  endpoint_weights: {default: 1, \"/lookup\": 1, \"/export\": 20}\n";

const char svc_cfg_export[] =
    "quotas:\n"
    "  default: {tokens_per_second: 1, burst: 20}\n"
    "  callers:\n"
    "    - {identity: \"" ID_EXPORTER "\", tokens_per_second: 10, "
    "burst: 200}\n"
    "  endpoint_weights: {default: 1, \"/lookup\": 1, \"/export\": 20}\n";
