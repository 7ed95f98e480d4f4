/* SPDX-License-Identifier: MIT */
/*
 * Suite `cluster`: a three-member allotd cluster on Raft, on loopback
 * (real processes, the release build next to this benchmark, durable
 * stores and logs in a temporary directory; docs/operations.md,
 * "Cluster"). Figures:
 *
 *   cluster.leader_key_reports_per_s  key reports acknowledged per second
 *                                     by the leader, replication on (its
 *                                     usage rows go through the log to
 *                                     both followers): the coordinator
 *                                     suite's clients, found the leader
 *                                     by following NOT_LEADER
 *   cluster.single_key_reports_per_s  the same clients against one allotd
 *                                     without raft options, same rounds
 *   cluster.leader_ratio              their ratio, per round, median
 *                                     (target >= 0.7)
 *   cluster.failover_served_ms        from a SIGKILL of the leader until
 *                                     a survivor answers a Register with
 *                                     a Welcome (it has waited out the old
 *                                     lease): election + lease x 1.01;
 *                                     target <= 3 L + 1.01 L + 105 ms
 *   cluster.noise_cpu_pct             CPU used by other processes meanwhile
 *
 * Over-admission through a failover and a partition needs agents that
 * follow the leader (the agent side of the cluster): measured there.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <allot/allot.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "bench.h"
#include "proto.h"

#define NMEM 3
#define NKEYS 50
#define NTHREADS 8
#define SESSIONS_PER_THREAD 4
#define ELECTION_MS 1000

static char dir[64];
static char bin[600];

typedef struct cluster {
	char url[NMEM][64];
	char raft[NMEM][32];
	char seed[NMEM][128];
	char log[NMEM][128];
	pid_t pid[NMEM];
} cluster;

static void
cluster_start(cluster *c, const char *cfg, const char *tag)
{
	memset(c, 0, sizeof *c);
	for (int i = 0; i < NMEM; i++) {
		snprintf(c->url[i], sizeof c->url[i], "tcp://127.0.0.1:%d",
		    proto_free_port());
		snprintf(c->raft[i], sizeof c->raft[i], "127.0.0.1:%d",
		    proto_free_port());
		snprintf(c->seed[i], sizeof c->seed[i], "%d=%s=%s", i + 1,
		    c->raft[i], c->url[i]);
	}
	for (int i = 0; i < NMEM; i++) {
		char id[8], db[160], el[16];
		snprintf(id, sizeof id, "%d", i + 1);
		snprintf(el, sizeof el, "%d", ELECTION_MS);
		snprintf(db, sizeof db, "%s/%s-m%d.db", dir, tag, i + 1);
		snprintf(c->log[i], sizeof c->log[i], "%s/%s-m%d.log", dir,
		    tag, i + 1);
		const char *args[] = { "--listen", c->url[i], "--interval-ms",
			"1000", "--expiry-intervals", "30", "--raft-id", id,
			"--raft-addr", c->raft[i], "--election-ms", el,
			"--seed", c->seed[0], "--seed", c->seed[1], "--seed",
			c->seed[2], NULL };
		c->pid[i] = proto_start_allotd(bin, cfg, db, c->log[i], args);
	}
}

static void
cluster_stop(cluster *c)
{
	for (int i = 0; i < NMEM; i++)
		if (c->pid[i] > 0) {
			proto_stop_allotd(c->pid[i], c->log[i]);
			c->pid[i] = 0;
		}
}

/* The member that answers a Register with a Welcome, asking each in
 * turn until `timeout_ms`; -1 when none does. `skip` is not asked. */
static int
find_leader(
    const cluster *c, const char *const *keys, int skip, unsigned timeout_ms)
{
	uint64_t until = bench_now_ns() + (uint64_t) timeout_ms * 1000000u;
	while (bench_now_ns() < until) {
		for (int i = 0; i < NMEM; i++) {
			if (i == skip)
				continue;
			nng_socket s;
			if (nng_req0_open(&s) != 0)
				continue;
			nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 200);
			nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 200);
			bool ok = false;
			if (nng_dial(s, c->url[i], NULL, 0) == 0) {
				Allot__V1__Register r =
				    ALLOT__V1__REGISTER__INIT;
				r.replica_id = "probe";
				r.service = "bench";
				r.n_keys = 1;
				r.keys = (char **) keys;
				r.sync_interval_ms = 1000;
				Allot__V1__Envelope env =
				    ALLOT__V1__ENVELOPE__INIT;
				env.version = 1;
				env.body_case =
				    ALLOT__V1__ENVELOPE__BODY_REGISTER;
				env.register_ = &r;
				Allot__V1__Envelope *e = proto_exchange(
				    s, &env);
				ok = e != NULL &&
				    e->body_case ==
				        ALLOT__V1__ENVELOPE__BODY_WELCOME;
				if (e != NULL)
					allot__v1__envelope__free_unpacked(
					    e, NULL);
			}
			nng_close(s);
			if (ok)
				return i;
		}
		usleep(2000);
	}
	return -1;
}

/* ---- key reports per second: the leader against one allotd ---- */

typedef struct throughput {
	double leader, single, ratio;
} throughput;

static void
measure_throughput(const bench_opts *o, throughput *ret)
{
	static char keybuf[NKEYS][PROTO_KEY_MAX];
	const char *keys[NKEYS];
	proto_spiffe_keys(keybuf, keys, NKEYS);
	char cfg[128];
	snprintf(cfg, sizeof cfg, "%s/throughput.yaml", dir);
	proto_write_quotas(cfg, keys, NKEYS, 1000000, 2000000, NULL);
	double vl[BENCH_MAX_ROUNDS], vs[BENCH_MAX_ROUNDS],
	    vr[BENCH_MAX_ROUNDS];
	for (unsigned r = 0; r < o->rounds; r++) {
		/* Alternate the order, so drift favours neither side. */
		for (int pass = 0; pass < 2; pass++) {
			bool raft = (pass == 0) == (r % 2 == 0);
			proto_load l = { .keys = keys,
				.nkeys = NKEYS,
				.threads = NTHREADS,
				.replicas_per_thread = SESSIONS_PER_THREAD,
				.members = 1 };
			proto_result res;
			if (raft) {
				cluster c;
				char tag[16];
				snprintf(tag, sizeof tag, "tp%u", r);
				cluster_start(&c, cfg, tag);
				int L = find_leader(&c, keys, -1, 15000);
				if (L < 0)
					bench_fail(
					    "no leader in 15 s (see %s)", dir);
				l.urls[0] = c.url[L];
				l.where = c.log[L];
				proto_load_run(&l, 1000, 3000, &res);
				cluster_stop(&c);
				vl[r] = res.key_reports_per_s;
				bench_progress(o,
				    "round %u: the leader of 3: %.0f key "
				    "reports/s",
				    r, vl[r]);
			} else {
				char db[128], log[128], url[64];
				snprintf(
				    db, sizeof db, "%s/single-%u.db", dir, r);
				snprintf(log, sizeof log, "%s/single-%u.log",
				    dir, r);
				snprintf(url, sizeof url, "tcp://127.0.0.1:%d",
				    proto_free_port());
				const char *args[] = { "--listen", url,
					"--interval-ms", "1000",
					"--expiry-intervals", "30", NULL };
				pid_t pid = proto_start_allotd(
				    bin, cfg, db, log, args);
				l.urls[0] = url;
				l.where = log;
				proto_load_run(&l, 1000, 3000, &res);
				proto_stop_allotd(pid, log);
				vs[r] = res.key_reports_per_s;
				bench_progress(o,
				    "round %u: 1 allotd: %.0f key reports/s",
				    r, vs[r]);
			}
		}
		vr[r] = vl[r] / vs[r];
	}
	ret->leader = bench_median(vl, o->rounds);
	ret->single = bench_median(vs, o->rounds);
	ret->ratio = bench_median(vr, o->rounds);
}

/* ---- failover: SIGKILL of the leader until a new one serves ---- */

static double
measure_failover(const bench_opts *o)
{
	static const char *const keys[] = { "c0" };
	char cfg[128];
	snprintf(cfg, sizeof cfg, "%s/failover.yaml", dir);
	proto_write_quotas(cfg, keys, 1, 400, 80, "closed");
	double v[BENCH_MAX_ROUNDS];
	for (unsigned r = 0; r < o->rounds; r++) {
		cluster c;
		char tag[16];
		snprintf(tag, sizeof tag, "fo%u", r);
		cluster_start(&c, cfg, tag);
		int L = find_leader(&c, keys, -1, 15000);
		if (L < 0)
			bench_fail("no leader in 15 s (see %s)", dir);
		usleep(500000); /* a steady leader, followers up to date */
		uint64_t t0 = bench_now_ns();
		kill(c.pid[L], SIGKILL);
		waitpid(c.pid[L], NULL, 0);
		c.pid[L] = 0;
		int N = find_leader(&c, keys, L, 15000);
		uint64_t t1 = bench_now_ns();
		if (N < 0)
			bench_fail("no new leader in 15 s (see %s)", dir);
		v[r] = (double) (t1 - t0) / 1e6;
		bench_progress(o,
		    "round %u: a new leader serves %.0f ms after "
		    "the kill",
		    r, v[r]);
		cluster_stop(&c);
	}
	return bench_median(v, o->rounds);
}

int
main(int argc, char **argv)
{
	bench_opts o;
	bench_parse_args(argc, argv, "cluster", 0, &o);
	proto_mkdtemp(dir, sizeof dir);
	proto_allotd_path(bin, sizeof bin);
	if (o.rounds > 3)
		o.rounds = 3;

	bench_cpu cpu0, cpu1;
	bench_cpu_mark(&cpu0);
	throughput tp = { NAN, NAN, NAN };
	double served = NAN;
	if (bench_selected(&o, "key_reports_per_s"))
		measure_throughput(&o, &tp);
	if (bench_selected(&o, "failover"))
		served = measure_failover(&o);
	bench_cpu_mark(&cpu1);
	double noise = bench_cpu_others_pct(&cpu0, &cpu1);
	proto_rmdir(dir);

	/* Detection within 3 election timeouts (randomised in [L, 2L]; a
	 * pre-vote refused by a member whose own timeout has not run out is
	 * tried again), then the lease wait, then 100 ms of round trips and
	 * polling. */
	double bound = 3.0 * ELECTION_MS + ELECTION_MS * 1.01 + 5 + 100;
	bench_figure f[] = {
		{ "cluster.leader_key_reports_per_s", "/s", 0,
		    "key reports acknowledged by the leader, replication on",
		    BENCH_AT_LEAST, 1e6, tp.leader },
		{ "cluster.single_key_reports_per_s", "/s", 0,
		    "the same clients against one allotd, same rounds",
		    BENCH_NO_TARGET, 0, tp.single },
		{ "cluster.leader_ratio", "x", 2,
		    "leader with replication / one allotd", BENCH_AT_LEAST,
		    0.7, tp.ratio },
		{ "cluster.failover_served_ms", "ms", 0,
		    "SIGKILL of the leader until a survivor answers Welcome",
		    BENCH_AT_MOST, bound, served },
		{ "cluster.noise_cpu_pct", "%", 1,
		    "CPU used by other processes during the run",
		    BENCH_NO_TARGET, 0, noise },
	};
	char header[200];
	snprintf(header, sizeof header,
	    "cluster: 3 allotd members on Raft, loopback; %d sessions x %d "
	    "keys; election timeout = lease = %d ms",
	    NTHREADS * SESSIONS_PER_THREAD, NKEYS, ELECTION_MS);
	bench_report(&o, header, f, sizeof f / sizeof f[0]);
	return 0;
}
