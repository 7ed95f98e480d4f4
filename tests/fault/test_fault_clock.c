/* SPDX-License-Identifier: MIT */
/*
 * Fault: the wall clock jumps, forwards and backwards, by hours and days.
 * Agents (tests/fault/fault_agent.c) and allotd run under libfaketime with
 * the wall-clock offset read from a file the test rewrites during the
 * run; FAKETIME_DONT_FAKE_MONOTONIC=1 leaves CLOCK_MONOTONIC alone, so only
 * the wall clock jumps. Every agent runs the same fixed schedule against
 * a bucket of R = 200/s, B = 100 (3 s, one acquire every 500 us), and
 * the number admitted must be the same with and without jumps: with the
 * default (TSC) clock, with ALLOT_CLOCK=monotonic (time then comes from
 * clock_gettime, which libfaketime intercepts), and synced with an allotd
 * that sees the same jumps. The check is shown to bite: a control agent
 * given CLOCK_REALTIME as its clock admits a very different number under
 * the same jumps (and the same number without them), and every jumping
 * child reports that its own wall clock did jump. Skipped (77), saying
 * so, without libfaketime. In an ASan build both run with libfaketime
 * preloaded ahead of ASan's runtime (asan_preload_option()).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fault.h"
#include "proc.h"

#define RATE 200.0
#define BURST 100.0
#define DURATION_MS 3000
#define TICK_US 500

extern char **environ;

static const char *
faketime_lib(void)
{
	const char *p = getenv("ALLOT_FAKETIME");
	if (p == NULL)
		p = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
	return access(p, R_OK) == 0 ? p : NULL;
}

/* ASAN_OPTIONS for a program with libfaketime preloaded: ASan's runtime
 * wants to be the first library, and with the preload it is not; allowed
 * (libfaketime intercepts the clocks, ASan the allocator), not checked,
 * as test_partition.c does for its skewed members. Harmless in a build
 * without ASan. */
static const char *
asan_preload_option(void)
{
	static char opt[600];
	const char *o = getenv("ASAN_OPTIONS");
	snprintf(opt, sizeof opt, "ASAN_OPTIONS=%s%sverify_asan_link_order=0",
	    o != NULL ? o : "", o != NULL && *o != '\0' ? ":" : "");
	return opt;
}

typedef struct child {
	const char *name;
	pid_t pid;
	int in; /* its stdin */
	int out; /* its stdout */
	char line[512];
	/* results */
	unsigned long long admitted, denied, errors, fallbacks, registers;
	double elapsed_ms;
	int forward, backward;
} child;

/* Start fault-agent under libfaketime reading offsets from `tsfile`. */
static void
child_start(child *c, const char *name, const char *tsfile,
    const char *clock_env, const char *coordinator, bool wallclock,
    const char *log)
{
	memset(c, 0, sizeof *c);
	c->name = name;
	const char *bin = getenv("ALLOT_FAULT_AGENT");
	ck_assert_msg(bin != NULL, "ALLOT_FAULT_AGENT is not set");
	char rate[32], burst[32], dur[32], tick[32];
	snprintf(rate, sizeof rate, "%g", RATE);
	snprintf(burst, sizeof burst, "%g", BURST);
	snprintf(dur, sizeof dur, "%d", DURATION_MS);
	snprintf(tick, sizeof tick, "%d", TICK_US);
	char *argv[16] = { (char *) bin, "--rate", rate, "--burst", burst,
		"--duration-ms", dur, "--tick-us", tick };
	int n = 9;
	if (coordinator != NULL) {
		argv[n++] = "--coordinator";
		argv[n++] = (char *) coordinator;
	}
	if (wallclock)
		argv[n++] = "--wallclock";
	argv[n] = NULL;

	char preload[300], ts[300], clk[64];
	snprintf(preload, sizeof preload, "LD_PRELOAD=%s", faketime_lib());
	snprintf(ts, sizeof ts, "FAKETIME_TIMESTAMP_FILE=%s", tsfile);
	snprintf(clk, sizeof clk, "ALLOT_CLOCK=%s",
	    clock_env != NULL ? clock_env : "");
	size_t ne = 0;
	while (environ[ne] != NULL)
		ne++;
	char **envp = calloc(ne + 7, sizeof *envp);
	ck_assert_ptr_nonnull(envp);
	size_t k = 0;
	for (size_t i = 0; i < ne; i++)
		if (strncmp(environ[i], "ALLOT_CLOCK=", 12) != 0 &&
		    strncmp(environ[i], "ASAN_OPTIONS=", 13) != 0)
			envp[k++] = environ[i];
	envp[k++] = (char *) asan_preload_option();
	envp[k++] = preload;
	envp[k++] = ts;
	envp[k++] = "FAKETIME_NO_CACHE=1";
	envp[k++] = "FAKETIME_DONT_FAKE_MONOTONIC=1";
	if (clock_env != NULL)
		envp[k++] = clk;

	int pin[2], pout[2];
	ck_assert_int_eq(pipe(pin), 0);
	ck_assert_int_eq(pipe(pout), 0);
	int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
	ck_assert_int_ge(fd, 0);
	c->pid = fork();
	ck_assert_int_ge(c->pid, 0);
	if (c->pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		dup2(pin[0], STDIN_FILENO);
		dup2(pout[1], STDOUT_FILENO);
		dup2(fd, STDERR_FILENO);
		close(pin[1]);
		close(pout[0]);
		execve(argv[0], argv, envp);
		_exit(127);
	}
	free(envp);
	close(fd);
	close(pin[0]);
	close(pout[1]);
	c->in = pin[1];
	c->out = pout[0];
}

/* Read one line from the child within `timeout_ms`. */
static void
child_line(child *c, int timeout_ms)
{
	size_t n = 0;
	uint64_t t0 = pc_now_ms();
	for (;;) {
		ck_assert_msg(
		    n + 1 < sizeof c->line, "%s: line too long", c->name);
		uint64_t el = pc_now_ms() - t0;
		ck_assert_msg(
		    el < (uint64_t) timeout_ms, "%s: no answer", c->name);
		struct pollfd pf = { .fd = c->out, .events = POLLIN };
		if (poll(&pf, 1, timeout_ms - (int) el) <= 0)
			continue;
		ssize_t r = read(c->out, c->line + n, 1);
		ck_assert_msg(r == 1, "%s exited early (status %d)", c->name,
		    pc_wait_exit(c->pid, 1000));
		if (c->line[n] == '\n')
			break;
		n++;
	}
	c->line[n] = '\0';
}

static void
child_go(child *c)
{
	ck_assert_int_eq(write(c->in, "go\n", 3), 3);
}

static void
child_result(child *c)
{
	child_line(c, DURATION_MS + 10000);
	ck_assert_msg(
	    sscanf(c->line,
	        "admitted=%llu denied=%llu errors=%llu "
	        "elapsed_ms=%lf forward=%d backward=%d "
	        "fallbacks=%llu registers=%llu",
	        &c->admitted, &c->denied, &c->errors, &c->elapsed_ms,
	        &c->forward, &c->backward, &c->fallbacks, &c->registers) == 8,
	    "%s said: %s", c->name, c->line);
	ck_assert_int_eq(pc_wait_exit(c->pid, 5000), 0);
	close(c->in);
	close(c->out);
	printf("%-22s %s\n", c->name, c->line);
	fflush(stdout);
}

/* What a bucket of RATE and BURST admits from full, offered far more
 * than it holds, over the time the schedule really took. */
static double
expected(const child *c)
{
	return BURST + RATE * c->elapsed_ms / 1000.0;
}

/* The decisions agree: the same count, within scheduling noise (10
 * tokens or 2%). A wall-clock agent misses by a third of the count. */
static bool
same(double a, double b)
{
	return fabs(a - b) <= fmax(10.0, 0.02 * fmax(a, b));
}

/* What a local agent admitted beyond the rate over its own run. Two
 * runs of different length (a child that fell behind its schedule on a
 * loaded machine: 200 ms once under ASan) admit different counts for
 * the same decisions; they compare on this. */
static double
excess(const child *c)
{
	return (double) c->admitted - RATE * c->elapsed_ms / 1000.0;
}

static void
write_offset(const char *path, const char *spec)
{
	char tmp[300];
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	ck_assert_ptr_nonnull(f);
	fprintf(f, "%s\n", spec);
	fclose(f);
	/* Atomic: a reader never sees a half-written offset. */
	ck_assert_int_eq(rename(tmp, path), 0);
}

START_TEST(wall_clock_jumps)
{
	fault_env still, jumpy;
	fault_env_init(&still, "clock-still", NULL);
	fault_env_init(&jumpy, "clock-jumpy", NULL);
	char ts_still[200], ts_jumpy[200], log[200];
	snprintf(ts_still, sizeof ts_still, "%s/offset", still.c.dir);
	snprintf(ts_jumpy, sizeof ts_jumpy, "%s/offset", jumpy.c.dir);
	snprintf(log, sizeof log, "%s/agents.log", jumpy.c.dir);
	write_offset(ts_still, "+0");
	write_offset(ts_jumpy, "+0");

	/* allotd under libfaketime too, one still and one jumping. */
	char preload[300], f1[300], f2[300];
	snprintf(preload, sizeof preload, "LD_PRELOAD=%s", faketime_lib());
	snprintf(f1, sizeof f1, "FAKETIME_TIMESTAMP_FILE=%s", ts_still);
	snprintf(f2, sizeof f2, "FAKETIME_TIMESTAMP_FILE=%s", ts_jumpy);
	const char *env_still[] = { preload, f1, "FAKETIME_NO_CACHE=1",
		"FAKETIME_DONT_FAKE_MONOTONIC=1", asan_preload_option(),
		NULL };
	const char *env_jumpy[] = { preload, f2, "FAKETIME_NO_CACHE=1",
		"FAKETIME_DONT_FAKE_MONOTONIC=1", asan_preload_option(),
		NULL };
	still.c.env = env_still;
	jumpy.c.env = env_jumpy;
	fault_allotd_start(&still);
	fault_allotd_start(&jumpy);

	enum { BASE, TSC, MONO, COORD0, COORD, CTRL0, CTRL, NCHILD };
	child c[NCHILD];
	child_start(&c[BASE], "still tsc", ts_still, NULL, NULL, false, log);
	child_start(&c[TSC], "jumps tsc", ts_jumpy, NULL, NULL, false, log);
	child_start(&c[MONO], "jumps monotonic", ts_jumpy, "monotonic", NULL,
	    false, log);
	child_start(&c[COORD0], "still allotd", ts_still, "monotonic",
	    still.c.url, false, log);
	child_start(&c[COORD], "jumps allotd", ts_jumpy, "monotonic",
	    jumpy.c.url, false, log);
	child_start(&c[CTRL0], "still wallclock-agent", ts_still, NULL, NULL,
	    true, log);
	child_start(&c[CTRL], "jumps wallclock-agent", ts_jumpy, NULL, NULL,
	    true, log);
	for (int i = 0; i < NCHILD; i++) {
		child_line(&c[i], 15000);
		ck_assert_str_eq(c[i].line, "ready");
	}
	uint64_t t0 = pc_now_ms();
	for (int i = 0; i < NCHILD; i++)
		child_go(&c[i]);
	/* A day forwards, a day back, two hours forwards, three back. */
	static const struct {
		unsigned at_ms;
		const char *spec;
	} jumps[] = {
		{ 600, "+1d" },
		{ 1200, "+0" },
		{ 1800, "+2h" },
		{ 2400, "-1h" },
	};
	for (size_t j = 0; j < sizeof jumps / sizeof jumps[0]; j++) {
		uint64_t el = pc_now_ms() - t0;
		if (el < jumps[j].at_ms)
			pc_sleep_ms(jumps[j].at_ms - (unsigned) el);
		write_offset(ts_jumpy, jumps[j].spec);
	}
	for (int i = 0; i < NCHILD; i++)
		child_result(&c[i]);

	/* Each child's wall clock did what it was told. */
	for (int i = 0; i < NCHILD; i++) {
		bool jumping = i == TSC || i == MONO || i == COORD ||
		    i == CTRL;
		bool both = c[i].forward >= 2 && c[i].backward >= 2;
		bool none = c[i].forward == 0 && c[i].backward == 0;
		ck_assert_msg(jumping ? both : none,
		    "%s saw %d forward and %d backward jumps", c[i].name,
		    c[i].forward, c[i].backward);
		ck_assert_uint_eq(c[i].errors, 0);
	}
	/* Local agents: what the bucket allows, with or without jumps. */
	for (int i = BASE; i <= MONO; i++)
		ck_assert_msg(same(c[i].admitted, expected(&c[i])),
		    "%s admitted %llu, expected %.1f", c[i].name,
		    c[i].admitted, expected(&c[i]));
	ck_assert_msg(same(excess(&c[TSC]), excess(&c[BASE])),
	    "jumps tsc admitted %.1f beyond the rate, still tsc %.1f",
	    excess(&c[TSC]), excess(&c[BASE]));
	ck_assert_msg(same(excess(&c[MONO]), excess(&c[BASE])),
	    "jumps monotonic admitted %.1f beyond the rate, still tsc %.1f",
	    excess(&c[MONO]), excess(&c[BASE]));
	/* With allotd: the same as the run without jumps, no fallback, no
	 * second session. */
	ck_assert_msg(same(c[COORD].admitted, c[COORD0].admitted),
	    "with allotd: %llu admitted with jumps, %llu without",
	    c[COORD].admitted, c[COORD0].admitted);
	for (int i = COORD0; i <= COORD; i++) {
		ck_assert_uint_eq(c[i].fallbacks, 0);
		ck_assert_uint_eq(c[i].registers, 1);
	}
	/* The control: an agent on the wall clock agrees without jumps and
	 * is caught by the same comparison with them. */
	ck_assert(same(excess(&c[CTRL0]), excess(&c[BASE])));
	ck_assert_msg(!same(excess(&c[CTRL]), excess(&c[BASE])),
	    "the control admitted %.1f beyond the rate, like the monotonic "
	    "agents (%.1f): the jumps did not reach it",
	    excess(&c[CTRL]), excess(&c[BASE]));

	double worst = 0;
	for (int i = TSC; i <= COORD; i++) {
		int ref = i == COORD ? COORD0 : BASE;
		if (i == COORD0)
			continue;
		double d = fabs(
		    (double) c[i].admitted - (double) c[ref].admitted);
		worst = fmax(worst, d);
	}
	fault_figures f = {
		.id = "5-clock",
		.fault = "wall clock jumps +1 d, -1 d, +2 h, -3 h (agents and "
		         "allotd under libfaketime)",
		.promised = "no decision changes: monotonic time only",
		.requests = 0,
		.failed = 0,
		.over_rt = NAN,
		.recovery_ms = NAN,
	};
	snprintf(f.measured, sizeof f.measured,
	    "admitted in 3 s with jumps / without: TSC clock %llu / %llu, "
	    "CLOCK_MONOTONIC %llu, with allotd %llu / %llu (largest "
	    "difference %.0f tokens, %.1f%%); control agent on "
	    "CLOCK_REALTIME %llu / %llu",
	    c[TSC].admitted, c[BASE].admitted, c[MONO].admitted,
	    c[COORD].admitted, c[COORD0].admitted, worst,
	    100.0 * worst / (double) c[BASE].admitted, c[CTRL].admitted,
	    c[CTRL0].admitted);
	fault_report(&f);

	fault_env_fini(&still);
	fault_env_fini(&jumpy);
}
END_TEST

static Suite *
clock_suite(void)
{
	Suite *s = suite_create("fault-clock");
	TCase *tc = tcase_create("faketime");
	tcase_set_timeout(tc, 80);
	tcase_add_test(tc, wall_clock_jumps);
	suite_add_tcase(s, tc);
	return s;
}

int
main(void)
{
	if (faketime_lib() == NULL) {
		printf("skipped: libfaketime is not installed (apt-get "
		       "install libfaketime; or set ALLOT_FAKETIME)\n");
		return 77;
	}
	SRunner *sr = srunner_create(clock_suite());
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
