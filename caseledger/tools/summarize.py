"""summarize: short structured figures per run, report.md + report.json per run, and a side-by-side
table for several runs (whole vs whole, native vs native). Read-only on run state."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from caseledger.case.store import load_case
from caseledger.errors import NotFound
from caseledger.ledger.runs import damaged_line, load_run, scan_runs
from caseledger.ledger.state import fold
from caseledger.outcome import report, summary
from caseledger.workspace import Workspace, atomic_write, read_json_or_none


class RunSummary(BaseModel):
    run_id: str
    case_id: str
    scenario: str
    results_extracted: bool
    decision: str | None
    missing: list[str] = Field(default_factory=list, description="Evidence missing for a decision")
    whole: dict[str, Any] | None = Field(description="Headline figures of the whole window")
    native: dict[str, Any] | None = Field(description="Headline figures of the native window")
    time_ledger: dict[str, Any] | None = None
    report: str | None = Field(description="Path of report.md")


class SummaryResult(BaseModel):
    runs: list[RunSummary]
    side_by_side: str | None = Field(description="Path of the side-by-side markdown table (several runs)")
    damaged: list[str] = Field(default_factory=list,
                               description="Damaged ledger entries found while looking for the latest run")
    next_call: str

    def text(self) -> str:
        lines = []
        for r in self.runs:
            def f(w: dict[str, Any] | None) -> str:
                if not w:
                    return "n/a"
                mark = "" if w.get("meets_minimums") else " (below minimums)"
                return (f"{w['output_tok_s_per_card']} tok/s/card, TTFT p50 {w['ttft_p50_ms']} ms, "
                        f"TPOT p50 {w['tpot_p50_ms']} ms, n={w['ok']}{mark}")
            dec = r.decision or "undecided"
            if r.missing:
                dec += f" (missing: {'; '.join(r.missing)[:80]})"
            lines.append(f"{r.run_id} {r.case_id} {r.scenario}: {dec}")
            lines.append(f"  whole: {f(r.whole)}")
            lines.append(f"  native: {f(r.native)}")
        if self.side_by_side:
            lines.append(f"side-by-side: {self.side_by_side}")
        if self.damaged:
            lines.append(damaged_line(self.damaged))
        lines.append(f"next: {self.next_call}")
        return "\n".join(lines)


def summarize(workspace: Workspace, run_ids: list[str]) -> SummaryResult:

    damaged: list[str] = []
    if not run_ids:
        scan = scan_runs(workspace)
        if not scan.metas:
            found = f" ({damaged_line(scan.damaged)})" if scan.damaged else ""
            raise NotFound(f"no runs in this workspace yet{found}", "start_run(case_id=...) first")
        run_ids, damaged = [scan.metas[-1].run_id], scan.damaged
    out: list[RunSummary] = []
    rows = []
    for rid in run_ids:
        run = load_run(workspace, rid)
        v = fold(workspace, run)
        result = summary.load_result(run)
        paths = run.paths
        body = summary.write_reports(run, result)  # {} without a result
        if result is not None:
            rows.append((rid, v.case_id, result))
        dec = read_json_or_none(paths.decision) or {}
        out.append(RunSummary(
            run_id=rid, case_id=v.case_id, scenario=v.scenario, results_extracted=result is not None,
            decision=dec.get("outcome"), missing=list(dec.get("missing", [])),
            whole=summary.headline(result, "whole") if result else None,
            native=summary.headline(result, "native") if result else None,
            time_ledger=body["time_ledger"] if body else summary.time_ledger(run),
            report=str(paths.report_md) if paths.report_md.exists() else None,
        ))
    side = None
    if len(rows) > 1:

        side_path = workspace.reports_dir / ("side-by-side-" + "-".join(r[0] for r in rows)[:120] + ".md")
        atomic_write(side_path, report.render_side_by_side(rows))
        side = str(side_path)
    missing = [r.run_id for r in out if not r.results_extracted]
    last = out[-1]
    if missing:
        nxt = f"reprocess_raw(run_id='{missing[0]}') or phase_status(run_id='{missing[0]}')"
    elif last.decision in ("keep", "baseline"):
        nxt = f"freeze_case(next candidate, parent='{last.case_id}')"
    elif last.decision == "close":

        parent = load_case(workspace, last.case_id).parent or last.case_id
        nxt = f"freeze_case(next candidate, parent='{parent}') — {last.case_id} was closed"
    else:
        nxt = f"supply the missing evidence for {last.run_id} (see missing), then reprocess_raw or a new run"
    return SummaryResult(runs=out, side_by_side=side, damaged=damaged, next_call=nxt)
