"""Creating runs and spawning their detached controllers."""

from __future__ import annotations

import contextlib
import secrets
import subprocess
import time
from collections.abc import Callable, Iterable
from typing import Any

from caseledger import datasets, ledger, procs, services
from caseledger.case.model import Case
from caseledger.case.phases import PHASES, Phase
from caseledger.case.plan import Live, PlanStep, delta, plan
from caseledger.case.store import load_case
from caseledger.errors import CaseledgerError, NotFound
from caseledger.ledger import authorization, calls, queue
from caseledger.ledger import event_types as et
from caseledger.ledger.event_types import ControllerStarted
from caseledger.ledger.events import read_events
from caseledger.ledger.leases import target_key
from caseledger.ledger.runs import Run, RunMeta, latest_run_of_case, new_run_id, write_meta
from caseledger.ledger.state import PhaseState, RunView, fold
from caseledger.procs import child_env
from caseledger.run import lease as run_lease
from caseledger.run.admission.admit import check_start
from caseledger.run.preflight import AHEAD_WAIT_S, hand_over, run_fresh, spawn_ahead, spawn_waiting
from caseledger.workspace import (
    RunPaths,
    Workspace,
    atomic_write,
    canonical_json,
    utc_now,
    write_json,
)


def plan_now(ws: Workspace, case: Case, parent: Case | None = None) -> list[PlanStep]:
    """The plan a run of `case` gets if started now: the load from the delta against the parent, service,
    warmup and routes from the live target (this case's service live and verified? warmed since it started?)."""
    if parent is None and case.parent:
        parent = load_case(ws, case.parent)
    alive, warm, routes = services.live_state(ws, case, target_key(case.canonical()))
    return plan(case, delta(parent, case), parent is not None, Live(service=alive, warm=warm, routes=routes))


def create_run(ws: Workspace, case_id: str, case: Case, fence: int, key: str, rid: str, authorized: str) -> Run:
    """Write the run's directory; `authorized` is the mode that let it start (single is consumed by it)."""
    steps = plan_now(ws, case)
    paths = ws.run(rid)
    paths.root.mkdir(parents=True)
    canon = case.canonical()

    atomic_write(paths.case, canonical_json(canon) + b"\n", mode=0o444)
    src: str | None = None
    if steps[PHASES.index(Phase.LOAD)].action == "reuse":
        src = latest_run_of_case(ws, case.parent or "", with_load_end=True)
        if src is None:
            raise NotFound(
                f"measurement-only case {case_id} needs a finished load of its parent {case.parent}",
                f"run the parent first: {calls.start_run(case.parent or ...)}",
            )
    meta = RunMeta(
        run_id=rid,
        case_id=case_id,
        scenario=case.scenario,
        parent_case=case.parent,
        workspace=str(ws.root),
        dataset_id=datasets.dataset_id_for(case),
        salt=rid if case.load.salt else None,
        planned=case.load.requests,
        target_key=key,
        created_utc=utc_now(),
        created_mono_ns=time.monotonic_ns(),
        plan=steps,
        fence=fence,
        authorized=authorized,
        load_reuse=src,
        load_reused=src is not None,
    )
    write_meta(paths, meta)
    ledger.append_event(
        ws,
        paths,
        et.RunCreated(data=et.RunCreatedData(case_id=case_id, plan={s.phase.value: s.action for s in steps})),
        owner="start_run",
        fence=fence,
        target=key,
    )
    return Run(paths=paths, meta=meta, workspace=ws)


def preflight_case(ws: Workspace, case_id: str, case: Case) -> dict[str, Any]:  # JSON: the answer
    """Preflight a frozen case without a run: no lease, no controller, no service, no request. Allowed while
    paused and while another run holds the target (prepare the next candidate while the target is busy); refused,
    before anything is written, by what would refuse its start (run/admission/admit.py): it says whether the case can
    start."""
    check_start("start_run", [("", case)])
    pid_ = "p-" + secrets.token_hex(4)
    root = ws.preflights_dir / pid_
    root.mkdir(parents=True)
    paths = RunPaths(root)

    atomic_write(paths.case, canonical_json(case.canonical()) + b"\n", mode=0o444)
    write_meta(
        paths,
        RunMeta(
            run_id=pid_,
            case_id=case_id,
            scenario=case.scenario,
            workspace=str(ws.root),
            dataset_id=datasets.dataset_id_for(case),
            salt=pid_ if case.load.salt else None,
            planned=case.load.requests,
            created_utc=utc_now(),
            preflight_only=True,
        ),
    )

    res = run_fresh(root).evidence()  # JSON: preflight.json and the answer, as before
    write_json(paths.preflight_json, res)
    return {"id": pid_, **res}


def spawn_controller_ahead(keep: Iterable[str] = ()) -> subprocess.Popen[bytes]:
    """A controller interpreter started before its run exists: it imports the controller (~0.2 s) while
    start_run takes the lease and writes the run, then reads 'RUN_DIR FENCE' on stdin and runs it exactly as one
    spawned for the run would (its output then goes to the run's controller log). EOF: it exits."""
    return spawn_waiting("caseledger.run.controller", keep)


def _hand_run(ahead: subprocess.Popen[bytes] | None, paths: RunPaths, fence: int) -> int | None:
    """The pid of the controller spawned ahead, handed its run; None when there is none or it died."""
    if ahead is None or ahead.poll() is not None or ahead.stdin is None:
        return None
    try:
        ahead.stdin.write(f"{paths.root} {fence}\n".encode())
        ahead.stdin.close()
    except OSError:
        return None
    return ahead.pid


def spawn_controller(run: Run, fence: int, ahead: subprocess.Popen[bytes] | None = None) -> int:
    """Start the run's detached controller (it reads run.json as written by then), then mark it spawned: the one
    spawned ahead when given and alive (handed the run), else a new one. In the caller's process
    (procs.InProcess): the same controller runs the phase table there and returns when the run ends."""
    paths = run.paths

    def record(ref: procs.LoadRef) -> None:
        write_meta(paths, run.meta.model_copy(update={"controller_spawned": True}))
        # the controller writes its own pid file; write one now so a reader never sees a gap
        write_json(paths.controller_pid, {**ref, "fence": fence})

    pid = _hand_run(ahead, paths, fence)
    if pid is not None:
        record({"pid": pid, "start_time": procs.start_time(pid) or 0, "host": procs.me()["host"]})
        return pid
    argv = [str(paths.root), "--fence", str(fence)]
    part = procs.Part(
        "caseledger.run.controller",
        argv,
        paths.controller_log,
        here=lambda: _controller_here(run, fence, argv),
        env=child_env(keep=run.case.env_names()),
        record=record,
    )
    return int(procs.launcher().start(part)["pid"])


def _controller_here(run: Run, fence: int, argv: list[str]) -> None:
    write_meta(run.paths, run.meta.model_copy(update={"controller_spawned": True}))
    try:
        procs.run_module("caseledger.run.controller", argv)
    finally:  # the run's controller has returned: no reader may take the caller's pid for a live controller
        write_json(run.paths.controller_pid, {**procs.gone(procs.me()), "fence": fence})


Progress = Callable[[RunView], None]  # called with each state a wait reads (every poll, about 20 times a second)


def wait_for(
    ws: Workspace, run_id: str, until: str, timeout: float, since: int = 0, progress: Progress | None = None
) -> RunView:
    """Poll the folded state until `until` ('preflight' ended, 'started': a controller_started event after
    the first `since` events, or 'end' of the run) or the owner died. `progress` sees every state read."""
    deadline = time.monotonic() + timeout
    while True:
        view = fold(ws, run_id)
        if progress is not None:
            progress(view)
        if until == "preflight" and view.phases[Phase.PREFLIGHT].state not in (PhaseState.PENDING, PhaseState.RUNNING):
            return view
        if until == "started":
            started = any(isinstance(e, ControllerStarted) for e in read_events(ws.run(run_id)).events[since:])
            if started or not view.controller_alive or time.monotonic() > deadline:
                return view
            time.sleep(0.02)
            continue
        settled = view.state.value not in ("running", "created") and (until != "end" or not view.controller_alive)
        if settled or time.monotonic() > deadline:
            return view
        time.sleep(0.05)


def launch(
    ws: Workspace,
    case_id: str,
    case: Case,
    *,
    wait: bool = False,
    timeout_s: float = 3600.0,
    progress: Progress | None = None,
    ahead: subprocess.Popen[bytes] | None = None,
    controller_ahead: subprocess.Popen[bytes] | None = None,
) -> RunView:
    """The core of start_run, shared by the tool and the queue: check authorization, take the target's lease
    before anything is written, create the run, spawn its controller (which adopts the lease's fence), and
    wait until preflight has ended (or the whole run, with wait=True). TargetHeld when the target is busy, or
    another workspace keeps a service there that this case may not use (services/kept.py).
    `ahead`: a preflight process spawned earlier with spawn_ahead (a campaign's driver starts the next point's
    while the previous point post-processes); it is handed this run, or killed if it is not used."""
    # a variable caseledger cannot use, or what the host's policy does not allow: named before anything is written
    check_start("start_run", [("", case)])
    key = target_key(case.canonical())
    rid = new_run_id(ws)
    ctl = controller_ahead
    try:
        # a service another workspace keeps on the target, not this case's: TargetHeld naming it, before the lease
        # is taken (a waiting campaign's driver asks every second: the owner's own runs keep the lease free)
        services.refuse_kept_elsewhere(ws, case, key)
        # in the caller's process (procs.InProcess) nothing runs ahead: preflight runs in the phase table there
        if ahead is None or ahead.poll() is not None:
            keep = case.env_names()  # its imports overlap the lease, the run's files, the controller
            ahead = procs.launcher().ahead(lambda: spawn_ahead(keep))
        ctl = ctl or procs.launcher().ahead(lambda: spawn_controller_ahead(case.env_names()))  # the same, controller
        with authorization.claim(ws, rid) as mode:
            lease = run_lease.acquire(ws, case, key, run_id=rid, owner=None)
            try:
                services.refuse_kept_elsewhere(ws, case, key)  # again under the lease: no start can come between
                run = create_run(ws, case_id, case, lease.fence, key, rid, authorized=mode)
                if ahead is not None:
                    hand_over(ahead, run.paths)
                spawn_controller(run, lease.fence, ctl)
            except BaseException:
                run_lease.release(ws, case, key, rid, lease.fence)
                raise
        return wait_for(ws, rid, "end" if wait else "preflight", timeout_s if wait else 300.0, progress=progress)
    finally:
        for p in (ahead, ctl):
            if p is not None and p.stdin is not None and not p.stdin.closed:
                drop_unhanded(p)  # never handed a run (refused start): nothing of it is needed
        if ahead is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                ahead.wait(timeout=AHEAD_WAIT_S)  # the handed preflight is short-lived: reaped here


def drop_unhanded(p: subprocess.Popen[bytes]) -> None:
    """Stop a process spawned ahead that was never handed a run (it only waits on its stdin) and reap it, so a
    long-lived MCP server or campaign driver leaves no zombie."""
    with contextlib.suppress(OSError):
        p.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=AHEAD_WAIT_S)


def start_next(ws: Workspace, key: str) -> str | None:
    """Start the first queued case on a freed target (auto only). Returns the new run id or None."""
    if authorization.current_mode(ws) != "auto":
        return None
    item = queue.pop(ws, key)
    if item is None:
        return None
    try:
        return launch(ws, item["case_id"], load_case(ws, item["case_id"])).run_id
    except CaseledgerError:
        return None  # the queued case could not start (e.g. held again): its start_run error is the record
