"""May this start here: the one check every start path makes before it writes anything (start_run, a
preflight_only check, resume, a campaign's start and each point its driver starts, a queued case): caseledger's
own environment variables (run/admission/envcheck.py), then every program, SSH login and loader variable the cases would
make caseledger start, against the host's policy (run/admission/policy.py). One function, so a value one path refuses is
refused by every path, in the same words.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from caseledger.errors import NotAuthorized
from caseledger.run.admission import envcheck, policy

if TYPE_CHECKING:
    from caseledger.case.model import Case

NAMED = 4  # refused cases named in one answer (a campaign may have hundreds of points); the rest are counted


def check_start(action: str, cases: Iterable[tuple[str, Case]]) -> None:
    """CaseledgerError naming every environment variable caseledger cannot use (with each one's fix); else
    NotAuthorized naming what the host's policy refuses in each case, and how to change it. `cases`: (what to call
    it in an answer, the case), '' for the one case of a run: its refusal reads '<action> refused: ...'."""
    envcheck.check_environment()
    said: dict[str, NotAuthorized] = {}  # by message: a damaged policy file is said once, not once per point
    for name, case in cases:
        try:
            policy.check(case, f"{action} {name}" if name else action)
        except NotAuthorized as e:
            said.setdefault(e.message, e)
    if not said:
        return
    first = next(iter(said.values()))
    if len(said) == 1:
        raise first
    more = f"; and {len(said) - NAMED} more refused" if len(said) > NAMED else ""
    raise NotAuthorized("; ".join(list(said)[:NAMED]) + more, first.fix)
