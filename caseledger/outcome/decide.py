"""Decide keep / close / insufficient for a candidate result against its baseline.

Compares case.decision.primary_metric on case.decision.window. Throughput is better higher, latency
better lower. 'insufficient' lists every piece of missing evidence, so the next step is to supply it,
not to rerun blindly. Load ended, results extracted and enough to decide are three separate facts.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from caseledger.case.model import Case
from caseledger.metrics import Distribution, NotObserved, Result, Throughput, WindowResult

Outcome = Literal["keep", "close", "insufficient", "baseline"]
Direction = Literal["higher_is_better", "lower_is_better"]

# primary metric -> (group, figure, statistic, direction)
METRICS: dict[str, tuple[str, str, str, Direction]] = {
    "output_throughput": ("throughput", "output", "value", "higher_is_better"),
    "output_throughput_per_card": ("throughput", "output", "per_card", "higher_is_better"),
    "request_throughput": ("throughput", "request", "value", "higher_is_better"),
    "ttft_p50": ("latency", "ttft", "p50", "lower_is_better"),
    "ttft_p99": ("latency", "ttft", "p99", "lower_is_better"),
    "tpot_p50": ("latency", "tpot", "p50", "lower_is_better"),
    "tpot_p99": ("latency", "tpot", "p99", "lower_is_better"),
    "e2e_p50": ("latency", "e2e", "p50", "lower_is_better"),
    "e2e_p99": ("latency", "e2e", "p99", "lower_is_better"),
}


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Reading(_Model):
    """The primary metric as read from one result, with the window it came from."""

    value: float | NotObserved = Field(description="The metric on the decision window")
    window: Literal["whole", "native"] = Field(description="Window the value was read from")
    window_found: bool = Field(description="The window rule found a window")
    requests: int = Field(description="Requests in the window")
    ok: int = Field(description="Successful requests in the window")
    failed: int = Field(description="Failed requests in the window")
    duration_s: float | None = Field(description="Window duration")
    meets_min_requests: bool = Field(description="ok >= the case's min_requests for this window")
    meets_min_duration: bool = Field(description="duration >= the case's min_duration_s for this window")
    processor_version: str = Field(description="Processor version of the result")
    params_key: str = Field(description="Processing parameters key of the result")
    raw_sha256: str | None = Field(description="sha256 of the raw file the result was computed from")


class DecisionRecord(_Model):
    """The decision and the evidence it rests on."""

    outcome: Outcome = Field(
        description="keep: improves by >= min_effect; close: does not; insufficient: "
        "evidence missing (listed in missing); baseline: first of its scenario (no parent, no baseline "
        "named), its own evidence complete: the reference later candidates compare with"
    )
    primary_metric: str = Field(description="case.decision.primary_metric")
    window: Literal["whole", "native"] = Field(description="case.decision.window")
    direction: Direction = Field(description="Which way is better for the metric")
    min_effect: float = Field(description="Smallest relative improvement that counts as keep")
    candidate: Reading | None = Field(description="The candidate's reading (null: no result yet)")
    baseline: Reading | None = Field(description="The baseline's reading (null: no baseline result)")
    baseline_ref: str | None = Field(description="Which run/case the baseline result belongs to")
    relative_improvement: float | None = Field(
        description="(cand - base) / base for higher-is-better, (base - cand) / base for lower-is-better; "
        "positive = better; null when not computable"
    )
    missing: list[str] = Field(description="Missing evidence; empty unless outcome is insufficient")
    load_ended: bool = Field(description="The formal load ended (passed by the caller, from the end evidence)")
    results_extracted: bool = Field(description="Figures were computed from raw records")
    enough_to_decide: bool = Field(description="outcome is keep or close")
    reason: str = Field(description="One sentence: why this outcome")


def _value(w: WindowResult, metric: str) -> float | NotObserved:
    group, figure, stat, _ = METRICS[metric]
    fig = getattr(getattr(w, group), figure)
    if isinstance(fig, NotObserved):
        return fig
    if isinstance(fig, Throughput | Distribution):
        return float(getattr(fig, stat))
    return NotObserved(reason=f"{metric} has no value")


def _reading(r: Result, window: Literal["whole", "native"], metric: str) -> Reading:
    w: WindowResult = getattr(r.windows, window)
    return Reading(
        value=_value(w, metric),
        window=window,
        window_found=w.found,
        requests=w.requests,
        ok=w.ok,
        failed=w.failed,
        duration_s=w.duration_s,
        meets_min_requests=w.meets_min_requests,
        meets_min_duration=w.meets_min_duration,
        processor_version=r.processor_version,
        params_key=r.params_key,
        raw_sha256=r.inputs.raw_sha256,
    )


def _evidence(who: str, rd: Reading, r: Result, metric: str) -> list[str]:
    out: list[str] = []
    w: WindowResult = getattr(r.windows, rd.window)
    if not rd.window_found:
        out.append(f"{who}: no {rd.window} window ({w.reason})")
        return out
    if not rd.meets_min_requests:
        out.append(f"{who}: {rd.window} window has {rd.ok} successful requests, below min_requests {w.min_requests}")
    if not rd.meets_min_duration:
        out.append(f"{who}: {rd.window} window lasts {rd.duration_s:.3f} s, below min_duration_s {w.min_duration_s}")
    if isinstance(rd.value, NotObserved):
        out.append(f"{who}: {metric} NOT_OBSERVED on the {rd.window} window ({rd.value.reason})")
    if r.failed:
        classes = ", ".join(f"{k}={v}" for k, v in r.failures.by_class.items())
        out.append(
            f"{who}: {r.failed} failed request(s) ({classes}); figures exclude them, so the comparison "
            "would not be like for like: repair the cause and run again"
        )
    return out


def decide(
    case: Case, candidate: Result | None, baseline: Result | None, baseline_ref: str | None, *, load_ended: bool
) -> DecisionRecord:
    """keep / close / insufficient on case.decision.primary_metric and window; lists missing evidence.

    candidate None means postprocessing produced no result yet: the decision is insufficient with
    results_extracted false (the caller still records load_ended as it found it).
    """
    d = case.decision
    metric, window = d.primary_metric, d.window
    direction = METRICS[metric][3]
    cand = _reading(candidate, window, metric) if candidate is not None else None
    base = _reading(baseline, window, metric) if baseline is not None else None
    results_extracted = candidate is not None and candidate.requests > 0

    missing: list[str] = []
    if not load_ended:
        missing.append("the formal load has not been confirmed ended")
    if candidate is None or cand is None:
        missing.append("candidate: no result; postprocess the raw data (reprocess_raw) first")
    else:
        if not results_extracted:
            missing.append("candidate: no raw records were processed")
        missing += _evidence("candidate", cand, candidate, metric)
    first_of_scenario = baseline is None and baseline_ref is None
    if first_of_scenario:
        pass  # nothing to compare with: this run becomes the scenario's reference if its own evidence holds
    elif baseline is None or base is None:
        missing.append(
            f"no baseline result ({'baseline ' + baseline_ref if baseline_ref else 'no baseline named'}); "
            "postprocess the baseline run or name one in case.decision.baseline"
        )
    else:
        missing += _evidence("baseline", base, baseline, metric)
        if candidate is not None and baseline.processor_version != candidate.processor_version:
            missing.append(
                f"baseline processed by {baseline.processor_version}, candidate by "
                f"{candidate.processor_version}: reprocess the baseline's raw data with the current "
                "processor (no new load needed)"
            )
        if candidate is not None and window == "native" and baseline.params_key != candidate.params_key:
            missing.append(
                f"native windows differ: baseline {baseline.params_key}, candidate "
                f"{candidate.params_key}; reprocess one of them with the other's rule"
            )

    improvement: float | None = None
    cv = cand.value if cand is not None else None
    bv = base.value if base is not None else None
    if isinstance(cv, float) and isinstance(bv, float):
        if bv == 0:
            missing.append(f"baseline {metric} is 0: no relative change can be computed")
        elif direction == "higher_is_better":
            improvement = (cv - bv) / bv
        else:
            improvement = (bv - cv) / bv

    outcome: Outcome
    if first_of_scenario and not missing and isinstance(cv, float):
        outcome = "baseline"
        reason = (f"no parent and no case.decision.baseline: this run is the scenario's reference; "
                  f"{metric} on {window} = {cv:.4f}")
    elif missing or improvement is None or not isinstance(cv, float) or not isinstance(bv, float):
        outcome = "insufficient"
        reason = f"{len(missing)} piece(s) of evidence missing: " + "; ".join(missing)
    elif improvement >= d.min_effect:
        outcome = "keep"
        reason = (
            f"{metric} on {window} improves by {improvement:+.2%} (>= min_effect {d.min_effect:.2%}): "
            f"{cv:.4f} vs {bv:.4f}"
        )
    else:
        outcome = "close"
        reason = (
            f"{metric} on {window} changes by {improvement:+.2%} (< min_effect {d.min_effect:.2%}): "
            f"{cv:.4f} vs {bv:.4f}"
        )
    return DecisionRecord(
        outcome=outcome,
        primary_metric=metric,
        window=window,
        direction=direction,
        min_effect=d.min_effect,
        candidate=cand,
        baseline=base,
        baseline_ref=baseline_ref,
        relative_improvement=improvement,
        missing=missing,
        load_ended=load_ended,
        results_extracted=results_extracted,
        enough_to_decide=outcome != "insufficient",
        reason=reason,
    )
