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
