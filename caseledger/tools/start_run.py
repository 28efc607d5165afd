"""start_run: create a run of a frozen case, take the target's lease, spawn the detached controller."""

from __future__ import annotations

from pydantic import BaseModel, Field

from caseledger import authorization, cases, ledger, runs
from caseledger.errors import CaseledgerError
from caseledger.workspace import Workspace, check_id


class StartResult(BaseModel):
    run_id: str
    case_id: str
    scenario: str
    preflight: str = Field(description="passed | failed | pending (still running when the wait ended)")
    preflight_error: str | None = None
    state: str = Field(description="Run state after the wait")
    plan: dict[str, str] = Field(description="phase -> run | reuse | check | skip")
    authorization: str
    next_call: str

    def text(self) -> str:
        if self.state == "preflight_only":
            first = f"preflight {self.run_id} of case {self.case_id} ({self.scenario}): {self.preflight}"
            if self.preflight_error:
                first += f" — {self.preflight_error[:160]}"
            return f"{first}; no run created, 0 requests sent\nnext: {self.next_call}"
        reused = [k for k, v in self.plan.items() if v in ("reuse", "check")]
        first = f"run {self.run_id} of case {self.case_id} ({self.scenario}): preflight {self.preflight}"
        if self.preflight_error:
            first += f" — {self.preflight_error[:160]}"
        reuse = f"reuses: {', '.join(reused)}" if reused else "reuses nothing (full plan)"
        return f"{first}; state {self.state}; {reuse}\nnext: {self.next_call}"


def start_run(workspace: Workspace, case_id: str, *, wait: bool = False, timeout_s: float = 3600.0,
              preflight_only: bool = False) -> StartResult:
    """Start a run and return once preflight has passed or failed (or the whole run, with wait=True).

    preflight_only: reload and check the case in a fresh, socket-less process without creating a run,
    taking the lease or touching the target; allowed while paused or while another run holds the target."""
    check_id(case_id, "case_id", "c")
    case = cases.load_case(workspace, case_id)
    if preflight_only:
        res = runs.preflight_only(workspace, case_id)
        ok = bool(res.get("ok"))
        return StartResult(
            run_id=res["id"], case_id=case_id, scenario=case.scenario, preflight="passed" if ok else "failed",
            preflight_error=res.get("error"), state="preflight_only", plan={},
            authorization=authorization.current_mode(workspace),
            next_call=(f"start_run(case_id='{case_id}') when the target is free and authorization allows" if ok
                       else "fix the cause (a case error needs freeze_case of a corrected draft), "
                       "then preflight again"),
        )
    mode = authorization.check_start(workspace)
    key = ledger.target_key(case.canonical())
    rid = runs.new_run_id(workspace)
    # the lease is taken for the run before anything is written; the controller adopts it (same fence)
    lease = ledger.acquire(workspace, key, run_id=rid, owner=None)
    try:
        paths = runs.create_run(workspace, case_id, lease.fence, key, rid, authorized=mode)
    except CaseledgerError:
        ledger.release(workspace, key, rid, lease.fence)
        raise
    runs.spawn_controller(workspace, paths, lease.fence)
    authorization.consume(workspace, paths.run_id)
    view = runs.wait_for(workspace, paths.run_id, "end" if wait else "preflight", timeout_s if wait else 300.0)
    pf = view.phases["preflight"]
    pf_s = {"done": "passed", "failed": "failed", "unknown": "failed"}.get(pf.state.value, "pending")
    return StartResult(
        run_id=paths.run_id, case_id=case_id, scenario=case.scenario, preflight=pf_s, preflight_error=pf.error,
        state=view.state.value, plan={s["phase"]: s["action"] for s in view.meta["plan"]},
        authorization=authorization.current_mode(workspace), next_call=view.next_call,
    )
