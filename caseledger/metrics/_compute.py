"""Pure computation: raw columns + case -> Result. No I/O; vectorized with numpy.

Per-request figures are computed once for all requests (NaN where undefined); a window is a boolean
mask over requests (and, for the sglang rule, over chunks), and every figure of a window is computed
from that window's mask and duration only.

The parts: per-request figures in _derive, concurrency and window spans in _spans, one window's figures
in _window (built from _stats), stalls and host CPU in _evidence.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np

from caseledger.case.model import Case, max_tokens_bound
from caseledger.metrics._checks import Validity, check_counts
from caseledger.metrics._columns import F64, I64, RawColumns, RawSource, columns_from_records
from caseledger.metrics._definitions import DEFINITIONS
from caseledger.metrics._derive import derive
from caseledger.metrics._evidence import Evidence, host_load, samples_in
from caseledger.metrics._models import PROCESSOR_VERSION
from caseledger.metrics._params import params_key, resolve_params
from caseledger.metrics._result import (
    Failures,
    Inputs,
    Params,
    Result,
    Schedule,
    Stall,
    TraceReplay,
    TraceRequest,
    Windows,
)
from caseledger.metrics._sessions import conversations
from caseledger.metrics._spans import concurrency_series, concurrency_steps, window_spans
from caseledger.metrics._spec import SpecCounters, spec_counters
from caseledger.metrics._stats import distribution, sum_known
from caseledger.metrics._window import WindowInputs, compute_window
from caseledger.records import RawRecord
from caseledger.workspace import canonical_json, sha256_bytes

_S = 1e9  # ns per s


def _sha_text(text: str | None) -> str | None:
    return None if text is None else sha256_bytes(text.encode())


def per_request_ms(columns: RawColumns) -> dict[str, F64]:
    """Per-request TTFT, TPOT and E2E (ms) of the successful requests, for CDF plots (NaN where undefined)."""
    dv = derive(columns)
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
    dist = distribution(ms, "ms", "no request carried its due time")
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
    anchor: dict[str, Any] | None = None,  # JSON: load/anchor.json as read
    metrics_before: str | None = None,
    metrics_after: str | None = None,
    rule: str | None = None,
    ratio: float | None = None,
    *,
    source: RawSource | None = None,
    stalls: Iterable[dict[str, Any]] = (),  # JSON: load/stalls.jsonl lines
    host: Iterable[dict[str, Any]] = (),  # JSON: load/host.jsonl lines
    accel: Iterable[dict[str, Any]] = (),  # JSON: load/accel.jsonl lines
    chunks_are_content: bool = True,
) -> Result:
    """Every figure of both windows from raw records; pure (same inputs -> equal Result).

    rule/ratio override case.measurement.native; metrics_before/after are /metrics texts; source names the
    raw file and its sha256 (None: records passed in memory); stalls, host and accel are the lines of
    load/stalls.jsonl ({start_ns, end_ns}), load/host.jsonl (CPU samples) and load/accel.jsonl (accelerator
    samples); chunks_are_content False for imported records whose chunk times are every SSE line.
    """
    raw = records if isinstance(records, RawColumns) else columns_from_records(records)
    src = source or RawSource()
    params = resolve_params(case, rule, ratio)
    s = concurrency_steps(raw)  # concurrency counts every request, valid or not
    notes = _source_notes(src, raw.n)
    validity = _validity(case, raw, params, metrics_before, metrics_after, chunks_are_content)
    c = dataclasses.replace(raw, ok=raw.ok & ~validity.invalid)
    dv = derive(c)
    stall_spans = sorted((int(x["start_ns"]), int(x["end_ns"])) for x in stalls)
    host_samples = list(host)
    ev = Evidence(invalid=validity.invalid, stalls=stall_spans, host=host_samples, accel=list(accel))

    spec = _spec_of(c, params, metrics_before, metrics_after)
    whole_span, native_span = window_spans(c, s, case, params)
    inp = WindowInputs(c=c, dv=dv, s=s, case=case, anchor=anchor, spec=spec, ev=ev)
    windows = Windows(
        whole=compute_window("whole", whole_span, case.measurement.whole, inp),
        native=compute_window("native", native_span, case.measurement.native, inp),
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
        concurrency=concurrency_series(s, dv.t0),
        windows=windows,
        checks=validity.summary,
        stalls=[Stall(start_s=(a - dv.t0) / _S, duration_s=(b - a) / _S) for a, b in stall_spans],
        host=host_load(
            samples_in(host_samples, whole_span.start, whole_span.end)
            if whole_span.start is not None and whole_span.end is not None
            else []
        ),
        schedule=_schedule(raw),
        trace=_trace(raw),
        sessions=conversations(c, dv.ttft_ms, distribution),
    )


def _spec_of(c: RawColumns, params: Params, metrics_before: str | None, metrics_after: str | None) -> SpecCounters:
    """Speculative decoding from the server's counters, over the output tokens of the whole window's successful
    requests."""
    out_sum = sum_known(c.completion_tokens[c.ok], "usage.completion_tokens")
    return spec_counters(
        params.spec_decode,
        metrics_before,
        metrics_after,
        None if isinstance(out_sum, str) else out_sum,
        out_sum if isinstance(out_sum, str) else "",
    )


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
    anchor: dict[str, Any] | None,  # JSON: only its str and int values are kept
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
