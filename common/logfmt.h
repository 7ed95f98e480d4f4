/* SPDX-License-Identifier: MIT */
/*
 * How the daemons (allotd, allot-agentd) write a log line on stderr,
 * whichever logger called: as text (each daemon's own layout), as one
 * JSON object a line for a log pipeline (--log-format json), or as a
 * structured journal entry (the default when stderr is the journal,
 * which systemd says in $JOURNAL_STREAM): MESSAGE, PRIORITY,
 * SYSLOG_IDENTIFIER, ALLOT_ID (the id) and MESSAGE_ID (128 bits derived
 * from it), by the journal's native protocol; where that socket cannot
 * be written, text with the syslog priority prefix journald reads on a
 * stream ("<4>..."). Every format carries the message's stable id
 * (ALLOTD-..., ALLOT-...).
 * Part of the option-parser archive: the one piece of common/ that
 * allot-agentd links besides liballot.
 */
#ifndef ALLOT_COMMON_LOGFMT_H
#define ALLOT_COMMON_LOGFMT_H

#include <stddef.h>

typedef enum allot__logfmt {
	ALLOT__LOGFMT_TEXT,
	ALLOT__LOGFMT_JSON,
	ALLOT__LOGFMT_JOURNAL,
} allot__logfmt;

/* "text", "json", "journal" or "auto" (journal when stderr is the
 * journal, else text) into *ret; -1 for anything else. */
int allot__logfmt_parse(const char *s, allot__logfmt *ret);

/* The syslog level's name: "error", "warning", "notice", "info"... */
const char *allot__logfmt_level(int level);

/* One JSON object, without its newline, into `buf` (`len` bytes, always
 * NUL-terminated when len > 0; truncated messages are cut at a
 * character and still valid JSON):
 * {"ts":"2026-12-07T00:53:01.123Z","level":"warning","program":PROG,
 *  "id":ID,"msg":MSG}
 * Bytes outside printable ASCII in `msg` are written as \u00XX escapes,
 * so that the line is valid JSON (and ASCII) whatever a peer sent. */
void allot__logfmt_json(char *buf, size_t len, const char *prog, int level,
    const char *id, const char *msg);

/* Write one line in `fmt` on stderr with a single write (JOURNAL: one
 * entry to the journal): `text` is the caller's own text layout of it
 * (used by TEXT and by JOURNAL's fallback, after the priority prefix). */
void allot__logfmt_emit(allot__logfmt fmt, const char *prog, int level,
    const char *id, const char *msg, const char *text);

/* allotd's handler (allot__logger's fn): "TIME LEVEL ID message" lines
 * on stderr, TIME the wall clock in UTC to the millisecond, in the
 * format `ctx` points at (NULL: text). */
void allot__log_stderr(void *ctx, int level, const char *id, const char *msg);

/* The journal's MESSAGE_ID of log id `id`: 32 lowercase hex digits (a
 * 128-bit id, as journald wants), the same for an id in every release,
 * into `buf` (at least 33 bytes). */
void allot__logfmt_message_id(const char *id, char buf[33]);

#endif
