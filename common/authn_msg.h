/* SPDX-License-Identifier: MIT */
/*
 * The byte string an agent signs to prove its identity in a Register
 * (Register.identity, docs/protocol.md "Identity"), built the same way by
 * the agent (agent/sign.c) and allotd (coordinator/dispatch/authn.c):
 *
 *   "allot-register-v1"            17 bytes, no terminator
 *   u16 len, replica_id            big-endian length, then the bytes
 *   u16 len, service
 *   u16 len, audience              the coordinator URL the agent dialed
 *   u64 time_ms                    big-endian, Unix time in ms
 *   nonce                          ALLOT__AUTHN_NONCE bytes
 *
 * Length-prefixed fields leave no two inputs with the same encoding.
 */
#ifndef ALLOT_COMMON_AUTHN_MSG_H
#define ALLOT_COMMON_AUTHN_MSG_H

#include <stddef.h>
#include <stdint.h>

#define ALLOT__AUTHN_TAG "allot-register-v1"
#define ALLOT__AUTHN_NONCE 16u
#define ALLOT__AUTHN_FIELD_MAX 1024u
#define ALLOT__AUTHN_MSG_MAX                                                  \
	(sizeof ALLOT__AUTHN_TAG - 1 + 3 * (2 + ALLOT__AUTHN_FIELD_MAX) + 8 + \
	    ALLOT__AUTHN_NONCE)

/* Write the message into `buf` (at least ALLOT__AUTHN_MSG_MAX bytes) and
 * return its length; 0 when a string is NULL or longer than
 * ALLOT__AUTHN_FIELD_MAX. */
size_t allot__authn_msg(unsigned char *buf, const char *replica_id,
    const char *service, const char *audience, uint64_t time_ms,
    const unsigned char *nonce);

#endif
