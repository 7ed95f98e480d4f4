/* SPDX-License-Identifier: MIT */
/*
 * Rendezvous (highest-random-weight) hashing of keys to cluster members
 * and the parser of member lists (rendezvous.h). A key's weight for a
 * member is a full-avalanche mix of the key's and the member's fixed-seed
 * hashes, so weights are independent across members and the owner of
 * each key is uniform among the live members.
 */
#include "rendezvous.h"

#include <stdio.h>
#include <string.h>

#include "hash.h"

uint64_t
allot__rendezvous_key(const char *service, const char *quota)
{
	size_t ls = strlen(service), lq = strlen(quota);
	uint64_t hs = allot__hash(service, ls, ALLOT__RENDEZVOUS_SEED);
	return allot__hash(quota, lq, ALLOT__RENDEZVOUS_SEED ^ hs);
}

uint64_t
allot__rendezvous_member(const char *name)
{
	return allot__mix64(allot__hash(
	    name, strlen(name), ALLOT__RENDEZVOUS_SEED ^ 0x6d656d626572ull));
}

uint64_t
allot__rendezvous_weight(uint64_t key, uint64_t member)
{
	return allot__mix64(key ^ member);
}

int
allot__rendezvous_owner(
    uint64_t key, const uint64_t *members, const bool *live, size_t n)
{
	int best = -1;
	uint64_t best_w = 0;
	for (size_t i = 0; i < n; i++) {
		if (live != NULL && !live[i])
			continue;
		uint64_t w = allot__rendezvous_weight(key, members[i]);
		if (best < 0 || w > best_w) {
			best = (int) i;
			best_w = w;
		}
	}
	return best;
}

int
allot__member_parse(const char *spec, bool bare_ok, char *err, size_t errlen,
    allot__member *ret)
{
	const char *eq = strchr(spec, '=');
	const char *url = eq != NULL ? eq + 1 : spec;
	size_t nl = eq != NULL ? (size_t) (eq - spec) : strlen(spec);
	if (eq == NULL && !bare_ok) {
		snprintf(err, errlen, "member \"%s\" is not NAME=URL", spec);
		return -1;
	}
	if (nl == 0 || url[0] == '\0') {
		snprintf(
		    err, errlen, "member \"%s\": empty name or URL", spec);
		return -1;
	}
	if (nl >= ALLOT__MEMBER_NAME_MAX ||
	    strlen(url) >= ALLOT__MEMBER_URL_MAX) {
		snprintf(err, errlen,
		    "member \"%.40s...\": name or URL too "
		    "long",
		    spec);
		return -1;
	}
	if (memchr(spec, ',', nl) != NULL || strchr(url, ',') != NULL) {
		snprintf(
		    err, errlen, "member \"%s\": ',' in a name or URL", spec);
		return -1;
	}
	allot__member m;
	memset(&m, 0, sizeof m);
	memcpy(m.name, spec, nl);
	strcpy(m.url, url);
	m.hash = allot__rendezvous_member(m.name);
	*ret = m;
	return 0;
}

int
allot__member_parse_list(const char *list, bool bare_ok, allot__member *ret,
    size_t max, char *err, size_t errlen)
{
	size_t n = 0;
	const char *p = list;
	while (*p != '\0') {
		const char *end = strchr(p, ',');
		size_t len = end != NULL ? (size_t) (end - p) : strlen(p);
		char one[ALLOT__MEMBER_NAME_MAX + ALLOT__MEMBER_URL_MAX + 2];
		if (len >= sizeof one) {
			snprintf(err, errlen, "member entry too long");
			return -1;
		}
		memcpy(one, p, len);
		one[len] = '\0';
		if (n == max) {
			snprintf(err, errlen, "more than %zu members", max);
			return -1;
		}
		if (allot__member_parse(one, bare_ok, err, errlen, &ret[n]) !=
		    0)
			return -1;
		for (size_t i = 0; i < n; i++)
			if (strcmp(ret[i].name, ret[n].name) == 0) {
				snprintf(err, errlen,
				    "member \"%s\" listed "
				    "twice",
				    ret[n].name);
				return -1;
			}
		n++;
		if (end == NULL)
			break;
		p = end + 1;
	}
	if (n == 0) {
		snprintf(err, errlen, "empty member list");
		return -1;
	}
	return (int) n;
}
