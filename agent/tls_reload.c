/* SPDX-License-Identifier: MIT */
/*
 * Certificate rotation's pieces (tls_reload.h). nng makes a TLS
 * configuration read-only once a dialer uses it, and a dialer's
 * configuration cannot change while it runs: a rotation therefore makes
 * a new configuration and a new dialer on the same socket, kept
 * unstarted while the current connection lives (closing the old dialer
 * would close its connection too), and started once that connection is
 * gone, in place of the old dialer, which would otherwise redial with
 * the old certificate.
 */
#include "tls_reload.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "hash.h"

/* Whether `path` can be opened: a file missing or unreadable is I/O,
 * one nng refuses is configuration. */
static int
readable(const char *path, char *err, size_t errlen)
{
	FILE *f = fopen(path, "rb");
	if (f == NULL) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return ALLOT_EIO;
	}
	fclose(f);
	return ALLOT_OK;
}

int
allot__tls_load(const allot_agent_options *o, nng_tls_config **ret, char *err,
    size_t errlen)
{
	if (o->tls_ca_file == NULL) {
		snprintf(err, errlen, "no tls_ca_file");
		return ALLOT_ESTATE;
	}
	int rc = readable(o->tls_ca_file, err, errlen);
	if (rc == ALLOT_OK && o->tls_cert_key_file != NULL)
		rc = readable(o->tls_cert_key_file, err, errlen);
	if (rc != ALLOT_OK)
		return rc;
	int rv = allot__tls_client_config(
	    o->tls_ca_file, o->tls_cert_key_file, o->tls_server_name, ret);
	if (rv == 0)
		return ALLOT_OK;
	snprintf(err, errlen, "%s / %s: %s", o->tls_ca_file,
	    o->tls_cert_key_file != NULL ? o->tls_cert_key_file : "-",
	    nng_strerror(rv));
	return rv == NNG_ENOMEM ? ALLOT_ENOMEM : ALLOT_ECONFIG;
}

void
allot__tlsdial_set_next(allot__tlsdial *td, nng_dialer d)
{
	allot__tlsdial_fini(td);
	td->next = d;
}

bool
allot__tlsdial_swap(allot__tlsdial *td, allot__link *l)
{
	if (nng_dialer_id(td->next) <= 0 || atomic_load(&l->pipes) > 0)
		return false;
	if (nng_dialer_id(td->cur) > 0)
		nng_dialer_close(td->cur);
	td->cur = (nng_dialer) NNG_DIALER_INITIALIZER;
	if (nng_dialer_start(td->next, NNG_FLAG_NONBLOCK) != 0)
		return false; /* kept, and tried again at the next wake-up */
	td->cur = td->next;
	td->next = (nng_dialer) NNG_DIALER_INITIALIZER;
	return true;
}

void
allot__tlsdial_fini(allot__tlsdial *td)
{
	if (nng_dialer_id(td->next) > 0)
		nng_dialer_close(td->next);
	td->next = (nng_dialer) NNG_DIALER_INITIALIZER;
}

enum { IDLE, ASKED, ANSWERED };

void
allot__tlsreq_init(allot__tlsreq *r)
{
	pthread_mutex_init(&r->mu, NULL);
	pthread_cond_init(&r->cv, NULL);
	r->state = IDLE;
	atomic_store(&r->asked, false);
}

void
allot__tlsreq_fini(allot__tlsreq *r)
{
	pthread_cond_destroy(&r->cv);
	pthread_mutex_destroy(&r->mu);
}

int
allot__tlsreq_ask(allot__tlsreq *r, void (*wake)(void *), void *ctx)
{
	pthread_mutex_lock(&r->mu);
	while (r->state != IDLE)
		pthread_cond_wait(&r->cv, &r->mu);
	r->state = ASKED;
	atomic_store(&r->asked, true);
	wake(ctx);
	while (r->state != ANSWERED)
		pthread_cond_wait(&r->cv, &r->mu);
	int rc = r->result;
	r->state = IDLE;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	return rc;
}

bool
allot__tlsreq_pending(allot__tlsreq *r)
{
	return atomic_load(&r->asked);
}

void
allot__tlsreq_answer(allot__tlsreq *r, int result)
{
	pthread_mutex_lock(&r->mu);
	atomic_store(&r->asked, false);
	r->result = result;
	r->state = ANSWERED;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
}

static uint64_t
look(const char *path, uint64_t h)
{
	struct stat st;
	if (path == NULL)
		return h;
	if (stat(path, &st) != 0)
		return allot__mix64(h ^ 0x6d697373696e67u); /* "missing" */
	const uint64_t v[] = { (uint64_t) st.st_dev, (uint64_t) st.st_ino,
		(uint64_t) st.st_size, (uint64_t) st.st_mtim.tv_sec,
		(uint64_t) st.st_mtim.tv_nsec, (uint64_t) st.st_ctim.tv_sec,
		(uint64_t) st.st_ctim.tv_nsec };
	for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
		h = allot__mix64(h ^ v[i]);
	return h;
}

allot__tlsfiles
allot__tls_files_look(const allot_agent_options *o)
{
	allot__tlsfiles f = { look(
	    o->tls_cert_key_file, look(o->tls_ca_file, 0x746c73u)) };
	return f;
}
