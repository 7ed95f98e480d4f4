/* SPDX-License-Identifier: MIT */
/*
 * The store's reads at start-up (store.h, "restore"): the replicas that
 * were live when the last run stopped or crashed, and the last recorded
 * global bucket level of each quota, handed to the registry through
 * callbacks, and the config recorded last (whose epoch a restart keeps). Only
 * committed rows are read, with statements prepared at open; nothing here
 * writes.
 */
#include "store_int.h"

#include <stdlib.h>
#include <string.h>

int
allot__store_restore(allot__store *st,
    void (*on_replica)(void *ctx, const allot__store_replica *r),
    void (*on_level)(void *ctx, const allot__store_level *l), void *ctx)
{
	if (st == NULL)
		return ALLOT_EINVAL;
	sqlite3_stmt *s = st->stmt[S_RESTORE_REPLICAS];
	int rc;
	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		allot__store_replica r = {
			.session = (uint64_t) sqlite3_column_int64(s, 0),
			.replica_id = (const char *) sqlite3_column_text(s, 1),
			.service = (const char *) sqlite3_column_text(s, 2),
			.last_seen_ms = sqlite3_column_int64(s, 3),
		};
		if (on_replica != NULL)
			on_replica(ctx, &r);
	}
	sqlite3_reset(s);
	if (rc != SQLITE_DONE)
		goto fail;
	s = st->stmt[S_RESTORE_LEVELS];
	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		allot__store_level l = {
			.service = (const char *) sqlite3_column_text(s, 0),
			.quota = (const char *) sqlite3_column_text(s, 1),
			.level = sqlite3_column_double(s, 2),
			.at_ms = sqlite3_column_int64(s, 3),
		};
		if (on_level != NULL)
			on_level(ctx, &l);
	}
	sqlite3_reset(s);
	if (rc != SQLITE_DONE)
		goto fail;
	return ALLOT_OK;
fail:
	allot__log(&st->lg, ALLOT_LOG_ERR, "ALLOT-STORE-FAIL",
	    "store %s: reading state to restore failed: %s", st->path,
	    sqlite3_errstr(rc));
	return ALLOT_EIO;
}

int
allot__store_last_config(allot__store *st, uint64_t *ret_epoch,
    uint64_t *ret_digest, char **ret_content)
{
	if (st == NULL)
		return ALLOT_EINVAL;
	sqlite3_stmt *s = st->stmt[S_LAST_CONFIG];
	int rc = sqlite3_step(s);
	int rv = ALLOT_ENOENT;
	if (rc == SQLITE_ROW) {
		const char *hex = (const char *) sqlite3_column_text(s, 1);
		const char *text = (const char *) sqlite3_column_text(s, 2);
		char *copy = strdup(text != NULL ? text : "");
		if (copy == NULL) {
			rv = ALLOT_ENOMEM;
		} else {
			*ret_epoch = (uint64_t) sqlite3_column_int64(s, 0);
			*ret_digest = hex != NULL ? strtoull(hex, NULL, 16) :
			                            0;
			*ret_content = copy;
			rv = ALLOT_OK;
		}
	} else if (rc != SQLITE_DONE) {
		allot__log(&st->lg, ALLOT_LOG_ERR, "ALLOT-STORE-FAIL",
		    "store %s: reading the last config failed: %s", st->path,
		    sqlite3_errstr(rc));
		rv = ALLOT_EIO;
	}
	sqlite3_reset(s);
	return rv;
}

int
allot__store_last_live(allot__store *st,
    void (*fn)(void *ctx, const char *service, uint32_t n), void *ctx)
{
	if (st == NULL)
		return ALLOT_EINVAL;
	static const char sql[] =
	    "SELECT u.service, max(u.live_replicas) FROM usage u JOIN "
	    "(SELECT service, max(at) AS at FROM usage GROUP BY service) m "
	    "ON u.service = m.service AND u.at = m.at GROUP BY u.service";
	sqlite3_stmt *s = NULL;
	int rc = sqlite3_prepare_v2(st->db, sql, -1, &s, NULL);
	while (rc == SQLITE_OK && (rc = sqlite3_step(s)) == SQLITE_ROW) {
		const char *svc = (const char *) sqlite3_column_text(s, 0);
		int64_t n = sqlite3_column_int64(s, 1);
		if (svc != NULL && n > 0)
			fn(ctx, svc,
			    n > UINT32_MAX ? UINT32_MAX : (uint32_t) n);
		rc = SQLITE_OK;
	}
	sqlite3_finalize(s);
	if (rc == SQLITE_DONE || rc == SQLITE_OK)
		return ALLOT_OK;
	allot__log(&st->lg, ALLOT_LOG_ERR, "ALLOT-STORE-FAIL",
	    "store %s: reading the last live replica counts failed: %s",
	    st->path, sqlite3_errstr(rc));
	return ALLOT_EIO;
}
