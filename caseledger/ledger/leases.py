"""One lease per target on the host: an owner with an expiry renewed by heartbeats and a strictly increasing
fence. Leases live in a host-wide directory (not in the workspace), so two workspaces, two agents or two
users' shells on one host see the same owner of a target.

The directory is chosen without looking at per-shell environment (an MCP server and a CLI in another shell
must agree): $CASELEDGER_HOST_DIR when set (set it the same everywhere), else /run/caseledger for root,
/run/user/<uid>/caseledger when that runtime directory exists, else /tmp/caseledger-<uid>.
"""

from __future__ import annotations

import ipaddress
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from caseledger import procs
from caseledger.errors import FenceRejected, TargetHeld
from caseledger.ledger import calls
from caseledger.procs import LoadRef, ProcRef
from caseledger.workspace import (
    Workspace,
    canonical_json,
    flocked,
    read_json_or_none,
    sha256_bytes,
    utc_from_epoch,
    write_json,
)

ENV_LEASE_S = "CASELEDGER_LEASE_S"  # the lease's length; tests shorten it to see an expiry without waiting 30 s


def _lease_seconds() -> float:
    try:
        v = float(os.environ.get(ENV_LEASE_S) or 30.0)
    except ValueError:
        v = 30.0
    return v if 3.0 <= v <= 3600.0 else 30.0  # out of range or not a number: the default (never a zero lease)


LEASE_SECONDS = _lease_seconds()
HEARTBEAT_SECONDS = min(5.0, LEASE_SECONDS / 3)  # at least two renewals within a lease
ENV_HOST_DIR = "CASELEDGER_HOST_DIR"


def host_dir() -> Path:
    """The host-wide directory of target leases (created 0700 on first use)."""
    if os.environ.get(ENV_HOST_DIR):
        d = Path(os.environ[ENV_HOST_DIR])
    elif os.geteuid() == 0:
        d = Path("/run/caseledger")
    elif Path(f"/run/user/{os.geteuid()}").is_dir():
        d = Path(f"/run/user/{os.geteuid()}/caseledger")
    else:
        d = Path(f"/tmp/caseledger-{os.geteuid()}")
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return d


def target_key(case_canonical: dict[str, Any]) -> str:  # JSON: Case.canonical()
    """The lease key of a target: the set of addresses (host:port) its endpoints reach, order-independent;
    every loopback spelling (localhost, 127.x.y.z, ::1) is one host, and the URL path is not part of it."""
    return (
        "t-"
        + sha256_bytes(canonical_json(sorted({address(e["base_url"]) for e in case_canonical["target"]["endpoints"]})))[
            :10
        ]
    )


def address(base_url: str) -> str:
    """'http://localhost:8080/v1' -> 'loopback:8080'."""
    u = urlsplit(base_url)
    host = (u.hostname or "").lower()
    try:
        if ipaddress.ip_address(host).is_loopback:
            host = "loopback"
    except ValueError:
        if host == "localhost":
            host = "loopback"
    return f"{host}:{u.port or (443 if u.scheme == 'https' else 80)}"


@dataclass
class Lease:
    target_key: str
    run_id: str | None
    owner: ProcRef | None  # the controller (None while handed over)
    fence: int
    expires: float  # epoch seconds
    extra_procs: list[LoadRef] = field(default_factory=list)  # e.g. the load client
    workspace: str | None = None  # the workspace of the run that holds it
    claim: str | None = None  # a token of the acquire that wrote it (an acquire retried on a new link knows it)
    lease_host: str | None = None  # set on this host's mirror of a lease kept on a lease host (user@host:port)

    def to_json(self) -> dict[str, Any]:  # JSON: the lease file
        return {
            "target_key": self.target_key,
            "run_id": self.run_id,
            "owner": self.owner,
            "fence": self.fence,
            "expires": self.expires,
            "expires_utc": utc_from_epoch(self.expires),
            "extra_procs": self.extra_procs,
            "workspace": self.workspace,
            "claim": self.claim,
            "lease_host": self.lease_host,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Lease:  # JSON: the lease file
        return cls(
            d["target_key"],
            d.get("run_id"),
            procs.ref_of(d.get("owner")),
            int(d.get("fence", 0)),
            float(d.get("expires", 0)),
            [r for r in map(procs.ref_of, d.get("extra_procs") or []) if r is not None],
            d.get("workspace"),
            d.get("claim"),
            d.get("lease_host"),
        )

    def holds(self, ws: Workspace, run_id: str) -> bool:
        return self.run_id == run_id and self.workspace in (None, str(ws.root))

    def held_by(self, ws: Workspace) -> str:
        """'run r-… (controller pid N, lease until …)', naming the workspace when it is another one."""
        pid = self.owner["pid"] if self.owner else None
        who = f"controller pid {pid}" if pid else "its controller is starting, or died starting: the lease lapses"
        where = f" in workspace {self.workspace}" if self.workspace and self.workspace != str(ws.root) else ""
        on = f" on lease host {self.lease_host}" if self.lease_host else ""
        return f"run {self.run_id}{where} ({who}, lease{on} until {utc_from_epoch(self.expires)})"

    def live(self, now: float | None = None) -> bool:
        """Held: a run holds it, and it has not expired or one of its processes still runs. (Not 'owner dead
        means free': a controller killed right after starting its load client has not yet named the client in
        the lease; the expiry covers that window.)"""
        if self.run_id is None:
            return False
        now = time.time() if now is None else now
        if now < self.expires:
            return True
        # a load client on another host (load.host) may run on behind a lost link: it keeps the lease until a
        # resume has asked that host over SSH (never a second load on the target meanwhile)
        return any(procs.alive(p) or procs.elsewhere(p) for p in [self.owner, *self.extra_procs] if p)

    def live_shared(self, now: float) -> bool:
        """live() for a lease on a lease host, judged at the lease host's clock `now`: its owner controller runs
        on some host and renews while it can (a controller that cannot renew stops before the expiry), so past
        the expiry only a process this host sees running, or a load client on another host, keeps it."""
        if self.run_id is None:
            return False
        if now < self.expires:
            return True
        return any(procs.alive(p) for p in [self.owner, *self.extra_procs] if p) or any(
            procs.elsewhere(p) for p in self.extra_procs
        )


def _lease_path(key: str) -> Path:
    return host_dir() / f"{key}.json"


def _lock(key: str) -> Path:
    return host_dir() / f"{key}.lock"


def read_lease(ws: Workspace, key: str) -> Lease | None:
    d = read_json_or_none(_lease_path(key))
    return Lease.from_json(d) if d else None


def refuse_held(ws: Workspace, cur: Lease | None, run_id: str, *, same_run_ok: bool, live: bool) -> None:
    """TargetHeld when `cur` (live as judged by the caller) keeps run_id from taking the target."""
    if cur is None or not live:
        return
    if same_run_ok and cur.holds(ws, run_id):
        if cur.owner is None or procs.alive(cur.owner):  # a second resume arriving together
            raise TargetHeld(
                f"run {run_id} is already being continued: its controller "
                + ("is starting" if cur.owner is None else f"(pid {cur.owner.get('pid')}) is alive"),
                f"{calls.phase_status(run_id)}; one resume is enough",
            )
        return
    raise TargetHeld(
        f"target '{cur.target_key}' is held by {cur.held_by(ws)}",
        f"call {calls.phase_status(cur.run_id)} and wait for it to end; a second run never queues silently"
        if cur.workspace in (None, str(ws.root))
        else f"wait for that run to end (caseledger -w {cur.workspace} status {cur.run_id}); one target "
        "has one owner" + ("" if cur.lease_host else " on this host"),
    )


def acquire(
    ws: Workspace,
    key: str,
    run_id: str,
    owner: ProcRef | None,
    *,
    same_run_ok: bool = False,
) -> Lease:
    """Take the target for run_id with a new, strictly larger fence token; refuse a live holder (from any
    workspace on this host)."""
    with flocked(_lock(key)):
        cur = read_lease(ws, key)
        refuse_held(ws, cur, run_id, same_run_ok=same_run_ok, live=cur is not None and cur.live())
        fence = (cur.fence if cur else 0) + 1
        lease = Lease(key, run_id, owner, fence, time.time() + LEASE_SECONDS, workspace=str(ws.root))
        write_json(_lease_path(key), lease.to_json())
        return lease


def mirror(lease: Lease) -> None:
    """Write this host's copy of a lease kept on a lease host: event appends check their fence against it, and
    status, the handoff and a local-lease case on the same target read it."""
    with flocked(_lock(lease.target_key)):
        write_json(_lease_path(lease.target_key), lease.to_json())


def renew(
    ws: Workspace,
    key: str,
    run_id: str,
    fence: int,
    owner: ProcRef | None = None,
    extra_procs: list[LoadRef] | None = None,
) -> Lease:
    """Heartbeat: extend the lease; FenceRejected when someone took it over."""
    with flocked(_lock(key)):
        cur = read_lease(ws, key)
        if cur is None or not cur.holds(ws, run_id) or cur.fence != fence:
            raise FenceRejected(
                f"lease of target '{key}' is no longer held by run {run_id} with fence {fence}",
                "this owner must stop; the current holder is in the lease file",
            )
        cur.expires = time.time() + LEASE_SECONDS
        if owner is not None:
            cur.owner = owner
        if extra_procs is not None:
            cur.extra_procs = extra_procs
        write_json(_lease_path(key), cur.to_json())
        return cur


def release(ws: Workspace, key: str, run_id: str, fence: int) -> None:
    with flocked(_lock(key)):
        cur = read_lease(ws, key)
        if cur is None or not cur.holds(ws, run_id) or cur.fence != fence:
            return
        write_json(_lease_path(key), Lease(key, None, None, cur.fence, 0.0).to_json())


def current_fence(ws: Workspace, key: str) -> int:
    cur = read_lease(ws, key)
    return cur.fence if cur else 0
