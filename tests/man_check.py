#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The manual pages (packaging/man/help2roff.py) are pages man reads
well: groff renders each without a warning, lexgrog finds its NAME line
(whatis and apropos use it), it has the sections a manual page has, and
every long option the program's --help names is in it.

usage: man_check.py PAGE PROGRAM [PAGE PROGRAM]..."""
import re
import shutil
import subprocess
import sys

from checks import check, failures


def main():
    args = sys.argv[1:]
    if not args or len(args) % 2:
        sys.exit(__doc__)
    for tool in ("groff", "lexgrog"):
        if shutil.which(tool) is None:
            print("man_check: needs %s (scripts/bootstrap)" % tool)
            sys.exit(77)
    for page, prog in zip(args[::2], args[1::2]):
        name = page.rsplit("/", 1)[-1]
        g = subprocess.run(["groff", "-man", "-ww", "-z", page],
                           capture_output=True, text=True)
        check(g.returncode == 0 and not g.stderr.strip(),
              "%s: groff -ww renders it without a warning %s" % (
                  name, g.stderr.strip()[:300]))
        lg = subprocess.run(["lexgrog", page], capture_output=True,
                            text=True)
        check(lg.returncode == 0 and " - " in lg.stdout,
              "%s: lexgrog finds its NAME line (%s)" % (
                  name, lg.stdout.strip()))
        roff = open(page).read()
        sections = re.findall(r"^\.SH (.*)$", roff, re.M)
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
