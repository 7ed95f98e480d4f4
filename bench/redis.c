/* SPDX-License-Identifier: MIT */
/*
 * A private redis-server for the hot-path comparison (redis.h): process
 * start and stop, a free loopback port, one hiredis connection, and the
 * reference Lua token bucket run by EVALSHA. The script text is the one
 * in api-rate-limiting-what-works.txt, unchanged; the caller passes `now`
 * in seconds as that article's clients do.
 */
#include "proc.h"
#include "redis.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

/* Verbatim from ../shared/reference/api-rate-limiting-what-works.txt. */
static const char bucket_lua[] =
    "-- Token bucket in Redis via Lua script\n"
    "local key = KEYS[1]\n"
    "local capacity = tonumber(ARGV[1])\n"
    "local refill_rate = tonumber(ARGV[2])  -- tokens per second\n"
    "local cost = tonumber(ARGV[3])         -- tokens this request costs\n"
    "local now = tonumber(ARGV[4])\n"
    "\n"
    "local bucket = redis.call('hmget', key, 'tokens', 'last_refill')\n"
    "local tokens = tonumber(bucket[1]) or capacity\n"
    "local last_refill = tonumber(bucket[2]) or now\n"
    "\n"
    "-- Refill tokens based on elapsed time\n"
    "local elapsed = now - last_refill\n"
    "local new_tokens = math.min(capacity, tokens + (elapsed * refill_rate))\n"
    "\n"
    "if new_tokens >= cost then\n"
    "    new_tokens = new_tokens - cost\n"
    "    redis.call('hmset', key, 'tokens', new_tokens, 'last_refill', now)\n"
    "    redis.call('expire', key, math.ceil(capacity / refill_rate) * 2)\n"
    "    return {1, new_tokens}  -- allowed, remaining tokens\n"
    "else\n"
    "    redis.call('hmset', key, 'tokens', new_tokens, 'last_refill', now)\n"
    "    redis.call('expire', key, math.ceil(capacity / refill_rate) * 2)\n"
    "    return {0, new_tokens}  -- rejected, remaining tokens\n"
    "end\n";

/* The server still running, stopped at exit if the run fails midway
 * (bench_fail() exits): the benchmark leaves no process or directory. */
static bench_redis *running;

static void
stop_at_exit(void)
{
	if (running != NULL)
		bench_redis_stop(running);
}

static void
kill_server(bench_redis *r)
{
	if (r->pid <= 0)
		return;
	kill(r->pid, SIGTERM);
	for (int i = 0; i < 500; i++) {
		if (waitpid(r->pid, NULL, WNOHANG) == r->pid) {
			r->pid = 0;
			return;
		}
		nanosleep(&(struct timespec) { 0, 10000000 }, NULL);
	}
	kill(r->pid, SIGKILL);
	waitpid(r->pid, NULL, 0);
	r->pid = 0;
}

static void
remove_dir(bench_redis *r)
{
	if (r->dir[0] == '\0')
		return;
	char path[128];
	snprintf(path, sizeof path, "%s/redis.log", r->dir);
	unlink(path);
	rmdir(r->dir);
	r->dir[0] = '\0';
}

/* The last lines of the server's log, to explain a failed start. */
static void
log_tail(bench_redis *r, char *err, size_t errlen)
{
	char path[128], buf[512];
	snprintf(path, sizeof path, "%s/redis.log", r->dir);
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return;
	off_t end = lseek(fd, 0, SEEK_END);
	lseek(fd,
	    end > (off_t) sizeof buf - 1 ? end - (off_t) sizeof buf + 1 : 0,
	    SEEK_SET);
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return;
	buf[n] = '\0';
	size_t used = strlen(err);
	snprintf(err + used, errlen - used, "; log tail: %s", buf);
}

static bool
spawn(bench_redis *r, const char *bin, char *err, size_t errlen)
{
	char port[16], logf[128];
	snprintf(port, sizeof port, "%d", r->port);
	snprintf(logf, sizeof logf, "%s/redis.log", r->dir);
	pid_t parent = getpid();
	pid_t pid = fork();
	if (pid < 0) {
		snprintf(err, errlen, "fork: %s", strerror(errno));
		return false;
	}
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() != parent)
			_exit(1);
		int null = open("/dev/null", O_RDWR);
		if (null >= 0) {
			dup2(null, 0);
			dup2(null, 1);
			dup2(null, 2);
		}
		execlp(bin, bin, "--port", port, "--bind", "127.0.0.1",
		    "--save", "", "--appendonly", "no", "--dir", r->dir,
		    "--logfile", logf, "--daemonize", "no", (char *) NULL);
		_exit(127);
	}
	r->pid = pid;
	return true;
}

/* Connect within 5 s, PING, SCRIPT LOAD. */
static bool
connect_and_load(bench_redis *r, char *err, size_t errlen)
{
	redisContext *c = NULL;
	for (int i = 0; i < 500; i++) {
		int st;
		if (waitpid(r->pid, &st, WNOHANG) == r->pid) {
			r->pid = 0;
			snprintf(err, errlen,
			    "redis-server exited (status "
			    "%d)%s",
			    WIFEXITED(st) ? WEXITSTATUS(st) : -1,
			    WIFEXITED(st) && WEXITSTATUS(st) == 127 ?
			        ": not installed? run scripts/bootstrap" :
			        "");
			return false;
		}
		c = redisConnectWithTimeout(
		    "127.0.0.1", r->port, (struct timeval) { 1, 0 });
		if (c != NULL && c->err == 0)
			break;
		redisFree(c);
		c = NULL;
		nanosleep(&(struct timespec) { 0, 10000000 }, NULL);
	}
	if (c == NULL) {
		snprintf(err, errlen,
		    "could not connect to redis-server on "
		    "127.0.0.1:%d within 5 s",
		    r->port);
		return false;
	}
	r->ctx = c;

	redisReply *rep = redisCommand(c, "PING");
	bool ok = rep != NULL && rep->type == REDIS_REPLY_STATUS &&
	    strcmp(rep->str, "PONG") == 0;
	if (rep != NULL)
		freeReplyObject(rep);
	if (!ok) {
		snprintf(err, errlen, "PING failed: %s",
		    c->err ? c->errstr : "unexpected reply");
		return false;
	}
	rep = redisCommand(c, "SCRIPT LOAD %s", bucket_lua);
	ok = rep != NULL && rep->type == REDIS_REPLY_STRING && rep->len == 40;
	if (ok)
		memcpy(r->sha, rep->str, 41);
	else
		snprintf(err, errlen, "SCRIPT LOAD failed: %s",
		    rep && rep->type == REDIS_REPLY_ERROR ? rep->str :
		        c->err                            ? c->errstr :
		                                            "unexpected reply");
	if (rep != NULL)
		freeReplyObject(rep);
	return ok;
}

bool
bench_redis_start(bench_redis *r, char *err, size_t errlen)
{
	const char *bin = getenv("ALLOT_REDIS_SERVER");
	if (bin == NULL || *bin == '\0')
		bin = "redis-server";
	*r = (bench_redis) { 0 };
	err[0] = '\0';
	/* The free port may be taken between probe and bind: try again. */
	for (int attempt = 0; attempt < 3; attempt++) {
		snprintf(r->dir, sizeof r->dir, "%s",
		    "/tmp/allot-bench-redis.XXXXXX");
		if (mkdtemp(r->dir) == NULL) {
			snprintf(err, errlen, "mkdtemp: %s", strerror(errno));
			r->dir[0] = '\0';
			return false;
		}
		r->port = pc_free_port();
		if (r->port < 0) {
			snprintf(err, errlen, "no free loopback port: %s",
			    strerror(errno));
			remove_dir(r);
			return false;
		}
		if (spawn(r, bin, err, errlen) &&
		    connect_and_load(r, err, errlen)) {
			static bool registered;
			if (!registered && atexit(stop_at_exit) == 0)
				registered = true;
			running = r;
			return true;
		}
		log_tail(r, err, errlen);
		bench_redis_stop(r);
		if (strstr(err, "not installed") != NULL)
			break;
	}
	return false;
}

int
bench_redis_acquire(bench_redis *r, const char *key, const char *burst,
    const char *rate, const char *cost, char *err, size_t errlen)
{
	struct timespec ts;
	char now[32];
	clock_gettime(CLOCK_MONOTONIC, &ts);
	snprintf(now, sizeof now, "%lld.%06ld", (long long) ts.tv_sec,
	    ts.tv_nsec / 1000);

	redisContext *c = r->ctx;
	redisReply *rep = redisCommand(c, "EVALSHA %s 1 %s %s %s %s %s",
	    r->sha, key, burst, rate, cost, now);
	if (rep == NULL) {
		snprintf(err, errlen, "EVALSHA: %s", c->errstr);
		return -1;
	}
	int res = -1;
	if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
	    rep->element[0]->type == REDIS_REPLY_INTEGER)
		res = rep->element[0]->integer == 1;
	else
		snprintf(err, errlen, "EVALSHA: unexpected reply%s%s",
		    rep->type == REDIS_REPLY_ERROR ? ": " : "",
		    rep->type == REDIS_REPLY_ERROR ? rep->str : "");
	freeReplyObject(rep);
	return res;
}

void
bench_redis_stop(bench_redis *r)
{
	if (running == r)
		running = NULL;
	if (r->ctx != NULL) {
		redisFree(r->ctx);
		r->ctx = NULL;
	}
	kill_server(r);
	remove_dir(r);
}
