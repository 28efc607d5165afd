"""Raw records as columns: one numpy array per field, chunks flattened with offsets.

The raw file is read in blocks (hashing exactly the bytes that are parsed) and parsed in batches of
8192 records, one orjson call and one list comprehension per field each, so a million records never
exist as a million dicts at once. A torn last line is tolerated, exactly as `read_records` does.
"""

from __future__ import annotations

import gc
import hashlib
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from caseledger.records import RawRecord

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class RawSource:
    """Where records came from: the file's sha256 and what reading tolerated."""

    path: str = "load/raw.jsonl"
    sha256: str | None = None
    torn_tail: bool = False
    bad_lines: int = 0


@dataclass(frozen=True)
class RawColumns:
    """Columnar raw records. Token fields are float64 with NaN where the record had null."""

    send_ns: I64
    end_ns: I64
    ok: B
    error_class: list[str | None]
    error: list[str | None]
    prompt_tokens: F64
    completion_tokens: F64
    cached_tokens: F64
    input_tokens_body: F64
    input_tokens_chat: F64
    n_chunks: I64
    chunk_ns: I64  # all content chunks, request after request
    chunk_tokens: F64  # tokens per chunk, NaN where unknown
    spec_draft_tokens: F64  # per request: draft tokens proposed (timings.draft_n), NaN where not reported
    spec_accepted_tokens: F64  # per request: draft tokens accepted, NaN where not reported
    steps_known: B  # per request: the record carried its verify steps (spec_steps)
    n_steps: I64  # per request: verify steps recorded (0 where unknown)
    step_drafted: I64  # all verify steps, request after request: draft tokens of the step
    step_accepted: I64  # ... and accepted tokens of the step
    arrival_error_ns: F64  # per request: send_ns - sched_ns (scheduled loads), NaN where the record has no sched_ns
    trace_row: F64  # per request: its trace row (source 'trace'), NaN elsewhere
    planned_shared_tokens: F64  # per request: chat tokens an earlier request planned to share (trace), NaN elsewhere
    # dataset.sessions: per request its conversation, turn index and the conversation's planned turns; NaN elsewhere
    session: F64 | None = None
    turn: F64 | None = None
    turns: F64 | None = None
    max_tokens: F64 | None = None  # per request: the max_tokens its body asked for, NaN where the record does not say

    @property
    def n(self) -> int:
        return int(self.send_ns.shape[0])

    @property
    def offsets(self) -> I64:
        """offsets[i]:offsets[i+1] are request i's chunks."""
        out = np.zeros(self.n + 1, dtype=np.int64)
        np.cumsum(self.n_chunks, out=out[1:])
        return out

    def digest(self) -> str:
        """sha256 over the column bytes: identifies the records independent of the file's layout."""
        h = hashlib.sha256()
        for arr in (
            self.send_ns,
            self.end_ns,
            self.ok,
            self.prompt_tokens,
            self.completion_tokens,
            self.cached_tokens,
            self.input_tokens_body,
            self.input_tokens_chat,
            self.n_chunks,
            self.chunk_ns,
            self.chunk_tokens,
            self.spec_draft_tokens,
            self.spec_accepted_tokens,
            self.steps_known,
            self.n_steps,
            self.step_drafted,
            self.step_accepted,
        ):
            h.update(np.ascontiguousarray(arr).tobytes())
        for opt in (
            self.arrival_error_ns,
            self.trace_row,
            self.planned_shared_tokens,
            self.session,
            self.turn,
            self.turns,
            self.max_tokens,
        ):
            if opt is not None and not np.isnan(opt).all():  # records without them keep the digest they had
                h.update(np.ascontiguousarray(opt).tobytes())
        h.update(orjson.dumps([self.error_class, self.error]))
        return h.hexdigest()


class _Builder:
    """Accumulates batches of parsed records as numpy column pieces (no per-record Python objects kept)."""

    def __init__(self) -> None:
        self.parts: list[RawColumns] = []

    def add_batch(self, docs: list[dict[str, Any]]) -> None:  # JSON: raw.jsonl lines
        if not docs:
            return
        n = len(docs)
        try:  # one C-level pass; records from the load client carry every key
            cols: list[tuple[Any, ...]] = list(zip(*map(_FIELDS, docs), strict=True))
        except KeyError:  # hand-made or foreign records: missing keys read as null
            cols = [tuple(d.get(k) for d in docs) for k in _KEYS]
        send, end, ok_raw, prompt, completion, cached, body, chat, chunk_lists, tok_lists = cols
        ok = np.array(ok_raw, dtype=np.bool_)
        error_class: list[str | None] = [None] * n
        error: list[str | None] = [None] * n
        for i in np.flatnonzero(~ok).tolist():  # text is kept only for failures
            error_class[i] = docs[i].get("error_class")
            error[i] = docs[i].get("error")
        spec = _spec_columns(docs) | _workload_columns(docs)
        chunk_lists = tuple(c or () for c in chunk_lists)
        tok_lists = tuple(t or () for t in tok_lists)
        nch = np.fromiter(map(len, chunk_lists), dtype=np.int64, count=n)
        m = int(nch.sum())
        chunk = np.fromiter(chain.from_iterable(chunk_lists), dtype=np.int64, count=m)
        ntok = np.fromiter(map(len, tok_lists), dtype=np.int64, count=n)
        if not np.array_equal(ntok, nch):  # a list that does not match its chunks: token counts unknown
            tok_lists = tuple(
                t if len(t) == len(c) else (None,) * len(c) for t, c in zip(tok_lists, chunk_lists, strict=True)
            )
        self.parts.append(
            RawColumns(
                send_ns=np.array(send, dtype=np.int64),
                end_ns=np.array(end, dtype=np.int64),
                ok=ok,
                error_class=error_class,
                error=error,
                prompt_tokens=_floats(prompt, n),
                completion_tokens=_floats(completion, n),
                cached_tokens=_floats(cached, n),
                input_tokens_body=_floats(body, n),
                input_tokens_chat=_floats(chat, n),
                n_chunks=nch,
                chunk_ns=chunk,
                chunk_tokens=_floats(list(chain.from_iterable(tok_lists)), m),
                **spec,
            )
        )

    def build(self) -> RawColumns:
        if not self.parts:
            self.parts.append(_empty())
        if len(self.parts) == 1:
            return self.parts[0]
        ps = self.parts

        def cat(name: str) -> Any:
            return np.concatenate([getattr(p, name) for p in ps])

        return RawColumns(
            send_ns=cat("send_ns"),
            end_ns=cat("end_ns"),
            ok=cat("ok"),
            error_class=[x for p in ps for x in p.error_class],
            error=[x for p in ps for x in p.error],
            prompt_tokens=cat("prompt_tokens"),
            completion_tokens=cat("completion_tokens"),
            cached_tokens=cat("cached_tokens"),
            input_tokens_body=cat("input_tokens_body"),
            input_tokens_chat=cat("input_tokens_chat"),
            n_chunks=cat("n_chunks"),
            chunk_ns=cat("chunk_ns"),
            chunk_tokens=cat("chunk_tokens"),
            spec_draft_tokens=cat("spec_draft_tokens"),
            spec_accepted_tokens=cat("spec_accepted_tokens"),
            steps_known=cat("steps_known"),
            n_steps=cat("n_steps"),
            step_drafted=cat("step_drafted"),
            step_accepted=cat("step_accepted"),
            arrival_error_ns=cat("arrival_error_ns"),
            trace_row=cat("trace_row"),
            planned_shared_tokens=cat("planned_shared_tokens"),
            **{k: np.concatenate([_nan_if_none(getattr(p, k), p.n) for p in ps]) for k in _OPTIONAL_KEYS},
        )


_KEYS = (
    "send_ns",
    "end_ns",
    "ok",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "input_tokens_body",
    "input_tokens_chat",
    "chunk_ns",
    "chunk_tokens",
)
_FIELDS = itemgetter(*_KEYS)


# JSON: raw.jsonl lines in; RawColumns arrays by field name out
def _spec_columns(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The optional speculative-decoding fields (records written before they existed lack them)."""
    n = len(docs)
    steps = [d.get("spec_steps") for d in docs]
    pairs = list(chain.from_iterable(x for x in steps if x))
    flat = np.array(pairs, dtype=np.int64).reshape(-1, 2) if pairs else np.zeros((0, 2), dtype=np.int64)
    return {
        "spec_draft_tokens": _floats([d.get("spec_draft_tokens") for d in docs], n),
        "spec_accepted_tokens": _floats([d.get("spec_accepted_tokens") for d in docs], n),
        "steps_known": np.fromiter((x is not None for x in steps), dtype=np.bool_, count=n),
        "n_steps": np.fromiter((len(x) if x else 0 for x in steps), dtype=np.int64, count=n),
        "step_drafted": np.ascontiguousarray(flat[:, 0]),
        "step_accepted": np.ascontiguousarray(flat[:, 1]),
    }


# JSON: raw.jsonl lines in; RawColumns arrays by field name out
def _workload_columns(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The optional schedule and trace fields (absent from unscheduled loads and older records)."""
    n = len(docs)
    # the difference is taken on the integers: monotonic ns past 2**53 would lose their last digits as floats
    late = [d["send_ns"] - d["sched_ns"] if isinstance(d.get("sched_ns"), int) else None for d in docs]
    return {
        "arrival_error_ns": _floats(late, n),
        **{name: _floats([d.get(name) for d in docs], n) for name in ("trace_row", "planned_shared_tokens")},
        **{name: _floats([d.get(name) for d in docs], n) for name in _OPTIONAL_KEYS},
    }


_OPTIONAL_KEYS = ("session", "turn", "turns", "max_tokens")  # per-request columns older records lack


def _nan_if_none(arr: F64 | None, n: int) -> F64:
    return np.full(n, np.nan) if arr is None else arr


def _floats(values: Sequence[Any], n: int) -> F64:
    """float64 column; numpy turns None into NaN."""
    if n == 0:
        return np.zeros(0, dtype=np.float64)
    return np.array(values, dtype=np.float64)


def _empty() -> RawColumns:
    i, f = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
    return RawColumns(
        send_ns=i,
        end_ns=i,
        ok=np.zeros(0, dtype=np.bool_),
        error_class=[],
        error=[],
        prompt_tokens=f,
        completion_tokens=f,
        cached_tokens=f,
        input_tokens_body=f,
        input_tokens_chat=f,
        n_chunks=i,
        chunk_ns=i,
        chunk_tokens=f,
        spec_draft_tokens=f,
        spec_accepted_tokens=f,
        steps_known=np.zeros(0, dtype=np.bool_),
        n_steps=i,
        step_drafted=i,
        step_accepted=i,
        arrival_error_ns=f,
        trace_row=f,
        planned_shared_tokens=f,
    )


_BATCH = 1 << 13  # records parsed per batch: small enough to stay in cache
_BLOCK = 1 << 24  # bytes read per block


def columns_from_records(records: Iterable[RawRecord]) -> RawColumns:
    """Columns from in-memory records (tests, importers)."""
    with _no_gc():
        return _from_records(records)


def _from_records(records: Iterable[RawRecord]) -> RawColumns:
    b = _Builder()
    batch: list[dict[str, Any]] = []  # JSON: raw records as dicts
    for r in records:
        batch.append(dict(r))
        if len(batch) >= _BATCH:
            b.add_batch(batch)
            batch = []
    b.add_batch(batch)
    return b.build()


def _parse_lines(lines: list[bytes]) -> tuple[list[dict[str, Any]], int]:  # JSON: raw.jsonl lines
    """Parse complete lines; one orjson call per batch, per line only when the batch has a bad line."""
    lines = [ln for ln in lines if ln.strip()]
    try:
        docs: list[dict[str, Any]] = orjson.loads(b"[" + b",".join(lines) + b"]")  # JSON: raw.jsonl lines
        return docs, 0
    except orjson.JSONDecodeError:
        pass
    out: list[dict[str, Any]] = []  # JSON: raw.jsonl lines
    bad = 0
    for ln in lines:
        try:
            out.append(orjson.loads(ln))
        except orjson.JSONDecodeError:
            bad += 1
    return out, bad


def read_raw(path: Path, rel: str = "load/raw.jsonl") -> tuple[RawColumns, RawSource]:
    """Stream a raw file into columns; the sha256 is of exactly the bytes parsed.

    Like `caseledger.records.read_records`: a last line that does not parse and has no newline is a torn
    tail (tolerated and reported); other unparsable lines are counted as bad_lines and skipped.
    """
    with _no_gc():
        return _read_raw(path, rel)


@contextmanager
def _no_gc() -> Iterator[None]:
    """The cyclic GC would rescan every live batch dict many times; parsed JSON holds no cycles."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _read_raw(path: Path, rel: str) -> tuple[RawColumns, RawSource]:
    h = hashlib.sha256()
    b = _Builder()
    bad = 0
    rest = b""
    pending: list[bytes] = []
    with path.open("rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
            lines = (rest + block).split(b"\n")
            rest = lines.pop()  # the bytes after the last newline: an incomplete line so far
            pending += lines
            while len(pending) >= _BATCH:
                docs, nbad = _parse_lines(pending[:_BATCH])
                del pending[:_BATCH]
                bad += nbad
                b.add_batch(docs)
    docs, nbad = _parse_lines(pending)
    bad += nbad
    torn = False
    if rest.strip():
        try:
            docs.append(orjson.loads(rest))
        except orjson.JSONDecodeError:
            torn = True
    b.add_batch(docs)
    return b.build(), RawSource(path=rel, sha256=h.hexdigest(), torn_tail=torn, bad_lines=bad)
