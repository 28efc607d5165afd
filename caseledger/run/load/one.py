"""One load client, here or on load.host: started once (armed ahead, or now), followed to its end file; a load
reused from a parent run. Its evidence is a `LoadEvidence` (ledger/evidence.py), or PhaseFailed with a failure
class. Both ends of the load (the checks before the first formal request, the end evidence, an end that never
came) are run/load/ends.py's, shared with run/load/parts.py (load.processes > 1).
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time

from caseledger import procs
from caseledger.case.model import Case
from caseledger.case.phases import Phase
from caseledger.errors import FailureClass, PhaseFailed
from caseledger.faults import checkpoint
from caseledger.ledger import event_types as et
from caseledger.ledger.evidence import ConfirmEndEvidence, LoadEnd, LoadEvidence, PhaseAttempt
from caseledger.ledger.runs import Run
from caseledger.load.parts import ARMED_ENV
from caseledger.load.schedule import raw_bytes_needed
from caseledger.procs import LoadRef, child_env
from caseledger.records import read_records
from caseledger.run.load import ends
from caseledger.run.load.watch import LoadWatch
from caseledger.run.remote import load as remote_load
from caseledger.workspace import PartPaths, RunPaths, read_json_or_none, sha256_file, write_json


def load(run: Run, attempt: int, event: et.Emit) -> LoadEvidence:
    """Start (or re-attach to) the load client and wait for it; never start a second client over raw data.
    (load.processes > 1: run/load/parts.py, which the controller calls instead.)

    event(model) appends an event of this run under its owner's fence."""
    paths = run.paths
    end, prev = ends.set_aside(run, attempt)
    if run.case.load.host is not None:
        return _load_remote(run, attempt, event, prev, end)
    pid: LoadRef | None = read_json_or_none(paths.load_pid)  # JSON: load/pid.json as spawn_client wrote it
    # a client whose formal load started (e.g. under a controller that died): wait for it
    reattached = end is None and procs.alive(pid) and paths.load_go.exists()
    if end is None and not reattached:
        n_raw = len(read_records(paths.raw).records)
        started = paths.load_anchor.exists() or n_raw > 0
        if started or (paths.raw.exists() and paths.raw.stat().st_size):
            return ends.gone_without_end(run, n_raw, keep_partial=started and attempt > 1)
        pid = _start(run, prev, attempt, event)
    seen = LoadEvidence(reattached=reattached)
    if end is None:
        end, seen = _follow(run, pid, event, seen)
    return ends.load_ended(run, end, prev, seen)


def _start(run: Run, prev: PhaseAttempt, attempt: int, event: et.Emit) -> LoadRef:
    """The checks before the first formal request, the raw data's disk, the client (the armed one when it is
    ready), the go."""
    paths = run.paths
    ends.before_formal_load(run, prev, event)
    ends.reserve_raw(paths, run.case, raw_bytes_needed(run))
    armed: LoadRef | None = read_json_or_none(paths.load_armed)  # JSON: load/armed.json (spawn_client's)
    if armed and procs.alive(armed) and not paths.load_anchor.exists():
        pid = armed  # spawned while preflight ran: it has imported and built its plan already
    else:
        pid = spawn_client(paths, armed=False, case=run.case)
    paths.load_go.touch()
    data = et.LoadClientStartedData(pid=pid["pid"], armed=pid is armed)
    event(et.LoadClientStarted(phase=Phase.LOAD, attempt=attempt, data=data))
    checkpoint("controller", "during", "load", delay_s=0.5)
    return pid


def _follow(run: Run, pid: LoadRef | None, event: et.Emit, seen: LoadEvidence) -> tuple[LoadEnd, LoadEvidence]:
    """Watch the client until its end file; the end file and `seen` with the client's stops. A client gone
    without one: ends.gone_without_end (its records are kept)."""
    paths = run.paths
    watch = LoadWatch(run, pid, event)
    end: LoadEnd | None = None
    try:
        while end is None:
            watch.tick()
            if not procs.alive(pid):
                ends.reap(pid)
                end = read_json_or_none(paths.load_end)
                if end is None:
                    time.sleep(0.2)  # an end file written just before the exit
                    end = read_json_or_none(paths.load_end)
                if end is None:
                    raise ends.no_end_file(run, len(read_records(paths.raw).records))
                break
            time.sleep(0.1)
            end = read_json_or_none(paths.load_end)
    finally:
        watch.close()
    assert end is not None
    if watch.stops:  # unset: the client never stopped
        seen = seen.model_copy(update={"client_stopped_s": watch.stops})
    return end, seen


def _load_remote(run: Run, attempt: int, event: et.Emit, prev: PhaseAttempt, end: LoadEnd | None) -> LoadEvidence:
    """The load client on load.host (run/remote/load.py): started once per run, followed, its raw data copied
    back and sealed; a lost link is end_unknown (the client keeps running, resume re-attaches)."""
    paths = run.paths
    extra = LoadEvidence(reattached=False)
    if end is None:
        if remote_load.launched(paths) is None:
            ends.before_formal_load(run, prev)
        end, extra = remote_load.run_load(run, ends.channel_env(run.case), event, attempt)
        if end is None:
            n_raw = len(read_records(paths.raw).records)
            started = paths.load_anchor.exists() or n_raw > 0
            who = f"load client on {extra.host}"
            return ends.gone_without_end(run, n_raw, keep_partial=started and attempt > 1, who=who).merged(extra)
    return ends.load_ended(run, end, prev, extra)


def confirm_end(run: Run) -> ConfirmEndEvidence:
    """The load client gone, its raw records counted against its end file (or a partial load's record) and
    sealed with their sha256; PhaseFailed end_unknown while that cannot be confirmed."""
    paths, reused = run.paths, bool(run.meta.load_reuse)
    end: LoadEnd | None = read_json_or_none(paths.load_end)  # JSON: load/end.json as the load client wrote it
    partial = read_json_or_none(paths.load_partial)  # JSON: load/partial.json, as PartialLoad wrote it
    if end is None and partial is not None:
        n = len(read_records(paths.raw).records)
        if procs.alive(read_json_or_none(paths.load_pid)):
            raise PhaseFailed("load client alive again", FailureClass.END_UNKNOWN, "resume waits for it")
        return ends.partial_confirmed(paths, partial, n)
    if end is None:
        raise PhaseFailed("no end file", FailureClass.END_UNKNOWN, "resume checks the client process and raw records")
    pid: LoadRef | None = read_json_or_none(paths.load_pid)  # JSON: load/pid.json
    if not reused and run.case.load.host is not None and not remote_load.confirm_gone(run):
        raise PhaseFailed(
            f"load client on {remote_load.where(run.case.load.host)} still alive after its end file",
            FailureClass.END_UNKNOWN,
            "resume waits for it",
        )
    if not reused and ends.still_alive([pid]):  # it wrote its end file and is exiting
        raise PhaseFailed(
            f"load client still alive {ends.EXIT_WAIT_S:g} s after its end file",
            FailureClass.END_UNKNOWN,
            "resume waits for it",
        )
    return ends.confirmed(paths, end)


def spawn_client(paths: RunPaths, armed: bool, case: Case) -> LoadRef:
    """Start the load client detached; its process reference, written to load/pid.json (and load/armed.json) as
    procs and leases read it. Armed: it loads everything, then waits for load/go (or abort)."""
    paths.load_dir.mkdir(parents=True, exist_ok=True)
    env = child_env(keep=case.env_names())  # its API key variable, nothing else of the caller's
    if armed:
        env[ARMED_ENV] = "1"
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
