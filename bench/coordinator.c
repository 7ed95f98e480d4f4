/* SPDX-License-Identifier: MIT */
/*
 * Suite `coordinator`: how much a real allotd (durable SQLite store on)
 * can take, and what syncing costs an agent. Figures:
 *
 *   coordinator.key_reports_per_s   key reports acknowledged per second by
 *                                   one allotd, many sessions with 50
 *                                   active keys each, over loopback TCP
 *   coordinator.bytes_per_key_report  Sync bytes on the wire per key
 *                                   report, as the real agent encodes it
 *   coordinator.agent_sync_us       the agent's own work per interval
 *                                   with 50 active keys: build the Sync
 *                                   and apply a Reply carrying 50 shares
 *   coordinator.bytes_per_key       registry memory per interned key of
 *                                   a session (bench/memory.c)
 *   coordinator.bytes_per_replica   registry memory per session, keys
 *                                   aside
 *   coordinator.agent_bytes_per_identity  liballot memory per slot of
 *                                   the unknown-identity pool, with one
 *                                   deciding thread
 *   coordinator.agent_bytes_per_value  the same with a bucket per value
 *                                   (shared: false on the default)
 *   coordinator.agent_growth_after_1m_bytes  heap growth of an agent with
 *                                   a 100,000-slot pool fed 900,000 more
 *                                   distinct identities once full
 *   coordinator.diff_59k_s, apply_59k_s  allotctl's diff and apply of a
 *                                   59,001-quota file over a 9,001-quota
 *                                   one, through the admin socket (issue
 *                                   27: 23 s and 59 s, allotd at 750 MB)
 *   coordinator.apply_59k_peak_mb   allotd's peak resident memory then
 *   coordinator.diff_59k_x16_peak_mb  ... after 16 such diffs at once
 *                                   (issue 27: 3.2 GB)
 *
 * The clients speak the protocol directly (protobuf-c over nng req0) so
 * the load is the coordinator's alone; the agent figures come from the
 * real sync engine (agent/sync_core.c) in-process. allotd is the release
 * build next to this benchmark; its database lives in a temporary
 * directory removed at the end.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "allot.pb-c.h"
#include "allotd.h"
#include "bench.h"
#include "memory.h"
#include "proc.h"
#include "proto.h"
#include "protocol.h"
#include "sync_int.h"

#define NKEYS 50
#define NTHREADS 8
#define SESSIONS_PER_THREAD 4

static char dir[64];
static const char *keys[NKEYS + 1];
static char keybuf[NKEYS][PROTO_KEY_MAX];

static void
write_config(const char *path)
{
	char *text = proto_quotas(keys, NKEYS, 1000000, 2000000, NULL);
	pc_write_file(path, text);
	free(text);
}

/* Key reports per second through a real allotd, median of rounds. */
static double
measure_throughput(const bench_opts *o)
{
	char *quotas = proto_quotas(keys, NKEYS, 1000000, 2000000, NULL);
	char prefix[96];
	snprintf(prefix, sizeof prefix, "%s/allotd", dir);
	double v[BENCH_MAX_ROUNDS];
	for (unsigned r = 0; r < o->rounds; r++) {
		pc_coord c;
		proto_allotd_start(&c, prefix, quotas);
		proto_load l = { .members = 1,
			.urls = { c.url },
			.keys = keys,
			.nkeys = NKEYS,
			.threads = NTHREADS,
			.replicas_per_thread = SESSIONS_PER_THREAD,
			.where = c.log };
		proto_result res;
		proto_load_run(&l, 500, 3000, &res);
		v[r] = res.key_reports_per_s;
		proto_allotd_stop(&c);
		bench_progress(o, "round %u: %.0f key reports/s", r, v[r]);
	}
	free(quotas);
	return bench_median(v, o->rounds);
}

/* ---- a large apply (issue 27) ---- */

/* The peak resident memory of process `pid`, in MB. */
static double
peak_mb(pid_t pid)
{
	char cmd[96];
	snprintf(cmd, sizeof cmd, "awk '/VmHWM/ {print $2}' /proc/%d/status",
	    (int) pid);
	char *out = pc_shell(cmd);
	double kb = out != NULL ? atof(out) : NAN;
	free(out);
	return kb / 1024;
}

/* Sixteen diffs of `file` at once on the admin socket `sock` (its
 * connection limit), each answered. */
static void
diff_sixteen(const char *sock, const char *file)
{
	char cmd[1024];
	snprintf(cmd, sizeof cmd,
	    "n=0; for i in $(seq 16); do curl -s -m 300 --unix-socket %s "
	    "-X POST --data-binary @%s 'http://allotd/config/diff?file=x' "
	    "-o /dev/null -w '%%{http_code}\\n' & done | grep -c '^200$'",
	    sock, file);
	char *out = pc_shell(cmd);
	if (out == NULL || strcmp(out, "16") != 0)
		bench_fail("16 diffs at once: %s answered 200",
		    out != NULL ? out : "none");
	free(out);
}

static void
measure_apply(double *ret_diff_s, double *ret_apply_s, double *ret_mb,
    double *ret_x16_mb)
{
	char *small = proto_many_quotas(9001, 50),
	     *big = proto_many_quotas(59001, 60);
	char prefix[96], file[128];
	snprintf(prefix, sizeof prefix, "%s/apply", dir);
	snprintf(file, sizeof file, "%s/quotas-59k.yaml", dir);
	pc_write_file(file, big);
	pc_coord c;
	pc_coord_init(&c, prefix, small);
	const char *args[] = { "--admin-socket", c.sock, NULL };
	pc_coord_spawn(&c, args, NULL);
	*ret_diff_s = proto_admin_post(
	    c.sock, file, "/config/diff?file=q59k.yaml");
	*ret_apply_s = proto_admin_post(
	    c.sock, file, "/config/apply?file=q59k.yaml&reason=bench");
	*ret_mb = peak_mb(c.pid);
	diff_sixteen(c.sock, file);
	*ret_x16_mb = peak_mb(c.pid);
	proto_allotd_stop(&c);
	free(small);
	free(big);
}

/* ---- the agent's side, with the real sync engine ---- */

static uint64_t vnow = 1000000000ull;

static uint64_t
vclock(void *ctx)
{
	(void) ctx;
	return vnow;
}

static void
measure_agent(const bench_opts *o, double *ret_bytes, double *ret_us)
{
	char cfgpath[128];
	snprintf(cfgpath, sizeof cfgpath, "%s/quotas.yaml", dir);
	write_config(cfgpath);
	allot_agent_options opts;
	allot_agent_options_init(&opts);
	opts.clock = vclock;
	allot_agent *a = proto_agent(cfgpath, &opts);
	allot__syncc c;
	allot__syncc_init(&c, a, 42);
	c.session = 7; /* as after a Welcome */

	/* The Reply the coordinator would send: 50 changed shares. */
	Allot__V1__Share sh[NKEYS], *shp[NKEYS];
	for (int k = 0; k < NKEYS; k++) {
		allot__v1__share__init(&sh[k]);
		sh[k].key = (uint32_t) k;
		shp[k] = &sh[k];
	}
	allot_key *keyh[NKEYS];
	for (int k = 0; k < NKEYS; k++)
		allot_key_resolve(a, keys[k], "/x", &keyh[k]);

	double bytes = 0, us[BENCH_MAX_ROUNDS];
	const int intervals = 2000;
	for (unsigned r = 0; r < o->rounds; r++) {
		uint64_t total_ns = 0;
		for (int i = 0; i < intervals; i++) {
			allot_decision d;
			for (int k = 0; k < NKEYS; k++)
				allot_acquire(
				    a, keyh[k], 1 + (uint32_t) (i % 7), &d);
			vnow += 100000000ull;
			for (int k = 0; k < NKEYS; k++) {
				sh[k].rate = 1000.0 + (i % 3);
				sh[k].burst = 2000.0;
			}
			Allot__V1__Reply rep = ALLOT__V1__REPLY__INIT;
			Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
			env.version = ALLOT__PROTOCOL_VERSION;
			env.body_case = ALLOT__V1__ENVELOPE__BODY_REPLY;
			env.reply = &rep;
			rep.replicas = 8;
			rep.lease_ms = 3000;
			rep.n_shares = NKEYS;
			rep.shares = shp;
			uint64_t t0 = bench_now_ns();
			void *buf;
			size_t len;
			if (allot__syncc_request(&c, vnow, &buf, &len) !=
			    ALLOT_OK)
				bench_fail("syncc_request");
			/* Encoding the Reply is the coordinator's work but
			 * small; it stays inside the timed span. */
			rep.seq = c.seq;
			/* As allotd, which confirms a Usage record once the
			 * commit after it ran (about a second): all but the
			 * newest closed one. Unconfirmed, every record would
			 * be sent again in every Sync. */
			rep.durable = c.acct.next_id > 2 ? c.acct.next_id - 2 :
			                                   0;
			size_t rlen = allot__v1__envelope__get_packed_size(
			    &env);
			uint8_t *rbuf = malloc(rlen);
			allot__v1__envelope__pack(&env, rbuf);
			if (!allot__syncc_reply(&c, vnow, rbuf, rlen))
				bench_fail("syncc_reply refused the reply");
			total_ns += bench_now_ns() - t0;
			if (c.sent_reports != NKEYS)
				bench_fail("sync reported %u keys, not %d",
				    c.sent_reports, NKEYS);
			bytes = (double) len / NKEYS;
			free(buf);
			free(rbuf);
		}
		us[r] = (double) total_ns / intervals / 1000.0;
	}
	allot__syncc_fini(&c);
	allot_agent_destroy(a);
	*ret_bytes = bytes;
	*ret_us = bench_median(us, o->rounds);
}

int
main(int argc, char **argv)
{
	bench_opts o;
	bench_parse_args(argc, argv, "coordinator", 0, &o);
	pc_mkdtemp(dir, sizeof dir, "/tmp/allot-bench");
	proto_spiffe_keys(keybuf, keys, NKEYS);
	keys[NKEYS] = NULL;

	double bytes, us;
	if (o.rounds > 3)
		o.rounds = 3;
	/* First: mallinfo2 figures want no other thread allocating. */
	bench_memory_figures mem;
	bench_memory(&o, &mem);
	measure_agent(&o, &bytes, &us);
	double kr = measure_throughput(&o);
	double diff_s, apply_s, apply_mb, x16_mb;
	measure_apply(&diff_s, &apply_s, &apply_mb, &x16_mb);
	pc_rm_rf(dir);

	bench_figure f[] = {
		{ "coordinator.key_reports_per_s", "/s", 0,
		    "key reports acknowledged by one allotd (store on)",
		    BENCH_AT_LEAST, 200000, kr },
		{ "coordinator.bytes_per_key_report", "B", 1,
		    "Sync bytes per key report (agent encoding)",
		    BENCH_AT_MOST, 24, bytes },
		{ "coordinator.agent_sync_us", "us", 1,
		    "agent work per interval, 50 keys: Sync + Reply",
		    BENCH_NO_TARGET, 0, us },
		{ "coordinator.bytes_per_key", "B", 0,
		    "registry bytes per interned key of a session",
		    BENCH_NO_TARGET, 0, mem.coord_bytes_per_key },
		{ "coordinator.bytes_per_replica", "B", 0,
		    "registry bytes per session, keys aside", BENCH_NO_TARGET,
		    0, mem.coord_bytes_per_replica },
		{ "coordinator.agent_bytes_per_identity", "B", 0,
		    "agent bytes per unknown-identity slot, 1 thread",
		    BENCH_NO_TARGET, 0, mem.agent_bytes_per_identity },
		{ "coordinator.agent_bytes_per_value", "B", 0,
		    "the same with a bucket per value (shared: false)",
		    BENCH_NO_TARGET, 0, mem.agent_bytes_per_value },
		{ "coordinator.agent_pool_100k_bytes", "B", 0,
		    "agent heap, 100,000-slot pool full", BENCH_NO_TARGET, 0,
		    mem.agent_pool_bytes },
		{ "coordinator.agent_growth_after_1m_bytes", "B", 0,
		    "agent heap growth, 900,000 more identities once full",
		    BENCH_AT_MOST, 0, mem.agent_growth_bytes },
		{ "coordinator.diff_59k_s", "s", 2,
		    "admin diff, 59,001 quotas against 9,001", BENCH_NO_TARGET,
		    0, diff_s },
		{ "coordinator.apply_59k_s", "s", 2,
		    "admin apply, 59,001 quotas over 9,001 (issue 27: 2 s)",
		    BENCH_AT_MOST, 2, apply_s },
		{ "coordinator.apply_59k_peak_mb", "MB", 0,
		    "allotd's peak resident memory through that apply",
		    BENCH_NO_TARGET, 0, apply_mb },
		{ "coordinator.diff_59k_x16_peak_mb", "MB", 0,
		    "the same after 16 of those diffs at once (issue 27: 3.2 "
		    "GB; at most 2 parse at once)",
		    BENCH_NO_TARGET, 0, x16_mb },
	};
	char header[160];
	snprintf(header, sizeof header,
	    "coordinator: %d sessions x %d keys over loopback TCP, durable "
	    "SQLite store",
	    NTHREADS * SESSIONS_PER_THREAD, NKEYS);
	bench_report(&o, header, f, sizeof f / sizeof f[0]);
	return 0;
}
