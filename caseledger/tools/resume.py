"""resume: continue the SAME run as a new attempt of the first phase that is not done."""

from __future__ import annotations

from pydantic import BaseModel, Field

from caseledger import ledger
from caseledger.case.plan import Phase
from caseledger.errors import NothingToResume, TargetHeld
from caseledger.ledger import authorization
from caseledger.ledger.runs import Run, load_run, write_meta
from caseledger.ledger.state import PhaseState, RunState, fold
from caseledger.run.start import spawn_controller, wait_for
from caseledger.workspace import Workspace


class ResumeResult(BaseModel):
    run_id: str
    from_phase: str = Field(description="First phase that will run again (a new attempt)")
    kept: list[str] = Field(description="Phases whose recorded success is kept (never repeated)")
    state: str
    reattached: bool = Field(description="A live load client was found and is waited for, not restarted")
    next_call: str

    def text(self) -> str:
        kept = ", ".join(self.kept) or "none"
        how = " (re-attached to the live load client)" if self.reattached else ""
        return (f"resumed {self.run_id} at {self.from_phase}{how}; kept: {kept}; state {self.state}\n"
                f"next: {self.next_call}")


def resume(workspace: Workspace, run_id: str, *, wait: bool = False, timeout_s: float = 3600.0) -> ResumeResult:
    run = load_run(workspace, run_id)
    v = fold(workspace, run)
    if v.state in (RunState.SUCCEEDED, RunState.PARTIAL):
        raise NothingToResume(f"run {run_id} is {v.state.value}; every phase is done",
                              f"summarize(run_ids=['{run_id}']) or freeze the next candidate")
    if v.controller_alive:
        raise NothingToResume(f"run {run_id} still has a live controller (phase {v.current})",
                              f"phase_status(run_id='{run_id}') later")
    kept_now = [p for p, ph in v.phases.items() if ph.state in (PhaseState.DONE, PhaseState.REUSED, PhaseState.SKIPPED)]
    first_now = next((p for p in v.phases if p not in kept_now), "decide")
    mode = authorization.current_mode(workspace)
    if mode == "paused" and first_now not in (Phase.POSTPROCESS, Phase.DECIDE):
        authorization.check_start(workspace)  # raises NotAuthorized with how to change it
    if v.meta.target_key is None:
        raise NothingToResume(f"run {run_id} names no target", "start a new run with start_run(case_id=...)")
    key = v.meta.target_key
    cur = ledger.read_lease(workspace, key)
    if cur is not None and cur.live() and cur.run_id not in (run_id, None) :
        raise TargetHeld(f"target '{key}' is held by run {cur.run_id}", f"phase_status(run_id='{cur.run_id}')")
    lease = ledger.acquire(workspace, key, run_id, owner=None, same_run_ok=True)
    paths = workspace.run(run_id)
    kept = [p for p, ph in v.phases.items() if ph.state in (PhaseState.DONE, PhaseState.REUSED, PhaseState.SKIPPED)]
    first = next((p for p, ph in v.phases.items() if p not in kept), "decide")
    ledger.append_event(workspace, paths, "resumed", owner="resume", fence=lease.fence, target=key,
                        data={"from_phase": first, "kept": kept, "client_alive": v.client_alive})
    resumed = Run(paths=paths, meta=run.meta.model_copy(update={"authorized": mode}))
    write_meta(paths, resumed.meta)  # before the spawn: the controller reads the mode that let it resume
    authorization.consume(workspace, run_id)
    spawn_controller(resumed, lease.fence)
    view = wait_for(workspace, run_id, "end", timeout_s) if wait else fold(workspace, run_id)
    return ResumeResult(run_id=run_id, from_phase=first, kept=kept, state=view.state.value,
                        reattached=v.client_alive, next_call=view.next_call)
