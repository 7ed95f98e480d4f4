/* SPDX-License-Identifier: MIT */
/*
 * A member's address in the Raft configuration is "RAFT_ADDR|AGENT_URL":
 * where members reach its log (host:port) and where agents reach its
 * protocol server. Keeping both in libraft's own configuration means the
 * agent URLs are replicated, snapshotted and changed with the membership
 * itself (raft_add carries them), so every member can answer NOT_LEADER
 * with the leader's URL and list every member's, with nothing to keep in
 * step beside it.
 *
 * libraft hands the address to its transport as it is, so the transport
 * is wrapped: allot__caddr_wrap gives raft_uv a transport that strips
 * "|AGENT_URL" before the inner one (raft_uv_tcp, or the TLS transport)
 * parses, listens or connects.
 */
#ifndef ALLOT_COORDINATOR_CONSENSUS_ADDR_H
#define ALLOT_COORDINATOR_CONSENSUS_ADDR_H

#include <raft.h>
#include <raft/uv.h>
#include <stdbool.h>
#include <stddef.h>

#define ALLOT__CADDR_SEP '|'

/* Splits `addr` into its raft part (copied into `raft`, `cap` bytes) and
 * its agent URL (a pointer into `addr`, "" when absent). False when the
 * raft part does not fit. */
bool allot__caddr_split(
    const char *addr, char *raft, size_t cap, const char **ret_url);

/* Joins them into `out`; false when it does not fit or a part is empty
 * or holds the separator. */
bool allot__caddr_join(
    const char *raft, const char *url, char *out, size_t cap);

/* The wrapper: `outer` forwards to `inner` (already initialised), with
 * the addresses stripped. Its state is allocated here and freed when the
 * outer transport's close completes. ALLOT_OK or ALLOT_ENOMEM. */
int allot__caddr_wrap(
    struct raft_uv_transport *outer, struct raft_uv_transport *inner);

/* Frees the wrapper's state, once raft_uv has closed the transport. */
void allot__caddr_free(struct raft_uv_transport *outer);

#endif
