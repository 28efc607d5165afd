"""HANDOFF.md: short, derived from the ledger, and enough for a new session to take the next step."""

from __future__ import annotations

import re
from typing import Any

import httpx2
import pytest

from caseledger.tools import freeze_case, phase_status, reprocess_raw, start_run
from caseledger.views import handoff
from caseledger.workspace import Workspace
from tests.conftest import free_port, ref_draft, stats

pytestmark = pytest.mark.integration


def next_line(ws: Workspace) -> str:
    text = ws.handoff.read_text()
    assert len(text.encode()) <= 1024 and len(text.splitlines()) <= 25, text
    lines = [x for x in text.splitlines() if x.startswith("next: ")]
    assert len(lines) == 1, text  # exactly one next action
    return lines[0]


def run_failing(ws: Workspace, monkeypatch: pytest.MonkeyPatch, fault: str | None, **over: Any) -> str:
    return run_failing_on(ws, monkeypatch, fault, **over)[0]


def run_failing_on(ws: Workspace, monkeypatch: pytest.MonkeyPatch, fault: str | None, **over: Any) -> tuple[str, int]:
    """(run id, port of its reference target)."""
    port = free_port()
    case = freeze_case(ws, draft=ref_draft(port, **over))
    if fault:
        monkeypatch.setenv("CASELEDGER_FAULT", fault)
    r = start_run(ws, case.case_id, wait=True)
    monkeypatch.delenv("CASELEDGER_FAULT", raising=False)
    return r.run_id, port


@pytest.mark.processes
def test_before_model_failure_points_at_fix_and_resume(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, stop_services: None
) -> None:
    rid = run_failing(ws, monkeypatch, "preflight:connect")
    nxt = next_line(ws)
    assert f"resume(run_id='{rid}')" in nxt and "0 model requests" in nxt
    assert "before_model" in ws.handoff.read_text()


def test_requests_over_the_context_are_refused_at_preflight_with_nothing_sent(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, stop_services: None
) -> None:
    # warmup (2 output tokens) would fit the context limit, the formal load (48) does not: preflight knows the
    # limit (service.reference.max_model_len) and refuses before the service starts or any request is sent
    # (a server's 400 on every formal request, hot_entry, is test_evidence's http:400 cell)
    rid, port = run_failing_on(
        ws,
        monkeypatch,
        None,
        service={"reference": {"max_model_len": 100, "prefill_tokens_per_s": 200000}},
        dataset={"source": "synthetic", "input_tokens": 40, "output_tokens": 48},
    )
    s = phase_status(ws, rid)
    assert s.failure_class == "before_model" and s.phase == "preflight" and s.sent == 0, s.text()
    assert "do not fit the context of 100 tokens (service.reference.max_model_len)" in (s.blocker or "")
    with pytest.raises(httpx2.ConnectError):  # no service was started for it
        stats(port)
    nxt = next_line(ws)
    assert "preflight_only=True" in nxt and "0 model requests sent" in nxt and s.case_id in nxt


@pytest.mark.processes
def test_collect_failure_points_at_reprocess_and_then_summarize(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, stop_services: None
) -> None:
    rid, port = run_failing_on(ws, monkeypatch, "postprocess:fail=import")
    s = phase_status(ws, rid)
    assert s.failure_class == "collect" and s.load_ended == "yes" and not s.results_extracted
    assert "No module named" in (s.blocker or "")  # the original error is kept
    nxt = next_line(ws)
    assert f"reprocess_raw(run_id='{rid}')" in nxt
    before = stats(port)["requests_total"]
    r = reprocess_raw(ws, rid)
    assert r.requests == 8 and stats(port)["requests_total"] == before  # counted at the target: none sent
    assert phase_status(ws, rid).state == "succeeded"
    assert f"summarize(run_ids=['{rid}'])" in next_line(ws)


@pytest.mark.processes
def test_a_dead_client_points_at_a_fresh_run_and_says_what_resume_would_do(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, stop_services: None
) -> None:
    rid = run_failing(
        ws,
        monkeypatch,
        "load:exit_after=3",
        service={"reference": {"decode_step_s": 0.01, "prefill_tokens_per_s": 200000}},
    )
    nxt = next_line(ws)
    assert nxt.startswith("next: start_run(case_id=") and "died after 3 of 8 records" in nxt
    assert f"resume(run_id='{rid}') only ends this run as partial (nothing is re-sent)" in nxt


def test_deleting_the_handoff_loses_nothing(ws: Workspace, stop_services: None) -> None:
    case = freeze_case(ws, draft=ref_draft(free_port()))
    start_run(ws, case.case_id, wait=True)
    before = ws.handoff.read_text()
    ws.handoff.unlink()
    after = handoff.refresh(ws)
    strip = lambda t: re.sub(r"written \S+", "", t)  # noqa: E731
    assert strip(after) == strip(before)
