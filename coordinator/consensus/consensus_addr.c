/* SPDX-License-Identifier: MIT */
/*
 * The "RAFT_ADDR|AGENT_URL" member address and the transport wrapper
 * that strips it (consensus_addr.h). The inner transport may keep the
 * address pointers it is given (raft_uv_tcp keeps its own), so every
 * stripped address is interned here and lives until the close.
 */
#include "consensus_addr.h"

#include <stdlib.h>
#include <string.h>

#include <allot/allot.h>

typedef struct wrap {
	struct raft_uv_transport *inner;
	struct raft_uv_transport *outer;
	char **names; /* interned stripped addresses */
	size_t n, cap;
} wrap;

bool
allot__caddr_split(
    const char *addr, char *raft, size_t cap, const char **ret_url)
{
	const char *sep = strchr(addr, ALLOT__CADDR_SEP);
	size_t n = sep != NULL ? (size_t) (sep - addr) : strlen(addr);
	if (n >= cap)
		return false;
	memcpy(raft, addr, n);
	raft[n] = '\0';
	*ret_url = sep != NULL ? sep + 1 : "";
	return true;
}

bool
allot__caddr_join(const char *raft, const char *url, char *out, size_t cap)
{
	if (raft[0] == '\0' || url[0] == '\0' ||
	    strchr(raft, ALLOT__CADDR_SEP) != NULL ||
	    strchr(url, ALLOT__CADDR_SEP) != NULL)
		return false;
	size_t n = strlen(raft) + 1 + strlen(url);
	if (n >= cap)
		return false;
	memcpy(out, raft, strlen(raft));
	out[strlen(raft)] = ALLOT__CADDR_SEP;
	memcpy(out + strlen(raft) + 1, url, strlen(url) + 1);
	return true;
}

/* The stripped form of `addr`, interned; NULL when out of memory. */
static const char *
intern(wrap *w, const char *addr)
{
	char buf[512];
	const char *url;
	if (!allot__caddr_split(addr, buf, sizeof buf, &url))
		return NULL;
	for (size_t i = 0; i < w->n; i++)
		if (strcmp(w->names[i], buf) == 0)
			return w->names[i];
	if (w->n == w->cap) {
		size_t cap = w->cap ? w->cap * 2 : 8;
		char **p = realloc(w->names, cap * sizeof *p);
		if (p == NULL)
			return NULL;
		w->names = p;
		w->cap = cap;
	}
	char *s = strdup(buf);
	if (s == NULL)
		return NULL;
	w->names[w->n++] = s;
	return s;
}

/* raft_uv reaches its own state through transport->data, whichever of
 * the two transports calls it back. */
static wrap *
sync_data(struct raft_uv_transport *t)
{
	wrap *w = t->impl;
	w->inner->data = t->data;
	return w;
}

static int
w_init(struct raft_uv_transport *t, raft_id id, const char *address)
{
	wrap *w = sync_data(t);
	const char *a = intern(w, address);
	if (a == NULL)
		return RAFT_NOMEM;
	int rv = w->inner->init(w->inner, id, a);
	if (rv != 0)
		memcpy(t->errmsg, w->inner->errmsg, sizeof t->errmsg);
	return rv;
}

static int
w_listen(struct raft_uv_transport *t, raft_uv_accept_cb cb)
{
	wrap *w = sync_data(t);
	int rv = w->inner->listen(w->inner, cb);
	if (rv != 0)
		memcpy(t->errmsg, w->inner->errmsg, sizeof t->errmsg);
	return rv;
}

static int
w_connect(struct raft_uv_transport *t, struct raft_uv_connect *req, raft_id id,
    const char *address, raft_uv_connect_cb cb)
{
	wrap *w = sync_data(t);
	const char *a = intern(w, address);
	if (a == NULL)
		return RAFT_NOMEM;
	int rv = w->inner->connect(w->inner, req, id, a, cb);
	if (rv != 0)
		memcpy(t->errmsg, w->inner->errmsg, sizeof t->errmsg);
	return rv;
}

static void
w_close(struct raft_uv_transport *t, raft_uv_transport_close_cb cb)
{
	wrap *w = sync_data(t);
	/* The inner close callback gets the inner transport; raft_uv only
	 * uses it to find its state (data), which is the same. */
	w->inner->close(w->inner, cb);
}

int
allot__caddr_wrap(
    struct raft_uv_transport *outer, struct raft_uv_transport *inner)
{
	wrap *w = calloc(1, sizeof *w);
	if (w == NULL)
		return ALLOT_ENOMEM;
	w->inner = inner;
	w->outer = outer;
	memset(outer, 0, sizeof *outer);
	outer->impl = w;
	outer->init = w_init;
	outer->listen = w_listen;
	outer->connect = w_connect;
	outer->close = w_close;
	return ALLOT_OK;
}

void
allot__caddr_free(struct raft_uv_transport *outer)
{
	wrap *w = outer->impl;
	if (w == NULL)
		return;
	for (size_t i = 0; i < w->n; i++)
		free(w->names[i]);
	free(w->names);
	free(w);
	outer->impl = NULL;
}
