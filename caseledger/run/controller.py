"""The controller: a detached process that holds the target's lease and runs a run's phases in order.

`python -m caseledger.controller RUN_DIR --fence N`. Before each phase it looks up the phase's recorded
state (a recorded success is kept, a recorded failure is where it starts again as a new attempt), runs it
with start/end events and an evidence file, and stops at the first failure with a failure class from
DESIGN.md. A heartbeat thread renews the lease; when the lease was taken over (fence rejected) the
controller stops at once.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

from caseledger import ledger, procs, services
from caseledger.case.model import Case
from caseledger.case.plan import PHASES
from caseledger.errors import CaseledgerError, FenceRejected, PhaseFailed
from caseledger.ledger.authorization import current_mode
from caseledger.ledger.state import PhaseState, fold
from caseledger.load.faults import fault
from caseledger.outcome import handoff
from caseledger.run import phases
from caseledger.run.preflight import run_fresh
from caseledger.run.start import start_next
from caseledger.workspace import RunPaths, Workspace, read_json, read_json_or_none, write_json


class Controller:
    def __init__(self, run_dir: Path, fence: int) -> None:
        self.paths = RunPaths(run_dir)
        self.meta: dict[str, Any] = read_json(self.paths.run_json)
        self.ws = Workspace(Path(self.meta["workspace"]))
        self.case = Case.model_validate(read_json(self.paths.case))
        self.key: str = self.meta["target_key"]
        self.fence = fence
        self.me = procs.me()
        self.owner = f"controller:{self.me['pid']}"
        self.plan = {s["phase"]: s for s in self.meta["plan"]}
        self._stop = threading.Event()
        self.fenced = False

    # ---- events
    def event(self, type_: str, **kw: Any) -> None:
        ledger.append_event(self.ws, self.paths, type_, owner=self.owner, fence=self.fence, target=self.key, **kw)

    def heartbeat(self) -> None:
        while not self._stop.wait(ledger.HEARTBEAT_SECONDS):
            try:
                extra = [p for p in [read_json_or_none(self.paths.load_pid)] if p]
                ledger.renew(self.ws, self.key, self.paths.run_id, self.fence, owner=dict(self.me), extra_procs=extra)
            except FenceRejected:
                self.fenced = True
                os._exit(70)  # a newer owner holds the target: stop writing at once

    # ---- main loop
    def run(self) -> int:
        write_json(self.paths.controller_pid, {**self.me, "fence": self.fence})
        try:
            ledger.renew(self.ws, self.key, self.paths.run_id, self.fence, owner=dict(self.me))
        except FenceRejected as e:
            self.paths.controller_log.parent.mkdir(parents=True, exist_ok=True)
            print(f"controller: {e}", file=sys.stderr)
            return 70
        threading.Thread(target=self.heartbeat, daemon=True).start()
        self.event("controller_started", data={"pid": self.me["pid"]})

        outcome = "succeeded"
        keep_lease = False

        try:
            view = fold(self.ws, self.paths.run_id)
            if view.phases["load"].state == PhaseState.PENDING:
                phases.arm_client(self.paths, self.meta)  # its start-up overlaps preflight and service
            for phase in PHASES:
                pv = view.phases[phase]
                if pv.state in (PhaseState.DONE, PhaseState.REUSED, PhaseState.SKIPPED):
                    continue  # recorded success is kept (never repeated)
                if fault("controller", "exit_before") == phase:
                    os._exit(137)
                attempt = pv.attempt + 1
                self.event("phase_started", phase=phase, attempt=attempt)
                handoff.refresh(self.ws)
                try:
                    data = getattr(self, f"phase_{phase}")(attempt)
                except PhaseFailed as e:
                    self._end(phase, attempt, "failed", {"failure_class": e.failure_class, "fix": e.fix},
                              error=e.message)
                    outcome = f"failed:{e.failure_class}"
                    keep_lease = e.failure_class == "end_unknown"
                    break
                except Exception as e:
                    cls = {"preflight": "before_model", "postprocess": "collect", "decide": "collect"}.get(
                        phase, "end_unknown" if phase in ("load", "confirm_end") else "service")
                    self._end(phase, attempt, "failed", {"failure_class": cls}, error=f"{type(e).__name__}: {e}")
                    outcome = f"failed:{cls}"
                    keep_lease = cls == "end_unknown"
                    break
                self._end(phase, attempt, data.pop("outcome", "done"), data)
                if fault("controller", "exit_after") == phase:
                    os._exit(137)
            self.event("run_ended", data={"outcome": outcome})
        finally:
            phases.disarm_client(self.paths)
            self._stop.set()
            if not keep_lease:
                ledger.release(self.ws, self.key, self.paths.run_id, self.fence)
            handoff.refresh(self.ws, exiting=self.paths.run_id)
            if not keep_lease:

                nxt = start_next(self.ws, self.key)  # an explicitly queued, preflighted case
                if nxt:  # our fence is stale now (the next run holds the target): record without it
                    ledger.append_event(self.ws, self.paths, "started_queued_run", owner=self.owner,
                                        data={"run_id": nxt})
        return 0 if outcome == "succeeded" else 1

    def _end(self, phase: str, attempt: int, outcome: str, data: dict[str, Any], error: str | None = None) -> None:
        ev = self.paths.phase_file(phase)
        write_json(ev, {"phase": phase, "attempt": attempt, "outcome": outcome, "error": error, **data})
        self.event("phase_ended", phase=phase, attempt=attempt, outputs={"evidence": ev}, error=error,
                   data={"outcome": outcome, **data})

    def action(self, phase: str) -> str:
        return str(self.plan[phase]["action"])

    # ---- phases
    def phase_preflight(self, attempt: int) -> dict[str, Any]:

        res = run_fresh(self.paths.root)
        if not res.get("ok"):
            raise PhaseFailed(f"preflight: {res.get('error')}"[:300], "before_model",
                              "fix the cause and resume; 0 model requests were sent")
        return {"checks": res["checks"], "requests_sent": 0}

    def _authorized_for_service(self) -> bool:

        return bool(self.meta.get("authorized", current_mode(self.ws)) != "paused")

    def phase_service(self, attempt: int) -> dict[str, Any]:
        if self.action("service") == "reuse" and self.meta.get("load_reuse"):
            return {"outcome": "reused", "reason": "measurement-only: the target is not contacted"}
        ev = services.ensure(self.ws, self.case, self.key, self.meta["case_id"],
                             allow_start=self._authorized_for_service())
        ev["plan"] = self.action("service")
        self.meta["service_outcome"] = ev["outcome"]
        return ev

    def _service_reused(self) -> bool:
        return read_json_or_none(self.paths.phase_file("service")) is not None and \
            (read_json_or_none(self.paths.phase_file("service")) or {}).get("outcome") == "reused"

    def phase_warmup(self, attempt: int) -> dict[str, Any]:

        if self.case.warmup.requests == 0:
            return {"outcome": "skipped", "reason": "warmup.requests is 0"}
        if self._service_reused() and self.action("warmup") in ("reuse",):
            return {"outcome": "reused", "reason": "service reused and warm"}
        if self.meta.get("load_reuse"):
            return {"outcome": "reused", "reason": "measurement-only"}
        return phases.warmup(self.ws, self.paths, self.case, self.meta)

    def phase_route_verify(self, attempt: int) -> dict[str, Any]:

        if self.meta.get("load_reuse") or (self._service_reused() and self.action("route_verify") == "reuse"):
            return {"outcome": "reused", "reason": "service reused: routes verified by the parent"}
        return phases.route_verify(self.ws, self.paths, self.case, self.meta)

    def phase_cache_prepare(self, attempt: int) -> dict[str, Any]:

        act = self.action("cache_prepare")
        if act == "skip":
            return {"outcome": "skipped", "reason": self.plan["cache_prepare"]["reason"]}
        if act == "reuse":
            return {"outcome": "reused", "reason": self.plan["cache_prepare"]["reason"]}
        seed = act == "run" or not self._service_reused()
        return phases.cache_prepare(self.ws, self.paths, self.case, self.meta, seed=seed)

    def phase_load(self, attempt: int) -> dict[str, Any]:

        if self.meta.get("load_reuse"):
            return phases.reuse_parent_load(self.ws, self.paths, self.meta)
        return phases.load(self.ws, self.paths, self.case, self.meta, attempt, self)

    def phase_confirm_end(self, attempt: int) -> dict[str, Any]:

        return phases.confirm_end(self.paths, self.meta)

    def phase_postprocess(self, attempt: int) -> dict[str, Any]:

        return phases.postprocess(self.paths)

    def phase_decide(self, attempt: int) -> dict[str, Any]:

        return phases.decide(self.ws, self.paths, self.case, self.meta)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    run_dir = Path(args[0])
    fence = int(args[args.index("--fence") + 1])
    try:
        return Controller(run_dir, fence).run()
    except CaseledgerError as e:
        print(f"controller: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
