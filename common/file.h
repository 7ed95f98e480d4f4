/* SPDX-License-Identifier: MIT */
/*
 * Files written and read whole, the one way allot does it: the atomic
 * writer (a temporary file beside the target, created exclusively and
 * never through a link, fsync, rename, fsync of the directory) and the
 * bounded reader that opens nothing but a regular file and never waits
 * on a FIFO. The agent's config cache and allotd's quota file (an apply,
 * a committed config) go through them.
 */
#ifndef ALLOT_COMMON_FILE_H
#define ALLOT_COMMON_FILE_H

#include <stddef.h>
#include <sys/types.h>
#include <sys/uio.h>

/* allot__file_replace: an existing file's mode wins over `mode`. */
#define ALLOT__FILE_KEEP_MODE 1u

/* Replace the file at `path` with the `n` pieces of `iov`, atomically:
 * after any crash `path` is the old file or the new one, and once this
 * returns ALLOT_OK the new one is on disk (the file and the rename both
 * synced). The temporary file is "<path>.tmp.<pid>" (another name if
 * that one exists), created with O_EXCL and O_NOFOLLOW in the target's
 * directory and removed on every error. A symbolic link at `path` is
 * refused, not written through nor replaced, and so is anything there
 * but a regular file. The new file has `mode` (or, with
 * ALLOT__FILE_KEEP_MODE, the old file's). Returns ALLOT_OK, or ALLOT_EIO
 * with `err` saying why; then `path` is unchanged, but for a failed sync
 * of the directory after the rename, which `err` says. */
int allot__file_replace(const char *path, const struct iovec *iov, size_t n,
    mode_t mode, unsigned flags, char *err, size_t errlen);

/* Read the regular file at `path` whole, at most `max` bytes: opened
 * with O_NOFOLLOW and O_NONBLOCK, so that a symbolic link is refused and
 * a FIFO or device neither blocks nor is read. On ALLOT_OK, *ret_buf (the
 * caller frees it) holds *ret_len bytes and a NUL after them. Otherwise
 * ALLOT_ENOENT (no file), ALLOT_ENOMEM, or ALLOT_EIO (unreadable, not a
 * regular file, a link, or larger than `max`), with `err` saying why. */
int allot__file_read(const char *path, size_t max, char *err, size_t errlen,
    char **ret_buf, size_t *ret_len);

/* The `max` for a PEM file: a certificate chain, a key, a CA bundle. */
#define ALLOT__PEM_MAX (1024u * 1024u)

#endif
