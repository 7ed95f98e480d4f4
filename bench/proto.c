/* SPDX-License-Identifier: MIT */
/*
 * The protocol-level pieces shared by the suites that drive real allotd
 * processes (bench/proto.h): quota files, allotd with the benchmarks'
 * options, registration and the multi-member client load, on the test
 * support library's fixture and client.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <allot/allot.h>

#include "allotd.h"
#include "bench.h"
#include "proto.h"
#include "proc.h"
#include "proto_client.h"
#include "protocol.h"

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

char *
proto_quotas(const char *const *ids, int n, double rate, double burst,
    const char *fallback)
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
	return b.p;
}

const char *const proto_allotd_args[] = { "--log-level", "warning",
	"--peer-message-rate", "0", "--interval-ms", "1000",
	"--expiry-intervals", "30", NULL };

void
proto_allotd_start(pc_coord *c, const char *prefix, const char *quotas)
{
	pc_coord_init(c, prefix, quotas);
	pc_coord_spawn(c, proto_allotd_args, NULL);
}

void
proto_allotd_stop(pc_coord *c)
{
	if (pc_coord_stop(c, SIGTERM, 30000) != 0)
		bench_fail("allotd did not drain cleanly (see %s)", c->log);
	pc_coord_done(c, 0);
}

uint64_t
proto_join(pc_conn *conn, const char *url, const char *replica_id,
    const char *const *keys, int nkeys)
{
	if (pc_open(conn, url, 4000) != 0)
		return 0;
	Allot__V1__Envelope *r = pc_register(
	    conn, replica_id, "bench", keys, (size_t) nkeys, 1000);
	uint64_t session = 0;
	if (r != NULL && r->body_case == ALLOT__V1__ENVELOPE__BODY_WELCOME)
		session = r->welcome->session;
	pc_free(r);
	return session;
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
typedef struct session {
	pc_conn conn;
	uint64_t id;
	uint64_t seq;
} session;

typedef struct replica {
	session ss[PROTO_MAX_MEMBERS];
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
			if ((rs[i].ss[m].id = proto_join(&rs[i].ss[m].conn,
			         l->urls[m], id, l->keys, l->nkeys)) == 0)
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
				sent[m] = pc_post(&rs[i].ss[m].conn, &env);
			}
			bool counted = atomic_load_explicit(
			    &run->measuring, memory_order_relaxed);
			for (int m = 0; m < nm; m++) {
				Allot__V1__Envelope *r = sent[m] == 0 ?
				    pc_collect(&rs[i].ss[m].conn) :
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
				pc_free(r);
			}
		}
	}
	atomic_fetch_add(&run->acked, acked);
	atomic_fetch_add(&run->not_owner, not_owner);
	atomic_fetch_add(&run->rejected, rejected);
	for (int i = 0; i < nr; i++)
		for (int m = 0; m < nm; m++)
			pc_close(&rs[i].ss[m].conn);
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

/* ---- a large quota file through the admin API (issue 27) ---- */

char *
proto_many_quotas(unsigned n, unsigned rate)
{
	size_t cap = 128 + (size_t) n * 64, len = 0;
	char *t = malloc(cap);
	if (t == NULL)
		bench_fail("out of memory");
	len += (size_t) snprintf(t, cap,
	    "quotas:\n  default: {tokens_per_second: 10, burst: 20}\n"
	    "  callers:\n");
	for (unsigned i = 0; i < n; i++)
		len += (size_t) snprintf(t + len, cap - len,
		    "    - {identity: \"c%u\", tokens_per_second: %u, burst: "
		    "%u}\n",
		    i, rate, 2 * rate);
	return t;
}

double
proto_admin_post(const char *sock, const char *file, const char *path)
{
	char cmd[768];
	snprintf(cmd, sizeof cmd,
	    "curl -s -m 300 --unix-socket %s -X POST --data-binary @%s "
	    "'http://allotd%s' -o /dev/null -w '%%{http_code}'",
	    sock, file, path);
	uint64_t t0 = bench_now_ns();
	char *out = pc_shell(cmd);
	double s = (double) (bench_now_ns() - t0) / 1e9;
	if (out == NULL || strcmp(out, "200") != 0)
		bench_fail("%s: %s", path, out != NULL ? out : "curl failed");
	free(out);
	return s;
}
