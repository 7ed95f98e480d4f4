/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target "admin_body": what allotd's admin API does with the body of
 * POST /config/diff and /config/apply (coordinator/admin/admin.c) before
 * any of it reaches the loop: load it as a quota file in a buffer of
 * exactly its length, then diff it against the config in force
 * (common/config_diff.c, which the audit table and allotctl print) both
 * ways. A refused body comes back with a message and no config; an
 * accepted one diffs to nothing against itself, to only additions from
 * an empty store, and against the config in force to changes that
 * mirror the reverse diff (an addition one way is a removal the other),
 * each naming its quota and the texts its kind has; a body with the
 * digest of the config in force diffs to nothing.
 */
#include <string.h>

#include "config.h"
#include "config_diff.h"
#include "fuzz.h"

static size_t
count(const allot__config_diff *d, allot__change_kind k)
{
	size_t n = 0;
	for (size_t i = 0; i < d->n; i++)
		n += d->v[i].kind == k;
	return n;
}

static void
check_diff(const allot__config_diff *d)
{
	for (size_t i = 0; i < d->n; i++) {
		const allot__quota_change *c = &d->v[i];
		FUZZ_CHECK(c->quota != NULL && c->quota[0] != '\0');
		FUZZ_CHECK(
		    (c->before == NULL) == (c->kind == ALLOT__QUOTA_ADDED));
		FUZZ_CHECK(
		    (c->after == NULL) == (c->kind == ALLOT__QUOTA_REMOVED));
		FUZZ_CHECK(
		    (c->fields != NULL) == (c->kind == ALLOT__QUOTA_CHANGED));
		FUZZ_CHECK(strcmp(allot__change_kind_name(c->kind), "?") != 0);
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static allot_config *cur;
	char err[1024] = "";
	if (cur == NULL &&
	    allot_config_parse("quotas.yaml", FUZZ_CONFIG_YAML,
	        strlen(FUZZ_CONFIG_YAML), err, sizeof err, &cur) != ALLOT_OK) {
		fprintf(stderr, "fuzz_admin_body: %s\n", err);
		abort();
	}
	char *body = malloc(size ? size : 1);
	if (body == NULL)
		return 0;
	memcpy(body, data, size);
	allot_config *cfg = NULL;
	int rc = allot_config_parse(
	    "(request body)", body, size, err, sizeof err, &cfg);
	free(body);
	if (rc != ALLOT_OK) {
		FUZZ_CHECK(cfg == NULL);
		FUZZ_CHECK(err[0] != '\0' || rc == ALLOT_ENOMEM);
		return 0;
	}
	allot__config_diff self = { 0 }, fresh = { 0 }, fwd = { 0 },
	                   back = { 0 };
	if (allot__config_diff_compute(cfg, cfg, &self) == ALLOT_OK)
		FUZZ_CHECK(self.n == 0);
	if (allot__config_diff_compute(NULL, cfg, &fresh) == ALLOT_OK) {
		check_diff(&fresh);
		FUZZ_CHECK(count(&fresh, ALLOT__QUOTA_ADDED) == fresh.n);
	}
	if (allot__config_diff_compute(cur, cfg, &fwd) == ALLOT_OK &&
	    allot__config_diff_compute(cfg, cur, &back) == ALLOT_OK) {
		check_diff(&fwd);
		check_diff(&back);
		FUZZ_CHECK(count(&fwd, ALLOT__QUOTA_ADDED) ==
		    count(&back, ALLOT__QUOTA_REMOVED));
		FUZZ_CHECK(count(&fwd, ALLOT__QUOTA_REMOVED) ==
		    count(&back, ALLOT__QUOTA_ADDED));
		FUZZ_CHECK(count(&fwd, ALLOT__QUOTA_CHANGED) ==
		    count(&back, ALLOT__QUOTA_CHANGED));
		if (cfg->digest == cur->digest)
			FUZZ_CHECK(fwd.n == 0 && back.n == 0);
	}
	allot__config_diff_free(&self);
	allot__config_diff_free(&fresh);
	allot__config_diff_free(&fwd);
	allot__config_diff_free(&back);
	allot_config_free(cfg);
	return 0;
}
