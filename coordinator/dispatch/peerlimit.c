/* SPDX-License-Identifier: MIT */
/*
 * Per-peer flood control (peerlimit.h): shards of a fixed table of peers,
 * each with a hash index (idmap.h), a clock hand for eviction and two GCRA
 * buckets per peer. Everything is allocated at creation; a lookup, an
 * insertion and an eviction are done under the shard's mutex, which is
 * held for a hash probe and one bucket take. A bound connection is an
 * entry of its own (family 'p', the pipe id), which names its address
 * and its group (family 'g': its address and registered identity), whose
 * message bucket it spends; it, and an address or a group with bound
 * connections, are never evicted. No two shard mutexes are ever held at
 * once.
 */
#include "peerlimit.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>

#include <allot/allot.h>

#include "bucket.h"
#include "hash.h"
#include "idmap.h"

#define NSHARDS 16u
#define NIL UINT32_MAX

#define FAMILY_PIPE 'p'
#define FAMILY_GROUP 'g'

typedef struct entry {
	allot__bucket b[2]; /* [ALLOT__PEER_MESSAGE], [ALLOT__PEER_REGISTER] */
	allot__peer key;
	allot__peer parent; /* a bound connection's address */
	allot__peer group; /* a bound connection's group: its budget */
	uint32_t conns; /* an address's or a group's bound connections */
	bool used;
} entry;

typedef struct shard {
	pthread_mutex_t mu;
	entry *e; /* per_shard slots */
	allot__idmap index; /* peer hash -> slot in e */
	uint32_t used;
	uint32_t hand; /* clock hand for eviction */
	uint64_t evictions;
	uint64_t overflow;
	uint64_t bound; /* entries that are bound connections */
	uint64_t groups; /* entries that are their groups */
} shard;

struct allot__peerlimit {
	allot__peerlimit_opts o;
	bool on[2];
	allot__allowance a[2];
	uint32_t per_shard;
	uint64_t seed;
	shard s[NSHARDS];
	pthread_mutex_t overflow_mu;
	entry overflow;
	_Atomic uint64_t bind_refused;
};

void
allot__peerlimit_opts_init(allot__peerlimit_opts *o)
{
	o->register_rate = ALLOT__PEER_REGISTER_RATE;
	o->register_burst = ALLOT__PEER_REGISTER_BURST;
	o->message_rate = ALLOT__PEER_MESSAGE_RATE;
	o->message_burst = ALLOT__PEER_MESSAGE_BURST;
	o->capacity = ALLOT__PEER_CAPACITY;
	o->conns_per_peer = ALLOT__PEER_CONNS;
}

int
allot__peerlimit_parse(const char *s, double *ret_rate, double *ret_burst,
    char *err, size_t errlen)
{
	char *end;
	errno = 0;
	double r = strtod(s, &end);
	if (end == s || errno != 0 || !isfinite(r) || r < 0 || r > 1e9) {
		snprintf(err, errlen,
		    "\"%s\": expected a rate per second (0 disables), "
		    "optionally followed by :BURST",
		    s);
		return -1;
	}
	double b = r * 2 < 1 ? 1 : r * 2;
	if (*end == ':') {
		const char *bs = end + 1;
		errno = 0;
		b = strtod(bs, &end);
		if (end == bs || errno != 0 || !isfinite(b) || b < 1 ||
		    b > 1e9) {
			snprintf(err, errlen,
			    "\"%s\": the burst after ':' must be a number "
			    "from 1 to 1e9",
			    s);
			return -1;
		}
	}
	if (*end != '\0') {
		snprintf(err, errlen,
		    "\"%s\": expected RATE or RATE:BURST, e.g. 20:50", s);
		return -1;
	}
	*ret_rate = r;
	*ret_burst = r > 0 ? b : 0;
	return 0;
}

allot__peerlimit *
allot__peerlimit_create(const allot__peerlimit_opts *o, bool *ret_oom)
{
	*ret_oom = false;
	bool on_msg = o->message_rate > 0, on_reg = o->register_rate > 0;
	if (!on_msg && !on_reg)
		return NULL;
	allot__peerlimit *pl = calloc(1, sizeof *pl);
	if (pl == NULL) {
		*ret_oom = true;
		return NULL;
	}
	pl->o = *o;
	pl->on[ALLOT__PEER_MESSAGE] = on_msg;
	pl->on[ALLOT__PEER_REGISTER] = on_reg;
	pl->a[ALLOT__PEER_MESSAGE] = (allot__allowance) {
		.rate = on_msg ? o->message_rate : 1,
		.burst = on_msg ? o->message_burst : 1,
		.mode = ALLOT__MODE_LIMIT,
	};
	pl->a[ALLOT__PEER_REGISTER] = (allot__allowance) {
		.rate = on_reg ? o->register_rate : 1,
		.burst = on_reg ? o->register_burst : 1,
		.mode = ALLOT__MODE_LIMIT,
	};
	uint32_t cap = o->capacity < 1 ? 1 : o->capacity;
	pl->per_shard = (cap + NSHARDS - 1) / NSHARDS;
	pl->seed = allot__hash_seed();
	pthread_mutex_init(&pl->overflow_mu, NULL);
	for (int k = 0; k < 2; k++)
		allot__bucket_init(&pl->overflow.b[k], &pl->a[k]);
	for (uint32_t i = 0; i < NSHARDS; i++) {
		shard *sh = &pl->s[i];
		pthread_mutex_init(&sh->mu, NULL);
		sh->e = aligned_alloc(
		    _Alignof(entry), (size_t) pl->per_shard * sizeof *sh->e);
		if (sh->e == NULL ||
		    allot__idmap_init(&sh->index, pl->per_shard) != ALLOT_OK) {
			allot__peerlimit_destroy(pl);
			*ret_oom = true;
			return NULL;
		}
		memset(sh->e, 0, (size_t) pl->per_shard * sizeof *sh->e);
	}
	return pl;
}

void
allot__peerlimit_destroy(allot__peerlimit *pl)
{
	if (pl == NULL)
		return;
	for (uint32_t i = 0; i < NSHARDS; i++) {
		pthread_mutex_destroy(&pl->s[i].mu);
		free(pl->s[i].e);
		allot__idmap_fini(&pl->s[i].index);
	}
	pthread_mutex_destroy(&pl->overflow_mu);
	free(pl);
}

void
allot__peer_of(nng_msg *msg, allot__peer *ret)
{
	memset(ret, 0, sizeof *ret);
	nng_pipe p = nng_msg_get_pipe(msg);
	nng_sockaddr sa;
	if (nng_pipe_id(p) < 0 ||
	    nng_pipe_get_addr(p, NNG_OPT_REMADDR, &sa) != 0)
		return;
	switch (sa.s_family) {
	case NNG_AF_INET:
		ret->family = 4;
		memcpy(ret->addr, &sa.s_in.sa_addr, 4);
		break;
	case NNG_AF_INET6:
		ret->family = 6;
		memcpy(ret->addr, sa.s_in6.sa_addr, 16);
		break;
	case NNG_AF_IPC: {
		uint64_t uid;
		if (nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_UID, &uid) == 0) {
			ret->family = 'u';
			memcpy(ret->addr, &uid, sizeof uid);
		}
		break;
	}
	default: break;
	}
}

uint64_t
allot__peer_id(const allot__peer *p)
{
	allot__peer key;
	memset(&key, 0, sizeof key);
	key.family = p->family;
	memcpy(key.addr, p->addr, sizeof key.addr);
	uint64_t h = allot__hash(&key, sizeof key, 0x616c6c6f74706565ull);
	return h != 0 ? h : 1;
}

void
allot__peer_format(const allot__peer *p, char *buf, size_t len)
{
	switch (p->family) {
	case 4:
		if (inet_ntop(AF_INET, p->addr, buf, (socklen_t) len) == NULL)
			snprintf(buf, len, "?");
		break;
	case 6:
		if (inet_ntop(AF_INET6, p->addr, buf, (socklen_t) len) == NULL)
			snprintf(buf, len, "?");
		break;
	case 'u': {
		uint64_t uid;
		memcpy(&uid, p->addr, sizeof uid);
		snprintf(buf, len, "uid %llu", (unsigned long long) uid);
		break;
	}
	default: snprintf(buf, len, "local"); break;
	}
}

static bool
same(const allot__peer *a, const allot__peer *b)
{
	return a->family == b->family &&
	    memcmp(a->addr, b->addr, sizeof a->addr) == 0;
}

/* Both buckets back at their bursts: forgetting the peer loses nothing.
 * Never a bound connection or an address that has one. */
static bool
refilled(const entry *e, uint64_t now)
{
	if (e->key.family == FAMILY_PIPE || e->conns > 0)
		return false;
	for (int k = 0; k < 2; k++) {
		uint64_t s = atomic_load_explicit(
		    &e->b[k].state, memory_order_relaxed);
		if ((s >> ALLOT__VBITS) > now)
			return false;
	}
	return true;
}

/* A peer's hash: its low bits pick the shard, the rest index it there. */
static uint64_t
peer_hash(const allot__peerlimit *pl, const allot__peer *key)
{
	return allot__hash(key, sizeof *key, pl->seed);
}

static void
unlink_entry(const allot__peerlimit *pl, shard *sh, uint32_t idx)
{
	entry *e = &sh->e[idx];
	allot__idmap_remove(&sh->index, peer_hash(pl, &e->key) >> 8, idx);
	if (e->key.family == FAMILY_PIPE)
		sh->bound--;
	else if (e->key.family == FAMILY_GROUP)
		sh->groups--;
	e->used = false;
	sh->used--;
}

/* A slot for a new peer: a free one, else a refilled one (clock hand);
 * NIL when every peer is still paying off a burst. */
static uint32_t
free_slot(const allot__peerlimit *pl, shard *sh, uint64_t now)
{
	if (sh->used < pl->per_shard) {
		for (uint32_t n = 0; n < pl->per_shard; n++) {
			uint32_t i = sh->hand;
			sh->hand = (sh->hand + 1) % pl->per_shard;
			if (!sh->e[i].used)
				return i;
		}
	}
	for (uint32_t n = 0; n < pl->per_shard; n++) {
		uint32_t i = sh->hand;
		sh->hand = (sh->hand + 1) % pl->per_shard;
		if (refilled(&sh->e[i], now)) {
			unlink_entry(pl, sh, i);
			sh->evictions++;
			return i;
		}
	}
	return NIL;
}

/* `peer` with its padding zeroed, so that it hashes the same each time. */
static allot__peer
key_of(const allot__peer *peer)
{
	allot__peer key;
	memset(&key, 0, sizeof key);
	key.family = peer->family;
	memcpy(key.addr, peer->addr, sizeof key.addr);
	return key;
}

static allot__peer
pipe_key(uint32_t pipe)
{
	allot__peer key;
	memset(&key, 0, sizeof key);
	key.family = FAMILY_PIPE;
	memcpy(key.addr, &pipe, sizeof pipe);
	return key;
}

/* The shard of `key` and its index hash. */
static shard *
shard_of(allot__peerlimit *pl, const allot__peer *key, uint64_t *ret_ih)
{
	uint64_t h = peer_hash(pl, key);
	*ret_ih = h >> 8;
	return &pl->s[h & (NSHARDS - 1)];
}

/* The slot of `key` in `sh`, or NIL. Under the shard's mutex. */
static uint32_t
lookup(shard *sh, uint64_t ih, const allot__peer *key)
{
	uint32_t pos = allot__idmap_start(&sh->index, ih), i;
	while ((i = allot__idmap_next(&sh->index, ih, &pos)) != NIL &&
	    !same(&sh->e[i].key, key))
		;
	return i;
}

/* The slot of `key` in `sh`, a new one (full buckets) when it has none;
 * NIL when there is no room. Under the shard's mutex. */
static uint32_t
lookup_or_add(const allot__peerlimit *pl, shard *sh, uint64_t ih,
    const allot__peer *key, uint64_t now)
{
	uint32_t i = lookup(sh, ih, key);
	if (i != NIL)
		return i;
	i = free_slot(pl, sh, now);
	if (i == NIL)
		return NIL;
	entry *e = &sh->e[i];
	e->key = *key;
	memset(&e->parent, 0, sizeof e->parent);
	memset(&e->group, 0, sizeof e->group);
	e->conns = 0;
	e->used = true;
	for (int k = 0; k < 2; k++)
		allot__bucket_init(&e->b[k], &pl->a[k]);
	allot__idmap_add(&sh->index, ih, i);
	sh->used++;
	if (key->family == FAMILY_PIPE)
		sh->bound++;
	else if (key->family == FAMILY_GROUP)
		sh->groups++;
	return i;
}

bool
allot__peerlimit_take(allot__peerlimit *pl, const allot__peer *peer,
    allot__peer_budget budget, uint64_t now, uint64_t *ret_wait_ns)
{
	if (pl == NULL || !pl->on[budget])
		return true;
	allot__peer key = key_of(peer);
	uint64_t ih;
	shard *sh = shard_of(pl, &key, &ih);
	allot__take t;

	pthread_mutex_lock(&sh->mu);
	uint32_t i = lookup_or_add(pl, sh, ih, &key, now);
	if (i == NIL) {
		sh->overflow++;
		pthread_mutex_unlock(&sh->mu);
		pthread_mutex_lock(&pl->overflow_mu);
		allot__bucket_take(&pl->overflow.b[budget], now, 1, &t);
		pthread_mutex_unlock(&pl->overflow_mu);
	} else {
		allot__bucket_take(&sh->e[i].b[budget], now, 1, &t);
		pthread_mutex_unlock(&sh->mu);
	}
	if (!t.allowed && ret_wait_ns != NULL)
		*ret_wait_ns = t.wait_ns;
	return t.allowed;
}

/* The group of the connections of address `addr` (a key) registered as
 * `identity`: the key of the message budget they share. */
static allot__peer
group_key(const allot__peer *addr, uint64_t identity)
{
	allot__peer key;
	memset(&key, 0, sizeof key);
	key.family = FAMILY_GROUP;
	uint64_t a = allot__peer_id(addr);
	memcpy(key.addr, &a, sizeof a);
	memcpy(key.addr + sizeof a, &identity, sizeof identity);
	return key;
}

/* One message of connection `pipe`, charged to its group's budget when
 * it is bound: false when it is not (nothing taken); else true with
 * *ret_allowed and *ret_wait_ns. */
static bool
take_bound(allot__peerlimit *pl, uint32_t pipe, uint64_t now,
    bool *ret_allowed, uint64_t *ret_wait_ns)
{
	allot__peer key = pipe_key(pipe), group;
	uint64_t ih;
	shard *sh = shard_of(pl, &key, &ih);
	pthread_mutex_lock(&sh->mu);
	uint32_t i = lookup(sh, ih, &key);
	if (i != NIL)
		group = sh->e[i].group;
	pthread_mutex_unlock(&sh->mu);
	if (i == NIL)
		return false;
	/* The group lives while a connection of it is bound (refilled()),
	 * so a miss is an unbind racing this message: let it through. */
	sh = shard_of(pl, &group, &ih);
	pthread_mutex_lock(&sh->mu);
	i = lookup(sh, ih, &group);
	allot__take t = { .allowed = true };
	if (i != NIL)
		allot__bucket_take(
		    &sh->e[i].b[ALLOT__PEER_MESSAGE], now, 1, &t);
	pthread_mutex_unlock(&sh->mu);
	*ret_allowed = t.allowed;
	*ret_wait_ns = t.allowed ? 0 : t.wait_ns;
	return true;
}

/* Add `delta` to the bound connections of address or group `addr`:
 * false when a +1 would pass the cap or finds no room. */
static bool
count_conn(
    allot__peerlimit *pl, const allot__peer *addr, int delta, uint64_t now)
{
	uint64_t ih;
	shard *sh = shard_of(pl, addr, &ih);
	bool ok = true;
	pthread_mutex_lock(&sh->mu);
	uint32_t i = delta > 0 ? lookup_or_add(pl, sh, ih, addr, now) :
	                         lookup(sh, ih, addr);
	if (i == NIL)
		ok = delta < 0;
	else if (delta > 0 && sh->e[i].conns >= pl->o.conns_per_peer)
		ok = false;
	else if (delta > 0)
		sh->e[i].conns++;
	else if (sh->e[i].conns > 0)
		sh->e[i].conns--;
	pthread_mutex_unlock(&sh->mu);
	return ok;
}

bool
allot__peerlimit_bind(allot__peerlimit *pl, uint32_t pipe,
    const allot__peer *peer, uint64_t identity, uint64_t now)
{
	static const allot__peer local; /* family 0: "local" */
	if (pl == NULL || pipe == 0 || pl->o.conns_per_peer == 0 ||
	    !pl->on[ALLOT__PEER_MESSAGE])
		return false;
	allot__peer key = pipe_key(pipe);
	allot__peer addr = key_of(peer != NULL ? peer : &local);
	allot__peer group = group_key(&addr, identity);
	uint64_t ih;
	shard *sh = shard_of(pl, &key, &ih);
	pthread_mutex_lock(&sh->mu);
	bool known = lookup(sh, ih, &key) != NIL;
	pthread_mutex_unlock(&sh->mu);
	if (known)
		return true;
	if (!count_conn(pl, &addr, +1, now)) {
		atomic_fetch_add(&pl->bind_refused, 1);
		return false;
	}
	if (!count_conn(pl, &group, +1, now)) {
		count_conn(pl, &addr, -1, now);
		atomic_fetch_add(&pl->bind_refused, 1);
		return false;
	}
	pthread_mutex_lock(&sh->mu);
	bool raced = lookup(sh, ih, &key) != NIL;
	uint32_t i = raced ? NIL : lookup_or_add(pl, sh, ih, &key, now);
	if (i != NIL) {
		sh->e[i].parent = addr;
		sh->e[i].group = group;
	}
	pthread_mutex_unlock(&sh->mu);
	if (i == NIL) {
		/* Bound meanwhile by another thread, or no room. */
		count_conn(pl, &group, -1, now);
		count_conn(pl, &addr, -1, now);
		if (!raced)
			atomic_fetch_add(&pl->bind_refused, 1);
		return raced;
	}
	return true;
}

void
allot__peerlimit_unbind(allot__peerlimit *pl, uint32_t pipe)
{
	if (pl == NULL || pipe == 0)
		return;
	allot__peer key = pipe_key(pipe);
	uint64_t ih;
	shard *sh = shard_of(pl, &key, &ih);
	pthread_mutex_lock(&sh->mu);
	uint32_t i = lookup(sh, ih, &key);
	allot__peer addr, group;
	if (i != NIL) {
		addr = sh->e[i].parent;
		group = sh->e[i].group;
		unlink_entry(pl, sh, i);
	}
	pthread_mutex_unlock(&sh->mu);
	if (i != NIL) {
		count_conn(pl, &group, -1, 0);
		count_conn(pl, &addr, -1, 0);
	}
}

bool
allot__peerlimit_admit(allot__peerlimit *pl, uint32_t pipe,
    const allot__peer *peer, allot__peer_budget budget, uint64_t now,
    char *err, size_t errlen)
{
	static const allot__peer local; /* family 0: "local" */
	if (pl == NULL || !pl->on[budget])
		return true;
	if (peer == NULL)
		peer = &local;
	uint64_t wait_ns = 0;
	bool ok = false;
	bool own = budget == ALLOT__PEER_MESSAGE && pipe != 0 &&
	    pl->o.conns_per_peer > 0 &&
	    take_bound(pl, pipe, now, &ok, &wait_ns);
	if (!own)
		ok = allot__peerlimit_take(pl, peer, budget, now, &wait_ns);
	if (ok)
		return true;
	char who[96];
	allot__peer_format(peer, who, sizeof who);
	if (own) {
		size_t n = strlen(who);
		snprintf(who + n, sizeof who - n,
		    " (connection %u, with the others registered from it "
		    "under its identity)",
		    (unsigned) pipe);
	}
	snprintf(err, errlen,
	    "peer %s is over its %s budget of %g/s (burst %g); retry in "
	    "%llu ms",
	    who, budget == ALLOT__PEER_REGISTER ? "Register" : "message",
	    pl->a[budget].rate, pl->a[budget].burst,
	    (unsigned long long) (wait_ns + 999999) / 1000000ull);
	return false;
}

void
allot__peerlimit_stats_get(allot__peerlimit *pl, allot__peerlimit_stats *ret)
{
	memset(ret, 0, sizeof *ret);
	if (pl == NULL)
		return;
	ret->capacity = (uint64_t) pl->per_shard * NSHARDS;
	for (uint32_t i = 0; i < NSHARDS; i++) {
		shard *sh = &pl->s[i];
		pthread_mutex_lock(&sh->mu);
		ret->peers += sh->used - sh->bound - sh->groups;
		ret->evictions += sh->evictions;
		ret->overflow += sh->overflow;
		ret->bound += sh->bound;
		pthread_mutex_unlock(&sh->mu);
	}
	ret->bind_refused = atomic_load(&pl->bind_refused);
}
