/* SPDX-License-Identifier: MIT */
/*
 * The store's part in the Raft cluster (store.h, "the Raft cluster"):
 * the tap through which the leader's per-second usage rows and its
 * events leave for the log instead of the file, and the apply of a committed
 * entry's rows on every member, in one transaction with the applied index
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

/* Hand the usage rows and events of batch `b` to the tap and take them
 * out of the batch (flush, before the write). Other rows stay. */
void
allot__store_tap_usage(allot__store *st, struct batch *b)
{
	if (st->usage_tap == NULL)
		return;
	size_t nev = 0;
	for (const struct op *o = b->ops; o != NULL; o = o->next)
		nev += o->kind == OP_EVENT;
	if (b->usage_live == 0 && nev == 0)
		return;
	allot__cusage_row *rows = calloc(
	    b->usage_live ? b->usage_live : 1, sizeof *rows);
	allot__cevent *ev = calloc(nev ? nev : 1, sizeof *ev);
	if (rows == NULL || ev == NULL) {
		free(rows);
		free(ev);
		return; /* written locally instead */
	}
	size_t n = 0;
	for (uint32_t i = 0; i < b->usage.n; i++) {
		struct usage_ent *e = (struct usage_ent *) allot__tab_at(
		    &b->usage, i);
		if (!e->hdr.live)
			continue;
		rows[n++] = (allot__cusage_row) {
			.service = e->k->service,
			.key = e->k->quota,
			.second = e->sec > 0 ? (uint64_t) e->sec : 0,
			.consumed = e->admitted,
			.denied = e->denied,
			.demand = e->demand,
			.live_replicas = e->live_replicas,
		};
		e->hdr.live = false;
	}
	b->usage_live = 0;
	/* The events leave the op list; the other ops keep their order. */
	size_t k = 0;
	struct op **pp = &b->ops;
	while (*pp != NULL) {
		struct op *o = *pp;
		if (o->kind != OP_EVENT) {
			pp = &o->next;
			continue;
		}
		ev[k++] = (allot__cevent) {
			.at = o->at,
			.kind = o->s[0],
			.subject = o->s[1],
			.detail = o->s[2],
		};
		*pp = o->next;
		b->nops--;
	}
	b->tail = pp;
	st->usage_tap(st->usage_tap_ctx, rows, n, ev, k);
	free(rows);
	free(ev);
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

static int
write_rows(allot__store *st, const allot__cusage_row *rows, size_t n)
{
	sqlite3_stmt *s = NULL;
	int rc = sqlite3_prepare_v2(st->db,
	    "INSERT INTO usage (service, quota, at, admitted, denied,"
	    " demand, live_replicas)"
	    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
	    " ON CONFLICT (at, service, quota) DO UPDATE SET"
	    " admitted = admitted + excluded.admitted,"
	    " denied = denied + excluded.denied,"
	    " demand = demand + excluded.demand,"
	    " live_replicas = max(live_replicas, excluded.live_replicas)",
	    -1, &s, NULL);
	for (size_t i = 0; i < n && rc == SQLITE_OK; i++) {
		sqlite3_bind_text(s, 1, rows[i].service, -1, SQLITE_STATIC);
		sqlite3_bind_text(s, 2, rows[i].key, -1, SQLITE_STATIC);
		sqlite3_bind_int64(
		    s, 3, (sqlite3_int64) rows[i].second * 1000);
		sqlite3_bind_int64(s, 4, (sqlite3_int64) rows[i].consumed);
		sqlite3_bind_int64(s, 5, (sqlite3_int64) rows[i].denied);
		sqlite3_bind_double(s, 6, rows[i].demand);
		sqlite3_bind_int64(s, 7, rows[i].live_replicas);
		rc = sqlite3_step(s) == SQLITE_DONE ? SQLITE_OK : SQLITE_ERROR;
		sqlite3_reset(s);
	}
	sqlite3_finalize(s);
	return rc;
}

static void
bind_opt(sqlite3_stmt *s, int i, const char *v)
{
	if (v == NULL || v[0] == '\0')
		sqlite3_bind_null(s, i);
	else
		sqlite3_bind_text(s, i, v, -1, SQLITE_STATIC);
}

static int
write_events(allot__store *st, const allot__cevent *ev, size_t n)
{
	sqlite3_stmt *s = NULL;
	int rc = sqlite3_prepare_v2(st->db,
	    "INSERT INTO events (at, kind, subject, detail)"
	    " VALUES (?1, ?2, ?3, ?4)",
	    -1, &s, NULL);
	for (size_t i = 0; i < n && rc == SQLITE_OK; i++) {
		sqlite3_bind_int64(s, 1, ev[i].at);
		sqlite3_bind_text(s, 2, ev[i].kind != NULL ? ev[i].kind : "",
		    -1, SQLITE_STATIC);
		bind_opt(s, 3, ev[i].subject);
		bind_opt(s, 4, ev[i].detail);
		rc = sqlite3_step(s) == SQLITE_DONE ? SQLITE_OK : SQLITE_ERROR;
		sqlite3_reset(s);
	}
	sqlite3_finalize(s);
	return rc;
}

int
allot__store_apply(allot__store *st, uint64_t index,
    const allot__cusage_row *rows, size_t n, const allot__cevent *ev,
    size_t nev)
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
	rc = write_rows(st, rows, n);
	if (rc == SQLITE_OK)
		rc = write_events(st, ev, nev);
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
	allot__log(&st->lg, ALLOT_LOG_ERR, "ALLOT-STORE-FAIL",
	    "store %s: cannot write log entry %llu (%s)", st->path,
	    (unsigned long long) index, sqlite3_errmsg(st->db));
	return ALLOT_EIO;
}
