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

#include "config_parse.h"

/* Files above this size are refused before parsing. */
#define MAX_FILE_BYTES (64u << 20)

void
allot_config_free(allot_config *cfg)
{
	if (cfg == NULL)
		return;
	free(cfg->source);
	allot__quota_free(&cfg->def);
	for (size_t i = 0; i < cfg->ncallers; i++)
		allot__quota_free(&cfg->callers[i]);
	free(cfg->callers);
	for (size_t i = 0; i < cfg->nendpoints; i++)
		free(cfg->endpoints[i].name);
	free(cfg->endpoints);
	for (size_t i = 0; i < cfg->nclasses; i++)
		free(cfg->classes[i]);
	free(cfg);
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
	c.cfg->digest = allot__cfg_digest(c.cfg, c.byid);
	*ret_cfg = c.cfg;
	c.cfg = NULL;
out:
	allot_config_free(c.cfg);
	allot__cfg_node_free(root);
	free(c.meta);
	free(c.byid);
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
		if (strcmp(cfg->callers[i].identity, identity) == 0)
			return &cfg->callers[i];
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

void
allot__quota_free(allot__quota *q)
{
	free(q->identity);
	free(q->endpoint);
	free(q->owner);
	free(q->reason);
	for (size_t i = 0; i < q->nlabels; i++)
		free(q->labels[i]);
	free(q->labels);
	q->identity = q->endpoint = q->owner = q->reason = NULL;
	q->labels = NULL;
	q->nlabels = 0;
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
	d->labels = NULL;
	d->nlabels = 0;
	int rc = str_copy(&d->identity, q->identity);
	int r2 = str_copy(&d->endpoint, q->endpoint);
	int r3 = str_copy(&d->owner, q->owner);
	int r4 = str_copy(&d->reason, q->reason);
	if (rc != ALLOT_OK || r2 != ALLOT_OK || r3 != ALLOT_OK ||
	    r4 != ALLOT_OK)
		return ALLOT_ENOMEM;
	if (q->nlabels > 0) {
		d->labels = calloc(q->nlabels, sizeof *d->labels);
		if (d->labels == NULL)
			return ALLOT_ENOMEM;
		for (; d->nlabels < q->nlabels; d->nlabels++)
			if (str_copy(&d->labels[d->nlabels],
			        q->labels[d->nlabels]) != ALLOT_OK)
				return ALLOT_ENOMEM;
	}
	return ALLOT_OK;
}

allot_config *
allot__config_dup(const allot_config *cfg)
{
	allot_config *d = calloc(1, sizeof *d);
	if (d == NULL)
		return NULL;
	*d = *cfg;
	/* Clear every owned pointer before copying, so that a failure
	 * half-way leaves something allot_config_free() can release. */
	d->source = NULL;
	memset(&d->def, 0, sizeof d->def);
	d->callers = NULL;
	d->ncallers = 0;
	d->endpoints = NULL;
	d->nendpoints = 0;
	d->nclasses = 0;
	memset(d->classes, 0, sizeof d->classes);
	if ((d->source = strdup(cfg->source)) == NULL ||
	    allot__quota_copy(&d->def, &cfg->def) != ALLOT_OK)
		goto fail;
	if (cfg->ncallers > 0) {
		d->callers = calloc(cfg->ncallers, sizeof *d->callers);
		if (d->callers == NULL)
			goto fail;
		for (; d->ncallers < cfg->ncallers;) {
			allot__quota *q = &d->callers[d->ncallers++];
			if (allot__quota_copy(
			        q, &cfg->callers[d->ncallers - 1]) != ALLOT_OK)
				goto fail;
		}
	}
	if (cfg->nendpoints > 0) {
		d->endpoints = calloc(cfg->nendpoints, sizeof *d->endpoints);
		if (d->endpoints == NULL)
			goto fail;
		for (; d->nendpoints < cfg->nendpoints; d->nendpoints++) {
			allot__endpoint *e = &d->endpoints[d->nendpoints];
			*e = cfg->endpoints[d->nendpoints];
			if ((e->name = strdup(e->name)) == NULL)
				goto fail;
		}
	}
	for (; d->nclasses < cfg->nclasses; d->nclasses++)
		if ((d->classes[d->nclasses] = strdup(
		         cfg->classes[d->nclasses])) == NULL)
			goto fail;
	return d;
fail:
	allot_config_free(d);
	return NULL;
}

int
allot__config_select(
    const allot_config *cfg, const char *service, allot_config **ret)
{
	(void) service; /* one scope for every service, for now */
	*ret = allot__config_dup(cfg);
	return *ret != NULL ? ALLOT_OK : ALLOT_ENOMEM;
}
