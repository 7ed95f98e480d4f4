#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The systemd units of packaging/systemd start what they say: each
ExecStart, with this build's programs and a temporary directory in place
of /usr/bin, /etc/allot, /var/lib/allot, /run/allot and /var/cache, runs:
allotd answers /healthz, takes a SIGHUP (ExecReload) and stops cleanly on
SIGTERM; allot-agentd, pointed at it through AGENTD_OPTS, answers
/readyz once synced. Every option the units pass is one the programs
accept, and the units parse (systemd-analyze verify, where it runs)."""
import grp
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from checks import check, failures, free_port

build = os.environ["ALLOT_BUILD_DIR"]
src = os.environ["ALLOT_SOURCE_DIR"]
units = os.path.join(src, "packaging", "systemd")
work = tempfile.mkdtemp(prefix="allot-units-")



def exec_start(unit):
    """The unit's ExecStart as an argument list (continuations joined)."""
    text = open(os.path.join(units, unit)).read().replace("\\\n", " ")
    for line in text.splitlines():
        if line.startswith("ExecStart="):
            return shlex.split(line[len("ExecStart="):])
    raise SystemExit("%s: no ExecStart" % unit)


def localise(argv, ports, env):
    """/usr/bin/X -> this build's X; system paths -> the work dir; the
    unit's ports -> free ones; $VAR -> env's words; the admin group ->
    ours."""
    progs = {"allotd": "coordinator/allotd",
             "allot-agentd": "sidecar/allot-agentd"}
    out = []
    for a in argv:
        if a.startswith("$"):
            out += shlex.split(env.get(a[1:], ""))
            continue
        if a.startswith("/usr/bin/"):
            a = os.path.join(build, progs[os.path.basename(a)])
        for old, new in (("/etc/allot", work + "/etc"),
                         ("/var/lib/allot", work + "/lib"),
                         ("/run/allot", work + "/run"),
                         ("/var/cache/allot-agentd", work + "/cache")):
            a = a.replace(old, new)
        for old, new in ports.items():
            a = a.replace(old, new)
        out.append(a)
    if "--admin-group" in out:
        out[out.index("--admin-group") + 1] = grp.getgrgid(os.getgid()).gr_name
    return out


def get(port, path):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path),
                                    timeout=1) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception:
        return None


def wait_for(port, path, want, seconds=10):
    t = time.monotonic() + seconds
    while time.monotonic() < t:
        if get(port, path) == want:
            return True
        time.sleep(0.05)
    return False


for d in ("etc", "lib", "run", "cache"):
    os.makedirs(os.path.join(work, d))
shutil.copy(os.path.join(src, "tests", "data", "reference.yaml"),
            os.path.join(work, "etc", "quotas.yaml"))

if shutil.which("systemd-analyze"):
    for unit in ("allotd.service", "allotd@.service",
                 "allot-agentd.service"):
        r = subprocess.run(["systemd-analyze", "verify", "--man=no",
                            os.path.join(units, unit)],
                           capture_output=True, text=True)
        # The programs are not installed here: only that complaint.
        bad = [l for l in r.stderr.splitlines()
               if l.strip() and "is not executable" not in l
               and "No such file" not in l]
        check(not bad, "systemd-analyze verify %s%s" % (
            unit, (": " + "; ".join(bad)) if bad else ""))

pa, ph = str(free_port()), str(free_port())
argv = localise(exec_start("allotd.service"),
                {"7400": pa, "7480": ph}, {"ALLOTD_OPTS": ""})
log = open(os.path.join(work, "allotd.log"), "w")
allotd = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
check(wait_for(int(ph), "/healthz", 200), "allotd from its unit answers "
      "/healthz (%s)" % " ".join(argv[1:]))
check(os.path.exists(os.path.join(work, "run", "admin.sock")),
      "its admin socket is where allotctl looks (/run/allot/admin.sock)")

gp, hp = str(free_port()), str(free_port())
agent_opts = ("--coordinator tcp://127.0.0.1:%s --service orders "
              "--grpc-listen 127.0.0.1:%s --http-listen 127.0.0.1:%s"
              % (pa, gp, hp))
aargv = localise(exec_start("allot-agentd.service"), {},
                 {"AGENTD_OPTS": agent_opts})
alog = open(os.path.join(work, "agentd.log"), "w")
agentd = subprocess.Popen(aargv, stdout=alog, stderr=subprocess.STDOUT)
check(wait_for(int(hp), "/readyz", 200),
      "allot-agentd from its unit is ready once synced (%s)"
      % " ".join(aargv[1:]))
agentd.send_signal(signal.SIGTERM)
check(agentd.wait(timeout=10) == 0, "allot-agentd stops cleanly")

allotd.send_signal(signal.SIGHUP)  # ExecReload
time.sleep(0.3)
check(allotd.poll() is None and get(int(ph), "/healthz") == 200,
      "allotd takes ExecReload's SIGHUP")
allotd.send_signal(signal.SIGTERM)
check(allotd.wait(timeout=15) == 0, "allotd stops cleanly on SIGTERM")
check(os.path.exists(os.path.join(work, "lib", "allot.db")),
      "its store is in the unit's StateDirectory")

# A cluster member's unit, allotd@m1: every option from its YAML file
# (--options /etc/allot/allotd-m1.yaml): a list for a repeatable option,
# the command line winning over the file.
pa2, ph2 = str(free_port()), str(free_port())
with open(os.path.join(work, "etc", "allotd-m1.yaml"), "w") as f:
    f.write("# allotd's options\n"
            "listen: [tcp://127.0.0.1:%s, ipc://%s/run/allotd.ipc]\n"
            "http: 127.0.0.1:%s\n"
            "interval-ms: 250\n"
            "admin_socket: %s/run/admin2.sock\n" % (pa2, work, ph2, work))
argv = localise([a.replace("%i", "m1") for a in exec_start(
    "allotd@.service")], {}, {}) + [
    "--config", os.path.join(work, "etc", "quotas.yaml"), "--db",
    os.path.join(work, "lib", "opts.db"), "--interval-ms", "200"]
olog = open(os.path.join(work, "allotd-options.log"), "w")
allotd = subprocess.Popen(argv, stdout=olog, stderr=subprocess.STDOUT)
ok = wait_for(int(ph2), "/healthz", 200)
check(ok, "allotd@m1 takes its options from /etc/allot/allotd-m1.yaml "
      "(%s)" % " ".join(argv[1:3]))
if ok:
    with urllib.request.urlopen("http://127.0.0.1:%s/status" % ph2,
                                timeout=2) as r:
        st = json.load(r)
    check(st["settings"]["interval_ms"] == 200,
          "the command line wins over the file (interval_ms %s)"
          % st["settings"]["interval_ms"])
check(os.path.exists(os.path.join(work, "run", "admin2.sock")) and
      os.path.exists(os.path.join(work, "run", "allotd.ipc")),
      "every listener of the file's list, and its admin_socket")
allotd.send_signal(signal.SIGTERM)
check(allotd.wait(timeout=15) == 0, "that allotd stops cleanly")

if failures:
    print("kept for inspection: %s" % work)
    for f in ("allotd.log", "agentd.log", "allotd-options.log"):
        print(open(os.path.join(work, f)).read()[-2000:])
else:
    shutil.rmtree(work, ignore_errors=True)
sys.exit(1 if failures else 0)
