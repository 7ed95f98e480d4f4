#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Runs the main demo (scripts/demo.py) in a short mode against the
build under test and checks its summary: the shares followed the replica
count, the noisy backfill was held to its quota while the callers under
their quota (checkout, search) lost at most 3 tokens at start-up and at most 1 %
of their tokens over the whole run, and the database answers the audit
queries printed at the end. With --cluster, the demo runs a Raft cluster of three allotd
members, kills the leader and restarts it as a follower: a new leader
took over with a higher epoch, the callers under their quota saw no 429
across the failover, the backfill stayed within R x t + B counted from one
member's file (each holds the whole audit), and every member's file
answers the audit queries."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from checks import check, failures

build = os.environ["ALLOT_BUILD_DIR"]
src = os.environ["ALLOT_SOURCE_DIR"]
work = tempfile.mkdtemp(prefix="allot-demo-test-")
summary = os.path.join(work, "summary.json")
cluster = "--cluster" in sys.argv[1:]
# The cluster's run is 2 s longer: its failover seconds are not steady
# ones (below), and the steady check wants at least five.
r = subprocess.run([sys.executable, os.path.join(src, "scripts", "demo.py"),
                    "--build-dir", build,
                    "--duration", "18" if cluster else "16",
                    "--dir", os.path.join(work, "run"), "--no-live",
                    "--summary-json", summary] +
                   (["--cluster"] if cluster else []),
                   capture_output=True, text=True, timeout=150)
print(r.stdout[-6000:])
print(r.stderr[-3000:], file=sys.stderr)


check(r.returncode == 0, "demo exited 0 (got %d)" % r.returncode)
s = json.load(open(summary))
c = s["callers"]

# Shares followed the replica count: 4 replicas, 3 after the kill, 5
# after two more joined, each as a live count allotd recorded.
counts = s["live_replica_counts"]
for n in (3, 4, 5):
    check(n in counts, "allotd saw %d live replicas (saw %s)" % (n, counts))

# The noisy backfill (10x its quota) was held to it: admitted tokens over
# the run at most B + R x (W + T), with W the seconds that have usage rows
# plus one for the partial seconds at either end (reports are filed under
# the second they arrive in). Unlimited, it would admit ~500/s.
b = c["backfill"]
limit = b["burst"] + b["quota"] * (b["seconds"] + 1 + 0.1)
check(b["admitted_tokens"] <= limit,
      "backfill admitted %d <= %.0f" % (b["admitted_tokens"], limit))
check(b["denied_tokens"] > b["admitted_tokens"],
      "backfill was mostly denied (%d denied, %d admitted)" % (
          b["denied_tokens"], b["admitted_tokens"]))

# The quota change applied midway (allotctl apply, backfill 50/s ->
# 25/s) reached every replica: from 2 T after it, the backfill is held to
# the new quota (its old burst may still be in the buckets).
if "after_apply" in b:
    a = b["after_apply"]
    lim = a["old_burst"] + a["quota"] * (a["seconds"] + 1 + 0.1)
    check(a["seconds"] >= 3 and a["admitted_tokens"] <= lim,
          "backfill after the apply admitted %d <= %.0f in %d s" % (
              a["admitted_tokens"], lim, a["seconds"]))
    q = subprocess.run(["sqlite3", "-readonly", s["db"],
                        "SELECT count(*) FROM v_quota_changes WHERE who "
                        "LIKE '%demo-operator%' AND action = 'changed'"],
                       capture_output=True, text=True)
    check(q.returncode == 0 and q.stdout.strip() == "1",
          "the change is audited in v_quota_changes (%s)" % (
              q.stdout.strip() or q.stderr.strip()))

# The others were not disturbed by the noisy backfill: callers under
# their quota (checkout 300/s of 500, search 200/s of 300) lose at most
# 1 % of their tokens in steady seconds (away from start-up, replica
# changes and, in a cluster, the leader failover, which the failover
# checks below bound on their own, as the demo's summary counts them; usually 0, up to 0.7 %
# seen when the machine was loaded; the check allowed 2 % before) and
# at most 1 % over the whole run, start-up and churn included (5 %, then
# 4 % before; 0 tokens in every run on an idle machine and at most 1
# token in 9 runs beside a CPU-bound benchmark, since start-up costs
# nothing and a crashed replica's share moves after 2 T).
# What is left: the load generator keeps search on one replica's
# connections (sticky), which move when replicas come and go, and a
# newcomer after start-up gets its first grant in its first Reply, T/2
# after its Welcome (docs/allocation.md, "Second pass").
for name in ("checkout", "search"):
    x = c[name]
    st = x["steady_admitted_tokens"] + x["steady_denied_tokens"]
    check(x["steady_seconds"] >= 5 and st > 0 and
          x["steady_denied_tokens"] <= 0.01 * st,
          "%s denied %d of %d tokens in %d steady seconds" % (
              name, x["steady_denied_tokens"], st, x["steady_seconds"]))
    # Start-up: the replicas announce the four the deployment starts
    # with (--initial-replicas), so each one's first Welcome carries its
    # quarter and nothing is refused while they register
    # (docs/allocation.md, "Start-up"); 25-57 tokens were, before.
    # With the central reserve a replica's bucket holds the body of
    # its traffic and the rest asks the reserve; on two CPUs shared by
    # ten processes a stall longer than the 20 ms wait refuses what
    # asks: one CI run lost 62 of checkout's 600 tokens (p99 latency
    # 135 ms), and 3-71 were lost beside four busy loops at a higher
    # priority (tokens the split kept: it refused 0). Since a bucket
    # that drops most of its tokens reports them after T/8
    # (docs/allocation.md, "When it fails"), 0-11 beside those loops
    # (4 runs): the bodies grow from a quarter of the equal share over
    # about 8 intervals, and what they do not hold yet asks (the gap
    # issue 25's note names). At most 10 % of the start-up's tokens, 3
    # at least, as in the cluster.
    # The cluster starts three allotd members and their Raft beside the
    # replicas: there its first Asks took longer still, and search (on
    # one replica, its body not yet known) lost 18-36 of its 400 in 2 of
    # 8 runs, 0-3 in the others: at most 10 % of the start-up there, the
    # known gap of issue 25's note (a replica's first Syncs on the
    # classic split cost the burst families 3-5 points, measured).
    sd = x["startup_denied_tokens"]
    sent0 = x["sent_rate"] * x["startup_seconds"]
    check(x["startup_seconds"] == 2 and
          sd <= max(3, 0.10 * sent0),
          "%s denied %d tokens in the first %d s (start-up)" % (
              name, sd, x["startup_seconds"]))
    total = x["admitted_tokens"] + x["denied_tokens"]
    frac = x["denied_tokens"] / total if total else 1
    check(total > 0 and frac <= 0.01,
          "%s denied %d of its %d tokens in all, start-up and churn "
          "included" % (name, x["denied_tokens"], total))

# The record is exact (docs/operations.md, "The accounting guarantee"):
# per caller whose requests cost one token, what the audit holds equals
# what the load generator got an answer for (admitted or 429), across the
# replica kill (drained first), the config change, the failover and the
# shutdown.
for name, x in sorted(c.items()):
    if x.get("answered_tokens") is None:
        continue
    audited = x["admitted_tokens"] + x["denied_tokens"]
    check(audited == x["answered_tokens"],
          "%s: the audit holds %d tokens, the load generator got %d "
          "answers" % (name, audited, x["answered_tokens"]))

# The database answers the audit queries.
if cluster:
    what = " ".join(e["what"] for e in s["events"])
    check("killed the leader" in what and "restarted member" in what,
          "the leader was killed and restarted")
    check(len(s["dbs"]) == 3, "three members' files (%d)" % len(s["dbs"]))
    f = s.get("failover", {})
    check(f.get("new_leader") not in (None, f.get("killed")),
          "a new leader took over (%s after %s)" % (
              f.get("new_leader"), f.get("killed")))
    check(f.get("epoch_after", 0) > f.get("epoch_before", 0) > 0,
          "the epoch rose (%s to %s)" % (f.get("epoch_before"),
                                         f.get("epoch_after")))
    # Under quota (checkout sends 300/s of 500, search 200/s of 300):
    # from the kill to two seconds after the new leader served, the
    # replicas ran on their grants while the new leader learnt what they
    # held. Their grants are the bodies of their traffic: what goes
    # above them waits for a central reserve, which no leader serves
    # until the agents have registered with the new one; meanwhile each
    # runs on its part of the reserve (Share.standby, docs/allocation.md
    # "When it fails"): 0-2 requests refused in the window (1-4 % before
    # the part, once 7.6 % on a loaded CI machine). At most 5 %.
    fc = f.get("callers", {})
    for name in ("checkout", "search"):
        w = fc.get(name, {}).get("across", {})
        ok = w.get("admitted_per_s", 0) * w.get("seconds", 0)
        check(w.get("seconds", 0) >= 2 and 0 <= w.get("denied", -1) <=
              0.05 * (ok + w.get("denied", 0)),
              "%s saw at most 5 %% 429s across the failover (%s s, %s "
              "denied)" % (name, w.get("seconds"), w.get("denied")))

for db in s["dbs"] or [s["db"]]:
    # v_unknown_callers: the demo's unregistered caller, named.
    for view in ("v_consumption_per_minute", "v_denied", "v_share_history",
                 "v_replica_churn", "v_events", "v_live_replicas",
                 "v_unknown_callers"):
        q = subprocess.run(["sqlite3", "-readonly", db,
                            "SELECT count(*) FROM %s" % view],
                           capture_output=True, text=True)
        n = int(q.stdout.strip() or "0") if q.returncode == 0 else -1
        # Every member holds the usage and events of the whole run;
        # shares and replica joins are each leader's own
        # (docs/operations.md, "Audit on every member"), so a member
        # that never led has none.
        empty_ok = view == "v_live_replicas" or (
            cluster and view in ("v_share_history", "v_replica_churn"))
        check(n > 0 or (empty_ok and n == 0),
              "%s: %s answers (%d rows)" % (os.path.basename(db), view, n))

# The run's files are kept for a failure (its log names the directory)
# and removed otherwise.
if failures:
    print("kept for inspection: %s" % work)
else:
    shutil.rmtree(work, ignore_errors=True)
sys.exit(1 if failures else 0)
