/* SPDX-License-Identifier: MIT */
/*
 * The canonical byte string of a Register identity proof (authn_msg.h).
 */
#include "authn_msg.h"

#include <string.h>

static unsigned char *
put_str(unsigned char *p, const char *s, size_t n)
{
	*p++ = (unsigned char) (n >> 8);
	*p++ = (unsigned char) n;
	memcpy(p, s, n);
	return p + n;
}

size_t
allot__authn_msg(unsigned char *buf, const char *replica_id,
    const char *service, const char *audience, uint64_t time_ms,
    const unsigned char *nonce)
{
	if (replica_id == NULL || service == NULL || audience == NULL ||
	    nonce == NULL)
		return 0;
	size_t lr = strlen(replica_id), ls = strlen(service),
	       la = strlen(audience);
	if (lr > ALLOT__AUTHN_FIELD_MAX || ls > ALLOT__AUTHN_FIELD_MAX ||
	    la > ALLOT__AUTHN_FIELD_MAX)
		return 0;
	unsigned char *p = buf;
	memcpy(p, ALLOT__AUTHN_TAG, sizeof ALLOT__AUTHN_TAG - 1);
	p += sizeof ALLOT__AUTHN_TAG - 1;
	p = put_str(p, replica_id, lr);
	p = put_str(p, service, ls);
	p = put_str(p, audience, la);
	for (int i = 7; i >= 0; i--)
		*p++ = (unsigned char) (time_ms >> (8 * i));
	memcpy(p, nonce, ALLOT__AUTHN_NONCE);
	p += ALLOT__AUTHN_NONCE;
	return (size_t) (p - buf);
}
