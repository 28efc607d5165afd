"""The load phase the controller runs: the load client started once (armed ahead, or now), followed to its end
file, its failures classed; a load reused from a parent run. Its evidence is a `LoadEvidence`
(ledger/evidence.py), or PhaseFailed with a failure class.

The other phases' bodies: run/prepare.py (warmup, route_verify, cache_prepare), run/after_load.py
(confirm_end, postprocess, decide); the load's watch and failure classes: run/load_watch.py,
run/load_failures.py. run/load_parts.py (load.processes > 1) calls this module's names with the same typed
values: the end file (LoadEnd), the previous attempt (PhaseAttempt), process references (procs.LoadRef) and the
load evidence (LoadEvidence); JSON dicts only where a file is read or written.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from pathlib import Path

import httpx2 as httpx

from caseledger import procs, redact, services
from caseledger.case.model import Case
from caseledger.case.phases import Phase
from caseledger.case.target import origin
from caseledger.errors import FailureClass, PhaseFailed
from caseledger.faults import checkpoint
from caseledger.ledger import event_types as et
from caseledger.ledger.evidence import LoadEnd, LoadEvidence, PartialLoad, PhaseAttempt
from caseledger.ledger.runs import Run
from caseledger.ledger.state import RESEND_CLASSES, load_counts
from caseledger.load.client import client_timing
from caseledger.load.plan import raw_bytes_needed
from caseledger.procs import LoadRef, child_env
from caseledger.records import read_records
from caseledger.run.load_failures import check_failures, wait_idle
from caseledger.run.load_watch import LoadWatch, wait_quiet
from caseledger.run.remote import load as remote_load
from caseledger.services import net
from caseledger.workspace import PartPaths, RunPaths, read_json_or_none, reserve, sha256_file, write_json


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


def load(run: Run, attempt: int, event: et.Emit) -> LoadEvidence:
    """Start (or re-attach to) the load client and wait for it; never start a second client over raw data.
    (load.processes > 1: run/load_parts.py, which the controller calls instead.)

    event(model) appends an event of this run under its owner's fence."""
    paths, case, planned = run.paths, run.case, run.meta.planned
    end, prev = set_aside(run, attempt)
    if case.load.host is not None:
        return _load_remote(run, attempt, event, prev, end)
    pid: LoadRef | None = read_json_or_none(paths.load_pid)  # JSON: load/pid.json as spawn_client wrote it
    reattached = False
    go = paths.load_go
    if end is None and procs.alive(pid) and go.exists():
        reattached = True  # a client whose formal load started (e.g. under a controller that died): wait for it
    elif end is None:
        n_raw = len(read_records(paths.raw).records)
        started = paths.load_anchor.exists() or n_raw > 0
        if started and attempt > 1:
            return partial_load(paths, planned, n_raw)
        if n_raw or (paths.raw.exists() and paths.raw.stat().st_size):
            raise PhaseFailed(
                f"load client is gone without an end file after {n_raw} of {planned} records",
                FailureClass.END_UNKNOWN,
                "formal requests are never re-sent automatically; the raw records are kept",
            )
        before_formal_load(run, prev, event)
        reserve_raw(paths, case, raw_bytes_needed(run))
        snapshot_counters(case, paths.metrics_before)
        armed: LoadRef | None = read_json_or_none(paths.load_armed)  # JSON: load/armed.json (spawn_client's)
        if armed and procs.alive(armed) and not paths.load_anchor.exists():
            pid = armed  # spawned while preflight ran: it has imported and built its plan already
        else:
            pid = spawn_client(paths, armed=False, case=case)
        go.touch()
        event(
            et.LoadClientStarted(
                phase=Phase.LOAD, attempt=attempt, data=et.LoadClientStartedData(pid=pid["pid"], armed=pid is armed)
            )
        )
        checkpoint("controller", "during", "load", delay_s=0.5)
    watch = LoadWatch(run, pid, event)
    while end is None:
        watch.tick()
        if not procs.alive(pid):
            if pid is not None:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(int(pid["pid"]), os.WNOHANG)
            end = read_json_or_none(paths.load_end)
            if end is None:
                time.sleep(0.2)
                end = read_json_or_none(paths.load_end)
            if end is None:
                n = len(read_records(paths.raw).records)
                raise PhaseFailed(
                    f"load client exited without an end file: {n} of {planned} requests done",
                    FailureClass.END_UNKNOWN,
                    "raw records are kept; resume confirms the evidence",
                )
            break
        time.sleep(0.1)
        end = read_json_or_none(paths.load_end)
    watch.close()
    seen = LoadEvidence(reattached=reattached)
    if watch.stops:  # unset: the client never stopped
        seen = seen.model_copy(update={"client_stopped_s": watch.stops})
    return load_ended(run, end, prev, seen)


def before_formal_load(run: Run, prev: PhaseAttempt, event: et.Emit | None = None) -> None:
    """Right before the first formal request (one client process or several): the service re-verified, what
    an abandoned attempt left queued at the engine drained, so it cannot overlap this load, and (when asked,
    CASELEDGER_QUIET_WAIT_S) a bounded, recorded wait for a quiet host."""
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


def _load_remote(run: Run, attempt: int, event: et.Emit, prev: PhaseAttempt, end: LoadEnd | None) -> LoadEvidence:
    """The load client on load.host (run/remote/load.py): started once per run, followed, its raw data copied
    back and sealed; a lost link is end_unknown (the client keeps running, resume re-attaches)."""
    paths, case, planned = run.paths, run.case, run.meta.planned
    extra = LoadEvidence(reattached=False)
    if end is None:
        if remote_load.launched(paths) is None:
            problem = services.check_live(run.workspace, case, run.meta.target_key or "")
            if problem is not None:  # re-verified right before the first formal request
                raise PhaseFailed(
                    f"before the formal load: {problem}",
                    FailureClass.SERVICE,
                    "resume starts the service once, then warmup and the load (nothing was sent)",
                    evidence={"service_problem": problem},
                )
            if prev.failure_class in RESEND_CLASSES:
                wait_idle(case)
            read_counters(run, paths.metrics_before)
        key_env = case.target.api_key_env  # the client's only variable from here: the API key, on the channel
        env = {key_env: os.environ[key_env]} if key_env and key_env in os.environ else {}
        end, extra = remote_load.run_load(run, env, event, attempt)
        if end is None:
            n_raw = len(read_records(paths.raw).records)
            if (paths.load_anchor.exists() or n_raw) and attempt > 1:
                return partial_load(paths, planned, n_raw).merged(extra)
            raise PhaseFailed(
                f"load client on {extra.host} exited without an end file after {n_raw} of {planned} records",
                FailureClass.END_UNKNOWN,
                "formal requests are never re-sent automatically; the raw records are kept",
            )
    return load_ended(run, end, prev, extra)


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


def spawn_client(paths: RunPaths, armed: bool, case: Case) -> LoadRef:
    """Start the load client detached; its process reference, written to load/pid.json (and load/armed.json) as
    procs and leases read it. Armed: it loads everything, then waits for load/go (or abort)."""
    paths.load_dir.mkdir(parents=True, exist_ok=True)
    env = child_env(keep=case.env_names())  # its API key variable, nothing else of the caller's
    if armed:
        env["CASELEDGER_LOAD_ARMED"] = "1"
    part = [str(paths.part)] if isinstance(paths, PartPaths) else []  # process k of load.processes

    def record(ref: LoadRef) -> None:
        write_json(paths.load_pid, ref)
        if armed:
            write_json(paths.load_armed, ref)

    client = procs.Part(
        "caseledger.load", [str(paths.root), *part], paths.load_log, lambda: _client_inline(paths), env, record
    )
    return procs.launcher().start(client)


def _client_inline(paths: RunPaths) -> LoadRef:
    """The load client's entry run in this process (procs.InProcess), to its end file; its pid.json then says
    gone, so the load phase and confirm_end see a client that has exited. Its log lines go to load/client.log."""
    # lazy: the load client's entry, only for an inline run
    from caseledger.load.__main__ import EXIT_CANCELLED, EXIT_COMPLETE, run_inline

    with paths.load_log.open("a") as log, contextlib.redirect_stdout(log):
        code = run_inline(paths)
    if code not in (EXIT_COMPLETE, EXIT_CANCELLED):
        print(f"inline load client exited {code}", file=sys.stderr)
    ref = procs.gone(procs.me())
    write_json(paths.load_pid, ref)
    return ref


def arm_client(run: Run) -> LoadRef | None:
    """Spawn the client early (armed) when this run will send a formal load that has not started yet."""
    paths = run.paths
    if run.meta.load_reuse or run.meta.action(Phase.LOAD) != "run" or run.case.load.host_shares():
        return None  # (a remote client is started in the load phase, after its inputs are copied there)
    if run.case.load.total_processes > 1:
        return None  # several processes are spawned armed by the load phase, which gives them one go
    if paths.load_end.exists() or paths.load_anchor.exists() or (paths.raw.exists() and paths.raw.stat().st_size):
        return None
    if procs.alive(read_json_or_none(paths.load_pid)):
        return None
    # in the caller's process (procs.InProcess) the client starts in the load phase, not ahead
    return procs.launcher().ahead(lambda: spawn_client(paths, armed=True, case=run.case))


def disarm_client(paths: RunPaths) -> None:
    """An earlier phase failed: the armed client must exit without sending anything."""
    armed: LoadRef | None = read_json_or_none(paths.load_armed)  # JSON: load/armed.json (spawn_client's)
    if armed and not paths.load_anchor.exists() and not paths.load_go.exists():
        paths.load_abort.touch()
        procs.terminate(armed, grace_s=2.0)
    for part in paths.load_parts():  # the processes of a shared load, spawned armed by the load phase
        ref: LoadRef | None = read_json_or_none(part.load_armed)  # JSON: load/p<k>/armed.json
        if ref and not paths.load_go.exists():
            paths.load_abort.touch()
            procs.terminate(ref, grace_s=2.0)


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


def reuse_parent_load(run: Run) -> LoadEvidence:
    """A measurement-only run: the parent run's load files copied, nothing sent."""
    paths, source = run.paths, run.meta.load_reuse
    if source is None:
        raise PhaseFailed(
            f"run {run.run_id} reuses no parent load",
            FailureClass.BEFORE_MODEL,
            "start a new run of the case (start_run)",
        )
    src = run.workspace.run(source).load_dir
    paths.load_dir.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "pid.json":
            shutil.copy2(f, paths.load_dir / f.name)
    return LoadEvidence(outcome="reused", source_run=source, raw_sha256=sha256_file(paths.raw))
