"""The controller's logic without subprocesses: the dispatch table, failure classes, the queue."""

from __future__ import annotations

import pytest

from caseledger.case.phases import PHASES, Phase
from caseledger.case.plan import FAILURE_OF_PHASE
from caseledger.errors import FailureClass, PhaseFailed
from caseledger.ledger import authorization, queue
from caseledger.ledger.event_types import PhaseEnded
from caseledger.ledger.events import read_events
from caseledger.ledger.evidence import NotRun, PhaseEvidence
from caseledger.ledger.runs import load_run
from caseledger.ledger.state import PhaseState, fold
from caseledger.run import controller
from caseledger.run.start import start_next
from caseledger.workspace import Workspace, read_json
from tests.helpers import fake_run


def test_every_phase_has_exactly_one_body_and_one_failure_class() -> None:
    assert list(controller.PHASE_BODIES) == list(Phase) == list(PHASES)
    assert set(FAILURE_OF_PHASE) == set(Phase)
    assert FAILURE_OF_PHASE[Phase.PREFLIGHT] == FailureClass.BEFORE_MODEL
    assert FAILURE_OF_PHASE[Phase.LOAD] == FailureClass.END_UNKNOWN
    assert FAILURE_OF_PHASE[Phase.POSTPROCESS] == FailureClass.COLLECT


@pytest.mark.parametrize("phase", list(Phase))
def test_an_unexpected_error_is_internal_never_the_phase_class(
    ws: Workspace, phase: Phase, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctl = controller.Controller(fake_run(ws, "r-0000beef", "2026-01-01T00:00:00.000Z"), fence=1)

    def boom(self: controller.Controller, attempt: int) -> PhaseEvidence:
        raise RuntimeError("disk on fire")

    monkeypatch.setitem(controller.PHASE_BODIES, phase, boom)
    assert ctl.run_phase(phase, attempt=2) == FailureClass.INTERNAL
    ended = [e for e in read_events(ctl.paths).events if isinstance(e, PhaseEnded)]
    assert ended[-1].phase == phase and ended[-1].attempt == 2
    assert ended[-1].data.failure_class == FailureClass.INTERNAL
    assert "RuntimeError: disk on fire" in (ended[-1].error or "")
    assert read_json(ctl.paths.phase_file(phase))["outcome"] == "failed"
    v = fold(ws, ctl.paths.run_id)
    assert v.phases[phase].state == PhaseState.FAILED and v.failure_class == FailureClass.INTERNAL
    # a bug of ours is reported, not resumed into: the next call says so and names the log
    assert "caseledger bug" in v.next_call and "controller.log" in v.next_call


def test_a_phase_failed_keeps_its_own_class_and_a_success_its_evidence(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctl = controller.Controller(fake_run(ws, "r-0000beef", "2026-01-01T00:00:00.000Z"), fence=1)

    def rejected(self: controller.Controller, attempt: int) -> PhaseEvidence:
        raise PhaseFailed("formal entry rejected all requests", "hot_entry", "freeze a corrected child")

    def fine(self: controller.Controller, attempt: int) -> PhaseEvidence:
        return NotRun(outcome="reused", reason="service reused and warm")

    monkeypatch.setitem(controller.PHASE_BODIES, Phase.LOAD, rejected)
    monkeypatch.setitem(controller.PHASE_BODIES, Phase.WARMUP, fine)
    assert ctl.run_phase(Phase.LOAD, 1) == FailureClass.HOT_ENTRY  # not the table's end_unknown
    assert ctl.run_phase(Phase.WARMUP, 1) is None
    assert read_json(ctl.paths.phase_file(Phase.WARMUP)) == {
        "phase": "warmup",
        "attempt": 1,
        "outcome": "reused",
        "error": None,
        "reason": "service reused and warm",
    }
    v = fold(ws, load_run(ws, ctl.paths.run_id))
    assert v.phases[Phase.WARMUP].state == PhaseState.REUSED
    assert v.phases[Phase.LOAD].failure_class == FailureClass.HOT_ENTRY


def test_queue_is_ordered_without_duplicates_and_starts_nothing_unless_auto(ws: Workspace) -> None:
    assert queue.push(ws, "t-a", "c-000000000001", behind="r-00000001") == 1
    assert queue.push(ws, "t-a", "c-000000000002", behind="r-00000001") == 2
    assert queue.push(ws, "t-a", "c-000000000001", behind="r-00000002") == 1  # already queued: same place
    assert [e["case_id"] for e in queue.entries(ws, "t-a")] == ["c-000000000001", "c-000000000002"]
    assert queue.all_queues(ws) == {"t-a": ["c-000000000001", "c-000000000002"]}
    authorization.set_mode(ws, "paused")
    assert start_next(ws, "t-a") is None  # paused: the queue is kept, nothing starts
    assert len(queue.entries(ws, "t-a")) == 2
    popped = queue.pop(ws, "t-a")
    assert popped is not None and popped["case_id"] == "c-000000000001"
    assert [e["case_id"] for e in queue.entries(ws, "t-a")] == ["c-000000000002"]
