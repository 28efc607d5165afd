"""Campaign answers that tell the truth: a case is what it measures, lookups never create, runs are
reachable from their case, the plan comes from the live target, HANDOFF.md shows the scenario."""

from __future__ import annotations

import json
from typing import Any

import pytest

from caseledger.case.model import Case
from caseledger.case.store import legacy_id_of, lineage, load_case
from caseledger.records import PHASE_HEADER
from caseledger.tools import freeze_case, phase_status, resume, start_run
from caseledger.workspace import Workspace, canonical_json
from tests.conftest import (
    ONE_TOKEN_STREAM,
    Answer,
    external_draft,
    free_port,
    ref_draft,
    start_with_fault,
    stats,
    stub_target,
)
from tests.helpers import wait_state

pytestmark = pytest.mark.integration


def test_parent_and_note_do_not_change_what_a_case_is(ws: Workspace) -> None:
    root = freeze_case(ws, draft=ref_draft(18001))
    child = ref_draft(18001, load={"requests": 8, "concurrency": 4})
    a = freeze_case(ws, draft={**child, "note": "first try"}, parent=root.case_id)
    b = freeze_case(ws, draft={**child, "note": "the same, other words"})  # no parent: a lookup
    assert a.created and not b.created and a.case_id == b.case_id
    assert load_case(ws, a.case_id).parent == root.case_id  # the lookup kept the recorded parent
    assert [e["note"] for e in lineage(ws, a.case_id)] == ["first try", "the same, other words"]
    same = freeze_case(ws, draft=ref_draft(18001), parent=root.case_id)  # nothing changed against the parent
    assert same.case_id == root.case_id and not same.created
    assert "the same measurement as its parent" in same.text()
    assert "next: start_run(" in same.text()


def test_an_old_style_frozen_case_still_resolves(ws: Workspace) -> None:
    case = Case.model_validate({**ref_draft(18001), "note": "frozen before lineage left the id"}).filled()
    old_id = legacy_id_of(case)
    ws.frozen_dir.mkdir(parents=True, exist_ok=True)
    ws.frozen_case(old_id).write_bytes(canonical_json(case.canonical()))
    assert load_case(ws, old_id).note == "frozen before lineage left the id"


def test_a_measured_case_answers_with_its_runs_and_runs_are_reachable_from_it(
    ws: Workspace, stop_services: None
) -> None:
    port = free_port()
    f = freeze_case(ws, draft=ref_draft(port))
    r = start_run(ws, f.case_id, wait=True)
    assert r.state == "succeeded", r.text()
    again = freeze_case(ws, draft=ref_draft(port))
    assert again.runs == [r.run_id] and again.latest_run_state == "succeeded"
    assert f"summarize(run_ids=['{r.run_id}'])" in again.next_call and f"measured: {r.run_id}" in again.text()
    by_case = phase_status(ws, f.case_id)  # a case id stands for its latest run
    assert by_case.run_id == r.run_id and by_case.state == "succeeded"

    # the same root case again: the plan comes from the live target (its service, warmed), not "full plan"
    warm_before = stats(port)["by_phase"].get("warmup", 0)
    r2 = start_run(ws, f.case_id, wait=True)
    assert r2.state == "succeeded", r2.text()
    assert r2.plan["service"] == "reuse" and r2.plan["warmup"] == "reuse", r2.plan
    assert "reuses: service, warmup, route_verify" in r2.text()
    assert stats(port)["by_phase"].get("warmup", 0) == warm_before  # no warmup repeated
    assert phase_status(ws, f.case_id).run_id == r2.run_id


def test_a_measurement_only_child_says_it_sent_nothing(ws: Workspace, stop_services: None) -> None:
    port = free_port()
    base = freeze_case(ws, draft=ref_draft(port))
    start_run(ws, base.case_id, wait=True)
    child = freeze_case(ws, draft=ref_draft(port, measurement={"native": {"rule": "sglang"}}), parent=base.case_id)
    r = start_run(ws, child.case_id, wait=True)
    s = phase_status(ws, r.run_id)
    assert s.state == "succeeded" and s.sent == 0 and s.load_reused_from is not None
    assert "0 sent by this run" in s.text() and "formal sent" not in s.text()


@pytest.mark.processes
def test_resume_says_the_run_is_running_not_the_failure_it_repairs(
    ws: Workspace, stop_services: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    f = freeze_case(ws, draft=ref_draft(port))
    r = start_with_fault(monkeypatch, "controller:exit_after=warmup", ws, f.case_id, wait=True)
    assert phase_status(ws, r.run_id).state != "succeeded"
    res = resume(ws, f.case_id)  # by case id
    assert res.run_id == r.run_id and res.state == "running"
    assert "resume(" not in res.next_call and "phase_status(" in res.next_call
    # let the resumed controller finish before stop_services: stopped under it, it would start the service
    # again (resume repairs a lost service), and that one would outlive the test
    wait_state(ws, r.run_id, lambda s: not s.owner_alive and s.state != "running", timeout=90)
    assert phase_status(ws, r.run_id).state == "succeeded"


def strict_answer(headers: dict[str, str], body: dict[str, Any]) -> Answer:
    """A one-token answer, but a formal request asking for more than 100 tokens gets a JSON 400, as a real
    engine rejects a parameter it does not take."""
    if headers.get(PHASE_HEADER.lower()) == "load" and body.get("max_tokens", 0) > 100:
        msg = f"max_tokens {body['max_tokens']} exceeds the limit of 100 tokens for this model"
        return 400, "application/json", json.dumps({"error": {"code": 400, "message": msg}}).encode()
    return 200, "text/event-stream", ONE_TOKEN_STREAM


def test_handoff_shows_the_scenario_and_only_unsuperseded_problems(ws: Workspace) -> None:
    with stub_target(strict_answer) as port:
        base = freeze_case(ws, draft=external_draft(port))
        assert start_run(ws, base.case_id, wait=True, timeout_s=120).state == "succeeded"
        bad = freeze_case(
            ws,
            draft=external_draft(port, load={"requests": 8, "concurrency": 4, "max_tokens": 999}),
            parent=base.case_id,
        )
        rb = start_run(ws, bad.case_id, wait=True, timeout_s=120)
        s = phase_status(ws, rb.run_id)
        assert s.failure_class == "hot_entry", s.text()
        text = ws.handoff.read_text()
        assert len(text.encode()) <= 1024 and text.count("\n") <= 25, text
        assert "scenario ref-test: 2 case(s)" in text and "C=4" in text, text
        # what was rejected and why, the server's own message on one line
        assert "open problems:" in text and "max_tokens 999 exceeds the limit of 100 tokens" in text, text
        fixed = freeze_case(
            ws, draft=external_draft(port, load={"requests": 8, "concurrency": 4, "max_tokens": 50}), parent=bad.case_id
        )
        assert start_run(ws, fixed.case_id, wait=True, timeout_s=120).state == "succeeded"
    text = ws.handoff.read_text()
    assert f"- {rb.run_id}" not in text and "open problems" not in text, text  # superseded by its child
    assert "3 case(s)" in text, text


@pytest.mark.processes
def test_a_copied_workspace_resumes_in_its_new_place(
    ws: Workspace, tmp_path: Any, stop_services: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil
    import time

    from caseledger import ledger, services
    from caseledger.ledger import leases

    monkeypatch.setenv(leases.ENV_LEASE_S, "4")  # the controller (a fresh process) reads it at import
    monkeypatch.setattr(leases, "LEASE_SECONDS", 4.0)  # and this process, which takes the lease at start
    port = free_port()
    f = freeze_case(ws, draft=ref_draft(port))
    r = start_with_fault(monkeypatch, "controller:exit_after=warmup", ws, f.case_id, wait=True)
    moved = Workspace(tmp_path / "moved")
    shutil.copytree(ws.root, moved.root)  # run.json still names the old place
    key = ledger.target_key(load_case(ws, f.case_id).canonical())
    deadline = time.monotonic() + 20  # the original workspace's lease lapses first (host-wide: one owner)
    while (lease := ledger.read_lease(ws, key)) is not None and lease.live() and time.monotonic() < deadline:
        time.sleep(0.5)
    try:
        res = resume(moved, r.run_id, wait=True)
        assert res.state == "succeeded", res.text()
        assert phase_status(moved, r.run_id).done == 8
        assert phase_status(ws, r.run_id).state != "succeeded"  # the original was not touched
    finally:
        services.stop_all(moved)
