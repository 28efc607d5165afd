"""The case's decision (how keep/close is decided): the primary metric and window, the baseline, the smallest
effect that counts, latency limits and goodput's per-request limits."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, create_model, model_validator

from caseledger.case.bounds import MAX_TIMEOUT_S, OmitAtDefault, SectionModel
from caseledger.case.metrics import LIMITS, LimitName, PrimaryMetric

_MAX_LIMIT_MS = MAX_TIMEOUT_S * 1000  # a latency limit above one day is a typo


def _limit(what: str) -> Any:
    return Field(
        None,
        gt=0,
        le=_MAX_LIMIT_MS,
        strict=True,
        description=f"Upper bound on {what} of the decision window, ms (at most 86400000); null: no limit",
    )


# A limit checked at a point: within its bound, beyond it, a 95% interval that straddles it (a campaign's pooled
# figure), or no figure
LimitWord = Literal["meets", "breaks", "uncertain", "not_observed"]


class LimitsBase(SectionModel):
    """Upper bounds on window latency percentiles: a run above one is 'close (limit ...)' whatever its
    throughput, and never the scenario's best."""

    def bounds(self) -> dict[str, float]:
        """The limits that are set, name -> bound (ms)."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


if TYPE_CHECKING:
    Limits = LimitsBase
else:  # one field per limit of the metrics table (caseledger.case.metrics.LIMITS), in its order
    Limits = create_model(
        "Limits",
        __base__=LimitsBase,
        __doc__=LimitsBase.__doc__,
        __module__=__name__,
        **{name: (float | None, _limit(m.label)) for name, m in LIMITS.items()},
    )


def _slo(what: str) -> Any:
    return Field(
        None,
        gt=0,
        le=_MAX_LIMIT_MS,
        strict=True,
        description=f"A request counts as good only if its own {what} is at most this, ms (at most "
        "86400000); null: not a condition",
    )


class Goodput(SectionModel):
    """Per-request limits of goodput (as vLLM's --goodput and AIPerf's define it): good requests per second are
    successful requests whose own TTFT, TPOT and E2E are each at most the limits set here."""

    ttft_ms: float | None = _slo("TTFT")
    tpot_ms: float | None = _slo("TPOT (1-token outputs have none and meet it)")
    e2e_ms: float | None = _slo("E2E")

    @model_validator(mode="after")
    def _one_set(self) -> Goodput:
        if self.ttft_ms is None and self.tpot_ms is None and self.e2e_ms is None:
            raise ValueError("decision.goodput sets no limit: give ttft_ms, tpot_ms or e2e_ms, or set it to null")
        return self


class Decision(OmitAtDefault):
    omit_at_default = ("limits", "goodput", "tie_break")  # added after cases were frozen: out of the canonical JSON
    primary_metric: PrimaryMetric = Field(
        "output_throughput_per_card", description="Metric the decision compares; 'goodput' needs decision.goodput"
    )
    window: Literal["whole", "native"] = Field("whole", description="Window the decision compares on")
    baseline: str | None = Field(None, max_length=64, description="Case id of the scenario baseline; null: the parent")
    min_effect: float = Field(
        0.02,
        ge=0,
        le=1000,
        strict=True,
        description="Smallest relative improvement that counts as 'keep' (at most 1000)",
    )
    limits: Limits = Field(
        default_factory=Limits,
        description="Upper bounds on latency percentiles of the decision window, e.g. "
        "{'tpot_p99_ms': 10}; a run above one is closed and never the scenario's best",
    )
    goodput: Goodput | None = Field(None, description="Per-request limits for the goodput metric; null: no goodput")
    tie_break: LimitName = Field(
        "ttft_p99_ms",
        description="A campaign's tie on the primary metric is broken by this latency percentile (lower is better): "
        "the answer names the better of the tied points on it, with its gap and noise",
    )

    @model_validator(mode="after")
    def _goodput_needs_limits(self) -> Decision:
        if self.primary_metric == "goodput" and self.goodput is None:
            raise ValueError(
                "decision.primary_metric 'goodput' needs decision.goodput (e.g. {'tpot_ms': 10}): "
                "which requests count as good"
            )
        return self
