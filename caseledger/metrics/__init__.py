"""Metrics: raw per-request records -> figures per window (whole, native), versioned and never overwritten.

Pure API: `compute_result` (no I/O), `write_result` / `latest_result` (the results directory), and the
result models. `python -m caseledger.metrics RUN_DIR` is the fresh-process postprocessor.
"""

from caseledger.metrics._columns import RawColumns, RawSource, columns_from_records, read_raw
from caseledger.metrics._compute import compute_result, params_key
from caseledger.metrics._models import (
    DEFINITIONS,
    PROCESSOR_VERSION,
    CacheFigures,
    ConcurrencySeries,
    CounterDelta,
    Distribution,
    Failures,
    Inputs,
    Latency,
    NotObserved,
    Params,
    Ratio,
    Result,
    SpecDecode,
    Throughput,
    Throughputs,
    Tokens,
    WindowResult,
    Windows,
)
from caseledger.metrics._spec import FAMILIES, parse_prometheus
from caseledger.metrics._store import ResultConflict, latest_result, result_dir, write_result

__all__ = [
    "DEFINITIONS",
    "FAMILIES",
    "PROCESSOR_VERSION",
    "CacheFigures",
    "ConcurrencySeries",
    "CounterDelta",
    "Distribution",
    "Failures",
    "Inputs",
    "Latency",
    "NotObserved",
    "Params",
    "Ratio",
    "RawColumns",
    "RawSource",
    "Result",
    "ResultConflict",
    "SpecDecode",
    "Throughput",
    "Throughputs",
    "Tokens",
    "WindowResult",
    "Windows",
    "columns_from_records",
    "compute_result",
    "latest_result",
    "params_key",
    "parse_prometheus",
    "read_raw",
    "result_dir",
    "write_result",
]
