"""The server's counts as evidence to check, per request, and against its own counters. Pure; no I/O.

A successful request is *invalid* when its usage contradicts what the client asked for or saw
(DEFINITIONS['count_checks'] states the rules): invalid requests are excluded from every figure like
failed ones, counted per reason, and a window with more of them than
case.measurement.evidence.max_invalid_share has no figures at all.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from caseledger import engines
from caseledger.metrics._columns import B, RawColumns
from caseledger.metrics._result import CounterCheck, RequestChecks
from caseledger.metrics._spec import parse_prometheus

# Content chunks carry at least one token each. Without speculative decoding a chunk carries one token, or a
# few when the engine holds back the byte tokens of one character until it is whole (UTF-8: up to 4 bytes).
TOKENS_PER_CHUNK_MAX = 4
EXAMPLES = 5  # invalid requests named in the result, first by plan index

# Generated-token counters of each engine family (Δ over the formal load vs the per-request sum)
GENERATION_COUNTERS = engines.names("generation_tokens")  # every engine's counter of generated tokens


@dataclass(frozen=True)
class Validity:
    """Per request: whether its counts failed a check (successful requests only), and the first failed rule."""

    invalid: B
    reasons: list[str | None]
    summary: RequestChecks


def _first(reasons: list[str | None], i: int, text: str) -> None:
    if reasons[i] is None:
        reasons[i] = text


def check_counts(
    c: RawColumns,
    max_tokens: int | None,
    spec_without_counts: bool,
    max_invalid_share: float,
    metrics_before: str | None,
    metrics_after: str | None,
    chunks_are_content: bool = True,
) -> Validity:
    """Every successful request's usage checked against max_tokens, its streamed chunks and its prompt.

    spec_without_counts: the server decodes speculatively (its counters moved) but reports no per-request draft
    counts, so a chunk may carry any number of tokens and the per-chunk upper bound is not applied. Where every
    content chunk's token count was streamed (continuous usage) those counts bound it instead.
    chunks_are_content: False for imported records whose chunk times are every SSE line (AISBench), where the
    chunk rules do not apply."""
    n = c.n
    out = c.completion_tokens
    prompt = c.prompt_tokens
    cached = c.cached_tokens
    accepted = np.nan_to_num(c.spec_accepted_tokens, nan=0.0)
    has_out = c.ok & ~np.isnan(out)
    rules: list[tuple[str, B]] = []
    with np.errstate(invalid="ignore"):
        rules.append(("completion_tokens < 0", has_out & (out < 0)))
        rules.extend(_over_asked(c, max_tokens, has_out))
        if chunks_are_content:
            rules.append(("completion_tokens < content chunks", has_out & (out < c.n_chunks)))
            req = np.repeat(np.arange(n), c.n_chunks)
            unknown = np.bincount(req, weights=np.isnan(c.chunk_tokens).astype(np.float64), minlength=n)
            streamed = np.bincount(req, weights=np.nan_to_num(c.chunk_tokens, nan=0.0), minlength=n)
            known = (c.n_chunks > 0) & (unknown == 0)
            rules.append(
                ("completion_tokens < the token counts streamed with its chunks", has_out & known & (out < streamed))
            )
            if not spec_without_counts:
                bound = c.n_chunks * TOKENS_PER_CHUNK_MAX + accepted + 1
                rules.append(
                    (
                        f"completion_tokens > {TOKENS_PER_CHUNK_MAX} x content chunks (+ accepted drafts + 1)",
                        has_out & (c.n_chunks > 0) & ~known & (out > bound),
                    )
                )
        has_prompt = c.ok & ~np.isnan(prompt)
        rules.append(("prompt_tokens <= 0", has_prompt & (prompt <= 0)))
        has_cached = c.ok & ~np.isnan(cached)
        rules.append(("cached_tokens < 0", has_cached & (cached < 0)))
        rules.append(("cached_tokens > prompt_tokens", has_cached & has_prompt & (cached > prompt)))
    invalid = np.zeros(n, dtype=np.bool_)
    reasons: list[str | None] = [None] * n
    by_reason: Counter[str] = Counter()
    for text, hit in rules:
        for i in np.flatnonzero(hit):
            _first(reasons, int(i), text)
        by_reason.update({text: int(hit.sum())} if hit.any() else {})
        invalid |= hit
    examples = [f"request {i}: {reasons[i]} ({_counts(c, int(i))})" for i in np.flatnonzero(invalid)[:EXAMPLES]]
    summary = RequestChecks(
        checked=int(c.ok.sum()),
        invalid=int(invalid.sum()),
        by_reason=dict(sorted(by_reason.items())),
        examples=examples,
        max_invalid_share=max_invalid_share,
        counters=_counter_checks(c, metrics_before, metrics_after),
    )
    return Validity(invalid=invalid, reasons=reasons, summary=summary)


def _over_asked(c: RawColumns, bound: int | None, has_out: B) -> list[tuple[str, B]]:
    """completion_tokens above what the request asked: its record's own max_tokens, else the case's bound (records
    written before it was kept, imported ones). One rule per asked value, so the reason names the number."""
    n = c.n
    asked = np.full(n, np.nan) if c.max_tokens is None else c.max_tokens
    if bound is not None:
        asked = np.where(np.isnan(asked), float(bound), asked)
    over = has_out & ~np.isnan(asked) & (c.completion_tokens > asked)
    return [(f"completion_tokens > max_tokens {int(v)}", over & (asked == v)) for v in np.unique(asked[over])]


def _counts(c: RawColumns, i: int) -> str:
    def num(x: float) -> str:
        return "null" if np.isnan(x) else str(int(x))

    return (
        f"completion {num(float(c.completion_tokens[i]))}, chunks {int(c.n_chunks[i])}, prompt "
        f"{num(float(c.prompt_tokens[i]))}, cached {num(float(c.cached_tokens[i]))}"
    )


def _counter_checks(c: RawColumns, before: str | None, after: str | None) -> list[CounterCheck]:
    """Δ of the server's generated-token counter over the formal load against the sum of every request's
    usage.completion_tokens (failed requests' partial output is in the counter too: a disagreement is shown,
    never used to correct a figure)."""
    if before is None or after is None:
        return []
    b, a = parse_prometheus(before), parse_prometheus(after)
    out = []
    total = float(np.nansum(c.completion_tokens))
    for name in GENERATION_COUNTERS:
        if name in a and name in b:
            delta = a[name] - b[name]
            agrees = delta == total
            text = f"Δ {name} = {delta:g}, sum of usage.completion_tokens = {total:g}" + (
                "" if agrees else f": they differ by {delta - total:+g}"
            )
            out.append(CounterCheck(counter=name, delta=delta, per_request_sum=total, agrees=agrees, text=text))
    return out
