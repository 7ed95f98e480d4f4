#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The daemons' log formats (common/logfmt.h): with --log-format json
every line allotd and allot-agentd write on stderr is one JSON object
with ts, level, program, id and msg, valid even when a message carries
quotes, backslashes, control characters and bytes that are not UTF-8 (a
quota file whose name holds them); with stderr on the journal
($JOURNAL_STREAM naming it) and no journal socket to send entries to,
the default is the syslog priority prefix journald reads; a format not
known is refused at start."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from checks import check, failures, free_port

build = os.environ["ALLOT_BUILD_DIR"]
src = os.environ["ALLOT_SOURCE_DIR"]
work = tempfile.mkdtemp(prefix="allot-logs-")
LEVELS = {"emerg", "alert", "crit", "error", "warning", "notice", "info",
          "debug"}
ID = re.compile(r"^[A-Z]+(-[A-Z0-9]+)+$")

# A quota file name with what JSON must escape, and bytes not UTF-8:
# allotd names it in its start-up lines.
odd = os.path.join(work.encode(), b'q "a"\\b\x01\xff\xfe.yaml')
shutil.copy(os.path.join(src, "tests", "data", "reference.yaml"),
            odd)


def run(argv, seconds, env=None, stderr_path=None):
    """Run a daemon for `seconds`, stop it; its stderr as bytes."""
    path = stderr_path or os.path.join(work, "stderr")
    with open(path, "wb") as err:
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err,
                             env=env)
        time.sleep(seconds)
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=15)
    with open(path, "rb") as f:
        return rc, f.read()


def json_lines(name, data):
    lines = data.splitlines()
    bad = []
    ids = set()
    for line in lines:
        try:
            line.decode("ascii")
            o = json.loads(line)
            ok = (set(o) == {"ts", "level", "program", "id", "msg"} and
                  o["level"] in LEVELS and ID.match(o["id"]) and
                  o["program"] == name and
                  re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$",
                           o["ts"]))
            ids.add(o["id"])
        except (UnicodeDecodeError, ValueError, KeyError):
            ok = False
        if not ok:
            bad.append(line[:200])
    check(lines and not bad, "%s --log-format json: %d lines, each one "
          "ASCII JSON object with ts, level, program, id, msg%s" % (
              name, len(lines), (": not " + repr(bad[:2])) if bad else ""))
    return ids


allotd = os.path.join(build, "coordinator", "allotd")
base = [allotd, "--config", odd, "--db", os.path.join(work, "a.db"),
        "--listen", "tcp://127.0.0.1:%d" % free_port(), "--http", "off"]
rc, out = run(base + ["--log-format", "json"], 1.0)
check(rc == 0, "allotd stops cleanly (%d)" % rc)
ids = json_lines("allotd", out)
starts = [json.loads(l) for l in out.splitlines()
          if b"ALLOTD-START" in l]
check(starts and 'q \\"a\\"\\\\b' in json.dumps(starts[0]["msg"]) and
      "\x01" in starts[0]["msg"] and "\xff" in starts[0]["msg"],
      "the quota file's odd name survives, escaped, in ALLOTD-START")
check({"ALLOTD-START", "ALLOTD-DRAIN"} <= ids,
      "the stable ids are the id field (%s)" % ", ".join(sorted(ids)))

agentd = os.path.join(build, "sidecar", "allot-agentd")
rc, out = run([agentd, "--config", odd, "--grpc-listen", "none",
               "--http-listen", "127.0.0.1:%d" % free_port(),
               "--log-format", "json"], 0.8)
check(rc == 0, "allot-agentd stops cleanly (%d)" % rc)
json_lines("allot-agentd", out)

# stderr on the journal: journal entries by default; with no journal
# socket to send them to (as on CI: journal_check.py binds one), the
# priority prefix on stderr. A machine whose journald listens gets the
# entries there instead, and this part says so.
jpath = os.path.join(work, "journal")
open(jpath, "w").close()
st = os.stat(jpath)
env = dict(os.environ, JOURNAL_STREAM="%d:%d" % (st.st_dev, st.st_ino))
journald = os.path.exists("/run/systemd/journal/socket")
if journald:
    print("note: journald listens here: the prefix fallback is "
          "journal_check.py's to check")
for name, argv in () if journald else (("allotd", base), ("allot-agentd", [
        agentd, "--config", odd, "--grpc-listen", "none", "--http-listen",
        "127.0.0.1:%d" % free_port()])):
    rc, out = run(argv, 0.8, env=env, stderr_path=jpath)
    lines = out.splitlines()
    check(lines and all(re.match(rb"^<[0-7]>", l) for l in lines),
          "%s on the journal: every line has the priority prefix "
          "(%d lines)" % (name, len(lines)))

for argv in (base, [agentd, "--config", odd]):
    r = subprocess.run(argv + ["--log-format", "xml"], capture_output=True,
                       text=True, errors="replace")
    check(r.returncode == 2 and "expects text, json, journal or auto" in
          r.stderr, "%s refuses --log-format xml" %
          os.path.basename(argv[0]))

if failures:
    print("kept for inspection: %s" % work)
else:
    shutil.rmtree(work, ignore_errors=True)
sys.exit(1 if failures else 0)
