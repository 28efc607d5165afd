"""The run ledger: append-only, locked and fenced event logs, and one lease per target.

An event line: seq, utc, mono_ns, run, phase, attempt, type, owner, fence, input_hash, outputs
({name: sha256}), error (short), data. Appends take an exclusive flock on the run's events.lock;
an append that carries a fence token older than the target's current one is refused (FenceRejected).
A torn last line (crash mid-write) is skipped and reported by `read_events`.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from caseledger import procs
from caseledger.errors import FenceRejected, TargetHeld
from caseledger.records import iter_lines
from caseledger.workspace import RunPaths, Workspace, canonical_json, read_json_or_none, sha256_bytes, write_json

LEASE_SECONDS = 30.0
HEARTBEAT_SECONDS = 5.0


def utc_now(timespec: str = "milliseconds") -> str:
    return datetime.now(UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


def utc_from_epoch(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@contextmanager
def flocked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------------- leases


def target_key(case_canonical: dict[str, Any]) -> str:
    """The lease key of a target: its endpoint set (order-independent)."""
    urls = sorted(e["base_url"].rstrip("/") for e in case_canonical["target"]["endpoints"])
    return "t-" + sha256_bytes(canonical_json(urls))[:10]


@dataclass
class Lease:
    target_key: str
    run_id: str | None
    owner: dict[str, Any] | None  # procs.ProcRef of the controller (None while handed over)
    fence: int
    expires: float  # epoch seconds
    extra_procs: list[dict[str, Any]] = field(default_factory=list)  # e.g. the load client

    def to_json(self) -> dict[str, Any]:
        return {
            "target_key": self.target_key, "run_id": self.run_id, "owner": self.owner, "fence": self.fence,
            "expires": self.expires, "expires_utc": utc_from_epoch(self.expires), "extra_procs": self.extra_procs,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Lease:
        return cls(d["target_key"], d.get("run_id"), d.get("owner"), int(d.get("fence", 0)),
                   float(d.get("expires", 0)), list(d.get("extra_procs") or []))

    def live(self, now: float | None = None) -> bool:
        """Held: a run holds it, and it has not expired or one of its processes still runs."""
        if self.run_id is None:
            return False
        now = time.time() if now is None else now
        if now < self.expires:
            return True
        return any(procs.alive(p) for p in [self.owner, *self.extra_procs] if p)


def _lease_path(ws: Workspace, key: str) -> Path:
    return ws.leases_dir / f"{key}.json"


def read_lease(ws: Workspace, key: str) -> Lease | None:
    d = read_json_or_none(_lease_path(ws, key))
    return Lease.from_json(d) if d else None


def acquire(ws: Workspace, key: str, run_id: str, owner: dict[str, Any] | None, *, same_run_ok: bool = False) -> Lease:
    """Take the target for run_id with a new, strictly larger fence token; refuse a live holder."""
    with flocked(ws.leases_dir / f"{key}.lock"):
        cur = read_lease(ws, key)
        if cur is not None and cur.live() and not (same_run_ok and cur.run_id == run_id):
            pid = (cur.owner or {}).get("pid", "?")
            raise TargetHeld(
                f"target '{key}' is held by run {cur.run_id} (pid {pid}, lease until {utc_from_epoch(cur.expires)})",
                f"call phase_status(run_id='{cur.run_id}') and wait for it to end; a second run never queues silently",
            )
        fence = (cur.fence if cur else 0) + 1
        lease = Lease(key, run_id, owner, fence, time.time() + LEASE_SECONDS)
        write_json(_lease_path(ws, key), lease.to_json())
        return lease


def renew(ws: Workspace, key: str, run_id: str, fence: int, owner: dict[str, Any] | None = None,
          extra_procs: list[dict[str, Any]] | None = None) -> Lease:
    """Heartbeat: extend the lease; FenceRejected when someone took it over."""
    with flocked(ws.leases_dir / f"{key}.lock"):
        cur = read_lease(ws, key)
        if cur is None or cur.run_id != run_id or cur.fence != fence:
            raise FenceRejected(
                f"lease of target '{key}' is no longer held by run {run_id} with fence {fence}",
                "this owner must stop; the current holder is in the lease file",
            )
        cur.expires = time.time() + LEASE_SECONDS
        if owner is not None:
            cur.owner = owner
        if extra_procs is not None:
            cur.extra_procs = extra_procs
        write_json(_lease_path(ws, key), cur.to_json())
        return cur


def release(ws: Workspace, key: str, run_id: str, fence: int) -> None:
    with flocked(ws.leases_dir / f"{key}.lock"):
        cur = read_lease(ws, key)
        if cur is None or cur.run_id != run_id or cur.fence != fence:
            return
        write_json(_lease_path(ws, key), Lease(key, None, None, cur.fence, 0.0).to_json())


def current_fence(ws: Workspace, key: str) -> int:
    cur = read_lease(ws, key)
    return cur.fence if cur else 0


# ---------------------------------------------------------------------------------------------- events


@dataclass
class EventLog:
    events: list[dict[str, Any]]
    torn_tail: bool = False
    bad_lines: int = 0


def read_events(paths: RunPaths) -> EventLog:
    out = EventLog([])
    if not paths.events.exists():
        return out
    for last, line in iter_lines(paths.events):
        try:
            out.events.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            if last:
                out.torn_tail = True
            else:
                out.bad_lines += 1
    return out


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
    data: dict[str, Any] | None = None,
) -> dict[str, Any]:
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
        ev: dict[str, Any] = {
            "seq": seq, "utc": utc_now(), "mono_ns": time.monotonic_ns(), "run": paths.run_id, "phase": phase,
            "attempt": attempt, "type": type_, "owner": owner, "fence": fence, "input_hash": input_hash,
            "outputs": {k: sha256_bytes(p.read_bytes()) for k, p in (outputs or {}).items() if p.exists()},
            "error": (error[:500] if error else None), "data": data or {},
        }
        line = orjson.dumps(ev) + b"\n"
        with paths.events.open("ab") as f:
            if log.torn_tail:
                f.write(b"\n")  # seal the torn line so this event starts on its own line
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        return ev
