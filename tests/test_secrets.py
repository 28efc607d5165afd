"""Secrets are referenced, never copied: API keys and service env values stay out of the workspace."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from caseledger import procs, services
from caseledger.case.store import load_case
from caseledger.ledger.leases import target_key
from caseledger.procs import INHERITED_ENV
from caseledger.tools import freeze_case, start_run, summarize
from caseledger.workspace import Workspace
from tests.conftest import free_port, ref_draft, reference_targets

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


# ---- the launched service's environment: the harmless basics plus exactly the declared service.env --------------

UNDECLARED = "sk-undeclared-" + "5e1f" * 6  # a secret of the agent's shell that no case mentions
DECLARED = "declared-" + "a7c3" * 6  # the value a case's ${NAME} reference resolves to


def _plant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASELEDGER_TEST_UNDECLARED_SECRET", UNDECLARED)
    monkeypatch.setenv("OPENAI_API_KEY", UNDECLARED)
    monkeypatch.setenv("LD_LIBRARY_PATH", "/caller/lib")  # identity-relevant: declared in the case, or absent
    monkeypatch.setenv("CASELEDGER_TEST_DECLARED", DECLARED)
    monkeypatch.setenv("LC_TEST_LOCALE", "C")  # harmless: LC_* is inherited


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    assert UNDECLARED.encode() not in raw
    return dict(kv.decode().split("=", 1) for kv in raw.split(b"\0") if kv)


@pytest.mark.parametrize("adapter", ["command", "reference"])
def test_launched_service_gets_only_the_basics_and_its_declared_env(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch, stop_services: None, adapter: str) -> None:
    _plant(monkeypatch)
    service: dict[str, Any] = {"adapter": adapter,
                               "env": {"ENGINE_TOKEN": "${CASELEDGER_TEST_DECLARED}", "LOG_LEVEL": "info"}}
    if adapter == "command":
        service["argv"] = [sys.executable, "-m", "caseledger.target", "serve", "--host", "{host}", "--port",
                           "{port}", "--model", "ref-model"]
    cid = freeze_case(ws, draft=ref_draft(free_port(), service=service)).case_id
    case = load_case(ws, cid)
    ev = services.ensure(ws, case, target_key(case.canonical()), cid, allow_start=True)
    assert ev["outcome"] == "done"
    env = _environ(int(ev["pid"]))
    assert env["ENGINE_TOKEN"] == DECLARED and env["LOG_LEVEL"] == "info"  # the declared env, resolved
    assert env["PATH"] and env["LC_TEST_LOCALE"] == "C"  # what any command needs to run
    assert "CASELEDGER_TEST_UNDECLARED_SECRET" not in env and "OPENAI_API_KEY" not in env
    assert "CASELEDGER_TEST_DECLARED" not in env and "LD_LIBRARY_PATH" not in env
    extra = {"PYTHONPATH": procs.PKG_PARENT} if adapter == "reference" else {}
    assert env.get("PYTHONPATH") == extra.get("PYTHONPATH")  # the reference target: this checkout, not the caller's
    allowed = set(INHERITED_ENV) | {"ENGINE_TOKEN", "LOG_LEVEL"} | set(extra)
    assert {k for k in env if not k.startswith("LC_")} <= allowed


def test_identity_command_runs_with_the_same_minimal_env(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _plant(monkeypatch)
    show = "import os, sys; sys.stdout.write(' '.join(f'{k}={v}' for k, v in sorted(os.environ.items())))"
    with reference_targets({"ext": {}}, tmp_path / "logs") as served:
        draft = ref_draft(0, target={"endpoints": [{"base_url": served["ext"].url + "/v1", "model": "ref-model"}]},
                          service={"adapter": "external", "identity_command": [sys.executable, "-c", show],
                                   "env": {"ENGINE_TOKEN": "${CASELEDGER_TEST_DECLARED}"}})
        cid = freeze_case(ws, draft=draft).case_id
        case = load_case(ws, cid)
        ev = services.ensure(ws, case, target_key(case.canonical()), cid, allow_start=False)
    out = ev["identity_output"]
    assert f"ENGINE_TOKEN={DECLARED}" in out and "LC_TEST_LOCALE=C" in out
    assert UNDECLARED not in out and "LD_LIBRARY_PATH" not in out


@pytest.mark.slow
def test_no_process_caseledger_starts_inherits_the_callers_secrets(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch, stop_services: None) -> None:
    """Controller, load client and service: the basics and what the case names (its API key variable), never
    the rest of the agent's shell."""
    from caseledger.workspace import read_json_or_none
    from tests.test_runs import slow_draft, wait_state

    monkeypatch.setenv("AGENT_SHELL_SECRET", UNDECLARED)
    monkeypatch.setenv("OPENAI_API_KEY", UNDECLARED)
    monkeypatch.setenv("CASELEDGER_TEST_KEY", SECRET)  # the key the case names: its load client needs it
    port = free_port()
    cid = freeze_case(ws, draft=slow_draft(port, target={"endpoints": [
        {"base_url": f"http://127.0.0.1:{port}/v1", "model": "ref-model"}], "api_key_env": "CASELEDGER_TEST_KEY"}
    )).case_id
    r = start_run(ws, cid)
    paths = ws.run(r.run_id)
    wait_state(ws, r.run_id, lambda s: s.sent > 0)
    case = load_case(ws, cid)
    service = read_json_or_none(ws.services_dir / f"{target_key(case.canonical())}.json") or {}
    pids = {"controller": read_json_or_none(paths.controller_pid), "load client": read_json_or_none(paths.load_pid),
            "service": service.get("proc")}
    for name, ref in pids.items():
        assert ref is not None, name
        env = _environ(int(ref["pid"]))  # the undeclared secret is absent from the raw environ
        assert "AGENT_SHELL_SECRET" not in env and "OPENAI_API_KEY" not in env, name
        assert (env.get("CASELEDGER_TEST_KEY") == SECRET) == (name != "service"), name
    wait_state(ws, r.run_id, lambda s: s.state == "succeeded", timeout=90)
