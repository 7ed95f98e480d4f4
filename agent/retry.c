/* SPDX-License-Identifier: MIT */
/*
 * The caller-side retry helper (allot/client.h): Retry-After parsing
 * (delta-seconds and the three HTTP-date formats of RFC 9110, through
 * strptime and timegm in the C locale), the retry decision (retryable
 * status, attempt cap, cap on the accepted wait, full-jitter exponential
 * backoff or the server's hint as a floor) and the per-client retry budget:
 * a sliding window, kept as a ring of sub-window buckets, of requests and
 * retries, in which retries may not exceed budget_ratio times requests
 * plus a small per-window allowance. One mutex guards the window and the
 * jitter generator; nothing here is on a hot path.
 */
#include <errno.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <allot/client.h>

#include "clock.h"
#include "prng.h"

/* Sub-window buckets of the budget window: the window forgets a tenth of
 * itself at a time, which is smooth enough for a budget. */
#define BUDGET_BUCKETS 10

/* RFC 9110: a delta-seconds too large to represent is read as 2^31. */
#define DELTA_SECONDS_MAX 2147483648ull

struct budget_slot {
	uint64_t epoch; /* bucket index (now / width); UINT64_MAX: unused */
	uint64_t requests;
	uint64_t retries;
};

struct allot_retry {
	allot_retry_policy pol;
	uint64_t width_ns; /* one bucket of the budget window */
	pthread_mutex_t mu; /* guards ring and rng */
	struct budget_slot ring[BUDGET_BUCKETS];
	uint64_t rng; /* splitmix64 state */
	_Atomic uint64_t requests;
	_Atomic uint64_t retries;
	_Atomic uint64_t budget_denied;
	_Atomic uint64_t gave_up;
	_Atomic uint64_t not_retryable;
	_Atomic uint64_t attempts_exhausted;
	_Atomic uint64_t hint_too_long;
};

void
allot_retry_policy_init(allot_retry_policy *policy)
{
	if (policy == NULL)
		return;
	memset(policy, 0, sizeof(*policy));
	policy->max_attempts = 4;
	policy->base_delay_ms = 200;
	policy->max_delay_ms = 10000;
	policy->hint_jitter_ms = 200;
	policy->budget_ratio = 0.1;
	policy->budget_window_ms = 10000;
	policy->budget_min_retries = 3;
}

/* Uniform in [0, n], from 53 random bits; the bias is far below what a
 * backoff delay can notice. */
static uint64_t
uniform_upto(uint64_t *state, uint64_t n)
{
	double u = allot__splitmix64_unit(state);
	uint64_t v = (uint64_t) (u * ((double) n + 1.0));
	return v > n ? n : v;
}

static uint64_t
now_ns(const allot_retry *r)
{
	if (r->pol.clock != NULL)
		return r->pol.clock(r->pol.clock_ctx);
	return allot__mono_ns();
}

int
allot_retry_create(const allot_retry_policy *policy, allot_retry **ret_retry)
{
	allot_retry_policy pol;
	allot_retry *r;

	if (ret_retry == NULL)
		return ALLOT_EINVAL;
	if (policy == NULL)
		allot_retry_policy_init(&pol);
	else
		pol = *policy;
	if (pol.max_attempts == 0 || pol.base_delay_ms == 0 ||
	    pol.max_delay_ms == 0 || pol.budget_window_ms == 0 ||
	    !(pol.budget_ratio > 0.0 && pol.budget_ratio <= 1.0))
		return ALLOT_EINVAL;

	r = calloc(1, sizeof(*r));
	if (r == NULL)
		return ALLOT_ENOMEM;
	if (pthread_mutex_init(&r->mu, NULL) != 0) {
		free(r);
		return ALLOT_ENOMEM;
	}
	r->pol = pol;
	r->width_ns = (uint64_t) pol.budget_window_ms * 1000000u /
	    BUDGET_BUCKETS;
	if (r->width_ns == 0)
		r->width_ns = 1;
	for (int i = 0; i < BUDGET_BUCKETS; i++)
		r->ring[i].epoch = UINT64_MAX;
	r->rng = allot__prng_seed(pol.seed, r);
	*ret_retry = r;
	return ALLOT_OK;
}

void
allot_retry_destroy(allot_retry *retry)
{
	if (retry == NULL)
		return;
	pthread_mutex_destroy(&retry->mu);
	free(retry);
}

/* The slot for time `now`, cleared if it last held an older bucket.
 * Called with the mutex held. */
static struct budget_slot *
slot_now(allot_retry *r, uint64_t now)
{
	uint64_t epoch = now / r->width_ns;
	struct budget_slot *s = &r->ring[epoch % BUDGET_BUCKETS];
	if (s->epoch != epoch) {
		s->epoch = epoch;
		s->requests = 0;
		s->retries = 0;
	}
	return s;
}

void
allot_retry_record_request(allot_retry *retry)
{
	if (retry == NULL)
		return;
	uint64_t now = now_ns(retry);
	pthread_mutex_lock(&retry->mu);
	slot_now(retry, now)->requests++;
	pthread_mutex_unlock(&retry->mu);
	atomic_fetch_add_explicit(&retry->requests, 1, memory_order_relaxed);
}

/* Spend one retry from the budget if the window has room. Called with the
 * mutex held. Buckets older than the window are ignored (their slots are
 * reused lazily). */
static bool
budget_take(allot_retry *r, uint64_t now)
{
	struct budget_slot *cur = slot_now(r, now);
	uint64_t epoch = cur->epoch;
	uint64_t req = 0, ret = 0;

	for (int i = 0; i < BUDGET_BUCKETS; i++) {
		const struct budget_slot *s = &r->ring[i];
		if (s->epoch != UINT64_MAX && s->epoch <= epoch &&
		    s->epoch + BUDGET_BUCKETS > epoch) {
			req += s->requests;
			ret += s->retries;
		}
	}
	/* The epsilon keeps ratio * requests from rounding just below the
	 * integer it is in exact arithmetic (0.29 * 100 is
	 * 28.999999999999996 in binary floating point). */
	double allowed = r->pol.budget_ratio * (double) req +
	    (double) r->pol.budget_min_retries + 1e-9;
	if ((double) (ret + 1) > allowed)
		return false;
	cur->retries++;
	return true;
}

/* Skip optional whitespace (RFC 9110 OWS: SP / HTAB). */
static const char *
skip_ows(const char *p)
{
	while (*p == ' ' || *p == '\t')
		p++;
	return p;
}

static int
parse_delta(const char *p, const char *end, uint64_t *ret_ms)
{
	uint64_t v = 0;

	if (p == end)
		return ALLOT_EINVAL;
	for (; p < end; p++) {
		if (*p < '0' || *p > '9')
			return ALLOT_EINVAL;
		if (v < DELTA_SECONDS_MAX)
			v = v * 10 + (uint64_t) (*p - '0');
	}
	if (v > DELTA_SECONDS_MAX)
		v = DELTA_SECONDS_MAX;
	*ret_ms = v * 1000u;
	return ALLOT_OK;
}

/* The C locale, for strptime's day and month names whatever LC_TIME the
 * embedding program set. Created once; never freed (one per process). */
static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;

static void
c_locale_init(void)
{
	c_locale = newlocale(LC_ALL_MASK, "C", (locale_t) 0);
}

/* Try one strptime format on the whole of `s`; true if it consumed every
 * byte. */
static bool
try_format(const char *s, const char *fmt, struct tm *tm)
{
	memset(tm, 0, sizeof(*tm));
	const char *end = strptime(s, fmt, tm);
	return end != NULL && *end == '\0';
}

static int
parse_http_date(const char *s, int64_t now_unix, uint64_t *ret_ms)
{
	struct tm tm, check;
	bool ok, rfc850 = false;

	pthread_once(&c_locale_once, c_locale_init);
	if (c_locale == (locale_t) 0)
		return ALLOT_ENOMEM;
	locale_t old = uselocale(c_locale);
	/* IMF-fixdate, then obsolete RFC 850, then asctime. A literal space
	 * in a strptime format matches any run of white space, which is
	 * what asctime's space-padded day needs. */
	ok = try_format(s, "%a, %d %b %Y %H:%M:%S GMT", &tm);
	if (!ok) {
		ok = try_format(s, "%A, %d-%b-%y %H:%M:%S GMT", &tm);
		rfc850 = ok;
	}
	if (!ok)
		ok = try_format(s, "%a %b %d %H:%M:%S %Y", &tm);
	uselocale(old);
	if (!ok)
		return ALLOT_EINVAL;

	if (rfc850) {
		/* RFC 9110 section 5.6.7: a two-digit year more than 50
		 * years in the future is the most recent past year with the
		 * same last two digits. */
		struct tm now_tm;
		time_t nt = (time_t) now_unix;
		if (gmtime_r(&nt, &now_tm) == NULL)
			return ALLOT_EINVAL;
		/* 64-bit: now_unix may be any int64_t, and gmtime_r
		 * accepts years up to INT_MAX + 1900. */
		int64_t now_year = (int64_t) now_tm.tm_year + 1900;
		int64_t year = now_year - now_year % 100 + tm.tm_year % 100;
		if (year > now_year + 50)
			year -= 100;
		else if (year <= now_year - 50)
			year += 100;
		if (year - 1900 > INT_MAX || year - 1900 < INT_MIN)
			return ALLOT_EINVAL;
		tm.tm_year = (int) (year - 1900);
	}

	/* strptime checks each field's range but not the whole date:
	 * "31 Feb" would come back from timegm as 3 March. Reject it. (The
	 * comparison, not timegm's -1, is the error check: -1 is also
	 * 23:59:59 on 31 Dec 1969.) */
	check = tm;
	time_t t = timegm(&check);
	if (check.tm_mday != tm.tm_mday || check.tm_mon != tm.tm_mon ||
	    check.tm_year != tm.tm_year)
		return ALLOT_EINVAL;

	int64_t delta;
	if (__builtin_sub_overflow((int64_t) t, now_unix, &delta))
		delta = now_unix < 0 ? INT64_MAX : 0;
	if (delta < 0)
		delta = 0;
	if ((uint64_t) delta > DELTA_SECONDS_MAX)
		delta = (int64_t) DELTA_SECONDS_MAX;
	*ret_ms = (uint64_t) delta * 1000u;
	return ALLOT_OK;
}

int
allot_retry_parse_after(
    const char *header_value, int64_t now_unix, uint64_t *ret_ms)
{
	char buf[64];

	if (header_value == NULL || ret_ms == NULL)
		return ALLOT_EINVAL;
	const char *p = skip_ows(header_value);
	size_t len = strlen(p);
	while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t'))
		len--;
	if (len == 0)
		return ALLOT_EINVAL;
	if (p[0] >= '0' && p[0] <= '9') {
		/* An all-digit value is delta-seconds; a date never starts
		 * with a digit. */
		return parse_delta(p, p + len, ret_ms);
	}
	/* The longest valid date (RFC 850 with "Wednesday") is 37 bytes;
	 * anything much longer is not a date. Copy so that strptime sees
	 * the value without its trailing white space. */
	if (len >= sizeof(buf))
		return ALLOT_EINVAL;
	memcpy(buf, p, len);
	buf[len] = '\0';
	return parse_http_date(buf, now_unix, ret_ms);
}

static int
give_up(allot_retry *r, _Atomic uint64_t *why, int err)
{
	if (why != NULL)
		atomic_fetch_add_explicit(why, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&r->gave_up, 1, memory_order_relaxed);
	return err;
}

int
allot_retry_next(allot_retry *retry, uint32_t attempt, const char *retry_after,
    uint32_t status, uint64_t *ret_delay_ms)
{
	allot_retry *r = retry;
	uint64_t hint_ms = 0, delay;
	bool have_hint = false;

	if (r == NULL || ret_delay_ms == NULL)
		return ALLOT_EINVAL;

	if (retry_after != NULL)
		have_hint = allot_retry_parse_after(retry_after,
		                (int64_t) time(NULL), &hint_ms) == ALLOT_OK;
	if (status != 429 && !(status == 503 && have_hint))
		return give_up(r, &r->not_retryable, ALLOT_EPROTO);
	if ((uint64_t) attempt + 1 >= r->pol.max_attempts)
		return give_up(r, &r->attempts_exhausted, ALLOT_ERANGE);
	if (have_hint && hint_ms > r->pol.max_delay_ms)
		return give_up(r, &r->hint_too_long, ALLOT_ETIMEDOUT);

	uint64_t now = now_ns(r);
	pthread_mutex_lock(&r->mu);
	if (!budget_take(r, now)) {
		pthread_mutex_unlock(&r->mu);
		return give_up(r, &r->budget_denied, ALLOT_EBUSY);
	}
	if (have_hint) {
		delay = hint_ms + uniform_upto(&r->rng, r->pol.hint_jitter_ms);
		if (delay > r->pol.max_delay_ms)
			delay = r->pol.max_delay_ms;
	} else {
		/* Full jitter over the capped exponential window. Past 2^32
		 * the window is the cap whatever base is. */
		uint64_t window = r->pol.max_delay_ms;
		if (attempt < 32) {
			uint64_t w = (uint64_t) r->pol.base_delay_ms
			    << attempt;
			if (w < window)
				window = w;
		}
		delay = uniform_upto(&r->rng, window);
	}
	pthread_mutex_unlock(&r->mu);
	atomic_fetch_add_explicit(&r->retries, 1, memory_order_relaxed);
	*ret_delay_ms = delay;
	return ALLOT_OK;
}

int
allot_retry_stats_get(allot_retry *retry, allot_retry_stats *ret)
{
	if (retry == NULL || ret == NULL)
		return ALLOT_EINVAL;
#define LOAD(f) atomic_load_explicit(&retry->f, memory_order_relaxed)
	ret->requests = LOAD(requests);
	ret->retries = LOAD(retries);
	ret->budget_denied = LOAD(budget_denied);
	ret->gave_up = LOAD(gave_up);
	ret->not_retryable = LOAD(not_retryable);
	ret->attempts_exhausted = LOAD(attempts_exhausted);
	ret->hint_too_long = LOAD(hint_too_long);
#undef LOAD
	return ALLOT_OK;
}
