"""The case: what to measure (model), the impact table and the delta -> plan (plan), frozen storage (store),
what a launch may carry (launch)."""

from caseledger.case.model import SSH, Case, ReferenceConfig, Window, origin
from caseledger.case.plan import IMPACT, PHASES, DeltaItem, Impact, PlanStep, delta, impact_of, plan
from caseledger.case.store import case_id_of, check_parent, load_case, read_draft, store, validate

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
    "plan",
    "read_draft",
    "store",
    "validate",
]
