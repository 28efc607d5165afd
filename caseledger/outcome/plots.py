"""The report's plots: the decision figure, the campaign's Pareto figure, and their PNG and SVG bytes.

matplotlib is a dependency but imported only where a plot is drawn (about a second to import), so a report
without plots never pays for it; the markdown report is complete without them.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def _figure() -> Any:
    """matplotlib's Figure class, or None when matplotlib is not importable. Figures are made without pyplot
    (no global state to close) and laid out with fixed margins: a layout engine draws the figure once more,
    which doubled the time of a summarize that draws."""
    try:
        from matplotlib.figure import Figure  # lazy: heavy (~1 s), only summarize draws
    except ImportError:
        return None
    return Figure


def png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=60)  # the Agg canvas: no display needed (the server and CI have none)
    return buf.getvalue()


def svg(fig: Any) -> str:
    """A figure as an inline <svg> element: text drawn as paths (matplotlib's default svg.fonttype), so the page
    needs no font and no network; no date in its metadata, so the same figure gives the same bytes."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    return text[text.index("<svg") :]  # without the XML declaration and DOCTYPE: an element inside HTML


@dataclass(frozen=True)
class PlotPoint:
    """One case (or run) in the decision plot."""

    label: str  # e.g. 'C=8'
    x: float | None  # the swept value; None: plotted by position
    metric: float | None  # the decision metric
    figures: dict[str, float | None]  # limit name -> the run's value, e.g. {'tpot_p99_ms': 12.3}
    breaks: bool  # above one of the limits
    best: bool  # the scenario's best within every limit


def render_png(
    title: str,
    metric: str,
    x_label: str,
    points: Sequence[PlotPoint],
    bounds: dict[str, float],
    cdfs: Mapping[str, Mapping[str, Iterable[float]]],  # label -> figure -> per-request values (ms)
) -> bytes | None:
    """A PNG of decision_figure(); None when matplotlib is not importable."""
    fig = decision_figure(title, metric, x_label, points, bounds, cdfs)
    return None if fig is None else png(fig)


def render_pareto(title: str, points: Sequence[PlotPoint]) -> bytes | None:
    """A PNG of pareto_figure(); None when matplotlib is not importable."""
    fig = pareto_figure(title, points)
    return None if fig is None else png(fig)


def decision_figure(
    title: str,
    metric: str,
    x_label: str,
    points: Sequence[PlotPoint],
    bounds: dict[str, float],
    cdfs: Mapping[str, Mapping[str, Iterable[float]]],  # label -> figure -> per-request values (ms)
) -> Any:
    """The decision metric against the swept value (limit-breakers marked), each limited figure with its bound
    drawn, and the TTFT and TPOT CDFs per case. None when matplotlib is not importable."""
    figure = _figure()
    if figure is None:
        return None
    by_pos = any(p.x is None for p in points)
    xs = [float(i) if by_pos or p.x is None else p.x for i, p in enumerate(points)]
    fig = figure(figsize=(14, 3.2))
    axes = fig.subplots(1, 4)
    ax = axes[0]
    for x, p in zip(xs, points, strict=True):
        if p.metric is None:
            continue
        style = ("x", "tab:red") if p.breaks else ("*", "tab:green") if p.best else ("o", "tab:blue")
        ax.plot([x], [p.metric], marker=style[0], color=style[1], markersize=10 if p.best else 7, linestyle="none")
    line = [(x, p.metric) for x, p in zip(xs, points, strict=True) if p.metric is not None]
    if line:
        ax.plot([a for a, _ in line], [b for _, b in line], color="tab:blue", alpha=0.3)
    ax.set_title(f"{metric} (x: above a limit, *: best)", fontsize=8)
    ax = axes[1]
    names = list(bounds) or sorted({k for p in points for k in p.figures})
    for name in names:
        pts = [(x, p.figures.get(name)) for x, p in zip(xs, points, strict=True)]
        got = [(x, v) for x, v in pts if v is not None]
        if got:
            ax.plot([a for a, _ in got], [b for _, b in got], marker="o", label=name)
        if name in bounds:
            ax.axhline(bounds[name], linestyle="--", color="tab:red", label=f"limit {name} {bounds[name]:g}")
    ax.set_title("limited figures (ms)", fontsize=8)
    for ax in axes[:2]:
        ax.set_xlabel(x_label, fontsize=8)
        if by_pos:
            ax.set_xticks(xs, [p.label for p in points], rotation=30, fontsize=6)
    for ax, figure in zip(axes[2:], ("ttft", "tpot"), strict=True):
        for label, samples in cdfs.items():
            values = sorted(v for v in samples.get(figure, []) if v == v)  # NaN != NaN: undefined values out
            if values:
                ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post", label=label)
        ax.set_title(f"{figure.upper()} CDF (ms)", fontsize=8)
    for ax in axes[1:]:
        if ax.get_legend_handles_labels()[0]:  # a legend without labelled lines warns
            ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    fig.subplots_adjust(left=0.04, right=0.99, bottom=0.3 if by_pos else 0.16, top=0.84, wspace=0.22)
    return fig


def pareto_figure(title: str, points: Sequence[PlotPoint]) -> Any:
    """A campaign's points: output tok/s per card (metric) against tok/s per user (x); the frontier (best)
    joined and starred, points above a limit crossed. None when matplotlib is not importable."""
    figure = _figure()
    if figure is None:
        return None
    fig = figure(figsize=(5, 3.6))
    ax = fig.subplots()
    for p in points:
        if p.x is None or p.metric is None:
            continue
        style = ("x", "tab:red") if p.breaks else ("*", "tab:green") if p.best else ("o", "tab:blue")
        ax.plot([p.x], [p.metric], marker=style[0], color=style[1], markersize=10 if p.best else 6, linestyle="none")
        ax.annotate(p.label, (p.x, p.metric), fontsize=6, xytext=(3, 3), textcoords="offset points")
    front = sorted((p.x, p.metric) for p in points if p.best and p.x is not None and p.metric is not None)
    if front:
        ax.plot([a for a, _ in front], [b for _, b in front], color="tab:green", alpha=0.5)
    ax.set_xlabel("output tok/s per user (1000 / TPOT p50)", fontsize=8)
    ax.set_ylabel("output tok/s per card", fontsize=8)
    ax.set_title(f"{title}\n*: Pareto frontier within limits, x: above a limit", fontsize=8)
    fig.subplots_adjust(left=0.14, right=0.97, bottom=0.13, top=0.86)
    return fig
