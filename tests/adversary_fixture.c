/* SPDX-License-Identifier: MIT */
/*
 * The adversary suite's fixture (adversary_fixture.h): allotd started
 * with the HTTP limits the attacks run against and stopped with its log
 * checked, the report of each attack's figures, and an honest agent's
 * join.
 */
#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adversary_fixture.h"
#include "allotd.h"
#include "proto_client.h"

const char adv_cfg_text[] = "quotas:\n"
                            "  default:\n"
                            "    tokens_per_second: 10\n"
                            "    burst: 20\n"
                            "  callers:\n"
                            "    - identity: \"spiffe://test/a\"\n"
                            "      tokens_per_second: 400\n"
                            "      burst: 800\n";

const char *const adv_keys[2] = { "default", "spiffe://test/a" };

void
adv_coord_start_with(adv_coord *c, const char *text, const char *const *extra)
{
	pc_coord_init(c, "/tmp/allot-adversary", text);
	char maxc[16], pera[16], idle[16];
	snprintf(maxc, sizeof maxc, "%d", ADV_MAX_CONNS);
	snprintf(pera, sizeof pera, "%d", ADV_PER_ADDRESS);
	snprintf(idle, sizeof idle, "%d", ADV_IDLE_S);
	const char *const args[] = { "--http-max-connections", maxc,
		"--http-max-per-address", pera, "--idle-timeout", idle,
		"--interval-ms", "100", NULL };
	pc_coord_spawn(c, args, extra);
}

void
adv_coord_start(adv_coord *c)
{
	adv_coord_start_with(c, adv_cfg_text, NULL);
}

void
adv_coord_stop(adv_coord *c)
{
	pc_coord_done(c, 5000);
}

void
adv_assert_agent_joins(const adv_coord *c, const char *id)
{
	pc_replica r;
	memset(&r, 0, sizeof r);
	int rc = pc_replica_join(&r, c->url, id, ADV_SVC, adv_keys, 2);
	ck_assert_msg(rc == 0, "a new agent was refused (%d)", rc);
	ck_assert_int_eq(pc_replica_sync(&r, NULL, 0, NULL), 0);
	pc_replica_close(&r);
}
