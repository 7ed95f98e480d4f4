#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The code in the documentation is code: every ```c block of docs/ and
README.md compiles against allot's public headers, and every ```sh block
is valid shell (bash -n). The shell blocks of docs/operations.md's
walkthrough are also run, by scripts/packages check.

A C block is a fragment of a service's code: it is compiled as the body
of a function, after every public header and declarations of the names
a service would bring (its own helpers, `agent`, `key`, `reply_429`...,
the PRELUDE below), with the compiler's warnings about what it uses
wrongly as errors. A block that is a `switch` body is put in a switch; a
line that is only "..." is dropped. A header, a renamed function or a
changed signature in allot that the docs still show fails this check.
An excerpt of allot's own code (docs/HACKING.md's worked examples) is
marked `<!-- docs-check: excerpt -->` on the line before its block and
is not compiled.

usage: docs_check.py SOURCE_ROOT"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

from checks import check, failures

PRELUDE = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <allot/allot.h>
#include <allot/client.h>
#include <allot/conc.h>
#include <allot/grpc.h>
#include <allot/identity.h>
#include <allot/jwt.h>

/* What a service brings around the fragments: its own helpers. */
enum { EP_LOOKUP, EP_EXPORT, EP_COUNT, OK = 0 };
struct svc_conn { allot_key *key[EP_COUNT]; };
struct request;
extern allot_agent *agent;
extern allot_decision d;
extern int rc;
extern uint64_t rows;
extern allot_key *key;
extern allot_conc *conc;
extern struct svc_conn *cc;
extern struct request *req;
extern const char *token, *endpoint, *spiffe_id, *identity;
extern size_t len;
extern uint32_t caller_slot;
extern void *my_ctx;
extern int e;
void my_log(void *ctx, int level, const char *id, const char *msg);
void die(const char *fmt, ...);
int reply_401(const char *why);
int reply_429(const allot_decision *d);
int reply_503(); /* with the rc or without */
uint64_t run_export(void);
uint32_t send_request(struct request *r, const char **retry_after);
int give_up(uint32_t status, int rc);
void sleep_ms(uint64_t ms);
void add_trailer(const char *key, const char *value);
void add_trailer_bin(const char *key, const uint8_t *b, int n);
int finish(int code, const char *message);
"""


def blocks(root, lang):
    """(file, line, text) of every ```LANG block."""
    files = sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    files.append(os.path.join(root, "README.md"))
    for path in files:
        lines = open(path, encoding="utf-8").read().split("\n")
        i = 0
        while i < len(lines):
            excerpt = i > 0 and "docs-check: excerpt" in lines[i - 1]
            if lines[i].strip() == "```" + lang and not excerpt:
                start = i + 1
                j = start
                while j < len(lines) and lines[j].strip() != "```":
                    j += 1
                yield (os.path.relpath(path, root), start + 1,
                       "\n".join(lines[start:j]))
                i = j
            i += 1


def c_unit(text):
    """A translation unit for the fragment `text`."""
    includes = [l for l in text.split("\n") if l.startswith("#include")]
    body = [l for l in text.split("\n")
            if not l.startswith("#include") and l.strip() != "..."]
    code = "\n".join(body)
    if re.search(r"^\s*case [A-Z_]+:", code, re.M):
        code = ("void **socket_context = NULL;\n"
                "switch ((enum MHD_ConnectionNotificationCode) 0) {\n" +
                code + "\n}\n")
        includes.append("#include <microhttpd.h>")
    # Every path out of the fragment returns an int, as a handler does.
    return (PRELUDE + "\n".join(includes) + "\n"
            "int fragment(void);\nint fragment(void)\n{\n" + code +
            "\nreturn 0;\n}\n")


def main():
    root = sys.argv[1]
    cc = os.environ.get("CC", "cc")
    work = tempfile.mkdtemp(prefix="allot-docs-")
    n = 0
    for path, line, text in blocks(root, "c"):
        n += 1
        src = os.path.join(work, "block%d.c" % n)
        with open(src, "w") as f:
            f.write(c_unit(text))
        r = subprocess.run(
            [cc, "-std=c11", "-D_GNU_SOURCE", "-fsyntax-only",
             "-I" + os.path.join(root, "include"),
             "-Werror=implicit-function-declaration",
             "-Werror=incompatible-pointer-types", "-Werror=int-conversion",
             "-Werror=return-type", "-Wno-unused", src],
            capture_output=True, text=True)
        err = "; ".join(l for l in r.stderr.splitlines() if "error" in l)
        check(r.returncode == 0, "%s:%d: the C block compiles%s" % (
            path, line, (": " + err[:400]) if err else ""))
    check(n >= 10, "%d C blocks in the docs" % n)
    m = 0
    for path, line, text in blocks(root, "sh"):
        m += 1
        r = subprocess.run(["bash", "-n"], input=text, capture_output=True,
                           text=True)
        check(r.returncode == 0, "%s:%d: the sh block is valid shell%s" % (
            path, line, (": " + r.stderr.strip()[:300]) if r.returncode
            else ""))
    check(m >= 40, "%d sh blocks in the docs" % m)
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
