#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""liballot's ABI is the one recorded in packaging/abi: abidw (libabigail)
reads the built library's types and symbols as its public headers
declare them, and abidiff compares them with the baseline. Any change
fails, an addition too (a later removal of it would otherwise pass
unseen): within 0.x a minor release may change the ABI
(docs/compatibility.md), but only on purpose, with a CHANGELOG entry
under "Changed" and the baseline written again:

    tests/abi_check.py --update LIB HEADERS BASELINE

usage: abi_check.py [--update] LIB HEADERS_DIR BASELINE"""
import os
import shutil
import subprocess
import sys
import tempfile


def abidw(lib, headers, out):
    subprocess.run(["abidw", "--headers-dir", headers, "--no-corpus-path",
                    "--drop-private-types", "--no-show-locs",
                    "--out-file", out, lib], check=True)


def main():
    args = sys.argv[1:]
    update = args[:1] == ["--update"]
    if update:
        args = args[1:]
    if len(args) != 3:
        sys.exit(__doc__)
    lib, headers, baseline = args
    for tool in ("abidw", "abidiff", "readelf"):
        if shutil.which(tool) is None:
            print("abi_check: needs %s (scripts/bootstrap)" % tool)
            sys.exit(77)
    sections = subprocess.run(["readelf", "-S", lib], capture_output=True,
                              text=True).stdout
    if ".debug_info" not in sections:
        print("abi_check: %s has no debug information (a build without "
              "-g): nothing to compare" % lib)
        sys.exit(77)
    if update:
        abidw(lib, headers, baseline)
        print("abi_check: wrote %s" % baseline)
        return
    with tempfile.TemporaryDirectory(prefix="allot-abi-") as tmp:
        now = os.path.join(tmp, "now.abi")
        abidw(lib, headers, now)
        d = subprocess.run(["abidiff", baseline, now], capture_output=True,
                           text=True)
    print(d.stdout.strip())
    if d.returncode & 3:
        print("FAIL abidiff could not compare (%d): %s" % (
            d.returncode, d.stderr.strip()))
        sys.exit(1)
    if d.returncode & 12:
        print("FAIL liballot's ABI differs from %s%s. If that is meant, "
              "list it in CHANGELOG.md under \"Changed\" and write the "
              "baseline again: tests/abi_check.py --update %s %s %s" % (
                  baseline,
                  " (incompatible)" if d.returncode & 8 else "",
                  lib, headers, baseline))
        sys.exit(1)
    print("ok   liballot's ABI is the baseline's (%s)" % baseline)


if __name__ == "__main__":
    main()
