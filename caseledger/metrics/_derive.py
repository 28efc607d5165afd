"""Per-request and per-chunk figures of all requests (TTFT, E2E, TPOT, ITL gaps), computed once. Pure."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from caseledger.metrics._columns import F64, I64, B, RawColumns

_MS = 1e6  # ns per ms


@dataclass(frozen=True)
class Derived:
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


def derive(c: RawColumns) -> Derived:
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
    return Derived(
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
