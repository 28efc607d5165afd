"""Figure building blocks: a distribution, a rate over a window, a known sum, token agreement. Pure."""

from __future__ import annotations

import numpy as np

from caseledger.metrics._columns import F64
from caseledger.metrics._models import Distribution, NotObserved, Throughput, TokenAgreement


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.4f}"


def agreement(server: F64, planned: F64, nothing: str) -> TokenAgreement | NotObserved:
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


def distribution(x: F64, unit: str, empty_reason: str) -> Distribution | NotObserved:
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


def rate(numerator: float | str, duration_s: float, cards: int, unit: str, what: str) -> Throughput | NotObserved:
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


def sum_known(x: F64, what: str) -> float | str:
    """Sum of a per-request column, or the reason it is unknown (any missing value makes it unknown)."""
    if x.size == 0:
        return f"no successful request credited to the window: no {what}"
    missing = int(np.isnan(x).sum())
    if missing:
        return f"{missing} of {x.size} credited successful requests lack {what}"
    return float(x.sum())
