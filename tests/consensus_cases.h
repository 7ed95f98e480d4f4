/* SPDX-License-Identifier: MIT */
/*
 * The consensus suite's parts (tests/test_consensus.c has the suite and
 * the raft_fixture cases): the entries and the state machine alone
 * (consensus_state.c), and three members on raft_uv over loopback
 * (consensus_uv.c).
 */
#ifndef ALLOT_TESTS_CONSENSUS_CASES_H
#define ALLOT_TESTS_CONSENSUS_CASES_H

#include <check.h>
#include <stdint.h>

#include "consensus/consensus_entry.h"

/* A CONFIG entry of `text` for config epoch `epoch` (its digest derived
 * from the text's length: enough to tell entries apart). */
allot__centry consensus_config_entry(const char *text, uint64_t epoch);

TCase *consensus_state_cases(void);
TCase *consensus_uv_cases(void);

#endif
