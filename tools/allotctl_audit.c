/* SPDX-License-Identifier: MIT */
/*
 * allotctl audit: the standard audit queries (docs/operations.md's
 * cookbook) on allotd store files, opened read-only through the SQLite C
 * API. Several stores are ATTACHed to one in-memory connection and each
 * query becomes a UNION ALL over them, with a first column "db" naming
 * the file. Every file is checked to be an allot store (application_id)
 * new enough to have the audit views before anything is printed.
 */
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sqlite3.h>

#include "allotctl.h"

#define ALLOT_APPLICATION_ID 0x414c4f54 /* "ALOT", schema/001 */
#define AUDIT_VIEWS_VERSION 2 /* schema/002_audit_views.sql */
#define NQUERIES (sizeof audit_queries / sizeof audit_queries[0])

/* The standard audit questions (docs/operations.md's cookbook), each a
 * query on one store schema "S". Several stores are combined with
 * UNION ALL, a "db" column naming the file. */
static const struct audit_query {
	const char *title;
	const char *sql; /* %1$s is the schema, e.g. "db0" */
	const char *order; /* applied to the union */
	int version; /* the store schema version that has what it reads */
} audit_queries[] = {
	{ "Configs loaded",
	    "SELECT epoch, digest, path, bytes, loaded FROM %1$s.v_configs",
	    "loaded", AUDIT_VIEWS_VERSION },
	{ "Consumption per caller (tokens)",
	    "SELECT service, quota, sum(admitted) AS admitted, sum(denied) AS "
	    "denied, round(100.0 * sum(denied) / max(sum(admitted) + "
	    "sum(denied), 1), 2) AS denied_pct, count(*) AS seconds, "
	    "max(live_replicas) AS max_replicas FROM %1$s.usage "
	    "GROUP BY service, quota",
	    "admitted DESC", AUDIT_VIEWS_VERSION },
	{ "Who was denied",
	    "SELECT service, quota, denied, admitted, denied_pct, "
	    "denied_per_s, first_denied, last_denied FROM %1$s.v_denied",
	    "denied DESC", AUDIT_VIEWS_VERSION },
	{ "Replicas per service",
	    "SELECT service, count(*) AS sessions, sum(left_at IS NULL) AS "
	    "live, sum(left_why IS 'leave') AS left, sum(left_why IS "
	    "'expired') AS expired, sum(left_why IS 'replaced') AS replaced, "
	    "sum(left_why IS 'shutdown') AS shutdown FROM %1$s.replicas "
	    "GROUP BY service",
	    "service", AUDIT_VIEWS_VERSION },
	{ "Share changes per caller",
	    "SELECT service, quota, count(*) AS changes, count(DISTINCT "
	    "session) AS replicas, round(min(rate), 3) AS min_rate, "
	    "round(max(rate), 3) AS max_rate FROM %1$s.share_history "
	    "GROUP BY service, quota",
	    "service, quota", AUDIT_VIEWS_VERSION },
	{ "Live replicas (as the coordinator last knew)",
	    "SELECT service, replica_id, session, host, agent_version, "
	    "last_seen, silent_s FROM %1$s.v_live_replicas",
	    "service, replica_id", AUDIT_VIEWS_VERSION },
	{ "Quota changes (who, what, why)",
	    "SELECT at, who, service, quota, action, before, after, reason, "
	    "epoch FROM %1$s.v_quota_changes",
	    "at DESC", 3 },
	{ "Shadow and candidate quotas (what enforcing them would deny)",
	    "SELECT service, quota, candidate_rate, admitted, denied, "
	    "shadow_denied_pct, candidate_denied_pct, first, last "
	    "FROM %1$s.v_shadow",
	    "service, quota", 4 },
	{ "Events", "SELECT at, kind, subject, detail FROM %1$s.v_events",
	    "at DESC", AUDIT_VIEWS_VERSION },
};

/* "file:" URI for a path, read-only, every special byte escaped. */
static char *
ro_uri(const char *path)
{
	size_t n = strlen(path);
	char *u = ctl_calloc(n * 3 + 32, 1);
	char *p = u + sprintf(u, "file:");
	for (const unsigned char *s = (const unsigned char *) path; *s; s++) {
		if (isalnum(*s) || strchr("/-._~", *s) != NULL)
			*p++ = (char) *s;
		else
			p += sprintf(p, "%%%02X", *s);
	}
	strcpy(p, "?mode=ro");
	return u;
}

/* Run one query and print its table: "== TITLE", the query with
 * --sql, then the rows or "(no rows)". */
static int
audit_print(sqlite3 *db, const char *title, const char *sql, bool show_sql)
{
	sqlite3_stmt *st = NULL;
	if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
		ctl_fail("%s: %s", title, sqlite3_errmsg(db));
		return EXIT_FAIL;
	}
	int ncol = sqlite3_column_count(st);
	char *align = ctl_calloc((size_t) ncol + 1, 1);
	memset(align, 'l', (size_t) ncol);
	char **row = ctl_calloc((size_t) ncol, sizeof *row);
	ctl_table t;
	ctl_table_init(&t, align);
	for (int i = 0; i < ncol; i++)
		row[i] = ctl_strdup(sqlite3_column_name(st, i));
	ctl_table_row_v(&t, row);
	int rc;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		for (int i = 0; i < ncol; i++) {
			int ty = sqlite3_column_type(st, i);
			const unsigned char *v = sqlite3_column_text(st, i);
			/* The table reads `align` when it prints, so the
			 * header cell of a numeric column aligns with its
			 * numbers. */
			if (ty == SQLITE_INTEGER || ty == SQLITE_FLOAT)
				align[i] = 'r';
			row[i] = ctl_strdup(ty == SQLITE_NULL || v == NULL ?
			        "-" :
			        (const char *) v);
		}
		ctl_table_row_v(&t, row);
	}
	printf("== %s\n", title);
	if (show_sql)
		printf("-- %s;\n", sql);
	if (rc != SQLITE_DONE) {
		ctl_fail("%s: %s", title, sqlite3_errmsg(db));
		rc = EXIT_FAIL;
	} else {
		if (t.nrows == 1)
			printf("(no rows)\n");
		else
			ctl_table_print(&t, stdout);
		rc = 0;
	}
	putchar('\n');
	sqlite3_finalize(st);
	ctl_table_free(&t);
	free(row);
	free(align);
	return rc;
}

/* Run one query into a JSON object: {"title", "sql", "rows": [{column:
 * value}...]}, numbers as numbers, NULL as null (--json). */
static int
audit_json(sqlite3 *db, const char *title, const char *sql, json_object *out)
{
	sqlite3_stmt *st = NULL;
	if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
		ctl_fail("%s: %s", title, sqlite3_errmsg(db));
		return EXIT_FAIL;
	}
	json_object *q = json_object_new_object();
	json_object *rows = json_object_new_array();
	json_object_object_add(q, "title", json_object_new_string(title));
	json_object_object_add(q, "sql", json_object_new_string(sql));
	int ncol = sqlite3_column_count(st);
	int rc;
	while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
		json_object *r = json_object_new_object();
		for (int i = 0; i < ncol; i++) {
			json_object *v = NULL;
			switch (sqlite3_column_type(st, i)) {
			case SQLITE_INTEGER:
				v = json_object_new_int64(
				    sqlite3_column_int64(st, i));
				break;
			case SQLITE_FLOAT:
				v = json_object_new_double(
				    sqlite3_column_double(st, i));
				break;
			case SQLITE_NULL: break;
			default:
				v = json_object_new_string(
				    (const char *) sqlite3_column_text(st, i));
			}
			json_object_object_add(
			    r, sqlite3_column_name(st, i), v);
		}
		json_object_array_add(rows, r);
	}
	json_object_object_add(q, "rows", rows);
	json_object_array_add(out, q);
	if (rc != SQLITE_DONE)
		ctl_fail("%s: %s", title, sqlite3_errmsg(db));
	sqlite3_finalize(st);
	return rc == SQLITE_DONE ? 0 : EXIT_FAIL;
}

/* PRAGMA db<i>.<name>, an integer. */
static bool
pragma_int(sqlite3 *db, int i, const char *name, int *ret)
{
	char *sql = ctl_asprintf("PRAGMA db%d.%s", i, name);
	sqlite3_stmt *st = NULL;
	int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
	free(sql);
	if (rc == SQLITE_OK)
		rc = sqlite3_step(st);
	if (rc == SQLITE_ROW)
		*ret = sqlite3_column_int(st, 0);
	sqlite3_finalize(st);
	return rc == SQLITE_ROW;
}

/* ATTACH `path` read-only as schema db<i> and check that it is an allot
 * store new enough to have the audit views; its schema version in
 * *ret_version. False after saying why not. */
static bool
attach_store(sqlite3 *db, int i, const char *path, int *ret_version)
{
	if (access(path, R_OK) != 0) {
		ctl_fail("cannot open %s: %s", path, ctl_errstr(errno));
		return false;
	}
	char *uri = ro_uri(path);
	char *sql = ctl_asprintf("ATTACH ?1 AS db%d", i);
	sqlite3_stmt *st = NULL;
	int src = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
	if (src == SQLITE_OK)
		sqlite3_bind_text(st, 1, uri, -1, SQLITE_TRANSIENT);
	if (src == SQLITE_OK)
		src = sqlite3_step(st);
	sqlite3_finalize(st);
	free(sql);
	free(uri);
	if (src != SQLITE_DONE) {
		ctl_fail("cannot open %s: %s", path, sqlite3_errmsg(db));
		return false;
	}
	int app = 0, ver = 0;
	if (!pragma_int(db, i, "application_id", &app) ||
	    !pragma_int(db, i, "user_version", &ver)) {
		ctl_fail("%s is not a readable SQLite database: %s", path,
		    sqlite3_errmsg(db));
		return false;
	}
	if (app != ALLOT_APPLICATION_ID) {
		ctl_fail("%s is not an allot store (application_id 0x%08x)",
		    path, (unsigned) app);
		return false;
	}
	if (ver < AUDIT_VIEWS_VERSION) {
		ctl_fail("%s has schema version %d, without the audit views "
		         "(version %d); open it once with a current allotd",
		    path, ver, AUDIT_VIEWS_VERSION);
		return false;
	}
	*ret_version = ver;
	return true;
}

/* One audit query over every attached store whose schema has what it
 * reads (`version`): each store's query, with a "db" column when there
 * are several, joined by UNION ALL, ordered and limited. The caller
 * frees the text; NULL when no store is new enough. */
static char *
union_query(const struct audit_query *aq, const ctl *c, const int *version)
{
	int ndb = c->npos;
	char *sql = NULL;
	for (int i = 0; i < ndb; i++) {
		if (version[i] < aq->version)
			continue;
		char schema[16];
		snprintf(schema, sizeof schema, "db%d", i);
		char *one = NULL;
		/* The query text is ours (audit_queries), only the schema
		 * name is substituted. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
		if (asprintf(&one, aq->sql, schema) < 0)
			ctl_die_oom();
#pragma GCC diagnostic pop
		if (ndb > 1) {
			/* The file's name as a string literal. */
			char *quoted = sqlite3_mprintf("%Q", c->pos[i]);
			if (quoted == NULL)
				ctl_die_oom();
			char *label = ctl_asprintf(
			    "SELECT %s AS db, * FROM (%s)", quoted, one);
			sqlite3_free(quoted);
			free(one);
			one = label;
		}
		char *joined = sql ?
		    ctl_asprintf("%s UNION ALL %s", sql, one) :
		    ctl_strdup(one);
		free(sql);
		free(one);
		sql = joined;
	}
	if (sql == NULL)
		return NULL;
	char *full = ctl_asprintf("SELECT * FROM (%s) ORDER BY %s%s LIMIT %ld",
	    sql, ndb > 1 ? "db, " : "", aq->order, c->limit);
	free(sql);
	return full;
}

int
ctl_cmd_audit(const ctl *c)
{
	sqlite3 *db = NULL;
	int *version = NULL;
	int rc = EXIT_FAIL;
	if (sqlite3_open_v2(":memory:", &db,
	        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_URI,
	        NULL) != SQLITE_OK) {
		ctl_fail("cannot start SQLite: %s",
		    db ? sqlite3_errmsg(db) : "out of memory");
		goto out;
	}
	sqlite3_busy_timeout(db, 2000);
	version = ctl_calloc((size_t) c->npos, sizeof *version);
	for (int i = 0; i < c->npos; i++)
		if (!attach_store(db, i, c->pos[i], &version[i]))
			goto out;
	json_object *out = c->json ? json_object_new_array() : NULL;
	if (c->npos > 1 && out == NULL) {
		printf("stores:");
		for (int i = 0; i < c->npos; i++)
			printf(
			    " %s%s", c->pos[i], i + 1 < c->npos ? "," : "\n");
		putchar('\n');
	}
	rc = 0;
	for (size_t q = 0; q < NQUERIES; q++) {
		char *sql = union_query(&audit_queries[q], c, version);
		if (sql == NULL) {
			if (out == NULL)
				printf(
				    "== %s\n(needs store schema version %d: "
				    "open the file once with a current "
				    "allotd)\n\n",
				    audit_queries[q].title,
				    audit_queries[q].version);
			continue;
		}
		if ((out != NULL ?
		            audit_json(db, audit_queries[q].title, sql, out) :
		            audit_print(db, audit_queries[q].title, sql,
		                c->show_sql)) != 0)
			rc = EXIT_FAIL;
		free(sql);
	}
	if (out != NULL)
		ctl_print_json(out);
out:
	free(version);
	sqlite3_close(db);
	return rc;
}
