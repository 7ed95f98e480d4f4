/* SPDX-License-Identifier: MIT */
/*
 * allotctl diff and apply: a quota change reviewed against the config in
 * force and applied with who and why, through allotd's admin socket
 * (allotd --admin-socket; coordinator/admin/admin.h has the API). The file is
 * checked here first with the loader allotd uses (an invalid one is
 * never sent), then allotd diffs it against what is in force (per quota
 * before -> after, common/config_diff.c), allotctl adds check-config's
 * sizing with the safety margin, and apply sends it with the digest the
 * diff was made against, so that a change made by someone else in
 * between is refused rather than overwritten. The kernel tells allotd
 * who is on the other end of the socket: that is the name recorded.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>

#include <allot/allot.h>

#include "allotctl.h"
#include "config.h"

#define ADMIN_MAX_ANSWER (16u * 1024u * 1024u)

/* ---- the admin socket ---- */

/* "&name=value" URL-escaped onto `url` (the caller's, reallocated). */
static char *
add_arg(char *url, const char *name, const char *value)
{
	if (value == NULL)
		return url;
	char *v = ctl_escape(value);
	char *n = ctl_asprintf(
	    "%s%s%s=%s", url, strchr(url, '?') ? "&" : "?", name, v);
	free(v);
	free(url);
	return n;
}

int
ctl_admin_call(const ctl *c, ctl_admin_exchange *x)
{
	/* An https:// URL is allotd's --admin-listen (mutual TLS); anything
	 * else its --admin-socket. */
	bool https = strncmp(c->admin, "https://", 8) == 0;
	if (https && c->admin_cert == NULL) {
		ctl_fail("--admin %s: an https:// admin API takes mutual TLS: "
		         "give --admin-cert (and --admin-ca)",
		    c->admin);
		return EXIT_USAGE;
	}
	size_t base = strlen(c->admin);
	while (https && base > 8 && c->admin[base - 1] == '/')
		base--;
	char *url = https ?
	    ctl_asprintf("%.*s%s", (int) base, c->admin, x->path) :
	    ctl_asprintf("http://allotd%s", x->path);
	url = add_arg(url, "file", x->file);
	url = add_arg(url, "reason", x->reason);
	url = add_arg(url, "as", x->as);
	url = add_arg(url, "expect", x->expect);
	ctl_request rq = { .url = url,
		.unix_socket = https ? NULL : c->admin,
		.tls_cert = c->admin_cert,
		.tls_key = c->admin_key,
		.tls_ca = c->admin_ca,
		.http_version = CURL_HTTP_VERSION_1_1,
		.body = x->body,
		.len = x->len,
		.content_type = "application/yaml",
		.timeout_ms = c->timeout_ms,
		.max = ADMIN_MAX_ANSWER };
	CURLcode r = ctl_request_run(&rq);
	free(url);
	if (r != CURLE_OK) {
		free(rq.answer);
		if (https)
			ctl_fail("cannot reach allotd's admin API %s: %s%s",
			    c->admin, curl_easy_strerror(r),
			    r == CURLE_PEER_FAILED_VERIFICATION ||
			            r == CURLE_SSL_CACERT_BADFILE ?
			        " (is --admin-ca the CA of allotd's "
			        "certificate?)" :
			        r == CURLE_SSL_CERTPROBLEM ?
			        " (--admin-cert: a PEM with the certificate "
			        "and its key, or --admin-key)" :
			        "");
		else if (rq.oserr == EACCES || rq.oserr == EPERM)
			ctl_fail(
			    "cannot reach allotd's admin socket %s: "
			    "permission denied (it is allotd's user's, or "
			    "its --admin-group's: run as one of them)",
			    c->admin);
		else if (r == CURLE_OPERATION_TIMEDOUT)
			ctl_fail("allotd's admin socket %s: no answer within "
			         "%d ms",
			    c->admin, c->timeout_ms);
		else
			ctl_fail("cannot reach allotd's admin socket %s: %s "
			         "(is allotd running with --admin-socket?)",
			    c->admin,
			    rq.oserr != 0 ? ctl_errstr((int) rq.oserr) :
			                    curl_easy_strerror(r));
		return EXIT_UNREACHABLE;
	}
	x->status = rq.status;
	x->answer = rq.answer;
	return 0;
}

/* The answer as JSON; NULL after saying it is not. */
static json_object *
parse_answer(const ctl *c, const char *text)
{
	const char *why = "not an object";
	json_object *doc = ctl_json_parse(text, 32, &why);
	if (doc == NULL || !json_object_is_type(doc, json_type_object)) {
		ctl_fail("allotd's admin socket %s did not answer JSON (%s)",
		    c->admin, why);
		json_object_put(doc);
		return NULL;
	}
	return doc;
}

/* A refusal: allotd's one line as it is (for an invalid file, the
 * loader's FILE:LINE:COL message). The exit status. */
static int
refused(const ctl *c, const ctl_admin_exchange *x)
{
	size_t n = strcspn(x->answer, "\n");
	if (x->status == 422)
		fprintf(stderr, "%.*s\n", (int) n, x->answer);
	else
		ctl_fail("allotd refused %s %s (%ld): %.*s",
		    x->body != NULL ? "POST" : "GET", x->path, x->status,
		    (int) n, x->answer);
	return x->status == 503 ? EXIT_UNREACHABLE : EXIT_FAIL;
}

/* Send `x` and take its answer, a JSON object, into *ret (the caller
 * puts it). 0, or the exit status after saying why: a refusal, or an
 * answer that is not JSON. */
static int
admin_json(const ctl *c, ctl_admin_exchange *x, json_object **ret)
{
	int rc = ctl_admin_call(c, x);
	if (rc != 0)
		return rc;
	if (x->status != 200)
		rc = refused(c, x);
	else if ((*ret = parse_answer(c, x->answer)) == NULL)
		rc = EXIT_UNREACHABLE;
	free(x->answer);
	x->answer = NULL;
	return rc;
}

/* ---- printing ---- */

/* One change: "~ QUOTA", then before, after and what moved. */
static void
print_change(json_object *ch)
{
	const char *action = ctl_jstr(ch, "action");
	const char *sign = strcmp(action, "added") == 0 ? "+" :
	    strcmp(action, "removed") == 0              ? "-" :
	                                                  "~";
	const char *svc = ctl_jstr(ch, "service");
	const char *owner = ctl_jstr(ch, "owner");
	printf("%s %s%s%s%s%s%s\n", sign, svc[0] ? svc : "",
	    svc[0] ? " / " : "", ctl_jstr(ch, "quota"),
	    owner[0] ? " (owner " : "", owner, owner[0] ? ")" : "");
	const char *before = ctl_jstr(ch, "before");
	const char *after = ctl_jstr(ch, "after");
	const char *fields = ctl_jstr(ch, "fields");
	printf("    before: %s\n", before[0] ? before : "(none)");
	printf("    after:  %s\n", after[0] ? after : "(none)");
	if (fields[0] != '\0')
		printf("    what:   %s\n", fields);
}

/* Every change and a count; returns the number of changes. */
static size_t
print_changes(json_object *doc)
{
	json_object *arr = ctl_jget(doc, "changes");
	size_t n = arr != NULL && json_object_is_type(arr, json_type_array) ?
	    json_object_array_length(arr) :
	    0;
	size_t count[3] = { 0 };
	for (size_t i = 0; i < n; i++) {
		json_object *ch = json_object_array_get_idx(arr, i);
		const char *a = ctl_jstr(ch, "action");
		count[strcmp(a, "added") == 0     ? 0 :
		        strcmp(a, "removed") == 0 ? 1 :
		                                    2]++;
		print_change(ch);
	}
	printf("%zu change%s: %zu added, %zu removed, %zu changed\n", n,
	    n == 1 ? "" : "s", count[0], count[1], count[2]);
	return n;
}

/* The sizing check of the reference (seed 000), with the margin: the
 * ceiling (or, without one, the callers' total) against the tested
 * capacity times the margin. Returns true when it warned. */
static bool
print_sizing(const ctl *c, const allot_config *cfg)
{
	ctl_config_sizing(c, cfg);
	if (!(c->capacity > 0)) {
		printf("margin:     give --capacity RPS (the tested capacity) "
		       "to check the ceiling against it\n");
		return false;
	}
	double safe = c->capacity * c->margin;
	double total = 0;
	for (size_t i = 0; i < cfg->ncallers; i++)
		total += cfg->callers[i].rate;
	bool ceil = cfg->ceiling_rate > 0;
	double bound = ceil ? cfg->ceiling_rate : total;
	char *b = ctl_num(bound), *s = ctl_num(safe),
	     *cap = ctl_num(c->capacity);
	char *m = ctl_ratio(c->margin);
	bool warn = bound > safe;
	if (warn)
		printf("WARNING:    the %s, %s tokens/s, is above the tested "
		       "capacity x margin = %s x %s = %s: %s\n",
		    ceil ? "ceiling" : "callers' total (no ceiling)", b, cap,
		    m, s,
		    ceil ? "lower the ceiling, or test a larger capacity" :
		           "add a global_ceiling at or below it");
	else
		printf("margin:     the %s, %s tokens/s, is within the tested "
		       "capacity x margin = %s x %s = %s\n",
		    ceil ? "ceiling" : "callers' total (no ceiling)", b, cap,
		    m, s);
	free(b);
	free(s);
	free(cap);
	free(m);
	return warn;
}

/* ---- the commands ---- */

/* Load FILE here first: an invalid file is never sent. 0 with the
 * config and its text, or EXIT_FAIL after printing the loader's
 * FILE:LINE:COL message. */
static int
load(
    const char *file, allot_config **ret_cfg, char **ret_text, size_t *ret_len)
{
	char err[1024] = "";
	int rc = allot_config_load(file, err, sizeof err, ret_cfg);
	if (rc != ALLOT_OK) {
		if (err[0] != '\0')
			fprintf(stderr, "%s\n", err);
		else
			fprintf(stderr, "%s: %s\n", file, allot_strerror(rc));
		fprintf(stderr, "allotctl: nothing was sent to allotd\n");
		return EXIT_FAIL;
	}
	FILE *f = fopen(file, "rb");
	char *text = NULL;
	size_t len = 0;
	if (f != NULL) {
		char chunk[8192];
		size_t n;
		while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
			text = ctl_realloc(text, len + n + 1);
			memcpy(text + len, chunk, n);
			len += n;
		}
		fclose(f);
	}
	if (f == NULL) {
		ctl_fail("%s: %s", file, ctl_errstr(errno));
		allot_config_free(*ret_cfg);
		return EXIT_FAIL;
	}
	if (text == NULL)
		text = ctl_calloc(1, 1);
	text[len] = '\0';
	*ret_text = text;
	*ret_len = len;
	return 0;
}

/* POST /config/diff and print it with the sizing. 0 with the answer
 * (the caller puts it), or an exit status. */
static int
diff(const ctl *c, const char *file, const allot_config *cfg, const char *text,
    size_t len, json_object **ret)
{
	ctl_admin_exchange x = {
		.path = "/config/diff", .file = file, .body = text, .len = len
	};
	json_object *doc = NULL;
	int rc = admin_json(c, &x, &doc);
	if (rc != 0)
		return rc;
	*ret = doc;
	if (c->json)
		return 0;
	json_object *from = ctl_jget(doc, "from");
	printf("%s against the config in force (epoch %.0f, digest %s): "
	       "digest %s\n",
	    file, ctl_jnum0(from, "epoch"), ctl_jstr(from, "digest"),
	    ctl_jstr(ctl_jget(doc, "to"), "digest"));
	print_changes(doc);
	print_sizing(c, cfg);
	return 0;
}

int
ctl_cmd_diff(const ctl *c)
{
	const char *file = c->pos[0];
	allot_config *cfg;
	char *text;
	size_t len;
	int rc = load(file, &cfg, &text, &len);
	if (rc != 0)
		return rc;
	json_object *doc = NULL;
	rc = diff(c, file, cfg, text, len, &doc);
	if (rc == 0 && c->json)
		ctl_print_json(json_object_get(doc));
	json_object_put(doc);
	allot_config_free(cfg);
	free(text);
	return rc;
}

/* POST /config/apply, expecting the digest the diff was made against
 * (or --expect), and say what happened. */
/* In a cluster allotd answers once the config is proposed through the
 * log: wait (at most DEFAULT_WAIT_MS) until this member has installed
 * the committed config, i.e. GET /config shows epoch `epoch`, with
 * `digest` (another digest at that epoch: another change took it, and
 * the log refused this one). */
typedef enum committed {
	COMMITTED,
	NOT_IN_TIME,
	TAKEN, /* the epoch went to another change */
} committed;

static committed
wait_committed(const ctl *c, double epoch, const char *digest)
{
	for (int waited = 0; waited <= DEFAULT_WAIT_MS; waited += 50) {
		ctl_admin_exchange x = { .path = "/config" };
		if (ctl_admin_call(c, &x) != 0)
			return NOT_IN_TIME;
		json_object *doc = x.status == 200 ?
		    parse_answer(c, x.answer) :
		    NULL;
		free(x.answer);
		double now = ctl_jnum0(doc, "epoch");
		bool same = strcmp(ctl_jstr(doc, "digest"), digest) == 0;
		json_object_put(doc);
		if (now > epoch || (now == epoch && same))
			return COMMITTED;
		if (now == epoch)
			return TAKEN;
		struct timespec ts = { 0, 50 * 1000000L };
		nanosleep(&ts, NULL);
	}
	return NOT_IN_TIME;
}

static int
apply(const ctl *c, const char *file, const char *text, size_t len,
    const char *expect)
{
	ctl_admin_exchange x = { .path = "/config/apply",
		.file = file,
		.reason = c->reason,
		.as = c->as_name,
		.expect = expect,
		.body = text,
		.len = len };
	json_object *doc = NULL;
	int rc = admin_json(c, &x, &doc);
	if (rc != 0)
		return rc;
	json_object *from = ctl_jget(doc, "from"), *to = ctl_jget(doc, "to");
	if (c->json) {
		/* allotd's answer; in a cluster, "installed": whether this
		 * member installed the committed epoch in time. */
		bool ok = true;
		if (json_object_get_boolean(ctl_jget(doc, "changed")) &&
		    json_object_get_boolean(ctl_jget(doc, "proposed"))) {
			ok = wait_committed(c, ctl_jnum0(to, "epoch"),
			         ctl_jstr(to, "digest")) == COMMITTED;
			json_object_object_add(
			    doc, "installed", json_object_new_boolean(ok));
		}
		ctl_print_json(doc);
		return ok ? 0 : EXIT_FAIL;
	}
	if (!json_object_get_boolean(ctl_jget(doc, "changed"))) {
		printf("unchanged: %s has the digest in force (%s); epoch "
		       "stays %.0f\n",
		    file, ctl_jstr(to, "digest"), ctl_jnum0(to, "epoch"));
	} else if (json_object_get_boolean(ctl_jget(doc, "proposed"))) {
		double epoch = ctl_jnum0(to, "epoch");
		printf(
		    "proposed %s to the cluster: epoch %.0f -> %.0f, digest "
		    "%s -> %s\n",
		    file, ctl_jnum0(from, "epoch"), epoch,
		    ctl_jstr(from, "digest"), ctl_jstr(to, "digest"));
		committed w = wait_committed(c, epoch, ctl_jstr(to, "digest"));
		if (w == TAKEN) {
			ctl_fail("epoch %.0f went to another change committed "
			         "first: %s was not applied; diff and apply "
			         "again",
			    epoch, file);
			json_object_put(doc);
			return EXIT_FAIL;
		}
		if (w != COMMITTED) {
			ctl_fail("epoch %.0f was not committed within %d ms "
			         "(leadership may have moved): check allotctl "
			         "member list and GET /config",
			    epoch, DEFAULT_WAIT_MS);
			json_object_put(doc);
			return EXIT_FAIL;
		}
		printf("committed: every member installs epoch %.0f (and "
		       "writes its quota file); agents take it on their next "
		       "sync\n",
		    epoch);
	} else {
		printf("applied %s: epoch %.0f -> %.0f, digest %s -> %s\n",
		    file, ctl_jnum0(from, "epoch"), ctl_jnum0(to, "epoch"),
		    ctl_jstr(from, "digest"), ctl_jstr(to, "digest"));
		printf(
		    "recorded: by %s%s%s%s, reason \"%s\"%s; agents take it "
		    "on their next sync\n",
		    ctl_jstr(doc, "who"), c->as_name ? " (as " : "",
		    c->as_name ? c->as_name : "",
		    c->as_name ? ", claimed)" : "", c->reason,
		    json_object_get_boolean(ctl_jget(doc, "committed")) ?
		        " in the audit table" :
		        " (the store is failing: the audit rows are queued, "
		        "see allotd's log)");
	}
	json_object_put(doc);
	return 0;
}

int
ctl_cmd_apply(const ctl *c)
{
	const char *file = c->pos[0];
	if (c->reason == NULL || c->reason[strspn(c->reason, " ")] == '\0') {
		ctl_fail("apply needs --reason TEXT: why the change is made "
		         "(it goes into the audit table)");
		fputs("Try 'allotctl help apply'.\n", stderr);
		return EXIT_USAGE;
	}
	allot_config *cfg;
	char *text;
	size_t len;
	int rc = load(file, &cfg, &text, &len);
	if (rc != 0)
		return rc;
	json_object *doc = NULL;
	rc = diff(c, file, cfg, text, len, &doc);
	if (rc == 0) {
		/* What was shown is what is applied: the digest the diff
		 * was made against, unless the reviewer gave one. */
		char *expect = ctl_strdup(c->expect != NULL ?
		        c->expect :
		        ctl_jstr(ctl_jget(doc, "from"), "digest"));
		if (!c->json)
			putchar('\n');
		rc = apply(c, file, text, len, expect);
		free(expect);
	}
	json_object_put(doc);
	allot_config_free(cfg);
	free(text);
	return rc;
}
