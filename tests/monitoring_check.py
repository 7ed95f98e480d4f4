#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The monitoring files (packaging/monitoring) against the code and the
docs: the alerting rules are well-formed Prometheus rule groups (every
rule an alert with an expression, a severity, a summary and a runbook
that points at an existing section of docs/), the Grafana dashboard is
well-formed (unique panel ids, every target an expression), and every
metric either names is one allotd or allot-agentd exports (their
sources) and one the docs describe. A renamed metric fails here before
an on-call engineer finds a silent alert. With promtool (Debian's
prometheus package, which scripts/bootstrap installs) the rules are
checked by Prometheus itself, their unit tests run
(allot-alerts.test.yml: each alert fires on what its docs describe,
after its `for:`, and not on a spike), and the /metrics of a real allotd
and a real allot-agentd synced with it are linted (`promtool check
metrics`: HELP and TYPE lines, names, units). Without promtool it exits
77 (skipped) after the other checks.

usage: monitoring_check.py SOURCE_ROOT [ALLOTD ALLOT_AGENTD]"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, failures, free_port  # noqa: E402

import yaml  # noqa: E402

METRIC = re.compile(r"\b(allotd_[a-z0-9_]+|allot_agentd_[a-z0-9_]+)\b")
SUFFIXES = ("_bucket", "_sum", "_count")


def exported(root):
    """Metric names in the sources: allotd's string literals, and
    allot-agentd's rows (COUNTER("name", ...), GAUGE(...), its per-key
    families' table, the literals of the rest)."""
    names = set()
    for part in ("coordinator", "sidecar"):
        for d, _, files in os.walk(os.path.join(root, part)):
            for f in files:
                if not f.endswith(".c"):
                    continue
                text = open(os.path.join(d, f)).read()
                names.update(re.findall(r'"(allotd_[a-z0-9_]+)', text))
                names.update(re.findall(r"(allot_agentd_[a-z0-9_]+)", text))
                names.update("allot_agentd_" + n for n in re.findall(
                    r'\b(?:COUNTER|GAUGE|GAUGE_REAL)\(\s*"([a-z0-9_]+)"',
                    text))
                m = re.search(r"key_families\[\]\s*=\s*\{(.*?)\n\};",
                              text, re.S)
                if m:
                    names.update("allot_agentd_key_" + n for n in
                                 re.findall(r'\{\s*"([a-z0-9_]+)",\s*"'
                                            r'(?:counter|gauge)"',
                                            m.group(1)))
    return names


def documented(root):
    text = ""
    for f in os.listdir(os.path.join(root, "docs")):
        if f.endswith(".md"):
            text += open(os.path.join(root, "docs", f)).read()
    return text


def anchors(path):
    """GitHub's anchors of a Markdown file's headings."""
    out = set()
    for line in open(path):
        m = re.match(r"^#+\s+(.*)", line)
        if m:
            a = re.sub(r"[^a-z0-9 _-]", "", m.group(1).strip().lower())
            out.add(a.replace(" ", "-"))
    return out


def described(name, docs):
    """The name in the docs, whole or, in a list of one family, as the
    docs shorten it: `allot_agentd_central_asks_total`,
    `_central_allowed_total`."""
    if name in docs:
        return True
    for prefix in ("allot_agentd_key_", "allot_agentd_", "allotd_"):
        if name.startswith(prefix) and \
                "`_" + name[len(prefix):] + "`" in docs:
            return True
    return False



def get(port, path):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path),
                                    timeout=2) as r:
            return r.read().decode()
    except OSError:
        return None


def post(port, path, body):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path),
                                 data=body.encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=2) as r:
            return r.read().decode()
    except OSError:
        return None


def live_metrics(allotd, agentd):
    """The /metrics of allotd and of allot-agentd once it synced and
    decided (so that the per-quota and per-key families have series)."""
    quotas = ("quotas:\n"
              "  default: {tokens_per_second: 10, burst: 20}\n"
              "  callers:\n"
              "    - {identity: \"c1\", tokens_per_second: 5, burst: 5}\n")
    with tempfile.TemporaryDirectory(prefix="allot-monitoring-") as d:
        cfg = os.path.join(d, "quotas.yaml")
        open(cfg, "w").write(quotas)
        sync, http, api, ops = (free_port(), free_port(), free_port(),
                                free_port())
        env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
        logs = open(os.path.join(d, "log"), "w")
        procs = [subprocess.Popen(
            [allotd, "--config", cfg, "--db", os.path.join(d, "a.db"),
             "--listen", "tcp://127.0.0.1:%d" % sync,
             "--http", "127.0.0.1:%d" % http], stdout=logs, stderr=logs,
            env=env)]
        try:
            procs.append(subprocess.Popen(
                [agentd, "--config", cfg, "--grpc-listen", "none",
                 "--http-listen", "127.0.0.1:%d" % api,
                 "--metrics-listen", "127.0.0.1:%d" % ops,
                 "--coordinator", "tcp://127.0.0.1:%d" % sync],
                stdout=logs, stderr=logs, env=env))
            end = time.time() + 15
            out = {}
            while time.time() < end:
                post(api, "/v1/acquire", '{"identity":"c1"}')
                a, g = get(http, "/metrics"), get(api, "/metrics")
                if a and g and "allot_agentd_sync_connected 1" in g and \
                        "allotd_utilization_ratio{" in a:
                    out = {"allotd": a, "allot-agentd": g}
                    break
                time.sleep(0.1)
            # --metrics-listen: the same page, and the probes, without
            # the decision API.
            m = get(ops, "/metrics")
            check(m is not None and "allot_agentd_sync_connected 1" in m,
                  "allot-agentd's --metrics-listen serves /metrics")
            check(get(ops, "/readyz") is not None,
                  "and /readyz (ready once synced)")
            check(post(ops, "/v1/acquire", '{"identity":"c1"}') is None and
                  post(api, "/v1/acquire", '{"identity":"c1"}') is not None,
                  "but not the decision API (404 there, served on "
                  "--http-listen)")
            return out
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=10)


def base(name):
    for s in SUFFIXES:
        if name.endswith(s):
            return name[: -len(s)]
    return name


def main():
    if len(sys.argv) not in (2, 4):
        sys.exit(__doc__)
    root = sys.argv[1]
    mon = os.path.join(root, "packaging", "monitoring")
    rules_path = os.path.join(mon, "allot-alerts.yml")
    rules = yaml.safe_load(open(rules_path))
    dash = json.load(open(os.path.join(mon, "allot-dashboard.json")))
    have, docs = exported(root), documented(root)
    check(len(have) > 100, "found %d exported metric names" % len(have))

    used = {}
    alerts = set()
    for g in rules.get("groups", []):
        for r in g.get("rules", []):
            name = r.get("alert")
            check(name is not None and name not in alerts,
                  "rule %r: an alert with a unique name" % name)
            alerts.add(name)
            check(isinstance(r.get("expr"), str) and r["expr"].strip(),
                  "%s: an expression" % name)
            check(r.get("labels", {}).get("severity") in ("page", "ticket"),
                  "%s: severity page or ticket" % name)
            ann = r.get("annotations", {})
            check(bool(ann.get("summary")), "%s: a summary" % name)
            book = ann.get("runbook", "")
            doc, _, anchor = book.partition("#")
            path = os.path.join(root, doc)
            ok = doc.startswith("docs/") and os.path.isfile(path) and (
                anchor == "" or anchor in anchors(path))
            check(ok, "%s: runbook %r is a section of docs/" % (name, book))
            for text in [r.get("expr", "")] + list(ann.values()):
                for m in METRIC.findall(str(text)):
                    used.setdefault(base(m), set()).add("rule " + name)
    check(len(alerts) >= 10, "%d alerts" % len(alerts))

    ids = set()
    for p in dash.get("panels", []):
        check(p.get("id") not in ids, "panel %s: a unique id" % p.get("id"))
        ids.add(p.get("id"))
        for t in p.get("targets", []):
            check(bool(t.get("expr")), "panel %r: every target an "
                  "expression" % p.get("title"))
            for m in METRIC.findall(t.get("expr", "")):
                used.setdefault(base(m), set()).add(
                    "panel %r" % p.get("title"))
    check(len(ids) >= 10, "%d panels" % len(ids))

    for m, where in sorted(used.items()):
        check(m in have, "%s (%s) is exported by allotd or allot-agentd"
              % (m, ", ".join(sorted(where))))
        check(described(m, docs), "%s is described in docs/" % m)

    print("monitoring_check: %d alerts, %d panels, %d metrics named"
          % (len(alerts), len(ids), len(used)))
    promtool = shutil.which("promtool")
    if not promtool:
        print("monitoring_check: needs promtool (Debian's prometheus; "
              "scripts/bootstrap) for the rest")
        sys.exit(1 if failures else 77)
    for what in (["check", "rules", "allot-alerts.yml"],
                 ["test", "rules", "allot-alerts.test.yml"]):
        r = subprocess.run([promtool] + what, cwd=mon, capture_output=True,
                           text=True)
        check(r.returncode == 0, "promtool %s: %s" % (
            " ".join(what), (r.stdout + r.stderr).strip()))
    if len(sys.argv) == 4:
        live = live_metrics(sys.argv[2], sys.argv[3])
        check(len(live) == 2, "allotd and allot-agentd served /metrics "
              "once synced")
        for who, text in sorted(live.items()):
            r = subprocess.run([promtool, "check", "metrics"], input=text,
                               capture_output=True, text=True)
            check(r.returncode == 0 and not (r.stdout + r.stderr).strip(),
                  "promtool check metrics on %s's /metrics (%d series): %s"
                  % (who, text.count("\n") - text.count("# "),
                     (r.stdout + r.stderr).strip() or "clean"))
            # The process collector's metrics, with this process's
            # figures (common/procstat.c).
            v = {}
            for line in text.splitlines():
                if line.startswith("process_"):
                    k, _, x = line.partition(" ")
                    v[k] = float(x)
            now = time.time()
            check(set(v) == {"process_cpu_seconds_total",
                             "process_resident_memory_bytes",
                             "process_virtual_memory_bytes",
                             "process_start_time_seconds",
                             "process_open_fds", "process_max_fds"} and
                  now - 60 < v["process_start_time_seconds"] <= now + 1 and
                  v["process_resident_memory_bytes"] > 1e6 and
                  0 < v["process_open_fds"] < v["process_max_fds"] and
                  v["process_cpu_seconds_total"] >= 0,
                  "%s exports process_* with its own figures: %s" % (
                      who, ", ".join("%s %g" % kv for kv in sorted(
                          v.items()))))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
