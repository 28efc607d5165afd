"""Bringing a target's service to the case's identity: its intended identity (identity), the recorded service
and its live process (live), a live service another workspace of the host keeps on the target (kept), the adapters
that start or probe it (reference, external, command), the launchers that start its processes locally or over SSH
(launch) and the SSH transport (remote)."""

from caseledger.ledger.evidence import ComponentRecord, ServiceRecord
from caseledger.services.ensure import ensure, served_models
from caseledger.services.identity import case_env, compare_argv, identity_of, intended_argv
from caseledger.services.kept import refuse_kept_elsewhere
from caseledger.services.live import check_live, health_ok, live_service, live_state, mark_warm, stop, stop_all

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
    "refuse_kept_elsewhere",
    "served_models",
    "stop",
    "stop_all",
]
