"""The systemd unit: `systemd-analyze verify` without a single warning (it exits 0 on
unknown keys, so its output is read too) and an offline exposure score within bounds.
"""

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from .report import CheckError, Skip, require

MAX_EXPOSURE_TENTHS = 15  # "OK" band; the unit scores 1.1 today


def _staged(deploy, exe):
    """A copy of the unit (and drop-in) whose ExecStart points at an existing binary:
    verify fails on a missing executable, and /usr/local/bin/headroom is not installed
    on a CI machine."""
    tmp = Path(tempfile.mkdtemp())
    unit = (deploy / "systemd/headroom.service").read_text()
    require("ExecStart=/usr/local/bin/headroom " in unit, "ExecStart must run /usr/local/bin/headroom")
    (tmp / "headroom.service").write_text(unit.replace("/usr/local/bin/headroom", exe))
    shutil.copytree(deploy / "systemd/headroom.service.d", tmp / "headroom.service.d")
    return tmp


def verify(deploy, exe):
    if not shutil.which("systemd-analyze"):
        raise Skip("systemd-analyze is not installed")
    tmp = _staged(deploy, exe)
    try:
        out = subprocess.run(["systemd-analyze", "verify", "./headroom.service"], cwd=tmp,
                             capture_output=True, text=True, timeout=30)
    finally:
        shutil.rmtree(tmp)
    noise = [l for l in (out.stdout + out.stderr).splitlines() if l.strip()]
    if out.returncode != 0 or noise:
        raise CheckError("systemd-analyze verify: " + "\n        ".join(noise or [f"exit {out.returncode}"]))


def exposure(deploy, exe):
    if not shutil.which("systemd-analyze"):
        raise Skip("systemd-analyze is not installed")
    tmp = _staged(deploy, exe)
    try:
        out = subprocess.run(["systemd-analyze", "security", "--offline=true", "./headroom.service"],
                             cwd=tmp, capture_output=True, text=True, timeout=30)
    finally:
        shutil.rmtree(tmp)
    m = re.search(r"Overall exposure level for headroom.service: (\d+)\.(\d)", out.stdout)
    if not m:
        if "--offline" in out.stderr:
            raise Skip("this systemd-analyze has no offline security analysis")
        raise CheckError(f"no exposure score: {out.stderr.strip()}")
    tenths = int(m.group(1)) * 10 + int(m.group(2))
    require(tenths <= MAX_EXPOSURE_TENTHS, f"exposure {tenths / 10} exceeds {MAX_EXPOSURE_TENTHS / 10}")
    return f"exposure {tenths / 10}"
