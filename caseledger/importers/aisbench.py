"""Import an AISBench perf output directory as caseledger raw records, with AISBench's own summary.

Layout read (AISBench/benchmark, ais_bench/benchmark/openicl/icl_inferencer/output_handler and
summarizers/default_perf.py):

    performances/<model_abbr>/                 <- perf_dir
        <ds>_details.jsonl                     one line per request: id, success, error_info, time_points,
                                               input_tokens, output_tokens, db_name, ...
        db_data/<db_name>                      SQLite: numpy_store(id INTEGER PRIMARY KEY, arr_blob BLOB),
                                               arr_blob = np.save bytes of the request's time points
        tmp/tmp_<db_name>                      the same database before AISBench's final move (fallback)
        <ds>.csv                               per-metric statistics (Performance Parameters, Stage, ...)
        <ds>.json                              common metrics {name: {stage: value-with-unit}}

time_points is either a list (older layouts) or {"__db_ref__": row id}; values are time.perf_counter()
seconds, one per SSE `data:` line (role-only and usage-only lines included) after the send stamp.
"""

from __future__ import annotations

import csv
import io
import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from caseledger.errors import AisbenchImportError as AisbenchImportError  # defined in errors; re-exported
from caseledger.records import ErrorClass, RawRecord

DIFFERENCES: tuple[str, ...] = (
    "AISBench timestamps every SSE data: line, including role-only and usage-only chunks; imported chunk_ns "
    "= time_points[1:], so an imported TTFT is to the first SSE line (often a role-only chunk), not to the "
    "first content-bearing chunk",
    "AISBench ITL is diff(time_points[1:]) pooled over all requests: every SSE line gap, including the gap "
    "to a usage-only tail chunk; caseledger's ITL pools gaps between content chunks",
    "AISBench E2E = time_points[-1] - time_points[0] (the last SSE line); caseledger E2E = end_ns - send_ns "
    "(imported end_ns = time_points[-1], so the two agree on imported data)",
    "AISBench TPOT is 0 for outputs of <= 1 token and stays in the distribution; caseledger excludes those "
    "requests (TPOT undefined) and counts them in the window notes",
    "AISBench input_tokens/output_tokens come from server usage or, when absent, from re-tokenizing the "
    "prompt/prediction with a local tokenizer; which one was used is not recorded per request",
    "AISBench's stable stage uses the configured max concurrency (batch_size): it starts at the send of the "
    "second request that brings concurrency to it and ends at the first end after the last send, or at an "
    "end that drops concurrency below 98% with no new start within 1 ms; caseledger's aisbench rule uses "
    "the observed peak, starts at the second request reaching it and ends when concurrency last leaves it "
    "(on the shipped AISBench output both select the same 6 requests)",
    "AISBench's 'Concurrency' figure is sum(E2E) / duration; caseledger's mean_concurrency is the time "
    "integral of in-flight requests / duration (equal on the whole run, slightly different on a stage that "
    "cuts requests)",
    "chunk token counts are not recorded (chunk_tokens unknown); token-aware ITL is derived only where the "
    "number of SSE lines after the first stamp equals output_tokens",
    "cached tokens are not recorded: prefix-cache figures are NOT_OBSERVED on imported data",
    "timestamps are float perf_counter seconds (CLOCK_MONOTONIC on Linux, shared by AISBench's worker "
    "processes), converted to integer ns by rounding",
    "AISBench marks a request with fewer than 2 time points as failed ('chunk size is less than 2'); "
    "error_class of imported failures is inferred from error_info text",
)


@dataclass(frozen=True)
class AisbenchFigure:
    """One summary value as AISBench printed it, parsed."""

    value: float | None
    unit: str | None
    text: str


@dataclass(frozen=True)
class AisbenchSummary:
    """AISBench's own figures: common metrics (<ds>.json) and per-metric statistics (<ds>.csv)."""

    common: dict[str, dict[str, AisbenchFigure]] = field(default_factory=dict)  # metric -> stage -> figure
    stats: dict[str, dict[str, dict[str, AisbenchFigure]]] = field(default_factory=dict)  # metric->stage->stat


@dataclass(frozen=True)
class AisbenchImport:
    perf_dir: Path
    dataset: str
    details_file: Path
    records: list[RawRecord]
    summary: AisbenchSummary
    skipped: list[str]  # requests that could not become records, with the reason
    differences: tuple[str, ...] = DIFFERENCES


_VALUE = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(.*?)\s*$")


def parse_figure(raw: Any) -> AisbenchFigure:
    """'2048.2945 ms' -> (2048.2945, 'ms'); numbers pass through; anything else keeps its text."""
    if isinstance(raw, bool):
        return AisbenchFigure(value=float(raw), unit=None, text=str(raw))
    if isinstance(raw, int | float):
        return AisbenchFigure(value=float(raw), unit=None, text=str(raw))
    text = str(raw)
    m = _VALUE.match(text)
    if not m:
        return AisbenchFigure(value=None, unit=None, text=text)
    return AisbenchFigure(value=float(m.group(1)), unit=m.group(2) or None, text=text)


def _find_details(perf_dir: Path, dataset: str | None) -> tuple[str, Path]:
    if dataset is not None:
        path = perf_dir / f"{dataset}_details.jsonl"
        if not path.is_file():
            raise AisbenchImportError(f"no {path.name} in {perf_dir}")
        return dataset, path
    found = sorted(perf_dir.glob("*_details.jsonl"))
    if not found:
        raise AisbenchImportError(
            f"no *_details.jsonl in {perf_dir}; pass the performances/<model_abbr>/ directory of an AISBench "
            "--mode perf run"
        )
    if len(found) > 1:
        names = ", ".join(p.name[: -len("_details.jsonl")] for p in found)
        raise AisbenchImportError(f"several datasets in {perf_dir}: {names}; pass dataset=<one of them>")
    return found[0].name[: -len("_details.jsonl")], found[0]


class _Blobs:
    """Read-only access to the numpy_store databases named by the details records."""

    def __init__(self, perf_dir: Path) -> None:
        self.perf_dir = perf_dir
        self._conns: dict[str, sqlite3.Connection] = {}

    def _conn(self, db_name: str) -> sqlite3.Connection:
        if "/" in db_name or "\\" in db_name or db_name.startswith("."):
            raise AisbenchImportError(f"invalid db_name {db_name!r}")
        if db_name not in self._conns:
            for path in (self.perf_dir / "db_data" / db_name, self.perf_dir / "tmp" / f"tmp_{db_name}"):
                if path.is_file():
                    self._conns[db_name] = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
                    break
            else:
                raise AisbenchImportError(f"timing database {db_name} not found under {self.perf_dir}/db_data")
        return self._conns[db_name]

    def load(self, db_name: str, ref: Any) -> list[float] | None:
        row = self._conn(db_name).execute("SELECT arr_blob FROM numpy_store WHERE id = ?", (ref,)).fetchone()
        if row is None:
            return None
        arr = np.load(io.BytesIO(row[0]), allow_pickle=False)
        return [float(x) for x in np.asarray(arr, dtype=np.float64).ravel()]

    def close(self) -> None:
        for c in self._conns.values():
            c.close()


def _error_class(info: str, n_points: int) -> ErrorClass:
    low = info.lower()
    if "timeout" in low or "timed out" in low:
        return "timeout"
    if "connect" in low or "refused" in low or "reset" in low:
        return "connection"
    if re.search(r"\b[45]\d\d\b", low) or "http" in low or "status" in low:
        return "http"
    if n_points < 2 or "chunk size" in low:
        return "incomplete"
    return "stream"


def _int_or_none(v: Any) -> int | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int | float) and v >= 0:
        return int(v)
    return None


def _summary(perf_dir: Path, dataset: str) -> AisbenchSummary:
    common: dict[str, dict[str, AisbenchFigure]] = {}
    stats: dict[str, dict[str, dict[str, AisbenchFigure]]] = {}
    js = perf_dir / f"{dataset}.json"
    if js.is_file():
        data = orjson.loads(js.read_bytes())
        if isinstance(data, dict):
            for metric, stages in data.items():
                if isinstance(stages, dict):
                    common[str(metric)] = {str(s): parse_figure(v) for s, v in stages.items()}
                else:
                    common[str(metric)] = {"": parse_figure(stages)}
    cs = perf_dir / f"{dataset}.csv"
    if cs.is_file():
        with cs.open(newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                metric = row.pop("Performance Parameters", None)
                stage = row.pop("Stage", None) or ""
                if not metric:
                    continue
                stats.setdefault(metric, {})[stage] = {k: parse_figure(v) for k, v in row.items() if k}
    return AisbenchSummary(common=common, stats=stats)


def read_aisbench(perf_dir: Path, dataset: str | None = None) -> AisbenchImport:
    """Records (send_ns = tp[0], chunk_ns = tp[1:], end_ns = tp[-1]) plus AISBench's summary and the
    known definition differences. Records are ordered by send time; `entry` keeps AISBench's id."""
    perf_dir = Path(perf_dir)
    ds, details = _find_details(perf_dir, dataset)
    blobs = _Blobs(perf_dir)
    rows: list[tuple[float, RawRecord]] = []
    skipped: list[str] = []
    try:
        for n, line in enumerate(details.read_bytes().splitlines()):
            if not line.strip():
                continue
            try:
                d = orjson.loads(line)
            except orjson.JSONDecodeError:
                skipped.append(f"line {n + 1}: not JSON")
                continue
            tp_raw = d.get("time_points")
            if isinstance(tp_raw, dict) and "__db_ref__" in tp_raw:
                db_name = d.get("db_name")
                if not isinstance(db_name, str) or not db_name:
                    skipped.append(f"line {n + 1}: time_points reference without db_name")
                    continue
                tp = blobs.load(db_name, tp_raw["__db_ref__"])
                if tp is None:
                    skipped.append(
                        f"line {n + 1}: numpy_store row {tp_raw['__db_ref__']} missing in {db_name} "
                        "(AISBench killed before its database commit?)"
                    )
                    continue
            elif isinstance(tp_raw, list):
                tp = [float(x) for x in tp_raw]
            else:
                tp = []
            if not tp:
                skipped.append(f"line {n + 1}: no time points (id {d.get('id')})")
                continue
            ns = [round(x * 1e9) for x in tp]
            success = bool(d.get("success")) and len(ns) >= 2
            info = str(d.get("error_info") or ("chunk size is less than 2" if len(ns) < 2 else ""))
            entry = d.get("id")
            rec: RawRecord = {
                "i": 0,
                "entry": entry if isinstance(entry, int) and not isinstance(entry, bool) else n,
                "route": 0,
                "send_ns": ns[0],
                "chunk_ns": ns[1:],
                "chunk_tokens": [None] * (len(ns) - 1),
                "end_ns": ns[-1],
                "status": 200 if success else None,
                "ok": success,
                "error": None if success else info,
                "error_class": None if success else _error_class(info, len(ns)),
                "prompt_tokens": _int_or_none(d.get("input_tokens")),
                "completion_tokens": _int_or_none(d.get("output_tokens")) if success else None,
                "cached_tokens": None,
                "finish_reason": None,
                "input_tokens_body": None,
                "input_tokens_chat": None,
            }
            rows.append((tp[0], rec))
    finally:
        blobs.close()
    rows.sort(key=lambda r: r[0])
    records: list[RawRecord] = []
    for i, (_, rec) in enumerate(rows):
        rec["i"] = i
        records.append(rec)
    return AisbenchImport(
        perf_dir=perf_dir,
        dataset=ds,
        details_file=details,
        records=records,
        summary=_summary(perf_dir, ds),
        skipped=skipped,
    )
