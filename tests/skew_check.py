#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Version skew: a previous release's agents against this allotd, and
this release's agents against the previous allotd (docs/compatibility.md,
"The wire protocol"). Each way, one allotd and two allot-agentd replicas
of one service share a caller's quota of 20 tokens/s (burst 20); the
agents must register and sync (both replicas live on allotd), hold the
caller to the quota within the accuracy bound (docs/allocation.md) while
it asks far more, and have what they admitted booked by allotd.

usage: skew_check.py OLD_BUILD_DIR NEW_BUILD_DIR

Each build directory holds coordinator/allotd and sidecar/allot-agentd
(scripts/test builds the previous release, `git worktree` of the commit
docs/compatibility.md names, beside the suites)."""
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from checks import check, failures

RATE, BURST, SECS = 20.0, 20.0, 3.0
QUOTAS = """quotas:
  default: {tokens_per_second: 1000, burst: 1000}
  callers:
    - {identity: skew, tokens_per_second: 20, burst: 20}
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port, path):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path),
                                timeout=2) as r:
        return r.read().decode()


def metric(text, series):
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


def acquire(port):
    req = urllib.request.Request(
        "http://127.0.0.1:%d/v1/acquire" % port,
        data=json.dumps({"identity": "skew", "endpoint": "/x"}).encode(),
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=2) as r:
        return json.loads(r.read())["allowed"]


def wait_until(what, fn, secs=15):
    end = time.time() + secs
    while time.time() < end:
        try:
            if fn():
                check(True, what)
                return True
        except OSError:
            pass
        time.sleep(0.05)
    check(False, "%s within %d s" % (what, secs))
    return False


def run(tmp, allotd_dir, agentd_dir, label):
    cfg = os.path.join(tmp, "quotas.yaml")
    with open(cfg, "w") as f:
        f.write(QUOTAS)
    port, http = free_port(), free_port()
    procs = []
    log = open(os.path.join(tmp, "log-%s.txt" % label.replace(" ", "-")),
               "w")
    try:
        procs.append(subprocess.Popen(
            [os.path.join(allotd_dir, "coordinator", "allotd"),
             "--config", cfg, "--db", os.path.join(tmp, label + ".db"),
             "--listen", "tcp://127.0.0.1:%d" % port,
             "--http", "127.0.0.1:%d" % http, "--interval-ms", "50"],
            stdout=log, stderr=log))
        if not wait_until(label + ": allotd answers /healthz",
                          lambda: "ok" in get(http, "/healthz")):
            return
        agents = []
        for i in range(2):
            ap = free_port()
            agents.append(ap)
            procs.append(subprocess.Popen(
                [os.path.join(agentd_dir, "sidecar", "allot-agentd"),
                 "--config", cfg, "--grpc-listen", "none",
                 "--http-listen", "127.0.0.1:%d" % ap,
                 "--coordinator", "tcp://127.0.0.1:%d" % port,
                 "--service", "skew", "--replica-id", "r%d" % i,
                 "--sync-interval-ms", "50", "--initial-replicas", "2"],
                stdout=log, stderr=log))
        for ap in agents:
            if not wait_until(
                    label + ": an agent registers and syncs",
                    lambda: metric(get(ap, "/metrics"),
                                   "allot_agentd_sync_connected") == 1):
                return
        wait_until(label + ": allotd counts both replicas",
                   lambda: metric(get(http, "/metrics"),
                                  'allotd_replicas{service="skew"}') == 2)
        # Far above the quota: 100 requests a second to each replica.
        admitted, asked, t0 = 0, 0, time.time()
        while time.time() - t0 < SECS:
            for ap in agents:
                admitted += acquire(ap)
                asked += 1
            time.sleep(0.01)
        took = time.time() - t0
        bound = BURST + RATE * (took + 0.25) + 2
        check(asked > 2 * bound and 0.7 * RATE * took <= admitted <= bound,
              "%s: %d of %d admitted in %.2f s, within the bound %.0f and "
              "above 70 %% of the rate" % (label, admitted, asked, took,
                                            bound))

        def booked():
            v = metric(get(http, "/metrics"),
                       'allotd_allowed_tokens_total{service="skew",'
                       'quota="skew"}')
            return v is not None and v >= admitted

        wait_until(label + ": allotd books the %d admitted" % admitted,
                   booked)
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    old, new = sys.argv[1:]
    with tempfile.TemporaryDirectory(prefix="allot-skew-") as tmp:
        run(tmp, new, old, "previous agents, this allotd")
        run(tmp, old, new, "these agents, the previous allotd")
    if failures:
        print("%d checks failed" % len(failures))
        sys.exit(1)


if __name__ == "__main__":
    main()
