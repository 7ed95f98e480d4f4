/* SPDX-License-Identifier: MIT */
/* Verified tokens remembered by their SHA-256 (cache.h). */
#include "cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define STRIPES 64

typedef struct entry {
	uint8_t digest[ALLOT__JWT_DIGEST];
	uint64_t gen; /* 0: empty (generations start at 1) */
	allot__jwt_seen seen;
} entry;

struct allot__jwt_cache {
	pthread_mutex_t mu[STRIPES];
	entry *e;
	size_t n;
};

int
allot__jwt_cache_create(unsigned entries, allot__jwt_cache **ret)
{
	allot__jwt_cache *c = calloc(1, sizeof *c);

	if (c == NULL)
		return ALLOT_ENOMEM;
	c->n = entries;
	c->e = calloc(c->n, sizeof *c->e);
	if (c->e == NULL) {
		free(c);
		return ALLOT_ENOMEM;
	}
	for (int i = 0; i < STRIPES; i++)
		pthread_mutex_init(&c->mu[i], NULL);
	*ret = c;
	return ALLOT_OK;
}

void
allot__jwt_cache_destroy(allot__jwt_cache *c)
{
	if (c == NULL)
		return;
	for (int i = 0; i < STRIPES; i++)
		pthread_mutex_destroy(&c->mu[i]);
	free(c->e);
	free(c);
}

static size_t
slot(const allot__jwt_cache *c, const uint8_t *digest)
{
	uint64_t h;

	memcpy(&h, digest, sizeof h);
	return (size_t) (h % c->n);
}

bool
allot__jwt_cache_get(allot__jwt_cache *c,
    const uint8_t digest[ALLOT__JWT_DIGEST], uint64_t gen,
    allot__jwt_seen *out)
{
	size_t i = slot(c, digest);
	pthread_mutex_t *mu = &c->mu[i % STRIPES];
	bool hit;

	pthread_mutex_lock(mu);
	hit = c->e[i].gen == gen &&
	    memcmp(c->e[i].digest, digest, ALLOT__JWT_DIGEST) == 0;
	if (hit)
		*out = c->e[i].seen;
	pthread_mutex_unlock(mu);
	return hit;
}

void
allot__jwt_cache_put(allot__jwt_cache *c,
    const uint8_t digest[ALLOT__JWT_DIGEST], uint64_t gen,
    const allot__jwt_seen *seen)
{
	size_t i = slot(c, digest);
	pthread_mutex_t *mu = &c->mu[i % STRIPES];

	pthread_mutex_lock(mu);
	memcpy(c->e[i].digest, digest, ALLOT__JWT_DIGEST);
	c->e[i].gen = gen;
	c->e[i].seen = *seen;
	pthread_mutex_unlock(mu);
}
