"""summarize: the scenario view (one row per case: change, run, decision metric, latency percentiles, limit
verdicts, decision) or figures per run (every figure of report.md, outcome.figures) with a side-by-side table; the
chart of the decision metric against the swept value with the limits drawn and the latency CDFs.

A reader: it writes nothing into the ledger (issue 57). report.md/report.json are written by the run's decide phase
(and reprocess_raw), the scenario's and a campaign's PNG by the run's controller and the campaign's driver when they
end; the answer names such a file when it is on disk and current, and `chart_png` draws the chart in memory for a
caller that shows it (the MCP answer's image) when it is not. Only the index (a derived cache) may be brought in
step with files that changed since it last read them (ledger/index.py).
"""

from __future__ import annotations

import contextlib
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, PrivateAttr

from caseledger import redact
from caseledger.campaign.store import campaign_of
from caseledger.campaign.view import CampaignView, campaign_view
from caseledger.case.bounds import PATTERN_RULES
from caseledger.case.model import SCENARIO_PATTERN
from caseledger.case.store import load_case, with_current_decision
from caseledger.errors import CaseInvalid, NotFound, quoted
from caseledger.ledger import calls
from caseledger.ledger.index import open_index
from caseledger.ledger.intact import damaged_entry, settled_change, tampered
from caseledger.ledger.runs import damaged_line, load_run
from caseledger.ledger.state import fold
from caseledger.metrics import Result
from caseledger.outcome import plots, report, summary
from caseledger.outcome.decide import DECISION_WORDS, broken, limit_verdicts
from caseledger.outcome.figures import RunFigures, headline_lines, run_figures, short
from caseledger.outcome.summary import Headline
from caseledger.views.chart import campaign_plot_path, drawn, pareto_points, scenario_figure, scenario_plot_path
from caseledger.views.scenario import ScenarioView, latest_scenario, scenario_next, scenario_view
from caseledger.workspace import Workspace, is_id


class RunSummary(BaseModel):
    """One run: its decision and headline figures of both windows."""

    run_id: str = Field(description="Run id")
    case_id: str = Field(description="Case id of the run")
    scenario: str = Field(description="Scenario of the case")
    results_extracted: bool = Field(description="Figures were computed from the raw records")
    decision: str | None = Field(description=DECISION_WORDS)
    decision_reason: str | None = Field(None, description="Why: the broken limit, the change and its noise, ...")
    decision_window: str | None = Field(None, description="The window the decision read (whole or native)")
    missing: list[str] = Field(default_factory=list, description="Evidence missing for a decision")
    whole: Headline | None = Field(description="Headline figures of the whole window")
    native: Headline | None = Field(description="Headline figures of the native window (the rule computed last)")
    figures: RunFigures | None = Field(
        None,
        description="Every figure of the run's report.md by window and section (ITL, E2E, tokens, rates, prefix-cache "
        "hits and the requests below the target, AL with its formula and numbers), 4 significant digits; "
        "NOT_OBSERVED figures listed once per reason in each section's not_observed",
    )
    time_ledger: dict[str, Any] | None = Field(  # JSON: the time ledger
        None,
        description="Seconds: start_run to the first formal request, "
        "the formal window, the run, outside the window; phases: each phase "
        "that ran, its wall time (the run's report has the full time ledger)",
    )
    report: str | None = Field(
        description="Path of report.md (written by the run's decide phase, and by reprocess_raw); null when absent"
    )
    changed_evidence: str | None = Field(
        None, description="Raw data that differs from its sha256 sealed when the load ended (tampered or damaged)"
    )
    campaign: str | None = Field(None, description="The campaign whose point this run measured (its id)")
    campaign_verdict: str | None = Field(
        None,
        description="The campaign's verdict on the run's point, from all the point's valid runs: what the scenario "
        "view and HANDOFF.md show too (the run's own decision against the baseline is one run's reading)",
    )


def _compact(tl: dict[str, Any] | None) -> dict[str, Any] | None:  # JSON: the time ledger
    """The time ledger a reader of many runs needs: the totals and each phase that ran, by its wall time."""
    if tl is None:
        return None
    phases = {
        k: v["wall_s"]
        for k, v in (tl.get("phases") or {}).items()
        if v.get("wall_s") is not None and v.get("state") not in ("skipped", "reused")
    }
    return {**{k: v for k, v in tl.items() if k != "phases" and not k.startswith("cache_")}, "phases": phases}


class SummaryResult(BaseModel):
    """A scenario's rows (scenario view) or runs side by side, and the next call."""

    scenario: ScenarioView | None = Field(
        None,
        description="The scenario view (null when run_ids were given): rows[].decision is one of " + DECISION_WORDS,
    )
    campaign: CampaignView | None = Field(
        None,
        description="A campaign's answer (run_ids=[its g-... id]): every "
        "point, the winner or a tie within noise, limits, Pareto frontier",
    )
    runs: list[RunSummary] = Field(description="Runs summarized (run_ids given); [] for the scenario view")
    side_by_side: str | None = Field(
        description="The side-by-side markdown tables of several runs (whole vs whole, native vs native); null for one"
    )
    plot: str | None = Field(
        None,
        description="Path of the PNG (metric vs swept value, limits, latency CDFs; a campaign's Pareto frontier) when "
        "the run's controller or the campaign's driver drew it for this very view (named by its digest); null "
        "otherwise: summarize writes no file, the MCP answer draws its image in memory",
    )
    damaged: list[str] = Field(
        default_factory=list,
        description="Damaged ledger entries: unreadable runs found while looking for the latest run, and the raw data "
        "of a run shown here that no longer hashes as sealed when its load ended (tampered)",
    )
    next_call: str = Field(description="The one next call")
    _chart: bytes | None = PrivateAttr(None)  # the PNG a caller that shows it attached (chart_png); never dumped

    def with_chart(self, png: bytes | None) -> SummaryResult:
        """This answer with its chart's PNG attached (the MCP answer's image)."""
        self._chart = png
        return self

    @property
    def chart(self) -> bytes | None:
        return self._chart

    def text(self) -> str:
        if self.campaign is not None:
            return (
                self.campaign.text()
                + (f"\nplot: {self.plot}" if self.plot else "")
                + (f"\n{damaged_line(self.damaged)}" if self.damaged else "")
            )
        lines = [self.scenario.text()] if self.scenario else []
        for r in self.runs:

            def f(w: Headline | None) -> str:
                if not w:
                    return "n/a"
                mark = "" if w.meets_minimums else " (below minimums)"
                return (
                    f"{w.output_tok_s_per_card} tok/s/card, TTFT p50/p99 {w.ttft_p50_ms}/{w.ttft_p99_ms}, "
                    f"TPOT p50/p99 {w.tpot_p50_ms}/{w.tpot_p99_ms} ms, n={w.ok}{mark}"
                )

            dec = r.decision or "undecided"
            if r.missing:
                dec += f" (missing: {quoted('; '.join(r.missing), 100)})"
            elif r.decision_reason and r.decision not in ("baseline", None):
                dec += f": {quoted(r.decision_reason, 120)}"
            if r.campaign_verdict:  # the campaign decides a point, not one run: never this run's own keep/close
                gaps = f" (this run: missing {quoted('; '.join(r.missing), 100)})" if r.missing else ""
                dec = r.campaign_verdict + gaps
            lines.append(f"{r.run_id} {r.case_id} {r.scenario}: {dec}")
            if r.changed_evidence:
                lines.append(f"  changed evidence: {r.changed_evidence}")
            mark = {w: " (decides)" if r.decision_window == w else "" for w in ("whole", "native")}
            if r.figures is not None:  # the report's headline: both windows, their counts, durations and figures
                for wf in (r.figures.whole, r.figures.native):
                    head, *rest = headline_lines(wf)
                    lines += [f"  {head}{mark[wf.name]}"] + [f"    {x}" for x in rest]
            else:
                lines.append(f"  whole{mark['whole']}: {f(r.whole)}")
                lines.append(f"  native ({r.native.rule if r.native else '-'}){mark['native']}: {f(r.native)}")
        if self.side_by_side:
            lines.append("side-by-side: whole vs whole and native vs native in the answer's side_by_side")
        if self.damaged:
            lines.append(damaged_line(self.damaged))
        lines.append(f"next: {self.next_call}")
        return "\n".join(lines)


def summarize(workspace: Workspace, run_ids: list[str], scenario: str | None = None) -> SummaryResult:
    """The scenario view (no run_ids: the scenario given, else the latest one) or the given runs. Writes nothing
    (see the module's docstring); chart_png gives the answer's chart."""
    if run_ids and scenario:
        raise CaseInvalid(
            "give run_ids or scenario, not both",
            f"{calls.summarize(scenario='name')} for the rows of a scenario, {calls.summarize(...)} for runs",
        )
    if not run_ids:
        return _scenario(workspace, scenario)
    if any(is_id(r, "g") for r in run_ids):
        if len(run_ids) > 1:
            raise CaseInvalid("a campaign id is summarized alone", calls.summarize(run_ids[:1]))
        return _campaign(workspace, run_ids[0])
    out: list[RunSummary] = []
    rows = []
    for rid in run_ids:
        run = load_run(workspace, rid)
        v = fold(workspace, run)
        result = summary.load_result(run)
        last = summary.computed_last(run)
        paths = run.paths
        if last is not None:
            rows.append((rid, v.case_id, last))
        now = summary.decision_now(run, result)
        dec = now.model_dump(mode="json") if now is not None else {}
        out.append(
            RunSummary(
                run_id=rid,
                case_id=v.case_id,
                scenario=v.scenario,
                results_extracted=result is not None,
                decision=dec.get("outcome"),
                missing=list(dec.get("missing", [])),
                decision_reason=dec.get("reason"),
                decision_window=dec.get("window"),
                whole=summary.headline(last, "whole") if last else None,
                native=summary.headline(last, "native") if last else None,
                figures=short_figures(last) if last else None,
                time_ledger=_compact(summary.time_ledger(run)),
                report=str(paths.report_md) if paths.report_md.exists() else None,
                changed_evidence=settled_change(paths, v),
            )
        )
    side = redact.mask(report.render_side_by_side(rows)) if len(rows) > 1 else None
    out = [_with_campaign(workspace, r) for r in out]
    missing = [r.run_id for r in out if not r.results_extracted]
    last_run = out[-1]
    nxt = _runs_next(workspace, last_run, missing)
    damaged = [damaged_entry(r.run_id, r.changed_evidence) for r in out if r.changed_evidence]
    return SummaryResult(runs=out, side_by_side=side, damaged=damaged, next_call=nxt)


def short_figures(result: Result) -> RunFigures:
    """The run's figures (outcome.figures, as report.md shows them) at the precision of a short answer."""
    return RunFigures.model_validate(short(run_figures(result).model_dump(mode="json")))


def _runs_next(workspace: Workspace, last_run: RunSummary, missing: list[str]) -> str:
    """The one next call after runs are summarized: the campaign's answer for a campaign's point; else reprocess
    what has no result, go on from a keep or a close, repeat a distorted run, or settle a change within noise."""
    if last_run.campaign is not None:
        return calls.campaign_answer(last_run.campaign)
    if missing:
        return f"{calls.reprocess_raw(missing[0])} or {calls.phase_status(missing[0])}"
    if last_run.decision in ("keep", "baseline"):
        return calls.next_candidate(last_run.case_id)
    if last_run.decision == "close":
        parent = load_case(workspace, last_run.case_id).parent or last_run.case_id
        return f"{calls.next_candidate(parent)} — {last_run.case_id} was closed"
    if any(" distorted: " in m for m in last_run.missing):
        return calls.repeat_on_quiet_host(last_run.case_id)
    if any("fail the checks" in m for m in last_run.missing):
        return (
            f"check the engine's usage reporting (the invalid requests are named in {last_run.run_id}'s report); "
            "its counts are not evidence"
        )
    if last_run.missing:
        return f"supply the missing evidence for {last_run.run_id}: {last_run.missing[0]}"
    return calls.repeat(last_run.case_id, "a repeat settles a change within the noise")


def _with_campaign(ws: Workspace, r: RunSummary) -> RunSummary:
    """A run of a campaign's point carries the campaign's verdict on that point (the scenario view's too)."""
    gid = campaign_of(ws, r.case_id)
    if gid is None:
        return r
    view = scenario_view(ws, r.scenario)
    # a newer campaign of the scenario owns its answer: this run's campaign still says what its point is
    row = next((x for x in view.rows if x.case_id == r.case_id), None) if gid in view.campaigns else None
    if row is None:
        cv = campaign_view(ws, gid)
        p = next((x for x in cv.rows if r.case_id in (x.case_id, *x.cases.values())), None)
        said = f"point {p.label} of campaign {gid}: {p.status}" if p else f"a point of campaign {gid}"
        return r.model_copy(update={"campaign": gid, "campaign_verdict": said})
    mean = f" ({view.primary_metric} {row.metric:.4g} mean over {row.runs} valid runs)" if row.metric else ""
    said = f"point {row.change} of campaign {gid}: {row.campaign_verdict}{mean}; campaign: {view.answer}"
    return r.model_copy(update={"campaign": gid, "campaign_verdict": said})


def _scenario(workspace: Workspace, name: str | None) -> SummaryResult:
    if name is not None and not re.fullmatch(SCENARIO_PATTERN, name):
        raise CaseInvalid(
            f"scenario '{quoted(name, 60)}' is not a scenario name: it {PATTERN_RULES[SCENARIO_PATTERN]}",
            "summarize() without arguments shows the latest scenario",
        )
    given = name is not None
    with open_index(workspace) as idx:  # the latest run and the scenario's runs, without folding every run
        latest, damaged = idx.latest(), idx.damaged()
        if not given and latest is not None:  # the latest run is a campaign's point: the campaign's answer is it
            gid = campaign_of(workspace, latest.case_id)
            if gid is not None:
                return _campaign(workspace, gid)
        try:
            name = name or latest_scenario(workspace)
        except NotFound:
            found = f" ({damaged_line(damaged)})" if damaged else ""
            raise NotFound(
                f"no runs and no frozen case in this workspace yet{found}",
                calls.first_case(),
            ) from None
        try:
            view = scenario_view(workspace, name, idx)
        except NotFound:
            if given or latest is None:
                raise
            # the latest run's case is not frozen here (an imported or hand-made ledger): that run, as before
            result = summarize(workspace, [latest.run_id])
            return result.model_copy(update={"damaged": damaged + result.damaged})
        plot = drawn(scenario_plot_path(workspace, view))  # the controller's (or driver's) chart of this view
    damaged += tampered(workspace, [r.run_id for r in view.rows if r.run_id])  # the runs whose figures it shows
    return SummaryResult(
        scenario=view, runs=[], side_by_side=None, plot=plot, damaged=damaged, next_call=scenario_next(view)
    )


def _campaign(ws: Workspace, gid: str) -> SummaryResult:
    view = campaign_view(ws, gid)
    return SummaryResult(
        campaign=view,
        runs=[],
        side_by_side=None,
        plot=drawn(campaign_plot_path(ws, view)),  # the driver's chart of this answer, drawn when it ended
        damaged=tampered(ws, [rid for r in view.rows for rid in r.run_ids]),  # the runs its figures pool
        next_call=view.next_call,
    )


_DRAWN: OrderedDict[str, bytes] = OrderedDict()  # a view's chart drawn in memory, by the name its file would have
DRAWN_KEPT = 8  # charts kept per process (an MCP session asking again for a view nobody drew on disk)


def chart_png(ws: Workspace, result: SummaryResult) -> bytes | None:
    """The answer's chart as PNG bytes, for a caller that shows it (the MCP answer's image): the file its writer
    drew when the answer names one (read, never drawn again), else drawn in memory now (a scenario's or campaign's
    kept in this process under its view's digest); never written. None without matplotlib."""
    if result.plot is not None:
        with contextlib.suppress(OSError):  # removed meanwhile (a newer view's chart replaced it): drawn below
            return Path(result.plot).read_bytes()
    key = (
        campaign_plot_path(ws, result.campaign)
        if result.campaign is not None
        else scenario_plot_path(ws, result.scenario)
        if result.scenario is not None
        else None
    )
    if key is not None and key in _DRAWN:
        _DRAWN.move_to_end(key)
        return _DRAWN[key]
    png = _draw(ws, result)
    if key is not None and png is not None:
        _DRAWN[key] = png
        while len(_DRAWN) > DRAWN_KEPT:
            _DRAWN.popitem(last=False)
    return png


def _draw(ws: Workspace, result: SummaryResult) -> bytes | None:
    if result.campaign is not None:
        view = result.campaign
        return plots.render_pareto(f"campaign {view.name} ({view.campaign_id})", pareto_points(view))
    if result.scenario is not None:
        fig = scenario_figure(ws, result.scenario)
    elif result.runs:
        fig = runs_figure(ws, [r.run_id for r in result.runs])
    else:
        return None
    return None if fig is None else plots.png(fig)


def runs_figure(ws: Workspace, run_ids: list[str]) -> Any:
    """Runs' decision figure (plots.decision_figure): one point per run; None without matplotlib."""
    points, cdfs, bounds = [], {}, {}
    for rid in run_ids:
        run = load_run(ws, rid)
        case = with_current_decision(ws, run.case)
        d = case.decision
        result = summary.load_result(run)
        verdicts = limit_verdicts(case, result)
        w = result.windows.of(d.window) if result is not None else None
        metric = summary.window_stat(w, d.primary_metric) if w is not None else None
        points.append(
            plots.PlotPoint(
                label=rid,
                x=None,
                metric=metric,
                best=False,
                breaks=bool(broken(verdicts)),
                figures={v.limit: v.value for v in verdicts},
            )
        )
        bounds.update(d.limits.bounds())
        cdfs[rid] = summary.latency_samples(ws, rid)
    first = with_current_decision(ws, load_run(ws, run_ids[0]).case).decision
    return plots.decision_figure(
        " vs ".join(run_ids)[:100], f"{first.primary_metric} ({first.window})", "run", points, bounds, cdfs
    )
