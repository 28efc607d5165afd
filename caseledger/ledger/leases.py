"""One lease per target: an owner with an expiry renewed by heartbeats and a strictly increasing fence."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from caseledger import procs
from caseledger.errors import FenceRejected, TargetHeld
from caseledger.workspace import (
    Workspace,
    canonical_json,
    flocked,
    read_json_or_none,
    sha256_bytes,
    utc_from_epoch,
    write_json,
)

LEASE_SECONDS = 30.0
HEARTBEAT_SECONDS = 5.0


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
