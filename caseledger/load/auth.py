"""The load client's request headers and credentials: the phase header, the bearer key read from the
variable target.api_key_env names (never stored), and the refusal of a target that rejects the key.
"""

from __future__ import annotations

import os

from caseledger.case.model import Case
from caseledger.errors import FailureClass, PhaseFailed
from caseledger.records import PHASE_HEADER, RUN_HEADER


def api_key_of(case: Case) -> str | None:
    """The case's API key, read from the variable target.api_key_env names (never stored)."""
    return os.environ.get(case.target.api_key_env) if case.target.api_key_env else None


def auth_header(api_key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {api_key}"} if api_key else {}


def request_headers(phase: str, api_key: str | None, run_id: str | None = None) -> dict[str, str]:
    return {
        "content-type": "application/json",
        "accept": "text/event-stream",
        PHASE_HEADER: phase,
        **({RUN_HEADER: run_id} if run_id else {}),
        **auth_header(api_key),
    }


AUTH_STATUSES = (401, 403)


def refuse_auth(case: Case, where: str, statuses: list[int | None]) -> None:
    """A target that refused the credentials on every request: an authentication failure (class auth),
    not a service fault: the service is healthy and kept; the fix is the key."""
    if not statuses or not all(st in AUTH_STATUSES for st in statuses):
        return
    env = case.target.api_key_env
    key = f"the variable {env} (target.api_key_env)" if env else "target.api_key_env (none is set)"
    raise PhaseFailed(
        f"{where}: the target refused the credentials (HTTP {statuses[0]} on {len(statuses)} of {len(statuses)})",
        FailureClass.AUTH,
        f"check {key}: it must hold the key the server expects; then resume (the service is kept)",
    )
