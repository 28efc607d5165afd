"""The load and confirm_end phases of a formal load shared by load.processes = P > 1 client processes.

The controller spawns P armed clients (`python -m caseledger.load RUN k`, files under load/p<k>/), reserves each
one's share of the raw disk, waits until every one has built its plan (load/p<k>/ready), then writes one go
(load/go, naming the monotonic instant every schedule starts at). From the go on no client of the run is ever
spawned again: a resume re-attaches to the live ones and takes the others' files as they are, so a killed
process's sent-but-unrecorded requests are never re-sent (its sent.log says how many). When every process has
ended or is gone, load/parts.py merges their files into load/ and the one-process checks follow (load_ended).
On load hosts (load.host with load.processes, or load.hosts) the processes run there (run/remote/load.py: started
armed, one go for every host, followed and copied back per process into load/p<k>/, sealed); the merge, the
counts and the checks here are the same, each host's clock offset applied by the merge. Both ends of the load
are run/load/ends.py's, as for one client; the values are typed: end files (LoadEnd), the previous attempt
(PhaseAttempt), process references (procs.LoadRef), the evidence (LoadEvidence, ConfirmEndEvidence).
"""

from __future__ import annotations

import math
import time
from typing import Any

from caseledger import procs
from caseledger.case.phases import Phase
from caseledger.errors import FailureClass, PhaseFailed
from caseledger.faults import checkpoint
from caseledger.ledger import event_types as et
from caseledger.ledger.evidence import ConfirmEndEvidence, LoadEnd, LoadEvidence, PhaseAttempt
from caseledger.ledger.runs import Run
from caseledger.load.parts import READY_TIMEOUT_S, go_record, merge, split_concurrency
from caseledger.load.schedule import raw_bytes_needed, schedule_of
from caseledger.procs import LoadRef
from caseledger.records import read_records
from caseledger.run.load import ends, one
from caseledger.run.load.watch import LoadWatch
from caseledger.run.remote import load as remote_load
from caseledger.workspace import PartPaths, read_json_or_none, write_json


def _started(run: Run, parts: list[PartPaths]) -> bool:
    """The go was given, or some process left evidence of sending: from here on nothing is spawned again."""
    return run.paths.load_go.exists() or any(
        p.load_anchor.exists() or (p.raw.exists() and p.raw.stat().st_size > 0) for p in parts
    )


def load(run: Run, attempt: int, event: et.Emit) -> LoadEvidence:
    """Start the P processes once (one go), or re-attach; wait for all; merge; the load evidence. On load hosts
    (load.host, load.hosts) run/remote/load.py starts, follows and copies them; the merge is the same."""
    paths, case = run.paths, run.case
    parts = [paths.load_part(k) for k in range(case.load.total_processes)]
    end, prev = ends.set_aside(run, attempt)
    if end is not None:  # merged by a controller that died before it recorded the phase
        return ends.load_ended(run, end, prev, LoadEvidence(reattached=True, processes=len(parts)))
    if case.load.host_shares():
        part_ends, info = _remote(run, parts, event, prev, attempt)
    else:
        reattached = _started(run, parts)
        if reattached:
            refs: list[LoadRef | None] = [read_json_or_none(p.load_pid) for p in parts]  # JSON: load/p<k>/pid.json
        else:
            refs = _start(run, parts, event, prev, attempt)
            checkpoint("controller", "during", "load", delay_s=0.5)
        part_ends, info = _wait_all(run, parts, refs, event), LoadEvidence(reattached=reattached)
    merged = merge(paths, parts, schedule_of(run).digest())
    info = info.merged(LoadEvidence(processes=merged.per_part))
    gone = [k for k, e in enumerate(part_ends) if e is None]
    if gone:
        unarmed = [
            f"; process {k} gave up before its go ({ns['reason']}) and sent nothing" for k, ns in _not_started(parts)
        ]
        who = f"load client process{'es' if len(gone) > 1 else ''} {', '.join(map(str, gone))} of {len(parts)}"
        partial = ends.gone_without_end(
            run, merged.records, keep_partial=attempt > 1, who=who, more="".join(unarmed[:2])
        )
        return partial.merged(info)
    end = read_json_or_none(paths.load_end)  # JSON: load/end.json as merge wrote it
    assert end is not None
    return ends.load_ended(run, end, prev, info)


def _not_started(parts: list[PartPaths]) -> list[tuple[int, dict[str, Any]]]:  # JSON: load/p<k>/not_started.json
    """The processes (on a load host) that gave up waiting for a go that came too late, with their record."""
    found = [(k, read_json_or_none(p.load_not_started)) for k, p in enumerate(parts)]
    return [(k, rec) for k, rec in found if isinstance(rec, dict) and not parts[k].load_end.exists()]


def _remote(
    run: Run, parts: list[PartPaths], event: et.Emit, prev: PhaseAttempt, attempt: int
) -> tuple[list[LoadEnd | None], LoadEvidence]:
    """The processes on the load hosts: the checks before the first formal request (once), then run_parts."""
    if not run.paths.load_go.exists():
        ends.before_formal_load(run, prev)
        for part in parts:
            part.load_dir.mkdir(parents=True, exist_ok=True)
        run.paths.load_abort.unlink(missing_ok=True)
    return remote_load.run_parts(run, parts, ends.channel_env(run.case), event, attempt)


def _start(run: Run, parts: list[PartPaths], event: et.Emit, prev: PhaseAttempt, attempt: int) -> list[LoadRef | None]:
    """The checks before the first formal request, the P armed clients, their disk, one go."""
    paths, case = run.paths, run.case
    ends.before_formal_load(run, prev, event)
    need, shares = raw_bytes_needed(run), split_concurrency(case.load.concurrency, len(parts))
    for part, c in zip(parts, shares, strict=True):
        part.load_dir.mkdir(parents=True, exist_ok=True)
        part.load_ready.unlink(missing_ok=True)  # a ready of an earlier controller's clients is not theirs
        ends.reserve_raw(part, case, math.ceil(need * c / case.load.concurrency))
    paths.load_abort.unlink(missing_ok=True)  # an abort left by an earlier attempt would stop the new clients
    # P armed clients waiting for one go cannot run one after another in one process
    procs.launcher().own_process("load.processes > 1 needs real processes: run it outside procs.in_process()")
    refs: list[LoadRef | None] = [one.spawn_client(p, armed=True, case=case) for p in parts]
    _wait_ready(run, parts, refs)
    write_json(paths.load_go, go_record())
    pids = [r["pid"] if r else None for r in refs]
    event(
        et.LoadClientStarted(
            phase=Phase.LOAD,
            attempt=attempt,
            data=et.LoadClientStartedData(pids=pids, processes=len(parts), armed=True),
        )
    )
    return refs


def _wait_ready(run: Run, parts: list[PartPaths], refs: list[LoadRef | None]) -> None:
    """Every process has built its plan and waits for the go; one that exits first stops them all (nothing sent)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not all(p.load_ready.exists() for p in parts):
        dead = [k for k, r in enumerate(refs) if not procs.alive(r) and not parts[k].load_ready.exists()]
        if dead or time.monotonic() > deadline:
            _abort(run, refs)
            k = dead[0] if dead else next(k for k, p in enumerate(parts) if not p.load_ready.exists())
            why = _last_line(parts[k]) if dead else f"not ready within {READY_TIMEOUT_S:g} s"
            raise PhaseFailed(
                f"load client process {k} of {len(parts)} did not start: {why}; no formal request was sent",
                FailureClass.BEFORE_MODEL,
                f"read ledger/runs/{run.run_id}/load/p{k}/client.log, fix the cause, then resume (the load "
                "starts from its first request)",
            )
        time.sleep(0.02)


def _abort(run: Run, refs: list[LoadRef | None]) -> None:
    run.paths.load_abort.touch()
    for ref in refs:
        if ref is not None and procs.alive(ref):
            procs.terminate(ref, grace_s=2.0)
        ends.reap(ref)


def _last_line(part: PartPaths) -> str:
    try:
        lines = part.load_log.read_text(errors="replace").strip().splitlines()
    except OSError:
        lines = []
    return lines[-1][-300:] if lines else "it exited without a word"


def _wait_all(run: Run, parts: list[PartPaths], refs: list[LoadRef | None], event: et.Emit) -> list[LoadEnd | None]:
    """Wait until every process has written its end file or is gone; the end files (None: gone without one)."""
    live = [r for r in refs if r is not None]
    watch = LoadWatch(run, live[0] if live else None, event, live[1:])
    got: list[LoadEnd | None] = [read_json_or_none(p.load_end) for p in parts]  # JSON: the end.json files
    try:
        while True:
            watch.tick()
            waiting = False
            for k, part in enumerate(parts):
                if got[k] is None:
                    got[k] = read_json_or_none(part.load_end)
                if got[k] is None and procs.alive(refs[k]):
                    waiting = True
                else:
                    ends.reap(refs[k])
            if not waiting:
                break
            time.sleep(0.1)
    finally:
        watch.close()
    if any(e is None for e in got):  # an end file written just before the exit
        time.sleep(0.2)
        got = [e if e is not None else read_json_or_none(p.load_end) for e, p in zip(got, parts, strict=True)]
    return got


def confirm_end(run: Run) -> ConfirmEndEvidence:
    """Every process gone; each one's raw records equal its end file's count; the merged stream equals the sum.
    (A load reused from a parent run has no processes here: the one-process check.)"""
    paths = run.paths
    if run.meta.load_reuse:
        return one.confirm_end(run)
    parts = paths.load_parts()
    if run.case.load.host_shares():  # on load hosts: asked there over SSH
        there = remote_load.parts_alive(run, parts)
        if there:
            raise PhaseFailed(
                f"load client process {there[0]} of {len(parts)} still alive on its load host",
                FailureClass.END_UNKNOWN,
                "resume waits",
            )
    refs: list[LoadRef | None] = [read_json_or_none(p.load_pid) for p in parts]  # JSON: load/p<k>/pid.json
    alive = ends.still_alive(refs)
    if alive:
        raise PhaseFailed(
            f"load client process {alive[0]} of {len(parts)} still alive", FailureClass.END_UNKNOWN, "resume waits"
        )
    end: LoadEnd | None = read_json_or_none(paths.load_end)  # JSON: load/end.json as merge wrote it
    partial = read_json_or_none(paths.load_partial)  # JSON: load/partial.json, as PartialLoad wrote it
    if end is None and partial is not None:
        return ends.partial_confirmed(paths, partial, len(read_records(paths.raw).records), len(parts))
    if end is None:
        raise PhaseFailed("no end file", FailureClass.END_UNKNOWN, "resume checks the client processes and raw records")
    for k, part in enumerate(parts):
        own: LoadEnd | None = read_json_or_none(part.load_end)  # JSON: load/p<k>/end.json
        theirs, mine = own.get("done") if own else None, len(read_records(part.raw).records)
        if mine != theirs:
            raise PhaseFailed(
                f"process {k}: raw records {mine} != its end file's done {theirs}",
                FailureClass.END_UNKNOWN,
                "resume re-checks; nothing is re-sent",
            )
    return ends.confirmed(paths, end, processes=len(parts))
