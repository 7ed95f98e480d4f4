/* SPDX-License-Identifier: MIT */
/*
 * The store's in-memory batch (store_batch.h): find-or-add on the
 * coalescing tables, ops and their strings in the common bump arena, and
 * the two operations the commit needs when a commit failed: trimming to
 * the queue bound and merging a newer batch into the one kept for retry.
 * Also the interned (service, quota) keys all batches point at.
 */
#include "store_batch.h"

#include <stdlib.h>
#include <string.h>

/* Distinct (service, quota) pairs the store will intern; records beyond
 * it are refused and counted (a bound against garbage quota names). */
#define KEYS_MAX (1u << 20)
#define NIL ALLOT__TAB_NIL

struct key_ent {
	allot__tab_hdr hdr;
	struct key *k;
};

static const char *
arena_strdup(allot__arena *a, const char *s)
{
	if (s == NULL)
		return NULL;
	size_t n = strlen(s) + 1;
	char *p = allot__arena_alloc(a, n);
	if (p != NULL)
		memcpy(p, s, n);
	return p;
}

void
allot__batch_init(struct batch *b)
{
	memset(b, 0, sizeof *b);
	b->tail = &b->ops;
	allot__tab_init(&b->usage, sizeof(struct usage_ent));
	allot__tab_init(&b->shares, sizeof(struct share_ent));
	allot__tab_init(&b->seen, sizeof(struct seen_ent));
	allot__tab_init(&b->levels, sizeof(struct level_ent));
}

size_t
allot__batch_rows(const struct batch *b)
{
	return b->nops + b->usage_live + b->shares.n + b->seen.n +
	    b->levels.n + b->ncounts;
}

void
allot__batch_clear(struct batch *b)
{
	allot__arena_reset(&b->arena);
	b->ops = NULL;
	b->tail = &b->ops;
	b->nops = 0;
	allot__tab_clear(&b->usage);
	b->usage_live = 0;
	b->drop_head = 0;
	allot__tab_clear(&b->shares);
	allot__tab_clear(&b->seen);
	allot__tab_clear(&b->levels);
	b->ncounts = 0;
	b->counts_trimmed = false;
}

void
allot__batch_free(struct batch *b)
{
	allot__arena_destroy(&b->arena);
	allot__tab_free(&b->usage);
	allot__tab_free(&b->shares);
	allot__tab_free(&b->seen);
	allot__tab_free(&b->levels);
	free(b->counts);
	b->counts = NULL;
	b->ncounts = b->ccounts = 0;
}

bool
allot__batch_count(struct batch *b, const allot__row_count *row)
{
	if (b->ncounts == b->ccounts) {
		size_t c = b->ccounts == 0 ? 64 : 2 * b->ccounts;
		allot__row_count *n = realloc(b->counts, c * sizeof *n);
		if (n == NULL)
			return false;
		b->counts = n;
		b->ccounts = c;
	}
	b->counts[b->ncounts++] = *row;
	return true;
}

static uint64_t
usage_hash(int64_t sec, const struct key *k)
{
	return allot__mix64(k->h + (uint64_t) sec * 0x9e3779b97f4a7c15ull);
}

struct usage_ent *
allot__batch_usage(struct batch *b, int64_t sec, const struct key *k)
{
	uint64_t h = usage_hash(sec, k);
	for (uint32_t i = allot__tab_head(&b->usage, h); i != NIL;) {
		struct usage_ent *e = (struct usage_ent *) allot__tab_at(
		    &b->usage, i);
		if (e->hdr.h == h && e->sec == sec && e->k == k)
			return e;
		i = e->hdr.next;
	}
	uint32_t i = allot__tab_add(&b->usage, h);
	if (i == NIL)
		return NULL;
	struct usage_ent *e = (struct usage_ent *) allot__tab_at(&b->usage, i);
	e->sec = sec;
	e->k = k;
	b->usage_live++;
	return e;
}

struct share_ent *
allot__batch_share(struct batch *b, uint64_t session, const struct key *k)
{
	uint64_t h = allot__share_hash(session, k);
	for (uint32_t i = allot__tab_head(&b->shares, h); i != NIL;) {
		struct share_ent *e = (struct share_ent *) allot__tab_at(
		    &b->shares, i);
		if (e->hdr.h == h && e->session == session && e->k == k)
			return e;
		i = e->hdr.next;
	}
	uint32_t i = allot__tab_add(&b->shares, h);
	if (i == NIL)
		return NULL;
	struct share_ent *e = (struct share_ent *) allot__tab_at(
	    &b->shares, i);
	e->session = session;
	e->k = k;
	return e;
}

struct seen_ent *
allot__batch_seen(struct batch *b, uint64_t session)
{
	uint64_t h = allot__mix64(session);
	for (uint32_t i = allot__tab_head(&b->seen, h); i != NIL;) {
		struct seen_ent *e = (struct seen_ent *) allot__tab_at(
		    &b->seen, i);
		if (e->session == session)
			return e;
		i = e->hdr.next;
	}
	uint32_t i = allot__tab_add(&b->seen, h);
	if (i == NIL)
		return NULL;
	struct seen_ent *e = (struct seen_ent *) allot__tab_at(&b->seen, i);
	e->session = session;
	e->at = INT64_MIN;
	return e;
}

struct level_ent *
allot__batch_level(struct batch *b, const struct key *k)
{
	for (uint32_t i = allot__tab_head(&b->levels, k->h); i != NIL;) {
		struct level_ent *e = (struct level_ent *) allot__tab_at(
		    &b->levels, i);
		if (e->k == k)
			return e;
		i = e->hdr.next;
	}
	uint32_t i = allot__tab_add(&b->levels, k->h);
	if (i == NIL)
		return NULL;
	struct level_ent *e = (struct level_ent *) allot__tab_at(
	    &b->levels, i);
	e->k = k;
	e->at = INT64_MIN;
	return e;
}

struct op *
allot__batch_op_new(struct batch *b, enum op_kind kind, int64_t at)
{
	struct op *o = allot__arena_alloc(&b->arena, sizeof *o);
	if (o == NULL)
		return NULL;
	memset(o, 0, sizeof *o);
	o->kind = kind;
	o->at = at;
	return o;
}

bool
allot__batch_op_push(struct batch *b, struct op *o, const char *s0,
    const char *s1, const char *s2, const char *s3)
{
	const char *in[4] = { s0, s1, s2, s3 };
	return allot__batch_op_push_v(b, o, in, 4);
}

bool
allot__batch_op_push_v(
    struct batch *b, struct op *o, const char *const *in, size_t n)
{
	for (size_t i = 0; i < n && i < OP_STRINGS; i++) {
		if (in[i] == NULL)
			continue;
		o->s[i] = arena_strdup(&b->arena, in[i]);
		if (o->s[i] == NULL)
			return false;
	}
	*b->tail = o;
	b->tail = &o->next;
	b->nops++;
	return true;
}

uint64_t
allot__batch_trim(struct batch *b, size_t bound)
{
	uint64_t dropped = 0;
	while (allot__batch_rows(b) > bound && b->usage_live > 0) {
		while (!allot__tab_at(&b->usage, b->drop_head)->live)
			b->drop_head++;
		allot__tab_unlink(&b->usage, b->drop_head);
		b->drop_head++;
		b->usage_live--;
		dropped++;
	}
	if (allot__batch_rows(b) > bound && b->ncounts > 0) {
		size_t over = allot__batch_rows(b) - bound;
		size_t k = over < b->ncounts ? over : b->ncounts;
		memmove(b->counts, b->counts + k,
		    (b->ncounts - k) * sizeof *b->counts);
		b->ncounts -= k;
		b->counts_trimmed = true;
		dropped += k;
	}
	/* Holes are squeezed out once they are the majority, so memory
	 * stays proportional to the live rows (amortised O(1) per drop). */
	if (dropped > 0 && b->usage.n > 1024 &&
	    b->usage.n - b->usage_live > b->usage.n / 2) {
		allot__tab_compact(&b->usage);
		b->drop_head = 0;
	}
	return dropped;
}

/* Append copies of the ops of `src` to `dst`. Each op is copied once: a
 * failed commit keeps the older batch, and only the newer one's few ops
 * (joins, leaves, config loads, events) move into it. Returns the ops
 * lost to out-of-memory. */
static uint64_t
merge_ops(struct batch *dst, const struct batch *src)
{
	uint64_t lost = 0;
	for (const struct op *s = src->ops; s != NULL; s = s->next) {
		struct op *d = allot__batch_op_new(dst, s->kind, s->at);
		if (d == NULL) {
			lost++;
			continue;
		}
		d->pid = s->pid;
		d->session = s->session;
		d->u = s->u;
		d->u2 = s->u2;
		/* A leave's reason is a static string (store_record.c). */
		if (s->kind == OP_LEFT) {
			d->s[0] = s->s[0];
			if (!allot__batch_op_push(
			        dst, d, NULL, NULL, NULL, NULL))
				lost++;
		} else if (!allot__batch_op_push_v(dst, d, s->s, OP_STRINGS)) {
			lost++;
		}
	}
	return lost;
}

uint64_t
allot__batch_merge(struct batch *dst, struct batch *src)
{
	uint64_t lost = merge_ops(dst, src);
	for (size_t i = 0; i < src->ncounts; i++)
		if (!allot__batch_count(dst, &src->counts[i]))
			lost++;
	dst->counts_trimmed |= src->counts_trimmed;
	for (uint32_t i = 0; i < src->usage.n; i++) {
		const struct usage_ent *s = (const struct usage_ent *)
		    allot__tab_at(&src->usage, i);
		if (!s->hdr.live)
			continue;
		struct usage_ent *d = allot__batch_usage(dst, s->sec, s->k);
		if (d == NULL) {
			lost++;
			continue;
		}
		d->admitted += s->admitted;
		d->denied += s->denied;
		d->shadow_denied += s->shadow_denied;
		d->candidate_denied += s->candidate_denied;
		if (s->candidate_rate > 0)
			d->candidate_rate = s->candidate_rate;
		d->demand += s->demand;
		if (s->live_replicas > d->live_replicas)
			d->live_replicas = s->live_replicas;
	}
	for (uint32_t i = 0; i < src->shares.n; i++) {
		const struct share_ent *s = (const struct share_ent *)
		    allot__tab_at(&src->shares, i);
		struct share_ent *d = allot__batch_share(
		    dst, s->session, s->k);
		if (d == NULL) {
			lost++;
			continue;
		}
		d->rate = s->rate;
		d->burst = s->burst;
		d->lease_until = s->lease_until;
		d->at = s->at;
	}
	for (uint32_t i = 0; i < src->seen.n; i++) {
		const struct seen_ent *s = (const struct seen_ent *)
		    allot__tab_at(&src->seen, i);
		struct seen_ent *d = allot__batch_seen(dst, s->session);
		if (d == NULL) {
			lost++;
			continue;
		}
		if (s->at > d->at)
			d->at = s->at;
	}
	for (uint32_t i = 0; i < src->levels.n; i++) {
		const struct level_ent *s = (const struct level_ent *)
		    allot__tab_at(&src->levels, i);
		struct level_ent *d = allot__batch_level(dst, s->k);
		if (d == NULL) {
			lost++;
			continue;
		}
		d->level = s->level;
		d->at = s->at;
	}
	allot__batch_clear(src);
	return lost;
}

/* ---- interned keys ---- */

void
allot__store_keys_init(allot__store_keys *ks)
{
	memset(ks, 0, sizeof *ks);
	allot__tab_init(&ks->tab, sizeof(struct key_ent));
	ks->seed = allot__hash_seed();
}

void
allot__store_keys_free(allot__store_keys *ks)
{
	allot__tab_free(&ks->tab);
	allot__arena_destroy(&ks->arena);
}

uint64_t
allot__store_keys_hash(const allot__store_keys *ks, const char *service,
    size_t slen, const char *quota, size_t qlen)
{
	return allot__hash(quota, qlen, allot__hash(service, slen, ks->seed));
}

const struct key *
allot__store_keys_intern(allot__store_keys *ks, uint64_t h,
    const char *service, size_t slen, const char *quota, size_t qlen)
{
	for (uint32_t i = allot__tab_head(&ks->tab, h); i != NIL;) {
		struct key_ent *e = (struct key_ent *) allot__tab_at(
		    &ks->tab, i);
		const struct key *k = e->k;
		if (k->h == h && k->slen == slen && k->qlen == qlen &&
		    memcmp(k->service, service, slen) == 0 &&
		    memcmp(k->quota, quota, qlen) == 0)
			return k;
		i = e->hdr.next;
	}
	if (ks->tab.n >= KEYS_MAX || slen > UINT32_MAX || qlen > UINT32_MAX)
		return NULL;
	struct key *k = allot__arena_alloc(
	    &ks->arena, sizeof *k + slen + qlen + 2);
	if (k == NULL)
		return NULL;
	char *s = (char *) (k + 1);
	memcpy(s, service, slen + 1);
	memcpy(s + slen + 1, quota, qlen + 1);
	k->h = h;
	k->service = s;
	k->quota = s + slen + 1;
	k->slen = (uint32_t) slen;
	k->qlen = (uint32_t) qlen;
	uint32_t i = allot__tab_add(&ks->tab, h);
	if (i == NIL)
		return NULL; /* the arena bytes are wasted, nothing else */
	((struct key_ent *) allot__tab_at(&ks->tab, i))->k = k;
	return k;
}
