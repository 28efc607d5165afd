"""The embedded reference target: an OpenAI-compatible streaming server with a documented performance model.

Run it with `python -m caseledger.target serve --host H --port P --model NAME [--config-json JSON]`;
the model of queueing, prefill, decode, prefix cache and speculative decoding is described in
`caseledger.target.reference`, the routes in `caseledger.target.server`.

Names resolve lazily (PEP 562): the CLI's parser reads the serve options (caseledger.target.options) without
starlette and the engine, which only serving needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "ReferenceEngine": "caseledger.target.reference",
    "build_app": "caseledger.target.server",
    "main": "caseledger.target.server",
}

if TYPE_CHECKING:
    from caseledger.target.reference import ReferenceEngine
    from caseledger.target.server import build_app, main

__all__ = ["ReferenceEngine", "build_app", "main"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return list(__all__)
