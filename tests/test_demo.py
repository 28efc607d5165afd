"""The README's main command: `caseledger demo` in a fresh process, exit 0, nothing left running."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.integration
@pytest.mark.quiet  # the demo freezes its cases in its own process, on the default contention threshold
def test_demo_prints_the_comparison_and_leaves_nothing_running() -> None:
    before = set(_caseledger_pids())
    p = subprocess.run([sys.executable, "-m", "caseledger", "demo"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    out = p.stdout
    assert "## whole vs whole" in out and "## native vs native" in out
    assert "reuses: service, warmup, route_verify" in out  # the child skipped them
    assert "start_run->first formal request" in out and "# HANDOFF" in out
    assert "processes left: 0" in out and "demo passed" in out
    assert set(_caseledger_pids()) - before == set()


def _caseledger_pids() -> list[int]:
    from pathlib import Path

    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if b"caseledger-demo-" in cmd or (b"caseledger." in cmd and b"demo" in cmd):
            pids.append(int(d.name))
    return pids
