/* SPDX-License-Identifier: MIT */
/*
 * The protocol-level pieces shared by the suites that drive real allotd
 * processes: ports, quota files, allotd's start and stop, exchanges,
 * registration and the multi-member client load (bench/proto.h).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include <allot/allot.h>

#include "bench.h"
#include "proto.h"
#include "protocol.h"

void
proto_mkdtemp(char *buf, size_t len)
{
	snprintf(buf, len, "/tmp/allot-bench-XXXXXX");
	if (mkdtemp(buf) == NULL)
		bench_fail("mkdtemp: %s", strerror(errno));
}

void
proto_rmdir(const char *dir)
{
	char cmd[96];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "bench: could not remove %s\n", dir);
}

void
proto_spiffe_keys(char (*buf)[PROTO_KEY_MAX], const char **keys, int n)
{
	for (int k = 0; k < n; k++) {
		snprintf(buf[k], PROTO_KEY_MAX, "spiffe://bench/c%02d", k);
		keys[k] = buf[k];
	}
}

allot_agent *
proto_agent(const char *cfgpath, const allot_agent_options *opts)
{
	char err[256];
	allot_config *cfg;
	if (allot_config_load(cfgpath, err, sizeof err, &cfg) != ALLOT_OK)
		bench_fail("config %s: %s", cfgpath, err);
	allot_agent *a;
	if (allot_agent_create(cfg, opts, &a) != ALLOT_OK)
		bench_fail("allot_agent_create failed");
	allot_config_free(cfg);
	return a;
}

int
proto_free_port(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = { .sin_family = AF_INET,
		.sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof a;
	if (fd < 0 || bind(fd, (struct sockaddr *) &a, sizeof a) != 0 ||
	    getsockname(fd, (struct sockaddr *) &a, &len) != 0)
		bench_fail("cannot find a free port: %s", strerror(errno));
	close(fd);
	return ntohs(a.sin_port);
}

void
proto_allotd_path(char *buf, size_t len)
{
	char self[512];
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	if (n <= 0)
		bench_fail("readlink /proc/self/exe");
	self[n] = '\0';
	char *slash = strrchr(self, '/');
	*slash = '\0';
	snprintf(buf, len, "%s/../coordinator/allotd", self);
	if (access(buf, X_OK) != 0)
		bench_fail("no allotd at %s", buf);
}

void
proto_write_quotas(const char *path, const char *const *ids, int n,
    double rate, double burst, const char *fallback)
{
	bench_buf b = { 0 };
	bench_buf_printf(&b,
	    "quotas:\n  default: {tokens_per_second: 10, "
	    "burst: 20}\n  callers:\n");
	for (int i = 0; i < n; i++) {
		bench_buf_printf(&b,
		    "    - {identity: \"%s\", tokens_per_second: %.0f, "
		    "burst: %.0f",
		    ids[i], rate, burst);
		if (fallback != NULL)
			bench_buf_printf(&b, ", fallback: %s", fallback);
		bench_buf_printf(&b, "}\n");
	}
	FILE *f = fopen(path, "w");
	if (f == NULL || fputs(b.p, f) < 0 || fclose(f) != 0)
		bench_fail("cannot write %s", path);
	bench_buf_free(&b);
}

pid_t
proto_start_allotd(const char *bin, const char *cfg, const char *db,
    const char *log, const char *const *args)
{
	/* Every benchmark client syncs flat out from one address: no
	 * per-peer message budget. */
	const char *argv[64] = { bin, "--config", cfg, "--db", db, "--http",
		"off", "--log-level", "warning", "--peer-message-rate", "0" };
	size_t n = 11;
	for (size_t i = 0; args != NULL && args[i] != NULL; i++) {
		if (n + 1 >= sizeof argv / sizeof argv[0])
			bench_fail("too many allotd arguments");
		argv[n++] = args[i];
	}
	argv[n] = NULL;
	pid_t pid = fork();
	if (pid < 0)
		bench_fail("fork: %s", strerror(errno));
	if (pid == 0) {
		if (freopen(log, "w", stderr) == NULL ||
		    freopen("/dev/null", "w", stdout) == NULL)
			_exit(127);
		execv(bin, (char *const *) argv);
		_exit(127);
	}
	return pid;
}

void
proto_stop_allotd(pid_t pid, const char *log)
{
	kill(pid, SIGTERM);
	int st;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) ||
	    WEXITSTATUS(st) != 0)
		bench_fail("allotd did not drain cleanly (see %s)", log);
}

int
proto_send(nng_socket s, Allot__V1__Envelope *env)
{
	size_t len = allot__v1__envelope__get_packed_size(env);
	uint8_t *buf = malloc(len);
	if (buf == NULL)
		bench_fail("out of memory");
	allot__v1__envelope__pack(env, buf);
	int rv = nng_send(s, buf, len, 0);
	free(buf);
	return rv;
}

Allot__V1__Envelope *
proto_recv(nng_socket s)
{
	void *in;
	size_t inlen;
	if (nng_recv(s, &in, &inlen, NNG_FLAG_ALLOC) != 0)
		return NULL;
	Allot__V1__Envelope *r = allot__v1__envelope__unpack(NULL, inlen, in);
	nng_free(in, inlen);
	return r;
}

Allot__V1__Envelope *
proto_exchange(nng_socket s, Allot__V1__Envelope *env)
{
	return proto_send(s, env) == 0 ? proto_recv(s) : NULL;
}

int
proto_join(proto_session *ss, const char *url, const char *replica_id,
    const char *const *keys, int nkeys)
{
	if (nng_req0_open(&ss->s) != 0)
		return -1;
	nng_socket_set_ms(ss->s, NNG_OPT_RECVTIMEO, 5000);
	nng_socket_set_ms(ss->s, NNG_OPT_SENDTIMEO, 5000);
	for (int tries = 0; nng_dial(ss->s, url, NULL, 0) != 0; tries++) {
		if (tries > 200)
			return -1;
		usleep(20000);
	}
	Allot__V1__Register reg = ALLOT__V1__REGISTER__INIT;
	reg.replica_id = (char *) replica_id;
	reg.service = (char *) "bench";
	reg.host = (char *) "localhost";
	reg.pid = (uint32_t) getpid();
	reg.agent_version = (char *) "bench";
	reg.n_keys = (size_t) nkeys;
	reg.keys = (char **) keys;
	reg.sync_interval_ms = 1000;
	Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
	env.version = ALLOT__PROTOCOL_VERSION;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_REGISTER;
	env.register_ = &reg;
	Allot__V1__Envelope *r = proto_exchange(ss->s, &env);
	if (r == NULL || r->body_case != ALLOT__V1__ENVELOPE__BODY_WELCOME) {
		if (r != NULL)
			allot__v1__envelope__free_unpacked(r, NULL);
		return -1;
	}
	ss->id = r->welcome->session;
	ss->seq = 0;
	allot__v1__envelope__free_unpacked(r, NULL);
	return 0;
}

/* ---- the load ---- */

typedef struct load_run {
	const proto_load *l;
	_Atomic int stop;
	_Atomic int measuring;
	_Atomic uint64_t acked;
	_Atomic uint64_t not_owner;
	_Atomic uint64_t rejected;
	_Atomic uint64_t errors;
} load_run;

typedef struct load_thread {
	load_run *run;
	int t;
	pthread_t th;
} load_thread;

/* One replica: a session with every member. */
typedef struct replica {
	proto_session ss[PROTO_MAX_MEMBERS];
} replica;

static void *
client(void *arg)
{
	load_thread *lt = arg;
	load_run *run = lt->run;
	const proto_load *l = run->l;
	int nr = l->replicas_per_thread, nm = l->members;
	replica *rs = calloc((size_t) nr, sizeof *rs);
	Allot__V1__KeyReport *reps = calloc((size_t) l->nkeys, sizeof *reps);
	/* ptrs[m * nkeys ...]: member m's reports, n_of[m] of them. */
	Allot__V1__KeyReport **ptrs = calloc(
	    (size_t) (nm * l->nkeys), sizeof *ptrs);
	size_t n_of[PROTO_MAX_MEMBERS] = { 0 };
	if (rs == NULL || reps == NULL || ptrs == NULL)
		bench_fail("out of memory");
	for (int i = 0; i < nr; i++) {
		int n = lt->t * nr + i;
		char id[32];
		snprintf(id, sizeof id, "bench-%d", n);
		for (int m = 0; m < nm; m++)
			if (proto_join(&rs[i].ss[m], l->urls[m], id, l->keys,
			        l->nkeys) != 0)
				bench_fail("session %d could not register "
				           "with %s (see %s)",
				    n, l->urls[m], l->where);
	}
	for (int k = 0; k < l->nkeys; k++) {
		allot__v1__key_report__init(&reps[k]);
		reps[k].key = (uint32_t) k;
		reps[k].consumed = 5;
		reps[k].denied = 0;
		reps[k].held = 1000;
		reps[k].demand = 50;
		int m = l->owner != NULL ? l->owner[k] : 0;
		ptrs[m * l->nkeys + (int) n_of[m]++] = &reps[k];
	}
	uint64_t acked = 0, not_owner = 0, rejected = 0;
	while (!atomic_load(&run->stop)) {
		for (int i = 0; i < nr; i++) {
			/* Every member at once, as an agent's sessions run
			 * side by side; then their answers. */
			int sent[PROTO_MAX_MEMBERS];
			for (int m = 0; m < nm; m++) {
				Allot__V1__Sync sy = ALLOT__V1__SYNC__INIT;
				sy.session = rs[i].ss[m].id;
				sy.seq = ++rs[i].ss[m].seq;
				sy.elapsed_ms = 100;
				sy.n_reports = n_of[m];
				sy.reports = &ptrs[m * l->nkeys];
				Allot__V1__Envelope env =
				    ALLOT__V1__ENVELOPE__INIT;
				env.version = ALLOT__PROTOCOL_VERSION;
				env.body_case = ALLOT__V1__ENVELOPE__BODY_SYNC;
				env.sync = &sy;
				sent[m] = proto_send(rs[i].ss[m].s, &env);
			}
			bool counted = atomic_load_explicit(
			    &run->measuring, memory_order_relaxed);
			for (int m = 0; m < nm; m++) {
				Allot__V1__Envelope *r = sent[m] == 0 ?
				    proto_recv(rs[i].ss[m].s) :
				    NULL;
				if (r != NULL &&
				    r->body_case ==
				        ALLOT__V1__ENVELOPE__BODY_REPLY) {
					const Allot__V1__Reply *re = r->reply;
					if (counted) {
						acked += n_of[m] -
						    re->rejected_reports -
						    re->n_not_owner;
						not_owner += re->n_not_owner;
						rejected +=
						    re->rejected_reports;
					}
				} else
					atomic_fetch_add(&run->errors, 1);
				if (r != NULL)
					allot__v1__envelope__free_unpacked(
					    r, NULL);
			}
		}
	}
	atomic_fetch_add(&run->acked, acked);
	atomic_fetch_add(&run->not_owner, not_owner);
	atomic_fetch_add(&run->rejected, rejected);
	for (int i = 0; i < nr; i++)
		for (int m = 0; m < nm; m++)
			nng_close(rs[i].ss[m].s);
	free(ptrs);
	free(reps);
	free(rs);
	return NULL;
}

void
proto_load_run(const proto_load *l, unsigned warm_ms, unsigned measure_ms,
    proto_result *ret)
{
	if (l->members < 1 || l->members > PROTO_MAX_MEMBERS)
		bench_fail(
		    "%d members: 1 to %d", l->members, PROTO_MAX_MEMBERS);
	load_run run = { .l = l };
	load_thread *th = calloc((size_t) l->threads, sizeof *th);
	if (th == NULL)
		bench_fail("out of memory");
	for (int i = 0; i < l->threads; i++) {
		th[i].run = &run;
		th[i].t = i;
		pthread_create(&th[i].th, NULL, client, &th[i]);
	}
	/* Let every session register, then measure. */
	usleep(warm_ms * 1000u);
	atomic_store(&run.measuring, 1);
	uint64_t t0 = bench_now_ns();
	usleep(measure_ms * 1000u);
	atomic_store(&run.measuring, 0);
	uint64_t t1 = bench_now_ns();
	atomic_store(&run.stop, 1);
	for (int i = 0; i < l->threads; i++)
		pthread_join(th[i].th, NULL);
	free(th);
	if (atomic_load(&run.errors) > 0)
		bench_fail("%llu exchanges failed (see %s)",
		    (unsigned long long) atomic_load(&run.errors), l->where);
	ret->key_reports_per_s = (double) atomic_load(&run.acked) /
	    ((double) (t1 - t0) / 1e9);
	ret->not_owner = atomic_load(&run.not_owner);
	ret->rejected = atomic_load(&run.rejected);
}
