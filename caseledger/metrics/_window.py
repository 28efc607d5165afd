"""One window's figures (latency, tokens, throughput, cache, spec decoding) from its mask and duration. Pure."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import numpy as np

from caseledger.case.measurement import Window
from caseledger.case.metrics import METRICS
from caseledger.case.model import Case
from caseledger.metrics._accel import accel_distortion, accel_window
from caseledger.metrics._columns import F64, B, RawColumns
from caseledger.metrics._derive import Derived
from caseledger.metrics._evidence import Evidence, distortion
from caseledger.metrics._models import (
    STEP_GAP_MS,
    CacheFigures,
    Latency,
    NotObserved,
    SpecDecode,
    Throughput,
    Throughputs,
    Tokens,
    WindowResult,
    value_in,
)
from caseledger.metrics._noise import good_requests, interval
from caseledger.metrics._spans import Span, Steps, window_concurrency
from caseledger.metrics._spec import SpecCounters, not_observed_spec, per_request, window_spec
from caseledger.metrics._stats import agreement, distribution, rate, sum_known

_S = 1e9  # ns per s


# JSON: load/anchor.json, any key may be missing
def _utc(anchor: dict[str, Any] | None, t_ns: int | None) -> str | None:
    if anchor is None or t_ns is None:
        return None
    try:
        if "wall_ns" in anchor:  # integer ns: no rounding through a microsecond string
            at = datetime.fromtimestamp((int(anchor["wall_ns"]) + t_ns - int(anchor["mono_ns"])) / 1e9, UTC)
        else:
            wall = datetime.fromisoformat(str(anchor["wall_utc"]))
            at = wall + timedelta(microseconds=(t_ns - int(anchor["mono_ns"])) / 1000)
    except (KeyError, TypeError, ValueError):
        return None
    return at.isoformat(timespec="milliseconds")


# ---------------------------------------------------------------------------------------------- figures


def _failed_by_class(c: RawColumns, mask: B) -> dict[str, int]:
    idx = np.flatnonzero(mask & ~c.ok)
    return dict(sorted(Counter(str(c.error_class[i] or "unknown") for i in idx).items()))


@dataclass(frozen=True)
class WindowInputs:
    """What every window is computed from: the columns (c.ok excludes invalid responses), the per-request
    figures, the concurrency steps, the case, the clock anchor, the counters and the trust evidence."""

    c: RawColumns
    dv: Derived
    s: Steps
    case: Case
    anchor: dict[str, Any] | None  # JSON: load/anchor.json as read; _utc tolerates a malformed one
    spec: SpecCounters
    ev: Evidence


def compute_window(name: Literal["whole", "native"], span: Span, limits: Window, inp: WindowInputs) -> WindowResult:
    """One window's figures from the valid successful requests credited to it, unless too many are invalid."""
    c, dv, case, ev = inp.c, inp.dv, inp.case, inp.ev
    w = _figures(name, span, limits, inp)
    if span.start is None or span.end is None:
        return w
    mask = np.ones(c.n, dtype=np.bool_) if span.rule == "whole" else (c.send_ns >= span.start) & (c.send_ns <= span.end)
    n_invalid = int((mask & ev.invalid).sum())
    acc = accel_window(ev.accel, span.start, span.end)
    distorted = distortion(case, span.start, span.end, ev, dv.t0) + accel_distortion(acc)
    share = n_invalid / (w.ok + n_invalid) if w.ok + n_invalid else 0.0
    limit = case.measurement.evidence.max_invalid_share
    if n_invalid and share > limit:
        reason = (
            f"{n_invalid} of {w.ok + n_invalid} successful responses in the {name} window have server counts "
            f"that fail the checks ({share:.0%} > measurement.evidence.max_invalid_share {limit:g}): no figure "
            "is computed from them"
        )
        empty = _figures(name, Span(span.rule, span.params, None, None, reason, span.notes), limits, inp)
        return empty.model_copy(
            update={
                "found": w.found,
                "reason": reason,
                "start_s": w.start_s,
                "end_s": w.end_s,
                "duration_s": w.duration_s,
                "start_utc": w.start_utc,
                "requests": w.requests,
                "ok": w.ok,
                "failed": w.failed,
                "failed_by_class": w.failed_by_class,
                "peak_concurrency": w.peak_concurrency,
                "invalid": n_invalid,
                "distorted": distorted,
                "accelerators": acc,
                "notes": [*w.notes, reason],
            }
        )
    notes = w.notes + (
        [f"{n_invalid} successful response(s) with invalid server counts are excluded from every figure"]
        if n_invalid
        else []
    )
    return w.model_copy(update={"invalid": n_invalid, "distorted": distorted, "accelerators": acc, "notes": notes})


def _figures(name: Literal["whole", "native"], span: Span, limits: Window, inp: WindowInputs) -> WindowResult:
    c, dv, s, case, anchor, spec, ev = inp.c, inp.dv, inp.s, inp.case, inp.anchor, inp.spec, inp.ev
    cards = case.target.cards
    if span.start is None or span.end is None:
        return _no_window(name, span, limits, inp)
    start, end = span.start, span.end
    duration_s = (end - start) / _S
    mask = np.ones(c.n, dtype=np.bool_) if span.rule == "whole" else (c.send_ns >= start) & (c.send_ns <= end)
    okm = mask & c.ok
    n_req, n_ok = int(mask.sum()), int(okm.sum())
    notes = list(span.notes)
    nothing = f"no successful request in the {name} window"
    latency = _latency(dv, okm, n_ok, nothing, notes)
    if n_req - n_ok:
        notes.append(
            f"{n_req - n_ok} failed request(s) in the window are excluded from latency, token and throughput figures"
        )
    tokens = _tokens(c, okm, n_ok, nothing)
    prompt = dv.prompt_for_rates[okm]
    throughput, good = _throughput(span, inp, okm, n_ok, prompt, duration_s, nothing)
    metric = case.decision.primary_metric
    noise = interval(
        metric,
        value_in(latency, throughput, METRICS[metric]),
        {
            "ttft": dv.ttft_ms[okm],
            "tpot": dv.tpot_ms[okm],
            "e2e": dv.e2e_ms[okm],
            "output": c.completion_tokens[okm],
            "good": good[okm].astype(np.float64),
        },
    )
    cache = _cache(c, okm, n_ok, prompt, duration_s, cards, case.cache.min_hit_ratio, throughput.input, nothing)
    peak, mean_c = window_concurrency(s, start, end)
    return WindowResult(
        name=name,
        rule=span.rule,
        params=span.params,
        found=True,
        reason=None,
        start_s=(start - dv.t0) / _S,
        end_s=(end - dv.t0) / _S,
        duration_s=duration_s,
        start_utc=_utc(anchor, start),
        requests=n_req,
        ok=n_ok,
        failed=n_req - n_ok - int((mask & ev.invalid).sum()),
        failed_by_class=_failed_by_class(c, mask & ~ev.invalid),
        cards=cards,
        min_requests=limits.min_requests,
        min_duration_s=limits.min_duration_s,
        meets_min_requests=n_ok >= limits.min_requests,
        meets_min_duration=duration_s >= limits.min_duration_s,
        peak_concurrency=peak,
        mean_concurrency=mean_c,
        latency=latency,
        tokens=tokens,
        throughput=throughput,
        cache=cache,
        spec_decode=_spec_window(name, spec, c, okm, dv.t0, nothing),
        notes=notes,
        noise=noise,
    )


def _no_window(name: Literal["whole", "native"], span: Span, limits: Window, inp: WindowInputs) -> WindowResult:
    """The result of a window the rule did not find: every figure NOT_OBSERVED with the reason."""
    cards, cache_min, spec = inp.case.target.cards, inp.case.cache.min_hit_ratio, inp.spec
    reason = span.reason or "no window"
    no = NotObserved(reason=f"no {name} window: {reason}")
    return WindowResult(
        name=name,
        rule=span.rule,
        params=span.params,
        found=False,
        reason=reason,
        start_s=None,
        end_s=None,
        duration_s=None,
        start_utc=None,
        requests=0,
        ok=0,
        failed=0,
        failed_by_class={},
        cards=cards,
        min_requests=limits.min_requests,
        min_duration_s=limits.min_duration_s,
        meets_min_requests=False,
        meets_min_duration=limits.min_duration_s <= 0,  # no minimum, nothing to fall below (min_requests says it)
        peak_concurrency=0,
        mean_concurrency=no,
        latency=Latency(ttft=no, e2e=no, tpot=no, itl=no, itl_token_aware=no, itl_step=no),
        tokens=Tokens(input_body=no, input_chat=no, prompt=no, output=no, prompt_vs_planned=no),
        throughput=Throughputs(request=no, output=no, input=no, total=no, goodput=no),
        cache=CacheFigures(
            denominator=_CACHE_DENOMINATOR,
            requests_with_cached_tokens=0,
            requests_with_cache_hits=0,
            cached_tokens=no,
            hit_ratio=no,
            min_hit_ratio=cache_min,
            share_meeting_min=no,
            nominal_input_throughput=no,
            uncached_input_throughput=no,
        ),
        spec_decode=not_observed_spec(spec.requested, f"no {name} window: {reason}"),
        notes=list(span.notes),
        noise=no,
        accelerators=no,
    )


def _latency(dv: Derived, okm: B, n_ok: int, nothing: str, notes: list[str]) -> Latency:
    """TTFT, E2E, TPOT, ITL and token-aware ITL of the window's successful requests; what they leave out goes
    to notes."""
    chunk_ok = okm[dv.req_of_chunk]
    gaps = dv.gap_ms[chunk_ok]
    aware_gap = chunk_ok & ~np.isnan(dv.gap_ms) & ~np.isnan(dv.gap_tokens) & (dv.gap_tokens >= 1)
    reps = dv.gap_tokens[aware_gap].astype(np.int64)
    aware = np.repeat(dv.gap_ms[aware_gap] / dv.gap_tokens[aware_gap], reps)
    n_one = int((dv.one_token & okm).sum())
    n_nochunk = int((dv.no_chunk & okm).sum())
    n_aware_x = int((dv.aware_excluded & okm).sum())
    if n_one:
        notes.append(f"{n_one} successful request(s) with one output token have no TPOT (undefined for 1 token)")
    if n_nochunk:
        notes.append(f"{n_nochunk} successful request(s) without a content chunk have no TTFT, TPOT or ITL")
    if n_aware_x:
        notes.append(
            f"{n_aware_x} successful request(s) excluded from token-aware ITL: chunk token counts "
            "unknown and chunk count != completion_tokens"
        )
    tpot_reason = nothing if not n_ok else "no successful request with >= 2 output tokens (usage.completion_tokens)"
    itl_reason = nothing if not n_ok else "no successful request with >= 2 content chunks"
    aware_reason = (
        nothing
        if not n_ok
        else (
            "chunk token counts unknown (no chunk_tokens, and chunk count != usage.completion_tokens)"
            if gaps.size
            else itl_reason
        )
    )
    return Latency(
        ttft=distribution(dv.ttft_ms[okm], "ms", nothing if not n_ok else "no successful request with a content chunk"),
        e2e=distribution(dv.e2e_ms[okm], "ms", nothing),
        tpot=distribution(dv.tpot_ms[okm], "ms", tpot_reason),
        itl=distribution(gaps, "ms", itl_reason),
        itl_token_aware=distribution(aware, "ms", aware_reason),
        itl_step=distribution(
            gaps[gaps >= STEP_GAP_MS],
            "ms",
            f"every chunk gap < {STEP_GAP_MS:g} ms: no two engine steps told apart" if gaps.size else itl_reason,
        ),
    )


def _tokens(c: RawColumns, okm: B, n_ok: int, nothing: str) -> Tokens:
    return Tokens(
        input_body=distribution(
            c.input_tokens_body[okm], "tokens", nothing if not n_ok else "no input_tokens_body in records"
        ),
        input_chat=distribution(
            c.input_tokens_chat[okm], "tokens", nothing if not n_ok else "no input_tokens_chat in records"
        ),
        prompt=distribution(
            c.prompt_tokens[okm], "tokens", nothing if not n_ok else "no usage.prompt_tokens from the server"
        ),
        output=distribution(
            c.completion_tokens[okm],
            "tokens",
            nothing if not n_ok else "no usage.completion_tokens from the server",
        ),
        prompt_vs_planned=agreement(c.prompt_tokens[okm], c.input_tokens_chat[okm], nothing if not n_ok else ""),
    )


def _throughput(
    span: Span, inp: WindowInputs, okm: B, n_ok: int, prompt: F64, duration_s: float, nothing: str
) -> tuple[Throughputs, B]:
    """Request, output, input, total and goodput rates over the window; with the good-request mask."""
    c, dv, case, cards = inp.c, inp.dv, inp.case, inp.case.target.cards
    start, end = span.start or 0, span.end or 0  # a found window has both
    in_tok = sum_known(prompt, "prompt tokens (usage.prompt_tokens and input_tokens_chat)")
    if span.rule == "sglang":
        # output credited by chunk timestamps: every successful request's chunks, wherever it started
        in_span = c.ok[dv.req_of_chunk] & (c.chunk_ns >= start) & (c.chunk_ns <= end)
        credit = dv.credit_tokens[in_span]
        missing = int(np.isnan(credit).sum())
        out_tok: float | str = (
            (f"{missing} chunk(s) in the span have unknown token counts (no chunk_tokens, no usage.completion_tokens)")
            if missing
            else float(credit.sum())
        )
    else:
        out_tok = sum_known(c.completion_tokens[okm], "usage.completion_tokens")
    total: float | str
    if isinstance(in_tok, str):
        total = in_tok
    elif isinstance(out_tok, str):
        total = out_tok
    else:
        total = in_tok + out_tok
    input_rate = rate(in_tok, duration_s, cards, "tok/s", "tok")
    good = good_requests(case.decision, okm, dv.ttft_ms, dv.tpot_ms, dv.e2e_ms, dv.one_token)
    n_good: float | str = (
        (float(good.sum()) if n_ok else nothing)
        if case.decision.goodput is not None
        else ("no per-request limits (case.decision.goodput is null)")
    )
    return Throughputs(
        request=rate(float(n_ok) if n_ok else nothing, duration_s, cards, "req/s", "req"),
        output=rate(out_tok, duration_s, cards, "tok/s", "tok"),
        input=input_rate,
        total=rate(total, duration_s, cards, "tok/s", "tok"),
        goodput=rate(n_good, duration_s, cards, "req/s", "good req"),
    ), good


def _cache(
    c: RawColumns,
    okm: B,
    n_ok: int,
    prompt: F64,
    duration_s: float,
    cards: int,
    cache_min: float | None,
    input_rate: Throughput | NotObserved,
    nothing: str,
) -> CacheFigures:
    """Cached tokens and hit ratios against the prompt, the share meeting the case's target, and the input
    throughput with the cached tokens taken out."""
    cached = c.cached_tokens[okm]
    has_cached = ~np.isnan(cached)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(prompt > 0, cached / prompt, np.nan)
    ratio_known = ratio[~np.isnan(ratio)]
    no_cache = nothing if not n_ok else "no usage.prompt_tokens_details.cached_tokens from the server"
    share: float | NotObserved
    if cache_min is None:
        share = NotObserved(reason="no cache target (case.cache.min_hit_ratio is null)")
    elif ratio_known.size == 0:
        share = NotObserved(reason=no_cache)
    else:
        share = float((ratio_known >= cache_min).sum() / ratio_known.size)
    if not n_ok:
        uncached: float | str = nothing
    elif not has_cached.any():
        uncached = no_cache
    elif not has_cached.all():
        uncached = f"{int((~has_cached).sum())} of {n_ok} credited successful requests lack cached_tokens"
    else:
        uncached = sum_known(prompt - cached, "prompt tokens")
    return CacheFigures(
        denominator=_CACHE_DENOMINATOR,
        requests_with_cached_tokens=int(has_cached.sum()),
        requests_with_cache_hits=int((np.nan_to_num(cached) > 0).sum()),
        cached_tokens=distribution(cached, "tokens", no_cache),
        hit_ratio=distribution(ratio, "ratio", no_cache),
        min_hit_ratio=cache_min,
        share_meeting_min=share,
        nominal_input_throughput=input_rate,
        uncached_input_throughput=rate(uncached, duration_s, cards, "tok/s", "tok"),
    )


def _spec_window(
    name: Literal["whole", "native"], spec: SpecCounters, c: RawColumns, okm: B, t0: int, nothing: str
) -> SpecDecode:
    if spec.requested == "none":
        return not_observed_spec(spec.requested, "case.measurement.spec_decode is 'none'")
    return window_spec(spec, per_request(c, okm, t0, nothing), whole=name == "whole")


_CACHE_DENOMINATOR = (
    "chat-template prompt tokens: server usage.prompt_tokens, falling back to the dataset's input_tokens_chat"
)
