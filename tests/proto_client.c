/* SPDX-License-Identifier: MIT */
/*
 * The raw protocol test client (proto_client.h). Blocking nng req0 calls
 * with timeouts, so a test that waits on a silent coordinator fails
 * instead of hanging; no request is ever resent by nng (the resend timer
 * is pushed out), because a resend would reuse the sequence number.
 * Also the pc_coord fixture: one allotd per test in a temporary
 * directory, with an atexit handler for the process that ends before
 * the test cleans up.
 */
#include "proto_client.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nng/protocol/reqrep0/req.h>

#include "config.h"

uint64_t
pc_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * 1000u + (uint64_t) ts.tv_nsec / 1000000u;
}

void
pc_sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000u, (long) (ms % 1000u) * 1000000L };
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/* A req socket with the clients' timeouts, not yet dialed. */
static int
open_socket(pc_conn *c)
{
	int rv = nng_req0_open(&c->sock);
	if (rv != 0)
		return rv;
	c->open = true;
	nng_socket_set_ms(c->sock, NNG_OPT_RECVTIMEO, 5000);
	nng_socket_set_ms(c->sock, NNG_OPT_SENDTIMEO, 5000);
	nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, 3600000);
	nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, 0);
	return 0;
}

int
pc_open(pc_conn *c, const char *url, int timeout_ms)
{
	int rv = open_socket(c);
	if (rv != 0)
		return rv;
	uint64_t end = pc_now_ms() + (uint64_t) timeout_ms;
	for (;;) {
		rv = nng_dial(c->sock, url, NULL, 0);
		if (rv == 0 || pc_now_ms() >= end)
			break;
		pc_sleep_ms(20);
	}
	if (rv != 0)
		pc_close(c);
	return rv;
}

/* pc_open, but the connection leaves from `local_ip` (nng's tcp dialer
 * binds NNG_OPT_LOCADDR), so allotd sees another peer. */
int
pc_open_from(pc_conn *c, const char *url, const char *local_ip)
{
	int rv = open_socket(c);
	if (rv != 0)
		return rv;
	nng_dialer d;
	nng_sockaddr sa;
	memset(&sa, 0, sizeof sa);
	sa.s_in.sa_family = NNG_AF_INET;
	if (inet_pton(AF_INET, local_ip, &sa.s_in.sa_addr) != 1) {
		pc_close(c);
		return NNG_EINVAL;
	}
	if ((rv = nng_dialer_create(&d, c->sock, url)) != 0 ||
	    (rv = nng_dialer_set_addr(d, NNG_OPT_LOCADDR, &sa)) != 0 ||
	    (rv = nng_dialer_start(d, 0)) != 0) {
		pc_close(c);
		return rv;
	}
	return 0;
}

void
pc_close(pc_conn *c)
{
	if (c->open)
		nng_close(c->sock);
	c->open = false;
}

void
pc_free(Allot__V1__Envelope *env)
{
	if (env != NULL)
		allot__v1__envelope__free_unpacked(env, NULL);
}

Allot__V1__Envelope *
pc_raw(pc_conn *c, const void *buf, size_t len)
{
	nng_msg *m;
	if (nng_msg_alloc(&m, len) != 0)
		return NULL;
	if (len > 0)
		memcpy(nng_msg_body(m), buf, len);
	if (nng_sendmsg(c->sock, m, 0) != 0) {
		nng_msg_free(m);
		return NULL;
	}
	if (nng_recvmsg(c->sock, &m, 0) != 0)
		return NULL;
	Allot__V1__Envelope *env = allot__v1__envelope__unpack(
	    NULL, nng_msg_len(m), nng_msg_body(m));
	nng_msg_free(m);
	return env;
}

Allot__V1__Envelope *
pc_send(pc_conn *c, const Allot__V1__Envelope *env)
{
	size_t n = allot__v1__envelope__get_packed_size(env);
	uint8_t *buf = malloc(n ? n : 1);
	if (buf == NULL)
		return NULL;
	allot__v1__envelope__pack(env, buf);
	Allot__V1__Envelope *r = pc_raw(c, buf, n);
	free(buf);
	return r;
}

Allot__V1__Envelope *
pc_register(pc_conn *c, const char *replica_id, const char *service,
    const char *const *keys, size_t nkeys, uint32_t interval_ms)
{
	Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
	Allot__V1__Register reg = ALLOT__V1__REGISTER__INIT;
	char host[] = "testhost";
	char ver[] = "test-0";
	reg.replica_id = (char *) replica_id;
	reg.service = (char *) service;
	reg.host = host;
	reg.pid = (uint32_t) getpid();
	reg.agent_version = ver;
	reg.config_digest = 42;
	reg.keys = (char **) keys;
	reg.n_keys = nkeys;
	reg.sync_interval_ms = interval_ms;
	env.version = 1;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_REGISTER;
	env.register_ = &reg;
	return pc_send(c, &env);
}

Allot__V1__Envelope *
pc_sync(pc_conn *c, uint64_t session, uint64_t seq, uint32_t elapsed_ms,
    const pc_report *r, size_t n)
{
	Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
	Allot__V1__Sync sync = ALLOT__V1__SYNC__INIT;
	Allot__V1__KeyReport *kr = calloc(n ? n : 1, sizeof *kr);
	Allot__V1__KeyReport **krp = calloc(n ? n : 1, sizeof *krp);
	if (kr == NULL || krp == NULL) {
		free(kr);
		free(krp);
		return NULL;
	}
	for (size_t i = 0; i < n; i++) {
		allot__v1__key_report__init(&kr[i]);
		kr[i].key = r[i].key;
		kr[i].consumed = r[i].consumed;
		kr[i].denied = r[i].denied;
		kr[i].held = r[i].held;
		kr[i].demand = r[i].demand;
		kr[i].shadow_denied = r[i].shadow_denied;
		krp[i] = &kr[i];
	}
	sync.session = session;
	sync.seq = seq;
	sync.elapsed_ms = elapsed_ms;
	sync.reports = krp;
	sync.n_reports = n;
	env.version = 1;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_SYNC;
	env.sync = &sync;
	Allot__V1__Envelope *ret = pc_send(c, &env);
	free(kr);
	free(krp);
	return ret;
}

Allot__V1__Envelope *
pc_leave(pc_conn *c, uint64_t session, const char *reason)
{
	Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
	Allot__V1__Leave leave = ALLOT__V1__LEAVE__INIT;
	leave.session = session;
	leave.reason = (char *) reason;
	env.version = 1;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_LEAVE;
	env.leave = &leave;
	return pc_send(c, &env);
}

int
pc_error_code(const Allot__V1__Envelope *env)
{
	if (env == NULL || env->body_case != ALLOT__V1__ENVELOPE__BODY_ERROR)
		return -1;
	return (int) env->error->code;
}

/* ---- replicas ---- */

static void
apply_shares(pc_replica *r, Allot__V1__Share **shares, size_t n, bool full)
{
	if (full) {
		for (size_t k = 0; k < PC_MAX_KEYS; k++)
			r->rate[k] = r->burst[k] = NAN;
	}
	for (size_t i = 0; i < n; i++) {
		if (shares[i]->key >= PC_MAX_KEYS)
			continue;
		r->rate[shares[i]->key] = shares[i]->rate;
		r->burst[shares[i]->key] = shares[i]->burst;
	}
}

int
pc_replica_join(pc_replica *r, const char *url, const char *id,
    const char *service, const char *const *keys, size_t nkeys)
{
	if (!r->c.open && pc_open(&r->c, url, 5000) != 0)
		return -1;
	snprintf(r->id, sizeof r->id, "%s", id);
	r->nkeys = nkeys;
	Allot__V1__Envelope *e = pc_register(
	    &r->c, id, service, keys, nkeys, 100);
	if (e == NULL)
		return -1;
	int code = pc_error_code(e);
	if (code >= 0) {
		pc_free(e);
		return code;
	}
	if (e->body_case != ALLOT__V1__ENVELOPE__BODY_WELCOME) {
		pc_free(e);
		return -1;
	}
	const Allot__V1__Welcome *w = e->welcome;
	r->session = w->session;
	r->seq = 0;
	r->replicas = w->replicas;
	r->epoch = w->config_epoch;
	r->lease_ms = w->lease_ms;
	apply_shares(r, w->shares, w->n_shares, true);
	r->nunknown = w->n_unknown_keys < PC_MAX_KEYS ? w->n_unknown_keys :
	                                                PC_MAX_KEYS;
	for (size_t i = 0; i < r->nunknown; i++)
		r->unknown[i] = w->unknown_keys[i];
	pc_free(e);
	return 0;
}

int
pc_replica_sync(
    pc_replica *r, const pc_report *rep, size_t n, uint32_t *ret_rejected)
{
	Allot__V1__Envelope *e = pc_sync(
	    &r->c, r->session, ++r->seq, 100, rep, n);
	if (e == NULL)
		return -1;
	int code = pc_error_code(e);
	if (code >= 0) {
		pc_free(e);
		return code;
	}
	if (e->body_case != ALLOT__V1__ENVELOPE__BODY_REPLY ||
	    e->reply->seq != r->seq) {
		pc_free(e);
		return -1;
	}
	const Allot__V1__Reply *rp = e->reply;
	r->replicas = rp->replicas;
	r->epoch = rp->config_epoch;
	r->lease_ms = rp->lease_ms;
	apply_shares(r, rp->shares, rp->n_shares, rp->full);
	if (ret_rejected != NULL)
		*ret_rejected = rp->rejected_reports;
	pc_free(e);
	return 0;
}

void
pc_replica_close(pc_replica *r)
{
	pc_close(&r->c);
}

/* ---- HTTP ---- */

char *
pc_http_get(int port, const char *path, int *ret_status)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		return NULL;
	struct timeval tv = { 5, 0 };
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
	struct sockaddr_in sa = { .sin_family = AF_INET,
		.sin_port = htons((uint16_t) port) };
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	char *buf = NULL;
	if (connect(fd, (struct sockaddr *) &sa, sizeof sa) != 0)
		goto fail;
	char req[256];
	int n = snprintf(req, sizeof req,
	    "GET %s HTTP/1.0\r\nHost: "
	    "127.0.0.1\r\n\r\n",
	    path);
	if (write(fd, req, (size_t) n) != n)
		goto fail;
	size_t len = 0, cap = 65536;
	buf = malloc(cap + 1);
	if (buf == NULL)
		goto fail;
	for (;;) {
		if (len == cap) {
			char *nb = realloc(buf, cap * 2 + 1);
			if (nb == NULL)
				goto fail;
			buf = nb;
			cap *= 2;
		}
		ssize_t r = read(fd, buf + len, cap - len);
		if (r < 0)
			goto fail;
		if (r == 0)
			break;
		len += (size_t) r;
	}
	buf[len] = '\0';
	close(fd);
	int status = 0;
	if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1) {
		free(buf);
		return NULL;
	}
	char *body = strstr(buf, "\r\n\r\n");
	if (body == NULL) {
		free(buf);
		return NULL;
	}
	body += 4;
	memmove(buf, body, strlen(body) + 1);
	if (ret_status != NULL)
		*ret_status = status;
	return buf;
fail:
	free(buf);
	close(fd);
	return NULL;
}

double
pc_metric(const char *text, const char *series)
{
	size_t n = strlen(series);
	for (const char *p = text; p != NULL && *p != '\0';) {
		if (strncmp(p, series, n) == 0 && p[n] == ' ')
			return strtod(p + n + 1, NULL);
		p = strchr(p, '\n');
		if (p != NULL)
			p++;
	}
	return NAN;
}

double
pc_metric_get(int port, const char *series)
{
	int status = 0;
	char *body = pc_http_get(port, "/metrics", &status);
	double v = NAN;
	if (body != NULL && status == 200)
		v = pc_metric(body, series);
	free(body);
	return v;
}

/* ---- processes ---- */

int
pc_free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		return -1;
	struct sockaddr_in sa = { .sin_family = AF_INET };
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t sl = sizeof sa;
	int port = -1;
	if (bind(fd, (struct sockaddr *) &sa, sizeof sa) == 0 &&
	    getsockname(fd, (struct sockaddr *) &sa, &sl) == 0)
		port = ntohs(sa.sin_port);
	close(fd);
	return port;
}

pid_t
pc_spawn(char *const argv[], const char *log_path)
{
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid != 0)
		return pid;
	/* A test that fails stops without its clean-up: its processes
	 * must not outlive it (nor start if it is gone already). */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(126);
	int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
	if (fd >= 0) {
		dup2(fd, STDOUT_FILENO);
		dup2(fd, STDERR_FILENO);
		close(fd);
	}
	execv(argv[0], argv);
	_exit(127);
}

int
pc_wait_exit(pid_t pid, int timeout_ms)
{
	uint64_t end = pc_now_ms() + (uint64_t) timeout_ms;
	for (;;) {
		int st;
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid) {
			if (WIFEXITED(st))
				return WEXITSTATUS(st);
			if (WIFSIGNALED(st))
				return 128 + WTERMSIG(st);
			return -1;
		}
		if (r < 0 || pc_now_ms() >= end)
			return -1;
		pc_sleep_ms(10);
	}
}

void
pc_write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	ck_assert_msg(f != NULL, "cannot write %s", path);
	ck_assert_int_ge(fputs(text, f), 0);
	ck_assert_int_eq(fclose(f), 0);
}

void
pc_rm_rf(const char *dir)
{
	char cmd[512];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
}

bool
pc_log_has_sanitizer_report(const char *log_path)
{
	char *text = pc_read_file(log_path);
	bool dirty = text != NULL &&
	    (strstr(text, "Sanitizer") != NULL ||
	        strstr(text, "runtime error:") != NULL);
	if (dirty)
		fprintf(stderr, "%s\n", text);
	free(text);
	return dirty;
}

pc_run_result
pc_run(const char *const *argv, const char *dir, const char *cwd,
    const char *env_name, const char *env_value, int timeout_ms)
{
	char out_path[256], err_path[256];
	snprintf(out_path, sizeof out_path, "%s/run-%d.out", dir, getpid());
	snprintf(err_path, sizeof err_path, "%s/run-%d.err", dir, getpid());
	pid_t pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int fo = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		int fe = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fo < 0 || fe < 0 || (cwd != NULL && chdir(cwd) != 0))
			_exit(126);
		dup2(fo, STDOUT_FILENO);
		dup2(fe, STDERR_FILENO);
		if (env_name != NULL)
			setenv(env_name, env_value, 1);
		execv(argv[0], (char *const *) argv);
		_exit(127);
	}
	pc_run_result r = { .status = pc_wait_exit(pid, timeout_ms) };
	if (r.status < 0) {
		kill(pid, SIGKILL);
		pc_wait_exit(pid, 2000);
	}
	r.out = pc_read_file(out_path);
	r.err = pc_read_file(err_path);
	unlink(out_path);
	unlink(err_path);
	if (r.out == NULL)
		r.out = strdup("");
	if (r.err == NULL)
		r.err = strdup("");
	return r;
}

void
pc_run_free(pc_run_result *r)
{
	free(r->out);
	free(r->err);
	memset(r, 0, sizeof *r);
}

const char *
pc_allotd_path(void)
{
	static char path[512];
	const char *b = getenv("ALLOT_BUILD_DIR");
	snprintf(path, sizeof path, "%s/coordinator/allotd", b ? b : ".");
	return path;
}

pid_t
pc_allotd_start(const char *const *args, int http_port, const char *log_path)
{
	char *argv[64] = { (char *) pc_allotd_path() };
	size_t n = 1;
	for (size_t i = 0; args[i] != NULL; i++) {
		ck_assert_uint_lt(n + 1, sizeof argv / sizeof argv[0]);
		argv[n++] = (char *) args[i];
	}
	argv[n] = NULL;
	pid_t pid = pc_spawn(argv, log_path);
	ck_assert_int_gt(pid, 0);
	uint64_t end = pc_now_ms() + 10000;
	for (;;) {
		int status = 0;
		free(pc_http_get(http_port, "/healthz", &status));
		if (status == 200)
			return pid;
		int ex = pc_wait_exit(pid, 0);
		ck_assert_msg(ex == -1, "allotd exited early with %d (see %s)",
		    ex, log_path);
		ck_assert_msg(pc_now_ms() < end,
		    "allotd did not come up (see %s)", log_path);
		pc_sleep_ms(20);
	}
}

int
pc_allotd_stop(pid_t pid, int timeout_ms)
{
	if (pid <= 0)
		return -1;
	kill(pid, SIGTERM);
	int ex = pc_wait_exit(pid, timeout_ms);
	if (ex < 0) {
		kill(pid, SIGKILL);
		pc_wait_exit(pid, 5000);
	}
	return ex;
}

/* ---- a test's allotd ---- */

/* The one whose allotd and directory the atexit handler removes when the
 * process ends before pc_coord_done(): a test that calls exit(), or one
 * run without fork (CK_FORK=no) that fails half-way. A forked test that
 * fails ends without running atexit handlers: its allotd dies with it
 * (PR_SET_PDEATHSIG), and a suite that wants its files gone as well
 * makes them under a directory of the runner's, as coord_harness.c
 * does. */
static pc_coord *live_coord;

static void
coord_cleanup_at_exit(void)
{
	pc_coord *c = live_coord;
	if (c == NULL)
		return;
	if (c->pid > 0) {
		kill(c->pid, SIGKILL);
		pc_wait_exit(c->pid, 2000);
		c->pid = 0;
	}
	pc_rm_rf(c->dir);
	live_coord = NULL;
}

void
pc_coord_init(pc_coord *c, const char *prefix, const char *cfg_text)
{
	memset(c, 0, sizeof *c);
	int n = snprintf(c->dir, sizeof c->dir, "%s-XXXXXX", prefix);
	ck_assert_msg(n > 0 && (size_t) n < sizeof c->dir,
	    "directory prefix too long: %s", prefix);
	ck_assert_ptr_nonnull(mkdtemp(c->dir));
	snprintf(c->cfg, sizeof c->cfg, "%s/quotas.yaml", c->dir);
	snprintf(c->db, sizeof c->db, "%s/allot.db", c->dir);
	snprintf(c->log, sizeof c->log, "%s/allotd.log", c->dir);
	snprintf(c->sock, sizeof c->sock, "%s/allotd.sock", c->dir);
	snprintf(c->ipc, sizeof c->ipc, "ipc://%s", c->sock);
	pc_write_file(c->cfg, cfg_text);
	live_coord = c;
	static bool registered;
	if (!registered) {
		atexit(coord_cleanup_at_exit);
		registered = true;
	}
}

/* Append the NULL-terminated `list` (may be NULL) to argv[*n]. */
static void
append_args(const char **argv, size_t cap, size_t *n, const char *const *list)
{
	for (size_t i = 0; list != NULL && list[i] != NULL; i++) {
		ck_assert_uint_lt(*n + 1, cap);
		argv[(*n)++] = list[i];
	}
}

void
pc_coord_spawn(pc_coord *c, const char *const *args, const char *const *extra)
{
	c->port = pc_free_port();
	c->http = pc_free_port();
	ck_assert_int_gt(c->port, 0);
	ck_assert_int_gt(c->http, 0);
	snprintf(c->url, sizeof c->url, "tcp://127.0.0.1:%d", c->port);
	char http[32];
	snprintf(http, sizeof http, "127.0.0.1:%d", c->http);
	const char *argv[48] = { "--config", c->cfg, "--db", c->db, "--listen",
		c->url, "--http", http };
	size_t n = 8;
	size_t cap = sizeof argv / sizeof argv[0];
	append_args(argv, cap, &n, args);
	append_args(argv, cap, &n, extra);
	argv[n] = NULL;
	c->pid = pc_allotd_start(argv, c->http, c->log);
}

int
pc_coord_stop(pc_coord *c, int sig, int timeout_ms)
{
	if (c->pid <= 0)
		return -1;
	kill(c->pid, sig);
	int ex = pc_wait_exit(c->pid, timeout_ms);
	if (ex >= 0)
		c->pid = 0;
	return ex;
}

void
pc_coord_done(pc_coord *c, int term_ms)
{
	if (c->pid > 0) {
		if (term_ms > 0) {
			pc_allotd_stop(c->pid, term_ms);
		} else {
			kill(c->pid, SIGKILL);
			pc_wait_exit(c->pid, 2000);
		}
		c->pid = 0;
	}
	/* Sanitizer builds: allotd's own reports end up in its log. */
	bool dirty = pc_log_has_sanitizer_report(c->log);
	pc_rm_rf(c->dir);
	if (live_coord == c)
		live_coord = NULL;
	ck_assert_msg(!dirty, "allotd reported a sanitizer error");
}

pc_coord *
pc_coord_live(void)
{
	return live_coord;
}

/* Everything `f` yields, NUL terminated (malloc'd), with its length;
 * NULL when out of memory. */
static char *
slurp(FILE *f, size_t *ret_len)
{
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap + 1);
	while (buf != NULL) {
		size_t n = fread(buf + len, 1, cap - len, f);
		len += n;
		if (n == 0)
			break;
		if (len == cap) {
			char *nb = realloc(buf, cap * 2 + 1);
			if (nb == NULL) {
				free(buf);
				return NULL;
			}
			buf = nb;
			cap *= 2;
		}
	}
	if (buf != NULL)
		buf[len] = '\0';
	*ret_len = len;
	return buf;
}

char *
pc_read_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (f == NULL)
		return NULL;
	size_t len;
	char *buf = slurp(f, &len);
	fclose(f);
	return buf;
}

char *
pc_shell(const char *cmd)
{
	FILE *p = popen(cmd, "r");
	if (p == NULL)
		return NULL;
	size_t len = 0;
	char *buf = slurp(p, &len);
	int st = pclose(p);
	if (buf == NULL)
		return NULL;
	while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == ' '))
		buf[--len] = '\0';
	if (st != 0) {
		free(buf);
		return NULL;
	}
	return buf;
}

int
pc_ctl_member(const char *admin, const char *args)
{
	char cmd[1024];
	snprintf(cmd, sizeof cmd,
	    "%s/tools/allotctl member %s --admin %s >/dev/null 2>&1; echo $?",
	    getenv("ALLOT_BUILD_DIR"), args, admin);
	char *s = pc_shell(cmd);
	int rc = s != NULL ? atoi(s) : -1;
	free(s);
	return rc;
}

bool
pc_member_is_voter(const char *admin, uint64_t id)
{
	char cmd[1024];
	snprintf(cmd, sizeof cmd,
	    "%s/tools/allotctl member list --admin %s 2>/dev/null | "
	    "awk '$1 == %" PRIu64 " {print $4}'",
	    getenv("ALLOT_BUILD_DIR"), admin, id);
	char *s = pc_shell(cmd);
	bool yes = s != NULL && strcmp(s, "voter") == 0;
	free(s);
	return yes;
}

/* The number of rows for `id` in the member list, -1 when the list
 * did not come (allotctl failed). */
static int
member_rows(const char *admin, uint64_t id)
{
	char cmd[1024];
	snprintf(cmd, sizeof cmd,
	    "out=$(%s/tools/allotctl member list --admin %s 2>/dev/null) "
	    "|| { echo -1; exit 0; }; echo \"$out\" | "
	    "awk '$1 == %" PRIu64 "' | wc -l",
	    getenv("ALLOT_BUILD_DIR"), admin, id);
	char *s = pc_shell(cmd);
	int n = s != NULL ? atoi(s) : -1;
	free(s);
	return n;
}

bool
pc_member_listed(const char *admin, uint64_t id)
{
	return member_rows(admin, id) > 0;
}

bool
pc_member_gone_everywhere(
    const char *const *admins, size_t n, uint64_t id, int timeout_ms)
{
	uint64_t until = pc_now_ms() + (uint64_t) timeout_ms;
	for (;;) {
		bool gone = true;
		for (size_t i = 0; i < n && gone; i++)
			gone = member_rows(admins[i], id) == 0;
		if (gone)
			return true;
		if (pc_now_ms() >= until)
			return false;
		pc_sleep_ms(20);
	}
}

static bool
serving(int http_port)
{
	int st = 0;
	char *body = pc_http_get(http_port, "/status", &st);
	bool yes = body != NULL && st == 200 &&
	    strstr(body, "\"serving\":true") != NULL;
	free(body);
	return yes;
}

int
pc_wait_serving(const int *http, const bool *up, size_t n, int timeout_ms)
{
	uint64_t until = pc_now_ms() + (uint64_t) timeout_ms;
	do {
		int who = -1, count = 0;
		for (size_t i = 0; i < n; i++)
			if (up[i] && serving(http[i])) {
				who = (int) i;
				count++;
			}
		ck_assert_int_le(count, 1);
		if (who >= 0)
			return who;
		pc_sleep_ms(10);
	} while (pc_now_ms() < until);
	return -1;
}

void
pc_log_ids_record(void *ctx, int level, const char *id, const char *msg)
{
	(void) level;
	(void) msg;
	pc_log_ids *s = ctx;
	pthread_mutex_lock(&s->mu);
	size_t n = strlen(s->ids);
	if (n + strlen(id) + 2 < sizeof s->ids)
		snprintf(s->ids + n, sizeof s->ids - n, "%s ", id);
	pthread_mutex_unlock(&s->mu);
}

int
pc_log_ids_count(pc_log_ids *s, const char *id)
{
	int n = 0;
	pthread_mutex_lock(&s->mu);
	for (const char *p = s->ids; (p = strstr(p, id)) != NULL; p++)
		n++;
	pthread_mutex_unlock(&s->mu);
	return n;
}

uint64_t
pc_config_digest(const char *text)
{
	char err[256];
	allot_config *cfg;
	ck_assert_int_eq(
	    allot_config_parse("t", text, strlen(text), err, sizeof err, &cfg),
	    ALLOT_OK);
	uint64_t d = cfg->digest;
	allot_config_free(cfg);
	return d;
}
