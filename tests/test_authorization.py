"""Authorization modes gate formal load and service changes; they show in status and the handoff."""

from __future__ import annotations

import pytest

from caseledger import ledger
from caseledger.case.store import load_case
from caseledger.cli import main
from caseledger.errors import NotAuthorized
from caseledger.ledger import authorization
from caseledger.tools import freeze_case, phase_status, start_run
from caseledger.workspace import Workspace
from tests.conftest import free_port, ref_draft


def test_paused_refuses_start_run_and_says_how_to_change_it(ws: Workspace, capsys: pytest.CaptureFixture[str]) -> None:
    authorization.set_mode(ws, "paused")
    case = freeze_case(ws, draft=ref_draft(free_port()))  # freezing is allowed while paused
    with pytest.raises(NotAuthorized) as e:
        start_run(ws, case.case_id)
    assert "paused" in e.value.message and "caseledger authorize single" in e.value.fix
    assert not ws.runs_dir.exists()  # nothing written, no lease taken
    assert main(["run", case.case_id, "--workspace", str(ws.root)]) == 2
    err = capsys.readouterr().err
    assert "error: authorization is 'paused'" in err and "fix: " in err


def test_unknown_mode_lists_the_valid_ones(ws: Workspace) -> None:
    with pytest.raises(Exception, match="known: paused, single, auto"):
        authorization.set_mode(ws, "yolo")


@pytest.mark.integration
def test_single_allows_one_run_then_pauses(ws: Workspace, stop_services: None) -> None:
    authorization.set_mode(ws, "single")
    port = free_port()
    a = freeze_case(ws, draft=ref_draft(port))
    r = start_run(ws, a.case_id, wait=True)
    assert r.state == "succeeded"
    assert authorization.current_mode(ws) == "paused"
    s = phase_status(ws, r.run_id)
    assert s.authorization == "paused" and "auth paused" in s.text()
    assert "authorization: paused" in ws.handoff.read_text()
    b = freeze_case(ws, draft=ref_draft(port, load={"requests": 8, "concurrency": 4}), parent=a.case_id)
    with pytest.raises(NotAuthorized):
        start_run(ws, b.case_id)


def test_preflight_only_works_while_paused_and_creates_no_run(ws: Workspace) -> None:
    authorization.set_mode(ws, "paused")
    port = free_port()
    ok = freeze_case(ws, draft=ref_draft(port))
    r = start_run(ws, ok.case_id, preflight_only=True)
    assert r.preflight == "passed" and r.state == "preflight_only" and r.run_id.startswith("p-")
    assert "0 requests sent" in r.text()
    assert not ws.runs_dir.exists()
    key = ledger.target_key(load_case(ws, ok.case_id).canonical())
    assert ledger.read_lease(ws, key) is None  # no lease taken (leases are host-wide)
    late = freeze_case(ws, draft=ref_draft(port, deadline="2020-01-01T00:00:00Z"))
    bad = start_run(ws, late.case_id, preflight_only=True)
    assert bad.preflight == "failed" and (bad.preflight_error or "").startswith("deadline 2020-01-01")
