"""Append-only, locked and fenced event logs of runs.

An event line: seq, utc, mono_ns, run, phase, attempt, type, owner, fence, input_hash, outputs
({name: sha256}), error (short), data. Appends take an exclusive flock on the run's events.lock;
an append that carries a fence token older than the target's current one is refused (FenceRejected).
A torn last line (crash mid-write) is skipped and reported by `read_events`.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from caseledger import redact
from caseledger.errors import FenceRejected
from caseledger.ledger import indexdb
from caseledger.ledger.leases import current_fence
from caseledger.records import read_jsonl
from caseledger.workspace import RunPaths, Workspace, flocked, sha256_bytes, utc_now


@dataclass
class EventLog:
    events: list[dict[str, Any]]  # JSON: events.jsonl
    torn_tail: bool = False
    bad_lines: int = 0


def read_events(paths: RunPaths) -> EventLog:
    """All events of a run in file order; a torn last line is reported, never fatal."""
    lines = read_jsonl(paths.events)
    return EventLog(lines.items, torn_tail=lines.torn_tail, bad_lines=lines.bad_lines)


def append_event(
    ws: Workspace,
    paths: RunPaths,
    type_: str,
    *,
    phase: str | None = None,
    attempt: int | None = None,
    owner: str | None = None,
    fence: int | None = None,
    target: str | None = None,
    input_hash: str | None = None,
    outputs: dict[str, Path] | None = None,
    error: str | None = None,
    data: dict[str, Any] | None = None,  # JSON: the event's data
) -> dict[str, Any]:  # JSON: an event
    """Append one event under the run's lock; refuse a fence older than the target's current one."""
    with flocked(paths.events_lock):
        if fence is not None and target is not None:
            cur = current_fence(ws, target)
            if fence < cur:
                raise FenceRejected(
                    f"event '{type_}' for run {paths.run_id} carries fence {fence} < current {cur} on '{target}'",
                    "a newer owner holds the target; this process must stop writing",
                )
        log = read_events(paths)
        seq = (log.events[-1]["seq"] + 1) if log.events else 1
        ev: dict[str, Any] = {  # JSON: an event
            "seq": seq,
            "utc": utc_now(),
            "mono_ns": time.monotonic_ns(),
            "run": paths.run_id,
            "phase": phase,
            "attempt": attempt,
            "type": type_,
            "owner": owner,
            "fence": fence,
            "input_hash": input_hash,
            "outputs": {k: sha256_bytes(p.read_bytes()) for k, p in (outputs or {}).items() if p.exists()},
            # the values of the run's secrets masked in what came from outside (before the cut: a cut key keeps
            # its first characters), whoever appends
            "error": (redact.cut(error, 500) if error else None),
            "data": redact.mask_obj(data or {}),
        }
        line = orjson.dumps(ev) + b"\n"
        with paths.events.open("ab") as f:
            if log.torn_tail:
                f.write(b"\n")  # seal the torn line so this event starts on its own line
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
    indexdb.touched(paths.root)  # the index folds this run again at its next read
    return ev
