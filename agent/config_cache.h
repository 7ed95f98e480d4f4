/* SPDX-License-Identifier: MIT */
/*
 * The agent's cache of the last config the coordinator sent it
 * (config_cache.c): written by the sync engine after every install,
 * read by allot_agent_create() so that an agent starting while allotd is
 * down runs that config rather than its bootstrap file. Included by
 * agent.c and sync_core.c.
 */
#ifndef ALLOT_AGENT_CONFIG_CACHE_H
#define ALLOT_AGENT_CONFIG_CACHE_H

#include <stddef.h>

#include <allot/allot.h>

#include "log.h"

/* Write `text` (len bytes, a coordinator's quota file whose digest is
 * `digest`) to `path` atomically, mode 0600 (common/file.h: a temporary
 * file beside it, fsync, rename, fsync of the directory; never through
 * a symbolic link). The file starts with one comment line naming the
 * coordinator and the digest. ALLOT_OK or ALLOT_EIO (logged). */
int allot__config_cache_write(const char *path, const char *coordinator,
    uint64_t digest, const void *text, size_t len, allot__logger *lg);

/* At create: when opts->config_cache_file holds a config received from
 * opts->coordinator that parses and has a view for opts->service, that
 * config (the caller frees it) in *ret; otherwise NULL (the bootstrap
 * `boot` stands). Logs ALLOT-CONFIG-CACHE either way when there is a
 * cache file. Never fails the create. */
void allot__config_cache_load(const allot_agent_options *opts,
    const allot_config *boot, allot__logger *lg, allot_config **ret);

#endif
