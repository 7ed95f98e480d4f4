/* SPDX-License-Identifier: MIT */
/*
 * Fault: allotd starts on a damaged database file. A real store is made
 * first (allotd runs, an agent registers and syncs, allotd stops
 * cleanly); then copies of it are damaged: garbage bytes, a wiped
 * header, truncation at a page boundary and in the middle of a page, a
 * scribbled b-tree page, and another application's SQLite file. For each,
 * allotd must exit with status 1 and a log line that names the file and
 * says what to do, and the file must be left exactly as it was (its bytes
 * are compared before and after). Never a silent reset.
 */
#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fault.h"
#include "proc.h"
#include "runner.h"

/* The whole file, for comparing before and after. */
static char *
slurp(const char *path, size_t *ret_len)
{
	int fd = open(path, O_RDONLY);
	ck_assert_int_ge(fd, 0);
	struct stat st;
	ck_assert_int_eq(fstat(fd, &st), 0);
	size_t len = (size_t) st.st_size;
	char *buf = malloc(len + 1);
	ck_assert_ptr_nonnull(buf);
	size_t got = 0;
	while (got < len) {
		ssize_t r = read(fd, buf + got, len - got);
		ck_assert_int_gt(r, 0);
		got += (size_t) r;
	}
	close(fd);
	*ret_len = len;
	return buf;
}

static void
spill(const char *path, const char *buf, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, buf, len), (ssize_t) len);
	close(fd);
}

typedef struct damage {
	const char *name;
	const char *reason; /* expected in the message */
} damage;

START_TEST(damaged_files_are_refused)
{
	fault_env e;
	fault_env_init(&e, "corrupt", NULL);
	/* A real store, closed cleanly (the WAL checkpointed into it). */
	fault_allotd_start(&e);
	allot_agent *a = fault_agent(e.c.url, "r0");
	fault_await_synced(&a, 1, 1, 10000);
	pc_sleep_ms(1100);
	allot_agent_destroy(a);
	ck_assert_int_eq(fault_allotd_stop(&e, SIGTERM), 0);
	size_t good_len;
	char *good = slurp(e.c.db, &good_len);
	ck_assert_uint_ge(good_len, 8 * 4096);
	ck_assert_int_eq(access(e.c.db, F_OK), 0);
	char other[200];
	snprintf(other, sizeof other, "%s/other.db", e.c.dir);
	char cmd[300];
	snprintf(cmd, sizeof cmd,
	    "sqlite3 '%s' 'CREATE TABLE notes (x); "
	    "INSERT INTO notes VALUES (1)'",
	    other);
	free(pc_shell(cmd));

	static const damage cases[] = {
		{ "garbage", "file is not a database" },
		{ "header wiped", "file is not a database" },
		{ "truncated at a page", "malformed" },
		{ "truncated mid-page", "malformed" },
		{ "page scribbled", "" },
		{ "another application's database", "another application" },
	};
	uint64_t worst_ms = 0;
	int n = (int) (sizeof cases / sizeof cases[0]);
	for (int i = 0; i < n; i++) {
		char path[200];
		snprintf(path, sizeof path, "%s/damaged-%d.db", e.c.dir, i);
		char *buf = malloc(good_len);
		ck_assert_ptr_nonnull(buf);
		memcpy(buf, good, good_len);
		size_t len = good_len;
		switch (i) {
		case 0: {
			uint64_t x = 0x9e3779b97f4a7c15ull;
			for (size_t k = 0; k < len; k++) {
				x ^= x << 13;
				x ^= x >> 7;
				x ^= x << 17;
				buf[k] = (char) x;
			}
			break;
		}
		case 1: memset(buf, 0, 100); break;
		case 2: len = (len / 2) & ~(size_t) 4095; break;
		case 3: len = len / 2 + 1000; break;
		case 4:
			/* Page 2 onwards: b-tree pages of the schema's
			 * tables. */
			memset(buf + 4096 + 7, 0xff, 512);
			memset(buf + 3 * 4096, 0xee, 256);
			break;
		case 5: {
			free(buf);
			buf = slurp(other, &len);
			break;
		}
		}
		spill(path, buf, len);
		free(buf);
		size_t before_len;
		char *before = slurp(path, &before_len);

		char logname[200];
		snprintf(
		    logname, sizeof logname, "%s/allotd-%d.log", e.c.dir, i);
		char bin[512];
		snprintf(bin, sizeof bin, "%s/coordinator/allotd",
		    getenv("ALLOT_BUILD_DIR"));
		char *argv[] = { bin, "--config", e.c.cfg, "--db", path,
			"--listen", e.c.url, "--http", "off", NULL };
		uint64_t t0 = pc_now_ms();
		pid_t pid = pc_spawn(argv, logname);
		int rc = pc_wait_exit(pid, 10000);
		uint64_t ms = pc_now_ms() - t0;
		if (rc < 0) {
			kill(pid, SIGKILL);
			pc_wait_exit(pid, 5000);
		}
		worst_ms = ms > worst_ms ? ms : worst_ms;
		char *log = pc_read_file(logname);
		ck_assert_ptr_nonnull(log);
		ck_assert_msg(rc == 1, "%s: allotd exited with %d: %s",
		    cases[i].name, rc, log);
		/* The message: the file, what is wrong, what to do. */
		ck_assert_msg(strstr(log, "ALLOTD-STORE-FAIL") != NULL &&
		        strstr(log, path) != NULL &&
		        strstr(log, cases[i].reason) != NULL &&
		        strstr(log, "move it aside or restore from backup") !=
		            NULL &&
		        strstr(log, "will not overwrite") != NULL,
		    "%s: unexpected log: %s", cases[i].name, log);
		/* ... on one line. */
		const char *line = strstr(log, "ALLOTD-STORE-FAIL");
		const char *eol = strchr(line, '\n');
		const char *tail = strstr(line, "will not overwrite it");
		ck_assert_msg(eol != NULL && tail != NULL && tail < eol,
		    "%s: the message spans lines: %s", cases[i].name, line);
		printf("%s: %.*s\n", cases[i].name, (int) (eol - line), line);
		free(log);

		size_t after_len;
		char *after = slurp(path, &after_len);
		ck_assert_msg(after_len == before_len &&
		        memcmp(before, after, before_len) == 0,
		    "%s: allotd changed the file", cases[i].name);
		free(before);
		free(after);
	}
	free(good);

	fault_figures f = {
		.id = "6-corrupt",
		.fault = "corrupt or truncated database at start (6 kinds)",
		.promised = "exit 1, a message naming the file and what to "
		            "do; the file is never modified",
		.requests = 0,
		.failed = 0,
		.over_rt = NAN,
		.recovery_ms = NAN,
	};
	snprintf(f.measured, sizeof f.measured,
	    "%d of %d refused with exit status 1 within %llu ms, each "
	    "naming the file, the damage and the remedy; every file "
	    "byte-for-byte unchanged",
	    n, n, (unsigned long long) worst_ms);
	fault_report(&f);
	fault_env_fini(&e);
}
END_TEST

static Suite *
corrupt_suite(void)
{
	Suite *s = suite_create("fault-corrupt");
	TCase *tc = tcase_create("start");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, damaged_files_are_refused);
	suite_add_tcase(s, tc);
	return s;
}

ALLOT_TEST_MAIN(corrupt_suite)
