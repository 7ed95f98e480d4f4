/* SPDX-License-Identifier: MIT */
/*
 * The coordinator suite's shared parts (tests/test_coordinator.c has the
 * suite): the quota files and identities the cases share, a real allotd
 * started on free loopback ports with a temporary quota file and
 * database (and killed at exit when a test fails half-way), what it
 * logged, stored (through the sqlite3 shell) and exported in /metrics,
 * and simulated replicas joining and syncing over the raw protocol
 * client (proto_client.h).
 */
#ifndef ALLOT_TESTS_COORD_HARNESS_H
#define ALLOT_TESTS_COORD_HARNESS_H

#include <check.h>
#include <sys/types.h>

#include "allotd.h"
#include "proto_client.h"

#define SVC "checkout"
#define QA "spiffe://test/a"
#define QB "spiffe://test/b"
#define RA 400.0
#define BA 800.0
#define EPS 1e-6

/* The quota files' texts are here, not only in coord_harness.c, so that
 * every file knows the arrays' sizes (test_config_too_big pads a copy).
 *
 * The default quota, caller a at RA tokens/s with burst BA, caller b at
 * 120/s with burst 240. */
#define COORD_CFG_GOOD                   \
	"quotas:\n"                      \
	"  default:\n"                   \
	"    tokens_per_second: 10\n"    \
	"    burst: 20\n"                \
	"    shared: true\n"             \
	"    priority: low\n"            \
	"  callers:\n"                   \
	"    - identity: \"" QA "\"\n"   \
	"      tokens_per_second: 400\n" \
	"      burst: 800\n"             \
	"      priority: standard\n"     \
	"    - identity: \"" QB "\"\n"   \
	"      tokens_per_second: 120\n" \
	"      burst: 240\n"             \
	"      priority: batch\n"
extern const char coord_cfg_good[sizeof COORD_CFG_GOOD];
/* The same with caller a halved. */
#define COORD_CFG_HALVED                 \
	"quotas:\n"                      \
	"  default:\n"                   \
	"    tokens_per_second: 10\n"    \
	"    burst: 20\n"                \
	"    shared: true\n"             \
	"    priority: low\n"            \
	"  callers:\n"                   \
	"    - identity: \"" QA "\"\n"   \
	"      tokens_per_second: 200\n" \
	"      burst: 400\n"             \
	"      priority: standard\n"     \
	"    - identity: \"" QB "\"\n"   \
	"      tokens_per_second: 120\n" \
	"      burst: 240\n"             \
	"      priority: batch\n"
extern const char coord_cfg_halved[sizeof COORD_CFG_HALVED];
/* Key ids: 0 default, 1 a, 2 b, 3 an identity without a quota. */
extern const char *const coord_keys[];
#define NKEYS 4

/* The daemon under test: proto_client.h's fixture (its `sock` is the
 * path of an ipc listener some cases add, `ipc` its URL). */
typedef pc_coord coord;

/* The unchecked fixture of the allotd cases: one directory, made in the
 * runner process, under which every test's files live. */
void coord_suite_setup(void);
void coord_suite_teardown(void);

/* A fresh directory for `c` with `cfg_text` as its quota file. */
void coord_init(coord *c, const char *cfg_text);
/* Start allotd; `extra` is a NULL-terminated list of further arguments.
 * Waits (bounded) until /healthz answers. */
void coord_start(coord *c, const char *const *extra);
/* Kill allotd if it still runs, remove its files; fails the test when
 * its log holds a sanitizer report. */
void coord_done(coord *c);
bool coord_log_contains(const coord *c, const char *needle);
/* `query` through the sqlite3 shell on allotd's database equals `want`. */
void coord_assert_sql(const coord *c, const char *query, const char *want);
/* One series of allotd's /metrics (NaN when unavailable). */
double coord_metric(const coord *c, const char *series);

/* A simulated replica `id` registered with SVC's keys; asserts it. */
void coord_join(pc_replica *r, const coord *c, const char *id);
/* One Sync with the next seq and a small report of quota a; asserts it
 * was answered without an error. */
void coord_sync_ok(pc_replica *r);
/* `e` is an Error of `code` with a message (and is freed). */
void coord_expect_error(Allot__V1__Envelope *e, int code);

/* Each case file adds its cases to the suite's allotd TCase (the one with
 * the fixture); coord_alloc_cases to the in-process "alloc" TCase. */
void coord_share_cases(TCase *tc);
void coord_alloc_cases(TCase *tc);
void coord_wire_cases(TCase *tc);
void coord_config_cases(TCase *tc);

#endif
