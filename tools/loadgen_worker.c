/* SPDX-License-Identifier: MIT */
/*
 * One caller of the load generator, on its own thread: the pacer's
 * arrivals become requests in a fixed set of slots (each a curl easy
 * handle in the caller's multi handle, so TLS connections are kept and
 * reused), rejections (429, 503, or the local throttle) go through
 * liballot's retry helper, and the outcomes are counted under the
 * caller's lock for the main thread to report. At the end in-flight
 * attempts get --drain ms and pending retries are dropped.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>

#include "loadgen.h"
#include "loadgen_engine.h"
#include "prng.h"

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
	s->started_ns = lg_now_ns();
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
			    c, m->easy_handle, m->data.result, lg_now_ns());
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

void *
lg_worker(void *arg)
{
	caller *c = arg;
	int running = 0;
	uint64_t deadline;

	for (;;) {
		uint64_t now = lg_now_ns();
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
		    c->multi, NULL, 0, poll_ms(lg_now_ns(), next), NULL);
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
	deadline = lg_now_ns() + (uint64_t) lg.o.drain_ms * NS_PER_MS;
	while (c->ninflight > 0 && atomic_load(&lg.stop) < 2 &&
	    lg_now_ns() < deadline) {
		curl_multi_perform(c->multi, &running);
		drain_messages(c);
		if (c->ninflight > 0)
			curl_multi_poll(c->multi, NULL, 0,
			    poll_ms(lg_now_ns(), deadline), NULL);
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

/* A slot's easy handle, set up once: every attempt of the slot reuses
 * it with only the URL changed. */
static void
slot_setup(caller *c, slot *s)
{
	const lg_caller_spec *sp = &c->spec;
	CURL *e = curl_easy_init();
	if (e == NULL)
		lg_fatal("out of memory");
	s->easy = e;
	s->state = SLOT_FREE;
	curl_easy_setopt(e, CURLOPT_PRIVATE, s);
	curl_easy_setopt(e, CURLOPT_ERRORBUFFER, s->errbuf);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_SHARE, c->share);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, discard);
	curl_easy_setopt(e, CURLOPT_USERAGENT, PROG "/" ALLOT_VERSION_STRING);
	/* Loopback only: no proxy from the environment, no
	 * redirects, no protocol other than HTTP(S). */
	curl_easy_setopt(e, CURLOPT_PROXY, "");
	curl_easy_setopt(e, CURLOPT_NOPROXY, "*");
	curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
	/* One bound for the whole attempt, connection set-up
	 * included: a loaded machine can take seconds over a TLS
	 * handshake, and that is latency worth seeing. */
	curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long) lg.o.timeout_ms);
	curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long) lg.o.timeout_ms);
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

void
lg_caller_setup(caller *c, size_t idx)
{
	const lg_caller_spec *sp = &c->spec;
	uint64_t seed = lg.o.seed + ALLOT__GOLDEN64 * (idx + 1);
	int rc;

	c->hash = lg_hash_str(sp->name);
	lg_rng_seed(
	    &c->rng, lg.o.seeded ? seed ^ c->hash : lg_now_ns() ^ seed);
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
			lg_fatal("caller %s: allot_retry_create: %s", sp->name,
			    allot_strerror(rc));
	}
	if (sp->throttle) {
		allot_throttle_options o;
		allot_throttle_options_init(&o);
		o.k = sp->throttle_k;
		o.seed = lg.o.seeded ? lg_rng_next(&c->rng) | 1 : 0;
		rc = allot_throttle_create(&o, &c->throttle);
		if (rc != ALLOT_OK)
			lg_fatal("caller %s: allot_throttle_create: %s",
			    sp->name, allot_strerror(rc));
	}

	c->multi = curl_multi_init();
	c->share = curl_share_init();
	if (c->multi == NULL || c->share == NULL)
		lg_fatal("out of memory");
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
			lg_fatal("out of memory");
	}

	/* A logical request holds a slot from its first attempt to its
	 * final answer; at most `concurrency` of them have an attempt in
	 * flight and at most as many again wait to retry. */
	c->nslots = 2 * sp->concurrency;
	c->slots = calloc(c->nslots, sizeof *c->slots);
	if (c->slots == NULL)
		lg_fatal("out of memory");
	for (uint32_t i = 0; i < c->nslots; i++)
		slot_setup(c, &c->slots[i]);
	c->nfree = c->nslots;
}

void
lg_caller_teardown(caller *c)
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
