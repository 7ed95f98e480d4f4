/* SPDX-License-Identifier: MIT */
/* HOST:PORT into a socket address, a client's address into text
 * (addr.h). */
#include "addr.h"

#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>

int
allot__web_parse_addr(const char *addr, const char *scheme,
    struct sockaddr_storage *ret, char *err, size_t errlen)
{
	const char *s = addr;
	size_t sl = strlen(scheme);
	if (strncmp(s, scheme, sl) == 0 && strncmp(s + sl, "://", 3) == 0)
		s += sl + 3;
	else if (strstr(s, "://") != NULL) {
		snprintf(err, errlen, "bad address %s: only %s:// is served",
		    addr, scheme);
		return ALLOT_EINVAL;
	}
	char host[256], port[16];
	const char *colon;
	size_t hl;
	const char *h0 = s;
	if (*s == '[') {
		const char *close = strchr(s, ']');
		if (close == NULL || close[1] != ':')
			goto bad;
		h0 = s + 1;
		hl = (size_t) (close - h0);
		colon = close + 1;
	} else {
		colon = strrchr(s, ':');
		if (colon == NULL)
			goto bad;
		hl = (size_t) (colon - s);
	}
	size_t pl = strcspn(colon + 1, "/");
	if (hl == 0 || hl >= sizeof host || pl == 0 || pl >= sizeof port)
		goto bad;
	memcpy(host, h0, hl);
	host[hl] = '\0';
	memcpy(port, colon + 1, pl);
	port[pl] = '\0';
	char *end;
	long p = strtol(port, &end, 10);
	if (*end != '\0' || p < 0 || p > 65535)
		goto bad;
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM,
		.ai_flags = AI_PASSIVE | AI_NUMERICSERV };
	struct addrinfo *ai;
	int rv = getaddrinfo(host, port, &hints, &ai);
	if (rv != 0) {
		snprintf(
		    err, errlen, "bad address %s: %s", addr, gai_strerror(rv));
		return ALLOT_EINVAL;
	}
	memset(ret, 0, sizeof *ret);
	memcpy(ret, ai->ai_addr, ai->ai_addrlen);
	freeaddrinfo(ai);
	return ALLOT_OK;
bad:
	snprintf(err, errlen,
	    "bad address %s: expected HOST:PORT, [V6]:PORT or "
	    "%s://HOST:PORT",
	    addr, scheme);
	return ALLOT_EINVAL;
}

void
allot__web_addr_text(const struct sockaddr *sa, char *out, size_t cap)
{
	socklen_t len = sa->sa_family == AF_INET6 ?
	    sizeof(struct sockaddr_in6) :
	    sizeof(struct sockaddr_in);
	if (getnameinfo(
	        sa, len, out, (socklen_t) cap, NULL, 0, NI_NUMERICHOST) != 0)
		snprintf(out, cap, "?");
}
