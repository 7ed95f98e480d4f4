/* SPDX-License-Identifier: MIT */
/*
 * The Raft log entries' byte format (consensus_entry.h says why it is a
 * fixed binary layout), and the little-endian reader and writer the
 * state's snapshot shares. Decoding copies every string of an entry into
 * one block, so a decoded entry is one allocation whatever its size.
 */
#include "consensus_entry.h"

#include <raft.h>
#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>

static void
reserve(allot__cwbuf *w, size_t more)
{
	size_t cap;
	uint8_t *p;

	if (w->err != 0)
		return;
	if (more > SIZE_MAX / 2 - w->len) {
		w->err = ALLOT_ENOMEM;
		return;
	}
	if (w->len + more <= w->cap)
		return;
	cap = w->cap != 0 ? w->cap : 64;
	while (cap < w->len + more)
		cap *= 2;
	/* raft_realloc: entries and snapshots are handed to libraft, which
	 * frees them with raft_free. */
	p = raft_realloc(w->p, cap);
	if (p == NULL) {
		w->err = ALLOT_ENOMEM;
		return;
	}
	w->p = p;
	w->cap = cap;
}

void
allot__cw_u8(allot__cwbuf *w, uint8_t v)
{
	reserve(w, 1);
	if (w->err == 0)
		w->p[w->len++] = v;
}

void
allot__cw_u32(allot__cwbuf *w, uint32_t v)
{
	reserve(w, 4);
	if (w->err != 0)
		return;
	for (int i = 0; i < 4; i++)
		w->p[w->len++] = (uint8_t) (v >> (8 * i));
}

void
allot__cw_u64(allot__cwbuf *w, uint64_t v)
{
	reserve(w, 8);
	if (w->err != 0)
		return;
	for (int i = 0; i < 8; i++)
		w->p[w->len++] = (uint8_t) (v >> (8 * i));
}

void
allot__cw_f64(allot__cwbuf *w, double v)
{
	uint64_t bits;

	memcpy(&bits, &v, sizeof bits);
	allot__cw_u64(w, bits);
}

/* wide: a u32 length (the config text), else a u16 one. */
void
allot__cw_str(allot__cwbuf *w, const char *s, size_t len, int wide)
{
	if (len > (wide ? ALLOT__CENTRY_TEXT_MAX : ALLOT__CENTRY_STR_MAX)) {
		if (w->err == 0)
			w->err = ALLOT_EINVAL;
		return;
	}
	if (wide) {
		allot__cw_u32(w, (uint32_t) len);
	} else {
		allot__cw_u8(w, (uint8_t) (len & 0xff));
		allot__cw_u8(w, (uint8_t) (len >> 8));
	}
	reserve(w, len);
	if (w->err == 0 && len > 0) {
		memcpy(w->p + w->len, s, len);
		w->len += len;
	}
}

void
allot__cw_pad(allot__cwbuf *w)
{
	while (w->err == 0 && w->len % 8 != 0)
		allot__cw_u8(w, 0);
}

bool
allot__cr_end(const allot__crbuf *r)
{
	size_t left = r->len - r->off;

	if (r->bad || left >= 8 || r->len % 8 != 0)
		return !r->bad && left == 0;
	for (size_t i = r->off; i < r->len; i++)
		if (r->p[i] != 0)
			return false;
	return true;
}

static const uint8_t *
take(allot__crbuf *r, size_t n)
{
	const uint8_t *p;

	if (r->bad || n > r->len - r->off) {
		r->bad = 1;
		return NULL;
	}
	p = r->p + r->off;
	r->off += n;
	return p;
}

uint8_t
allot__cr_u8(allot__crbuf *r)
{
	const uint8_t *p = take(r, 1);

	return p != NULL ? p[0] : 0;
}

uint32_t
allot__cr_u32(allot__crbuf *r)
{
	const uint8_t *p = take(r, 4);
	uint32_t v = 0;

	for (int i = 0; p != NULL && i < 4; i++)
		v |= (uint32_t) p[i] << (8 * i);
	return v;
}

uint64_t
allot__cr_u64(allot__crbuf *r)
{
	const uint8_t *p = take(r, 8);
	uint64_t v = 0;

	for (int i = 0; p != NULL && i < 8; i++)
		v |= (uint64_t) p[i] << (8 * i);
	return v;
}

double
allot__cr_f64(allot__crbuf *r)
{
	uint64_t bits = allot__cr_u64(r);
	double v;

	memcpy(&v, &bits, sizeof v);
	return v;
}

const char *
allot__cr_str(allot__crbuf *r, size_t *ret_len, int wide)
{
	size_t len;
	const uint8_t *p;

	if (wide) {
		len = allot__cr_u32(r);
		if (len > ALLOT__CENTRY_TEXT_MAX)
			r->bad = 1;
	} else {
		len = allot__cr_u8(r);
		len |= (size_t) allot__cr_u8(r) << 8;
	}
	if (r->bad)
		return NULL;
	p = take(r, len);
	if (p == NULL)
		return NULL;
	*ret_len = len;
	return (const char *) p;
}

/* A short string that may be absent (NULL: ""). */
static void
write_opt_str(allot__cwbuf *w, const char *s)
{
	s = s != NULL ? s : "";
	allot__cw_str(w, s, strlen(s), 0);
}

static void encode_account(
    allot__cwbuf *w, const allot__row_count *rows, size_t n);

int
allot__centry_encode(const allot__centry *e, void **ret_buf, size_t *ret_len)
{
	allot__cwbuf w = { 0 };
	const char *s;

	allot__cw_u8(&w, ALLOT__CENTRY_VERSION);
	allot__cw_u8(&w, (uint8_t) e->type);
	switch (e->type) {
	case ALLOT__CENTRY_EPOCH:
		s = e->epoch.address != NULL ? e->epoch.address : "";
		allot__cw_u64(&w, e->epoch.term);
		allot__cw_u64(&w, e->epoch.leader_id);
		allot__cw_u32(&w, e->epoch.lease_ms);
		allot__cw_str(&w, s, strlen(s), 0);
		break;
	case ALLOT__CENTRY_CONFIG:
		allot__cw_u64(&w, e->config.config_epoch);
		allot__cw_u64(&w, e->config.digest);
		allot__cw_str(&w, e->config.text, e->config.text_len, 1);
		write_opt_str(&w, e->config.who.who);
		write_opt_str(&w, e->config.who.claimed_as);
		write_opt_str(&w, e->config.who.reason);
		write_opt_str(&w, e->config.who.source);
		break;
	case ALLOT__CENTRY_USAGE:
		if (e->usage.n > ALLOT__CENTRY_ROWS_MAX) {
			w.err = w.err != 0 ? w.err : ALLOT_EINVAL;
			break;
		}
		allot__cw_u32(&w, (uint32_t) e->usage.n);
		for (size_t i = 0; i < e->usage.n; i++) {
			const allot__row_usage *row = &e->usage.rows[i];

			allot__cw_str(
			    &w, row->service, strlen(row->service), 0);
			allot__cw_str(&w, row->key, strlen(row->key), 0);
			allot__cw_u64(&w, row->second);
			allot__cw_u64(&w, row->consumed);
			allot__cw_u64(&w, row->denied);
			allot__cw_f64(&w, row->demand);
			allot__cw_u32(&w, row->live_replicas);
		}
		break;
	case ALLOT__CENTRY_ACCOUNT:
		encode_account(&w, e->account.rows, e->account.n);
		break;
	case ALLOT__CENTRY_EVENTS:
		if (e->events.n > ALLOT__CENTRY_ROWS_MAX) {
			w.err = w.err != 0 ? w.err : ALLOT_EINVAL;
			break;
		}
		allot__cw_u32(&w, (uint32_t) e->events.n);
		for (size_t i = 0; i < e->events.n; i++) {
			const allot__row_event *ev = &e->events.rows[i];
			const char *k = ev->kind != NULL ? ev->kind : "";
			const char *sj = ev->subject != NULL ? ev->subject :
			                                       "";
			const char *d = ev->detail != NULL ? ev->detail : "";

			allot__cw_u64(&w, (uint64_t) ev->at);
			allot__cw_str(&w, k, strlen(k), 0);
			allot__cw_str(&w, sj, strlen(sj), 0);
			allot__cw_str(&w, d, strlen(d), 0);
		}
		break;
	case ALLOT__CENTRY_MEMBER:
		s = e->member.address != NULL ? e->member.address : "";
		allot__cw_u8(&w, (uint8_t) e->member.event);
		allot__cw_u64(&w, e->member.id);
		allot__cw_str(&w, s, strlen(s), 0);
		break;
	case ALLOT__CENTRY_AUDIT:
		allot__centry_encode_audit(&w, &e->audit);
		break;
	default: w.err = w.err != 0 ? w.err : ALLOT_EINVAL; break;
	}
	allot__cw_pad(&w);
	if (w.err != 0) {
		raft_free(w.p);
		return w.err;
	}
	*ret_buf = w.p;
	*ret_len = w.len;
	return ALLOT_OK;
}

/* Copies a string read from `r` into the entry's block at `*at`. */
static const char *
copy_str(allot__crbuf *r, char **at, int wide, size_t *ret_len)
{
	size_t len;
	const char *s = allot__cr_str(r, &len, wide);
	char *d = *at;

	if (s == NULL)
		return NULL;
	memcpy(d, s, len);
	d[len] = '\0';
	*at = d + len + 1;
	if (ret_len != NULL)
		*ret_len = len;
	return d;
}

static int
decode_usage(allot__crbuf *r, allot__centry *e)
{
	allot__crbuf scan;
	allot__row_usage *rows;
	char *at;
	uint32_t n = allot__cr_u32(r);

	/* A row is at least 40 bytes, so a count the buffer cannot hold is
	 * refused before it sizes an allocation. */
	if (r->bad || n > ALLOT__CENTRY_ROWS_MAX || n > (r->len - r->off) / 40)
		return ALLOT_EPROTO;
	/* One block: the rows, then every string with its NUL (the strings
	 * are at most the bytes left plus one NUL per string). */
	e->mem = malloc(
	    n * sizeof *rows + (r->len - r->off) + 2 * (size_t) n + 1);
	if (e->mem == NULL)
		return ALLOT_ENOMEM;
	rows = e->mem;
	at = (char *) (rows + n);
	scan = *r;
	for (uint32_t i = 0; i < n; i++) {
		rows[i].service = copy_str(&scan, &at, 0, NULL);
		rows[i].key = copy_str(&scan, &at, 0, NULL);
		rows[i].second = allot__cr_u64(&scan);
		rows[i].consumed = allot__cr_u64(&scan);
		rows[i].denied = allot__cr_u64(&scan);
		rows[i].demand = allot__cr_f64(&scan);
		rows[i].live_replicas = allot__cr_u32(&scan);
		if (scan.bad)
			break;
	}
	*r = scan;
	e->usage.rows = rows;
	e->usage.n = n;
	return r->bad ? ALLOT_EPROTO : ALLOT_OK;
}

/* A count row is at least 8 u64 and two string lengths. */
#define COUNT_MIN 68u

static void
encode_account(allot__cwbuf *w, const allot__row_count *rows, size_t n)
{
	if (n > ALLOT__CENTRY_ROWS_MAX) {
		w->err = w->err != 0 ? w->err : ALLOT_EINVAL;
		return;
	}
	allot__cw_u32(w, (uint32_t) n);
	for (size_t i = 0; i < n; i++) {
		const allot__row_count *c = &rows[i];
		const char *sv = c->service != NULL ? c->service : "";
		const char *q = c->quota != NULL ? c->quota : "";

		allot__cw_u64(w, c->session);
		allot__cw_u64(w, c->incarnation);
		allot__cw_u64(w, c->first);
		allot__cw_u64(w, c->id);
		allot__cw_u64(w, (uint64_t) c->second);
		allot__cw_u64(w, c->admitted);
		allot__cw_u64(w, c->denied);
		allot__cw_u64(w, c->shadow_denied);
		allot__cw_str(w, sv, strlen(sv), 0);
		allot__cw_str(w, q, strlen(q), 0);
	}
}

static int
decode_account(allot__crbuf *r, allot__centry *e)
{
	allot__row_count *rows;
	char *at;
	uint32_t n = allot__cr_u32(r);

	if (r->bad || n > ALLOT__CENTRY_ROWS_MAX ||
	    n > (r->len - r->off) / COUNT_MIN)
		return ALLOT_EPROTO;
	e->mem = malloc(
	    n * sizeof *rows + (r->len - r->off) + 2 * (size_t) n + 1);
	if (e->mem == NULL)
		return ALLOT_ENOMEM;
	rows = e->mem;
	at = (char *) (rows + n);
	for (uint32_t i = 0; i < n && !r->bad; i++) {
		allot__row_count *c = &rows[i];

		c->session = allot__cr_u64(r);
		c->incarnation = allot__cr_u64(r);
		c->first = allot__cr_u64(r);
		c->id = allot__cr_u64(r);
		c->second = (int64_t) allot__cr_u64(r);
		c->admitted = allot__cr_u64(r);
		c->denied = allot__cr_u64(r);
		c->shadow_denied = allot__cr_u64(r);
		c->service = copy_str(r, &at, 0, NULL);
		c->quota = copy_str(r, &at, 0, NULL);
		if (c->quota != NULL && c->quota[0] == '\0')
			c->quota = NULL; /* a record's mark alone */
	}
	e->account.rows = rows;
	e->account.n = n;
	return r->bad ? ALLOT_EPROTO : ALLOT_OK;
}

static int
decode_events(allot__crbuf *r, allot__centry *e)
{
	allot__crbuf scan;
	allot__row_event *rows;
	char *at;
	uint32_t n = allot__cr_u32(r);

	/* An event is at least 14 bytes (the time, three lengths). */
	if (r->bad || n > ALLOT__CENTRY_ROWS_MAX || n > (r->len - r->off) / 14)
		return ALLOT_EPROTO;
	e->mem = malloc(
	    n * sizeof *rows + (r->len - r->off) + 3 * (size_t) n + 1);
	if (e->mem == NULL)
		return ALLOT_ENOMEM;
	rows = e->mem;
	at = (char *) (rows + n);
	scan = *r;
	for (uint32_t i = 0; i < n; i++) {
		rows[i].at = (int64_t) allot__cr_u64(&scan);
		rows[i].kind = copy_str(&scan, &at, 0, NULL);
		rows[i].subject = copy_str(&scan, &at, 0, NULL);
		rows[i].detail = copy_str(&scan, &at, 0, NULL);
		if (scan.bad)
			break;
	}
	*r = scan;
	e->events.rows = rows;
	e->events.n = n;
	return r->bad ? ALLOT_EPROTO : ALLOT_OK;
}

int
allot__centry_decode(const void *buf, size_t len, allot__centry *ret)
{
	allot__crbuf r = { .p = buf, .len = len };
	allot__centry e = { 0 };
	char *at;
	int rv = ALLOT_OK;
	uint8_t version = allot__cr_u8(&r);

	e.type = allot__cr_u8(&r);
	if (r.bad)
		return ALLOT_EPROTO;
	if (version != ALLOT__CENTRY_VERSION)
		return ALLOT_ERANGE;
	if (e.type != ALLOT__CENTRY_USAGE && e.type != ALLOT__CENTRY_EVENTS &&
	    e.type != ALLOT__CENTRY_AUDIT && e.type != ALLOT__CENTRY_ACCOUNT) {
		/* Every other type has at most five strings: their bytes
		 * and a NUL each. */
		e.mem = malloc(len + 5);
		if (e.mem == NULL)
			return ALLOT_ENOMEM;
	}
	at = e.mem;
	switch (e.type) {
	case ALLOT__CENTRY_EPOCH:
		e.epoch.term = allot__cr_u64(&r);
		e.epoch.leader_id = allot__cr_u64(&r);
		e.epoch.lease_ms = allot__cr_u32(&r);
		e.epoch.address = copy_str(&r, &at, 0, NULL);
		break;
	case ALLOT__CENTRY_CONFIG:
		e.config.config_epoch = allot__cr_u64(&r);
		e.config.digest = allot__cr_u64(&r);
		e.config.text = copy_str(&r, &at, 1, &e.config.text_len);
		e.config.who.who = copy_str(&r, &at, 0, NULL);
		e.config.who.claimed_as = copy_str(&r, &at, 0, NULL);
		e.config.who.reason = copy_str(&r, &at, 0, NULL);
		e.config.who.source = copy_str(&r, &at, 0, NULL);
		break;
	case ALLOT__CENTRY_USAGE: rv = decode_usage(&r, &e); break;
	case ALLOT__CENTRY_ACCOUNT: rv = decode_account(&r, &e); break;
	case ALLOT__CENTRY_EVENTS: rv = decode_events(&r, &e); break;
	case ALLOT__CENTRY_AUDIT:
		rv = allot__centry_decode_audit(&r, &e);
		break;
	case ALLOT__CENTRY_MEMBER:
		e.member.event = allot__cr_u8(&r);
		e.member.id = allot__cr_u64(&r);
		e.member.address = copy_str(&r, &at, 0, NULL);
		if (e.member.event < ALLOT__CMEMBER_ADDED ||
		    e.member.event > ALLOT__CMEMBER_LEAVING)
			r.bad = 1;
		break;
	default: r.bad = 1; break;
	}
	/* Trailing bytes other than the padding are an error: a longer
	 * entry of this version would be a different entry. */
	if (rv == ALLOT_OK && !allot__cr_end(&r))
		rv = ALLOT_EPROTO;
	if (rv != ALLOT_OK) {
		free(e.mem);
		return rv;
	}
	*ret = e;
	return ALLOT_OK;
}

void
allot__centry_clear(allot__centry *e)
{
	if (e == NULL)
		return;
	free(e->mem);
	e->mem = NULL;
}
