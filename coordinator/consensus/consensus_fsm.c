/* SPDX-License-Identifier: MIT */
/*
 * The cluster's replicated state machine (consensus_fsm.h): applying
 * committed entries, the canonical snapshot encoding and its restore, and
 * the libraft struct raft_fsm over them.
 *
 * Snapshot layout (version 1, little-endian like the entries): u8
 * version, u64 applied, the epoch (u64 term, u64 leader, u32 lease_ms,
 * str address), the config (u64 epoch, u64 digest, u32-length text), u64
 * (version 3: then its proposer, str who, claimed_as, reason, source),
 * u64 refused, u64 members_changed, u32 key count, then per key in (service,
 * key) order: str service, str key, u64 consumed, u64 denied, f64 demand,
 * u64 last_second; then (version 2) u32 count and the leaving ids, u64
 * each, ascending; then (version 3) u32 count and the usage marks in
 * incarnation order, u64 incarnation, u64 id, u64 second each; zero
 * bytes up to a multiple of 8, like the entries. Versions 1 (no leaving
 * ids) and 2 (no marks) are still read, as empty sets.
 */
#include "consensus_fsm.h"

#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>

#define SNAPSHOT_VERSION 3

static uint64_t
hash_key(const char *service, const char *key)
{
	uint64_t h = 1469598103934665603ull;

	for (const char *p = service; *p != '\0'; p++)
		h = (h ^ (uint8_t) *p) * 1099511628211ull;
	h = (h ^ 0xff) * 1099511628211ull; /* no byte of a string is 0xff
	                                    * and 0 ends it: a separator */
	for (const char *p = key; *p != '\0'; p++)
		h = (h ^ (uint8_t) *p) * 1099511628211ull;
	return h;
}

static allot__cusage_total *
find_slot(allot__cusage_total *slots, size_t nslots, const char *service,
    const char *key)
{
	size_t i = (size_t) hash_key(service, key) & (nslots - 1);

	for (;;) {
		allot__cusage_total *t = &slots[i];

		if (t->service == NULL ||
		    (strcmp(t->service, service) == 0 &&
		        strcmp(t->key, key) == 0))
			return t;
		i = (i + 1) & (nslots - 1);
	}
}

/* Grows the table so `more` new keys fit under a 70 % load. */
static int
reserve_keys(allot__cfsm *s, size_t more)
{
	size_t n = s->nslots != 0 ? s->nslots : 16;
	allot__cusage_total *slots;

	while ((s->nkeys + more) * 10 >= n * 7)
		n *= 2;
	if (n == s->nslots)
		return ALLOT_OK;
	slots = calloc(n, sizeof *slots);
	if (slots == NULL)
		return ALLOT_ENOMEM;
	for (size_t i = 0; i < s->nslots; i++) {
		allot__cusage_total *t = &s->slots[i];

		if (t->service != NULL)
			*find_slot(slots, n, t->service, t->key) = *t;
	}
	free(s->slots);
	s->slots = slots;
	s->nslots = n;
	return ALLOT_OK;
}

const allot__cusage_total *
allot__cfsm_usage(const allot__cfsm *s, const char *service, const char *key)
{
	const allot__cusage_total *t;

	if (s->nslots == 0)
		return NULL;
	t = find_slot(s->slots, s->nslots, service, key);
	return t->service != NULL ? t : NULL;
}

/* The totals of (service, key), created if absent; NULL when out of
 * memory. Room for it must have been reserved. */
static allot__cusage_total *
total_of(allot__cfsm *s, const char *service, const char *key)
{
	allot__cusage_total *t = find_slot(s->slots, s->nslots, service, key);

	if (t->service == NULL) {
		char *sv = strdup(service);
		char *k = strdup(key);

		if (sv == NULL || k == NULL) {
			free(sv);
			free(k);
			return NULL;
		}
		t->service = sv;
		t->key = k;
		s->nkeys++;
	}
	return t;
}

/* The records new to the marks stay in the entry (in place), for the
 * store; their counts go to the totals. */
static int
apply_account(allot__cfsm *s, allot__centry *e)
{
	int rv = reserve_keys(s, e->account.n);

	if (rv != ALLOT_OK)
		return rv;
	e->account.n = allot__marks_filter(
	    &s->marks, e->account.rows, e->account.n, &s->usage_overlaps);
	for (size_t i = 0; i < e->account.n; i++) {
		const allot__row_count *c = &e->account.rows[i];
		allot__cusage_total *t;

		if (c->id == 0 || c->quota == NULL)
			continue;
		t = total_of(
		    s, c->service != NULL ? c->service : "", c->quota);
		if (t == NULL)
			return ALLOT_ENOMEM;
		t->consumed += c->admitted;
		t->denied += c->denied;
		if (c->second > 0 && (uint64_t) c->second > t->last_second)
			t->last_second = (uint64_t) c->second;
	}
	return ALLOT_OK;
}

static int
apply_usage(allot__cfsm *s, const allot__centry *e)
{
	/* Room for every row's key first, so a batch is not left half
	 * applied by a failed grow. (A failed strdup still can: libraft then
	 * stops this member, which rebuilds from its snapshot and log.) */
	int rv = reserve_keys(s, e->usage.n);

	if (rv != ALLOT_OK)
		return rv;
	for (size_t i = 0; i < e->usage.n; i++) {
		const allot__row_usage *row = &e->usage.rows[i];
		allot__cusage_total *t = total_of(s, row->service, row->key);

		if (t == NULL)
			return ALLOT_ENOMEM;
		t->consumed += row->consumed;
		t->denied += row->denied;
		t->demand += row->demand;
		if (row->second > t->last_second)
			t->last_second = row->second;
	}
	return ALLOT_OK;
}

bool
allot__cfsm_leaving(const allot__cfsm *s, uint64_t id)
{
	for (unsigned i = 0; i < s->nleaving; i++)
		if (s->leaving[i] == id)
			return true;
	return false;
}

/* LEAVING adds the id to the set (kept ascending), REMOVED takes it out:
 * the set is what leaders still have to remove. */
static void
apply_member(allot__cfsm *s, const allot__centry *e, bool *ret_taken)
{
	unsigned i = 0;

	s->members_changed++;
	while (i < s->nleaving && s->leaving[i] < e->member.id)
		i++;
	bool there = i < s->nleaving && s->leaving[i] == e->member.id;

	if (e->member.event == ALLOT__CMEMBER_REMOVED && there) {
		memmove(&s->leaving[i], &s->leaving[i + 1],
		    (s->nleaving - i - 1) * sizeof s->leaving[0]);
		s->nleaving--;
	} else if (e->member.event == ALLOT__CMEMBER_LEAVING && !there) {
		if (s->nleaving == ALLOT__CFSM_LEAVING_MAX) {
			s->refused++;
			*ret_taken = false;
			return;
		}
		memmove(&s->leaving[i + 1], &s->leaving[i],
		    (s->nleaving - i) * sizeof s->leaving[0]);
		s->leaving[i] = e->member.id;
		s->nleaving++;
	}
}

static void
free_who(char *who[4])
{
	for (int i = 0; i < 4; i++) {
		free(who[i]);
		who[i] = NULL;
	}
}

/* The config's proposer: copies of `w`'s strings ("" is none). */
static int
set_who(allot__cfsm *s, const allot__cwho *w)
{
	const char *in[4] = { w->who, w->claimed_as, w->reason, w->source };
	char *out[4] = { NULL, NULL, NULL, NULL };

	for (int i = 0; i < 4; i++) {
		if (in[i] == NULL || in[i][0] == '\0')
			continue;
		if ((out[i] = strdup(in[i])) == NULL) {
			free_who(out);
			return ALLOT_ENOMEM;
		}
	}
	free_who(s->config.who);
	memcpy(s->config.who, out, sizeof out);
	return ALLOT_OK;
}

/* Applies a decoded entry; *ret_taken says whether it changed the
 * epoch or config (refused ones only count). */
static int
apply_entry(allot__cfsm *s, allot__centry *e, bool *ret_taken)
{
	char *copy;

	*ret_taken = true;
	switch (e->type) {
	case ALLOT__CENTRY_EPOCH:
		/* Terms of committed EPOCH entries never go down in log order
		 * (a leader's entries follow every earlier term's); the check
		 * keeps the epoch monotonic whatever the log holds. */
		if (e->epoch.term <= s->epoch.term) {
			s->refused += e->epoch.term < s->epoch.term;
			*ret_taken = e->epoch.term == s->epoch.term;
			return ALLOT_OK;
		}
		copy = strdup(e->epoch.address);
		if (copy == NULL)
			return ALLOT_ENOMEM;
		free(s->epoch.address);
		s->epoch.address = copy;
		s->epoch.term = e->epoch.term;
		s->epoch.leader_id = e->epoch.leader_id;
		s->epoch.lease_ms = e->epoch.lease_ms;
		return ALLOT_OK;
	case ALLOT__CENTRY_CONFIG:
		/* Compare-and-set on the config epoch: of two pushes made
		 * against the same config, the first committed wins. */
		if (e->config.config_epoch != s->config.epoch + 1) {
			s->refused++;
			*ret_taken = false;
			return ALLOT_OK;
		}
		copy = malloc(e->config.text_len + 1);
		if (copy == NULL)
			return ALLOT_ENOMEM;
		memcpy(copy, e->config.text, e->config.text_len);
		copy[e->config.text_len] = '\0';
		if (set_who(s, &e->config.who) != ALLOT_OK) {
			free(copy);
			return ALLOT_ENOMEM;
		}
		free(s->config.text);
		s->config.text = copy;
		s->config.len = e->config.text_len;
		s->config.digest = e->config.digest;
		s->config.epoch = e->config.config_epoch;
		return ALLOT_OK;
	case ALLOT__CENTRY_USAGE: return apply_usage(s, e);
	case ALLOT__CENTRY_ACCOUNT: return apply_account(s, e);
	case ALLOT__CENTRY_MEMBER:
		apply_member(s, e, ret_taken);
		return ALLOT_OK;
	case ALLOT__CENTRY_EVENTS: /* fall through: the stores' only */
	case ALLOT__CENTRY_AUDIT: return ALLOT_OK;
	}
	return ALLOT_EPROTO;
}

int
allot__cfsm_apply_at(
    allot__cfsm *s, uint64_t index, const void *buf, size_t len)
{
	allot__centry e;
	bool taken;
	int rv;

	if (index <= s->applied)
		return ALLOT_OK; /* a replay */
	rv = allot__centry_decode(buf, len, &e);
	if (rv != ALLOT_OK)
		return rv;
	rv = apply_entry(s, &e, &taken);
	if (rv == ALLOT_OK) {
		s->applied = index;
		if (s->on_apply != NULL && taken)
			s->on_apply(s->ctx, index, &e);
	}
	allot__centry_clear(&e);
	return rv;
}

static int
cmp_total(const void *a, const void *b)
{
	const allot__cusage_total *x = *(const allot__cusage_total *const *) a;
	const allot__cusage_total *y = *(const allot__cusage_total *const *) b;
	int c = strcmp(x->service, y->service);

	return c != 0 ? c : strcmp(x->key, y->key);
}

static int
cmp_mark(const void *a, const void *b)
{
	const allot__mark *x = a, *y = b;

	return x->incarnation < y->incarnation ? -1 :
	    x->incarnation > y->incarnation    ? 1 :
	                                         0;
}

/* The marks in incarnation order: the same marks, the same bytes. */
static void
encode_marks(allot__cwbuf *w, const allot__marks *m)
{
	allot__mark *v = NULL;

	if (m->n > 0) {
		v = malloc(m->n * sizeof *v);
		if (v == NULL) {
			w->err = w->err != 0 ? w->err : ALLOT_ENOMEM;
			return;
		}
		memcpy(v, m->v, m->n * sizeof *v);
		qsort(v, m->n, sizeof *v, cmp_mark);
	}
	allot__cw_u32(w, (uint32_t) m->n);
	for (size_t i = 0; i < m->n; i++) {
		allot__cw_u64(w, v[i].incarnation);
		allot__cw_u64(w, v[i].id);
		allot__cw_u64(w, (uint64_t) v[i].second);
	}
	free(v);
}

int
allot__cfsm_encode(const allot__cfsm *s, void **ret_buf, size_t *ret_len)
{
	allot__cwbuf w = { 0 };
	const allot__cusage_total **sorted = NULL;
	size_t n = 0;
	const char *addr = s->epoch.address != NULL ? s->epoch.address : "";

	if (s->nkeys > 0) {
		sorted = malloc(s->nkeys * sizeof *sorted);
		if (sorted == NULL)
			return ALLOT_ENOMEM;
		for (size_t i = 0; i < s->nslots; i++)
			if (s->slots[i].service != NULL)
				sorted[n++] = &s->slots[i];
		qsort(sorted, n, sizeof *sorted, cmp_total);
	}
	allot__cw_u8(&w, SNAPSHOT_VERSION);
	allot__cw_u64(&w, s->applied);
	allot__cw_u64(&w, s->epoch.term);
	allot__cw_u64(&w, s->epoch.leader_id);
	allot__cw_u32(&w, s->epoch.lease_ms);
	allot__cw_str(&w, addr, strlen(addr), 0);
	allot__cw_u64(&w, s->config.epoch);
	allot__cw_u64(&w, s->config.digest);
	allot__cw_str(&w, s->config.text != NULL ? s->config.text : "",
	    s->config.len, 1);
	for (int i = 0; i < 4; i++) {
		const char *x = s->config.who[i] != NULL ? s->config.who[i] :
		                                           "";
		allot__cw_str(&w, x, strlen(x), 0);
	}
	allot__cw_u64(&w, s->refused);
	allot__cw_u64(&w, s->members_changed);
	allot__cw_u32(&w, (uint32_t) n);
	for (size_t i = 0; i < n; i++) {
		const allot__cusage_total *t = sorted[i];

		allot__cw_str(&w, t->service, strlen(t->service), 0);
		allot__cw_str(&w, t->key, strlen(t->key), 0);
		allot__cw_u64(&w, t->consumed);
		allot__cw_u64(&w, t->denied);
		allot__cw_f64(&w, t->demand);
		allot__cw_u64(&w, t->last_second);
	}
	free(sorted);
	allot__cw_u32(&w, s->nleaving);
	for (unsigned i = 0; i < s->nleaving; i++)
		allot__cw_u64(&w, s->leaving[i]);
	encode_marks(&w, &s->marks);
	allot__cw_pad(&w);
	if (w.err != 0) {
		raft_free(w.p);
		return w.err;
	}
	*ret_buf = w.p;
	*ret_len = w.len;
	return ALLOT_OK;
}

static char *
dup_str(allot__crbuf *r, int wide, size_t *ret_len)
{
	size_t len;
	const char *p = allot__cr_str(r, &len, wide);
	char *d;

	if (p == NULL)
		return NULL;
	d = malloc(len + 1);
	if (d == NULL) {
		r->bad = 2; /* out of memory, not malformed */
		return NULL;
	}
	memcpy(d, p, len);
	d[len] = '\0';
	if (ret_len != NULL)
		*ret_len = len;
	return d;
}

/* Reads the key rows of a snapshot into `t` (an empty state). */
static void
decode_totals(allot__crbuf *r, allot__cfsm *t)
{
	uint32_t n = allot__cr_u32(r);

	if (r->bad || n > (r->len - r->off) / 36) {
		r->bad = r->bad ? r->bad : 1;
		return;
	}
	if (reserve_keys(t, n) != ALLOT_OK) {
		r->bad = 2;
		return;
	}
	for (uint32_t i = 0; i < n && !r->bad; i++) {
		char *service = dup_str(r, 0, NULL);
		char *key = dup_str(r, 0, NULL);
		allot__cusage_total *slot;

		if (service == NULL || key == NULL ||
		    (slot = find_slot(t->slots, t->nslots, service, key))
		            ->service != NULL) {
			free(service);
			free(key);
			r->bad = r->bad ? r->bad : 1; /* short, or a repeat */
			return;
		}
		slot->service = service;
		slot->key = key;
		slot->consumed = allot__cr_u64(r);
		slot->denied = allot__cr_u64(r);
		slot->demand = allot__cr_f64(r);
		slot->last_second = allot__cr_u64(r);
		t->nkeys++;
	}
}

/* The leaving ids of a version 2 snapshot: ascending, at most the
 * maximum, else malformed. */
static void
decode_leaving(allot__crbuf *r, allot__cfsm *t)
{
	uint32_t n = allot__cr_u32(r);

	if (n > ALLOT__CFSM_LEAVING_MAX) {
		r->bad = r->bad ? r->bad : 1;
		return;
	}
	for (uint32_t i = 0; i < n && !r->bad; i++) {
		t->leaving[i] = allot__cr_u64(r);
		if (i > 0 && t->leaving[i] <= t->leaving[i - 1])
			r->bad = 1;
	}
	t->nleaving = n;
}

/* The usage marks of a version 3 snapshot: ascending, at most the
 * bound, else malformed. */
static void
decode_marks(allot__crbuf *r, allot__cfsm *t)
{
	uint32_t n = allot__cr_u32(r);
	uint64_t prev = 0;

	if (r->bad || n > ALLOT__MARKS_MAX || n > (r->len - r->off) / 24) {
		r->bad = r->bad ? r->bad : 1;
		return;
	}
	for (uint32_t i = 0; i < n && !r->bad; i++) {
		uint64_t inc = allot__cr_u64(r);
		uint64_t id = allot__cr_u64(r);
		int64_t second = (int64_t) allot__cr_u64(r);

		if (r->bad)
			return;
		if (i > 0 && inc <= prev) {
			r->bad = 1;
			return;
		}
		prev = inc;
		if (allot__marks_set(&t->marks, inc, id, second) != ALLOT_OK)
			r->bad = 2;
	}
}

int
allot__cfsm_decode(allot__cfsm *s, const void *buf, size_t len)
{
	allot__crbuf r = { .p = buf, .len = len };
	allot__cfsm t;
	uint8_t version = allot__cr_u8(&r);

	if (r.bad)
		return ALLOT_EPROTO;
	if (version < 1 || version > SNAPSHOT_VERSION)
		return ALLOT_ERANGE;
	if (allot__cfsm_init(&t, NULL, NULL) != ALLOT_OK)
		return ALLOT_ENOMEM;
	t.applied = allot__cr_u64(&r);
	t.epoch.term = allot__cr_u64(&r);
	t.epoch.leader_id = allot__cr_u64(&r);
	t.epoch.lease_ms = allot__cr_u32(&r);
	t.epoch.address = dup_str(&r, 0, NULL);
	t.config.epoch = allot__cr_u64(&r);
	t.config.digest = allot__cr_u64(&r);
	t.config.text = dup_str(&r, 1, &t.config.len);
	for (int i = 0; version >= 3 && i < 4; i++) {
		t.config.who[i] = dup_str(&r, 0, NULL);
		if (t.config.who[i] != NULL && t.config.who[i][0] == '\0') {
			free(t.config.who[i]);
			t.config.who[i] = NULL;
		}
	}
	t.refused = allot__cr_u64(&r);
	t.members_changed = allot__cr_u64(&r);
	decode_totals(&r, &t);
	if (version >= 2)
		decode_leaving(&r, &t);
	if (version >= 3)
		decode_marks(&r, &t);
	if (!allot__cr_end(&r)) {
		int rv = r.bad == 2 ? ALLOT_ENOMEM : ALLOT_EPROTO;

		allot__cfsm_finish(&t);
		return rv;
	}
	/* The new state, under the old one's wiring. */
	t.fsm = s->fsm;
	t.raft = s->raft;
	t.on_apply = s->on_apply;
	t.on_restore = s->on_restore;
	t.ctx = s->ctx;
	allot__cfsm_finish(s);
	*s = t;
	return ALLOT_OK;
}

static int
to_raft_err(int rv)
{
	switch (rv) {
	case ALLOT_OK: return 0;
	case ALLOT_ENOMEM: return RAFT_NOMEM;
	default: return RAFT_MALFORMED;
	}
}

static int
fsm_apply(struct raft_fsm *fsm, const struct raft_buffer *buf, void **result)
{
	allot__cfsm *s = fsm->data;
	uint64_t index = s->raft != NULL ? raft_last_applied(s->raft) + 1 :
	                                   s->applied + 1;

	*result = NULL;
	/* An error here stops libraft applying on this member: better a
	 * member that stops than one that diverges. */
	return to_raft_err(
	    allot__cfsm_apply_at(s, index, buf->base, buf->len));
}

static int
fsm_snapshot(
    struct raft_fsm *fsm, struct raft_buffer *bufs[], unsigned *n_bufs)
{
	allot__cfsm *s = fsm->data;
	struct raft_buffer *b = raft_malloc(sizeof *b);
	int rv;

	if (b == NULL)
		return RAFT_NOMEM;
	rv = allot__cfsm_encode(s, &b->base, &b->len);
	if (rv != ALLOT_OK) {
		raft_free(b);
		return to_raft_err(rv);
	}
	*bufs = b;
	*n_bufs = 1;
	return 0;
}

static int
fsm_restore(struct raft_fsm *fsm, struct raft_buffer *buf)
{
	allot__cfsm *s = fsm->data;
	int rv = allot__cfsm_decode(s, buf->base, buf->len);

	if (rv != ALLOT_OK)
		return to_raft_err(rv);
	raft_free(buf->base); /* on success the FSM owns the buffer */
	if (s->on_restore != NULL)
		s->on_restore(s->ctx, s);
	return 0;
}

int
allot__cfsm_init(allot__cfsm *s, allot__cfsm_apply_cb on_apply, void *ctx)
{
	memset(s, 0, sizeof *s);
	s->fsm.version = 1;
	s->fsm.data = s;
	s->fsm.apply = fsm_apply;
	s->fsm.snapshot = fsm_snapshot;
	s->fsm.restore = fsm_restore;
	s->on_apply = on_apply;
	s->ctx = ctx;
	return ALLOT_OK;
}

void
allot__cfsm_finish(allot__cfsm *s)
{
	if (s == NULL)
		return;
	for (size_t i = 0; i < s->nslots; i++) {
		free(s->slots[i].service);
		free(s->slots[i].key);
	}
	free(s->slots);
	free(s->epoch.address);
	free(s->config.text);
	free_who(s->config.who);
	allot__marks_fini(&s->marks);
	s->slots = NULL;
	s->nslots = s->nkeys = 0;
	s->epoch.address = NULL;
	s->config.text = NULL;
}
