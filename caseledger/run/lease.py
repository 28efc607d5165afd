"""Where a run's target lease lives, and acquire / renew / release over it.

A case whose service runs over SSH (service.ssh), or that names target.lease_host, keeps its lease in a
directory on that host (services/lease_host.py): controllers on different hosts, or with different host
directories, then see one owner. Every other case keeps it in this host's directory (ledger/leases.py). The
fence semantics are the same in both: a strictly increasing fence per acquire, a renewal with a stale fence
is refused (FenceRejected), and the controller that gets that refusal stops its load.

A lease on a lease host is mirrored into this host's directory after every operation: event appends check
their fence against the mirror, and status and the handoff read it.
"""

from __future__ import annotations

import secrets

from caseledger.case.model import Case
from caseledger.case.service import SSH
from caseledger.errors import FenceRejected, RemoteError, TargetHeld
from caseledger.ledger import leases
from caseledger.ledger.leases import LEASE_SECONDS, Lease
from caseledger.procs import LoadRef, ProcRef
from caseledger.workspace import Workspace


def lease_host(case: Case) -> SSH | None:
    """The host that keeps this case's target lease: target.lease_host, else service.ssh, else None (local)."""
    return case.target.lease_host or case.service.ssh


def _where(ssh: SSH) -> str:
    from caseledger.services.remote import where  # lazy: services pulls the adapters; a local lease needs none

    return where(ssh)


def _field(case: Case) -> str:
    return "target.lease_host" if case.target.lease_host else "service.ssh"


def _unreachable(case: Case, key: str, e: RemoteError) -> RemoteError:
    ssh = lease_host(case)
    assert ssh is not None
    return RemoteError(
        f"the lease of target '{key}' is kept on {_where(ssh)} ({_field(case)}), which did not answer: {e.message}",
        f"{e.fix}; or point {_field(case)} at a reachable host (freeze a new case). Nothing was started: no "
        "lease, no load",
    )


def acquire(
    ws: Workspace,
    case: Case,
    key: str,
    run_id: str,
    owner: ProcRef | None,
    *,
    same_run_ok: bool = False,
) -> Lease:
    """Take the target for run_id with a new, strictly larger fence; TargetHeld names a live holder. One SSH
    exec when the lease is free; two when a lapsed lease must be judged here first."""
    ssh = lease_host(case)
    if ssh is None:
        return leases.acquire(ws, key, run_id, owner, same_run_ok=same_run_ok)
    from caseledger.services import lease_host as lh  # lazy: SSH only for a lease host

    local = leases.read_lease(ws, key)  # a run of a local-lease case on the same target, on this host
    if local is not None and local.lease_host is None:
        leases.refuse_held(ws, local, run_id, same_run_ok=same_run_ok, live=local.live())
    want = Lease(key, run_id, owner, 0, 0.0, workspace=str(ws.root), claim=secrets.token_hex(8))
    seen = "-"
    try:
        for _ in range(3):
            ans = lh.operate(ssh, "acquire", key, want, seen=seen, lease_s=LEASE_SECONDS)
            cur = ans.lease
            if cur is None:
                raise RemoteError("the lease script wrote no lease file", "check the lease directory's permissions")
            cur.lease_host = _where(ssh)
            if ans.status == 0 or cur.claim == want.claim:
                leases.mirror(cur)
                return cur
            leases.refuse_held(ws, cur, run_id, same_run_ok=same_run_ok, live=cur.live_shared(ans.now))
            seen = ans.seen()  # lapsed (or our own run's, taken over by resume): take exactly that one
    except RemoteError as e:
        raise _unreachable(case, key, e) from None
    raise TargetHeld(
        f"target '{key}' changed owner three times while it was being taken",
        "call start_run again; another controller is taking it right now",
    )


def renew(
    ws: Workspace,
    case: Case,
    key: str,
    run_id: str,
    fence: int,
    owner: ProcRef | None = None,
    extra_procs: list[LoadRef] | None = None,
    timeout_s: float | None = None,
) -> Lease:
    """Heartbeat: extend the lease; FenceRejected when someone took it over; RemoteError when the lease host
    cannot be asked (the caller stops its load before the lease it last renewed expires)."""
    ssh = lease_host(case)
    if ssh is None:
        return leases.renew(ws, key, run_id, fence, owner=owner, extra_procs=extra_procs)
    from caseledger.services import lease_host as lh  # lazy: SSH only for a lease host
    from caseledger.services.remote import COMMAND_TIMEOUT_S, CONNECT_TIMEOUT_S  # lazy: as above

    want = Lease(key, run_id, owner, fence, 0.0, list(extra_procs or []), workspace=str(ws.root))
    ans = lh.operate(
        ssh,
        "renew",
        key,
        want,
        lease_s=LEASE_SECONDS,
        timeout_s=CONNECT_TIMEOUT_S + COMMAND_TIMEOUT_S if timeout_s is None else timeout_s,
    )
    if ans.status != 0 or ans.lease is None:
        if ans.lease is not None:
            ans.lease.lease_host = _where(ssh)
            leases.mirror(ans.lease)  # this host's appends are checked against the new owner's fence
        raise FenceRejected(
            f"lease of target '{key}' on {_where(ssh)} is no longer held by run {run_id} with fence {fence}",
            "this owner must stop; the current holder is in the lease file on the lease host",
        )
    ans.lease.lease_host = _where(ssh)
    leases.mirror(ans.lease)
    return ans.lease


def release(ws: Workspace, case: Case, key: str, run_id: str, fence: int) -> None:
    """Free the target when run_id still holds it with this fence (a lease host that does not answer: the
    lease lapses at its expiry)."""
    ssh = lease_host(case)
    if ssh is None:
        leases.release(ws, key, run_id, fence)
        return
    from caseledger.services import lease_host as lh  # lazy: SSH only for a lease host

    ans = lh.operate(ssh, "release", key, Lease(key, run_id, None, fence, 0.0), lease_s=LEASE_SECONDS)
    if ans.lease is not None:
        ans.lease.lease_host = _where(ssh)
        cur = leases.read_lease(ws, key)
        if cur is None or cur.fence <= ans.lease.fence:
            leases.mirror(ans.lease)


def deadline_after(sent_mono: float) -> float:
    """The monotonic time by which a lease renewed by a request sent at `sent_mono` has surely expired (the
    lease host adds the lease's length at its own clock, after it received the request)."""
    return sent_mono + LEASE_SECONDS


__all__ = ["acquire", "deadline_after", "lease_host", "release", "renew"]
