/* SPDX-License-Identifier: MIT */
/*
 * The agent's config cache (config_cache.h): the last quota file the
 * coordinator sent, on disk, so that an agent that starts while allotd
 * is down runs the config allotd last gave it, not a stale bootstrap
 * file (docs/protocol.md, "The config plane").
 *
 * The file is one comment line, then the coordinator's bytes unchanged:
 *
 *     # allot-config-cache v1 digest=0123456789abcdef coordinator=URL
 *     quotas:
 *       ...
 *
 * A cache is used only when the header is ours, names the coordinator
 * the agent is created with, the rest parses, its digest is the one in
 * the header (a file cut short or edited by hand is not) and the view of
 * the agent's service can be taken. Anything else is logged and the
 * bootstrap config stands: the cache can make start-up better, never
 * make it fail. The file is written and read by common/file.c: replaced
 * atomically, never through a symbolic link, and read only when it is a
 * regular file of at most CACHE_MAX bytes (a FIFO there cannot hold up
 * allot_agent_create()).
 */
#include "config_cache.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "config.h"
#include "file.h"

#define HEADER "# allot-config-cache v1 digest="
/* The largest cache read back: what allotd sends at most, with room. */
#define CACHE_MAX (4u << 20)

int
allot__config_cache_write(const char *path, const char *coordinator,
    uint64_t digest, const void *text, size_t len, allot__logger *lg)
{
	char head[512];
	char err[600];
	int hl = snprintf(head, sizeof head,
	    HEADER "%016" PRIx64 " coordinator=%.400s\n", digest,
	    coordinator != NULL ? coordinator : "");
	/* Coordinator addresses never hold a newline (they are nng URLs);
	 * one that did would end the header early and fail the check. */
	struct iovec iov[2] = { { head, (size_t) hl },
		{ (void *) text, len } };
	if (hl < 0 || hl >= (int) sizeof head)
		snprintf(err, sizeof err, "the header is too long");
	else if (allot__file_replace(path, iov, 2, 0600, 0, err, sizeof err) ==
	    ALLOT_OK)
		return ALLOT_OK;
	allot__log(lg, ALLOT_LOG_WARNING, "ALLOT-CONFIG-CACHE",
	    "cannot cache the config (digest %016" PRIx64 "): %s; a restart "
	    "while the coordinator is down runs the bootstrap config",
	    digest, err);
	return ALLOT_EIO;
}

/* The config in the cache, checked against its header; NULL with `why`
 * (a static string, or the parser's error in `err`). */
static allot_config *
parse_cache(const allot_agent_options *o, char *buf, size_t len, char *err,
    size_t errlen, const char **why, uint64_t *ret_digest)
{
	char *nl = memchr(buf, '\n', len);
	if (strncmp(buf, HEADER, strlen(HEADER)) != 0 || nl == NULL) {
		*why = "not an allot config cache";
		return NULL;
	}
	*nl = '\0';
	char *end;
	uint64_t digest = strtoull(buf + strlen(HEADER), &end, 16);
	const char *coord = strstr(end, " coordinator=");
	if (coord == NULL || o->coordinator == NULL ||
	    strcmp(coord + strlen(" coordinator="), o->coordinator) != 0) {
		*why = "written for another coordinator";
		return NULL;
	}
	const char *text = nl + 1;
	allot_config *cfg;
	if (allot_config_parse("config cache", text,
	        len - (size_t) (text - buf), err, errlen, &cfg) != ALLOT_OK) {
		*why = err;
		return NULL;
	}
	if (cfg->digest != digest) {
		*why = "its digest is not the one it was written with";
		allot_config_free(cfg);
		return NULL;
	}
	allot_config *view;
	if (allot__config_select(cfg, o->service, &view) != ALLOT_OK) {
		*why = "no view of the service could be taken";
		allot_config_free(cfg);
		return NULL;
	}
	allot_config_free(view); /* the agent takes its own at create */
	*ret_digest = digest;
	return cfg;
}

void
allot__config_cache_load(const allot_agent_options *o,
    const allot_config *boot, allot__logger *lg, allot_config **ret)
{
	*ret = NULL;
	if (o == NULL || o->config_cache_file == NULL ||
	    o->config_cache_file[0] == '\0')
		return;
	const char *path = o->config_cache_file;
	const char *why = NULL;
	size_t len = 0;
	char *buf = NULL;
	char rerr[600];
	int rc = allot__file_read(
	    path, CACHE_MAX, rerr, sizeof rerr, &buf, &len);
	if (rc == ALLOT_ENOENT) {
		allot__log(lg, ALLOT_LOG_INFO, "ALLOT-CONFIG-CACHE",
		    "no config cache at %s yet; running the bootstrap config "
		    "(digest %016" PRIx64 ")",
		    path, boot->digest);
		return;
	}
	if (rc != ALLOT_OK) {
		allot__log(lg, ALLOT_LOG_WARNING, "ALLOT-CONFIG-CACHE",
		    "cannot read the config cache: %s; running the bootstrap "
		    "config (digest %016" PRIx64 ")",
		    rerr, boot->digest);
		return;
	}
	char err[512];
	uint64_t digest = 0;
	allot_config *cfg = parse_cache(
	    o, buf, len, err, sizeof err, &why, &digest);
	free(buf);
	if (cfg == NULL) {
		allot__log(lg, ALLOT_LOG_WARNING, "ALLOT-CONFIG-CACHE",
		    "not using the config cache %s: %s; running the "
		    "bootstrap config (digest %016" PRIx64 ")",
		    path, why, boot->digest);
		return;
	}
	allot__log(lg, ALLOT_LOG_NOTICE, "ALLOT-CONFIG-CACHE",
	    "running the config cached in %s (digest %016" PRIx64 ", the "
	    "last one %s sent) instead of the bootstrap config (digest "
	    "%016" PRIx64 ") until the coordinator answers",
	    path, digest, o->coordinator, boot->digest);
	*ret = cfg;
}
