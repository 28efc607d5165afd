"""Environment variables caseledger reads: a value it cannot use is refused at start, named with its fix, and
nothing is written (never a fallback in silence, never a run that fails later as a caseledger bug)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from caseledger.errors import CaseledgerError
from caseledger.run.admission.envcheck import CHECKS, check_environment
from caseledger.tools import freeze_any, freeze_case, resume_any, start_any, start_run
from caseledger.tools.campaigns import CampaignFrozen
from caseledger.workspace import Workspace
from tests.conftest import free_port, ref_draft, tree_digest

INTEGRATION = pytest.mark.integration

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


# ---------------------------------------------------------------------------------- every start path, one check
BAD, VALUE = "CASELEDGER_LOAD_TRANSPORT", "nonsense"
SAID = "CASELEDGER_LOAD_TRANSPORT='nonsense' is not one of fast, httpx"
FIX = "CASELEDGER_LOAD_TRANSPORT: unset it (default fast) or set one of fast, httpx"


def _campaign(port: int) -> dict[str, Any]:
    body = {
        "name": "env",
        "base": ref_draft(port),
        "axes": [{"path": "load.concurrency", "values": [1, 2]}],
        "search": {"kind": "grid"},
        "decision": {"primary_metric": "output_throughput"},
    }
    return {"campaign": body}


def _failed_run(ws: Workspace, port: int) -> str:
    """A run whose preflight refused its case (the formal requests do not fit the context): resumable, inline, no
    service started."""
    over = {"service": {"reference": {"max_model_len": 100}}, "dataset": {"input_tokens": 40, "output_tokens": 48}}
    r = start_run(ws, freeze_case(ws, draft=ref_draft(port, **over)).case_id, wait=True)
    assert r.run_id is not None and r.state == "failed", r.text()
    return r.run_id


def _start(ws: Workspace, path: str) -> Callable[[], object]:
    port = free_port()
    if path == "resume":
        rid = _failed_run(ws, port)
        return lambda: resume_any(ws, rid)
    if path.startswith("campaign"):
        gid = freeze_any(ws, draft=_campaign(port))
        assert isinstance(gid, CampaignFrozen)
        call = start_any if path == "campaign start" else resume_any
        return lambda: call(ws, gid.campaign_id)
    cid = freeze_case(ws, draft=ref_draft(port)).case_id
    return lambda: start_any(ws, cid, preflight_only=path == "preflight_only")


@pytest.mark.parametrize(
    "path",
    ["start_run", "preflight_only", "campaign start", "campaign resume", pytest.param("resume", marks=INTEGRATION)],
)
def test_every_start_path_refuses_a_garbage_variable_in_the_same_words_and_writes_nothing(
    path: str, ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One check (run/admission/admit.py) on every path: a campaign's driver is never started to log point_refused every
    second, and a preflight_only check never says 'passed' for a case that cannot start."""
    start = _start(ws, path)
    before = tree_digest(ws.root)
    monkeypatch.setenv(BAD, VALUE)
    with pytest.raises(CaseledgerError) as e:
        start()
    assert (e.value.message, e.value.fix) == (SAID, FIX)
    assert tree_digest(ws.root) == before  # no run, preflight, driver, event or HANDOFF.md written
