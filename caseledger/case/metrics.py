"""The metrics a decision may name, in one registry: the primary metrics (what a decision compares) and the
limits (upper bounds on latency percentiles). The case schema's allowed names, decide, summary, the reports
and the campaign view all read them here; caseledger.metrics reads a metric's value off a window result.

Each entry says where its value lives in a window's result (figure and statistic), its unit and which way is
better. Adding a metric is one entry here plus its name in `PrimaryMetric` (a test checks the two agree, and
that every entry resolves on a real result).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Direction = Literal["higher_is_better", "lower_is_better"]
Figure = Literal["output", "request", "goodput", "ttft", "tpot", "itl", "e2e"]
Stat = Literal["value", "per_card", "p50", "p99"]
PrimaryMetric = Literal[
    "output_throughput",
    "output_throughput_per_card",
    "request_throughput",
    "goodput",
    "ttft_p50",
    "ttft_p99",
    "tpot_p50",
    "tpot_p99",
    "e2e_p50",
    "e2e_p99",
]
LimitName = Literal[
    "ttft_p50_ms",
    "ttft_p99_ms",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "itl_p50_ms",
    "itl_p99_ms",
    "e2e_p50_ms",
    "e2e_p99_ms",
]
THROUGHPUT_FIGURES: tuple[Figure, ...] = ("output", "request", "goodput")  # in WindowResult.throughput
LATENCY_FIGURES: tuple[Figure, ...] = ("ttft", "tpot", "itl", "e2e")  # in WindowResult.latency


@dataclass(frozen=True)
class Metric:
    """One named figure of a window: the figure (a throughput or a latency distribution) and its statistic."""

    name: str
    figure: Figure
    stat: Stat
    unit: str
    direction: Direction

    @property
    def higher_is_better(self) -> bool:
        return self.direction == "higher_is_better"


def _rate(name: str, figure: Figure, stat: Stat, unit: str) -> Metric:
    return Metric(name, figure, stat, unit, "higher_is_better")


def _latency(name: str, figure: Figure, stat: Stat) -> Metric:
    return Metric(name, figure, stat, "ms", "lower_is_better")


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        _rate("output_throughput", "output", "value", "tok/s"),
        _rate("output_throughput_per_card", "output", "per_card", "tok/s/card"),
        _rate("request_throughput", "request", "value", "req/s"),
        _rate("goodput", "goodput", "value", "req/s"),
        _latency("ttft_p50", "ttft", "p50"),
        _latency("ttft_p99", "ttft", "p99"),
        _latency("tpot_p50", "tpot", "p50"),
        _latency("tpot_p99", "tpot", "p99"),
        _latency("e2e_p50", "e2e", "p50"),
        _latency("e2e_p99", "e2e", "p99"),
    )
}
"""Primary metric name -> where it lives; the names of `PrimaryMetric`, in its order (tests/test_metric_registry)."""

LIMITS: dict[str, Metric] = {
    m.name: m
    for m in (
        _latency("ttft_p50_ms", "ttft", "p50"),
        _latency("ttft_p99_ms", "ttft", "p99"),
        _latency("tpot_p50_ms", "tpot", "p50"),
        _latency("tpot_p99_ms", "tpot", "p99"),
        _latency("itl_p50_ms", "itl", "p50"),
        _latency("itl_p99_ms", "itl", "p99"),
        _latency("e2e_p50_ms", "e2e", "p50"),
        _latency("e2e_p99_ms", "e2e", "p99"),
    )
}
"""Limit name (case.decision.limits) -> the latency percentile it bounds; the names of `LimitName`."""
