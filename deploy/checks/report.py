"""Collects check outcomes; a failed check never stops the others.

Invariant: every check ends as exactly one of passed, failed or skipped, and a skip
always carries the reason it was skipped.
"""

import sys
import traceback


class Report:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.skipped = 0

    def ok(self, name, detail=""):
        self.passed += 1
        print(f"  ok    {name}" + (f"  ({detail})" if detail else ""))

    def fail(self, name, why):
        self.failed += 1
        print(f"  FAIL  {name}: {why}")

    def skip(self, name, why):
        self.skipped += 1
        print(f"  skip  {name}: {why}")

    def check(self, name, fn, *args):
        """Runs fn(*args); it returns None or a detail string, raises CheckError to fail."""
        try:
            detail = fn(*args)
        except Skip as s:
            self.skip(name, str(s))
        except CheckError as e:
            self.fail(name, str(e))
        except Exception:  # a bug in a check must show, not hide the rest
            self.fail(name, "crashed:\n" + traceback.format_exc())
        else:
            self.ok(name, detail or "")

    def summary(self):
        line = f"deploy: {self.passed} passed, {self.failed} failed"
        if self.skipped:
            line += f", {self.skipped} skipped"
        print(line)
        sys.stdout.flush()
        return 0 if self.failed == 0 else 1


class CheckError(Exception):
    """A check found a problem; the message says what and where."""


class Skip(Exception):
    """A check cannot run here; the message says why."""


def require(cond, msg):
    if not cond:
        raise CheckError(msg)


def collect(errors):
    """Fails with every collected message at once, so one run shows all problems."""
    if errors:
        raise CheckError("\n        " + "\n        ".join(errors))
