"""The case: what to measure (model, built from its sections: target, service, dataset, measurement, decision;
their bounds in bounds), the impact table and the delta -> plan (plan), frozen storage (store), what a launch may
carry (launch)."""

from caseledger.case.measurement import Window
from caseledger.case.model import Case
from caseledger.case.plan import IMPACT, PHASES, DeltaItem, Impact, PlanStep, delta, impact_of, plan
from caseledger.case.service import SSH, ReferenceConfig
from caseledger.case.store import case_id_of, check_parent, load_case, read_draft, store, validate
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
    "plan",
    "read_draft",
    "store",
    "validate",
]
