"""Run-level results work shared by the controller's decide phase and the summarize/reprocess tools:
deciding against the baseline (with the fallback to the scenario's last valid kept case, and the case's
repeated runs as noise), the time ledger, writing report.md / report.json, and the scenario view (one row
per case of a scenario)."""

from __future__ import annotations

import contextlib
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from caseledger import datasets, redact
from caseledger.case.metrics import LIMITS, METRICS
from caseledger.case.model import Case, Decision
from caseledger.case.plan import Phase, argv_change, delta, flatten
from caseledger.case.store import load_case, with_current_decision
from caseledger.errors import CaseledgerError, NotFound
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
    DECISION_WORDS,
    DecisionRecord,
    LimitVerdict,
    Outcome,
    broken,
    decide,
    limit_verdicts,
)
from caseledger.workspace import Workspace, atomic_write, read_json_or_none, sha256_bytes, write_json

if TYPE_CHECKING:  # numpy's types only: these modules import numpy lazily
    from caseledger.metrics._columns import F64


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


def _decision_of(ws: Workspace, run_id: str) -> DecisionRecord | None:
    data = read_json_or_none(ws.run(run_id).decision)
    try:
        return DecisionRecord.model_validate(data) if data else None
    except ValidationError:
        return None


def _figures_of(result: Result | None) -> dict[str, Any]:  # the JSON kept in the index beside the run
    """What the lists read of a run's latest result without parsing it: per window whether it is valid, the
    decision metrics' values and the limits' figures (unrounded; None where NOT_OBSERVED)."""
    out: dict[str, Any] = {"has": result is not None}
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
        self._figures: dict[str, dict[str, Any]] = {}  # run id -> its figures' JSON

    def result(self, run_id: str) -> Result | None:
        if run_id not in self._results:
            self._results[run_id] = latest_result(self.ws.run(run_id).root)
        return self._results[run_id]

    def figures(self, row: RunRow) -> dict[str, Any]:  # JSON from the index
        if row.run_id in self._figures:
            return self._figures[row.run_id]
        sig = f"{PROCESSOR_VERSION}:{row.sig}"
        body = self.idx.derived("result", row.run_id, sig)
        if body is not None:
            fig: dict[str, Any] = orjson.loads(body)
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


def valid_runs(ws: Workspace, case_id: str, window: str) -> list[tuple[str, Result]]:
    """(run_id, result) of every run of a case with a valid result on `window`, newest first."""
    with open_index(ws) as idx:
        rd = Reader(ws, idx)
        rows = idx.runs(case_ids=[case_id])
        return [(rid, r) for rid in rd.valid_ids(rows, case_id, window) if (r := rd.result(rid)) is not None]


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
        dec = _decision_of(ws, row.run_id)
        if dec is None or dec.outcome not in ("keep", "baseline") or broken(dec.limits):
            continue
        if reader.figures(row)[window]["valid"]:
            return row.case_id, row.run_id
    return ref, None


def decide_run(run: Run) -> dict[str, Any]:  # decision.json's body
    """The decide phase: the run's decision now, written with its reports (the evidence that decide is done)."""
    result = load_result(run)
    out: dict[str, Any] = current_decision(run, result).model_dump(mode="json")
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


def time_ledger(run: Run) -> dict[str, Any]:  # a JSON section of report.json
    """Per-phase wall times, tool time from start_run to the first formal request, time outside the window."""
    v = fold(run.workspace, run)
    phases: dict[str, Any] = {}
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
            out[f"cache_{part}"] = {
                "requests": cp[part]["requests"],
                "wall_s": cp[part]["wall_s"],
                "latency_sum_s": cp[part]["latency_sum_s"],
            }
    return out


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _ms(what: str) -> Any:
    return Field(description=f"{what} (ms); null: NOT_OBSERVED")


class Headline(_Model):
    """A few figures of one window for short answers (4 significant digits; null where NOT_OBSERVED)."""

    window: Literal["whole", "native"] = Field(description="Window the figures belong to")
    rule: str = Field(description="Rule that selected the window: whole, aisbench or sglang")
    requests: int = Field(description="Requests in the window")
    ok: int = Field(description="Successful requests in the window")
    duration_s: float | None = Field(description="Window duration (s)")
    meets_minimums: bool = Field(description="The window meets the case's min_requests and min_duration_s")
    output_tok_s: float | None = Field(description="Output token throughput (tok/s)")
    output_tok_s_per_card: float | None = Field(description="Output token throughput per card (tok/s/card)")
    ttft_p50_ms: float | None = _ms("TTFT p50")
    ttft_p99_ms: float | None = _ms("TTFT p99")
    tpot_p50_ms: float | None = _ms("TPOT p50")
    tpot_p99_ms: float | None = _ms("TPOT p99")
    e2e_p99_ms: float | None = _ms("E2E p99")
    al: float | None = Field(description="Acceptance length from per-request counts (speculative decoding)")


def _sig(v: Any) -> float | None:
    return float(f"{float(v):.4g}") if isinstance(v, int | float) else None  # 4 significant digits


def window_stat(w: WindowResult, metric: str) -> float | None:
    """A registered metric or limit figure of a window (caseledger.case.metrics), to 4 significant digits."""
    return _sig(w.number(METRICS[metric] if metric in METRICS else LIMITS[metric]))


def _figure(v: object) -> float | None:
    return None if isinstance(v, NotObserved) else _sig(v)


def headline(result: Result, window: Literal["whole", "native"]) -> Headline:
    """A few figures of one window for short answers (None where NOT_OBSERVED)."""
    w = result.windows.of(window)
    return Headline(
        window=window,
        rule=w.rule,
        requests=w.requests,
        ok=w.ok,
        duration_s=_sig(w.duration_s),
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


def report_meta(meta: RunMeta) -> dict[str, Any]:  # rows of the report's JSON
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
    rows = report_meta(run.meta)
    clock = read_json_or_none(paths.load_clock)  # a load client on another host (load.host): the clock relation
    read_by = read_json_or_none(paths.load_dir / "metrics_read_by.json")  # {metrics_before, metrics_after}
    rows.update(report.load_host_rows(clock, read_by))
    timing = ((read_json_or_none(paths.phase_file("load")) or {}).get("client_timing") or {}).get("line")
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


# ------------------------------------------------------------------------------------------------ scenario view

# short labels of the swept fields agents name most (DESIGN.md: N, C, r)
_LABELS = {"load.concurrency": "C", "load.requests": "N", "load.rate": "r"}
# fields whose default follows another: a change that only follows its source is not shown
_FOLLOWS = {"dataset.entries": "load.requests", "load.max_tokens": "dataset.output_tokens"}


class ScenarioRow(_Model):
    """One case of a scenario: what it changes, its latest valid run, the figures and the verdicts."""

    case_id: str = Field(description="Case id (start_run(case_id) repeats it)")
    change: str = Field(
        description="What it changes against the scenario's baseline, e.g. 'C=8'; 'baseline' "
        "for the baseline itself; '(same)' when nothing measured differs"
    )
    swept: float | None = Field(description="Value of the swept field (the one field the cases vary), if numeric")
    run_id: str | None = Field(description="Its latest valid run (else its latest run; null: never run)")
    runs: int = Field(description="Valid runs of the case (repeats narrow the noise)")
    state: str = Field(description="State of the case's latest run: succeeded, failed, running, ...; 'not run'")
    metric: float | None = Field(description="The decision metric on the decision window (null: no result)")
    ttft_p50_ms: float | None = _ms("TTFT p50")
    ttft_p99_ms: float | None = _ms("TTFT p99")
    tpot_p50_ms: float | None = _ms("TPOT p50")
    tpot_p99_ms: float | None = _ms("TPOT p99")
    itl_p50_ms: float | None = _ms("ITL p50 (chunk gaps)")
    itl_p99_ms: float | None = _ms("ITL p99 (chunk gaps)")
    e2e_p50_ms: float | None = _ms("E2E p50")
    e2e_p99_ms: float | None = _ms("E2E p99")
    limits: list[LimitVerdict] = Field(description="Each of case.decision.limits checked on this run")
    metric_mean: float | None = Field(None, description="Mean of the decision metric over the case's valid runs")
    metric_spread_rel: float | None = Field(
        None, description="Run-to-run spread of the metric, (max - min) / 2 / mean; null: fewer than 2 runs"
    )
    limits_met: dict[str, str] = Field(
        default_factory=dict,
        description="Per limit, in how many of the case's valid runs it was met, e.g. "
        "{'tpot_p99_ms': '2/3'}: a limit met in some repeats and broken in others is not settled",
    )
    requests: int | None = Field(
        None,
        description="Successful requests the row's percentiles rest on (a p99 of "
        "fewer than 100 requests is within the slowest one or two)",
    )
    decision: Outcome | None = Field(description="Decision recorded for the run (null: undecided)")
    settle: str | None = Field(description="For a change within the noise: the call that would settle it")
    best: bool = Field(description="The scenario's best: kept or baseline, within every limit, best metric")

    def percentiles(self) -> list[tuple[float | None, float | None]]:
        """(p50, p99) of TTFT, TPOT, ITL and E2E, the order the scenario table prints them."""
        return [
            (self.ttft_p50_ms, self.ttft_p99_ms),
            (self.tpot_p50_ms, self.tpot_p99_ms),
            (self.itl_p50_ms, self.itl_p99_ms),
            (self.e2e_p50_ms, self.e2e_p99_ms),
        ]


class ScenarioView(_Model):
    """All cases of one scenario, one row each."""

    scenario: str = Field(description="Scenario name")
    baseline_case: str | None = Field(description="The scenario's baseline case (what 'change' is against)")
    primary_metric: str = Field(description="The decision metric (case.decision.primary_metric)")
    window: Literal["whole", "native"] = Field(description="The decision window")
    direction: Literal["higher_is_better", "lower_is_better"] = Field(description="Which way the metric is better")
    limits: list[str] = Field(description="case.decision.limits of the baseline, e.g. 'tpot_p99_ms<=10'")
    swept: str | None = Field(description="The one field the cases vary (e.g. load.concurrency); null: several")
    rows: list[ScenarioRow] = Field(description="One row per case, by swept value (else by first run)")
    best_case: str | None = Field(description="Best case within every limit among keep/baseline (null: none)")
    decisions: str = Field(description=DECISION_WORDS)

    def text(self) -> str:
        head = (
            f"scenario {self.scenario}: {len(self.rows)} case(s); {self.primary_metric} on {self.window}"
            f"{'; limits ' + ', '.join(self.limits) if self.limits else ''}"
        )
        lines = [head, "change case run decision metric | TTFT TPOT ITL E2E p50/p99 ms | limits"]
        for r in self.rows:
            pct = " ".join(f"{_n(p50)}/{_n(p99)}" for p50, p99 in r.percentiles())
            lim = broken(r.limits) or ("ok" if r.limits else "-")
            if r.runs > 1 and r.limits_met:
                lim += " (met " + ", ".join(f"{k} {v}" for k, v in r.limits_met.items()) + " runs)"
            run = r.run_id or "-"
            dec = r.decision or r.state
            reps = (
                f" [mean {_n(r.metric_mean)} ±{r.metric_spread_rel:.0%} over {r.runs} runs]"
                if r.runs > 1 and r.metric_spread_rel is not None
                else ""
            )
            n = f" n={r.requests}" if r.requests is not None else ""
            lines.append(
                f"{r.change}{' *' if r.best else ''} {r.case_id} {run} {dec} {_n(r.metric)}{reps}{n} | {pct} | {lim}"
            )
        best = next((r for r in self.rows if r.best), None)
        lines.append(f"* best within limits: {best.change} {best.case_id}" if best else "best within limits: none yet")
        lines.append(
            "decisions: keep = better beyond noise, within limits; close = breaks a limit or not better; "
            "insufficient = evidence missing or within noise (settle names the call)"
        )
        return "\n".join(lines)


def _n(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def _frozen(ws: Workspace, ids: list[str]) -> dict[str, Case]:
    out: dict[str, Case] = {}
    for cid in sorted(ids):
        try:
            out[cid] = load_case(ws, cid)
        except CaseledgerError:
            continue  # a damaged frozen case is named by freeze/start; the view shows the others
    return out


def latest_scenario(ws: Workspace) -> str:
    """The scenario of the latest run, else of the newest frozen case."""
    with open_index(ws) as idx:
        latest = idx.latest()
    if latest is not None:
        return latest.scenario
    frozen = sorted(ws.frozen_dir.glob("c-*.json"), key=lambda p: p.stat().st_mtime) if ws.frozen_dir.is_dir() else []
    for p in reversed(frozen):
        try:
            return str(orjson.loads(p.read_bytes())["scenario"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    raise NotFound("no case is frozen in this workspace yet", "freeze_case(path='cases/x.json') first")


def _label(path: str, value: Any, old: Any = None) -> str:
    name = _LABELS.get(
        path, ".".join(path.split(".")[2:]) if path.startswith("service.components.") else path.rsplit(".", 1)[-1]
    )  # a component's field: its name, e.g. decode.argv
    flags = argv_change(old, value)
    if flags is not None:  # an argv by the flags that changed ('-np 4→2'), never the whole command line
        return f"{name.removesuffix('argv').rstrip('.') + ' ' if name != 'argv' else ''}{flags}"
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return f"{name}={text if len(text) <= 16 else text[:15] + '…'}"


def _changes(base: Case | None, case: Case) -> list[tuple[str, Any, Any]]:
    """(path, new value, old value) of each field the case changes against the scenario's baseline."""
    if base is None:
        return []
    new = flatten(case.canonical())
    return [
        (d.path, d.new, d.old)
        for d in delta(base, case)
        if not (d.path in _FOLLOWS and new.get(d.path) == new.get(_FOLLOWS[d.path]))
    ]


def _stat_sig(path: Path) -> str:
    try:
        st = path.stat()
    except FileNotFoundError:
        return "-"
    return f"{st.st_size}:{st.st_mtime_ns}"


def scenario_view(ws: Workspace, name: str, idx: Index | None = None) -> ScenarioView:
    """One row per case of the scenario; reads only (no report is written). The view is kept in the index
    under the signature of everything it reads (its cases and their lineage, the scenario's decision, each
    run's state, decision and result figures), so an unchanged scenario is not computed again."""
    if idx is None:
        with open_index(ws) as own:
            return scenario_view(ws, name, own)
    ids = [cid for cid, sc in idx.cases().items() if sc == name]
    if not ids:
        raise NotFound(
            f"scenario '{name[:200]}' has no frozen case",
            "summarize() without arguments shows the latest scenario; freeze_case(...) adds a case",
        )
    rd = Reader(ws, idx)
    digest = idx.digest(ids)
    by_id = {r.run_id: r for r in idx.rows([rid for rid, _, _, sig, live in digest if live or not sig])}
    parts = [PROCESSOR_VERSION, name, _stat_sig(ws.scenarios_dir / name / "decision.jsonl")]
    parts += [
        f"{cid}={_stat_sig(ws.frozen_case(cid))}/{_stat_sig(ws.frozen_dir / f'{cid}.lineage.jsonl')}"
        for cid in sorted(ids)
    ]
    # a run the index folded at rest adds its files' signature (its figures are kept under that same signature,
    # see Reader.figures); a live one the hash of its figures, read now
    parts += [
        f"{rid}:{state}:{dec}:"
        + (rsig if rsig and not live else sha256_bytes(orjson.dumps(rd.figures(by_id[rid])))[:16])
        for rid, state, dec, rsig, live in digest
    ]
    sig = sha256_bytes("\n".join(parts).encode())
    body = idx.derived("scenario_view", name, sig)
    if body is not None:
        try:
            return ScenarioView.model_validate_json(body)
        except ValidationError:
            pass  # another version's view: computed again
    view = _scenario_view(ws, name, _frozen(ws, ids), idx.runs(case_ids=ids), rd)
    idx.put_derived("scenario_view", name, sig, view.model_dump_json().encode())
    return view


def _scenario_view(ws: Workspace, name: str, cases: dict[str, Case], metas: list[RunRow], rd: Reader) -> ScenarioView:
    if not cases:
        raise NotFound(
            f"scenario '{name[:200]}' has no readable frozen case",
            "summarize() without arguments shows the latest scenario; freeze_case(...) adds a case",
        )
    metas = [m for m in metas if m.case_id in cases]
    first_run = {m.case_id: i for i, m in reversed(list(enumerate(metas)))}
    base_id = _baseline_id(ws, cases, metas, first_run)
    base = cases[base_id]
    d = base.decision
    window, metric = d.window, d.primary_metric
    changes = {cid: _changes(base, c) for cid, c in cases.items()}
    paths = {p for cid, ch in changes.items() if cid != base_id for p, _, _ in ch}
    swept = next(iter(paths)) if len(paths) == 1 else None
    rows = [
        _scenario_row(ws, rd, cid, case, [m for m in metas if m.case_id == cid], changes[cid], cid == base_id, swept, d)
        for cid, case in cases.items()
    ]
    best = _best(rows, metric)
    rows = [r.model_copy(update={"best": best is not None and r.case_id == best.case_id}) for r in rows]
    rows.sort(key=lambda r: (r.swept is None, r.swept or 0.0, first_run.get(r.case_id, len(metas))))
    return ScenarioView(
        scenario=name,
        baseline_case=base_id,
        primary_metric=metric,
        window=window,
        direction=METRICS[metric].direction,
        limits=[f"{k}<={v:g}" for k, v in d.limits.bounds().items()],
        swept=swept,
        rows=rows,
        best_case=best.case_id if best else None,
        decisions=DECISION_WORDS,
    )


def _baseline_id(ws: Workspace, cases: dict[str, Case], metas: list[RunRow], first_run: dict[str, int]) -> str:
    """The scenario's baseline: the case of the latest run decided as baseline; else the case the decisions name;
    else the first-run root of the lineage."""
    base_id = next(
        (
            m.case_id
            for m in reversed(metas)
            if m.decision == "baseline"
            and (dec := _decision_of(ws, m.run_id)) is not None
            and dec.outcome == "baseline"
        ),
        None,
    )
    if base_id is not None:
        return base_id
    named = [c.decision.baseline for c in cases.values() if c.decision.baseline in cases]
    roots = sorted(
        (cid for cid, c in cases.items() if c.parent is None or c.parent not in cases),
        key=lambda cid: first_run.get(cid, len(metas)),
    )
    return named[0] if named else (roots[0] if roots else min(cases, key=lambda cid: first_run.get(cid, 0)))


def _scenario_row(
    ws: Workspace,
    rd: Reader,
    cid: str,
    case: Case,
    own: list[RunRow],
    changes: list[tuple[str, Any, Any]],
    is_base: bool,
    swept: str | None,
    d: Decision,
) -> ScenarioRow:
    """One case's row: its latest valid run (else its latest run), figures on the baseline's decision window and
    metric (d), the decision against the baseline's results now."""
    window, metric = d.window, d.primary_metric
    good = rd.valid_ids(own, cid, window)
    rid = good[0] if good else (own[-1].run_id if own else None)
    result = rd.result(rid) if rid else None
    state = (own[-1].state or "unknown") if own else "not run"  # the index folds live runs at every read
    dec = _decision_of(ws, rid) if rid else None
    if rid and result is not None and dec is not None and dec.outcome != "baseline":
        dec = current_decision(load_run(ws, rid), result, rd)  # against the baseline's results now, never stale
    value = flatten(case.canonical()).get(swept) if swept else None
    w = result.windows.of(window) if result is not None else None
    pcts = {name: window_stat(w, name) if w is not None else None for name in LIMITS}  # ScenarioRow's fields
    shown = ",".join(_label(p, v, old) for p, v, old in changes)
    rep = _repeats(case, [rd.figures(m) for m in own if m.run_id in good], window, metric)
    return ScenarioRow(
        **rep,
        requests=w.ok if w is not None and w.found else None,
        case_id=cid,
        change=(f"{_label(swept, value)} (baseline)" if swept else "baseline") if is_base else shown or "(same)",
        swept=float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None,
        run_id=rid,
        runs=len(good),
        state=state,
        metric=window_stat(w, metric) if w is not None else None,
        **pcts,
        limits=limit_verdicts(case, result),
        decision=dec.outcome if dec else None,
        settle=dec.settle if dec else None,
        best=False,
    )


def _best(rows: list[ScenarioRow], metric: str) -> ScenarioRow | None:
    """The best kept (or baseline) row that meets every limit, by the metric in its direction."""
    higher = METRICS[metric].higher_is_better
    eligible = [
        r
        for r in rows
        if r.decision in ("keep", "baseline") and r.metric is not None and all(v.verdict == "meets" for v in r.limits)
    ]
    return max(eligible, key=lambda r: (r.metric or 0.0) if higher else -(r.metric or 0.0), default=None)


# dict[str, Any]: figures' JSON in; ScenarioRow kwargs out
def _repeats(case: Case, figures: list[dict[str, Any]], window: str, metric: str) -> dict[str, Any]:
    """A case's repeats (their figures in the index): the metric's mean and spread over its valid runs, and how
    often each limit was met."""
    values = [v for f in figures if (v := _sig(f[window]["metrics"].get(metric))) is not None]
    mean = sum(values) / len(values) if values else None
    spread = (max(values) - min(values)) / 2 / abs(mean) if len(values) > 1 and mean else None
    met: dict[str, list[bool]] = {}
    for f in figures:
        for limit, bound in case.decision.limits.bounds().items():
            value = f[window]["limits"].get(limit)
            met.setdefault(limit, []).append(value is not None and value <= bound)
    return {
        "metric_mean": mean,
        "metric_spread_rel": spread,
        "limits_met": {k: f"{sum(x)}/{len(x)}" for k, x in met.items()},
    }


def scenario_next(view: ScenarioView) -> str:
    """The one next call of a scenario: follow an unfinished run, settle a change within noise, else go on."""
    for r in view.rows:
        if r.state in ("running", "created", "failed") and r.runs == 0 and r.run_id:
            return f"phase_status(run_id='{r.run_id}')"
    for r in view.rows:
        if r.settle:
            return r.settle
    if view.best_case:
        return f"freeze_case(next candidate, parent='{view.best_case}')"
    return "start_run(case_id=...) for a case without a run"


def latency_samples(ws: Workspace, run_id: str) -> dict[str, F64]:
    """Per-request TTFT / TPOT / E2E (ms) of a run's successful requests, from its raw data ({} without)."""
    raw = ws.run(run_id).raw
    if not raw.is_file():
        return {}
    # lazy: numpy, only where per-request samples are read (decide, the campaign view), never in a refresh
    from caseledger.metrics._columns import read_raw
    from caseledger.metrics._compute import per_request_ms  # lazy: numpy, as above

    columns, _ = read_raw(raw)
    return per_request_ms(columns)
