/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target "headers": the HTTP header helpers. The input is a header
 * value, optionally followed by a NUL and up to 50 bytes that set a
 * decision (allowed and shadow bits, cost, retry-after and reset in ns,
 * limit, rate and remaining as raw IEEE-754 doubles, so NaN, infinities
 * and denormals occur), a wall-clock time and an output buffer size; a
 * file holding only a header value is a valid input, with a zero decision
 * and a fixed recent time. The value goes to allot_retry_parse_after()
 * (and to its caller allot_retry_next()), the decision to every
 * allot_fmt_* with the value as the policy name, each into a heap buffer
 * of the chosen size. Checked: the snprintf contract (the length needed,
 * never a byte past the buffer, always terminated), digits-only numeric
 * fields, a denial never advertising 0 seconds, delta-seconds always
 * accepted, every accepted wait within RFC 9110's 2^31 s, and dates
 * measured against the extremes of int64_t as well as the input's time.
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>
#include <allot/client.h>

#include "fuzz.h"

#define DEFAULT_NOW 1700000000 /* 2023-11-14 */
#define WAIT_MAX_MS (2147483648ull * 1000u)

typedef struct params {
	allot_decision d;
	int64_t now_unix;
	size_t buflen;
} params;

/* Little-endian reader over the bytes after the NUL; zero past the end. */
typedef struct rd {
	const uint8_t *p;
	size_t n;
} rd;

static uint64_t
rd_u(rd *r, size_t bytes)
{
	uint64_t v = 0;
	for (size_t i = 0; i < bytes; i++) {
		uint64_t b = 0;
		if (r->n > 0) {
			b = *r->p++;
			r->n--;
		}
		v |= b << (8 * i);
	}
	return v;
}

static double
rd_double(rd *r)
{
	uint64_t u = rd_u(r, 8);
	double d;
	memcpy(&d, &u, sizeof d);
	return d;
}

static void
read_params(const uint8_t *p, size_t n, params *ret)
{
	rd r = { p, n };
	memset(ret, 0, sizeof *ret);
	uint64_t flags = rd_u(&r, 1);
	ret->d.allowed = (flags & 1) != 0;
	ret->d.shadow_denied = (flags & 2) != 0;
	ret->d.cost = (uint32_t) rd_u(&r, 4);
	ret->d.retry_after_ns = rd_u(&r, 8);
	ret->d.reset_ns = rd_u(&r, 8);
	ret->d.limit = rd_double(&r);
	ret->d.rate = rd_double(&r);
	ret->d.remaining = rd_double(&r);
	ret->now_unix = n >= 1 + 4 + 5 * 8 + 8 ? (int64_t) rd_u(&r, 8) :
	                                         DEFAULT_NOW;
	ret->buflen = n >= 1 + 4 + 6 * 8 + 1 ? (size_t) rd_u(&r, 1) : 64;
}

static bool
all_digits(const char *s)
{
	if (*s == '\0')
		return false;
	for (; *s != '\0'; s++)
		if (*s < '0' || *s > '9')
			return false;
	return true;
}

/* Run one formatter into a heap buffer of exactly `len` bytes, and again
 * into one large enough; returns the full text (caller frees). */
typedef int (*fmt_fn)(
    const allot_decision *d, const char *name, char *buf, size_t len);

static char *
run_fmt(fmt_fn f, const allot_decision *d, const char *name, size_t len)
{
	char *small = len > 0 ? malloc(len) : NULL;
	FUZZ_CHECK(len == 0 || small != NULL);
	int need = f(d, name, small, len);
	FUZZ_CHECK(need >= 0);
	char *full = malloc((size_t) need + 1);
	FUZZ_CHECK(full != NULL);
	FUZZ_CHECK(f(d, name, full, (size_t) need + 1) == need);
	FUZZ_CHECK(strlen(full) == (size_t) need);
	if (len > 0) {
		size_t kept = (size_t) need < len ? (size_t) need : len - 1;
		FUZZ_CHECK(small[kept] == '\0');
		FUZZ_CHECK(memcmp(small, full, kept) == 0);
	}
	free(small);
	return full;
}

static int
fmt_retry_after(
    const allot_decision *d, const char *name, char *buf, size_t len)
{
	(void) name;
	return allot_fmt_retry_after(d, buf, len);
}

/* `"name";k=N;k=N` with two digit-only numbers, the name a valid
 * structured-field string (RFC 9651): printable ASCII, `"` and `\`
 * escaped, each byte of `name` it cannot hold a `?`. */
static void
check_ietf(const char *s, const char *name, char k1, char k2)
{
	FUZZ_CHECK(s[0] == '"');
	const char *q = s + 1;
	for (const unsigned char *n = (const unsigned char *) name; *n; n++) {
		if (*n == '"' || *n == '\\')
			FUZZ_CHECK(*q++ == '\\' && *q++ == (char) *n);
		else if (*n >= 0x20 && *n < 0x7f)
			FUZZ_CHECK(*q++ == (char) *n);
		else
			FUZZ_CHECK(*q++ == '?');
	}
	FUZZ_CHECK(q[0] == '"' && q[1] == ';' && q[2] == k1 && q[3] == '=');
	const char *p = q + 4;
	const char *semi = strchr(p, ';');
	FUZZ_CHECK(semi != NULL && semi > p);
	for (const char *c = p; c < semi; c++)
		FUZZ_CHECK(*c >= '0' && *c <= '9');
	FUZZ_CHECK(semi[1] == k2 && semi[2] == '=');
	FUZZ_CHECK(all_digits(semi + 3));
}

static void
check_fmt(const params *pr, const char *name)
{
	const allot_decision *d = &pr->d;
	bool denied = !d->allowed || d->shadow_denied;

	char *s = run_fmt(fmt_retry_after, d, NULL, pr->buflen);
	FUZZ_CHECK(all_digits(s));
	FUZZ_CHECK(!denied || strcmp(s, "0") != 0);
	FUZZ_CHECK(denied || strcmp(s, "0") == 0);
	free(s);

	/* An unlimited quota's decision (limit INFINITY) has no policy:
	 * every field is empty. */
	bool unlimited = isinf(d->limit);
	s = run_fmt(allot_fmt_ratelimit_policy, d, name, pr->buflen);
	if (unlimited)
		FUZZ_CHECK(s[0] == '\0');
	else
		check_ietf(s, name != NULL ? name : "default", 'q', 'w');
	free(s);
	s = run_fmt(allot_fmt_ratelimit, d, name, pr->buflen);
	if (unlimited)
		FUZZ_CHECK(s[0] == '\0');
	else
		check_ietf(s, name != NULL ? name : "default", 'r', 't');
	free(s);

	allot_xheaders *x = malloc(sizeof *x);
	FUZZ_CHECK(x != NULL);
	allot_fmt_xratelimit(d, pr->now_unix, x);
	FUZZ_CHECK(memchr(x->limit, '\0', sizeof x->limit) != NULL);
	FUZZ_CHECK(memchr(x->remaining, '\0', sizeof x->remaining) != NULL);
	FUZZ_CHECK(memchr(x->reset, '\0', sizeof x->reset) != NULL);
	FUZZ_CHECK(unlimited ? x->limit[0] == '\0' &&
	            x->remaining[0] == '\0' && x->reset[0] == '\0' :
	                       all_digits(x->limit) &&
	            all_digits(x->remaining) && all_digits(x->reset));
	free(x);

	/* NULL arguments are refused, not dereferenced. */
	FUZZ_CHECK(allot_fmt_retry_after(NULL, NULL, 0) == -1);
	FUZZ_CHECK(allot_fmt_ratelimit(d, name, NULL, 1) == -1);
	allot_fmt_xratelimit(d, pr->now_unix, NULL);
}

/* Delta-seconds: optional SP/HTAB, digits, optional SP/HTAB. */
static bool
is_delta(const char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	const char *p = s;
	while (*p >= '0' && *p <= '9')
		p++;
	if (p == s)
		return false;
	while (*p == ' ' || *p == '\t')
		p++;
	return *p == '\0';
}

static int
parse_after(const char *value, int64_t now_unix, uint64_t *ms)
{
	*ms = UINT64_MAX;
	int rc = allot_retry_parse_after(value, now_unix, ms);
	FUZZ_CHECK(rc == ALLOT_OK || rc == ALLOT_EINVAL);
	if (rc == ALLOT_OK)
		FUZZ_CHECK(*ms <= WAIT_MAX_MS && *ms % 1000 == 0);
	if (is_delta(value))
		FUZZ_CHECK(rc == ALLOT_OK);
	return rc;
}

/* The input's time, then the extremes of int64_t and of gmtime's range
 * (years INT_MIN + 1900 and INT_MAX + 1900), which random bytes almost
 * never hit. Every date is in the past of INT64_MAX and far in the
 * future of INT64_MIN (an RFC 850 date has no year of its own there:
 * refused); near the ends of gmtime's range only the bounds hold, as a
 * two-digit year is resolved to within 50 years of now. */
static void
check_retry_after(const char *value, int64_t now_unix)
{
	uint64_t ms;
	parse_after(value, now_unix, &ms);
	bool delta = is_delta(value);
	if (parse_after(value, INT64_MAX, &ms) == ALLOT_OK && !delta)
		FUZZ_CHECK(ms == 0);
	if (parse_after(value, INT64_MIN, &ms) == ALLOT_OK && !delta)
		FUZZ_CHECK(ms == WAIT_MAX_MS);
	static const int64_t ends[] = { 67767976233532799,
		67767976233532799 - 86400 * 366 * 60, -67768040609740800,
		-67768040609740800 + 86400 * 366 * 60 };
	for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++)
		parse_after(value, ends[i], &ms);
}

/* allot_retry_next() on the same value, as a client would call it. */
static void
check_retry_next(const char *value)
{
	static allot_retry *r;
	if (r == NULL) {
		allot_retry_policy pol;
		allot_retry_policy_init(&pol);
		pol.seed = 42;
		/* A budget that never runs out: every call decides. */
		pol.budget_ratio = 1.0;
		pol.budget_min_retries = UINT32_MAX;
		FUZZ_CHECK(allot_retry_create(&pol, &r) == ALLOT_OK);
	}
	allot_retry_record_request(r);
	uint64_t delay = UINT64_MAX;
	int rc = allot_retry_next(r, 0, value, 429, &delay);
	FUZZ_CHECK(rc == ALLOT_OK || rc == ALLOT_ETIMEDOUT);
	if (rc == ALLOT_OK)
		FUZZ_CHECK(delay <= 10000);
	rc = allot_retry_next(r, 0, value, 503, &delay);
	FUZZ_CHECK(
	    rc == ALLOT_OK || rc == ALLOT_ETIMEDOUT || rc == ALLOT_EPROTO);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *nul = memchr(data, '\0', size);
	size_t vlen = nul != NULL ? (size_t) (nul - data) : size;
	char *value = malloc(vlen + 1);
	FUZZ_CHECK(value != NULL);
	memcpy(value, data, vlen);
	value[vlen] = '\0';
	params pr;
	if (nul != NULL)
		read_params(nul + 1, size - vlen - 1, &pr);
	else
		read_params(NULL, 0, &pr);

	check_retry_after(value, pr.now_unix);
	check_retry_next(value);
	check_fmt(&pr, value);
	check_fmt(&pr, NULL);
	free(value);
	return 0;
}
