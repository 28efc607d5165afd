"""Concurrency as a step function, its series, and the spans of the whole and native windows. Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from caseledger.case.model import Case
from caseledger.metrics._columns import I64, RawColumns
from caseledger.metrics._models import NotObserved, WindowRule
from caseledger.metrics._result import ConcurrencySeries, Params

_S = 1e9  # ns per s
_SERIES_EXACT_MAX = 4096  # change points kept exactly; beyond this the series is bucketed
_SERIES_BUCKETS = 2048


@dataclass(frozen=True)
class Steps:
    """Concurrency as a step function: value cg[k] holds on [tg[k], tg[k+1])."""

    t: I64  # every event, sorted (ends before sends at equal times)
    d: I64  # +1 send, -1 end
    c: I64  # concurrency after each event
    tg: I64  # distinct event times
    cg: I64  # concurrency after the last event at each distinct time

    @property
    def peak(self) -> int:
        return int(self.cg.max()) if self.cg.size else 0


def concurrency_steps(c: RawColumns) -> Steps:
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
    return Steps(t=t, d=d, c=conc, tg=tg, cg=cg)


def concurrency_series(s: Steps, t0: int) -> ConcurrencySeries:
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


def window_concurrency(s: Steps, start: int, end: int) -> tuple[int, float | NotObserved]:
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
class Span:
    rule: WindowRule
    params: dict[str, float | int | str | None]
    start: int | None
    end: int | None
    reason: str | None
    notes: tuple[str, ...] = ()


def _aisbench_span(s: Steps, configured: int) -> Span:
    peak = s.peak
    params: dict[str, float | int | str | None] = {
        "peak_concurrency": peak,
        "configured_concurrency": configured,
    }
    if peak == 0:
        return Span("aisbench", params, None, None, "no requests: no concurrency peak")
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
    return Span("aisbench", params, start, end, None, tuple(notes))


def _sglang_span(s: Steps, ratio: float) -> Span:
    peak = s.peak
    need = max(1, math.ceil(ratio * peak - 1e-9))
    params: dict[str, float | int | str | None] = {
        "ratio": ratio,
        "peak_concurrency": peak,
        "threshold": need,
    }
    if peak == 0:
        return Span("sglang", params, None, None, "no requests: no concurrency peak")
    qual = s.cg[:-1] >= need
    edges = np.diff(np.r_[0, qual.astype(np.int8), 0])
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)  # group index where the run stops: span ends at tg[end]
    if starts.size == 0:
        return Span("sglang", params, None, None, f"concurrency never held >= {need} for a nonzero time")
    durations = s.tg[ends] - s.tg[starts]
    k = int(np.argmax(durations))
    return Span("sglang", params, int(s.tg[starts[k]]), int(s.tg[ends[k]]), None)


def window_spans(c: RawColumns, s: Steps, case: Case, params: Params) -> tuple[Span, Span]:
    """The whole window (first send to last end) and the native window of the case's rule."""
    if c.n == 0:
        return Span("whole", {}, None, None, "no raw records"), Span(
            params.native_rule, {}, None, None, "no raw records"
        )
    whole = Span("whole", {}, int(c.send_ns.min()), int(c.end_ns.max()), None)
    if params.native_rule == "aisbench":
        return whole, _aisbench_span(s, case.load.concurrency)
    return whole, _sglang_span(s, float(params.native_ratio or 0.0))
