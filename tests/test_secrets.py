"""Secrets are referenced, never copied: API keys and service env values stay out of the workspace."""

from __future__ import annotations

from pathlib import Path

import pytest

from caseledger.tools import freeze_case, start_run, summarize
from caseledger.workspace import Workspace
from tests.conftest import free_port, ref_draft

SECRET = "sk-test-7f3a9c1e5b2d4f6a8c0e"


@pytest.mark.slow
def test_api_key_and_service_env_values_never_reach_the_ledger(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch, stop_services: None) -> None:
    monkeypatch.setenv("CASELEDGER_TEST_API_KEY", SECRET)
    draft = ref_draft(free_port(), target={"api_key_env": "CASELEDGER_TEST_API_KEY"},
                      service={"env": {"ENGINE_TOKEN": "${CASELEDGER_TEST_API_KEY}", "LOG_LEVEL": "info"}})
    case = freeze_case(ws, draft=draft)
    r = start_run(ws, case.case_id, wait=True)
    assert r.state == "succeeded", r.text()
    summarize(ws, [r.run_id])
    hits = [p for p in ws.root.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert hits == []
    # the reference is recorded, so a reader knows where the value came from
    svc = next((ws.services_dir).glob("*.json")).read_text()
    assert "${CASELEDGER_TEST_API_KEY}" in svc


def test_missing_secret_reference_fails_in_service_naming_the_variable(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch, stop_services: None) -> None:
    monkeypatch.delenv("CASELEDGER_NOT_SET", raising=False)
    draft = ref_draft(free_port(), service={"env": {"TOKEN": "${CASELEDGER_NOT_SET}"}})
    case = freeze_case(ws, draft=draft)
    r = start_run(ws, case.case_id, wait=True)
    assert r.state == "failed"
    from caseledger.tools import phase_status

    s = phase_status(ws, r.run_id)
    assert s.phase == "service" and "CASELEDGER_NOT_SET" in (s.blocker or "")
    assert Path(ws.root).exists()
