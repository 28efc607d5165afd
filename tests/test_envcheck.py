"""Environment variables caseledger reads: a value it cannot use is refused at start, named with its fix, and
nothing is written (never a fallback in silence, never a run that fails later as a caseledger bug)."""

from __future__ import annotations

import pytest

from caseledger.errors import CaseledgerError
from caseledger.run.envcheck import CHECKS, check_environment
from caseledger.tools import freeze_case, start_run
from caseledger.workspace import Workspace
from tests.conftest import free_port, ref_draft, tree_digest

GARBAGE = {
    "CASELEDGER_LOAD_TRANSPORT": ("carrier-pigeon", "is not one of fast, httpx"),
    "CASELEDGER_LEASE_S": ("0", "is outside 3..3600"),
    "CASELEDGER_LOCK_TIMEOUT_S": ("soon", "is not a number"),
    "CASELEDGER_LOAD_HEARTBEAT_S": ("inf", "is outside"),
    "CASELEDGER_ARMED_SLACK_S": ("0.5", "is outside 1..3600"),
    "CASELEDGER_CHART_AFTER_RUN": ("yes", "is not one of 0, 1"),
    "CASELEDGER_HOST_DIR": ("relative/dir", "is not an absolute path"),
    "CASELEDGER_LEASE_HOST_DIR": ("~/leases", "is not an absolute path"),
    "CASELEDGER_FAULT": ("nonsense", "is not a comma list of component:action[=value]"),
    "CASELEDGER_CALLER": ("root", "is not one of local, http"),
    "CASELEDGER_DEBUG": ("yes", "is not one of 0, 1"),
    "CASELEDGER_QUIET_WAIT_S": ("-5", "is outside 0..3600"),
}


def test_every_checked_variable_has_a_garbage_case_here() -> None:
    assert set(GARBAGE) == set(CHECKS)


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_a_garbage_variable_is_refused_at_start_named_with_its_fix_and_nothing_is_written(
    name: str, ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    cid = freeze_case(ws, draft=ref_draft(free_port())).case_id
    before = tree_digest(ws.root)
    value, said = GARBAGE[name]
    monkeypatch.setenv(name, value)
    with pytest.raises(CaseledgerError) as e:
        start_run(ws, cid)
    assert e.value.message.startswith(f"{name}='{value}' {said}"), e.value.message
    assert (e.value.fix or "").startswith(f"{name}: "), e.value.fix
    assert tree_digest(ws.root) == before


def test_good_values_and_unset_variables_pass() -> None:
    check_environment({})
    check_environment(
        {
            "CASELEDGER_LOAD_TRANSPORT": "httpx",
            "CASELEDGER_LEASE_S": "4",
            "CASELEDGER_LOCK_TIMEOUT_S": "0.5",
            "CASELEDGER_HOST_DIR": "/tmp/h",
            "CASELEDGER_FAULT": "load:exit_after=3",
            "CASELEDGER_CALLER": "http",
            "CASELEDGER_DEBUG": "1",
        }
    )
