/* SPDX-License-Identifier: MIT */
/*
 * The coordinator's SQLite store (see store.h for the contract). Records
 * from any thread land in the current batch under one short mutex: usage
 * is summed per (second, service, quota) in a hash table, shares, syncs
 * ("seen") and bucket levels are coalesced per session and quota (only the
 * newest value matters), and the rare events (joins, leaves, config loads,
 * events) are appended to a list allocated from an arena, so a record call
 * does no I/O and, in the steady state, no malloc. The loop thread's flush
 * swaps the current batch for an empty one, merges it into the batch that
 * a failed commit left behind (if any), trims that to max_pending by
 * dropping the oldest usage rows, and writes it in one transaction with
 * statements prepared at open. A failed commit keeps the batch for the
 * next flush. Retention runs after a successful commit, once a minute, one
 * bounded chunk per table per flush.
 */
#include "store.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdalign.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <sqlite3.h>

#include "clock.h"
#include "hash.h"
/* The generated header's opening comment names the schema files with a
 * glob (a slash then a star), and its migrations are string literals
 * longer than the 4095 bytes ISO C guarantees (GCC and Clang take any
 * length). */
#include "schema_sql.h"

/* PRAGMA application_id of an allot database ("ALOT"): tells our files
 * from other SQLite databases a path might point at by mistake. */
#define APP_ID 0x414c4f54

#define DEFAULT_RETENTION_S (7u * 24u * 3600u)
#define DEFAULT_MAX_PENDING ((size_t) 1000000)
#define DEFAULT_BUSY_MS 50u
#define DEFAULT_RETENTION_CHUNK 10000u
/* Opening waits longer for a lock than a flush does: an auditor's brief
 * write lock should not make allotd fail to start. */
#define OPEN_BUSY_MS 5000
#define RETENTION_EVERY_MS 60000
#define DEFAULT_SHARE_REFRESH_MS 10000u
/* Known-written shares not recorded for this long are forgotten (their
 * session or quota is gone); if one returns it is simply written again. */
#define WRITTEN_FORGET_MS 60000
/* Distinct (service, quota) pairs the store will intern; records beyond
 * it are refused and counted (a bound against garbage quota names). */
#define KEYS_MAX (1u << 20)
#define ARENA_CHUNK 65536
#define NIL UINT32_MAX

/* ---- arena: bump allocation for op records and interned strings ---- */

struct chunk {
	struct chunk *next;
	size_t used;
	size_t cap;
	alignas(max_align_t) unsigned char data[];
};

struct arena {
	struct chunk *head; /* allocation happens here; older chunks follow */
};

static void *
arena_alloc(struct arena *a, size_t n)
{
	n = (n + 15) & ~(size_t) 15;
	struct chunk *c = a->head;
	if (c == NULL || c->cap - c->used < n) {
		size_t cap = n > ARENA_CHUNK ? n : ARENA_CHUNK;
		c = malloc(sizeof *c + cap);
		if (c == NULL)
			return NULL;
		c->used = 0;
		c->cap = cap;
		c->next = a->head;
		a->head = c;
	}
	void *p = c->data + c->used;
	c->used += n;
	return p;
}

static const char *
arena_strdup(struct arena *a, const char *s)
{
	if (s == NULL)
		return NULL;
	size_t n = strlen(s) + 1;
	char *p = arena_alloc(a, n);
	if (p != NULL)
		memcpy(p, s, n);
	return p;
}

/* Keep one standard chunk for reuse; free the rest. */
static void
arena_reset(struct arena *a)
{
	struct chunk *keep = NULL;
	struct chunk *c = a->head;
	while (c != NULL) {
		struct chunk *next = c->next;
		if (keep == NULL && c->cap == ARENA_CHUNK) {
			keep = c;
			keep->used = 0;
			keep->next = NULL;
		} else {
			free(c);
		}
		c = next;
	}
	a->head = keep;
}

static void
arena_free(struct arena *a)
{
	struct chunk *c = a->head;
	while (c != NULL) {
		struct chunk *next = c->next;
		free(c);
		c = next;
	}
	a->head = NULL;
}

/* Move every chunk of `src` behind the head of `dst` (dst keeps
 * allocating in its own head chunk). */
static void
arena_splice(struct arena *dst, struct arena *src)
{
	if (src->head == NULL)
		return;
	if (dst->head == NULL) {
		dst->head = src->head;
	} else {
		struct chunk *tail = src->head;
		while (tail->next != NULL)
			tail = tail->next;
		tail->next = dst->head->next;
		dst->head->next = src->head;
	}
	src->head = NULL;
}

/* ---- tab: chained hash table over an array of fixed-size entries ----
 *
 * Entries live in one array in insertion order (so the oldest usage rows
 * are at the front) and start with struct hdr. Buckets hold indices.
 * Clearing keeps the memory, so a batch reaches a steady size and stops
 * allocating. Unlinked entries stay in the array as holes until the next
 * clear or compaction. */

struct hdr {
	uint64_t h;
	uint32_t next;
	uint32_t live;
};

struct tab {
	unsigned char *ents;
	size_t esz;
	uint32_t n; /* entries used, holes included */
	uint32_t cap;
	uint32_t *bkt;
	uint32_t nbkt; /* power of two, or 0 */
};

static void
tab_init(struct tab *t, size_t esz)
{
	memset(t, 0, sizeof *t);
	t->esz = esz;
}

static inline struct hdr *
tab_at(const struct tab *t, uint32_t i)
{
	return (struct hdr *) (void *) (t->ents + (size_t) i * t->esz);
}

static inline uint32_t
tab_head(const struct tab *t, uint64_t h)
{
	return t->nbkt == 0 ? NIL : t->bkt[h & (t->nbkt - 1)];
}

static int
tab_rehash(struct tab *t, uint32_t nbkt)
{
	uint32_t *b = malloc((size_t) nbkt * sizeof *b);
	if (b == NULL)
		return -1;
	memset(b, 0xff, (size_t) nbkt * sizeof *b);
	for (uint32_t i = 0; i < t->n; i++) {
		struct hdr *e = tab_at(t, i);
		if (!e->live)
			continue;
		e->next = b[e->h & (nbkt - 1)];
		b[e->h & (nbkt - 1)] = i;
	}
	free(t->bkt);
	t->bkt = b;
	t->nbkt = nbkt;
	return 0;
}

/* Append a zeroed live entry with hash `h`; NIL when out of memory. The
 * array may move: pointers from tab_at() before this call are stale. */
static uint32_t
tab_add(struct tab *t, uint64_t h)
{
	if (t->n == t->cap) {
		if (t->cap >= (UINT32_MAX >> 1))
			return NIL;
		uint32_t cap = t->cap == 0 ? 64 : t->cap * 2;
		unsigned char *p = realloc(t->ents, (size_t) cap * t->esz);
		if (p == NULL)
			return NIL;
		t->ents = p;
		t->cap = cap;
	}
	if (t->n >= t->nbkt &&
	    tab_rehash(t, t->nbkt == 0 ? 64 : t->nbkt * 2) != 0)
		return NIL;
	uint32_t i = t->n++;
	struct hdr *e = tab_at(t, i);
	memset(e, 0, t->esz);
	e->h = h;
	e->live = 1;
	e->next = t->bkt[h & (t->nbkt - 1)];
	t->bkt[h & (t->nbkt - 1)] = i;
	return i;
}

static void
tab_unlink(struct tab *t, uint32_t i)
{
	struct hdr *e = tab_at(t, i);
	uint32_t *slot = &t->bkt[e->h & (t->nbkt - 1)];
	while (*slot != i)
		slot = &tab_at(t, *slot)->next;
	*slot = e->next;
	e->live = 0;
}

/* Squeeze the holes out (order kept). */
static void
tab_compact(struct tab *t)
{
	uint32_t j = 0;
	for (uint32_t i = 0; i < t->n; i++) {
		if (!tab_at(t, i)->live)
			continue;
		if (i != j)
			memcpy(tab_at(t, j), tab_at(t, i), t->esz);
		j++;
	}
	t->n = j;
	/* Relinking in place cannot fail: the bucket array is kept. */
	memset(t->bkt, 0xff, (size_t) t->nbkt * sizeof *t->bkt);
	for (uint32_t i = 0; i < t->n; i++) {
		struct hdr *e = tab_at(t, i);
		e->next = t->bkt[e->h & (t->nbkt - 1)];
		t->bkt[e->h & (t->nbkt - 1)] = i;
	}
}

static void
tab_free(struct tab *t)
{
	free(t->ents);
	free(t->bkt);
	size_t esz = t->esz;
	tab_init(t, esz);
}

/* Empty the table; memory is kept unless a spike left it mostly unused. */
static void
tab_clear(struct tab *t)
{
	if (t->cap > 65536 && t->n < t->cap / 4) {
		tab_free(t);
		return;
	}
	t->n = 0;
	if (t->nbkt != 0)
		memset(t->bkt, 0xff, (size_t) t->nbkt * sizeof *t->bkt);
}

/* ---- entries ---- */

struct key {
	uint64_t h;
	const char *service;
	const char *quota;
	uint32_t slen;
	uint32_t qlen;
};

struct key_ent {
	struct hdr hdr;
	struct key *k;
};

struct usage_ent {
	struct hdr hdr;
	int64_t sec;
	const struct key *k;
	uint64_t admitted;
	uint64_t denied;
	double demand;
	uint32_t live_replicas;
};

struct share_ent {
	struct hdr hdr;
	uint64_t session;
	const struct key *k;
	double rate;
	double burst;
	int64_t lease_until;
	int64_t at;
	bool write; /* decided by the flush: changed or due a refresh */
};

/* What the database holds for a share, as far as the flush knows: lets
 * it skip shares recorded again unchanged (the common case) and only
 * refresh their lease_until every share_refresh_ms. */
struct written_ent {
	struct hdr hdr;
	uint64_t session;
	const struct key *k;
	double rate;
	double burst;
	int64_t written_at; /* record time of the value last written */
	int64_t seen_at; /* record time of the last share recorded */
};

struct seen_ent {
	struct hdr hdr;
	uint64_t session;
	int64_t at;
};

struct level_ent {
	struct hdr hdr;
	const struct key *k;
	double level;
	int64_t at;
};

enum op_kind { OP_JOIN, OP_LEFT, OP_CONFIG, OP_EVENT };

/* One appended record. JOIN: s = replica_id, service, host, version;
 * u = config digest. LEFT: s[0] = why. CONFIG: u = epoch, u2 = digest,
 * s = path, content. EVENT: s = kind, subject, detail. */
struct op {
	struct op *next;
	enum op_kind kind;
	uint32_t pid;
	int64_t at;
	uint64_t session;
	uint64_t u;
	uint64_t u2;
	const char *s[4];
};

struct batch {
	struct arena arena;
	struct op *ops;
	struct op **tail;
	size_t nops;
	struct tab usage;
	size_t usage_live;
	uint32_t drop_head; /* usage entries before this are all holes */
	struct tab shares;
	struct tab seen;
	struct tab levels;
};

enum {
	S_BEGIN,
	S_COMMIT,
	S_ROLLBACK,
	S_JOIN,
	S_LEFT,
	S_LEFT_SHARES,
	S_CONFIG,
	S_EVENT,
	S_SEEN,
	S_SHARE,
	S_USAGE,
	S_LEVEL,
	S_RESTORE_REPLICAS,
	S_RESTORE_LEVELS,
	S_RET_USAGE,
	S_RET_EVENTS,
	S_RET_HISTORY,
	S_COUNT
};

static const char *const stmt_sql[S_COUNT] = {
	[S_BEGIN] = "BEGIN IMMEDIATE",
	[S_COMMIT] = "COMMIT",
	[S_ROLLBACK] = "ROLLBACK",
	[S_JOIN] =
	    "INSERT INTO replicas (session, replica_id, service, host,"
	    " pid, agent_version, config_digest, joined_at, last_seen)"
	    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8)"
	    " ON CONFLICT (session) DO UPDATE SET"
	    " replica_id = excluded.replica_id, service = excluded.service,"
	    " host = excluded.host, pid = excluded.pid,"
	    " agent_version = excluded.agent_version,"
	    " config_digest = excluded.config_digest,"
	    " last_seen = excluded.last_seen, left_at = NULL, left_why = NULL",
	[S_LEFT] = "UPDATE replicas SET left_at = ?2, left_why = ?3"
	           " WHERE session = ?1 AND left_at IS NULL",
	[S_LEFT_SHARES] = "DELETE FROM shares WHERE session = ?1",
	[S_CONFIG] = "INSERT INTO configs (epoch, digest, path, content,"
	             " loaded_at) VALUES (?1, ?2, ?3, ?4, ?5)",
	[S_EVENT] = "INSERT INTO events (at, kind, subject, detail)"
	            " VALUES (?1, ?2, ?3, ?4)",
	[S_SEEN] = "UPDATE replicas SET last_seen = max(last_seen, ?2)"
	           " WHERE session = ?1",
	[S_SHARE] =
	    "INSERT INTO shares (session, service, quota, rate, burst,"
	    " lease_until, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
	    " ON CONFLICT (session, service, quota) DO UPDATE SET"
	    " rate = excluded.rate, burst = excluded.burst,"
	    " lease_until = excluded.lease_until,"
	    " updated_at = excluded.updated_at",
	[S_USAGE] =
	    "INSERT INTO usage (service, quota, at, admitted, denied,"
	    " demand, live_replicas) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
	    " ON CONFLICT (at, service, quota) DO UPDATE SET"
	    " admitted = admitted + excluded.admitted,"
	    " denied = denied + excluded.denied,"
	    " demand = demand + excluded.demand,"
	    " live_replicas = max(live_replicas, excluded.live_replicas)",
	[S_LEVEL] =
	    "INSERT INTO levels (service, quota, level, at)"
	    " VALUES (?1, ?2, ?3, ?4) ON CONFLICT (service, quota) DO UPDATE"
	    " SET level = excluded.level, at = excluded.at"
	    " WHERE excluded.at >= levels.at",
	[S_RESTORE_REPLICAS] =
	    "SELECT session, replica_id, service, last_seen"
	    " FROM replicas WHERE left_at IS NULL ORDER BY session",
	[S_RESTORE_LEVELS] = "SELECT service, quota, level, at FROM levels"
	                     " ORDER BY service, quota",
	[S_RET_USAGE] = "DELETE FROM usage WHERE (at, service, quota) IN"
	                " (SELECT at, service, quota FROM usage WHERE at < ?1"
	                " ORDER BY at LIMIT ?2)",
	[S_RET_EVENTS] = "DELETE FROM events WHERE id IN (SELECT id"
	                 " FROM events WHERE at < ?1 ORDER BY at LIMIT ?2)",
	[S_RET_HISTORY] =
	    "DELETE FROM share_history WHERE id IN (SELECT id"
	    " FROM share_history WHERE at < ?1 ORDER BY at LIMIT ?2)",
};

struct allot__store {
	char *path;
	sqlite3 *db;
	sqlite3_stmt *stmt[S_COUNT];
	allot__logger lg;
	allot__store_opts opts;
	uint64_t seed;
	int64_t (*clock)(void *ctx);
	void *clock_ctx;

	pthread_mutex_t mu;
	/* Under mu: the batch records go to, the interned keys, counters. */
	struct batch *cur;
	struct tab keys;
	struct arena key_arena;
	uint64_t max_session;
	uint64_t rows_dropped;
	uint64_t rows_rejected;
	uint64_t commits;
	uint64_t commit_failures;
	uint64_t rows_written;
	uint64_t retention_deleted;
	uint64_t retention_failures;
	uint64_t shares_unchanged;
	size_t retry_rows;
	double last_commit_ms;
	int last_error;

	/* Loop thread only. */
	struct batch *retry; /* what the last failed commit left */
	struct batch *spare; /* empty, swapped in at the next flush */
	struct batch b[3];
	struct tab written; /* struct written_ent */
	struct tab left; /* struct seen_ent: sessions that left, scratch */
	int64_t next_forget_ms;
	int64_t next_retention_ms;
	char errmsg[256]; /* sqlite3_errmsg() of the last failure */
	bool failing;
	uint64_t dropped_logged;
	uint64_t rejected_logged;
	allot__logrl rl_fail;
	allot__logrl rl_drop;
	allot__logrl rl_retention;
};

/* ---- batches ---- */

static void
batch_init(struct batch *b)
{
	memset(b, 0, sizeof *b);
	b->tail = &b->ops;
	tab_init(&b->usage, sizeof(struct usage_ent));
	tab_init(&b->shares, sizeof(struct share_ent));
	tab_init(&b->seen, sizeof(struct seen_ent));
	tab_init(&b->levels, sizeof(struct level_ent));
}

static size_t
batch_rows(const struct batch *b)
{
	return b->nops + b->usage_live + b->shares.n + b->seen.n + b->levels.n;
}

static void
batch_clear(struct batch *b)
{
	arena_reset(&b->arena);
	b->ops = NULL;
	b->tail = &b->ops;
	b->nops = 0;
	tab_clear(&b->usage);
	b->usage_live = 0;
	b->drop_head = 0;
	tab_clear(&b->shares);
	tab_clear(&b->seen);
	tab_clear(&b->levels);
}

static void
batch_free(struct batch *b)
{
	arena_free(&b->arena);
	tab_free(&b->usage);
	tab_free(&b->shares);
	tab_free(&b->seen);
	tab_free(&b->levels);
}

static uint64_t
usage_hash(int64_t sec, const struct key *k)
{
	return allot__mix64(k->h + (uint64_t) sec * 0x9e3779b97f4a7c15ull);
}

static uint64_t
share_hash(uint64_t session, const struct key *k)
{
	return allot__mix64(k->h ^ (session * 0xbf58476d1ce4e5b9ull));
}

/* The usage entry of (sec, k), created zeroed if absent; NULL when out of
 * memory. */
static struct usage_ent *
usage_get(struct batch *b, int64_t sec, const struct key *k)
{
	uint64_t h = usage_hash(sec, k);
	for (uint32_t i = tab_head(&b->usage, h); i != NIL;) {
		struct usage_ent *e = (struct usage_ent *) tab_at(
		    &b->usage, i);
		if (e->hdr.h == h && e->sec == sec && e->k == k)
			return e;
		i = e->hdr.next;
	}
	uint32_t i = tab_add(&b->usage, h);
	if (i == NIL)
		return NULL;
	struct usage_ent *e = (struct usage_ent *) tab_at(&b->usage, i);
	e->sec = sec;
	e->k = k;
	b->usage_live++;
	return e;
}

static struct share_ent *
share_get(struct batch *b, uint64_t session, const struct key *k)
{
	uint64_t h = share_hash(session, k);
	for (uint32_t i = tab_head(&b->shares, h); i != NIL;) {
		struct share_ent *e = (struct share_ent *) tab_at(
		    &b->shares, i);
		if (e->hdr.h == h && e->session == session && e->k == k)
			return e;
		i = e->hdr.next;
	}
	uint32_t i = tab_add(&b->shares, h);
	if (i == NIL)
		return NULL;
	struct share_ent *e = (struct share_ent *) tab_at(&b->shares, i);
	e->session = session;
	e->k = k;
	return e;
}

static struct seen_ent *
seen_get(struct batch *b, uint64_t session)
{
	uint64_t h = allot__mix64(session);
	for (uint32_t i = tab_head(&b->seen, h); i != NIL;) {
		struct seen_ent *e = (struct seen_ent *) tab_at(&b->seen, i);
		if (e->session == session)
			return e;
		i = e->hdr.next;
	}
	uint32_t i = tab_add(&b->seen, h);
	if (i == NIL)
		return NULL;
	struct seen_ent *e = (struct seen_ent *) tab_at(&b->seen, i);
	e->session = session;
	e->at = INT64_MIN;
	return e;
}

static struct level_ent *
level_get(struct batch *b, const struct key *k)
{
	for (uint32_t i = tab_head(&b->levels, k->h); i != NIL;) {
		struct level_ent *e = (struct level_ent *) tab_at(
		    &b->levels, i);
		if (e->k == k)
			return e;
		i = e->hdr.next;
	}
	uint32_t i = tab_add(&b->levels, k->h);
	if (i == NIL)
		return NULL;
	struct level_ent *e = (struct level_ent *) tab_at(&b->levels, i);
	e->k = k;
	e->at = INT64_MIN;
	return e;
}

/* Drop the oldest usage rows until the batch holds at most `bound` rows
 * (or no usage is left: other rows are never dropped). Returns how many
 * were dropped. */
static uint64_t
batch_trim(struct batch *b, size_t bound)
{
	uint64_t dropped = 0;
	while (batch_rows(b) > bound && b->usage_live > 0) {
		while (!tab_at(&b->usage, b->drop_head)->live)
			b->drop_head++;
		tab_unlink(&b->usage, b->drop_head);
		b->drop_head++;
		b->usage_live--;
		dropped++;
	}
	/* Holes are squeezed out once they are the majority, so memory
	 * stays proportional to the live rows (amortised O(1) per drop). */
	if (dropped > 0 && b->usage.n > 1024 &&
	    b->usage.n - b->usage_live > b->usage.n / 2) {
		tab_compact(&b->usage);
		b->drop_head = 0;
	}
	return dropped;
}

/* Move everything of `src` (newer) into `dst` (older) and empty `src`.
 * Usage adds up, shares and levels keep the newer value, syncs the later
 * time; ops are appended. Returns rows lost to out-of-memory. */
static uint64_t
batch_merge(struct batch *dst, struct batch *src)
{
	uint64_t lost = 0;
	if (src->ops != NULL) {
		*dst->tail = src->ops;
		dst->tail = src->tail;
		dst->nops += src->nops;
		arena_splice(&dst->arena, &src->arena);
		src->ops = NULL;
		src->tail = &src->ops;
		src->nops = 0;
	}
	for (uint32_t i = 0; i < src->usage.n; i++) {
		const struct usage_ent *s = (const struct usage_ent *) tab_at(
		    &src->usage, i);
		if (!s->hdr.live)
			continue;
		struct usage_ent *d = usage_get(dst, s->sec, s->k);
		if (d == NULL) {
			lost++;
			continue;
		}
		d->admitted += s->admitted;
		d->denied += s->denied;
		d->demand += s->demand;
		if (s->live_replicas > d->live_replicas)
			d->live_replicas = s->live_replicas;
	}
	for (uint32_t i = 0; i < src->shares.n; i++) {
		const struct share_ent *s = (const struct share_ent *) tab_at(
		    &src->shares, i);
		struct share_ent *d = share_get(dst, s->session, s->k);
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
		const struct seen_ent *s = (const struct seen_ent *) tab_at(
		    &src->seen, i);
		struct seen_ent *d = seen_get(dst, s->session);
		if (d == NULL) {
			lost++;
			continue;
		}
		if (s->at > d->at)
			d->at = s->at;
	}
	for (uint32_t i = 0; i < src->levels.n; i++) {
		const struct level_ent *s = (const struct level_ent *) tab_at(
		    &src->levels, i);
		struct level_ent *d = level_get(dst, s->k);
		if (d == NULL) {
			lost++;
			continue;
		}
		d->level = s->level;
		d->at = s->at;
	}
	batch_clear(src);
	return lost;
}

/* ---- record side (any thread) ---- */

int64_t
allot__wall_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t
now_ms(const allot__store *st)
{
	return st->clock != NULL ? st->clock(st->clock_ctx) : allot__wall_ms();
}

static uint64_t
key_hash(const allot__store *st, const char *service, size_t slen,
    const char *quota, size_t qlen)
{
	return allot__hash(quota, qlen, allot__hash(service, slen, st->seed));
}

/* The interned (service, quota) pair; NULL when out of memory or over
 * KEYS_MAX. Keys live until the store closes, so batches and the flush
 * may hold their pointers without the lock. Caller holds mu. */
static const struct key *
intern(allot__store *st, uint64_t h, const char *service, size_t slen,
    const char *quota, size_t qlen)
{
	for (uint32_t i = tab_head(&st->keys, h); i != NIL;) {
		struct key_ent *e = (struct key_ent *) tab_at(&st->keys, i);
		const struct key *k = e->k;
		if (k->h == h && k->slen == slen && k->qlen == qlen &&
		    memcmp(k->service, service, slen) == 0 &&
		    memcmp(k->quota, quota, qlen) == 0)
			return k;
		i = e->hdr.next;
	}
	if (st->keys.n >= KEYS_MAX || slen > UINT32_MAX || qlen > UINT32_MAX)
		return NULL;
	struct key *k = arena_alloc(
	    &st->key_arena, sizeof *k + slen + qlen + 2);
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
	uint32_t i = tab_add(&st->keys, h);
	if (i == NIL)
		return NULL; /* the arena bytes are wasted, nothing else */
	((struct key_ent *) tab_at(&st->keys, i))->k = k;
	return k;
}

/* After a row was added to the current batch: enforce max_pending on it
 * (the flush enforces it again on what a failed commit left behind). */
static void
bound_cur(allot__store *st)
{
	if (batch_rows(st->cur) > st->opts.max_pending)
		st->rows_dropped += batch_trim(st->cur, st->opts.max_pending);
}

static struct op *
op_new(allot__store *st, enum op_kind kind, int64_t at)
{
	struct batch *b = st->cur;
	struct op *o = arena_alloc(&b->arena, sizeof *o);
	if (o == NULL) {
		st->rows_rejected++;
		return NULL;
	}
	memset(o, 0, sizeof *o);
	o->kind = kind;
	o->at = at;
	return o;
}

/* Copies the strings of `o`; on failure the op is not queued. */
static void
op_push(allot__store *st, struct op *o, const char *s0, const char *s1,
    const char *s2, const char *s3)
{
	struct batch *b = st->cur;
	const char *in[4] = { s0, s1, s2, s3 };
	for (int i = 0; i < 4; i++) {
		if (in[i] == NULL)
			continue;
		o->s[i] = arena_strdup(&b->arena, in[i]);
		if (o->s[i] == NULL) {
			st->rows_rejected++;
			return;
		}
	}
	*b->tail = o;
	b->tail = &o->next;
	b->nops++;
	bound_cur(st);
}

void
allot__store_replica_joined(allot__store *st, uint64_t session,
    const char *replica_id, const char *service, const char *host,
    uint32_t pid, const char *agent_version, uint64_t config_digest)
{
	if (st == NULL)
		return;
	int64_t at = now_ms(st);
	pthread_mutex_lock(&st->mu);
	if (session > st->max_session)
		st->max_session = session;
	struct op *o = op_new(st, OP_JOIN, at);
	if (o != NULL) {
		o->session = session;
		o->pid = pid;
		o->u = config_digest;
		op_push(st, o, replica_id != NULL ? replica_id : "",
		    service != NULL ? service : "", host, agent_version);
	}
	pthread_mutex_unlock(&st->mu);
}

void
allot__store_replica_left(allot__store *st, uint64_t session, const char *why)
{
	if (st == NULL)
		return;
	/* The schema's CHECK accepts these four only, and a row that breaks
	 * a constraint would fail every later commit of its batch: other
	 * reasons are recorded as a plain leave. */
	static const char *const whys[] = { "leave", "expired", "replaced",
		"shutdown" };
	const char *w = whys[0];
	for (size_t i = 0; why != NULL && i < 4; i++)
		if (strcmp(why, whys[i]) == 0)
			w = whys[i];
	int64_t at = now_ms(st);
	pthread_mutex_lock(&st->mu);
	struct op *o = op_new(st, OP_LEFT, at);
	if (o != NULL) {
		o->session = session;
		/* A static string: no copy needed. */
		o->s[0] = w;
		op_push(st, o, NULL, NULL, NULL, NULL);
	}
	pthread_mutex_unlock(&st->mu);
}

void
allot__store_replica_seen(allot__store *st, uint64_t session)
{
	if (st == NULL)
		return;
	int64_t at = now_ms(st);
	pthread_mutex_lock(&st->mu);
	struct seen_ent *e = seen_get(st->cur, session);
	if (e == NULL) {
		st->rows_rejected++;
	} else {
		if (at > e->at)
			e->at = at;
		bound_cur(st);
	}
	pthread_mutex_unlock(&st->mu);
}

void
allot__store_config_loaded(allot__store *st, uint64_t epoch, uint64_t digest,
    const char *path, const char *content)
{
	if (st == NULL)
		return;
	int64_t at = now_ms(st);
	pthread_mutex_lock(&st->mu);
	struct op *o = op_new(st, OP_CONFIG, at);
	if (o != NULL) {
		o->u = epoch;
		o->u2 = digest;
		op_push(st, o, path, content, NULL, NULL);
	}
	pthread_mutex_unlock(&st->mu);
}

void
allot__store_event(allot__store *st, const char *kind, const char *subject,
    const char *detail)
{
	if (st == NULL)
		return;
	int64_t at = now_ms(st);
	pthread_mutex_lock(&st->mu);
	struct op *o = op_new(st, OP_EVENT, at);
	if (o != NULL)
		op_push(
		    st, o, kind != NULL ? kind : "", subject, detail, NULL);
	pthread_mutex_unlock(&st->mu);
}

void
allot__store_share(allot__store *st, uint64_t session, const char *service,
    const char *quota, double rate, double burst, int64_t lease_until_ms)
{
	if (st == NULL || service == NULL || quota == NULL)
		return;
	int64_t at = now_ms(st);
	size_t sl = strlen(service), ql = strlen(quota);
	uint64_t kh = key_hash(st, service, sl, quota, ql);
	pthread_mutex_lock(&st->mu);
	const struct key *k = intern(st, kh, service, sl, quota, ql);
	struct share_ent *e = k != NULL ? share_get(st->cur, session, k) :
	                                  NULL;
	if (e == NULL) {
		st->rows_rejected++;
	} else {
		e->rate = rate;
		e->burst = burst;
		e->lease_until = lease_until_ms;
		e->at = at;
		bound_cur(st);
	}
	pthread_mutex_unlock(&st->mu);
}

void
allot__store_usage(allot__store *st, const char *service, const char *quota,
    uint64_t admitted, uint64_t denied, double demand, uint32_t live_replicas)
{
	if (st == NULL || service == NULL || quota == NULL)
		return;
	int64_t at = now_ms(st);
	int64_t sec = at >= 0 ? at / 1000 : -((999 - at) / 1000);
	size_t sl = strlen(service), ql = strlen(quota);
	uint64_t kh = key_hash(st, service, sl, quota, ql);
	pthread_mutex_lock(&st->mu);
	const struct key *k = intern(st, kh, service, sl, quota, ql);
	struct usage_ent *e = k != NULL ? usage_get(st->cur, sec, k) : NULL;
	if (e == NULL) {
		st->rows_rejected++;
	} else {
		e->admitted += admitted;
		e->denied += denied;
		e->demand += demand;
		if (live_replicas > e->live_replicas)
			e->live_replicas = live_replicas;
		bound_cur(st);
	}
	pthread_mutex_unlock(&st->mu);
}

void
allot__store_level_set(
    allot__store *st, const char *service, const char *quota, double level)
{
	if (st == NULL || service == NULL || quota == NULL)
		return;
	int64_t at = now_ms(st);
	size_t sl = strlen(service), ql = strlen(quota);
	uint64_t kh = key_hash(st, service, sl, quota, ql);
	pthread_mutex_lock(&st->mu);
	const struct key *k = intern(st, kh, service, sl, quota, ql);
	struct level_ent *e = k != NULL ? level_get(st->cur, k) : NULL;
	if (e == NULL) {
		st->rows_rejected++;
	} else {
		e->level = level;
		e->at = at;
		bound_cur(st);
	}
	pthread_mutex_unlock(&st->mu);
}

uint64_t
allot__store_max_session(allot__store *st)
{
	if (st == NULL)
		return 0;
	pthread_mutex_lock(&st->mu);
	uint64_t m = st->max_session;
	pthread_mutex_unlock(&st->mu);
	return m;
}

void
allot__store_set_clock(allot__store *st, int64_t (*now)(void *ctx), void *ctx)
{
	if (st == NULL)
		return;
	st->clock = now;
	st->clock_ctx = ctx;
}

void
allot__store_stats_get(allot__store *st, allot__store_stats *ret)
{
	if (st == NULL || ret == NULL)
		return;
	allot__store_stats s;
	memset(&s, 0, sizeof s);
	pthread_mutex_lock(&st->mu);
	s.commits = st->commits;
	s.commit_failures = st->commit_failures;
	s.rows_written = st->rows_written;
	s.rows_dropped = st->rows_dropped;
	s.pending = batch_rows(st->cur) + st->retry_rows;
	s.last_commit_ms = st->last_commit_ms;
	s.last_error = st->last_error;
	s.rows_rejected = st->rows_rejected;
	s.retention_deleted = st->retention_deleted;
	s.retention_failures = st->retention_failures;
	s.shares_unchanged = st->shares_unchanged;
	pthread_mutex_unlock(&st->mu);
	*ret = s;
}

/* ---- flush (loop thread) ---- */

static int
step_done(allot__store *st, int id)
{
	sqlite3_stmt *s = st->stmt[id];
	int rc = sqlite3_step(s);
	sqlite3_reset(s);
	return rc == SQLITE_DONE || rc == SQLITE_ROW ? SQLITE_OK : rc;
}

static void
bind_text(sqlite3_stmt *s, int i, const char *v)
{
	if (v == NULL)
		sqlite3_bind_null(s, i);
	else
		sqlite3_bind_text(s, i, v, -1, SQLITE_STATIC);
}

static void
bind_hex(sqlite3_stmt *s, int i, uint64_t v)
{
	char hex[17];
	snprintf(hex, sizeof hex, "%016" PRIx64, v);
	sqlite3_bind_text(s, i, hex, 16, SQLITE_TRANSIENT);
}

/* The same test as the shares_history_update trigger: a share changed
 * when its rate or burst moved by more than one part in a million. */
static bool
same_value(double old, double now)
{
	double d = now - old, m = old < 0 ? -old : old;
	if (d < 0)
		d = -d;
	return d <= 1e-6 * (m > 1.0 ? m : 1.0);
}

static struct written_ent *
written_find(const struct tab *t, uint64_t session, const struct key *k)
{
	uint64_t h = share_hash(session, k);
	for (uint32_t i = tab_head(t, h); i != NIL;) {
		struct written_ent *w = (struct written_ent *) tab_at(t, i);
		if (w->hdr.h == h && w->session == session && w->k == k)
			return w;
		i = w->hdr.next;
	}
	return NULL;
}

/* After a commit: remember what the database now holds. Out of memory
 * only means the share is written again next time. */
static void
written_update(allot__store *st, const struct batch *b)
{
	for (uint32_t i = 0; i < b->shares.n; i++) {
		const struct share_ent *e = (const struct share_ent *) tab_at(
		    &b->shares, i);
		struct written_ent *w = written_find(
		    &st->written, e->session, e->k);
		if (w == NULL) {
			if (!e->write)
				continue;
			uint32_t j = tab_add(
			    &st->written, share_hash(e->session, e->k));
			if (j == NIL)
				continue;
			w = (struct written_ent *) tab_at(&st->written, j);
			w->session = e->session;
			w->k = e->k;
		}
		w->seen_at = e->at;
		if (e->write) {
			w->rate = e->rate;
			w->burst = e->burst;
			w->written_at = e->at;
		}
	}
}

/* Forget the shares of sessions that left in `b` (their rows were
 * deleted), and, once a minute, shares no longer recorded. */
static void
written_sweep(allot__store *st, const struct batch *b)
{
	tab_clear(&st->left);
	for (const struct op *o = b->ops; o != NULL; o = o->next) {
		if (o->kind != OP_LEFT)
			continue;
		uint32_t j = tab_add(&st->left, allot__mix64(o->session));
		if (j == NIL)
			break;
		struct seen_ent *l = (struct seen_ent *) tab_at(&st->left, j);
		l->session = o->session;
	}
	int64_t now = now_ms(st);
	bool forget = now >= st->next_forget_ms;
	if (st->left.n == 0 && !forget)
		return;
	if (forget)
		st->next_forget_ms = now + WRITTEN_FORGET_MS;
	uint32_t gone = 0;
	for (uint32_t i = 0; i < st->written.n; i++) {
		struct written_ent *w = (struct written_ent *) tab_at(
		    &st->written, i);
		if (!w->hdr.live)
			continue;
		bool drop = forget && w->seen_at < now - WRITTEN_FORGET_MS;
		uint64_t h = allot__mix64(w->session);
		for (uint32_t j = tab_head(&st->left, h); j != NIL && !drop;) {
			const struct seen_ent *l = (const struct seen_ent *)
			    tab_at(&st->left, j);
			drop = l->session == w->session;
			j = l->hdr.next;
		}
		if (drop) {
			tab_unlink(&st->written, i);
			gone++;
		}
	}
	if (gone > 0)
		tab_compact(&st->written);
	if (st->left.n > 0 && st->left.cap > 4096)
		tab_free(&st->left);
}

static int
write_op(allot__store *st, const struct op *o)
{
	sqlite3_stmt *s;
	int rc;
	switch (o->kind) {
	case OP_JOIN:
		s = st->stmt[S_JOIN];
		sqlite3_bind_int64(s, 1, (sqlite3_int64) o->session);
		bind_text(s, 2, o->s[0]);
		bind_text(s, 3, o->s[1]);
		bind_text(s, 4, o->s[2]);
		sqlite3_bind_int64(s, 5, o->pid);
		bind_text(s, 6, o->s[3]);
		bind_hex(s, 7, o->u);
		sqlite3_bind_int64(s, 8, o->at);
		return step_done(st, S_JOIN);
	case OP_LEFT:
		s = st->stmt[S_LEFT];
		sqlite3_bind_int64(s, 1, (sqlite3_int64) o->session);
		sqlite3_bind_int64(s, 2, o->at);
		bind_text(s, 3, o->s[0]);
		rc = step_done(st, S_LEFT);
		if (rc != SQLITE_OK)
			return rc;
		s = st->stmt[S_LEFT_SHARES];
		sqlite3_bind_int64(s, 1, (sqlite3_int64) o->session);
		return step_done(st, S_LEFT_SHARES);
	case OP_CONFIG:
		s = st->stmt[S_CONFIG];
		sqlite3_bind_int64(s, 1, (sqlite3_int64) o->u);
		bind_hex(s, 2, o->u2);
		bind_text(s, 3, o->s[0]);
		bind_text(s, 4, o->s[1]);
		sqlite3_bind_int64(s, 5, o->at);
		return step_done(st, S_CONFIG);
	case OP_EVENT:
		s = st->stmt[S_EVENT];
		sqlite3_bind_int64(s, 1, o->at);
		bind_text(s, 2, o->s[0]);
		bind_text(s, 3, o->s[1]);
		bind_text(s, 4, o->s[2]);
		return step_done(st, S_EVENT);
	}
	return SQLITE_MISUSE;
}

/* Writes `b` in one transaction; on any failure the transaction is
 * rolled back and the SQLite result code returned (b is untouched). */
static int
write_batch(allot__store *st, struct batch *b, size_t *ret_skipped)
{
	int rc = step_done(st, S_BEGIN);
	if (rc != SQLITE_OK) {
		snprintf(st->errmsg, sizeof st->errmsg, "%s",
		    sqlite3_errmsg(st->db));
		return rc;
	}
	/* Shares before ops: a leave in this batch then deletes the shares
	 * of its session, whatever order the daemon recorded them in. */
	size_t skipped = 0;
	sqlite3_stmt *s = st->stmt[S_SHARE];
	for (uint32_t i = 0; i < b->shares.n && rc == SQLITE_OK; i++) {
		struct share_ent *e = (struct share_ent *) tab_at(
		    &b->shares, i);
		const struct written_ent *w = written_find(
		    &st->written, e->session, e->k);
		e->write = w == NULL || !same_value(w->rate, e->rate) ||
		    !same_value(w->burst, e->burst) ||
		    e->at - w->written_at >=
		        (int64_t) st->opts.share_refresh_ms;
		if (!e->write) {
			skipped++;
			continue;
		}
		sqlite3_bind_int64(s, 1, (sqlite3_int64) e->session);
		sqlite3_bind_text(
		    s, 2, e->k->service, (int) e->k->slen, SQLITE_STATIC);
		sqlite3_bind_text(
		    s, 3, e->k->quota, (int) e->k->qlen, SQLITE_STATIC);
		sqlite3_bind_double(s, 4, e->rate);
		sqlite3_bind_double(s, 5, e->burst);
		sqlite3_bind_int64(s, 6, e->lease_until);
		sqlite3_bind_int64(s, 7, e->at);
		rc = step_done(st, S_SHARE);
	}
	for (const struct op *o = b->ops; o != NULL && rc == SQLITE_OK;
	     o = o->next)
		rc = write_op(st, o);
	s = st->stmt[S_SEEN];
	for (uint32_t i = 0; i < b->seen.n && rc == SQLITE_OK; i++) {
		const struct seen_ent *e = (const struct seen_ent *) tab_at(
		    &b->seen, i);
		sqlite3_bind_int64(s, 1, (sqlite3_int64) e->session);
		sqlite3_bind_int64(s, 2, e->at);
		rc = step_done(st, S_SEEN);
	}
	s = st->stmt[S_USAGE];
	for (uint32_t i = 0; i < b->usage.n && rc == SQLITE_OK; i++) {
		const struct usage_ent *e = (const struct usage_ent *) tab_at(
		    &b->usage, i);
		if (!e->hdr.live)
			continue;
		sqlite3_bind_text(
		    s, 1, e->k->service, (int) e->k->slen, SQLITE_STATIC);
		sqlite3_bind_text(
		    s, 2, e->k->quota, (int) e->k->qlen, SQLITE_STATIC);
		sqlite3_bind_int64(s, 3, e->sec * 1000);
		sqlite3_bind_int64(s, 4, (sqlite3_int64) e->admitted);
		sqlite3_bind_int64(s, 5, (sqlite3_int64) e->denied);
		sqlite3_bind_double(s, 6, e->demand);
		sqlite3_bind_int64(s, 7, e->live_replicas);
		rc = step_done(st, S_USAGE);
	}
	s = st->stmt[S_LEVEL];
	for (uint32_t i = 0; i < b->levels.n && rc == SQLITE_OK; i++) {
		const struct level_ent *e = (const struct level_ent *) tab_at(
		    &b->levels, i);
		sqlite3_bind_text(
		    s, 1, e->k->service, (int) e->k->slen, SQLITE_STATIC);
		sqlite3_bind_text(
		    s, 2, e->k->quota, (int) e->k->qlen, SQLITE_STATIC);
		sqlite3_bind_double(s, 3, e->level);
		sqlite3_bind_int64(s, 4, e->at);
		rc = step_done(st, S_LEVEL);
	}
	if (rc == SQLITE_OK)
		rc = step_done(st, S_COMMIT);
	if (rc != SQLITE_OK) {
		/* Kept before the rollback, which resets the message. */
		snprintf(st->errmsg, sizeof st->errmsg, "%s",
		    sqlite3_errmsg(st->db));
		if (!sqlite3_get_autocommit(st->db))
			(void) step_done(st, S_ROLLBACK);
	}
	*ret_skipped = skipped;
	return rc;
}

/* One bounded chunk of deletions per table, at most once a minute unless
 * the previous chunk was full (then again at the next flush). */
static void
retention(allot__store *st)
{
	if (st->opts.retention_s == 0)
		return;
	int64_t now = now_ms(st);
	if (now < st->next_retention_ms)
		return;
	int64_t cutoff = now - (int64_t) st->opts.retention_s * 1000;
	static const int ids[] = { S_RET_USAGE, S_RET_EVENTS, S_RET_HISTORY };
	uint64_t deleted = 0;
	bool more = false;
	int rc = step_done(st, S_BEGIN);
	for (size_t i = 0; i < 3 && rc == SQLITE_OK; i++) {
		sqlite3_stmt *s = st->stmt[ids[i]];
		sqlite3_bind_int64(s, 1, cutoff);
		sqlite3_bind_int64(s, 2, st->opts.retention_chunk);
		rc = step_done(st, ids[i]);
		if (rc == SQLITE_OK) {
			int n = sqlite3_changes(st->db);
			deleted += (uint64_t) n;
			if ((uint32_t) n >= st->opts.retention_chunk)
				more = true;
		}
	}
	if (rc == SQLITE_OK)
		rc = step_done(st, S_COMMIT);
	if (rc != SQLITE_OK) {
		if (!sqlite3_get_autocommit(st->db))
			(void) step_done(st, S_ROLLBACK);
		pthread_mutex_lock(&st->mu);
		st->retention_failures++;
		pthread_mutex_unlock(&st->mu);
		allot__log_ratelimited(&st->lg, &st->rl_retention,
		    ALLOT_LOG_WARNING, "ALLOT-STORE-RETENTION-FAIL",
		    "store %s: deleting rows older than %" PRIu32 " s failed: "
		    "%s; retrying in a minute",
		    st->path, st->opts.retention_s, sqlite3_errstr(rc));
		st->next_retention_ms = now + RETENTION_EVERY_MS;
		return;
	}
	pthread_mutex_lock(&st->mu);
	st->retention_deleted += deleted;
	pthread_mutex_unlock(&st->mu);
	st->next_retention_ms = more ? now : now + RETENTION_EVERY_MS;
	if (deleted > 0)
		allot__log(&st->lg, ALLOT_LOG_DEBUG, "ALLOT-STORE-RETENTION",
		    "store %s: deleted %" PRIu64 " rows older than %" PRIu32
		    " s",
		    st->path, deleted, st->opts.retention_s);
}

int
allot__store_flush(allot__store *st)
{
	if (st == NULL)
		return ALLOT_EINVAL;

	pthread_mutex_lock(&st->mu);
	struct batch *b = st->cur;
	st->cur = st->spare;
	pthread_mutex_unlock(&st->mu);

	/* Normally nothing is left from a failure and the batches swap. */
	uint64_t lost = 0;
	if (batch_rows(st->retry) == 0) {
		batch_clear(st->retry);
		st->spare = st->retry;
		st->retry = b;
	} else {
		lost = batch_merge(st->retry, b);
		st->spare = b;
	}
	uint64_t dropped = batch_trim(st->retry, st->opts.max_pending);
	size_t rows = batch_rows(st->retry);

	int rc = SQLITE_OK;
	double ms = 0;
	size_t skipped = 0;
	if (rows > 0) {
		uint64_t t0 = allot__mono_ns();
		rc = write_batch(st, st->retry, &skipped);
		ms = (double) (allot__mono_ns() - t0) / 1e6;
	}
	if (rc == SQLITE_OK) {
		written_update(st, st->retry);
		written_sweep(st, st->retry);
	}

	pthread_mutex_lock(&st->mu);
	st->rows_dropped += dropped;
	st->rows_rejected += lost;
	if (rows > 0 && rc == SQLITE_OK) {
		st->commits++;
		st->rows_written += rows - skipped;
		st->shares_unchanged += skipped;
		st->last_commit_ms = ms;
		st->retry_rows = 0;
	} else if (rc != SQLITE_OK) {
		st->commit_failures++;
		st->last_error = rc;
		st->retry_rows = rows;
	}
	uint64_t failures = st->commit_failures;
	uint64_t total_dropped = st->rows_dropped;
	uint64_t total_rejected = st->rows_rejected;
	pthread_mutex_unlock(&st->mu);

	if (total_dropped != st->dropped_logged ||
	    total_rejected != st->rejected_logged) {
		allot__log_ratelimited(&st->lg, &st->rl_drop,
		    ALLOT_LOG_WARNING, "ALLOT-STORE-DROP",
		    "store %s: %" PRIu64 " usage rows dropped (more than "
		    "max_pending = %zu rows queued), %" PRIu64
		    " records refused (out of memory or too many quotas)",
		    st->path, total_dropped - st->dropped_logged,
		    st->opts.max_pending,
		    total_rejected - st->rejected_logged);
		st->dropped_logged = total_dropped;
		st->rejected_logged = total_rejected;
	}

	if (rc != SQLITE_OK) {
		st->failing = true;
		allot__log_ratelimited(&st->lg, &st->rl_fail, ALLOT_LOG_ERR,
		    "ALLOT-STORE-FAIL",
		    "store %s: commit of %zu rows failed: %s (%s); rows kept "
		    "for the next flush (%" PRIu64 " failures so far)",
		    st->path, rows, sqlite3_errstr(rc), st->errmsg, failures);
		return ALLOT_EIO;
	}
	if (st->failing && rows > 0) {
		st->failing = false;
		allot__log(&st->lg, ALLOT_LOG_NOTICE, "ALLOT-STORE-OK",
		    "store %s: commits succeed again (%zu rows written)",
		    st->path, rows);
	}
	batch_clear(st->retry);
	retention(st);
	return ALLOT_OK;
}

/* ---- restore ---- */

int
allot__store_restore(allot__store *st,
    void (*on_replica)(void *ctx, const allot__store_replica *r),
    void (*on_level)(void *ctx, const allot__store_level *l), void *ctx)
{
	if (st == NULL)
		return ALLOT_EINVAL;
	sqlite3_stmt *s = st->stmt[S_RESTORE_REPLICAS];
	int rc;
	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		allot__store_replica r = {
			.session = (uint64_t) sqlite3_column_int64(s, 0),
			.replica_id = (const char *) sqlite3_column_text(s, 1),
			.service = (const char *) sqlite3_column_text(s, 2),
			.last_seen_ms = sqlite3_column_int64(s, 3),
		};
		if (on_replica != NULL)
			on_replica(ctx, &r);
	}
	sqlite3_reset(s);
	if (rc != SQLITE_DONE)
		goto fail;
	s = st->stmt[S_RESTORE_LEVELS];
	while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
		allot__store_level l = {
			.service = (const char *) sqlite3_column_text(s, 0),
			.quota = (const char *) sqlite3_column_text(s, 1),
			.level = sqlite3_column_double(s, 2),
			.at_ms = sqlite3_column_int64(s, 3),
		};
		if (on_level != NULL)
			on_level(ctx, &l);
	}
	sqlite3_reset(s);
	if (rc != SQLITE_DONE)
		goto fail;
	return ALLOT_OK;
fail:
	allot__log(&st->lg, ALLOT_LOG_ERR, "ALLOT-STORE-FAIL",
	    "store %s: reading state to restore failed: %s", st->path,
	    sqlite3_errstr(rc));
	return ALLOT_EIO;
}

struct sqlite3 *
allot__store_db(allot__store *st)
{
	return st != NULL ? st->db : NULL;
}

/* ---- open and close ---- */

void
allot__store_opts_default(allot__store_opts *ret)
{
	memset(ret, 0, sizeof *ret);
	ret->retention_s = DEFAULT_RETENTION_S;
	ret->max_pending = DEFAULT_MAX_PENDING;
	ret->busy_timeout_ms = DEFAULT_BUSY_MS;
	ret->retention_chunk = DEFAULT_RETENTION_CHUNK;
	ret->share_refresh_ms = DEFAULT_SHARE_REFRESH_MS;
}

static void seterr(char *errbuf, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void
seterr(char *errbuf, size_t errlen, const char *fmt, ...)
{
	if (errbuf == NULL || errlen == 0)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(errbuf, errlen, fmt, ap);
	va_end(ap);
}

/* A single-value query (a PRAGMA or an aggregate) as an integer. */
static int
query_int(sqlite3 *db, const char *sql, int64_t *ret)
{
	sqlite3_stmt *s;
	int rc = sqlite3_prepare_v2(db, sql, -1, &s, NULL);
	if (rc != SQLITE_OK)
		return rc;
	rc = sqlite3_step(s);
	if (rc == SQLITE_ROW) {
		*ret = sqlite3_column_int64(s, 0);
		rc = SQLITE_OK;
	}
	sqlite3_finalize(s);
	return rc;
}

static bool
is_corruption(int rc)
{
	return (rc & 0xff) == SQLITE_NOTADB || (rc & 0xff) == SQLITE_CORRUPT;
}

#define NOT_VALID_FMT                                                      \
	"%s is not a valid allot database (%s); move it aside or restore " \
	"from backup; allotd will not overwrite it"

/* PRAGMA quick_check: the whole file is read once, so truncation and
 * damaged pages are found before anything is written. */
static int
check_file(allot__store *st, char *errbuf, size_t errlen)
{
	sqlite3_stmt *s = NULL;
	int rc = sqlite3_prepare_v2(
	    st->db, "PRAGMA quick_check", -1, &s, NULL);
	char first[256] = "";
	bool ok = true;
	if (rc == SQLITE_OK) {
		while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
			const char *t = (const char *) sqlite3_column_text(
			    s, 0);
			if (t != NULL && strcmp(t, "ok") != 0 && ok) {
				ok = false;
				/* A finding may span lines ("*** in database
				 * main ***\nPage 2: ..."): keep the log line
				 * one line. */
				size_t n = 0;
				for (; *t != '\0' && n + 3 < sizeof first;
				     t++) {
					bool nl = *t == '\n' || *t == '\r';
					first[n++] = nl ? ';' : *t;
					if (nl)
						first[n++] = ' ';
				}
				first[n] = '\0';
			}
		}
		if (rc == SQLITE_DONE)
			rc = SQLITE_OK;
	}
	sqlite3_finalize(s);
	if (rc == SQLITE_OK && ok)
		return 0;
	if (rc == SQLITE_OK)
		seterr(errbuf, errlen, NOT_VALID_FMT, st->path, first);
	else if (is_corruption(rc))
		seterr(errbuf, errlen, NOT_VALID_FMT, st->path,
		    sqlite3_errstr(rc));
	else
		seterr(errbuf, errlen, "cannot read store %s: %s", st->path,
		    sqlite3_errmsg(st->db));
	return -1;
}

static int
migrate(allot__store *st, int64_t from, char *errbuf, size_t errlen)
{
	size_t n = sizeof allot__migrations / sizeof allot__migrations[0];
	for (size_t i = 0; i < n; i++) {
		int v = allot__migrations[i].version;
		if (v <= from)
			continue;
		char pragma[96];
		snprintf(pragma, sizeof pragma,
		    "PRAGMA user_version = %d; PRAGMA application_id = %d;", v,
		    APP_ID);
		char *msg = NULL;
		int rc = sqlite3_exec(
		    st->db, "BEGIN IMMEDIATE", NULL, NULL, &msg);
		if (rc == SQLITE_OK)
			rc = sqlite3_exec(st->db, allot__migrations[i].sql,
			    NULL, NULL, &msg);
		if (rc == SQLITE_OK)
			rc = sqlite3_exec(st->db, pragma, NULL, NULL, &msg);
		if (rc == SQLITE_OK)
			rc = sqlite3_exec(st->db, "COMMIT", NULL, NULL, &msg);
		if (rc != SQLITE_OK) {
			seterr(errbuf, errlen,
			    "cannot apply schema migration %s to %s: %s",
			    allot__migrations[i].name, st->path,
			    msg != NULL ? msg : sqlite3_errstr(rc));
			sqlite3_free(msg);
			if (!sqlite3_get_autocommit(st->db))
				sqlite3_exec(
				    st->db, "ROLLBACK", NULL, NULL, NULL);
			return -1;
		}
		allot__log(&st->lg, ALLOT_LOG_INFO, "ALLOT-STORE-MIGRATE",
		    "store %s: applied schema migration %s", st->path,
		    allot__migrations[i].name);
	}
	return 0;
}

static void
store_free(allot__store *st)
{
	for (int i = 0; i < S_COUNT; i++)
		sqlite3_finalize(st->stmt[i]);
	if (st->db != NULL) {
		int rc = sqlite3_close(st->db);
		if (rc != SQLITE_OK)
			allot__log(&st->lg, ALLOT_LOG_ERR, "ALLOT-STORE-CLOSE",
			    "store %s: close failed: %s", st->path,
			    sqlite3_errstr(rc));
	}
	for (int i = 0; i < 3; i++)
		batch_free(&st->b[i]);
	tab_free(&st->written);
	tab_free(&st->left);
	tab_free(&st->keys);
	arena_free(&st->key_arena);
	pthread_mutex_destroy(&st->mu);
	free(st->path);
	free(st);
}

int
allot__store_open(const char *path, const allot__store_opts *opts,
    const allot__logger *lg, char *errbuf, size_t errlen, allot__store **ret)
{
	if (path == NULL || ret == NULL) {
		seterr(errbuf, errlen, "store: no path given");
		return ALLOT_EINVAL;
	}
	allot__store *st = calloc(1, sizeof *st);
	if (st == NULL || (st->path = strdup(path)) == NULL) {
		free(st);
		seterr(errbuf, errlen, "store %s: out of memory", path);
		return ALLOT_ENOMEM;
	}
	pthread_mutex_init(&st->mu, NULL);
	for (int i = 0; i < 3; i++)
		batch_init(&st->b[i]);
	st->cur = &st->b[0];
	st->retry = &st->b[1];
	st->spare = &st->b[2];
	tab_init(&st->keys, sizeof(struct key_ent));
	tab_init(&st->written, sizeof(struct written_ent));
	tab_init(&st->left, sizeof(struct seen_ent));
	st->seed = allot__hash_seed();
	if (lg != NULL)
		st->lg = *lg;
	allot__store_opts_default(&st->opts);
	if (opts != NULL) {
		st->opts.retention_s = opts->retention_s;
		if (opts->max_pending != 0)
			st->opts.max_pending = opts->max_pending;
		if (opts->busy_timeout_ms != 0)
			st->opts.busy_timeout_ms = opts->busy_timeout_ms;
		if (opts->retention_chunk != 0)
			st->opts.retention_chunk = opts->retention_chunk;
		if (opts->share_refresh_ms != 0)
			st->opts.share_refresh_ms = opts->share_refresh_ms;
	}
	st->rl_fail = (allot__logrl) ALLOT__LOGRL_INIT(3, 60000);
	st->rl_drop = (allot__logrl) ALLOT__LOGRL_INIT(3, 60000);
	st->rl_retention = (allot__logrl) ALLOT__LOGRL_INIT(3, 60000);

	/* An existing file of zero bytes is a store truncated to nothing
	 * (SQLite would take it for a new, empty database): refuse it
	 * rather than reset the audit trail silently. */
	struct stat sb;
	if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size == 0) {
		seterr(errbuf, errlen,
		    "%s exists but is empty (0 bytes): it is not a valid "
		    "allot database; if it was truncated, restore it from a "
		    "backup; to start a new store remove the file. allotd "
		    "will not overwrite it",
		    path);
		goto fail_io;
	}
	int rc = sqlite3_open_v2(path, &st->db,
	    SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
	    NULL);
	if (rc != SQLITE_OK) {
		seterr(errbuf, errlen, "cannot open store %s: %s", path,
		    st->db != NULL ? sqlite3_errmsg(st->db) :
		                     sqlite3_errstr(rc));
		goto fail_io;
	}
	sqlite3_extended_result_codes(st->db, 1);
	sqlite3_busy_timeout(st->db, OPEN_BUSY_MS);

	if (check_file(st, errbuf, errlen) != 0)
		goto fail_io;

	int64_t version = 0, app_id = 0, objects = 0;
	rc = query_int(st->db, "PRAGMA user_version", &version);
	if (rc == SQLITE_OK)
		rc = query_int(st->db, "PRAGMA application_id", &app_id);
	if (rc == SQLITE_OK)
		rc = query_int(
		    st->db, "SELECT count(*) FROM sqlite_master", &objects);
	if (rc != SQLITE_OK) {
		seterr(errbuf, errlen,
		    is_corruption(rc) ? NOT_VALID_FMT :
		                        "cannot read store %s: %s",
		    path, sqlite3_errmsg(st->db));
		goto fail_io;
	}
	if (app_id != APP_ID &&
	    (app_id != 0 || version != 0 || objects != 0)) {
		seterr(errbuf, errlen, NOT_VALID_FMT, path,
		    "an SQLite database of another application");
		goto fail_io;
	}
	size_t nmig = sizeof allot__migrations / sizeof allot__migrations[0];
	int64_t known = allot__migrations[nmig - 1].version;
	if (version > known) {
		seterr(errbuf, errlen,
		    "store %s has schema version %" PRId64 " but this allotd "
		    "knows versions up to %" PRId64 ": it was written by a "
		    "newer allotd; run that version, or move the file aside "
		    "(allotd will not downgrade it)",
		    path, version, known);
		goto fail_io;
	}

	/* WAL lets auditors read while allotd writes; NORMAL durability
	 * loses at most the last commits on power loss, never integrity. */
	char mode[16] = "";
	sqlite3_stmt *s = NULL;
	rc = sqlite3_prepare_v2(
	    st->db, "PRAGMA journal_mode = WAL", -1, &s, NULL);
	if (rc == SQLITE_OK && sqlite3_step(s) == SQLITE_ROW)
		snprintf(mode, sizeof mode, "%s", sqlite3_column_text(s, 0));
	sqlite3_finalize(s);
	if (strcmp(mode, "wal") != 0) {
		seterr(errbuf, errlen,
		    "cannot put store %s in WAL mode (%s); "
		    "is it on a file system without shared memory, or locked?",
		    path, mode[0] != '\0' ? mode : sqlite3_errmsg(st->db));
		goto fail_io;
	}
	rc = sqlite3_exec(st->db,
	    "PRAGMA synchronous = NORMAL;"
	    "PRAGMA journal_size_limit = 67108864;"
	    "PRAGMA cache_size = -65536;",
	    NULL, NULL, NULL);
	if (rc != SQLITE_OK) {
		seterr(errbuf, errlen, "cannot configure store %s: %s", path,
		    sqlite3_errmsg(st->db));
		goto fail_io;
	}
	if (migrate(st, version, errbuf, errlen) != 0)
		goto fail_io;

	for (int i = 0; i < S_COUNT; i++) {
		rc = sqlite3_prepare_v3(st->db, stmt_sql[i], -1,
		    SQLITE_PREPARE_PERSISTENT, &st->stmt[i], NULL);
		if (rc != SQLITE_OK) {
			seterr(errbuf, errlen,
			    "store %s: cannot prepare "
			    "statement %d: %s",
			    path, i, sqlite3_errmsg(st->db));
			goto fail_io;
		}
	}
	int64_t max_session = 0;
	rc = query_int(st->db,
	    "SELECT coalesce(max(session), 0) FROM replicas", &max_session);
	if (rc != SQLITE_OK) {
		seterr(errbuf, errlen, "cannot read store %s: %s", path,
		    sqlite3_errmsg(st->db));
		goto fail_io;
	}
	st->max_session = (uint64_t) max_session;
	sqlite3_busy_timeout(st->db, (int) st->opts.busy_timeout_ms);
	st->next_retention_ms = INT64_MIN;
	st->next_forget_ms = INT64_MIN;

	allot__log(&st->lg, ALLOT_LOG_INFO, "ALLOT-STORE-OPEN",
	    "store %s: schema version %" PRId64 " (was %" PRId64 "), "
	    "retention %" PRIu32 " s",
	    path, known, version, st->opts.retention_s);
	*ret = st;
	return ALLOT_OK;

fail_io:
	store_free(st);
	return ALLOT_EIO;
}

void
allot__store_close(allot__store *st)
{
	if (st == NULL)
		return;
	if (allot__store_flush(st) != ALLOT_OK) {
		allot__store_stats s;
		allot__store_stats_get(st, &s);
		allot__log(&st->lg, ALLOT_LOG_ERR, "ALLOT-STORE-LOST",
		    "store %s: closing with %" PRIu64 " rows that could not "
		    "be written (%s)",
		    st->path, s.pending, sqlite3_errstr(s.last_error));
	}
	(void) sqlite3_exec(st->db, "PRAGMA optimize", NULL, NULL, NULL);
	store_free(st);
}
