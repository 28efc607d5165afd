"""The scenario view: one row per case of a scenario, with what it changes, its latest valid run, the
figures, the verdicts and the scenario's best; and the next call an agent makes from it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

import orjson
from pydantic import Field, ValidationError, create_model

from caseledger.campaign.store import campaign_files, scenario_campaigns
from caseledger.campaign.view import PointRow, ScenarioAnswer, campaign_view, point_verdict, scenario_answer
from caseledger.case.decision import Decision
from caseledger.case.metrics import LIMITS, METRICS
from caseledger.case.model import Case
from caseledger.case.plan import DERIVED, argv_change, delta, flatten
from caseledger.case.store import load_case
from caseledger.errors import CaseledgerError, NotFound, quoted
from caseledger.ledger import calls
from caseledger.ledger.index import Index, RunRow, open_index
from caseledger.ledger.runs import load_run
from caseledger.metrics import PROCESSOR_VERSION
from caseledger.outcome.decide import DECISION_WORDS, LimitVerdict, Outcome, broken, limit_verdicts
from caseledger.outcome.summary import (
    FrozenModel,
    Reader,
    current_decision,
    four_digits,
    ms_field,
    saved_decision,
    window_stat,
)
from caseledger.workspace import Workspace, sha256_bytes

# short labels of the swept fields agents name most (DESIGN.md: N, C, r)
_LABELS = {"load.concurrency": "C", "load.requests": "N", "load.rate": "r"}


class _RowHead(FrozenModel):
    """ScenarioRow's fields before its latency percentiles."""

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


if TYPE_CHECKING:

    class _RowFigures(_RowHead):
        """The columns below, read through ScenarioRow.ms."""

else:  # one column per limit of the metrics table (caseledger.case.metrics.LIMITS), in its order, e.g. 'tpot_p99_ms'
    _RowFigures = create_model(
        "_RowFigures",
        __base__=_RowHead,
        __module__=__name__,
        **{name: (float | None, ms_field(m.label)) for name, m in LIMITS.items()},
    )
PCT_FIGURES = tuple(dict.fromkeys(m.figure for m in LIMITS.values()))  # the scenario table's columns: TTFT, ...
PCT_STATS = tuple(sorted({m.stat for m in LIMITS.values()}, key=lambda s: float(s[1:])))  # each shows p50/p99


class ScenarioRow(_RowFigures):
    """One case of a scenario: what it changes, its latest valid run, the figures and the verdicts."""

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
    decision: Outcome | None = Field(
        description="Decision recorded for the run (null: undecided, or a point of the campaign that owns the "
        "scenario: see campaign_verdict)"
    )
    campaign_verdict: str | None = Field(
        None,
        description="A point of a campaign of the scenario: the answer's word for it, from all its valid runs "
        "(winner, tie, loses, uncertain, not measured); the row's metric is then the mean over those runs and its "
        "limits pooled over them",
    )
    settle: str | None = Field(description="For a change within the noise: the call that would settle it")
    why: str | None = Field(
        None,
        description="Why the decision is insufficient (the evidence missing; a distorted window names who took "
        "the host)",
    )
    best: bool = Field(description="The scenario's best: kept or baseline, within every limit, best metric")

    def ms(self, limit: str) -> float | None:
        """The row's figure for a limit of the metrics table, e.g. 'tpot_p99_ms' (its column)."""
        if limit not in LIMITS:
            raise KeyError(f"{limit} is no limit of caseledger.case.metrics.TABLE (one of {', '.join(LIMITS)})")
        value: float | None = getattr(self, limit)
        return value

    def percentiles(self) -> list[tuple[float | None, ...]]:
        """Per figure of PCT_FIGURES its value at each of PCT_STATS (None where the table bounds no such
        percentile), the order the scenario table prints them."""
        return [
            tuple(self.ms(f"{f}_{s}_ms") if f"{f}_{s}_ms" in LIMITS else None for s in PCT_STATS) for f in PCT_FIGURES
        ]


class ScenarioView(FrozenModel):
    """All cases of one scenario, one row each."""

    scenario: str = Field(description="Scenario name")
    baseline_case: str | None = Field(description="The scenario's baseline case (what 'change' is against)")
    primary_metric: str = Field(description="The decision metric (case.decision.primary_metric)")
    window: Literal["whole", "native"] = Field(description="The decision window")
    direction: Literal["higher_is_better", "lower_is_better"] = Field(description="Which way the metric is better")
    limits: list[str] = Field(description="case.decision.limits of the baseline, e.g. 'tpot_p99_ms<=10'")
    swept: str | None = Field(description="The one field the cases vary (e.g. load.concurrency); null: several")
    rows: list[ScenarioRow] = Field(description="One row per case, by swept value (else by first run)")
    best_case: str | None = Field(
        description="Best case within every limit among keep/baseline, by the mean over its valid runs; with a "
        "campaign that owns the scenario, its winner (null: none, or a tie)"
    )
    decisions: str = Field(description=DECISION_WORDS)
    campaign: str | None = Field(None, description="The scenario's newest campaign (its next call is the scenario's)")
    campaigns: list[str] = Field(
        default_factory=list, description="Every campaign of the scenario, oldest first: their points rank together"
    )
    answer: str | None = Field(
        None,
        description="The scenario's answer: its campaign's, or with several campaigns their points ranked together "
        "('across 2 campaigns: winner ...'): the winner, a tie within noise, or why none",
    )
    complete: bool = Field(False, description="Every campaign is complete: nothing is left to run")
    tie: list[str] = Field(default_factory=list, description="The answer's tie (case ids)")
    campaign_next: str | None = Field(None, description="The campaign's next call")

    def text(self) -> str:
        head = (
            f"scenario {self.scenario}: {len(self.rows)} case(s); {self.primary_metric} on {self.window}"
            f"{'; limits ' + ', '.join(self.limits) if self.limits else ''}"
        )
        cols = f"{' '.join(f.upper() for f in PCT_FIGURES)} {'/'.join(PCT_STATS)} ms"
        lines = [head, f"change case run decision metric | {cols} | limits"]
        for r in self.rows:
            pct = " ".join("/".join(_n(v) for v in vs) for vs in r.percentiles())
            unsure = ", ".join(f"{v.limit} uncertain" for v in r.limits if v.verdict == "uncertain")
            lim = ", ".join(x for x in (broken(r.limits), unsure) if x) or ("ok" if r.limits else "-")
            if r.runs > 1 and r.limits_met:
                lim += " (met " + ", ".join(f"{k} {v}" for k, v in r.limits_met.items()) + " runs)"
            run = r.run_id or "-"
            dec = r.campaign_verdict or r.decision or r.state
            reps = (
                f" [mean {_n(r.metric_mean)} ±{r.metric_spread_rel:.0%} over {r.runs} runs]"
                if r.runs > 1 and r.metric_spread_rel is not None
                else ""
            )
            n = f" n={r.requests}" if r.requests is not None else ""
            lines.append(
                f"{r.change}{' *' if r.best else ''} {r.case_id} {run} {dec} {_n(r.metric)}{reps}{n} | {pct} | {lim}"
                + (f" | why: {quoted(r.why, 160)}" if r.why else "")
            )
        best = next((r for r in self.rows if r.best), None)
        if len(self.campaigns) > 1:
            lines.append(
                f"campaigns {', '.join(self.campaigns)} {'complete' if self.complete else 'so far'}: {self.answer}"
            )
        elif self.campaign is not None:
            lines.append(f"campaign {self.campaign} {'complete' if self.complete else 'so far'}: {self.answer}")
        else:
            lines.append(
                f"* best within limits: {best.change} {best.case_id}" if best else "best within limits: none yet"
            )
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
    raise NotFound("no case is frozen in this workspace yet", calls.first_case())


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
        if not (d.path in DERIVED and new.get(d.path) == new.get(DERIVED[d.path]))
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
    # the campaigns of the scenario (the newest owns its answer): their declaration, points, policy, search events
    parts += [
        f"{f.parent.name}/{f.name}={_stat_sig(f)}" for g in scenario_campaigns(ws, name) for f in campaign_files(ws, g)
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
    best_id = best.case_id if best else None
    owners = scenario_campaigns(ws, name)
    views = [campaign_view(ws, g) for g in owners]
    camp = views[-1] if views else None
    across = scenario_answer(ws, name)
    answer, tie, complete = (across.answer, across.tie, across.complete) if across else (None, [], False)
    if camp is not None:  # the campaigns' verdicts and answer are the scenario's: one truth in every view
        if across is None:
            answer, tie, complete, best_id = camp.answer, camp.tie, camp.complete, camp.winner
        else:
            best_id = across.winner
        points = {c: p for v in views for p in v.rows for c in (p.case_id, *p.cases.values())}  # a pool: per target
        rows = [_as_point(r, points[r.case_id], across) if r.case_id in points else r for r in rows]
    rows = [r.model_copy(update={"best": r.case_id == best_id}) for r in rows]
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
        best_case=best_id,
        decisions=DECISION_WORDS,
        campaign=camp.campaign_id if camp else None,
        campaigns=owners,
        answer=answer,
        complete=complete,
        tie=tie,
        campaign_next=camp.next_call if camp else None,
    )


def _as_point(row: ScenarioRow, p: PointRow, across: ScenarioAnswer | None) -> ScenarioRow:
    """A case's row as the campaigns judge the point: its label naming its full setting, the answer's verdict
    (its campaign's, or across the scenario's campaigns: the same word by the same rule), the mean over its valid
    runs and its limits pooled over them."""
    verdict = (
        p.verdict
        if across is None
        else point_verdict(p.case_id, p.runs, bool(p.uncertain), across.winner, across.tie, across.unsettled)
    )
    return row.model_copy(
        update={
            "change": p.label,
            "campaign_verdict": verdict,
            "metric": p.metric_mean,
            "metric_mean": p.metric_mean,
            "runs": p.runs,
            "limits": p.verdicts,
            "limits_met": {v.limit: v.met for v in p.verdicts if v.met},
            "decision": None,
            "settle": None,
            "why": None,  # a run's own decision against the baseline: the campaign's verdict supersedes it
        }
    )


def _baseline_id(ws: Workspace, cases: dict[str, Case], metas: list[RunRow], first_run: dict[str, int]) -> str:
    """The scenario's baseline: the case of the latest run decided as baseline; else the case the decisions name;
    else the first-run root of the lineage."""
    base_id = next(
        (
            m.case_id
            for m in reversed(metas)
            if m.decision == "baseline"
            and (dec := saved_decision(ws, m.run_id)) is not None
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
    dec = saved_decision(ws, rid) if rid else None
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
        why=dec.reason if dec and dec.outcome == "insufficient" else None,
        best=False,
    )


def _best(rows: list[ScenarioRow], metric: str) -> ScenarioRow | None:
    """The best kept (or baseline) row within every limit in every valid run, by the metric's mean over its valid
    runs (a case is judged by all its runs, never by its latest alone)."""
    higher = METRICS[metric].higher_is_better

    def every_run(r: ScenarioRow) -> bool:
        runs = [v.split("/") for v in r.limits_met.values()]
        return all(v.verdict == "meets" for v in r.limits) and all(a == b for a, b in runs)

    def value(r: ScenarioRow) -> float:
        v = r.metric_mean if r.metric_mean is not None else (r.metric or 0.0)
        return v if higher else -v

    eligible = [r for r in rows if r.decision in ("keep", "baseline") and r.metric is not None and every_run(r)]
    return max(eligible, key=value, default=None)


class _Repeats(TypedDict):
    """ScenarioRow's fields that a case's repeats give."""

    metric_mean: float | None
    metric_spread_rel: float | None
    limits_met: dict[str, str]


def _repeats(case: Case, figures: list[dict[str, Any]], window: str, metric: str) -> _Repeats:  # JSON: index figures
    """A case's repeats (their figures in the index): the metric's mean and spread over its valid runs, and how
    often each limit was met."""
    values = [v for f in figures if (v := four_digits(f[window]["metrics"].get(metric))) is not None]
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
    """The one next call of a scenario: the campaign's that owns it; else follow an unfinished run, settle a change
    within noise, else go on."""
    if view.campaign_next is not None:
        return view.campaign_next
    for r in view.rows:
        if r.state in ("running", "created", "failed") and r.runs == 0 and r.run_id:
            return calls.phase_status(r.run_id)
    for r in view.rows:
        if r.settle:
            return r.settle
    for r in view.rows:
        if r.decision == "insufficient" and r.why and "distorted" in r.why:
            return calls.repeat_on_quiet_host(r.case_id, quoted(r.why, 160))
    unrun = next((r for r in view.rows if r.run_id is None), None)
    if unrun is not None:
        return f"{calls.start_run(unrun.case_id)}: it has no run yet"
    if view.best_case:
        return calls.next_candidate(view.best_case)
    return f"{calls.next_candidate(None)}: no case is kept yet"
