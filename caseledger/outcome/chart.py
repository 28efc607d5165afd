"""The scenario chart (decision metric against the swept value, limits, latency CDFs) as a derived PNG named by the
digest of the view it draws: the file on disk is the cache. summarize names it; the end of a run draws it (the data
changed), so a summarize after a run attaches the file instead of drawing it."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
from pathlib import Path
from typing import Any

from caseledger import redact
from caseledger.ledger.index import open_index
from caseledger.outcome import plots, summary
from caseledger.outcome.decide import broken
from caseledger.outcome.scenario import ScenarioView, scenario_view
from caseledger.workspace import Workspace, atomic_write, sha256_bytes

FIGURE_VERSION = b"decision-figure-1"  # bump when decision_figure draws differently: every cached PNG is redrawn


def scenario_plot_path(ws: Workspace, view: ScenarioView) -> str | None:
    """Where the scenario's PNG for this view lives: its name carries the view's digest, so the file on disk is the
    cache (a changed view names a new file; a missing or damaged one is drawn again by draw_plot). None without
    matplotlib (nothing is drawn)."""
    if importlib.util.find_spec("matplotlib") is None:
        return None
    digest = sha256_bytes(FIGURE_VERSION + view.model_dump_json().encode())[:16]
    return str(ws.reports_dir / f"scenario-{view.scenario}-{digest}.png")


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
    for old in ws.reports_dir.glob(f"scenario-{view.scenario}-*.png"):
        if old != path and re.fullmatch(r"[0-9a-f]{16}", old.stem.rsplit("-", 1)[-1]):
            with contextlib.suppress(FileNotFoundError):
                old.unlink()
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
            figures={v.limit: v.value for v in r.limits} or {"tpot_p99_ms": r.tpot_p99_ms},
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
