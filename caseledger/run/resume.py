"""resume: continue the SAME run as a new attempt of the first phase that is not done."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import replace

from pydantic import BaseModel, Field

from caseledger import ledger, services
from caseledger.case.phases import Phase
from caseledger.errors import NothingToResume, quoted
from caseledger.ledger import authorization, calls
from caseledger.ledger import event_types as et
from caseledger.ledger.event_types import ControllerStarted
from caseledger.ledger.events import read_events
from caseledger.ledger.runs import load_run, write_meta
from caseledger.ledger.state import RunState, RunView, fold, next_steps
from caseledger.run import lease as run_lease
from caseledger.run.admission.admit import check_start
from caseledger.run.start import Progress, spawn_controller, wait_for
from caseledger.workspace import RunPaths, Workspace

STARTED_TIMEOUT_S = 10.0  # how long resume waits for its controller to adopt the run


class ResumeResult(BaseModel):
    run_id: str
    from_phase: str = Field(description="First phase that will run again (a new attempt)")
    kept: list[str] = Field(description="Phases whose recorded success is kept (never repeated)")
    redo: list[str] = Field(
        default_factory=list, description="Finished phases run again because the service they verified is gone"
    )
    state: str
    reattached: bool = Field(description="A live load client was found and is waited for, not restarted")
    next_call: str

    def text(self) -> str:
        kept = ", ".join(self.kept) or "none"
        how = " (re-attached to the live load client)" if self.reattached else ""
        redo = f"; again (service gone): {', '.join(self.redo)}" if self.redo else ""
        return (
            f"resumed {self.run_id} at {self.from_phase}{how}; kept: {kept}{redo}; state {self.state}\n"
            f"next: {self.next_call}"
        )


def resume(
    workspace: Workspace,
    run_id: str,
    *,
    wait: bool = False,
    timeout_s: float = 3600.0,
    progress: Progress | None = None,
) -> ResumeResult:
    run = load_run(workspace, run_id)
    run_id = run.run_id  # a case id given: its latest run
    v = fold(workspace, run)
    key = _resumable_target(v, run_id)
    check_start("resume", [("", run.case)])  # a resume may start the service again: the same check as start_run
    steps = v.steps or next_steps(v)  # the steps phase_status announced, computed by the same function
    kept = [p for p in v.phases if p not in steps.run]
    first = steps.first or Phase.DECIDE
    # repairing postprocess/decide touches no target: allowed while paused, and it uses up no 'single'
    needs_target = any(p not in (Phase.POSTPROCESS, Phase.DECIDE) for p in steps.run)
    if Phase.SERVICE in steps.run:  # another workspace keeps a service there that is not this case's: named, as
        # at start (a start coming between this and the lease: the service phase names it the same way)
        services.refuse_kept_elsewhere(workspace, run.case, key)
    paths = run.paths
    claim = (
        authorization.claim(workspace, run_id) if needs_target else nullcontext(authorization.current_mode(workspace))
    )
    with claim as mode:
        lease = run_lease.acquire(workspace, run.case, key, run_id, owner=None, same_run_ok=True)  # TargetHeld: holder
        ledger.append_event(
            workspace,
            paths,
            et.Resumed(
                data=et.ResumedData(
                    from_phase=first,
                    runs=list(steps.run),
                    redo=list(steps.redo),
                    kept=kept,
                    client_alive=v.client_alive,
                )
            ),
            owner="resume",
            fence=lease.fence,
            target=key,
        )
        resumed = replace(run, meta=run.meta.model_copy(update={"authorized": mode}))
        write_meta(paths, resumed.meta)  # before the spawn: the controller reads the mode that let it resume
        before = len(read_events(paths).events)
        spawn_controller(resumed, lease.fence)
    state, nxt = _adopted(workspace, paths, v, before, wait, timeout_s, progress)
    return ResumeResult(
        run_id=run_id,
        from_phase=first,
        kept=kept,
        redo=list(steps.redo),
        state=state,
        reattached=v.client_alive,
        next_call=nxt,
    )


def _resumable_target(v: RunView, run_id: str) -> str:
    """The run's target key; NothingToResume when every phase is done, a controller still runs it, or it names
    no target."""
    if v.state in (RunState.SUCCEEDED, RunState.PARTIAL):
        raise NothingToResume(
            f"run {run_id} is {v.state.value}; every phase is done",
            f"{calls.run_succeeded(run_id)} or freeze the next candidate",
        )
    if v.controller_alive:
        raise NothingToResume(f"run {run_id} still has a live controller (phase {v.current})", calls.wait(run_id))
    if v.meta.target_key is None:
        raise NothingToResume(f"run {run_id} names no target", f"start a new run with {calls.start_run(...)}")
    return v.meta.target_key


def _adopted(
    workspace: Workspace,
    paths: RunPaths,
    v: RunView,
    before: int,
    wait: bool,
    timeout_s: float,
    progress: Progress | None,
) -> tuple[str, str]:
    """The state and next call once the spawned controller has adopted the run (or ended it, with wait);
    NothingToResume when it exited at once."""
    run_id = v.run_id
    if wait:
        view = wait_for(workspace, run_id, "end", timeout_s, progress=progress)
        return view.state.value, view.next_call
    # once its controller has adopted the run: say so, not the failure it is about to repair
    view = wait_for(workspace, run_id, "started", STARTED_TIMEOUT_S, since=before)
    started = any(isinstance(e, ControllerStarted) for e in read_events(paths).events[before:])
    if started and view.state.value not in ("running", "created"):
        return view.state.value, view.next_call  # it already finished what was left
    if started or view.controller_alive:
        return "running", calls.wait(run_id)
    log = (
        paths.controller_log.read_text(errors="replace").strip().splitlines()[-1:]
        if paths.controller_log.exists()
        else []
    )
    raise NothingToResume(
        f"the resumed controller of {run_id} exited at once: {quoted(log[0] if log else 'no log', 200)}",
        f"{calls.phase_status(run_id)}; if the run cannot go on, {calls.start_run(v.case_id)} measures it afresh",
    )
