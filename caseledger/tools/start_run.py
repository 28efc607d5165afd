"""start_run: create a run of a frozen case, take the target's lease, spawn the detached controller."""

from __future__ import annotations

from pydantic import BaseModel, Field

from caseledger import ledger
from caseledger.case.model import Case
from caseledger.case.phases import Phase
from caseledger.case.store import load_case
from caseledger.errors import NotAuthorized, TargetHeld, quoted
from caseledger.ledger import authorization, calls
from caseledger.ledger import queue as target_queue
from caseledger.run.start import Progress, launch, preflight_case
from caseledger.views import handoff
from caseledger.workspace import Workspace, check_id


class StartResult(BaseModel):
    run_id: str | None = Field(description="Run id (p-... for preflight_only; null while queued)")
    case_id: str
    scenario: str
    preflight: str = Field(description="passed | failed | pending (still running when the wait ended)")
    preflight_error: str | None = None
    state: str = Field(description="Run state after the wait")
    plan: dict[str, str] = Field(description="phase -> run | reuse | check | skip")
    authorization: str
    queue_position: int | None = Field(None, description="Position in the target's queue (1 = next) when queued")
    next_call: str

    def text(self) -> str:
        if self.state == "queued":
            return (
                f"case {self.case_id} ({self.scenario}): preflight passed; queued #{self.queue_position} on a "
                f"held target\nnext: {self.next_call}"
            )
        if self.state in ("preflight_only", "not_queued"):
            first = f"preflight {self.run_id} of case {self.case_id} ({self.scenario}): {self.preflight}"
            if self.preflight_error:
                first += f" — {quoted(self.preflight_error, 200)}"
            return f"{first}; no run created, 0 requests sent\nnext: {self.next_call}"
        reused = [k for k, v in self.plan.items() if v in ("reuse", "check")]
        first = f"run {self.run_id} of case {self.case_id} ({self.scenario}): preflight {self.preflight}"
        if self.preflight_error:
            first += f" — {quoted(self.preflight_error, 200)}"
        reuse = f"reuses: {', '.join(reused)}" if reused else "reuses nothing (full plan)"
        return f"{first}; state {self.state}; {reuse}\nnext: {self.next_call}"


def start_run(
    workspace: Workspace,
    case_id: str,
    *,
    wait: bool = False,
    timeout_s: float = 3600.0,
    preflight_only: bool = False,
    queue: bool = False,
    progress: Progress | None = None,
) -> StartResult:
    """Start a run and return once preflight has passed or failed (or the whole run, with wait=True).

    preflight_only: reload and check the case in a fresh, socket-less process without creating a run,
    taking the lease or touching the target; allowed while paused or while another run holds the target.
    queue: when the target is held (and authorization is auto), preflight the case and queue it to start
    when the lease frees; the answer says its position. Without it a held target is an error at once.
    progress: called with each state the wait reads (the CLI's live line)."""
    check_id(case_id, "case_id", "c")
    case = load_case(workspace, case_id)
    if preflight_only:
        res = preflight_case(workspace, case_id, case)
        ok = bool(res.get("ok"))
        return StartResult(
            run_id=res["id"],
            case_id=case_id,
            scenario=case.scenario,
            preflight="passed" if ok else "failed",
            preflight_error=res.get("error"),
            state="preflight_only",
            plan={},
            authorization=authorization.current_mode(workspace),
            next_call=(
                f"{calls.start_run(case_id)} when the target is free and authorization allows"
                if ok
                else "fix the cause (a case error needs freeze_case of a corrected draft), then preflight again"
            ),
        )
    try:
        view = launch(workspace, case_id, case, wait=wait, timeout_s=timeout_s, progress=progress)
    except TargetHeld as held:
        if not queue:
            raise
        key = ledger.target_key(case.canonical())
        return _enqueue(workspace, case_id, case, key, authorization.current_mode(workspace), held)
    pf = view.phases[Phase.PREFLIGHT]
    pf_s = {"done": "passed", "failed": "failed", "unknown": "failed"}.get(pf.state.value, "pending")
    return StartResult(
        run_id=view.run_id,
        case_id=case_id,
        scenario=case.scenario,
        preflight=pf_s,
        preflight_error=pf.error,
        state=view.state.value,
        plan={s.phase.value: s.action for s in view.meta.plan},
        authorization=authorization.current_mode(workspace),
        next_call=view.next_call,
    )


def _enqueue(ws: Workspace, case_id: str, case: Case, key: str, mode: str, held: TargetHeld) -> StartResult:
    scenario = case.scenario
    if mode != "auto":
        raise NotAuthorized(
            f"queueing needs authorization 'auto' (it is '{mode}'); {held.message}",
            "caseledger authorize auto, or wait and start_run again",
        )
    res = preflight_case(ws, case_id, case)
    if not res.get("ok"):
        return StartResult(
            run_id=res["id"],
            case_id=case_id,
            scenario=scenario,
            preflight="failed",
            preflight_error=res.get("error"),
            state="not_queued",
            plan={},
            authorization=mode,
            next_call="fix the case (freeze_case a corrected draft); a failing case is never queued",
        )
    cur = ledger.read_lease(ws, key)
    if cur is not None and cur.workspace not in (None, str(ws.root)):
        raise held  # the holder's controller starts only its own workspace's queue
    pos = target_queue.push(ws, key, case_id, cur.run_id if cur else None)
    handoff.refresh(ws)
    return StartResult(
        run_id=None,
        case_id=case_id,
        scenario=scenario,
        preflight="passed",
        state="queued",
        plan={},
        authorization=mode,
        queue_position=pos,
        next_call=f"{calls.phase_status(case_id)} shows this case's run once it starts (when "
        f"{cur.run_id if cur else 'the holder'} releases the target)",
    )
