"""The environment variables caseledger reads, checked at start: a value it cannot use is refused before a run
is written, naming the variable, what it holds and the fix; never a silent fallback, never a run that later
fails as a caseledger bug (a transport that does not exist would only be met by the load client, at warmup).

Each reader keeps its own default for an unset variable; this checks only the values that are set.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping

from caseledger.errors import CaseledgerError, quoted
from caseledger.faults import FAULT_ENV, parse_faults
from caseledger.ledger.leases import ENV_HOST_DIR, ENV_LEASE_S
from caseledger.load.parts import HEARTBEAT_ENV
from caseledger.load.transport import TRANSPORT_ENV, TRANSPORTS
from caseledger.run.admission.policy import CALLER_ENV, CALLERS
from caseledger.run.load.watch import QUIET_WAIT_ENV
from caseledger.run.remote.hosts import ARMED_SLACK_ENV
from caseledger.services.lease_host import ENV_DIR as ENV_LEASE_HOST_DIR
from caseledger.workspace.files import ENV_LOCK_TIMEOUT

# 0: no scenario chart drawn by a run's controller when it ends (the first summarize that shows it draws it): for a
# host where back-to-back runs should not share their cores with the drawing, and for the suite (run/controller.py)
CHART_ENV = "CASELEDGER_CHART_AFTER_RUN"


def _number(low: float, high: float) -> Callable[[str], str | None]:
    def check(v: str) -> str | None:
        try:
            x = float(v)
        except ValueError:
            return "is not a number"
        return None if math.isfinite(x) and low <= x <= high else f"is outside {low:g}..{high:g}"

    return check


def _one_of(*allowed: str) -> Callable[[str], str | None]:
    return lambda v: None if v in allowed else f"is not one of {', '.join(allowed)}"


def _absolute(v: str) -> str | None:
    return None if v.startswith("/") else "is not an absolute path"


def _faults(v: str) -> str | None:
    try:
        parse_faults(v)
    except ValueError:
        return "is not a comma list of component:action[=value]"
    return None


# variable -> (check of a set value, the fix)
CHECKS: dict[str, tuple[Callable[[str], str | None], str]] = {
    TRANSPORT_ENV: (_one_of(*TRANSPORTS), f"unset it (default fast) or set one of {', '.join(TRANSPORTS)}"),
    ENV_LEASE_S: (_number(3, 3600), "unset it (default 30) or set seconds between 3 and 3600"),
    ENV_LOCK_TIMEOUT: (_number(0.001, 86_400), "unset it (default 30) or set positive seconds"),
    HEARTBEAT_ENV: (_number(0.001, 86_400), "unset it: the controller sets it for the clients it starts"),
    ARMED_SLACK_ENV: (_number(1, 3600), "unset it (default 30) or set seconds between 1 and 3600"),
    CHART_ENV: (_one_of("0", "1"), "unset it (default 1: draw the scenario chart after a run) or set 0 or 1"),
    ENV_HOST_DIR: (_absolute, "unset it or set an absolute directory"),
    ENV_LEASE_HOST_DIR: (_absolute, "unset it or set an absolute directory on the lease host"),
    FAULT_ENV: (_faults, "unset it: fault injection is for the tests"),
    CALLER_ENV: (_one_of(*CALLERS), "unset it: caseledger's HTTP server sets it for itself"),
    "CASELEDGER_DEBUG": (_one_of("0", "1"), "unset it, or set 1 for tracebacks of caseledger bugs"),
    QUIET_WAIT_ENV: (_number(0, 3600), "unset it (no wait) or set the seconds to wait for a quiet host, 0..3600"),
}


def check_environment(env: Mapping[str, str] | None = None) -> None:
    """CaseledgerError naming every set variable whose value caseledger cannot use, and each one's fix."""
    env = os.environ if env is None else env
    bad = []
    for name, (check, fix) in CHECKS.items():
        value = env.get(name)
        if value:
            problem = check(value)
            if problem:
                bad.append((f"{name}='{quoted(value, 60)}' {problem}", f"{name}: {fix}"))
    if bad:
        raise CaseledgerError("; ".join(m for m, _ in bad), "; ".join(f for _, f in bad))
