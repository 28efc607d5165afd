"""summarize: the scenario view (one row per case: change, run, decision metric, latency percentiles, limit
verdicts, decision) or figures per run (every figure of report.md, outcome.figures) with report.md + report.json
and a side-by-side table; a PNG of the decision metric against the swept value with the limits drawn and the
latency CDFs.

Writes only derived, regenerable files (reports, the side-by-side table, the PNG); never run state.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field

from caseledger import redact
from caseledger.campaign.store import campaign_of
from caseledger.campaign.view import CampaignView, campaign_view
from caseledger.case.bounds import PATTERN_RULES
from caseledger.case.model import SCENARIO_PATTERN
from caseledger.case.store import load_case, with_current_decision
from caseledger.errors import CaseInvalid, NotFound, quoted
from caseledger.ledger.index import open_index
from caseledger.ledger.runs import damaged_line, load_run
from caseledger.ledger.state import fold, sealed_raw_sha256
from caseledger.metrics import Result
from caseledger.outcome import plots, report, summary
from caseledger.outcome.chart import draw_view, scenario_plot_path
from caseledger.outcome.decide import DECISION_WORDS, broken, limit_verdicts
from caseledger.outcome.figures import RunFigures, brief, run_figures, short
from caseledger.outcome.scenario import ScenarioView, latest_scenario, scenario_next, scenario_view
from caseledger.outcome.summary import Headline
from caseledger.run.after_load import raw_change
from caseledger.workspace import Workspace, atomic_write, is_id


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
    report: str | None = Field(description="Path of report.md")
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
    side_by_side: str | None = Field(description="Path of the side-by-side markdown table (several runs)")
    plot: str | None = Field(
        None,
        description="Path of the PNG (metric vs swept value, limits, latency CDFs); "
        "a scenario's is named by its view's digest",
    )
    damaged: list[str] = Field(
        default_factory=list, description="Damaged ledger entries found while looking for the latest run"
    )
    next_call: str = Field(description="The one next call")

    def text(self) -> str:
        if self.campaign is not None:
            return self.campaign.text() + (f"\nplot: {self.plot}" if self.plot else "")
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
            if r.campaign_verdict:  # the campaign decides a point, not one run: its verdict first
                dec = f"{r.campaign_verdict}; this run alone: {dec}"
            lines.append(f"{r.run_id} {r.case_id} {r.scenario}: {dec}")
            if r.changed_evidence:
                lines.append(f"  changed evidence: {r.changed_evidence}")
            mark = {w: " (decides)" if r.decision_window == w else "" for w in ("whole", "native")}
            lines.append(f"  whole{mark['whole']}: {f(r.whole)}")
            lines.append(f"  native ({r.native.rule if r.native else '-'}){mark['native']}: {f(r.native)}")
            if r.figures is not None:  # the decision's window (whole when undecided): what the headline leaves out
                shown = r.figures.native if r.decision_window == "native" else r.figures.whole
                lines.append(f"  {shown.name} also: {brief(shown)}")
        if self.side_by_side:
            lines.append(f"side-by-side: {self.side_by_side}")
        if self.damaged:
            lines.append(damaged_line(self.damaged))
        lines.append(f"next: {self.next_call}")
        return "\n".join(lines)


def summarize(
    workspace: Workspace, run_ids: list[str], scenario: str | None = None, *, draw: bool = True
) -> SummaryResult:
    """The scenario view (no run_ids: the scenario given, else the latest one) or the given runs. draw=False: a
    scenario's answer names its PNG without waiting for it (draw_plot draws it, e.g. after the text is out)."""
    if run_ids and scenario:
        raise CaseInvalid(
            "give run_ids or scenario, not both",
            "summarize(scenario='name') for the rows of a scenario, summarize(run_ids=[...]) for runs",
        )
    if not run_ids:
        result = _scenario(workspace, scenario)
        if draw:
            draw_plot(workspace, result)
        return result
    if any(is_id(r, "g") for r in run_ids):
        if len(run_ids) > 1:
            raise CaseInvalid("a campaign id is summarized alone", f"summarize(run_ids=['{run_ids[0]}'])")
        return _campaign(workspace, run_ids[0])
    out: list[RunSummary] = []
    rows = []
    for rid in run_ids:
        run = load_run(workspace, rid)
        v = fold(workspace, run)
        result = summary.load_result(run)
        last = summary.computed_last(run)
        paths = run.paths
        body = summary.write_reports(run, result)  # {} without a result
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
                time_ledger=_compact(body["time_ledger"] if body else summary.time_ledger(run)),
                report=str(paths.report_md) if paths.report_md.exists() else None,
                changed_evidence=raw_change(paths, sealed_raw_sha256(v)) if not v.controller_alive else None,
            )
        )
    side = None
    if len(rows) > 1:
        side_path = workspace.reports_dir / ("side-by-side-" + "-".join(r[0] for r in rows)[:120] + ".md")
        atomic_write(side_path, redact.mask(report.render_side_by_side(rows)))
        side = str(side_path)
    plot = _runs_plot(workspace, [r.run_id for r in out])
    out = [_with_campaign(workspace, r) for r in out]
    missing = [r.run_id for r in out if not r.results_extracted]
    last_run = out[-1]
    nxt = _runs_next(workspace, last_run, missing)
    return SummaryResult(runs=out, side_by_side=side, plot=plot, next_call=nxt)


def short_figures(result: Result) -> RunFigures:
    """The run's figures (outcome.figures, as report.md shows them) at the precision of a short answer."""
    return RunFigures.model_validate(short(run_figures(result).model_dump(mode="json")))


def _runs_next(workspace: Workspace, last_run: RunSummary, missing: list[str]) -> str:
    """The one next call after runs are summarized: the campaign's answer for a campaign's point; else reprocess
    what has no result, go on from a keep or a close, repeat a distorted run, or settle a change within noise."""
    if last_run.campaign is not None:
        return (
            f"summarize(run_ids=['{last_run.campaign}']): the campaign's answer (its points are not decided run by run)"
        )
    if missing:
        return f"reprocess_raw(run_id='{missing[0]}') or phase_status(run_id='{missing[0]}')"
    if last_run.decision in ("keep", "baseline"):
        return f"freeze_case(next candidate, parent='{last_run.case_id}')"
    if last_run.decision == "close":
        parent = load_case(workspace, last_run.case_id).parent or last_run.case_id
        return f"freeze_case(next candidate, parent='{parent}') — {last_run.case_id} was closed"
    if any(" distorted: " in m for m in last_run.missing):
        return (
            f"start_run(case_id='{last_run.case_id}') again on a quiet host: a distorted window (a stalled "
            "client, a contended host) is repeated, never decided on"
        )
    if any("fail the checks" in m for m in last_run.missing):
        return (
            f"check the engine's usage reporting (the invalid requests are named in {last_run.run_id}'s report); "
            "its counts are not evidence"
        )
    if last_run.missing:
        return f"supply the missing evidence for {last_run.run_id}: {last_run.missing[0]}"
    return f"start_run(case_id='{last_run.case_id}') again: a repeat settles a change within the noise"


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
                "freeze_case(path='cases/x.json') then start_run(case_id=...)",
            ) from None
        try:
            view = scenario_view(workspace, name, idx)
        except NotFound:
            if given or latest is None:
                raise
            # the latest run's case is not frozen here (an imported or hand-made ledger): that run, as before
            result = summarize(workspace, [latest.run_id])
            return result.model_copy(update={"damaged": damaged})
        plot = scenario_plot_path(workspace, view)
    return SummaryResult(
        scenario=view, runs=[], side_by_side=None, plot=plot, damaged=damaged, next_call=scenario_next(view)
    )


def _campaign(ws: Workspace, gid: str) -> SummaryResult:
    view = campaign_view(ws, gid)
    png = plots.render_pareto(f"campaign {view.name} ({gid})", pareto_points(view))
    return SummaryResult(
        campaign=view,
        runs=[],
        side_by_side=None,
        plot=_write_png(ws, f"campaign-{gid}.png", png),
        next_call=view.next_call,
    )


def pareto_points(view: CampaignView) -> list[plots.PlotPoint]:
    """A campaign's measured points for its Pareto plot: tok/s per card against tok/s per user."""
    return [
        plots.PlotPoint(
            label=r.label,
            x=r.per_user_tok_s,
            metric=r.per_card_tok_s,
            best=r.pareto,
            breaks=r.meets is False,
            figures={},
        )
        for r in view.rows
        if r.runs
    ]


def draw_plot(ws: Workspace, result: SummaryResult) -> str | None:
    """Make sure the scenario PNG the answer names exists and is whole (outcome.chart.draw_view): drawn once per
    view, then read from disk."""
    if result.scenario is None or result.plot is None:
        return result.plot
    return draw_view(ws, result.scenario)


def _runs_plot(ws: Workspace, run_ids: list[str]) -> str | None:
    fig = runs_figure(ws, run_ids)
    return _write_png(ws, "runs-" + "-".join(run_ids)[:120] + ".png", None if fig is None else plots.png(fig))


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


def _write_png(ws: Workspace, name: str, png: bytes | None) -> str | None:
    if png is None:
        return None
    path = ws.reports_dir / name
    atomic_write(path, png)
    return str(path)
