/* SPDX-License-Identifier: MIT */
/*
 * The adversary suite's shared parts (tests/test_adversary.c has the
 * suite): a real allotd with the HTTP limits the attacks run against,
 * the honest agent's config and keys, the one-JSON-line-per-attack
 * report docs/reliability.md's table is built from, and the suite's
 * TCases, to which each file adds its own attacks (test_adversary.c:
 * exhaustion of allotd's connections, memory and message budget;
 * adversary_lies.c: valid messages that lie).
 */
#ifndef ALLOT_TESTS_ADVERSARY_FIXTURE_H
#define ALLOT_TESTS_ADVERSARY_FIXTURE_H

#include <check.h>
#include <stdbool.h>
#include <sys/types.h>

#include "adv_report.h"
#include "allotd.h"

#define ADV_SVC "checkout"
/* allotd's --http-max-per-address, --http-max-connections and
 * --http-idle-timeout (seconds). */
#define ADV_PER_ADDRESS 8
#define ADV_MAX_CONNS 24
#define ADV_IDLE_S 2

/* Key 0 "default" (10/s, burst 20) and key 1 "spiffe://test/a" (400/s,
 * burst 800) of service ADV_SVC. */
extern const char adv_cfg_text[];
extern const char *const adv_keys[2];

/* allotd under attack: proto_client.h's fixture. */
typedef pc_coord adv_coord;

/* allotd with `text` as its config, the HTTP limits above, and `extra`
 * (NULL-terminated, may be NULL) after the common options. */
void adv_coord_start_with(
    adv_coord *c, const char *text, const char *const *extra);
/* The same with adv_cfg_text and nothing extra. */
void adv_coord_start(adv_coord *c);
/* Stops allotd, removes its directory, and fails the test if allotd's
 * log has a sanitizer report. */
void adv_coord_stop(adv_coord *c);

/* A new agent `id` registers with `c` and syncs once. */
void adv_assert_agent_joins(const adv_coord *c, const char *id);

/* The suite's TCases, one per attack (the two HTTP attacks share one),
 * made by test_adversary.c in the order of docs/reliability.md's table;
 * each file adds its own tests to them. */
typedef struct adversary_tcases {
	TCase *http;
	TCase *key_flood;
	TCase *names;
	TCase *fake_replicas;
	TCase *fake_replicas_elsewhere;
	TCase *peer_replicas;
	TCase *tables;
	TCase *plausibility;
	TCase *same_ip_flood;
	TCase *example_service;
	TCase *forged_probes;
} adversary_tcases;

void adversary_lies_tests(const adversary_tcases *tc);

#endif
