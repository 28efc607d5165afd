"""Stopping the runs of a workspace (`caseledger target stop`, after its campaign drivers and before its
services): each live controller gets SIGTERM and ends its run itself, keeping every record it has."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from caseledger import procs
from caseledger.ledger.event_types import StopAsked, StopAskedData
from caseledger.ledger.events import append_event
from caseledger.ledger.runs import load_run
from caseledger.ledger.state import client_refs, count_raw, fold
from caseledger.procs import LoadRef
from caseledger.workspace import RunPaths, Workspace, is_id, read_ref

STOP_WAIT_S = 60.0  # a stopped run seals and processes the records it has (seconds); longer: named as still ending

_ASKED = StopAsked(data=StopAskedData(by="caseledger target stop"))


@dataclass(frozen=True)
class Stopped:
    run_id: str
    state: str  # the run's state once its controller ended, or 'running' when it is still ending
    line: str  # 'r-1a2b3c4d partial: 37 of 64 formal requests recorded'


def stop_runs(ws: Workspace, wait_s: float = STOP_WAIT_S) -> list[Stopped]:
    """SIGTERM every live controller of this workspace (and a load client left without one), wait up to wait_s
    for each to end its run, and say where each run stands. The caller's own process is never signalled."""
    asked: list[tuple[RunPaths, LoadRef | None]] = []
    for d in sorted(ws.runs_dir.iterdir()) if ws.runs_dir.is_dir() else []:
        if d.is_symlink() or not is_id(d.name, "r"):
            continue
        paths = RunPaths(d)
        ctl = read_ref(paths.controller_pid)
        mine = ctl is not None and int(ctl["pid"]) == os.getpid()
        if ctl is not None and not mine and procs.alive(ctl) and not procs.elsewhere(ctl):
            append_event(ws, paths, _ASKED, owner=f"stop:{os.getpid()}")
            os.kill(int(ctl["pid"]), signal.SIGTERM)
            asked.append((paths, ctl))
        elif not mine and (orphans := [r for r in client_refs(paths) if procs.alive(r) and not procs.elsewhere(r)]):
            append_event(ws, paths, _ASKED, owner=f"stop:{os.getpid()}")
            for ref in orphans:  # no controller follows them: each records what it has and writes its end file
                procs.terminate(ref, grace_s=10.0)
            asked.append((paths, None))
    deadline = time.monotonic() + wait_s
    while any(ctl is not None and procs.alive(ctl) for _, ctl in asked) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [_where(ws, paths) for paths, _ in asked]


def _where(ws: Workspace, paths: RunPaths) -> Stopped:
    v = fold(ws, load_run(ws, paths.run_id))
    if v.controller_alive:
        line = f"{paths.run_id} still ending at {v.current}, keeping its records (caseledger status {paths.run_id})"
        return Stopped(paths.run_id, "running", line)
    at = f" at {v.current}" if v.current is not None else ""
    cls = f" [{v.failure_class}]" if v.failure_class is not None else ""
    kept = f": {count_raw(paths.raw)[0]} of {v.meta.planned} formal requests recorded" if paths.raw.exists() else ""
    return Stopped(paths.run_id, v.state.value, f"{paths.run_id} {v.state.value}{cls}{at}{kept}")
