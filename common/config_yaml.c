/* SPDX-License-Identifier: MIT */
/*
 * The quota file loader's first step (config_parse.h): libyaml's event
 * parser builds a small tree of scalars, sequences and mappings, each
 * node carrying its line and column for messages. Anchors, aliases, tags
 * and second documents are refused while reading, and nesting is capped,
 * so that what reaches the schema walk is plain data of bounded depth.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "config_parse.h"

/* The schema nests five levels; anything much deeper is hostile. */
#define MAX_DEPTH 32

void
allot__cfg_node_free(allot__cfg_node *n)
{
	if (n == NULL)
		return;
	for (size_t i = 0; i < n->nkids; i++)
		allot__cfg_node_free(n->kids[i]);
	free(n->kids);
	free(n->str);
	free(n);
}

static int
node_add(allot__cfg_node *parent, allot__cfg_node *kid)
{
	if (parent->nkids == parent->cap) {
		size_t cap = parent->cap ? parent->cap * 2 : 4;
		allot__cfg_node **k = realloc(parent->kids, cap * sizeof *k);
		if (k == NULL)
			return ALLOT_ENOMEM;
		parent->kids = k;
		parent->cap = cap;
	}
	parent->kids[parent->nkids++] = kid;
	return ALLOT_OK;
}

static int
yaml_fail(
    allot__cfg_ctx *c, const yaml_parser_t *p, const char *text, size_t len)
{
	uint32_t line = (uint32_t) p->problem_mark.line + 1;
	uint32_t col = (uint32_t) p->problem_mark.column + 1;
	if (p->error == YAML_MEMORY_ERROR)
		return allot__cfg_nomem(c);
	if (p->error == YAML_READER_ERROR) {
		/* The reader reports a byte offset, not a mark. */
		size_t off = p->problem_offset < len ? p->problem_offset : len;
		line = 1;
		col = 1;
		for (size_t i = 0; i < off; i++) {
			if (text[i] == '\n') {
				line++;
				col = 1;
			} else if (((unsigned char) text[i] & 0xc0) != 0x80) {
				col++;
			}
		}
		if (p->problem_value != -1)
			return FAIL_AT(c, line, col,
			    "invalid YAML: %s (byte 0x%02x), expected UTF-8 "
			    "text",
			    p->problem, (unsigned) p->problem_value & 0xff);
		return FAIL_AT(c, line, col,
		    "invalid YAML: %s, expected UTF-8 text", p->problem);
	}
	if (p->context != NULL)
		return FAIL_AT(c, line, col,
		    "invalid YAML: %s (%s at line %zu, column %zu), expected "
		    "valid YAML",
		    p->problem, p->context, p->context_mark.line + 1,
		    p->context_mark.column + 1);
	return FAIL_AT(c, line, col, "invalid YAML: %s, expected valid YAML",
	    p->problem ? p->problem : "unknown error");
}

/* Anchors, aliases and tags would let one file mean different things to
 * different YAML readers (and aliases let a small file expand hugely):
 * the quota file is plain data, so they are refused. */
static int
check_props(allot__cfg_ctx *c, const yaml_event_t *ev,
    const yaml_char_t *anchor, const yaml_char_t *tag)
{
	uint32_t line = (uint32_t) ev->start_mark.line + 1;
	uint32_t col = (uint32_t) ev->start_mark.column + 1;
	char q[QBUF];
	if (anchor != NULL)
		return FAIL_AT(c, line, col,
		    "anchor %s: anchors and aliases are not supported, "
		    "expected plain values (write each value out)",
		    Q(q, (const char *) anchor));
	if (tag != NULL)
		return FAIL_AT(c, line, col,
		    "tag %s: tags are not supported, expected an untagged "
		    "value (quote strings instead)",
		    Q(q, (const char *) tag));
	return ALLOT_OK;
}

/* The scalar node of a scalar event. */
static int
new_scalar(allot__cfg_ctx *c, const yaml_event_t *ev, allot__cfg_node **ret)
{
	int rc = check_props(
	    c, ev, ev->data.scalar.anchor, ev->data.scalar.tag);
	if (rc != ALLOT_OK)
		return rc;
	allot__cfg_node *n = calloc(1, sizeof *n);
	if (n == NULL ||
	    (n->str = malloc(ev->data.scalar.length + 1)) == NULL) {
		free(n);
		return allot__cfg_nomem(c);
	}
	n->type = NODE_SCALAR;
	n->len = ev->data.scalar.length;
	memcpy(n->str, ev->data.scalar.value, n->len);
	n->str[n->len] = '\0';
	n->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
	*ret = n;
	return ALLOT_OK;
}

/* The empty sequence or mapping node a start event opens, `depth`
 * collections deep. */
static int
new_collection(allot__cfg_ctx *c, const yaml_event_t *ev, size_t depth,
    allot__cfg_node **ret)
{
	uint32_t line = (uint32_t) ev->start_mark.line + 1;
	uint32_t col = (uint32_t) ev->start_mark.column + 1;
	bool seq = ev->type == YAML_SEQUENCE_START_EVENT;
	int rc = seq ? check_props(c, ev, ev->data.sequence_start.anchor,
	                   ev->data.sequence_start.tag) :
	               check_props(c, ev, ev->data.mapping_start.anchor,
	                   ev->data.mapping_start.tag);
	if (rc != ALLOT_OK)
		return rc;
	if (depth == MAX_DEPTH)
		return FAIL_AT(c, line, col,
		    "nesting deeper than %d levels, expected "
		    "the quota file layout",
		    MAX_DEPTH);
	allot__cfg_node *n = calloc(1, sizeof *n);
	if (n == NULL)
		return allot__cfg_nomem(c);
	n->type = seq ? NODE_SEQ : NODE_MAP;
	*ret = n;
	return ALLOT_OK;
}

/* Hang the new node `n` under the innermost open collection, stack[depth
 * - 1], or make it the root; a collection is then opened itself. On an
 * error `n` is freed. */
static int
attach(allot__cfg_ctx *c, allot__cfg_node **stack, size_t *depth,
    allot__cfg_node **root, allot__cfg_node *n)
{
	allot__cfg_node *parent = *depth > 0 ? stack[*depth - 1] : NULL;
	int rc = ALLOT_OK;
	if (parent != NULL && parent->type == NODE_MAP &&
	    parent->nkids % 2 == 0 && n->type != NODE_SCALAR) {
		rc = FAIL(c, n,
		    "%s used as a mapping key, expected a plain key "
		    "such as burst",
		    n->type == NODE_MAP ? "a mapping" : "a sequence");
	} else if (parent == NULL && *root != NULL) {
		/* Unreachable: one document holds one root. */
		rc = FAIL(c, n,
		    "a second top-level node, expected exactly one "
		    "document per quota file");
	} else if (parent == NULL) {
		*root = n;
	} else if (node_add(parent, n) != ALLOT_OK) {
		rc = allot__cfg_nomem(c);
	}
	if (rc != ALLOT_OK) {
		allot__cfg_node_free(n);
		return rc;
	}
	if (n->type != NODE_SCALAR)
		stack[(*depth)++] = n;
	return ALLOT_OK;
}

int
allot__cfg_read_tree(
    allot__cfg_ctx *c, const char *text, size_t len, allot__cfg_node **ret)
{
	yaml_parser_t p;
	yaml_event_t ev;
	allot__cfg_node *stack[MAX_DEPTH];
	size_t depth = 0, ndocs = 0;
	allot__cfg_node *root = NULL;
	bool done = false;
	int rc = ALLOT_OK;
	char q[QBUF];

	if (!yaml_parser_initialize(&p))
		return allot__cfg_nomem(c);
	yaml_parser_set_input_string(&p, (const unsigned char *) text, len);
	while (!done && rc == ALLOT_OK) {
		if (!yaml_parser_parse(&p, &ev)) {
			rc = yaml_fail(c, &p, text, len);
			break;
		}
		uint32_t line = (uint32_t) ev.start_mark.line + 1;
		uint32_t col = (uint32_t) ev.start_mark.column + 1;
		allot__cfg_node *n = NULL;
		switch (ev.type) {
		case YAML_STREAM_END_EVENT: done = true; break;
		case YAML_DOCUMENT_START_EVENT:
			if (ndocs++ > 0)
				rc = FAIL_AT(c, line, col,
				    "a second YAML document, expected exactly "
				    "one document per quota file");
			break;
		case YAML_ALIAS_EVENT:
			rc = FAIL_AT(c, line, col,
			    "alias %s: anchors and aliases are not supported, "
			    "expected plain values (write each value out)",
			    Q(q, (const char *) ev.data.alias.anchor));
			break;
		case YAML_SCALAR_EVENT: rc = new_scalar(c, &ev, &n); break;
		case YAML_SEQUENCE_START_EVENT:
		case YAML_MAPPING_START_EVENT:
			rc = new_collection(c, &ev, depth, &n);
			break;
		case YAML_SEQUENCE_END_EVENT:
		case YAML_MAPPING_END_EVENT:
			if (depth > 0) /* libyaml balances them */
				depth--;
			break;
		default: break;
		}
		yaml_event_delete(&ev);
		if (n == NULL)
			continue;
		n->line = line;
		n->col = col;
		rc = attach(c, stack, &depth, &root, n);
	}
	yaml_parser_delete(&p);
	if (rc != ALLOT_OK) {
		allot__cfg_node_free(root);
		return rc;
	}
	*ret = root;
	return ALLOT_OK;
}
