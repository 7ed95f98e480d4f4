/* SPDX-License-Identifier: MIT */
/*
 * The store's part in the Raft cluster (store.h, "the Raft cluster"):
 * the tap through which the leader's audit rows (per-second usage,
 * events, replica joins and leaves, shares, levels) leave for the log
 * instead of the file, and the apply of a committed entry's rows on every
 * member, in one transaction with the applied index
 * (schema/005_raft.sql) so that a replay writes nothing twice.
 */
#include "store_int.h"

#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

#include "store_batch.h"

void
allot__store_set_usage_tap(
    allot__store *st, allot__store_usage_tap fn, void *ctx)
{
	if (st == NULL)
		return;
	st->usage_tap = fn;
	st->usage_tap_ctx = ctx;
}

/* What a tap takes out of a batch, as rows (rows.h). */
struct tapped {
	allot__row_usage *rows;
	allot__row_event *ev;
	allot__row_join *joins;
	allot__row_left *lefts;
	allot__row_seen *seen;
	allot__row_share *shares;
	allot__row_level *levels;
	allot__row_shadow *shadow;
};

static void
tapped_free(struct tapped *t)
{
	free(t->rows);
	free(t->ev);
	free(t->joins);
	free(t->lefts);
	free(t->seen);
	free(t->shares);
	free(t->levels);
	free(t->shadow);
}

static void *
rows_of(size_t n, size_t size, bool *oom)
{
	void *p = calloc(n != 0 ? n : 1, size);
	*oom = *oom || p == NULL;
	return p;
}

static void
take_usage(struct batch *b, struct tapped *t, allot__store_tap_rows *out)
{
	size_t n = 0;
	for (uint32_t i = 0; i < b->usage.n; i++) {
		struct usage_ent *e = (struct usage_ent *) allot__tab_at(
		    &b->usage, i);
		if (!e->hdr.live)
			continue;
		allot__row_shadow x;
		allot__store_usage_rows(e, &t->rows[n++], &x);
		if (x.shadow_denied != 0 || x.candidate_denied != 0 ||
		    x.candidate_rate > 0)
			t->shadow[out->audit.nshadow++] = x;
		e->hdr.live = false;
	}
	b->usage_live = 0;
	out->rows = t->rows;
	out->n = n;
	out->audit.shadow = t->shadow;
}

/* The events, joins and leaves leave the op list; the other ops keep
 * their order. */
static void
take_ops(struct batch *b, struct tapped *t, allot__store_tap_rows *out)
{
	struct op **pp = &b->ops;
	while (*pp != NULL) {
		struct op *o = *pp;
		if (o->kind == OP_EVENT)
			t->ev[out->nev++] = allot__store_event_row(o);
		else if (o->kind == OP_JOIN)
			t->joins[out->audit.njoins++] = allot__store_join_row(
			    o);
		else if (o->kind == OP_LEFT)
			t->lefts[out->audit.nlefts++] = allot__store_left_row(
			    o);
		else {
			pp = &o->next;
			continue;
		}
		*pp = o->next;
		b->nops--;
	}
	b->tail = pp;
	out->ev = t->ev;
	out->audit.joins = t->joins;
	out->audit.lefts = t->lefts;
}

/* Shares the commit would write (changed, or due a refresh), every
 * last-seen time and level. */
static void
take_state(allot__store *st, struct batch *b, struct tapped *t,
    allot__store_tap_rows *out)
{
	allot__row_audit *a = &out->audit;
	for (uint32_t i = 0; i < b->shares.n; i++) {
		struct share_ent *e = (struct share_ent *) allot__tab_at(
		    &b->shares, i);
		e->write = allot__store_share_due(st, e);
		if (e->write)
			t->shares[a->nshares++] = allot__store_share_row(e);
	}
	for (uint32_t i = 0; i < b->seen.n; i++) {
		const struct seen_ent *e = (const struct seen_ent *)
		    allot__tab_at(&b->seen, i);
		t->seen[a->nseen++] = allot__store_seen_row(e);
	}
	for (uint32_t i = 0; i < b->levels.n; i++) {
		const struct level_ent *e = (const struct level_ent *)
		    allot__tab_at(&b->levels, i);
		t->levels[a->nlevels++] = allot__store_level_row(e);
	}
	a->shares = t->shares;
	a->seen = t->seen;
	a->levels = t->levels;
}

/* Hand the usage rows, events, replica, share and level rows of batch
 * `b` to the tap and take them out of the batch (flush, before the
 * write). The other ops (configs and their changes) stay. */
void
allot__store_tap(allot__store *st, struct batch *b)
{
	if (st->usage_tap == NULL || allot__batch_rows(b) == 0)
		return;
	size_t nev = 0, njoin = 0, nleft = 0;
	for (const struct op *o = b->ops; o != NULL; o = o->next) {
		nev += o->kind == OP_EVENT;
		njoin += o->kind == OP_JOIN;
		nleft += o->kind == OP_LEFT;
	}
	bool oom = false;
	struct tapped t = {
		.rows = rows_of(b->usage_live, sizeof *t.rows, &oom),
		.ev = rows_of(nev, sizeof *t.ev, &oom),
		.joins = rows_of(njoin, sizeof *t.joins, &oom),
		.lefts = rows_of(nleft, sizeof *t.lefts, &oom),
		.seen = rows_of(b->seen.n, sizeof *t.seen, &oom),
		.shares = rows_of(b->shares.n, sizeof *t.shares, &oom),
		.levels = rows_of(b->levels.n, sizeof *t.levels, &oom),
		.shadow = rows_of(b->usage_live, sizeof *t.shadow, &oom),
	};
	if (oom) {
		tapped_free(&t);
		return; /* written locally instead */
	}
	allot__store_tap_rows out = { 0 };
	take_usage(b, &t, &out);
	take_state(st, b, &t, &out);
	/* What the file will hold once the entry is applied: shares left
	 * unchanged are skipped again next time (store_commit.c). */
	allot__store_written_note(st, b);
	take_ops(b, &t, &out);
	/* The counts go as they are: every member's state machine keeps
	 * the records new to it (consensus_fsm.c). */
	out.counts = b->counts;
	out.ncounts = b->ncounts;
	allot__tab_clear(&b->shares);
	allot__tab_clear(&b->seen);
	allot__tab_clear(&b->levels);
	st->usage_tap(st->usage_tap_ctx, &out);
	b->ncounts = 0;
	tapped_free(&t);
}

static int
exec(allot__store *st, const char *sql)
{
	return sqlite3_exec(st->db, sql, NULL, NULL, NULL);
}

uint64_t
allot__store_applied(allot__store *st)
{
	sqlite3_stmt *s = NULL;
	uint64_t idx = 0;
	if (st == NULL ||
	    sqlite3_prepare_v2(st->db,
	        "SELECT idx FROM raft_applied WHERE one = 1", -1, &s,
	        NULL) != SQLITE_OK)
		return 0;
	if (sqlite3_step(s) == SQLITE_ROW)
		idx = (uint64_t) sqlite3_column_int64(s, 0);
	sqlite3_finalize(s);
	return idx;
}

/* An optional string of a log row: "" was NULL (or empty) where the
 * leader recorded it, and is written as NULL. */
static const char *
opt(const char *v)
{
	return v != NULL && v[0] != '\0' ? v : NULL;
}

/* The rows of one entry, written inside apply()'s transaction. */
typedef int (*writer)(allot__store *st, const void *arg);

struct plain_rows {
	const allot__row_usage *rows;
	size_t n;
	const allot__row_event *ev;
	size_t nev;
};

static int
write_plain(allot__store *st, const void *arg)
{
	const struct plain_rows *p = arg;
	int rc = SQLITE_OK;
	for (size_t i = 0; i < p->n && rc == SQLITE_OK; i++)
		rc = allot__store_put_usage(st, &p->rows[i], NULL);
	for (size_t i = 0; i < p->nev && rc == SQLITE_OK; i++) {
		allot__row_event e = p->ev[i];
		e.subject = opt(e.subject);
		e.detail = opt(e.detail);
		rc = allot__store_put_event(st, &e);
	}
	return rc;
}

/* With the writers the leader's own commit uses (store_commit.c), in
 * the order the entry holds them, so every member's rows are what a
 * single allotd would have written. The shadow columns add to the
 * usage seconds of the USAGE entry of the same flush. */
static int
write_audit(allot__store *st, const void *arg)
{
	const allot__row_audit *a = arg;
	int rc = SQLITE_OK;
	for (size_t i = 0; i < a->njoins && rc == SQLITE_OK; i++) {
		allot__row_join j = a->joins[i];
		j.host = opt(j.host);
		j.version = opt(j.version);
		rc = allot__store_put_join(st, &j);
	}
	for (size_t i = 0; i < a->nshares && rc == SQLITE_OK; i++)
		rc = allot__store_put_share(st, &a->shares[i]);
	for (size_t i = 0; i < a->nlefts && rc == SQLITE_OK; i++)
		rc = allot__store_put_left(st, &a->lefts[i]);
	for (size_t i = 0; i < a->nseen && rc == SQLITE_OK; i++)
		rc = allot__store_put_seen(st, &a->seen[i]);
	for (size_t i = 0; i < a->nlevels && rc == SQLITE_OK; i++)
		rc = allot__store_put_level(st, &a->levels[i]);
	for (size_t i = 0; i < a->nshadow && rc == SQLITE_OK; i++)
		rc = allot__store_put_usage(st, NULL, &a->shadow[i]);
	return rc;
}

/* One committed entry's rows and the applied index, in one transaction;
 * an index at or below the last applied is a replay and writes
 * nothing. */
static int
apply(allot__store *st, uint64_t index, writer fn, const void *arg)
{
	if (st == NULL)
		return ALLOT_OK;
	int64_t at = allot__store_now_ms(st);
	/* The group commit's busy timeout applies: an auditor's read
	 * transaction does not block a WAL writer, only another writer. */
	int rc = exec(st, "BEGIN IMMEDIATE");
	if (rc != SQLITE_OK)
		goto fail;
	sqlite3_stmt *s = NULL;
	uint64_t applied = 0;
	rc = sqlite3_prepare_v2(st->db,
	    "SELECT idx FROM raft_applied WHERE one = 1", -1, &s, NULL);
	if (rc == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW)
		applied = (uint64_t) sqlite3_column_int64(s, 0);
	sqlite3_finalize(s);
	if (rc != SQLITE_OK)
		goto rollback;
	if (index <= applied) {
		exec(st, "ROLLBACK");
		return ALLOT_OK; /* a replay: already written */
	}
	rc = fn(st, arg);
	if (rc == SQLITE_OK) {
		rc = sqlite3_prepare_v2(st->db,
		    "UPDATE raft_applied SET idx = ?1, at = ?2 WHERE one = 1",
		    -1, &s, NULL);
		if (rc == SQLITE_OK) {
			sqlite3_bind_int64(s, 1, (sqlite3_int64) index);
			sqlite3_bind_int64(s, 2, at);
			rc = sqlite3_step(s) == SQLITE_DONE ? SQLITE_OK :
			                                      SQLITE_ERROR;
		}
		sqlite3_finalize(s);
	}
	if (rc != SQLITE_OK)
		goto rollback;
	rc = exec(st, "COMMIT");
	if (rc == SQLITE_OK)
		return ALLOT_OK;
rollback:
	exec(st, "ROLLBACK");
fail:
	/* The cluster keeps the entry and retries it (backlog.h): said
	 * once in a while, not at every retry. */
	allot__log_ratelimited(&st->lg, &st->rl_fail, ALLOT_LOG_ERR,
	    "ALLOT-STORE-FAIL", "store %s: cannot write log entry %llu (%s)",
	    st->path, (unsigned long long) index, sqlite3_errmsg(st->db));
	return ALLOT_EIO;
}

int
allot__store_apply(allot__store *st, uint64_t index,
    const allot__row_usage *rows, size_t n, const allot__row_event *ev,
    size_t nev)
{
	struct plain_rows p = { rows, n, ev, nev };
	return apply(st, index, write_plain, &p);
}

struct count_rows {
	const allot__row_count *rows;
	size_t n;
};

static int
write_counts(allot__store *st, const void *arg)
{
	const struct count_rows *c = arg;
	return allot__store_put_counts(st, c->rows, c->n);
}

int
allot__store_apply_counts(
    allot__store *st, uint64_t index, const allot__row_count *rows, size_t n)
{
	struct count_rows c = { rows, n };
	int rv = apply(st, index, write_counts, &c);
	if (rv == ALLOT_OK && st != NULL)
		allot__store_counts_applied(st, rows, n);
	return rv;
}

int
allot__store_apply_audit(
    allot__store *st, uint64_t index, const allot__row_audit *a)
{
	if (st == NULL)
		return ALLOT_OK;
	uint64_t mx = 0;
	for (size_t i = 0; i < a->njoins; i++)
		if (a->joins[i].session > mx)
			mx = a->joins[i].session;
	pthread_mutex_lock(&st->mu);
	if (mx > st->max_session)
		st->max_session = mx;
	pthread_mutex_unlock(&st->mu);
	return apply(st, index, write_audit, a);
}
