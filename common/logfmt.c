/* SPDX-License-Identifier: MIT */
/* Log line formats (logfmt.h). */
#include "logfmt.h"

#include <systemd/sd-journal.h>
#define XXH_INLINE_ALL /* the header alone: common/hash.c */
#include <xxhash.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* A line is at most this long; longer messages are cut. */
#define LINE_MAX_BYTES 4096

const char *
allot__logfmt_level(int level)
{
	static const char *const names[] = { "emerg", "alert", "crit", "error",
		"warning", "notice", "info", "debug" };
	return names[level < 0 ? 0 : level > 7 ? 7 : level];
}

/* Whether stderr is the journal's stream: systemd sets JOURNAL_STREAM
 * to its "DEVICE:INODE" (systemd.exec(5)). */
static int
stderr_is_journal(void)
{
	const char *js = getenv("JOURNAL_STREAM");
	struct stat st;
	if (js == NULL || fstat(STDERR_FILENO, &st) != 0)
		return 0;
	char want[64];
	snprintf(want, sizeof want, "%ju:%ju", (uintmax_t) st.st_dev,
	    (uintmax_t) st.st_ino);
	return strcmp(js, want) == 0;
}

int
allot__logfmt_parse(const char *s, allot__logfmt *ret)
{
	if (strcmp(s, "text") == 0)
		*ret = ALLOT__LOGFMT_TEXT;
	else if (strcmp(s, "json") == 0)
		*ret = ALLOT__LOGFMT_JSON;
	else if (strcmp(s, "journal") == 0)
		*ret = ALLOT__LOGFMT_JOURNAL;
	else if (strcmp(s, "auto") == 0)
		*ret = stderr_is_journal() ? ALLOT__LOGFMT_JOURNAL :
		                             ALLOT__LOGFMT_TEXT;
	else
		return -1;
	return 0;
}

/* Append `s` as the body of a JSON string at b[*n], keeping room for
 * `keep` more bytes: a character is written whole or not at all. */
static void
put_json(char *b, size_t len, size_t *n, const char *s, size_t keep)
{
	for (const unsigned char *p = (const unsigned char *) s; *p; p++) {
		char e[8];
		size_t el;
		if (*p == '"' || *p == '\\') {
			e[0] = '\\';
			e[1] = (char) *p;
			el = 2;
		} else if (*p >= 0x20 && *p < 0x7f) {
			e[0] = (char) *p;
			el = 1;
		} else {
			el = (size_t) snprintf(e, sizeof e, "\\u%04x", *p);
		}
		if (*n + el + keep >= len)
			return;
		memcpy(b + *n, e, el);
		*n += el;
	}
}

/* The wall clock, UTC to the millisecond: "2026-12-07T00:53:01.123Z". */
#define WHEN_SZ 40
static void
utc_now(char when[WHEN_SZ])
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	struct tm tm;
	gmtime_r(&ts.tv_sec, &tm);
	size_t w = strftime(when, WHEN_SZ, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(when + w, WHEN_SZ - w, ".%03ldZ", ts.tv_nsec / 1000000);
}

void
allot__logfmt_json(char *buf, size_t len, const char *prog, int level,
    const char *id, const char *msg)
{
	if (len == 0)
		return;
	char when[WHEN_SZ];
	utc_now(when);
	size_t n = 0;
	int head = snprintf(buf, len,
	    "{\"ts\":\"%s\",\"level\":\"%s\",\"program\":\"", when,
	    allot__logfmt_level(level));
	if (head < 0 || (size_t) head + 64 >= len) {
		buf[0] = '\0';
		return;
	}
	n = (size_t) head;
	/* Room kept for the rest of the object: the closing quotes and
	 * braces, the keys, and the NUL. */
	put_json(buf, len, &n, prog, 40);
	const char *k1 = "\",\"id\":\"";
	memcpy(buf + n, k1, strlen(k1));
	n += strlen(k1);
	put_json(buf, len, &n, id, 16);
	const char *k2 = "\",\"msg\":\"";
	memcpy(buf + n, k2, strlen(k2));
	n += strlen(k2);
	put_json(buf, len, &n, msg, 3);
	memcpy(buf + n, "\"}", 3);
}

void
allot__logfmt_emit(allot__logfmt fmt, const char *prog, int level,
    const char *id, const char *msg, const char *text)
{
	char line[LINE_MAX_BYTES + 2];
	/* sd_journal_send() drops the entry, and says it sent it, when
	 * no journal listens: then the line goes to stderr. */
	struct stat st;
	if (fmt == ALLOT__LOGFMT_JOURNAL &&
	    stat("/run/systemd/journal/socket", &st) == 0 &&
	    S_ISSOCK(st.st_mode)) {
		char mid[33];
		allot__logfmt_message_id(id, mid);
		if (sd_journal_send("MESSAGE=%s", msg, "PRIORITY=%d",
		        level < 0     ? 0 :
		            level > 7 ? 7 :
		                        level,
		        "SYSLOG_IDENTIFIER=%s", prog, "ALLOT_ID=%s", id,
		        "MESSAGE_ID=%s", mid, NULL) >= 0)
			return;
	}
	if (fmt == ALLOT__LOGFMT_JSON)
		allot__logfmt_json(line, LINE_MAX_BYTES, prog, level, id, msg);
	else if (fmt == ALLOT__LOGFMT_JOURNAL)
		snprintf(line, LINE_MAX_BYTES, "<%d>%s",
		    level < 0     ? 0 :
		        level > 7 ? 7 :
		                    level,
		    text);
	else
		snprintf(line, LINE_MAX_BYTES, "%s", text);
	size_t n = strlen(line);
	line[n++] = '\n';
	/* One write per line, so that threads never interleave. */
	for (size_t off = 0; off < n;) {
		ssize_t r = write(STDERR_FILENO, line + off, n - off);
		if (r <= 0)
			return;
		off += (size_t) r;
	}
}

void
allot__logfmt_message_id(const char *id, char buf[33])
{
	/* A fixed seed of allot's: the ids are stable, so are these. */
	XXH128_hash_t h = XXH3_128bits_withSeed(
	    id, strlen(id), 0x616c6c6f74u /* "allot" */);
	snprintf(buf, 33, "%016llx%016llx", (unsigned long long) h.high64,
	    (unsigned long long) h.low64);
}

void
allot__log_stderr(void *ctx, int level, const char *id, const char *msg)
{
	allot__logfmt f = ctx != NULL ? *(const allot__logfmt *) ctx :
	                                ALLOT__LOGFMT_TEXT;
	char text[LINE_MAX_BYTES] = "";
	if (f != ALLOT__LOGFMT_JSON) { /* JSON writes its own */
		char when[WHEN_SZ];
		utc_now(when);
		snprintf(text, sizeof text, "%s %s %s %s", when,
		    allot__logfmt_level(level), id, msg);
	}
	allot__logfmt_emit(f, "allotd", level, id, msg, text);
}
