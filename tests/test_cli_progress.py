"""Live progress of `caseledger run --wait` as a person sees it: under a pseudo-terminal one line redrawn in
place at least once a second, ending with the answer; piped, one plain line per phase; with --json, nothing but
the answer. A 64-request run on the reference target, the real CLI in a subprocess."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import time

import pytest

from caseledger.workspace import Workspace
from tests.helpers import progress_case

pytestmark = pytest.mark.integration

REDRAW = re.compile(rb"\r(?!\n)")  # a carriage return that is no line end (the terminal turns \n into \r\n)


def _cli(ws: Workspace, *args: str) -> list[str]:
    return [sys.executable, "-m", "caseledger", "-w", str(ws.root), *args]


def _under_pty(argv: list[str], timeout_s: float = 240.0) -> list[tuple[float, bytes]]:
    """(arrival time, bytes) of everything the command wrote to its terminal."""
    master, slave = os.openpty()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.DEVNULL)
    os.close(slave)
    got: list[tuple[float, bytes]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            got.append((time.monotonic(), chunk))
        assert p.wait(timeout=30) == 0, b"".join(c for _, c in got)[-2000:]
    finally:
        os.close(master)
        if p.poll() is None:
            p.kill()
            p.wait()
    return got


def test_on_a_terminal_one_line_is_redrawn_at_least_once_a_second_and_ends_with_the_answer(
    ws: Workspace, stop_services: None
) -> None:
    got = _under_pty(_cli(ws, "run", progress_case(ws), "--wait"))
    out = b"".join(c for _, c in got)
    stamps = [t for t, c in got for _ in REDRAW.finditer(c)]
    assert len(stamps) >= 3, out[-2000:]
    span = stamps[-1] - stamps[0]
    # the bar, with tolerance for a shared host: redraws per second of the wait, and no long silence
    assert len(stamps) / span >= 0.8, (len(stamps), span)
    assert max(b - a for a, b in itertools.pairwise(stamps)) < 3.0
    frames = [f.decode() for f in REDRAW.split(out) if f.strip()]
    assert any(" load running · formal sent " in f for f in frames), frames[:5]
    assert any("formal sent 64/64 done 64 failed 0" in f for f in frames), frames[-3:]
    assert any("of load left" in f for f in frames), frames  # an estimate of the rest while it loads
    answer = frames[-1].replace("\r\n", "\n").strip().splitlines()
    # the answer follows the last redrawn line on lines of its own
    assert "formal sent 64/64" in answer[0] and answer[1].startswith("run r-"), answer
    assert "state succeeded" in answer[1] and answer[-1].startswith("next: "), answer


def test_piped_it_prints_one_line_per_phase_and_with_json_only_the_answer(ws: Workspace, stop_services: None) -> None:
    cid = progress_case(ws)
    p = subprocess.run(_cli(ws, "run", cid, "--wait"), capture_output=True, timeout=240)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert b"\r" not in p.stdout
    lines = p.stdout.decode().splitlines()
    progress = [line for line in lines if " · formal sent " in line]
    phases = [line.split(" · ")[0].split(" ", 1)[1] for line in progress]
    assert len(phases) == len(set(phases)), phases  # each phase change once, never a repeated line
    assert {"load running", "succeeded"} <= set(phases) and phases[-1] == "succeeded", phases
    assert any(ph.startswith("preflight") for ph in phases), phases
    assert lines[len(progress)].startswith("run r-") and lines[-1].startswith("next: "), lines

    q = subprocess.run(_cli(ws, "run", cid, "--wait", "--json"), capture_output=True, timeout=240)
    assert q.returncode == 0, q.stderr.decode()[-2000:]
    assert json.loads(q.stdout)["state"] == "succeeded"  # stdout is the JSON answer alone
