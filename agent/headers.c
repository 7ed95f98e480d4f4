/* SPDX-License-Identifier: MIT */
/*
 * Response header helpers: Retry-After, the IETF RateLimit-Policy and
 * RateLimit fields (draft-ietf-httpapi-ratelimit-headers) and the common
 * X-RateLimit-* triple, all computed from a decision. Seconds are rounded
 * up, so a client that waits the advertised time finds its tokens there.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include <allot/allot.h>

static uint64_t
ceil_s(uint64_t ns)
{
	return (ns + 999999999u) / 1000000000u;
}

static uint64_t
whole(double x)
{
	if (!(x > 0))
		return 0;
	if (x >= 1.8e19)
		return UINT64_MAX;
	return (uint64_t) floor(x + 1e-9);
}

/* Seconds until the next attempt can pass: retry-after when denied. */
static uint64_t
wait_s(const allot_decision *d)
{
	if (d->allowed && !d->shadow_denied)
		return 0;
	uint64_t s = ceil_s(d->retry_after_ns);
	return s == 0 ? 1 : s;
}

int
allot_fmt_retry_after(const allot_decision *d, char *buf, size_t len)
{
	if (d == NULL || (buf == NULL && len > 0))
		return -1;
	return snprintf(buf, len, "%" PRIu64, wait_s(d));
}

/* `name` as a structured-field string (RFC 9651, sf-string) at the
 * start of `buf` (`len` bytes): quoted, `"` and `\` escaped, and every
 * byte an sf-string cannot hold (outside printable ASCII: controls,
 * UTF-8) written as `?`. Returns its length; writes what fits, always
 * NUL-terminated when len > 0, as snprintf does. */
static size_t
sf_string(char *buf, size_t len, const char *name)
{
	size_t n = 0;
#define PUT(ch)                        \
	do {                           \
		if (n + 1 < len)       \
			buf[n] = (ch); \
		n++;                   \
	} while (0)
	PUT('"');
	for (const unsigned char *p = (const unsigned char *) name; *p; p++) {
		if (*p == '"' || *p == '\\')
			PUT('\\');
		PUT(*p >= 0x20 && *p < 0x7f ? (char) *p : '?');
	}
	PUT('"');
#undef PUT
	if (len > 0)
		buf[n < len ? n : len - 1] = '\0';
	return n;
}

/* The name, then ";K1=A;K2=B", as snprintf would. */
static int
fmt_field(char *buf, size_t len, const char *name, char k1, uint64_t a,
    char k2, uint64_t b)
{
	size_t n = sf_string(buf, len, name != NULL ? name : "default");
	int m = snprintf(n < len ? buf + n : NULL, n < len ? len - n : 0,
	    ";%c=%" PRIu64 ";%c=%" PRIu64, k1, a, k2, b);
	return m < 0 ? m : (int) n + m;
}

/* A decision of an unlimited quota: no policy, "" in `buf`. */
static bool
unlimited(const allot_decision *d, char *buf, size_t len)
{
	if (!isinf(d->limit))
		return false;
	if (len > 0)
		buf[0] = '\0';
	return true;
}

int
allot_fmt_ratelimit_policy(
    const allot_decision *d, const char *name, char *buf, size_t len)
{
	if (d == NULL || (buf == NULL && len > 0))
		return -1;
	if (unlimited(d, buf, len))
		return 0;
	/* The window is the time an empty bucket takes to fill. */
	double w = d->rate > 0 ? ceil(d->limit / d->rate) : 0;
	return fmt_field(buf, len, name, 'q', whole(d->limit), 'w', whole(w));
}

int
allot_fmt_ratelimit(
    const allot_decision *d, const char *name, char *buf, size_t len)
{
	if (d == NULL || (buf == NULL && len > 0))
		return -1;
	if (unlimited(d, buf, len))
		return 0;
	uint64_t t = d->allowed && !d->shadow_denied ? ceil_s(d->reset_ns) :
	                                               wait_s(d);
	return fmt_field(buf, len, name, 'r', whole(d->remaining), 't', t);
}

void
allot_fmt_xratelimit(
    const allot_decision *d, int64_t now_unix, allot_xheaders *ret)
{
	if (d == NULL || ret == NULL)
		return;
	if (isinf(d->limit)) {
		ret->limit[0] = ret->remaining[0] = ret->reset[0] = '\0';
		return;
	}
	uint64_t t = d->allowed && !d->shadow_denied ? ceil_s(d->reset_ns) :
	                                               wait_s(d);
	snprintf(ret->limit, sizeof ret->limit, "%" PRIu64, whole(d->limit));
	snprintf(ret->remaining, sizeof ret->remaining, "%" PRIu64,
	    whole(d->remaining));
	if (now_unix > 0)
		snprintf(ret->reset, sizeof ret->reset, "%" PRIu64,
		    (uint64_t) now_unix + t);
	else
		snprintf(ret->reset, sizeof ret->reset, "%" PRIu64, t);
}
