"""Length distributions: a dataset's input and output lengths drawn once, seeded, stable across versions.

A declared distribution (case.dataset.LengthDistribution) is sampled by inverse transform: uniforms from
SHAKE-256 of (seed, side, index) — the same bytes on every Python and numpy — mapped through the CDF of
the distribution truncated to [min - 0.5, max + 0.5) and rounded, so every length is an integer in
[min, max] and P(length = k) is exactly the declared mass of [k - 0.5, k + 0.5) renormalised. `cdf` gives
that discrete CDF, which is what a goodness-of-fit test compares the realized lengths with.
"""

from __future__ import annotations

import hashlib
import math
from statistics import NormalDist
from typing import Any

import numpy as np

from caseledger.case.dataset import LengthDistribution
from caseledger.datasets.identity import LengthHistogram, Lengths
from caseledger.errors import CaseInvalid

MIN_MASS = 1e-9  # a distribution with less of its mass inside [min, max] is a typo (mean far outside the bounds)
HISTOGRAM_BINS = 16


def _uniforms(key: str, n: int) -> list[float]:
    """n uniforms in (0, 1) from SHAKE-256 of the key (53 bits each, never 0 or 1)."""
    raw = hashlib.shake_256(key.encode()).digest(8 * n)
    ints = np.frombuffer(raw, dtype=">u8") >> np.uint64(11)
    out: list[float] = ((ints.astype(np.float64) + 0.5) / float(1 << 53)).tolist()
    return out


def _base(d: LengthDistribution) -> tuple[NormalDist, bool]:
    """The underlying normal of a normal or lognormal distribution (of log-length for lognormal), and whether
    lengths are its exponential. Lognormal mean/stdev are of the length itself, as written."""
    assert d.mean is not None and d.stdev is not None
    if d.distribution == "normal":
        return NormalDist(d.mean, d.stdev), False
    s2 = math.log1p((d.stdev / d.mean) ** 2)
    return NormalDist(math.log(d.mean) - s2 / 2, math.sqrt(s2)), True


def _bounds(d: LengthDistribution) -> tuple[float, float]:
    return d.min - 0.5, d.max + 0.5


def _cont_cdf(d: LengthDistribution, x: float) -> float:
    nd, log = _base(d)
    if log:
        return 0.0 if x <= 0 else nd.cdf(math.log(x))
    return nd.cdf(x)


def cdf(d: LengthDistribution, k: float) -> float:
    """P(length <= k) of the declared distribution as it is sampled (truncated to [min, max], rounded)."""
    if d.distribution == "fixed":
        return 1.0 if k >= (d.value or 0) else 0.0
    if k < d.min:
        return 0.0
    if k >= d.max:
        return 1.0
    k = math.floor(k)
    if d.distribution == "uniform":
        return (k - d.min + 1) / (d.max - d.min + 1)
    lo, hi = _bounds(d)
    a, b = _cont_cdf(d, lo), _cont_cdf(d, hi)
    return (_cont_cdf(d, k + 0.5) - a) / (b - a)


def check(d: LengthDistribution, field: str) -> None:
    """Refuse a distribution that puts (almost) none of its mass inside [min, max]."""
    if d.distribution in ("fixed", "uniform"):
        return
    lo, hi = _bounds(d)
    mass = _cont_cdf(d, hi) - _cont_cdf(d, lo)
    if not mass > MIN_MASS:
        raise CaseInvalid(
            f"{field}: a {d.distribution} distribution with mean {d.mean:g} and stdev {d.stdev:g} puts {mass:.1e} "
            f"of its mass inside [min {d.min}, max {d.max}]",
            f"move {field}.mean inside [min, max], or widen min/max or stdev",
        )


def sample(d: LengthDistribution, n: int, seed: int, side: str) -> list[int]:
    """n lengths of the declared distribution, the same for the same (distribution, seed, side)."""
    if d.distribution == "fixed":
        assert d.value is not None
        return [d.value] * n
    us = _uniforms(f"caseledger/lengths/{side}/{seed}", n)
    if d.distribution == "uniform":
        span = d.max - d.min + 1
        return [min(d.max, d.min + int(u * span)) for u in us]
    nd, log = _base(d)
    lo, hi = _bounds(d)
    a, b = _cont_cdf(d, lo), _cont_cdf(d, hi)
    out = []
    for u in us:
        p = min(max(a + u * (b - a), 1e-300), 1 - 1e-16)
        x = nd.inv_cdf(p)
        x = math.exp(x) if log else x
        out.append(min(d.max, max(d.min, round(x))))
    return out


def summary(
    d: LengthDistribution | None,
    lengths: list[int],
    fixed: int | None = None,
    declared: dict[str, Any] | None = None,  # JSON: the source's own words when no distribution declared them
) -> Lengths:
    """What was declared and what was realized: stats, percentiles, a histogram and the lengths' sha256."""
    arr = np.asarray(lengths, dtype=np.float64)
    lo, hi = int(arr.min()), int(arr.max())
    bins = min(HISTOGRAM_BINS, hi - lo + 1)
    counts, edges = np.histogram(arr, bins=bins, range=(lo, hi + 1))
    if declared is None:
        declared = (
            d.model_dump(mode="json", exclude_none=True) if d is not None else {"distribution": "fixed", "value": fixed}
        )
    return Lengths(
        declared=declared,
        count=len(lengths),
        min=lo,
        max=hi,
        mean=float(arr.mean()),
        stdev=float(arr.std()),
        p50=float(np.percentile(arr, 50)),
        p90=float(np.percentile(arr, 90)),
        p99=float(np.percentile(arr, 99)),
        histogram=LengthHistogram(edges=[float(e) for e in edges], counts=[int(c) for c in counts]),
        sha256=hashlib.sha256(",".join(map(str, lengths)).encode()).hexdigest(),
    )
