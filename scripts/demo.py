#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The main job: allot protecting a real service, live.

Starts allotd with a SQLite file, four replicas of the example protected
service (HTTPS, mutual TLS, liballot embedded and synced with allotd) and
the load generator with the callers of the reference configuration:
checkout (critical), search (standard), reporting (batch, /export), an
unknown caller and a misconfigured backfill sending ten times its quota.
Traffic is sticky: most of a caller's requests land on its home replica.

Every second it shows, per caller, what was sent, admitted and denied,
the quota and the global admitted rate against it (the error in % and in
units of one sync interval of traffic), each replica's share of every
quota and the coordinator's state. A quarter in, the backfill's quota is
halved with `allotctl apply` (reviewed, recorded with who and why in
v_quota_changes) and allotd pushes the new file to every replica, which
enforce it within two sync intervals, without a restart. Midway one
replica is killed without warning, later two more start, and the shares
follow the replica count.
At the end: a summary computed from the database allotd wrote, and the
sqlite3 commands to audit the run.

With --cluster, allotd runs as a Raft cluster of three members (m1, m2,
m3; docs/operations.md, "Cluster"): one leader allocates, the others
follow, and every member's SQLite file holds the whole audit. The
replicas are given the three members as seeds and follow the leader. The
view adds which member leads and its epoch; midway the LEADER is killed
with SIGKILL, a new one takes over (a higher epoch, after waiting out the
old lease and learning what the replicas hold), and later the old one is
restarted as a follower. The summary adds the failover (who led, the
epochs, each caller's admitted rate before, across and after it) and
reads the audit from one member's file.

Run through scripts/demo, which installs packages and builds first.
"""
import argparse
import json
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request

SPIFFE = "spiffe://prod.example.internal/ns/"
CALLERS = {
    # name: (identity, quota tokens/s, burst, priority, sent req/s, mix)
    "checkout": (SPIFFE + "payments/sa/checkout", 500, 1000, "critical",
                 300, "/lookup:1"),
    "search": (SPIFFE + "search/sa/search", 300, 600, "standard", 200,
               "/lookup:1"),
    "reporting": (SPIFFE + "analytics/sa/reporting", 100, 200, "batch", 5,
                  "/export?rows=1000:1"),
    "backfill": (SPIFFE + "batch/sa/backfill", 50, 100, "batch", 500,
                 "/lookup:1"),
    "unknown": (SPIFFE + "misc/sa/unregistered", None, None, None, 15,
                "/lookup:1"),
}
DEFAULT_QUOTA = (10, 20)
# The change applied midway (single allotd): backfill's (rate, burst).
APPLIED = (25, 50)
INTERVAL_MS = 100
ELECTION_MS = 500  # the cluster's election timeout and leader lease
LEASE_MS = 3000  # allotd's grant lease (--lease-ms)


def config_yaml(backfill=None, review=None):
    """The quota file; `backfill` overrides its (rate, burst), `review`
    adds owner/reason metadata to it (the change applied midway)."""
    lines = [
        "# The reference configuration (docs/configuration.md) plus a",
        "# backfill job whose owner set its client to ten times this.",
        "quotas:",
        "  default:",
        "    tokens_per_second: %d" % DEFAULT_QUOTA[0],
        "    burst: %d" % DEFAULT_QUOTA[1],
        "    shared: true",
        "    priority: low",
        "  callers:",
    ]
    for name, (ident, rate, burst, prio, _, _) in CALLERS.items():
        if rate is None:
            continue
        if name == "backfill" and backfill:
            rate, burst = backfill
        lines += [
            '    - identity: "%s"' % ident,
            "      tokens_per_second: %d" % rate,
            "      burst: %d" % burst,
            "      priority: %s" % prio,
        ]
        if name == "backfill" and review:
            lines += ['      %s: "%s"' % kv for kv in review]
    lines += [
        "  endpoint_weights:",
        "    default: 1",
        '    "/lookup": 1',
        '    "/export": 20',
        "  global_ceiling:",
        "    tokens_per_second: 1000",
        "    shed_order: [low, batch, standard, critical]",
    ]
    return "\n".join(lines) + "\n"


_ports_given = set()


def free_port():
    """A port nothing listens on now, never one given before in this
    run: ports are picked before the processes that bind them start, and
    the kernel may hand a released port out again (a cluster member once
    got another member's HTTP port for its Raft address). It comes from
    below the kernel's ephemeral range: one from it may meanwhile become
    the local port of an outgoing connection (an agent dialling), and
    the daemon that binds it later would fail. The test scripts use it
    too (tests/checks.py)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        lo = 32768
    while True:
        want = random.randrange(10000, lo) if lo > 11000 else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", want))
            except OSError:
                continue
            port = s.getsockname()[1]
        if port not in _ports_given:
            _ports_given.add(port)
            return port


def http_json(port, path, timeout=1.0):
    try:
        with urllib.request.urlopen(
                "http://127.0.0.1:%d%s" % (port, path),
                timeout=timeout) as r:
            return json.loads(r.read().decode())
    except Exception:
        return None


class Demo:
    def __init__(self, args):
        self.args = args
        self.build = os.path.abspath(args.build_dir)
        self.root = os.path.dirname(os.path.dirname(os.path.abspath(
            __file__)))
        self.dir = args.dir or tempfile.mkdtemp(prefix="allot-demo-")
        os.makedirs(self.dir, exist_ok=True)
        self.db = os.path.join(self.dir, "allot.db")
        self.admin = os.path.join(self.dir, "admin.sock")
        self.applied_at = None
        # Cluster mode: name -> {"sync", "http", "db"}; the sync URL list
        # the replicas get (one URL for a single allotd).
        self.members = {}
        self.failover = {}
        self.coordinators = None
        self.procs = {}
        self.replicas = {}  # name -> (port, Popen)
        self.events = []
        self.t0 = None
        self.history = []
        self.live = not args.no_live and sys.stdout.isatty()

    # ---- processes ----

    def log(self, msg):
        t = time.monotonic() - self.t0 if self.t0 else 0.0
        line = "[%5.1fs] %s" % (t, msg)
        self.events.append({"t": round(t, 1), "what": msg})
        print(line, flush=True)

    def spawn(self, name, argv, wait_for=None, timeout=15):
        logf = open(os.path.join(self.dir, name + ".log"), "w")
        p = subprocess.Popen(argv, stdout=subprocess.PIPE if wait_for
                             else logf, stderr=logf, text=True)
        self.procs[name] = p
        if wait_for:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                line = p.stdout.readline()
                if not line:
                    break
                logf.write(line)
                logf.flush()
                if wait_for in line:
                    # Keep draining stdout into the log.
                    import threading

                    def drain():
                        for ln in p.stdout:
                            logf.write(ln)
                            logf.flush()
                    threading.Thread(target=drain, daemon=True).start()
                    return p
            raise SystemExit("demo: %s did not start; see %s" % (
                name, os.path.join(self.dir, name + ".log")))
        return p

    def certs(self):
        cdir = os.path.join(self.dir, "certs")
        ids = ["%s=%s" % (n, c[0]) for n, c in CALLERS.items()]
        subprocess.run([os.path.join(self.root, "scripts", "mkcerts"),
                        cdir] + ids, check=True, stdout=subprocess.DEVNULL)
        return cdir

    def start_allotd(self):
        self.sync_port = free_port()
        self.http_port = free_port()
        self.coordinators = "tcp://127.0.0.1:%d" % self.sync_port
        self.spawn("allotd", [
            os.path.join(self.build, "coordinator", "allotd"),
            "--config", self.cfg, "--db", self.db,
            "--listen", "tcp://127.0.0.1:%d" % self.sync_port,
            "--http", "127.0.0.1:%d" % self.http_port,
            "--admin-socket", self.admin,
            "--interval-ms", str(INTERVAL_MS), "--expiry-intervals", "5",
            "--lease-ms", "3000"])
        self.await_http(self.http_port, "allotd")

    def apply_change(self):
        """Midway, the backfill's owner asks for half its quota: the
        change goes through review (allotctl diff) and is applied with
        who and why (allotctl apply); allotd pushes it to every replica
        (the config plane), which enforce it within 2 T."""
        new = os.path.join(self.dir, "quotas-v2.yaml")
        with open(new, "w") as f:
            f.write(config_yaml(
                backfill=APPLIED,
                review=(("owner", "batch-team"),
                        ("reason", "halve the backfill while the "
                         "orders migration runs"))))
        r = subprocess.run([
            os.path.join(self.build, "tools", "allotctl"), "apply", new,
            "--admin", self.admin, "--as", "demo-operator",
            "--reason", "backfill owner asked for half"],
            capture_output=True, text=True)
        with open(os.path.join(self.dir, "apply.log"), "w") as f:
            f.write(r.stdout + r.stderr)
        if r.returncode != 0:
            raise SystemExit("demo: allotctl apply failed (%d): %s" % (
                r.returncode, (r.stdout + r.stderr).strip()))
        last = [ln for ln in r.stdout.splitlines() if ln.strip()]
        self.log("allotctl apply: backfill %d/s -> %d/s (%s); every "
                 "replica enforces it within 2 T, no restart" % (
                     CALLERS["backfill"][1], APPLIED[0],
                     last[-1] if last else "applied"))

    def await_http(self, port, name):
        deadline = time.monotonic() + 10
        while http_json(port, "/status") is None:
            if time.monotonic() > deadline:
                raise SystemExit("demo: %s did not start; see %s" % (
                    name, os.path.join(self.dir, name + ".log")))
            time.sleep(0.05)

    # ---- cluster mode ----

    def start_cluster(self):
        for i in (1, 2, 3):
            name = "m%d" % i
            self.members[name] = {
                "id": i, "sync": free_port(), "http": free_port(),
                "raft": free_port(),
                "db": os.path.join(self.dir, "allot-%s.db" % name)}
        # The replicas' seed list: every member (NAME=URL, the names
        # only label their log lines); they learn the rest from answers.
        self.coordinators = ",".join(
            "%s=tcp://127.0.0.1:%d" % (n, m["sync"])
            for n, m in self.members.items())
        for name in self.members:
            self.start_member(name)
        self.http_port = self.members["m1"]["http"]
        self.db = self.members["m1"]["db"]
        deadline = time.monotonic() + 15
        while self.leader(self.statuses())[0] is None:
            if time.monotonic() > deadline:
                raise SystemExit("demo: no cluster leader; see %s" %
                                 self.dir)
            time.sleep(0.05)
        # A leader learns for one grant lease plus two intervals after it
        # starts serving (docs/operations.md, "Taking over"): replicas
        # that start meanwhile get no grant and run on their bootstrap
        # split, the whole quota each here. The replicas start after it,
        # so that the run shows the failover's cost, not that one.
        time.sleep((LEASE_MS + 2 * INTERVAL_MS) / 1000.0 + 0.3)

    def start_member(self, name):
        m = self.members[name]
        argv = [os.path.join(self.build, "coordinator", "allotd"),
                "--config", self.cfg, "--db", m["db"],
                "--listen", "tcp://127.0.0.1:%d" % m["sync"],
                "--http", "127.0.0.1:%d" % m["http"],
                "--interval-ms", str(INTERVAL_MS),
                "--expiry-intervals", "5", "--lease-ms", str(LEASE_MS),
                "--raft-id", str(m["id"]),
                "--raft-addr", "127.0.0.1:%d" % m["raft"],
                "--election-ms", str(ELECTION_MS)]
        for n, o in self.members.items():
            argv += ["--seed", "%d=127.0.0.1:%d=tcp://127.0.0.1:%d" % (
                o["id"], o["raft"], o["sync"])]
        self.spawn(name, argv)
        self.await_http(m["http"], name)

    def leader(self, sts):
        """(name, epoch) of the member serving as leader, or (None, 0)."""
        for n, st in sts.items():
            cl = st.get("cluster") or {}
            if cl.get("serving"):
                return n, cl.get("epoch", 0)
        return None, 0

    def statuses(self):
        """/status of every member that answers (one allotd: itself)."""
        if not self.members:
            st = http_json(self.http_port, "/status")
            return {"allotd": st} if st else {}
        out = {}
        for n, m in self.members.items():
            p = self.procs.get(n)
            if p is not None and p.poll() is None:
                st = http_json(m["http"], "/status")
                if st:
                    out[n] = st
        return out

    def owners(self, sts):
        """quota identity -> (member, its quota entry of 'orders'), from
        the member that allocates: the leader (one allotd: itself)."""
        out = {}
        lead = self.leader(sts)[0] if self.members else None
        for n, st in sts.items():
            if self.members and n != lead:
                continue
            for s in st.get("services", []):
                if s.get("name") != "orders":
                    continue
                for q in s.get("quotas", []):
                    out.setdefault(q["quota"], (n, q, s))
        return out

    def start_replica(self, name):
        port = free_port()
        p = self.spawn(name, [
            os.path.join(self.build, "examples", "allot-example-service"),
            "--config", self.cfg, "--listen", "127.0.0.1:%d" % port,
            "--tls-cert", os.path.join(self.certdir, "server.pem"),
            "--tls-key", os.path.join(self.certdir, "server.key"),
            "--ca", os.path.join(self.certdir, "ca.pem"),
            "--coordinator", self.coordinators,
            "--service", "orders", "--replica-id", name,
            "--sync-interval-ms", str(INTERVAL_MS),
            # The deployment starts with four: each one's first Welcome
            # carries its quarter (docs/allocation.md, "Start-up").
            "--initial-replicas", "4",
            # Every caller of the demo, and the demo's own look at
            # /stats, come from 127.0.0.1: the per-address cap (32)
            # would turn the demo away from a replica the load
            # generator still holds idle connections to.
            "--max-per-address", "1024",
            "--export-ms", "0.005"], wait_for="listening on")
        self.replicas[name] = (port, p)
        self.write_targets()
        return p

    def write_targets(self):
        tmp = self.targets + ".tmp"
        with open(tmp, "w") as f:
            for name, (port, _) in sorted(self.replicas.items()):
                f.write("https://127.0.0.1:%d\n" % port)
        os.rename(tmp, self.targets)

    def start_loadgen(self, duration):
        argv = [os.path.join(self.build, "tools", "allot-loadgen"),
                "--ca", os.path.join(self.certdir, "ca.pem"),
                "--targets-file", self.targets,
                "--duration", str(duration), "--stats-file", self.stats,
                "--seed", "7", "--json", "-q",
                "--max-requests", str(int(duration * 1400) + 1000)]
        for name, (_, _, _, _, sent, mix) in CALLERS.items():
            spec = ("name=%s,cert=%s,key=%s,rate=%g,mix=%s,sticky=0.8,"
                    "concurrency=%d" % (
                        name, os.path.join(self.certdir, name + ".pem"),
                        os.path.join(self.certdir, name + ".key"),
                        sent * self.args.scale, mix,
                        8 if name == "reporting" else 128))
            argv += ["--caller", spec]
        out = open(os.path.join(self.dir, "loadgen.json"), "w")
        err = open(os.path.join(self.dir, "loadgen.log"), "w")
        self.procs["loadgen"] = subprocess.Popen(argv, stdout=out,
                                                 stderr=err)

    def replica_stats(self, port):
        """A replica's /stats over mutual TLS (any caller's
        certificate; /stats is not rate limited), or {"error": why}."""
        ctx = ssl.create_default_context(
            cafile=os.path.join(self.certdir, "ca.pem"))
        ctx.check_hostname = False
        ctx.load_cert_chain(os.path.join(self.certdir, "checkout.pem"),
                            os.path.join(self.certdir, "checkout.key"))
        try:
            with urllib.request.urlopen(
                    "https://127.0.0.1:%d/stats" % port, timeout=3.0,
                    context=ctx) as r:
                return json.loads(r.read().decode())
        except Exception as e:
            return {"error": repr(e)[:200]}

    def await_durable(self, port, timeout=6.0):
        """After the load generator stopped sending to the replica on
        `port` (it re-reads its targets once a second): wait until the
        replica's account holds nothing allotd has not confirmed."""
        # While traffic reaches it, its account always holds a second
        # (each new second's first decision comes long before the
        # closed one is confirmed): nothing pending, twice 0.3 s apart,
        # means its traffic has moved and all it decided is durable.
        deadline = time.monotonic() + timeout
        u, zeros = {}, 0
        while time.monotonic() < deadline:
            st = self.replica_stats(port)
            u = (st.get("sync") or {}).get("usage") or st
            zeros = zeros + 1 if u.get("pending") == 0 else 0
            if zeros == 2:
                return ""
            time.sleep(0.3)
        return " (not confirmed in %g s: %s)" % (timeout, json.dumps(u))

    def stop_all(self):
        # The replicas first: each one's Leave carries its last Usage
        # records, which allotd (or the cluster's leader) books and
        # commits before it is stopped in turn.
        first = [n for n in self.procs if n.startswith("replica")]
        for name in first:
            if self.procs[name].poll() is None:
                self.procs[name].send_signal(signal.SIGTERM)
        for name in first:
            try:
                self.procs[name].wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.procs[name].kill()
                self.procs[name].wait()
        # A cluster's leader proposes them with its next flush (a
        # second); a single allotd commits them when it stops.
        time.sleep(1.5 if first and self.members else 0)
        for name, p in list(self.procs.items()):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for name, p in list(self.procs.items()):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    # ---- the live view ----

    def last_stats(self):
        try:
            with open(self.stats, "rb") as f:
                f.seek(0, 2)
                size = f.tell()
                f.seek(max(0, size - 65536))
                lines = f.read().decode(errors="replace").splitlines()
            for line in reversed(lines):
                try:
                    return json.loads(line)
                except ValueError:
                    continue
        except OSError:
            pass
        return None

    def frame(self):
        sts = self.statuses()
        st = next(iter(sts.values()), None)
        lg = self.last_stats()
        t = time.monotonic() - self.t0
        own = self.owners(sts)
        svc = next((o[2] for o in own.values()), None)
        quotas = {ident: o[1] for ident, o in own.items()}
        callers = {c.get("name"): c for c in (lg or {}).get("callers", [])}
        self.history.append({"t": round(t, 1), "status": svc,
                             "loadgen": lg})
        out = []
        out.append("allot demo  t=%4.0fs  coordinator epoch %s, %s live "
                   "replicas, sync interval %d ms   dashboard "
                   "http://127.0.0.1:%d/" % (
                       t, (st or {}).get("config", {}).get("epoch", "?"),
                       (svc or {}).get("live_replicas", "?"), INTERVAL_MS,
                       self.http_port))
        if self.members:
            lead, epoch = self.leader(sts)
            self.history[-1]["leader"] = lead
            self.history[-1]["epoch"] = epoch
            out.append("cluster: %s" % (", ".join(
                "%s %s" % (n, "LEADER (epoch %d%s)" % (
                    epoch, ", learning" if any(
                        o[1].get("learning") for o in own.values())
                    else "") if n == lead else "follower")
                for n in sts) or "no member") +
                ("" if lead else "; no leader serving: replicas run on "
                 "their grants"))
        out.append("%-10s %8s %8s %9s %8s %9s %10s %8s" % (
            "caller", "quota/s", "sent/s", "admit/s", "429/s",
            "global/s", "error", "(R*T)"))
        for name, c in CALLERS.items():
            ident = c[0] if c[1] is not None else "default"
            q = quotas.get(ident, {})
            lc = callers.get(name, {})
            last = lc.get("last", lc)
            rate = q.get("rate") or 0
            adm = q.get("admitted_per_s") or 0
            err = (adm - rate) / rate * 100 if rate else 0
            units = (adm - rate) / (rate * INTERVAL_MS / 1000.0) \
                if rate else 0
            out.append("%-10s %8.0f %8.0f %9.0f %8.0f %9.1f %9.1f%% "
                       "%8.2f" % (
                           name, rate, last.get("sent", 0),
                           last.get("ok", 0), last.get("denied", 0), adm,
                           err, units))
        out.append("shares (tokens/s) per replica:")
        reps = sorted({s["replica_id"] for q in quotas.values()
                       for s in q.get("shares", [])})
        names = [n for n in CALLERS if CALLERS[n][1] is not None]
        out.append("  %-12s" % "replica" + "".join(
            "%11s" % n for n in names) + "%11s" % "default")
        for r in reps:
            row = "  %-12s" % r
            for n in names + ["default"]:
                ident = CALLERS[n][0] if n != "default" else "default"
                sh = [s for s in quotas.get(ident, {}).get("shares", [])
                      if s["replica_id"] == r]
                row += "%11.1f" % (sh[0]["rate"] if sh else 0)
            out.append(row)
        for e in self.events[-4:]:
            out.append("  event %5.1fs: %s" % (e["t"], e["what"]))
        text = "\n".join(out)
        if self.live:
            sys.stdout.write("\x1b[H\x1b[2J" + text + "\n")
        else:
            print(text + "\n")
        sys.stdout.flush()

    # ---- the run ----

    def run(self):
        args = self.args
        print("allot demo: working directory %s" % self.dir)
        self.cfg = os.path.join(self.dir, "quotas.yaml")
        with open(self.cfg, "w") as f:
            f.write(config_yaml())
        self.certdir = self.certs()
        self.targets = os.path.join(self.dir, "targets.txt")
        self.stats = os.path.join(self.dir, "loadgen.jsonl")
        self.t0 = time.monotonic()
        if args.cluster:
            self.start_cluster()
            self.log("allotd cluster up: members %s, dashboards %s, "
                     "databases %s" % (
                         self.coordinators, ", ".join(
                             "http://127.0.0.1:%d/" % m["http"]
                             for m in self.members.values()),
                         ", ".join(m["db"] for m in
                                   self.members.values())))
        else:
            self.start_allotd()
            self.log("allotd up: sync tcp://127.0.0.1:%d, dashboard "
                     "http://127.0.0.1:%d/, database %s" % (
                         self.sync_port, self.http_port, self.db))
        for i in range(1, 5):
            self.start_replica("replica-%d" % i)
        self.log("4 replicas of the protected service up (mTLS)")
        d = args.duration
        self.start_loadgen(d)
        self.log("load generator started: %s" % ", ".join(
            "%s %g/s" % (n, c[4] * args.scale) for n, c in
            CALLERS.items()))
        kill_at, add_at, apply_at = 0.4 * d, 0.65 * d, 0.25 * d
        member_kill_at, member_back_at = 0.5 * d, 0.8 * d
        if self.members:
            # The replica changes come before the leader's kill, so that
            # the failover is seen on its own (a newcomer's first grants
            # and an expired replica's share are not the failover's).
            kill_at, add_at = 0.05 * d, 0.3 * d
        killed = added = False
        victim = None
        start = time.monotonic()
        while time.monotonic() - start < d:
            time.sleep(1.0)
            el = time.monotonic() - start
            if not self.members and self.applied_at is None and \
                    el >= apply_at:
                self.apply_change()
                self.applied_at = time.time()
            if not killed and el >= kill_at:
                port, p = self.replicas.pop("replica-2")
                self.write_targets()
                # Its traffic moves away first and its account empties
                # (every decision durable at allotd): a SIGKILL loses
                # what an agent decided and allotd has not yet confirmed
                # (docs/operations.md, v_audit_gaps), which would leave
                # the audit short of the load generator's count.
                drained = self.await_durable(port)
                p.kill()
                p.wait()
                self.procs.pop("replica-2", None)
                self.log("killed replica-2 with SIGKILL (no leave) once "
                         "its traffic had moved and its decisions were "
                         "durable%s: its connection closed, so allotd "
                         "drops it once silent for 2 T (docs/protocol.md, "
                         "Expiry)" % drained)
                killed = True
            if not added and el >= add_at:
                self.start_replica("replica-5")
                self.start_replica("replica-6")
                self.log("started replica-5 and replica-6")
                added = True
            if self.members and victim is None and el >= member_kill_at:
                victim = self.kill_leader()
            if self.members and victim and not self.failover.get(
                    "new_leader"):
                self.await_takeover()
            if self.members and victim and el >= member_back_at:
                self.start_member(victim)
                self.log("restarted member %s on its log and database: "
                         "it rejoins as a follower and catches up" %
                         victim)
                self.failover["restarted_at"] = round(
                    time.monotonic() - self.t0, 1)
                victim = ""

            self.frame()
        lg = self.procs["loadgen"]
        try:
            lg.wait(timeout=15)
        except subprocess.TimeoutExpired:
            lg.send_signal(signal.SIGINT)
            lg.wait(timeout=10)
        final = http_json(self.http_port, "/status")
        if self.members:
            # The audit is read from one member's file: every member
            # holds all of it. The new leader's (up the whole run).
            name = self.failover.get("new_leader") or "m1"
            self.db = self.members[name]["db"]
        self.stop_all()
        self.summary(final)

    def kill_leader(self):
        name, epoch = self.leader(self.statuses())
        name = name or "m1"
        p = self.procs.pop(name)
        p.kill()
        p.wait()
        t = time.monotonic() - self.t0
        self.failover = {"killed": name, "epoch_before": epoch,
                         "killed_at": round(t, 1),
                         "killed_unix": time.time()}
        self.log("killed the leader %s (epoch %d) with SIGKILL: the "
                 "replicas keep their grants and look for the new leader"
                 % (name, epoch))
        return name

    def await_takeover(self, timeout=10.0):
        """Poll (every 50 ms, at most `timeout` s) until another member
        serves, and log it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            name, epoch = self.leader(self.statuses())
            if name is not None and name != self.failover["killed"]:
                t = time.monotonic() - self.t0
                self.failover.update({
                    "new_leader": name, "epoch_after": epoch,
                    "took_over_at": round(t, 1),
                    "took_over_unix": time.time(),
                    "takeover_s": round(t - self.failover["killed_at"],
                                        1)})
                self.log("%s leads from epoch %d, %.1f s after the kill "
                         "(it waited out the old lease, then learns what "
                         "the replicas hold)" % (
                             name, epoch, self.failover["takeover_s"]))
                return
            time.sleep(0.05)

    # ---- the summary, from the database ----

    def sql(self, q, db=None):
        r = subprocess.run(["sqlite3", "-json", db or self.db, q],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise SystemExit("demo: sqlite3 failed: " + r.stderr)
        return json.loads(r.stdout or "[]")

    def usage_per_second(self):
        """Usage rows per (quota, second), from one file (in a cluster,
        every member's file holds every row)."""
        q = ("SELECT quota, at / 1000 AS second, admitted, denied, "
             "live_replicas FROM usage WHERE service = 'orders' "
             "ORDER BY at")
        rows = {}
        for r in self.sql(q, self.db):
            k = (r["quota"], r["second"])
            if k in rows:
                rows[k]["admitted"] += r["admitted"]
                rows[k]["denied"] += r["denied"]
                rows[k]["live_replicas"] = max(
                    rows[k]["live_replicas"], r["live_replicas"])
            else:
                rows[k] = dict(r)
        out = [rows[k] for k in sorted(rows, key=lambda k: (k[1], k[0]))]
        # A second with agents' records but no row of the coordinator's
        # own (no leader served it: a failover) says nothing about the
        # replica count: it keeps the count before it.
        last = {}
        for r in out:
            if r["live_replicas"] == 0 and r["quota"] in last:
                r["live_replicas"] = last[r["quota"]]
            last[r["quota"]] = r["live_replicas"]
        return out

    def failover_rates(self):
        """Per caller, the load generator's admitted and denied requests
        per second before the kill, across the failover (from the kill to
        two seconds after the new leader serves) and after, from the
        frames' per-second figures."""
        f = self.failover
        if not f.get("took_over_at"):
            return {}
        k0, k1 = f["killed_at"], f["took_over_at"] + 2.0
        out = {}
        for name in CALLERS:
            win = {"before": [], "across": [], "after": []}
            for h in self.history:
                lc = {c.get("name"): c for c in
                      (h.get("loadgen") or {}).get("callers", [])}
                x = lc.get(name, {})
                last = x.get("last", x)
                if not last:
                    continue
                w = "before" if h["t"] < k0 else \
                    "across" if h["t"] <= k1 else "after"
                win[w].append(last)
            out[name] = {
                w: {"seconds": len(v),
                    "admitted_per_s": round(sum(x.get("ok", 0) for x in v)
                                            / len(v), 1) if v else 0,
                    "denied": sum(x.get("denied", 0) for x in v)}
                for w, v in win.items()}
        return out

    def summary(self, final_status):
        try:
            with open(os.path.join(self.dir, "loadgen.json")) as f:
                lgsum = json.load(f)
        except (OSError, ValueError):
            lgsum = {}
        lgc = {c.get("name"): c for c in lgsum.get("callers", [])}
        per_sec = self.usage_per_second()
        replicas_hist = self.sql(
            "SELECT replica_id, joined_at, left_at, left_why FROM replicas"
            " WHERE service = 'orders' ORDER BY joined_at")
        result = {"dir": self.dir, "db": self.db, "callers": {},
                  "events": self.events, "replicas": replicas_hist,
                  "dbs": [m["db"] for m in self.members.values()]}
        if self.members:
            result["failover"] = dict(self.failover)
            result["failover"]["callers"] = self.failover_rates()
        print()
        print("summary: requests from the load generator; admitted and "
              "denied in tokens (cost-weighted) from allotd's database")
        print("%-10s %9s %9s %9s %9s %12s %10s" % (
            "caller", "quota/s", "requests", "admitted", "denied",
            "worst 1s", "over (R*T)"))
        T = INTERVAL_MS / 1000.0
        for name, c in CALLERS.items():
            ident = c[0] if c[1] is not None else "default"
            rate, burst = (c[1], c[2]) if c[1] else DEFAULT_QUOTA
            rows = [r for r in per_sec if r["quota"] == ident]
            adm = sum(r["admitted"] for r in rows)
            den = sum(r["denied"] for r in rows)
            # Worst window of 1 s, the definition: admitted cost
            # minus (B + R*W), in units of one interval of traffic.
            worst_s = max([r["admitted"] for r in rows] or [0])
            over = max(0.0, (worst_s - (burst + rate * 1.0)) / (rate * T))
            tot = lgc.get(name, {}).get("total", {})
            req = tot.get("requests", 0)
            # Steady seconds: away from start-up and from every change of
            # the replica set (one second before, two after: the load
            # generator re-reads its target list once a second, so
            # traffic moves to a newcomer up to a second after it joined),
            # where transition costs (a killed replica's share held until
            # it expires, a newcomer's first intervals) do not count.
            # A leader failover is a change too (of the coordinator; the
            # summary's failover table and demo_check.py bound it on its
            # own): the seconds with no leader, and the one after the new
            # leader serves.
            f = self.failover
            lo, hi = ((int(f["killed_unix"]),
                       f.get("took_over_unix", f["killed_unix"]) + 1)
                      if "killed_unix" in f else (1, 0))
            steady = [r for i, r in enumerate(rows)
                      if 2 <= i < len(rows) - 1 and
                      not lo <= r["second"] <= hi and
                      all(rows[j]["live_replicas"] == r["live_replicas"]
                          for j in (i - 2, i - 1, i + 1))]
            s_adm = sum(r["admitted"] for r in steady)
            s_den = sum(r["denied"] for r in steady)
            # Start-up: the first two seconds with usage rows, while the
            # four replicas register and take their first shares.
            u_den = sum(r["denied"] for r in rows[:2])
            print("%-10s %9d %9d %9d %9d %12d %10.2f" % (
                name, rate, req, adm, den, worst_s, over))
            result["callers"][name] = {
                "quota": rate, "burst": burst, "requests": req,
                "admitted_tokens": adm, "denied_tokens": den,
                "worst_1s_tokens": worst_s, "over_rt": over,
                "sent_rate": c[4] * self.args.scale,
                "seconds": len(rows),
                "steady_seconds": len(steady),
                "steady_admitted_tokens": s_adm,
                "steady_denied_tokens": s_den,
                "startup_seconds": len(rows[:2]),
                "startup_denied_tokens": u_den,
                # What the load generator got an answer for (2xx or
                # 429), in tokens where every request costs one.
                "answered_tokens": (tot.get("ok", 0) + tot.get("denied", 0)
                                    if c[5].endswith(":1") and
                                    c[5].startswith("/lookup") else None),
                "loadgen": tot}
        if self.applied_at is not None:
            # The backfill after the change: whole seconds that start
            # 2 T after allotctl apply answered.
            first = int(self.applied_at + 2 * T) + 1
            rows = [r for r in per_sec if r["quota"] == CALLERS[
                "backfill"][0] and r["second"] >= first]
            adm = sum(r["admitted"] for r in rows)
            result["callers"]["backfill"]["after_apply"] = {
                "quota": APPLIED[0], "burst": APPLIED[1],
                "old_burst": CALLERS["backfill"][2],
                "seconds": len(rows), "admitted_tokens": adm}
            print("%-10s %9d after allotctl apply: %d tokens in %d s "
                  "(%.1f/s)" % ("backfill", APPLIED[0], adm, len(rows),
                                adm / len(rows) if rows else 0))
        counts = sorted({r["live_replicas"] for r in per_sec})
        result["live_replica_counts"] = counts
        if self.members and self.failover.get("new_leader"):
            f = self.failover
            print()
            print("failover: leader %s (epoch %d) killed at %.1fs; %s "
                  "leads from epoch %d, %.1f s later; %s restarted as a "
                  "follower at %.1fs" % (
                      f["killed"], f["epoch_before"], f["killed_at"],
                      f["new_leader"], f["epoch_after"], f["takeover_s"],
                      f["killed"], f.get("restarted_at", 0)))
            print("%-10s %22s %22s %22s" % (
                "caller", "before: admit/s 429", "across: admit/s 429",
                "after: admit/s 429"))
            for name, w in result["failover"]["callers"].items():
                print("%-10s" % name + "".join(
                    "%16.1f %5d" % (w[k]["admitted_per_s"],
                                    w[k]["denied"])
                    for k in ("before", "across", "after")))
            print("audit read from %s (every member's file holds all of "
                  "it)" % self.db)
        print()
        print("live replica counts seen by allotd: %s" % counts)
        for e in self.events:
            print("  %5.1fs  %s" % (e["t"], e["what"]))
        print()
        print("audit the run (sqlite3 shell, read-only):")
        for q in [
            "SELECT * FROM v_consumption_per_minute",
            "SELECT * FROM v_denied",
            "SELECT * FROM v_share_history WHERE quota LIKE '%checkout'"
            " LIMIT 20",
            "SELECT * FROM v_replica_churn",
            "SELECT at, kind, subject, detail FROM v_events "
            "ORDER BY at_ms LIMIT 30",
            "SELECT at, who, quota, action, before, after, reason "
            "FROM v_quota_changes",
            "SELECT * FROM v_unknown_callers",
        ]:
            print('  sqlite3 -readonly -header -column %s "%s"' % (
                self.db, q))
        if self.members:
            print("  # any member's file holds the whole audit: %s" %
                  " ".join(m["db"] for m in self.members.values()))
        print("  (docs/operations.md explains every table and view)")
        if self.args.summary_json:
            with open(self.args.summary_json, "w") as f:
                json.dump(result, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build-dir", default="build-demo")
    ap.add_argument("--duration", type=float, default=30,
                    help="seconds of traffic (default 30)")
    ap.add_argument("--dir", help="working directory (default: a new "
                    "one under /tmp)")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply every caller's request rate")
    ap.add_argument("--no-live", action="store_true",
                    help="print frames one after another")
    ap.add_argument("--summary-json", help="write the summary here")
    ap.add_argument("--cluster", action="store_true",
                    help="a Raft cluster of three allotd members instead "
                    "of one; the leader is killed midway, a new one takes "
                    "over, and the old one is restarted as a follower")
    args = ap.parse_args()
    if args.duration < 8:
        ap.error("--duration must be at least 8 seconds")
    d = Demo(args)
    try:
        d.run()
    except KeyboardInterrupt:
        d.stop_all()
        print("\ninterrupted; files are in %s" % d.dir)
        return 130
    except BaseException:
        d.stop_all()
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
