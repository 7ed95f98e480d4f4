/* SPDX-License-Identifier: MIT */
/*
 * Options from a file and from the environment (opts.h): the YAML
 * mapping libyaml reads, or the older "name value" lines, and the
 * variables some rows name. Each value goes through the same
 * allot__opts_apply() as the command line's, so a file or a variable
 * accepts exactly what the flag accepts.
 */
#include "opts.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

/* The largest options file read. */
#define FILE_MAX (1024u * 1024u)

/* The values given by files and the environment, kept for the life of
 * the process (as argv's strings are: a handler may keep the pointer),
 * and reachable from here. */
static char **kept;
static size_t nkept, kept_cap;

static const char *
keep(const char *v)
{
	if (nkept == kept_cap) {
		size_t cap = kept_cap ? 2 * kept_cap : 16;
		char **k = realloc(kept, cap * sizeof *k);
		if (k == NULL)
			return NULL;
		kept = k;
		kept_cap = cap;
	}
	char *c = strdup(v);
	if (c != NULL)
		kept[nkept++] = c;
	return c;
}

/* The row a file key names: its long name, '_' read as '-'; never a
 * cli_only row. */
static const allot__opt *
file_key(const allot__opts *t, const char *name)
{
	char n[128];
	size_t len = strlen(name);
	if (len >= sizeof n)
		return NULL;
	for (size_t i = 0; i <= len; i++)
		n[i] = name[i] == '_' ? '-' : name[i];
	for (size_t i = 0; i < t->n; i++) {
		const allot__opt *o = &t->rows[i];
		if (strcmp(o->name, n) == 0 && !o->cli_only &&
		    o->kind != ALLOT__OPT_HELP)
			return o;
	}
	return NULL;
}

/* The row called "no-NAME" for NAME, or NAME for "no-NAME". */
static const allot__opt *
twin(const allot__opts *t, const allot__opt *o)
{
	char n[140];
	if (strncmp(o->name, "no-", 3) == 0)
		snprintf(n, sizeof n, "%s", o->name + 3);
	else
		snprintf(n, sizeof n, "no-%s", o->name);
	return file_key(t, n);
}

static int
truth(const char *v)
{
	static const char *const yes[] = { "true", "yes", "on", "1" };
	static const char *const no[] = { "false", "no", "off", "0" };
	for (size_t i = 0; i < 4; i++) {
		if (strcmp(v, yes[i]) == 0)
			return 1;
		if (strcmp(v, no[i]) == 0)
			return 0;
	}
	return -1;
}

/* One value `v` of row `o`, named in messages by `as`. */
static int
file_value(const allot__opts *t, const allot__opt *o, const char *v,
    const char *as, void *dst)
{
	allot__opt_use u = { .t = t, .o = o, .as = as };
	if (o->arg == NULL) {
		/* A flag: true gives it; false gives its twin, if any. */
		int b = truth(v);
		if (b < 0)
			return allot__opts_fail(&u,
			    "%s takes true or false, not \"%.100s\"", as, v);
		if (b)
			return allot__opts_apply(t, o, NULL, as, dst);
		const allot__opt *w = twin(t, o);
		if (w != NULL && w->arg == NULL)
			return allot__opts_apply(t, w, NULL, as, dst);
		if (o->kind == ALLOT__OPT_TRUE || o->kind == ALLOT__OPT_FALSE)
			return allot__opts_apply(t,
			    &(allot__opt) { .name = o->name,
			        .kind = o->kind == ALLOT__OPT_TRUE ?
			            ALLOT__OPT_FALSE :
			            ALLOT__OPT_TRUE,
			        .off = o->off },
			    NULL, as, dst);
		return ALLOT__OPTS_OK; /* off, as when not given */
	}
	if (*v == '\0')
		return allot__opts_fail(&u, "%s needs a value", as);
	/* A STR row keeps the pointer, and so may a CALL row's handler (a
	 * list of URLs). */
	v = keep(v);
	if (v == NULL)
		return allot__opts_fail(&u, "out of memory");
	return allot__opts_apply(t, o, v, as, dst);
}

/* ---- the older format: one "name value" a line ---- */

static char *
trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	size_t n = strlen(s);
	while (n > 0 && strchr(" \t\r\n", s[n - 1]) != NULL)
		s[--n] = '\0';
	return s;
}

static int
lines(const allot__opts *t, const char *path, char *text, void *dst)
{
	int rc = ALLOT__OPTS_OK;
	unsigned ln = 1;
	for (char *line = text; rc == ALLOT__OPTS_OK && line != NULL; ln++) {
		char *next = strchr(line, '\n');
		if (next != NULL)
			*next++ = '\0';
		char *hash = strchr(line, '#');
		if (hash != NULL)
			*hash = '\0';
		char *s = trim(line);
		line = next;
		if (*s == '\0')
			continue;
		size_t nl = strcspn(s, " \t=");
		char *v = s + nl;
		if (*v != '\0')
			*v++ = '\0';
		v = trim(v);
		if (*v == '=')
			v = trim(v + 1);
		char as[600];
		snprintf(as, sizeof as, "%.400s:%u: %.100s", path, ln, s);
		const allot__opt *o = file_key(t, s);
		allot__opt_use u = { .t = t, .as = as };
		if (o == NULL)
			rc = allot__opts_fail(&u, "%s: unknown option", as);
		else if (o->arg == NULL)
			rc = allot__opts_fail(&u,
			    "%s takes no value here: write the file as YAML "
			    "(\"%s: true\")",
			    as, o->name);
		else
			rc = file_value(t, o, v, as, dst);
	}
	return rc;
}

/* ---- YAML ---- */

static int
yaml_values(const allot__opts *t, const char *path, yaml_document_t *doc,
    yaml_node_t *root, void *dst)
{
	int rc = ALLOT__OPTS_OK;
	for (yaml_node_pair_t *p = root->data.mapping.pairs.start;
	     rc == ALLOT__OPTS_OK && p < root->data.mapping.pairs.top; p++) {
		yaml_node_t *k = yaml_document_get_node(doc, p->key);
		yaml_node_t *v = yaml_document_get_node(doc, p->value);
		char as[600];
		const char *name = k->type == YAML_SCALAR_NODE ?
		    (const char *) k->data.scalar.value :
		    "(not a name)";
		snprintf(as, sizeof as, "%.400s:%lu: %.100s", path,
		    (unsigned long) k->start_mark.line + 1, name);
		allot__opt_use u = { .t = t, .as = as };
		const allot__opt *o = k->type == YAML_SCALAR_NODE ?
		    file_key(t, name) :
		    NULL;
		if (o == NULL) {
			rc = allot__opts_fail(&u,
			    "%s: unknown option (the keys are the long "
			    "options, as --help lists them)",
			    as);
		} else if (v->type == YAML_SCALAR_NODE) {
			rc = file_value(t, o,
			    (const char *) v->data.scalar.value, as, dst);
		} else if (v->type == YAML_SEQUENCE_NODE) {
			for (yaml_node_item_t *i =
			         v->data.sequence.items.start;
			     rc == ALLOT__OPTS_OK &&
			     i < v->data.sequence.items.top;
			     i++) {
				yaml_node_t *e = yaml_document_get_node(
				    doc, *i);
				rc = e->type == YAML_SCALAR_NODE ?
				    file_value(t, o,
				        (const char *) e->data.scalar.value,
				        as, dst) :
				    allot__opts_fail(&u,
				        "%s: a list of values, not of lists "
				        "or mappings",
				        as);
			}
		} else {
			rc = allot__opts_fail(&u,
			    "%s: a value or a list of values, not a mapping",
			    as);
		}
	}
	return rc;
}

int
allot__opts_file(const allot__opts *t, const char *path, void *dst)
{
	allot__opt_use u = { .t = t };
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return allot__opts_fail(&u, "%s: %s", path, strerror(errno));
	char *text = malloc(FILE_MAX + 1);
	size_t len = text != NULL ? fread(text, 1, FILE_MAX + 1, f) : 0;
	bool err = ferror(f) != 0;
	fclose(f);
	if (text == NULL)
		return allot__opts_fail(&u, "out of memory");
	if (err || len > FILE_MAX) {
		free(text);
		return allot__opts_fail(&u, "%s: %s", path,
		    err ? "cannot read it" : "larger than 1 MiB");
	}
	text[len] = '\0';

	yaml_parser_t parser;
	yaml_document_t doc;
	int rc = ALLOT__OPTS_OK;
	if (!yaml_parser_initialize(&parser)) {
		free(text);
		return allot__opts_fail(&u, "out of memory");
	}
	yaml_parser_set_input_string(
	    &parser, (const unsigned char *) text, len);
	if (!yaml_parser_load(&parser, &doc)) {
		/* Not YAML at all: it may still be the older format. */
		yaml_parser_delete(&parser);
		rc = lines(t, path, text, dst);
		free(text);
		return rc;
	}
	yaml_node_t *root = yaml_document_get_root_node(&doc);
	if (root != NULL && root->type == YAML_MAPPING_NODE)
		rc = yaml_values(t, path, &doc, root, dst);
	else if (root != NULL)
		rc = lines(t, path, text, dst);
	yaml_document_delete(&doc);
	yaml_parser_delete(&parser);
	free(text);
	return rc;
}

/* ---- the environment ---- */

int
allot__opts_env(const allot__opts *t, void *dst)
{
	int rc = ALLOT__OPTS_OK;
	for (size_t i = 0; rc == ALLOT__OPTS_OK && i < t->n; i++) {
		const allot__opt *o = &t->rows[i];
		const char *v = o->env != NULL ? getenv(o->env) : NULL;
		if (v == NULL || *v == '\0')
			continue;
		char as[160];
		snprintf(as, sizeof as, "$%.100s", o->env);
		rc = file_value(t, o, v, as, dst);
	}
	return rc;
}

/* ---- before the command line ---- */

int
allot__opts_preload(const allot__opts *t, int argc, char **argv, void *dst,
    const char **ret_path)
{
	const char *path = NULL;
	for (int i = 1; i < argc; i++) {
		const char *p = NULL;
		if (strcmp(argv[i], "--") == 0)
			break;
		if (strncmp(argv[i], "--options=", 10) == 0)
			p = argv[i] + 10;
		else if (strcmp(argv[i], "--options") == 0 && i + 1 < argc)
			p = argv[++i];
		if (p == NULL)
			continue;
		if (path != NULL)
			return allot__opts_error(
			    t, "--options may be given once");
		path = p;
	}
	int rc = path != NULL ? allot__opts_file(t, path, dst) :
	                        ALLOT__OPTS_OK;
	if (rc == ALLOT__OPTS_OK)
		rc = allot__opts_env(t, dst);
	if (ret_path != NULL)
		*ret_path = path;
	return rc;
}

int
allot__opts_skip(const allot__opt_use *u, void *dst)
{
	(void) u;
	(void) dst;
	return ALLOT__OPTS_OK;
}
