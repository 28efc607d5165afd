"""caseledger: frozen cases, phased runs with evidence, and an on-disk ledger for LLM-serving experiments.

The public surface is the six tools (plain functions over a Workspace) and the case model. Names are
resolved lazily so that `python -m caseledger.load` and the controller import only what they use.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

# cryptography >= 51 warns, at import, that asyncssh still offers DSA keys: noise in every SSH process's log and
# an error under `-W error`. caseledger never offers DSA; the warning is about asyncssh's catalogue, not a run.
warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"asyncssh\.")

__version__ = "0.1.0"

_LAZY = {
    "Case": "caseledger.case",
    "CaseledgerError": "caseledger.errors",
    "Workspace": "caseledger.workspace",
    "freeze_case": "caseledger.tools",
    "phase_status": "caseledger.tools",
    "reprocess_raw": "caseledger.tools",
    "resume": "caseledger.tools",
    "start_run": "caseledger.tools",
    "summarize": "caseledger.tools",
}

__all__ = [
    "Case",
    "CaseledgerError",
    "Workspace",
    "__version__",
    "freeze_case",
    "phase_status",
    "reprocess_raw",
    "resume",
    "start_run",
    "summarize",
]

if TYPE_CHECKING:
    from caseledger.case.model import Case
    from caseledger.errors import CaseledgerError
    from caseledger.tools import freeze_case, phase_status, reprocess_raw, resume, start_run, summarize
    from caseledger.workspace import Workspace


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'caseledger' has no attribute '{name}'")
