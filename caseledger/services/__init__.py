"""Bringing a target's service to the case's identity: adapters (reference, external, command; local or
over SSH) and the SSH transport (remote)."""

from caseledger.ledger.evidence import ComponentRecord, ServiceRecord
from caseledger.services.adapters import (
    case_env,
    check_live,
    compare_argv,
    ensure,
    health_ok,
    identity_of,
    intended_argv,
    live_service,
    live_state,
    mark_warm,
    served_models,
    stop,
    stop_all,
)

__all__ = [
    "ComponentRecord",
    "ServiceRecord",
    "case_env",
    "check_live",
    "compare_argv",
    "ensure",
    "health_ok",
    "identity_of",
    "intended_argv",
    "live_service",
    "live_state",
    "mark_warm",
    "served_models",
    "stop",
    "stop_all",
]
