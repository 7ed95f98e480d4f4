/* SPDX-License-Identifier: MIT */
/* allot_strerror(): one message per error code. */
#include <allot/allot.h>

const char *
allot_strerror(int err)
{
	switch ((allot_err) err) {
	case ALLOT_OK: return "success";
	case ALLOT_EINVAL: return "invalid argument";
	case ALLOT_ENOMEM: return "out of memory";
	case ALLOT_ECONFIG: return "invalid quota configuration";
	case ALLOT_ENOENT: return "no such entry";
	case ALLOT_EFULL: return "table full";
	case ALLOT_ETOOBIG:
		return "cost exceeds the burst: the request can never pass";
	case ALLOT_EIO: return "I/O error";
	case ALLOT_EPROTO: return "protocol error";
	case ALLOT_ETIMEDOUT: return "timed out";
	case ALLOT_ECLOSED: return "closed";
	case ALLOT_ESTATE: return "invalid state for this call";
	case ALLOT_EUNREACH: return "coordinator unreachable";
	case ALLOT_ERANGE: return "value out of range";
	case ALLOT_EBUSY: return "concurrency limit reached";
	case ALLOT_EINPROGRESS:
		return "in progress: the decision comes through the callback";
	case ALLOT_EFORBIDDEN:
		return "forbidden: the quota admits nobody (access: closed)";
	}
	return "unknown error";
}
