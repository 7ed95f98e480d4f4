/* SPDX-License-Identifier: MIT */
/*
 * The agent's account (account.h): the open second, the waiting records
 * and their folding.
 */
#include "account.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "allot.pb-c.h"
#include "allot/allot.h"
#include "prng.h"

static int grow(allot__account *ac, uint32_t cap);

int
allot__acct_init(allot__account *ac, uint32_t cap, uint64_t seed)
{
	memset(ac, 0, sizeof *ac);
	uint64_t s = seed;
	do
		ac->incarnation = allot__splitmix64(&s);
	while (ac->incarnation == 0);
	ac->next_id = 1;
	ac->open_second = INT64_MIN;
	ac->ring = calloc(ALLOT__ACCT_RECORDS, sizeof *ac->ring);
	if (ac->ring == NULL)
		return ALLOT_ENOMEM;
	if (grow(ac, cap > 0 ? cap : 1) != ALLOT_OK) {
		free(ac->ring);
		ac->ring = NULL;
		return ALLOT_ENOMEM;
	}
	return ALLOT_OK;
}

void
allot__acct_fini(allot__account *ac)
{
	for (size_t i = 0; ac->ring != NULL && i < ac->n; i++)
		free(ac->ring[(ac->head + i) % ALLOT__ACCT_RECORDS].c);
	free(ac->ring);
	free(ac->base);
	free(ac->open);
	memset(ac, 0, sizeof *ac);
}

static int
grow(allot__account *ac, uint32_t cap)
{
	if (cap <= ac->cap)
		return ALLOT_OK;
	allot__acct_base *b = calloc(cap, sizeof *b);
	allot__acct_count *o = calloc(cap, sizeof *o);
	if (b == NULL || o == NULL) {
		free(b);
		free(o);
		return ALLOT_ENOMEM;
	}
	if (ac->cap > 0) {
		memcpy(b, ac->base, ac->cap * sizeof *b);
		memcpy(o, ac->open, ac->cap * sizeof *o);
	}
	free(ac->base);
	free(ac->open);
	ac->base = b;
	ac->open = o;
	ac->cap = cap;
	return ALLOT_OK;
}

static allot__acct_rec *
at(allot__account *ac, size_t i)
{
	return &ac->ring[(ac->head + i) % ALLOT__ACCT_RECORDS];
}

const allot__acct_rec *
allot__acct_at(const allot__account *ac, size_t i)
{
	return &ac->ring[(ac->head + i) % ALLOT__ACCT_RECORDS];
}

static uint64_t
rec_tokens(const allot__acct_rec *r)
{
	uint64_t t = 0;
	for (uint32_t i = 0; i < r->n; i++)
		t += r->c[i].admitted + r->c[i].denied;
	return t;
}

/* Add `src`'s counts into `dst` (both sorted by key). */
static bool
merge(allot__acct_rec *dst, const allot__acct_rec *src)
{
	allot__acct_count *m = malloc(
	    ((size_t) dst->n + src->n) * sizeof *m + 1);
	if (m == NULL)
		return false;
	uint32_t i = 0, j = 0, k = 0;
	while (i < dst->n || j < src->n) {
		if (j == src->n ||
		    (i < dst->n && dst->c[i].key < src->c[j].key)) {
			m[k++] = dst->c[i++];
		} else if (i == dst->n || src->c[j].key < dst->c[i].key) {
			m[k++] = src->c[j++];
		} else {
			m[k] = dst->c[i++];
			m[k].admitted += src->c[j].admitted;
			m[k].denied += src->c[j].denied;
			m[k].shadow += src->c[j++].shadow;
			k++;
		}
	}
	free(dst->c);
	dst->c = m;
	dst->n = k;
	return true;
}

/* Remove the record at position `i`, keeping the order of the rest. */
static void
remove_at(allot__account *ac, size_t i)
{
	for (size_t j = i; j > 0; j--)
		*at(ac, j) = *at(ac, j - 1);
	ac->head = (ac->head + 1) % ALLOT__ACCT_RECORDS;
	ac->n--;
}

/* The list is full: fold the oldest minute that holds more than one
 * record, else drop the oldest record. */
static void
make_room(allot__account *ac)
{
	for (size_t i = 0; i + 1 < ac->n; i++) {
		allot__acct_rec *a = at(ac, i);
		int64_t minute = a->second - (a->second % 60 + 60) % 60;
		size_t j = i + 1;
		while (j < ac->n && at(ac, j)->second - minute < 60 &&
		    at(ac, j)->second >= minute)
			j++;
		if (j - i < 2)
			continue;
		/* Fold i+1 .. j-1 into i, newest id last. */
		a->second = minute;
		a->span = 60;
		for (size_t k = i + 1; k < j; k++) {
			allot__acct_rec *b = at(ac, k);
			if (!merge(a, b))
				break;
			a->id = b->id;
			free(b->c);
			b->c = NULL;
			b->n = 0;
			atomic_fetch_add(&ac->folded, 1);
		}
		/* Close the gap the folded records left. */
		size_t w = i + 1;
		for (size_t k = i + 1; k < ac->n; k++) {
			allot__acct_rec *b = at(ac, k);
			if (b->c == NULL && b->id <= a->id)
				continue;
			*at(ac, w++) = *b;
		}
		ac->n = w;
		return;
	}
	allot__acct_rec *old = at(ac, 0);
	atomic_fetch_add(&ac->dropped, 1);
	atomic_fetch_add(&ac->dropped_tokens, rec_tokens(old));
	free(old->c);
	remove_at(ac, 0);
}

/* The open second becomes the next record. */
static bool
close_open(allot__account *ac)
{
	if (!ac->open_used)
		return true;
	uint32_t n = 0;
	for (uint32_t q = 0; q < ac->cap; q++)
		if (ac->open[q].admitted > 0 || ac->open[q].denied > 0)
			n++;
	allot__acct_count *c = malloc((size_t) n * sizeof *c + 1);
	if (c == NULL)
		return false;
	n = 0;
	for (uint32_t q = 0; q < ac->cap; q++) {
		allot__acct_count *o = &ac->open[q];
		if (o->admitted == 0 && o->denied == 0)
			continue;
		c[n] = *o;
		c[n++].key = q;
		memset(o, 0, sizeof *o);
	}
	if (ac->n == ALLOT__ACCT_RECORDS)
		make_room(ac);
	allot__acct_rec *r = at(ac, ac->n++);
	r->first = r->id = ac->next_id++;
	r->second = ac->open_second;
	r->span = 1;
	r->n = n;
	r->c = c;
	ac->open_used = false;
	atomic_store(&ac->pending_pub, ac->n);
	return true;
}

bool
allot__acct_second(allot__account *ac, int64_t second)
{
	if (second == ac->open_second)
		return true;
	if (!close_open(ac))
		return false;
	ac->open_second = second;
	return true;
}

void
allot__acct_take(allot__account *ac, uint32_t q, uint64_t spent,
    uint64_t denied, uint64_t shadow)
{
	if (q >= ac->cap)
		return;
	allot__acct_base *b = &ac->base[q];
	uint64_t adm = allot__acct_rise(spent, &b->spent);
	uint64_t den = allot__acct_rise(denied, &b->denied);
	uint64_t sh = shadow - b->shadow;
	if (adm == 0 && den == 0)
		return;
	b->shadow = shadow;
	allot__acct_count *o = &ac->open[q];
	o->admitted += adm;
	o->denied += den;
	o->shadow += sh < adm ? sh : adm;
	ac->open_used = true;
	atomic_store(&ac->pending_pub, ac->n + 1);
}

bool
allot__acct_close(allot__account *ac)
{
	return close_open(ac);
}

void
allot__acct_durable(allot__account *ac, uint64_t id)
{
	if (id >= ac->next_id)
		return; /* not an id of ours: ignored */
	if (id > atomic_load(&ac->durable))
		atomic_store(&ac->durable, id);
	while (ac->n > 0 && at(ac, 0)->id <= id) {
		free(at(ac, 0)->c);
		at(ac, 0)->c = NULL;
		ac->head = (ac->head + 1) % ALLOT__ACCT_RECORDS;
		ac->n--;
	}
	atomic_store(&ac->pending_pub, ac->n + (ac->open_used ? 1 : 0));
}

int
allot__acct_wire(const allot__account *ac, size_t max,
    Allot__V1__Usage ***ret_list, size_t *ret_n, void **ret_mem)
{
	size_t n = ac->n < max ? ac->n : max, nc = 0;
	*ret_list = NULL;
	*ret_n = 0;
	*ret_mem = NULL;
	if (n == 0)
		return ALLOT_OK;
	for (size_t i = 0; i < n; i++)
		nc += allot__acct_at(ac, i)->n;
	size_t sz = n *
	        (sizeof(Allot__V1__Usage *) + sizeof(Allot__V1__Usage)) +
	    nc *
	        (sizeof(Allot__V1__UsageCount *) +
	            sizeof(Allot__V1__UsageCount));
	char *mem = malloc(sz);
	if (mem == NULL)
		return ALLOT_ENOMEM;
	Allot__V1__Usage **list = (Allot__V1__Usage **) mem;
	Allot__V1__Usage *u = (Allot__V1__Usage *) (list + n);
	Allot__V1__UsageCount **cp = (Allot__V1__UsageCount **) (u + n);
	Allot__V1__UsageCount *c = (Allot__V1__UsageCount *) (cp + nc);
	for (size_t i = 0; i < n; i++) {
		const allot__acct_rec *r = allot__acct_at(ac, i);
		allot__v1__usage__init(&u[i]);
		u[i].id = r->id;
		u[i].first = r->first != r->id ? r->first : 0;
		u[i].second = r->second;
		u[i].span = r->span;
		u[i].n_counts = r->n;
		u[i].counts = r->n > 0 ? cp : NULL;
		for (uint32_t k = 0; k < r->n; k++) {
			allot__v1__usage_count__init(c);
			c->key = r->c[k].key;
			c->admitted = r->c[k].admitted;
			c->denied = r->c[k].denied;
			c->shadow_denied = r->c[k].shadow;
			*cp++ = c++;
		}
		list[i] = &u[i];
	}
	*ret_list = list;
	*ret_n = n;
	*ret_mem = mem;
	return ALLOT_OK;
}
