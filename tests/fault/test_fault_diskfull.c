/* SPDX-License-Identifier: MIT */
/*
 * Fault: the disk under the store fills up. The database lives on a 2 MiB
 * tmpfs that the test mounts in a mount namespace of its own (so the
 * mount goes away with the test, however it ends), then fills with a
 * file. allotd must keep allocating (every agent keeps getting replies),
 * count the failed commits in /metrics and log them, and once the filler
 * is deleted write everything it queued: the rows of the outage appear.
 * Skipped (77) where tmpfs cannot be mounted (not root, no namespaces).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fault.h"
#include "proto_client.h"

/* A private mount namespace with a 2 MiB tmpfs at `dir`. */
static int
mount_tmpfs(const char *dir)
{
	if (unshare(CLONE_NEWNS) != 0)
		return -1;
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
		return -1;
	return mount("tmpfs", dir, "tmpfs", 0, "size=2m,mode=0755");
}

typedef struct filler {
	char path[192];
	uint64_t bytes;
} filler;

/* Write until the file system is full, in smaller and smaller blocks so
 * that not even a page is left. */
static void
fill(void *ctx)
{
	filler *fl = ctx;
	int fd = open(fl->path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	ck_assert_int_ge(fd, 0);
	static char block[65536];
	memset(block, 0xa5, sizeof block);
	for (size_t bs = sizeof block; bs >= 512; bs /= 2)
		for (int i = 0; i < 4096; i++) {
			ssize_t w = write(fd, block, bs);
			if (w <= 0) {
				ck_assert_int_eq(errno, ENOSPC);
				break;
			}
			fl->bytes += (uint64_t) w;
		}
	close(fd);
}

static void
unfill(void *ctx)
{
	filler *fl = ctx;
	ck_assert_int_eq(unlink(fl->path), 0);
}

START_TEST(disk_full)
{
	char mnt[] = "/tmp/allot-fault-tmpfs-XXXXXX";
	ck_assert_ptr_nonnull(mkdtemp(mnt));
	ck_assert_msg(mount_tmpfs(mnt) == 0, "mount tmpfs on %s: %s", mnt,
	    strerror(errno));
	fault_env e;
	fault_env_init(&e, "diskfull", mnt);
	filler fl = { .bytes = 0 };
	snprintf(fl.path, sizeof fl.path, "%s/filler", mnt);
	fault_outage o = {
		.begin = fill,
		.end = unfill,
		.ctx = &fl,
		.outage_ms = 3000,
		.log_text = "database or disk is full",
	};
	fault_figures f = {
		.id = "2-diskfull",
		.fault = "disk full under the store (2 MiB tmpfs filled)",
		.promised = "allocation goes on; failures counted and logged; "
		            "queued rows written when space returns",
	};
	fault_store_outage(&e, &o, &f);
	ck_assert_uint_gt(fl.bytes, 0);
	fault_env_fini(&e);
	ck_assert_int_eq(umount(mnt), 0);
	ck_assert_int_eq(rmdir(mnt), 0);
}
END_TEST

static Suite *
diskfull_suite(void)
{
	Suite *s = suite_create("fault-diskfull");
	TCase *tc = tcase_create("tmpfs");
	tcase_set_timeout(tc, 80);
	tcase_add_test(tc, disk_full);
	suite_add_tcase(s, tc);
	return s;
}

/* Can this process mount a tmpfs in a namespace of its own? Tried in a
 * child, which takes its namespace with it. */
static bool
can_mount(void)
{
	pid_t pid = fork();
	if (pid == 0) {
		char d[] = "/tmp/allot-fault-probe-XXXXXX";
		if (mkdtemp(d) == NULL)
			_exit(1);
		int ok = mount_tmpfs(d) == 0 && umount(d) == 0;
		rmdir(d);
		_exit(ok ? 0 : 1);
	}
	int st = 0;
	return pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) &&
	    WEXITSTATUS(st) == 0;
}

int
main(void)
{
	if (!can_mount()) {
		printf("skipped: cannot mount a tmpfs (needs root and mount "
		       "namespaces)\n");
		return 77;
	}
	SRunner *sr = srunner_create(diskfull_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
