/* SPDX-License-Identifier: MIT */
/*
 * What the pieces of allotctl share: the parsed command line, the exit
 * codes, the output helpers (allotctl_fmt.c), the HTTP client
 * (allotctl_http.c), the /status reader and the commands, one file per
 * family (allotctl_status.c, allotctl_reload.c, allotctl_config.c,
 * allotctl_audit.c), and the manuals (allotctl_help.c). allotctl.c parses
 * the command line and runs one command. Names here are `ctl_`, private
 * to this executable as the load generator's are `lg_`.
 */
#ifndef ALLOT_TOOLS_ALLOTCTL_H
#define ALLOT_TOOLS_ALLOTCTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include <allot/allot.h>
#include <curl/curl.h>
#include <json-c/json.h>

#include "opts.h"

#define EXIT_FAIL 1 /* the command ran and the answer is "no" */
#define EXIT_USAGE 2 /* bad command line */
#define EXIT_UNREACHABLE 3 /* allotd could not be reached or misanswered */

#define DEFAULT_HTTP "127.0.0.1:7480"
#define DEFAULT_TIMEOUT_MS 3000
#define DEFAULT_WAIT_MS 5000
/* allotd's --admin-socket when ALLOT_ADMIN_SOCKET is not set. */
#define DEFAULT_ADMIN "/run/allot/admin.sock"
#define DEFAULT_MARGIN 0.8

/* The command line, as main() parsed it; each command reads its part. */
typedef struct ctl {
	const char *http; /* HOST:PORT of allotd's HTTP endpoints */
	int timeout_ms; /* per HTTP exchange */
	long pid; /* reload --pid; 0: from --pid-file or /status */
	const char *pid_file; /* reload --pid-file */
	long wait_ms; /* reload --wait */
	bool check; /* reload: validate the file before signalling */
	double capacity; /* check-config: requests/s; 0: unknown */
	double max_overcommit; /* check-config: exit 1 above; 0: none */
	long limit; /* top-denied -n, audit --limit */
	bool show_sql; /* audit --sql */
	const char *admin; /* diff, apply, member: the admin socket, or
	                      an https:// URL (its --admin-listen) */
	const char *admin_cert; /* https: our certificate and key, one PEM */
	const char *admin_key; /* https: the key, when not in admin_cert */
	const char *admin_ca; /* https: the CA allotd's certificate is of */
	const char *reason; /* apply --reason */
	const char *as_name; /* apply --as (recorded as claimed) */
	const char *expect; /* apply --expect: digest in force, hex */
	double margin; /* diff, apply: share of --capacity to stay under */
	bool help; /* --help: print the manual and stop */
	bool json; /* --json: one JSON document on stdout instead of text */
	int npos; /* the command's positional arguments */
	char **pos;
} ctl;

/* ------------------------------------------------------------------ */
/* Commands (each returns the exit status)                             */
/* ------------------------------------------------------------------ */

int ctl_cmd_status(const ctl *c);
int ctl_cmd_replicas(const ctl *c);
int ctl_cmd_quotas(const ctl *c);
int ctl_cmd_shares(const ctl *c);
int ctl_cmd_top_denied(const ctl *c);
int ctl_cmd_reload(const ctl *c);
int ctl_cmd_check_config(const ctl *c);
/* The quota table and sizing of one view of a quota file (a config
 * without services, or one made by allot__config_select()), on stdout:
 * the quotas with their units and candidates, their review metadata,
 * then "allocation:", "ceiling:", "burst:" and, with capacity > 0
 * (requests/s tested), "capacity:" with the margin the ceiling leaves
 * below it or a warning when the ceiling is above it. Returns the
 * overcommit (the sum of the rates over the ceiling; 0 without one).
 * allotctl_config.c; allotctl diff calls it too. */
double ctl_print_sizing(const allot_config *cfg, double capacity);
int ctl_cmd_audit(const ctl *c);
int ctl_cmd_diff(const ctl *c); /* allotctl_apply.c */
int ctl_cmd_apply(const ctl *c);
int ctl_cmd_member(const ctl *c); /* allotctl_member.c */

/* ------------------------------------------------------------------ */
/* Manuals (allotctl_help.c)                                           */
/* ------------------------------------------------------------------ */

/* Bits naming the commands, for the options each one takes. */
enum {
	CTL_STATUS = 1u << 0,
	CTL_REPLICAS = 1u << 1,
	CTL_QUOTAS = 1u << 2,
	CTL_SHARES = 1u << 3,
	CTL_TOP_DENIED = 1u << 4,
	CTL_RELOAD = 1u << 5,
	CTL_CHECK_CONFIG = 1u << 6,
	CTL_AUDIT = 1u << 7,
	CTL_DIFF = 1u << 10,
	CTL_APPLY = 1u << 11,
	CTL_MEMBER = 1u << 12,
	CTL_GLOBAL = 1u << 8, /* before the command */
	CTL_COMMON = 1u << 9, /* every command that reads allotd */
};

/* parse() is finished: --help printed the manual, or help ran. */
#define CTL_DONE (-1)

/* The usage text (allotctl --help), listing the global options of the
 * option table `t` (allotctl.c). */
void ctl_usage(FILE *f, const allot__opts *t);

/* The manual of command `name`; false if there is none. `bit` is the
 * command's CTL_* bit, which selects its rows of the option table. */
bool ctl_manual(FILE *f, const char *name, unsigned bit, const allot__opts *t);

/* True if `name` has a manual (every command, and "help"). */
bool ctl_has_manual(const char *name);

/* ------------------------------------------------------------------ */
/* Output helpers (allotctl_fmt.c)                                     */
/* ------------------------------------------------------------------ */

void ctl_die_oom(void) __attribute__((noreturn));
void *ctl_calloc(size_t n, size_t size);
void *ctl_realloc(void *p, size_t size);
char *ctl_strdup(const char *s);
char *ctl_asprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* "allotctl: <message>" on stderr. */
void ctl_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void ctl_vfail(const char *fmt, va_list ap)
    __attribute__((format(printf, 1, 0)));

/* strerror() in lower case, as it reads in the middle of a sentence. */
const char *ctl_errstr(int e);

/* Numbers as people read them; every result is the caller's to free. */
char *ctl_num(double v);
char *ctl_ratio(double v);
char *ctl_pct(double part, double whole);
char *ctl_utc_ms(int64_t ms);

/* Decimal digits only, in [min, max] (min >= 0): common/opts.h's
 * parser, in the type allotctl keeps its numbers in. */
bool ctl_parse_int(const char *s, long min, long max, long *ret);

/* Rows of owned strings printed in aligned columns; a column whose
 * alignment is 'r' is right-aligned (numbers). The header is row 0. */
typedef struct ctl_table {
	size_t ncols;
	const char *align;
	char **cells;
	size_t nrows;
	size_t cap;
} ctl_table;

void ctl_table_init(ctl_table *t, const char *align);
/* Append a row of `ncols` strings; the table takes ownership. */
void ctl_table_row(ctl_table *t, ...);
/* Append a row from an array of `ncols` owned strings. */
void ctl_table_row_v(ctl_table *t, char **cells);
void ctl_table_print(const ctl_table *t, FILE *f);
void ctl_table_free(ctl_table *t);

/* ------------------------------------------------------------------ */
/* HTTP (allotctl_http.c)                                              */
/* ------------------------------------------------------------------ */

/* GET `path` from allotd at c->http. On 200 returns 0 and the body
 * (NUL-terminated, the caller's). Otherwise prints why and returns
 * EXIT_USAGE (a bad --http) or EXIT_UNREACHABLE. */
int ctl_http_get(const ctl *c, const char *path, char **ret_body);

/* Every address of the --http host is a loopback address: allotd runs
 * on this machine, so its pid means something here. */
bool ctl_http_is_local(const ctl *c);

/* ------------------------------------------------------------------ */
/* Quota files (allotctl_config.c)                                     */
/* ------------------------------------------------------------------ */

typedef struct allot_config allot_config;

/* check-config's sizing lines for `cfg` (allocation, ceiling, burst, and
 * capacity with c->capacity), without its quota table. */
void ctl_config_sizing(const ctl *c, const allot_config *cfg);

/* ------------------------------------------------------------------ */
/* The /status document (allotctl_status.c)                            */
/* ------------------------------------------------------------------ */

/* Fetch and parse /status. 0 and the document (the caller puts it), or
 * an exit code after saying why. */
int ctl_get_status(const ctl *c, json_object **ret);

/* `text` parsed whole as JSON, nested at most `depth` deep: the
 * document (the caller puts it), or NULL with *ret_why saying why. */
json_object *ctl_json_parse(const char *text, int depth, const char **ret_why);

/* Members of a json-c object, or a neutral value when absent or of
 * another type: NULL, "", NAN (jnum) or 0 (jnum0). */
json_object *ctl_jget(json_object *o, const char *key);
const char *ctl_jstr(json_object *o, const char *key);
double ctl_jnum(json_object *o, const char *key);
double ctl_jnum0(json_object *o, const char *key);

/* Print `o` on stdout as one JSON document (--json), and put it. */
void ctl_print_json(json_object *o);

/* One HTTP exchange with allotd (allotctl_http.c), over TCP or the
 * admin socket: what to send, and what came back. */
typedef struct ctl_request {
	const char *url;
	const char *unix_socket; /* NULL: TCP to the URL's host */
	/* An https:// URL: mutual TLS with this certificate (and key, or
	 * NULL: in the certificate's file), allotd's checked against
	 * `ca`. */
	const char *tls_cert, *tls_key, *tls_ca;
	long http_version; /* CURL_HTTP_VERSION_1_0 or _1_1 */
	const char *body; /* NULL: a GET; else a POST of `len` bytes */
	size_t len;
	const char *content_type; /* the body's */
	int timeout_ms;
	size_t max; /* the largest answer taken */
	/* Out. */
	CURLcode code;
	long status; /* the HTTP status, when `code` is CURLE_OK */
	long oserr; /* the errno of a failed connection, or 0 */
	bool connected; /* a connection was made */
	bool too_large; /* the answer was over `max` (CURLE_WRITE_ERROR) */
	char *answer; /* NUL-terminated, never NULL: the caller's */
	size_t answer_len;
} ctl_request;

/* Run `rq` on a libcurl handle set up the one way allotctl speaks to
 * allotd: its user agent, no proxy from the environment, no redirects,
 * http only, no signals, the timeout. Returns rq->code. */
CURLcode ctl_request_run(ctl_request *rq);

/* `s` URL-escaped (the caller's to free). */
char *ctl_escape(const char *s);

/* One request to allotd's admin socket (c->admin; allotctl_apply.c):
 * `path` with the arguments that are not NULL URL-escaped onto it, a
 * POST of `body` (`len` bytes) or, with `body` NULL, a GET. Returns 0
 * with `status` and `answer` (the caller's to free), or
 * EXIT_UNREACHABLE after saying why. Used by diff, apply and member. */
typedef struct ctl_admin_exchange {
	const char *path; /* "/config/diff" */
	const char *file; /* ?file= */
	const char *reason, *as, *expect; /* apply only */
	const char *body; /* NULL: GET */
	size_t len;
	long status; /* out */
	char *answer; /* out, the caller's */
} ctl_admin_exchange;
int ctl_admin_call(const ctl *c, ctl_admin_exchange *x);

#endif /* ALLOT_TOOLS_ALLOTCTL_H */
