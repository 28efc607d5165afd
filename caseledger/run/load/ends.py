"""The two ends of a formal load, one for each of its four ways (one client or P processes, here or on load hosts;
run/load/one.py and run/load/parts.py): the checks right before its first formal request (`before_formal_load`),
the failure an end that never came maps to (`gone_without_end`), the load evidence built from an end file
(`load_ended`), and confirm_end's evidence from the records counted against it (`confirmed`). A new way of
running the load calls these and decides nothing of its own about either end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx

from caseledger import procs, redact, services
from caseledger.case.model import Case
from caseledger.case.target import origin
from caseledger.errors import FailureClass, PhaseFailed
from caseledger.ledger import event_types as et
from caseledger.ledger.evidence import ConfirmEndEvidence, LoadEnd, LoadEvidence, PartialLoad, PhaseAttempt
from caseledger.ledger.runs import Run
from caseledger.ledger.state import RESEND_CLASSES, load_counts
from caseledger.load.client import client_timing
from caseledger.procs import LoadRef
from caseledger.records import read_records
from caseledger.run.load.failures import check_failures, wait_idle
from caseledger.run.load.watch import wait_quiet
from caseledger.run.remote import load as remote_load
from caseledger.services import net
from caseledger.workspace import RunPaths, read_json_or_none, reserve, sha256_file, write_json


def set_aside(run: Run, attempt: int) -> tuple[LoadEnd | None, PhaseAttempt]:
    """(the end file, the previous load attempt's record); a load whose previous attempt failed in a resend class
    (the formal entry rejected every request, or the service died under it) is kept aside, marked, and the
    load/ directory starts empty: the load is sent again."""
    paths = run.paths
    paths.load_dir.mkdir(parents=True, exist_ok=True)
    end: LoadEnd | None = read_json_or_none(paths.load_end)  # JSON: load/end.json as the load client wrote it
    prev = PhaseAttempt.read(paths.phase_file("load"))
    if end is not None and prev.failure_class in RESEND_CLASSES:
        old = paths.load_attempt_dir(prev.attempt if prev.attempt is not None else attempt - 1)
        paths.load_dir.rename(old)
        write_json(
            old / "superseded.json",
            {
                "failure_class": prev.failure_class,
                "error": redact.mask_obj(prev.error),
                "superseded_by_attempt": attempt,
            },
        )
        paths.load_dir.mkdir()
        end = None
    return end, prev


def before_formal_load(run: Run, prev: PhaseAttempt, event: et.Emit | None = None) -> None:
    """Right before the first formal request, for every way the load runs: the service re-verified, what an
    abandoned attempt left queued at the engine drained, so it cannot overlap this load, (when asked,
    CASELEDGER_QUIET_WAIT_S, and the load is sent from here: `event` given) a bounded, recorded wait for a quiet
    host, and the server's counters read before it."""
    problem = services.check_live(run.workspace, run.case, run.meta.target_key or "")
    if problem is not None:
        raise PhaseFailed(
            f"before the formal load: {problem}",
            FailureClass.SERVICE,
            "resume starts the service once, then warmup and the load (nothing was sent)",
            evidence={"service_problem": problem},
        )
    if prev.failure_class in RESEND_CLASSES:
        wait_idle(run.case)
    if event is not None:
        wait_quiet(run, event)
    read_counters(run, run.paths.metrics_before)


def reserve_raw(paths: RunPaths, case: Case, need: int) -> None:
    """Allocate the disk the raw records will need before the first formal request is sent: a full disk
    then refuses the load with nothing sent, instead of losing the records of requests that were served.
    need: bytes for this raw file (the whole load's, or one process's share of a shared load)."""
    fd = os.open(paths.raw, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        ok = reserve(fd, need)
    finally:
        os.close(fd)
    if not ok:
        free = shutil.disk_usage(paths.load_dir).free
        raise PhaseFailed(
            f"disk full: cannot reserve {need / 1e6:.1f} MB for {paths.raw.relative_to(paths.root)} "
            f"({free / 1e6:.1f} MB free in "
            f"{paths.load_dir}); no formal request was sent",
            FailureClass.DISK,
            "free disk space, then resume: the load starts from its first request",
        )


def snapshot_counters(case: Case, dest: Path) -> str | None:
    """Prometheus counters before/after the formal load (spec decode); absence is recorded, not fatal. Who read
    them (this host), or None."""
    url = case.target.metrics_url or origin(case.target.endpoints[0].base_url) + "/metrics"
    try:
        r = net.get(url, timeout=5)
        if r.status_code == 200:
            dest.write_text(r.text)
            return f"controller ({procs.me()['host']})"
        dest.with_suffix(".missing").write_text(f"HTTP {r.status_code} from {url}\n")
    except httpx.HTTPError as e:
        dest.with_suffix(".missing").write_text(redact.mask(f"{type(e).__name__}: {e} ({url})\n"))
    return None


def read_counters(run: Run, dest: Path) -> str | None:
    """The counters snapshot from the host that can reach /metrics: the controller, else the load host (load.host,
    over SSH). Which host read them, or None (the .missing file says why)."""
    by = snapshot_counters(run.case, dest)
    if by is None and run.case.load.host_shares():
        by = remote_load.snapshot_metrics(run, dest)
    with contextlib.suppress(OSError):
        old = read_json_or_none(run.paths.load_dir / "metrics_read_by.json") or {}
        write_json(run.paths.load_dir / "metrics_read_by.json", {**old, dest.stem: by})
    return by


def load_ended(run: Run, end: LoadEnd, prev: PhaseAttempt, extra: LoadEvidence) -> LoadEvidence:
    """The checks after the load client's end file (local or remote, or the merge of several processes'); the
    load evidence: `extra` (how the load was followed) with the end file's counts."""
    paths, case, planned = run.paths, run.case, run.meta.planned
    read_by = read_counters(run, paths.metrics_after)
    if end.get("exit") == "disk_full" and prev.failure_class != FailureClass.DISK:
        raise PhaseFailed(
            f"{end.get('reason')}: {end['done']} of {planned} requests recorded, {planned - end['sent']} never sent",
            FailureClass.DISK,
            "free disk space, then resume: the recorded requests are kept and nothing is re-sent "
            "(the run ends partial)",
        )
    recs = read_records(paths.raw).records  # once: the failure check and the client timing both read them
    if end.get("failed", 0):
        problem = services.check_live(run.workspace, case, run.meta.target_key or "")
        if problem is not None:
            raise PhaseFailed(
                f"the service failed during the formal load: {problem}; {end['failed']} of {end['done']} requests "
                "failed",
                FailureClass.SERVICE,
                "resume starts the service once and sends the load again as a new attempt (this attempt's raw "
                "data is kept aside, marked superseded)",
                evidence={"service_problem": problem},
            )
        check_failures(case, recs)
    ended = LoadEvidence(
        planned=end["planned"],
        sent=end["sent"],
        done=end["done"],
        ok=end["ok"],
        failed=end["failed"],
        metrics_read_by=read_by,
        client_timing=client_timing(
            recs, case.load.concurrency, case.load.rate is None, read_json_or_none(paths.load_anchor)
        ),
        raw_sha256=sha256_file(paths.raw) if paths.raw.exists() else None,
    )
    return extra.merged(ended)


def partial_load(paths: RunPaths, planned: int, done: int) -> LoadEvidence:
    """Resume after the load client died mid-load: keep what finished, re-send nothing.

    Requests sent but not recorded were in flight at the kill (the server may have served them); those never
    sent stay unsent: sending them now would change the load the case describes. The run finishes on the
    records it has and says so (load ended: partial; the decision lists the gap)."""
    counts = load_counts(paths, planned)
    sent = max(counts.sent, done)
    # sent: recorded before each request's first byte left, so the target counted at most this many (a kill
    # between the record and the send is the only difference, microseconds wide)
    partial = PartialLoad(
        planned=planned,
        done=done,
        sent=sent,
        in_flight_lost=sent - done,
        never_sent=planned - sent,
        reason="load client died without an end file; formal requests are never re-sent",
    )
    write_json(paths.load_partial, partial.evidence())
    return LoadEvidence(outcome="done", partial=True, **partial.model_dump())


def channel_env(case: Case) -> dict[str, str]:
    """What a load client on another host gets from here: the API key's variable (sent on the SSH channel), no
    other variable of the controller's."""
    key_env = case.target.api_key_env
    return {key_env: os.environ[key_env]} if key_env and key_env in os.environ else {}


def no_end_file(run: Run, records: int, *, who: str = "load client", more: str = "") -> PhaseFailed:
    """The failure of a load whose client (or one of its processes) is gone without an end file: end_unknown,
    its records kept; formal requests are never re-sent automatically."""
    return PhaseFailed(
        f"{who} exited without an end file: {records} of {run.meta.planned} requests recorded{more}",
        FailureClass.END_UNKNOWN,
        "formal requests are never re-sent automatically; the raw records are kept (resume finishes on them)",
    )


def gone_without_end(
    run: Run, records: int, *, keep_partial: bool, who: str = "load client", more: str = ""
) -> LoadEvidence:
    """A load found gone without an end file. `keep_partial` (a resume found the load started and its client
    gone): the records it has are the load, partial, nothing re-sent; otherwise `no_end_file`."""
    if keep_partial:
        return partial_load(run.paths, run.meta.planned, records)
    raise no_end_file(run, records, who=who, more=more)


EXIT_WAIT_S = 30.0  # a client that wrote its end file is exiting: confirm_end waits this long for it to be gone


def reap(ref: LoadRef | None) -> None:
    """Collect a client's exit status when it is our child (no zombie); anything else is left as it is."""
    if ref is None:
        return
    with contextlib.suppress(ChildProcessError, TypeError, KeyError, ValueError):  # a pid.json of another form
        os.waitpid(int(ref["pid"]), os.WNOHANG)


def still_alive(refs: list[LoadRef | None]) -> list[int]:
    """Wait, at most EXIT_WAIT_S, until every client these refs name has exited (reaping our children); the
    indexes of those still alive."""
    deadline = time.monotonic() + EXIT_WAIT_S
    while any(procs.alive(r) for r in refs) and time.monotonic() < deadline:
        for r in refs:
            reap(r)
        time.sleep(0.05)
    return [k for k, r in enumerate(refs) if procs.alive(r)]


def confirmed(paths: RunPaths, end: LoadEnd, processes: int | None = None) -> ConfirmEndEvidence:
    """confirm_end's evidence once every client is gone: the raw records (merged, for several processes) counted
    against the end file and sealed with their sha256; PhaseFailed end_unknown when they differ. `processes` is
    set only for several client processes."""
    n = len(read_records(paths.raw).records)
    if n != end["done"]:
        raise PhaseFailed(
            f"raw records {n} != end file done {end['done']}",
            FailureClass.END_UNKNOWN,
            "resume re-checks; nothing is re-sent",
        )
    more = {} if processes is None else {"processes": processes}
    return ConfirmEndEvidence(
        client_gone=True,
        end_file=True,
        records=n,
        planned=end["planned"],
        sent=end["sent"],
        all_accounted=n == end["sent"] == end["planned"],
        raw_sha256=sha256_file(paths.raw),
        **more,
    )


def partial_confirmed(
    paths: RunPaths,
    partial: dict[str, Any],  # JSON: load/partial.json, as PartialLoad wrote it
    records: int,
    processes: int | None = None,
) -> ConfirmEndEvidence:
    """The confirm_end evidence of a load accepted as partial: its clients gone, no end file, the raw records kept.
    `processes` is set only for several client processes."""
    kept = PartialLoad.model_validate(partial)
    more = {} if processes is None else {"processes": processes}
    return ConfirmEndEvidence(
        client_gone=True,
        end_file=False,
        records=records,
        planned=kept.planned,
        partial=kept,
        all_accounted=False,
        raw_sha256=sha256_file(paths.raw),
        **more,
    )
