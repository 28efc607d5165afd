"""A run's report as data: every figure report.md shows, by window and section, read once from the saved result.

report.md (outcome.markdown, outcome.report) renders these models and summarize(run_ids=[...]) answers with them,
so both views show the same figures. A figure that was not observed is not repeated with its reason: each section
lists its NOT_OBSERVED figures once per reason (`not_observed`). Nothing here computes a figure; it sorts the
result's figures into sections and names them (the names are the result's definitions; LABELS words them).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, TypeVar

from pydantic import Field

from caseledger.errors import quoted
from caseledger.metrics import (
    STEP_GAP_MS,
    Accelerators,
    CounterDelta,
    Distribution,
    FrozenModel,
    Interval,
    NotObserved,
    PositionAcceptance,
    Ratio,
    Result,
    Throughput,
    TokenAgreement,
    WindowResult,
)
from caseledger.outcome.flags import evidence_flags

T = TypeVar("T")

# Every figure's name (the keys of the sections below) and how report.md words it.
LABELS: dict[str, str] = {
    "ttft": "TTFT",
    "tpot": "TPOT",
    "itl": "ITL (chunk gaps)",
    "itl_token_aware": "ITL (token-aware)",
    "itl_step": "ITL (per engine step)",
    "e2e": "E2E",
    "input_body": "input tokens (body)",
    "input_chat": "input tokens (chat template)",
    "prompt": "prompt tokens (server)",
    "output": "output tokens (server)",
    "prompt_vs_planned": "server prompt tokens vs planned chat tokens",
    "request_throughput": "request throughput",
    "output_throughput": "output token throughput",
    "input_throughput": "input token throughput",
    "total_throughput": "total token throughput",
    "goodput": "goodput",
    "cached_tokens": "cached tokens",
    "hit_ratio": "hit ratio",
    "share_meeting_min": "share of requests meeting case.cache.min_hit_ratio",
    "uncached_input_throughput": "uncached (recomputed) input throughput",
    "al_per_request": "AL, per-request counts",
    "acceptance_rate_per_request": "strict acceptance rate, per-request counts",
    "al_accepted_per_request": "1 + accepted / verify steps, per-request",
    "al_counters": "AL, counters (whole window only)",
    "al_accepted_counters": "1 + Δaccepted / Δdrafts, counters",
    "acceptance_rate_counters": "strict acceptance rate, counters",
    "by_position_per_request": "acceptance by draft position, per-request counts",
    "by_position_counters": "acceptance by draft position, counters",
    "mean_concurrency": "mean concurrency",
    "noise": "noise of the decision metric",
    "accelerators": "accelerators of the service host",
}


class Missing(FrozenModel):
    """Figures of one section that were not observed for the same reason: the reason said once."""

    reason: str = Field(description="Why these figures have no value")
    figures: list[str] = Field(description="The figures (names as in the section)")


class Section(FrozenModel):
    """The part every section shares: what it could not observe."""

    not_observed: list[Missing] = Field(
        default_factory=list, description="NOT_OBSERVED figures of this section, grouped by reason (each said once)"
    )


class Distributions(Section):
    """Per-request distributions by figure name (unit in each); the missing ones in not_observed."""

    observed: dict[str, Distribution] = Field(description="Figure name -> its distribution")


class Rates(Section):
    """Rates over the window's duration by figure name, each with its per-card value and its computation."""

    observed: dict[str, Throughput] = Field(description="Figure name -> rate, per card, numerator, computation")


class CacheSection(Section):
    """Prefix-cache hits: cached tokens and hit ratios per request, with their denominator and the cache target."""

    denominator: str = Field(description="What the hit ratio divides by")
    requests_with_cached_tokens: int = Field(
        description="Successful requests whose usage reported cached_tokens (a report of 0 included)"
    )
    requests_with_cache_hits: int | None = Field(
        None, description="Successful requests with cached_tokens > 0 (null: computed before it was counted)"
    )
    observed: dict[str, Distribution] = Field(description="cached_tokens and hit_ratio per request")
    min_hit_ratio: float | None = Field(description="case.cache.min_hit_ratio (null: no cache target)")
    share_meeting_min: float | None = Field(description="Share of requests with a hit ratio that meet the target")
    below_min: int | None = Field(description="Requests whose hit ratio is below the target (null: no target)")
    rates: dict[str, Throughput] = Field(
        description="uncached (recomputed) input throughput; the nominal one is throughput.input_throughput"
    )


class SpecSection(Section):
    """Speculative decoding: AL and acceptance rates with their formula and the numbers they rest on."""

    requested: str = Field(description="case.measurement.spec_decode")
    source: str | None = Field(description="Counter family read (null: none)")
    ratios: dict[str, Ratio] = Field(
        description="Figure name -> value, formula, numerator, denominator (the numbers written out in text)"
    )
    requests: int = Field(description="Successful requests the per-request counts cover")
    requests_with_counts: int = Field(description="Of them, with draft counts")
    requests_with_steps: int = Field(description="Of them, with verify steps")
    span_s: tuple[float, float] | None = Field(description="First send and last end of the counted requests (s)")
    agreement: list[str] = Field(description="Counters against per-request sums, one line per total")
    agree: bool | None = Field(description="Every compared total equal (null: nothing compared)")
    by_position: list[PositionAcceptance] = Field(description="Acceptance per draft position, per-request counts")
    by_position_counters: list[PositionAcceptance] = Field(description="Acceptance per draft position, counters")
    counters: list[CounterDelta] = Field(description="Counters read before and after the load")


class WindowFigures(Section):
    """One window: its extent and every figure report.md shows for it."""

    name: Literal["whole", "native"] = Field(description="Window name")
    rule: str = Field(description="Rule that selected it: whole, aisbench or sglang")
    params: dict[str, float | int | str | None] = Field(description="The rule's parameters as applied")
    found: bool = Field(description="False: the rule found no window (reason says why)")
    reason: str | None = Field(description="Why no window was found")
    start_s: float | None = Field(description="Start, s after the first send")
    end_s: float | None = Field(description="End, s after the first send")
    duration_s: float | None = Field(description="Duration (s): the divisor of every rate")
    start_utc: str | None = Field(description="Start as UTC")
    requests: int = Field(description="Requests in the window")
    ok: int = Field(description="Successful requests")
    failed: int = Field(description="Failed requests")
    failed_by_class: dict[str, int] = Field(description="Failed requests by error class")
    invalid: int = Field(description="Successful requests whose server counts failed a check (excluded)")
    cards: int = Field(description="Per-card divisor")
    min_requests: int = Field(description="The case's minimum successful requests")
    meets_min_requests: bool = Field(description="ok >= min_requests")
    min_duration_s: float = Field(description="The case's minimum duration (s)")
    meets_min_duration: bool = Field(description="duration_s >= min_duration_s")
    peak_concurrency: int = Field(description="Highest concurrency inside the window")
    mean_concurrency: float | None = Field(description="Time-weighted mean concurrency")
    noise: Interval | None = Field(description="Interval of the decision metric")
    distorted: list[str] = Field(description="Why the figures are not a clean measurement (empty: none seen)")
    latency: Distributions = Field(description="TTFT, TPOT, ITL (chunk gaps, token-aware), E2E in ms")
    tokens: Distributions = Field(description="Token counts per request (dataset and server)")
    prompt_vs_planned: TokenAgreement | None = Field(description="Server prompt tokens against planned chat tokens")
    throughput: Rates = Field(description="Request, output, input, total token throughput, goodput")
    cache: CacheSection = Field(description="Prefix-cache hits")
    spec_decode: SpecSection = Field(description="Speculative decoding")
    accelerators: Accelerators | None = Field(
        description="The service host's devices over the window: utilisation, memory, power, clock, the processes "
        "on each (null: not observed, the reason in not_observed)"
    )
    notes: list[str] = Field(description="What was excluded or derived in this window, and why")


class RunFigures(FrozenModel):
    """Every figure of a run's report.md (the definitions stay in report.md and report.json)."""

    processor: str = Field(description="Processor version and window parameters that computed the figures")
    requests: int = Field(description="Requests in the raw records")
    ok: int = Field(description="Successful requests")
    failed: int = Field(description="Failed requests")
    failures: dict[str, int] = Field(description="Failed requests by error class")
    first_error: dict[str, str] = Field(description="First error text per class")
    notes: list[str] = Field(description="Run-level notes (torn tail, exclusions)")
    evidence: list[str] = Field(description="The evidence the figures' trust rests on, one line each")
    schedule: str | None = Field(description="Arrival error against the schedule (null: no schedule)")
    trace: str | None = Field(description="Trace replay, planned shared vs cached tokens (per request: report.md)")
    sessions: str | None = Field(description="Conversations (per turn: report.md)")
    peak_concurrency: int = Field(description="Highest client-side concurrency")
    whole: WindowFigures = Field(description="First send to last end, all requests")
    native: WindowFigures = Field(description="Steady state by the native rule")


def _split(figures: Iterable[tuple[str, T | NotObserved]]) -> tuple[dict[str, T], list[Missing]]:
    """The observed figures by name; the others grouped by their reason, in order of first appearance."""
    seen: dict[str, T] = {}
    missing: dict[str, list[str]] = {}
    for name, fig in figures:
        if isinstance(fig, NotObserved):
            missing.setdefault(fig.reason, []).append(name)
        else:
            seen[name] = fig
    return seen, [Missing(reason=r, figures=names) for r, names in missing.items()]


def _cache(w: WindowResult) -> CacheSection:
    c = w.cache
    dists, missing = _split([("cached_tokens", c.cached_tokens), ("hit_ratio", c.hit_ratio)])
    # the nominal input throughput is throughput.input_throughput (the same figure): shown there only
    rates, missing_rates = _split([("uncached_input_throughput", c.uncached_input_throughput)])
    share = None if isinstance(c.share_meeting_min, NotObserved) else c.share_meeting_min
    hits = dists.get("hit_ratio")
    below = round(hits.count * (1 - share)) if share is not None and hits is not None else None  # share = met / count
    others = [] if share is not None else [("share_meeting_min", c.share_meeting_min)]
    return CacheSection(
        denominator=c.denominator,
        requests_with_cached_tokens=c.requests_with_cached_tokens,
        requests_with_cache_hits=c.requests_with_cache_hits,
        observed=dists,
        min_hit_ratio=c.min_hit_ratio,
        share_meeting_min=share,
        below_min=below,
        rates=rates,
        not_observed=_merge(missing, missing_rates, _split(others)[1]),
    )


def _merge(*groups: list[Missing]) -> list[Missing]:
    """Missing groups of one section merged: one entry per reason."""
    by: dict[str, list[str]] = {}
    for group in groups:
        for m in group:
            by.setdefault(m.reason, []).extend(m.figures)
    return [Missing(reason=r, figures=f) for r, f in by.items()]


def _spec(w: WindowResult) -> SpecSection:
    s, per = w.spec_decode, w.spec_decode.per_request
    ratios, missing = _split(
        [
            ("al_per_request", per.acceptance_length),
            ("acceptance_rate_per_request", per.acceptance_rate),
            ("al_accepted_per_request", per.acceptance_length_accepted),
            ("al_counters", s.acceptance_length),
            ("al_accepted_counters", s.acceptance_length_counters),
            ("acceptance_rate_counters", s.acceptance_rate),
        ]
    )
    positions, missing_positions = _split(
        [("by_position_per_request", per.by_position), ("by_position_counters", s.by_position_counters)]
    )
    return SpecSection(
        requested=s.requested,
        source=s.source,
        ratios=ratios,
        requests=per.requests,
        requests_with_counts=per.requests_with_counts,
        requests_with_steps=per.requests_with_steps,
        span_s=None if per.start_s is None or per.end_s is None else (per.start_s, per.end_s),
        agreement=s.agreement,
        agree=s.agree,
        by_position=positions.get("by_position_per_request", []),
        by_position_counters=positions.get("by_position_counters", []),
        counters=s.counters,
        not_observed=_merge(missing, missing_positions),
    )


# A window's extent: the fields WindowFigures takes from the result as they are (the others are sorted into
# sections below)
_SECTIONS = {
    "latency",
    "tokens",
    "throughput",
    "cache",
    "spec_decode",
    "noise",
    "mean_concurrency",
    "accelerators",
    "not_observed",
}
_EXTENT = (set(WindowFigures.model_fields) & set(WindowResult.model_fields)) - _SECTIONS


def window_figures(w: WindowResult) -> WindowFigures:
    """A window's figures by section, each NOT_OBSERVED reason once per section."""
    lat, tok, thr = w.latency, w.tokens, w.throughput
    latency, no_latency = _split(
        [
            ("ttft", lat.ttft),
            ("tpot", lat.tpot),
            ("itl", lat.itl),
            ("itl_token_aware", lat.itl_token_aware),
            ("itl_step", lat.itl_step),
            ("e2e", lat.e2e),
        ]
    )
    tokens, no_tokens = _split(
        [("input_body", tok.input_body), ("input_chat", tok.input_chat), ("prompt", tok.prompt), ("output", tok.output)]
    )
    agreement, no_agreement = _split([("prompt_vs_planned", tok.prompt_vs_planned)])
    rates, no_rates = _split(
        [
            ("request_throughput", thr.request),
            ("output_throughput", thr.output),
            ("input_throughput", thr.input),
            ("total_throughput", thr.total),
            ("goodput", thr.goodput),
        ]
    )
    concurrency, no_concurrency = _split([("mean_concurrency", w.mean_concurrency)])
    noise, no_noise = _split([("noise", w.noise)])
    devices, no_devices = _split([("accelerators", w.accelerators)])
    return WindowFigures(
        **w.model_dump(include=_EXTENT),
        mean_concurrency=concurrency.get("mean_concurrency"),
        noise=noise.get("noise"),
        latency=Distributions(observed=latency, not_observed=no_latency),
        tokens=Distributions(observed=tokens, not_observed=_merge(no_tokens, no_agreement)),
        prompt_vs_planned=agreement.get("prompt_vs_planned"),
        throughput=Rates(observed=rates, not_observed=no_rates),
        cache=_cache(w),
        spec_decode=_spec(w),
        accelerators=devices.get("accelerators"),
        not_observed=_merge(no_concurrency, no_noise, no_devices),
    )


def run_figures(result: Result) -> RunFigures:
    """Every figure of a run's report, by window and section."""
    return RunFigures(
        processor=f"{result.processor_version} {result.params_key}",
        requests=result.requests,
        ok=result.ok,
        failed=result.failed,
        failures=result.failures.by_class,
        first_error=result.failures.first_error,
        notes=result.notes,
        evidence=[line for f in evidence_flags(result) for line in (f.text, *(f"- {d}" for d in f.details))],
        schedule=result.schedule.text if result.schedule is not None else None,
        trace=result.trace.text if result.trace is not None else None,
        sessions=result.sessions.text if result.sessions is not None else None,
        peak_concurrency=result.concurrency.peak,
        whole=window_figures(result.windows.whole),
        native=window_figures(result.windows.native),
    )


def short(x: Any) -> Any:  # JSON: a model's dump, rounded
    """Figures at the precision of every short answer: a fraction to 4 significant digits; counts, integers and
    text as they are (the numbers an AL rests on stay exact)."""
    if isinstance(x, dict):
        return {k: short(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [short(v) for v in x]
    if isinstance(x, float) and not x.is_integer():
        return float(f"{x:.4g}")
    return x


def label(name: str) -> str:
    """How report.md words a figure."""
    return LABELS.get(name, name)


def _g(x: float) -> str:
    return f"{x:.4g}"


_AL_SOURCES = (("al_counters", "counters"), ("al_per_request", "per-request counts"))  # the AL a brief line shows


def brief(w: WindowFigures) -> str:
    """One line of a window's figures beyond the headline: E2E and ITL, AL with its numbers, cache hits against
    the target, and how many figures were not observed (the details: the structure)."""
    if not w.found:
        return f"no window: {w.reason}"
    parts = [
        f"{name} p50/p99 {_g(d.p50)}/{_g(d.p99)} ms"
        for name, d in ((n.upper(), w.latency.observed.get(n)) for n in ("e2e", "itl"))
        if d is not None
    ]
    per_chunk, per_step = w.latency.observed.get("itl"), w.latency.observed.get("itl_step")
    if per_chunk is not None and per_step is not None and per_step.count < per_chunk.count:  # chunks came in bursts
        parts.append(
            f"ITL per step p50/p99 {_g(per_step.p50)}/{_g(per_step.p99)} ms "
            f"({per_chunk.count - per_step.count} of {per_chunk.count} chunk gaps < {STEP_GAP_MS:g} ms merged)"
        )
    ratios = w.spec_decode.ratios
    al = next(((src, ratios[k]) for k, src in _AL_SOURCES if k in ratios), None)
    if al is not None:
        parts.append(f"AL {_g(al[1].value)} = {al[1].numerator:g} / {al[1].denominator:g} ({al[0]})")
    acc = next((ratios[k] for k in ("acceptance_rate_counters", "acceptance_rate_per_request") if k in ratios), None)
    if acc is not None:
        parts.append(f"strict acceptance {_g(acc.value)} = {acc.numerator:g} accepted / {acc.denominator:g} drafted")
    c = w.cache
    hits = c.observed.get("hit_ratio")
    used = hits is not None and (c.min_hit_ratio is not None or hits.max > 0)  # a prefix-cache case, or hits seen
    if used and hits is not None:
        target = "no target" if c.below_min is None else f"{c.below_min} of {hits.count} below {c.min_hit_ratio:g}"
        warm = f", {c.requests_with_cache_hits} of {hits.count} hit" if c.requests_with_cache_hits is not None else ""
        den = c.denominator.split(":")[0]
        parts.append(f"cache hit ratio {_g(hits.min)}..{_g(hits.max)} p50 {_g(hits.p50)} of {den}{warm} ({target})")
    said = [
        f"{', '.join(m.figures)} ({quoted(m.reason, 80)})"
        for s in (w, w.latency, w.tokens, w.throughput)
        for m in s.not_observed
    ]
    for name, sec, seen in (("prefix cache", c, used), ("speculative decoding", w.spec_decode, bool(ratios))):
        if sec.not_observed and not seen:  # nothing of the section observed: one reason for all of it
            said.append(f"{name} ({quoted(sec.not_observed[0].reason, 80)})")
        elif sec.not_observed:
            said += [f"{', '.join(m.figures)} ({quoted(m.reason, 80)})" for m in sec.not_observed]
    if said:  # every figure by name (a section observed nowhere: by its name), with its reason
        parts.append(f"NOT_OBSERVED: {'; '.join(said)}")
    return "; ".join(parts) or "no figures"


def headline_lines(w: WindowFigures) -> list[str]:
    """A window in the words a person reads first (the report's headline, the plain answer): its requests and
    duration, output tok/s (per card where cards > 1), TTFT and TPOT p50/p99, then `brief`'s line."""
    if not w.found:
        return [window_line(w)]
    out = w.throughput.observed.get("output_throughput")
    rate = (f"{_g(out.value)} tok/s" + (f" ({_g(out.per_card)} per card)" if out.cards > 1 else "")) if out else ""
    lat = [
        f"{n.upper()} p50/p99 {_g(d.p50)}/{_g(d.p99)} ms"
        for n, d in ((n, w.latency.observed.get(n)) for n in ("ttft", "tpot"))
        if d is not None
    ]
    return [window_line(w) + (f": {rate}" if rate else "") + (", " + ", ".join(lat) if lat else ""), brief(w)]


def window_line(w: WindowFigures) -> str:
    """'whole: 32 of 32 ok in 12.3 s (meets its minimums), peak C 4': a window's count and duration first."""
    if not w.found:
        return f"{w.name} ({w.rule}): no window: {w.reason}"
    mins = "meets its minimums" if w.meets_min_requests and w.meets_min_duration else "below its minimums"
    took = _g(w.duration_s) if w.duration_s is not None else "?"
    return f"{w.name} ({w.rule}): {w.ok} of {w.requests} ok in {took} s ({mins}), peak C {w.peak_concurrency}"
