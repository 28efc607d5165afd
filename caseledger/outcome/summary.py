"""Run-level results work shared by the controller's decide phase and the summarize/reprocess tools:
deciding against the baseline (with the fallback to the scenario's last valid kept case, and the case's
repeated runs as noise), the time ledger, and writing report.md / report.json. The scenario view (one row
per case of a scenario) is in views.scenario."""

from __future__ import annotations

import contextlib
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from caseledger import datasets, redact
from caseledger.case.metrics import LIMITS, METRICS
from caseledger.case.model import Case
from caseledger.case.phases import Phase
from caseledger.case.store import with_current_decision
from caseledger.errors import CaseledgerError
from caseledger.ledger.evidence import CachePrepareEvidence, LoadEvidence, read_evidence
from caseledger.ledger.index import Index, RunRow, open_index
from caseledger.ledger.runs import Run, RunMeta, load_run
from caseledger.ledger.state import fold
from caseledger.metrics import (
    PROCESSOR_VERSION,
    NotObserved,
    Result,
    WindowResult,
    latest_result,
)
from caseledger.outcome import report
from caseledger.outcome.decide import (
    DecisionRecord,
    broken,
    decide,
)
from caseledger.workspace import Workspace, atomic_write, read_json_or_none, write_json

if TYPE_CHECKING:  # numpy's types only: these modules import numpy lazily
    from caseledger.metrics import F64


def load_result(run: Run) -> Any:
    """The run's latest result (any processor version), or None."""
    return latest_result(run.paths.root)


def computed_last(run: Run) -> Result | None:
    """The result the run's last successful postprocess wrote (a reprocess with rule='sglang' included), else
    the latest result: what a reader asked for last, not only the case's own window rule."""
    done = fold(run.workspace, run).phases[Phase.POSTPROCESS]
    path = done.data.get("result") if done.state.value == "done" else None
    if isinstance(path, str) and Path(path).is_file():
        try:
            return Result.model_validate_json(Path(path).read_bytes())
        except (OSError, ValidationError, ValueError):
            pass
    return latest_result(run.paths.root)


def valid(result: Result | None, window: str) -> bool:
    """A result a decision can rest on: the window was found, meets its minimums, no failed or invalid request,
    not distorted (a stalled client, a contended host: such a run is repeated, never used as a repeat)."""
    if result is None:
        return False
    w = result.windows.of(window)
    return (
        w.found
        and w.meets_min_requests
        and w.meets_min_duration
        and not result.failed
        and not w.invalid
        and not w.distorted
    )


def saved_decision(ws: Workspace, run_id: str) -> DecisionRecord | None:
    """A run's decision.json as a model; None when absent or unreadable (the decision is then recomputed)."""
    data = read_json_or_none(ws.run(run_id).decision)
    try:
        return DecisionRecord.model_validate(data) if data else None
    except ValidationError:
        return None


def _figures_of(result: Result | None) -> dict[str, Any]:  # JSON: the figures kept in the index beside the run
    """What the lists read of a run's latest result without parsing it: per window whether it is valid, the
    decision metrics' values and the limits' figures (unrounded; None where NOT_OBSERVED)."""
    out: dict[str, Any] = {"has": result is not None}  # JSON: index figures
    for window in ("whole", "native"):
        if result is None:
            out[window] = {"valid": False, "metrics": {}, "limits": {}}
            continue
        w = result.windows.of(window)
        metrics = {name: w.number(m) for name, m in METRICS.items()}
        limits = {name: w.number(m) for name, m in LIMITS.items()}
        out[window] = {"valid": valid(result, window), "metrics": metrics, "limits": limits}
    return out


class Reader:
    """One call's reads of the ledger through its index: the runs as rows, each run's result figures stored in
    the index under the run's signature, and results parsed at most once per call."""

    def __init__(self, ws: Workspace, idx: Index) -> None:
        self.ws = ws
        self.idx = idx
        self._results: dict[str, Result | None] = {}
        self._figures: dict[str, dict[str, Any]] = {}  # JSON: run id -> its figures

    def result(self, run_id: str) -> Result | None:
        if run_id not in self._results:
            self._results[run_id] = latest_result(self.ws.run(run_id).root)
        return self._results[run_id]

    def figures(self, row: RunRow) -> dict[str, Any]:  # JSON: the figures kept in the index
        if row.run_id in self._figures:
            return self._figures[row.run_id]
        sig = f"{PROCESSOR_VERSION}:{row.sig}"
        body = self.idx.derived("result", row.run_id, sig)
        if body is not None:
            fig: dict[str, Any] = orjson.loads(body)  # JSON: index figures
        else:
            fig = _figures_of(self.result(row.run_id))
            self.idx.put_derived("result", row.run_id, sig, orjson.dumps(fig))
        self._figures[row.run_id] = fig
        return fig

    def valid_ids(self, rows: list[RunRow], case_id: str | None, window: str) -> list[str]:
        """Run ids of the case's runs (among rows, oldest first) with a valid result on `window`, newest first."""
        return [r.run_id for r in reversed(rows) if r.case_id == case_id and self.figures(r)[window]["valid"]]

    def values(self, run_ids: list[str], rows: list[RunRow], window: str, metric: str) -> list[float]:
        by_id = {r.run_id: r for r in rows}
        return [v for rid in run_ids if (v := self.figures(by_id[rid])[window]["metrics"].get(metric)) is not None]


def baseline_of(run: Run, case: Case | None = None, reader: Reader | None = None) -> tuple[str | None, str | None]:
    """(baseline case id, its run to compare with) for a run: the decision's baseline, else the parent; when that
    case has no valid result, the scenario's last valid kept case (decided keep or baseline, within its limits).
    `case`: the run's case under the scenario's current decision (default: read here)."""
    case = case if case is not None else with_current_decision(run.workspace, run.case)
    ref = case.decision.baseline or case.parent
    if ref is None or ref == run.meta.case_id:
        return None, None
    if reader is None:
        with open_index(run.workspace) as idx:
            return baseline_of(run, case, Reader(run.workspace, idx))
    ws, window = run.workspace, case.decision.window
    own = reader.valid_ids(reader.idx.runs(case_ids=[ref]), ref, window)
    if own:
        return ref, own[0]
    for row in reversed(reader.idx.runs(scenario=case.scenario)):
        if row.case_id in (run.meta.case_id, ref) or row.decision not in ("keep", "baseline"):
            continue
        dec = saved_decision(ws, row.run_id)
        if dec is None or dec.outcome not in ("keep", "baseline") or broken(dec.limits):
            continue
        if reader.figures(row)[window]["valid"]:
            return row.case_id, row.run_id
    return ref, None


def decide_run(run: Run) -> dict[str, Any]:  # JSON: decision.json's body
    """The decide phase: the run's decision now, written with its reports (the evidence that decide is done)."""
    result = load_result(run)
    out: dict[str, Any] = current_decision(run, result).model_dump(mode="json")  # JSON: decision.json
    write_reports(run, result, decision=out)
    write_json(run.paths.decision, out)  # last: the decision file is the evidence that decide is done
    return out


def decision_now(run: Run, result: Result | None) -> DecisionRecord | None:
    """The decision a reader is shown: the one recorded, decided again from the results on disk now (a re-run
    baseline never leaves a stale verdict); a recorded baseline stays as recorded. None: none recorded."""
    data = read_json_or_none(run.paths.decision)
    if not data:
        return None
    if result is not None and data.get("outcome") != "baseline":
        return current_decision(run, result)
    try:
        return DecisionRecord.model_validate(data)
    except ValidationError:  # written by another version: decided again when there is a result to decide on
        return current_decision(run, result) if result is not None else None


def current_decision(run: Run, result: Result | None, reader: Reader | None = None) -> DecisionRecord:
    """The run's decision from the results on disk now: its result against the baseline's latest valid run
    and both cases' repeats. A verdict read through this never goes stale: a re-run baseline re-decides it.
    Writes nothing (but the index's derived figures)."""
    if reader is None:
        with open_index(run.workspace) as idx:
            return current_decision(run, result, Reader(run.workspace, idx))
    paths = run.paths
    ws = run.workspace
    case = with_current_decision(ws, run.case)  # the scenario's decision now, not the one of the run's start
    ref_case, ref_run = baseline_of(run, case, reader)
    baseline = reader.result(ref_run) if ref_run else None
    end = read_json_or_none(paths.load_end)
    load_ended = bool(end) and int(end.get("done", 0)) >= int(end.get("planned", 1))
    window, metric = case.decision.window, case.decision.primary_metric
    rows = reader.idx.runs(case_ids=[run.meta.case_id, *([ref_case] if ref_case else [])])
    # the repeats by their metric's value alone (the index's figures: no result is parsed for them)
    repeats = reader.values(
        [rid for rid in reader.valid_ids(rows, run.meta.case_id, window) if rid != run.run_id], rows, window, metric
    )
    base_repeats = (
        reader.values([rid for rid in reader.valid_ids(rows, ref_case, window) if rid != ref_run], rows, window, metric)
        if ref_case and ref_run
        else []
    )
    base_case = with_current_decision(ws, load_run(ws, ref_run).case) if ref_run else None
    return decide(
        case,
        result,
        baseline,
        f"{ref_case}@{ref_run}" if ref_run else ref_case,
        load_ended=load_ended,
        candidate_case=run.meta.case_id,
        repeats=repeats,
        baseline_repeats=base_repeats,
        baseline_case=base_case,
    )


def _ts(utc: str | None) -> float | None:
    if not utc:
        return None
    return datetime.fromisoformat(utc.replace("Z", "+00:00")).timestamp()


def time_ledger(run: Run) -> dict[str, Any]:  # JSON: a section of report.json
    """Per-phase wall times, tool time from start_run to the first formal request, time outside the window."""
    v = fold(run.workspace, run)
    phases: dict[str, Any] = {}  # JSON: the time ledger
    for name, ph in v.phases.items():
        a, b = _ts(ph.started_utc), _ts(ph.ended_utc)
        phases[name.value] = {
            "state": ph.state.value,
            "attempt": ph.attempt,
            "wall_s": round(b - a, 3) if a is not None and b is not None else None,
        }
    paths = run.paths
    anchor = read_json_or_none(paths.load_anchor)
    end = read_json_or_none(paths.load_end)
    created = _ts(v.meta.created_utc)
    out: dict[str, Any] = {"phases": phases}  # JSON: the time ledger
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
    cp = read_evidence(paths, Phase.CACHE_PREPARE)
    if isinstance(cp, CachePrepareEvidence):  # seeded and checked (not reused or skipped)
        for part, sent in (("seed", cp.seed), ("check", cp.check)):
            if sent is not None:
                out[f"cache_{part}"] = {
                    "requests": sent.requests,
                    "wall_s": sent.wall_s,
                    "latency_sum_s": sent.latency_sum_s,
                }
    return out


class FrozenModel(BaseModel):
    """Base of the views here and in views.scenario: immutable, and an unknown field is an error."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def ms_field(what: str) -> Any:  # pydantic's Field() is typed Any
    """A latency field's description, one wording for every view."""
    return Field(description=f"{what} (ms); null: NOT_OBSERVED")


class Headline(FrozenModel):
    """A few figures of one window for short answers (4 significant digits; null where NOT_OBSERVED)."""

    window: Literal["whole", "native"] = Field(description="Window the figures belong to")
    rule: str = Field(description="Rule that selected the window: whole, aisbench or sglang")
    requests: int = Field(description="Requests in the window")
    ok: int = Field(description="Successful requests in the window")
    duration_s: float | None = Field(description="Window duration (s)")
    meets_minimums: bool = Field(description="The window meets the case's min_requests and min_duration_s")
    output_tok_s: float | None = Field(description="Output token throughput (tok/s)")
    output_tok_s_per_card: float | None = Field(description="Output token throughput per card (tok/s/card)")
    ttft_p50_ms: float | None = ms_field("TTFT p50")
    ttft_p99_ms: float | None = ms_field("TTFT p99")
    tpot_p50_ms: float | None = ms_field("TPOT p50")
    tpot_p99_ms: float | None = ms_field("TPOT p99")
    e2e_p99_ms: float | None = ms_field("E2E p99")
    al: float | None = Field(description="Acceptance length from per-request counts (speculative decoding)")


def four_digits(v: Any) -> float | None:  # any JSON value: non-numbers give None
    """A number to 4 significant digits, the precision of every short answer; None for anything else."""
    return float(f"{float(v):.4g}") if isinstance(v, int | float) else None  # 4 significant digits


def window_stat(w: WindowResult, metric: str) -> float | None:
    """A registered metric or limit figure of a window (caseledger.case.metrics), to 4 significant digits."""
    return four_digits(w.number(METRICS[metric] if metric in METRICS else LIMITS[metric]))


def _figure(v: object) -> float | None:
    return None if isinstance(v, NotObserved) else four_digits(v)


def headline(result: Result, window: Literal["whole", "native"]) -> Headline:
    """A few figures of one window for short answers (None where NOT_OBSERVED)."""
    w = result.windows.of(window)
    return Headline(
        window=window,
        rule=w.rule,
        requests=w.requests,
        ok=w.ok,
        duration_s=four_digits(w.duration_s),
        meets_minimums=bool(w.meets_min_requests and w.meets_min_duration),
        output_tok_s=window_stat(w, "output_throughput"),
        output_tok_s_per_card=window_stat(w, "output_throughput_per_card"),
        ttft_p50_ms=window_stat(w, "ttft_p50"),
        ttft_p99_ms=window_stat(w, "ttft_p99"),
        tpot_p50_ms=window_stat(w, "tpot_p50"),
        tpot_p99_ms=window_stat(w, "tpot_p99"),
        e2e_p99_ms=window_stat(w, "e2e_p99"),
        al=_figure(
            w.spec_decode.per_request.acceptance_length.value
            if not isinstance(w.spec_decode.per_request.acceptance_length, NotObserved)
            else None
        ),
    )


def report_meta(meta: RunMeta) -> dict[str, object]:
    """The header rows a reader of report.md needs from run.json (the rest is bookkeeping)."""
    keep = (
        "run_id",
        "case_id",
        "scenario",
        "parent_case",
        "dataset_id",
        "salt",
        "planned",
        "target_key",
        "created_utc",
        "authorized",
        "load_reuse",
    )
    rows: dict[str, object] = {k: getattr(meta, k) for k in keep if getattr(meta, k) is not None}
    if meta.plan:
        rows["plan"] = " ".join(f"{s.phase}={s.action}" for s in meta.plan)
    if meta.imported is not None:
        rows["imported"] = f"{meta.imported.tool} from {meta.imported.path}"
    return rows


def write_reports(
    run: Run,
    result: Any,
    decision: dict[str, Any] | None = None,  # JSON: decision.json
) -> dict[str, Any]:  # JSON: report.json
    """report.md and report.json of a run from its result (as loaded by the caller); {} without a result."""
    paths = run.paths
    if result is None:
        return {}
    decision = decision if decision is not None else read_json_or_none(paths.decision)
    ledger_ = time_ledger(run)
    dec = DecisionRecord.model_validate(decision) if decision else None
    rows = report_meta(run.meta)
    clock = read_json_or_none(paths.load_clock)  # a load client on another host (load.host): the clock relation
    read_by = read_json_or_none(paths.load_dir / "metrics_read_by.json")  # {metrics_before, metrics_after}
    rows.update(report.load_host_rows(clock, read_by))
    load = read_evidence(paths, Phase.LOAD)
    timing = load.client_timing.get("line") if isinstance(load, LoadEvidence) and load.client_timing else None
    rows.update({"client timing": timing} if timing else {})  # the load client's own timing uncertainty
    with contextlib.suppress(CaseledgerError):  # the dataset's realized lengths, where its identity is at hand
        rows.update(report.lengths_rows(datasets.load_identity(run.workspace, run.meta.dataset())))
    # a report quotes phase errors from the ledger: masked again, so one recorded unmasked by an older version
    # is not copied on
    secrets = redact.current()
    atomic_write(paths.report_md, secrets.mask(report.render_run_md(rows, result, dec, ledger_)))
    body = report.report_json(run.meta, result, dec, ledger_)
    if clock:
        body["load_host"] = {"clock": clock, "metrics_read_by": read_by}
    body = secrets.mask_obj(body)
    write_json(paths.report_json, body)
    return body


def latency_samples(ws: Workspace, run_id: str, span: tuple[float, float] | None = None) -> dict[str, F64]:
    """Per-request TTFT / TPOT / E2E (ms) of a run's successful requests, from its raw data ({} without). span:
    a window's (start_s, end_s) after the first send: only the requests sent inside it (as the window counts)."""
    raw = ws.run(run_id).raw
    if not raw.is_file():
        return {}
    # lazy: numpy, only where per-request samples are read (decide, the campaign view), never in a refresh
    from caseledger.metrics import per_request_ms, read_raw

    columns, _ = read_raw(raw)
    out = per_request_ms(columns)
    if span is not None and columns.send_ns.size:
        t = (columns.send_ns[columns.ok] - columns.send_ns.min()) / 1e9
        inside = (t >= span[0] - 1e-9) & (t <= span[1] + 1e-9)
        out = {k: v[inside] for k, v in out.items()}
    return out
