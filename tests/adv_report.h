/* SPDX-License-Identifier: MIT */
/*
 * One line per replayed attack for docs/reliability.md's adversary table
 * (scripts/reliability): the adversary suite and the Raft transport's
 * suite (test_raft_tls.c) report through it.
 */
#ifndef ALLOT_TESTS_ADV_REPORT_H
#define ALLOT_TESTS_ADV_REPORT_H

#include <stdbool.h>

/* One JSON line per attack to $ALLOT_ADVERSARY_REPORT, when set
 * (scripts/reliability builds the adversary table from them): the
 * attack, the honest figure the issue observed before, and after. The
 * figure also goes to stderr. */
void adv_report(const char *attack, const char *target, const char *before,
    bool ok, const char *fmt, ...) __attribute__((format(printf, 5, 6)));

#endif
