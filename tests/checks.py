# SPDX-License-Identifier: MIT
"""What the checking scripts (demo_check.py, units_check.py,
man_check.py, monitoring_check.py) share: one "ok" or "FAIL" line per
check, and the list of those that failed, for their exit status; and
free ports for the daemons they start."""

import random
import socket

failures = []
_ports_given = set()


def ephemeral_range():
    """The ports the kernel gives outgoing connections as local ports."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return 32768, 60999


def free_port():
    """A loopback port nothing listens on now, from below the ephemeral
    range (a port from it may become the local port of any outgoing
    connection before its daemon binds it), never one given before in
    this run (tests/support/proc.c's pc_free_port does the same)."""
    lo, _ = ephemeral_range()
    for _ in range(1000):
        port = random.randrange(10000, lo) if lo > 11000 else 0
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = s.getsockname()[1]
        if port not in _ports_given:
            _ports_given.add(port)
            return port
    raise OSError("no free port")


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)
