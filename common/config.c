/* SPDX-License-Identifier: MIT */
/*
 * The quota file loader's entry points (config.h): allot_config_load()
 * reads the file, allot_config_parse() runs the stages of
 * config_parse.h (read the YAML tree, walk the schema, check across
 * sections, digest) and on any error frees the half-built config and
 * returns nothing; plus the config's free, look-ups and deep copy. Every
 * error names the offending node as "FILE:LINE:COL: what, expected
 * what".
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config_fields.h"
#include "config_parse.h"

/* Files above this size are refused before parsing. */
#define MAX_FILE_BYTES (64u << 20)

static void
quotas_free(allot__quota *qs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		allot__quota_free(&qs[i]);
	free(qs);
}

static void
endpoints_free(allot__endpoint *e, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(e[i].name);
	free(e);
}

static void
service_free(allot__service *s)
{
	free(s->name);
	if (s->def != NULL)
		allot__quota_free(s->def);
	free(s->def);
	quotas_free(s->callers, s->ncallers);
	endpoints_free(s->endpoints, s->nendpoints);
}

void
allot_config_free(allot_config *cfg)
{
	if (cfg == NULL)
		return;
	free(cfg->source);
	allot__quota_free(&cfg->def);
	quotas_free(cfg->callers, cfg->ncallers);
	endpoints_free(cfg->endpoints, cfg->nendpoints);
	for (size_t i = 0; i < cfg->nservices; i++)
		service_free(&cfg->services[i]);
	free(cfg->services);
	for (size_t i = 0; i < cfg->nclasses; i++)
		free(cfg->classes[i]);
	free(cfg);
}

void
allot__cfg_scope_free(allot__cfg_scope *s)
{
	if (s->meta != NULL)
		for (size_t i = 0; i < s->cap; i++)
			free(s->meta[i].key);
	free(s->meta);
	free(s->def.key);
	free(s->byid);
	memset(s, 0, sizeof *s);
}

int
allot_config_parse(const char *name, const char *text, size_t len,
    char *errbuf, size_t errlen, allot_config **ret_cfg)
{
	allot__cfg_ctx c = {
		.name = name != NULL ? name : "<config>",
		.errbuf = errbuf,
		.errlen = errlen,
	};
	allot__cfg_node *root = NULL;
	int rc;

	if (errbuf != NULL && errlen > 0)
		errbuf[0] = '\0';
	if (ret_cfg == NULL || (text == NULL && len > 0))
		return ALLOT_EINVAL;
	if (text == NULL)
		text = "";
	c.cloc = newlocale(LC_NUMERIC_MASK, "C", (locale_t) 0);
	c.cfg = calloc(1, sizeof *c.cfg);
	if (c.cloc == (locale_t) 0 || c.cfg == NULL) {
		rc = allot__cfg_nomem(&c);
		goto out;
	}
	c.cfg->default_weight = 1;
	if ((c.cfg->source = strdup(c.name)) == NULL ||
	    (c.cfg->def.identity = strdup("default")) == NULL) {
		rc = allot__cfg_nomem(&c);
		goto out;
	}
	rc = allot__cfg_read_tree(&c, text, len, &root);
	if (rc == ALLOT_OK)
		rc = allot__cfg_parse_root(&c, root);
	if (rc == ALLOT_OK)
		rc = allot__cfg_check_all(&c);
	if (rc != ALLOT_OK)
		goto out;
	c.cfg->digest = allot__cfg_digest(&c);
	*ret_cfg = c.cfg;
	c.cfg = NULL;
out:
	for (size_t i = 0; c.svc != NULL && i < c.nsvc; i++)
		allot__cfg_scope_free(&c.svc[i]);
	free(c.svc);
	free(c.svc_sorted);
	allot__cfg_scope_free(&c.top);
	allot_config_free(c.cfg);
	allot__cfg_plans_free(&c);
	allot__cfg_node_free(root);
	if (c.cloc != (locale_t) 0)
		freelocale(c.cloc);
	return rc;
}

static const char *
errno_str(int err, char *buf, size_t len)
{
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
	return strerror_r(err, buf, len);
#else
	if (strerror_r(err, buf, len) != 0)
		snprintf(buf, len, "error %d", err);
	return buf;
#endif
}

int
allot_config_load(
    const char *path, char *errbuf, size_t errlen, allot_config **ret_cfg)
{
	char ebuf[128];
	char *text = NULL;
	size_t len = 0, cap = 0;
	int rc = ALLOT_OK, fd, err = 0;

	if (errbuf != NULL && errlen > 0)
		errbuf[0] = '\0';
	if (path == NULL || ret_cfg == NULL)
		return ALLOT_EINVAL;
	do
		fd = open(path, O_RDONLY | O_CLOEXEC);
	while (fd < 0 && errno == EINTR);
	if (fd < 0) {
		err = errno;
		rc = err == ENOENT ? ALLOT_ENOENT : ALLOT_EIO;
		goto fail;
	}
	for (;;) {
		if (len == cap) {
			if (cap >= MAX_FILE_BYTES) {
				rc = ALLOT_ECONFIG;
				if (errbuf != NULL && errlen > 0)
					snprintf(errbuf, errlen,
					    "%s:1:1: file larger than %u MiB, "
					    "expected a quota file",
					    path, MAX_FILE_BYTES >> 20);
				goto out;
			}
			size_t ncap = cap ? cap * 2 : 16384;
			char *t = realloc(text, ncap);
			if (t == NULL) {
				rc = ALLOT_ENOMEM;
				if (errbuf != NULL && errlen > 0)
					snprintf(errbuf, errlen,
					    "%s: out of memory", path);
				goto out;
			}
			text = t;
			cap = ncap;
		}
		ssize_t n = read(fd, text + len, cap - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			err = errno;
			rc = ALLOT_EIO;
			goto fail;
		}
		if (n == 0)
			break;
		len += (size_t) n;
	}
	rc = allot_config_parse(path, text, len, errbuf, errlen, ret_cfg);
	goto out;
fail:
	if (errbuf != NULL && errlen > 0)
		snprintf(errbuf, errlen, "%s: cannot read the quota file: %s",
		    path, errno_str(err, ebuf, sizeof ebuf));
out:
	if (fd >= 0)
		close(fd);
	free(text);
	return rc;
}

const allot__quota *
allot__config_find(const allot_config *cfg, const char *identity)
{
	if (cfg == NULL || identity == NULL)
		return NULL;
	for (size_t i = 0; i < cfg->ncallers; i++)
		if (cfg->callers[i].endpoint == NULL &&
		    strcmp(cfg->callers[i].identity, identity) == 0)
			return &cfg->callers[i];
	return NULL;
}

const allot__service *
allot__config_service(const allot_config *cfg, const char *name)
{
	if (cfg == NULL || name == NULL)
		return NULL;
	for (size_t i = 0; i < cfg->nservices; i++)
		if (strcmp(cfg->services[i].name, name) == 0)
			return &cfg->services[i];
	return NULL;
}

uint32_t
allot__config_weight(const allot_config *cfg, const char *endpoint)
{
	if (endpoint != NULL)
		for (size_t i = 0; i < cfg->nendpoints; i++)
			if (strcmp(cfg->endpoints[i].name, endpoint) == 0)
				return cfg->endpoints[i].weight;
	return cfg->default_weight;
}

size_t
allot__quota_key(const allot__quota *q, char *buf, size_t size)
{
	int n = q->endpoint != NULL ?
	    snprintf(buf, size, "%s %s", q->identity, q->endpoint) :
	    snprintf(buf, size, "%s", q->identity);
	return n < 0 ? 0 : (size_t) n;
}

bool
allot__identity_is_pattern(const char *identity)
{
	size_t len = strlen(identity);
	return len > 0 && identity[len - 1] == '*';
}

bool
allot__quota_is_level(const allot__quota *q)
{
	return q->stacked || allot__identity_is_pattern(q->identity);
}

void
allot__quota_free(allot__quota *q)
{
	free(q->identity);
	free(q->endpoint);
	q->identity = q->endpoint = NULL;
	for (size_t i = 0; i < allot__nqfields; i++)
		allot__qfield_free(q, &allot__qfields[i]);
}

static int
str_copy(char **d, const char *s)
{
	*d = NULL;
	if (s == NULL)
		return ALLOT_OK;
	return (*d = strdup(s)) != NULL ? ALLOT_OK : ALLOT_ENOMEM;
}

int
allot__quota_copy(allot__quota *d, const allot__quota *q)
{
	*d = *q;
	int rc = str_copy(&d->identity, q->identity);
	if (str_copy(&d->endpoint, q->endpoint) != ALLOT_OK)
		rc = ALLOT_ENOMEM;
	/* Every field, even after a failure: each leaves its copy or
	 * nothing, never q's memory. */
	for (size_t i = 0; i < allot__nqfields; i++)
		if (allot__qfield_copy(d, q, &allot__qfields[i]) != ALLOT_OK)
			rc = ALLOT_ENOMEM;
	return rc;
}

static int
quotas_copy(allot__quota **d, size_t *nd, const allot__quota *q, size_t n)
{
	*d = NULL;
	*nd = 0;
	if (n == 0)
		return ALLOT_OK;
	if ((*d = calloc(n, sizeof **d)) == NULL)
		return ALLOT_ENOMEM;
	/* Counted as each is copied, so that a failure half-way leaves
	 * what the free functions can release. */
	for (size_t i = 0; i < n; i++) {
		*nd = i + 1;
		if (allot__quota_copy(&(*d)[i], &q[i]) != ALLOT_OK)
			return ALLOT_ENOMEM;
	}
	return ALLOT_OK;
}

static int
endpoints_copy(
    allot__endpoint **d, size_t *nd, const allot__endpoint *e, size_t n)
{
	*d = NULL;
	*nd = 0;
	if (n == 0)
		return ALLOT_OK;
	if ((*d = calloc(n, sizeof **d)) == NULL)
		return ALLOT_ENOMEM;
	for (; *nd < n; (*nd)++) {
		(*d)[*nd] = e[*nd];
		if (((*d)[*nd].name = strdup(e[*nd].name)) == NULL)
			return ALLOT_ENOMEM;
	}
	return ALLOT_OK;
}

static int
service_copy(allot__service *d, const allot__service *s)
{
	*d = *s;
	d->def = NULL;
	d->callers = NULL;
	d->ncallers = 0;
	d->endpoints = NULL;
	d->nendpoints = 0;
	if ((d->name = strdup(s->name)) == NULL)
		return ALLOT_ENOMEM;
	if (s->def != NULL) {
		if ((d->def = calloc(1, sizeof *d->def)) == NULL ||
		    allot__quota_copy(d->def, s->def) != ALLOT_OK)
			return ALLOT_ENOMEM;
	}
	if (quotas_copy(&d->callers, &d->ncallers, s->callers, s->ncallers) !=
	        ALLOT_OK ||
	    endpoints_copy(&d->endpoints, &d->nendpoints, s->endpoints,
	        s->nendpoints) != ALLOT_OK)
		return ALLOT_ENOMEM;
	return ALLOT_OK;
}

/* A config with every owned pointer of `cfg` cleared, so that a failure
 * half-way through copying leaves something allot_config_free() can
 * release. */
static allot_config *
shallow(const allot_config *cfg)
{
	allot_config *d = calloc(1, sizeof *d);
	if (d == NULL)
		return NULL;
	*d = *cfg;
	d->source = NULL;
	memset(&d->def, 0, sizeof d->def);
	d->callers = NULL;
	d->ncallers = 0;
	d->endpoints = NULL;
	d->nendpoints = 0;
	d->nclasses = 0;
	memset(d->classes, 0, sizeof d->classes);
	d->services = NULL;
	d->nservices = 0;
	if ((d->source = strdup(cfg->source)) == NULL)
		goto fail;
	for (; d->nclasses < cfg->nclasses; d->nclasses++)
		if ((d->classes[d->nclasses] = strdup(
		         cfg->classes[d->nclasses])) == NULL)
			goto fail;
	return d;
fail:
	allot_config_free(d);
	return NULL;
}

allot_config *
allot__config_dup(const allot_config *cfg)
{
	allot_config *d = shallow(cfg);
	if (d == NULL)
		return NULL;
	if (allot__quota_copy(&d->def, &cfg->def) != ALLOT_OK ||
	    quotas_copy(&d->callers, &d->ncallers, cfg->callers,
	        cfg->ncallers) != ALLOT_OK ||
	    endpoints_copy(&d->endpoints, &d->nendpoints, cfg->endpoints,
	        cfg->nendpoints) != ALLOT_OK)
		goto fail;
	if (cfg->nservices > 0) {
		d->services = calloc(cfg->nservices, sizeof *d->services);
		if (d->services == NULL)
			goto fail;
		for (size_t i = 0; i < cfg->nservices; i++) {
			d->nservices = i + 1;
			if (service_copy(&d->services[i], &cfg->services[i]) !=
			    ALLOT_OK)
				goto fail;
		}
	}
	return d;
fail:
	allot_config_free(d);
	return NULL;
}

/* Quotas by (identity, endpoint), caller-wide first: the order of the
 * look-ups below (any order works, as long as it is total). */
static int
cmp_quota(const void *a, const void *b)
{
	const allot__quota *x = *(const allot__quota *const *) a;
	const allot__quota *y = *(const allot__quota *const *) b;
	int r = strcmp(x->identity, y->identity);
	if (r != 0 || (x->endpoint == NULL && y->endpoint == NULL))
		return r;
	if (x->endpoint == NULL || y->endpoint == NULL)
		return x->endpoint == NULL ? -1 : 1;
	return strcmp(x->endpoint, y->endpoint);
}

/* qs[0..n) as pointers sorted by cmp_quota(); NULL when out of memory
 * (or n == 0). */
static const allot__quota **
sorted(const allot__quota *qs, size_t n)
{
	if (n == 0)
		return NULL;
	const allot__quota **p = malloc(n * sizeof *p);
	if (p == NULL)
		return NULL;
	for (size_t i = 0; i < n; i++)
		p[i] = &qs[i];
	qsort(p, n, sizeof *p, cmp_quota);
	return p;
}

/* The quota of `by` (n, sorted) with the wire key of `q`, or NULL. */
static const allot__quota *
find_key(const allot__quota **by, size_t n, const allot__quota *q)
{
	if (n == 0)
		return NULL;
	const allot__quota **f = bsearch(&q, by, n, sizeof *by, cmp_quota);
	return f != NULL ? *f : NULL;
}

/* The view's quotas: the top level's, each replaced in place by the
 * service's quota of the same wire key, then the service's others in
 * file order. */
static int
merge_callers(
    allot_config *d, const allot_config *cfg, const allot__service *s)
{
	size_t cap = cfg->ncallers + s->ncallers;
	if (cap == 0)
		return ALLOT_OK;
	const allot__quota **top = sorted(cfg->callers, cfg->ncallers);
	const allot__quota **own = sorted(s->callers, s->ncallers);
	int rc = ALLOT_ENOMEM;
	if ((cfg->ncallers > 0 && top == NULL) ||
	    (s->ncallers > 0 && own == NULL) ||
	    (d->callers = calloc(cap, sizeof *d->callers)) == NULL)
		goto out;
	for (size_t i = 0; i < cfg->ncallers; i++) {
		const allot__quota *q = find_key(
		    own, s->ncallers, &cfg->callers[i]);
		if (allot__quota_copy(&d->callers[d->ncallers++],
		        q != NULL ? q : &cfg->callers[i]) != ALLOT_OK)
			goto out;
	}
	for (size_t j = 0; j < s->ncallers; j++) {
		if (find_key(top, cfg->ncallers, &s->callers[j]) != NULL)
			continue;
		if (allot__quota_copy(&d->callers[d->ncallers++],
		        &s->callers[j]) != ALLOT_OK)
			goto out;
	}
	rc = ALLOT_OK;
out:
	free(top);
	free(own);
	return rc;
}

/* The view's weights: the top level's, each replaced by the service's
 * weight of the same endpoint, then the service's others. */
static int
merge_endpoints(
    allot_config *d, const allot_config *cfg, const allot__service *s)
{
	size_t cap = cfg->nendpoints + s->nendpoints;
	if (cap == 0)
		return ALLOT_OK;
	if ((d->endpoints = calloc(cap, sizeof *d->endpoints)) == NULL)
		return ALLOT_ENOMEM;
	for (int pass = 0; pass < 2; pass++) {
		const allot__endpoint *e = pass == 0 ? cfg->endpoints :
		                                       s->endpoints;
		size_t n = pass == 0 ? cfg->nendpoints : s->nendpoints;
		for (size_t i = 0; i < n; i++) {
			size_t k = 0;
			while (k < d->nendpoints &&
			    strcmp(d->endpoints[k].name, e[i].name) != 0)
				k++;
			if (k == d->nendpoints) {
				d->endpoints[k].name = strdup(e[i].name);
				if (d->endpoints[k].name == NULL)
					return ALLOT_ENOMEM;
				d->nendpoints++;
			}
			d->endpoints[k].weight = e[i].weight;
		}
	}
	return ALLOT_OK;
}

int
allot__config_select(
    const allot_config *cfg, const char *service, allot_config **ret)
{
	const allot__service *s = allot__config_service(cfg, service);
	allot_config *d = shallow(cfg);
	*ret = NULL;
	if (d == NULL)
		return ALLOT_ENOMEM;
	if (s == NULL) {
		/* The top level alone. */
		if (allot__quota_copy(&d->def, &cfg->def) != ALLOT_OK ||
		    quotas_copy(&d->callers, &d->ncallers, cfg->callers,
		        cfg->ncallers) != ALLOT_OK ||
		    endpoints_copy(&d->endpoints, &d->nendpoints,
		        cfg->endpoints, cfg->nendpoints) != ALLOT_OK)
			goto fail;
		*ret = d;
		return ALLOT_OK;
	}
	if (s->default_weight > 0)
		d->default_weight = s->default_weight;
	if (s->ceiling_rate > 0) {
		d->ceiling_rate = s->ceiling_rate;
		d->overcommit = s->overcommit;
	}
	if (allot__quota_copy(&d->def, s->def != NULL ? s->def : &cfg->def) !=
	        ALLOT_OK ||
	    merge_callers(d, cfg, s) != ALLOT_OK ||
	    merge_endpoints(d, cfg, s) != ALLOT_OK)
		goto fail;
	d->max_weight = d->default_weight;
	for (size_t i = 0; i < d->nendpoints; i++)
		if (d->endpoints[i].weight > d->max_weight)
			d->max_weight = d->endpoints[i].weight;
	*ret = d;
	return ALLOT_OK;
fail:
	allot_config_free(d);
	return ALLOT_ENOMEM;
}
