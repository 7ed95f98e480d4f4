/* SPDX-License-Identifier: MIT */
/*
 * The coordinator suite's harness (declared in coord_harness.h): the
 * shared quota files, a real allotd per test under one directory that the
 * runner process makes and removes (a failed test's allotd is killed at
 * exit), what allotd logged, stored and exported, and simulated replicas
 * over the raw protocol client.
 */
#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "allotd.h"
#include "coord_harness.h"
#include "proc.h"
#include "proto_client.h"

const char coord_cfg_good[sizeof COORD_CFG_GOOD] = COORD_CFG_GOOD;

/* The same with caller a halved. */
const char coord_cfg_halved[sizeof COORD_CFG_HALVED] = COORD_CFG_HALVED;

/* Key ids: 0 default, 1 a, 2 b, 3 an identity without a quota. */
const char *const coord_keys[] = { "default", QA, QB, "spiffe://test/nobody" };

/* ------------------------------------------------------------------ */
/* the daemon under test                                               */
/* ------------------------------------------------------------------ */

/* Every test's files live under one directory that the parent process
 * (check forks a child per test) creates and removes, so a test that
 * fails half-way leaves nothing behind; allotd itself dies with its test
 * (PR_SET_PDEATHSIG). */
static char base_dir[64];

void
coord_suite_setup(void)
{
	snprintf(base_dir, sizeof base_dir, "/tmp/allot-coord-XXXXXX");
	if (mkdtemp(base_dir) == NULL) {
		perror("mkdtemp");
		exit(EXIT_FAILURE);
	}
}

void
coord_suite_teardown(void)
{
	pc_rm_rf(base_dir);
}

void
coord_init(coord *c, const char *cfg_text)
{
	char prefix[80];
	snprintf(prefix, sizeof prefix, "%s/t", base_dir);
	pc_coord_init(c, prefix, cfg_text);
}

/* Start allotd; `extra` is a NULL-terminated list of further arguments.
 * Waits (bounded) until /healthz answers. */
void
coord_start(coord *c, const char *const *extra)
{
	const char *const args[] = { "--interval-ms", "100",
		"--expiry-intervals", "5", "--log-level", "debug", NULL };
	pc_coord_spawn(c, args, extra);
}

void
coord_done(coord *c)
{
	pc_coord_done(c, 0);
}

bool
coord_log_contains(const coord *c, const char *needle)
{
	char *text = pc_read_file(c->log);
	bool found = text != NULL && strstr(text, needle) != NULL;
	free(text);
	return found;
}

static char *
sql(const coord *c, const char *query)
{
	char cmd[1024];
	snprintf(cmd, sizeof cmd, "sqlite3 -batch '%s' \"%s\"", c->db, query);
	return pc_shell(cmd);
}

void
coord_assert_sql(const coord *c, const char *query, const char *want)
{
	char *got = sql(c, query);
	ck_assert_msg(got != NULL, "sqlite3 failed on: %s", query);
	ck_assert_msg(strcmp(got, want) == 0, "%s: got \"%s\", want \"%s\"",
	    query, got, want);
	free(got);
}

double
coord_metric(const coord *c, const char *series)
{
	return pc_metric_get(c->http, series);
}

/* ------------------------------------------------------------------ */
/* helpers on simulated replicas                                       */
/* ------------------------------------------------------------------ */

void
coord_join(pc_replica *r, const coord *c, const char *id)
{
	memset(r, 0, sizeof *r);
	int rc = pc_replica_join(r, c->url, id, SVC, coord_keys, NKEYS);
	ck_assert_msg(rc == 0, "register %s failed: %d", id, rc);
}

void
coord_sync_ok(pc_replica *r)
{
	pc_report rep = { .key = 1, .consumed = 1, .held = 10, .demand = 5 };
	int rc = pc_replica_sync(r, &rep, 1, NULL);
	ck_assert_msg(rc == 0, "sync of %s failed: %d", r->id, rc);
}

void
coord_expect_error(Allot__V1__Envelope *e, int code)
{
	ck_assert_msg(e != NULL, "no answer");
	ck_assert_msg(pc_error_code(e) == code, "got %d (body %d), want %d",
	    pc_error_code(e), (int) e->body_case, code);
	ck_assert_ptr_nonnull(e->error->message);
	ck_assert_int_gt((int) strlen(e->error->message), 0);
	ck_assert_uint_eq(e->version, 1);
	pc_free(e);
}
