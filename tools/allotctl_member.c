/* SPDX-License-Identifier: MIT */
/*
 * allotctl member add|remove|list: the coordinator cluster's membership
 * at run time, through an allotd member's admin socket (GET /members,
 * POST /members/add, POST /members/remove; coordinator/admin/admin.h). Adding
 * and removing run on the leader: another member answers 421 naming the
 * leader's agent URL, which is printed. A new member joins as a
 * non-voter, catches up, then votes (list shows its role). A removal
 * waits until it is done, the leader's own included: the leader records
 * that it is leaving, hands leadership over, and the new leader demotes
 * and removes it, all on one call (coordinator/consensus/consensus_node.h);
 * the answer says how it ended and how long it took.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "allotctl.h"

/* How long the admin socket may spend on a removal; the HTTP exchange
 * gets that on top of --timeout. */
#define REMOVE_WAIT_MS 10000

/* The members as a table: ID, RAFT, AGENT URL, ROLE, LEADER. */
static int
print_list(const char *text)
{
	json_object *doc = json_tokener_parse(text);
	json_object *arr = ctl_jget(doc, "members");
	if (doc == NULL || arr == NULL ||
	    !json_object_is_type(arr, json_type_array)) {
		ctl_fail("allotd's admin socket did not answer the members");
		json_object_put(doc);
		return EXIT_UNREACHABLE;
	}
	ctl_table t;
	ctl_table_init(&t, "rllll");
	ctl_table_row(&t, ctl_strdup("ID"), ctl_strdup("RAFT"),
	    ctl_strdup("AGENT URL"), ctl_strdup("ROLE"), ctl_strdup("LEADER"));
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		json_object *m = json_object_array_get_idx(arr, i);
		ctl_table_row(&t, ctl_asprintf("%.0f", ctl_jnum0(m, "id")),
		    ctl_strdup(ctl_jstr(m, "raft")),
		    ctl_strdup(ctl_jstr(m, "url")),
		    ctl_strdup(ctl_jstr(m, "role")),
		    ctl_strdup(json_object_get_boolean(ctl_jget(m, "leader")) ?
		            "*" :
		            ""));
	}
	ctl_table_print(&t, stdout);
	ctl_table_free(&t);
	printf("epoch %.0f%s\n", ctl_jnum0(doc, "epoch"),
	    json_object_get_boolean(ctl_jget(doc, "changing")) ?
	        "; a membership change is in progress" :
	        "");
	json_object_put(doc);
	return 0;
}

/* What the admin socket said of a removal it waited for. */
static void
print_removed(long id, const char *text)
{
	json_object *doc = json_tokener_parse(text);
	const char *outcome = ctl_jstr(doc, "outcome");
	if (outcome == NULL || outcome[0] == '\0')
		printf("member %ld removed (%.0f ms)\n", id,
		    ctl_jnum0(doc, "waited_ms"));
	else
		printf("%s (%.0f ms)\n", outcome, ctl_jnum0(doc, "waited_ms"));
	json_object_put(doc);
}

int
ctl_cmd_member(const ctl *c)
{
	const char *op = c->pos[0];
	bool add = strcmp(op, "add") == 0;
	bool remove = strcmp(op, "remove") == 0;
	bool list = strcmp(op, "list") == 0;
	int want = add ? 4 : remove ? 2 : 1;
	if ((!add && !remove && !list) || c->npos != want) {
		ctl_fail("member takes add ID RAFT_ADDR AGENT_URL, remove ID "
		         "or list");
		return EXIT_USAGE;
	}
	long id = 0;
	if (!list && !ctl_parse_int(c->pos[1], 1, LONG_MAX, &id)) {
		ctl_fail("member %s: ID is an integer > 0, not \"%s\"", op,
		    c->pos[1]);
		return EXIT_USAGE;
	}
	char *path;
	if (add) {
		char *r = ctl_escape(c->pos[2]);
		char *u = ctl_escape(c->pos[3]);
		path = ctl_asprintf(
		    "/members/add?id=%ld&raft=%s&url=%s", id, r, u);
		free(r);
		free(u);
	} else if (remove) {
		path = ctl_asprintf(
		    "/members/remove?id=%ld&wait_ms=%d", id, REMOVE_WAIT_MS);
	} else {
		path = ctl_strdup("/members");
	}
	/* Adding and removing are POSTs without a body. */
	ctl_admin_exchange x = { .path = path, .body = list ? NULL : "" };
	ctl cw = *c;
	if (remove)
		cw.timeout_ms += REMOVE_WAIT_MS;
	int rc = ctl_admin_call(&cw, &x);
	free(path);
	if (rc != 0)
		return rc;
	long status = x.status;
	char *answer = x.answer;
	if (status != 200) {
		size_t n = strcspn(answer, "\n");
		ctl_fail("member %s refused (%ld): %.*s", op, status, (int) n,
		    answer);
		free(answer);
		return status == 503 ? EXIT_UNREACHABLE : EXIT_FAIL;
	}
	if (c->json) {
		/* allotd's answer as it is: the members (and, for a
		 * removal, its outcome). */
		const char *why = NULL;
		json_object *doc = ctl_json_parse(answer, 32, &why);
		free(answer);
		if (doc == NULL) {
			ctl_fail("allotd's admin API did not answer JSON (%s)",
			    why);
			return EXIT_UNREACHABLE;
		}
		ctl_print_json(doc);
		return 0;
	}
	if (add)
		printf("member %ld is joining as a non-voter; it votes once "
		       "caught up\n",
		    id);
	else if (remove)
		print_removed(id, answer);
	rc = print_list(answer);
	free(answer);
	return rc;
}
