"""Append-only event logs: a run's (locked and fenced) and a campaign driver's.

An event line: seq, utc, mono_ns, run, phase, attempt, type, owner, fence, input_hash, outputs
({name: sha256}), error (short), data; each type a model of ledger/event_types.py, which a writer passes and a
reader gets. Appends take an exclusive flock on the run's events.lock; an append that carries a fence token
older than the target's current one is refused (FenceRejected). A torn last line (crash mid-write) is skipped
and reported by `read_events`. A campaign driver's events are appended and read here too (`append_driver_event`,
`read_driver_events`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from caseledger import redact
from caseledger.errors import FenceRejected
from caseledger.ledger import indexdb
from caseledger.ledger.event_types import (
    DriverEvent,
    RunEvent,
    UnknownEvent,
    driver_json,
    parse_driver_event,
    parse_run_event,
    run_json,
)
from caseledger.ledger.leases import current_fence
from caseledger.records import read_jsonl
from caseledger.workspace import RunPaths, Workspace, flocked, sha256_bytes, utc_now


@dataclass
class EventLog:
    events: list[RunEvent | UnknownEvent]  # events.jsonl, a line of an unknown type as UnknownEvent
    torn_tail: bool = False
    bad_lines: int = 0  # lines before the last that are not JSON (skipped)


def read_events(paths: RunPaths) -> EventLog:
    """All events of a run in file order; a torn last line is reported, never fatal."""
    lines = read_jsonl(paths.events)
    return EventLog([parse_run_event(x) for x in lines.items], torn_tail=lines.torn_tail, bad_lines=lines.bad_lines)


def append_event(
    ws: Workspace,
    paths: RunPaths,
    event: RunEvent,
    *,
    owner: str | None = None,
    fence: int | None = None,
    target: str | None = None,
    input_hash: str | None = None,
    outputs: dict[str, Path] | None = None,
) -> RunEvent:
    """Append one event under the run's lock; refuse a fence older than the target's current one. Returns the
    event as written (its data before the run's secrets are masked in the line)."""
    with flocked(paths.events_lock):
        if fence is not None and target is not None:
            cur = current_fence(ws, target)
            if fence < cur:
                raise FenceRejected(
                    f"event '{event.type}' for run {paths.run_id} carries fence {fence} < current {cur} on '{target}'",
                    "a newer owner holds the target; this process must stop writing",
                )
        lines = read_jsonl(paths.events)  # only the seqs and the torn tail: no line is parsed into its model here
        seqs = [x["seq"] for x in lines.items if isinstance(x, dict) and isinstance(x.get("seq"), int)]
        written = event.model_copy(
            update={
                "seq": max(seqs, default=0) + 1,
                "utc": utc_now(),
                "mono_ns": time.monotonic_ns(),
                "run": paths.run_id,
                "owner": owner,
                "fence": fence,
                "input_hash": input_hash,
                "outputs": {k: sha256_bytes(p.read_bytes()) for k, p in (outputs or {}).items() if p.exists()},
                # the values of the run's secrets masked in what came from outside (before the cut: a cut key
                # keeps its first characters), whoever appends
                "error": (redact.cut(event.error, 500) if event.error else None),
            }
        )
        ev = run_json(written)
        ev["data"] = redact.mask_obj(ev["data"])
        line = orjson.dumps(ev) + b"\n"
        with paths.events.open("ab") as f:
            if lines.torn_tail:
                f.write(b"\n")  # seal the torn line so this event starts on its own line
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
    indexdb.touched(paths.root)  # the index folds this run again at its next read
    return written


def read_driver_events(path: Path) -> list[DriverEvent | UnknownEvent]:
    """A campaign driver's events, oldest first; a line of an unknown type as UnknownEvent."""
    return [parse_driver_event(x) for x in read_jsonl(path).items]


def append_driver_event(path: Path, event: DriverEvent) -> None:
    """Append one event of a campaign's driver (its one writer holds the driver's lock)."""
    with path.open("ab") as f:
        f.write(orjson.dumps(driver_json(event, utc_now())) + b"\n")
