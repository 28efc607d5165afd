"""Decide keep / close / insufficient for a candidate result against its baseline, under limits and noise.

Compares case.decision.primary_metric on case.decision.window. Throughput and goodput are better higher,
latency better lower. A run above one of case.decision.limits is closed whatever its throughput. A change
inside the noise (the bootstrap intervals of both runs and, where a case has repeated runs, their spread) is
'insufficient (within noise ±x%)' with the call that would settle it. 'insufficient' lists every piece of
missing evidence, so the next step is to supply it, not to rerun blindly. Load ended, results extracted and
enough to decide are three separate facts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from caseledger.case.decision import LimitWord
from caseledger.case.metrics import LIMITS, METRICS, Direction
from caseledger.case.model import Case
from caseledger.ledger import calls
from caseledger.metrics import Distribution, FrozenModel, Interval, NotObserved, Result

Outcome = Literal["keep", "close", "insufficient", "baseline"]

# The one definition of the decision words: the MCP server instructions and the summarize schema quote it.
OUTCOMES: dict[str, str] = {
    "baseline": "the scenario's reference (first case, no parent or decision.baseline) with complete evidence "
    "within every limit",
    "keep": "within every limit and better by >= min_effect, beyond the noise",
    "close": "breaks a limit (whatever its throughput), or changes by < min_effect or for the worse, beyond the noise",
    "insufficient": "undecided: evidence missing (listed with its fix) or the change is within the noise (±x%; "
    "settle names the call, e.g. a repeat run)",
}
DECISION_WORDS = "; ".join(f"{k}: {v}" for k, v in OUTCOMES.items())
"""The decision words in one line, for agents."""

REPEATS_TO_SETTLE = 3  # runs of a case after which one more repeat no longer narrows the spread much


class Reading(FrozenModel):
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


class LimitVerdict(FrozenModel):
    """One of case.decision.limits checked on the candidate's decision window."""

    limit: str = Field(description="Limit name, e.g. 'tpot_p99_ms'")
    bound: float = Field(description="Upper bound (ms)")
    value: float | None = Field(description="The window's figure (ms); null: NOT_OBSERVED")
    verdict: LimitWord = Field(
        description="value <= bound, above it, or unknown; for a campaign's point (pooled over its valid runs): "
        "uncertain when the 95% interval straddles the bound"
    )
    met: str | None = Field(None, description="A campaign's point: in how many of its valid runs it was met, '2/3'")
    low: float | None = Field(None, description="A campaign's point: the pooled figure's 95% interval, low end (ms)")
    high: float | None = Field(None, description="... and its high end (ms)")


class Noise(FrozenModel):
    """How much the decision metric moves by chance: per side the larger of the bootstrap half-width and the
    run-to-run spread, the two sides combined in quadrature."""

    candidate_interval_rel: float | None = Field(description="Bootstrap 95% half-width of the candidate / its value")
    baseline_interval_rel: float | None = Field(description="Bootstrap 95% half-width of the baseline / its value")
    candidate_runs: int = Field(description="Valid runs of the candidate's case (this one included)")
    baseline_runs: int = Field(description="Valid runs of the baseline's case")
    candidate_spread_rel: float | None = Field(
        description="Run-to-run spread of the candidate's case, (max - min) / 2 / mean; null: one run"
    )
    baseline_spread_rel: float | None = Field(description="Run-to-run spread of the baseline's case; null: one run")
    noise_rel: float = Field(description="Combined relative noise of the change: a change within ± this is noise")


class DecisionRecord(FrozenModel):
    """The decision and the evidence it rests on."""

    outcome: Outcome = Field(description=DECISION_WORDS)
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
    enough_to_decide: bool = Field(description="outcome is keep, close or baseline: anything but insufficient")
    reason: str = Field(description="One sentence: why this outcome")
    limits: list[LimitVerdict] = Field(default_factory=list, description="Each of case.decision.limits, checked")
    noise: Noise | None = Field(None, description="The noise the change was judged against (null: no comparison)")
    settle: str | None = Field(None, description="The call that would settle an undecided change (within noise)")
    warmth: str | None = Field(
        None, description="The two runs met the prefix cache at another warmth (their mean hit ratios apart): said"
    )


def _reading(r: Result, window: Literal["whole", "native"], metric: str) -> Reading:
    w = r.windows.of(window)
    return Reading(
        value=w.value(METRICS[metric]),
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
    w = r.windows.of(rd.window)
    if not rd.window_found:
        out.append(f"{who}: no {rd.window} window ({w.reason})")
        return out
    if w.invalid:
        checks = r.checks
        why = "; ".join(checks.examples[:2]) if checks is not None else ""
        out.append(
            f"{who}: {w.invalid} response(s) in the {rd.window} window with server counts that fail the "
            f"checks ({why}): the server's usage is not evidence; check the engine's usage reporting"
        )
    out += [f"{who}: {rd.window} window distorted: {d}" for d in w.distorted]
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


def limit_verdicts(case: Case, result: Result | None) -> list[LimitVerdict]:
    """case.decision.limits checked on the result's decision window (empty without limits or result)."""
    if result is None:
        return []
    w = result.windows.of(case.decision.window)
    out: list[LimitVerdict] = []
    for name, bound in case.decision.limits.bounds().items():
        value = w.number(LIMITS[name])
        verdict: LimitWord = "not_observed" if value is None else "meets" if value <= bound else "breaks"
        out.append(LimitVerdict(limit=name, bound=bound, value=value, verdict=verdict))
    return out


def broken(verdicts: list[LimitVerdict]) -> str:
    """'tpot_p99_ms 12.3 > 10' for every broken limit ('' when none is broken)."""
    return ", ".join(f"{v.limit} {v.value:.4g} > {v.bound:g}" for v in verdicts if v.verdict == "breaks")


def _interval_rel(r: Result | None, window: str, metric: str) -> float | None:
    if r is None:
        return None
    n = r.windows.of(window).noise
    return n.half_width_rel if isinstance(n, Interval) and n.metric == metric else None


def _spread(values: list[float]) -> float | None:
    """(max - min) / 2 / mean of a case's repeated runs; None for fewer than two."""
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    return (max(values) - min(values)) / 2 / abs(mean) if mean else None


def _side(interval: float | None, spread: float | None) -> float:
    return max(interval or 0.0, spread or 0.0)


def _values(results: Sequence[Result | float], window: Literal["whole", "native"], metric: str) -> list[float]:
    """The metric's values of results (a float: a value already read, e.g. from the ledger's index)."""
    return [
        v
        for r in results
        for v in [r if isinstance(r, float) else _reading(r, window, metric).value]
        if isinstance(v, float)
    ]


def _candidate_missing(
    candidate: Result | None,
    cand: Reading | None,
    verdicts: list[LimitVerdict],
    metric: str,
    window: str,
    *,
    load_ended: bool,
) -> list[str]:
    """What the candidate's side lacks to be decided."""
    missing: list[str] = []
    if not load_ended:
        missing.append("the formal load has not been confirmed ended")
    if candidate is None or cand is None:
        missing.append("candidate: no result; postprocess the raw data (reprocess_raw) first")
        return missing
    if candidate.requests <= 0:
        missing.append("candidate: no raw records were processed")
    missing += _evidence("candidate", cand, candidate, metric)
    missing += [
        f"candidate: {v.limit} NOT_OBSERVED on the {window} window: the limit cannot be checked"
        for v in verdicts
        if v.verdict == "not_observed"
    ]
    return missing


def _baseline_missing(
    candidate: Result | None,
    baseline: Result | None,
    base: Reading | None,
    baseline_ref: str | None,
    metric: str,
    window: str,
) -> list[str]:
    """What the baseline's side lacks (nothing for the scenario's first case: it has nothing to compare with)."""
    if baseline is None and baseline_ref is None:
        return []
    if baseline is None or base is None:
        return [
            f"no baseline result ({'baseline ' + baseline_ref if baseline_ref else 'no baseline named'}); "
            "postprocess the baseline run or name one in case.decision.baseline"
        ]
    missing = _evidence("baseline", base, baseline, metric)
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
    return missing


def _improvement(
    cv: float | NotObserved | None,
    bv: float | NotObserved | None,
    direction: Direction,
    metric: str,
    missing: list[str],
) -> float | None:
    """(cand - base) / base, signed so that positive is better; None (with the reason appended to missing
    for a zero baseline) when it cannot be computed."""
    if not isinstance(cv, float) or not isinstance(bv, float):
        return None
    if bv == 0:
        missing.append(f"baseline {metric} is 0: no relative change can be computed")
        return None
    return (cv - bv) / bv if direction == "higher_is_better" else (bv - cv) / bv


def _noise(
    candidate: Result | None,
    baseline: Result | None,
    repeats: Sequence[Result | float],
    baseline_repeats: Sequence[Result | float],
    window: Literal["whole", "native"],
    metric: str,
) -> Noise:
    c_runs = _values([*([candidate] if candidate else []), *repeats], window, metric)
    b_runs = _values([*([baseline] if baseline else []), *baseline_repeats], window, metric)
    ci, bi = _interval_rel(candidate, window, metric), _interval_rel(baseline, window, metric)
    cs, bs = _spread(c_runs), _spread(b_runs)
    return Noise(
        candidate_interval_rel=ci,
        baseline_interval_rel=bi,
        candidate_runs=len(c_runs),
        baseline_runs=len(b_runs),
        candidate_spread_rel=cs,
        baseline_spread_rel=bs,
        noise_rel=math.hypot(_side(ci, cs), _side(bi, bs)),
    )


class _Verdict(FrozenModel):
    outcome: Outcome
    reason: str
    settle: str | None = None


def _verdict(
    *,
    breaks: str,
    missing: list[str],
    first_of_scenario: bool,
    cv: float | NotObserved | None,
    bv: float | NotObserved | None,
    improvement: float | None,
    noise: Noise | None,
    base_broken: str,
    where: str,
    min_effect: float,
    candidate_case: str | None,
    baseline_ref: str | None,
) -> _Verdict:
    """The outcome and its one-sentence reason, in the order the rules rank: a broken limit closes, the first
    case is the baseline, missing evidence leaves it undecided, then the change against limits, noise and
    min_effect."""
    if breaks and not missing:
        return _Verdict(
            outcome="close", reason=f"close (limit {breaks}): above case.decision.limits whatever its {where}"
        )
    if first_of_scenario and not missing and isinstance(cv, float):
        return _Verdict(
            outcome="baseline",
            reason=f"no parent and no case.decision.baseline: this run is the scenario's reference; {where} = {cv:.4f}",
        )
    if missing or improvement is None or noise is None or not isinstance(cv, float) or not isinstance(bv, float):
        return _Verdict(
            outcome="insufficient", reason=f"{len(missing)} piece(s) of evidence missing: " + "; ".join(missing)
        )
    versus = f"{cv:.4f} vs {bv:.4f}"
    if base_broken:
        return _Verdict(
            outcome="keep",
            reason=f"keep only because the baseline breaks {base_broken} and this run is within every limit"
            + ("" if improvement >= 0 else ", although it is worse")
            + f": {where} changes by {improvement:+.2%}: {versus}",
        )
    if noise.noise_rel > 0 and abs(improvement) <= noise.noise_rel:
        settle = _settle(noise, candidate_case, baseline_ref)
        return _Verdict(
            outcome="insufficient",
            settle=settle,
            reason=f"insufficient (within noise ±{noise.noise_rel:.1%}): {where} changes by "
            f"{improvement:+.2%}, {versus}; {noise_words(noise)}; settle: {settle}",
        )
    if improvement >= min_effect:
        return _Verdict(
            outcome="keep",
            reason=f"{where} improves by {improvement:+.2%} (>= min_effect "
            f"{min_effect:.2%}; {noise_words(noise)}): {versus}",
        )
    return _Verdict(
        outcome="close",
        reason=f"{where} changes by {improvement:+.2%} (< min_effect {min_effect:.2%}; {noise_words(noise)}): {versus}",
    )


def decide(
    case: Case,
    candidate: Result | None,
    baseline: Result | None,
    baseline_ref: str | None,
    *,
    load_ended: bool,
    candidate_case: str | None = None,
    repeats: Sequence[Result | float] = (),
    baseline_repeats: Sequence[Result | float] = (),
    baseline_case: Case | None = None,
) -> DecisionRecord:
    """keep / close / insufficient on case.decision.primary_metric and window, under case.decision.limits and
    judged against the noise; lists missing evidence.

    candidate None means postprocessing produced no result yet: the decision is insufficient with
    results_extracted false (the caller still records load_ended as it found it). repeats / baseline_repeats:
    the other valid results of the candidate's and the baseline's case, or their metric's values (their
    run-to-run spread); candidate_case names the candidate's case in the call that settles a change within the
    noise.
    """
    d = case.decision
    metric, window = d.primary_metric, d.window
    direction = METRICS[metric].direction
    cand = _reading(candidate, window, metric) if candidate is not None else None
    base = _reading(baseline, window, metric) if baseline is not None else None
    verdicts = limit_verdicts(case, candidate)
    missing = _candidate_missing(candidate, cand, verdicts, metric, window, load_ended=load_ended)
    missing += _baseline_missing(candidate, baseline, base, baseline_ref, metric, window)
    cv = cand.value if cand is not None else None
    bv = base.value if base is not None else None
    improvement = _improvement(cv, bv, direction, metric, missing)
    noise = _noise(candidate, baseline, repeats, baseline_repeats, window, metric) if improvement is not None else None
    # a baseline above a limit is no reference for a candidate within every limit
    base_broken = broken(limit_verdicts(baseline_case or case, baseline)) if baseline is not None else ""
    v = _verdict(
        breaks=broken(verdicts),
        missing=missing,
        first_of_scenario=baseline is None and baseline_ref is None,
        cv=cv,
        bv=bv,
        improvement=improvement,
        noise=noise,
        base_broken=base_broken,
        where=f"{metric} on {window}",
        min_effect=d.min_effect,
        candidate_case=candidate_case,
        baseline_ref=baseline_ref,
    )
    return DecisionRecord(
        outcome=v.outcome,
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
        results_extracted=candidate is not None and candidate.requests > 0,
        enough_to_decide=v.outcome != "insufficient",
        reason=v.reason + (f"; {warm}" if (warm := warmth(candidate, baseline, window)) else ""),
        limits=verdicts,
        noise=noise,
        settle=v.settle,
        warmth=warm,
    )


WARMTH_APART = 0.05  # mean prefix-cache hit ratios this far apart: the two runs met caches of another warmth


def warmth(candidate: Result | None, baseline: Result | None, window: Literal["whole", "native"]) -> str | None:
    """A flag when the two runs compared met the prefix cache at another warmth (a cold first wave on a freshly
    started service against a warm one): their mean hit ratios on the decision window, and what the other window
    says; None when alike, or when either has no hit ratio."""
    if candidate is None or baseline is None:
        return None
    means = []
    for r in (candidate, baseline):
        h = r.windows.of(window).cache.hit_ratio
        if not isinstance(h, Distribution):
            return None
        means.append(h.mean)
    if abs(means[0] - means[1]) <= WARMTH_APART:
        return None
    other = "native" if window == "whole" else "whole"
    return (
        f"warmth differs: the candidate's requests hit the prefix cache {means[0]:.0%} on average on the {window} "
        f"window, the baseline's {means[1]:.0%} (a cold first wave against a warm service?); this decision rests on "
        f"the {window} window, the {other} window compares them again"
        + (" without the ramp" if other == "native" else " with the ramp")
    )


def noise_words(n: Noise) -> str:
    """The noise a change was judged against, in words: the within-run interval and the run-to-run spread,
    each only where it was measured ('unknown (1 run)' otherwise, never ±0.0%)."""
    within = max(n.candidate_interval_rel or 0.0, n.baseline_interval_rel or 0.0)
    spreads = [x for x in (n.candidate_spread_rel, n.baseline_spread_rel) if x is not None]
    parts = [f"within run ±{within:.1%}" if within > 0 else "within run unknown (no spread over the requests)"]
    parts.append(
        f"run to run ±{max(spreads):.1%} ({n.candidate_runs} and {n.baseline_runs} runs)"
        if spreads
        else "run to run unknown (1 run each)"
    )
    head = f"noise ±{n.noise_rel:.1%}" if n.noise_rel > 0 else "noise unknown"
    return f"{head}: {', '.join(parts)}"


def _settle(noise: Noise, candidate_case: str | None, baseline_ref: str | None) -> str:
    """The call that narrows the noise most: repeat the side with fewer runs, then a larger N."""
    base_case = baseline_ref.split("@")[0] if baseline_ref else None
    if noise.candidate_runs < REPEATS_TO_SETTLE and (noise.candidate_runs <= noise.baseline_runs or not base_case):
        why = "a repeat measures the run-to-run spread"
        return (
            calls.repeat(candidate_case, why) if candidate_case else f"start_run(the candidate's case_id) again: {why}"
        )
    if base_case and noise.baseline_runs < REPEATS_TO_SETTLE:
        return calls.repeat(base_case, "a repeat of the baseline measures its spread")
    return "freeze_case a child with a larger load.requests: more requests narrow the interval"
