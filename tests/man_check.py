#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The manual pages are pages man reads well: groff renders each without
a warning, lexgrog finds its NAME line (whatis and apropos use it), it
has the sections a manual page has. Those of the programs
(packaging/man/help2roff.py) name every long option the program's
--help names; liballot(3) names every function the public headers
export (--api); allot-quotas(5) names every key the quota file's loader
takes (--keys: the field table, the rate units and the top-level keys,
read from the loader's sources), so that none of them can drift.

usage: man_check.py [--api PAGE HEADERS_DIR] [--keys PAGE FIELDS_C SCHEMA_C]
                    PAGE PROGRAM [PAGE PROGRAM]..."""
import os
import re
import shutil
import subprocess
import sys

from checks import check, failures


def readable(page):
    """groff renders `page` cleanly and lexgrog finds its NAME line; its
    roff text and section names."""
    name = page.rsplit("/", 1)[-1]
    g = subprocess.run(["groff", "-man", "-ww", "-z", page],
                       capture_output=True, text=True)
    check(g.returncode == 0 and not g.stderr.strip(),
          "%s: groff -ww renders it without a warning %s" % (
              name, g.stderr.strip()[:300]))
    lg = subprocess.run(["lexgrog", page], capture_output=True, text=True)
    check(lg.returncode == 0 and " - " in lg.stdout,
          "%s: lexgrog finds its NAME line (%s)" % (name, lg.stdout.strip()))
    roff = open(page).read()
    return name, roff, re.findall(r"^\.SH (.*)$", roff, re.M)


def plain(roff):
    """The words of a page: roff's escapes and fonts taken out."""
    t = roff.replace("\\-", "-").replace("\\e", "\\")
    t = re.sub(r"\\f[BIRP]", "", t)
    return t.replace("\\_", "_").replace("\\&", "")


def names_all(page, what, wanted):
    name, roff, sections = readable(page)
    check("NAME" in sections and "SYNOPSIS" in sections,
          "%s: NAME and SYNOPSIS (has %s)" % (name, ", ".join(sections)))
    text = plain(roff)
    missing = [w for w in wanted
               if not re.search(r"(?<![A-Za-z0-9_])%s(?![A-Za-z0-9_])" %
                                re.escape(w), text)]
    check(len(wanted) >= 5 and not missing,
          "%s: the %d %s are in it%s" % (
              name, len(wanted), what,
              " (missing %s)" % " ".join(missing) if missing else ""))


def api_functions(headers):
    out = set()
    for h in sorted(os.listdir(headers)):
        if h.endswith(".h"):
            src = open(os.path.join(headers, h)).read()
            out |= set(re.findall(
                r"ALLOT(?:_JWT)?_API\s[^;(]*?\b(allot_[a-z0-9_]+)\s*\(",
                src))
    return sorted(out)


def quota_keys(fields_c, schema_c):
    keys = set(re.findall(r'\.key = "([a-z_]+)"',
                          open(fields_c).read()))
    schema = open(schema_c).read()
    keys |= set(re.findall(r'"(tokens_per_[a-z]+)"', schema))
    # The keys of the file's structure the loader walks.
    keys |= {"quotas", "default", "callers", "identity", "endpoints",
             "plans", "plan", "endpoint_weights", "global_ceiling",
             "shed_order", "overcommit", "services"}
    return sorted(keys)


def main():
    args = sys.argv[1:]
    for tool in ("groff", "lexgrog"):
        if shutil.which(tool) is None:
            print("man_check: needs %s (scripts/bootstrap)" % tool)
            sys.exit(77)
    while args[:1] in (["--api"], ["--keys"]):
        if args[0] == "--api" and len(args) >= 3:
            names_all(args[1], "functions of the public headers",
                      api_functions(args[2]))
            args = args[3:]
        elif args[0] == "--keys" and len(args) >= 4:
            names_all(args[1], "keys of the quota file",
                      quota_keys(args[2], args[3]))
            args = args[4:]
        else:
            sys.exit(__doc__)
    if not args or len(args) % 2:
        sys.exit(__doc__)
    for page, prog in zip(args[::2], args[1::2]):
        name, roff, sections = readable(page)
        check("NAME" in sections and "SYNOPSIS" in sections and
              any(s.endswith("OPTIONS") for s in sections),
              "%s: NAME, SYNOPSIS and OPTIONS (has %s)" % (
                  name, ", ".join(sections)))
        text = roff.replace("\\-", "-").replace("\\e", "\\")
        helptext = subprocess.run([prog, "--help"], capture_output=True,
                                  text=True).stdout
        opts = sorted(set(re.findall(r"--[a-z][a-z0-9-]*", helptext)))
        missing = [o for o in opts if o not in text]
        check(len(opts) >= 3 and not missing,
              "%s: the %d long options of --help are in it%s" % (
                  name, len(opts),
                  " (missing %s)" % " ".join(missing) if missing else ""))
    if failures:
        print("%d checks failed" % len(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
