"""report: a self-contained HTML page of runs, a scenario or a campaign, written beside its markdown report.

The selection is summarize's (run ids, one campaign id, a scenario, or the latest). `render_html` renders the
pages in memory (what the MCP resources answer: a reader writes nothing); `html_report` (`caseledger report --html`,
asked for by a person) writes them where a person finds them: a run's report.html beside its report.md, a
scenario's and a campaign's in ledger/reports/. Derived, regenerable files only.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, PrivateAttr

from caseledger import redact
from caseledger.campaign.html import render_campaign
from caseledger.campaign.store import load_campaign
from caseledger.campaign.view import CampaignView
from caseledger.case.metrics import LIMITS
from caseledger.ledger.runs import load_run
from caseledger.metrics import Result, latest_result
from caseledger.outcome import html, plots, summary
from caseledger.outcome.flags import Flag, evidence_flags
from caseledger.tools.summarize import RunSummary, runs_figure, summarize
from caseledger.views.chart import pareto_points, scenario_figure
from caseledger.views.html import render_scenario
from caseledger.views.scenario import ScenarioView, scenario_next
from caseledger.workspace import Workspace, atomic_write


class ReportResult(BaseModel):
    """The HTML page(s) written, and the next call."""

    kind: Literal["runs", "scenario", "campaign"] = Field(description="What the pages show")
    subject: str = Field(description="The run ids, the scenario name or the campaign id")
    paths: list[str] = Field(description="The HTML files written (one per run; one for a scenario or a campaign)")
    _pages: list[str] = PrivateAttr(default_factory=list)  # the pages, as rendered, in the order of paths
    charts: int = Field(description="Charts inlined in all (SVG); 0 when matplotlib is not importable")
    flags: int = Field(description="Evidence flags raised (invalid requests, stalls, distorted windows, failures)")
    next_call: str

    @property
    def pages(self) -> list[str]:
        """The HTML of each page, in the order of `paths`."""
        return self._pages

    def text(self) -> str:
        lines = [
            f"{self.kind} {self.subject}: {len(self.paths)} HTML page(s), {self.charts} chart(s), "
            f"{self.flags} evidence flag(s)",
            *[f"html: {p}" for p in self.paths],
            "open it in a browser (one self-contained file: no script, no network)",
            f"next: {self.next_call}",
        ]
        return "\n".join(lines)


def _chart(caption: str, fig: Any) -> list[html.Chart]:
    return [] if fig is None else [html.Chart(caption, plots.svg(fig))]


def run_flags(result: Result) -> list[Flag]:
    """evidence_flags() and, first, the failed requests by class (a failed request voids a decision)."""
    out: list[Flag] = []
    if result.failed:
        by = ", ".join(f"{k}={v}" for k, v in result.failures.by_class.items())
        out.append(
            Flag(f"failed requests: {result.failed} of {result.requests}" + (f" ({by})" if by else ""), warn=True)
        )
    return out + evidence_flags(result)


def _warned(flags: dict[str, list[Flag]]) -> int:
    return sum(f.warn for fs in flags.values() for f in fs)


def html_report(ws: Workspace, run_ids: list[str], scenario: str | None = None) -> ReportResult:
    """Write the HTML page of what summarize(run_ids, scenario) selects; the answer names the files."""
    out = render_html(ws, run_ids, scenario)
    for path, page in zip(out.paths, out.pages, strict=True):
        atomic_write(Path(path), page)
    return out


def render_html(ws: Workspace, run_ids: list[str], scenario: str | None = None) -> ReportResult:
    """The HTML page(s) of what summarize(run_ids, scenario) selects, rendered in memory (`pages`), with the paths
    html_report writes them to; nothing is written."""
    s = summarize(ws, run_ids, scenario=scenario)
    if s.campaign is not None:
        return _campaign(ws, s.campaign)
    if s.scenario is not None:
        return _scenario(ws, s.scenario)
    paths, pages, charts, flags = [], [], 0, 0
    for r in s.runs:
        path, page, n, f = _run(ws, r)
        paths.append(path)
        pages.append(page)
        charts += n
        flags += f
    ids = [r.run_id for r in s.runs]
    return _with_pages(
        ReportResult(
            kind="runs", subject=", ".join(ids), paths=paths, charts=charts, flags=flags, next_call=s.next_call
        ),
        pages,
    )


def _with_pages(result: ReportResult, pages: list[str]) -> ReportResult:
    result._pages = pages
    return result


def _run(ws: Workspace, r: RunSummary) -> tuple[str, str, int, int]:
    run = load_run(ws, r.run_id)
    result = summary.load_result(run)
    decision = summary.decision_now(run, result)  # as summarize shows it
    flags = run_flags(result) if result is not None else []
    charts = _chart(f"{r.run_id}: decision metric, limited figures, TTFT and TPOT CDFs", runs_figure(ws, [r.run_id]))
    page = html.render_run(
        r.run_id,
        summary.report_meta(run.meta),
        [h for h in (r.whole, r.native) if h],
        decision,
        dict(result.failures.by_class) if result is not None else {},
        flags,
        charts,
        str(run.paths.report_md),
    )
    return str(run.paths.report_html), page, len(charts), sum(f.warn for f in flags)


def _scenario(ws: Workspace, view: ScenarioView) -> ReportResult:
    flags = {
        f"{r.change} ({r.run_id})": run_flags(res)
        for r in view.rows
        if r.run_id and (res := latest_result(ws.run(r.run_id).root)) is not None
    }
    charts = _chart(
        f"scenario {view.scenario}: {view.primary_metric} against {view.swept or 'the case'} with the "
        "limits drawn; TTFT and TPOT CDFs per case",
        scenario_figure(ws, view),
    )
    path = ws.reports_dir / f"scenario-{view.scenario}.html"
    return _with_pages(
        ReportResult(
            kind="scenario",
            subject=view.scenario,
            paths=[str(path)],
            charts=len(charts),
            flags=_warned(flags),
            next_call=scenario_next(view),
        ),
        [render_scenario(view, flags, charts)],
    )


def _campaign(ws: Workspace, view: CampaignView) -> ReportResult:
    camp = load_campaign(ws, view.campaign_id)
    window = camp.decision.window
    axis = camp.search.knee or (next(iter(camp.points[0].values)) if len(camp.points[0].values) == 1 else None)
    values = {p.case_id: p.values for p in camp.points}
    flags: dict[str, list[Flag]] = {}
    points, cdfs = [], {}
    for r in view.rows:
        latest: tuple[str, Result] | None = None
        for rid in r.run_ids:
            res = latest_result(ws.run(rid).root)
            if res is None:
                continue
            flags[f"{r.label} ({rid})"] = run_flags(res)
            if summary.valid(res, window):
                latest = (rid, res)
        if latest is None:
            continue
        rid, res = latest
        w = res.windows.of(window)
        x = values[r.case_id].get(axis) if axis else None
        points.append(
            plots.PlotPoint(
                label=redact.mask(r.label),
                x=float(x) if isinstance(x, int | float) and not isinstance(x, bool) else None,
                metric=r.metric_mean,
                best=r.case_id == view.winner,
                breaks=r.meets is False,
                figures={
                    name: summary.window_stat(w, name) for name in LIMITS if name in camp.decision.limits.bounds()
                },
            )
        )
        cdfs[redact.mask(r.label)] = summary.latency_samples(ws, rid)
    title = f"campaign {redact.mask(view.name)} ({view.campaign_id})"
    pareto = [replace(p, label=redact.mask(p.label)) for p in pareto_points(view)]
    charts = _chart(
        "Pareto frontier: output tok/s per card against tok/s per user (1000 / TPOT p50); * on the "
        "frontier within every limit, x above a limit",
        plots.pareto_figure(title, pareto),
    )
    charts += _chart(
        f"{camp.decision.primary_metric} (mean over valid runs) against {axis or 'the point'} with the "
        "limits drawn; TTFT and TPOT CDFs of each point's latest valid run",
        plots.decision_figure(
            title,
            f"{camp.decision.primary_metric} ({window})",
            axis or "point",
            points,
            camp.decision.limits.bounds(),
            cdfs,
        ),
    )
    path = ws.reports_dir / f"campaign-{view.campaign_id}.html"
    return _with_pages(
        ReportResult(
            kind="campaign",
            subject=view.campaign_id,
            paths=[str(path)],
            charts=len(charts),
            flags=_warned(flags),
            next_call=view.next_call,
        ),
        [render_campaign(view, flags, charts)],
    )
