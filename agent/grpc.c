/* SPDX-License-Identifier: MIT */
/*
 * gRPC status mapping (allot/grpc.h): a decision or a concurrency
 * rejection becomes a status code, a message and retry metadata, and a
 * google.rpc.Status with a RetryInfo detail is hand-encoded in protobuf
 * wire format. The encoder writes four small messages of known fields
 * (varints and length-delimited bytes only), sizing each nested message
 * before writing its length prefix; every write is bounds-checked so that
 * a short buffer gets the size it needs, as snprintf does.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <allot/conc.h>
#include <allot/grpc.h>

#define NS_PER_S 1000000000ull
#define NS_PER_MS 1000000ull

static void
clear(allot_grpc_status *st)
{
	memset(st, 0, sizeof *st);
}

static void
set_delay(allot_grpc_status *st, const char *what, uint64_t ns)
{
	uint64_t s = (ns + NS_PER_S - 1) / NS_PER_S;
	uint64_t ms = (ns + NS_PER_MS - 1) / NS_PER_MS;
	if (s == 0)
		s = 1;
	if (ms == 0)
		ms = 1;
	snprintf(st->message, sizeof st->message,
	    "%s; retry after %" PRIu64 "s", what, s);
	snprintf(st->retry_after, sizeof st->retry_after, "%" PRIu64, s);
	snprintf(st->pushback_ms, sizeof st->pushback_ms, "%" PRIu64, ms);
	/* RetryInfo carries the exact delay; at least the 1 ms advertised
	 * in the pushback, so that no form says "now". */
	if (ns < NS_PER_MS)
		ns = NS_PER_MS;
	st->retry_delay_seconds = (int64_t) (ns / NS_PER_S);
	st->retry_delay_nanos = (int32_t) (ns % NS_PER_S);
}

int
allot_grpc_from_decision(
    const allot_decision *d, int acquire_rc, allot_grpc_status *ret)
{
	if (d == NULL || ret == NULL)
		return ALLOT_EINVAL;
	if (acquire_rc == ALLOT_EFORBIDDEN) {
		clear(ret);
		ret->code = ALLOT_GRPC_PERMISSION_DENIED;
		snprintf(ret->message, sizeof ret->message,
		    "the quota admits nobody (access: closed)");
		snprintf(ret->pushback_ms, sizeof ret->pushback_ms, "-1");
		return ALLOT_OK;
	}
	if (acquire_rc == ALLOT_ETOOBIG) {
		clear(ret);
		ret->code = ALLOT_GRPC_RESOURCE_EXHAUSTED;
		snprintf(ret->message, sizeof ret->message,
		    "request cost %" PRIu32 " exceeds the quota's burst",
		    d->cost);
		snprintf(ret->pushback_ms, sizeof ret->pushback_ms, "-1");
		return ALLOT_OK;
	}
	if (acquire_rc != ALLOT_OK)
		return ALLOT_EINVAL;
	clear(ret);
	if (d->allowed) {
		ret->code = ALLOT_GRPC_OK;
		return ALLOT_OK;
	}
	ret->code = ALLOT_GRPC_RESOURCE_EXHAUSTED;
	set_delay(ret, "rate limit exceeded", d->retry_after_ns);
	return ALLOT_OK;
}

int
allot_grpc_from_conc(
    int conc_rc, uint64_t retry_after_ms, allot_grpc_status *ret)
{
	if (ret == NULL || retry_after_ms == 0 ||
	    retry_after_ms > UINT64_MAX / NS_PER_MS ||
	    (conc_rc != ALLOT_EBUSY && conc_rc != ALLOT_ETIMEDOUT))
		return ALLOT_EINVAL;
	clear(ret);
	ret->code = ALLOT_GRPC_UNAVAILABLE;
	set_delay(
	    ret, "concurrency limit exceeded", retry_after_ms * NS_PER_MS);
	return ALLOT_OK;
}

/* ---- protobuf wire format ---- */

/* A bounded writer: counts every byte, stores those that fit. */
struct pbuf {
	uint8_t *p;
	size_t cap;
	size_t n;
};

static void
put_byte(struct pbuf *b, uint8_t c)
{
	if (b->n < b->cap)
		b->p[b->n] = c;
	b->n++;
}

static void
put_varint(struct pbuf *b, uint64_t v)
{
	while (v >= 0x80) {
		put_byte(b, (uint8_t) (v | 0x80));
		v >>= 7;
	}
	put_byte(b, (uint8_t) v);
}

static size_t
varint_len(uint64_t v)
{
	size_t n = 1;
	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

/* Field tags: (number << 3) | wire type (0 varint, 2 length-delimited). */
static void
put_tag(struct pbuf *b, unsigned field, unsigned wire)
{
	put_varint(b, (uint64_t) (field << 3 | wire));
}

static void
put_bytes(struct pbuf *b, unsigned field, const void *data, size_t len)
{
	put_tag(b, field, 2);
	put_varint(b, len);
	for (size_t i = 0; i < len; i++)
		put_byte(b, ((const uint8_t *) data)[i]);
}

/* Length-delimited field header with a body of `len` bytes to follow. */
static void
put_nested(struct pbuf *b, unsigned field, size_t len)
{
	put_tag(b, field, 2);
	put_varint(b, len);
}

/* Size of an optional varint field: proto3 omits zero values. Negative
 * int32 and int64 values are sign-extended to ten bytes. */
static size_t
int_field_len(int64_t v)
{
	return v == 0 ? 0 : 1 + varint_len((uint64_t) v);
}

static void
put_int_field(struct pbuf *b, unsigned field, int64_t v)
{
	if (v == 0)
		return;
	put_tag(b, field, 0);
	put_varint(b, (uint64_t) v);
}

int
allot_grpc_status_details(
    const allot_grpc_status *st, uint8_t *buf, size_t len)
{
	if (st == NULL)
		return -1;
	if (st->code == ALLOT_GRPC_OK)
		return 0;
	struct pbuf b = { buf, buf != NULL ? len : 0, 0 };
	size_t msg_len = strnlen(st->message, sizeof st->message);
	bool delay = st->retry_delay_seconds != 0 ||
	    st->retry_delay_nanos != 0;

	/* google.protobuf.Duration { int64 seconds = 1; int32 nanos = 2; } */
	size_t dur = int_field_len(st->retry_delay_seconds) +
	    int_field_len(st->retry_delay_nanos);
	/* google.rpc.RetryInfo { Duration retry_delay = 1; } */
	size_t info = 1 + varint_len(dur) + dur;
	/* google.protobuf.Any { string type_url = 1; bytes value = 2; } */
	size_t url = sizeof ALLOT_GRPC_RETRY_INFO_TYPE - 1;
	size_t any = 1 + varint_len(url) + url + 1 + varint_len(info) + info;

	/* google.rpc.Status { int32 code = 1; string message = 2;
	 *                     repeated Any details = 3; } */
	put_int_field(&b, 1, st->code);
	if (msg_len > 0)
		put_bytes(&b, 2, st->message, msg_len);
	if (delay) {
		put_nested(&b, 3, any);
		put_bytes(&b, 1, ALLOT_GRPC_RETRY_INFO_TYPE, url);
		put_nested(&b, 2, info);
		put_nested(&b, 1, dur);
		put_int_field(&b, 1, st->retry_delay_seconds);
		put_int_field(&b, 2, st->retry_delay_nanos);
	}
	return b.n > (size_t) INT32_MAX ? -1 : (int) b.n;
}
