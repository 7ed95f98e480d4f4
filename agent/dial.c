/* SPDX-License-Identifier: MIT */
/* Dialling a coordinator, plain or over mutual TLS (dial.h). */
#include "dial.h"

#include <string.h>

#include <nng/supplemental/tls/tls.h>

int
allot__tls_client_config(const char *ca_file, const char *cert_key_file,
    const char *server_name, nng_tls_config **ret)
{
	nng_tls_config *cfg;
	int rv;
	if ((rv = nng_tls_config_alloc(&cfg, NNG_TLS_MODE_CLIENT)) != 0)
		return rv;
	if ((rv = nng_tls_config_ca_file(cfg, ca_file)) != 0 ||
	    (cert_key_file != NULL &&
	        (rv = nng_tls_config_cert_key_file(
	             cfg, cert_key_file, NULL)) != 0) ||
	    (server_name != NULL &&
	        (rv = nng_tls_config_server_name(cfg, server_name)) != 0) ||
	    (rv = nng_tls_config_auth_mode(cfg, NNG_TLS_AUTH_MODE_REQUIRED)) !=
	        0) {
		nng_tls_config_free(cfg);
		return rv;
	}
	*ret = cfg;
	return 0;
}

int
allot__dialer_new(nng_socket sock, const char *url, nng_tls_config *cfg,
    bool start, nng_dialer *ret)
{
	nng_dialer d;
	int rv;
	if ((rv = nng_dialer_create(&d, sock, url)) != 0)
		return rv;
	if ((cfg != NULL &&
	        (rv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, cfg)) != 0) ||
	    (start && (rv = nng_dialer_start(d, NNG_FLAG_NONBLOCK)) != 0)) {
		nng_dialer_close(d);
		return rv;
	}
	*ret = d;
	return 0;
}

int
allot__dial_keep(nng_socket sock, const char *url, const char *ca_file,
    const char *cert_key_file, const char *server_name, nng_dialer *ret)
{
	nng_dialer d;
	if (ret == NULL)
		ret = &d;
	if (strncmp(url, "tls+tcp", 7) != 0)
		return nng_dial(sock, url, ret, NNG_FLAG_NONBLOCK);
	if (ca_file == NULL)
		return NNG_EINVAL;
	nng_tls_config *cfg;
	int rv = allot__tls_client_config(
	    ca_file, cert_key_file, server_name, &cfg);
	if (rv != 0)
		return rv;
	rv = allot__dialer_new(sock, url, cfg, true, ret);
	nng_tls_config_free(cfg); /* the dialer holds its own reference */
	return rv;
}

int
allot__dial(nng_socket sock, const char *url, const char *ca_file,
    const char *cert_key_file, const char *server_name)
{
	return allot__dial_keep(
	    sock, url, ca_file, cert_key_file, server_name, NULL);
}

static void
link_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	(void) p;
	allot__link *l = arg;
	if (ev == NNG_PIPE_EV_ADD_POST) {
		atomic_fetch_add(&l->pipes, 1);
		atomic_store(&l->was_connected, true);
	} else if (ev == NNG_PIPE_EV_REM_POST) {
		atomic_fetch_sub(&l->pipes, 1);
	}
	if (l->on_change != NULL)
		l->on_change(l->on_change_ctx);
}

int
allot__link_watch(nng_socket sock, allot__link *l)
{
	int rv = nng_pipe_notify(sock, NNG_PIPE_EV_ADD_POST, link_cb, l);
	return rv != 0 ?
	    rv :
	    nng_pipe_notify(sock, NNG_PIPE_EV_REM_POST, link_cb, l);
}
