/* SPDX-License-Identifier: MIT */
/*
 * Suite `cluster`: a three-member allotd cluster on loopback (real
 * processes, the release build next to this benchmark, durable stores in
 * a temporary directory). Figures:
 *
 *   cluster.key_reports_per_s         key reports acknowledged per second
 *                                     by the three members together: the
 *                                     coordinator suite's clients, each
 *                                     replica registered with every member
 *                                     and reporting each key to its owner
 *   cluster.key_reports_per_s_single  the same clients against one allotd,
 *                                     in the same rounds
 *   cluster.scale_ratio               their ratio, per round, median
 *   cluster.steady_over               over-admission (docs/allocation.md)
 *                                     of in-process agents offering 2 R
 *                                     per key, before a member is killed
 *   cluster.failover_over             the same from 1 s before a SIGKILL
 *                                     of the member owning most keys to
 *                                     4 s after it
 *   cluster.failover_served_ms        from the kill until every agent sees
 *                                     one member down and no key waits
 *                                     for its new owner's answer
 *   cluster.failover_detected_ms      from the kill until every agent sees
 *                                     one member down (a lower bound)
 *   cluster.noise_cpu_pct             CPU used by other processes meanwhile
 *
 * Over-admission is in units of R·T: the max over windows of length
 * W ∈ {T, 1 s}, starting at every admission, of (admitted − (B + R·W)).
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

#include "bench.h"
#include "proto.h"
#include "rendezvous.h"

#define NMEM 3

/* Throughput: the coordinator suite's load. */
#define NKEYS 50
#define NTHREADS 8
#define SESSIONS_PER_THREAD 4

/* Failover: NAG agents on NFKEYS quotas of R tokens/s, burst B, T. */
#define NAG 4
#define NFKEYS 9
#define RATE 400.0
#define BURST 80.0
#define T_MS 100
#define OFFERED (2.0 * RATE / NAG) /* per agent and key, tokens/s */
#define WARM_MS 2000
#define STEADY_MS 3000
#define AFTER_MS 4000

static char dir[64];
static char bin[600];

typedef struct cluster {
	char url[NMEM][64];
	char log[NMEM][128];
	char list[NMEM * 80];
	char member_arg[NMEM][80];
	uint64_t hashes[NMEM];
	pid_t pid[NMEM];
} cluster;

static void
cluster_init(cluster *c)
{
	memset(c, 0, sizeof *c);
	for (int i = 0; i < NMEM; i++) {
		char name[8];
		snprintf(name, sizeof name, "m%d", i + 1);
		snprintf(c->url[i], sizeof c->url[i], "tcp://127.0.0.1:%d",
		    proto_free_port());
		snprintf(c->member_arg[i], sizeof c->member_arg[i], "%s=%s",
		    name, c->url[i]);
		c->hashes[i] = allot__rendezvous_member(name);
		size_t l = strlen(c->list);
		snprintf(c->list + l, sizeof c->list - l, "%s%s", i ? "," : "",
		    c->member_arg[i]);
	}
}

/* Start member i with the timing options `timing` (NULL-terminated). */
static void
start_member(cluster *c, int i, const char *cfg, const char *tag,
    const char *const *timing)
{
	char self[16], db[160];
	snprintf(self, sizeof self, "m%d", i + 1);
	snprintf(db, sizeof db, "%s/%s-%s.db", dir, tag, self);
	snprintf(c->log[i], sizeof c->log[i], "%s/%s-%s.log", dir, tag, self);
	const char *args[24];
	size_t n = 0;
	for (int j = 0; j < NMEM; j++) {
		args[n++] = "--member";
		args[n++] = c->member_arg[j];
	}
	args[n++] = "--self";
	args[n++] = self;
	for (size_t j = 0; timing[j] != NULL; j++)
		args[n++] = timing[j];
	args[n] = NULL;
	c->pid[i] = proto_start_allotd(bin, cfg, db, c->log[i], args);
}

static void
stop_members(cluster *c)
{
	for (int i = 0; i < NMEM; i++)
		if (c->pid[i] > 0) {
			proto_stop_allotd(c->pid[i], c->log[i]);
			c->pid[i] = 0;
		}
}

/* ---- key reports per second: three members against one ---- */

typedef struct throughput {
	double cluster, single, ratio;
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
	const char *timing[] = { "--interval-ms", "1000", "--expiry-intervals",
		"30", NULL };
	double vc[BENCH_MAX_ROUNDS], vs[BENCH_MAX_ROUNDS],
	    vr[BENCH_MAX_ROUNDS];
	for (unsigned r = 0; r < o->rounds; r++) {
		/* Alternate the order, so drift favours neither side. */
		for (int pass = 0; pass < 2; pass++) {
			bool three = (pass == 0) == (r % 2 == 0);
			proto_load l = { .keys = keys,
				.nkeys = NKEYS,
				.threads = NTHREADS,
				.replicas_per_thread = SESSIONS_PER_THREAD };
			int owner[NKEYS];
			proto_result res;
			if (three) {
				cluster c;
				cluster_init(&c);
				char tag[16];
				snprintf(tag, sizeof tag, "tp%u", r);
				for (int i = 0; i < NMEM; i++)
					start_member(&c, i, cfg, tag, timing);
				for (int k = 0; k < NKEYS; k++)
					owner[k] = allot__rendezvous_owner(
					    allot__rendezvous_key(
					        "bench", keys[k]),
					    c.hashes, NULL, NMEM);
				l.members = NMEM;
				for (int i = 0; i < NMEM; i++)
					l.urls[i] = c.url[i];
				l.owner = owner;
				l.where = dir;
				/* One second: the members' first probes
				 * (every T/2) settle their views. */
				proto_load_run(&l, 1000, 3000, &res);
				stop_members(&c);
				vc[r] = res.key_reports_per_s;
				bench_progress(o,
				    "round %u: 3 members: %.0f key "
				    "reports/s (%llu not_owner, %llu "
				    "rejected)",
				    r, vc[r],
				    (unsigned long long) res.not_owner,
				    (unsigned long long) res.rejected);
			} else {
				char db[128], log[128], url[64];
				snprintf(
				    db, sizeof db, "%s/single-%u.db", dir, r);
				snprintf(log, sizeof log, "%s/single-%u.log",
				    dir, r);
				snprintf(url, sizeof url, "tcp://127.0.0.1:%d",
				    proto_free_port());
				const char *args[] = { "--listen", url,
					timing[0], timing[1], timing[2],
					timing[3], NULL };
				pid_t pid = proto_start_allotd(
				    bin, cfg, db, log, args);
				l.members = 1;
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
		vr[r] = vc[r] / vs[r];
	}
	ret->cluster = bench_median(vc, o->rounds);
	ret->single = bench_median(vs, o->rounds);
	ret->ratio = bench_median(vr, o->rounds);
}

/* ---- over-admission during a failover ---- */

/* Admission timestamps (ns) of one key, all agents, in time order. */
typedef struct admits {
	uint64_t *ts;
	size_t n, cap;
} admits;

/*
 * Over-admission of the admissions in [from, to), docs/allocation.md:
 * max over W ∈ {T, 1 s} and over windows [t, t + W] starting at every
 * admission t of (admitted − (B + R·W)), in units of R·T.
 */
static double
over_of(const admits *a, uint64_t from, uint64_t to)
{
	const double ws[] = { T_MS / 1000.0, 1.0 };
	double worst = -INFINITY;
	size_t i0 = 0;
	while (i0 < a->n && a->ts[i0] < from)
		i0++;
	for (size_t w = 0; w < sizeof ws / sizeof ws[0]; w++) {
		uint64_t wns = (uint64_t) (ws[w] * 1e9);
		size_t j = i0;
		for (size_t i = i0; i < a->n && a->ts[i] < to; i++) {
			if (j < i)
				j = i;
			while (j < a->n && a->ts[j] < to &&
			    a->ts[j] <= a->ts[i] + wns)
				j++;
			double over = (double) (j - i) -
			    (BURST + RATE * ws[w]);
			if (over > worst)
				worst = over;
		}
	}
	return worst / (RATE * T_MS / 1000.0);
}

static allot_agent *
mkagent(const char *cfgpath, const char *list, const char *replica)
{
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.coordinator = list;
	o.service = "bench";
	o.replica_id = replica;
	o.sync_interval_ms = T_MS;
	o.reconnect_min_ms = 50;
	o.reconnect_max_ms = 200;
	o.initial_replicas = NAG;
	return proto_agent(cfgpath, &o);
}

typedef struct failover {
	double steady_over, failover_over, served_ms, detected_ms;
} failover;

/*
 * Served: every agent sees one member down and no key waiting for its
 * new owner's answer (allot_sync_stats.keys_unconfirmed == 0; the agent
 * recounts every member's unconfirmed keys as it re-routes them).
 */
typedef struct watch {
	uint64_t down_at, served_at; /* ns, 0: not yet */
} watch;

static void
poll_served(allot_agent **as, watch *w, uint64_t now)
{
	int n_down = 0, n_served = 0;
	for (int i = 0; i < NAG; i++) {
		allot_sync_stats ss;
		allot_sync_stats_get(as[i], &ss);
		bool down = ss.members_down == 1;
		n_down += down;
		n_served += down && ss.keys_unconfirmed == 0;
	}
	if (n_down == NAG && w->down_at == 0)
		w->down_at = now;
	if (n_served == NAG && w->served_at == 0)
		w->served_at = now;
}

/* One failover round: the cluster, the agents on it, and what the load
 * saw. */
typedef struct fo_round {
	const char *keys[NFKEYS];
	char cfg[128];
	cluster c;
	int owned[NMEM]; /* keys each member owns */
	int victim; /* the member owning most keys, killed */
	allot_agent *as[NAG];
	allot_key *kh[NAG][NFKEYS];
	admits ad[NFKEYS]; /* admissions from the steady period on */
	uint64_t issued[NAG][NFKEYS];
	uint64_t start, steady, kill_at, end, killed; /* ns */
	uint64_t offered;
	watch w;
} fo_round;

/* The quota file, the owner of every key, and the three members. */
static void
fo_start_cluster(fo_round *f, unsigned r)
{
	static char keybuf[NFKEYS][8];
	for (int k = 0; k < NFKEYS; k++) {
		snprintf(keybuf[k], sizeof keybuf[k], "c%d", k);
		f->keys[k] = keybuf[k];
	}
	snprintf(f->cfg, sizeof f->cfg, "%s/failover.yaml", dir);
	proto_write_quotas(f->cfg, f->keys, NFKEYS, RATE, BURST, "closed");
	cluster_init(&f->c);
	for (int k = 0; k < NFKEYS; k++)
		f->owned[allot__rendezvous_owner(
		    allot__rendezvous_key("bench", f->keys[k]), f->c.hashes,
		    NULL, NMEM)]++;
	f->victim = 0;
	for (int i = 1; i < NMEM; i++)
		if (f->owned[i] > f->owned[f->victim])
			f->victim = i;
	const char *timing[] = { "--interval-ms", "100", "--lease-ms", "1000",
		"--expiry-intervals", "5", NULL };
	char tag[16];
	snprintf(tag, sizeof tag, "fo%u", r);
	for (int i = 0; i < NMEM; i++)
		start_member(&f->c, i, f->cfg, tag, timing);
}

/* NAG agents with every key resolved, each registered with every member
 * (at most 10 s). */
static void
fo_start_agents(fo_round *f)
{
	for (int i = 0; i < NAG; i++) {
		char id[8];
		snprintf(id, sizeof id, "r%d", i);
		f->as[i] = mkagent(f->cfg, f->c.list, id);
		for (int k = 0; k < NFKEYS; k++)
			if (allot_key_resolve(f->as[i], f->keys[k], "/x",
			        &f->kh[i][k]) != ALLOT_OK)
				bench_fail(
				    "key %s does not resolve", f->keys[k]);
	}
	uint64_t t0 = bench_now_ns();
	for (;;) {
		int ready = 0;
		for (int i = 0; i < NAG; i++) {
			allot_sync_stats ss;
			allot_sync_stats_get(f->as[i], &ss);
			ready += ss.members == NMEM && ss.registers >= NMEM &&
			    ss.connected;
		}
		if (ready == NAG)
			break;
		if (bench_now_ns() - t0 > 10000000000ull)
			bench_fail("agents did not register with the "
			           "cluster (see %s)",
			    dir);
		usleep(10000);
	}
}

/* Every agent's requests on every key due by `due` since the start (a
 * stall catches up at most 20), admissions logged from `steady` on. */
static void
fo_offer(fo_round *f, uint64_t due)
{
	for (int i = 0; i < NAG; i++)
		for (int k = 0; k < NFKEYS; k++) {
			uint64_t *issued = &f->issued[i][k];
			admits *ad = &f->ad[k];
			if (due > *issued + 20)
				*issued = due - 20;
			for (; *issued < due; (*issued)++) {
				allot_decision d;
				uint64_t t = bench_now_ns();
				allot_acquire(f->as[i], f->kh[i][k], 1, &d);
				f->offered++;
				if (!d.allowed || t < f->steady)
					continue;
				if (ad->n == ad->cap)
					bench_fail("admission log "
					           "full");
				ad->ts[ad->n++] = t;
			}
		}
}

static void
fo_kill_victim(fo_round *f)
{
	pid_t pid = f->c.pid[f->victim];
	kill(pid, SIGKILL);
	f->killed = bench_now_ns();
	if (waitpid(pid, NULL, 0) != pid)
		bench_fail("waitpid: %s", strerror(errno));
	f->c.pid[f->victim] = 0;
}

/* The load: every agent offers OFFERED tokens/s on every key, paced
 * against the clock, through the warm-up, the steady period, the kill
 * of the victim and AFTER_MS after it, watching for the agents to be
 * served by the new owners. */
static void
fo_run_load(fo_round *f)
{
	size_t cap = (size_t) (2.0 * RATE * (STEADY_MS + AFTER_MS + 2000) /
	                 1000.0) +
	    1000;
	for (int k = 0; k < NFKEYS; k++) {
		f->ad[k].n = 0;
		f->ad[k].cap = cap;
		f->ad[k].ts = malloc(cap * sizeof *f->ad[k].ts);
		if (f->ad[k].ts == NULL)
			bench_fail("out of memory");
	}
	f->start = bench_now_ns();
	f->steady = f->start + WARM_MS * 1000000ull;
	f->kill_at = f->steady + STEADY_MS * 1000000ull;
	f->end = f->kill_at + AFTER_MS * 1000000ull;
	uint64_t loops = 0, last_poll = 0;
	for (uint64_t now = f->start; now < f->end; now = bench_now_ns()) {
		if (++loops > 10000000)
			bench_fail("failover load: too many iterations");
		fo_offer(
		    f, (uint64_t) (OFFERED * (double) (now - f->start) / 1e9));
		if (f->killed == 0 && now >= f->kill_at)
			fo_kill_victim(f);
		if (f->killed != 0 && f->w.served_at == 0 &&
		    now - last_poll >= 2000000) {
			last_poll = now;
			poll_served(f->as, &f->w, bench_now_ns());
		}
		usleep(1000);
	}
}

/* The round's figures from the admission logs (which it frees), after
 * checking that every agent saw the kill and that the limiter bound. */
static void
fo_figures(const bench_opts *o, unsigned r, fo_round *f, failover *ret)
{
	for (int i = 0; i < NAG; i++) {
		allot_sync_stats ss;
		allot_sync_stats_get(f->as[i], &ss);
		if (ss.members_down != 1)
			bench_fail("agent r%d sees %u members down after "
			           "the kill, not 1",
			    i, ss.members_down);
	}
	/* The limiter must have bound: at least half of R per key over
	 * the steady period, else the agents were not syncing. */
	double steady_over = -INFINITY, fo_over = -INFINITY;
	double after_over = -INFINITY; /* from the kill on: progress only */
	uint64_t killed = f->killed, from = killed - 1000000000ull;
	for (int k = 0; k < NFKEYS; k++) {
		admits *ad = &f->ad[k];
		size_t n_steady = 0;
		while (n_steady < ad->n && ad->ts[n_steady] < killed)
			n_steady++;
		double got = (double) n_steady / (STEADY_MS / 1000.0);
		if (got < 0.5 * RATE || got > 1.5 * RATE + BURST)
			bench_fail("key %s admitted %.0f/s in steady state, "
			           "R = %.0f: not the limiter's rate",
			    f->keys[k], got, RATE);
		steady_over = fmax(
		    steady_over, over_of(ad, f->steady, killed));
		fo_over = fmax(fo_over, over_of(ad, from, f->end));
		after_over = fmax(after_over, over_of(ad, killed, f->end));
		free(ad->ts);
	}
	ret->steady_over = steady_over;
	ret->failover_over = fo_over;
	ret->served_ms = f->w.served_at ?
	    (double) (f->w.served_at - killed) / 1e6 :
	    NAN;
	ret->detected_ms = f->w.down_at ?
	    (double) (f->w.down_at - killed) / 1e6 :
	    NAN;
	bench_progress(o,
	    "round %u: killed m%d (owned %d of %d keys): down after %.0f ms, "
	    "served by the new owners after %.0f ms; "
	    "over-admission %.2f steady, %.2f "
	    "failover, %.2f after the kill alone (R·T); %llu requests "
	    "offered",
	    r, f->victim + 1, f->owned[f->victim], NFKEYS, ret->detected_ms,
	    ret->served_ms, steady_over, fo_over, after_over,
	    (unsigned long long) f->offered);
}

static void
measure_failover_round(const bench_opts *o, unsigned r, failover *ret)
{
	fo_round f;
	memset(&f, 0, sizeof f);
	fo_start_cluster(&f, r);
	fo_start_agents(&f);
	fo_run_load(&f);
	fo_figures(o, r, &f, ret);
	for (int i = 0; i < NAG; i++)
		allot_agent_destroy(f.as[i]);
	stop_members(&f.c);
}

static void
measure_failover(const bench_opts *o, failover *ret)
{
	double served[BENCH_MAX_ROUNDS], detected[BENCH_MAX_ROUNDS];
	unsigned n_served = 0, n_detected = 0;
	ret->steady_over = -INFINITY;
	ret->failover_over = -INFINITY;
	for (unsigned r = 0; r < o->rounds; r++) {
		failover f;
		measure_failover_round(o, r, &f);
		ret->steady_over = fmax(ret->steady_over, f.steady_over);
		ret->failover_over = fmax(ret->failover_over, f.failover_over);
		if (!isnan(f.served_ms))
			served[n_served++] = f.served_ms;
		if (!isnan(f.detected_ms))
			detected[n_detected++] = f.detected_ms;
	}
	/* A round not served within AFTER_MS makes the figure null. */
	ret->served_ms = n_served == o->rounds ?
	    bench_median(served, n_served) :
	    NAN;
	ret->detected_ms = n_detected == o->rounds ?
	    bench_median(detected, n_detected) :
	    NAN;
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
	failover fo = { NAN, NAN, NAN, NAN };
	if (bench_selected(&o, "key_reports_per_s"))
		measure_throughput(&o, &tp);
	if (bench_selected(&o, "failover"))
		measure_failover(&o, &fo);
	bench_cpu_mark(&cpu1);
	double noise = bench_cpu_others_pct(&cpu0, &cpu1);
	proto_rmdir(dir);

	bench_figure f[] = {
		{ "cluster.key_reports_per_s", "/s", 0,
		    "key reports acknowledged by 3 members together",
		    BENCH_NO_TARGET, 0, tp.cluster },
		{ "cluster.key_reports_per_s_single", "/s", 0,
		    "the same clients against one allotd, same rounds",
		    BENCH_NO_TARGET, 0, tp.single },
		{ "cluster.scale_ratio", "x", 2,
		    "3 members / 1 (2 cores: says little about scale-out)",
		    BENCH_NO_TARGET, 0, tp.ratio },
		{ "cluster.steady_over", "R·T", 2,
		    "over-admission before the kill, max over keys",
		    BENCH_AT_MOST, 1.0, fo.steady_over },
		{ "cluster.failover_over", "R·T", 2,
		    "over-admission from 1 s before the kill, max over keys",
		    BENCH_AT_MOST, 1.0, fo.failover_over },
		{ "cluster.failover_served_ms", "ms", 0,
		    "kill until every agent: 1 member down, 0 unconfirmed",
		    BENCH_AT_MOST, 3 * T_MS, fo.served_ms },
		{ "cluster.failover_detected_ms", "ms", 0,
		    "kill until every agent sees 1 member down",
		    BENCH_NO_TARGET, 0, fo.detected_ms },
		{ "cluster.noise_cpu_pct", "%", 1,
		    "CPU used by other processes during the run",
		    BENCH_NO_TARGET, 0, noise },
	};
	char header[200];
	snprintf(header, sizeof header,
	    "cluster: 3 allotd members on loopback; %d sessions x %d keys; "
	    "failover: %d agents x %d keys, 2 R offered, T = %d ms",
	    NTHREADS * SESSIONS_PER_THREAD, NKEYS, NAG, NFKEYS, T_MS);
	bench_report(&o, header, f, sizeof f / sizeof f[0]);
	return 0;
}
