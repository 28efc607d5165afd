"""Fault hooks for tests: `CASELEDGER_FAULT=component:action[=value],...` in the environment.

Examples: `load:exit_after=3` (the load client calls `os._exit(137)` right after the third record is
written), `controller:exit_before=load`, `controller:exit_during=load`, `postprocess:fail=import`.
The variable is read at every call, so a test can set it per subprocess; production never sets it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

FAULT_ENV = "CASELEDGER_FAULT"
KILL_EXIT_CODE = 137  # what a shell reports for SIGKILL: the fault looks like a kill to whoever waits


def parse_faults(spec: str) -> dict[tuple[str, str], str]:
    """{(component, action): value} from a comma list; a bare action has the value ''; last one wins."""
    out: dict[tuple[str, str], str] = {}
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        component, sep, rest = item.partition(":")
        if not sep or not component or not rest:
            raise ValueError(f"{FAULT_ENV} item '{item}' is not 'component:action[=value]'")
        action, _, value = rest.partition("=")
        out[(component.strip(), action.strip())] = value.strip()
    return out


def fault(component: str, action: str, env: Mapping[str, str] | None = None) -> str | None:
    """The value of fault `component:action` if it is set ('' for a bare action), else None.

    Test with `is not None`: a bare action such as `postprocess:fail` returns ''.
    """
    spec = (os.environ if env is None else env).get(FAULT_ENV, "")
    if not spec:
        return None
    return parse_faults(spec).get((component, action))


def fault_int(component: str, action: str, env: Mapping[str, str] | None = None) -> int | None:
    """An integer-valued fault (e.g. `load:exit_after=3`); a non-integer value is a test-setup error."""
    value = fault(component, action, env)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{FAULT_ENV} {component}:{action} needs an integer, got '{value}'") from None


def die(code: int = KILL_EXIT_CODE) -> None:
    """Exit at once without cleanup, flushing nothing, like a kill."""
    os._exit(code)
