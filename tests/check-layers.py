#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The layering check: every quoted #include in the product tree must
point down (or sideways within one part or room), as docs/HACKING.md
draws it. A file's part is its top-level folder; inside coordinator/ a
file's room is its subfolder, and the rooms are ordered:

    coordinator/*.c (allotd: the wiring)
      admin/   net/          the admin API, the listeners
        web/                 what the two HTTP servers share
          dispatch/          decode, budgets, identity proofs
            consensus/       the Raft cluster
              state/         sessions, demand, allocation, grants
                store/       the SQLite audit store

A room may include its own headers and those of any room below it;
common/ includes only itself and the public headers; agent/ and
coordinator/ never include each other; sidecar/, examples/ and tools/
use the public headers (and tools/, common/; sidecar/, common/'s
option parser, log line formats and process metrics, and the token
bucket, clock and hash of its descriptor caps, alone). sim/, bench/ and tests/
drive the internals on purpose and are not checked.

    check-layers.py SOURCE_ROOT                 check the tree
    check-layers.py SOURCE_ROOT --self-test     also check that an
        upward include added to a copy of the graph is caught

Exit 0 when the tree is layered, 1 with one line per include that is not.
"""
import os
import re
import sys

ROOMS = {  # coordinator's rooms, higher calls lower
    "": 7, "admin": 6, "net": 6, "web": 5, "dispatch": 4, "consensus": 3,
    "state": 2, "store": 1,
}
# What each part may include besides itself and include/ (the public
# headers): whole parts, or single files. Generated headers (protobuf-c's, the embedded SQL and page)
# are not files of the tree and are not checked.
PARTS = {
    "common": set(),
    "agent": {"common"},
    "coordinator": {"common"},
    "tools": {"common"},
    "sidecar": {"common/opts.h", "common/logfmt.h", "common/procstat.h",
                "common/bucket.h", "common/clock.h", "common/hash.h"},
    "examples": set(),
}
GENERATED = {"allot.pb-c.h", "schema_sql.h", "dashboard_html.h",
             "rls.pb-c.h"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def sources(root):
    for part in PARTS:
        for d, _, names in os.walk(os.path.join(root, part)):
            for n in sorted(names):
                if n.endswith((".c", ".h")):
                    yield os.path.relpath(os.path.join(d, n), root)


def resolve(root, src, name):
    """The tree file a quoted include names, as the compiler finds it:
    next to the includer, then in the include folders the build gives
    (the part's own root, coordinator/, common/, agent/, include/)."""
    here = os.path.dirname(src)
    part = src.split("/")[0]
    for d in (here, part, "coordinator", "common", "agent", "include"):
        p = os.path.normpath(os.path.join(d, name))
        if os.path.isfile(os.path.join(root, p)):
            return p
    return None


def room(path):
    parts = path.split("/")
    if parts[0] != "coordinator":
        return None
    return parts[1] if len(parts) > 2 else ""


def wrong(src, dst):
    """Why the include src -> dst crosses a layer the wrong way, or
    None."""
    sp, dp = src.split("/")[0], dst.split("/")[0]
    if dp == "include" or dp == sp and sp != "coordinator":
        return None
    if sp != dp:
        if dp in PARTS[sp] or dst in PARTS[sp]:
            return None
        return "%s/ may not include %s/" % (sp, dp)
    sr, dr = room(src), room(dst)
    if sr == dr:
        return None
    if ROOMS[dr] < ROOMS[sr]:
        return None
    return "coordinator/%s may not include coordinator/%s (a room " \
        "calls only the rooms below it)" % (sr or "(allotd)", dr)


def check(root, extra=()):
    bad = []
    edges = []
    for src in sources(root):
        with open(os.path.join(root, src), encoding="utf-8") as f:
            text = f.read()
        for name in INCLUDE.findall(text):
            edges.append((src, name))
    edges.extend(extra)
    for src, name in edges:
        if os.path.basename(name) in GENERATED:
            continue
        dst = resolve(root, src, name)
        if dst is None:
            bad.append('%s: "%s" is no file of the tree' % (src, name))
            continue
        why = wrong(src, dst)
        if why is not None:
            bad.append('%s: includes "%s" (%s): %s' % (src, name, dst, why))
    return bad


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = sys.argv[1]
    bad = check(root)
    for line in bad:
        print(line)
    if "--self-test" in sys.argv[2:]:
        # Upward includes, one per kind of rule: each must be caught.
        probes = [
            ("coordinator/store/store.c", "consensus/consensus_entry.h"),
            ("coordinator/state/state.c", "net/server.h"),
            ("coordinator/net/http.c", "admin/admin.h"),
            ("coordinator/web/reply.c", "net/http.h"),
            ("common/config.c", "agent_int.h"),
            ("agent/agent.c", "state/state.h"),
            ("sidecar/rls.c", "config.h"),
        ]
        for probe in probes:
            if not check(root, [probe])[len(bad):]:
                print("self-test: %s -> %s was not caught" % probe)
                bad.append(probe)
    if bad:
        print("check-layers: %d include(s) cross a layer the wrong way"
              % len(bad))
        return 1
    print("check-layers: every include points down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
