"""Metrics: raw per-request records -> figures per window (whole, native), versioned and never overwritten.

Pure API: `compute_result` (no I/O), `write_result` / `latest_result` (the results directory), and the
result models. `python -m caseledger.metrics RUN_DIR` is the fresh-process postprocessor.

Names resolve lazily (PEP 562): a reader of results (the controller's handoff refresh, summarize) gets the
models and the results directory without numpy, which only computing figures needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "DEFINITIONS": "caseledger.metrics._definitions",
    "F64": "caseledger.metrics._columns",
    "FAMILIES": "caseledger.metrics._spec",
    "NATIVE_RULES": "caseledger.metrics._models",
    "PROCESSOR_VERSION": "caseledger.metrics._models",
    "RATIO_MAX": "caseledger.metrics._models",
    "RATIO_MIN_EXCLUSIVE": "caseledger.metrics._models",
    "STEP_GAP_MS": "caseledger.metrics._models",
    "Accelerators": "caseledger.metrics._models",
    "CacheFigures": "caseledger.metrics._models",
    "ConcurrencySeries": "caseledger.metrics._result",
    "CounterCheck": "caseledger.metrics._result",
    "CounterDelta": "caseledger.metrics._models",
    "Distribution": "caseledger.metrics._models",
    "Failures": "caseledger.metrics._result",
    "FrozenModel": "caseledger.metrics._models",
    "HostLoad": "caseledger.metrics._result",
    "Inputs": "caseledger.metrics._result",
    "Interval": "caseledger.metrics._models",
    "Latency": "caseledger.metrics._models",
    "NativeRule": "caseledger.metrics._models",
    "NotObserved": "caseledger.metrics._models",
    "Params": "caseledger.metrics._result",
    "PositionAcceptance": "caseledger.metrics._models",
    "Ratio": "caseledger.metrics._models",
    "RawColumns": "caseledger.metrics._columns",
    "RawSource": "caseledger.metrics._columns",
    "RequestChecks": "caseledger.metrics._result",
    "Result": "caseledger.metrics._result",
    "ResultConflict": "caseledger.errors",
    "SpecDecode": "caseledger.metrics._models",
    "SpecPerRequest": "caseledger.metrics._models",
    "Stall": "caseledger.metrics._result",
    "Throughput": "caseledger.metrics._models",
    "Throughputs": "caseledger.metrics._models",
    "TokenAgreement": "caseledger.metrics._models",
    "Tokens": "caseledger.metrics._models",
    "WindowResult": "caseledger.metrics._models",
    "WindowRule": "caseledger.metrics._models",
    "Windows": "caseledger.metrics._result",
    "columns_from_records": "caseledger.metrics._columns",
    "compute_result": "caseledger.metrics._compute",
    "host_load": "caseledger.metrics._evidence",
    "interval": "caseledger.metrics._noise",
    "pooled": "caseledger.metrics._noise",
    "latest_result": "caseledger.metrics._store",
    "params_key": "caseledger.metrics._params",
    "parse_prometheus": "caseledger.metrics._spec",
    "per_request_ms": "caseledger.metrics._compute",
    "read_raw": "caseledger.metrics._columns",
    "result_dir": "caseledger.metrics._store",
    "write_result": "caseledger.metrics._store",
}

if TYPE_CHECKING:
    from caseledger.errors import ResultConflict
    from caseledger.metrics._columns import F64, RawColumns, RawSource, columns_from_records, read_raw
    from caseledger.metrics._compute import compute_result, per_request_ms
    from caseledger.metrics._definitions import DEFINITIONS
    from caseledger.metrics._evidence import host_load
    from caseledger.metrics._models import (
        NATIVE_RULES,
        PROCESSOR_VERSION,
        RATIO_MAX,
        RATIO_MIN_EXCLUSIVE,
        STEP_GAP_MS,
        Accelerators,
        CacheFigures,
        CounterDelta,
        Distribution,
        FrozenModel,
        Interval,
        Latency,
        NativeRule,
        NotObserved,
        PositionAcceptance,
        Ratio,
        SpecDecode,
        SpecPerRequest,
        Throughput,
        Throughputs,
        TokenAgreement,
        Tokens,
        WindowResult,
        WindowRule,
    )
    from caseledger.metrics._noise import interval, pooled
    from caseledger.metrics._params import params_key
    from caseledger.metrics._result import (
        ConcurrencySeries,
        CounterCheck,
        Failures,
        HostLoad,
        Inputs,
        Params,
        RequestChecks,
        Result,
        Stall,
        Windows,
    )
    from caseledger.metrics._spec import FAMILIES, parse_prometheus
    from caseledger.metrics._store import latest_result, result_dir, write_result

__all__ = [
    "DEFINITIONS",
    "F64",
    "FAMILIES",
    "NATIVE_RULES",
    "PROCESSOR_VERSION",
    "RATIO_MAX",
    "RATIO_MIN_EXCLUSIVE",
    "STEP_GAP_MS",
    "Accelerators",
    "CacheFigures",
    "ConcurrencySeries",
    "CounterCheck",
    "CounterDelta",
    "Distribution",
    "Failures",
    "FrozenModel",
    "HostLoad",
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
    "RequestChecks",
    "Result",
    "ResultConflict",
    "SpecDecode",
    "SpecPerRequest",
    "Stall",
    "Throughput",
    "Throughputs",
    "TokenAgreement",
    "Tokens",
    "WindowResult",
    "WindowRule",
    "Windows",
    "columns_from_records",
    "compute_result",
    "host_load",
    "interval",
    "latest_result",
    "params_key",
    "parse_prometheus",
    "per_request_ms",
    "pooled",
    "read_raw",
    "result_dir",
    "write_result",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return list(__all__)
