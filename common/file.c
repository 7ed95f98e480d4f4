/* SPDX-License-Identifier: MIT */
/*
 * The atomic file writer and the bounded reader (file.h). The writer
 * works relative to a descriptor of the target's directory, opened once:
 * the temporary file, the check of what is at the target, the rename and
 * the directory's fsync all name that directory, so that a directory
 * swapped on the path meanwhile cannot redirect any of them.
 */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <allot/allot.h>

#include "prng.h"

/* Names tried for the temporary file: "<base>.tmp.<pid>", then with a
 * random suffix while one exists (a leftover, or planted). */
#define TMP_TRIES 16

/* "WHAT PATH: reason" into `err`; ALLOT_EIO. */
static int
fail(char *err, size_t errlen, int e, const char *what, const char *path)
{
	snprintf(err, errlen, "%s %s: %s", what, path, strerror(e));
	return ALLOT_EIO;
}

static int
write_all(int fd, const struct iovec *iov, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const char *p = iov[i].iov_base;
		size_t len = iov[i].iov_len;
		while (len > 0) {
			ssize_t w = write(fd, p, len);
			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0)
				return w < 0 ? errno : EIO;
			p += w;
			len -= (size_t) w;
		}
	}
	return 0;
}

/* Create the temporary file beside `base` in `dfd`: its name in `tmp`,
 * its descriptor, or -1 with errno set. */
static int
create_tmp(int dfd, const char *base, char *tmp, size_t cap)
{
	uint64_t seed = (uint64_t) getpid() ^ (uint64_t) time(NULL) ^
	    (uint64_t) (uintptr_t) tmp;
	for (int i = 0; i < TMP_TRIES; i++) {
		int n = i == 0 ?
		    snprintf(tmp, cap, "%s.tmp.%ld", base, (long) getpid()) :
		    snprintf(tmp, cap, "%s.tmp.%ld.%08x", base,
		        (long) getpid(), (unsigned) allot__splitmix64(&seed));
		if (n < 0 || (size_t) n >= cap || n > NAME_MAX) {
			errno = ENAMETOOLONG;
			return -1;
		}
		int fd = openat(dfd, tmp,
		    O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
		    0600);
		if (fd >= 0 || errno != EEXIST)
			return fd;
	}
	return -1;
}

/* What is at `base` may be replaced: nothing, or a regular file (whose
 * mode, with `keep`, becomes *mode). 0, or an errno value. */
static int
check_target(int dfd, const char *base, bool keep, mode_t *mode)
{
	struct stat st;
	if (fstatat(dfd, base, &st, AT_SYMLINK_NOFOLLOW) != 0)
		return errno == ENOENT ? 0 : errno;
	if (S_ISLNK(st.st_mode))
		return ELOOP;
	if (!S_ISREG(st.st_mode))
		return S_ISDIR(st.st_mode) ? EISDIR : EINVAL;
	if (keep)
		*mode = st.st_mode & 07777;
	return 0;
}

/* Write the temporary file `tmp` (open on `fd`, which is closed) and
 * rename it over `base`. 0, or an errno value (`tmp` left to the
 * caller). */
static int
fill_and_rename(int dfd, int fd, const char *tmp, const char *base,
    const struct iovec *iov, size_t n, mode_t mode)
{
	int e = fchmod(fd, mode) != 0 ? errno : 0;
	if (e == 0)
		e = write_all(fd, iov, n);
	if (e == 0 && fsync(fd) != 0)
		e = errno;
	if (close(fd) != 0 && e == 0)
		e = errno;
	if (e == 0 && renameat(dfd, tmp, dfd, base) != 0)
		e = errno;
	return e;
}

int
allot__file_replace(const char *path, const struct iovec *iov, size_t n,
    mode_t mode, unsigned flags, char *err, size_t errlen)
{
	char dir[4096], tmp[NAME_MAX + 1];
	const char *slash = strrchr(path, '/');
	const char *base = slash != NULL ? slash + 1 : path;
	size_t dn = slash == NULL ? 1 :
	    slash == path         ? 1 :
	                            (size_t) (slash - path);
	if (*base == '\0' || strcmp(base, ".") == 0 ||
	    strcmp(base, "..") == 0 || dn >= sizeof dir)
		return fail(err, errlen, EINVAL, "cannot write", path);
	memcpy(dir, slash == NULL ? "." : path, dn);
	dir[dn] = '\0';
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return fail(
		    err, errlen, errno, "cannot open the directory of", path);
	int e = check_target(
	    dfd, base, (flags & ALLOT__FILE_KEEP_MODE) != 0, &mode);
	if (e != 0) {
		close(dfd);
		return fail(err, errlen, e,
		    e == ELOOP ? "not writing through the symbolic link" :
		                 "cannot replace",
		    path);
	}
	int fd = create_tmp(dfd, base, tmp, sizeof tmp);
	if (fd < 0) {
		e = errno;
		close(dfd);
		return fail(err, errlen, e, "cannot write beside", path);
	}
	e = fill_and_rename(dfd, fd, tmp, base, iov, n, mode);
	if (e != 0) {
		unlinkat(dfd, tmp, 0);
		close(dfd);
		return fail(err, errlen, e, "cannot write", path);
	}
	/* The rename itself is durable once the directory is. */
	e = fsync(dfd) != 0 ? errno : 0;
	close(dfd);
	if (e != 0) {
		snprintf(err, errlen,
		    "wrote %s, but cannot sync its directory: %s", path,
		    strerror(e));
		return ALLOT_EIO;
	}
	return ALLOT_OK;
}

/* ---- reading ---- */

int
allot__file_read(const char *path, size_t max, char *err, size_t errlen,
    char **ret_buf, size_t *ret_len)
{
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		fail(err, errlen, e,
		    e == ELOOP ? "not reading through the symbolic link" :
		                 "cannot open",
		    path);
		return e == ENOENT ? ALLOT_ENOENT : ALLOT_EIO;
	}
	struct stat st;
	int e = fstat(fd, &st) != 0 ? errno : 0;
	if (e == 0 && !S_ISREG(st.st_mode))
		e = EINVAL;
	if (e == 0 && (uint64_t) st.st_size > max)
		e = EFBIG;
	char *buf = e == 0 ? malloc(max + 1) : NULL;
	if (e == 0 && buf == NULL)
		e = ENOMEM;
	size_t len = 0;
	/* Up to one byte past `max`: the file may have grown. */
	while (e == 0 && len <= max) {
		ssize_t r = read(fd, buf + len, max + 1 - len);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			e = errno;
		else if (r == 0)
			break;
		else
			len += (size_t) r;
	}
	if (e == 0 && len > max)
		e = EFBIG;
	close(fd);
	if (e != 0) {
		free(buf);
		if (e == EINVAL)
			snprintf(
			    err, errlen, "%s is not a regular file", path);
		else if (e == EFBIG)
			snprintf(err, errlen, "%s is larger than %zu bytes",
			    path, max);
		else
			fail(err, errlen, e, "cannot read", path);
		return e == ENOMEM ? ALLOT_ENOMEM : ALLOT_EIO;
	}
	buf[len] = '\0';
	*ret_buf = buf;
	*ret_len = len;
	return ALLOT_OK;
}
