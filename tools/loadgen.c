/* SPDX-License-Identifier: MIT */
/*
 * allot-loadgen: drives a protected service (examples/) with many callers,
 * each with its own client certificate, open-loop target rate, endpoint mix
 * and stickiness to one replica, and reports per-caller and per-replica
 * outcomes and latency percentiles once a second (JSON lines) and at the
 * end (a table, or JSON). It is built on the caller-side code of liballot
 * (allot/client.h): 429s are retried through allot_retry_next(), which
 * honours Retry-After as a floor, caps attempts and enforces the retry
 * budget; allot_throttle optionally rejects locally when the service is
 * saturated. One thread per caller runs a libcurl multi handle whose
 * connection pool keeps TLS connections alive across requests; the main
 * thread re-reads the targets file, writes statistics, and handles
 * SIGINT/SIGTERM. Only loopback targets are accepted. docs/loadgen.md is
 * the manual.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>

#include <allot/allot.h>
#include <allot/client.h>

#include "loadgen.h"

#define PROG "allot-loadgen"
#define NS_PER_MS UINT64_C(1000000)
#define NS_PER_S UINT64_C(1000000000)
/* The longest a worker sleeps before looking at the stop flag again. */
#define WORKER_TICK_MS 100
#define TARGETS_FILE_MAX (64 * 1024)

/* ------------------------------------------------------------------ */
/* Counters                                                            */
/* ------------------------------------------------------------------ */

/*
 * Outcomes of one caller. `scheduled`, `skipped`, `requests`, `gave_up`
 * and `cancelled` count logical requests (arrivals); the others count
 * attempts (HTTP exchanges, retries included), so a request denied twice
 * and then admitted adds 2 to `denied`, 1 to `ok` and 2 to `retried`.
 */
typedef struct counts {
	uint64_t scheduled; /* arrivals due by the pacer */
	uint64_t skipped; /* arrivals not sent: concurrency bound */
	uint64_t requests; /* arrivals started */
	uint64_t sent; /* attempts sent */
	uint64_t ok; /* 2xx */
	uint64_t denied; /* 429 */
	uint64_t conc_rejected; /* 503 */
	uint64_t other; /* any other status */
	uint64_t errors; /* transport errors, timeouts, no target */
	uint64_t throttled; /* attempts refused locally (throttle) */
	uint64_t retried; /* retries granted by allot_retry_next() */
	uint64_t gave_up; /* rejections whose retry was refused */
	uint64_t cancelled; /* cut short by the end of the run */
	uint64_t connects; /* new connections (TCP + TLS handshakes) */
} counts;

#define COUNT_FIELDS(X)  \
	X(scheduled)     \
	X(skipped)       \
	X(requests)      \
	X(sent)          \
	X(ok)            \
	X(denied)        \
	X(conc_rejected) \
	X(other)         \
	X(errors)        \
	X(throttled)     \
	X(retried)       \
	X(gave_up)       \
	X(cancelled)     \
	X(connects)

/* Attempts of one caller on one target. */
typedef struct tcounts {
	uint64_t sent, ok, denied, conc_rejected, other, errors;
} tcounts;

#define TCOUNT_FIELDS(X) \
	X(sent) X(ok) X(denied) X(conc_rejected) X(other) X(errors)

static void
counts_sub(counts *d, const counts *a, const counts *b)
{
#define SUB_FIELD(f) d->f = a->f - b->f;
	COUNT_FIELDS(SUB_FIELD)
}

static void
counts_add(counts *d, const counts *a)
{
#define ADD_FIELD(f) d->f += a->f;
	COUNT_FIELDS(ADD_FIELD)
}

static void
tcounts_sub(tcounts *d, const tcounts *a, const tcounts *b)
{
	TCOUNT_FIELDS(SUB_FIELD)
}

static void
tcounts_add(tcounts *d, const tcounts *a)
{
	TCOUNT_FIELDS(ADD_FIELD)
}

/* ------------------------------------------------------------------ */
/* State                                                               */
/* ------------------------------------------------------------------ */

enum slot_state { SLOT_FREE, SLOT_INFLIGHT, SLOT_WAIT };

/* One logical request of a caller, from its first attempt to its final
 * answer, retry waits included. A caller has 2 * concurrency slots: at
 * most `concurrency` INFLIGHT and at most `concurrency` in WAIT. */
typedef struct slot {
	CURL *easy;
	enum slot_state state;
	uint32_t attempt; /* 0-based attempt number */
	size_t mix; /* index into spec.mix */
	int target; /* index into lg.targets, for the counters */
	uint64_t started_ns; /* of the current attempt */
	uint64_t retry_at_ns; /* SLOT_WAIT: when to send the next attempt */
	char url[LG_URL_MAX + LG_PATH_MAX + 2];
	char errbuf[CURL_ERROR_SIZE];
} slot;

typedef struct caller {
	lg_caller_spec spec;
	uint64_t hash;
	lg_rng rng;
	pthread_t thread;
	bool started;
	CURLM *multi;
	CURLSH *share;
	struct curl_slist *headers;
	slot *slots;
	uint32_t nslots; /* 2 * concurrency: in flight + waiting */
	uint32_t nfree;
	uint32_t ninflight; /* at most spec.concurrency */
	uint32_t nwait;
	allot_retry *retry;
	allot_throttle *throttle;
	lg_pacer pacer;
	uint64_t end_ns;

	/* Shared with the main thread, under `mu`. */
	pthread_mutex_t mu;
	counts c;
	tcounts t[LG_MAX_TARGETS];
	lg_hist hist_total;
	lg_hist hist_last;
	uint32_t inflight_now;
	uint32_t waiting_now;
	char last_error[LG_URL_MAX + LG_PATH_MAX + CURL_ERROR_SIZE + 8];
	_Atomic bool done;

	/* Main thread only: the previous snapshot, for the deltas. */
	counts prev_c;
	tcounts prev_t[LG_MAX_TARGETS];
} caller;

typedef struct options {
	char ca[LG_FILE_MAX + 1];
	char targets_file[LG_FILE_MAX + 1];
	char stats_file[LG_FILE_MAX + 1];
	double duration_s;
	uint64_t max_requests; /* 0: no bound */
	bool json;
	bool quiet;
	bool verify_host;
	bool seeded;
	uint64_t seed;
	uint32_t timeout_ms;
	uint32_t drain_ms;
} options;

static struct {
	options o;
	caller *callers;
	size_t ncallers;

	/* Targets: append-only (indices are stable), `active` toggles. */
	pthread_mutex_t tmu;
	char turl[LG_MAX_TARGETS][LG_URL_MAX + 1];
	uint64_t thash[LG_MAX_TARGETS];
	bool tactive[LG_MAX_TARGETS];
	bool tstatic[LG_MAX_TARGETS];
	size_t ntargets;
	uint64_t tfile_digest;
	bool tfile_missing_warned;

	_Atomic uint64_t budget_used;
	_Atomic bool exhausted;
	/* 0 running, 1 draining (finish in-flight requests), 2 abort. */
	_Atomic int stop;
	volatile sig_atomic_t signals;

	uint64_t t0_ns;
	FILE *stats;
} lg = { .tmu = PTHREAD_MUTEX_INITIALIZER };

static uint64_t
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * NS_PER_S + (uint64_t) ts.tv_nsec;
}

static double
since_start_s(uint64_t now)
{
	return now > lg.t0_ns ? (double) (now - lg.t0_ns) / 1e9 : 0;
}

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void
note(const char *fmt, ...)
{
	va_list ap;

	if (lg.o.quiet)
		return;
	fprintf(stderr, PROG ": ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static void fatal(const char *fmt, ...)
    __attribute__((format(printf, 1, 2), noreturn));

static void
fatal(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, PROG ": ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(2);
}

/* ------------------------------------------------------------------ */
/* Targets                                                             */
/* ------------------------------------------------------------------ */

/* Add a target (normalised URL) or mark it active; under tmu. Returns
 * its index, or -1 when the table is full. */
static int
target_add_locked(const char *url, bool is_static)
{
	for (size_t i = 0; i < lg.ntargets; i++) {
		if (strcmp(lg.turl[i], url) == 0) {
			lg.tactive[i] = true;
			lg.tstatic[i] = lg.tstatic[i] || is_static;
			return (int) i;
		}
	}
	if (lg.ntargets == LG_MAX_TARGETS)
		return -1;
	strcpy(lg.turl[lg.ntargets], url);
	lg.thash[lg.ntargets] = lg_hash_str(url);
	lg.tactive[lg.ntargets] = true;
	lg.tstatic[lg.ntargets] = is_static;
	return (int) lg.ntargets++;
}

static void
targets_warn(void *ctx, size_t line, const char *msg)
{
	fprintf(stderr, PROG ": %s:%zu: %s (line ignored)\n",
	    (const char *) ctx, line, msg);
}

/* Read the whole targets file into a NUL-terminated buffer. */
static char *
slurp(const char *path, bool *ret_missing)
{
	FILE *f = fopen(path, "r");
	char *buf;
	size_t n;

	*ret_missing = f == NULL;
	if (f == NULL)
		return NULL;
	buf = malloc(TARGETS_FILE_MAX + 1);
	if (buf == NULL) {
		fclose(f);
		return NULL;
	}
	n = fread(buf, 1, TARGETS_FILE_MAX, f);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

/*
 * Re-read the targets file; the active set becomes the --target URLs
 * plus the file's. A missing or unreadable file keeps the current set
 * (write the file elsewhere and rename() it into place to change it
 * atomically). Returns false only at start-up, when the file is needed.
 */
static bool
targets_reload(bool startup)
{
	static char list[LG_MAX_TARGETS][LG_URL_MAX + 1];
	bool was[LG_MAX_TARGETS];
	bool missing, changed;
	char *text;
	size_t n;
	uint64_t digest;

	if (lg.o.targets_file[0] == '\0')
		return true;
	text = slurp(lg.o.targets_file, &missing);
	if (text == NULL) {
		if (startup) {
			fprintf(stderr,
			    PROG ": cannot read --targets-file "
			         "%s: %s\n",
			    lg.o.targets_file, strerror(errno));
			return false;
		}
		if (!lg.tfile_missing_warned)
			note("t=%.1fs: cannot read %s (%s); keeping the "
			     "current targets",
			    since_start_s(now_ns()), lg.o.targets_file,
			    missing ? "missing" : "out of memory");
		lg.tfile_missing_warned = true;
		return true;
	}
	lg.tfile_missing_warned = false;
	digest = lg_hash_str(text);
	changed = startup || digest != lg.tfile_digest;
	lg.tfile_digest = digest;
	if (!changed) {
		free(text);
		return true;
	}
	n = lg_targets_parse(
	    text, list, LG_MAX_TARGETS, targets_warn, lg.o.targets_file);
	free(text);

	pthread_mutex_lock(&lg.tmu);
	memcpy(was, lg.tactive, sizeof was);
	for (size_t i = 0; i < lg.ntargets; i++) {
		bool keep = lg.tstatic[i];
		for (size_t j = 0; j < n && !keep; j++)
			keep = strcmp(lg.turl[i], list[j]) == 0;
		if (lg.tactive[i] && !keep && !startup)
			note("t=%.1fs: target removed: %s",
			    since_start_s(now_ns()), lg.turl[i]);
		lg.tactive[i] = keep;
	}
	for (size_t j = 0; j < n; j++) {
		bool was_active = false;
		for (size_t i = 0; i < lg.ntargets; i++)
			if (strcmp(lg.turl[i], list[j]) == 0)
				was_active = was[i];
		if (was_active)
			continue;
		if (target_add_locked(list[j], false) < 0) {
			fprintf(stderr,
			    PROG ": more than %d distinct targets "
			         "over the run; %s ignored\n",
			    LG_MAX_TARGETS, list[j]);
			continue;
		}
		if (!startup)
			note("t=%.1fs: target added: %s",
			    since_start_s(now_ns()), list[j]);
	}
	pthread_mutex_unlock(&lg.tmu);
	return true;
}

static size_t
targets_active(void)
{
	size_t n = 0;

	pthread_mutex_lock(&lg.tmu);
	for (size_t i = 0; i < lg.ntargets; i++)
		n += lg.tactive[i];
	pthread_mutex_unlock(&lg.tmu);
	return n;
}

/* ------------------------------------------------------------------ */
/* The worker: one thread per caller                                   */
/* ------------------------------------------------------------------ */

static size_t
discard(char *ptr, size_t size, size_t nmemb, void *ud)
{
	(void) ptr;
	(void) ud;
	return size * nmemb;
}

/* Reserve one attempt against --max-requests. */
static bool
reserve_attempt(void)
{
	if (lg.o.max_requests == 0)
		return true;
	if (atomic_load(&lg.exhausted))
		return false;
	if (atomic_fetch_add(&lg.budget_used, 1) >= lg.o.max_requests) {
		atomic_store(&lg.exhausted, true);
		return false;
	}
	return true;
}

static void
slot_free(caller *c, slot *s)
{
	if (s->state == SLOT_INFLIGHT)
		c->ninflight--;
	else if (s->state == SLOT_WAIT)
		c->nwait--;
	if (s->state != SLOT_FREE)
		c->nfree++;
	s->state = SLOT_FREE;
}

static void
publish_gauges(caller *c)
{
	c->inflight_now = c->ninflight;
	c->waiting_now = c->nwait;
}

static void start_attempt(caller *c, slot *s, uint64_t now);

/*
 * The attempt in `s` was rejected (429 or 503 from the service, or locally
 * by the throttle, which counts as a 429 without Retry-After): ask the
 * retry helper whether and when to try again.
 */
static void
after_rejection(
    caller *c, slot *s, uint32_t status, const char *hint, uint64_t now)
{
	uint64_t delay_ms = 0;
	int rc;

	if (!c->spec.retry || atomic_load(&lg.stop) != 0) {
		pthread_mutex_lock(&c->mu);
		slot_free(c, s);
		publish_gauges(c);
		pthread_mutex_unlock(&c->mu);
		return;
	}
	if (s->state != SLOT_WAIT && c->nwait >= c->spec.concurrency) {
		/* As many requests as the caller may have in flight are
		 * already waiting to retry: give up without spending the
		 * retry budget, rather than queue without bound. */
		pthread_mutex_lock(&c->mu);
		c->c.gave_up++;
		slot_free(c, s);
		publish_gauges(c);
		pthread_mutex_unlock(&c->mu);
		return;
	}
	rc = allot_retry_next(c->retry, s->attempt, hint, status, &delay_ms);
	pthread_mutex_lock(&c->mu);
	if (rc == ALLOT_OK) {
		c->c.retried++;
		/* From INFLIGHT (the service rejected) or from a claimed
		 * FREE slot (the throttle rejected a first attempt). */
		if (s->state == SLOT_INFLIGHT)
			c->ninflight--;
		else if (s->state == SLOT_FREE)
			c->nfree--;
		if (s->state != SLOT_WAIT)
			c->nwait++;
		s->state = SLOT_WAIT;
		s->attempt++;
		s->retry_at_ns = now + delay_ms * NS_PER_MS;
	} else {
		c->c.gave_up++;
		slot_free(c, s);
	}
	publish_gauges(c);
	pthread_mutex_unlock(&c->mu);
}

/* Send attempt s->attempt of the request in `s` (state FREE-but-claimed
 * for a first attempt, WAIT for a retry). */
static void
start_attempt(caller *c, slot *s, uint64_t now)
{
	int t;

	if (c->throttle != NULL && !allot_throttle_admit(c->throttle)) {
		pthread_mutex_lock(&c->mu);
		c->c.throttled++;
		pthread_mutex_unlock(&c->mu);
		after_rejection(c, s, 429, NULL, now);
		return;
	}
	if (!reserve_attempt()) {
		pthread_mutex_lock(&c->mu);
		c->c.cancelled++;
		slot_free(c, s);
		publish_gauges(c);
		pthread_mutex_unlock(&c->mu);
		return;
	}
	pthread_mutex_lock(&lg.tmu);
	t = lg_pick_target(&c->rng, c->spec.sticky, c->hash, lg.thash,
	    lg.tactive, lg.ntargets);
	if (t >= 0)
		snprintf(s->url, sizeof s->url, "%s%s", lg.turl[t],
		    c->spec.mix[s->mix].path);
	pthread_mutex_unlock(&lg.tmu);

	pthread_mutex_lock(&c->mu);
	if (t < 0) {
		c->c.errors++;
		snprintf(
		    c->last_error, sizeof c->last_error, "no active target");
		slot_free(c, s);
		publish_gauges(c);
		pthread_mutex_unlock(&c->mu);
		return;
	}
	s->target = t;
	s->started_ns = now_ns();
	s->errbuf[0] = '\0';
	curl_easy_setopt(s->easy, CURLOPT_URL, s->url);
	if (curl_multi_add_handle(c->multi, s->easy) != CURLM_OK) {
		c->c.errors++;
		c->t[t].errors++;
		snprintf(c->last_error, sizeof c->last_error,
		    "curl_multi_add_handle failed");
		slot_free(c, s);
		publish_gauges(c);
		pthread_mutex_unlock(&c->mu);
		return;
	}
	if (s->state == SLOT_WAIT)
		c->nwait--;
	else
		c->nfree--;
	s->state = SLOT_INFLIGHT;
	c->ninflight++;
	c->c.sent++;
	c->t[t].sent++;
	publish_gauges(c);
	pthread_mutex_unlock(&c->mu);
}

/* A new arrival: claim a free slot and send its first attempt. */
static void
start_request(caller *c, uint64_t now)
{
	slot *s = NULL;

	for (uint32_t i = 0; i < c->nslots; i++) {
		if (c->slots[i].state == SLOT_FREE) {
			s = &c->slots[i];
			break;
		}
	}
	if (s == NULL)
		return; /* not reached: the caller checked nfree */
	s->attempt = 0;
	s->mix = lg_mix_pick(&c->spec, lg_rng_double(&c->rng));
	pthread_mutex_lock(&c->mu);
	c->c.requests++;
	pthread_mutex_unlock(&c->mu);
	if (c->retry != NULL)
		allot_retry_record_request(c->retry);
	start_attempt(c, s, now);
}

/* One finished transfer. */
static void
finish_transfer(caller *c, CURL *easy, CURLcode result, uint64_t now)
{
	slot *s;
	char *priv = NULL;
	long status = 0, connects = 0;
	char hint[64];
	bool rejected = false;
	struct curl_header *h = NULL;

	curl_easy_getinfo(easy, CURLINFO_PRIVATE, &priv);
	s = (slot *) (void *) priv;
	hint[0] = '\0';
	curl_easy_getinfo(easy, CURLINFO_NUM_CONNECTS, &connects);
	if (result == CURLE_OK) {
		curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
		if (curl_easy_header(easy, "Retry-After", 0, CURLH_HEADER, -1,
		        &h) == CURLHE_OK &&
		    h != NULL)
			snprintf(hint, sizeof hint, "%s", h->value);
	}
	curl_multi_remove_handle(c->multi, easy);

	pthread_mutex_lock(&c->mu);
	if (connects > 0)
		c->c.connects += (uint64_t) connects;
	if (result != CURLE_OK) {
		c->c.errors++;
		c->t[s->target].errors++;
		snprintf(c->last_error, sizeof c->last_error, "%s: %s", s->url,
		    s->errbuf[0] != '\0' ? s->errbuf :
		                           curl_easy_strerror(result));
	} else {
		uint64_t us = (now - s->started_ns) / 1000;
		lg_hist_add(&c->hist_total, us);
		lg_hist_add(&c->hist_last, us);
		if (status >= 200 && status < 300) {
			c->c.ok++;
			c->t[s->target].ok++;
		} else if (status == 429) {
			c->c.denied++;
			c->t[s->target].denied++;
			rejected = true;
		} else if (status == 503) {
			c->c.conc_rejected++;
			c->t[s->target].conc_rejected++;
			rejected = true;
		} else {
			c->c.other++;
			c->t[s->target].other++;
		}
	}
	if (!rejected) {
		slot_free(c, s);
		publish_gauges(c);
	}
	pthread_mutex_unlock(&c->mu);

	/* Errors count as accepted (allot/client.h): the backend was not
	 * rejecting for quota or overload. */
	allot_throttle_record(c->throttle, !rejected);
	if (rejected)
		after_rejection(c, s, (uint32_t) status,
		    hint[0] != '\0' ? hint : NULL, now);
}

static void
drain_messages(caller *c)
{
	CURLMsg *m;
	int left;

	/* Bounded: each message is a transfer that was in flight. */
	while ((m = curl_multi_info_read(c->multi, &left)) != NULL) {
		if (m->msg == CURLMSG_DONE)
			finish_transfer(
			    c, m->easy_handle, m->data.result, now_ns());
	}
}

static int
poll_ms(uint64_t now, uint64_t until)
{
	uint64_t d;

	if (until <= now)
		return 0;
	d = (until - now + NS_PER_MS - 1) / NS_PER_MS;
	return d > WORKER_TICK_MS ? WORKER_TICK_MS : (int) d;
}

/* How many new requests the caller may start now: an in-flight permit
 * and a free slot are both needed. */
static uint32_t
room(const caller *c)
{
	uint32_t permits = c->spec.concurrency - c->ninflight;

	return permits < c->nfree ? permits : c->nfree;
}

static void *
worker(void *arg)
{
	caller *c = arg;
	int running = 0;
	uint64_t deadline;

	for (;;) {
		uint64_t now = now_ns();
		uint64_t next = now + WORKER_TICK_MS * NS_PER_MS;
		bool arrivals = now < c->end_ns && !atomic_load(&lg.exhausted);

		if (atomic_load(&lg.stop) != 0)
			break;
		/* Retries first: they belong to requests already admitted
		 * to the caller's bounds. A due retry that finds every
		 * in-flight permit taken waits for a completion, which
		 * wakes the poll below. */
		for (uint32_t i = 0; i < c->nslots && c->nwait > 0; i++) {
			slot *s = &c->slots[i];
			if (s->state != SLOT_WAIT)
				continue;
			if (s->retry_at_ns > now) {
				if (s->retry_at_ns < next)
					next = s->retry_at_ns;
			} else if (c->ninflight < c->spec.concurrency) {
				start_attempt(c, s, now);
			}
		}
		if (arrivals) {
			uint64_t due = lg_pacer_take(&c->pacer, now);
			for (; due > 0 && !atomic_load(&lg.exhausted); due--) {
				pthread_mutex_lock(&c->mu);
				if (room(c) == 0) {
					/* Over the bounds: counted, never
					 * queued. */
					c->c.scheduled += due;
					c->c.skipped += due;
					pthread_mutex_unlock(&c->mu);
					break;
				}
				c->c.scheduled++;
				pthread_mutex_unlock(&c->mu);
				start_request(c, now);
			}
			if (lg_pacer_next_due(&c->pacer) < next)
				next = lg_pacer_next_due(&c->pacer);
		}
		curl_multi_perform(c->multi, &running);
		drain_messages(c);
		if (!arrivals && c->ninflight == 0 && c->nwait == 0)
			break; /* end= reached, or --max-requests spent */
		curl_multi_poll(
		    c->multi, NULL, 0, poll_ms(now_ns(), next), NULL);
	}

	/* Wind down: pending retries are dropped, in-flight attempts get
	 * --drain ms to answer (without retries), then are cut. */
	pthread_mutex_lock(&c->mu);
	for (uint32_t i = 0; i < c->nslots; i++) {
		if (c->slots[i].state == SLOT_WAIT) {
			c->c.cancelled++;
			slot_free(c, &c->slots[i]);
		}
	}
	publish_gauges(c);
	pthread_mutex_unlock(&c->mu);
	deadline = now_ns() + (uint64_t) lg.o.drain_ms * NS_PER_MS;
	while (c->ninflight > 0 && atomic_load(&lg.stop) < 2 &&
	    now_ns() < deadline) {
		curl_multi_perform(c->multi, &running);
		drain_messages(c);
		if (c->ninflight > 0)
			curl_multi_poll(c->multi, NULL, 0,
			    poll_ms(now_ns(), deadline), NULL);
	}
	pthread_mutex_lock(&c->mu);
	for (uint32_t i = 0; i < c->nslots; i++) {
		slot *s = &c->slots[i];
		if (s->state == SLOT_INFLIGHT) {
			curl_multi_remove_handle(c->multi, s->easy);
			c->c.cancelled++;
		}
		slot_free(c, s);
	}
	publish_gauges(c);
	pthread_mutex_unlock(&c->mu);
	atomic_store(&c->done, true);
	return NULL;
}

/* ------------------------------------------------------------------ */
/* Set-up and tear-down                                                */
/* ------------------------------------------------------------------ */

static void
check_readable(const char *what, const char *path)
{
	FILE *f = fopen(path, "r");

	if (f == NULL)
		fatal("%s %s: %s", what, path, strerror(errno));
	fclose(f);
}

static void
caller_setup(caller *c, size_t idx)
{
	const lg_caller_spec *sp = &c->spec;
	uint64_t seed = lg.o.seed + UINT64_C(0x9e3779b97f4a7c15) * (idx + 1);
	int rc;

	c->hash = lg_hash_str(sp->name);
	lg_rng_seed(&c->rng, lg.o.seeded ? seed ^ c->hash : now_ns() ^ seed);
	pthread_mutex_init(&c->mu, NULL);
	lg_hist_reset(&c->hist_total);
	lg_hist_reset(&c->hist_last);

	if (sp->retry) {
		allot_retry_policy p;
		allot_retry_policy_init(&p);
		p.max_attempts = sp->attempts;
		p.budget_ratio = sp->budget;
		p.max_delay_ms = sp->max_wait_ms;
		if (p.base_delay_ms > p.max_delay_ms)
			p.base_delay_ms = p.max_delay_ms;
		if (p.hint_jitter_ms > p.max_delay_ms)
			p.hint_jitter_ms = p.max_delay_ms;
		p.seed = lg.o.seeded ? lg_rng_next(&c->rng) | 1 : 0;
		rc = allot_retry_create(&p, &c->retry);
		if (rc != ALLOT_OK)
			fatal("caller %s: allot_retry_create: %s", sp->name,
			    allot_strerror(rc));
	}
	if (sp->throttle) {
		allot_throttle_options o;
		allot_throttle_options_init(&o);
		o.k = sp->throttle_k;
		o.seed = lg.o.seeded ? lg_rng_next(&c->rng) | 1 : 0;
		rc = allot_throttle_create(&o, &c->throttle);
		if (rc != ALLOT_OK)
			fatal("caller %s: allot_throttle_create: %s", sp->name,
			    allot_strerror(rc));
	}

	c->multi = curl_multi_init();
	c->share = curl_share_init();
	if (c->multi == NULL || c->share == NULL)
		fatal("out of memory");
	/* TLS sessions resumed across this caller's connections (one
	 * thread uses the share, so it needs no lock callbacks). */
	curl_share_setopt(
	    c->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
	curl_share_setopt(c->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
	/* Room for one idle connection per slot and target. */
	curl_multi_setopt(c->multi, CURLMOPT_MAXCONNECTS,
	    (long) (sp->concurrency * 8 < 1024 ? sp->concurrency * 8 : 1024));
	if (sp->header[0] != '\0') {
		c->headers = curl_slist_append(NULL, sp->header);
		if (c->headers == NULL)
			fatal("out of memory");
	}

	/* A logical request holds a slot from its first attempt to its
	 * final answer; at most `concurrency` of them have an attempt in
	 * flight and at most as many again wait to retry. */
	c->nslots = 2 * sp->concurrency;
	c->slots = calloc(c->nslots, sizeof *c->slots);
	if (c->slots == NULL)
		fatal("out of memory");
	for (uint32_t i = 0; i < c->nslots; i++) {
		slot *s = &c->slots[i];
		CURL *e = curl_easy_init();
		if (e == NULL)
			fatal("out of memory");
		s->easy = e;
		s->state = SLOT_FREE;
		curl_easy_setopt(e, CURLOPT_PRIVATE, s);
		curl_easy_setopt(e, CURLOPT_ERRORBUFFER, s->errbuf);
		curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
		curl_easy_setopt(e, CURLOPT_SHARE, c->share);
		curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, discard);
		curl_easy_setopt(
		    e, CURLOPT_USERAGENT, PROG "/" ALLOT_VERSION_STRING);
		/* Loopback only: no proxy from the environment, no
		 * redirects, no protocol other than HTTP(S). */
		curl_easy_setopt(e, CURLOPT_PROXY, "");
		curl_easy_setopt(e, CURLOPT_NOPROXY, "*");
		curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
		curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
		/* One bound for the whole attempt, connection set-up
		 * included: a loaded machine can take seconds over a TLS
		 * handshake, and that is latency worth seeing. */
		curl_easy_setopt(
		    e, CURLOPT_TIMEOUT_MS, (long) lg.o.timeout_ms);
		curl_easy_setopt(
		    e, CURLOPT_CONNECTTIMEOUT_MS, (long) lg.o.timeout_ms);
		curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
		if (lg.o.ca[0] != '\0') {
			/* Only this CA: libcurl would otherwise also load
			 * the system's CA directory for every new
			 * connection, tens of ms of CPU per handshake. */
			curl_easy_setopt(e, CURLOPT_CAINFO, lg.o.ca);
			curl_easy_setopt(e, CURLOPT_CAPATH, NULL);
		}
		curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L);
		curl_easy_setopt(
		    e, CURLOPT_SSL_VERIFYHOST, lg.o.verify_host ? 2L : 0L);
		if (sp->cert[0] != '\0') {
			curl_easy_setopt(e, CURLOPT_SSLCERT, sp->cert);
			curl_easy_setopt(e, CURLOPT_SSLKEY, sp->key);
		}
		if (c->headers != NULL)
			curl_easy_setopt(e, CURLOPT_HTTPHEADER, c->headers);
	}
	c->nfree = c->nslots;
}

static void
caller_teardown(caller *c)
{
	for (uint32_t i = 0; c->slots != NULL && i < c->nslots; i++)
		curl_easy_cleanup(c->slots[i].easy);
	free(c->slots);
	curl_multi_cleanup(c->multi);
	curl_share_cleanup(c->share);
	curl_slist_free_all(c->headers);
	allot_retry_destroy(c->retry);
	allot_throttle_destroy(c->throttle);
	pthread_mutex_destroy(&c->mu);
}

/* ------------------------------------------------------------------ */
/* Reporting                                                           */
/* ------------------------------------------------------------------ */

/* What the main thread copies out of a caller at each report. */
typedef struct snap {
	counts total, last;
	tcounts ttotal[LG_MAX_TARGETS], tlast[LG_MAX_TARGETS];
	lg_hist hlast, htotal;
	uint32_t inflight, waiting;
	char last_error[LG_URL_MAX + LG_PATH_MAX + CURL_ERROR_SIZE + 8];
} snap;

static void
take_snapshot(caller *c, snap *s)
{
	pthread_mutex_lock(&c->mu);
	s->total = c->c;
	memcpy(s->ttotal, c->t, sizeof s->ttotal);
	s->hlast = c->hist_last;
	s->htotal = c->hist_total;
	lg_hist_reset(&c->hist_last);
	s->inflight = c->inflight_now;
	s->waiting = c->waiting_now;
	memcpy(s->last_error, c->last_error, sizeof s->last_error);
	pthread_mutex_unlock(&c->mu);
	counts_sub(&s->last, &s->total, &c->prev_c);
	c->prev_c = s->total;
	for (size_t i = 0; i < LG_MAX_TARGETS; i++) {
		tcounts_sub(&s->tlast[i], &s->ttotal[i], &c->prev_t[i]);
		c->prev_t[i] = s->ttotal[i];
	}
}

static void
json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s != '\0'; s++) {
		unsigned char ch = (unsigned char) *s;
		if (ch == '"' || ch == '\\')
			fprintf(f, "\\%c", ch);
		else if (ch < 0x20)
			fprintf(f, "\\u%04x", ch);
		else
			fputc(ch, f);
	}
	fputc('"', f);
}

static void
json_latency(FILE *f, const lg_hist *h, bool extra)
{
	fprintf(f, "\"latency_ms\":{\"p50\":%.3f,\"p90\":%.3f,\"p99\":%.3f",
	    (double) lg_hist_percentile(h, 50) / 1000.0,
	    (double) lg_hist_percentile(h, 90) / 1000.0,
	    (double) lg_hist_percentile(h, 99) / 1000.0);
	if (extra)
		fprintf(f, ",\"max\":%.3f,\"mean\":%.3f",
		    (double) h->max_us / 1000.0,
		    h->count > 0 ?
		        (double) h->sum_us / (double) h->count / 1000.0 :
		        0.0);
	fputc('}', f);
}

static void
json_counts(FILE *f, const counts *c, const lg_hist *h, bool extra)
{
	bool first = true;

	fputc('{', f);
#define JSON_FIELD(x)                                                \
	fprintf(f, "%s\"" #x "\":%" PRIu64, first ? "" : ",", c->x); \
	first = false;
	COUNT_FIELDS(JSON_FIELD)
	fputc(',', f);
	json_latency(f, h, extra);
	fputc('}', f);
}

static void
json_tcounts(FILE *f, const tcounts *c)
{
	bool first = true;

	fputc('{', f);
	TCOUNT_FIELDS(JSON_FIELD)
	fputc('}', f);
}

/*
 * One report: the shape of a --stats-file line (and, with final set, of
 * the --json summary). `dt` is the length of the interval "last" covers.
 */
static void
json_report(FILE *f, snap *snaps, double t, double dt, bool final,
    const char *stopped_by)
{
	struct timespec wall;
	tcounts tl[LG_MAX_TARGETS], tt[LG_MAX_TARGETS];
	size_t nt;
	uint64_t sent = 0;

	clock_gettime(CLOCK_REALTIME, &wall);
	memset(tl, 0, sizeof tl);
	memset(tt, 0, sizeof tt);
	fprintf(f, "{\"t\":%.3f,\"dt\":%.3f,\"unix\":%.3f,\"final\":%s", t, dt,
	    (double) wall.tv_sec + (double) wall.tv_nsec / 1e9,
	    final ? "true" : "false");
	if (final)
		fprintf(f, ",\"stopped_by\":\"%s\"", stopped_by);
	for (size_t i = 0; i < lg.ncallers; i++)
		sent += snaps[i].total.sent;
	fprintf(f, ",\"attempts_sent\":%" PRIu64 ",\"max_requests\":%" PRIu64,
	    sent, lg.o.max_requests);
	fputs(",\"callers\":[", f);
	pthread_mutex_lock(&lg.tmu);
	nt = lg.ntargets;
	for (size_t i = 0; i < lg.ncallers; i++) {
		const caller *c = &lg.callers[i];
		snap *s = &snaps[i];
		bool first = true;

		fprintf(f, "%s{\"name\":", i ? "," : "");
		json_str(f, c->spec.name);
		fprintf(f,
		    ",\"rate\":%g,\"concurrency\":%u,\"cert\":%s,"
		    "\"inflight\":%u,\"waiting\":%u,\"last\":",
		    c->spec.rate, c->spec.concurrency,
		    c->spec.cert[0] != '\0' ? "true" : "false", s->inflight,
		    s->waiting);
		json_counts(f, &s->last, &s->hlast, false);
		fputs(",\"total\":", f);
		json_counts(f, &s->total, &s->htotal, true);
		fputs(",\"targets\":{", f);
		for (size_t j = 0; j < nt; j++) {
			tcounts_add(&tl[j], &s->tlast[j]);
			tcounts_add(&tt[j], &s->ttotal[j]);
			if (s->ttotal[j].sent == 0)
				continue;
			fprintf(f, "%s", first ? "" : ",");
			first = false;
			json_str(f, lg.turl[j]);
			fputs(":{\"last\":", f);
			json_tcounts(f, &s->tlast[j]);
			fputs(",\"total\":", f);
			json_tcounts(f, &s->ttotal[j]);
			fputc('}', f);
		}
		fputc('}', f);
		if (final) {
			fputs(",\"last_error\":", f);
			json_str(f, s->last_error);
		}
		fputc('}', f);
	}
	fputs("],\"targets\":[", f);
	for (size_t j = 0; j < nt; j++) {
		fprintf(f, "%s{\"url\":", j ? "," : "");
		json_str(f, lg.turl[j]);
		fprintf(f, ",\"active\":%s,\"last\":",
		    lg.tactive[j] ? "true" : "false");
		json_tcounts(f, &tl[j]);
		fputs(",\"total\":", f);
		json_tcounts(f, &tt[j]);
		fputc('}', f);
	}
	pthread_mutex_unlock(&lg.tmu);
	fputs("]}", f);
}

/* Write one JSON line to the stats file in a single write(), so that a
 * reader tailing it never sees half a line. */
static void
stats_line(
    snap *snaps, double t, double dt, bool final, const char *stopped_by)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *m;

	if (lg.stats == NULL)
		return;
	m = open_memstream(&buf, &len);
	if (m == NULL)
		return;
	json_report(m, snaps, t, dt, final, stopped_by);
	fputc('\n', m);
	fclose(m);
	if (fwrite(buf, 1, len, lg.stats) != len || fflush(lg.stats) != 0)
		note("writing %s: %s", lg.o.stats_file, strerror(errno));
	free(buf);
}

static void
print_table(snap *snaps, double elapsed, const char *stopped_by)
{
	tcounts tt[LG_MAX_TARGETS];
	counts sum;
	lg_hist hsum;

	memset(tt, 0, sizeof tt);
	memset(&sum, 0, sizeof sum);
	lg_hist_reset(&hsum);
	printf("%s: %.1f s, stopped by %s\n\n", PROG, elapsed, stopped_by);
	printf("%-16s %8s %8s %8s %8s %6s %6s %6s %7s %7s %7s %7s %6s %8s "
	       "%8s %8s\n",
	    "caller", "rate/s", "sent", "ok", "denied", "503", "other",
	    "errors", "retried", "gaveup", "skipped", "thrott", "conns",
	    "p50ms", "p90ms", "p99ms");
	for (size_t i = 0; i < lg.ncallers; i++) {
		const caller *c = &lg.callers[i];
		const snap *s = &snaps[i];
		printf("%-16.16s %8.1f %8" PRIu64 " %8" PRIu64 " %8" PRIu64
		       " %6" PRIu64 " %6" PRIu64 " %6" PRIu64 " %7" PRIu64
		       " %7" PRIu64 " %7" PRIu64 " %7" PRIu64 " %6" PRIu64
		       " %8.2f %8.2f %8.2f\n",
		    c->spec.name, c->spec.rate, s->total.sent, s->total.ok,
		    s->total.denied, s->total.conc_rejected, s->total.other,
		    s->total.errors, s->total.retried, s->total.gave_up,
		    s->total.skipped, s->total.throttled, s->total.connects,
		    (double) lg_hist_percentile(&s->htotal, 50) / 1000.0,
		    (double) lg_hist_percentile(&s->htotal, 90) / 1000.0,
		    (double) lg_hist_percentile(&s->htotal, 99) / 1000.0);
		counts_add(&sum, &s->total);
		lg_hist_merge(&hsum, &s->htotal);
		for (size_t j = 0; j < LG_MAX_TARGETS; j++)
			tcounts_add(&tt[j], &s->ttotal[j]);
	}
	printf("%-16s %8s %8" PRIu64 " %8" PRIu64 " %8" PRIu64 " %6" PRIu64
	       " %6" PRIu64 " %6" PRIu64 " %7" PRIu64 " %7" PRIu64 " %7" PRIu64
	       " %7" PRIu64 " %6" PRIu64 " %8.2f %8.2f %8.2f\n",
	    "(all)", "", sum.sent, sum.ok, sum.denied, sum.conc_rejected,
	    sum.other, sum.errors, sum.retried, sum.gave_up, sum.skipped,
	    sum.throttled, sum.connects,
	    (double) lg_hist_percentile(&hsum, 50) / 1000.0,
	    (double) lg_hist_percentile(&hsum, 90) / 1000.0,
	    (double) lg_hist_percentile(&hsum, 99) / 1000.0);

	printf("\n%-32s %6s %8s %8s %8s %6s %6s %6s\n", "target", "active",
	    "sent", "ok", "denied", "503", "other", "errors");
	pthread_mutex_lock(&lg.tmu);
	for (size_t j = 0; j < lg.ntargets; j++)
		printf("%-32.32s %6s %8" PRIu64 " %8" PRIu64 " %8" PRIu64
		       " %6" PRIu64 " %6" PRIu64 " %6" PRIu64 "\n",
		    lg.turl[j], lg.tactive[j] ? "yes" : "no", tt[j].sent,
		    tt[j].ok, tt[j].denied, tt[j].conc_rejected, tt[j].other,
		    tt[j].errors);
	pthread_mutex_unlock(&lg.tmu);

	for (size_t i = 0; i < lg.ncallers; i++)
		if (snaps[i].last_error[0] != '\0')
			printf("\n%s: last error: %s", lg.callers[i].spec.name,
			    snaps[i].last_error);
	printf("\n");
}

/* ------------------------------------------------------------------ */
/* Command line                                                        */
/* ------------------------------------------------------------------ */

static void
usage(FILE *f)
{
	fputs(
	    "Usage: " PROG " --target URL... --caller SPEC... [options]\n"
	    "\n"
	    "Drive the allot example service with many callers, each with\n"
	    "its own client certificate, open-loop rate, endpoint mix and\n"
	    "stickiness to one replica; report outcomes and latency.\n"
	    "Retries follow liballot's retry helper (Retry-After, backoff,\n"
	    "attempt cap, retry budget). Only loopback targets are allowed.\n"
	    "\n"
	    "Targets:\n"
	    "  -t, --target URL         a replica, e.g. "
	    "https://127.0.0.1:9001\n"
	    "                           (repeatable)\n"
	    "      --targets-file FILE  one URL per line, '#' comments; "
	    "re-read\n"
	    "                           every second (replace it with "
	    "rename)\n"
	    "      --ca FILE            CA certificate(s) to verify the "
	    "service\n"
	    "      --no-verify-hostname verify the chain but not the name\n"
	    "\n"
	    "Callers:\n"
	    "  -c, --caller SPEC        key=value,... (repeatable), keys:\n"
	    "        name=NAME          required, [A-Za-z0-9._-]\n"
	    "        rate=R             required, requests/s (open loop)\n"
	    "        cert=FILE,key=FILE client certificate (none: no cert)\n"
	    "        mix=P:W;P:W        endpoint mix (default /lookup:1)\n"
	    "        sticky=P           probability of the home replica (0)\n"
	    "        concurrency=N      attempts in flight (and requests\n"
	    "                           waiting to retry); arrivals over\n"
	    "                           it are skipped, not queued (16)\n"
	    "        retry=on|off       retry 429 and 503+Retry-After (on)\n"
	    "        attempts=N         attempts per request, first one\n"
	    "                           included (4)\n"
	    "        budget=F           retries <= F of requests (0.1)\n"
	    "        max_wait=MS        longest retry wait accepted (10000)\n"
	    "        throttle=on|off    client-side adaptive throttling "
	    "(off)\n"
	    "        throttle_k=K       its multiplier (2)\n"
	    "        header=NAME:VALUE  extra request header\n"
	    "        start=S,end=S      active between these offsets\n"
	    "\n"
	    "Run:\n"
	    "  -d, --duration S         how long (default 10)\n"
	    "  -n, --max-requests N     bound on attempts sent, all callers\n"
	    "      --timeout MS         per attempt (default 5000)\n"
	    "      --drain MS           grace for in-flight at the end "
	    "(2000)\n"
	    "      --seed N             reproducible draws\n"
	    "\n"
	    "Output:\n"
	    "  -s, --stats-file FILE    append one JSON line per second\n"
	    "      --json               final summary as JSON on stdout\n"
	    "  -q, --quiet              no progress notes on stderr\n"
	    "  -h, --help, -V, --version\n"
	    "\n"
	    "SIGINT or SIGTERM ends the run early, with the summary; a "
	    "second\n"
	    "one abandons in-flight requests. See docs/loadgen.md.\n",
	    f);
}

static double
arg_double(const char *opt, const char *v, double lo, double hi)
{
	char *end;
	double d;

	errno = 0;
	d = strtod(v, &end);
	if (errno != 0 || end == v || *end != '\0' || !isfinite(d) || d < lo ||
	    d > hi)
		fatal(
		    "%s: want a number in [%g, %g], got '%s'", opt, lo, hi, v);
	return d;
}

static uint64_t
arg_u64(const char *opt, const char *v, uint64_t lo, uint64_t hi)
{
	char *end;
	unsigned long long u;

	errno = 0;
	u = strtoull(v, &end, 10);
	if (errno != 0 || end == v || *end != '\0' || v[0] == '-' || u < lo ||
	    u > hi)
		fatal("%s: want an integer in [%" PRIu64 ", %" PRIu64
		      "], got '%s'",
		    opt, lo, hi, v);
	return u;
}

static void
arg_path(char *dst, const char *opt, const char *v)
{
	if (strlen(v) > LG_FILE_MAX || v[0] == '\0')
		fatal("%s: empty or too long", opt);
	strcpy(dst, v);
}

static void
parse_args(int argc, char **argv)
{
	enum {
		OPT_TFILE = 256,
		OPT_CA,
		OPT_JSON,
		OPT_SEED,
		OPT_TIMEOUT,
		OPT_DRAIN,
		OPT_NOVH
	};
	static const struct option longopts[] = {
		{ "target", required_argument, NULL, 't' },
		{ "targets-file", required_argument, NULL, OPT_TFILE },
		{ "ca", required_argument, NULL, OPT_CA },
		{ "no-verify-hostname", no_argument, NULL, OPT_NOVH },
		{ "caller", required_argument, NULL, 'c' },
		{ "duration", required_argument, NULL, 'd' },
		{ "max-requests", required_argument, NULL, 'n' },
		{ "timeout", required_argument, NULL, OPT_TIMEOUT },
		{ "drain", required_argument, NULL, OPT_DRAIN },
		{ "seed", required_argument, NULL, OPT_SEED },
		{ "stats-file", required_argument, NULL, 's' },
		{ "json", no_argument, NULL, OPT_JSON },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 },
	};
	static lg_caller_spec specs[LG_MAX_CALLERS];
	size_t nspecs = 0;
	int ch;

	lg.o.duration_s = 10;
	lg.o.verify_host = true;
	lg.o.timeout_ms = 5000;
	lg.o.drain_ms = 2000;
	while ((ch = getopt_long(
	            argc, argv, "t:c:d:n:s:qhV", longopts, NULL)) != -1) {
		char norm[LG_URL_MAX + 1];
		char err[512];

		switch (ch) {
		case 't':
			if (lg_target_check(optarg, norm, sizeof norm, err,
			        sizeof err) != 0)
				fatal("--target: %s", err);
			if (target_add_locked(norm, true) < 0)
				fatal("--target: more than %d targets",
				    LG_MAX_TARGETS);
			break;
		case OPT_TFILE:
			arg_path(lg.o.targets_file, "--targets-file", optarg);
			break;
		case OPT_CA: arg_path(lg.o.ca, "--ca", optarg); break;
		case OPT_NOVH: lg.o.verify_host = false; break;
		case 'c':
			if (nspecs == LG_MAX_CALLERS)
				fatal("--caller: at most %d callers",
				    LG_MAX_CALLERS);
			if (lg_caller_spec_parse(
			        optarg, &specs[nspecs], err, sizeof err) != 0)
				fatal("--caller '%s': %s", optarg, err);
			for (size_t i = 0; i < nspecs; i++)
				if (strcmp(specs[i].name,
				        specs[nspecs].name) == 0)
					fatal("--caller: name '%s' used twice",
					    specs[i].name);
			nspecs++;
			break;
		case 'd':
			lg.o.duration_s = arg_double(
			    "--duration", optarg, 0.001, 86400);
			break;
		case 'n':
			lg.o.max_requests = arg_u64(
			    "--max-requests", optarg, 1, UINT64_C(1) << 48);
			break;
		case OPT_TIMEOUT:
			lg.o.timeout_ms = (uint32_t) arg_u64(
			    "--timeout", optarg, 1, 600000);
			break;
		case OPT_DRAIN:
			lg.o.drain_ms = (uint32_t) arg_u64(
			    "--drain", optarg, 0, 600000);
			break;
		case OPT_SEED:
			lg.o.seed = arg_u64("--seed", optarg, 0, UINT64_MAX);
			lg.o.seeded = true;
			break;
		case 's':
			arg_path(lg.o.stats_file, "--stats-file", optarg);
			break;
		case OPT_JSON: lg.o.json = true; break;
		case 'q': lg.o.quiet = true; break;
		case 'h': usage(stdout); exit(0);
		case 'V':
			printf("%s %s (libcurl %s)\n", PROG,
			    ALLOT_VERSION_STRING,
			    curl_version_info(CURLVERSION_NOW)->version);
			exit(0);
		default: usage(stderr); exit(1);
		}
	}
	if (optind < argc)
		fatal("unexpected argument '%s' (see --help)", argv[optind]);
	if (nspecs == 0)
		fatal("no --caller given (see --help)");
	if (lg.ntargets == 0 && lg.o.targets_file[0] == '\0')
		fatal("no --target or --targets-file given (see --help)");
	if (lg.o.ca[0] != '\0')
		check_readable("--ca", lg.o.ca);
	for (size_t i = 0; i < nspecs; i++) {
		if (specs[i].cert[0] != '\0') {
			check_readable("cert", specs[i].cert);
			check_readable("key", specs[i].key);
		}
	}
	lg.callers = calloc(nspecs, sizeof *lg.callers);
	if (lg.callers == NULL)
		fatal("out of memory");
	for (size_t i = 0; i < nspecs; i++)
		lg.callers[i].spec = specs[i];
	lg.ncallers = nspecs;
}

/* ------------------------------------------------------------------ */
/* Main                                                                */
/* ------------------------------------------------------------------ */

static void
on_signal(int sig)
{
	(void) sig;
	lg.signals = lg.signals + 1;
	if (lg.signals > 1)
		atomic_store(&lg.stop, 2);
}

static bool
all_done(void)
{
	for (size_t i = 0; i < lg.ncallers; i++)
		if (!atomic_load(&lg.callers[i].done))
			return false;
	return true;
}

static void
sleep_until(uint64_t until)
{
	uint64_t now = now_ns();
	struct timespec ts;
	uint64_t d;

	if (until <= now)
		return;
	d = until - now;
	if (d > WORKER_TICK_MS * NS_PER_MS)
		d = WORKER_TICK_MS * NS_PER_MS;
	ts.tv_sec = (time_t) (d / NS_PER_S);
	ts.tv_nsec = (long) (d % NS_PER_S);
	nanosleep(&ts, NULL); /* EINTR on a signal: that is the point */
}

int
main(int argc, char **argv)
{
	struct sigaction sa;
	sigset_t all, old;
	snap *snaps;
	uint64_t end, next_tick, last_tick, now;
	const char *stopped_by = NULL;
	double elapsed;
	int rc;

	if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
		fatal("curl_global_init failed");
	parse_args(argc, argv);
	if (!targets_reload(true))
		exit(2);
	if (targets_active() == 0)
		note("no active target yet: requests fail until %s lists one",
		    lg.o.targets_file);
	if (lg.o.stats_file[0] != '\0') {
		lg.stats = fopen(lg.o.stats_file, "a");
		if (lg.stats == NULL)
			fatal("--stats-file %s: %s", lg.o.stats_file,
			    strerror(errno));
	}
	snaps = calloc(lg.ncallers, sizeof *snaps);
	if (snaps == NULL)
		fatal("out of memory");

	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	lg.t0_ns = now_ns() + 10 * NS_PER_MS;
	end = lg.t0_ns + (uint64_t) (lg.o.duration_s * 1e9);
	for (size_t i = 0; i < lg.ncallers; i++) {
		caller *c = &lg.callers[i];
		caller_setup(c, i);
		lg_pacer_init(&c->pacer,
		    lg.t0_ns + (uint64_t) (c->spec.start_s * 1e9),
		    c->spec.rate);
		c->end_ns = c->spec.end_s > 0 ?
		    lg.t0_ns + (uint64_t) (c->spec.end_s * 1e9) :
		    end;
		if (c->end_ns > end)
			c->end_ns = end;
	}

	/* Workers run with every signal blocked: the main thread takes
	 * SIGINT and SIGTERM. */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	for (size_t i = 0; i < lg.ncallers; i++) {
		rc = pthread_create(
		    &lg.callers[i].thread, NULL, worker, &lg.callers[i]);
		if (rc != 0) {
			fprintf(stderr, PROG ": pthread_create: %s\n",
			    strerror(rc));
			atomic_store(&lg.stop, 2);
			stopped_by = "error";
			break;
		}
		lg.callers[i].started = true;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);

	last_tick = lg.t0_ns;
	next_tick = lg.t0_ns + NS_PER_S;
	while (stopped_by == NULL) {
		sleep_until(next_tick < end ? next_tick : end);
		now = now_ns();
		if (lg.signals > 0)
			stopped_by = "signal";
		else if (atomic_load(&lg.exhausted))
			stopped_by = "max_requests";
		else if (now >= end)
			stopped_by = "duration";
		else if (all_done())
			stopped_by = "callers_done";
		if (stopped_by == NULL && now >= next_tick) {
			targets_reload(false);
			for (size_t i = 0; i < lg.ncallers; i++)
				take_snapshot(&lg.callers[i], &snaps[i]);
			stats_line(snaps, since_start_s(now),
			    (double) (now - last_tick) / 1e9, false, NULL);
			last_tick = now;
			/* Ticks stay on whole seconds from the start,
			 * skipping any that a stall made us miss. */
			while (next_tick <= now)
				next_tick += NS_PER_S;
		}
	}

	if (atomic_load(&lg.stop) == 0)
		atomic_store(&lg.stop, 1);
	for (size_t i = 0; i < lg.ncallers; i++)
		curl_multi_wakeup(lg.callers[i].multi);
	for (size_t i = 0; i < lg.ncallers; i++)
		if (lg.callers[i].started)
			pthread_join(lg.callers[i].thread, NULL);

	now = now_ns();
	elapsed = since_start_s(now);
	for (size_t i = 0; i < lg.ncallers; i++)
		take_snapshot(&lg.callers[i], &snaps[i]);
	stats_line(snaps, elapsed, (double) (now - last_tick) / 1e9, true,
	    stopped_by);
	if (lg.o.json) {
		json_report(stdout, snaps, elapsed,
		    (double) (now - last_tick) / 1e9, true, stopped_by);
		fputc('\n', stdout);
	} else {
		print_table(snaps, elapsed, stopped_by);
	}
	fflush(stdout);

	for (size_t i = 0; i < lg.ncallers; i++)
		caller_teardown(&lg.callers[i]);
	free(lg.callers);
	free(snaps);
	if (lg.stats != NULL)
		fclose(lg.stats);
	curl_global_cleanup();
	return strcmp(stopped_by, "error") == 0 ? 2 : 0;
}
