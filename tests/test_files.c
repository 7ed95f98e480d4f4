/* SPDX-License-Identifier: MIT */
/*
 * The atomic file writer and the bounded reader (common/file.h), alone
 * and as the agent's config cache uses them (agent/config_cache.c): a
 * new file and a replaced one (mode, content, no temporary file left,
 * the directory synced), a symbolic link at the target refused and its
 * target untouched, a link or a FIFO planted at the temporary file's
 * name stepped around, a FIFO or a directory at the target refused by
 * both without blocking, a file over the bound refused, and a write that
 * fails half-way leaving nothing behind.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <allot/allot.h>

#include "config.h"
#include "config_cache.h"
#include "file.h"
#include "log.h"
#include "runner.h"

static char dir[64];
static char path[128];
static char err[1024];

static void
setup(void)
{
	snprintf(dir, sizeof dir, "/tmp/allot-files-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof path, "%s/file", dir);
	err[0] = '\0';
	/* A hang on a FIFO fails the test instead of stalling the suite. */
	alarm(20);
}

static void
teardown(void)
{
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
	ck_assert_int_eq(system(cmd), 0);
}

static int
replace(const char *p, const char *text, mode_t mode, unsigned flags)
{
	struct iovec iov[2] = { { (void *) text, strlen(text) / 2 },
		{ (void *) (text + strlen(text) / 2),
		    strlen(text) - strlen(text) / 2 } };
	return allot__file_replace(p, iov, 2, mode, flags, err, sizeof err);
}

/* The file's content, or NULL. */
static char *
slurp(const char *p)
{
	FILE *f = fopen(p, "r");
	if (f == NULL)
		return NULL;
	static char buf[4096];
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

/* How many entries the test directory holds. */
static int
entries(void)
{
	DIR *d = opendir(dir);
	ck_assert_ptr_nonnull(d);
	int n = 0;
	for (struct dirent *e; (e = readdir(d)) != NULL;)
		n += strcmp(e->d_name, ".") != 0 &&
		    strcmp(e->d_name, "..") != 0;
	closedir(d);
	return n;
}

static void
put(const char *p, const char *text)
{
	FILE *f = fopen(p, "w");
	ck_assert_ptr_nonnull(f);
	fputs(text, f);
	fclose(f);
}

START_TEST(writes_and_replaces)
{
	mode_t old = umask(077);
	ck_assert_int_eq(replace(path, "first text\n", 0644, 0), ALLOT_OK);
	umask(old);
	ck_assert_str_eq(slurp(path), "first text\n");
	struct stat st;
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_uint_eq(st.st_mode & 07777, 0644); /* not the umask's */
	ck_assert_int_eq(entries(), 1); /* no temporary file left */
	/* Replaced; the old mode kept when asked. */
	ck_assert_int_eq(chmod(path, 0640), 0);
	ck_assert_int_eq(
	    replace(path, "second\n", 0600, ALLOT__FILE_KEEP_MODE), ALLOT_OK);
	ck_assert_str_eq(slurp(path), "second\n");
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_uint_eq(st.st_mode & 07777, 0640);
	ck_assert_int_eq(replace(path, "third\n", 0600, 0), ALLOT_OK);
	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_uint_eq(st.st_mode & 07777, 0600);
	ck_assert_int_eq(entries(), 1);
	/* A relative path: the directory is ".". */
	char cwd[4096];
	ck_assert_ptr_nonnull(getcwd(cwd, sizeof cwd));
	ck_assert_int_eq(chdir(dir), 0);
	ck_assert_int_eq(replace("file", "fourth\n", 0600, 0), ALLOT_OK);
	ck_assert_int_eq(chdir(cwd), 0);
	ck_assert_str_eq(slurp(path), "fourth\n");
	/* No directory: nothing to write into. */
	char none[160];
	snprintf(none, sizeof none, "%s/none/file", dir);
	ck_assert_int_eq(replace(none, "x", 0600, 0), ALLOT_EIO);
	ck_assert_msg(
	    strstr(err, "cannot open the directory of") != NULL, "%s", err);
}
END_TEST

START_TEST(symlink_at_target_refused)
{
	char victim[160];
	snprintf(victim, sizeof victim, "%s/victim", dir);
	put(victim, "precious\n");
	ck_assert_int_eq(symlink(victim, path), 0);
	ck_assert_int_eq(replace(path, "overwritten\n", 0600, 0), ALLOT_EIO);
	ck_assert_msg(strstr(err, "symbolic link") != NULL, "%s", err);
	ck_assert_str_eq(slurp(victim), "precious\n");
	struct stat st;
	ck_assert_int_eq(lstat(path, &st), 0);
	ck_assert(S_ISLNK(st.st_mode)); /* not replaced either */
	ck_assert_int_eq(entries(), 2);
	/* The reader does not follow it. */
	char *buf = NULL;
	size_t len = 0;
	ck_assert_int_eq(
	    allot__file_read(path, 1024, err, sizeof err, &buf, &len),
	    ALLOT_EIO);
	ck_assert_ptr_null(buf);
	ck_assert_msg(strstr(err, "symbolic link") != NULL, "%s", err);
}
END_TEST

START_TEST(planted_temporary_name)
{
	char victim[160], planted[200], fifo[200];
	snprintf(victim, sizeof victim, "%s/victim", dir);
	put(victim, "precious\n");
	/* The name the writer tries first, and a FIFO at it next time. */
	snprintf(planted, sizeof planted, "%s.tmp.%ld", path, (long) getpid());
	ck_assert_int_eq(symlink(victim, planted), 0);
	ck_assert_int_eq(replace(path, "new\n", 0600, 0), ALLOT_OK);
	ck_assert_str_eq(slurp(path), "new\n");
	ck_assert_str_eq(slurp(victim), "precious\n");
	struct stat st;
	ck_assert_int_eq(lstat(planted, &st), 0);
	ck_assert(S_ISLNK(st.st_mode)); /* left as it was */
	ck_assert_int_eq(entries(), 3); /* file, victim, the planted link */
	ck_assert_int_eq(unlink(planted), 0);
	snprintf(fifo, sizeof fifo, "%s", planted);
	ck_assert_int_eq(mkfifo(fifo, 0600), 0);
	ck_assert_int_eq(replace(path, "newer\n", 0600, 0), ALLOT_OK);
	ck_assert_str_eq(slurp(path), "newer\n");
	ck_assert_int_eq(entries(), 3);
}
END_TEST

START_TEST(fifo_and_directory_refused)
{
	ck_assert_int_eq(mkfifo(path, 0600), 0);
	char *buf = NULL;
	size_t len = 0;
	/* Neither blocks on the FIFO (alarm() in the fixture). */
	ck_assert_int_eq(
	    allot__file_read(path, 1024, err, sizeof err, &buf, &len),
	    ALLOT_EIO);
	ck_assert_msg(strstr(err, "not a regular file") != NULL, "%s", err);
	ck_assert_int_eq(replace(path, "x\n", 0600, 0), ALLOT_EIO);
	struct stat st;
	ck_assert_int_eq(lstat(path, &st), 0);
	ck_assert(S_ISFIFO(st.st_mode));
	ck_assert_int_eq(unlink(path), 0);
	ck_assert_int_eq(mkdir(path, 0700), 0);
	ck_assert_int_eq(
	    allot__file_read(path, 1024, err, sizeof err, &buf, &len),
	    ALLOT_EIO);
	ck_assert_int_eq(replace(path, "x\n", 0600, 0), ALLOT_EIO);
	ck_assert_msg(strstr(err, "directory") != NULL, "%s", err);
	ck_assert_int_eq(entries(), 1);
	ck_assert_ptr_null(buf);
}
END_TEST

START_TEST(reads_bounded)
{
	char *buf = NULL;
	size_t len = 0;
	ck_assert_int_eq(
	    allot__file_read(path, 16, err, sizeof err, &buf, &len),
	    ALLOT_ENOENT);
	put(path, "0123456789abcdef");
	ck_assert_int_eq(
	    allot__file_read(path, 16, err, sizeof err, &buf, &len), ALLOT_OK);
	ck_assert_uint_eq(len, 16);
	ck_assert_str_eq(buf, "0123456789abcdef");
	free(buf);
	buf = NULL;
	put(path, "0123456789abcdefX");
	ck_assert_int_eq(
	    allot__file_read(path, 16, err, sizeof err, &buf, &len),
	    ALLOT_EIO);
	ck_assert_msg(strstr(err, "larger than 16 bytes") != NULL, "%s", err);
	ck_assert_ptr_null(buf);
	put(path, "");
	ck_assert_int_eq(
	    allot__file_read(path, 16, err, sizeof err, &buf, &len), ALLOT_OK);
	ck_assert_uint_eq(len, 0);
	ck_assert_str_eq(buf, "");
	free(buf);
}
END_TEST

START_TEST(failed_write_leaves_nothing)
{
	put(path, "old\n");
	/* Writes past 4 bytes fail (EFBIG), after the temporary file. */
	signal(SIGXFSZ, SIG_IGN);
	struct rlimit rl = { 4, 4 };
	ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
	ck_assert_int_eq(
	    replace(path, "longer than four\n", 0600, 0), ALLOT_EIO);
	ck_assert_msg(strstr(err, "cannot write") != NULL, "%s", err);
	ck_assert_str_eq(slurp(path), "old\n");
	ck_assert_int_eq(entries(), 1);
}
END_TEST

/* ---- as the config cache uses them ---- */

static char logged[4096];

static void
on_log(void *ctx, int level, const char *id, const char *msg)
{
	size_t n = strlen(logged);
	snprintf(logged + n, sizeof logged - n, "%s %s\n", id, msg);
}

static const char quotas[] = "quotas:\n"
                             "  default:\n"
                             "    tokens_per_second: 10\n"
                             "    burst: 20\n";

START_TEST(config_cache_safe)
{
	allot__logger lg = { .fn = on_log, .level = ALLOT_LOG_DEBUG };
	allot_config *boot = NULL;
	ck_assert_int_eq(allot_config_parse("boot", quotas, strlen(quotas),
	                     err, sizeof err, &boot),
	    ALLOT_OK);
	allot_agent_options o;
	allot_agent_options_init(&o);
	o.coordinator = "tcp://127.0.0.1:1";
	o.service = "svc";
	o.config_cache_file = path;
	/* A FIFO at the cache: allot_agent_create's read does not block. */
	ck_assert_int_eq(mkfifo(path, 0600), 0);
	allot_config *cfg = NULL;
	allot__config_cache_load(&o, boot, &lg, &cfg);
	ck_assert_ptr_null(cfg);
	ck_assert_msg(
	    strstr(logged, "not a regular file") != NULL, "%s", logged);
	ck_assert_int_eq(unlink(path), 0);
	/* A link planted at CACHE.tmp.<pid>: its target is not written. */
	char victim[160], planted[200];
	snprintf(victim, sizeof victim, "%s/victim", dir);
	put(victim, "precious\n");
	snprintf(planted, sizeof planted, "%s.tmp.%ld", path, (long) getpid());
	ck_assert_int_eq(symlink(victim, planted), 0);
	ck_assert_int_eq(allot__config_cache_write(path, o.coordinator,
	                     boot->digest, quotas, strlen(quotas), &lg),
	    ALLOT_OK);
	ck_assert_str_eq(slurp(victim), "precious\n");
	allot__config_cache_load(&o, boot, &lg, &cfg);
	ck_assert_ptr_nonnull(cfg);
	ck_assert(cfg->digest == boot->digest);
	allot_config_free(cfg);
	/* A link at the cache itself: neither written through nor read. */
	ck_assert_int_eq(unlink(path), 0);
	ck_assert_int_eq(symlink(victim, path), 0);
	logged[0] = '\0';
	ck_assert_int_eq(allot__config_cache_write(path, o.coordinator,
	                     boot->digest, quotas, strlen(quotas), &lg),
	    ALLOT_EIO);
	ck_assert_str_eq(slurp(victim), "precious\n");
	allot__config_cache_load(&o, boot, &lg, &cfg);
	ck_assert_ptr_null(cfg);
	ck_assert_msg(strstr(logged, "symbolic link") != NULL, "%s", logged);
	allot_config_free(boot);
}
END_TEST

static Suite *
files_suite(void)
{
	Suite *s = suite_create("files");
	TCase *tc = tcase_create("files");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, writes_and_replaces);
	tcase_add_test(tc, symlink_at_target_refused);
	tcase_add_test(tc, planted_temporary_name);
	tcase_add_test(tc, fifo_and_directory_refused);
	tcase_add_test(tc, reads_bounded);
	tcase_add_test(tc, failed_write_leaves_nothing);
	tcase_add_test(tc, config_cache_safe);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(files_suite)
