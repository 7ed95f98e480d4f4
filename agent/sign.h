/* SPDX-License-Identifier: MIT */
/*
 * The agent's half of Register identity proofs (docs/protocol.md,
 * "Identity"): with tls+tcp:// and a certificate configured, every
 * Register carries the certificate chain and a signature by its private
 * key over replica_id, service, the coordinator URL dialed, the time and
 * a fresh nonce (common/authn_msg.h). The key and chain are read from the
 * same PEM file nng presents in the TLS handshake (tls_cert_key_file).
 */
#ifndef ALLOT_AGENT_SIGN_H
#define ALLOT_AGENT_SIGN_H

#include <stddef.h>

#include "allot.pb-c.h"

typedef struct allot__signer allot__signer;

/* Load the certificate chain and private key from `pem_file` and check
 * they belong together; `audience` (copied) is the coordinator URL the
 * proofs name. ALLOT_OK, or ALLOT_EINVAL with a reason in `err`. */
int allot__signer_new(const char *pem_file, const char *audience, char *err,
    size_t errlen, allot__signer **ret);
void allot__signer_free(allot__signer *sg);

/* Set reg->identity to a fresh proof over reg->replica_id and
 * reg->service. The proof's storage belongs to the signer and stays valid
 * until the next call; one thread at a time. */
int allot__signer_sign(allot__signer *sg, Allot__V1__Register *reg);

#endif
