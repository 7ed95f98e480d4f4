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
 * make it fail.
 */
#include "config_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"

#define HEADER "# allot-config-cache v1 digest="
/* The largest cache read back: what allotd sends at most, with room. */
#define CACHE_MAX (4u << 20)

static int
write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	while (len > 0) {
		ssize_t n = write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t) n;
	}
	return 0;
}

int
allot__config_cache_write(const char *path, const char *coordinator,
    uint64_t digest, const void *text, size_t len, allot__logger *lg)
{
	char tmp[4096];
	char head[512];
	int hl = snprintf(head, sizeof head,
	    HEADER "%016" PRIx64 " coordinator=%.400s\n", digest,
	    coordinator != NULL ? coordinator : "");
	if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long) getpid()) >=
	        (int) sizeof tmp ||
	    hl < 0 || hl >= (int) sizeof head) {
		allot__log(lg, ALLOT_LOG_WARNING, "ALLOT-CONFIG-CACHE",
		    "cannot cache the config at %.200s: path too long", path);
		return ALLOT_EIO;
	}
	/* Coordinator addresses never hold a newline (they are nng URLs);
	 * one that did would end the header early and fail the check. */
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	int err = fd < 0 ? errno : 0;
	if (fd >= 0) {
		if (fchmod(fd, 0600) != 0 ||
		    write_all(fd, head, (size_t) hl) != 0 ||
		    write_all(fd, text, len) != 0 || fsync(fd) != 0)
			err = errno != 0 ? errno : EIO;
		if (close(fd) != 0 && err == 0)
			err = errno;
	}
	if (err == 0 && rename(tmp, path) != 0)
		err = errno;
	if (err != 0) {
		if (fd >= 0)
			unlink(tmp);
		allot__log(lg, ALLOT_LOG_WARNING, "ALLOT-CONFIG-CACHE",
		    "cannot cache the config (digest %016" PRIx64 ") at %s: "
		    "%s; a restart while the coordinator is down runs the "
		    "bootstrap config",
		    digest, path, strerror(err));
		return ALLOT_EIO;
	}
	return ALLOT_OK;
}

/* The whole file, NUL-terminated; NULL with `why` set. */
static char *
read_cache(const char *path, size_t *ret_len, const char **why)
{
	FILE *f = fopen(path, "rb");
	if (f == NULL) {
		*why = errno == ENOENT ? NULL : strerror(errno);
		return NULL;
	}
	char *buf = malloc(CACHE_MAX + 1);
	size_t n = buf != NULL ? fread(buf, 1, CACHE_MAX + 1, f) : 0;
	bool bad = buf == NULL || ferror(f) || n > CACHE_MAX;
	fclose(f);
	if (bad) {
		*why = buf == NULL ? "out of memory" :
		                     "unreadable or too large";
		free(buf);
		return NULL;
	}
	buf[n] = '\0';
	*ret_len = n;
	return buf;
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
	char *buf = read_cache(path, &len, &why);
	if (buf == NULL) {
		if (why != NULL)
			allot__log(lg, ALLOT_LOG_WARNING, "ALLOT-CONFIG-CACHE",
			    "cannot read the config cache %s: %s; running the "
			    "bootstrap config (digest %016" PRIx64 ")",
			    path, why, boot->digest);
		else
			allot__log(lg, ALLOT_LOG_INFO, "ALLOT-CONFIG-CACHE",
			    "no config cache at %s yet; running the bootstrap "
			    "config (digest %016" PRIx64 ")",
			    path, boot->digest);
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
