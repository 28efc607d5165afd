"""The case: what to measure (model, built from its sections: target, service, dataset, measurement, decision;
their bounds in bounds), the impact table and the delta -> plan (plan), frozen storage (store), what a launch may
carry (launch).

Names resolve lazily (PEP 562): a process that needs one section (the reference target its ReferenceConfig) does
not build every model of the case. The functions named like their modules (plan, store) are imported from them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "IMPACT": "caseledger.case.plan",
    "PHASES": "caseledger.case.phases",
    "SSH": "caseledger.case.service",
    "Case": "caseledger.case.model",
    "DeltaItem": "caseledger.case.plan",
    "Impact": "caseledger.case.plan",
    "PlanStep": "caseledger.case.plan",
    "ReferenceConfig": "caseledger.case.service",
    "Window": "caseledger.case.measurement",
    "case_id_of": "caseledger.case.store",
    "check_parent": "caseledger.case.store",
    "delta": "caseledger.case.plan",
    "impact_of": "caseledger.case.plan",
    "load_case": "caseledger.case.store",
    "origin": "caseledger.case.target",
    "read_draft": "caseledger.case.store",
    "validate": "caseledger.case.store",
}

if TYPE_CHECKING:
    from caseledger.case.measurement import Window
    from caseledger.case.model import Case
    from caseledger.case.phases import PHASES
    from caseledger.case.plan import IMPACT, DeltaItem, Impact, PlanStep, delta, impact_of
    from caseledger.case.service import SSH, ReferenceConfig
    from caseledger.case.store import case_id_of, check_parent, load_case, read_draft, validate
    from caseledger.case.target import origin

__all__ = [
    "IMPACT",
    "PHASES",
    "SSH",
    "Case",
    "DeltaItem",
    "Impact",
    "PlanStep",
    "ReferenceConfig",
    "Window",
    "case_id_of",
    "check_parent",
    "delta",
    "impact_of",
    "load_case",
    "origin",
    "read_draft",
    "validate",
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
