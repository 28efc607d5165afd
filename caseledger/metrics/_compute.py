"""Pure computation: raw columns + case -> Result. No I/O; vectorized with numpy.

Per-request figures are computed once for all requests (NaN where undefined); a window is a boolean
mask over requests (and, for the sglang rule, over chunks), and every figure of a window is computed
from that window's mask and duration only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import numpy as np

from caseledger.case.measurement import Window
from caseledger.case.metrics import METRICS
from caseledger.case.model import Case, max_tokens_bound
from caseledger.metrics._checks import Validity, check_counts
from caseledger.metrics._columns import F64, I64, B, RawColumns, RawSource, columns_from_records
from caseledger.metrics._models import (
    DEFINITIONS,
    PROCESSOR_VERSION,
    CacheFigures,
    ConcurrencySeries,
    Distribution,
    Failures,
    HostLoad,
    Inputs,
    Latency,
    NotObserved,
    Params,
    Result,
    Schedule,
    SpecDecode,
    Stall,
    Throughput,
    Throughputs,
    TokenAgreement,
    Tokens,
    TraceReplay,
    TraceRequest,
    WindowResult,
    WindowRule,
    Windows,
    value_in,
)
from caseledger.metrics._noise import good_requests, interval
from caseledger.metrics._params import params_key, resolve_params
from caseledger.metrics._sessions import conversations
from caseledger.metrics._spec import SpecCounters, not_observed_spec, per_request, spec_counters, window_spec
from caseledger.records import RawRecord
from caseledger.workspace import canonical_json, sha256_bytes

_MS = 1e6  # ns per ms
_S = 1e9  # ns per s
_SERIES_EXACT_MAX = 4096  # change points kept exactly; beyond this the series is bucketed
_SERIES_BUCKETS = 2048


# ---------------------------------------------------------------------------------------------- helpers


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.4f}"


def _agreement(server: F64, planned: F64, nothing: str) -> TokenAgreement | NotObserved:
    """Per-request server prompt tokens against the dataset's planned chat tokens (TokenAgreement)."""
    both = ~np.isnan(server) & ~np.isnan(planned)
    if not both.any():
        return NotObserved(reason=nothing or "no request with both usage.prompt_tokens and input_tokens_chat")
    diff = server[both] - planned[both]
    return TokenAgreement(
        compared=int(both.sum()),
        equal=int((diff == 0).sum()),
        max_abs_diff=int(np.abs(diff).max()),
        mean_diff=round(float(diff.mean()), 3),
    )


def _dist(x: F64, unit: str, empty_reason: str) -> Distribution | NotObserved:
    x = x[~np.isnan(x)]
    if x.size == 0:
        return NotObserved(reason=empty_reason)
    p = np.percentile(x, [50.0, 75.0, 90.0, 99.0])
    return Distribution(
        unit=unit,
        count=int(x.size),
        mean=float(x.mean()),
        min=float(x.min()),
        max=float(x.max()),
        p50=float(p[0]),
        p75=float(p[1]),
        p90=float(p[2]),
        p99=float(p[3]),
    )


def _rate(numerator: float | str, duration_s: float, cards: int, unit: str, what: str) -> Throughput | NotObserved:
    if isinstance(numerator, str):
        return NotObserved(reason=numerator)
    if duration_s <= 0:
        return NotObserved(reason="window duration is 0 s")
    value = numerator / duration_s
    per_card = value / cards
    text = (
        f"{_num(numerator)} {what} / {duration_s:.4f} s = {value:.4f} {unit}; "
        f"/ {cards} card{'s' if cards != 1 else ''} = {per_card:.4f} {unit}/card"
    )
    return Throughput(
        unit=unit,
        value=value,
        per_card=per_card,
        numerator=float(numerator),
        duration_s=duration_s,
        cards=cards,
        text=text,
    )


def _sum_known(x: F64, what: str) -> float | str:
    """Sum of a per-request column, or the reason it is unknown (any missing value makes it unknown)."""
    if x.size == 0:
        return f"no successful request credited to the window: no {what}"
    missing = int(np.isnan(x).sum())
    if missing:
        return f"{missing} of {x.size} credited successful requests lack {what}"
    return float(x.sum())


@dataclass(frozen=True)
class _Derived:
    """Per-request and per-chunk figures of all requests, computed once."""

    t0: int
    ttft_ms: F64
    e2e_ms: F64
    tpot_ms: F64
    one_token: B  # ok, chunked, completion_tokens == 1
    no_chunk: B  # ok but no content chunk
    req_of_chunk: I64
    gap_ms: F64  # per chunk: gap to the previous chunk of the same request (NaN for a first chunk)
    gap_tokens: F64  # tokens the chunk carried for the token-aware ITL (NaN: unknown)
    aware_excluded: B  # ok requests whose chunk token counts are unknown and not derivable
    credit_tokens: F64  # per chunk: output tokens credited by timestamp (sglang rule)
    prompt_for_rates: F64


def _derive(c: RawColumns) -> _Derived:
    n = c.n
    t0 = int(c.send_ns.min()) if n else 0
    off = c.offsets
    has = c.n_chunks > 0
    m = int(c.chunk_ns.shape[0])
    first_idx = np.minimum(off[:-1], max(m - 1, 0))
    first_ns = c.chunk_ns[first_idx] if m else np.zeros(n, dtype=np.int64)
    e2e = np.where(c.ok, (c.end_ns - c.send_ns) / _MS, np.nan)
    ttft = np.where(c.ok & has, (first_ns - c.send_ns) / _MS, np.nan)
    out = c.completion_tokens
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(c.ok & has & (out >= 2), (e2e - ttft) / (out - 1), np.nan)
    req = np.repeat(np.arange(n, dtype=np.int64), c.n_chunks)
    is_first = np.zeros(m, dtype=np.bool_)
    is_first[off[:-1][has]] = True
    gap = np.full(m, np.nan)
    if m > 1:
        d = (c.chunk_ns[1:] - c.chunk_ns[:-1]) / _MS
        gap[1:] = np.where(is_first[1:], np.nan, d)
    gap = np.where(c.ok[req], gap, np.nan) if m else gap
    nan_per_req = (
        np.bincount(req, weights=np.isnan(c.chunk_tokens).astype(np.float64), minlength=n) if m else np.zeros(n)
    )
    all_known = has & (nan_per_req == 0)
    derivable = ~all_known & has & (c.n_chunks == out)
    ctok_req = c.chunk_tokens
    if m:
        gap_tokens = np.where(all_known[req], ctok_req, np.where(derivable[req], 1.0, np.nan))
        with np.errstate(invalid="ignore", divide="ignore"):
            spread = out / c.n_chunks
        credit = np.where(all_known[req], ctok_req, spread[req])
    else:
        gap_tokens = np.zeros(0)
        credit = np.zeros(0)
    aware_excluded = c.ok & has & (c.n_chunks > 1) & ~all_known & ~derivable
    prompt = np.where(np.isnan(c.prompt_tokens), c.input_tokens_chat, c.prompt_tokens)
    return _Derived(
        t0=t0,
        ttft_ms=ttft,
        e2e_ms=e2e,
        tpot_ms=tpot,
        one_token=c.ok & has & (out == 1),
        no_chunk=c.ok & ~has,
        req_of_chunk=req,
        gap_ms=gap,
        gap_tokens=gap_tokens,
        aware_excluded=aware_excluded,
        credit_tokens=credit,
        prompt_for_rates=prompt,
    )


# ---------------------------------------------------------------------------------------------- concurrency


@dataclass(frozen=True)
class _Steps:
    """Concurrency as a step function: value cg[k] holds on [tg[k], tg[k+1])."""

    t: I64  # every event, sorted (ends before sends at equal times)
    d: I64  # +1 send, -1 end
    c: I64  # concurrency after each event
    tg: I64  # distinct event times
    cg: I64  # concurrency after the last event at each distinct time

    @property
    def peak(self) -> int:
        return int(self.cg.max()) if self.cg.size else 0


def _steps(c: RawColumns) -> _Steps:
    times = np.concatenate([c.send_ns, c.end_ns])
    deltas = np.concatenate([np.ones(c.n, dtype=np.int64), -np.ones(c.n, dtype=np.int64)])
    order = np.lexsort((deltas, times))
    t, d = times[order], deltas[order]
    conc = np.cumsum(d)
    if t.size:
        last = np.r_[t[1:] != t[:-1], True]
        tg, cg = t[last], conc[last]
    else:
        tg, cg = t, conc
    return _Steps(t=t, d=d, c=conc, tg=tg, cg=cg)


def _series(s: _Steps, t0: int) -> ConcurrencySeries:
    if s.tg.size <= _SERIES_EXACT_MAX:
        return ConcurrencySeries(t_s=((s.tg - t0) / _S).tolist(), c=s.cg.tolist(), peak=s.peak, bucketed=False)
    tmax = int(s.tg[-1])
    span = tmax - t0
    edges = t0 + (span * np.arange(_SERIES_BUCKETS, dtype=np.int64)) // _SERIES_BUCKETS
    at_edge = s.cg[np.searchsorted(s.tg, edges, side="right") - 1]
    lo = np.searchsorted(s.tg, edges, side="left")
    hi = np.r_[lo[1:], s.tg.size]
    nonempty = hi > lo
    inside = np.zeros(_SERIES_BUCKETS, dtype=np.int64)
    inside[nonempty] = np.maximum.reduceat(s.cg, lo[nonempty])
    vals = np.maximum(at_edge, inside)
    t_s = [*((edges - t0) / _S).tolist(), span / _S]
    return ConcurrencySeries(t_s=t_s, c=[*vals.tolist(), int(s.cg[-1])], peak=s.peak, bucketed=True)


def _window_conc(s: _Steps, start: int, end: int) -> tuple[int, float | NotObserved]:
    """Peak and time-weighted mean concurrency over [start, end]."""
    if s.tg.size == 0:
        return 0, NotObserved(reason="no requests")
    seg_start = s.tg
    seg_end = np.r_[s.tg[1:], s.tg[-1]]
    overlap = np.clip(np.minimum(seg_end, end) - np.maximum(seg_start, start), 0, None)
    touching = (seg_start < end) & (seg_end > start)
    peak = int(s.cg[touching].max()) if touching.any() else 0
    if end <= start:
        return peak, NotObserved(reason="window duration is 0 s")
    mean = float((overlap * s.cg).sum() / (end - start))
    return peak, mean


# ---------------------------------------------------------------------------------------------- windows


@dataclass(frozen=True)
class _Span:
    rule: WindowRule
    params: dict[str, float | int | str | None]
    start: int | None
    end: int | None
    reason: str | None
    notes: tuple[str, ...] = ()


def _aisbench_span(s: _Steps, configured: int) -> _Span:
    peak = s.peak
    params: dict[str, float | int | str | None] = {
        "peak_concurrency": peak,
        "configured_concurrency": configured,
    }
    if peak == 0:
        return _Span("aisbench", params, None, None, "no requests: no concurrency peak")
    reach = np.flatnonzero((s.d == 1) & (s.c == peak))
    notes: list[str] = []
    if peak != configured:
        notes.append(
            f"observed peak concurrency {peak} differs from load.concurrency {configured}; "
            "the window uses the observed peak"
        )
    if reach.size >= 2:
        start = int(s.t[reach[1]])
    else:
        start = int(s.t[reach[0]])
        notes.append("only one request brought concurrency to its peak; the window starts at its send")
    last_group = int(np.flatnonzero(s.cg == peak)[-1])
    end = int(s.tg[last_group + 1]) if last_group + 1 < s.tg.size else int(s.tg[last_group])
    params["requests_reaching_peak"] = int(reach.size)
    return _Span("aisbench", params, start, end, None, tuple(notes))


def _sglang_span(s: _Steps, ratio: float) -> _Span:
    peak = s.peak
    need = max(1, math.ceil(ratio * peak - 1e-9))
    params: dict[str, float | int | str | None] = {
        "ratio": ratio,
        "peak_concurrency": peak,
        "threshold": need,
    }
    if peak == 0:
        return _Span("sglang", params, None, None, "no requests: no concurrency peak")
    qual = s.cg[:-1] >= need
    edges = np.diff(np.r_[0, qual.astype(np.int8), 0])
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)  # group index where the run stops: span ends at tg[end]
    if starts.size == 0:
        return _Span("sglang", params, None, None, f"concurrency never held >= {need} for a nonzero time")
    durations = s.tg[ends] - s.tg[starts]
    k = int(np.argmax(durations))
    return _Span("sglang", params, int(s.tg[starts[k]]), int(s.tg[ends[k]]), None)


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
class _Evidence:
    """What the window's trust is judged on besides the records: invalid requests, client stalls, host CPU."""

    invalid: B  # per request: a successful response whose counts failed a check
    stalls: list[tuple[int, int]]  # (start_ns, end_ns) of each load client stall, client clock
    host: list[dict[str, Any]]  # load/host.jsonl samples


@dataclass(frozen=True)
class _Inputs:
    """What every window is computed from: the columns (c.ok excludes invalid responses), the per-request
    figures, the concurrency steps, the case, the clock anchor, the counters and the trust evidence."""

    c: RawColumns
    dv: _Derived
    s: _Steps
    case: Case
    anchor: dict[str, Any] | None
    spec: SpecCounters
    ev: _Evidence


def _window(name: Literal["whole", "native"], span: _Span, limits: Window, inp: _Inputs) -> WindowResult:
    """One window's figures from the valid successful requests credited to it, unless too many are invalid."""
    c, dv, case, ev = inp.c, inp.dv, inp.case, inp.ev
    w = _figures(name, span, limits, inp)
    if span.start is None or span.end is None:
        return w
    mask = np.ones(c.n, dtype=np.bool_) if span.rule == "whole" else (c.send_ns >= span.start) & (c.send_ns <= span.end)
    n_invalid = int((mask & ev.invalid).sum())
    distorted = _distortion(case, span.start, span.end, ev, dv.t0)
    share = n_invalid / (w.ok + n_invalid) if w.ok + n_invalid else 0.0
    limit = case.measurement.evidence.max_invalid_share
    if n_invalid and share > limit:
        reason = (
            f"{n_invalid} of {w.ok + n_invalid} successful responses in the {name} window have server counts "
            f"that fail the checks ({share:.0%} > measurement.evidence.max_invalid_share {limit:g}): no figure "
            "is computed from them"
        )
        empty = _figures(name, _Span(span.rule, span.params, None, None, reason, span.notes), limits, inp)
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
                "notes": [*w.notes, reason],
            }
        )
    notes = w.notes + (
        [f"{n_invalid} successful response(s) with invalid server counts are excluded from every figure"]
        if n_invalid
        else []
    )
    return w.model_copy(update={"invalid": n_invalid, "distorted": distorted, "notes": notes})


def _distortion(case: Case, start: int, end: int, ev: _Evidence, t0: int) -> list[str]:
    """Why [start, end] is not a clean measurement: the client stalled, or other processes used the host."""
    th = case.measurement.evidence
    out: list[str] = []
    inside = [(max(a, start), min(b, end)) for a, b in ev.stalls if b > start and a < end]
    stalled = sum(b - a for a, b in inside) / _S
    if inside and stalled >= th.max_stall_s:
        a, b = max(inside, key=lambda x: x[1] - x[0])
        out.append(
            f"load client stalled {stalled:.1f} s in all ({len(inside)} stall(s), longest {(b - a) / _S:.1f} s "
            f"from {(a - t0) / _S:.1f} s): its timestamps are late; repeat the run"
        )
    host = host_load(_samples_in(ev.host, start, end))
    if isinstance(host, HostLoad) and host.other_share > th.max_other_cpu_share:
        out.append(
            f"other processes used {host.other_share:.0%} of the host's {host.cores} core(s) during the "
            f"window (> measurement.evidence.max_other_cpu_share {th.max_other_cpu_share:g}): a contended "
            "host; repeat on a quiet host"
        )
    return out


def _samples_in(samples: list[dict[str, Any]], start: int, end: int) -> list[dict[str, Any]]:
    """The host CPU samples whose interval overlaps [start, end] (each covers (mono_ns - dt_ns, mono_ns])."""
    return [x for x in samples if x["mono_ns"] > start and x["mono_ns"] - x["dt_ns"] < end]


def host_load(samples: list[dict[str, Any]]) -> HostLoad | NotObserved:
    """The host's CPU over a set of load/host.jsonl samples (jiffy deltas)."""
    total = sum(x["total"] for x in samples)
    if not samples or total <= 0:
        return NotObserved(reason="no host CPU sample inside the window (samples every 0.5 s by a local controller)")
    busy, ours = sum(x["busy"] for x in samples), sum(x["ours"] for x in samples)
    cores = max(int(x.get("cores", 1)) for x in samples)
    span_s = sum(x["dt_ns"] for x in samples) / _S
    other = max(0.0, (busy - ours) / total)
    client = sum(x["client"] for x in samples) / total * cores
    steal = sum(x.get("steal", 0) for x in samples) / total
    load1 = max(float(x.get("load1", 0.0)) for x in samples)
    text = (
        f"other processes {other:.0%} of {cores} core(s), caseledger + service {ours / total:.0%}, load client "
        f"{client:.0%} of one core, steal {steal:.0%}, load average up to {load1:.2f} ({len(samples)} samples "
        f"over {span_s:.1f} s)"
    )
    return HostLoad(
        samples=len(samples),
        cores=cores,
        span_s=span_s,
        other_share=other,
        ours_share=ours / total,
        client_share=client,
        steal_share=steal,
        load1_max=load1,
        text=text,
    )


def _figures(name: Literal["whole", "native"], span: _Span, limits: Window, inp: _Inputs) -> WindowResult:
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
    peak, mean_c = _window_conc(s, start, end)
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


def _no_window(name: Literal["whole", "native"], span: _Span, limits: Window, inp: _Inputs) -> WindowResult:
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
        meets_min_duration=False,
        peak_concurrency=0,
        mean_concurrency=no,
        latency=Latency(ttft=no, e2e=no, tpot=no, itl=no, itl_token_aware=no),
        tokens=Tokens(input_body=no, input_chat=no, prompt=no, output=no, prompt_vs_planned=no),
        throughput=Throughputs(request=no, output=no, input=no, total=no, goodput=no),
        cache=CacheFigures(
            denominator=_CACHE_DENOMINATOR,
            requests_with_cached_tokens=0,
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
    )


def _latency(dv: _Derived, okm: B, n_ok: int, nothing: str, notes: list[str]) -> Latency:
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
        ttft=_dist(dv.ttft_ms[okm], "ms", nothing if not n_ok else "no successful request with a content chunk"),
        e2e=_dist(dv.e2e_ms[okm], "ms", nothing),
        tpot=_dist(dv.tpot_ms[okm], "ms", tpot_reason),
        itl=_dist(gaps, "ms", itl_reason),
        itl_token_aware=_dist(aware, "ms", aware_reason),
    )


def _tokens(c: RawColumns, okm: B, n_ok: int, nothing: str) -> Tokens:
    return Tokens(
        input_body=_dist(
            c.input_tokens_body[okm], "tokens", nothing if not n_ok else "no input_tokens_body in records"
        ),
        input_chat=_dist(
            c.input_tokens_chat[okm], "tokens", nothing if not n_ok else "no input_tokens_chat in records"
        ),
        prompt=_dist(c.prompt_tokens[okm], "tokens", nothing if not n_ok else "no usage.prompt_tokens from the server"),
        output=_dist(
            c.completion_tokens[okm],
            "tokens",
            nothing if not n_ok else "no usage.completion_tokens from the server",
        ),
        prompt_vs_planned=_agreement(c.prompt_tokens[okm], c.input_tokens_chat[okm], nothing if not n_ok else ""),
    )


def _throughput(
    span: _Span, inp: _Inputs, okm: B, n_ok: int, prompt: F64, duration_s: float, nothing: str
) -> tuple[Throughputs, B]:
    """Request, output, input, total and goodput rates over the window; with the good-request mask."""
    c, dv, case, cards = inp.c, inp.dv, inp.case, inp.case.target.cards
    start, end = span.start or 0, span.end or 0  # a found window has both
    in_tok = _sum_known(prompt, "prompt tokens (usage.prompt_tokens and input_tokens_chat)")
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
        out_tok = _sum_known(c.completion_tokens[okm], "usage.completion_tokens")
    total: float | str
    if isinstance(in_tok, str):
        total = in_tok
    elif isinstance(out_tok, str):
        total = out_tok
    else:
        total = in_tok + out_tok
    input_rate = _rate(in_tok, duration_s, cards, "tok/s", "tok")
    good = good_requests(case.decision, okm, dv.ttft_ms, dv.tpot_ms, dv.e2e_ms, dv.one_token)
    n_good: float | str = (
        (float(good.sum()) if n_ok else nothing)
        if case.decision.goodput is not None
        else ("no per-request limits (case.decision.goodput is null)")
    )
    return Throughputs(
        request=_rate(float(n_ok) if n_ok else nothing, duration_s, cards, "req/s", "req"),
        output=_rate(out_tok, duration_s, cards, "tok/s", "tok"),
        input=input_rate,
        total=_rate(total, duration_s, cards, "tok/s", "tok"),
        goodput=_rate(n_good, duration_s, cards, "req/s", "good req"),
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
        uncached = _sum_known(prompt - cached, "prompt tokens")
    return CacheFigures(
        denominator=_CACHE_DENOMINATOR,
        requests_with_cached_tokens=int(has_cached.sum()),
        cached_tokens=_dist(cached, "tokens", no_cache),
        hit_ratio=_dist(ratio, "ratio", no_cache),
        min_hit_ratio=cache_min,
        share_meeting_min=share,
        nominal_input_throughput=input_rate,
        uncached_input_throughput=_rate(uncached, duration_s, cards, "tok/s", "tok"),
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


def _sha_text(text: str | None) -> str | None:
    return None if text is None else sha256_bytes(text.encode())


def per_request_ms(columns: RawColumns) -> dict[str, F64]:
    """Per-request TTFT, TPOT and E2E (ms) of the successful requests, for CDF plots (NaN where undefined)."""
    dv = _derive(columns)
    ok = columns.ok
    return {"ttft": dv.ttft_ms[ok], "tpot": dv.tpot_ms[ok], "e2e": dv.e2e_ms[ok]}


TRACE_ROWS_LISTED = 10_000


def _schedule(c: RawColumns) -> Schedule | None:
    err = c.arrival_error_ns
    known = ~np.isnan(err)
    n = int(known.sum())
    if n == 0:
        return None
    ms = err[known] / 1e6
    dist = _dist(ms, "ms", "no request carried its due time")
    late = int((ms > 1.0).sum())
    text = (
        f"arrival error over {n} requests: p50 {np.percentile(ms, 50):.3f} ms, p99 {np.percentile(ms, 99):.3f} "
        f"ms, max {ms.max():.3f} ms; {late} sent more than 1 ms late"
    )
    return Schedule(requests=n, arrival_error=dist, late_over_1ms=late, text=text)


def _trace(c: RawColumns) -> TraceReplay | None:
    rows = c.trace_row
    known = ~np.isnan(rows)
    if not known.any():
        return None
    idx = np.flatnonzero(known)
    planned = np.nan_to_num(c.planned_shared_tokens, nan=0.0)
    has = c.ok & known & ~np.isnan(c.cached_tokens)

    def opt(x: float) -> int | None:
        return None if np.isnan(x) else int(x)

    per = [
        TraceRequest(
            i=int(k),
            trace_row=int(rows[k]),
            planned_shared_tokens=int(planned[k]),
            cached_tokens=opt(float(c.cached_tokens[k])),
            prompt_tokens=opt(float(c.prompt_tokens[k])),
            ok=bool(c.ok[k]),
        )
        for k in idx[:TRACE_ROWS_LISTED].tolist()
    ]
    p_sum, c_sum = int(planned[has].sum()), int(c.cached_tokens[has].sum())
    reach = int((has & (c.cached_tokens >= planned)).sum())
    below = int(has.sum()) - reach
    text = (
        f"{int(has.sum())} of {idx.size} trace requests report cached tokens: {c_sum} cached of {p_sum} planned "
        f"shared ({c_sum / p_sum:.1%}); {reach} reach their plan, {below} fall below"
        if p_sum
        else f"{int(has.sum())} of {idx.size} trace requests report cached tokens; none planned any shared tokens"
    )
    return TraceReplay(
        requests=int(idx.size),
        with_cached_tokens=int(has.sum()),
        planned_shared_tokens=p_sum,
        cached_tokens=c_sum,
        cached_at_least_planned=reach,
        cached_below_planned=below,
        per_request=per,
        text=text,
    )


def compute_result(
    case: Case,
    records: Iterable[RawRecord] | RawColumns,
    anchor: dict[str, Any] | None = None,
    metrics_before: str | None = None,
    metrics_after: str | None = None,
    rule: str | None = None,
    ratio: float | None = None,
    *,
    source: RawSource | None = None,
    stalls: Iterable[dict[str, Any]] = (),
    host: Iterable[dict[str, Any]] = (),
    chunks_are_content: bool = True,
) -> Result:
    """Every figure of both windows from raw records; pure (same inputs -> equal Result).

    rule/ratio override case.measurement.native; metrics_before/after are /metrics texts; source names the
    raw file and its sha256 (None: records passed in memory); stalls and host are the lines of load/stalls.jsonl
    ({start_ns, end_ns}) and load/host.jsonl (CPU samples); chunks_are_content False for imported records whose
    chunk times are every SSE line.
    """
    raw = records if isinstance(records, RawColumns) else columns_from_records(records)
    src = source or RawSource()
    params = resolve_params(case, rule, ratio)
    s = _steps(raw)  # concurrency counts every request, valid or not
    notes = _source_notes(src, raw.n)
    validity = _validity(case, raw, params, metrics_before, metrics_after, chunks_are_content)
    c = dataclasses.replace(raw, ok=raw.ok & ~validity.invalid)
    dv = _derive(c)
    stall_spans = sorted((int(x["start_ns"]), int(x["end_ns"])) for x in stalls)
    host_samples = list(host)
    ev = _Evidence(invalid=validity.invalid, stalls=stall_spans, host=host_samples)

    spec = _spec_of(c, params, metrics_before, metrics_after)
    whole_span, native_span = _spans(c, s, case, params)
    inp = _Inputs(c=c, dv=dv, s=s, case=case, anchor=anchor, spec=spec, ev=ev)
    windows = Windows(
        whole=_window("whole", whole_span, case.measurement.whole, inp),
        native=_window("native", native_span, case.measurement.native, inp),
    )

    failed_idx = np.flatnonzero(~raw.ok)
    failures = _failures(c, failed_idx)
    inputs = _inputs(case, raw, c.n, src, anchor, metrics_before, metrics_after)
    inputs_key = hashlib.sha256(canonical_json(inputs.model_dump(mode="json"))).hexdigest()[:16]
    return Result(
        processor_version=PROCESSOR_VERSION,
        params=params,
        params_key=params_key(params.native_rule, params.native_ratio),
        inputs=inputs,
        inputs_key=inputs_key,
        scenario=case.scenario,
        cards=case.target.cards,
        requests=c.n,
        ok=int(raw.ok.sum()),
        failed=int(failed_idx.size),
        failures=failures,
        definitions=dict(DEFINITIONS),
        notes=notes,
        concurrency=_series(s, dv.t0),
        windows=windows,
        checks=validity.summary,
        stalls=[Stall(start_s=(a - dv.t0) / _S, duration_s=(b - a) / _S) for a, b in stall_spans],
        host=host_load(
            _samples_in(host_samples, whole_span.start, whole_span.end)
            if whole_span.start is not None and whole_span.end is not None
            else []
        ),
        schedule=_schedule(raw),
        trace=_trace(raw),
        sessions=conversations(c, dv.ttft_ms, _dist),
    )


def _spec_of(c: RawColumns, params: Params, metrics_before: str | None, metrics_after: str | None) -> SpecCounters:
    """Speculative decoding from the server's counters, over the output tokens of the whole window's successful
    requests."""
    out_sum = _sum_known(c.completion_tokens[c.ok], "usage.completion_tokens")
    return spec_counters(
        params.spec_decode,
        metrics_before,
        metrics_after,
        None if isinstance(out_sum, str) else out_sum,
        out_sum if isinstance(out_sum, str) else "",
    )


def _spans(c: RawColumns, s: _Steps, case: Case, params: Params) -> tuple[_Span, _Span]:
    """The whole window (first send to last end) and the native window of the case's rule."""
    if c.n == 0:
        return _Span("whole", {}, None, None, "no raw records"), _Span(
            params.native_rule, {}, None, None, "no raw records"
        )
    whole = _Span("whole", {}, int(c.send_ns.min()), int(c.end_ns.max()), None)
    if params.native_rule == "aisbench":
        return whole, _aisbench_span(s, case.load.concurrency)
    return whole, _sglang_span(s, float(params.native_ratio or 0.0))


def _failures(c: RawColumns, failed_idx: I64) -> Failures:
    """Failed requests counted by error class, with the first error text of each class."""
    by_class = Counter(str(c.error_class[i] or "unknown") for i in failed_idx)
    first_error: dict[str, str] = {}
    for i in failed_idx:
        first_error.setdefault(str(c.error_class[i] or "unknown"), str(c.error[i] or ""))
    return Failures(
        total=int(failed_idx.size),
        by_class=dict(sorted(by_class.items())),
        first_error=first_error,
        note="failed requests (ok=false) are counted by error_class and excluded from latency, token and "
        "throughput figures; they are included in concurrency",
    )


def _inputs(
    case: Case,
    raw: RawColumns,
    n: int,
    src: RawSource,
    anchor: dict[str, Any] | None,
    metrics_before: str | None,
    metrics_after: str | None,
) -> Inputs:
    """What a result was computed from, by hash: the raw file and records, the case, the anchor, the snapshots."""
    anchor_clean = None if anchor is None else {str(k): v for k, v in anchor.items() if isinstance(v, str | int)}
    return Inputs(
        raw_path=src.path,
        raw_sha256=src.sha256,
        records_sha256=raw.digest(),
        records=n,
        torn_tail=src.torn_tail,
        bad_lines=src.bad_lines,
        case_sha256=sha256_bytes(canonical_json(case.canonical())),
        anchor=anchor_clean,
        metrics_before_sha256=_sha_text(metrics_before),
        metrics_after_sha256=_sha_text(metrics_after),
    )


def _source_notes(src: RawSource, n: int) -> list[str]:
    """What the raw file's reading skipped, or that there was nothing to read."""
    notes: list[str] = []
    if src.torn_tail:
        notes.append("the raw file's last line was cut mid-write (torn) and was skipped")
    if src.bad_lines:
        notes.append(f"{src.bad_lines} unparsable line(s) before the last were skipped")
    if n == 0:
        notes.append("no raw records: no figure can be computed")
    return notes


def _validity(
    case: Case,
    raw: RawColumns,
    params: Params,
    metrics_before: str | None,
    metrics_after: str | None,
    chunks_are_content: bool,
) -> Validity:
    """The server's counts checked before any figure: what fails a check is no evidence for any of them."""
    pre = spec_counters(params.spec_decode, metrics_before, metrics_after, None, "")
    drafts = pre.deltas.get("drafts")
    spec_moved = isinstance(drafts, tuple) and drafts[1] > 0
    return check_counts(
        raw,
        max_tokens_bound(case),
        spec_moved and bool(np.isnan(raw.spec_accepted_tokens).all()),
        case.measurement.evidence.max_invalid_share,
        metrics_before,
        metrics_after,
        chunks_are_content,
    )
