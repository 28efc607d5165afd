"""Trace files (dataset source 'trace'): a Mooncake-style JSONL read, checked and pinned by its sha256.

One request per line: {"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [int, ...]}.
`hash_ids` name the blocks of block_size tokens the prompt starts with; two rows naming the same id at the same
position share those tokens (what a prefix cache can reuse). Row k is the k-th request line of the file
(0-based, blank lines not counted); the first dataset.entries rows are used, a subset being its own dataset.

Nothing here writes: a path outside the workspace, a missing file or a bad row is refused before anything
is generated (a refused freeze writes nothing).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import orjson

from caseledger.case.bounds import MAX_TOKENS
from caseledger.case.model import Case
from caseledger.datasets.identity import SALT_K
from caseledger.errors import CaseInvalid, quoted
from caseledger.workspace import Workspace, exists, read_file_field, sha256_bytes

ROW_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
MAX_HASH_ID = 2**63 - 1
EXAMPLE = '{"timestamp": 0, "input_length": 120, "output_length": 16, "hash_ids": [0, 1]}'


@dataclass(frozen=True)
class TraceRow:
    row: int  # the k-th request line of the file, 0-based
    timestamp_ms: float
    input_length: int  # body tokens (before the chat template)
    output_length: int  # max_tokens of the request
    hash_ids: tuple[int, ...]


@dataclass(frozen=True)
class Trace:
    rows: list[TraceRow]  # the first dataset.entries rows
    rows_in_file: int
    sha256: str


def _fix_row(path: str, no: int, what: str) -> CaseInvalid:
    return CaseInvalid(
        f"dataset.path '{quoted(path)}' line {no}: {what}",
        f"fix that line of the trace; each line is one request, e.g. {EXAMPLE}",
    )


def _int_field(obj: dict[str, Any], name: str, path: str, no: int, lo: int) -> int:  # JSON: a parsed JSONL row
    v = obj.get(name)
    if type(v) is not int or not lo <= v <= MAX_TOKENS:
        raise _fix_row(path, no, f"'{name}' must be an integer {lo}..{MAX_TOKENS}, not {quoted(repr(v), 40)}")
    return v


def _row(obj: Any, k: int, path: str, no: int) -> TraceRow:
    if not isinstance(obj, dict):
        raise _fix_row(path, no, "is not a JSON object")
    missing = [f for f in ROW_FIELDS if f not in obj]
    if missing:
        raise _fix_row(path, no, f"has no '{missing[0]}' (a row needs {', '.join(ROW_FIELDS)})")
    ts = obj["timestamp"]
    if type(ts) not in (int, float) or not math.isfinite(ts) or ts < 0:
        raise _fix_row(
            path, no, f"'timestamp' must be a finite number of milliseconds >= 0, not {quoted(repr(ts), 40)}"
        )
    ids = obj["hash_ids"]
    if not isinstance(ids, list) or any(type(h) is not int or not 0 <= h <= MAX_HASH_ID for h in ids):
        raise _fix_row(path, no, "'hash_ids' must be a list of integers >= 0 (the prompt's shared blocks, in order)")
    # every trace prompt leads with a first word and the run's salt slot, then needs one token of its own
    return TraceRow(
        row=k,
        timestamp_ms=float(ts),
        input_length=_int_field(obj, "input_length", path, no, SALT_K + 2),
        output_length=_int_field(obj, "output_length", path, no, 1),
        hash_ids=tuple(ids),
    )


def read_source(ws: Workspace, path: str, fix: str) -> bytes:
    """dataset.path's bytes (file and trace sources): a file inside the workspace, else refused with `fix`."""
    src = ws.inside(path, "dataset.path")
    if not exists(src, "dataset.path", path):
        raise CaseInvalid(f"dataset.path '{quoted(path)}' is not a file in the workspace ({quoted(src, 200)})", fix)
    return read_file_field(src, "dataset.path", path)


def file_sha256(ws: Workspace, case: Case) -> tuple[bytes, str]:
    """The trace file's bytes and sha256; the path must be a file inside the workspace."""
    assert case.dataset.path is not None
    raw = read_source(
        ws,
        case.dataset.path,
        "put the trace (one JSON request per line) inside the workspace and give its path relative to it",
    )
    return raw, sha256_bytes(raw)


def pin(ws: Workspace, case: Case) -> Case:
    """A trace case with dataset.sha256 set to the file's hash (so the case and dataset ids cover the content);
    a pinned hash that no longer matches the file is refused. Other sources are returned as they are."""
    ds = case.dataset
    if ds.source != "trace":
        return case
    _, sha = file_sha256(ws, case)
    if ds.sha256 is not None and ds.sha256 != sha:
        raise CaseInvalid(
            f"dataset.sha256 pins {ds.sha256[:12]}… but dataset.path '{quoted(ds.path)}' now hashes to {sha[:12]}…",
            "restore the trace file, or remove dataset.sha256 from the draft to freeze the current file as a new case",
        )
    if ds.sha256 == sha:
        return case
    data = case.model_dump(mode="json", by_alias=True)
    data["dataset"]["sha256"] = sha
    return Case.model_validate(data)


def read(ws: Workspace, case: Case) -> Trace:
    """The first dataset.entries rows of the trace, checked: fields, bounds, timestamps in order, enough rows."""
    ds = case.dataset
    path = str(ds.path)
    raw, sha = file_sha256(ws, case)
    if ds.sha256 is not None and ds.sha256 != sha:
        raise CaseInvalid(
            f"dataset.path '{quoted(path)}' changed since the case was frozen (sha256 {sha[:12]}… now, "
            f"{ds.sha256[:12]}… pinned)",
            "restore the trace file, or freeze the draft again (without dataset.sha256) to measure the new content",
        )
    want = int(ds.entries or case.load.requests)
    rows: list[TraceRow] = []
    total = 0
    for no, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        total += 1
        if len(rows) == want:
            continue  # counted only: the rows past the subset are not parsed
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise _fix_row(path, no, f"is not JSON ({exc})") from exc
        row = _row(obj, len(rows), path, no)
        if rows and row.timestamp_ms < rows[-1].timestamp_ms:
            raise _fix_row(
                path,
                no,
                f"'timestamp' {row.timestamp_ms:g} is before the previous row's "
                f"{rows[-1].timestamp_ms:g}: rows are replayed in file order, so sort the trace by "
                "timestamp",
            )
        rows.append(row)
    if len(rows) < want:
        raise CaseInvalid(
            f"dataset.path '{quoted(path)}' has {len(rows)} requests but dataset.entries is {want} (one row per "
            "formal request)",
            f"lower dataset.entries and load.requests to at most {len(rows)}, or use a longer trace",
        )
    return Trace(rows=rows, rows_in_file=total, sha256=sha)


def sample_rows(n: int = 24, seed: int = 7, block: int = 32) -> list[dict[str, Any]]:  # JSON: trace rows to write
    """A small Mooncake-style trace, generated (never downloaded): cases/trace-sample.jsonl is `sample_jsonl()`.

    Three shared system prompts (roots of 4, 6 and 2 blocks); a third of the requests follow up an earlier
    one and carry its blocks (a conversation's history); every request adds 1..3 blocks of its own and ends in
    a partial block; arrivals are exponential gaps of mean 0.6 s (timestamps in whole ms).
    """
    rng = random.Random(seed)
    roots = [list(range(0, 4)), list(range(100, 106)), list(range(200, 202))]
    history: list[list[int]] = []
    rows: list[dict[str, Any]] = []  # JSON: trace rows to write
    t, next_id = 0.0, 1000
    for k in range(n):
        if k:
            t += rng.expovariate(1 / 0.6) * 1000
        base = rng.choice(history) if history and rng.random() < 1 / 3 else rng.choice(roots)
        own = list(range(next_id, next_id + rng.randint(1, 3)))
        next_id += len(own)
        ids = base + own
        rows.append(
            {
                "timestamp": round(t),
                "input_length": len(ids) * block - rng.randint(0, 23),
                "output_length": rng.randint(8, 16),
                "hash_ids": ids,
            }
        )
        history.append(ids[:-1])  # the last block is partial: a follow-up shares the whole blocks only
    return rows


def sample_jsonl() -> bytes:
    """The bytes of cases/trace-sample.jsonl."""
    return b"".join(orjson.dumps(r) + b"\n" for r in sample_rows())
