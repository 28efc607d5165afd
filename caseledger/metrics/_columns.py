"""Raw records as columns: one numpy array per field, chunks flattened with offsets.

The raw file is streamed line by line (hashing the same bytes that are parsed), so a million records
never exist as a million dicts at once. A torn last line is tolerated, exactly as `read_records` does.
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import orjson

from caseledger.records import RawRecord

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]

_NAN = math.nan


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
        ):
            h.update(np.ascontiguousarray(arr).tobytes())
        h.update(orjson.dumps([self.error_class, self.error]))
        return h.hexdigest()


class _Builder:
    """Accumulates records into compact stdlib arrays (8 bytes per value, no per-record objects)."""

    def __init__(self) -> None:
        self.send = array("q")
        self.end = array("q")
        self.ok = array("b")
        self.error_class: list[str | None] = []
        self.error: list[str | None] = []
        self.prompt = array("d")
        self.completion = array("d")
        self.cached = array("d")
        self.body = array("d")
        self.chat = array("d")
        self.nch = array("q")
        self.chunk = array("q")
        self.ctok = array("d")

    def add(self, r: RawRecord) -> None:
        self.send.append(r["send_ns"])
        self.end.append(r["end_ns"])
        ok = bool(r["ok"])
        self.ok.append(ok)
        # error text is kept only for failures: a million successes cost no strings
        self.error_class.append(None if ok else r.get("error_class"))
        self.error.append(None if ok else r.get("error"))
        v = r.get("prompt_tokens")
        self.prompt.append(_NAN if v is None else v)
        v = r.get("completion_tokens")
        self.completion.append(_NAN if v is None else v)
        v = r.get("cached_tokens")
        self.cached.append(_NAN if v is None else v)
        v = r.get("input_tokens_body")
        self.body.append(_NAN if v is None else v)
        v = r.get("input_tokens_chat")
        self.chat.append(_NAN if v is None else v)
        chunks = r.get("chunk_ns") or []
        k = len(chunks)
        self.nch.append(k)
        if k:
            self.chunk.extend(chunks)
            toks = r.get("chunk_tokens") or []
            if len(toks) != k:
                self.ctok.extend([_NAN] * k)  # a mismatched list is as good as unknown
            elif None in toks:
                self.ctok.extend([_NAN if t is None else t for t in toks])
            else:
                self.ctok.extend(toks)  # type: ignore[arg-type]  # None was ruled out above

    def build(self) -> RawColumns:
        def i64(a: array[int]) -> I64:
            return np.frombuffer(a, dtype=np.int64).copy() if len(a) else np.zeros(0, dtype=np.int64)

        def f64(a: array[float]) -> F64:
            return np.frombuffer(a, dtype=np.float64).copy() if len(a) else np.zeros(0, dtype=np.float64)

        ok = np.frombuffer(self.ok, dtype=np.int8).astype(np.bool_) if len(self.ok) else np.zeros(0, np.bool_)
        return RawColumns(
            send_ns=i64(self.send),
            end_ns=i64(self.end),
            ok=ok,
            error_class=self.error_class,
            error=self.error,
            prompt_tokens=f64(self.prompt),
            completion_tokens=f64(self.completion),
            cached_tokens=f64(self.cached),
            input_tokens_body=f64(self.body),
            input_tokens_chat=f64(self.chat),
            n_chunks=i64(self.nch),
            chunk_ns=i64(self.chunk),
            chunk_tokens=f64(self.ctok),
        )


def columns_from_records(records: Iterable[RawRecord]) -> RawColumns:
    """Columns from in-memory records (tests, importers)."""
    b = _Builder()
    for r in records:
        b.add(r)
    return b.build()


def read_raw(path: Path, rel: str = "load/raw.jsonl") -> tuple[RawColumns, RawSource]:
    """Stream a raw file into columns; the sha256 is of exactly the bytes parsed.

    Like `caseledger.records.read_records`: a last line that does not parse and has no newline is a torn
    tail (tolerated and reported); other unparsable lines are counted as bad_lines and skipped.
    """
    h = hashlib.sha256()
    b = _Builder()
    torn = False
    bad = 0
    with path.open("rb") as f:
        for line in f:
            h.update(line)
            body = line.strip()
            if not body:
                continue
            try:
                rec = orjson.loads(body)
            except orjson.JSONDecodeError:
                if line.endswith(b"\n"):
                    bad += 1
                else:
                    torn = True
                continue
            b.add(rec)
    return b.build(), RawSource(path=rel, sha256=h.hexdigest(), torn_tail=torn, bad_lines=bad)
