"""What a campaign observed at each point (pure data, no I/O): the objective of each valid run, each limit's
values and pooled percentile, and what the planner, the drift rule and the views read from them."""

from __future__ import annotations

from dataclasses import dataclass, field

from caseledger.campaign.model import Scalar
from caseledger.case.decision import LimitWord

Verdict = LimitWord


@dataclass(frozen=True)
class LimitObs:
    """One limit at one point: its value in each valid run and, where per-request samples exist (TTFT, TPOT,
    E2E), the percentile over the valid runs' requests pooled, with a bootstrap interval that resamples runs and
    requests (metrics.pooled). A p99 of one 16-request run is its slowest request; pooled over runs it is not."""

    bound: float
    values: list[float]
    half_width: float | None  # without a pooled figure: the within-run 95% half-width of the latest run (ms)
    pooled: float | None = None  # the percentile over the pooled requests of the valid runs (ms)
    low: float | None = None  # its 95% interval (ms)
    high: float | None = None
    requests: int = 0  # the requests the pooled figure rests on

    @property
    def mean(self) -> float | None:
        """The limit's figure the verdict rests on: pooled when known, else the mean over the runs."""
        if self.pooled is not None:
            return self.pooled
        return sum(self.values) / len(self.values) if self.values else None

    @property
    def noise(self) -> float:
        if self.pooled is not None and self.low is not None and self.high is not None:
            return max(self.high - self.pooled, self.pooled - self.low)
        spread = (max(self.values) - min(self.values)) / 2 if len(self.values) > 1 else 0.0
        return max(self.half_width or 0.0, spread)

    @property
    def verdict(self) -> Verdict:
        """meets or breaks when the interval is on one side of the bound; uncertain when it straddles it."""
        m = self.mean
        if m is None:
            return "not_observed"
        if self.pooled is not None and self.low is not None and self.high is not None:
            lo, hi = self.low, self.high
        else:
            lo, hi = m - self.noise, m + self.noise
        return "meets" if hi <= self.bound else "breaks" if lo > self.bound else "uncertain"

    @property
    def settled(self) -> bool:
        return self.verdict in ("meets", "breaks")

    @property
    def met(self) -> str:
        """In how many of the valid runs the limit was met, e.g. '2/3'."""
        return f"{sum(1 for v in self.values if v <= self.bound)}/{len(self.values)}"

    def said(self) -> str:
        """'59.2 [51.0, 66.4] <= 60 over 48 requests in 3 runs: uncertain (met in 2/3 runs)'."""
        m = self.mean
        if m is None:
            return "not observed"
        if self.pooled is not None and self.low is not None and self.high is not None:
            fig = f"{m:.4g} [{self.low:.4g}, {self.high:.4g}] pooled over {self.requests} requests"
        else:
            fig = f"{m:.4g} ±{self.noise:.2g}"
        runs = f" in {len(self.values)} run(s)" if self.values else ""
        return f"{fig}{runs} <= {self.bound:g}: {self.verdict} (met in {self.met} runs)"


@dataclass(frozen=True)
class PointObs:
    """What one point measured so far, read from the ledger (campaign/view.py)."""

    case_id: str
    label: str
    values: dict[str, Scalar]
    service_key: str
    metric: list[float]  # the objective in each valid run
    interval_rel: float | None  # within-run bootstrap half-width / value of the latest valid run
    limits: dict[str, LimitObs]
    bad_runs: int  # load attempts without a valid result (distorted, invalid, failed; a resent load is one more)
    active: str | None = None  # a run of it that is going on now
    last_problem: str | None = None  # why its last run gave no valid result
    when: list[str] = field(default_factory=list)  # each valid run's creation time (UTC, ms), as metric
    run_rel: list[float | None] = field(default_factory=list)  # each valid run's within-run half-width / value
    sent: int = 0  # formal requests sent to it, over every run and load attempt
    why: str = ""  # a proposed point: who proposed it and why
    screen: bool = False  # a halving screen (fewer requests than the base's N): measured once, never the answer
    targets: list[str] = field(default_factory=list)  # a pool's: the target of each valid run, as metric
    others: list[float | None] = field(default_factory=list)  # each valid run's other processes' CPU share, as metric
    refused: str | None = None  # the host refused to start it (its policy's words and fix): never planned again

    @property
    def runs(self) -> int:
        return len(self.metric)

    @property
    def mean(self) -> float | None:
        return sum(self.metric) / len(self.metric) if self.metric else None

    @property
    def spread_rel(self) -> float | None:
        m = self.mean
        return (max(self.metric) - min(self.metric)) / 2 / abs(m) if len(self.metric) > 1 and m else None

    @property
    def noise_rel(self) -> float:
        return max(self.interval_rel or 0.0, self.spread_rel or 0.0)

    @property
    def noise_measured(self) -> float | None:
        """noise_rel when a within-run interval or a run-to-run spread was measured; None: unknown (not zero)."""
        return self.noise_rel if self.interval_rel is not None or self.spread_rel is not None else None

    @property
    def meets(self) -> bool | None:
        """Every limit's figure (pooled, else the mean over its runs) within its bound, some perhaps uncertain
        (see `uncertain`); None before a valid run."""
        if not self.metric:
            return None
        return all(lo.mean is not None and lo.mean <= lo.bound for lo in self.limits.values())

    @property
    def uncertain(self) -> list[str]:
        """The limits whose interval straddles the bound: 'tpot_p99_ms met in 2/3 runs'."""
        return [f"{k} met in {lo.met} runs" for k, lo in self.limits.items() if lo.verdict == "uncertain"]

    def broken(self) -> str:
        return ", ".join(
            f"{k} {lo.mean:.4g} > {lo.bound:g}"
            for k, lo in self.limits.items()
            if lo.mean is not None and lo.mean > lo.bound
        )
