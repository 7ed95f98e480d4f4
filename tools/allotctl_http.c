/* SPDX-License-Identifier: MIT */
/*
 * allotctl's HTTP client: GET a path from allotd's read-only HTTP port
 * with libcurl and turn every way that can fail into one sentence an
 * operator can act on ("cannot reach allotd at ...: connection refused",
 * "... answered 404 to GET /x: ..."). Also whether the --http address is
 * this machine's, which decides whether allotd's reported pid may be
 * signalled. Requests are HTTP/1.0, one per connection, no proxy from the
 * environment and no redirects: allotd is addressed directly. Every
 * exchange allotctl has with allotd, on this port or the admin socket,
 * runs on the handle ctl_request_run() sets up.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <curl/curl.h>

#include <allot/allot.h>

#include "allotctl.h"

#define HTTP_MAX_BYTES (64u * 1024u * 1024u)

/* Split "HOST:PORT", "[V6]:PORT", "HOST" (port 7480) or an "http://"
 * URL into host and port. */
static bool
split_hostport(
    const char *addr, char *host, size_t hostlen, char *port, size_t portlen)
{
	if (strncmp(addr, "http://", 7) == 0)
		addr += 7;
	const char *end = addr + strcspn(addr, "/");
	const char *colon;
	if (*addr == '[') {
		const char *rb = memchr(addr, ']', (size_t) (end - addr));
		if (rb == NULL)
			return false;
		if ((size_t) (rb - addr - 1) >= hostlen)
			return false;
		memcpy(host, addr + 1, (size_t) (rb - addr - 1));
		host[rb - addr - 1] = '\0';
		colon = rb + 1 < end && rb[1] == ':' ? rb + 1 : NULL;
		if (colon == NULL && rb + 1 != end)
			return false;
	} else {
		colon = NULL;
		for (const char *p = addr; p < end; p++)
			if (*p == ':')
				colon = p;
		const char *hend = colon ? colon : end;
		if (hend == addr || (size_t) (hend - addr) >= hostlen)
			return false;
		memcpy(host, addr, (size_t) (hend - addr));
		host[hend - addr] = '\0';
	}
	if (colon == NULL) {
		snprintf(port, portlen, "7480");
		return true;
	}
	size_t pl = (size_t) (end - colon - 1);
	if (pl == 0 || pl >= portlen)
		return false;
	memcpy(port, colon + 1, pl);
	port[pl] = '\0';
	long v;
	return ctl_parse_int(port, 1, 65535, &v);
}

/* The answer, appended to as curl receives it. */
static size_t
on_data(char *data, size_t size, size_t n, void *ud)
{
	ctl_request *rq = ud;
	size_t got = size * n;
	if (rq->answer_len + got > rq->max) {
		rq->too_large = true;
		return 0; /* curl stops with CURLE_WRITE_ERROR */
	}
	rq->answer = ctl_realloc(rq->answer, rq->answer_len + got + 1);
	memcpy(rq->answer + rq->answer_len, data, got);
	rq->answer_len += got;
	rq->answer[rq->answer_len] = '\0';
	return got;
}

CURLcode
ctl_request_run(ctl_request *rq)
{
	CURL *e = curl_easy_init();
	if (e == NULL)
		ctl_die_oom();
	curl_easy_setopt(e, CURLOPT_URL, rq->url);
	if (rq->unix_socket != NULL)
		curl_easy_setopt(e, CURLOPT_UNIX_SOCKET_PATH, rq->unix_socket);
	curl_easy_setopt(e, CURLOPT_HTTP_VERSION, rq->http_version);
	curl_easy_setopt(
	    e, CURLOPT_USERAGENT, "allotctl/" ALLOT_VERSION_STRING);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_PROXY, "");
	curl_easy_setopt(e, CURLOPT_NOPROXY, "*");
	curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
	bool https = strncmp(rq->url, "https://", 8) == 0;
	curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, https ? "https" : "http");
	if (https) {
		curl_easy_setopt(e, CURLOPT_SSLCERT, rq->tls_cert);
		curl_easy_setopt(e, CURLOPT_SSLKEY,
		    rq->tls_key != NULL ? rq->tls_key : rq->tls_cert);
		curl_easy_setopt(e, CURLOPT_CAINFO, rq->tls_ca);
		curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L);
		curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 2L);
	}
	curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long) rq->timeout_ms);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, rq);
	struct curl_slist *hdr = NULL;
	char type[128];
	if (rq->body != NULL) {
		/* No "Expect: 100-continue" round trip: allotd reads it
		 * all. */
		hdr = curl_slist_append(hdr, "Expect:");
		if (rq->content_type != NULL) {
			snprintf(type, sizeof type, "Content-Type: %s",
			    rq->content_type);
			hdr = curl_slist_append(hdr, type);
		}
		curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdr);
		curl_easy_setopt(e, CURLOPT_POSTFIELDS, rq->body);
		curl_easy_setopt(
		    e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) rq->len);
	}
	rq->code = curl_easy_perform(e);
	curl_off_t connected = 0;
	curl_easy_getinfo(e, CURLINFO_OS_ERRNO, &rq->oserr);
	curl_easy_getinfo(e, CURLINFO_CONNECT_TIME_T, &connected);
	rq->connected = connected > 0;
	if (rq->code == CURLE_OK)
		curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &rq->status);
	curl_slist_free_all(hdr);
	curl_easy_cleanup(e);
	if (rq->answer == NULL)
		rq->answer = ctl_calloc(1, 1);
	return rq->code;
}

char *
ctl_escape(const char *s)
{
	/* libcurl ignores the handle since 7.82 (the floor is 7.85). */
	char *v = curl_easy_escape(NULL, s, 0);
	if (v == NULL)
		ctl_die_oom();
	char *copy = ctl_strdup(v);
	curl_free(v);
	return copy;
}

/* Say why the exchange failed; the exit status. */
static int
explain(
    const ctl *c, const ctl_request *rq, const char *host, const char *path)
{
	switch (rq->code) {
	case CURLE_COULDNT_RESOLVE_HOST: {
		/* curl does not keep the resolver's reason: ask once more. */
		struct addrinfo hints = { .ai_family = AF_UNSPEC,
			.ai_socktype = SOCK_STREAM };
		struct addrinfo *res = NULL;
		int gai = getaddrinfo(host, NULL, &hints, &res);
		freeaddrinfo(res);
		ctl_fail("cannot reach allotd at %s: cannot resolve %s: %s",
		    c->http, host,
		    gai != 0 ? gai_strerror(gai) :
		               curl_easy_strerror(rq->code));
		break;
	}
	case CURLE_OPERATION_TIMEDOUT:
		if (!rq->connected)
			ctl_fail("cannot reach allotd at %s: no answer within "
			         "%d ms",
			    c->http, c->timeout_ms);
		else
			ctl_fail("cannot reach allotd at %s: no answer to GET "
			         "%s within %d ms",
			    c->http, path, c->timeout_ms);
		break;
	case CURLE_WRITE_ERROR:
		if (rq->too_large) {
			ctl_fail(
			    "allotd at %s: the answer to GET %s is larger "
			    "than %u bytes",
			    c->http, path, HTTP_MAX_BYTES);
			break;
		}
		/* fall through */
	case CURLE_WEIRD_SERVER_REPLY:
	case CURLE_UNSUPPORTED_PROTOCOL: /* an HTTP/0.9 answer */
	case CURLE_GOT_NOTHING:
		ctl_fail("%s does not answer like allotd (not HTTP)", c->http);
		break;
	default:
		ctl_fail("cannot reach allotd at %s: %s", c->http,
		    rq->oserr != 0 ? ctl_errstr((int) rq->oserr) :
		                     curl_easy_strerror(rq->code));
		break;
	}
	return EXIT_UNREACHABLE;
}

int
ctl_http_get(const ctl *c, const char *path, char **ret_body)
{
	char host[256], port[16];
	if (!split_hostport(c->http, host, sizeof host, port, sizeof port)) {
		ctl_fail(
		    "bad --http address \"%s\", expected HOST:PORT", c->http);
		return EXIT_USAGE;
	}
	bool v6 = strchr(host, ':') != NULL;
	char *url = ctl_asprintf("http://%s%s%s:%s%s", v6 ? "[" : "", host,
	    v6 ? "]" : "", port, path);
	ctl_request rq = { .url = url,
		.http_version = CURL_HTTP_VERSION_1_0,
		.timeout_ms = c->timeout_ms,
		.max = HTTP_MAX_BYTES };
	int rc = ctl_request_run(&rq) != CURLE_OK ?
	    explain(c, &rq, host, path) :
	    0;
	free(url);
	if (rc == 0 && rq.status != 200) {
		/* allotd's error bodies are one line of text. */
		size_t bl = strcspn(rq.answer, "\r\n");
		ctl_fail("allotd at %s answered %ld to GET %s%s%.*s", c->http,
		    rq.status, path, bl ? ": " : "",
		    (int) (bl > 200 ? 200 : bl), rq.answer);
		rc = EXIT_UNREACHABLE;
	}
	if (rc != 0) {
		free(rq.answer);
		return rc;
	}
	*ret_body = rq.answer;
	return 0;
}

/* Every address of the --http host is a loopback address. */
bool
ctl_http_is_local(const ctl *c)
{
	char host[256], port[16];
	if (!split_hostport(c->http, host, sizeof host, port, sizeof port))
		return false;
	struct addrinfo hints = { .ai_family = AF_UNSPEC,
		.ai_socktype = SOCK_STREAM };
	struct addrinfo *res = NULL;
	if (getaddrinfo(host, port, &hints, &res) != 0)
		return false;
	bool local = res != NULL;
	for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
		if (ai->ai_family == AF_INET) {
			const struct sockaddr_in *s =
			    (const struct sockaddr_in *) ai->ai_addr;
			local &= (ntohl(s->sin_addr.s_addr) >> 24) == 127;
		} else if (ai->ai_family == AF_INET6) {
			const struct sockaddr_in6 *s =
			    (const struct sockaddr_in6 *) ai->ai_addr;
			local &= IN6_IS_ADDR_LOOPBACK(&s->sin6_addr);
		} else {
			local = false;
		}
	}
	freeaddrinfo(res);
	return local;
}
