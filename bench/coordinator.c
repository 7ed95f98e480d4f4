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
 *   coordinator.agent_growth_after_1m_bytes  heap growth of an agent with
 *                                   a 100,000-slot pool fed 900,000 more
 *                                   distinct identities once full
 *
 * The clients speak the protocol directly (protobuf-c over nng req0) so
 * the load is the coordinator's alone; the agent figures come from the
 * real sync engine (agent/sync_core.c) in-process. allotd is the release
 * build next to this benchmark; its database lives in a temporary
 * directory removed at the end.
 */
#include <errno.h>
#include <math.h>
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

#include "allot.pb-c.h"
#include "bench.h"
#include "memory.h"
#include "sync_int.h"

#define NKEYS 50
#define NTHREADS 8
#define SESSIONS_PER_THREAD 4

static char dir[64];
static char url[64];
static const char *keys[NKEYS + 1];
static char keybuf[NKEYS][64];
static _Atomic uint64_t acked_reports;
static _Atomic int stop_flag;
static _Atomic int measuring;
static _Atomic uint64_t errors;

static int
free_port(void)
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

static void
write_config(const char *path)
{
	bench_buf b = { 0 };
	bench_buf_printf(&b,
	    "quotas:\n  default: {tokens_per_second: 10, "
	    "burst: 20}\n  callers:\n");
	for (int i = 0; i < NKEYS; i++)
		bench_buf_printf(&b,
		    "    - {identity: \"spiffe://bench/c%02d\", "
		    "tokens_per_second: 1000000, burst: 2000000}\n",
		    i);
	FILE *f = fopen(path, "w");
	if (f == NULL || fputs(b.p, f) < 0 || fclose(f) != 0)
		bench_fail("cannot write %s", path);
	bench_buf_free(&b);
}

static pid_t
start_allotd(const char *bin, const char *cfg, const char *db)
{
	pid_t pid = fork();
	if (pid < 0)
		bench_fail("fork: %s", strerror(errno));
	if (pid == 0) {
		char log[128];
		snprintf(log, sizeof log, "%s/allotd.log", dir);
		if (freopen(log, "w", stderr) == NULL ||
		    freopen("/dev/null", "w", stdout) == NULL)
			_exit(127);
		execl(bin, bin, "--config", cfg, "--db", db, "--listen", url,
		    "--http", "off", "--interval-ms", "1000",
		    "--expiry-intervals", "30", "--log-level", "warning",
		    /* every session syncs flat out from one address */
		    "--peer-message-rate", "0", (char *) NULL);
		_exit(127);
	}
	return pid;
}

static Allot__V1__Envelope *
exchange(nng_socket s, Allot__V1__Envelope *env)
{
	size_t len = allot__v1__envelope__get_packed_size(env);
	uint8_t *buf = malloc(len);
	allot__v1__envelope__pack(env, buf);
	int rv = nng_send(s, buf, len, 0);
	free(buf);
	if (rv != 0)
		return NULL;
	void *in;
	size_t inlen;
	if (nng_recv(s, &in, &inlen, NNG_FLAG_ALLOC) != 0)
		return NULL;
	Allot__V1__Envelope *r = allot__v1__envelope__unpack(NULL, inlen, in);
	nng_free(in, inlen);
	return r;
}

typedef struct session {
	nng_socket s;
	uint64_t id;
	uint64_t seq;
} session;

static int
join(session *ss, int n)
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
	char id[32];
	snprintf(id, sizeof id, "bench-%d", n);
	Allot__V1__Register reg = ALLOT__V1__REGISTER__INIT;
	reg.replica_id = id;
	reg.service = (char *) "bench";
	reg.host = (char *) "localhost";
	reg.pid = (uint32_t) getpid();
	reg.agent_version = (char *) "bench";
	reg.n_keys = NKEYS;
	reg.keys = (char **) keys;
	reg.sync_interval_ms = 1000;
	Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
	env.version = 1;
	env.body_case = ALLOT__V1__ENVELOPE__BODY_REGISTER;
	env.register_ = &reg;
	Allot__V1__Envelope *r = exchange(ss->s, &env);
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

static void *
client(void *arg)
{
	int t = (int) (intptr_t) arg;
	session ss[SESSIONS_PER_THREAD];
	for (int i = 0; i < SESSIONS_PER_THREAD; i++)
		if (join(&ss[i], t * SESSIONS_PER_THREAD + i) != 0)
			bench_fail("session %d could not register with allotd "
			           "(see %s/allotd.log)",
			    t * SESSIONS_PER_THREAD + i, dir);
	Allot__V1__KeyReport reps[NKEYS];
	Allot__V1__KeyReport *ptrs[NKEYS];
	for (int k = 0; k < NKEYS; k++) {
		allot__v1__key_report__init(&reps[k]);
		reps[k].key = (uint32_t) k;
		reps[k].consumed = 5;
		reps[k].denied = 0;
		reps[k].held = 1000;
		reps[k].demand = 50;
		ptrs[k] = &reps[k];
	}
	uint64_t n = 0;
	while (!atomic_load(&stop_flag)) {
		for (int i = 0; i < SESSIONS_PER_THREAD; i++) {
			Allot__V1__Sync sy = ALLOT__V1__SYNC__INIT;
			sy.session = ss[i].id;
			sy.seq = ++ss[i].seq;
			sy.elapsed_ms = 100;
			sy.n_reports = NKEYS;
			sy.reports = ptrs;
			Allot__V1__Envelope env = ALLOT__V1__ENVELOPE__INIT;
			env.version = 1;
			env.body_case = ALLOT__V1__ENVELOPE__BODY_SYNC;
			env.sync = &sy;
			Allot__V1__Envelope *r = exchange(ss[i].s, &env);
			if (r != NULL &&
			    r->body_case == ALLOT__V1__ENVELOPE__BODY_REPLY) {
				if (atomic_load_explicit(
				        &measuring, memory_order_relaxed))
					n += NKEYS -
					    r->reply->rejected_reports;
			} else
				atomic_fetch_add(&errors, 1);
			if (r != NULL)
				allot__v1__envelope__free_unpacked(r, NULL);
		}
	}
	atomic_fetch_add(&acked_reports, n);
	for (int i = 0; i < SESSIONS_PER_THREAD; i++)
		nng_close(ss[i].s);
	return NULL;
}

/* Key reports per second through a real allotd, median of rounds. */
static double
measure_throughput(const bench_opts *o, const char *bin)
{
	char cfg[128], db[128];
	snprintf(cfg, sizeof cfg, "%s/quotas.yaml", dir);
	write_config(cfg);
	double v[BENCH_MAX_ROUNDS];
	for (unsigned r = 0; r < o->rounds; r++) {
		snprintf(db, sizeof db, "%s/allot-%u.db", dir, r);
		snprintf(url, sizeof url, "tcp://127.0.0.1:%d", free_port());
		pid_t pid = start_allotd(bin, cfg, db);
		atomic_store(&stop_flag, 0);
		atomic_store(&acked_reports, 0);
		pthread_t th[NTHREADS];
		for (int i = 0; i < NTHREADS; i++)
			pthread_create(
			    &th[i], NULL, client, (void *) (intptr_t) i);
		/* Let every session register, then measure 3 s. */
		usleep(500000);
		atomic_store(&measuring, 1);
		uint64_t t0 = bench_now_ns();
		usleep(3000000);
		atomic_store(&measuring, 0);
		uint64_t t1 = bench_now_ns();
		atomic_store(&stop_flag, 1);
		for (int i = 0; i < NTHREADS; i++)
			pthread_join(th[i], NULL);
		v[r] = (double) atomic_load(&acked_reports) /
		    ((double) (t1 - t0) / 1e9);
		kill(pid, SIGTERM);
		int st;
		waitpid(pid, &st, 0);
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
			bench_fail("allotd did not drain cleanly (see "
			           "%s/allotd.log)",
			    dir);
		bench_progress(o, "round %u: %.0f key reports/s", r, v[r]);
	}
	if (atomic_load(&errors) > 0)
		bench_fail("%llu exchanges failed",
		    (unsigned long long) atomic_load(&errors));
	return bench_median(v, o->rounds);
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
	char err[256];
	allot_config *cfg;
	if (allot_config_load(cfgpath, err, sizeof err, &cfg) != ALLOT_OK)
		bench_fail("config: %s", err);
	allot_agent_options opts;
	allot_agent_options_init(&opts);
	opts.clock = vclock;
	allot_agent *a;
	if (allot_agent_create(cfg, &opts, &a) != ALLOT_OK)
		bench_fail("agent_create");
	allot_config_free(cfg);
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
			env.version = 1;
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
	snprintf(dir, sizeof dir, "/tmp/allot-bench-XXXXXX");
	if (mkdtemp(dir) == NULL)
		bench_fail("mkdtemp: %s", strerror(errno));
	for (int k = 0; k < NKEYS; k++) {
		snprintf(
		    keybuf[k], sizeof keybuf[k], "spiffe://bench/c%02d", k);
		keys[k] = keybuf[k];
	}
	keys[NKEYS] = NULL;
	/* allotd from the same build tree as this benchmark. */
	char self[512], bin[600];
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	if (n <= 0)
		bench_fail("readlink /proc/self/exe");
	self[n] = '\0';
	char *slash = strrchr(self, '/');
	*slash = '\0';
	snprintf(bin, sizeof bin, "%s/../coordinator/allotd", self);
	if (access(bin, X_OK) != 0)
		bench_fail("no allotd at %s", bin);

	double bytes, us;
	if (o.rounds > 3)
		o.rounds = 3;
	/* First: mallinfo2 figures want no other thread allocating. */
	bench_memory_figures mem;
	bench_memory(&o, &mem);
	measure_agent(&o, &bytes, &us);
	double kr = measure_throughput(&o, bin);
	char cmd[96];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	if (system(cmd) != 0)
		bench_progress(&o, "could not remove %s", dir);

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
		{ "coordinator.agent_pool_100k_bytes", "B", 0,
		    "agent heap, 100,000-slot pool full", BENCH_NO_TARGET, 0,
		    mem.agent_pool_bytes },
		{ "coordinator.agent_growth_after_1m_bytes", "B", 0,
		    "agent heap growth, 900,000 more identities once full",
		    BENCH_AT_MOST, 0, mem.agent_growth_bytes },
	};
	char header[160];
	snprintf(header, sizeof header,
	    "coordinator: %d sessions x %d keys over loopback TCP, durable "
	    "SQLite store",
	    NTHREADS * SESSIONS_PER_THREAD, NKEYS);
	bench_report(&o, header, f, sizeof f / sizeof f[0]);
	return 0;
}
