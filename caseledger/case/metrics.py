"""The metrics a decision may name, in one table: the primary metrics (what a decision compares) and the limits
(upper bounds on latency percentiles). The case schema's allowed names, the limits' fields, the scenario row's
columns, the bootstrap interval of each, decide, summary, the reports and the campaign view all read them here;
caseledger.metrics reads a metric's value off a window result.

Each entry says where its value lives in a window's result (figure and statistic), its unit, its words, what
its bootstrap interval resamples, and whether a decision may compare it and bound it. Which way is better follows
from its kind (a rate: higher; a percentile: lower). Adding a metric is one entry in TABLE (tests/
test_metric_registry.py checks that every entry resolves on a real result and has an interval).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

Direction = Literal["higher_is_better", "lower_is_better"]
Kind = Literal["rate", "percentile"]
Figure = Literal["output", "request", "goodput", "ttft", "tpot", "itl", "e2e"]
Stat = Literal["value", "per_card", "p50", "p75", "p90", "p99"]  # a Throughput's, a Distribution's percentiles
THROUGHPUT_FIGURES: tuple[Figure, ...] = ("output", "request", "goodput")  # in WindowResult.throughput
LATENCY_FIGURES: tuple[Figure, ...] = ("ttft", "tpot", "itl", "e2e")  # in WindowResult.latency
# The per-request samples a window's bootstrap interval resamples: a latency (ms), the output tokens, whether the
# request is good (goodput), or 'request' (each request counts one)
SAMPLES = ("ttft", "tpot", "e2e", "output", "good", "request")


@dataclass(frozen=True)
class Metric:
    """One named figure of a window: the figure (a throughput or a latency distribution) and its statistic."""

    name: str
    figure: Figure
    stat: Stat
    unit: str
    label: str  # how a person reads it, e.g. 'TTFT p99', 'ITL p50 (chunk gaps)'
    sample: str | None  # the per-request sample its interval resamples (one of SAMPLES); None: no interval
    primary: bool = True  # a decision may compare it (case.decision.primary_metric)
    limit: bool = False  # a decision may bound it (case.decision.limits.<name>_ms)

    @property
    def kind(self) -> Kind:
        """A rate over the window (its interval weighs each request by `sample`), or a percentile of `sample`."""
        return "rate" if self.figure in THROUGHPUT_FIGURES else "percentile"

    @property
    def direction(self) -> Direction:
        return "higher_is_better" if self.kind == "rate" else "lower_is_better"

    @property
    def higher_is_better(self) -> bool:
        return self.direction == "higher_is_better"

    @property
    def quantile(self) -> float:
        """A percentile's q (99.0 for p99); ValueError for a rate."""
        if self.kind != "percentile":
            raise ValueError(f"{self.name} is a rate, not a percentile")
        return float(self.stat[1:])


def _rate(name: str, figure: Figure, stat: Stat, unit: str, sample: str) -> Metric:
    return Metric(name, figure, stat, unit, name.replace("_", " "), sample)


def _pct(figure: Figure, stat: Stat, words: str, primary: bool = True, limit: bool = True, note: str = "") -> Metric:
    sample = figure if figure in SAMPLES else None  # ITL: gaps pooled over requests, no per-request sample
    return Metric(f"{figure}_{stat}", figure, stat, "ms", f"{words} {stat}{note}", sample, primary, limit)


TABLE: tuple[Metric, ...] = (
    _rate("output_throughput", "output", "value", "tok/s", "output"),
    _rate("output_throughput_per_card", "output", "per_card", "tok/s/card", "output"),
    _rate("request_throughput", "request", "value", "req/s", "request"),
    _rate("goodput", "goodput", "value", "req/s", "good"),
    _pct("ttft", "p50", "TTFT"),
    _pct("ttft", "p99", "TTFT"),
    _pct("tpot", "p50", "TPOT"),
    _pct("tpot", "p99", "TPOT"),
    _pct("itl", "p50", "ITL", primary=False, note=" (chunk gaps)"),
    _pct("itl", "p99", "ITL", primary=False, note=" (chunk gaps)"),
    _pct("e2e", "p50", "E2E"),
    _pct("e2e", "p99", "E2E"),
)
"""Every metric, once: the primary metrics in the order the schema lists them, each limit in its field order."""

METRICS: dict[str, Metric] = {m.name: m for m in TABLE if m.primary}
"""Primary metric name -> where it lives; the names of `PrimaryMetric`, in its order."""

LIMITS: dict[str, Metric] = {f"{m.name}_ms": replace(m, name=f"{m.name}_ms") for m in TABLE if m.limit}
"""Limit name (case.decision.limits) -> the latency percentile it bounds; the names of `LimitName`."""

if TYPE_CHECKING:
    PrimaryMetric = str
    LimitName = str
else:  # the schema's names, from the table
    PrimaryMetric = Literal[tuple(METRICS)]
    LimitName = Literal[tuple(LIMITS)]
