/* SPDX-License-Identifier: MIT */
/*
 * The store's part in the accounting guarantee (store.h, "Usage
 * records"; docs/operations.md): agents' Usage records booked once per
 * (account, id) and written with their account's mark in one
 * transaction, the marks loaded at start-up, and what is durable.
 *
 * Two sets of marks, both under the store's mutex: `committed`, what the
 * file holds (written by a commit or the apply of a log entry, on the
 * loop thread), and `booked`, that plus what is queued in a batch or
 * proposed through the log. A record at or below `booked` is not queued
 * again; a commit keeps only what is above `committed` (a copy of it,
 * `scratch`, raised as the commit goes and taken over once it is done),
 * so a record queued twice after a rebase is still written once.
 */
#include "store_int.h"

#include <stdlib.h>
#include <string.h>

/* The marks go back to what is durable: what was booked but not written
 * (trimmed, or proposed by a leader that stopped) is booked again when
 * its agent sends it again. Under the mutex. */
static void
rebase_locked(allot__store *st)
{
	if (allot__marks_copy(&st->booked, &st->committed) != ALLOT_OK)
		allot__marks_init(&st->booked);
}

void
allot__store_marks_rebase(allot__store *st)
{
	if (st == NULL)
		return;
	pthread_mutex_lock(&st->mu);
	rebase_locked(st);
	pthread_mutex_unlock(&st->mu);
}

/* After a trim of the current batch (store_record.c) or of the retry
 * batch (the flush), under the mutex. */
void
allot__store_counts_trimmed(allot__store *st, struct batch *b)
{
	if (!b->counts_trimmed)
		return;
	b->counts_trimmed = false;
	rebase_locked(st);
}

bool
allot__store_usage_record(
    allot__store *st, const allot__row_count *rows, size_t n)
{
	if (st == NULL || n == 0)
		return false;
	pthread_mutex_lock(&st->mu);
	struct batch *b = st->cur;
	size_t start = b->ncounts;
	bool ok = true;
	for (size_t i = 0; i < n && ok; i++) {
		allot__row_count r = rows[i];
		if (r.service == NULL)
			r.service = "";
		if (r.quota != NULL) {
			size_t sl = strlen(r.service), ql = strlen(r.quota);
			uint64_t h = allot__store_keys_hash(
			    &st->keys, r.service, sl, r.quota, ql);
			const struct key *k = allot__store_keys_intern(
			    &st->keys, h, r.service, sl, r.quota, ql);
			if (k == NULL) {
				ok = false;
				break;
			}
			r.service = k->service;
			r.quota = k->quota;
		} else {
			r.service = NULL;
		}
		ok = allot__batch_count(b, &r);
	}
	if (!ok) {
		/* Not booked: its agent sends it again. */
		b->ncounts = start;
		st->rows_rejected++;
		pthread_mutex_unlock(&st->mu);
		return false;
	}
	size_t kept = allot__marks_filter(
	    &st->booked, b->counts + start, n, &st->count_overlaps);
	b->ncounts = start + kept;
	if (allot__batch_rows(b) > st->opts.max_pending) {
		st->rows_dropped += allot__batch_trim(b, st->opts.max_pending);
		allot__store_counts_trimmed(st, b);
	}
	pthread_mutex_unlock(&st->mu);
	return kept > 0;
}

void
allot__store_usage_link(
    allot__store *st, uint64_t session, uint64_t incarnation)
{
	if (incarnation == 0)
		return;
	allot__row_count r = { .session = session,
		.incarnation = incarnation };
	(void) allot__store_usage_record(st, &r, 1);
}

uint64_t
allot__store_durable(allot__store *st, uint64_t incarnation)
{
	if (st == NULL)
		return 0;
	pthread_mutex_lock(&st->mu);
	uint64_t id = allot__marks_get(&st->committed, incarnation);
	pthread_mutex_unlock(&st->mu);
	return id;
}

int
allot__store_put_counts(
    allot__store *st, const allot__row_count *rows, size_t n)
{
	int rc = SQLITE_OK;
	for (size_t i = 0; i < n && rc == SQLITE_OK; i++) {
		const allot__row_count *c = &rows[i];
		sqlite3_stmt *s;
		if (c->id == 0) {
			s = st->stmt[S_LINK];
			sqlite3_bind_int64(s, 1, (sqlite3_int64) c->session);
			sqlite3_bind_int64(
			    s, 2, (sqlite3_int64) c->incarnation);
			rc = allot__store_step(s);
			continue;
		}
		if (c->quota != NULL && c->quota[0] != '\0') {
			allot__row_usage u = {
				.service = c->service,
				.key = c->quota,
				.second = c->second > 0 ?
				    (uint64_t) c->second :
				    0,
				.consumed = c->admitted,
				.denied = c->denied,
			};
			allot__row_shadow x = {
				.second = u.second,
				.shadow_denied = c->shadow_denied,
				.service = c->service,
				.quota = c->quota,
			};
			rc = allot__store_put_usage(st, &u, &x);
		}
		/* The record's mark, once per record: after its last row. */
		bool last = i + 1 == n || rows[i + 1].id != c->id ||
		    rows[i + 1].incarnation != c->incarnation;
		if (rc == SQLITE_OK && last) {
			s = st->stmt[S_ACCOUNT];
			sqlite3_bind_int64(
			    s, 1, (sqlite3_int64) c->incarnation);
			sqlite3_bind_int64(s, 2, (sqlite3_int64) c->id);
			sqlite3_bind_int64(s, 3, c->second * 1000);
			rc = allot__store_step(s);
		}
	}
	return rc;
}

int
allot__store_write_counts(allot__store *st, struct batch *b)
{
	if (b->ncounts == 0)
		return SQLITE_OK;
	/* `committed` changes on this thread only: read without the lock. */
	if (allot__marks_copy(&st->scratch, &st->committed) != ALLOT_OK)
		return SQLITE_NOMEM;
	uint64_t overlaps = 0;
	b->ncounts = allot__marks_filter(
	    &st->scratch, b->counts, b->ncounts, &overlaps);
	st->scratch_ready = true;
	return allot__store_put_counts(st, b->counts, b->ncounts);
}

void
allot__store_counts_written(allot__store *st, bool ok)
{
	if (!st->scratch_ready)
		return;
	st->scratch_ready = false;
	if (!ok)
		return;
	pthread_mutex_lock(&st->mu);
	allot__marks tmp = st->committed;
	st->committed = st->scratch;
	st->scratch = tmp;
	pthread_mutex_unlock(&st->mu);
}

void
allot__store_counts_applied(
    allot__store *st, const allot__row_count *rows, size_t n)
{
	pthread_mutex_lock(&st->mu);
	for (size_t i = 0; i < n; i++) {
		if (rows[i].id == 0)
			continue;
		(void) allot__marks_set(&st->committed, rows[i].incarnation,
		    rows[i].id, rows[i].second);
		(void) allot__marks_set(&st->booked, rows[i].incarnation,
		    rows[i].id, rows[i].second);
	}
	pthread_mutex_unlock(&st->mu);
}

int
allot__store_load_marks(allot__store *st)
{
	sqlite3_stmt *s = st->stmt[S_LOAD_ACCOUNTS];
	int rc;
	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		uint64_t inc = (uint64_t) sqlite3_column_int64(s, 0);
		uint64_t id = (uint64_t) sqlite3_column_int64(s, 1);
		int64_t sec = sqlite3_column_int64(s, 2) / 1000;
		if (allot__marks_set(&st->committed, inc, id, sec) !=
		        ALLOT_OK ||
		    allot__marks_set(&st->booked, inc, id, sec) != ALLOT_OK) {
			sqlite3_reset(s);
			return ALLOT_ENOMEM;
		}
	}
	sqlite3_reset(s);
	return rc == SQLITE_DONE ? ALLOT_OK : ALLOT_EIO;
}
