"""The scenario chart (decision metric against the swept value, limits, latency CDFs) and a campaign's Pareto chart
as derived PNGs named by the digest of what they draw. Writers draw them: the end of a run its scenario's, a
campaign's driver when it ends the campaign's and its scenarios'. A reader (summarize) names a file only when it is
on disk for the view it shows, and otherwise draws in memory: it writes none."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

from caseledger import redact
from caseledger.campaign.view import CampaignView
from caseledger.ledger.index import open_index
from caseledger.outcome import plots, summary
from caseledger.outcome.decide import broken
from caseledger.views.scenario import ScenarioView, scenario_view
from caseledger.workspace import Workspace, atomic_write, sha256_bytes

FIGURE_VERSION = b"decision-figure-1"  # bump when decision_figure draws differently: every cached PNG is redrawn


def scenario_plot_path(ws: Workspace, view: ScenarioView) -> str | None:
    """Where the scenario's PNG for this view lives: its name carries the view's digest, so the file on disk is the
    cache (a changed view names a new file; a missing or damaged one is drawn again by its writer, draw_view). None
    without matplotlib (nothing is drawn)."""
    if importlib.util.find_spec("matplotlib") is None:
        return None
    digest = sha256_bytes(FIGURE_VERSION + view.model_dump_json().encode())[:16]
    return str(ws.reports_dir / f"scenario-{view.scenario}-{digest}.png")


def drawn(where: str | None) -> str | None:
    """`where` when a whole PNG is there (drawn by a writer), else None."""
    return where if where is not None and _whole_png(Path(where)) else None


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


def _pareto(view: CampaignView) -> tuple[str, list[plots.PlotPoint]]:
    return f"campaign {view.name} ({view.campaign_id})", pareto_points(view)


def campaign_plot_path(ws: Workspace, view: CampaignView) -> str | None:
    """Where the campaign's Pareto PNG for this answer lives, named by the digest of what it draws (its title and
    points); None without matplotlib."""
    if importlib.util.find_spec("matplotlib") is None:
        return None
    digest = sha256_bytes(FIGURE_VERSION + repr(_pareto(view)).encode())[:16]
    return str(ws.reports_dir / f"campaign-{view.campaign_id}-{digest}.png")


def draw_campaign(ws: Workspace, view: CampaignView) -> str | None:
    """The campaign's Pareto PNG for this answer, drawn unless it is on disk already (its driver calls this when it
    ends); the campaign's older PNGs go once it is written. None without matplotlib."""
    where = campaign_plot_path(ws, view)
    if where is None or drawn(where):
        return where
    png = plots.render_pareto(*_pareto(view))
    if png is None:
        return None
    atomic_write(Path(where), png)
    _remove_older(ws, f"campaign-{view.campaign_id}", Path(where))
    return where


def _remove_older(ws: Workspace, stem: str, kept: Path) -> None:
    """Remove the PNGs `stem-<digest>.png` other than `kept` (drawn for views that are gone); the exact stem only:
    scenario 'a' never removes the PNGs of scenario 'a-b'."""
    for old in ws.reports_dir.glob(f"{stem}-*.png"):
        if old != kept and re.fullmatch(re.escape(stem) + r"-[0-9a-f]{16}", old.stem):
            with contextlib.suppress(FileNotFoundError):
                old.unlink()


def draw_scenario(ws: Workspace, scenario: str) -> str | None:
    """The scenario's PNG for its current view (the view summarize shows), drawn now unless it is on disk already:
    the end of a run calls this so that the next summarize of the scenario attaches the file."""
    with open_index(ws) as idx:
        view = scenario_view(ws, scenario, idx)
    return draw_view(ws, view)


def draw_view(ws: Workspace, view: ScenarioView) -> str | None:
    """Make sure the PNG of this view exists and is whole: drawn once per view, then read from disk (derived:
    deleting it loses nothing). The older PNGs of the scenario are removed once the new one is written. None
    without matplotlib."""
    where = scenario_plot_path(ws, view)
    if where is None:
        return None
    path = Path(where)
    if _whole_png(path):
        return where
    fig = scenario_figure(ws, view)
    if fig is None:
        return None
    atomic_write(path, plots.png(fig))
    _remove_older(ws, f"scenario-{view.scenario}", path)
    return where


def _whole_png(path: Path) -> bool:
    """A complete PNG file (signature first, IEND chunk last): anything else is drawn again."""
    try:
        with path.open("rb") as f:
            head = f.read(8)
            f.seek(-12, os.SEEK_END)
            tail = f.read(12)
    except OSError:  # missing, or shorter than the two ends
        return False
    return head == b"\x89PNG\r\n\x1a\n" and tail == b"\x00\x00\x00\x00IEND\xaeB`\x82"


def scenario_figure(ws: Workspace, view: ScenarioView) -> Any:
    """The scenario's decision figure (plots.decision_figure): one point per case; None without matplotlib."""
    points = [
        plots.PlotPoint(
            label=redact.mask(r.change),
            x=r.swept,
            metric=r.metric,
            best=r.best,
            breaks=bool(broken(r.limits)),
            figures={v.limit: v.value for v in r.limits} or {"tpot_p99_ms": r.ms("tpot_p99_ms")},
        )
        for r in view.rows
    ]
    cdfs = {redact.mask(r.change): summary.latency_samples(ws, r.run_id) for r in view.rows if r.run_id}
    bounds = {v.limit: v.bound for r in view.rows[:1] for v in r.limits}
    return plots.decision_figure(
        f"scenario {view.scenario}",
        f"{view.primary_metric} ({view.window})",
        view.swept or "case",
        points,
        bounds,
        cdfs,
    )
