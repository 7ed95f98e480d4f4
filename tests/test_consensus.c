/* SPDX-License-Identifier: MIT */
/*
 * The consensus core (coordinator/consensus*.c) under test.
 *
 * Most cases run libraft's raft_fixture: several members in one process
 * on in-memory I/O and one virtual clock, stepped one event at a time,
 * deterministic. Each member runs the REAL state machine (consensus_fsm.c)
 * and the REAL node logic with its lease predicate (consensus_node.c), the
 * same code allotd runs on raft_uv. After every fixture step every node
 * ticks and the invariants are checked:
 * - at most one member may grant (allot__cnode_may_grant at the
 *   fixture's time), counting killed and cut-off members too;
 * - each member's epoch never goes down, and a client that follows
 *   whoever grants never sees the epoch go down; a granting member's
 *   epoch is its own term;
 * - no member applies an index twice or one usage batch twice.
 * After healing, every member in the configuration has a byte-identical
 * snapshot, and its usage totals equal the sum of the batches committed
 * (the union of what members applied), which includes every batch whose
 * proposal was acknowledged.
 *
 * The entries and the state machine alone are in consensus_state.c, the
 * raft_uv case (three members over loopback TCP) in consensus_uv.c.
 */
#include <check.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>
#include <time.h>

#include <raft.h>
#include <raft/fixture.h>
#include <sanitizer/asan_interface.h>

#include "consensus/consensus.h"
#include "consensus/consensus_entry.h"
#include "consensus/consensus_fsm.h"
#include "consensus/consensus_node.h"
#include "consensus_cases.h"
#include "runner.h"

#include <allot/allot.h>

/* ---- libraft's heap while a fixture cluster lives ---- */

/* raft_fixture's in-memory I/O keeps every entry a member ever stored in
 * one array, grown by one raft_realloc per append. glibc grows a large
 * block in place; AddressSanitizer's realloc always moves it, so a case
 * of many thousand entries copied its logs over and over (minutes under
 * ASan). This heap gives a realloc'd block twice what it asks for and
 * hands the same block back while it fits; the room not asked for is
 * poisoned, so ASan still catches an access past what was asked. */
typedef struct heap_block {
	size_t cap; /* bytes after the header */
	size_t pad; /* keeps the payload 16-byte aligned */
} heap_block;

static void *
heap_fit(heap_block *b, size_t cap, size_t size)
{
	if (b == NULL)
		return NULL;
	b->cap = cap;
	ASAN_UNPOISON_MEMORY_REGION(b + 1, size);
	ASAN_POISON_MEMORY_REGION((char *) (b + 1) + size, cap - size);
	return b + 1;
}

static heap_block *
heap_of(void *p)
{
	heap_block *b = (heap_block *) p - 1;

	ASAN_UNPOISON_MEMORY_REGION(b + 1, b->cap);
	return b;
}

static void *
heap_malloc(void *data, size_t size)
{
	(void) data;
	return heap_fit(malloc(sizeof(heap_block) + size), size, size);
}

static void *
heap_calloc(void *data, size_t n, size_t size)
{
	(void) data;
	if (size != 0 && n > (SIZE_MAX - sizeof(heap_block)) / size)
		return NULL;
	return heap_fit(
	    calloc(1, sizeof(heap_block) + n * size), n * size, n * size);
}

static void *
heap_realloc(void *data, void *p, size_t size)
{
	heap_block *b;
	size_t cap;

	if (p == NULL)
		return heap_malloc(data, size);
	b = heap_of(p);
	if (size <= b->cap)
		return heap_fit(b, b->cap, size);
	cap = size < 2 * b->cap ? 2 * b->cap : size;
	/* On failure the old block stays as it was, as realloc leaves it
	 * (its spare room no longer poisoned). */
	return heap_fit(realloc(b, sizeof(heap_block) + cap), cap, size);
}

static void
heap_free(void *data, void *p)
{
	(void) data;
	if (p != NULL)
		free(heap_of(p));
}

static void *
heap_aligned_alloc(void *data, size_t alignment, size_t size)
{
	(void) data;
	return aligned_alloc(alignment, size);
}

static void
heap_aligned_free(void *data, size_t alignment, void *p)
{
	(void) data;
	(void) alignment;
	free(p);
}

static struct raft_heap fixture_heap = {
	.malloc = heap_malloc,
	.free = heap_free,
	.calloc = heap_calloc,
	.realloc = heap_realloc,
	.aligned_alloc = heap_aligned_alloc,
	.aligned_free = heap_aligned_free,
};

/* ---- the fixture cluster ---- */

/* The invariants are checked after every fixture step, hundreds of
 * thousands of times in a case: with INVARIANT (runner.h), not
 * ck_assert. */

#define MAXS RAFT_FIXTURE_MAX_SERVERS
#define MAXB 8192 /* usage batches one case may propose */
#define NKEYS 7

typedef struct batch {
	bool proposed;
	bool acked;
} batch;

typedef struct cluster cluster;

typedef struct member_ctx {
	cluster *c;
	unsigned i;
	double rate; /* its clock's rate against the fixture's */
} member_ctx;

struct cluster {
	struct raft_fixture f;
	unsigned n;
	allot__cfsm fsm[MAXS];
	allot__cnode node[MAXS];
	member_ctx ctx[MAXS];
	/* Invariant bookkeeping. */
	uint64_t last_epoch[MAXS];
	uint64_t last_index[MAXS];
	uint8_t seen[MAXS][MAXB]; /* times member i applied batch b */
	uint64_t client_epoch;
	/* Each leadership's grant window in fixture (real) time: from the
	 * first step its lease was published to the end of that lease,
	 * whether or not the member ever noticed it lost. */
	struct {
		unsigned member;
		uint64_t term;
		double from, until;
	} win[512];
	unsigned nwin;
	unsigned granter; /* index of the last member that granted, +1 */
	unsigned handovers; /* times the granting member changed */
	uint64_t grant_ms; /* fixture time some member could grant */
	uint64_t last_step_time;
	/* The usage driver. */
	bool driving;
	uint64_t next_propose;
	unsigned nbatches;
	batch batches[MAXB];
	uint32_t lease_ms; /* 0: the default (the election timeout) */
	uint32_t renew_ms; /* 0: the default (a quarter lease) */
	uint64_t rng;
};

static uint64_t
rnd(cluster *c)
{
	c->rng ^= c->rng << 13;
	c->rng ^= c->rng >> 7;
	c->rng ^= c->rng << 17;
	return c->rng;
}

static void
batch_row(unsigned id, allot__row_usage *row, char *key, size_t cap)
{
	snprintf(key, cap, "k%u", id % NKEYS);
	*row = (allot__row_usage) { "svc", key, id, id % 13 + 1, id % 3,
		(double) (id % 13 + 1 + id % 3), 1 };
}

static void
on_apply(void *ctx, uint64_t index, const allot__centry *e)
{
	member_ctx *m = ctx;
	cluster *c = m->c;

	/* Applied indexes only go up on a member: nothing is applied
	 * twice, whatever restarts, snapshots or replays happen. */
	INVARIANT(index > c->last_index[m->i],
	    "member %u applied index %llu after %llu", m->i,
	    (unsigned long long) index,
	    (unsigned long long) c->last_index[m->i]);
	c->last_index[m->i] = index;
	if (e->type == ALLOT__CENTRY_USAGE) {
		unsigned id = (unsigned) e->usage.rows[0].second;

		INVARIANT(id < MAXB, "member %u applied batch %u", m->i, id);
		INVARIANT(c->seen[m->i][id] == 0,
		    "member %u applied batch %u twice", m->i, id);
		c->seen[m->i][id]++;
	}
}

static void
batch_done(void *ctx, int status, uint64_t index)
{
	batch *b = ctx;

	(void) index;
	b->acked = status == ALLOT_OK;
}

/* Member i's clock: the fixture's, run at 1 - d, 1 + d or 1 by member
 * (0, 1, 2, 3, ...), the drift the lease allows for, so the margins are
 * exercised: a hand-over from member 0 to 1 is the worst case, a slow old
 * leader and a fast new one. */
static uint64_t
member_clock(void *ctx)
{
	member_ctx *m = ctx;

	return (uint64_t) ((double) raft_fixture_time(&m->c->f) * m->rate);
}

/* Whether member i may grant now, on its own clock. */
static bool
grants(cluster *c, unsigned i)
{
	return allot__cnode_may_grant(&c->node[i], member_clock(&c->ctx[i]));
}

static struct raft *
raft_of(cluster *c, unsigned i)
{
	return raft_fixture_get(&c->f, i);
}

/* The member in leader state with the highest term, or c->n. */
static unsigned
leader_of(cluster *c)
{
	unsigned best = c->n;

	for (unsigned i = 0; i < c->n; i++) {
		struct raft *r = raft_of(c, i);

		if (raft_fixture_alive(&c->f, i) && r->state == RAFT_LEADER &&
		    (best == c->n ||
		        r->current_term > raft_of(c, best)->current_term))
			best = i;
	}
	return best;
}

static void
drive(cluster *c, uint64_t now)
{
	unsigned l;
	allot__row_usage row;
	allot__centry e = { .type = ALLOT__CENTRY_USAGE };
	char key[16];

	if (!c->driving || now < c->next_propose)
		return;
	c->next_propose = now + 100;
	l = leader_of(c);
	if (l == c->n || c->nbatches >= MAXB - 1)
		return;
	batch_row(c->nbatches, &row, key, sizeof key);
	e.usage.rows = &row;
	e.usage.n = 1;
	if (allot__cnode_propose(&c->node[l], &e, batch_done,
	        &c->batches[c->nbatches]) == ALLOT_OK) {
		c->batches[c->nbatches].proposed = true;
		c->nbatches++;
	}
	/* Now and then a config push against the config the leader has. */
	if (rnd(c) % 20 == 0) {
		allot__centry cfg = consensus_config_entry(
		    "quota: x", c->fsm[l].config.epoch + 1);

		(void) allot__cnode_propose(&c->node[l], &cfg, NULL, NULL);
	}
}

/* The lease argument itself: no two leaderships' windows overlap in
 * real time, judged by what each published, so a leader that steps down
 * (and stops granting at once) is still held to the lease it had. */
static void
check_windows(cluster *c, unsigned i, uint64_t now)
{
	const allot__cnode *n = &c->node[i];
	uint64_t until = allot__cnode_grant_until(n);
	double real_until;
	unsigned w;

	if (until == 0 || n->lease_term == 0)
		return;
	real_until = (double) until / c->ctx[i].rate;
	for (w = 0; w < c->nwin; w++)
		if (c->win[w].member == i && c->win[w].term == n->lease_term)
			break;
	if (w == c->nwin) {
		INVARIANT(c->nwin < 512, "more than 512 leaderships");
		c->win[w].member = i;
		c->win[w].term = n->lease_term;
		c->win[w].from = (double) now;
		c->win[w].until = 0;
		c->nwin++;
	}
	if (real_until > c->win[w].until)
		c->win[w].until = real_until;
	for (unsigned k = 0; k < c->nwin; k++) {
		if (k == w || c->win[k].from >= c->win[k].until)
			continue;
		INVARIANT(!(c->win[w].from < c->win[k].until &&
		              c->win[k].from < c->win[w].until),
		    "member %u's lease (term %llu, %.0f-%.0f) overlaps member "
		    "%u's (term %llu, %.0f-%.0f)",
		    i, (unsigned long long) c->win[w].term, c->win[w].from,
		    c->win[w].until, c->win[k].member,
		    (unsigned long long) c->win[k].term, c->win[k].from,
		    c->win[k].until);
	}
}

static void
check_step(cluster *c)
{
	uint64_t now = raft_fixture_time(&c->f);
	unsigned granting = 0, who = 0, published = 0;

	INVARIANT(now >= c->last_step_time, "time went from %llu to %llu",
	    (unsigned long long) c->last_step_time, (unsigned long long) now);
	c->last_step_time = now;
	for (unsigned i = 0; i < c->n; i++) {
		uint64_t epoch = allot__cnode_epoch(&c->node[i]);

		now = member_clock(&c->ctx[i]);
		INVARIANT(epoch >= c->last_epoch[i],
		    "member %u epoch went from %llu to %llu", i,
		    (unsigned long long) c->last_epoch[i],
		    (unsigned long long) epoch);
		c->last_epoch[i] = epoch;
		if (allot__cnode_may_grant(&c->node[i], now)) {
			granting++;
			who = i;
		}
		/* What other threads would grant by: stale values of
		 * members that stepped down, or were killed, included. */
		if (now < allot__cnode_grant_until(&c->node[i]))
			published++;
		check_windows(c, i, raft_fixture_time(&c->f));
	}
	now = raft_fixture_time(&c->f);
	INVARIANT(granting <= 1, "%u members may grant at t=%llu", granting,
	    (unsigned long long) now);
	INVARIANT(published <= 1, "%u members publish a lease at t=%llu",
	    published, (unsigned long long) now);
	if (granting == 1) {
		uint64_t epoch = allot__cnode_epoch(&c->node[who]);

		INVARIANT(epoch == raft_of(c, who)->current_term,
		    "member %u grants in epoch %llu, term %llu", who,
		    (unsigned long long) epoch,
		    (unsigned long long) raft_of(c, who)->current_term);
		INVARIANT(epoch >= c->client_epoch,
		    "a client saw epoch %llu after %llu",
		    (unsigned long long) epoch,
		    (unsigned long long) c->client_epoch);
		c->client_epoch = epoch;
		if (c->granter != who + 1) {
			c->handovers++;
			c->granter = who + 1;
		}
		c->grant_ms = now;
	}
}

static void
step(cluster *c)
{
	raft_fixture_step(&c->f);
	for (unsigned i = 0; i < c->n; i++)
		if (raft_fixture_alive(&c->f, i))
			allot__cnode_tick(&c->node[i]);
	drive(c, raft_fixture_time(&c->f));
	check_step(c);
}

static void
run_for(cluster *c, unsigned ms)
{
	uint64_t end = raft_fixture_time(&c->f) + ms;

	while (raft_fixture_time(&c->f) < end)
		step(c);
}

/* Steps until some member may grant; fails after `ms`. */
static unsigned
until_granting(cluster *c, unsigned ms)
{
	uint64_t end = raft_fixture_time(&c->f) + ms;

	while (raft_fixture_time(&c->f) < end) {
		step(c);
		for (unsigned i = 0; i < c->n; i++)
			if (grants(c, i))
				return i;
	}
	ck_abort_msg("no member could grant within %u ms", ms);
	return c->n;
}

static void
add_server(cluster *c)
{
	unsigned i = c->n;
	allot__cnode_opts opts = { .lease_ms = c->lease_ms,
		.renew_ms = c->renew_ms,
		.clock = member_clock,
		.clock_ctx = &c->ctx[i] };

	static const int skew[3] = { -1, +1, 0 };

	c->ctx[i] = (member_ctx) { c, i,
		1.0 + ALLOT__CNODE_DRIFT * skew[i % 3] };
	allot__cfsm_init(&c->fsm[i], on_apply, &c->ctx[i]);
	ck_assert_int_eq(raft_fixture_grow(&c->f, &c->fsm[i].fsm), 0);
	/* Small snapshots, so lagging members catch up by InstallSnapshot
	 * and restore runs in every case. */
	raft_set_snapshot_threshold(raft_of(c, i), 32);
	raft_set_snapshot_trailing(raft_of(c, i), 8);
	allot__cnode_init(&c->node[i], raft_of(c, i), &c->fsm[i], &opts);
	c->n++;
}

/* lease_ms 0: the default. A lease longer than the election timeout is
 * allowed (safety rests on the wait, not on election timing) and makes
 * the wait, not the election delay, what keeps two leases apart: the
 * cases that kill and cut leaders run with one. */
static cluster *
cluster_new(unsigned n, uint64_t seed, uint32_t lease_ms)
{
	cluster *c = calloc(1, sizeof *c);
	struct raft_configuration conf;

	ck_assert_ptr_nonnull(c);
	c->rng = seed;
	c->lease_ms = lease_ms;
	raft_heap_set(&fixture_heap);
	ck_assert_int_eq(raft_fixture_initialize(&c->f), 0);
	for (unsigned i = 0; i < n; i++)
		add_server(c);
	ck_assert_int_eq(raft_fixture_configuration(&c->f, n, &conf), 0);
	ck_assert_int_eq(raft_fixture_bootstrap(&c->f, &conf), 0);
	raft_configuration_close(&conf);
	ck_assert_int_eq(raft_fixture_start(&c->f), 0);
	c->driving = true;
	return c;
}

static void
cut(cluster *c, unsigned i, unsigned j)
{
	raft_fixture_disconnect(&c->f, i, j);
	raft_fixture_disconnect(&c->f, j, i);
}

static void
join(cluster *c, unsigned i, unsigned j)
{
	raft_fixture_reconnect(&c->f, i, j);
	raft_fixture_reconnect(&c->f, j, i);
}

static void
heal(cluster *c)
{
	for (unsigned i = 0; i < c->n; i++) {
		if (!raft_fixture_alive(&c->f, i))
			raft_fixture_revive(&c->f, i);
		for (unsigned j = 0; j < c->n; j++)
			if (i != j)
				raft_fixture_reconnect(&c->f, i, j);
	}
}

static bool
in_config(cluster *c, unsigned i)
{
	unsigned l = leader_of(c);
	const struct raft_configuration *conf = &raft_of(c, l)->configuration;

	for (unsigned k = 0; k < conf->n; k++)
		if (conf->servers[k].id == raft_of(c, i)->id)
			return true;
	return false;
}

/* After healing and stopping the driver: every member in the
 * configuration converges to one state, byte for byte, whose usage is
 * exactly the committed batches, every acknowledged one included. */
static void
check_converged(cluster *c)
{
	uint64_t end;
	bool same = false;
	void *ref = NULL, *buf;
	size_t ref_len = 0, len;
	uint64_t consumed[NKEYS] = { 0 }, denied[NKEYS] = { 0 };
	bool committed[MAXB] = { false };
	uint64_t target;
	unsigned l;

	heal(c);
	c->driving = false;
	(void) until_granting(c, 20000);
	l = leader_of(c);
	/* Everything the leader has when the driver stops, applied
	 * everywhere (renewal barriers keep coming after it). */
	target = raft_last_index(raft_of(c, l));
	end = raft_fixture_time(&c->f) + 20000;
	while (!same && raft_fixture_time(&c->f) < end) {
		step(c);
		same = true;
		for (unsigned i = 0; i < c->n; i++)
			if (in_config(c, i) &&
			    (raft_last_applied(raft_of(c, i)) < target ||
			        c->fsm[i].applied != c->fsm[l].applied))
				same = false;
	}
	ck_assert_msg(same, "members did not converge");

	for (unsigned i = 0; i < c->n; i++)
		for (unsigned b = 0; b < c->nbatches; b++)
			if (c->seen[i][b] != 0)
				committed[b] = true;
	for (unsigned b = 0; b < c->nbatches; b++) {
		allot__row_usage row;
		char key[16];

		if (c->batches[b].acked)
			ck_assert_msg(committed[b],
			    "batch %u acknowledged but not applied", b);
		if (!committed[b])
			continue;
		batch_row(b, &row, key, sizeof key);
		consumed[b % NKEYS] += row.consumed;
		denied[b % NKEYS] += row.denied;
	}
	for (unsigned i = 0; i < c->n; i++) {
		if (!in_config(c, i))
			continue;
		for (unsigned k = 0; k < NKEYS; k++) {
			char key[16];
			const allot__cusage_total *t;

			snprintf(key, sizeof key, "k%u", k);
			t = allot__cfsm_usage(&c->fsm[i], "svc", key);
			ck_assert_uint_eq(
			    t != NULL ? t->consumed : 0, consumed[k]);
			ck_assert_uint_eq(
			    t != NULL ? t->denied : 0, denied[k]);
		}
		ck_assert_int_eq(
		    allot__cfsm_encode(&c->fsm[i], &buf, &len), ALLOT_OK);
		if (ref == NULL) {
			ref = buf;
			ref_len = len;
			continue;
		}
		ck_assert_msg(len == ref_len && memcmp(buf, ref, len) == 0,
		    "member %u's state differs", i);
		raft_free(buf);
	}
	raft_free(ref);
}

static void
cluster_free(cluster *c)
{
	/* Closing calls back the requests still pending, which touch the
	 * nodes: free the states only after. */
	raft_fixture_close(&c->f);
	for (unsigned i = 0; i < c->n; i++)
		allot__cfsm_finish(&c->fsm[i]);
	free(c);
	raft_heap_set_default();
}

START_TEST(fixture_elects_and_commits)
{
	cluster *c = cluster_new(3, 1, 0);
	unsigned g = until_granting(c, 10000);
	uint64_t elected = c->node[g].elected_at;

	/* Not before the wait: lease * (1 + d) after winning. */
	ck_assert_uint_ge(
	    member_clock(&c->ctx[g]), elected + c->node[g].wait_ms);
	ck_assert_uint_eq(
	    allot__cnode_epoch(&c->node[g]), raft_of(c, g)->current_term);
	run_for(c, 5000);
	ck_assert_uint_gt(c->nbatches, 40);
	/* The lease stays renewed while nothing goes wrong. */
	ck_assert_uint_eq(c->handovers, 1);
	ck_assert_uint_eq(c->grant_ms, raft_fixture_time(&c->f));
	check_converged(c);
	cluster_free(c);
}
END_TEST

/* A bridge: members a and b cannot reach each other, the bridge reaches
 * both. Run with each member in the bridge's place, the leader among
 * them or not. */
START_TEST(fixture_bridge_partition)
{
	for (unsigned bridge = 0; bridge < 3; bridge++) {
		cluster *c = cluster_new(3, 7 + bridge, 0);
		unsigned a = (bridge + 1) % 3, b = (bridge + 2) % 3;

		(void) until_granting(c, 10000);
		cut(c, a, b);
		run_for(c, 15000);
		/* Someone still grants through the bridge. */
		ck_assert_uint_ge(
		    c->grant_ms, raft_fixture_time(&c->f) - 3000);
		check_converged(c);
		cluster_free(c);
	}
}
END_TEST

START_TEST(fixture_leader_isolation)
{
	cluster *c = cluster_new(5, 11, 3000);
	unsigned l = until_granting(c, 10000);
	unsigned handovers = c->handovers;

	for (unsigned j = 0; j < c->n; j++)
		if (j != l)
			cut(c, l, j);
	run_for(c, 10000);
	/* The old leader stopped; a new one took over after the wait. */
	ck_assert(!grants(c, l));
	ck_assert_uint_gt(c->handovers, handovers);
	ck_assert_uint_ne(c->granter, l + 1);
	ck_assert_uint_gt(c->client_epoch, c->last_epoch[l]);
	check_converged(c);
	cluster_free(c);
}
END_TEST

START_TEST(fixture_flapping_links)
{
	cluster *c = cluster_new(5, 23, 3000);
	uint64_t end;

	(void) until_granting(c, 10000);
	end = raft_fixture_time(&c->f) + 60000;
	while (raft_fixture_time(&c->f) < end) {
		unsigned i = (unsigned) (rnd(c) % c->n);
		unsigned j = (unsigned) (rnd(c) % c->n);

		if (i != j) {
			if (rnd(c) % 2)
				cut(c, i, j);
			else
				join(c, i, j);
		}
		run_for(c, (unsigned) (50 + rnd(c) % 450));
	}
	check_converged(c);
	cluster_free(c);
}
END_TEST

START_TEST(fixture_kill_revive)
{
	cluster *c = cluster_new(5, 31, 3000);

	for (unsigned round = 0; round < 6; round++) {
		unsigned l = until_granting(c, 15000);
		unsigned other = (l + 1 + round) % c->n;

		raft_fixture_kill(&c->f, l);
		if (round % 2)
			raft_fixture_kill(&c->f, other);
		run_for(c, 3000 + 700 * round);
		/* Revive heals every link of the revived member. */
		raft_fixture_revive(&c->f, l);
		if (round % 2)
			raft_fixture_revive(&c->f, other);
		run_for(c, 2000);
	}
	ck_assert_uint_ge(c->handovers, 6);
	check_converged(c);
	cluster_free(c);
}
END_TEST

static void
transfer_done(struct raft_transfer *req)
{
	(void) req;
}

/* A leadership transfer elects the new leader at once (its RequestVote
 * may disrupt a known leader), so the old leader's last renewal is only
 * moments old: the case where the wait alone keeps the two leases apart.
 * The transfer goes to libraft directly, so the old leader keeps its
 * lease (the node would give it up). */
START_TEST(fixture_transfer_keeps_leases_apart)
{
	/* A long lease makes the drift margins (lease * d = 200 ms) larger
	 * than the transfer takes, so they are what the invariant checks. */
	cluster *c = cluster_new(3, 57, 20000);
	struct raft_transfer req;
	unsigned moved = 0;

	/* Renew often, so the last renewal is as close to the new leader's
	 * win as it gets. */
	for (unsigned i = 0; i < c->n; i++)
		c->node[i].opts.renew_ms = 10;
	for (unsigned k = 0; k < 30; k++) {
		unsigned l = until_granting(c, 40000);
		unsigned to = (l + 1 + k % 2) % c->n;

		run_for(c, (unsigned) (rnd(c) % 800));
		if (leader_of(c) != l)
			continue;
		if (raft_transfer(raft_of(c, l), &req, raft_of(c, to)->id,
		        transfer_done) != 0)
			continue;
		run_for(c, 2000);
		moved += leader_of(c) == to;
	}
	ck_assert_uint_ge(moved, 15);
	ck_assert_uint_ge(c->handovers, 15);
	check_converged(c);
	cluster_free(c);
}
END_TEST

/* Add two members and remove one while a follower is cut off. */
START_TEST(fixture_membership_during_partition)
{
	cluster *c = cluster_new(3, 43, 0);
	unsigned l = until_granting(c, 10000), cutoff = (l + 1) % 3;
	uint64_t end;

	for (unsigned j = 0; j < 3; j++)
		if (j != cutoff)
			cut(c, cutoff, j);
	run_for(c, 3000);
	for (unsigned k = 0; k < 2; k++) {
		unsigned nw;

		add_server(c);
		nw = c->n - 1;
		ck_assert_int_eq(raft_start(raft_of(c, nw)), 0);
		/* The cut-off member cannot reach the newcomer either. */
		cut(c, cutoff, nw);
		l = until_granting(c, 10000);
		ck_assert_int_eq(
		    allot__cnode_add_member(&c->node[l], raft_of(c, nw)->id,
		        raft_of(c, nw)->address),
		    ALLOT_OK);
		end = raft_fixture_time(&c->f) + 20000;
		while (raft_fixture_time(&c->f) < end) {
			const struct raft_configuration *conf;
			bool voter = false;

			step(c);
			l = leader_of(c);
			if (l == c->n)
				continue;
			conf = &raft_of(c, l)->configuration;
			for (unsigned s = 0; s < conf->n; s++)
				if (conf->servers[s].id ==
				        raft_of(c, nw)->id &&
				    conf->servers[s].role == RAFT_VOTER)
					voter = true;
			if (voter && !allot__cnode_changing(&c->node[l]))
				break;
		}
		ck_assert_msg(raft_fixture_time(&c->f) < end,
		    "member %u was not promoted", nw);
		/* It caught up before voting: its state has what the
		 * leader's had when it was promoted. */
		ck_assert_uint_gt(c->fsm[nw].applied, 0);
	}
	/* Remove the cut-off member; the rest go on. */
	l = until_granting(c, 10000);
	ck_assert_int_eq(
	    allot__cnode_remove_member(&c->node[l], raft_of(c, cutoff)->id),
	    ALLOT_OK);
	run_for(c, 3000);
	ck_assert(!in_config(c, cutoff));
	ck_assert_uint_ge(c->fsm[l].members_changed, 5);
	/* Removing the leader itself: one call, and the next leader
	 * finishes it (fixture_leader_leaves has the cases). */
	l = until_granting(c, 10000);
	ck_assert_int_eq(
	    allot__cnode_remove_member(&c->node[l], raft_of(c, l)->id),
	    ALLOT_OK);
	run_for(c, 5000);
	ck_assert_uint_ne(leader_of(c), l);
	ck_assert(!in_config(c, l));
	check_converged(c);
	cluster_free(c);
}
END_TEST

/* How fixture_leader_leaves loses the old leader once its intent to
 * leave is committed, before it can hand over: 1 kills it, 2 cuts it
 * off from every other member (it keeps ticking and trying). */
static int leave_how;
static unsigned leave_victim;

static void
intent_committed(void *ctx, int status, uint64_t index)
{
	cluster *c = ctx;

	(void) index;
	if (status != ALLOT_OK)
		return;
	if (leave_how == 1)
		raft_fixture_kill(&c->f, leave_victim);
	for (unsigned j = 0; leave_how == 2 && j < c->n; j++)
		if (j != leave_victim)
			cut(c, leave_victim, j);
}

/* Steps until a leader other than member v has v out of its committed
 * configuration; returns how long it took (fixture ms). */
static uint64_t
until_removed(cluster *c, unsigned v, unsigned ms)
{
	uint64_t start = raft_fixture_time(&c->f), end = start + ms;

	while (raft_fixture_time(&c->f) < end) {
		unsigned l;

		step(c);
		l = leader_of(c);
		if (l != c->n && l != v &&
		    allot__cnode_leave_state(&c->node[l], raft_of(c, v)->id) ==
		        ALLOT__CLEAVE_GONE)
			return raft_fixture_time(&c->f) - start;
	}
	ck_abort_msg("member %u was not removed within %u ms", v, ms);
	return 0;
}

/* The leader removes itself with one call: its intent goes through the
 * log, it hands over, and the new leader demotes and removes it. Also
 * when the old leader is lost (killed, or cut off) right after the
 * intent commits, before any hand-over: the next leader still removes
 * it. Every step checks the usual invariants (one granting member,
 * epochs only up, no lease overlap), and afterwards every member left
 * has the same state with nobody leaving. */
START_TEST(fixture_leader_leaves)
{
	for (leave_how = 0; leave_how < 3; leave_how++) {
		cluster *c = cluster_new(
		    3, 71 + (uint64_t) leave_how, leave_how ? 3000 : 0);
		unsigned l = until_granting(c, 10000), now;
		uint64_t id = raft_of(c, l)->id, took;

		leave_victim = l;
		if (leave_how == 0) {
			ck_assert_int_eq(
			    allot__cnode_remove_member(&c->node[l], id),
			    ALLOT_OK);
		} else {
			allot__centry e = { .type = ALLOT__CENTRY_MEMBER };

			e.member.event = ALLOT__CMEMBER_LEAVING;
			e.member.id = id;
			e.member.address = raft_of(c, l)->address;
			ck_assert_int_eq(allot__cnode_propose(&c->node[l], &e,
			                     intent_committed, c),
			    ALLOT_OK);
		}
		took = until_removed(c, l, 30000);
		fprintf(stderr,
		    "leader_leaves (case %d): removed after %llu ms\n",
		    leave_how, (unsigned long long) took);
		now = leader_of(c);
		/* A hand-over is immediate; a lost leader costs an
		 * election and the wait for its ack of the demotion. */
		if (leave_how == 0)
			ck_assert_uint_lt(took, 3000);
		ck_assert(!grants(c, l));
		/* The old member heard it was demoted (all it ever hears,
		 * libraft sends nothing to a removed member): what its
		 * own allotctl call waits for. */
		if (leave_how == 0)
			ck_assert_int_eq(
			    allot__cnode_leave_state(&c->node[l], id),
			    ALLOT__CLEAVE_DEMOTED);
		ck_assert_int_eq(allot__cnode_leave_state(&c->node[now], id),
		    ALLOT__CLEAVE_GONE);
		check_converged(c);
		ck_assert_uint_ne(c->granter, l + 1);
		/* Healed and revived, it still neither leads nor returns. */
		run_for(c, 5000);
		ck_assert_uint_ne(leader_of(c), l);
		ck_assert(!in_config(c, l));
		ck_assert(!grants(c, l));
		for (unsigned i = 0; i < c->n; i++)
			if (in_config(c, i))
				ck_assert_uint_eq(c->fsm[i].nleaving, 0);
		cluster_free(c);
	}
}
END_TEST

static Suite *
consensus_suite(void)
{
	Suite *s = suite_create("consensus");
	TCase *fx = tcase_create("fixture");

	suite_add_tcase(s, consensus_state_cases());
	tcase_set_timeout(fx, 120);
	tcase_add_test(fx, fixture_elects_and_commits);
	tcase_add_test(fx, fixture_bridge_partition);
	tcase_add_test(fx, fixture_leader_isolation);
	tcase_add_test(fx, fixture_flapping_links);
	tcase_add_test(fx, fixture_kill_revive);
	tcase_add_test(fx, fixture_transfer_keeps_leases_apart);
	tcase_add_test(fx, fixture_membership_during_partition);
	tcase_add_test(fx, fixture_leader_leaves);
	suite_add_tcase(s, fx);
	suite_add_tcase(s, consensus_uv_cases());
	return s;
}

ALLOT_TEST_MAIN(consensus_suite)
