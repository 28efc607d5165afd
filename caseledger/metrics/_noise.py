"""Goodput and the bootstrap interval of the decision metric, per window (pure numpy, no I/O).

Resampling is seeded, so the same raw records always give the same interval; the number of resamples
shrinks for very large windows so a million-request window still postprocesses in seconds.
"""

from __future__ import annotations

import numpy as np

from caseledger.case.decision import Decision
from caseledger.case.metrics import TABLE, Metric
from caseledger.metrics._columns import F64, B
from caseledger.metrics._models import Interval, NotObserved

SEED = 20_240_601
LEVEL = 0.95
_WORK = 4_000_000  # resampled values per block (memory: 32 MB of int64 indices)


def _metric(name: str) -> Metric:
    """The table's entry of a metric: a primary metric ('tpot_p99') or the percentile a limit bounds."""
    for m in TABLE:
        if m.name == name:
            return m
    raise ValueError(f"no metric '{name}' in caseledger.case.metrics.TABLE: add its entry there (none: no interval)")


def good_requests(d: Decision, ok: B, ttft_ms: F64, tpot_ms: F64, e2e_ms: F64, one_token: B) -> B:
    """Successful requests whose own TTFT, TPOT and E2E meet decision.goodput (all False without it)."""
    g = d.goodput
    if g is None:
        return np.zeros(ok.shape, dtype=np.bool_)
    good = ok.copy()
    with np.errstate(invalid="ignore"):
        if g.ttft_ms is not None:
            good &= ttft_ms <= g.ttft_ms
        if g.tpot_ms is not None:
            good &= (tpot_ms <= g.tpot_ms) | one_token
        if g.e2e_ms is not None:
            good &= e2e_ms <= g.e2e_ms
    return good


def resamples(n: int) -> int:
    """1000 resamples for small windows, fewer (at least 100) when n x resamples would pass 4e6."""
    return int(min(1000, max(100, _WORK // max(n, 1))))


def _quantiles(stats: F64, point: float, metric: str, n: int, b: int) -> Interval:
    low, high = (float(x) for x in np.quantile(stats, [(1 - LEVEL) / 2, (1 + LEVEL) / 2]))
    half = (high - low) / 2 / abs(point) if point else None
    return Interval(
        metric=metric,
        point=point,
        low=min(low, point),
        high=max(high, point),
        level=LEVEL,
        half_width_rel=half,
        resamples=b,
        seed=SEED,
        requests=n,
    )


def interval(metric: str, point: float | NotObserved, per_request: dict[str, F64]) -> Interval | NotObserved:
    """The bootstrap interval of `metric` around its window figure `point`.

    per_request holds the window's successful requests: 'ttft', 'tpot', 'e2e' (ms, NaN where undefined),
    'output' (completion tokens), 'good' (1.0 for a good request, else 0.0)."""
    if isinstance(point, NotObserved):
        return NotObserved(reason=f"{metric} not observed: {point.reason}")
    m = _metric(metric)
    if m.sample is None:
        return NotObserved(reason=f"{metric}: {m.figure} has no per-request sample to resample")
    rng = np.random.default_rng(SEED)
    if m.kind == "percentile":
        name, q = m.sample, m.quantile
        x = per_request[name]
        x = x[~np.isnan(x)]
        if x.size < 2:
            return NotObserved(reason=f"{x.size} value(s) of {name}: too few to resample")
        b = resamples(x.size)
        stats = np.concatenate(
            [np.percentile(x[rng.integers(0, x.size, (k, x.size))], q, axis=1) for k in _blocks(b, x.size)]
        )
        return _quantiles(stats, point, metric, int(x.size), b)
    w = np.ones_like(per_request["e2e"]) if m.sample == "request" else per_request[m.sample]
    d = per_request["e2e"]
    if w.size < 2 or np.isnan(w).any() or np.isnan(d).any():
        return NotObserved(reason=f"{w.size} request(s) with known counts and durations: too few to resample")
    total, busy = float(w.sum()), float(d.sum())
    b = resamples(w.size)
    if total == 0 or busy <= 0:
        stats = np.zeros(b)
    else:
        # a rate varies with what the requests carry AND with how long they took: at a held concurrency the
        # window lasts about sum(E2E) / C, so each resample scales the window's figure by its share of the
        # counted sum over its share of the summed durations (fixed-length outputs still vary in time)
        blocks = []
        for k in _blocks(b, w.size):
            idx = rng.integers(0, w.size, (k, w.size))
            blocks.append(w[idx].sum(axis=1) / total / (d[idx].sum(axis=1) / busy) * point)
        stats = np.concatenate(blocks)
    return _quantiles(stats, point, metric, int(w.size), b)


def _blocks(b: int, n: int) -> list[int]:
    per = max(1, _WORK // max(n, 1))
    return [min(per, b - i) for i in range(0, b, per)]


def pooled(metric: str, runs: list[dict[str, F64]]) -> Interval | NotObserved:
    """A percentile of the requests of several runs pooled, with a bootstrap interval that resamples runs and
    then requests within each drawn run (a two-stage bootstrap: run-to-run spread and the requests' own both
    widen it). metric: a percentile ('tpot_p99'); runs: each run's per-request samples (as `interval`)."""
    entry = _metric(metric)
    if entry.kind != "percentile" or entry.sample is None:
        return NotObserved(reason=f"{metric} is not a per-request percentile: nothing to pool")
    name, q = entry.sample, entry.quantile
    xs = [x[~np.isnan(x)] for r in runs if (x := r.get(name)) is not None]
    xs = [x for x in xs if x.size]
    n = sum(x.size for x in xs)
    if n < 2:
        return NotObserved(reason=f"{n} value(s) of {name} over {len(xs)} run(s): too few to resample")
    point = float(np.percentile(np.concatenate(xs), q))
    rng = np.random.default_rng(SEED)
    k, width = len(xs), max(x.size for x in xs)
    table = np.full((k, width), np.nan)  # one row per run, padded
    for i, x in enumerate(xs):
        table[i, : x.size] = x
    sizes = np.array([x.size for x in xs])
    b = resamples(n)
    blocks = []
    for m in _blocks(b, k * width):
        drawn = rng.integers(0, k, (m, k))  # the runs of each resample
        size = sizes[drawn][..., None]  # a drawn run contributes as many requests as it has
        pick = (rng.random((m, k, width)) * size).astype(np.int64)
        vals = table[drawn[..., None], pick]
        vals[np.arange(width) >= size] = np.nan
        blocks.append(row_percentile(vals.reshape(m, k * width), q))
    return _quantiles(np.concatenate(blocks), point, metric, n, b)


def row_percentile(v: F64, q: float) -> F64:
    """np.nanpercentile(v, q, axis=1), bit for bit (its 'linear' method), where each row's NaNs are padding:
    numpy computes a row with a NaN in a Python loop of its own (~60 ms for 1000 resamples); this sorts once."""
    s = np.sort(v, axis=1)  # NaNs last
    n = (~np.isnan(v)).sum(axis=1)
    virtual = (n - 1) * (q / 100)
    below = np.floor(virtual)
    top = virtual >= n - 1  # at or past the last value: the last value (numpy's rule)
    lo = np.where(top, n - 1, below).astype(np.intp)
    hi = np.where(top, n - 1, below + 1).astype(np.intp)
    rows = np.arange(v.shape[0])
    a, b = s[rows, lo], s[rows, hi]
    t = virtual - below
    d = b - a
    out: F64 = a + d * t
    np.subtract(b, d * (1 - t), out=out, where=t >= 0.5)  # numpy's lerp, the same rounding
    return out
