"""reprocess_raw: recompute results from the raw records alone. Never sends a request."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

from caseledger import ledger
from caseledger.case.phases import Phase
from caseledger.errors import CaseInvalid, FailureClass, NothingToResume, PhaseFailed, quoted
from caseledger.ledger import calls
from caseledger.ledger import event_types as et
from caseledger.ledger.intact import torn_lines
from caseledger.ledger.runs import load_run
from caseledger.ledger.state import fold, sealed_raw_sha256
from caseledger.ledger.view import PhaseState
from caseledger.metrics import NATIVE_RULES, RATIO_MAX, RATIO_MIN_EXCLUSIVE  # names resolved lazily: no numpy
from caseledger.outcome import summary
from caseledger.run.after_load import check_raw, postprocess
from caseledger.views import handoff
from caseledger.workspace import Workspace


class ReprocessResult(BaseModel):
    run_id: str
    result: str = Field(description="Path of the result written (or found identical)")
    raw_sha256: str | None
    requests: int | None
    rule: str | None = Field(description="Native window rule applied (null: the case's)")
    decision: str | None
    requests_sent: int = Field(0, description="Model requests this call sends: none, it reads the raw records only")
    torn: list[str] = Field(
        default_factory=list,
        description="Lines of the load's append-only files the figures skipped (cut mid-write, e.g. by a full "
        "disk): the file, the line, what it means for the figures",
    )
    next_call: str

    def text(self) -> str:
        return "\n".join(
            [
                f"reprocessed {self.run_id} from raw ({self.requests} records, sha256 {str(self.raw_sha256)[:12]}); "
                f"0 requests sent; decision {self.decision or 'not re-decided (window rule override)'}",
                *[f"torn: {t}" for t in self.torn],
                f"result: {self.result}",
                f"next: {self.next_call}",
            ]
        )


def _check_rule(rule: str | None, ratio: float | None) -> None:
    """The window-rule override, checked before anything is written."""
    if rule not in (None, *NATIVE_RULES):
        raise CaseInvalid(
            f"rule '{quoted(rule)}' is not a native window rule",
            f"give one of {', '.join(NATIVE_RULES)}, or none for the case's own rule",
        )
    if ratio is not None and not (math.isfinite(ratio) and RATIO_MIN_EXCLUSIVE < ratio <= RATIO_MAX):
        raise CaseInvalid(
            f"ratio {quoted(ratio)} is out of range",
            f"give a share of peak concurrency in ({RATIO_MIN_EXCLUSIVE:g}, {RATIO_MAX:g}], "
            "e.g. 0.9, with rule 'sglang'",
        )
    if ratio is not None and rule != "sglang":
        raise CaseInvalid("ratio applies to the 'sglang' window rule only", "add rule='sglang', or drop ratio")


def reprocess_raw(
    workspace: Workspace, run_id: str, *, rule: Literal["aisbench", "sglang"] | None = None, ratio: float | None = None
) -> ReprocessResult:
    """Run the postprocessor again on the run's raw data (fresh subprocess), then decide and report."""
    _check_rule(rule, ratio)
    run = load_run(workspace, run_id)
    run_id = run.run_id  # a case id given: its latest run
    v = fold(workspace, run)
    paths = run.paths
    if v.load_ended not in ("yes", "partial") or not paths.raw.exists():
        raise NothingToResume(
            f"run {run_id} has no ended load to reprocess (load ended: {v.load_ended})",
            f"{calls.phase_status(run_id)}; {calls.resume(run_id)} if the load is unfinished",
        )
    check_raw(paths, sealed_raw_sha256(v))  # before any event: a refused reprocess writes nothing
    attempt = v.phases[Phase.POSTPROCESS].attempt + 1
    ledger.append_event(
        workspace, paths, et.PhaseStarted(phase=Phase.POSTPROCESS, attempt=attempt), owner="reprocess_raw"
    )
    extra = (["--rule", rule] if rule else []) + (["--ratio", str(ratio)] if ratio is not None else [])
    try:
        out = postprocess(paths, extra)
    except PhaseFailed as e:
        ledger.append_event(
            workspace,
            paths,
            et.PhaseEnded(
                phase=Phase.POSTPROCESS,
                attempt=attempt,
                error=e.message,
                data=et.PhaseEndedData(outcome=PhaseState.FAILED, failure_class=FailureClass.COLLECT),
            ),
            owner="reprocess_raw",
        )
        raise PhaseFailed(
            f"reprocess failed: {e.message}"[:300], FailureClass.COLLECT, "fix the processor environment and call again"
        ) from None
    ledger.append_event(
        workspace,
        paths,
        et.PhaseEnded(
            phase=Phase.POSTPROCESS,
            attempt=attempt,
            data=et.PhaseEndedData.model_validate({"outcome": "done", **out.evidence()}),
        ),
        owner="reprocess_raw",
    )
    decision = None
    if rule is None and ratio is None:
        dattempt = v.phases[Phase.DECIDE].attempt + 1
        ledger.append_event(
            workspace, paths, et.PhaseStarted(phase=Phase.DECIDE, attempt=dattempt), owner="reprocess_raw"
        )
        rec = summary.decide_run(run)
        decision = rec.get("outcome")
        ledger.append_event(
            workspace,
            paths,
            et.PhaseEnded(
                phase=Phase.DECIDE,
                attempt=dattempt,
                data=et.PhaseEndedData.model_validate({"outcome": "done", "decision": decision}),
            ),
            owner="reprocess_raw",
        )
    else:  # report.md/json show the result just computed; the decision stays the one recorded
        summary.write_reports(run, summary.load_result(run))

    handoff.refresh(workspace)
    return ReprocessResult(
        run_id=run_id,
        result=str(out.result),
        raw_sha256=out.raw_sha256,
        requests=out.requests,
        rule=rule,
        decision=decision,
        torn=torn_lines(paths),  # the load ended (checked above): its files are settled
        next_call=calls.run_succeeded(run_id),
    )
