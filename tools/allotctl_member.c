/* SPDX-License-Identifier: MIT */
/*
 * allotctl member add|remove|list: the coordinator cluster's membership
 * at run time, through an allotd member's admin socket (GET /members,
 * POST /members/add, POST /members/remove; coordinator/admin.h). Adding
 * and removing run on the leader: another member answers 421 naming the
 * leader's agent URL, which is printed. A new member joins as a
 * non-voter, catches up, then votes (list shows its role); removing the
 * leader hands leadership over first.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "allotctl.h"

#define ANSWER_MAX (1u << 20)

typedef struct reply {
	char *buf;
	size_t len;
} reply;

static size_t
on_data(char *data, size_t size, size_t n, void *ud)
{
	reply *a = ud;
	size_t got = size * n;
	if (a->len + got > ANSWER_MAX)
		return 0;
	a->buf = ctl_realloc(a->buf, a->len + got + 1);
	memcpy(a->buf + a->len, data, got);
	a->len += got;
	a->buf[a->len] = '\0';
	return got;
}

/* One exchange with the admin socket: 0 with the status and the answer
 * (the caller's), or EXIT_UNREACHABLE after saying why. */
static int
call(const ctl *c, const char *path, bool post, long *ret_status,
    char **ret_answer)
{
	CURL *e = curl_easy_init();
	if (e == NULL)
		ctl_die_oom();
	char *url = ctl_asprintf("http://allotd%s", path);
	reply a = { 0 };
	curl_easy_setopt(e, CURLOPT_UNIX_SOCKET_PATH, c->admin);
	curl_easy_setopt(e, CURLOPT_URL, url);
	curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(e, CURLOPT_PROXY, "");
	curl_easy_setopt(e, CURLOPT_NOPROXY, "*");
	curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http");
	curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long) c->timeout_ms);
	curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
	curl_easy_setopt(e, CURLOPT_WRITEDATA, &a);
	if (post) {
		curl_easy_setopt(e, CURLOPT_POSTFIELDS, "");
		curl_easy_setopt(
		    e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) 0);
	}
	CURLcode r = curl_easy_perform(e);
	if (r == CURLE_OK)
		curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, ret_status);
	curl_easy_cleanup(e);
	free(url);
	if (r != CURLE_OK) {
		free(a.buf);
		ctl_fail("cannot reach allotd's admin socket %s: %s (is "
		         "allotd running with --admin-socket?)",
		    c->admin, curl_easy_strerror(r));
		return EXIT_UNREACHABLE;
	}
	*ret_answer = a.buf != NULL ? a.buf : ctl_calloc(1, 1);
	return 0;
}

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
		CURL *e = curl_easy_init();
		if (e == NULL)
			ctl_die_oom();
		char *r = curl_easy_escape(e, c->pos[2], 0);
		char *u = curl_easy_escape(e, c->pos[3], 0);
		path = ctl_asprintf(
		    "/members/add?id=%ld&raft=%s&url=%s", id, r, u);
		curl_free(r);
		curl_free(u);
		curl_easy_cleanup(e);
	} else if (remove) {
		path = ctl_asprintf("/members/remove?id=%ld", id);
	} else {
		path = ctl_strdup("/members");
	}
	long status = 0;
	char *answer = NULL;
	int rc = call(c, path, !list, &status, &answer);
	free(path);
	if (rc != 0)
		return rc;
	if (status != 200) {
		size_t n = strcspn(answer, "\n");
		ctl_fail("member %s refused (%ld): %.*s", op, status, (int) n,
		    answer);
		free(answer);
		return status == 503 ? EXIT_UNREACHABLE : EXIT_FAIL;
	}
	if (add)
		printf("member %ld is joining as a non-voter; it votes once "
		       "caught up\n",
		    id);
	else if (remove)
		printf("member %ld is being removed\n", id);
	rc = print_list(answer);
	free(answer);
	return rc;
}
