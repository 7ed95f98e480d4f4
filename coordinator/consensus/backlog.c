/* SPDX-License-Identifier: MIT */
/* A member's store backlog (backlog.h). */
#include "backlog.h"

#include <raft.h>
#include <stdbool.h>
#include <stdlib.h>

#include <allot/allot.h>

void
allot__backlog_init(allot__backlog *b)
{
	b->head = NULL;
	b->tail = &b->head;
	b->n = 0;
	b->bytes = 0;
	b->lost = 0;
}

void
allot__backlog_fini(allot__backlog *b)
{
	while (b->head != NULL)
		allot__backlog_pop(b);
}

bool
allot__backlog_push(allot__backlog *b, uint64_t index, const allot__centry *e)
{
	allot__backlog_ent *x = malloc(sizeof *x);
	if (x == NULL) {
		b->lost++;
		return false;
	}
	x->buf = NULL;
	if (allot__centry_encode(e, &x->buf, &x->len) != ALLOT_OK ||
	    b->bytes + x->len > ALLOT__BACKLOG_BYTES) {
		if (x->buf != NULL)
			raft_free(x->buf);
		free(x);
		b->lost++;
		return false;
	}
	x->index = index;
	x->next = NULL;
	*b->tail = x;
	b->tail = &x->next;
	b->n++;
	b->bytes += x->len;
	return true;
}

bool
allot__backlog_peek(allot__backlog *b, uint64_t *ret_index, allot__centry *ret)
{
	while (b->head != NULL) {
		allot__backlog_ent *x = b->head;
		if (allot__centry_decode(x->buf, x->len, ret) == ALLOT_OK) {
			*ret_index = x->index;
			return true;
		}
		b->lost++;
		allot__backlog_pop(b);
	}
	return false;
}

void
allot__backlog_pop(allot__backlog *b)
{
	allot__backlog_ent *x = b->head;
	if (x == NULL)
		return;
	b->head = x->next;
	if (b->head == NULL)
		b->tail = &b->head;
	b->n--;
	b->bytes -= x->len;
	raft_free(x->buf);
	free(x);
}
