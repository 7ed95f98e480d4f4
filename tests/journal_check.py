#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Under systemd the daemons log structured journal entries
(--log-format journal, the default when stderr is the journal): each
carries MESSAGE, PRIORITY, SYSLOG_IDENTIFIER, ALLOT_ID (the stable log
id) and MESSAGE_ID (32 hex digits, the same for an id every time), sent
by the journal's native protocol (sd_journal_send). Where no journal
listens, the same line goes to stderr with the syslog priority prefix
journald reads on a stream.

The journal here is a datagram socket this script binds at
/run/systemd/journal/socket, in a mount namespace of its own with a
tmpfs on /run (unshare(1); root only, else skipped), so that a real
journald is never touched.

usage: journal_check.py AGENTD"""
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

from checks import check, failures

SOCK = "/run/systemd/journal/socket"
QUOTAS = "quotas:\n  default: {tokens_per_second: 10, burst: 10}\n"


def parse_entry(data):
    """The fields of one native-protocol datagram: KEY=value lines, or
    KEY, a newline, a little-endian 64-bit length and the value."""
    fields, i = {}, 0
    while i < len(data):
        nl = data.index(b"\n", i)
        line = data[i:nl]
        if b"=" in line:
            k, v = line.split(b"=", 1)
            i = nl + 1
        else:
            k = line
            (n,) = struct.unpack("<Q", data[nl + 1:nl + 9])
            v = data[nl + 9:nl + 9 + n]
            i = nl + 9 + n + 1
        fields[k.decode()] = v.decode(errors="replace")
    return fields


def start_agentd(agentd, tmp, log):
    cfg = os.path.join(tmp, "quotas.yaml")
    with open(cfg, "w") as f:
        f.write(QUOTAS)
    return subprocess.Popen(
        [agentd, "--config", cfg, "--grpc-listen", "none",
         "--http-listen", "127.0.0.1:0", "--log-format", "journal"],
        stdout=log, stderr=log)


def inner(agentd):
    os.makedirs(os.path.dirname(SOCK), exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="allot-journal-") as tmp:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind(SOCK)
        s.settimeout(10)
        errpath = os.path.join(tmp, "stderr")
        with open(errpath, "w") as log:
            p = start_agentd(agentd, tmp, log)
            entries = []
            try:
                end = time.time() + 10
                while time.time() < end and not any(
                        "ALLOT_ID" in e for e in entries):
                    entries.append(parse_entry(s.recv(65536)))
            except socket.timeout:
                pass
            p.terminate()
            p.wait(timeout=10)
        s.close()
        first = next((e for e in entries if "ALLOT_ID" in e), {})
        check(first != {}, "allot-agentd sent the journal an entry "
              "(%d received)" % len(entries))
        check(first.get("SYSLOG_IDENTIFIER") == "allot-agentd" and
              first.get("PRIORITY", "x").isdigit() and
              first.get("MESSAGE", "") != "",
              "it has MESSAGE, PRIORITY and SYSLOG_IDENTIFIER (%s)" %
              sorted(first))
        mid = first.get("MESSAGE_ID", "")
        check(len(mid) == 32 and all(c in "0123456789abcdef" for c in mid),
              "MESSAGE_ID is 128 bits in hex (%s) for ALLOT_ID %s" % (
                  mid, first.get("ALLOT_ID")))
        check(first.get("ALLOT_ID", "?") not in open(errpath).read(),
              "nothing of it on stderr")
        # No journal listening: the line on stderr, priority first.
        os.unlink(SOCK)
        with open(errpath, "w") as log:
            p = start_agentd(agentd, tmp, log)
            time.sleep(1)
            p.terminate()
            p.wait(timeout=10)
        lines = open(errpath).read().splitlines()
        check(any(line.startswith("<") and first.get("ALLOT_ID", "?") in
                  line for line in lines),
              "without a journal, the line on stderr behind its <N> "
              "prefix (%s)" % (lines,))
        # Its MESSAGE_ID again: the same id, the same MESSAGE_ID.
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind(SOCK)
        s.settimeout(10)
        with open(errpath, "w") as log:
            p = start_agentd(agentd, tmp, log)
            again = {}
            try:
                while again.get("ALLOT_ID") != first.get("ALLOT_ID"):
                    again = parse_entry(s.recv(65536))
            except socket.timeout:
                pass
            p.terminate()
            p.wait(timeout=10)
        check(again.get("MESSAGE_ID") == mid,
              "the same id has the same MESSAGE_ID in another process")
    if failures:
        print("%d checks failed" % len(failures))
        sys.exit(1)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--inner":
        return inner(sys.argv[2])
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        print("journal_check: needs root and unshare(1) for a private /run")
        sys.exit(77)
    r = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         'mount -t tmpfs tmpfs /run && exec "$0" "$1" --inner "$2"',
         sys.executable, os.path.abspath(__file__), sys.argv[1]])
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
