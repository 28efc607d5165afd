"""The formal load on another host (case `load.host`): the same `python -m caseledger.load RUN_DIR`, started over
SSH in a session of its own, followed from the controller, its raw data copied back and hash-checked.

One code path, two hosts: the load host gets a workspace of its own (`load.host.workdir`) holding a copy of the
run (run.json, case.json) and of its dataset, each copied file's sha256 checked there after the copy; the client
reads only that copy and writes raw.jsonl, sent.log, progress.json, anchor.json and end.json in its run directory
exactly as it does locally. The controller polls it over one SSH connection, appends each new complete line of
raw.jsonl and sent.log to the local files (so status counts what is already safe here), copies progress, anchor
and finally the end file, and seals the load only when the local raw data's sha256 equals the remote one.

A lost link never stops the client: the controller reconnects with backoff; past `load.host.reconnect_s` the load
phase fails `end_unknown`, the controller keeps its lease (the remote client's ref is in it, see ledger.leases),
and a resume re-attaches: it checks the remote pid *and* start time, progress and end file, copies what is
missing. Once `load/remote.json` names a launch, no second client is ever started for the run (the remote client
itself also refuses a second start: its flock on raw.jsonl and its anchor, as locally).

The clock relation between the hosts is measured by several round trips to a small remote reader (offset and
its uncertainty, half the shortest round trip) before the load and again after it, and recorded in
load/clock.json and the load evidence: controller wall time = remote wall time - offset_ns (± uncertainty_ns).

Several processes (load.processes > 1 with load.host, or load.hosts: each host with its processes; run_parts, called
by run/load/parts.py): per host one SSH link, the inputs copied once, the clock measured once (recorded in each of
its processes' load/p<k>/clock.json); every process `python -m caseledger.load RUN_DIR k` started armed (its files
under <remote run>/load/p<k>/, remote.json and pid.json under load/p<k>/ here); once every process of every host is
ready the controller writes load/go here (from then on nothing is started again) naming one instant on its wall
clock, and each host gets it as its own monotonic instant (load/parts.write_go_at, through the host's offset). Each
process is then followed, copied and sealed as one client is; a host whose link stays lost is recorded while the
others are followed to their end, then the phase fails end_unknown; load/parts.py merges what came back.

Security: the SSH layer is services/remote.py (host-key policy, key by path only). Remote command lines are
constant script text, integers and `shlex.quote`d paths; the API key travels on the channel's stdin.

The modules, by job: remote_link (the SSH link, remote scripts, the clock reader), remote_preflight (the load host's
preflight and the copy-up), remote_follow (one client: start, follow, copy back, seal), remote_hosts (several
processes on one or more hosts); this module holds the one-client sync faces and re-exports the rest.
"""

from __future__ import annotations

import contextlib
import shlex
from pathlib import Path
from typing import TypedDict

from caseledger import procs
from caseledger.case.phases import Phase
from caseledger.errors import FailureClass, PhaseFailed, RemoteError
from caseledger.ledger import calls
from caseledger.ledger import event_types as et
from caseledger.ledger.evidence import LoadEnd, LoadEvidence
from caseledger.ledger.runs import Run
from caseledger.procs import LoadRef
from caseledger.run.remote.follow import Finish, Follower, Status, clock_record
from caseledger.run.remote.hosts import parts_alive, run_parts, terminate_elsewhere
from caseledger.run.remote.link import Clock, Link, LinkLost, anyio_run, launched, record_path, run_script, where
from caseledger.run.remote.preflight import package_digest, preflight
from caseledger.workspace import atomic_write, read_ref, utc_now, write_json

__all__ = [
    "confirm_gone",
    "launched",
    "package_digest",
    "parts_alive",
    "preflight",
    "run_load",
    "run_parts",
    "snapshot_metrics",
    "terminate_elsewhere",
    "where",
]

_FETCH_PY = (
    "import sys, urllib.request\nwith urllib.request.urlopen(sys.argv[1], timeout=5) as r:\n"
    "    sys.stdout.write(r.read().decode())\n"
)


class _State(TypedDict):
    """What run_load learns on the way: whether it re-attached, the clock measured before a launch."""

    reattached: bool
    clock_before: Clock | None


class _Followed(TypedDict):
    """run_load's client followed to its end: its end file, its ref, the sealing, the last status."""

    end: LoadEnd | None  # the client's end.json
    ref: LoadRef | None  # as load/pid.json holds it (None: never started there)
    fin: Finish
    st: Status


def run_load(run: Run, env: dict[str, str], event: et.Emit, attempt: int) -> tuple[LoadEnd | None, LoadEvidence]:
    """Start the remote client (once per run, ever) or re-attach to it, follow it to its end and seal the copies.

    Returns the end file (None: gone without one) and the load evidence (reattached, host, clock, link, the
    remote ref). PhaseFailed end_unknown
    when the link stays lost (the client keeps running; resume re-attaches), before_model when the load host
    could not be reached before anything was started there."""
    paths, host = run.paths, run.case.load.host
    assert host is not None
    fol = Follower(run)
    state: _State = {"reattached": False, "clock_before": None}

    async def main() -> _Followed:
        rec = launched(paths)
        try:
            if rec is None:
                state["clock_before"] = await fol.launch(env)
                ref = read_ref(paths.load_pid)
                started = et.LoadClientStartedData(pid=ref["pid"] if ref else None, host=where(host), run_dir=fol.rdir)
                event(et.LoadClientStarted(phase=Phase.LOAD, attempt=attempt, data=started))
            else:
                state["reattached"] = True
                ref = procs.ref_of(rec)
                if ref is None:  # the launch's answer was lost: the client's own pid file says
                    ref = await fol.find_pid()
                    if ref:
                        write_json(record_path(paths), {**rec, **ref, "state": "launched"})
                        write_json(paths.load_pid, ref)
                    else:  # never started there (and a second client would refuse: flock + anchor, as locally)
                        state["reattached"] = False
                        state["clock_before"] = await fol.launch(env)
                        ref = read_ref(paths.load_pid)
            end, st = await fol.follow(ref)
            fin = await fol.finish(end)
            if end is None and ref:  # asked over SSH: gone without an end file (status says so, the lease lapses)
                write_json(paths.load_pid, {**ref, "gone_utc": utc_now()})
        finally:
            await fol.link.drop()
        return {"end": end, "ref": ref, "fin": fin, "st": st}

    try:
        out = anyio_run(main)
    except (LinkLost, RemoteError) as e:
        if launched(paths) is None:  # nothing was started on the load host
            raise PhaseFailed(
                f"load host {where(host)} before the load: {e}",
                FailureClass.BEFORE_MODEL,
                "check the link to load.host and the fix above, then resume; nothing was sent",
            ) from None
        done = paths.raw.read_bytes().count(b"\n") if paths.raw.exists() else 0
        what = (
            f"lost the link to load host {where(host)} ({e})"
            if isinstance(e, LinkLost)
            else f"load host {where(host)}: {e.message}"
        )
        raise PhaseFailed(
            f"{what} after {done} of {run.meta.planned} records were copied; the remote client keeps running",
            FailureClass.END_UNKNOWN,
            f"{calls.resume_when_link_back(run.run_id)}: it re-attaches over SSH (pid and start time), "
            "copies what is missing; nothing is re-sent and no second client is started",
        ) from None
    clock = clock_record(paths, host, state["clock_before"], out["fin"]["clock_after"])
    return out["end"], LoadEvidence(
        reattached=state["reattached"],
        host=where(host),
        remote=out["ref"],
        remote_run_dir=fol.rdir,
        clock=dict(clock),
        sealed_sha256=out["fin"]["sealed"],
        link={"reconnects": fol.link.reconnects, "failures": fol.link.failures, "copied_bytes": fol.copied_bytes},
    )


def confirm_gone(run: Run) -> bool:
    """True when the client on the load host is gone (pid with its start time not running); PhaseFailed
    end_unknown when the host cannot be asked."""
    paths, host = run.paths, run.case.load.host
    assert host is not None
    ref = read_ref(paths.load_pid)
    fol = Follower(run)

    async def main() -> bool:
        try:
            return await fol.gone(ref)
        finally:
            await fol.link.drop()

    try:
        return anyio_run(main)
    except (LinkLost, RemoteError) as e:
        raise PhaseFailed(
            f"cannot reach load host {where(host)} to confirm the client ended: {e}",
            FailureClass.END_UNKNOWN,
            calls.resume_when_link_back(run.run_id),
        ) from None


def snapshot_metrics(run: Run, dest: Path) -> str | None:
    """The /metrics text read on the load host (where the controller cannot reach it); who read it, or None (the
    .missing file beside dest gets the load host's reason too)."""
    case = run.case
    host = case.load.host_shares()[0][0]  # the first load host: it reaches the target as every one does
    url = case.target.metrics_url or ""

    async def main() -> tuple[int, bytes]:
        link = Link(host, budget_s=min(host.reconnect_s, 5.0))
        try:
            return await link.call(
                lambda c: run_script(
                    c, f"{shlex.quote(host.python)} -c {shlex.quote(_FETCH_PY)} {shlex.quote(url)} 2>&1"
                ),
                timeout_s=15,
            )
        finally:
            await link.drop()

    try:
        status, out = anyio_run(main)
    except (RemoteError, LinkLost) as e:
        status, out = 255, str(e).encode()
    missing = dest.with_suffix(".missing")
    if status == 0:
        atomic_write(dest, out)
        missing.unlink(missing_ok=True)
        return f"load host ({where(host)})"
    tail = out.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
    with contextlib.suppress(OSError), missing.open("a") as f:
        f.write(f"load host {where(host)}: {tail[0][:300]}\n")
    return None
