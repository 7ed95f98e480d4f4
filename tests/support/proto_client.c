/* SPDX-License-Identifier: MIT */
/*
 * The raw protocol test client (proto_client.h). Blocking nng req0 calls
 * with timeouts, so a test that waits on a silent coordinator fails
 * instead of hanging; no request is ever resent by nng (the resend timer
 * is pushed out), because a resend would reuse the sequence number.
 */
#include "proto_client.h"

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <nng/protocol/reqrep0/req.h>

#include "config.h"
#include "fail.h"
#include "proc.h"

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

/* Send `len` raw bytes: 0 or an nng error. */
static int
post_raw(pc_conn *c, const void *buf, size_t len)
{
	nng_msg *m;
	int rv = nng_msg_alloc(&m, len);
	if (rv != 0)
		return rv;
	if (len > 0)
		memcpy(nng_msg_body(m), buf, len);
	if ((rv = nng_sendmsg(c->sock, m, 0)) != 0)
		nng_msg_free(m);
	return rv;
}

Allot__V1__Envelope *
pc_collect(pc_conn *c)
{
	nng_msg *m;
	if (nng_recvmsg(c->sock, &m, 0) != 0)
		return NULL;
	Allot__V1__Envelope *env = allot__v1__envelope__unpack(
	    NULL, nng_msg_len(m), nng_msg_body(m));
	nng_msg_free(m);
	return env;
}

Allot__V1__Envelope *
pc_raw(pc_conn *c, const void *buf, size_t len)
{
	return post_raw(c, buf, len) == 0 ? pc_collect(c) : NULL;
}

int
pc_post(pc_conn *c, const Allot__V1__Envelope *env)
{
	size_t n = allot__v1__envelope__get_packed_size(env);
	uint8_t *buf = malloc(n ? n : 1);
	if (buf == NULL)
		return NNG_ENOMEM;
	allot__v1__envelope__pack(env, buf);
	int rv = post_raw(c, buf, n);
	free(buf);
	return rv;
}

Allot__V1__Envelope *
pc_send(pc_conn *c, const Allot__V1__Envelope *env)
{
	return pc_post(c, env) == 0 ? pc_collect(c) : NULL;
}

Allot__V1__Envelope *
pc_send_register(pc_conn *c, Allot__V1__Register *reg)
{
	Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
	env.version = 1;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_REGISTER;
	env.register_ = reg;
	return pc_send(c, &env);
}

Allot__V1__Envelope *
pc_send_sync(pc_conn *c, Allot__V1__Sync *sync)
{
	Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
	env.version = 1;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_SYNC;
	env.sync = sync;
	return pc_send(c, &env);
}

Allot__V1__Envelope *
pc_send_ask(pc_conn *c, Allot__V1__Ask *ask)
{
	Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
	env.version = 1;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_ASK;
	env.ask = ask;
	return pc_send(c, &env);
}

Allot__V1__Envelope *
pc_register(pc_conn *c, const char *replica_id, const char *service,
    const char *const *keys, size_t nkeys, uint32_t interval_ms)
{
	return pc_register_account(
	    c, replica_id, service, keys, nkeys, interval_ms, 0);
}

Allot__V1__Envelope *
pc_register_account(pc_conn *c, const char *replica_id, const char *service,
    const char *const *keys, size_t nkeys, uint32_t interval_ms,
    uint64_t incarnation)
{
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
	reg.incarnation = incarnation;
	return pc_send_register(c, &reg);
}

Allot__V1__Envelope *
pc_sync(pc_conn *c, uint64_t session, uint64_t seq, uint32_t elapsed_ms,
    const pc_report *r, size_t n)
{
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
	Allot__V1__Envelope *ret = pc_send_sync(c, &sync);
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

Allot__V1__Envelope *
pc_replica_send(pc_replica *r, Allot__V1__Sync *sy, uint32_t elapsed_ms)
{
	sy->session = r->session;
	sy->seq = ++r->seq;
	sy->elapsed_ms = elapsed_ms;
	return pc_send_sync(&r->c, sy);
}

void
pc_replica_close(pc_replica *r)
{
	pc_close(&r->c);
}

/* ---- replicas kept syncing from a thread ---- */

static void *
drive(void *arg)
{
	pc_driver *d = arg;
	while (!atomic_load(&d->stop)) {
		for (size_t i = 0; i < d->n; i++) {
			pc_report rep[PC_MAX_KEYS];
			size_t nrep = d->fill(d->ctx, i, rep);
			if (pc_replica_sync(&d->r[i], rep, nrep, NULL) == 0)
				atomic_fetch_add(&d->syncs, 1);
			else
				atomic_fetch_add(&d->errors, 1);
		}
		pc_sleep_ms(d->period_ms);
	}
	return NULL;
}

void
pc_driver_start(pc_driver *d, const char *url, const char *id_prefix,
    const char *service, const char *const *keys, size_t nkeys, size_t n,
    unsigned period_ms, pc_driver_fill fill, void *ctx)
{
	PC_CHECK(
	    n <= PC_DRIVER_MAX, "%zu replicas, at most %d", n, PC_DRIVER_MAX);
	memset(d, 0, sizeof *d);
	d->n = n;
	d->period_ms = period_ms;
	d->fill = fill;
	d->ctx = ctx;
	for (size_t i = 0; i < n; i++) {
		char id[64];
		snprintf(id, sizeof id, "%s-%zu", id_prefix, i + 1);
		int rc = pc_replica_join(
		    &d->r[i], url, id, service, keys, nkeys);
		PC_CHECK(rc == 0, "replica %s: register failed (%d)", id, rc);
	}
	PC_CHECK(
	    pthread_create(&d->thread, NULL, drive, d) == 0, "pthread_create");
	d->running = true;
}

void
pc_driver_stop(pc_driver *d)
{
	if (!d->running)
		return;
	atomic_store(&d->stop, true);
	pthread_join(d->thread, NULL);
	for (size_t i = 0; i < d->n; i++)
		pc_replica_close(&d->r[i]);
	d->running = false;
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
	PC_CHECK(allot_config_parse("t", text, strlen(text), err, sizeof err,
	             &cfg) == ALLOT_OK,
	    "config: %s", err);
	uint64_t d = cfg->digest;
	allot_config_free(cfg);
	return d;
}
