# SPDX-License-Identifier: MIT
"""What the checking scripts (demo_check.py, units_check.py,
man_check.py, monitoring_check.py) share: one "ok" or "FAIL" line per
check, and the list of those that failed, for their exit status; and
free ports for the daemons they start."""

import os
import sys

# One free-port rule for every script that starts daemons: the demo's
# (scripts/demo.py; tests/support/proc.c's pc_free_port is its C twin).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "scripts"))
from demo import free_port  # noqa: E402,F401

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)
