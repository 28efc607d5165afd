"""Generating a dataset's entries (one per request) with exact token counts, and its identity.

The sources' bodies: synthetic and prefix_cache in datasets/constructed.py, file and trace in datasets/sources.py;
the word tables they draw from in datasets/words.py, the tokenizer interface in datasets/counting.py, the
entries file in datasets/entries.py, multi-turn numbering in datasets/sessions.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path

from caseledger.case.dataset import Dataset, LengthDistribution
from caseledger.case.model import Case
from caseledger.datasets import lengths as _lengths
from caseledger.datasets import trace as _trace
from caseledger.datasets.constructed import generate_constructed, meets, pct_floor, target_ratio
from caseledger.datasets.counting import Tok, open_tokenizer, tokenizer_info, tokenizer_path
from caseledger.datasets.entries import Acc
from caseledger.datasets.identity import (
    ENTRIES_FILE,
    GENERATOR_VERSION,
    HIT_RATIO_DENOMINATOR,
    IDENTITY_FILE,
    BelowTarget,
    DatasetIdentity,
    IntStats,
    Lengths,
    RatioStats,
)
from caseledger.datasets.sessions import annotate_sessions, session_turns
from caseledger.datasets.sources import generate_file, generate_trace, read_prompts, trace_info
from caseledger.workspace import Workspace, sha256_file, write_json

_BELOW_FIRST = 8


@dataclass(frozen=True)
class Inputs:
    """What a dataset is generated from, read and checked before anything is written."""

    tok: Tok
    rows: list[tuple[str, int]] | None = None  # source 'file': (prompt, output_tokens)
    source_sha256: str | None = None
    trace: _trace.Trace | None = None  # source 'trace'


def read_inputs(ws: Workspace, case: Case) -> Inputs:
    """The prompts file and the tokenizer, checked without writing anything (a refused freeze writes nothing)."""
    ds = case.dataset
    chat = ds.chat_template and case.target.api == "chat"
    if ds.source == "file":
        rows, source_sha256 = read_prompts(ws, ds)  # a short or broken file fails before any tokenizer
        return Inputs(open_tokenizer(tokenizer_path(ws, ds.tokenizer), chat), rows, source_sha256)
    if ds.source == "trace":
        tr = _trace.read(ws, case)  # a broken trace fails before any tokenizer
        return Inputs(open_tokenizer(tokenizer_path(ws, ds.tokenizer), chat), None, tr.sha256, tr)
    for side in ("input_tokens", "output_tokens"):
        if isinstance(d := getattr(ds, side), LengthDistribution):
            _lengths.check(d, f"dataset.{side}")
    if ds.sessions is not None:
        session_turns(case)  # a total of turns other than N fails before any tokenizer
    return Inputs(open_tokenizer(tokenizer_path(ws, ds.tokenizer), chat))


def _realized(source: str, declared: int | LengthDistribution, lengths: list[int], trace_field: str) -> Lengths:
    """Realized lengths of one side, beside what declared them (a distribution, a value, or the file's rows)."""
    words: dict[str, str] | None = None
    if source == "trace":
        words = {"trace": trace_field}
    elif source == "file":
        words = {"file": "prompts as written" if trace_field == "input_length" else "output_tokens"}
    return _lengths.summary(
        declared if isinstance(declared, LengthDistribution) else None,
        lengths,
        declared if isinstance(declared, int) else None,
        words,
    )


def _int_stats(xs: list[int]) -> IntStats:
    return IntStats(min=min(xs), max=max(xs), mean=sum(xs) / len(xs))


def _below(acc: Acc, target: Fraction, ds: Dataset) -> BelowTarget:
    idx = [i for i, (c, t) in enumerate(zip(acc.cached, acc.chat, strict=True)) if not meets(c, t, target)]
    if not idx or target == 0:
        return BelowTarget(count=0, first=[], message=None)
    best = max(idx, key=lambda i: Fraction(acc.cached[i], acc.chat[i]) if acc.chat[i] else Fraction(0))
    if ds.source == "prefix_cache":
        why = (
            "whole cache blocks of the shared prefix cannot reach it; raise dataset.input_tokens, or lower "
            "dataset.block_size or dataset.prefix_ratio"
        )
    else:
        why = (
            f"a {ds.source} dataset shares only the chat-template head by construction; use source "
            "'prefix_cache' for a cache target, or set dataset.prefix_ratio 0"
        )
    return BelowTarget(
        count=len(idx),
        first=idx[:_BELOW_FIRST],
        message=(
            f"{len(idx)} of {len(acc.chat)} entries expect a hit ratio below the target {float(target)}; "
            f"best of them {pct_floor(acc.cached[best], acc.chat[best])} ({acc.cached[best]} cached of "
            f"{acc.chat[best]} {HIT_RATIO_DENOMINATOR}, block {ds.block_size}, source {ds.source}): {why}"
        ),
    )


def generate_dataset(
    ws: Workspace, case: Case, dataset_id: str, tmp: Path, inputs: Inputs | None = None
) -> DatasetIdentity:
    t0 = time.perf_counter()
    ds = case.dataset
    api = case.target.api
    chat = ds.chat_template and api == "chat"
    entries_path = tmp / ENTRIES_FILE
    inputs = inputs or read_inputs(ws, case)
    if inputs.rows is not None and inputs.source_sha256 is not None:
        res = generate_file(inputs.rows, inputs.source_sha256, ds, inputs.tok, entries_path)
    elif inputs.trace is not None:
        res = generate_trace(inputs.trace, ds, inputs.tok, tokenizer_path(ws, ds.tokenizer), entries_path)
    else:
        res = generate_constructed(ds, inputs.tok, tokenizer_path(ws, ds.tokenizer), entries_path)
    sessions = annotate_sessions(case, entries_path) if ds.sessions is not None else None
    acc = res.acc
    ratios = [c / t if t else 0.0 for c, t in zip(acc.cached, acc.chat, strict=True)]
    target = target_ratio(ds.prefix_ratio)
    identity = DatasetIdentity(
        dataset_id=dataset_id,
        content_sha256=sha256_file(entries_path),
        source=ds.source,
        source_sha256=res.source_sha256,
        spec=ds.model_dump(mode="json"),
        api=api,
        generator=GENERATOR_VERSION,
        tokenizer=tokenizer_info(ds.tokenizer, ds.tokenizer_revision, tokenizer_path(ws, ds.tokenizer)),
        chat_template_counted=chat,
        entries=len(acc.body),
        output_tokens=max(acc.out),
        body_tokens=_int_stats(acc.body),
        chat_tokens=_int_stats(acc.chat),
        expected_cached_tokens=_int_stats(acc.cached),
        expected_hit_ratio=RatioStats(min=min(ratios), max=max(ratios), mean=sum(ratios) / len(ratios)),
        hit_ratio_denominator=HIT_RATIO_DENOMINATOR,
        block_size=ds.block_size,
        prefix_ratio_target=ds.prefix_ratio,
        below_target=_below(acc, target, ds),
        salt=res.salt,
        counting=res.counting,
        generated_at=datetime.now(UTC),
        generation_seconds=round(time.perf_counter() - t0, 3),
        input_lengths=_realized(ds.source, ds.input_tokens, acc.body, "input_length"),
        output_lengths=_realized(ds.source, ds.output_tokens, acc.out, "output_length"),
        trace=trace_info(inputs.trace, ds, acc, entries_path) if inputs.trace is not None else None,
        sessions=sessions,
    )
    write_json(tmp / IDENTITY_FILE, identity.model_dump(mode="json"))
    return identity
