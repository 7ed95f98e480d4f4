/* SPDX-License-Identifier: MIT */
/*
 * Parsing for the load generator: the --caller SPEC (comma-separated
 * key=value pairs with the endpoint mix inside), the loopback-only target
 * check (through libcurl's own URL parser, so the host judged is exactly
 * the host curl would connect to, after its IPv4 normalisation of forms
 * such as "127.1" or "2130706433"), and the targets file. Every value is
 * range-checked and every error names the offending key.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>

#include "loadgen.h"

static void seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void
seterr(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err == NULL || errlen == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

/* Copy [s, s+n) into dst (capacity cap, NUL included); -1 if too long. */
static int
copy_span(char *dst, size_t cap, const char *s, size_t n)
{
	if (n + 1 > cap)
		return -1;
	memcpy(dst, s, n);
	dst[n] = '\0';
	return 0;
}

static int
parse_double(const char *s, double lo, double hi, double *ret)
{
	char *end;
	double v;

	if (*s == '\0' || isspace((unsigned char) *s))
		return -1;
	errno = 0;
	v = strtod(s, &end);
	if (errno != 0 || *end != '\0' || !isfinite(v) || v < lo || v > hi)
		return -1;
	*ret = v;
	return 0;
}

static int
parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *ret)
{
	char *end;
	unsigned long long v;

	if (!isdigit((unsigned char) *s))
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0 || *end != '\0' || v < lo || v > hi)
		return -1;
	*ret = (uint32_t) v;
	return 0;
}

static int
parse_onoff(const char *s, bool *ret)
{
	if (strcmp(s, "on") == 0 || strcmp(s, "true") == 0 ||
	    strcmp(s, "1") == 0) {
		*ret = true;
		return 0;
	}
	if (strcmp(s, "off") == 0 || strcmp(s, "false") == 0 ||
	    strcmp(s, "0") == 0) {
		*ret = false;
		return 0;
	}
	return -1;
}

int
lg_mix_parse(const char *text, lg_caller_spec *spec, char *err, size_t errlen)
{
	const char *p = text;
	size_t n = 0;
	double total = 0;

	if (*text == '\0') {
		seterr(err, errlen, "mix: empty");
		return -1;
	}
	while (*p != '\0') {
		const char *end = strchr(p, ';');
		size_t len = end != NULL ? (size_t) (end - p) : strlen(p);
		const char *colon = NULL;
		char wbuf[64];
		double w;

		/* The weight follows the last ':' so that a query string
		 * may itself contain one. */
		for (size_t i = 0; i < len; i++)
			if (p[i] == ':')
				colon = p + i;
		if (n == LG_MAX_MIX) {
			seterr(err, errlen, "mix: more than %d entries",
			    LG_MAX_MIX);
			return -1;
		}
		if (len == 0 || colon == NULL || colon == p) {
			seterr(err, errlen,
			    "mix: entry %zu is not PATH:WEIGHT", n + 1);
			return -1;
		}
		if (*p != '/') {
			seterr(err, errlen,
			    "mix: path of entry %zu does not start with '/'",
			    n + 1);
			return -1;
		}
		for (const char *c = p; c < colon; c++) {
			if (!isgraph((unsigned char) *c) || *c == '#') {
				seterr(err, errlen,
				    "mix: path of entry %zu has a blank, "
				    "control character or '#'",
				    n + 1);
				return -1;
			}
		}
		if (copy_span(spec->mix[n].path, sizeof spec->mix[n].path, p,
		        (size_t) (colon - p)) != 0) {
			seterr(err, errlen, "mix: path of entry %zu too long",
			    n + 1);
			return -1;
		}
		if (copy_span(wbuf, sizeof wbuf, colon + 1,
		        (size_t) (p + len - colon - 1)) != 0 ||
		    parse_double(wbuf, 0, 1e9, &w) != 0 || w <= 0) {
			seterr(err, errlen,
			    "mix: weight of entry %zu must be a number > 0",
			    n + 1);
			return -1;
		}
		spec->mix[n].weight = w;
		total += w;
		n++;
		if (end == NULL)
			break;
		p = end + 1;
		if (*p == '\0') {
			seterr(err, errlen, "mix: trailing ';'");
			return -1;
		}
	}
	spec->nmix = n;
	spec->mix_total = total;
	return 0;
}

size_t
lg_mix_pick(const lg_caller_spec *spec, double u)
{
	double x = u * spec->mix_total;
	double acc = 0;

	for (size_t i = 0; i < spec->nmix; i++) {
		acc += spec->mix[i].weight;
		if (x < acc)
			return i;
	}
	/* Rounding can leave x at the very top: the last entry. */
	return spec->nmix > 0 ? spec->nmix - 1 : 0;
}

static void
caller_defaults(lg_caller_spec *s)
{
	memset(s, 0, sizeof *s);
	strcpy(s->mix[0].path, "/lookup");
	s->mix[0].weight = 1;
	s->nmix = 1;
	s->mix_total = 1;
	s->rate = -1;
	s->sticky = 0;
	s->retry = true;
	s->concurrency = 16;
	s->attempts = 4;
	s->budget = 0.1;
	s->max_wait_ms = 10000;
	s->throttle = false;
	s->throttle_k = 2;
}

static bool
valid_name(const char *s)
{
	if (*s == '\0')
		return false;
	for (; *s != '\0'; s++)
		if (!isalnum((unsigned char) *s) && *s != '.' && *s != '_' &&
		    *s != '-')
			return false;
	return true;
}

/* One key=value of a SPEC. `v` is NUL-terminated. */
static int
caller_field(
    lg_caller_spec *s, const char *k, const char *v, char *err, size_t errlen)
{
	if (strcmp(k, "name") == 0) {
		if (strlen(v) > LG_NAME_MAX || !valid_name(v)) {
			seterr(err, errlen, "name: 1 to %d of [A-Za-z0-9._-]",
			    LG_NAME_MAX);
			return -1;
		}
		strcpy(s->name, v);
	} else if (strcmp(k, "cert") == 0 || strcmp(k, "key") == 0) {
		char *dst = k[0] == 'c' ? s->cert : s->key;
		if (*v == '\0' || strlen(v) > LG_FILE_MAX) {
			seterr(err, errlen, "%s: empty or too long", k);
			return -1;
		}
		strcpy(dst, v);
	} else if (strcmp(k, "rate") == 0) {
		if (parse_double(v, 0, LG_MAX_RATE, &s->rate) != 0 ||
		    s->rate <= 0) {
			seterr(err, errlen,
			    "rate: requests per second, > 0 and <= %g",
			    LG_MAX_RATE);
			return -1;
		}
	} else if (strcmp(k, "mix") == 0) {
		return lg_mix_parse(v, s, err, errlen);
	} else if (strcmp(k, "sticky") == 0) {
		if (parse_double(v, 0, 1, &s->sticky) != 0) {
			seterr(err, errlen, "sticky: a probability in [0, 1]");
			return -1;
		}
	} else if (strcmp(k, "retry") == 0) {
		if (parse_onoff(v, &s->retry) != 0) {
			seterr(err, errlen, "retry: on or off");
			return -1;
		}
	} else if (strcmp(k, "concurrency") == 0) {
		if (parse_u32(v, 1, LG_MAX_CONCURRENCY, &s->concurrency) !=
		    0) {
			seterr(err, errlen, "concurrency: 1 to %d",
			    LG_MAX_CONCURRENCY);
			return -1;
		}
	} else if (strcmp(k, "attempts") == 0) {
		if (parse_u32(v, 1, 16, &s->attempts) != 0) {
			seterr(err, errlen, "attempts: 1 to 16");
			return -1;
		}
	} else if (strcmp(k, "budget") == 0) {
		if (parse_double(v, 0, 1, &s->budget) != 0 || s->budget <= 0) {
			seterr(err, errlen, "budget: a fraction in (0, 1]");
			return -1;
		}
	} else if (strcmp(k, "max_wait") == 0) {
		if (parse_u32(v, 1, 3600000, &s->max_wait_ms) != 0) {
			seterr(err, errlen, "max_wait: 1 to 3600000 ms");
			return -1;
		}
	} else if (strcmp(k, "throttle") == 0) {
		if (parse_onoff(v, &s->throttle) != 0) {
			seterr(err, errlen, "throttle: on or off");
			return -1;
		}
	} else if (strcmp(k, "throttle_k") == 0) {
		if (parse_double(v, 1, 1000, &s->throttle_k) != 0) {
			seterr(err, errlen, "throttle_k: 1 to 1000");
			return -1;
		}
	} else if (strcmp(k, "header") == 0) {
		const char *colon = strchr(v, ':');
		if (colon == NULL || colon == v || strlen(v) > LG_HEADER_MAX) {
			seterr(err, errlen,
			    "header: NAME:VALUE, at most %d "
			    "bytes",
			    LG_HEADER_MAX);
			return -1;
		}
		for (const char *c = v; *c != '\0'; c++) {
			bool ok = c < colon ?
			    isgraph((unsigned char) *c) :
			    (isprint((unsigned char) *c) || *c == '\t');
			if (!ok) {
				seterr(err, errlen,
				    "header: control character or blank in "
				    "the name");
				return -1;
			}
		}
		strcpy(s->header, v);
	} else if (strcmp(k, "start") == 0) {
		if (parse_double(v, 0, 86400, &s->start_s) != 0) {
			seterr(err, errlen, "start: 0 to 86400 s");
			return -1;
		}
	} else if (strcmp(k, "end") == 0) {
		if (parse_double(v, 0, 86400, &s->end_s) != 0 ||
		    s->end_s <= 0) {
			seterr(err, errlen, "end: > 0 and <= 86400 s");
			return -1;
		}
	} else {
		seterr(err, errlen, "unknown key '%s'", k);
		return -1;
	}
	return 0;
}

int
lg_caller_spec_parse(
    const char *spec, lg_caller_spec *ret, char *err, size_t errlen)
{
	lg_caller_spec s;
	const char *p = spec;
	char keybuf[32];
	char val[LG_FILE_MAX + 1 + 8];
	unsigned seen = 0;
	static const char *const keys[] = { "name", "cert", "key", "rate",
		"mix", "sticky", "retry", "concurrency", "attempts", "budget",
		"max_wait", "throttle", "throttle_k", "header", "start",
		"end" };

	caller_defaults(&s);
	if (spec == NULL || *spec == '\0') {
		seterr(err, errlen, "empty caller spec");
		return -1;
	}
	while (*p != '\0') {
		const char *end = strchr(p, ',');
		size_t len = end != NULL ? (size_t) (end - p) : strlen(p);
		const char *eq = memchr(p, '=', len);
		size_t ki;

		if (eq == NULL || eq == p) {
			seterr(err, errlen, "'%.*s' is not key=value",
			    (int) (len > 40 ? 40 : len), p);
			return -1;
		}
		if (copy_span(keybuf, sizeof keybuf, p, (size_t) (eq - p)) !=
		    0) {
			seterr(err, errlen, "unknown key '%.*s'",
			    (int) (eq - p > 40 ? 40 : eq - p), p);
			return -1;
		}
		if (copy_span(val, sizeof val, eq + 1,
		        (size_t) (p + len - eq - 1)) != 0) {
			seterr(err, errlen, "%s: value too long", keybuf);
			return -1;
		}
		for (ki = 0; ki < sizeof keys / sizeof keys[0]; ki++)
			if (strcmp(keys[ki], keybuf) == 0)
				break;
		if (ki < sizeof keys / sizeof keys[0]) {
			if (seen & (1u << ki)) {
				seterr(err, errlen, "%s: given twice", keybuf);
				return -1;
			}
			seen |= 1u << ki;
		}
		if (caller_field(&s, keybuf, val, err, errlen) != 0)
			return -1;
		if (end == NULL)
			break;
		p = end + 1;
		if (*p == '\0') {
			seterr(err, errlen, "trailing ','");
			return -1;
		}
	}
	if (s.name[0] == '\0') {
		seterr(err, errlen, "name= is required");
		return -1;
	}
	if (s.rate <= 0) {
		seterr(err, errlen, "%s: rate= is required", s.name);
		return -1;
	}
	if ((s.cert[0] == '\0') != (s.key[0] == '\0')) {
		seterr(err, errlen, "%s: cert= and key= go together", s.name);
		return -1;
	}
	if (s.end_s > 0 && s.end_s <= s.start_s) {
		seterr(err, errlen, "%s: end= must be after start=", s.name);
		return -1;
	}
	*ret = s;
	return 0;
}

/* ------------------------------------------------------------------ */
/* Targets                                                             */
/* ------------------------------------------------------------------ */

static bool
loopback_host(const char *host)
{
	struct in_addr a4;
	struct in6_addr a6;
	char buf[64];
	size_t n = strlen(host);

	if (strcasecmp(host, "localhost") == 0)
		return true;
	if (inet_pton(AF_INET, host, &a4) == 1)
		return (ntohl(a4.s_addr) >> 24) == 127;
	if (n >= 2 && host[0] == '[' && host[n - 1] == ']' &&
	    n - 2 < sizeof buf) {
		memcpy(buf, host + 1, n - 2);
		buf[n - 2] = '\0';
		if (inet_pton(AF_INET6, buf, &a6) == 1)
			return memcmp(&a6, &in6addr_loopback, sizeof a6) == 0;
	}
	return false;
}

int
lg_target_check(
    const char *url, char *out, size_t outlen, char *err, size_t errlen)
{
	CURLU *u = curl_url();
	char *scheme = NULL, *host = NULL, *port = NULL, *path = NULL;
	char *part = NULL;
	int rc = -1;

	if (u == NULL) {
		seterr(err, errlen, "out of memory");
		return -1;
	}
	if (strlen(url) > LG_URL_MAX) {
		seterr(err, errlen, "target URL longer than %d bytes",
		    LG_URL_MAX);
		goto out;
	}
	if (curl_url_set(u, CURLUPART_URL, url, 0) != CURLUE_OK) {
		seterr(err, errlen,
		    "'%s' is not a URL (want "
		    "https://127.0.0.1:PORT)",
		    url);
		goto out;
	}
	if (curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK ||
	    (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0)) {
		seterr(err, errlen, "'%s': only http and https targets", url);
		goto out;
	}
	if (curl_url_get(u, CURLUPART_USER, &part, 0) == CURLUE_OK ||
	    curl_url_get(u, CURLUPART_QUERY, &part, 0) == CURLUE_OK ||
	    curl_url_get(u, CURLUPART_FRAGMENT, &part, 0) == CURLUE_OK) {
		seterr(err, errlen,
		    "'%s': a target is scheme://host:port, without user, "
		    "query or fragment",
		    url);
		goto out;
	}
	if (curl_url_get(u, CURLUPART_PATH, &path, 0) == CURLUE_OK &&
	    strcmp(path, "/") != 0 && path[0] != '\0') {
		seterr(err, errlen,
		    "'%s': a target has no path (the mix supplies it)", url);
		goto out;
	}
	if (curl_url_get(u, CURLUPART_HOST, &host, 0) != CURLUE_OK) {
		seterr(err, errlen, "'%s': no host", url);
		goto out;
	}
	if (!loopback_host(host)) {
		seterr(err, errlen,
		    "refusing target '%s': host '%s' is not loopback "
		    "(only 127.0.0.0/8, ::1 and localhost are allowed)",
		    url, host);
		goto out;
	}
	/* Host names are case-insensitive: one spelling per target. */
	for (char *c = host; *c != '\0'; c++)
		*c = (char) tolower((unsigned char) *c);
	curl_url_get(u, CURLUPART_PORT, &port, 0);
	if ((size_t) snprintf(out, outlen, "%s://%s%s%s", scheme, host,
	        port != NULL ? ":" : "", port != NULL ? port : "") >= outlen) {
		seterr(err, errlen, "'%s': too long", url);
		goto out;
	}
	rc = 0;
out:
	curl_free(scheme);
	curl_free(host);
	curl_free(port);
	curl_free(path);
	curl_free(part);
	curl_url_cleanup(u);
	return rc;
}

size_t
lg_targets_parse(const char *text, char out[][LG_URL_MAX + 1], size_t cap,
    void (*warn)(void *ctx, size_t line, const char *msg), void *ctx)
{
	size_t n = 0, lineno = 0;
	const char *p = text;

	while (*p != '\0') {
		const char *eol = strchr(p, '\n');
		const char *e = eol != NULL ? eol : p + strlen(p);
		const char *b = p;
		char line[LG_URL_MAX + 2];
		char norm[LG_URL_MAX + 1];
		char err[256];
		bool dup = false;

		lineno++;
		while (b < e && isspace((unsigned char) *b))
			b++;
		while (e > b && isspace((unsigned char) e[-1]))
			e--;
		if (b == e || *b == '#')
			goto next;
		if (copy_span(line, sizeof line, b, (size_t) (e - b)) != 0 ||
		    lg_target_check(
		        line, norm, sizeof norm, err, sizeof err) != 0) {
			if (warn != NULL)
				warn(ctx, lineno,
				    copy_span(line, sizeof line, b,
				        (size_t) (e - b)) != 0 ?
				        "target URL too long" :
				        err);
			goto next;
		}
		for (size_t i = 0; i < n; i++)
			dup = dup || strcmp(out[i], norm) == 0;
		if (dup)
			goto next;
		if (n == cap) {
			if (warn != NULL)
				warn(ctx, lineno, "too many targets");
			goto next;
		}
		strcpy(out[n++], norm);
	next:
		if (eol == NULL)
			break;
		p = eol + 1;
	}
	return n;
}
