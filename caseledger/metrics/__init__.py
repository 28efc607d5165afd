"""Metrics: raw per-request records -> figures per window (whole, native), versioned and never overwritten.

Pure API: `compute_result` (no I/O), `write_result` / `latest_result` (the results directory), and the
result models. `python -m caseledger.metrics RUN_DIR` is the fresh-process postprocessor.
"""

from caseledger.errors import ResultConflict
from caseledger.metrics._columns import RawColumns, RawSource, columns_from_records, read_raw
from caseledger.metrics._compute import compute_result, params_key, per_request_ms
from caseledger.metrics._models import (
    DEFINITIONS,
    NATIVE_RULES,
    PROCESSOR_VERSION,
    RATIO_MAX,
    RATIO_MIN_EXCLUSIVE,
    CacheFigures,
    ConcurrencySeries,
    CounterDelta,
    Distribution,
    Failures,
    Inputs,
    Interval,
    Latency,
    NativeRule,
    NotObserved,
    Params,
    PositionAcceptance,
    Ratio,
    Result,
    SpecDecode,
    SpecPerRequest,
    Throughput,
    Throughputs,
    Tokens,
    WindowResult,
    WindowRule,
    Windows,
)
from caseledger.metrics._spec import FAMILIES, parse_prometheus
from caseledger.metrics._store import latest_result, result_dir, write_result

__all__ = [
    "DEFINITIONS",
    "FAMILIES",
    "NATIVE_RULES",
    "PROCESSOR_VERSION",
    "RATIO_MAX",
    "RATIO_MIN_EXCLUSIVE",
    "CacheFigures",
    "ConcurrencySeries",
    "CounterDelta",
    "Distribution",
    "Failures",
    "Inputs",
    "Interval",
    "Latency",
    "NativeRule",
    "NotObserved",
    "Params",
    "PositionAcceptance",
    "Ratio",
    "RawColumns",
    "RawSource",
    "Result",
    "ResultConflict",
    "SpecDecode",
    "SpecPerRequest",
    "Throughput",
    "Throughputs",
    "Tokens",
    "WindowResult",
    "WindowRule",
    "Windows",
    "columns_from_records",
    "compute_result",
    "latest_result",
    "params_key",
    "parse_prometheus",
    "per_request_ms",
    "read_raw",
    "result_dir",
    "write_result",
]
