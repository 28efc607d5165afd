"""Run-level results work shared by the controller's decide phase and the summarize/reprocess tools:
deciding against the baseline, the time ledger, and writing report.md / report.json."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from caseledger.case.plan import Phase
from caseledger.ledger.runs import Run, RunMeta, latest_run_of_case
from caseledger.ledger.state import fold
from caseledger.metrics import latest_result
from caseledger.outcome import report
from caseledger.outcome.decide import DecisionRecord, decide
from caseledger.workspace import atomic_write, read_json_or_none, write_json


def load_result(run: Run) -> Any:
    """The run's latest result (any processor version), or None."""
    return latest_result(run.paths.root)


def baseline_of(run: Run) -> tuple[str | None, str | None]:
    """(baseline case id, its latest run with results) for a run: case.decision.baseline, else the parent."""
    case = run.case
    ref = case.decision.baseline or case.parent
    if ref is None or ref == run.meta.case_id:
        return None, None
    return ref, latest_run_of_case(run.workspace, ref, with_results=True)


def decide_run(run: Run) -> dict[str, Any]:
    paths = run.paths
    result = load_result(run)
    ref_case, ref_run = baseline_of(run)
    baseline = latest_result(run.workspace.run(ref_run).root) if ref_run else None
    end = read_json_or_none(paths.load_end)
    load_ended = bool(end) and int(end.get("done", 0)) >= int(end.get("planned", 1))
    rec = decide(run.case, result, baseline, f"{ref_case}@{ref_run}" if ref_run else ref_case,
                 load_ended=load_ended)
    out: dict[str, Any] = rec.model_dump(mode="json")
    write_reports(run, result, decision=out)
    write_json(paths.decision, out)  # last: the decision file is the evidence that decide is done
    return out


def _ts(utc: str | None) -> float | None:
    if not utc:
        return None
    return datetime.fromisoformat(utc.replace("Z", "+00:00")).timestamp()


def time_ledger(run: Run) -> dict[str, Any]:
    """Per-phase wall times, tool time from start_run to the first formal request, time outside the window."""
    v = fold(run.workspace, run)
    phases: dict[str, Any] = {}
    for name, ph in v.phases.items():
        a, b = _ts(ph.started_utc), _ts(ph.ended_utc)
        phases[name.value] = {"state": ph.state.value, "attempt": ph.attempt,
                        "wall_s": round(b - a, 3) if a is not None and b is not None else None}
    paths = run.paths
    anchor = read_json_or_none(paths.load_anchor)
    end = read_json_or_none(paths.load_end)
    created = _ts(v.meta.created_utc)
    out: dict[str, Any] = {"phases": phases}
    if anchor and end and created is not None and end.get("first_send_ns") is not None:
        first_send = _ts(anchor["wall_utc"])
        if first_send is not None:
            first_send += (end["first_send_ns"] - anchor["mono_ns"]) / 1e9
            last_end = first_send + (end["last_end_ns"] - end["first_send_ns"]) / 1e9
            out["start_run_to_first_formal_request_s"] = round(first_send - created, 3)
            out["formal_window_s"] = round(last_end - first_send, 3)
            ended = max((_ts(p.ended_utc) or 0) for p in v.phases.values())
            if ended:
                out["run_wall_s"] = round(ended - created, 3)
                out["outside_formal_window_s"] = round(ended - created - (last_end - first_send), 3)
    cp = read_json_or_none(paths.phase_file(Phase.CACHE_PREPARE)) or {}
    for part in ("seed", "check"):
        if part in cp:
            out[f"cache_{part}"] = {"requests": cp[part]["requests"], "wall_s": cp[part]["wall_s"],
                                    "latency_sum_s": cp[part]["latency_sum_s"]}
    return out


def headline(result: Any, window: str) -> dict[str, Any]:
    """A few figures of one window for short answers (None where NOT_OBSERVED)."""
    w = getattr(result.windows, window)

    def val(x: Any, attr: str) -> float | None:
        v = getattr(x, attr, None)
        return float(f"{float(v):.4g}") if isinstance(v, (int, float)) else None  # 4 significant digits

    return {
        "window": window, "requests": w.requests, "ok": w.ok, "duration_s": w.duration_s,
        "meets_minimums": bool(w.meets_min_requests and w.meets_min_duration),
        "output_tok_s_per_card": val(w.throughput.output, "per_card"),
        "output_tok_s": val(w.throughput.output, "value"),
        "ttft_p50_ms": val(w.latency.ttft, "p50"), "ttft_p99_ms": val(w.latency.ttft, "p99"),
        "tpot_p50_ms": val(w.latency.tpot, "p50"),
        "al_per_request": val(w.spec_decode.per_request.acceptance_length, "value"),
        "acceptance_per_request": val(w.spec_decode.per_request.acceptance_rate, "value"),
        "al_counters": val(w.spec_decode.acceptance_length, "value"),
    }


def _report_meta(meta: RunMeta) -> dict[str, Any]:
    """The header rows a reader of report.md needs from run.json (the rest is bookkeeping)."""
    keep = ("run_id", "case_id", "scenario", "parent_case", "dataset_id", "salt", "planned", "target_key",
            "created_utc", "authorized", "load_reuse")
    rows: dict[str, Any] = {k: getattr(meta, k) for k in keep if getattr(meta, k) is not None}
    if meta.plan:
        rows["plan"] = " ".join(f"{s.phase}={s.action}" for s in meta.plan)
    if meta.imported is not None:
        rows["imported"] = f"{meta.imported.tool} from {meta.imported.path}"
    return rows


def write_reports(run: Run, result: Any, decision: dict[str, Any] | None = None) -> dict[str, Any]:
    """report.md and report.json of a run from its result (as loaded by the caller); {} without a result."""
    paths = run.paths
    if result is None:
        return {}
    decision = decision if decision is not None else read_json_or_none(paths.decision)
    ledger_ = time_ledger(run)
    dec = DecisionRecord.model_validate(decision) if decision else None
    atomic_write(paths.report_md, report.render_run_md(_report_meta(run.meta), result, dec, ledger_))
    body = report.report_json(run.meta, result, dec, ledger_)
    write_json(paths.report_json, body)
    return body
