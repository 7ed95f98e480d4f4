# SPDX-License-Identifier: MIT
"""What the checking scripts (demo_check.py, units_check.py,
man_check.py) share: one "ok" or "FAIL" line per check, and the list of
those that failed, for their exit status."""

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)
