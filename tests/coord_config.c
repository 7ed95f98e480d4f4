/* SPDX-License-Identifier: MIT */
/*
 * The coordinator suite's config-plane cases (docs/protocol.md, "The
 * config plane"): Welcome and Reply carry the file's digest always and
 * its bytes when the agent's digest differs, Sync.add_keys appends
 * identities, and a file above what a Reply carries is never sent.
 */
#include <check.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "coord_harness.h"
#include "proc.h"
#include "proto_client.h"

/* ------------------------------------------------------------------ */
/* the config plane (docs/protocol.md, "The config plane")             */
/* ------------------------------------------------------------------ */

/* A Register announcing `digest`. */
static Allot__V1__Envelope *
register_digest(pc_conn *conn, const char *id, const char *const *k, size_t n,
    uint64_t digest)
{
	Allot__V1__Register reg = ALLOT__V1__REGISTER__INIT;
	reg.replica_id = (char *) id;
	reg.service = (char *) SVC;
	reg.host = (char *) "testhost";
	reg.agent_version = (char *) "test-0";
	reg.config_digest = digest;
	reg.keys = (char **) k;
	reg.n_keys = n;
	reg.sync_interval_ms = 100;
	Allot__V1__Envelope *e = pc_send_register(conn, &reg);
	ck_assert_ptr_nonnull(e);
	ck_assert_int_eq(e->body_case, ALLOT__V1__ENVELOPE__BODY_WELCOME);
	return e;
}

/* A Sync announcing `digest` and appending `add`, with one report of
 * `consumed` tokens for key `key` when consumed > 0. */
static Allot__V1__Envelope *
sync_digest(pc_conn *conn, uint64_t session, uint64_t seq, uint64_t digest,
    const char *const *add, size_t nadd, uint32_t key, uint64_t consumed)
{
	Allot__V1__Sync sy = ALLOT__V1__SYNC__INIT;
	Allot__V1__KeyReport kr = ALLOT__V1__KEY_REPORT__INIT;
	Allot__V1__KeyReport *krp = &kr;
	kr.key = key;
	kr.consumed = consumed;
	sy.session = session;
	sy.seq = seq;
	sy.elapsed_ms = 100;
	sy.config_digest = digest;
	sy.add_keys = (char **) add;
	sy.n_add_keys = nadd;
	sy.reports = consumed > 0 ? &krp : NULL;
	sy.n_reports = consumed > 0 ? 1 : 0;
	Allot__V1__Envelope *e = pc_send_sync(conn, &sy);
	ck_assert_ptr_nonnull(e);
	return e;
}

static const Allot__V1__Reply *
reply_of(const Allot__V1__Envelope *e)
{
	ck_assert_msg(e->body_case == ALLOT__V1__ENVELOPE__BODY_REPLY,
	    "not a Reply: %s",
	    e->body_case == ALLOT__V1__ENVELOPE__BODY_ERROR ?
	        e->error->message :
	        "?");
	return e->reply;
}

static void
assert_text(ProtobufCBinaryData got, const char *want)
{
	ck_assert_uint_eq(got.len, strlen(want));
	ck_assert(memcmp(got.data, want, got.len) == 0);
}

/* Welcome and Reply carry the digest always and the file's bytes when
 * the agent's digest differs; digest 0 never gets the text; the same
 * text is not sent again to a session right after; a reload sends the
 * new file. */
START_TEST(test_config_text)
{
	coord c;
	coord_init(&c, coord_cfg_good);
	coord_start(&c, NULL);
	uint64_t d1 = pc_config_digest(coord_cfg_good),
	         d2 = pc_config_digest(coord_cfg_halved);
	pc_conn ca = { 0 }, cb = { 0 };
	ck_assert_int_eq(pc_open(&ca, c.url, 5000), 0);
	ck_assert_int_eq(pc_open(&cb, c.url, 5000), 0);

	Allot__V1__Envelope *e = register_digest(
	    &ca, "a", coord_keys, NKEYS, 42);
	ck_assert_uint_eq(e->welcome->config_digest, d1);
	assert_text(e->welcome->config, coord_cfg_good);
	uint64_t sa = e->welcome->session;
	pc_free(e);
	e = register_digest(&cb, "b", coord_keys, NKEYS, d1);
	ck_assert_uint_eq(e->welcome->config.len, 0);
	uint64_t sb = e->welcome->session;
	pc_free(e);

	/* Digest 0: an agent without the config plane. */
	e = sync_digest(&ca, sa, 1, 0, NULL, 0, 0, 0);
	ck_assert_uint_eq(reply_of(e)->config_digest, d1);
	ck_assert_uint_eq(reply_of(e)->config.len, 0);
	pc_free(e);
	/* A different digest: the text once, then not for a while. */
	e = sync_digest(&cb, sb, 1, 42, NULL, 0, 0, 0);
	assert_text(reply_of(e)->config, coord_cfg_good);
	pc_free(e);
	e = sync_digest(&cb, sb, 2, 42, NULL, 0, 0, 0);
	ck_assert_uint_eq(reply_of(e)->config_digest, d1);
	ck_assert_uint_eq(reply_of(e)->config.len, 0);
	pc_free(e);
	ck_assert_double_eq(coord_metric(&c, "allotd_config_pushes_total"), 2);

	/* A reload: the new file to the agents that still run the old. */
	pc_write_file(c.cfg, coord_cfg_halved);
	kill(c.pid, SIGHUP);
	uint64_t t0 = pc_now_ms();
	while (coord_metric(&c, "allotd_config_epoch") != 2) {
		ck_assert_msg(pc_now_ms() - t0 < 3000, "no reload");
		pc_sleep_ms(20);
	}
	e = sync_digest(&ca, sa, 2, d1, NULL, 0, 0, 0);
	ck_assert_uint_eq(reply_of(e)->config_digest, d2);
	assert_text(reply_of(e)->config, coord_cfg_halved);
	pc_free(e);
	e = sync_digest(&ca, sa, 3, d2, NULL, 0, 0, 0);
	ck_assert_uint_eq(reply_of(e)->config.len, 0);
	pc_free(e);
	ck_assert_double_eq(coord_metric(&c, "allotd_config_pushes_total"), 3);
	pc_close(&ca);
	pc_close(&cb);
	coord_done(&c);
}
END_TEST

/* Sync.add_keys appends identities: a known one gets its share in the
 * same Reply and its reports are booked; an unknown one gets no share
 * and its reports are rejected; a quota named twice, a bad name and a
 * list beyond --max-keys are refused, and nothing of them is kept. */
START_TEST(test_add_keys)
{
	coord c;
	coord_init(&c, coord_cfg_good);
	const char *extra[] = { "--max-keys", "5", NULL };
	coord_start(&c, extra);
	uint64_t d1 = pc_config_digest(coord_cfg_good);
	pc_conn conn = { 0 };
	ck_assert_int_eq(pc_open(&conn, c.url, 5000), 0);
	Allot__V1__Envelope *e = register_digest(
	    &conn, "a", coord_keys, 2, d1);
	uint64_t s = e->welcome->session;
	pc_free(e);

	/* Ids 2 (b) and 3 (no quota). */
	const char *add[] = { QB, "spiffe://test/nobody" };
	e = sync_digest(&conn, s, 1, d1, add, 2, 0, 0);
	const Allot__V1__Reply *r = reply_of(e);
	bool got_b = false;
	for (size_t i = 0; i < r->n_shares; i++) {
		ck_assert_uint_ne(r->shares[i]->key, 3);
		if (r->shares[i]->key == 2) {
			got_b = true;
			ck_assert(r->shares[i]->rate > 0);
		}
	}
	ck_assert(got_b);
	pc_free(e);
	e = sync_digest(&conn, s, 2, d1, NULL, 0, 2, 5);
	ck_assert_uint_eq(reply_of(e)->rejected_reports, 0);
	pc_free(e);
	e = sync_digest(&conn, s, 3, d1, NULL, 0, 3, 5);
	ck_assert_uint_eq(reply_of(e)->rejected_reports, 1);
	pc_free(e);

	/* a's quota has its key already. */
	const char *twice[] = { QA };
	e = sync_digest(&conn, s, 4, d1, twice, 1, 0, 0);
	ck_assert_int_eq(pc_error_code(e), ALLOT__V1__ERROR__CODE__MALFORMED);
	pc_free(e);
	const char *bad[] = { "" };
	e = sync_digest(&conn, s, 5, d1, bad, 1, 0, 0);
	ck_assert_int_eq(pc_error_code(e), ALLOT__V1__ERROR__CODE__MALFORMED);
	pc_free(e);
	/* 4 keys now; 2 more would be 6 > --max-keys 5. */
	const char *more[] = { "x1", "x2" };
	e = sync_digest(&conn, s, 6, d1, more, 2, 0, 0);
	ck_assert_int_eq(pc_error_code(e), ALLOT__V1__ERROR__CODE__TOO_LARGE);
	pc_free(e);
	/* Key 4 does not exist: none of the refused ones were kept. */
	e = sync_digest(&conn, s, 7, d1, more, 1, 4, 5);
	ck_assert_uint_eq(reply_of(e)->rejected_reports, 1);
	pc_free(e);
	pc_close(&conn);
	coord_done(&c);
}
END_TEST

/* A file above what a Reply carries is never sent: the agent keeps its
 * own, and allotd says so at load and when an agent would need it. */
START_TEST(test_config_too_big)
{
	size_t pad = 600 * 1024;
	char *big = malloc(sizeof coord_cfg_good + pad + 8);
	ck_assert_ptr_nonnull(big);
	memcpy(big, coord_cfg_good, sizeof coord_cfg_good - 1);
	char *p = big + sizeof coord_cfg_good - 1;
	for (size_t i = 0; i < pad / 64; i++) {
		memset(p, 'x', 64);
		p[0] = '#';
		p[63] = '\n';
		p += 64;
	}
	*p = '\0';
	coord c;
	coord_init(&c, big);
	coord_start(&c, NULL);
	ck_assert(coord_log_contains(&c, "ALLOTD-CONFIG-TOO-BIG"));
	pc_conn conn = { 0 };
	ck_assert_int_eq(pc_open(&conn, c.url, 5000), 0);
	Allot__V1__Envelope *e = register_digest(
	    &conn, "a", coord_keys, NKEYS, 42);
	ck_assert_uint_eq(e->welcome->config_digest, pc_config_digest(big));
	ck_assert_uint_eq(e->welcome->config.len, 0);
	uint64_t s = e->welcome->session;
	pc_free(e);
	e = sync_digest(&conn, s, 1, 42, NULL, 0, 0, 0);
	ck_assert_uint_eq(reply_of(e)->config.len, 0);
	pc_free(e);
	ck_assert_double_eq(coord_metric(&c, "allotd_config_pushes_total"), 0);
	free(big);
	pc_close(&conn);
	coord_done(&c);
}
END_TEST

void
coord_config_cases(TCase *tc)
{
	tcase_add_test(tc, test_config_text);
	tcase_add_test(tc, test_add_keys);
	tcase_add_test(tc, test_config_too_big);
}
