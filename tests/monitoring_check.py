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
prometheus package) the rules are also checked by Prometheus itself.

usage: monitoring_check.py SOURCE_ROOT"""
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import check, failures  # noqa: E402

import yaml  # noqa: E402

METRIC = re.compile(r"\b(allotd_[a-z0-9_]+|allot_agentd_[a-z0-9_]+)\b")
SUFFIXES = ("_bucket", "_sum", "_count")


def exported(root):
    """Metric names in the sources: string literals, and allot-agentd's
    per-key families (allot_agentd_key_ + each name of its table)."""
    names = set()
    for part in ("coordinator", "sidecar"):
        for d, _, files in os.walk(os.path.join(root, part)):
            for f in files:
                if not f.endswith(".c"):
                    continue
                text = open(os.path.join(d, f)).read()
                names.update(re.findall(r'"(allotd_[a-z0-9_]+)', text))
                names.update(re.findall(r"(allot_agentd_[a-z0-9_]+)", text))
                m = re.search(r"names\[\]\s*=\s*\{([^}]*)\}", text)
                if m and "allot_agentd_key_" in text:
                    for n in re.findall(r'"([a-z_]+)"', m.group(1)):
                        names.add("allot_agentd_key_" + n)
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


def base(name):
    for s in SUFFIXES:
        if name.endswith(s):
            return name[: -len(s)]
    return name


def main():
    if len(sys.argv) != 2:
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

    promtool = shutil.which("promtool")
    if promtool:
        r = subprocess.run([promtool, "check", "rules", rules_path],
                           capture_output=True, text=True)
        check(r.returncode == 0, "promtool check rules: %s" %
              (r.stdout + r.stderr).strip())
    else:
        print("monitoring_check: no promtool (Debian's prometheus); the "
              "rules' PromQL is not parsed here")
    print("monitoring_check: %d alerts, %d panels, %d metrics named"
          % (len(alerts), len(ids), len(used)))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
